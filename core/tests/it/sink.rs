//! The sink on every input shape: Kafka records and bare values, with and
//! without BEGIN/END, records before their BEGIN, DMS, and big transactions
//! streamed in chunks. Final tables are compared with PostgreSQL's.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use fovea_core::cdc::ddl::parse_ddl;
use fovea_core::cdc::{InputFormat, SourcePosition, decode_line};
use fovea_core::location::{OpenMode, open_lake};
use fovea_core::schema::rows_from_batch;
use fovea_core::sink::{Sink, SinkConfig};
use fovea_core::{Engine, EngineConfig, ScanOptions, SnapshotTables, Value};

fn data() -> PathBuf {
    crate::package_dir().join("../tests/data/pg-tiny")
}

fn lines(file: &str) -> Vec<String> {
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(data().join(file)).unwrap()).read_to_string(&mut s).unwrap();
    s.lines().map(str::to_owned).collect()
}

fn row_counts() -> BTreeMap<String, usize> {
    std::fs::read_to_string(data().join("final_tables/row_counts.txt"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut it = l.split_whitespace();
            (it.next().unwrap().to_owned(), it.next().unwrap().parse().unwrap())
        })
        .collect()
}

fn ddl() -> SinkConfig {
    SinkConfig {
        ddl: parse_ddl(&std::fs::read_to_string(data().join("schema.sql")).unwrap()).unwrap(),
        ..SinkConfig::default()
    }
}

/// Replays `lines` into a fresh lake; returns the engine and its tables' visible rows.
fn run(lines: &[String], format: InputFormat, config: SinkConfig) -> (Arc<Engine>, BTreeMap<String, Vec<Vec<Value>>>) {
    let dir = tempfile::tempdir().unwrap();
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "test", config).unwrap();
    let mut offset = 0;
    for (i, l) in lines.iter().enumerate() {
        let pos = SourcePosition { line: i as u64 + 1, offset };
        offset += l.len() as u64 + 1;
        let next = SourcePosition { line: i as u64 + 1, offset };
        sink.push(decode_line(l, pos, format).unwrap(), pos, next).unwrap();
    }
    sink.finish_input(SourcePosition { line: lines.len() as u64, offset }).unwrap();
    let tables = visible(&lake.engine);
    std::mem::forget(dir);
    (lake.engine, tables)
}

/// Every table at the newest snapshot with its rows (canonical order).
pub(crate) fn visible(engine: &Arc<Engine>) -> BTreeMap<String, Vec<Vec<Value>>> {
    let snap = engine.snapshot();
    engine
        .at(snap.clone())
        .tables()
        .iter()
        .map(|t| {
            let mut rows: Vec<Vec<Value>> = engine
                .scan(&snap, &t.name, ScanOptions::default())
                .unwrap()
                .collect_batches()
                .unwrap()
                .iter()
                .flat_map(|b| rows_from_batch(b).unwrap())
                .collect();
            rows.sort_by_cached_key(|r| format!("{r:?}"));
            (t.name.clone(), rows)
        })
        .collect()
}

fn counts(tables: &BTreeMap<String, Vec<Vec<Value>>>) -> BTreeMap<String, usize> {
    tables.iter().map(|(t, r)| (t.clone(), r.len())).collect()
}

#[test]
fn bare_values_without_transaction_records_group_by_txid() {
    // Only the `value` of each data record: no BEGIN/END, no keys (the DDL has them).
    let bare: Vec<String> = lines("debezium_events.jsonl.gz")
        .iter()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let value = &v["value"];
            (!value.is_null() && value.get("status").is_none()).then(|| value.to_string())
        })
        .collect();
    let (_, grouped) = run(&bare, InputFormat::Debezium, ddl());
    assert_eq!(counts(&grouped), row_counts());
    let (_, reference) = run(&lines("debezium_events.jsonl.gz"), InputFormat::Auto, ddl());
    assert_eq!(grouped, reference, "grouping by txId gives the same tables as BEGIN/END");
}

#[test]
fn enveloped_bare_values_use_their_schema() {
    let bare: Vec<String> = lines("debezium_events.precise_schemas.jsonl.gz")
        .iter()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (!v["value"].is_null()).then(|| v["value"].to_string())
        })
        .collect();
    // Bare values carry no key: the DDL supplies keys (and types).
    let (_, with_ddl) = run(&bare, InputFormat::Auto, ddl());
    let (_, reference) =
        run(&lines("debezium_events.precise_schemas.jsonl.gz"), InputFormat::Auto, SinkConfig::default());
    for (t, rows) in &reference {
        for (a, b) in with_ddl[t].iter().zip(rows) {
            assert_eq!(a, b, "table {t}");
        }
        assert_eq!(with_ddl[t].len(), rows.len(), "table {t}");
    }
}

#[test]
fn records_before_their_begin_are_held() {
    let mut moved = Vec::new();
    let mut pending_begin: Option<String> = None;
    for l in lines("debezium_events.jsonl.gz") {
        if l.contains("\"status\":\"BEGIN\"") {
            pending_begin = Some(l);
        } else {
            moved.push(l);
            if let Some(b) = pending_begin.take() {
                moved.push(b);
            }
        }
    }
    let (_, tables) = run(&moved, InputFormat::Auto, SinkConfig::default());
    let (_, reference) = run(&lines("debezium_events.jsonl.gz"), InputFormat::Auto, SinkConfig::default());
    assert_eq!(tables, reference);
}

#[test]
fn a_big_transaction_streams_in_chunks_and_stays_invisible_until_its_end() {
    let all = lines("debezium_events.jsonl.gz");
    // The first transaction has 211 events: with chunks of 16 it is applied
    // in 14 pieces before its END arrives.
    let end = all.iter().position(|l| l.contains("\"status\":\"END\"")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    let mut sink = Sink::new(
        lake.engine.clone(),
        lake.catalog.clone(),
        "t",
        SinkConfig { chunk_rows: 16, ..SinkConfig::default() },
    )
    .unwrap();
    for (i, l) in all[..end].iter().enumerate() {
        let pos = SourcePosition { line: i as u64 + 1, offset: i as u64 };
        sink.push(decode_line(l, pos, InputFormat::Auto).unwrap(), pos, pos).unwrap();
    }
    sink.sync().unwrap();
    assert!(sink.stats().rows > 150, "chunks were applied: {:?}", sink.stats());
    // Not even the tables it creates.
    assert_eq!(visible(&lake.engine), BTreeMap::new(), "nothing of an unfinished transaction is visible");
    assert!(matches!(
        lake.engine.scan(&lake.engine.snapshot(), "public.pgbench_accounts", ScanOptions::default()),
        Err(fovea_core::Error::UnknownTable(_))
    ));
    let pos = SourcePosition { line: end as u64 + 1, offset: end as u64 };
    sink.push(decode_line(&all[end], pos, InputFormat::Auto).unwrap(), pos, pos).unwrap();
    sink.sync().unwrap();
    let after = visible(&lake.engine);
    assert_eq!(after["public.pgbench_accounts"].len(), 200);
    assert_eq!(after["public.pgbench_tellers"].len(), 10);
}

#[test]
fn dms_records_replay_with_transaction_boundaries() {
    let rec = |op: &str, txn: u64, data: &str, before: Option<&str>| {
        let b = before.map(|b| format!(r#","before-image":{b}"#)).unwrap_or_default();
        format!(
            r#"{{"data":{data},"metadata":{{"timestamp":"2026-11-30T10:00:00.000000Z","record-type":"data","operation":"{op}","partition-key-type":"schema-table","schema-name":"public","table-name":"acct","transaction-id":{txn},"commit-timestamp":"2026-11-30T10:00:00.000000Z"}}{b}}}"#
        )
    };
    let lines = vec![
        r#"{"metadata":{"record-type":"control","operation":"create-table","schema-name":"public","table-name":"acct"}}"#.to_owned(),
        rec("load", 1, r#"{"id":1,"name":"a","bal":"10.50"}"#, None),
        rec("load", 1, r#"{"id":2,"name":"b","bal":"3"}"#, None),
        rec("insert", 7, r#"{"id":3,"name":"c","bal":"1.25"}"#, None),
        rec("update", 7, r#"{"id":1,"name":"a","bal":"9.25"}"#, Some(r#"{"id":1,"name":"a","bal":"10.50"}"#)),
        rec("delete", 8, r#"{"id":2,"name":"b","bal":"3"}"#, None),
        rec("update", 9, r#"{"id":4,"name":"c2","bal":"1.25"}"#, Some(r#"{"id":3,"name":"c","bal":"1.25"}"#)),
    ];
    let config = SinkConfig {
        ddl: parse_ddl("CREATE TABLE public.acct (id int PRIMARY KEY, name text, bal numeric(10,2));").unwrap(),
        ..SinkConfig::default()
    };
    let (engine, tables) = run(&lines, InputFormat::Auto, config);
    assert_eq!(
        tables["public.acct"],
        vec![
            vec![Value::Int(1), Value::Utf8("a".into()), Value::Decimal(925)],
            vec![Value::Int(4), Value::Utf8("c2".into()), Value::Decimal(125)],
        ]
    );
    // The schema file's table (created by a mirror transaction of its own),
    // the load, then transactions 7, 8 and 9: five mirror transactions
    // (timestamps start at 1 in a new lake).
    assert_eq!(engine.clock().latest().get(), 5);
}

/// DMS leaves NULL columns out of a record unless `IncludeNullAndEmpty` is
/// set (its default is false): a missing column is NULL in that row, not a
/// column dropped; later values of the column are kept. A value that does
/// not fit its column's type (the source widened it, e.g. `ALTER COLUMN …
/// TYPE bigint`, which DMS does not describe) widens the column in place
/// when the wider type is a widening.
#[test]
fn dms_records_without_null_columns_and_widened_values_replay_exact() {
    let rec = |op: &str, txn: u64, data: &str| {
        format!(
            r#"{{"data":{data},"metadata":{{"timestamp":"2026-11-30T10:00:00.000000Z","record-type":"data","operation":"{op}","partition-key-type":"schema-table","schema-name":"public","table-name":"acct","transaction-id":{txn},"commit-timestamp":"2026-11-30T10:00:00.000000Z"}}}}"#
        )
    };
    let lines = vec![
        rec("insert", 1, r#"{"id":1,"name":"a","n":5}"#),
        // name is NULL: DMS leaves it out.
        rec("insert", 2, r#"{"id":2,"n":6}"#),
        rec("insert", 3, r#"{"id":3,"name":"c","n":7}"#),
        // A column added in the source (DMS control records say so, or not).
        r#"{"metadata":{"record-type":"control","operation":"add-column","schema-name":"public","table-name":"acct"}}"#
            .to_owned(),
        rec("insert", 4, r#"{"id":4,"name":"d","n":8,"extra":"x"}"#),
        // n became bigint in the source.
        rec("update", 5, r#"{"id":1,"name":"a","n":5000000000}"#),
    ];
    let config = SinkConfig {
        ddl: parse_ddl("CREATE TABLE public.acct (id int PRIMARY KEY, name text, n int);").unwrap(),
        ..SinkConfig::default()
    };
    let (engine, tables) = run(&lines, InputFormat::Auto, config);
    let text = |s: &str| Value::Utf8(s.into());
    assert_eq!(
        tables["public.acct"],
        vec![
            vec![Value::Int(1), text("a"), Value::Int(5_000_000_000), Value::Null],
            vec![Value::Int(2), Value::Null, Value::Int(6), Value::Null],
            vec![Value::Int(3), text("c"), Value::Int(7), Value::Null],
            vec![Value::Int(4), text("d"), Value::Int(8), text("x")],
        ]
    );
    let def = engine.table("public.acct").unwrap();
    assert_eq!(def.schema.field(2).data_type(), &arrow::datatypes::DataType::Int64);
}

/// A transaction that adds a column and then fails (a value that does not
/// fit) leaves no trace: snapshots and the checkpoint written after the
/// failure keep the columns of before, and so does the lake reopened.
#[test]
fn a_failed_transaction_leaves_no_schema_change_behind() {
    let rec = |txid: u64, after: &str| {
        format!(
            r#"{{"topic":"s.public.t","key":{{"id":{id}}},"value":{{"before":null,"after":{after},"source":{{"schema":"public","table":"t","txId":{txid}}},"op":"c"}}}}"#,
            id = serde_json::from_str::<serde_json::Value>(after).unwrap()["id"]
        )
    };
    let good = [rec(1, r#"{"id":1,"a":"x"}"#), rec(1, r#"{"id":2,"a":"y"}"#)];
    // Column b appears (as a number), then a row whose b is no number.
    let failing = [rec(2, r#"{"id":3,"a":"z","b":30}"#), rec(2, r#"{"id":4,"a":"w","b":"forty"}"#)];
    let columns =
        |def: &fovea_core::TableDef| -> Vec<String> { def.schema.fields().iter().map(|f| f.name().clone()).collect() };
    let dir = tempfile::tempdir().unwrap();
    {
        let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
        let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "t", SinkConfig::default()).unwrap();
        let mut line = 0;
        let mut push = |sink: &mut Sink, l: &String| {
            line += 1;
            let pos = SourcePosition { line, offset: line };
            sink.push(decode_line(l, pos, InputFormat::Auto).unwrap(), pos, pos)
        };
        for l in &good {
            push(&mut sink, l).unwrap();
        }
        push(&mut sink, &failing[0]).unwrap();
        let err = push(&mut sink, &failing[1]).and_then(|()| sink.sync()).unwrap_err().to_string();
        assert!(err.contains("public.t") && err.contains('b'), "{err}");
        // The writer evolved the table; no snapshot shows it.
        assert_eq!(columns(&lake.engine.table("public.t").unwrap()), ["id", "a", "b"]);
        let snapshot = lake.engine.at(lake.engine.snapshot());
        assert_eq!(columns(&snapshot.tables()[0]), ["id", "a"]);
        assert_eq!(
            visible(&lake.engine)["public.t"],
            [[Value::Int(1), Value::Utf8("x".into())], [Value::Int(2), Value::Utf8("y".into())]]
        );
        sink.maybe_checkpoint(SourcePosition { line: 9, offset: 9 }, true).unwrap();
    }
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    assert_eq!(columns(&lake.engine.table("public.t").unwrap()), ["id", "a"]);
    assert_eq!(visible(&lake.engine)["public.t"].len(), 2);
}

#[test]
fn schema_changes_evolve_the_table_and_old_rows_read_null() {
    let rec = |txid: u64, op: &str, after: &str| {
        format!(
            r#"{{"topic":"s.public.t","key":{{"id":{id}}},"value":{{"before":null,"after":{after},"source":{{"schema":"public","table":"t","txId":{txid}}},"op":"{op}"}}}}"#,
            id = serde_json::from_str::<serde_json::Value>(after).unwrap()["id"]
        )
    };
    let lines = [
        rec(1, "c", r#"{"id":1,"a":"x"}"#),
        rec(1, "c", r#"{"id":2,"a":"y"}"#),
        // Column b appears.
        rec(2, "c", r#"{"id":3,"a":"z","b":30}"#),
        rec(2, "u", r#"{"id":1,"a":"x2","b":10}"#),
        // Column a disappears.
        rec(3, "c", r#"{"id":4,"b":40}"#),
    ];
    let dir = tempfile::tempdir().unwrap();
    {
        let lake = open_lake(dir.path(), EngineConfig::default().with_blocks(4096, 1), OpenMode::Write).unwrap();
        let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "t", SinkConfig::default()).unwrap();
        for (i, l) in lines.iter().enumerate() {
            let pos = SourcePosition { line: i as u64 + 1, offset: i as u64 };
            sink.push(decode_line(l, pos, InputFormat::Auto).unwrap(), pos, pos).unwrap();
        }
        sink.finish_input(SourcePosition { line: 9, offset: 9 }).unwrap();
        lake.engine.flush().unwrap();
        lake.engine.combine().unwrap();
        let expect = vec![
            vec![Value::Int(1), Value::Int(10)],
            vec![Value::Int(2), Value::Null],
            vec![Value::Int(3), Value::Int(30)],
            vec![Value::Int(4), Value::Int(40)],
        ];
        assert_eq!(visible(&lake.engine)["public.t"], expect);
        let ops = lake.catalog.operations(10).unwrap();
        assert!(ops.iter().any(|(_, o)| o.description == "evolve schema of public.t"), "{ops:?}");
    }
    // And after a restart from the checkpoint.
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    let names: Vec<_> =
        lake.engine.table("public.t").unwrap().schema.fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(names, ["id", "b"]);
    assert_eq!(visible(&lake.engine)["public.t"].len(), 4);
    assert_eq!(visible(&lake.engine)["public.t"][1], vec![Value::Int(2), Value::Null]);
}

/// A checkpoint failing in the background is reported by the next call,
/// before that call applies anything: an error from `push` always means
/// its record was not applied. A caller keeps the position of the record
/// that failed and a final checkpoint resumes there, so it never resumes
/// at the END of a transaction that was committed (which the next run
/// would refuse as an END without BEGIN).
#[test]
fn a_checkpoint_failing_in_the_background_is_reported_before_a_record_is_applied() {
    use fovea_core::cdc::ChangeRecord;
    use fovea_core::faults::FaultPlan;
    use fovea_core::lease::DEFAULT_LEASE_TTL;
    use fovea_core::location::{LakeBackends, open};

    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::parse("seed=1,checkpoints=1").unwrap();
    let backends = plan.inject(LakeBackends::local(dir.path()).unwrap());
    let lake = open(backends, EngineConfig::default(), OpenMode::Write, DEFAULT_LEASE_TTL).unwrap();
    // A checkpoint after every transaction, written in the background.
    let config = SinkConfig { checkpoint_txns: 1, ..SinkConfig::default() };
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "test", config).unwrap();
    let mut offset = 0;
    let mut failed = None;
    for (i, l) in lines("debezium_events.jsonl.gz").iter().enumerate() {
        let pos = SourcePosition { line: i as u64 + 1, offset };
        offset += l.len() as u64 + 1;
        let next = SourcePosition { line: i as u64 + 2, offset };
        let record = decode_line(l, pos, InputFormat::Auto).unwrap();
        if matches!(record, ChangeRecord::End { .. }) {
            // The checkpoint started at the last END has failed by now:
            // the failure is there to be noticed while this END applies.
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let applied = sink.stats().applied;
        match sink.push(record, pos, next) {
            Ok(()) => {}
            Err(e) => {
                assert_eq!(sink.stats().applied, applied, "line {}: failed, yet its transaction was applied", pos.line);
                failed = Some((pos, e.to_string()));
                break;
            }
        }
    }
    let (at, error) = failed.expect("no push reported the failed checkpoints");
    assert!(error.contains("writing checkpoint object"), "line {}: {error}", at.line);
    assert_eq!(sink.stats().checkpoints, 0, "a checkpoint was committed although every write failed");
}

/// Debezium's BEGIN, `records` (of tables in schema `public`) and END of
/// transaction `txid`, with the END's counts.
fn debezium_txn(txid: u64, records: Vec<String>) -> Vec<String> {
    let mut per_table = BTreeMap::new();
    for r in &records {
        let table = r.split("\"table\":\"").nth(1).unwrap().split('"').next().unwrap();
        *per_table.entry(format!("public.{table}")).or_insert(0) += 1;
    }
    let collections: Vec<String> =
        per_table.iter().map(|(t, n)| format!(r#"{{"data_collection":"{t}","event_count":{n}}}"#)).collect();
    let mut out = vec![format!(r#"{{"topic":"s.transaction","key":null,"value":{{"status":"BEGIN","id":"{txid}"}}}}"#)];
    out.extend(records.iter().cloned());
    out.push(format!(
        r#"{{"topic":"s.transaction","key":null,"value":{{"status":"END","id":"{txid}","event_count":{},"data_collections":[{}]}}}}"#,
        records.len(),
        collections.join(",")
    ));
    out
}

/// A table without a primary key whose updates and deletes name their
/// row by its whole old image (PostgreSQL's REPLICA IDENTITY FULL, through
/// Debezium: a null Kafka key), driven through the sink against a naive
/// multiset of rows after every transaction: equal rows, transactions
/// larger than a chunk, rows inserted and changed in one transaction, and
/// a second sink (a restart) that finds the rows again from the lake.
/// A row no live row equals is refused, naming the table; a run's first
/// such change after rows of the table its transaction handed on already
/// finds them.
#[test]
fn a_table_without_a_key_changes_rows_by_their_whole_old_image() {
    let image = |(a, b): (i64, &str)| format!(r#"{{"a":{a},"b":"{b}"}}"#);
    let rec = |txid: u64, op: &str, before: Option<(i64, &str)>, after: Option<(i64, &str)>| {
        let (before, after) = (before.map_or("null".into(), image), after.map_or("null".into(), image));
        format!(
            r#"{{"topic":"s.public.log","key":null,"value":{{"before":{before},"after":{after},"source":{{"schema":"public","table":"log","txId":{txid}}},"op":"{op}","transaction":{{"id":"{txid}"}}}}}}"#
        )
    };
    const B: [&str; 2] = ["x", "y"];
    let dir = tempfile::tempdir().unwrap();
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    let config = || SinkConfig { chunk_rows: 4, ..SinkConfig::default() };
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "test", config()).unwrap();
    let line = std::cell::Cell::new(0u64);
    let push = |sink: &mut Sink, lines: Vec<String>| -> Result<(), String> {
        for l in lines {
            line.set(line.get() + 1);
            let line = line.get();
            let pos = SourcePosition { line, offset: line };
            sink.push(decode_line(&l, pos, InputFormat::Auto).unwrap(), pos, pos).map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    let mut model: Vec<(i64, &str)> = Vec::new();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for txid in 1..=120u64 {
        if txid == 60 {
            // A restart: the new sink knows nothing of the table's rows.
            sink.finish_input(SourcePosition { line: line.get(), offset: line.get() }).unwrap();
            sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "test", config()).unwrap();
        }
        let mut records = Vec::new();
        let mut txn_model = model.clone();
        // A run's first change by an old image comes in a transaction not
        // larger than a chunk: one inserted in it, and (after the restart)
        // one the new sink finds in the lake.
        if txid == 1 || txid == 60 {
            records.push(rec(txid, "c", None, Some((7, "x"))));
            if let Some(&m) = txn_model.first() {
                records.push(rec(txid, "u", Some(m), Some((m.0 + 1, m.1))));
                txn_model[0] = (m.0 + 1, m.1);
            }
            records.push(rec(txid, "d", Some((7, "x")), None));
        }
        // Mostly small transactions; now and then one larger than a chunk.
        let size = if next() % 8 == 0 { 9 } else { 1 + next() % 4 };
        for _ in 0..size {
            let r = next();
            let row = ((r % 4) as i64, B[(r >> 8) as usize % 2]);
            let found = txn_model.iter().position(|&m| m == row);
            match (r >> 16) % 3 {
                0 => {
                    records.push(rec(txid, "c", None, Some(row)));
                    txn_model.push(row);
                }
                1 if found.is_some() => {
                    let new = (row.0 + 1, B[(r >> 24) as usize % 2]);
                    records.push(rec(txid, "u", Some(row), Some(new)));
                    txn_model[found.unwrap()] = new;
                }
                2 if found.is_some() => {
                    records.push(rec(txid, "d", Some(row), None));
                    txn_model.remove(found.unwrap());
                }
                _ => {
                    records.push(rec(txid, "c", None, Some(row)));
                    txn_model.push(row);
                }
            }
        }
        push(&mut sink, debezium_txn(txid, records)).unwrap_or_else(|e| panic!("transaction {txid}: {e}"));
        model = txn_model;
        sink.sync().unwrap();
        let mut rows: Vec<(i64, String)> = visible(&lake.engine)
            .remove("public.log")
            .unwrap_or_default()
            .into_iter()
            .map(|r| match &r[..] {
                [Value::Int(a), Value::Utf8(b), Value::Int(_)] => (*a, b.clone()),
                other => panic!("row {other:?}"),
            })
            .collect();
        rows.sort();
        let mut expected: Vec<(i64, String)> = model.iter().map(|&(a, b)| (a, b.to_owned())).collect();
        expected.sort();
        assert_eq!(rows, expected, "after transaction {txid}");
    }
    let absent = (99, "x");
    let err = push(&mut sink, debezium_txn(200, vec![rec(200, "d", Some(absent), None)])).unwrap_err();
    assert!(err.contains("public.log") && err.contains("no live row equals the old image"), "{err}");

    // A new run whose first such change comes after more than a chunk of
    // the table's rows in its transaction, handed on already: the map is
    // built from what the transaction wrote so far too.
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "test", config()).unwrap();
    let mut records: Vec<String> = (0..6).map(|_| rec(201, "c", None, Some((50, "x")))).collect();
    records.push(rec(201, "d", Some((50, "x")), None));
    records.push(rec(201, "u", Some((50, "x")), Some((60, "y"))));
    push(&mut sink, debezium_txn(201, records)).unwrap();
    sink.sync().unwrap();
    let log = &visible(&lake.engine)["public.log"];
    let count = |a: i64, b: &str| log.iter().filter(|r| r[..2] == [Value::Int(a), Value::Utf8(b.into())]).count();
    assert_eq!((count(50, "x"), count(60, "y")), (4, 1));
    assert_eq!(log.len(), model.len() + 5);
}

/// A truncate of a table larger than a chunk streams its deletes through
/// the shards in chunks, with the new rows of its transaction after them;
/// a truncate of a table the mirror does not have deletes nothing. Also
/// for a table without a key (its hidden row ids go on past the old ones).
/// Rows of the table earlier in the truncate's transaction go with it,
/// also when more than a chunk of them was handed on already.
#[test]
fn a_truncate_larger_than_a_chunk_leaves_only_the_rows_after_it() {
    let rec = |table: &str, txid: u64, op: &str, id: u64| {
        let (key, after) = match (table, op) {
            (_, "t") => ("null".to_owned(), String::new()),
            ("log", _) => ("null".to_owned(), format!(r#""before":null,"after":{{"v":{id}}},"#)),
            _ => (format!(r#"{{"id":{id}}}"#), format!(r#""before":null,"after":{{"id":{id},"v":{id}}},"#)),
        };
        format!(
            r#"{{"topic":"s.public.{table}","key":{key},"value":{{{after}"source":{{"schema":"public","table":"{table}","txId":{txid}}},"op":"{op}","transaction":{{"id":"{txid}"}}}}}}"#
        )
    };
    let txn = debezium_txn;
    let mut lines = txn(1, (1..=20).flat_map(|i| [rec("t", 1, "c", i), rec("log", 1, "c", i)]).collect());
    let mut second = vec![rec("t", 2, "t", 0), rec("gone", 2, "t", 0), rec("log", 2, "t", 0)];
    second.extend([rec("t", 2, "c", 7), rec("t", 2, "c", 30), rec("log", 2, "c", 99)]);
    lines.extend(txn(2, second));
    // Rows of the table before its truncate in one transaction go too.
    lines.extend(txn(3, vec![rec("log", 3, "c", 70), rec("t", 3, "c", 50), rec("t", 3, "t", 0), rec("t", 3, "c", 60)]));
    let config = || SinkConfig { chunk_rows: 3, ..SinkConfig::default() };
    let (engine, tables) = run(&lines, InputFormat::Auto, config());
    assert_eq!(tables["public.t"], vec![vec![Value::Int(60), Value::Int(60)]]);
    // (In the order `visible` sorts rows: by their text.)
    assert_eq!(tables["public.log"], vec![vec![Value::Int(70), Value::Int(22)], vec![Value::Int(99), Value::Int(21)]]);
    assert!(engine.table("public.gone").is_err());

    // More than a chunk of them, handed on before the truncate, in a table
    // the transaction creates: gone too.
    let mut records: Vec<String> = (80..85).map(|i| rec("new", 4, "c", i)).collect();
    records.extend([rec("new", 4, "t", 0), rec("new", 4, "c", 90)]);
    lines.extend(txn(4, records));
    let (_, tables) = run(&lines, InputFormat::Auto, config());
    assert_eq!(tables["public.new"], vec![vec![Value::Int(90), Value::Int(90)]]);
}

/// Remembers the checkpoints it was told of; fails the first `fail` calls.
#[derive(Debug, Default)]
struct Recording {
    published: std::sync::Mutex<Vec<u64>>,
    calls: std::sync::atomic::AtomicUsize,
    fail: usize,
}

impl fovea_core::sink::CheckpointPublisher for Recording {
    fn publish(&self, checkpoint: &fovea_core::catalog::CheckpointRecord) -> Result<(), String> {
        // Relaxed: counted on the checkpoint writer threads, one at a time.
        if self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < self.fail {
            return Err("the store said no".into());
        }
        self.published.lock().unwrap().push(checkpoint.manifest.checkpoint_ts);
        Ok(())
    }
}

/// With a publish interval the publisher is told of the first checkpoint,
/// of none within the interval, and of the last (waited for, as at a stop)
/// whatever the interval; a failed publication is made again by the next
/// checkpoint. Every checkpoint is committed either way.
#[test]
fn publications_keep_their_interval_and_the_last_checkpoint_is_published() {
    let all = lines("debezium_events.jsonl.gz");
    for fail in [0, 1] {
        let dir = tempfile::tempdir().unwrap();
        let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
        let publisher = Arc::new(Recording { fail, ..Recording::default() });
        let config = SinkConfig {
            publisher: Some(Arc::clone(&publisher) as Arc<dyn fovea_core::sink::CheckpointPublisher>),
            publish_interval: std::time::Duration::from_secs(3600),
            checkpoint_txns: u64::MAX,
            ..ddl()
        };
        let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "test", config).unwrap();
        let mut offset = 0;
        let mut committed = Vec::new();
        for (i, l) in all.iter().enumerate() {
            let pos = SourcePosition { line: i as u64 + 1, offset };
            offset += l.len() as u64 + 1;
            let next = SourcePosition { line: i as u64 + 1, offset };
            sink.push(decode_line(l, pos, InputFormat::Auto).unwrap(), pos, next).unwrap();
            if i % 200 == 199 && sink.start_checkpoint(next, &mut |_| Ok(None)).unwrap() {
                while sink.checkpoint_in_flight() {
                    sink.poll_checkpoint().unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                committed.push(lake.catalog.latest_checkpoint().unwrap().unwrap().manifest.checkpoint_ts);
            }
        }
        sink.finish_input(SourcePosition { line: all.len() as u64, offset }).unwrap();
        let last = lake.catalog.latest_checkpoint().unwrap().unwrap().manifest.checkpoint_ts;
        assert!(committed.len() >= 3, "{committed:?}");
        let published = publisher.published.lock().unwrap().clone();
        // The first (or, after a failure, the next), and the last.
        let expected = vec![committed[fail], last];
        assert_eq!(published, expected, "fail {fail}: committed {committed:?}, last {last}");
        assert_eq!(sink.stats().publish_failures, fail as u64);
    }
}
