//! `fovea serve` on a followed file: Flight SQL from Rust and Python
//! clients, a clean stop and resume, the visibility RPC and its
//! validation, bearer tokens, and a long-running query that keeps its
//! snapshot after LWM moved past it.

use crate::common;
use std::io::Write;
use std::time::Duration;

use crate::common::{Server, append, eventually, gunzip, pg_tiny as data, txn};
use arrow::array::{Array, Int64Array};
use arrow_flight::Action;
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::StreamExt;

fn sorted_rows(csv: &str) -> Vec<&str> {
    let mut v: Vec<&str> = csv.lines().collect();
    v.sort_unstable();
    v
}

async fn client(url: &str, token: Option<&str>) -> FlightSqlServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned()).unwrap().connect().await.unwrap();
    let mut c = FlightSqlServiceClient::new(channel);
    if let Some(t) = token {
        c.set_token(t.to_owned());
    }
    c
}

async fn fetch(
    c: &mut FlightSqlServiceClient<tonic::transport::Channel>,
    info: arrow_flight::FlightInfo,
) -> Vec<arrow::record_batch::RecordBatch> {
    let mut out = Vec::new();
    for e in info.endpoint {
        let mut s = c.do_get(e.ticket.unwrap()).await.unwrap();
        while let Some(b) = s.next().await {
            out.push(b.unwrap());
        }
    }
    out
}

async fn action(
    c: &mut FlightSqlServiceClient<tonic::transport::Channel>,
    kind: &str,
    body: Vec<u8>,
) -> Result<Vec<Vec<u8>>, String> {
    let req = Action { r#type: kind.into(), body: body.into() };
    let mut s = c.do_action(req).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    while let Some(r) = s.next().await {
        out.push(r.map_err(|e| e.to_string())?.body.to_vec());
    }
    Ok(out)
}

fn ints(batches: &[arrow::record_batch::RecordBatch]) -> Vec<Option<i64>> {
    let b = &batches[0];
    (0..b.num_columns())
        .map(|i| {
            let a = b.column(i).as_any().downcast_ref::<Int64Array>().unwrap();
            (!a.is_null(0)).then(|| a.value(0))
        })
        .collect()
}

#[test]
fn serve_follows_a_growing_file_for_rust_and_python_clients() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let input = dir.path().join("events.jsonl");
    let all: Vec<String> =
        gunzip(&data().join("debezium_events.precise_schemas.jsonl.gz")).lines().map(str::to_owned).collect();
    let half = all.len() / 2;
    append(&input, &all[..half]);
    let spec = format!("file:{}", input.display());
    let server = Server::start(&lake, &spec, &["--checkpoint-secs", "0.2"]);
    // A line written in two pieces is read once its newline arrives.
    let (last, rest) = all[half..].split_last().unwrap();
    append(&input, rest);
    {
        let mut f = std::fs::OpenOptions::new().append(true).open(&input).unwrap();
        let (a, b) = last.split_at(last.len() / 2);
        write!(f, "{a}").unwrap();
        f.flush().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        writeln!(f, "{b}").unwrap();
    }
    let tables = ["public.pgbench_accounts", "public.pgbench_history", "tpcc.orders", "tpcc.order_line", "tpcc.stock"];
    let expected = |t: &str| {
        let text = gunzip(&data().join(format!("final_tables/{t}.csv.gz")));
        text.split_once('\n').unwrap().1.to_owned()
    };
    eventually(Duration::from_secs(60), "the whole file to be replayed", || {
        tables
            .iter()
            .all(|t| {
                server
                    .sql(&format!("SELECT * FROM {t}"))
                    .is_ok_and(|got| sorted_rows(&got) == sorted_rows(&expected(t)))
            })
            .then_some(())
    });

    // A Python client (ADBC Flight SQL driver) reads the same.
    let python = fovea_testkit::moto::python();
    let script = format!(
        "import adbc_driver_flightsql.dbapi as f\n\
         c = f.connect('{}')\n\
         cur = c.cursor()\n\
         cur.execute('SELECT count(*) AS n, sum(abalance) AS s FROM public.pgbench_accounts')\n\
         print(cur.fetchall())\n\
         cur.execute('SELECT * FROM tpcc.warehouse')\n\
         print(cur.fetch_arrow_table().num_rows)\n\
         cur.execute('SELECT count(*) AS n FROM public.pgbench_accounts WHERE bid = ? AND aid > ?', parameters=(1, 5))\n\
         print(cur.fetchall()[0][0])\n\
         cur.execute('SELECT count(*) AS n FROM public.pgbench_accounts WHERE bid = ? AND aid > ?', parameters=(1, 50))\n\
         print(cur.fetchall()[0][0])\n\
         objs = c.adbc_get_objects(depth='all').read_all().to_pylist()\n\
         print(','.join(sorted(cat['catalog_name'] + '.' + s['db_schema_name'] + '.' + t['table_name'] for cat in objs for s in cat['catalog_db_schemas'] for t in (s['db_schema_tables'] or []))))\n\
         cols = [col['column_name'] for cat in objs for s in cat['catalog_db_schemas'] for t in (s['db_schema_tables'] or []) if t['table_name'] == 'pgbench_branches' for col in t['table_columns']]\n\
         print(','.join(cols))\n\
         print(','.join(c.adbc_get_table_schema('pgbench_accounts', db_schema_filter='public').names))\n\
         print(','.join(c.adbc_get_table_types()))\n",
        server.url
    );
    let out = std::process::Command::new(&python)
        .args(["-c", &script])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} (run scripts/test-deps.sh, or set FOVEA_PYTHON): {e}"));
    assert!(
        out.status.success(),
        "python client ({python}; scripts/test-deps.sh installs the modules): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let want = server.sql("SELECT count(*) AS n, sum(abalance) AS s FROM public.pgbench_accounts").unwrap();
    let (n, s) = want.trim().split_once(',').unwrap();
    assert_eq!(printed.lines().next().unwrap(), format!("[({n}, {s})]"), "{printed}");
    let warehouses = server.sql("SELECT count(*) FROM tpcc.warehouse").unwrap();
    assert_eq!(printed.lines().nth(1).unwrap(), warehouses.trim());
    // Prepared statements: parameters bound, the same statement again with others.
    for (line, aid) in [(2, 5), (3, 50)] {
        let want =
            server.sql(&format!("SELECT count(*) FROM public.pgbench_accounts WHERE bid = 1 AND aid > {aid}")).unwrap();
        assert_eq!(printed.lines().nth(line).unwrap(), want.trim(), "{printed}");
    }
    // Catalog metadata: every table, its columns, a table's schema, table types.
    let sql_tables = server
        .sql("SELECT table_schema || '.' || table_name AS t FROM information_schema.tables WHERE table_schema NOT IN ('information_schema') ORDER BY t")
        .unwrap();
    let listed = printed.lines().nth(4).unwrap();
    assert!(listed.contains("fovea.public.pgbench_accounts") && listed.contains("fovea.tpcc.warehouse"), "{listed}");
    let known: Vec<String> = sql_tables.lines().map(|t| format!("fovea.{t}")).collect();
    assert_eq!(listed, known.join(","), "{sql_tables}");
    assert_eq!(printed.lines().nth(5).unwrap(), "bid,bbalance,filler", "{printed}");
    assert_eq!(printed.lines().nth(6).unwrap(), "aid,bid,abalance,filler", "{printed}");
    assert_eq!(printed.lines().nth(7).unwrap(), "TABLE", "{printed}");

    // A clean stop checkpoints; a restart resumes at the end of the file
    // and applies what was appended meanwhile, nothing twice.
    let log = server.stop();
    assert!(log.contains("final checkpoint"), "{log}");
    append(&input, &txn(9_000_001, &[("c", 1, 10), ("c", 2, 20)]));
    let server = Server::start(&lake, &spec, &[]);
    eventually(Duration::from_secs(30), "the appended transaction", || {
        (server.sql("SELECT id, v FROM public.t ORDER BY id").ok()? == "1,10\n2,20\n").then_some(())
    });
    for t in tables {
        assert_eq!(sorted_rows(&server.sql(&format!("SELECT * FROM {t}")).unwrap()), sorted_rows(&expected(t)), "{t}");
    }
}

#[test]
fn a_long_running_query_keeps_its_snapshot_after_lwm_moves_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let input = dir.path().join("events.jsonl");
    let rows: Vec<(&str, i64, i64)> = (1..=200).map(|i| ("c", i, i)).collect();
    append(&input, &txn(1, &rows));
    let server =
        Server::start(&lake, &format!("file:{}", input.display()), &["--long-query-secs", "1", "--gc-secs", "0.3"]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let sql = "SELECT count(*) AS n, sum(v) AS s, sum(CASE WHEN id > 100 THEN v END) AS hi FROM public.t";
    rt.block_on(async {
        let mut c = client(&server.url, None).await;
        eventually(Duration::from_secs(30), "the first transaction", || {
            (server.sql("SELECT count(*) FROM public.t").ok()? == "200\n").then_some(())
        });
        // Planned now: the query's snapshot is taken here.
        let planned = c.execute(sql.to_owned(), None).await.unwrap();
        let hwm_at_plan = server.metric("fovea_hwm");
        // Then half the rows change and many are deleted, in many transactions.
        for x in 0..20u64 {
            let changes: Vec<(&str, i64, i64)> = (0..10)
                .map(|k| {
                    let id = (x * 10 + k + 1) as i64;
                    if id % 2 == 0 { ("d", id, 0) } else { ("u", id, id * 1000) }
                })
                .collect();
            append(&input, &txn(100 + x, &changes));
        }
        eventually(Duration::from_secs(30), "the changes", || {
            (server.sql("SELECT count(*) FROM public.t").ok()? == "100\n").then_some(())
        });
        // The query is checkpointed, LWM passes its snapshot, GC runs.
        eventually(Duration::from_secs(30), "a visibility checkpoint and LWM past the query", || {
            (server.metric("fovea_visibility_checkpoints_total") >= 1.0 && server.metric("fovea_lwm") >= hwm_at_plan)
                .then_some(())
        });
        let rounds = server.metric("fovea_gc_rounds_total");
        eventually(Duration::from_secs(30), "two more GC rounds", || {
            (server.metric("fovea_gc_rounds_total") >= rounds + 2.0).then_some(())
        });
        assert!(std::fs::read_dir(lake.join("visibility")).unwrap().count() >= 1, "no checkpoint file in the lake");
        // The old query still answers as of its snapshot…
        let old = fetch(&mut c, planned).await;
        assert_eq!(ints(&old), [Some(200), Some(20_100), Some(15_050)]);
        // …and a new one sees the changes.
        let new = c.execute(sql.to_owned(), None).await.unwrap();
        let new = fetch(&mut c, new).await;
        let odd_sum: i64 = (1..=200).filter(|i| i % 2 == 1).map(|i| i * 1000).sum();
        let odd_hi: i64 = (101..=200).filter(|i| i % 2 == 1).map(|i| i * 1000).sum();
        assert_eq!(ints(&new), [Some(100), Some(odd_sum), Some(odd_hi)]);
        // The ticket is spent, and its checkpoint file removed.
        assert_eq!(std::fs::read_dir(lake.join("visibility")).unwrap().count(), 0);
    });
}

#[test]
fn rpcs_need_the_token_and_reject_bad_requests_without_dying() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let input = dir.path().join("events.jsonl");
    append(&input, &txn(1, &(1..=50).map(|i| ("c", i, i)).collect::<Vec<_>>()));
    append(&input, &txn(2, &[("d", 3, 0), ("u", 4, 40)]));
    let spec = format!("file:{}", input.display());
    // Anything but loopback without a token is refused.
    let out = common::fovea()
        .args(["serve", "--lake"])
        .arg(&lake)
        .args(["--input", &spec, "--listen", &format!("0.0.0.0:{}", common::free_port())])
        .env_remove("FOVEA_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token"), "{}", String::from_utf8_lossy(&out.stderr));
    // A token without TLS off loopback too: it would travel in the clear.
    let out = common::fovea()
        .args(["serve", "--lake"])
        .arg(&lake)
        .args(["--input", &spec, "--listen", &format!("0.0.0.0:{}", common::free_port())])
        .env("FOVEA_TOKEN", "s3cret")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-cert"), "{}", String::from_utf8_lossy(&out.stderr));

    // TLS with a certificate of a test CA.
    let certs = common::TestCerts::new();
    let other = common::TestCerts::new();
    // A key that is not the certificate's stops start-up, naming it.
    let out = common::fovea()
        .args(["serve", "--lake"])
        .arg(&lake)
        .args(["--input", &spec, "--listen", &format!("0.0.0.0:{}", common::free_port())])
        .arg("--tls-cert")
        .arg(&certs.cert)
        .arg("--tls-key")
        .arg(&other.key)
        .env("FOVEA_TOKEN", "s3cret")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--tls-key") && err.contains("KeyMismatch"), "{err}");
    let mut port = 0;
    let mut server = Server::spawn_with(|[free, _]| {
        port = free;
        let mut cmd = common::fovea();
        let stderr = dir.path().join("serve.log");
        cmd.args(["serve", "--lake"])
            .arg(&lake)
            .args(["--input", &spec, "--listen", &format!("0.0.0.0:{port}")])
            .arg("--tls-cert")
            .arg(&certs.cert)
            .arg("--tls-key")
            .arg(&certs.key)
            .env("FOVEA_TOKEN", "s3cret")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap());
        (cmd, stderr, None)
    });
    assert_eq!(server.url, format!("grpc+tls://0.0.0.0:{port}"));
    server.url = format!("grpc+tls://127.0.0.1:{port}");
    server.tls_ca = Some(certs.ca.clone());
    eventually(Duration::from_secs(30), "the input", || {
        (server.sql_with_token("SELECT count(*) FROM public.t", Some("s3cret")).ok()? == "49\n").then_some(())
    });
    let denied = server.sql("SELECT 1").unwrap_err();
    assert!(denied.contains("bearer token"), "{denied}");
    let wrong = server.sql_with_token("SELECT 1", Some("s3cres")).unwrap_err();
    assert!(wrong.contains("bearer token"), "{wrong}");
    // Plaintext to the TLS server, and TLS trusting another CA, fail.
    let plain = common::fovea()
        .args(["sql", "--connect", &format!("grpc://127.0.0.1:{port}"), "--token", "s3cret", "SELECT 1"])
        .output()
        .unwrap();
    assert!(!plain.status.success());
    let untrusted = common::fovea()
        .args(["sql", "--connect", &server.url, "--token", "s3cret", "--tls-ca"])
        .arg(&other.ca)
        .arg("SELECT 1")
        .output()
        .unwrap();
    assert!(!untrusted.status.success());
    let err = String::from_utf8_lossy(&untrusted.stderr);
    assert!(err.contains("invalid peer certificate"), "{err}");

    // A Python ADBC client over TLS: trusting the test CA it reads the
    // table; trusting only the system's roots it is refused.
    let adbc = |trust_test_ca: bool| {
        let roots = if trust_test_ca {
            format!("D.TLS_ROOT_CERTS.value: open({:?}).read(), ", certs.ca.display().to_string())
        } else {
            String::new()
        };
        let script = format!(
            "import adbc_driver_flightsql.dbapi as f\n\
             from adbc_driver_flightsql import DatabaseOptions as D\n\
             c = f.connect('grpc+tls://127.0.0.1:{port}', db_kwargs={{{roots}D.TLS_OVERRIDE_HOSTNAME.value: 'localhost', D.AUTHORIZATION_HEADER.value: 'Bearer s3cret'}})\n\
             cur = c.cursor()\n\
             cur.execute('SELECT count(*) AS n FROM public.t')\n\
             print(cur.fetchall()[0][0])\n"
        );
        let python = fovea_testkit::moto::python();
        std::process::Command::new(&python).args(["-c", &script]).output().unwrap()
    };
    let trusted = adbc(true);
    assert!(trusted.status.success(), "ADBC over TLS: {}", String::from_utf8_lossy(&trusted.stderr));
    assert_eq!(String::from_utf8_lossy(&trusted.stdout).trim(), "49");
    let refused = adbc(false);
    assert!(!refused.status.success(), "ADBC trusted a certificate of an unknown CA");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("certificate") || err.contains("x509") || err.contains("authority"), "{err}");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let ca = std::fs::read(&certs.ca).unwrap();
        let tls = tonic::transport::ClientTlsConfig::new()
            .domain_name("localhost")
            .ca_certificate(tonic::transport::Certificate::from_pem(ca));
        let channel = tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut c = FlightSqlServiceClient::new(channel);
        c.set_token("s3cret".into());
        // The split of table t: the in-memory rows, visibility applied.
        let hwm = 2u64;
        let split = action(
            &mut c,
            "fovea.split",
            serde_json::to_vec(&serde_json::json!({"table": "public.t", "qts": hwm})).unwrap(),
        )
        .await
        .unwrap();
        let head: serde_json::Value = serde_json::from_slice(&split[0]).unwrap();
        let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(split[1].clone()), None).unwrap();
        let rows: usize = reader.map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(head["memory_rows"], 49, "{head}");
        assert_eq!(rows, 49);
        // At qts 1 (before the delete) the same split has all 50 rows.
        let split = action(&mut c, "fovea.split", br#"{"table":"public.t","qts":1}"#.to_vec()).await.unwrap();
        let head: serde_json::Value = serde_json::from_slice(&split[0]).unwrap();
        assert_eq!(head["memory_rows"], 50, "{head}");

        for (kind, body, needle) in [
            ("fovea.nope", b"{}".to_vec(), "unknown action"),
            ("fovea.split", b"{not json".to_vec(), "malformed request body"),
            ("fovea.split", br#"{"table":"public.nope","qts":1}"#.to_vec(), "nope"),
            ("fovea.split", br#"{"table":"public.t","qts":999999}"#.to_vec(), "999999"),
            (
                "fovea.bitmaps",
                br#"{"table":"public.t","file":424242,"row_groups":[0],"qts":1}"#.to_vec(),
                "no file 424242",
            ),
            (
                "fovea.bitmaps",
                serde_json::to_vec(
                    &serde_json::json!({"table":"public.t","file":0,"row_groups":vec![0; 5000],"qts":1}),
                )
                .unwrap(),
                "at most",
            ),
            ("fovea.split", vec![b' '; 3 << 19], "over the limit"),
        ] {
            let err = action(&mut c, kind, body).await.unwrap_err();
            assert!(err.contains(needle), "{kind}: {err}");
        }
        // Still alive.
        let info = c.execute("SELECT count(*) FROM public.t".into(), None).await.unwrap();
        assert_eq!(ints(&fetch(&mut c, info).await), [Some(49)]);
    });
    let log = server.stop();
    assert!(!log.contains("panicked"), "{log}");
}
