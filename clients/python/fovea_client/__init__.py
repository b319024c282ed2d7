"""Scan fovea lake tables from Python with the Lambda scan function.

    import fovea_client
    table = fovea_client.scan(
        "public.pgbench_accounts",
        lake="s3://my-bucket/lakes/shop", state="dynamodb://fovea-shop",
        function="fovea-scan", columns=["aid", "abalance"])

``scan`` asks the lake's catalog for the scan's splits (``fovea plan``: one
view of the table at the lake's newest checkpoint), invokes the scan
function once per group of consecutive splits — the scan spread over
``concurrency`` groups of 8 to ``group_mb`` MB to read (64 by default; the
plan estimates each split's bytes) — groups in parallel (boto3; ``AWS_ENDPOINT_URL_LAMBDA`` honoured), and returns the
visible rows as one ``pyarrow.Table``.

An invocation that fails with a retryable error is retried once; a group's
rows are taken only from the attempt that succeeded, whole. If the lake
moved on under the plan (``ObjectMissing`` / ``SnapshotUnavailable``: a
file was retired), the whole scan is planned again once. Answers too big to
return inline are read from S3 and deleted.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional

import boto3
import pyarrow as pa
from botocore.config import Config
from botocore.exceptions import ClientError

__all__ = ["scan", "ScanError", "plan"]

SPILL_ROOT = "_fovea/scan-results"
# A request's JSON stays under this (Lambda takes 6 MB synchronously), as
# fovea_core::scan_worker::MAX_REQUEST_BYTES.
MAX_REQUEST_BYTES = 5 << 20
# A scan is not spread over invocations of less than this to read
# (fovea_core::scan_worker::DEFAULT_MIN_GROUP_BYTES).
MIN_GROUP_BYTES = 8 << 20
RETRYABLE = {"Unavailable", "Failed"}
REPLAN = {"ObjectMissing", "SnapshotUnavailable"}


class ScanError(Exception):
    """A split failed: ``kind`` is the function's errorType (BadRequest,
    ObjectMissing, SnapshotUnavailable, Unavailable, Failed or a Lambda
    runtime error), ``split`` its number in the plan."""

    def __init__(self, kind: str, message: str, split: int):
        super().__init__(f"split {split}: {kind}: {message}")
        self.kind = kind
        self.split = split


def plan(table: str, *, lake: str, state: str, columns: Optional[List[str]] = None,
         limit: Optional[int] = None, fovea: Optional[str] = None) -> dict:
    """The split tasks of a scan of ``table`` at the lake's newest checkpoint
    (the output of ``fovea plan``)."""
    cmd = [fovea or os.environ.get("FOVEA_BIN", "fovea"), "plan", "--lake", lake, "--state", state,
           "--table", table]
    if columns:
        cmd += ["--columns", ",".join(columns)]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"fovea plan failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def _bucket_prefix(lake: str):
    rest = lake[len("s3://"):] if lake.startswith("s3://") else None
    if rest is None:
        raise ValueError(f"{lake}: the scan function reads s3:// lakes only")
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


def _invoke(client, function: str, request: dict):
    """(answer, None) or (None, (kind, message))."""
    try:
        out = client.invoke(FunctionName=function, Payload=json.dumps(request).encode())
    except ClientError as e:  # throttling, a missing function, an emulator's HTTP 500
        return None, ("Unavailable", str(e))
    except Exception as e:  # timeouts, connection errors
        return None, ("Unavailable", str(e))
    body = out["Payload"].read()
    if out.get("FunctionError"):
        try:
            err = json.loads(body)
            return None, (err.get("errorType", "Failed"), err.get("errorMessage", ""))
        except ValueError:
            return None, ("Failed", body.decode(errors="replace"))
    return json.loads(body), None


def _batches(answer: dict, s3, bucket: str, prefix: str) -> List[pa.RecordBatch]:
    out = []
    if answer.get("ipc"):
        out += pa.ipc.open_stream(base64.b64decode(answer["ipc"])).read_all().to_batches()
    for key in answer.get("objects", []):
        if not key.startswith(SPILL_ROOT + "/"):
            raise ScanError("Failed", f"an answer outside {SPILL_ROOT}: {key}", -1)
        full = f"{prefix}/{key}" if prefix else key
        data = s3.get_object(Bucket=bucket, Key=full)["Body"].read()
        out += pa.ipc.open_stream(data).read_all().to_batches()
        s3.delete_object(Bucket=bucket, Key=full)
    rows = sum(b.num_rows for b in out)
    if rows != answer["rows"]:
        raise ScanError("Failed", f"{rows} rows, {answer['rows']} announced", -1)
    return out


def _groups(tasks: List[dict], max_bytes: int, parallel: int) -> List[List[dict]]:
    """Consecutive tasks while their estimated bytes stay within a target
    and their JSON within MAX_REQUEST_BYTES (a task alone over either is a
    group of its own): the scan spread over at most ``parallel`` groups,
    each between MIN_GROUP_BYTES and ``max_bytes``, as fovea_core's
    group_tasks."""
    sizes = [t.get("bytes", 0) for t in tasks]
    spread = -(-sum(sizes) // max(1, parallel)) + max(sizes, default=0)
    group_bytes = min(max(spread, min(MIN_GROUP_BYTES, max_bytes)), max_bytes)
    groups: List[List[dict]] = []
    size = json_size = 0
    for task in tasks:
        n, j = task.get("bytes", 0), len(json.dumps(task))
        if groups and size + n <= group_bytes and json_size + j <= MAX_REQUEST_BYTES:
            groups[-1].append(task)
            size, json_size = size + n, json_size + j
        else:
            groups.append([task])
            size, json_size = n, j
    return groups


def _run_plan(p: dict, function: str, concurrency: int, group_mb: int, lam, s3) -> pa.Table:
    bucket, prefix = _bucket_prefix(p["lake"])
    schema = pa.ipc.open_stream(base64.b64decode(p["schema"])).schema

    def one(n_group):
        n, group = n_group
        for attempt in (0, 1):
            request = {"lake": p["lake"], "tasks": group,
                       "spill_prefix": f"{SPILL_ROOT}/{p['query']}/{n:06}-{attempt}"}
            answer, failure = _invoke(lam, function, request)
            if failure is None:
                return _batches(answer, s3, bucket, prefix)
            kind, message = failure
            if attempt == 0 and kind.split(".")[0] in RETRYABLE | {"Runtime"}:
                continue
            raise ScanError(kind, message, n)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        parts = list(pool.map(one, enumerate(_groups(p["tasks"], group_mb << 20, concurrency))))
    batches = [b for part in parts for b in part]
    return pa.Table.from_batches(batches, schema=schema)


def scan(table: str, *, lake: str, state: str, function: str = "fovea-scan",
         columns: Optional[List[str]] = None, limit: Optional[int] = None,
         concurrency: int = 16, group_mb: int = 64, fovea: Optional[str] = None,
         lambda_client=None, s3_client=None) -> pa.Table:
    """The visible rows of ``table`` at the lake's newest checkpoint."""
    # One attempt per call: the retry policy is this module's (once, under a
    # new spill prefix), not botocore's.
    lam = lambda_client or boto3.client(
        "lambda", config=Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=900))
    s3 = s3_client or boto3.client("s3")
    for replan in (0, 1):
        p = plan(table, lake=lake, state=state, columns=columns, limit=limit, fovea=fovea)
        try:
            result = _run_plan(p, function, concurrency, group_mb, lam, s3)
        except ScanError as e:
            if replan == 0 and e.kind in REPLAN:
                continue
            raise
        return result.slice(0, limit) if limit is not None else result
    raise AssertionError("unreachable")
