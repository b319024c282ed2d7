//! The DDL parser of `--schema-file` and the type names it maps.
//! The body is `fovea_fuzz_targets::ddl` (fuzz/), which the
//! workspace's corpus test replays on the stable toolchain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| fovea_fuzz_targets::ddl(data));
