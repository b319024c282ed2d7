//! A visibility checkpoint object. The input is the body; its checksum is
//! appended so the fuzzer reaches the parser behind it.
#![no_main]

use fovea_core::frozen::FrozenVisibility;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    bytes.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    let _ = FrozenVisibility::decode(&bytes, "fuzz");
    let _ = FrozenVisibility::decode(data, "fuzz");
});
