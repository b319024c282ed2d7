//! `fovea`: the replayer service and command line.

mod bench;
mod demo;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    },
    /// Benchmarks, measured in one run on this machine.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Throughput and memory of the core structures.
    Components {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Small sizes (a smoke run, seconds even in debug builds).
        #[arg(long)]
        quick: bool,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FOVEA_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo {
            lake,
            seconds,
            rate,
        } => demo::run(&demo::DemoOptions {
            lake,
            seconds,
            rate,
        }),
        Command::Bench {
            which: BenchCommand::Components { json, quick },
        } => {
            bench::components(
                if quick {
                    bench::ComponentSizes::quick()
                } else {
                    bench::ComponentSizes::full()
                },
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
