//! Enhanced fan-out (`kinesis://…?consumer=NAME`): the stream consumer
//! registered (or reused), and a shard read by SubscribeToShard — records
//! pushed over one HTTP/2 connection per shard, renewed every
//! [`KinesisOptions::renew`] (Kinesis ends a subscription after five
//! minutes) from the last record read, so a renewal neither skips nor
//! repeats a record. A shard already closed when listed is history: it is
//! polled to its end (which GetRecords marks), its children subscribed.
//! Where fan-out is unavailable — the consumer cannot be
//! registered (a stand-in without the API, the stream's consumer limit,
//! denied access) or a shard's subscription is refused for good — the
//! stream or the shard is read by polling from the same place, with a
//! warning: both ways hand the source the same events.

use std::time::{Duration, Instant};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::{DisplayErrorContext, SdkError};
use aws_sdk_kinesis::types::{ConsumerStatus, StartingPosition, SubscribeToShardEventStream};
use fovea_core::cdc::ordering::SequenceNumber;

use super::*;

/// How long registering a consumer may take before the stream is read by
/// polling instead (Kinesis takes seconds).
const REGISTER_WAIT: Duration = Duration::from_secs(120);

/// The ARN of `stream` (consumers are named under it).
async fn stream_arn(client: &Client, stream: &str) -> std::result::Result<String, Failure> {
    let summary = client
        .describe_stream_summary()
        .stream_name(stream)
        .send()
        .await
        .map_err(|e| failure(&format!("DescribeStreamSummary of stream {stream}"), e))?;
    Ok(summary.stream_description_summary().map(|d| d.stream_arn().to_owned()).unwrap_or_default())
}

/// The ARN of stream consumer `name` of `stream`, registered if it does not
/// exist, once it is active. `Ok(None)`: fan-out is unavailable for this
/// stream (the reason is logged); transient failures are errors the
/// caller retries.
pub(super) async fn consumer(
    client: &Client,
    stream: &str,
    name: &str,
) -> std::result::Result<Option<String>, Failure> {
    let stream_arn = stream_arn(client, stream).await?;
    let unavailable = |what: &str, message: String| {
        tracing::warn!(
            stream,
            consumer = name,
            "enhanced fan-out is unavailable ({what}: {message}); reading the stream by polling"
        );
        Ok(None)
    };
    match client.register_stream_consumer().stream_arn(&stream_arn).consumer_name(name).send().await {
        Ok(_) => {}
        // It exists: reuse it.
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => {}
        Err(e) if transient(&e) && !e.as_service_error().is_some_and(|s| s.is_limit_exceeded_exception()) => {
            return Err(failure(&format!("RegisterStreamConsumer {name} of stream {stream}"), e));
        }
        Err(e) => return unavailable("RegisterStreamConsumer", DisplayErrorContext(&e).to_string()),
    }
    let began = Instant::now();
    loop {
        let described = client
            .describe_stream_consumer()
            .stream_arn(&stream_arn)
            .consumer_name(name)
            .send()
            .await
            .map_err(|e| failure(&format!("DescribeStreamConsumer {name} of stream {stream}"), e));
        let description = match described {
            Ok(d) => d.consumer_description,
            Err(f) if f.transient => return Err(f),
            Err(f) => return unavailable("DescribeStreamConsumer", f.message),
        };
        match description {
            Some(d) if d.consumer_status == ConsumerStatus::Active => return Ok(Some(d.consumer_arn)),
            Some(d) if began.elapsed() >= REGISTER_WAIT => {
                let status = d.consumer_status.as_str().to_owned();
                return unavailable("consumer not active", format!("{status} after {} s", REGISTER_WAIT.as_secs()));
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// How stream consumer `name` of `stream` stands, without registering it:
/// its status (`ACTIVE`, `CREATING`, `DELETING`) and ARN, `not registered`,
/// or `unavailable (…)` where the stream has no consumers API (a stand-in)
/// or access is denied. Transient failures are errors.
pub(super) async fn describe_consumer(
    client: &Client,
    stream: &str,
    name: &str,
) -> std::result::Result<(String, Option<String>), Failure> {
    let stream_arn = stream_arn(client, stream).await?;
    match client.describe_stream_consumer().stream_arn(&stream_arn).consumer_name(name).send().await {
        Ok(d) => Ok(match d.consumer_description {
            Some(d) => (d.consumer_status.as_str().to_owned(), Some(d.consumer_arn)),
            None => ("not registered".into(), None),
        }),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => {
            Ok(("not registered".into(), None))
        }
        Err(e) if transient(&e) => Err(failure(&format!("DescribeStreamConsumer {name} of stream {stream}"), e)),
        Err(e) => Ok((format!("unavailable ({})", DisplayErrorContext(&e)), None)),
    }
}

/// How a shard's subscriptions ended.
pub(super) enum Subscribed {
    /// The shard is read to its end, or the source is gone.
    Done,
    /// Fan-out was refused for good: read on by polling from here.
    Poll(ShardStart),
}

/// Whether a failure of an open subscription may pass if subscribed again.
fn stream_error_transient<R>(e: &SdkError<aws_sdk_kinesis::types::error::SubscribeToShardEventStreamError, R>) -> bool {
    match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => true,
        // In use: the previous subscription to the shard is not closed yet
        // (the stand-in and Kinesis see a dropped connection late). The
        // modelled errors carry no code in their metadata: match the kinds.
        SdkError::ServiceError(s) => {
            use aws_sdk_kinesis::types::error::SubscribeToShardEventStreamError as E;
            matches!(
                s.err(),
                E::ResourceInUseException(_) | E::InternalFailureException(_) | E::KmsThrottlingException(_)
            )
        }
        _ => false,
    }
}

impl ShardReader {
    /// Reads the shard by subscriptions of `consumer` from `start`, each
    /// renewed after [`ShardReader::renew`] (see the module docs).
    pub(super) async fn subscribe(&self, consumer: &str, start: ShardStart) -> std::result::Result<Subscribed, String> {
        // The last record handed on, and the server's continuation while
        // none was (a renewal of a shard started at LATEST resumes there).
        let mut last: Option<SequenceNumber> = None;
        let mut continuation: Option<SequenceNumber> = None;
        let mut retries = Retries::default();
        // Acquire: pairs with the Release store of `KinesisSource::drop`.
        while !self.stop.load(Ordering::Acquire) {
            let at = match (&last, &continuation) {
                (Some(s), _) | (None, Some(s)) => ShardStart::After(s.clone()),
                (None, None) => start.clone(),
            };
            let (kind, seq) = at.iterator_type();
            let position = StartingPosition::builder()
                .r#type(kind)
                .set_sequence_number(seq)
                .build()
                .map_err(|e| format!("SubscribeToShard: {e}"))?;
            let subscribed = self
                .client
                .subscribe_to_shard()
                .consumer_arn(consumer)
                .shard_id(&self.id)
                .starting_position(position)
                .send()
                .await;
            let mut out = match subscribed {
                Ok(out) => out,
                Err(e) if transient(&e) || e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => {
                    // In use: the last subscription of this consumer to the
                    // shard is still open (a renewal within 5 s, or a
                    // predecessor's connection not yet closed).
                    let f =
                        Failure { transient: true, message: format!("SubscribeToShard: {}", DisplayErrorContext(&e)) };
                    if !self.retry_after(&mut retries, f).await? {
                        return Ok(Subscribed::Done);
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(
                        shard = %self.id,
                        "enhanced fan-out refused ({}); reading the shard by polling",
                        DisplayErrorContext(&e)
                    );
                    return Ok(Subscribed::Poll(at));
                }
            };
            let renew_at = tokio::time::Instant::now() + self.renew;
            // The last event was empty with nothing behind.
            let mut caught_up = false;
            loop {
                if self.stop.load(Ordering::Acquire) {
                    return Ok(Subscribed::Done);
                }
                let received = tokio::select! {
                    r = out.event_stream.recv() => r,
                    () = tokio::time::sleep_until(renew_at) => break,
                };
                let event = match received {
                    Ok(Some(SubscribeToShardEventStream::SubscribeToShardEvent(event))) => event,
                    // An event kind this client does not know.
                    Ok(Some(_)) => continue,
                    // The subscription ended (after five minutes): renew.
                    Ok(None) => break,
                    Err(e) => {
                        let f = Failure {
                            transient: stream_error_transient(&e),
                            message: format!("SubscribeToShard event stream: {}", DisplayErrorContext(&e)),
                        };
                        // A permanent failure fails the shard here.
                        if !self.retry_after(&mut retries, f).await? {
                            return Ok(Subscribed::Done);
                        }
                        break;
                    }
                };
                retries = Retries::default();
                let records = self.decoded(event.records().iter());
                if let Some(r) = records.last() {
                    last = Some(r.seq.clone());
                }
                let next = event.continuation_sequence_number();
                // The end of a closed shard: no continuation, its children named.
                let ended = next.is_empty() || !event.child_shards().is_empty();
                if !next.is_empty() {
                    continuation = Some(SequenceNumber(next.to_owned()));
                }
                let millis_behind = event.millis_behind_latest().max(0) as u64;
                let at_tip = records.is_empty() && millis_behind == 0 && !ended;
                caught_up = at_tip;
                if !self.hand_on(records, millis_behind, at_tip).await {
                    return Ok(Subscribed::Done);
                }
                if ended {
                    let _ = self.tx.send(Event::Closed { ix: self.ix }).await;
                    return Ok(Subscribed::Done);
                }
            }
            // Renewing a caught-up subscription: has the shard ended
            // meanwhile? Kinesis says so in the subscription's last event;
            // a reader that missed it (or a stand-in that never sends it)
            // learns it here, by one GetRecords after the last record.
            let after = last.as_ref().or(continuation.as_ref());
            if let (true, Some(after)) = (caught_up, after)
                && self.ended_after(after).await
            {
                let _ = self.tx.send(Event::Closed { ix: self.ix }).await;
                return Ok(Subscribed::Done);
            }
        }
        Ok(Subscribed::Done)
    }

    /// Whether the shard is closed with nothing after `after` (a failed
    /// probe says no: the subscription goes on).
    async fn ended_after(&self, after: &SequenceNumber) -> bool {
        let iterator = match self.iterator(&ShardStart::After(after.clone())).await {
            Ok(Some(it)) => it,
            Ok(None) => return true,
            Err(_) => return false,
        };
        match self.client.get_records().shard_iterator(iterator).limit(1).send().await {
            Ok(out) => out.records().is_empty() && out.next_shard_iterator().is_none(),
            Err(_) => false,
        }
    }
}
