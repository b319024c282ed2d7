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
use std::process::Child;
use std::time::{Duration, Instant};

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
