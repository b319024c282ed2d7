//! Row changes into operations: images read against the table's current
//! columns, keys, changes named by their old image (tables without a
//! key), hidden row ids, unchanged TOAST values filled from the live row.

use std::sync::Arc;

use arrow::array::{Array, Int64Array};

use crate::cdc::debezium::UNAVAILABLE;
use crate::cdc::typed::TableShape;
use crate::cdc::types::{convert_exact, to_value};
use crate::cdc::{Columns, ROWID_COLUMN, RowChange, RowOp, SourcePosition, hidden_rowid, input_error};
use crate::error::{Error, Result};
use crate::replay::Op;
use crate::schema::{Row, Value, render_key};
use std::hash::Hasher;
use twox_hash::XxHash64;

use super::*;

impl Sink {
    /// A full row in table order; `None` entries are TOAST placeholders.
    /// `kept`: columns the record declares in another type than the
    /// table's, whose values are converted exactly.
    pub(super) fn image(
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
    pub(super) fn value(
        t: &TableShape,
        i: usize,
        v: &serde_json::Value,
        kept: &[Retyped],
    ) -> std::result::Result<Value, String> {
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

    pub(super) fn key_values(
        t: &TableShape,
        r: &RowChange,
        kept: &[Retyped],
        err: &dyn Fn(String) -> Error,
    ) -> Result<Row> {
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

    pub(super) fn op_of(&mut self, r: &RowChange, position: SourcePosition, txid: &str) -> Result<Op> {
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
    pub(super) fn change_by_old_image(
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
    pub(super) fn next_rowid(&mut self, def: &crate::schema::TableDef, column: usize) -> Result<i64> {
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
    pub(super) fn with_unchanged_values(
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
    pub(super) fn take_trailing_delete(&mut self, id: crate::ids::TableId, name: &str) -> Option<Row> {
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
pub(super) fn typed_op(op: RowOp, typed: crate::cdc::typed::TypedRow) -> Result<Op> {
    let table = typed.table;
    Ok(match op {
        RowOp::Insert => Op::Insert { table, row: typed.row },
        RowOp::SnapshotRead => Op::Upsert { table, row: typed.row },
        RowOp::Update => Op::Update { table, key: typed.key, row: typed.row },
        RowOp::Delete => Op::Delete { table, key: typed.key },
        RowOp::Truncate => return Err(Error::invariant("a truncate has no row to read typed")),
    })
}

/// Feeds what identifies a snapshot record to a run's identity digest: the
/// table, the source transaction and time, and the key and images (JSON
/// text, in the record's column order). Not the snapshot marker (`first`,
/// `last`): it says where a record sits in a run, not what it is.
pub(super) fn digest_row(h: &mut XxHash64, r: &RowChange) {
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
