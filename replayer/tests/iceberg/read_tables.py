"""Reads Iceberg tables the way users' engines do, for replayer/tests/iceberg.rs.

usage: read_tables.py OUT TABLE_LOCATION...

For each table location (a directory with metadata/version-hint.text), writes
what DuckDB's iceberg extension and pyiceberg read as Parquet files
OUT/duckdb/N.parquet and OUT/pyiceberg/N.parquet (N: the table's position in
the arguments), and prints one JSON line per table with the current
snapshot's summary as pyiceberg reads it.
"""

import glob
import json
import os
import sys

import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg
import pyarrow.parquet as pq
from pyiceberg.table import StaticTable


def duckdb_connection():
    con = duckdb.connect(
        config={
            "allow_unsigned_extensions": "true",
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
        }
    )
    # The extensions come from PyPI (no network at test time): loaded from
    # their packages' files.
    for module in (duckdb_extension_avro, duckdb_extension_iceberg):
        found = glob.glob(os.path.join(os.path.dirname(module.__file__), "extensions", "*", "*.duckdb_extension"))
        if not found:
            sys.exit(f"no .duckdb_extension file in {module.__name__}")
        con.execute(f"LOAD '{found[0]}'")
    return con


def main():
    out, locations = sys.argv[1], sys.argv[2:]
    for engine in ("duckdb", "pyiceberg"):
        os.makedirs(os.path.join(out, engine), exist_ok=True)
    con = duckdb_connection()
    for i, location in enumerate(locations):
        table = con.execute("SELECT * FROM iceberg_scan(?)", [location]).fetch_arrow_table()
        pq.write_table(table, os.path.join(out, "duckdb", f"{i}.parquet"))
        with open(os.path.join(location, "metadata", "version-hint.text")) as f:
            version = f.read().strip()
        static = StaticTable.from_metadata(os.path.join(location, "metadata", f"v{version}.metadata.json"))
        pq.write_table(static.scan().to_arrow(), os.path.join(out, "pyiceberg", f"{i}.parquet"))
        snapshot = static.current_snapshot()
        print(json.dumps({"location": location, "summary": dict(snapshot.summary.additional_properties), "operation": snapshot.summary.operation.value}))


if __name__ == "__main__":
    main()
