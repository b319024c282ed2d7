//! Combine and storage GC run by the Lambda functions (`functions/combine`,
//! `functions/gc`), with `cargo lambda watch` as the local Lambda endpoint
//! and moto as S3 and DynamoDB, as a user runs them:
//! `fovea serve --lake s3://… --functions lambda://fovea`.
//! * an update-heavy stream replayed while the replayer hands every combine
//!   and rewrite to the functions ends with every table equal to an
//!   in-process replay of the same stream, nothing left past the GC
//!   threshold, the rewritten files smaller by the stale rows they held,
//!   and no failed invocation;
//! * with the GC function dying mid-write (both instances), the rewrite
//!   fails (retried once, then abandoned and counted) and the tables stay
//!   exact; healthy instances started then do the rewrites, and a reopened
//!   lake (whose recovery vacuums what the dead attempts left) reads the
//!   same;
//! * with Lambda throttling and losing answers of invocations that ran
//!   (an HTTP fault layer in front of the endpoint), the rewrites still
//!   happen and the tables stay exact;
//! * a replayer paused during its rewrites and taken over, resumed while
//!   its successor is paused, deletes and overwrites no object (listing
//!   and ETags compared) before it is fenced, and the successor ends exact.

use crate::common;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{Server, eventually, ok};
use fovea_testkit::lambda_local::LocalLambda;
use fovea_testkit::moto::Moto;

const TABLES: [&str; 2] = ["hybench.account", "hybench.transfer"];

fn fovea(moto: &Moto) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fovea"));
    c.envs(moto.env());
    c
}

/// A function binary, built beside `fovea` by `cargo build --workspace`.
fn function(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_fovea")).with_file_name(name)
}

/// The local endpoint with both rewrite functions; `gc_env` goes to the
/// GC function's instances only.
fn functions(moto: &Moto, gc_env: &[(String, String)]) -> LocalLambda {
    let env: Vec<(String, String)> = moto.env().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let workspace = fovea_testkit::workspace_dir();
    let mut lambda = LocalLambda::start(&workspace, &function("fovea-combine"), 2, &env).unwrap();
    lambda.add_function(&function("fovea-gc"), 2, gc_env).unwrap();
    lambda
}

/// An update-heavy hybench stream (every account updated many times).
fn stream(dir: &Path) -> PathBuf {
    let path = dir.join("hybench.jsonl");
    common::hybench(&path, 30_000, 7);
    path
}

/// Small blocks and files, so combine and storage GC have work in a short
/// stream.
const BLOCKS: [&str; 4] = ["--block-rows", "1024", "--blocks-per-file", "4"];

/// `fovea serve` of `input` into the S3 lake `prefix`, rewrites by the
/// functions behind the Lambda endpoint `lambda`.
fn serve(moto: &Moto, lambda: &str, prefix: &str, input: &Path, functions: &str, extra: &[&str]) -> Server {
    Server::spawn_with(|[port, mport]| {
        let stderr = input.with_extension(format!("serve-{port}.log"));
        let mut cmd = fovea(moto);
        cmd.args(["serve", "--lake", &format!("s3://lake/{prefix}"), "--state", &format!("dynamodb://fovea-{prefix}")])
            .arg("--input")
            .arg(format!("file:{}", input.display()))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--metrics", &format!("127.0.0.1:{mport}")])
            .args(["--gc-secs", "1", "--checkpoint-secs", "2", "--storage-gc-threshold", "0.3", "--shards", "2"])
            .args(BLOCKS)
            .args(["--functions", functions])
            .args(extra)
            .env("AWS_ENDPOINT_URL_LAMBDA", lambda)
            .env("FOVEA_LOG", std::env::var("FOVEA_TEST_LOG").unwrap_or_else(|_| "info".into()))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap());
        (cmd, stderr, Some(format!("127.0.0.1:{mport}")))
    })
}

fn export<S: AsRef<std::ffi::OsStr>>(moto: &Moto, lake: &[S], table: &str) -> String {
    ok(fovea(moto).args(["export", "--table", table]).args(lake).output().unwrap())
}

/// The same stream replayed in process into a local lake: the reference.
fn reference(moto: &Moto, dir: &Path, input: &Path) -> Vec<String> {
    let lake = dir.join("reference");
    let args = ["--lake", lake.to_str().unwrap()];
    ok(fovea(moto).arg("replay").args(args).args(BLOCKS).arg("--input").arg(input).output().unwrap());
    TABLES.iter().map(|t| export(moto, &args, t)).collect()
}

fn s3_lake(prefix: &str) -> [String; 4] {
    ["--lake".into(), format!("s3://lake/{prefix}"), "--state".into(), format!("dynamodb://fovea-{prefix}")]
}

/// Every table of the S3 lake `prefix` equals `expected` (in [`TABLES`] order).
fn assert_tables(moto: &Moto, prefix: &str, expected: &[String], when: &str) {
    for (t, expected) in TABLES.iter().zip(expected) {
        assert_eq!(&export(moto, &s3_lake(prefix), t), expected, "{t} {when}");
    }
}

#[test]
fn combine_and_storage_gc_in_lambda_functions_leave_the_tables_exact_and_the_lake_smaller() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("lake").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = stream(dir.path());
    let lambda = functions(&moto, &[]);
    let server = serve(&moto, &lambda.endpoint(), "fn", &input, "lambda://fovea?concurrency=3&timeout_s=60", &[]);

    // Caught up, with rewrites done and nothing left past the threshold.
    let metrics = eventually(Duration::from_secs(240), "replayed, combined and garbage-collected", || {
        let lag = server.metric("fovea_input_lag_bytes");
        let rewritten = server.metric("fovea_files_rewritten_total");
        let queued = server.metric("fovea_storage_gc_queued");
        (lag == 0.0 && rewritten > 0.0 && queued == 0.0).then(|| server.metrics())
    });
    let value = |name: &str| common::metric_value(&metrics, name);
    assert!(value("fovea_files_combined_total") > 0.0, "{metrics}");
    assert_eq!(value("fovea_rewrites_failed_total"), 0.0, "{metrics}\n{}", lambda.instance_logs());
    assert!(
        value("fovea_rewrites_total") >= value("fovea_files_combined_total") + value("fovea_files_rewritten_total")
    );
    let (before, after) = (value("fovea_storage_gc_bytes_before_total"), value("fovea_storage_gc_bytes_after_total"));
    assert!(before > 0.0 && after < 0.8 * before, "rewritten files: {before} bytes before, {after} after");
    assert!(value("fovea_stale_rows_dropped_total") > 0.0, "{metrics}");
    // The work ran in the functions, not in the replayer.
    let logs = lambda.instance_logs();
    assert!(logs.contains("rewritten"), "{logs}");
    let log = server.stop();
    assert!(log.contains("rewrites run in Lambda functions"), "{log}");
    // Each invocation logged one metrics line (CloudWatch EMF, dimension
    // Function), which add up to what the replayer counted.
    // (Read after the stop: no rewrite is in flight any more.)
    let emf = common::emf_records(&lambda.instance_logs());
    for r in &emf {
        let d = &r["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(
            (&d["Namespace"], &d["Dimensions"]),
            (&serde_json::json!("fovea"), &serde_json::json!([["Function"]]))
        );
        assert!(r["Function"] == "combine" || r["Function"] == "gc", "{r}");
        assert_eq!((r["invocations"].as_f64(), r["failures"].as_f64()), (Some(1.0), Some(0.0)), "{r}");
        assert!(r["duration_ms"].as_f64().unwrap() >= r["rewrite_ms"].as_f64().unwrap() * 0.5, "{r}");
        assert!(r["bytes_written"].as_f64().unwrap() > 0.0 && r["rows"].as_f64().is_some(), "{r}");
    }
    let count = |f: &str| emf.iter().filter(|r| r["Function"] == f).count() as f64;
    assert!(count("combine") >= value("fovea_files_combined_total"), "{} lines", emf.len());
    assert!(count("gc") >= value("fovea_files_rewritten_total"), "{} lines", emf.len());
    assert!(count("combine") + count("gc") >= value("fovea_rewrites_total"), "{} lines", emf.len());
    let rows: f64 = emf.iter().map(|r| r["rows"].as_f64().unwrap()).sum();
    assert!(rows >= value("fovea_rewrite_rows_total"), "{rows}");

    let expected = reference(&moto, dir.path(), &input);
    assert_tables(&moto, "fn", &expected, "after the run");
}

#[test]
fn a_gc_function_dying_mid_write_changes_no_table() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("lake").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = stream(dir.path());
    let kill = [("FOVEA_KILL_AT".to_owned(), "mid_write".to_owned())];
    let mut lambda = functions(&moto, &kill);
    let server = serve(&moto, &lambda.endpoint(), "dying", &input, "lambda://fovea?timeout_s=20", &[]);

    let failed = eventually(Duration::from_secs(240), "a failed rewrite after catching up", || {
        let lag = server.metric("fovea_input_lag_bytes");
        let failed = server.metric("fovea_rewrites_failed_total");
        (lag == 0.0 && failed > 0.0).then_some(failed)
    });
    assert!(failed >= 1.0);
    assert_eq!(server.metric("fovea_files_rewritten_total"), 0.0);
    assert!(server.metric("fovea_files_combined_total") > 0.0, "combine is unaffected");
    assert_eq!(lambda.running("fovea-gc"), 0, "the GC instances died:\n{}", lambda.instance_logs());
    for t in TABLES {
        assert!(!export(&moto, &s3_lake("dying"), t).is_empty(), "{t} reads while the rewrites fail");
    }
    // Healthy instances take over; the next rounds rewrite.
    lambda.spawn("fovea-gc", &[]).unwrap();
    lambda.spawn("fovea-gc", &[]).unwrap();
    eventually(Duration::from_secs(240), "rewrites by the new instances", || {
        (server.metric("fovea_files_rewritten_total") > 0.0 && server.metric("fovea_storage_gc_queued") == 0.0)
            .then_some(())
    });
    let log = server.stop();
    assert!(log.contains("storage GC left the file as it was"), "{log}");

    let expected = reference(&moto, dir.path(), &input);
    assert_tables(&moto, "dying", &expected, "after the run");
    // No half-written object is left under the table's files but those the
    // lake names: a reopened lake (its recovery vacuums) reads the same.
    let again =
        ok(fovea(&moto).arg("replay").args(s3_lake("dying")).args(BLOCKS).arg("--input").arg(&input).output().unwrap());
    assert!(again.contains("replayed 0 transactions"), "{again}");
    assert_tables(&moto, "dying", &expected, "after recovery");
}

#[test]
fn lambda_throttling_and_lost_answers_leave_the_tables_exact() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("lake").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = stream(dir.path());
    let lambda = functions(&moto, &[]);
    // Seeded: the proxy's rolls are a fixed sequence per request count. Seed
    // 18 throttles the first request and loses the second's answer, so both
    // faults are dealt however few rewrites a fast run asks for (seed 5 dealt
    // no lost answer in a run of 20 requests).
    let faults = ["--throttle", "0.3", "--after", "0.15", "--delay-ms", "50", "--seed", "18"];
    let proxy = fovea_testkit::moto::FaultProxy::start(&lambda.endpoint(), &faults).unwrap();
    let server = serve(&moto, &proxy.endpoint, "throttled", &input, "lambda://fovea?concurrency=3&timeout_s=60", &[]);
    eventually(Duration::from_secs(300), "replayed, combined and garbage-collected", || {
        let lag = server.metric("fovea_input_lag_bytes");
        let rewritten = server.metric("fovea_files_rewritten_total");
        let queued = server.metric("fovea_storage_gc_queued");
        (lag == 0.0 && rewritten > 0.0 && queued == 0.0).then_some(())
    });
    assert!(server.metric("fovea_files_combined_total") > 0.0);
    let log = server.stop();
    let stats = proxy.stats();
    assert!(
        stats.get("throttled").copied().unwrap_or(0) > 0 && stats.get("after").copied().unwrap_or(0) > 0,
        "{stats:?}"
    );
    assert!(!log.contains("ERROR"), "{log}");
    let expected = reference(&moto, dir.path(), &input);
    assert_tables(&moto, "throttled", &expected, "after the run");
}

#[test]
fn a_zombie_replayer_deletes_and_overwrites_nothing_of_its_successor() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("lake").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = stream(dir.path());
    let lambda = functions(&moto, &[]);
    let fns = "lambda://fovea?concurrency=2&timeout_s=60";
    // A replays and rewrites; it is paused in the middle of it.
    let a = serve(&moto, &lambda.endpoint(), "zombie", &input, fns, &["--lease-secs", "2"]);
    eventually(Duration::from_secs(240), "A combines", || (a.metric("fovea_files_combined_total") > 0.0).then_some(()));
    common::signal(&a, "-STOP");
    // B takes over, catches up and rewrites, and is paused in turn (its
    // lease outlasts the pause).
    let b = serve(&moto, &lambda.endpoint(), "zombie", &input, fns, &["--lease-secs", "600"]);
    eventually(Duration::from_secs(240), "B catches up and rewrites", || {
        let done = b.metric("fovea_input_lag_bytes") == 0.0 && b.metric("fovea_files_rewritten_total") > 0.0;
        done.then_some(())
    });
    common::signal(&b, "-STOP");
    // B's requests sent before the pause still land: the lake as B left
    // it is a listing that no longer changes.
    let mut last = moto.list_objects("lake", "zombie/").unwrap();
    let before = eventually(Duration::from_secs(120), "B's lake to stop changing", || {
        std::thread::sleep(Duration::from_secs(1));
        let again = moto.list_objects("lake", "zombie/").unwrap();
        let settled = again == last;
        last = again;
        settled.then(|| last.clone())
    });
    // A resumes with B's objects in place: it is fenced and stops.
    common::signal(&a, "-CONT");
    let mut a = a;
    let status = common::wait_timeout(&mut a.child, Duration::from_secs(60));
    assert!(status.is_some_and(|s| !s.success()), "A did not stop: {status:?}\n{}", a.log());
    assert!(a.log().contains("fenced"), "{}", a.log());
    let after = moto.list_objects("lake", "zombie/").unwrap();
    for (key, etag) in &before {
        assert_eq!(after.get(key), Some(etag), "the zombie deleted or overwrote {key}\n{}", a.log());
    }
    // B goes on and ends exact.
    common::signal(&b, "-CONT");
    eventually(Duration::from_secs(120), "B still serving", || b.sql("SELECT 1").ok());
    let log = b.stop();
    assert!(log.contains("took over the lake's lease"), "{log}");
    let expected = reference(&moto, dir.path(), &input);
    assert_tables(&moto, "zombie", &expected, "after the take-over");
}
