//! fovea's AWS backends, kept out of `fovea-core` so its test loop does not
//! compile the AWS SDK:
//!
//! | concern | module | trait |
//! |---|---|---|
//! | the lake on S3 (`s3://BUCKET/PREFIX`) | [`s3`] | `object_store::ObjectStore` |
//! | a lake named by its URLs (a directory or `s3://`, with `dynamodb://` state) | [`lake`] | [`fovea_core::location::LakeBackends`] |
//! | timestamps, watermarks, the writer's lease (`dynamodb://TABLE`) | [`dynamo`] | [`fovea_core::mvcc::TxnStore`] |
//! | the catalog, in the same table (+ large payloads in the lake) | [`catalog`] | [`fovea_core::catalog::Catalog`] |
//! | scans fanned out to the Lambda scan function (`lambda://FUNCTION`) | [`lambda`] | [`fovea_core::scan_worker::SplitWorker`] |
//! | combine and storage GC run by the Lambda functions (`--functions lambda://PREFIX`) | [`functions`] | [`fovea_core::rewrite::RewriteWorker`] |
//! | what the function binaries share (start-up, lakes, the rewrite handler) | [`function`] | |
//! | published Iceberg tables in the Glue Data Catalog (`glue://DATABASE`, feature `glue`) | `glue` | `fovea_iceberg::TableRegistry` |
//! | metrics as CloudWatch log lines (embedded metric format) | [`emf`] | |
//! | Lambda's and Glue's few calls as signed HTTPS requests (no SDK crate) | [`signed_http`] | |
//!
//! Everything is configured from one AWS configuration ([`config`]: region,
//! credential chain with profiles and SSO, deadlines; `AWS_ENDPOINT_URL` and the per-service
//! `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL_DYNAMODB` for local stand-ins).
//! The SDK's asynchronous calls run on fovea's IO runtime
//! ([`fovea_core::lake::block_on_io`]); throttling and 5xx answers are
//! retried by the SDK with backoff and jitter ([`RETRY_ATTEMPTS`]), and a
//! final failure is an error naming the operation and the item.

pub mod catalog;
pub mod config;
pub mod dynamo;
pub mod emf;
pub mod function;
pub mod functions;
#[cfg(feature = "glue")]
pub mod glue;
pub mod kinesis;
pub mod lake;
pub mod lambda;
pub mod s3;
pub mod signed_http;

/// Attempts (first try included) of a request the SDK retries.
pub const RETRY_ATTEMPTS: u32 = 8;

/// Whether `url`'s host is a loopback address (plain HTTP is allowed only
/// there: local stand-ins).
pub fn is_loopback(url: &str) -> bool {
    url::Url::parse(url).ok().and_then(|u| u.host_str().map(str::to_owned)).is_some_and(|h| {
        let h = h.trim_start_matches('[').trim_end_matches(']');
        h == "localhost" || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    })
}
