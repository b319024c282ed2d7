//! Applying mirror transactions to a shard.
//!
//! A shard is the single writer of its index partition, its write buffers,
//! the files those buffers produce and their visibility. It applies the
//! operations of a mirror transaction at the transaction's timestamp in two
//! steps, so a rejected transaction leaves no trace:
//!
//! 1. [`Shard::validate`]: every operation against the live state (index plus
//!    the transaction's own earlier operations): an insert needs a key with
//!    no live version, a delete or update needs a live one.
//! 2. [`Shard::apply`]: insert → append to the write buffer and index the
//!    new version; delete → append `delete_ts` to the row's tile and a
//!    tombstone to the index; update → both.
//!
//! Operations are routed by hash of (table, key); an update that changes the
//! key becomes a delete and an insert, which may go to two shards.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::collections::HashMap;

use crate::buffer::{ActiveBlock, Block, BlockBuilder, BlockData, FileKind, LakeFile, PartState, TablePart};
use crate::error::{Error, Result};
use crate::ids::{FileId, RowId, ShardId, TableId, Ts};
use crate::index::{KeyBytes, KeySlot, MainIndex, PrimaryIndex, RoutingKey, encode_key, encode_row_key, routing_key};
use crate::lake::ts_range;
use crate::mvcc::lock;
use crate::schema::{Row, TableDef, Value, render_key};
use crate::visibility::{FileVisibility, VisibilityWriter};

/// Keys an operation batch made live (`true`) or removed, as it is validated.
type Overlay<'k> = hashbrown::HashMap<&'k [u8], bool, foldhash::fast::FixedState>;

/// A change of one row, as the source database made it.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A new row.
    Insert {
        /// Table.
        table: TableId,
        /// All user columns.
        row: Row,
    },
    /// Removal of the row with this primary key.
    Delete {
        /// Table.
        table: TableId,
        /// Primary-key values, in key order.
        key: Row,
    },
    /// The row `row`, whatever its key holds: replaces a live row with the
    /// same key, or inserts. Snapshot records (an initial load, a connector
    /// re-reading its tables) are upserts: a row read again is not an error.
    Upsert {
        /// Table.
        table: TableId,
        /// All user columns.
        row: Row,
    },
    /// Replacement of the row with primary key `key` by `row` (whose key
    /// may differ).
    Update {
        /// Table.
        table: TableId,
        /// Old primary-key values.
        key: Row,
        /// New row, all user columns.
        row: Row,
    },
}

impl Op {
    /// The table the operation changes.
    pub fn table(&self) -> TableId {
        match self {
            Op::Insert { table, .. }
            | Op::Delete { table, .. }
            | Op::Upsert { table, .. }
            | Op::Update { table, .. } => *table,
        }
    }
}

/// An operation routed to one shard, with its key encoded.
#[derive(Clone, Debug)]
pub enum ShardOp {
    /// Insert `row` under `key`.
    Insert {
        /// Table.
        table: Arc<TableDef>,
        /// Encoded key of `row`.
        key: KeyBytes,
        /// The row.
        row: Row,
    },
    /// Delete `key`.
    Delete {
        /// Table.
        table: Arc<TableDef>,
        /// Encoded key.
        key: KeyBytes,
        /// Key values, for messages.
        values: Row,
    },
    /// Replace the row at `key` by `row` (same key).
    Update {
        /// Table.
        table: Arc<TableDef>,
        /// Encoded key.
        key: KeyBytes,
        /// The new row.
        row: Row,
    },
    /// Replace the row at `key` by `row` if it has a live one, else insert.
    Upsert {
        /// Table.
        table: Arc<TableDef>,
        /// Encoded key of `row`.
        key: KeyBytes,
        /// The row.
        row: Row,
    },
}

impl ShardOp {
    /// The bytes its shard is chosen by ([`routing_key`]).
    pub fn routing_key(&self) -> RoutingKey {
        match self {
            ShardOp::Insert { table, row, .. }
            | ShardOp::Update { table, row, .. }
            | ShardOp::Upsert { table, row, .. } => routing_key(table.id, table.key_values(row)),
            ShardOp::Delete { table, values, .. } => routing_key(table.id, values),
        }
    }

    /// Splits an [`Op`] into shard operations, handed to `emit`: checks
    /// types and keys (nothing is emitted for an op that fails them), and
    /// turns a key-changing update into a delete and an insert.
    pub fn from_op(
        op: Op,
        table_of: impl Fn(TableId) -> Result<Arc<TableDef>>,
        mut emit: impl FnMut(ShardOp),
    ) -> Result<()> {
        match op {
            Op::Insert { table, row } => {
                let table = table_of(table)?;
                table.check_row(&row)?;
                let key = encode_row_key(&table, &row);
                emit(ShardOp::Insert { table, key, row });
            }
            Op::Upsert { table, row } => {
                let table = table_of(table)?;
                table.check_row(&row)?;
                let key = encode_row_key(&table, &row);
                emit(ShardOp::Upsert { table, key, row });
            }
            Op::Delete { table, key } => {
                let table = table_of(table)?;
                table.check_key(&key)?;
                let encoded = encode_key(table.id, &key);
                emit(ShardOp::Delete { table, key: encoded, values: key });
            }
            Op::Update { table, key, row } => {
                let table = table_of(table)?;
                table.check_key(&key)?;
                table.check_row(&row)?;
                let new = encode_row_key(&table, &row);
                // Most updates keep their key: values that are the same
                // encode the same, so the old key is encoded only to tell
                // otherwise.
                // (`check_key` made sure there is a value per key column.)
                let kept = table.key_values(&row).zip(&key).all(|(a, b)| a.is_identical(b));
                match (!kept).then(|| encode_key(table.id, &key)).filter(|old| *old != new) {
                    None => emit(ShardOp::Update { table, key: new, row }),
                    Some(old) => {
                        emit(ShardOp::Delete { table: Arc::clone(&table), key: old, values: key });
                        emit(ShardOp::Insert { table, key: new, row });
                    }
                }
            }
        }
        Ok(())
    }
}

/// Sizes of write-buffer blocks and files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferConfig {
    /// Rows per block (a multiple of the 4096-row tile).
    pub block_rows: usize,
    /// Blocks per virtual file.
    pub blocks_per_file: usize,
}

/// A block to write to the object store.
pub struct FlushJob {
    /// The part owning the block.
    pub part: Arc<TablePart>,
    /// Its file.
    pub file: FileId,
    /// The block.
    pub block: Arc<Block>,
}

impl ShardContext<'_> {
    /// The lease epoch of this writer: the high bits of the file ids it
    /// allocates ([`crate::engine::FILE_ID_EPOCH_SHIFT`]).
    pub fn writer_epoch(&self) -> u64 {
        // Relaxed: the epoch bits are fenced in before any shard applies.
        self.file_ids.load(Ordering::Relaxed) >> crate::engine::FILE_ID_EPOCH_SHIFT
    }
}

/// What a shard needs from its engine while applying.
pub struct ShardContext<'a> {
    /// Global file-id allocator.
    pub file_ids: &'a AtomicU64,
    /// Queue of the background flusher.
    pub flush: &'a dyn Fn(FlushJob),
    /// Buffer sizes.
    pub config: BufferConfig,
}

/// The block a part appends to (or, after a restore, the last block of its
/// open file, with `capacity == rows` so the next row opens a new block).
pub(crate) struct OpenBlock {
    pub(crate) file: FileId,
    pub(crate) slot: u32,
    pub(crate) index: u32,
    /// Row offset of the block in its file: the sum of the earlier blocks'
    /// rows (blocks are full, except the last one before a restore).
    pub(crate) offset: usize,
    pub(crate) rows: usize,
    pub(crate) capacity: usize,
    pub(crate) row_id_start: u64,
}

pub(crate) struct PartWriter {
    pub(crate) part: Arc<TablePart>,
    pub(crate) open: Option<OpenBlock>,
}

/// One shard's writer state: index partition, row-id allocator, buffers and
/// the unique visibility writers of its files.
pub struct Shard {
    id: ShardId,
    pub(crate) index: PrimaryIndex,
    pub(crate) main: MainIndex,
    pub(crate) next_row_id: u64,
    pub(crate) writers: Vec<VisibilityWriter>,
    /// Per table (hashed with foldhash: SipHash was a tenth of a shard's
    /// work, two look-ups per operation).
    pub(crate) parts: HashMap<TableId, PartWriter, foldhash::fast::FixedState>,
    /// Timestamp of the last applied operations.
    pub(crate) last_ts: Ts,
}

/// Fails unless `shard`, whose next row id is `next`, can hand out `n`
/// more (they stay below [`RowId::LIMIT`], the index's packing).
pub(crate) fn check_row_ids(shard: ShardId, next: u64, n: u64) -> Result<()> {
    if next.checked_add(n).is_none_or(|end| end > RowId::LIMIT) {
        return Err(Error::invariant(format!(
            "the row ids of shard {} are used up (next {next}, {n} more asked for, limit {})",
            shard.0,
            RowId::LIMIT
        )));
    }
    Ok(())
}

impl Shard {
    /// An empty shard.
    pub fn new(id: ShardId) -> Self {
        Shard {
            id,
            index: PrimaryIndex::new(),
            main: MainIndex::default(),
            next_row_id: 0,
            writers: Vec::new(),
            parts: HashMap::default(),
            last_ts: Ts::ZERO,
        }
    }

    /// This shard's id.
    pub fn id(&self) -> ShardId {
        self.id
    }

    /// Registers the table part this shard writes.
    pub fn add_part(&mut self, part: Arc<TablePart>) {
        self.parts.insert(part.table.id, PartWriter { part, open: None });
    }

    /// The index partition.
    pub fn index(&self) -> &PrimaryIndex {
        &self.index
    }

    /// Checks that `ops`, applied in order, conflict with no live key.
    /// A [`Error::KeyConflict`] names the index of the failing operation in `ops`.
    pub fn validate(&self, ops: &[ShardOp]) -> Result<()> {
        // What the ops before made of a key (live or not), hashed as the
        // index hashes keys (not SipHash: this runs for every op).
        // Sized for every op's key: it grows no more while filled.
        let mut overlay: Overlay<'_> = Overlay::with_capacity_and_hasher(ops.len(), Default::default());
        // Whether the index has a live row of each op's key, looked up in
        // one tight pass before the ops are checked in order: the look-ups
        // do not depend on each other, so the processor overlaps their
        // cache misses (the index outgrows the caches, and one look-up's
        // misses after another's were the largest part of a shard's time).
        // An upsert needs none.
        let indexed: Vec<bool> = ops
            .iter()
            .map(|op| match op {
                ShardOp::Upsert { .. } => false,
                ShardOp::Insert { key, .. } | ShardOp::Delete { key, .. } | ShardOp::Update { key, .. } => {
                    self.index.latest(key).is_some()
                }
            })
            .collect();
        let live = |overlay: &Overlay<'_>, key: &KeyBytes, i: usize| {
            overlay.get(key.as_slice()).copied().unwrap_or(indexed[i])
        };
        for (i, op) in ops.iter().enumerate() {
            let at = |e: Error| match e {
                Error::KeyConflict { table, key, message, .. } => {
                    Error::KeyConflict { table, key, message, op: Some(i) }
                }
                other => other,
            };
            match op {
                ShardOp::Insert { table, key, row } => {
                    if live(&overlay, key, i) {
                        return Err(at(conflict(
                            table,
                            &table.key_of(row),
                            "insert of a key that already has a live row",
                        )));
                    }
                    overlay.insert(key, true);
                }
                ShardOp::Delete { table, key, values } => {
                    if !live(&overlay, key, i) {
                        return Err(at(conflict(table, values, "delete of a key with no live row")));
                    }
                    overlay.insert(key, false);
                }
                ShardOp::Update { table, key, row } => {
                    if !live(&overlay, key, i) {
                        return Err(at(conflict(table, &table.key_of(row), "update of a key with no live row")));
                    }
                }
                ShardOp::Upsert { key, .. } => {
                    overlay.insert(key, true);
                }
            }
            if !self.parts.contains_key(&op_table(op).id) {
                return Err(Error::UnknownTable(op_table(op).name.clone()));
            }
        }
        Ok(())
    }

    /// Applies validated operations at `ts`. Timestamps must not decrease
    /// from one call to the next.
    pub fn apply(&mut self, ts: Ts, ops: &[ShardOp], ctx: &ShardContext<'_>) -> Result<()> {
        if ts < self.last_ts {
            return Err(Error::invariant(format!(
                "{} applied {ts:?} after {:?}: a shard applies in timestamp order",
                self.id, self.last_ts
            )));
        }
        self.last_ts = ts;
        for op in ops {
            match op {
                ShardOp::Insert { table, key, row } => {
                    let row_id = self.append_row(table, row, ts, ctx)?;
                    self.index.put(key, ts, row_id)?;
                }
                ShardOp::Delete { table, key, values } => {
                    let (slot, row_id) = self.live_slot(table, key, || values.clone())?;
                    self.delete_row(table, row_id, ts)?;
                    self.index.tombstone_at(slot, key, ts)?;
                }
                ShardOp::Update { table, key, row } => {
                    let (slot, old) = self.live_slot(table, key, || table.key_of(row))?;
                    self.delete_row(table, old, ts)?;
                    let row_id = self.append_row(table, row, ts, ctx)?;
                    self.index.put_at(slot, key, ts, row_id)?;
                }
                ShardOp::Upsert { table, key, row } => match self.index.latest_slot(key) {
                    Some((slot, old)) => {
                        self.delete_row(table, old, ts)?;
                        let row_id = self.append_row(table, row, ts, ctx)?;
                        self.index.put_at(slot, key, ts, row_id)?;
                    }
                    None => {
                        let row_id = self.append_row(table, row, ts, ctx)?;
                        self.index.put(key, ts, row_id)?;
                    }
                },
            }
        }
        Ok(())
    }

    /// Where `key`'s live row is (validated: a key with none is a bug, told
    /// with the key's values, which `values` makes only then).
    fn live_slot(
        &self,
        table: &TableDef,
        key: &KeyBytes,
        values: impl FnOnce() -> Vec<Value>,
    ) -> Result<(KeySlot, RowId)> {
        self.index
            .latest_slot(key)
            .ok_or_else(|| conflict(table, &values(), "delete of a key with no live row (not validated)"))
    }

    /// Marks live row `row_id` of `table` deleted from `ts` on.
    fn delete_row(&mut self, table: &TableDef, row_id: RowId, ts: Ts) -> Result<()> {
        let loc = self
            .main
            .locate(row_id)
            .ok_or_else(|| Error::invariant(format!("{row_id:?} of table {} has no location", table.name)))?;
        self.writers[loc.file_slot as usize].delete(loc.offset as usize, ts)
    }

    fn append_row(&mut self, table: &Arc<TableDef>, row: &[Value], ts: Ts, ctx: &ShardContext<'_>) -> Result<RowId> {
        let cfg = ctx.config;
        let pw = self.parts.get_mut(&table.id).ok_or_else(|| Error::UnknownTable(table.name.clone()))?;
        let file_capacity = cfg.block_rows * cfg.blocks_per_file;
        if pw.open.as_ref().is_none_or(|o| o.rows == o.capacity) {
            // Open a new block, in a new file when the current one is full.
            let (file, slot, index, offset) = match &pw.open {
                Some(o)
                    if (o.index as usize) + 1 < cfg.blocks_per_file
                        && o.offset + o.rows + cfg.block_rows <= file_capacity =>
                {
                    (o.file, o.slot, o.index + 1, o.offset + o.rows)
                }
                previous => {
                    let mut state = lock(&pw.part.state);
                    if let Some(prev) = previous
                        && let Some(f) = state.files.iter_mut().find(|f| f.id == prev.file)
                        && let FileKind::Virtual { sealed, .. } = &mut f.kind
                    {
                        *sealed = true;
                    }
                    drop(state);
                    // Relaxed: ids only need to be unique.
                    let file = FileId(ctx.file_ids.fetch_add(1, Ordering::Relaxed));
                    let (vis, writer) = FileVisibility::new(file, file_capacity);
                    let slot = self.writers.len() as u32;
                    self.writers.push(writer);
                    lock(&pw.part.state).files.push(LakeFile {
                        id: file,
                        vis,
                        kind: FileKind::Virtual { blocks: Vec::new(), sealed: false },
                    });
                    (file, slot, 0, 0)
                }
            };
            let row_id_start = self.next_row_id;
            check_row_ids(self.id, row_id_start, cfg.block_rows as u64)?;
            self.next_row_id += cfg.block_rows as u64;
            self.main.add_range(RowId(row_id_start), cfg.block_rows as u32, file, slot, offset as u32)?;
            let vis = Arc::clone(self.writers[slot as usize].visibility());
            let builder = BlockBuilder::new(Arc::clone(table), cfg.block_rows)?;
            lock(&pw.part.state).active = Some(ActiveBlock { file, vis, offset, builder });
            pw.open = Some(OpenBlock { file, slot, index, offset, rows: 0, capacity: cfg.block_rows, row_id_start });
        }
        let open = pw.open.as_mut().ok_or_else(|| Error::invariant("no open block after opening one"))?;
        let full = {
            let mut state = lock(&pw.part.state);
            let active = state.active.as_mut().ok_or_else(|| Error::invariant("open block without active builder"))?;
            active.builder.append(row, ts);
            if active.builder.is_full() { close_active(&mut state, open, cfg, ctx.writer_epoch())? } else { None }
        };
        let row_id = RowId(open.row_id_start + open.rows as u64);
        open.rows += 1;
        if let Some(block) = full {
            (ctx.flush)(FlushJob { part: Arc::clone(&pw.part), file: open.file, block });
        }
        Ok(row_id)
    }

    /// Ends the active block and file of `table` early (its schema
    /// changes): the rows so far become an immutable block, the file is
    /// sealed (a file has one schema), the next row opens a new file.
    pub fn close_file(&mut self, table: TableId, ctx: &ShardContext<'_>) -> Result<()> {
        let Some(pw) = self.parts.get_mut(&table) else { return Ok(()) };
        let Some(open) = pw.open.take() else { return Ok(()) };
        let mut state = lock(&pw.part.state);
        let block = close_active(&mut state, &open, ctx.config, ctx.writer_epoch())?;
        if let Some(FileKind::Virtual { sealed, .. }) =
            state.files.iter_mut().find(|f| f.id == open.file).map(|f| &mut f.kind)
        {
            *sealed = true;
        }
        drop(state);
        if let Some(block) = block {
            (ctx.flush)(FlushJob { part: Arc::clone(&pw.part), file: open.file, block });
        }
        Ok(())
    }

    /// Drops index versions no snapshot `≥ lwm` can see.
    pub fn purge(&mut self, lwm: Ts) -> usize {
        self.index.purge(lwm)
    }

    /// Bytes of index (SPI + MI) and of visibility-writer bookkeeping.
    pub fn memory_bytes(&self) -> (usize, usize) {
        (
            self.index.memory_bytes() + self.main.memory_bytes(),
            self.writers.iter().map(VisibilityWriter::memory_bytes).sum(),
        )
    }
}

/// Makes the active block of a part immutable (it joins its file's blocks)
/// and returns it for flushing; `None` when it holds no rows.
fn close_active(state: &mut PartState, open: &OpenBlock, cfg: BufferConfig, writer: u64) -> Result<Option<Arc<Block>>> {
    let Some(mut active) = state.active.take() else { return Ok(None) };
    if active.builder.rows() == 0 {
        return Ok(None);
    }
    let batch = active.builder.finish()?;
    let (min_ts, max_ts) = ts_range(crate::lake::create_ts_column(&batch)?);
    let block = Arc::new(Block {
        index: open.index,
        rows: batch.num_rows(),
        min_ts,
        max_ts,
        data: BlockData::Memory(batch),
        writer,
    });
    let sealed_now = open.index as usize + 1 == cfg.blocks_per_file;
    let file = state
        .files
        .iter_mut()
        .find(|f| f.id == open.file)
        .ok_or_else(|| Error::invariant(format!("{} missing from its part", open.file)))?;
    match &mut file.kind {
        FileKind::Virtual { blocks, sealed } => {
            blocks.push(Arc::clone(&block));
            *sealed = sealed_now;
        }
        FileKind::Regular(_) => return Err(Error::invariant("appending to a regular file")),
    }
    Ok(Some(block))
}

fn op_table(op: &ShardOp) -> &Arc<TableDef> {
    match op {
        ShardOp::Insert { table, .. }
        | ShardOp::Delete { table, .. }
        | ShardOp::Update { table, .. }
        | ShardOp::Upsert { table, .. } => table,
    }
}

fn conflict(table: &TableDef, key: &[Value], message: &str) -> Error {
    Error::KeyConflict { table: table.name.clone(), key: render_key(key), message: message.into(), op: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field, Schema};

    /// An update whose key values stay as they were is one update of that
    /// key; one whose key encodes differently is a delete of the old key
    /// and an insert of the new, also where `==` calls the values equal
    /// (`0.0` and `-0.0`) and where it calls them unequal but they encode
    /// the same (NaN).
    #[test]
    fn an_update_is_split_exactly_where_its_key_encodes_differently() {
        let schema = Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("x", DataType::Float64, false),
            Field::new("v", DataType::Utf8, true),
        ]);
        let table = TableDef::new(TableId(7), "s.t", Arc::new(schema), vec![1, 0]).unwrap();
        let row = |a: i64, x: f64| vec![Value::Int(a), Value::Float(x), Value::Utf8("v".into())];
        let cases = [
            ((1, 2.5), (1, 2.5)),
            ((1, 2.5), (2, 2.5)),
            ((1, 2.5), (1, 3.5)),
            ((1, 0.0), (1, -0.0)),
            ((1, f64::NAN), (1, f64::NAN)),
            ((1, f64::NAN), (1, -f64::NAN)),
        ];
        for ((a, x), (b, y)) in cases {
            let key = vec![Value::Float(x), Value::Int(a)];
            let new = row(b, y);
            let (old_key, new_key) = (encode_key(table.id, &key), encode_row_key(&table, &new));
            let mut ops = Vec::new();
            let op = Op::Update { table: table.id, key: key.clone(), row: new };
            ShardOp::from_op(op, |_| Ok(Arc::clone(&table)), |o| ops.push(o)).unwrap();
            let what = format!("{key:?} -> ({b}, {y})");
            match ops.as_slice() {
                [ShardOp::Update { key, .. }] => {
                    assert_eq!(old_key, new_key, "{what}: the key changed");
                    assert_eq!(*key, new_key, "{what}");
                }
                [ShardOp::Delete { key: deleted, .. }, ShardOp::Insert { key: inserted, .. }] => {
                    assert_ne!(old_key, new_key, "{what}: the key stayed");
                    assert_eq!((deleted, inserted), (&old_key, &new_key), "{what}");
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }
}
