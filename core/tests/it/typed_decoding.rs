//! Typed decoding (`fovea_core::cdc::typed`) against the general path: the
//! same lines replayed both ways give the same tables (rows and column
//! types), the same applied identities and the same errors. Lines are
//! decoded a window ahead of the sink, as the file source's decoder
//! threads do, so rows read against a definition an earlier line then
//! changed take the way back to the general path.

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::sync::Arc;

use fovea_core::cdc::ddl::parse_ddl;
use fovea_core::cdc::typed::{CurrentTables, TypedTables};
use fovea_core::cdc::{ChangeRecord, InputFormat, SourcePosition, decode_line, decode_owned_line};
use fovea_core::location::{OpenMode, open_lake};
use fovea_core::sink::{Sink, SinkConfig};
use fovea_core::{Engine, EngineConfig, SnapshotTables, Value};

/// What a replay left: each table's columns (name and type) and sorted
/// rows, the identities applied, and the first error (with its line).
#[derive(Debug, PartialEq)]
struct Outcome {
    tables: BTreeMap<String, (Vec<String>, Vec<Vec<Value>>)>,
    identities: HashSet<String>,
    error: Option<String>,
}

/// Replays `lines`; with `ahead`, decodes them typed, that many lines
/// before the sink applies them. Returns the outcome and how many rows
/// reached the sink typed.
fn replay(lines: &[String], config: SinkConfig, ahead: Option<usize>) -> (Outcome, usize) {
    let dir = tempfile::tempdir().unwrap();
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "test", config).unwrap();
    let engine: Arc<dyn CurrentTables> = lake.engine.clone();
    let mut typed_tables = TypedTables::new(engine);
    let positions: Vec<(SourcePosition, SourcePosition)> = {
        let mut offset = 0;
        lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let pos = SourcePosition { line: i as u64 + 1, offset };
                offset += l.len() as u64 + 1;
                (pos, SourcePosition { line: i as u64 + 1, offset })
            })
            .collect()
    };
    let mut typed_rows = 0;
    let mut error = None;
    let window = ahead.unwrap_or(1);
    'outer: for (lines, positions) in lines.chunks(window).zip(positions.chunks(window)) {
        let decoded: Vec<_> = lines
            .iter()
            .zip(positions)
            .map(|(l, (pos, _))| match ahead {
                Some(_) => decode_owned_line(l.clone().into(), *pos, InputFormat::Auto, Some(&mut typed_tables)),
                None => decode_line(l, *pos, InputFormat::Auto),
            })
            .collect();
        for (record, (pos, next)) in decoded.into_iter().zip(positions) {
            let applied = record.and_then(|r| {
                if matches!(&r, ChangeRecord::Row(row) if row.typed.is_some()) {
                    typed_rows += 1;
                }
                sink.push(r, *pos, *next)
            });
            if let Err(e) = applied {
                error = Some(e.to_string());
                break 'outer;
            }
        }
    }
    if error.is_none() {
        let end = positions.last().map_or_else(SourcePosition::default, |p| p.1);
        if let Err(e) = sink.finish_input(end) {
            error = Some(e.to_string());
        }
    }
    drop(sink);
    let outcome =
        Outcome { tables: visible(&lake.engine), identities: lake.catalog.applied_identities(1 << 20).unwrap(), error };
    (outcome, typed_rows)
}

/// Every table's columns (name and type) and visible rows.
fn visible(engine: &Arc<Engine>) -> BTreeMap<String, (Vec<String>, Vec<Vec<Value>>)> {
    let mut rows = super::sink::visible(engine);
    engine
        .at(engine.snapshot())
        .tables()
        .iter()
        .map(|t| {
            let columns = t.schema.fields().iter().map(|f| format!("{} {}", f.name(), f.data_type())).collect();
            (t.name.clone(), (columns, rows.remove(&t.name).unwrap_or_default()))
        })
        .collect()
}

/// Replays `lines` on the general path and typed with several windows;
/// asserts the outcomes are equal and returns the general one and the
/// most rows any typed run took typed.
fn same_both_ways(lines: &[String], config: impl Fn() -> SinkConfig) -> (Outcome, usize) {
    let (reference, none) = replay(lines, config(), None);
    assert_eq!(none, 0);
    let mut most = 0;
    for ahead in [1, 3, 64] {
        let (typed, n) = replay(lines, config(), Some(ahead));
        assert_eq!(typed, reference, "decoded typed {ahead} lines ahead");
        most = most.max(n);
    }
    (reference, most)
}

fn pg_tiny(file: &str) -> Vec<String> {
    let path = crate::package_dir().join("../tests/data/pg-tiny").join(file);
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()).read_to_string(&mut s).unwrap();
    s.lines().map(str::to_owned).collect()
}

#[test]
fn a_real_postgresql_stream_replays_the_same_typed() {
    let lines = pg_tiny("debezium_events.jsonl.gz");
    let schema = crate::package_dir().join("../tests/data/pg-tiny/schema.sql");
    let ddl = parse_ddl(&std::fs::read_to_string(schema).unwrap()).unwrap();
    let (outcome, typed) = same_both_ways(&lines, SinkConfig::default);
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    // Most rows of the stream go typed (a table's first row cannot).
    let rows = lines.iter().filter(|l| l.contains("\"op\":")).count();
    assert!(typed * 10 >= rows * 9, "{typed} of {rows} rows typed");
    let (with_ddl, _) = same_both_ways(&lines, || SinkConfig { ddl: ddl.clone(), ..SinkConfig::default() });
    assert!(with_ddl.error.is_none(), "{:?}", with_ddl.error);
}

/// A Kafka-style Debezium record of table `public.t` (key `id`).
fn rec(txid: u64, op: &str, key: &str, before: &str, after: &str) -> String {
    format!(
        r#"{{"topic":"s.public.t","key":{key},"value":{{"before":{before},"after":{after},"source":{{"schema":"public","table":"t","txId":{txid},"snapshot":"false"}},"op":"{op}"}}}}"#
    )
}

fn snapshot_rec(id: i64, after: &str, marker: &str) -> String {
    format!(
        r#"{{"topic":"s.public.t","key":{{"id":{id}}},"value":{{"before":null,"after":{after},"source":{{"schema":"public","table":"t","txId":1,"snapshot":"{marker}"}},"op":"r"}}}}"#
    )
}

#[test]
fn schema_changes_values_and_markers_replay_the_same_typed() {
    let unavailable = fovea_core::cdc::debezium::UNAVAILABLE;
    let mut lines = vec![
        snapshot_rec(1, r#"{"id":1,"a":"x","n":1,"t":"2024-01-02T03:04:05Z"}"#, "first"),
        snapshot_rec(2, r#"{"id":2,"a":"y","n":2,"t":"2024-01-02T03:04:05.5Z"}"#, "true"),
        snapshot_rec(3, r#"{"id":3,"a":"\u00e9\n","n":null,"t":null}"#, "last"),
        // Columns in another order, escaped names and text.
        rec(2, "c", r#"{"id":4}"#, "null", r#"{"n":4,"id":4,"\u0061":"q\"uote","t":null}"#),
        // An update whose key is only in the after image (no Kafka key).
        rec(3, "u", "null", "null", r#"{"id":1,"a":"x2","n":10,"t":null}"#),
        // An unchanged TOAST value keeps the previous one.
        rec(4, "u", r#"{"id":2}"#, "null", &format!(r#"{{"id":2,"a":"{unavailable}","n":20,"t":null}}"#)),
        // A delete with its key in the before image only.
        rec(5, "d", "null", r#"{"id":3,"a":null,"n":null,"t":null}"#, "null"),
        // Numbers as text, text as numbers.
        rec(6, "c", r#"{"id":5}"#, "null", r#"{"id":5,"a":5,"n":"5","t":null}"#),
        rec(6, "c", r#"{"id":6}"#, "null", r#"{"id":6,"a":"z","n":7,"t":null}"#),
        // A column appears, and one goes.
        rec(7, "c", r#"{"id":7}"#, "null", r#"{"id":7,"a":"w","n":1,"t":null,"b":true}"#),
        rec(8, "c", r#"{"id":8}"#, "null", r#"{"id":8,"n":1,"t":null,"b":false}"#),
        // An object value, rendered as text where the column is text.
        rec(9, "c", r#"{"id":9}"#, "null", r#"{"id":9,"n":9,"t":{"x":[1,2]},"b":null}"#),
    ];
    // Enough plain updates that most rows go typed.
    for i in 0..200 {
        lines.push(rec(
            100 + i,
            "u",
            r#"{"id":4}"#,
            "null",
            &format!(r#"{{"id":4,"n":"{i}","t":"2024-02-0{}","b":true}}"#, i % 9 + 1),
        ));
    }
    replays_typed(&lines, SinkConfig::default, 200, &["id Int64", "n Int64", "t Utf8", "b Boolean"], 8);
}

/// Asserts that `lines` replay the same both ways without an error, at
/// least `typed` rows typed, and leave `public.t` with `columns` and `rows` rows.
fn replays_typed(lines: &[String], config: impl Fn() -> SinkConfig, typed: usize, columns: &[&str], rows: usize) {
    let (outcome, n) = same_both_ways(lines, config);
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert!(n >= typed, "{n} rows typed");
    let (got, visible) = &outcome.tables["public.t"];
    assert_eq!(got, columns);
    assert_eq!(visible.len(), rows);
}

#[test]
fn declared_columns_widen_the_same_typed() {
    let ddl = parse_ddl("CREATE TABLE public.t (id bigint PRIMARY KEY, small integer, d date, amount numeric(6,2));")
        .unwrap();
    // Transaction `txid` writes row `id` with these values.
    let row = |txid: u64, op: &str, id: u64, small: &str, d: &str, amount: &str| {
        rec(
            txid,
            op,
            &format!(r#"{{"id":{id}}}"#),
            "null",
            &format!(r#"{{"id":{id},"small":{small},"d":"{d}","amount":"{amount}"}}"#),
        )
    };
    let mut lines: Vec<String> =
        (0..100).map(|i| row(i + 1, "c", i, &i.to_string(), "2024-01-02", &format!("{i}.25"))).collect();
    // Values their declared types do not hold (a date with a time is read as its day).
    lines.push(row(200, "u", 1, "5000000000", "2024-01-02", "1.25"));
    lines.push(row(201, "u", 2, "2", "2024-01-02T03:04:05Z", "1.25"));
    lines.push(row(202, "u", 3, "3", "2024-01-02", "123456789.25"));
    lines.extend((0..100).map(|i| row(300 + i, "u", i, &i.to_string(), "2024-01-03", &format!("{i}.5"))));
    let config = || SinkConfig { ddl: ddl.clone(), ..SinkConfig::default() };
    replays_typed(&lines, config, 150, &["id Int64", "small Int64", "d Date32", "amount Decimal128(11, 2)"], 100);
}

/// Debezium writes PostgreSQL's `infinity` and `-infinity` as numbers of
/// its own: the JDBC driver's sentinels in a `MicroTimestamp` (µs) and a
/// `Timestamp` (ms) alike, the extremes in a `NanoTimestamp`, the epoch
/// days of ±5877611-06-21/22 in a `Date`. They are stored as PostgreSQL's
/// infinities (printed `infinity`, ordered after and before every value),
/// typed or not; a millisecond one is no longer an out-of-range error.
#[test]
fn debezium_infinities_are_postgresqls_infinities() {
    use fovea_core::cdc::types::{DATE_INFINITY, TIMESTAMP_INFINITY, format_date, format_timestamp};
    let ddl = parse_ddl("CREATE TABLE public.t (id bigint PRIMARY KEY, valid_to timestamp, valid_from date);").unwrap();
    let row = |txid: u64, id: u64, us: &str, days: &str| {
        let after = format!(r#"{{"id":{id},"valid_to":{us},"valid_from":{days}}}"#);
        rec(txid, "c", &format!(r#"{{"id":{id}}}"#), "null", &after)
    };
    let mut lines: Vec<String> =
        (0..50).map(|i| row(i + 1, i, &(1_700_000_000_000_000 + i).to_string(), &(19_000 + i).to_string())).collect();
    lines.push(row(100, 100, "9223372036825200000", "2146033979"));
    lines.push(row(101, 101, "-9223372036832400000", "-2147472692"));
    // The positive date of the Debezium versions before it fixed its sign.
    lines.push(row(102, 102, "0", "-2147472693"));
    // With a schema: the timestamp in ms or ns.
    let with_schema = |txid: u64, id: u64, unit: &str, ts: &str, days: &str| {
        format!(
            r#"{{"schema":{{"type":"struct","fields":[{{"field":"before","type":"struct","optional":true,"fields":[]}},{{"field":"after","type":"struct","optional":true,"fields":[{{"field":"id","type":"int64"}},{{"field":"valid_to","type":"int64","optional":true,"name":"io.debezium.time.{unit}"}},{{"field":"valid_from","type":"int32","optional":true,"name":"io.debezium.time.Date"}}]}}]}},"payload":{{"before":null,"after":{{"id":{id},"valid_to":{ts},"valid_from":{days}}},"op":"c","source":{{"schema":"public","table":"t","txId":{txid}}}}}}}"#
        )
    };
    lines.push(with_schema(103, 103, "Timestamp", "9223372036825200000", "2146033979"));
    lines.push(with_schema(104, 104, "Timestamp", "-9223372036832400000", "-2147472692"));
    lines.push(with_schema(105, 105, "NanoTimestamp", "9223372036854775807", "1"));
    lines.push(with_schema(106, 106, "NanoTimestamp", "-9223372036854775808", "1"));
    lines.push(with_schema(107, 107, "Timestamp", "1700000000123", "19000"));
    lines.push(with_schema(108, 108, "NanoTimestamp", "1700000000123456789", "19000"));
    let config = || SinkConfig { ddl: ddl.clone(), ..SinkConfig::default() };
    let (outcome, typed) = same_both_ways(&lines, config);
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert!(typed >= 50, "{typed} rows typed");
    let (_, rows) = &outcome.tables["public.t"];
    let column = |id: i64, c: usize| match rows.iter().find(|r| r[0] == Value::Int(id)).map(|r| &r[c]) {
        Some(Value::Int(v)) => *v,
        other => panic!("row {id}: {other:?}"),
    };
    let (valid_to, valid_from) = (|id| column(id, 1), |id| column(id, 2));
    for (id, want) in [(100, "infinity"), (101, "-infinity"), (103, "infinity"), (104, "-infinity"), (105, "infinity")]
    {
        assert_eq!(format_timestamp(valid_to(id)), want, "row {id}");
    }
    assert_eq!((valid_to(100), valid_to(101), valid_to(106)), (TIMESTAMP_INFINITY, i64::MIN, i64::MIN));
    for (id, want) in [(100, "infinity"), (101, "-infinity"), (102, "infinity"), (103, "infinity"), (104, "-infinity")]
    {
        assert_eq!(format_date(valid_from(id)), want, "row {id}");
    }
    assert_eq!(valid_from(100), i64::from(DATE_INFINITY));
    assert_eq!((valid_to(107), valid_to(108)), (1_700_000_000_123_000, 1_700_000_000_123_456));
    assert_eq!((valid_to(7), valid_from(7)), (1_700_000_000_000_007, 19_007));
}

#[test]
fn errors_are_the_same_typed() {
    let base = || {
        vec![
            rec(1, "c", r#"{"id":1}"#, "null", r#"{"id":1,"a":"x"}"#),
            rec(1, "c", r#"{"id":2}"#, "null", r#"{"id":2,"a":"y"}"#),
        ]
    };
    let cases: Vec<Vec<String>> = vec![
        // Inserting a key that exists.
        vec![rec(2, "c", r#"{"id":1}"#, "null", r#"{"id":1,"a":"z"}"#)],
        // A key of another type.
        vec![rec(2, "u", r#"{"id":"one"}"#, "null", r#"{"id":1,"a":"z"}"#)],
        // Malformed images.
        vec![rec(2, "u", r#"{"id":1}"#, "null", r#"{"id":1,"a":[}"#)],
        vec![rec(2, "c", r#"{"id":3}"#, "null", "7")],
        // A key that is no object, where an insert does not need it.
        vec![rec(2, "c", "5", "null", r#"{"id":3,"a":"z"}"#)],
        // An insert with an unchanged TOAST marker.
        vec![rec(2, "c", r#"{"id":3}"#, "null", r#"{"id":3,"a":"__debezium_unavailable_value"}"#)],
        // A delete of a key with no value.
        vec![rec(2, "d", r#"{"id":null}"#, "null", "null")],
        // An update of a key that has no row.
        vec![rec(2, "u", r#"{"id":9}"#, "null", r#"{"id":9,"a":"z"}"#)],
    ];
    for case in cases {
        let lines: Vec<String> = base().into_iter().chain(case).collect();
        let (outcome, _) = same_both_ways(&lines, SinkConfig::default);
        assert!(outcome.error.is_some(), "{lines:?} replayed without an error");
    }
    // Odd images that are no error: whatever they do, both ways do it.
    let odd = [
        // A before image that is no object.
        rec(2, "u", r#"{"id":1}"#, "[1]", r#"{"id":1,"a":"z"}"#),
        // A column named twice.
        rec(2, "c", r#"{"id":3}"#, "null", r#"{"id":3,"a":"z","a":"w"}"#),
        rec(2, "u", r#"{"id":1}"#, r#"{"id":1,"id":2}"#, r#"{"id":1,"a":"z"}"#),
    ];
    for line in odd {
        let lines: Vec<String> = base().into_iter().chain([line]).collect();
        same_both_ways(&lines, SinkConfig::default);
    }
}

#[test]
fn dms_and_debezium_lines_detected_per_line_replay_the_same_typed() {
    let dms = |op: &str, txn: u64, data: &str| {
        format!(
            r#"{{"data":{data},"metadata":{{"timestamp":"2026-11-30T10:00:00.000000Z","record-type":"data","operation":"{op}","partition-key-type":"schema-table","schema-name":"public","table-name":"acct","transaction-id":{txn},"commit-timestamp":"2026-11-30T10:00:00.000000Z"}}}}"#
        )
    };
    let ddl = parse_ddl("CREATE TABLE public.acct (id int PRIMARY KEY, name text, bal numeric(10,2));").unwrap();
    let mut lines = Vec::new();
    // Inserts, then updates: each a DMS record and a Debezium record of a
    // table with a column named `metadata` (Debezium, not DMS).
    let steps = [("insert", "c", r#""{\"record-type\":\"data\"}""#), ("update", "u", "null")];
    for (step, (dms_op, op, metadata)) in (0u64..).zip(steps) {
        for i in 0..50 {
            let data = format!(r#"{{"id":{i},"name":"n{step}.{i}","bal":"{i}.{step}5"}}"#);
            lines.push(dms(dms_op, 10 + step * 100 + i, &data));
            let after = format!(r#"{{"id":{i},"metadata":{metadata}}}"#);
            lines.push(rec(1000 + step * 100 + i, op, &format!(r#"{{"id":{i}}}"#), "null", &after));
        }
    }
    let (outcome, typed) = same_both_ways(&lines, || SinkConfig { ddl: ddl.clone(), ..SinkConfig::default() });
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert!(typed >= 90, "{typed} Debezium rows typed");
    assert_eq!(outcome.tables["public.acct"].1.len(), 50);
    assert_eq!(outcome.tables["public.t"].0, ["id Int64", "metadata Utf8"]);
}

/// Debezium's primary-key change: a delete of the old key, a tombstone and
/// a create of the new key whose unchanged out-of-line values are
/// placeholders. The row moves to the new key with the old key's values,
/// also when the delete ends a chunk of a large transaction, and twice in
/// one transaction.
#[test]
fn a_key_change_keeps_unchanged_toast_values() {
    let unavailable = fovea_core::cdc::debezium::UNAVAILABLE;
    let tombstone = |id: i64| format!(r#"{{"topic":"s.public.t","key":{{"id":{id}}},"value":null}}"#);
    let mut lines: Vec<String> = (1..=4)
        .map(|i| rec(1, "c", &format!(r#"{{"id":{i}}}"#), "null", &format!(r#"{{"id":{i},"a":"big-{i}","n":{i}}}"#)))
        .collect();
    let change = |txid: u64, from: i64, to: i64, n: i64| {
        [
            rec(txid, "d", &format!(r#"{{"id":{from}}}"#), &format!(r#"{{"id":{from},"a":null,"n":null}}"#), "null"),
            tombstone(from),
            rec(
                txid,
                "c",
                &format!(r#"{{"id":{to}}}"#),
                "null",
                &format!(r#"{{"id":{to},"a":"{unavailable}","n":{n}}}"#),
            ),
        ]
    };
    lines.extend(change(2, 1, 10, 100));
    // An update first: with chunks of two rows, the delete ends a chunk.
    lines.push(rec(3, "u", r#"{"id":2}"#, "null", r#"{"id":2,"a":"big-2b","n":2}"#));
    lines.extend(change(3, 2, 20, 200));
    lines.extend(change(3, 20, 21, 210));
    // A plain key change without placeholders stays a delete and an insert.
    lines.push(rec(4, "d", r#"{"id":3}"#, r#"{"id":3,"a":null,"n":null}"#, "null"));
    lines.push(tombstone(3));
    lines.push(rec(4, "c", r#"{"id":30}"#, "null", r#"{"id":30,"a":"new","n":300}"#));
    let want = |id: i64, a: &str, n: i64| vec![Value::Int(id), Value::Utf8(a.into()), Value::Int(n)];
    for chunk_rows in [2, 1 << 14] {
        let config = || SinkConfig { chunk_rows, ..SinkConfig::default() };
        let (outcome, _) = same_both_ways(&lines, config);
        assert!(outcome.error.is_none(), "chunks of {chunk_rows}: {:?}", outcome.error);
        let mut rows = outcome.tables["public.t"].1.clone();
        rows.sort_by_key(|r| match r[0] {
            Value::Int(id) => id,
            _ => i64::MIN,
        });
        assert_eq!(
            rows,
            vec![want(4, "big-4", 4), want(10, "big-1", 100), want(21, "big-2b", 210), want(30, "new", 300)],
            "chunks of {chunk_rows}"
        );
    }
    // A create with placeholders after a delete of another table, or with
    // a row between, has no old row to take them from.
    let mut apart = lines[..4].to_vec();
    apart.push(rec(2, "d", r#"{"id":1}"#, r#"{"id":1,"a":null,"n":null}"#, "null"));
    apart.push(rec(2, "u", r#"{"id":2}"#, "null", r#"{"id":2,"a":"x","n":2}"#));
    apart.push(rec(2, "c", r#"{"id":10}"#, "null", &format!(r#"{{"id":10,"a":"{unavailable}","n":1}}"#)));
    let (outcome, _) = same_both_ways(&apart, SinkConfig::default);
    assert!(outcome.error.as_deref().is_some_and(|e| e.contains("no previous value to keep")), "{:?}", outcome.error);
}

/// A decoder reads a Kafka record's after image in its one pass against
/// the table the record's topic last named. Topics routed otherwise than
/// one per table (several tables in one topic, a table moving to another
/// topic) and records the typed path does not read after such a guess
/// (an unchanged-TOAST marker, a column added) replay the same as on the
/// general path.
#[test]
fn records_of_topics_named_otherwise_than_by_table_replay_the_same_typed() {
    let unavailable = fovea_core::cdc::debezium::UNAVAILABLE;
    let record = |topic: &str, table: &str, txid: u64, op: &str, id: u64, after: &str| {
        format!(
            r#"{{"topic":"{topic}","key":{{"id":{id}}},"value":{{"before":null,"after":{after},"source":{{"schema":"public","table":"{table}","txId":{txid},"snapshot":"false"}},"op":"{op}"}}}}"#
        )
    };
    let mut lines = Vec::new();
    for i in 0..60u64 {
        // Two tables of different columns, interleaved in one topic.
        lines.push(record("all", "t", i + 1, "c", i, &format!(r#"{{"id":{i},"a":"t{i}"}}"#)));
        lines.push(record("all", "u", i + 1, "c", i, &format!(r#"{{"id":{i},"n":{i},"b":true}}"#)));
        // Two of the same columns, interleaved in another.
        lines.push(record("same", "v", i + 1, "c", i, &format!(r#"{{"id":{i},"a":"v{i}"}}"#)));
        lines.push(record("same", "w", i + 1, "c", i, &format!(r#"{{"id":{i},"a":"w{i}"}}"#)));
    }
    for i in 0..60u64 {
        let txid = 100 + i;
        // Runs of one table per topic, then the table moves topic.
        let topic = if i < 30 { "t-first" } else { "t-then" };
        lines.push(record(topic, "t", txid, "u", i, &format!(r#"{{"id":{i},"a":"t{i}b"}}"#)));
        // An unchanged TOAST value now and then, a column added halfway.
        let a = if i % 7 == 3 { unavailable.to_owned() } else { format!("v{i}b") };
        let after = match i {
            _ if i >= 40 => format!(r#"{{"id":{i},"a":"{a}","c":{i}}}"#),
            _ => format!(r#"{{"id":{i},"a":"{a}"}}"#),
        };
        lines.push(record("same", "v", txid, "u", i, &after));
    }
    let (outcome, typed) = same_both_ways(&lines, SinkConfig::default);
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert!(typed >= 300, "{typed} rows typed");
    let rows = |t: &str| outcome.tables[t].1.clone();
    assert_eq!((rows("public.t").len(), rows("public.u").len(), rows("public.w").len()), (60, 60, 60));
    assert_eq!(outcome.tables["public.v"].0, ["id Int64", "a Utf8", "c Int64"]);
    let v = rows("public.v");
    let a = |id: i64| v.iter().find(|r| r[0] == Value::Int(id)).map(|r| r[1].clone());
    // A TOAST marker kept the value before it.
    let text = |s: &str| Some(Value::Utf8(s.into()));
    assert_eq!((a(3), a(4), a(45), a(46)), (text("v3"), text("v4b"), text("v45"), text("v46b")));
}

/// Kafka keys and before images where they name a row: in any field
/// order, changing the key, with or without each other, in a schema
/// envelope.
#[test]
fn kafka_keys_and_before_images_replay_the_same_typed() {
    let value = |txid: u64, op: &str, before: &str, after: &str| {
        format!(
            r#"{{"before":{before},"after":{after},"source":{{"schema":"public","table":"t","txId":{txid},"snapshot":"false"}},"op":"{op}"}}"#
        )
    };
    let row = |id: u64, a: &str| format!(r#"{{"id":{id},"a":"{a}","n":{id}}}"#);
    let mut lines: Vec<String> =
        (0..50).map(|i| rec(1, "c", &format!(r#"{{"id":{i}}}"#), "null", &row(i, "x"))).collect();
    for i in 0..50u64 {
        let txid = 10 + i;
        let key = format!(r#"{{"id":{i}}}"#);
        let before = row(i, "x");
        lines.push(match i % 7 {
            // Key and before image (REPLICA IDENTITY FULL).
            0 => rec(txid, "u", &key, &before, &row(i, "full")),
            // The key after the value, or before the topic.
            1 => {
                format!(r#"{{"topic":"s.public.t","value":{},"key":{key}}}"#, value(txid, "u", "null", &row(i, "late")))
            }
            2 => format!(
                r#"{{"key":{key},"topic":"s.public.t","value":{}}}"#,
                value(txid, "u", "null", &row(i, "early"))
            ),
            // A key change: the key, or the before image alone, names the
            // old key; the key wins over the before image.
            3 => rec(txid, "u", &key, "null", &row(i + 100, "moved")),
            4 => rec(txid, "u", r#"{"other":1}"#, &before, &row(i + 200, "moved")),
            5 => rec(txid, "u", &key, &row(i + 1, "x"), &row(i + 300, "moved")),
            // A delete by key and before image.
            _ => rec(txid, "d", &key, &before, "null"),
        });
    }
    // Last (each sends the topic's next records down the general path): a
    // key in a schema envelope, which the general path unwraps, and a delete
    // by its before image alone.
    // (The enveloped key names row 7, moved to 50.)
    lines.push(format!(
        r#"{{"topic":"s.public.t","key":{{"schema":{{"type":"struct"}},"payload":{{"id":7}}}},"value":{}}}"#,
        value(100, "u", "null", &row(50, "enveloped"))
    ));
    lines.push(format!(r#"{{"topic":"s.public.t","key":null,"value":{}}}"#, value(101, "d", &row(8, "x"), "null")));
    let (outcome, typed) = same_both_ways(&lines, SinkConfig::default);
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert!(typed >= 95, "{typed} rows typed");
    let rows = &outcome.tables["public.t"].1;
    let a = |id: i64| rows.iter().find(|r| r[0] == Value::Int(id)).map(|r| r[1].clone());
    let text = |s: &str| Some(Value::Utf8(s.into()));
    assert_eq!((a(0), a(1), a(2), a(7), a(50)), (text("full"), text("late"), text("early"), None, text("enveloped")));
    assert_eq!(
        (a(3), a(103), a(4), a(204), a(5), a(305)),
        (None, text("moved"), None, text("moved"), None, text("moved"))
    );
    assert_eq!((a(6), a(8), a(13)), (None, None, None));
}
