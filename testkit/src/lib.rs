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
