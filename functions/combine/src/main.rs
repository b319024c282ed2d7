//! `fovea-combine`: the Lambda combine function. One invocation runs one
//! rewrite ([`fovea_core::rewrite`]): the event is a `RewriteRequest` (JSON)
//! with a `Combine` job, the answer a `RewriteAnswer` (the file written: its
//! rows, row groups and footer range); the replayer makes the swap. A
//! failure is a typed error (`errorType` = `BadRequest`, `ObjectMissing`,
//! `Unavailable` or `Failed`). See `fovea_aws::function` for the
//! environment it reads.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    fovea_aws::function::serve_rewrites("fovea-combine", "combine").await
}
