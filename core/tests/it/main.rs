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
