//! fovea-sql's integration tests in one test binary (one link of DataFusion
//! instead of one per file; nextest runs each test in a process of its own
//! all the same).

mod slt;
mod sql;
mod streaming;

/// This package's directory as the tests run (Cargo and nextest set
/// `CARGO_MANIFEST_DIR` for them; `fovea_testkit::package_dir!` says why),
/// where `env!` would name the clone the binary was built in.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
}
