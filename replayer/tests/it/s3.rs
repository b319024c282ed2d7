//! The lake on S3 with its state on DynamoDB (a local moto), as a user runs
//! it: pg-tiny replayed into `s3://…` equals PostgreSQL's tables, read back
//! by fresh processes (`fovea export`, `fovea sql`, `fovea history`) with no
//! local state, and equals the local-lake replay; a replay into S3 killed
//! with SIGKILL several times and restarted ends exact.

use crate::common;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{gunzip, ok, pg_tiny as data, pg_tiny_tables as tables};
use fovea_testkit::moto::Moto;
use rand::{Rng, SeedableRng, rngs::SmallRng};

fn fovea(moto: &Moto) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fovea"));
    c.envs(moto.env());
    c
}

fn export(moto: &Moto, lake: &[&str], table: &str) -> String {
    ok(fovea(moto).args(["export", "--table", table]).args(lake).output().unwrap())
}

#[test]
fn pg_tiny_on_s3_and_dynamodb_equals_postgres_and_survives_sigkill() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("lake").unwrap();
    let input = data().join("debezium_events.precise_schemas.jsonl.gz");
    let s3 = ["--lake", "s3://lake/pg-tiny", "--state", "dynamodb://fovea-pg-tiny"];
    let out = ok(fovea(&moto).arg("replay").args(s3).arg("--input").arg(&input).output().unwrap());
    assert!(out.contains("replayed"), "{out}");

    // Fresh processes, no local state: every table equals PostgreSQL's.
    for t in tables() {
        let expected = gunzip(&data().join(format!("final_tables/{t}.csv.gz")));
        assert_eq!(export(&moto, &s3, &t), expected, "{t}");
    }
    // And equals the same replay into a local lake.
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("lake");
    let local_args = ["--lake", local.to_str().unwrap()];
    ok(fovea(&moto).arg("replay").args(local_args).arg("--input").arg(&input).output().unwrap());
    for t in tables() {
        assert_eq!(export(&moto, &s3, &t), export(&moto, &local_args, &t), "{t}");
    }
    let count = |lake: &[&str]| {
        ok(fovea(&moto)
            .args(["sql", "--format", "csv"])
            .args(lake)
            .arg("SELECT count(*) AS n, sum(abalance) AS s FROM public.pgbench_accounts")
            .output()
            .unwrap())
    };
    assert_eq!(count(&s3), count(&local_args));
    let history = ok(fovea(&moto).args(["history", "--limit", "3"]).args(s3).output().unwrap());
    assert!(history.contains("catalog operations") && history.contains("create table"), "{history}");
    // Rerunning changes nothing.
    let again = ok(fovea(&moto).arg("replay").args(s3).arg("--input").arg(&input).output().unwrap());
    assert!(again.contains("replayed 0 transactions"), "{again}");

    // Errors name what is wrong.
    let err =
        fovea(&moto).args(["export", "--table", "public.pgbench_accounts", "--lake", "s3://lake/x"]).output().unwrap();
    assert!(!err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("has no state store: it needs dynamodb://TABLE"));
    let err = fovea(&moto)
        .args(["export", "--table", "t", "--lake", "s3://no-such-bucket/x", "--state", "dynamodb://fovea-x"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&err.stderr).contains("s3://no-such-bucket/x"),
        "{}",
        String::from_utf8_lossy(&err.stderr)
    );
    // A reader creates nothing: a state table that does not exist is named.
    let err = fovea(&moto)
        .args(["export", "--table", "t", "--lake", "s3://lake/other", "--state", "dynamodb://fovea-nothing-here"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&err.stderr);
    assert!(
        !err.status.success() && stderr.contains("fovea-nothing-here") && stderr.contains("does not exist"),
        "{stderr}"
    );

    // SIGKILL during a replay into S3, restarted each time: the same as an
    // uninterrupted replay.
    let stream = dir.path().join("stream.jsonl");
    common::hybench(&stream, 4_000, 5);
    let reference = dir.path().join("reference");
    let reference_args = ["--lake", reference.to_str().unwrap()];
    ok(fovea(&moto).arg("replay").args(reference_args).arg("--input").arg(&stream).output().unwrap());
    let killed = ["--lake", "s3://lake/killed", "--state", "dynamodb://fovea-killed"];
    let replay = || {
        let mut c = fovea(&moto);
        c.arg("replay").args(killed).arg("--input").arg(&stream).args(["--checkpoint-txns", "300"]);
        c
    };
    let mut rng = SmallRng::seed_from_u64(7);
    let mut kills = 0;
    for _ in 0..20 {
        let mut child = replay().stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(300..1500)));
        match child.try_wait().unwrap() {
            None => {
                child.kill().unwrap();
                child.wait().unwrap();
                kills += 1;
            }
            Some(status) => {
                let mut err = String::new();
                child.stderr.as_mut().unwrap().read_to_string(&mut err).unwrap();
                assert!(status.success(), "a restarted replay failed: {err}");
                break;
            }
        }
        if kills == 4 {
            break;
        }
    }
    assert!(kills >= 2, "the replay finished before it could be killed twice");
    ok(replay().output().unwrap());
    for t in ["hybench.account", "hybench.transfer"] {
        assert_eq!(export(&moto, &killed, t), export(&moto, &reference_args, t), "{t}");
    }
}

/// A lake knows its state: a replay into an S3 lake with a mistyped (new)
/// state, with the state of another lake, or into a lake whose objects were
/// deleted under its live state, is refused before anything is touched —
/// the lake's objects are the same after, and the lake still reads exactly
/// through its own state. Readers are refused the same way.
#[test]
fn a_lake_refuses_a_state_that_is_not_its_own() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("lake").unwrap();
    let input = data().join("debezium_events.precise_schemas.jsonl.gz");
    let shop = ["--lake", "s3://lake/shop", "--state", "dynamodb://state_a"];
    ok(fovea(&moto).arg("replay").args(shop).arg("--input").arg(&input).output().unwrap());
    let before = moto.list_keys("lake", "shop/").unwrap();
    assert!(before.iter().any(|k| k == "shop/_fovea/lake.json"), "{before:?}");
    let refused = |args: &[&str], what: &str| {
        let out = fovea(&moto).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} ran: {}", String::from_utf8_lossy(&out.stdout));
        assert!(stderr.contains(what) && stderr.contains("Nothing was touched"), "{args:?}: {stderr}");
    };
    // A mistyped state: a new table, no record of this lake.
    let typo = ["--lake", "s3://lake/shop", "--state", "dynamodb://state_b"];
    refused(&[&["replay"][..], &typo[..], &["--input", input.to_str().unwrap()]].concat(), "no record of any lake");
    refused(&[&["export", "--table", "public.pgbench_accounts"][..], &typo[..]].concat(), "no record of any lake");
    refused(&[&["sql"][..], &typo[..], &["SELECT 1"]].concat(), "no record of any lake");
    // The state of another lake.
    let other = ["--lake", "s3://lake/other", "--state", "dynamodb://state_c"];
    ok(fovea(&moto).arg("replay").args(other).arg("--input").arg(&input).output().unwrap());
    let crossed = ["--lake", "s3://lake/shop", "--state", "dynamodb://state_c"];
    refused(&[&["replay"][..], &crossed[..], &["--input", input.to_str().unwrap()]].concat(), "belongs to lake");
    assert_eq!(moto.list_keys("lake", "shop/").unwrap(), before, "the lake was touched");
    for t in tables() {
        let expected = gunzip(&data().join(format!("final_tables/{t}.csv.gz")));
        assert_eq!(export(&moto, &shop, &t), expected, "{t}");
    }
    // The other lake's objects deleted under its live state.
    moto.delete_objects("lake", &moto.list_keys("lake", "other/").unwrap()).unwrap();
    refused(&[&["replay"][..], &other[..], &["--input", input.to_str().unwrap()]].concat(), "has no identity");
    assert!(moto.list_keys("lake", "other/").unwrap().is_empty());
}

/// Credentials as AWS users have them: a named profile in a credentials
/// file (`AWS_PROFILE`), no keys in the environment, the region in the
/// config file. The lake on S3 and its state on DynamoDB both work (the S3
/// store used to read the environment's keys alone).
#[test]
fn a_profile_without_environment_keys_opens_an_s3_lake() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("lake").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials");
    std::fs::write(
        &credentials,
        "[fovea-test]\naws_access_key_id = profilekey\naws_secret_access_key = profilesecret\n",
    )
    .unwrap();
    let config = dir.path().join("config");
    std::fs::write(&config, "[profile fovea-test]\nregion = us-east-1\n").unwrap();
    let with_profile = |args: &[&str]| {
        let mut c = fovea(&moto);
        for key in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_DEFAULT_REGION"] {
            c.env_remove(key);
        }
        c.env("AWS_PROFILE", "fovea-test")
            .env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
            .env("AWS_CONFIG_FILE", &config)
            .args(args)
            .output()
            .unwrap()
    };
    let input = data().join("debezium_events.precise_schemas.jsonl.gz");
    let lake = ["--lake", "s3://lake/profiled", "--state", "dynamodb://fovea-profiled"];
    let out = with_profile(&[&["replay"][..], &lake[..], &["--input", input.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t = "public.pgbench_branches";
    let out = with_profile(&[&["export", "--table", t][..], &lake[..]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let expected = gunzip(&data().join(format!("final_tables/{t}.csv.gz")));
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
}

/// A day of a lake's life, accelerated: catalog history kept 3 s
/// (`--history-days`), a dedup window of 10 transactions, checkpoints
/// every 0.1 s, transactions arriving for 20 s. The catalog's versions in
/// the state table stay within what the last few seconds committed (not
/// what the run committed), no other kind of item grows, and the lake
/// still reads exactly, also after a restart.
#[test]
fn catalog_history_past_its_retention_is_pruned() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("pruned").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("events.jsonl");
    let spec = format!("file:{}", input.display());
    let lake = ["--lake", "s3://pruned/lake", "--state", "dynamodb://fovea-pruned"].map(str::to_owned);
    let days = format!("{}", 3.0 / 86_400.0);
    let opts = ["--checkpoint-secs", "0.1", "--history-days", &days, "--dedup-window", "10"];
    common::append_txns(&input, 1..11);
    let server = common::serve(dir.path(), &lake, &moto.env(), &spec, &opts);
    common::eventually(Duration::from_secs(60), "the first transactions", || {
        (common::count_and_sum(&server)? == common::expected(11)).then_some(())
    });

    // One sample a second: (seconds, items by kind, newest version).
    let mut samples = Vec::new();
    let began = std::time::Instant::now();
    let mut xid = 11;
    // 20 s at least, and until 60 versions were committed (a loaded
    // machine commits fewer a second), two minutes at most.
    let enough = |samples: &[(f64, std::collections::BTreeMap<String, usize>, u64)]| {
        began.elapsed() >= Duration::from_secs(20) && samples.last().is_some_and(|s| s.2 >= 60)
            || began.elapsed() >= Duration::from_secs(120)
    };
    while !enough(&samples) {
        for _ in 0..10 {
            common::append_txns(&input, xid..xid + 1);
            xid += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        let (items, head) = moto.state_items("fovea-pruned").unwrap();
        samples.push((began.elapsed().as_secs_f64(), items, head));
    }
    common::eventually(Duration::from_secs(60), "every transaction", || {
        (common::count_and_sum(&server)? == common::expected(xid)).then_some(())
    });
    let log = server.stop();
    assert!(log.contains("catalog pruned"), "{log}");

    let (_, last_items, committed) = samples.last().cloned().unwrap();
    eprintln!("state table samples (seconds, items by kind, newest version): {samples:?}");
    let stored = |items: &std::collections::BTreeMap<String, usize>| items.get("version").copied().unwrap_or(0);
    assert!(committed >= 60, "only {committed} versions committed in 2 minutes: {samples:?}");
    // Each sample holds at most the versions committed in the 6 s before
    // it (3 s of retention, a 1 s pruning interval, checkpoint and sampling
    // delays), plus the one a prune always keeps.
    for (i, (t, items, head)) in samples.iter().enumerate() {
        let Some((_, _, head_before)) = samples[..i].iter().rev().find(|s| s.0 <= t - 6.0) else { continue };
        assert!(
            stored(items) as u64 <= head - head_before + 1,
            "at {t:.1} s the state table holds {} versions; {} were committed in the 6 s before: {samples:?}",
            stored(items),
            head - head_before
        );
    }
    // Nothing else grows with time: the other kinds of items hold as many
    // at the end as after the first seconds.
    let others = |items: &std::collections::BTreeMap<String, usize>| {
        items.iter().filter(|(k, _)| *k != "version" && *k != "reader").map(|(_, n)| n).sum::<usize>()
    };
    assert!(others(&last_items) <= others(&samples[2].1), "{samples:?}");
    assert!(stored(&last_items) < committed as usize / 2, "{samples:?}");

    // A restart reads the pruned catalog: the same rows, and nothing
    // replayed twice.
    let again = common::serve(dir.path(), &lake, &moto.env(), &spec, &opts);
    assert_eq!(common::count_and_sum(&again).unwrap(), common::expected(xid));
    assert_eq!(again.sql("SELECT count(DISTINCT v) FROM public.t").unwrap(), format!("{}\n", xid - 1));
    drop(again.stop());
}

/// S3 and DynamoDB as they fail in production, through an HTTP layer in
/// front of moto: requests throttled, dropped, delayed, and failed after
/// being applied (a conditional write that landed, reported failed). A
/// replay of pg-tiny, then a `fovea serve` of a growing stream on the same
/// services, each end equal to what runs without faults produce.
#[test]
fn s3_and_dynamodb_faults_leave_a_replay_and_a_serve_exact() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("faulty").unwrap();
    let seed = std::env::var("FOVEA_FAULT_SEED").unwrap_or_else(|_| "3".into());
    let faults = ["--throttle", "0.15", "--drop", "0.05", "--after", "0.08", "--delay-ms", "20", "--seed", &seed];
    let proxy = fovea_testkit::moto::FaultProxy::start(&moto.endpoint, &faults).unwrap();
    let through_proxy = |c: &mut Command| {
        c.env("AWS_ENDPOINT_URL", &proxy.endpoint);
    };
    let input = data().join("debezium_events.precise_schemas.jsonl.gz");
    let lake = ["--lake", "s3://faulty/pg-tiny", "--state", "dynamodb://fovea-faulty"];
    let mut replay = fovea(&moto);
    through_proxy(&mut replay);
    let out = ok(replay
        .arg("replay")
        .args(lake)
        .arg("--input")
        .arg(&input)
        .args(["--checkpoint-txns", "20"])
        .output()
        .unwrap());
    assert!(out.contains("replayed"), "{out}");
    for t in tables() {
        let expected = gunzip(&data().join(format!("final_tables/{t}.csv.gz")));
        assert_eq!(export(&moto, &lake, &t), expected, "{t}");
    }

    // A served, growing stream on the same faulty services.
    let dir = tempfile::tempdir().unwrap();
    let stream = dir.path().join("events.jsonl");
    let spec = format!("file:{}", stream.display());
    let served = ["--lake", "s3://faulty/served", "--state", "dynamodb://fovea-faulty-served"].map(str::to_owned);
    let mut env = moto.env();
    env.retain(|(k, _)| *k != "AWS_ENDPOINT_URL");
    env.push(("AWS_ENDPOINT_URL", proxy.endpoint.clone()));
    common::append_txns(&stream, 1..31);
    let server = common::serve(dir.path(), &served, &env, &spec, &["--checkpoint-secs", "0.3", "--gc-secs", "1"]);
    for batch in 0..5u64 {
        common::append_txns(&stream, 31 + 10 * batch..41 + 10 * batch);
        std::thread::sleep(Duration::from_millis(400));
    }
    common::eventually(Duration::from_secs(120), "every transaction served", || {
        (common::count_and_sum(&server)? == common::expected(81)).then_some(())
    });
    let log = server.stop();
    assert!(!log.contains("ERROR"), "{log}");
    // What it made durable reads back exactly without the faults.
    let restarted = common::serve(dir.path(), &served, &moto.env(), &spec, &[]);
    assert_eq!(common::count_and_sum(&restarted).unwrap(), common::expected(81));
    assert_eq!(restarted.sql("SELECT count(DISTINCT v) FROM public.t").unwrap(), "80\n");
    drop(restarted.stop());
    let stats = proxy.stats();
    eprintln!("faults injected: {stats:?}");
    for kind in ["throttled", "dropped", "after"] {
        assert!(stats.get(kind).copied().unwrap_or(0) > 0, "no {kind} fault injected: {stats:?}");
    }
}
