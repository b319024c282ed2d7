//! The DDL parser of `--schema-file` and the type names it maps.
#![no_main]

use fovea_core::cdc::ddl::{parse_ddl, sql_type};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(sql) = std::str::from_utf8(data) {
        let _ = parse_ddl(sql);
        let _ = sql_type(sql);
    }
});
