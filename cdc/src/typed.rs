//! Typed decoding: a row image straight into a table's typed values.
//!
//! The general path decodes an image to `(name, JSON value)` pairs, and the
//! sink then checks them against its table (columns added, gone or
//! widened) and converts each value. Most records of a stream change
//! nothing about their table, so a decoder thread that knows the table's
//! current definition does that work beside the sink: it reads the image's
//! values into [`Value`]s in column order without building a JSON tree or
//! a `String` per column name, and hands the sink a [`TypedRow`] it only has
//! to route.
//!
//! ```text
//!  decoder thread: line ─▶ table, op ─▶ definition D (its cache of TableDefs)
//!                          ─▶ images read against D ─▶ TypedRow { table, definition: D's number, key, row, line }
//!  sink:           table's definition is still D?  yes ─▶ Op from key, row
//!                                                  no  ─▶ decode `line` again, general path
//! ```
//!
//! A Kafka record names its table (in `source`) after its images, so the
//! images would be read twice: skipped in the record's pass, then read
//! against the table. A decoder remembers the table each Kafka topic's
//! last record changed ([`TypedTables::learn`]); the next record of the
//! topic reads its after image straight into that table's row in its one
//! pass, and `source` confirms the guess. Where it does not (the topic
//! carries several tables) or the image does not read as a typed row,
//! the record is read again without a guess.
//!
//! **Contract.** A typed row is made only where the general path would
//! make exactly the same operation: the after image names every column of
//! `def` once and nothing else, every value converts to its column's type
//! and fits it ([`to_value`], [`fovea_types::schema::accepts`]), and no value is Debezium's
//! unchanged-TOAST marker; every primary-key column has a non-null value in
//! the key, before or after image (the first such, as the general path
//! takes it). Anything else (an unknown column, a value of another type,
//! malformed input) makes no typed row, and the general path decides,
//! with its errors. The sink uses a typed row only while `def` is still
//! its table's definition, by identity ([`TableDef::instance`]: every
//! definition has its own number), so a record decoded before a schema
//! change that an earlier record made is decoded again.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, TimeUnit};
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;
use serde_json::value::RawValue;
use smallvec::SmallVec;

use super::RowOp;
use super::debezium::UNAVAILABLE;
use super::types::{date_from_days, parse_date, parse_decimal, parse_timestamp, timestamp_from_micros, to_value};
use fovea_types::schema::{Row, TableDef, Value};

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The current definitions of a replica's tables, as the writer sees them.
///
/// Implemented by [`crate::Engine`]. `generation` changes (grows) whenever
/// a table is created or its definition changes; a decoder keeps the
/// definitions it looked up until it does.
pub trait CurrentTables: Send + Sync {
    /// A number that grows with every table created or changed. Read with
    /// Acquire: a definition looked up after it is at least that new.
    fn generation(&self) -> u64;
    /// The newest definition of `name`, if the table exists.
    fn current(&self, name: &str) -> Option<Arc<TableDef>>;
}

/// A row decoded against a table definition (see the module docs).
#[derive(Clone, Debug)]
pub struct TypedRow {
    /// The table.
    pub table: fovea_types::ids::TableId,
    /// The number of the definition the values were read against
    /// ([`TableDef::instance`]; no reference to it is held, so decoder
    /// threads share no reference count with the sink per row).
    pub definition: u64,
    /// Primary-key values in key order: of deletes, and of updates that
    /// change the key (the old key). Empty for inserts, and for updates
    /// that keep their key, whose key is the row's (the sink takes it
    /// there).
    pub key: Row,
    /// Every column's value in table order (inserts and updates; empty
    /// for deletes).
    pub row: Row,
    /// The record's input line, to decode again on the general path if
    /// the definition is no longer the table's when the record is applied.
    pub line: super::SharedLine,
}

/// A table's definition with its columns indexed by name: what typed
/// decoding and the sink look columns up in.
pub struct TableShape {
    /// The table's definition.
    pub def: Arc<TableDef>,
    index_of: FastMap<String, usize>,
    /// Per column: its position in the primary key, if it is a key column.
    key_position: Vec<Option<usize>>,
    /// The hidden row id of a table without a primary key, which no image
    /// names: the sink gives it (see [`super::hidden_rowid`]).
    hidden: Option<usize>,
}

impl TableShape {
    /// The shape of `def`.
    pub fn new(def: Arc<TableDef>) -> TableShape {
        let fields = def.schema.fields();
        let index_of = fields.iter().enumerate().map(|(i, f)| (f.name().clone(), i)).collect();
        let mut key_position = vec![None; fields.len()];
        for (k, &i) in def.primary_key.iter().enumerate() {
            key_position[i] = Some(k);
        }
        let hidden = super::hidden_rowid(&def);
        TableShape { def, index_of, key_position, hidden }
    }

    /// Index of column `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.index_of.get(name).copied()
    }

    /// Index of column `name`, the `hint`-th of its image: images usually
    /// list columns in table order, which needs no hashing.
    #[inline]
    pub fn column(&self, hint: usize, name: &str) -> Option<usize> {
        if self.def.schema.fields().get(hint).is_some_and(|f| f.name() == name) {
            return Some(hint);
        }
        self.index_of(name)
    }

    /// The typed row of a record with these images (raw JSON, as the
    /// record's one pass found them), or `None` where the general path must
    /// decide (see the module's contract). The images are read straight
    /// into the row: no column list is built.
    pub fn decode(
        &self,
        op: RowOp,
        key: Option<&RawValue>,
        before: Option<&RawValue>,
        after: Option<&RawValue>,
    ) -> Option<(Row, Row)> {
        let row = match op {
            RowOp::Delete => None,
            _ => Some(read_image(after?, FullImage { shape: self })?),
        };
        self.decode_read(op, key, before, row)
    }

    /// [`Self::decode`] of a record whose after image is read already
    /// (`row`: `None` where there is none, or it was `null`).
    pub fn decode_read(
        &self,
        op: RowOp,
        key: Option<&RawValue>,
        before: Option<&RawValue>,
        row: Option<Row>,
    ) -> Option<(Row, Row)> {
        // A key that is no object is an error on the general path, even
        // where the key is not needed.
        if key.is_some_and(|k| !k.get().starts_with('{')) {
            return None;
        }
        let row = match op {
            RowOp::Delete => Vec::new(),
            _ => row?,
        };
        if op == RowOp::Insert || op == RowOp::SnapshotRead {
            return Some((Vec::new(), row));
        }
        let mut found: SmallVec<[Option<Value>; 2]> = smallvec::smallvec![None; self.def.primary_key.len()];
        for image in [key, before].into_iter().flatten() {
            read_image(image, KeyColumns { shape: self, found: &mut found })?;
        }
        for (k, slot) in found.iter_mut().enumerate() {
            if slot.is_none() {
                // Only the after image is left: take the key there.
                let v = row.get(self.def.primary_key[k]).filter(|v| !v.is_null())?;
                *slot = Some(v.clone());
            }
        }
        // An update that keeps its key carries none: the sink takes it
        // from the row, so no list is made here to be freed on its thread.
        if op == RowOp::Update
            && found
                .iter()
                .zip(&self.def.primary_key)
                .all(|(v, &i)| v.as_ref().zip(row.get(i)).is_some_and(|(v, r)| v.is_identical(r)))
        {
            return Some((Vec::new(), row));
        }
        Some((found.into_iter().flatten().collect(), row))
    }
}

/// Reads a raw image with `visitor` (a JSON object, all of it); `None`
/// where it does not read as a typed row.
fn read_image<'de, V: Visitor<'de>>(raw: &'de RawValue, visitor: V) -> Option<V::Value> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let out = serde::Deserializer::deserialize_map(&mut de, visitor).ok()?;
    de.end().ok()?;
    Some(out)
}

/// A string borrowed from the line when it has no escapes (serde's own
/// `Cow<str>` always copies).
pub(crate) struct BorrowedStr<'a>(pub(crate) Cow<'a, str>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for BorrowedStr<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Text;
        impl<'de> serde::de::Visitor<'de> for Text {
            type Value = BorrowedStr<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> std::result::Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> std::result::Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> std::result::Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Owned(s)))
            }
        }
        d.deserialize_str(Text)
    }
}

/// Not a typed row: the general path decides (never shown to a user).
const UNTYPED: &str = "not a typed row";

/// An after image naming every column of the table once: the row.
struct FullImage<'s> {
    shape: &'s TableShape,
}

impl<'de> Visitor<'de> for FullImage<'_> {
    type Value = Row;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object of columns")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Row, A::Error> {
        let fields = self.shape.def.schema.fields();
        let mut row = vec![Value::Null; fields.len()];
        // The columns named so far: each must be named once.
        let mut named: SmallVec<[u64; 2]> = smallvec::smallvec![0; fields.len().div_ceil(64)];
        let mut hint = 0;
        while let Some(name) = m.next_key::<BorrowedStr<'de>>()?.map(|s| s.0) {
            let value: Scalar<'de> = m.next_value()?;
            let i = self.shape.column(hint, &name).ok_or_else(|| A::Error::custom(UNTYPED))?;
            let (word, bit) = (i / 64, 1u64 << (i % 64));
            if named[word] & bit != 0 {
                return Err(A::Error::custom(UNTYPED));
            }
            named[word] |= bit;
            let t = fields[i].data_type();
            row[i] = value
                .to_value(t)
                .filter(|v| self.shape.def.column_accepts(i, v))
                .ok_or_else(|| A::Error::custom(UNTYPED))?;
            hint += 1;
        }
        // Every column is named, but a hidden row id (left NULL here).
        let unnamed_hidden = |i: usize| hint + 1 == fields.len() && named[i / 64] & (1u64 << (i % 64)) == 0;
        if hint != fields.len() && !self.shape.hidden.is_some_and(unnamed_hidden) {
            return Err(A::Error::custom(UNTYPED));
        }
        Ok(row)
    }
}

/// Reads an after image straight into a row of the shape's table, in the
/// record's one pass (`null`: no row). An image that does not read as a
/// typed row fails the pass: the caller reads the record again without it.
pub(crate) struct AfterImageSeed<'s>(pub(crate) &'s TableShape);

impl<'de> serde::de::DeserializeSeed<'de> for AfterImageSeed<'_> {
    type Value = Option<Row>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<Row>, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for AfterImageSeed<'_> {
    type Value = Option<Row>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object of columns or null")
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Option<Row>, E> {
        Ok(None)
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Option<Row>, E> {
        Ok(None)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<Row>, D::Error> {
        d.deserialize_map(FullImage { shape: self.0 }).map(Some)
    }
}

/// The primary-key columns of a key or before image, into `found` (key
/// order) where a column there has no value yet; other columns are
/// skipped without being read into values.
struct KeyColumns<'s, 'f> {
    shape: &'s TableShape,
    found: &'f mut [Option<Value>],
}

impl<'de> Visitor<'de> for KeyColumns<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object of columns")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<(), A::Error> {
        let fields = self.shape.def.schema.fields();
        let mut hint = 0;
        while let Some(name) = m.next_key::<BorrowedStr<'de>>()?.map(|s| s.0) {
            let key = self.shape.column(hint, &name).and_then(|i| Some((i, self.shape.key_position[i]?)));
            hint += 1;
            match key {
                Some((i, k)) if self.found[k].is_none() => match m.next_value::<Scalar<'de>>()? {
                    Scalar::Null => {}
                    // A key of another type: the general path's to refuse.
                    value => {
                        let v = value.to_value(fields[i].data_type()).ok_or_else(|| A::Error::custom(UNTYPED))?;
                        self.found[k] = Some(v);
                    }
                },
                _ => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// A row image as the record's one pass reads it: its columns in order,
/// names and values borrowed from the line where they have no escapes.
/// Typed decoding reads it against a table; otherwise it becomes
/// [`super::Columns`], as if the image had been parsed into JSON.
pub(crate) struct Image<'de>(pub(crate) Vec<(Cow<'de, str>, Scalar<'de>)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Image<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Image<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object of columns")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Image<'de>, A::Error> {
                let mut columns = Vec::with_capacity(m.size_hint().unwrap_or(16));
                while let Some(entry) = m.next_entry::<Cow<'de, str>, Scalar<'de>>()? {
                    columns.push(entry);
                }
                Ok(Image(columns))
            }
        }
        d.deserialize_map(V)
    }
}

impl Image<'_> {
    /// The columns with JSON values: what parsing the image into JSON gives.
    pub(crate) fn into_columns(self) -> super::Columns {
        self.0.into_iter().map(|(name, value)| (name.into_owned(), value.into_json())).collect()
    }
}

/// One JSON value of an image: a scalar, borrowed from the input where it
/// has no escapes, or an object or array as JSON.
pub(crate) enum Scalar<'de> {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    Str(Cow<'de, str>),
    /// An object or an array (typed decoding leaves those to the general path).
    Nested(Json),
}

impl<'de> serde::Deserialize<'de> for Scalar<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON scalar")
            }
            fn visit_unit<E>(self) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Number(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Number(n.into()))
            }
            fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Scalar<'de>, E> {
                serde_json::Number::from_f64(n).map(Scalar::Number).ok_or_else(|| E::custom("not a finite number"))
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Str(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Str(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Str(Cow::Owned(s)))
            }
            // serde_json's own visitor, as parsing into JSON would build them.
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Scalar<'de>, A::Error> {
                serde::Deserialize::deserialize(MapAccessDeserializer::new(m)).map(Scalar::Nested)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, s: A) -> Result<Scalar<'de>, A::Error> {
                serde::Deserialize::deserialize(SeqAccessDeserializer::new(s)).map(Scalar::Nested)
            }
        }
        d.deserialize_any(V)
    }
}

impl Scalar<'_> {
    /// The value of type `t`, exactly as [`to_value`] converts the same
    /// JSON; `None` where it does not convert, and for the unchanged-TOAST
    /// marker, objects and arrays.
    fn to_value(&self, t: &DataType) -> Option<Value> {
        match (self, t) {
            (Scalar::Str(s), _) if s == UNAVAILABLE => None,
            (Scalar::Str(s), DataType::Utf8) => Some(Value::Utf8(s.to_string())),
            (Scalar::Null, _) => Some(Value::Null),
            // The common cases without building JSON: what `to_value` does
            // with a number for an integer column, and with text for a
            // decimal, a timestamp or a date (the rest goes through it).
            (Scalar::Number(n), DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64) => {
                n.as_i64().map(Value::Int)
            }
            (Scalar::Number(n), DataType::Date32) => n.as_i64().map(|days| Value::Int(date_from_days(days))),
            (Scalar::Number(n), DataType::Timestamp(TimeUnit::Microsecond, _)) => {
                n.as_i64().map(|us| Value::Int(timestamp_from_micros(us)))
            }
            (Scalar::Str(s), DataType::Decimal128(_, scale)) => parse_decimal(s, *scale).ok().map(Value::Decimal),
            (Scalar::Str(s), DataType::Timestamp(TimeUnit::Microsecond, _)) => parse_timestamp(s).map(Value::Int),
            (Scalar::Str(s), DataType::Date32) => parse_date(s).map(|d| Value::Int(d.into())),
            (Scalar::Bool(b), _) => to_value(&Json::Bool(*b), t).ok(),
            (Scalar::Number(n), _) => to_value(&Json::Number(n.clone()), t).ok(),
            (Scalar::Str(s), _) => to_value(&Json::String(s.to_string()), t).ok(),
            (Scalar::Nested(_), _) => None,
        }
    }

    /// The JSON value it was read from.
    fn into_json(self) -> Json {
        match self {
            Scalar::Null => Json::Null,
            Scalar::Bool(b) => Json::Bool(b),
            Scalar::Number(n) => Json::Number(n),
            Scalar::Str(s) => Json::String(s.into_owned()),
            Scalar::Nested(j) => j,
        }
    }
}

/// A decoder's view of the current table definitions: looked up once and
/// kept until [`CurrentTables::generation`] moves.
pub struct TypedTables {
    source: Arc<dyn CurrentTables>,
    generation: u64,
    /// Per Kafka topic: the table its records were last seen to change,
    /// so that a record's after image can be read into that table's row
    /// in the record's one pass (the table itself comes after the images,
    /// in `source`, and confirms the guess).
    topics: FastMap<String, TopicTable>,
    shapes: Shapes,
}

impl TypedTables {
    /// A view of `source`'s tables.
    pub fn new(source: Arc<dyn CurrentTables>) -> TypedTables {
        TypedTables { source, generation: u64::MAX, topics: FastMap::default(), shapes: Default::default() }
    }

    /// The shape of table `name`, if it exists. Borrowed: the shapes are
    /// this decoder's own, so no reference count shared with other
    /// threads changes per record.
    pub(crate) fn shape(&mut self, name: &str) -> Option<&TableShape> {
        let TypedTables { source, generation, shapes, .. } = self;
        shape_of(source, generation, shapes, name)
    }
}

/// [`TypedTables::shape`], of its parts (so that a topic's entry can name
/// the table while its shape is looked up).
fn shape_of<'t>(
    source: &Arc<dyn CurrentTables>,
    seen: &mut u64,
    shapes: &'t mut Shapes,
    name: &str,
) -> Option<&'t TableShape> {
    let generation = source.generation();
    if generation != *seen {
        shapes.clear();
        *seen = generation;
    }
    shapes.entry_ref(name).or_insert_with(|| source.current(name).map(TableShape::new)).as_ref()
}

/// A decoder's table shapes by name (hashbrown's: its `entry_ref` looks a
/// name up once, allocating only to insert).
type Shapes = hashbrown::HashMap<String, Option<TableShape>, foldhash::fast::RandomState>;

/// What a decoder knows of a Kafka topic's records.
struct TopicTable {
    /// The table the last record of the topic changed.
    table: String,
    /// Records of the topic still to be read without a guess, after a
    /// guess failed (an image the typed path does not read, such as one
    /// with an unchanged-TOAST marker, fails the pass it is read in):
    /// such records cost a pass more only once in a while.
    wait: u32,
}

/// Records of a topic read without a guess after one failed.
const GUESS_WAIT: u32 = 256;

/// Topics a decoder remembers (a stream has about one per table).
const MAX_TOPICS: usize = 4096;

impl TypedTables {
    /// The shape of the table that records of Kafka topic `topic` change,
    /// going by the last one seen, if its after image may be read against
    /// it in the record's pass.
    pub(crate) fn guess(&mut self, topic: &str) -> Option<&TableShape> {
        let known = self.topics.get_mut(topic)?;
        if known.wait > 0 {
            known.wait -= 1;
            return None;
        }
        let TypedTables { source, generation, shapes, .. } = self;
        shape_of(source, generation, shapes, &known.table)
    }

    /// Records that the record of Kafka topic `topic` just read changes
    /// table `table`.
    pub(crate) fn learn(&mut self, topic: &str, table: &str) {
        if let Some(known) = self.topics.get_mut(topic) {
            if known.table != table {
                known.table.clear();
                known.table.push_str(table);
            }
        } else if self.topics.len() < MAX_TOPICS {
            self.topics.insert(topic.to_owned(), TopicTable { table: table.to_owned(), wait: 0 });
        }
    }

    /// Records that reading a record of Kafka topic `topic` with its guess
    /// failed: the next [`GUESS_WAIT`] records of the topic are read
    /// without one.
    pub(crate) fn guess_failed(&mut self, topic: &str) {
        if let Some(known) = self.topics.get_mut(topic) {
            known.wait = GUESS_WAIT;
        }
    }
}

impl std::fmt::Debug for TypedTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TypedTables").field("generation", &self.generation).field("tables", &self.shapes.len()).finish()
    }
}

/// The definition a typed row was read against, for the sink's check.
impl TypedRow {
    /// Whether `current` is the definition this row was read against.
    pub fn is_for(&self, current: &TableDef) -> bool {
        self.definition == current.instance()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tables `s.t` and `s.u`, unchanging.
    struct Two(Vec<Arc<TableDef>>);

    impl CurrentTables for Two {
        fn generation(&self) -> u64 {
            1
        }
        fn current(&self, name: &str) -> Option<Arc<TableDef>> {
            self.0.iter().find(|d| d.name == name).cloned()
        }
    }

    /// A topic guesses the table its last record changed; after a failed
    /// guess, the topic's next records are read without one for a while.
    #[test]
    fn a_topic_guesses_the_table_of_its_last_record() {
        use arrow::datatypes::{Field, Schema};
        let def = |id: u32, name: &str| {
            let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
            TableDef::new(fovea_types::ids::TableId(id), name, schema, vec![0]).unwrap()
        };
        let mut tables = TypedTables::new(Arc::new(Two(vec![def(1, "s.t"), def(2, "s.u")])));
        let guessed = |tables: &mut TypedTables, topic: &str| tables.guess(topic).map(|s| s.def.name.clone());
        assert_eq!(guessed(&mut tables, "all"), None, "nothing seen of the topic");
        tables.learn("all", "s.t");
        assert_eq!(guessed(&mut tables, "all").as_deref(), Some("s.t"));
        tables.learn("all", "s.u");
        assert_eq!(guessed(&mut tables, "all").as_deref(), Some("s.u"));
        tables.learn("gone", "s.gone");
        assert_eq!(guessed(&mut tables, "gone"), None, "a table that does not exist");
        tables.guess_failed("all");
        for _ in 0..GUESS_WAIT {
            assert_eq!(guessed(&mut tables, "all"), None);
        }
        assert_eq!(guessed(&mut tables, "all").as_deref(), Some("s.u"));
    }

    /// An image of a table without a key names every column but the
    /// hidden row id, which is left NULL for the sink; any other column
    /// missing, or the row id's key wanted (updates, deletes), leaves the
    /// record to the general path.
    #[test]
    fn a_table_without_a_key_reads_its_images_without_the_row_id() {
        use arrow::datatypes::{Field, Schema};
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
            Field::new(crate::ROWID_COLUMN, DataType::Int64, false),
        ]));
        let def = TableDef::new(fovea_types::ids::TableId(1), "s.h", schema, vec![2]).unwrap();
        let shape = TableShape::new(def);
        let raw = |s: &str| serde_json::value::RawValue::from_string(s.to_owned()).unwrap();
        let (a, b) = (raw(r#"{"a":1,"b":"x"}"#), raw(r#"{"b":"x"}"#));
        for op in [RowOp::Insert, RowOp::SnapshotRead] {
            let (key, row) = shape.decode(op, None, None, Some(&a)).expect("typed");
            assert!(key.is_empty());
            assert_eq!(row, vec![Value::Int(1), Value::Utf8("x".into()), Value::Null]);
            assert!(shape.decode(op, None, None, Some(&b)).is_none(), "a column other than the row id missing");
        }
        assert!(shape.decode(RowOp::Update, None, Some(&a), Some(&a)).is_none());
        assert!(shape.decode(RowOp::Delete, None, Some(&a), None).is_none());
        // A table keyed by a column of its own needs every column named.
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
            Field::new("k", DataType::Int64, false),
        ]));
        let keyed = TableShape::new(TableDef::new(fovea_types::ids::TableId(2), "s.k", schema, vec![2]).unwrap());
        assert!(keyed.decode(RowOp::Insert, None, None, Some(&a)).is_none());
    }

    /// Every scalar read straight into a value converts exactly as
    /// [`to_value`] converts the same JSON (NaN compared as NaN).
    #[test]
    fn scalars_convert_as_json_does() {
        let texts = [
            "null",
            "true",
            "false",
            "0",
            "-7",
            "42",
            "9223372036854775807",
            "18446744073709551615",
            "9223372036825200000",
            "-9223372036832400000",
            "2146033979",
            "-2147472693",
            "-2147472692",
            "1.5",
            "-0.25",
            "1e3",
            r#""""#,
            r#""12.50""#,
            r#""-3""#,
            r#""1e2""#,
            r#""abc""#,
            r#""2026-12-04""#,
            r#""2026-12-04T10:11:12.123456Z""#,
            r#""2026-12-04 10:11:12+02""#,
            r#""t""#,
            r#""NaN""#,
            r#""AAEC""#,
            r#"" 5 ""#,
            r#""\u00e9t\u00e9""#,
        ];
        // Every type fovea stores, every decimal precision, and types it
        // does not store (both sides refuse them alike).
        let types = fovea_types::schema::column_types_for_tests();
        let same = |a: &Option<Value>, b: &Option<Value>| match (a, b) {
            (Some(Value::Float(x)), Some(Value::Float(y))) => x == y || (x.is_nan() && y.is_nan()),
            _ => a == b,
        };
        for text in texts {
            let scalar: Scalar<'_> = serde_json::from_str(text).unwrap();
            let json: Json = serde_json::from_str(text).unwrap();
            for t in &types {
                let (got, want) = (scalar.to_value(t), to_value(&json, t).ok());
                assert!(same(&got, &want), "{text} as {t}: {got:?}, but JSON gives {want:?}");
            }
        }
    }
}
