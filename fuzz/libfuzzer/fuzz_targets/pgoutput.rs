//! pgoutput messages as a replication session delivers them.
//! The body is `fovea_fuzz_targets::pgoutput` (fuzz/), which the
//! workspace's corpus test replays on the stable toolchain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fovea_fuzz_targets::pgoutput(data));
