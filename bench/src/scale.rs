//! `fovea-bench scale`: what each role of a scaled-out replay costs per
//! row, measured on the production path, and the throughput that gives
//! from 1 to 16 replayers beside Retina's.
//!
//! Retina (PVLDB 2026, §6) splits replay into one sink — decoding,
//! rebuilding transactions, allocating their timestamps, routing each
//! operation by (table, key) — and replayers that each hold the index,
//! write buffer and tile visibility of a key range; it reports 3.2M rows/s
//! on 16 nodes. fovea runs the same roles as threads of one process: the
//! reader and decoder threads and the applying thread are the sink, the
//! shard workers (with the flusher and the checkpoint writer) the
//! replayers. This benchmark replays one HyBench stream with 1, 2, 4 …
//! shards and charges every thread's CPU time to its role, so the cost of
//! each role per row is measured where it runs, whatever the machine's
//! core count (two here: wall-clock speed-up says nothing). From those
//! costs it models the throughput of `n` replayer nodes behind one sink.
//! Not in the measurement: the transport between sink and replayers once
//! they are processes (serialising a transaction group and its
//! acknowledgement), which adds to both sides.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::scan::median;

/// Rows per second Retina reports on 16 nodes (PVLDB 2026, §6).
const RETINA_ROWS_PER_S_16_NODES: f64 = 3_200_000.0;

/// How often the sampler reads every thread's CPU time. A thread that
/// ends between two samples loses at most this much of its CPU (reported
/// as `unattributed`).
const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// Options of `fovea-bench scale`.
pub struct ScaleBench {
    /// Replayer (shard) counts to measure.
    pub replayers: Vec<usize>,
    /// Transactions of the HyBench stream.
    pub txns: u64,
    /// Replays per count (medians reported).
    pub runs: usize,
    /// Cores of a node in the model.
    pub node_cores: usize,
    /// Print one JSON object.
    pub json: bool,
}

/// The role a thread plays in the replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Role {
    /// The applying thread: transaction assembly, dedup, timestamps,
    /// routing (one thread: the sink's serial part).
    SinkApply,
    /// Reading and decoding the input (threads of their own).
    SinkDecode,
    /// Shard worker `n`: index, write buffer, visibility.
    Shard(usize),
    /// Writing flushed write-buffer blocks.
    Flush,
    /// Writing checkpoints (index images, visibility).
    Checkpoint,
    /// Memory GC of visibility, combine, storage GC.
    Maintenance,
    /// The object store's IO runtime (writing flushed blocks, files and
    /// checkpoints).
    Io,
    /// Anything else (the lease's heartbeat, the benchmark itself).
    Other,
}

impl Role {
    /// The role of thread `tid` named `comm` (Linux keeps a thread's
    /// first 15 bytes: "fovea-checkpoin").
    fn of(tid: i32, main: i32, comm: &str) -> Role {
        if tid == main {
            return Role::SinkApply;
        }
        if comm == "fovea-read" || comm.starts_with("fovea-decode") {
            Role::SinkDecode
        } else if let Some(n) = comm.strip_prefix("fovea-shard-") {
            n.parse().map_or(Role::Other, Role::Shard)
        } else if comm == "fovea-flush" {
            Role::Flush
        } else if comm.starts_with("fovea-checkpoin") {
            Role::Checkpoint
        } else if comm.starts_with("fovea-maintenan") {
            Role::Maintenance
        } else if comm == "fovea-io" {
            Role::Io
        } else {
            Role::Other
        }
    }
}

/// Name and CPU time (USER_HZ ticks, 100 a second) of thread `tid` of
/// this process.
fn thread_ticks(tid: i32) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let (name, ticks) = fovea_replayer::serve::metrics::proc_stat_cpu(&stat)?;
    Some((name.to_owned(), ticks))
}

/// Samples every thread's CPU time until stopped; CPU seconds by role.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<HashMap<Role, f64>>,
}

impl Sampler {
    fn start() -> std::io::Result<Sampler> {
        if thread_ticks(std::process::id() as i32).is_none() {
            return Err(std::io::Error::other(
                "bench scale reads each thread's CPU time from /proc/self/task (Linux), which is not readable here",
            ));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let main = std::process::id() as i32;
        let (first_taken, taken) = std::sync::mpsc::channel();
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new().name("bench-sampler".into()).spawn(move || {
                // Per live thread: its role, its ticks when first seen if it
                // ran before the sampler started (0 for a thread started
                // since), and its newest ticks. Ticks of threads whose id
                // the kernel gave to a new thread since go to `ended`.
                let mut live: HashMap<i32, (Role, u64, u64)> = HashMap::new();
                let mut ended: HashMap<Role, u64> = HashMap::new();
                let mut first = true;
                let mut sample = |live: &mut HashMap<i32, (Role, u64, u64)>, first: bool| {
                    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return };
                    for task in tasks.flatten() {
                        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) else {
                            continue;
                        };
                        let Some((comm, ticks)) = thread_ticks(tid) else { continue };
                        if comm == "bench-sampler" {
                            continue;
                        }
                        let role = Role::of(tid, main, &comm);
                        match live.get_mut(&tid) {
                            Some((r, _, newest)) if *r == role && ticks >= *newest => *newest = ticks,
                            Some(old) => {
                                *ended.entry(old.0).or_default() += old.2 - old.1;
                                *old = (role, 0, ticks);
                            }
                            None => {
                                live.insert(tid, (role, if first { ticks } else { 0 }, ticks));
                            }
                        }
                    }
                };
                // Relaxed: a flag polled every sample; the join publishes the result.
                while !stop.load(Ordering::Relaxed) {
                    sample(&mut live, first);
                    if first {
                        let _ = first_taken.send(());
                    }
                    first = false;
                    std::thread::sleep(SAMPLE_EVERY);
                }
                sample(&mut live, false);
                let mut seconds: HashMap<Role, f64> = HashMap::new();
                for (role, ticks) in live.into_values().map(|(r, start, newest)| (r, newest - start)).chain(ended) {
                    *seconds.entry(role).or_default() += ticks as f64 / 100.0;
                }
                seconds
            })?
        };
        // The threads already running are counted from here on.
        taken.recv().map_err(|_| std::io::Error::other("the CPU sampler stopped before its first sample"))?;
        Ok(Sampler { stop, thread })
    }

    /// CPU seconds each role used since [`Sampler::start`].
    fn finish(self) -> std::io::Result<HashMap<Role, f64>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| std::io::Error::other("the CPU sampler panicked"))
    }
}

/// One replay's costs, µs of CPU per row replayed.
#[derive(Clone, Debug, Default)]
struct RoleCosts {
    rows: u64,
    rows_per_s: f64,
    sink_apply: f64,
    sink_decode: f64,
    /// All shard workers together.
    shards: f64,
    /// The busiest shard's CPU over the shards' mean.
    shard_skew: f64,
    flush: f64,
    checkpoint: f64,
    maintenance: f64,
    io: f64,
    other: f64,
    /// Process CPU no sampled thread accounts for.
    unattributed: f64,
}

impl RoleCosts {
    /// What a replayer node does per row: apply, flush, checkpoint, keep
    /// its files (memory GC, combine), and the IO of all of these.
    fn replayer(&self) -> f64 {
        self.shards + self.flush + self.checkpoint + self.maintenance + self.io
    }

    fn sink(&self) -> f64 {
        self.sink_apply + self.sink_decode
    }
}

fn replay_once(
    dir: &std::path::Path,
    input: &std::path::Path,
    shards: usize,
) -> fovea_replayer::replay::CliResult<RoleCosts> {
    let lake = dir.join(format!("lake-{shards}"));
    if lake.exists() {
        std::fs::remove_dir_all(&lake)?;
    }
    let cpu_before = fovea_replayer::serve::metrics::cpu_seconds();
    let sampler = Sampler::start()?;
    let run = crate::replay::replay_into(
        fovea_replayer::lakes::LakeArgs::local(&lake),
        input,
        false,
        crate::replay::BENCH_CHECKPOINT_TXNS,
        Default::default(),
        Some(shards),
    );
    let by_role = sampler.finish()?;
    let run = run?;
    std::fs::remove_dir_all(&lake)?;
    let process = cpu_before.zip(fovea_replayer::serve::metrics::cpu_seconds()).map(|(b, a)| a - b);
    let per_row = |s: f64| s * 1e6 / run.rows.max(1) as f64;
    let of = |role: Role| by_role.get(&role).copied().unwrap_or(0.0);
    let shard_cpu: Vec<f64> = (0..shards).map(|s| of(Role::Shard(s))).collect();
    let shards_total: f64 = shard_cpu.iter().sum();
    let mean = shards_total / shards as f64;
    let attributed: f64 = by_role.values().sum();
    Ok(RoleCosts {
        rows: run.rows,
        rows_per_s: run.rows as f64 / run.seconds,
        sink_apply: per_row(of(Role::SinkApply)),
        sink_decode: per_row(of(Role::SinkDecode)),
        shards: per_row(shards_total),
        shard_skew: if mean > 0.0 { shard_cpu.iter().copied().fold(0.0, f64::max) / mean } else { 0.0 },
        flush: per_row(of(Role::Flush)),
        checkpoint: per_row(of(Role::Checkpoint)),
        maintenance: per_row(of(Role::Maintenance)),
        io: per_row(of(Role::Io)),
        other: per_row(of(Role::Other)),
        unattributed: process.map_or(0.0, |p| per_row((p - attributed).max(0.0))),
    })
}

/// Medians of each field over `runs`.
fn medians(runs: &[RoleCosts]) -> RoleCosts {
    let m = |f: fn(&RoleCosts) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    RoleCosts {
        rows: runs.first().map_or(0, |r| r.rows),
        rows_per_s: m(|r| r.rows_per_s),
        sink_apply: m(|r| r.sink_apply),
        sink_decode: m(|r| r.sink_decode),
        shards: m(|r| r.shards),
        shard_skew: m(|r| r.shard_skew),
        flush: m(|r| r.flush),
        checkpoint: m(|r| r.checkpoint),
        maintenance: m(|r| r.maintenance),
        io: m(|r| r.io),
        other: m(|r| r.other),
        unattributed: m(|r| r.unattributed),
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `fovea-bench scale`.
pub fn run(b: &ScaleBench) -> fovea_replayer::replay::CliResult<()> {
    if b.replayers.is_empty() || b.replayers.contains(&0) {
        return Err("--replayers: expected counts of 1 or more, e.g. 1,2,4".into());
    }
    if b.node_cores < 2 {
        return Err(format!(
            "--node-cores {}: a node needs 2 or more (the sink's applying thread and a decoder)",
            b.node_cores
        )
        .into());
    }
    let dir = tempfile::Builder::new().prefix("fovea-bench-scale-").tempdir()?;
    let input = dir.path().join("stream.jsonl");
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&input)?);
        fovea_testkit::workload::generate(fovea_testkit::workload::Workload::Hybench, b.txns, 7, &mut w)?;
        std::io::Write::flush(&mut w)?;
    }
    let mut measured: Vec<(usize, RoleCosts)> = Vec::new();
    // Counts alternate within each round, so a slow patch of a shared host
    // falls on all of them.
    let mut runs: Vec<Vec<RoleCosts>> = vec![Vec::new(); b.replayers.len()];
    for round in 0..b.runs {
        for (i, &n) in b.replayers.iter().enumerate() {
            if !b.json {
                eprintln!("round {}/{}: {n} replayer(s)", round + 1, b.runs);
            }
            let r = replay_once(dir.path(), &input, n)?;
            if let Some(first) = runs.iter().flatten().next()
                && first.rows != r.rows
            {
                return Err(format!("{n} replayers applied {} rows, an earlier replay {}", r.rows, first.rows).into());
            }
            runs[i].push(r);
        }
    }
    for (i, &n) in b.replayers.iter().enumerate() {
        measured.push((n, medians(&runs[i])));
    }

    // The model: from the costs at the largest count (the routing and
    // per-shard overheads of many shards included).
    let (_, at) = measured.iter().max_by_key(|(n, _)| *n).ok_or("no measurement")?;
    let cores = b.node_cores as f64;
    let replayer_per_core = 1e6 / at.replayer().max(1e-9);
    // One sink node: its applying thread is serial; decoding spreads over
    // the node's other cores.
    let sink_serial = 1e6 / at.sink_apply.max(1e-9);
    let sink_decode = (cores - 1.0) * 1e6 / at.sink_decode.max(1e-9);
    let sink_ceiling = sink_serial.min(sink_decode);
    let model: Vec<_> = [1usize, 2, 4, 8, 16]
        .iter()
        .map(|&n| {
            let replayers = n as f64 * cores * replayer_per_core;
            let rows_per_s = replayers.min(sink_ceiling);
            json!({
                "replayers": n,
                "rows_per_s": rows_per_s.round(),
                "bound_by": if replayers <= sink_ceiling { "replayers" } else { "sink" },
            })
        })
        .collect();
    let at_16 = (16.0 * cores * replayer_per_core).min(sink_ceiling);
    let result = json!({
        "workload": "hybench",
        "txns": b.txns,
        "rows": at.rows,
        "runs": b.runs,
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "measured": measured.iter().map(|(n, c)| json!({
            "replayers": n,
            "rows_per_s": c.rows_per_s.round(),
            "cpu_us_per_row": {
                "sink_apply": round2(c.sink_apply),
                "sink_decode": round2(c.sink_decode),
                "replayer_shards": round2(c.shards),
                "replayer_flush": round2(c.flush),
                "replayer_checkpoint": round2(c.checkpoint),
                "replayer_maintenance": round2(c.maintenance),
                "replayer_io": round2(c.io),
                "other": round2(c.other),
                "unattributed": round2(c.unattributed),
            },
            "sink_over_replayer": round2(c.sink() / c.replayer().max(1e-9)),
            "shard_skew": round2(c.shard_skew),
        })).collect::<Vec<_>>(),
        "model": {
            "node_cores": b.node_cores,
            "replayer_rows_per_s_per_core": replayer_per_core.round(),
            "sink_ceiling_rows_per_s": sink_ceiling.round(),
            "sink_serial_rows_per_s": sink_serial.round(),
            "sink_decode_rows_per_s": sink_decode.round(),
            "throughput": model,
            "at_16_over_retina": round2(at_16 / RETINA_ROWS_PER_S_16_NODES),
        },
    });
    if b.json {
        println!("{result}");
        return Ok(());
    }
    println!(
        "HyBench, {} transactions, {} rows, {} build; CPU µs per row by role (medians of {} runs): sink | replayers | neither",
        b.txns,
        at.rows,
        result["build"].as_str().unwrap_or_default(),
        b.runs
    );
    println!(
        "{:>9} {:>9} | {:>6} {:>6} | {:>6} {:>6} {:>6} {:>6} {:>6} | {:>6} {:>7} | {:>10} {:>5}",
        "replayers",
        "rows/s",
        "apply",
        "decode",
        "shards",
        "flush",
        "ckpt",
        "maint.",
        "io",
        "other",
        "unattr.",
        "sink/repl.",
        "skew"
    );
    for (n, c) in &measured {
        println!(
            "{:>9} {:>9.0} | {:>6.2} {:>6.2} | {:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>6.2} | {:>6.2} {:>7.2} | {:>10.2} {:>5.2}",
            n,
            c.rows_per_s,
            c.sink_apply,
            c.sink_decode,
            c.shards,
            c.flush,
            c.checkpoint,
            c.maintenance,
            c.io,
            c.other,
            c.unattributed,
            c.sink() / c.replayer().max(1e-9),
            c.shard_skew
        );
    }
    println!(
        "model ({} cores a node, costs at {} replayers; the transport between processes not included):",
        b.node_cores,
        measured.iter().map(|(n, _)| *n).max().unwrap_or(1)
    );
    println!(
        "  a replayer core: {:.0} rows/s; one sink: {:.0} rows/s (applying thread {:.0}, decoding on {} cores {:.0})",
        replayer_per_core,
        sink_ceiling,
        sink_serial,
        b.node_cores - 1,
        sink_decode
    );
    for m in &model {
        println!(
            "  {:>2} replayers: {:>10.0} rows/s ({})",
            m["replayers"],
            m["rows_per_s"].as_f64().unwrap_or_default(),
            m["bound_by"].as_str().unwrap_or_default()
        );
    }
    println!("  at 16: {:.2} × Retina's 3.2M rows/s on 16 nodes", at_16 / RETINA_ROWS_PER_S_16_NODES);
    Ok(())
}
