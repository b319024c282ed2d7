//! Debezium JSON, in every form it is delivered:
//!
//! * Kafka-style records, one per line: `{"topic","key","value"[,"headers"]}`;
//! * bare values: `{"before","after","source","op",…}` and transaction
//!   records `{"status":"BEGIN"|"END",…}`;
//! * each with or without the `{"schema","payload"}` envelope.
//!
//! With a schema, columns get exact types and Debezium's logical encodings
//! are normalised here: `Decimal` bytes (base64 unscaled, scale from the
//! schema) become decimal strings, `Timestamp` (ms) and `NanoTimestamp`
//! become µs (Debezium's numbers for `±infinity` stay as they are, and a
//! timestamp or date column reads them as PostgreSQL's infinities).
//! Transaction ids `"<xid>:<lsn>"` are reduced to the xid, which is stable
//! within a transaction (the lsn part is not).

use arrow::datatypes::{DataType, TimeUnit};
use base64::Engine as _;
use std::borrow::Cow;

use serde_json::Value as Json;
use serde_json::value::RawValue;
use smol_str::ToSmolStr as _;

use super::typed::{AfterImageSeed, BorrowedStr, Image, Scalar, TableShape, TypedRow, TypedTables};
use super::types::{DEBEZIUM_TIMESTAMP_INFINITY, DEBEZIUM_TIMESTAMP_NEGATIVE_INFINITY};
use super::{
    ChangeRecord, Columns, DeclaredColumn, RowChange, RowOp, SharedLine, SmolStr, SourcePosition, input_error,
    object_columns,
};
use fovea_types::error::Result;
use fovea_types::ids::TableId;
use fovea_types::schema::Row;

const NO_TABLE: &str = "row record without source.schema/source.table";

/// `schema.table` (MySQL records name the database instead of a schema).
fn qualified(namespace: Option<&str>, table: Option<&str>) -> Option<SmolStr> {
    let (namespace, table) = (namespace?, table?);
    // Built directly: once per record, without the formatting machinery
    // (and, up to 23 bytes, in place, without an allocation).
    let len = namespace.len() + 1 + table.len();
    if len <= 23 {
        let mut name = [b'.'; 23];
        name[..namespace.len()].copy_from_slice(namespace.as_bytes());
        name[namespace.len() + 1..len].copy_from_slice(table.as_bytes());
        // Two strings and a dot: UTF-8 (checked anyway, 23 bytes at most).
        return std::str::from_utf8(&name[..len]).ok().map(SmolStr::new_inline);
    }
    let mut name = smol_str::SmolStrBuilder::new();
    name.push_str(namespace);
    name.push('.');
    name.push_str(table);
    Some(name.finish())
}

/// A `source.snapshot` value: Debezium's own markers without a copy.
fn snapshot_marker(marker: &str) -> SmolStr {
    match marker {
        "false" => SmolStr::new_static("false"),
        "true" => SmolStr::new_static("true"),
        "first" => SmolStr::new_static("first"),
        "last" => SmolStr::new_static("last"),
        other => SmolStr::new(other),
    }
}

/// The row operation of a Debezium `op` code that carries a row.
fn row_op(code: &str) -> Option<RowOp> {
    match code {
        "c" => Some(RowOp::Insert),
        "r" => Some(RowOp::SnapshotRead),
        "u" => Some(RowOp::Update),
        "d" => Some(RowOp::Delete),
        "t" => Some(RowOp::Truncate),
        _ => None,
    }
}

/// Debezium's marker for an unchanged out-of-line (TOAST) value.
pub const UNAVAILABLE: &str = "__debezium_unavailable_value";

/// Splits an envelope `{"schema","payload"}` into its parts.
fn unwrap_envelope(v: Json) -> (Option<Json>, Json) {
    match v {
        Json::Object(mut m) if m.contains_key("payload") && m.contains_key("schema") => {
            let payload = m.remove("payload").unwrap_or(Json::Null);
            (m.remove("schema"), payload)
        }
        other => (None, other),
    }
}

/// The xid part of a Debezium transaction id `"<xid>:<lsn>"`.
fn xid(id: &Json) -> Option<SmolStr> {
    match id {
        Json::String(s) => Some(SmolStr::new(s.split(':').next().unwrap_or(s))),
        // Integers (every transaction id) without the formatting machinery.
        Json::Number(n) => Some(match (n.as_u64(), n.as_i64()) {
            // At most 20 characters: inline, no check for a heap string.
            (Some(u), _) => SmolStr::new_inline(itoa::Buffer::new().format(u)),
            (None, Some(i)) => SmolStr::new_inline(itoa::Buffer::new().format(i)),
            _ => n.to_smolstr(),
        }),
        _ => None,
    }
}

fn micros(source: Option<&Json>, payload: &Json) -> Result<Option<i64>, String> {
    let src = |k: &str| source.and_then(|s| s.get(k)).and_then(Json::as_i64);
    match src("ts_us") {
        Some(us) => Ok(Some(us)),
        None => commit_micros(src("ts_ms").or_else(|| payload.get("ts_ms").and_then(Json::as_i64))),
    }
}

/// A commit time in ms as µs; one that does not fit is an error, not a
/// wrapped number.
fn commit_micros(ms: Option<i64>) -> Result<Option<i64>, String> {
    ms.map(|ms| ms.checked_mul(1000).ok_or_else(|| format!("commit time ts_ms {ms} is out of range"))).transpose()
}

/// Every field fovea reads from a Debezium record, at either level (Kafka
/// record or value); everything else is skipped without being built. A
/// Kafka record's `value` and the row images are read in the same pass.
///
/// Filled in place by [`FieldsFill`] rather than built by a derived
/// `Deserialize`: the derived visitor returns the (large) struct by value
/// through every layer of serde, and those moves were a tenth of a
/// decoder thread's time.
#[derive(Default)]
struct Fields<'a> {
    key: Option<&'a RawValue>,
    /// A Kafka record's `key` is there and `null`: Debezium's key of a
    /// table without a primary key.
    key_null: bool,
    /// `value` held an object: a Kafka record's value, read into the
    /// caller's second [`Fields`].
    nested: bool,
    schema: Option<&'a RawValue>,
    payload: Option<&'a RawValue>,
    /// Row images, read once the table is known (typed, or as columns).
    before: Option<&'a RawValue>,
    after: Option<&'a RawValue>,
    /// A Kafka record's topic (read where typed decoding may guess by it).
    topic: Option<Cow<'a, str>>,
    /// The after image was read in the pass, against the table the topic
    /// guessed (`Some` of its definition's number), into `after_row`.
    after_read: Option<u64>,
    after_row: Option<Row>,
    /// The topic guessed a table (its after image, if any, is read
    /// against that table).
    guessed: bool,
    source: Option<FastSource<'a>>,
    op: Option<Cow<'a, str>>,
    status: Option<Cow<'a, str>>,
    transaction: Option<&'a RawValue>,
    /// Transaction records: `id`, `ts_ms`, `event_count`, `data_collections`.
    id: Option<Json>,
    ts_ms: Option<Json>,
    event_count: Option<Json>,
    data_collections: Option<Vec<DataCollection<'a>>>,
    /// An AWS DMS record has one at its top.
    metadata: bool,
}

/// The keys of [`Fields`].
#[derive(serde::Deserialize, Clone, Copy)]
#[serde(field_identifier, rename_all = "snake_case")]
enum FieldKey {
    Topic,
    Key,
    Value,
    Schema,
    Payload,
    Before,
    After,
    Source,
    Op,
    Status,
    Transaction,
    Id,
    TsMs,
    EventCount,
    DataCollections,
    Metadata,
    #[serde(other)]
    Other,
}

/// The keys of [`FastSource`].
#[derive(serde::Deserialize, Clone, Copy)]
#[serde(field_identifier)]
enum SourceKey {
    #[serde(rename = "schema")]
    Schema,
    #[serde(rename = "db")]
    Db,
    #[serde(rename = "table")]
    Table,
    #[serde(rename = "txId")]
    TxId,
    #[serde(rename = "ts_us")]
    TsUs,
    #[serde(rename = "ts_ms")]
    TsMs,
    #[serde(rename = "snapshot")]
    Snapshot,
    #[serde(other)]
    Other,
}

/// Reads a record's fields into `out` (a Kafka record's object `value`
/// into `value`, if given). Whatever the derived visitor refused (a field
/// twice, a field of another type) is refused here too, and so is what
/// fovea's records never hold (a `value` inside a `value`, a record or a
/// `source` written as an array): the general path decodes or refuses it.
struct FieldsFill<'f, 'a, 's> {
    out: &'f mut Fields<'a>,
    value: Option<&'f mut Fields<'a>>,
    /// Typed decoding's tables, to guess a Kafka record's table by its
    /// topic (top level only).
    tables: Option<&'s mut TypedTables>,
    /// The table guessed: an after image is read straight into its row.
    guess: Option<&'s TableShape>,
}

impl<'de: 'a, 'a> serde::de::Visitor<'de> for FieldsFill<'_, 'a, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Debezium record")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        use serde::de::{Error as _, IgnoredAny};
        let FieldsFill { out, mut value, mut tables, mut guess } = self;
        let mut seen = 0u32;
        while let Some(key) = map.next_key::<FieldKey>()? {
            if !matches!(key, FieldKey::Other) {
                first_time(&mut seen, key as u32)?;
            }
            match key {
                // Read only where it may guess (else skipped, as before).
                FieldKey::Topic if tables.is_some() => {
                    // Any JSON value: what is no string guesses nothing.
                    out.topic = match map.next_value::<Scalar<'de>>()? {
                        Scalar::Str(topic) => Some(topic),
                        _ => None,
                    };
                    if let (Some(topic), Some(t)) = (&out.topic, tables.take()) {
                        guess = t.guess(topic);
                        out.guessed = guess.is_some();
                    }
                }
                FieldKey::Topic => {
                    map.next_value::<IgnoredAny>()?;
                }
                FieldKey::Key => {
                    out.key = map.next_value()?;
                    out.key_null = out.key.is_none();
                }
                FieldKey::Value => {
                    let Some(inner) = value.take() else { return Err(A::Error::custom("a value inside a value")) };
                    let fill = FieldsFill { out: inner, value: None, tables: None, guess };
                    out.nested = map.next_value_seed(OrNull(fill))?;
                }
                FieldKey::Schema => out.schema = map.next_value()?,
                FieldKey::Payload => out.payload = map.next_value()?,
                FieldKey::Before => out.before = map.next_value()?,
                FieldKey::After => match guess {
                    Some(shape) => {
                        out.after_row = map.next_value_seed(AfterImageSeed(shape))?;
                        out.after_read = Some(shape.def.instance());
                    }
                    None => out.after = map.next_value()?,
                },
                FieldKey::Source => {
                    let source = out.source.insert(FastSource::default());
                    if !map.next_value_seed(OrNull(SourceFill(source)))? {
                        out.source = None;
                    }
                }
                FieldKey::Op => out.op = map.next_value::<Option<BorrowedStr<'a>>>()?.map(|s| s.0),
                FieldKey::Status => out.status = map.next_value::<Option<BorrowedStr<'a>>>()?.map(|s| s.0),
                FieldKey::Transaction => out.transaction = map.next_value()?,
                FieldKey::Id => out.id = map.next_value()?,
                FieldKey::TsMs => out.ts_ms = map.next_value()?,
                FieldKey::EventCount => out.event_count = map.next_value()?,
                FieldKey::DataCollections => out.data_collections = map.next_value()?,
                FieldKey::Metadata => out.metadata = map.next_value::<Option<IgnoredAny>>()?.is_some(),
                FieldKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// Marks field number `field` as read, refusing it if it was read before
/// (what the derived visitors refused as a duplicate field).
fn first_time<E: serde::de::Error>(seen: &mut u32, field: u32) -> std::result::Result<(), E> {
    let bit = 1 << field;
    if *seen & bit != 0 {
        return Err(E::custom("a field twice"));
    }
    *seen |= bit;
    Ok(())
}

/// Reads a `source` object into a [`FastSource`].
struct SourceFill<'f, 'a>(&'f mut FastSource<'a>);

impl<'de: 'a, 'a> serde::de::Visitor<'de> for SourceFill<'_, 'a> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Debezium source block")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        use serde::de::IgnoredAny;
        let out = self.0;
        let mut seen = 0u32;
        let text = |s: Option<BorrowedStr<'a>>| s.map(|s| s.0);
        while let Some(key) = map.next_key::<SourceKey>()? {
            if !matches!(key, SourceKey::Other) {
                first_time(&mut seen, key as u32)?;
            }
            match key {
                SourceKey::Schema => out.schema = text(map.next_value()?),
                SourceKey::Db => out.db = text(map.next_value()?),
                SourceKey::Table => out.table = text(map.next_value()?),
                SourceKey::TxId => out.tx_id = map.next_value()?,
                SourceKey::TsUs => out.ts_us = map.next_value()?,
                SourceKey::TsMs => out.ts_ms = map.next_value()?,
                SourceKey::Snapshot => out.snapshot = text(map.next_value()?),
                SourceKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// An object read in place by visitor `V`, or `null`: `true` when it was
/// an object.
struct OrNull<V>(V);

impl<'de, V: serde::de::Visitor<'de, Value = ()>> serde::de::DeserializeSeed<'de> for OrNull<V> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<bool, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, V: serde::de::Visitor<'de, Value = ()>> serde::de::Visitor<'de> for OrNull<V> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object or null")
    }

    fn visit_none<E: serde::de::Error>(self) -> std::result::Result<bool, E> {
        Ok(false)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<bool, D::Error> {
        d.deserialize_map(self.0).map(|()| true)
    }
}

/// One entry of an END record's `data_collections`.
#[derive(serde::Deserialize)]
struct DataCollection<'a> {
    #[serde(borrow)]
    data_collection: Option<Cow<'a, str>>,
    event_count: Option<Json>,
}

/// The fields fovea reads from a record's `source` block.
#[derive(Default)]
struct FastSource<'a> {
    schema: Option<Cow<'a, str>>,
    db: Option<Cow<'a, str>>,
    table: Option<Cow<'a, str>>,
    tx_id: Option<Json>,
    ts_us: Option<i64>,
    ts_ms: Option<i64>,
    snapshot: Option<Cow<'a, str>>,
}

/// Finds a `"schema"` field in a Kafka key (a key in a schema envelope is
/// the general path's), searched with memchr's finder: `str::contains`
/// set up a searcher of its own for every record.
static SCHEMA_FIELD: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"schema\""));

/// Reads `line` into `top` (and a Kafka record's value into `value`), as
/// `serde_json::from_str` would: one JSON value and nothing after it.
/// With `tables`, a Kafka record's after image is read into the row of
/// the table its topic guesses, if it guesses one.
fn read_fields<'a>(
    line: &'a str,
    top: &mut Fields<'a>,
    value: &mut Fields<'a>,
    tables: Option<&mut TypedTables>,
) -> serde_json::Result<()> {
    let mut de = serde_json::Deserializer::from_str(line);
    serde::Deserializer::deserialize_map(&mut de, FieldsFill { out: top, value: Some(value), tables, guess: None })?;
    de.end()
}

/// A BEGIN or END record of transaction `id` (Debezium's transaction
/// metadata), on either path.
fn transaction_record(
    status: &str,
    id: Option<&Json>,
    ts_ms: Option<i64>,
    event_count: Option<u64>,
    per_table: impl FnOnce() -> Vec<(String, u64)>,
    position: SourcePosition,
) -> Result<ChangeRecord> {
    let txid = id
        .and_then(xid)
        .ok_or_else(|| input_error(position, None, None, format!("{status} record without a transaction id")))?;
    let commit_us = commit_micros(ts_ms).map_err(|e| input_error(position, None, Some(&txid), e))?;
    match status {
        "BEGIN" => Ok(ChangeRecord::Begin { txid: txid.to_string(), commit_us }),
        "END" => Ok(ChangeRecord::End { txid: txid.to_string(), event_count, per_table: per_table(), commit_us }),
        other => Err(input_error(position, None, Some(&txid), format!("unknown transaction status {other:?}"))),
    }
}

/// A raw image (a Kafka record's key, a before or after image) as its
/// columns (`null`: none).
fn raw_image(raw: Option<&RawValue>) -> std::result::Result<Option<Image<'_>>, serde_json::Error> {
    raw.map(|r| serde_json::from_str::<Option<Image<'_>>>(r.get())).transpose().map(Option::flatten)
}

/// Decodes one Debezium line: the fast path for records without a schema
/// envelope (one pass, no JSON tree), the general path otherwise.
pub fn decode_str(line: &str, position: SourcePosition) -> Result<ChangeRecord> {
    decode_fields(line, position, None, false).map(|(record, _)| record)
}

/// [`decode_str`], reading the row images of a table that `tables` knows
/// straight into typed values where it can (see [`super::typed`]): the
/// row then carries a [`TypedRow`] and no JSON images. With `dms_possible`
/// (the input's format is detected per line), a record with `metadata` at
/// its top is decoded by [`super::decode_line`], which tells AWS DMS
/// records from Debezium's.
pub fn decode_typed(
    line: SharedLine,
    position: SourcePosition,
    tables: &mut TypedTables,
    dms_possible: bool,
) -> Result<ChangeRecord> {
    let (mut record, typed) = decode_fields(line.as_str(), position, Some(tables), dms_possible)?;
    if let (ChangeRecord::Row(row), Some((table, definition, key, values))) = (&mut record, typed) {
        row.typed = Some(TypedRow { table, definition, key, row: values, line });
    }
    Ok(record)
}

/// What typed decoding read: the table, the number of the definition it
/// read against, the key and the row.
type Typed = (TableId, u64, Row, Row);

fn decode_fields(
    line: &str,
    position: SourcePosition,
    mut tables: Option<&mut TypedTables>,
    dms_possible: bool,
) -> Result<(ChangeRecord, Option<Typed>)> {
    // With typed tables, first as the record's topic guesses; where the
    // guess does not hold, once more without.
    if let Some(t) = tables.as_deref_mut()
        && let Some(done) = decode_pass(line, position, Some(t), dms_possible, true)?
    {
        return Ok(done);
    }
    decode_pass(line, position, tables, dms_possible, false)?
        .ok_or_else(|| fovea_types::error::Error::invariant("a record read without a guess asked for another pass"))
}

/// One pass of [`decode_fields`]. `guessing`: a Kafka record's after image
/// may be read in the pass, against the table its topic guesses; `None`
/// when that guess did not hold (the record is read again without).
fn decode_pass(
    line: &str,
    position: SourcePosition,
    mut tables: Option<&mut TypedTables>,
    dms_possible: bool,
    guessing: bool,
) -> Result<Option<(ChangeRecord, Option<Typed>)>> {
    let general = || -> Result<Option<(ChangeRecord, Option<Typed>)>> {
        if dms_possible {
            return super::decode_line(line, position, super::InputFormat::Auto).map(|r| Some((r, None)));
        }
        let json: Json = serde_json::from_str(line)
            .map_err(|e| input_error(position, None, None, format!("malformed JSON: {e}")))?;
        decode(json, position).map(|r| Some((r, None)))
    };
    // Anything the fast path does not read as it expects (malformed JSON,
    // a field of another type, a field twice) is the general path's to
    // decode or to refuse, with its errors.
    let (mut top, mut value) = (Fields::default(), Fields::default());
    let guesser = if guessing { tables.as_deref_mut() } else { None };
    if read_fields(line, &mut top, &mut value, guesser).is_err() {
        if top.guessed {
            // Maybe the image did not read as the guessed table's row.
            if let (Some(t), Some(topic)) = (tables, &top.topic) {
                t.guess_failed(topic);
            }
            return Ok(None);
        }
        return general();
    }
    let topic = top.topic.take();
    let guessed = top.guessed;
    if top.metadata && dms_possible {
        return general();
    }
    // (A Kafka record whose value is null, a tombstone, has no source and
    // goes to the general path, which skips it.)
    // (Borrowed, not moved: the fields are half a kilobyte.)
    let (key, key_null, payload) = if top.nested && top.source.is_none() && top.op.is_none() {
        (top.key, top.key_null, &mut value)
    } else {
        (None, false, &mut top)
    };
    if payload.schema.is_some() || payload.payload.is_some() {
        return general();
    }
    if let Some(status) = payload.status.take() {
        // `as_i64` / `as_u64`, as the general path reads them.
        let event_count = payload.event_count.as_ref().and_then(Json::as_u64);
        let per_table = || {
            payload
                .data_collections
                .take()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|d| Some((d.data_collection?.into_owned(), d.event_count?.as_u64()?)))
                .collect()
        };
        let ts_ms = payload.ts_ms.as_ref().and_then(Json::as_i64);
        return transaction_record(&status, payload.id.as_ref(), ts_ms, event_count, per_table, position)
            .map(|r| Some((r, None)));
    }
    if let Some(k) = key
        && SCHEMA_FIELD.find(k.get().as_bytes()).is_some()
    {
        return general();
    }
    let Some(source) = payload.source.take() else { return general() };
    let table = qualified(source.schema.as_deref().or(source.db.as_deref()), source.table.as_deref())
        .ok_or_else(|| input_error(position, None, None, NO_TABLE))?;
    let txid = source.tx_id.as_ref().filter(|v| !v.is_null()).and_then(xid).or_else(|| {
        let t: Option<Json> = payload.transaction.and_then(|t| serde_json::from_str(t.get()).ok());
        t.as_ref().and_then(|t| t.get("id")).and_then(xid)
    });
    // A truncate, with no images, is rare: the general path reads it.
    let Some(op) = payload.op.as_deref().and_then(row_op).filter(|&op| op != RowOp::Truncate) else {
        return general();
    };
    let bad = |e: serde_json::Error| {
        input_error(position, Some(&table), txid.as_deref(), format!("malformed row image: {e}"))
    };
    if guessing
        && !guessed
        && let (Some(t), Some(topic)) = (tables.as_deref_mut(), &topic)
    {
        t.learn(topic, &table);
    }
    let shape = tables.as_deref_mut().and_then(|t| t.shape(&table));
    let read = match (shape, payload.after_read) {
        (Some(shape), None) => shape.decode(op, key, payload.before, payload.after).map(|r| (shape, r)),
        // The after image was read against the guessed table's current
        // definition: this table's, or the record is read again.
        (Some(shape), Some(read)) if read == shape.def.instance() => {
            let Some(read) = shape.decode_read(op, key, payload.before, payload.after_row.take()) else {
                // The untyped record needs the image the pass did not keep.
                if let (Some(t), Some(topic)) = (tables, &topic) {
                    t.guess_failed(topic);
                }
                return Ok(None);
            };
            Some((shape, read))
        }
        (_, Some(_)) => {
            if let (Some(t), Some(topic)) = (tables, &topic) {
                t.learn(topic, &table);
            }
            return Ok(None);
        }
        (None, None) => None,
    };
    let typed = read.map(|(shape, (key, row))| (shape.def.id, shape.def.instance(), key, row));
    // A typed row needs no JSON images (the line is kept to decode again).
    let (key, before, after) = match typed {
        Some(_) => (None, None, None),
        None => {
            let key = raw_image(key).map_err(bad)?;
            // An image that is no object is the general path's to refuse.
            let (Ok(before), Ok(after)) = (raw_image(payload.before), raw_image(payload.after)) else {
                return general();
            };
            (key.map(Image::into_columns), before.map(Image::into_columns), after.map(Image::into_columns))
        }
    };
    let key_names = key.as_ref().map(|k| k.iter().map(|(n, _)| n.clone()).collect()).or_else(|| keyless(key_null));
    let record = ChangeRecord::Row(RowChange {
        op,
        key,
        before,
        after,
        commit_us: match source.ts_us {
            Some(us) => Some(us),
            None => commit_micros(source.ts_ms).map_err(|e| input_error(position, Some(&table), txid.as_deref(), e))?,
        },
        snapshot: source.snapshot.as_deref().map(snapshot_marker),
        declared: None,
        key_names,
        in_transaction_block: payload.transaction.is_some_and(|t| t.get() != "null"),
        omits_nulls: false,
        typed: None,
        txid,
        table,
    });
    Ok(Some((record, typed)))
}

/// The key names of a record whose Kafka key is `null` (`key_null`): none.
/// Debezium gives a table without a primary key (and without
/// `message.key.columns`) no key; a record without a `key` field at all
/// says nothing of its table's key.
fn keyless(key_null: bool) -> Option<Vec<String>> {
    key_null.then(Vec::new)
}

/// Decodes one Debezium record.
pub fn decode(json: Json, position: SourcePosition) -> Result<ChangeRecord> {
    let is_kafka =
        json.as_object().is_some_and(|m| m.contains_key("value") && (m.contains_key("topic") || m.contains_key("key")));
    let (key, value) = if is_kafka {
        let mut m = match json {
            Json::Object(m) => m,
            _ => unreachable!("checked is_object"),
        };
        (m.remove("key"), m.remove("value").unwrap_or(Json::Null))
    } else {
        (None, json)
    };
    let (schema, payload) = unwrap_envelope(value);
    if payload.is_null() {
        return Ok(ChangeRecord::Skip);
    }
    if !payload.is_object() {
        return Err(input_error(position, None, None, "a Debezium record must be a JSON object"));
    }
    if let Some(status) = payload.get("status").and_then(Json::as_str) {
        let per_table = || {
            payload
                .get("data_collections")
                .and_then(Json::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|d| {
                            Some((d.get("data_collection")?.as_str()?.to_owned(), d.get("event_count")?.as_u64()?))
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        return transaction_record(
            status,
            payload.get("id"),
            payload.get("ts_ms").and_then(Json::as_i64),
            payload.get("event_count").and_then(Json::as_u64),
            per_table,
            position,
        );
    }
    let source = payload.get("source");
    let field = |k: &str| source.and_then(|s| s.get(k)).and_then(Json::as_str);
    let table = qualified(field("schema").or_else(|| field("db")), field("table"))
        .ok_or_else(|| input_error(position, None, None, NO_TABLE))?;
    let txid = source
        .and_then(|s| s.get("txId"))
        .filter(|v| !v.is_null())
        .and_then(xid)
        .or_else(|| payload.get("transaction").and_then(|t| t.get("id")).and_then(xid));
    let code = payload.get("op").and_then(Json::as_str);
    let op = match (code.and_then(row_op), code) {
        (Some(op), _) => op,
        (None, Some("m")) => return Ok(ChangeRecord::Skip),
        (None, Some(other)) => {
            return Err(input_error(position, Some(&table), txid.as_deref(), format!("unknown op {other:?}")));
        }
        (None, None) => {
            return Err(input_error(position, Some(&table), txid.as_deref(), "row record without \"op\""));
        }
    };
    let declared = schema.as_ref().and_then(declared_columns);
    let mut before = payload.get("before").and_then(object_columns);
    let mut after = payload.get("after").and_then(object_columns);
    if let Some(decl) = &schema {
        for (image, field) in [(&mut before, "before"), (&mut after, "after")] {
            if let (Some(cols), Some(fields)) = (image.as_mut(), struct_fields(decl, field)) {
                canonicalize(cols, fields).map_err(|m| input_error(position, Some(&table), txid.as_deref(), m))?;
            }
        }
    }
    let (key_schema, key_payload) = match key {
        Some(k) => {
            let (s, p) = unwrap_envelope(k);
            (s, Some(p))
        }
        None => (None, None),
    };
    // With schemas, a null key is an envelope of a null payload.
    let key_null = key_payload.as_ref().is_some_and(Json::is_null);
    let key_cols = key_payload.as_ref().and_then(object_columns);
    let key_names = key_cols
        .as_ref()
        .map(|k| k.iter().map(|(n, _)| n.clone()).collect())
        .or_else(|| {
            key_schema.as_ref().and_then(|s| {
                s.get("fields")?
                    .as_array()
                    .map(|f| f.iter().filter_map(|x| x.get("field")?.as_str().map(str::to_owned)).collect())
            })
        })
        .or_else(|| keyless(key_null));
    let snapshot = source.and_then(|s| s.get("snapshot")).and_then(Json::as_str).map(SmolStr::new);
    let in_transaction_block = payload.get("transaction").is_some_and(|t| !t.is_null());
    let commit_us = micros(source, &payload).map_err(|e| input_error(position, Some(&table), txid.as_deref(), e))?;
    Ok(ChangeRecord::Row(RowChange {
        table,
        op,
        key: key_cols,
        before,
        after,
        txid,
        commit_us,
        snapshot,
        declared,
        key_names,
        in_transaction_block,
        omits_nulls: false,
        typed: None,
    }))
}

fn struct_fields<'a>(schema: &'a Json, field: &str) -> Option<&'a Vec<Json>> {
    schema
        .get("fields")?
        .as_array()?
        .iter()
        .find(|f| f.get("field").and_then(Json::as_str) == Some(field))?
        .get("fields")?
        .as_array()
}

/// Column types of the `after` (else `before`) struct of a value schema.
fn declared_columns(schema: &Json) -> Option<Vec<DeclaredColumn>> {
    let fields = struct_fields(schema, "after").or_else(|| struct_fields(schema, "before"))?;
    Some(
        fields
            .iter()
            .filter_map(|f| {
                Some(DeclaredColumn {
                    name: f.get("field")?.as_str()?.to_owned(),
                    data_type: connect_type(f),
                    nullable: f.get("optional").and_then(Json::as_bool).unwrap_or(true),
                })
            })
            .collect(),
    )
}

fn decimal_params(f: &Json) -> (u8, i8) {
    let p =
        |k: &str| f.get("parameters").and_then(|p| p.get(k)).and_then(Json::as_str).and_then(|s| s.parse::<i64>().ok());
    let scale = p("scale").unwrap_or(0).clamp(0, 38) as i8;
    let precision = p("connect.decimal.precision").unwrap_or(38).clamp(1, 38) as u8;
    (precision.max(scale as u8), scale)
}

/// Arrow type of a Kafka Connect schema field (with Debezium logical names).
pub fn connect_type(f: &Json) -> DataType {
    let name = f.get("name").and_then(Json::as_str).unwrap_or("");
    match (f.get("type").and_then(Json::as_str).unwrap_or(""), name) {
        ("int8", _) => DataType::Int8,
        ("int16", _) => DataType::Int16,
        ("int32", "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date") => DataType::Date32,
        ("int32", _) => DataType::Int32,
        (
            "int64",
            "io.debezium.time.MicroTimestamp"
            | "io.debezium.time.Timestamp"
            | "io.debezium.time.NanoTimestamp"
            | "org.apache.kafka.connect.data.Timestamp",
        ) => DataType::Timestamp(TimeUnit::Microsecond, None),
        ("int64", _) => DataType::Int64,
        ("float" | "float32", _) => DataType::Float32,
        ("double" | "float64", _) => DataType::Float64,
        ("boolean", _) => DataType::Boolean,
        ("string", "io.debezium.time.ZonedTimestamp") => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        ("bytes", "org.apache.kafka.connect.data.Decimal") => {
            let (p, s) = decimal_params(f);
            DataType::Decimal128(p, s)
        }
        ("bytes", _) => DataType::Binary,
        _ => DataType::Utf8,
    }
}

/// Rewrites logical encodings to canonical JSON (decimal strings, µs).
fn canonicalize(cols: &mut Columns, fields: &[Json]) -> Result<(), String> {
    for (name, value) in cols.iter_mut() {
        if value.is_null() || value.as_str() == Some(UNAVAILABLE) {
            continue;
        }
        let Some(f) = fields.iter().find(|f| f.get("field").and_then(Json::as_str) == Some(name.as_str())) else {
            continue;
        };
        let logical = f.get("name").and_then(Json::as_str).unwrap_or("");
        match logical {
            "org.apache.kafka.connect.data.Decimal" => {
                if let Some(b64) = value.as_str() {
                    let (_, scale) = decimal_params(f);
                    *value = Json::String(decimal_from_base64(b64, scale).map_err(|e| format!("column {name}: {e}"))?);
                }
            }
            "io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp" => {
                if let Some(ms) = value.as_i64() {
                    let us = match ms {
                        // The infinities are the same number in ms as in
                        // µs, where the column's value reads them.
                        DEBEZIUM_TIMESTAMP_INFINITY | DEBEZIUM_TIMESTAMP_NEGATIVE_INFINITY => ms,
                        _ => ms
                            .checked_mul(1000)
                            .ok_or_else(|| format!("column {name}: timestamp {ms} ms is out of range"))?,
                    };
                    *value = Json::from(us);
                }
            }
            "io.debezium.time.NanoTimestamp" => {
                if let Some(ns) = value.as_i64() {
                    // Debezium writes the infinities as the extremes, which
                    // are the infinities in µs too.
                    let us = if ns == i64::MAX || ns == i64::MIN { ns } else { ns.div_euclid(1000) };
                    *value = Json::from(us);
                }
            }
            "io.debezium.data.VariableScaleDecimal" => {
                let scale = value.get("scale").and_then(Json::as_i64).unwrap_or(0) as i8;
                if let Some(b64) = value.get("value").and_then(Json::as_str) {
                    *value = Json::String(decimal_from_base64(b64, scale).map_err(|e| format!("column {name}: {e}"))?);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Base64 big-endian two's-complement unscaled value → decimal string.
pub fn decimal_from_base64(b64: &str, scale: i8) -> Result<String, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("bad base64 decimal {b64:?}: {e}"))?;
    if bytes.len() > 16 {
        return Err(format!("decimal of {} bytes does not fit 128 bits", bytes.len()));
    }
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    let mut buf = if negative { [0xFFu8; 16] } else { [0u8; 16] };
    buf[16 - bytes.len()..].copy_from_slice(&bytes);
    Ok(super::types::format_decimal(i128::from_be_bytes(buf), scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A numeric transaction id reads as serde_json prints it.
    #[test]
    fn numeric_transaction_ids_read_as_printed() {
        for text in ["0", "7", "18446744073709551615", "-5", "-9223372036854775808", "1.5", "1e300"] {
            let n: Json = serde_json::from_str(text).unwrap();
            assert_eq!(xid(&n).as_deref(), Some(n.to_string().as_str()), "{text}");
        }
    }

    /// A table's qualified name and a snapshot marker read as written,
    /// names short enough to be inline or not.
    #[test]
    fn qualified_names_and_snapshot_markers_read_as_written() {
        for namespace in ["", "s", "hybench", "sch\u{e9}ma", "a_namespace_of_21_chr"] {
            for table in ["", "t", "account", "t\u{1f600}", "a_table_named_at_length_24"] {
                let name = qualified(Some(namespace), Some(table)).unwrap();
                assert_eq!(name, format!("{namespace}.{table}"));
            }
        }
        assert_eq!(qualified(None, Some("t")), None);
        assert_eq!(qualified(Some("s"), None), None);
        for marker in ["false", "true", "first", "last", "incremental", "", "a marker longer than twenty-three"] {
            assert_eq!(snapshot_marker(marker), marker);
        }
    }

    /// The fast path (one pass into [`Fields`]) against the general path
    /// (a JSON tree) on the same line: the same record or the same error.
    fn same_both_ways(line: &str) {
        let position = SourcePosition { line: 7, offset: 300 };
        let fast = decode_str(line, position).map(|r| format!("{r:?}")).map_err(|e| e.to_string());
        let general = serde_json::from_str::<Json>(line)
            .map_err(|e| input_error(position, None, None, format!("malformed JSON: {e}")))
            .and_then(|json| decode(json, position))
            .map(|r| format!("{r:?}"))
            .map_err(|e| e.to_string());
        assert_eq!(fast, general, "{line}");
    }

    #[test]
    fn the_fast_path_reads_every_shape_as_the_general_path_does() {
        let source =
            r#"{"connector":"postgresql","schema":"public","table":"t","txId":7,"lsn":1,"ts_us":5,"snapshot":"false"}"#;
        let value =
            |extra: &str| format!(r#"{{"before":null,"after":{{"id":1,"v":"x"}},"source":{source},"op":"c"{extra}}}"#);
        let lines = [
            format!(r#"{{"topic":"s.public.t","key":{{"id":1}},"value":{}}}"#, value("")),
            // The key of a table without a primary key, and no key at all.
            format!(r#"{{"topic":"s.public.t","key":null,"value":{}}}"#, value("")),
            format!(r#"{{"topic":"s.public.t","value":{}}}"#, value("")),
            value(""),
            value(r#","transaction":{"id":"7:1","total_order":1}"#),
            value(r#","transaction":null"#),
            value(r#","ts_ms":12"#),
            // A tombstone, a value that is no object, a value inside a value.
            r#"{"topic":"s.public.t","key":{"id":1},"value":null}"#.into(),
            r#"{"topic":"s.public.t","key":{"id":1},"value":3}"#.into(),
            format!(r#"{{"topic":"s.public.t","key":{{"id":1}},"value":{}}}"#, value(r#","value":{}"#)),
            // A field twice, at either level.
            format!(r#"{{"topic":"s","key":{{"id":1}},"key":{{"id":2}},"value":{}}}"#, value("")),
            value(r#","op":"u""#),
            value(&format!(r#","source":{source}"#)),
            // A truncate: no images, no key.
            format!(
                r#"{{"topic":"s.public.t","key":null,"value":{{"source":{source},"op":"t","ts_ms":3,"transaction":{{"id":"7:1"}}}}}}"#
            ),
            // Fields of other types, a source as an array, escapes.
            value(r#","transaction":5"#).replace(r#""op":"c""#, r#""op":1"#),
            r#"{"before":null,"after":{"id":1},"source":["public","t"],"op":"c"}"#.into(),
            value("").replace(r#""table":"t""#, r#""table":"t\u00e9""#),
            value("").replace(r#""op":"c""#, r#""op":"\u0063""#),
            value("").replace(r#""txId":7"#, r#""txId":"7:99""#),
            value("").replace(r#""txId":7"#, r#""txId":null"#),
            value("").replace(r#""ts_us":5"#, r#""ts_ms":5"#),
            value("").replace(r#""ts_us":5"#, r#""ts_ms":9223372036854775807"#),
            value("").replace(r#""snapshot":"false""#, r#""snapshot":true"#),
            value("").replace(r#""schema":"public","#, r#""db":"shop","#),
            value("").replace(r#""schema":"public","#, ""),
            // Transaction records, an envelope, trailing text, AWS DMS.
            r#"{"status":"BEGIN","id":"571:1","ts_ms":3,"event_count":null,"data_collections":null}"#.into(),
            r#"{"status":"END","id":571,"event_count":2,"data_collections":[{"data_collection":"public.t","event_count":2}]}"#.into(),
            r#"{"status":"MIDDLE","id":571}"#.into(),
            format!(r#"{{"schema":{{"type":"struct"}},"payload":{}}}"#, value("")),
            format!("{} x", value("")),
            format!(r#"{{"metadata":{{}},"data":{{}},"before":null,"after":{{"id":1}},"source":{source},"op":"c"}}"#),
            "{".into(),
            "[]".into(),
        ];
        for line in &lines {
            same_both_ways(line);
        }
    }

    #[test]
    fn a_null_kafka_key_says_the_table_has_no_key() {
        let value =
            r#"{"before":null,"after":{"id":1},"source":{"schema":"public","table":"t","txId":7,"ts_ms":1},"op":"c"}"#;
        let key_names = |line: &str| match decode_str(line, SourcePosition::default()).unwrap() {
            ChangeRecord::Row(r) => r.key_names,
            other => panic!("{other:?}"),
        };
        let no_names: Option<Vec<String>> = Some(Vec::new());
        assert_eq!(key_names(&format!(r#"{{"topic":"s.public.t","key":null,"value":{value}}}"#)), no_names);
        // With schemas, a null key is an envelope of a null payload.
        let enveloped = format!(
            r#"{{"topic":"s.public.t","key":{{"schema":null,"payload":null}},"value":{{"schema":{{"type":"struct"}},"payload":{value}}}}}"#
        );
        assert_eq!(key_names(&enveloped), no_names);
        // No key field, or a bare value: nothing is known of the key.
        assert_eq!(key_names(&format!(r#"{{"topic":"s.public.t","value":{value}}}"#)), None);
        assert_eq!(key_names(value), None);
        assert_eq!(
            key_names(&format!(r#"{{"topic":"s.public.t","key":{{"id":1}},"value":{value}}}"#)),
            Some(vec!["id".to_owned()])
        );
    }

    #[test]
    fn the_fast_path_reads_a_real_postgresql_stream_as_the_general_path_does() {
        // The directory as the test runs, not as it was built (`fovea_testkit::package_dir!`).
        let package = std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from);
        let path = package.join("../tests/data/pg-tiny/debezium_events.jsonl.gz");
        let mut text = String::new();
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(file), &mut text)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut lines = 0;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            same_both_ways(line);
            lines += 1;
        }
        assert!(lines > 1000, "{lines} lines");
    }
}
