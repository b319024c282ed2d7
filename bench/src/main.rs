//! `fovea-bench`: fovea's benchmarks and workload generators, a binary of
//! its own so that the product (`fovea`) holds none of their code. `fovea
//! bench ARGS…` runs this binary.
//!
//! Every benchmark measures its baseline in the same run and reports
//! ratios against it; none asserts a time.

mod components;
mod cost;
mod gc;
mod iceberg;
mod kinesis;
mod lambda;
mod replay;
mod scale;
mod scan;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fovea_replayer::replay::CliResult;

fovea_replayer::process_settings!(readers: [b"scan-probe"], servers: [b"serve"]);

/// fovea's benchmarks, measured in one run on this machine, and the
/// synthetic streams they replay.
#[derive(Parser)]
#[command(name = "fovea-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a synthetic Debezium stream (Kafka-style lines with BEGIN/END).
    Gen {
        /// Workload shape.
        #[arg(value_enum)]
        workload: fovea_testkit::workload::Workload,
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
    /// Iceberg publication: time and bytes per checkpoint of a table with a
    /// fraction of its rows changed per checkpoint (formats 2 and 3), the
    /// replay's rate publishing vs not, and DuckDB reading the published
    /// table beside fovea's SQL.
    Iceberg {
        /// Rows of the published table.
        #[arg(long, default_value_t = 1_000_000)]
        rows: usize,
        /// Fraction of them updated between two checkpoints.
        #[arg(long, default_value_t = 0.01)]
        changed: f64,
        /// Checkpoints published after the first.
        #[arg(long, default_value_t = 10)]
        checkpoints: usize,
        /// Transactions of the replayed HyBench stream.
        #[arg(long, default_value_t = 50_000)]
        txns: u64,
        /// Replays with and without publication each (medians reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Transactions between two checkpoints of the replays (the
        /// default is a stress: over ten publications a second).
        #[arg(long, default_value_t = 2_000)]
        checkpoint_txns: u64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
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
    /// kinesalite — with --fan-out kinesis-local — started for the run);
    /// --fan-out: freshness read by polling and by enhanced fan-out, the
    /// same load on the same stand-in.
    Kinesis(kinesis::KinesisBench),
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
        /// and through the scan function (N = 1, 4, 16 invocations at once,
        /// splits grouped per invocation; one split each as the baseline)
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
    /// One reader process of `fovea-bench scan` (prints rows and peak RSS).
    #[command(hide = true)]
    ScanProbe {
        /// How to open the lake.
        #[arg(long, value_enum)]
        mode: scan::ProbeMode,
        /// The lake directory.
        #[arg(long)]
        lake: PathBuf,
        /// The query.
        sql: String,
    },
    /// What following a change stream costs on AWS per month and per
    /// million rows at sustained rates — the S3 requests and DynamoDB
    /// writes of a checkpoint interval at each rate, measured by replays of
    /// a HyBench stream into local stand-ins, the replayer task all month
    /// (and its fan-out consumer) — beside Firehose → Iceberg for the same
    /// change records, from a table of list prices.
    Cost(cost::CostBench),
    /// What each role of a scaled-out replay costs per row — the sink
    /// (decoding; assembling, timing and routing transactions) and the
    /// replayers (shards applying, flushing, checkpointing) — measured by
    /// replays with 1, 2, 4 … shards, and the throughput of 1 to 16
    /// replayer nodes behind one sink that gives, beside Retina's.
    Scale {
        /// Replayer (shard) counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        replayers: Vec<usize>,
        /// Transactions of the HyBench stream.
        #[arg(long, default_value_t = 100_000)]
        txns: u64,
        /// Replays per count (medians reported; counts alternate).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Cores of a node in the throughput model.
        #[arg(long, default_value_t = 16)]
        node_cores: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// End-to-end replay throughput: generate a stream to a file, replay it
    /// into a fresh lake, report rows/s (and the decode share).
    Replay {
        /// Workload shape.
        #[arg(long, value_enum, default_value = "hybench")]
        workload: fovea_testkit::workload::Workload,
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

/// The product binary `fovea` next to this one (for benchmarks that run
/// it as users do).
fn fovea_binary() -> CliResult<PathBuf> {
    let fovea = std::env::current_exe()?.with_file_name("fovea");
    if fovea.is_file() {
        Ok(fovea)
    } else {
        Err(format!(
            "this benchmark runs the fovea binary, not found at {}: build both (`cargo build --release --workspace --bin fovea --bin fovea-bench`)",
            fovea.display()
        )
        .into())
    }
}

/// `fovea-bench gen`: the stream to `output`, or standard output.
fn generate(
    workload: fovea_testkit::workload::Workload,
    txns: u64,
    seed: u64,
    output: Option<PathBuf>,
) -> std::io::Result<()> {
    use std::io::Write;
    match output {
        Some(p) => {
            let file = std::fs::File::create(&p)
                .map_err(|e| std::io::Error::new(e.kind(), format!("cannot create {}: {e}", p.display())))?;
            let mut w = std::io::BufWriter::new(file);
            fovea_testkit::workload::generate(workload, txns, seed, &mut w)?;
            w.flush()
        }
        None => {
            let mut w = std::io::BufWriter::new(std::io::stdout().lock());
            fovea_testkit::workload::generate(workload, txns, seed, &mut w)?;
            w.flush()
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("FOVEA_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    fovea_replayer::tls::install_crypto_provider();
    let result: CliResult<()> = match Cli::parse().command {
        Command::Gen { workload, txns, seed, output } => generate(workload, txns, seed, output).map_err(Into::into),
        Command::Replay { workload, txns, runs, lake, state, json } => {
            replay::replay(workload, txns, runs.max(1), lake.map(|lake| replay::RemoteLake { lake, state }), json)
        }
        Command::Scale { replayers, txns, runs, node_cores, json } => {
            scale::run(&scale::ScaleBench { replayers, txns, runs: runs.max(1), node_cores, json })
        }
        Command::Freshness { rate, seconds, json } => replay::freshness(rate, seconds, json),
        Command::Query { rows, rounds, json } => replay::query(rows, rounds as usize, json),
        Command::Scan { json, scan: Some(target), rows, lake, state, .. } => {
            lambda::run(&lambda::LambdaScanBench { target, rows, lake: lake.zip(state), json })
        }
        Command::Scan { txns, runs, json, scan: None, .. } => {
            scan::run(&scan::ScanBench { txns, runs: runs.max(1), json })
        }
        Command::ScanProbe { mode, lake, sql } => scan::probe(mode, &lake, &sql),
        Command::Kinesis(bench) => kinesis::run(&bench),
        Command::Serve { pg_bin, scale, clients, seconds, rate, json } => {
            serve::serve_bench(&serve::ServeBenchArgs { pg_bin, scale, clients, seconds, rate, json })
        }
        Command::Cost(bench) => cost::run(&bench),
        Command::Gc { rows, seconds, json } => gc::run(&gc::GcBenchArgs { rows, seconds, json }),
        Command::Iceberg { rows, changed, checkpoints, txns, runs, checkpoint_txns, json } => {
            if !(changed > 0.0 && changed <= 1.0) {
                Err(format!("--changed {changed}: expected a fraction in (0, 1]").into())
            } else {
                iceberg::run(&iceberg::IcebergBenchArgs {
                    rows,
                    changed,
                    checkpoints,
                    txns,
                    runs: runs.max(1),
                    checkpoint_txns: checkpoint_txns.max(1),
                    json,
                })
            }
        }
        Command::Components { json, quick } => {
            components::components(
                if quick { components::ComponentSizes::quick() } else { components::ComponentSizes::full() },
                json,
            );
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
