//! Splits run by a worker somewhere else: what a scan worker (the Lambda
//! scan function, `functions/scan`) is asked, what it answers, and how a
//! caller hands it work ([`SplitWorker`]).
//!
//! ```text
//!  caller (fovea sql --scan lambda://F, the Python client)       worker (no engine, no catalog)
//!  SplitRequest { task, spill_prefix, inline_limit } ─ JSON ─▶ run_split(lake, request)
//!        ◀─ SplitAnswer { rows, ipc (inline) | objects (spilled) } ─┘
//!        ◀─ or a SplitFailure { kind, message } the caller acts on
//! ```
//!
//! An answer is one split's visible rows, whole: the caller takes it in one
//! piece after the invocation succeeded, so a retried invocation can never
//! put a split's rows into one answer twice. Rows that do not fit the
//! synchronous response (Lambda: 6 MB, base64 inflates by 4/3) are written
//! as Arrow IPC streams under the request's spill prefix, which is unique
//! per query *and attempt* (a late first attempt never mixes with its
//! retry), and always under [`SPILL_ROOT`], so a worker can write nowhere
//! else in the lake. The caller reads and deletes them.

use std::io::Cursor;
use std::sync::Arc;
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use futures::TryStreamExt;
use futures::future::BoxFuture;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::lake::Lake;
use crate::metered::{MeteredStore, StoreMeter};
use crate::split::SplitTask;

/// Where spilled answers live in a lake: `_fovea/scan-results/QUERY/…`.
pub const SPILL_ROOT: &str = "_fovea/scan-results";

/// Inline answers up to this many bytes of Arrow IPC (as base64 in JSON
/// about 5.6 MB: under Lambda's 6 MB synchronous response limit).
pub const DEFAULT_INLINE_LIMIT: usize = 4 << 20;

/// Lambda's limit on a synchronous response, bytes.
pub const LAMBDA_RESPONSE_LIMIT: usize = 6_000_000;

/// The most IPC bytes an answer carries inline whatever it is asked: as
/// base64 (4 bytes for 3) with room for the rest of the JSON answer, under
/// [`LAMBDA_RESPONSE_LIMIT`]; larger answers are spilled.
pub const MAX_INLINE_LIMIT: usize = (LAMBDA_RESPONSE_LIMIT - (64 << 10)) / 4 * 3;

/// Spilled answers are cut into IPC objects of about this size.
const SPILL_OBJECT_BYTES: usize = 64 << 20;

/// One split for a worker.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SplitRequest {
    /// The lake (`s3://BUCKET/PREFIX`). A worker configured for one lake
    /// refuses any other; one that is not reads the one named here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lake: Option<String>,
    /// The split.
    pub task: SplitTask,
    /// Where an answer too big to return inline goes: a path under
    /// [`SPILL_ROOT`], unique per query and attempt.
    pub spill_prefix: String,
    /// Inline answers up to this many IPC bytes ([`DEFAULT_INLINE_LIMIT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline_limit: Option<usize>,
}

/// A worker's answer: the split's visible rows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SplitAnswer {
    /// Visible rows returned.
    pub rows: usize,
    /// The rows as one Arrow IPC stream, base64, when inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc: Option<String>,
    /// Objects in the lake holding the rows as Arrow IPC streams, in
    /// order, when spilled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<String>,
    /// Bytes the worker read from the lake.
    pub bytes_read: u64,
    /// GET requests the worker made.
    pub gets: u64,
    /// Time spent on the split, in microseconds.
    pub micros: u64,
}

/// What a caller can do about a failed split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SplitFailureKind {
    /// The request is malformed or names another lake: retrying the same
    /// request fails again.
    BadRequest,
    /// An object the split names is gone (retired after the plan was made):
    /// plan again at a newer snapshot.
    ObjectMissing,
    /// The split's snapshot is no longer readable: plan again.
    SnapshotUnavailable,
    /// Storage failed or timed out: retrying may succeed.
    Unavailable,
    /// The function was not run: too many invocations at once (Lambda's
    /// 429). Retried with backoff until the invocation's deadline.
    Throttled,
    /// Anything else (a bug, corrupt data): the message says what.
    Failed,
}

impl SplitFailureKind {
    /// The name a worker reports (Lambda's `errorType`).
    pub fn as_str(self) -> &'static str {
        match self {
            SplitFailureKind::BadRequest => "BadRequest",
            SplitFailureKind::ObjectMissing => "ObjectMissing",
            SplitFailureKind::SnapshotUnavailable => "SnapshotUnavailable",
            SplitFailureKind::Unavailable => "Unavailable",
            SplitFailureKind::Throttled => "Throttled",
            SplitFailureKind::Failed => "Failed",
        }
    }

    /// The kind a worker reported as `name` (unknown names, such as a
    /// runtime's own `Runtime.ExitError`, are `Failed`).
    pub fn parse(name: &str) -> Self {
        match name {
            "BadRequest" => SplitFailureKind::BadRequest,
            "ObjectMissing" => SplitFailureKind::ObjectMissing,
            "SnapshotUnavailable" => SplitFailureKind::SnapshotUnavailable,
            "Unavailable" => SplitFailureKind::Unavailable,
            "Throttled" => SplitFailureKind::Throttled,
            _ => SplitFailureKind::Failed,
        }
    }

    /// Whether running the same request again may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, SplitFailureKind::Unavailable | SplitFailureKind::Throttled | SplitFailureKind::Failed)
    }
}

/// A split that failed, as a worker reports it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", kind.as_str())]
pub struct SplitFailure {
    /// What the caller can do.
    pub kind: SplitFailureKind,
    /// What happened.
    pub message: String,
}

impl SplitFailure {
    /// A failure of `kind`.
    pub fn new(kind: SplitFailureKind, message: impl Into<String>) -> Self {
        SplitFailure { kind, message: message.into() }
    }

    /// The failure `e` is for a caller.
    pub fn of(e: &Error) -> Self {
        let kind = match e {
            Error::ObjectStore(object_store::Error::NotFound { .. }) => SplitFailureKind::ObjectMissing,
            Error::ObjectStore(_) | Error::Io(_) | Error::Backend { .. } => SplitFailureKind::Unavailable,
            Error::SnapshotUnavailable { .. } | Error::BelowVisibilityBase { .. } => {
                SplitFailureKind::SnapshotUnavailable
            }
            Error::Corrupt { what, .. } if what.starts_with("split task") => SplitFailureKind::BadRequest,
            Error::Input { .. } => SplitFailureKind::BadRequest,
            _ => SplitFailureKind::Failed,
        };
        SplitFailure::new(kind, e.to_string())
    }
}

/// Runs `request`'s split on `lake` and returns its visible rows, inline
/// or spilled under the request's prefix.
pub fn run_split(lake: &Lake, request: &SplitRequest) -> Result<SplitAnswer, SplitFailure> {
    let started = Instant::now();
    let spill = spill_path(&request.spill_prefix)?;
    // The worker's reads are counted: callers report bytes read per row.
    let meter = Arc::new(StoreMeter::default());
    let metered = Lake::new(Arc::new(MeteredStore::new(Arc::clone(lake.store()), Arc::clone(&meter))));
    let scan = request.task.scan(metered).map_err(|e| SplitFailure::of(&e))?;
    let schema = scan.schema();
    let batches = scan.collect_batches().map_err(|e| SplitFailure::of(&e))?;
    let rows = batches.iter().map(RecordBatch::num_rows).sum();
    let limit = request.inline_limit.unwrap_or(DEFAULT_INLINE_LIMIT).min(MAX_INLINE_LIMIT);
    let streams = encode_ipc(&schema, &batches, SPILL_OBJECT_BYTES).map_err(|e| SplitFailure::of(&e))?;
    let mut answer = SplitAnswer { rows, ..SplitAnswer::default() };
    if let [one] = streams.as_slice()
        && one.len() <= limit
    {
        answer.ipc = Some(BASE64.encode(one));
    } else {
        for (n, stream) in streams.into_iter().enumerate() {
            let path = spill.clone().join(format!("{n:05}.arrow"));
            lake.put(&path, Bytes::from(stream)).map_err(|e| SplitFailure::of(&e))?;
            answer.objects.push(path.to_string());
        }
    }
    let counts = meter.counts();
    answer.bytes_read = counts.bytes_read;
    answer.gets = counts.gets;
    answer.micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    Ok(answer)
}

/// `prefix` as a path under [`SPILL_ROOT`] (anything else is refused).
fn spill_path(prefix: &str) -> Result<Path, SplitFailure> {
    let bad = || {
        SplitFailure::new(
            SplitFailureKind::BadRequest,
            format!("spill prefix {prefix:?}: answers are written under {SPILL_ROOT}/ only"),
        )
    };
    let path = Path::parse(prefix).map_err(|_| bad())?;
    let mut parts = path.parts();
    for expected in SPILL_ROOT.split('/') {
        match parts.next() {
            Some(p) if p.as_ref() == expected => {}
            _ => return Err(bad()),
        }
    }
    if parts.next().is_none() {
        return Err(bad());
    }
    Ok(path)
}

/// `batches` as Arrow IPC streams of about `target` bytes each (at least
/// one stream, which may hold no batch).
fn encode_ipc(schema: &SchemaRef, batches: &[RecordBatch], target: usize) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), schema)?;
    let mut in_stream = 0;
    for batch in batches {
        if in_stream > 0 && in_stream + batch.get_array_memory_size() > target {
            out.push(writer.into_inner()?);
            writer = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), schema)?;
            in_stream = 0;
        }
        writer.write(batch)?;
        in_stream += batch.get_array_memory_size();
    }
    writer.finish()?;
    out.push(writer.into_inner()?);
    Ok(out)
}

/// The batches of one Arrow IPC stream.
pub fn decode_ipc(bytes: &[u8]) -> Result<Vec<RecordBatch>> {
    let reader = arrow_ipc::reader::StreamReader::try_new(Cursor::new(bytes), None)?;
    Ok(reader.collect::<std::result::Result<Vec<_>, _>>()?)
}

impl SplitAnswer {
    /// The answer's rows: decoded inline, or read from `store` (the lake)
    /// and the spilled objects deleted.
    pub async fn fetch_batches(&self, store: &Arc<dyn ObjectStore>) -> Result<Vec<RecordBatch>> {
        let corrupt = |reason: String| Error::Corrupt { what: "a scan worker's answer".into(), reason };
        let mut out = Vec::new();
        if let Some(ipc) = &self.ipc {
            let bytes = BASE64.decode(ipc).map_err(|e| corrupt(e.to_string()))?;
            out.extend(decode_ipc(&bytes)?);
        }
        for object in &self.objects {
            let path = spill_path(object).map_err(|_| corrupt(format!("an object outside {SPILL_ROOT}: {object}")))?;
            let bytes = store.get(&path).await?.bytes().await?;
            out.extend(decode_ipc(&bytes)?);
            store.delete(&path).await?;
        }
        let rows: usize = out.iter().map(RecordBatch::num_rows).sum();
        if rows != self.rows {
            return Err(corrupt(format!("{rows} rows, {} announced", self.rows)));
        }
        Ok(out)
    }
}

/// Something that runs split tasks elsewhere (a Lambda function, a pool
/// of processes) on behalf of a query. `run` answers one task's visible
/// rows, whole, or an error that failed the query (after whatever retries
/// the worker makes): a task's rows are never returned in parts.
pub trait SplitWorker: Send + Sync + std::fmt::Debug {
    /// Runs task number `n` of query `query` (names its spill prefix).
    fn run(&self, query: &str, n: usize, task: SplitTask) -> BoxFuture<'static, Result<Vec<RecordBatch>>>;
    /// Invocations one query may have running at once.
    fn concurrency(&self) -> usize;
    /// Called once when query `query` ended (its spilled leftovers can go).
    fn finish(&self, query: &str) -> BoxFuture<'static, Result<()>>;
}

/// The spill prefix of attempt `attempt` of task `n` of query `query`.
pub fn spill_prefix(query: &str, n: usize, attempt: u32) -> String {
    format!("{SPILL_ROOT}/{query}/{n:06}-{attempt}")
}

/// Deletes everything spilled for query `query` in `store` (answers of
/// attempts that were given up, which nobody read).
pub async fn delete_spilled(store: &Arc<dyn ObjectStore>, query: &str) -> Result<()> {
    let prefix = Path::from(format!("{SPILL_ROOT}/{query}"));
    let objects: Vec<_> = store.list(Some(&prefix)).try_collect().await?;
    for meta in objects {
        store.delete(&meta.location).await?;
    }
    Ok(())
}

/// Split tasks run in this process the way a worker elsewhere runs them:
/// each task goes out as a [`SplitRequest`] through [`run_split`] (its
/// answer inline up to the inline limit, spilled to the lake beyond) and
/// comes back through [`SplitAnswer::fetch_batches`], as a Lambda answer
/// does. A plan for remote workers (`fovea_sql`'s remote scans) is then
/// testable without a Lambda runtime, and the [`conformance`] suite has a
/// reference implementation.
#[derive(Clone)]
pub struct LocalSplits {
    lake: Lake,
    concurrency: usize,
    inline_limit: Option<usize>,
}

impl std::fmt::Debug for LocalSplits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSplits")
            .field("concurrency", &self.concurrency)
            .field("inline_limit", &self.inline_limit)
            .finish_non_exhaustive()
    }
}

impl LocalSplits {
    /// Tasks on `lake`, `concurrency` at a time per query, answers inline
    /// up to `inline_limit` bytes (default [`DEFAULT_INLINE_LIMIT`]).
    pub fn new(lake: Lake, concurrency: usize, inline_limit: Option<usize>) -> Self {
        LocalSplits { lake, concurrency: concurrency.max(1), inline_limit }
    }
}

impl SplitWorker for LocalSplits {
    fn run(&self, query: &str, n: usize, task: SplitTask) -> BoxFuture<'static, Result<Vec<RecordBatch>>> {
        let request =
            SplitRequest { lake: None, task, spill_prefix: spill_prefix(query, n, 0), inline_limit: self.inline_limit };
        let lake = self.lake.clone();
        // The split's reads block on the IO runtime: on a blocking thread
        // of it, never on the caller's executor.
        let answered = crate::lake::spawn_io(async move {
            let store = Arc::clone(lake.store());
            let answer = tokio::task::spawn_blocking(move || run_split(&lake, &request))
                .await
                .map_err(|e| Error::invariant(format!("a split task failed: {e}")))?
                .map_err(|f| Error::Backend {
                    backend: "in-process split",
                    operation: format!("split {n}"),
                    key: String::new(),
                    message: f.to_string(),
                })?;
            answer.fetch_batches(&store).await
        });
        Box::pin(async move { answered.await? })
    }

    fn concurrency(&self) -> usize {
        self.concurrency
    }

    fn finish(&self, query: &str) -> BoxFuture<'static, Result<()>> {
        let store = Arc::clone(self.lake.store());
        let query = query.to_owned();
        let run = crate::lake::spawn_io(async move { delete_spilled(&store, &query).await });
        Box::pin(async move { run.await? })
    }
}

/// The conformance suite every [`SplitWorker`] passes (public so that the
/// Lambda scan worker in `fovea-aws` runs it against the function).
pub mod conformance {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::engine::Engine;
    use crate::replay::Op;
    use crate::scan::ScanOptions;
    use crate::schema::{Value, rows_from_batch};

    /// The suite's table, created by [`check`].
    pub const TABLE: &str = "conformance.splits";

    /// Runs the suite: `engine` writes a table to the lake `worker` reads
    /// (in memory, in write-buffer blocks, in combined files; updated and
    /// deleted rows, versions newer than the snapshot), then every split of
    /// full and projected scans at a snapshot runs on `worker`. Each task's
    /// rows must be exactly those the scan reads in process, whole; nothing
    /// spilled may remain after [`SplitWorker::finish`]. Panics naming what
    /// differs.
    pub fn check(engine: &Engine, worker: &dyn SplitWorker) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
        ]));
        let def = engine.create_table(TABLE, schema, vec![0]).expect("create the suite's table");
        let row = |k: i64, round: i64| {
            vec![
                Value::Int(k),
                Value::Utf8(format!("v{k}-{round}").repeat(1 + (k % 7) as usize)),
                Value::Int(k * round),
            ]
        };
        // Three rounds, each flushed (blocks) and the first combined (files);
        // updates and deletes across them.
        let mut live = std::collections::BTreeSet::new();
        for round in 0..3i64 {
            let mut ops: Vec<Op> = (round * 400..round * 400 + 400)
                .map(|k| {
                    live.insert(k);
                    Op::Insert { table: def.id, row: row(k, round) }
                })
                .collect();
            if round > 0 {
                // Updates and deletes of live rows of earlier rounds.
                let earlier: Vec<i64> = live.range(..round * 400).copied().collect();
                ops.extend(earlier.iter().step_by(9).map(|&k| Op::Update {
                    table: def.id,
                    key: vec![Value::Int(k)],
                    row: row(k, round),
                }));
                for &k in earlier.iter().skip(1).step_by(13) {
                    live.remove(&k);
                    ops.push(Op::Delete { table: def.id, key: vec![Value::Int(k)] });
                }
            }
            for chunk in ops.chunks(150) {
                engine.apply(chunk.to_vec()).expect("apply");
            }
            engine.flush().expect("flush");
            if round == 0 {
                engine.combine().expect("combine");
            }
        }
        let snapshot = engine.snapshot();
        // Versions after the snapshot: the tasks must not see them.
        let later: Vec<Op> =
            live.iter().take(50).map(|&k| Op::Delete { table: def.id, key: vec![Value::Int(k)] }).collect();
        engine.apply(later).expect("apply");
        engine.apply(vec![Op::Insert { table: def.id, row: row(100_000, 9) }]).expect("apply");

        for (what, options) in [
            ("a full scan", ScanOptions::default()),
            ("a projected scan", ScanOptions { projection: Some(vec![2, 0]), ..ScanOptions::default() }),
        ] {
            let scan = engine.scan(&snapshot, TABLE, options.clone()).expect("plan");
            let tasks = scan.tasks().expect("tasks");
            assert!(tasks.len() > 1, "{what}: the suite's table should give several splits, got {}", tasks.len());
            let mut want = rows(scan.collect_batches().expect("scan in process"));
            let query = format!("conformance-{}", what.replace(' ', "-"));
            let mut got = Vec::new();
            for (n, task) in tasks.into_iter().enumerate() {
                let in_process =
                    rows(task.scan(engine.lake().clone()).and_then(|s| s.collect_batches()).expect("task in process"));
                let remote = rows(
                    crate::lake::block_on_io(worker.run(&query, n, task))
                        .expect("io")
                        .unwrap_or_else(|e| panic!("{what}: split {n} failed on the worker: {e}")),
                );
                assert_eq!(
                    remote, in_process,
                    "{what}: split {n}'s rows on the worker differ from the same task in process"
                );
                got.extend(remote);
            }
            want.sort();
            got.sort();
            assert_eq!(got, want, "{what}: the splits' rows together differ from the scan's");
            crate::lake::block_on_io(worker.finish(&query)).expect("io").expect("finish");
            let spilled: Vec<_> = crate::lake::block_on_io({
                let store = Arc::clone(engine.lake().store());
                let prefix = Path::from(format!("{SPILL_ROOT}/{query}"));
                async move { store.list(Some(&prefix)).try_collect::<Vec<_>>().await }
            })
            .expect("io")
            .expect("list");
            assert!(spilled.is_empty(), "{what}: spilled answers left after finish: {spilled:?}");
        }
    }

    fn rows(batches: Vec<RecordBatch>) -> Vec<String> {
        batches.iter().flat_map(|b| rows_from_batch(b).expect("rows")).map(|r| format!("{r:?}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::{Engine, EngineConfig};

    #[test]
    fn in_process_splits_conform_inline_and_spilled() {
        // Answers inline, then every answer spilled (an inline limit of 64 bytes).
        for inline_limit in [None, Some(64)] {
            let engine = Engine::in_memory(EngineConfig::default().with_shards(2).with_blocks(100, 3)).unwrap();
            let worker = LocalSplits::new(engine.lake().clone(), 4, inline_limit);
            conformance::check(&engine, &worker);
        }
    }

    /// The suite catches what it promises to: a worker that loses a row of
    /// a split fails it.
    #[test]
    #[should_panic(expected = "differ from the same task in process")]
    fn a_worker_that_loses_a_row_fails_the_suite() {
        #[derive(Debug)]
        struct Lossy(LocalSplits);
        impl SplitWorker for Lossy {
            fn run(&self, query: &str, n: usize, task: SplitTask) -> BoxFuture<'static, Result<Vec<RecordBatch>>> {
                let run = self.0.run(query, n, task);
                Box::pin(async move {
                    let mut batches = run.await?;
                    if let Some(last) = batches.iter_mut().rev().find(|b| b.num_rows() > 0) {
                        *last = last.slice(0, last.num_rows() - 1);
                    }
                    Ok(batches)
                })
            }
            fn concurrency(&self) -> usize {
                1
            }
            fn finish(&self, query: &str) -> BoxFuture<'static, Result<()>> {
                self.0.finish(query)
            }
        }
        let engine = Engine::in_memory(EngineConfig::default().with_blocks(100, 3)).unwrap();
        conformance::check(&engine, &Lossy(LocalSplits::new(engine.lake().clone(), 1, None)));
    }

    use super::*;

    #[test]
    fn spill_prefixes_stay_under_the_root() {
        assert!(spill_path("_fovea/scan-results/q1/000001-0").is_ok());
        for bad in ["", "_fovea/scan-results", "_fovea/other/x", "tables/1/x", "_fovea/scan-results/../x"] {
            let e = spill_path(bad).unwrap_err();
            assert_eq!(e.kind, SplitFailureKind::BadRequest, "{bad}");
        }
    }

    #[test]
    fn failure_kinds_round_trip_by_name() {
        for kind in [
            SplitFailureKind::BadRequest,
            SplitFailureKind::ObjectMissing,
            SplitFailureKind::SnapshotUnavailable,
            SplitFailureKind::Unavailable,
            SplitFailureKind::Failed,
        ] {
            assert_eq!(SplitFailureKind::parse(kind.as_str()), kind);
        }
        assert_eq!(SplitFailureKind::parse("Runtime.ExitError"), SplitFailureKind::Failed);
    }
}
