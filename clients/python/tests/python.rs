//! The `fovea` Python package as users run it: the extension module this
//! crate builds (`cargo test` builds the cdylib beside the test) loaded by
//! CPython from a package folder like the one maturin installs, against a
//! replayed pg-tiny lake, its answers checked against the `fovea` command
//! line on the same lake (tests/test_fovea.py):
//! * on the embedded default (a local directory), with the lake moving
//!   under a held snapshot;
//! * on S3 + DynamoDB (moto) with the scans on the Lambda scan function
//!   (`cargo lambda watch`), where the example notebook
//!   (examples/notebook.ipynb) then runs top to bottom in a Jupyter kernel
//!   (nbclient), with pandas and DuckDB reading its answers.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fovea_testkit::lambda_local::LocalLambda;
use fovea_testkit::moto::Moto;

/// Where this test runs from: the target directory's `deps`.
fn deps() -> PathBuf {
    std::env::current_exe().unwrap().parent().unwrap().to_owned()
}

/// A binary of the workspace, built beside this test by
/// `cargo nextest run --workspace` (or `cargo build --workspace`).
fn binary(name: &str) -> PathBuf {
    let path = deps().parent().unwrap().join(name);
    assert!(path.exists(), "{} is not built: cargo build --workspace builds it", path.display());
    path
}

fn workspace() -> PathBuf {
    fovea_testkit::workspace_dir()
}

/// A folder holding the `fovea` package as maturin lays it out: the Python
/// sources and the extension module as `fovea/_fovea.abi3.so`.
fn package() -> tempfile::TempDir {
    let module = deps().join("libfovea_python.so");
    assert!(module.exists(), "{} is not built (cargo test builds it with this test)", module.display());
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("fovea");
    std::fs::create_dir(&pkg).unwrap();
    let sources = fovea_testkit::package_dir!().join("python/fovea");
    for entry in std::fs::read_dir(sources).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), pkg.join(entry.file_name())).unwrap();
    }
    std::os::unix::fs::symlink(&module, pkg.join("_fovea.abi3.so")).unwrap();
    dir
}

fn python(package: &Path, env: &[(&str, String)], args: &[&str]) -> Output {
    Command::new(fovea_testkit::moto::python())
        .env("PYTHONPATH", package)
        .env("FOVEA_BIN", binary("fovea"))
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .current_dir(workspace())
        .args(args)
        .output()
        .unwrap()
}

#[track_caller]
fn ok(out: Output) -> String {
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// The pg-tiny change stream's lines.
fn pg_tiny() -> Vec<String> {
    let file = workspace().join("tests/data/pg-tiny/debezium_events.precise_schemas.jsonl.gz");
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(file).unwrap()).read_to_string(&mut text).unwrap();
    text.lines().map(str::to_owned).collect()
}

/// The package's tests ran, and none was skipped but `expected_skips`.
fn check_report(report: &str, expected_skips: usize) {
    let ran = report.lines().filter(|l| l.ends_with(" ... ok")).count();
    let skipped = report.lines().filter(|l| l.contains(" ... skipped")).count();
    assert!(ran >= 6 && skipped == expected_skips, "{report}");
}

#[test]
fn the_package_answers_as_the_command_line_on_a_local_lake() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    // The first half of the stream's transactions replayed; the package's
    // test replays the rest under a held snapshot.
    let lines = pg_tiny();
    let ends: Vec<usize> =
        lines.iter().enumerate().filter(|(_, l)| l.contains(r#""status":"END""#)).map(|(i, _)| i).collect();
    assert!(ends.len() > 10);
    let half = ends[ends.len() / 2] + 1;
    let input = dir.path().join("input.jsonl");
    let full = dir.path().join("full.jsonl");
    std::fs::write(&input, format!("{}\n", lines[..half].join("\n"))).unwrap();
    std::fs::write(&full, format!("{}\n", lines.join("\n"))).unwrap();
    ok(Command::new(binary("fovea"))
        .args(["replay", "--lake"])
        .arg(&lake)
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap());

    let package = package();
    let env = [
        ("FOVEA_LAKE", lake.display().to_string()),
        ("FOVEA_INPUT", input.display().to_string()),
        ("FOVEA_FULL_INPUT", full.display().to_string()),
    ];
    let report = ok(python(package.path(), &env, &["clients/python/tests/test_fovea.py"]));
    check_report(&report, 0);
}

#[test]
fn the_package_and_the_notebook_on_s3_with_lambda_scans() {
    let moto = Moto::start(&fovea_testkit::moto::script()).unwrap();
    moto.create_bucket("lake").unwrap();
    let (lake, state) = ("s3://lake/pg-tiny", "dynamodb://fovea-python");
    let input = workspace().join("tests/data/pg-tiny/debezium_events.precise_schemas.jsonl.gz");
    ok(Command::new(binary("fovea"))
        .envs(moto.env())
        .args(["replay", "--lake", lake, "--state", state, "--input"])
        .arg(&input)
        .output()
        .unwrap());
    let lambda_env: Vec<(String, String)> = moto.env().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let lambda = LocalLambda::start(&workspace(), &binary("fovea-scan"), 2, &lambda_env).unwrap();

    let package = package();
    let plot = tempfile::tempdir().unwrap();
    let png = plot.path().join("balances.png");
    let mut env: Vec<(&str, String)> = moto.env();
    env.extend([
        ("AWS_ENDPOINT_URL_LAMBDA", lambda.endpoint()),
        ("FOVEA_LAKE", lake.to_owned()),
        ("FOVEA_STATE", state.to_owned()),
        ("FOVEA_SCAN", "lambda://fovea-scan?concurrency=4&timeout_s=60".to_owned()),
        ("FOVEA_PLOT", png.display().to_string()),
    ]);
    let report = python(package.path(), &env, &["clients/python/tests/test_fovea.py"]);
    assert!(report.status.success(), "{}\n{}", String::from_utf8_lossy(&report.stderr), lambda.instance_logs());
    check_report(&String::from_utf8_lossy(&report.stderr), 1);
    // The scans ran on the function (its metrics line per invocation).
    let logs = lambda.instance_logs();
    assert!(logs.contains(r#""Function":"scan","invocations":1.0,"failures":0.0"#), "{logs}");

    // The notebook, top to bottom, in a Jupyter kernel that imports the
    // package as users install it.
    let executed = plot.path().join("notebook.ipynb");
    let run = format!(
        "import nbformat, nbclient\n\
         nb = nbformat.read('examples/notebook.ipynb', as_version=4)\n\
         nbclient.NotebookClient(nb, timeout=600, kernel_name='python3').execute()\n\
         nbformat.write(nb, {executed:?})\n\
         for cell in nb.cells:\n\
         \x20   for out in cell.get('outputs', []):\n\
         \x20       print(out.get('text', ''), end='')"
    );
    let printed = ok(python(package.path(), &env, &["-c", &run]));
    assert!(printed.contains("200 accounts, total balance"), "{printed}");
    assert!(printed.contains("accounts, as before"), "{printed}");
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    let notebook = std::fs::read_to_string(&executed).unwrap();
    assert!(!notebook.contains("\"output_type\": \"error\""), "{notebook}");
}
