//! The Lambda workers against the conformance suites every worker passes:
//! split tasks on the scan function (`fovea_core::scan_worker::conformance`,
//! answers inline and spilled to S3) and combines and storage-GC rewrites
//! on the combine and GC functions (`fovea_core::rewrite::conformance`), all
//! behind `cargo lambda watch` on a local S3 (moto), with an engine in this
//! process writing the lake they read.
//!
//! One test: it sets the AWS environment before any other thread runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fovea_aws::functions::{FunctionsTarget, LambdaRewrites};
use fovea_aws::lambda::{LambdaScan, LambdaTarget};
use fovea_core::mvcc::{Clock, MemoryTxnStore, TxnStore};
use fovea_core::{Engine, EngineConfig};
use fovea_testkit::lambda_local::LocalLambda;
use fovea_testkit::moto::Moto;

/// A function binary, built beside `fovea` by `cargo build --workspace`.
fn function(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_fovea")).with_file_name(name)
}

fn engine_on(lake: &str) -> Arc<Engine> {
    let store = fovea_aws::s3::s3_store(lake).unwrap();
    let txn: Arc<dyn TxnStore> = Arc::new(MemoryTxnStore::default());
    let clock = Clock::open(txn).unwrap();
    Engine::open(store, clock, EngineConfig::default().with_shards(2).with_blocks(100, 3)).unwrap()
}

#[test]
fn lambda_workers_conform() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    let env: Vec<(String, String)> = moto.env().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let workspace = fovea_testkit::workspace_dir();
    let mut lambda = LocalLambda::start(&workspace, &function("fovea-scan"), 2, &env).unwrap();
    lambda.add_function(&function("fovea-combine"), 2, &env).unwrap();
    lambda.add_function(&function("fovea-gc"), 2, &env).unwrap();
    for (k, v) in moto.env().into_iter().chain([("AWS_ENDPOINT_URL_LAMBDA", lambda.endpoint())]) {
        // SAFETY: this binary has one test and no other thread of it has
        // started yet (moto and the Lambda endpoint are other processes).
        unsafe { std::env::set_var(k, v) };
    }
    moto.create_bucket("conformance").unwrap();

    // Split tasks: answers inline, then every answer spilled to S3.
    for (prefix, params) in [("inline", ""), ("spilled", "?inline_kb=1")] {
        let lake = format!("s3://conformance/scan-{prefix}");
        let engine = engine_on(&lake);
        let target = LambdaTarget::parse(&format!("lambda://fovea-scan{params}")).unwrap();
        let worker = LambdaScan::new(target, &lake, Arc::clone(engine.lake().store())).unwrap();
        fovea_core::scan_worker::conformance::check(&engine, &worker);
    }

    // Rewrites on the combine and GC functions.
    let lake = "s3://conformance/rewrites";
    let engine = engine_on(lake);
    let target = FunctionsTarget::parse("lambda://fovea?concurrency=2").unwrap();
    let worker = Arc::new(LambdaRewrites::new(target, lake).unwrap());
    fovea_core::rewrite::conformance::check(&engine, worker);
}
