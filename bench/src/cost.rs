//! `fovea-bench cost`: what following a change stream with fovea costs on
//! AWS, per month and per million rows, at sustained rates — from requests
//! measured in this run, priced from a table of list prices — beside
//! Firehose → Iceberg for the same rows.
//!
//! ```text
//!  HyBench stream, per rate R (rows/s) and checkpoint interval C (s):
//!   replay the first --txns transactions into S3 + DynamoDB (local moto): the lake a replayer holds
//!   then, 3 times: append R × C rows of the stream, replay (resumes at the checkpoint, ends with one)
//!   then once more with nothing appended: the replay's own start and stop
//!  requests of one checkpoint interval = mean of the 3 − the empty one
//!  (--iceberg-secs P > C: measured with and without publication, mixed C/P of the way)
//!  per month = that × (month / C), the replayer task all month
//! ```
//!
//! Each interval is measured at the rows a live replayer checkpoints at
//! that rate, on a lake that already holds data: what a checkpoint writes
//! (blocks, checkpoint blocks, index deltas, delete files, Iceberg
//! metadata) depends on the rows changed since the one before and on the
//! files they touch. The replayer task is priced as running all month
//! (Fargate arm64, the template's size), and its CPU per row says how
//! busy it is at each rate; lease renewals are three DynamoDB writes per
//! lease time; reading the stream by enhanced fan-out (`--fan-out`, the
//! template's default) adds its consumer's shard-hours and GB pushed to
//! fovea's side. Kinesis is the input of both paths and priced apart: one
//! record per row change (Debezium, DMS), shards for the larger of 1 MB/s
//! and 1,000 records/s each. Firehose is priced by the GB of the same
//! records (a Kinesis source: no 5 KB rounding).
//!
//! Not in the model: S3 storage (the lake's size follows the live data,
//! not the change rate: the run's lake is priced as an example), queries
//! (Lambda scans: `fovea-bench scan --scan`), combine and storage GC on
//! Lambda (`--functions`; here in the replayer's CPU; combine writes about
//! one object per combined file of blocks, next to nothing beside the
//! checkpoints), and S3 DELETEs (free).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fovea_replayer::lakes::LakeArgs;
use fovea_replayer::replay::CliResult;
use fovea_testkit::moto::Moto;
use serde::Deserialize;
use serde_json::json;

use crate::replay::{ReplayRun, replay_into};
use crate::scan::round3;

/// `fovea-bench cost`'s settings.
#[derive(Clone, Debug, clap::Args)]
pub struct CostBench {
    /// Transactions of the measured HyBench stream.
    #[arg(long, default_value_t = 20_000)]
    pub txns: u64,
    /// Sustained rates priced, rows per second (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    pub rates: Vec<f64>,
    /// `fovea serve --checkpoint-secs` of the deployment.
    #[arg(long, default_value_t = 10.0)]
    pub checkpoint_secs: f64,
    /// Price table (JSON; default bench/prices/aws-us-east-1.json,
    /// built in): copy it and edit it for another region.
    #[arg(long)]
    pub prices: Option<PathBuf>,
    /// vCPUs of the replayer task (template.yaml: 2).
    #[arg(long, default_value_t = 2.0)]
    pub task_vcpu: f64,
    /// GB of memory of the replayer task (template.yaml: 8).
    #[arg(long, default_value_t = 8.0)]
    pub task_gb: f64,
    /// Iceberg publication at every checkpoint, as `fovea serve
    /// --iceberg`: v2 (the default), v3 or off.
    #[arg(long, default_value = "v2", value_parser = fovea_replayer::lakes::IcebergPublishing::parse)]
    pub iceberg: fovea_replayer::lakes::IcebergPublishing,
    /// `fovea serve --iceberg-secs` of the deployment: a publication at
    /// most this often (0: at every checkpoint).
    #[arg(long, default_value_t = 0.0)]
    pub iceberg_secs: f64,
    /// The replayer reads the stream by enhanced fan-out
    /// (`kinesis://…?consumer=`, template.yaml's EnhancedFanOut):
    /// price its consumer's shard-hours and GB pushed (default: polling).
    #[arg(long)]
    pub fan_out: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// List prices, as `bench/prices/*.json` holds them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Prices {
    region: String,
    currency: String,
    as_of: String,
    #[allow(dead_code)]
    source: String,
    s3_put_per_1000: f64,
    s3_get_per_1000: f64,
    s3_list_per_1000: f64,
    s3_storage_gb_month: f64,
    dynamodb_write_request_unit_per_million: f64,
    /// Queries on the scan function (`fovea-bench scan --scan`).
    lambda_request_per_million: f64,
    lambda_arm_gb_second: f64,
    fargate_arm_vcpu_hour: f64,
    fargate_arm_gb_hour: f64,
    kinesis_shard_hour: f64,
    kinesis_put_payload_unit_per_million: f64,
    /// Enhanced fan-out: per consumer and shard, and per GB pushed.
    kinesis_fan_out_consumer_shard_hour: f64,
    kinesis_fan_out_gb: f64,
    firehose_iceberg_per_gb: f64,
}

const DEFAULT_PRICES: &str = include_str!("../prices/aws-us-east-1.json");

/// Hours AWS bills a month as.
const HOURS_PER_MONTH: f64 = 730.0;

pub(crate) fn load_prices(path: Option<&Path>) -> CliResult<Prices> {
    let (text, name) = match path {
        Some(p) => {
            (std::fs::read_to_string(p).map_err(|e| format!("--prices {}: {e}", p.display()))?, p.display().to_string())
        }
        None => (DEFAULT_PRICES.to_owned(), "bench/prices/aws-us-east-1.json".to_owned()),
    };
    let prices: Prices = serde_json::from_str(&text).map_err(|e| format!("--prices {name}: {e}"))?;
    let values = [
        prices.s3_put_per_1000,
        prices.s3_get_per_1000,
        prices.s3_list_per_1000,
        prices.s3_storage_gb_month,
        prices.dynamodb_write_request_unit_per_million,
        prices.fargate_arm_vcpu_hour,
        prices.fargate_arm_gb_hour,
        prices.kinesis_shard_hour,
        prices.kinesis_put_payload_unit_per_million,
        prices.kinesis_fan_out_consumer_shard_hour,
        prices.kinesis_fan_out_gb,
        prices.firehose_iceberg_per_gb,
    ];
    if values.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return Err(format!("--prices {name}: every price must be a number ≥ 0").into());
    }
    Ok(prices)
}

/// What one query on the scan function costs: its invocations (Lambda
/// requests), its GB-seconds (arm64, as the template deploys it) and the
/// function's GETs of the lake.
pub(crate) fn lambda_query_usd(p: &Prices, invocations: u64, gb_s: f64, gets: u64) -> f64 {
    invocations as f64 / 1e6 * p.lambda_request_per_million
        + gb_s * p.lambda_arm_gb_second
        + gets as f64 / 1000.0 * p.s3_get_per_1000
}

/// Requests of one checkpoint interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Interval {
    rows: f64,
    puts: f64,
    gets: f64,
    lists: f64,
    dynamo_writes: f64,
}

impl Interval {
    fn of(run: &ReplayRun) -> Interval {
        Interval {
            rows: run.rows as f64,
            puts: run.store.puts as f64,
            gets: run.store.gets as f64,
            lists: run.store.lists as f64,
            dynamo_writes: run.dynamo_writes.unwrap_or(0) as f64,
        }
    }

    /// These counts and `share` of the way to `other`'s (0: these, 1:
    /// `other`'s).
    fn mixed(&self, other: &Interval, share: f64) -> Interval {
        let mix = |a: f64, b: f64| a + (b - a) * share;
        Interval {
            rows: self.rows,
            puts: mix(self.puts, other.puts),
            gets: mix(self.gets, other.gets),
            lists: mix(self.lists, other.lists),
            dynamo_writes: mix(self.dynamo_writes, other.dynamo_writes),
        }
    }

    /// The mean of `runs` less `overhead` (each count at least 0).
    fn mean_less(runs: &[Interval], overhead: &Interval) -> Interval {
        let n = runs.len().max(1) as f64;
        let mean = |f: fn(&Interval) -> f64| runs.iter().map(f).sum::<f64>() / n;
        Interval {
            rows: mean(|i| i.rows),
            puts: (mean(|i| i.puts) - overhead.puts).max(0.0),
            gets: (mean(|i| i.gets) - overhead.gets).max(0.0),
            lists: (mean(|i| i.lists) - overhead.lists).max(0.0),
            dynamo_writes: (mean(|i| i.dynamo_writes) - overhead.dynamo_writes).max(0.0),
        }
    }
}

/// Checkpoint intervals measured per rate.
const INTERVALS: usize = 3;

/// What a month at `rate` costs, by item, from one checkpoint interval's
/// requests at that rate.
fn month_at(
    rate: f64,
    b: &CostBench,
    p: &Prices,
    iv: &Interval,
    cpu_s_per_row: f64,
    record_bytes: f64,
) -> serde_json::Value {
    let month_s = HOURS_PER_MONTH * 3600.0;
    let checkpoints = month_s / b.checkpoint_secs;
    let s3_requests = checkpoints
        * (iv.puts / 1000.0 * p.s3_put_per_1000
            + iv.gets / 1000.0 * p.s3_get_per_1000
            + iv.lists / 1000.0 * p.s3_list_per_1000);
    // Conditional updates of items under 1 KB: one write request unit each.
    let lease_renewals_per_s = 3.0 / fovea_core::lease::DEFAULT_LEASE_TTL.as_secs_f64();
    let dynamo_writes = checkpoints * iv.dynamo_writes + lease_renewals_per_s * month_s;
    let dynamodb = dynamo_writes / 1e6 * p.dynamodb_write_request_unit_per_million;
    let task = (b.task_vcpu * p.fargate_arm_vcpu_hour + b.task_gb * p.fargate_arm_gb_hour) * HOURS_PER_MONTH;
    let bytes_per_s = rate * record_bytes;
    let shards = (bytes_per_s / 1e6).ceil().max((rate / 1000.0).ceil()).max(1.0);
    let fan_out = if b.fan_out {
        shards * HOURS_PER_MONTH * p.kinesis_fan_out_consumer_shard_hour
            + bytes_per_s * month_s / 1e9 * p.kinesis_fan_out_gb
    } else {
        0.0
    };
    let fovea = s3_requests + dynamodb + task + fan_out;
    let payload_units = rate * (record_bytes / 25_000.0).ceil().max(1.0) * month_s;
    let kinesis =
        shards * HOURS_PER_MONTH * p.kinesis_shard_hour + payload_units / 1e6 * p.kinesis_put_payload_unit_per_million;
    let firehose = bytes_per_s * month_s / 1e9 * p.firehose_iceberg_per_gb;
    let million_rows = rate * month_s / 1e6;
    let money = |x: f64| (x * 100.0).round() / 100.0;
    let per_million = |x: f64| (x / million_rows * 10_000.0).round() / 10_000.0;
    json!({
        "rows_per_s": rate,
        "million_rows_per_month": round3(million_rows),
        "checkpoint_interval": {
            "rows": round3(iv.rows),
            "s3_puts": round3(iv.puts),
            "s3_gets": round3(iv.gets),
            "s3_lists": round3(iv.lists),
            "dynamodb_writes": round3(iv.dynamo_writes),
        },
        "fovea": {
            "s3_requests": money(s3_requests),
            "dynamodb": money(dynamodb),
            "replayer_task": money(task),
            "fan_out": money(fan_out),
            "total": money(fovea),
            "per_million_rows": per_million(fovea),
            "task_cpu_busy": round3(cpu_s_per_row * rate / b.task_vcpu),
            "s3_puts_per_s": round3(iv.puts / b.checkpoint_secs),
            "dynamodb_writes_per_s": round3(dynamo_writes / month_s),
        },
        "firehose_iceberg": {"total": money(firehose), "per_million_rows": per_million(firehose)},
        "fovea_over_firehose": round3(fovea / firehose.max(1e-12)),
        "kinesis_input_both": {"shards": shards, "total": money(kinesis), "per_million_rows": per_million(kinesis)},
    })
}

/// Byte offsets just past each transaction's END line of a generated
/// stream, with the rows (change records) up to there.
fn transaction_ends(text: &[u8]) -> Vec<(usize, u64)> {
    let mut ends = Vec::new();
    let (mut offset, mut rows) = (0usize, 0u64);
    for line in text.split_inclusive(|&b| b == b'\n') {
        offset += line.len();
        let line = String::from_utf8_lossy(line);
        if !line.contains("\"topic\":\"gen.transaction\"") {
            rows += u64::from(!line.trim().is_empty());
        } else if line.contains("\"status\":\"END\"") {
            ends.push((offset, rows));
        }
    }
    ends
}

/// One rate's checkpoint interval: a lake of the stream's first `warmup`
/// transactions, then [`INTERVALS`] replays of `rate × C` rows each, then
/// an empty one. Returns the interval and the replayer's CPU per row.
fn measure_rate(
    n: usize,
    rate: f64,
    b: &CostBench,
    iceberg: fovea_replayer::lakes::IcebergPublishing,
    dir: &Path,
    text: &[u8],
    ends: &[(usize, u64)],
) -> CliResult<(Interval, f64)> {
    let progress = !b.json;
    let lake = || LakeArgs {
        lake: format!("s3://cost/rate{n}"),
        state: Some(format!("dynamodb://fovea-cost-{n}")),
        no_create: false,
    };
    let iceberg = || fovea_replayer::lakes::IcebergArgs { iceberg: Some(iceberg), ..Default::default() };
    let input = dir.join(format!("rate{n}.jsonl"));
    let warmup = usize::try_from(b.txns).unwrap_or(usize::MAX).min(ends.len()) - 1;
    std::fs::write(&input, &text[..ends[warmup].0])?;
    let cpu_before = fovea_replayer::serve::metrics::cpu_seconds();
    let warm = replay_into(lake(), &input, false, u64::MAX, iceberg(), None)?;
    let cpu = cpu_before.zip(fovea_replayer::serve::metrics::cpu_seconds()).map_or(0.0, |(a, z)| z - a);
    let cpu_s_per_row = cpu / warm.rows.max(1) as f64;
    let per_interval = (rate * b.checkpoint_secs).ceil() as u64;
    let mut at = warmup;
    let mut intervals = Vec::new();
    let append = |from: usize, to: usize| -> std::io::Result<()> {
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(&input)?.write_all(&text[from..to])
    };
    for _ in 0..INTERVALS {
        let start_rows = ends[at].1;
        let next = ends[at + 1..]
            .iter()
            .position(|&(_, rows)| rows - start_rows >= per_interval)
            .map(|i| at + 1 + i)
            .ok_or_else(|| format!("the stream is too short for {INTERVALS} intervals of {per_interval} rows (a bug: it is generated long enough)"))?;
        append(ends[at].0, ends[next].0)?;
        let run = replay_into(lake(), &input, false, u64::MAX, iceberg(), None)?;
        let expected = ends[next].1 - start_rows;
        if run.rows != expected || run.checkpoints != 1 {
            return Err(format!(
                "a replay resumed with {} rows applied and {} checkpoints, {expected} rows appended: one checkpoint expected",
                run.rows, run.checkpoints
            )
            .into());
        }
        intervals.push(Interval::of(&run));
        at = next;
    }
    let empty = replay_into(lake(), &input, false, u64::MAX, iceberg(), None)?;
    if empty.rows != 0 {
        return Err(format!("a replay with nothing appended applied {} rows", empty.rows).into());
    }
    let interval = Interval::mean_less(&intervals, &Interval::of(&empty));
    if progress {
        eprintln!(
            "{rate} rows/s: lake of {} rows; a {} s checkpoint interval of {} rows: {} S3 PUTs, {} GETs, {} DynamoDB writes",
            warm.rows,
            b.checkpoint_secs,
            round3(interval.rows),
            round3(interval.puts),
            round3(interval.gets),
            round3(interval.dynamo_writes)
        );
    }
    Ok((interval, cpu_s_per_row))
}

pub fn run(b: &CostBench) -> CliResult<()> {
    if !(b.checkpoint_secs.is_finite() && b.checkpoint_secs > 0.0) {
        return Err(format!("--checkpoint-secs {}: expected seconds > 0", b.checkpoint_secs).into());
    }
    if !(b.iceberg_secs.is_finite() && b.iceberg_secs >= 0.0) {
        return Err(format!("--iceberg-secs {}: expected seconds ≥ 0", b.iceberg_secs).into());
    }
    if b.rates.is_empty() || b.rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
        return Err(format!("--rates {:?}: expected rows per second > 0", b.rates).into());
    }
    if b.txns == 0 {
        return Err("--txns 0: the lake needs some data".into());
    }
    let prices = load_prices(b.prices.as_deref())?;
    let dir = tempfile::tempdir()?;
    // The lake's transactions, then enough for the intervals of the
    // fastest rate (HyBench has over 8 rows per transaction).
    let most_rows = b.rates.iter().fold(0f64, |m, r| m.max(r * b.checkpoint_secs));
    let txns = b.txns + (INTERVALS as f64 * most_rows / 8.0).ceil() as u64 + 10;
    let mut text = Vec::new();
    fovea_testkit::workload::generate(fovea_testkit::workload::Workload::Hybench, txns, 7, &mut text)?;
    let ends = transaction_ends(&text);
    let record_bytes = text.len() as f64 / ends.last().map_or(1, |e| e.1.max(1)) as f64;

    let moto = Moto::start(&fovea_testkit::moto::script())?;
    moto.create_bucket("cost")?;
    for (k, v) in moto.env() {
        // SAFETY: set before this process starts any thread that reads the
        // environment (the IO runtime, the AWS clients).
        unsafe { std::env::set_var(k, v) };
    }
    let mut months = Vec::new();
    let mut cpu_per_row = Vec::new();
    for (n, &rate) in b.rates.iter().enumerate() {
        let (mut interval, cpu) = measure_rate(2 * n, rate, b, b.iceberg, dir.path(), &text, &ends)?;
        // Published once per --iceberg-secs, not at every checkpoint: the
        // publication's requests (with less without) in that share.
        let publishing = b.iceberg != fovea_replayer::lakes::IcebergPublishing::Off;
        if publishing && b.iceberg_secs > b.checkpoint_secs {
            let off = fovea_replayer::lakes::IcebergPublishing::Off;
            let (without, _) = measure_rate(2 * n + 1, rate, b, off, dir.path(), &text, &ends)?;
            let share = b.checkpoint_secs / b.iceberg_secs;
            interval = without.mixed(&interval, share);
        }
        cpu_per_row.push(cpu);
        months.push(month_at(rate, b, &prices, &interval, cpu, record_bytes));
    }
    let cpu_s_per_row = crate::scan::median(&mut cpu_per_row.clone());
    let lake_bytes: u64 = {
        let store = fovea_aws::s3::s3_store(&format!("s3://cost/rate{}", 2 * (b.rates.len() - 1)))?;
        fovea_core::lake::Lake::new(Arc::clone(&store))
            .list(&object_store::path::Path::from(""))?
            .iter()
            .map(|m| m.size)
            .sum()
    };
    let result = json!({
        "prices": {"region": prices.region, "currency": prices.currency, "as_of": prices.as_of},
        "measured": {
            "workload": "hybench",
            "lake_transactions": b.txns,
            "intervals_per_rate": INTERVALS,
            "replayer_cpu_us_per_row": round3(cpu_s_per_row * 1e6),
            "record_bytes_per_row": round3(record_bytes),
            "lake_bytes": lake_bytes,
            "lake_storage_per_month": (lake_bytes as f64 / 1e9 * prices.s3_storage_gb_month * 1e4).round() / 1e4,
            "endpoint": "local: moto as S3 and DynamoDB",
        },
        "deployment": {
            "checkpoint_secs": b.checkpoint_secs,
            "task_vcpu": b.task_vcpu,
            "task_gb": b.task_gb,
            "iceberg": format!("{:?}", b.iceberg),
            "iceberg_secs": b.iceberg_secs,
        },
        "per_month": months,
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
    });
    if b.json {
        println!("{result}");
        return Ok(());
    }
    println!(
        "measured: HyBench, a lake of {} transactions; replayer {} µs CPU per row; {} bytes of change records per row",
        b.txns,
        round3(cpu_s_per_row * 1e6),
        round3(record_bytes)
    );
    println!(
        "prices: {} {} as of {}; a checkpoint every {} s, Iceberg publication {:?} (at most every {} s); replayer task {} vCPU / {} GB all month; the stream read by {}",
        prices.region,
        prices.currency,
        prices.as_of,
        b.checkpoint_secs,
        b.iceberg,
        b.iceberg_secs.max(b.checkpoint_secs),
        b.task_vcpu,
        b.task_gb,
        if b.fan_out { "enhanced fan-out" } else { "polling (--fan-out: by enhanced fan-out)" }
    );
    let columns = [
        ("rows/s", &["rows_per_s"][..]),
        ("Mrows/month", &["million_rows_per_month"]),
        ("S3 requests", &["fovea", "s3_requests"]),
        ("DynamoDB", &["fovea", "dynamodb"]),
        ("task", &["fovea", "replayer_task"]),
        ("fan-out", &["fovea", "fan_out"]),
        ("fovea", &["fovea", "total"]),
        ("fovea/Mrow", &["fovea", "per_million_rows"]),
        ("Firehose", &["firehose_iceberg", "total"]),
        ("Firehose/Mrow", &["firehose_iceberg", "per_million_rows"]),
        ("fovea/Firehose", &["fovea_over_firehose"]),
        ("Kinesis", &["kinesis_input_both", "total"]),
    ];
    let header: Vec<String> = columns.iter().map(|(name, _)| format!("{name:>15}")).collect();
    println!("{}", header.join(""));
    for m in &months {
        let cells: Vec<String> =
            columns.iter().map(|(_, path)| format!("{:>15}", path.iter().fold(m, |v, k| &v[*k]).to_string())).collect();
        println!("{}", cells.join(""));
    }
    println!(
        "(per month in {}; Kinesis is the input of both; the task's CPU use per rate is in --json)",
        prices.currency
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_the_mean_less_the_replays_own_requests() {
        let run = |rows, puts, dynamo_writes| Interval { rows, puts, gets: 2.0, lists: 1.0, dynamo_writes };
        let iv = Interval::mean_less(&[run(100.0, 10.0, 5.0), run(110.0, 14.0, 5.0)], &run(0.0, 4.0, 3.0));
        assert_eq!(iv, Interval { rows: 105.0, puts: 8.0, gets: 0.0, lists: 0.0, dynamo_writes: 2.0 });
        // Never below 0.
        let iv = Interval::mean_less(&[run(10.0, 1.0, 1.0)], &run(0.0, 4.0, 3.0));
        assert_eq!((iv.puts, iv.dynamo_writes), (0.0, 0.0));
    }

    #[test]
    fn transactions_end_where_the_stream_says() {
        let mut text = Vec::new();
        fovea_testkit::workload::generate(fovea_testkit::workload::Workload::Hybench, 5, 7, &mut text).unwrap();
        let ends = transaction_ends(&text);
        assert_eq!(ends.len(), 5);
        assert_eq!(ends.last().unwrap().0, text.len(), "the stream ends with an END line");
        let lines = String::from_utf8(text.clone()).unwrap();
        let records = lines.lines().filter(|l| !l.contains("\"topic\":\"gen.transaction\"")).count() as u64;
        assert_eq!(ends.last().unwrap().1, records);
        for w in ends.windows(2) {
            assert!(w[0].0 < w[1].0 && w[0].1 < w[1].1, "{ends:?}");
            assert!(
                text[..w[1].0].ends_with(b"}\n") && String::from_utf8_lossy(&text[w[0].0..w[1].0]).contains("\"END\"")
            );
        }
    }

    #[test]
    fn the_default_prices_load_and_bad_ones_are_refused_by_name() {
        let p = load_prices(None).unwrap();
        assert_eq!(p.region, "us-east-1");
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("p.json");
        std::fs::write(&bad, DEFAULT_PRICES.replace("\"s3_put_per_1000\": 0.005", "\"s3_put_per_1000\": -1")).unwrap();
        let e = load_prices(Some(&bad)).unwrap_err().to_string();
        assert!(e.contains("p.json") && e.contains("≥ 0"), "{e}");
        std::fs::write(&bad, DEFAULT_PRICES.replace("s3_put_per_1000", "s3_puts_per_1000")).unwrap();
        let e = load_prices(Some(&bad)).unwrap_err().to_string();
        assert!(e.contains("p.json") && e.contains("s3_puts_per_1000"), "{e}");
    }

    #[test]
    fn a_query_on_the_scan_function_is_priced_by_requests_gb_seconds_and_gets() {
        let p = load_prices(None).unwrap();
        // 4 invocations, 25 GB-s, 1,000 GETs.
        let usd = lambda_query_usd(&p, 4, 25.0, 1000);
        let want = 4.0 * 0.20 / 1e6 + 25.0 * 0.0000133334 + 0.0004;
        assert!((usd - want).abs() < 1e-12, "{usd} vs {want}");
        // One split per invocation: 1,234 requests for the same work.
        assert!(lambda_query_usd(&p, 1234, 25.0, 1000) > usd);
    }

    #[test]
    fn a_month_prices_each_item() {
        let p = load_prices(None).unwrap();
        let b = CostBench {
            txns: 1000,
            rates: vec![1000.0],
            checkpoint_secs: 10.0,
            prices: None,
            task_vcpu: 2.0,
            task_gb: 8.0,
            iceberg: fovea_replayer::lakes::IcebergPublishing::Off,
            iceberg_secs: 0.0,
            fan_out: false,
            json: true,
        };
        let iv = Interval { rows: 10_000.0, puts: 12.0, gets: 0.0, lists: 0.0, dynamo_writes: 2.0 };
        let v = month_at(1000.0, &b, &p, &iv, 10e-6, 500.0);
        let month_s = 730.0 * 3600.0;
        // PUTs: 12 per 10 s.
        let s3 = 1.2 * month_s / 1000.0 * 0.005;
        assert!((v["fovea"]["s3_requests"].as_f64().unwrap() - s3).abs() < 0.01, "{v}");
        // DynamoDB: 0.2/s for checkpoints + 0.2/s of lease renewals (ttl 15 s).
        let dynamo = 0.4 * month_s / 1e6 * 0.625;
        assert!((v["fovea"]["dynamodb"].as_f64().unwrap() - dynamo).abs() < 0.01, "{v}");
        let task = (2.0 * 0.03238 + 8.0 * 0.00356) * 730.0;
        assert!((v["fovea"]["replayer_task"].as_f64().unwrap() - task).abs() < 0.01, "{v}");
        // 0.5 MB/s and 1,000 records/s: one shard.
        assert_eq!(v["kinesis_input_both"]["shards"].as_f64(), Some(1.0));
        let firehose = 1000.0 * 500.0 * month_s / 1e9 * 0.075;
        assert!((v["firehose_iceberg"]["total"].as_f64().unwrap() - firehose).abs() < 0.01, "{v}");
        assert_eq!(v["fovea"]["task_cpu_busy"].as_f64(), Some(0.005));
        let total = s3 + dynamo + task;
        assert!((v["fovea"]["per_million_rows"].as_f64().unwrap() - total / 2628.0).abs() < 1e-4, "{v}");
        assert_eq!(v["fovea"]["fan_out"].as_f64(), Some(0.0));
        // Read by enhanced fan-out: one consumer-shard all month and the GB pushed.
        let v = month_at(1000.0, &CostBench { fan_out: true, ..b }, &p, &iv, 10e-6, 500.0);
        let fan_out = 730.0 * 0.015 + 1000.0 * 500.0 * month_s / 1e9 * 0.013;
        assert!((v["fovea"]["fan_out"].as_f64().unwrap() - fan_out).abs() < 0.01, "{v}");
        assert!((v["fovea"]["total"].as_f64().unwrap() - (total + fan_out)).abs() < 0.02, "{v}");
    }
}
