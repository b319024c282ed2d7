//! One shard's reader: GetShardIterator and GetRecords (or enhanced
//! fan-out's subscriptions, `fanout`) on the IO runtime,
//! retries with backoff, read-ahead bounded in bytes, events to the source;
//! listing a stream's shards.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::DisplayErrorContext;
use aws_sdk_kinesis::types::ShardIteratorType;
use fovea_core::cdc::ordering::{SequenceNumber, ShardIx};
use fovea_core::{Error, Result};
use tokio::sync::mpsc;

use super::*;

/// Where a shard reader begins.
#[derive(Clone, Debug)]
pub(super) enum ShardStart {
    At(SequenceNumber),
    After(SequenceNumber),
    TrimHorizon,
    Latest,
}

impl ShardStart {
    /// GetShardIterator's and SubscribeToShard's name of the start.
    pub(super) fn iterator_type(&self) -> (ShardIteratorType, Option<String>) {
        match self {
            ShardStart::At(s) => (ShardIteratorType::AtSequenceNumber, Some(s.0.clone())),
            ShardStart::After(s) => (ShardIteratorType::AfterSequenceNumber, Some(s.0.clone())),
            ShardStart::TrimHorizon => (ShardIteratorType::TrimHorizon, None),
            ShardStart::Latest => (ShardIteratorType::Latest, None),
        }
    }
}

/// As `fovea status` shows where a shard resumes: `at SEQ`, `after SEQ`,
/// `trim_horizon`, `latest`.
impl std::fmt::Display for ShardStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShardStart::At(s) => write!(f, "at {}", s.0),
            ShardStart::After(s) => write!(f, "after {}", s.0),
            ShardStart::TrimHorizon => f.write_str("trim_horizon"),
            ShardStart::Latest => f.write_str("latest"),
        }
    }
}

/// Reads one shard into the event channel until it is closed and read to
/// its end (then `Closed`), a request fails for good (`Failed`), or the
/// source stops. Transient failures are retried (see the module docs).
pub(super) struct ShardReader {
    pub(super) client: Client,
    pub(super) stream: String,
    pub(super) id: String,
    pub(super) ix: ShardIx,
    pub(super) tx: mpsc::Sender<Event>,
    pub(super) poll: Duration,
    pub(super) decoding: Decoding,
    pub(super) stop: Arc<AtomicBool>,
    /// Room for records read ahead, in bytes (shared by the readers).
    pub(super) room: Arc<tokio::sync::Semaphore>,
    /// The room's size: no read waits for more.
    pub(super) room_size: usize,
    /// How long failing reads are retried before the shard fails (`None`:
    /// while the source runs).
    pub(super) retry_for: Option<Duration>,
    /// Read by enhanced fan-out as this consumer (its ARN), else by polling.
    pub(super) consumer: Option<Arc<str>>,
    /// How long a fan-out subscription is kept before it is renewed.
    pub(super) renew: Duration,
}

/// A streak of failed requests: since when, the pauses before the next
/// retries, and how many were made.
#[derive(Default)]
pub(super) struct Retries {
    failing: Option<(std::time::Instant, Box<dyn Iterator<Item = Duration> + Send>, u32)>,
}

/// A failed request: its message, and whether a retry may succeed.
pub(super) struct Failure {
    pub(super) message: String,
    pub(super) transient: bool,
}

/// Whether a failed Kinesis call may succeed if retried: throttling,
/// server errors, timeouts and connection failures (not a missing stream,
/// denied access or a rejected request).
pub(super) fn transient<E: aws_sdk_kinesis::error::ProvideErrorMetadata>(
    e: &aws_sdk_kinesis::error::SdkError<E, aws_sdk_kinesis::config::http::HttpResponse>,
) -> bool {
    use aws_sdk_kinesis::error::SdkError;
    match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => true,
        SdkError::ServiceError(s) => {
            s.raw().status().is_server_error()
                || s.raw().status().as_u16() == 429
                || matches!(
                    s.err().code(),
                    Some(
                        "ProvisionedThroughputExceededException"
                            | "KMSThrottlingException"
                            | "LimitExceededException"
                            | "ThrottlingException"
                            | "InternalFailure"
                            | "ServiceUnavailable"
                    )
                )
        }
        _ => false,
    }
}

pub(super) fn failure<E>(
    call: &str,
    e: aws_sdk_kinesis::error::SdkError<E, aws_sdk_kinesis::config::http::HttpResponse>,
) -> Failure
where
    E: aws_sdk_kinesis::error::ProvideErrorMetadata + std::error::Error + 'static,
{
    Failure { transient: transient(&e), message: format!("{call}: {}", DisplayErrorContext(&e)) }
}

/// Pauses between retries of failing reads: 100 ms doubling to 30 s, with
/// jitter (shards throttled together do not retry in step).
pub(super) fn retry_pauses() -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(30))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

impl ShardReader {
    pub(super) async fn run(self, start: ShardStart) {
        let read = match self.consumer.clone() {
            Some(consumer) => match self.subscribe(&consumer, start).await {
                Ok(super::fanout::Subscribed::Poll(from)) => {
                    if self.tx.send(Event::Polling { ix: self.ix }).await.is_err() {
                        return;
                    }
                    self.read(from).await
                }
                Ok(super::fanout::Subscribed::Done) => Ok(()),
                Err(message) => Err(message),
            },
            None => self.read(start).await,
        };
        if let Err(message) = read {
            let _ = self.tx.send(Event::Failed { ix: self.ix, message }).await;
        }
    }

    /// After a failed request: `Err` when the shard fails (a permanent
    /// failure, or retries past `retry_for`); else the pause is taken and
    /// `Ok(false)` means the source is gone.
    pub(super) async fn retry_after(&self, retries: &mut Retries, f: Failure) -> std::result::Result<bool, String> {
        if !f.transient {
            return Err(f.message);
        }
        let (since, pauses, attempts) =
            retries.failing.get_or_insert_with(|| (std::time::Instant::now(), Box::new(retry_pauses()), 0));
        *attempts += 1;
        if self.retry_for.is_some_and(|limit| since.elapsed() >= limit) {
            return Err(format!(
                "{} (failing for {:.0} s, {attempts} attempts)",
                f.message,
                since.elapsed().as_secs_f64()
            ));
        }
        let pause = pauses.next().unwrap_or(Duration::from_secs(30));
        let event = Event::Retrying { ix: self.ix, attempt: *attempts, message: f.message };
        if self.tx.send(event).await.is_err() {
            return Ok(false);
        }
        tokio::time::sleep(pause).await;
        Ok(true)
    }

    /// Records as read, decoded on this reader's thread.
    pub(super) fn decoded<'a>(
        &self,
        records: impl Iterator<Item = &'a aws_sdk_kinesis::types::Record>,
    ) -> Vec<KinesisRecord> {
        records
            .map(|r| KinesisRecord {
                seq: SequenceNumber(r.sequence_number().to_owned()),
                bytes: r.data().as_ref().len(),
                decoded: self.decoding.decode(r.data().as_ref(), r.partition_key().unwrap_or_default()),
            })
            .collect()
    }

    /// Hands a read on to the source once there is room for it (a read
    /// larger than the cap waits for all of it); `false` when the source is
    /// gone.
    pub(super) async fn hand_on(&self, records: Vec<KinesisRecord>, millis_behind: u64, at_tip: bool) -> bool {
        let bytes: usize = records.iter().map(|r| r.bytes).sum();
        let want = bytes.clamp(1, self.room_size).min(u32::MAX as usize) as u32;
        let Ok(room) = Arc::clone(&self.room).acquire_many_owned(want).await else { return false };
        let event = Event::Records { ix: self.ix, records, millis_behind, at_tip, _room: room };
        self.tx.send(event).await.is_ok()
    }

    pub(super) async fn iterator(&self, start: &ShardStart) -> std::result::Result<Option<String>, Failure> {
        let (kind, seq) = start.iterator_type();
        let out = self
            .client
            .get_shard_iterator()
            .stream_name(&self.stream)
            .shard_id(&self.id)
            .shard_iterator_type(kind)
            .set_starting_sequence_number(seq)
            .send()
            .await
            .map_err(|e| failure("GetShardIterator", e))?;
        Ok(out.shard_iterator().map(str::to_owned))
    }

    pub(super) async fn read(&self, start: ShardStart) -> std::result::Result<(), String> {
        let mut iterator: Option<Option<String>> = None;
        let mut last: Option<SequenceNumber> = None;
        let mut retries = Retries::default();
        // Acquire: pairs with the Release store of `KinesisSource::drop`.
        while !self.stop.load(Ordering::Acquire) {
            // Where to read: the iterator of the last read, or a new one
            // where the last read record leaves off.
            let it = match iterator.take() {
                Some(Some(it)) => Ok(it),
                Some(None) => {
                    let _ = self.tx.send(Event::Closed { ix: self.ix }).await;
                    return Ok(());
                }
                None => {
                    let at = last.clone().map_or(start.clone(), ShardStart::After);
                    match self.iterator(&at).await {
                        Ok(Some(it)) => Ok(it),
                        Ok(None) => {
                            let _ = self.tx.send(Event::Closed { ix: self.ix }).await;
                            return Ok(());
                        }
                        Err(f) => Err(f),
                    }
                }
            };
            let read = match it {
                Ok(it) => {
                    let sent = self.client.get_records().shard_iterator(it.clone()).limit(GET_LIMIT).send().await;
                    sent.map_err(|e| {
                        if e.as_service_error().is_some_and(|s| s.is_expired_iterator_exception()) {
                            // Iterators expire after five minutes: ask again
                            // where we are, at once.
                            None
                        } else {
                            // A failed read leaves its iterator valid: the
                            // retry reads from the same place (also when
                            // the shard started at LATEST and nothing was
                            // read yet).
                            iterator = Some(Some(it));
                            Some(failure("GetRecords", e))
                        }
                    })
                }
                Err(f) => Err(Some(f)),
            };
            let out = match read {
                Ok(out) => out,
                Err(None) => continue,
                Err(Some(f)) => {
                    if !self.retry_after(&mut retries, f).await? {
                        return Ok(());
                    }
                    continue;
                }
            };
            retries = Retries::default();
            let records = self.decoded(out.records().iter());
            if let Some(r) = records.last() {
                last = Some(r.seq.clone());
            }
            let millis_behind = out.millis_behind_latest().unwrap_or(0).max(0) as u64;
            let empty = records.is_empty();
            iterator = Some(out.next_shard_iterator().map(str::to_owned));
            let at_tip = empty && millis_behind == 0 && matches!(iterator, Some(Some(_)));
            if !self.hand_on(records, millis_behind, at_tip).await {
                return Ok(());
            }
            if empty && matches!(iterator, Some(Some(_))) {
                tokio::time::sleep(self.poll).await;
            }
        }
        Ok(())
    }
}

/// A shard as listed.
pub(super) struct ListedShard {
    pub(super) id: String,
    pub(super) parents: Vec<String>,
    pub(super) closed: bool,
}

pub(super) async fn client() -> Result<Client> {
    // Loaded on the IO runtime (a blocking wait): not from a task of it.
    let config = tokio::task::spawn_blocking(crate::config::sdk_config).await.map_err(|e| Error::Backend {
        backend: "Kinesis",
        operation: "configure".into(),
        key: String::new(),
        message: e.to_string(),
    })??;
    Ok(Client::new(&config))
}

pub(super) async fn list_shards(client: Client, stream: String) -> std::result::Result<Vec<ListedShard>, Failure> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let request = match &token {
            Some(t) => client.list_shards().next_token(t),
            None => client.list_shards().stream_name(&stream),
        };
        let page = request.send().await.map_err(|e| failure(&format!("ListShards of stream {stream}"), e))?;
        for s in page.shards() {
            out.push(ListedShard {
                id: s.shard_id().to_owned(),
                parents: s
                    .parent_shard_id()
                    .into_iter()
                    .chain(s.adjacent_parent_shard_id())
                    .map(str::to_owned)
                    .collect(),
                closed: s.sequence_number_range().is_some_and(|r| r.ending_sequence_number().is_some()),
            });
        }
        token = page.next_token().map(str::to_owned);
        if token.is_none() {
            return Ok(out);
        }
    }
}
