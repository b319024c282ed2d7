//! `fovea demo`: the embedded main job in one process.
//!
//! A generator produces HyBench-shaped transactions (transfers between
//! accounts: ~65% updates, ~30% inserts, ~5% deletes, ~10 rows each, every
//! row stamped with `fresh_ts`, the time the change was produced), the engine
//! replays them at the requested rate into a lake directory, a query loop
//! reads the live tables the whole time and checks that every answer is a
//! consistent snapshot (the total balance never changes), and a background
//! loop runs memory GC, flushes and combines. The report gives throughput,
//! freshness (HyBench method: query start − max visible `fresh_ts`), query
//! latency with and without visibility, and memory.

use crate::latency::Latencies;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow::array::{Array, Decimal128Array, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use fovea_core::engine::METADATA_DIR;
use fovea_core::{Engine, EngineConfig, Op, Value, VisibilityMode};
use rand::{Rng, SeedableRng, rngs::SmallRng};

/// Options of `fovea demo`.
pub struct DemoOptions {
    /// Lake directory.
    pub lake: PathBuf,
    /// Replay duration.
    pub seconds: u64,
    /// Target changed rows per second.
    pub rate: u64,
    /// No progress line.
    pub quiet: bool,
    /// Print the report as one JSON object (summary fields, then `windows`).
    pub json: bool,
}

/// What a demo run measured.
pub struct DemoReport {
    /// Rows replayed.
    pub rows: u64,
    /// Wall time of the replay.
    pub seconds: f64,
    /// Consistent query answers.
    pub queries: usize,
    /// Freshness P50, ms.
    pub freshness_p50_ms: f64,
    /// Freshness P99, ms.
    pub freshness_p99_ms: f64,
    /// Query latency P50 with VFoR, ms.
    pub query_p50_ms: f64,
    /// The same query with visibility off, P50, ms.
    pub query_off_p50_ms: f64,
    /// Visibility memory per tuple.
    pub visibility_bits_per_tuple: f64,
    /// Tuples stored.
    pub tuples: usize,
    /// Index bytes.
    pub index_bytes: usize,
    /// Buffer bytes.
    pub buffer_bytes: usize,
    /// Bytes of the lake directory at the end.
    pub lake_bytes: u64,
    /// The plot.
    pub plot: PathBuf,
    /// The run in windows of [`WINDOW_S`] seconds.
    pub windows: Vec<Window>,
}

/// Length of a report window, seconds.
pub const WINDOW_S: f64 = 10.0;

/// What one window of the run measured (the last one may be shorter).
pub struct Window {
    /// Start, seconds from the start of the replay.
    pub start_s: f64,
    /// Rows replayed per second in the window.
    pub rows_per_s: f64,
    /// Freshness P50 of the window's queries, ms (NaN: no query ended in it).
    pub freshness_p50_ms: f64,
    /// Freshness P99 of the window's queries, ms.
    pub freshness_p99_ms: f64,
    /// Query latency P50 of the window's queries, ms.
    pub query_p50_ms: f64,
    /// Bytes of the lake directory at the window's last sample.
    pub lake_bytes: u64,
}

const ACCOUNTS: i64 = 10_000;
/// 1000.00 in cents (the balance column has scale 2).
const INITIAL_BALANCE: i128 = 100_000;

type DemoResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn now_micros() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// Makes `lake` an empty directory, refusing to touch anything that is not
/// a fovea lake.
fn prepare_lake(lake: &Path) -> DemoResult<()> {
    if lake.exists() {
        let is_lake = lake.join(METADATA_DIR).is_dir();
        let is_empty = std::fs::read_dir(lake)?.next().is_none();
        if is_lake {
            std::fs::remove_dir_all(lake)?;
        } else if !is_empty {
            return Err(format!(
                "{} exists and is not a fovea lake; choose another --lake (the demo replaces only lakes it made)",
                lake.display()
            )
            .into());
        }
    }
    std::fs::create_dir_all(lake)?;
    Ok(())
}

struct QuerySample {
    at_s: f64,
    freshness_ms: f64,
    latency_ms: f64,
}

/// The lake directory's size: `(seconds from the start, bytes)`.
type LakeSample = (f64, u64);

/// Bytes of the files under `dir`. A file deleted while the walk runs (GC
/// retiring blocks) is not counted; any other error is returned.
pub fn dir_bytes(dir: &Path) -> std::io::Result<u64> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let mut total = 0;
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if gone(&e) => return Ok(0),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(e),
        };
        match entry.metadata() {
            Ok(m) if m.is_dir() => total += dir_bytes(&entry.path())?,
            Ok(m) => total += m.len(),
            Err(e) if gone(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

/// The run cut into windows of [`WINDOW_S`] seconds: each query counts in
/// the window it ended in, each row in the second it was replayed in.
fn windows(samples: &[QuerySample], throughput: &[u64], lake: &[LakeSample], seconds: f64) -> Vec<Window> {
    let count = (seconds / WINDOW_S).ceil().max(1.0) as usize;
    (0..count)
        .map(|w| {
            let (start, end) = (w as f64 * WINDOW_S, ((w + 1) as f64 * WINDOW_S).min(seconds));
            let inside = |t: f64| t >= start && (t < end || (w + 1 == count && t <= seconds));
            let queries: Vec<&QuerySample> = samples.iter().filter(|q| inside(q.at_s)).collect();
            let fresh: Latencies = queries.iter().map(|q| q.freshness_ms).collect();
            let latency: Latencies = queries.iter().map(|q| q.latency_ms).collect();
            // Whole seconds: the throughput series is per second.
            let rows: u64 = throughput.iter().enumerate().filter(|(i, _)| inside(*i as f64)).map(|(_, r)| r).sum();
            let lake_bytes = lake.iter().rev().find(|(t, _)| *t < end || w + 1 == count).map_or(0, |(_, b)| *b);
            Window {
                start_s: start,
                rows_per_s: rows as f64 / (end - start).max(1e-9),
                freshness_p50_ms: fresh.quantile_ms(0.5),
                freshness_p99_ms: fresh.quantile_ms(0.99),
                query_p50_ms: latency.quantile_ms(0.5),
                lake_bytes,
            }
        })
        .collect()
}

/// Runs the demo and prints its report.
pub fn run(o: &DemoOptions) -> DemoResult<()> {
    let r = measure(o)?;
    if o.json {
        let windows: Vec<_> = r
            .windows
            .iter()
            .map(|w| {
                serde_json::json!({
                    "start_s": w.start_s,
                    "rows_per_s": w.rows_per_s.round(),
                    "freshness_p50_ms": w.freshness_p50_ms,
                    "freshness_p99_ms": w.freshness_p99_ms,
                    "query_p50_ms": w.query_p50_ms,
                    "lake_bytes": w.lake_bytes,
                })
            })
            .collect();
        let report = serde_json::json!({
            "rows": r.rows,
            "seconds": r.seconds,
            "rows_per_s": (r.rows as f64 / r.seconds).round(),
            "target_rows_per_s": o.rate,
            "queries": r.queries,
            "freshness_p50_ms": r.freshness_p50_ms,
            "freshness_p99_ms": r.freshness_p99_ms,
            "query_p50_ms": r.query_p50_ms,
            "query_off_p50_ms": r.query_off_p50_ms,
            "visibility_bits_per_tuple": r.visibility_bits_per_tuple,
            "tuples": r.tuples,
            "index_bytes": r.index_bytes,
            "buffer_bytes": r.buffer_bytes,
            "lake_bytes": r.lake_bytes,
            "plot": r.plot,
            "windows": windows,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("\n== fovea demo report ==");
    println!(
        "replayed            {} rows in {:.1} s = {:.0} rows/s (target {})",
        r.rows,
        r.seconds,
        r.rows as f64 / r.seconds,
        o.rate
    );
    println!("queries             {} consistent snapshots (total balance checked on each)", r.queries);
    println!("freshness           P50 {:.2} ms, P99 {:.2} ms", r.freshness_p50_ms, r.freshness_p99_ms);
    println!(
        "query latency       live (VFoR) P50 {:.2} ms vs visibility off P50 {:.2} ms",
        r.query_p50_ms, r.query_off_p50_ms
    );
    println!(
        "memory              visibility {:.3} bits/tuple ({} tuples), index {} KiB, buffers {} KiB",
        r.visibility_bits_per_tuple,
        r.tuples,
        r.index_bytes / 1024,
        r.buffer_bytes / 1024
    );
    println!("lake                {:.1} MB", r.lake_bytes as f64 / 1e6);
    println!("plot                {}", r.plot.display());
    println!(
        "query it            fovea sql --lake {} \"SELECT count(*), sum(balance) FROM hybench.account\"",
        o.lake.display()
    );
    Ok(())
}

/// Runs the demo and returns what it measured.
pub fn measure(o: &DemoOptions) -> DemoResult<DemoReport> {
    prepare_lake(&o.lake)?;
    let lake =
        fovea_core::location::open_lake(&o.lake, EngineConfig::default(), fovea_core::location::OpenMode::Write)?;
    let engine = Arc::clone(&lake.engine);
    let account = engine.create_table(
        "hybench.account",
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
            Field::new("balance", DataType::Decimal128(18, 2), false),
            Field::new("fresh_ts", DataType::Timestamp(TimeUnit::Microsecond, None), false),
        ])),
        vec![0],
    )?;
    let transfer = engine.create_table(
        "hybench.transfer",
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("src", DataType::Int64, false),
            Field::new("dst", DataType::Int64, false),
            Field::new("amount", DataType::Decimal128(18, 2), false),
            Field::new("fresh_ts", DataType::Timestamp(TimeUnit::Microsecond, None), false),
        ])),
        vec![0],
    )?;
    let t0 = now_micros();
    let mut balances = vec![INITIAL_BALANCE; ACCOUNTS as usize];
    engine.apply(
        (0..ACCOUNTS).map(|k| Op::Insert { table: account.id, row: account_row(k, INITIAL_BALANCE, t0) }).collect(),
    )?;
    if !o.quiet {
        // On stderr with --json: stdout is the JSON report alone.
        let banner = format!(
            "fovea demo: lake {}, {} s at {} rows/s, {} shards; {ACCOUNTS} accounts loaded",
            o.lake.display(),
            o.seconds,
            o.rate,
            engine.config().shards
        );
        if o.json {
            eprintln!("{banner}");
        } else {
            println!("{banner}");
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::<QuerySample>::new()));
    let off_latency = Arc::new(Mutex::new(Vec::<f64>::new()));
    let rows_done = Arc::new(AtomicU64::new(0));
    let lake_sizes = Arc::new(Mutex::new(Vec::<LakeSample>::new()));
    let start = Instant::now();
    let failure: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    // Rows replayed in each second of the run.
    let mut throughput: Vec<u64> = Vec::new();
    // The newest transaction: mirror ts, production time, rows per table.
    let mut newest: Option<(fovea_core::Ts, i64, u64, u64)> = None;

    std::thread::scope(|s| -> DemoResult<()> {
        // Query loop: a consistent total and the freshest visible change.
        {
            let (engine, stop, samples, off_latency, failure) = (&engine, &stop, &samples, &off_latency, &failure);
            s.spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(r) => r,
                    Err(e) => {
                        *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("query runtime: {e}"));
                        return;
                    }
                };
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let at = now_micros();
                    let begun = Instant::now();
                    match sum_and_freshest(engine, &runtime, VisibilityMode::Enforced) {
                        Ok((total, freshest)) => {
                            let latency_ms = begun.elapsed().as_secs_f64() * 1e3;
                            if total != INITIAL_BALANCE * i128::from(ACCOUNTS) {
                                *failure.lock().unwrap_or_else(|p| p.into_inner()) =
                                    Some(format!("snapshot isolation violated: total balance {total}"));
                                return;
                            }
                            samples.lock().unwrap_or_else(|p| p.into_inner()).push(QuerySample {
                                at_s: start.elapsed().as_secs_f64(),
                                freshness_ms: (at - freshest) as f64 / 1e3,
                                latency_ms,
                            });
                        }
                        Err(e) => {
                            *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("query failed: {e}"));
                            return;
                        }
                    }
                    n += 1;
                    if n.is_multiple_of(10) {
                        let begun = Instant::now();
                        if sum_and_freshest(engine, &runtime, VisibilityMode::Off).is_ok() {
                            off_latency
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(begun.elapsed().as_secs_f64() * 1e3);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
        }
        // Background maintenance: memory GC, flush, combine, storage GC;
        // then the lake's size.
        {
            let (engine, stop, failure, lake_sizes) = (&engine, &stop, &failure, &lake_sizes);
            s.spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(500));
                    let r = crate::replay::maintenance_round(engine, crate::replay::STORAGE_GC_THRESHOLD).map(|_| ());
                    if let Err(e) = r {
                        *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("maintenance failed: {e}"));
                        return;
                    }
                    match dir_bytes(&o.lake) {
                        Ok(bytes) => lake_sizes
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((start.elapsed().as_secs_f64(), bytes)),
                        Err(e) => {
                            *failure.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(format!("size of the lake {}: {e}", o.lake.display()));
                            return;
                        }
                    }
                }
            });
        }
        // Generator + replay, paced to the target rate.
        let mut rng = SmallRng::seed_from_u64(42);
        let mut next_transfer = 0i64;
        let newest = &mut newest;
        let mut live_transfers: Vec<i64> = Vec::new();
        let mut last_report = Instant::now();
        let throughput = &mut throughput;
        let deadline = Duration::from_secs(o.seconds);
        let result = (|| -> DemoResult<()> {
            while start.elapsed() < deadline {
                if failure.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                    break;
                }
                let fresh = now_micros();
                let mut ops = Vec::with_capacity(10);
                for _ in 0..3 {
                    let (a, b) = (rng.random_range(0..ACCOUNTS), rng.random_range(0..ACCOUNTS));
                    let x = i128::from(rng.random_range(1..10_000i64));
                    if a == b {
                        continue;
                    }
                    balances[a as usize] -= x;
                    balances[b as usize] += x;
                    for k in [a, b] {
                        ops.push(Op::Update {
                            table: account.id,
                            key: vec![Value::Int(k)],
                            row: account_row(k, balances[k as usize], fresh),
                        });
                    }
                    ops.push(Op::Insert {
                        table: transfer.id,
                        row: vec![
                            Value::Int(next_transfer),
                            Value::Int(a),
                            Value::Int(b),
                            Value::Decimal(x),
                            Value::Int(fresh),
                        ],
                    });
                    live_transfers.push(next_transfer);
                    next_transfer += 1;
                }
                if rng.random_bool(0.5) && live_transfers.len() > 100 {
                    let i = rng.random_range(0..live_transfers.len());
                    let id = live_transfers.swap_remove(i);
                    ops.push(Op::Delete { table: transfer.id, key: vec![Value::Int(id)] });
                }
                let n = ops.len() as u64;
                let on_account = ops
                    .iter()
                    .filter(|op| matches!(op, Op::Insert { table, .. } | Op::Update { table, .. } | Op::Delete { table, .. } if *table == account.id))
                    .count() as u64;
                let ts = engine.apply(ops)?;
                // The generator is the source: its transaction was produced at `fresh`.
                engine.note_source_commit(ts, fresh);
                *newest = Some((ts, fresh, on_account, n - on_account));
                let done = rows_done.fetch_add(n, Ordering::Relaxed) + n;
                let second = start.elapsed().as_secs() as usize;
                if throughput.len() <= second {
                    throughput.resize(second + 1, 0);
                }
                throughput[second] += n;
                // Pace: sleep while ahead of the target rate.
                let due = Duration::from_secs_f64(done as f64 / o.rate.max(1) as f64);
                if let Some(ahead) = due.checked_sub(start.elapsed())
                    && ahead > Duration::from_millis(1)
                {
                    std::thread::sleep(ahead);
                }
                if !o.quiet && last_report.elapsed() >= Duration::from_secs(1) {
                    last_report = Instant::now();
                    let fresh =
                        samples.lock().unwrap_or_else(|p| p.into_inner()).last().map_or(0.0, |q| q.freshness_ms);
                    eprint!(
                        "\r{:>4.0} s  {:>10} rows  {:>9.0} rows/s  HWM {:>8}  freshness {:>7.2} ms   ",
                        start.elapsed().as_secs_f64(),
                        done,
                        done as f64 / start.elapsed().as_secs_f64(),
                        engine.clock().hwm(),
                        fresh
                    );
                }
            }
            Ok(())
        })();
        stop.store(true, Ordering::Release);
        result
    })?;
    if !o.quiet {
        eprintln!();
    }
    if let Some(f) = failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(f.into());
    }
    let elapsed = start.elapsed().as_secs_f64();
    engine.flush()?;
    engine.combine()?;
    engine.gc()?;
    // A checkpoint makes the lake durable: `fovea sql` can query it afterwards.
    let manifest = engine.write_checkpoint()?;
    let history: Vec<_> = newest
        .map(|(ts, fresh, accounts, transfers)| fovea_core::catalog::HistoryEntry {
            ts,
            source_txid: format!("demo@{}", ts.get()),
            commit_us: Some(fresh),
            tables: vec![(account.name.clone(), accounts), (transfer.name.clone(), transfers)],
            rows: accounts + transfers,
            replayed_us: now_micros(),
        })
        .into_iter()
        .collect();
    let record = fovea_core::catalog::CheckpointRecord {
        manifest,
        input: "fovea demo".into(),
        position: Default::default(),
        source_state: None,
    };
    lake.catalog.commit_checkpoint(lake.engine.clock().epoch(), record.clone(), &history, &[])?;
    let manifest = record.manifest;
    lake.engine.checkpoint_committed(&manifest);

    let rows = rows_done.load(Ordering::Relaxed);
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|p| p.into_inner()));
    let fresh: Latencies = samples.iter().map(|q| q.freshness_ms).collect();
    let live: Latencies = samples.iter().map(|q| q.latency_ms).collect();
    let off: Latencies = off_latency.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
    let mem = engine.memory();
    let lake_bytes = dir_bytes(&o.lake)?;
    let mut lake_sizes = std::mem::take(&mut *lake_sizes.lock().unwrap_or_else(|p| p.into_inner()));
    lake_sizes.push((elapsed, lake_bytes));
    let plot = o.lake.join("demo.svg");
    std::fs::write(&plot, svg_plot(&samples, &throughput, &lake_sizes, elapsed)?)?;
    let windows = windows(&samples, &throughput, &lake_sizes, elapsed);
    Ok(DemoReport {
        rows,
        seconds: elapsed,
        queries: samples.len(),
        freshness_p50_ms: fresh.quantile_ms(0.5),
        freshness_p99_ms: fresh.quantile_ms(0.99),
        query_p50_ms: live.quantile_ms(0.5),
        query_off_p50_ms: off.quantile_ms(0.5),
        visibility_bits_per_tuple: mem.visibility_bits_per_tuple(),
        tuples: mem.tuples,
        index_bytes: mem.index_bytes,
        buffer_bytes: mem.buffer_bytes,
        lake_bytes,
        plot,
        windows,
    })
}

fn account_row(k: i64, balance: i128, fresh: i64) -> Vec<Value> {
    vec![Value::Int(k), Value::Utf8(format!("account-{k:05}")), Value::Decimal(balance), Value::Int(fresh)]
}

/// `SELECT sum(balance), max(fresh_ts) FROM hybench.account` at a fresh
/// snapshot, through SQL.
fn sum_and_freshest(
    engine: &Arc<Engine>,
    runtime: &tokio::runtime::Runtime,
    mode: VisibilityMode,
) -> DemoResult<(i128, i64)> {
    let snap = engine.snapshot();
    let ctx = fovea_sql::session_with(engine, &snap, mode)?;
    let batches = runtime.block_on(async {
        ctx.sql("SELECT sum(balance), max(fresh_ts) FROM hybench.account").await?.collect().await
    })?;
    let (mut total, mut freshest) = (0i128, 0i64);
    for batch in batches {
        if let Some(b) = batch.column(0).as_any().downcast_ref::<Decimal128Array>() {
            total += b.iter().flatten().sum::<i128>();
        }
        if let Some(f) = batch.column(1).as_any().downcast_ref::<TimestampMicrosecondArray>() {
            freshest = freshest.max(arrow::compute::max(f).unwrap_or(0));
        }
    }
    Ok((total, freshest))
}

/// The run over time as an SVG of four panels sharing the time axis:
/// freshness and query latency of every query, replay throughput per
/// second, and the lake's size.
fn svg_plot(samples: &[QuerySample], throughput: &[u64], lake: &[LakeSample], seconds: f64) -> DemoResult<String> {
    use plotters::prelude::*;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 1000)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(&format!("fovea demo: {seconds:.0} s"), ("sans-serif", 20))?;
        let panels = root.split_evenly((4, 1));
        // (caption, y axis, colour, points)
        type Panel<'a> = (&'a str, &'a str, RGBColor, Vec<(f64, f64)>);
        let series: [Panel; 4] = [
            (
                "freshness (query start − newest visible change)",
                "freshness (ms)",
                RGBColor(0x1f, 0x77, 0xb4),
                samples.iter().map(|q| (q.at_s, q.freshness_ms)).collect(),
            ),
            (
                "query latency (SELECT sum(balance), max(fresh_ts))",
                "latency (ms)",
                RGBColor(0xff, 0x7f, 0x0e),
                samples.iter().map(|q| (q.at_s, q.latency_ms)).collect(),
            ),
            (
                "replay throughput",
                "rows/s",
                RGBColor(0x2c, 0xa0, 0x2c),
                throughput.iter().enumerate().map(|(i, r)| (i as f64 + 0.5, *r as f64)).collect(),
            ),
            ("lake size", "MB", RGBColor(0x94, 0x67, 0xbd), lake.iter().map(|(t, b)| (*t, *b as f64 / 1e6)).collect()),
        ];
        for (area, (caption, unit, color, points)) in panels.iter().zip(series) {
            let top = points.iter().map(|(_, v)| *v).fold(0.0, f64::max).max(1e-3) * 1.05;
            let mut chart = ChartBuilder::on(area)
                .caption(caption, ("sans-serif", 15))
                .margin(8)
                .x_label_area_size(35)
                .y_label_area_size(70)
                .build_cartesian_2d(0.0..seconds.max(1.0), 0.0..top)?;
            chart
                .configure_mesh()
                .x_desc("time since the start of the replay (s)")
                .y_desc(unit)
                .light_line_style(WHITE)
                .draw()?;
            chart.draw_series(LineSeries::new(points, &color))?;
        }
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_split_the_run_and_keep_the_last_partial_one() {
        let q = |at_s, ms| QuerySample { at_s, freshness_ms: ms, latency_ms: ms * 2.0 };
        let samples = [q(1.0, 1.0), q(9.9, 3.0), q(10.0, 5.0), q(24.9, 7.0), q(25.0, 9.0)];
        // 25 s: 100 rows in every second.
        let throughput = vec![100; 25];
        let lake = [(5.0, 10), (12.0, 20), (19.0, 30), (25.0, 40)];
        let w = windows(&samples, &throughput, &lake, 25.0);
        assert_eq!(w.iter().map(|w| w.start_s).collect::<Vec<_>>(), [0.0, 10.0, 20.0]);
        assert_eq!(w.iter().map(|w| w.rows_per_s).collect::<Vec<_>>(), [100.0, 100.0, 100.0]);
        assert_eq!(w.iter().map(|w| w.lake_bytes).collect::<Vec<_>>(), [10, 30, 40]);
        // Quantiles are exact to three significant digits.
        let near = |got: f64, want: f64| assert!((got - want).abs() <= want * 1e-3, "{got} vs {want}");
        near(w[0].freshness_p50_ms, 1.0);
        near(w[0].freshness_p99_ms, 3.0);
        near(w[1].query_p50_ms, 10.0);
        // The query ending at the last instant belongs to the last window.
        near(w[2].freshness_p99_ms, 9.0);
        assert!(windows(&[], &[], &[], 3.0)[0].freshness_p50_ms.is_nan());
    }
}
