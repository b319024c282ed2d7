//! The one input loop of `fovea replay` and `fovea serve`, over any
//! [`ChangeSource`]: poll the source into the sink, make what arrived
//! visible, checkpoint (positions and state committed with the lake state
//! they produced, then confirmed to the source), stop at the end of the
//! input (replay) or when asked (serve), and always leave a final
//! checkpoint of everything applied.
//!
//! | `--input` | source | follows (serve) | replay stops |
//! |---|---|---|---|
//! | `PATH`, `file:PATH` (plain or gzip), `-` | [`FileSource`] | as the file grows | at its end |
//! | `postgres://…?slot=…&publication=…` | [`crate::serve::postgres::PgChangeSource`] | the slot | (serve only) |
//! | `kinesis://STREAM[,STREAM…]?…` | [`fovea_aws::kinesis::KinesisSource`] | every shard | when every shard is at its tip with nothing pending |

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fovea_core::Engine;
use fovea_core::catalog::CheckpointRecord;
use fovea_core::cdc::InputFormat;
use fovea_core::cdc::file::FileSource;
use fovea_core::cdc::source::ChangeSource;
use fovea_core::lease::LeaseKeeper;
use fovea_core::sink::Sink;

use crate::replay::CliResult;
use crate::serve::metrics::Metrics;

/// Opens the input `spec` names, resuming after `checkpoint` when it read
/// the same input. `follow`: wait for more instead of ending (serve).
/// Does [`check_input`] first.
pub fn open_source(
    spec: &str,
    checkpoint: Option<&CheckpointRecord>,
    format: InputFormat,
    follow: bool,
    poll: Duration,
    engine: &Arc<Engine>,
    metrics: Option<Arc<Metrics>>,
) -> CliResult<Box<dyn ChangeSource>> {
    check_input(spec, format, follow)?;
    let resume = checkpoint.map(CheckpointRecord::resume);
    let checkpoint = resume.as_ref();
    if spec.starts_with("kinesis://") {
        let options = fovea_aws::kinesis::KinesisOptions::parse(spec, format, follow)?;
        return Ok(Box::new(fovea_aws::kinesis::KinesisSource::open(options, checkpoint)?));
    }
    if is_postgres(spec) {
        return Ok(Box::new(crate::serve::postgres::PgChangeSource::open(
            spec,
            checkpoint,
            Arc::clone(engine),
            metrics,
        )?));
    }
    let path = spec.strip_prefix("file:").unwrap_or(spec);
    // Decoders read rows of known tables straight into typed values.
    let tables: Arc<dyn fovea_core::cdc::typed::CurrentTables> = Arc::clone(engine) as _;
    Ok(Box::new(FileSource::open(std::path::Path::new(path), checkpoint, format, follow, poll, Some(tables))?))
}

fn is_postgres(spec: &str) -> bool {
    spec.starts_with("postgres://") || spec.starts_with("postgresql://")
}

/// What can be told of an input before anything is opened for it: a
/// malformed Kinesis URL, a PostgreSQL slot given to a command that does
/// not follow (`replay`), a file that cannot be opened. `replay` and
/// `serve` check first, so a mistyped input makes no lake, takes no lease
/// and creates no state table.
pub fn check_input(spec: &str, format: InputFormat, follow: bool) -> CliResult<()> {
    if spec.starts_with("kinesis://") {
        fovea_aws::kinesis::KinesisOptions::parse(spec, format, follow)?;
    } else if is_postgres(spec) {
        if !follow {
            return Err("a PostgreSQL slot is followed by `fovea serve`, not replayed to an end".into());
        }
    } else {
        let path = spec.strip_prefix("file:").unwrap_or(spec);
        if path != "-" {
            std::fs::File::open(path).map_err(|e| format!("cannot open input {path}: {e}"))?;
        }
    }
    Ok(())
}

/// How the loop runs.
pub struct LoopOptions<'a> {
    /// Checkpoint after this long (when something was applied since).
    pub checkpoint_every: Duration,
    /// Checkpoint after this many source transactions.
    pub checkpoint_txns: u64,
    /// Stop when set (serve: SIGINT/SIGTERM).
    pub stop: Option<&'a AtomicBool>,
    /// The lake's lease: a fenced replayer stops before writing more.
    pub lease: Option<&'a LeaseKeeper>,
    /// Metrics to update (serve).
    pub metrics: Option<&'a Metrics>,
    /// A progress line on standard error (replay; drawn only when it is a
    /// terminal).
    pub progress: bool,
    /// HWM held below committed transactions this long is logged as an
    /// error naming the transaction it waits for (see
    /// [`fovea_core::Clock::stall`]); `None`: not watched.
    pub stall_after: Option<Duration>,
}

/// A spinner with the elapsed time and a message, on standard error when
/// it is a terminal (indicatif draws nothing otherwise).
pub fn spinner() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
            .unwrap_or_else(|e| unreachable!("a valid template: {e}")),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Polls `source` into `sink` until the input ends or `stop` is set, then
/// writes a final checkpoint (also after an error: everything committed
/// before it stays durable).
pub fn run(source: &mut dyn ChangeSource, sink: &mut Sink, options: &LoopOptions<'_>) -> CliResult<()> {
    // Drawn on standard error only when it is a terminal.
    let bar = options.progress.then(spinner);
    let result = run_until_stopped(source, sink, options, bar.as_ref());
    // The caller reports the totals.
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // The end of the input checkpointed already.
    if let Ok(true) = result {
        return Ok(());
    }
    let last = checkpoint(source, sink, options.metrics);
    if let (Err(_), Err(c)) = (&result, &last) {
        tracing::error!("the final checkpoint failed too: {c}");
    }
    result?;
    last
}

/// Runs until the input ends (`true`, checkpointed) or `stop` is set.
fn run_until_stopped(
    source: &mut dyn ChangeSource,
    sink: &mut Sink,
    options: &LoopOptions<'_>,
    bar: Option<&indicatif::ProgressBar>,
) -> CliResult<bool> {
    let count = |kind: &str| {
        if let Some(m) = options.metrics {
            m.error(kind);
        }
    };
    let began = Instant::now();
    let mut last_checkpoint = Instant::now();
    let mut last_report = Instant::now();
    let mut dirty = false;
    let mut stall_logged: Option<(fovea_core::ids::Ts, Instant)> = None;
    // Acquire: pairs with the signal handler's Release store.
    while !options.stop.is_some_and(|s| s.load(Ordering::Acquire)) {
        // Another replayer took the lake over: stop before writing more.
        if let Some(l) = options.lease {
            l.check().inspect_err(|_| count("fenced"))?;
        }
        let polled = source.poll(sink).inspect_err(|_| count("input"))?;
        if let Some(end) = polled.end {
            // Whatever the source needs to resume there, for the last checkpoint.
            let state = source.state_at(end)?;
            sink.set_source_state(state);
            sink.finish_input(end)?;
            if let Some(at) = sink.checkpointed_at() {
                source.confirm(at)?;
            }
            return Ok(true);
        }
        // The input paused (or a batch ended): make what arrived visible now.
        sink.flush_group();
        dirty |= polled.records > 0 || polled.moved;
        if last_report.elapsed() >= Duration::from_millis(500) {
            last_report = Instant::now();
            report(source, sink, options, bar, began);
            watch_stall(sink, options, &mut stall_logged);
        }
        // Checkpoints are written in the background while replay goes on
        // (one at a time), committed and confirmed once written.
        if let Some(took) = sink.poll_checkpoint().inspect_err(|_| count("checkpoint"))? {
            checkpointed(source, sink, options.metrics, took)?;
        }
        if dirty
            && !sink.checkpoint_in_flight()
            && (last_checkpoint.elapsed() >= options.checkpoint_every
                || sink.since_checkpoint() >= options.checkpoint_txns)
        {
            let next = source.position();
            sink.start_checkpoint(next, &mut |at| source.state_at(at)).inspect_err(|_| count("checkpoint"))?;
            last_checkpoint = Instant::now();
            dirty = false;
        }
    }
    Ok(false)
}

/// Logs an error when HWM has been held longer than `stall_after` (once
/// per held ts, again every minute while it lasts), naming what the sink
/// knows of the transaction it waits for; `/healthz` and the `stalled`
/// metric say so from the clock alone (see [`Metrics::stall`]).
fn watch_stall(sink: &Sink, options: &LoopOptions<'_>, logged: &mut Option<(fovea_core::ids::Ts, Instant)>) {
    let Some(after) = options.stall_after else { return };
    let Some(stall) = sink.engine().clock().stall().filter(|s| s.held_for >= after) else {
        *logged = None;
        return;
    };
    if logged.is_some_and(|(ts, at)| ts == stall.waiting_for && at.elapsed() < Duration::from_secs(60)) {
        return;
    }
    *logged = Some((stall.waiting_for, Instant::now()));
    tracing::error!(
        ts = %stall.waiting_for,
        "{}. The transaction: {}",
        crate::serve::metrics::stall_message(&stall),
        sink.describe_ts(stall.waiting_for)
    );
}

/// Progress on standard error, lag and counters into the metrics.
fn report(
    source: &mut dyn ChangeSource,
    sink: &Sink,
    options: &LoopOptions<'_>,
    bar: Option<&indicatif::ProgressBar>,
    began: Instant,
) {
    let stats = sink.stats();
    let lag = source.lag();
    if let Some(m) = options.metrics {
        // Relaxed: statistics (see `Metrics`).
        m.rows.store(stats.rows, Ordering::Relaxed);
        m.transactions.store(stats.applied, Ordering::Relaxed);
        if stats.cleanup_failures > 0 {
            m.errors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert("checkpoint_cleanup".into(), stats.cleanup_failures);
        }
        if let Some(bytes) = lag.bytes {
            m.input_lag_bytes.store(bytes, Ordering::Relaxed);
        }
        m.set_input_lag(&lag);
    }
    if let Some(bar) = bar {
        let secs = began.elapsed().as_secs_f64();
        bar.set_message(format!(
            "{:>9} txns  {:>11} rows  {:>10.0} rows/s{}",
            stats.applied,
            stats.rows,
            stats.rows as f64 / secs.max(1e-9),
            if lag.held.0 > 0 { format!("  {} held", lag.held.0) } else { String::new() }
        ));
    }
}

/// Writes a checkpoint of everything applied, with the source's state for
/// where it resumes, and confirms it to the source (after committing the
/// checkpoint being written, if any).
pub fn checkpoint(source: &mut dyn ChangeSource, sink: &mut Sink, metrics: Option<&Metrics>) -> CliResult<()> {
    let began = Instant::now();
    let next = source.position();
    sink.checkpoint_with(next, &mut |at| source.state_at(at))?;
    // Reported here, with its whole time (and one committed before it, if any).
    sink.poll_checkpoint()?;
    checkpointed(source, sink, metrics, began.elapsed())
}

/// Counts a committed checkpoint (`took`: from its capture to its commit)
/// and confirms where it resumes to the source.
fn checkpointed(
    source: &mut dyn ChangeSource,
    sink: &Sink,
    metrics: Option<&Metrics>,
    took: Duration,
) -> CliResult<()> {
    if let Some(m) = metrics {
        let us = took.as_micros() as u64;
        // Relaxed: statistics (see `Metrics`).
        m.checkpoints.fetch_add(1, Ordering::Relaxed);
        m.checkpoint_us.fetch_add(us, Ordering::Relaxed);
        m.last_checkpoint_us.store(us, Ordering::Relaxed);
        m.checkpoint_seconds.observe(us as f64 / 1e6);
    }
    if let Some(at) = sink.checkpointed_at() {
        source.confirm(at)?;
    }
    Ok(())
}
