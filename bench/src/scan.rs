//! `fovea-bench scan`: what a reader costs on a replayed lake.
//!
//! - Reader start-up: a fresh `fovea` process answers `count(*)` of the
//!   lake's smallest table and `SELECT * … LIMIT 10` of its largest, once
//!   reading the lake as of its checkpoint without the engine (what
//!   `fovea sql --lake` does) and once restoring the whole engine (index,
//!   tiles, every footer: the reader before), in the same run — wall time
//!   and the process's peak RSS, median of several runs.
//! - Full scan: rows/s of the streaming scan of the largest table (with
//!   visibility, and with it off) beside DataFusion reading the same
//!   Parquet objects directly (no visibility), same process, same run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use datafusion::prelude::{ParquetReadOptions, SessionContext};
use fovea_core::location::{LakeBackends, OpenMode};
use fovea_core::split::SplitData;
use fovea_core::{EngineConfig, ScanOptions, SnapshotTables, VisibilityMode};
use futures::StreamExt;
use serde_json::json;

use fovea_replayer::replay::CliResult;

/// How a probe process opens the lake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProbeMode {
    /// As of its checkpoint, opening only what the query reads.
    Reader,
    /// Restoring the whole engine from the checkpoint.
    Engine,
}

/// `fovea-bench scan`'s settings.
pub struct ScanBench {
    /// Transactions of the generated HyBench stream.
    pub txns: u64,
    /// Runs per start-up measurement.
    pub runs: usize,
    /// One JSON object instead of text.
    pub json: bool,
}

/// A probe: opens the lake in `mode`, runs `sql`, prints
/// `{"rows": N, "peak_rss_bytes": B}`.
pub fn probe(mode: ProbeMode, lake: &Path, sql: &str) -> CliResult<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let batches = match mode {
        ProbeMode::Reader => {
            let opened = fovea_replayer::lakes::LakeArgs::local(lake).open_read()?;
            runtime.block_on(fovea_sql::query_on(opened.reader as Arc<dyn SnapshotTables>, sql))?
        }
        ProbeMode::Engine => {
            let opened = fovea_core::location::open(
                LakeBackends::local(lake)?,
                EngineConfig::default(),
                OpenMode::Read,
                fovea_core::lease::DEFAULT_LEASE_TTL,
            )?;
            let snapshot = opened.engine.snapshot();
            runtime.block_on(fovea_sql::query(&opened.engine, &snapshot, sql))?
        }
    };
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    println!("{}", json!({"rows": rows, "peak_rss_bytes": fovea_replayer::serve::metrics::peak_rss_bytes()}));
    Ok(())
}

/// Median wall time (s) and peak RSS (MB) of `runs` probe processes.
fn start_up(lake: &Path, mode: ProbeMode, sql: &str, runs: usize) -> CliResult<(f64, f64)> {
    let exe = std::env::current_exe()?;
    let mode_name = match mode {
        ProbeMode::Reader => "reader",
        ProbeMode::Engine => "engine",
    };
    let mut times = Vec::with_capacity(runs);
    let mut rss = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let out = Command::new(&exe).args(["scan-probe", "--mode", mode_name, "--lake"]).arg(lake).arg(sql).output()?;
        times.push(started.elapsed().as_secs_f64());
        if !out.status.success() {
            return Err(format!("probe {mode_name} {sql:?} failed: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        rss.push(answer["peak_rss_bytes"].as_f64().unwrap_or(0.0) / 1e6);
    }
    Ok((median(&mut times), median(&mut rss)))
}

/// The median of `v` (sorted in place).
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Rows and seconds of one streamed `SELECT *`.
fn full_scan(ctx: &SessionContext, runtime: &tokio::runtime::Runtime, table: &str) -> CliResult<(usize, f64)> {
    let started = Instant::now();
    let rows = runtime.block_on(async {
        let mut stream = ctx.sql(&format!("SELECT * FROM {table}")).await?.execute_stream().await?;
        let mut n = 0;
        while let Some(b) = stream.next().await {
            n += b?.num_rows();
        }
        Ok::<_, datafusion::error::DataFusionError>(n)
    })?;
    Ok((rows, started.elapsed().as_secs_f64()))
}

/// Scans of each session in turn (one warm-up round, then `rounds`
/// measured ones, interleaved so drift hits all alike): rows and median
/// seconds per session.
fn full_scans(
    sessions: &[(&SessionContext, &str)],
    runtime: &tokio::runtime::Runtime,
    rounds: usize,
) -> CliResult<Vec<(usize, f64)>> {
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); sessions.len()];
    let mut rows = vec![0; sessions.len()];
    for round in 0..=rounds {
        for (i, (ctx, table)) in sessions.iter().enumerate() {
            let (n, s) = full_scan(ctx, runtime, table)?;
            rows[i] = n;
            if round > 0 {
                times[i].push(s);
            }
        }
    }
    Ok(rows.into_iter().zip(times.iter_mut().map(|t| median(t))).collect())
}

/// `fovea-bench scan`.
pub fn run(b: &ScanBench) -> CliResult<()> {
    let dir = std::env::temp_dir().join(format!("fovea-bench-scan-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let input = dir.join("stream.jsonl");
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&input)?);
        fovea_testkit::workload::generate(fovea_testkit::workload::Workload::Hybench, b.txns, 7, &mut w)?;
        std::io::Write::flush(&mut w)?;
    }
    let lake = dir.join("lake");
    let replayed = crate::replay::replay_into(
        fovea_replayer::lakes::LakeArgs::local(&lake),
        &input,
        !b.json,
        crate::replay::BENCH_CHECKPOINT_TXNS,
        Default::default(),
        None,
    )?;
    std::fs::remove_file(&input)?;

    // The smallest and the largest table by stored rows.
    let opened = fovea_replayer::lakes::LakeArgs::local(&lake).open_read()?;
    let reader = Arc::clone(&opened.reader);
    let mut sizes = Vec::new();
    for def in reader.tables() {
        sizes.push((reader.scan(&def.name, ScanOptions::default())?.stored_rows(), def.name.clone()));
    }
    sizes.sort();
    let (Some((small_rows, small)), Some((large_rows, large))) = (sizes.first().cloned(), sizes.last().cloned()) else {
        return Err("the replayed lake has no tables".into());
    };
    let count = format!("SELECT count(*) FROM {small}");
    let limit = format!("SELECT * FROM {large} LIMIT 10");
    let mut start = serde_json::Map::new();
    for (name, sql) in [("count_small", &count), ("limit_large", &limit)] {
        let (reader_s, reader_mb) = start_up(&lake, ProbeMode::Reader, sql, b.runs)?;
        let (engine_s, engine_mb) = start_up(&lake, ProbeMode::Engine, sql, b.runs)?;
        start.insert(
            name.into(),
            json!({
                "sql": sql,
                "reader_s": round3(reader_s), "reader_peak_rss_mb": reader_mb.round(),
                "engine_s": round3(engine_s), "engine_peak_rss_mb": engine_mb.round(),
                "time_ratio": round3(reader_s / engine_s), "rss_ratio": round3(reader_mb / engine_mb),
            }),
        );
    }

    // Full scans of the largest table, same process.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let enforced = fovea_sql::session_on(Arc::clone(&reader) as Arc<dyn SnapshotTables>)?;
    let off = fovea_sql::session_on_with(Arc::clone(&reader) as Arc<dyn SnapshotTables>, VisibilityMode::Off)?;
    let mut paths: Vec<String> = reader
        .scan(&large, ScanOptions::default())?
        .tasks()?
        .into_iter()
        .filter_map(|t| match t.data {
            SplitData::RowGroup { path, .. } | SplitData::Block { path } => Some(path),
            SplitData::Rows { .. } => None,
        })
        .collect();
    paths.sort();
    paths.dedup();
    let raw = SessionContext::new();
    let files: Vec<String> = paths.iter().map(|p| absolute(&lake, p)).collect();
    let raw_frame = runtime.block_on(raw.read_parquet(files, ParquetReadOptions::default()))?;
    raw.register_table("raw", raw_frame.into_view())?;
    let measured = full_scans(&[(&enforced, &large), (&off, &large), (&raw, "raw")], &runtime, 5)?;
    let [(visible, fovea_s), (stored_off, off_s), (stored_raw, raw_s)] = measured[..] else {
        return Err("three scans measured".into());
    };
    if stored_raw != stored_off {
        return Err(format!(
            "DataFusion read {stored_raw} rows of {large}'s files, the scan without visibility {stored_off}"
        )
        .into());
    }
    let per_s = |s: f64| (large_rows as f64 / s).round();
    let result = json!({
        "txns": replayed.txns,
        "rows_replayed": replayed.rows,
        "small_table": {"name": small, "stored_rows": small_rows},
        "large_table": {"name": large, "stored_rows": large_rows, "visible_rows": visible},
        "start_up": start,
        "full_scan": {
            "fovea_rows_per_s": per_s(fovea_s),
            "fovea_visibility_off_rows_per_s": per_s(off_s),
            "datafusion_parquet_rows_per_s": per_s(raw_s),
            "fovea_over_datafusion": round3(raw_s / fovea_s),
            "visibility_off_over_datafusion": round3(raw_s / off_s),
        },
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
    });
    drop(opened);
    std::fs::remove_dir_all(&dir)?;
    if b.json {
        println!("{result}");
        return Ok(());
    }
    println!("lake: {} rows replayed in {} transactions", replayed.rows, replayed.txns);
    for (name, s) in &start {
        println!(
            "{name} ({}): reader {:.3} s / {} MB peak RSS; restoring the engine {:.3} s / {} MB (ratios {} and {})",
            s["sql"].as_str().unwrap_or(""),
            s["reader_s"].as_f64().unwrap_or(0.0),
            s["reader_peak_rss_mb"],
            s["engine_s"].as_f64().unwrap_or(0.0),
            s["engine_peak_rss_mb"],
            s["time_ratio"],
            s["rss_ratio"]
        );
    }
    let f = &result["full_scan"];
    println!(
        "full scan of {large} ({large_rows} stored rows): fovea {} rows/s, visibility off {} rows/s, DataFusion on the Parquet files {} rows/s ({}× and {}× of DataFusion)",
        f["fovea_rows_per_s"],
        f["fovea_visibility_off_rows_per_s"],
        f["datafusion_parquet_rows_per_s"],
        f["fovea_over_datafusion"],
        f["visibility_off_over_datafusion"]
    );
    Ok(())
}

/// `x` rounded to three decimals (for reports).
pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A lake object's path on the local file system.
fn absolute(lake: &Path, object: &str) -> String {
    let p: PathBuf = lake.join(object);
    p.canonicalize().unwrap_or(p).display().to_string()
}
