//! fovea for Python: the `fovea` package's extension module (`fovea._fovea`).
//!
//! ```text
//!  fovea.connect(lake=…, state=…, scan=…) ─▶ Connection (nothing opened yet)
//!  .sql(q) ─▶ a Snapshot of the lake's newest checkpoint ─▶ its .sql(q)
//!  Snapshot ─▶ the lake read as of one checkpoint (registered as its reader:
//!              the writer keeps every file it names until it is released)
//!  .sql(q) ─▶ DataFusion over the snapshot's tables, the scans in this process
//!             or on the Lambda scan function (scan="lambda://…")
//!          ─▶ Arrow IPC stream ─▶ pyarrow.Table (read without a copy of its buffers)
//! ```
//!
//! Planning, the scans and their visibility run here, in Rust: a notebook
//! needs no `fovea` binary. Every call that does IO releases the GIL, so
//! other Python threads run meanwhile; errors raise `fovea.FoveaError`
//! with the whole chain of causes.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use arrow::array::{ArrayRef, Float64Builder, MapBuilder, StringBuilder, TimestampMicrosecondBuilder, UInt64Builder};
use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use fovea_aws::lake::LakeAddress;
use fovea_core::SnapshotTables;
use fovea_core::location::OpenReader;
use fovea_core::scan_worker::SplitWorker;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

pyo3::create_exception!(
    fovea,
    FoveaError,
    PyException,
    "A fovea call failed: the lake could not be opened or read, or a statement was refused. The message names what and where."
);

/// How long a reader's registration lives without renewal (it is renewed
/// every third of it until the snapshot is released): the command line's.
const READER_TTL: std::time::Duration = fovea_core::lease::DEFAULT_LEASE_TTL;

/// The runtime every query and scan of this process runs on (DataFusion's
/// operators, the Lambda invocations): started on first use.
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("fovea-query")
        .enable_all()
        .build()
        .map_err(|e| FoveaError::new_err(format!("starting the query runtime: {e}")))?;
    // Two threads racing here: the loser's runtime is dropped unused.
    Ok(RUNTIME.get_or_init(|| rt))
}

/// `err` and its causes, as one message.
fn error(err: &(dyn std::error::Error + 'static)) -> PyErr {
    let mut message = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = c.source();
    }
    FoveaError::new_err(message)
}

/// A lake opened for queries: `lake` a directory or `s3://BUCKET/PREFIX`,
/// `state` its state store (`dynamodb://TABLE`, required for an s3:// lake;
/// a local lake keeps it under `LAKE/_fovea`), `scan` where the splits of
/// its scans run (`in-process`, the default, or `lambda://FUNCTION[?…]`
/// for an s3:// lake). Nothing is opened until a call needs it.
#[pyfunction]
#[pyo3(signature = (lake, state = None, scan = None))]
fn connect(lake: String, state: Option<String>, scan: Option<String>) -> PyResult<Connection> {
    let address = LakeAddress::new(lake, state);
    // A malformed address or a missing state store shows at once too.
    address.check().map_err(|e| error(&e))?;
    // Where the scans run is refused now too, rather than at the first query.
    fovea_aws::lambda::scan_target(&address, scan.as_deref()).map_err(|e| error(&e))?;
    Ok(Connection { address, scan, held: Mutex::default() })
}

/// A connection to a lake (see `fovea.connect`). Each `sql`, `tables` and
/// `schema` call answers at the lake's newest checkpoint; `snapshot()` and
/// `as_of(ts)` pin one for several calls.
#[pyclass(module = "fovea", frozen)]
struct Connection {
    address: LakeAddress,
    scan: Option<String>,
    /// The snapshots this connection handed out that are not released:
    /// `as_of` answers at any of them.
    held: Mutex<Vec<Weak<Pinned>>>,
}

/// One checkpoint of the lake, read (and registered as read) while it lives.
struct Pinned {
    opened: OpenReader,
    worker: Option<Arc<dyn SplitWorker>>,
}

impl Connection {
    /// Opens the lake at its newest checkpoint (the GIL released meanwhile).
    fn open(&self, py: Python<'_>) -> PyResult<Arc<Pinned>> {
        let pinned = py
            .detach(|| -> Result<Pinned, fovea_core::Error> {
                let opened = fovea_core::location::open_reader(self.address.existing()?, READER_TTL)?;
                let store = Arc::clone(opened.reader.lake().store());
                let worker = fovea_aws::lambda::scan_worker(&self.address, store, self.scan.as_deref())?;
                Ok(Pinned { opened, worker })
            })
            .map_err(|e| error(&e))?;
        let pinned = Arc::new(pinned);
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        held.retain(|w| w.strong_count() > 0);
        held.push(Arc::downgrade(&pinned));
        Ok(pinned)
    }

    /// `call` on the lake's newest checkpoint, released afterwards.
    fn once<T>(&self, py: Python<'_>, call: impl FnOnce(&Snapshot) -> PyResult<T>) -> PyResult<T> {
        let snapshot = self.snapshot_of(self.open(py)?);
        let out = call(&snapshot);
        snapshot.release(py);
        out
    }

    fn snapshot_of(&self, pinned: Arc<Pinned>) -> Snapshot {
        Snapshot {
            ts: pinned.opened.reader.qts().get(),
            source_commit_us: pinned.opened.source_commit.map(|(_, commit)| commit),
            pinned: Mutex::new(Some(pinned)),
            lake: self.address.lake.clone(),
        }
    }
}

#[pymethods]
impl Connection {
    /// Runs one SQL statement at the lake's newest checkpoint and returns
    /// its answer as a `pyarrow.Table`.
    fn sql<'py>(&self, py: Python<'py>, query: &str) -> PyResult<Bound<'py, PyAny>> {
        self.once(py, |snapshot| snapshot.sql(py, query))
    }

    /// The lake's tables (`schema.table`) at its newest checkpoint.
    fn tables(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.once(py, Snapshot::tables)
    }

    /// The columns of `table` at the lake's newest checkpoint, as a
    /// `pyarrow.Schema`.
    fn schema<'py>(&self, py: Python<'py>, table: &str) -> PyResult<Bound<'py, PyAny>> {
        self.once(py, |snapshot| snapshot.schema(py, table))
    }

    /// The lake's newest checkpoint, held until the returned snapshot is
    /// released (`release()`, the end of a `with` block, or Python dropping
    /// it): every call on it answers at that one timestamp.
    fn snapshot(&self, py: Python<'_>) -> PyResult<Snapshot> {
        Ok(self.snapshot_of(self.open(py)?))
    }

    /// The snapshot at mirror timestamp `ts`: the lake's newest checkpoint,
    /// or one this connection handed out and that is not released (a lake
    /// read without its replayer answers at checkpoints only; the files of
    /// older ones are gone unless a reader holds them).
    fn as_of(&self, py: Python<'_>, ts: u64) -> PyResult<Snapshot> {
        let held: Vec<Arc<Pinned>> = {
            let held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            held.iter().filter_map(Weak::upgrade).collect()
        };
        if let Some(pinned) = held.into_iter().find(|p| p.opened.reader.qts().get() == ts) {
            return Ok(self.snapshot_of(pinned));
        }
        let newest = self.open(py)?;
        let at = newest.opened.reader.qts().get();
        if at == ts {
            return Ok(self.snapshot_of(newest));
        }
        Err(FoveaError::new_err(if ts < at {
            format!(
                "as_of({ts}): the lake's newest checkpoint is at ts {at}, and no snapshot of this connection holds ts {ts}; older snapshots stay readable only while one holds them (conn.snapshot())"
            )
        } else {
            format!(
                "as_of({ts}): the lake's newest checkpoint is at ts {at}; newer snapshots are answered by the running fovea serve (Flight SQL) until its next checkpoint"
            )
        }))
    }

    /// Replayed source transactions, newest first, at most `limit`, those
    /// touching `table` when given, from the catalog alone: a
    /// `pyarrow.Table` of mirror_ts, source_txid, source_commit and
    /// replayed (UTC timestamps), latency_ms, rows and tables (rows per
    /// table).
    #[pyo3(signature = (table = None, limit = 100))]
    fn history<'py>(&self, py: Python<'py>, table: Option<&str>, limit: usize) -> PyResult<Bound<'py, PyAny>> {
        let batch = py
            .detach(|| -> Result<RecordBatch, Box<dyn std::error::Error + Send + Sync>> {
                let entries = self.address.existing()?.catalog.history(table, limit)?;
                Ok(history_batch(&entries)?)
            })
            .map_err(|e| error(e.as_ref()))?;
        to_pyarrow(py, batch.schema(), &[batch])
    }

    /// The lake (a directory or s3:// URL).
    #[getter]
    fn lake(&self) -> &str {
        &self.address.lake
    }

    /// Its state store (`dynamodb://TABLE`), or `None` for a local lake's own.
    #[getter]
    fn state(&self) -> Option<&str> {
        self.address.state.as_deref()
    }

    fn __repr__(&self) -> String {
        let state = self.address.state.as_deref().map(|s| format!(", state={s:?}")).unwrap_or_default();
        let scan = self.scan.as_deref().map(|s| format!(", scan={s:?}")).unwrap_or_default();
        format!("fovea.connect(lake={:?}{state}{scan})", self.address.lake)
    }
}

/// The lake as of one checkpoint, read (and registered as read, so the
/// writer keeps its files) until it is released — by `release()`, at the
/// end of a `with` block, or when Python drops it.
#[pyclass(module = "fovea", frozen)]
struct Snapshot {
    /// `None` once released.
    pinned: Mutex<Option<Arc<Pinned>>>,
    ts: u64,
    source_commit_us: Option<i64>,
    lake: String,
}

impl Snapshot {
    /// The checkpoint read, unless released (a query running on another
    /// thread keeps it until it ends).
    fn pinned(&self) -> PyResult<Arc<Pinned>> {
        let pinned = self.pinned.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pinned
            .clone()
            .ok_or_else(|| FoveaError::new_err(format!("the snapshot of {} at ts {} was released", self.lake, self.ts)))
    }
}

#[pymethods]
impl Snapshot {
    /// Lets the writer delete what only this snapshot still reads; the
    /// snapshot answers no more calls.
    fn release(&self, py: Python<'_>) {
        let pinned = self.pinned.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        // Ending the reader's registration is a request to the state store:
        // made without the GIL. (A snapshot Python drops unreleased ends it
        // while collected.)
        py.detach(move || drop(pinned));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*exc))]
    fn __exit__(&self, exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release(exc.py());
        false
    }

    /// Runs one SQL statement at this snapshot and returns its answer as a
    /// `pyarrow.Table`.
    fn sql<'py>(&self, py: Python<'py>, query: &str) -> PyResult<Bound<'py, PyAny>> {
        let pinned = self.pinned()?;
        let source = Arc::clone(&pinned.opened.reader) as Arc<dyn SnapshotTables>;
        let worker = pinned.worker.clone();
        let answer = py
            .detach(|| runtime().map(|rt| rt.block_on(fovea_sql::answer(source, worker, query))))?
            .map_err(|e| error(&e))?;
        to_pyarrow(py, answer.schema, &answer.batches)
    }

    /// The tables (`schema.table`) at this snapshot.
    fn tables(&self) -> PyResult<Vec<String>> {
        let mut names: Vec<String> = self.pinned()?.opened.reader.tables().iter().map(|d| d.name.clone()).collect();
        names.sort();
        Ok(names)
    }

    /// The columns of `table` at this snapshot, as a `pyarrow.Schema`
    /// (fovea's own hidden columns left out, as SQL shows them).
    fn schema<'py>(&self, py: Python<'py>, table: &str) -> PyResult<Bound<'py, PyAny>> {
        let def = self.pinned()?.opened.reader.table(table).map_err(|e| error(&e))?;
        let fields: Vec<_> =
            def.schema.fields().iter().filter(|f| !f.name().starts_with(fovea_sql::HIDDEN_PREFIX)).cloned().collect();
        let schema = Arc::new(Schema::new(fields));
        to_pyarrow(py, schema, &[])?.getattr("schema")
    }

    /// The snapshot's mirror timestamp (its checkpoint's).
    #[getter]
    fn ts(&self) -> u64 {
        self.ts
    }

    /// When the newest source transaction this snapshot holds committed at
    /// the source (µs since the epoch, UTC), when known.
    #[getter]
    fn source_commit_us(&self) -> Option<i64> {
        self.source_commit_us
    }

    fn __repr__(&self) -> String {
        let released = self.pinned.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_none();
        format!("<fovea.Snapshot of {} at ts {}{}>", self.lake, self.ts, if released { ", released" } else { "" })
    }
}

/// `batches` (of `schema`) as one `pyarrow.Table`: written as an Arrow IPC
/// stream and read by pyarrow, which keeps the stream's buffers as its
/// arrays' (no copy on that side).
fn to_pyarrow<'py>(py: Python<'py>, schema: SchemaRef, batches: &[RecordBatch]) -> PyResult<Bound<'py, PyAny>> {
    let bytes = py
        .detach(|| -> Result<Vec<u8>, arrow::error::ArrowError> {
            let mut out = Vec::new();
            let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut out, &schema)?;
            for batch in batches {
                writer.write(batch)?;
            }
            writer.finish()?;
            drop(writer);
            Ok(out)
        })
        .map_err(|e| error(&e))?;
    let ipc = py.import("pyarrow.ipc")?;
    ipc.call_method1("open_stream", (PyBytes::new(py, &bytes),))?.call_method0("read_all")
}

/// The history entries as one batch (see `Connection.history`).
fn history_batch(entries: &[fovea_core::catalog::HistoryEntry]) -> Result<RecordBatch, arrow::error::ArrowError> {
    let utc = || TimestampMicrosecondBuilder::new().with_timezone("UTC");
    let (mut ts, mut txid, mut commit, mut replayed) = (UInt64Builder::new(), StringBuilder::new(), utc(), utc());
    let (mut latency, mut rows) = (Float64Builder::new(), UInt64Builder::new());
    let mut tables = MapBuilder::new(None, StringBuilder::new(), UInt64Builder::new());
    for h in entries {
        ts.append_value(h.ts.get());
        txid.append_value(&h.source_txid);
        commit.append_option(h.commit_us);
        replayed.append_value(h.replayed_us);
        latency.append_option(h.commit_us.map(|c| (h.replayed_us - c) as f64 / 1e3));
        rows.append_value(h.rows);
        for (table, n) in &h.tables {
            tables.keys().append_value(table);
            tables.values().append_value(*n);
        }
        tables.append(true)?;
    }
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("mirror_ts", Arc::new(ts.finish())),
        ("source_txid", Arc::new(txid.finish())),
        ("source_commit", Arc::new(commit.finish())),
        ("replayed", Arc::new(replayed.finish())),
        ("latency_ms", Arc::new(latency.finish())),
        ("rows", Arc::new(rows.finish())),
        ("tables", Arc::new(tables.finish())),
    ];
    RecordBatch::try_from_iter(columns)
}

/// The extension module `fovea._fovea`; the `fovea` package re-exports it.
#[pymodule]
#[pyo3(name = "_fovea")]
fn fovea_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_class::<Connection>()?;
    m.add_class::<Snapshot>()?;
    m.add("FoveaError", m.py().get_type::<FoveaError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
