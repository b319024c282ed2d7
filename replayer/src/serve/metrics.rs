//! Prometheus metrics of `fovea serve`, served on `/metrics` in the
//! OpenMetrics text format (encoded by `prometheus-client`).
//!
//! Counters and gauges are atomics the serve loop and the background loops
//! update (read once per scrape); engine state (watermarks, freshness,
//! memory) is read at scrape time; latencies are histograms: the freshness
//! of each newly visible state, checkpoint durations and query durations.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fovea_core::Engine;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Counters and gauges the serve loop and the background loops update.
///
/// All atomics are independent statistics read by the scraper: `Relaxed`
/// is enough, no other memory is published through them.
#[derive(Debug)]
pub struct Metrics {
    /// Row changes applied.
    pub rows: AtomicU64,
    /// Source transactions applied.
    pub transactions: AtomicU64,
    /// How far the input is ahead of what was applied (bytes of WAL or of file).
    pub input_lag_bytes: AtomicU64,
    /// Checkpoints written, and their total duration.
    pub checkpoints: AtomicU64,
    /// Total checkpoint time, µs.
    pub checkpoint_us: AtomicU64,
    /// Duration of the last checkpoint, µs.
    pub last_checkpoint_us: AtomicU64,
    /// Memory GC rounds, and their total duration.
    pub gc_rounds: AtomicU64,
    /// Total memory GC time, µs.
    pub gc_us: AtomicU64,
    /// Combines of flushed blocks into regular files.
    pub files_combined: AtomicU64,
    /// Files queued for storage GC (stale fraction past the threshold).
    pub storage_gc_queued: AtomicU64,
    /// Files storage GC rewrote without their stale rows.
    pub files_rewritten: AtomicU64,
    /// Stale rows storage GC left out of the files it rewrote.
    pub stale_rows_dropped: AtomicU64,
    /// Bytes of the files storage GC rewrote.
    pub rewritten_bytes_before: AtomicU64,
    /// Bytes of the files storage GC wrote in their place.
    pub rewritten_bytes_after: AtomicU64,
    /// Visibility checkpoints written for long-running queries.
    pub visibility_checkpoints: AtomicU64,
    /// Queries answered over Flight SQL.
    pub queries: AtomicU64,
    /// Errors by kind.
    pub errors: Mutex<BTreeMap<String, u64>>,
    /// The input's last reported lag (per shard for Kinesis, held
    /// transactions).
    pub input: Mutex<Option<fovea_core::cdc::source::Lag>>,
    /// Freshness of each replayed transaction, seconds: its commit here
    /// minus its source commit (see [`Engine::observe_freshness`]).
    pub freshness: Histogram,
    /// Checkpoint durations, seconds.
    pub checkpoint_seconds: Histogram,
    /// Query durations (planning to the last batch sent), seconds.
    pub query_seconds: Histogram,
    /// HWM held below committed transactions longer than this, ms, is a
    /// stalled replica (`/healthz` unhealthy, see [`Metrics::stall`]).
    pub stall_after_ms: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        // 0.1 ms … ~3.3 s (freshness, checkpoints) and 1 ms … ~33 s (queries).
        let short = || Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        Metrics {
            rows: AtomicU64::default(),
            transactions: AtomicU64::default(),
            input_lag_bytes: AtomicU64::default(),
            checkpoints: AtomicU64::default(),
            checkpoint_us: AtomicU64::default(),
            last_checkpoint_us: AtomicU64::default(),
            gc_rounds: AtomicU64::default(),
            gc_us: AtomicU64::default(),
            files_combined: AtomicU64::default(),
            storage_gc_queued: AtomicU64::default(),
            files_rewritten: AtomicU64::default(),
            stale_rows_dropped: AtomicU64::default(),
            rewritten_bytes_before: AtomicU64::default(),
            rewritten_bytes_after: AtomicU64::default(),
            visibility_checkpoints: AtomicU64::default(),
            queries: AtomicU64::default(),
            errors: Mutex::default(),
            input: Mutex::default(),
            freshness: short(),
            checkpoint_seconds: short(),
            query_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            stall_after_ms: AtomicU64::new(DEFAULT_STALL_AFTER.as_millis() as u64),
        }
    }
}

/// How long HWM may stand below committed transactions before the
/// replica counts as stalled, unless configured (`fovea serve
/// --stall-secs`).
pub const DEFAULT_STALL_AFTER: std::time::Duration = std::time::Duration::from_secs(15);

/// Labelled samples of one gauge family, built at scrape time.
type GaugeFamily = Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>;
/// Labelled samples of one counter family, built at scrape time.
type CounterFamily = Family<Vec<(String, String)>, Counter>;

impl Metrics {
    /// Records the input's lag.
    pub fn set_input_lag(&self, lag: &fovea_core::cdc::source::Lag) {
        *self.input.lock().unwrap_or_else(|p| p.into_inner()) = Some(lag.clone());
    }

    /// The engine's HWM held at an uncommitted ts, with later transactions
    /// committed, for longer than [`Metrics::stall_after_ms`]: the replica
    /// stopped advancing (see [`fovea_core::Clock::stall`]).
    pub fn stall(&self, engine: &Engine) -> Option<fovea_core::Stall> {
        let after = std::time::Duration::from_millis(self.stall_after_ms.load(Ordering::Relaxed));
        engine.clock().stall().filter(|s| s.held_for >= after)
    }

    /// Counts an error of `kind`.
    pub fn error(&self, kind: &str) {
        *self.errors.lock().unwrap_or_else(|p| p.into_inner()).entry(kind.to_owned()).or_default() += 1;
    }

    /// The OpenMetrics text exposition of these metrics and the engine's.
    pub fn render(&self, engine: &Engine, started: std::time::Instant) -> String {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        let clock = engine.clock();
        let freshness = match engine.source_commit_at(clock.hwm()) {
            Some((_, commit)) => (fovea_core::catalog::now_us() - commit) as f64 / 1e6,
            None => f64::NAN,
        };
        let memory = engine.memory();
        let rewrites = engine.rewrite_stats();
        let rss = rss_bytes().map_or(f64::NAN, |b| b as f64);
        let mut registry = Registry::with_prefix("fovea");
        // Counters (the encoder appends `_total`).
        for (name, help, value) in [
            ("rows", "Row changes applied.", load(&self.rows)),
            ("transactions", "Source transactions applied.", load(&self.transactions)),
            ("checkpoints", "Checkpoints written.", load(&self.checkpoints)),
            ("gc_rounds", "Memory GC rounds.", load(&self.gc_rounds)),
            ("files_combined", "Flushed blocks combined into regular files.", load(&self.files_combined)),
            ("files_rewritten", "Files storage GC rewrote without their stale rows.", load(&self.files_rewritten)),
            (
                "stale_rows_dropped",
                "Stale rows storage GC left out of the files it rewrote.",
                load(&self.stale_rows_dropped),
            ),
            ("storage_gc_bytes_before", "Bytes of the files storage GC rewrote.", load(&self.rewritten_bytes_before)),
            (
                "storage_gc_bytes_after",
                "Bytes of the files storage GC wrote in their place.",
                load(&self.rewritten_bytes_after),
            ),
            (
                "visibility_checkpoints",
                "Visibility checkpoints written for long-running queries.",
                load(&self.visibility_checkpoints),
            ),
            ("queries", "Queries answered.", load(&self.queries)),
            (
                "rewrites",
                "Combine and storage-GC rewrites asked of the rewrite worker (in process or the Lambda functions).",
                load(&rewrites.started),
            ),
            (
                "rewrites_failed",
                "Rewrites that failed or timed out (after the worker's retry); their files were left as they were.",
                load(&rewrites.failed),
            ),
            ("rewrite_rows", "Rows written by rewrites.", load(&rewrites.rows_written)),
        ] {
            registry.register(name, help, ConstCounter::new(value));
        }
        for (name, help, value) in [
            ("checkpoint_seconds", "Time spent writing checkpoints.", load(&self.checkpoint_us) as f64 / 1e6),
            ("gc_seconds", "Time spent in memory GC.", load(&self.gc_us) as f64 / 1e6),
            (
                "rewrite_worker_seconds",
                "Time the rewrite worker spent on rewrites (its own clock).",
                load(&rewrites.worker_micros) as f64 / 1e6,
            ),
        ] {
            registry.register(name, help, ConstCounter::new(value));
        }
        for (name, help, value) in [
            ("rows_per_second", "Average rows applied per second since start.", load(&self.rows) as f64 / secs),
            ("input_lag_bytes", "Input not applied yet (WAL or file bytes).", load(&self.input_lag_bytes) as f64),
            (
                "hwm",
                "High watermark: every mirror ts below it is replayed (new queries read at HWM - 1).",
                clock.hwm().get() as f64,
            ),
            ("lwm", "Low watermark: oldest mirror ts a query may read.", clock.lwm().get() as f64),
            ("freshness_seconds", "Now minus the source commit time of the newest visible transaction.", freshness),
            ("visibility_bits_per_tuple", "Tile visibility bits per stored tuple.", memory.visibility_bits_per_tuple()),
            (
                "last_checkpoint_seconds",
                "Duration of the last checkpoint.",
                load(&self.last_checkpoint_us) as f64 / 1e6,
            ),
            (
                "storage_gc_queued",
                "Files whose stale fraction passed the storage-GC threshold.",
                load(&self.storage_gc_queued) as f64,
            ),
            ("rss_bytes", "Resident set size of the process.", rss),
            (
                "hwm_held_seconds",
                "How long HWM has stood at an uncommitted ts with later transactions committed (0: it is not held).",
                clock.stall().map_or(0.0, |s| s.held_for.as_secs_f64()),
            ),
            (
                "stalled",
                "1 while HWM has been held longer than --stall-secs: the replica stopped advancing.",
                if self.stall(engine).is_some() { 1.0 } else { 0.0 },
            ),
        ] {
            registry.register(name, help, ConstGauge::new(value));
        }
        registry.register_with_unit(
            "transaction_freshness",
            "Freshness of each replayed transaction: its commit here minus its source commit.",
            Unit::Seconds,
            self.freshness.clone(),
        );
        registry.register_with_unit(
            "checkpoint_duration",
            "Duration of each checkpoint.",
            Unit::Seconds,
            self.checkpoint_seconds.clone(),
        );
        registry.register_with_unit(
            "query_duration",
            "Duration of each query, planning to its last batch.",
            Unit::Seconds,
            self.query_seconds.clone(),
        );
        let labelled = |label: &str, samples: Vec<(String, f64)>| {
            let family = GaugeFamily::default();
            for (value, sample) in samples {
                family.get_or_create(&vec![(label.to_owned(), value)]).set(sample);
            }
            family
        };
        let components =
            [("visibility", memory.visibility_bytes), ("index", memory.index_bytes), ("buffer", memory.buffer_bytes)];
        let by_component = components.iter().map(|(c, bytes)| ((*c).to_owned(), *bytes as f64)).collect();
        registry.register("memory_bytes", "Memory held, by component.", labelled("component", by_component));
        let counted = |label: &str, samples: Vec<(String, u64)>| {
            let family = CounterFamily::default();
            for (value, n) in samples {
                family.get_or_create(&vec![(label.to_owned(), value)]).inc_by(n);
            }
            family
        };
        let errors = self.errors.lock().unwrap_or_else(|p| p.into_inner()).clone().into_iter().collect();
        registry.register("errors", "Errors by kind.", counted("kind", errors));
        if let Some(lag) = self.input.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            let (held_txns, held_bytes) = lag.held;
            registry.register(
                "input_held_transactions",
                "Source transactions held until complete and in commit order.",
                ConstGauge::new(held_txns as f64),
            );
            registry.register("input_held_bytes", "Bytes of the records held.", ConstGauge::new(held_bytes as f64));
            let behind = lag.shards.iter().map(|s| (s.name.clone(), s.millis_behind as f64)).collect();
            registry.register(
                "shard_millis_behind_latest",
                "MillisBehindLatest of the shard's last read.",
                labelled("shard", behind),
            );
            let records = lag.shards.iter().map(|s| (s.name.clone(), s.records)).collect();
            registry.register("shard_records", "Records read from the shard.", counted("shard", records));
            let retries = lag.shards.iter().map(|s| (s.name.clone(), s.retries)).collect();
            registry.register(
                "shard_read_retries",
                "Reads of the shard retried after a failure (throttling, server errors, timeouts).",
                counted("shard", retries),
            );
            let states = GaugeFamily::default();
            for s in &lag.shards {
                let labels =
                    vec![("shard".to_owned(), s.name.clone()), ("state".to_owned(), s.state.as_str().to_owned())];
                states.get_or_create(&labels).set(1.0);
            }
            registry.register(
                "shard_state",
                "What the shard's reader is doing (reading, at_tip, retrying): 1.",
                states,
            );
        }
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &registry) {
            // Writing to a String cannot fail; say so if it ever does.
            tracing::error!("encoding the metrics failed: {e}");
        }
        out
    }
}

/// CPU time (user + system) of this process so far, from `/proc/self/stat`
/// (clock ticks of 10 ms, Linux's USER_HZ).
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which may hold spaces: state is the
    // first; utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: f64 = fields.next()?.parse().ok()?;
    let system: f64 = fields.next()?.parse().ok()?;
    Some((user + system) / 100.0)
}

/// Resident set size from `/proc/self/statm`.
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Peak resident set size of this process (`VmHWM` of `/proc/self/status`).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What a stalled replica says (log, `/healthz`).
pub fn stall_message(s: &fovea_core::Stall) -> String {
    format!(
        "stalled: HWM has waited {:.1} s for mirror transaction {} to commit while {} later ones committed (the \
         newest {}); queries read the snapshot before it",
        s.held_for.as_secs_f64(),
        s.waiting_for,
        s.committed_after,
        s.newest_committed
    )
}

/// Serves `GET /metrics` (and `/healthz`) over HTTP/1.1 (hyper) until the
/// runtime stops.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    engine: Arc<Engine>,
    started: std::time::Instant,
) {
    // At most this many scrapes at once, each with bounded time.
    let limits = super::http::Limits {
        connections: 32,
        head_timeout: std::time::Duration::from_secs(5),
        connection_timeout: std::time::Duration::from_secs(30),
        keep_alive: false,
    };
    super::http::serve_http(listener, "metrics endpoint", limits, move |request| {
        answer(request.method(), request.uri().path(), &metrics, &engine, started)
    })
    .await
}

/// The answer to one request of the metrics endpoint.
fn answer(
    method: &hyper::Method,
    path: &str,
    metrics: &Metrics,
    engine: &Engine,
    started: std::time::Instant,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    use hyper::StatusCode;
    let plain = "text/plain; charset=utf-8";
    let (status, content_type, body) = match path {
        _ if method != hyper::Method::GET && method != hyper::Method::HEAD => {
            (StatusCode::METHOD_NOT_ALLOWED, plain, "GET only\n".to_owned())
        }
        "/metrics" => (StatusCode::OK, CONTENT_TYPE, metrics.render(engine, started)),
        "/healthz" => match metrics.stall(engine) {
            None => (StatusCode::OK, plain, "ok\n".to_owned()),
            Some(s) => (StatusCode::SERVICE_UNAVAILABLE, plain, stall_message(&s) + "\n"),
        },
        _ => (StatusCode::NOT_FOUND, plain, "try /metrics\n".to_owned()),
    };
    let mut response = hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    response
}
