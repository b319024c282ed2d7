"""The fovea package against a replayed pg-tiny lake, checked against the
``fovea`` command line on the same lake (run by tests/python.rs).

Environment: FOVEA_LAKE, FOVEA_STATE (optional), FOVEA_SCAN (optional:
where the package runs the scans; the command line always scans in process),
FOVEA_BIN (the fovea binary), and for the lake moving under a held snapshot
FOVEA_INPUT + FOVEA_FULL_INPUT (the input replayed so far, and all of it).
"""

import csv
import io
import os
import shutil
import subprocess
import threading
import unittest

import pyarrow as pa

import fovea

LAKE = os.environ["FOVEA_LAKE"]
STATE = os.environ.get("FOVEA_STATE")
SCAN = os.environ.get("FOVEA_SCAN")
BIN = os.environ["FOVEA_BIN"]
LAKE_ARGS = ["--lake", LAKE] + (["--state", STATE] if STATE else [])

# Integer and text columns of every kind of table (keyed, several schemas,
# joins, aggregates, filters pushed down, an empty answer): their CSV text
# is the same from Python's str() and the command line.
QUERIES = [
    "SELECT aid, bid, abalance FROM public.pgbench_accounts",
    "SELECT bid, count(*) AS n, sum(abalance) AS s FROM public.pgbench_accounts GROUP BY bid",
    "SELECT tid, bid, tbalance FROM public.pgbench_tellers WHERE tbalance <> 0",
    "SELECT c_id, c_d_id, c_w_id, c_last FROM tpcc.customer",
    "SELECT o.o_id, o.o_w_id, count(*) AS lines FROM tpcc.orders o JOIN tpcc.order_line l "
    "ON l.ol_o_id = o.o_id AND l.ol_d_id = o.o_d_id AND l.ol_w_id = o.o_w_id GROUP BY o.o_id, o.o_w_id",
    "SELECT aid FROM public.pgbench_accounts WHERE aid < 0",
]


def cli(*args):
    out = subprocess.run([BIN, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(f"fovea {' '.join(args)}: {out.stderr}")
    return out.stdout


def cli_rows(query):
    """The command line's answer: header and sorted rows, as text."""
    rows = list(csv.reader(io.StringIO(cli("sql", "--format", "csv", *LAKE_ARGS, query))))
    return rows[0], sorted(rows[1:])


def rows(table):
    """A pyarrow answer as the command line prints it in CSV."""
    text = lambda v: "" if v is None else str(v)
    return table.column_names, sorted([text(v) for v in row.values()] for row in table.to_pylist())


class Package(unittest.TestCase):
    def setUp(self):
        self.conn = fovea.connect(lake=LAKE, state=STATE, scan=SCAN)

    def test_sql_answers_as_the_command_line(self):
        for query in QUERIES:
            answer = self.conn.sql(query)
            self.assertIsInstance(answer, pa.Table)
            header, want = cli_rows(query)
            self.assertEqual(rows(answer), (header, want), query)
        # An empty answer keeps its columns and their types.
        empty = self.conn.sql(QUERIES[-1])
        self.assertEqual(empty.num_rows, 0)
        self.assertEqual(empty.schema.field("aid").type, pa.int32())

    def test_tables_and_schemas(self):
        tables = self.conn.tables()
        self.assertEqual(tables, sorted(tables))
        for name in ["public.pgbench_accounts", "public.pgbench_branches", "tpcc.order_line"]:
            self.assertIn(name, tables)
        schema = self.conn.schema("public.pgbench_accounts")
        self.assertIsInstance(schema, pa.Schema)
        star = self.conn.sql("SELECT * FROM public.pgbench_accounts LIMIT 1")
        self.assertEqual(schema.names, star.column_names)
        self.assertEqual([f.type for f in schema], [f.type for f in star.schema])
        with self.assertRaisesRegex(fovea.FoveaError, "no_such_table"):
            self.conn.schema("public.no_such_table")

    def test_history_is_the_catalog_s(self):
        history = self.conn.history(limit=5)
        self.assertEqual(
            history.column_names,
            ["mirror_ts", "source_txid", "source_commit", "replayed", "latency_ms", "rows", "tables"],
        )
        self.assertEqual(history.num_rows, 5)
        ts = history["mirror_ts"].to_pylist()
        self.assertEqual(ts, sorted(ts, reverse=True))
        # The command line's `fovea history` lists the same transactions.
        printed = cli("history", *LAKE_ARGS, "--limit", "5").splitlines()
        start = next(i for i, l in enumerate(printed) if l.strip().startswith("mirror ts")) + 1
        self.assertEqual([int(l.split()[0]) for l in printed[start : start + 5]], ts)
        for row in history.to_pylist():
            self.assertEqual(sum(n for _, n in row["tables"]), row["rows"])
        only = self.conn.history(table="public.pgbench_history", limit=1000)
        self.assertGreater(only.num_rows, 0)
        for tables in only["tables"].to_pylist():
            self.assertIn("public.pgbench_history", [t for t, _ in tables])
        # pandas reads it, timestamps in UTC.
        frame = history.to_pandas()
        self.assertEqual(str(frame["replayed"].dt.tz), "UTC")

    def test_snapshots_and_as_of(self):
        snap = self.conn.snapshot()
        self.assertEqual(self.conn.as_of(snap.ts).ts, snap.ts)
        self.assertIsNotNone(snap.source_commit_us)
        with self.assertRaisesRegex(fovea.FoveaError, "newer snapshots"):
            self.conn.as_of(snap.ts + 1)
        with self.assertRaisesRegex(fovea.FoveaError, "no snapshot of this connection holds"):
            self.conn.as_of(snap.ts - 1)
        self.assertIn(f"at ts {snap.ts}", repr(snap))
        # Released (here at the end of a with block), it answers no more.
        with self.conn.snapshot() as held:
            n = held.sql("SELECT count(*) AS n FROM public.pgbench_accounts").to_pylist()
        self.assertEqual(n, [{"n": 200}])
        with self.assertRaisesRegex(fovea.FoveaError, "was released"):
            held.sql("SELECT 1")
        self.assertIn("released", repr(held))
        snap.release()
        del snap

    def test_queries_from_threads_at_once(self):
        # Calls release the GIL: two threads query at the same time.
        answers, errors = [], []

        def run(query):
            try:
                answers.append(rows(self.conn.sql(query)))
            except Exception as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(q,)) for q in QUERIES[:2] * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(answers), 4)

    def test_errors_name_what_failed(self):
        with self.assertRaisesRegex(fovea.FoveaError, "no_such_table"):
            self.conn.sql("SELECT * FROM public.no_such_table")
        with self.assertRaisesRegex(fovea.FoveaError, "is not a fovea lake"):
            fovea.connect(lake=os.path.join(os.path.dirname(__file__))).sql("SELECT 1")
        with self.assertRaisesRegex(fovea.FoveaError, "local directory"):
            fovea.connect(lake="/tmp/somewhere", scan="lambda://fovea-scan")
        with self.assertRaisesRegex(fovea.FoveaError, "expected lambda://"):
            fovea.connect(lake="s3://b/p", state="dynamodb://fovea-t", scan="lamda://fovea-scan")
        # A malformed address fails at connect, before anything is contacted.
        with self.assertRaisesRegex(fovea.FoveaError, "no state store"):
            fovea.connect(lake="s3://b/p")
        with self.assertRaisesRegex(fovea.FoveaError, "expected dynamodb://TABLE"):
            fovea.connect(lake="s3://b/p", state="dynamo://t")
        with self.assertRaisesRegex(fovea.FoveaError, "no bucket"):
            fovea.connect(lake="s3://", state="dynamodb://fovea-t")

    @unittest.skipUnless(os.environ.get("FOVEA_FULL_INPUT"), "the lake moves only in the local test")
    def test_a_held_snapshot_stays_while_the_lake_moves(self):
        count = "SELECT count(*) AS n, sum(abalance) AS s FROM public.pgbench_accounts"
        history = "SELECT count(*) AS n FROM public.pgbench_history"
        held = self.conn.snapshot()
        before = (held.sql(count).to_pylist(), held.sql(history).to_pylist())
        # The replayer goes on with the rest of the input and checkpoints.
        shutil.copyfile(os.environ["FOVEA_FULL_INPUT"], os.environ["FOVEA_INPUT"])
        cli("replay", *LAKE_ARGS, "--input", os.environ["FOVEA_INPUT"])
        newest = self.conn.snapshot()
        self.assertGreater(newest.ts, held.ts)
        self.assertNotEqual(newest.sql(history).to_pylist(), before[1])
        self.assertEqual(rows(self.conn.sql(history)), cli_rows(history))
        # The held snapshot still answers as before, and as_of finds it.
        self.assertEqual((held.sql(count).to_pylist(), held.sql(history).to_pylist()), before)
        again = self.conn.as_of(held.ts)
        self.assertEqual(again.sql(history).to_pylist(), before[1])


if __name__ == "__main__":
    unittest.main(verbosity=2)
