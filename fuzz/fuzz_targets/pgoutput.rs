//! pgoutput messages, as a replication session delivers them: the input is
//! a sequence of messages, each a length byte and that many bytes, decoded
//! by one decoder in order (relations, then rows that refer to them).
#![no_main]

use fovea_core::cdc::pgoutput::{Lsn, PgOutputDecoder};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut decoder = PgOutputDecoder::new();
    decoder.set_primary_key("public.t", vec!["id".into()]);
    let mut rest = data;
    let mut lsn = 1;
    while let Some((&len, tail)) = rest.split_first() {
        let (message, next) = tail.split_at((len as usize).min(tail.len()));
        let _ = decoder.decode(Lsn(lsn), message);
        lsn += 1;
        rest = next;
    }
});
