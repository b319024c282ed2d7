//! Kinesis input against a local Kinesis (kinesalite) with the lake on S3
//! and its state on DynamoDB (moto), or a local lake:
//! * pg-tiny's Debezium stream over 4 shards partitioned by key (BEGIN/END
//!   by transaction id), 5% of records put twice and some batches re-sent
//!   after later ones, a shard split and a merge between two runs, and a
//!   run killed with SIGKILL: the tables equal PostgreSQL's;
//! * the same changes as AWS DMS records with transaction details over 3
//!   shards partitioned by schema-table: equal; without transaction details
//!   refused with the producer setting to change; a bad record named by
//!   stream, shard and sequence number, nothing of its transaction visible;
//! * a bank transfer stream over 4 shards followed by `fovea serve` while
//!   queries run: no answer sees a partial source transaction;
//! * enhanced fan-out on kinesis-local, and its fallback to polling where
//!   the stand-in has no consumers: equal to the file replay.

use crate::common;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{eventually, gunzip, ok, pg_tiny as data, pg_tiny_tables as tables};
use fovea_testkit::kinesis::KinesisProducer;
use fovea_testkit::moto::{Kinesalite, KinesisLocal, Moto};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde_json::{Value as Json, json};

struct Aws {
    moto: Moto,
    kinesis: Kinesalite,
    /// kinesis-local instead of kinesalite, read by enhanced fan-out.
    fan_out: Option<KinesisLocal>,
}

impl Aws {
    /// moto and kinesalite: the stream read by polling.
    fn start() -> Aws {
        let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
        moto.create_bucket("lake").unwrap();
        Aws { moto, kinesis: Kinesalite::start().unwrap(), fan_out: None }
    }

    /// moto and kinesis-local: the stream read by enhanced fan-out
    /// ([`Aws::input`] names the consumer; subscriptions renewed every 2 s).
    fn start_fan_out() -> Aws {
        Aws { fan_out: Some(KinesisLocal::start().unwrap()), ..Aws::start() }
    }

    fn endpoint(&self) -> &str {
        self.fan_out.as_ref().map_or(&self.kinesis.endpoint, |k| &k.endpoint)
    }

    fn fovea(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fovea"));
        c.envs(self.moto.env()).env("AWS_ENDPOINT_URL_KINESIS", self.endpoint());
        c
    }

    fn producer(&self) -> KinesisProducer {
        KinesisProducer::connect(Some(self.endpoint())).unwrap()
    }

    /// `url` (`kinesis://STREAM?…`) as this stand-in is read.
    fn input(&self, url: &str) -> String {
        match self.fan_out {
            Some(_) => format!("{url}&consumer=fovea-test&renew_secs=2"),
            None => url.to_owned(),
        }
    }

    /// A replay's logs (`fovea_aws::kinesis=info`) say how it read.
    fn check_reading(&self, logs: &str) {
        if self.fan_out.is_some() {
            assert!(logs.contains("reading the stream by enhanced fan-out"), "{logs}");
            assert!(!logs.contains("unavailable"), "{logs}");
        }
    }
}

type Records = Vec<(String, Vec<u8>)>;

/// What Debezium Server puts for each line of a Kafka-style file.
fn debezium_records(path: &std::path::Path) -> Records {
    gunzip(path).lines().filter_map(|l| fovea_testkit::kinesis::debezium_server_record(l).unwrap()).collect()
}

/// A producer's faults: 5% of records put twice (a retried put whose
/// first attempt had landed), and batches of 10 re-sent after the next 30
/// records (a failed batch retried later).
fn with_faults(records: &Records, seed: u64) -> Records {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = records.clone();
    let mut i = 0;
    while i + 40 < out.len() {
        if rng.random_bool(0.3) {
            let batch: Vec<_> = out.drain(i..i + 10).collect();
            for (k, r) in batch.into_iter().enumerate() {
                out.insert(i + 30 + k, r);
            }
        }
        i += 60;
    }
    let mut faulty = Vec::with_capacity(out.len() * 21 / 20);
    let mut later: Vec<(usize, (String, Vec<u8>))> = Vec::new();
    for (n, r) in out.into_iter().enumerate() {
        faulty.push(r.clone());
        if rng.random_bool(0.05) {
            later.push((n + rng.random_range(1..20), r));
        }
        while let Some(pos) = later.iter().position(|(at, _)| *at <= n) {
            faulty.push(later.remove(pos).1);
        }
    }
    faulty.extend(later.into_iter().map(|(_, r)| r));
    faulty
}

fn export(aws: &Aws, lake: &[&str], table: &str) -> String {
    ok(aws.fovea().args(["export", "--table", table]).args(lake).output().unwrap())
}

fn schema() -> String {
    data().join("schema.sql").display().to_string()
}

fn replay(aws: &Aws, lake: &[&str], input: &str, extra: &[&str]) -> std::process::Output {
    aws.fovea().arg("replay").args(lake).args(["--input", input]).args(extra).output().unwrap()
}

#[test]
fn debezium_over_four_shards_with_faults_resharding_and_sigkill_equals_postgres() {
    debezium_over_four_shards(Aws::start());
}

#[test]
fn debezium_over_four_shards_by_enhanced_fan_out_equals_postgres() {
    debezium_over_four_shards(Aws::start_fan_out());
}

/// Debezium records with duplicates and faults over four shards, a split
/// and a merge between runs, the replayer SIGKILLed after its first
/// checkpoint: the lake ends equal to PostgreSQL's tables.
fn debezium_over_four_shards(aws: Aws) {
    let producer = aws.producer();
    producer.create_stream("cdc", 4).unwrap();
    let records = with_faults(&debezium_records(&data().join("debezium_events.precise_schemas.jsonl.gz")), 7);
    let half = records.len() / 2;
    producer.put("cdc", &records[..half]).unwrap();
    let lake = ["--lake", "s3://lake/kinesis", "--state", "dynamodb://fovea-kinesis"];
    let input = &aws.input("kinesis://cdc?poll_ms=20");
    // The first half ends inside a transaction: it stays unapplied.
    let first = ok(replay(&aws, &lake, input, &[]));
    assert!(first.contains("replayed"), "{first}");

    // A split and a merge, then the rest.
    let shards = producer.open_shards("cdc").unwrap();
    producer.split("cdc", &shards[0].0).unwrap();
    let shards = producer.open_shards("cdc").unwrap();
    let n = shards.len();
    producer.merge("cdc", &shards[n - 2].0, &shards[n - 1].0).unwrap();
    producer.put("cdc", &records[half..]).unwrap();

    // Killed right after its first checkpoint (of 5 transactions), then
    // run to the end.
    let mut logs = String::new();
    {
        let mut child = aws
            .fovea()
            .env("FOVEA_LOG", "fovea_core::sink=debug,fovea_aws::kinesis=info")
            .arg("replay")
            .args(lake)
            .args(["--input", input, "--checkpoint-txns", "5"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() > 0 {
            logs.push_str(&line);
            if line.contains("checkpoint") {
                break;
            }
            line.clear();
        }
        child.kill().unwrap();
        assert!(!child.wait().unwrap().success(), "killed before the end:\n{logs}");
    }
    let last = aws
        .fovea()
        .env("FOVEA_LOG", "fovea_aws::kinesis=info")
        .arg("replay")
        .args(lake)
        .args(["--input", input])
        .output()
        .unwrap();
    logs.push_str(&String::from_utf8_lossy(&last.stderr));
    assert!(last.status.success(), "{logs}");
    aws.check_reading(&String::from_utf8_lossy(&last.stderr));
    // The split and the merged parents were read to their ends.
    assert!(logs.matches("shard read to its end").count() >= 3, "{logs}");
    for t in tables() {
        let expected = gunzip(&data().join(format!("final_tables/{t}.csv.gz")));
        assert_eq!(export(&aws, &lake, &t), expected, "{t}");
    }
    // Caught up: a rerun applies nothing.
    let again = ok(replay(&aws, &lake, input, &[]));
    assert!(again.contains("replayed 0 transactions"), "{again}");
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` of µs since the epoch.
fn iso(us: i64) -> String {
    let (days, rem) = (us.div_euclid(86_400_000_000), us.rem_euclid(86_400_000_000));
    // Civil from days (H. Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (s, f) = (rem / 1_000_000, rem % 1_000_000);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{f:06}Z", s / 3600, s / 60 % 60, s % 60)
}

/// The changes of a Debezium stream (plain values) as AWS DMS writes them
/// to Kinesis with `IncludeTransactionDetails` (documented layout: `data`,
/// `before-image`, `metadata` with `transaction-id`,
/// `transaction-record-id`, `prev-transaction-id`,
/// `prev-transaction-record-id`, `commit-timestamp`, `stream-position`),
/// partitioned by schema-table. `details: false` leaves the transaction
/// fields out.
fn dms_records(path: &std::path::Path, details: bool) -> Records {
    let mut out = Vec::new();
    let mut prev: Option<(u64, u64)> = None;
    let (mut txid, mut k, mut ts) = (0u64, 0u64, String::new());
    for line in gunzip(path).lines() {
        let v: Json = serde_json::from_str(line).unwrap();
        let value = &v["value"];
        if value.is_null() {
            continue;
        }
        match value.get("status").and_then(Json::as_str) {
            Some("BEGIN") => {
                txid = value["id"].as_str().unwrap().split(':').next().unwrap().parse().unwrap();
                k = 0;
                ts = iso(value["ts_ms"].as_i64().unwrap() * 1000);
                continue;
            }
            Some(_) => {
                prev = Some((txid, k));
                continue;
            }
            None => {}
        }
        k += 1;
        let source = &value["source"];
        let op = value["op"].as_str().unwrap();
        let (operation, data) = match op {
            "c" => ("insert", &value["after"]),
            "r" => ("load", &value["after"]),
            "u" => ("update", &value["after"]),
            _ => ("delete", &value["before"]),
        };
        let table = format!("{}.{}", source["schema"].as_str().unwrap(), source["table"].as_str().unwrap());
        let lsn = source["lsn"].as_u64().unwrap();
        let (prev_t, prev_r) =
            if k == 1 { prev.map_or((None, None), |(t, r)| (Some(t), Some(r))) } else { (Some(txid), Some(k - 1)) };
        let mut meta = json!({
            "timestamp": ts,
            "record-type": "data",
            "operation": operation,
            "partition-key-type": "schema-table",
            "schema-name": source["schema"],
            "table-name": source["table"],
        });
        if details {
            let m = meta.as_object_mut().unwrap();
            m.insert("transaction-id".into(), json!(txid));
            m.insert("transaction-record-id".into(), json!(k));
            m.insert("prev-transaction-id".into(), json!(prev_t));
            m.insert("prev-transaction-record-id".into(), json!(prev_r));
            m.insert("commit-timestamp".into(), json!(ts));
            m.insert(
                "stream-position".into(),
                json!(format!(
                    "{:08X}/{:08X}.{k}.{:08X}/{:08X}",
                    lsn >> 32,
                    lsn & 0xffff_ffff,
                    lsn >> 32,
                    lsn & 0xffff_ffff
                )),
            );
        }
        let mut record = json!({ "data": data, "metadata": meta });
        if op == "u" && !value["before"].is_null() {
            record.as_object_mut().unwrap().insert("before-image".into(), value["before"].clone());
        }
        out.push((table, record.to_string().into_bytes()));
    }
    out
}

#[test]
fn dms_with_transaction_details_over_three_shards_equals_postgres_and_bad_input_is_named() {
    dms_over_three_shards(Aws::start());
}

#[test]
fn dms_over_three_shards_by_enhanced_fan_out_equals_postgres_and_bad_input_is_named() {
    dms_over_three_shards(Aws::start_fan_out());
}

/// AWS DMS records with transaction details and faults over three shards
/// equal PostgreSQL's tables; keyless tables, the held-records cap, a
/// stream without transaction details and a record that is not JSON are
/// errors naming what and where.
fn dms_over_three_shards(aws: Aws) {
    let producer = aws.producer();
    let plain = data().join("debezium_events.jsonl.gz");
    producer.create_stream("dms", 3).unwrap();
    producer.put("dms", &with_faults(&dms_records(&plain, true), 3)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lake_dir = dir.path().join("lake");
    let lake = ["--lake", lake_dir.to_str().unwrap()];
    let out = aws
        .fovea()
        .env("FOVEA_LOG", "fovea_aws::kinesis=info")
        .args(["replay", "--lake", lake[1], "--input", &aws.input("kinesis://dms?poll_ms=20&format=dms")])
        .args(["--schema-file", &schema()])
        .output()
        .unwrap();
    aws.check_reading(&String::from_utf8_lossy(&out.stderr));
    let out = ok(out);
    assert!(out.contains("replayed 96 transactions"), "{out}");
    for t in tables() {
        let expected = gunzip(&data().join(format!("final_tables/{t}.csv.gz")));
        assert_eq!(export(&aws, &lake, &t), expected, "{t}");
    }

    // DMS records carry no key: without a schema file the table is named.
    let keyless = dir.path().join("keyless");
    let err =
        replay(&aws, &["--lake", keyless.to_str().unwrap()], &aws.input("kinesis://dms?poll_ms=20&format=dms"), &[]);
    let stderr = String::from_utf8_lossy(&err.stderr);
    assert!(!err.status.success() && stderr.contains("table public.pgbench_"), "{stderr}");
    // Held records past the cap: stopped, naming the transaction held and the cap.
    let capped = dir.path().join("capped");
    let err = replay(
        &aws,
        &["--lake", capped.to_str().unwrap()],
        &aws.input("kinesis://dms?poll_ms=20&format=dms&max_held_mb=0"),
        &["--schema-file", &schema()],
    );
    let stderr = String::from_utf8_lossy(&err.stderr);
    assert!(
        !err.status.success()
            && stderr.contains("reach the cap of 0 bytes")
            && stderr.contains("source transaction 31203"),
        "{stderr}"
    );

    // Without transaction details over several shards: refused, naming the setting.
    producer.create_stream("plain-dms", 3).unwrap();
    producer.put("plain-dms", &dms_records(&plain, false)[..30]).unwrap();
    let other = dir.path().join("other");
    let other_lake = ["--lake", other.to_str().unwrap()];
    let err = replay(&aws, &other_lake, &aws.input("kinesis://plain-dms?poll_ms=20"), &["--schema-file", &schema()]);
    let stderr = String::from_utf8_lossy(&err.stderr);
    assert!(!err.status.success() && stderr.contains("IncludeTransactionDetails"), "{stderr}");

    // A record that is not JSON, inside the second transaction: named by
    // stream, shard and sequence number; the first transaction is kept,
    // nothing of the second is visible.
    producer.create_stream("bad", 1).unwrap();
    let good = dms_records(&plain, true);
    let first_txn =
        good.iter().take_while(|r| String::from_utf8_lossy(&r.1).contains("\"transaction-id\":31203")).count();
    let mut bad = good[..first_txn + 2].to_vec();
    bad.push(("x".into(), b"{not json".to_vec()));
    let seqs = producer.put("bad", &bad).unwrap();
    let bad_dir = dir.path().join("bad");
    let bad_lake = ["--lake", bad_dir.to_str().unwrap()];
    let err = replay(&aws, &bad_lake, &aws.input("kinesis://bad?poll_ms=20"), &["--schema-file", &schema()]);
    let stderr = String::from_utf8_lossy(&err.stderr);
    assert!(!err.status.success(), "{stderr}");
    assert!(
        stderr.contains("stream bad, shard shardId-000000000000")
            && stderr.contains(&format!("sequence number {}", seqs.last().unwrap()))
            && stderr.contains("malformed JSON"),
        "{stderr}"
    );
    let rows = ok(aws
        .fovea()
        .args(["sql", "--format", "csv"])
        .args(bad_lake)
        .arg("SELECT count(*) AS n FROM public.pgbench_branches")
        .output()
        .unwrap());
    assert_eq!(rows.trim(), "n\n1", "the first transaction (one branch) is kept");
}

/// Debezium records of a bank: accounts split over two tables, each
/// transaction moves money between one row of each; the total stays 20000.
fn bank_records(txns: u64) -> Records {
    let mut out = Vec::new();
    let mut lsn = 1000u64;
    let mut prev_commit: Option<u64> = None;
    let mut bal = [[100i64; 100]; 2];
    let tables = ["a", "b"];
    let mut rng = SmallRng::seed_from_u64(5);
    for t in 0..=txns {
        let xid = 500 + t;
        let mut rows: Vec<(usize, i64, Option<i64>, i64)> = Vec::new();
        if t == 0 {
            for (ti, _) in tables.iter().enumerate() {
                for id in 0..100 {
                    rows.push((ti, id, None, 100));
                }
            }
        } else {
            let (from, to) = (rng.random_range(0..100usize), rng.random_range(0..100usize));
            let (tf, tt) = if t % 2 == 0 { (0, 1) } else { (1, 0) };
            let amount = rng.random_range(1..10);
            bal[tf][from] -= amount;
            bal[tt][to] += amount;
            rows.push((tf, from as i64, Some(bal[tf][from] + amount), bal[tf][from]));
            rows.push((tt, to as i64, Some(bal[tt][to] - amount), bal[tt][to]));
        }
        lsn += 8;
        out.push((
            xid.to_string(),
            json!({"status": "BEGIN", "id": format!("{xid}:{lsn}"), "event_count": null, "ts_ms": 1_790_000_000_000u64 + t})
                .to_string()
                .into_bytes(),
        ));
        let n = rows.len();
        for (i, (ti, id, before, after)) in rows.into_iter().enumerate() {
            lsn += 8;
            let value = json!({
                "before": before.map(|b| json!({"id": id, "bal": b})),
                "after": {"id": id, "bal": after},
                "source": {"connector": "postgresql", "ts_us": 1_790_000_000_000_000u64 + t * 1000, "schema": "bank", "table": tables[ti],
                           "txId": xid, "lsn": lsn, "sequence": json!([prev_commit.map(|c| c.to_string()), lsn.to_string()]).to_string()},
                "transaction": {"id": format!("{xid}:{lsn}"), "total_order": i + 1, "data_collection_order": 1},
                "op": if before.is_some() { "u" } else { "c" },
            });
            // Debezium Server's partition key: the record key as JSON.
            out.push((json!({ "id": id }).to_string(), value.to_string().into_bytes()));
        }
        lsn += 8;
        out.push((
            xid.to_string(),
            json!({"status": "END", "id": format!("{xid}:{lsn}"), "event_count": n, "ts_ms": 1_790_000_000_000u64 + t})
                .to_string()
                .into_bytes(),
        ));
        prev_commit = Some(lsn);
    }
    out
}

/// `fovea status --input` beside a live `fovea serve` reading a stream
/// (kinesis-local, which reports MillisBehindLatest from the shard's tip;
/// kinesalite reports 0): caught up, nothing waits; while the replayer is
/// paused (SIGSTOP) and transactions keep arriving, the shard shows records
/// waiting and its lag grows with every arrival; resumed, it catches up.
#[test]
fn status_shows_the_lag_of_a_paused_replayer_s_shard_growing() {
    let aws = Aws::start_fan_out();
    let producer = aws.producer();
    producer.create_stream("lag", 1).unwrap();
    let records = bank_records(60);
    // Transaction ends: chunks of whole transactions.
    let ends: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, (_, v))| String::from_utf8_lossy(v).contains(r#""status":"END""#))
        .map(|(i, _)| i + 1)
        .collect();
    let chunk = |n: usize| &records[ends[n * 20 - 20]..ends[n * 20]];
    producer.put("lag", &records[..ends[20]]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lake_args = ["--lake", "s3://lake/lag", "--state", "dynamodb://fovea-lag"].map(str::to_owned);
    let mut env = aws.moto.env();
    env.push(("AWS_ENDPOINT_URL_KINESIS", aws.endpoint().to_owned()));
    let server = common::serve(
        dir.path(),
        &lake_args,
        &env,
        "kinesis://lag?poll_ms=20",
        &["--checkpoint-secs", "0.2", "--lease-secs", "30", "--iceberg", "off"],
    );
    let shard = || -> Json {
        let out = aws.fovea().args(["status", "--json"]).args(&lake_args).args(["--input", "kinesis://lag"]).output();
        let status: Json = serde_json::from_slice(ok(out.unwrap()).as_bytes()).unwrap();
        status["input"]["shards"][0].clone()
    };
    eventually(Duration::from_secs(60), "the replayer catches up", || (shard()["waiting"] == false).then_some(()));

    common::signal(&server, "-STOP");
    producer.put("lag", chunk(2)).unwrap();
    let first = shard();
    assert_eq!(first["waiting"], true, "{first}");
    std::thread::sleep(Duration::from_millis(1200));
    producer.put("lag", chunk(3)).unwrap();
    let second = shard();
    let (m1, m2) = (first["millis_behind"].as_u64().unwrap(), second["millis_behind"].as_u64().unwrap());
    assert!(second["waiting"] == true && m2 >= m1 + 1000, "the lag grows while paused: {first} → {second}");
    // The checkpoint's position stays where the pause left it.
    assert_eq!(first["resumes"], second["resumes"], "{first} → {second}");

    common::signal(&server, "-CONT");
    eventually(Duration::from_secs(60), "the resumed replayer catches up", || {
        (shard()["waiting"] == false).then_some(())
    });
    let log = server.stop();
    assert!(!log.contains("ERROR"), "{log}");
}

#[test]
fn queries_during_a_kinesis_replay_never_see_a_partial_transaction() {
    let aws = Aws::start();
    let producer = aws.producer();
    producer.create_stream("bank", 4).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let clean = bank_records(1500);
    let records = with_faults(&clean, 9);
    let chunk = records.len() / 10;
    producer.put("bank", &records[..chunk]).unwrap();
    let lake = dir.path().join("lake");
    let server = common::Server::spawn_with(|[port, mport]| {
        let metrics = format!("127.0.0.1:{mport}");
        let mut cmd = aws.fovea();
        cmd.args(["serve", "--lake", lake.to_str().unwrap(), "--input", "kinesis://bank?poll_ms=5"])
            .args(["--listen", &format!("127.0.0.1:{port}"), "--checkpoint-secs", "1", "--metrics", &metrics])
            .args(["--emf-secs", "0.5"])
            .env_remove("FOVEA_METRICS_NAMESPACE")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("serve.log")).unwrap());
        (cmd, dir.path().join("serve.log"), Some(metrics))
    });
    let total = "SELECT (SELECT sum(bal) FROM bank.a) + (SELECT sum(bal) FROM bank.b) AS total, (SELECT count(*) FROM bank.a) + (SELECT count(*) FROM bank.b) AS n";
    let began = Instant::now();
    let mut answers = 0;
    let mut put = 1;
    loop {
        if put < 10 {
            producer.put("bank", &records[put * chunk..((put + 1) * chunk).min(records.len())]).unwrap();
            put += 1;
        } else if put == 10 {
            producer.put("bank", &records[10 * chunk..]).unwrap();
            put += 1;
        }
        // Before the first transaction the tables do not exist yet.
        if let Ok(out) = server.sql(total) {
            assert_eq!(out.trim(), "20000,200", "a partial source transaction is visible");
            answers += 1;
        }
        if put > 10 && answers >= 30 {
            break;
        }
        assert!(began.elapsed() < Duration::from_secs(120), "{}", server.log());
    }
    // Everything arrives in the end.
    let expected = expected_bank(&clean);
    common::eventually(Duration::from_secs(60), "all transfers applied", || {
        server.sql("SELECT id, bal FROM bank.a ORDER BY id").ok().filter(|o| *o == expected).map(|_| ())
    });
    // Per-shard progress and what is held, on /metrics.
    let text = server.metrics();
    for shard in 0..4 {
        assert!(text.contains(&format!("fovea_shard_records_total{{shard=\"bank/shardId-{shard:012}\"}}")), "{text}");
    }
    assert!(
        text.contains("fovea_shard_millis_behind_latest{") && text.contains("fovea_input_held_transactions "),
        "{text}"
    );
    // A line after the scrape, then the last one when stopping.
    let lines_before = server.emf().len();
    common::eventually(Duration::from_secs(10), "an EMF line after the scrape", || {
        (server.emf().len() > lines_before).then_some(())
    });
    let stdout = std::sync::Arc::clone(&server.stdout);
    let log = server.stop();
    assert!(!log.contains("ERROR"), "{log}");
    let emf = common::emf_records(&stdout.lock().unwrap().join("\n"));
    assert_emf_carries_the_metrics(&emf, &text, lake.to_str().unwrap());
}

/// The EMF lines of a whole `fovea serve` run (`emf`) against a scrape of
/// `/metrics` (`scraped`) taken once everything was applied: counters
/// summed over the lines equal the scraped ones, and the template's alarms
/// and dashboard and the Grafana dashboard name only metrics that exist.
fn assert_emf_carries_the_metrics(emf: &[Json], scraped: &str, lake: &str) {
    let value = |name: &str| common::metric_value(scraped, name);
    let directives = |r: &Json| r["_aws"]["CloudWatchMetrics"].as_array().unwrap().clone();
    let lake_lines: Vec<&Json> =
        emf.iter().filter(|r| directives(r).iter().all(|d| d["Dimensions"] == serde_json::json!([["Lake"]]))).collect();
    let shard_lines: Vec<&Json> = emf
        .iter()
        .filter(|r| directives(r).iter().all(|d| d["Dimensions"] == serde_json::json!([["Lake", "Shard"]])))
        .collect();
    assert_eq!(lake_lines.len() + shard_lines.len(), emf.len(), "lines of other dimensions");
    assert!(lake_lines.len() >= 3, "{} lines", lake_lines.len());
    for r in emf {
        assert_eq!(r["Lake"], lake);
        assert!(directives(r).iter().all(|d| d["Namespace"] == "fovea"));
    }
    // Each metric's unit says what it counts.
    let unit_of = |r: &Json, name: &str| -> Option<String> {
        directives(r)
            .iter()
            .flat_map(|d| d["Metrics"].as_array().unwrap().clone())
            .find_map(|m| (m["Name"] == name).then(|| m["Unit"].as_str().unwrap().to_owned()))
    };
    for (name, unit) in [
        ("rows", "Count"),
        ("hwm", "None"),
        ("lwm", "None"),
        ("lease_epoch", "None"),
        ("stalled", "None"),
        ("rows_per_second", "Count/Second"),
        ("checkpoint_seconds", "Seconds"),
        ("freshness_seconds", "Seconds"),
        ("storage_gc_bytes_before", "Bytes"),
        ("rss_bytes", "Bytes"),
        ("input_lag_bytes", "Bytes"),
        ("memory_index_bytes", "Bytes"),
    ] {
        // (A metric without a value yet, such as freshness before the
        // first transaction, is left out of a line.)
        let found = lake_lines.iter().find_map(|r| unit_of(r, name));
        assert_eq!(found.as_deref(), Some(unit), "{name}: {}", lake_lines[lake_lines.len() - 1]);
    }
    let sum = |lines: &[&Json], name: &str| lines.iter().map(|r| r[name].as_f64().unwrap_or(0.0)).sum::<f64>();
    // Counters: the lines carry changes, which add up to the process's totals.
    for counter in ["rows", "transactions", "checkpoints"] {
        let scraped = value(&format!("fovea_{counter}_total"));
        assert!(scraped > 0.0);
        // Checkpoints go on after the scrape (and one more at the stop).
        if counter == "checkpoints" {
            assert!(sum(&lake_lines, counter) >= scraped, "{counter}");
        } else {
            assert_eq!(sum(&lake_lines, counter), scraped, "{counter}");
        }
    }
    assert_eq!(
        sum(&lake_lines, "transaction_freshness_count"),
        value("fovea_transaction_freshness_seconds_count"),
        "freshness observations"
    );
    let last = lake_lines.last().unwrap();
    // Gauges: as the scrape said once nothing changes any more.
    for gauge in ["hwm", "lwm", "lease_epoch", "input_held_transactions"] {
        assert_eq!(last[gauge].as_f64(), Some(value(&format!("fovea_{gauge}"))), "{gauge}: {last}");
    }
    // Percentiles per interval, ordered, bounded by the interval's largest
    // value (the records' commit times are old: freshness is days here).
    let mut intervals = 0;
    for r in &lake_lines {
        if let Some(p99) = r["transaction_freshness_p99_seconds"].as_f64() {
            let (p50, max) = (
                r["transaction_freshness_p50_seconds"].as_f64().unwrap(),
                r["transaction_freshness_max_seconds"].as_f64().unwrap(),
            );
            assert!(0.0 <= p50 && p50 <= p99 && p99 <= max, "p50 {p50}, p99 {p99}, max {max}");
            assert!(r["transaction_freshness_count"].as_f64().unwrap() >= 1.0);
            intervals += 1;
        }
    }
    assert!(intervals >= 1);
    assert_eq!((sum(&lake_lines, "process_starts"), last["process_starts"].as_f64()), (1.0, Some(0.0)));
    assert_eq!(last["stopped_by_error"].as_f64(), Some(0.0), "a clean stop: {last}");
    assert!(lake_lines[..lake_lines.len() - 1].iter().all(|r| r.get("stopped_by_error").is_none()));
    // Per shard: records read add up to the shard's counter.
    for shard in 0..4 {
        let name = format!("bank/shardId-{shard:012}");
        let lines: Vec<&Json> = shard_lines.iter().copied().filter(|r| r["Shard"] == name.as_str()).collect();
        assert!(!lines.is_empty(), "no line of {name}");
        let scraped = value(&format!("fovea_shard_records_total{{shard=\"{name}\"}}"));
        assert_eq!(sum(&lines, "shard_records"), scraped, "{name}");
        assert!(lines.last().unwrap()["shard_millis_behind_latest"].is_number());
    }
    // What the template's alarms and dashboard and the Grafana dashboard
    // name exists.
    let emitted: std::collections::BTreeSet<String> = emf
        .iter()
        .flat_map(directives)
        .flat_map(|d| {
            d["Metrics"].as_array().unwrap().iter().map(|m| m["Name"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
        })
        .collect();
    let root = fovea_testkit::workspace_dir();
    let template = std::fs::read_to_string(root.join("template.yaml")).unwrap();
    let named = lake_metrics_named_by_the_template(&template);
    assert!(named.len() >= 20, "{named:?}");
    for name in &named {
        assert!(emitted.contains(name), "template.yaml names {name}, which no EMF line carries");
    }
    let grafana = std::fs::read_to_string(root.join("infra/grafana-dashboard.json")).unwrap();
    let grafana: Json = serde_json::from_str(&grafana).expect("the Grafana dashboard is JSON");
    let mut exprs = Vec::new();
    for panel in grafana["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    assert!(exprs.len() >= 10, "{exprs:?}");
    let samples: std::collections::BTreeSet<&str> =
        scraped.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).collect();
    for expr in &exprs {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("fovea_") {
            let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            // A family without samples yet (no error so far) shows its type.
            let family = ["_total", "_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(&name);
            let typed =
                scraped.lines().any(|l| l.strip_prefix("# TYPE ").is_some_and(|t| t.split(' ').next() == Some(family)));
            assert!(
                samples.contains(name.as_str()) || typed,
                "Grafana's {expr:?} names {name}, which /metrics does not show"
            );
            rest = &rest[at + name.len()..];
        }
    }
}

/// The metrics of dimension `Lake` template.yaml's alarms (`MetricName:`)
/// and dashboard (`["${Ns}", "NAME", "Lake", …]`, `[".", "NAME", ".", …]`)
/// name.
fn lake_metrics_named_by_the_template(template: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    // The dimension of the dashboard's last metric line that named one.
    let mut dimension = String::new();
    let lines: Vec<&str> = template.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("MetricName: ") {
            // Function metrics are the functions' (their own test).
            let dims = lines[i + 1..].iter().take(3).map(|l| l.trim()).collect::<Vec<_>>().join(" ");
            if !dims.contains("Name: Function") {
                names.insert(name.to_owned());
            }
        }
        let quoted: Vec<&str> = t.split('"').skip(1).step_by(2).collect();
        if t.starts_with('[') && quoted.len() >= 3 {
            if quoted[2] != "." {
                dimension = quoted[2].to_owned();
            }
            if dimension == "Lake" {
                names.insert(quoted[1].to_owned());
            }
        }
    }
    names
}

/// Table a's final rows as `fovea sql` prints them (CSV without header).
fn expected_bank(records: &Records) -> String {
    let mut bal = std::collections::BTreeMap::new();
    for (_, data) in records {
        let v: Json = serde_json::from_slice(data).unwrap();
        if v["source"]["table"] == "a" {
            bal.insert(v["after"]["id"].as_i64().unwrap(), v["after"]["bal"].as_i64().unwrap());
        }
    }
    bal.iter().map(|(id, b)| format!("{id},{b}\n")).collect()
}

/// A generated HyBench stream (an initial load, then transactions) through
/// 3 shards, with faults, equals the same stream replayed from a file; and
/// so does the stream without faults row at a time (`&atomic=false`, which
/// `fovea history` shows).
#[test]
fn generated_stream_through_kinesis_equals_the_file_replay() {
    let aws = Aws::start();
    let producer = aws.producer();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("stream.jsonl");
    common::hybench(&file, 400, 1);
    let records: Records = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .filter_map(|l| fovea_testkit::kinesis::debezium_server_record(l).unwrap())
        .collect();
    producer.create_stream("gen", 3).unwrap();
    producer.put("gen", &with_faults(&records, 21)).unwrap();
    let lake = |name: &str| dir.path().join(name).display().to_string();
    ok(aws.fovea().args(["replay", "--lake", &lake("file"), "--input", file.to_str().unwrap()]).output().unwrap());
    ok(replay(&aws, &["--lake", &lake("kinesis")], "kinesis://gen?poll_ms=20", &[]));
    // Row at a time is exact only without duplicates and re-sends.
    producer.create_stream("gen-clean", 3).unwrap();
    producer.put("gen-clean", &records).unwrap();
    ok(replay(&aws, &["--lake", &lake("rows")], "kinesis://gen-clean?poll_ms=20&atomic=false", &[]));
    for t in ["hybench.account", "hybench.transfer"] {
        let expected = export(&aws, &["--lake", &lake("file")], t);
        assert!(expected.lines().count() > 100, "{expected}");
        assert_eq!(export(&aws, &["--lake", &lake("kinesis")], t), expected, "{t}");
        assert_eq!(export(&aws, &["--lake", &lake("rows")], t), expected, "{t} row at a time");
    }
    let history = ok(aws.fovea().args(["history", "--limit", "3", "--lake", &lake("rows")]).output().unwrap());
    assert!(history.contains("kinesis-row:gen-clean/shardId-"), "{history}");

    // `fovea status --input`: each shard as the checkpoint leaves it.
    let status = |lake: &str| -> Json {
        let out = aws.fovea().args(["status", "--json", "--lake", lake, "--input", "kinesis://gen"]).output().unwrap();
        serde_json::from_slice(ok(out).as_bytes()).unwrap()
    };
    let shards = |s: &Json| s["input"]["shards"].as_array().unwrap().clone();
    // Read to the tip: every shard resumes after its last record, nothing waits.
    let caught_up = status(&lake("kinesis"));
    assert_eq!(shards(&caught_up).len(), 3, "{caught_up}");
    for shard in shards(&caught_up) {
        assert!(shard["resumes"].as_str().unwrap().starts_with("after "), "{shard}");
        assert_eq!(shard["waiting"], false, "{shard}");
    }
    // Records put since: they wait on the shards they went to.
    producer.put("gen", &records[..30]).unwrap();
    let behind = status(&lake("kinesis"));
    let waiting: Vec<Json> = shards(&behind).into_iter().filter(|s| s["waiting"] == true).collect();
    assert!(!waiting.is_empty() && waiting.iter().all(|s| s["millis_behind"].is_u64()), "{behind}");
    // A lake whose checkpoint is of another input: every shard from the
    // trim horizon (start=), records waiting.
    let other = status(&lake("file"));
    assert!(shards(&other).iter().all(|s| s["resumes"] == "trim_horizon" && s["waiting"] == true), "{other}");
    let text =
        ok(aws.fovea().args(["status", "--lake", &lake("kinesis"), "--input", "kinesis://gen"]).output().unwrap());
    assert!(text.contains("input       3 shards") && text.contains("records waiting"), "{text}");
    let out = aws.fovea().args(["status", "--lake", &lake("kinesis"), "--input", "kafka://x"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--input kafka://x: status reads"), "{err}");
}

/// Kinesis as it fails in production, through an HTTP layer in front of
/// kinesalite: GetRecords, GetShardIterator and ListShards throttled,
/// dropped, delayed and failed after being served, with bursts of
/// throttling that outlast the SDK's own retries. `fovea serve` reports
/// the shards retrying on /metrics while a burst lasts, never answers with
/// a partial transaction, and ends with every transfer; `fovea replay`
/// through the same faults ends equal too.
#[test]
fn kinesis_read_failures_are_retried_with_backoff_and_the_mirror_ends_exact() {
    let aws = Aws::start();
    let producer = aws.producer();
    producer.create_stream("bank", 4).unwrap();
    let clean = bank_records(600);
    producer.put("bank", &with_faults(&clean, 11)).unwrap();
    let faults = [
        "--match",
        "GetRecords|GetShardIterator|ListShards",
        "--throttle",
        "0.1",
        "--drop",
        "0.05",
        "--after",
        "0.05",
        "--delay-ms",
        "30",
        "--burst-every",
        "10",
        "--burst-secs",
        "6",
    ];
    let proxy = fovea_testkit::moto::FaultProxy::start(&aws.kinesis.endpoint, &faults).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::spawn_with(|[port, mport]| {
        let metrics = format!("127.0.0.1:{mport}");
        let mut cmd = aws.fovea();
        cmd.env("AWS_ENDPOINT_URL_KINESIS", &proxy.endpoint)
            .env("FOVEA_LOG", "fovea_aws::kinesis=info")
            .args([
                "serve",
                "--lake",
                dir.path().join("served").to_str().unwrap(),
                "--input",
                "kinesis://bank?poll_ms=20",
            ])
            .args(["--listen", &format!("127.0.0.1:{port}"), "--checkpoint-secs", "1", "--metrics", &metrics])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("serve.log")).unwrap());
        (cmd, dir.path().join("serve.log"), Some(metrics))
    });
    // Retries show on /metrics (a counter: no scrape timing to hit).
    common::eventually(Duration::from_secs(120), "retries counted on /metrics", || {
        let text = server.metrics();
        text.lines()
            .filter(|l| l.starts_with("fovea_shard_read_retries_total{"))
            .any(|l| l.rsplit(' ').next().and_then(|n| n.parse::<f64>().ok()).is_some_and(|n| n > 0.0))
            .then_some(())
    });
    let total = "SELECT (SELECT sum(bal) FROM bank.a) + (SELECT sum(bal) FROM bank.b), (SELECT count(*) FROM bank.a) + (SELECT count(*) FROM bank.b)";
    let expected = expected_bank(&clean);
    common::eventually(Duration::from_secs(180), "all transfers applied", || {
        if let Ok(out) = server.sql(total) {
            assert_eq!(out.trim(), "20000,200", "a partial source transaction is visible");
        }
        server.sql("SELECT id, bal FROM bank.a ORDER BY id").ok().filter(|o| *o == expected).map(|_| ())
    });
    // Between bursts a shard that was retrying reads again, and says so.
    common::eventually(Duration::from_secs(120), "a shard reading again after retries", || {
        server.log().contains("reads succeed again").then_some(())
    });
    let text = server.metrics();
    assert!(text.contains("fovea_shard_state{"), "{text}");
    let log = server.stop();
    assert!(log.contains("reading the shard failed; retrying"), "{log}");

    // A replay through the same faults.
    let lake = dir.path().join("replayed");
    let out = aws
        .fovea()
        .env("AWS_ENDPOINT_URL_KINESIS", &proxy.endpoint)
        .args(["replay", "--lake", lake.to_str().unwrap(), "--input", "kinesis://bank?poll_ms=20"])
        .output()
        .unwrap();
    ok(out);
    let query = "SELECT id, bal FROM bank.a ORDER BY id";
    let rows =
        ok(aws.fovea().args(["sql", "--format", "csv", "--lake", lake.to_str().unwrap(), query]).output().unwrap());
    assert_eq!(rows.split_once('\n').map(|(_, rows)| rows), Some(expected.as_str()));
    let stats = proxy.stats();
    for kind in ["throttled", "dropped", "after", "burst"] {
        assert!(stats.get(kind).copied().unwrap_or(0) > 0, "no {kind} fault injected: {stats:?}");
    }
}

/// Enhanced fan-out (`consumer=NAME`) on kinesis-local, the stand-in that
/// serves SubscribeToShard: a generated stream over 3 shards with faults,
/// read by subscriptions renewed every 2 s; a shard split between two runs
/// (the second resumes at the checkpoint: the closed parent polled to its
/// end, its children subscribed); equal to the file replay. The same URL
/// on kinesalite, which has no stream consumers, falls back to polling with
/// a warning and ends equal too.
#[test]
fn enhanced_fan_out_equals_the_file_replay_and_falls_back_to_polling() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("stream.jsonl");
    common::hybench(&file, 300, 5);
    let records: Records = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .filter_map(|l| fovea_testkit::kinesis::debezium_server_record(l).unwrap())
        .collect();
    let lake = |name: &str| dir.path().join(name).display().to_string();
    let fovea = |env: Vec<(&'static str, String)>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fovea"));
        c.envs(env).env("FOVEA_LOG", "fovea_aws::kinesis=info");
        c
    };
    let run = |env: Vec<(&'static str, String)>, lake: &str, input: &str| -> String {
        let out = fovea(env).args(["replay", "--lake", lake, "--input", input]).output().unwrap();
        let logs = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{logs}");
        logs
    };
    ok(fovea(vec![]).args(["replay", "--lake", &lake("file"), "--input", file.to_str().unwrap()]).output().unwrap());
    let faulty = with_faults(&records, 9);
    let half = faulty.len() / 2;

    let fan_out = fovea_testkit::moto::KinesisLocal::start().unwrap();
    let producer = KinesisProducer::connect(Some(&fan_out.endpoint)).unwrap();
    producer.create_stream("gen", 3).unwrap();
    producer.put("gen", &faulty[..half]).unwrap();
    let input = "kinesis://gen?consumer=fovea-replay&renew_secs=2";
    let first = run(fan_out.env(), &lake("fan-out"), input);
    assert!(first.contains("reading the stream by enhanced fan-out"), "{first}");
    assert!(!first.contains("unavailable"), "{first}");
    let shards = producer.open_shards("gen").unwrap();
    producer.split("gen", &shards[0].0).unwrap();
    producer.put("gen", &faulty[half..]).unwrap();
    let second = run(fan_out.env(), &lake("fan-out"), input);
    assert!(second.contains("shard read to its end"), "the split parent is read to its end:\n{second}");

    let polling = Kinesalite::start().unwrap();
    let producer = KinesisProducer::connect(Some(&polling.endpoint)).unwrap();
    producer.create_stream("gen", 3).unwrap();
    producer.put("gen", &faulty).unwrap();
    let fallback = run(polling.env(), &lake("fallback"), input);
    assert!(fallback.contains("enhanced fan-out is unavailable"), "{fallback}");

    // `fovea status --input …?consumer=` describes the consumer (and
    // registers none): active where the replayer registered it, not
    // registered under another name, unavailable on kinesalite.
    let consumers = |env: Vec<(&'static str, String)>, lake: &str, input: &str| -> Vec<Json> {
        let out = fovea(env).args(["status", "--json", "--lake", lake, "--input", input]).output().unwrap();
        let status: Json = serde_json::from_slice(ok(out).as_bytes()).unwrap();
        status["input"]["consumers"].as_array().unwrap().clone()
    };
    let active = consumers(fan_out.env(), &lake("fan-out"), input);
    assert!(active.len() == 1 && active[0]["status"] == "ACTIVE" && active[0]["arn"].is_string(), "{active:?}");
    let absent = consumers(fan_out.env(), &lake("fan-out"), "kinesis://gen?consumer=nobody");
    assert!(absent.len() == 1 && absent[0]["status"] == "not registered", "{absent:?}");
    assert_eq!(consumers(fan_out.env(), &lake("fan-out"), "kinesis://gen?consumer=nobody"), absent, "still none");
    let none = consumers(polling.env(), &lake("fallback"), input);
    assert!(none[0]["status"].as_str().unwrap().starts_with("unavailable"), "{none:?}");
    assert!(consumers(polling.env(), &lake("fallback"), "kinesis://gen").is_empty());
    let text =
        ok(fovea(fan_out.env()).args(["status", "--lake", &lake("fan-out"), "--input", input]).output().unwrap());
    assert!(text.contains("consumer fovea-replay of stream gen: ACTIVE (read by enhanced fan-out)"), "{text}");

    for t in ["hybench.account", "hybench.transfer"] {
        let export = |lake: &str| ok(fovea(vec![]).args(["export", "--table", t, "--lake", lake]).output().unwrap());
        let expected = export(&lake("file"));
        assert!(expected.lines().count() > 100, "{expected}");
        assert_eq!(export(&lake("fan-out")), expected, "{t} by fan-out");
        assert_eq!(export(&lake("fallback")), expected, "{t} after falling back to polling");
    }
}
