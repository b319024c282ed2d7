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
use fovea_core::engine::MemoryStats;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// A histogram of observations (seconds): the Prometheus histogram
/// `/metrics` shows, and the same buckets counted where the EMF lines
/// ([`super::emf`]) read them to give percentiles per interval, with the
/// largest value observed since the last such read.
#[derive(Clone, Debug)]
pub struct Distribution(Arc<DistributionInner>);

#[derive(Debug)]
struct DistributionInner {
    histogram: Histogram,
    /// Upper bounds of the buckets (the last bucket, +Inf, has none).
    bounds: Vec<f64>,
    /// Observations per bucket (not cumulative), `bounds.len() + 1`.
    counts: Vec<AtomicU64>,
    /// Bits of the largest observation since [`Distribution::take_max`]
    /// (observations are ≥ 0, whose bits order as the values do).
    max_bits: AtomicU64,
}

impl Distribution {
    /// Buckets with these upper bounds (and +Inf).
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let bounds: Vec<f64> = bounds.into_iter().collect();
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Distribution(Arc::new(DistributionInner {
            histogram: Histogram::new(bounds.iter().copied()),
            bounds,
            counts,
            max_bits: AtomicU64::new(0),
        }))
    }

    /// Records one observation (negative ones as 0).
    pub fn observe(&self, value: f64) {
        let value = if value.is_nan() { 0.0 } else { value.max(0.0) };
        let d = &self.0;
        d.histogram.observe(value);
        let bucket = d.bounds.iter().position(|b| value <= *b).unwrap_or(d.bounds.len());
        // Relaxed: independent statistics (see `Metrics`).
        d.counts[bucket].fetch_add(1, Ordering::Relaxed);
        d.max_bits.fetch_max(value.to_bits(), Ordering::Relaxed);
    }

    /// Observations per bucket so far (not cumulative; the last is +Inf).
    pub fn counts(&self) -> Vec<u64> {
        self.0.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    /// The bucket bounds.
    pub fn bounds(&self) -> &[f64] {
        &self.0.bounds
    }

    /// The largest observation since the last call (0 when none).
    pub fn take_max(&self) -> f64 {
        f64::from_bits(self.0.max_bits.swap(0, Ordering::Relaxed))
    }

    /// The Prometheus histogram.
    fn histogram(&self) -> Histogram {
        self.0.histogram.clone()
    }
}

/// The `q` quantile (0..=1) of observations counted per bucket in `counts`
/// (bounds as [`Distribution::bounds`]): the upper bound of the bucket it
/// falls in, or `max` (the largest observation) when that is lower or the
/// quantile falls past the last bound; `None` without observations.
pub fn bucket_quantile(bounds: &[f64], counts: &[u64], q: f64, max: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (i, n) in counts.iter().enumerate() {
        seen += n;
        if seen >= rank {
            // Within (lower, upper]: no more than the largest observation
            // (tighter when the interval's values sit low in the bucket).
            let lower = if i == 0 { 0.0 } else { bounds[i - 1] };
            return Some(match bounds.get(i) {
                Some(upper) => upper.min(max).max(lower),
                None => max.max(lower),
            });
        }
    }
    Some(max)
}

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
    pub freshness: Distribution,
    /// Checkpoint durations, seconds.
    pub checkpoint_seconds: Distribution,
    /// Query durations (planning to the last batch sent), seconds.
    pub query_seconds: Distribution,
    /// HWM held below committed transactions longer than this, ms, is a
    /// stalled replica (`/healthz` unhealthy, see [`Metrics::stall`]).
    pub stall_after_ms: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        // 0.1 ms … ~3.3 s (freshness, checkpoints) and 1 ms … ~33 s (queries).
        let short = || Distribution::new(exponential_buckets(0.0001, 2.0, 16));
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
            errors: Mutex::new(ERROR_KINDS.iter().map(|k| ((*k).to_owned(), 0)).collect()),
            input: Mutex::default(),
            freshness: short(),
            checkpoint_seconds: short(),
            query_seconds: Distribution::new(exponential_buckets(0.001, 2.0, 16)),
            stall_after_ms: AtomicU64::new(DEFAULT_STALL_AFTER.as_millis() as u64),
        }
    }
}

/// The kinds of errors counted ([`Metrics::error`]), shown at 0 from the
/// start (so `increase()` and alarms see the first one).
pub const ERROR_KINDS: [&str; 10] = [
    "input",
    "checkpoint",
    "fenced",
    "postgres_connection",
    "gc",
    "combine",
    "storage_gc",
    "storage_gc_queue",
    "visibility_checkpoint",
    "unauthenticated",
];

/// How long HWM may stand below committed transactions before the
/// replica counts as stalled, unless configured (`fovea serve
/// --stall-secs`).
pub const DEFAULT_STALL_AFTER: std::time::Duration = std::time::Duration::from_secs(15);

/// Whether a sample only grows (a counter) or goes up and down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleKind {
    /// Only grows while the process runs.
    Counter,
    /// Any value.
    Gauge,
}

/// A sample's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SampleValue {
    /// A whole count.
    Count(u64),
    /// A real number (seconds, bytes as a gauge, ratios).
    Real(f64),
}

impl SampleValue {
    /// As a number.
    pub fn get(self) -> f64 {
        match self {
            SampleValue::Count(n) => n as f64,
            SampleValue::Real(v) => v,
        }
    }
}

/// One unlabelled metric's value (see [`Metrics::samples`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Its name (Prometheus: `fovea_` before it, `_total` after a counter).
    pub name: &'static str,
    /// What it is.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: SampleKind,
    /// Its value.
    pub value: SampleValue,
    /// What its value counts (CloudWatch's unit in EMF lines).
    pub unit: fovea_aws::emf::Unit,
}

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

    /// The unlabelled counters and gauges now: what `/metrics` shows and
    /// the EMF lines carry (counters there as the change since the last
    /// line). `memory` is the engine's, read once by the caller (it locks
    /// every shard).
    pub fn samples(&self, engine: &Engine, memory: &MemoryStats, started: std::time::Instant) -> Vec<Sample> {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        let clock = engine.clock();
        let freshness = match engine.source_commit_at(clock.hwm()) {
            Some((_, commit)) => (fovea_core::catalog::now_us() - commit) as f64 / 1e6,
            None => f64::NAN,
        };
        let rewrites = engine.rewrite_stats();
        let rss = rss_bytes().map_or(f64::NAN, |b| b as f64);
        use fovea_aws::emf::Unit;
        // Units from the names (`_seconds`, `_bytes`, …), counts otherwise;
        // `level` for a gauge that counts nothing (a timestamp, an epoch).
        let count = |name: &'static str, help, value| Sample {
            name,
            help,
            kind: SampleKind::Counter,
            value: SampleValue::Count(value),
            unit: Unit::of_name(name, Unit::Count),
        };
        let seconds = |name, help, value| Sample {
            name,
            help,
            kind: SampleKind::Counter,
            value: SampleValue::Real(value),
            unit: Unit::Seconds,
        };
        let gauge = |name: &'static str, help, value| Sample {
            name,
            help,
            kind: SampleKind::Gauge,
            value: SampleValue::Real(value),
            unit: Unit::of_name(name, Unit::Count),
        };
        let level = |name, help, value| Sample { unit: Unit::None, ..gauge(name, help, value) };
        let rate = |name, help, value| Sample { unit: Unit::CountPerSecond, ..gauge(name, help, value) };
        vec![
            count("rows", "Row changes applied.", load(&self.rows)),
            count("transactions", "Source transactions applied.", load(&self.transactions)),
            count("checkpoints", "Checkpoints written.", load(&self.checkpoints)),
            count("gc_rounds", "Memory GC rounds.", load(&self.gc_rounds)),
            count("files_combined", "Flushed blocks combined into regular files.", load(&self.files_combined)),
            count("files_rewritten", "Files storage GC rewrote without their stale rows.", load(&self.files_rewritten)),
            count(
                "stale_rows_dropped",
                "Stale rows storage GC left out of the files it rewrote.",
                load(&self.stale_rows_dropped),
            ),
            count(
                "storage_gc_bytes_before",
                "Bytes of the files storage GC rewrote.",
                load(&self.rewritten_bytes_before),
            ),
            count(
                "storage_gc_bytes_after",
                "Bytes of the files storage GC wrote in their place.",
                load(&self.rewritten_bytes_after),
            ),
            count(
                "visibility_checkpoints",
                "Visibility checkpoints written for long-running queries.",
                load(&self.visibility_checkpoints),
            ),
            count("queries", "Queries answered.", load(&self.queries)),
            count(
                "rewrites",
                "Combine and storage-GC rewrites asked of the rewrite worker (in process or the Lambda functions).",
                load(&rewrites.started),
            ),
            count(
                "rewrites_failed",
                "Rewrites that failed or timed out (after the worker's retry); their files were left as they were.",
                load(&rewrites.failed),
            ),
            count("rewrite_rows", "Rows written by rewrites.", load(&rewrites.rows_written)),
            seconds("checkpoint_seconds", "Time spent writing checkpoints.", load(&self.checkpoint_us) as f64 / 1e6),
            seconds("gc_seconds", "Time spent in memory GC.", load(&self.gc_us) as f64 / 1e6),
            seconds(
                "rewrite_worker_seconds",
                "Time the rewrite worker spent on rewrites (its own clock).",
                load(&rewrites.worker_micros) as f64 / 1e6,
            ),
            rate("rows_per_second", "Average rows applied per second since start.", load(&self.rows) as f64 / secs),
            gauge("input_lag_bytes", "Input not applied yet (WAL or file bytes).", load(&self.input_lag_bytes) as f64),
            level(
                "hwm",
                "High watermark: every mirror ts below it is replayed (new queries read at HWM - 1).",
                clock.hwm().get() as f64,
            ),
            level("lwm", "Low watermark: oldest mirror ts a query may read.", clock.lwm().get() as f64),
            level(
                "lease_epoch",
                "Epoch of the lease this replayer writes under (a new writer takes a higher one).",
                clock.epoch() as f64,
            ),
            gauge(
                "freshness_seconds",
                "Now minus the source commit time of the newest visible transaction.",
                freshness,
            ),
            level(
                "visibility_bits_per_tuple",
                "Tile visibility bits per stored tuple.",
                memory.visibility_bits_per_tuple(),
            ),
            gauge(
                "last_checkpoint_seconds",
                "Duration of the last checkpoint.",
                load(&self.last_checkpoint_us) as f64 / 1e6,
            ),
            gauge(
                "storage_gc_queued",
                "Files whose stale fraction passed the storage-GC threshold.",
                load(&self.storage_gc_queued) as f64,
            ),
            gauge("rss_bytes", "Resident set size of the process.", rss),
            gauge(
                "hwm_held_seconds",
                "How long HWM has stood at an uncommitted ts with later transactions committed (0: it is not held).",
                clock.stall().map_or(0.0, |s| s.held_for.as_secs_f64()),
            ),
            level(
                "stalled",
                "1 while HWM has been held longer than --stall-secs: the replica stopped advancing.",
                if self.stall(engine).is_some() { 1.0 } else { 0.0 },
            ),
        ]
    }

    /// The histograms: name, help, distribution.
    pub fn distributions(&self) -> [(&'static str, &'static str, &Distribution); 3] {
        [
            (
                "transaction_freshness",
                "Freshness of each replayed transaction: its commit here minus its source commit.",
                &self.freshness,
            ),
            ("checkpoint_duration", "Duration of each checkpoint.", &self.checkpoint_seconds),
            ("query_duration", "Duration of each query, planning to its last batch.", &self.query_seconds),
        ]
    }

    /// The OpenMetrics text exposition of these metrics and the engine's.
    pub fn render(&self, engine: &Engine, started: std::time::Instant) -> String {
        let memory = engine.memory();
        let mut registry = Registry::with_prefix("fovea");
        for sample in self.samples(engine, &memory, started) {
            // Counters: the encoder appends `_total`.
            match (sample.kind, sample.value) {
                (SampleKind::Counter, SampleValue::Count(n)) => {
                    registry.register(sample.name, sample.help, ConstCounter::new(n))
                }
                (SampleKind::Counter, SampleValue::Real(v)) => {
                    registry.register(sample.name, sample.help, ConstCounter::new(v))
                }
                (SampleKind::Gauge, value) => registry.register(sample.name, sample.help, ConstGauge::new(value.get())),
            }
        }
        for (name, help, distribution) in self.distributions() {
            registry.register_with_unit(name, help, Unit::Seconds, distribution.histogram());
        }
        let labelled = |label: &str, samples: Vec<(String, f64)>| {
            let family = GaugeFamily::default();
            for (value, sample) in samples {
                family.get_or_create(&vec![(label.to_owned(), value)]).set(sample);
            }
            family
        };
        let by_component =
            memory_components(&memory).iter().map(|(c, bytes)| ((*c).to_owned(), *bytes as f64)).collect();
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
            let fan_out = lag.shards.iter().map(|s| (s.name.clone(), if s.fan_out { 1.0 } else { 0.0 })).collect();
            registry.register(
                "shard_fan_out",
                "1 when the shard is read by enhanced fan-out (SubscribeToShard), 0 by polling (GetRecords).",
                labelled("shard", fan_out),
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

/// The engine's memory by component (`memory_bytes{component}` on
/// `/metrics`, `memory_COMPONENT_bytes` in EMF lines).
pub fn memory_components(m: &MemoryStats) -> [(&'static str, usize); 3] {
    [("visibility", m.visibility_bytes), ("index", m.index_bytes), ("buffer", m.buffer_bytes)]
}

/// CPU time (user + system) of this process so far, from `/proc/self/stat`
/// (clock ticks of 10 ms, Linux's USER_HZ).
pub fn cpu_seconds() -> Option<f64> {
    let (_, ticks) = proc_stat_cpu(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    Some(ticks as f64 / 100.0)
}

/// The command name and CPU time (user + system, in USER_HZ ticks: 100 a
/// second) of a `/proc/PID/stat` or `/proc/PID/task/TID/stat` line.
pub fn proc_stat_cpu(stat: &str) -> Option<(&str, u64)> {
    // The name is in parentheses and may hold spaces and parentheses
    // itself. Fields after it: state is the first; utime and stime are the
    // 12th and 13th.
    let name = stat.get(stat.find('(')? + 1..stat.rfind(')')?)?;
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((name, user + system))
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

#[cfg(test)]
mod tests {
    use super::proc_stat_cpu;

    #[test]
    fn a_stat_line_gives_its_name_and_user_plus_system_ticks() {
        // A name with a space and a parenthesis of its own; utime 70, stime 5.
        let line = "4242 (fovea (a) b) S 1 4242 4242 0 -1 4194560 900 0 0 0 70 5 0 0 20 0 9 0 100 0 0";
        assert_eq!(proc_stat_cpu(line), Some(("fovea (a) b", 75)));
        assert_eq!(proc_stat_cpu("4242 fovea S 1"), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(proc_stat_cpu(&own).is_some(), "{own}");
    }
}
