//! A split task as a stateless worker receives it (JSON from a planner,
//! Flight or a Lambda event): parsed and run over an empty in-memory lake
//! — inline rows (Arrow IPC) and deleted-row bitmaps are decoded and
//! applied; objects it names are missing, which must be an error.
#![no_main]

use std::sync::{Arc, OnceLock};

use fovea_core::lake::Lake;
use fovea_core::split::SplitTask;
use libfuzzer_sys::fuzz_target;

fn lake() -> Lake {
    static LAKE: OnceLock<Lake> = OnceLock::new();
    LAKE.get_or_init(|| Lake::new(Arc::new(object_store::memory::InMemory::new()))).clone()
}

fuzz_target!(|data: &[u8]| {
    // libFuzzer's hook aborts at any panic, even one fovea catches: arrow-ipc
    // panics on some malformed streams, which `SplitTask::scan` turns into
    // the task's error (as in production). The default hook lets that
    // unwind to fovea's catch; any other panic still reaches libfuzzer-sys,
    // which aborts — a crash.
    static DEFAULT_HOOK: std::sync::Once = std::sync::Once::new();
    DEFAULT_HOOK.call_once(|| drop(std::panic::take_hook()));
    let Ok(task) = serde_json::from_slice::<SplitTask>(data) else { return };
    if let Ok(scan) = task.scan(lake()) {
        for batch in scan {
            if batch.is_err() {
                break;
            }
        }
    }
});
