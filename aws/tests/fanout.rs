//! Kinesis enhanced fan-out (`kinesis://…?consumer=NAME`) on kinesis-local,
//! the stand-in that serves SubscribeToShard: the `ChangeSource`
//! conformance suite read by subscriptions — with one shard and with three,
//! subscriptions renewed every second, and a stream split and merged
//! between the suite's two writes (the closed parents are read to their
//! ends before their children start) — and the consumer registered once,
//! then reused.
//!
//! One test: it sets the AWS environment before any other thread runs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use fovea_core::cdc::conformance::{SourceFixture, SuiteTxn, check};
use fovea_core::cdc::source::{ChangeSource, Lag, Polled, RecordSink, Resume};
use fovea_core::cdc::{InputFormat, SourcePosition};
use fovea_testkit::kinesis::{KinesisProducer, debezium_server_record};
use fovea_testkit::moto::KinesisLocal;

#[test]
fn enhanced_fan_out_on_a_local_kinesis() {
    let kinesis = KinesisLocal::start().unwrap();
    for (k, v) in kinesis.env() {
        // SAFETY: this binary has one test and this is its first statement:
        // no other thread exists yet that could read the environment.
        unsafe { std::env::set_var(k, v) };
    }
    for (shards, reshard) in [(1usize, false), (3, false), (2, true)] {
        let producer = KinesisProducer::connect(Some(&kinesis.endpoint)).unwrap();
        let stream = format!("fan-out-{shards}-{reshard}");
        producer.create_stream(&stream, shards as i32).unwrap();
        let mut fixture = FanOutFixture { producer, stream, reshard, appended: 0, shards: Arc::default() };
        check(&mut fixture);
        let seen = fixture.shards.lock().unwrap().clone();
        // Every shard open at the end was read by fan-out (a shard closed
        // when a source opens is polled to its end: it is history).
        let open = fixture.producer.open_shards(&fixture.stream).unwrap();
        // A split and a merge leave as many open shards as before.
        assert_eq!(open.len(), shards, "{open:?}");
        for (id, _, _) in &open {
            let name = format!("{}/{id}", fixture.stream);
            assert_eq!(seen.get(&name), Some(&true), "{name} is read by fan-out: {seen:?}");
        }
        if reshard {
            assert!(seen.len() > shards, "the children were read too: {seen:?}");
        }
    }
    a_shard_split_under_a_subscription_is_read_to_its_end(&kinesis);
}

/// A shard split while a following source is subscribed to it: the
/// parent's remaining records, then its children's, every transaction once
/// and in order, the children read by fan-out. (Kinesis ends the parent's
/// subscription with its children named; kinesis-local does not, so here
/// the renewal's probe finds the parent's end.)
fn a_shard_split_under_a_subscription_is_read_to_its_end(kinesis: &KinesisLocal) {
    use fovea_core::cdc::conformance::{Recorder, transactions};
    let producer = KinesisProducer::connect(Some(&kinesis.endpoint)).unwrap();
    producer.create_stream("split-live", 1).unwrap();
    let put = |txns: &[SuiteTxn]| {
        let mut records = Vec::new();
        for line in txns.iter().flat_map(SuiteTxn::debezium_lines) {
            records.extend(debezium_server_record(&line).unwrap());
        }
        producer.put("split-live", &records).unwrap();
    };
    let url = "kinesis://split-live?poll_ms=10&consumer=fovea-live&renew_secs=1";
    let options = fovea_aws::kinesis::KinesisOptions::parse(url, InputFormat::Auto, true).unwrap();
    let mut source = fovea_aws::kinesis::KinesisSource::open(options, None).unwrap();
    let mut sink = Recorder::default();
    let poll_until = |source: &mut fovea_aws::kinesis::KinesisSource, sink: &mut Recorder, n: usize| {
        let began = std::time::Instant::now();
        while sink.completed.len() < n {
            assert!(
                began.elapsed() < std::time::Duration::from_secs(60),
                "{} of {n} transactions",
                sink.completed.len()
            );
            source.poll(sink).unwrap();
        }
    };
    put(&transactions(1..21));
    poll_until(&mut source, &mut sink, 20);
    assert!(source.lag().shards.iter().all(|s| s.fan_out), "{:?}", source.lag().shards);
    let open = producer.open_shards("split-live").unwrap();
    producer.split("split-live", &open[0].0).unwrap();
    put(&transactions(21..41));
    poll_until(&mut source, &mut sink, 40);
    assert!(sink.violations.is_empty(), "{:?}", sink.violations);
    assert_eq!(sink.completed, transactions(1..41));
    let shards = source.lag().shards;
    assert_eq!(shards.len(), 2, "the parent is finished, its two children read: {shards:?}");
    assert!(shards.iter().all(|s| s.fan_out && !s.name.ends_with("shardId-000000000000")), "{shards:?}");
}

/// A stream fed as Debezium Server feeds it, read by fan-out as consumer
/// `fovea-test` (renewed every second); with `reshard`, its first shard is
/// split and two of the open shards merged before the second write.
struct FanOutFixture {
    producer: KinesisProducer,
    stream: String,
    reshard: bool,
    appended: usize,
    /// Every shard the sources read, and whether by fan-out when last seen.
    shards: Arc<Mutex<BTreeMap<String, bool>>>,
}

impl SourceFixture for FanOutFixture {
    fn append(&mut self, txns: &[SuiteTxn]) -> fovea_core::Result<()> {
        if self.reshard && self.appended > 0 {
            let open = self.producer.open_shards(&self.stream)?;
            self.producer.split(&self.stream, &open[0].0)?;
            let open = self.producer.open_shards(&self.stream)?;
            let n = open.len();
            self.producer.merge(&self.stream, &open[n - 2].0, &open[n - 1].0)?;
        }
        self.appended += 1;
        let mut records = Vec::new();
        for line in txns.iter().flat_map(SuiteTxn::debezium_lines) {
            records.extend(debezium_server_record(&line)?);
        }
        self.producer.put(&self.stream, &records).map(drop)
    }

    fn open(&mut self, resume: Option<Resume>) -> fovea_core::Result<Box<dyn ChangeSource>> {
        let url = format!("kinesis://{}?poll_ms=10&consumer=fovea-test&renew_secs=1", self.stream);
        let options = fovea_aws::kinesis::KinesisOptions::parse(&url, InputFormat::Auto, false)?;
        let inner = fovea_aws::kinesis::KinesisSource::open(options, resume.as_ref())?;
        Ok(Box::new(Watched { inner, shards: Arc::clone(&self.shards) }))
    }

    fn ends(&self) -> bool {
        true
    }
}

/// A source that notes, after every poll, which shards it reads and how.
struct Watched {
    inner: fovea_aws::kinesis::KinesisSource,
    shards: Arc<Mutex<BTreeMap<String, bool>>>,
}

impl ChangeSource for Watched {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn poll(&mut self, sink: &mut dyn RecordSink) -> fovea_core::Result<Polled> {
        let polled = self.inner.poll(sink)?;
        let lag = self.inner.lag();
        let mut shards = self.shards.lock().unwrap();
        for s in lag.shards {
            shards.insert(s.name, s.fan_out);
        }
        Ok(polled)
    }

    fn position(&self) -> SourcePosition {
        self.inner.position()
    }

    fn state_at(&mut self, position: SourcePosition) -> fovea_core::Result<Option<String>> {
        self.inner.state_at(position)
    }

    fn confirm(&mut self, position: SourcePosition) -> fovea_core::Result<()> {
        self.inner.confirm(position)
    }

    fn lag(&mut self) -> Lag {
        self.inner.lag()
    }
}
