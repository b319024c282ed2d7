//! `fovea-bench iceberg`: what publishing checkpoints as Iceberg costs and
//! what reading them through Iceberg gives, in one run.
//!
//! * Publication: a table of `rows` rows, `changed` of them updated
//!   between checkpoints; each checkpoint written as the sink writes it,
//!   then published (format 2 and 3 side by side, on one lake each). Per
//!   checkpoint: the publication's time against the checkpoint's own write
//!   time, and the bytes it wrote (deletes and metadata: data files are the
//!   lake's) against the bytes of the rows the checkpoint changed.
//! * Replay: one generated HyBench stream replayed into fresh lakes with
//!   publication off and on (format 3), alternately; the medians' ratio.
//! * Reading: DuckDB's iceberg extension counting and aggregating the
//!   published table, beside fovea's SQL on the same lake (each the median
//!   of warm runs in its own process).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use fovea_core::catalog::CheckpointRecord;
use fovea_core::cdc::SourcePosition;
use fovea_core::{Engine, EngineConfig, Op, Value};
use fovea_iceberg::{FormatVersion, Publisher};
use fovea_replayer::replay::CliResult;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde_json::json;

use crate::gc::{row, schema};
use crate::scan::median;

/// Options of `fovea-bench iceberg`.
pub struct IcebergBenchArgs {
    /// Rows of the published table.
    pub rows: usize,
    /// Fraction of them updated between two checkpoints.
    pub changed: f64,
    /// Checkpoints published after the first.
    pub checkpoints: usize,
    /// Transactions of the replayed HyBench stream.
    pub txns: u64,
    /// Replays with and without publication (medians reported).
    pub runs: usize,
    /// Transactions between two checkpoints of the replays.
    pub checkpoint_txns: u64,
    /// Print one JSON object.
    pub json: bool,
}

const TABLE: &str = "bench.orders";

/// Bytes of one row as the lake's files hold it, roughly (for the ratio
/// of what publication writes to what changed).
const ROW_BYTES: f64 = 8.0 * 3.0 + 14.0;

/// What publishing one format measured.
struct Publication {
    first_ms: f64,
    publish_ms: f64,
    checkpoint_ms: f64,
    bytes: f64,
    delete_files: f64,
}

/// Runs the benchmark and prints its report.
pub fn run(args: &IcebergBenchArgs) -> CliResult<()> {
    let changed_rows = ((args.rows as f64 * args.changed).round() as usize).max(1);
    let mut publications = Vec::new();
    let mut read = None;
    for format in [FormatVersion::V2, FormatVersion::V3] {
        let dir = tempfile::tempdir()?;
        let (p, engine) = publish_rounds(dir.path(), format, args.rows, changed_rows, args.checkpoints)?;
        if format == FormatVersion::V3 {
            read = Some(read_through_iceberg(dir.path(), &engine)?);
        }
        publications.push((format, p));
    }
    let (without_runs, with_runs, publications_per_s) =
        replay_with_and_without(args.txns, args.runs, args.checkpoint_txns)?;
    let (without, with) = (median(&mut without_runs.clone()), median(&mut with_runs.clone()));
    let read = read.expect("format 3 was published");

    let changed_bytes = changed_rows as f64 * ROW_BYTES;
    let mut out = json!({
        "rows": args.rows,
        "changed_per_checkpoint": changed_rows,
        "checkpoints": args.checkpoints,
        "replay_txns": args.txns,
        "replay_rows_per_s_without": without,
        "replay_rows_per_s_with_v3": with,
        "replay_with_over_without": with / without,
        "replay_runs_without": without_runs,
        "replay_runs_with_v3": with_runs,
        "replay_checkpoint_txns": args.checkpoint_txns,
        "replay_publications_per_s": publications_per_s,
        "read": read,
    });
    for (format, p) in &publications {
        let v = format!("v{}", format.number());
        out[&v] = json!({
            "first_publication_ms": p.first_ms,
            "publish_ms": p.publish_ms,
            "checkpoint_ms": p.checkpoint_ms,
            "publish_over_checkpoint": p.publish_ms / p.checkpoint_ms,
            "bytes_per_checkpoint": p.bytes,
            "bytes_over_changed_row_bytes": p.bytes / changed_bytes,
            "delete_files_per_checkpoint": p.delete_files,
        });
    }
    if args.json {
        println!("{out}");
        return Ok(());
    }
    println!(
        "Iceberg publication: {} rows, {changed_rows} updated per checkpoint, {} checkpoints (medians)",
        args.rows, args.checkpoints
    );
    for (format, p) in &publications {
        println!(
            "  v{}: {:.1} ms per checkpoint ({:.2}x its checkpoint's {:.1} ms; the first {:.0} ms), {:.0} bytes \
             written ({:.2}x the changed rows' bytes), {:.0} delete files",
            format.number(),
            p.publish_ms,
            p.publish_ms / p.checkpoint_ms,
            p.checkpoint_ms,
            p.first_ms,
            p.bytes,
            p.bytes / changed_bytes,
            p.delete_files
        );
    }
    println!(
        "  replay of {} HyBench txns, a checkpoint every {} txns ({publications_per_s:.1} publications/s): {with:.0} \
         rows/s publishing v3 vs {without:.0} without ({:.3}x; runs {:.0?} vs {:.0?})",
        args.txns,
        args.checkpoint_txns,
        with / without,
        with_runs,
        without_runs
    );
    match read.get("skipped") {
        Some(why) => println!("  reading through Iceberg: skipped ({why})"),
        None => {
            for q in ["count", "aggregate"] {
                let duck = read["duckdb_ms"][q].as_f64().unwrap_or(f64::NAN);
                let fovea = read["fovea_ms"][q].as_f64().unwrap_or(f64::NAN);
                println!(
                    "  {q}: DuckDB through Iceberg {duck:.1} ms, fovea SQL {fovea:.1} ms (DuckDB/fovea {:.2}x)",
                    duck / fovea
                );
            }
        }
    }
    Ok(())
}

/// Loads the table into a lake in `dir`, publishes its first checkpoint,
/// then `checkpoints` times updates `changed` random rows, writes a
/// checkpoint and publishes it.
fn publish_rounds(
    dir: &Path,
    format: FormatVersion,
    rows: usize,
    changed: usize,
    checkpoints: usize,
) -> CliResult<(Publication, Arc<Engine>)> {
    let engine = Engine::open_dir(dir, EngineConfig::default())?;
    let t = engine.create_table(TABLE, schema(), vec![0])?;
    let n = rows as i64;
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        engine.apply(chunk.iter().map(|&k| Op::Insert { table: t.id, row: row(k, k) }).collect())?;
    }
    engine.flush()?;
    engine.combine()?;
    let root = format!("file://{}", std::fs::canonicalize(dir)?.display());
    let publisher = Publisher::new(Arc::clone(engine.lake().store()), &root, format);
    let checkpoint = |engine: &Arc<Engine>| -> CliResult<(CheckpointRecord, f64)> {
        let started = Instant::now();
        let manifest = engine.write_checkpoint()?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        engine.checkpoint_committed(&manifest);
        let record = CheckpointRecord {
            manifest,
            input: "fovea-bench iceberg".into(),
            position: SourcePosition::default(),
            source_state: None,
        };
        Ok((record, ms))
    };
    let (first, _) = checkpoint(&engine)?;
    let started = Instant::now();
    publisher.publish(&first)?;
    let first_ms = started.elapsed().as_secs_f64() * 1e3;

    let mut rng = SmallRng::seed_from_u64(5);
    let (mut publish_ms, mut checkpoint_ms, mut bytes, mut delete_files) = (vec![], vec![], vec![], vec![]);
    for round in 1..=checkpoints {
        let ops: Vec<Op> = (0..changed)
            .map(|_| {
                let k = rng.random_range(0..n);
                Op::Update { table: t.id, key: vec![Value::Int(k)], row: row(k, -(round as i64)) }
            })
            .collect();
        for chunk in ops.chunks(1_000) {
            engine.apply(chunk.to_vec())?;
        }
        let (record, ms) = checkpoint(&engine)?;
        checkpoint_ms.push(ms);
        let started = Instant::now();
        let published = publisher.publish(&record)?;
        publish_ms.push(started.elapsed().as_secs_f64() * 1e3);
        if !published.refused.is_empty() {
            return Err(format!("a table was not published: {:?}", published.refused).into());
        }
        bytes.push(published.bytes_written as f64);
        delete_files.push(published.delete_files_written as f64);
    }
    let publication = Publication {
        first_ms,
        publish_ms: median(&mut publish_ms),
        checkpoint_ms: median(&mut checkpoint_ms),
        bytes: median(&mut bytes),
        delete_files: median(&mut delete_files),
    };
    Ok((publication, engine))
}

/// Rows/s of replaying one HyBench stream without and with publication
/// (format 3, a checkpoint every `checkpoint_txns` transactions): every
/// run of `runs` alternating pairs, without then with, and the
/// publications per second of the runs with.
fn replay_with_and_without(txns: u64, runs: usize, checkpoint_txns: u64) -> CliResult<(Vec<f64>, Vec<f64>, f64)> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("hybench.jsonl");
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&input)?);
        fovea_testkit::workload::generate(fovea_testkit::workload::Workload::Hybench, txns, 7, &mut w)?;
        std::io::Write::flush(&mut w)?;
    }
    let (mut without, mut with, mut publications) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs * 2 {
        let publish = run % 2 == 1;
        let lake = dir.path().join(format!("lake-{run}"));
        let args = fovea_replayer::replay::ReplayArgs {
            lake: fovea_replayer::lakes::LakeArgs::local(&lake),
            functions: Default::default(),
            iceberg: if publish {
                fovea_replayer::lakes::IcebergArgs::format(FormatVersion::V3)
            } else {
                fovea_replayer::lakes::IcebergArgs::off()
            },
            backends: None,
            input: input.display().to_string(),
            format: fovea_core::cdc::InputFormat::Auto,
            schema_file: None,
            checkpoint_txns,
            shards: None,
            blocks: None,
            lease: fovea_core::lease::DEFAULT_LEASE_TTL,
            progress: false,
            history: Default::default(),
        };
        let summary = fovea_replayer::replay::replay(&args)?;
        if summary.stats.publish_failures > 0 {
            return Err(format!("{} checkpoints were not published", summary.stats.publish_failures).into());
        }
        let rate = summary.stats.rows as f64 / summary.elapsed.as_secs_f64();
        if publish {
            with.push(rate);
            publications.push(summary.stats.checkpoints as f64 / summary.elapsed.as_secs_f64());
        } else {
            without.push(rate);
        }
        std::fs::remove_dir_all(&lake)?;
    }
    Ok((without, with, median(&mut publications)))
}

/// The queries both engines run.
const QUERIES: [(&str, &str); 2] = [
    ("count", "SELECT count(*) FROM {table}"),
    ("aggregate", "SELECT b, count(*), sum(a), max(name) FROM {table} WHERE b < 50 GROUP BY b"),
];

/// Median milliseconds of each query in DuckDB through the Iceberg table
/// of the lake at `dir` and in fovea's SQL on its `engine` (which has
/// changed nothing since the published checkpoint), or why DuckDB could
/// not run.
fn read_through_iceberg(dir: &Path, engine: &Arc<Engine>) -> CliResult<serde_json::Value> {
    let location = dir.join(fovea_iceberg::table_dir(TABLE));
    let script = dir.join("duckdb_iceberg.py");
    std::fs::write(&script, include_str!("iceberg_read.py"))?;
    let queries: serde_json::Map<String, serde_json::Value> =
        QUERIES.iter().map(|(name, sql)| ((*name).to_owned(), json!(sql))).collect();
    let python = fovea_testkit::moto::python();
    let output = std::process::Command::new(&python)
        .arg(&script)
        .arg(&location)
        .arg(serde_json::Value::Object(queries).to_string())
        .output();
    let duckdb: serde_json::Value = match output {
        Ok(o) if o.status.success() => serde_json::from_slice(&o.stdout)?,
        Ok(o) => {
            let why = format!("{python}: {}", String::from_utf8_lossy(&o.stderr).trim());
            return Ok(json!({ "skipped": why }));
        }
        Err(e) => return Ok(json!({ "skipped": format!("cannot run {python}: {e}") })),
    };

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut fovea = serde_json::Map::new();
    for (name, sql) in QUERIES {
        let sql = sql.replace("{table}", TABLE);
        let mut times = Vec::new();
        let mut answer = Vec::new();
        for _ in 0..6 {
            let snapshot = engine.snapshot();
            let started = Instant::now();
            let batches = runtime.block_on(fovea_sql::query(engine, &snapshot, &sql))?;
            times.push(started.elapsed().as_secs_f64() * 1e3);
            answer = rows_as_text(&batches)?;
        }
        // The first run warms the caches, as DuckDB's does.
        fovea.insert(name.into(), json!(median(&mut times[1..])));
        if duckdb["rows"][name] != json!(answer) {
            return Err(format!("DuckDB answers {name} with {}, fovea with {answer:?}", duckdb["rows"][name]).into());
        }
    }
    Ok(json!({ "duckdb_ms": duckdb["ms"], "fovea_ms": fovea }))
}

/// Rows of `batches` as lists of text, sorted.
fn rows_as_text(batches: &[arrow::record_batch::RecordBatch]) -> CliResult<Vec<Vec<String>>> {
    use arrow::util::display::{ArrayFormatter, FormatOptions};
    let mut rows = Vec::new();
    for b in batches {
        let options = FormatOptions::default();
        let formatters =
            b.columns().iter().map(|c| ArrayFormatter::try_new(c, &options)).collect::<Result<Vec<_>, _>>()?;
        for r in 0..b.num_rows() {
            rows.push(formatters.iter().map(|f| f.value(r).to_string()).collect());
        }
    }
    rows.sort();
    Ok(rows)
}
