//! Debezium records in every form: any bytes decode or fail, never panic.
//! The body is `fovea_fuzz_targets::debezium` (fuzz/), which the
//! workspace's corpus test replays on the stable toolchain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fovea_fuzz_targets::debezium(data));
