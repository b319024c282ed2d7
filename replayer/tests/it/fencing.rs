//! One writer per lake: a second `fovea serve` on the same lake waits for
//! the lease; a replayer paused past its lease (SIGSTOP) is taken over, and
//! when it resumes (SIGCONT) it is fenced: it exits with the fencing error
//! and nothing it does after the take-over lands. A replayer killed on this
//! host is taken over at once. The paused-replayer case runs on a local
//! lake and on S3 + DynamoDB (moto).

use crate::common;
use std::time::Duration;

use crate::common::{Server, append_txns, count_and_sum, eventually, expected, serve, signal, wait_timeout};

/// `fovea status --json` of the lake: its writer as the state store says.
fn writer(lake_args: &[String], env: &[(&'static str, String)]) -> serde_json::Value {
    let out = common::fovea().args(["status", "--json"]).args(lake_args).envs(env.iter().cloned()).output().unwrap();
    let status: serde_json::Value = serde_json::from_str(&common::ok(out)).unwrap();
    status["writer"].clone()
}

fn paused_replayer_scenario(lake_args: &[String], env: &[(&'static str, String)]) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("events.jsonl");
    let spec = format!("file:{}", input.display());
    let opts = ["--lease-secs", "1", "--checkpoint-secs", "0.2"];
    append_txns(&input, 1..21);
    let mut a = serve(dir.path(), lake_args, env, &spec, &opts);
    eventually(Duration::from_secs(60), "A replays the first transactions", || {
        (count_and_sum(&a)? == expected(21)).then_some(())
    });
    // `fovea status` on the live lake: A holds the lease.
    let held_by_a = writer(lake_args, env);
    assert_eq!(held_by_a["state"], "held", "{held_by_a}");
    let epoch_a = held_by_a["epoch"].as_u64().unwrap();

    // A pauses; more changes arrive; B starts on the same lake, waits for
    // A's lease to expire, takes over and replays everything.
    signal(&a, "-STOP");
    // On the embedded state store, a pause inside a write transaction
    // keeps SQLite's lock, which no successor can take (a lease cannot
    // help: the lock is the paused process's): pause A between its writes.
    if let [flag, lake] = lake_args
        && flag == "--lake"
    {
        let state = std::path::Path::new(lake).join(fovea_core::engine::METADATA_DIR);
        let mut tries = 0;
        while sqlite_write_locked(&state) {
            tries += 1;
            assert!(tries < 200, "A holds its state's write lock whenever it is paused");
            signal(&a, "-CONT");
            std::thread::sleep(Duration::from_millis(10));
            signal(&a, "-STOP");
        }
    }
    append_txns(&input, 21..41);
    let b = serve(dir.path(), lake_args, env, &spec, &opts);
    assert!(b.log().contains("waiting for the lake's lease"), "{}", b.log());
    eventually(Duration::from_secs(60), "B replays everything", || (count_and_sum(&b)? == expected(41)).then_some(()));
    // `fovea status` shows the take-over: another holder, a higher epoch.
    let held_by_b = writer(lake_args, env);
    assert_eq!(held_by_b["state"], "held", "{held_by_b}");
    assert!(held_by_b["epoch"].as_u64().unwrap() > epoch_a, "{held_by_a} → {held_by_b}");
    assert_ne!(held_by_b["owner"], held_by_a["owner"], "{held_by_a} → {held_by_b}");

    // A resumes: it notices it was fenced and exits with the fencing error.
    signal(&a, "-CONT");
    let status = wait_timeout(&mut a.child, Duration::from_secs(30));
    let log = a.log();
    assert!(status.is_some_and(|s| !s.success()), "A did not stop: {status:?}\n{log}");
    assert!(log.contains("fenced"), "{log}");

    // B goes on; what it serves, and what a restart reads from the lake,
    // is exactly the input, whatever A tried after the take-over.
    append_txns(&input, 41..51);
    eventually(Duration::from_secs(60), "B replays the rest", || (count_and_sum(&b)? == expected(51)).then_some(()));
    let log = b.stop();
    assert!(log.contains("took over the lake's lease"), "{log}");
    // B released its lease on a clean stop: C does not wait for it.
    let c = serve(dir.path(), lake_args, env, &spec, &opts);
    assert!(!c.log().contains("waiting for the lake's lease"), "{}", c.log());
    assert_eq!(count_and_sum(&c).unwrap(), expected(51));
    assert_eq!(c.sql("SELECT count(DISTINCT v) FROM public.t").unwrap(), "50\n");
}

/// Whether a write transaction holds one of the SQLite files of the lake
/// state in `dir` (asked without waiting).
fn sqlite_write_locked(dir: &std::path::Path) -> bool {
    ["txn.sqlite", "catalog.sqlite"].iter().any(|file| {
        let conn = rusqlite::Connection::open(dir.join(file)).unwrap();
        conn.busy_timeout(Duration::ZERO).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;").is_err()
    })
}

#[test]
fn a_paused_replayer_is_taken_over_and_fenced_when_it_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake").display().to_string();
    paused_replayer_scenario(&["--lake".into(), lake], &[]);
}

#[test]
fn on_s3_and_dynamodb_too() {
    let moto = fovea_testkit::moto::Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("fenced").unwrap();
    let args = ["--lake", "s3://fenced/lake", "--state", "dynamodb://fovea-fenced"].map(str::to_owned);
    paused_replayer_scenario(&args, &moto.env());
}

#[test]
fn a_killed_replayer_is_taken_over_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let input = dir.path().join("events.jsonl");
    let spec = format!("file:{}", input.display());
    append_txns(&input, 1..11);
    // A long lease: only the dead-owner check lets B in quickly.
    let opts = ["--lease-secs", "600", "--checkpoint-secs", "0.2"];
    let a = Server::start(&lake, &spec, &opts);
    eventually(Duration::from_secs(60), "A replays", || (count_and_sum(&a)? == expected(11)).then_some(()));
    a.kill();
    append_txns(&input, 11..21);
    let began = std::time::Instant::now();
    let b = Server::start(&lake, &spec, &opts);
    assert!(began.elapsed() < Duration::from_secs(60), "B waited for a dead replayer's lease");
    eventually(Duration::from_secs(60), "B replays everything", || (count_and_sum(&b)? == expected(21)).then_some(()));
}

/// A state store that stops answering while `fovea serve` holds the lease
/// (DynamoDB stalled behind an HTTP layer: every call hangs): the renewals
/// run into their deadlines, and once the lease's expiry passes the
/// replayer stops with an error saying so — it neither hangs nor goes on
/// writing.
#[test]
fn a_stalled_state_store_ends_in_a_stop_not_a_hang() {
    let moto = fovea_testkit::moto::Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("stalled").unwrap();
    let proxy =
        fovea_testkit::moto::FaultProxy::start(&moto.endpoint, &["--match", "DynamoDB_", "--stall-after", "12"])
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("events.jsonl");
    let spec = format!("file:{}", input.display());
    let mut env = moto.env();
    env.push(("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint.clone()));
    env.push(("FOVEA_AWS_ATTEMPT_SECS", "1".into()));
    env.push(("FOVEA_AWS_OPERATION_SECS", "2".into()));
    let lake = ["--lake", "s3://stalled/lake", "--state", "dynamodb://fovea-stalled"].map(str::to_owned);
    append_txns(&input, 1..11);
    let mut server = serve(dir.path(), &lake, &env, &spec, &["--lease-secs", "3", "--checkpoint-secs", "0.5"]);
    eventually(Duration::from_secs(10), "the first transactions", || {
        (count_and_sum(&server)? == expected(11)).then_some(())
    });
    let status = wait_timeout(&mut server.child, Duration::from_secs(90));
    let log = server.log();
    assert!(status.is_some_and(|s| !s.success()), "still running with its state store stalled: {status:?}\n{log}");
    assert!(log.contains("expired") && log.contains("without a successful renewal"), "{log}");
    assert!(proxy.stats().get("stalled").copied().unwrap_or(0) > 0, "{:?}", proxy.stats());
}
