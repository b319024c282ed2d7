//! Kinesis Data Streams as an input: `--input
//! 'kinesis://STREAM[,STREAM…]?format=auto|debezium|dms&start=trim_horizon|latest'`.
//!
//! ```text
//!  shard readers (tasks, one per shard: GetRecords, or SubscribeToShard
//!  with `consumer=NAME`, see `fanout`) ──events──▶ KinesisSource::poll
//!     decode + link each record ─▶ TxnOrder (whole transactions, commit order) ─▶ Sink
//! ```
//! Every shard of every stream is read concurrently; a child shard (split,
//! merge) starts once its parents are read to their end, so a key's changes
//! stay in order across resharding. Source transactions are rebuilt and
//! released in commit order by [`fovea_core::cdc::ordering`] (its module
//! docs state the rule and why it holds). A checkpoint records, per shard,
//! where to read again — at the earliest record of a transaction not yet
//! applied, else after the last record read, or that the shard is finished
//! — and the last transaction applied; a restart reads from there, and
//! records of transactions already applied are dropped by their identity.
//!
//! What is guaranteed, by producer configuration:
//!
//! | producer | guarantee |
//! |---|---|
//! | Debezium PostgreSQL with `provide.transaction.metadata=true` (BEGIN/END records, `transaction.total_order`, `source.sequence`), any partitioning, any number of shards and streams | every transaction exactly once, whole, in commit order (the chain of `source.sequence` commit LSNs) |
//! | AWS DMS with `IncludeTransactionDetails=true` (`transaction-id`, `transaction-record-id`, `prev-transaction-*`), any partitioning | the same (the chain of prev links); the newest transaction becomes visible once the next one's first record arrives (DMS marks no end — enable `HeartbeatEnable` on a quiet source) or, in `fovea replay`, once every shard is read to its tip |
//! | either without transaction details, one shard | records in shard order, grouped by transaction id as in a file; a record put twice may be applied twice |
//! | without transaction details, several shards | refused at start, unless `&atomic=false`: each row is applied as a transaction of its own (named `kinesis-row:…` in `fovea history`) |
//!
//! Records held for incomplete transactions are capped (`max_held_mb`,
//! default an eighth of the machine's memory): past it the input fails,
//! naming the transaction and the shard holding it back. Records read
//! ahead — read by the shard readers, not yet taken in — are capped too
//! (`read_ahead_mb`, default a quarter of `max_held_mb`, at least 16 MiB):
//! a reader waits for room before it hands on a read.
//!
//! A failed read is retried, never given up on while following (`fovea
//! serve`): throttling, server errors, timeouts and lost connections are
//! retried with exponential backoff and jitter (100 ms doubling to 30 s;
//! an expired iterator is asked for again at once) from the last record
//! read, and the shard's state (`reading`, `at_tip`, `retrying`) and its
//! retries show in [`ChangeSource::lag`] (metrics). In `fovea replay`
//! retries stop after [`REPLAY_RETRY_FOR`] of failing. A permanent failure
//! (the stream or shard gone, access denied, a rejected request) ends the
//! input at once, naming the shard.

mod backlog;
mod fanout;
mod options;
mod shard;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_kinesis::Client;
use fovea_core::cdc::ordering::{Held, Link, Origin, SequenceNumber, ShardIx, Tail, TxnOrder, keep_earliest, link_of};
use fovea_core::cdc::source::{ChangeSource, Lag, Polled, RecordSink, Resume, ShardLag, ShardState};
use fovea_core::cdc::{ChangeRecord, InputFormat, SourcePosition, decode_line};
use fovea_core::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use tokio::sync::mpsc;

pub use backlog::{ConsumerState, ShardBacklog, checkpoint_backlog, consumer_states};
pub use options::{KinesisOptions, Start};
use shard::*;

/// Records asked for per GetRecords (the service maximum).
const GET_LIMIT: i32 = 10_000;
/// Events drained per poll before the sink gets what is ready.
const EVENTS_PER_POLL: usize = 64;
/// How long `fovea replay` retries a shard's failing reads before it gives
/// up (`fovea serve` does not give up on transient failures).
pub const REPLAY_RETRY_FOR: Duration = Duration::from_secs(300);
/// Longest a fan-out subscription lasts (Kinesis ends it after five minutes).
pub const MAX_SUBSCRIPTION: Duration = Duration::from_secs(300);
/// Least read-ahead room: one GetRecords answer holds up to 10 MiB.
const MIN_READ_AHEAD: usize = 16 << 20;

/// Where a shard resumes, as checkpoints record it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SavedShard {
    /// Read again from this record (a transaction not applied yet has it).
    At(SequenceNumber),
    /// Read on after this record.
    After(SequenceNumber),
    /// Closed and read to its end.
    Finished,
}

/// A checkpoint's state of the input.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SavedState {
    /// The last source transaction applied.
    tail: Option<Tail>,
    /// By `stream/shardId`.
    shards: BTreeMap<String, SavedShard>,
}

impl SavedState {
    /// The state `checkpoint` recorded for input `name` (none recorded, or
    /// a checkpoint of another input: the default, nothing read yet).
    fn of(name: &str, checkpoint: Option<&Resume>) -> Result<Self> {
        match checkpoint.filter(|c| c.input == name).and_then(|c| c.state.as_deref()) {
            Some(s) => serde_json::from_str(s).map_err(|e| Error::Corrupt {
                what: format!("the checkpointed state of input {name}"),
                reason: e.to_string(),
            }),
            None => Ok(SavedState::default()),
        }
    }
}

struct Shard {
    stream: String,
    id: String,
    parents: Vec<String>,
    /// Closed when listed (has an ending sequence number).
    closed: bool,
    saved: Option<SavedShard>,
    started: bool,
    finished: bool,
    last_read: Option<SequenceNumber>,
    /// Its last read was empty with nothing behind.
    at_tip: bool,
    millis_behind: u64,
    records: u64,
    /// Its reads are failing and being retried.
    retrying: bool,
    /// Reads retried.
    retries: u64,
    /// Read by enhanced fan-out (its reader has not fallen back to polling).
    fan_out: bool,
}

impl Shard {
    fn name(&self) -> String {
        format!("{}/{}", self.stream, self.id)
    }
}

/// A record as read, decoded by its shard's reader (decoding runs on the
/// readers' threads, beside the applying one).
struct KinesisRecord {
    seq: SequenceNumber,
    /// Its size as put.
    bytes: usize,
    decoded: Decoded,
}

/// What a record decoded to. The change is held in place, as in
/// [`ChangeRecord`] itself: a box per record would be allocated on a
/// reader's thread and freed on the applying one.
#[allow(clippy::large_enum_variant)]
enum Decoded {
    /// Nothing to apply (a tombstone, a control record).
    Skip,
    /// Its place and its change.
    Record(Link, ChangeRecord),
    /// Why it cannot be applied (and its place, when that much was read).
    Failed(Option<Link>, String),
}

/// How readers decode records.
#[derive(Clone, Copy)]
struct Decoding {
    format: InputFormat,
    max_record_bytes: usize,
}

impl Decoding {
    fn decode(&self, data: &[u8], partition_key: &str) -> Decoded {
        if data.len() > self.max_record_bytes {
            return Decoded::Failed(
                None,
                format!(
                    "record of {} bytes is over the limit of {} (max_record_kb)",
                    data.len(),
                    self.max_record_bytes
                ),
            );
        }
        let line = match std::str::from_utf8(data) {
            Ok(l) => l,
            Err(e) => return Decoded::Failed(None, format!("record is not UTF-8 JSON: {e}")),
        };
        let link = match link_of(line, self.format) {
            Ok(Link::Skip) => return Decoded::Skip,
            Ok(l) => l,
            Err(m) => return Decoded::Failed(None, m),
        };
        match decode_line(line, SourcePosition::default(), self.format) {
            Ok(ChangeRecord::Skip) => Decoded::Skip,
            Ok(record) => Decoded::Record(link, with_key(record, partition_key)),
            Err(fovea_core::Error::Input { message, .. }) => Decoded::Failed(Some(link), message),
            Err(e) => Decoded::Failed(Some(link), e.to_string()),
        }
    }
}

enum Event {
    /// A read; `_room` is its share of the read-ahead cap, given back once
    /// the event is taken in.
    Records {
        ix: ShardIx,
        records: Vec<KinesisRecord>,
        millis_behind: u64,
        at_tip: bool,
        _room: tokio::sync::OwnedSemaphorePermit,
    },
    Closed {
        ix: ShardIx,
    },
    /// Enhanced fan-out was refused for the shard: it is read by polling now.
    Polling {
        ix: ShardIx,
    },
    /// A read failed and is retried after a pause (the `attempt`-th time in a row).
    Retrying {
        ix: ShardIx,
        attempt: u32,
        message: String,
    },
    Failed {
        ix: ShardIx,
        message: String,
    },
}

/// A transaction handed to the sink and not yet covered by a confirmed
/// checkpoint: what a checkpoint resuming before it must read again.
struct ReleasedMark {
    /// Ordinal of its first record.
    first: u64,
    /// The tail before it.
    tail_before: Option<Tail>,
    /// Its earliest record per shard.
    origins: Vec<(ShardIx, SequenceNumber)>,
}

/// Kinesis streams as a [`ChangeSource`] (see the module docs).
pub struct KinesisSource {
    options: KinesisOptions,
    name: String,
    runtime: tokio::runtime::Runtime,
    client: Client,
    shards: Vec<Shard>,
    by_name: HashMap<String, ShardIx>,
    tx: mpsc::Sender<Event>,
    rx: mpsc::Receiver<Event>,
    order: TxnOrder,
    /// Ordinal of the next record pushed (positions are ordinals).
    next: u64,
    released: VecDeque<ReleasedMark>,
    /// Direct mode: where each group of records of one transaction began.
    group_starts: VecDeque<(u64, Origin)>,
    last_group: Option<(Option<fovea_core::cdc::SmolStr>, bool)>,
    /// More than one shard: records must carry transaction details.
    ordered: bool,
    /// Initial-load records of the current read: the first one's origin, and all.
    load: Option<(Origin, Vec<ChangeRecord>)>,
    stop: Arc<AtomicBool>,
    /// Room for records read ahead, in bytes (see the module docs).
    room: Arc<tokio::sync::Semaphore>,
    /// By stream: the enhanced fan-out consumer (ARN) its shards are read
    /// as (`None`: by polling).
    consumers: HashMap<String, Option<Arc<str>>>,
}

impl KinesisSource {
    /// Lists the streams' shards and starts reading them, resuming where
    /// `checkpoint` stopped if it read these streams.
    pub fn open(options: KinesisOptions, checkpoint: Option<&Resume>) -> Result<Self> {
        let name = options.name();
        let saved = SavedState::of(&name, checkpoint)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fovea-kinesis")
            .enable_all()
            .build()?;
        let client = runtime.block_on(client())?;
        let (tx, rx) = mpsc::channel(EVENTS_PER_POLL * 4);
        let order = TxnOrder::new(0, saved.tail.clone(), options.max_held_bytes).with_gap_grace(options.gap_grace);
        let next = checkpoint.filter(|c| c.input == name).map_or(1, |c| c.position.line.max(1));
        let mut source = KinesisSource {
            order,
            name,
            runtime,
            client,
            shards: Vec::new(),
            by_name: HashMap::new(),
            tx,
            rx,
            next,
            released: VecDeque::new(),
            group_starts: VecDeque::new(),
            last_group: None,
            ordered: options.streams.len() > 1,
            load: None,
            stop: Arc::new(AtomicBool::new(false)),
            room: Arc::new(tokio::sync::Semaphore::new(options.read_ahead())),
            consumers: HashMap::new(),
            options,
        };
        let first_run = saved.shards.is_empty();
        for stream in source.options.streams.clone() {
            if let Some(name) = source.options.consumer.clone() {
                let consumer = source.retried(|client| {
                    let (stream, name) = (stream.clone(), name.clone());
                    async move { fanout::consumer(&client, &stream, &name).await }
                })?;
                if let Some(arn) = &consumer {
                    tracing::info!(stream, consumer = %arn, "reading the stream by enhanced fan-out");
                }
                source.consumers.insert(stream.clone(), consumer.map(Arc::from));
            }
            source.list(&stream, &saved, first_run)?;
        }
        source.start_ready()?;
        Ok(source)
    }

    /// Lists `stream`'s shards and registers the new ones.
    fn list(&mut self, stream: &str, saved: &SavedState, first_run: bool) -> Result<()> {
        let listed = self.retried(|client| list_shards(client, stream.to_owned()))?;
        for shard in listed {
            let key = format!("{stream}/{}", shard.id);
            if self.by_name.contains_key(&key) {
                continue;
            }
            let mut saved_shard = saved.shards.get(&key).cloned();
            // Starting at the newest records: what closed before is history.
            if first_run && self.options.start == Start::Latest && shard.closed {
                saved_shard = Some(SavedShard::Finished);
            }
            let ix = self.shards.len();
            self.by_name.insert(key, ix);
            let finished = saved_shard == Some(SavedShard::Finished);
            self.shards.push(Shard {
                stream: stream.to_owned(),
                id: shard.id,
                parents: shard.parents,
                closed: shard.closed,
                saved: saved_shard,
                started: false,
                finished,
                last_read: None,
                at_tip: false,
                millis_behind: 0,
                records: 0,
                retrying: false,
                retries: 0,
                fan_out: false,
            });
            self.order.ensure_shard(ix);
            if finished {
                self.order.set_finished(ix);
            }
        }
        self.ordered |= self.shards.len() > 1;
        Ok(())
    }

    /// Runs a stream-level request on the IO runtime, retried while it fails
    /// transiently as shard reads are (the sink waits), in `fovea replay`
    /// for [`REPLAY_RETRY_FOR`] at most.
    fn retried<T, F>(&self, request: impl Fn(Client) -> F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<T, Failure>>,
    {
        let (began, mut pauses, mut attempt) = (std::time::Instant::now(), retry_pauses(), 0u32);
        let retry_for = (!self.options.follow).then_some(REPLAY_RETRY_FOR);
        loop {
            match self.runtime.block_on(request(self.client.clone())) {
                Ok(out) => return Ok(out),
                Err(f) if f.transient && retry_for.is_none_or(|limit| began.elapsed() < limit) => {
                    attempt += 1;
                    if attempt == 1 || attempt % 10 == 0 {
                        tracing::warn!(attempt, "{}; retrying", f.message);
                    }
                    std::thread::sleep(pauses.next().unwrap_or(Duration::from_secs(30)));
                }
                Err(f) => return Err(self.error(f.message)),
            }
        }
    }

    /// Starts the reader of every shard whose parents are read to their end.
    fn start_ready(&mut self) -> Result<()> {
        for ix in 0..self.shards.len() {
            let shard = &self.shards[ix];
            if shard.started || shard.finished {
                continue;
            }
            let parents_done = shard
                .parents
                .iter()
                .all(|p| self.by_name.get(&format!("{}/{p}", shard.stream)).is_none_or(|&i| self.shards[i].finished));
            if !parents_done {
                continue;
            }
            let is_child = shard.parents.iter().any(|p| self.by_name.contains_key(&format!("{}/{p}", shard.stream)));
            let start = match &shard.saved {
                Some(SavedShard::At(s)) => ShardStart::At(s.clone()),
                Some(SavedShard::After(s)) => ShardStart::After(s.clone()),
                Some(SavedShard::Finished) => continue,
                None if is_child || self.options.start == Start::TrimHorizon => ShardStart::TrimHorizon,
                None if shard.closed => ShardStart::TrimHorizon,
                None => ShardStart::Latest,
            };
            tracing::debug!(shard = %shard.name(), ?start, "reading shard");
            let reader = ShardReader {
                client: self.client.clone(),
                stream: shard.stream.clone(),
                id: shard.id.clone(),
                ix,
                tx: self.tx.clone(),
                poll: self.options.poll,
                decoding: Decoding { format: self.options.format, max_record_bytes: self.options.max_record_bytes },
                stop: Arc::clone(&self.stop),
                room: Arc::clone(&self.room),
                room_size: self.options.read_ahead(),
                retry_for: (!self.options.follow).then_some(REPLAY_RETRY_FOR),
                // A shard closed when listed is history: polled to its end,
                // which GetRecords marks (no next iterator).
                consumer: if shard.closed { None } else { self.consumers.get(&shard.stream).cloned().flatten() },
                renew: self.options.renew,
            };
            self.shards[ix].fan_out = reader.consumer.is_some();
            self.runtime.spawn(reader.run(start));
            self.shards[ix].started = true;
        }
        Ok(())
    }

    fn error(&self, message: impl Into<String>) -> Error {
        Error::Source { input: self.name.clone(), message: message.into() }
    }

    /// Names a record in messages.
    fn at(&self, origin: &Origin) -> String {
        let shard = &self.shards[origin.shard];
        format!("stream {}, shard {}, sequence number {}", shard.stream, shard.id, origin.seq)
    }

    fn record_error(&self, origin: &Origin, link: Option<&Link>, message: impl std::fmt::Display) -> Error {
        Error::Input {
            position: SourcePosition { line: self.next, offset: 0 },
            table: None,
            txid: link.and_then(Link::txid).map(str::to_owned),
            message: format!("{} ({})", message, self.at(origin)),
        }
    }

    /// Takes one record read from a shard.
    fn take_record(
        &mut self,
        sink: &mut dyn RecordSink,
        origin: Origin,
        bytes: usize,
        decoded: Decoded,
    ) -> Result<u64> {
        let (link, record) = match decoded {
            Decoded::Skip => return Ok(0),
            Decoded::Record(link, record) => (link, record),
            Decoded::Failed(link, message) => return Err(self.record_error(&origin, link.as_ref(), message)),
        };
        if !self.options.atomic {
            return self.push_alone(sink, record, origin);
        }
        if link == Link::Snapshot {
            // Applied with the other load records of its read, before
            // anything later of its shard (a key's later changes are in the
            // same shard, after it).
            match &mut self.load {
                Some((first, rows)) if first.shard == origin.shard => rows.push(record),
                _ => {
                    let pushed = self.flush_load(sink)?;
                    self.load = Some((origin, vec![record]));
                    return Ok(pushed);
                }
            }
            return Ok(0);
        }
        if link == Link::Unlinked {
            if self.ordered {
                return Err(self.error(format!(
                    "the record at {} has no transaction details, and its stream has several shards (or several streams are read): its transaction cannot be rebuilt. Help: AWS DMS — set IncludeTransactionDetails=true in the Kinesis endpoint settings; Debezium — set provide.transaction.metadata=true; or add &atomic=false to apply each row on its own",
                    self.at(&origin)
                )));
            }
            return self.push_direct(sink, record, origin);
        }
        let held = Held { record, origin, bytes };
        let origin = held.origin.clone();
        self.order
            .add(link.clone(), held, &|t: &str| sink.is_applied(t))
            .map_err(|m| self.record_error(&origin, Some(&link), m))?;
        Ok(0)
    }

    /// Applies the initial-load records gathered from one read of a shard
    /// as one mirror transaction, named by the first one's position (read
    /// again after a restart, it is skipped).
    fn flush_load(&mut self, sink: &mut dyn RecordSink) -> Result<u64> {
        let Some((origin, rows)) = self.load.take() else { return Ok(0) };
        let txid = format!("kinesis-load:{}/{}", self.shards[origin.shard].name(), origin.seq);
        self.push_made(sink, txid, rows, origin, None)
    }

    /// `&atomic=false`: a row is a transaction of its own.
    fn push_alone(&mut self, sink: &mut dyn RecordSink, record: ChangeRecord, origin: Origin) -> Result<u64> {
        let ChangeRecord::Row(row) = record else { return Ok(0) };
        let txid = format!("kinesis-row:{}/{}", self.shards[origin.shard].name(), origin.seq);
        let commit_us = row.commit_us;
        self.push_made(sink, txid, vec![ChangeRecord::Row(row)], origin, commit_us)
    }

    /// Pushes `rows`, read from one shard starting at `origin`, as one
    /// transaction made for them and named `txid` (read again after a
    /// restart, it is skipped by that name); returns the rows pushed.
    fn push_made(
        &mut self,
        sink: &mut dyn RecordSink,
        txid: String,
        rows: Vec<ChangeRecord>,
        origin: Origin,
        commit_us: Option<i64>,
    ) -> Result<u64> {
        self.released.push_back(ReleasedMark {
            first: self.next,
            tail_before: self.order.tail().cloned(),
            origins: vec![(origin.shard, origin.seq.clone())],
        });
        let n = rows.len() as u64;
        self.push(sink, ChangeRecord::Begin { txid: txid.clone(), commit_us }, &origin)?;
        for r in rows {
            // The rows belong to the transaction made for them.
            let r = match r {
                ChangeRecord::Row(mut row) => {
                    row.txid = Some(txid.as_str().into());
                    ChangeRecord::Row(row)
                }
                other => other,
            };
            self.push(sink, r, &origin)?;
        }
        self.push(
            sink,
            ChangeRecord::End { txid, event_count: Some(n), per_table: Vec::new(), commit_us: None },
            &origin,
        )?;
        Ok(n)
    }

    /// Pushes one record at the next ordinal; a sink error names `origin`.
    fn push(&mut self, sink: &mut dyn RecordSink, record: ChangeRecord, origin: &Origin) -> Result<()> {
        let n = self.next;
        self.next += 1;
        let at = |n: u64| SourcePosition { line: n, offset: 0 };
        sink.push(record, at(n), at(n + 1)).map_err(|e| self.with_origin(e, origin))
    }

    /// One shard without transaction details: records in shard order, as
    /// from a file (the sink groups them by transaction id).
    fn push_direct(&mut self, sink: &mut dyn RecordSink, record: ChangeRecord, origin: Origin) -> Result<u64> {
        let group = match &record {
            ChangeRecord::Row(r) => Some((r.txid.clone(), r.snapshot.is_some())),
            _ => None,
        };
        if group.is_some() && group != self.last_group {
            self.group_starts.push_back((self.next, origin.clone()));
            self.last_group = group;
        }
        self.push(sink, record, &origin)?;
        Ok(1)
    }

    /// Hands every transaction that is ready to the sink.
    fn release(&mut self, sink: &mut dyn RecordSink, at_rest: bool) -> Result<u64> {
        let mut pushed = 0;
        loop {
            let tail_before = self.order.tail().cloned();
            let Some(txn) = self.order.release(at_rest) else { break };
            if txn.gap {
                tracing::warn!(txid = %txn.txid, "the source transaction before this one in the commit chain never arrived (filtered by the producer, or before where reading started): applied after the gap grace, or at rest");
            }
            let mut origins = HashMap::new();
            for h in &txn.records {
                keep_earliest(&mut origins, &h.origin);
            }
            self.released.push_back(ReleasedMark {
                first: self.next,
                tail_before,
                origins: origins.into_iter().collect(),
            });
            for h in txn.records {
                self.push(sink, h.record, &h.origin)?;
                pushed += 1;
            }
        }
        Ok(pushed)
    }

    fn with_origin(&self, e: Error, origin: &Origin) -> Error {
        match e {
            Error::Input { position, table, txid, message } => {
                Error::Input { position, table, txid, message: format!("{message} ({})", self.at(origin)) }
            }
            other => other,
        }
    }

    fn handle(&mut self, sink: &mut dyn RecordSink, event: Event) -> Result<u64> {
        match event {
            Event::Records { ix, records, millis_behind, at_tip, _room } => {
                if std::mem::take(&mut self.shards[ix].retrying) {
                    tracing::info!(shard = %self.shards[ix].name(), "the shard's reads succeed again");
                }
                let mut pushed = 0;
                for r in records {
                    let origin = Origin { shard: ix, seq: r.seq.clone() };
                    pushed += self.take_record(sink, origin, r.bytes, r.decoded)?;
                    let shard = &mut self.shards[ix];
                    shard.last_read = Some(r.seq);
                    shard.records += 1;
                }
                pushed += self.flush_load(sink)?;
                self.shards[ix].millis_behind = millis_behind;
                self.shards[ix].at_tip = at_tip;
                self.order.set_at_tip(ix, at_tip);
                Ok(pushed)
            }
            Event::Closed { ix } => {
                tracing::info!(shard = %self.shards[ix].name(), "shard read to its end");
                self.shards[ix].finished = true;
                self.order.set_finished(ix);
                // Its children (a split or a merge) start now.
                let stream = self.shards[ix].stream.clone();
                self.list(&stream, &SavedState::default(), false)?;
                self.start_ready()?;
                Ok(0)
            }
            Event::Polling { ix } => {
                self.shards[ix].fan_out = false;
                Ok(0)
            }
            Event::Retrying { ix, attempt, message } => {
                let shard = &mut self.shards[ix];
                shard.retrying = true;
                shard.retries += 1;
                // The first failure of a streak, then every tenth.
                if attempt == 1 || attempt % 10 == 0 {
                    tracing::warn!(shard = %shard.name(), attempt, "reading the shard failed; retrying: {message}");
                }
                Ok(0)
            }
            Event::Failed { ix, message } => Err(self.error(format!("shard {}: {message}", self.shards[ix].name()))),
        }
    }

    /// Every shard is read to its tip or its end, and none waits to start.
    fn caught_up(&self) -> bool {
        self.shards.iter().all(|s| s.finished || (s.started && s.at_tip))
    }
}

impl ChangeSource for KinesisSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn poll(&mut self, sink: &mut dyn RecordSink) -> Result<Polled> {
        let mut polled = Polled::default();
        // Wait up to a poll interval for the first event, then take what is there.
        let wait = self.options.poll;
        let first = self.runtime.block_on(async { tokio::time::timeout(wait, self.rx.recv()).await });
        let mut events = Vec::new();
        if let Ok(Some(e)) = first {
            events.push(e);
            while events.len() < EVENTS_PER_POLL {
                match self.rx.try_recv() {
                    Ok(e) => events.push(e),
                    Err(_) => break,
                }
            }
        }
        for e in events {
            match self.handle(sink, e) {
                Ok(n) => polled.records += n,
                Err(err) => {
                    // What was complete before the failing record is applied
                    // (and kept by the final checkpoint); then stop.
                    if let Err(second) = self.release(sink, false) {
                        tracing::error!("applying the transactions before the failure failed too: {second}");
                    }
                    return Err(err);
                }
            }
        }
        polled.records += self.release(sink, false)?;
        if !self.options.follow && self.rx.is_empty() && self.caught_up() {
            // At rest: a DMS transaction without a successor is complete.
            polled.records += self.release(sink, true)?;
            let (txns, bytes) = self.order.held();
            if txns > 0 {
                tracing::warn!(
                    transactions = txns,
                    bytes,
                    "every shard is read to its tip, but some source transactions are incomplete: they stay unapplied, and the next run reads them again"
                );
            }
            polled.end = Some(self.position());
        }
        Ok(polled)
    }

    fn position(&self) -> SourcePosition {
        SourcePosition { line: self.next, offset: 0 }
    }

    fn state_at(&mut self, position: SourcePosition) -> Result<Option<String>> {
        // Transactions from `position` on are not in the checkpoint: their
        // records are read again.
        let undone: Vec<&ReleasedMark> = self.released.iter().filter(|m| m.first >= position.line).collect();
        let tail = match undone.first() {
            Some(m) => m.tail_before.clone(),
            None => self.order.tail().cloned(),
        };
        let mut at: HashMap<ShardIx, SequenceNumber> = self.order.earliest_held();
        for m in &undone {
            for (shard, seq) in &m.origins {
                keep_earliest(&mut at, &Origin { shard: *shard, seq: seq.clone() });
            }
        }
        // A group the sink has not finished (one shard, no details).
        if let Some((_, origin)) = self.group_starts.iter().find(|(n, _)| *n == position.line)
            && position.line < self.next
        {
            keep_earliest(&mut at, origin);
        }
        let mut shards = BTreeMap::new();
        for (ix, shard) in self.shards.iter().enumerate() {
            let saved = match (at.get(&ix), &shard.last_read) {
                (Some(seq), _) => SavedShard::At(seq.clone()),
                _ if shard.finished => SavedShard::Finished,
                (None, Some(seq)) => SavedShard::After(seq.clone()),
                // Not read yet: where it was to start.
                (None, None) => match &shard.saved {
                    Some(s) => s.clone(),
                    None => continue,
                },
            };
            shards.insert(shard.name(), saved);
        }
        let state = SavedState { tail, shards };
        Ok(Some(serde_json::to_string(&state).map_err(|e| Error::Invariant(format!("input state: {e}")))?))
    }

    fn confirm(&mut self, position: SourcePosition) -> Result<()> {
        while self.released.front().is_some_and(|m| m.first < position.line) {
            self.released.pop_front();
        }
        // The newest group start before `position` may still be open.
        while self.group_starts.len() > 1 && self.group_starts[1].0 <= position.line {
            self.group_starts.pop_front();
        }
        Ok(())
    }

    fn lag(&mut self) -> Lag {
        let (txns, bytes) = self.order.held();
        Lag {
            bytes: None,
            shards: self
                .shards
                .iter()
                .filter(|s| s.started && !s.finished)
                .map(|s| ShardLag {
                    name: s.name(),
                    millis_behind: s.millis_behind,
                    records: s.records,
                    state: if s.retrying {
                        ShardState::Retrying
                    } else if s.at_tip {
                        ShardState::AtTip
                    } else {
                        ShardState::Reading
                    },
                    retries: s.retries,
                    fan_out: s.fan_out,
                })
                .collect(),
            held: (txns as u64, bytes as u64),
        }
    }
}

impl Drop for KinesisSource {
    fn drop(&mut self) {
        // Release: the readers' Acquire loads see it and return.
        self.stop.store(true, Ordering::Release);
    }
}

/// Debezium Server partitions by the record key, as JSON: a row without
/// a key gets its key columns from there (DMS's `schema.table` keys are not
/// JSON objects and change nothing).
fn with_key(record: ChangeRecord, partition_key: &str) -> ChangeRecord {
    let ChangeRecord::Row(mut row) = record else { return record };
    if row.key.is_none()
        && partition_key.starts_with('{')
        && let Ok(Json::Object(mut key)) = serde_json::from_str::<Json>(partition_key)
    {
        // With schemas enabled the key is an envelope too.
        if key.contains_key("schema")
            && let Some(Json::Object(payload)) = key.remove("payload")
        {
            key = payload;
        }
        let columns: Vec<(String, Json)> = key.into_iter().collect();
        row.key_names = Some(columns.iter().map(|(n, _)| n.clone()).collect());
        row.key = Some(columns);
    }
    ChangeRecord::Row(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_streams_and_parameters_and_names_what_is_wrong() {
        let o = KinesisOptions::parse(
            "kinesis://a,b?format=dms&start=latest&atomic=false&poll_ms=5&max_held_mb=64&max_record_kb=100",
            InputFormat::Auto,
            true,
        )
        .unwrap();
        assert_eq!(o.streams, ["a", "b"]);
        assert_eq!((o.format, o.start, o.atomic, o.follow), (InputFormat::Dms, Start::Latest, false, true));
        assert_eq!((o.poll, o.max_held_bytes, o.max_record_bytes), (Duration::from_millis(5), 64 << 20, 100 << 10));
        assert_eq!(o.name(), "kinesis://a,b");
        let defaults = KinesisOptions::parse("kinesis://s", InputFormat::Debezium, false).unwrap();
        assert_eq!(
            (defaults.format, defaults.start, defaults.atomic),
            (InputFormat::Debezium, Start::TrimHorizon, true)
        );
        assert!(defaults.max_held_bytes >= 64 << 20);
        assert_eq!((defaults.consumer, defaults.renew), (None, MAX_SUBSCRIPTION));
        let fan_out = KinesisOptions::parse("kinesis://s?consumer=fovea-prod.1&renew_secs=60", InputFormat::Auto, true);
        let fan_out = fan_out.unwrap();
        assert_eq!((fan_out.consumer.as_deref(), fan_out.renew), (Some("fovea-prod.1"), Duration::from_secs(60)));
        for (bad, says) in [
            ("kinesis://", "no stream"),
            ("kinesis://s?consumer=", "consumer name of 1 to 128"),
            ("kinesis://s?consumer=a/b", "consumer name of 1 to 128"),
            ("kinesis://s?consumer=c&renew_secs=0", "1 to 300"),
            ("kinesis://s?consumer=c&renew_secs=301", "1 to 300"),
            ("kinesis://s?renew_secs=60", "name its consumer=NAME"),
            ("kinesis://s?start=now", "trim_horizon or latest"),
            ("kinesis://s?poll_ms=x", "poll_ms"),
            ("kinesis://s?max_held_mb=17592186044416", "at most 17592186044415 megabytes"),
            ("kinesis://s?max_record_kb=18014398509481984", "at most 18014398509481983 kilobytes"),
            ("kinesis://s?shard=1", "unknown parameter"),
            ("kinesis://s?format=avro", "avro"),
        ] {
            let e = KinesisOptions::parse(bad, InputFormat::Auto, false).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn a_debezium_server_partition_key_gives_a_row_its_key() {
        let row = |key: Option<Vec<(String, Json)>>| {
            ChangeRecord::Row(fovea_core::cdc::RowChange {
                table: "s.t".into(),
                op: fovea_core::cdc::RowOp::Insert,
                key,
                before: None,
                after: None,
                txid: None,
                commit_us: None,
                snapshot: None,
                declared: None,
                key_names: None,
                in_transaction_block: false,
                omits_nulls: false,
                typed: None,
            })
        };
        let keyed = |r: ChangeRecord| match r {
            ChangeRecord::Row(r) => r.key_names,
            _ => None,
        };
        assert_eq!(keyed(with_key(row(None), r#"{"a":1,"b":"x"}"#)), Some(vec!["a".to_owned(), "b".to_owned()]));
        let envelope = r#"{"schema":{"type":"struct"},"payload":{"id":7}}"#;
        assert_eq!(keyed(with_key(row(None), envelope)), Some(vec!["id".to_owned()]));
        // DMS partition keys (schema-table) and transaction ids change nothing.
        assert_eq!(keyed(with_key(row(None), "public.orders")), None);
        assert_eq!(keyed(with_key(row(None), "31203")), None);
    }
}
