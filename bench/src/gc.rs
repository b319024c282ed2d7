//! `fovea-bench gc`: what storage GC buys and costs, in one run.
//!
//! * A table of `rows` rows on a local lake, every second row updated
//!   twice: half the stored rows are stale (the files of the initial load
//!   half, those of the first updates all, those of the second none). Lake size and the median
//!   of an aggregate query before and after one storage-GC round, and that
//!   round's rewrite speed (rows of the files it rewrote per second).
//! * Replay throughput of an update stream with in-process maintenance
//!   rounds (memory GC, combine, storage GC) running beside it vs with the
//!   same rounds without storage GC, as a ratio.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arrow::datatypes::{DataType, Field, Schema};
use fovea_core::{Engine, EngineConfig, Op, Value};
use rand::{Rng, SeedableRng, rngs::SmallRng};

use crate::scan::median;
use fovea_replayer::replay::{CliResult, STORAGE_GC_THRESHOLD, maintenance_round};

/// Options of `fovea-bench gc`.
pub struct GcBenchArgs {
    /// Rows of the table.
    pub rows: usize,
    /// Seconds of each replay run.
    pub seconds: f64,
    /// Print one JSON object.
    pub json: bool,
}

/// The benchmark tables' columns: a key, two numbers, a name.
pub(crate) fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("a", DataType::Int64, false),
        Field::new("b", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
    ]))
}

/// Row `k` of [`schema`] with value `v`.
pub(crate) fn row(k: i64, v: i64) -> Vec<Value> {
    vec![Value::Int(k), Value::Int(v), Value::Int(k % 100), Value::Utf8(format!("row-{k:010}"))]
}

/// Bytes of the table files under `dir`.
fn lake_bytes(dir: &std::path::Path) -> CliResult<u64> {
    Ok(fovea_replayer::demo::dir_bytes(&dir.join("tables")).map_err(|e| format!("size of {}: {e}", dir.display()))?)
}

/// Runs the benchmark and prints its report.
pub fn run(args: &GcBenchArgs) -> CliResult<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let dir = tempfile::tempdir()?;
    let engine = Engine::open_dir(dir.path(), EngineConfig::default())?;
    let t = engine.create_table("bench.gc", schema(), vec![0])?;
    let n = args.rows as i64;
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        engine.apply(chunk.iter().map(|&k| Op::Insert { table: t.id, row: row(k, k) }).collect())?;
    }
    for round in 1..=2 {
        for chunk in (0..n).step_by(2).collect::<Vec<_>>().chunks(10_000) {
            engine.apply(
                chunk
                    .iter()
                    .map(|&k| Op::Update { table: t.id, key: vec![Value::Int(k)], row: row(k, -k * round) })
                    .collect(),
            )?;
        }
    }
    engine.flush()?;
    engine.combine()?;
    engine.gc()?;
    let stale = engine.storage_gc_candidates(0.0)?;
    let stored: usize = stale.iter().map(|f| f.rows).sum();
    let deleted: usize = stale.iter().map(|f| f.deleted).sum();
    let sql = "SELECT b, count(*), sum(a), max(name) FROM bench.gc WHERE b < 50 GROUP BY b";
    let query_ms = || -> CliResult<f64> {
        let mut t = Vec::new();
        for _ in 0..7 {
            let snap = engine.snapshot();
            let start = Instant::now();
            runtime.block_on(fovea_sql::query(&engine, &snap, sql))?;
            t.push(start.elapsed().as_secs_f64() * 1e3);
        }
        Ok(median(&mut t))
    };
    query_ms()?;
    let (bytes_before, query_before) = (lake_bytes(dir.path())?, query_ms()?);
    let began = Instant::now();
    let report = engine.storage_gc(STORAGE_GC_THRESHOLD)?;
    let gc_s = began.elapsed().as_secs_f64();
    // Retired files go once no reader holds them (none here).
    engine.gc()?;
    let (bytes_after, query_after) = (lake_bytes(dir.path())?, query_ms()?);
    let gc_rows_per_s = (report.rows_kept + report.rows_dropped) as f64 / gc_s.max(1e-9);

    let seconds = Duration::from_secs_f64(args.seconds);
    let without = replay_rate(seconds, false)?;
    let with = replay_rate(seconds, true)?;
    let again = replay_rate(seconds, false)?;
    let baseline = (without.0 + again.0) / 2.0;
    let out = serde_json::json!({
        "rows": args.rows,
        "stale_fraction_before": deleted as f64 / stored.max(1) as f64,
        "lake_mb_before": bytes_before as f64 / 1e6,
        "lake_mb_after": bytes_after as f64 / 1e6,
        "lake_after_over_before": bytes_after as f64 / bytes_before.max(1) as f64,
        "query_ms_before": query_before,
        "query_ms_after": query_after,
        "query_after_over_before": query_after / query_before,
        "gc_files_rewritten": report.files_rewritten,
        "gc_rows_dropped": report.rows_dropped,
        "gc_seconds": gc_s,
        "gc_rows_per_s": gc_rows_per_s,
        "replay_rows_per_s_without_gc": baseline,
        "replay_rows_per_s_with_gc": with.0,
        "replay_with_gc_over_without": with.0 / baseline,
        "replay_files_rewritten": with.1,
    });
    if args.json {
        println!("{out}");
    } else {
        println!("storage GC, {} rows, every second one updated twice", args.rows);
        println!(
            "  stale fraction {:.2}; lake {:.1} MB -> {:.1} MB ({:.2}x); query {:.1} ms -> {:.1} ms ({:.2}x)",
            out["stale_fraction_before"].as_f64().unwrap_or(f64::NAN),
            bytes_before as f64 / 1e6,
            bytes_after as f64 / 1e6,
            bytes_after as f64 / bytes_before.max(1) as f64,
            query_before,
            query_after,
            query_after / query_before
        );
        println!(
            "  one round: {} files rewritten, {} stale rows dropped, {:.2} s = {gc_rows_per_s:.0} rows/s",
            report.files_rewritten, report.rows_dropped, gc_s
        );
        println!(
            "  replay with storage GC beside it: {:.0} rows/s vs {baseline:.0} without ({:.3}x; {} files rewritten)",
            with.0,
            with.0 / baseline,
            with.1
        );
    }
    Ok(())
}

/// Rows/s of an update stream over 200,000 keys for `seconds`, with
/// maintenance rounds every second beside it: with storage GC
/// (`storage_gc`) or without. Returns the rate and the files rewritten.
fn replay_rate(seconds: Duration, storage_gc: bool) -> CliResult<(f64, usize)> {
    let dir = tempfile::tempdir()?;
    let engine = Engine::open_dir(dir.path(), EngineConfig::default())?;
    let t = engine.create_table("bench.replay", schema(), vec![0])?;
    const KEYS: i64 = 200_000;
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(10_000) {
        engine.apply(chunk.iter().map(|&k| Op::Insert { table: t.id, row: row(k, 0) }).collect())?;
    }
    let stop = AtomicBool::new(false);
    let rewritten = std::sync::atomic::AtomicUsize::new(0);
    let mut rows = 0u64;
    let elapsed = std::thread::scope(|s| -> CliResult<f64> {
        let maintenance = s.spawn(|| -> fovea_core::Result<()> {
            // Acquire: pairs with the Release store below.
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_secs(1));
                if storage_gc {
                    let report = maintenance_round(&engine, STORAGE_GC_THRESHOLD)?;
                    // Relaxed: a counter read after the join.
                    rewritten.fetch_add(report.files_rewritten, Ordering::Relaxed);
                } else {
                    engine.gc()?;
                    engine.flush()?;
                    engine.combine()?;
                }
            }
            Ok(())
        });
        let mut rng = SmallRng::seed_from_u64(3);
        let start = Instant::now();
        while start.elapsed() < seconds {
            let ops: Vec<Op> = (0..100)
                .map(|_| {
                    let k = rng.random_range(0..KEYS);
                    Op::Update { table: t.id, key: vec![Value::Int(k)], row: row(k, rows as i64) }
                })
                .collect();
            rows += ops.len() as u64;
            engine.apply(ops)?;
        }
        let elapsed = start.elapsed().as_secs_f64();
        // Release: pairs with the Acquire load in the maintenance thread.
        stop.store(true, Ordering::Release);
        maintenance.join().map_err(|_| "the maintenance thread panicked")??;
        Ok(elapsed)
    })?;
    Ok((rows as f64 / elapsed, rewritten.load(Ordering::Relaxed)))
}
