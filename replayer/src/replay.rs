//! `fovea replay` and `fovea export`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fovea_core::catalog::{OpenMode, open_lake};
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
    /// Lake directory.
    pub lake: PathBuf,
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
    let lake = open_lake(&args.lake, config, OpenMode::Write)?;
    let input_name = if args.input == Path::new("-") {
        "-".to_owned()
    } else {
        std::fs::canonicalize(&args.input)
            .map_err(|e| format!("cannot open input {}: {e}", args.input.display()))?
            .display()
            .to_string()
    };
    let start = match &lake.checkpoint {
        Some(c) if c.input == input_name => c.position,
        _ => SourcePosition::default(),
    };
    let mut source = LineSource::open(&args.input, start)?;
    let sink_config = SinkConfig { checkpoint_txns: args.checkpoint_txns, ddl, ..SinkConfig::default() };
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), &input_name, sink_config)?;
    let began = Instant::now();
    let mut last_progress = Instant::now();
    let mut line = String::new();
    let result = (|| -> fovea_core::Result<()> {
        while let Some(pos) = source.next_line(&mut line)? {
            let record = decode_line(&line, pos, args.format)?;
            sink.push(record, pos, source.position())?;
            if args.progress && last_progress.elapsed() >= Duration::from_millis(500) {
                last_progress = Instant::now();
                let s = sink.stats();
                eprint!(
                    "\r[{:>6.1} s] line {:>10}  {:>9} txns  {:>11} rows  {:>10.0} rows/s",
                    began.elapsed().as_secs_f64(),
                    pos.line,
                    s.applied,
                    s.rows,
                    s.rows as f64 / began.elapsed().as_secs_f64()
                );
            }
        }
        sink.finish_input(source.position())
    })();
    if args.progress {
        eprintln!();
    }
    if let Err(e) = result {
        // Keep everything committed before the failure durable; the failing
        // transaction is not part of the image (its ts is not below HWM).
        if let Err(c) = sink.maybe_checkpoint(source.position(), true) {
            eprintln!("error: the final checkpoint failed too: {c}");
        }
        return Err(e.into());
    }
    lake.engine.flush()?;
    Ok(ReplaySummary { stats: sink.stats(), elapsed: began.elapsed() })
}

/// Writes the visible rows of `table` as CSV (header, source columns in
/// order, sorted by primary key, NULL as an empty field).
pub fn export(lake: &Path, table: &str, as_of: Option<u64>, out: &mut dyn Write) -> CliResult<()> {
    if !lake.join(fovea_core::engine::METADATA_DIR).is_dir() {
        return Err(
            format!("{} is not a fovea lake (no {} folder)", lake.display(), fovea_core::engine::METADATA_DIR).into()
        );
    }
    let lake = open_lake(lake, EngineConfig::default(), OpenMode::Read)?;
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
fn csv_field(v: Option<&str>) -> String {
    match v {
        None => String::new(),
        Some("") => "\"\"".into(),
        Some(s) if s.contains([',', '"', '\n', '\r']) => format!("\"{}\"", s.replace('"', "\"\"")),
        Some(s) => s.to_owned(),
    }
}
