//! The write buffer: new tuple versions of one table in one shard.
//!
//! ```text
//!  TablePart (table × shard)                     readers take one view under the lock
//!  ├─ files: [ regular … | virtual { blocks: [Memory | Flushed] } … ]
//!  └─ active block (Arrow builders + create_ts) ──full──▶ immutable block ──flusher──▶ Parquet object
//! ```
//!
//! Rows are appended to the *active block*; a full block (8192 rows by
//! default) becomes immutable, joins its *virtual file* and is flushed to
//! the object store in the background. A virtual file has a pre-assigned
//! [`FileId`]; block `i` is row group `i` of the regular file that `combine`
//! later makes from it, so row offsets never change.

use std::sync::{Arc, Mutex};

use arrow::array::{
    ArrayBuilder, ArrayRef, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, Float32Builder,
    Float64Builder, Int8Builder, Int16Builder, Int32Builder, Int64Array, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow::datatypes::{DataType, TimeUnit};
use arrow::record_batch::RecordBatch;

use crate::error::{Error, Result};
use crate::ids::{FileId, ShardId, Ts};
use crate::lake::RegularFile;
use crate::mvcc::lock;
use crate::schema::{TableDef, Value};
use crate::visibility::FileVisibility;

/// Default rows per write-buffer block (and per row group of regular files).
pub const DEFAULT_BLOCK_ROWS: usize = 8192;
/// Default blocks per virtual file.
pub const DEFAULT_BLOCKS_PER_FILE: usize = 16;

/// The same expression for every variant of [`ColumnBuilder`].
macro_rules! each_builder {
    ($value:expr, $b:ident => $e:expr) => {
        match $value {
            ColumnBuilder::Bool($b) => $e,
            ColumnBuilder::Int8($b) => $e,
            ColumnBuilder::Int16($b) => $e,
            ColumnBuilder::Int32($b) => $e,
            ColumnBuilder::Int64($b) => $e,
            ColumnBuilder::Float32($b) => $e,
            ColumnBuilder::Float64($b) => $e,
            ColumnBuilder::Decimal($b) => $e,
            ColumnBuilder::Utf8($b) => $e,
            ColumnBuilder::Binary($b) => $e,
            ColumnBuilder::Date32($b) => $e,
            ColumnBuilder::Timestamp($b) => $e,
        }
    };
}

/// One typed Arrow builder per user column.
enum ColumnBuilder {
    Bool(BooleanBuilder),
    Int8(Int8Builder),
    Int16(Int16Builder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    Float32(Float32Builder),
    Float64(Float64Builder),
    Decimal(Decimal128Builder),
    Utf8(StringBuilder),
    Binary(BinaryBuilder),
    Date32(Date32Builder),
    Timestamp(TimestampMicrosecondBuilder),
}

impl ColumnBuilder {
    fn new(t: &DataType, rows: usize) -> Result<Self> {
        Ok(match t {
            DataType::Boolean => Self::Bool(BooleanBuilder::with_capacity(rows)),
            DataType::Int8 => Self::Int8(Int8Builder::with_capacity(rows)),
            DataType::Int16 => Self::Int16(Int16Builder::with_capacity(rows)),
            DataType::Int32 => Self::Int32(Int32Builder::with_capacity(rows)),
            DataType::Int64 => Self::Int64(Int64Builder::with_capacity(rows)),
            DataType::Float32 => Self::Float32(Float32Builder::with_capacity(rows)),
            DataType::Float64 => Self::Float64(Float64Builder::with_capacity(rows)),
            DataType::Decimal128(p, s) => {
                Self::Decimal(Decimal128Builder::with_capacity(rows).with_precision_and_scale(*p, *s)?)
            }
            DataType::Utf8 => Self::Utf8(StringBuilder::with_capacity(rows, rows * 16)),
            DataType::Binary => Self::Binary(BinaryBuilder::with_capacity(rows, rows * 16)),
            DataType::Date32 => Self::Date32(Date32Builder::with_capacity(rows)),
            DataType::Timestamp(TimeUnit::Microsecond, tz) => {
                Self::Timestamp(TimestampMicrosecondBuilder::with_capacity(rows).with_timezone_opt(tz.clone()))
            }
            other => {
                return Err(Error::invariant(format!("unsupported type {other} passed TableDef::new")));
            }
        })
    }

    /// Appends a value already checked by [`crate::schema::accepts`].
    #[inline]
    fn append(&mut self, v: &Value) {
        macro_rules! opt {
            ($b:expr, $some:expr) => {
                if v.is_null() { $b.append_null() } else { $b.append_value($some) }
            };
        }
        match (self, v) {
            (Self::Bool(b), _) => opt!(b, matches!(v, Value::Bool(true))),
            (Self::Int8(b), Value::Int(i)) => b.append_value(*i as i8),
            (Self::Int16(b), Value::Int(i)) => b.append_value(*i as i16),
            (Self::Int32(b), Value::Int(i)) => b.append_value(*i as i32),
            (Self::Date32(b), Value::Int(i)) => b.append_value(*i as i32),
            (Self::Int64(b), Value::Int(i)) => b.append_value(*i),
            (Self::Timestamp(b), Value::Int(i)) => b.append_value(*i),
            (Self::Float32(b), Value::Float(f)) => b.append_value(*f as f32),
            (Self::Float32(b), Value::Int(i)) => b.append_value(*i as f32),
            (Self::Float64(b), Value::Float(f)) => b.append_value(*f),
            (Self::Float64(b), Value::Int(i)) => b.append_value(*i as f64),
            (Self::Decimal(b), Value::Decimal(d)) => b.append_value(*d),
            (Self::Utf8(b), Value::Utf8(s)) => b.append_value(s),
            (Self::Binary(b), Value::Binary(x)) => b.append_value(x),
            (Self::Binary(b), Value::Utf8(s)) => b.append_value(s.as_bytes()),
            (b, _) => b.append_null(),
        }
    }

    fn append_null(&mut self) {
        each_builder!(self, b => b.append_null())
    }

    fn builder(&mut self) -> &mut dyn ArrayBuilder {
        each_builder!(self, b => b)
    }

    fn builder_ref(&self) -> &dyn ArrayBuilder {
        each_builder!(self, b => b)
    }
}

/// A one-element array of `column`'s type holding `v` (filter literals).
pub(crate) fn value_array(table: &TableDef, column: usize, v: &Value) -> Result<ArrayRef> {
    let field = table.schema.field(column);
    let mut b = ColumnBuilder::new(field.data_type(), 1)?;
    crate::schema::accepts(field.data_type(), v).map_err(|message| Error::Schema {
        table: table.name.clone(),
        column: field.name().clone(),
        message: format!("filter literal: {message}"),
    })?;
    b.append(v);
    Ok(b.builder().finish())
}

/// The block being filled: Arrow builders plus the hidden create_ts column.
pub struct BlockBuilder {
    table: Arc<TableDef>,
    columns: Vec<ColumnBuilder>,
    create_ts: Vec<i64>,
    capacity: usize,
    /// Readers' copy of the rows so far, reused while no row is added.
    cached: Option<RecordBatch>,
}

impl BlockBuilder {
    /// An empty block for `table` with room for `rows` rows.
    pub fn new(table: Arc<TableDef>, rows: usize) -> Result<Self> {
        let columns =
            table.schema.fields().iter().map(|f| ColumnBuilder::new(f.data_type(), rows)).collect::<Result<_>>()?;
        Ok(Self { table, columns, create_ts: Vec::with_capacity(rows), capacity: rows, cached: None })
    }

    /// Rows appended so far.
    pub fn rows(&self) -> usize {
        self.create_ts.len()
    }

    /// True when no more rows fit.
    pub fn is_full(&self) -> bool {
        self.rows() >= self.capacity
    }

    /// Appends a row checked by [`TableDef::check_row`], created at `ts`.
    #[inline]
    pub fn append(&mut self, row: &[Value], ts: Ts) {
        for (c, v) in self.columns.iter_mut().zip(row) {
            c.append(v);
        }
        self.create_ts.push(ts.get() as i64);
        self.cached = None;
    }

    /// The rows so far as a batch (user columns + `_fovea_create_ts`),
    /// leaving the builders as they are.
    pub fn snapshot(&mut self) -> Result<RecordBatch> {
        if let Some(b) = &self.cached {
            return Ok(b.clone());
        }
        let mut arrays: Vec<ArrayRef> = self.columns.iter().map(|c| c.builder_ref().finish_cloned()).collect();
        arrays.push(Arc::new(Int64Array::from(self.create_ts.clone())));
        let batch = RecordBatch::try_new(Arc::clone(&self.table.file_schema), arrays)?;
        self.cached = Some(batch.clone());
        Ok(batch)
    }

    /// Takes the rows out as a batch and resets the builders.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let mut arrays: Vec<ArrayRef> = self.columns.iter_mut().map(|c| c.builder().finish()).collect();
        arrays.push(Arc::new(Int64Array::from(std::mem::take(&mut self.create_ts))));
        self.cached = None;
        Ok(RecordBatch::try_new(Arc::clone(&self.table.file_schema), arrays)?)
    }

    /// Approximate bytes held.
    pub fn memory_bytes(&self) -> usize {
        // Builders do not expose their capacity; count what they hold.
        let per_row: usize =
            self.table.schema.fields().iter().map(|f| f.data_type().primitive_width().unwrap_or(16)).sum();
        self.capacity * (per_row + 8)
    }
}

/// Where an immutable block's rows are.
#[derive(Clone)]
pub enum BlockData {
    /// Still in memory (not flushed yet).
    Memory(RecordBatch),
    /// In the object store (one Parquet object, one row group).
    Flushed(object_store::path::Path),
}

/// An immutable block of a virtual file.
#[derive(Clone)]
pub struct Block {
    /// Position in the virtual file (row group index once combined).
    pub index: u32,
    /// Row count.
    pub rows: usize,
    /// Smallest create_ts in the block.
    pub min_ts: Ts,
    /// Largest create_ts in the block.
    pub max_ts: Ts,
    /// The rows.
    pub data: BlockData,
    /// Lease epoch of the writer that sealed it: its object's name carries
    /// it ([`crate::lake::block_path`]), so a fenced predecessor never
    /// writes over it. (0 for blocks read back: their objects are named.)
    pub writer: u64,
}

/// What a lake file is now.
#[derive(Clone)]
pub enum FileKind {
    /// Made of write-buffer blocks; the last ones may still be in memory.
    Virtual {
        /// Immutable blocks, in order.
        blocks: Vec<Arc<Block>>,
        /// No more blocks will be added.
        sealed: bool,
    },
    /// One Parquet file with one row group per former block.
    Regular(Arc<RegularFile>),
}

/// A file of a table part, as readers see it.
#[derive(Clone)]
pub struct LakeFile {
    /// Its id (kept by combine).
    pub id: FileId,
    /// Its visibility.
    pub vis: Arc<FileVisibility>,
    /// Virtual or regular.
    pub kind: FileKind,
}

/// The rows of the active block at the time of a view.
#[derive(Clone)]
pub struct ActiveRows {
    /// The file the block belongs to.
    pub file: FileId,
    /// Its visibility.
    pub vis: Arc<FileVisibility>,
    /// Row offset of the block's first row in the file.
    pub offset: usize,
    /// The rows (user columns + create_ts).
    pub batch: RecordBatch,
}

/// One consistent view of a table part: the files and the active rows, taken
/// under one lock so a block or file published meanwhile is seen once.
#[derive(Clone)]
pub struct PartView {
    /// Regular and virtual files.
    pub files: Vec<LakeFile>,
    /// Rows of the active block, if any.
    pub active: Option<ActiveRows>,
}

/// The write buffer and files of one table in one shard.
pub struct TablePart {
    /// The table.
    pub table: Arc<TableDef>,
    /// The shard owning it.
    pub shard: ShardId,
    pub(crate) state: Mutex<PartState>,
}

pub(crate) struct PartState {
    pub(crate) files: Vec<LakeFile>,
    pub(crate) active: Option<ActiveBlock>,
}

pub(crate) struct ActiveBlock {
    pub(crate) file: FileId,
    pub(crate) vis: Arc<FileVisibility>,
    pub(crate) offset: usize,
    pub(crate) builder: BlockBuilder,
}

impl TablePart {
    /// An empty part.
    pub fn new(table: Arc<TableDef>, shard: ShardId) -> Self {
        Self { table, shard, state: Mutex::new(PartState { files: Vec::new(), active: None }) }
    }

    /// One consistent view of files and in-memory rows.
    pub fn view(&self) -> Result<PartView> {
        let mut state = lock(&self.state);
        let active = match &mut state.active {
            Some(a) if a.builder.rows() > 0 => Some(ActiveRows {
                file: a.file,
                vis: Arc::clone(&a.vis),
                offset: a.offset,
                batch: a.builder.snapshot()?,
            }),
            _ => None,
        };
        Ok(PartView { files: state.files.clone(), active })
    }

    /// Bytes held in memory: active builders and unflushed blocks.
    pub fn memory_bytes(&self) -> usize {
        let state = lock(&self.state);
        let active = state.active.as_ref().map_or(0, |a| a.builder.memory_bytes());
        let blocks: usize = state
            .files
            .iter()
            .filter_map(|f| match &f.kind {
                FileKind::Virtual { blocks, .. } => Some(blocks),
                FileKind::Regular(_) => None,
            })
            .flatten()
            .map(|b| match &b.data {
                BlockData::Memory(batch) => batch.get_array_memory_size(),
                BlockData::Flushed(_) => 0,
            })
            .sum();
        active + blocks
    }

    /// Row count of all files and the active block (every version, live or not).
    pub fn tuples(&self) -> usize {
        let state = lock(&self.state);
        let files: usize = state
            .files
            .iter()
            .map(|f| match &f.kind {
                FileKind::Virtual { blocks, .. } => blocks.iter().map(|b| b.rows).sum(),
                FileKind::Regular(r) => r.rows(),
            })
            .sum();
        files + state.active.as_ref().map_or(0, |a| a.builder.rows())
    }
}
