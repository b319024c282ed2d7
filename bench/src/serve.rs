//! `fovea-bench serve`: pgbench against a throwaway local PostgreSQL while
//! `fovea serve` follows its slot; rows/s replayed, freshness P50/P99 from
//! the `fovea_freshness_seconds` metric, and RSS.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fovea_replayer::latency::Latencies;
use fovea_replayer::replay::CliResult;

/// Options of `fovea-bench serve`.
#[derive(Clone, Debug)]
pub struct ServeBenchArgs {
    /// PostgreSQL 15 server binaries.
    pub pg_bin: PathBuf,
    /// pgbench scale (100,000 accounts each).
    pub scale: u32,
    /// pgbench clients.
    pub clients: u32,
    /// Seconds of load.
    pub seconds: u64,
    /// pgbench transactions per second (`-R`; 0: as fast as it goes).
    pub rate: u32,
    /// Print one JSON object.
    pub json: bool,
}

/// A throwaway cluster (PostgreSQL refuses to run as root: as `postgres` then).
struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

fn as_postgres(program: &Path) -> Command {
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(cmd: &mut Command, what: &str) -> CliResult<String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn free_port() -> CliResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Cluster {
    fn start(bin: &Path) -> CliResult<Cluster> {
        if !bin.join("initdb").is_file() {
            return Err(format!("no PostgreSQL server binaries in {} (--pg-bin)", bin.display()).into());
        }
        let dir = std::env::temp_dir().join(format!("fovea-bench-pg-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let _ = Command::new("chown").arg("postgres:postgres").arg(&dir).output();
        let data = dir.join("data");
        run(
            as_postgres(&bin.join("initdb")).arg("-D").arg(&data).args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ]),
            "initdb",
        )?;
        let port = free_port()?;
        let mut conf = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf"))?;
        writeln!(
            conf,
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\nwal_level = logical\n\
             max_replication_slots = 4\nshared_buffers = 256MB\ntimezone = 'UTC'",
            dir.display()
        )?;
        run(
            as_postgres(&bin.join("pg_ctl"))
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(dir.join("pg.log"))
                .args(["-w", "start"]),
            "pg_ctl start",
        )?;
        Ok(Cluster { bin: bin.to_owned(), dir, port })
    }

    fn psql(&self, sql: &str) -> CliResult<String> {
        run(
            Command::new(self.bin.join("psql"))
                .args([
                    "-X",
                    "-q",
                    "-At",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                ])
                .args(["-p", &self.port.to_string(), "-c", sql]),
            "psql",
        )
    }

    fn pgbench(&self) -> Command {
        let mut c = Command::new(self.bin.join("pgbench"));
        c.args(["-h", "127.0.0.1", "-U", "postgres", "-p", &self.port.to_string(), "-d", "postgres"]);
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "fast", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reads the metrics page.
pub(crate) fn scrape(addr: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: fovea\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The components of `fovea_memory_bytes`, in the order the report keeps.
const MEMORY_COMPONENTS: [&str; 3] = ["index", "visibility", "buffer"];

/// One unlabelled metric of a metrics page.
pub(crate) fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Runs the benchmark.
pub fn serve_bench(args: &ServeBenchArgs) -> CliResult<()> {
    let pg = Cluster::start(&args.pg_bin)?;
    run(pg.pgbench().args(["-i", "-q", "-s", &args.scale.to_string()]), "pgbench -i")?;
    pg.psql("CREATE PUBLICATION fovea_bench FOR ALL TABLES")?;
    let lake = pg.dir.join("lake");
    let metrics_addr = format!("127.0.0.1:{}", free_port()?);
    let serve_args = fovea_replayer::serve::ServeArgs {
        lake: fovea_replayer::lakes::LakeArgs::local(&lake),
        functions: Default::default(),
        iceberg: Default::default(),
        iceberg_rest: None,
        schema_file: None,
        block_rows: fovea_core::buffer::DEFAULT_BLOCK_ROWS,
        blocks_per_file: fovea_core::buffer::DEFAULT_BLOCKS_PER_FILE,
        input: format!(
            "postgres://postgres@127.0.0.1:{}/postgres?slot=fovea_bench&publication=fovea_bench&create_slot=true",
            pg.port
        ),
        listen: format!("127.0.0.1:{}", free_port()?).parse()?,
        metrics: Some(metrics_addr.parse()?),
        emf_secs: None,
        token: None,
        tls_cert: None,
        tls_key: None,
        checkpoint_secs: 10.0,
        stall_secs: None,
        gc_secs: 10.0,
        long_query_secs: 30.0,
        storage_gc_threshold: 0.3,
        poll_ms: 5,
        shards: None,
        lease_secs: 15.0,
        history_days: Default::default(),
        dedup_window: fovea_core::sink::SinkConfig::default().dedup_window,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || fovea_replayer::serve::serve(serve_args, stop).map_err(|e| e.to_string()))
    };
    // The initial copy is done when the accounts are all there.
    let accounts = 100_000.0 * f64::from(args.scale);
    let began = Instant::now();
    loop {
        if server.is_finished() {
            return Err(server.join().map_err(|_| "fovea serve panicked")?.err().unwrap_or_default().into());
        }
        if scrape(&metrics_addr).and_then(|t| metric(&t, "fovea_rows_total")).is_some_and(|r| r >= accounts) {
            break;
        }
        if began.elapsed() > Duration::from_secs(600) {
            return Err("the initial copy did not finish in 10 minutes".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let copy_secs = began.elapsed().as_secs_f64();
    let rows_before = scrape(&metrics_addr).and_then(|t| metric(&t, "fovea_rows_total")).unwrap_or(0.0);
    let mut load = pg.pgbench();
    load.args(["-n", "-c", &args.clients.to_string(), "-j", "1", "-T", &args.seconds.to_string()]);
    if args.rate > 0 {
        load.args(["-R", &args.rate.to_string()]);
    }
    let mut load = load.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null()).spawn()?;
    let load_began = Instant::now();
    let mut freshness = Vec::new();
    // The stalest sample and when (s into the load) it was taken.
    let mut worst = (0.0f64, 0.0f64);
    // The peak RSS and what the engine's components held at that sample.
    let mut rss_peak: f64 = 0.0;
    let mut at_peak = [0.0f64; 3];
    let mut sample_memory = |t: &str| {
        let rss = metric(t, "fovea_rss_bytes").unwrap_or(0.0);
        if rss > rss_peak {
            rss_peak = rss;
            for (slot, c) in at_peak.iter_mut().zip(MEMORY_COMPONENTS) {
                *slot = metric(t, &format!("fovea_memory_bytes{{component=\"{c}\"}}")).unwrap_or(0.0);
            }
        }
    };
    // Freshness (now − newest visible commit) means staleness only while
    // the source commits: sampled from 0.5 s into the load to 0.5 s before
    // its end (before, it is the age of the initial copy; after, idle
    // time), and from the first sample under a second: until then fovea is
    // still applying the initial copy, which `caught_up_after_copy_s`
    // reports instead.
    let window =
        Duration::from_millis(500)..Duration::from_secs(args.seconds).saturating_sub(Duration::from_millis(500));
    let mut caught_up_at: Option<f64> = None;
    while load.try_wait()?.is_none() {
        if let Some(t) = scrape(&metrics_addr) {
            let at = load_began.elapsed();
            let f = metric(&t, "fovea_freshness_seconds").filter(|f| f.is_finite());
            if caught_up_at.is_none() && f.is_some_and(|f| f < 1.0) {
                caught_up_at = Some(at.as_secs_f64());
            }
            if let Some(f) = f
                && caught_up_at.is_some()
                && window.contains(&at)
            {
                freshness.push(f * 1e3);
                if f * 1e3 > worst.0 {
                    worst = (f * 1e3, load_began.elapsed().as_secs_f64());
                }
            }
            sample_memory(&t);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let load_secs = load_began.elapsed().as_secs_f64();
    let mut pgbench_out = String::new();
    if let Some(mut o) = load.stdout.take() {
        o.read_to_string(&mut pgbench_out)?;
    }
    let tps = pgbench_out
        .lines()
        .find_map(|l| l.strip_prefix("tps = ")?.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    // Catch up: every pgbench transaction (one history row each) applied,
    // besides the initial copy (one transaction).
    let target = pg.psql("SELECT count(*) FROM pgbench_history")?.trim().parse::<f64>()? + 1.0;
    let caught = Instant::now();
    let url_rows = |t: &str| metric(t, "fovea_transactions_total");
    loop {
        let t = scrape(&metrics_addr).unwrap_or_default();
        if url_rows(&t).is_some_and(|n| n >= target) {
            break;
        }
        if caught.elapsed() > Duration::from_secs(300) {
            return Err("fovea did not catch up with pgbench within 5 minutes".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let catch_up_ms = caught.elapsed().as_secs_f64() * 1e3;
    let text = scrape(&metrics_addr).unwrap_or_default();
    let rows = metric(&text, "fovea_rows_total").unwrap_or(0.0) - rows_before;
    sample_memory(&text);
    let mb = |b: f64| (b / 104_857.6).round() / 10.0;
    let mut memory_mb = serde_json::Map::new();
    for (c, bytes) in MEMORY_COMPONENTS.iter().zip(at_peak) {
        memory_mb.insert((*c).to_owned(), mb(bytes).into());
    }
    // Allocator slack, decoded input, SQL, Flight, the runtime's threads…
    memory_mb.insert("other".into(), mb(rss_peak - at_peak.iter().sum::<f64>()).into());
    let live_rows = pg.psql(
        "SELECT (SELECT count(*) FROM pgbench_accounts) + (SELECT count(*) FROM pgbench_tellers) \
         + (SELECT count(*) FROM pgbench_branches) + (SELECT count(*) FROM pgbench_history)",
    )?;
    let live_rows: f64 = live_rows.trim().parse()?;
    // Release: the input loop's Acquire load sees it and stops.
    stop.store(true, Ordering::Release);
    server.join().map_err(|_| "fovea serve panicked")??;
    let latencies: Latencies = freshness.iter().copied().collect();
    let report = serde_json::json!({
        "pgbench_scale": args.scale,
        "pgbench_clients": args.clients,
        "pgbench_rate_limit": args.rate,
        "pgbench_tps": tps,
        "initial_copy_s": copy_secs,
        "rows_replayed": rows,
        "rows_per_s": rows / (load_secs + catch_up_ms / 1e3),
        "freshness_p50_ms": latencies.quantile_ms(0.5),
        "freshness_p99_ms": latencies.quantile_ms(0.99),
        "freshness_samples": freshness.len(),
        "caught_up_after_copy_s": caught_up_at,
        "freshness_worst_ms": worst.0,
        "freshness_worst_at_s": worst.1,
        "catch_up_after_load_ms": catch_up_ms,
        "rss_peak_mb": rss_peak / 1048576.0,
        "memory_at_rss_peak_mb": memory_mb,
        "live_rows": live_rows,
        "rss_bytes_per_live_row": (rss_peak / live_rows).round(),
        "index_bytes_per_live_row": (at_peak[0] / live_rows).round(),
        "checkpoints": metric(&text, "fovea_checkpoints_total").unwrap_or(0.0),
        "checkpoint_mean_s": metric(&text, "fovea_checkpoint_seconds_total").unwrap_or(0.0)
            / metric(&text, "fovea_checkpoints_total").unwrap_or(0.0).max(1.0),
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "fovea bench serve (pgbench -s {} -c {} for {} s, fovea following the slot)",
            args.scale, args.clients, args.seconds
        );
        for (k, v) in report.as_object().into_iter().flatten() {
            println!("  {k:<24} {v}");
        }
    }
    Ok(())
}
