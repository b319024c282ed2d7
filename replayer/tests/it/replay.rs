//! `fovea replay` and `fovea export` on a real PostgreSQL change stream
//! (tests/data/pg-tiny, captured under pgbench and a TPC-C-style load):
//! every table must equal what PostgreSQL itself reported at the end.

use std::path::Path;
use std::process::Output;

use crate::common::{fovea, gunzip, ok, pg_tiny as data, pg_tiny_tables as tables};
use fovea_core::cdc::types::{parse_date, parse_decimal, parse_timestamp};

fn replay(lake: &Path, input: &Path, extra: &[&str]) -> Output {
    fovea().arg("replay").arg("--lake").arg(lake).arg("--input").arg(input).args(extra).output().unwrap()
}

fn export(lake: &Path, table: &str) -> String {
    ok(fovea().args(["export", "--format", "csv", "--table", table, "--lake"]).arg(lake).output().unwrap())
}

fn expected(table: &str) -> String {
    gunzip(&data().join(format!("final_tables/{table}.csv.gz")))
}

fn all_exports(lake: &Path) -> Vec<(String, String)> {
    tables().into_iter().map(|t| (t.clone(), export(lake, &t))).collect()
}

/// Minimal CSV reader (quotes, doubled quotes); `None` for an empty field.
fn parse_csv(text: &str) -> Vec<Vec<Option<String>>> {
    let mut rows = Vec::new();
    for line in text.lines() {
        let mut fields = Vec::new();
        let mut cur = String::new();
        let (mut quoted, mut was_quoted) = (false, false);
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match (c, quoted) {
                ('"', true) if chars.peek() == Some(&'"') => {
                    cur.push('"');
                    chars.next();
                }
                ('"', _) => {
                    quoted = !quoted;
                    was_quoted = true;
                }
                (',', false) => {
                    fields.push(if cur.is_empty() && !was_quoted { None } else { Some(std::mem::take(&mut cur)) });
                    was_quoted = false;
                }
                (c, _) => cur.push(c),
            }
        }
        fields.push(if cur.is_empty() && !was_quoted { None } else { Some(cur) });
        rows.push(fields);
    }
    rows
}

#[test]
fn precise_schema_stream_reproduces_postgres_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let out = ok(replay(dir.path(), &data().join("debezium_events.precise_schemas.jsonl.gz"), &[]));
    assert!(out.contains("replayed 96 transactions"), "{out}");
    for t in tables() {
        assert_eq!(export(dir.path(), &t), expected(&t), "table {t}");
    }
}

#[test]
fn plain_stream_with_schema_file_reproduces_postgres_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let schema = data().join("schema.sql");
    ok(replay(dir.path(), &data().join("debezium_events.jsonl.gz"), &["--schema-file", schema.to_str().unwrap()]));
    for t in tables() {
        assert_eq!(export(dir.path(), &t), expected(&t), "table {t}");
    }
}

/// Without any schema, types are inferred (timestamps stay µs, decimals
/// text): values must still equal PostgreSQL's by column type.
#[test]
fn plain_stream_with_inferred_types_equals_postgres_by_type() {
    let dir = tempfile::tempdir().unwrap();
    ok(replay(dir.path(), &data().join("debezium_events.jsonl.gz"), &[]));
    let catalog: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data().join("catalog.json")).unwrap()).unwrap();
    for t in tables() {
        let meta = catalog
            .as_array()
            .unwrap()
            .iter()
            .find(|x| format!("{}.{}", x["schema"].as_str().unwrap(), x["table"].as_str().unwrap()) == t)
            .unwrap();
        let oids: Vec<i64> =
            meta["columns"].as_array().unwrap().iter().map(|c| c["typoid"].as_i64().unwrap()).collect();
        let got = parse_csv(&export(dir.path(), &t));
        let want = parse_csv(&expected(&t));
        assert_eq!(got.len(), want.len(), "rows of {t}");
        assert_eq!(got[0], want[0], "header of {t}");
        for (g, w) in got.iter().zip(&want).skip(1) {
            for ((gv, wv), oid) in g.iter().zip(w).zip(&oids) {
                let same = match (gv, wv) {
                    (None, None) => true,
                    (Some(g), Some(w)) => match oid {
                        1114 => g.parse::<i64>().ok() == parse_timestamp(w),
                        1184 => parse_timestamp(g) == parse_timestamp(w),
                        1082 => g.parse::<i32>().ok() == parse_date(w),
                        1700 => parse_decimal(g, 10) == parse_decimal(w, 10),
                        701 | 700 => g.parse::<f64>().ok() == w.parse::<f64>().ok(),
                        _ => g == w,
                    },
                    _ => false,
                };
                assert!(same, "table {t}: got {gv:?}, PostgreSQL has {wv:?} (type oid {oid}) in row {w:?}");
            }
        }
    }
}

/// A lake an earlier release wrote (index images of format 2, integer keys
/// in 9 bytes, a chain of a base and a delta) is continued to the end of
/// the stream: its keys are read in today's encoding (an update or delete
/// of a row it holds finds it), the next checkpoint starts a new chain, and
/// the lake reopens from that one.
#[test]
fn a_lake_of_an_earlier_format_is_continued_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let archive = data().join("../older-lakes/pg-tiny-first-half-format-2.tgz");
    let unpacked =
        std::process::Command::new("tar").arg("xzf").arg(&archive).arg("-C").arg(dir.path()).output().unwrap();
    assert!(unpacked.status.success(), "{}", String::from_utf8_lossy(&unpacked.stderr));
    let lake = dir.path().join("lake");
    let input = data().join("debezium_events.precise_schemas.jsonl.gz");
    let out = ok(replay(&lake, &input, &["--checkpoint-txns", "7"]));
    assert!(out.contains("replayed 47 transactions (49 already applied, skipped)"), "{out}");
    for t in tables() {
        assert_eq!(export(&lake, &t), expected(&t), "table {t}");
    }
    let again = ok(replay(&lake, &input, &[]));
    assert!(again.contains("replayed 0 transactions"), "a finished input changes nothing: {again}");
    for t in tables() {
        assert_eq!(export(&lake, &t), expected(&t), "table {t} after reopening");
    }
}

#[test]
fn duplicated_input_and_reruns_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let twice = dir.path().join("twice.jsonl");
    let one = gunzip(&data().join("debezium_events.precise_schemas.jsonl.gz"));
    std::fs::write(&twice, format!("{one}{one}")).unwrap();
    let lake = dir.path().join("lake");
    let out = ok(replay(&lake, &twice, &["--checkpoint-txns", "7"]));
    assert!(out.contains("replayed 96 transactions (96 already applied, skipped)"), "{out}");
    let first = all_exports(&lake);
    for (t, csv) in &first {
        assert_eq!(*csv, expected(t), "table {t}");
    }
    let again = ok(replay(&lake, &twice, &[]));
    assert!(again.contains("replayed 0 transactions"), "a finished input changes nothing: {again}");
    assert_eq!(all_exports(&lake), first);
    // The same transactions from another file are recognised by identity.
    let other = ok(replay(&lake, &data().join("debezium_events.precise_schemas.jsonl.gz"), &[]));
    assert!(other.contains("replayed 0 transactions (96 already applied, skipped)"), "{other}");
    assert_eq!(all_exports(&lake), first);
}

/// The plain stream cut after its `n`-th END record.
fn prefix_lines(n: usize) -> (Vec<String>, usize) {
    let text = gunzip(&data().join("debezium_events.jsonl.gz"));
    let mut out = Vec::new();
    let mut ends = 0;
    for line in text.lines() {
        out.push(line.to_owned());
        if line.contains("\"status\":\"END\"") {
            ends += 1;
            if ends == n {
                break;
            }
        }
    }
    let len = out.len();
    (out, len)
}

/// Replays `good` then `bad` lines: must fail with a message containing
/// every one of `needles`, and leave exactly the tables of `good`.
fn assert_rejected(good: &[String], bad: &[String], needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.jsonl");
    std::fs::write(&input, format!("{}\n{}\n", good.join("\n"), bad.join("\n"))).unwrap();
    let lake = dir.path().join("lake");
    let out = replay(&lake, &input, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "replay of bad input succeeded");
    for n in needles {
        assert!(stderr.contains(n), "error message lacks {n:?}: {stderr}");
    }
    let good_input = dir.path().join("good.jsonl");
    std::fs::write(&good_input, format!("{}\n", good.join("\n"))).unwrap();
    let reference = dir.path().join("reference");
    ok(replay(&reference, &good_input, &[]));
    for t in tables() {
        let want = if reference.join("_fovea").exists() { try_export(&reference, &t) } else { None };
        assert_eq!(try_export(&lake, &t), want, "table {t} after the failed replay");
    }
}

fn try_export(lake: &Path, table: &str) -> Option<String> {
    let out = fovea().args(["export", "--table", table, "--lake"]).arg(lake).output().unwrap();
    out.status.success().then(|| String::from_utf8(out.stdout).unwrap())
}

#[test]
fn malformed_line_stops_with_its_position_and_keeps_earlier_transactions() {
    let (good, n) = prefix_lines(10);
    assert_rejected(
        &good,
        &["{\"topic\": \"tiny.public.t\", \"value\": {oops".into()],
        &[&format!("line {}", n + 1), "malformed JSON"],
    );
}

#[test]
fn end_with_wrong_count_names_the_end_and_its_transaction() {
    let (good, n) = prefix_lines(10);
    let (more, m) = prefix_lines(11);
    let mut next: Vec<String> = more[n..].to_vec();
    let end = next.last_mut().unwrap();
    let count: serde_json::Value = serde_json::from_str(end).unwrap();
    let real = count["value"]["event_count"].as_u64().unwrap();
    let txid = count["value"]["id"].as_str().unwrap().split(':').next().unwrap().to_owned();
    *end = end.replace(&format!("\"event_count\":{real}"), &format!("\"event_count\":{}", real + 1));
    assert_rejected(&good, &next, &[&format!("line {m}"), &format!("source transaction {txid}"), "END reports"]);
}

#[test]
fn update_of_a_missing_key_fails_the_whole_transaction() {
    let (good, n) = prefix_lines(10);
    let src = |op: &str, tid: i64| {
        format!(
            r#"{{"topic":"tiny.public.pgbench_tellers","key":{{"tid":{tid}}},"value":{{"before":null,"after":{{"tid":{tid},"bid":1,"tbalance":5,"filler":null}},"source":{{"schema":"public","table":"pgbench_tellers","txId":99999}},"op":"{op}","transaction":{{"id":"99999:1"}}}}}}"#
        )
    };
    let bad = vec![
        r#"{"topic":"tiny.transaction","key":{"id":"99999:1"},"value":{"status":"BEGIN","id":"99999:1"}}"#.to_owned(),
        src("c", 777),
        src("u", 999),
        r#"{"topic":"tiny.transaction","key":{"id":"99999:1"},"value":{"status":"END","id":"99999:1","event_count":2,"data_collections":[{"data_collection":"public.pgbench_tellers","event_count":2}]}}"#.to_owned(),
    ];
    assert_rejected(
        &good,
        &bad,
        &[
            &format!("line {}", n + 3),
            "table public.pgbench_tellers",
            "source transaction 99999",
            "update of a key with no live row",
        ],
    );
}

#[test]
fn unknown_op_is_refused() {
    let (good, n) = prefix_lines(10);
    let bad = vec![
        r#"{"topic":"tiny.public.pgbench_tellers","key":{"tid":1},"value":{"before":null,"after":{"tid":1},"source":{"schema":"public","table":"pgbench_tellers","txId":5},"op":"x"}}"#.to_owned(),
    ];
    assert_rejected(&good, &bad, &[&format!("line {}", n + 1), "unknown op", "public.pgbench_tellers"]);
}

#[test]
fn export_of_an_unknown_table_or_lake_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = fovea().args(["export", "--table", "public.nope", "--lake"]).arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a fovea lake"));
    ok(replay(dir.path(), &data().join("debezium_events.jsonl.gz"), &[]));
    let out = fovea().args(["export", "--table", "public.nope", "--lake"]).arg(dir.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // The tables there are named, for the typo to show.
    assert!(
        err.contains(
            "unknown table public.nope (the lake's tables: public.pgbench_accounts, public.pgbench_branches, "
        ),
        "{err}"
    );
    assert!(!err.contains("Engine::create_table"), "{err}");
}

#[test]
fn sql_and_history_on_the_replayed_lake() {
    let dir = tempfile::tempdir().unwrap();
    ok(replay(dir.path(), &data().join("debezium_events.precise_schemas.jsonl.gz"), &[]));
    let counts = std::fs::read_to_string(data().join("final_tables/row_counts.txt")).unwrap();
    for line in counts.lines() {
        let (table, n) = line.split_once(' ').unwrap();
        let out = ok(fovea()
            .args(["sql", "--format", "csv", "--lake"])
            .arg(dir.path())
            .arg(format!("SELECT count(*) AS n FROM {table}"))
            .output()
            .unwrap());
        assert_eq!(out, format!("n\n{n}\n"), "{table}");
    }
    // A join and an aggregate with decimals, against PostgreSQL's final numbers.
    let out = ok(fovea()
        .args(["sql", "--format", "csv", "--lake"])
        .arg(dir.path())
        .arg("SELECT w.w_id, sum(d.d_ytd) AS ytd FROM tpcc.warehouse w JOIN tpcc.district d ON d.d_w_id = w.w_id GROUP BY w.w_id")
        .output()
        .unwrap());
    let districts = parse_csv(&expected("tpcc.district"));
    let col = districts[0].iter().position(|c| c.as_deref() == Some("d_ytd")).unwrap();
    let total: i128 = districts[1..].iter().map(|r| parse_decimal(r[col].as_deref().unwrap(), 2).unwrap()).sum();
    let got = parse_csv(&out);
    assert_eq!(parse_decimal(got[1][1].as_deref().unwrap(), 2).unwrap(), total, "{out}");
    let err = fovea().args(["sql", "--as-of", "1", "--lake"]).arg(dir.path()).arg("SELECT 1").output().unwrap();
    assert!(!err.status.success());
    assert!(
        String::from_utf8_lossy(&err.stderr).contains("oldest available ts"),
        "{}",
        String::from_utf8_lossy(&err.stderr)
    );
    let history = ok(fovea().args(["history", "--limit", "5", "--lake"]).arg(dir.path()).output().unwrap());
    assert!(history.contains("31311") && history.contains("catalog operations"), "{history}");
    // Freshness from the source's own commit time of the newest transaction (its END record).
    assert!(history.contains("newest replayed source commit 2026-11-30 08:40:10.156 UTC"), "{history}");
}

#[test]
fn interactive_sql_prompt_reads_statements_until_quit() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    ok(replay(dir.path(), &data().join("debezium_events.precise_schemas.jsonl.gz"), &[]));
    let mut child = fovea()
        .args(["sql", "--format", "csv", "--lake"])
        .arg(dir.path())
        .env("HOME", dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"SELECT count(*) AS n\nFROM tpcc.item;\nSELECT nope FROM tpcc.item;\nSELECT 2 AS two;\n\\q\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("n\n20\n") && stdout.contains("two\n2\n"), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("No field named nope"));
    assert!(dir.path().join(".fovea_history").is_file());
}

/// pg-tiny as if `tpcc.history` had no primary key, as TPC-C's HISTORY has
/// none (the capture gave it `h_id`): its records' Kafka key is null and
/// their rows lack `h_id`. The stream's lines, and the schema file without
/// the key.
fn keyless_history() -> (Vec<String>, String) {
    let text = gunzip(&data().join("debezium_events.jsonl.gz"));
    let lines = text
        .lines()
        .map(|l| {
            if !l.contains(r#""topic":"tiny.tpcc.history""#) {
                return l.to_owned();
            }
            // Edited as text: the columns keep their order.
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let id = &v["key"]["h_id"];
            let edited = l.replacen(&format!(r#""key":{{"h_id":{id}}}"#), r#""key":null"#, 1).replacen(
                &format!(r#""after":{{"h_id":{id},"#),
                r#""after":{"#,
                1,
            );
            assert_eq!(edited.len(), l.len() - 2 * format!(r#""h_id":{id}"#).len() + 1, "{l}");
            edited
        })
        .collect();
    let schema = std::fs::read_to_string(data().join("schema.sql")).unwrap();
    let keyless = schema
        .replace("CREATE TABLE tpcc.history (\n    h_id bigint NOT NULL,\n", "CREATE TABLE tpcc.history (\n")
        .replace("    h_ratio double precision,\n    PRIMARY KEY (h_id)\n);", "    h_ratio double precision\n);");
    assert!(!keyless.contains("h_id"), "pg-tiny's tpcc.history changed");
    (lines, keyless)
}

/// `csv`'s rows without their first `skip` columns, `columns` columns
/// each, sorted: a table without a key comes in insertion order, which need
/// not be that of the key the capture added.
fn unordered(csv: &str, skip: usize, columns: usize) -> Vec<String> {
    let mut rows: Vec<String> =
        csv.lines().map(|l| l.split(',').skip(skip).take(columns).collect::<Vec<_>>().join(",")).collect();
    rows[1..].sort();
    rows
}

#[test]
fn a_table_without_a_primary_key_is_mirrored_under_a_hidden_row_id() {
    const HISTORY: &str = "tpcc.history";
    let (lines, schema) = keyless_history();
    let dir = tempfile::tempdir().unwrap();
    let schema_file = dir.path().join("schema.sql");
    std::fs::write(&schema_file, &schema).unwrap();
    let with_schema = ["--schema-file", schema_file.to_str().unwrap()];
    let input = dir.path().join("keyless.jsonl");
    let check = |lake: &Path| {
        for t in tables() {
            if t == HISTORY {
                assert_eq!(unordered(&export(lake, &t), 0, 9), unordered(&expected(&t), 1, 9));
            } else {
                assert_eq!(export(lake, &t), expected(&t), "table {t}");
            }
        }
    };

    // Declared without a key in the schema file.
    std::fs::write(&input, format!("{}\n", lines.join("\n"))).unwrap();
    let lake = dir.path().join("declared");
    ok(replay(&lake, &input, &with_schema));
    check(&lake);
    // Its rows are keyed by a hidden row id that SQL does not show.
    let sql = |q: &str| ok(fovea().args(["sql", "--format", "csv", "--lake"]).arg(&lake).arg(q).output().unwrap());
    let want_rows = expected(HISTORY).lines().count() - 1;
    assert_eq!(sql(&format!("SELECT count(*) AS n FROM {HISTORY}")), format!("n\n{want_rows}\n"));
    let star = sql(&format!("SELECT * FROM {HISTORY} LIMIT 1"));
    assert_eq!(
        star.lines().next(),
        Some("h_c_id,h_c_d_id,h_c_w_id,h_d_id,h_w_id,h_date,h_amount,h_data,h_ratio"),
        "{star}"
    );

    // Replayed in two runs: the second's rows get ids past the first's
    // (ids started again from 1 would replace rows of the first).
    let ends: Vec<usize> =
        lines.iter().enumerate().filter(|(_, l)| l.contains(r#""status":"END""#)).map(|(i, _)| i).collect();
    let half = ends[ends.len() / 2] + 1;
    assert!(lines[..half].iter().any(|l| l.contains("tiny.tpcc.history")));
    assert!(lines[half..].iter().any(|l| l.contains("tiny.tpcc.history")));
    let lake = dir.path().join("two-runs");
    std::fs::write(&input, format!("{}\n", lines[..half].join("\n"))).unwrap();
    ok(replay(&lake, &input, &with_schema));
    std::fs::write(&input, format!("{}\n", lines.join("\n"))).unwrap();
    let second = ok(replay(&lake, &input, &with_schema));
    assert!(!second.contains("replayed 0 transactions"), "{second}");
    check(&lake);

    // Not declared at all: the records' null key says the table has none
    // (its types are then inferred: the integer columns read the same).
    let undeclared = dir.path().join("undeclared.sql");
    let start = schema.find("CREATE TABLE tpcc.history").unwrap();
    let end = start + schema[start..].find(");\n").unwrap() + 3;
    std::fs::write(&undeclared, format!("{}{}", &schema[..start], &schema[end..])).unwrap();
    let lake = dir.path().join("undeclared");
    ok(replay(&lake, &input, &["--schema-file", undeclared.to_str().unwrap()]));
    assert_eq!(unordered(&export(&lake, HISTORY), 0, 5), unordered(&expected(HISTORY), 1, 5));

    // A record without any key field still says nothing of its table's key.
    let no_key: Vec<String> = lines.iter().map(|l| l.replace(r#""key":null,"#, "")).collect();
    assert_ne!(no_key, lines);
    std::fs::write(&input, format!("{}\n", no_key.join("\n"))).unwrap();
    let out = replay(&dir.path().join("no-key"), &input, &["--schema-file", undeclared.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("no primary key is known"), "{stderr}");
}

#[test]
fn update_of_a_table_without_a_primary_key_needs_its_whole_old_row() {
    let (lines, _) = keyless_history();
    // The transaction of the first history row: its insert becomes an
    // update.
    let first = lines.iter().position(|l| l.contains("tiny.tpcc.history")).unwrap();
    let begin = lines[..first].iter().rposition(|l| l.contains(r#""status":"END""#)).unwrap() + 1;
    let end = first + lines[first..].iter().position(|l| l.contains(r#""status":"END""#)).unwrap();
    let (good, rest) = lines.split_at(begin);
    let mut bad = rest[..=end - begin].to_vec();
    let at = first - begin;
    assert!(bad[at].contains(r#""op":"c""#));
    bad[at] = bad[at].replace(r#""op":"c""#, r#""op":"u""#);
    assert_rejected(
        good,
        &bad,
        &[
            &format!("line {}", first + 1),
            "table tpcc.history",
            "UPDATE on a table without a primary key whose old row image is missing",
            "REPLICA IDENTITY FULL",
        ],
    );
}

/// A `TRUNCATE` followed by new rows in one transaction, at the end of the
/// real stream, as Debezium writes it when `skipped.operations` leaves `t`
/// out: the table holds the new rows alone, every other table is
/// PostgreSQL's, also when rows of the table came before the truncate in
/// its transaction.
#[test]
fn truncate_deletes_every_row_of_its_table() {
    let text = gunzip(&data().join("debezium_events.jsonl.gz"));
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let source =
        r#""source":{"schema":"public","table":"pgbench_tellers","txId":99999,"lsn":999999999,"ts_ms":1796028099000}"#;
    let txn = r#""transaction":{"id":"99999:999999999","total_order":1,"data_collection_order":1}"#;
    let truncate = format!(
        r#"{{"topic":"tiny.public.pgbench_tellers","key":null,"value":{{{source},"op":"t","ts_ms":1,{txn}}}}}"#
    );
    let insert = |tid: i64| {
        format!(
            r#"{{"topic":"tiny.public.pgbench_tellers","key":{{"tid":{tid}}},"value":{{"before":null,"after":{{"tid":{tid},"bid":1,"tbalance":{tid}00,"filler":null}},{source},"op":"c",{txn}}}}}"#
        )
    };
    let begin = r#"{"topic":"tiny.transaction","key":{"id":"99999:999999999"},"value":{"status":"BEGIN","id":"99999:999999999"}}"#;
    let end = r#"{"topic":"tiny.transaction","key":{"id":"99999:999999999"},"value":{"status":"END","id":"99999:999999999","event_count":3,"data_collections":[{"data_collection":"public.pgbench_tellers","event_count":3}]}}"#;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("truncate.jsonl");
    let tail = [begin.to_owned(), truncate.clone(), insert(11), insert(12), end.to_owned()];
    std::fs::write(&input, format!("{}\n{}\n", lines.join("\n"), tail.join("\n"))).unwrap();
    let schema = data().join("schema.sql");
    let lake = dir.path().join("lake");
    let out = ok(replay(&lake, &input, &["--schema-file", schema.to_str().unwrap()]));
    assert!(out.contains("replayed 97 transactions"), "{out}");
    for t in tables() {
        let want = if t == "public.pgbench_tellers" {
            "tid,bid,tbalance,filler\n11,1,1100,\n12,1,1200,\n".to_owned()
        } else {
            expected(&t)
        };
        assert_eq!(export(&lake, &t), want, "table {t}");
    }
    // Rows of the table before its truncate in the same transaction go
    // with the rest.
    let tail = [begin.to_owned(), insert(11), truncate, insert(12), end.to_owned()];
    std::fs::write(&input, format!("{}\n{}\n", lines.join("\n"), tail.join("\n"))).unwrap();
    let lake = dir.path().join("lake-2");
    ok(replay(&lake, &input, &["--schema-file", schema.to_str().unwrap()]));
    assert_eq!(export(&lake, "public.pgbench_tellers"), "tid,bid,tbalance,filler\n12,1,1200,\n");
}

/// Every file of the local lake `lake` but its state (`_fovea/`), with its
/// size.
fn lake_objects(lake: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut dirs = vec![lake.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            if path.is_dir() {
                dirs.push(path);
            } else if !path.starts_with(lake.join("_fovea")) {
                out.push((path.display().to_string(), e.metadata().unwrap().len()));
            }
        }
    }
    out.sort();
    out
}

/// Copies the lake's state files (`_fovea/*.sqlite*`) from `from` to `to`,
/// replacing those there.
fn copy_state(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(to).unwrap() {
        let p = e.unwrap().path();
        if p.to_string_lossy().contains(".sqlite") {
            std::fs::remove_file(p).unwrap();
        }
    }
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        if p.to_string_lossy().contains(".sqlite") {
            std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
        }
    }
}

/// The lake's state restored from a backup older than the lake (a state
/// table restored from another day): the next writer finds objects its
/// state's epochs cannot have written, refuses, and deletes nothing; with
/// the newest state back, the lake continues exactly.
#[test]
fn a_state_older_than_its_lake_is_refused_and_nothing_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = prefix_lines(40);
    let part = dir.path().join("part.jsonl");
    std::fs::write(&part, first.join("\n") + "\n").unwrap();
    let lake = dir.path().join("lake");
    let state = lake.join("_fovea");
    ok(replay(&lake, &part, &["--checkpoint-txns", "5"]));
    let (old, new) = (dir.path().join("old-state"), dir.path().join("new-state"));
    copy_state(&state, &old);
    let all = dir.path().join("all.jsonl");
    std::fs::write(&all, gunzip(&data().join("debezium_events.jsonl.gz"))).unwrap();
    ok(replay(&lake, &all, &["--checkpoint-txns", "5"]));
    copy_state(&state, &new);

    copy_state(&old, &state);
    let before = lake_objects(&lake);
    let out = replay(&lake, &all, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("the state is older than the lake"), "{stderr}");
    assert_eq!(lake_objects(&lake), before, "a refused recovery deleted objects");

    copy_state(&new, &state);
    let again = ok(replay(&lake, &all, &[]));
    assert!(again.contains("replayed 0 transactions"), "{again}");
    let reference = dir.path().join("reference");
    ok(replay(&reference, &all, &[]));
    assert_eq!(all_exports(&lake), all_exports(&reference));
}

/// `fovea status` tells how a lake stands from its state alone: after a
/// replay of pg-tiny, no writer (its lease released), the newest replayed
/// transaction within HWM, the checkpoint with its source commit time,
/// each table's live rows (stored less deleted) as PostgreSQL counted them
/// and its Iceberg snapshot at the checkpoint; the screen says the same; a
/// folder that is not a lake is refused.
#[test]
fn status_tells_how_a_lake_stands_from_its_state_alone() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let schema = data().join("schema.sql");
    ok(replay(&lake, &data().join("debezium_events.jsonl.gz"), &["--schema-file", schema.to_str().unwrap()]));
    let status =
        |extra: &[&str]| -> String { ok(fovea().args(["status", "--lake"]).arg(&lake).args(extra).output().unwrap()) };
    let s: serde_json::Value = serde_json::from_str(&status(&["--json"])).unwrap();
    assert_eq!(s["writer"]["state"], "released", "{s}");
    let (hwm, newest) = (s["hwm"].as_u64().unwrap(), s["newest_replayed"]["ts"].as_u64().unwrap());
    let checkpoint = s["checkpoint"]["checkpoint_ts"].as_u64().unwrap();
    assert!(newest < hwm && checkpoint <= hwm && s["lwm"].as_u64().unwrap() <= hwm, "{s}");
    assert!(s["checkpoint"]["source_commit_us"].as_i64().is_some(), "{s}");
    assert!(s["readers"].as_array().unwrap().is_empty(), "{s}");
    let counts = std::fs::read_to_string(data().join("final_tables/row_counts.txt")).unwrap();
    let tables = s["tables"].as_array().unwrap();
    assert_eq!(tables.len(), counts.lines().count(), "{s}");
    for line in counts.lines() {
        let (name, n) = line.split_once(' ').unwrap();
        let t = tables.iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("{name} missing: {s}"));
        let live = t["rows_stored"].as_u64().unwrap() - t["rows_deleted"].as_u64().unwrap();
        assert_eq!(live, n.trim().parse::<u64>().unwrap(), "{name}: {t}");
        assert_eq!(t["files_deleted_unknown"], 0, "{name}: {t}");
        assert_eq!(t["iceberg"]["checkpoint_ts"].as_u64(), Some(checkpoint), "{name}: {t}");
        assert_eq!(t["iceberg"]["format_version"], 2, "{name}: {t}");
    }
    // Every file with a deleted row is backlog at threshold 0 (as storage
    // GC rewrites only files with one at least), fewer at 1 (only files
    // whose every row is deleted); no threshold is past 1.
    let backlog = |threshold: &str| -> u64 {
        let s: serde_json::Value =
            serde_json::from_str(&status(&["--json", "--storage-gc-threshold", threshold])).unwrap();
        s["tables"].as_array().unwrap().iter().map(|t| t["files_past_gc_threshold"].as_u64().unwrap()).sum()
    };
    let any_deleted = backlog("0");
    assert!(any_deleted > 0);
    assert_eq!(backlog("0.000001"), any_deleted);
    assert!(backlog("1") < any_deleted);
    let out = fovea().args(["status", "--storage-gc-threshold", "1.01", "--lake"]).arg(&lake).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let screen = status(&[]);
    for line in [
        "writer      none (lease epoch 1 of ",
        &format!("checkpoint  mirror ts {checkpoint} of "),
        "readers     none registered",
    ] {
        assert!(screen.contains(line), "{line:?} not in:\n{screen}");
    }
    assert_eq!(screen.matches("Iceberg v2 at the checkpoint").count(), counts.lines().count(), "{screen}");
    // Not a lake: refused by name, nothing created.
    let out = fovea().args(["status", "--lake"]).arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a fovea lake"), "{out:?}");
}
