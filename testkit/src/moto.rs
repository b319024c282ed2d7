//! Local AWS stand-ins for tests and benchmarks: moto (S3, DynamoDB),
//! started on a free loopback port with `scripts/moto_serial.py`, which
//! serves one request at a time so that DynamoDB's conditional writes are
//! atomic; and kinesalite (Kinesis: moto's Kinesis moves a parent shard's
//! records into its children on a split and slows down badly with volume;
//! kinesalite keeps closed parents readable to their end, as Kinesis does);
//! [`KinesisLocal`] (kinesis-mock built for node: the one stand-in that
//! serves enhanced fan-out's SubscribeToShard); and [`FaultProxy`], cloud
//! faults in front of any of them.
//! `scripts/test-deps.sh` installs moto in `/var/tmp/fovea-py`, kinesalite
//! and kinesis-local in `/var/tmp/fovea-npm`; `FOVEA_PYTHON` and
//! `FOVEA_NODE_MODULES` name others.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A stand-in's process, killed and waited for on drop (one already gone
/// is fine).
struct StoppedOnDrop(Child);

impl Drop for StoppedOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running moto server; stopped on drop.
pub struct Moto {
    child: StoppedOnDrop,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

/// The interpreter with moto: `FOVEA_PYTHON`, else the test venv, else `python3`.
pub fn python() -> String {
    let venv = "/var/tmp/fovea-py/bin/python";
    std::env::var("FOVEA_PYTHON")
        .unwrap_or_else(|_| if Path::new(venv).exists() { venv.into() } else { "python3".into() })
}

impl Moto {
    /// Starts moto; `script` is `scripts/moto_serial.py` of the source tree.
    pub fn start(script: &Path) -> std::io::Result<Moto> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = std::env::temp_dir().join(format!("fovea-moto-{port}.log"));
        let python = python();
        let child = Command::new(&python)
            .arg(script)
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot start moto with {python} (run scripts/test-deps.sh): {e}"),
                )
            })?;
        let mut moto = Moto { child: StoppedOnDrop(child), endpoint: format!("http://127.0.0.1:{port}") };
        crate::wait_listening(&mut moto.child.0, port, Duration::from_secs(60), || {
            format!(
                "moto did not start (run scripts/test-deps.sh):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })?;
        Ok(moto)
    }

    /// The AWS environment that points clients at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_DEFAULT_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ]
    }

    /// Creates bucket `name` (moto takes a plain PUT of its path).
    pub fn create_bucket(&self, name: &str) -> std::io::Result<()> {
        self.request("PUT", &format!("/{name}"), "200").map(|_| ())
    }

    /// The keys in `bucket` under `prefix` (up to 1,000).
    pub fn list_keys(&self, bucket: &str, prefix: &str) -> std::io::Result<Vec<String>> {
        let answer = self.request("GET", &format!("/{bucket}?list-type=2&prefix={prefix}"), "200")?;
        Ok(answer
            .split("<Key>")
            .skip(1)
            .filter_map(|part| part.split_once("</Key>").map(|(key, _)| key.to_owned()))
            .collect())
    }

    /// Every object of `bucket` under `prefix` with its ETag, by key (with
    /// boto3 from moto's interpreter: all pages).
    pub fn list_objects(
        &self,
        bucket: &str,
        prefix: &str,
    ) -> std::io::Result<std::collections::BTreeMap<String, String>> {
        const LIST: &str = "import sys, json, boto3\n\
            pages = boto3.client('s3').get_paginator('list_objects_v2').paginate(Bucket=sys.argv[1], Prefix=sys.argv[2])\n\
            print(json.dumps({o['Key']: o['ETag'] for p in pages for o in p.get('Contents', [])}))";
        let out = Command::new(python()).envs(self.env()).args(["-c", LIST, bucket, prefix]).output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "listing {bucket}/{prefix}: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        serde_json::from_slice(&out.stdout).map_err(std::io::Error::other)
    }

    /// Deletes object `key` of `bucket` (as a retired file is deleted),
    /// with boto3 from moto's interpreter (moto wants deletes signed).
    pub fn delete_object(&self, bucket: &str, key: &str) -> std::io::Result<()> {
        self.delete_objects(bucket, &[key])
    }

    /// Deletes the objects `keys` of `bucket`, with one boto3 call per
    /// thousand keys from one interpreter.
    pub fn delete_objects(&self, bucket: &str, keys: &[impl AsRef<str>]) -> std::io::Result<()> {
        const DELETE: &str = "import sys, boto3\n\
            s3, keys = boto3.client('s3'), sys.argv[2:]\n\
            for i in range(0, len(keys), 1000):\n\
            \x20   s3.delete_objects(Bucket=sys.argv[1], Delete={'Objects': [{'Key': k} for k in keys[i:i + 1000]]})";
        let out = Command::new(python())
            .envs(self.env())
            .args(["-c", DELETE, bucket])
            .args(keys.iter().map(AsRef::as_ref))
            .output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("deleting from {bucket}: {}", String::from_utf8_lossy(&out.stderr))))
        }
    }

    /// The items of a lake's DynamoDB state table `table` by partition key
    /// (`pk`), and its catalog's newest version (the `head` item's), with
    /// boto3 from moto's interpreter.
    pub fn state_items(&self, table: &str) -> std::io::Result<(std::collections::BTreeMap<String, usize>, u64)> {
        const SCAN: &str = "import sys, json, collections, boto3\n\
            items = [i for p in boto3.client('dynamodb').get_paginator('scan').paginate(TableName=sys.argv[1]) for i in p['Items']]\n\
            head = [int(i['version']['N']) for i in items if i['pk']['S'] == 'head']\n\
            print(json.dumps([collections.Counter(i['pk']['S'] for i in items), (head or [0])[0]]))";
        let out = Command::new(python()).envs(self.env()).args(["-c", SCAN, table]).output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!("scanning {table}: {}", String::from_utf8_lossy(&out.stderr))));
        }
        serde_json::from_slice(&out.stdout).map_err(std::io::Error::other)
    }

    /// One plain HTTP request to moto (it takes unsigned requests); the
    /// answer when its status is `status`.
    fn request(&self, method: &str, path: &str, status: &str) -> std::io::Result<String> {
        let host = self.endpoint.trim_start_matches("http://");
        let mut s = TcpStream::connect(host)?;
        write!(s, "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        if answer.lines().next().is_some_and(|l| l.contains(&format!(" {status} "))) {
            Ok(answer)
        } else {
            Err(std::io::Error::other(format!("{method} {path}: {answer}")))
        }
    }
}

/// `scripts/moto_serial.py` of this source tree.
pub fn script() -> PathBuf {
    crate::workspace_dir().join("scripts/moto_serial.py")
}

/// A running kinesalite (Kinesis) on a free loopback port; stopped on drop.
pub struct Kinesalite {
    child: StoppedOnDrop,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl Kinesalite {
    /// Starts kinesalite with node, from `FOVEA_NODE_MODULES` (default
    /// `/var/tmp/fovea-npm/node_modules`).
    pub fn start() -> std::io::Result<Kinesalite> {
        let modules =
            std::env::var("FOVEA_NODE_MODULES").unwrap_or_else(|_| "/var/tmp/fovea-npm/node_modules".to_owned());
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = std::env::temp_dir().join(format!("fovea-kinesalite-{port}.log"));
        // Its command line has no host option: bind loopback from a script.
        let script = format!(
            "require('kinesalite')({{createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 100}}).listen({port}, '127.0.0.1', () => console.log('listening'))"
        );
        let child = Command::new("node")
            .arg("-e")
            .arg(script)
            .env("NODE_PATH", &modules)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot start node for kinesalite: {e}")))?;
        let mut k = Kinesalite { child: StoppedOnDrop(child), endpoint: format!("http://127.0.0.1:{port}") };
        crate::wait_listening(&mut k.child.0, port, Duration::from_secs(60), || {
            format!(
                "kinesalite did not start (run scripts/test-deps.sh; modules from {modules}):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })?;
        Ok(k)
    }

    /// The environment that points Kinesis clients here (with
    /// [`Moto::env`] for the rest, or alone).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        kinesis_env(&self.endpoint)
    }
}

/// A running kinesis-local (npm's build of kinesis-mock) on free ports;
/// stopped on drop. Unlike kinesalite it registers stream consumers and
/// serves SubscribeToShard (an event stream over HTTP/1.1 on its plain
/// port, where Kinesis uses HTTP/2; the SDK reads either) — but it pushes
/// a shard's new records once a second, refuses subscriptions to closed
/// shards and sends no initial-response event.
pub struct KinesisLocal {
    child: StoppedOnDrop,
    /// `http://127.0.0.1:PORT` (its plain HTTP port).
    pub endpoint: String,
}

impl KinesisLocal {
    /// Starts kinesis-local with node, from `FOVEA_NODE_MODULES` (default
    /// `/var/tmp/fovea-npm/node_modules`), with no delay on stream and
    /// consumer state changes.
    pub fn start() -> std::io::Result<KinesisLocal> {
        let modules =
            std::env::var("FOVEA_NODE_MODULES").unwrap_or_else(|_| "/var/tmp/fovea-npm/node_modules".to_owned());
        let package = Path::new(&modules).join("kinesis-local");
        let free = || -> std::io::Result<u16> { Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()) };
        let (port, tls_port) = (free()?, free()?);
        let log = std::env::temp_dir().join(format!("fovea-kinesis-local-{port}.log"));
        let mut command = Command::new("node");
        command
            .arg(package.join("main.js"))
            // Its self-signed certificate (server.json) is read from here.
            .current_dir(&package)
            .env("KINESIS_MOCK_PLAIN_PORT", port.to_string())
            .env("KINESIS_MOCK_TLS_PORT", tls_port.to_string())
            .env("LOG_LEVEL", "WARN")
            .env("SHOULD_PERSIST_DATA", "false")
            .env("SHARD_LIMIT", "100");
        for setting in [
            "CREATE_STREAM_DURATION",
            "DELETE_STREAM_DURATION",
            "REGISTER_STREAM_CONSUMER_DURATION",
            "DEREGISTER_STREAM_CONSUMER_DURATION",
            "MERGE_SHARDS_DURATION",
            "SPLIT_SHARD_DURATION",
            "UPDATE_SHARD_COUNT_DURATION",
        ] {
            command.env(setting, "0ms");
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot start node for kinesis-local: {e}")))?;
        let mut k = KinesisLocal { child: StoppedOnDrop(child), endpoint: format!("http://127.0.0.1:{port}") };
        crate::wait_listening(&mut k.child.0, port, Duration::from_secs(60), || {
            format!(
                "kinesis-local did not start (run scripts/test-deps.sh; package at {}):\n{}",
                package.display(),
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })?;
        Ok(k)
    }

    /// The environment that points Kinesis clients here.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        kinesis_env(&self.endpoint)
    }
}

/// The environment pointing Kinesis clients at a local `endpoint`.
pub fn kinesis_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL_KINESIS", endpoint.to_owned()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_EC2_METADATA_DISABLED", "true".into()),
    ]
}

/// `scripts/fault_proxy.py` running in front of a local stand-in: an HTTP
/// layer that throttles, fails after applying, drops and delays requests
/// (see the script's docs for `faults`); stopped on drop.
pub struct FaultProxy {
    child: Child,
    /// `http://127.0.0.1:PORT`: point a client's endpoint here.
    pub endpoint: String,
    stats: PathBuf,
}

impl FaultProxy {
    /// Starts the proxy in front of `target` (`http://HOST:PORT`) with the
    /// script's fault options `faults` (e.g. `["--throttle", "0.1"]`).
    pub fn start(target: &str, faults: &[&str]) -> std::io::Result<FaultProxy> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        // Relaxed: only uniqueness matters.
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stats = std::env::temp_dir().join(format!("fovea-fault-proxy-{}-{seq}.json", std::process::id()));
        let script = crate::workspace_dir().join("scripts/fault_proxy.py");
        let mut child = Command::new(python())
            .arg(script)
            .args(["--target", target, "--stats"])
            .arg(&stats)
            .args(faults)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().expect("piped")), &mut line)?;
        let port = line.trim().strip_prefix("listening ").ok_or_else(|| {
            let _ = child.kill();
            std::io::Error::other(format!("the fault proxy did not start: {line:?}"))
        })?;
        Ok(FaultProxy { endpoint: format!("http://127.0.0.1:{port}"), child, stats })
    }

    /// How many requests it saw and what it injected, by kind (`requests`,
    /// `throttled`, `after`, `dropped`, `delayed`, `burst`).
    pub fn stats(&self) -> std::collections::BTreeMap<String, u64> {
        std::fs::read(&self.stats).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stats);
    }
}
