//! The function binary outside Lambda: it stops with an error instead of
//! waiting for invocations that can never come. (Invocations through a
//! local Lambda endpoint are tested in `replayer/tests/lambda_functions.rs`;
//! this test also makes `cargo test --workspace` build the binary.)

use std::process::Command;
use std::time::Duration;

#[test]
fn without_a_runtime_api_the_function_stops_with_an_error() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fovea-gc"))
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let began = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(began.elapsed() < Duration::from_secs(30), "the function waited without a runtime API");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("AWS_LAMBDA_RUNTIME_API"), "{text}");
}
