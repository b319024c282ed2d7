//! The JavaScript example (`examples/js/filter_row_groups.js`) against a
//! running `fovea serve`: it fetches a table's split and deleted-row
//! bitmaps over Flight (`fovea.split`), reads the row groups from the lake
//! with parquet-wasm and filters them with the wasm32 kernel; the visible
//! rows it counts are the table's row count as SQL answers it, for every
//! pg-tiny table, with stale versions in the files it read filtered out.
//! Needs Node, the example's packages and the built kernel package
//! (`scripts/test-deps.sh` installs and builds them).

use crate::common;
use std::path::Path;
use std::process::Command;

use crate::common::{Server, ok, pg_tiny, pg_tiny_tables};

#[test]
fn the_js_example_counts_what_sql_counts() {
    let modules =
        std::env::var("FOVEA_NODE_MODULES_JS").unwrap_or_else(|_| "/var/tmp/fovea-npm-js/node_modules".into());
    let kernel = fovea_testkit::workspace_dir().join("scan-wasm/js/dist/fovea_scan_wasm.js");
    assert!(
        Path::new(&modules).join("parquet-wasm").is_dir() && kernel.exists(),
        "the JS example's packages ({modules}) or the kernel package ({}) are missing: run scripts/test-deps.sh",
        kernel.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let input = pg_tiny().join("debezium_events.precise_schemas.jsonl.gz");
    // Small files, so the replayed tables sit in regular files and flushed
    // blocks with stale versions among their rows.
    let small = ["--block-rows", "512", "--blocks-per-file", "2"];
    ok(common::fovea().args(["replay", "--lake"]).arg(&lake).args(small).arg("--input").arg(&input).output().unwrap());
    let plain = dir.path().join("events.jsonl");
    std::fs::write(&plain, common::gunzip(&input)).unwrap();
    let mut extra = vec!["--gc-secs", "3600"];
    extra.extend(small);
    let server = Server::start(&lake, &format!("file:{}", plain.display()), &extra);
    let metrics = format!("http://{}", server.metrics.as_deref().unwrap());
    let example = fovea_testkit::workspace_dir().join("examples/js/filter_row_groups.js");
    let mut filtered_some = false;
    for table in pg_tiny_tables() {
        let out = Command::new("node")
            .arg(&example)
            .args(["--connect", &server.url, "--metrics", &metrics, "--table", &table, "--lake"])
            .arg(&lake)
            .env("NODE_PATH", &modules)
            .output()
            .unwrap();
        let line = ok(out);
        let answer: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line}"));
        eprintln!("{table}: {answer}");
        let count = server.sql(&format!("SELECT count(*) FROM {table}")).unwrap();
        assert_eq!(answer["visible"].as_u64().unwrap().to_string(), count.trim(), "{table}: {answer}");
        let (read, visible, memory) = (
            answer["rows_read"].as_u64().unwrap(),
            answer["visible"].as_u64().unwrap(),
            answer["in_memory"].as_u64().unwrap(),
        );
        filtered_some |= answer["row_groups"].as_u64().unwrap() > 0 && read > visible - memory;
    }
    assert!(filtered_some, "no table had stale rows in its files: the bitmaps went untested");
    server.stop();
}
