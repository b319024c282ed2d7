//! Debezium records in every form (Kafka envelope, bare values, schema
//! envelopes, transaction metadata): any bytes decode or fail, never panic.
#![no_main]

use fovea_core::cdc::{InputFormat, SourcePosition, decode_line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(line) = std::str::from_utf8(data) {
        let at = SourcePosition { line: 1, offset: 0 };
        let _ = decode_line(line, at, InputFormat::Debezium);
        let _ = decode_line(line, at, InputFormat::Auto);
    }
});
