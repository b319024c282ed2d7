#!/usr/bin/env python3
"""Seeds the text and protocol fuzz corpora: Debezium records from pg-tiny
(both captures, every form: Kafka envelopes, bare values, transaction
metadata), DMS records, the pg-tiny DDL, and pgoutput sessions built by the
protocol's message layouts. The binary formats (checkpoint manifest, index
image, visibility checkpoint, split tasks) come from
`cargo run -p fovea-fuzz-targets --bin fuzz-seeds` (fuzz/src/seeds.rs).

usage: fuzz_seeds.py CORPUS_DIR
"""
import gzip
import json
import os
import struct
import sys

root = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "pg-tiny")
out = sys.argv[1]


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# Debezium: a spread of lines of both captures, and their bare values.
for capture in ("debezium_events.jsonl.gz", "debezium_events.precise_schemas.jsonl.gz"):
    with gzip.open(os.path.join(root, capture), "rt") as f:
        lines = f.read().splitlines()
    step = max(1, len(lines) // 120)
    for i, line in enumerate(lines[::step]):
        put("debezium", f"{capture[:-9]}-{i}", line)
        value = json.loads(line).get("value")
        if value is not None:
            put("debezium", f"{capture[:-9]}-{i}-value", json.dumps(value))

# DMS: data records of every operation, with transaction details, and a
# control record.
def dms(op, data, extra=None, before=None):
    meta = {"timestamp": "2026-01-01T00:00:00.000000Z", "record-type": "data", "operation": op,
            "partition-key-type": "schema-table", "schema-name": "public", "table-name": "t",
            "transaction-id": 4242, "commit-timestamp": "2026-01-01T00:00:00.000000Z",
            "prev-transaction-id": 4241, "prev-transaction-record-id": 3, "transaction-record-id": 1}
    meta.update(extra or {})
    rec = {"data": data, "metadata": meta}
    if before is not None:
        rec["before-image"] = before
    return json.dumps(rec)

row = {"id": 1, "name": "a", "amount": "12.50", "at": "2026-01-01 00:00:00.000000", "blob": "0xCAFE"}
put("dms", "insert", dms("insert", row))
put("dms", "load", dms("load", row))
put("dms", "update", dms("update", {**row, "name": "b"}, before=row))
put("dms", "delete", dms("delete", row))
put("dms", "control", dms("create-table", {}, {"record-type": "control"}))

# DDL: the whole schema file and each statement.
with open(os.path.join(root, "schema.sql")) as f:
    ddl = f.read()
put("ddl", "schema.sql", ddl)
for i, stmt in enumerate(s for s in ddl.split(";") if s.strip()):
    put("ddl", f"stmt-{i}", stmt + ";")


# pgoutput: sessions as length-prefixed messages (the target's framing).
def cstr(s):
    return s.encode() + b"\0"


def relation(relid, columns):
    body = b"R" + struct.pack(">I", relid) + cstr("public") + cstr("t") + b"d" + struct.pack(">h", len(columns))
    for flags, name, oid, typmod in columns:
        body += bytes([flags]) + cstr(name) + struct.pack(">Ii", oid, typmod)
    return body


def tuple_data(values):
    body = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            body += b"n"
        elif v == "u":
            body += b"u"
        else:
            body += b"t" + struct.pack(">i", len(v)) + v.encode()
    return body


def session(messages):
    return b"".join(bytes([len(m)]) + m for m in messages)


cols = [(1, "id", 23, -1), (0, "name", 25, -1), (0, "amount", 1700, (12 << 16 | 2) + 4), (0, "at", 1184, -1),
        (0, "day", 1082, -1), (0, "ok", 16, -1), (0, "big", 20, -1)]
begin = b"B" + struct.pack(">QqI", 0x1000, 0, 77)
commit = b"C" + b"\0" + struct.pack(">QQq", 0x1000, 0x1010, 0)
values = ["1", "a", "12.50", "2026-01-01 00:00:00+00", "2026-01-02", "t", "5000000000"]
insert = b"I" + struct.pack(">I", 16384) + b"N" + tuple_data(values)
update = b"U" + struct.pack(">I", 16384) + b"K" + tuple_data(["1", None, None, None, None, None, None]) + b"N" + \
    tuple_data(["2", "u", "1.00", None, None, "f", "-1"])
delete = b"D" + struct.pack(">I", 16384) + b"K" + tuple_data(["2", None, None, None, None, None, None])
truncate = b"T" + struct.pack(">IbI", 1, 0, 16384)
put("pgoutput", "insert", session([relation(16384, cols), begin, insert, commit]))
put("pgoutput", "changes", session([begin, relation(16384, cols), insert, update, delete, commit]))
put("pgoutput", "truncate", session([relation(16384, cols), begin, insert, truncate, commit]))
wide = [(c[0], c[1], 20 if c[1] == "id" else c[2], c[3]) for c in cols]
put("pgoutput", "retyped", session([relation(16384, cols), begin, insert, commit, relation(16384, wide), begin,
                                    insert, commit]))
