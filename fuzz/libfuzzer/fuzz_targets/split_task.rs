//! A split task as a stateless worker receives it, run over an empty lake.
//! The body is `fovea_fuzz_targets::split_task` (fuzz/), which the
//! workspace's corpus test replays on the stable toolchain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // libFuzzer's hook aborts at any panic, even one fovea catches: arrow-ipc
    // panics on some malformed streams, which `SplitTask::scan` turns into
    // the task's error (as in production). The default hook lets that
    // unwind to fovea's catch; any other panic still reaches libfuzzer-sys,
    // which aborts — a crash.
    static DEFAULT_HOOK: std::sync::Once = std::sync::Once::new();
    DEFAULT_HOOK.call_once(|| drop(std::panic::take_hook()));
    fovea_fuzz_targets::split_task(data);
});
