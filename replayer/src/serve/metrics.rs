//! Prometheus metrics of `fovea serve`, served as text on `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fovea_core::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Counters and gauges the serve loop and the background loops update.
///
/// All atomics are independent statistics read by the scraper: `Relaxed`
/// is enough, no other memory is published through them.
#[derive(Debug, Default)]
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
    /// Visibility checkpoints written for long-running queries.
    pub visibility_checkpoints: AtomicU64,
    /// Queries answered over Flight SQL.
    pub queries: AtomicU64,
    /// Errors by kind.
    pub errors: Mutex<BTreeMap<String, u64>>,
    /// The input's last reported lag (per shard for Kinesis, held
    /// transactions).
    pub input: Mutex<Option<fovea_core::cdc::source::Lag>>,
}

impl Metrics {
    /// Records the input's lag.
    pub fn set_input_lag(&self, lag: &fovea_core::cdc::source::Lag) {
        *self.input.lock().unwrap_or_else(|p| p.into_inner()) = Some(lag.clone());
    }

    /// Counts an error of `kind`.
    pub fn error(&self, kind: &str) {
        *self.errors.lock().unwrap_or_else(|p| p.into_inner()).entry(kind.to_owned()).or_default() += 1;
    }

    /// The Prometheus text exposition of these metrics and the engine's.
    pub fn render(&self, engine: &Engine, started: std::time::Instant) -> String {
        let mut out = String::new();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        let clock = engine.clock();
        let freshness = match engine.source_commit_at(clock.hwm()) {
            Some((_, commit)) => (fovea_core::catalog::now_us() - commit) as f64 / 1e6,
            None => f64::NAN,
        };
        let memory = engine.memory();
        let rss = rss_bytes().map_or(f64::NAN, |b| b as f64);
        for (name, kind, help, value) in [
            ("rows_total", "counter", "Row changes applied.", load(&self.rows)),
            ("transactions_total", "counter", "Source transactions applied.", load(&self.transactions)),
            ("rows_per_second", "gauge", "Average rows applied per second since start.", load(&self.rows) / secs),
            ("input_lag_bytes", "gauge", "Input not applied yet (WAL or file bytes).", load(&self.input_lag_bytes)),
            ("hwm", "gauge", "High watermark: newest mirror ts visible to new queries.", clock.hwm().get() as f64),
            ("lwm", "gauge", "Low watermark: oldest mirror ts a query may read.", clock.lwm().get() as f64),
            (
                "freshness_seconds",
                "gauge",
                "Now minus the source commit time of the newest visible transaction.",
                freshness,
            ),
            (
                "visibility_bits_per_tuple",
                "gauge",
                "Tile visibility bits per stored tuple.",
                memory.visibility_bits_per_tuple(),
            ),
            ("checkpoints_total", "counter", "Checkpoints written.", load(&self.checkpoints)),
            ("checkpoint_seconds_total", "counter", "Time spent writing checkpoints.", load(&self.checkpoint_us) / 1e6),
            (
                "last_checkpoint_seconds",
                "gauge",
                "Duration of the last checkpoint.",
                load(&self.last_checkpoint_us) / 1e6,
            ),
            ("gc_rounds_total", "counter", "Memory GC rounds.", load(&self.gc_rounds)),
            ("gc_seconds_total", "counter", "Time spent in memory GC.", load(&self.gc_us) / 1e6),
            (
                "files_combined_total",
                "counter",
                "Flushed blocks combined into regular files.",
                load(&self.files_combined),
            ),
            (
                "storage_gc_queued",
                "gauge",
                "Files whose stale fraction passed the storage-GC threshold.",
                load(&self.storage_gc_queued),
            ),
            (
                "visibility_checkpoints_total",
                "counter",
                "Visibility checkpoints written for long-running queries.",
                load(&self.visibility_checkpoints),
            ),
            ("queries_total", "counter", "Queries answered.", load(&self.queries)),
            ("rss_bytes", "gauge", "Resident set size of the process.", rss),
        ] {
            family(&mut out, name, kind, help, None, [(String::new(), value)]);
        }
        let components =
            [("visibility", memory.visibility_bytes), ("index", memory.index_bytes), ("buffer", memory.buffer_bytes)];
        let by_component = components.map(|(c, bytes)| (c.to_owned(), bytes as f64));
        family(&mut out, "memory_bytes", "gauge", "Memory held, by component.", Some("component"), by_component);
        let errors: Vec<(String, f64)> =
            self.errors.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, n)| (k.clone(), *n as f64)).collect();
        family(&mut out, "errors_total", "counter", "Errors by kind.", Some("kind"), errors);
        if let Some(lag) = self.input.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            let (held_txns, held_bytes) = lag.held;
            family(
                &mut out,
                "input_held_transactions",
                "gauge",
                "Source transactions held until complete and in commit order.",
                None,
                [(String::new(), held_txns as f64)],
            );
            family(
                &mut out,
                "input_held_bytes",
                "gauge",
                "Bytes of the records held.",
                None,
                [(String::new(), held_bytes as f64)],
            );
            let behind = lag.shards.iter().map(|s| (s.name.clone(), s.millis_behind as f64));
            family(
                &mut out,
                "shard_millis_behind_latest",
                "gauge",
                "MillisBehindLatest of the shard's last read.",
                Some("shard"),
                behind,
            );
            let records = lag.shards.iter().map(|s| (s.name.clone(), s.records as f64));
            family(&mut out, "shard_records_total", "counter", "Records read from the shard.", Some("shard"), records);
        }
        out
    }
}

/// One metric family: HELP, TYPE, and a sample per `(label value, value)`
/// (unlabelled when `label` is `None`).
fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    label: Option<&str>,
    samples: impl IntoIterator<Item = (String, f64)>,
) {
    let _ = writeln!(out, "# HELP fovea_{name} {help}\n# TYPE fovea_{name} {kind}");
    for (label_value, value) in samples {
        let _ = match label {
            Some(l) => writeln!(out, "fovea_{name}{{{l}=\"{label_value}\"}} {value}"),
            None => writeln!(out, "fovea_{name} {value}"),
        };
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

/// Serves `GET /metrics` (and `/healthz`) until the runtime stops.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    engine: Arc<Engine>,
    started: std::time::Instant,
) {
    // At most this many scrapes at once; each has this long to send its
    // request and take the answer (a slow or idle client cannot hold one).
    const CONNECTIONS: usize = 32;
    const IO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
        let mut stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of
                // spinning on the error.
                tracing::warn!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
        };
        let metrics = Arc::clone(&metrics);
        let engine = Arc::clone(&engine);
        tokio::spawn(async move {
            let _slot = slot;
            let mut buf = vec![0u8; 4096];
            let mut n = 0;
            // Read the request head (bounded in size and time); the body,
            // if any, is ignored.
            let read_head = async {
                while n < buf.len() {
                    match stream.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k,
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            };
            if tokio::time::timeout(IO_TIMEOUT, read_head).await.is_err() {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = match path {
                "/metrics" => ("200 OK", metrics.render(&engine, started)),
                "/healthz" => ("200 OK", "ok\n".to_owned()),
                _ => ("404 Not Found", "try /metrics\n".to_owned()),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tokio::time::timeout(IO_TIMEOUT, stream.write_all(response.as_bytes())).await;
        });
    }
}
