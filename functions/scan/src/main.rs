//! `fovea-scan`: the Lambda scan function. One invocation runs a group of
//! splits of a fovea scan ([`fovea_core::scan_worker`]): the event is a
//! `SplitRequest` (JSON), the answer a `SplitAnswer` (the splits' visible
//! rows as Arrow IPC, inline or spilled to S3), a failure a typed error
//! (`errorType` = `BadRequest`, `ObjectMissing`, `SnapshotUnavailable`,
//! `Unavailable` or `Failed`) the caller acts on.
//!
//! Configuration: see `fovea_aws::function` (`FOVEA_LAKE` pins the lake).
//! The handler is thin: it parses the event, runs the library's
//! `run_split` off the async runtime, and maps errors. Lakes stay open
//! between invocations of a warm instance.

use std::sync::Arc;

use fovea_aws::emf::Unit;
use fovea_aws::function::{Failure, Lakes, measured};
use fovea_core::scan_worker::{SplitAnswer, SplitFailure, SplitFailureKind, SplitRequest, run_split};
use lambda_runtime::{LambdaEvent, service_fn};

async fn handle(lakes: Arc<Lakes>, event: LambdaEvent<serde_json::Value>) -> Result<SplitAnswer, Failure> {
    let request: SplitRequest = serde_json::from_value(event.payload).map_err(|e| {
        SplitFailure::new(SplitFailureKind::BadRequest, format!("the event is not a split request: {e}"))
    })?;
    // The lake's IO runs on fovea's IO runtime and this thread waits for
    // it: off the async workers.
    tokio::task::spawn_blocking(move || {
        let lake = lakes.lake_for(request.lake.as_deref())?;
        run_split(&lake, &request)
    })
    .await
    .map_err(|e| SplitFailure::new(SplitFailureKind::Failed, format!("the split's task failed: {e}")))?
    .map_err(Failure)
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let started = fovea_aws::function::start("fovea-scan")?;
    let lakes = Arc::new(Lakes::from_env());
    tracing::info!(init_ms = started.elapsed().as_secs_f64() * 1e3, lake = ?lakes.pinned(), "fovea-scan ready");
    lambda_runtime::run(service_fn(move |event| {
        let lakes = Arc::clone(&lakes);
        measured("scan", handle(lakes, event), |a: &SplitAnswer| {
            [
                ("rows", Unit::Count, a.rows as f64),
                ("bytes_read", Unit::Bytes, a.bytes_read as f64),
                ("split_ms", Unit::Milliseconds, a.micros as f64 / 1e3),
            ]
        })
    }))
    .await
}
