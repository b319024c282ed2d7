//! `kinesis://STREAM[,STREAM…]?…`: what an input URL asks for.

use std::time::Duration;

use fovea_core::cdc::InputFormat;
use fovea_core::{Error, Result};

use super::*;

/// Where a shard without a checkpointed position starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Its oldest record (`TRIM_HORIZON`).
    TrimHorizon,
    /// Records put from now on (`LATEST`).
    Latest,
}

/// What `--input kinesis://…` asks for.
#[derive(Clone, Debug)]
pub struct KinesisOptions {
    /// Stream names.
    pub streams: Vec<String>,
    /// Record format.
    pub format: InputFormat,
    /// Where shards without a checkpoint start.
    pub start: Start,
    /// Apply whole source transactions (`false`: row at a time).
    pub atomic: bool,
    /// Follow the streams (serve) instead of stopping at their tips (replay).
    pub follow: bool,
    /// Pause after an empty read of a shard (Kinesis allows five reads a
    /// second per shard).
    pub poll: Duration,
    /// Cap on the bytes of records held for incomplete transactions.
    pub max_held_bytes: usize,
    /// Cap on the bytes of records read ahead (read, not yet taken in).
    pub read_ahead_bytes: Option<usize>,
    /// Largest record accepted.
    pub max_record_bytes: usize,
    /// How long a complete transaction whose predecessor in the commit
    /// chain has not arrived waits before it is applied anyway, with a
    /// warning (see [`TxnOrder::with_gap_grace`]).
    pub gap_grace: Duration,
    /// Read by enhanced fan-out as this stream consumer (registered, or
    /// reused when it exists) instead of by polling (`consumer=NAME`).
    pub consumer: Option<String>,
    /// How long one fan-out subscription is kept before it is renewed
    /// (`renew_secs`, at most Kinesis's five minutes).
    pub renew: Duration,
}

impl KinesisOptions {
    /// Parses `kinesis://STREAM[,STREAM…][?format=…&start=…&atomic=…&poll_ms=…&max_held_mb=…&max_record_kb=…&gap_grace_ms=…&consumer=NAME&renew_secs=N]`;
    /// `format` is the default of `--format`.
    pub fn parse(spec: &str, format: InputFormat, follow: bool) -> Result<Self> {
        let bad = |m: String| Error::Source { input: spec.to_owned(), message: m };
        let rest = spec.strip_prefix("kinesis://").ok_or_else(|| bad("expected kinesis://STREAM".into()))?;
        let (names, query) = rest.split_once('?').unwrap_or((rest, ""));
        let streams: Vec<String> = names.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect();
        if streams.is_empty() {
            return Err(bad("no stream named: kinesis://STREAM[,STREAM…]".into()));
        }
        let mut options = KinesisOptions {
            streams,
            format,
            start: Start::TrimHorizon,
            atomic: true,
            follow,
            poll: Duration::from_millis(200),
            max_held_bytes: default_held_cap(),
            read_ahead_bytes: None,
            max_record_bytes: 10 << 20,
            gap_grace: Duration::from_secs(10),
            consumer: None,
            renew: MAX_SUBSCRIPTION,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let number = |what: &str| v.parse::<u64>().map_err(|_| bad(format!("{k}={v:?}: expected {what}")));
            // A size past what the byte count holds is refused (a shift
            // would drop its high bits: a huge cap turned into a small one).
            let bytes = |what: &str, unit: u64| {
                number(what)?
                    .checked_mul(unit)
                    .and_then(|b| usize::try_from(b).ok())
                    .ok_or_else(|| bad(format!("{k}={v:?}: expected at most {} {what}", u64::MAX / unit)))
            };
            match k {
                "format" => options.format = v.parse().map_err(bad)?,
                "start" => {
                    options.start = match v {
                        "trim_horizon" => Start::TrimHorizon,
                        "latest" => Start::Latest,
                        _ => return Err(bad(format!("start={v:?}: expected trim_horizon or latest"))),
                    }
                }
                "atomic" => {
                    options.atomic = v.parse().map_err(|_| bad(format!("atomic={v:?}: expected true or false")))?
                }
                "poll_ms" => options.poll = Duration::from_millis(number("milliseconds")?),
                "max_held_mb" => options.max_held_bytes = bytes("megabytes", 1 << 20)?,
                "read_ahead_mb" => options.read_ahead_bytes = Some(bytes("megabytes", 1 << 20)?),
                "max_record_kb" => options.max_record_bytes = bytes("kilobytes", 1 << 10)?,
                "gap_grace_ms" => options.gap_grace = Duration::from_millis(number("milliseconds")?),
                "consumer" => options.consumer = Some(consumer_name(v).map_err(bad)?),
                "renew_secs" => {
                    let secs = number("seconds")?;
                    if secs == 0 || secs > MAX_SUBSCRIPTION.as_secs() {
                        return Err(bad(format!(
                            "renew_secs={v}: expected 1 to {} (a subscription lasts at most five minutes)",
                            MAX_SUBSCRIPTION.as_secs()
                        )));
                    }
                    options.renew = Duration::from_secs(secs);
                }
                other => {
                    return Err(bad(format!(
                        "unknown parameter {other:?}: expected format, start, atomic, poll_ms, max_held_mb, read_ahead_mb, max_record_kb, gap_grace_ms, consumer or renew_secs"
                    )));
                }
            }
        }
        if options.consumer.is_none() && options.renew != MAX_SUBSCRIPTION {
            return Err(bad("renew_secs applies to enhanced fan-out: name its consumer=NAME".into()));
        }
        Ok(options)
    }

    /// The read-ahead cap in effect.
    pub fn read_ahead(&self) -> usize {
        self.read_ahead_bytes.unwrap_or(self.max_held_bytes / 4).max(MIN_READ_AHEAD)
    }

    /// The input's name in checkpoints.
    pub fn name(&self) -> String {
        format!("kinesis://{}", self.streams.join(","))
    }
}

/// A stream consumer's name as Kinesis accepts it: 1 to 128 of
/// `[a-zA-Z0-9_.-]`.
fn consumer_name(v: &str) -> std::result::Result<String, String> {
    let ok = (1..=128).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(v.to_owned())
    } else {
        Err(format!("consumer={v:?}: expected a consumer name of 1 to 128 letters, digits, '_', '.' or '-'"))
    }
}

/// An eighth of the machine's memory (512 MiB when unknown).
pub(super) fn default_held_cap() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<usize>().ok()
    });
    total.map_or(512 << 20, |kb| (kb << 10) / 8)
}
