//! The VFoR scan: the visible versions of a table at a snapshot, as Arrow
//! record batches.
//!
//! ```text
//!  snapshot qts ─▶ one view per table part (files + active rows, one lock each)
//!                    │
//!                    ▼ splits: row group of a regular file │ block of a virtual file │ active rows
//!  per split:  skip if min create_ts > qts (or the filter's statistics exclude it)
//!              mask  = create_ts ≤ qts          (only when max create_ts > qts)
//!              mask &= ¬ deleted_bitmap(qts)     (tile visibility)
//!              mask &= filter(row)               (optional predicate)
//!              batch → projection → keep the rows of mask (in place)
//! ```
//!
//! Rows come in no set order (as SQL allows): splits in file order, but a
//! batch's last kept rows may take the places of its hidden ones
//! ([`keep_rows`](crate::compact::keep_rows)).
//!
//! The scan holds its [`Snapshot`], so LWM cannot pass `qts` while any batch
//! is still to come, and memory GC or combine running meanwhile change no
//! answer.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::{Array, BooleanArray, Datum, Int64Array, Scalar};
use arrow::compute::kernels::cmp;
use arrow::datatypes::{Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use fovea_scan_wasm as kernel;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;

use crate::buffer::{ActiveRows, Block, BlockData, FileKind, PartView};
use crate::error::{Error, Result};
use crate::ids::{FileId, Ts};
use crate::lake::{Lake, RegularFile, RowGroupInfo, create_ts_column};
use crate::mvcc::Snapshot;
use crate::schema::{CREATE_TS_COLUMN, CREATE_TS_FIELD_ID, TableDef, Value};
pub use crate::split::{DeletedSource, SplitTask};
use crate::visibility::FileVisibility;

/// Rows a scan decodes of a row group at a time (and at most returns in
/// one batch) unless [`ScanOptions::batch_rows`] says otherwise: fovea's
/// own row groups (one block each) decode as one batch; a larger one is
/// returned in batches of this size (all of them filtered when the row
/// group is read).
pub const SCAN_BATCH_ROWS: usize = 8192;

/// Whether the scan applies visibility. `Off` returns every stored version
/// (deleted and uncommitted ones too) and exists only to measure the cost of
/// VFoR in benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VisibilityMode {
    /// Snapshot semantics (the only correct mode).
    #[default]
    Enforced,
    /// No visibility filtering: benchmarking only.
    Off,
}

/// A comparison operator of a [`Predicate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CmpOp {
    /// `=`
    Eq,
    /// `<>`
    NotEq,
    /// `<`
    Lt,
    /// `<=`
    LtEq,
    /// `>`
    Gt,
    /// `>=`
    GtEq,
}

/// A filter pushed into the scan: evaluated per row, and used to skip row
/// groups whose statistics exclude it. NULLs never match.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Predicate {
    /// `column op value`, column by index in the table schema.
    Compare {
        /// Column index.
        column: usize,
        /// Operator.
        op: CmpOp,
        /// Literal.
        value: Value,
    },
    /// All of them.
    And(Vec<Predicate>),
}

impl Predicate {
    fn columns(&self, out: &mut Vec<usize>) {
        match self {
            Predicate::Compare { column, .. } => out.push(*column),
            Predicate::And(ps) => ps.iter().for_each(|p| p.columns(out)),
        }
    }
}

/// What to scan.
#[derive(Clone, Debug, Default)]
pub struct ScanOptions {
    /// User columns to return, by index, in this order (`None`: all).
    pub projection: Option<Vec<usize>>,
    /// Optional filter.
    pub filter: Option<Predicate>,
    /// Visibility (always `Enforced` outside benchmarks).
    pub visibility: VisibilityMode,
    /// Read at a visibility checkpoint instead of the tiles: rows visible at
    /// its `qts` (the scan's own snapshot then only protects the files it
    /// reads from being retired).
    pub frozen: Option<std::sync::Arc<crate::frozen::FrozenVisibility>>,
    /// Rows of a row group decoded (and so at most returned) at a time
    /// (`None`: [`SCAN_BATCH_ROWS`]).
    pub batch_rows: Option<usize>,
}

/// Counters of one scan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanMetrics {
    /// Splits (row groups, blocks, active rows) read.
    pub splits_read: usize,
    /// Splits skipped because all their rows are newer than qts.
    pub splits_skipped_by_ts: usize,
    /// Row groups skipped by the filter's statistics.
    pub splits_skipped_by_filter: usize,
    /// Rows decoded.
    pub rows_read: usize,
    /// Stored splits (row groups, flushed blocks) decoded with their hidden
    /// create_ts column: those with rows newer than the snapshot, when
    /// visibility is enforced (or when no column is read, to count rows).
    pub splits_read_with_create_ts: usize,
    /// Rows returned.
    pub rows_returned: usize,
}

/// Where a scan gets the rows of a file deleted at its snapshot: the
/// tiles of a running engine ([`FileVisibility`]), a visibility checkpoint
/// ([`crate::frozen::FrozenVisibility`]), or the deleted rows a lake
/// checkpoint recorded ([`crate::reader`]).
pub trait DeletedRows: Send + Sync {
    /// Deleted bits of rows `[start, start + rows)` of `file` at `qts` into
    /// `out` (bit `i` is row `start + i`; bits past `rows` are zero).
    fn deleted_bitmap(&self, file: FileId, start: usize, rows: usize, qts: Ts, out: &mut Vec<u64>) -> Result<()>;

    /// Where a worker without this source gets the same bits: by default
    /// the bitmap itself (what the tiles or a visibility checkpoint say
    /// now); a source in the lake names its object instead.
    fn describe(&self, file: FileId, start: usize, rows: usize, qts: Ts) -> Result<DeletedSource> {
        let mut words = Vec::new();
        self.deleted_bitmap(file, start, rows, qts, &mut words)?;
        Ok(DeletedSource::bitmap(&words))
    }
}

impl DeletedRows for FileVisibility {
    fn deleted_bitmap(&self, file: FileId, start: usize, rows: usize, qts: Ts, out: &mut Vec<u64>) -> Result<()> {
        if file != self.file() {
            return Err(Error::invariant(format!("visibility of {} asked for {file}", self.file())));
        }
        FileVisibility::deleted_bitmap(self, start, rows, qts, out)
    }
}

/// Tables at one snapshot on which scans are planned: a running engine at
/// a registered snapshot ([`crate::engine::EngineSnapshot`]), or a lake
/// read as of its newest checkpoint ([`crate::reader::CheckpointReader`]).
/// Every scan planned on one value answers at the same snapshot.
pub trait SnapshotTables: Send + Sync {
    /// The snapshot timestamp.
    fn qts(&self) -> Ts;
    /// Every table, by id.
    fn tables(&self) -> Vec<Arc<TableDef>>;
    /// Plans a scan of `table` (reads no data).
    fn scan(&self, table: &str, options: ScanOptions) -> Result<Scan>;
}

/// A file a scan may read, with where its deleted rows come from.
pub(crate) struct ScanFile {
    pub(crate) id: FileId,
    pub(crate) deletes: Arc<dyn DeletedRows>,
    pub(crate) kind: FileKind,
}

#[derive(Clone)]
pub(crate) enum Split {
    RowGroup { file: Arc<RegularFile>, id: FileId, deletes: Arc<dyn DeletedRows>, rg: usize, info: RowGroupInfo },
    Block { id: FileId, deletes: Arc<dyn DeletedRows>, block: Arc<Block>, offset: usize },
    Active { id: FileId, deletes: Arc<dyn DeletedRows>, offset: usize, batch: RecordBatch },
}

impl Split {
    /// Rows stored in the split (visible or not).
    fn rows(&self) -> usize {
        match self {
            Split::RowGroup { info, .. } => info.rows,
            Split::Block { block, .. } => block.rows,
            Split::Active { batch, .. } => batch.num_rows(),
        }
    }
}

/// An in-progress scan; an iterator of record batches. Planning reads no
/// data: the splits (row groups, blocks, active rows) are fixed from one
/// view of the table, and each is read when its turn comes. A clone starts
/// over with the same splits; [`Scan::partition`] divides them.
#[derive(Clone)]
pub struct Scan {
    /// Keeps what the scan reads from being retired (a registered
    /// [`Snapshot`], or a lake reader's registration) until it is dropped.
    _hold: Arc<dyn std::any::Any + Send + Sync>,
    pub(crate) qts: Ts,
    pub(crate) lake: Lake,
    pub(crate) table: Arc<TableDef>,
    pub(crate) options: ScanOptions,
    /// User columns decoded, sorted; the hidden column follows them.
    pub(crate) read_columns: Vec<usize>,
    /// Positions (in the decoded batch) of the output columns.
    output_positions: Vec<usize>,
    output_schema: SchemaRef,
    pub(crate) splits: VecDeque<Split>,
    metrics: ScanMetrics,
    scratch: Vec<u64>,
    /// Filtered batches of the split being read, not yet returned.
    ready: VecDeque<RecordBatch>,
    /// Stop after returning this many rows.
    pub(crate) limit: Option<usize>,
}

impl Scan {
    /// Plans a scan of `table` over the given part views (all taken after
    /// `snapshot` was registered).
    pub fn new(
        snapshot: Snapshot,
        lake: Lake,
        table: Arc<TableDef>,
        views: Vec<PartView>,
        options: ScanOptions,
    ) -> Result<Self> {
        let mut files = Vec::new();
        let mut active = Vec::new();
        for view in views {
            for f in view.files {
                files.push(ScanFile { id: f.id, deletes: f.vis, kind: f.kind });
            }
            active.extend(view.active);
        }
        let qts = snapshot.qts();
        Self::plan(Arc::new(snapshot), qts, lake, table, files, active, options)
    }

    /// Plans a scan at `qts` of `files` then `active` rows, `hold` keeping
    /// them from being retired. Reads no data (a footer only where a filter
    /// prunes row groups by statistics).
    pub(crate) fn plan(
        hold: Arc<dyn std::any::Any + Send + Sync>,
        qts: Ts,
        lake: Lake,
        table: Arc<TableDef>,
        files: Vec<ScanFile>,
        active: Vec<ActiveRows>,
        options: ScanOptions,
    ) -> Result<Self> {
        let mut scan = Self::empty(hold, qts, lake, table, options)?;
        let (lake, table, options) = (&scan.lake, &scan.table, &scan.options);
        // A visibility checkpoint answers for every file at its own qts.
        let frozen = options.frozen.clone().map(|f| (f.qts(), f as Arc<dyn DeletedRows>));
        let qts = frozen.as_ref().map_or(qts, |(q, _)| *q);
        let deletes_of = |d: Arc<dyn DeletedRows>| frozen.as_ref().map_or(d, |(_, f)| Arc::clone(f));
        let enforced = options.visibility == VisibilityMode::Enforced;
        let mut metrics = ScanMetrics::default();
        let mut splits = VecDeque::new();
        for file in files {
            let deletes = deletes_of(file.deletes);
            match file.kind {
                FileKind::Regular(r) => {
                    let keep = prune_row_groups(lake, table, &r, options.filter.as_ref())?;
                    for (rg, info) in r.row_groups.iter().enumerate() {
                        if enforced && info.min_ts > qts {
                            metrics.splits_skipped_by_ts += 1;
                        } else if !keep[rg] {
                            metrics.splits_skipped_by_filter += 1;
                        } else {
                            let (id, deletes, info) = (file.id, Arc::clone(&deletes), *info);
                            splits.push_back(Split::RowGroup { file: Arc::clone(&r), id, deletes, rg, info });
                        }
                    }
                }
                FileKind::Virtual { blocks, .. } => {
                    let mut offset = 0;
                    for block in blocks {
                        let rows = block.rows;
                        if enforced && block.min_ts > qts {
                            metrics.splits_skipped_by_ts += 1;
                        } else {
                            splits.push_back(Split::Block {
                                id: file.id,
                                deletes: Arc::clone(&deletes),
                                block,
                                offset,
                            });
                        }
                        offset += rows;
                    }
                }
            }
        }
        for a in active {
            let deletes = deletes_of(a.vis);
            splits.push_back(Split::Active { id: a.file, deletes, offset: a.offset, batch: a.batch });
        }
        scan.qts = qts;
        scan.splits = splits;
        scan.metrics = metrics;
        Ok(scan)
    }

    /// A scan at `qts` of `options`' columns of `table` with no splits yet.
    pub(crate) fn empty(
        hold: Arc<dyn std::any::Any + Send + Sync>,
        qts: Ts,
        lake: Lake,
        table: Arc<TableDef>,
        options: ScanOptions,
    ) -> Result<Self> {
        let n = table.schema.fields().len();
        let projection: Vec<usize> = options.projection.clone().unwrap_or_else(|| (0..n).collect());
        let mut wanted = projection.clone();
        if let Some(f) = &options.filter {
            f.columns(&mut wanted);
        }
        if let Some(&bad) = wanted.iter().find(|&&c| c >= n) {
            return Err(Error::Schema {
                table: table.name.clone(),
                column: format!("#{bad}"),
                message: format!("column index out of range (the table has {n} columns)"),
            });
        }
        let mut read_columns = wanted.clone();
        read_columns.sort_unstable();
        read_columns.dedup();
        let output_positions = projection
            .iter()
            .map(|c| read_columns.binary_search(c).unwrap_or_else(|_| unreachable!("c was added")))
            .collect();
        let output_schema =
            Arc::new(Schema::new(projection.iter().map(|&c| table.schema.field(c).clone()).collect::<Vec<_>>()));
        Ok(Scan {
            _hold: hold,
            qts,
            lake,
            table,
            options,
            read_columns,
            output_positions,
            output_schema,
            splits: VecDeque::new(),
            metrics: ScanMetrics::default(),
            scratch: Vec::new(),
            ready: VecDeque::new(),
            limit: None,
        })
    }

    /// Stops after `limit` rows (what a `LIMIT` needs at most): splits
    /// after that are never read.
    pub fn with_limit(mut self, limit: Option<usize>) -> Self {
        self.limit = limit;
        self
    }

    /// Splits still to read.
    pub fn splits(&self) -> usize {
        self.splits.len()
    }

    /// Rows stored in the splits still to read: an upper bound of what the
    /// scan returns (deleted and newer versions are among them).
    pub fn stored_rows(&self) -> usize {
        self.splits.iter().map(Split::rows).sum::<usize>() + self.ready.iter().map(RecordBatch::num_rows).sum::<usize>()
    }

    /// Divides the splits into at most `n` scans of contiguous splits with
    /// about as many stored rows each (at least one scan, possibly empty).
    /// Together they return what this scan returns.
    pub fn partition(mut self, n: usize) -> Vec<Scan> {
        let n = n.clamp(1, self.splits.len().max(1));
        let total = self.stored_rows().max(1);
        let splits = std::mem::take(&mut self.splits);
        // Batches already read belong to the first part only.
        let ready = std::mem::take(&mut self.ready);
        let mut parts: Vec<Scan> = Vec::with_capacity(n);
        let mut current = self.clone();
        let mut rows = 0usize;
        for split in splits {
            // Close a part once it holds its share (the last takes the rest).
            if parts.len() + 1 < n && rows >= total * (parts.len() + 1) / n && !current.splits.is_empty() {
                parts.push(std::mem::replace(&mut current, self.clone()));
            }
            rows += split.rows();
            current.splits.push_back(split);
        }
        parts.push(current);
        parts[0].ready = ready;
        parts
    }

    /// The snapshot timestamp.
    pub fn qts(&self) -> Ts {
        self.qts
    }

    /// Schema of the returned batches.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.output_schema)
    }

    /// The lake it reads.
    pub fn lake(&self) -> Lake {
        self.lake.clone()
    }

    /// Counters so far.
    pub fn metrics(&self) -> ScanMetrics {
        self.metrics
    }

    /// Drains the scan into a vector.
    pub fn collect_batches(mut self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        while let Some(b) = self.next_batch()? {
            out.push(b);
        }
        Ok(out)
    }

    /// The next non-empty batch, or `None` at the end.
    pub fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        if let Some(limit) = self.limit {
            let left = limit.saturating_sub(self.metrics.rows_returned);
            if left == 0 {
                self.splits.clear();
                self.ready.clear();
                return Ok(None);
            }
            return Ok(self.next_visible()?.map(|b| {
                let b = if b.num_rows() > left { b.slice(0, left) } else { b };
                // Counted by `finish` before the cut: count what is returned.
                self.metrics.rows_returned = self.metrics.rows_returned.min(limit);
                b
            }));
        }
        self.next_visible()
    }

    fn next_visible(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if let Some(batch) = self.ready.pop_front() {
                return Ok(Some(batch));
            }
            let Some(split) = self.splits.pop_front() else { return Ok(None) };
            self.metrics.splits_read += 1;
            let ((batch, unconverted), id, deletes, offset, max_ts) = match split {
                Split::RowGroup { file, id, deletes, rg, info } => {
                    // Decoding everything and then filtering measured faster
                    // than handing the bitmap to the decoder as a row
                    // selection (1.09 vs 1.11–1.22 of a plain scan at 1%
                    // scattered deletes).
                    self.read_row_group(&file, rg, id, deletes.as_ref(), info)?;
                    continue;
                }
                Split::Block { id, deletes, block, offset } => {
                    let batch = match &block.data {
                        BlockData::Memory(b) => b.clone(),
                        BlockData::Flushed(path) => {
                            let with_ts = self.reads_create_ts(block.min_ts, block.max_ts);
                            self.metrics.splits_read_with_create_ts += usize::from(with_ts);
                            let columns = self.stored_columns(with_ts);
                            self.lake.read_block_columns(path, Some(&columns))?
                        }
                    };
                    (self.project_decoded(&batch, (block.min_ts, block.max_ts))?, id, deletes, offset, block.max_ts)
                }
                // In memory with its create_ts: read and checked.
                Split::Active { id, deletes, offset, batch } => {
                    (self.project_decoded(&batch, (Ts::ZERO, Ts::MAX))?, id, deletes, offset, Ts::MAX)
                }
            };
            if let Some(out) = self.filter(batch, unconverted, id, deletes.as_ref(), offset, max_ts)? {
                self.ready.push_back(out);
            }
        }
    }

    /// The read columns (+ hidden) of a stored batch ([`project_stored`]):
    /// a batch written before a column was added reads it as NULL, one
    /// written before a type change through a cast.
    /// `bounds`: the smallest and largest create_ts of its rows, where the
    /// batch does not hold them.
    pub(crate) fn project_decoded(
        &self,
        batch: &RecordBatch,
        bounds: (Ts, Ts),
    ) -> Result<(RecordBatch, Option<Unconverted>)> {
        project_stored(&self.table, &self.read_columns, batch, bounds)
    }

    /// Whether a stored split whose rows were created from `min_ts` to
    /// `max_ts` must be read with its hidden create_ts column: only when
    /// the scan enforces visibility and some of its rows may be newer than
    /// the snapshot, or when some of its rows may predate a read column
    /// added to the table and some not (otherwise nothing reads the
    /// column, and decoding it is 8 bytes a row for nothing). A scan of no
    /// columns reads it to count rows.
    fn reads_create_ts(&self, min_ts: Ts, max_ts: Ts) -> bool {
        (self.options.visibility == VisibilityMode::Enforced && max_ts > self.qts)
            || self.read_columns.is_empty()
            || reads_create_ts_for_added(&self.table, &self.read_columns, (min_ts, max_ts))
    }

    /// The stored columns a split reads (name, field id): the read
    /// columns, then the hidden create_ts column if `with_ts`.
    fn stored_columns(&self, with_ts: bool) -> Vec<(&str, i32)> {
        let mut columns: Vec<(&str, i32)> = self
            .read_columns
            .iter()
            .map(|&c| (self.table.schema.field(c).name().as_str(), self.table.column_id(c)))
            .collect();
        if with_ts {
            columns.push((CREATE_TS_COLUMN, CREATE_TS_FIELD_ID));
        }
        columns
    }

    /// One row group of a regular file, filtered into [`Scan::ready`]:
    /// only the byte ranges of the read columns' chunks are fetched (the
    /// footer is cached in the file), and it is decoded
    /// [`ScanOptions::batch_rows`] rows at a time, each batch filtered as
    /// soon as it is decoded.
    fn read_row_group(
        &mut self,
        file: &RegularFile,
        rg: usize,
        id: FileId,
        deletes: &dyn DeletedRows,
        info: RowGroupInfo,
    ) -> Result<()> {
        let with_ts = self.reads_create_ts(info.min_ts, info.max_ts);
        self.metrics.splits_read_with_create_ts += usize::from(with_ts);
        let lake = self.lake.clone();
        let metadata = file.metadata(&lake)?;
        let mask = crate::lake::projection_of(metadata, &self.stored_columns(with_ts));
        let mut offset = info.offset;
        let batch_rows = self.options.batch_rows.unwrap_or(SCAN_BATCH_ROWS).max(1);
        let decoder = crate::lake::row_groups_decoder(metadata, vec![rg], mask, batch_rows)?;
        lake.decode(&file.path, decoder, None, |batch| {
            let rows = batch.num_rows();
            let (projected, unconverted) = self.project_decoded(&batch, (info.min_ts, info.max_ts))?;
            // The decoded batch's references go, so that the columns the
            // projection alone holds are compacted in place.
            drop(batch);
            if let Some(out) = self.filter(projected, unconverted, id, deletes, offset, info.max_ts)? {
                self.ready.push_back(out);
            }
            offset += rows;
            Ok(())
        })
    }

    /// Applies VFoR and the filter to a decoded batch (read columns, then
    /// the hidden column if it was read) whose first row is at `offset` of
    /// its file. The hidden column is needed only where a row may be newer
    /// than the snapshot (the split's largest create_ts, `max_ts`, is above
    /// it; [`Scan::reads_create_ts`]).
    fn filter(
        &mut self,
        batch: RecordBatch,
        unconverted: Option<Unconverted>,
        file: FileId,
        deletes: &dyn DeletedRows,
        offset: usize,
        max_ts: Ts,
    ) -> Result<Option<RecordBatch>> {
        let rows = batch.num_rows();
        self.metrics.rows_read += rows;
        let words = kernel::mask_words(rows);
        let mut mask = vec![u64::MAX; words];
        if self.options.visibility == VisibilityMode::Enforced {
            let qts = self.qts();
            if max_ts > qts {
                // The split's bound says some row may be newer; the batch's
                // own column says whether one is.
                let create_ts = create_ts_column(&batch)?;
                let (_, newest) = crate::lake::ts_range(create_ts);
                if newest > qts {
                    kernel::create_ts_mask(create_ts.values(), qts.get() as i64, &mut mask);
                }
            }
            deletes.deleted_bitmap(file, offset, rows, qts, &mut self.scratch)?;
            kernel::and_not(&mut mask, &self.scratch);
        }
        if let Some(u) = unconverted {
            u.check(&self.table, &mask)?;
        }
        self.finish(batch, mask)
    }

    /// Applies the filter to a batch whose visible rows are `mask`, then
    /// projects.
    fn finish(&mut self, batch: RecordBatch, mut mask: Vec<u64>) -> Result<Option<RecordBatch>> {
        let rows = batch.num_rows();
        if let Some(filter) = &self.options.filter {
            // Nulls never match.
            let matches = self.evaluate(filter, &batch)?;
            let matches =
                if matches.null_count() > 0 { arrow::compute::prep_null_mask_filter(&matches) } else { matches };
            let chunks = matches.values().bit_chunks();
            let full = chunks.chunk_len();
            for (word, bits) in mask.iter_mut().zip(chunks.iter()) {
                *word &= bits;
            }
            if chunks.remainder_len() > 0 {
                mask[full] &= chunks.remainder_bits();
            }
        }
        let visible = kernel::count_visible(&mask, rows);
        if visible == 0 {
            return Ok(None);
        }
        let projected = batch.project(&self.output_positions)?;
        // The decoded batch's own references go, so that columns nothing
        // else holds are compacted in place.
        drop(batch);
        let out = if visible == rows { projected } else { crate::compact::keep_rows(projected, mask)? };
        let out = out.with_schema(Arc::clone(&self.output_schema))?;
        self.metrics.rows_returned += out.num_rows();
        Ok(Some(out))
    }

    fn evaluate(&self, p: &Predicate, batch: &RecordBatch) -> Result<BooleanArray> {
        match p {
            Predicate::Compare { column, op, value } => {
                let pos =
                    self.read_columns.binary_search(column).map_err(|_| Error::invariant("filter column not read"))?;
                let array = batch.column(pos);
                let literal = crate::buffer::value_array(&self.table, *column, value)?;
                compare(array, &Scalar::new(literal), *op)
            }
            Predicate::And(ps) => {
                let mut acc: Option<BooleanArray> = None;
                for p in ps {
                    let m = self.evaluate(p, batch)?;
                    acc = Some(match acc {
                        None => m,
                        Some(a) => arrow::compute::and(&a, &m)?,
                    });
                }
                Ok(acc.unwrap_or_else(|| BooleanArray::from(vec![true; batch.num_rows()])))
            }
        }
    }
}

impl Iterator for Scan {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch().transpose()
    }
}

fn compare(left: &dyn Datum, right: &dyn Datum, op: CmpOp) -> Result<BooleanArray> {
    Ok(match op {
        CmpOp::Eq => cmp::eq(left, right)?,
        CmpOp::NotEq => cmp::neq(left, right)?,
        CmpOp::Lt => cmp::lt(left, right)?,
        CmpOp::LtEq => cmp::lt_eq(left, right)?,
        CmpOp::Gt => cmp::gt(left, right)?,
        CmpOp::GtEq => cmp::gt_eq(left, right)?,
    })
}

/// Which row groups of `file` may hold rows matching `filter`, from the
/// user columns' min/max statistics. Unknown statistics keep a row group.
/// The footer is read only when there is a filter.
fn prune_row_groups(
    lake: &Lake,
    table: &TableDef,
    file: &RegularFile,
    filter: Option<&Predicate>,
) -> Result<Vec<bool>> {
    let n = file.row_groups.len();
    let Some(filter) = filter else {
        return Ok(vec![true; n]);
    };
    prune_with(table, file.metadata(lake)?, n, filter)
}

fn prune_with(table: &TableDef, metadata: &ArrowReaderMetadata, n: usize, p: &Predicate) -> Result<Vec<bool>> {
    match p {
        Predicate::And(ps) => {
            let mut keep = vec![true; n];
            for p in ps {
                for (k, x) in keep.iter_mut().zip(prune_with(table, metadata, n, p)?) {
                    *k &= x;
                }
            }
            Ok(keep)
        }
        Predicate::Compare { column, op, value } => {
            if value.is_null() {
                return Ok(vec![false; n]);
            }
            let meta = metadata.metadata();
            let field = table.schema.field(*column);
            // Statistics in the file's own column type (it may predate a
            // widening), then cast to the table's.
            let Ok(conv) =
                StatisticsConverter::try_new(field.name(), metadata.schema(), meta.file_metadata().schema_descr())
            else {
                return Ok(vec![true; n]);
            };
            let (Ok(mins), Ok(maxs)) =
                (conv.row_group_mins(meta.row_groups()), conv.row_group_maxes(meta.row_groups()))
            else {
                return Ok(vec![true; n]);
            };
            let to_table_type = |a: arrow::array::ArrayRef| -> Option<arrow::array::ArrayRef> {
                if a.data_type() == field.data_type() {
                    Some(a)
                } else if *field.data_type() == arrow::datatypes::DataType::Utf8 {
                    // Numbers as text do not keep their order: no pruning.
                    None
                } else {
                    let options = arrow::compute::CastOptions { safe: false, ..Default::default() };
                    arrow::compute::cast_with_options(&a, field.data_type(), &options).ok()
                }
            };
            let (Some(mins), Some(maxs)) = (to_table_type(mins), to_table_type(maxs)) else {
                return Ok(vec![true; n]);
            };
            let literal = Scalar::new(crate::buffer::value_array(table, *column, value)?);
            // A row group may match unless its [min, max] range excludes it.
            let may: BooleanArray = match op {
                CmpOp::Eq => arrow::compute::and(&cmp::lt_eq(&mins, &literal)?, &cmp::gt_eq(&maxs, &literal)?)?,
                CmpOp::NotEq => BooleanArray::from(vec![true; n]),
                CmpOp::Lt => cmp::lt(&mins, &literal)?,
                CmpOp::LtEq => cmp::lt_eq(&mins, &literal)?,
                CmpOp::Gt => cmp::gt(&maxs, &literal)?,
                CmpOp::GtEq => cmp::gt_eq(&maxs, &literal)?,
            };
            // Missing statistics (null) keep the row group.
            Ok((0..n).map(|i| may.is_null(i) || may.value(i)).collect())
        }
    }
}

/// Stored values that do not convert to their column's current type
/// (written before a type change that was not a widening; the rows then
/// replaced): NULL in the projected batch, an error if any is visible.
pub(crate) struct Unconverted {
    column: String,
    from: arrow::datatypes::DataType,
    to: arrow::datatypes::DataType,
    /// True where a value was lost.
    rows: BooleanArray,
}

impl Unconverted {
    /// The error if a row of `visible` (a mask over the batch) lost its value.
    pub(crate) fn check(&self, table: &TableDef, visible: &[u64]) -> Result<()> {
        let lost = self.rows.values().set_indices().find(|&i| visible[i / 64] >> (i % 64) & 1 == 1);
        match lost {
            None => Ok(()),
            Some(_) => Err(Error::Schema {
                table: table.name.clone(),
                column: self.column.clone(),
                message: format!(
                    "a value stored as {} before the column's type changed does not convert to {}",
                    self.from, self.to
                ),
            }),
        }
    }
}

/// `columns` of `table` (by index in its current schema) plus the hidden
/// column where `batch` has it (a scan leaves it unread where no row can
/// be newer than its snapshot), taken from `batch` by field id (by name
/// where it carries none: [`TableDef::stored_index`]); columns the
/// batch lacks are NULL, and so is a column in every row version older
/// than the transaction that added it ([`TableDef::column_since`]: what the
/// batch holds under its name there is a dropped column's); columns stored
/// in another type are cast (exactly after a widening; a value that does
/// not convert is reported in the second result).
///
/// `bounds` are the smallest and largest create_ts the batch's rows may
/// have; where the batch holds the hidden column, its values are used
/// instead. A batch without it must be read with it where a column added
/// within `bounds` is projected ([`reads_create_ts_for_added`]).
pub(crate) fn project_stored(
    table: &TableDef,
    columns: &[usize],
    batch: &RecordBatch,
    bounds: (Ts, Ts),
) -> Result<(RecordBatch, Option<Unconverted>)> {
    let stored = batch.schema();
    let mut fields = Vec::with_capacity(columns.len() + 1);
    let mut arrays = Vec::with_capacity(columns.len() + 1);
    let mut unconverted: Option<Unconverted> = None;
    let create_ts = match stored.index_of(CREATE_TS_COLUMN) {
        Ok(i) => Some(batch.column(i).as_any().downcast_ref::<Int64Array>().ok_or_else(|| {
            Error::invariant(format!("{}: the hidden column {CREATE_TS_COLUMN} is not Int64", table.name))
        })?),
        Err(_) => None,
    };
    // The rows' create_ts range, from the batch where it holds them (once,
    // and only if a projected column was added to the table).
    let bounds = match create_ts {
        Some(ts) if columns.iter().any(|&c| table.column_since(c) != Ts::ZERO) => {
            (Ts(arrow::compute::min(ts).unwrap_or(0) as u64), Ts(arrow::compute::max(ts).unwrap_or(0) as u64))
        }
        _ => bounds,
    };
    let how = crate::schema::StoredColumns::of(&stored);
    for &c in columns {
        // As the table declares it (without the field id files carry).
        let field = table.schema.field(c);
        let stored_column = match table.stored_index(&stored, &how, c) {
            Some(i) => added_since(table, c, batch.column(i), create_ts, bounds)?,
            None => None,
        };
        match stored_column {
            Some(column) if column.data_type() == field.data_type() => arrays.push(column),
            Some(column) => {
                let column = column.as_ref();
                let cast = arrow::compute::cast(column, field.data_type())?;
                if cast.null_count() > column.null_count() {
                    // Non-null before, null after: lost in the cast.
                    let lost =
                        arrow::compute::and_not(&arrow::compute::is_null(&cast)?, &arrow::compute::is_null(column)?)?;
                    let rows = match unconverted.take() {
                        Some(u) => arrow::compute::or(&u.rows, &lost)?,
                        None => lost,
                    };
                    unconverted = Some(Unconverted {
                        column: field.name().clone(),
                        from: column.data_type().clone(),
                        to: field.data_type().clone(),
                        rows,
                    });
                }
                arrays.push(cast);
            }
            None => arrays.push(arrow::array::new_null_array(field.data_type(), batch.num_rows())),
        }
        fields.push(field.clone());
    }
    if let Ok(hidden) = stored.index_of(CREATE_TS_COLUMN) {
        fields.push(Field::new(CREATE_TS_COLUMN, arrow::datatypes::DataType::Int64, false));
        arrays.push(Arc::clone(batch.column(hidden)));
    }
    Ok((RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?, unconverted))
}

/// What `stored`, the values a batch holds under the name of `table`'s
/// column `column`, are of that column: NULL in the row versions created
/// before the transaction that added it (`None`: all of them), the stored
/// values in the others. The rows' create_ts are `create_ts` where the
/// batch has them, and within `(min, max)`.
fn added_since(
    table: &TableDef,
    column: usize,
    stored: &arrow::array::ArrayRef,
    create_ts: Option<&Int64Array>,
    (min, max): (Ts, Ts),
) -> Result<Option<arrow::array::ArrayRef>> {
    let since = table.column_since(column);
    if since == Ts::ZERO {
        return Ok(Some(Arc::clone(stored)));
    }
    if max < since {
        return Ok(None);
    }
    if min >= since {
        return Ok(Some(Arc::clone(stored)));
    }
    let Some(ts) = create_ts else {
        return Err(Error::invariant(format!(
            "{}: column {} was added at ts {since}, and rows from ts {min} to {max} were read without their create_ts",
            table.name,
            table.schema.field(column).name()
        )));
    };
    let older = cmp::lt(ts, &Int64Array::new_scalar(since.get() as i64))?;
    Ok(Some(arrow::compute::nullif(stored, &older)?))
}

/// Whether a split whose rows were created from `min` to `max` must be
/// read with its hidden create_ts column for [`project_stored`] to tell
/// which of its rows predate a projected column of `table` (some do, some
/// do not).
pub(crate) fn reads_create_ts_for_added(table: &TableDef, columns: &[usize], (min, max): (Ts, Ts)) -> bool {
    columns.iter().any(|&c| {
        let since = table.column_since(c);
        since != Ts::ZERO && min < since && since <= max
    })
}
