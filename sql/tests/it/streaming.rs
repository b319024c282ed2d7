//! Scans as streams of splits: planning (`EXPLAIN`) reads no data, `LIMIT`
//! reads a bounded number of splits, a scan larger than memory streams
//! within a budget, and a file combined between planning and execution is
//! read exactly once.

use std::sync::Arc;

use arrow::array::{Array, Int64Array};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::physical_plan::collect;
use fovea_core::metered::{MeteredStore, StoreMeter};
use fovea_core::mvcc::{MemoryTxnStore, TxnStore};
use fovea_core::{Clock, Engine, EngineConfig, Op, TableId, Value};
use object_store::ObjectStore;

fn table(engine: &Engine, payload: bool) -> TableId {
    let mut fields = vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Int64, false)];
    if payload {
        fields.push(Field::new("payload", DataType::Utf8, false));
    }
    engine.create_table("s.t", Arc::new(Schema::new(fields)), vec![0]).unwrap().id
}

fn fill(engine: &Engine, t: TableId, rows: i64, payload: usize) {
    for chunk in (0..rows).collect::<Vec<_>>().chunks(10_000) {
        let ops = chunk.iter().map(|&k| {
            let mut row = vec![Value::Int(k), Value::Int(k % 100)];
            if payload > 0 {
                // Incompressible-ish, so the decoded table is as large as it looks.
                let seed = (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                row.push(Value::Utf8((0..payload / 16).map(|i| format!("{:016x}", seed ^ i as u64)).collect()));
            }
            Op::Insert { table: t, row }
        });
        engine.apply(ops.collect()).unwrap();
    }
}

fn scalar(batches: &[arrow::record_batch::RecordBatch]) -> i64 {
    batches[0].column(0).as_any().downcast_ref::<Int64Array>().unwrap().value(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_nothing_and_limit_reads_a_bounded_number_of_splits() {
    let meter = Arc::new(StoreMeter::default());
    let store: Arc<dyn ObjectStore> =
        Arc::new(MeteredStore::new(Arc::new(object_store::memory::InMemory::new()), Arc::clone(&meter)));
    let txn: Arc<dyn TxnStore> = Arc::new(MemoryTxnStore::default());
    let config = EngineConfig::default().with_shards(2).with_blocks(1000, 4);
    let engine = Engine::open(store, Clock::open(txn).unwrap(), config).unwrap();
    let t = table(&engine, false);
    fill(&engine, t, 200_000, 0);
    engine.flush().unwrap();
    assert!(engine.combine().unwrap() > 0);
    let snapshot = engine.snapshot();
    let ctx = fovea_sql::session(&engine, &snapshot).unwrap();

    let before = meter.counts();
    let plan = ctx.sql("EXPLAIN SELECT id FROM s.t WHERE v > 5 LIMIT 10").await.unwrap().collect().await.unwrap();
    let text = arrow::util::pretty::pretty_format_batches(&plan).unwrap().to_string();
    assert!(text.contains("FoveaScanExec: table=s.t"), "{text}");
    assert_eq!(meter.counts().gets, before.gets, "EXPLAIN read data:\n{text}");

    let analyzed = ctx.sql("EXPLAIN ANALYZE SELECT * FROM s.t LIMIT 10").await.unwrap().collect().await.unwrap();
    let text = arrow::util::pretty::pretty_format_batches(&analyzed).unwrap().to_string();
    let number_after = |key: &str| -> usize {
        let at = text.find(key).unwrap_or_else(|| panic!("no {key} in\n{text}")) + key.len();
        text[at..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap()
    };
    let splits = number_after("splits=");
    let read = number_after("splits_read=");
    assert!(splits >= 150, "{text}");
    assert!(read <= 4, "LIMIT 10 read {read} of {splits} splits:\n{text}");
    let rows = ctx.sql("SELECT * FROM s.t LIMIT 10").await.unwrap().collect().await.unwrap();
    assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_combined_between_planning_and_execution_is_read_once() {
    let engine = Engine::in_memory(EngineConfig::default().with_shards(2).with_blocks(500, 4)).unwrap();
    let t = table(&engine, false);
    fill(&engine, t, 20_000, 0);
    engine.flush().unwrap();
    let snapshot = engine.snapshot();
    let ctx = fovea_sql::session(&engine, &snapshot).unwrap();
    let sql = "SELECT count(*), sum(id) FROM s.t";
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    // The blocks the plan names become regular files, and deletes land.
    assert!(engine.combine().unwrap() > 0);
    engine.apply((0..20_000).step_by(7).map(|k| Op::Delete { table: t, key: vec![Value::Int(k)] }).collect()).unwrap();
    engine.gc().unwrap();
    let old = collect(plan, ctx.task_ctx()).await.unwrap();
    assert_eq!(scalar(&old), 20_000, "read each row once, at the planned snapshot");
    let sum = old[0].column(1).as_any().downcast_ref::<Int64Array>().unwrap().value(0);
    assert_eq!(sum, (0..20_000).sum::<i64>());
    let now = fovea_sql::query(&engine, &engine.snapshot(), sql).await.unwrap();
    assert_eq!(scalar(&now), 20_000 - (0..20_000).step_by(7).count() as i64);
}

/// Peak resident memory of this process since the last reset.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
}

fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_larger_than_its_memory_budget_streams_within_it() {
    const BUDGET: u64 = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let txn: Arc<dyn TxnStore> = Arc::new(MemoryTxnStore::default());
    let config = EngineConfig::default().with_shards(2).with_blocks(2048, 8);
    let engine = Engine::open(store, Clock::open(txn).unwrap(), config).unwrap();
    let t = table(&engine, true);
    let rows = 160_000;
    fill(&engine, t, rows, 1024);
    engine.flush().unwrap();
    engine.combine().unwrap();
    engine.gc().unwrap();
    let snapshot = engine.snapshot();
    let ctx = fovea_sql::session(&engine, &snapshot).unwrap();
    let table_bytes = rows as u64 * 1024;
    assert!(table_bytes > 2 * BUDGET);
    // Reset the peak to now ("5" > clear_refs), then scan every byte.
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let base = rss();
    let got = ctx.sql("SELECT sum(length(payload)) FROM s.t").await.unwrap().collect().await.unwrap();
    assert_eq!(scalar(&got), table_bytes as i64);
    let grew = peak_rss().saturating_sub(base);
    assert!(grew < BUDGET, "a scan of {table_bytes} bytes grew the peak RSS by {grew} bytes (budget {BUDGET})");
}
