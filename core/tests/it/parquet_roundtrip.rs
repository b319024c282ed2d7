//! Files written by fovea read back with the `parquet` crate's own reader:
//! user columns and `_fovea_create_ts` intact, one row group per block,
//! create_ts ascending with row-group statistics.

use std::fs::File;

use arrow::array::{Array, Int64Array};
use fovea_core::schema::{CREATE_TS_COLUMN, rows_from_batch};
use fovea_core::{Engine, EngineConfig, Op, TableId};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::statistics::Statistics;

use crate::oracle::{create_tables, row};

#[test]
fn regular_files_read_back_with_the_parquet_reader() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open_dir(dir.path(), EngineConfig::default().with_shards(1).with_blocks(100, 3)).unwrap();
    create_tables(&engine);
    let mut expected = Vec::new();
    for chunk in (0..300i64).collect::<Vec<_>>().chunks(25) {
        let ops: Vec<Op> = chunk.iter().map(|&k| Op::Insert { table: TableId(0), row: row(0, k, k + 1) }).collect();
        expected.extend(chunk.iter().map(|&k| row(0, k, k + 1)));
        engine.apply(ops).unwrap();
    }
    engine.flush().unwrap();
    assert_eq!(engine.combine().unwrap(), 1);
    let files: Vec<_> =
        std::fs::read_dir(dir.path().join("tables/0/files")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1);
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(&files[0]).unwrap()).unwrap();
    let meta = builder.metadata().clone();
    assert_eq!(meta.num_row_groups(), 3, "one row group per block");
    let schema = builder.schema().clone();
    let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["id", "name", "balance", CREATE_TS_COLUMN]);
    let batches: Vec<_> = builder.build().unwrap().collect::<Result<_, _>>().unwrap();
    let mut rows = Vec::new();
    let mut create_ts = Vec::new();
    for b in &batches {
        rows.extend(rows_from_batch(&b.project(&[0, 1, 2]).unwrap()).unwrap());
        let c = b.column(3).as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(c.null_count(), 0);
        create_ts.extend(c.values().iter().copied());
    }
    assert_eq!(rows, expected, "same rows, same order");
    assert!(create_ts.windows(2).all(|w| w[0] <= w[1]), "create_ts ascending");
    assert_eq!(create_ts.first(), Some(&1));
    assert_eq!(create_ts.last(), Some(&12));
    for (i, rg) in meta.row_groups().iter().enumerate() {
        match rg.column(3).statistics() {
            Some(Statistics::Int64(s)) => {
                assert_eq!(*s.min_opt().unwrap(), create_ts[i * 100]);
                assert_eq!(*s.max_opt().unwrap(), create_ts[i * 100 + 99]);
            }
            other => panic!("row group {i}: no int64 statistics for create_ts: {other:?}"),
        }
    }
    // The flushed blocks are retired once no snapshot can read them.
    let report = engine.gc().unwrap();
    assert_eq!(report.objects_deleted, 3);
    assert!(std::fs::read_dir(dir.path().join("tables/0/blocks")).unwrap().next().is_none());
}

#[test]
fn files_past_the_stale_threshold_are_queued_for_storage_gc() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open_dir(dir.path(), EngineConfig::default().with_shards(1).with_blocks(100, 3)).unwrap();
    create_tables(&engine);
    engine.apply((0..300i64).map(|k| Op::Insert { table: TableId(0), row: row(0, k, k) }).collect()).unwrap();
    engine.flush().unwrap();
    assert_eq!(engine.combine().unwrap(), 1);
    assert!(engine.storage_gc_candidates(0.0).unwrap()[0].deleted == 0);
    // 120 of 300 rows deleted (40%): past a 30% threshold, not past 50%.
    engine
        .apply((0..120i64).map(|k| Op::Delete { table: TableId(0), key: vec![fovea_core::Value::Int(k)] }).collect())
        .unwrap();
    let queued = engine.storage_gc_candidates(0.3).unwrap();
    assert_eq!(queued.len(), 1);
    assert_eq!((queued[0].rows, queued[0].deleted), (300, 120));
    assert!(engine.storage_gc_candidates(0.5).unwrap().is_empty());
    // The queue is kept in the catalog for the rewrite job.
    use fovea_core::catalog::Catalog;
    let catalog =
        fovea_core::catalog::SqliteCatalog::open(&dir.path().join("catalog.sqlite"), &dir.path().join("txn.sqlite"))
            .unwrap();
    catalog.set_storage_gc_queue(0, &queued).unwrap();
    assert_eq!(catalog.storage_gc_queue().unwrap(), queued);
    catalog.set_storage_gc_queue(0, &[]).unwrap();
    assert!(catalog.storage_gc_queue().unwrap().is_empty());
}
