//! What fovea's Lambda functions share, so their `main`s stay thin: the
//! start-up checks and logging, the lakes a warm instance keeps open, the
//! typed error Lambda reports, and the handler of the two rewrite functions
//! (`functions/combine`, `functions/gc`; see [`fovea_core::rewrite`]).
//!
//! Configuration (environment): `FOVEA_LAKE=s3://BUCKET/PREFIX` pins the
//! lake (requests naming another are refused); without it each request
//! names its lake. AWS settings as every AWS client reads them.
//! Every invocation writes one metrics line in CloudWatch's embedded
//! metric format ([`crate::emf`], dimension `Function`: invocations,
//! failures, rows, bytes, milliseconds) unless `FOVEA_EMF=off`.
//! `FOVEA_KILL_AT` (tests only, with the `faults` feature) aborts a rewrite
//! function at a phase; a build without it refuses to start with it set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fovea_core::lake::Lake;
use fovea_core::rewrite::{KillPhase, RewriteAnswer, RewriteRequest};
use fovea_core::scan_worker::{SplitFailure, SplitFailureKind};
use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};

use crate::emf::{Record, Unit};

/// A failed invocation, as Lambda reports it (`errorType`, `errorMessage`).
#[derive(Debug)]
pub struct Failure(pub SplitFailure);

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

/// Sets up logging for CloudWatch and checks that the process runs under a
/// Lambda runtime API (the runtime would panic on a missing variable; this
/// says what is missing instead). Returns when the start-up began, for
/// the init time the function logs.
pub fn start(function: &str) -> Result<Instant, lambda_runtime::Error> {
    let started = Instant::now();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .without_time() // CloudWatch stamps every line,
        .with_ansi(false) // and shows colour codes as text.
        .init();
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
            "{} not set: {function} runs as a Lambda function (or under cargo lambda watch), not on its own",
            missing.join(", ")
        )
        .into());
    }
    Ok(started)
}

/// Runs one invocation of `function` (`scan`, `combine`, `gc`) — its
/// `handler` — and writes its metrics line: `invocations` 1, `failures` 0
/// or 1 (the failure's kind as the line's `errorType`), `duration_ms`, and
/// what `values` reads from the answer when it succeeded. No line when
/// `FOVEA_EMF` is `off`.
pub async fn measured<T, const N: usize>(
    function: &str,
    handler: impl std::future::Future<Output = Result<T, Failure>>,
    values: impl FnOnce(&T) -> [(&'static str, Unit, f64); N],
) -> Result<T, Failure> {
    let began = Instant::now();
    let outcome = handler.await;
    let read = outcome.as_ref().map(values);
    emit_invocation(function, began, read.as_ref().map(|v| &v[..]).map_err(|f| &f.0));
    outcome
}

/// The metrics line of [`measured`].
fn emit_invocation(function: &str, began: Instant, outcome: Result<&[(&str, Unit, f64)], &SplitFailure>) {
    if matches!(std::env::var("FOVEA_EMF").as_deref(), Ok("off" | "0" | "false")) {
        return;
    }
    let mut record = Record::new(&crate::emf::namespace(), &[("Function", function)]);
    record
        .metric("invocations", Unit::Count, 1.0)
        .metric("failures", Unit::Count, if outcome.is_err() { 1.0 } else { 0.0 })
        .metric("duration_ms", Unit::Milliseconds, began.elapsed().as_secs_f64() * 1e3);
    match outcome {
        Ok(values) => {
            for (name, unit, value) in values {
                record.metric(name, *unit, *value);
            }
        }
        Err(failure) => record.property("errorType", failure.kind.as_str()),
    }
    record.emit();
}

/// The lakes this instance opened, by URL (opening one probes its bucket).
#[derive(Debug, Default)]
pub struct Lakes {
    pinned: Option<String>,
    open: Mutex<HashMap<String, Lake>>,
}

impl Lakes {
    /// The lakes of an instance pinned by `FOVEA_LAKE`, if set.
    pub fn from_env() -> Self {
        Lakes { pinned: std::env::var("FOVEA_LAKE").ok(), ..Lakes::default() }
    }

    /// The pinned lake, if any.
    pub fn pinned(&self) -> Option<&str> {
        self.pinned.as_deref()
    }

    /// The lake a request naming `asked` reads, opened once per instance.
    pub fn lake_for(&self, asked: Option<&str>) -> Result<Lake, SplitFailure> {
        let url = match (&self.pinned, asked) {
            (Some(pinned), Some(asked)) if pinned != asked => {
                return Err(SplitFailure::new(
                    SplitFailureKind::BadRequest,
                    format!("this function reads the lake {pinned} (FOVEA_LAKE), not {asked}"),
                ));
            }
            (Some(pinned), _) => pinned.clone(),
            (None, Some(asked)) => asked.to_owned(),
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
        let store = crate::s3::s3_store(&url).map_err(|e| SplitFailure::of(&e))?;
        let lake = Lake::new(store);
        self.open.lock().unwrap_or_else(|p| p.into_inner()).insert(url, lake.clone());
        Ok(lake)
    }
}

/// The phase `FOVEA_KILL_AT` names (tests of killed functions).
#[cfg(feature = "faults")]
fn kill_phase() -> Result<Option<KillPhase>, lambda_runtime::Error> {
    match std::env::var("FOVEA_KILL_AT") {
        Ok(phase) => Ok(Some(KillPhase::parse(&phase).map_err(|e| e.to_string())?)),
        Err(_) => Ok(None),
    }
}

/// Without fault injection compiled in, `FOVEA_KILL_AT` is refused, not
/// ignored.
#[cfg(not(feature = "faults"))]
fn kill_phase() -> Result<Option<KillPhase>, lambda_runtime::Error> {
    match std::env::var_os("FOVEA_KILL_AT") {
        Some(_) => Err("FOVEA_KILL_AT is set, but this build has no fault injection (the `faults` feature)".into()),
        None => Ok(None),
    }
}

/// Runs a rewrite function (`function` is its name in logs) that accepts
/// the jobs of kind `accepts` (`combine` or `gc`) until the runtime stops.
pub async fn serve_rewrites(function: &'static str, accepts: &'static str) -> Result<(), lambda_runtime::Error> {
    let started = start(function)?;
    let kill = kill_phase()?;
    let lakes = Arc::new(Lakes::from_env());
    tracing::info!(init_ms = started.elapsed().as_secs_f64() * 1e3, lake = ?lakes.pinned(), "{function} ready");
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| {
        let lakes = Arc::clone(&lakes);
        async move {
            measured(accepts, handle_rewrite(&lakes, accepts, kill, event.payload), |a| {
                [
                    ("rows", Unit::Count, a.rows as f64),
                    ("bytes_written", Unit::Bytes, a.bytes() as f64),
                    ("rewrite_ms", Unit::Milliseconds, a.micros as f64 / 1e3),
                ]
            })
            .await
        }
    }))
    .await
}

async fn handle_rewrite(
    lakes: &Arc<Lakes>,
    accepts: &'static str,
    kill: Option<KillPhase>,
    payload: serde_json::Value,
) -> Result<RewriteAnswer, Failure> {
    let request: RewriteRequest = serde_json::from_value(payload).map_err(|e| {
        SplitFailure::new(SplitFailureKind::BadRequest, format!("the event is not a rewrite request: {e}"))
    })?;
    if request.function() != accepts {
        return Err(Failure(SplitFailure::new(
            SplitFailureKind::BadRequest,
            format!(
                "this is the {accepts} function; a {} job goes to the {} function",
                request.function(),
                request.function()
            ),
        )));
    }
    let lakes = Arc::clone(lakes);
    // The lake's IO runs on fovea's IO runtime and this thread waits for
    // it: off the async workers.
    tokio::task::spawn_blocking(move || {
        let lake = lakes.lake_for(request.lake.as_deref())?;
        #[cfg(feature = "faults")]
        let answer = fovea_core::rewrite::run_rewrite_killed_at(&lake, &request, kill)?;
        #[cfg(not(feature = "faults"))]
        let answer = {
            let _: Option<KillPhase> = kill;
            fovea_core::rewrite::run_rewrite(&lake, &request)?
        };
        tracing::info!(output = %request.output, rows = answer.rows, bytes = answer.bytes(), ms = answer.micros as f64 / 1e3, "rewritten");
        Ok(answer)
    })
    .await
    .map_err(|e| SplitFailure::new(SplitFailureKind::Failed, format!("the rewrite's task failed: {e}")))?
    .map_err(Failure)
}
