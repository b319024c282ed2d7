//! `fovea replay` and `fovea export`.

use fovea_core::SnapshotTables;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fovea_core::cdc::InputFormat;
use fovea_core::cdc::ddl::parse_ddl;
use fovea_core::cdc::types::format_value;
use fovea_core::index::encode_row_key;
use fovea_core::schema::rows_from_batch;
use fovea_core::sink::{Sink, SinkConfig, SinkStats};
use fovea_core::storage_gc::StorageGcReport;
use fovea_core::{Engine, EngineConfig, ScanOptions};

/// Boxed error of the command line.
pub type CliResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// An error with its sources, outermost first ("transport error: …:
/// invalid peer certificate: UnknownIssuer").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text
}

/// `--history-days`: how long catalog history is kept (`forever`: all).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HistoryDays(pub Option<Duration>);

impl std::str::FromStr for HistoryDays {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "forever" {
            return Ok(HistoryDays(None));
        }
        match s.parse::<f64>() {
            Ok(days) if days.is_finite() && days > 0.0 => {
                Ok(HistoryDays(Some(Duration::from_secs_f64(days * 86_400.0))))
            }
            _ => Err(format!("{s:?}: expected a positive number of days (e.g. 7 or 0.5), or forever")),
        }
    }
}

impl std::fmt::Display for HistoryDays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(d) => write!(f, "{}", d.as_secs_f64() / 86_400.0),
            None => f.write_str("forever"),
        }
    }
}

impl Default for HistoryDays {
    fn default() -> Self {
        HistoryDays(Some(fovea_core::sink::DEFAULT_HISTORY_RETENTION))
    }
}

/// Options of `fovea replay`.
pub struct ReplayArgs {
    /// The lake.
    pub lake: crate::lakes::LakeArgs,
    /// Who runs combine's and storage GC's rewrites.
    pub functions: crate::lakes::FunctionsArgs,
    /// Whether checkpoints are published as Iceberg tables.
    pub iceberg: crate::lakes::IcebergArgs,
    /// Backends already made for `lake` (benchmarks count their traffic).
    pub backends: Option<fovea_core::location::LakeBackends>,
    /// Input: a file (plain or gzip), `-` for standard input, or
    /// `kinesis://STREAM…` (see [`crate::input`]).
    pub input: String,
    /// Input format.
    pub format: InputFormat,
    /// DDL overriding inferred types.
    pub schema_file: Option<PathBuf>,
    /// Checkpoint after this many transactions.
    pub checkpoint_txns: u64,
    /// Shards (threads of the engine).
    pub shards: Option<usize>,
    /// Rows per block and blocks per file (`None`: the defaults).
    pub blocks: Option<(usize, usize)>,
    /// How long the lake's lease lasts without renewal.
    pub lease: Duration,
    /// Print progress.
    pub progress: bool,
    /// How long catalog history is kept.
    pub history: HistoryDays,
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
    args.iceberg.check()?;
    crate::input::check_input(&args.input, args.format, false)?;
    let ddl = read_schema_file(args.schema_file.as_deref())?;
    let mut config = EngineConfig::default().with_retire_grace(args.iceberg.retire_grace());
    if let Some(s) = args.shards {
        config = config.with_shards(s);
    }
    if let Some((rows, per_file)) = args.blocks {
        config = config.with_blocks(rows, per_file);
    }
    let lake = match &args.backends {
        Some(b) => crate::lakes::open_write(b.clone(), config, args.lease)?,
        None => args.lake.open_write(config, args.lease)?,
    };
    args.functions.attach(&args.lake, &lake.engine)?;
    let mut source = crate::input::open_source(
        &args.input,
        lake.checkpoint.as_ref(),
        args.format,
        false,
        Duration::from_millis(50),
        &lake.engine,
        None,
    )?;
    let input_name = source.name().to_owned();
    let sink_config = SinkConfig {
        // The input loop decides when to checkpoint.
        checkpoint_txns: u64::MAX,
        checkpoint_interval: Duration::MAX,
        ddl,
        // The maintenance thread below does it, beside the replay.
        maintain_on_checkpoint: false,
        history_retention: args.history.0,
        publisher: args
            .iceberg
            .publisher(&args.lake, &lake.engine)?
            .map(|p| p as std::sync::Arc<dyn fovea_core::sink::CheckpointPublisher>),
        publish_interval: args.iceberg.publish_interval(),
        ..SinkConfig::default()
    };
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), &input_name, sink_config)?;
    let began = Instant::now();
    let options = crate::input::LoopOptions {
        checkpoint_every: Duration::from_secs(10),
        checkpoint_txns: args.checkpoint_txns,
        stop: None,
        lease: lake.lease.as_ref(),
        metrics: None,
        progress: args.progress,
        stall_after: Some(crate::serve::metrics::DEFAULT_STALL_AFTER),
    };
    let stop = AtomicBool::new(false);
    let engine = &lake.engine;
    std::thread::scope(|s| {
        let maintenance = std::thread::Builder::new()
            .name("fovea-maintenance".into())
            .spawn_scoped(s, || maintain_until(engine, &stop, MAINTENANCE_EVERY))?;
        let replayed = crate::input::run(source.as_mut(), &mut sink, &options);
        // Release: pairs with the Acquire load in `maintain_until`.
        stop.store(true, Ordering::Release);
        if maintenance.join().is_err() {
            return Err("the maintenance thread panicked".into());
        }
        replayed
    })?;
    lake.engine.flush()?;
    Ok(ReplaySummary { stats: sink.stats(), elapsed: began.elapsed() })
}

/// The CREATE TABLE statements of `--schema-file` (none without one).
pub fn read_schema_file(path: Option<&std::path::Path>) -> CliResult<Vec<fovea_core::cdc::ddl::TableDdl>> {
    let Some(p) = path else { return Ok(Vec::new()) };
    let sql = std::fs::read_to_string(p).map_err(|e| format!("cannot read schema file {}: {e}", p.display()))?;
    Ok(parse_ddl(&sql).map_err(|e| format!("schema file {}: {e}", p.display()))?)
}

/// Seconds between maintenance rounds of `fovea replay`.
const MAINTENANCE_EVERY: Duration = Duration::from_secs(2);

/// Stale fraction past which `fovea replay` and `fovea demo` rewrite a file
/// (the design's default).
pub const STORAGE_GC_THRESHOLD: f64 = 0.5;

/// One round of in-process maintenance: memory GC, flush, combine, storage
/// GC at `threshold`. Each step changes no answer; one that fails leaves
/// what it had not done for the next round.
pub fn maintenance_round(engine: &Engine, threshold: f64) -> fovea_core::Result<StorageGcReport> {
    engine.gc()?;
    engine.flush()?;
    engine.combine()?;
    let report = engine.storage_gc(threshold)?;
    if report.files_rewritten > 0 {
        tracing::debug!(?report, "storage GC rewrote stale files");
    }
    Ok(report)
}

/// Maintenance rounds every `every` until `stop` is set. A failed round is
/// logged (the replay goes on: what is committed is unaffected) and the
/// next one retries.
fn maintain_until(engine: &Engine, stop: &AtomicBool, every: Duration) {
    let mut last = Instant::now();
    // Acquire: pairs with the Release store in `replay`.
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(50));
        if last.elapsed() < every {
            continue;
        }
        last = Instant::now();
        if let Err(e) = maintenance_round(engine, STORAGE_GC_THRESHOLD) {
            tracing::error!("maintenance (memory GC, combine, storage GC) failed, retried in {every:?}: {e}");
        }
    }
}

/// Writes the visible rows of `table` as CSV (header, source columns in
/// order, sorted by primary key, NULL as an empty field). fovea's hidden
/// `_fovea_*` columns are left out, as SQL leaves them out; a table without
/// a primary key comes in the order its rows were inserted.
pub fn export(lake: &crate::lakes::LakeArgs, table: &str, as_of: Option<u64>, out: &mut dyn Write) -> CliResult<()> {
    let lake = lake.open_read()?;
    crate::query::check_as_of(&lake.reader, as_of)?;
    let def = lake.reader.table(table).map_err(|e| match e {
        fovea_core::Error::UnknownTable(_) => {
            let mut names: Vec<String> = lake.reader.tables().iter().map(|t| t.name.clone()).collect();
            names.sort();
            let known = if names.is_empty() { "none".to_owned() } else { names.join(", ") };
            Box::<dyn std::error::Error + Send + Sync>::from(format!("{e} (the lake's tables: {known})"))
        }
        e => e.into(),
    })?;
    let batches = lake.reader.scan(table, ScanOptions::default())?.collect_batches()?;
    let mut rows = Vec::new();
    for b in &batches {
        rows.extend(rows_from_batch(b)?);
    }
    rows.sort_by_cached_key(|r| encode_row_key(&def, r));
    let shown: Vec<usize> = (0..def.schema.fields().len())
        .filter(|&i| !def.schema.field(i).name().starts_with(fovea_sql::HIDDEN_PREFIX))
        .collect();
    let names: Vec<String> = shown.iter().map(|&i| csv_field(Some(def.schema.field(i).name()))).collect();
    writeln!(out, "{}", names.join(","))?;
    for r in rows {
        let fields: Vec<String> =
            shown.iter().map(|&i| csv_field(format_value(&r[i], def.schema.field(i).data_type()).as_deref())).collect();
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
