//! A large initial load through `fovea replay`, as a user runs it: Debezium
//! snapshot records without transaction ids, three tables in one run larger
//! than two 64K-row chunks (the second and third tables start after the
//! first chunk), with a schema file. Every table is checked after the
//! process exits, from fresh processes (`fovea sql`, `fovea export`); then
//! the same load as one file per table; then a re-snapshot.

use std::io::Write;
use std::path::Path;

use crate::common::{fovea, ok};

const SCHEMA: &str = "CREATE TABLE public.checking (id bigint PRIMARY KEY, owner text, balance bigint);
CREATE TABLE public.savings (id bigint PRIMARY KEY, owner text, balance bigint);
CREATE TABLE public.transfer (id bigint PRIMARY KEY, owner text, balance bigint);
CREATE TABLE public.audit (id bigint PRIMARY KEY, owner text, balance bigint);";

/// The load: `checking` alone fills the first chunk.
const LOAD: [(&str, i64); 3] = [("checking", 70_000), ("savings", 10_000), ("transfer", 80_000)];

/// Writes snapshot records of `tables` (balance = id + `bump`) to `path`.
fn write_load(path: &Path, tables: &[(&str, i64)], ts_ms: i64, bump: i64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for (table, rows) in tables {
        for id in 0..*rows {
            writeln!(
                f,
                r#"{{"before":null,"after":{{"id":{id},"owner":"o{id}","balance":{b}}},"source":{{"connector":"postgresql","name":"bank","ts_ms":{ts_ms},"snapshot":"true","db":"bank","schema":"public","table":"{table}"}},"op":"r","ts_ms":{ts_ms}}}"#,
                b = id + bump
            )
            .unwrap();
        }
    }
}

fn replay(lake: &Path, input: &Path, schema: &Path) -> String {
    ok(fovea()
        .arg("replay")
        .arg("--lake")
        .arg(lake)
        .arg("--input")
        .arg(input)
        .arg("--schema-file")
        .arg(schema)
        .output()
        .unwrap())
}

/// `count(*)` and `sum(balance)` of a table through `fovea sql`.
fn count_and_sum(lake: &Path, table: &str) -> String {
    ok(fovea()
        .args(["sql", "--format", "csv", "--lake"])
        .arg(lake)
        .arg(format!("SELECT count(*) AS n, coalesce(sum(balance), 0) AS s FROM {table}"))
        .output()
        .unwrap())
}

fn expect(rows: i64, bump: i64) -> String {
    format!("n,s\n{rows},{}\n", (0..rows).map(|id| id + bump).sum::<i64>())
}

/// Every table of [`LOAD`] in `lake` has all its rows, balances `id + bump`.
fn assert_load(lake: &Path, bump: i64) {
    for (table, rows) in LOAD {
        assert_eq!(count_and_sum(lake, &format!("public.{table}")), expect(rows, bump), "{table}");
    }
}

#[test]
fn a_large_multi_table_load_keeps_every_table() {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.sql");
    std::fs::write(&schema, SCHEMA).unwrap();

    // One run of 160K snapshot records.
    let lake = dir.path().join("lake");
    let input = dir.path().join("load.jsonl");
    write_load(&input, &LOAD, 1_700_000_000_000, 0);
    let out = replay(&lake, &input, &schema);
    assert!(out.contains("160000 rows"), "{out}");
    assert_load(&lake, 0);
    // The declared table without rows exists, empty.
    assert_eq!(count_and_sum(&lake, "public.audit"), expect(0, 0));
    let csv = ok(fovea().args(["export", "--table", "public.transfer", "--lake"]).arg(&lake).output().unwrap());
    assert_eq!(csv.lines().count(), 80_001);
    assert_eq!(csv.lines().nth(80_000), Some("79999,o79999,79999"));

    // The same load as one file per table: three loads, none skipped.
    let lake2 = dir.path().join("lake2");
    for (table, rows) in LOAD {
        let file = dir.path().join(format!("{table}.jsonl"));
        write_load(&file, &[(table, rows)], 1_700_000_000_000, 0);
        let out = replay(&lake2, &file, &schema);
        assert!(out.contains("replayed 1 transactions"), "{table}: {out}");
    }
    assert_load(&lake2, 0);

    // Read again: skipped; a re-snapshot later (new source time, new
    // balances) replaces every row.
    let out = replay(&lake, &dir.path().join("checking.jsonl"), &schema);
    assert!(out.contains("1 already applied"), "{out}");
    let again = dir.path().join("resnapshot.jsonl");
    write_load(&again, &LOAD, 1_700_000_900_000, 3);
    let out = replay(&lake, &again, &schema);
    assert!(out.contains("replayed 1 transactions"), "{out}");
    assert_load(&lake, 3);
}
