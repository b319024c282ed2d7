//! AWS DMS JSON, as its Kinesis and Kafka targets write it:
//! `{"data":{…}, "metadata":{"operation","record-type","schema-name",
//! "table-name","transaction-id","commit-timestamp",…}[, "before-image":{…}]}`.
//!
//! DMS has no BEGIN/END records: a transaction ends where the
//! `transaction-id` changes (the sink groups consecutive records). DMS gives
//! no primary key either; it comes from a `--schema-file`. Unless the
//! endpoint sets `IncludeNullAndEmpty`, a NULL column is left out of
//! `data`: a missing column is NULL ([`RowChange::omits_nulls`]). Control
//! records (table loads, and DDL with `IncludeTableAlterOperations`) carry
//! no column details: a column added shows in the data, a widened type by
//! a value only the wider type holds (the sink widens the column then).

use serde_json::Value as Json;

use super::{ChangeRecord, RowChange, RowOp, SmolStr, SourcePosition, input_error, object_columns};
use fovea_types::error::Result;

/// Decodes one DMS record.
pub fn decode(json: Json, position: SourcePosition) -> Result<ChangeRecord> {
    let meta = json.get("metadata").ok_or_else(|| input_error(position, None, None, "DMS record without metadata"))?;
    let s = |k: &str| meta.get(k).and_then(Json::as_str);
    match s("record-type") {
        Some("data") => {}
        // Control records (schema changes, table loads starting) carry no rows.
        Some("control") => return Ok(ChangeRecord::Skip),
        other => {
            return Err(input_error(position, None, None, format!("unknown DMS record-type {other:?}")));
        }
    }
    let table = match (s("schema-name"), s("table-name")) {
        (Some(ns), Some(t)) => format!("{ns}.{t}"),
        _ => {
            return Err(input_error(position, None, None, "DMS record without schema-name/table-name"));
        }
    };
    let txid = meta.get("transaction-id").filter(|v| !v.is_null()).map(|v| match v {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    });
    let op = match s("operation") {
        Some("insert") => RowOp::Insert,
        Some("load") => RowOp::SnapshotRead,
        Some("update") => RowOp::Update,
        Some("delete") => RowOp::Delete,
        other => {
            return Err(input_error(
                position,
                Some(&table),
                txid.as_deref(),
                format!("unknown DMS operation {other:?}"),
            ));
        }
    };
    let commit_us = s("commit-timestamp").or_else(|| s("timestamp")).and_then(super::types::parse_timestamp);
    let data = json.get("data").and_then(object_columns);
    let before_image = json.get("before-image").and_then(object_columns);
    let (before, after) = match op {
        RowOp::Delete => (data, None),
        RowOp::Update => (before_image, data),
        _ => (None, data),
    };
    Ok(ChangeRecord::Row(RowChange {
        table: table.into(),
        op,
        key: None,
        before,
        after,
        txid: txid.map(SmolStr::from),
        commit_us,
        snapshot: (op == RowOp::SnapshotRead).then(|| SmolStr::new_static("true")),
        declared: None,
        key_names: None,
        in_transaction_block: false,
        omits_nulls: true,
        typed: None,
    }))
}
