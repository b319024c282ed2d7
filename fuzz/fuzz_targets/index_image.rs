//! The primary index images of a checkpoint: a base (format 1 or 2), a
//! delta applied to it, and a merge of a chain. The input is the body; its
//! checksum is appended so the fuzzer reaches the parser behind it.
#![no_main]

use fovea_core::index::{PrimaryIndex, merge_images};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    bytes.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    if let Ok(mut index) = PrimaryIndex::read_from(&bytes) {
        let _ = index.apply_delta(&bytes);
    }
    let _ = PrimaryIndex::new().apply_delta(&bytes);
    let _ = merge_images(&[&bytes, &bytes]);
    // And as stored, checksum and all.
    let _ = PrimaryIndex::read_from(data);
});
