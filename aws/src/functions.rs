//! Combine and storage GC's rewrites run by the Lambda functions
//! (`functions/combine`, `functions/gc`):
//! `--functions lambda://PREFIX[?concurrency=N&timeout_s=S]` names the
//! functions `PREFIX-combine` and `PREFIX-gc`.
//!
//! Each rewrite is one synchronous invocation, made from the replayer's
//! maintenance thread (never from the apply path), up to `concurrency` at
//! once. An invocation that fails with a retryable error or times out is
//! retried once (a rewrite is idempotent: the same request writes the same
//! rows); a second failure, or one retrying cannot mend, is returned to the
//! engine, which leaves the file as it was, deletes the unnamed output and
//! counts the failure (`fovea_rewrites_failed_total`). A late answer of an
//! abandoned attempt is never used: the engine takes only the outcome this
//! call returns.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fovea_core::Result;
use fovea_core::lake::block_on_io;
use fovea_core::rewrite::{RewriteAnswer, RewriteRequest, RewriteWorker};
use fovea_core::scan_worker::{SplitFailure, SplitFailureKind};

use crate::lambda::{LambdaUrl, invoke_function, lambda_client};
use crate::signed_http::ServiceClient;

/// Rewrites one replayer runs at once unless `concurrency=` says.
pub const DEFAULT_CONCURRENCY: usize = 4;

/// How long one invocation may take unless `timeout_s=` says (the
/// functions' own timeout, 300 s in the template, should be shorter).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(330);

/// A `lambda://PREFIX` functions target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionsTarget {
    /// The combine function (`PREFIX-combine`).
    pub combine: String,
    /// The storage-GC function (`PREFIX-gc`).
    pub gc: String,
    /// Rewrites at once.
    pub concurrency: usize,
    /// Timeout of one invocation.
    pub timeout: Duration,
}

impl FunctionsTarget {
    /// Parses `lambda://PREFIX[?concurrency=N&timeout_s=S]`.
    pub fn parse(url: &str) -> Result<Self> {
        let expected = "lambda://PREFIX[?concurrency=N&timeout_s=S], functions PREFIX-combine and PREFIX-gc";
        let parsed = LambdaUrl::parse(url, expected, &[("concurrency", 1000), ("timeout_s", 900)])?;
        if parsed.name.contains('/') {
            return Err(LambdaUrl::bad(url, expected, "a function-name prefix has no '/'"));
        }
        let mut target = FunctionsTarget {
            combine: format!("{}-combine", parsed.name),
            gc: format!("{}-gc", parsed.name),
            concurrency: DEFAULT_CONCURRENCY,
            timeout: DEFAULT_TIMEOUT,
        };
        for (key, n) in parsed.params {
            match key.as_str() {
                "concurrency" => target.concurrency = n as usize,
                _ => target.timeout = Duration::from_secs(n),
            }
        }
        Ok(target)
    }
}

/// Counters of a [`LambdaRewrites`] (monotonic).
#[derive(Debug, Default)]
pub struct FunctionStats {
    /// Invocations sent (retries included).
    pub invocations: AtomicU64,
    /// Invocations retried after a failure or a timeout.
    pub retries: AtomicU64,
    /// Rewrites that failed after their retry (or with a failure retrying
    /// cannot mend).
    pub failures: AtomicU64,
}

/// Runs rewrites as invocations of the combine and GC functions.
#[derive(Clone)]
pub struct LambdaRewrites {
    client: ServiceClient,
    target: FunctionsTarget,
    /// The lake's URL, sent with every request (a function pinned to
    /// another lake refuses it).
    lake_url: String,
    stats: Arc<FunctionStats>,
}

impl std::fmt::Debug for LambdaRewrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LambdaRewrites").field("target", &self.target).field("lake", &self.lake_url).finish()
    }
}

impl LambdaRewrites {
    /// Rewrites of the lake at `lake_url` by the functions of `target`.
    pub fn new(target: FunctionsTarget, lake_url: &str) -> Result<Self> {
        Ok(LambdaRewrites {
            client: lambda_client(target.timeout)?,
            target,
            lake_url: lake_url.to_owned(),
            stats: Arc::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<FunctionStats> {
        &self.stats
    }

    async fn run(self, mut request: RewriteRequest) -> std::result::Result<RewriteAnswer, SplitFailure> {
        request.lake = Some(self.lake_url.clone());
        let function = match request.function() {
            "combine" => self.target.combine.clone(),
            _ => self.target.gc.clone(),
        };
        let payload = serde_json::to_vec(&request)
            .map_err(|e| SplitFailure::new(SplitFailureKind::BadRequest, format!("encoding the request: {e}")))?;
        let mut attempt = 0;
        loop {
            // Relaxed: statistics.
            self.stats.invocations.fetch_add(1, Ordering::Relaxed);
            let outcome =
                invoke_function(&self.client, &function, payload.clone(), self.target.timeout).await.and_then(|body| {
                    serde_json::from_slice::<RewriteAnswer>(&body).map_err(|e| {
                        SplitFailure::new(SplitFailureKind::Failed, format!("the answer is not a rewrite answer: {e}"))
                    })
                });
            match outcome {
                Ok(answer) => return Ok(answer),
                Err(failure) if attempt == 0 && failure.kind.is_retryable() => {
                    tracing::warn!(%function, output = %request.output, %failure, "rewrite invocation failed; retrying once");
                    self.stats.retries.fetch_add(1, Ordering::Relaxed);
                    attempt += 1;
                }
                Err(failure) => {
                    self.stats.failures.fetch_add(1, Ordering::Relaxed);
                    return Err(SplitFailure::new(
                        failure.kind,
                        format!(
                            "{function} for {} after {} attempt(s): {}",
                            request.output,
                            attempt + 1,
                            failure.message
                        ),
                    ));
                }
            }
        }
    }
}

impl RewriteWorker for LambdaRewrites {
    fn rewrite(&self, request: &RewriteRequest) -> std::result::Result<RewriteAnswer, SplitFailure> {
        // The client's connections live on the IO runtime; this (maintenance)
        // thread waits for the answer.
        block_on_io(self.clone().run(request.clone())).map_err(|e| SplitFailure::of(&e)).and_then(|outcome| outcome)
    }

    fn concurrency(&self) -> usize {
        self.target.concurrency
    }

    fn kind(&self) -> &'static str {
        "lambda"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        let t = FunctionsTarget::parse("lambda://fovea").unwrap();
        assert_eq!((t.combine.as_str(), t.gc.as_str()), ("fovea-combine", "fovea-gc"));
        assert_eq!((t.concurrency, t.timeout), (DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT));
        let t = FunctionsTarget::parse("lambda://prod-fovea?concurrency=8&timeout_s=60").unwrap();
        assert_eq!((t.gc.as_str(), t.concurrency, t.timeout.as_secs()), ("prod-fovea-gc", 8, 60));
        for bad in ["s3://x", "lambda://", "lambda://a/b", "lambda://f?concurrency=0", "lambda://f?x=1"] {
            assert!(FunctionsTarget::parse(bad).is_err(), "{bad}");
        }
    }
}
