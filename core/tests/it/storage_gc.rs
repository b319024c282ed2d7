//! Storage GC against the oracle: rewritten files answer every live
//! snapshot as before (a scan running across the swap included), deletes
//! made after the rewrite's snapshot come over to the new file, the lake
//! shrinks, and a replaced file is deleted only once no reader that could
//! read it is left. A rewrite worker that dies at any phase (before
//! writing, mid-write, after writing) changes nothing and leaves no object;
//! rewrites run in parallel answer as in sequence.

use std::sync::Arc;

use fovea_core::{Engine, EngineConfig, Op, ScanOptions, TableId};
use object_store::ObjectStore;
use object_store::memory::InMemory;
use object_store::path::Path;

use fovea_core::rewrite::{KillPhase, LocalRewrites, RewriteAnswer, RewriteRequest, RewriteWorker, run_rewrite};
use fovea_core::scan_worker::{SplitFailure, SplitFailureKind};
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

/// A rewrite worker that dies at `phase`: before writing, half-way through
/// writing its output, or after writing it whole (the answer never comes).
#[derive(Debug)]
struct DyingWorker {
    lake: fovea_core::lake::Lake,
    phase: KillPhase,
}

impl RewriteWorker for DyingWorker {
    fn rewrite(&self, request: &RewriteRequest) -> Result<RewriteAnswer, SplitFailure> {
        let died = SplitFailure::new(SplitFailureKind::Failed, format!("died at {:?}", self.phase));
        let output = Path::from(request.output.as_str());
        match self.phase {
            KillPhase::BeforeWrite => {}
            KillPhase::MidWrite => {
                let whole = run_rewrite(&self.lake, request)?;
                let bytes = self.lake.get(&output).unwrap();
                self.lake.put(&output, bytes.slice(..whole.bytes() as usize / 2)).unwrap();
            }
            KillPhase::AfterWrite => {
                run_rewrite(&self.lake, request)?;
            }
        }
        Err(died)
    }

    fn concurrency(&self) -> usize {
        2
    }

    fn kind(&self) -> &'static str {
        "dying"
    }
}

/// Every key inserted, then every even key updated three times: the
/// loaded files are half stale, so their rewrites keep rows.
fn half_stale(engine: &Engine, oracle: &mut Oracle) {
    let inserts = (0..KEYS).map(|k| Op::Insert { table: TableId(0), row: row(0, k, -1) }).collect();
    apply(engine, oracle, inserts);
    for round in 0..3 {
        let ops = (0..KEYS).step_by(2).map(|k| Op::Upsert { table: TableId(0), row: row(0, k, round) }).collect();
        apply(engine, oracle, ops);
    }
}

/// Every object under `tables/` (blocks and files).
fn table_objects(store: &Arc<dyn ObjectStore>) -> Vec<Path> {
    let lake = fovea_core::lake::Lake::new(Arc::clone(store));
    let mut paths: Vec<Path> = lake.list(&Path::from("tables")).unwrap().into_iter().map(|m| m.location).collect();
    paths.sort();
    paths
}

fn assert_exact(engine: &Engine, oracle: &Oracle, when: &str) {
    let s = engine.snapshot();
    assert_eq!(scan_rows(engine, &s, ACCOUNTS, ScanOptions::default()), oracle.visible(0, s.qts().get()), "{when}");
}

#[test]
fn a_rewrite_that_dies_at_any_phase_changes_nothing_and_leaves_no_object() {
    for phase in [KillPhase::BeforeWrite, KillPhase::MidWrite, KillPhase::AfterWrite] {
        let (engine, store, mut oracle) = engine();
        let dying: Arc<dyn RewriteWorker> =
            Arc::new(DyingWorker { lake: fovea_core::lake::Lake::new(Arc::clone(&store)), phase });
        let local: Arc<dyn RewriteWorker> =
            Arc::new(LocalRewrites::new(fovea_core::lake::Lake::new(Arc::clone(&store))));
        half_stale(&engine, &mut oracle);
        engine.flush().unwrap();

        // Combine dies: every file stays virtual, its blocks stay, and
        // nothing new is left in the lake.
        let before = table_objects(&store);
        engine.set_rewrite_worker(Arc::clone(&dying));
        assert_eq!(engine.combine().unwrap(), 0, "{phase:?}");
        let failed = engine.rewrite_stats().failed.load(std::sync::atomic::Ordering::Relaxed);
        assert!(failed > 0, "{phase:?}: no combine failed");
        assert_eq!(table_objects(&store), before, "{phase:?}: a dead combine left objects");
        assert_exact(&engine, &oracle, "after a dead combine");

        // Combine works on the next round; then storage GC dies.
        engine.set_rewrite_worker(Arc::clone(&local));
        assert!(engine.combine().unwrap() > 0);
        engine.gc().unwrap();
        let before = regular_files(&store).1;
        engine.set_rewrite_worker(Arc::clone(&dying));
        let report = engine.storage_gc(0.4).unwrap();
        assert_eq!(report.files_rewritten, 0, "{phase:?}: {report:?}");
        assert!(report.failed > 0, "{phase:?}: {report:?}");
        assert_eq!(regular_files(&store).1, before, "{phase:?}: a dead rewrite left objects");
        assert_exact(&engine, &oracle, "after a dead storage GC");

        // Updates go on to the old files, and the next round succeeds.
        update_all(&engine, &mut oracle, 3..4);
        engine.set_rewrite_worker(Arc::clone(&local));
        let report = engine.storage_gc(0.4).unwrap();
        assert!(report.files_rewritten > 0 && report.failed == 0, "{phase:?}: {report:?}");
        assert_exact(&engine, &oracle, "after storage GC");
    }
}

/// Writes, beside the first regular file, a copy of it under a name of
/// fovea's that nothing names (a file id and round of an earlier epoch):
/// what a rewrite that finished after the replayer gave up leaves.
fn put_stray_file(store: &Arc<dyn ObjectStore>) -> Path {
    let lake = fovea_core::lake::Lake::new(Arc::clone(store));
    let (_, files) = regular_files(store);
    let dir = files[0].as_ref().rsplit_once('/').unwrap().0;
    let stray = Path::from(format!("{dir}/{:016x}-{:016x}.parquet", 0xabc, 0xfffff));
    lake.put(&stray, lake.get(&files[0]).unwrap()).unwrap();
    stray
}

#[test]
fn a_late_write_of_an_abandoned_rewrite_is_vacuumed_on_recovery() {
    let (engine, store, mut oracle) = engine();
    three_quarters_stale(&engine, &mut oracle);
    // A timed-out invocation that finishes after the replayer gave up:
    // its output (named by a round nothing names) appears after the
    // clean-up.
    let stray = put_stray_file(&store);
    assert_exact(&engine, &oracle, "beside a stray object");
    let manifest = engine.write_checkpoint().unwrap();
    let clock = Arc::clone(engine.clock());
    drop(engine);
    let engine = Engine::restore(Arc::clone(&store), clock, &manifest, true).unwrap();
    assert!(!regular_files(&store).1.contains(&stray), "the stray rewrite survived recovery");
    assert_exact(&engine, &oracle, "after recovery");
}

/// The checkpoint's own blocks (`…-cTS.parquet`, an open block's rows up to
/// a checkpoint) in the lake.
fn checkpoint_blocks(store: &Arc<dyn ObjectStore>) -> Vec<Path> {
    let lake = fovea_core::lake::Lake::new(Arc::clone(store));
    let mut blocks: Vec<_> = lake
        .list(&Path::from("tables"))
        .unwrap()
        .into_iter()
        .map(|m| m.location)
        .filter(|p| fovea_core::lake::is_checkpoint_block(p.as_ref()))
        .collect();
    blocks.sort();
    blocks
}

/// A checkpoint's own blocks written by a run that crashed before it
/// committed that checkpoint are litter like its other objects: recovery
/// deletes them (their names carry their file's epoch, an earlier one)
/// and keeps those of the checkpoint it restores.
#[test]
fn a_crashed_runs_checkpoint_blocks_are_vacuumed_on_recovery() {
    let (engine, store, mut oracle) = engine();
    // 700 rows in blocks of 512: the checkpoint writes the open block's 188.
    let inserts = (0..700).map(|k| Op::Insert { table: TableId(0), row: row(0, k, -1) }).collect();
    apply(&engine, &mut oracle, inserts);
    let manifest = engine.write_checkpoint().unwrap();
    engine.checkpoint_committed(&manifest);
    let named = checkpoint_blocks(&store);
    assert!(!named.is_empty(), "the checkpoint wrote no block of its own");
    // What a later checkpoint that was never committed leaves: a block of
    // the same file, cut at a later ts.
    let lake = fovea_core::lake::Lake::new(Arc::clone(&store));
    let (head, _) = named[0].as_ref().rsplit_once("-c").unwrap();
    let stray = Path::from(format!("{head}-c{}.parquet", manifest.checkpoint_ts + 1000));
    lake.put(&stray, lake.get(&named[0]).unwrap()).unwrap();
    let clock = Arc::clone(engine.clock());
    drop(engine);
    let engine = Engine::restore(Arc::clone(&store), clock, &manifest, true).unwrap();
    assert_eq!(checkpoint_blocks(&store), named, "recovery kept {stray} or lost the restored checkpoint's");
    assert_exact(&engine, &oracle, "after recovery");
}

/// With a retire grace (a replayer that publishes Iceberg snapshots, which
/// may name files its checkpoint no longer does), recovery retires the
/// young files it finds unnamed instead of deleting them: they go once the
/// grace has passed since they were written.
#[test]
fn recovery_with_a_retire_grace_keeps_young_unnamed_files_that_long() {
    let (engine, store, mut oracle) = engine();
    three_quarters_stale(&engine, &mut oracle);
    let young = put_stray_file(&store);
    let manifest = engine.write_checkpoint().unwrap();
    engine.checkpoint_committed(&manifest);
    let clock = Arc::clone(engine.clock());
    drop(engine);
    let grace = std::time::Duration::from_millis(1500);
    let engine = Engine::restore_with_grace(Arc::clone(&store), clock, &manifest, true, grace).unwrap();
    assert!(regular_files(&store).1.contains(&young), "deleted at recovery, within its grace");
    let manifest = engine.write_checkpoint().unwrap();
    engine.checkpoint_committed(&manifest);
    engine.gc().unwrap();
    assert!(regular_files(&store).1.contains(&young), "deleted by GC within its grace");
    assert_exact(&engine, &oracle, "after recovery");
    std::thread::sleep(grace);
    engine.gc().unwrap();
    assert!(!regular_files(&store).1.contains(&young), "kept past its grace");
    assert_exact(&engine, &oracle, "after its grace");
}

/// A worker running up to four rewrites at once, each in this process.
#[derive(Debug)]
struct Parallel(LocalRewrites, std::sync::atomic::AtomicUsize);

impl RewriteWorker for Parallel {
    fn rewrite(&self, request: &RewriteRequest) -> Result<RewriteAnswer, SplitFailure> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.rewrite(request)
    }

    fn concurrency(&self) -> usize {
        4
    }

    fn kind(&self) -> &'static str {
        "parallel"
    }
}

#[test]
fn rewrites_run_in_parallel_answer_as_in_sequence() {
    let (engine, store, mut oracle) = engine();
    let worker =
        Arc::new(Parallel(LocalRewrites::new(fovea_core::lake::Lake::new(Arc::clone(&store))), Default::default()));
    engine.set_rewrite_worker(Arc::clone(&worker) as Arc<dyn RewriteWorker>);
    half_stale(&engine, &mut oracle);
    engine.flush().unwrap();
    let combined = engine.combine().unwrap();
    assert!(combined >= 2, "{combined}");
    let report = engine.storage_gc(0.4).unwrap();
    assert!(report.files_rewritten >= 2 && report.rows_kept > 0, "{report:?}");
    assert_eq!(report.failed, 0);
    assert_eq!(worker.1.load(std::sync::atomic::Ordering::Relaxed), report.files_rewritten + combined);
    assert_exact(&engine, &oracle, "after parallel rewrites");
}

/// A worker whose first rewrite, once begun, waits until the test lets it
/// go; the others run at once, in this process.
#[derive(Debug)]
struct FirstWaits {
    local: LocalRewrites,
    first: std::sync::atomic::AtomicBool,
    begun: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl RewriteWorker for FirstWaits {
    fn rewrite(&self, request: &RewriteRequest) -> Result<RewriteAnswer, SplitFailure> {
        // Relaxed: only which call is first matters.
        if !self.first.swap(true, std::sync::atomic::Ordering::Relaxed) {
            self.begun.lock().unwrap().send(()).unwrap();
            self.go.lock().unwrap().recv().unwrap();
        }
        self.local.rewrite(request)
    }

    fn kind(&self) -> &'static str {
        "first-waits"
    }
}

/// Runs `round` twice at once: the first waits in its first rewrite while
/// the second runs whole and a GC round deletes what the second replaced.
/// Returns (first, second).
fn two_rounds_at_once<T: Send>(
    engine: &Arc<Engine>,
    store: &Arc<dyn ObjectStore>,
    round: impl Fn(&Engine) -> T + Sync,
) -> (T, T) {
    let (begun, first_begun) = std::sync::mpsc::channel();
    let (go, wait) = std::sync::mpsc::channel();
    let worker = Arc::new(FirstWaits {
        local: LocalRewrites::new(fovea_core::lake::Lake::new(Arc::clone(store))),
        first: Default::default(),
        begun: std::sync::Mutex::new(begun),
        go: std::sync::Mutex::new(wait),
    });
    engine.set_rewrite_worker(worker as Arc<dyn RewriteWorker>);
    std::thread::scope(|s| {
        let first = s.spawn(|| round(engine));
        first_begun.recv_timeout(std::time::Duration::from_secs(120)).expect("the first round rewrote nothing");
        let second = round(engine);
        engine.gc().unwrap();
        go.send(()).unwrap();
        (first.join().unwrap(), second)
    })
}

#[test]
fn rounds_running_at_once_rewrite_each_file_once() {
    let (engine, store, mut oracle) = engine();
    half_stale(&engine, &mut oracle);
    engine.flush().unwrap();

    // Two combines (the sink's after a checkpoint, a maintenance thread's):
    // a file the first is rewriting is not the second's to rewrite, so the
    // second's swap cannot retire the blocks the first reads (nor the
    // first's failure then delete the object the second swapped in).
    let (first, second) = two_rounds_at_once(&engine, &store, |e| e.combine().unwrap());
    assert_eq!(second, 0, "the second combine took files the first was rewriting");
    assert!(first >= 2, "{first}");
    assert_eq!(engine.rewrite_stats().failed.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_exact(&engine, &oracle, "after two combines at once");

    let (first, second) = two_rounds_at_once(&engine, &store, |e| e.storage_gc(0.4).unwrap());
    assert_eq!(
        second.files_rewritten + second.failed,
        0,
        "the second storage GC took files the first was rewriting: {second:?}"
    );
    assert!(first.files_rewritten >= 2 && first.failed == 0, "{first:?}");
    assert_exact(&engine, &oracle, "after two storage GC rounds at once");
    assert_eq!(engine.combine().unwrap(), 0);
    assert_eq!(engine.storage_gc(0.4).unwrap().files_rewritten, 0, "nothing stale is left");
}
