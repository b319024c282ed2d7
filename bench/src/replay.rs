//! `fovea-bench replay|freshness|query`: end-to-end replay throughput
//! (local and against a remote lake), freshness under a query loop, the
//! query cost of live data and the replay cost of queries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::{DataType, Field, Schema};
use fovea_core::{Engine, EngineConfig, Op, ScanOptions, Value};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde_json::json;

use crate::scan::median;

/// Where `fovea-bench replay` replays besides the local baseline.
pub struct RemoteLake {
    /// `s3://BUCKET/PREFIX` (or a directory) of the lake to compare.
    pub lake: String,
    /// `dynamodb://TABLE` of its state.
    pub state: Option<String>,
}

/// Transactions between two checkpoints of the replay benchmarks.
pub(crate) const BENCH_CHECKPOINT_TXNS: u64 = 50_000;

/// One measured replay.
pub(crate) struct ReplayRun {
    pub(crate) rows: u64,
    pub(crate) txns: u64,
    pub(crate) seconds: f64,
    pub(crate) checkpoints: u64,
    pub(crate) store: fovea_core::metered::StoreCounts,
    pub(crate) dynamo_writes: Option<u64>,
}

pub(crate) fn replay_into(
    lake: fovea_replayer::lakes::LakeArgs,
    input: &std::path::Path,
    progress: bool,
    checkpoint_txns: u64,
    iceberg: fovea_replayer::lakes::IcebergArgs,
    shards: Option<usize>,
) -> fovea_replayer::replay::CliResult<ReplayRun> {
    let meter = Arc::new(fovea_core::metered::StoreMeter::default());
    let (backends, dynamo) = lake.backends_metered(Some(Arc::clone(&meter)))?;
    let args = fovea_replayer::replay::ReplayArgs {
        lake,
        functions: Default::default(),
        iceberg,
        backends: Some(backends),
        input: input.display().to_string(),
        format: fovea_core::cdc::InputFormat::Auto,
        schema_file: None,
        checkpoint_txns,
        shards,
        blocks: None,
        lease: fovea_core::lease::DEFAULT_LEASE_TTL,
        progress,
        history: Default::default(),
    };
    let summary = fovea_replayer::replay::replay(&args)?;
    Ok(ReplayRun {
        rows: summary.stats.rows,
        txns: summary.stats.applied,
        seconds: summary.elapsed.as_secs_f64(),
        checkpoints: summary.stats.checkpoints,
        store: meter.counts(),
        dynamo_writes: dynamo.map(|d| d.writes()),
    })
}

/// Seconds one thread takes to decode `input` as the replay's decoder
/// threads do: against the tables of the lake in `dir` (the replay's,
/// so each table exists), rows straight into typed values, a batch of
/// lines sharing one buffer. Records are dropped as they are decoded.
fn typed_decode_seconds(dir: &std::path::Path, input: &std::path::Path) -> fovea_replayer::replay::CliResult<f64> {
    use fovea_core::cdc::{InputFormat, LineBuffer, SharedLine, decode_owned_line, source::LineSource, typed};
    let lake = fovea_core::location::open_lake(dir, Default::default(), fovea_core::location::OpenMode::Read)?;
    let engine: Arc<dyn typed::CurrentTables> = lake.engine.clone();
    let mut tables = typed::TypedTables::new(engine);
    let mut source = LineSource::open(input, Default::default())?;
    let mut elapsed = Duration::ZERO;
    loop {
        let mut text = String::new();
        let mut lines = Vec::new();
        while lines.len() < fovea_core::cdc::file::BATCH_LINES {
            match source.append_line(&mut text)? {
                Some(line) => lines.push(line),
                None => break,
            }
        }
        if lines.is_empty() {
            return Ok(elapsed.as_secs_f64());
        }
        let text = Arc::new(LineBuffer::from(text));
        let started = Instant::now();
        for (pos, range) in lines {
            let line = SharedLine::new(Arc::clone(&text), range).ok_or("a line is no range of its batch")?;
            decode_owned_line(line, pos, InputFormat::Auto, Some(&mut tables))?;
        }
        elapsed += started.elapsed();
    }
}

/// Object store requests of a replay per 1,000 rows replayed.
fn requests_per_1000(r: &ReplayRun) -> f64 {
    (r.store.requests() as f64 * 1000.0 / r.rows.max(1) as f64 * 100.0).round() / 100.0
}

/// `fovea-bench replay`: generate, then replay into a fresh local lake
/// and, with `remote`, into a fresh lake there too (same stream, same run).
pub fn replay(
    workload: fovea_testkit::workload::Workload,
    txns: u64,
    runs: usize,
    remote: Option<RemoteLake>,
    json_out: bool,
) -> fovea_replayer::replay::CliResult<()> {
    let dir = std::env::temp_dir().join(format!("fovea-bench-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let input = dir.join("stream.jsonl");
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&input)?);
        fovea_testkit::workload::generate(workload, txns, 7, &mut w)?;
        std::io::Write::flush(&mut w)?;
    }
    let bytes = std::fs::metadata(&input)?.len();
    // Decoding alone, to say where the time goes.
    let started = Instant::now();
    let mut source = fovea_core::cdc::source::LineSource::open(&input, Default::default())?;
    let mut line = String::new();
    let mut records = 0u64;
    while let Some(pos) = source.next_line(&mut line)? {
        fovea_core::cdc::decode_line(&line, pos, fovea_core::cdc::InputFormat::Auto)?;
        records += 1;
    }
    let decode_s = started.elapsed().as_secs_f64();
    // Each run into a fresh lake; the last one's is kept for the typed
    // decoding below (it needs the tables).
    let mut replays: Vec<(ReplayRun, Option<f64>)> = Vec::with_capacity(runs);
    for run in 0..runs {
        let lake = dir.join("lake");
        if run > 0 {
            std::fs::remove_dir_all(&lake)?;
        }
        let cpu_before = fovea_replayer::serve::metrics::cpu_seconds();
        let replayed = replay_into(
            fovea_replayer::lakes::LakeArgs::local(&lake),
            &input,
            !json_out,
            BENCH_CHECKPOINT_TXNS,
            Default::default(),
            None,
        )?;
        // CPU of every thread of the process (decoders, shards, flush, checkpoints) per row replayed.
        let cpu_us_per_row = cpu_before
            .zip(fovea_replayer::serve::metrics::cpu_seconds())
            .map(|(before, after)| ((after - before) * 1e6 / replayed.rows.max(1) as f64 * 100.0).round() / 100.0);
        if let Some((first, _)) = replays.first()
            && first.rows != replayed.rows
        {
            return Err(format!("replay {} applied {} rows, the first {}", run + 1, replayed.rows, first.rows).into());
        }
        replays.push((replayed, cpu_us_per_row));
    }
    let rows_per_s_runs: Vec<f64> = replays.iter().map(|(r, _)| (r.rows as f64 / r.seconds).round()).collect();
    let cpu_runs: Vec<f64> = replays.iter().filter_map(|(_, c)| *c).collect();
    let cpu_us_per_row = (!cpu_runs.is_empty()).then(|| median(&mut cpu_runs.clone()));
    // The run of the median rate stands for the others below.
    let at_median = {
        let mut order: Vec<usize> = (0..replays.len()).collect();
        order.sort_by(|&a, &b| rows_per_s_runs[a].total_cmp(&rows_per_s_runs[b]));
        order[order.len() / 2]
    };
    let local = replays.swap_remove(at_median).0;
    let rows_per_s = local.rows as f64 / local.seconds;
    let typed_decode_us = typed_decode_seconds(&dir.join("lake"), &input)? * 1e6 / records.max(1) as f64;
    let mut result = json!({
        "workload": format!("{workload:?}").to_lowercase(),
        "txns": local.txns,
        "rows": local.rows,
        "input_bytes": bytes,
        "seconds": (local.seconds * 1000.0).round() / 1000.0,
        "rows_per_s": rows_per_s.round(),
        "txns_per_s": (local.txns as f64 / local.seconds).round(),
        "decode_share": ((decode_s / local.seconds) * 1000.0).round() / 1000.0,
        "cpu_us_per_row": cpu_us_per_row,
        "rows_per_s_runs": rows_per_s_runs,
        "cpu_us_per_row_runs": cpu_runs,
        "typed_decode_us_per_record": (typed_decode_us * 1000.0).round() / 1000.0,
        "records": records,
        "store_requests_per_1000_rows": requests_per_1000(&local),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
    });
    if let Some(remote) = remote {
        // A fresh lake and state table for this run.
        let run = std::process::id();
        let lake = fovea_replayer::lakes::LakeArgs {
            lake: format!("{}/bench-{run}", remote.lake.trim_end_matches('/')),
            state: remote.state.map(|s| format!("{s}-bench-{run}")),
            no_create: false,
        };
        let name = lake.lake.clone();
        let r = replay_into(lake, &input, !json_out, BENCH_CHECKPOINT_TXNS, Default::default(), None)?;
        let remote_rows_per_s = r.rows as f64 / r.seconds;
        let per_1000 = |n: u64| (n as f64 * 1000.0 / r.rows.max(1) as f64 * 100.0).round() / 100.0;
        let local_requests = requests_per_1000(&local);
        result["remote"] = json!({
            "lake": name,
            "rows_per_s": remote_rows_per_s.round(),
            "over_local": ((remote_rows_per_s / rows_per_s) * 1000.0).round() / 1000.0,
            "store_requests_per_1000_rows": per_1000(r.store.requests()),
            // The same replay's object requests against the local lake's:
            // what the remote lake (its state, identity, payloads) adds.
            "store_requests_over_local": (requests_per_1000(&r) / local_requests.max(1e-9) * 1000.0).round() / 1000.0,
            "store_puts_per_1000_rows": per_1000(r.store.puts),
            "store_gets_per_1000_rows": per_1000(r.store.gets),
            "store_bytes_written": r.store.bytes_written,
            "dynamodb_writes": r.dynamo_writes,
            "dynamodb_writes_per_s": r.dynamo_writes.map(|w| (w as f64 / r.seconds * 100.0).round() / 100.0),
        });
        if r.rows != local.rows {
            return Err(format!("the remote replay applied {} rows, the local one {}", r.rows, local.rows).into());
        }
    }
    std::fs::remove_dir_all(&dir)?;
    if json_out {
        println!("{result}");
    } else {
        println!(
            "replayed {} rows in {} transactions in {:.2} s: {rows_per_s:.0} rows/s (decoding alone takes {:.0}% of that time; typed decoding on one thread {:.2} µs a record)",
            local.rows,
            local.txns,
            local.seconds,
            decode_s / local.seconds * 100.0,
            typed_decode_us
        );
        if let Some(r) = result.get("remote") {
            println!(
                "into {}: {} rows/s ({}× local), {} store requests per 1000 rows ({}× local's {}), {} DynamoDB writes/s",
                r["lake"].as_str().unwrap_or(""),
                r["rows_per_s"],
                r["over_local"],
                r["store_requests_per_1000_rows"],
                r["store_requests_over_local"],
                result["store_requests_per_1000_rows"],
                r["dynamodb_writes_per_s"]
            );
        }
    }
    Ok(())
}

/// `fovea-bench freshness`: the demo's replay and query loop, measured.
pub fn freshness(rate: u64, seconds: u64, json_out: bool) -> fovea_replayer::replay::CliResult<()> {
    let dir = std::env::temp_dir().join(format!("fovea-bench-freshness-{}", std::process::id()));
    let options = fovea_replayer::demo::DemoOptions { lake: dir.clone(), seconds, rate, quiet: json_out, json: false };
    let r = fovea_replayer::demo::measure(&options)?;
    std::fs::remove_dir_all(&dir)?;
    let result = json!({
        "rate": rate,
        "seconds": (r.seconds * 100.0).round() / 100.0,
        "rows_per_s": (r.rows as f64 / r.seconds).round(),
        "freshness_p50_ms": (r.freshness_p50_ms * 1000.0).round() / 1000.0,
        "freshness_p99_ms": (r.freshness_p99_ms * 1000.0).round() / 1000.0,
        "queries": r.queries,
        "query_p50_ms": (r.query_p50_ms * 1000.0).round() / 1000.0,
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
    });
    if json_out {
        println!("{result}");
    } else {
        println!(
            "{:.0} rows/s replayed (target {rate}); freshness P50 {:.2} ms, P99 {:.2} ms over {} queries",
            r.rows as f64 / r.seconds,
            r.freshness_p50_ms,
            r.freshness_p99_ms,
            r.queries
        );
    }
    Ok(())
}

/// `fovea-bench query`: the price of live data for queries, and of queries
/// for replay.
pub fn query(rows: usize, rounds: usize, json_out: bool) -> fovea_replayer::replay::CliResult<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // A live table with 1% of its rows changed by replay, and a static copy
    // of exactly its visible rows.
    let engine = Engine::in_memory(EngineConfig::default())?;
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("a", DataType::Int64, false),
        Field::new("b", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
    ]));
    let live = engine.create_table("bench.live", Arc::clone(&schema), vec![0])?;
    let row = |k: i64, v: i64| vec![Value::Int(k), Value::Int(v), Value::Int(k % 100), Value::Utf8(format!("r{k:08}"))];
    for chunk in (0..rows as i64).collect::<Vec<_>>().chunks(10_000) {
        engine.apply(chunk.iter().map(|&k| Op::Insert { table: live.id, row: row(k, k) }).collect())?;
    }
    let mut rng = SmallRng::seed_from_u64(9);
    for _ in 0..(rows / 100).div_ceil(1000) {
        let ops = (0..1000)
            .map(|_| {
                let k = rng.random_range(0..rows as i64);
                Op::Update { table: live.id, key: vec![Value::Int(k)], row: row(k, -k) }
            })
            .collect();
        engine.apply(ops)?;
    }
    let stat = engine.create_table("bench.static", schema, vec![0])?;
    let visible = engine.scan(&engine.snapshot(), "bench.live", ScanOptions::default())?.collect_batches()?;
    for b in &visible {
        let ops = fovea_core::schema::rows_from_batch(b)?
            .into_iter()
            .map(|r| Op::Insert { table: stat.id, row: r })
            .collect();
        engine.apply(ops)?;
    }
    engine.flush()?;
    engine.combine()?;
    engine.gc()?;
    let time = |table: &str| -> fovea_replayer::replay::CliResult<f64> {
        let sql = format!("SELECT b, count(*), sum(a), max(name) FROM {table} WHERE b < 50 GROUP BY b");
        let snap = engine.snapshot();
        let start = Instant::now();
        runtime.block_on(fovea_sql::query(&engine, &snap, &sql))?;
        Ok(start.elapsed().as_secs_f64())
    };
    // Pairs back to back, the first of a pair alternating, and the median of
    // the pairs' ratios: the machine drifts between pairs, hardly within one.
    time("bench.live")?;
    time("bench.static")?;
    let (mut live, mut stat, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for pair in 0..9 {
        let (l, s) = if pair % 2 == 0 {
            let l = time("bench.live")?;
            (l, time("bench.static")?)
        } else {
            let s = time("bench.static")?;
            (time("bench.live")?, s)
        };
        live.push(l);
        stat.push(s);
        ratios.push(l / s);
    }
    let (live_s, static_s, live_over_static) = (median(&mut live), median(&mut stat), median(&mut ratios));

    let replay = replay_beside_queries(rounds)?;
    let ratio = |r: f64| (r * 1000.0).round() / 1000.0;
    let result = json!({
        "rows": rows,
        "live_query_ms": (live_s * 1e4).round() / 10.0,
        "static_query_ms": (static_s * 1e4).round() / 10.0,
        "live_over_static_ratio": ratio(live_over_static),
        "replay_rows_per_s_without_queries": replay.rows_per_s[0].round(),
        "replay_rows_per_s_with_1qps": replay.rows_per_s[1].round(),
        "replay_rows_per_s_with_10qps": replay.rows_per_s[2].round(),
        "replay_rows_per_s_with_queries": replay.rows_per_s[3].round(),
        "replay_with_1qps_over_without": ratio(replay.over_without[1]),
        "replay_with_10qps_over_without": ratio(replay.over_without[2]),
        "replay_with_queries_over_without": ratio(replay.over_without[3]),
        "replay_rounds": rounds,
        "replay_window_s": QUERY_LOAD_WINDOW.as_secs_f64(),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
    });
    if json_out {
        println!("{result}");
    } else {
        println!(
            "query on live data / static copy: {:.3} ({:.1} / {:.1} ms)\nreplay with / without a query loop: 1 query/s {:.3}, 10 queries/s {:.3}, back to back {:.3} ({:.0} rows/s alone)",
            ratio(live_over_static),
            live_s * 1e3,
            static_s * 1e3,
            ratio(replay.over_without[1]),
            ratio(replay.over_without[2]),
            ratio(replay.over_without[3]),
            replay.rows_per_s[0]
        );
    }
    Ok(())
}

/// The query loads replay is measured beside, in the order of
/// [`ReplayBesideQueries`]' arrays: none, paced at 1 and at 10 queries/s,
/// and back to back.
const QUERY_LOADS: [QueryLoad; 4] =
    [QueryLoad::Off, QueryLoad::Paced(1.0), QueryLoad::Paced(10.0), QueryLoad::BackToBack];

/// How long replay runs under one query load before the next one.
const QUERY_LOAD_WINDOW: Duration = Duration::from_secs(2);

/// A query loop's pace.
#[derive(Clone, Copy)]
enum QueryLoad {
    /// No queries.
    Off,
    /// This many queries a second, each at its slot from the window's start.
    Paced(f64),
    /// One query after another.
    BackToBack,
}

/// Replay rows/s under each of [`QUERY_LOADS`].
struct ReplayBesideQueries {
    /// The median rows/s of each load's windows.
    rows_per_s: [f64; 4],
    /// The median over rounds of each load's rows/s over that round's
    /// replay without queries.
    over_without: [f64; 4],
}

/// Replays 10-row update transactions on one engine without a break while a
/// query thread switches between [`QUERY_LOADS`], a window of
/// [`QUERY_LOAD_WINDOW`] each, `rounds` times over with the order rotated.
///
/// Each load is compared with the window without queries of its own round:
/// the machine's speed drifts over tens of seconds (10–30% on a shared VM)
/// far more than within one round, and one engine replaying throughout keeps
/// its state the same for every load. A window starts only once the query
/// thread has taken up its load, so a query of the last window does not
/// spill into it.
fn replay_beside_queries(rounds: usize) -> fovea_replayer::replay::CliResult<ReplayBesideQueries> {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    let engine = Engine::in_memory(EngineConfig::default())?;
    let t = engine.create_table(
        "hy.account",
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("balance", DataType::Int64, false),
        ])),
        vec![0],
    )?;
    engine.apply((0..10_000).map(|k| Op::Insert { table: t.id, row: vec![Value::Int(k), Value::Int(0)] }).collect())?;
    let load = AtomicUsize::new(0);
    let window = AtomicU64::new(0);
    let taken_up = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let mut rates = vec![[0.0f64; 4]; rounds];
    std::thread::scope(|s| -> fovea_replayer::replay::CliResult<()> {
        let queries = s.spawn(|| -> fovea_replayer::replay::CliResult<()> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let (mut current, mut began, mut sent) = (0u64, Instant::now(), 0u32);
            // Relaxed: a stop flag; nothing is published through it.
            while !stop.load(Ordering::Relaxed) {
                // Acquire pairs with the Release that starts a window, so
                // the load stored before it is the one read here.
                let w = window.load(Ordering::Acquire);
                if w != current {
                    (current, began, sent) = (w, Instant::now(), 0);
                    // Release: the main thread starts timing only after
                    // this, when no query of the last load is in flight.
                    taken_up.store(w, Ordering::Release);
                }
                match QUERY_LOADS[load.load(Ordering::Relaxed)] {
                    QueryLoad::Off => {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    QueryLoad::Paced(per_s) => {
                        let due = Duration::from_secs_f64(f64::from(sent) / per_s);
                        if let Some(wait) = due.checked_sub(began.elapsed()) {
                            std::thread::sleep(wait.min(Duration::from_millis(5)));
                            continue;
                        }
                    }
                    QueryLoad::BackToBack => {}
                }
                let snap = engine.snapshot();
                rt.block_on(fovea_sql::query(&engine, &snap, "SELECT sum(balance) FROM hy.account"))?;
                sent += 1;
            }
            Ok(())
        });
        let replayed = (|| -> fovea_replayer::replay::CliResult<()> {
            let mut rng = SmallRng::seed_from_u64(1);
            let mut rows = 0u64;
            for (round, rates) in rates.iter_mut().enumerate() {
                for i in 0..QUERY_LOADS.len() {
                    let which = (i + round) % QUERY_LOADS.len();
                    // Every window starts from the same state: what the last
                    // one left stale is rewritten away, as the replayer's
                    // maintenance does between its rounds.
                    fovea_replayer::replay::maintenance_round(&engine, fovea_replayer::replay::STORAGE_GC_THRESHOLD)?;
                    load.store(which, Ordering::Relaxed);
                    // Release: publishes the load stored just above.
                    let w = window.fetch_add(1, Ordering::Release) + 1;
                    // Acquire pairs with the query thread's Release.
                    while taken_up.load(Ordering::Acquire) != w {
                        if queries.is_finished() {
                            return Ok(()); // its error is reported below
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let (start, first) = (Instant::now(), rows);
                    while start.elapsed() < QUERY_LOAD_WINDOW {
                        let ops: Vec<Op> = (0..10)
                            .map(|_| {
                                let k = rng.random_range(0..10_000i64);
                                Op::Update {
                                    table: t.id,
                                    key: vec![Value::Int(k)],
                                    row: vec![Value::Int(k), Value::Int(rows as i64)],
                                }
                            })
                            .collect();
                        rows += ops.len() as u64;
                        engine.apply(ops)?;
                        if rows.is_multiple_of(100_000) {
                            engine.gc()?;
                        }
                    }
                    rates[which] = (rows - first) as f64 / start.elapsed().as_secs_f64();
                }
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        let queried = queries.join().map_err(|_| "the query loop panicked")?;
        replayed.and(queried)
    })?;
    let mut result = ReplayBesideQueries { rows_per_s: [0.0; 4], over_without: [0.0; 4] };
    for which in 0..QUERY_LOADS.len() {
        result.rows_per_s[which] = median(&mut rates.iter().map(|r| r[which]).collect::<Vec<_>>());
        result.over_without[which] = median(&mut rates.iter().map(|r| r[which] / r[0]).collect::<Vec<_>>());
    }
    Ok(result)
}
