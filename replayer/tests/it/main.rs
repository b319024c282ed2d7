//! The `fovea` command line's end-to-end tests, one module per area, in one
//! test binary: one link of the tree instead of one per file (nextest runs
//! each test in a process of its own all the same). Tests that change the
//! process environment stay in binaries of their own (`lambda_conformance`).

mod common;

mod cli;
mod crash;
mod faults;
mod fencing;
mod iceberg;
mod initial_load;
mod js_example;
mod kinesis;
mod lambda_functions;
mod lambda_scan;
mod replay;
mod s3;
mod serve;
mod serve_pg;
mod serve_pg_ddl;
