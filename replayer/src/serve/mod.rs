//! `fovea serve`: the long-lived replayer.
//!
//! ```text
//!  input (file:PATH followed, postgres://…?slot=…&publication=…, kinesis://STREAM…)
//!    └─▶ this thread: the input loop (crate::input) ─▶ Sink ─▶ shard workers
//!          checkpoint every --checkpoint-secs, then confirm to the source (slot, shards)
//!  tokio runtime: Flight SQL + visibility RPC (--listen), Prometheus (--metrics),
//!                 CloudWatch EMF lines on stdout (--emf-secs)
//!  maintenance thread: memory GC, combine, storage-GC queue, visibility checkpoints of long queries
//! ```
//!
//! SIGINT / SIGTERM stop the input loop; a final checkpoint is written and
//! confirmed before the process exits.

pub mod emf;
pub mod flight;
pub mod http;
pub mod iceberg_rest;
pub mod metrics;
pub mod postgres;
pub mod replication;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fovea_core::cdc::InputFormat;
use fovea_core::sink::{Sink, SinkConfig};
use fovea_core::{Engine, EngineConfig};

use self::flight::{FlightOptions, QueryRegistry};
use self::metrics::Metrics;
use crate::replay::CliResult;

/// Options of `fovea serve`.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub lake: crate::lakes::LakeArgs,
    #[command(flatten)]
    pub functions: crate::lakes::FunctionsArgs,
    #[command(flatten)]
    pub iceberg: crate::lakes::IcebergArgs,
    /// Serve an Iceberg REST catalog of the published tables here (not
    /// with --iceberg off): every table it answers is at the same
    /// checkpoint. Off loopback it needs --token (requests carry
    /// `Authorization: Bearer`).
    #[arg(long, value_name = "ADDR")]
    pub iceberg_rest: Option<SocketAddr>,
    /// file:PATH, postgres://USER@HOST:PORT/DB?slot=NAME&publication=NAME[&create_slot=true],
    /// or kinesis://STREAM[,STREAM…][?format=auto|debezium|dms&start=trim_horizon|latest&atomic=false&poll_ms=N&max_held_mb=N&consumer=NAME]
    #[arg(long)]
    pub input: String,
    /// Flight SQL address (anything but loopback needs --token).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Prometheus metrics address (GET /metrics).
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Write the metrics to stdout every this many seconds as CloudWatch
    /// embedded-metric-format lines (on ECS with the awslogs driver they
    /// become CloudWatch metrics; namespace `fovea` or
    /// FOVEA_METRICS_NAMESPACE), and once more when stopping.
    #[arg(long, value_name = "SECS", value_parser = crate::cli_values::seconds)]
    pub emf_secs: Option<f64>,
    /// Bearer token every RPC must carry.
    #[arg(long, env = "FOVEA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM certificate (chain) of the Flight SQL server: clients connect
    /// with grpc+tls://. Needed, with --token, off loopback.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Seconds between checkpoints (a PostgreSQL slot is confirmed up to each).
    #[arg(long, default_value_t = 10.0, value_parser = crate::cli_values::seconds)]
    pub checkpoint_secs: f64,
    /// Seconds HWM may stand at a transaction that does not commit while
    /// later ones do before the replica counts as stalled: an error names
    /// the transaction, /healthz answers 503 and fovea_stalled is 1
    /// (default: --checkpoint-secs + 5).
    #[arg(long, value_parser = crate::cli_values::seconds)]
    pub stall_secs: Option<f64>,
    /// Seconds between memory GC rounds (and combines, storage GC).
    #[arg(long, default_value_t = 60.0, value_parser = crate::cli_values::seconds)]
    pub gc_secs: f64,
    /// A query held open longer than this gets a visibility checkpoint.
    #[arg(long, default_value_t = 30.0, value_parser = crate::cli_values::seconds)]
    pub long_query_secs: f64,
    /// Stale fraction (rows deleted at LWM over rows stored) past which
    /// storage GC rewrites a file without its stale rows.
    #[arg(long, default_value_t = 0.3, value_parser = crate::cli_values::share)]
    pub storage_gc_threshold: f64,
    /// CREATE TABLE statements overriding inferred types and keys (AWS DMS
    /// records carry no primary key: name it here).
    #[arg(long)]
    pub schema_file: Option<std::path::PathBuf>,
    /// Milliseconds between polls of an idle file input.
    #[arg(long, default_value_t = 10, value_parser = crate::cli_values::at_least_one::<u64>)]
    pub poll_ms: u64,
    /// Shards (default: the number of cores).
    #[arg(long, value_parser = crate::cli_values::at_least_one::<usize>)]
    pub shards: Option<usize>,
    /// Rows per write-buffer block and row group.
    #[arg(long, default_value_t = fovea_core::buffer::DEFAULT_BLOCK_ROWS, value_parser = crate::cli_values::at_least_one::<usize>)]
    pub block_rows: usize,
    /// Blocks per file: a file is combined (and can be rewritten by
    /// storage GC) once it holds this many.
    #[arg(long, default_value_t = fovea_core::buffer::DEFAULT_BLOCKS_PER_FILE, value_parser = crate::cli_values::at_least_one::<usize>)]
    pub blocks_per_file: usize,
    /// Seconds the lake's lease lasts without renewal: a second replayer
    /// started on the same lake waits this long after this one stops
    /// renewing (paused, partitioned, killed on another host) before it
    /// takes over; this one is fenced then.
    #[arg(long, default_value_t = 15.0)]
    pub lease_secs: f64,
    /// Days of catalog history (versions, operations, replayed
    /// transactions) kept; older ones are pruned after checkpoints
    /// (`forever`: none).
    #[arg(long, default_value_t = crate::replay::HistoryDays::default())]
    pub history_days: crate::replay::HistoryDays,
    /// Source transactions remembered for dedup: one redelivered within
    /// this many later ones (a source resending after a reconnect) is
    /// skipped; snapshot runs are always remembered. History pruning keeps
    /// at least this many.
    #[arg(long, default_value_t = SinkConfig::default().dedup_window, value_parser = crate::cli_values::at_least_one::<usize>)]
    pub dedup_window: usize,
}

/// Runs until SIGINT/SIGTERM (or `stop` is set), then checkpoints.
pub fn serve(args: ServeArgs, stop: Arc<AtomicBool>) -> CliResult<()> {
    if !args.listen.ip().is_loopback() && (args.token.is_none() || args.tls_cert.is_none()) {
        return Err(format!(
            "--listen {} is not a loopback address: set --token (or FOVEA_TOKEN) so every RPC must carry it, and \
             --tls-cert/--tls-key so the token and the data travel encrypted",
            args.listen
        )
        .into());
    }
    args.iceberg.check()?;
    if let (Some(addr), true) = (args.iceberg_rest, args.iceberg.is_off()) {
        return Err(format!("--iceberg-rest {addr}: the catalog serves published tables, and --iceberg is off").into());
    }
    if let Some(addr) = args.iceberg_rest.filter(|a| !a.ip().is_loopback() && args.token.is_none()) {
        return Err(format!(
            "--iceberg-rest {addr} is not a loopback address: set --token (or FOVEA_TOKEN) so every request must \
             carry it"
        )
        .into());
    }
    let emf_every = match args.emf_secs {
        Some(secs) if !(secs.is_finite() && secs >= 0.1) => {
            return Err(format!("--emf-secs {secs}: must be at least 0.1 seconds").into());
        }
        secs => secs.map(Duration::from_secs_f64),
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(crate::tls::server_identity(cert, key)?),
        _ => None,
    };
    // The input is checked and the addresses are taken before the lake's
    // lease and the input (a slot may be created): a typo or an address in
    // use stops nothing that started.
    crate::input::check_input(&args.input, InputFormat::Auto, true)?;
    let flight_listener = bind("--listen", args.listen)?;
    let metrics_listener = args.metrics.map(|a| bind("--metrics", a)).transpose()?;
    let iceberg_rest_listener = args.iceberg_rest.map(|a| bind("--iceberg-rest", a)).transpose()?;
    let mut config = EngineConfig::default()
        .with_blocks(args.block_rows, args.blocks_per_file)
        .with_retire_grace(args.iceberg.retire_grace());
    if let Some(s) = args.shards {
        config = config.with_shards(s);
    }
    let lake = args.lake.open_write(config, lease_time(args.lease_secs)?)?;
    args.functions.attach(&args.lake, &lake.engine)?;
    let engine = Arc::clone(&lake.engine);
    let stall_after = stall_after(args.stall_secs, args.checkpoint_secs)?;
    let metrics = Arc::new(Metrics::default());
    // Relaxed: a setting read by the scrapes (see `Metrics`).
    metrics.stall_after_ms.store(stall_after.as_millis() as u64, Ordering::Relaxed);
    {
        let freshness = metrics.freshness.clone();
        engine.observe_freshness(move |us| freshness.observe(us.max(0) as f64 / 1e6));
    }
    let started = Instant::now();

    let mut source = crate::input::open_source(
        &args.input,
        lake.checkpoint.as_ref(),
        InputFormat::Auto,
        true,
        Duration::from_millis(args.poll_ms),
        &engine,
        Some(Arc::clone(&metrics)),
    )?;
    let input_name = source.name().to_owned();
    let publisher = args.iceberg.publisher(&args.lake, &engine)?;
    if let (Some(p), Some(checkpoint)) = (&publisher, &lake.checkpoint) {
        // The checkpoint restored, published before anything is served (a
        // no-op when it was): the catalog answers from the start.
        let done = p.publish(checkpoint)?;
        if !done.refused.is_empty() {
            tracing::warn!(tables = done.refused.len(), "tables not published as Iceberg at the restored checkpoint");
        }
    }
    let sink_config = SinkConfig {
        // The input loop decides when to checkpoint (and confirms after).
        checkpoint_txns: u64::MAX,
        checkpoint_interval: Duration::MAX,
        // The maintenance thread runs GC and combine.
        maintain_on_checkpoint: false,
        ddl: crate::replay::read_schema_file(args.schema_file.as_deref())?,
        history_retention: args.history_days.0,
        dedup_window: args.dedup_window,
        publisher: publisher.clone().map(|p| p as Arc<dyn fovea_core::sink::CheckpointPublisher>),
        publish_interval: args.iceberg.publish_interval(),
        ..SinkConfig::default()
    };
    let mut sink = Sink::new(Arc::clone(&engine), Arc::clone(&lake.catalog), &input_name, sink_config)?;

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let queries = Arc::new(QueryRegistry::new());
    let scheme = if tls.is_some() { "grpc+tls" } else { "grpc" };
    let flight_options = FlightOptions { token: args.token.clone(), tls };
    // Registered with the runtime's reactor, which `from_std` must run in.
    let (listener, metrics_listener, iceberg_rest_listener) = {
        let _reactor = runtime.enter();
        let tokio_listener = tokio::net::TcpListener::from_std;
        (
            tokio_listener(flight_listener)?,
            metrics_listener.map(tokio_listener).transpose()?,
            iceberg_rest_listener.map(tokio_listener).transpose()?,
        )
    };
    let flight_addr = listener.local_addr()?;
    let flight = flight::serve_flight(
        listener,
        Arc::clone(&engine),
        Arc::clone(&metrics),
        Arc::clone(&queries),
        flight_options,
    )?;
    runtime.spawn(flight);
    if let Some(l) = metrics_listener {
        tracing::info!(addr = %l.local_addr()?, "metrics on /metrics");
        runtime.spawn(metrics::serve_metrics(l, Arc::clone(&metrics), Arc::clone(&engine), started));
    }
    let emf = emf_every.map(|every| {
        let reporter = Arc::new(std::sync::Mutex::new(emf::EmfReporter::new(&args.lake.lake)));
        let (reporter_, metrics, engine) = (Arc::clone(&reporter), Arc::clone(&metrics), Arc::clone(&engine));
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let records =
                    reporter_.lock().unwrap_or_else(|p| p.into_inner()).records(&metrics, &engine, started, None);
                records.iter().for_each(fovea_aws::emf::Record::emit);
            }
        });
        reporter
    });
    {
        let stop = Arc::clone(&stop);
        runtime.spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
                return;
            };
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            tracing::info!("stopping: final checkpoint");
            // Release: the input loop's Acquire load sees the request.
            stop.store(true, Ordering::Release);
        });
    }
    tracing::info!(%flight_addr, input = %input_name, "serving");
    // Tests and scripts wait for this line.
    if let Some(l) = iceberg_rest_listener {
        let publisher = publisher.clone().expect("checked first: --iceberg-rest is not given with --iceberg off");
        println!("fovea serve: Iceberg REST catalog on http://{}", l.local_addr()?);
        runtime.spawn(iceberg_rest::serve_catalog(l, publisher, args.token.clone()));
    }
    println!("fovea serve: Flight SQL on {scheme}://{flight_addr}");

    let maintenance = {
        let (engine, catalog, metrics, queries, stop, args) = (
            Arc::clone(&engine),
            Arc::clone(&lake.catalog),
            Arc::clone(&metrics),
            Arc::clone(&queries),
            Arc::clone(&stop),
            args.clone(),
        );
        std::thread::Builder::new()
            .name("fovea-maintenance".into())
            .spawn(move || maintenance_loop(&engine, catalog.as_ref(), &metrics, &queries, &stop, &args))?
    };

    let options = crate::input::LoopOptions {
        checkpoint_every: Duration::from_secs_f64(args.checkpoint_secs),
        checkpoint_txns: u64::MAX,
        stop: Some(&stop),
        lease: lake.lease.as_ref(),
        metrics: Some(&metrics),
        progress: false,
        stall_after: Some(stall_after),
    };
    let result = crate::input::run(source.as_mut(), &mut sink, &options);
    // Acquire/Release: pairs with the maintenance loop's load.
    stop.store(true, Ordering::Release);
    let _ = maintenance.join();
    runtime.shutdown_timeout(Duration::from_secs(2));
    let result: CliResult<()> = result.and_then(|()| Ok(engine.flush()?));
    if let Some(reporter) = emf {
        // The last line: what changed since the one before, and how it ended.
        let records = reporter.lock().unwrap_or_else(|p| p.into_inner()).records(
            &metrics,
            &engine,
            started,
            Some(result.is_err()),
        );
        records.iter().for_each(fovea_aws::emf::Record::emit);
    }
    result?;
    tracing::info!("stopped");
    Ok(())
}

/// The stall bound of `--stall-secs` (default: the checkpoint interval
/// plus five seconds: a checkpoint may hold commits back for a moment).
fn stall_after(stall_secs: Option<f64>, checkpoint_secs: f64) -> CliResult<Duration> {
    let secs = stall_secs.unwrap_or(checkpoint_secs + 5.0);
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("--stall-secs {secs}: must be a positive number of seconds").into());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A listening socket on `addr` for `flag`, non-blocking for tokio; an
/// address in use (or not this host's) is an error naming the flag.
fn bind(flag: &str, addr: SocketAddr) -> CliResult<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(addr).map_err(|e| format!("{flag} {addr}: {e}"))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// The lease time of `--lease-secs`.
pub fn lease_time(secs: f64) -> CliResult<Duration> {
    if !(secs.is_finite() && secs >= 0.3) {
        return Err(format!("--lease-secs {secs}: must be at least 0.3").into());
    }
    Ok(Duration::from_secs_f64(secs))
}

fn maintenance_loop(
    engine: &Engine,
    catalog: &dyn fovea_core::catalog::Catalog,
    metrics: &Metrics,
    queries: &QueryRegistry,
    stop: &AtomicBool,
    args: &ServeArgs,
) {
    let gc_every = Duration::from_secs_f64(args.gc_secs);
    let mut last_gc = Instant::now();
    // Acquire: pairs with the Release store that stops the server.
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        match queries.checkpoint_long_queries(engine, Duration::from_secs_f64(args.long_query_secs)) {
            Ok(n) => {
                metrics.visibility_checkpoints.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) => {
                metrics.error("visibility_checkpoint");
                tracing::error!("visibility checkpoint failed: {e}");
            }
        }
        // A round falling due while a checkpoint is written waits for it
        // (for at most one more period): their memory peaks do not add up.
        let due = last_gc.elapsed();
        if due < gc_every || (engine.checkpoint_being_written() && due < 2 * gc_every) {
            continue;
        }
        last_gc = Instant::now();
        let began = Instant::now();
        match engine.gc() {
            Ok(report) => tracing::debug!(?report, "memory gc"),
            Err(e) => {
                metrics.error("gc");
                tracing::error!("memory gc failed: {e}");
            }
        }
        metrics.gc_rounds.fetch_add(1, Ordering::Relaxed);
        metrics.gc_us.fetch_add(began.elapsed().as_micros() as u64, Ordering::Relaxed);
        match engine.combine() {
            Ok(n) => {
                metrics.files_combined.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) => {
                metrics.error("combine");
                tracing::error!("combine failed: {e}");
            }
        }
        match engine.storage_gc(args.storage_gc_threshold) {
            Ok(report) => {
                metrics.files_rewritten.fetch_add(report.files_rewritten as u64, Ordering::Relaxed);
                metrics.stale_rows_dropped.fetch_add(report.rows_dropped as u64, Ordering::Relaxed);
                metrics.rewritten_bytes_before.fetch_add(report.bytes_before, Ordering::Relaxed);
                metrics.rewritten_bytes_after.fetch_add(report.bytes_after, Ordering::Relaxed);
                if report.files_rewritten > 0 {
                    tracing::info!(?report, "storage GC rewrote stale files");
                }
            }
            Err(e) => {
                metrics.error("storage_gc");
                tracing::error!("storage gc failed: {e}");
            }
        }
        // What is left past the threshold (stale since the rewrite's snapshot).
        match engine.storage_gc_candidates(args.storage_gc_threshold).and_then(|files| {
            catalog.set_storage_gc_queue(engine.clock().epoch(), &files)?;
            Ok(files)
        }) {
            Ok(files) => {
                metrics.storage_gc_queued.store(files.len() as u64, Ordering::Relaxed);
                if !files.is_empty() {
                    tracing::info!(files = files.len(), "files queued for storage GC");
                }
            }
            Err(e) => {
                metrics.error("storage_gc_queue");
                tracing::error!("storage gc queue failed: {e}");
            }
        }
    }
}
