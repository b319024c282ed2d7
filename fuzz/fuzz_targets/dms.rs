//! AWS DMS records: any bytes decode or fail, never panic.
#![no_main]

use fovea_core::cdc::{InputFormat, SourcePosition, decode_line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(line) = std::str::from_utf8(data) {
        let _ = decode_line(line, SourcePosition { line: 1, offset: 0 }, InputFormat::Dms);
    }
});
