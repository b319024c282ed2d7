//! `fovea serve --emf-secs N`: the metrics of `/metrics` as CloudWatch
//! log lines in the embedded metric format ([`fovea_aws::emf`]), every N
//! seconds and once more when the replayer stops.
//!
//! One line per lake (dimension `Lake`): every counter of
//! [`Metrics::samples`] as its change since the line before (the first
//! line of a process: since it started), every gauge as it is, each
//! histogram as `NAME_p50_seconds`, `NAME_p99_seconds`, `NAME_max_seconds`
//! and `NAME_count` over the interval, memory by component, errors by kind
//! (`errors_KIND`), the input's held transactions and its largest shard
//! lag, `process_starts` (1 on a process's first line) and, on the last
//! line, `stopped_by_error` (1: the replayer stopped on an error, a lost
//! lease among them). One more line per Kinesis shard (dimensions `Lake`,
//! `Shard`): its lag, records and read retries.

use std::collections::HashMap;
use std::time::Instant;

use fovea_aws::emf::{Record, Unit};
use fovea_core::Engine;

use super::metrics::{Metrics, SampleKind, bucket_quantile, memory_components};

/// Turns the metrics into EMF records, remembering what the last records
/// said so counters become changes.
#[derive(Debug)]
pub struct EmfReporter {
    namespace: String,
    lake: String,
    /// Counters' values at the last records (by EMF name).
    last: HashMap<String, f64>,
    /// Histograms' bucket counts at the last records (by name).
    last_buckets: HashMap<&'static str, Vec<u64>>,
    /// No records made yet.
    first: bool,
}

impl EmfReporter {
    /// A reporter for the lake at `lake` (the `Lake` dimension) into the
    /// namespace [`fovea_aws::emf::namespace`] names.
    pub fn new(lake: &str) -> Self {
        EmfReporter {
            namespace: fovea_aws::emf::namespace(),
            lake: lake.to_owned(),
            last: HashMap::new(),
            last_buckets: HashMap::new(),
            first: true,
        }
    }

    /// The change of counter `name` to `now` since the last records.
    fn delta(&mut self, name: String, now: f64) -> f64 {
        let before = self.last.insert(name, now).unwrap_or(0.0);
        (now - before).max(0.0)
    }

    /// The records of this interval; `stopped` on the replayer's last
    /// (`Some(true)`: it stopped on an error).
    pub fn records(
        &mut self,
        metrics: &Metrics,
        engine: &Engine,
        started: Instant,
        stopped: Option<bool>,
    ) -> Vec<Record> {
        let mut lake = Record::new(&self.namespace, &[("Lake", &self.lake)]);
        let memory = engine.memory();
        for sample in metrics.samples(engine, &memory, started) {
            let value = sample.value.get();
            match sample.kind {
                SampleKind::Counter => {
                    let change = self.delta(sample.name.to_owned(), value);
                    lake.metric(sample.name, sample.unit, change);
                }
                SampleKind::Gauge => {
                    lake.metric(sample.name, sample.unit, value);
                }
            }
        }
        for (name, _, distribution) in metrics.distributions() {
            let counts = distribution.counts();
            let before = self.last_buckets.insert(name, counts.clone()).unwrap_or_else(|| vec![0; counts.len()]);
            let interval: Vec<u64> = counts.iter().zip(&before).map(|(n, b)| n.saturating_sub(*b)).collect();
            let max = distribution.take_max();
            lake.metric(&format!("{name}_count"), Unit::Count, interval.iter().sum::<u64>() as f64);
            for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
                if let Some(v) = bucket_quantile(distribution.bounds(), &interval, q, max) {
                    lake.metric(&format!("{name}_{label}_seconds"), Unit::Seconds, v);
                }
            }
            if interval.iter().any(|n| *n > 0) {
                lake.metric(&format!("{name}_max_seconds"), Unit::Seconds, max);
            }
        }
        for (component, bytes) in memory_components(&memory) {
            lake.metric(&format!("memory_{component}_bytes"), Unit::Bytes, bytes as f64);
        }
        let errors = metrics.errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (kind, n) in errors {
            let name = format!("errors_{kind}");
            let change = self.delta(name.clone(), n as f64);
            lake.metric(&name, Unit::Count, change);
        }
        lake.metric("process_starts", Unit::Count, if self.first { 1.0 } else { 0.0 });
        if let Some(failed) = stopped {
            lake.metric("stopped_by_error", Unit::Count, if failed { 1.0 } else { 0.0 });
        }
        self.first = false;
        let mut records = Vec::new();
        let input = metrics.input.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(input) = input {
            lake.metric("input_held_transactions", Unit::Count, input.held.0 as f64);
            lake.metric("input_held_bytes", Unit::Bytes, input.held.1 as f64);
            let behind = input.shards.iter().map(|s| s.millis_behind).max();
            if let Some(behind) = behind {
                lake.metric("shard_millis_behind_max", Unit::Milliseconds, behind as f64);
            }
            records.push(lake);
            for shard in &input.shards {
                let mut r = Record::new(&self.namespace, &[("Lake", &self.lake), ("Shard", &shard.name)]);
                r.metric("shard_millis_behind_latest", Unit::Milliseconds, shard.millis_behind as f64);
                let records_change = self.delta(format!("shard_records/{}", shard.name), shard.records as f64);
                r.metric("shard_records", Unit::Count, records_change);
                let retries_change = self.delta(format!("shard_read_retries/{}", shard.name), shard.retries as f64);
                r.metric("shard_read_retries", Unit::Count, retries_change);
                records.push(r);
            }
        } else {
            records.push(lake);
        }
        records
    }
}
