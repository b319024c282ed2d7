//! The conformance suite every [`ChangeSource`] passes (public so that
//! sources in other crates — Kinesis in `fovea-aws`, PostgreSQL in the
//! replayer — run the same checks as the file source here).
//!
//! A [`SourceFixture`] puts the suite's source transactions into its
//! transport (a file, a stream) in its native form and opens sources over
//! it; [`check`] drives them into a [`Recorder`], a [`RecordSink`] that
//! keeps everything pushed, and checks the contract written on
//! [`ChangeSource`]:
//!
//! * every transaction arrives whole (BEGIN, its rows in order, END), in
//!   commit order, with exactly the rows written;
//! * positions never go back, and a push's `next` is not before its
//!   `position`;
//! * a source reopened at a checkpoint's position and [`ChangeSource::state_at`]
//!   delivers every transaction after that position (earlier ones may come
//!   again where the transport redelivers, and must then be identical: the
//!   sink skips them by identity), and none is lost across the reopening;
//! * [`ChangeSource::confirm`] of a covered position succeeds, and a
//!   finite input reports its end once everything is delivered.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use super::source::{ChangeSource, RecordSink, Resume};
use super::{ChangeRecord, SourcePosition};
use fovea_types::error::{Error, Result};

/// The qualified table every suite row goes to: `(k bigint primary key, v bigint)`.
pub const TABLE: &str = "conformance.t";

/// One source transaction of the suite: its id and the rows it inserts
/// into [`TABLE`], `(k, v)`, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuiteTxn {
    /// Source transaction id (also its commit order: ids ascend).
    pub txid: u64,
    /// Rows inserted, `(k, v)`.
    pub rows: Vec<(i64, i64)>,
}

impl SuiteTxn {
    /// The transaction as Debezium's Kafka-style lines (`{"topic","key",
    /// "value"}`): BEGIN, the rows, END; each row's `source` carries the
    /// commit chain (`lsn`, `sequence` naming the previous transaction's
    /// commit) that sources reading shards order transactions by.
    pub fn debezium_lines(&self) -> Vec<String> {
        // As Debezium's PostgreSQL connector numbers them: BEGIN and END
        // ids `txid:lsn` (END's is the commit position), every row's
        // `sequence` naming the previous transaction's commit.
        let ts = 1_800_000_000_000u64 + self.txid;
        let base = 1_000 * self.txid;
        let commit = base + 999;
        let prev = if self.txid > 1 { format!(r#"\"{}\""#, base - 1) } else { "null".into() };
        let mut out = vec![format!(
            r#"{{"topic":"c.transaction","key":{{"id":"{id}:{base}"}},"value":{{"status":"BEGIN","id":"{id}:{base}","event_count":null,"data_collections":null,"ts_ms":{ts}}}}}"#,
            id = self.txid
        )];
        for (i, (k, v)) in self.rows.iter().enumerate() {
            let at = base + 1 + i as u64;
            out.push(format!(
                r#"{{"topic":"c.conformance.t","key":{{"k":{k}}},"value":{{"before":null,"after":{{"k":{k},"v":{v}}},"source":{{"ts_ms":{ts},"schema":"conformance","table":"t","txId":{id},"lsn":{at},"sequence":"[{prev},\"{at}\"]"}},"transaction":{{"id":"{id}:{commit}","total_order":{n},"data_collection_order":{n}}},"op":"c"}}}}"#,
                id = self.txid,
                n = i + 1
            ));
        }
        out.push(format!(
            r#"{{"topic":"c.transaction","key":{{"id":"{id}:{commit}"}},"value":{{"status":"END","id":"{id}:{commit}","event_count":{n},"data_collections":[{{"data_collection":"conformance.t","event_count":{n}}}],"ts_ms":{ts}}}}}"#,
            id = self.txid,
            n = self.rows.len()
        ));
        out
    }
}

/// The suite's transactions `ids` (1-based, ascending), `1 + id % 4` rows each.
pub fn transactions(ids: std::ops::Range<u64>) -> Vec<SuiteTxn> {
    ids.map(|txid| {
        let rows = (0..1 + txid % 4).map(|i| ((txid * 10 + i) as i64, (txid * 7 + i) as i64)).collect();
        SuiteTxn { txid, rows }
    })
    .collect()
}

/// What a source under test reads from.
pub trait SourceFixture {
    /// Appends `txns` to the input, in commit order, after what is there.
    fn append(&mut self, txns: &[SuiteTxn]) -> Result<()>;

    /// Opens a source over the input: from its start, or resuming where a
    /// checkpoint recorded `(position, state)` for the input `name`.
    fn open(&mut self, resume: Option<Resume>) -> Result<Box<dyn ChangeSource>>;

    /// Whether the source ends at the end of its input (a file read once)
    /// rather than following it.
    fn ends(&self) -> bool;
}

/// A [`RecordSink`] that keeps what a source pushes: completed
/// transactions in the order their END arrived, and every push's
/// positions. Violations of the contract are kept as messages.
#[derive(Debug, Default)]
pub struct Recorder {
    /// Completed transactions, first delivery each, in END order.
    pub completed: Vec<SuiteTxn>,
    /// Per completed transaction: the `next` position of its END.
    pub ends: BTreeMap<u64, SourcePosition>,
    /// Transactions delivered again (after a reopening), identical.
    pub redelivered: u64,
    /// What broke the contract.
    pub violations: Vec<String>,
    open: Option<SuiteTxn>,
    last: Option<(SourcePosition, SourcePosition)>,
    state: Option<String>,
}

impl Recorder {
    fn violation(&mut self, message: String) {
        if self.violations.len() < 20 {
            self.violations.push(message);
        }
    }

    fn row(&mut self, after: Option<&Vec<(String, Json)>>, position: SourcePosition) -> Option<(i64, i64)> {
        let column = |name: &str| after?.iter().find(|(n, _)| n == name).and_then(|(_, v)| v.as_i64());
        let row = column("k").zip(column("v"));
        if row.is_none() {
            self.violation(format!("a row at {position} without integer k and v: {after:?}"));
        }
        row
    }
}

impl RecordSink for Recorder {
    fn push(&mut self, record: ChangeRecord, position: SourcePosition, next: SourcePosition) -> Result<()> {
        if next < position {
            self.violation(format!("a push's next {next} is before its position {position}"));
        }
        if let Some((last, _)) = self.last
            && position < last
        {
            self.violation(format!("position {position} after position {last}: positions went back"));
        }
        self.last = Some((position, next));
        // A source may name a transaction `txid` or `txid:lsn`.
        let txid = |t: &str| {
            t.split(':')
                .next()
                .and_then(|x| x.parse::<u64>().ok())
                .ok_or_else(|| Error::invariant(format!("suite txid {t:?}")))
        };
        match record {
            ChangeRecord::Begin { txid: t, .. } => {
                if let Some(open) = &self.open {
                    let open = open.txid;
                    self.violation(format!("BEGIN of {t} at {position} inside transaction {open}"));
                }
                self.open = Some(SuiteTxn { txid: txid(&t)?, rows: Vec::new() });
            }
            ChangeRecord::Row(r) => {
                if r.table != TABLE {
                    self.violation(format!("a row of table {} at {position}", r.table));
                }
                let row = self.row(r.after.as_ref(), position);
                match (&mut self.open, row) {
                    (Some(open), Some(row)) => open.rows.push(row),
                    (None, _) => self.violation(format!("a row at {position} outside a transaction")),
                    (Some(_), None) => {}
                }
            }
            ChangeRecord::End { txid: t, .. } => {
                let t = txid(&t)?;
                match self.open.take() {
                    Some(txn) if txn.txid == t => {
                        if let Some(first) = self.completed.iter().find(|c| c.txid == t) {
                            if *first != txn {
                                let message =
                                    format!("transaction {t} delivered again differently: {first:?} then {txn:?}");
                                self.violation(message);
                            }
                            self.redelivered += 1;
                        } else {
                            self.completed.push(txn);
                            self.ends.insert(t, next);
                        }
                    }
                    other => self.violation(format!("END of {t} at {position} closing {other:?}")),
                }
            }
            ChangeRecord::Skip => {}
            other => self.violation(format!("an unexpected record at {position}: {other:?}")),
        }
        Ok(())
    }

    fn is_applied(&self, identity: &str) -> bool {
        identity.split(':').next().and_then(|t| t.parse::<u64>().ok()).is_some_and(|t| self.ends.contains_key(&t))
    }

    fn set_source_state(&mut self, state: Option<String>) {
        self.state = state;
    }

    fn sync(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Polls `source` into `sink` until `done` says so or `limit` passes;
/// returns whether the source reported its end.
fn poll_until(
    source: &mut dyn ChangeSource,
    sink: &mut Recorder,
    limit: Duration,
    done: impl Fn(&Recorder) -> bool,
) -> Result<bool> {
    let began = Instant::now();
    loop {
        let polled = source.poll(sink)?;
        if polled.end.is_some() {
            return Ok(true);
        }
        if done(sink) || began.elapsed() > limit {
            return Ok(false);
        }
    }
}

fn assert_clean(sink: &Recorder, stage: &str) {
    assert!(sink.violations.is_empty(), "{stage}: the source broke its contract:\n{}", sink.violations.join("\n"));
}

/// Runs the suite on sources of `fixture`; panics, naming the broken
/// promise, on the first violation.
pub fn check(fixture: &mut dyn SourceFixture) {
    const LIMIT: Duration = Duration::from_secs(60);
    let first = transactions(1..41);
    fixture.append(&first).unwrap();

    // Everything, whole and in commit order.
    let mut source = fixture.open(None).unwrap();
    let name = source.name().to_owned();
    let mut sink = Recorder::default();
    let ended = poll_until(source.as_mut(), &mut sink, LIMIT, |s| s.completed.len() >= first.len()).unwrap();
    assert_clean(&sink, "a first read");
    if fixture.ends() {
        let ended = ended || poll_until(source.as_mut(), &mut sink, LIMIT, |_| false).unwrap();
        assert!(ended, "a finite input must report its end once read");
    }
    assert_eq!(sink.completed, first, "the transactions read differ from those written (or their order)");
    assert!(source.position() >= *sink.ends.values().max().unwrap(), "position() is before the last END pushed");
    assert_clean(&sink, "a first read");

    // A checkpoint in the middle: reopened there, with more written since,
    // the source delivers everything after it, once each.
    let checkpointed = first[first.len() / 2].txid;
    let position = sink.ends[&checkpointed];
    let state = source.state_at(position).unwrap();
    source.confirm(position).unwrap();
    let _ = source.lag();
    drop(source);
    let second = transactions(41..61);
    fixture.append(&second).unwrap();
    let mut source = fixture.open(Some(Resume { input: name.clone(), position, state })).unwrap();
    assert_eq!(source.name(), name, "a reopened source names the same input");
    // What a sink remembers of applied transactions (its dedup window).
    let mut again = Recorder {
        ends: sink.ends.iter().filter(|(t, _)| **t <= checkpointed).map(|(t, p)| (*t, *p)).collect(),
        completed: sink.completed.iter().filter(|t| t.txid <= checkpointed).cloned().collect(),
        ..Recorder::default()
    };
    let want: Vec<SuiteTxn> = first.iter().chain(&second).cloned().collect();
    let ended = poll_until(source.as_mut(), &mut again, LIMIT, |s| s.completed.len() >= want.len()).unwrap();
    assert_clean(&again, "a read resumed at a checkpoint");
    if fixture.ends() {
        let ended = ended || poll_until(source.as_mut(), &mut again, LIMIT, |_| false).unwrap();
        assert!(ended, "a finite input must report its end once read");
    }
    assert_eq!(
        again.completed, want,
        "resumed after transaction {checkpointed}: the transactions read differ from those written (lost, or out of order)"
    );
    assert_clean(&again, "a read resumed at a checkpoint");
    let end = *again.ends.values().max().unwrap();
    source.confirm(end).unwrap();
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::PathBuf;

    use super::*;
    use crate::InputFormat;
    use crate::file::FileSource;

    /// A JSON-lines file, read once to its end or followed as it grows.
    struct FileFixture {
        _dir: tempfile::TempDir,
        path: PathBuf,
        follow: bool,
    }

    impl FileFixture {
        fn new(follow: bool) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("input.jsonl");
            std::fs::write(&path, "").unwrap();
            FileFixture { _dir: dir, path, follow }
        }
    }

    impl SourceFixture for FileFixture {
        fn append(&mut self, txns: &[SuiteTxn]) -> Result<()> {
            let mut f = std::fs::OpenOptions::new().append(true).open(&self.path)?;
            for line in txns.iter().flat_map(SuiteTxn::debezium_lines) {
                writeln!(f, "{line}")?;
            }
            Ok(f.flush()?)
        }

        fn open(&mut self, resume: Option<Resume>) -> Result<Box<dyn ChangeSource>> {
            let poll = Duration::from_millis(5);
            Ok(Box::new(FileSource::open(&self.path, resume.as_ref(), InputFormat::Auto, self.follow, poll, None)?))
        }

        fn ends(&self) -> bool {
            !self.follow
        }
    }

    #[test]
    fn a_file_read_to_its_end_conforms() {
        check(&mut FileFixture::new(false));
    }

    #[test]
    fn a_followed_file_conforms() {
        check(&mut FileFixture::new(true));
    }

    /// The suite catches what it promises to: a source that loses a
    /// transaction when it reopens fails it.
    #[test]
    #[should_panic(expected = "lost, or out of order")]
    fn a_source_that_skips_a_transaction_on_reopening_fails_the_suite() {
        struct Lossy(FileFixture);
        impl SourceFixture for Lossy {
            fn append(&mut self, txns: &[SuiteTxn]) -> Result<()> {
                self.0.append(txns)
            }
            fn open(&mut self, resume: Option<Resume>) -> Result<Box<dyn ChangeSource>> {
                // Resumes one transaction late: at the END of the one after.
                let resume = resume.map(|mut r| {
                    let text = std::fs::read_to_string(&self.0.path).unwrap();
                    let mut offset = 0u64;
                    let (mut line, mut ends) = (0u64, 0);
                    for l in text.lines() {
                        let start = offset;
                        line += 1;
                        offset += l.len() as u64 + 1;
                        if start >= r.position.offset && l.contains(r#""status":"END""#) {
                            ends += 1;
                            if ends == 1 {
                                // The file source's position after a line: its number and the next line's start.
                                r.position = SourcePosition { line, offset };
                                break;
                            }
                        }
                    }
                    r
                });
                self.0.open(resume)
            }
            fn ends(&self) -> bool {
                true
            }
        }
        check(&mut Lossy(FileFixture::new(false)));
    }
}
