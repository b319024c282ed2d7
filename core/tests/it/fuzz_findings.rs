//! Inputs the fuzz targets (fuzz/, `scripts/fuzz.sh`) found panicking,
//! each now an error naming what is wrong.

use std::sync::Arc;

use fovea_core::cdc::pgoutput::{Lsn, PgOutputDecoder};
use fovea_core::cdc::{InputFormat, SourcePosition, decode_line};

fn decode_error(line: &str, format: InputFormat) -> String {
    match decode_line(line, SourcePosition { line: 7, offset: 0 }, format) {
        Ok(r) => panic!("decoded {r:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_commit_time_beyond_i64_microseconds_is_an_error() {
    let e = decode_error(
        r#"{"status": "BEGIN", "id": "31245:126004", "event_count": null, "ts_ms": 1796021796028009442}"#,
        InputFormat::Debezium,
    );
    assert!(e.contains("ts_ms 1796021796028009442 is out of range") && e.contains("line 7"), "{e}");
    let e = decode_error(
        r#"{"before": null, "after": {"id": 1}, "source": {"schema": "public", "table": "t", "txId": 5, "ts_ms": 9223372036854775807}, "op": "c"}"#,
        InputFormat::Debezium,
    );
    assert!(e.contains("out of range") && e.contains("public.t"), "{e}");
}

#[test]
fn a_dms_timestamp_with_an_absurd_offset_is_an_error() {
    let line = r#"{"data": {"id": 1}, "metadata": {"timestamp": "2026-01-01T00:00:00.000000Z", "record-type": "data", "operation": "insert", "partition-key-type": "schema-table", "schema-name": "public", "table-name": "t", "transaction-id": 4242, "commit-timestamp": "2026-01-01T00:00:00.0000055555+5555555555555"}}"#;
    // Not a timestamp: refused (before, the offset's arithmetic overflowed).
    let _ = decode_line(line, SourcePosition { line: 1, offset: 0 }, InputFormat::Dms);
}

#[test]
fn a_date_with_an_absurd_year_is_no_date() {
    // Found by the dms target (10M-execution run): the year's day
    // arithmetic overflowed.
    let line = r#"{"data": {"id": 1}, "metadata": {"timestamp": "204444444444444426-01-01T+0:00:0tabe-name0.000000Z", "record-type": "data", "operation": "insert", "partition-key-type": "schematable", "schema-name": "public", "table-name": "t"}}"#;
    let _ = decode_line(line, SourcePosition { line: 1, offset: 0 }, InputFormat::Dms);
    assert_eq!(fovea_core::cdc::types::parse_date("204444444444444426-01-01"), None);
    assert_eq!(fovea_core::cdc::types::parse_timestamp("7000000-01-01 00:00:00"), None);
    assert!(fovea_core::cdc::types::parse_date("5000000-01-01").is_some());
}

#[test]
fn a_pgoutput_commit_time_beyond_i64_microseconds_is_an_error() {
    let data = include_bytes!("fuzz/pgoutput_commit_time.bin");
    let mut decoder = PgOutputDecoder::new();
    let (mut rest, mut lsn, mut errors) = (&data[..], 1, Vec::new());
    while let Some((&len, tail)) = rest.split_first() {
        let (message, next) = tail.split_at((len as usize).min(tail.len()));
        if let Err(e) = decoder.decode(Lsn(lsn), message) {
            errors.push(e.to_string());
        }
        lsn += 1;
        rest = next;
    }
    assert!(errors.iter().any(|e| e.contains("commit time") && e.contains("out of range")), "{errors:?}");
}

/// The error of running a split task (JSON) over an empty lake.
fn split_task_error(json: &str) -> String {
    let task: fovea_core::split::SplitTask = serde_json::from_str(json).unwrap();
    let lake = fovea_core::lake::Lake::new(Arc::new(object_store::memory::InMemory::new()));
    task.scan(lake).err().expect("malformed rows refused").to_string()
}

#[test]
fn a_split_task_with_malformed_inline_rows_is_an_error() {
    let e = split_task_error(include_str!("fuzz/split_task_malformed_ipc.json"));
    assert!(e.contains("rows:"), "{e}");
}

#[test]
fn a_split_task_declaring_a_huge_ipc_body_is_an_error_not_an_allocation() {
    let e = split_task_error(include_str!("fuzz/split_task_huge_body.json"));
    assert!(e.contains("rows:"), "{e}");
}
