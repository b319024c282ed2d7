//! Integration tests of fovea-core, in one binary.

mod concurrency;
mod fuzz_findings;
mod initial_load;
mod model;
mod oracle;
mod ordering;
mod parquet_roundtrip;
mod range_reads;
mod readers;
mod schema_change;
mod sink;
mod storage_gc;
mod typed_decoding;

/// This package's directory as the tests run (Cargo and nextest set
/// `CARGO_MANIFEST_DIR` for them; `fovea_testkit::package_dir!` says why),
/// where `env!` would name the clone the binary was built in.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
}
