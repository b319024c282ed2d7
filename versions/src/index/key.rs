//! Keys: the order-preserving encoding of `(table, key)`, routing keys,
//! and upgrading keys of older encodings.

use smallvec::SmallVec;

use arrow::datatypes::DataType;
use fovea_types::error::Result;
use fovea_types::ids::TableId;
use fovea_types::schema::{TableDef, Value};

use super::*;

/// An encoded key: table id then the order-preserving key bytes.
pub type KeyBytes = SmallVec<[u8; 16]>;

/// Encodes `(table, key)` so that byte order equals key order.
///
/// The table id as 4 bytes big-endian, then per value: `0x00` for NULL;
/// an integer as a byte telling its sign and length, then its
/// significant bytes big-endian (non-negative: `0x80 + n` and the last n
/// bytes, where n is what the value needs, none for 0; negative:
/// `0x7F - n` and the last n bytes, where n is what its complement
/// needs, none for -1), so the common small keys stay short (a table
/// and a key below 2^24 take 8 bytes, four such columns 20); anything
/// else `0x01` followed by a boolean's byte, floats by the IEEE
/// total-order trick, decimals as 16 bytes, strings and bytes with `0x00`
/// escaped as `0x00 0xFF` and terminated by `0x00 0x00`. Index images
/// before format 3 held integers as `0x01` and 8 bytes with the sign bit
/// flipped ([`upgrade_key`] rewrites those).
pub fn encode_key(table: TableId, key: &[Value]) -> KeyBytes {
    encode_key_values(table, key)
}

/// The encoded primary key of a full row of `table` ([`encode_key`] of
/// its key columns, read in place).
pub fn encode_row_key(table: &TableDef, row: &[Value]) -> KeyBytes {
    encode_key_values(table.id, table.key_values(row))
}

/// [`encode_key`] of the values `key` yields.
pub fn encode_key_values<'v>(table: TableId, key: impl IntoIterator<Item = &'v Value>) -> KeyBytes {
    let mut out = KeyBytes::new();
    encode_values_into(&mut out, table, key, push_int);
    out
}

/// The bytes a key's shard is chosen by ([`routing_key`]).
pub type RoutingKey = SmallVec<[u8; 64]>;

/// The bytes a key's shard is chosen by: the key as index images before
/// format 3 encoded it (an integer as `0x01` and 8 bytes, sign bit
/// flipped; the rest as [`encode_key`]). A lake's rows and index entries
/// stay in the shard their key hashed to when they were written, so the
/// routing must not move when the index's key encoding does.
pub fn routing_key<'v>(table: TableId, key: impl IntoIterator<Item = &'v Value>) -> RoutingKey {
    let mut out = RoutingKey::new();
    encode_values_into(&mut out, table, key, |out, i| {
        out.push(1);
        out.extend_from_slice(&((i as u64) ^ (1 << 63)).to_be_bytes());
    });
    out
}

/// Appends `(table, key)` to `out` as [`encode_key`] describes, integers
/// written by `int`.
#[inline]
pub(super) fn encode_values_into<'v, A: smallvec::Array<Item = u8>>(
    out: &mut SmallVec<A>,
    table: TableId,
    key: impl IntoIterator<Item = &'v Value>,
    int: impl Fn(&mut SmallVec<A>, i64),
) {
    out.extend_from_slice(&table.0.to_be_bytes());
    for v in key {
        match v {
            Value::Null => out.push(0),
            Value::Bool(b) => out.extend_from_slice(&[1, *b as u8]),
            Value::Int(i) => int(out, *i),
            Value::Float(f) => {
                let bits = f.to_bits();
                let ordered = if bits >> 63 == 1 { !bits } else { bits ^ (1 << 63) };
                out.push(1);
                out.extend_from_slice(&ordered.to_be_bytes());
            }
            Value::Decimal(d) => {
                out.push(1);
                out.extend_from_slice(&((*d as u128) ^ (1 << 127)).to_be_bytes());
            }
            Value::Utf8(s) => escape_bytes(out, s.as_bytes()),
            Value::Binary(b) => escape_bytes(out, b),
        }
    }
}

/// An integer key value: its sign and length in one byte, then its
/// significant bytes (see [`encode_key`]).
#[inline]
pub(super) fn push_int<A: smallvec::Array<Item = u8>>(out: &mut SmallVec<A>, i: i64) {
    // The magnitude that sets the length: the value, or for a negative
    // one its complement (-1 → 0, i64::MIN → i64::MAX).
    let magnitude = if i < 0 { !i } else { i } as u64;
    let n = 8 - (magnitude.leading_zeros() / 8) as usize;
    out.push(if i < 0 { 0x7F - n as u8 } else { 0x80 + n as u8 });
    out.extend_from_slice(&i.to_be_bytes()[8 - n..]);
}

/// Rewrites a key of an index image before format 3 (integers as `0x01`
/// and 8 bytes, sign bit flipped) in today's encoding ([`encode_key`]).
/// `key_types` gives the types of a table's key columns, in key order;
/// where they do not parse the key, the image is corrupt (named by the
/// caller).
pub fn upgrade_key<'t>(old: &[u8], key_types: impl Fn(TableId) -> Option<&'t [DataType]>) -> Result<KeyBytes> {
    let bad = |what: &str| image_corrupt(&format!("a key of an older image {what}"));
    let table = old.get(..4).ok_or_else(|| bad("is shorter than a table id"))?;
    let id = TableId(u32::from_be_bytes([table[0], table[1], table[2], table[3]]));
    let types = key_types(id).ok_or_else(|| bad(&format!("names table {} that the checkpoint does not", id.0)))?;
    let mut out = KeyBytes::new();
    out.extend_from_slice(table);
    let mut at = 4;
    for t in types {
        let rest = &old[at..];
        match rest.first() {
            None => return Err(bad("ends before its last column")),
            Some(0) => {
                out.push(0);
                at += 1;
                continue;
            }
            Some(1) => {}
            Some(tag) => return Err(bad(&format!("has a value tagged {tag}"))),
        }
        let len = match t {
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Date32
            | DataType::Timestamp(_, _) => {
                let bytes: [u8; 8] =
                    rest.get(1..9).and_then(|b| b.try_into().ok()).ok_or_else(|| bad("ends inside an integer"))?;
                push_int(&mut out, (u64::from_be_bytes(bytes) ^ (1 << 63)) as i64);
                at += 9;
                continue;
            }
            DataType::Boolean => 2,
            DataType::Float32 | DataType::Float64 => 9,
            DataType::Decimal128(_, _) => 17,
            DataType::Utf8 | DataType::Binary => {
                // Up to the terminator `0x00 0x00` (`0x00 0xFF` is an escaped 0).
                let mut end = 1;
                loop {
                    match (rest.get(end), rest.get(end + 1)) {
                        (Some(0), Some(0)) => break end + 2,
                        (Some(0), Some(0xFF)) => end += 2,
                        (Some(0), _) | (None, _) => return Err(bad("ends inside a string")),
                        (Some(_), _) => end += 1,
                    }
                }
            }
            other => return Err(bad(&format!("has a key column of type {other}"))),
        };
        out.extend_from_slice(rest.get(..len).ok_or_else(|| bad("ends inside a value"))?);
        at += len;
    }
    if at != old.len() {
        return Err(bad("has bytes after its last column"));
    }
    Ok(out)
}

pub(super) fn escape_bytes<A: smallvec::Array<Item = u8>>(out: &mut SmallVec<A>, bytes: &[u8]) {
    out.push(1);
    for &b in bytes {
        if b == 0 {
            out.extend_from_slice(&[0, 0xFF]);
        } else {
            out.push(b);
        }
    }
    out.extend_from_slice(&[0, 0]);
}
