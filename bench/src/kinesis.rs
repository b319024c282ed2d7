//! `fovea-bench kinesis`: the HyBench stream through a local multi-shard
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
//! With `--fan-out`, step 3 runs twice on the same stand-in with the same
//! load: the stream read by polling, then by enhanced fan-out
//! (`consumer=`), and both freshness distributions are reported with their
//! ratio.
//!
//! Kinesis is `AWS_ENDPOINT_URL_KINESIS` when set, else a kinesalite
//! started here (kinesis-local with `--fan-out`: kinesalite has no stream
//! consumers). kinesis-local pushes a subscription's new records once a
//! second, so fan-out freshness measured on it is that cadence's, not
//! Kinesis's (~70 ms documented).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fovea_testkit::kinesis::KinesisProducer;
use serde_json::json;

use fovea_replayer::replay::CliResult;

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

/// One `fovea replay`, as it reported itself.
struct ReplayRun {
    rows: u64,
    rows_per_s: f64,
    cpu_s: f64,
}

/// Runs `fovea replay` and reads its summary line.
fn replay(exe: &std::path::Path, env: &[(&str, String)], lake: &std::path::Path, input: &str) -> CliResult<ReplayRun> {
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
    // "replayed T transactions (…), R rows in S s = X rows/s; C checkpoints; U s CPU"
    let number_before = |suffix: &str| -> Option<f64> {
        let at = text.find(suffix)?;
        text[..at].split_whitespace().last()?.parse().ok()
    };
    let unexpected = || format!("unexpected output of fovea replay: {text}");
    Ok(ReplayRun {
        rows: number_before(" rows in").ok_or_else(unexpected)? as u64,
        rows_per_s: number_before(" rows/s").ok_or_else(unexpected)?,
        cpu_s: number_before(" s CPU").ok_or_else(unexpected)?,
    })
}

/// `fovea-bench kinesis`'s settings.
#[derive(Clone, Debug, clap::Args)]
pub struct KinesisBench {
    /// HyBench transactions.
    #[arg(long, default_value_t = 20_000)]
    pub txns: u64,
    /// Shards of each stream.
    #[arg(long, default_value_t = 4)]
    pub shards: i32,
    /// Records per second put while `fovea serve` follows (Kinesis takes
    /// 1,000 per second per shard).
    #[arg(long, default_value_t = 2_000)]
    pub rate: u64,
    /// Longest the followed load runs.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Freshness also with the stream read by enhanced fan-out (same
    /// stand-in, same load), beside polling.
    #[arg(long)]
    pub fan_out: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Freshness while a stream is followed under load.
struct Followed {
    /// Freshness samples, ms.
    samples: Vec<f64>,
    /// Records put while sampling, and over how long.
    put: usize,
    seconds: f64,
}

impl Followed {
    fn quantiles(&self) -> (f64, f64) {
        let latencies: fovea_replayer::latency::Latencies = self.samples.iter().copied().collect();
        (latencies.quantile_ms(0.5), latencies.quantile_ms(0.99))
    }

    fn json(&self) -> serde_json::Value {
        let (p50, p99) = self.quantiles();
        json!({
            "live_records_per_s": (self.put as f64 / self.seconds).round(),
            "freshness_samples": self.samples.len(),
            "freshness_p50_ms": (p50 * 100.0).round() / 100.0,
            "freshness_p99_ms": (p99 * 100.0).round() / 100.0,
        })
    }
}

/// The Kinesis the bench runs against: `AWS_ENDPOINT_URL_KINESIS` when
/// set, else a stand-in started for the run (stopped on drop).
enum Kinesis {
    FromEnvironment,
    Kinesalite(fovea_testkit::moto::Kinesalite),
    /// Serves stream consumers and SubscribeToShard (`--fan-out`).
    KinesisLocal(fovea_testkit::moto::KinesisLocal),
}

impl Kinesis {
    fn start(fan_out: bool) -> CliResult<Kinesis> {
        Ok(match std::env::var("AWS_ENDPOINT_URL_KINESIS") {
            Ok(_) => Kinesis::FromEnvironment,
            Err(_) if fan_out => Kinesis::KinesisLocal(fovea_testkit::moto::KinesisLocal::start()?),
            Err(_) => Kinesis::Kinesalite(fovea_testkit::moto::Kinesalite::start()?),
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Kinesis::FromEnvironment => "AWS_ENDPOINT_URL_KINESIS",
            Kinesis::Kinesalite(_) => "kinesalite (local)",
            Kinesis::KinesisLocal(_) => "kinesis-local",
        }
    }

    /// The stand-in's endpoint (`None`: the environment's).
    fn endpoint(&self) -> Option<&str> {
        match self {
            Kinesis::FromEnvironment => None,
            Kinesis::Kinesalite(k) => Some(&k.endpoint),
            Kinesis::KinesisLocal(k) => Some(&k.endpoint),
        }
    }
}

/// `fovea-bench kinesis`.
pub fn run(b: &KinesisBench) -> CliResult<()> {
    let kinesis = Kinesis::start(b.fan_out)?;
    let stand_in = kinesis.name();
    let endpoint = kinesis.endpoint();
    let mut env: Vec<(&str, String)> = endpoint.map(fovea_testkit::moto::kinesis_env).unwrap_or_default();
    env.push(("FOVEA_LOG", "warn".into()));
    let producer = KinesisProducer::connect(endpoint)?;
    let exe = crate::fovea_binary()?;
    let dir = std::env::temp_dir().join(format!("fovea-bench-kinesis-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("stream.jsonl");
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&file)?);
        fovea_testkit::workload::generate(fovea_testkit::workload::Workload::Hybench, b.txns, 7, &mut w)?;
        w.flush()?;
    }
    let mut records = Vec::new();
    for line in BufReader::new(std::fs::File::open(&file)?).lines() {
        if let Some(r) = fovea_testkit::kinesis::debezium_server_record(&line?)? {
            records.push(r);
        }
    }
    let say = |m: String| {
        if !b.json {
            eprintln!("{m}");
        }
    };

    // 1. From the file.
    let from_file = replay(&exe, &env, &dir.join("lake-file"), &file.display().to_string())?;
    say(format!("file: {} rows, {:.0} rows/s, {:.2} s CPU", from_file.rows, from_file.rows_per_s, from_file.cpu_s));

    // 2. Through Kinesis, put first; what the service alone serves.
    let stream = format!("fovea-bench-{}", std::process::id());
    producer.create_stream(&stream, b.shards)?;
    let began = Instant::now();
    producer.put(&stream, &records)?;
    let put_s = began.elapsed().as_secs_f64();
    let began = Instant::now();
    let read = producer.read_all(&stream)?;
    let service_read_per_s = read as f64 / began.elapsed().as_secs_f64();
    let input = format!("kinesis://{stream}?poll_ms=10");
    let through = replay(&exe, &env, &dir.join("lake-kinesis"), &input)?;
    if through.rows != from_file.rows {
        return Err(
            format!("the Kinesis replay applied {} rows, the file replay {}", through.rows, from_file.rows).into()
        );
    }
    say(format!(
        "kinesis: {} rows, {:.0} rows/s, {:.2} s CPU (the service alone serves {service_read_per_s:.0} records/s)",
        through.rows, through.rows_per_s, through.cpu_s
    ));

    // 3. Freshness while records are put at `rate`, read by polling (and
    // by enhanced fan-out).
    let follow = Follow { exe: &exe, env: &env, producer: &producer, records: &records, bench: b };
    let polling = follow.run(&dir.join("lake-live"), &format!("{stream}-live"), "")?;
    let fan_out = match b.fan_out {
        true => Some(follow.run(&dir.join("lake-fan-out"), &format!("{stream}-fan-out"), "&consumer=fovea-bench")?),
        false => None,
    };
    std::fs::remove_dir_all(&dir)?;
    let (p50, p99) = polling.quantiles();
    let per_row = |r: &ReplayRun| r.cpu_s * 1e6 / r.rows.max(1) as f64;
    let result = json!({
        "workload": "hybench",
        "txns": b.txns,
        "rows": from_file.rows,
        "shards": b.shards,
        "records": records.len(),
        "file_rows_per_s": from_file.rows_per_s.round(),
        "kinesis_rows_per_s": through.rows_per_s.round(),
        "kinesis_over_file": ((through.rows_per_s / from_file.rows_per_s) * 1000.0).round() / 1000.0,
        "file_cpu_us_per_row": (per_row(&from_file) * 100.0).round() / 100.0,
        "kinesis_cpu_us_per_row": (per_row(&through) * 100.0).round() / 100.0,
        "kinesis_cpu_over_file": ((per_row(&through) / per_row(&from_file)) * 1000.0).round() / 1000.0,
        "service_read_records_per_s": service_read_per_s.round(),
        "put_records_per_s": (records.len() as f64 / put_s).round(),
        "live_records_per_s": (polling.put as f64 / polling.seconds).round(),
        "freshness_samples": polling.samples.len(),
        "freshness_p50_ms": (p50 * 100.0).round() / 100.0,
        "freshness_p99_ms": (p99 * 100.0).round() / 100.0,
        "fan_out": fan_out.as_ref().map(|f| {
            let mut v = f.json();
            let (f50, f99) = f.quantiles();
            v["p50_over_polling"] = json!(((f50 / p50) * 1000.0).round() / 1000.0);
            v["p99_over_polling"] = json!(((f99 / p99) * 1000.0).round() / 1000.0);
            v
        }),
        "kinesis": stand_in,
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
    });
    if b.json {
        println!("{result}");
    } else {
        println!(
            "{} rows: file {:.0} rows/s, {}-shard Kinesis {:.0} rows/s ({:.3}× file; the service alone serves {service_read_per_s:.0} records/s), CPU per row {:.2}× file; freshness while putting {:.0} records/s: P50 {p50:.1} ms, P99 {p99:.1} ms",
            from_file.rows,
            from_file.rows_per_s,
            b.shards,
            through.rows_per_s,
            through.rows_per_s / from_file.rows_per_s,
            per_row(&through) / per_row(&from_file),
            polling.put as f64 / polling.seconds,
        );
        if let Some(f) = &fan_out {
            let (f50, f99) = f.quantiles();
            println!(
                "by enhanced fan-out, the same load on the same stand-in ({stand_in}): P50 {f50:.1} ms ({:.2}× polling), P99 {f99:.1} ms ({:.2}× polling)",
                f50 / p50,
                f99 / p99
            );
        }
    }
    Ok(())
}

/// What step 3 runs with: the `fovea` binary and its environment, the
/// producer, the stream's records and the bench's settings.
struct Follow<'a> {
    exe: &'a std::path::Path,
    env: &'a [(&'a str, String)],
    producer: &'a KinesisProducer,
    records: &'a [(String, Vec<u8>)],
    bench: &'a KinesisBench,
}

impl Follow<'_> {
    /// `fovea serve` into `lake` follows a fresh stream `live` (read as
    /// `kinesis://LIVE?poll_ms=10` + `params`) while the bench puts the
    /// initial load (then waits until it is applied) and the transactions
    /// at the bench's rate, their source times stamped as they are put;
    /// freshness is sampled from `/metrics` meanwhile.
    fn run(&self, lake: &std::path::Path, live: &str, params: &str) -> CliResult<Followed> {
        let Follow { exe, env, producer, records, bench: b } = *self;
        producer.create_stream(live, b.shards)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let mut serve = Command::new(exe)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .args(["serve", "--lake"])
            .arg(lake)
            .args(["--input", &format!("kinesis://{live}?poll_ms=10{params}")])
            .args(["--listen", &format!("127.0.0.1:{port}"), "--metrics", &metrics.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let followed = follow_serving(metrics, producer, live, records, b);
        let _ = Command::new("kill").args(["-TERM", &serve.id().to_string()]).status();
        let _ = serve.wait();
        followed
    }
}

fn follow_serving(
    metrics: std::net::SocketAddr,
    producer: &KinesisProducer,
    live: &str,
    records: &[(String, Vec<u8>)],
    b: &KinesisBench,
) -> CliResult<Followed> {
    let load = records.iter().take_while(|(_, d)| String::from_utf8_lossy(d).contains("\"op\":\"r\"")).count();
    producer.put(live, &records[..load])?;
    let caught_up = Instant::now();
    while metric(metrics, "fovea_rows_total").unwrap_or(0.0) < load as f64 {
        if caught_up.elapsed() > Duration::from_secs(120) {
            return Err("fovea serve did not apply the initial load within 120 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let loading = Arc::new(AtomicBool::new(true));
    let sampler = {
        let loading = Arc::clone(&loading);
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            // Acquire: pairs with the Release store after the last put.
            while loading.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20));
                if let Some(f) = metric(metrics, "fovea_freshness_seconds").filter(|f| f.is_finite()) {
                    samples.push(f * 1000.0);
                }
            }
            samples
        })
    };
    // Batches of 50 records every 50 / rate seconds.
    let began = Instant::now();
    let mut put = 0usize;
    for batch in records[load..].chunks(50) {
        if began.elapsed() >= Duration::from_secs(b.seconds) {
            break;
        }
        let due = began + Duration::from_secs_f64(put as f64 / b.rate.max(1) as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let stamped: Vec<(String, Vec<u8>)> = batch.iter().map(|(k, d)| (k.clone(), stamp_now(d))).collect();
        producer.put(live, &stamped)?;
        put += batch.len();
    }
    let seconds = began.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(200));
    // Release: the sampler stops.
    loading.store(false, Ordering::Release);
    let samples = sampler.join().map_err(|_| "the sampler panicked")?;
    Ok(Followed { samples, put, seconds })
}

/// One unlabelled metric from the metrics endpoint.
fn metric(addr: std::net::SocketAddr, name: &str) -> Option<f64> {
    crate::serve::scrape(&addr.to_string()).and_then(|t| crate::serve::metric(&t, name))
}
