"""Times queries of one Iceberg table in DuckDB, for `fovea-bench iceberg`.

usage: iceberg_read.py TABLE_LOCATION QUERIES_JSON

QUERIES_JSON maps a name to SQL with {table} where the table goes. Prints
one JSON object: each query's median milliseconds over 5 runs after a
warm-up run ("ms"), and its answer, rows as lists of text, sorted ("rows").
"""

import glob
import json
import os
import statistics
import sys
import time

import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg


def main():
    location, queries = sys.argv[1], json.loads(sys.argv[2])
    con = duckdb.connect(
        config={
            "allow_unsigned_extensions": "true",
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
        }
    )
    for module in (duckdb_extension_avro, duckdb_extension_iceberg):
        found = glob.glob(os.path.join(os.path.dirname(module.__file__), "extensions", "*", "*.duckdb_extension"))
        if not found:
            sys.exit(f"no .duckdb_extension file in {module.__name__}")
        con.execute(f"LOAD '{found[0]}'")
    table = "iceberg_scan('" + location.replace("'", "''") + "')"
    ms, rows = {}, {}
    for name, sql in queries.items():
        sql = sql.replace("{table}", table)
        times = []
        for run in range(6):
            started = time.perf_counter()
            answer = con.execute(sql).fetchall()
            if run > 0:
                times.append((time.perf_counter() - started) * 1e3)
        ms[name] = statistics.median(times)
        rows[name] = sorted([[str(v) for v in row] for row in answer])
    print(json.dumps({"ms": ms, "rows": rows}))


if __name__ == "__main__":
    main()
