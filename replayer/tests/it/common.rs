//! Helpers of the `fovea serve` tests: a running server process, Flight SQL
//! queries through `fovea sql --connect`, and a throwaway PostgreSQL cluster.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn fovea() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fovea"))
}

/// The stdout of a command that must have succeeded (else both streams in
/// the panic).
pub fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The text of a gzip file.
/// Writes a generated HyBench stream (`fovea-bench gen hybench`) of `txns`
/// transactions to `path`.
pub fn hybench(path: &Path, txns: u64, seed: u64) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    fovea_testkit::workload::generate(fovea_testkit::workload::Workload::Hybench, txns, seed, &mut out).unwrap();
    std::io::Write::flush(&mut out).unwrap();
}

pub fn gunzip(p: &Path) -> String {
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(p).unwrap()).read_to_string(&mut s).unwrap();
    s
}

/// The pg-tiny data set: a change stream captured from PostgreSQL 15 and
/// the tables PostgreSQL reported at the end.
pub fn pg_tiny() -> PathBuf {
    fovea_testkit::workspace_dir().join("tests/data/pg-tiny")
}

/// pg-tiny's tables, `schema.table`.
pub fn pg_tiny_tables() -> Vec<String> {
    std::fs::read_to_string(pg_tiny().join("final_tables/row_counts.txt"))
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect()
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The lines of `text` in CloudWatch's embedded metric format, each
/// checked against the specification: a millisecond timestamp of today,
/// directives with a namespace, dimension sets whose names are string
/// members, and metrics in CloudWatch units that are numbers.
pub fn emf_records(text: &str) -> Vec<serde_json::Value> {
    const UNITS: [&str; 6] = ["Seconds", "Milliseconds", "Bytes", "Count", "Count/Second", "None"];
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let mut records = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("{\"_aws\"")) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let aws = &v["_aws"];
        let ts = aws["Timestamp"].as_u64().unwrap_or_else(|| panic!("no Timestamp: {line}"));
        assert!(ts <= now_ms && now_ms - ts < 86_400_000, "Timestamp {ts} is not a time of today in ms: {line}");
        let directives = aws["CloudWatchMetrics"].as_array().unwrap_or_else(|| panic!("no directives: {line}"));
        assert!(!directives.is_empty(), "{line}");
        for d in directives {
            assert!(d["Namespace"].as_str().is_some_and(|n| !n.is_empty() && n.len() <= 255), "namespace: {line}");
            for set in d["Dimensions"].as_array().unwrap_or_else(|| panic!("no Dimensions: {line}")) {
                let set = set.as_array().unwrap();
                assert!(set.len() <= 30, "{line}");
                for name in set {
                    let name = name.as_str().unwrap();
                    assert!(v[name].is_string(), "dimension {name} is no string member: {line}");
                }
            }
            let metrics = d["Metrics"].as_array().unwrap_or_else(|| panic!("no Metrics: {line}"));
            assert!(!metrics.is_empty() && metrics.len() <= 100, "{line}");
            for m in metrics {
                let name = m["Name"].as_str().unwrap_or_else(|| panic!("a metric without Name: {line}"));
                let unit = m["Unit"].as_str().unwrap_or_else(|| panic!("{name} has no Unit: {line}"));
                assert!(UNITS.contains(&unit), "{name}: unit {unit}: {line}");
                assert!(v[name].as_f64().is_some_and(f64::is_finite), "{name} is no number: {line}");
            }
        }
        records.push(v);
    }
    records
}

/// `N` distinct free ports: each is held until all are chosen (ports
/// chosen one after another may repeat, as a just-freed port is free).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<TcpListener> = (0..N).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

/// A `fovea serve` process.
pub struct Server {
    pub child: Child,
    pub url: String,
    /// Root certificate `fovea sql --connect` trusts (grpc+tls://).
    pub tls_ca: Option<PathBuf>,
    pub metrics: Option<String>,
    pub stderr: PathBuf,
    /// Every line the server wrote to stdout so far.
    pub stdout: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `fovea serve` with `args` and waits for it to listen.
    pub fn start(lake: &Path, input: &str, extra: &[&str]) -> Server {
        Self::spawn_with(|[port, mport]| {
            let stderr = lake.with_extension(format!("serve-{port}.log"));
            let mut cmd = fovea();
            cmd.args(["serve", "--lake"])
                .arg(lake)
                .args(["--input", input, "--listen", &format!("127.0.0.1:{port}")])
                .args(["--metrics", &format!("127.0.0.1:{mport}")])
                .args(extra)
                .env("FOVEA_LOG", std::env::var("FOVEA_TEST_LOG").unwrap_or_else(|_| "info".into()))
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&stderr).unwrap());
            (cmd, stderr, Some(format!("127.0.0.1:{mport}")))
        })
    }

    /// Spawns the `fovea serve` command `make` prepares for two free ports
    /// (its stdout piped, its stderr to the file it returns, its metrics
    /// address) and waits for its ready line; again with two other ports
    /// when another process took one of them first (they are free when
    /// chosen, not held until fovea binds them), up to three times.
    pub fn spawn_with(mut make: impl FnMut([u16; 2]) -> (Command, PathBuf, Option<String>)) -> Server {
        for attempt in 1.. {
            let (cmd, stderr, metrics) = make(free_ports());
            match Self::try_spawn(cmd, &stderr, metrics) {
                Ok(server) => return server,
                Err(log) if attempt < 3 && log.contains("Address already in use") => continue,
                Err(log) => panic!("fovea serve did not start:\n{log}"),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// Spawns `cmd` and waits for its ready line; its stderr if it stops
    /// before (or says nothing for two minutes).
    fn try_spawn(mut cmd: Command, stderr: &Path, metrics: Option<String>) -> Result<Server, String> {
        let stderr = stderr.to_path_buf();
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&lines);
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 {
                if let Some(url) = line.trim().strip_prefix("fovea serve: Flight SQL on ") {
                    let _ = tx.send(url.to_owned());
                }
                kept.lock().unwrap().push(line.trim_end().to_owned());
                line.clear();
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(u) => u,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::fs::read_to_string(&stderr).unwrap_or_default());
            }
        };
        Ok(Server { child, url, tls_ca: None, metrics, stderr, stdout: lines })
    }

    /// The CloudWatch EMF records the server wrote to stdout so far
    /// (checked by [`emf_records`]).
    pub fn emf(&self) -> Vec<serde_json::Value> {
        emf_records(&self.stdout.lock().unwrap().join("\n"))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGKILL: no final checkpoint.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM and wait: a clean stop with a final checkpoint.
    pub fn stop(mut self) -> String {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = wait_timeout(&mut self.child, Duration::from_secs(60));
        let log = self.log();
        assert!(status.is_some_and(|s| s.success()), "fovea serve did not stop cleanly: {status:?}\n{log}");
        log
    }

    /// Runs SQL through `fovea sql --connect`; CSV rows without the header.
    pub fn sql(&self, sql: &str) -> Result<String, String> {
        self.sql_with_token(sql, None)
    }

    pub fn sql_with_token(&self, sql: &str, token: Option<&str>) -> Result<String, String> {
        let mut cmd = fovea();
        cmd.args(["sql", "--format", "csv", "--connect", &self.url, sql]).env_remove("FOVEA_TOKEN");
        if let Some(t) = token {
            cmd.args(["--token", t]);
        }
        if let Some(ca) = &self.tls_ca {
            cmd.arg("--tls-ca").arg(ca);
        }
        let out = cmd.output().unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let text = String::from_utf8(out.stdout).unwrap();
        Ok(text.split_once('\n').map_or(String::new(), |(_, rest)| rest.to_owned()))
    }

    /// The Prometheus text of `/metrics`.
    pub fn metrics(&self) -> String {
        let addr = self.metrics.as_ref().expect("started with --metrics");
        let mut s = std::net::TcpStream::connect(addr)
            .unwrap_or_else(|e| panic!("metrics at {addr}: {e}; the server's log:\n{}", self.log()));
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body
    }

    /// One metric's value.
    pub fn metric(&self, name: &str) -> f64 {
        metric_value(&self.metrics(), name)
    }
}

/// The value of sample `name` (with its labels, if any) in the Prometheus
/// text `text`.
pub fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let began = Instant::now();
    while began.elapsed() < limit {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Retries `check` every `every` while the server (with `--metrics`)
/// makes progress: done when it passes; its last error once no transaction
/// was applied for 60 s, or after 15 min. For waits on a replayer that may
/// be far behind (debug build, restores under load, two cores): what a test
/// asserts is that nothing is lost, not how fast it catches up.
pub fn while_progressing(
    server: &Server,
    every: Duration,
    mut check: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let waited = Instant::now();
    let mut progress = (server.metric("fovea_transactions_total"), Instant::now());
    loop {
        let error = match check() {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let applied = server.metric("fovea_transactions_total");
        if applied != progress.0 {
            progress = (applied, Instant::now());
        }
        if progress.1.elapsed() >= Duration::from_secs(60) || waited.elapsed() >= Duration::from_secs(900) {
            return Err(format!(
                "no transaction applied for {:.0} s ({:.0} s waited): {error}",
                progress.1.elapsed().as_secs_f64(),
                waited.elapsed().as_secs_f64()
            ));
        }
        std::thread::sleep(every);
    }
}

/// Retries `f` until it returns `Some`, or panics with `what` after `limit`.
pub fn eventually<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let began = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(began.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A throwaway PostgreSQL 15 cluster on 127.0.0.1 with `wal_level = logical`.
pub struct PgCluster {
    pub bin: PathBuf,
    pub dir: tempfile::TempDir,
    pub port: u16,
}

fn as_postgres(program: &Path) -> Command {
    // PostgreSQL refuses to run as root: drop to the postgres user then.
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

pub fn pg_bin() -> PathBuf {
    if let Ok(b) = std::env::var("FOVEA_PG_BIN") {
        return PathBuf::from(b);
    }
    let debian = PathBuf::from("/usr/lib/postgresql/15/bin");
    if debian.join("initdb").is_file() {
        return debian;
    }
    panic!(
        "PostgreSQL 15 server binaries not found (looked in /usr/lib/postgresql/15/bin and $FOVEA_PG_BIN): \
         run scripts/test-deps.sh (it installs Debian's postgresql-15)"
    );
}

/// A test certificate authority and a server certificate it signed for
/// `localhost` and 127.0.0.1 (openssl, P-256 keys), as PEM files.
pub struct TestCerts {
    /// Holds the files: removed when the certificates are dropped.
    _dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCerts {
    pub fn new() -> TestCerts {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl").args(args).current_dir(dir.path()).output().unwrap();
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        let ca = ["-subj", "/CN=fovea test CA", "-addext", "basicConstraints=critical,CA:TRUE"];
        let usage = ["-addext", "keyUsage=critical,keyCertSign,cRLSign"];
        let out = ["-keyout", "ca.key", "-out", "ca.pem", "-days", "2"];
        openssl(&[&["req", "-x509"][..], &ec, &ca, &usage, &out].concat());
        std::fs::write(p("server.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
        openssl(
            &[&["req"][..], &ec, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]].concat(),
        );
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ]);
        TestCerts { ca: p("ca.pem"), cert: p("server.pem"), key: p("server.key"), _dir: dir }
    }
}

impl PgCluster {
    pub fn start() -> PgCluster {
        Self::start_with("", None)
    }

    /// A cluster that takes TLS connections only (`hostssl` lines, no
    /// `host`), with `certs`' server certificate.
    pub fn start_tls_only(certs: &TestCerts) -> PgCluster {
        Self::start_with(
            "ssl = on\nssl_cert_file = 'server.pem'\nssl_key_file = 'server.key'\n",
            Some((
                certs,
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl replication all 127.0.0.1/32 trust\n",
            )),
        )
    }

    fn start_with(extra_conf: &str, tls: Option<(&TestCerts, &str)>) -> PgCluster {
        let bin = pg_bin();
        let dir = tempfile::Builder::new().prefix("fovea-pg").tempdir_in("/tmp").unwrap();
        let data = dir.path().join("data");
        if is_root() {
            assert!(Command::new("chown").args(["postgres:postgres"]).arg(dir.path()).status().unwrap().success());
        }
        let out = as_postgres(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"])
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nwal_level = logical\n\
             max_replication_slots = 8\nmax_wal_senders = 8\nfsync = off\nsynchronous_commit = off\ntimezone = 'UTC'\n",
            dir.path().display()
        );
        let conf_path = data.join("postgresql.conf");
        let mut f = std::fs::OpenOptions::new().append(true).open(&conf_path).unwrap();
        f.write_all(conf.as_bytes()).unwrap();
        f.write_all(extra_conf.as_bytes()).unwrap();
        if let Some((certs, hba)) = tls {
            std::fs::copy(&certs.cert, data.join("server.pem")).unwrap();
            std::fs::copy(&certs.key, data.join("server.key")).unwrap();
            std::fs::write(data.join("pg_hba.conf"), hba).unwrap();
            // The key readable by its owner only, and that owner the server.
            assert!(Command::new("chmod").arg("600").arg(data.join("server.key")).status().unwrap().success());
            if is_root() {
                for f in ["server.pem", "server.key", "pg_hba.conf"] {
                    assert!(
                        Command::new("chown").arg("postgres:postgres").arg(data.join(f)).status().unwrap().success()
                    );
                }
            }
        }
        // A free port can be taken by another test between `free_port`
        // and the server's bind (tests run side by side): a start that
        // fails is tried again on another port (the last `port` line of
        // the file counts), and the server's log is in the last failure.
        let log = dir.path().join("pg.log");
        let mut attempt = 0;
        let port = loop {
            attempt += 1;
            let port = free_port();
            let mut f = std::fs::OpenOptions::new().append(true).open(&conf_path).unwrap();
            writeln!(f, "port = {port}").unwrap();
            drop(f);
            let out = as_postgres(&bin.join("pg_ctl"))
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(&log)
                .args(["-w", "start"])
                .output()
                .unwrap();
            if out.status.success() {
                break port;
            }
            let server_log = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                attempt < 5,
                "pg_ctl start, {attempt} attempts: {}\nits log:\n{server_log}",
                String::from_utf8_lossy(&out.stderr)
            );
            eprintln!("PostgreSQL did not start on port {port} (attempt {attempt}), trying another:\n{server_log}");
        };
        let pg = PgCluster { bin, dir, port };
        pg.psql("postgres", "CREATE DATABASE bench");
        pg
    }

    /// Restarts the server (fast shutdown: every connection is cut).
    pub fn restart(&self) {
        let out = as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-l")
            .arg(self.dir.path().join("pg.log"))
            .args(["-m", "fast", "-w", "restart"])
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_ctl restart: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Runs SQL with psql; returns its unaligned output.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", "postgres"])
            .args(["-p", &self.port.to_string(), "-d", db, "-c", sql])
            .output()
            .unwrap();
        assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// `pg_dump --schema-only` of `db`.
    pub fn dump_schema(&self, db: &str) -> String {
        let out = Command::new(self.bin.join("pg_dump"))
            .args(["--schema-only", "-h", "127.0.0.1", "-U", "postgres", "-p", &self.port.to_string(), db])
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_dump: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// `pgbench` with `args` against `db`.
    pub fn pgbench(&self, db: &str, args: &[&str]) -> Command {
        let mut c = Command::new(self.bin.join("pgbench"));
        c.args(["-h", "127.0.0.1", "-U", "postgres", "-p", &self.port.to_string()]).args(args).arg(db);
        c
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

/// Appends `lines` to the file at `path` (a growing input).
pub fn append(path: &Path, lines: &[String]) {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    f.flush().unwrap();
}

/// A Debezium transaction (BEGIN, rows, END) on table `public.t (id, v)`;
/// rows are (op, id, v).
pub fn txn(xid: u64, rows: &[(&str, i64, i64)]) -> Vec<String> {
    let ts = 1_800_000_000_000u64 + xid;
    let mut out = vec![format!(
        r#"{{"topic":"s.transaction","key":{{"id":"{xid}"}},"value":{{"status":"BEGIN","id":"{xid}","event_count":null,"data_collections":null,"ts_ms":{ts}}}}}"#
    )];
    for (op, id, v) in rows {
        let (before, after) = match *op {
            "d" => (format!(r#"{{"id":{id}}}"#), "null".to_owned()),
            _ => ("null".to_owned(), format!(r#"{{"id":{id},"v":{v}}}"#)),
        };
        out.push(format!(
            r#"{{"topic":"s.public.t","key":{{"id":{id}}},"value":{{"before":{before},"after":{after},"source":{{"ts_ms":{ts},"schema":"public","table":"t","txId":{xid}}},"transaction":{{"id":"{xid}"}},"op":"{op}"}}}}"#
        ));
    }
    out.push(format!(
        r#"{{"topic":"s.transaction","key":{{"id":"{xid}"}},"value":{{"status":"END","id":"{xid}","event_count":{},"data_collections":[{{"data_collection":"public.t","event_count":{}}}],"ts_ms":{ts}}}}}"#,
        rows.len(),
        rows.len()
    ));
    out
}

/// Appends transactions `xids`, ten rows each (ids `10 * xid ..`).
pub fn append_txns(path: &Path, xids: std::ops::Range<u64>) {
    for xid in xids {
        let first = 10 * xid as i64;
        let rows: Vec<(&str, i64, i64)> = (first..first + 10).map(|id| ("c", id, xid as i64)).collect();
        append(path, &txn(xid, &rows));
    }
}

pub fn count_and_sum(server: &Server) -> Option<String> {
    server.sql("SELECT count(*), coalesce(sum(id), 0) FROM public.t").ok()
}

/// `count(*)` and `sum(id)` once transactions `1..n` are applied.
pub fn expected(n: u64) -> String {
    let ids: Vec<i64> = (1..n as i64).flat_map(|x| 10 * x..10 * x + 10).collect();
    format!("{},{}\n", ids.len(), ids.iter().sum::<i64>())
}

/// Starts `fovea serve` on the lake of `lake_args` (with `env`), logging
/// to a file in `dir`.
pub fn serve(dir: &Path, lake_args: &[String], env: &[(&'static str, String)], input: &str, extra: &[&str]) -> Server {
    Server::spawn_with(|[port, _]| {
        let stderr = dir.join(format!("serve-{port}.log"));
        let mut cmd = fovea();
        cmd.arg("serve")
            .args(lake_args)
            .args(["--input", input, "--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .envs(env.iter().cloned())
            .env("FOVEA_LOG", "info")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap());
        (cmd, stderr, None)
    })
}

/// Sends signal `sig` (`-STOP`, `-CONT`, …) to the server's process.
pub fn signal(server: &Server, sig: &str) {
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
}
