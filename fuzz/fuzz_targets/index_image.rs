//! The primary index image of a checkpoint. The input is the body; its
//! checksum is appended so the fuzzer reaches the parser behind it.
#![no_main]

use fovea_core::index::PrimaryIndex;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    bytes.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    let _ = PrimaryIndex::read_from(&bytes);
    // And as stored, checksum and all.
    let _ = PrimaryIndex::read_from(data);
});
