//! The sink: change records → mirror transactions.
//!
//! ```text
//!  line ─decode─▶ ChangeRecord ─▶ reconstruct source transaction ─▶ typed ops ─▶ engine.apply_at(ts)
//!                                  BEGIN … END (counts checked)          │ chunks of a big
//!                                  or consecutive records of one txId    │ transaction stream
//!                                  or a run of snapshot records          ▼ through at one ts
//!                                                                 commit(ts) ─▶ visible at once
//!  every N transactions / T seconds / end of input: checkpoint + input position (atomically)
//! ```
//!
//! Atomicity by input kind: with BEGIN/END records (Debezium
//! `provide.transaction.metadata=true`) a source transaction is applied
//! exactly, and its event counts are checked. Without them, consecutive
//! records with the same source transaction id form one transaction (exact
//! for Debezium's PostgreSQL and MySQL connectors, whose records carry it;
//! DMS: `transaction-id`), and a run of snapshot records (`op: "r"`, DMS
//! `load`) forms one initial-load transaction.
//!
//! Exactly-once effect: a source transaction whose identity is already in
//! the catalog's history is skipped, whether it reappears after a restart
//! or twice in one stream. Identities come from the source's own fields,
//! never from where a record sits in one input: a transaction's id, and
//! for a run of snapshot records (which has none) one identity per table
//! of the run, a digest of that table's first [`SNAPSHOT_IDENTITY_ROWS`]
//! records in the run (key, images, source time and transaction id, table).
//! Re-reading a file finds the same identities; a table loaded alone and
//! then again inside a bigger load (or the other way round) is applied
//! once; a new load or a re-snapshot by the connector (new rows, new source
//! times) gets new ones, and its records of existing keys replace those
//! rows (snapshot records are upserts). A table's first records in a run
//! wait, unapplied, until its identity is known.
//!
//! Tables: a table is created as part of the mirror transaction that first
//! names it (its timestamp is begun then if it has none yet), so every
//! checkpoint at or after that transaction's commit holds the table, however
//! the transaction was chunked; a table named outside any transaction (a
//! definition record) and every table of the `--schema-file` is created by
//! a mirror transaction of its own and exists, empty, from then on.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, Int64Array};
use arrow::datatypes::{DataType, Field, Schema};

use crate::catalog::{
    Catalog, CatalogCommit, CatalogOperation, CheckpointRecord, HistoryEntry, SNAPSHOT_IDENTITY_PREFIX, now_us,
};
use crate::cdc::ddl::TableDdl;
use crate::cdc::debezium::UNAVAILABLE;
use crate::cdc::typed::TableShape;
use crate::cdc::types::{convert_exact, infer_type, to_value};
use crate::cdc::{ChangeRecord, Columns, ROWID_COLUMN, RowChange, RowOp, SourcePosition, hidden_rowid, input_error};
use crate::checkpoint::PendingCheckpoint;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::ids::{TableId, Ts};
use crate::replay::Op;
use crate::schema::{Row, TableDef, TypeChange, Value, render_key};
use crate::workers::{ShardPool, WorkerError};
use rows_by_content::RowsByContent;
use smol_str::SmolStr;
use std::hash::Hasher;
use twox_hash::XxHash64;

mod rows_by_content;

/// Maps keyed by table and column names, hashed with foldhash (SipHash
/// showed in replay profiles).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Records counted per table within one transaction. A transaction names
/// a few tables, so a list searched from its last hit serves it; a hash
/// map was built, grown and hashed anew for every transaction (a tenth of
/// the sink's work in a replay profile). Past [`TableCounts::INDEXED`]
/// tables the list is indexed by name, so a transaction of many tables
/// stays linear in its records.
#[derive(Default)]
struct TableCounts {
    counts: Vec<(SmolStr, u64)>,
    /// The entry counted last (records of one table tend to follow each other).
    last: usize,
    /// Entry by name, once there are more than [`TableCounts::INDEXED`].
    index: Option<FastMap<SmolStr, usize>>,
}

impl TableCounts {
    /// Tables searched in a list before the list is indexed.
    const INDEXED: usize = 16;

    /// The entry of `table`, if counted.
    #[inline]
    fn position(&self, table: &str) -> Option<usize> {
        if self.counts.get(self.last).is_some_and(|(t, _)| t == table) {
            return Some(self.last);
        }
        match &self.index {
            Some(index) => index.get(table).copied(),
            None => self.counts.iter().position(|(t, _)| t == table),
        }
    }

    /// Counts one more record of `table`.
    #[inline]
    fn bump(&mut self, table: &str) {
        self.add(table, 1);
    }

    /// Counts `n` more records of `table`.
    #[inline]
    fn add(&mut self, table: &str, n: u64) {
        let i = match self.position(table) {
            Some(i) => i,
            None => {
                let i = self.counts.len();
                self.counts.push((SmolStr::new(table), 0));
                if let Some(index) = &mut self.index {
                    index.insert(SmolStr::new(table), i);
                } else if self.counts.len() > Self::INDEXED {
                    self.index = Some(self.counts.iter().enumerate().map(|(i, (t, _))| (t.clone(), i)).collect());
                }
                i
            }
        };
        self.counts[i].1 += n;
        self.last = i;
    }

    /// Records counted of `table`.
    fn get(&self, table: &str) -> u64 {
        self.position(table).map_or(0, |i| self.counts[i].1)
    }

    /// Whether a record of `table` was counted (even one taken back).
    fn contains(&self, table: &str) -> bool {
        self.position(table).is_some()
    }

    /// Takes back one record of `table`.
    fn take_back(&mut self, table: &str) {
        if let Some(i) = self.position(table) {
            self.counts[i].1 = self.counts[i].1.saturating_sub(1);
        }
    }

    /// Records counted in all.
    fn total(&self) -> u64 {
        self.counts.iter().map(|(_, n)| n).sum()
    }

    /// The counts by table name, sorted.
    fn into_sorted(self) -> Vec<(String, u64)> {
        let mut tables: Vec<(String, u64)> = self.counts.into_iter().map(|(t, n)| (t.as_str().to_owned(), n)).collect();
        tables.sort();
        tables
    }
}

impl std::fmt::Debug for TableCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.counts.iter().map(|(t, n)| (t, n))).finish()
    }
}

/// How the sink checkpoints and batches.
#[derive(Clone, Debug)]
pub struct SinkConfig {
    /// Checkpoint after this many transactions.
    pub checkpoint_txns: u64,
    /// Checkpoint after this much time.
    pub checkpoint_interval: Duration,
    /// A transaction with more rows than this is applied in chunks of this
    /// size while it streams in (it stays invisible until its commit).
    pub chunk_rows: usize,
    /// Table definitions overriding inferred types.
    pub ddl: Vec<TableDdl>,
    /// Run memory GC and combine right after each checkpoint (off when a
    /// maintenance thread does, as in `fovea serve`).
    pub maintain_on_checkpoint: bool,
    /// Source transactions remembered for dedup: a transaction is skipped
    /// when it reappears within this many later ones (snapshot runs are
    /// always remembered). Memory is bounded by it, not by history.
    pub dedup_window: usize,
    /// Catalog versions and history older than this are pruned after a
    /// checkpoint (never the dedup window's newest transactions; see
    /// [`Catalog::prune`]); `None` keeps everything.
    pub history_retention: Option<Duration>,
}

/// How long catalog history is kept by default: a week.
pub const DEFAULT_HISTORY_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Pause between prunes of the catalog: a 24th of the retention, between a
/// second and an hour (what ages out in the meantime waits that long).
fn prune_interval(retention: Duration) -> Duration {
    (retention / 24).clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

impl Default for SinkConfig {
    fn default() -> Self {
        SinkConfig {
            checkpoint_txns: 50_000,
            checkpoint_interval: Duration::from_secs(10),
            chunk_rows: 16_384,
            ddl: Vec::new(),
            maintain_on_checkpoint: true,
            dedup_window: 1 << 20,
            history_retention: Some(DEFAULT_HISTORY_RETENTION),
        }
    }
}

/// Counters of a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SinkStats {
    /// Source transactions applied.
    pub applied: u64,
    /// Source transactions skipped as already applied.
    pub skipped: u64,
    /// Rows changed.
    pub rows: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Clean-ups after a committed checkpoint that failed (old checkpoint
    /// objects, retired blocks): retried later, replay goes on.
    pub cleanup_failures: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TxnKind {
    /// Delimited by BEGIN / END.
    Metadata,
    /// Consecutive records of one source transaction id.
    Grouped,
    /// A run of snapshot records.
    Snapshot,
}

struct End {
    position: SourcePosition,
    event_count: Option<u64>,
    per_table: Vec<(String, u64)>,
}

/// Records of a snapshot run that make up its identity (fewer when the run
/// is shorter). The run's first chunk waits until they have arrived.
pub const SNAPSHOT_IDENTITY_ROWS: u64 = 4096;

/// One table's records in a snapshot run: their identity digest and
/// what became of them.
struct Segment {
    table: String,
    /// No longer fed once the segment is settled.
    digest: XxHash64,
    rows: u64,
    state: SegmentState,
}

impl Segment {
    /// `snapshot:<digest>:<table>` (final once the segment is settled).
    fn identity(&self) -> String {
        format!("{SNAPSHOT_IDENTITY_PREFIX}{:016x}:{}", self.digest.finish(), self.table)
    }
}

enum SegmentState {
    /// Digesting: the operations wait here.
    Pending(Vec<(Op, SourcePosition)>),
    /// New: its operations go with the transaction.
    Applied,
    /// Already applied by an earlier run: its records are dropped.
    Skipped,
}

/// The identities a sink dedups against: the newest `capacity` source
/// transactions and every snapshot run. Each is kept as its 128-bit
/// XXH3: the default window of 2²⁰ takes about 52 MB (set and order),
/// against about 140 MB as two `String`s an identity. Two identities
/// sharing a hash — which would skip a transaction — is a chance of about
/// n²/2¹²⁹, 10⁻²⁷ for a million.
struct AppliedWindow {
    capacity: usize,
    set: hashbrown::HashSet<u128, foldhash::fast::FixedState>,
    /// The source transactions in the set, oldest first.
    order: VecDeque<u128>,
}

/// What the window keeps of an identity.
fn identity_hash(id: &str) -> u128 {
    twox_hash::XxHash3_128::oneshot(id.as_bytes())
}

impl AppliedWindow {
    fn new(capacity: usize) -> Self {
        AppliedWindow {
            capacity: capacity.max(1),
            set: hashbrown::HashSet::with_hasher(foldhash::fast::FixedState::with_seed(0xd3d0_0b5e)),
            order: VecDeque::new(),
        }
    }

    fn contains(&self, id: &str) -> bool {
        self.set.contains(&identity_hash(id))
    }

    /// Remembers a history entry's identity: a snapshot run's names each
    /// of its tables' identities.
    fn insert_entry(&mut self, entry: &str) {
        for id in entry.split(SEGMENT_SEPARATOR) {
            self.insert(id);
        }
    }

    fn insert(&mut self, id: &str) {
        let hash = identity_hash(id);
        if id.starts_with(SNAPSHOT_IDENTITY_PREFIX) {
            self.set.insert(hash);
            return;
        }
        if self.set.insert(hash) {
            self.order.push_back(hash);
            if self.order.len() > self.capacity
                && let Some(old) = self.order.pop_front()
            {
                self.set.remove(&old);
            }
        }
    }
}

/// Separates the table identities of one snapshot run in its history entry.
const SEGMENT_SEPARATOR: &str = " + ";

struct OpenTxn {
    identity: String,
    /// A snapshot run's tables, in order of first appearance.
    segments: Option<Vec<Segment>>,
    txid: String,
    kind: TxnKind,
    first: SourcePosition,
    skip: bool,
    ts: Option<Ts>,
    ops: Vec<Op>,
    op_positions: Vec<SourcePosition>,
    received: u64,
    per_table: TableCounts,
    rows_per_table: TableCounts,
    commit_us: Option<i64>,
    end: Option<End>,
}

/// A chunk handed to the shard workers, remembered until it is applied so
/// an error can name its input line.
struct Chunk {
    chunk: u64,
    ts: Ts,
    txid: String,
    first: SourcePosition,
    positions: Vec<SourcePosition>,
}

/// Jobs gathered before they are handed to the shards as one group.
const GROUP_JOBS: usize = 2048;
/// Longest a finished transaction waits for its group (freshness bound).
const GROUP_LATENCY: Duration = Duration::from_millis(1);
/// Chunks in flight before the sink waits for the shards (memory bound).
const MAX_CHUNKS_IN_FLIGHT: usize = 1 << 16;
/// Most room a transaction's operation list starts with (its positions
/// stay with its chunk until applied, so the room is bounded).
const OPS_CAPACITY: usize = 64;

/// A column the source declares in another type than the table's.
#[derive(Clone, Debug)]
struct Retyped {
    /// Its index in the table.
    index: usize,
    name: String,
    /// The declared type, or the one it widens to.
    to: DataType,
    /// [`TypeChange::Widen`]: the table widens to `to`; [`TypeChange::Recopy`]:
    /// the column keeps its type and each value of type `to` is converted
    /// into it exactly.
    change: TypeChange,
}

/// Turns change records into mirror transactions on an engine.
pub struct Sink {
    engine: Arc<Engine>,
    pool: ShardPool,
    chunks: VecDeque<Chunk>,
    /// Commits handed to the shards since the last drain, with their
    /// transaction's first line: a commit failing there sets the resume
    /// point as a failed chunk does.
    commits: VecDeque<(Ts, SourcePosition)>,
    /// The transaction a shard failed on, and its first input line.
    failed_at: Option<(Ts, SourcePosition)>,
    last_flush: Instant,
    catalog: Arc<dyn Catalog>,
    input: String,
    config: SinkConfig,
    ddl: HashMap<String, TableDdl>,
    tables: FastMap<String, TableShape>,
    applied: AppliedWindow,
    seen_begin: bool,
    /// Records are grouped by transaction id (no BEGIN/END in this stream).
    grouping: bool,
    open: Option<OpenTxn>,
    held: HashMap<String, Vec<(SourcePosition, RowChange)>>,
    history: Vec<HistoryEntry>,
    operations: Vec<CatalogOperation>,
    stats: SinkStats,
    since_checkpoint: u64,
    /// When a checkpoint falls due by time (`None`: never, the interval
    /// being unbounded): a deadline, so that an unbounded interval costs
    /// no clock read per record.
    checkpoint_due: Option<Instant>,
    /// The input reader's state, written with each checkpoint.
    source_state: Option<String>,
    /// Where the newest checkpoint of this sink resumes.
    checkpointed_at: Option<SourcePosition>,
    /// The checkpoint being written in the background, if any.
    writing: Option<CheckpointInFlight>,
    /// Room a new transaction's operation list starts with: the size of
    /// the last chunk applied, up to [`OPS_CAPACITY`] (lists grown from
    /// empty for every transaction were a twentieth of the sink's work).
    ops_capacity: usize,
    /// How long the newest committed checkpoint took, until
    /// [`Sink::poll_checkpoint`] reports it (one may be committed while
    /// records are pushed).
    unreported: Option<Duration>,
    /// An error of the checkpoint step [`Sink::push`] takes after applying
    /// its record, held for the next call: an error from `push` always
    /// means its record was not applied, so the caller's position stays
    /// exact (a resume point past a committed END, never at it).
    deferred: Option<Error>,
    /// The next hidden row id ([`ROWID_COLUMN`]) of each table without a
    /// primary key that this run inserted into, by table: one past the
    /// largest the table had when the run first needed one.
    next_rowid: HashMap<TableId, i64>,
    /// The live rows of each table without a primary key that an update
    /// or delete named by its whole old image (REPLICA IDENTITY FULL), by
    /// content: built when a run first needs one, then told every
    /// operation handed on for the table ([`Sink::note_pushed`]).
    by_content: HashMap<TableId, RowsByContent>,
    /// When the catalog is next pruned (after the checkpoint that follows).
    prune_due: Instant,
}

/// A checkpoint captured by [`Sink::start_checkpoint`], being written.
struct CheckpointInFlight {
    /// Writes and commits it.
    thread: std::thread::JoinHandle<CheckpointOutcome>,
    resume: SourcePosition,
    began: Instant,
    /// How long the capture held the sink.
    captured: Duration,
}

/// What the writer thread of a checkpoint does: write its objects, commit
/// it to the catalog with the history and operations it owes, tell the
/// engine, publish the watermarks, delete what older checkpoints left.
/// Nothing of it holds the sink.
struct CheckpointJob {
    pending: PendingCheckpoint,
    catalog: Arc<dyn Catalog>,
    commit: CatalogCommit,
    input: String,
    resume: SourcePosition,
    source_state: Option<String>,
    /// Prune the catalog once the checkpoint is committed.
    prune: Option<crate::catalog::Retention>,
}

/// What became of a [`CheckpointJob`].
struct CheckpointOutcome {
    result: Result<crate::checkpoint::Manifest>,
    /// On failure, the history and operations to give back.
    commit: CatalogCommit,
    written: Duration,
    committed: Duration,
    cleanup_failures: u64,
    /// Publishing the watermarks failed after the commit (a fenced
    /// replayer's store refuses it): the sink stops with it.
    late: Option<Error>,
}

impl CheckpointJob {
    fn run(mut self) -> CheckpointOutcome {
        let began = Instant::now();
        let failed = |e: Error, mut commit: CatalogCommit| {
            commit.checkpoint = None;
            CheckpointOutcome {
                result: Err(e),
                commit,
                written: Duration::ZERO,
                committed: Duration::ZERO,
                cleanup_failures: 0,
                late: None,
            }
        };
        let pending = &mut self.pending;
        let manifest = match crate::error::catch_panic(|| "writing a checkpoint".into(), || pending.write()) {
            Ok(m) => m,
            Err(e) => return failed(e, self.commit),
        };
        let written = began.elapsed();
        let engine = Arc::clone(self.pending.engine());
        // The sink is the only committer of checkpoints: it reads the newest
        // version.
        self.commit.checkpoint = Some(CheckpointRecord {
            manifest,
            input: self.input,
            position: self.resume,
            source_state: self.source_state,
        });
        let epoch = engine.clock().epoch();
        if let Err(e) = self.catalog.version().and_then(|v| self.catalog.commit(epoch, v, &self.commit)) {
            return failed(e, self.commit);
        }
        let Some(CheckpointRecord { manifest, .. }) = self.commit.checkpoint else { unreachable!("set above") };
        engine.checkpoint_committed(&manifest);
        // Committed: the keys it wrote are not owed to the next one.
        drop(self.pending);
        let committed = began.elapsed() - written;
        // Published for readers on other hosts (monotonic, fenced).
        let late = engine.clock().persist_watermarks().err();
        // The checkpoint is committed: clean-up that fails now is retried by
        // a later checkpoint or GC round (and a restore deletes whatever the
        // manifest does not name), so it does not stop the replay.
        let mut cleanup_failures = 0;
        if let Err(e) = engine.drop_old_checkpoints(&manifest) {
            cleanup_failures += 1;
            tracing::warn!("objects of older checkpoints stay until the next checkpoint: {e}");
        }
        if let Some(retention) = &self.prune {
            match self.catalog.prune(epoch, retention) {
                Ok(p) if p != crate::catalog::Pruned::default() => {
                    tracing::info!(versions = p.versions, history = p.history, objects = p.objects, "catalog pruned")
                }
                Ok(_) => {}
                Err(e) => {
                    cleanup_failures += 1;
                    tracing::warn!("catalog history past the retention stays until the next prune: {e}");
                }
            }
        }
        CheckpointOutcome {
            result: Ok(manifest),
            commit: CatalogCommit::default(),
            written,
            committed,
            cleanup_failures,
            late,
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        // A writer left running would outlive its sink: it is let finish
        // (committed, or its changes given back to the engine).
        if let Some(w) = self.writing.take() {
            let _ = w.thread.join();
        }
    }
}

impl Sink {
    /// A sink replaying `input` into `engine`, recording in `catalog`.
    pub fn new(engine: Arc<Engine>, catalog: Arc<dyn Catalog>, input: &str, config: SinkConfig) -> Result<Self> {
        let mut applied = AppliedWindow::new(config.dedup_window);
        for entry in catalog.applied_identities(config.dedup_window)? {
            applied.insert_entry(&entry);
        }
        let tables = engine.tables().into_iter().map(|def| (def.name.clone(), TableShape::new(def))).collect();
        let ddl = config.ddl.iter().map(|t| (t.name.clone(), t.clone())).collect();
        let checkpoint_due = Instant::now().checked_add(config.checkpoint_interval);
        let mut sink = Sink {
            pool: ShardPool::start(Arc::clone(&engine))?,
            chunks: VecDeque::new(),
            commits: VecDeque::new(),
            failed_at: None,
            last_flush: Instant::now(),
            engine,
            catalog,
            input: input.to_owned(),
            config,
            ddl,
            tables,
            applied,
            seen_begin: false,
            grouping: false,
            open: None,
            held: HashMap::new(),
            history: Vec::new(),
            operations: Vec::new(),
            stats: SinkStats::default(),
            since_checkpoint: 0,
            ops_capacity: 0,
            checkpoint_due,
            source_state: None,
            checkpointed_at: None,
            writing: None,
            unreported: None,
            deferred: None,
            next_rowid: HashMap::new(),
            by_content: HashMap::new(),
            // The first checkpoint prunes what aged out while no replayer ran.
            prune_due: Instant::now(),
        };
        sink.create_declared_tables()?;
        Ok(sink)
    }

    /// Waits until the shards applied (and committed) everything the sink
    /// handed them; a transaction still streaming in stays uncommitted.
    pub fn sync(&mut self) -> Result<()> {
        self.drain()
    }

    /// Hands committed transactions still gathered for group commit to
    /// the shards now (call when the input goes quiet, so the last
    /// transaction of a burst does not wait for the next one).
    pub fn flush_group(&mut self) {
        self.pool.flush();
        self.last_flush = Instant::now();
    }

    /// Sets what the next checkpoints record for the input reader to
    /// resume with (besides the position).
    pub fn set_source_state(&mut self, state: Option<String>) {
        self.source_state = state;
    }

    /// Where the newest checkpoint written by this sink resumes: everything
    /// before it is durable.
    pub fn checkpointed_at(&self) -> Option<SourcePosition> {
        self.checkpointed_at
    }

    /// Counters so far.
    pub fn stats(&self) -> SinkStats {
        self.stats
    }

    /// Feeds one record read at `position`; `next` is the position of the
    /// line after it (where a checkpoint taken now would resume). An error
    /// means this record was not applied (and the sink takes no more); a
    /// checkpoint failing after the record was applied is returned by the
    /// next call instead.
    pub fn push(&mut self, record: ChangeRecord, position: SourcePosition, next: SourcePosition) -> Result<()> {
        self.take_deferred()?;
        match record {
            ChangeRecord::Skip => {}
            ChangeRecord::Table(r) => {
                let txid = r.txid.clone().unwrap_or_default();
                self.table(&r, position, &txid)?;
            }
            ChangeRecord::Replace(r) => self.replace_table(&r, position)?,
            ChangeRecord::Drop { table, txid } => self.drop_table(&table, &txid, position)?,
            ChangeRecord::Begin { txid, commit_us } => {
                self.seen_begin = true;
                if let Some(open) = self.open.take() {
                    match open.kind {
                        TxnKind::Metadata => return Err(self.unfinished(&open, position)),
                        _ => self.finish(open)?,
                    }
                }
                let identity = txid.clone();
                self.open = Some(OpenTxn::new(
                    identity.clone(),
                    txid.clone(),
                    TxnKind::Metadata,
                    position,
                    self.applied.contains(&identity),
                    commit_us,
                    self.ops_capacity,
                ));
                for (pos, row) in self.held.remove(&txid).unwrap_or_default() {
                    self.add_row(pos, row)?;
                }
            }
            ChangeRecord::End { txid, event_count, per_table, commit_us } => {
                let Some(open) = self.open.as_mut().filter(|o| o.kind == TxnKind::Metadata && o.txid == txid) else {
                    return Err(input_error(
                        position,
                        None,
                        Some(&txid),
                        "END of a transaction whose BEGIN was not seen",
                    ));
                };
                open.commit_us = commit_us.or(open.commit_us);
                open.end = Some(End { position, event_count, per_table });
                self.try_finish_ended()?;
            }
            ChangeRecord::Row(row) => {
                let open_metadata = self.open.as_ref().filter(|o| o.kind == TxnKind::Metadata);
                match open_metadata {
                    Some(o) if row.txid.as_deref() == Some(o.txid.as_str()) || row.txid.is_none() => {
                        self.add_row(position, row)?;
                        self.try_finish_ended()?;
                    }
                    Some(o) if o.end.is_some() => {
                        let open = self.open.take().unwrap_or_else(|| unreachable!("matched Some"));
                        return Err(self.unfinished(&open, position));
                    }
                    _ if !self.seen_begin
                        && !self.grouping
                        && row.in_transaction_block
                        && self.held.keys().all(|t| Some(t.as_str()) == row.txid.as_deref()) =>
                    {
                        // Maybe a BEGIN follows (topics interleave), maybe the
                        // stream has none: hold until one or the other shows.
                        let txid = row.txid.as_deref().unwrap_or_default().to_owned();
                        self.held.entry(txid).or_default().push((position, row));
                    }
                    _ if self.seen_begin => {
                        // Arrived before its BEGIN (topics interleave): hold it.
                        let txid = row.txid.as_deref().map(str::to_owned).ok_or_else(|| {
                            input_error(
                                position,
                                Some(row.table.as_str()),
                                None,
                                "a record outside any BEGIN/END has no transaction id",
                            )
                        })?;
                        self.held.entry(txid).or_default().push((position, row));
                    }
                    _ => {
                        self.release_held()?;
                        self.push_grouped(row, position)?;
                    }
                }
            }
        }
        if let Err(e) = self.maybe_checkpoint(next, false) {
            self.deferred = Some(e);
        }
        Ok(())
    }

    /// No BEGIN came for the records held so far: the stream has no
    /// transaction records; group them by transaction id from now on.
    fn release_held(&mut self) -> Result<()> {
        self.grouping = true;
        let held: Vec<_> = self.held.drain().flat_map(|(_, rows)| rows).collect();
        for (pos, row) in held {
            self.push_grouped(row, pos)?;
        }
        Ok(())
    }

    /// Records without transaction metadata: group by source transaction id,
    /// and runs of snapshot records into one initial load.
    fn push_grouped(&mut self, row: RowChange, position: SourcePosition) -> Result<()> {
        let snapshot = row.op == RowOp::SnapshotRead;
        let same = match &self.open {
            Some(o) if snapshot => o.kind == TxnKind::Snapshot,
            Some(o) => o.kind == TxnKind::Grouped && Some(o.txid.as_str()) == row.txid.as_deref(),
            None => false,
        };
        if !same {
            if let Some(open) = self.open.take() {
                self.finish(open)?;
            }
            let txid = match (&row.txid, snapshot) {
                (Some(t), _) => t.to_string(),
                // Names the run in messages only; its identity is a digest.
                (None, true) => format!("snapshot run at {position}"),
                (None, false) => {
                    return Err(input_error(
                        position,
                        Some(row.table.as_str()),
                        None,
                        "record without a transaction id in a stream without BEGIN/END records: it cannot be grouped into its transaction",
                    ));
                }
            };
            // A snapshot run's identity is settled from its first records
            // (see `SNAPSHOT_IDENTITY_ROWS`).
            let (kind, identity) =
                if snapshot { (TxnKind::Snapshot, String::new()) } else { (TxnKind::Grouped, txid.clone()) };
            let skip = !snapshot && self.applied.contains(&identity);
            self.open = Some(OpenTxn::new(identity, txid, kind, position, skip, row.commit_us, self.ops_capacity));
        }
        let last = snapshot && row.snapshot.as_deref() == Some("last");
        self.add_row(position, row)?;
        if last {
            let open = self.open.take().unwrap_or_else(|| unreachable!("opened above"));
            self.finish(open)?;
        }
        Ok(())
    }

    /// Finishes the open BEGIN/END transaction if its END arrived and its
    /// counts are complete; fails if they were exceeded.
    fn try_finish_ended(&mut self) -> Result<()> {
        let Some(open) = &self.open else { return Ok(()) };
        let Some(end) = &open.end else { return Ok(()) };
        let Some(expected) = end.event_count else {
            let open = self.open.take().unwrap_or_else(|| unreachable!("checked"));
            return self.finish(open);
        };
        if open.received > expected {
            return Err(input_error(
                end.position,
                None,
                Some(&open.txid),
                format!("END reports {expected} events but {} arrived", open.received),
            ));
        }
        let tables_match = end.per_table.is_empty() || end.per_table.iter().all(|(t, n)| open.per_table.get(t) == *n);
        if open.received == expected {
            if !tables_match {
                return Err(input_error(
                    end.position,
                    None,
                    Some(&open.txid),
                    format!(
                        "END's per-table counts {:?} do not match the events received {:?}",
                        end.per_table, open.per_table
                    ),
                ));
            }
            let open = self.open.take().unwrap_or_else(|| unreachable!("checked"));
            self.finish(open)?;
        }
        Ok(())
    }

    fn unfinished(&self, open: &OpenTxn, at: SourcePosition) -> Error {
        match &open.end {
            Some(end) => input_error(
                end.position,
                None,
                Some(&open.txid),
                format!(
                    "END reports {} events but only {} arrived before {at} moved on",
                    end.event_count.unwrap_or(0),
                    open.received
                ),
            ),
            None => input_error(
                at,
                None,
                Some(&open.txid),
                format!("BEGIN at {} has no END before this record", open.first),
            ),
        }
    }

    /// The error held by [`Self::push`] for the next call, if any.
    fn take_deferred(&mut self) -> Result<()> {
        self.deferred.take().map_or(Ok(()), Err)
    }

    /// End of input: finish what can be finished, fail on what cannot.
    pub fn finish_input(&mut self, end: SourcePosition) -> Result<()> {
        self.take_deferred()?;
        let finished = self.finish_input_inner(end);
        finished
            .and_then(|()| self.drain())
            .and_then(|()| self.all_visible())
            .and_then(|()| self.maybe_checkpoint(end, true))
    }

    /// Drained, every transaction the sink began is committed: HWM held at
    /// one below later commits would leave those invisible for good (the
    /// replay would end looking complete), so it is an error naming it.
    fn all_visible(&self) -> Result<()> {
        match self.engine.clock().stall() {
            None => Ok(()),
            Some(s) => Err(Error::invariant(format!(
                "mirror transaction {} was begun and never committed ({}): the {} transactions committed after it, up to {}, \
                 would never become visible",
                s.waiting_for,
                self.describe_ts(s.waiting_for),
                s.committed_after,
                s.newest_committed
            ))),
        }
    }

    fn finish_input_inner(&mut self, end: SourcePosition) -> Result<()> {
        if !self.seen_begin {
            self.release_held()?;
        }
        if let Some(open) = self.open.take() {
            match open.kind {
                TxnKind::Metadata => {
                    let err = match &open.end {
                        Some(_) => self.unfinished(&open, end),
                        None => input_error(
                            end,
                            None,
                            Some(&open.txid),
                            format!("the input ends inside the transaction begun at {}", open.first),
                        ),
                    };
                    return Err(err);
                }
                _ => self.finish(open)?,
            }
        }
        if let Some((txid, rows)) = self.held.iter().next() {
            return Err(input_error(
                rows[0].0,
                Some(&rows[0].1.table),
                Some(txid),
                "records of this transaction arrived but its BEGIN never did",
            ));
        }
        Ok(())
    }

    fn add_row(&mut self, position: SourcePosition, mut row: RowChange) -> Result<()> {
        // A row read against a definition its table no longer has (an
        // earlier record changed the table) is decoded again. An update
        // that kept its key gets it from its row here, on this thread.
        if let Some(typed) = &mut row.typed {
            match self.tables.get(row.table.as_str()) {
                Some(t) if typed.is_for(&t.def) => {
                    if row.op == RowOp::Update && typed.key.is_empty() {
                        typed.key = t.def.key_of(&typed.row);
                    }
                }
                _ => row = row.untyped(position)?,
            }
        }
        let open = self.open.as_mut().ok_or_else(|| Error::invariant("row without an open transaction"))?;
        open.received += 1;
        open.per_table.bump(row.table.as_str());
        if open.skip {
            return Ok(());
        }
        if row.op == RowOp::Truncate {
            return self.truncate(position, &row);
        }
        // A snapshot record waits in its table's segment until the
        // segment's identity is known (or is dropped if it was applied).
        let segment = match open.segments.as_mut() {
            None => None,
            Some(segments) => {
                let i = segments.iter().position(|s| s.table == row.table).unwrap_or_else(|| {
                    segments.push(Segment {
                        table: row.table.to_string(),
                        digest: XxHash64::with_seed(0),
                        rows: 0,
                        state: SegmentState::Pending(Vec::new()),
                    });
                    segments.len() - 1
                });
                let seg = &mut segments[i];
                match seg.state {
                    SegmentState::Skipped => return Ok(()),
                    SegmentState::Applied => None,
                    SegmentState::Pending(_) => {
                        // The identity digests the JSON images.
                        if row.typed.is_some() {
                            row = row.untyped(position)?;
                        }
                        digest_row(&mut seg.digest, &row);
                        seg.rows += 1;
                        Some(i)
                    }
                }
            }
        };
        let op = match row.typed.take() {
            Some(mut typed) => {
                // A row of a table without a key, read straight into typed
                // values, leaves its hidden row id to the sink.
                let def = &self.tables[row.table.as_str()].def;
                if let Some(i) = hidden_rowid(def)
                    && typed.row.get(i).is_some_and(Value::is_null)
                {
                    let def = Arc::clone(def);
                    typed.row[i] = Value::Int(self.next_rowid(&def, i)?);
                }
                typed_op(row.op, typed)?
            }
            None => {
                let txid = open.txid.clone();
                self.op_of(&row, position, &txid)?
            }
        };
        let open = self.open.as_mut().ok_or_else(|| Error::invariant("open transaction vanished"))?;
        match (segment, open.segments.as_mut()) {
            (Some(i), Some(segments)) => {
                let seg = &mut segments[i];
                if let SegmentState::Pending(held) = &mut seg.state {
                    held.push((op, position));
                }
                if seg.rows >= SNAPSHOT_IDENTITY_ROWS {
                    self.settle_segments(Some(i))?;
                }
            }
            _ => {
                Self::note_pushed(&mut self.by_content, &op)?;
                open.rows_per_table.bump(row.table.as_str());
                open.ops.push(op);
                open.op_positions.push(position);
            }
        }
        let open = self.open.as_mut().ok_or_else(|| Error::invariant("open transaction vanished"))?;
        if open.ops.len() >= self.config.chunk_rows {
            // A trailing delete waits for the next record: it may be the
            // first half of a Debezium key change (see `op_of`).
            let held = match open.ops.last() {
                Some(Op::Delete { .. }) => open.ops.pop().zip(open.op_positions.pop()),
                _ => None,
            };
            self.apply_chunk()?;
            if let (Some((op, position)), Some(open)) = (held, self.open.as_mut()) {
                open.ops.push(op);
                open.op_positions.push(position);
            }
            // A large transaction streams through the shards: its chunk goes
            // to them now, and the sink reads on while at most about two
            // chunks wait there (memory stays a few chunks, however large
            // the transaction).
            self.pool.flush_and_wait_for(2 * self.engine.config().shards);
            self.last_flush = Instant::now();
            self.check_workers()?;
        }
        Ok(())
    }

    /// A `TRUNCATE` of `r`'s table in the open transaction: every live
    /// row, the transaction's own included, is deleted. A table the mirror
    /// does not have has no rows to delete.
    fn truncate(&mut self, position: SourcePosition, r: &RowChange) -> Result<()> {
        let name = r.table.as_str();
        let Some(t) = self.tables.get(name) else { return Ok(()) };
        let def = Arc::clone(&t.def);
        let deleted = self.delete_every_row(&def, position)?;
        let open = self.open.as_mut().ok_or_else(|| Error::invariant("open transaction vanished"))?;
        open.rows_per_table.add(name, deleted);
        Ok(())
    }

    /// Deletes every live row of `def` in the open transaction, its own
    /// included, in chunks as the scan of their keys reads them (`position`:
    /// the record that asks for it). Returns how many rows went.
    fn delete_every_row(&mut self, def: &TableDef, position: SourcePosition) -> Result<u64> {
        let options = crate::ScanOptions { projection: Some(def.primary_key.clone()), ..Default::default() };
        let mut deleted = 0u64;
        for batch in self.scan_with_own_writes(&def.name, options)?.into_iter().flatten() {
            let keys = crate::schema::rows_from_batch(&batch?)?;
            let open = self.open.as_mut().ok_or_else(|| Error::invariant("open transaction vanished"))?;
            deleted += keys.len() as u64;
            for key in keys {
                open.ops.push(Op::Delete { table: def.id, key });
                open.op_positions.push(position);
            }
            if open.ops.len() >= self.config.chunk_rows {
                self.apply_chunk()?;
                self.pool.flush_and_wait_for(2 * self.engine.config().shards);
                self.check_workers()?;
            }
        }
        // The table is empty now.
        if let Some(rows) = self.by_content.get_mut(&def.id) {
            rows.clear();
        }
        Ok(deleted)
    }

    /// Settles the identity of the open snapshot run's pending segment `i`
    /// (`None`: of every pending segment) from the records digested so far.
    /// A segment already applied by an earlier run is skipped; a new one's
    /// waiting operations join the transaction.
    fn settle_segments(&mut self, only: Option<usize>) -> Result<()> {
        let Some(open) = self.open.as_mut() else { return Ok(()) };
        let Some(segments) = open.segments.as_mut() else { return Ok(()) };
        for (i, seg) in segments.iter_mut().enumerate() {
            if only.is_some_and(|o| o != i) || !matches!(seg.state, SegmentState::Pending(_)) {
                continue;
            }
            let state =
                if self.applied.contains(&seg.identity()) { SegmentState::Skipped } else { SegmentState::Applied };
            if let SegmentState::Pending(held) = std::mem::replace(&mut seg.state, state)
                && matches!(seg.state, SegmentState::Applied)
            {
                for (op, position) in held {
                    Self::note_pushed(&mut self.by_content, &op)?;
                    open.rows_per_table.bump(&seg.table);
                    open.ops.push(op);
                    open.op_positions.push(position);
                }
            }
        }
        Ok(())
    }

    /// Tells the content map of `op`'s table, if it has one, of `op`,
    /// handed on now (see [`RowsByContent`]).
    #[inline]
    fn note_pushed(by_content: &mut HashMap<TableId, RowsByContent>, op: &Op) -> Result<()> {
        if by_content.is_empty() {
            return Ok(());
        }
        match by_content.get_mut(&op.table()) {
            Some(rows) => rows.apply(op),
            None => Ok(()),
        }
    }

    /// The content map of `def`'s live rows, `def` being a table without a
    /// primary key whose hidden row id is column `rowid`, built now from a
    /// scan of them (the open transaction's own included) if this run has
    /// none for it yet.
    fn rows_by_content(&mut self, def: &Arc<TableDef>, rowid: usize) -> Result<&mut RowsByContent> {
        if !self.by_content.get(&def.id).is_some_and(|m| m.is_for(def)) {
            let mut rows = RowsByContent::new(Arc::clone(def), rowid);
            for batch in self.scan_with_own_writes(&def.name, crate::ScanOptions::default())?.into_iter().flatten() {
                for row in crate::schema::rows_from_batch(&batch?)? {
                    rows.insert(&row)?;
                }
            }
            self.by_content.insert(def.id, rows);
        }
        self.by_content.get_mut(&def.id).ok_or_else(|| Error::invariant("content map vanished"))
    }

    /// A scan of table `name` that sees every change handed on so far, the
    /// open transaction's own included (its waiting operations are applied
    /// first); `None` where the table has no rows to scan yet.
    fn scan_with_own_writes(&mut self, name: &str, options: crate::ScanOptions) -> Result<Option<crate::Scan>> {
        self.apply_chunk()?;
        self.drain()?;
        // Drained, every transaction below the open one is committed.
        let snapshot = match self.open.as_ref().and_then(|o| o.ts) {
            Some(ts) => self.engine.snapshot_of_open(ts)?,
            None => self.engine.snapshot(),
        };
        match self.engine.scan(&snapshot, name, options) {
            Ok(scan) => Ok(Some(scan)),
            Err(Error::UnknownTable(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The mirror transaction a table created now belongs to: the open
    /// transaction (its ts begun now if it has none yet), or, outside any
    /// transaction, one of its own (`true`: commit it once the table exists).
    fn table_ts(&mut self) -> Result<(Ts, bool)> {
        match self.open.as_mut() {
            Some(open) if !open.skip => match open.ts {
                Some(ts) => Ok((ts, false)),
                None => {
                    let ts = self.engine.begin()?;
                    open.ts = Some(ts);
                    Ok((ts, false))
                }
            },
            _ => Ok((self.engine.begin()?, true)),
        }
    }

    /// The ts of the open, not skipped transaction (begun now if it has
    /// none), for a change that must be part of it (a replace, a drop);
    /// callers check there is one.
    fn open_ts(&mut self) -> Result<Ts> {
        match self.table_ts()? {
            (ts, false) => Ok(ts),
            (_, true) => Err(Error::invariant("a table change outside an open, not skipped transaction")),
        }
    }

    /// Creates the `--schema-file` tables the lake does not have yet, empty,
    /// in one mirror transaction of their own.
    fn create_declared_tables(&mut self) -> Result<()> {
        let missing: Vec<TableDdl> =
            self.config.ddl.iter().filter(|d| !self.tables.contains_key(&d.name)).cloned().collect();
        if missing.is_empty() {
            return Ok(());
        }
        let ts = self.engine.begin()?;
        for d in &missing {
            let fields = d.columns.iter().map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable)).collect();
            let at = SourcePosition::default();
            self.create_table(&d.name, fields, d.primary_key.clone(), true, Some(ts), &|m| {
                input_error(at, Some(&d.name), None, format!("schema file: {m}"))
            })?;
        }
        self.pool.commit(ts)?;
        self.since_checkpoint += 1;
        Ok(())
    }

    /// Applies the open transaction's pending operations at its timestamp.
    fn apply_chunk(&mut self) -> Result<()> {
        let Some(open) = self.open.as_mut() else { return Ok(()) };
        if open.ops.is_empty() {
            return Ok(());
        }
        let ts = match open.ts {
            Some(ts) => ts,
            None => {
                let ts = self.engine.begin()?;
                open.ts = Some(ts);
                ts
            }
        };
        let ops = std::mem::take(&mut open.ops);
        let positions = std::mem::take(&mut open.op_positions);
        self.stats.rows += ops.len() as u64;
        self.ops_capacity = ops.len().min(OPS_CAPACITY);
        let (first, txid) = (open.first, open.txid.clone());
        let chunk = self.pool.submit(ts, ops).map_err(|e| match e {
            Error::Schema { table, column, message } => {
                input_error(first, Some(&table), Some(&txid), format!("column {column}: {message}"))
            }
            other => other,
        })?;
        self.chunks.push_back(Chunk { chunk, ts, txid, first, positions });
        if self.chunks.len() > MAX_CHUNKS_IN_FLIGHT {
            self.drain()?;
        }
        self.check_workers()
    }

    /// Fails with the workers' first error, if any, naming its input line.
    fn check_workers(&mut self) -> Result<()> {
        match self.pool.take_error() {
            Some(e) => Err(self.worker_error(e)),
            None => Ok(()),
        }
    }

    /// Waits for the shard workers to apply and commit everything handed
    /// to them (before reading rows back, changing schemas, checkpoints).
    fn drain(&mut self) -> Result<()> {
        match self.pool.drain() {
            Ok(()) => {
                self.chunks.clear();
                self.commits.clear();
                Ok(())
            }
            Err(e) => Err(self.worker_error(e)),
        }
    }

    fn worker_error(&mut self, e: WorkerError) -> Error {
        let Some(c) = self.chunks.iter().find(|c| c.chunk == e.chunk) else {
            // A commit failed (or a job of a transaction whose chunks were
            // drained): nothing from its ts on became visible, so the next
            // checkpoint resumes at its first line — or, not knowing it, at
            // the last checkpoint's position (re-read transactions are
            // recognised as applied).
            let first = self.commits.iter().find(|(ts, _)| *ts == e.ts).map(|(_, first)| *first);
            let first = first.or(self.checkpointed_at).unwrap_or_default();
            self.failed_at = Some(self.failed_at.map_or((e.ts, first), |(ts, at)| (ts.min(e.ts), at.min(first))));
            self.history.retain(|h| h.ts < e.ts);
            return e.error;
        };
        // Nothing from this transaction on is committed: a checkpoint taken
        // now must resume at its first line and leave out later history.
        self.failed_at = Some((c.ts, c.first));
        let (ts, txid, first) = (c.ts, c.txid.clone(), c.first);
        self.history.retain(|h| h.ts < ts);
        match e.error {
            Error::KeyConflict { table, key, message, op } => {
                let at = op.and_then(|i| c.positions.get(i).copied()).unwrap_or(first);
                input_error(at, Some(&table), Some(&txid), format!("{message} (key {key})"))
            }
            other => other,
        }
    }

    fn finish(&mut self, open: OpenTxn) -> Result<()> {
        self.open = Some(open);
        self.settle_segments(None)?;
        if let Some(open) = self.open.as_mut()
            && let Some(segments) = &open.segments
        {
            // A snapshot run is named by the tables it applied.
            let applied: Vec<String> =
                segments.iter().filter(|s| matches!(s.state, SegmentState::Applied)).map(Segment::identity).collect();
            open.skip = applied.is_empty();
            open.identity = applied.join(SEGMENT_SEPARATOR);
        }
        if self.open.as_ref().is_some_and(|o| o.skip) {
            let open = self.open.take().ok_or_else(|| Error::invariant("open transaction vanished"))?;
            // A snapshot run found to be applied already may have begun a
            // ts (for a table it named): end it, with nothing in it.
            if let Some(ts) = open.ts {
                self.pool.commit(ts)?;
                self.commits.push_back((ts, open.first));
            }
            self.stats.skipped += 1;
            return Ok(());
        }
        self.apply_chunk()?;
        let open = self.open.take().ok_or_else(|| Error::invariant("open transaction vanished"))?;
        if let Some(ts) = open.ts {
            if let Some(us) = open.commit_us {
                self.engine.note_source_commit(ts, us);
            }
            self.pool.commit(ts)?;
            self.commits.push_back((ts, open.first));
            // Group commit: hand work to the shards in groups, not per transaction.
            if self.pool.pending_jobs() >= GROUP_JOBS || self.last_flush.elapsed() >= GROUP_LATENCY {
                self.pool.flush();
                self.last_flush = Instant::now();
            }
            self.applied.insert_entry(&open.identity);
            // The transaction is done with: its names move into the entry.
            let rows = open.rows_per_table.total();
            let tables = open.rows_per_table.into_sorted();
            self.history.push(HistoryEntry {
                ts,
                source_txid: open.identity,
                commit_us: open.commit_us,
                tables,
                rows,
                replayed_us: now_us(),
            });
        } else {
            self.applied.insert_entry(&open.identity);
        }
        self.stats.applied += 1;
        self.since_checkpoint += 1;
        Ok(())
    }

    /// Whether a source transaction with this identity was applied (it is
    /// within the dedup window of the history, or applied by this sink).
    pub fn is_applied(&self, identity: &str) -> bool {
        self.applied.contains(identity)
    }

    /// What this sink knows of mirror transaction `ts` (for an error about
    /// a replica that stopped advancing, see [`crate::Clock::stall`]): the
    /// source transaction it replays, where that began in the input and
    /// which tables it has touched so far; or that no transaction the sink
    /// is replaying has it.
    pub fn describe_ts(&self, ts: Ts) -> String {
        if let Some(open) = self.open.as_ref().filter(|o| o.ts == Some(ts)) {
            let tables = &open.per_table;
            let waits = match &open.end {
                Some(end) => format!(
                    "its END (at {}) reports {} events, {} arrived",
                    end.position,
                    end.event_count.map_or_else(|| "?".into(), |n| n.to_string()),
                    open.received
                ),
                None => format!("it waits for more of its records ({} arrived, no END yet)", open.received),
            };
            return format!(
                "source transaction {} begun at input position {} (tables {tables:?}), still open in the sink: {waits}",
                open.txid, open.first
            );
        }
        if let Some(c) = self.chunks.iter().find(|c| c.ts == ts) {
            return format!(
                "source transaction {} begun at input position {}, handed to the shard workers and not applied by them",
                c.txid, c.first
            );
        }
        if let Some((_, first)) = self.commits.iter().find(|(t, _)| *t == ts) {
            return format!(
                "the transaction begun at input position {first}, committed by the sink and not applied by the shard workers"
            );
        }
        "no transaction the sink is replaying: begun and never committed".into()
    }

    /// The engine this sink replays into.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Source transactions applied since the last checkpoint.
    pub fn since_checkpoint(&self) -> u64 {
        self.since_checkpoint
    }

    /// Writes a checkpoint when one is due, in the background (see
    /// [`Self::start_checkpoint`]), and commits one written meanwhile;
    /// with `force`, writes one now and waits until it is committed.
    pub fn maybe_checkpoint(&mut self, next: SourcePosition, force: bool) -> Result<()> {
        if force {
            return self.checkpoint_with(next, &mut |_| Ok(None));
        }
        self.finish_checkpoint(false)?;
        let due = self.since_checkpoint >= self.config.checkpoint_txns
            || (self.since_checkpoint > 0 && self.checkpoint_due.is_some_and(|due| Instant::now() >= due));
        if due {
            self.start_checkpoint(next, &mut |_| Ok(None))?;
        }
        Ok(())
    }

    /// Writes a checkpoint now and waits until it is committed (after the
    /// one being written, if any), resuming at `next` or at the first record
    /// still pending, whichever is earlier; `state` gives the input's state
    /// for the position the checkpoint resumes at (`None`: the state set
    /// with [`Self::set_source_state`]). A source that hands whole
    /// transactions over (Kinesis) needs the position: after a failed
    /// transaction, the checkpoint resumes before it.
    pub fn checkpoint_with(
        &mut self,
        next: SourcePosition,
        state: &mut dyn FnMut(SourcePosition) -> Result<Option<String>>,
    ) -> Result<()> {
        self.take_deferred()?;
        self.finish_checkpoint(true)?;
        // Nothing runs beside it: its shards are written at once.
        self.begin_checkpoint(next, state, true)?;
        self.finish_checkpoint(true)
    }

    /// The catalog pruning the next checkpoint does, if one is due (and
    /// when the one after is).
    fn take_prune(&mut self) -> Option<crate::catalog::Retention> {
        let retention = self.config.history_retention?;
        let now = Instant::now();
        if now < self.prune_due {
            return None;
        }
        self.prune_due = now + prune_interval(retention);
        Some(crate::catalog::Retention::older_than(retention, self.config.dedup_window))
    }

    /// True while a checkpoint is being written in the background.
    pub fn checkpoint_in_flight(&self) -> bool {
        self.writing.is_some()
    }

    /// Captures a checkpoint of everything handed to the shards (after
    /// waiting until they applied it) and writes it on a background
    /// thread while replay goes on; [`Self::poll_checkpoint`] commits it
    /// once written. Resumes at `next` or at the first record still
    /// pending, whichever is earlier (`state` as in
    /// [`Self::checkpoint_with`]). Returns false, doing nothing, while
    /// another is being written.
    pub fn start_checkpoint(
        &mut self,
        next: SourcePosition,
        state: &mut dyn FnMut(SourcePosition) -> Result<Option<String>>,
    ) -> Result<bool> {
        self.begin_checkpoint(next, state, false)
    }

    /// [`Self::start_checkpoint`]; with `waited_for`, the caller waits for
    /// it with nothing else to run, and its shards are written at once
    /// ([`crate::checkpoint::PendingCheckpoint::write_shards_at_once`]).
    fn begin_checkpoint(
        &mut self,
        next: SourcePosition,
        state: &mut dyn FnMut(SourcePosition) -> Result<Option<String>>,
        waited_for: bool,
    ) -> Result<bool> {
        if self.writing.is_some() {
            return Ok(false);
        }
        // Everything handed to the shards is applied and committed first;
        // after a failure the image stops before the failing transaction.
        let drained = self.drain();
        let mut resume = next;
        if let Some(o) = &self.open {
            resume = resume.min(o.first);
        }
        if let Some((_, first)) = self.failed_at {
            resume = resume.min(first);
        }
        for rows in self.held.values() {
            if let Some((p, _)) = rows.first() {
                resume = resume.min(*p);
            }
        }
        if self.failed_at.is_none() {
            drained?;
        }
        if let Some(at) = state(resume)? {
            self.source_state = Some(at);
        }
        let began = Instant::now();
        let mut pending = self.engine.capture_checkpoint()?;
        if waited_for {
            pending.write_shards_at_once();
        }
        let captured = began.elapsed();
        // History and operations up to here belong to this checkpoint; they
        // come back if it fails (a later checkpoint still owes them).
        let job = CheckpointJob {
            pending,
            catalog: Arc::clone(&self.catalog),
            commit: CatalogCommit {
                operations: std::mem::take(&mut self.operations),
                history: std::mem::take(&mut self.history),
                checkpoint: None,
            },
            input: self.input.clone(),
            resume,
            source_state: self.source_state.clone(),
            prune: self.take_prune(),
        };
        let thread = std::thread::Builder::new().name("fovea-checkpoint".into()).spawn(move || job.run())?;
        self.writing = Some(CheckpointInFlight { thread, resume, began, captured });
        self.since_checkpoint = 0;
        self.checkpoint_due = Instant::now().checked_add(self.config.checkpoint_interval);
        Ok(true)
    }

    /// Finishes the checkpoint being written if it is written (without
    /// waiting); returns how long it took from capture to commit when one
    /// was committed since the last call (now, or while records were
    /// pushed). An error (writing or committing failed) leaves the previous
    /// checkpoint in force and everything it owed to the next.
    pub fn poll_checkpoint(&mut self) -> Result<Option<Duration>> {
        self.take_deferred()?;
        self.finish_checkpoint(false)?;
        Ok(self.unreported.take())
    }

    /// Commits the checkpoint being written, once written (`wait`: waiting
    /// for that); its time goes to `unreported`.
    fn finish_checkpoint(&mut self, wait: bool) -> Result<()> {
        match &self.writing {
            None => return Ok(()),
            Some(w) if !wait && !w.thread.is_finished() => return Ok(()),
            Some(_) => {}
        }
        let CheckpointInFlight { thread, resume, began, captured } =
            self.writing.take().unwrap_or_else(|| unreachable!("matched Some"));
        let outcome = thread.join().map_err(|_| Error::invariant("the checkpoint writer panicked"))?;
        let manifest = match outcome.result {
            Ok(m) => m,
            Err(e) => {
                // Owed to the next checkpoint, before what came since.
                let CatalogCommit { mut operations, mut history, .. } = outcome.commit;
                operations.append(&mut self.operations);
                self.operations = operations;
                history.append(&mut self.history);
                self.history = history;
                return Err(e);
            }
        };
        self.checkpointed_at = Some(resume);
        self.stats.cleanup_failures += outcome.cleanup_failures;
        if let Some(e) = outcome.late {
            return Err(e);
        }
        if self.config.maintain_on_checkpoint {
            if let Err(e) = self.engine.gc() {
                self.stats.cleanup_failures += 1;
                tracing::warn!("memory GC after the checkpoint failed; the next round retries: {e}");
            }
            self.engine.combine()?;
        }
        tracing::debug!(
            ts = manifest.checkpoint_ts,
            capture_ms = captured.as_secs_f64() * 1e3,
            write_ms = outcome.written.as_secs_f64() * 1e3,
            commit_ms = outcome.committed.as_secs_f64() * 1e3,
            total_ms = began.elapsed().as_secs_f64() * 1e3,
            "checkpoint"
        );
        self.stats.checkpoints += 1;
        self.unreported = Some(began.elapsed());
        Ok(())
    }

    /// The table of a record, created on first sight from the DDL, the
    /// record's schema, or its values.
    fn table(&mut self, r: &RowChange, position: SourcePosition, txid: &str) -> Result<&TableShape> {
        if !self.tables.contains_key(r.table.as_str()) {
            let err = |m: String| input_error(position, Some(r.table.as_str()), Some(txid), m);
            // The source says the table has no key where its declaration
            // names none, or where a record's key is null.
            let (fields, pk, keyless): (Vec<Field>, Vec<String>, bool) = if let Some(d) = self.ddl.get(r.table.as_str())
            {
                (
                    d.columns.iter().map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable)).collect(),
                    d.primary_key.clone(),
                    true,
                )
            } else {
                let pk = r.key_names.clone().unwrap_or_default();
                let fields = match &r.declared {
                    Some(cols) => cols
                        .iter()
                        .map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable || !pk.contains(&c.name)))
                        .collect(),
                    None => {
                        let image = r
                            .after
                            .as_ref()
                            .or(r.before.as_ref())
                            .ok_or_else(|| err("first record has no row image".into()))?;
                        image
                            .iter()
                            .map(|(name, v)| {
                                let t = if v.as_str() == Some(UNAVAILABLE) { None } else { infer_type(v) };
                                Field::new(name, t.unwrap_or(DataType::Utf8), !pk.contains(name))
                            })
                            .collect()
                    }
                };
                let keyless = r.key_names.as_ref().is_some_and(Vec::is_empty);
                (fields, pk, keyless)
            };
            self.create_table(r.table.as_str(), fields, pk, keyless, None, &err)?;
        }
        Ok(&self.tables[r.table.as_str()])
    }

    /// [`ChangeRecord::Replace`]: in the open transaction, deletes every
    /// live row of the table and gives it the declared columns.
    fn replace_table(&mut self, r: &RowChange, position: SourcePosition) -> Result<()> {
        let txid = r.txid.clone().unwrap_or_default();
        let err = |m: String| input_error(position, Some(r.table.as_str()), Some(&txid), m);
        let open = self.open.as_ref().filter(|o| o.kind == TxnKind::Metadata && o.txid == txid);
        let Some(open) = open else {
            return Err(err("a table's rows can be replaced only inside its transaction".into()));
        };
        if open.rows_per_table.contains(r.table.as_str()) || open.segments.is_some() {
            return Err(err("a table's rows are replaced before any row of it in the transaction".into()));
        }
        if open.skip {
            // Applied before, its replacement with it. (Going on would begin
            // a ts of its own for the new definition that nothing commits:
            // HWM would stop there for good.)
            return Ok(());
        }
        if !self.tables.contains_key(r.table.as_str()) {
            self.table(r, position, &txid)?;
            return Ok(());
        }
        let declared = r.declared.as_ref().ok_or_else(|| err("a replaced table needs its declared columns".into()))?;
        // Every live row goes (none is this transaction's: checked above).
        let def = Arc::clone(&self.tables[r.table.as_str()].def);
        let deleted = self.delete_every_row(&def, position)?;
        self.apply_chunk()?;
        self.drain()?;
        let key = r
            .key_names
            .clone()
            .unwrap_or_else(|| def.primary_key.iter().map(|&i| def.schema.field(i).name().clone()).collect());
        let fields: Vec<Field> = declared
            .iter()
            .map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable || !key.contains(&c.name)))
            .collect();
        let changed: Vec<String> = fields
            .iter()
            .filter(|f| def.schema.field_with_name(f.name()).is_ok_and(|o| o.data_type() != f.data_type()))
            .map(|f| format!("{} {}", f.name(), f.data_type()))
            .collect();
        // The open transaction's (checked above): the new definition shows
        // from its commit on.
        let ts = self.open_ts()?;
        let new = self
            .engine
            .reshape_table(r.table.as_str(), Arc::new(Schema::new(fields)), ts)
            .map_err(|e| err(format!("replacing the table's rows: {e}")))?;
        self.operations.push(CatalogOperation {
            description: format!("replace rows of {} (copied again from the source)", r.table),
            actions: serde_json::json!([{ "replace_table": r.table.as_str(), "deleted": deleted, "retyped": changed }]),
            ts,
        });
        self.tables.insert(r.table.to_string(), TableShape::new(new));
        self.by_content.remove(&def.id);
        Ok(())
    }

    /// [`ChangeRecord::Drop`]: drops table `name` in the open transaction
    /// `txid`. A table the mirror does not have has nothing to drop.
    fn drop_table(&mut self, name: &str, txid: &str, position: SourcePosition) -> Result<()> {
        let err = |m: &str| input_error(position, Some(name), Some(txid), m.to_owned());
        let open = self.open.as_ref().filter(|o| o.kind == TxnKind::Metadata && o.txid == txid);
        let Some(open) = open else {
            return Err(err("a table can be dropped only inside its transaction"));
        };
        if open.skip || !self.tables.contains_key(name) {
            return Ok(());
        }
        // The transaction's operations before the drop go in first.
        self.apply_chunk()?;
        self.drain()?;
        let ts = self.open_ts()?;
        self.engine.drop_table_at(name, ts).map_err(|e| err(&format!("dropping the table: {e}")))?;
        if let Some(t) = self.tables.remove(name) {
            self.by_content.remove(&t.def.id);
            self.next_rowid.remove(&t.def.id);
        }
        self.operations.push(CatalogOperation {
            description: format!("drop table {name}"),
            actions: serde_json::json!([{ "drop_table": name }]),
            ts,
        });
        Ok(())
    }

    /// Creates table `name` in mirror transaction `ts` (`None`: see
    /// [`Self::table_ts`]) and records the catalog operation. Without a
    /// primary key, a table the source says has none (`keyless`) gets the
    /// hidden key [`ROWID_COLUMN`]; any other is refused, as its key is
    /// unknown.
    fn create_table(
        &mut self,
        name: &str,
        mut fields: Vec<Field>,
        mut pk: Vec<String>,
        keyless: bool,
        ts: Option<Ts>,
        err: &dyn Fn(String) -> Error,
    ) -> Result<()> {
        if pk.is_empty() {
            if !keyless {
                return Err(err("no primary key is known for this table (the record has no key). Help: pass --schema-file with the table's CREATE TABLE … PRIMARY KEY (a table declared there without one is keyed by a hidden row id)".into()));
            }
            if fields.iter().any(|f| f.name() == ROWID_COLUMN) {
                return Err(err(format!(
                    "a table without a primary key cannot have a column named {ROWID_COLUMN}: fovea keys such tables by a hidden column of that name"
                )));
            }
            fields.push(Field::new(ROWID_COLUMN, DataType::Int64, false));
            pk.push(ROWID_COLUMN.to_owned());
        }
        let pk_idx = pk
            .iter()
            .map(|k| {
                fields.iter().position(|f| f.name() == k).ok_or_else(|| err(format!("key column {k} is not a column")))
            })
            .collect::<Result<Vec<_>>>()?;
        let schema = Arc::new(Schema::new(fields));
        let (ts, own) = match ts {
            Some(ts) => (ts, false),
            None => self.table_ts()?,
        };
        let created = self.engine.create_table_at(name, schema, pk_idx, ts);
        if own {
            // Committed even when the table was refused: a ts left open
            // would hold HWM back.
            self.pool.commit(ts)?;
            self.since_checkpoint += 1;
        }
        let def = created.map_err(|e| err(e.to_string()))?;
        if hidden_rowid(&def).is_some() {
            // A new table: its rows are this run's from the first.
            self.next_rowid.insert(def.id, 1);
        }
        self.operations.push(CatalogOperation {
            description: format!("create table {name}"),
            actions: serde_json::json!([{ "add_table": name, "columns": def.schema.fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>() }]),
            ts,
        });
        self.tables.insert(name.to_owned(), TableShape::new(def));
        Ok(())
    }

    /// Columns the source declares in another type than the table's
    /// (`ALTER COLUMN … TYPE`): index, name, the declared type and what it
    /// needs ([`TypeChange::Widen`]: the column widens in place;
    /// [`TypeChange::Recopy`]: the column keeps its type, which must hold
    /// each new value, see [`Sink::evolve_if_needed`]). A `--schema-file`
    /// table keeps the types its file declares.
    fn retyped_columns(&self, r: &RowChange) -> Vec<Retyped> {
        let (Some(declared), Some(t)) = (r.declared.as_ref(), self.tables.get(r.table.as_str())) else {
            return Vec::new();
        };
        if self.ddl.contains_key(r.table.as_str()) {
            return Vec::new();
        }
        let fields = t.def.schema.fields();
        declared
            .iter()
            .enumerate()
            .filter_map(|(hint, c)| {
                let i = t.column(hint, &c.name)?;
                let current = fields[i].data_type();
                if *current == c.data_type {
                    return None;
                }
                match TypeChange::of(current, &c.data_type, t.def.primary_key.contains(&i)) {
                    TypeChange::None => None,
                    change => Some(Retyped { index: i, name: c.name.clone(), to: c.data_type.clone(), change }),
                }
            })
            .collect()
    }

    /// The type a column kept in its type (the source declares `declared`)
    /// must widen to for this record's values of it: `None` while each
    /// converts exactly into the column's type; else the narrowest type it
    /// can widen to in place that holds them (text last). An error names
    /// the value when no type does.
    fn widening_for_kept(
        t: &TableShape,
        r: &RowChange,
        kept: &Retyped,
        err: &dyn Fn(String) -> Error,
    ) -> Result<Option<DataType>> {
        let current = t.def.schema.field(kept.index).data_type();
        let key = t.def.primary_key.contains(&kept.index);
        let values: Vec<Value> = [r.key.as_ref(), r.before.as_ref(), r.after.as_ref()]
            .into_iter()
            .flatten()
            .flat_map(|cols| cols.iter())
            .filter(|(n, v)| *n == kept.name && !v.is_null() && v.as_str() != Some(UNAVAILABLE))
            .map(|(_, v)| to_value(v, &kept.to).map_err(|m| err(format!("column {}: {m}", kept.name))))
            .collect::<Result<_>>()?;
        let holds = |to: &DataType| values.iter().all(|v| convert_exact(v, &kept.to, to).is_some());
        if holds(current) {
            return Ok(None);
        }
        narrowest_widening(current, key, true, holds).map(Some).ok_or_else(|| {
            let value = values.iter().find(|v| convert_exact(v, &kept.to, current).is_none());
            err(format!(
                "column {} changed type from {current} to {}, and its value {} converts exactly neither to \
                     {current} nor to a type the replicated rows widen to in place. Help: a PostgreSQL input copies \
                     such a table again by itself; for this input, replicate the table into a new lake from a fresh \
                     snapshot",
                kept.name,
                kept.to,
                value.map_or_else(String::new, ToString::to_string),
            ))
        })
    }

    /// Columns added to, gone from or widened in the source table show in
    /// the after image and the declared columns: evolve the table's schema
    /// to match. A column the source declares in a type the replicated rows
    /// cannot be converted to exactly (bigint → int, text → int,
    /// timestamp → date) keeps its type, which holds the old rows and —
    /// converted exactly — the new values; a new value it cannot hold
    /// widens it in place to the narrowest type that holds both (text
    /// last), and one no such type holds is an error naming the column and
    /// the value. (A PostgreSQL input copies such a table again instead,
    /// see [`ChangeRecord::Replace`].)
    ///
    /// Returns the columns kept in another type than the declared one: the
    /// record's values of them are converted (see [`Sink::image`]).
    fn evolve_if_needed(&mut self, r: &RowChange, position: SourcePosition, txid: &str) -> Result<Vec<Retyped>> {
        let err = |m: String| input_error(position, Some(r.table.as_str()), Some(txid), m);
        let mut retyped = self.retyped_columns(r);
        let Some(after) = r.after.as_ref().filter(|_| r.op != RowOp::Delete) else {
            // A delete reads its key alone, converted exactly from the
            // declared type where it differs.
            return Ok(retyped);
        };
        let t = &self.tables[r.table.as_str()];
        let mut kept = Vec::new();
        for c in std::mem::take(&mut retyped) {
            if c.change == TypeChange::Widen {
                retyped.push(c);
            } else if let Some(to) = Self::widening_for_kept(t, r, &c, &err)? {
                retyped.push(Retyped { to, change: TypeChange::Widen, ..c });
            } else {
                kept.push(c);
            }
        }
        let added: Vec<&(String, serde_json::Value)> = after.iter().filter(|(n, _)| t.index_of(n).is_none()).collect();
        // Left out of an image that omits NULLs, a column is NULL, not gone;
        // a hidden row id is fovea's, never the source's.
        let hidden = hidden_rowid(&t.def);
        let gone: Vec<String> = if r.omits_nulls {
            Vec::new()
        } else {
            t.def
                .schema
                .fields()
                .iter()
                .enumerate()
                .filter(|&(i, f)| Some(i) != hidden && !after.iter().any(|(a, _)| a == f.name()))
                .map(|(_, f)| f.name().clone())
                .collect()
        };
        if r.declared.is_none() {
            retyped.extend(widened_by_values(t, after));
        }
        if added.is_empty() && gone.is_empty() && retyped.is_empty() {
            return Ok(kept);
        }
        let added: Vec<(String, serde_json::Value)> = added.into_iter().cloned().collect();
        self.evolve(r, position, txid, &added, gone, retyped)
    }

    /// Evolves `r`'s table: columns `added` (with a value each, for its
    /// type when none is declared), `gone` and `retyped` (widened in place).
    /// Returns the columns the record declares in another type than the
    /// evolved table's (kept, see [`Sink::evolve_if_needed`]).
    fn evolve(
        &mut self,
        r: &RowChange,
        position: SourcePosition,
        txid: &str,
        added: &[(String, serde_json::Value)],
        gone: Vec<String>,
        retyped: Vec<Retyped>,
    ) -> Result<Vec<Retyped>> {
        // Operations built with the old schema go in first (a snapshot
        // run's waiting ones too).
        self.settle_segments(None)?;
        self.apply_chunk()?;
        self.drain()?;
        let t = &self.tables[r.table.as_str()];
        let mut fields: Vec<Field> = t
            .def
            .schema
            .fields()
            .iter()
            .filter(|f| !gone.contains(f.name()))
            .map(|f| match retyped.iter().find(|c| c.name == *f.name()) {
                Some(c) => f.as_ref().clone().with_data_type(c.to.clone()),
                None => f.as_ref().clone(),
            })
            .collect();
        for (name, v) in added {
            let declared =
                r.declared.as_ref().and_then(|d| d.iter().find(|c| &c.name == name)).map(|c| c.data_type.clone());
            let t = declared.or_else(|| infer_type(v)).unwrap_or(DataType::Utf8);
            fields.push(Field::new(name.as_str(), t, true));
        }
        // Part of the open transaction (or one of its own): the change shows
        // from that transaction's commit on, and nowhere if it fails.
        let (ts, own) = self.table_ts()?;
        let evolved = self.engine.evolve_table(r.table.as_str(), Arc::new(Schema::new(fields)), ts);
        if own {
            self.pool.commit(ts)?;
            self.since_checkpoint += 1;
        }
        let def = evolved
            .map_err(|e| input_error(position, Some(r.table.as_str()), Some(txid), format!("schema change: {e}")))?;
        self.operations.push(CatalogOperation {
            description: format!("evolve schema of {}", r.table),
            actions: serde_json::json!([{
                "evolve_schema": r.table.as_str(),
                "added": added.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                "removed": gone,
                "widened": retyped.iter().map(|c| serde_json::json!({ "column": c.name, "type": c.to.to_string() })).collect::<Vec<_>>(),
            }]),
            ts,
        });
        self.tables.insert(r.table.to_string(), TableShape::new(def));
        Ok(self.retyped_columns(r))
    }

    /// A full row in table order; `None` entries are TOAST placeholders.
    /// `kept`: columns the record declares in another type than the
    /// table's, whose values are converted exactly.
    fn image(
        t: &TableShape,
        cols: &Columns,
        kept: &[Retyped],
        err: &dyn Fn(String) -> Error,
    ) -> Result<Vec<Option<Value>>> {
        let mut row = vec![Some(Value::Null); t.def.schema.fields().len()];
        for (hint, (name, v)) in cols.iter().enumerate() {
            let i = t.column(hint, name).ok_or_else(|| {
                err(format!("column {name} is not in the table (schema changes are not supported yet). Help: start a new lake, or add the column to --schema-file"))
            })?;
            if v.as_str() == Some(UNAVAILABLE) {
                row[i] = None;
                continue;
            }
            row[i] = Some(Self::value(t, i, v, kept).map_err(|m| err(format!("column {name}: {m}")))?);
        }
        Ok(row)
    }

    /// The value of column `i` of `t` from `v`: in the declared type when
    /// the column is kept in another, converted exactly.
    #[inline]
    fn value(t: &TableShape, i: usize, v: &serde_json::Value, kept: &[Retyped]) -> std::result::Result<Value, String> {
        let column = t.def.schema.field(i).data_type();
        match kept.iter().find(|c| c.index == i) {
            None => to_value(v, column),
            Some(c) => {
                let declared = to_value(v, &c.to)?;
                convert_exact(&declared, &c.to, column).ok_or_else(|| {
                    format!("value {declared} of the source's type {} does not convert exactly to {column}", c.to)
                })
            }
        }
    }

    fn key_values(t: &TableShape, r: &RowChange, kept: &[Retyped], err: &dyn Fn(String) -> Error) -> Result<Row> {
        let sources = [r.key.as_ref(), r.before.as_ref(), r.after.as_ref()];
        t.def
            .primary_key
            .iter()
            .map(|&i| {
                let f = t.def.schema.field(i);
                let v = sources
                    .iter()
                    .flatten()
                    .find_map(|cols| cols.iter().find(|(n, v)| n == f.name() && !v.is_null()).map(|(_, v)| v))
                    .ok_or_else(|| err(format!("no value for key column {}", f.name())))?;
                Self::value(t, i, v, kept).map_err(|m| err(format!("key column {}: {m}", f.name())))
            })
            .collect()
    }

    fn op_of(&mut self, r: &RowChange, position: SourcePosition, txid: &str) -> Result<Op> {
        let err = |m: String| input_error(position, Some(r.table.as_str()), Some(txid), m);
        self.table(r, position, txid)?;
        let kept = self.evolve_if_needed(r, position, txid)?;
        let t = &self.tables[r.table.as_str()];
        let id = t.def.id;
        // A table without a primary key: its rows are keyed by a hidden row
        // id, which a record carries only from PostgreSQL's replication.
        let hidden = hidden_rowid(&t.def);
        let rowid = hidden.filter(|&i| {
            let name = t.def.schema.field(i).name();
            ![&r.key, &r.before, &r.after].into_iter().flatten().flatten().any(|(n, _)| n == name)
        });
        if hidden.is_some() && matches!(r.op, RowOp::Update | RowOp::Delete) {
            if let Some(i) = rowid {
                return self.change_by_old_image(r, i, &kept, &err);
            }
            // The record names the hidden row id itself: the content map,
            // if any, cannot tell which row that is until it is rebuilt.
            self.by_content.remove(&id);
        }
        let t = &self.tables[r.table.as_str()];
        Ok(match r.op {
            RowOp::Insert | RowOp::SnapshotRead => {
                let after = r.after.as_ref().ok_or_else(|| err("insert without an after image".into()))?;
                let mut row = Self::image(t, after, &kept, &err)?;
                if let Some(i) = rowid {
                    let def = Arc::clone(&t.def);
                    row[i] = Some(Value::Int(self.next_rowid(&def, i).map_err(|e| err(e.to_string()))?));
                }
                let t = &self.tables[r.table.as_str()];
                if row.iter().any(Option::is_none) {
                    // Debezium sends a primary-key change as a delete of
                    // the old key, a tombstone and a create of the new key,
                    // whose unchanged out-of-line values are placeholders
                    // (a real insert never has any): the old key's row
                    // holds them. The pair becomes one update that moves
                    // the row to the new key, as pgoutput's key change is.
                    let def = Arc::clone(&t.def);
                    let old_key = match r.op {
                        RowOp::Insert => self.take_trailing_delete(id, r.table.as_str()),
                        _ => None,
                    };
                    let Some(old_key) = old_key else {
                        return Err(err(format!(
                            "insert with {UNAVAILABLE:?}: there is no previous value to keep (a key change's create follows the delete of the old key, and none came right before it)"
                        )));
                    };
                    let row = self.with_unchanged_values(&def, &old_key, row)?.ok_or_else(|| {
                        err(format!(
                            "key change from {} keeps unchanged values, but the old key has no row",
                            render_key(&old_key)
                        ))
                    })?;
                    return Ok(Op::Update { table: id, key: old_key, row });
                }
                let row = row.into_iter().flatten().collect();
                // A snapshot record reads the row as it is now: it replaces
                // whatever an earlier load or change left under its key.
                if r.op == RowOp::SnapshotRead { Op::Upsert { table: id, row } } else { Op::Insert { table: id, row } }
            }
            RowOp::Delete => Op::Delete { table: id, key: Self::key_values(t, r, &kept, &err)? },
            RowOp::Truncate => return Err(Error::invariant("a truncate is applied by Sink::truncate, not as one row")),
            RowOp::Update => {
                let after = r.after.as_ref().ok_or_else(|| err("update without an after image".into()))?;
                let key = Self::key_values(t, r, &kept, &err)?;
                let image = Self::image(t, after, &kept, &err)?;
                let row = if image.iter().any(Option::is_none) {
                    let def = Arc::clone(&t.def);
                    self.with_unchanged_values(&def, &key, image)?.ok_or_else(|| {
                        err(format!(
                            "update of key {} keeps unchanged values, but the key has no row",
                            render_key(&key)
                        ))
                    })?
                } else {
                    image.into_iter().flatten().collect()
                };
                Op::Update { table: id, key, row }
            }
        })
    }

    /// The operation of `r`, an update or delete of a table without a
    /// primary key (its hidden row id being column `rowid`), which names
    /// its row by the whole old image: PostgreSQL sends one for a table
    /// whose replica identity is FULL, and refuses such changes to any
    /// other table without a key. Any live row equal to the old image in
    /// every column is the one changed (equal rows cannot be told apart).
    fn change_by_old_image(
        &mut self,
        r: &RowChange,
        rowid: usize,
        kept: &[Retyped],
        err: &dyn Fn(String) -> Error,
    ) -> Result<Op> {
        let what = if r.op == RowOp::Update { "UPDATE" } else { "DELETE" };
        let t = &self.tables[r.table.as_str()];
        let def = Arc::clone(&t.def);
        let refused = |lacking: String| {
            err(format!(
                "{what} on a table without a primary key whose old row image {lacking}: such a row can be found only by its whole old image (REPLICA IDENTITY FULL in PostgreSQL). Help: ALTER TABLE … REPLICA IDENTITY FULL in the source, give the table a primary key, or declare one for it in --schema-file"
            ))
        };
        let before = r.before.as_ref().ok_or_else(|| refused("is missing".into()))?;
        let image = Self::image(t, before, kept, err)?;
        let old: Row = image
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                _ if i == rowid => Ok(Value::Null),
                Some(v) => Ok(v),
                None => Err(refused(format!("lacks the value of column {}", def.schema.field(i).name()))),
            })
            .collect::<Result<_>>()?;
        if let Some(f) = def
            .schema
            .fields()
            .iter()
            .enumerate()
            .find(|&(i, f)| i != rowid && !before.iter().any(|(n, _)| n == f.name()))
            .map(|(_, f)| f)
            .filter(|_| !r.omits_nulls)
        {
            return Err(refused(format!("lacks column {}", f.name())));
        }
        let rows = self.rows_by_content(&def, rowid)?;
        let id = rows.find(rows.hash(&old)).ok_or_else(|| {
            err(format!(
                "{what} of a row that the table (without a primary key) does not hold: no live row equals the old image"
            ))
        })?;
        let key = vec![Value::Int(id)];
        if r.op == RowOp::Delete {
            return Ok(Op::Delete { table: def.id, key });
        }
        let t = &self.tables[r.table.as_str()];
        let after = r.after.as_ref().ok_or_else(|| err("update without an after image".into()))?;
        let mut image = Self::image(t, after, kept, err)?;
        image[rowid] = Some(Value::Int(id));
        let row = if image.iter().any(Option::is_none) {
            self.with_unchanged_values(&def, &key, image)?.ok_or_else(|| {
                err(format!("update of the row with hidden id {id} keeps unchanged values, but it has no row"))
            })?
        } else {
            image.into_iter().flatten().collect()
        };
        Ok(Op::Update { table: def.id, key, row })
    }

    /// The next hidden row id of `def`, a table without a primary key whose
    /// column `column` holds them. The first a run needs for a table it did
    /// not create is one past the largest the table holds once everything
    /// handed to the shards is applied: every row this run inserts into the
    /// table gets its id here, so none of them is missed.
    fn next_rowid(&mut self, def: &crate::schema::TableDef, column: usize) -> Result<i64> {
        let next = match self.next_rowid.get(&def.id) {
            Some(&next) => next,
            None => {
                let mut largest = 0i64;
                let options = crate::ScanOptions { projection: Some(vec![column]), ..Default::default() };
                for batch in self.scan_with_own_writes(&def.name, options)?.into_iter().flatten() {
                    let batch = batch?;
                    let ids = batch.column(0).as_any().downcast_ref::<Int64Array>().ok_or_else(|| {
                        Error::invariant(format!("{} of {} is not a 64-bit integer column", ROWID_COLUMN, def.name))
                    })?;
                    largest = largest.max(arrow::compute::max(ids).unwrap_or(0));
                }
                largest
                    .checked_add(1)
                    .ok_or_else(|| Error::invariant(format!("{ROWID_COLUMN} of {} is exhausted", def.name)))?
            }
        };
        let after = next
            .checked_add(1)
            .ok_or_else(|| Error::invariant(format!("{ROWID_COLUMN} of {} is exhausted", def.name)))?;
        self.next_rowid.insert(def.id, after);
        Ok(next)
    }

    /// `image` with its unchanged out-of-line values (`None`) taken from
    /// the newest row under `key`, or `None` if the key has no row. That
    /// row may be in this transaction's pending chunk: it is applied first.
    fn with_unchanged_values(
        &mut self,
        def: &crate::schema::TableDef,
        key: &[Value],
        image: Vec<Option<Value>>,
    ) -> Result<Option<Row>> {
        self.apply_chunk()?;
        self.drain()?;
        Ok(self
            .engine
            .latest_row(def, key)?
            .map(|prev| image.into_iter().zip(prev).map(|(new, old)| new.unwrap_or(old)).collect()))
    }

    /// The key of the open transaction's last pending operation if it is a
    /// delete in table `name` (`id`), taken back: the first half of a Debezium
    /// key change (see `op_of`). It is no longer counted in the table's rows.
    fn take_trailing_delete(&mut self, id: crate::ids::TableId, name: &str) -> Option<Row> {
        let open = self.open.as_mut()?;
        if !matches!(open.ops.last(), Some(Op::Delete { table, .. }) if *table == id) {
            return None;
        }
        let (Some(Op::Delete { key, .. }), Some(_)) = (open.ops.pop(), open.op_positions.pop()) else { return None };
        open.rows_per_table.take_back(name);
        Some(key)
    }
}

/// The operation of a row read against its table's current definition
/// (checked by the caller): what [`Sink::op_of`] makes of the same record.
fn typed_op(op: RowOp, typed: crate::cdc::typed::TypedRow) -> Result<Op> {
    let table = typed.table;
    Ok(match op {
        RowOp::Insert => Op::Insert { table, row: typed.row },
        RowOp::SnapshotRead => Op::Upsert { table, row: typed.row },
        RowOp::Update => Op::Update { table, key: typed.key, row: typed.row },
        RowOp::Delete => Op::Delete { table, key: typed.key },
        RowOp::Truncate => return Err(Error::invariant("a truncate has no row to read typed")),
    })
}

impl OpenTxn {
    fn new(
        identity: String,
        txid: String,
        kind: TxnKind,
        first: SourcePosition,
        skip: bool,
        commit_us: Option<i64>,
        capacity: usize,
    ) -> Self {
        OpenTxn {
            segments: (kind == TxnKind::Snapshot).then(Vec::new),
            identity,
            txid,
            kind,
            first,
            skip,
            ts: None,
            ops: Vec::with_capacity(capacity),
            op_positions: Vec::with_capacity(capacity),
            received: 0,
            per_table: TableCounts::default(),
            rows_per_table: TableCounts::default(),
            commit_us,
            end: None,
        }
    }
}

/// Feeds what identifies a snapshot record to a run's identity digest: the
/// table, the source transaction and time, and the key and images (JSON
/// text, in the record's column order). Not the snapshot marker (`first`,
/// `last`): it says where a record sits in a run, not what it is.
fn digest_row(h: &mut XxHash64, r: &RowChange) {
    let field = |h: &mut XxHash64, bytes: &[u8]| {
        h.write_u64(bytes.len() as u64);
        h.write(bytes);
    };
    field(h, r.table.as_bytes());
    field(h, r.txid.as_deref().unwrap_or("").as_bytes());
    h.write_i64(r.commit_us.unwrap_or(i64::MIN));
    for image in [&r.key, &r.before, &r.after] {
        match image {
            None => h.write_u8(0),
            Some(cols) => {
                h.write_u8(1);
                h.write_u64(cols.len() as u64);
                for (name, v) in cols {
                    field(h, name.as_bytes());
                    field(h, v.to_string().as_bytes());
                }
            }
        }
    }
}

/// Columns of `t` whose value in `after` does not fit the column's type
/// but fits a wider one the column may widen to in place (the narrowest
/// such): a record without declared types (DMS, Debezium without schemas)
/// shows an `ALTER COLUMN … TYPE` of the source only this way, since the
/// source holds no value its column's type cannot.
fn widened_by_values(t: &TableShape, after: &Columns) -> Vec<Retyped> {
    let fields = t.def.schema.fields();
    after
        .iter()
        .filter(|(_, v)| !v.is_null() && v.as_str() != Some(UNAVAILABLE))
        .filter_map(|(name, v)| {
            let i = t.index_of(name)?;
            let current = fields[i].data_type();
            let fits = |to: &DataType| to_value(v, to).is_ok_and(|x| crate::schema::accepts(to, &x).is_ok());
            if fits(current) {
                return None;
            }
            narrowest_widening(current, t.def.primary_key.contains(&i), false, fits).map(|to| Retyped {
                index: i,
                name: name.clone(),
                to,
                change: TypeChange::Widen,
            })
        })
        .collect()
}

/// The narrowest type `current` (a key column's if `key`) widens to in
/// place that `holds` the values at hand, among the wider numbers, dates
/// and decimals of [`wider_types`] — and text last with `or_text` (for
/// records whose declared type says the change is the source's, not a
/// wrong value).
fn narrowest_widening(
    current: &DataType,
    key: bool,
    or_text: bool,
    holds: impl Fn(&DataType) -> bool,
) -> Option<DataType> {
    wider_types(current)
        .into_iter()
        .chain(or_text.then_some(DataType::Utf8))
        .find(|to| TypeChange::of(current, to, key) == TypeChange::Widen && holds(to))
}

/// The types `t` may widen to, narrowest first.
fn wider_types(t: &DataType) -> Vec<DataType> {
    use DataType::*;
    match t {
        Int8 => vec![Int16, Int32, Int64],
        Int16 => vec![Int32, Int64],
        Int32 => vec![Int64],
        Float16 => vec![Float32, Float64],
        Float32 => vec![Float64],
        Decimal128(p, s) => (*p + 1..=38).map(|p| Decimal128(p, *s)).collect(),
        Date32 => vec![Timestamp(arrow::datatypes::TimeUnit::Microsecond, None)],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Per-table counts agree with a map of them after every step,
        /// over few tables (searched in the list) and many (indexed).
        #[test]
        fn table_counts_count_as_a_map(
            steps in proptest::collection::vec((0usize..40, any::<bool>()), 0..400),
            tables in 1usize..40,
        ) {
            let mut counts = TableCounts::default();
            let mut model: std::collections::BTreeMap<String, u64> = Default::default();
            // Names inline in a SmolStr (up to 23 bytes) and past it.
            let name_of = |t: usize| {
                if t.is_multiple_of(2) { format!("s.t{t}") } else { format!("schema_with_a_long_name.table_{t}") }
            };
            for (t, take_back) in steps {
                let name = name_of(t % tables);
                if take_back {
                    counts.take_back(&name);
                    if let Some(n) = model.get_mut(&name) {
                        *n = n.saturating_sub(1);
                    }
                } else {
                    counts.bump(&name);
                    *model.entry(name.clone()).or_default() += 1;
                }
                prop_assert_eq!(counts.get(&name), model.get(&name).copied().unwrap_or(0));
                prop_assert_eq!(counts.contains(&name), model.contains_key(&name));
                prop_assert_eq!(counts.total(), model.values().sum::<u64>());
            }
            for t in 0..tables {
                let name = name_of(t);
                prop_assert_eq!(counts.get(&name), model.get(&name).copied().unwrap_or(0));
            }
            prop_assert_eq!(counts.into_sorted(), model.into_iter().collect::<Vec<_>>());
        }
    }

    /// The window keeps the newest `capacity` source transactions and every
    /// snapshot run, by identity (as the sink and a restart's catalog
    /// history fill it).
    #[test]
    fn the_applied_window_keeps_the_newest_transactions_and_every_snapshot() {
        let mut w = AppliedWindow::new(3);
        let snapshot = format!("{SNAPSHOT_IDENTITY_PREFIX}00000000000000ff:public.t");
        w.insert_entry(&format!("{snapshot}{SEGMENT_SEPARATOR}{SNAPSHOT_IDENTITY_PREFIX}01:public.u"));
        for id in ["1:0/10", "2:0/20", "3:0/30"] {
            w.insert(id);
        }
        // Seen again: not a second place in the order.
        w.insert("2:0/20");
        assert!(["1:0/10", "2:0/20", "3:0/30"].iter().all(|id| w.contains(id)));
        w.insert("4:0/40");
        assert!(!w.contains("1:0/10"), "the oldest leaves the window");
        assert!(["2:0/20", "3:0/30", "4:0/40"].iter().all(|id| w.contains(id)));
        w.insert("5:0/50");
        assert!(!w.contains("2:0/20"));
        assert!(w.contains(&snapshot) && w.contains(&format!("{SNAPSHOT_IDENTITY_PREFIX}01:public.u")));
        assert!(!w.contains("5:0/5"), "identities are compared whole");
        assert_eq!((w.order.len(), w.set.len()), (3, 5));
    }
}
