//! The primary index images of a checkpoint (base, delta, merged chain).
//! The body is `fovea_fuzz_targets::index_image` (fuzz/), which the
//! workspace's corpus test replays on the stable toolchain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fovea_fuzz_targets::index_image(data));
