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

fn checkpoint(lake: &OpenLake) -> fovea_core::checkpoint::Manifest {
    let manifest = lake.engine.write_checkpoint().unwrap();
    let record = CheckpointRecord { manifest, input: "t".into(), position: Default::default(), source_state: None };
    lake.catalog.commit_checkpoint(lake.engine.clock().epoch(), record.clone(), &[], &[]).unwrap();
    lake.engine.checkpoint_committed(&record.manifest);
    lake.engine.drop_old_checkpoints(&record.manifest).unwrap();
    record.manifest
}

/// The checkpoint objects `m` names (a base index image outlives the
/// checkpoint that wrote it while later ones extend its chain).
fn named_by(m: &fovea_core::checkpoint::Manifest) -> Vec<String> {
    let mut out = Vec::new();
    for s in &m.shards {
        out.push(s.index.clone());
        out.extend(s.index_deltas.iter().cloned());
        out.extend(s.slots.iter().filter_map(|x| x.deleted.clone()));
    }
    out
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

/// A lake in `dir` whose table `s.t` holds rows 0..200 (`v` = `id`) in
/// two flushed blocks of one virtual file (with `config`'s 100-row
/// blocks), checkpointed: the writer and the checkpoint's manifest.
fn two_flushed_blocks(dir: &std::path::Path, config: EngineConfig) -> (OpenLake, fovea_core::checkpoint::Manifest) {
    let writer = open_lake(dir, config, OpenMode::Write).unwrap();
    let schema = Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Int64, true)]);
    let t = writer.engine.create_table("s.t", Arc::new(schema), vec![0]).unwrap();
    assert_eq!(t.id, TableId(0));
    writer
        .engine
        .apply((0..200).map(|k| Op::Insert { table: t.id, row: vec![Value::Int(k), Value::Int(k)] }).collect())
        .unwrap();
    writer.engine.flush().unwrap();
    let manifest = checkpoint(&writer);
    assert_eq!(objects(dir, "tables/0/blocks").len(), 2);
    (writer, manifest)
}

#[test]
fn a_registered_reader_keeps_what_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    // Two full blocks of one file, flushed and checkpointed.
    let (writer, _) = two_flushed_blocks(dir.path(), EngineConfig::default().with_shards(1).with_blocks(100, 2));
    let t = writer.engine.table("s.t").unwrap();
    let blocks = objects(dir.path(), "tables/0/blocks");
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
    let newest = named_by(&checkpoint(&writer));
    writer.engine.gc().unwrap();
    assert!(blocks.iter().all(|p| !dir.path().join(p).exists()), "{blocks:?}");
    assert!(
        first_checkpoint.iter().filter(|p| !newest.contains(p)).all(|p| !dir.path().join(p).exists()),
        "{first_checkpoint:?} (the newest checkpoint names {newest:?})"
    );
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

/// A reader of the checkpoint alone: opening reads no lake object, a scan
/// of one table never touches another's files, `LIMIT` reads one split,
/// and the answers are the writer's at the checkpoint.
#[test]
fn a_checkpoint_reader_opens_only_what_it_reads() {
    use fovea_core::SnapshotTables;
    use fovea_core::location::open_reader;
    use fovea_core::metered::{MeteredStore, StoreMeter};

    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig::default().with_shards(2).with_blocks(100, 2);
    let writer = open_lake(dir.path(), config, OpenMode::Write).unwrap();
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Int64, true)]));
    let a = writer.engine.create_table("s.a", Arc::clone(&schema), vec![0]).unwrap();
    let b = writer.engine.create_table("s.b", schema, vec![0]).unwrap();
    for t in [&a, &b] {
        let rows = (0..1000).map(|k| Op::Insert { table: t.id, row: vec![Value::Int(k), Value::Int(k)] }).collect();
        writer.engine.apply(rows).unwrap();
    }
    // Deletes and updates of a, some combined into regular files, some not.
    writer.engine.flush().unwrap();
    writer.engine.combine().unwrap();
    let changes = (0..1000)
        .step_by(7)
        .map(|k| match k % 2 {
            0 => Op::Delete { table: a.id, key: vec![Value::Int(k)] },
            _ => Op::Upsert { table: a.id, row: vec![Value::Int(k), Value::Int(-k)] },
        })
        .collect();
    writer.engine.apply(changes).unwrap();
    writer.engine.flush().unwrap();
    checkpoint(&writer);
    // After the checkpoint: not seen by the reader.
    writer.engine.apply(vec![Op::Delete { table: a.id, key: vec![Value::Int(1)] }]).unwrap();
    let c = writer.catalog.latest_checkpoint().unwrap().unwrap().manifest.checkpoint_ts;
    let at_checkpoint = writer.engine.snapshot_at(fovea_core::Ts(c)).unwrap();
    let expect = |t: &str| {
        let mut rows: Vec<Vec<Value>> = writer
            .engine
            .scan(&at_checkpoint, t, ScanOptions::default())
            .unwrap()
            .flat_map(|b| fovea_core::schema::rows_from_batch(&b.unwrap()).unwrap())
            .collect();
        rows.sort_by_key(|r| format!("{r:?}"));
        rows
    };
    let (want_a, want_b) = (expect("s.a"), expect("s.b"));
    assert_eq!(want_a.len(), 1000 - 72);

    let meter = Arc::new(StoreMeter::default());
    let mut backends = LakeBackends::local(dir.path()).unwrap();
    backends.store = Arc::new(MeteredStore::new(backends.store, Arc::clone(&meter)));
    let opened = open_reader(backends, Duration::from_secs(60)).unwrap();
    // Opening reads the lake's identity (one small object) and nothing else.
    let counts = meter.counts();
    assert_eq!((counts.requests(), counts.gets), (1, 1), "opening read lake objects: {counts:?}");
    assert!(counts.bytes_read < 200, "{counts:?}");
    assert_eq!(opened.reader.qts(), at_checkpoint.qts());

    // Table b's files gone: a scan of a does not notice.
    let b_files = dir.path().join("tables").join(b.id.0.to_string());
    let hidden = dir.path().join("hidden-b");
    std::fs::rename(&b_files, &hidden).unwrap();
    let mut limited = opened.reader.scan("s.a", ScanOptions::default()).unwrap().with_limit(Some(10));
    let first = limited.next_batch().unwrap().unwrap();
    assert_eq!(first.num_rows(), 10);
    assert!(limited.next_batch().unwrap().is_none());
    assert_eq!(limited.metrics().splits_read, 1);
    // One footer, one deleted-rows object, the split's three column chunks.
    assert!(meter.counts().gets <= 5, "LIMIT 10: {:?}", meter.counts());
    let rows = |t: &str| {
        let mut rows: Vec<Vec<Value>> = opened
            .reader
            .scan(t, ScanOptions::default())
            .unwrap()
            .flat_map(|b| fovea_core::schema::rows_from_batch(&b.unwrap()).unwrap())
            .collect();
        rows.sort_by_key(|r| format!("{r:?}"));
        rows
    };
    assert_eq!(rows("s.a"), want_a);
    std::fs::rename(&hidden, &b_files).unwrap();
    assert_eq!(rows("s.b"), want_b);
}

/// A checkpoint object that does not read back (a truncated deleted-rows
/// list, a damaged index image) stops recovery with an error naming the
/// object, not just what kind of thing it was.
#[test]
fn a_corrupt_checkpoint_object_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig::default().with_shards(2).with_blocks(100, 2);
    let manifest = {
        let writer = open_lake(dir.path(), config, OpenMode::Write).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ]));
        let t = writer.engine.create_table("s.t", schema, vec![0]).unwrap();
        let rows = (0..1000).map(|k| Op::Insert { table: t.id, row: vec![Value::Int(k), Value::Int(k)] }).collect();
        writer.engine.apply(rows).unwrap();
        writer.engine.flush().unwrap();
        let deletes = (0..1000).step_by(3).map(|k| Op::Delete { table: t.id, key: vec![Value::Int(k)] }).collect();
        writer.engine.apply(deletes).unwrap();
        checkpoint(&writer)
    };
    let deleted = manifest.shards.iter().flat_map(|s| s.slots.iter()).find_map(|x| x.deleted.clone()).unwrap();
    let index = manifest.shards[0].index.clone();
    let reopen = || match open_lake(dir.path(), config, OpenMode::Write) {
        Ok(_) => panic!("a lake with a corrupt checkpoint object opened"),
        Err(e) => e.to_string(),
    };
    let damage = |object: &str, change: &dyn Fn(&mut Vec<u8>)| {
        let path = dir.path().join(object);
        let good = std::fs::read(&path).unwrap();
        let mut bad = good.clone();
        change(&mut bad);
        std::fs::write(&path, &bad).unwrap();
        let message = reopen();
        std::fs::write(&path, &good).unwrap();
        message
    };
    let message = damage(&deleted, &|b| {
        b.pop();
    });
    assert!(message.contains(&deleted) && message.contains("4-byte"), "{message}");
    // A reader at the checkpoint reads the same object the same way.
    let path = dir.path().join(&deleted);
    let good = std::fs::read(&path).unwrap();
    std::fs::write(&path, &good[..good.len() - 1]).unwrap();
    let reader = fovea_core::location::open_reader(LakeBackends::local(dir.path()).unwrap(), Duration::from_secs(60))
        .unwrap()
        .reader;
    use fovea_core::SnapshotTables;
    let scanned: Result<Vec<_>, _> = reader.scan("s.t", ScanOptions::default()).unwrap().collect();
    let message = scanned.expect_err("a scan over a truncated deleted-rows object succeeded").to_string();
    assert!(message.contains(&deleted) && message.contains("4-byte"), "{message}");
    drop(reader);
    std::fs::write(&path, &good).unwrap();
    let message = damage(&index, &|b| {
        let mid = b.len() / 2;
        b[mid] ^= 0xff;
    });
    assert!(message.contains(&index) && message.contains("index"), "{message}");
    // Undamaged, it opens and reads as before.
    let lake = open_lake(dir.path(), config, OpenMode::Write).unwrap();
    assert_eq!(count(&lake), 1000 - 334);
}

/// The embedded lake's identity: a lake written before identities existed
/// (no `_fovea/lake.json`, its state unbound) is adopted by its writer; a
/// first open that stopped between writing the lake's id and binding the
/// state is completed; the state of another lake is refused, nothing
/// deleted.
#[test]
fn lakes_without_identities_are_adopted_and_foreign_states_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lake_dir = dir.path().join("lake");
    {
        let writer = open_lake(&lake_dir, EngineConfig::default(), OpenMode::Write).unwrap();
        let t = writer
            .engine
            .create_table(
                "s.t",
                Arc::new(Schema::new(vec![
                    Field::new("k", DataType::Int64, false),
                    Field::new("v", DataType::Utf8, true),
                ])),
                vec![0],
            )
            .unwrap();
        writer.engine.apply(vec![Op::Insert { table: t.id, row: vec![Value::Int(1), Value::Null] }]).unwrap();
        checkpoint(&writer);
    }
    // As a lake of before identities: no identity object, no binding.
    std::fs::remove_file(lake_dir.join("_fovea/lake.json")).unwrap();
    let conn = rusqlite::Connection::open(lake_dir.join("_fovea/txn.sqlite")).unwrap();
    conn.execute("DELETE FROM lake", []).unwrap();
    drop(conn);
    let reader = open_lake(&lake_dir, EngineConfig::default(), OpenMode::Read).unwrap();
    assert_eq!(count(&reader), 1);
    assert!(!lake_dir.join("_fovea/lake.json").exists(), "a reader writes no identity");
    drop(reader);
    let writer = open_lake(&lake_dir, EngineConfig::default(), OpenMode::Write).unwrap();
    assert_eq!(count(&writer), 1);
    let id = std::fs::read_to_string(lake_dir.join("_fovea/lake.json")).unwrap();
    drop(writer);

    // The state of another lake beside this lake's objects: refused.
    let other_dir = dir.path().join("other");
    drop(open_lake(&other_dir, EngineConfig::default(), OpenMode::Write).unwrap());
    let data = |d: &std::path::Path| [objects(d, "tables"), objects(d, "_fovea/checkpoints")].concat();
    let objects_before = data(&lake_dir);
    let mixed = LakeBackends {
        store: LakeBackends::local(&lake_dir).unwrap().store,
        ..LakeBackends::local(&other_dir).unwrap()
    };
    let err = open(mixed, EngineConfig::default(), OpenMode::Write, std::time::Duration::from_secs(5))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("belongs to lake"), "{err}");
    assert!(!objects_before.is_empty());
    assert_eq!(data(&lake_dir), objects_before, "nothing touched");

    // A new lake whose first open stopped after writing its id: completed.
    let fresh = dir.path().join("fresh");
    std::fs::create_dir_all(fresh.join("_fovea")).unwrap();
    std::fs::write(fresh.join("_fovea/lake.json"), r#"{"lake_id":"0123","created_us":0}"#).unwrap();
    drop(open_lake(&fresh, EngineConfig::default(), OpenMode::Write).unwrap());
    let conn = rusqlite::Connection::open(fresh.join("_fovea/txn.sqlite")).unwrap();
    let bound: String = conn.query_row("SELECT lake_id FROM lake", [], |r| r.get(0)).unwrap();
    assert_eq!(bound, "0123");
    // The adopted lake still opens with its own state.
    let writer = open_lake(&lake_dir, EngineConfig::default(), OpenMode::Write).unwrap();
    assert_eq!(count(&writer), 1);
    assert_eq!(std::fs::read_to_string(lake_dir.join("_fovea/lake.json")).unwrap(), id);
}

/// A writer restarting while a reader on another host reads an older
/// checkpoint: the restart's recovery deletes none of the objects the
/// reader reads (it used to delete every object the newest checkpoint does
/// not name), and the reader's answers stay whole.
#[test]
fn a_writer_restart_keeps_what_registered_readers_read() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig::default().with_shards(1).with_blocks(100, 2);
    let (writer, _) = two_flushed_blocks(dir.path(), config);
    let blocks = objects(dir.path(), "tables/0/blocks");
    let reader = open_lake(dir.path(), EngineConfig::default(), OpenMode::Read).unwrap();
    assert_eq!(count(&reader), 200);
    // The blocks are combined; the newest checkpoint names the new file only.
    assert_eq!(writer.engine.combine().unwrap(), 1);
    checkpoint(&writer);
    drop(writer);
    // The writer restarts (recovery) while the reader reads.
    let writer = open_lake(dir.path(), config, OpenMode::Write).unwrap();
    assert!(blocks.iter().all(|p| dir.path().join(p).exists()), "recovery deleted what a reader reads: {blocks:?}");
    assert_eq!(count(&reader), 200);
    assert_eq!(count(&writer), 200);
    // Without readers, the next recovery deletes them.
    drop(reader);
    drop(writer);
    let writer = open_lake(dir.path(), config, OpenMode::Write).unwrap();
    assert!(blocks.iter().all(|p| !dir.path().join(p).exists()), "{blocks:?}");
    assert_eq!(count(&writer), 200);
}

/// A rewrite worker that fails every rewrite (as a timed-out Lambda would).
#[derive(Debug)]
struct FailingRewrites;

impl fovea_core::rewrite::RewriteWorker for FailingRewrites {
    fn rewrite(
        &self,
        _: &fovea_core::rewrite::RewriteRequest,
    ) -> std::result::Result<fovea_core::rewrite::RewriteAnswer, fovea_core::scan_worker::SplitFailure> {
        Err(fovea_core::scan_worker::SplitFailure::new(
            fovea_core::scan_worker::SplitFailureKind::Unavailable,
            "timed out",
        ))
    }

    fn kind(&self) -> &'static str {
        "failing"
    }
}

/// The writer of [`two_flushed_blocks`] as its own successor will find
/// it: an engine at lease epoch 1 restored from its last checkpoint (and
/// that checkpoint's manifest), paused while another writer takes over.
fn paused_predecessor(
    dir: &std::path::Path,
    config: EngineConfig,
) -> (Arc<fovea_core::Engine>, fovea_core::checkpoint::Manifest) {
    let (writer, manifest) = two_flushed_blocks(dir, config);
    drop(writer);
    let backends = LakeBackends::local(dir).unwrap();
    let clock = fovea_core::Clock::open(Arc::clone(&backends.txn)).unwrap();
    clock.set_epoch(1);
    let zombie = fovea_core::Engine::restore(Arc::clone(&backends.store), clock, &manifest, false).unwrap();
    zombie.fence_file_ids(1);
    (zombie, manifest)
}

/// A predecessor that does not know yet it was fenced combines the same
/// virtual file its successor combined: its failing round discards only
/// its own output object, never the file the successor swapped in (both
/// used to write, and discard, the file's one path).
#[test]
fn a_fenced_writers_failed_combine_leaves_its_successors_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig::default().with_shards(1).with_blocks(100, 2);
    let (zombie, _) = paused_predecessor(dir.path(), config);
    zombie.set_rewrite_worker(Arc::new(FailingRewrites));
    // The successor takes over and combines the file.
    let successor = open_lake(dir.path(), config, OpenMode::Write).unwrap();
    assert_eq!(successor.engine.combine().unwrap(), 1);
    let files = objects(dir.path(), "tables/0/files");
    assert_eq!(files.len(), 1, "{files:?}");
    // The predecessor wakes and tries the same combine, which fails.
    assert_eq!(zombie.combine().unwrap(), 0);
    assert_eq!(objects(dir.path(), "tables/0/files"), files, "the successor's file was deleted");
    assert_eq!(count(&successor), 200);
}

/// The state restored from a backup older than the lake, its checkpoint's
/// objects still there: the next writer's recovery finds blocks written
/// under the epoch it is granted (a writer the restored state never knew),
/// refuses, and deletes nothing; with the newest state back the lake reads
/// whole.
#[test]
fn a_recovery_with_a_state_older_than_the_lake_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Full files of two blocks: the later writer's rows go to a file of
    // its own, named with its epoch.
    let config = EngineConfig::default().with_shards(1).with_blocks(100, 2);
    let (writer, _) = two_flushed_blocks(dir.path(), config);
    drop(writer);
    let state = dir.path().join("_fovea");
    let copy = |from: &std::path::Path, to: &std::path::Path| {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(to).unwrap() {
            let p = e.unwrap().path();
            if p.to_string_lossy().contains(".sqlite") {
                std::fs::remove_file(p).unwrap();
            }
        }
        for e in std::fs::read_dir(from).unwrap() {
            let p = e.unwrap().path();
            if p.to_string_lossy().contains(".sqlite") {
                std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
            }
        }
    };
    let backup = dir.path().join("backup");
    copy(&state, &backup);
    // A later writer flushes more rows (no checkpoint names them yet).
    let later = open_lake(dir.path(), config, OpenMode::Write).unwrap();
    let t = later.engine.table("s.t").unwrap();
    later
        .engine
        .apply((200..300).map(|k| Op::Insert { table: t.id, row: vec![Value::Int(k), Value::Int(k)] }).collect())
        .unwrap();
    later.engine.flush().unwrap();
    drop(later);
    let newest = dir.path().join("newest");
    copy(&state, &newest);
    let blocks = objects(dir.path(), "tables");
    assert_eq!(blocks.len(), 3, "{blocks:?}");

    copy(&backup, &state);
    let err = open_lake(dir.path(), config, OpenMode::Write).err().expect("a state older than the lake");
    assert!(err.to_string().contains("the state is older than the lake"), "{err}");
    assert_eq!(objects(dir.path(), "tables"), blocks, "the refused recovery deleted objects");

    // The newest state: its recovery deletes the unnamed block as the
    // litter of a run that ended before its checkpoint, and the
    // checkpointed rows read.
    copy(&newest, &state);
    let lake = open_lake(dir.path(), config, OpenMode::Write).unwrap();
    assert_eq!(count(&lake), 200);
    assert_eq!(objects(dir.path(), "tables").len(), 2);
}

/// A predecessor paused between committing a checkpoint and deleting the
/// objects of older ones wakes after its successor checkpointed: its
/// clean-up deletes none of the successor's checkpoint objects (it used to
/// delete every object its own manifest did not name), and the lake
/// reopens whole.
#[test]
fn a_fenced_writers_late_checkpoint_cleanup_keeps_its_successors_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig::default().with_shards(1).with_blocks(100, 2);
    // Paused before its clean-up.
    let (zombie, manifest) = paused_predecessor(dir.path(), config);
    // The successor takes over, writes and checkpoints.
    let successor = open_lake(dir.path(), config, OpenMode::Write).unwrap();
    let t = successor.engine.table("s.t").unwrap();
    successor
        .engine
        .apply((200..300).map(|k| Op::Insert { table: t.id, row: vec![Value::Int(k), Value::Int(k)] }).collect())
        .unwrap();
    let newest = checkpoint(&successor);
    let kept = objects(dir.path(), "_fovea/checkpoints");
    for named in named_by(&newest) {
        assert!(kept.contains(&named), "{named} not in {kept:?}");
    }
    // The predecessor wakes and cleans up after its own checkpoint.
    let refused = zombie.drop_old_checkpoints(&manifest).expect_err("a fenced clean-up");
    assert!(matches!(refused, fovea_core::Error::Fenced { epoch: 1, current: 2 }), "{refused}");
    assert_eq!(objects(dir.path(), "_fovea/checkpoints"), kept, "the predecessor deleted its successor's objects");
    drop(successor);
    drop(zombie);
    let lake = open_lake(dir.path(), config, OpenMode::Read).unwrap();
    assert_eq!(count(&lake), 300);
}
