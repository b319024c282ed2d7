//! The `fovea` command line, run as a user runs it.

use std::process::Command;

fn fovea() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fovea"))
}

#[test]
fn bench_components_prints_every_field_as_json() {
    let out = fovea().args(["bench", "components", "--quick", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for field in [
        "visibility_deletes_per_s",
        "bitmap_tiles_per_s",
        "index_updates_per_s",
        "txn_begin_commit_per_s",
        "write_buffer_rows_per_s",
        "visibility_bits_per_tuple",
        "vfor_overhead_ratio",
    ] {
        let x = v[field].as_f64().unwrap_or_else(|| panic!("{field} missing in {v}"));
        assert!(x > 0.0, "{field} = {x}");
    }
    assert!(v["visibility_bits_per_tuple"].as_f64().unwrap() <= 1.05);
}

#[test]
fn bench_query_prints_every_ratio_as_json() {
    let out = fovea().args(["bench", "query", "--rows", "20000", "--rounds", "1", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for field in [
        "live_over_static_ratio",
        "replay_rows_per_s_without_queries",
        "replay_rows_per_s_with_1qps",
        "replay_rows_per_s_with_10qps",
        "replay_rows_per_s_with_queries",
        "replay_with_1qps_over_without",
        "replay_with_10qps_over_without",
        "replay_with_queries_over_without",
    ] {
        let x = v[field].as_f64().unwrap_or_else(|| panic!("{field} missing in {v}"));
        assert!(x.is_finite() && x > 0.0, "{field} = {x}");
    }
    assert_eq!(v["replay_rounds"], 1);
}

#[test]
fn demo_replays_queries_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let out = fovea().args(["demo", "--seconds", "2", "--rate", "3000", "--lake"]).arg(&lake).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for line in ["replayed", "consistent snapshots", "freshness", "query latency", "bits/tuple", "plot"] {
        assert!(stdout.contains(line), "report lacks {line}: {stdout}");
    }
    assert!(lake.join("demo.svg").is_file());
    assert!(lake.join("_fovea/txn.sqlite").is_file());
    // The lake it leaves is queryable, and consistent.
    let q = fovea()
        .args(["sql", "--format", "csv", "--lake"])
        .arg(&lake)
        .arg("SELECT count(*) AS n, sum(balance) AS total FROM hybench.account")
        .output()
        .unwrap();
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    assert_eq!(String::from_utf8_lossy(&q.stdout), "n,total\n10000,10000000.00\n");
    // A second run replaces the lake it made; --json prints the summary,
    // then the same series per 10 s window.
    let again =
        fovea().args(["demo", "--seconds", "1", "--rate", "1000", "--json", "--lake"]).arg(&lake).output().unwrap();
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    let v: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys.last(), Some(&"windows"), "{keys:?}");
    for k in ["rows_per_s", "freshness_p50_ms", "freshness_p99_ms", "query_p50_ms", "lake_bytes"] {
        assert!(v[k].is_number(), "{k}: {v}");
    }
    let windows = v["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 1, "{v}");
    let w = &windows[0];
    assert_eq!(w["start_s"], 0.0);
    assert!(w["rows_per_s"].as_f64().unwrap() > 0.0, "{w}");
    assert!(w["lake_bytes"].as_u64().unwrap() > 0, "{w}");
    assert!(w["freshness_p99_ms"].as_f64().unwrap() >= w["freshness_p50_ms"].as_f64().unwrap(), "{w}");
    assert!(w["query_p50_ms"].as_f64().unwrap() > 0.0, "{w}");
}

#[test]
fn demo_refuses_a_directory_that_is_not_a_lake() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("precious.txt"), "keep me").unwrap();
    let out = fovea().args(["demo", "--seconds", "1", "--lake"]).arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a fovea lake"), "{err}");
    assert!(dir.path().join("precious.txt").is_file());
}

#[test]
fn bench_replay_reports_the_median_of_its_runs() {
    let out = fovea().args(["bench", "replay", "--txns", "200", "--runs", "3", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs: Vec<f64> = v["rows_per_s_runs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(runs.len(), 3, "{v}");
    let mut sorted = runs.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(v["rows_per_s"].as_f64(), Some(sorted[1]), "{v}");
    assert!(v["rows"].as_u64().unwrap() > 0 && v["typed_decode_us_per_record"].as_f64().unwrap() > 0.0, "{v}");
    if let Some(cpu) = v["cpu_us_per_row"].as_f64() {
        assert_eq!(v["cpu_us_per_row_runs"].as_array().unwrap().len(), 3, "{v}");
        assert!(cpu > 0.0, "{v}");
    }
}
