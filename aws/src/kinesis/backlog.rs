//! How far a checkpoint is behind each shard, read from the streams with
//! no replayer running (`fovea status --input kinesis://…`): what a
//! replayer starting from the checkpoint has to read first.
//!
//! ```text
//!  checkpoint state (per shard: at / after a sequence number, finished)
//!    ─▶ ListShards ─▶ per shard: GetShardIterator there ─▶ GetRecords(limit 1)
//!    ─▶ MillisBehindLatest of that position, and whether a record waits
//! ```

use super::*;

/// Where a checkpoint leaves one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardBacklog {
    /// `stream/shardId`.
    pub shard: String,
    /// Where a replayer starting from the checkpoint reads the shard:
    /// `at SEQ`, `after SEQ`, `trim_horizon` / `latest` (not read yet, as
    /// `start=` says) or `finished` (closed and read to its end).
    pub resumes: String,
    /// Closed by a split or merge (its children go on).
    pub closed: bool,
    /// Milliseconds from that position to the shard's newest record
    /// (Kinesis's MillisBehindLatest); `None` for a finished shard or a
    /// closed one with nothing left.
    pub millis_behind: Option<u64>,
    /// Whether a record waits at that position.
    pub waiting: Option<bool>,
}

/// The stream consumer a `kinesis://…?consumer=NAME` input reads by, on
/// one of its streams, as Kinesis describes it (nothing is registered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerState {
    /// The stream.
    pub stream: String,
    /// The consumer's name.
    pub name: String,
    /// `ACTIVE`, `CREATING`, `DELETING`, `not registered` (a replayer
    /// registers it when it starts), or `unavailable (…)` (no consumers API,
    /// access denied: a replayer reads that stream by polling).
    pub status: String,
    /// Its ARN, when registered.
    pub arn: Option<String>,
}

/// The consumer `options` names (`consumer=`) on each of its streams;
/// empty when the input is read by polling.
pub fn consumer_states(options: &KinesisOptions) -> Result<Vec<ConsumerState>> {
    let Some(name) = &options.consumer else { return Ok(Vec::new()) };
    let error = |message: String| Error::Source { input: options.name(), message };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = client().await?;
        let mut out = Vec::new();
        for stream in &options.streams {
            let (status, arn) = fanout::describe_consumer(&client, stream, name).await.map_err(|f| error(f.message))?;
            out.push(ConsumerState { stream: stream.clone(), name: name.clone(), status, arn });
        }
        Ok(out)
    })
}

/// Every shard of `options`' streams as `checkpoint` leaves it (`None`,
/// or a checkpoint of another input: every shard from where `start=`
/// says).
pub fn checkpoint_backlog(options: &KinesisOptions, checkpoint: Option<&Resume>) -> Result<Vec<ShardBacklog>> {
    let name = options.name();
    let saved = SavedState::of(&name, checkpoint)?;
    let error = |message: String| Error::Source { input: name.clone(), message };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = client().await?;
        let mut out = Vec::new();
        for stream in &options.streams {
            let listed = list_shards(client.clone(), stream.clone()).await.map_err(|f| error(f.message))?;
            for shard in listed {
                let key = format!("{stream}/{}", shard.id);
                let start = match saved.shards.get(&key) {
                    Some(SavedShard::Finished) => {
                        out.push(ShardBacklog {
                            shard: key,
                            resumes: "finished".into(),
                            closed: shard.closed,
                            millis_behind: None,
                            waiting: None,
                        });
                        continue;
                    }
                    Some(SavedShard::At(s)) => ShardStart::At(s.clone()),
                    Some(SavedShard::After(s)) => ShardStart::After(s.clone()),
                    None => match options.start {
                        Start::TrimHorizon => ShardStart::TrimHorizon,
                        Start::Latest => ShardStart::Latest,
                    },
                };
                let (resumes, (kind, seq)) = (start.to_string(), start.iterator_type());
                let iterator = client
                    .get_shard_iterator()
                    .stream_name(stream)
                    .shard_id(&shard.id)
                    .shard_iterator_type(kind)
                    .set_starting_sequence_number(seq)
                    .send()
                    .await
                    .map_err(|e| error(failure(&format!("GetShardIterator of {key}"), e).message))?;
                let (millis_behind, waiting) = match iterator.shard_iterator() {
                    None => (None, None),
                    Some(it) => {
                        let read = client
                            .get_records()
                            .shard_iterator(it)
                            .limit(1)
                            .send()
                            .await
                            .map_err(|e| error(failure(&format!("GetRecords of {key}"), e).message))?;
                        (Some(read.millis_behind_latest().unwrap_or(0).max(0) as u64), Some(!read.records().is_empty()))
                    }
                };
                out.push(ShardBacklog { shard: key, resumes, closed: shard.closed, millis_behind, waiting });
            }
        }
        Ok(out)
    })
}
