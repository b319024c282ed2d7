//! Metrics as CloudWatch log lines in the embedded metric format (EMF):
//! a process writes one JSON object per line to its log (stdout on Lambda
//! and in an ECS task with the awslogs driver) and CloudWatch extracts the
//! metrics it names — no `PutMetricData` call, no SDK, no extra request.
//!
//! ```json
//! {"_aws":{"Timestamp":1796617800000,"CloudWatchMetrics":[{"Namespace":"fovea",
//!   "Dimensions":[["Lake"]],"Metrics":[{"Name":"rows","Unit":"Count"}]}]},
//!  "Lake":"s3://bucket/lake","rows":1200}
//! ```
//!
//! The namespace is `fovea` unless `FOVEA_METRICS_NAMESPACE` names another
//! (one per deployment keeps their alarms apart). The specification:
//! <https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html>.

use serde_json::{Map, Value, json};

/// The namespace unless `FOVEA_METRICS_NAMESPACE` says.
pub const DEFAULT_NAMESPACE: &str = "fovea";

/// Metrics one directive may name (the format's limit).
const METRICS_PER_DIRECTIVE: usize = 100;

/// The namespace this process's metrics go to.
pub fn namespace() -> String {
    std::env::var("FOVEA_METRICS_NAMESPACE").ok().filter(|n| !n.is_empty()).unwrap_or_else(|| DEFAULT_NAMESPACE.into())
}

/// A CloudWatch unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Seconds.
    Seconds,
    /// Milliseconds.
    Milliseconds,
    /// Bytes.
    Bytes,
    /// A count.
    Count,
    /// A count per second.
    CountPerSecond,
    /// No unit (an identifier such as a watermark or an epoch).
    None,
}

impl Unit {
    /// CloudWatch's name of the unit.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Seconds => "Seconds",
            Unit::Milliseconds => "Milliseconds",
            Unit::Bytes => "Bytes",
            Unit::Count => "Count",
            Unit::CountPerSecond => "Count/Second",
            Unit::None => "None",
        }
    }

    /// The unit a metric named in fovea's way (Prometheus': the unit as the
    /// name's suffix) has: `…_seconds`, `…_bytes`, `…_bytes_…` (a byte
    /// counter with a qualifier: `storage_gc_bytes_before`), `bytes_…`,
    /// `…_millis…` / `…_ms`, else `default`.
    pub fn of_name(name: &str, default: Unit) -> Unit {
        if name.ends_with("_seconds") {
            Unit::Seconds
        } else if name.ends_with("_bytes") || name.contains("_bytes_") || name.starts_with("bytes_") {
            Unit::Bytes
        } else if name.ends_with("_ms") || name.contains("_millis") {
            Unit::Milliseconds
        } else {
            default
        }
    }
}

/// The values of some metrics for one combination of dimension values, at
/// one time: one line of the log.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    namespace: String,
    dimensions: Vec<(String, String)>,
    metrics: Vec<(String, Unit, f64)>,
    /// Fields that are no metric (searchable in Logs Insights).
    properties: Vec<(String, String)>,
}

impl Record {
    /// An empty record in `namespace` for these dimension values (name,
    /// value); the metrics are aggregated over all of them together.
    pub fn new(namespace: &str, dimensions: &[(&str, &str)]) -> Self {
        Record {
            namespace: namespace.to_owned(),
            dimensions: dimensions.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect(),
            metrics: Vec::new(),
            properties: Vec::new(),
        }
    }

    /// Adds a field that is no metric (`errorType`, …).
    pub fn property(&mut self, name: &str, value: &str) {
        self.properties.push((name.to_owned(), value.to_owned()));
    }

    /// Adds metric `name` with `value` in `unit`. A value that is not a
    /// finite number (an unknown freshness) is left out: CloudWatch takes
    /// numbers only.
    pub fn metric(&mut self, name: &str, unit: Unit, value: f64) -> &mut Self {
        if value.is_finite() {
            self.metrics.push((name.to_owned(), unit, value));
        }
        self
    }

    /// The metrics added so far.
    pub fn metrics(&self) -> &[(String, Unit, f64)] {
        &self.metrics
    }

    /// The record as one EMF JSON line (no newline) stamped `timestamp_ms`
    /// (milliseconds since the epoch); `None` when it holds no metric.
    pub fn to_line(&self, timestamp_ms: u64) -> Option<String> {
        if self.metrics.is_empty() {
            return None;
        }
        let names: Vec<&str> = self.dimensions.iter().map(|(n, _)| n.as_str()).collect();
        let directives: Vec<Value> = self
            .metrics
            .chunks(METRICS_PER_DIRECTIVE)
            .map(|chunk| {
                let metrics: Vec<Value> =
                    chunk.iter().map(|(name, unit, _)| json!({ "Name": name, "Unit": unit.as_str() })).collect();
                json!({ "Namespace": self.namespace, "Dimensions": [names], "Metrics": metrics })
            })
            .collect();
        let mut root = Map::new();
        root.insert("_aws".into(), json!({ "Timestamp": timestamp_ms, "CloudWatchMetrics": directives }));
        for (name, value) in self.properties.iter().chain(&self.dimensions) {
            root.insert(name.clone(), Value::String(value.clone()));
        }
        for (name, _, value) in &self.metrics {
            root.insert(name.clone(), json!(value));
        }
        Some(Value::Object(root).to_string())
    }

    /// Writes the record to stdout as one line (nothing when empty).
    pub fn emit(&self) {
        if let Some(line) = self.to_line(now_ms()) {
            use std::io::Write as _;
            // One write of the whole line under stdout's lock: log lines
            // of other threads do not cut into it.
            let mut out = std::io::stdout().lock();
            if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
                tracing::warn!("writing a metrics line failed: {e}");
            }
        }
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_one_emf_object() {
        let mut r = Record::new("fovea-test", &[("Lake", "s3://b/l"), ("Shard", "shardId-0")]);
        r.metric("rows", Unit::Count, 1200.0).metric("freshness_seconds", Unit::Seconds, f64::NAN);
        r.property("errorType", "Throttled");
        let line = r.to_line(1_796_617_800_000).unwrap();
        assert!(!line.contains('\n'));
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["_aws"]["Timestamp"], 1_796_617_800_000u64);
        let d = &v["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(d["Namespace"], "fovea-test");
        assert_eq!(d["Dimensions"], json!([["Lake", "Shard"]]));
        assert_eq!(d["Metrics"], json!([{ "Name": "rows", "Unit": "Count" }]));
        assert_eq!(
            (v["Lake"].as_str(), v["Shard"].as_str(), v["rows"].as_f64()),
            (Some("s3://b/l"), Some("shardId-0"), Some(1200.0))
        );
        assert_eq!(v["errorType"], "Throttled");
        // The unknown value is left out, not written as null.
        assert!(v.get("freshness_seconds").is_none());
        assert_eq!(Record::new("n", &[]).to_line(0), None);
    }

    #[test]
    fn more_than_a_hundred_metrics_take_several_directives() {
        let mut r = Record::new("n", &[("Function", "scan")]);
        for i in 0..150 {
            r.metric(&format!("m{i}"), Unit::Count, i as f64);
        }
        let v: Value = serde_json::from_str(&r.to_line(1).unwrap()).unwrap();
        let directives = v["_aws"]["CloudWatchMetrics"].as_array().unwrap();
        assert_eq!(directives.iter().map(|d| d["Metrics"].as_array().unwrap().len()).collect::<Vec<_>>(), [100, 50]);
        assert_eq!(v["m149"], 149.0);
    }

    #[test]
    fn units_follow_the_names() {
        assert_eq!(Unit::of_name("freshness_seconds", Unit::None), Unit::Seconds);
        assert_eq!(Unit::of_name("input_held_bytes", Unit::None), Unit::Bytes);
        assert_eq!(Unit::of_name("storage_gc_bytes_before", Unit::Count), Unit::Bytes);
        assert_eq!(Unit::of_name("bytes_read", Unit::Count), Unit::Bytes);
        assert_eq!(Unit::of_name("shard_millis_behind_latest", Unit::None), Unit::Milliseconds);
        assert_eq!(Unit::of_name("rows", Unit::Count), Unit::Count);
    }
}
