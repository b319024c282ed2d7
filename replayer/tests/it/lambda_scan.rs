//! Scans fanned out to the Lambda scan function (`functions/scan`), with
//! `cargo lambda watch` as the local Lambda endpoint and moto as S3 and
//! DynamoDB, as a user runs them: `fovea sql --scan lambda://fovea-scan`.
//! * every query of the sqllogictest file (but time travel, which a lake
//!   reader does not answer) gives the same answer through Lambda as in
//!   process, inline and with every answer spilled to S3 (and nothing left
//!   behind in S3);
//! * a hung invocation times out and is retried once; two hung ones fail
//!   the query, naming the function, the split and the timeout;
//! * a file retired under a plan is a typed error (ObjectMissing) that is
//!   not retried and tells the user to run the query again.
//!
//! The Python package's scans on the function, and the example notebook,
//! are tested in clients/python/tests.

use crate::common;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{ok, pg_tiny as data};
use fovea_testkit::lambda_local::LocalLambda;
use fovea_testkit::moto::Moto;

const S3: [&str; 4] = ["--lake", "s3://lake/pg-tiny", "--state", "dynamodb://fovea-lambda"];

fn fovea(moto: &Moto) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fovea"));
    c.envs(moto.env());
    c
}

/// The scan function's binary, built beside `fovea` by `cargo build --workspace`.
fn scan_function() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_fovea")).with_file_name("fovea-scan")
}

fn lambda(moto: &Moto, instances: usize) -> LocalLambda {
    let env: Vec<(String, String)> = moto.env().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let workspace = fovea_testkit::workspace_dir();
    LocalLambda::start(&workspace, &scan_function(), instances, &env).unwrap()
}

/// `fovea sql` in CSV, in process (`scan` = None) or through Lambda.
fn sql(moto: &Moto, lambda: Option<(&LocalLambda, &str)>, query: &str) -> std::process::Output {
    let mut c = fovea(moto);
    c.args(["sql", "--format", "csv"]).args(S3);
    if let Some((lambda, params)) = lambda {
        c.env("AWS_ENDPOINT_URL_LAMBDA", lambda.endpoint()).arg("--scan").arg(format!("lambda://fovea-scan{params}"));
    }
    c.arg(query).output().unwrap()
}

/// Rows in a canonical order (queries without ORDER BY may return any).
fn sorted(csv: &str) -> Vec<String> {
    let mut lines: Vec<String> = csv.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

/// The SQL of every `query` record of an .slt file, but those between
/// `SET fovea.as_of` and `RESET fovea.as_of` (time travel).
fn slt_queries(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut out = Vec::new();
    let mut lines = text.lines();
    let mut time_travel = false;
    while let Some(line) = lines.next() {
        if line.starts_with("SET fovea.as_of") {
            time_travel = true;
        } else if line.starts_with("RESET fovea.as_of") {
            time_travel = false;
        } else if line.starts_with("query ") && !time_travel {
            let query: Vec<&str> = lines.by_ref().take_while(|l| *l != "----").collect();
            out.push(query.join("\n"));
        }
    }
    out
}

#[test]
fn lambda_scans_answer_as_in_process_and_fail_cleanly() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("lake").unwrap();
    let input = data().join("debezium_events.precise_schemas.jsonl.gz");
    ok(fovea(&moto).arg("replay").args(S3).arg("--input").arg(&input).output().unwrap());
    let lambda = lambda(&moto, 2);

    // Same answers, inline and spilled (1 KiB inline limit).
    let queries = slt_queries(&fovea_testkit::workspace_dir().join("sql/tests/slt/pg_tiny.slt"));
    assert!(queries.len() >= 8, "{queries:?}");
    for query in queries.iter().filter(|q| !q.to_ascii_uppercase().starts_with("EXPLAIN")) {
        let local = ok(sql(&moto, None, query));
        for params in ["?concurrency=4&timeout_s=30", "?concurrency=2&inline_kb=1&timeout_s=30"] {
            let out = sql(&moto, Some((&lambda, params)), query);
            assert!(
                out.status.success(),
                "{query} through lambda{params}: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                lambda.instance_logs()
            );
            assert_eq!(sorted(&String::from_utf8_lossy(&out.stdout)), sorted(&local), "{query} through lambda{params}");
        }
    }

    // The table's splits go to the function in one invocation (they are
    // far below 64 MB to read), as the plan says.
    let explained = ok(sql(&moto, Some((&lambda, "")), "EXPLAIN SELECT * FROM tpcc.order_line"));
    let field = |name: &str| -> usize {
        let at = explained.find(&format!("{name}=")).unwrap_or_else(|| panic!("no {name} in {explained}"));
        explained[at + name.len() + 1..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    assert!(field("invocations") == 1 && field("splits") > 1, "{explained}");
    // A big answer spilled in several invocations: same as in process, and
    // nothing left under the spill prefix.
    let all = "SELECT * FROM tpcc.order_line";
    let local = ok(sql(&moto, None, all));
    assert_eq!(sorted(&ok(sql(&moto, Some((&lambda, "?inline_kb=1&timeout_s=30")), all))), sorted(&local));
    assert_eq!(moto.list_keys("lake", "pg-tiny/_fovea/scan-results").unwrap(), Vec::<String>::new());

    // One hung instance (it holds the first invocation and never answers):
    // the invocation times out, is retried once on the other, and the
    // answer is whole.
    let count = "SELECT count(*) AS n, sum(abalance) AS s FROM public.pgbench_accounts";
    let expected = ok(sql(&moto, None, count));
    lambda.pause_instance(0, true).unwrap();
    let out = sql(&moto, Some((&lambda, "?concurrency=1&timeout_s=3")), count);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    // Whether the paused instance took an invocation depends on which
    // instance polled first: if it did, the retry shows.
    if stderr.contains("retrying once") {
        assert!(stderr.contains("no answer within 3 s"), "{stderr}");
    }
    // Both hung: the query fails, naming the function, split and timeout.
    lambda.pause_instance(1, true).unwrap();
    let out = sql(&moto, Some((&lambda, "?concurrency=1&timeout_s=2")), count);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("fovea-scan")
            && stderr.contains("after 2 attempt(s)")
            && stderr.contains("no answer within 2 s"),
        "{stderr}"
    );
    lambda.pause_instance(0, false).unwrap();
    lambda.pause_instance(1, false).unwrap();
    drop(lambda);

    // A file retired under the plan: ObjectMissing, not retried, "run it
    // again". (The files are deleted behind the lake's back.)
    let lambda = self::lambda(&moto, 1);
    let files = moto.list_keys("lake", "pg-tiny/tables").unwrap();
    assert!(!files.is_empty());
    let parquet: Vec<&String> = files.iter().filter(|k| k.ends_with(".parquet")).collect();
    moto.delete_objects("lake", &parquet).unwrap();
    let out = sql(&moto, Some((&lambda, "?timeout_s=30")), count);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("ObjectMissing") && stderr.contains("after 1 attempt(s)") && stderr.contains("run it again"),
        "{stderr}"
    );
    // Each invocation logged one metrics line (CloudWatch EMF, dimension
    // Function): the failed ones with the failure's kind.
    let emf = common::emf_records(&lambda.instance_logs());
    assert!(!emf.is_empty() && emf.iter().all(|r| r["Function"] == "scan" && r["invocations"] == 1.0), "{emf:?}");
    let failed: Vec<_> = emf.iter().filter(|r| r["failures"] == 1.0).collect();
    assert!(!failed.is_empty() && failed.iter().all(|r| r["errorType"] == "ObjectMissing"), "{emf:?}");
    assert!(failed.iter().all(|r| r.get("rows").is_none()), "{failed:?}");
}

/// A bank as Debezium lines (one source transaction per transfer, grouped
/// by txId): 100 accounts in each of bank.a and bank.b, every transfer
/// moves money from one table to the other; the total stays 20000.
fn bank_lines(txns: u64) -> String {
    let mut out = String::new();
    let mut bal = [[100i64; 100]; 2];
    let mut lsn = 1000u64;
    let mut line = |table: usize, id: usize, before: Option<i64>, after: i64, xid: u64| {
        lsn += 8;
        let name = ["a", "b"][table];
        let value = serde_json::json!({
            "before": before.map(|b| serde_json::json!({"id": id, "bal": b})),
            "after": {"id": id, "bal": after},
            "source": {"connector": "postgresql", "ts_ms": 1_790_000_000_000u64 + xid, "schema": "bank",
                       "table": name, "txId": xid, "lsn": lsn},
            "op": if before.is_some() { "u" } else { "c" },
        });
        out.push_str(&value.to_string());
        out.push('\n');
    };
    for table in 0..2 {
        for id in 0..100 {
            line(table, id, None, 100, 1);
        }
    }
    let mut seed = 7u64;
    let mut next = |n: u64| {
        // A small LCG: deterministic transfers without another dependency.
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for t in 0..txns {
        let (from, to) = (next(100) as usize, next(100) as usize);
        let (tf, tt) = if t % 2 == 0 { (0, 1) } else { (1, 0) };
        let amount = 1 + next(9) as i64;
        bal[tf][from] -= amount;
        bal[tt][to] += amount;
        line(tf, from, Some(bal[tf][from] + amount), bal[tf][from], t + 2);
        line(tt, to, Some(bal[tt][to] - amount), bal[tt][to], t + 2);
    }
    out
}

#[test]
fn lambda_scans_never_see_a_partial_transaction_while_replay_runs() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("lake").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bank.jsonl");
    std::fs::write(&input, bank_lines(30000)).unwrap();
    let schema = dir.path().join("bank.sql");
    std::fs::write(
        &schema,
        "CREATE TABLE bank.a (id bigint PRIMARY KEY, bal bigint NOT NULL);\nCREATE TABLE bank.b (id bigint PRIMARY KEY, bal bigint NOT NULL);\n",
    )
    .unwrap();
    let lake = ["--lake", "s3://lake/bank", "--state", "dynamodb://fovea-bank"];
    let lambda = lambda(&moto, 2);
    // A checkpoint every 25 source transactions at most (written back to
    // back): readers see many states, and the replay runs long enough
    // (30,000 transactions, some 10 s) for several answers while it does.
    let mut replay = fovea(&moto)
        .arg("replay")
        .args(lake)
        .arg("--input")
        .arg(&input)
        .arg("--schema-file")
        .arg(&schema)
        .args(["--checkpoint-txns", "25"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("replay.log")).unwrap())
        .spawn()
        .unwrap();
    let total = "SELECT (SELECT sum(bal) FROM bank.a) + (SELECT sum(bal) FROM bank.b) AS total, (SELECT count(*) FROM bank.a) + (SELECT count(*) FROM bank.b) AS n";
    let query = |extra: &str| {
        let mut c = fovea(&moto);
        c.env("AWS_ENDPOINT_URL_LAMBDA", lambda.endpoint())
            .args(["sql", "--format", "csv"])
            .args(lake)
            .arg("--scan")
            .arg(format!("lambda://fovea-scan?concurrency=2{extra}"))
            .arg(total)
            .output()
            .unwrap()
    };
    let (mut during, mut after) = (0, 0);
    let began = std::time::Instant::now();
    loop {
        let running = replay.try_wait().unwrap().is_none();
        let out = query("");
        // Before the first checkpoint the lake has no tables yet.
        if out.status.success() {
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "total,n\n20000,200\n",
                "an answer saw a partial source transaction"
            );
            if running { during += 1 } else { after += 1 }
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(during + after == 0 && stderr.contains("bank"), "{stderr}\n{}", lambda.instance_logs());
        }
        if !running && after >= 2 {
            break;
        }
        assert!(began.elapsed() < std::time::Duration::from_secs(300), "replay did not end");
    }
    assert!(replay.wait().unwrap().success(), "{}", std::fs::read_to_string(dir.path().join("replay.log")).unwrap());
    assert!(during >= 2, "only {during} answers while the replay ran");
    eprintln!("{during} answers while the replay ran, {after} after it");
}
