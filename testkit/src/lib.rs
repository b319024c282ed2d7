//! What fovea's tests and benchmarks run against, kept out of the product:
//! only test targets (as a dev-dependency) and `fovea-bench` link it.
//!
//! | harness | module |
//! |---|---|
//! | moto (S3, DynamoDB), kinesalite (Kinesis), the fault proxy in front of either | [`moto`] |
//! | `cargo lambda watch` as a local Lambda endpoint for the function binaries | [`lambda_local`] |
//! | writing and resharding Kinesis streams, Debezium Server's records | [`kinesis`] |
//! | synthetic Debezium streams shaped like HyBench and CH-benCHmark | [`workload`] |

pub mod kinesis;
pub mod lambda_local;
pub mod moto;
pub mod workload;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

/// The directory of the package whose test is running, as it runs: Cargo
/// and nextest set `CARGO_MANIFEST_DIR` for the tests they run, so a test
/// binary built from a clone at another path (CI reuses builds across
/// clones: `scripts/ci-mtimes.py`) reads this clone's files, where
/// `env!("CARGO_MANIFEST_DIR")` would read the other's. Run by hand, the
/// package directory the binary was built from.
#[macro_export]
macro_rules! package_dir {
    () => {
        ::std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| ::std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), ::std::path::PathBuf::from)
    };
}

/// The workspace's root directory (the one holding `Cargo.lock`) above the
/// running test's package ([`package_dir!`]).
pub fn workspace_dir() -> PathBuf {
    let package = package_dir!();
    let root = package.ancestors().find(|dir| dir.join("Cargo.lock").is_file());
    root.unwrap_or_else(|| panic!("no workspace (a directory with Cargo.lock) above {}", package.display()))
        .to_path_buf()
}

/// Waits until `child` accepts connections on loopback `port`; when it
/// exits first or `limit` passes, the error says what `failed` returns.
pub(crate) fn wait_listening(
    child: &mut Child,
    port: u16,
    limit: Duration,
    failed: impl FnOnce() -> String,
) -> std::io::Result<()> {
    let began = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if began.elapsed() > limit || child.try_wait()?.is_some() {
            return Err(std::io::Error::other(failed()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every Rust file under `dir` (the build output and git's directory aside).
    fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') && name != "node_modules" {
                    rust_files(&path, out);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }

    /// CI reuses test binaries built in a clone at another path
    /// (`scripts/ci-mtimes.py`): a path taken from `env!("CARGO_MANIFEST_DIR")`
    /// would read that clone's files. The compile-time value may only be the
    /// fallback of the variable read as the test runs (`package_dir!`).
    #[test]
    fn tests_find_their_files_where_they_run() {
        let workspace = super::workspace_dir();
        assert!(workspace.join("scripts/ci-mtimes.py").is_file(), "{} is the workspace", workspace.display());
        let mut files = Vec::new();
        rust_files(&workspace, &mut files);
        let compile_time = concat!("env!(\"CARGO_", "MANIFEST_DIR\")");
        let mut offenders = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                let runtime_first =
                    lines[i.saturating_sub(2)..=i].iter().any(|l| l.contains("var_os(\"CARGO_MANIFEST_DIR\")"));
                if code.contains(compile_time) && !runtime_first {
                    offenders.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
                }
            }
        }
        assert!(files.len() > 100, "{} Rust files found under {}", files.len(), workspace.display());
        assert!(
            offenders.is_empty(),
            "paths fixed at compile time (use fovea_testkit::package_dir!):\n{}",
            offenders.join("\n")
        );
    }
}
