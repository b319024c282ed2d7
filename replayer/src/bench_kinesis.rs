//! `fovea bench kinesis`: the HyBench stream through a local multi-shard
//! Kinesis against the same stream from a file, in one run.
//!
//! 1. the stream is generated to a file and replayed from it (`fovea
//!    replay`, a child process) — the baseline;
//! 2. the same records are put to a fresh stream (values only, partitioned
//!    by record key, BEGIN/END by transaction id, as Debezium Server puts
//!    them) and replayed from it into another lake: the ratio of rows/s;
//! 3. `fovea serve` follows a second stream while the records are put, their
//!    source times stamped as they are put: freshness P50/P99 from
//!    `fovea_freshness_seconds` (now minus the source commit time of the
//!    newest visible transaction), sampled while the load runs.
//!
//! Kinesis is `AWS_ENDPOINT_URL_KINESIS` when set, else a kinesalite
//! started here.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fovea_aws::kinesis::KinesisProducer;
use serde_json::{Value as Json, json};

use crate::replay::CliResult;

/// What Debezium Server puts for a Kafka-style line: the value, keyed by
/// the record key (BEGIN/END by transaction id); `None` for tombstones.
fn kinesis_record(line: &str) -> CliResult<Option<(String, Vec<u8>)>> {
    let v: Json = serde_json::from_str(line)?;
    let value = &v["value"];
    if value.is_null() {
        return Ok(None);
    }
    let key = match value.get("status") {
        Some(_) => value["id"].as_str().unwrap_or("").split(':').next().unwrap_or("").to_owned(),
        None => v["key"].to_string(),
    };
    Ok(Some((key, value.to_string().into_bytes())))
}

/// Rewrites every `"ts_us":N` and `"ts_ms":N` of a record to now.
fn stamp_now(data: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(data);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_ref();
    loop {
        let next = [("\"ts_us\":", now), ("\"ts_ms\":", now / 1000)]
            .into_iter()
            .filter_map(|(field, value)| rest.find(field).map(|i| (i, field, value)))
            .min_by_key(|(i, _, _)| *i);
        let Some((i, field, value)) = next else { break };
        out.push_str(&rest[..i + field.len()]);
        rest = &rest[i + field.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(&value.to_string());
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out.into_bytes()
}

/// Runs `fovea replay` and reads its rows/s.
fn replay_rows_per_s(
    exe: &std::path::Path,
    env: &[(&str, String)],
    lake: &std::path::Path,
    input: &str,
) -> CliResult<(f64, u64)> {
    let out = Command::new(exe)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["replay", "--lake"])
        .arg(lake)
        .args(["--input", input])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!("fovea replay --input {input} failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    // "replayed T transactions (…), R rows in S s = X rows/s; …"
    let number_before = |suffix: &str| -> Option<f64> {
        let at = text.find(suffix)?;
        text[..at].split_whitespace().last()?.parse().ok()
    };
    let rows_per_s = number_before(" rows/s").ok_or_else(|| format!("unexpected output of fovea replay: {text}"))?;
    let rows = number_before(" rows in").unwrap_or(0.0) as u64;
    Ok((rows_per_s, rows))
}

/// `fovea bench kinesis`.
pub fn run(txns: u64, shards: i32, json_out: bool) -> CliResult<()> {
    let kinesalite = match std::env::var("AWS_ENDPOINT_URL_KINESIS") {
        Ok(_) => None,
        Err(_) => Some(fovea_aws::moto::Kinesalite::start()?),
    };
    let mut env: Vec<(&str, String)> = kinesalite.as_ref().map(|k| k.env()).unwrap_or_default();
    env.push(("FOVEA_LOG", "warn".into()));
    let endpoint = kinesalite.as_ref().map(|k| k.endpoint.clone());
    let producer = KinesisProducer::connect(endpoint.as_deref())?;
    let exe = std::env::current_exe()?;
    let dir = std::env::temp_dir().join(format!("fovea-bench-kinesis-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("stream.jsonl");
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&file)?);
        crate::workload::generate(crate::workload::Workload::Hybench, txns, 7, &mut w)?;
        w.flush()?;
    }
    let mut records = Vec::new();
    for line in BufReader::new(std::fs::File::open(&file)?).lines() {
        if let Some(r) = kinesis_record(&line?)? {
            records.push(r);
        }
    }

    // 1. From the file.
    let (file_rows_per_s, file_rows) =
        replay_rows_per_s(&exe, &env, &dir.join("lake-file"), &file.display().to_string())?;
    if !json_out {
        eprintln!("file: {file_rows} rows, {file_rows_per_s:.0} rows/s");
    }

    // 2. Through Kinesis, put first.
    let stream = format!("fovea-bench-{}", std::process::id());
    producer.create_stream(&stream, shards)?;
    let put_began = Instant::now();
    producer.put(&stream, &records)?;
    let put_s = put_began.elapsed().as_secs_f64();
    let input = format!("kinesis://{stream}?poll_ms=10");
    let (kinesis_rows_per_s, kinesis_rows) = replay_rows_per_s(&exe, &env, &dir.join("lake-kinesis"), &input)?;
    if kinesis_rows != file_rows {
        return Err(format!("the Kinesis replay applied {kinesis_rows} rows, the file replay {file_rows}").into());
    }
    if !json_out {
        eprintln!("kinesis: {kinesis_rows} rows, {kinesis_rows_per_s:.0} rows/s (put took {put_s:.1} s)");
    }

    // 3. Freshness while the records are put.
    let live = format!("{stream}-live");
    producer.create_stream(&live, shards)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut serve = Command::new(&exe)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["serve", "--lake"])
        .arg(dir.join("lake-live"))
        .args(["--input", &format!("kinesis://{live}?poll_ms=10")])
        .args(["--listen", &format!("127.0.0.1:{port}"), "--metrics", &metrics.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut ready = String::new();
    BufReader::new(serve.stdout.take().ok_or("no stdout")?).read_line(&mut ready)?;
    let loading = Arc::new(AtomicBool::new(true));
    let sampler = {
        let loading = Arc::clone(&loading);
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            // Acquire: pairs with the Release store after the last put.
            while loading.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20));
                if let Some(f) = freshness_metric(metrics) {
                    samples.push(f * 1000.0);
                }
            }
            samples
        })
    };
    let live_began = Instant::now();
    for batch in records.chunks(500) {
        let stamped: Vec<(String, Vec<u8>)> = batch.iter().map(|(k, d)| (k.clone(), stamp_now(d))).collect();
        producer.put(&live, &stamped)?;
    }
    let live_s = live_began.elapsed().as_secs_f64();
    // Release: the sampler stops.
    loading.store(false, Ordering::Release);
    let mut samples = sampler.join().map_err(|_| "the sampler panicked")?;
    let _ = Command::new("kill").args(["-TERM", &serve.id().to_string()]).status();
    let _ = serve.wait();
    std::fs::remove_dir_all(&dir)?;
    // The first samples come before the first transaction is visible.
    samples.retain(|f| f.is_finite());
    let p50 = crate::demo::percentile(&mut samples, 0.5);
    let p99 = crate::demo::percentile(&mut samples, 0.99);
    let result = json!({
        "workload": "hybench",
        "txns": txns,
        "rows": file_rows,
        "shards": shards,
        "records": records.len(),
        "file_rows_per_s": file_rows_per_s.round(),
        "kinesis_rows_per_s": kinesis_rows_per_s.round(),
        "kinesis_over_file": ((kinesis_rows_per_s / file_rows_per_s) * 1000.0).round() / 1000.0,
        "put_records_per_s": (records.len() as f64 / put_s).round(),
        "live_records_per_s": (records.len() as f64 / live_s).round(),
        "freshness_samples": samples.len(),
        "freshness_p50_ms": (p50 * 100.0).round() / 100.0,
        "freshness_p99_ms": (p99 * 100.0).round() / 100.0,
        "kinesis": if kinesalite.is_some() { "kinesalite (local)" } else { "AWS_ENDPOINT_URL_KINESIS" },
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
    });
    if json_out {
        println!("{result}");
    } else {
        println!(
            "{} rows: file {:.0} rows/s, {shards}-shard Kinesis {:.0} rows/s ({:.3}× file); freshness while putting {:.0} records/s: P50 {:.1} ms, P99 {:.1} ms",
            file_rows,
            file_rows_per_s,
            kinesis_rows_per_s,
            kinesis_rows_per_s / file_rows_per_s,
            records.len() as f64 / live_s,
            p50,
            p99
        );
    }
    Ok(())
}

/// `fovea_freshness_seconds` from the metrics endpoint.
fn freshness_metric(addr: std::net::SocketAddr) -> Option<f64> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines().find_map(|l| l.strip_prefix("fovea_freshness_seconds ")).and_then(|v| v.trim().parse().ok())
}
