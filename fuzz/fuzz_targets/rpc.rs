//! The replayer's visibility RPC as a scan worker calls it: the first byte
//! picks the action (`fovea.bitmaps`, `fovea.split`, or an unknown one),
//! the rest is the request body, answered from a running engine with
//! regular files, flushed blocks, in-memory rows and deleted rows. Any
//! body must get an answer or an error, never a panic or a hang.
#![no_main]

use std::sync::{Arc, OnceLock};

use arrow_schema::{DataType, Field, Schema};
use fovea_core::rpc;
use fovea_core::{Engine, EngineConfig, Op, Value};
use libfuzzer_sys::fuzz_target;

/// Table `s.t`: 500 rows combined into regular files, every 7th deleted,
/// 50 more rows in memory (snapshots 1 to 4 exist).
fn engine() -> &'static Arc<Engine> {
    static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let engine = Engine::in_memory(EngineConfig::default().with_shards(1).with_blocks(100, 2)).unwrap();
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Utf8, true)]);
        let t = engine.create_table("s.t", Arc::new(schema), vec![0]).unwrap().id;
        let insert = |keys: std::ops::Range<i64>| {
            keys.map(|k| Op::Insert { table: t, row: vec![Value::Int(k), Value::Utf8(format!("v{k}"))] })
                .collect::<Vec<_>>()
        };
        engine.apply(insert(0..500)).unwrap();
        engine.flush().unwrap();
        engine.combine().unwrap();
        engine.apply((0..500).step_by(7).map(|k| Op::Delete { table: t, key: vec![Value::Int(k)] }).collect()).unwrap();
        engine.apply(insert(500..550)).unwrap();
        engine.flush().unwrap();
        engine.apply(insert(550..560)).unwrap();
        engine
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    let action = match which % 3 {
        0 => rpc::BITMAPS,
        1 => rpc::SPLIT,
        _ => "fovea.unknown",
    };
    let _ = rpc::answer(engine(), action, body);
});
