//! Storage GC against the oracle: rewritten files answer every live
//! snapshot as before (a scan running across the swap included), deletes
//! made after the rewrite's snapshot come over to the new file, the lake
//! shrinks, and a replaced file is deleted only once no reader that could
//! read it is left.

use std::sync::Arc;

use fovea_core::{Engine, EngineConfig, Op, ScanOptions, TableId};
use object_store::ObjectStore;
use object_store::memory::InMemory;
use object_store::path::Path;

use fovea_core::schema::rows_from_batch;

use crate::oracle::{ACCOUNTS, Oracle, canonical, create_tables, key, row, scan_rows};

const KEYS: i64 = 3000;

fn engine() -> (Arc<Engine>, Arc<dyn ObjectStore>, Oracle) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let engine = Engine::open(
        Arc::clone(&store),
        fovea_core::Clock::in_memory(),
        EngineConfig::default().with_shards(2).with_blocks(512, 4),
    )
    .unwrap();
    let oracle = create_tables(&engine);
    (engine, store, oracle)
}

fn apply(engine: &Engine, oracle: &mut Oracle, ops: Vec<Op>) {
    let ts = engine.apply(ops.clone()).unwrap();
    assert!(oracle.apply(ts.get(), &ops), "the oracle refused {ts:?}");
}

/// Every key written `rounds` times (payload = round; upserts: deleted
/// keys come back), in transactions of 500.
fn update_all(engine: &Engine, oracle: &mut Oracle, rounds: std::ops::Range<i64>) {
    for round in rounds {
        for chunk in (0..KEYS).collect::<Vec<_>>().chunks(500) {
            let ops = chunk.iter().map(|&k| Op::Upsert { table: TableId(0), row: row(0, k, round) }).collect();
            apply(engine, oracle, ops);
        }
    }
}

/// Every key inserted, then written three times more; flushed and
/// combined: the loaded files' rows are all stale, three in four overall.
fn three_quarters_stale(engine: &Engine, oracle: &mut Oracle) {
    let inserts = (0..KEYS).map(|k| Op::Insert { table: TableId(0), row: row(0, k, -1) }).collect();
    apply(engine, oracle, inserts);
    update_all(engine, oracle, 0..3);
    engine.flush().unwrap();
    engine.combine().unwrap();
}

/// Bytes and paths of the regular files in the lake.
fn regular_files(store: &Arc<dyn ObjectStore>) -> (u64, Vec<Path>) {
    let lake = fovea_core::lake::Lake::new(Arc::clone(store));
    let files: Vec<_> = lake
        .list(&Path::from("tables"))
        .unwrap()
        .into_iter()
        .filter(|m| m.location.as_ref().contains("/files/"))
        .collect();
    (files.iter().map(|m| m.size).sum(), files.into_iter().map(|m| m.location).collect())
}

#[test]
fn rewritten_files_answer_every_snapshot_and_the_lake_shrinks() {
    let (engine, store, mut oracle) = engine();
    three_quarters_stale(&engine, &mut oracle);
    let (bytes_before, old_paths) = regular_files(&store);
    assert!(!old_paths.is_empty(), "combine made regular files");

    // A scan begun before the swap, one batch read.
    let held = engine.snapshot();
    let mut scan = engine.scan(&held, ACCOUNTS, ScanOptions::default()).unwrap();
    let mut seen = rows_from_batch(&scan.next_batch().unwrap().expect("a first batch")).unwrap();
    // Deletes after the held snapshot: the rewrite keeps these rows (they
    // are visible at LWM) and must carry the deletes over.
    let after_held: Vec<Op> = (0..KEYS).step_by(3).map(|k| Op::Delete { table: TableId(0), key: key(0, k) }).collect();
    apply(&engine, &mut oracle, after_held);
    let between = engine.snapshot();
    update_all(&engine, &mut oracle, 3..4);
    engine.flush().unwrap();
    engine.combine().unwrap();

    let report = engine.storage_gc(0.5).unwrap();
    assert_eq!(report.gts, held.qts(), "the rewrite keeps what the held snapshot sees");
    assert!(report.files_rewritten > 0, "{report:?}");
    assert!(report.rows_dropped >= 3 * KEYS as usize * 9 / 10, "{report:?}");

    // The scan across the swap answers its snapshot.
    for b in scan.by_ref() {
        seen.extend(rows_from_batch(&b.unwrap()).unwrap());
    }
    canonical(&mut seen);
    assert_eq!(seen, oracle.visible(0, held.qts().get()), "scan across the swap");
    for s in [&held, &between, &engine.snapshot()] {
        assert_eq!(
            scan_rows(&engine, s, ACCOUNTS, ScanOptions::default()),
            oracle.visible(0, s.qts().get()),
            "after the swap at qts {:?}",
            s.qts()
        );
    }

    // The replaced files stay while a reader registered before the swap is
    // live, and go once none is.
    engine.gc().unwrap();
    let (_, paths) = regular_files(&store);
    assert!(old_paths.iter().any(|p| paths.contains(p)), "a replaced file was deleted under a live reader");
    drop((scan, held, between));
    engine.gc().unwrap();
    // A second round drops what the held snapshot kept.
    let second = engine.storage_gc(0.5).unwrap();
    assert!(second.files_rewritten > 0, "{second:?}");
    engine.gc().unwrap();
    let (bytes_after, paths) = regular_files(&store);
    assert!(old_paths.iter().all(|p| !paths.contains(p)), "replaced files left after their readers");
    assert!(
        bytes_after * 3 < bytes_before,
        "the lake holds {bytes_after} bytes of files after GC, {bytes_before} before"
    );
    let now = engine.snapshot();
    assert_eq!(scan_rows(&engine, &now, ACCOUNTS, ScanOptions::default()), oracle.visible(0, now.qts().get()));

    // The rewritten rows are found by their keys: updates and deletes of
    // them after GC apply to the new files, and survive a restart.
    update_all(&engine, &mut oracle, 4..5);
    let deletes = (1..KEYS).step_by(3).map(|k| Op::Delete { table: TableId(0), key: key(0, k) }).collect();
    apply(&engine, &mut oracle, deletes);
    let manifest = engine.write_checkpoint().unwrap();
    drop(now);
    let clock = Arc::clone(engine.clock());
    drop(engine);
    let engine = Engine::restore(store, clock, &manifest, true).unwrap();
    let s = engine.snapshot();
    assert_eq!(scan_rows(&engine, &s, ACCOUNTS, ScanOptions::default()), oracle.visible(0, s.qts().get()));
}

#[test]
fn a_file_with_every_row_deleted_is_removed() {
    let (engine, store, mut oracle) = engine();
    // Three files of 2048 rows per shard, the last one still open.
    let keys = 12_000;
    let inserts = (0..keys).map(|k| Op::Insert { table: TableId(0), row: row(0, k, 1) }).collect();
    apply(&engine, &mut oracle, inserts);
    let deletes = (0..keys).map(|k| Op::Delete { table: TableId(0), key: key(0, k) }).collect();
    apply(&engine, &mut oracle, deletes);
    engine.flush().unwrap();
    assert!(engine.combine().unwrap() >= 4);
    let report = engine.storage_gc(1.0).unwrap();
    assert!(report.files_rewritten >= 4, "{report:?}");
    assert_eq!(report.rows_kept, 0, "{report:?}");
    assert_eq!(report.rows_dropped, report.files_rewritten * 2048, "{report:?}");
    engine.gc().unwrap();
    assert_eq!(regular_files(&store).1, Vec::<Path>::new());
    // The keys can come back.
    let inserts = (0..10).map(|k| Op::Insert { table: TableId(0), row: row(0, k, 2) }).collect();
    apply(&engine, &mut oracle, inserts);
    let s = engine.snapshot();
    assert_eq!(scan_rows(&engine, &s, ACCOUNTS, ScanOptions::default()), oracle.visible(0, s.qts().get()));
}

#[test]
fn a_pause_holds_storage_gc_off_until_dropped() {
    let (engine, _store, mut oracle) = engine();
    three_quarters_stale(&engine, &mut oracle);
    let pause = engine.pause_storage_gc();
    let held = engine.storage_gc(0.5).unwrap();
    assert_eq!((held.files_rewritten, held.rows_dropped), (0, 0), "{held:?}");
    drop(pause);
    let report = engine.storage_gc(0.5).unwrap();
    assert!(report.files_rewritten > 0, "{report:?}");
    let s = engine.snapshot();
    assert_eq!(scan_rows(&engine, &s, ACCOUNTS, ScanOptions::default()), oracle.visible(0, s.qts().get()));
}
