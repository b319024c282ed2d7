//! The rows of a table without a primary key, found by their content.
//!
//! Such a table is keyed by a hidden row id ([`crate::cdc::ROWID_COLUMN`])
//! that no source record names. An insert gets the next id; an update or a
//! delete names its row by the whole old image instead, as PostgreSQL
//! sends it for a table whose replica identity is FULL (and refuses the
//! change for any other table without a key). [`RowsByContent`] maps a
//! row's content to the ids of the live rows holding it, so that such a
//! change finds a row to change in constant time.
//!
//! Contract: built from every live row of the table at one state, then
//! told every operation the sink hands on for the table after that state,
//! in order, it holds exactly the table's live rows. Rows equal in every
//! column are interchangeable (SQL cannot tell them apart), so any of
//! their ids is the one a change of such a row takes. Content is compared
//! by a 128-bit hash of the rows' key encoding ([`crate::index`]), in which
//! identical values, and only those, encode identically.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::replay::Op;
use crate::schema::{TableDef, Value};

/// A content hash: 128 bits, so that two different rows of one table
/// sharing one is not to be expected in the lifetime of the universe.
type ContentHash = u128;

/// The live rows of one table without a primary key, by content (see the
/// module's contract).
pub(super) struct RowsByContent {
    /// The definition the map was built for: another (the table evolved
    /// or was replaced) holds rows of another shape.
    def: Arc<TableDef>,
    /// Column of the hidden row id.
    rowid: usize,
    /// Ids of the live rows with each content.
    ids: HashMap<ContentHash, SmallVec<[i64; 1]>, foldhash::fast::RandomState>,
    /// Content of each live row id.
    content: HashMap<i64, ContentHash, foldhash::fast::RandomState>,
}

impl RowsByContent {
    /// An empty map of `def`'s rows, whose hidden row id is column `rowid`.
    pub(super) fn new(def: Arc<TableDef>, rowid: usize) -> Self {
        RowsByContent { def, rowid, ids: Default::default(), content: Default::default() }
    }

    /// Whether the map holds rows of `def` as it is now.
    pub(super) fn is_for(&self, def: &Arc<TableDef>) -> bool {
        Arc::ptr_eq(&self.def, def)
    }

    /// The hash of `row`'s content: every column but the hidden row id.
    /// `row` has the table's columns, the row id's value being ignored.
    pub(super) fn hash<'v>(&self, row: impl IntoIterator<Item = &'v Value>) -> ContentHash {
        let rowid = self.rowid;
        let values = row.into_iter().enumerate().filter(|&(i, _)| i != rowid).map(|(_, v)| v);
        twox_hash::XxHash3_128::oneshot(&crate::index::encode_key_values(self.def.id, values))
    }

    /// Records a live row `row` (every column, its row id included).
    pub(super) fn insert(&mut self, row: &[Value]) -> Result<()> {
        let id = self.rowid_of(row)?;
        let hash = self.hash(row);
        self.remove(id);
        self.content.insert(id, hash);
        self.ids.entry(hash).or_default().push(id);
        Ok(())
    }

    /// Forgets the row with id `id`, if live.
    pub(super) fn remove(&mut self, id: i64) {
        let Some(hash) = self.content.remove(&id) else { return };
        if let Entry::Occupied(mut e) = self.ids.entry(hash) {
            e.get_mut().retain(|&mut i| i != id);
            if e.get().is_empty() {
                e.remove();
            }
        }
    }

    /// Forgets every row (the table was truncated).
    pub(super) fn clear(&mut self) {
        self.ids.clear();
        self.content.clear();
    }

    /// The id of a live row with content `hash`, if any.
    pub(super) fn find(&self, hash: ContentHash) -> Option<i64> {
        self.ids.get(&hash).and_then(|ids| ids.first().copied())
    }

    /// Live rows held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.content.len()
    }

    /// Follows `op`, an operation on the map's table handed on after the
    /// state the map holds.
    pub(super) fn apply(&mut self, op: &Op) -> Result<()> {
        match op {
            Op::Insert { row, .. } | Op::Upsert { row, .. } => self.insert(row),
            Op::Update { key, row, .. } => {
                self.remove(self.key_rowid(key)?);
                self.insert(row)
            }
            Op::Delete { key, .. } => {
                self.remove(self.key_rowid(key)?);
                Ok(())
            }
        }
    }

    fn rowid_of(&self, row: &[Value]) -> Result<i64> {
        match row.get(self.rowid) {
            Some(&Value::Int(id)) => Ok(id),
            other => Err(Error::invariant(format!("a row of {} with hidden row id {other:?}", self.def.name))),
        }
    }

    fn key_rowid(&self, key: &[Value]) -> Result<i64> {
        match key {
            [Value::Int(id)] => Ok(*id),
            other => Err(Error::invariant(format!("a key of {} that is no hidden row id: {other:?}", self.def.name))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TableId;
    use arrow::datatypes::{DataType, Field, Schema};

    fn map() -> RowsByContent {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
            Field::new(crate::cdc::ROWID_COLUMN, DataType::Int64, false),
        ]));
        let def = TableDef::new(TableId(7), "s.h", schema, vec![2]).unwrap();
        RowsByContent::new(def, 2)
    }

    fn row(a: i64, b: &str, id: i64) -> Vec<Value> {
        vec![Value::Int(a), Value::Utf8(b.into()), Value::Int(id)]
    }

    /// The map follows inserts, updates (moving a row to other content)
    /// and deletes against a naive list of live rows, equal rows included.
    #[test]
    fn finds_a_live_row_of_each_content_as_operations_change_them() {
        let mut m = map();
        let mut live: Vec<Vec<Value>> = Vec::new();
        let table = TableId(7);
        let mut next = 1;
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for step in 0..2000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let (a, b) = ((rng % 5) as i64, if rng.is_multiple_of(3) { "x" } else { "y" });
            let op = match rng % 4 {
                0 | 1 => {
                    next += 1;
                    Op::Insert { table, row: row(a, b, next) }
                }
                2 => match m.find(m.hash(&row(a, b, 0))) {
                    Some(id) => Op::Update { table, key: vec![Value::Int(id)], row: row(a + 1, b, id) },
                    None => continue,
                },
                _ => match m.find(m.hash(&row(a, b, 0))) {
                    Some(id) => Op::Delete { table, key: vec![Value::Int(id)] },
                    None => {
                        assert!(!live.iter().any(|r| r[..2] == row(a, b, 0)[..2]), "step {step}: a live row missed");
                        continue;
                    }
                },
            };
            if let Op::Update { key, .. } | Op::Delete { key, .. } = &op {
                let i = live.iter().position(|r| r[2] == key[0]).expect("a found id is live");
                assert_eq!(live[i][..2], row(a, b, 0)[..2], "step {step}: found a row of other content");
                live.remove(i);
            }
            if let Op::Insert { row, .. } | Op::Update { row, .. } = &op {
                live.push(row.clone());
            }
            m.apply(&op).unwrap();
            assert_eq!(m.len(), live.len(), "step {step}");
        }
        for r in &live {
            assert!(m.find(m.hash(r)).is_some());
        }
        m.clear();
        assert!(m.find(m.hash(&live[0])).is_none());
    }
}
