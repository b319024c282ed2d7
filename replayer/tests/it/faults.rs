//! Replay under injected faults (`FOVEA_FAULTS`, see `fovea_core::faults`):
//! requests to the object store, the timestamp store and the catalog fail
//! before they are applied, or are applied and then reported failed, with
//! random latency and multipart uploads cut off. Each run either finishes
//! or stops with an error that names the injected fault (never a panic, a
//! hang or a silent success); rerun after every stop, the replay ends with
//! every table equal to PostgreSQL's (pg-tiny), or to an uninterrupted
//! replay of the same generated stream (HyBench, larger).

use crate::common;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{fovea, gunzip, ok, pg_tiny as data, pg_tiny_tables as tables};

/// Replays `input` into `lake` under faults (a new seed per run) until a
/// run finishes; the number of runs that stopped. Until two runs have
/// stopped, the error rates are five times `errors`: at the given rates a
/// run now and then draws no fault at all, and the test is about runs that
/// stop.
fn replay_with_faults(lake: &Path, input: &Path, errors: f64, rates: &str) -> usize {
    let began = Instant::now();
    let mut stops = 0;
    for seed in 1.. {
        let p = if stops < 2 { errors * 5.0 } else { errors };
        let plan = format!("seed={seed},errors={p},after={p},{rates}");
        let out = fovea()
            .env("FOVEA_FAULTS", &plan)
            .args(["replay", "--lake", lake.to_str().unwrap(), "--checkpoint-txns", "40", "--input"])
            .arg(input)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{plan}: {stderr}");
        if out.status.success() {
            break;
        }
        assert!(stderr.contains("injected fault"), "{plan}: a stop that does not name its fault: {stderr}");
        eprintln!("{plan}: {}", stderr.lines().last().unwrap_or_default());
        stops += 1;
        assert!(began.elapsed() < Duration::from_secs(600), "no complete replay after {stops} stops: {stderr}");
    }
    stops
}

#[test]
fn pg_tiny_replayed_under_injected_faults_equals_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let input = data().join("debezium_events.precise_schemas.jsonl.gz");
    let stops = replay_with_faults(&lake, &input, 0.01, "latency_ms=1,multipart=0.3");
    assert!(stops >= 2, "only {stops} runs stopped: the faults did not bite");
    // Read back without faults: every table equals PostgreSQL's.
    for t in tables() {
        let expected = gunzip(&data().join(format!("final_tables/{t}.csv.gz")));
        let got = ok(fovea().args(["export", "--table", &t, "--lake", lake.to_str().unwrap()]).output().unwrap());
        assert_eq!(got, expected, "{t} after {stops} stops");
    }
    // A replay after the end changes nothing.
    let again = ok(fovea().args(["replay", "--lake", lake.to_str().unwrap(), "--input"]).arg(&input).output().unwrap());
    assert!(again.contains("replayed 0 transactions"), "{again}");
}

/// Files under `dir`, recursively.
fn walk_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| if p.is_dir() { walk_files(&p) } else { 1 })
        .sum()
}

/// Every delete failing (old checkpoints, retired blocks): clean-up after a
/// committed checkpoint is retried later, so the replay neither stops nor
/// loses anything; the objects stay until a delete works.
#[test]
fn failing_deletes_never_stop_a_replay() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let input = data().join("debezium_events.precise_schemas.jsonl.gz");
    let out = fovea()
        .env("FOVEA_FAULTS", "seed=1,deletes=1")
        .args(["replay", "--lake", lake.to_str().unwrap(), "--checkpoint-txns", "10", "--input"])
        .arg(&input)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("stay until the next checkpoint"), "no clean-up failed: {stderr}");
    // More checkpoint objects stay than after the same replay without faults.
    let files = |lake: &Path| walk_files(&lake.join("_fovea/checkpoints"));
    let clean = dir.path().join("clean");
    ok(fovea()
        .args(["replay", "--lake", clean.to_str().unwrap(), "--checkpoint-txns", "10", "--input"])
        .arg(&input)
        .output()
        .unwrap());
    assert!(files(&lake) > files(&clean), "old checkpoints were deleted although every delete failed");
    for t in tables() {
        let expected = gunzip(&data().join(format!("final_tables/{t}.csv.gz")));
        let got = ok(fovea().args(["export", "--table", &t, "--lake", lake.to_str().unwrap()]).output().unwrap());
        assert_eq!(got, expected, "{t}");
    }
}

#[test]
fn a_generated_stream_replayed_under_injected_faults_equals_an_uninterrupted_replay() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("hybench.jsonl");
    common::hybench(&input, 12_000, 1);
    let clean = dir.path().join("clean");
    ok(fovea().args(["replay", "--lake", clean.to_str().unwrap(), "--input"]).arg(&input).output().unwrap());
    let faulty = dir.path().join("faulty");
    // How many runs stop depends on how requests interleave with the
    // flusher and the checkpoint writer (a seed picks faults by request
    // number; checkpoints are written back to back, so their number
    // depends on how fast they are): 0.01 stopped 4-16 runs of the
    // 12,000 transactions in trials, 0.015 more; fewer than 3 means the
    // faults did not reach the replay. Runs that stop while a checkpoint is being written
    // resume exactly (a resume point is never at a committed END).
    let stops = replay_with_faults(&faulty, &input, 0.015, "latency_ms=1,multipart=0.3");
    assert!(stops >= 3, "only {stops} runs stopped: the faults did not bite");
    for t in ["hybench.account", "hybench.transfer"] {
        let export = |lake: &Path| {
            ok(fovea().args(["export", "--table", t, "--lake", lake.to_str().unwrap()]).output().unwrap())
        };
        assert_eq!(export(&faulty), export(&clean), "{t} after {stops} stops");
    }
}

/// `fovea serve` following a growing file under faults, a new seed per run:
/// before each run the file grows by the next twelfth of the stream (cut at
/// a line, so a transaction may be split across runs), which gives every
/// run work to fail in. Each run stops with an error naming its fault, or is
/// still serving after a while and stops on SIGTERM (cleanly, or naming a
/// fault of its final checkpoint). A last run without faults catches up to
/// exactly the uninterrupted replay.
#[test]
fn serve_under_injected_faults_restarts_to_exact() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("hybench-whole.jsonl");
    common::hybench(&whole, 3_000, 3);
    let clean = dir.path().join("clean");
    ok(fovea().args(["replay", "--lake", clean.to_str().unwrap(), "--input"]).arg(&whole).output().unwrap());
    let lines: Vec<String> = std::fs::read_to_string(&whole).unwrap().lines().map(|l| format!("{l}\n")).collect();
    let input = dir.path().join("hybench.jsonl");
    let mut growing = std::fs::File::create(&input).unwrap();
    let lake = dir.path().join("faulty");
    let (mut stopped_by_fault, mut survived) = (0, 0);
    for seed in 1..=12 {
        let part = &lines[lines.len() * (seed - 1) / 12..lines.len() * seed / 12];
        std::io::Write::write_all(&mut growing, part.concat().as_bytes()).unwrap();
        let log = dir.path().join(format!("serve-{seed}.log"));
        let mut child = fovea()
            .env("FOVEA_FAULTS", format!("seed={seed},errors=0.01,after=0.01,latency_ms=1,multipart=0.3"))
            .args(["serve", "--lake", lake.to_str().unwrap(), "--input", input.to_str().unwrap()])
            .args(["--listen", &format!("127.0.0.1:{}", common::free_port()), "--checkpoint-secs", "0.2"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let status = match common::wait_timeout(&mut child, Duration::from_secs(4)) {
            Some(status) => status,
            None => {
                survived += 1;
                let pid = child.id().to_string();
                assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
                common::wait_timeout(&mut child, Duration::from_secs(60))
                    .unwrap_or_else(|| panic!("seed {seed}: no stop within 60 s of SIGTERM"))
            }
        };
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(!text.contains("panicked"), "seed {seed}: {text}");
        if !status.success() {
            assert!(text.contains("injected fault"), "seed {seed}: a stop that does not name its fault: {text}");
            stopped_by_fault += 1;
        }
    }
    assert!(stopped_by_fault >= 4, "only {stopped_by_fault} of 12 runs stopped on a fault");
    // Without faults: catches up to exactly the uninterrupted replay.
    let server = common::Server::start(&lake, input.to_str().unwrap(), &["--checkpoint-secs", "0.2"]);
    let export = |lake: &Path, t: &str| {
        ok(fovea().args(["export", "--table", t, "--lake", lake.to_str().unwrap()]).output().unwrap())
    };
    for t in ["hybench.account", "hybench.transfer"] {
        let expected = export(&clean, t);
        common::eventually(Duration::from_secs(60), &format!("{t} after {stopped_by_fault} faulted stops"), || {
            (export(&lake, t) == expected).then_some(())
        });
    }
    server.stop();
    eprintln!("{stopped_by_fault} runs stopped on a fault, {survived} were still serving after 4 s");
}
