//! The engine: tables, shards, the background flusher, scans, combine and GC
//! behind one handle.
//!
//! ```text
//!  apply(ops) ─▶ route by hash(table, key) ─▶ ts = begin() ─▶ validate every shard
//!             ─▶ apply every shard ─▶ commit(ts) ─▶ HWM advances
//!  snapshot() ─▶ scan(table) ─▶ one view per part ─▶ VFoR batches
//!  gc()       ─▶ fold visibility ≤ LWM, purge index ≤ LWM, delete retired objects
//!  combine()  ─▶ sealed, flushed virtual files → regular files (same id, same offsets)
//! ```

use std::collections::HashMap;
use std::path::Path as FsPath;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;

use arrow::datatypes::SchemaRef;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use object_store::path::Path;

use crate::buffer::{BlockData, DEFAULT_BLOCK_ROWS, DEFAULT_BLOCKS_PER_FILE, FileKind, PartView, TablePart};
use crate::error::{Error, Result};
use crate::ids::{ShardId, TableId, Ts};
use crate::lake::{Lake, block_path, combined_path, encode_block};
use crate::mvcc::{Clock, MemoryTxnStore, Snapshot, SqliteTxnStore, TxnStore, lock};
use crate::replay::{BufferConfig, FlushJob, Op, Shard, ShardContext, ShardOp};
use crate::rewrite::{
    LocalRewrites, RewriteAnswer, RewriteClaims, RewriteJob, RewriteRequest, RewriteStats, RewriteWorker,
};
use crate::scan::{Scan, ScanOptions};
use crate::scan_worker::SplitFailure;
use crate::schema::{TableDef, TypeChange};

/// File ids of a writer with lease epoch `e` start at `e << 40` (see
/// [`Engine::fence_file_ids`]): 2^40 files per epoch.
pub const FILE_ID_EPOCH_SHIFT: u32 = 40;

/// Folder of fovea's own metadata inside a local lake.
pub const METADATA_DIR: &str = "_fovea";

/// Engine configuration.
///
/// ```
/// use fovea_core::engine::EngineConfig;
/// let c = EngineConfig::default();
/// assert_eq!(c.block_rows, 8192);
/// assert_eq!(c.blocks_per_file, 16);
/// assert!(c.shards >= 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Number of shards (default: available cores).
    pub shards: usize,
    /// Rows per write-buffer block and row group (a multiple of the 4096-row
    /// tile is fastest).
    pub block_rows: usize,
    /// Blocks per virtual file.
    pub blocks_per_file: usize,
    /// How long objects no checkpoint names any more stay for readers the
    /// engine does not know of (see [`Engine::set_retire_grace`]; default
    /// none): those combine and storage GC replace, and the lake files a
    /// restart finds left out of the checkpoint it restores that are
    /// younger than this (a published Iceberg snapshot from before the
    /// restart may name them).
    pub retire_grace: std::time::Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            shards: std::thread::available_parallelism().map_or(1, |n| n.get()),
            block_rows: DEFAULT_BLOCK_ROWS,
            blocks_per_file: DEFAULT_BLOCKS_PER_FILE,
            retire_grace: std::time::Duration::ZERO,
        }
    }
}

impl EngineConfig {
    /// Sets the shard count.
    pub fn with_shards(mut self, shards: usize) -> Self {
        self.shards = shards;
        self
    }

    /// Sets block and file sizes.
    pub fn with_blocks(mut self, block_rows: usize, blocks_per_file: usize) -> Self {
        self.block_rows = block_rows;
        self.blocks_per_file = blocks_per_file;
        self
    }

    /// Sets the retire grace ([`EngineConfig::retire_grace`]).
    pub fn with_retire_grace(mut self, grace: std::time::Duration) -> Self {
        self.retire_grace = grace;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.shards == 0 || self.block_rows == 0 || self.blocks_per_file == 0 {
            return Err(Error::invariant(format!(
                "bad engine config {self:?}: shards, block_rows and blocks_per_file must be at least 1"
            )));
        }
        Ok(())
    }
}

pub(crate) struct TableRuntime {
    /// Its definitions, oldest first, each with the mirror transaction
    /// from which it holds: the first is the table's creation (no
    /// transaction below it can have written to the table; snapshots and
    /// checkpoints below it do not have the table), each later one a schema
    /// change. A snapshot or checkpoint at `ts` takes the newest one at or
    /// below `ts`, so the change of a transaction not committed (or never
    /// committed: it failed) shows nowhere.
    versions: Vec<(Ts, Arc<TableDef>)>,
    parts: Vec<Arc<TablePart>>,
    /// The mirror transaction that dropped the table: snapshots and
    /// checkpoints at or above it do not have it (its name is free for a
    /// new table from then on).
    dropped_at: Option<Ts>,
}

impl TableRuntime {
    /// The newest definition (the writer's).
    fn current(&self) -> &Arc<TableDef> {
        &self.versions.last().unwrap_or_else(|| unreachable!("a table has a definition from its creation")).1
    }

    /// The definition at `ts`; `None` before the table's creation and
    /// from its drop on.
    fn def_at(&self, ts: Ts) -> Option<&Arc<TableDef>> {
        if self.dropped_at.is_some_and(|d| d <= ts) {
            return None;
        }
        self.defined_at(ts)
    }

    /// The definition at `ts` whether or not the table was dropped by then.
    fn defined_at(&self, ts: Ts) -> Option<&Arc<TableDef>> {
        self.versions.iter().rev().find(|(from, _)| *from <= ts).map(|(_, d)| d)
    }

    /// Drops the definitions no snapshot at or above `lwm` reads.
    fn forget_before(&mut self, lwm: Ts) {
        let holding = self.versions.iter().rposition(|(from, _)| *from <= lwm).unwrap_or(0);
        self.versions.drain(..holding);
    }
}

#[derive(Default)]
struct Tables {
    by_id: Vec<TableRuntime>,
    by_name: HashMap<String, TableId>,
}

#[derive(Default)]
struct FlushState {
    pending: usize,
    failures: u64,
    last_error: Option<String>,
}

struct Flusher {
    state: Mutex<FlushState>,
    idle: Condvar,
}

/// Objects replaced by one combine or storage-GC rewrite, waiting to be
/// deleted.
pub(crate) struct Retired {
    /// Registration sequence of the swap: readers registered before it may
    /// still read the objects.
    seq: u64,
    paths: Vec<Path>,
    /// Checkpoints begun before the swap ([`RetiredObjects::checkpoints_begun`]
    /// then): a checkpoint begun later may have read the part before the
    /// swap and name the objects.
    begun_before: u64,
    /// The first checkpoint written without them: its ts and its
    /// `next_file_id` (see [`Engine::committed_checkpoint`]).
    pub(crate) left_out_at: Option<(u64, u64)>,
    /// When that checkpoint was captured.
    pub(crate) left_out_when: Option<std::time::Instant>,
}

impl Retired {
    /// Objects replaced at registration sequence `seq`, while
    /// `begun_before` checkpoints had begun.
    pub(crate) fn new(seq: u64, paths: Vec<Path>, begun_before: u64) -> Self {
        Retired { seq, paths, begun_before, left_out_at: None, left_out_when: None }
    }

    /// Objects already left out of the committed checkpoint at `(c,
    /// next_file_id)` since `when`, which no reader registered now needs:
    /// deleted once the grace has passed since `when`.
    pub(crate) fn left_out(paths: Vec<Path>, at: (u64, u64), when: std::time::Instant) -> Self {
        Retired { seq: 0, paths, begun_before: 0, left_out_at: Some(at), left_out_when: Some(when) }
    }
}

/// Objects replaced by combines, and how many checkpoints have begun: the
/// two change together, under one lock.
#[derive(Default)]
pub(crate) struct RetiredObjects {
    /// Checkpoints begun so far.
    pub(crate) checkpoints_begun: u64,
    pub(crate) entries: Vec<Retired>,
    /// How long objects stay after the first checkpoint without them
    /// (see [`Engine::set_retire_grace`]).
    pub(crate) grace: std::time::Duration,
}

impl RetiredObjects {
    /// Counts a checkpoint beginning; returns its number.
    pub(crate) fn begin_checkpoint(&mut self) -> u64 {
        self.checkpoints_begun += 1;
        self.checkpoints_begun
    }

    /// Marks the objects checkpoint `number` (at `c`, with `next_file_id`)
    /// left out: those retired before it began. One retired while it ran
    /// may still be named by it (it read the part before the swap) and
    /// waits for the next.
    pub(crate) fn left_out_of(&mut self, number: u64, c: u64, next_file_id: u64) {
        let now = std::time::Instant::now();
        for entry in self.entries.iter_mut().filter(|e| e.begun_before < number) {
            if entry.left_out_at.is_none() {
                entry.left_out_at = Some((c, next_file_id));
                entry.left_out_when = Some(now);
            }
        }
    }
}

/// What one GC round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// The LWM it used.
    pub lwm: Ts,
    /// Visibility blocks freed.
    pub visibility_blocks_freed: usize,
    /// Index versions dropped.
    pub index_versions_dropped: usize,
    /// Retired objects deleted.
    pub objects_deleted: usize,
}

/// A regular file queued for storage GC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleFile {
    /// Its table.
    pub table: String,
    /// The file.
    pub file: crate::ids::FileId,
    /// Rows stored.
    pub rows: usize,
    /// Rows deleted as of the newest snapshot.
    pub deleted: usize,
}

/// Memory held by the engine, by component.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemoryStats {
    /// Tile visibility (all files) and its writers' bookkeeping.
    pub visibility_bytes: usize,
    /// Primary index: SPI and MI.
    pub index_bytes: usize,
    /// Write buffers: active builders and unflushed blocks.
    pub buffer_bytes: usize,
    /// Stored tuple versions.
    pub tuples: usize,
}

impl MemoryStats {
    /// Visibility bits per stored tuple.
    pub fn visibility_bits_per_tuple(&self) -> f64 {
        if self.tuples == 0 { 0.0 } else { self.visibility_bytes as f64 * 8.0 / self.tuples as f64 }
    }
}

/// The fovea engine.
///
/// # Locks
///
/// An engine's locks are taken in this order — a lock is never taken
/// while one below it in the list is held — and are released before
/// object-store IO, except where a step says so:
///
/// 1. `sequencer`: [`Engine::apply`]'s begin-then-apply, so timestamps reach
///    the shards in order.
/// 2. `sequencer_apply`: one transaction's shards locked together
///    ([`Engine::apply_at`]); table creation at a ts.
/// 3. `image`: a checkpoint's capture (held while it takes the shards);
///    storage GC's swap waits on it (`no_image_in_progress`).
/// 4. `tables` (read or write): checkpoint capture reads it before taking
///    any shard; memory GC writes it after letting every shard go.
/// 5. `shards[i]`: several at once only in ascending index order
///    (`apply_at`, capture).
/// 6. a part's `state`, inside its shard's lock.
/// 7. leaves, held briefly with nothing taken inside: `retired`,
///    `last_checkpoint`, `source_commits`, `flush_tx` and the flusher's
///    state, `rewrite_worker` (cloned out: never held across a rewrite).
pub struct Engine {
    pub(crate) config: EngineConfig,
    pub(crate) clock: Arc<Clock>,
    pub(crate) lake: Lake,
    tables: RwLock<Tables>,
    /// Grows with every table created or changed (see
    /// [`crate::cdc::typed::CurrentTables`]).
    table_generation: AtomicU64,
    pub(crate) shards: Vec<Mutex<Shard>>,
    /// Serialises `apply` (begin + apply) so timestamps reach shards in order.
    pub(crate) sequencer: Mutex<()>,
    /// Serialises `apply_at` so one transaction's shards are locked together.
    pub(crate) sequencer_apply: Mutex<()>,
    pub(crate) file_ids: AtomicU64,
    flusher: Arc<Flusher>,
    flush_tx: Mutex<Option<Sender<FlushJob>>>,
    flush_thread: Mutex<Option<JoinHandle<()>>>,
    /// Objects replaced by combine: registration sequence of the swap, the
    /// paths, and the ts of the first checkpoint written since (a
    /// checkpoint written before the swap still references them). They are
    /// deleted only once that checkpoint is committed, never on the strength
    /// of a checkpoint whose commit failed (a fenced replayer's).
    pub(crate) retired: Mutex<RetiredObjects>,
    /// The `next_file_id` of the newest checkpoint committed to the
    /// catalog (0: none yet). Each checkpoint's is larger than every earlier
    /// one's (its capture takes an id), so it tells checkpoints at the same
    /// ts apart, as the ts cannot (one written after storage GC or a
    /// combine without a commit in between).
    pub(crate) committed_checkpoint: AtomicU64,
    /// The newest checkpoint committed: the next one writes what changed
    /// since (its index deltas extend this one's chain).
    pub(crate) last_checkpoint: Mutex<Option<Arc<crate::checkpoint::Manifest>>>,
    /// True while a captured checkpoint is being written (see
    /// [`crate::checkpoint::PendingCheckpoint`]); storage GC swaps wait.
    pub(crate) image: Mutex<bool>,
    /// Told when `image` turns false.
    pub(crate) image_written: Condvar,
    /// Set once the engine writes checkpoints: retired objects then wait
    /// for the next checkpoint as well as for old snapshots.
    pub(crate) checkpointing: std::sync::atomic::AtomicBool,
    /// Source commit time (µs) of replayed transactions by mirror ts; below
    /// LWM only the newest entry is kept.
    source_commits: Mutex<SourceCommits>,
    /// Told the freshness (µs from source commit to mirror commit) of each
    /// committed transaction with a known source commit time.
    freshness_observer: std::sync::OnceLock<FreshnessObserver>,
    /// Retained visibility checkpoints holding storage GC off (see
    /// [`Engine::pause_storage_gc`]).
    pub(crate) storage_gc_pauses: Arc<AtomicUsize>,
    /// Who runs combine's and storage GC's rewrites (this process unless
    /// [`Engine::set_rewrite_worker`] says otherwise). Cloned out before use:
    /// never held across a rewrite.
    rewrite_worker: Mutex<Arc<dyn RewriteWorker>>,
    rewrite_stats: RewriteStats,
    /// Files a combine or storage-GC round is rewriting (one round per
    /// file at a time).
    pub(crate) rewriting: RewriteClaims,
}

impl crate::cdc::typed::CurrentTables for Engine {
    fn generation(&self) -> u64 {
        // Acquire: pairs with the Release increments made after a change.
        self.table_generation.load(Ordering::Acquire)
    }

    fn current(&self, name: &str) -> Option<Arc<TableDef>> {
        self.table(name).ok()
    }
}

/// See [`Engine::observe_freshness`].
type FreshnessObserver = Box<dyn Fn(i64) + Send + Sync>;

impl Engine {
    /// An engine over `store`, with timestamps from `clock`.
    pub fn open(store: Arc<dyn ObjectStore>, clock: Arc<Clock>, config: EngineConfig) -> Result<Arc<Engine>> {
        config.validate()?;
        let lake = Lake::new(store);
        let flusher = Arc::new(Flusher { state: Mutex::new(FlushState::default()), idle: Condvar::new() });
        let (tx, rx) = channel();
        let thread = {
            let lake = lake.clone();
            let flusher = Arc::clone(&flusher);
            std::thread::Builder::new()
                .name("fovea-flush".into())
                .spawn(move || flush_loop(rx, lake, flusher, config.block_rows))?
        };
        Ok(Arc::new(Engine {
            config,
            clock,
            tables: RwLock::new(Tables::default()),
            table_generation: AtomicU64::new(0),
            shards: (0..config.shards).map(|i| Mutex::new(Shard::new(ShardId(i as u32)))).collect(),
            sequencer: Mutex::new(()),
            sequencer_apply: Mutex::new(()),
            file_ids: AtomicU64::new(1),
            flusher,
            flush_tx: Mutex::new(Some(tx)),
            flush_thread: Mutex::new(Some(thread)),
            retired: Mutex::new(RetiredObjects { grace: config.retire_grace, ..RetiredObjects::default() }),
            committed_checkpoint: AtomicU64::new(0),
            last_checkpoint: Mutex::new(None),
            image: Mutex::new(false),
            image_written: Condvar::new(),
            checkpointing: std::sync::atomic::AtomicBool::new(false),
            source_commits: Mutex::new(SourceCommits::default()),
            freshness_observer: std::sync::OnceLock::new(),
            storage_gc_pauses: Arc::default(),
            rewrite_worker: Mutex::new(Arc::new(LocalRewrites::new(lake.clone()))),
            rewrite_stats: RewriteStats::default(),
            rewriting: RewriteClaims::default(),
            lake,
        }))
    }

    /// An engine entirely in memory (tests, benches).
    pub fn in_memory(config: EngineConfig) -> Result<Arc<Engine>> {
        let clock = Clock::open(Arc::new(MemoryTxnStore::default()) as Arc<dyn TxnStore>)?;
        Self::open(Arc::new(InMemory::new()), clock, config)
    }

    /// An engine on a local directory: files under `dir`, timestamps in
    /// `dir/_fovea/txn.sqlite`.
    pub fn open_dir(dir: &FsPath, config: EngineConfig) -> Result<Arc<Engine>> {
        std::fs::create_dir_all(dir)?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir)?;
        let txn = SqliteTxnStore::open(&dir.join(METADATA_DIR).join("txn.sqlite"))?;
        Self::open(Arc::new(store), Clock::open(Arc::new(txn))?, config)
    }

    /// The configuration.
    pub fn config(&self) -> EngineConfig {
        self.config
    }

    /// The clock (timestamps, watermarks, snapshots).
    pub fn clock(&self) -> &Arc<Clock> {
        &self.clock
    }

    /// The lake's object store.
    pub fn lake(&self) -> &Lake {
        &self.lake
    }

    fn read_tables(&self) -> std::sync::RwLockReadGuard<'_, Tables> {
        self.tables.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a table with the given user columns and primary-key columns.
    pub fn create_table(&self, name: &str, schema: SchemaRef, primary_key: Vec<usize>) -> Result<Arc<TableDef>> {
        self.create_table_since(name, schema, primary_key, Ts::ZERO)
    }

    /// Creates a table as part of the mirror transaction `ts` (begun, not
    /// yet committed): checkpoints below `ts` leave it out, every checkpoint
    /// at or above it has it, however the transaction was chunked.
    pub fn create_table_at(
        &self,
        name: &str,
        schema: SchemaRef,
        primary_key: Vec<usize>,
        ts: Ts,
    ) -> Result<Arc<TableDef>> {
        self.create_table_since(name, schema, primary_key, ts)
    }

    fn create_table_since(
        &self,
        name: &str,
        schema: SchemaRef,
        primary_key: Vec<usize>,
        created_at: Ts,
    ) -> Result<Arc<TableDef>> {
        self.add_table(name, created_at, |id| TableDef::new(id, name, schema, primary_key))
    }

    /// Creates the table a checkpoint describes (its columns with the
    /// transactions that added them), as of the checkpoint.
    pub(crate) fn restore_table(&self, table: &crate::checkpoint::TableManifest) -> Result<Arc<TableDef>> {
        self.add_table(&table.name, Ts::ZERO, |id| table.def(id))
    }

    /// Adds table `name`, defined by `define` given its id, as of `created_at`.
    fn add_table(
        &self,
        name: &str,
        created_at: Ts,
        define: impl FnOnce(TableId) -> Result<Arc<TableDef>>,
    ) -> Result<Arc<TableDef>> {
        let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
        if tables.by_name.contains_key(name) {
            return Err(Error::TableExists(name.into()));
        }
        let id = TableId(tables.by_id.len() as u32);
        let def = define(id)?;
        let parts: Vec<Arc<TablePart>> =
            (0..self.shards.len()).map(|s| Arc::new(TablePart::new(Arc::clone(&def), ShardId(s as u32)))).collect();
        for (shard, part) in self.shards.iter().zip(&parts) {
            lock(shard).add_part(Arc::clone(part));
        }
        tables.by_id.push(TableRuntime { versions: vec![(created_at, Arc::clone(&def))], parts, dropped_at: None });
        tables.by_name.insert(name.into(), id);
        // Release, under the write lock: a decoder that sees the new
        // generation (Acquire) and then reads the tables sees this one.
        self.table_generation.fetch_add(1, Ordering::Release);
        Ok(def)
    }

    /// Changes the columns of `name` (columns added, removed or widened in
    /// the source). Stored files keep their columns; readers match columns
    /// by field id (by name in files from before fovea wrote field ids:
    /// [`TableDef::stored_index`]), so old rows read an added column as
    /// NULL and a widened one through an exact cast ([`TypeChange::Widen`]);
    /// an added column gets a new field id and is NULL in every row
    /// version older than `ts`, even where a file holds a column of its
    /// name (dropped before: [`TableDef::column_since`]). Key columns cannot be
    /// removed; a type change that is not a widening is refused. Each
    /// shard's open file is sealed, so new rows are written to files of the
    /// new schema. The change belongs to the mirror transaction `ts` (begun,
    /// not committed): snapshots and checkpoints below `ts` keep the old
    /// definition, so if `ts` never commits the change never shows.
    pub fn evolve_table(&self, name: &str, schema: SchemaRef, ts: Ts) -> Result<Arc<TableDef>> {
        self.change_table(name, schema, false, ts)
    }

    /// [`Engine::evolve_table`] allowing any type change, for a table
    /// whose live rows the open mirror transaction has deleted (a copy
    /// from the source replaces them). Snapshots before it read the old
    /// rows through a cast that fails, naming the column, where a value
    /// does not convert.
    pub fn reshape_table(&self, name: &str, schema: SchemaRef, ts: Ts) -> Result<Arc<TableDef>> {
        self.change_table(name, schema, true, ts)
    }

    fn change_table(&self, name: &str, schema: SchemaRef, any_type: bool, ts: Ts) -> Result<Arc<TableDef>> {
        let _order = lock(&self.sequencer_apply);
        let old = self.table(name)?;
        for f in schema.fields() {
            let Ok(i) = old.schema.index_of(f.name()) else { continue };
            let from = old.schema.field(i).data_type();
            let key = old.primary_key.contains(&i);
            if from != f.data_type() && !any_type && TypeChange::of(from, f.data_type(), key) != TypeChange::Widen {
                return Err(Error::Schema {
                    table: name.into(),
                    column: f.name().clone(),
                    message: format!("type {from} cannot become {} in place", f.data_type()),
                });
            }
        }
        if let Some(f) =
            schema.fields().iter().find(|f| old.schema.field_with_name(f.name()).is_err() && !f.is_nullable())
        {
            return Err(Error::Schema {
                table: name.into(),
                column: f.name().clone(),
                message: "a column added to an existing table must be nullable (its old rows read NULL)".into(),
            });
        }
        let key = old
            .primary_key
            .iter()
            .map(|&k| {
                let n = old.schema.field(k).name();
                schema.index_of(n).map_err(|_| Error::Schema {
                    table: name.into(),
                    column: n.clone(),
                    message: "a primary-key column cannot be removed".into(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // A column the table had keeps its field id and the transaction
        // that added it; one it did not have (never, or dropped since) is
        // new: the next field id, added by this transaction.
        let old_names: Vec<&str> = old.schema.fields().iter().map(|f| f.name().as_str()).collect();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let columns = old.column_identity().evolve(&old_names, &names, ts);
        let def = TableDef::with_columns(old.id, name, schema, key, columns)?;
        self.with_shard_context(|ctx| self.shards.iter().try_for_each(|shard| lock(shard).close_file(old.id, ctx)))?;
        let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
        let versions = &mut tables.by_id[old.id.0 as usize].versions;
        match versions.last_mut() {
            // Changed again by the same transaction.
            Some((from, d)) if *from == ts => *d = Arc::clone(&def),
            Some((from, _)) if *from > ts => {
                return Err(Error::invariant(format!(
                    "{name}: a schema change at ts {} after one at {}",
                    ts.get(),
                    from.get()
                )));
            }
            _ => versions.push((ts, Arc::clone(&def))),
        }
        // Release, under the write lock: as in `create_table_at`.
        self.table_generation.fetch_add(1, Ordering::Release);
        Ok(def)
    }

    /// Drops table `name` in the mirror transaction `ts` (begun, not
    /// committed): snapshots and checkpoints below `ts` still have it, those
    /// at or above do not, and its name is free for a new table. Its files
    /// stay in the lake while checkpoints name them (they belong to the
    /// snapshots before the drop).
    pub fn drop_table_at(&self, name: &str, ts: Ts) -> Result<()> {
        let _order = lock(&self.sequencer_apply);
        let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
        let id = tables.by_name.remove(name).ok_or_else(|| Error::UnknownTable(name.into()))?;
        let rt = &mut tables.by_id[id.0 as usize];
        if rt.versions.last().is_some_and(|(from, _)| *from > ts) {
            return Err(Error::invariant(format!("{name}: dropped at ts {} before a change at a later ts", ts.get())));
        }
        rt.dropped_at = Some(ts);
        // Release, under the write lock: as in `create_table_at`.
        self.table_generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// The table named `name`.
    pub fn table(&self, name: &str) -> Result<Arc<TableDef>> {
        let tables = self.read_tables();
        let id = tables.by_name.get(name).ok_or_else(|| Error::UnknownTable(name.into()))?;
        Ok(Arc::clone(tables.by_id[id.0 as usize].current()))
    }

    /// The table named `name` as of `ts` (its columns then); unknown
    /// before its creation.
    pub fn table_at(&self, name: &str, ts: Ts) -> Result<Arc<TableDef>> {
        self.views_at(name, ts).map(|(def, _)| def)
    }

    /// The tables as of `ts`: those created at or below it, each with its
    /// definition at `ts` (see `TableRuntime::versions`).
    pub(crate) fn tables_at(&self, ts: Ts) -> Vec<Arc<TableDef>> {
        self.read_tables().by_id.iter().filter_map(|t| t.def_at(ts).cloned()).collect()
    }

    /// Every table created at or below `ts`, by id (dense), with its
    /// definition then and whether it was dropped at or below `ts`: what a
    /// checkpoint at `ts` records (a dropped table's rows still belong to
    /// the files and index the checkpoint names).
    pub(crate) fn checkpoint_tables_at(&self, ts: Ts) -> Vec<(Arc<TableDef>, bool)> {
        let tables = self.read_tables();
        tables
            .by_id
            .iter()
            .filter_map(|t| Some((Arc::clone(t.defined_at(ts)?), t.dropped_at.is_some_and(|d| d <= ts))))
            .collect()
    }

    /// Marks table `id`, restored from a checkpoint that records it
    /// dropped, as dropped from `ts` on.
    pub(crate) fn restore_dropped(&self, id: TableId, ts: Ts) {
        let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
        let name = tables.by_id[id.0 as usize].current().name.clone();
        if tables.by_name.get(name.as_str()) == Some(&id) {
            tables.by_name.remove(name.as_str());
        }
        tables.by_id[id.0 as usize].dropped_at = Some(ts);
        // Release, under the write lock: as in `create_table_at`.
        self.table_generation.fetch_add(1, Ordering::Release);
    }

    /// Every table, dropped ones included, indexed by id, with its newest
    /// definition.
    pub(crate) fn tables_by_id(&self) -> Vec<Arc<TableDef>> {
        self.read_tables().by_id.iter().map(|t| Arc::clone(t.current())).collect()
    }

    /// The tables not dropped, by id, with their newest definitions (the
    /// writer's view).
    pub fn tables(&self) -> Vec<Arc<TableDef>> {
        self.read_tables().by_id.iter().filter(|t| t.dropped_at.is_none()).map(|t| Arc::clone(t.current())).collect()
    }

    /// The shard a key belongs to, by its routing bytes
    /// ([`crate::index::routing_key`]).
    pub fn shard_of(&self, key: &[u8]) -> usize {
        use std::hash::BuildHasher;
        (foldhash::fast::FixedState::with_seed(0x0005_4a2d).hash_one(key) % self.shards.len() as u64) as usize
    }

    /// Replays one mirror transaction: all of `ops` become visible together at
    /// the returned timestamp, or none does (the error names table and key).
    pub fn apply(&self, ops: Vec<Op>) -> Result<Ts> {
        let _order = lock(&self.sequencer);
        let ts = self.clock.begin()?;
        match self.apply_at(ts, ops) {
            Ok(()) => {
                self.clock.commit(ts)?;
                Ok(ts)
            }
            Err(e @ (Error::KeyConflict { .. } | Error::Schema { .. } | Error::UnknownTable(_))) => {
                // Rejected before anything was written.
                self.clock.abort(ts)?;
                Err(e)
            }
            // A broken invariant after partial application: the ts stays
            // uncommitted, so HWM stops below it and no part of the
            // transaction ever becomes visible.
            Err(e) => Err(e),
        }
    }

    /// Starts a mirror transaction (see [`Engine::apply_at`]).
    pub fn begin(&self) -> Result<Ts> {
        self.clock.begin()
    }

    /// Applies `ops` at `ts` without committing. Calls must come in `ts`
    /// order; commits ([`Engine::commit`]) may come in any order.
    ///
    /// On [`Error::KeyConflict`], [`Error::Schema`] or
    /// [`Error::UnknownTable`] nothing was written and the caller ends the
    /// transaction with [`Engine::abort`]. Any other error is a broken
    /// invariant; the transaction must then never be committed.
    pub fn apply_at(&self, ts: Ts, ops: Vec<Op>) -> Result<()> {
        let (routed, origins) = self.route(ops)?;
        let _order = lock(&self.sequencer_apply);
        let mut shards: Vec<_> = routed
            .iter()
            .enumerate()
            .filter(|(_, ops)| !ops.is_empty())
            .map(|(i, ops)| (lock(&self.shards[i]), ops))
            .collect();
        for (shard, ops) in &shards {
            shard.validate(ops).map_err(|e| origin_of(e, &origins[shard.id().0 as usize]))?;
        }
        self.with_shard_context(|ctx| shards.iter_mut().try_for_each(|(shard, ops)| shard.apply(ts, ops, ctx)))
    }

    /// Splits operations by shard; `origins[s][i]` is the index in `ops` of
    /// shard `s`'s `i`-th operation.
    pub(crate) fn route(&self, ops: Vec<Op>) -> Result<Routed> {
        // Sized for an even spread (keys hash evenly) and half as much
        // again, so that a shard's list rarely grows while it is filled (a
        // small transaction's keys seldom spread evenly).
        let even = (ops.len() / self.shards.len() * 3 / 2 + 4).min(ops.len());
        let mut routed: Vec<Vec<ShardOp>> = (0..self.shards.len()).map(|_| Vec::with_capacity(even)).collect();
        let mut origins: Vec<Vec<usize>> = (0..self.shards.len()).map(|_| Vec::with_capacity(even)).collect();
        let tables = self.tables_by_id();
        for (i, op) in ops.into_iter().enumerate() {
            let table_of =
                |t: TableId| tables.get(t.0 as usize).cloned().ok_or_else(|| Error::UnknownTable(t.to_string()));
            ShardOp::from_op(op, table_of, |s| {
                let shard = self.shard_of(&s.routing_key());
                routed[shard].push(s);
                origins[shard].push(i);
            })
            .map_err(|e| match e {
                Error::Schema { table, column, message } => {
                    Error::Schema { table, column, message: format!("{message} (operation {i})") }
                }
                other => other,
            })?;
        }
        Ok((routed, origins))
    }

    /// Validates and applies one shard's part of a transaction (shard
    /// worker threads). The shard is left untouched when validation fails.
    pub(crate) fn apply_on_shard(&self, shard: usize, ts: Ts, ops: &[ShardOp], origins: &[usize]) -> Result<()> {
        let mut shard = lock(&self.shards[shard]);
        shard.validate(ops).map_err(|e| origin_of(e, origins))?;
        self.with_shard_context(|ctx| shard.apply(ts, ops, ctx))
    }

    /// Runs `f` with what a shard needs while applying: the file-id
    /// allocator, the flusher's queue and the buffer sizes.
    fn with_shard_context<R>(&self, f: impl FnOnce(&ShardContext<'_>) -> R) -> R {
        let tx = lock(&self.flush_tx).clone();
        let flush = |job: FlushJob| self.enqueue_flush(tx.as_ref(), job);
        f(&ShardContext { file_ids: &self.file_ids, flush: &flush, config: self.buffer_config() })
    }

    /// The newest version of `key` in `table`, committed or not (the
    /// writer's view: a transaction sees its own earlier changes). Used to
    /// fill in values a change stream leaves out (unchanged TOAST columns).
    pub fn latest_row(&self, table: &TableDef, key: &[crate::schema::Value]) -> Result<Option<crate::schema::Row>> {
        let encoded = crate::index::encode_key(table.id, key);
        let (loc, part) = {
            let shard = lock(&self.shards[self.shard_of(&crate::index::routing_key(table.id, key))]);
            let Some(row_id) = shard.index.latest(&encoded) else { return Ok(None) };
            let loc = shard
                .main
                .locate(row_id)
                .ok_or_else(|| Error::invariant(format!("{row_id:?} of {} has no location", table.name)))?;
            let part = shard.parts.get(&table.id).map(|p| Arc::clone(&p.part));
            (loc, part.ok_or_else(|| Error::UnknownTable(table.name.clone()))?)
        };
        let view = part.view()?;
        let offset = loc.offset as usize;
        let found = match &view.active {
            Some(a) if a.file == loc.file && offset >= a.offset && offset < a.offset + a.batch.num_rows() => {
                Some(a.batch.slice(offset - a.offset, 1))
            }
            _ => {
                let file = view.files.iter().find(|f| f.id == loc.file);
                match file.map(|f| &f.kind) {
                    Some(FileKind::Virtual { blocks, .. }) => {
                        let mut start = 0;
                        let mut hit = None;
                        for b in blocks {
                            if offset < start + b.rows {
                                let batch = match &b.data {
                                    BlockData::Memory(batch) => batch.clone(),
                                    BlockData::Flushed(p) => self.lake.read_block(p)?,
                                };
                                hit = Some(batch.slice(offset - start, 1));
                                break;
                            }
                            start += b.rows;
                        }
                        hit
                    }
                    Some(FileKind::Regular(r)) => {
                        let mut found = None;
                        if let Some(rg) =
                            r.row_groups.iter().position(|g| offset >= g.offset && offset < g.offset + g.rows)
                        {
                            // That row group's chunks only.
                            let batch = self.lake.read_row_groups(
                                &r.path,
                                r.metadata(&self.lake)?,
                                vec![rg],
                                parquet::arrow::ProjectionMask::all(),
                                None,
                            )?;
                            found = Some(batch.slice(offset - r.row_groups[rg].offset, 1));
                        }
                        found
                    }
                    None => None,
                }
            }
        };
        let Some(batch) = found else {
            return Err(Error::invariant(format!("row at {} offset {offset} of {} not found", loc.file, table.name)));
        };
        let user: Vec<usize> = (0..table.schema.fields().len()).collect();
        let mut row = crate::schema::rows_from_batch(&{
            let (projected, unconverted) = crate::scan::project_stored(table, &user, &batch, (Ts::ZERO, Ts::MAX))?;
            if let Some(u) = unconverted {
                u.check(table, &[u64::MAX])?;
            }
            projected
        })?
        .into_iter()
        .next()
        .ok_or_else(|| Error::invariant("a one-row batch without a row"))?;
        row.pop(); // the hidden column
        Ok(Some(row))
    }

    /// Marks `ts` fully applied; HWM advances over the committed prefix.
    pub fn commit(&self, ts: Ts) -> Result<()> {
        self.clock.commit(ts)?;
        if let Some(observe) = self.freshness_observer.get() {
            let source = lock(&self.source_commits).get(ts.get());
            if let Some(us) = source {
                observe(crate::catalog::now_us() - us);
            }
        }
        Ok(())
    }

    /// Calls `observe` with the freshness of every transaction committed
    /// from now on whose source commit time is known
    /// ([`Engine::note_source_commit`]): µs from its source commit to its
    /// commit here. Set once; later calls are ignored.
    pub fn observe_freshness(&self, observe: impl Fn(i64) + Send + Sync + 'static) {
        let _ = self.freshness_observer.set(Box::new(observe));
    }

    /// Ends a transaction that wrote nothing.
    pub fn abort(&self, ts: Ts) -> Result<()> {
        self.clock.abort(ts)
    }

    fn buffer_config(&self) -> BufferConfig {
        BufferConfig { block_rows: self.config.block_rows, blocks_per_file: self.config.blocks_per_file }
    }

    fn enqueue_flush(&self, tx: Option<&Sender<FlushJob>>, job: FlushJob) {
        lock(&self.flusher.state).pending += 1;
        let sent = tx.map(|tx| tx.send(job));
        if !matches!(sent, Some(Ok(()))) {
            // The flusher is gone (engine shutting down): the block stays in
            // memory, readable, and is counted as a failure.
            let mut st = lock(&self.flusher.state);
            st.pending -= 1;
            st.failures += 1;
            st.last_error = Some("the flusher has stopped".into());
        }
    }

    /// Waits until every queued block is flushed. Returns the last flush
    /// failure if any happened since the previous call (the affected blocks
    /// stay in memory and readable).
    pub fn flush(&self) -> Result<()> {
        let mut st = lock(&self.flusher.state);
        while st.pending > 0 {
            st = self.flusher.idle.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        match st.last_error.take() {
            Some(e) => Err(Error::Io(std::io::Error::other(format!("flushing write-buffer blocks failed: {e}")))),
            None => Ok(()),
        }
    }

    /// Flush failures so far.
    pub fn flush_failures(&self) -> u64 {
        lock(&self.flusher.state).failures
    }

    /// Records that mirror transaction `ts` replays a source transaction
    /// committed at `commit_us` (µs since the epoch).
    pub fn note_source_commit(&self, ts: Ts, commit_us: i64) {
        lock(&self.source_commits).insert(ts.get(), commit_us);
    }

    /// The newest replayed transaction visible at `qts` with a known source
    /// commit time: `(mirror ts, source commit µs)`. Freshness of a query is
    /// its start time minus that commit time.
    pub fn source_commit_at(&self, qts: Ts) -> Option<(Ts, i64)> {
        lock(&self.source_commits).at_or_below(qts.get()).map(|(t, c)| (Ts(t), c))
    }

    /// Registers a query at the newest replayed state.
    pub fn snapshot(&self) -> Snapshot {
        self.clock.snapshot()
    }

    /// Registers the writer of open transaction `ts`, HWM, to read its
    /// own applied writes ([`Clock::snapshot_of_open`]).
    pub fn snapshot_of_open(&self, ts: Ts) -> Result<Snapshot> {
        self.clock.snapshot_of_open(ts)
    }

    /// Registers a query at a past `ts` (time travel).
    pub fn snapshot_at(&self, ts: Ts) -> Result<Snapshot> {
        self.clock.snapshot_at(ts)
    }

    /// One consistent view of every part of `table`.
    pub fn views(&self, table: &str) -> Result<(Arc<TableDef>, Vec<PartView>)> {
        self.views_at(table, Ts::MAX)
    }

    /// [`Engine::views`] of a table as it is at `qts`: one created by a
    /// mirror transaction above `qts` (committed later, or not yet) is
    /// unknown there, as it was in the source before that transaction; one
    /// changed above `qts` has its columns from before the change.
    fn views_at(&self, table: &str, qts: Ts) -> Result<(Arc<TableDef>, Vec<PartView>)> {
        let tables = self.read_tables();
        // The table of that name now, or one dropped after `qts`.
        let found =
            tables.by_name.get(table).map(|id| &tables.by_id[id.0 as usize]).into_iter().chain(
                tables.by_id.iter().rev().filter(|t| t.dropped_at.is_some() && t.current().name.as_str() == table),
            );
        let (rt, def) = found
            .filter_map(|rt| Some((rt, rt.def_at(qts)?)))
            .next()
            .ok_or_else(|| Error::UnknownTable(table.into()))?;
        let views = rt.parts.iter().map(|p| p.view()).collect::<Result<_>>()?;
        Ok((Arc::clone(def), views))
    }

    /// Every table at `snapshot`, for planning scans on.
    pub fn at(self: &Arc<Self>, snapshot: Snapshot) -> EngineSnapshot {
        EngineSnapshot { engine: Arc::clone(self), snapshot }
    }

    /// Scans `table` at `snapshot`.
    pub fn scan(&self, snapshot: &Snapshot, table: &str, options: ScanOptions) -> Result<Scan> {
        let (def, views) = self.views_at(table, snapshot.qts())?;
        Scan::new(snapshot.clone(), self.lake.clone(), def, views, options)
    }

    pub(crate) fn all_parts(&self) -> Vec<Arc<TablePart>> {
        self.read_tables().by_id.iter().flat_map(|t| t.parts.iter().cloned()).collect()
    }

    /// Keeps objects that combine and storage GC replaced for `grace`
    /// after the first committed checkpoint without them (default: none),
    /// for readers this engine does not know of: an Iceberg reader that
    /// loaded the metadata of the checkpoint before has that long to read
    /// the files it names.
    pub fn set_retire_grace(&self, grace: std::time::Duration) {
        lock(&self.retired).grace = grace;
    }

    /// Has `worker` run combine's and storage GC's rewrites from now on
    /// (rewrites under way finish on the one they began on).
    pub fn set_rewrite_worker(&self, worker: Arc<dyn RewriteWorker>) {
        *lock(&self.rewrite_worker) = worker;
    }

    /// Counters of the rewrites this engine asked for.
    pub fn rewrite_stats(&self) -> &RewriteStats {
        &self.rewrite_stats
    }

    /// Runs `requests` on the rewrite worker (up to its concurrency at
    /// once), outcomes in request order.
    pub(crate) fn run_rewrites(
        &self,
        requests: &[RewriteRequest],
    ) -> Vec<std::result::Result<RewriteAnswer, SplitFailure>> {
        let worker = Arc::clone(&*lock(&self.rewrite_worker));
        crate::rewrite::run_all(worker.as_ref(), requests, &self.rewrite_stats)
    }

    /// Combines every sealed virtual file whose blocks are all flushed into a
    /// regular file with the same id and row order. Returns how many. A
    /// rewrite that fails leaves its file virtual (logged and counted in
    /// [`Engine::rewrite_stats`]); the next round tries again.
    pub fn combine(&self) -> Result<usize> {
        let mut candidates = Vec::new();
        for part in self.all_parts() {
            let state = lock(&part.state);
            for f in &state.files {
                let FileKind::Virtual { blocks, sealed: true } = &f.kind else { continue };
                // The block objects, in order; `None` while one is still in memory.
                let paths: Option<Vec<Path>> = blocks
                    .iter()
                    .map(|b| match &b.data {
                        BlockData::Flushed(p) => Some(p.clone()),
                        BlockData::Memory(_) => None,
                    })
                    .collect();
                let Some(paths) = paths.filter(|p| !p.is_empty()) else { continue };
                // Under the part's lock: a round holding the claim has not
                // swapped yet; one that swapped left the file regular.
                let Some(claim) = self.rewriting.claim(part.table.id, f.id) else { continue };
                let rows: Vec<usize> = blocks.iter().map(|b| b.rows).collect();
                candidates.push((Arc::clone(&part), f.id, rows, paths, claim));
            }
        }
        // Each round writes an object of its own (see `combined_path`).
        let outputs: Vec<Path> = candidates
            .iter()
            // Relaxed: ids only need to be unique (they carry the epoch).
            .map(|(part, id, ..)| {
                combined_path(part.table.id, *id, crate::ids::FileId(self.file_ids.fetch_add(1, Ordering::Relaxed)))
            })
            .collect();
        let requests: Vec<RewriteRequest> = candidates
            .iter()
            .zip(&outputs)
            .map(|((_, _, _, paths, _), output)| RewriteRequest {
                lake: None,
                job: RewriteJob::Combine { blocks: paths.iter().map(Path::to_string).collect() },
                output: output.to_string(),
                row_group_rows: self.config.block_rows,
            })
            .collect();
        let answers = self.run_rewrites(&requests);
        let mut combined = 0;
        for (((part, id, block_rows, paths, _claim), answer), output) in
            candidates.into_iter().zip(answers).zip(outputs)
        {
            let answer = answer.map_err(|f| f.to_string()).and_then(|a| {
                let groups: Vec<usize> = a.row_groups.iter().map(|g| g.rows).collect();
                if groups == block_rows {
                    Ok(a)
                } else {
                    Err(format!("row groups of {groups:?} rows for blocks of {block_rows:?}"))
                }
            });
            let answer = match answer {
                Ok(a) => a,
                Err(why) => {
                    tracing::warn!(table = %part.table.name, file = %id, "combine left the file virtual (the next round retries): {why}");
                    self.discard_output(&output);
                    continue;
                }
            };
            let regular = answer.file(output);
            let mut state = lock(&part.state);
            if let Some(f) = state.files.iter_mut().find(|f| f.id == id) {
                f.kind = FileKind::Regular(Arc::new(regular));
            }
            // Readers registered before this point may still read the blocks.
            // Pushed while the part's lock is held: a checkpoint that
            // began before this push reads the part after the swap.
            let mut retired = lock(&self.retired);
            let begun_before = retired.checkpoints_begun;
            retired.entries.push(Retired::new(self.clock.registration_seq(), paths, begun_before));
            combined += 1;
        }
        Ok(combined)
    }

    /// The storage-GC queue: regular files whose stale fraction (rows
    /// deleted as of the newest snapshot over rows stored) is at least
    /// `threshold`, most stale first. Rewriting them is storage GC's job.
    pub fn storage_gc_candidates(&self, threshold: f64) -> Result<Vec<StaleFile>> {
        let snapshot = self.snapshot();
        let mut out = Vec::new();
        for part in self.all_parts() {
            let files: Vec<_> = lock(&part.state)
                .files
                .iter()
                .filter_map(|f| match &f.kind {
                    FileKind::Regular(r) => Some((f.id, r.rows(), Arc::clone(&f.vis))),
                    FileKind::Virtual { .. } => None,
                })
                .collect();
            for (file, rows, vis) in files {
                let deleted = vis.deleted_rows(snapshot.qts())?.len();
                if rows > 0 && deleted as f64 / rows as f64 >= threshold {
                    out.push(StaleFile { table: part.table.name.clone(), file, rows, deleted });
                }
            }
        }
        out.sort_by(|a, b| (b.deleted * a.rows).cmp(&(a.deleted * b.rows)));
        Ok(out)
    }

    /// One round of garbage collection below LWM: folds tile visibility,
    /// purges index versions, deletes objects no live snapshot can read.
    /// Changes no answer of any query.
    pub fn gc(&self) -> Result<GcReport> {
        let lwm = self.clock.lwm();
        let mut report = GcReport { lwm, ..GcReport::default() };
        for part in self.all_parts() {
            let files: Vec<_> = lock(&part.state).files.iter().map(|f| Arc::clone(&f.vis)).collect();
            report.visibility_blocks_freed += files.iter().map(|v| v.fold(lwm)).sum::<usize>();
        }
        for shard in &self.shards {
            report.index_versions_dropped += lock(shard).purge(lwm);
        }
        for table in &mut self.tables.write().unwrap_or_else(|p| p.into_inner()).by_id {
            table.forget_before(lwm);
        }
        {
            // Keep the newest entry at or below LWM: snapshots at LWM need it.
            lock(&self.source_commits).forget_below_newest_at(lwm.get());
        }
        let oldest = self.clock.oldest_registration();
        let floor = self.oldest_reader()?.map_or(u64::MAX, Ts::get);
        let ready: Vec<Path> = {
            let mut retired = lock(&self.retired);
            // Acquire: pairs with the Release in `write_checkpoint`.
            let checkpointing = self.checkpointing.load(std::sync::atomic::Ordering::Acquire);
            // Acquire: pairs with the Release in `checkpoint_committed`.
            let committed = self.committed_checkpoint.load(std::sync::atomic::Ordering::Acquire);
            // Left out of a committed checkpoint, and no registered reader
            // reads an older one.
            let grace = retired.grace;
            let covered = |r: &Retired| {
                r.left_out_at.is_some_and(|(c, id)| id <= committed && c <= floor)
                    && r.left_out_when.is_none_or(|t| t.elapsed() >= grace)
            };
            let (ready, keep): (Vec<_>, Vec<_>) =
                retired.entries.drain(..).partition(|r| r.seq <= oldest && (covered(r) || !checkpointing));
            retired.entries = keep;
            ready.into_iter().flat_map(|r| r.paths).collect()
        };
        for (i, p) in ready.iter().enumerate() {
            if let Err(e) = self.lake.delete(p) {
                // What is left was ready: queued again as ready (no reader,
                // no checkpoint needs it), for the next round.
                lock(&self.retired).entries.push(Retired {
                    seq: 0,
                    paths: ready[i..].to_vec(),
                    begun_before: 0,
                    left_out_at: Some((0, 0)),
                    left_out_when: None,
                });
                return Err(e);
            }
        }
        report.objects_deleted = ready.len();
        Ok(report)
    }

    /// The oldest snapshot registered readers on other hosts read (`None`:
    /// none), from the timestamp store (see
    /// [`crate::mvcc::TxnStore::readers`]). GC and checkpoint clean-up keep
    /// what they read.
    pub fn oldest_reader(&self) -> Result<Option<Ts>> {
        Ok(self.clock.store().readers(crate::catalog::now_us())?.iter().map(|r| r.qts).min())
    }

    /// Tells the engine that `manifest` (written by
    /// [`Engine::write_checkpoint`]) is now the lake's committed checkpoint:
    /// objects it no longer names may be deleted once no reader needs them.
    pub fn checkpoint_committed(&self, manifest: &crate::checkpoint::Manifest) {
        {
            let mut last = lock(&self.last_checkpoint);
            // One at the same ts is newer all the same (checkpoints commit
            // one after another): storage GC may have moved rows since.
            if last.as_ref().is_none_or(|m| m.checkpoint_ts <= manifest.checkpoint_ts) {
                *last = Some(Arc::new(manifest.to_extend()));
            }
        }
        // Release: pairs with the Acquire in `gc` and in the drop of a
        // `PendingCheckpoint`.
        self.committed_checkpoint.fetch_max(manifest.next_file_id, std::sync::atomic::Ordering::Release);
    }

    /// Names the objects this engine creates from now on within `epoch`'s
    /// range of file ids, so that a fenced predecessor still running can
    /// never write an object under a name this engine uses.
    pub fn fence_file_ids(&self, epoch: u64) {
        // Relaxed: called before any apply; ids only need to be unique.
        self.file_ids.fetch_max(epoch << FILE_ID_EPOCH_SHIFT, std::sync::atomic::Ordering::Relaxed);
    }

    /// Memory by component.
    pub fn memory(&self) -> MemoryStats {
        let mut m = MemoryStats::default();
        for part in self.all_parts() {
            m.buffer_bytes += part.memory_bytes();
            m.tuples += part.tuples();
            m.visibility_bytes += lock(&part.state).files.iter().map(|f| f.vis.memory_bytes()).sum::<usize>();
        }
        for shard in &self.shards {
            let (index, vis) = lock(shard).memory_bytes();
            m.index_bytes += index;
            m.visibility_bytes += vis;
        }
        m
    }
}

/// Source commit times (µs) by mirror ts, in ts order. Mirror
/// transactions are noted in the order they begin, so a note is an
/// append (it was a `BTreeMap` insert per transaction).
#[derive(Default)]
struct SourceCommits(std::collections::VecDeque<(u64, i64)>);

impl SourceCommits {
    fn insert(&mut self, ts: u64, us: i64) {
        let at = match self.0.back() {
            Some(&(last, _)) if last < ts => self.0.len(),
            _ => self.0.partition_point(|&(t, _)| t < ts),
        };
        match self.0.get_mut(at) {
            Some(entry) if entry.0 == ts => entry.1 = us,
            _ => self.0.insert(at, (ts, us)),
        }
    }

    fn get(&self, ts: u64) -> Option<i64> {
        let at = self.0.partition_point(|&(t, _)| t < ts);
        self.0.get(at).filter(|e| e.0 == ts).map(|e| e.1)
    }

    /// The newest entry at or below `ts`.
    fn at_or_below(&self, ts: u64) -> Option<(u64, i64)> {
        let at = self.0.partition_point(|&(t, _)| t <= ts);
        at.checked_sub(1).map(|i| self.0[i])
    }

    /// Drops the entries below the newest one at or below `ts`.
    fn forget_below_newest_at(&mut self, ts: u64) {
        let at = self.0.partition_point(|&(t, _)| t <= ts);
        self.0.drain(..at.saturating_sub(1));
    }
}

/// Operations split by shard, with their indices in the caller's list.
pub(crate) type Routed = (Vec<Vec<ShardOp>>, Vec<Vec<usize>>);

/// Maps a shard-local operation index in a key conflict to the caller's.
fn origin_of(e: Error, origins: &[usize]) -> Error {
    match e {
        Error::KeyConflict { table, key, message, op } => {
            Error::KeyConflict { table, key, message, op: op.and_then(|i| origins.get(i).copied()) }
        }
        other => other,
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        lock(&self.flush_tx).take();
        if let Some(t) = lock(&self.flush_thread).take()
            && t.join().is_err()
        {
            tracing::error!("the flush thread panicked");
        }
    }
}

fn flush_loop(rx: Receiver<FlushJob>, lake: Lake, flusher: Arc<Flusher>, block_rows: usize) {
    for job in rx {
        // A panic is this block's flush failure, not a dead flusher that
        // `flush()` would wait for forever.
        let what = || format!("flushing {} block {} of {}", job.file, job.block.index, job.part.table.name);
        let result = crate::error::catch_panic(what, || flush_block(&lake, &job, block_rows));
        let mut st = lock(&flusher.state);
        if let Err(e) = result {
            tracing::error!(table = %job.part.table.name, file = %job.file, block = job.block.index, error = %e, "flush failed; the block stays in memory");
            st.failures += 1;
            st.last_error = Some(format!("table {}, {} block {}: {e}", job.part.table.name, job.file, job.block.index));
        }
        st.pending -= 1;
        if st.pending == 0 {
            flusher.idle.notify_all();
        }
    }
}

fn flush_block(lake: &Lake, job: &FlushJob, block_rows: usize) -> Result<()> {
    #[cfg(test)]
    tests::maybe_panic();
    let BlockData::Memory(batch) = &job.block.data else {
        return Ok(());
    };
    let path = block_path(job.part.table.id, job.file, job.block.index, job.block.writer);
    lake.put(&path, encode_block(std::slice::from_ref(batch), block_rows)?)?;
    let mut state = lock(&job.part.state);
    let file = state.files.iter_mut().find(|f| f.id == job.file);
    if let Some(FileKind::Virtual { blocks, .. }) = file.map(|f| &mut f.kind)
        && let Some(slot) = blocks.iter_mut().find(|b| b.index == job.block.index)
    {
        let mut flushed = (**slot).clone();
        flushed.data = BlockData::Flushed(path);
        *slot = Arc::new(flushed);
    }
    Ok(())
}

/// A running engine's tables at one registered snapshot.
#[derive(Clone)]
pub struct EngineSnapshot {
    /// The engine.
    pub engine: Arc<Engine>,
    /// The snapshot every scan answers at (registered while this lives).
    pub snapshot: Snapshot,
}

impl crate::scan::SnapshotTables for EngineSnapshot {
    fn qts(&self) -> Ts {
        self.snapshot.qts()
    }

    fn tables(&self) -> Vec<Arc<TableDef>> {
        self.engine.tables_at(self.snapshot.qts())
    }

    fn scan(&self, table: &str, options: ScanOptions) -> Result<Scan> {
        self.engine.scan(&self.snapshot, table, options)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::schema::Value;

    static PANIC_FLUSH: AtomicBool = AtomicBool::new(false);

    pub(super) fn maybe_panic() {
        // Relaxed: a test flag, set before the flush is queued.
        if PANIC_FLUSH.load(Ordering::Relaxed) {
            panic!("injected flush panic");
        }
    }

    proptest::proptest! {
        /// Source commit times answer as the ordered map they replaced,
        /// notes in any order (begun order is only the common case).
        #[test]
        fn source_commits_answer_as_an_ordered_map(
            steps in proptest::collection::vec((0u8..4, 0u64..64, proptest::num::i64::ANY), 1..200),
        ) {
            let (mut commits, mut model) = (SourceCommits::default(), std::collections::BTreeMap::new());
            for (what, ts, us) in steps {
                match what {
                    0 | 1 => {
                        commits.insert(ts, us);
                        model.insert(ts, us);
                    }
                    2 => {
                        commits.forget_below_newest_at(ts);
                        if let Some(keep) = model.range(..=ts).next_back().map(|(t, _)| *t) {
                            model.retain(|t, _| *t >= keep);
                        }
                    }
                    _ => {}
                }
                proptest::prop_assert_eq!(commits.get(ts), model.get(&ts).copied());
                proptest::prop_assert_eq!(commits.at_or_below(ts), model.range(..=ts).next_back().map(|(t, c)| (*t, *c)));
                proptest::prop_assert_eq!(commits.0.iter().copied().collect::<Vec<_>>(), model.iter().map(|(t, c)| (*t, *c)).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn a_panicking_flush_is_a_flush_failure_not_a_hang() {
        let engine = Engine::in_memory(EngineConfig::default().with_shards(1).with_blocks(4, 2)).unwrap();
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        let t = engine.create_table("s.t", Arc::new(schema), vec![0]).unwrap();
        PANIC_FLUSH.store(true, Ordering::Relaxed);
        engine.apply((0..10).map(|k| Op::Insert { table: t.id, row: vec![Value::Int(k)] }).collect()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = Arc::clone(&engine);
        std::thread::spawn(move || {
            let _ = tx.send(waiter.flush().map_err(|e| e.to_string()));
        });
        let message = rx.recv_timeout(Duration::from_secs(5)).expect("flush hung").unwrap_err();
        PANIC_FLUSH.store(false, Ordering::Relaxed);
        assert!(message.contains("panicked: injected flush panic"), "{message}");
        assert!(engine.flush_failures() > 0);
        // The blocks stay in memory and readable; a later flush writes them.
        let rows = |e: &Engine| -> usize {
            e.scan(&e.snapshot(), "s.t", ScanOptions::default())
                .unwrap()
                .collect_batches()
                .unwrap()
                .iter()
                .map(|b| b.num_rows())
                .sum()
        };
        assert_eq!(rows(&engine), 10);
        engine.apply(vec![Op::Insert { table: t.id, row: vec![Value::Int(99)] }]).unwrap();
        engine.flush().unwrap();
        assert_eq!(rows(&engine), 11);
    }
}
