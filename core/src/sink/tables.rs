//! Tables as the source declares them: creating, replacing and dropping
//! them, and evolving their columns (added columns, widened types, a
//! column kept as text after an incompatible change).

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};

use crate::catalog::CatalogOperation;
use crate::cdc::debezium::UNAVAILABLE;
use crate::cdc::typed::TableShape;
use crate::cdc::types::{convert_exact, infer_type, to_value};
use crate::cdc::{Columns, ROWID_COLUMN, RowChange, RowOp, SourcePosition, hidden_rowid, input_error};
use crate::error::{Error, Result};
use crate::ids::Ts;
use crate::schema::{TypeChange, Value};

use super::*;

/// A column the source declares in another type than the table's.
#[derive(Clone, Debug)]
pub(super) struct Retyped {
    /// Its index in the table.
    pub(super) index: usize,
    pub(super) name: String,
    /// The declared type, or the one it widens to.
    pub(super) to: DataType,
    /// [`TypeChange::Widen`]: the table widens to `to`; [`TypeChange::Recopy`]:
    /// the column keeps its type and each value of type `to` is converted
    /// into it exactly.
    pub(super) change: TypeChange,
}

impl Sink {
    /// The table of a record, created on first sight from the DDL, the
    /// record's schema, or its values.
    pub(super) fn table(&mut self, r: &RowChange, position: SourcePosition, txid: &str) -> Result<&TableShape> {
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
    pub(super) fn replace_table(&mut self, r: &RowChange, position: SourcePosition) -> Result<()> {
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
    pub(super) fn drop_table(&mut self, name: &str, txid: &str, position: SourcePosition) -> Result<()> {
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
    pub(super) fn create_table(
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
    pub(super) fn retyped_columns(&self, r: &RowChange) -> Vec<Retyped> {
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
    pub(super) fn widening_for_kept(
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
    pub(super) fn evolve_if_needed(
        &mut self,
        r: &RowChange,
        position: SourcePosition,
        txid: &str,
    ) -> Result<Vec<Retyped>> {
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
    pub(super) fn evolve(
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
}

/// Columns of `t` whose value in `after` does not fit the column's type
/// but fits a wider one the column may widen to in place (the narrowest
/// such): a record without declared types (DMS, Debezium without schemas)
/// shows an `ALTER COLUMN … TYPE` of the source only this way, since the
/// source holds no value its column's type cannot.
pub(super) fn widened_by_values(t: &TableShape, after: &Columns) -> Vec<Retyped> {
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
pub(super) fn narrowest_widening(
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
pub(super) fn wider_types(t: &DataType) -> Vec<DataType> {
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
