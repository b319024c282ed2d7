//! The replayer's visibility RPC as a scan worker calls it.
//! The body is `fovea_fuzz_targets::rpc_request` (fuzz/), which the
//! workspace's corpus test replays on the stable toolchain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fovea_fuzz_targets::rpc_request(data));
