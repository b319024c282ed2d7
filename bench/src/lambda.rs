//! `fovea-bench scan --scan lambda://FUNCTION`: one full-table aggregation
//! over a table of `--rows` rows (1% of them updated, so visibility has
//! work) in an S3 lake, in process and through the scan function with at
//! most N = 1, 4, 16 invocations at once, its splits grouped into
//! invocations (spread over N, 8 to `group_mb` MB to read each) — and, as
//! the baseline of the same run at each N, one split per invocation (how
//! scans ran before groups). On a machine with fewer cores than N, the
//! instances share them: function GB-seconds compare like for like at
//! N = 1 only.
//!
//! Without `--lake`, everything is local: moto as S3 and DynamoDB,
//! `cargo lambda watch` as the Lambda endpoint with 16 instances of the
//! `fovea-scan` binary built beside this one (`cargo build --workspace`,
//! same profile). Reported: rows/s and the ratio to in-process,
//! invocations and function GB-seconds per query (at the template's 2,048
//! MB: Lambda bills GB-seconds and requests) and what 1,000 such queries
//! cost at `bench/prices/aws-us-east-1.json`'s list prices, bytes the
//! function read per stored row, the function's time per invocation, the
//! instances' init time; and the visibility kernel's throughput (GB/s of
//! create-ts and bitmap words) beside a memory copy measured in the same
//! run.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use arrow::datatypes::{DataType, Field, Schema};
use fovea_aws::lambda::{LambdaScan, LambdaTarget};
use fovea_core::replay::Op;
use fovea_core::scan_worker::SplitWorker;
use fovea_core::sink::{Sink, SinkConfig};
use fovea_core::{EngineConfig, SnapshotTables, Value};
use fovea_testkit::lambda_local::LocalLambda;
use fovea_testkit::moto::Moto;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde_json::json;

use crate::scan::{median, round3};
use fovea_replayer::lakes::LakeArgs;
use fovea_replayer::replay::CliResult;

/// `fovea-bench scan --scan lambda://…`'s settings.
pub struct LambdaScanBench {
    /// `lambda://FUNCTION` (its `concurrency` is replaced by 1, 4, 16).
    pub target: String,
    /// Rows of the table.
    pub rows: u64,
    /// An existing S3 lake and its state (default: local stand-ins).
    pub lake: Option<(String, String)>,
    /// One JSON object instead of text.
    pub json: bool,
}

const TABLE: &str = "bench.wide";
/// The scan function's memory in template.yaml, GB (its GB-seconds).
const FUNCTION_MEMORY_GB: f64 = 2.0;
const QUERY: &str = "SELECT count(*) AS n, sum(a) AS sa, avg(c) AS ac, max(name) AS mn FROM bench.wide";

/// The local stand-ins (stopped on drop).
struct Local {
    _moto: Moto,
    lambda: LocalLambda,
}

pub fn run(b: &LambdaScanBench) -> CliResult<()> {
    let base = LambdaTarget::parse(&b.target)?;
    let (lake, local) = match &b.lake {
        Some((lake, state)) => (LakeArgs { lake: lake.clone(), state: Some(state.clone()), no_create: false }, None),
        None => {
            let moto = Moto::start(&fovea_testkit::moto::script())?;
            moto.create_bucket("bench")?;
            for (k, v) in moto.env() {
                // SAFETY: set before this process starts any thread that
                // reads the environment (the IO runtime, the AWS clients).
                unsafe { std::env::set_var(k, v) };
            }
            let function = std::env::current_exe()?.with_file_name("fovea-scan");
            let env: Vec<(String, String)> = moto.env().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            let workspace = fovea_testkit::workspace_dir();
            let lambda = LocalLambda::start(&workspace, &function, 16, &env)?;
            // SAFETY: as above; no other thread has started yet.
            unsafe { std::env::set_var("AWS_ENDPOINT_URL_LAMBDA", lambda.endpoint()) };
            let lake = LakeArgs {
                lake: "s3://bench/wide".into(),
                state: Some("dynamodb://fovea-bench-lambda".into()),
                no_create: false,
            };
            (lake, Some(Local { _moto: moto, lambda }))
        }
    };
    let progress = !b.json;
    let built = Instant::now();
    let (stored, visible) = build_table(&lake, b.rows)?;
    if progress {
        eprintln!(
            "table {TABLE}: {stored} stored rows, {visible} visible, built in {:.1} s",
            built.elapsed().as_secs_f64()
        );
    }

    let opened = lake.open_read()?;
    let reader = Arc::clone(&opened.reader) as Arc<dyn SnapshotTables>;
    let splits = reader.scan(TABLE, Default::default())?.splits();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let in_process = {
        // One warm-up, then the median of three.
        let mut times = Vec::new();
        let mut answer = String::new();
        for round in 0..4 {
            let began = Instant::now();
            let batches = runtime.block_on(fovea_sql::query_on(Arc::clone(&reader), QUERY))?;
            if round > 0 {
                times.push(began.elapsed().as_secs_f64());
            }
            answer = arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
        }
        (median(&mut times), answer)
    };
    // Lambda requests, GB-seconds and GETs at us-east-1 list prices.
    let prices = crate::cost::load_prices(None)?;
    let mut through_lambda = Vec::new();
    // Per N: the one-split-per-invocation baseline's (invocations, GB-s, seconds).
    let mut per_split = std::collections::HashMap::new();
    for (n, grouped) in [(1usize, false), (4, false), (16, false), (1, true), (4, true), (16, true)] {
        let group_bytes = if grouped { base.group_bytes } else { 1 };
        let target = LambdaTarget { concurrency: n, group_bytes, ..base.clone() };
        let worker = LambdaScan::new(target, &lake.lake, Arc::clone(opened.reader.lake().store()))?;
        let stats = Arc::clone(worker.stats());
        let worker: Arc<dyn SplitWorker> = Arc::new(worker);
        let began = Instant::now();
        let batches = runtime.block_on(fovea_sql::query_remote(Arc::clone(&reader), worker, QUERY))?;
        let seconds = began.elapsed().as_secs_f64();
        let answer = arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
        if answer != in_process.1 {
            return Err(format!("through Lambda (N = {n}):\n{answer}\nin process:\n{}", in_process.1).into());
        }
        // Relaxed: statistics read after the query ended.
        let invocations = stats.invocations.load(Ordering::Relaxed);
        let bytes = stats.bytes_read.load(Ordering::Relaxed);
        let function_us = stats.function_micros.load(Ordering::Relaxed);
        let gets = stats.gets.load(Ordering::Relaxed);
        let gb_s = function_us as f64 / 1e6 * FUNCTION_MEMORY_GB;
        let usd_per_1000 = 1000.0 * crate::cost::lambda_query_usd(&prices, invocations, gb_s, gets);
        let run = json!({
            "n": n,
            "group_mb": if grouped { json!(group_bytes >> 20) } else { json!("one split per invocation") },
            "seconds": round3(seconds),
            "rows_per_s": (stored as f64 / seconds).round(),
            "over_in_process": round3(in_process.0 / seconds),
            "invocations": invocations,
            "retries": stats.retries.load(Ordering::Relaxed),
            "bytes_read_per_row": round3(bytes as f64 / stored as f64),
            "function_ms_per_invocation": round3(function_us as f64 / 1e3 / invocations.max(1) as f64),
            "function_gb_s": round3(gb_s),
            "function_s3_gets": gets,
            "usd_per_1000_queries": (usd_per_1000 * 1e4).round() / 1e4,
        });
        if progress {
            eprintln!(
                "N = {n}, {}: {seconds:.2} s, {invocations} invocations, {gb_s:.2} GB-s, ${usd_per_1000:.4} per 1,000 queries",
                run["group_mb"]
            );
        }
        let mut run = run;
        match per_split.get(&n) {
            None => {
                per_split.insert(n, (invocations, gb_s, seconds));
            }
            Some(&(base_invocations, base_gb_s, base_seconds)) => {
                run["invocations_over_one_split_each"] = json!(round3(invocations as f64 / base_invocations as f64));
                run["gb_s_over_one_split_each"] = json!(round3(gb_s / base_gb_s.max(1e-9)));
                run["speed_over_one_split_each"] = json!(round3(base_seconds / seconds));
            }
        }
        through_lambda.push(run);
    }
    let mut init_ms = local.as_ref().map(|l| init_times(&l.lambda.instance_logs())).unwrap_or_default();
    let (kernel_gb_s, memory_gb_s) = kernel_and_memory();
    let result = json!({
        "table": TABLE,
        "stored_rows": stored,
        "visible_rows": visible,
        "splits": splits,
        "query": QUERY,
        "in_process": {"seconds": round3(in_process.0), "rows_per_s": (stored as f64 / in_process.0).round()},
        "lambda": through_lambda,
        "function_init_ms_median": (!init_ms.is_empty()).then(|| round3(median(&mut init_ms))),
        "kernel_gb_per_s": round3(kernel_gb_s),
        "memory_copy_gb_per_s": round3(memory_gb_s),
        "kernel_over_memory": round3(kernel_gb_s / memory_gb_s),
        "endpoint": if local.is_some() { "local: moto + cargo lambda watch, 16 instances" } else { "AWS" },
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
    });
    if b.json {
        println!("{result}");
    } else {
        println!("{}", serde_json::to_string_pretty(&result)?);
    }
    Ok(())
}

/// Creates `bench.wide` with `rows` rows and 1% of them updated, combined
/// into regular files, and checkpoints: (stored rows, visible rows).
fn build_table(lake: &LakeArgs, rows: u64) -> CliResult<(usize, usize)> {
    let opened = lake.open_write(EngineConfig::default(), fovea_core::lease::DEFAULT_LEASE_TTL)?;
    let engine = Arc::clone(&opened.engine);
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("a", DataType::Int64, false),
        Field::new("c", DataType::Float64, false),
        Field::new("name", DataType::Utf8, false),
    ]);
    let table = engine.create_table(TABLE, Arc::new(schema), vec![0])?;
    let row = |k: i64, v: i64| {
        vec![Value::Int(k), Value::Int(v), Value::Float(k as f64 * 0.5), Value::Utf8(format!("r{k:09}"))]
    };
    let rows = i64::try_from(rows).map_err(|_| "--rows is too large")?;
    let mut k = 0;
    while k < rows {
        let end = (k + 100_000).min(rows);
        engine.apply((k..end).map(|k| Op::Insert { table: table.id, row: row(k, k) }).collect())?;
        k = end;
    }
    let mut rng = SmallRng::seed_from_u64(11);
    let mut updates = rows / 100;
    while updates > 0 {
        let n = updates.min(10_000);
        updates -= n;
        let ops = (0..n)
            .map(|_| {
                let k = rng.random_range(0..rows);
                Op::Update { table: table.id, key: vec![Value::Int(k)], row: row(k, -k) }
            })
            .collect();
        engine.apply(ops)?;
    }
    engine.flush()?;
    engine.combine()?;
    let mut sink = Sink::new(Arc::clone(&engine), Arc::clone(&opened.catalog), "bench-lambda", SinkConfig::default())?;
    sink.maybe_checkpoint(Default::default(), true)?;
    let snapshot = engine.snapshot();
    let at = engine.at(snapshot);
    let scan = at.scan(TABLE, Default::default())?;
    let stored = scan.stored_rows();
    let visible = scan.collect_batches()?.iter().map(|b| b.num_rows()).sum();
    Ok((stored, visible))
}

/// `init_ms=…` of every instance's ready line.
fn init_times(logs: &str) -> Vec<f64> {
    logs.lines()
        .filter_map(|l| l.split("init_ms").nth(1))
        .filter_map(|rest| {
            let digits: String = rest
                .chars()
                .skip_while(|c| !c.is_ascii_digit())
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            digits.parse().ok()
        })
        .collect()
}

/// GB/s of the visibility kernel (create-ts mask, and-not of the deleted
/// bits, count) over 16M rows, and of a 256 MiB memory copy, one thread.
fn kernel_and_memory() -> (f64, f64) {
    let rows = 16 << 20;
    let create_ts: Vec<i64> = (0..rows as i64).map(|i| i % 1000).collect();
    let deleted: Vec<u64> = (0..rows / 64).map(|i| if i % 100 == 0 { 1 } else { 0 }).collect();
    let mut mask = vec![0u64; rows / 64];
    let mut best = f64::MAX;
    let mut visible = 0;
    for _ in 0..5 {
        let began = Instant::now();
        fovea_scan_wasm::create_ts_mask(&create_ts, 500, &mut mask);
        fovea_scan_wasm::and_not(&mut mask, &deleted);
        visible += fovea_scan_wasm::count_visible(&mask, rows);
        best = best.min(began.elapsed().as_secs_f64());
    }
    std::hint::black_box(visible);
    // Bytes the kernel touches: create-ts read, mask written and read
    // twice, deleted bits read.
    let kernel_bytes = (rows * 8 + mask.len() * 8 * 3 + deleted.len() * 8) as f64;
    let src = vec![1u8; 256 << 20];
    let mut dst = vec![0u8; 256 << 20];
    let mut copy = f64::MAX;
    for _ in 0..5 {
        let began = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        copy = copy.min(began.elapsed().as_secs_f64());
    }
    // A copy reads and writes every byte.
    (kernel_bytes / best / 1e9, (2 * src.len()) as f64 / copy / 1e9)
}
