"""fovea for Python: SQL on a fovea lake, answered as ``pyarrow.Table``.

    import fovea
    conn = fovea.connect(lake="s3://my-bucket/lakes/shop", state="dynamodb://fovea-shop",
                         scan="lambda://fovea-scan")   # or a local directory, in process
    conn.sql("SELECT bid, sum(abalance) FROM public.pgbench_accounts GROUP BY bid")
    conn.tables(); conn.schema("public.pgbench_accounts"); conn.history(limit=10)
    with conn.snapshot() as snap:  # one checkpoint, held: every call answers at snap.ts
        conn.as_of(snap.ts).sql("…")

Planning, visibility and the scans run in the extension module (Rust, the
same code as ``fovea sql``): no ``fovea`` binary is needed. A connection
reads the lake as of its newest checkpoint, registered as a reader while a
query or a snapshot holds it, beside a running replayer. With
``scan="lambda://FUNCTION"`` the scans' splits run on the Lambda scan
function (``AWS_ENDPOINT_URL_LAMBDA`` honoured), grouped by bytes to read.
Errors raise ``fovea.FoveaError`` naming what failed and where.
"""

from ._fovea import Connection, FoveaError, Snapshot, __version__, connect

__all__ = ["connect", "Connection", "Snapshot", "FoveaError", "__version__"]
