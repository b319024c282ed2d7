//! `fovea-scan`: the Lambda scan function. One invocation runs one split
//! of a fovea scan ([`fovea_core::scan_worker`]): the event is a
//! `SplitRequest` (JSON), the answer a `SplitAnswer` (the split's visible
//! rows as Arrow IPC, inline or spilled to S3), a failure a typed error
//! (`errorType` = `BadRequest`, `ObjectMissing`, `SnapshotUnavailable`,
//! `Unavailable` or `Failed`) the caller acts on.
//!
//! Configuration (environment): `FOVEA_LAKE=s3://BUCKET/PREFIX` pins the
//! lake (requests naming another are refused); without it each request
//! names its lake. AWS settings as every AWS client reads them.
//!
//! The handler is thin: it parses the event, runs the library's
//! `run_split` off the async runtime, and maps errors. Lakes stay open
//! between invocations of a warm instance.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fovea_core::lake::Lake;
use fovea_core::scan_worker::{SplitAnswer, SplitFailure, SplitFailureKind, SplitRequest, run_split};
use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};

/// A failed invocation, as Lambda reports it (`errorType`, `errorMessage`).
#[derive(Debug)]
struct Failure(SplitFailure);

impl From<Failure> for Diagnostic {
    fn from(f: Failure) -> Diagnostic {
        Diagnostic { error_type: f.0.kind.as_str().into(), error_message: f.0.message }
    }
}

impl From<SplitFailure> for Failure {
    fn from(f: SplitFailure) -> Self {
        Failure(f)
    }
}

/// The lakes this instance opened, by URL (opening one probes its bucket).
#[derive(Default)]
struct Lakes {
    pinned: Option<String>,
    open: Mutex<HashMap<String, Lake>>,
}

impl Lakes {
    /// The lake `request` reads, opened once per instance.
    fn lake_for(&self, request: &SplitRequest) -> Result<Lake, SplitFailure> {
        let url = match (&self.pinned, &request.lake) {
            (Some(pinned), Some(asked)) if pinned != asked => {
                return Err(SplitFailure::new(
                    SplitFailureKind::BadRequest,
                    format!("this function reads the lake {pinned} (FOVEA_LAKE), not {asked}"),
                ));
            }
            (Some(pinned), _) => pinned.clone(),
            (None, Some(asked)) => asked.clone(),
            (None, None) => {
                return Err(SplitFailure::new(
                    SplitFailureKind::BadRequest,
                    "the request names no lake and the function has no FOVEA_LAKE",
                ));
            }
        };
        // The lock is not held while the store is opened (a request).
        if let Some(lake) = self.open.lock().unwrap_or_else(|p| p.into_inner()).get(&url) {
            return Ok(lake.clone());
        }
        let store = fovea_aws::s3::s3_store(&url).map_err(|e| SplitFailure::of(&e))?;
        let lake = Lake::new(store);
        self.open.lock().unwrap_or_else(|p| p.into_inner()).insert(url, lake.clone());
        Ok(lake)
    }
}

async fn handle(lakes: Arc<Lakes>, event: LambdaEvent<serde_json::Value>) -> Result<SplitAnswer, Failure> {
    let request: SplitRequest = serde_json::from_value(event.payload).map_err(|e| {
        SplitFailure::new(SplitFailureKind::BadRequest, format!("the event is not a split request: {e}"))
    })?;
    // The lake's IO runs on fovea's IO runtime and this thread waits for
    // it: off the async workers.
    tokio::task::spawn_blocking(move || {
        let lake = lakes.lake_for(&request)?;
        run_split(&lake, &request)
    })
    .await
    .map_err(|e| SplitFailure::new(SplitFailureKind::Failed, format!("the split's task failed: {e}")))?
    .map_err(Failure)
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let started = Instant::now();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .without_time() // CloudWatch stamps every line,
        .with_ansi(false) // and shows colour codes as text.
        .init();
    // The runtime panics on a missing variable: say what is missing instead.
    let missing: Vec<&str> = [
        "AWS_LAMBDA_RUNTIME_API",
        "AWS_LAMBDA_FUNCTION_NAME",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
        "AWS_LAMBDA_FUNCTION_VERSION",
    ]
    .into_iter()
    .filter(|v| std::env::var_os(v).is_none())
    .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{} not set: fovea-scan runs as a Lambda function (or under cargo lambda watch), not on its own",
            missing.join(", ")
        )
        .into());
    }
    let lakes = Arc::new(Lakes { pinned: std::env::var("FOVEA_LAKE").ok(), ..Lakes::default() });
    tracing::info!(init_ms = started.elapsed().as_secs_f64() * 1e3, lake = ?lakes.pinned, "fovea-scan ready");
    lambda_runtime::run(service_fn(move |event| handle(Arc::clone(&lakes), event))).await
}
