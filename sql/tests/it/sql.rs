//! SQL over live fovea tables: one snapshot per query across tables,
//! pushed-down filters with the same answers as unfiltered scans.

use std::sync::Arc;

use arrow::array::{Array, Int64Array};
use arrow::datatypes::{DataType, Field, Schema};
use fovea_core::{Engine, EngineConfig, Op, TableId, Value};

fn bank(engine: &Engine) {
    for name in ["bank.a", "bank.b"] {
        let schema =
            Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("bal", DataType::Int64, false)]);
        engine.create_table(name, Arc::new(schema), vec![0]).unwrap();
    }
    let ops = (0..100).flat_map(|k| {
        [TableId(0), TableId(1)].map(|t| Op::Insert { table: t, row: vec![Value::Int(k), Value::Int(100)] })
    });
    engine.apply(ops.collect()).unwrap();
}

fn scalar(batches: &[arrow::record_batch::RecordBatch]) -> i64 {
    let a = batches[0].column(0).as_any().downcast_ref::<Int64Array>().unwrap();
    a.value(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_sees_one_snapshot_across_tables_while_replay_goes_on() {
    let engine = Engine::in_memory(EngineConfig::default().with_shards(2).with_blocks(64, 2)).unwrap();
    bank(&engine);
    let snapshot = engine.snapshot();
    let ctx = fovea_sql::session(&engine, &snapshot).unwrap();
    // Transfers from table a to table b after the query's snapshot was taken.
    for k in 0..100 {
        engine
            .apply(vec![
                Op::Update { table: TableId(0), key: vec![Value::Int(k)], row: vec![Value::Int(k), Value::Int(90)] },
                Op::Update { table: TableId(1), key: vec![Value::Int(k)], row: vec![Value::Int(k), Value::Int(110)] },
            ])
            .unwrap();
        engine.gc().unwrap();
    }
    let sql = "SELECT (SELECT sum(bal) FROM bank.a) + (SELECT sum(bal) FROM bank.b)";
    let old = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    assert_eq!(scalar(&old), 20_000);
    let a_only = ctx.sql("SELECT sum(bal) FROM bank.a").await.unwrap().collect().await.unwrap();
    assert_eq!(scalar(&a_only), 10_000, "the snapshot predates every transfer");
    let now = fovea_sql::query(&engine, &engine.snapshot(), "SELECT sum(bal) FROM bank.a").await.unwrap();
    assert_eq!(scalar(&now), 9_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_down_filters_give_the_same_answers() {
    let engine = Engine::in_memory(EngineConfig::default().with_shards(2).with_blocks(16, 2)).unwrap();
    bank(&engine);
    engine.flush().unwrap();
    engine.combine().unwrap();
    let snap = engine.snapshot();
    for (filtered, expected) in [
        ("SELECT count(*) FROM bank.a WHERE id >= 90", 10),
        ("SELECT count(*) FROM bank.a WHERE 10 > id", 10),
        ("SELECT count(*) FROM bank.a WHERE id = 5 AND bal = 100", 1),
        ("SELECT count(*) FROM bank.a WHERE id <> 5", 99),
        ("SELECT count(*) FROM bank.a WHERE id + 1 = 5", 1),
    ] {
        let got = fovea_sql::query(&engine, &snap, filtered).await.unwrap();
        assert_eq!(scalar(&got), expected, "{filtered}");
    }
    let plan = fovea_sql::query(&engine, &snap, "EXPLAIN SELECT id FROM bank.a WHERE id > 3").await.unwrap();
    let text = arrow::util::pretty::pretty_format_batches(&plan).unwrap().to_string();
    assert!(
        text.contains("full_filters=[bank.a.id > Int64(3)]") || text.contains("partial_filters=[bank.a.id > Int64(3)]"),
        "{text}"
    );
}

/// Snapshot isolation under load: transfers between two tables replayed
/// while reader threads query the total across both; every answer equals
/// the invariant. `FOVEA_SI_QUERIES` sets how many answers to collect.
#[test]
fn snapshot_isolation_under_concurrent_replay() {
    let target: usize = std::env::var("FOVEA_SI_QUERIES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
    let engine = Engine::in_memory(EngineConfig::default().with_shards(2).with_blocks(256, 4)).unwrap();
    bank(&engine);
    let done = std::sync::atomic::AtomicBool::new(false);
    let answers = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i: i64 = 0;
            while answers.load(std::sync::atomic::Ordering::Relaxed) < target {
                let (from, to) = (i % 100, (i * 7 + 3) % 100);
                let (ta, tb) = if i % 2 == 0 { (TableId(0), TableId(1)) } else { (TableId(1), TableId(0)) };
                let bal = |t: TableId, k: i64| {
                    let snap = engine.snapshot();
                    let name = if t == TableId(0) { "bank.a" } else { "bank.b" };
                    let rows = engine
                        .scan(
                            &snap,
                            name,
                            fovea_core::ScanOptions {
                                filter: Some(fovea_core::scan::Predicate::Compare {
                                    column: 0,
                                    op: fovea_core::scan::CmpOp::Eq,
                                    value: Value::Int(k),
                                }),
                                ..Default::default()
                            },
                        )
                        .unwrap()
                        .collect_batches()
                        .unwrap();
                    rows[0].column(1).as_any().downcast_ref::<Int64Array>().unwrap().value(0)
                };
                let (a, b) = (bal(ta, from), bal(tb, to));
                engine
                    .apply(vec![
                        Op::Update {
                            table: ta,
                            key: vec![Value::Int(from)],
                            row: vec![Value::Int(from), Value::Int(a - 1)],
                        },
                        Op::Update {
                            table: tb,
                            key: vec![Value::Int(to)],
                            row: vec![Value::Int(to), Value::Int(b + 1)],
                        },
                    ])
                    .unwrap();
                if i % 50 == 0 {
                    engine.gc().unwrap();
                    engine.flush().unwrap();
                    engine.combine().unwrap();
                }
                i += 1;
            }
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        for _ in 0..3 {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    let snap = engine.snapshot();
                    let sql = "SELECT (SELECT sum(bal) FROM bank.a) + (SELECT sum(bal) FROM bank.b)";
                    let got = rt.block_on(fovea_sql::query(&engine, &snap, sql)).unwrap();
                    assert_eq!(scalar(&got), 20_000, "total at qts {:?}", snap.qts());
                    answers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    assert!(answers.into_inner() >= target);
}

/// Time travel: a query at a past ts returns the table as it was then
/// (compared with a plain map kept in step); once GC passes that ts the
/// query fails and names the oldest available ts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_travel_matches_the_state_at_each_ts() {
    use std::collections::BTreeMap;
    let engine = Engine::in_memory(EngineConfig::default().with_shards(2).with_blocks(32, 2)).unwrap();
    bank(&engine);
    let hold = engine.snapshot();
    let mut state: BTreeMap<i64, i64> = (0..100).map(|k| (k, 100)).collect();
    let mut history = vec![(engine.clock().latest(), state.clone())];
    for i in 0..60i64 {
        let k = (i * 13) % 100;
        let ops = if i % 5 == 4 {
            state.remove(&k);
            vec![Op::Delete { table: TableId(0), key: vec![Value::Int(k)] }]
        } else {
            match state.insert(k, i) {
                Some(_) => vec![Op::Update {
                    table: TableId(0),
                    key: vec![Value::Int(k)],
                    row: vec![Value::Int(k), Value::Int(i)],
                }],
                None => vec![Op::Insert { table: TableId(0), row: vec![Value::Int(k), Value::Int(i)] }],
            }
        };
        let ts = engine.apply(ops).unwrap();
        history.push((ts, state.clone()));
        if i % 10 == 0 {
            engine.flush().unwrap();
            engine.combine().unwrap();
            engine.gc().unwrap();
        }
    }
    for (ts, expected) in history.iter().step_by(7) {
        let snap = engine.snapshot_at(*ts).unwrap();
        let batches = fovea_sql::query(&engine, &snap, "SELECT id, bal FROM bank.a ORDER BY id").await.unwrap();
        let mut got = BTreeMap::new();
        for b in &batches {
            let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let bals = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
            for i in 0..b.num_rows() {
                got.insert(ids.value(i), bals.value(i));
            }
        }
        assert_eq!(&got, expected, "bank.a at ts {ts:?}");
    }
    drop(hold);
    engine.gc().unwrap();
    let err = engine.snapshot_at(history[1].0).unwrap_err().to_string();
    assert!(err.contains("oldest available ts"), "{err}");
}

/// Remote plans (each scan's splits on a `SplitWorker`) run on the
/// in-process worker, answers inline and spilled: the same answers as the
/// in-process plan, at a snapshot older than later updates, with nothing
/// spilled left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_plans_answer_as_in_process_plans() {
    use fovea_core::scan_worker::LocalSplits;
    use object_store::ObjectStore as _;
    let engine = Engine::in_memory(EngineConfig::default().with_shards(2).with_blocks(16, 2)).unwrap();
    bank(&engine);
    engine.flush().unwrap();
    engine.combine().unwrap();
    for k in (0..100).step_by(3) {
        engine
            .apply(vec![
                Op::Update { table: TableId(0), key: vec![Value::Int(k)], row: vec![Value::Int(k), Value::Int(50)] },
                Op::Update { table: TableId(1), key: vec![Value::Int(k)], row: vec![Value::Int(k), Value::Int(150)] },
            ])
            .unwrap();
    }
    let snapshot = engine.snapshot();
    engine.apply(vec![Op::Delete { table: TableId(0), key: vec![Value::Int(1)] }]).unwrap();
    let source: Arc<dyn fovea_core::SnapshotTables> = Arc::new(engine.at(snapshot.clone()));
    for inline_limit in [None, Some(64)] {
        let worker = Arc::new(LocalSplits::new(engine.lake().clone(), 3, inline_limit));
        for sql in [
            "SELECT sum(bal) AS s, count(*) AS n FROM bank.a",
            "SELECT count(*) AS n FROM bank.b WHERE bal > 100",
            "SELECT a.id, a.bal + b.bal AS total FROM bank.a a JOIN bank.b b ON a.id = b.id ORDER BY a.id LIMIT 7",
        ] {
            let local = fovea_sql::query_on(Arc::clone(&source), sql).await.unwrap();
            let remote = fovea_sql::query_remote(Arc::clone(&source), worker.clone(), sql).await.unwrap();
            let text = |b: &[arrow::record_batch::RecordBatch]| {
                arrow::util::pretty::pretty_format_batches(b).unwrap().to_string()
            };
            assert_eq!(text(&remote), text(&local), "{sql} (inline limit {inline_limit:?})");
        }
        let left = engine.lake().store().list(Some(&"_fovea/scan-results".into()));
        let left: Vec<_> = futures::TryStreamExt::try_collect(left).await.unwrap();
        assert!(left.is_empty(), "spilled answers left: {left:?}");
    }
    let total = fovea_sql::query_remote(
        source,
        Arc::new(LocalSplits::new(engine.lake().clone(), 2, None)),
        "SELECT sum(bal) FROM bank.a",
    )
    .await
    .unwrap();
    assert_eq!(scalar(&total), 100 * 100 - 34 * 50);
}
