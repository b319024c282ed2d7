//! Rebuilding source transactions, in commit order, from a change stream
//! spread over shards (Kinesis) that redelivers and reorders records.
//!
//! Order holds only within a shard, and not even there when a producer
//! re-sends the failed entries of a batch. [`TxnOrder`] therefore keeps a
//! record until its whole source transaction is there and no earlier
//! transaction can still arrive, then releases the transaction — BEGIN,
//! its rows in source order, END — for the sink to apply atomically
//! (DESIGN §3: one source transaction, one mirror transaction).
//!
//! # What a record says about its place
//! | producer | transaction complete when | predecessor (the chain) | commit position |
//! |---|---|---|---|
//! | Debezium PostgreSQL, `provide.transaction.metadata=true` | BEGIN, END and END's `event_count` distinct `transaction.total_order`s are there | `source.sequence[0]`: the commit LSN of the transaction before (`null`: none) | END's id `xid:lsn`: its commit LSN |
//! | AWS DMS, `IncludeTransactionDetails=true` | records `1..=n` are there and a later record names `(txid, n)` as its `prev-transaction-id`/`prev-transaction-record-id` (or the stream is at rest: every shard read to its tip, `fovea replay`) | the first record's `prev-transaction-id`/`-record-id` | — (`commit-timestamp` breaks ties in a gap) |
//!
//! # The rule
//! Let `tail` be the last transaction released. A complete transaction `T`
//! is released when
//! 1. **chain**: `T`'s predecessor is `tail` (or `T` has none and nothing was
//!    released yet). The producer wrote the predecessor link from the
//!    source's own commit order, so nothing can commit between `tail` and `T`:
//!    whatever arrives later belongs after `T`. This holds however the
//!    shards interleave, redeliver or reorder;
//! 2. **watermarks** (Debezium, when the chain is broken — e.g. a
//!    transaction the connector filtered out moved `sequence[0]` past every
//!    END, or reading started in the middle of the stream): `T` has the
//!    smallest commit position `c` of every transaction whose END arrived;
//!    every shard has *passed* `c` — it delivered a record whose commit
//!    position, or predecessor's, is at least `c` (records of one shard come
//!    in source order when the producer does not re-send), or it is read
//!    to its tip, or it is finished; and no held transaction without an
//!    END can commit before `c` (its predecessor's commit is below `c`, or
//!    unknown). Then every transaction committed before `c` has been
//!    released: it was written to some shard before anything committed
//!    after it, and that shard has passed `c`;
//! 3. **gap** (DMS, chain broken): `T` is the complete transaction whose
//!    predecessor is not held, earliest by commit time.
//!
//! A transaction whose predecessor is named but not released (rules 2 and
//! 3) may be waiting for a record still in flight — a re-sent batch arrives
//! after later ones, and being at every shard's tip proves nothing while
//! the producer writes — or follow a gap the producer left (a transaction
//! it filtered out). It is released only at rest ([`TxnOrder::release`]'s
//! `at_rest`: `fovea replay` at every shard's tip) or after waiting the
//! grace ([`TxnOrder::with_gap_grace`]), with a warning; should the
//! predecessor arrive after all, the input fails naming it rather than
//! apply it out of order.
//!
//! Exactly once: a record of a transaction the sink applied (redelivered, or
//! read again after a restart from a checkpoint that had to resume before
//! it) is dropped on arrival — by its identity (`applied`), or by its
//! position before `tail`. A record seen twice inside a held transaction
//! (the same `total_order` / `transaction-record-id`) is kept once.
//!
//! Memory: held records are bounded by [`TxnOrder::new`]'s `max_held_bytes`;
//! past it, [`TxnOrder::add`] fails naming the earliest held transaction,
//! what it waits for and the shard that holds it back.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value as Json;
use serde_json::value::RawValue;

use super::{ChangeRecord, InputFormat};

/// A shard's index in the source's list.
pub type ShardIx = usize;

/// Where a record came from, for messages and resume positions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The shard.
    pub shard: ShardIx,
    /// Its sequence number in the shard.
    pub seq: SequenceNumber,
}

/// A Kinesis sequence number: a decimal string of up to 129 digits, ordered
/// numerically.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct SequenceNumber(pub String);

impl Ord for SequenceNumber {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Decimal without leading zeros: longer is larger.
        self.0.len().cmp(&other.0.len()).then_with(|| self.0.cmp(&other.0))
    }
}

impl PartialOrd for SequenceNumber {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a record says about its source transaction and its place in the
/// commit order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Link {
    /// Debezium BEGIN.
    Begin {
        /// Source transaction id (the xid part).
        txid: String,
    },
    /// Debezium END.
    End {
        /// Source transaction id.
        txid: String,
        /// Commit position (the LSN part of the END's id), when it has one.
        commit: Option<u64>,
        /// Data events of the transaction.
        events: Option<u64>,
    },
    /// A Debezium data record inside a transaction block.
    DebeziumRow {
        /// Source transaction id.
        txid: String,
        /// `transaction.total_order`: its place in the transaction, from 1.
        order: u64,
        /// `source.sequence[0]`: the commit position of the transaction
        /// before (`None`: the record has no `sequence`; `Some(None)`: it
        /// is `null`, no transaction before).
        prev_commit: Option<Option<u64>>,
    },
    /// A DMS data record with transaction details.
    DmsRow {
        /// `transaction-id`.
        txid: String,
        /// `transaction-record-id`: its place in the transaction, from 1.
        record: u64,
        /// `prev-transaction-id` / `prev-transaction-record-id`: the record
        /// before it in commit order (`None`: none).
        prev: Option<(String, u64)>,
        /// `commit-timestamp`, µs.
        commit_us: Option<i64>,
    },
    /// A record of an initial load (Debezium `op: r` outside any
    /// transaction, DMS `load`): no source transaction; a key's load record
    /// precedes the key's later changes in its shard.
    Snapshot,
    /// A record without transaction details (Debezium without transaction
    /// metadata, DMS without `IncludeTransactionDetails`): it cannot be
    /// placed among shards.
    Unlinked,
    /// Nothing to apply (a tombstone, a DMS control record).
    Skip,
}

impl Link {
    /// The source transaction the record belongs to.
    pub fn txid(&self) -> Option<&str> {
        match self {
            Link::Begin { txid } | Link::End { txid, .. } => Some(txid),
            Link::DebeziumRow { txid, .. } | Link::DmsRow { txid, .. } => Some(txid),
            Link::Snapshot | Link::Unlinked | Link::Skip => None,
        }
    }
}

/// The xid part of a Debezium transaction id `"<xid>:<lsn>"`, and the lsn.
fn split_txid(id: &Json) -> Option<(String, Option<u64>)> {
    match id {
        Json::String(s) => {
            let (xid, lsn) = s.split_once(':').map_or((s.as_str(), None), |(x, l)| (x, l.parse().ok()));
            Some((xid.to_owned(), lsn))
        }
        Json::Number(n) => Some((n.to_string(), None)),
        _ => None,
    }
}

/// The fields of a Debezium record (at any level) that place it.
#[derive(serde::Deserialize)]
struct DebeziumPlace<'a> {
    #[serde(borrow)]
    value: Option<&'a RawValue>,
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
    schema: Option<&'a RawValue>,
    status: Option<String>,
    id: Option<Json>,
    event_count: Option<u64>,
    source: Option<DebeziumSource>,
    transaction: Option<Json>,
    op: Option<String>,
    /// Present in Kafka-style records.
    topic: Option<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct DebeziumSource {
    sequence: Option<String>,
}

/// Reads where a record of `format` belongs (see [`Link`]). `Err` carries
/// what is wrong with the JSON.
pub fn link_of(line: &str, format: InputFormat) -> Result<Link, String> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(Link::Skip);
    }
    let dms = match format {
        InputFormat::Dms => true,
        InputFormat::Debezium => false,
        InputFormat::Auto => line.contains("\"metadata\""),
    };
    if dms { dms_link(line) } else { debezium_link(line) }
}

fn debezium_link(line: &str) -> Result<Link, String> {
    let mut text = line;
    let mut place: DebeziumPlace<'_> = serde_json::from_str(text).map_err(|e| format!("malformed JSON: {e}"))?;
    // Unwrap the Kafka record and the schema envelope, whichever are there.
    for _ in 0..2 {
        let inner = match (&place.value, &place.payload) {
            (Some(v), _) if place.topic.is_some() || (place.source.is_none() && place.op.is_none()) => v.get(),
            (_, Some(p)) if place.schema.is_some() => p.get(),
            _ => break,
        };
        if inner == "null" {
            return Ok(Link::Skip);
        }
        text = inner;
        place = serde_json::from_str(text).map_err(|e| format!("malformed JSON: {e}"))?;
    }
    match place.status.as_deref() {
        Some("BEGIN") => {
            let (txid, _) = place.id.as_ref().and_then(split_txid).ok_or("BEGIN without an id")?;
            return Ok(Link::Begin { txid });
        }
        Some("END") => {
            let (txid, commit) = place.id.as_ref().and_then(split_txid).ok_or("END without an id")?;
            return Ok(Link::End { txid, commit, events: place.event_count });
        }
        Some(other) => return Err(format!("unknown transaction status {other:?}")),
        None => {}
    }
    let Some(tx) = place.transaction.as_ref().filter(|t| !t.is_null()) else {
        return Ok(match place.op.as_deref() {
            Some("r") => Link::Snapshot,
            Some(_) => Link::Unlinked,
            None => Link::Skip,
        });
    };
    let (txid, _) = tx.get("id").and_then(split_txid).ok_or("transaction block without an id")?;
    let order = tx.get("total_order").and_then(Json::as_u64).ok_or("transaction block without total_order")?;
    let prev_commit = match place.source.and_then(|s| s.sequence) {
        None => None,
        Some(seq) => {
            let parts: Vec<Option<String>> =
                serde_json::from_str(&seq).map_err(|e| format!("source.sequence {seq:?} is not a JSON array: {e}"))?;
            match parts.first() {
                Some(Some(lsn)) => Some(Some(
                    lsn.parse::<u64>().map_err(|_| format!("source.sequence {seq:?}: {lsn:?} is not an LSN"))?,
                )),
                _ => Some(None),
            }
        }
    };
    Ok(Link::DebeziumRow { txid, order, prev_commit })
}

#[derive(serde::Deserialize)]
struct DmsPlace {
    metadata: Option<DmsMeta>,
}

#[derive(serde::Deserialize)]
struct DmsMeta {
    #[serde(rename = "record-type")]
    record_type: Option<String>,
    operation: Option<String>,
    #[serde(rename = "transaction-id")]
    transaction_id: Option<Json>,
    #[serde(rename = "transaction-record-id")]
    transaction_record_id: Option<Json>,
    #[serde(rename = "prev-transaction-id")]
    prev_transaction_id: Option<Json>,
    #[serde(rename = "prev-transaction-record-id")]
    prev_transaction_record_id: Option<Json>,
    #[serde(rename = "commit-timestamp")]
    commit_timestamp: Option<String>,
}

/// A DMS id: an integer, or a string of one.
fn dms_id(v: &Option<Json>) -> Option<String> {
    match v.as_ref()? {
        Json::String(s) if !s.is_empty() => Some(s.clone()),
        Json::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn dms_count(v: &Option<Json>) -> Option<u64> {
    match v.as_ref()? {
        Json::String(s) => s.parse().ok(),
        n => n.as_u64(),
    }
}

fn dms_link(line: &str) -> Result<Link, String> {
    let place: DmsPlace = serde_json::from_str(line).map_err(|e| format!("malformed JSON: {e}"))?;
    let meta = place.metadata.ok_or("DMS record without metadata")?;
    if meta.record_type.as_deref() != Some("data") {
        return Ok(Link::Skip);
    }
    if meta.operation.as_deref() == Some("load") {
        return Ok(Link::Snapshot);
    }
    let (Some(txid), Some(record)) = (dms_id(&meta.transaction_id), dms_count(&meta.transaction_record_id)) else {
        return Ok(Link::Unlinked);
    };
    let prev = match (dms_id(&meta.prev_transaction_id), dms_count(&meta.prev_transaction_record_id)) {
        (Some(t), Some(r)) => Some((t, r)),
        _ => None,
    };
    let commit_us = meta.commit_timestamp.as_deref().and_then(super::types::parse_timestamp);
    Ok(Link::DmsRow { txid, record, prev, commit_us })
}

/// A held record: what the sink gets, and where it came from.
#[derive(Debug)]
pub struct Held {
    /// The decoded record.
    pub record: ChangeRecord,
    /// Its shard and sequence number.
    pub origin: Origin,
    /// Its size as received.
    pub bytes: usize,
}

/// The predecessor a transaction names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Prev {
    /// None: the first transaction of the source.
    Start,
    /// Debezium: the commit position of the transaction before.
    Commit(u64),
    /// DMS: the last record of the transaction before.
    Record(String, u64),
}

/// The transaction released last: where the chain continues.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tail {
    /// Source transaction id.
    pub txid: String,
    /// Its commit position (Debezium).
    pub commit: Option<u64>,
    /// Its records (DMS: the last record id).
    pub records: u64,
}

#[derive(Default)]
struct Txn {
    begin: Option<Held>,
    end: Option<Held>,
    commit: Option<u64>,
    events: Option<u64>,
    rows: BTreeMap<u64, Held>,
    prev: Option<Prev>,
    commit_us: Option<i64>,
    bytes: usize,
    dms: bool,
}

/// One shard as the ordering sees it.
#[derive(Clone, Debug, Default)]
struct ShardMark {
    /// The highest commit position it passed (see the module docs).
    passed: Option<u64>,
    /// Everything put to it so far was read.
    at_tip: bool,
    /// Closed and read to its end.
    finished: bool,
}

/// A transaction ready for the sink: its records in order (a DMS
/// transaction gets a BEGIN and an END made for it).
#[derive(Debug)]
pub struct Released {
    /// Source transaction id.
    pub txid: String,
    /// BEGIN, rows, END.
    pub records: Vec<Held>,
    /// Released by the gap rule (the chain could not place it).
    pub gap: bool,
}

/// Source transactions being rebuilt from shards (see the module docs).
pub struct TxnOrder {
    held: HashMap<String, Txn>,
    /// Held transactions by the predecessor they name.
    by_prev: HashMap<Prev, String>,
    /// Held Debezium transactions with an END, by commit position.
    by_commit: BTreeMap<u64, String>,
    /// DMS: record counts learnt from a successor's predecessor link.
    ends: HashMap<String, u64>,
    shards: Vec<ShardMark>,
    tail: Option<Tail>,
    held_bytes: usize,
    max_held_bytes: usize,
    /// How long a complete transaction after a gap in the chain waits for
    /// every shard to be quiet before it is released anyway.
    gap_grace: std::time::Duration,
    /// The transaction waiting after a gap, and since when.
    gap_wait: Option<(String, std::time::Instant)>,
    /// Records dropped as already applied or seen twice.
    pub dropped: u64,
}

impl TxnOrder {
    /// An empty ordering over `shards` shards, continuing after `tail` (from
    /// a checkpoint), holding at most `max_held_bytes` of records.
    pub fn new(shards: usize, tail: Option<Tail>, max_held_bytes: usize) -> Self {
        TxnOrder {
            held: HashMap::new(),
            by_prev: HashMap::new(),
            by_commit: BTreeMap::new(),
            ends: HashMap::new(),
            shards: vec![ShardMark::default(); shards],
            tail,
            held_bytes: 0,
            max_held_bytes,
            gap_grace: std::time::Duration::MAX,
            gap_wait: None,
            dropped: 0,
        }
    }

    /// Releases a complete transaction after a gap in the chain once it
    /// waited `grace`, even if the shards are never all quiet at once (a
    /// stream under constant load). Default: never.
    pub fn with_gap_grace(mut self, grace: std::time::Duration) -> Self {
        self.gap_grace = grace;
        self
    }

    /// Makes room for shard `ix` (a child shard discovered later).
    pub fn ensure_shard(&mut self, ix: ShardIx) {
        if self.shards.len() <= ix {
            self.shards.resize(ix + 1, ShardMark::default());
        }
    }

    /// Whether every record put to shard `ix` so far was read.
    pub fn set_at_tip(&mut self, ix: ShardIx, at_tip: bool) {
        self.ensure_shard(ix);
        self.shards[ix].at_tip = at_tip;
    }

    /// Shard `ix` is closed and read to its end: it holds nothing back.
    pub fn set_finished(&mut self, ix: ShardIx) {
        self.ensure_shard(ix);
        self.shards[ix].finished = true;
    }

    /// The transaction released last.
    pub fn tail(&self) -> Option<&Tail> {
        self.tail.as_ref()
    }

    /// Transactions held, and the bytes of their records.
    pub fn held(&self) -> (usize, usize) {
        (self.held.len(), self.held_bytes)
    }

    /// The earliest sequence number held per shard: a restart must read
    /// each shard again from there.
    pub fn earliest_held(&self) -> HashMap<ShardIx, SequenceNumber> {
        let mut out: HashMap<ShardIx, SequenceNumber> = HashMap::new();
        for t in self.held.values() {
            for h in t.begin.iter().chain(t.end.iter()).chain(t.rows.values()) {
                keep_earliest(&mut out, &h.origin);
            }
        }
        out
    }

    /// Takes one record. `applied` says whether the sink already applied a
    /// source transaction (its identity is in the history); such records
    /// are dropped. Fails when the held records would pass the cap.
    pub fn add(&mut self, link: Link, held: Held, applied: &dyn Fn(&str) -> bool) -> Result<(), String> {
        let shard = held.origin.shard;
        self.ensure_shard(shard);
        // What the shard passed (Debezium): in source order, a record of a
        // transaction whose predecessor committed at p comes after every
        // record committed at or before p.
        let passed = match &link {
            Link::End { commit, .. } => *commit,
            Link::DebeziumRow { prev_commit: Some(p), .. } => *p,
            _ => None,
        };
        if let Some(p) = passed {
            let mark = &mut self.shards[shard];
            mark.passed = Some(mark.passed.map_or(p, |q| q.max(p)));
        }
        let Some(txid) = link.txid().map(str::to_owned) else {
            return Err("a record without transaction details cannot be ordered across shards".into());
        };
        let tail_txid = self.tail.as_ref().map(|t| t.txid.as_str());
        if self.is_behind_tail(&link) && tail_txid != Some(txid.as_str()) && !applied(&txid) {
            return Err(format!(
                "source transaction {txid} arrived after later transactions were applied: the producer delivered it late (a re-sent batch, or a gap bridged while every shard was at its tip)"
            ));
        }
        if self.is_behind_tail(&link) || (!self.held.contains_key(&txid) && applied(&txid)) {
            self.dropped += 1;
            return Ok(());
        }
        if let Link::DmsRow { prev: Some((pt, pr)), .. } = &link
            && *pt != txid
            && self.tail.as_ref().is_none_or(|t| t.txid != *pt)
            && (self.held.contains_key(pt) || !applied(pt))
        {
            // A transaction's first record names the last of the one before:
            // that one has `pr` records.
            self.ends.insert(pt.clone(), *pr);
        }
        if self.held_bytes + held.bytes > self.max_held_bytes {
            return Err(self.over_cap(held.bytes));
        }
        if let Link::End { commit: Some(c), .. } = &link
            && let Some(other) = self.by_commit.get(c).filter(|o| **o != txid)
        {
            return Err(format!(
                "the END of source transaction {txid} names commit position {c}, as the END of {other} did: the producer's commit positions do not order transactions (Debezium's PostgreSQL connector puts the commit LSN there); read such a stream from one shard"
            ));
        }
        let txn = self.held.entry(txid.clone()).or_default();
        let bytes = held.bytes;
        let kept = match link {
            Link::Begin { .. } => put_once(&mut txn.begin, held),
            Link::End { commit, events, .. } => {
                let new = put_once(&mut txn.end, held);
                if new {
                    txn.commit = commit;
                    txn.events = events;
                    if let Some(c) = commit {
                        self.by_commit.insert(c, txid.clone());
                    }
                }
                new
            }
            Link::DebeziumRow { order, prev_commit, .. } => {
                if txn.prev.is_none()
                    && let Some(p) = prev_commit
                {
                    let prev = p.map_or(Prev::Start, Prev::Commit);
                    self.by_prev.entry(prev.clone()).or_insert_with(|| txid.clone());
                    txn.prev = Some(prev);
                }
                insert_once(&mut txn.rows, order, held)
            }
            Link::DmsRow { record, prev, commit_us, .. } => {
                txn.dms = true;
                txn.commit_us = txn.commit_us.or(commit_us);
                if record == 1 && txn.prev.is_none() {
                    let prev = prev.map_or(Prev::Start, |(t, r)| Prev::Record(t, r));
                    self.by_prev.entry(prev.clone()).or_insert_with(|| txid.clone());
                    txn.prev = Some(prev);
                }
                insert_once(&mut txn.rows, record, held)
            }
            Link::Snapshot | Link::Unlinked | Link::Skip => unreachable!("no txid"),
        };
        if kept {
            txn.bytes += bytes;
            self.held_bytes += bytes;
        } else {
            self.dropped += 1;
        }
        Ok(())
    }

    /// Whether a record belongs to a transaction at or before the tail.
    fn is_behind_tail(&self, link: &Link) -> bool {
        let Some(tail) = &self.tail else { return false };
        match link {
            Link::End { commit: Some(c), .. } => tail.commit.is_some_and(|t| *c <= t),
            // Its transaction follows the one committed at p; the tail
            // committed after p, so the transaction is at or before the tail.
            Link::DebeziumRow { prev_commit: Some(Some(p)), .. } => tail.commit.is_some_and(|t| *p < t),
            Link::DebeziumRow { prev_commit: Some(None), .. } => tail.commit.is_some(),
            _ => link.txid() == Some(tail.txid.as_str()),
        }
    }

    fn is_complete(&self, txid: &str, at_rest: bool) -> bool {
        let Some(t) = self.held.get(txid) else { return false };
        if t.dms {
            let n = t.rows.len() as u64;
            let contiguous = t.rows.keys().next() == Some(&1) && t.rows.keys().next_back() == Some(&n);
            return contiguous && (self.ends.get(txid) == Some(&n) || at_rest);
        }
        t.begin.is_some() && t.end.is_some() && t.events.is_none_or(|e| t.rows.len() as u64 == e)
    }

    /// The next transaction to apply, if one is ready. `at_rest`: every
    /// shard was read to its tip and nothing more is coming for now
    /// (`fovea replay` at its end) — a DMS transaction without a successor
    /// counts as complete, and a broken chain is bridged.
    pub fn release(&mut self, at_rest: bool) -> Option<Released> {
        let prev = match &self.tail {
            None => Prev::Start,
            Some(Tail { commit: Some(c), .. }) => Prev::Commit(*c),
            Some(t) => Prev::Record(t.txid.clone(), t.records),
        };
        // 1. The chain.
        if let Some(txid) = self.by_prev.get(&prev).cloned()
            && self.is_complete(&txid, at_rest)
        {
            return Some(self.take(&txid, false));
        }
        // 2. Watermarks (Debezium).
        if let Some((&c, txid)) = self.by_commit.iter().next() {
            let txid = txid.clone();
            // A transaction naming a predecessor that was not released is
            // either waiting for it (in flight: a re-sent batch) or after a
            // gap (a transaction the producer filtered out): bridged only
            // at rest or after the grace — being at every shard's tip
            // proves nothing while the producer still writes. Before anything
            // was released too: the predecessor named may be in flight, or
            // before where reading started.
            let named = self.held.get(&txid).is_some_and(|t| t.prev.is_some());
            if self.is_complete(&txid, at_rest)
                && (at_rest || self.passed_everywhere(c))
                && !self.open_may_precede(c)
                && (!named || at_rest || self.waited(&txid))
            {
                self.gap_wait = None;
                return Some(self.take(&txid, named));
            }
            return None;
        }
        // 3. A gap in a DMS chain: the complete transaction whose
        // predecessor is not held, earliest by commit time, at rest or
        // after the grace.
        let candidate = self
            .held
            .iter()
            .filter(|(_, t)| t.dms && t.prev.as_ref().is_some_and(|p| !self.names_held(p)))
            .min_by_key(|(id, t)| (t.commit_us, (*id).clone()))
            .map(|(id, _)| id.clone());
        if let Some(txid) = candidate
            && self.is_complete(&txid, at_rest)
            && (at_rest || self.waited(&txid))
        {
            self.gap_wait = None;
            return Some(self.take(&txid, true));
        }
        None
    }

    /// Whether `txid`, blocked by a gap, has waited the grace (the clock
    /// starts at the first ask).
    fn waited(&mut self, txid: &str) -> bool {
        match &self.gap_wait {
            Some((id, since)) if id == txid => since.elapsed() >= self.gap_grace,
            _ => {
                self.gap_wait = Some((txid.to_owned(), std::time::Instant::now()));
                self.gap_grace.is_zero()
            }
        }
    }

    /// Whether `prev` is a record of a held transaction.
    fn names_held(&self, prev: &Prev) -> bool {
        match prev {
            Prev::Record(t, _) => self.held.contains_key(t),
            _ => false,
        }
    }

    fn passed_everywhere(&self, c: u64) -> bool {
        self.shards.iter().all(|s| s.finished || s.at_tip || s.passed.is_some_and(|p| p >= c))
    }

    /// Whether a held transaction without an END may commit before `c`.
    fn open_may_precede(&self, c: u64) -> bool {
        self.held.values().any(|t| {
            t.end.is_none()
                && !t.dms
                && match &t.prev {
                    Some(Prev::Commit(p)) => *p < c,
                    Some(Prev::Start) => true,
                    // Only its BEGIN is here: it may commit anywhere.
                    _ => true,
                }
        })
    }

    fn take(&mut self, txid: &str, gap: bool) -> Released {
        let t = self.held.remove(txid).unwrap_or_else(|| unreachable!("released transactions are held"));
        if let Some(p) = &t.prev
            && self.by_prev.get(p).is_some_and(|id| id == txid)
        {
            self.by_prev.remove(p);
        }
        if let Some(c) = t.commit {
            self.by_commit.remove(&c);
        }
        self.ends.remove(txid);
        self.held_bytes -= t.bytes;
        let records = t.rows.len() as u64;
        let mut out = Vec::with_capacity(t.rows.len() + 2);
        let first_origin = t.rows.values().next().map(|h| h.origin.clone());
        match t.begin {
            Some(b) => out.push(b),
            None => out.push(Held {
                record: ChangeRecord::Begin { txid: txid.to_owned(), commit_us: t.commit_us },
                origin: first_origin.clone().unwrap_or(Origin { shard: 0, seq: SequenceNumber("0".into()) }),
                bytes: 0,
            }),
        }
        let last_origin = t.rows.values().next_back().map(|h| h.origin.clone());
        out.extend(t.rows.into_values());
        match t.end {
            Some(e) => out.push(e),
            None => out.push(Held {
                record: ChangeRecord::End {
                    txid: txid.to_owned(),
                    event_count: Some(records),
                    per_table: Vec::new(),
                    commit_us: t.commit_us,
                },
                origin: last_origin.unwrap_or(Origin { shard: 0, seq: SequenceNumber("0".into()) }),
                bytes: 0,
            }),
        }
        self.tail = Some(Tail { txid: txid.to_owned(), commit: t.commit, records });
        Released { txid: txid.to_owned(), records: out, gap }
    }

    /// Why the cap was hit: the earliest held transaction, what it waits
    /// for, and the shard that holds things back.
    fn over_cap(&self, incoming: usize) -> String {
        let earliest = self
            .by_commit
            .values()
            .next()
            .cloned()
            .or_else(|| self.held.iter().min_by_key(|(_, t)| t.commit_us).map(|(id, _)| id.clone()));
        let waiting = earliest.as_deref().map_or_else(String::new, |id| {
            let t = &self.held[id];
            let what = if t.dms {
                format!("{} records, no successor naming its last yet", t.rows.len())
            } else if t.begin.is_none() {
                "its BEGIN".to_owned()
            } else if t.end.is_none() {
                format!("its END ({} events so far)", t.rows.len())
            } else {
                format!("{} of {} events", t.rows.len(), t.events.unwrap_or(0))
            };
            let shard = t.begin.iter().chain(t.end.iter()).chain(t.rows.values()).next().map(|h| h.origin.shard);
            format!(
                "; the earliest held source transaction {id} (first seen on shard #{}) has {what}",
                shard.unwrap_or(0)
            )
        });
        let behind = self
            .shards
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.finished && !s.at_tip)
            .min_by_key(|(_, s)| s.passed)
            .map_or_else(String::new, |(i, s)| format!("; shard #{i} is furthest behind (passed {:?})", s.passed));
        format!(
            "{} held records of {} incomplete or waiting source transactions reach the cap of {} bytes with {incoming} more{waiting}{behind}. Help: raise max_held_mb, or check that the producer delivers every record of each transaction",
            self.held_bytes,
            self.held.len(),
            self.max_held_bytes
        )
    }
}

/// Records `origin` in `earliest` if it comes before what its shard has.
pub fn keep_earliest(earliest: &mut HashMap<ShardIx, SequenceNumber>, origin: &Origin) {
    match earliest.get_mut(&origin.shard) {
        Some(s) if *s <= origin.seq => {}
        Some(s) => *s = origin.seq.clone(),
        None => {
            earliest.insert(origin.shard, origin.seq.clone());
        }
    }
}

/// Sets `slot` unless it is set: whether `h` was kept.
fn put_once(slot: &mut Option<Held>, h: Held) -> bool {
    if slot.is_some() {
        return false;
    }
    *slot = Some(h);
    true
}

fn insert_once(rows: &mut BTreeMap<u64, Held>, key: u64, h: Held) -> bool {
    if rows.contains_key(&key) {
        return false;
    }
    rows.insert(key, h);
    true
}
