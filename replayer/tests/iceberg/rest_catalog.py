"""Reads every table of an Iceberg REST catalog with pyiceberg and with
DuckDB, for replayer/tests/it/iceberg.rs.

usage: rest_catalog.py URI TOKEN OUT COUNTS SECONDS

Waits (at most SECONDS) until the catalog lists every table of COUNTS (a
JSON object: table name -> row count) with that many rows, all at one
checkpoint that stayed the newest for 2 s (the input is consumed), loading
each table again every round with pyiceberg, then writes each table's rows
to OUT/NAMESPACE.TABLE.parquet. Then DuckDB's iceberg extension attaches
the catalog (its `pinned` warehouse: every table at one checkpoint) with
the token as its secret and writes each table it lists to
OUT/duckdb/NAMESPACE.TABLE.parquet. Prints one JSON object: each table's
snapshot checkpoint timestamp as pyiceberg read it, the tables DuckDB
listed, and what a request without the token got.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

import pyarrow.parquet as pq
from pyiceberg.catalog.rest import RestCatalog
from read_tables import duckdb_connection


def tables(catalog):
    return [t for ns in catalog.list_namespaces() for t in catalog.list_tables(ns)]


def main():
    uri, token, out, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[5])
    counts = json.loads(sys.argv[4])
    catalog = RestCatalog("fovea", uri=uri, token=token)
    end = time.monotonic() + seconds
    stable_since, last = None, None
    while True:
        read, snapshots = {}, {}
        for identifier in tables(catalog):
            table = catalog.load_table(identifier)
            name = ".".join(identifier)
            read[name] = table.scan().to_arrow()
            snapshots[name] = int(table.current_snapshot().summary["fovea.checkpoint-ts"])
        at = set(snapshots.values())
        if at != last:
            stable_since, last = time.monotonic(), at
        complete = {name: t.num_rows for name, t in read.items()} == counts
        if complete and len(at) == 1 and time.monotonic() - stable_since >= 2:
            break
        if time.monotonic() > end:
            sys.exit(f"after {seconds} s the catalog has {sorted((n, t.num_rows) for n, t in read.items())}")
        time.sleep(0.2)
    for name, t in read.items():
        pq.write_table(t, os.path.join(out, f"{name}.parquet"))
    duckdb_tables = read_with_duckdb(uri, token, os.path.join(out, "duckdb"))
    try:
        urllib.request.urlopen(f"{uri}/v1/namespaces")
        without_token = 200
    except urllib.error.HTTPError as e:
        without_token = e.code
    print(json.dumps({"snapshots": snapshots, "duckdb_tables": duckdb_tables, "without_token": without_token}))


def read_with_duckdb(uri, token, out):
    """Every table of the catalog at `uri` as DuckDB reads it after
    attaching it, written to `out`; returns their names."""
    os.makedirs(out)
    con = duckdb_connection()
    con.execute(f"CREATE SECRET fovea (TYPE iceberg, TOKEN '{token}')")
    con.execute(f"ATTACH 'pinned' AS lake (TYPE iceberg, SECRET fovea, ENDPOINT '{uri}')")
    names = []
    for db, schema, table, *_ in con.execute("SHOW ALL TABLES").fetchall():
        if db != "lake":
            continue
        name = f"{schema}.{table}"
        rows = con.execute(f'SELECT * FROM lake."{schema}"."{table}"').fetch_arrow_table()
        pq.write_table(rows, os.path.join(out, f"{name}.parquet"))
        names.append(name)
    return sorted(names)


if __name__ == "__main__":
    main()
