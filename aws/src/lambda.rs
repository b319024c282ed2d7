//! Scans fanned out to the Lambda scan function (`functions/scan`):
//! `lambda://FUNCTION[?concurrency=N&timeout_s=S&inline_kb=K&group_mb=M]`.
//!
//! Each group of a query's splits is one synchronous invocation (the
//! scan spread over `concurrency` groups of 8 to `group_mb` MB to read,
//! default 64: [`fovea_core::scan_worker::group_tasks`]; Lambda's `Invoke`,
//! signed by [`crate::signed_http`]; `AWS_ENDPOINT_URL_LAMBDA` honoured,
//! e.g. `cargo lambda watch`). An
//! invocation Lambda throttles (429) is sent again with backoff and jitter
//! until the invocation's deadline; one that fails with a retryable error
//! or times out is retried once, under a new spill prefix; a second failure, or a failure that
//! retrying cannot mend (a bad request, a retired object, an expired
//! snapshot), fails the query with an error naming the function, the split
//! and what the function said. A split's rows are taken only from the
//! invocation that succeeded, whole, so nothing is read twice into one
//! answer; what abandoned attempts spilled is deleted when the query ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use futures::future::BoxFuture;
use object_store::ObjectStore;

use fovea_core::lake::spawn_io;
use fovea_core::scan_worker::{
    GroupSize, SplitAnswer, SplitFailure, SplitFailureKind, SplitRequest, SplitWorker, delete_spilled, spill_prefix,
};
use fovea_core::split::SplitTask;
use fovea_core::{Error, Result};

use crate::config::Deadlines;
use crate::signed_http::{CallError, LAMBDA, ServiceClient};

/// Invocations one query runs at once unless `concurrency=` says.
pub const DEFAULT_CONCURRENCY: usize = 16;

/// How long one invocation may take unless `timeout_s=` says (the scan
/// function's own timeout should be shorter).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// A `lambda://` scan target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LambdaTarget {
    /// Function name or ARN.
    pub function: String,
    /// Invocations one query runs at once.
    pub concurrency: usize,
    /// Timeout of one invocation.
    pub timeout: Duration,
    /// Answers up to this many IPC bytes come inline.
    pub inline_limit: Option<usize>,
    /// Estimated bytes of splits one invocation reads at most.
    pub group_bytes: u64,
}

impl LambdaTarget {
    /// Parses `lambda://FUNCTION[?concurrency=N&timeout_s=S&inline_kb=K&group_mb=M]`.
    pub fn parse(url: &str) -> Result<Self> {
        let expected = "lambda://FUNCTION[?concurrency=N&timeout_s=S&inline_kb=K&group_mb=M]";
        let parsed = LambdaUrl::parse(
            url,
            expected,
            &[
                ("concurrency", 1000),
                ("timeout_s", 900),
                // Base64 of more would pass Lambda's response limit.
                ("inline_kb", (fovea_core::scan_worker::MAX_INLINE_LIMIT / 1024) as u64),
                // A function has at most 10 GB of memory.
                ("group_mb", 10_240),
            ],
        )?;
        let mut target = LambdaTarget {
            function: parsed.name,
            concurrency: DEFAULT_CONCURRENCY,
            timeout: DEFAULT_TIMEOUT,
            inline_limit: None,
            group_bytes: fovea_core::scan_worker::DEFAULT_GROUP_BYTES,
        };
        for (key, n) in parsed.params {
            match key.as_str() {
                "concurrency" => target.concurrency = n as usize,
                "timeout_s" => target.timeout = Duration::from_secs(n),
                "group_mb" => target.group_bytes = n << 20,
                _ => target.inline_limit = Some(n as usize * 1024),
            }
        }
        Ok(target)
    }
}

/// A `lambda://NAME[?KEY=N&…]` URL, its parameters checked.
pub(crate) struct LambdaUrl {
    /// What follows `lambda://` up to the query.
    pub name: String,
    /// The parameters, each a known key with a value in `1..=` its bound.
    pub params: Vec<(String, u64)>,
}

impl LambdaUrl {
    /// Parses `url`, whose parameters are the keys of `bounds`; errors
    /// name the URL and the `expected` form.
    pub fn parse(url: &str, expected: &str, bounds: &[(&str, u64)]) -> Result<Self> {
        let rest = url.strip_prefix("lambda://").ok_or_else(|| Self::bad(url, expected, "not a lambda:// URL"))?;
        let (name, query) = rest.split_once('?').unwrap_or((rest, ""));
        if name.is_empty() {
            return Err(Self::bad(url, expected, "no function name"));
        }
        let mut params = Vec::new();
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            let &(_, max) = bounds
                .iter()
                .find(|(k, _)| *k == key)
                .ok_or_else(|| Self::bad(url, expected, &format!("unknown parameter {key}")))?;
            let n = value
                .parse::<u64>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| Self::bad(url, expected, &format!("{key}={value}: expected 1..={max}")))?;
            params.push((key.into_owned(), n));
        }
        Ok(LambdaUrl { name: name.to_owned(), params })
    }

    /// The error of a bad `url`.
    pub fn bad(url: &str, expected: &str, why: &str) -> Error {
        Error::Source { input: url.into(), message: format!("{why} (expected {expected})") }
    }
}

/// Where `scan` — `--scan` on the command line, `scan=` in Python — says a
/// query's splits run, checked without contacting anything: `None` or
/// `in-process` in the caller's process (`Ok(None)`), or
/// `lambda://FUNCTION[?…]` on the Lambda scan function, which reads the
/// lake (`address`) from S3.
pub fn scan_target(address: &crate::lake::LakeAddress, scan: Option<&str>) -> Result<Option<LambdaTarget>> {
    match scan {
        None | Some("in-process") => Ok(None),
        Some(url) if url.starts_with("lambda://") => {
            if address.dir().is_some() {
                return Err(Error::Source {
                    input: url.into(),
                    message: format!("the scan function reads the lake from S3; {} is a local directory", address.lake),
                });
            }
            Ok(Some(LambdaTarget::parse(url)?))
        }
        Some(other) => {
            Err(Error::Source { input: other.into(), message: "expected lambda://FUNCTION[?…] or in-process".into() })
        }
    }
}

/// The worker that runs a query's splits where `scan` says
/// ([`scan_target`]), over the lake's object store `store`: `None` in the
/// caller's process.
pub fn scan_worker(
    address: &crate::lake::LakeAddress,
    store: Arc<dyn ObjectStore>,
    scan: Option<&str>,
) -> Result<Option<Arc<dyn fovea_core::scan_worker::SplitWorker>>> {
    match scan_target(address, scan)? {
        None => Ok(None),
        Some(target) => Ok(Some(Arc::new(LambdaScan::new(target, &address.lake, store)?))),
    }
}

/// Counters of a [`LambdaScan`] (monotonic).
#[derive(Debug, Default)]
pub struct InvocationStats {
    /// Invocations sent (retries included).
    pub invocations: AtomicU64,
    /// Invocations retried after a failure or a timeout.
    pub retries: AtomicU64,
    /// Invocations Lambda throttled (sent again after a backoff).
    pub throttled: AtomicU64,
    /// Bytes the function read from the lake.
    pub bytes_read: AtomicU64,
    /// GET requests the function made to the lake.
    pub gets: AtomicU64,
    /// Rows the function returned.
    pub rows: AtomicU64,
    /// Microseconds the function spent on its splits (its own clock).
    pub function_micros: AtomicU64,
}

/// Runs split tasks as invocations of the scan function.
#[derive(Clone)]
pub struct LambdaScan {
    client: ServiceClient,
    target: LambdaTarget,
    /// The lake's URL, sent with every request (a function pinned to
    /// another lake refuses it).
    lake_url: String,
    /// The lake's store: spilled answers are read and deleted here.
    store: Arc<dyn ObjectStore>,
    stats: Arc<InvocationStats>,
}

impl std::fmt::Debug for LambdaScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LambdaScan").field("target", &self.target).field("lake", &self.lake_url).finish()
    }
}

impl LambdaScan {
    /// A scan worker invoking `target` for splits of the lake at
    /// `lake_url`, whose store is `store`.
    pub fn new(target: LambdaTarget, lake_url: &str, store: Arc<dyn ObjectStore>) -> Result<Self> {
        Ok(LambdaScan {
            // One attempt per call: the retry policy is this module's
            // (once, with a new spill prefix), not a generic one.
            client: lambda_client(target.timeout)?,
            target,
            lake_url: lake_url.to_owned(),
            store,
            stats: Arc::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<InvocationStats> {
        &self.stats
    }

    /// One invocation: the function's answer or its failure.
    async fn invoke(&self, request: &SplitRequest) -> std::result::Result<SplitAnswer, SplitFailure> {
        let payload = serde_json::to_vec(request)
            .map_err(|e| SplitFailure::new(SplitFailureKind::BadRequest, format!("encoding the request: {e}")))?;
        // Relaxed: statistics.
        self.stats.invocations.fetch_add(1, Ordering::Relaxed);
        let body = invoke_function(&self.client, &self.target.function, payload, self.target.timeout).await?;
        serde_json::from_slice(&body).map_err(|e| {
            SplitFailure::new(SplitFailureKind::Failed, format!("the function's answer is not a split answer: {e}"))
        })
    }

    /// Group `n` of `query`, retried once.
    async fn run_group(self, query: String, n: usize, tasks: Vec<SplitTask>) -> Result<Vec<RecordBatch>> {
        let mut attempt = 0;
        // Throttled invocations never ran: waited out with backoff and
        // jitter until the invocation's deadline, without using the retry.
        let began = std::time::Instant::now();
        let mut backoff = {
            use backon::BackoffBuilder as _;
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_secs(5))
                .with_jitter()
                .without_max_times()
                .build()
        };
        loop {
            let request = SplitRequest {
                lake: Some(self.lake_url.clone()),
                tasks: tasks.clone(),
                spill_prefix: spill_prefix(&query, n, attempt),
                inline_limit: self.target.inline_limit,
            };
            let failure = match self.invoke(&request).await {
                Ok(answer) => {
                    // Relaxed: statistics.
                    self.stats.bytes_read.fetch_add(answer.bytes_read, Ordering::Relaxed);
                    self.stats.gets.fetch_add(answer.gets, Ordering::Relaxed);
                    self.stats.rows.fetch_add(answer.rows as u64, Ordering::Relaxed);
                    self.stats.function_micros.fetch_add(answer.micros, Ordering::Relaxed);
                    match answer.fetch_batches(&self.store).await {
                        Ok(batches) => return Ok(batches),
                        Err(e) => SplitFailure::of(&e),
                    }
                }
                Err(failure) => failure,
            };
            if failure.kind == SplitFailureKind::Throttled {
                let delay = backoff.next().unwrap_or(Duration::from_secs(5));
                if began.elapsed() + delay < self.target.timeout {
                    // Relaxed: statistics.
                    self.stats.throttled.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(delay).await;
                    continue;
                }
            }
            if attempt == 0 && failure.kind.is_retryable() {
                tracing::warn!(function = %self.target.function, group = n, splits = %describe(&tasks), %failure, "scan invocation failed; retrying once");
                self.stats.retries.fetch_add(1, Ordering::Relaxed);
                attempt += 1;
                continue;
            }
            let what = match failure.kind {
                SplitFailureKind::ObjectMissing | SplitFailureKind::SnapshotUnavailable => {
                    " (the lake moved on since the query was planned: run it again)"
                }
                _ => "",
            };
            return Err(Error::Backend {
                backend: "Lambda",
                operation: format!(
                    "invoke {} for split group {n} ({}) after {} attempt(s)",
                    self.target.function,
                    describe(&tasks),
                    attempt + 1
                ),
                key: tasks.first().map(|t| t.table.name.clone()).unwrap_or_default(),
                message: format!("{failure}{what}"),
            });
        }
    }
}

/// The splits of a group as an error names them: `file F, rows A..B`
/// for each, at most three, then how many more.
fn describe(tasks: &[SplitTask]) -> String {
    let mut parts: Vec<String> =
        tasks.iter().take(3).map(|t| format!("file {}, rows {}..{}", t.file, t.offset, t.offset + t.rows)).collect();
    if tasks.len() > 3 {
        parts.push(format!("{} more splits", tasks.len() - 3));
    }
    parts.join("; ")
}

/// The path of `Invoke` for `function` (a name, a partial or a full ARN,
/// a qualifier after `:`), the name percent-encoded as one path segment.
pub(crate) fn invoke_path(function: &str) -> String {
    const SEGMENT: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
    format!("/2015-03-31/functions/{}/invocations", percent_encoding::utf8_percent_encode(function, SEGMENT))
}

/// One synchronous invocation of `function` with `payload`: the answer's
/// body, or the failure (the function's typed error, a timeout after
/// `timeout`, or Lambda's own error).
pub(crate) async fn invoke_function(
    client: &ServiceClient,
    function: &str,
    payload: Vec<u8>,
    timeout: Duration,
) -> std::result::Result<Vec<u8>, SplitFailure> {
    let sent = client.send(reqwest::Method::POST, &invoke_path(function), &[], payload, timeout).await;
    match sent {
        Ok(answer) => {
            if let Some(kind) = answer.header("x-amz-function-error") {
                return Err(function_failure(&answer.body).unwrap_or_else(|| {
                    SplitFailure::new(
                        SplitFailureKind::Failed,
                        format!("{kind}: {}", String::from_utf8_lossy(&answer.body)),
                    )
                }));
            }
            Ok(answer.body.to_vec())
        }
        Err(CallError::Service { status, code, message, body }) => {
            // A runtime emulator (cargo lambda watch) answers a function
            // error with HTTP 500 and Lambda's error body.
            if let Some(failure) = function_failure(&body) {
                return Err(failure);
            }
            let kind = if status == 429 || code == "TooManyRequestsException" {
                SplitFailureKind::Throttled
            } else {
                SplitFailureKind::Unavailable
            };
            let code = if code.is_empty() { String::new() } else { format!("{code}: ") };
            Err(SplitFailure::new(kind, format!("Lambda answered HTTP {status}: {code}{message}")))
        }
        Err(CallError::Timeout(_)) => {
            Err(SplitFailure::new(SplitFailureKind::Unavailable, format!("no answer within {} s", timeout.as_secs())))
        }
        Err(e @ CallError::Transport(_)) => Err(SplitFailure::new(SplitFailureKind::Unavailable, e.to_string())),
    }
}

/// A Lambda client for invocations of at most `timeout` each, one attempt
/// per call (the callers' retry policy is their own).
pub(crate) fn lambda_client(timeout: Duration) -> Result<ServiceClient> {
    ServiceClient::new(LAMBDA, Deadlines { attempt: timeout, operation: timeout })
}

/// Lambda's error body (`{"errorType": …, "errorMessage": …}`) as a failure.
fn function_failure(body: &[u8]) -> Option<SplitFailure> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let kind = v.get("errorType")?.as_str()?;
    let message = v.get("errorMessage").and_then(|m| m.as_str()).unwrap_or_default();
    Some(SplitFailure::new(SplitFailureKind::parse(kind), format!("{kind}: {message}")))
}

impl SplitWorker for LambdaScan {
    fn run(&self, query: &str, n: usize, tasks: Vec<SplitTask>) -> BoxFuture<'static, Result<Vec<RecordBatch>>> {
        // The client's connections live on the IO runtime.
        let run = spawn_io(self.clone().run_group(query.to_owned(), n, tasks));
        Box::pin(async move { run.await? })
    }

    fn concurrency(&self) -> usize {
        self.target.concurrency
    }

    fn group_size(&self) -> GroupSize {
        GroupSize::new(self.target.group_bytes, self.target.concurrency)
    }

    fn finish(&self, query: &str) -> BoxFuture<'static, Result<()>> {
        let store = Arc::clone(&self.store);
        let query = query.to_owned();
        let run = spawn_io(async move { delete_spilled(&store, &query).await });
        Box::pin(async move { run.await? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        let t = LambdaTarget::parse("lambda://fovea-scan").unwrap();
        assert_eq!((t.function.as_str(), t.concurrency, t.timeout), ("fovea-scan", 16, DEFAULT_TIMEOUT));
        let t = LambdaTarget::parse(
            "lambda://arn:aws:lambda:eu-west-1:1:function:f?concurrency=4&timeout_s=30&inline_kb=64&group_mb=128",
        )
        .unwrap();
        assert_eq!(t.function, "arn:aws:lambda:eu-west-1:1:function:f");
        assert_eq!((t.concurrency, t.timeout.as_secs(), t.inline_limit), (4, 30, Some(65536)));
        assert_eq!((t.group_bytes, LambdaTarget::parse("lambda://f").unwrap().group_bytes), (128 << 20, 64 << 20));
        for bad in [
            "s3://x",
            "lambda://",
            "lambda://f?concurrency=0",
            "lambda://f?timeout_s=901",
            "lambda://f?x=1",
            "lambda://f?group_mb=0",
            "lambda://f?group_mb=10241",
            "lambda://f?group_MB=64",
        ] {
            assert!(LambdaTarget::parse(bad).is_err(), "{bad}");
        }
        // Inline answers whose base64 would pass Lambda's 6 MB response
        // limit are refused by name; the largest allowed fits.
        let err = LambdaTarget::parse("lambda://f?inline_kb=6144").unwrap_err().to_string();
        assert!(err.contains("inline_kb=6144"), "{err}");
        let max = fovea_core::scan_worker::MAX_INLINE_LIMIT;
        let t = LambdaTarget::parse(&format!("lambda://f?inline_kb={}", max / 1024)).unwrap();
        let encoded = t.inline_limit.unwrap().div_ceil(3) * 4;
        assert!(encoded + (64 << 10) <= fovea_core::scan_worker::LAMBDA_RESPONSE_LIMIT, "{encoded}");
    }

    #[test]
    fn lambda_error_bodies_are_typed() {
        let f = function_failure(br#"{"errorType":"ObjectMissing","errorMessage":"gone"}"#).unwrap();
        assert_eq!(f.kind, SplitFailureKind::ObjectMissing);
        let f = function_failure(br#"{"errorType":"Runtime.ExitError","errorMessage":"exit 1"}"#).unwrap();
        assert_eq!(f.kind, SplitFailureKind::Failed);
        assert!(function_failure(b"not json").is_none());
    }
}
