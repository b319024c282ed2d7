//! One writer replaying a deterministic bank workload, several readers
//! taking snapshots and scanning, and a GC thread folding, flushing,
//! combining and rewriting stale files (storage GC): every scan equals the oracle at its qts, and every total is
//! the invariant.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use fovea_core::{Engine, EngineConfig, Op, ScanOptions, TableId, Value};
use rand::{Rng, SeedableRng, rngs::SmallRng};

use crate::oracle::{ACCOUNTS, ITEMS, Oracle, create_tables, scan_rows};

const ACCOUNTS_N: i64 = 150;
const TXNS: usize = 1500;

/// Accounts table: balance moves between accounts (the total is constant);
/// items table: rows deleted and re-inserted with new keys.
fn workload(seed: u64) -> Vec<Vec<Op>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut balance = vec![1000i64; ACCOUNTS_N as usize];
    let mut txns = vec![
        (0..ACCOUNTS_N)
            .map(|k| Op::Insert { table: TableId(0), row: account(k, 1000) })
            .chain((0..30).map(|k| Op::Insert { table: TableId(1), row: item(k, 0) }))
            .collect(),
    ];
    let mut item_keys: Vec<i64> = (0..30).collect();
    let mut next_item = 30;
    for i in 0..TXNS {
        let (a, b) = (rng.random_range(0..ACCOUNTS_N), rng.random_range(0..ACCOUNTS_N));
        let x = rng.random_range(1..50);
        let mut ops = Vec::new();
        if a != b {
            balance[a as usize] -= x;
            balance[b as usize] += x;
            for k in [a, b] {
                ops.push(Op::Update {
                    table: TableId(0),
                    key: vec![Value::Int(k)],
                    row: account(k, balance[k as usize]),
                });
            }
        }
        if i % 3 == 0 {
            // Re-key an item (delete + insert, possibly on another shard).
            let pos = rng.random_range(0..item_keys.len());
            let old = item_keys[pos];
            ops.push(Op::Update { table: TableId(1), key: item_key(old), row: item(next_item, i as i64) });
            item_keys[pos] = next_item;
            next_item += 1;
        }
        if !ops.is_empty() {
            txns.push(ops);
        }
    }
    txns
}

fn account(k: i64, balance: i64) -> Vec<Value> {
    vec![Value::Int(k), Value::Utf8(format!("acct{k}")), Value::Decimal(i128::from(balance) * 100)]
}

fn item_key(k: i64) -> Vec<Value> {
    vec![Value::Int(k % 3), Value::Utf8(format!("c{k}"))]
}

fn item(k: i64, qty: i64) -> Vec<Value> {
    let mut r = item_key(k);
    r.extend([Value::Int(qty), Value::Bool(k % 2 == 0)]);
    r
}

#[test]
fn readers_and_gc_see_exact_snapshots_while_replay_runs() {
    let engine = Engine::in_memory(EngineConfig::default().with_shards(3).with_blocks(64, 3)).unwrap();
    let mut oracle = create_tables(&engine);
    let txns = workload(7);
    // Timestamps are handed out in order from 1 on a fresh engine.
    for (i, ops) in txns.iter().enumerate() {
        assert!(oracle.apply(i as u64 + 1, ops));
    }
    let oracle = Arc::new(oracle);
    let done = Arc::new(AtomicBool::new(false));
    let scans = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(5));
    std::thread::scope(|s| {
        {
            let (engine, done, start) = (&engine, &done, &start);
            let txns = &txns;
            s.spawn(move || {
                start.wait();
                for (i, ops) in txns.iter().enumerate() {
                    let ts = engine.apply(ops.clone()).unwrap();
                    assert_eq!(ts.get(), i as u64 + 1);
                }
                done.store(true, Ordering::Release);
            });
        }
        for r in 0..3 {
            let (engine, done, oracle, scans, start) = (&engine, &done, &oracle, &scans, &start);
            s.spawn(move || {
                start.wait();
                let mut rng = SmallRng::seed_from_u64(r);
                loop {
                    let finished = done.load(Ordering::Acquire);
                    let snap = engine.snapshot();
                    let qts = snap.qts().get();
                    let accounts = scan_rows(engine, &snap, ACCOUNTS, ScanOptions::default());
                    if qts > 0 {
                        let total: i128 = accounts
                            .iter()
                            .map(|r| match r[2] {
                                Value::Decimal(d) => d,
                                _ => 0,
                            })
                            .sum();
                        assert_eq!(total, i128::from(ACCOUNTS_N) * 1000 * 100, "total at qts {qts}");
                    }
                    assert_eq!(accounts, oracle.visible(0, qts), "accounts at qts {qts}");
                    if rng.random_bool(0.3) {
                        assert_eq!(scan_rows(engine, &snap, ITEMS, ScanOptions::default()), oracle.visible(1, qts));
                    }
                    scans.fetch_add(1, Ordering::Relaxed);
                    if finished {
                        break;
                    }
                }
            });
        }
        {
            let (engine, done, start) = (&engine, &done, &start);
            s.spawn(move || {
                start.wait();
                while !done.load(Ordering::Acquire) {
                    engine.gc().unwrap();
                    engine.flush().unwrap();
                    engine.combine().unwrap();
                    engine.storage_gc(0.2).unwrap();
                    std::thread::yield_now();
                }
            });
        }
    });
    let last = engine.snapshot();
    assert_eq!(last.qts().get(), txns.len() as u64);
    assert_eq!(scan_rows(&engine, &last, ACCOUNTS, ScanOptions::default()), oracle.visible(0, last.qts().get()));
    assert!(scans.load(Ordering::Relaxed) >= 3, "readers ran");
    let _ = Oracle::default();
}

/// Every object a checkpoint names: what a restore from it reads.
fn named_objects(m: &fovea_core::checkpoint::Manifest) -> Vec<String> {
    let mut out = Vec::new();
    for shard in &m.shards {
        out.push(shard.index.clone());
        out.extend(shard.slots.iter().filter_map(|s| s.deleted.clone()));
        for part in &shard.parts {
            for file in &part.files {
                out.extend(file.regular.iter().map(|r| r.path.clone()));
                out.extend(file.blocks.iter().map(|b| b.path.clone()));
            }
        }
    }
    out
}

/// Checkpoints written while combine and GC run beside them: as long as a
/// checkpoint is the newest committed one, every object it names exists (a
/// combine swapping a file while a checkpoint reads the parts must not
/// let GC delete blocks that checkpoint names).
#[test]
fn objects_of_the_committed_checkpoint_survive_combine_and_gc_beside_checkpoints() {
    let engine = Engine::in_memory(EngineConfig::default().with_shards(2).with_blocks(16, 2)).unwrap();
    create_tables(&engine);
    let txns = workload(11);
    let done = AtomicBool::new(false);
    /// Stops the maintenance thread however the checking loop ends (a
    /// failed assertion included).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            // Release: pairs with the maintenance loop's Acquire load.
            self.0.store(true, Ordering::Release);
        }
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Acquire) {
                engine.flush().unwrap();
                engine.combine().unwrap();
                engine.storage_gc(0.2).unwrap();
                engine.gc().unwrap();
            }
        });
        let _stop = Stop(&done);
        let mut committed: Option<fovea_core::checkpoint::Manifest> = None;
        for (i, ops) in txns.iter().enumerate() {
            engine.apply(ops.clone()).unwrap();
            if i % 7 != 0 {
                continue;
            }
            let manifest = engine.write_checkpoint().unwrap();
            // Still the newest committed checkpoint until the next commit.
            if let Some(previous) = &committed {
                for path in named_objects(previous) {
                    let found = engine.lake().get(&object_store::path::Path::from(path.as_str()));
                    assert!(
                        found.is_ok(),
                        "after {i} transactions: {path}, named by the committed checkpoint at ts {}, is gone",
                        previous.checkpoint_ts
                    );
                }
            }
            engine.checkpoint_committed(&manifest);
            committed = Some(manifest);
        }
    });
}
