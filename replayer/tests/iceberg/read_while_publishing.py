"""Reads one Iceberg table over and over while a replayer publishes it, for
replayer/tests/it/iceberg.rs.

usage: read_while_publishing.py LOCATION SECONDS SQL

Until SECONDS have passed, reads the table's newest metadata file (as
version-hint.text names it), runs SQL on it in DuckDB (`{table}` stands for
the table) and prints one JSON line: the snapshot's fovea.checkpoint-ts and the
answer's first row. Any error is printed and ends the script with status 1.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from read_tables import duckdb_connection  # noqa: E402


def main():
    location, seconds, sql = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    con = duckdb_connection()
    hint = os.path.join(location, "metadata", "version-hint.text")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not os.path.exists(hint):
            time.sleep(0.05)
            continue
        with open(hint) as f:
            version = f.read().strip()
        metadata = os.path.join(location, "metadata", f"v{version}.metadata.json")
        with open(metadata) as f:
            m = json.load(f)
        snapshot = next(s for s in m["snapshots"] if s["snapshot-id"] == m["current-snapshot-id"])
        row = con.execute(sql.replace("{table}", f"iceberg_scan('{metadata}')")).fetchone()
        print(json.dumps({"ts": int(snapshot["summary"]["fovea.checkpoint-ts"]), "row": [str(v) for v in row]}), flush=True)


if __name__ == "__main__":
    main()
