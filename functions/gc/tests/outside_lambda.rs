//! The function binary outside Lambda: it stops with an error instead of
//! waiting for invocations that can never come. (Invocations through a
//! local Lambda endpoint are tested in `replayer/tests/it/lambda_functions.rs`;
//! this test also makes `cargo test --workspace` build the binary.)

#[test]
fn without_a_runtime_api_the_function_stops_with_an_error() {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_fovea-gc"));
    let (status, text) = fovea_testkit::lambda_local::run_without_runtime_api(binary).unwrap();
    assert!(!status.success());
    assert!(text.contains("AWS_LAMBDA_RUNTIME_API"), "{text}");
}
