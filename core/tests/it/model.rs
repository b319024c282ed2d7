//! Model-based test of the whole engine against the naive MVCC oracle:
//! random transactions over two tables and several shards, commits in
//! shuffled order, snapshots taken and dropped, time travel, memory GC,
//! flushes and combines at random points, transactions applied in chunks
//! at one ts that create tables between chunks (as the sink does with big
//! transactions), and restarts from checkpoints with transactions (and the
//! tables they create) in flight, and batches applied as production applies
//! them (the sink's `ShardPool`: chunks routed to shard workers, group
//! commit, commits completed by whichever worker is last) while reader
//! threads scan, and transactions fed to the `Sink` as change records
//! (BEGIN, row images, END), as an input hands them over. After every step, the scan of every table at every live
//! snapshot equals the oracle at that snapshot; the readers check every
//! snapshot they take while the batch is applied.

use std::sync::Arc;

use fovea_core::Clock;
use fovea_core::catalog::Catalog;
use fovea_core::catalog::sqlite::SqliteCatalog;
use fovea_core::cdc::{ChangeRecord, RowChange, RowOp, SourcePosition};
use fovea_core::mvcc::{MemoryTxnStore, TxnStore};
use fovea_core::reader::CheckpointReader;
use fovea_core::scan::{CmpOp, Predicate};
use fovea_core::sink::{Sink, SinkConfig};
use fovea_core::split::SplitTask;
use fovea_core::workers::ShardPool;
use fovea_core::{Engine, EngineConfig, Error, Op, ScanOptions, Snapshot, SnapshotTables, TableId, Ts, Value};
use object_store::ObjectStore;
use object_store::memory::InMemory;
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng, rngs::SmallRng};

use crate::oracle::{
    ACCOUNTS, ITEMS, Oracle, canonical, create_tables, extra_table, key, row, scan_rows, scan_rows_on,
};

#[derive(Clone, Debug)]
enum RawOp {
    Insert { t: usize, k: i64, p: i64 },
    Update { t: usize, k: i64, new_k: Option<i64>, p: i64 },
    Delete { t: usize, k: i64 },
}

#[derive(Clone, Debug)]
enum Step {
    /// Begin every transaction, apply them in ts order, commit in shuffled order.
    Txns(Vec<Vec<RawOp>>, u64),
    Snapshot,
    DropSnapshot(usize),
    SnapshotAt(u64),
    Gc,
    Flush,
    Combine,
    /// Flush, combine, then storage GC at this stale-fraction threshold.
    StorageGc(f64),
    /// One transaction applied in chunks at one ts: a table is created after
    /// the first chunk, later chunks write to it too, then it commits.
    /// Chunks hold upserts `(table selector, key, payload)`.
    Chunked(Vec<Vec<(usize, i64, i64)>>),
    /// Valid transactions applied through a `ShardPool` (each split into
    /// two chunks), gathered jobs handed over every `group` transactions,
    /// while two reader threads take snapshots and check them.
    Pooled(Vec<Vec<RawOp>>, usize),
    /// Valid transactions fed to a `Sink` as BEGIN / row images / END
    /// records (its shard pool, group commit and chunking apply them),
    /// the gathered group handed over every `group` transactions, while
    /// two reader threads take snapshots and check them; with `group` 1
    /// the sink is also drained and checked after every record.
    Sink(Vec<Vec<RawOp>>, usize),
    /// Checkpoint (optionally with a transaction applied but not committed,
    /// which may have created a table), drop the engine as a crash would,
    /// restore from the checkpoint.
    Restart(Option<Vec<RawOp>>, bool),
    /// An incremental checkpoint, committed, with a transaction applied
    /// but not committed while it is written (committed after): the engine
    /// goes on, and a later `Restart` recovers through the chain.
    Checkpoint(Vec<RawOp>),
}

fn raw_op() -> impl Strategy<Value = RawOp> {
    // `t` picks a table modulo the tables there are when it is applied.
    let k = 0i64..12;
    prop_oneof![
        4 => (0usize..4, k.clone(), 0i64..1000).prop_map(|(t, k, p)| RawOp::Insert { t, k, p }),
        4 => (0usize..4, k.clone(), proptest::option::weighted(0.2, 0i64..12), 0i64..1000)
            .prop_map(|(t, k, new_k, p)| RawOp::Update { t, k, new_k, p }),
        2 => (0usize..4, k).prop_map(|(t, k)| RawOp::Delete { t, k }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (proptest::collection::vec(proptest::collection::vec(raw_op(), 1..5), 1..4), any::<u64>())
            .prop_map(|(t, s)| Step::Txns(t, s)),
        2 => Just(Step::Snapshot),
        1 => (0usize..8).prop_map(Step::DropSnapshot),
        1 => (0u64..6).prop_map(Step::SnapshotAt),
        1 => Just(Step::Gc),
        1 => Just(Step::Flush),
        1 => Just(Step::Combine),
        1 => prop_oneof![Just(0.0), Just(0.3), Just(0.6)].prop_map(Step::StorageGc),
        1 => (proptest::option::of(proptest::collection::vec(raw_op(), 1..4)), any::<bool>())
            .prop_map(|(ops, create)| Step::Restart(ops, create)),
        2 => proptest::collection::vec(raw_op(), 1..4).prop_map(Step::Checkpoint),
        1 => proptest::collection::vec(proptest::collection::vec((0usize..4, 0i64..12, 0i64..1000), 1..4), 2..4)
            .prop_map(Step::Chunked),
        1 => (proptest::collection::vec(proptest::collection::vec(raw_op(), 1..6), 1..12), 1usize..6)
            .prop_map(|(t, g)| Step::Pooled(t, g)),
        1 => (proptest::collection::vec(proptest::collection::vec(raw_op(), 1..6), 1..12), 1usize..6)
            .prop_map(|(t, g)| Step::Sink(t, g)),
    ]
}

/// `op` on one of `tables` tables.
fn to_op(op: &RawOp, tables: usize) -> Op {
    match *op {
        RawOp::Insert { t, k, p } => {
            let t = t % tables;
            Op::Insert { table: TableId(t as u32), row: row(t, k, p) }
        }
        RawOp::Update { t, k, new_k, p } => {
            let t = t % tables;
            Op::Update { table: TableId(t as u32), key: key(t, k), row: row(t, new_k.unwrap_or(k), p) }
        }
        RawOp::Delete { t, k } => {
            let t = t % tables;
            Op::Delete { table: TableId(t as u32), key: key(t, k) }
        }
    }
}

/// Columns of `values` in `table`'s order, as an input's JSON image (PostgreSQL
/// text for every non-NULL value).
fn image(def: &fovea_core::schema::TableDef, values: &[Value]) -> Vec<(String, serde_json::Value)> {
    def.schema
        .fields()
        .iter()
        .zip(values)
        .map(|(f, v)| {
            let json = fovea_core::cdc::types::format_value(v, f.data_type())
                .map_or(serde_json::Value::Null, serde_json::Value::String);
            (f.name().clone(), json)
        })
        .collect()
}

/// The change record an input would carry for `op`.
fn record(engine: &Engine, op: &Op, txid: &str) -> ChangeRecord {
    let tables = engine.tables();
    let def = |t: TableId| tables.iter().find(|d| d.id == t).unwrap_or_else(|| panic!("no table {t:?}"));
    let key_image = |t: TableId, key: &[Value]| {
        let d = def(t);
        let names: Vec<_> = d.primary_key.iter().map(|&i| d.schema.field(i).name().clone()).collect();
        let mut full = vec![Value::Null; d.schema.fields().len()];
        for (&i, v) in d.primary_key.iter().zip(key) {
            full[i] = v.clone();
        }
        image(d, &full).into_iter().filter(|(n, _)| names.contains(n)).collect::<Vec<_>>()
    };
    let (table, op, key, after) = match op {
        Op::Insert { table, row } => (*table, RowOp::Insert, None, Some(image(def(*table), row))),
        Op::Update { table, key, row } => {
            (*table, RowOp::Update, Some(key_image(*table, key)), Some(image(def(*table), row)))
        }
        Op::Delete { table, key } => (*table, RowOp::Delete, Some(key_image(*table, key)), None),
        Op::Upsert { .. } => unreachable!("to_op makes no upserts"),
    };
    ChangeRecord::Row(RowChange {
        table: def(table).name.as_str().into(),
        op,
        before: key.clone(),
        key,
        after,
        txid: Some(txid.into()),
        commit_us: None,
        snapshot: None,
        declared: None,
        key_names: None,
        in_transaction_block: true,
        omits_nulls: false,
        typed: None,
    })
}

/// Tables at most (two of the oracle's, and ones created by transactions).
const MAX_TABLES: usize = 3;

/// Name of the `n`-th table (the first two are the oracle's own).
fn table_name(n: usize) -> String {
    match n {
        0 => ACCOUNTS.to_owned(),
        1 => ITEMS.to_owned(),
        n => format!("s.extra{n}"),
    }
}

fn check(engine: &Arc<Engine>, oracle: &Oracle, snapshot: &Snapshot) -> Result<(), TestCaseError> {
    check_on(&engine.at(snapshot.clone()), oracle)
}

/// Every table of `tables` against the oracle at its qts.
fn check_on(tables: &dyn SnapshotTables, oracle: &Oracle) -> Result<(), TestCaseError> {
    let qts = tables.qts().get();
    let names: Vec<String> = tables.tables().iter().map(|t| t.name.clone()).collect();
    let existing: Vec<String> = (0..oracle.tables.len()).filter(|&t| oracle.exists(t, qts)).map(table_name).collect();
    prop_assert_eq!(&names, &existing, "tables at qts {}", qts);
    for t in 0..oracle.tables.len() {
        let name = table_name(t);
        if !oracle.exists(t, qts) {
            // Created by a transaction after the snapshot: unknown there.
            prop_assert!(
                matches!(tables.scan(&name, ScanOptions::default()), Err(fovea_core::Error::UnknownTable(_))),
                "table {} planned at qts {} before its creation",
                name,
                qts
            );
            continue;
        }
        let got = scan_rows_on(tables.scan(&name, ScanOptions::default()).expect("plan"));
        prop_assert_eq!(got, oracle.visible(t, qts), "table {} at qts {}", name, qts);
        // Row groups (of up to 16 rows here) decoded and filtered three
        // rows at a time: the same rows.
        let small = ScanOptions { batch_rows: Some(3), ..ScanOptions::default() };
        let got = scan_rows_on(tables.scan(&name, small).expect("plan"));
        prop_assert_eq!(got, oracle.visible(t, qts), "table {} at qts {} in batches of 3 rows", name, qts);
    }
    // Projection in a new order plus a pushed-down filter.
    let options = ScanOptions {
        projection: Some(vec![2, 0]),
        filter: Some(Predicate::Compare { column: 0, op: CmpOp::GtEq, value: Value::Int(5) }),
        ..ScanOptions::default()
    };
    let scan = tables.scan(ACCOUNTS, options).expect("plan");
    // The same scan as tasks a stateless worker runs (through JSON).
    let mut by_tasks = Vec::new();
    for task in scan.tasks().expect("tasks") {
        let json = serde_json::to_string(&task).expect("to json");
        let task: SplitTask = serde_json::from_str(&json).expect("from json");
        by_tasks.extend(scan_rows_on(task.scan(scan.lake()).expect("task")));
    }
    canonical(&mut by_tasks);
    let got = scan_rows_on(scan);
    let mut expect: Vec<_> = oracle
        .visible(0, qts)
        .into_iter()
        .filter(|r| matches!(r[0], Value::Int(i) if i >= 5))
        .map(|r| vec![r[2].clone(), r[0].clone()])
        .collect();
    canonical(&mut expect);
    prop_assert_eq!(&by_tasks, &expect, "filtered scan as tasks at qts {}", qts);
    prop_assert_eq!(got, expect, "filtered scan at qts {}", qts);
    Ok(())
}

/// Runs `apply` (a batch of valid transactions; `what` applies them) while
/// two reader threads take snapshots and check each against `oracle`; fails
/// with the first reader's or `apply`'s error.
fn with_readers(
    engine: &Arc<Engine>,
    oracle: &Oracle,
    what: &str,
    apply: impl FnOnce() -> Result<(), String>,
) -> Result<(), TestCaseError> {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| -> Result<(), TestCaseError> {
                    // Acquire: pairs with the Release below.
                    while !done.load(std::sync::atomic::Ordering::Acquire) {
                        check(engine, oracle, &engine.snapshot())?;
                    }
                    Ok(())
                })
            })
            .collect();
        let applied = apply();
        // Release: the readers stop after their current check.
        done.store(true, std::sync::atomic::Ordering::Release);
        for r in readers {
            r.join().map_err(|_| TestCaseError::fail("a reader panicked"))??;
        }
        applied.map_err(|e| TestCaseError::fail(format!("{what} failed a valid transaction: {e}")))
    })
}

fn run(shards: usize, block_rows: usize, blocks_per_file: usize, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let txn: Arc<dyn TxnStore> = Arc::new(MemoryTxnStore::default());
    let mut engine = Engine::open(
        Arc::clone(&store),
        Clock::open_with_reservation(Arc::clone(&txn), 16).unwrap(),
        EngineConfig::default().with_shards(shards).with_blocks(block_rows, blocks_per_file),
    )
    .unwrap();
    let mut oracle = create_tables(&engine);
    let mut live: Vec<Snapshot> = Vec::new();
    // The sink's catalog (history, applied identities), made on first use.
    let catalog_dir = tempfile::tempdir().unwrap();
    let mut catalog: Option<Arc<dyn Catalog>> = None;
    let mut sink_txns = 0u64;
    for step in steps {
        match step {
            Step::Txns(txns, seed) => {
                let mut begun = Vec::new();
                for txn in &txns {
                    let ops: Vec<Op> = txn.iter().map(|op| to_op(op, oracle.tables.len())).collect();
                    let ts = engine.begin().unwrap();
                    let valid = oracle.apply(ts.get(), &ops);
                    match engine.apply_at(ts, ops) {
                        Ok(()) => {
                            prop_assert!(valid, "engine accepted an invalid transaction {:?}", txn)
                        }
                        Err(e) => {
                            prop_assert!(!valid, "engine rejected a valid transaction {:?}: {}", txn, e);
                            prop_assert!(matches!(e, Error::KeyConflict { .. }), "{}", e);
                        }
                    }
                    begun.push(ts);
                }
                begun.shuffle(&mut SmallRng::seed_from_u64(seed));
                for ts in begun {
                    engine.commit(ts).unwrap();
                    check(&engine, &oracle, &engine.snapshot())?;
                }
            }
            Step::Pooled(txns, group) => {
                // The oracle first (every ts is known in advance); a
                // transaction the oracle refuses ends empty instead (a
                // failed one stops a pool for good, as it stops the sink).
                let mut valid = Vec::new();
                for txn in &txns {
                    let ops: Vec<Op> = txn.iter().map(|op| to_op(op, oracle.tables.len())).collect();
                    let ts = engine.begin().unwrap();
                    if oracle.apply(ts.get(), &ops) {
                        valid.push((ts, ops));
                    } else {
                        engine.abort(ts).unwrap();
                    }
                }
                with_readers(&engine, &oracle, "the pool", || {
                    let pool = ShardPool::start(Arc::clone(&engine)).map_err(|e| e.to_string())?;
                    for (i, (ts, ops)) in valid.into_iter().enumerate() {
                        let half = ops.len() / 2;
                        let (first, second) = (ops[..half].to_vec(), ops[half..].to_vec());
                        for chunk in [first, second].into_iter().filter(|c| !c.is_empty()) {
                            pool.submit(ts, chunk).map_err(|e| e.to_string())?;
                        }
                        pool.commit(ts).map_err(|e| e.to_string())?;
                        if (i + 1) % group == 0 {
                            pool.flush();
                        }
                    }
                    pool.drain().map_err(|e| format!("ts {}: {}", e.ts, e.error))
                })?;
            }
            Step::Sink(txns, group) => {
                // The sink begins one ts per transaction, in order, from the
                // clock's next one (every earlier ts has ended): the oracle
                // applies them first; a transaction it refuses is left out
                // (a failed one stops a sink for good).
                let first = engine.clock().hwm().get();
                let mut records = Vec::new();
                for txn in &txns {
                    let ops: Vec<Op> = txn.iter().map(|op| to_op(op, oracle.tables.len())).collect();
                    let ts = first + records.len() as u64;
                    if oracle.apply(ts, &ops) {
                        sink_txns += 1;
                        let txid = format!("model-{sink_txns}");
                        let mut rs = vec![ChangeRecord::Begin { txid: txid.clone(), commit_us: None }];
                        rs.extend(ops.iter().map(|op| record(&engine, op, &txid)));
                        rs.push(ChangeRecord::End {
                            txid,
                            event_count: Some(ops.len() as u64),
                            per_table: Vec::new(),
                            commit_us: None,
                        });
                        records.push(rs);
                    }
                }
                let expected = first + records.len() as u64;
                let catalog = Arc::clone(catalog.get_or_insert_with(|| {
                    let dir = catalog_dir.path();
                    Arc::new(SqliteCatalog::open(&dir.join("catalog.db"), &dir.join("txn.db")).unwrap())
                        as Arc<dyn Catalog>
                }));
                with_readers(&engine, &oracle, "the sink", || {
                    let config = SinkConfig {
                        checkpoint_txns: u64::MAX,
                        checkpoint_interval: std::time::Duration::MAX,
                        chunk_rows: 2,
                        ..SinkConfig::default()
                    };
                    let mut sink =
                        Sink::new(Arc::clone(&engine), catalog, "model", config).map_err(|e| e.to_string())?;
                    let mut at = SourcePosition::default();
                    for (i, rs) in records.into_iter().enumerate() {
                        for r in rs {
                            at.line += 1;
                            at.offset += 1;
                            sink.push(r, at, at).map_err(|e| e.to_string())?;
                            if group == 1 {
                                // Deterministically too: whatever the sink
                                // applied of an unfinished transaction
                                // stays invisible.
                                sink.sync().map_err(|e| e.to_string())?;
                                check(&engine, &oracle, &engine.snapshot()).map_err(|e| e.to_string())?;
                            }
                        }
                        if (i + 1) % group == 0 {
                            sink.flush_group();
                        }
                    }
                    sink.sync().map_err(|e| e.to_string())
                })?;
                prop_assert_eq!(engine.clock().hwm().get(), expected, "the sink began one ts per transaction");
            }
            Step::Snapshot => live.push(engine.snapshot()),
            Step::DropSnapshot(i) => {
                if !live.is_empty() {
                    live.remove(i % live.len());
                }
            }
            Step::SnapshotAt(back) => {
                let ts = Ts(engine.clock().latest().get().saturating_sub(back));
                match engine.snapshot_at(ts) {
                    Ok(s) => live.push(s),
                    Err(e) => {
                        prop_assert!(ts < engine.clock().lwm(), "{}", e);
                        prop_assert!(matches!(e, Error::SnapshotUnavailable { .. }), "{}", e);
                    }
                }
            }
            Step::Gc => {
                let report = engine.gc().unwrap();
                prop_assert!(live.iter().all(|s| s.qts() >= report.lwm), "GC passed a live snapshot");
            }
            Step::Flush => engine.flush().unwrap(),
            Step::Chunked(chunks) => {
                let ts = engine.begin().unwrap();
                let mut ops_all = Vec::new();
                for (i, chunk) in chunks.iter().enumerate() {
                    // A table created between chunks (a few at most: every
                    // check scans every table).
                    if i == 1 && oracle.tables.len() < MAX_TABLES {
                        extra_table(&engine, &table_name(oracle.tables.len()), ts).unwrap();
                        oracle.add_table(vec![0], ts.get());
                    }
                    let n = oracle.tables.len();
                    let ops: Vec<Op> = chunk
                        .iter()
                        .map(|&(t, k, p)| Op::Upsert { table: TableId((t % n) as u32), row: row(t % n, k, p) })
                        .collect();
                    engine.apply_at(ts, ops.clone()).unwrap();
                    ops_all.extend(ops);
                }
                // Nothing of it is visible before its commit.
                check(&engine, &oracle, &engine.snapshot())?;
                prop_assert!(oracle.apply(ts.get(), &ops_all));
                engine.commit(ts).unwrap();
            }
            Step::Restart(in_flight, create) => {
                if let Some(ops) = in_flight {
                    // Applied, never committed: must not survive, nor the
                    // table it created.
                    let ts = engine.begin().unwrap();
                    let _ = engine.apply_at(ts, ops.iter().map(|op| to_op(op, oracle.tables.len())).collect());
                    if create && oracle.tables.len() < MAX_TABLES {
                        let t = extra_table(&engine, &table_name(oracle.tables.len()), ts).unwrap();
                        let _ = engine.apply_at(ts, vec![Op::Upsert { table: t.id, row: row(2, 1, 1) }]);
                    }
                }
                let manifest = engine.write_checkpoint().unwrap();
                prop_assert_eq!(manifest.checkpoint_ts, engine.clock().latest().get());
                // A reader of the checkpoint alone (no engine) sees the
                // oracle at its timestamp.
                let reader = CheckpointReader::open(Arc::clone(&store), &manifest, Arc::new(())).unwrap();
                check_on(&reader, &oracle)?;
                live.clear();
                drop(engine);
                engine = Engine::restore(
                    Arc::clone(&store),
                    Clock::open_with_reservation(Arc::clone(&txn), 16).unwrap(),
                    &manifest,
                    true,
                )
                .unwrap();
            }
            Step::Checkpoint(in_flight) => {
                checkpoint_in_flight(&engine, &store, &mut oracle, &in_flight)?;
            }
            Step::Combine => {
                engine.flush().unwrap();
                engine.combine().unwrap();
            }
            Step::StorageGc(threshold) => {
                engine.flush().unwrap();
                engine.combine().unwrap();
                let report = engine.storage_gc(threshold).unwrap();
                prop_assert!(live.iter().all(|s| s.qts() >= report.gts), "storage GC below a live snapshot");
                // Memory GC right after: it folds what the rewrite carried.
                engine.gc().unwrap();
            }
        }
        for s in &live {
            check(&engine, &oracle, s)?;
        }
        check(&engine, &oracle, &engine.snapshot())?;
    }
    // Everything stays correct once all blocks are in regular files, and
    // once every file with a deleted row is rewritten without it.
    engine.flush().unwrap();
    engine.combine().unwrap();
    engine.gc().unwrap();
    for s in &live {
        check(&engine, &oracle, s)?;
    }
    check(&engine, &oracle, &engine.snapshot())?;
    engine.storage_gc(0.0).unwrap();
    for s in &live {
        check(&engine, &oracle, s)?;
    }
    check(&engine, &oracle, &engine.snapshot())?;
    // And a checkpoint of the rewritten files restores to the same state.
    let manifest = engine.write_checkpoint().unwrap();
    drop(live);
    drop(engine);
    let engine = Engine::restore(
        Arc::clone(&store),
        Clock::open_with_reservation(Arc::clone(&txn), 16).unwrap(),
        &manifest,
        true,
    )
    .unwrap();
    check(&engine, &oracle, &engine.snapshot())
}

/// Captures a checkpoint while `in_flight` is applied and not committed,
/// writes it with the transaction still open, checks a reader of it alone
/// against the oracle, commits it to the engine, then commits the
/// transaction. Returns the manifest.
fn checkpoint_in_flight(
    engine: &Arc<Engine>,
    store: &Arc<dyn ObjectStore>,
    oracle: &mut Oracle,
    in_flight: &[RawOp],
) -> Result<fovea_core::checkpoint::Manifest, TestCaseError> {
    let ts = engine.begin().unwrap();
    let ops: Vec<Op> = in_flight.iter().map(|op| to_op(op, oracle.tables.len())).collect();
    let valid = oracle.apply(ts.get(), &ops);
    let applied = engine.apply_at(ts, ops).is_ok();
    prop_assert_eq!(applied, valid, "engine and oracle disagree on {:?}", in_flight);
    let mut pending = engine.capture_checkpoint().unwrap();
    prop_assert_eq!(pending.ts().get() + 1, ts.get());
    let manifest = pending.write().unwrap();
    let reader = CheckpointReader::open(Arc::clone(store), &manifest, Arc::new(())).unwrap();
    check_on(&reader, oracle)?;
    engine.checkpoint_committed(&manifest);
    drop(pending);
    if valid {
        engine.commit(ts).unwrap();
    } else {
        engine.abort(ts).unwrap();
    }
    Ok(manifest)
}

/// Recovery through a chain of incremental checkpoints: seven checkpoints,
/// each with a transaction in flight (committed after it), build a base
/// and six deltas; a restore from the last one, and from one that follows
/// a merge, equals the oracle.
#[test]
fn recovers_through_a_chain_of_incremental_checkpoints() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let txn: Arc<dyn TxnStore> = Arc::new(MemoryTxnStore::default());
    let open = || Clock::open_with_reservation(Arc::clone(&txn), 16).unwrap();
    let config = EngineConfig::default().with_shards(2).with_blocks(3, 2);
    let mut engine = Engine::open(Arc::clone(&store), open(), config).unwrap();
    let mut oracle = create_tables(&engine);
    let mut rng = SmallRng::seed_from_u64(15);
    let mut random_ops = |n: usize| -> Vec<RawOp> {
        (0..n)
            .map(|_| {
                let (t, k, p) = (rng.random_range(0..4), rng.random_range(0..12), rng.random_range(0..1000));
                match rng.random_range(0..3) {
                    0 => RawOp::Insert { t, k, p },
                    1 => RawOp::Update { t, k, new_k: None, p },
                    _ => RawOp::Delete { t, k },
                }
            })
            .collect()
    };
    for round in 0..2 {
        for i in 0..7 {
            for _ in 0..6 {
                let ts = engine.begin().unwrap();
                let ops: Vec<Op> = random_ops(3).iter().map(|op| to_op(op, oracle.tables.len())).collect();
                if oracle.apply(ts.get(), &ops) {
                    engine.apply_at(ts, ops).unwrap();
                    engine.commit(ts).unwrap();
                } else {
                    engine.abort(ts).unwrap();
                }
            }
            // An in-flight transaction of inserts only is always valid.
            let mut in_flight = random_ops(3);
            for op in &mut in_flight {
                if let RawOp::Update { t, k, .. } | RawOp::Delete { t, k } = *op {
                    *op = RawOp::Insert { t, k: k + 100, p: 1 };
                }
            }
            let manifest = checkpoint_in_flight(&engine, &store, &mut oracle, &in_flight).unwrap();
            let deltas: Vec<usize> = manifest.shards.iter().map(|s| s.index_deltas.len()).collect();
            if round == 0 {
                assert!(deltas.iter().all(|&d| d == i), "checkpoint {i}: deltas {deltas:?}");
            }
            engine.gc().unwrap();
            if i % 3 == 2 {
                engine.flush().unwrap();
                engine.combine().unwrap();
                engine.storage_gc(0.0).unwrap();
            }
        }
        // A crash: the newest checkpoint is the one restored.
        let manifest = engine.write_checkpoint().unwrap();
        drop(engine);
        engine = Engine::restore(Arc::clone(&store), open(), &manifest, true).unwrap();
        check(&engine, &oracle, &engine.snapshot()).unwrap();
    }
}

/// An in-memory object store and timestamp store, and a one-shard engine
/// on them (blocks of `block_rows` rows, `blocks_per_file` to a file)
/// with the oracle's tables created.
fn one_shard_engine(
    block_rows: usize,
    blocks_per_file: usize,
) -> (Arc<dyn ObjectStore>, Arc<dyn TxnStore>, Arc<Engine>, Oracle) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let txn: Arc<dyn TxnStore> = Arc::new(MemoryTxnStore::default());
    let clock = Clock::open_with_reservation(Arc::clone(&txn), 16).unwrap();
    let config = EngineConfig::default().with_shards(1).with_blocks(block_rows, blocks_per_file);
    let engine = Engine::open(Arc::clone(&store), clock, config).unwrap();
    let oracle = create_tables(&engine);
    (store, txn, engine, oracle)
}

/// Commits `raw` as one transaction on the engine and the oracle.
fn commit(engine: &Arc<Engine>, oracle: &mut Oracle, raw: Vec<RawOp>) {
    let ts = engine.begin().unwrap();
    let ops: Vec<Op> = raw.iter().map(|op| to_op(op, oracle.tables.len())).collect();
    assert!(oracle.apply(ts.get(), &ops), "{raw:?}");
    engine.apply_at(ts, ops).unwrap();
    engine.commit(ts).unwrap();
}

/// Checkpoints at the ts of the committed one, after storage GC moved rows
/// (new row ids) without a commit in between, as an idle replayer's
/// maintenance and its checkpoint at a stop do: the index the checkpoint
/// names points at the moved rows, and the next checkpoint extends its
/// chain. Before, the committed index objects were reused as they were
/// (the moved keys read row ids without a location after recovery: "row1
/// has no location" on the next update), and a checkpoint at the same ts
/// did not become the one the next extends.
#[test]
fn checkpoints_after_storage_gc_without_a_commit_keep_moved_rows() {
    let (store, txn, mut engine, mut oracle) = one_shard_engine(3, 1);
    let open = || Clock::open_with_reservation(Arc::clone(&txn), 16).unwrap();
    commit(&engine, &mut oracle, (0..9).map(|k| RawOp::Insert { t: 0, k, p: k }).collect());
    commit(&engine, &mut oracle, (0..9).step_by(2).map(|k| RawOp::Update { t: 0, k, new_k: None, p: 7 }).collect());
    let first = engine.write_checkpoint().unwrap();
    engine.checkpoint_committed(&first);
    for round in 0..2 {
        engine.flush().unwrap();
        engine.combine().unwrap();
        engine.gc().unwrap();
        let report = engine.storage_gc(0.0).unwrap();
        assert!(round > 0 || report.files_rewritten > 0, "{report:?}");
        let again = engine.write_checkpoint().unwrap();
        assert_eq!(again.checkpoint_ts, first.checkpoint_ts, "no commit since");
        engine.checkpoint_committed(&again);
    }
    // A commit, and a checkpoint extending the chain of the last one.
    commit(&engine, &mut oracle, vec![RawOp::Insert { t: 1, k: 1, p: 1 }]);
    let manifest = engine.write_checkpoint().unwrap();
    drop(engine);
    engine = Engine::restore(Arc::clone(&store), open(), &manifest, true).unwrap();
    check(&engine, &oracle, &engine.snapshot()).unwrap();
    // Every key updated and deleted through the recovered index.
    commit(&engine, &mut oracle, (0..9).map(|k| RawOp::Update { t: 0, k, new_k: None, p: 100 + k }).collect());
    commit(&engine, &mut oracle, (0..9).map(|k| RawOp::Delete { t: 0, k }).collect());
    check(&engine, &oracle, &engine.snapshot()).unwrap();
}

/// A checkpoint at the committed one's ts that is written but never
/// committed (its commit failed, or a fenced replayer's) frees nothing the
/// committed one names: blocks a combine retired since stay until a
/// checkpoint without them is committed. Before, same ts counted as
/// committed, and GC deleted them.
#[test]
fn an_uncommitted_checkpoint_at_the_committed_ts_frees_nothing() {
    let (store, txn, engine, mut oracle) = one_shard_engine(3, 2);
    let open = || Clock::open_with_reservation(Arc::clone(&txn), 16).unwrap();
    commit(&engine, &mut oracle, (0..12).map(|k| RawOp::Insert { t: 0, k, p: k }).collect());
    let committed = engine.write_checkpoint().unwrap();
    engine.checkpoint_committed(&committed);
    engine.flush().unwrap();
    assert!(engine.combine().unwrap() > 0);
    let uncommitted = engine.write_checkpoint().unwrap();
    assert_eq!(uncommitted.checkpoint_ts, committed.checkpoint_ts);
    engine.gc().unwrap();
    drop(engine);
    let engine = Engine::restore(Arc::clone(&store), open(), &committed, false).unwrap();
    check(&engine, &oracle, &engine.snapshot()).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig {
        // 64 cases in the test suite's debug build (about a second each);
        // `scripts/model-test.sh` runs 2,000 in an optimised build in CI
        // (PROPTEST_CASES sets the count).
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64),
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn engine_matches_mvcc_oracle(
        shards in 1usize..4,
        block_rows in prop_oneof![Just(1usize), Just(3), Just(16)],
        blocks_per_file in 1usize..4,
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        run(shards, block_rows, blocks_per_file, steps)?;
    }
}

/// Rows spanning several 4096-row tiles, deleted across tile borders, with
/// unaligned blocks: the bitmap shifting path.
#[test]
fn large_unaligned_blocks_match_oracle() {
    let engine = Engine::in_memory(EngineConfig::default().with_shards(2).with_blocks(5000, 2)).unwrap();
    let mut oracle = create_tables(&engine);
    let mut ts_list = Vec::new();
    for chunk in (0..30_000i64).collect::<Vec<_>>().chunks(3000) {
        let ops: Vec<Op> = chunk.iter().map(|&k| Op::Insert { table: TableId(0), row: row(0, k, k) }).collect();
        let ts = engine.apply(ops.clone()).unwrap();
        assert!(oracle.apply(ts.get(), &ops));
        ts_list.push(ts);
    }
    let before = engine.snapshot();
    let ops: Vec<Op> = (0..30_000i64).step_by(7).map(|k| Op::Delete { table: TableId(0), key: key(0, k) }).collect();
    let ts = engine.apply(ops.clone()).unwrap();
    assert!(oracle.apply(ts.get(), &ops));
    engine.flush().unwrap();
    assert!(engine.combine().unwrap() > 0);
    engine.gc().unwrap();
    for s in [&before, &engine.snapshot()] {
        assert_eq!(scan_rows(&engine, s, ACCOUNTS, ScanOptions::default()), oracle.visible(0, s.qts().get()));
    }
}
