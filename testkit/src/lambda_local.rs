//! A local Lambda endpoint for tests and benchmarks, without Docker:
//! `cargo lambda watch --only-lambda-apis` serves the Lambda invoke API
//! (what fovea and boto3 call, at `AWS_ENDPOINT_URL_LAMBDA`) and
//! the runtime API; this module starts it and then `instances` processes
//! of a function binary that poll it, as Lambda's execution environments
//! do (one invocation at a time each). `scripts/test-deps.sh` installs
//! cargo-lambda in `/var/tmp/fovea-tools/lambda-venv`; `FOVEA_CARGO_LAMBDA`
//! names another.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The cargo-lambda executable: `FOVEA_CARGO_LAMBDA`, else the one
/// `scripts/test-deps.sh` installs, else `cargo-lambda` on PATH.
pub fn cargo_lambda() -> String {
    let venv = "/var/tmp/fovea-tools/lambda-venv/bin/cargo-lambda";
    std::env::var("FOVEA_CARGO_LAMBDA")
        .unwrap_or_else(|_| if Path::new(venv).exists() { venv.into() } else { "cargo-lambda".into() })
}

/// Runs a function binary with no Lambda runtime API, as a test of what it
/// does outside Lambda: its exit status and everything it printed, or an
/// error if it is still running after 30 s (it must stop, not wait for
/// invocations that never come).
pub fn run_without_runtime_api(binary: &Path) -> std::io::Result<(std::process::ExitStatus, String)> {
    let mut child = Command::new(binary)
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let began = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if began.elapsed() > Duration::from_secs(30) {
            // A test process that hangs: stopping it, whatever its state.
            let _ = child.kill();
            return Err(std::io::Error::other(format!("{} waited without a runtime API", binary.display())));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output()?;
    Ok((status, format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))))
}

/// A running local Lambda endpoint with function instances; all stopped
/// on drop.
pub struct LocalLambda {
    watch: Child,
    /// Instances, with the function each serves.
    instances: Vec<(String, Child)>,
    port: u16,
    /// The first function's name (its binary's name).
    pub function: String,
    /// Binaries by function name.
    binaries: Vec<(String, PathBuf)>,
    env: Vec<(String, String)>,
    logs: PathBuf,
}

/// The function a binary serves: its file name.
fn function_name(binary: &Path) -> std::io::Result<String> {
    let function = binary
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| std::io::Error::other(format!("{} names no function", binary.display())))?
        .to_owned();
    if !binary.exists() {
        return Err(std::io::Error::other(format!(
            "{} is not built (cargo build --workspace builds it)",
            binary.display()
        )));
    }
    Ok(function)
}

impl LocalLambda {
    /// Starts the endpoint (in `workspace`, whose binaries it knows) and
    /// `instances` processes of `binary` with `env` added to theirs.
    pub fn start(
        workspace: &Path,
        binary: &Path,
        instances: usize,
        env: &[(String, String)],
    ) -> std::io::Result<LocalLambda> {
        let function = function_name(binary)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let logs = std::env::temp_dir().join(format!("fovea-lambda-{port}"));
        std::fs::create_dir_all(&logs)?;
        let tool = cargo_lambda();
        let watch = Command::new(&tool)
            .args(["lambda", "watch", "--only-lambda-apis", "--ignore-changes", "--invoke-address", "127.0.0.1"])
            .args(["--invoke-port", &port.to_string(), "--bin", &function])
            .current_dir(workspace)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(logs.join("watch.log"))?)
            .spawn()
            .map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot start {tool} (run scripts/test-deps.sh): {e}"))
            })?;
        let mut local = LocalLambda {
            watch,
            instances: Vec::new(),
            port,
            binaries: vec![(function.clone(), binary.to_owned())],
            function,
            env: env.to_vec(),
            logs,
        };
        let log = local.logs.join("watch.log");
        crate::wait_listening(&mut local.watch, port, Duration::from_secs(120), || {
            format!("cargo lambda watch did not start:\n{}", std::fs::read_to_string(&log).unwrap_or_default())
        })?;
        for _ in 0..instances {
            local.add_instance()?;
        }
        Ok(local)
    }

    /// Starts one more instance of the (first) function.
    pub fn add_instance(&mut self) -> std::io::Result<()> {
        let function = self.function.clone();
        self.spawn(&function, &[])
    }

    /// Serves another function (`binary`, named after it) on the same
    /// endpoint, with `instances` processes that also get `env`.
    pub fn add_function(&mut self, binary: &Path, instances: usize, env: &[(String, String)]) -> std::io::Result<()> {
        let function = function_name(binary)?;
        self.binaries.push((function.clone(), binary.to_owned()));
        for _ in 0..instances {
            self.spawn(&function, env)?;
        }
        Ok(())
    }

    /// Starts one more instance of `function` (served already), with `env`
    /// added to the endpoint's.
    pub fn spawn(&mut self, function: &str, env: &[(String, String)]) -> std::io::Result<()> {
        let binary = self
            .binaries
            .iter()
            .find(|(f, _)| f == function)
            .map(|(_, b)| b.clone())
            .ok_or_else(|| std::io::Error::other(format!("no function {function}")))?;
        let n = self.instances.len();
        let log = std::fs::File::create(self.logs.join(format!("instance-{n}.log")))?;
        let child = Command::new(&binary)
            .envs(self.env.iter().chain(env).map(|(k, v)| (k.as_str(), v.as_str())))
            .env("AWS_LAMBDA_RUNTIME_API", format!("http://127.0.0.1:{}/.rt/{function}", self.port))
            .env("AWS_LAMBDA_FUNCTION_NAME", function)
            .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024")
            // A function logs to stdout (CloudWatch on Lambda).
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.instances.push((function.to_owned(), child));
        Ok(())
    }

    /// Instances of `function` still running.
    pub fn running(&mut self, function: &str) -> usize {
        let mut n = 0;
        for (f, child) in &mut self.instances {
            if f == function && matches!(child.try_wait(), Ok(None)) {
                n += 1;
            }
        }
        n
    }

    /// Pauses (`pause = true`, SIGSTOP) or resumes (SIGCONT) instance `n`:
    /// a paused instance holding an invocation never answers it, as a hung
    /// function does.
    pub fn pause_instance(&self, n: usize, pause: bool) -> std::io::Result<()> {
        let (_, child) = self.instances.get(n).ok_or_else(|| std::io::Error::other(format!("no instance {n}")))?;
        let signal = if pause { "-STOP" } else { "-CONT" };
        let status = Command::new("kill").args([signal, &child.id().to_string()]).status()?;
        if status.success() { Ok(()) } else { Err(std::io::Error::other(format!("kill {signal} failed"))) }
    }

    /// The endpoint, for `AWS_ENDPOINT_URL_LAMBDA`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What `name` (`watch`, `instance-N`) logged.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Every instance's log, concatenated.
    pub fn instance_logs(&self) -> String {
        (0..self.instances.len()).map(|n| self.log(&format!("instance-{n}"))).collect::<Vec<_>>().join("\n")
    }
}

impl Drop for LocalLambda {
    fn drop(&mut self) {
        for child in self.instances.iter_mut().map(|(_, c)| c).chain(std::iter::once(&mut self.watch)) {
            // Stopping test processes: one already gone is fine.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
