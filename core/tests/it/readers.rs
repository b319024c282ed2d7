//! Readers on other hosts: a reader that opened the lake at a checkpoint
//! keeps the objects of that checkpoint (retired blocks, the checkpoint's
//! own files) while its registration lives, and stops holding them when it
//! ends or lapses; what it reads stays right throughout.

use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{DataType, Field, Schema};
use fovea_core::catalog::CheckpointRecord;
use fovea_core::location::{LakeBackends, OpenLake, OpenMode, open, open_lake};
use fovea_core::{EngineConfig, Op, ScanOptions, TableId, Value};

fn objects(dir: &std::path::Path, under: &str) -> Vec<String> {
    let mut out = Vec::new();
    let root = dir.join(under);
    if root.is_dir() {
        for e in walk(&root) {
            out.push(e.strip_prefix(dir).unwrap().display().to_string());
        }
    }
    out.sort();
    out
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

fn checkpoint(lake: &OpenLake) {
    let manifest = lake.engine.write_checkpoint().unwrap();
    let record = CheckpointRecord { manifest, input: "t".into(), position: Default::default(), source_state: None };
    lake.catalog.commit_checkpoint(lake.engine.clock().epoch(), record.clone(), &[], &[]).unwrap();
    lake.engine.checkpoint_committed(&record.manifest);
    lake.engine.drop_old_checkpoints(&record.manifest).unwrap();
}

fn count(lake: &OpenLake) -> usize {
    let snap = lake.engine.snapshot();
    lake.engine
        .scan(&snap, "s.t", ScanOptions::default())
        .unwrap()
        .collect_batches()
        .unwrap()
        .iter()
        .map(|b| b.num_rows())
        .sum()
}

#[test]
fn a_registered_reader_keeps_what_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig::default().with_shards(1).with_blocks(100, 2);
    let writer = open_lake(dir.path(), config, OpenMode::Write).unwrap();
    let schema = Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Int64, true)]);
    let t = writer.engine.create_table("s.t", Arc::new(schema), vec![0]).unwrap();
    assert_eq!(t.id, TableId(0));
    // Two full blocks of one file, flushed and checkpointed.
    writer
        .engine
        .apply((0..200).map(|k| Op::Insert { table: t.id, row: vec![Value::Int(k), Value::Int(k)] }).collect())
        .unwrap();
    writer.engine.flush().unwrap();
    checkpoint(&writer);
    let blocks = objects(dir.path(), "tables/0/blocks");
    assert_eq!(blocks.len(), 2);
    let first_checkpoint = objects(dir.path(), "_fovea/checkpoints");

    // A reader restores that checkpoint (and registers it).
    let reader = open_lake(dir.path(), EngineConfig::default(), OpenMode::Read).unwrap();
    assert_eq!(count(&reader), 200);

    // The writer combines the blocks into a regular file and checkpoints
    // twice: the blocks and the old checkpoint stay while the reader lives.
    assert_eq!(writer.engine.combine().unwrap(), 1);
    writer.engine.apply(vec![Op::Insert { table: t.id, row: vec![Value::Int(1000), Value::Null] }]).unwrap();
    checkpoint(&writer);
    checkpoint(&writer);
    writer.engine.gc().unwrap();
    assert!(blocks.iter().all(|p| dir.path().join(p).exists()), "{blocks:?}");
    assert!(first_checkpoint.iter().all(|p| dir.path().join(p).exists()));
    // The reader still reads its snapshot, from the blocks.
    assert_eq!(count(&reader), 200);

    // The reader ends: both go at the next checkpoint and GC.
    drop(reader);
    checkpoint(&writer);
    writer.engine.gc().unwrap();
    assert!(blocks.iter().all(|p| !dir.path().join(p).exists()), "{blocks:?}");
    assert!(first_checkpoint.iter().all(|p| !dir.path().join(p).exists()));
    assert_eq!(count(&writer), 201);

    // A registration that lapsed (a dead reader) holds nothing back.
    let txn = LakeBackends::local(dir.path()).unwrap().txn;
    txn.register_reader("dead", fovea_core::Ts(1), fovea_core::catalog::now_us() - 1).unwrap();
    assert_eq!(writer.engine.oldest_reader().unwrap(), None);
    // A live one does, until deregistered.
    let b = LakeBackends::local(dir.path()).unwrap();
    let live = open(b, EngineConfig::default(), OpenMode::Read, Duration::from_secs(60)).unwrap();
    assert!(writer.engine.oldest_reader().unwrap().is_some());
    drop(live);
    assert_eq!(writer.engine.oldest_reader().unwrap(), None);
    let _ = writer.catalog.version().unwrap();
}
