"""Reads a serving replayer's HyBench tables through its Iceberg REST
catalog, attached pinned, for replayer/tests/it/iceberg.rs.

usage: pinned_bank.py URI TOKEN SECONDS

For SECONDS: attaches the catalog with the warehouse "pinned" (every
request of the attachment answers one checkpoint), reads hybench.account
and hybench.transfer three times, then attaches again. Prints one JSON line
per read: the attachment's number, each table's snapshot checkpoint, the
accounts' count and total balance, and each table's newest fresh_ts (every
transaction updates both tables with one fresh_ts: one checkpoint of both
has the same newest value).
"""

import json
import sys
import time

import pyarrow.compute as pc
from pyiceberg.catalog.rest import RestCatalog


def main():
    uri, token, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    end = time.monotonic() + seconds
    attachment = 0
    while time.monotonic() < end:
        try:
            catalog = RestCatalog("fovea", uri=uri, token=token, warehouse="pinned")
        except Exception as e:  # nothing published yet: the catalog says so
            if "nothing is published yet" not in str(e):
                raise
            time.sleep(0.2)
            continue
        attachment += 1
        for _ in range(3):
            account = catalog.load_table(("hybench", "account"))
            transfer = catalog.load_table(("hybench", "transfer"))
            a = account.scan(selected_fields=("balance", "fresh_ts")).to_arrow()
            t = transfer.scan(selected_fields=("fresh_ts",)).to_arrow()
            print(
                json.dumps(
                    {
                        "attachment": attachment,
                        "account_ts": int(account.current_snapshot().summary["fovea.checkpoint-ts"]),
                        "transfer_ts": int(transfer.current_snapshot().summary["fovea.checkpoint-ts"]),
                        "count": a.num_rows,
                        "sum": pc.sum(a["balance"]).as_py() or 0,
                        "account_fresh": pc.max(a["fresh_ts"]).as_py(),
                        "transfer_fresh": pc.max(t["fresh_ts"]).as_py() if t.num_rows else None,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
