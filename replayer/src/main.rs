//! `fovea`: the replayer service and command line.

use fovea_replayer::{cli_values, demo, lakes, query, replay, serve, status, tls};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

fovea_replayer::process_settings!(readers: [b"sql", b"export", b"history"], servers: [b"serve"]);

/// fovea replays a database's change stream into a Parquet lakehouse with
/// snapshot isolation and millisecond freshness.
#[derive(Parser)]
#[command(name = "fovea", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The embedded main job in one process: generate a HyBench-like stream,
    /// replay it at a given rate while queries run, and report throughput,
    /// freshness, query overhead and memory.
    Demo {
        /// Lake directory (created; a previous demo lake there is replaced).
        #[arg(long, default_value = "fovea-demo-lake")]
        lake: PathBuf,
        /// How long to replay.
        #[arg(long, default_value_t = 60, value_parser = cli_values::at_least_one::<u64>)]
        seconds: u64,
        /// Target replay rate in changed rows per second.
        #[arg(long, default_value_t = 50_000, value_parser = cli_values::at_least_one::<u64>)]
        rate: u64,
        /// Print the report as JSON: the summary fields, then `windows`,
        /// the same series per 10 s window (start_s, rows_per_s,
        /// freshness_p50_ms, freshness_p99_ms, query_p50_ms, lake_bytes).
        #[arg(long)]
        json: bool,
    },
    /// Replay a change stream into a lake, to the end of the input.
    /// Rerunning continues from the last checkpoint; a finished input
    /// changes nothing.
    Replay {
        #[command(flatten)]
        lake: lakes::LakeArgs,
        #[command(flatten)]
        functions: lakes::FunctionsArgs,
        #[command(flatten)]
        iceberg: lakes::IcebergArgs,
        /// Input: a JSON-lines file (plain or .gz), - for standard input, or
        /// kinesis://STREAM[,STREAM…][?format=auto|debezium|dms&start=trim_horizon|latest&atomic=false&poll_ms=N&max_held_mb=N&consumer=NAME]
        /// (read until every shard is at its tip).
        #[arg(long)]
        input: String,
        /// Input format.
        #[arg(long, default_value = "auto")]
        format: fovea_core::cdc::InputFormat,
        /// CREATE TABLE statements overriding inferred types and keys.
        #[arg(long)]
        schema_file: Option<PathBuf>,
        /// Checkpoint after this many transactions (also every 10 s and at the
        /// end). Checkpoints are written in the background, one at a time:
        /// one falling due while another is written starts when it commits.
        #[arg(long, default_value_t = 50_000, value_parser = cli_values::at_least_one::<u64>)]
        checkpoint_txns: u64,
        /// Shards (default: the number of cores).
        #[arg(long, value_parser = cli_values::at_least_one::<usize>)]
        shards: Option<usize>,
        /// Rows per write-buffer block and row group.
        #[arg(long, default_value_t = fovea_core::buffer::DEFAULT_BLOCK_ROWS, value_parser = cli_values::at_least_one::<usize>)]
        block_rows: usize,
        /// Blocks per file (a full file is combined; storage GC rewrites combined files).
        #[arg(long, default_value_t = fovea_core::buffer::DEFAULT_BLOCKS_PER_FILE, value_parser = cli_values::at_least_one::<usize>)]
        blocks_per_file: usize,
        /// Seconds the lake's lease lasts without renewal (see `fovea serve --help`).
        #[arg(long, default_value_t = 15.0)]
        lease_secs: f64,
        /// Days of catalog history (versions, operations, replayed
        /// transactions) kept; older ones are pruned after checkpoints
        /// (`forever`: none).
        #[arg(long, default_value_t = replay::HistoryDays::default())]
        history_days: replay::HistoryDays,
    },
    /// Write a table's visible rows as CSV to standard output.
    Export {
        #[command(flatten)]
        lake: lakes::LakeArgs,
        /// Table, `schema.table`.
        #[arg(long)]
        table: String,
        /// Mirror timestamp to read at (default: the newest).
        #[arg(long)]
        as_of: Option<u64>,
        /// Output format (csv).
        #[arg(long, default_value = "csv")]
        format: String,
    },
    /// Run SQL against the lake's live tables (one snapshot for the whole query).
    Sql {
        /// The lake: a directory or s3://BUCKET/PREFIX (or --connect to a
        /// running `fovea serve`).
        #[arg(long, required_unless_present = "connect", conflicts_with = "connect")]
        lake: Option<String>,
        /// The lake's state: dynamodb://TABLE (see `fovea replay --help`).
        #[arg(long, env = "FOVEA_STATE")]
        state: Option<String>,
        /// Fail instead of creating a missing DynamoDB state table.
        #[arg(long)]
        no_create: bool,
        /// A `fovea serve` Flight SQL address, e.g. grpc://127.0.0.1:50051,
        /// or grpc+tls://HOST:PORT for a server with --tls-cert.
        #[arg(long)]
        connect: Option<String>,
        /// PEM root certificate(s) to trust for grpc+tls:// (default: the
        /// system's roots).
        #[arg(long, requires = "connect")]
        tls_ca: Option<std::path::PathBuf>,
        /// Bearer token for --connect.
        #[arg(long, env = "FOVEA_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Mirror timestamp to read at (time travel; default: the newest).
        #[arg(long)]
        as_of: Option<u64>,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: query::OutputFormat,
        /// Where scans run: in this process (default), or
        /// lambda://FUNCTION[?concurrency=N&timeout_s=S&inline_kb=K] to fan
        /// each query's splits out to the fovea-scan Lambda function
        /// (an s3:// lake; AWS_ENDPOINT_URL_LAMBDA honoured).
        #[arg(long, requires = "lake")]
        scan: Option<String>,
        /// The SQL statement (without it: an interactive prompt).
        sql: Option<String>,
    },
    /// The replayer as a service: follow an input (a growing JSON-lines
    /// file, or PostgreSQL logical replication), serve Flight SQL, the
    /// visibility RPC and Prometheus metrics, run GC and checkpoints, until
    /// SIGINT/SIGTERM (then a final checkpoint).
    Serve(Box<serve::ServeArgs>),
    /// The split tasks of one table scan at the lake's newest checkpoint,
    /// as JSON (for a client that runs the splits itself, e.g. on the Lambda
    /// scan function): {"query", "lake", "qts", "schema" (Arrow IPC, base64),
    /// "tasks"}.
    Plan {
        #[command(flatten)]
        lake: lakes::LakeArgs,
        /// The table (schema.table).
        #[arg(long)]
        table: String,
        /// Columns to read, comma-separated (default: all).
        #[arg(long, value_delimiter = ',')]
        columns: Vec<String>,
        /// Rows wanted at most.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Publish the lake's newest checkpoint as Iceberg tables now (what
    /// `--iceberg` on replay and serve does after every checkpoint), beside
    /// a running replayer or without one.
    Iceberg {
        #[command(flatten)]
        lake: lakes::LakeArgs,
        /// Iceberg format: v2 (position delete files) or v3 (deletion
        /// vectors). Default: v2, and a table published in v3 already
        /// stays in v3.
        #[arg(long, value_name = "FORMAT", value_parser = fovea_iceberg::FormatVersion::parse)]
        format: Option<fovea_iceberg::FormatVersion>,
        /// Also register the tables in a catalog: glue://DATABASE (the AWS
        /// Glue Data Catalog; the database must exist).
        #[arg(long, value_name = "CATALOG")]
        iceberg_catalog: Option<String>,
    },
    /// How the lake stands, from its state store and catalog alone (no
    /// engine restored, no reader registered): the writer's lease, the
    /// watermarks, the newest replayed transaction and checkpoint,
    /// registered readers, and per table its files, deleted rows,
    /// storage-GC backlog and Iceberg publication.
    Status {
        #[command(flatten)]
        lake: lakes::LakeArgs,
        /// A file with at least this share of its rows deleted counts as
        /// storage-GC backlog (serve's --storage-gc-threshold).
        #[arg(long, default_value_t = 0.3, value_parser = cli_values::share)]
        storage_gc_threshold: f64,
        /// Also read the replayer's input (the URL serve follows:
        /// kinesis://… or postgres://…): per shard, how far behind its
        /// newest record the checkpoint is; for a slot, the WAL from the
        /// checkpoint and from the slot's confirmed position to now.
        #[arg(long)]
        input: Option<String>,
        /// One JSON object instead of the screen.
        #[arg(long)]
        json: bool,
    },
    /// Replayed source transactions and catalog operations, newest first.
    History {
        #[command(flatten)]
        lake: lakes::LakeArgs,
        /// Only transactions touching this table.
        #[arg(long)]
        table: Option<String>,
        /// At most this many rows.
        #[arg(long, default_value_t = 20, value_parser = cli_values::at_least_one::<usize>)]
        limit: usize,
    },
    /// Benchmarks and synthetic workloads: runs the `fovea-bench` binary
    /// beside this one (or on PATH) with the remaining arguments, e.g.
    /// `fovea bench replay --json` or `fovea bench gen hybench`. The product
    /// binary holds none of their code.
    #[command(disable_help_flag = true)]
    Bench {
        /// Arguments for `fovea-bench`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("FOVEA_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    tls::install_crypto_provider();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { lake, seconds, rate, json } => {
            demo::run(&demo::DemoOptions { lake, seconds, rate, quiet: false, json })
        }
        Command::Replay {
            lake,
            functions,
            iceberg,
            input,
            format,
            schema_file,
            checkpoint_txns,
            shards,
            block_rows,
            blocks_per_file,
            lease_secs,
            history_days,
        } => {
            serve::lease_time(lease_secs).and_then(|lease| {
                let args = replay::ReplayArgs {
                    lake,
                    functions,
                    iceberg,
                    backends: None,
                    input,
                    format,
                    schema_file,
                    checkpoint_txns,
                    shards,
                    blocks: Some((block_rows, blocks_per_file)),
                    lease,
                    progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
                    history: history_days,
                };
                replay::replay(&args)
            })
            .map(|s| {
                println!(
                    "replayed {} transactions ({} already applied, skipped), {} rows in {:.2} s = {:.0} rows/s; {} checkpoints; {:.2} s CPU",
                    s.stats.applied,
                    s.stats.skipped,
                    s.stats.rows,
                    s.elapsed.as_secs_f64(),
                    s.stats.rows as f64 / s.elapsed.as_secs_f64().max(1e-9),
                    s.stats.checkpoints,
                    serve::metrics::cpu_seconds().unwrap_or(f64::NAN)
                );
            })
        }
        Command::Export { lake, table, as_of, format } => {
            if format != "csv" {
                Err(format!("unknown export format {format:?}: only csv is supported").into())
            } else {
                let stdout = std::io::stdout();
                let mut out = std::io::BufWriter::new(stdout.lock());
                replay::export(&lake, &table, as_of, &mut out).and_then(|()| {
                    std::io::Write::flush(&mut out)?;
                    Ok(())
                })
            }
        }
        Command::Sql { lake, state, no_create, connect, tls_ca, token, as_of, format, scan, sql } => {
            let lake = lake.map(|lake| lakes::LakeArgs { lake, state, no_create });
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            match (lake, connect, sql) {
                (_, Some(url), Some(sql)) if as_of.is_none() => {
                    query::remote(&url, tls_ca.as_deref(), token.as_deref(), format, &sql, &mut out)
                        .and_then(|()| Ok(std::io::Write::flush(&mut out)?))
                }
                (_, Some(_), Some(_)) => Err("--as-of is not available with --connect".into()),
                (_, Some(_), None) => Err("--connect needs a SQL statement".into()),
                (Some(lake), None, Some(sql)) => {
                    query::sql(&lake, as_of, scan.as_deref(), format, &sql, &mut out).and_then(|()| Ok(std::io::Write::flush(&mut out)?))
                }
                (Some(lake), None, None) => query::interactive(&lake, as_of, scan.as_deref(), format),
                (None, None, _) => Err("give --lake DIR or --connect URL".into()),
            }
        }
        Command::Serve(args) => serve::serve(*args, std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false))),
        Command::Plan { lake, table, columns, limit } => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            query::plan(&lake, &table, &columns, limit, &mut out).and_then(|()| Ok(std::io::Write::flush(&mut out)?))
        }
        Command::History { lake, table, limit } => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            query::history(&lake, table.as_deref(), limit, &mut out).and_then(|()| Ok(std::io::Write::flush(&mut out)?))
        }
        Command::Status { lake, storage_gc_threshold, input, json } => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            status::status(&lake, input.as_deref(), storage_gc_threshold, json, &mut out)
                .and_then(|()| Ok(std::io::Write::flush(&mut out)?))
        }
        Command::Iceberg { lake, format, iceberg_catalog } => {
            query::publish_iceberg(&lake, format, iceberg_catalog.as_deref())
        }
        Command::Bench { args } => return bench(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `fovea bench ARGS…`: `fovea-bench ARGS…`, the binary next to this one
/// first (`cargo build` puts both in one directory), then PATH; its exit
/// status is this one's.
fn bench(args: &[std::ffi::OsString]) -> ExitCode {
    let beside = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join("fovea-bench")));
    let program = beside.filter(|p| p.is_file()).unwrap_or_else(|| PathBuf::from("fovea-bench"));
    match std::process::Command::new(&program).args(args).status() {
        Ok(status) => status.code().and_then(|c| u8::try_from(c).ok()).map_or(ExitCode::FAILURE, ExitCode::from),
        Err(e) => {
            eprintln!(
                "error: fovea bench runs the fovea-bench binary ({}: {e}); build it with \
                 `cargo build --release -p fovea-bench`, or run `cargo run --release -p fovea-bench -- …`",
                program.display()
            );
            ExitCode::FAILURE
        }
    }
}
