//! Seed inputs for the fuzz targets in their real formats: a checkpoint
//! manifest, primary-index images, a visibility checkpoint, split tasks of
//! every kind and visibility RPC requests, from a small lake with inserts,
//! updates and deletes. The text and protocol formats (Debezium, DMS,
//! pgoutput, DDL) come from `scripts/fuzz_seeds.py`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use fovea_core::frozen::FrozenVisibility;
use fovea_core::location::{OpenMode, open_lake};
use fovea_core::scan::{CmpOp, Predicate};
use fovea_core::{EngineConfig, Op, ScanOptions, Value};
use tempfile::tempdir;

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let d = dir.join(target);
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join(name), bytes)
}

/// Writes the seeds under `out/<target>/`; returns how many split tasks
/// it wrote.
pub fn write_seeds(out: &Path) -> Result<usize, Box<dyn std::error::Error>> {
    let lake_dir = tempdir()?;
    // Small blocks: flushed blocks and, after combine, regular files.
    let lake = open_lake(lake_dir.path(), EngineConfig::default().with_blocks(8, 2), OpenMode::Write)?;
    let engine = &lake.engine;
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("amount", DataType::Decimal128(12, 2), true),
        Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true),
    ]);
    let t = engine.create_table("public.t", Arc::new(schema), vec![0])?;
    let row = |k: i64| {
        vec![
            Value::Int(k),
            Value::Utf8(format!("n{k}")),
            Value::Decimal(i128::from(k) * 125),
            Value::Int(k * 1_000_000),
        ]
    };
    engine.apply((0..40).map(|k| Op::Insert { table: t.id, row: row(k) }).collect())?;
    engine.flush()?;
    engine.combine()?;
    engine.apply((0..40).step_by(7).map(|k| Op::Delete { table: t.id, key: vec![Value::Int(k)] }).collect())?;
    engine.apply((40..45).map(|k| Op::Insert { table: t.id, row: row(k) }).collect())?;
    let snapshot = engine.snapshot();

    let first = engine.write_checkpoint()?;
    engine.checkpoint_committed(&first);
    // A second checkpoint extends the first's chain with a delta.
    engine.apply((41..43).map(|k| Op::Delete { table: t.id, key: vec![Value::Int(k)] }).collect())?;
    engine.apply((50..53).map(|k| Op::Insert { table: t.id, row: row(k) }).collect())?;
    let manifest = engine.write_checkpoint()?;
    write(out, "checkpoint_manifest", "manifest.json", &serde_json::to_vec(&manifest)?)?;
    for entry in walk(lake_dir.path())? {
        let name = entry.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if name.starts_with("index-") && (name.ends_with(".bin") || name.ends_with(".delta")) {
            // The fuzz target appends the checksum itself.
            let bytes = std::fs::read(&entry)?;
            write(out, "index_image", &name, &bytes[..bytes.len().saturating_sub(4)])?;
        }
    }
    let frozen = FrozenVisibility::capture(engine, &snapshot)?.encode();
    write(out, "visibility_checkpoint", "frozen.bin", &frozen[..frozen.len() - 4])?;

    let filters = [
        None,
        Some(Predicate::Compare { column: 0, op: CmpOp::Gt, value: Value::Int(10) }),
        Some(Predicate::And(vec![
            Predicate::Compare { column: 1, op: CmpOp::NotEq, value: Value::Utf8("n3".into()) },
            Predicate::Compare { column: 2, op: CmpOp::LtEq, value: Value::Decimal(4000) },
        ])),
    ];
    let mut n = 0;
    for filter in filters {
        let options = ScanOptions { projection: Some(vec![2, 0, 1]), filter, ..ScanOptions::default() };
        for task in engine.scan(&snapshot, "public.t", options)?.tasks()? {
            write(out, "split_task", &format!("task-{n}.json"), &serde_json::to_vec(&task)?)?;
            n += 1;
        }
    }
    // Visibility RPC requests (the fuzz target's engine has table s.t with
    // regular files and snapshots 1 to 4): action byte, then the body.
    let requests: [(u8, &str); 4] = [
        (0, r#"{"table":"s.t","file":0,"row_groups":[0,1],"qts":3}"#),
        (0, r#"{"table":"s.t","file":1,"row_groups":[0],"qts":1}"#),
        (1, r#"{"table":"s.t","qts":4}"#),
        (1, r#"{"table":"s.t","qts":2}"#),
    ];
    for (i, (action, body)) in requests.iter().enumerate() {
        write(out, "rpc", &format!("request-{i}"), &[&[*action][..], body.as_bytes()].concat())?;
    }
    Ok(n)
}

fn walk(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() { files.extend(walk(&path)?) } else { files.push(path) }
    }
    Ok(files)
}
