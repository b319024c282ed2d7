//! End-to-end: the engine on a local lake directory, closed and reopened.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use fovea_core::mvcc::{SqliteTxnStore, TxnStore};
use fovea_core::{Engine, EngineConfig, Op, ScanOptions, Value};

#[test]
fn timestamps_survive_reopen_and_files_stay_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Utf8, true)]));
    let last = {
        let engine = Engine::open_dir(dir.path(), EngineConfig::default().with_shards(2).with_blocks(64, 2)).unwrap();
        let t = engine.create_table("public.t", Arc::clone(&schema), vec![0]).unwrap();
        let mut last = fovea_core::Ts::ZERO;
        for chunk in (0..1000i64).collect::<Vec<_>>().chunks(50) {
            let ops =
                chunk.iter().map(|&k| Op::Insert { table: t.id, row: vec![Value::Int(k), Value::Null] }).collect();
            last = engine.apply(ops).unwrap();
        }
        engine.flush().unwrap();
        assert!(engine.combine().unwrap() > 0);
        let snap = engine.snapshot();
        let rows: usize =
            engine.scan(&snap, "public.t", ScanOptions::default()).unwrap().map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(rows, 1000);
        engine.clock().persist_watermarks().unwrap();
        last
    };
    let files = std::fs::read_dir(dir.path().join("tables/0/files")).unwrap().count();
    assert!(files > 0, "regular files are on disk");
    let persisted = SqliteTxnStore::open(&dir.path().join("_fovea/txn.sqlite")).unwrap().load().unwrap();
    assert!(persisted.reserved > last);
    assert_eq!(persisted.hwm.get(), last.get() + 1);
    let engine = Engine::open_dir(dir.path(), EngineConfig::default()).unwrap();
    let t = engine.create_table("public.t2", schema, vec![0]).unwrap();
    let ts = engine.apply(vec![Op::Insert { table: t.id, row: vec![Value::Int(1), Value::Utf8("x".into())] }]).unwrap();
    assert!(ts > last, "timestamps never repeat across restarts: {ts:?} after {last:?}");
}
