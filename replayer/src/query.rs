//! `fovea sql` and `fovea history`.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use fovea_core::cdc::types::format_value;
use fovea_core::location::OpenReader;
use fovea_core::reader::CheckpointReader;
use fovea_core::scan_worker::SplitWorker;
use fovea_core::schema::rows_from_batch;
use fovea_core::{SnapshotTables, Value};

use crate::lakes::LakeArgs;
use crate::replay::{CliResult, csv_field};

/// Output format of `fovea sql`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned table.
    Table,
    /// CSV with a header (NULL as an empty field).
    Csv,
    /// One JSON object per row.
    Json,
}

/// Runs one SQL statement against the lake at its newest (or a past) snapshot.
pub fn sql(
    lake: &LakeArgs,
    as_of: Option<u64>,
    scan: Option<&str>,
    format: OutputFormat,
    text: &str,
    out: &mut dyn Write,
) -> CliResult<()> {
    let opened = lake.open_read()?;
    check_as_of(&opened.reader, as_of)?;
    let worker = scan_worker(lake, &opened, scan)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    run_one(&opened, worker.as_ref(), &runtime, format, text, out)
}

/// Where `--scan` runs the splits: `None` in this process, or the Lambda
/// scan function of a `lambda://` URL (for an s3:// lake).
pub(crate) fn scan_worker(
    lake: &LakeArgs,
    opened: &OpenReader,
    scan: Option<&str>,
) -> CliResult<Option<Arc<dyn SplitWorker>>> {
    let store = Arc::clone(opened.reader.lake().store());
    Ok(fovea_aws::lambda::scan_worker(&lake.address(), store, scan)?)
}

/// A reader answers at its checkpoint's snapshot only.
pub(crate) fn check_as_of(reader: &CheckpointReader, as_of: Option<u64>) -> CliResult<()> {
    let qts = reader.qts().get();
    match as_of {
        None => Ok(()),
        Some(ts) if ts == qts => Ok(()),
        Some(ts) if ts < qts => Err(format!(
            "--as-of {ts}: the oldest available ts of a reader of this lake is {qts} (its newest checkpoint); older snapshots are answered by fovea serve while a query holds them"
        )
        .into()),
        Some(ts) => Err(format!(
            "--as-of {ts}: a reader of this lake answers as of its newest checkpoint (ts {qts}); newer snapshots are answered by the running fovea serve (fovea sql --connect URL)"
        )
        .into()),
    }
}

fn run_one(
    lake: &OpenReader,
    worker: Option<&Arc<dyn SplitWorker>>,
    runtime: &tokio::runtime::Runtime,
    format: OutputFormat,
    text: &str,
    out: &mut dyn Write,
) -> CliResult<()> {
    let started_us = fovea_core::catalog::now_us();
    let source = Arc::clone(&lake.reader) as Arc<dyn SnapshotTables>;
    let answer = runtime.block_on(fovea_sql::answer(source, worker.cloned(), text))?;
    write_batches(Some(answer.schema), &answer.batches, format, out)?;
    if format == OutputFormat::Table {
        eprintln!("{}", freshness_line(lake, started_us));
    }
    Ok(())
}

/// Runs one SQL statement on a running `fovea serve` over Flight SQL.
pub fn remote(
    url: &str,
    tls_ca: Option<&Path>,
    token: Option<&str>,
    format: OutputFormat,
    text: &str,
    out: &mut dyn Write,
) -> CliResult<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let batches = runtime
        .block_on(crate::serve::flight::remote_query(url, tls_ca, token, text))
        .map_err(|e| format!("{url}: {}", crate::replay::error_chain(e.as_ref())))?;
    write_batches(None, &batches, format, out)
}

/// `snapshot ts N: newest replayed source commit … (freshness … )`.
fn freshness_line(lake: &OpenReader, now_us: i64) -> String {
    let qts = lake.reader.qts();
    match lake.source_commit {
        Some((ts, commit)) => format!(
            "snapshot ts {}: newest replayed source commit {} UTC (mirror ts {ts}), freshness {:.1} ms",
            qts.get(),
            fovea_core::cdc::types::format_timestamp(commit),
            (now_us - commit) as f64 / 1e3
        ),
        None => format!("snapshot ts {}: no source commit time known", qts.get()),
    }
}

/// An interactive prompt: statements end with `;`, each runs at a fresh
/// snapshot (or at `--as-of`); `\q` or Ctrl-D quits. History is kept in
/// `~/.fovea_history`.
pub fn interactive(lake: &LakeArgs, as_of: Option<u64>, scan: Option<&str>, format: OutputFormat) -> CliResult<()> {
    let opened = lake.open_read()?;
    check_as_of(&opened.reader, as_of)?;
    let worker = scan_worker(lake, &opened, scan)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut editor = rustyline::DefaultEditor::new()?;
    let history = std::env::var_os("HOME").map(|h| Path::new(&h).join(".fovea_history"));
    if let Some(h) = &history {
        // A missing history file is the normal first run.
        let _ = editor.load_history(h);
    }
    println!("fovea sql on {} — statements end with ';', \\q quits", lake.lake);
    let mut statement = String::new();
    loop {
        let prompt = if statement.is_empty() { "fovea> " } else { "   ..> " };
        let line = match editor.readline(prompt) {
            Ok(l) => l,
            Err(rustyline::error::ReadlineError::Interrupted) => {
                statement.clear();
                continue;
            }
            Err(rustyline::error::ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        if statement.is_empty() && line.trim() == "\\q" {
            break;
        }
        statement.push_str(&line);
        statement.push('\n');
        if !line.trim_end().ends_with(';') {
            continue;
        }
        editor.add_history_entry(statement.trim())?;
        let started = std::time::Instant::now();
        let stdout = std::io::stdout();
        match run_one(&opened, worker.as_ref(), &runtime, format, &statement, &mut stdout.lock()) {
            Ok(()) => eprintln!("({:.1} ms)", started.elapsed().as_secs_f64() * 1e3),
            Err(e) => eprintln!("error: {e}"),
        }
        statement.clear();
    }
    if let Some(h) = &history
        && let Err(e) = editor.save_history(h)
    {
        eprintln!("warning: could not save history to {}: {e}", h.display());
    }
    Ok(())
}

/// Prints an answer; `schema` gives its columns when no batch came (an
/// empty answer still has its header).
fn write_batches(
    schema: Option<arrow::datatypes::SchemaRef>,
    batches: &[RecordBatch],
    format: OutputFormat,
    out: &mut dyn Write,
) -> CliResult<()> {
    let schema = batches.first().map(RecordBatch::schema).or(schema);
    match format {
        OutputFormat::Table => match schema {
            Some(schema) => {
                writeln!(out, "{}", arrow::util::pretty::pretty_format_batches_with_schema(schema, batches)?)?;
            }
            None => writeln!(out, "{}", arrow::util::pretty::pretty_format_batches(batches)?)?,
        },
        OutputFormat::Csv | OutputFormat::Json => {
            let Some(schema) = schema else { return Ok(()) };
            let types: Vec<_> = schema.fields().iter().map(|f| f.data_type().clone()).collect();
            if format == OutputFormat::Csv {
                let names: Vec<String> = schema.fields().iter().map(|f| csv_field(Some(f.name()))).collect();
                writeln!(out, "{}", names.join(","))?;
            }
            for b in batches {
                for row in rows_from_batch(b)? {
                    match format {
                        OutputFormat::Csv => {
                            let fields: Vec<String> =
                                row.iter().zip(&types).map(|(v, t)| csv_field(format_value(v, t).as_deref())).collect();
                            writeln!(out, "{}", fields.join(","))?;
                        }
                        _ => {
                            let obj: serde_json::Map<String, serde_json::Value> = schema
                                .fields()
                                .iter()
                                .zip(row.iter().zip(&types))
                                .map(|(f, (v, t))| {
                                    let j = match v {
                                        Value::Null => serde_json::Value::Null,
                                        Value::Bool(b) => (*b).into(),
                                        Value::Int(i) if t.is_integer() => (*i).into(),
                                        Value::Float(x) => {
                                            serde_json::Number::from_f64(*x).map_or(serde_json::Value::Null, Into::into)
                                        }
                                        other => format_value(other, t).map_or(serde_json::Value::Null, Into::into),
                                    };
                                    (f.name().clone(), j)
                                })
                                .collect();
                            writeln!(out, "{}", serde_json::Value::Object(obj))?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Replayed source transactions and catalog operations, newest first,
/// from the catalog alone (no engine, no lake files).
pub fn history(lake: &LakeArgs, table: Option<&str>, limit: usize, out: &mut dyn Write) -> CliResult<()> {
    let catalog = lake.open_catalog()?;
    if let Some(h) = catalog.history(None, 1)?.into_iter().next() {
        let line = match h.commit_us {
            Some(commit) => format!(
                "newest replayed source commit {} UTC (mirror ts {}), freshness {:.1} ms",
                fovea_core::cdc::types::format_timestamp(commit),
                h.ts.get(),
                (fovea_core::catalog::now_us() - commit) as f64 / 1e3
            ),
            None => format!("newest replayed transaction at mirror ts {}: no source commit time known", h.ts.get()),
        };
        writeln!(out, "{line}")?;
    }
    writeln!(
        out,
        "{:>10}  {:<22}  {:<26}  {:>8}  {:>10}  tables",
        "mirror ts", "source txn", "source commit (UTC)", "rows", "latency"
    )?;
    for h in catalog.history(table, limit)? {
        let commit = h.commit_us.map_or_else(|| "-".to_owned(), fovea_core::cdc::types::format_timestamp);
        let latency =
            h.commit_us.map_or_else(|| "-".to_owned(), |c| format!("{:.1} ms", (h.replayed_us - c) as f64 / 1e3));
        let tables: Vec<String> = h.tables.iter().map(|(t, n)| format!("{t}:{n}")).collect();
        writeln!(
            out,
            "{:>10}  {:<22}  {:<26}  {:>8}  {:>10}  {}",
            h.ts.get(),
            h.source_txid,
            commit,
            h.rows,
            latency,
            tables.join(" ")
        )?;
    }
    let ops = catalog.operations(limit)?;
    if !ops.is_empty() {
        writeln!(out, "\ncatalog operations:")?;
        for (version, op) in ops {
            if table.is_some_and(|t| !op.description.ends_with(t)) {
                continue;
            }
            writeln!(out, "  v{version:<6} ts {:<10} {}  {}", op.ts.get(), op.description, op.actions)?;
        }
    }
    Ok(())
}

/// `fovea plan`: the split tasks of a scan of `table` (its `columns`, all
/// when empty) at the lake's newest checkpoint, as one JSON object.
pub fn plan(
    lake: &LakeArgs,
    table: &str,
    columns: &[String],
    limit: Option<usize>,
    out: &mut dyn Write,
) -> CliResult<()> {
    let opened = lake.open_read()?;
    let def = opened.reader.table(table)?;
    let projection = if columns.is_empty() {
        (0..def.schema.fields().len())
            .filter(|&i| !def.schema.field(i).name().starts_with(fovea_sql::HIDDEN_PREFIX))
            .collect()
    } else {
        columns
            .iter()
            .map(|c| def.schema.index_of(c).map_err(|_| format!("table {table} has no column {c}")))
            .collect::<Result<Vec<_>, _>>()?
    };
    let options = fovea_core::ScanOptions { projection: Some(projection), ..Default::default() };
    let scan = opened.reader.scan(table, options)?.with_limit(limit);
    let mut schema = Vec::new();
    arrow_ipc::writer::StreamWriter::try_new(&mut schema, &scan.schema())?.finish()?;
    let plan = serde_json::json!({
        "query": fovea_sql::RemoteScans::new_query_id(),
        "lake": lake.lake,
        "qts": opened.reader.qts().get(),
        "schema": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, schema),
        "tasks": scan.tasks()?,
    });
    serde_json::to_writer(&mut *out, &plan)?;
    writeln!(out)?;
    Ok(())
}

/// `fovea iceberg`: publishes the lake's newest checkpoint as Iceberg
/// tables, registered as a reader meanwhile (the writer keeps the files
/// it names), and says what it published.
pub fn publish_iceberg(
    lake: &LakeArgs,
    format: Option<fovea_iceberg::FormatVersion>,
    catalog: Option<&str>,
) -> CliResult<()> {
    let open = lake.open_read()?;
    let Some(checkpoint) = &open.checkpoint else {
        return Err(format!("the lake {} has no checkpoint yet: nothing to publish", lake.lake).into());
    };
    let store = std::sync::Arc::clone(open.reader.lake().store());
    let publisher =
        crate::lakes::iceberg_publisher(lake, store, format, catalog)?.with_readers(std::sync::Arc::clone(&open.txn));
    let p = publisher.publish(checkpoint)?;
    println!(
        "checkpoint at mirror ts {}: {} tables published, {} already current, {} delete files written, {} bytes written, {} old objects deleted",
        checkpoint.manifest.checkpoint_ts,
        p.tables,
        p.current,
        p.delete_files_written,
        p.bytes_written,
        p.objects_deleted
    );
    for t in checkpoint.manifest.tables.iter().filter(|t| !t.dropped) {
        println!("  {}  {}", t.name, publisher.table_location(&t.name));
    }
    if p.refused.is_empty() {
        Ok(())
    } else {
        let reasons: Vec<String> = p.refused.iter().map(ToString::to_string).collect();
        Err(format!("{} tables not published: {}", p.refused.len(), reasons.join("; ")).into())
    }
}
