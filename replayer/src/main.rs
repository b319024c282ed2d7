//! `fovea`: the replayer service and command line.

mod bench;
mod bench_gc;
mod bench_kinesis;
mod bench_lambda;
mod bench_scan;
mod demo;
mod input;
mod lakes;
mod latency;
mod query;
mod replay;
mod serve;
mod tls;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The replayer allocates and frees many small objects (decoded records,
/// rows, index keys); glibc's allocator spent a third of replay time in
/// its free lists, mimalloc does not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Memory settings made before anything allocates: a constructor in
/// `.init_array` runs before the Rust runtime starts, and glibc hands it
/// the process's arguments and environment.
///
/// * **Lazy commit for readers.** mimalloc commits its arenas eagerly on
///   Linux by default, and pages freed there then stay resident: a reader
///   process answering one query kept ~40 MB it no longer used (peak RSS
///   107 MB; 69 MB with lazy commit). Replay runs faster with eager commit
///   (~20% less CPU measured), so only the reading commands (`sql`,
///   `export`, `history`, the scan bench's probe) commit lazily.
/// * **No transparent huge pages** unless `MIMALLOC_ALLOW_THP` is set (as
///   mimalloc reads it). mimalloc asks for huge pages, and every first touch
///   of one makes the kernel zero 2 MB: a replay spent about a third of its
///   CPU zeroing pages (perf: `clear_page_erms` under huge-page faults, in
///   every thread). Without them the same replay took 30% less CPU
///   (hybench, 60,000 transactions: 7.1–7.5 s against 4.7–5.7 s).
/// * **Quick purging for the server.** `fovea serve` returns the pages it
///   frees to the OS after 2 ms (mimalloc's `purge_delay`, 10 ms by
///   default; `MIMALLOC_PURGE_DELAY` overrides it): with the default,
///   pages freed by bursts (an initial copy, a checkpoint's images, a
///   combine's row groups) stayed resident, and `fovea bench serve` peaked
///   at 167–179 MB against 139 MB with 2 ms and 131–137 MB with 0 (pgbench
///   -s 10, 1.09M live rows). The price is system time for the purges
///   (the initial copy took 1.6 s with 2 ms, 1.9–2.0 s with 0, 1.3–1.4 s
///   with 10; `bench replay` took 3.3–3.9 s of system CPU with 0 against
///   1.9 s), so batch commands keep the default.
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static MEMORY_SETTINGS: extern "C" fn(std::ffi::c_int, *const *const std::ffi::c_char, *const *const std::ffi::c_char) = {
    extern "C" fn memory_settings(
        argc: std::ffi::c_int,
        argv: *const *const std::ffi::c_char,
        envp: *const *const std::ffi::c_char,
    ) {
        let env_has = |name: &[u8]| {
            (0..)
                .map_while(|i| {
                    // SAFETY: glibc passes the environment: a NULL-terminated
                    // array of NUL-terminated strings, valid here.
                    let entry = if envp.is_null() { std::ptr::null() } else { unsafe { *envp.add(i) } };
                    // SAFETY: non-null entries are NUL-terminated strings (above).
                    (!entry.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(entry) }.to_bytes())
                })
                .any(|e| e.strip_prefix(name).is_some_and(|rest| rest.starts_with(b"=")))
        };
        let thp_chosen = env_has(b"MIMALLOC_ALLOW_THP");
        if !thp_chosen {
            // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and
            // sets a flag of this process's memory map. Its result is left:
            // a kernel without it keeps huge pages, which is only slower.
            let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        }
        // `mi_option_arena_eager_commit` in mimalloc.h (v2 and v3 alike);
        // libmimalloc-sys does not name it.
        const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
        let arg = |i: std::ffi::c_int| -> &[u8] {
            if argv.is_null() || i >= argc {
                return b"";
            }
            // SAFETY: glibc passes main's argc and argv: argv[0..argc] are
            // valid NUL-terminated strings for the life of the process.
            unsafe { std::ffi::CStr::from_ptr(*argv.add(i as usize)) }.to_bytes()
        };
        let reader =
            matches!(arg(1), b"sql" | b"export" | b"history") || (arg(1) == b"bench" && arg(2) == b"scan-probe");
        if reader {
            // SAFETY: mi_option_set only stores the value in mimalloc's
            // option table; it takes no pointers, nothing else runs yet.
            unsafe { libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0) }
        }
        // `mi_option_purge_delay` in mimalloc.h (v2 and v3 alike).
        const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
        let server = arg(1) == b"serve" || (arg(1) == b"bench" && arg(2) == b"serve");
        if server && !env_has(b"MIMALLOC_PURGE_DELAY") {
            // SAFETY: as above.
            unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 2) }
        }
    }
    memory_settings
};

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
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Target replay rate in changed rows per second.
        #[arg(long, default_value_t = 50_000)]
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
        /// Input: a JSON-lines file (plain or .gz), - for standard input, or
        /// kinesis://STREAM[,STREAM…][?format=auto|debezium|dms&start=trim_horizon|latest&atomic=false&poll_ms=N&max_held_mb=N]
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
        #[arg(long, default_value_t = 50_000)]
        checkpoint_txns: u64,
        /// Shards (default: the number of cores).
        #[arg(long)]
        shards: Option<usize>,
        /// Rows per write-buffer block and row group.
        #[arg(long, default_value_t = fovea_core::buffer::DEFAULT_BLOCK_ROWS)]
        block_rows: usize,
        /// Blocks per file (a full file is combined; storage GC rewrites combined files).
        #[arg(long, default_value_t = fovea_core::buffer::DEFAULT_BLOCKS_PER_FILE)]
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
    Serve(serve::ServeArgs),
    /// The split tasks of one table scan at the lake's newest checkpoint,
    /// as JSON (for workers elsewhere: the Lambda scan function through
    /// clients/python): {"query", "lake", "qts", "schema" (Arrow IPC, base64),
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
    /// Replayed source transactions and catalog operations, newest first.
    History {
        #[command(flatten)]
        lake: lakes::LakeArgs,
        /// Only transactions touching this table.
        #[arg(long)]
        table: Option<String>,
        /// At most this many rows.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Write a synthetic Debezium stream (Kafka-style lines with BEGIN/END).
    Gen {
        /// Workload shape.
        #[arg(value_enum)]
        workload: workload::Workload,
        /// Transactions after the initial load.
        #[arg(long, default_value_t = 10_000)]
        txns: u64,
        /// Random seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output file (default: standard output).
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Benchmarks, measured in one run on this machine.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Storage GC: lake size and query latency on a table with half its
    /// stored rows stale, before and after one round; the round's rows/s;
    /// replay rows/s with storage GC running beside it vs without.
    Gc {
        /// Rows of the table.
        #[arg(long, default_value_t = 1_000_000)]
        rows: usize,
        /// Seconds of each replay run.
        #[arg(long, default_value_t = 6.0)]
        seconds: f64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Throughput and memory of the core structures.
    Components {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Small sizes (a smoke run, seconds even in debug builds).
        #[arg(long)]
        quick: bool,
    },
    /// Freshness (HyBench method: query start − newest visible fresh_ts)
    /// with a query loop running, replaying at a fixed rate.
    Freshness {
        /// Target replay rate, rows per second.
        #[arg(long, default_value_t = 100_000)]
        rate: u64,
        /// Duration.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Query cost of live data (vs a static copy) and replay cost of queries.
    Query {
        /// Rows of the queried table.
        #[arg(long, default_value_t = 2_000_000)]
        rows: usize,
        /// Rounds of replay windows, one per query load (none, 1 and 10
        /// queries/s, back to back), 2 s each; ratios are medians over
        /// rounds.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
        rounds: u32,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// pgbench against a throwaway local PostgreSQL 15 while `fovea serve`
    /// follows its slot: rows/s replayed, freshness P50/P99 (from the
    /// metric), RSS.
    Serve {
        /// PostgreSQL server binaries.
        #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
        pg_bin: PathBuf,
        /// pgbench scale (100,000 accounts each).
        #[arg(long, default_value_t = 10)]
        scale: u32,
        /// pgbench clients.
        #[arg(long, default_value_t = 4)]
        clients: u32,
        /// Seconds of pgbench load.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// pgbench transactions per second (0: unthrottled; on two cores
        /// pgbench, PostgreSQL and fovea then compete for the CPU).
        #[arg(long, default_value_t = 1000)]
        rate: u32,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// The HyBench stream through a local multi-shard Kinesis vs from a
    /// file, in one run (rows/s ratio), and freshness P50/P99 while the
    /// records are put (Kinesis: AWS_ENDPOINT_URL_KINESIS, else a
    /// kinesalite started for the run).
    Kinesis {
        /// Transactions.
        #[arg(long, default_value_t = 20_000)]
        txns: u64,
        /// Shards of the stream.
        #[arg(long, default_value_t = 4)]
        shards: i32,
        /// Records per second put while `fovea serve` follows (Kinesis
        /// takes 1,000 per second per shard).
        #[arg(long, default_value_t = 2_000)]
        rate: u64,
        /// Longest the followed load runs.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Readers on a replayed lake: start-up latency and peak RSS of a
    /// fresh process (count of the smallest table, LIMIT 10 of the
    /// largest) reading as of the checkpoint vs restoring the engine, and
    /// full-scan rows/s vs DataFusion on the same Parquet files.
    Scan {
        /// Transactions of the generated HyBench stream.
        #[arg(long, default_value_t = 200_000)]
        txns: u64,
        /// Processes per start-up measurement (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// lambda://FUNCTION: instead, a full-table aggregation in process
        /// and through N = 1, 4, 16 invocations of the scan function
        /// (local moto + cargo lambda watch unless --lake is given).
        #[arg(long)]
        scan: Option<String>,
        /// Rows of the table the Lambda scans read.
        #[arg(long, default_value_t = 10_000_000, requires = "scan")]
        rows: u64,
        /// An existing s3:// lake for the Lambda scans (with --state).
        #[arg(long, requires_all = ["scan", "state"])]
        lake: Option<String>,
        /// The state of --lake (dynamodb://TABLE).
        #[arg(long, requires = "lake")]
        state: Option<String>,
    },
    /// One reader process of `fovea bench scan` (prints rows and peak RSS).
    #[command(hide = true)]
    ScanProbe {
        /// How to open the lake.
        #[arg(long, value_enum)]
        mode: bench_scan::ProbeMode,
        /// The lake directory.
        #[arg(long)]
        lake: PathBuf,
        /// The query.
        sql: String,
    },
    /// End-to-end replay throughput: generate a stream to a file, replay it
    /// into a fresh lake, report rows/s (and the decode share).
    Replay {
        /// Workload shape.
        #[arg(long, value_enum, default_value = "hybench")]
        workload: workload::Workload,
        /// Transactions.
        #[arg(long, default_value_t = 200_000)]
        txns: u64,
        /// Replays of the stream into a fresh local lake each: `rows_per_s`
        /// and `cpu_us_per_row` are the medians, every run is listed (on a
        /// shared host one run's figure can be off by a third).
        #[arg(long, default_value_t = 1)]
        runs: usize,
        /// Also replay into this lake (s3://BUCKET/PREFIX; a fresh prefix
        /// per run) and compare with the local lake of the same run.
        #[arg(long)]
        lake: Option<String>,
        /// The state of --lake: dynamodb://TABLE (a fresh table per run).
        #[arg(long)]
        state: Option<String>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
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
        Command::Serve(args) => serve::serve(args, std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false))),
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
        Command::Gen { workload, txns, seed, output } => {
            let result = match output {
                Some(p) => std::fs::File::create(&p)
                    .map_err(|e| std::io::Error::new(e.kind(), format!("cannot create {}: {e}", p.display())))
                    .and_then(|f| {
                        let mut w = std::io::BufWriter::new(f);
                        workload::generate(workload, txns, seed, &mut w)?;
                        std::io::Write::flush(&mut w)
                    }),
                None => {
                    let mut w = std::io::BufWriter::new(std::io::stdout().lock());
                    workload::generate(workload, txns, seed, &mut w).and_then(|()| std::io::Write::flush(&mut w))
                }
            };
            result.map_err(Into::into)
        }
        Command::Bench { which: BenchCommand::Replay { workload, txns, runs, lake, state, json } } => {
            bench::replay(workload, txns, runs.max(1), lake.map(|lake| bench::RemoteLake { lake, state }), json)
        }
        Command::Bench { which: BenchCommand::Freshness { rate, seconds, json } } => {
            bench::freshness(rate, seconds, json)
        }
        Command::Bench { which: BenchCommand::Query { rows, rounds, json } } => bench::query(rows, rounds as usize, json),
        Command::Bench { which: BenchCommand::Scan { json, scan: Some(target), rows, lake, state, .. } } => {
            bench_lambda::run(&bench_lambda::LambdaScanBench { target, rows, lake: lake.zip(state), json })
        }
        Command::Bench { which: BenchCommand::Scan { txns, runs, json, scan: None, .. } } => {
            bench_scan::run(&bench_scan::ScanBench { txns, runs: runs.max(1), json })
        }
        Command::Bench { which: BenchCommand::ScanProbe { mode, lake, sql } } => bench_scan::probe(mode, &lake, &sql),
        Command::Bench { which: BenchCommand::Kinesis { txns, shards, rate, seconds, json } } => {
            bench_kinesis::run(&bench_kinesis::KinesisBench { txns, shards, rate, seconds, json })
        }
        Command::Bench { which: BenchCommand::Serve { pg_bin, scale, clients, seconds, rate, json } } => {
            serve::bench::serve_bench(&serve::bench::ServeBenchArgs { pg_bin, scale, clients, seconds, rate, json })
        }
        Command::Bench { which: BenchCommand::Gc { rows, seconds, json } } => {
            bench_gc::run(&bench_gc::GcBenchArgs { rows, seconds, json })
        }
        Command::Bench { which: BenchCommand::Components { json, quick } } => {
            bench::components(if quick { bench::ComponentSizes::quick() } else { bench::ComponentSizes::full() }, json);
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
