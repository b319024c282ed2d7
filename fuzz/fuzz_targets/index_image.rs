//! The primary index images of a checkpoint: a base (format 1 to 3), a
//! delta applied to it, and a merge of a chain; keys of older formats are
//! rewritten as a checkpoint's tables would have them. The input is the
//! body; its checksum is appended so the fuzzer reaches the parser behind
//! it.
#![no_main]

use arrow_schema::DataType;
use fovea_core::error::Result;
use fovea_core::index::{KeyBytes, PrimaryIndex, merge_images, upgrade_key};
use libfuzzer_sys::fuzz_target;

/// Table 1 keyed by an integer and a string, 2 by a boolean, a float, a
/// decimal and bytes.
fn upgrade(key: &[u8]) -> Result<KeyBytes> {
    static ONE: [DataType; 2] = [DataType::Int64, DataType::Utf8];
    static TWO: [DataType; 4] = [DataType::Boolean, DataType::Float64, DataType::Decimal128(38, 2), DataType::Binary];
    upgrade_key(key, |t| match t.0 {
        1 => Some(&ONE[..]),
        2 => Some(&TWO[..]),
        _ => None,
    })
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    bytes.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    if let Ok(mut index) = PrimaryIndex::read_from(&bytes, Some(&upgrade)) {
        let _ = index.apply_delta(&bytes, Some(&upgrade));
    }
    let _ = PrimaryIndex::new().apply_delta(&bytes, Some(&upgrade));
    let _ = merge_images(&[&bytes, &bytes]);
    // And as stored, checksum and all.
    let _ = PrimaryIndex::read_from(data, Some(&upgrade));
});
