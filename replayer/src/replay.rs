//! `fovea replay` and `fovea export`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fovea_core::cdc::ddl::parse_ddl;
use fovea_core::cdc::source::LineSource;
use fovea_core::cdc::types::format_value;
use fovea_core::cdc::{InputFormat, SourcePosition, decode_line};
use fovea_core::index::encode_key;
use fovea_core::schema::rows_from_batch;
use fovea_core::sink::{Sink, SinkConfig, SinkStats};
use fovea_core::{EngineConfig, ScanOptions, Ts};

/// Boxed error of the command line.
pub type CliResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Options of `fovea replay`.
pub struct ReplayArgs {
    /// The lake.
    pub lake: crate::lakes::LakeArgs,
    /// Backends already made for `lake` (benchmarks count their traffic).
    pub backends: Option<fovea_core::location::LakeBackends>,
    /// Input file, or `-`.
    pub input: PathBuf,
    /// Input format.
    pub format: InputFormat,
    /// DDL overriding inferred types.
    pub schema_file: Option<PathBuf>,
    /// Checkpoint after this many transactions.
    pub checkpoint_txns: u64,
    /// Shards (threads of the engine).
    pub shards: Option<usize>,
    /// How long the lake's lease lasts without renewal.
    pub lease: Duration,
    /// Print progress.
    pub progress: bool,
}

/// What a replay did.
pub struct ReplaySummary {
    /// Counters.
    pub stats: SinkStats,
    /// Wall time.
    pub elapsed: Duration,
}

/// Replays `input` into the lake to its end and makes everything durable.
pub fn replay(args: &ReplayArgs) -> CliResult<ReplaySummary> {
    let ddl = match &args.schema_file {
        Some(p) => {
            let sql =
                std::fs::read_to_string(p).map_err(|e| format!("cannot read schema file {}: {e}", p.display()))?;
            parse_ddl(&sql).map_err(|e| format!("schema file {}: {e}", p.display()))?
        }
        None => Vec::new(),
    };
    let mut config = EngineConfig::default();
    if let Some(s) = args.shards {
        config = config.with_shards(s);
    }
    let lake = match &args.backends {
        Some(b) => crate::lakes::open_write(b.clone(), config, args.lease)?,
        None => args.lake.open_write(config, args.lease)?,
    };
    let input_name = if args.input == Path::new("-") {
        "-".to_owned()
    } else {
        std::fs::canonicalize(&args.input)
            .map_err(|e| format!("cannot open input {}: {e}", args.input.display()))?
            .display()
            .to_string()
    };
    // Standard input never resumes.
    let (source, fingerprint) = if input_name == "-" {
        (LineSource::open(&args.input, SourcePosition::default())?, None)
    } else {
        let (source, fingerprint) = resume_file(&args.input, &input_name, lake.checkpoint.as_ref())?;
        (source, Some(fingerprint))
    };
    let start = source.position();
    let sink_config = SinkConfig { checkpoint_txns: args.checkpoint_txns, ddl, ..SinkConfig::default() };
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), &input_name, sink_config)?;
    sink.set_source_state(fingerprint);
    let began = Instant::now();
    let mut last_progress = Instant::now();
    // A reader thread hands batches of lines round-robin to decoder
    // threads; this thread takes the decoded batches back in the same order
    // and applies them, so reading, decoding and applying overlap.
    let format = args.format;
    let mut workers = Vec::new();
    let mut to_decoders = Vec::new();
    let mut from_decoders = Vec::new();
    for i in 0..DECODERS {
        let (line_tx, line_rx) = std::sync::mpsc::sync_channel::<LineBatch>(8);
        let (done_tx, done_rx) = std::sync::mpsc::sync_channel::<DecodedBatch>(8);
        to_decoders.push(line_tx);
        from_decoders.push(done_rx);
        workers.push(
            std::thread::Builder::new()
                .name(format!("fovea-decode-{i}"))
                .spawn(move || decode_loop(line_rx, format, done_tx))?,
        );
    }
    let reader = std::thread::Builder::new().name("fovea-read".into()).spawn(move || read_loop(source, to_decoders))?;
    let mut resume = start;
    let result = (|| -> fovea_core::Result<()> {
        for i in 0.. {
            let Ok(batch) = from_decoders[i % DECODERS].recv() else { break };
            for (pos, next, record) in batch.records {
                resume = next;
                sink.push(record?, pos, next)?;
            }
            if let Some(end) = batch.end {
                resume = end;
                return sink.finish_input(end);
            }
            if args.progress && last_progress.elapsed() >= Duration::from_millis(500) {
                last_progress = Instant::now();
                let s = sink.stats();
                eprint!(
                    "\r[{:>6.1} s] line {:>10}  {:>9} txns  {:>11} rows  {:>10.0} rows/s",
                    began.elapsed().as_secs_f64(),
                    resume.line,
                    s.applied,
                    s.rows,
                    s.rows as f64 / began.elapsed().as_secs_f64()
                );
            }
        }
        Err(fovea_core::Error::Invariant("the decode thread stopped without an end".into()))
    })();
    // Dropping the receivers (on error) stops the threads at their next send.
    drop(from_decoders);
    let _ = reader.join();
    for w in workers {
        let _ = w.join();
    }
    if args.progress {
        eprintln!();
    }
    if let Err(e) = result {
        // Keep everything committed before the failure durable; the failing
        // transaction is not part of the image (its ts is not below HWM).
        if let Err(c) = sink.maybe_checkpoint(resume, true) {
            eprintln!("error: the final checkpoint failed too: {c}");
        }
        return Err(e.into());
    }
    lake.engine.flush()?;
    Ok(ReplaySummary { stats: sink.stats(), elapsed: began.elapsed() })
}

/// Opens the input file at `path` (named `name` in checkpoints) where
/// `checkpoint` stopped, if it read this input and the file is still the one
/// it read (its fingerprint); returns the source and the state the next
/// checkpoints record.
pub fn resume_file(
    path: &Path,
    name: &str,
    checkpoint: Option<&fovea_core::catalog::CheckpointRecord>,
) -> fovea_core::Result<(LineSource, String)> {
    let (position, state) = checkpoint
        .filter(|c| c.input == name)
        .map_or((SourcePosition::default(), None), |c| (c.position, c.source_state.as_deref()));
    let (source, fingerprint) = LineSource::resume(path, position, state)?;
    Ok((source, fingerprint.to_state()))
}

/// Threads decoding lines (besides the reader and the applying thread).
const DECODERS: usize = 2;
/// Lines per batch handed between threads.
const BATCH_LINES: usize = 512;

/// Raw lines with their positions; `end` is set on the last batch, or
/// `error` when reading failed.
struct LineBatch {
    lines: Vec<(SourcePosition, SourcePosition, String)>,
    end: Option<SourcePosition>,
    error: Option<fovea_core::Error>,
}

/// Decoded records with their position and the position after them;
/// `end` is set on the last batch (the position at the end of input).
struct DecodedBatch {
    records: Vec<(SourcePosition, SourcePosition, fovea_core::Result<fovea_core::cdc::ChangeRecord>)>,
    end: Option<SourcePosition>,
}

fn read_loop(mut source: LineSource, to: Vec<std::sync::mpsc::SyncSender<LineBatch>>) {
    for i in 0.. {
        let mut lines = Vec::with_capacity(BATCH_LINES);
        let mut line = String::new();
        let (end, error) = loop {
            if lines.len() == BATCH_LINES {
                break (None, None);
            }
            match source.next_line(&mut line) {
                Ok(Some(pos)) => lines.push((pos, source.position(), std::mem::take(&mut line))),
                Ok(None) => break (Some(source.position()), None),
                Err(e) => break (None, Some(e)),
            }
        };
        let last = end.is_some() || error.is_some();
        if to[i % to.len()].send(LineBatch { lines, end, error }).is_err() || last {
            return;
        }
    }
}

fn decode_loop(
    from: std::sync::mpsc::Receiver<LineBatch>,
    format: InputFormat,
    to: std::sync::mpsc::SyncSender<DecodedBatch>,
) {
    for batch in from {
        let mut records: Vec<_> =
            batch.lines.iter().map(|(pos, next, line)| (*pos, *next, decode_line(line, *pos, format))).collect();
        // Nothing after a decoding error is applied: the sink stops there.
        if let Some(i) = records.iter().position(|r| r.2.is_err()) {
            records.truncate(i + 1);
        }
        if let Some(e) = batch.error {
            let pos = records.last().map_or_else(SourcePosition::default, |r| r.1);
            records.push((pos, pos, Err(e)));
        }
        if to.send(DecodedBatch { records, end: batch.end }).is_err() {
            return;
        }
    }
}

/// Writes the visible rows of `table` as CSV (header, source columns in
/// order, sorted by primary key, NULL as an empty field).
pub fn export(lake: &crate::lakes::LakeArgs, table: &str, as_of: Option<u64>, out: &mut dyn Write) -> CliResult<()> {
    let lake = lake.open_read()?;
    let engine = &lake.engine;
    let def = engine.table(table)?;
    let snapshot = match as_of {
        Some(ts) => engine.snapshot_at(Ts(ts))?,
        None => engine.snapshot(),
    };
    let batches = engine.scan(&snapshot, table, ScanOptions::default())?.collect_batches()?;
    let mut rows = Vec::new();
    for b in &batches {
        rows.extend(rows_from_batch(b)?);
    }
    rows.sort_by_cached_key(|r| encode_key(def.id, &def.key_of(r)));
    let names: Vec<String> = def.schema.fields().iter().map(|f| csv_field(Some(f.name()))).collect();
    writeln!(out, "{}", names.join(","))?;
    let types: Vec<_> = def.schema.fields().iter().map(|f| f.data_type().clone()).collect();
    for r in rows {
        let fields: Vec<String> = r.iter().zip(&types).map(|(v, t)| csv_field(format_value(v, t).as_deref())).collect();
        writeln!(out, "{}", fields.join(","))?;
    }
    Ok(())
}

/// PostgreSQL CSV quoting: NULL is an empty field, an empty string is `""`.
pub fn csv_field(v: Option<&str>) -> String {
    match v {
        None => String::new(),
        Some("") => "\"\"".into(),
        Some(s) if s.contains([',', '"', '\n', '\r']) => format!("\"{}\"", s.replace('"', "\"\"")),
        Some(s) => s.to_owned(),
    }
}
