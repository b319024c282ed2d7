//! Writing change streams into Kinesis (a local stand-in or the service):
//! what Debezium Server puts for a Kafka-style line, PutRecords with
//! re-sends, and resharding — for tests and benchmarks.

use std::time::Duration;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::DisplayErrorContext;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType, StreamStatus};
use aws_smithy_http_client::tls;
use fovea_core::{Error, Result};
use serde_json::Value as Json;

/// What Debezium Server puts to Kinesis for one Kafka-style line
/// (`{"topic","key","value"}`): the value, with the record key as partition
/// key — without its schema envelope (a partition key is at most 256
/// characters) — and BEGIN/END records keyed by transaction id. `None` for a
/// tombstone, which it does not send.
pub fn debezium_server_record(line: &str) -> Result<Option<(String, Vec<u8>)>> {
    let malformed =
        |e: serde_json::Error| Error::Corrupt { what: "a Kafka-style Debezium record".into(), reason: e.to_string() };
    let v: Json = serde_json::from_str(line).map_err(malformed)?;
    let value = &v["value"];
    if value.is_null() {
        return Ok(None);
    }
    let payload = if value.get("schema").is_some() { &value["payload"] } else { value };
    let key = match payload.get("status") {
        Some(_) => payload["id"].as_str().unwrap_or("").split(':').next().unwrap_or("").to_owned(),
        None => {
            let key = &v["key"];
            if key.get("schema").is_some() { key["payload"].to_string() } else { key.to_string() }
        }
    };
    Ok(Some((key, value.to_string().into_bytes())))
}

/// Writing to and resharding streams: for tests, benchmarks and tools that
/// feed a change stream into Kinesis.
pub struct KinesisProducer {
    runtime: tokio::runtime::Runtime,
    client: Client,
}

impl KinesisProducer {
    /// A client from the environment's AWS configuration, talking to
    /// `endpoint` when given (a local stand-in).
    pub fn connect(endpoint: Option<&str>) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        // rustls on ring, as every client of fovea (no default HTTPS client
        // is compiled in).
        let https = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
            .build_https();
        let loader = aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(https);
        let loader = match endpoint {
            None => loader,
            Some(url) => loader
                .endpoint_url(url)
                .region(aws_config::Region::new("us-east-1"))
                .credentials_provider(aws_sdk_kinesis::config::Credentials::new("test", "test", None, None, "local")),
        };
        let client = Client::new(&runtime.block_on(loader.load()));
        Ok(KinesisProducer { runtime, client })
    }

    fn failed(what: &str, e: impl std::fmt::Display) -> Error {
        Error::Backend { backend: "kinesis", operation: what.to_owned(), key: String::new(), message: e.to_string() }
    }

    /// Creates `stream` with `shards` shards and waits until it is active.
    pub fn create_stream(&self, stream: &str, shards: i32) -> Result<()> {
        self.runtime
            .block_on(self.client.create_stream().stream_name(stream).shard_count(shards).send())
            .map_err(|e| Self::failed("CreateStream", DisplayErrorContext(&e)))?;
        self.wait_active(stream)
    }

    /// Waits until `stream` is ACTIVE, polling every 20 ms for at most a
    /// minute. Not the SDK's `StreamExists` waiter: its first retry comes
    /// after 10 s, and kinesalite reports CREATING or UPDATING for a moment
    /// after most creates and reshards (measured: 3 of 5 creates), which
    /// made the Kinesis tests twice as slow.
    fn wait_active(&self, stream: &str) -> Result<()> {
        let began = std::time::Instant::now();
        loop {
            let out = self
                .runtime
                .block_on(self.client.describe_stream_summary().stream_name(stream).send())
                .map_err(|e| Self::failed("DescribeStreamSummary", DisplayErrorContext(&e)))?;
            if out.stream_description_summary().is_some_and(|s| *s.stream_status() == StreamStatus::Active) {
                return Ok(());
            }
            if began.elapsed() > Duration::from_secs(60) {
                return Err(Self::failed("DescribeStreamSummary", format!("stream {stream} did not become active")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Puts `records` (partition key, data) with PutRecords in batches of
    /// 500, re-sending failed entries; returns their sequence numbers.
    pub fn put(&self, stream: &str, records: &[(String, Vec<u8>)]) -> Result<Vec<String>> {
        let mut sequence = Vec::with_capacity(records.len());
        for batch in records.chunks(500) {
            let mut pending: Vec<usize> = (0..batch.len()).collect();
            let mut got = vec![String::new(); batch.len()];
            for attempt in 0.. {
                if pending.is_empty() {
                    break;
                }
                if attempt == 20 {
                    return Err(Self::failed("PutRecords", format!("{} entries kept failing", pending.len())));
                }
                let entries = pending
                    .iter()
                    .map(|&i| {
                        PutRecordsRequestEntry::builder()
                            .partition_key(&batch[i].0)
                            .data(Blob::new(batch[i].1.clone()))
                            .build()
                            .map_err(|e| Self::failed("PutRecords", e))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let out = self
                    .runtime
                    .block_on(self.client.put_records().stream_name(stream).set_records(Some(entries)).send())
                    .map_err(|e| Self::failed("PutRecords", DisplayErrorContext(&e)))?;
                let mut again = Vec::new();
                for (&i, entry) in pending.iter().zip(out.records()) {
                    match (entry.error_code(), entry.sequence_number()) {
                        (None, Some(seq)) => got[i] = seq.to_owned(),
                        _ => again.push(i),
                    }
                }
                if !again.is_empty() {
                    std::thread::sleep(Duration::from_millis(20 << attempt.min(5)));
                }
                pending = again;
            }
            sequence.extend(got);
        }
        Ok(sequence)
    }

    /// Reads every shard of `stream` from its oldest record to its tip,
    /// one after the other, and returns the records read: how fast the
    /// service alone serves GetRecords.
    pub fn read_all(&self, stream: &str) -> Result<u64> {
        let mut n = 0u64;
        for shard in self.shard_ids(stream)? {
            let out = self
                .runtime
                .block_on(
                    self.client
                        .get_shard_iterator()
                        .stream_name(stream)
                        .shard_id(&shard)
                        .shard_iterator_type(ShardIteratorType::TrimHorizon)
                        .send(),
                )
                .map_err(|e| Self::failed("GetShardIterator", DisplayErrorContext(&e)))?;
            let mut iterator = out.shard_iterator().map(str::to_owned);
            while let Some(it) = iterator.take() {
                let page = self
                    .runtime
                    .block_on(self.client.get_records().shard_iterator(it).limit(10_000).send())
                    .map_err(|e| Self::failed("GetRecords", DisplayErrorContext(&e)))?;
                n += page.records().len() as u64;
                if page.records().is_empty() {
                    break;
                }
                iterator = page.next_shard_iterator().map(str::to_owned);
            }
        }
        Ok(n)
    }

    /// Every shard of `stream`, open or closed, in the order listed.
    fn shard_ids(&self, stream: &str) -> Result<Vec<String>> {
        let mut ids = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let request = match &token {
                Some(t) => self.client.list_shards().next_token(t),
                None => self.client.list_shards().stream_name(stream),
            };
            let page = self
                .runtime
                .block_on(request.send())
                .map_err(|e| Self::failed("ListShards", DisplayErrorContext(&e)))?;
            ids.extend(page.shards().iter().map(|s| s.shard_id().to_owned()));
            token = page.next_token().map(str::to_owned);
            if token.is_none() {
                return Ok(ids);
            }
        }
    }

    /// The open shards of `stream`, with their hash key ranges.
    pub fn open_shards(&self, stream: &str) -> Result<Vec<(String, u128, u128)>> {
        let mut out = Vec::new();
        let page = self
            .runtime
            .block_on(self.client.list_shards().stream_name(stream).send())
            .map_err(|e| Self::failed("ListShards", DisplayErrorContext(&e)))?;
        for s in page.shards() {
            let open = s.sequence_number_range().is_none_or(|r| r.ending_sequence_number().is_none());
            if let (true, Some(range)) = (open, s.hash_key_range()) {
                let start = range.starting_hash_key().parse().map_err(|e| Self::failed("ListShards", e))?;
                let end = range.ending_hash_key().parse().map_err(|e| Self::failed("ListShards", e))?;
                out.push((s.shard_id().to_owned(), start, end));
            }
        }
        out.sort_by_key(|s| s.1);
        Ok(out)
    }

    /// Splits shard `id` of `stream` in the middle of its hash key range.
    pub fn split(&self, stream: &str, id: &str) -> Result<()> {
        let (_, start, end) = self
            .open_shards(stream)?
            .into_iter()
            .find(|s| s.0 == id)
            .ok_or_else(|| Self::failed("SplitShard", format!("no open shard {id}")))?;
        let middle = start + (end - start) / 2 + 1;
        self.runtime
            .block_on(
                self.client
                    .split_shard()
                    .stream_name(stream)
                    .shard_to_split(id)
                    .new_starting_hash_key(middle.to_string())
                    .send(),
            )
            .map_err(|e| Self::failed("SplitShard", DisplayErrorContext(&e)))?;
        self.wait_active(stream)
    }

    /// Merges two adjacent open shards of `stream`.
    pub fn merge(&self, stream: &str, a: &str, b: &str) -> Result<()> {
        self.runtime
            .block_on(
                self.client.merge_shards().stream_name(stream).shard_to_merge(a).adjacent_shard_to_merge(b).send(),
            )
            .map_err(|e| Self::failed("MergeShards", DisplayErrorContext(&e)))?;
        self.wait_active(stream)
    }
}
