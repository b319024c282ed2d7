//! Inputs: the [`ChangeSource`] contract every input implements (a file,
//! standard input, a PostgreSQL slot, Kinesis streams), and reading a file
//! line by line with positions ([`LineSource`]: plain or gzip, detected by
//! its magic bytes, or standard input). A file can resume at a byte offset
//! of its decompressed stream; standard input cannot.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use super::SourcePosition;
use fovea_types::error::{Error, Result};

/// Where a [`ChangeSource`] pushes its records: the engine's
/// `fovea_core::sink::Sink`, or anything else that keeps this contract (a
/// recorder in the sources' conformance suite).
///
/// Contract:
/// * [`Self::push`] takes one record read at `position`; `next` is the
///   position after it (where a checkpoint taken now would resume). Records
///   of one source transaction arrive between its BEGIN and END, in order;
///   an error means this record was not applied, and the sink takes no
///   more.
/// * [`Self::is_applied`] tells whether the source transaction with this
///   identity was applied (by this sink or, within its dedup window, before
///   a restart): a source that may redeliver asks before holding one back.
/// * [`Self::set_source_state`] sets what the next checkpoints record for
///   the source to reopen with, besides the position.
/// * [`Self::sync`] returns once everything pushed so far is applied.
pub trait RecordSink {
    /// Takes one record read at `position`; `next` is the position after it.
    fn push(&mut self, record: super::ChangeRecord, position: SourcePosition, next: SourcePosition) -> Result<()>;

    /// Whether the source transaction `identity` was applied.
    fn is_applied(&self, identity: &str) -> bool;

    /// What the next checkpoints record for the source to reopen with.
    fn set_source_state(&mut self, state: Option<String>);

    /// Waits until everything pushed so far is applied.
    fn sync(&mut self) -> Result<()>;
}

/// What a checkpoint records of an input for a source to reopen there
/// (see [`ChangeSource::state_at`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resume {
    /// The input's name ([`ChangeSource::name`]): a source reopens only at
    /// a checkpoint of its own input.
    pub input: String,
    /// The position the checkpoint resumes at.
    pub position: SourcePosition,
    /// [`ChangeSource::state_at`] of that position.
    pub state: Option<String>,
}

/// A change stream feeding a [`RecordSink`].
///
/// Contract, for every implementation:
/// * **Order and atomicity**: [`Self::poll`] pushes records into the sink in
///   source commit order. A source whose records of one transaction can
///   interleave with others' (Kinesis shards) pushes whole transactions; a
///   source that delivers them in order (a file, a replication slot) may
///   stop in the middle of one (the sink keeps it invisible until its end).
/// * **Positions**: [`Self::position`] is the position after the last record
///   pushed, totally ordered over the life of the input; a checkpoint that
///   resumes at position `p` records [`Self::state_at`]`(p)`, and a source
///   reopened from that checkpoint delivers again every record at or after
///   `p` and — where its transport redelivers (Kinesis) — possibly earlier
///   ones, which the sink skips by their source transaction's identity.
/// * **Confirmation**: [`Self::confirm`]`(p)` is called once a committed
///   checkpoint covers everything before `p`; the source may then let its
///   transport drop it (a PostgreSQL slot's WAL). Nothing before a confirmed
///   position is needed again.
/// * **Failures**: an error names the input and, for a bad record, its
///   position (and where known table and transaction). Nothing of the
///   record's transaction has been made visible; everything before is.
pub trait ChangeSource: Send {
    /// The input's name in checkpoints: a checkpoint resumes only the input
    /// it names.
    fn name(&self) -> &str;

    /// Pushes the records available now into `sink`. Returns soon when
    /// nothing is available (waiting at most about its poll interval).
    fn poll(&mut self, sink: &mut dyn RecordSink) -> Result<Polled>;

    /// The position after the last record pushed.
    fn position(&self) -> SourcePosition;

    /// The state a checkpoint resuming at `position` (at most
    /// [`Self::position`]) records with it, for the source to reopen there.
    fn state_at(&mut self, position: SourcePosition) -> Result<Option<String>>;

    /// A committed checkpoint covers everything before `position`.
    fn confirm(&mut self, position: SourcePosition) -> Result<()>;

    /// How far behind its tip the source is, where it knows.
    fn lag(&mut self) -> Lag;
}

/// What one [`ChangeSource::poll`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Polled {
    /// Records pushed.
    pub records: u64,
    /// The source moved without records for the sink (WAL of other
    /// databases): worth a checkpoint so the transport can drop it.
    pub moved: bool,
    /// The input is finished (the end of a file; Kinesis caught up when
    /// not following): at this position.
    pub end: Option<SourcePosition>,
}

/// How far behind its tip a source is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lag {
    /// Bytes not read yet (a plain file, WAL).
    pub bytes: Option<u64>,
    /// Per shard (Kinesis): its name, milliseconds behind the newest
    /// record (`MillisBehindLatest`), records read, whether at its tip.
    pub shards: Vec<ShardLag>,
    /// Source transactions held until they are complete and in order, and
    /// the bytes of their records.
    pub held: (u64, u64),
}

/// One shard's progress.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardLag {
    /// Stream and shard, `stream/shardId-…`.
    pub name: String,
    /// `MillisBehindLatest` of its last read.
    pub millis_behind: u64,
    /// Records read from it.
    pub records: u64,
    /// What its reader is doing.
    pub state: ShardState,
    /// Reads retried after a failure.
    pub retries: u64,
    /// Read by enhanced fan-out (pushed over a subscription), not polled.
    pub fan_out: bool,
}

/// What a shard's reader is doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShardState {
    /// Reading records behind the tip.
    #[default]
    Reading,
    /// Its last read was empty with nothing behind.
    AtTip,
    /// Its reads fail and are retried with backoff.
    Retrying,
}

impl ShardState {
    /// Its name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ShardState::Reading => "reading",
            ShardState::AtTip => "at_tip",
            ShardState::Retrying => "retrying",
        }
    }
}

/// A line-oriented input with positions.
pub struct LineSource {
    reader: Box<dyn BufRead + Send>,
    next: SourcePosition,
    name: String,
    /// Follow a growing file: a last line without its newline is kept
    /// back until the rest arrives.
    follow: bool,
    partial: String,
}

impl LineSource {
    /// Opens `path` (`-` for standard input), positioned at `start`.
    pub fn open(path: &Path, start: SourcePosition) -> Result<Self> {
        if path == Path::new("-") {
            if start.offset > 0 {
                return Err(Error::Input {
                    position: start,
                    table: None,
                    txid: None,
                    message: "standard input cannot resume from a checkpoint; replay from a file to resume".into(),
                });
            }
            return Ok(Self {
                reader: Box::new(BufReader::new(std::io::stdin())),
                next: start,
                name: "stdin".into(),
                follow: false,
                partial: String::new(),
            });
        }
        let mut reader = open_stream(path)?;
        // Skip to the resume offset (decompressing what precedes it).
        let skipped = std::io::copy(&mut (&mut reader).take(start.offset), &mut std::io::sink())?;
        if skipped != start.offset {
            return Err(Error::Input {
                position: start,
                table: None,
                txid: None,
                message: format!(
                    "the input {} is shorter than the checkpointed position; was it replaced?",
                    path.display()
                ),
            });
        }
        Ok(Self {
            reader,
            next: start,
            name: PathBuf::from(path).display().to_string(),
            follow: false,
            partial: String::new(),
        })
    }

    /// Opens the file at `path` to resume after a checkpoint that read the
    /// same input name up to `position`, recording `state` (see
    /// [`FileFingerprint`]). A file whose first bytes are not those the
    /// checkpoint saw is another file at the same path: it is read from its
    /// start (transactions already applied are skipped by their identity)
    /// instead of from the old file's offset, with a warning. Returns the
    /// source and the fingerprint later checkpoints record.
    pub fn resume(path: &Path, position: SourcePosition, state: Option<&str>) -> Result<(Self, FileFingerprint)> {
        match state.and_then(FileFingerprint::parse) {
            Some(then) if then.matches(path)? => Ok((Self::open(path, position)?, then)),
            Some(_) => {
                tracing::warn!(
                    input = %path.display(),
                    "the input is not the file the last checkpoint read (its first bytes differ): reading it from the start; transactions already applied are skipped"
                );
                Ok((Self::open(path, SourcePosition::default())?, FileFingerprint::read(path)?))
            }
            // Checkpoints of older versions carry no fingerprint.
            None => Ok((Self::open(path, position)?, FileFingerprint::read(path)?)),
        }
    }

    /// Follows the file as it grows (like `tail -f`): at the end,
    /// [`Self::next_line`] returns `None` and may be called again later; a
    /// line is returned only once its newline was written.
    pub fn follow(mut self) -> Self {
        self.follow = true;
        self
    }

    /// Name for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Position of the next line.
    pub fn position(&self) -> SourcePosition {
        self.next
    }

    /// Reads the next line into `buf` (without the newline); `None` at the end.
    pub fn next_line(&mut self, buf: &mut String) -> Result<Option<SourcePosition>> {
        buf.clear();
        let line = self.append_line(buf)?;
        Ok(line.map(|(pos, range)| {
            buf.truncate(range.end);
            pos
        }))
    }

    /// Appends the next line to `buf` (with its newline, which the range
    /// leaves out): the line's position and its range in `buf`; `None` at
    /// the end (`buf` is then as it was). Many lines read into one buffer
    /// take one allocation, not one each.
    pub fn append_line(&mut self, buf: &mut String) -> Result<Option<(SourcePosition, std::ops::Range<usize>)>> {
        let start = buf.len();
        let n = read_line(&mut *self.reader, buf).map_err(|e| self.read_error(e))?;
        if self.follow {
            if !self.partial.is_empty() {
                buf.insert_str(start, &self.partial);
            }
            if !buf.ends_with('\n') {
                self.partial = buf.split_off(start);
                return Ok(None);
            }
            self.partial.clear();
        } else if n == 0 {
            return Ok(None);
        }
        Ok(Some(self.line_taken(buf, start..buf.len())))
    }

    /// Counts the line at `line` of `buf` (its newline included) as read:
    /// its position, and its range without the newline (and any CR).
    fn line_taken(&mut self, buf: &str, line: std::ops::Range<usize>) -> (SourcePosition, std::ops::Range<usize>) {
        let pos = self.next;
        self.next = SourcePosition { line: pos.line + 1, offset: pos.offset + line.len() as u64 };
        let end = line.start + buf[line.clone()].trim_end_matches(['\n', '\r']).len();
        (SourcePosition { line: pos.line + 1, offset: pos.offset }, line.start..end)
    }

    /// A read of this input that failed, at the next line's position.
    fn read_error(&self, e: std::io::Error) -> Error {
        Error::Input {
            position: self.next,
            table: None,
            txid: None,
            message: format!("cannot read {}: {e}", self.name),
        }
    }

    /// Appends to `buf` the whole lines the reader holds already (reading
    /// more only when it holds nothing), at most `max`, calling `line` with
    /// each one's position, the position after it and its range in `buf`,
    /// as [`Self::append_line`] would one at a time. Returns how many: 0
    /// where the next line is not whole in what the reader holds, or is no
    /// UTF-8, or at the end, or when following a file. [`Self::append_line`] then reads (or refuses)
    /// the next line as usual.
    ///
    /// A batch of lines takes one copy, one UTF-8 check and one scan for
    /// newlines, where [`Self::append_line`] takes a call of each per line.
    pub fn append_held_lines(
        &mut self,
        buf: &mut String,
        max: usize,
        mut line: impl FnMut(SourcePosition, SourcePosition, std::ops::Range<usize>),
    ) -> Result<usize> {
        if self.follow || max == 0 {
            return Ok(0);
        }
        let held = match self.reader.fill_buf() {
            Ok(held) => held,
            Err(e) => return Err(self.read_error(e)),
        };
        // The end of the `max`-th whole line held (or of the last one).
        let Some(end) = memchr::memchr_iter(b'\n', held).take(max).last().map(|nl| nl + 1) else { return Ok(0) };
        let text = match simdutf8::compat::from_utf8(&held[..end]) {
            Ok(text) => text,
            Err(e) => {
                // The lines before the first that is no UTF-8 (it is
                // `append_line`'s to refuse, with its position).
                let Some(nl) = memchr::memrchr(b'\n', &held[..e.valid_up_to()]) else { return Ok(0) };
                simdutf8::basic::from_utf8(&held[..=nl])
                    .map_err(|_| fovea_types::error::Error::invariant("a prefix found UTF-8 did not validate"))?
            }
        };
        let end = text.len();
        let start = buf.len();
        buf.push_str(text);
        let mut at = start;
        let mut count = 0;
        for nl in memchr::memchr_iter(b'\n', &buf.as_bytes()[start..]).map(|i| start + i) {
            let (pos, range) = self.line_taken(buf, at..nl + 1);
            line(pos, self.next, range);
            at = nl + 1;
            count += 1;
        }
        self.reader.consume(end);
        Ok(count)
    }
}

/// [`BufRead::read_line`], the line's bytes validated by simdutf8 (the
/// reader thread validates every byte of the input; std's validation was
/// a fifth of that thread's time). On an error, `buf` is as it was.
fn read_line(reader: &mut dyn BufRead, buf: &mut String) -> std::io::Result<usize> {
    /// Cuts `bytes` back to `len` when dropped (a panic in the reader
    /// included), unless the bytes after `len` were found valid.
    struct Appended<'b> {
        bytes: &'b mut Vec<u8>,
        len: usize,
    }
    impl Drop for Appended<'_> {
        fn drop(&mut self) {
            self.bytes.truncate(self.len);
        }
    }
    let len = buf.len();
    // SAFETY: the bytes appended after `len` stay in the string only once
    // validated as UTF-8; `Appended` cuts them off otherwise, also when
    // the reader panics, so `buf` is valid UTF-8 whenever it is seen again.
    let mut appended = Appended { bytes: unsafe { buf.as_mut_vec() }, len };
    let n = reader.read_until(b'\n', appended.bytes)?;
    if simdutf8::basic::from_utf8(&appended.bytes[len..]).is_err() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "stream did not contain valid UTF-8"));
    }
    appended.len = appended.bytes.len();
    Ok(n)
}

/// The decompressed stream of the file at `path` (gzip is detected by its
/// magic bytes).
fn open_stream(path: &Path) -> Result<Box<dyn BufRead + Send>> {
    let mut file = File::open(path)
        .map_err(|e| Error::Io(std::io::Error::new(e.kind(), format!("cannot open input {}: {e}", path.display()))))?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic)?;
    let file = File::open(path)?;
    Ok(if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(BufReader::with_capacity(1 << 20, flate2::read::MultiGzDecoder::new(file)))
    } else {
        Box::new(BufReader::with_capacity(1 << 20, file))
    })
}

/// What tells one input file from another at the same path: the XXH64 of
/// the first bytes of its decompressed stream (up to
/// [`FileFingerprint::MAX_LEN`]; fewer while the file is shorter). A file
/// that grew (a stream appended to, followed with `fovea serve`) keeps its
/// fingerprint; a file replaced by another does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileFingerprint {
    /// Bytes digested.
    pub len: u64,
    /// Their XXH64 (seed 0).
    pub digest: u64,
}

impl FileFingerprint {
    /// Bytes digested at most.
    pub const MAX_LEN: u64 = 64 * 1024;

    /// The fingerprint of the file at `path` now.
    pub fn read(path: &Path) -> Result<Self> {
        let (len, digest) = Self::digest(path, Self::MAX_LEN)?;
        Ok(FileFingerprint { len, digest })
    }

    /// Whether the file at `path` starts with the bytes this fingerprint
    /// digested.
    pub fn matches(&self, path: &Path) -> Result<bool> {
        let (len, digest) = Self::digest(path, self.len)?;
        Ok(len == self.len && digest == self.digest)
    }

    fn digest(path: &Path, max: u64) -> Result<(u64, u64)> {
        let mut head = Vec::new();
        open_stream(path)?.take(max).read_to_end(&mut head)?;
        Ok((head.len() as u64, twox_hash::XxHash64::oneshot(0, &head)))
    }

    /// As a checkpoint records it: `file:xxh64:<len>:<digest hex>`.
    pub fn to_state(&self) -> String {
        format!("file:xxh64:{}:{:016x}", self.len, self.digest)
    }

    /// Reads [`Self::to_state`]'s form; `None` for anything else.
    pub fn parse(state: &str) -> Option<Self> {
        let rest = state.strip_prefix("file:xxh64:")?;
        let (len, digest) = rest.split_once(':')?;
        Some(FileFingerprint { len: len.parse().ok()?, digest: u64::from_str_radix(digest, 16).ok()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Lines read as std's `read_line` reads them: the same lines and
    /// counts, the same refusals of bytes that are no UTF-8, and after a
    /// refusal the buffer as it was.
    #[test]
    fn lines_read_as_std_reads_them() {
        let inputs: [&[u8]; 6] = [
            b"a\nbc\n\nlast",
            "\u{e9}t\u{e9}\n\u{1f600}\n".as_bytes(),
            b"ok\n\xff\xfe\nafter\n",
            b"cut \xe2\x82",
            b"\xc3\n",
            b"",
        ];
        for input in inputs {
            let (mut ours, mut std) = (std::io::Cursor::new(input), std::io::Cursor::new(input));
            let (mut a, mut b) = (String::from("kept:"), String::from("kept:"));
            loop {
                let (x, y) = (read_line(&mut ours, &mut a), std.read_line(&mut b));
                assert_eq!(x.as_ref().map_err(|e| e.kind()), y.as_ref().map_err(|e| e.kind()), "{input:?}");
                assert_eq!(a, b, "{input:?}");
                if !matches!(x, Ok(n) if n > 0) {
                    break;
                }
            }
        }
    }

    /// Every line a source yields, as the reader thread reads them: held
    /// lines in batches of at most `max` when `held`, else one at a time;
    /// and how it ended (the error's position and message).
    fn read_all(
        input: &[u8],
        capacity: usize,
        held: bool,
        max: usize,
    ) -> (Vec<(SourcePosition, SourcePosition, String)>, Option<String>) {
        let mut src = LineSource {
            reader: Box::new(BufReader::with_capacity(capacity, std::io::Cursor::new(input.to_vec()))),
            next: SourcePosition::default(),
            name: "test".into(),
            follow: false,
            partial: String::new(),
        };
        let mut text = String::from("kept:");
        let (mut ranges, mut end) = (Vec::new(), None);
        loop {
            if held {
                match src.append_held_lines(&mut text, max, |pos, next, range| ranges.push((pos, next, range))) {
                    Ok(0) => {}
                    Ok(n) => {
                        assert!(n <= max);
                        continue;
                    }
                    Err(e) => {
                        end = Some(e.to_string());
                        break;
                    }
                }
            }
            match src.append_line(&mut text) {
                Ok(Some((pos, range))) => ranges.push((pos, src.position(), range)),
                Ok(None) => break,
                Err(e) => {
                    end = Some(e.to_string());
                    break;
                }
            }
        }
        assert!(text.starts_with("kept:"));
        (ranges.into_iter().map(|(pos, next, range)| (pos, next, text[range].to_owned())).collect(), end)
    }

    #[test]
    fn held_lines_read_as_lines_read_one_at_a_time() {
        let mut inputs: Vec<Vec<u8>> = [
            &b"a\nbc\n\nlast"[..],
            "\u{e9}t\u{e9}\r\n\u{1f600}\r\r\n\n".as_bytes(),
            b"ok\nfine\n\xff\xfe\nafter\n",
            b"one\ncut \xe2\x82",
            b"\xc3\n",
            b"\r\n\r\n",
            b"",
        ]
        .iter()
        .map(|i| i.to_vec())
        .collect();
        // Longer lines, some across any buffer's end, a bad byte late.
        let mut long: Vec<u8> =
            (0..300).flat_map(|i| format!("{{\"n\":{i},\"s\":\"{}\"}}\n", "x".repeat(i % 37)).into_bytes()).collect();
        inputs.push(long.clone());
        long.extend_from_slice(b"tail \xe9 bad\nnever\n");
        inputs.push(long);
        for input in &inputs {
            let expected = read_all(input, 1 << 20, false, 0);
            for capacity in [1, 2, 7, 64, 1000, 1 << 20] {
                for max in [1, 2, 5, 4096] {
                    assert_eq!(
                        read_all(input, capacity, true, max),
                        expected,
                        "capacity {capacity}, max {max}: {input:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn follow_returns_a_line_only_once_its_newline_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        let mut f = File::create(&path).unwrap();
        f.write_all(b"one\ntw").unwrap();
        f.flush().unwrap();
        let mut src = LineSource::open(&path, SourcePosition::default()).unwrap().follow();
        let mut buf = String::new();
        assert_eq!(src.next_line(&mut buf).unwrap(), Some(SourcePosition { line: 1, offset: 0 }));
        assert_eq!(buf, "one");
        assert_eq!(src.next_line(&mut buf).unwrap(), None);
        assert_eq!(src.position(), SourcePosition { line: 1, offset: 4 });
        f.write_all(b"o\nthree\n").unwrap();
        f.flush().unwrap();
        assert_eq!(src.next_line(&mut buf).unwrap(), Some(SourcePosition { line: 2, offset: 4 }));
        assert_eq!(buf, "two");
        assert_eq!(src.next_line(&mut buf).unwrap(), Some(SourcePosition { line: 3, offset: 8 }));
        assert_eq!(src.next_line(&mut buf).unwrap(), None);
        assert_eq!(src.position(), SourcePosition { line: 3, offset: 14 });
    }

    #[test]
    fn lines_appended_to_one_buffer_keep_their_ranges_and_positions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        let mut f = File::create(&path).unwrap();
        f.write_all("a\r\nbé\n\nc".as_bytes()).unwrap();
        f.flush().unwrap();
        let mut src = LineSource::open(&path, SourcePosition::default()).unwrap().follow();
        let mut text = String::from("kept");
        let mut got = Vec::new();
        while let Some((pos, range)) = src.append_line(&mut text).unwrap() {
            got.push((pos, text[range].to_owned()));
        }
        let at = |line, offset| SourcePosition { line, offset };
        assert_eq!(got, [(at(1, 0), "a".to_owned()), (at(2, 3), "bé".to_owned()), (at(3, 7), String::new())]);
        // The partial last line is not in the buffer until its newline.
        assert_eq!(text, "kepta\r\nbé\n\n");
        f.write_all(b"d\n").unwrap();
        f.flush().unwrap();
        let (pos, range) = src.append_line(&mut text).unwrap().unwrap();
        assert_eq!((pos, &text[range]), (at(4, 8), "cd"));
        assert_eq!(src.position(), at(4, 11));
    }

    #[test]
    fn a_grown_file_resumes_and_a_replaced_one_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(&path, "one\ntwo\n").unwrap();
        let fp = FileFingerprint::read(&path).unwrap();
        assert_eq!(FileFingerprint::parse(&fp.to_state()), Some(fp));
        let at = SourcePosition { line: 1, offset: 4 };
        // Grown: resumed where the checkpoint was, the old fingerprint kept.
        std::fs::write(&path, "one\ntwo\nthree\n").unwrap();
        let (src, kept) = LineSource::resume(&path, at, Some(&fp.to_state())).unwrap();
        assert_eq!((src.position(), kept), (at, fp));
        // Replaced by another file: read from its start.
        std::fs::write(&path, "uno\ndos\ntres\n").unwrap();
        let (mut src, new) = LineSource::resume(&path, at, Some(&fp.to_state())).unwrap();
        assert_ne!(new, fp);
        let mut buf = String::new();
        assert_eq!(src.next_line(&mut buf).unwrap(), Some(SourcePosition { line: 1, offset: 0 }));
        assert_eq!(buf, "uno");
        // Shorter than what the fingerprint covered: replaced too.
        std::fs::write(&path, "on").unwrap();
        let (src, _) = LineSource::resume(&path, at, Some(&fp.to_state())).unwrap();
        assert_eq!(src.position(), SourcePosition::default());
    }
}
