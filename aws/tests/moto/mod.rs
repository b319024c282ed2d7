//! A throwaway local AWS (moto, serving one request at a time so that
//! DynamoDB conditional writes are atomic) for the tests of this crate.
//! `scripts/test-deps.sh` installs moto in `/var/tmp/fovea-py`; set
//! `FOVEA_PYTHON` to use another interpreter.
#![allow(dead_code)]

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running moto server on a loopback port.
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl Moto {
    /// Starts moto and points this process's AWS environment at it.
    ///
    /// Call it first thing in a test binary that has a single test: it
    /// sets environment variables, which is only sound while no other
    /// thread reads the environment.
    pub fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let venv = "/var/tmp/fovea-py/bin/python";
        let python = std::env::var("FOVEA_PYTHON")
            .unwrap_or_else(|_| if Path::new(venv).exists() { venv.into() } else { "python3".into() });
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/moto_serial.py");
        let log = std::env::temp_dir().join(format!("fovea-moto-{port}.log"));
        let child = Command::new(&python)
            .arg(&script)
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start moto with {python} (run scripts/test-deps.sh): {e}"));
        let began = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                began.elapsed() < Duration::from_secs(60),
                "moto did not start (run scripts/test-deps.sh):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let endpoint = format!("http://127.0.0.1:{port}");
        for (k, v) in [
            ("AWS_ENDPOINT_URL", endpoint.as_str()),
            ("AWS_REGION", "us-east-1"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ] {
            // SAFETY: the caller's contract: this runs before any other
            // thread of the test binary exists or reads the environment.
            unsafe { std::env::set_var(k, v) };
        }
        Moto { child, endpoint }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
