//! The change model and the decoders of change streams.
//!
//! Every input line becomes a [`ChangeRecord`]: a transaction boundary or a
//! row change with its table, operation, before/after images as
//! `(column, JSON value)` pairs in source column order, the source
//! transaction id and commit time. Decoders normalise the encodings of
//! their connector (Debezium's base64 decimals, millisecond timestamps, the
//! `{"schema","payload"}` envelope, DMS metadata) so that [`types`] converts
//! values to fovea's typed [`fovea_types::Value`]s the same way for every input.
//!
//! | input | module |
//! |---|---|
//! | Debezium JSON: Kafka-style records or bare values, with or without schema | [`debezium`] |
//! | AWS DMS JSON (Kinesis / Kafka target) | [`dms`] |
//! | `CREATE TABLE` statements overriding inferred types | [`ddl`] |
//! | PostgreSQL logical replication (`pgoutput`) | [`pgoutput`] |
#![warn(missing_docs)]

pub mod conformance;
pub mod ddl;
pub mod debezium;
pub mod dms;
pub mod file;
pub mod float_text;
pub mod ordering;
pub mod pgoutput;
pub mod source;
pub mod typed;
pub mod types;

use arrow::datatypes::DataType;
use serde_json::Value as Json;
pub use smol_str::SmolStr;

use fovea_types::error::{Error, Result};
pub use fovea_types::position::SourcePosition;

/// A row operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOp {
    /// `c`: a new row.
    Insert,
    /// `r`: a row of an initial snapshot (applied as an insert).
    SnapshotRead,
    /// `u`: an update.
    Update,
    /// `d`: a delete.
    Delete,
    /// `t`: every row of the table goes (`TRUNCATE`; Debezium emits it
    /// where `skipped.operations` leaves `t` out). It has no images.
    Truncate,
}

/// Columns as `(name, value)` in source order.
pub type Columns = Vec<(String, Json)>;

/// The hidden key column of a table without a primary key. Rows from
/// PostgreSQL's replication get an id from their WAL position
/// ([`pgoutput`]); Debezium and DMS rows get the next one of their table in
/// the sink. Updates and deletes of such a table (PostgreSQL sends them only
/// under REPLICA IDENTITY FULL) name the row by its whole old image, which
/// the sink looks up. SQL never shows `_fovea_*` columns.
pub const ROWID_COLUMN: &str = "_fovea_rowid";

/// The position of a table's hidden row id ([`ROWID_COLUMN`]) if the table
/// is keyed by it alone: one without a primary key of its own.
pub fn hidden_rowid(def: &fovea_types::schema::TableDef) -> Option<usize> {
    match def.primary_key[..] {
        [i] if def.schema.field(i).name() == ROWID_COLUMN => Some(i),
        _ => None,
    }
}

/// The declared hidden key column of a table without a primary key
/// ([`ROWID_COLUMN`]).
pub fn rowid_column() -> DeclaredColumn {
    DeclaredColumn { name: ROWID_COLUMN.to_owned(), data_type: DataType::Int64, nullable: false }
}

/// Declared column types that came with a record (schema envelope).
#[derive(Clone, Debug, PartialEq)]
pub struct DeclaredColumn {
    /// Column name.
    pub name: String,
    /// Arrow type.
    pub data_type: DataType,
    /// Whether NULL is allowed.
    pub nullable: bool,
}

/// One changed row.
#[derive(Clone, Debug)]
pub struct RowChange {
    /// `schema.table`. The three names of a row (table, transaction,
    /// snapshot marker) are [`SmolStr`]s: up to 23 bytes they take no
    /// allocation, and a row is decoded on one thread and freed on another
    /// (freeing across threads cost mimalloc more than the allocation).
    pub table: SmolStr,
    /// Operation.
    pub op: RowOp,
    /// Primary-key columns from the record key, when the input has keys.
    pub key: Option<Columns>,
    /// Old image (full, key-only, or absent).
    pub before: Option<Columns>,
    /// New image.
    pub after: Option<Columns>,
    /// Source transaction id (Debezium: the xid part; DMS: transaction-id).
    pub txid: Option<SmolStr>,
    /// Source commit time, µs since the epoch.
    pub commit_us: Option<i64>,
    /// Snapshot marker of `r` records (`true`, `first`, `last`, …).
    pub snapshot: Option<SmolStr>,
    /// Column types from a schema envelope.
    pub declared: Option<Vec<DeclaredColumn>>,
    /// Primary-key column names from a key schema or metadata.
    pub key_names: Option<Vec<String>>,
    /// The record names its transaction (Debezium's `transaction` block):
    /// the stream has BEGIN/END records, even if none was seen yet.
    pub in_transaction_block: bool,
    /// The images leave NULL columns out (AWS DMS unless
    /// `IncludeNullAndEmpty` is set): a column missing from the after
    /// image is NULL in this row, not a column dropped from the table.
    pub omits_nulls: bool,
    /// The row read against its table's definition by the decoder
    /// ([`typed`]); `key`, `before` and `after` are then `None`.
    pub typed: Option<typed::TypedRow>,
}

impl RowChange {
    /// This row on the general path: its typed form dropped, its line
    /// decoded again into JSON images. A row without a typed form is
    /// returned as it is.
    pub fn untyped(self, position: SourcePosition) -> Result<RowChange> {
        let Some(typed) = &self.typed else { return Ok(self) };
        match debezium::decode_str(typed.line.as_str(), position)? {
            ChangeRecord::Row(row) => Ok(row),
            _ => Err(input_error(position, Some(&self.table), self.txid.as_deref(), "a row decoded twice is no row")),
        }
    }
}

/// One decoded input record.
///
/// A row change is held in place, not boxed: rows are decoded on one
/// thread and applied on another, and a box per row cost an allocation
/// there and a free here that mimalloc makes slow across threads. A
/// record is moved a few times on its way, which costs less.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum ChangeRecord {
    /// A transaction starts.
    Begin {
        /// Source transaction id.
        txid: String,
        /// Source time of the record, µs.
        commit_us: Option<i64>,
    },
    /// A transaction ends, with its event counts.
    End {
        /// Source transaction id.
        txid: String,
        /// Data events in the transaction (tombstones excluded).
        event_count: Option<u64>,
        /// Events per table.
        per_table: Vec<(String, u64)>,
        /// Source commit time, µs.
        commit_us: Option<i64>,
    },
    /// A row change.
    Row(RowChange),
    /// A table's definition without a row (its columns in `declared`, its
    /// key in `key_names`): the table is created if it is new, so an empty
    /// source table exists in the mirror too.
    Table(Box<RowChange>),
    /// A table's rows are replaced by the rows that follow in the same
    /// transaction (a copy from the source): every live row is deleted, and
    /// its columns become those in `declared` whatever their types were
    /// (a type change that cannot be made in place). Creates the table if
    /// it is new, like [`ChangeRecord::Table`].
    Replace(Box<RowChange>),
    /// Table `table` is dropped by the source transaction `txid` (inside
    /// it): snapshots from its commit on do not have the table, and its
    /// name is free for a new one.
    Drop {
        /// Qualified name.
        table: String,
        /// Source transaction id.
        txid: String,
    },
    /// A Kafka tombstone (`value: null`) or other record with nothing to apply.
    Skip,
}

/// The format of an input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InputFormat {
    /// Detect per line.
    #[default]
    Auto,
    /// Debezium JSON.
    Debezium,
    /// AWS DMS JSON.
    Dms,
}

impl std::str::FromStr for InputFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "debezium" => Ok(Self::Debezium),
            "dms" => Ok(Self::Dms),
            other => Err(format!("unknown format {other:?}: expected auto, debezium or dms")),
        }
    }
}

/// Decodes one input line. Blank lines decode to [`ChangeRecord::Skip`].
pub fn decode_line(line: &str, position: SourcePosition, format: InputFormat) -> Result<ChangeRecord> {
    let trimmed = line.trim();
    if trimmed.is_empty() {
        return Ok(ChangeRecord::Skip);
    }
    if format == InputFormat::Debezium || (format == InputFormat::Auto && !trimmed.contains("\"metadata\"")) {
        return debezium::decode_str(trimmed, position);
    }
    let json: Json =
        serde_json::from_str(trimmed).map_err(|e| input_error(position, None, None, format!("malformed JSON: {e}")))?;
    let format = match format {
        InputFormat::Auto if json.get("metadata").is_some_and(|m| m.get("record-type").is_some()) => InputFormat::Dms,
        InputFormat::Auto => InputFormat::Debezium,
        f => f,
    };
    match format {
        InputFormat::Dms => dms::decode(json, position),
        _ => debezium::decode(json, position),
    }
}

/// An input line that a decoded record may keep (a typed row keeps its
/// line to decode it again): a range of a buffer of lines read together,
/// which the lines of the buffer share.
#[derive(Clone)]
pub struct SharedLine {
    text: std::sync::Arc<LineBuffer>,
    range: std::ops::Range<usize>,
}

impl SharedLine {
    /// The line at `range` of `text`; `None` if `range` is not a range of
    /// whole characters of `text`.
    pub fn new(text: std::sync::Arc<LineBuffer>, range: std::ops::Range<usize>) -> Option<SharedLine> {
        text.as_str().get(range.clone())?;
        Some(SharedLine { text, range })
    }

    /// The line's text.
    pub fn as_str(&self) -> &str {
        // Checked in `new` (and `trim` keeps it whole).
        &self.text.as_str()[self.range.clone()]
    }

    /// The line without leading and trailing whitespace.
    fn trim(mut self) -> SharedLine {
        let line = self.as_str();
        let start = self.range.start + (line.len() - line.trim_start().len());
        let end = self.range.start + line.trim_end().len();
        self.range = start..end.max(start);
        self
    }
}

impl From<String> for SharedLine {
    fn from(line: String) -> SharedLine {
        let range = 0..line.len();
        SharedLine { text: std::sync::Arc::new(LineBuffer::from(line)), range }
    }
}

/// The text of a batch of lines read together. One taken from a
/// [`BufferPool`] goes back to it when dropped (when the last record
/// keeping one of its lines is), so the reader fills memory it has used
/// before instead of fresh pages: a fresh buffer a batch cost a page fault
/// every 4 KiB, about a quarter of a file replay's page faults.
pub struct LineBuffer {
    text: String,
    pool: Option<std::sync::Arc<BufferPool>>,
}

impl LineBuffer {
    /// The text read so far.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl From<String> for LineBuffer {
    /// A buffer of no pool.
    fn from(text: String) -> LineBuffer {
        LineBuffer { text, pool: None }
    }
}

impl Drop for LineBuffer {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.put(std::mem::take(&mut self.text));
        }
    }
}

/// Emptied batch buffers waiting to be filled again, at most `keep` of them
/// (about as many as batches can be in flight between the threads); one
/// beyond that is freed.
pub struct BufferPool {
    free: std::sync::Mutex<Vec<String>>,
    keep: usize,
}

impl BufferPool {
    /// A pool keeping up to `keep` buffers.
    pub fn new(keep: usize) -> std::sync::Arc<BufferPool> {
        std::sync::Arc::new(BufferPool { free: std::sync::Mutex::new(Vec::with_capacity(keep)), keep })
    }

    /// An empty buffer with room for `capacity` bytes, reused when one is free.
    pub fn take(&self, capacity: usize) -> String {
        let reused = fovea_types::sync::lock(&self.free).pop();
        let mut text = reused.unwrap_or_default();
        text.reserve(capacity);
        text
    }

    /// `text` as a batch buffer of this pool: back to it once dropped.
    pub fn buffer(self: &std::sync::Arc<Self>, text: String) -> LineBuffer {
        LineBuffer { text, pool: Some(std::sync::Arc::clone(self)) }
    }

    fn put(&self, mut text: String) {
        text.clear();
        let mut free = fovea_types::sync::lock(&self.free);
        if free.len() < self.keep {
            free.push(text);
        }
    }
}

impl std::fmt::Debug for SharedLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedLine").field(&self.as_str()).finish()
    }
}

/// [`decode_line`] for a line a record may keep: with `tables`, the row
/// images of a Debezium record whose table exists are read straight into
/// typed values (see [`typed`]).
pub fn decode_owned_line(
    line: SharedLine,
    position: SourcePosition,
    format: InputFormat,
    tables: Option<&mut typed::TypedTables>,
) -> Result<ChangeRecord> {
    let Some(tables) = tables else { return decode_line(line.as_str(), position, format) };
    let line = line.trim();
    if line.as_str().is_empty() || format == InputFormat::Dms {
        return decode_line(line.as_str(), position, format);
    }
    // Detected per line: a DMS record has `metadata` at its top, which
    // the Debezium decoder sees without a scan of its own.
    debezium::decode_typed(line, position, tables, format == InputFormat::Auto)
}

/// Builds an [`Error::Input`].
pub fn input_error(
    position: SourcePosition,
    table: Option<&str>,
    txid: Option<&str>,
    message: impl Into<String>,
) -> Error {
    Error::Input { position, table: table.map(str::to_owned), txid: txid.map(str::to_owned), message: message.into() }
}

/// The columns of a JSON object, in order.
pub(crate) fn object_columns(v: &Json) -> Option<Columns> {
    v.as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_line_is_a_whole_range_of_its_buffer_trimmed_in_place() {
        let text = std::sync::Arc::new(LineBuffer::from(String::from("x  {\"é\":1}\t\ny")));
        // Not on a character boundary (inside `é`), or beyond the end.
        assert!(SharedLine::new(text.clone(), 0..6).is_none());
        assert!(SharedLine::new(text.clone(), 13..20).is_none());
        assert_eq!(SharedLine::new(text.clone(), 13..14).unwrap().as_str(), "y");
        let line = SharedLine::new(text.clone(), 1..13).unwrap();
        assert_eq!(line.as_str(), "  {\"é\":1}\t\n");
        assert_eq!(line.trim().as_str(), "{\"é\":1}");
        assert_eq!(SharedLine::new(text, 1..3).unwrap().trim().as_str(), "");
        assert_eq!(SharedLine::from(String::from(" a ")).trim().as_str(), "a");
    }

    #[test]
    fn a_batch_buffer_goes_back_to_its_pool_when_its_last_line_is_dropped() {
        let pool = BufferPool::new(1);
        let mut text = pool.take(64);
        text.push_str("ab\ncd");
        let at = text.as_ptr();
        let buffer = std::sync::Arc::new(pool.buffer(text));
        let first = SharedLine::new(buffer.clone(), 0..2).unwrap();
        let second = SharedLine::new(buffer, 3..5).unwrap();
        drop(first);
        // A line still keeps it: the pool has none to give.
        let other = pool.take(1);
        assert_ne!(other.as_ptr(), at);
        assert_eq!(second.as_str(), "cd");
        drop(second);
        let again = pool.take(64);
        assert_eq!((again.as_ptr(), again.len()), (at, 0), "the same memory, emptied");
        // Beyond `keep`, a returned buffer is freed, not kept.
        drop(pool.buffer(String::from("x")));
        drop(pool.buffer(String::from("y")));
        assert_eq!(fovea_types::sync::lock(&pool.free).len(), 1);
    }
}
