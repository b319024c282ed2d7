"""Reads Iceberg tables the way users' engines do, for replayer/tests/it/iceberg.rs.

usage: read_tables.py OUT [--snapshot ID] [--engines duckdb,pyiceberg] TABLE_LOCATION...

For each table location (a directory with metadata/version-hint.text), writes
what DuckDB's iceberg extension and pyiceberg read as Parquet files
OUT/duckdb/N.parquet and OUT/pyiceberg/N.parquet (N: the table's position in
the arguments), and prints one JSON line per table with the summary of the
snapshot read as pyiceberg reads it. With --snapshot, each table is read at
that snapshot (time travel) instead of its current one.

A location may be s3://BUCKET/PATH: both engines then read through the S3
endpoint, region and keys of the AWS_* environment (a local moto in tests).
"""

import argparse
import glob
import json
import os
import sys

import duckdb
import duckdb_extension_avro
import duckdb_extension_httpfs
import duckdb_extension_iceberg
import pyarrow.parquet as pq
from pyiceberg.io import load_file_io
from pyiceberg.table import StaticTable


def s3_properties():
    """pyiceberg's properties for the S3 of the AWS_* environment."""
    props = {
        "s3.region": os.environ.get("AWS_REGION", "us-east-1"),
        "s3.access-key-id": os.environ.get("AWS_ACCESS_KEY_ID", ""),
        "s3.secret-access-key": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
    }
    if os.environ.get("AWS_ENDPOINT_URL"):
        props["s3.endpoint"] = os.environ["AWS_ENDPOINT_URL"]
    return props


def duckdb_s3_secret(con):
    """DuckDB's S3 secret for the AWS_* environment."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    options = [
        "TYPE s3",
        "PROVIDER config",
        f"KEY_ID '{os.environ.get('AWS_ACCESS_KEY_ID', '')}'",
        f"SECRET '{os.environ.get('AWS_SECRET_ACCESS_KEY', '')}'",
        f"REGION '{os.environ.get('AWS_REGION', 'us-east-1')}'",
    ]
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        options += [f"ENDPOINT '{host.rstrip('/')}'", "URL_STYLE 'path'", f"USE_SSL {str(scheme == 'https').lower()}"]
    con.execute(f"CREATE SECRET fovea_s3 ({', '.join(options)})")


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
    for module in (duckdb_extension_avro, duckdb_extension_httpfs, duckdb_extension_iceberg):
        found = glob.glob(os.path.join(os.path.dirname(module.__file__), "extensions", "*", "*.duckdb_extension"))
        if not found:
            sys.exit(f"no .duckdb_extension file in {module.__name__}")
        con.execute(f"LOAD '{found[0]}'")
    return con


def main():
    args = argparse.ArgumentParser()
    args.add_argument("out")
    args.add_argument("--snapshot", type=int)
    args.add_argument("--engines", default="duckdb,pyiceberg")
    args.add_argument("locations", nargs="+")
    args = args.parse_args()
    engines = args.engines.split(",")
    for engine in engines:
        os.makedirs(os.path.join(args.out, engine), exist_ok=True)
    con = duckdb_connection()
    if any(location.startswith("s3://") for location in args.locations):
        duckdb_s3_secret(con)
    props = s3_properties()
    for i, location in enumerate(args.locations):
        if "duckdb" in engines:
            if args.snapshot is None:
                table = con.execute("SELECT * FROM iceberg_scan(?)", [location]).fetch_arrow_table()
            else:
                table = con.execute(
                    "SELECT * FROM iceberg_scan(?, snapshot_from_id => ?)", [location, args.snapshot]
                ).fetch_arrow_table()
            pq.write_table(table, os.path.join(args.out, "duckdb", f"{i}.parquet"))
        metadata = location.rstrip("/") + "/metadata/"
        io = load_file_io(props, location)
        with io.new_input(metadata + "version-hint.text").open() as f:
            version = f.read().decode().strip()
        static = StaticTable.from_metadata(metadata + f"v{version}.metadata.json", properties=props)
        if args.snapshot is None:
            snapshot = static.current_snapshot()
        else:
            snapshot = static.snapshot_by_id(args.snapshot)
            if snapshot is None:
                sys.exit(f"{location}: no snapshot {args.snapshot} in its metadata")
        if "pyiceberg" in engines:
            rows = static.scan(snapshot_id=snapshot.snapshot_id).to_arrow()
            pq.write_table(rows, os.path.join(args.out, "pyiceberg", f"{i}.parquet"))
        print(
            json.dumps(
                {
                    "location": location,
                    "summary": dict(snapshot.summary.additional_properties),
                    "operation": snapshot.summary.operation.value,
                    "format_version": static.metadata.format_version,
                    "snapshots": [s.snapshot_id for s in static.metadata.snapshots],
                    "manifests": [
                        {"content": int(m.content), "added_snapshot_id": m.added_snapshot_id}
                        for m in snapshot.manifests(io)
                    ],
                }
            )
        )


if __name__ == "__main__":
    main()
