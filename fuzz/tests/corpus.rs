//! Every fuzz target replays its seeds and every input kept so far, once,
//! on the stable toolchain: the regression check of each corpus, in the
//! workspace's test build (so CI builds no nightly fuzz targets for it).
//!
//! The seeds are written here (the engine's formats by
//! [`fovea_fuzz_targets::seeds`], the text and protocol formats by
//! `scripts/fuzz_seeds.py`); `FOVEA_FUZZ_CORPUS` names a corpus directory
//! that fuzzing grew (`scripts/fuzz.sh` keeps it in
//! `/var/tmp/fovea-fuzz/corpus`), replayed as well. A finding fails the
//! test as libFuzzer would: a panic (one fovea catches too, unless the
//! target allows it), an input taking over 10 s, or the process's peak
//! memory over 2 GiB.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fovea_fuzz_targets::{TARGETS, Target};

/// Panics seen by the hook, in any thread (libFuzzer aborts at any).
static PANICS: AtomicUsize = AtomicUsize::new(0);
/// The message of the last one.
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

/// libFuzzer's `-timeout=10` in `scripts/fuzz.sh`.
const HANG: Duration = Duration::from_secs(10);
/// libFuzzer's `-rss_limit_mb=2048`.
const RSS_LIMIT_KB: u64 = 2048 * 1024;

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> =
        entries.map(|e| e.expect("a corpus directory entry").path()).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

/// Runs `target` on `input`; a finding as text.
fn replay(target: &Target, input: &Path) -> Option<String> {
    let data = std::fs::read(input).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
    let before = PANICS.load(Ordering::SeqCst);
    let started = Instant::now();
    let outcome = std::panic::catch_unwind(|| (target.run)(&data));
    let took = started.elapsed();
    let panicked = PANICS.load(Ordering::SeqCst) > before;
    let what = if outcome.is_err() {
        Some("panicked")
    } else if panicked && !target.caught_panics_allowed {
        Some("panicked (a panic fovea caught)")
    } else if took > HANG {
        Some("hung")
    } else {
        None
    };
    what.map(|what| {
        let message = LAST_PANIC.lock().map(|m| m.clone()).unwrap_or_default();
        format!("{} on {} {what} after {took:?}: {message}", target.name, input.display())
    })
}

/// The process's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn every_corpus_input_returns_without_panic_hang_or_blow_up() {
    std::panic::set_hook(Box::new(|info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = info.to_string();
        }
    }));

    let seeds = tempfile::tempdir().expect("a temporary directory");
    let tasks = fovea_fuzz_targets::seeds::write_seeds(seeds.path()).expect("the engine's seeds");
    assert!(tasks > 0, "the seeds include split tasks");
    // The directory as the test runs, not as it was built (`fovea_testkit::package_dir!`).
    let package = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from);
    let script = package.join("../scripts/fuzz_seeds.py");
    let status = std::process::Command::new("python3")
        .arg(&script)
        .arg(seeds.path())
        .status()
        .unwrap_or_else(|e| panic!("python3 {}: {e}", script.display()));
    assert!(status.success(), "{} failed: {status}", script.display());

    let mut corpora = vec![seeds.path().to_path_buf()];
    match std::env::var_os("FOVEA_FUZZ_CORPUS") {
        Some(dir) if Path::new(&dir).is_dir() => corpora.push(PathBuf::from(dir)),
        Some(dir) => eprintln!("FOVEA_FUZZ_CORPUS={}: no such directory, replaying the seeds only", dir.display()),
        None => eprintln!("FOVEA_FUZZ_CORPUS unset: replaying the seeds only"),
    }

    let mut findings = Vec::new();
    for target in TARGETS {
        let mut replayed = 0;
        for corpus in &corpora {
            for input in inputs(&corpus.join(target.name)) {
                findings.extend(replay(target, &input));
                replayed += 1;
            }
        }
        eprintln!("{}: {replayed} inputs", target.name);
        assert!(replayed > 0, "{}: no seed input (fuzz_seeds.py or seeds.rs lost it)", target.name);
    }
    let _ = std::panic::take_hook();
    let peak = peak_rss_kb();
    if let Some(kb) = peak.filter(|&kb| kb > RSS_LIMIT_KB) {
        findings.push(format!("the replay's peak memory was {} MiB", kb / 1024));
    }
    assert!(findings.is_empty(), "{} findings:\n{}", findings.len(), findings.join("\n"));
}
