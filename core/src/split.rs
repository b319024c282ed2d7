//! Splits as tasks any worker can run: a thread, a Flight client, a Lambda
//! function, a browser.
//!
//! ```text
//!  planner (one view of the table, at qts)          worker (no engine, no catalog)
//!  Scan::tasks() ─▶ [SplitTask] ─ JSON ─▶ SplitTask::scan(lake) ─▶ the split's batches
//! ```
//!
//! A [`SplitTask`] is self-contained: the table's columns, the snapshot
//! timestamp, projection, pushed-down filter and limit, what to read — a
//! row group of a regular file (object path, the footer's byte range when
//! known, the row group), a flushed block (object path), or in-memory rows
//! (Arrow IPC, inline) — and where its deleted rows come from
//! ([`DeletedSource`]): the bitmap itself, as the replayer's tiles or a
//! visibility checkpoint gave it when the task was planned, or the
//! deleted-rows object a lake checkpoint recorded for the file.
//!
//! All tasks of one query come from one view of the table. The planner
//! keeps the objects they name from being retired (its registered
//! snapshot or reader registration) until the query ends; a task that
//! meets a missing object fails with the object's path ([`crate::Error`]'s
//! object-store error), and the caller re-plans.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use object_store::path::Path;
use serde::{Deserialize, Serialize};

use crate::buffer::{Block, BlockData};
use crate::checkpoint::TableManifest;
use crate::error::{Error, Result};
use crate::ids::{FileId, TableId, Ts};
use crate::lake::{Lake, RegularFile, RowGroupInfo};
use crate::reader::CheckpointDeletes;
use crate::scan::{DeletedRows, Predicate, Scan, ScanOptions, Split};
use crate::visibility::copy_bits;

/// Version of the task format.
pub const SPLIT_FORMAT: u32 = 1;

/// One split of a scan, with everything a stateless worker needs to read
/// it (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitTask {
    /// Format version ([`SPLIT_FORMAT`]).
    pub format: u32,
    /// The table's id.
    pub table_id: u32,
    /// The table's name and columns as the plan saw them.
    pub table: TableManifest,
    /// The snapshot: rows with `create_ts ≤ qts` not deleted at `qts`.
    pub qts: u64,
    /// Columns to return, by index in the table, in this order.
    pub projection: Vec<usize>,
    /// Pushed-down filter (rows that fail it are left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Predicate>,
    /// Rows the whole query needs at most (a task may stop there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// The file the rows belong to.
    pub file: u64,
    /// Row offset of the split's first row in its file.
    pub offset: usize,
    /// Rows stored in the split (visible or not).
    pub rows: usize,
    /// What to read.
    pub data: SplitData,
    /// Where the deleted rows come from.
    pub deleted: DeletedSource,
    /// Bytes a worker reads for the split, estimated when it was planned
    /// (see [`Scan::tasks`]); 0 when not known. Callers size their
    /// invocations by it ([`crate::scan_worker::group_tasks`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Bytes per stored value assumed for a block when no regular file of the
/// scan tells the table's own (a flushed block's size is not recorded).
const ASSUMED_VALUE_BYTES: u64 = 16;

/// What a split reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SplitData {
    /// One row group of a regular Parquet file.
    RowGroup {
        /// Object path.
        path: String,
        /// Byte range of the footer (start, end = object size), when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        footer: Option<[u64; 2]>,
        /// Row group index.
        row_group: usize,
    },
    /// A flushed write-buffer block (a Parquet object with one row group).
    Block {
        /// Object path.
        path: String,
    },
    /// Rows still in the replayer's memory: the read columns and
    /// `_fovea_create_ts`, as an Arrow IPC stream, base64.
    Rows {
        /// The IPC stream.
        ipc: String,
    },
}

/// Where a split's deleted rows come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeletedSource {
    /// The deleted bits of the split's rows at `qts` (bit `i` = row
    /// `offset + i`), little-endian u64 words, base64.
    Bitmap {
        /// The words.
        words: String,
    },
    /// The deleted rows a lake checkpoint recorded for the file: an object
    /// of u32 LE row offsets (none deleted when absent).
    Checkpoint {
        /// Object path.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        /// The file's row capacity.
        capacity: usize,
    },
}

impl DeletedSource {
    /// A bitmap source of `words`.
    pub fn bitmap(words: &[u64]) -> Self {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        DeletedSource::Bitmap { words: BASE64.encode(bytes) }
    }
}

/// Deleted bits handed over with a task, for rows `[start, start + rows)`.
struct GivenBits {
    file: FileId,
    start: usize,
    rows: usize,
    words: Vec<u64>,
}

impl DeletedRows for GivenBits {
    fn deleted_bitmap(&self, file: FileId, start: usize, rows: usize, _qts: Ts, out: &mut Vec<u64>) -> Result<()> {
        if file != self.file || start < self.start || start + rows > self.start + self.rows {
            return Err(Error::invariant(format!(
                "rows {start}..{} of {file} asked of a bitmap of rows {}..{} of {}",
                start + rows,
                self.start,
                self.start + self.rows,
                self.file
            )));
        }
        copy_bits(&self.words, start - self.start, rows, out);
        Ok(())
    }
}

impl Scan {
    /// The splits still to read as tasks, in order (reads no lake data;
    /// in-memory rows travel inline).
    ///
    /// Each task's `bytes` estimates what a worker reads: for a row group,
    /// its rows' share of its file's object, times the share of the
    /// table's columns read (the projection and the hidden create_ts); for
    /// a flushed block, as many bytes per row as the scan's regular files
    /// hold (or [`ASSUMED_VALUE_BYTES`] a value); inline rows, their size.
    pub fn tasks(&self) -> Result<Vec<SplitTask>> {
        let table = TableManifest::of(&self.table);
        let projection =
            self.options.projection.clone().unwrap_or_else(|| (0..self.table.schema.fields().len()).collect());
        let read_share = (projection.len() + 1) as f64 / (self.table.schema.fields().len() + 1) as f64;
        // Bytes per stored row of the regular files this scan reads.
        let (file_bytes, file_rows) = self.splits.iter().fold((0u64, 0u64), |(b, r), split| match split {
            Split::RowGroup { file, rg: 0, .. } => match &file.footer_range {
                Some(footer) => (b + footer.end, r + file.row_groups.iter().map(|g| g.rows as u64).sum::<u64>()),
                None => (b, r),
            },
            _ => (b, r),
        });
        let row_bytes = if file_rows > 0 {
            file_bytes as f64 / file_rows as f64
        } else {
            (ASSUMED_VALUE_BYTES * (self.table.schema.fields().len() as u64 + 1)) as f64
        };
        let mut out = Vec::with_capacity(self.splits.len());
        for split in &self.splits {
            let bytes = match split {
                Split::RowGroup { file, info, .. } => {
                    let rows: usize = file.row_groups.iter().map(|g| g.rows).sum();
                    let share = info.rows as f64 / rows.max(1) as f64;
                    let object = file.footer_range.as_ref().map_or(row_bytes * rows as f64, |f| f.end as f64);
                    object * share * read_share
                }
                Split::Block { block, .. } => row_bytes * block.rows as f64 * read_share,
                // Counted below, from the inline IPC.
                Split::Active { .. } => 0.0,
            };
            let (id, deletes, offset, rows, data) = match split {
                Split::RowGroup { file, id, deletes, rg, info } => {
                    let data = SplitData::RowGroup {
                        path: file.path.to_string(),
                        footer: file.footer_range.as_ref().map(|r| [r.start, r.end]),
                        row_group: *rg,
                    };
                    (*id, deletes, info.offset, info.rows, data)
                }
                Split::Block { id, deletes, block, offset } => {
                    let data = match &block.data {
                        BlockData::Flushed(path) => SplitData::Block { path: path.to_string() },
                        BlockData::Memory(batch) => self.rows_data(batch)?,
                    };
                    (*id, deletes, *offset, block.rows, data)
                }
                Split::Active { id, deletes, offset, batch } => {
                    (*id, deletes, *offset, batch.num_rows(), self.rows_data(batch)?)
                }
            };
            let bytes = match &data {
                SplitData::Rows { ipc } => ipc.len() as u64 / 4 * 3,
                _ => bytes.ceil() as u64,
            };
            out.push(SplitTask {
                format: SPLIT_FORMAT,
                table_id: self.table.id.0,
                table: table.clone(),
                qts: self.qts.get(),
                projection: projection.clone(),
                filter: self.options.filter.clone(),
                limit: self.limit,
                file: id.0,
                offset,
                rows,
                data,
                deleted: deletes.describe(id, offset, rows, self.qts)?,
                bytes,
            });
        }
        Ok(out)
    }

    /// In-memory rows as inline IPC: the read columns and the hidden one.
    fn rows_data(&self, batch: &RecordBatch) -> Result<SplitData> {
        // Rows stored in another type travel as stored: the worker's
        // projection casts them and knows which are visible.
        let batch = match self.project_decoded(batch, (Ts::ZERO, Ts::MAX))? {
            (projected, None) => projected,
            (_, Some(_)) => batch.clone(),
        };
        let mut ipc = Vec::new();
        let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut ipc, &batch.schema())?;
        w.write(&batch)?;
        w.finish()?;
        drop(w);
        Ok(SplitData::Rows { ipc: BASE64.encode(ipc) })
    }
}

impl SplitTask {
    /// The task as a scan of its one split over `lake`: the same batches
    /// the planner's scan returns for it.
    pub fn scan(&self, lake: Lake) -> Result<Scan> {
        let bad = |reason: String| Error::Corrupt { what: format!("split task of {}", self.table.name), reason };
        if self.format != SPLIT_FORMAT {
            return Err(bad(format!("format {} (this fovea reads {SPLIT_FORMAT})", self.format)));
        }
        let table = self.table.def(TableId(self.table_id))?;
        let options = ScanOptions {
            projection: Some(self.projection.clone()),
            filter: self.filter.clone(),
            ..ScanOptions::default()
        };
        let qts = Ts(self.qts);
        let id = FileId(self.file);
        let deletes: Arc<dyn DeletedRows> = match &self.deleted {
            DeletedSource::Bitmap { words } => {
                let bytes = BASE64.decode(words).map_err(|e| bad(format!("deleted bitmap: {e}")))?;
                if bytes.len() != self.rows.div_ceil(64) * 8 {
                    return Err(bad(format!("a deleted bitmap of {} bytes for {} rows", bytes.len(), self.rows)));
                }
                let words = bytes
                    .chunks_exact(8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_else(|_| unreachable!("8 bytes"))))
                    .collect();
                Arc::new(GivenBits { file: id, start: self.offset, rows: self.rows, words })
            }
            DeletedSource::Checkpoint { path, capacity } => {
                Arc::new(CheckpointDeletes::new(lake.clone(), id, path.as_deref().map(Path::from), *capacity))
            }
        };
        let split = match &self.data {
            SplitData::RowGroup { path, footer, row_group } => {
                // The row groups of the file are not listed: the split
                // names its own.
                let file = RegularFile::new(Path::from(path.as_str()), Vec::new(), footer.map(|[s, e]| s..e));
                // Its largest create_ts is not in the task: the worker reads
                // the hidden column and checks it, as for in-memory rows.
                let info = RowGroupInfo { offset: self.offset, rows: self.rows, min_ts: Ts(0), max_ts: Ts::MAX };
                Split::RowGroup { file: Arc::new(file), id, deletes, rg: *row_group, info }
            }
            SplitData::Block { path } => {
                let block = Block {
                    index: 0,
                    rows: self.rows,
                    min_ts: Ts(0),
                    max_ts: Ts::MAX,
                    data: BlockData::Flushed(Path::from(path.as_str())),
                    writer: 0,
                };
                Split::Block { id, deletes, block: Arc::new(block), offset: self.offset }
            }
            SplitData::Rows { ipc } => {
                let bytes = BASE64.decode(ipc).map_err(|e| bad(format!("rows: {e}")))?;
                // arrow-ipc panics on some malformed streams (a buffer
                // beyond the body): that is this task's error.
                let batches = crate::error::catch_panic(
                    || "decoding a split task's inline rows".into(),
                    || {
                        // The push decoder takes a message body only as far
                        // as the bytes go (the reader would allocate a
                        // declared body length up front: any size).
                        let mut decoder = arrow_ipc::reader::StreamDecoder::new();
                        let mut buffer = arrow::buffer::Buffer::from(bytes);
                        let mut batches = Vec::new();
                        while !buffer.is_empty() {
                            if let Some(b) = decoder.decode(&mut buffer)? {
                                batches.push(b);
                            }
                        }
                        decoder.finish()?;
                        Ok(batches)
                    },
                )
                .map_err(|e| bad(format!("rows: {e}")))?;
                let batch = match batches.as_slice() {
                    [one] => one.clone(),
                    [] => return Err(bad("no rows in the IPC stream".into())),
                    many => arrow::compute::concat_batches(&many[0].schema(), many)?,
                };
                if batch.num_rows() != self.rows {
                    return Err(bad(format!("{} rows inline, {} declared", batch.num_rows(), self.rows)));
                }
                Split::Active { id, deletes, offset: self.offset, batch }
            }
        };
        let mut scan = Scan::empty(Arc::new(()), qts, lake, table, options)?;
        scan.splits.push_back(split);
        scan.limit = self.limit;
        Ok(scan)
    }
}
