//! The fovea replayer: the `fovea` command line's commands as a library
//! (replay, serve with Flight SQL, the PostgreSQL input and metrics, SQL,
//! the demo), so that `fovea-bench` measures the same code the product
//! runs. The `fovea` binary (`src/main.rs`) parses arguments and calls in.

pub mod cli_values;
pub mod demo;
pub mod input;
pub mod lakes;
pub mod latency;
pub mod query;
pub mod replay;
pub mod serve;
pub mod status;
pub mod tls;

/// What [`process_settings`] names from the binary that invokes it.
#[doc(hidden)]
pub mod __private {
    pub use libc;
    pub use libmimalloc_sys;
    pub use mimalloc;
}

/// The allocator and the memory settings of a fovea process.
///
/// **mimalloc.** The replayer allocates and frees many small objects
/// (decoded records, rows, index keys); glibc's allocator spent a third of
/// replay time in its free lists, mimalloc does not.
///
/// Memory settings made before anything allocates: a constructor in
/// `.init_array` runs before the Rust runtime starts, and glibc hands it
/// the process's arguments and environment.
///
/// * **Lazy commit for readers.** mimalloc commits its arenas eagerly on
///   Linux by default, and pages freed there then stay resident: a reader
///   process answering one query kept ~40 MB it no longer used (peak RSS
///   107 MB; 69 MB with lazy commit). Replay runs faster with eager commit
///   (~20% less CPU measured), so only the reading commands (`sql`,
///   `export`, `history`, the scan bench's probe) commit lazily.
/// * **No transparent huge pages** unless `MIMALLOC_ALLOW_THP` is set (as
///   mimalloc reads it). mimalloc asks for huge pages, and every first touch
///   of one makes the kernel zero 2 MB: a replay spent about a third of its
///   CPU zeroing pages (perf: `clear_page_erms` under huge-page faults, in
///   every thread). Without them the same replay took 30% less CPU
///   (hybench, 60,000 transactions: 7.1–7.5 s against 4.7–5.7 s).
/// * **Quick purging for the server.** `fovea serve` returns the pages it
///   frees to the OS after 2 ms (mimalloc's `purge_delay`, 10 ms by
///   default; `MIMALLOC_PURGE_DELAY` overrides it): with the default,
///   pages freed by bursts (an initial copy, a checkpoint's images, a
///   combine's row groups) stayed resident, and `fovea bench serve` peaked
///   at 167–179 MB against 139 MB with 2 ms and 131–137 MB with 0 (pgbench
///   -s 10, 1.09M live rows). The price is system time for the purges
///   (the initial copy took 1.6 s with 2 ms, 1.9–2.0 s with 0, 1.3–1.4 s
///   with 10; `bench replay` took 3.3–3.9 s of system CPU with 0 against
///   1.9 s), so batch commands keep the default.
///
/// Invoke once in a binary: `readers` are the first arguments (commands)
/// that only read, `servers` the long-running ones.
#[macro_export]
macro_rules! process_settings {
    (readers: [$($reader:expr),* $(,)?], servers: [$($server:expr),* $(,)?]) => {
        #[global_allocator]
        static GLOBAL: $crate::__private::mimalloc::MiMalloc = $crate::__private::mimalloc::MiMalloc;

        #[cfg(target_os = "linux")]
        #[used]
        #[unsafe(link_section = ".init_array")]
        static MEMORY_SETTINGS: extern "C" fn(std::ffi::c_int, *const *const std::ffi::c_char, *const *const std::ffi::c_char) = {
            extern "C" fn memory_settings(
                argc: std::ffi::c_int,
                argv: *const *const std::ffi::c_char,
                envp: *const *const std::ffi::c_char,
            ) {
                let env_has = |name: &[u8]| {
                    (0..)
                        .map_while(|i| {
                            // SAFETY: glibc passes the environment: a NULL-terminated
                            // array of NUL-terminated strings, valid here.
                            let entry = if envp.is_null() { std::ptr::null() } else { unsafe { *envp.add(i) } };
                            // SAFETY: non-null entries are NUL-terminated strings (above).
                            (!entry.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(entry) }.to_bytes())
                        })
                        .any(|e| e.strip_prefix(name).is_some_and(|rest| rest.starts_with(b"=")))
                };
                let thp_chosen = env_has(b"MIMALLOC_ALLOW_THP");
                if !thp_chosen {
                    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and
                    // sets a flag of this process's memory map. Its result is left:
                    // a kernel without it keeps huge pages, which is only slower.
                    let _ = unsafe { $crate::__private::libc::prctl($crate::__private::libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
                }
                // `mi_option_arena_eager_commit` in mimalloc.h (v2 and v3 alike);
                // libmimalloc-sys does not name it.
                const ARENA_EAGER_COMMIT: $crate::__private::libmimalloc_sys::mi_option_t = 4;
                let arg = |i: std::ffi::c_int| -> &[u8] {
                    if argv.is_null() || i >= argc {
                        return b"";
                    }
                    // SAFETY: glibc passes main's argc and argv: argv[0..argc] are
                    // valid NUL-terminated strings for the life of the process.
                    unsafe { std::ffi::CStr::from_ptr(*argv.add(i as usize)) }.to_bytes()
                };
                let readers: &[&[u8]] = &[$(&$reader[..]),*];
                let reader = readers.contains(&arg(1));
                if reader {
                    // SAFETY: mi_option_set only stores the value in mimalloc's
                    // option table; it takes no pointers, nothing else runs yet.
                    unsafe { $crate::__private::libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0) }
                }
                // `mi_option_purge_delay` in mimalloc.h (v2 and v3 alike).
                const PURGE_DELAY: $crate::__private::libmimalloc_sys::mi_option_t = 15;
                let servers: &[&[u8]] = &[$(&$server[..]),*];
                let server = servers.contains(&arg(1));
                if server && !env_has(b"MIMALLOC_PURGE_DELAY") {
                    // SAFETY: as above.
                    unsafe { $crate::__private::libmimalloc_sys::mi_option_set(PURGE_DELAY, 2) }
                }
            }
            memory_settings
        };
    };
}
