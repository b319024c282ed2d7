//! Replay under injected faults (`FOVEA_FAULTS`, see `fovea_core::faults`):
//! requests to the object store, the timestamp store and the catalog fail
//! before they are applied, or are applied and then reported failed, with
//! random latency and multipart uploads cut off. Each run either finishes
//! or stops with an error that names the injected fault (never a panic, a
//! hang or a silent success); rerun after every stop, the replay ends with
//! every table equal to PostgreSQL's (pg-tiny), or to an uninterrupted
//! replay of the same generated stream (HyBench, larger).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{fovea, gunzip, ok, pg_tiny as data, pg_tiny_tables as tables};

/// Replays `input` into `lake` under faults (a new seed per run) until a
/// run finishes; the number of runs that stopped.
fn replay_with_faults(lake: &Path, input: &Path, rates: &str) -> usize {
    let began = Instant::now();
    let mut stops = 0;
    for seed in 1.. {
        let plan = format!("seed={seed},{rates}");
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
    let stops = replay_with_faults(&lake, &input, "errors=0.01,after=0.01,latency_ms=1,multipart=0.3");
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

#[test]
fn a_generated_stream_replayed_under_injected_faults_equals_an_uninterrupted_replay() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("hybench.jsonl");
    ok(fovea().args(["gen", "hybench", "--txns", "6000", "--output"]).arg(&input).output().unwrap());
    let clean = dir.path().join("clean");
    ok(fovea().args(["replay", "--lake", clean.to_str().unwrap(), "--input"]).arg(&input).output().unwrap());
    let faulty = dir.path().join("faulty");
    let stops = replay_with_faults(&faulty, &input, "errors=0.003,after=0.003,latency_ms=1,multipart=0.3");
    assert!(stops >= 10, "only {stops} runs stopped: the faults did not bite");
    for t in ["hybench.account", "hybench.transfer"] {
        let export = |lake: &Path| {
            ok(fovea().args(["export", "--table", t, "--lake", lake.to_str().unwrap()]).output().unwrap())
        };
        assert_eq!(export(&faulty), export(&clean), "{t} after {stops} stops");
    }
}
