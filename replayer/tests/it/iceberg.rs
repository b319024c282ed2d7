//! Checkpoints published as Iceberg tables (`--iceberg v2|v3`) read
//! exactly — the same rows as fovea's own reader at the checkpoint — in
//! DuckDB's iceberg extension and in pyiceberg, through every path a replay
//! takes: many checkpoints (incremental manifests, delete files and
//! deletion vectors replaced), combine and storage GC (files replaced),
//! tables without a key, a format 2 table upgraded to 3, and time travel to
//! an earlier checkpoint's snapshot.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::common::*;
use arrow::array::ArrayRef;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use fovea_core::location::{LakeBackends, open_reader};
use fovea_core::{ScanOptions, SnapshotTables};

/// Each table's rows as fovea's reader has them at the lake's newest
/// checkpoint (schema, rows as text), and that checkpoint's timestamp.
fn fovea_tables(lake: &Path) -> (u64, BTreeMap<String, (SchemaRef, Vec<String>)>) {
    let open = open_reader(LakeBackends::local(lake).unwrap(), fovea_core::lease::DEFAULT_LEASE_TTL).unwrap();
    let ts = open.checkpoint.as_ref().expect("a checkpoint").manifest.checkpoint_ts;
    let mut tables = BTreeMap::new();
    for def in open.reader.tables() {
        let batches = open.reader.scan(&def.name, ScanOptions::default()).unwrap().collect_batches().unwrap();
        let schema = Arc::clone(&def.schema);
        let mut rows: Vec<String> = batches.iter().flat_map(|b| rows_as_text(b, &schema)).collect();
        rows.sort();
        tables.insert(def.name.clone(), (schema, rows));
    }
    (ts, tables)
}

/// The rows of `batch` as text, the columns of `schema` that are not
/// fovea's hidden ones, each cast to its type in `schema` (engines read
/// Iceberg's `int` of a 16-bit column as 32 bits, for one).
fn rows_as_text(batch: &RecordBatch, schema: &SchemaRef) -> Vec<String> {
    let options = FormatOptions::default().with_null("␀NULL");
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .filter(|f| !f.name().starts_with("_fovea_"))
        .map(|f| {
            let c = batch
                .column_by_name(f.name())
                .unwrap_or_else(|| panic!("column {} missing from {:?}", f.name(), batch.schema()));
            arrow::compute::cast(c, f.data_type()).unwrap()
        })
        .collect();
    let formatters: Vec<ArrayFormatter> =
        columns.iter().map(|c| ArrayFormatter::try_new(c, &options).unwrap()).collect();
    (0..batch.num_rows())
        .map(|r| formatters.iter().map(|f| f.value(r).to_string()).collect::<Vec<_>>().join("\u{1f}"))
        .collect()
}

fn read_parquet(path: &Path) -> Vec<RecordBatch> {
    let file = std::fs::File::open(path).unwrap();
    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

/// Reads every table of `lake` as Iceberg with DuckDB and pyiceberg and
/// checks each answer equals fovea's, and each table's snapshot is the
/// lake's newest checkpoint. Returns the summaries pyiceberg read.
fn assert_iceberg_reads_as_fovea(lake: &Path) -> Vec<serde_json::Value> {
    assert_iceberg_reads(lake, &fovea_tables(lake), false)
}

/// Reads every table of `lake` as Iceberg with DuckDB and pyiceberg — at
/// the snapshot of checkpoint `expected.0` when `time_travel`, else at the
/// current one, which must be that checkpoint's — and checks each answer
/// equals `expected`'s rows. Returns the summaries pyiceberg read.
fn assert_iceberg_reads(
    lake: &Path,
    expected: &(u64, BTreeMap<String, (SchemaRef, Vec<String>)>),
    time_travel: bool,
) -> Vec<serde_json::Value> {
    let locations: Vec<String> =
        expected.1.keys().map(|t| lake.join(fovea_iceberg::table_dir(t)).display().to_string()).collect();
    assert_iceberg_reads_at(&locations, &[], expected, time_travel)
}

/// [`assert_iceberg_reads`] of the tables at `locations` (in the order of
/// `expected`'s tables; `s3://…` read with the AWS environment `env`).
fn assert_iceberg_reads_at(
    locations: &[String],
    env: &[(&str, String)],
    (ts, tables): &(u64, BTreeMap<String, (SchemaRef, Vec<String>)>),
    time_travel: bool,
) -> Vec<serde_json::Value> {
    let ts = *ts;
    assert!(!tables.is_empty());
    assert_eq!(locations.len(), tables.len());
    let out = tempfile::tempdir().unwrap();
    let script = fovea_testkit::package_dir!().join("tests/iceberg/read_tables.py");
    let python = fovea_testkit::moto::python();
    let mut command = std::process::Command::new(&python);
    command.arg(&script).arg(out.path()).envs(env.iter().map(|(k, v)| (k, v)));
    if time_travel {
        // Snapshot ids are checkpoint timestamps.
        command.arg("--snapshot").arg(ts.to_string());
    }
    let output = command
        .args(locations)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} (scripts/test-deps.sh installs DuckDB and pyiceberg): {e}"));
    let printed = ok(output);
    let summaries: Vec<serde_json::Value> = printed.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(summaries.len(), tables.len());
    for (i, (name, (schema, expected))) in tables.iter().enumerate() {
        assert_eq!(
            summaries[i]["summary"]["fovea.checkpoint-ts"].as_str(),
            Some(ts.to_string().as_str()),
            "{name}: the snapshot is not the newest checkpoint's"
        );
        for engine in ["duckdb", "pyiceberg"] {
            let batches = read_parquet(&out.path().join(engine).join(format!("{i}.parquet")));
            let names: Vec<String> = batches
                .first()
                .map(|b| b.schema().fields().iter().map(|f| f.name().clone()).collect())
                .unwrap_or_default();
            if let Some(b) = batches.first() {
                let user: Vec<&String> =
                    schema.fields().iter().map(|f| f.name()).filter(|n| !n.starts_with("_fovea_")).collect();
                assert_eq!(names.iter().collect::<Vec<_>>(), user, "{engine} read other columns of {name}");
                assert_eq!(b.num_columns(), user.len());
            }
            let mut got: Vec<String> = batches.iter().flat_map(|b| rows_as_text(b, schema)).collect();
            got.sort();
            if got != *expected {
                let missing: Vec<&String> = expected.iter().filter(|r| !got.contains(r)).take(5).collect();
                let extra: Vec<&String> = got.iter().filter(|r| !expected.contains(r)).take(5).collect();
                panic!(
                    "{engine} reads {name} (time travel: {time_travel}) as {} rows, fovea has {}; missing (first \
                     5): {missing:?}; extra: {extra:?}",
                    got.len(),
                    expected.len()
                );
            }
        }
    }
    summaries
}

#[test]
fn pg_tiny_published_at_every_checkpoint_reads_exactly_in_duckdb_and_pyiceberg() {
    pg_tiny_published_reads_exactly("v2");
}

#[test]
fn pg_tiny_published_with_deletion_vectors_reads_exactly_in_duckdb_and_pyiceberg() {
    let dir = pg_tiny_published_reads_exactly("v3");
    let lake = dir.path().join("lake");
    // Deletes are deletion vectors in Puffin files, no position delete file.
    let deletes = lake.join(fovea_iceberg::table_dir("tpcc.stock")).join("deletes");
    let names: Vec<String> =
        std::fs::read_dir(&deletes).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(!names.is_empty() && names.iter().all(|n| n.ends_with(".puffin")), "{names:?}");
    // Without a format it stays in format 3.
    let kept = ok(fovea().args(["iceberg", "--lake"]).arg(&lake).output().unwrap());
    assert!(kept.contains(" 0 tables published, 13 already current"), "{kept}");
    // A format 3 table cannot go back to format 2: refused, naming it.
    let out = fovea().args(["iceberg", "--lake"]).arg(&lake).args(["--format", "v2"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("13 tables not published"), "{err}");
    assert!(err.contains("table tpcc.stock: it is published in Iceberg format 3"), "{err}");
}

/// Replays pg-tiny publishing Iceberg `format` every 7 transactions, checks
/// both engines read every table as fovea does (and as PostgreSQL counts
/// it), and returns the directory of the lake (`lake` in it).
fn pg_tiny_published_reads_exactly(format: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let data = pg_tiny();
    ok(fovea()
        .args(["replay", "--lake"])
        .arg(&lake)
        .arg("--input")
        .arg(data.join("debezium_events.jsonl.gz"))
        .arg("--schema-file")
        .arg(data.join("schema.sql"))
        .args(["--iceberg", format, "--checkpoint-txns", "7"])
        .output()
        .unwrap());
    let summaries = assert_iceberg_reads_as_fovea(&lake);
    let format_number: u64 = format[1..].parse().unwrap();
    assert!(summaries.iter().all(|s| s["format_version"] == format_number), "{summaries:?}");
    // Every snapshot names when its newest transaction committed in
    // PostgreSQL: the stream's last commit (to the millisecond).
    let last_commit_us = gunzip(&data.join("debezium_events.jsonl.gz"))
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["value"]["source"]["ts_us"].as_i64())
        .max()
        .unwrap();
    for s in &summaries {
        let ms: i64 = s["summary"]["fovea.source-commit-ms"].as_str().expect("a source commit time").parse().unwrap();
        assert!((ms - last_commit_us / 1000).abs() <= 1, "{ms} vs {last_commit_us} µs: {s}");
    }
    // PostgreSQL's own counts, as the engines read them.
    let counts = std::fs::read_to_string(data.join("final_tables/row_counts.txt")).unwrap();
    let (_, tables) = fovea_tables(&lake);
    for line in counts.lines() {
        let (table, n) = line.split_once(' ').unwrap();
        assert_eq!(tables[table].1.len(), n.trim().parse::<usize>().unwrap(), "{table}");
    }
    // Publishing the same checkpoint again changes nothing.
    let again = ok(fovea().args(["iceberg", "--lake"]).arg(&lake).args(["--format", format]).output().unwrap());
    assert!(again.contains(" 0 tables published, 13 already current"), "{again}");
    dir
}

/// Publishing is the default: v2 unless told otherwise, a table published
/// in v3 stays in v3 under the default (not refused), and `--iceberg off`
/// publishes nothing (the tables stay at the checkpoint before).
#[test]
fn replay_publishes_iceberg_v2_by_default_keeps_v3_tables_and_stops_when_off() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let replay = |txns: u64, iceberg: &[&str]| -> String {
        let input = dir.path().join(format!("hybench-{txns}.jsonl"));
        hybench(&input, txns, 5);
        let out = fovea().args(["replay", "--lake"]).arg(&lake).arg("--input").arg(&input).args(iceberg).output();
        let out = out.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        ok(out);
        stderr
    };
    let format_of = |summaries: &[serde_json::Value]| -> Vec<u64> {
        summaries.iter().map(|s| s["format_version"].as_u64().unwrap()).collect()
    };
    replay(300, &[]);
    let summaries = assert_iceberg_reads_as_fovea(&lake);
    assert!(format_of(&summaries).iter().all(|&f| f == 2), "{summaries:?}");
    replay(600, &["--iceberg", "v3"]);
    assert!(format_of(&assert_iceberg_reads_as_fovea(&lake)).iter().all(|&f| f == 3));
    let stderr = replay(900, &[]);
    assert!(!stderr.contains("not published"), "{stderr}");
    let published = fovea_tables(&lake);
    assert!(format_of(&assert_iceberg_reads_as_fovea(&lake)).iter().all(|&f| f == 3));
    replay(1200, &["--iceberg", "off"]);
    assert!(fovea_tables(&lake).0 > published.0, "no newer checkpoint");
    assert_iceberg_reads(&lake, &published, false);
}

/// Replays `input` into `lake` publishing Iceberg `format`, with small
/// blocks and files: blocks are combined into regular files and files with
/// many stale rows rewritten while checkpoints publish.
fn replay_small_files(lake: &Path, input: &Path, format: &str) {
    ok(fovea()
        .args(["replay", "--lake"])
        .arg(lake)
        .arg("--input")
        .arg(input)
        .args(["--iceberg", format, "--checkpoint-txns", "100", "--block-rows", "64", "--blocks-per-file", "4"])
        .output()
        .unwrap());
}

#[test]
fn combined_and_rewritten_files_publish_as_replacements_and_read_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let input = dir.path().join("hybench.jsonl");
    hybench(&input, 3000, 11);
    replay_small_files(&lake, &input, "v2");
    let first = fovea_tables(&lake);
    let summaries = assert_iceberg_reads(&lake, &first, false);
    assert!(summaries.iter().all(|s| s["format_version"] == 2), "{summaries:?}");
    // The lake's files were replaced along the way: some table's newest
    // snapshot carries files over and has removed some.
    assert!(
        summaries.iter().any(|s| s["operation"] == "overwrite"),
        "no snapshot replaced or deleted anything: {summaries:?}"
    );
    assert_manifests_carried(&summaries);
    // Rows appended later, published in format 3: the tables are upgraded
    // (their position delete files replaced by deletion vectors) and newer
    // snapshots published, incrementally, still exact.
    let more = dir.path().join("more.jsonl");
    hybench(&more, 4000, 11);
    replay_small_files(&lake, &more, "v3");
    let summaries = assert_iceberg_reads_as_fovea(&lake);
    assert!(summaries.iter().all(|s| s["format_version"] == 3), "{summaries:?}");
    assert_manifests_carried(&summaries);
    // Time travel: the snapshot of the first replay's last checkpoint reads
    // what fovea read then, though files it names were combined and
    // rewritten since.
    let travelled = assert_iceberg_reads(&lake, &first, true);
    for s in &travelled {
        assert_eq!(s["summary"]["fovea.checkpoint-ts"].as_str(), Some(first.0.to_string().as_str()), "{s}");
        assert!(s["snapshots"].as_array().unwrap().len() > 1, "no earlier snapshot kept: {s}");
    }
}

/// Publication is incremental in what readers read: some table's current
/// snapshot lists manifests an earlier snapshot added, and none lists more
/// than the carried bound plus the new one of each content.
fn assert_manifests_carried(summaries: &[serde_json::Value]) {
    let mut carried = false;
    for s in summaries {
        let id: i64 = s["summary"]["fovea.checkpoint-ts"].as_str().unwrap().parse().unwrap();
        let manifests = s["manifests"].as_array().unwrap();
        carried |= manifests.iter().any(|m| m["added_snapshot_id"].as_i64() != Some(id));
        // 16 carried, a new one, and for data the checkpoint's own blocks'.
        for (content, most) in [(0, 18), (1, 17)] {
            let n = manifests.iter().filter(|m| m["content"] == content).count();
            assert!(n <= most, "{n} manifests of content {content}: {s}");
        }
    }
    assert!(carried, "every current snapshot wrote all its manifests again: {summaries:?}");
}

/// `glue_catalog.py ARGS…` with the AWS environment of `moto`.
fn glue_catalog(moto: &fovea_testkit::moto::Moto, args: &[&str]) -> String {
    let script = fovea_testkit::package_dir!().join("tests/iceberg/glue_catalog.py");
    ok(std::process::Command::new(fovea_testkit::moto::python())
        .arg(&script)
        .args(args)
        .envs(moto.env())
        .output()
        .unwrap())
}

#[test]
fn tables_published_on_s3_read_exactly_through_s3_and_glue() {
    let moto = fovea_testkit::moto::Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("lake").unwrap();
    glue_catalog(&moto, &["create-database", "fovea_lake"]);
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("lake");
    let data = pg_tiny();
    let replay = |lake: &[&str]| {
        fovea()
            .envs(moto.env())
            .arg("replay")
            .args(lake)
            .arg("--input")
            .arg(data.join("debezium_events.jsonl.gz"))
            .arg("--schema-file")
            .arg(data.join("schema.sql"))
            .args(["--iceberg", "v3", "--checkpoint-txns", "7"])
            .output()
            .unwrap()
    };
    // A Glue database that does not exist is named, not created.
    let typo = replay(&["--lake", dir.path().join("other").to_str().unwrap(), "--iceberg-catalog", "glue://fovea_lak"]);
    assert!(!typo.status.success());
    let err = String::from_utf8_lossy(&typo.stderr);
    assert!(err.contains("the Glue database fovea_lak does not exist"), "{err}");
    let s3 = ["--lake", "s3://lake/pg-tiny", "--state", "dynamodb://fovea-iceberg"];
    ok(replay(&[&s3[..], &["--iceberg-catalog", "glue://fovea_lake"]].concat()));
    // The same replay into a local lake: fovea's reader of it is the oracle.
    ok(replay(&["--lake", local.to_str().unwrap()]));
    let expected = fovea_tables(&local);
    let locations: Vec<String> =
        expected.1.keys().map(|t| format!("s3://lake/pg-tiny/{}", fovea_iceberg::table_dir(t))).collect();
    let summaries = assert_iceberg_reads_at(&locations, &moto.env(), &expected, false);
    assert!(summaries.iter().all(|s| s["format_version"] == 3), "{summaries:?}");
    let keys = moto.list_keys("lake", "pg-tiny/iceberg/tpcc/stock/deletes/").unwrap();
    assert!(!keys.is_empty() && keys.iter().all(|k| k.ends_with(".puffin")), "{keys:?}");

    // Glue names every table's current metadata, as Athena finds it, and
    // pyiceberg's Glue catalog reads each equal to fovea's.
    let glue_names: Vec<String> = expected.1.keys().map(|t| t.replace('.', "_")).collect();
    let out = tempfile::tempdir().unwrap();
    let mut args = vec!["read", "fovea_lake", out.path().to_str().unwrap()];
    args.extend(glue_names.iter().map(String::as_str));
    let printed = glue_catalog(&moto, &args);
    let tables: Vec<serde_json::Value> = printed.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(tables.len(), expected.1.len());
    let mut moved = 0;
    for (i, (name, (schema, rows))) in expected.1.iter().enumerate() {
        let t = &tables[i];
        let location = format!("s3://lake/pg-tiny/{}", fovea_iceberg::table_dir(name));
        assert_eq!(t["location"], location.as_str(), "{t}");
        assert_eq!(t["parameters"]["table_type"], "ICEBERG", "{t}");
        assert_eq!(t["parameters"]["metadata_location"], t["current"], "{name}: Glue is not at the newest metadata");
        moved += usize::from(t["parameters"].get("previous_metadata_location").is_some());
        let user: Vec<&String> =
            schema.fields().iter().map(|f| f.name()).filter(|n| !n.starts_with("_fovea_")).collect();
        assert_eq!(t["columns"].as_array().unwrap().len(), user.len(), "{t}");
        let batches = read_parquet(&out.path().join("glue").join(format!("{i}.parquet")));
        let mut got: Vec<String> = batches.iter().flat_map(|b| rows_as_text(b, schema)).collect();
        got.sort();
        assert_eq!(got, *rows, "{name} through Glue");
    }
    assert!(moved > 0, "no Glue table's metadata pointer moved with a later checkpoint: {tables:?}");
}

#[test]
fn a_bad_iceberg_format_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = fovea()
        .args(["replay", "--lake"])
        .arg(dir.path().join("lake"))
        .args(["--input", "-", "--iceberg", "v4"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--iceberg v4: expected v2 (position deletes), v3 (deletion vectors) or off"), "{err}");
    // Options that need publishing, with publishing off: refused by name
    // before the lake is opened.
    let lake = dir.path().join("lake");
    for (command, option) in [
        ("replay", ["--iceberg-catalog", "glue://db"]),
        ("serve", ["--iceberg-rest", "127.0.0.1:0"]),
        ("serve", ["--iceberg-secs", "5"]),
    ] {
        let out = fovea()
            .args([command, "--lake"])
            .arg(&lake)
            .args(["--input", "-", "--iceberg", "off"])
            .args(option)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{command}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{} {}: ", option[0], option[1])) && err.contains("--iceberg is off")
                || err.contains("nothing is published with --iceberg off"),
            "{command}: {err}"
        );
        assert!(!lake.exists(), "{command} opened the lake");
    }
}

/// A HyBench stream of `txns` transactions in `dir`: its first quarter
/// written to `input.jsonl` (the file returned), the lines after it
/// returned to be appended while a replayer follows the file.
fn growing_hybench(dir: &Path, txns: u64) -> (std::path::PathBuf, Vec<String>) {
    let stream = dir.join("hybench.jsonl");
    hybench(&stream, txns, 5);
    let lines: Vec<String> = std::fs::read_to_string(&stream).unwrap().lines().map(str::to_owned).collect();
    let input = dir.join("input.jsonl");
    let (first, rest) = lines.split_at(lines.len() / 4);
    append(&input, first);
    (input, rest.to_vec())
}

/// `--iceberg-secs`: a serving replayer that checkpoints every 0.2 s
/// publishes at most once per interval, and its last checkpoint at a stop
/// whatever the interval; an interval past half the retention is refused.
#[test]
fn publications_keep_to_iceberg_secs_and_the_last_checkpoint_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let (input, rest) = growing_hybench(dir.path(), 2000);
    let status = || -> serde_json::Value {
        let out = fovea().args(["status", "--json", "--lake"]).arg(&lake).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let published = |s: &serde_json::Value| -> Vec<(u64, u64)> {
        s["tables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| Some((t["iceberg"]["metadata_version"].as_u64()?, t["iceberg"]["checkpoint_ts"].as_u64()?)))
            .collect()
    };
    let input_url = format!("file:{}", input.display());
    let server =
        Server::start(&lake, &input_url, &["--checkpoint-secs", "0.2", "--iceberg", "v2", "--iceberg-secs", "60"]);
    eventually(std::time::Duration::from_secs(60), "the first publication", || {
        let s = status();
        (!published(&s).is_empty()).then_some(())
    });
    let before = published(&status());
    // Three seconds of appends: fifteen checkpoints, no publication.
    let started = std::time::Instant::now();
    for chunk in rest.chunks(rest.len() / 6 + 1) {
        append(&input, chunk);
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let during = status();
    assert!(started.elapsed() < std::time::Duration::from_secs(55), "the test took too long to say anything");
    assert_eq!(published(&during), before, "published within --iceberg-secs 60");
    let checkpoint = |s: &serde_json::Value| s["checkpoint"]["checkpoint_ts"].as_u64().unwrap();
    assert!(before.iter().all(|&(_, ts)| ts < checkpoint(&during)), "no checkpoint since the publication");
    server.stop();
    let after = status();
    let last = checkpoint(&after);
    assert!(!published(&after).is_empty() && published(&after).iter().all(|&(_, ts)| ts == last), "{after}");
    // Past half the retention (files replaced stay 600 s): refused by name.
    let out =
        fovea().args(["replay", "--lake"]).arg(&lake).args(["--input", "-", "--iceberg-secs", "301"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--iceberg-secs 301: expected seconds from 0 to 300"), "{err}");
}

#[test]
fn publishing_a_lake_without_a_checkpoint_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("lake")).unwrap();
    let out = fovea().args(["iceberg", "--lake"]).arg(dir.path().join("lake")).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no checkpoint yet") || err.contains("not a lake") || err.contains("fovea lake"), "{err}");
}

#[test]
fn readers_of_a_serving_replayers_iceberg_tables_see_only_whole_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    // The initial load and a few transactions first; the rest while readers read.
    let (input, rest) = growing_hybench(dir.path(), 3000);
    let [rest_port] = free_ports();
    let rest_addr = format!("127.0.0.1:{rest_port}");
    let server = Server::start(
        &lake,
        &format!("file:{}", input.display()),
        &[
            "--iceberg",
            "v2",
            "--iceberg-rest",
            &rest_addr,
            "--token",
            "s3cret",
            "--checkpoint-secs",
            "0.3",
            "--block-rows",
            "64",
            "--blocks-per-file",
            "4",
        ],
    );
    let location = lake.join(fovea_iceberg::table_dir("hybench.account"));
    let script = fovea_testkit::package_dir!().join("tests/iceberg/read_while_publishing.py");
    let reader = std::process::Command::new(fovea_testkit::moto::python())
        .arg(&script)
        .arg(&location)
        .arg("25")
        .arg("SELECT count(*), sum(balance) FROM {table}")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Beside it, pyiceberg attached to the REST catalog pinned: account and
    // transfer of one attachment are at one checkpoint.
    let pinned = std::process::Command::new(fovea_testkit::moto::python())
        .arg(fovea_testkit::package_dir!().join("tests/iceberg/pinned_bank.py"))
        .arg(format!("http://{rest_addr}"))
        .arg("s3cret")
        .arg("25")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for chunk in rest.chunks(rest.len() / 20 + 1) {
        std::thread::sleep(std::time::Duration::from_millis(600));
        append(&input, chunk);
    }
    let read = reader.wait_with_output().unwrap();
    let answers = ok(read);
    // Every transfer moves money between two accounts in one transaction:
    // an answer that saw part of one has another total.
    let mut checkpoints = std::collections::BTreeSet::new();
    let mut reads = 0;
    for line in answers.lines() {
        let a: serde_json::Value = serde_json::from_str(line).unwrap();
        let count: i64 = a["row"][0].as_str().unwrap().parse().unwrap();
        let sum: i64 = a["row"][1].as_str().unwrap().parse().unwrap();
        assert_eq!(sum, count * 1_000_000, "a snapshot with part of a transfer: {line}");
        checkpoints.insert(a["ts"].as_u64().unwrap());
        reads += 1;
    }
    assert!(checkpoints.len() >= 3, "{reads} reads saw only checkpoints {checkpoints:?}\n{}", server.log());
    let pinned = ok(pinned.wait_with_output().unwrap());
    let mut at_by_attachment: BTreeMap<u64, u64> = BTreeMap::new();
    let mut fresh_compared = 0;
    for line in pinned.lines() {
        let a: serde_json::Value = serde_json::from_str(line).unwrap();
        let ts = a["account_ts"].as_u64().unwrap();
        assert_eq!(a["transfer_ts"].as_u64(), Some(ts), "tables of one attachment at two checkpoints: {line}");
        let attached_at = *at_by_attachment.entry(a["attachment"].as_u64().unwrap()).or_insert(ts);
        assert_eq!(attached_at, ts, "a pinned attachment moved to another checkpoint: {line}");
        assert_eq!(a["sum"].as_i64().unwrap(), a["count"].as_i64().unwrap() * 1_000_000, "part of a transfer: {line}");
        if !a["transfer_fresh"].is_null() {
            assert_eq!(a["account_fresh"], a["transfer_fresh"], "account and transfer at different points: {line}");
            fresh_compared += 1;
        }
    }
    let distinct: std::collections::BTreeSet<u64> = at_by_attachment.values().copied().collect();
    assert!(distinct.len() >= 3, "attachments saw only checkpoints {distinct:?}:\n{pinned}");
    assert!(fresh_compared > 0, "{pinned}");
    let log = server.stop();
    assert!(!log.contains("checkpoint not published"), "{log}");
    assert_iceberg_reads_as_fovea(&lake);
}

#[test]
fn the_rest_catalog_of_fovea_serve_answers_every_table_at_one_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let data = pg_tiny();
    let input = dir.path().join("input.jsonl");
    std::fs::write(&input, gunzip(&data.join("debezium_events.jsonl.gz"))).unwrap();
    let [rest] = free_ports();
    let rest_addr = format!("127.0.0.1:{rest}");
    let schema_file = data.join("schema.sql").display().to_string();
    let server = Server::start(
        &lake,
        &format!("file:{}", input.display()),
        &[
            "--iceberg",
            "v2",
            "--iceberg-rest",
            &rest_addr,
            "--token",
            "s3cret",
            "--schema-file",
            &schema_file,
            "--checkpoint-secs",
            "0.5",
        ],
    );
    let out = tempfile::tempdir().unwrap();
    let counts: BTreeMap<String, usize> = std::fs::read_to_string(data.join("final_tables/row_counts.txt"))
        .unwrap()
        .lines()
        .map(|l| {
            let (t, n) = l.split_once(' ').unwrap();
            (t.to_owned(), n.trim().parse().unwrap())
        })
        .collect();
    let script = fovea_testkit::package_dir!().join("tests/iceberg/rest_catalog.py");
    let read = std::process::Command::new(fovea_testkit::moto::python())
        .arg(&script)
        .arg(format!("http://{rest_addr}"))
        .arg("s3cret")
        .arg(out.path())
        .arg(serde_json::to_string(&counts).unwrap())
        .arg("90")
        .output()
        .unwrap();
    let printed = ok(read);
    let answer: serde_json::Value = serde_json::from_str(printed.trim()).unwrap();
    assert_eq!(answer["without_token"], 401, "{answer}");
    let snapshots = answer["snapshots"].as_object().unwrap();
    assert_eq!(snapshots.len(), counts.len(), "{answer}");
    let at: std::collections::BTreeSet<u64> = snapshots.values().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(at.len(), 1, "tables at different checkpoints: {answer}");
    server.stop();
    // The catalog answered once every table had PostgreSQL's final row
    // count: the whole stream, so the checkpoint fovea's reader opens now.
    let (ts, expected) = fovea_tables(&lake);
    assert_eq!(at.into_iter().next(), Some(ts));
    let listed: Vec<String> =
        answer["duckdb_tables"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_owned()).collect();
    assert_eq!(listed, expected.keys().cloned().collect::<Vec<_>>(), "the tables DuckDB lists");
    for (name, (schema, rows)) in &expected {
        for (reader, file) in [("pyiceberg", format!("{name}.parquet")), ("DuckDB", format!("duckdb/{name}.parquet"))] {
            let batches = read_parquet(&out.path().join(file));
            let mut got: Vec<String> = batches.iter().flat_map(|b| rows_as_text(b, schema)).collect();
            got.sort();
            assert_eq!(got, *rows, "{name} through the REST catalog, read by {reader}");
        }
    }
}

/// A Debezium stream (Kafka-style lines, transactions marked) of table
/// `s.items` whose columns change along the way: each element of `txns` is
/// one transaction's row changes (`op`, key id, after image or none).
fn debezium_stream(txns: &[Vec<(char, i64, Option<String>)>]) -> String {
    let mut out = String::new();
    let mut lsn = 1_000u64;
    for (t, rows) in txns.iter().enumerate() {
        let tx = t + 1;
        lsn += 8;
        out.push_str(&format!(
            r#"{{"topic":"gen.transaction","key":{{"id":"{tx}:{lsn}"}},"value":{{"status":"BEGIN","id":"{tx}:{lsn}","event_count":null,"data_collections":null,"ts_ms":1}}}}"#
        ));
        out.push('\n');
        for (i, (op, id, after)) in rows.iter().enumerate() {
            lsn += 8;
            let before = if *op == 'd' { format!(r#"{{"id":{id}}}"#) } else { "null".into() };
            let after = after.as_ref().map_or("null".to_owned(), |a| format!("{{{a}}}"));
            out.push_str(&format!(
                r#"{{"topic":"gen.s.items","key":{{"id":{id}}},"value":{{"before":{before},"after":{after},"source":{{"connector":"fovea-gen","schema":"s","table":"items","txId":{tx},"lsn":{lsn},"sequence":"[null,\"{lsn}\"]","ts_us":{lsn},"snapshot":"false"}},"op":"{op}","transaction":{{"id":"{tx}:0","total_order":{},"data_collection_order":0}}}}}}"#,
                i + 1
            ));
            out.push('\n');
        }
        lsn += 8;
        out.push_str(&format!(
            r#"{{"topic":"gen.transaction","key":{{"id":"{tx}:{lsn}"}},"value":{{"status":"END","id":"{tx}:{lsn}","event_count":{},"data_collections":[{{"data_collection":"s.items","event_count":{}}}],"ts_ms":1}}}}"#,
            rows.len(),
            rows.len()
        ));
        out.push('\n');
    }
    out
}

#[test]
fn schema_changes_publish_as_iceberg_schema_evolution_and_read_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let schema_file = dir.path().join("schema.sql");
    std::fs::write(&schema_file, "CREATE TABLE s.items (id integer PRIMARY KEY, n integer, price numeric(10,2));\n")
        .unwrap();
    let insert = |id: i64, n: i64| ('c', id, Some(format!(r#""id":{id},"n":{n},"price":"{id}.25""#)));
    let mut txns: Vec<Vec<(char, i64, Option<String>)>> = vec![(0..40).map(|i| insert(i, i)).collect()];
    // n outgrows integer (int → long), price outgrows numeric(10,2)
    // (decimal precision up): Iceberg promotions, same field ids.
    txns.push(vec![('u', 3, Some(r#""id":3,"n":5000000000,"price":"123456789012.50""#.into()))]);
    txns.push(vec![('d', 4, None), insert(40, 1)]);
    // A column appears and is gone again within one transaction (a row
    // image without it: dropped), so files hold a column no published
    // schema has; then another appears for good (old rows read NULL).
    txns.push(vec![('u', 5, Some(r#""id":5,"n":5,"price":"5.25","memo":"five""#.into())), insert(41, 2)]);
    txns.push(vec![('u', 6, Some(r#""id":6,"n":6,"price":"6.25","note":"six""#.into()))]);
    // The stream grows one transaction at a time, each replay publishing
    // the table after it: every schema change lands in its own snapshot.
    let stream = dir.path().join("changes.jsonl");
    // Transactions `txns` as the stream, replayed into the lake.
    let replay_upto = |txns: &[Vec<(char, i64, Option<String>)>]| {
        std::fs::write(&stream, debezium_stream(txns)).unwrap();
        ok(fovea()
            .args(["replay", "--lake"])
            .arg(&lake)
            .arg("--input")
            .arg(&stream)
            .arg("--schema-file")
            .arg(&schema_file)
            .args(["--iceberg", "v3"])
            .output()
            .unwrap());
    };
    for upto in 1..=txns.len() {
        replay_upto(&txns[..upto]);
        let summaries = assert_iceberg_reads_as_fovea(&lake);
        assert_eq!(summaries.len(), 1);
    }
    // The schema evolved in place: n is a long and price a wider decimal
    // under their first ids, note is a new field (4 is the hidden column,
    // 5 the note files held while it was gone from every schema).
    let location = lake.join(fovea_iceberg::table_dir("s.items")).join("metadata");
    let hint = std::fs::read_to_string(location.join("version-hint.text")).unwrap();
    let metadata: serde_json::Value =
        serde_json::from_slice(&std::fs::read(location.join(format!("v{}.metadata.json", hint.trim()))).unwrap())
            .unwrap();
    let schema = metadata["schemas"].as_array().unwrap().last().unwrap().clone();
    let field = |name: &str| schema["fields"].as_array().unwrap().iter().find(|f| f["name"] == name).cloned();
    assert_eq!(field("n").unwrap()["id"], 2, "{schema}");
    assert_eq!(field("n").unwrap()["type"], "long", "{schema}");
    assert_eq!(field("price").unwrap()["id"], 3, "{schema}");
    assert!(field("price").unwrap()["type"].as_str().unwrap().starts_with("decimal("), "{schema}");
    let note = field("note").unwrap()["id"].as_i64().unwrap();
    assert!(note > 3, "note is a field of its own: {schema}");
    assert!(metadata["schemas"].as_array().unwrap().len() >= 3, "one schema per change: {metadata}");

    // memo comes back under its name: a new field. fovea reads NULL in row
    // 5 (written before it came back); a file holds "five" under the name,
    // with the dropped field's id: Iceberg readers read NULL there too.
    txns.push(vec![('u', 7, Some(r#""id":7,"n":7,"price":"7.25","note":"seven","memo":"back""#.into()))]);
    replay_upto(&txns);
    assert_iceberg_reads_as_fovea(&lake);
    let memo = String::from_utf8_lossy(
        &fovea()
            .args(["sql", "--format", "csv", "--lake"])
            .arg(&lake)
            .arg("SELECT id, memo FROM s.items WHERE id IN (5, 7) ORDER BY id")
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert_eq!(memo.lines().skip(1).collect::<Vec<_>>(), ["5,", "7,back"], "{memo}");
}
