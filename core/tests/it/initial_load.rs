//! Initial loads (snapshot records without transaction ids, as Debezium
//! and DMS full loads produce) through the sink as production runs it:
//! runs larger than many chunks that create tables mid-way survive the
//! process, one file per table is one load each, a file read again is
//! skipped, a re-snapshot replaces rows, `--schema-file` tables exist empty.

use std::collections::BTreeMap;
use std::path::Path;

use fovea_core::cdc::ddl::parse_ddl;
use fovea_core::cdc::{InputFormat, SourcePosition, decode_line};
use fovea_core::location::{OpenMode, open_lake};
use fovea_core::schema::rows_from_batch;
use fovea_core::sink::{Sink, SinkConfig, SinkStats};
use fovea_core::{EngineConfig, ScanOptions, Value};

const DDL: &str = "CREATE TABLE public.checking (id bigint PRIMARY KEY, owner text, balance bigint);
CREATE TABLE public.savings (id bigint PRIMARY KEY, owner text, balance bigint);
CREATE TABLE public.transfer (id bigint PRIMARY KEY, owner text, balance bigint);
CREATE TABLE public.audit (id bigint PRIMARY KEY, owner text, balance bigint);";

/// A Debezium snapshot record as a Kafka record (the key names the
/// primary key), no transaction id.
fn snapshot_record(table: &str, id: i64, balance: i64, ts_ms: i64, marker: &str) -> String {
    format!(
        r#"{{"topic":"srv.public.{table}","key":{{"id":{id}}},"value":{{"before":null,"after":{{"id":{id},"owner":"o{id}","balance":{balance}}},"source":{{"connector":"postgresql","name":"srv","ts_ms":{ts_ms},"snapshot":"{marker}","db":"bank","schema":"public","table":"{table}"}},"op":"r","ts_ms":{ts_ms}}}}}"#
    )
}

/// A Debezium change record of source transaction `txid`.
fn change_record(table: &str, op: &str, id: i64, balance: i64, txid: u64) -> String {
    let image = format!(r#"{{"id":{id},"owner":"o{id}","balance":{balance}}}"#);
    let (before, after) = match op {
        "d" => (image.as_str(), "null"),
        "c" => ("null", image.as_str()),
        _ => (image.as_str(), image.as_str()),
    };
    format!(
        r#"{{"before":{before},"after":{after},"source":{{"connector":"postgresql","name":"srv","ts_ms":1700000100000,"snapshot":"false","db":"bank","schema":"public","table":"{table}","txId":{txid}}},"op":"{op}"}}"#
    )
}

/// A snapshot of `tables` (`(name, rows)`), balances `balance(id)`.
fn snapshot_run(tables: &[(&str, i64)], ts_ms: i64, balance: impl Fn(i64) -> i64) -> Vec<String> {
    let total: i64 = tables.iter().map(|t| t.1).sum();
    let mut out = Vec::new();
    for (table, rows) in tables {
        for id in 0..*rows {
            let marker = match out.len() as i64 {
                0 => "first",
                n if n == total - 1 => "last",
                _ => "true",
            };
            out.push(snapshot_record(table, id, balance(id), ts_ms, marker));
        }
    }
    out
}

fn config(chunk_rows: usize) -> SinkConfig {
    SinkConfig { chunk_rows, ddl: parse_ddl(DDL).unwrap(), ..SinkConfig::default() }
}

/// Replays `lines` as input `name` into the lake at `dir` in a process-like
/// scope of its own (engine, sink and pool dropped at the end).
fn replay(dir: &Path, name: &str, lines: &[String], config: SinkConfig, shards: usize) -> SinkStats {
    let lake = open_lake(dir, EngineConfig::default().with_shards(shards), OpenMode::Write).unwrap();
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), name, config).unwrap();
    let mut offset = 0;
    for (i, l) in lines.iter().enumerate() {
        let pos = SourcePosition { line: i as u64 + 1, offset };
        offset += l.len() as u64 + 1;
        let next = SourcePosition { line: i as u64 + 2, offset };
        sink.push(decode_line(l, pos, InputFormat::Auto).unwrap(), pos, next).unwrap();
    }
    sink.finish_input(SourcePosition { line: lines.len() as u64 + 1, offset }).unwrap();
    sink.stats()
}

/// Every table of the lake at `dir` as a fresh reader sees it: id → balance.
fn tables(dir: &Path) -> BTreeMap<String, BTreeMap<i64, i64>> {
    let lake = open_lake(dir, EngineConfig::default(), OpenMode::Read).unwrap();
    let snap = lake.engine.snapshot();
    lake.engine
        .tables()
        .iter()
        .map(|t| {
            let mut rows = BTreeMap::new();
            for b in lake.engine.scan(&snap, &t.name, ScanOptions::default()).unwrap().collect_batches().unwrap() {
                for r in rows_from_batch(&b).unwrap() {
                    let (Value::Int(id), Value::Int(balance)) = (&r[0], &r[2]) else { panic!("row {r:?}") };
                    assert!(rows.insert(*id, *balance).is_none(), "{}: key {id} twice", t.name);
                }
            }
            (t.name.clone(), rows)
        })
        .collect()
}

/// Compares lakes table by table, naming the first difference (the maps are
/// too big to print).
#[track_caller]
fn assert_same(got: &BTreeMap<String, BTreeMap<i64, i64>>, want: &BTreeMap<String, BTreeMap<i64, i64>>) {
    let names = |m: &BTreeMap<String, BTreeMap<i64, i64>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(got), names(want), "tables");
    for (t, rows) in want {
        let g = &got[t];
        let diff = rows.iter().find(|(k, v)| g.get(k) != Some(v)).map(|(k, v)| (*k, *v, g.get(k).copied()));
        assert!(
            diff.is_none() && g.len() == rows.len(),
            "{t}: {} rows, want {}; first difference (key, want, got): {diff:?}",
            g.len(),
            rows.len()
        );
    }
}

fn expect(tables: &[(&str, i64)], balance: impl Fn(i64) -> i64) -> BTreeMap<String, BTreeMap<i64, i64>> {
    let mut out: BTreeMap<String, BTreeMap<i64, i64>> =
        tables.iter().map(|(t, n)| (format!("public.{t}"), (0..*n).map(|id| (id, balance(id))).collect())).collect();
    for t in ["public.checking", "public.savings", "public.transfer", "public.audit"] {
        out.entry(t.to_owned()).or_default();
    }
    out
}

const LOAD: [(&str, i64); 3] = [("checking", 3000), ("savings", 3000), ("transfer", 20_000)];

#[test]
fn multi_table_load_over_many_chunks_survives_the_process() {
    for (shards, declared) in [(1, true), (2, true), (1, false), (2, false)] {
        let dir = tempfile::tempdir().unwrap();
        // Without a schema file the tables are created by the load itself,
        // between its chunks.
        let config = if declared { config(1000) } else { SinkConfig { chunk_rows: 1000, ..SinkConfig::default() } };
        let stats = replay(dir.path(), "load", &snapshot_run(&LOAD, 1_700_000_000_000, |id| id * 10), config, shards);
        assert_eq!((stats.applied, stats.rows), (1, 26_000));
        // A fresh reader: every table of the load (and the declared, empty
        // `audit`) with every row.
        let mut want = expect(&LOAD, |id| id * 10);
        if !declared {
            want.remove("public.audit");
        }
        eprintln!("{shards} shards, declared: {declared}");
        assert_same(&tables(dir.path()), &want);
    }
}

/// Loads each table of [`LOAD`] from a file of its own; each replay must
/// count `(applied, skipped)`.
fn load_one_file_per_table(dir: &Path, each: (u64, u64)) {
    for (i, table) in LOAD.iter().enumerate() {
        let run = snapshot_run(&[*table], 1_700_000_000_000, |id| id);
        let stats = replay(dir, &format!("file-{i}"), &run, config(1000), 2);
        assert_eq!((stats.applied, stats.skipped), each, "{}", table.0);
    }
}

#[test]
fn one_file_per_table_is_one_load_each() {
    let dir = tempfile::tempdir().unwrap();
    // Every file starts at byte 0: the same position as the others.
    load_one_file_per_table(dir.path(), (1, 0));
    assert_same(&tables(dir.path()), &expect(&LOAD, |id| id));
}

#[test]
fn a_load_read_again_is_skipped_and_a_resnapshot_replaces_rows() {
    let dir = tempfile::tempdir().unwrap();
    let load = snapshot_run(&LOAD, 1_700_000_000_000, |id| id);
    replay(dir.path(), "first", &load, config(1000), 2);
    // Changes after the load.
    let changes = vec![
        change_record("checking", "u", 1, 111, 900),
        change_record("savings", "d", 2, 2, 901),
        change_record("audit", "c", 7, 70, 902),
    ];
    replay(dir.path(), "changes", &changes, config(1000), 2);
    let mut want = expect(&LOAD, |id| id);
    want.get_mut("public.checking").unwrap().insert(1, 111);
    want.get_mut("public.savings").unwrap().remove(&2);
    want.get_mut("public.audit").unwrap().insert(7, 70);
    assert_same(&tables(dir.path()), &want);

    // The same load again, under another name (nothing to resume): skipped,
    // the changes made since stay.
    let stats = replay(dir.path(), "again", &load, config(1000), 2);
    assert_eq!((stats.applied, stats.skipped), (0, 1));
    // Doubled within one input: load, changes, load, changes.
    let doubled: Vec<String> = [&load, &changes, &load, &changes].into_iter().flatten().cloned().collect();
    let stats = replay(dir.path(), "doubled", &doubled, config(1000), 2);
    assert_eq!((stats.applied, stats.skipped), (0, 8));
    assert_same(&tables(dir.path()), &want);

    // A re-snapshot by the connector later (new source time, rows as they
    // are now): existing keys are replaced, not refused, not skipped.
    let resnapshot = snapshot_run(&LOAD, 1_700_000_500_000, |id| id + 5);
    let stats = replay(dir.path(), "resnapshot", &resnapshot, config(1000), 2);
    assert_eq!((stats.applied, stats.skipped), (1, 0));
    let mut want = expect(&LOAD, |id| id + 5);
    want.get_mut("public.audit").unwrap().insert(7, 70);
    assert_same(&tables(dir.path()), &want);
}

#[test]
fn dms_full_loads_in_two_files_are_two_loads() {
    let dms = |table: &str, id: i64| {
        format!(
            r#"{{"data":{{"id":{id},"owner":"o{id}","balance":{id}}},"metadata":{{"timestamp":"2026-11-30T10:00:00.000000Z","record-type":"data","operation":"load","partition-key-type":"primary-key","schema-name":"public","table-name":"{table}"}}}}"#
        )
    };
    let dir = tempfile::tempdir().unwrap();
    for table in ["checking", "savings"] {
        let lines: Vec<String> = (0..2500).map(|id| dms(table, id)).collect();
        let stats = replay(dir.path(), table, &lines, config(1000), 2);
        assert_eq!((stats.applied, stats.skipped), (1, 0), "{table}");
    }
    assert_same(&tables(dir.path()), &expect(&[("checking", 2500), ("savings", 2500)], |id| id));
}

#[test]
fn declared_tables_exist_empty_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let stats = replay(dir.path(), "empty", &[], config(1000), 1);
    assert_eq!(stats.applied, 0);
    assert_same(&tables(dir.path()), &expect(&[], |id| id));
}

#[test]
fn a_table_loaded_alone_then_inside_a_bigger_load_is_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    // `checking` alone, then the whole load: `checking` is not applied
    // again, the other tables are.
    replay(dir.path(), "alone", &snapshot_run(&LOAD[..1], 1_700_000_000_000, |id| id), config(1000), 2);
    let changes = vec![change_record("checking", "u", 1, 111, 900)];
    replay(dir.path(), "changes", &changes, config(1000), 2);
    let stats = replay(dir.path(), "all", &snapshot_run(&LOAD, 1_700_000_000_000, |id| id), config(1000), 2);
    assert_eq!((stats.applied, stats.skipped), (1, 0));
    let mut want = expect(&LOAD, |id| id);
    want.get_mut("public.checking").unwrap().insert(1, 111);
    assert_same(&tables(dir.path()), &want);
    // And every table again, one file each: all skipped.
    load_one_file_per_table(dir.path(), (0, 1));
    assert_same(&tables(dir.path()), &want);
}
