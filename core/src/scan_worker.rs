//! Splits run by a worker somewhere else: what a scan worker (the Lambda
//! scan function, `functions/scan`) is asked, what it answers, and how a
//! caller hands it work ([`SplitWorker`]).
//!
//! ```text
//!  caller (fovea sql --scan lambda://F, the Python client)       worker (no engine, no catalog)
//!  group_tasks(tasks, worker.group_size())
//!  SplitRequest { tasks, spill_prefix, inline_limit } ─ JSON ─▶ run_split(lake, request)
//!        ◀─ SplitAnswer { rows, ipc (inline) | objects (spilled) } ─┘
//!        ◀─ or a SplitFailure { kind, message } the caller acts on
//! ```
//!
//! A request carries a group of splits, consecutive in the plan, to read
//! together ([`group_tasks`]): an invocation pays a request's price and
//! start-up, so a scan is spread over about as many groups as the caller
//! runs at once, each reading at least 8 MB and at most 64 (by default,
//! [`SplitWorker::group_size`]) — a 10M-row table of 160 MB is 16
//! invocations of 10 MB, not 1,234 of one row group each. An answer
//! is the group's visible rows in task order, whole: the caller takes it in one
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

/// Estimated bytes to read per request at most unless a worker says
/// otherwise ([`SplitWorker::group_size`]): what the scan function (2 GB
/// of memory) decodes in one invocation (it holds one batch and one IPC
/// stream of its answer at a time, see [`run_split`]).
pub const DEFAULT_GROUP_BYTES: u64 = 64 << 20;

/// A scan is not spread over more invocations than leave each this many
/// estimated bytes to read: below it, an invocation's own cost (request,
/// start-up, footers) outweighs the reading.
pub const DEFAULT_MIN_GROUP_BYTES: u64 = 8 << 20;

/// How a caller sizes its groups of tasks ([`group_tasks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupSize {
    /// Estimated bytes of a group at most (a task alone may pass it).
    pub max: u64,
    /// Estimated bytes below which a scan is not spread further.
    pub min: u64,
    /// Invocations the caller runs at once: a scan is spread over about
    /// this many groups while each still reads `min`.
    pub parallel: usize,
}

impl GroupSize {
    /// At most `max` bytes per group, the default least, `parallel` at once.
    pub fn new(max: u64, parallel: usize) -> Self {
        GroupSize { max, min: DEFAULT_MIN_GROUP_BYTES.min(max), parallel: parallel.max(1) }
    }
}

/// A request's JSON stays under this many bytes (Lambda takes 6 MB in a
/// synchronous invocation; inline rows and deleted bitmaps travel in it).
pub const MAX_REQUEST_BYTES: usize = 5 << 20;

/// Splits for one worker invocation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SplitRequest {
    /// The lake (`s3://BUCKET/PREFIX`). A worker configured for one lake
    /// refuses any other; one that is not reads the one named here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lake: Option<String>,
    /// The splits, all of one scan (one table, projection and snapshot),
    /// answered in this order. A request of one split may name it `task`
    /// (as requests did before groups).
    #[serde(alias = "task", deserialize_with = "one_or_more")]
    pub tasks: Vec<SplitTask>,
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

/// A split task, or a list of them.
fn one_or_more<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<SplitTask>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMore {
        More(Vec<SplitTask>),
        One(Box<SplitTask>),
    }
    Ok(match OneOrMore::deserialize(d)? {
        OneOrMore::More(tasks) => tasks,
        OneOrMore::One(task) => vec![*task],
    })
}

/// `tasks` (of one scan, in plan order) in groups for one request each:
/// consecutive tasks while their estimated bytes ([`SplitTask::bytes`])
/// stay within a target and their JSON within [`MAX_REQUEST_BYTES`]; a
/// task alone over either is a group of its own. The target spreads the
/// scan over at most `size.parallel` groups (its bytes over `parallel`,
/// plus its largest task: a group closes only when the next task would
/// pass the target), within `size.min..=size.max`. Concatenated, the
/// groups are `tasks`.
pub fn group_tasks(tasks: Vec<SplitTask>, size: GroupSize) -> Vec<Vec<SplitTask>> {
    let total: u64 = tasks.iter().map(|t| t.bytes).sum();
    let largest = tasks.iter().map(|t| t.bytes).max().unwrap_or(0);
    let spread = total.div_ceil(size.parallel.max(1) as u64).saturating_add(largest);
    let group_bytes = spread.clamp(size.min.min(size.max), size.max);
    let mut groups: Vec<Vec<SplitTask>> = Vec::new();
    let (mut bytes, mut json) = (0u64, 0usize);
    for task in tasks {
        // Tasks serialise: they came from a plan.
        let task_json = serde_json::to_vec(&task).map_or(MAX_REQUEST_BYTES, |v| v.len());
        match groups.last_mut() {
            Some(group) if bytes + task.bytes <= group_bytes && json + task_json <= MAX_REQUEST_BYTES => {
                bytes += task.bytes;
                json += task_json;
                group.push(task);
            }
            _ => {
                (bytes, json) = (task.bytes, task_json);
                groups.push(vec![task]);
            }
        }
    }
    groups
}

/// Runs `request`'s splits on `lake`, in order, and returns their visible
/// rows, inline or spilled under the request's prefix. Once the rows
/// answered reach the tasks' limit (the rows the whole query needs at
/// most), the splits left are not read.
pub fn run_split(lake: &Lake, request: &SplitRequest) -> Result<SplitAnswer, SplitFailure> {
    run_split_in_objects(lake, request, SPILL_OBJECT_BYTES)
}

/// [`run_split`] with spilled answers cut into IPC streams of about
/// `object_bytes`. Rows are encoded as the scan yields them and each full
/// stream is spilled at once: a worker holds one batch and one stream of
/// the answer, not the whole group's rows and their encoding.
fn run_split_in_objects(lake: &Lake, request: &SplitRequest, object_bytes: usize) -> Result<SplitAnswer, SplitFailure> {
    let started = Instant::now();
    let spill = spill_path(&request.spill_prefix)?;
    let bad = |message: String| SplitFailure::new(SplitFailureKind::BadRequest, message);
    let first = request.tasks.first().ok_or_else(|| bad("a request without a split task".into()))?;
    // The worker's reads are counted: callers report bytes read per row.
    let meter = Arc::new(StoreMeter::default());
    let metered = Lake::new(Arc::new(MeteredStore::new(Arc::clone(lake.store()), Arc::clone(&meter))));
    let failed = |e: Error| SplitFailure::of(&e);
    let mut out: Option<AnswerWriter> = None;
    let mut rows = 0;
    for (n, task) in request.tasks.iter().enumerate() {
        if (task.table_id, task.qts, &task.projection) != (first.table_id, first.qts, &first.projection) {
            return Err(bad(format!(
                "task {n} of the request reads table {} at ts {} (columns {:?}), task 0 table {} at ts {} (columns {:?}): a request's tasks are of one scan",
                task.table.name, task.qts, task.projection, first.table.name, first.qts, first.projection
            )));
        }
        if task.limit.is_some_and(|limit| rows >= limit) {
            break;
        }
        let mut scan = task.scan(metered.clone()).map_err(failed)?;
        let writer = match &mut out {
            Some(w) => w,
            None => out.insert(AnswerWriter::new(lake, spill.clone(), scan.schema(), object_bytes).map_err(failed)?),
        };
        while let Some(batch) = scan.next_batch().map_err(failed)? {
            if batch.schema().fields() != writer.schema.fields() {
                return Err(bad(format!(
                    "task {n} of the request gave columns {:?}, task 0 {:?}",
                    batch.schema().fields(),
                    writer.schema.fields()
                )));
            }
            rows += batch.num_rows();
            writer.write(&batch).map_err(failed)?;
        }
    }
    let out = match out {
        Some(w) => w,
        // (A limit of 0: nothing read.)
        None => AnswerWriter::new(lake, spill, first.scan(metered).map_err(failed)?.schema(), object_bytes)
            .map_err(failed)?,
    };
    let limit = request.inline_limit.unwrap_or(DEFAULT_INLINE_LIMIT).min(MAX_INLINE_LIMIT);
    let (ipc, objects) = out.finish(limit).map_err(failed)?;
    let counts = meter.counts();
    Ok(SplitAnswer {
        rows,
        ipc: ipc.map(|bytes| BASE64.encode(bytes)),
        objects,
        bytes_read: counts.bytes_read,
        gets: counts.gets,
        micros: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
    })
}

/// An answer's rows encoded as they come: Arrow IPC streams of about
/// `object_bytes` (whole batches; a stream holds at least one), each full
/// one written to the lake under the spill prefix at once; the last one
/// goes inline when it is the only one and small enough.
struct AnswerWriter<'a> {
    lake: &'a Lake,
    spill: Path,
    schema: SchemaRef,
    object_bytes: usize,
    stream: arrow_ipc::writer::StreamWriter<Vec<u8>>,
    /// Bytes of the batches in `stream`.
    in_stream: usize,
    /// Spilled so far, in order.
    objects: Vec<String>,
}

impl<'a> AnswerWriter<'a> {
    fn new(lake: &'a Lake, spill: Path, schema: SchemaRef, object_bytes: usize) -> Result<Self> {
        let stream = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &schema)?;
        Ok(AnswerWriter { lake, spill, schema, object_bytes, stream, in_stream: 0, objects: Vec::new() })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let size = batch.get_array_memory_size();
        if self.in_stream > 0 && self.in_stream + size > self.object_bytes {
            let full = self.next_stream()?;
            self.spill_object(full)?;
        }
        self.stream.write(batch)?;
        self.in_stream += size;
        Ok(())
    }

    /// The stream so far, finished, and a new one begun.
    fn next_stream(&mut self) -> Result<Vec<u8>> {
        let fresh = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &self.schema)?;
        self.in_stream = 0;
        // `into_inner` finishes the stream (its end-of-stream marker).
        Ok(std::mem::replace(&mut self.stream, fresh).into_inner()?)
    }

    fn spill_object(&mut self, bytes: Vec<u8>) -> Result<()> {
        let path = self.spill.clone().join(format!("{:05}.arrow", self.objects.len()));
        self.lake.put(&path, Bytes::from(bytes))?;
        self.objects.push(path.to_string());
        Ok(())
    }

    /// The inline stream (only one, within `inline_limit`), or the spilled
    /// objects in order.
    fn finish(mut self, inline_limit: usize) -> Result<(Option<Vec<u8>>, Vec<String>)> {
        let last = self.next_stream()?;
        if self.objects.is_empty() && last.len() <= inline_limit {
            return Ok((Some(last), Vec::new()));
        }
        self.spill_object(last)?;
        Ok((None, self.objects))
    }
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
/// of processes) on behalf of a query. `run` answers a group of tasks'
/// visible rows (in task order), whole, or an error that failed the
/// query (after whatever retries the worker makes): a group's rows are
/// never returned in parts.
pub trait SplitWorker: Send + Sync + std::fmt::Debug {
    /// Runs group number `n` of query `query` (names its spill prefix):
    /// tasks of one scan, in plan order, as one invocation.
    fn run(&self, query: &str, n: usize, tasks: Vec<SplitTask>) -> BoxFuture<'static, Result<Vec<RecordBatch>>>;
    /// Invocations one query may have running at once.
    fn concurrency(&self) -> usize;
    /// How callers group tasks into invocations ([`group_tasks`]): by
    /// default at most [`DEFAULT_GROUP_BYTES`] each, spread over
    /// [`SplitWorker::concurrency`] invocations.
    fn group_size(&self) -> GroupSize {
        GroupSize::new(DEFAULT_GROUP_BYTES, self.concurrency())
    }
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
    group_bytes: u64,
}

impl std::fmt::Debug for LocalSplits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSplits")
            .field("concurrency", &self.concurrency)
            .field("inline_limit", &self.inline_limit)
            .field("group_bytes", &self.group_bytes)
            .finish_non_exhaustive()
    }
}

impl LocalSplits {
    /// Tasks on `lake`, `concurrency` at a time per query, answers inline
    /// up to `inline_limit` bytes (default [`DEFAULT_INLINE_LIMIT`]).
    pub fn new(lake: Lake, concurrency: usize, inline_limit: Option<usize>) -> Self {
        LocalSplits { lake, concurrency: concurrency.max(1), inline_limit, group_bytes: DEFAULT_GROUP_BYTES }
    }

    /// Groups of at most `bytes` per invocation instead of [`DEFAULT_GROUP_BYTES`].
    pub fn with_group_bytes(mut self, bytes: u64) -> Self {
        self.group_bytes = bytes;
        self
    }
}

impl SplitWorker for LocalSplits {
    fn run(&self, query: &str, n: usize, tasks: Vec<SplitTask>) -> BoxFuture<'static, Result<Vec<RecordBatch>>> {
        let request = SplitRequest {
            lake: None,
            tasks,
            spill_prefix: spill_prefix(query, n, 0),
            inline_limit: self.inline_limit,
        };
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

    fn group_size(&self) -> GroupSize {
        GroupSize::new(self.group_bytes, self.concurrency)
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
    /// full and projected scans at a snapshot runs on `worker`, in groups
    /// of one, two and three tasks and as [`group_tasks`] groups them for
    /// `worker`. Each group's rows must be exactly those its tasks read in
    /// process, in order, whole; nothing spilled may remain after
    /// [`SplitWorker::finish`]. Panics naming what differs.
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
            want.sort();
            let query = format!("conformance-{}", what.replace(' ', "-"));
            // Groups of 1, 2, 3, 1, 2, 3, … tasks; then the worker's own.
            let mut cyclic: Vec<Vec<SplitTask>> = Vec::new();
            let mut rest = tasks.clone().into_iter();
            for size in [1, 2, 3].into_iter().cycle() {
                let group: Vec<SplitTask> = rest.by_ref().take(size).collect();
                if group.is_empty() {
                    break;
                }
                cyclic.push(group);
            }
            let own = group_tasks(tasks.clone(), worker.group_size());
            assert_eq!(own.concat(), tasks, "{what}: group_tasks lost or reordered tasks");
            let mut n = 0;
            for (grouping, groups) in [("groups of 1-3 tasks", cyclic), ("the worker's groups", own)] {
                let mut got = Vec::new();
                for group in groups {
                    let in_process: Vec<String> = group
                        .iter()
                        .flat_map(|task| {
                            rows(
                                task.scan(engine.lake().clone()).and_then(|s| s.collect_batches()).expect("in process"),
                            )
                        })
                        .collect();
                    let tasks = group.len();
                    let remote = rows(
                        crate::lake::block_on_io(worker.run(&query, n, group))
                            .expect("io")
                            .unwrap_or_else(|e| panic!("{what}, {grouping}: group {n} failed on the worker: {e}")),
                    );
                    assert_eq!(
                        remote, in_process,
                        "{what}, {grouping}: group {n}'s rows ({tasks} tasks) on the worker differ from the same tasks in process"
                    );
                    got.extend(remote);
                    n += 1;
                }
                got.sort();
                assert_eq!(got, want, "{what}, {grouping}: the groups' rows together differ from the scan's");
            }
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

    /// Groups follow the estimated bytes: a group passes the bound only as
    /// a task alone, and no two neighbouring groups fit in one; a full
    /// scan's estimate is about the table's bytes in the lake, a projected
    /// one's less. A request of one `task` (the form before groups) still
    /// reads.
    #[test]
    fn tasks_group_by_their_estimated_bytes() {
        let engine = Engine::in_memory(EngineConfig::default().with_shards(2).with_blocks(100, 3)).unwrap();
        conformance::check(&engine, &LocalSplits::new(engine.lake().clone(), 2, None).with_group_bytes(1));
        let snapshot = engine.snapshot();
        let plan = |projection: Option<Vec<usize>>| {
            let options = crate::scan::ScanOptions { projection, ..Default::default() };
            engine.scan(&snapshot, conformance::TABLE, options).unwrap().tasks().unwrap()
        };
        let tasks = plan(None);
        let total: u64 = tasks.iter().map(|t| t.bytes).sum();
        assert!(tasks.iter().all(|t| t.bytes > 0), "{:?}", tasks.iter().map(|t| t.bytes).collect::<Vec<_>>());
        let stored: u64 = crate::lake::block_on_io({
            let store = Arc::clone(engine.lake().store());
            async move { store.list(Some(&Path::from("tables"))).try_collect::<Vec<_>>().await }
        })
        .unwrap()
        .unwrap()
        .iter()
        .map(|m| m.size)
        .sum();
        assert!(total > stored / 4 && total < stored * 4, "estimated {total} bytes, the lake holds {stored}");
        let projected: u64 = plan(Some(vec![0])).iter().map(|t| t.bytes).sum();
        assert!(projected < total, "one column of three: {projected} of {total}");
        let one_at_a_time = |max| GroupSize { max, min: 1, parallel: 1 };
        for bound in [1, total / 7, total / 2, total, u64::MAX] {
            let groups = group_tasks(tasks.clone(), one_at_a_time(bound));
            assert_eq!(groups.concat(), tasks, "bound {bound}");
            let bytes = |g: &[SplitTask]| g.iter().map(|t| t.bytes).sum::<u64>();
            for (i, g) in groups.iter().enumerate() {
                assert!(g.len() == 1 || bytes(g) <= bound, "bound {bound}: group {i} holds {} bytes", bytes(g));
                if let Some(next) = groups.get(i + 1) {
                    assert!(bytes(g) + next[0].bytes > bound, "bound {bound}: groups {i} and {} fit in one", i + 1);
                }
            }
            let expected = if bound >= total { 1 } else { groups.len() };
            assert_eq!(groups.len(), expected, "bound {bound}");
        }
        // Spread over `parallel` groups at most, as even as the tasks allow,
        // unless that leaves a group under `min`.
        let largest = tasks.iter().map(|t| t.bytes).max().unwrap();
        for parallel in [2, 3, 5] {
            let groups = group_tasks(tasks.clone(), GroupSize { max: u64::MAX, min: 1, parallel });
            assert_eq!(groups.concat(), tasks);
            assert!(
                groups.len() <= parallel && groups.len() >= parallel.min(tasks.len()) / 2,
                "{parallel}: {}",
                groups.len()
            );
            let target = total.div_ceil(parallel as u64) + largest;
            assert!(groups.iter().all(|g| g.iter().map(|t| t.bytes).sum::<u64>() <= target));
        }
        // A group closes only past `min` less the next task's bytes.
        let min = total / 2;
        let groups = group_tasks(tasks.clone(), GroupSize { max: u64::MAX, min, parallel: 16 });
        assert!(groups.len() as u64 <= total / (min - largest) + 1, "{} groups", groups.len());
        assert_eq!(GroupSize::new(1 << 20, 0), GroupSize { max: 1 << 20, min: 1 << 20, parallel: 1 });
        // A group under a limit stops reading once it has that many rows.
        let limited = engine.scan(&snapshot, conformance::TABLE, Default::default()).unwrap().with_limit(Some(5));
        let request =
            |tasks| SplitRequest { lake: None, tasks, spill_prefix: spill_prefix("q", 1, 0), inline_limit: None };
        let all = run_split(engine.lake(), &request(limited.tasks().unwrap())).unwrap();
        let first = run_split(engine.lake(), &request(limited.tasks().unwrap()[..1].to_vec())).unwrap();
        assert!(all.rows >= 5 && all.rows == first.rows && all.gets == first.gets, "{all:?} vs {first:?}");
        // Requests stay under MAX_REQUEST_BYTES of JSON whatever the bound.
        let mut big = tasks[0].clone();
        big.data = crate::split::SplitData::Rows { ipc: "A".repeat(MAX_REQUEST_BYTES / 3) };
        let groups = group_tasks(vec![big.clone(), big.clone(), big.clone(), big], one_at_a_time(u64::MAX));
        assert_eq!(groups.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2]);
        // The request of one split, as sent before groups.
        let mut old = serde_json::to_value(SplitRequest {
            lake: None,
            tasks: vec![tasks[0].clone()],
            spill_prefix: spill_prefix("q", 0, 0),
            inline_limit: None,
        })
        .unwrap();
        let task = old["tasks"][0].take();
        old.as_object_mut().unwrap().remove("tasks");
        old["task"] = task;
        let request: SplitRequest = serde_json::from_value(old).unwrap();
        assert_eq!(request.tasks, vec![tasks[0].clone()]);
        let answer = run_split(engine.lake(), &request).unwrap();
        assert_eq!(
            answer.rows,
            tasks[0]
                .scan(engine.lake().clone())
                .unwrap()
                .collect_batches()
                .unwrap()
                .iter()
                .map(RecordBatch::num_rows)
                .sum::<usize>()
        );
    }

    /// A group's answer is encoded as its rows come and spilled in objects
    /// of about the size asked (whole batches, at least one each), in
    /// order: the same rows as the answer inline, none lost or repeated.
    #[test]
    fn answers_are_spilled_in_objects_as_their_rows_come() {
        let engine = Engine::in_memory(EngineConfig::default().with_shards(2).with_blocks(100, 3)).unwrap();
        conformance::check(&engine, &LocalSplits::new(engine.lake().clone(), 1, None));
        let tasks = engine.scan(&engine.snapshot(), conformance::TABLE, Default::default()).unwrap().tasks().unwrap();
        let request = |inline_limit| SplitRequest {
            lake: None,
            tasks: tasks.clone(),
            spill_prefix: spill_prefix("streamed", 0, 0),
            inline_limit,
        };
        let store = Arc::clone(engine.lake().store());
        let fetch = |answer: &SplitAnswer| {
            let (answer, store) = (answer.clone(), Arc::clone(&store));
            crate::lake::block_on_io(async move { answer.fetch_batches(&store).await }).unwrap().unwrap()
        };
        let inline = run_split(engine.lake(), &request(None)).unwrap();
        assert!(inline.ipc.is_some() && inline.objects.is_empty(), "{inline:?}");
        let want = fetch(&inline);
        // The batches as the worker holds them (decoded IPC shares one
        // buffer per message, which each array's size counts whole).
        let scanned: Vec<RecordBatch> =
            tasks.iter().flat_map(|t| t.scan(engine.lake().clone()).unwrap().collect_batches().unwrap()).collect();
        assert_eq!(scanned.len(), want.len());
        let batch_bytes: Vec<usize> = scanned.iter().map(RecordBatch::get_array_memory_size).collect();
        assert!(want.len() >= 4, "{} batches", want.len());
        // Objects of about two batches each.
        let object_bytes = batch_bytes.iter().max().unwrap() * 2;
        let spilled = run_split_in_objects(engine.lake(), &request(None), object_bytes).unwrap();
        assert!(spilled.ipc.is_none() && spilled.objects.len() >= 2, "{spilled:?}");
        // Each object holds the next batches of the answer, as large in
        // memory (as the worker held them) as asked at most.
        let mut at = 0;
        let mut sizes = Vec::new();
        for o in &spilled.objects {
            let batches = decode_ipc(&engine.lake().get(&Path::from(o.as_str())).unwrap()).unwrap();
            assert!(!batches.is_empty(), "{o} holds no batch");
            sizes.push(batch_bytes[at..at + batches.len()].iter().sum::<usize>());
            at += batches.len();
        }
        assert_eq!(at, want.len());
        assert!(sizes.iter().all(|&n| n <= object_bytes), "objects of {sizes:?} bytes over {object_bytes}");
        assert_eq!(spilled.rows, inline.rows);
        assert_eq!(fetch(&spilled), want, "the spilled answer differs from the inline one");
        // One object too large for inline: spilled whole.
        let one = run_split_in_objects(engine.lake(), &request(Some(16)), usize::MAX).unwrap();
        assert_eq!((one.ipc.is_none(), one.objects.len()), (true, 1), "{one:?}");
        assert_eq!(fetch(&one), want);
    }

    /// The suite catches what it promises to: a worker that loses a row of
    /// a split fails it.
    #[test]
    #[should_panic(expected = "differ from the same tasks in process")]
    fn a_worker_that_loses_a_row_fails_the_suite() {
        #[derive(Debug)]
        struct Lossy(LocalSplits);
        impl SplitWorker for Lossy {
            fn run(
                &self,
                query: &str,
                n: usize,
                tasks: Vec<SplitTask>,
            ) -> BoxFuture<'static, Result<Vec<RecordBatch>>> {
                let run = self.0.run(query, n, tasks);
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
