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

use arrow::datatypes::Field;

use crate::catalog::{Catalog, CatalogOperation, HistoryEntry, now_us};
use crate::cdc::ddl::TableDdl;
use crate::cdc::typed::TableShape;
use crate::cdc::{ChangeRecord, RowChange, RowOp, SourcePosition, hidden_rowid, input_error};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::ids::{TableId, Ts};
use crate::replay::Op;
use crate::schema::{TableDef, Value};
use crate::workers::{ShardPool, WorkerError};
use rows_by_content::RowsByContent;
use smol_str::SmolStr;
use twox_hash::XxHash64;

mod checkpointing;
mod dedup;
mod rows;
mod rows_by_content;
mod tables;

use checkpointing::*;
pub use dedup::SNAPSHOT_IDENTITY_ROWS;
use dedup::*;
use rows::*;
use tables::*;

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
    /// Told of committed checkpoints, after their commit, on the
    /// checkpoint's writer thread (an open table format's publisher).
    pub publisher: Option<Arc<dyn CheckpointPublisher>>,
    /// The publisher is told of a checkpoint at most once per this long
    /// (zero: every checkpoint); a checkpoint the caller waits for (the
    /// last at a stop) and the one after a failed publication always are.
    pub publish_interval: Duration,
}

/// Publishes committed checkpoints elsewhere (as Iceberg tables, say).
///
/// Contract: [`Self::publish`] is called once per committed checkpoint it
/// is given (every one, or at most one per
/// [`SinkConfig::publish_interval`]), in commit order, on the checkpoint's
/// writer thread, after the commit and the clean-up of older checkpoints;
/// never for a checkpoint that failed.
/// The checkpoint is durable whatever it does: an error is logged and
/// counted, the replay goes on, and the next checkpoint is published in
/// full again (so a publisher keeps no state that a failure could leave
/// half-made).
pub trait CheckpointPublisher: Send + Sync + std::fmt::Debug {
    /// Publishes `checkpoint`.
    fn publish(&self, checkpoint: &crate::catalog::CheckpointRecord) -> std::result::Result<(), String>;
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
            publisher: None,
            publish_interval: Duration::ZERO,
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
    /// Committed checkpoints the publisher failed to publish (the next
    /// one publishes again).
    pub publish_failures: u64,
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
    /// When a checkpoint is next published ([`SinkConfig::publish_interval`]).
    publish_due: Instant,
}

impl crate::cdc::source::RecordSink for Sink {
    fn push(&mut self, record: ChangeRecord, position: SourcePosition, next: SourcePosition) -> Result<()> {
        Sink::push(self, record, position, next)
    }

    fn is_applied(&self, identity: &str) -> bool {
        Sink::is_applied(self, identity)
    }

    fn set_source_state(&mut self, state: Option<String>) {
        Sink::set_source_state(self, state);
    }

    fn sync(&mut self) -> Result<()> {
        Sink::sync(self)
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
            // The first checkpoint is published.
            publish_due: Instant::now(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::SNAPSHOT_IDENTITY_PREFIX;
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
