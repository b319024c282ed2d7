//! The `fovea-bench` command line, run as a user runs it: every
//! benchmark's JSON carries its fields (small sizes; the numbers themselves
//! are for release builds).

use std::process::Command;

fn fovea_bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fovea-bench"))
}

#[test]
fn bench_components_prints_every_field_as_json() {
    let out = fovea_bench().args(["components", "--quick", "--json"]).output().unwrap();
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
    let out = fovea_bench().args(["query", "--rows", "20000", "--rounds", "1", "--json"]).output().unwrap();
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
fn bench_replay_reports_the_median_of_its_runs() {
    let out = fovea_bench().args(["replay", "--txns", "200", "--runs", "3", "--json"]).output().unwrap();
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

#[test]
fn bench_scale_charges_each_role_and_models_one_to_sixteen_replayers() {
    let out = fovea_bench()
        .args(["scale", "--replayers", "1,2", "--txns", "3000", "--runs", "1", "--node-cores", "8", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let measured = v["measured"].as_array().unwrap();
    assert_eq!(measured.iter().map(|m| m["replayers"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2], "{v}");
    for m in measured {
        let cpu = &m["cpu_us_per_row"];
        // The applying thread and the shard workers run for every row
        // (a debug build: many clock ticks each).
        for role in ["sink_apply", "replayer_shards"] {
            assert!(cpu[role].as_f64().unwrap() > 0.0, "{role} in {m}");
        }
        for role in [
            "sink_decode",
            "replayer_flush",
            "replayer_checkpoint",
            "replayer_maintenance",
            "replayer_io",
            "other",
            "unattributed",
        ] {
            assert!(cpu[role].as_f64().unwrap() >= 0.0, "{role} in {m}");
        }
        assert!(m["rows_per_s"].as_f64().unwrap() > 0.0, "{m}");
    }
    let model = &v["model"];
    assert_eq!(model["node_cores"], 8, "{v}");
    let throughput = model["throughput"].as_array().unwrap();
    let rates: Vec<f64> = throughput.iter().map(|t| t["rows_per_s"].as_f64().unwrap()).collect();
    assert_eq!(throughput.iter().map(|t| t["replayers"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 4, 8, 16]);
    assert!(rates.windows(2).all(|w| w[0] <= w[1]) && rates[0] > 0.0, "{v}");
    assert!(rates[4] <= model["sink_ceiling_rows_per_s"].as_f64().unwrap(), "{v}");

    let out = fovea_bench().args(["scale", "--replayers", "0,2"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--replayers"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn gen_writes_the_same_stream_for_the_same_seed() {
    let dir = tempfile::tempdir().unwrap();
    let run = |seed: &str, name: &str| {
        let path = dir.path().join(name);
        let out = fovea_bench()
            .args(["gen", "hybench", "--txns", "50", "--seed", seed, "--output"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::read_to_string(path).unwrap()
    };
    // Clock readings (`fresh_ts`, `ts_us`, `ts_ms`) are the wall clock at
    // generation; everything else is the seed's.
    fn without_clock(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.retain(|k, _| !matches!(k.as_str(), "fresh_ts" | "ts_us" | "ts_ms"));
                m.values_mut().for_each(without_clock);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(without_clock),
            _ => {}
        }
    }
    let strip_fresh = |s: String| -> Vec<String> {
        s.lines()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                without_clock(&mut v);
                v.to_string()
            })
            .collect()
    };
    let (a, b, c) = (run("4", "a"), run("4", "b"), run("5", "c"));
    assert!(a.lines().count() > 50, "{a}");
    assert_eq!(strip_fresh(a.clone()), strip_fresh(b));
    assert_ne!(strip_fresh(a), strip_fresh(c));
}

/// `fovea-bench cost` on the local stand-ins: per rate, one checkpoint
/// interval measured at that rate's rows, priced item by item; off and v2
/// publication told apart; bad settings refused by name.
#[test]
fn bench_cost_measures_an_interval_per_rate_and_prices_it() {
    let cost = |args: &[&str]| {
        let out = fovea_bench().args(["cost", "--txns", "300", "--json"]).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let v2 = cost(&["--rates", "20,200", "--checkpoint-secs", "5"]);
    let months = v2["per_month"].as_array().unwrap();
    assert_eq!(months.len(), 2, "{v2}");
    for (m, rate) in months.iter().zip([20.0, 200.0]) {
        let interval = &m["checkpoint_interval"];
        // At least rate × C rows, at most one transaction more (HyBench: ~11 rows each).
        let rows = interval["rows"].as_f64().unwrap();
        assert!(rows >= rate * 5.0 && rows < rate * 5.0 + 40.0, "{m}");
        assert!(
            interval["s3_puts"].as_f64().unwrap() >= 1.0 && interval["dynamodb_writes"].as_f64().unwrap() >= 1.0,
            "{m}"
        );
        let f = &m["fovea"];
        let sum =
            ["s3_requests", "dynamodb", "replayer_task", "fan_out"].iter().map(|k| f[k].as_f64().unwrap()).sum::<f64>();
        assert!((sum - f["total"].as_f64().unwrap()).abs() < 0.02, "{m}");
        assert_eq!(f["fan_out"].as_f64(), Some(0.0), "polled by default: {m}");
        assert!(m["firehose_iceberg"]["total"].as_f64().unwrap() > 0.0, "{m}");
    }
    // Publication writes Iceberg metadata at every checkpoint; read by
    // enhanced fan-out, its consumer is priced on fovea's side.
    let off = cost(&["--rates", "200", "--checkpoint-secs", "5", "--iceberg", "off", "--fan-out"]);
    let f = &off["per_month"][0]["fovea"];
    assert!(f["fan_out"].as_f64().unwrap() >= 730.0 * 0.015, "{off}");
    let puts = |v: &serde_json::Value, i: usize| v["per_month"][i]["checkpoint_interval"]["s3_puts"].as_f64().unwrap();
    assert!(puts(&off, 0) < puts(&v2, 1), "off {off}\nv2 {v2}");
    // Publishing once a minute, checkpoints every 5 s: between the two.
    let minute = cost(&["--rates", "200", "--checkpoint-secs", "5", "--iceberg-secs", "60"]);
    assert!(puts(&minute, 0) > puts(&off, 0) && puts(&minute, 0) < puts(&v2, 1), "{minute}\noff {off}\nv2 {v2}");
    for bad in [&["--rates", "0"][..], &["--iceberg", "v4"], &["--checkpoint-secs", "0"], &["--rate", "10"]] {
        let out = fovea_bench().args(["cost", "--txns", "300"]).args(bad).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(bad[0].trim_start_matches('-').split('-').next().unwrap()),
            "{bad:?}: {stderr}"
        );
    }
}
