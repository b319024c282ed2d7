//! `TxnOrder` against the source's commit order: transactions spread over
//! shards, records put twice, batches re-sent out of order, shards read in
//! any interleaving, restarts from the positions a checkpoint would record.
//! Every transaction must come out once, whole, in commit order.

use std::collections::{HashMap, HashSet};

use fovea_core::cdc::ChangeRecord;
use fovea_core::cdc::ordering::{Held, Link, Origin, SequenceNumber, TxnOrder};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Producer {
    /// Debezium with BEGIN/END and `source.sequence`: the chain.
    Debezium,
    /// Debezium whose chain breaks (a filtered transaction) or is absent:
    /// watermarks only, so no re-sent batches.
    DebeziumNoChain,
    /// DMS with transaction details.
    Dms,
}

/// A record as put.
#[derive(Clone, Debug)]
struct Put {
    link: Link,
}

fn txid(i: usize) -> String {
    // Ids are not in commit order (PostgreSQL xids are not).
    format!("{}", 5000 + (i * 7919) % 1009)
}

/// The stream of `sizes.len()` transactions as the producer writes it, per
/// shard, before faults.
fn produce(producer: Producer, sizes: &[u8], shards: usize, salt: u64) -> Vec<Vec<Put>> {
    let mut out = vec![Vec::new(); shards];
    // Partitioned by key: a hash of the transaction and the record.
    let pick = |i: usize, r: usize| {
        let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (r as u64 + salt).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        ((h >> 29) % shards as u64) as usize
    };
    for (i, &n) in sizes.iter().enumerate() {
        let n = n as u64;
        let id = txid(i);
        let commit = 1000 * (i as u64 + 1);
        match producer {
            Producer::Debezium | Producer::DebeziumNoChain => {
                let prev_commit = match producer {
                    Producer::Debezium if i == 0 => Some(None),
                    Producer::Debezium => Some(Some(1000 * i as u64)),
                    // No sequence at all, or one naming a commit fovea never
                    // sees (a filtered transaction) every other time.
                    _ if i % 2 == 0 => None,
                    _ => Some(Some(1000 * i as u64 + 500)),
                };
                let home = pick(i, 0);
                out[home].push(Put { link: Link::Begin { txid: id.clone() } });
                for r in 1..=n {
                    out[pick(i, r as usize)]
                        .push(Put { link: Link::DebeziumRow { txid: id.clone(), order: r, prev_commit } });
                }
                out[home].push(Put { link: Link::End { txid: id, commit: Some(commit), events: Some(n) } });
            }
            Producer::Dms => {
                for r in 1..=n {
                    let prev = if r == 1 {
                        (i > 0).then(|| (txid(i - 1), sizes[i - 1] as u64))
                    } else {
                        Some((id.clone(), r - 1))
                    };
                    out[pick(i, r as usize)].push(Put {
                        link: Link::DmsRow { txid: id.clone(), record: r, prev, commit_us: Some(commit as i64) },
                    });
                }
            }
        }
    }
    out
}

#[derive(Clone, Debug)]
enum Fault {
    /// Record `at % len` of shard `shard % n` is put again `later` records on.
    Duplicate { shard: usize, at: usize, later: usize },
    /// A batch of `len` records at `at` fails and is re-sent after `later` more.
    Resend { shard: usize, at: usize, len: usize, later: usize },
}

fn apply_faults(shards: &mut [Vec<Put>], faults: &[Fault], resend: bool) {
    for f in faults {
        match *f {
            Fault::Duplicate { shard, at, later } => {
                let s = &mut shards[shard % shards.len()];
                if s.is_empty() {
                    continue;
                }
                let at = at % s.len();
                let copy = s[at].clone();
                let to = (at + 1 + later).min(s.len());
                s.insert(to, copy);
            }
            Fault::Resend { shard, at, len, later } if resend => {
                let s = &mut shards[shard % shards.len()];
                if s.is_empty() {
                    continue;
                }
                let at = at % s.len();
                let end = (at + len).min(s.len());
                let batch: Vec<Put> = s.drain(at..end).collect();
                let to = (at + later).min(s.len());
                for (k, p) in batch.into_iter().enumerate() {
                    s.insert(to + k, p);
                }
            }
            Fault::Resend { .. } => {}
        }
    }
}

fn held(put: &Put, shard: usize, seq: usize) -> Held {
    let record = match &put.link {
        Link::Begin { txid } => ChangeRecord::Begin { txid: txid.clone(), commit_us: None },
        Link::End { txid, events, .. } => {
            ChangeRecord::End { txid: txid.clone(), event_count: *events, per_table: Vec::new(), commit_us: None }
        }
        _ => ChangeRecord::Skip,
    };
    Held { record, origin: Origin { shard, seq: SequenceNumber(format!("{}", 1_000_000 + seq)) }, bytes: 100 }
}

fn run(
    producer: Producer,
    sizes: Vec<u8>,
    shards: usize,
    salt: u64,
    faults: Vec<Fault>,
    reads: Vec<(usize, usize)>,
    restarts: Vec<usize>,
) {
    let mut stream = produce(producer, &sizes, shards, salt);
    apply_faults(&mut stream, &faults, producer != Producer::DebeziumNoChain);
    let mut order = TxnOrder::new(shards, None, usize::MAX);
    let mut next = vec![0usize; shards];
    let mut applied: HashSet<String> = HashSet::new();
    let mut released: Vec<usize> = Vec::new();
    let by_txid: HashMap<String, usize> = (0..sizes.len()).map(|i| (txid(i), i)).collect();
    let mut take = |order: &mut TxnOrder, at_rest: bool, applied: &mut HashSet<String>| {
        while let Some(r) = order.release(at_rest) {
            let i = by_txid[&r.txid];
            // Whole: BEGIN, every row once, END.
            assert_eq!(r.records.len(), sizes[i] as usize + 2, "transaction {i} released with missing rows");
            assert!(matches!(r.records[0].record, ChangeRecord::Begin { .. }));
            assert!(matches!(r.records.last().map(|h| &h.record), Some(ChangeRecord::End { .. })));
            assert!(applied.insert(r.txid.clone()), "transaction {i} released twice");
            released.push(i);
        }
    };
    let mut steps = reads.into_iter().cycle().take(4 * stream.iter().map(Vec::len).sum::<usize>() + 8);
    let mut step = 0usize;
    loop {
        let pending: Vec<usize> = (0..shards).filter(|&s| next[s] < stream[s].len()).collect();
        if pending.is_empty() {
            break;
        }
        let (pick, count) = steps.next().unwrap_or((0, 1));
        let s = pending[pick % pending.len()];
        for _ in 0..count.max(1) {
            if next[s] == stream[s].len() {
                break;
            }
            let put = &stream[s][next[s]];
            let h = held(put, s, next[s]);
            next[s] += 1;
            let a = applied.clone();
            order.add(put.link.clone(), h, &|t: &str| a.contains(t)).unwrap();
        }
        for (ix, n) in next.iter().enumerate() {
            order.set_at_tip(ix, *n == stream[ix].len());
        }
        take(&mut order, false, &mut applied);
        step += 1;
        if restarts.contains(&step) {
            // What a checkpoint records: the tail, and per shard the
            // earliest held record or the read position.
            let earliest = order.earliest_held();
            for (s, n) in next.iter_mut().enumerate() {
                if let Some(seq) = earliest.get(&s) {
                    *n = seq.0.parse::<usize>().unwrap() - 1_000_000;
                }
            }
            order = TxnOrder::new(shards, order.tail().cloned(), usize::MAX);
        }
    }
    for s in 0..shards {
        order.set_at_tip(s, true);
    }
    // At rest: a DMS transaction without a successor is complete, and a
    // gap in the chain is bridged.
    take(&mut order, true, &mut applied);
    let expected: Vec<usize> = (0..sizes.len()).collect();
    assert_eq!(released, expected, "released out of commit order or not at all");
}

fn faults() -> impl Strategy<Value = Vec<Fault>> {
    prop::collection::vec(
        prop_oneof![
            (0usize..8, 0usize..1000, 0usize..20).prop_map(|(shard, at, later)| Fault::Duplicate { shard, at, later }),
            (0usize..8, 0usize..1000, 1usize..6, 1usize..12).prop_map(|(shard, at, len, later)| Fault::Resend {
                shard,
                at,
                len,
                later
            }),
        ],
        0..8,
    )
}

fn producer() -> impl Strategy<Value = Producer> {
    prop_oneof![Just(Producer::Debezium), Just(Producer::DebeziumNoChain), Just(Producer::Dms)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]
    #[test]
    fn transactions_come_out_whole_once_in_commit_order(
        producer in producer(),
        sizes in prop::collection::vec(1u8..7, 1..30),
        shards in 1usize..5,
        salt in 0u64..1000,
        faults in faults(),
        reads in prop::collection::vec((0usize..8, 1usize..6), 1..20),
        restarts in prop::collection::vec(0usize..60, 0..3),
    ) {
        run(producer, sizes, shards, salt, faults, reads, restarts);
    }
}

#[test]
fn a_transaction_missing_a_record_is_held_and_the_cap_names_it() {
    let mut order = TxnOrder::new(2, None, 250);
    let h = |shard, seq: &str| Held {
        record: ChangeRecord::Skip,
        origin: Origin { shard, seq: SequenceNumber(seq.into()) },
        bytes: 100,
    };
    let no = |_: &str| false;
    order.add(Link::Begin { txid: "7".into() }, h(0, "1"), &no).unwrap();
    order.add(Link::End { txid: "7".into(), commit: Some(90), events: Some(2) }, h(0, "2"), &no).unwrap();
    order.set_at_tip(0, true);
    order.set_at_tip(1, true);
    assert!(order.release(true).is_none(), "incomplete: one of two events is missing");
    let err = order
        .add(Link::DebeziumRow { txid: "7".into(), order: 1, prev_commit: Some(None) }, h(1, "5"), &no)
        .unwrap_err();
    assert!(err.contains("source transaction 7") && err.contains("0 of 2 events"), "{err}");
}

#[test]
fn links_are_read_from_real_records() {
    use fovea_core::cdc::InputFormat;
    let begin = r#"{"topic":"t.transaction","key":{"id":"31203:125775432"},"value":{"status":"BEGIN","id":"31203:125775432","event_count":null,"data_collections":null,"ts_ms":1}}"#;
    assert_eq!(
        fovea_core::cdc::ordering::link_of(begin, InputFormat::Auto).unwrap(),
        Link::Begin { txid: "31203".into() }
    );
    let end = r#"{"status":"END","id":"31203:125820576","event_count":211,"data_collections":[],"ts_ms":1}"#;
    assert_eq!(
        fovea_core::cdc::ordering::link_of(end, InputFormat::Auto).unwrap(),
        Link::End { txid: "31203".into(), commit: Some(125820576), events: Some(211) }
    );
    let row = r#"{"topic":"t.public.a","key":{"id":1},"value":{"before":null,"after":{"id":1},"source":{"sequence":"[\"125820576\",\"125953248\"]","txId":31217,"schema":"public","table":"a"},"transaction":{"id":"31217:125953248","total_order":3,"data_collection_order":1},"op":"c"}}"#;
    assert_eq!(
        fovea_core::cdc::ordering::link_of(row, InputFormat::Auto).unwrap(),
        Link::DebeziumRow { txid: "31217".into(), order: 3, prev_commit: Some(Some(125820576)) }
    );
    let tombstone = r#"{"topic":"t.public.a","key":{"id":1},"value":null}"#;
    assert_eq!(fovea_core::cdc::ordering::link_of(tombstone, InputFormat::Auto).unwrap(), Link::Skip);
    let dms = r#"{"data":{"id":1},"metadata":{"timestamp":"2026-01-01T00:00:00.000000Z","record-type":"data","operation":"insert","partition-key-type":"schema-table","schema-name":"public","table-name":"a","transaction-id":8589934592,"transaction-record-id":2,"prev-transaction-id":8589934592,"prev-transaction-record-id":1,"commit-timestamp":"2026-01-01T00:00:00.000000Z"}}"#;
    assert_eq!(
        fovea_core::cdc::ordering::link_of(dms, InputFormat::Auto).unwrap(),
        Link::DmsRow {
            txid: "8589934592".into(),
            record: 2,
            prev: Some(("8589934592".into(), 1)),
            commit_us: Some(1_767_225_600_000_000)
        }
    );
    assert!(fovea_core::cdc::ordering::link_of("{not json", InputFormat::Auto).is_err());
}
