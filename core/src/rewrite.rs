//! File rewrites any worker can run: the heavy half of combine and of
//! storage GC, split from the swap that only the replayer can make.
//!
//! ```text
//!  replayer (engine: index, visibility, catalog)           worker (no engine: in process, or a Lambda function)
//!  RewriteRequest { job, output, row_group_rows } ─ JSON ─▶ run_rewrite(lake, request)
//!    Combine  { blocks }                 a virtual file's flushed blocks, in order ─▶ one file, one row group per block
//!    DropRows { source, rows, dropped }  a regular file without the rows set in `dropped`
//!        ◀─ RewriteAnswer { rows, row_groups, footer } ─┘   (or a SplitFailure the caller acts on)
//!  swap under the file's locks (combine: same id and offsets; GC: index moved, deletes carried over)
//! ```
//!
//! A rewrite only ever writes its `output` object, which nothing names
//! until the replayer's swap: a worker that fails or dies at any point
//! leaves at most an unnamed object, which the caller deletes (or the next
//! recovery's vacuum does). Rewriting the same request again writes the
//! same bytes (the Parquet encoding of the same rows is deterministic), so a
//! retry is safe, and so is a timed-out attempt that writes the same path
//! after its retry succeeded. The worker is told which rows to drop:
//! visibility lives in the replayer alone, and deletes that arrive while
//! the worker runs are carried over to the new file at the swap (the dual
//! delete), so the worker never needs to hear of them.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow::array::BooleanArray;
use arrow::record_batch::RecordBatch;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use object_store::path::Path;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ids::{FileId, TableId, Ts};
use crate::lake::{Lake, RegularFile, RegularFileWriter, RowGroupInfo};
use crate::metered::{MeteredStore, StoreMeter};
use crate::scan_worker::{SplitFailure, SplitFailureKind};

/// What to rewrite.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum RewriteJob {
    /// Combine: the flushed blocks of a virtual file, in order, into one
    /// file with one row group per block (same rows, same order).
    Combine {
        /// Block objects, in block order.
        blocks: Vec<String>,
    },
    /// Storage GC: a regular file without some of its rows (the rest keep
    /// their order and create_ts), in row groups of `row_group_rows`.
    DropRows {
        /// The file.
        source: String,
        /// Its rows.
        rows: usize,
        /// The rows to leave out: a bitmap of `rows` bits (bit `i` of
        /// little-endian `u64` word `i / 64`), base64. See [`encode_rows`].
        dropped: String,
    },
}

/// One rewrite for a worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RewriteRequest {
    /// The lake (`s3://BUCKET/PREFIX`); a worker pinned to another refuses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lake: Option<String>,
    /// What to rewrite.
    pub job: RewriteJob,
    /// The object to write: a regular file's path (`tables/T/files/…`),
    /// named by nothing until the caller's swap.
    pub output: String,
    /// Rows per row group of a storage-GC output.
    pub row_group_rows: usize,
}

impl RewriteRequest {
    /// Which function runs this job: `combine` or `gc`.
    pub fn function(&self) -> &'static str {
        match self.job {
            RewriteJob::Combine { .. } => "combine",
            RewriteJob::DropRows { .. } => "gc",
        }
    }
}

/// One row group of a written file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrittenGroup {
    /// Rows.
    pub rows: usize,
    /// Smallest create_ts.
    pub min_ts: u64,
    /// Largest create_ts.
    pub max_ts: u64,
}

/// A worker's answer: the file it wrote.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RewriteAnswer {
    /// Rows written.
    pub rows: usize,
    /// Its row groups, in order.
    pub row_groups: Vec<WrittenGroup>,
    /// Byte range of its footer (length field and magic included); its
    /// end is the object's size.
    pub footer: (u64, u64),
    /// Bytes the worker read from the lake.
    pub bytes_read: u64,
    /// Time spent, in microseconds.
    pub micros: u64,
    /// The written file's parsed footer, when the rewrite ran in this
    /// process: readers then need no request for it (never sent).
    #[serde(skip)]
    pub footer_metadata: Option<parquet::arrow::arrow_reader::ArrowReaderMetadata>,
}

impl RewriteAnswer {
    /// The written file at `path`, as the engine holds it (its footer is
    /// read on first use, with one request for exactly its bytes).
    pub fn file(&self, path: Path) -> RegularFile {
        let mut offset = 0;
        let groups = self
            .row_groups
            .iter()
            .map(|g| {
                let info = RowGroupInfo { offset, rows: g.rows, min_ts: Ts(g.min_ts), max_ts: Ts(g.max_ts) };
                offset += g.rows;
                info
            })
            .collect();
        let file = RegularFile::new(path, groups, Some(self.footer.0..self.footer.1));
        match &self.footer_metadata {
            Some(m) => file.with_metadata(m.clone()),
            None => file,
        }
    }

    /// Size of the written object.
    pub fn bytes(&self) -> u64 {
        self.footer.1
    }
}

/// `rows` as a [`RewriteJob::DropRows`] bitmap of `len` bits (every row
/// must be below `len`).
pub fn encode_rows(rows: &[u32], len: usize) -> Result<String> {
    let mut words = vec![0u64; len.div_ceil(64)];
    for &r in rows {
        let r = r as usize;
        if r >= len {
            return Err(Error::invariant(format!("row {r} beyond the {len} rows of its file")));
        }
        words[r / 64] |= 1 << (r % 64);
    }
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    Ok(BASE64.encode(bytes))
}

/// The keep mask of `len` rows a [`encode_rows`] bitmap leaves (`true`:
/// kept).
pub fn decode_keep(bitmap: &str, len: usize) -> std::result::Result<BooleanArray, String> {
    let bytes = BASE64.decode(bitmap).map_err(|e| format!("the dropped-rows bitmap is not base64: {e}"))?;
    if bytes.len() != len.div_ceil(64) * 8 {
        return Err(format!(
            "the dropped-rows bitmap has {} bytes, {len} rows need {}",
            bytes.len(),
            len.div_ceil(64) * 8
        ));
    }
    Ok((0..len).map(|i| Some(bytes[i / 8] & (1 << (i % 8)) == 0)).collect())
}

/// `path` as a regular file's path (`tables/T/files/NAME.parquet`).
fn data_file_path(what: &str, path: &str) -> std::result::Result<Path, SplitFailure> {
    let parsed = Path::parse(path).ok();
    let parts: Vec<String> =
        parsed.as_ref().map(|p| p.parts().map(|s| s.as_ref().to_owned()).collect()).unwrap_or_default();
    match parts.as_slice() {
        [tables, _, files, name] if tables == "tables" && files == "files" && name.ends_with(".parquet") => {
            Ok(parsed.unwrap_or_default())
        }
        _ => Err(SplitFailure::new(
            SplitFailureKind::BadRequest,
            format!("{what} {path:?}: rewrites write regular files only (tables/T/files/NAME.parquet)"),
        )),
    }
}

/// Where a rewrite can be made to die (tests of what a killed function
/// leaves: `FOVEA_KILL_AT` in the combine and GC functions, built with the
/// `faults` feature only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "faults"), allow(dead_code))]
pub enum KillPhase {
    /// After reading, before writing anything.
    BeforeWrite,
    /// Half of the output object written (as an upload cut off would).
    MidWrite,
    /// The output written whole, before answering.
    AfterWrite,
}

#[cfg(feature = "faults")]
impl KillPhase {
    /// Parses `before_write`, `mid_write` or `after_write`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "before_write" => Ok(KillPhase::BeforeWrite),
            "mid_write" => Ok(KillPhase::MidWrite),
            "after_write" => Ok(KillPhase::AfterWrite),
            other => Err(Error::Source {
                input: "FOVEA_KILL_AT".into(),
                message: format!("{other:?}: expected before_write, mid_write or after_write"),
            }),
        }
    }
}

/// Runs `request` on `lake`: reads what it names, writes its output.
pub fn run_rewrite(lake: &Lake, request: &RewriteRequest) -> std::result::Result<RewriteAnswer, SplitFailure> {
    rewrite(lake, request, None)
}

/// [`run_rewrite`], aborting the process at `kill` (see [`KillPhase`]).
#[cfg(feature = "faults")]
pub fn run_rewrite_killed_at(
    lake: &Lake,
    request: &RewriteRequest,
    kill: Option<KillPhase>,
) -> std::result::Result<RewriteAnswer, SplitFailure> {
    rewrite(lake, request, kill)
}

fn rewrite(
    lake: &Lake,
    request: &RewriteRequest,
    kill: Option<KillPhase>,
) -> std::result::Result<RewriteAnswer, SplitFailure> {
    let started = Instant::now();
    let output = data_file_path("output", &request.output)?;
    if request.row_group_rows == 0 {
        return Err(SplitFailure::new(SplitFailureKind::BadRequest, "row_group_rows must be at least 1"));
    }
    let meter = Arc::new(StoreMeter::default());
    let metered = Lake::new(Arc::new(MeteredStore::new(Arc::clone(lake.store()), Arc::clone(&meter))));
    let fail = |e: Error| SplitFailure::of(&e);
    // Each group is encoded as it is read: one decoded block in memory.
    let mut file = RegularFileWriter::new(request.row_group_rows);
    for_each_group(&metered, request, &output, &mut |group| file.push(&group).map_err(fail))?;
    let rows = file.rows();
    // Without the `faults` feature `kill` is always `None`: no abort.
    let die = |phase: KillPhase| {
        #[cfg(feature = "faults")]
        if kill == Some(phase) {
            tracing::error!(?phase, output = %output, "FOVEA_KILL_AT: aborting");
            std::process::abort();
        }
        #[cfg(not(feature = "faults"))]
        let _ = phase;
    };
    die(KillPhase::BeforeWrite);
    if rows == 0 {
        return Ok(RewriteAnswer {
            micros: micros(started),
            bytes_read: meter.counts().bytes_read,
            ..Default::default()
        });
    }
    if kill == Some(KillPhase::MidWrite) {
        let (bytes, _) = file.finish().map_err(fail)?;
        lake.put(&output, bytes.slice(..bytes.len() / 2)).map_err(fail)?;
        die(KillPhase::MidWrite);
        return Err(SplitFailure::new(SplitFailureKind::Failed, "FOVEA_KILL_AT mid-write did not abort"));
    }
    let file = file.put(lake, output.clone()).map_err(fail)?;
    die(KillPhase::AfterWrite);
    let footer = file
        .footer_range
        .clone()
        .ok_or_else(|| SplitFailure::new(SplitFailureKind::Failed, "the written file's footer range is unknown"))?;
    Ok(RewriteAnswer {
        rows,
        row_groups: file
            .row_groups
            .iter()
            .map(|g| WrittenGroup { rows: g.rows, min_ts: g.min_ts.0, max_ts: g.max_ts.0 })
            .collect(),
        footer: (footer.start, footer.end),
        bytes_read: meter.counts().bytes_read,
        micros: micros(started),
        footer_metadata: file.metadata(lake).ok().cloned(),
    })
}

/// Reads the row groups `request` writes from `lake`, in order, handing
/// each to `group` as it is read.
fn for_each_group(
    lake: &Lake,
    request: &RewriteRequest,
    output: &Path,
    group: &mut dyn FnMut(RecordBatch) -> std::result::Result<(), SplitFailure>,
) -> std::result::Result<(), SplitFailure> {
    let fail = |e: Error| SplitFailure::of(&e);
    let bad = |m: String| SplitFailure::new(SplitFailureKind::BadRequest, m);
    match &request.job {
        RewriteJob::Combine { blocks } => {
            if blocks.is_empty() {
                return Err(bad("a combine names no block".into()));
            }
            for b in blocks {
                let path = Path::parse(b).map_err(|e| bad(format!("block {b:?}: {e}")))?;
                if &path == output {
                    return Err(bad("a combine's output is one of its blocks".into()));
                }
                group(lake.read_block(&path).map_err(fail)?)?;
            }
            Ok(())
        }
        RewriteJob::DropRows { source, rows, dropped } => {
            let source_path = data_file_path("source", source)?;
            if &source_path == output {
                return Err(bad("a rewrite's output is its source".into()));
            }
            let keep = decode_keep(dropped, *rows).map_err(bad)?;
            let batch = lake.read_block(&source_path).map_err(fail)?;
            if batch.num_rows() != *rows {
                return Err(bad(format!("{source} holds {} rows, the request says {rows}", batch.num_rows())));
            }
            let kept = arrow::compute::filter_record_batch(&batch, &keep).map_err(|e| fail(e.into()))?;
            drop(batch);
            let n = request.row_group_rows;
            for o in (0..kept.num_rows()).step_by(n) {
                group(kept.slice(o, n.min(kept.num_rows() - o)))?;
            }
            Ok(())
        }
    }
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Runs rewrites: in this process ([`LocalRewrites`]) or as invocations of
/// the combine and GC functions (`fovea_aws::functions`).
///
/// Contract: `rewrite` blocks until the job is done or failed; on success
/// the output object holds exactly the rows the job asks for; on failure
/// the output may hold anything (or nothing) and the caller deletes it. A
/// worker may retry internally; it must never answer for an attempt other
/// than one that wrote the output whole.
pub trait RewriteWorker: Send + Sync + std::fmt::Debug {
    /// Runs one rewrite.
    fn rewrite(&self, request: &RewriteRequest) -> std::result::Result<RewriteAnswer, SplitFailure>;

    /// Rewrites the caller may run at once.
    fn concurrency(&self) -> usize {
        1
    }

    /// Where the work runs, for logs and metrics (`in-process`, `lambda`).
    fn kind(&self) -> &'static str;
}

/// The files a combine or storage-GC round is rewriting. Rounds may run at
/// once (the sink's after a checkpoint beside a maintenance thread's); a
/// file claimed by one is left alone by the others, so no file is ever
/// rewritten by two at a time (each round writes an object of its own,
/// see [`crate::lake::combined_path`]: a failing round discards only it).
///
/// A round claims a file under the lock of the file's part, after seeing
/// it still needs the rewrite, and holds the claim until its swap is done
/// (or abandoned): a round seeing the file before that swap skips it, one
/// seeing it after finds nothing left to rewrite.
#[derive(Debug, Default)]
pub(crate) struct RewriteClaims(Mutex<HashSet<(TableId, FileId)>>);

/// A file claimed for rewriting, released when dropped.
#[derive(Debug)]
pub(crate) struct RewriteClaim<'a> {
    claims: &'a RewriteClaims,
    file: (TableId, FileId),
}

impl RewriteClaims {
    /// Claims `file` of `table`; `None` while another round holds it.
    pub(crate) fn claim(&self, table: TableId, file: FileId) -> Option<RewriteClaim<'_>> {
        // The claim is made only once inserted: dropping one releases it.
        let inserted = crate::mvcc::lock(&self.0).insert((table, file));
        inserted.then(|| RewriteClaim { claims: self, file: (table, file) })
    }
}

impl Drop for RewriteClaim<'_> {
    fn drop(&mut self) {
        crate::mvcc::lock(&self.claims.0).remove(&self.file);
    }
}

/// Rewrites in this process, on the engine's lake.
#[derive(Clone, Debug)]
pub struct LocalRewrites {
    lake: Lake,
}

impl LocalRewrites {
    /// Rewrites on `lake`.
    pub fn new(lake: Lake) -> Self {
        LocalRewrites { lake }
    }
}

impl RewriteWorker for LocalRewrites {
    fn rewrite(&self, request: &RewriteRequest) -> std::result::Result<RewriteAnswer, SplitFailure> {
        run_rewrite(&self.lake, request)
    }

    fn kind(&self) -> &'static str {
        "in-process"
    }
}

/// Counters of the rewrites an engine asked for (monotonic).
#[derive(Debug, Default)]
pub struct RewriteStats {
    /// Rewrites asked for.
    pub started: AtomicU64,
    /// Rewrites that failed (the file was left as it was).
    pub failed: AtomicU64,
    /// Rows written by rewrites that succeeded.
    pub rows_written: AtomicU64,
    /// Bytes read by rewrites that succeeded.
    pub bytes_read: AtomicU64,
    /// Microseconds the workers spent on rewrites that succeeded.
    pub worker_micros: AtomicU64,
}

/// Runs `requests` on `worker`, up to its concurrency at once, and returns
/// the outcomes in request order. Every attempt is counted in `stats`.
pub(crate) fn run_all(
    worker: &dyn RewriteWorker,
    requests: &[RewriteRequest],
    stats: &RewriteStats,
) -> Vec<std::result::Result<RewriteAnswer, SplitFailure>> {
    let run = |r: &RewriteRequest| {
        // Relaxed: statistics.
        stats.started.fetch_add(1, Ordering::Relaxed);
        let outcome = worker.rewrite(r);
        match &outcome {
            Ok(a) => {
                stats.rows_written.fetch_add(a.rows as u64, Ordering::Relaxed);
                stats.bytes_read.fetch_add(a.bytes_read, Ordering::Relaxed);
                stats.worker_micros.fetch_add(a.micros, Ordering::Relaxed);
            }
            Err(_) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        outcome
    };
    let threads = worker.concurrency().clamp(1, requests.len().max(1));
    if threads == 1 {
        return requests.iter().map(run).collect();
    }
    let next = AtomicUsize::new(0);
    let mut out: Vec<_> = (0..requests.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        // Relaxed: only hands out distinct indices.
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(r) = requests.get(i) else { break };
                        done.push((i, run(r)));
                    }
                    done
                })
            })
            .collect();
        for h in handles {
            // A panicking worker thread leaves its slots empty: failures below.
            if let Ok(done) = h.join() {
                for (i, o) in done {
                    out[i] = Some(o);
                }
            }
        }
    });
    out.into_iter()
        .map(|o| o.unwrap_or_else(|| Err(SplitFailure::new(SplitFailureKind::Failed, "the rewrite's thread panicked"))))
        .collect()
}

/// The conformance suite every [`RewriteWorker`] passes (public so that the
/// Lambda combine and GC functions in `fovea-aws` run it).
pub mod conformance {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::engine::Engine;
    use crate::replay::Op;
    use crate::scan::ScanOptions;
    use crate::schema::{Value, rows_from_batch};

    /// The suite's table, created by [`check`].
    pub const TABLE: &str = "conformance.rewrites";

    /// The worker under test, with every answer checked against its
    /// output: the written file holds exactly the rows the job asks for
    /// (the blocks' rows in order; the source's rows but the dropped ones,
    /// in order) and the answer says so. The engine refuses a wrong answer
    /// by itself (a lossy rewrite never reaches a scan), so the suite looks
    /// at the output directly.
    #[derive(Debug)]
    struct Checked {
        worker: Arc<dyn RewriteWorker>,
        lake: Lake,
        /// Combines answered.
        combines: AtomicUsize,
        /// Storage-GC rewrites answered.
        drops: AtomicUsize,
        wrong: Mutex<Vec<String>>,
    }

    impl Checked {
        fn expected(&self, job: &RewriteJob) -> Result<arrow::record_batch::RecordBatch> {
            let read = |p: &str| self.lake.read_block(&Path::from(p));
            match job {
                RewriteJob::Combine { blocks } => {
                    let batches = blocks.iter().map(|b| read(b)).collect::<Result<Vec<_>>>()?;
                    let schema = batches.first().map(|b| b.schema()).ok_or_else(|| Error::invariant("no blocks"))?;
                    Ok(arrow::compute::concat_batches(&schema, &batches)?)
                }
                RewriteJob::DropRows { source, rows, dropped } => {
                    let keep = decode_keep(dropped, *rows).map_err(Error::invariant)?;
                    Ok(arrow::compute::filter_record_batch(&read(source)?, &keep)?)
                }
            }
        }

        fn check(&self, request: &RewriteRequest, answer: &RewriteAnswer) -> Option<String> {
            let written = match self.lake.read_block(&Path::from(request.output.as_str())) {
                Ok(w) => w,
                Err(e) => return Some(format!("{}: the output cannot be read: {e}", request.output)),
            };
            let expected = match self.expected(&request.job) {
                Ok(x) => x,
                Err(e) => return Some(format!("{}: the job's sources cannot be read: {e}", request.output)),
            };
            if answer.rows != written.num_rows()
                || answer.row_groups.iter().map(|g| g.rows).sum::<usize>() != answer.rows
            {
                return Some(format!(
                    "{}: the answer says {} rows in groups of {:?}, the file holds {}",
                    request.output,
                    answer.rows,
                    answer.row_groups.iter().map(|g| g.rows).collect::<Vec<_>>(),
                    written.num_rows()
                ));
            }
            (written != expected).then(|| {
                format!(
                    "{}: holds {} rows, the job asks for {}, or they differ",
                    request.output,
                    written.num_rows(),
                    expected.num_rows()
                )
            })
        }
    }

    impl RewriteWorker for Checked {
        fn rewrite(&self, request: &RewriteRequest) -> std::result::Result<RewriteAnswer, SplitFailure> {
            let answer = self.worker.rewrite(request)?;
            let done = match request.job {
                RewriteJob::Combine { .. } => &self.combines,
                RewriteJob::DropRows { .. } => &self.drops,
            };
            // Relaxed: a count read after the rounds joined.
            done.fetch_add(1, Ordering::Relaxed);
            if let Some(wrong) = self.check(request, &answer) {
                self.wrong.lock().unwrap_or_else(|p| p.into_inner()).push(wrong);
            }
            Ok(answer)
        }

        fn concurrency(&self) -> usize {
            self.worker.concurrency()
        }

        fn kind(&self) -> &'static str {
            self.worker.kind()
        }
    }

    /// Runs the suite: `engine`'s combines and storage-GC rounds go to
    /// `worker` (which writes to `engine`'s lake) while a table is written,
    /// updated and deleted from; after every round each scan equals a
    /// naive model of the table, at the newest snapshot and at one taken
    /// before the rewrites. Requests a worker must refuse (a missing
    /// source, an output outside the table's files, an output that is its
    /// source) fail with the typed failure the contract names. Panics
    /// naming what differs.
    pub fn check(engine: &Engine, worker: Arc<dyn RewriteWorker>) {
        let counted = Arc::new(Checked {
            worker: Arc::clone(&worker),
            lake: engine.lake().clone(),
            combines: AtomicUsize::new(0),
            drops: AtomicUsize::new(0),
            wrong: Mutex::new(Vec::new()),
        });
        engine.set_rewrite_worker(Arc::clone(&counted) as Arc<dyn RewriteWorker>);
        let schema =
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false), Field::new("v", DataType::Utf8, true)]));
        let def = engine.create_table(TABLE, schema, vec![0]).expect("create the suite's table");
        let mut model: BTreeMap<i64, String> = BTreeMap::new();
        let mut apply = |ops: Vec<(i64, Option<String>)>| {
            // Deletes of keys already gone are left out (a delete names a live row).
            let ops: Vec<Op> = ops
                .into_iter()
                .filter_map(|(k, v)| match v {
                    Some(v) => {
                        model.insert(k, v.clone());
                        Some(Op::Upsert { table: def.id, row: vec![Value::Int(k), Value::Utf8(v)] })
                    }
                    None => model.remove(&k).map(|_| Op::Delete { table: def.id, key: vec![Value::Int(k)] }),
                })
                .collect();
            engine.apply(ops).expect("apply");
            model.clone()
        };
        let scan = |qts: &crate::mvcc::Snapshot| -> BTreeMap<i64, String> {
            let batches =
                engine.scan(qts, TABLE, ScanOptions::default()).and_then(|s| s.collect_batches()).expect("scan");
            batches
                .iter()
                .flat_map(|b| rows_from_batch(b).expect("rows"))
                .map(|r| match (&r[0], &r[1]) {
                    (Value::Int(k), Value::Utf8(v)) => (*k, v.clone()),
                    other => panic!("a row of the suite's table reads as {other:?}"),
                })
                .collect()
        };
        let mut before = None;
        for round in 0..4i64 {
            let mut latest = (0..6)
                .map(|chunk| {
                    let base = round * 600 + chunk * 100;
                    apply((base..base + 100).map(|k| (k, Some(format!("r{round}-{k}")))).collect())
                })
                .last()
                .expect("six chunks");
            if round > 0 {
                // Update a fifth and delete a third of the earlier rounds' rows.
                apply((0..round * 600).step_by(5).map(|k| (k, Some(format!("u{round}-{k}")))).collect());
                latest = apply((1..round * 600).step_by(3).map(|k| (k, None)).collect());
            }
            engine.flush().expect("flush");
            let snapshot = engine.snapshot();
            let combined = engine.combine().expect("combine");
            assert_eq!(scan(&snapshot), latest, "round {round}: the table after combining {combined} file(s)");
            let report = engine.storage_gc(0.2).expect("storage GC");
            assert_eq!(scan(&engine.snapshot()), latest, "round {round}: the table after storage GC ({report:?})");
            assert_eq!(scan(&snapshot), latest, "round {round}: a snapshot taken before the rewrites, read after them");
            if round == 1 {
                before = Some((snapshot, latest));
            }
        }
        let (snapshot, then) = before.expect("round 1 ran");
        assert_eq!(scan(&snapshot), then, "a snapshot two rounds of rewrites old");
        // Relaxed: the rounds above returned.
        let (combines, drops) = (counted.combines.load(Ordering::Relaxed), counted.drops.load(Ordering::Relaxed));
        let wrong = counted.wrong.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert!(wrong.is_empty(), "the worker wrote outputs other than its jobs ask for:\n{}", wrong.join("\n"));
        assert!(
            combines > 0 && drops > 0,
            "the worker answered the suite's rounds: {combines} combines and {drops} storage-GC rewrites done"
        );

        // What a worker must refuse, with the failure its caller acts on.
        let table_dir = format!("tables/{}", def.id.0);
        let refused = |request: RewriteRequest, kinds: &[SplitFailureKind], what: &str| match worker.rewrite(&request) {
            Ok(answer) => panic!("{what}: the worker answered {} rows instead of refusing", answer.rows),
            Err(f) => {
                assert!(kinds.contains(&f.kind), "{what}: failed as {:?} ({f}), expected one of {kinds:?}", f.kind)
            }
        };
        let output = format!("{table_dir}/files/conformance-out.parquet");
        refused(
            RewriteRequest {
                lake: None,
                job: RewriteJob::Combine { blocks: vec![format!("{table_dir}/blocks/missing-00000-e0.parquet")] },
                output: output.clone(),
                row_group_rows: 100,
            },
            &[SplitFailureKind::ObjectMissing],
            "a combine of a block that is not there",
        );
        refused(
            RewriteRequest {
                lake: None,
                job: RewriteJob::Combine { blocks: vec![format!("{table_dir}/blocks/missing-00000-e0.parquet")] },
                output: "_fovea/catalog/elsewhere.parquet".into(),
                row_group_rows: 100,
            },
            &[SplitFailureKind::BadRequest],
            "an output outside the table's files",
        );
        refused(
            RewriteRequest {
                lake: None,
                job: RewriteJob::DropRows {
                    source: output.clone(),
                    rows: 1,
                    dropped: encode_rows(&[], 1).expect("encode"),
                },
                output: output.clone(),
                row_group_rows: 100,
            },
            &[SplitFailureKind::BadRequest],
            "an output that is its own source",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_process_rewrites_conform() {
        let engine =
            crate::engine::Engine::in_memory(crate::engine::EngineConfig::default().with_shards(2).with_blocks(100, 3))
                .unwrap();
        let worker = Arc::new(LocalRewrites::new(engine.lake().clone()));
        conformance::check(&engine, worker);
    }

    /// The suite catches what it promises to: a worker that drops a row of
    /// a combine fails it.
    #[test]
    #[should_panic(expected = "outputs other than its jobs ask for")]
    fn a_worker_that_loses_a_row_fails_the_suite() {
        #[derive(Debug)]
        struct Lossy(Lake);
        impl RewriteWorker for Lossy {
            fn rewrite(&self, request: &RewriteRequest) -> std::result::Result<RewriteAnswer, SplitFailure> {
                match &request.job {
                    RewriteJob::Combine { blocks } if !blocks.is_empty() => {
                        // Combine all but the last block: its rows are lost.
                        let mut shorter = request.clone();
                        shorter.job = RewriteJob::Combine { blocks: blocks[..blocks.len() - 1].to_vec() };
                        run_rewrite(&self.0, if blocks.len() > 1 { &shorter } else { request })
                    }
                    _ => run_rewrite(&self.0, request),
                }
            }
            fn kind(&self) -> &'static str {
                "lossy"
            }
        }
        let engine =
            crate::engine::Engine::in_memory(crate::engine::EngineConfig::default().with_blocks(100, 3)).unwrap();
        let worker = Arc::new(Lossy(engine.lake().clone()));
        conformance::check(&engine, worker);
    }

    #[test]
    fn dropped_rows_round_trip() {
        let enc = encode_rows(&[0, 3, 64, 129], 130).unwrap();
        let keep = decode_keep(&enc, 130).unwrap();
        let dropped: Vec<usize> = (0..130).filter(|&i| !keep.value(i)).collect();
        assert_eq!(dropped, [0, 3, 64, 129]);
        assert!(encode_rows(&[130], 130).is_err());
        assert!(decode_keep(&enc, 200).is_err());
        assert!(decode_keep("%%", 10).is_err());
    }

    #[test]
    fn outputs_are_regular_files_only() {
        assert!(data_file_path("output", "tables/3/files/00ab.parquet").is_ok());
        for bad in ["_fovea/catalog", "tables/3/blocks/x.parquet", "tables/3/files/x.json", "../x", ""] {
            assert_eq!(data_file_path("output", bad).unwrap_err().kind, SplitFailureKind::BadRequest, "{bad}");
        }
    }
}
