//! The `fovea` command line, run as a user runs it.

use std::process::Command;

fn fovea() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fovea"))
}

#[test]
fn bench_runs_the_fovea_bench_binary_beside_it() {
    let beside = std::path::Path::new(env!("CARGO_BIN_EXE_fovea")).with_file_name("fovea-bench");
    let out = fovea().args(["bench", "components", "--quick", "--json"]).output().unwrap();
    if beside.is_file() {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["visibility_bits_per_tuple"].as_f64().is_some(), "{v}");
        // Its exit status is the bench's.
        let bad = fovea().args(["bench", "no-such-bench"]).output().unwrap();
        assert_eq!(bad.status.code(), Some(2), "{}", String::from_utf8_lossy(&bad.stderr));
    } else {
        // `cargo test -p fovea-replayer` alone does not build it.
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cargo build --release -p fovea-bench"), "{err}");
    }
    // Nothing of the benchmarks is compiled into this binary.
    let generate = fovea().args(["gen", "hybench"]).output().unwrap();
    assert!(!generate.status.success());
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
fn a_malformed_lake_address_is_refused_before_anything_is_contacted() {
    // No AWS is reachable here: the address is refused before S3 is asked.
    let refused = |args: &[&str], expected: &str| {
        let out = fovea().args(["sql"]).args(args).arg("SELECT 1").env("AWS_EC2_METADATA_DISABLED", "true").output();
        let out = out.unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(expected), "{args:?}: {err}");
        assert!(!err.contains("S3 open") && !err.contains("LSN"), "{args:?}: {err}");
    };
    refused(&["--lake", "s3://b/p", "--state", "dynamo://x"], "--state dynamo://x: expected dynamodb://TABLE");
    refused(&["--lake", "s3://b/p"], "the lake s3://b/p has no state store");
    refused(&["--lake", "s3://", "--state", "dynamodb://fovea-x"], "lake s3://: no bucket");
}

#[test]
fn numbers_out_of_range_are_refused_naming_their_flag_before_anything_runs() {
    // Each was accepted once: a zero reached the engine as an internal
    // invariant ("a bug in fovea"), an infinite interval panicked, a zero
    // dedup window remembered nothing, a NaN threshold never collected.
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let lake = lake.to_str().unwrap();
    let input = crate::common::pg_tiny().join("debezium_events.precise_schemas.jsonl.gz");
    let input = input.to_str().unwrap();
    let replay = ["replay", "--lake", lake, "--input", input];
    let serve = ["serve", "--lake", lake, "--input", input, "--listen", "127.0.0.1:0"];
    let cases: &[(&[&str], &str, &str)] = &[
        (&["demo", "--lake", lake], "--seconds", "0"),
        (&["demo", "--lake", lake], "--rate", "0"),
        (&replay, "--shards", "0"),
        (&replay, "--block-rows", "0"),
        (&replay, "--blocks-per-file", "0"),
        (&replay, "--checkpoint-txns", "0"),
        (&replay, "--shards", "-1"),
        (&serve, "--shards", "0"),
        (&serve, "--block-rows", "0"),
        (&serve, "--dedup-window", "0"),
        (&serve, "--poll-ms", "0"),
        (&serve, "--checkpoint-secs", "0"),
        (&serve, "--checkpoint-secs", "nan"),
        (&serve, "--gc-secs", "inf"),
        (&serve, "--gc-secs", "1e12"),
        (&serve, "--long-query-secs", "-1"),
        (&serve, "--stall-secs", "0"),
        (&serve, "--emf-secs", "0"),
        (&serve, "--storage-gc-threshold", "2"),
        (&serve, "--storage-gc-threshold", "nan"),
        (&["status", "--lake", lake], "--storage-gc-threshold", "1.5"),
        (&["history", "--lake", lake], "--limit", "0"),
    ];
    for (command, flag, value) in cases {
        let out = fovea().args(*command).arg(format!("{flag}={value}")).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command:?} {flag}={value}: {err}");
        assert!(err.contains(&format!("invalid value '{value}' for '{flag}")), "{flag}={value}: {err}");
        assert!(!err.contains("panicked") && !err.contains("bug in fovea"), "{flag}={value}: {err}");
        assert!(!std::path::Path::new(lake).exists(), "{flag}={value} made the lake");
    }
    // The smallest values that make sense are taken.
    let out = fovea().args(replay).args(["--shards", "1", "--block-rows", "16", "--blocks-per-file", "1"]).output();
    let out = out.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn an_address_in_use_is_refused_naming_its_flag_before_the_lake_or_input_is_opened() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let input = crate::common::pg_tiny().join("debezium_events.precise_schemas.jsonl.gz");
    let input = input.to_str().unwrap();
    for flag in ["--listen", "--metrics", "--iceberg-rest"] {
        let mut cmd = fovea();
        cmd.args(["serve", "--input", input, "--lake"]).arg(&lake);
        if flag != "--listen" {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        let out = cmd.args([flag, &addr]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: {err}");
        assert!(err.contains(&format!("{flag} {addr}: ")) && err.contains("in use"), "{flag}: {err}");
        assert!(!lake.exists(), "{flag}: the lake was made before the address was refused");
    }
}

#[test]
fn a_mistyped_input_is_refused_before_a_lake_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let missing = dir.path().join("events.jsonl");
    let missing = missing.to_str().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        ("replay", missing, "cannot open input"),
        ("replay", &format!("file:{missing}"), "cannot open input"),
        ("replay", "kinesis://s?max_held_mb=17592186044416", "at most 17592186044415 megabytes"),
        ("replay", "kinesis://s?shard=1", "unknown parameter"),
        ("replay", "postgres://u@127.0.0.1:1/db?slot=s&publication=p", "followed by `fovea serve`"),
        ("serve", missing, "cannot open input"),
        ("serve", "kinesis://", "no stream"),
    ];
    for (command, input, says) in cases {
        let mut cmd = fovea();
        cmd.args([command, "--input", input, "--lake"]).arg(&lake).env("AWS_EC2_METADATA_DISABLED", "true");
        if *command == "serve" {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{command} --input {input}: {err}");
        assert!(!lake.exists(), "{command} --input {input} made the lake");
    }
}
