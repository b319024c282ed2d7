//! Readers fetch only what they read: a one-column scan of a wide table
//! fetches a small fraction of the files' bytes (footers and that column's
//! chunks), and restoring an engine reads footers, not whole files. The
//! store is wrapped in a `MeteredStore` that counts every request.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use fovea_core::Clock;
use fovea_core::metered::{MeteredStore, StoreMeter};
use fovea_core::mvcc::{MemoryTxnStore, TxnStore};
use fovea_core::schema::rows_from_batch;
use fovea_core::{Engine, EngineConfig, Op, ScanOptions, TableId, Value};
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt};

const COLUMNS: usize = 24;
const ROWS: i64 = 60_000;

fn wide_row(k: i64) -> Vec<Value> {
    let mut row = vec![Value::Int(k)];
    for c in 1..COLUMNS {
        // Incompressible-ish text, so every column chunk has real size.
        row.push(Value::Utf8(format!("{:016x}-{c}", (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ c as u64)));
    }
    row
}

#[test]
fn a_one_column_scan_fetches_a_small_fraction_of_the_files() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let txn: Arc<dyn TxnStore> = Arc::new(MemoryTxnStore::default());
    let config = EngineConfig::default().with_shards(2).with_blocks(8192, 2);
    let manifest = {
        let engine = Engine::open(Arc::clone(&store), Clock::open(Arc::clone(&txn)).unwrap(), config).unwrap();
        let mut fields = vec![Field::new("id", DataType::Int64, false)];
        fields.extend((1..COLUMNS).map(|c| Field::new(format!("c{c}"), DataType::Utf8, true)));
        let t = engine.create_table("s.wide", Arc::new(Schema::new(fields)), vec![0]).unwrap();
        assert_eq!(t.id, TableId(0));
        for chunk in (0..ROWS).collect::<Vec<_>>().chunks(5000) {
            engine.apply(chunk.iter().map(|&k| Op::Insert { table: t.id, row: wide_row(k) }).collect()).unwrap();
        }
        // Some rows deleted, so visibility applies too.
        engine
            .apply((0..ROWS).step_by(97).map(|k| Op::Delete { table: t.id, key: vec![Value::Int(k)] }).collect())
            .unwrap();
        engine.flush().unwrap();
        assert!(engine.combine().unwrap() > 0);
        engine.write_checkpoint().unwrap()
    };
    let files: Vec<_> = futures::executor::block_on(async {
        use futures::TryStreamExt;
        store.list(Some(&"tables/0".into())).try_collect::<Vec<_>>().await
    })
    .unwrap();
    let file_bytes: u64 = files.iter().map(|m| m.size).sum();
    // Regular files (combined) and flushed blocks of the files still open.
    assert!(files.iter().any(|m| m.location.as_ref().contains("/files/")), "{files:?}");
    assert!(files.iter().any(|m| m.location.as_ref().contains("/blocks/")), "{files:?}");

    // A reader restores from the checkpoint through a metered store.
    let meter = Arc::new(StoreMeter::default());
    let metered: Arc<dyn ObjectStore> = Arc::new(MeteredStore::new(Arc::clone(&store), Arc::clone(&meter)));
    let reader = Engine::restore(metered, Clock::open(txn).unwrap(), &manifest, false).unwrap();
    let restore = meter.counts();
    // Footers only for the data files (one tail request each), plus the
    // checkpoint's own objects.
    let index_bytes: u64 = manifest
        .shards
        .iter()
        .map(|s| futures::executor::block_on(store.head(&s.index.as_str().into())).unwrap().size)
        .sum();
    assert!(
        restore.bytes_read <= index_bytes + files.len() as u64 * fovea_core::lake::FOOTER_FETCH + (256 << 10),
        "restore read {} bytes ({} files of {file_bytes} bytes)",
        restore.bytes_read,
        files.len()
    );

    // One column of a 24-column table.
    let snapshot = reader.snapshot();
    let options = ScanOptions { projection: Some(vec![5]), ..ScanOptions::default() };
    let batches = reader.scan(&snapshot, "s.wide", options).unwrap().collect_batches().unwrap();
    let scan = {
        let now = meter.counts();
        (now.gets - restore.gets, now.bytes_read - restore.bytes_read)
    };
    eprintln!(
        "restore: {} bytes in {} requests; one-column scan: {} of {file_bytes} file bytes in {} requests",
        restore.bytes_read, restore.gets, scan.1, scan.0
    );
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows as i64, ROWS - (0..ROWS).step_by(97).count() as i64);
    assert_eq!(batches[0].num_columns(), 1);
    assert!(
        (scan.1 as f64) < 0.1 * file_bytes as f64,
        "a one-column scan read {} of {file_bytes} bytes in {} requests",
        scan.1,
        scan.0
    );
    // The values are right: every key's column 5.
    let mut got: Vec<String> = batches
        .iter()
        .flat_map(|b| rows_from_batch(b).unwrap())
        .map(|r| match &r[0] {
            Value::Utf8(s) => s.clone(),
            v => panic!("{v:?}"),
        })
        .collect();
    got.sort();
    let mut want: Vec<String> = (0..ROWS)
        .filter(|k| k % 97 != 0)
        .map(|k| match &wide_row(k)[5] {
            Value::Utf8(s) => s.clone(),
            _ => unreachable!(),
        })
        .collect();
    want.sort();
    assert_eq!(got, want);
}

/// A row group or flushed block whose rows are all at or before the
/// snapshot is read without its hidden create_ts column (8 bytes a row
/// nobody needs); one with newer rows is read with it, and they stay
/// hidden. A scan without visibility never reads it; a scan of no columns
/// does, to count rows.
#[test]
fn create_ts_is_read_only_where_a_row_may_be_newer_than_the_snapshot() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let txn: Arc<dyn TxnStore> = Arc::new(MemoryTxnStore::default());
    let config = EngineConfig::default().with_shards(1).with_blocks(1024, 2);
    let engine = Engine::open(store, Clock::open(txn).unwrap(), config).unwrap();
    let schema = Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Utf8, true)]);
    let t = engine.create_table("s.t", Arc::new(schema), vec![0]).unwrap();
    let insert = |keys: std::ops::Range<i64>| {
        let ops = keys.map(|k| Op::Insert { table: t.id, row: vec![Value::Int(k), Value::Utf8(format!("v{k}"))] });
        engine.apply(ops.collect()).unwrap();
    };
    // The first block holds rows from before and after `old`; the second
    // only rows after it; the third (still open, so read from memory)
    // only after too.
    insert(0..512);
    let old = engine.snapshot();
    insert(512..2048);
    insert(2048..2560);
    engine.flush().unwrap();
    assert!(engine.combine().unwrap() > 0);
    let new = engine.snapshot();

    let scan = |snap: &fovea_core::Snapshot, options: ScanOptions| {
        let mut scan = engine.scan(snap, "s.t", options).unwrap();
        let mut keys = Vec::new();
        let mut rows = 0;
        while let Some(b) = scan.next_batch().unwrap() {
            rows += b.num_rows();
            if b.num_columns() > 0 {
                keys.extend(rows_from_batch(&b).unwrap().into_iter().map(|r| r[0].clone()));
            }
        }
        (keys, rows, scan.metrics())
    };
    let keys = |r: std::ops::Range<i64>| r.map(Value::Int).collect::<Vec<_>>();

    let (got, _, m) = scan(&new, ScanOptions::default());
    assert_eq!(got, keys(0..2560));
    assert_eq!(m.splits_read, 3, "{m:?}");
    assert_eq!(m.splits_read_with_create_ts, 0, "{m:?}");

    // At `old`: the mixed row group is read with create_ts and cut; the
    // newer one is skipped by its statistics; the open block's rows (in
    // memory, with their create_ts) are all cut.
    let (got, _, m) = scan(&old, ScanOptions::default());
    assert_eq!(got, keys(0..512));
    assert_eq!((m.splits_read, m.splits_skipped_by_ts, m.splits_read_with_create_ts), (2, 1, 1), "{m:?}");

    let off = ScanOptions { visibility: fovea_core::VisibilityMode::Off, ..ScanOptions::default() };
    let (got, _, m) = scan(&old, off);
    assert_eq!(got, keys(0..2560));
    assert_eq!(m.splits_read_with_create_ts, 0, "{m:?}");

    // No columns: create_ts counts the rows.
    let (_, rows, m) = scan(&new, ScanOptions { projection: Some(vec![]), ..ScanOptions::default() });
    assert_eq!(rows, 2560);
    assert_eq!(m.splits_read_with_create_ts, 2, "{m:?}");
    let (_, rows, _) = scan(&old, ScanOptions { projection: Some(vec![]), ..ScanOptions::default() });
    assert_eq!(rows, 512);
}
