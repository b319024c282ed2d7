//! A checkpoint's manifest as a catalog returns it: parsed, then every
//! table's columns and key rebuilt as a restore or a reader does.
#![no_main]

use fovea_core::TableId;
use fovea_core::checkpoint::Manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(manifest) = serde_json::from_slice::<Manifest>(data) else { return };
    for (i, table) in manifest.tables.iter().enumerate() {
        let _ = table.def(TableId(i as u32));
    }
});
