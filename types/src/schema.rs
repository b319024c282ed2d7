//! Tables, their schemas and the values rows are made of.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use crate::error::{Error, Result};
use crate::ids::{TableId, Ts};

/// Name of the hidden column holding each version's creation timestamp.
pub const CREATE_TS_COLUMN: &str = "_fovea_create_ts";

/// The Parquet field id of the hidden column: far above any column's, and
/// below the ids Iceberg reserves for its metadata columns.
pub const CREATE_TS_FIELD_ID: i32 = 2_000_000_000;

/// The Arrow field metadata key of a Parquet field id.
pub const FIELD_ID_KEY: &str = parquet::arrow::PARQUET_FIELD_ID_META_KEY;

/// The Parquet field id of `field`, if it has one.
pub fn field_id(field: &Field) -> Option<i32> {
    field.metadata().get(FIELD_ID_KEY).and_then(|v| v.parse().ok())
}

/// How the columns of a stored schema (a file's, a batch's) are found:
/// by field id where it carries them, else by name (files written before
/// fovea wrote field ids).
pub enum StoredColumns {
    /// Position by field id.
    ById(std::collections::HashMap<i32, usize>),
    /// No field ids: by name.
    ByName,
}

impl StoredColumns {
    /// How `stored`'s columns are found.
    pub fn of(stored: &Schema) -> Self {
        let ids: std::collections::HashMap<i32, usize> =
            stored.fields().iter().enumerate().filter_map(|(i, f)| field_id(f).map(|id| (id, i))).collect();
        if ids.is_empty() { StoredColumns::ByName } else { StoredColumns::ById(ids) }
    }

    /// Where `stored` (the schema this was made of) holds the column `name`
    /// with field id `id`.
    pub fn index(&self, stored: &Schema, name: &str, id: i32) -> Option<usize> {
        match self {
            StoredColumns::ById(ids) => ids.get(&id).copied(),
            StoredColumns::ByName => stored.index_of(name).ok(),
        }
    }
}

/// A table's columns as a lineage: each one's field id, never given to
/// another column of the table (a column dropped and added again under its
/// name gets a new one), and the mirror transaction that added it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnIdentity {
    /// Field id per user column.
    pub ids: Vec<i32>,
    /// Per user column, the transaction that added it (`Ts::ZERO`: it
    /// came with the table).
    pub since: Vec<Ts>,
    /// The highest field id the table has given (the next column gets the
    /// one after).
    pub last_id: i32,
}

impl ColumnIdentity {
    /// Of `n` columns that came with the table: ids 1 to `n`.
    pub fn first(n: usize) -> Self {
        ColumnIdentity { ids: (1..=n as i32).collect(), since: vec![Ts::ZERO; n], last_id: n as i32 }
    }

    /// Of the columns `names` that `old` (of `old_names`) becomes at
    /// transaction `ts`: a column of a name `old` has keeps its id and its
    /// transaction, any other is new (the next id, added at `ts`).
    pub fn evolve(&self, old_names: &[&str], names: &[&str], ts: Ts) -> Self {
        let mut last_id = self.last_id;
        let (mut ids, mut since) = (Vec::with_capacity(names.len()), Vec::with_capacity(names.len()));
        for n in names {
            match old_names.iter().position(|o| o == n) {
                Some(i) => {
                    ids.push(self.ids[i]);
                    since.push(self.since[i]);
                }
                None => {
                    last_id += 1;
                    ids.push(last_id);
                    since.push(ts);
                }
            }
        }
        ColumnIdentity { ids, since, last_id }
    }

    fn check(&self, table: &str, columns: usize) -> Result<()> {
        let bad = |m: String| Err(Error::invariant(format!("{table}: {m}")));
        if self.ids.len() != columns || self.since.len() != columns {
            return bad(format!("{columns} columns, {} field ids, {} times added", self.ids.len(), self.since.len()));
        }
        let mut seen = std::collections::HashSet::new();
        for &id in &self.ids {
            if id < 1 || id > self.last_id || id >= CREATE_TS_FIELD_ID || !seen.insert(id) {
                return bad(format!("field ids {:?} (last {}) are not distinct ids from 1 up", self.ids, self.last_id));
            }
        }
        Ok(())
    }
}

/// One value of a row, as the change stream delivers it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// Boolean.
    Bool(bool),
    /// Any integer type (Int8…Int64, and Date32 / Timestamp raw values).
    Int(i64),
    /// Float32 / Float64.
    Float(f64),
    /// Decimal128 unscaled value, in the column's scale.
    Decimal(i128),
    /// UTF-8 text.
    Utf8(String),
    /// Bytes.
    Binary(Vec<u8>),
}

impl Value {
    /// True for [`Value::Null`].
    #[inline]
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The same value, floats compared by their bits (`==` has `0.0 ==
    /// -0.0` and `NaN != NaN`): identical values encode identically.
    pub fn is_identical(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Float(a), Value::Float(b)) => a.to_bits() == b.to_bits(),
            _ => self == other,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("NULL"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x}"),
            Value::Decimal(d) => write!(f, "{d}"),
            Value::Utf8(s) => write!(f, "{s:?}"),
            Value::Binary(b) => write!(f, "0x{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>()),
        }
    }
}

/// A row: one value per user column, in schema order.
pub type Row = Vec<Value>;

/// A table: qualified name, user columns and primary key.
#[derive(Debug)]
pub struct TableDef {
    /// Stable id.
    pub id: TableId,
    /// Qualified name, `schema.table`.
    pub name: String,
    /// User columns only (the hidden column is added in files).
    pub schema: SchemaRef,
    /// Indices of the primary-key columns, in key order.
    pub primary_key: Vec<usize>,
    /// Schema of stored files: user columns + `_fovea_create_ts`.
    pub file_schema: SchemaRef,
    /// Per user column: its field id and the transaction that added it.
    columns: ColumnIdentity,
    /// This definition's number, which no other definition made by this
    /// process has (see [`Self::instance`]).
    instance: u64,
    /// Per user column: what its values must be, worked out once from its
    /// field (every row of a replay is checked against them).
    checks: Vec<ColumnCheck>,
}

/// The number the next table definition gets.
static NEXT_INSTANCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl TableDef {
    /// Validates and builds a table definition whose columns all came with
    /// the table, with field ids 1, 2, … in column order.
    pub fn new(id: TableId, name: impl Into<String>, schema: SchemaRef, primary_key: Vec<usize>) -> Result<Arc<Self>> {
        let columns = ColumnIdentity::first(schema.fields().len());
        Self::with_columns(id, name, schema, primary_key, columns)
    }

    /// Validates and builds a table definition whose columns have the
    /// field ids and were added by the transactions `columns` says.
    pub fn with_columns(
        id: TableId,
        name: impl Into<String>,
        schema: SchemaRef,
        primary_key: Vec<usize>,
        columns: ColumnIdentity,
    ) -> Result<Arc<Self>> {
        let name = name.into();
        columns.check(&name, schema.fields().len())?;
        if primary_key.is_empty() {
            return Err(Error::Schema {
                table: name,
                column: String::new(),
                message: "a table needs a primary key (replica identity) to replay updates and deletes".into(),
            });
        }
        for &k in &primary_key {
            if k >= schema.fields().len() {
                return Err(Error::Schema {
                    table: name,
                    column: format!("#{k}"),
                    message: "primary-key column index out of range".into(),
                });
            }
        }
        for f in schema.fields() {
            if f.name() == CREATE_TS_COLUMN {
                return Err(Error::Schema {
                    table: name,
                    column: f.name().clone(),
                    message: "this column name is reserved for fovea's hidden timestamp".into(),
                });
            }
            if !is_supported(f.data_type()) {
                return Err(Error::Schema {
                    table: name,
                    column: f.name().clone(),
                    message: format!("type {} is not supported", f.data_type()),
                });
            }
        }
        // Files carry every column's field id (readers match columns by
        // it, so a column dropped and added again under its name is not
        // the dropped one), the hidden column one of its own.
        let with_id = |f: Field, id: i32| {
            f.with_metadata(std::collections::HashMap::from([(FIELD_ID_KEY.to_owned(), id.to_string())]))
        };
        let mut fields: Vec<Field> =
            schema.fields().iter().zip(&columns.ids).map(|(f, &id)| with_id(f.as_ref().clone(), id)).collect();
        fields.push(with_id(Field::new(CREATE_TS_COLUMN, DataType::Int64, false), CREATE_TS_FIELD_ID));
        let file_schema = Arc::new(Schema::new(fields));
        // Relaxed: the number only has to be unique, and a fetch_add is.
        let instance = NEXT_INSTANCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let checks = schema
            .fields()
            .iter()
            .map(|f| ColumnCheck { kind: CheckKind::of(f.data_type()), nullable: f.is_nullable() })
            .collect();
        Ok(Arc::new(TableDef { id, name, schema, primary_key, file_schema, columns, instance, checks }))
    }

    /// The mirror transaction that added user column `column` to the table
    /// (`Ts::ZERO`: it came with the table). Row versions created before
    /// it read the column as NULL, whatever a file holds under its name: a
    /// column dropped and added again under the same name is a new column
    /// (PostgreSQL shows NULL in the rows that existed when it was added,
    /// not the dropped column's values).
    #[inline]
    pub fn column_since(&self, column: usize) -> Ts {
        self.columns.since.get(column).copied().unwrap_or(Ts::ZERO)
    }

    /// The field id of user column `column`: files written with this
    /// definition carry it as the column's Parquet field id.
    #[inline]
    pub fn column_id(&self, column: usize) -> i32 {
        self.columns.ids.get(column).copied().unwrap_or(0)
    }

    /// Its columns' field ids and the transactions that added them.
    pub fn column_identity(&self) -> &ColumnIdentity {
        &self.columns
    }

    /// Where `stored` (the columns of a file or batch, found as `how`)
    /// holds user column `column`: by field id where it carries field ids
    /// (files written since fovea writes them), else by name.
    pub fn stored_index(&self, stored: &Schema, how: &StoredColumns, column: usize) -> Option<usize> {
        how.index(stored, self.schema.field(column).name(), self.column_id(column))
    }

    /// The identity of this definition: a number no other definition made
    /// by this process has (a table whose columns change gets a new
    /// definition, so a new number). Comparing it tells whether something
    /// read against a definition was read against this one, as comparing
    /// the `Arc`s would, without holding a reference to it.
    #[inline]
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// Whether column `column` can store `v` by its type (nullability
    /// aside): what [`accepts`] tells, from the check worked out when the
    /// definition was made.
    #[inline]
    pub fn column_accepts(&self, column: usize, v: &Value) -> bool {
        v.is_null() || self.checks.get(column).is_some_and(|c| c.kind.fits(v))
    }

    /// The primary-key values of a full row.
    pub fn key_of(&self, row: &[Value]) -> Row {
        self.key_values(row).cloned().collect()
    }

    /// The primary-key values of a full row, in key order, in place.
    #[inline]
    pub fn key_values<'r>(&'r self, row: &'r [Value]) -> impl Iterator<Item = &'r Value> + 'r {
        self.primary_key.iter().map(|&i| &row[i])
    }

    /// Checks arity, nullability and types of a full row.
    pub fn check_row(&self, row: &[Value]) -> Result<()> {
        if row.len() != self.schema.fields().len() {
            return Err(Error::Schema {
                table: self.name.clone(),
                column: String::new(),
                message: format!("row has {} values, the table has {} columns", row.len(), self.schema.fields().len()),
            });
        }
        // The common case in one pass over the precomputed checks; the
        // column at fault is found and told below.
        if self.checks.iter().zip(row).all(|(c, v)| c.admits(v)) {
            return Ok(());
        }
        for (f, v) in self.schema.fields().iter().zip(row) {
            if v.is_null() && !f.is_nullable() {
                return Err(Error::Schema {
                    table: self.name.clone(),
                    column: f.name().clone(),
                    message: "NULL in a NOT NULL column".into(),
                });
            }
            accepts(f.data_type(), v).map_err(|message| Error::Schema {
                table: self.name.clone(),
                column: f.name().clone(),
                message,
            })?;
        }
        Ok(())
    }

    /// Checks that a key has one non-null value per key column.
    pub fn check_key(&self, key: &[Value]) -> Result<()> {
        if key.len() != self.primary_key.len() || key.iter().any(Value::is_null) {
            return Err(Error::Schema {
                table: self.name.clone(),
                column: self
                    .primary_key
                    .iter()
                    .map(|&i| self.schema.field(i).name().as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                message: format!("a key needs {} non-NULL values, got {}", self.primary_key.len(), render_key(key)),
            });
        }
        Ok(())
    }
}

/// Renders a key for error messages: `(1, "a")`.
pub fn render_key(key: &[Value]) -> String {
    format!("({})", key.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", "))
}

/// Column types fovea stores.
pub fn is_supported(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Boolean
            | DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Float32
            | DataType::Float64
            | DataType::Decimal128(_, _)
            | DataType::Utf8
            | DataType::Binary
            | DataType::Date32
            | DataType::Timestamp(TimeUnit::Microsecond, _)
    )
}

/// What a column whose stored type is `current` needs when its source
/// declares `declared` instead (after `ALTER COLUMN … TYPE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeChange {
    /// The same type.
    None,
    /// The column is widened in place: every stored value converts exactly
    /// into `declared` (Iceberg's promotions — int → bigint, float → double,
    /// a decimal's precision raised — plus date → timestamp and
    /// integer/decimal → text); files written before are read through that
    /// cast.
    Widen,
    /// Stored values cannot all be converted exactly (bigint → int,
    /// text → int, …): the table's rows must be copied again from the
    /// source in the new type.
    Recopy,
}

impl TypeChange {
    /// Classifies a change of a column from `current` to `declared`;
    /// `key`: the column is in the primary key, whose encoded values must
    /// not change (date → timestamp or a decimal's scale would).
    pub fn of(current: &DataType, declared: &DataType, key: bool) -> TypeChange {
        if current == declared {
            TypeChange::None
        } else if exact_into(current, declared, !key) {
            TypeChange::Widen
        } else {
            TypeChange::Recopy
        }
    }
}

/// Whether every value of `from` converts exactly into `to` with Arrow's
/// cast (and reads as PostgreSQL would show it after the same `ALTER`).
/// `rescale`: changes of a value's encoding (a decimal's scale, days →
/// microseconds) are allowed.
fn exact_into(from: &DataType, to: &DataType, rescale: bool) -> bool {
    use DataType::*;
    fn int_width(t: &DataType) -> Option<u8> {
        match t {
            Int8 => Some(1),
            Int16 => Some(2),
            Int32 => Some(4),
            Int64 => Some(8),
            _ => None,
        }
    }
    match (from, to) {
        (a, b) if a == b => true,
        (a, b) if int_width(a).is_some() && int_width(b).is_some() => int_width(a) <= int_width(b),
        (Float32, Float64) => true,
        (Decimal128(p1, s1), Decimal128(p2, s2)) => {
            // Integer digits kept, fraction digits kept; another scale
            // changes the unscaled values.
            (s1 == s2 || rescale) && s2 >= s1 && i16::from(*p2) - i16::from(*s2) >= i16::from(*p1) - i16::from(*s1)
        }
        (Date32, Timestamp(TimeUnit::Microsecond, None)) => rescale,
        // Integers and decimals print as PostgreSQL prints them; other
        // types' text (timestamps, floats) differs.
        (Int8 | Int16 | Int32 | Int64 | Decimal128(_, _), Utf8) => rescale,
        _ => false,
    }
}

/// What a column's values must be: [`accepts`] for its type, and not
/// NULL unless it is nullable.
#[derive(Clone, Copy, Debug)]
struct ColumnCheck {
    kind: CheckKind,
    nullable: bool,
}

impl ColumnCheck {
    /// Whether the column can store `v`.
    #[inline]
    fn admits(self, v: &Value) -> bool {
        if v.is_null() { self.nullable } else { self.kind.fits(v) }
    }
}

/// The non-null values a column type takes: the rules [`accepts`] and the
/// per-column checks of a [`TableDef`] both apply.
#[derive(Clone, Copy, Debug)]
enum CheckKind {
    Bool,
    /// Integers from `lo` to `hi` (Int8…Int32, Date32).
    Int {
        lo: i64,
        hi: i64,
    },
    /// Any integer (Int64, timestamps).
    AnyInt,
    /// Floats and integers.
    Float,
    /// Decimals below `max` in magnitude (10 to the precision).
    Decimal {
        max: u128,
    },
    Utf8,
    /// Bytes and text.
    Binary,
    /// No non-null value (a type fovea does not store).
    Nothing,
}

impl CheckKind {
    fn of(t: &DataType) -> CheckKind {
        match t {
            DataType::Boolean => CheckKind::Bool,
            DataType::Int8 => CheckKind::Int { lo: i8::MIN.into(), hi: i8::MAX.into() },
            DataType::Int16 => CheckKind::Int { lo: i16::MIN.into(), hi: i16::MAX.into() },
            DataType::Int32 | DataType::Date32 => CheckKind::Int { lo: i32::MIN.into(), hi: i32::MAX.into() },
            DataType::Int64 | DataType::Timestamp(_, _) => CheckKind::AnyInt,
            DataType::Float32 | DataType::Float64 => CheckKind::Float,
            DataType::Decimal128(p, _) => {
                CheckKind::Decimal { max: 10u128.checked_pow(u32::from(*p)).unwrap_or(u128::MAX) }
            }
            DataType::Utf8 => CheckKind::Utf8,
            DataType::Binary => CheckKind::Binary,
            _ => CheckKind::Nothing,
        }
    }

    /// Whether a column of this kind stores non-null `v`.
    #[inline]
    fn fits(self, v: &Value) -> bool {
        match (self, v) {
            (CheckKind::Bool, Value::Bool(_))
            | (CheckKind::AnyInt, Value::Int(_))
            | (CheckKind::Float, Value::Float(_) | Value::Int(_))
            | (CheckKind::Utf8, Value::Utf8(_))
            | (CheckKind::Binary, Value::Binary(_) | Value::Utf8(_)) => true,
            (CheckKind::Int { lo, hi }, Value::Int(i)) => lo <= *i && *i <= hi,
            (CheckKind::Decimal { max }, Value::Decimal(d)) => d.unsigned_abs() < max,
            _ => false,
        }
    }
}

/// Whether `v` can be stored in a column of type `t`.
pub fn accepts(t: &DataType, v: &Value) -> std::result::Result<(), String> {
    let kind = CheckKind::of(t);
    if v.is_null() || kind.fits(v) {
        return Ok(());
    }
    Err(match (kind, v, t) {
        (CheckKind::Int { lo, hi }, Value::Int(i), _) => format!("{i} is out of range [{lo}, {hi}]"),
        (CheckKind::Decimal { .. }, Value::Decimal(d), DataType::Decimal128(p, _)) => {
            format!("{d} does not fit precision {p}")
        }
        _ => format!("value {v} does not fit type {t}"),
    })
}

/// Converts the rows of a batch back to [`Value`]s (one [`Row`] per row,
/// one value per column of the batch).
pub fn rows_from_batch(batch: &arrow::record_batch::RecordBatch) -> Result<Vec<Row>> {
    use arrow::array::*;
    use arrow::datatypes::*;
    let n = batch.num_rows();
    let mut rows: Vec<Row> = (0..n).map(|_| Vec::with_capacity(batch.num_columns())).collect();
    for (field, col) in batch.schema().fields().iter().zip(batch.columns()) {
        macro_rules! push {
            ($ty:ty, $conv:expr) => {{
                let a = col
                    .as_any()
                    .downcast_ref::<$ty>()
                    .ok_or_else(|| Error::invariant(format!("column {} is not of its declared type", field.name())))?;
                for (i, row) in rows.iter_mut().enumerate() {
                    row.push(if a.is_null(i) { Value::Null } else { $conv(a.value(i)) });
                }
            }};
        }
        match field.data_type() {
            DataType::Boolean => push!(BooleanArray, Value::Bool),
            DataType::Int8 => push!(Int8Array, |v: i8| Value::Int(v.into())),
            DataType::Int16 => push!(Int16Array, |v: i16| Value::Int(v.into())),
            DataType::Int32 => push!(Int32Array, |v: i32| Value::Int(v.into())),
            DataType::Int64 => push!(Int64Array, Value::Int),
            DataType::Float32 => push!(Float32Array, |v: f32| Value::Float(v.into())),
            DataType::Float64 => push!(Float64Array, Value::Float),
            DataType::Decimal128(_, _) => push!(Decimal128Array, Value::Decimal),
            DataType::Utf8 => push!(StringArray, |v: &str| Value::Utf8(v.to_owned())),
            DataType::Binary => push!(BinaryArray, |v: &[u8]| Value::Binary(v.to_vec())),
            DataType::Date32 => push!(Date32Array, |v: i32| Value::Int(v.into())),
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                push!(TimestampMicrosecondArray, Value::Int)
            }
            other => {
                return Err(Error::Schema {
                    table: String::new(),
                    column: field.name().clone(),
                    message: format!("type {other} is not supported"),
                });
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_definition_has_its_own_number() {
        let schema = || Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let a = TableDef::new(TableId(1), "s.t", schema(), vec![0]).unwrap();
        // The same table, the same columns: another definition all the same.
        let b = TableDef::new(TableId(1), "s.t", schema(), vec![0]).unwrap();
        assert_ne!(a.instance(), b.instance());
        assert_eq!(Arc::clone(&a).instance(), a.instance());
    }

    #[test]
    fn type_changes_widen_only_where_every_value_converts_exactly() {
        use DataType::*;
        let ts = Timestamp(TimeUnit::Microsecond, None);
        let tz = Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let cases = [
            (Int32, Int32, false, TypeChange::None),
            (Int32, Int64, true, TypeChange::Widen),
            (Int16, Int32, true, TypeChange::Widen),
            (Int64, Int32, false, TypeChange::Recopy),
            (Float32, Float64, false, TypeChange::Widen),
            (Float64, Float32, false, TypeChange::Recopy),
            (Decimal128(10, 2), Decimal128(14, 2), true, TypeChange::Widen),
            (Decimal128(10, 2), Decimal128(14, 4), false, TypeChange::Widen),
            // A key's encoded values would change with the scale.
            (Decimal128(10, 2), Decimal128(14, 4), true, TypeChange::Recopy),
            // Fewer integer digits.
            (Decimal128(10, 2), Decimal128(10, 4), false, TypeChange::Recopy),
            (Decimal128(14, 2), Decimal128(10, 2), false, TypeChange::Recopy),
            (Date32, ts.clone(), false, TypeChange::Widen),
            (Date32, ts.clone(), true, TypeChange::Recopy),
            (Date32, tz, false, TypeChange::Recopy),
            (ts, Date32, false, TypeChange::Recopy),
            (Int32, Utf8, false, TypeChange::Widen),
            (Decimal128(10, 2), Utf8, false, TypeChange::Widen),
            (Float64, Utf8, false, TypeChange::Recopy),
            (Utf8, Int32, false, TypeChange::Recopy),
            (Boolean, Int32, false, TypeChange::Recopy),
        ];
        for (from, to, key, expected) in cases {
            assert_eq!(TypeChange::of(&from, &to, key), expected, "{from} -> {to} (key: {key})");
        }
    }
}

/// Column types: every one fovea stores, every decimal precision, and
/// some types it does not store (for tests, here and in `fovea-cdc`, which
/// turns on the `test-support` feature).
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
pub fn column_types_for_tests() -> Vec<DataType> {
    let mut types = vec![
        DataType::Boolean,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Float32,
        DataType::Float64,
        DataType::Utf8,
        DataType::Binary,
        DataType::Date32,
        DataType::Timestamp(TimeUnit::Microsecond, None),
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        DataType::Timestamp(TimeUnit::Nanosecond, None),
        DataType::Float16,
        DataType::LargeUtf8,
    ];
    types.extend((1u8..=38).map(|p| DataType::Decimal128(p, (p as i8).min(4))));
    types
}

#[cfg(test)]
mod column_check_tests {
    use super::*;
    use proptest::prelude::*;

    /// Values at and around the types' bounds, and one of each kind.
    fn edge_values() -> Vec<Value> {
        let ints = [i8::MIN.into(), i8::MAX.into(), i16::MIN.into(), i16::MAX.into()]
            .into_iter()
            .chain([i32::MIN.into(), i32::MAX.into(), i64::MIN, i64::MAX, 0])
            .flat_map(|b: i64| [b.saturating_sub(1), b, b.saturating_add(1)])
            .map(Value::Int);
        let decimals = (0..=38u32)
            .map(|p| 10i128.pow(p))
            .flat_map(|x| [x - 1, x, x + 1, 1 - x, -x, -x - 1])
            .chain([i128::MIN, i128::MAX])
            .map(Value::Decimal);
        let others = [
            Value::Null,
            Value::Bool(true),
            Value::Float(0.5),
            Value::Float(f64::NAN),
            Value::Utf8("x".into()),
            Value::Binary(vec![1]),
        ];
        ints.chain(decimals).chain(others).collect()
    }

    /// What a column of type `t` takes, matched on the type per value (as
    /// `accepts` was written before the rules became [`CheckKind`]): the
    /// oracle the rules are checked against, messages included.
    fn accepts_by_type(t: &DataType, v: &Value) -> std::result::Result<(), String> {
        fn int_range(i: i64, lo: i64, hi: i64) -> std::result::Result<(), String> {
            if i < lo || i > hi { Err(format!("{i} is out of range [{lo}, {hi}]")) } else { Ok(()) }
        }
        match (t, v) {
            (_, Value::Null) => Ok(()),
            (DataType::Boolean, Value::Bool(_)) => Ok(()),
            (DataType::Int8, Value::Int(i)) => int_range(*i, i8::MIN.into(), i8::MAX.into()),
            (DataType::Int16, Value::Int(i)) => int_range(*i, i16::MIN.into(), i16::MAX.into()),
            (DataType::Int32 | DataType::Date32, Value::Int(i)) => int_range(*i, i32::MIN.into(), i32::MAX.into()),
            (DataType::Int64 | DataType::Timestamp(_, _), Value::Int(_)) => Ok(()),
            (DataType::Float32 | DataType::Float64, Value::Float(_) | Value::Int(_)) => Ok(()),
            (DataType::Decimal128(p, _), Value::Decimal(d)) => {
                let max = 10u128.checked_pow(u32::from(*p)).unwrap_or(u128::MAX);
                if d.unsigned_abs() >= max { Err(format!("{d} does not fit precision {p}")) } else { Ok(()) }
            }
            (DataType::Utf8, Value::Utf8(_)) | (DataType::Binary, Value::Binary(_) | Value::Utf8(_)) => Ok(()),
            (t, v) => Err(format!("value {v} does not fit type {t}")),
        }
    }

    /// Whether the rules decide `v` in a column of type `t` (nullable or
    /// not) as the oracle and nullability do, in every form they are used.
    fn check_agrees(t: &DataType, nullable: bool, v: &Value) -> std::result::Result<(), TestCaseError> {
        let expected = accepts_by_type(t, v);
        prop_assert_eq!(&accepts(t, v), &expected, "{} {:?}", t, v);
        let by_type = expected.is_ok();
        let admitted = by_type && (nullable || !v.is_null());
        prop_assert_eq!(CheckKind::of(t).fits(v) || v.is_null(), by_type, "{} {:?}", t, v);
        prop_assert_eq!(ColumnCheck { kind: CheckKind::of(t), nullable }.admits(v), admitted, "{} {:?}", t, v);
        if is_supported(t) {
            let schema = Arc::new(Schema::new(vec![
                Field::new("k", DataType::Int64, false),
                Field::new("c", t.clone(), nullable),
            ]));
            let def = TableDef::new(TableId(1), "s.t", schema, vec![0]).unwrap();
            prop_assert_eq!(def.column_accepts(1, v), by_type, "{} {:?}", t, v);
            match def.check_row(&[Value::Int(1), v.clone()]) {
                Ok(()) => prop_assert!(admitted, "{} {:?} passed", t, v),
                Err(Error::Schema { column, .. }) => {
                    prop_assert!(!admitted, "{} {:?} refused", t, v);
                    prop_assert_eq!(column, "c");
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
        Ok(())
    }

    /// Every type against every edge value.
    #[test]
    fn column_checks_decide_edge_values_as_accepts() {
        for t in column_types_for_tests() {
            for v in edge_values() {
                for nullable in [false, true] {
                    check_agrees(&t, nullable, &v).unwrap();
                }
            }
        }
    }

    proptest! {
        /// Every type against any value.
        #[test]
        fn column_checks_decide_as_accepts(
            t in proptest::sample::select(column_types_for_tests()),
            nullable in any::<bool>(),
            v in prop_oneof![
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::Int),
                any::<f64>().prop_map(Value::Float),
                any::<i128>().prop_map(Value::Decimal),
                ".{0,4}".prop_map(Value::Utf8),
                proptest::collection::vec(any::<u8>(), 0..4).prop_map(Value::Binary),
            ],
        ) {
            check_agrees(&t, nullable, &v)?;
        }
    }
}
