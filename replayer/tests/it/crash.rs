//! Crash recovery: `fovea replay` killed with SIGKILL at random moments, at
//! least ten times during one replay, restarted each time; the final lake
//! equals an uninterrupted replay of the same input: nothing lost, nothing
//! applied twice.

use crate::common;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::SmallRng};

fn fovea() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fovea"))
}

fn export(lake: &Path, table: &str) -> String {
    let out = fovea().args(["export", "--table", table, "--lake"]).arg(lake).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn replay_cmd(lake: &Path, input: &Path) -> Command {
    let mut c = fovea();
    c.arg("replay").arg("--lake").arg(lake).arg("--input").arg(input).args(["--checkpoint-txns", "300"]);
    c
}

#[test]
fn sigkill_during_replay_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("stream.jsonl");
    common::hybench(&input, 30_000, 3);

    let reference = dir.path().join("reference");
    let out = replay_cmd(&reference, &input).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let lake = dir.path().join("lake");
    let mut rng = SmallRng::seed_from_u64(11);
    let mut kills = 0;
    let started = Instant::now();
    while kills < 12 && started.elapsed() < Duration::from_secs(600) {
        let mut child = replay_cmd(&lake, &input).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(150..900)));
        match child.try_wait().unwrap() {
            None => {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
            }
            Some(status) => {
                let mut err = String::new();
                std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
                assert!(status.success(), "a restarted replay failed: {err}");
                break;
            }
        }
    }
    assert!(kills >= 10, "only {kills} kills landed during the replay; make the input larger");
    let out = replay_cmd(&lake, &input).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for table in ["hybench.account", "hybench.transfer"] {
        let (got, want) = (export(&lake, table), export(&reference, table));
        assert_eq!(got.lines().count(), want.lines().count(), "rows of {table}");
        assert!(got == want, "{table} differs from the uninterrupted replay");
    }
}
