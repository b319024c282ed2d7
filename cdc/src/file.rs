//! A file (or standard input) of change records as a [`ChangeSource`].
//!
//! ```text
//!  reader thread ──batches of lines, round robin──▶ decoder threads ──▶ poll(): push in line order
//! ```
//! Reading, decoding and applying overlap; the batches come back in the
//! order they were read. Followed (`fovea serve`), the reader waits at the
//! end of the file for more lines and hands over what it has whenever it
//! gets there, so a line is applied a poll interval after it is written at
//! most.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::time::Duration;

use super::source::{ChangeSource, Lag, LineSource, Polled, RecordSink, Resume};
use super::typed::{CurrentTables, TypedTables};
use super::{BufferPool, ChangeRecord, InputFormat, LineBuffer, SharedLine, SourcePosition, decode_owned_line};
use fovea_types::error::{Error, Result};

/// Threads decoding lines (besides the reader and the applying thread).
const DECODERS: usize = 2;
/// Lines per batch handed between threads (they share one buffer).
pub const BATCH_LINES: usize = 512;
/// Batches that can be on their way at once: in the channels to and from
/// each decoder, one being decoded by each, one being read and one being
/// applied. Their buffers are reused (see [`LineBuffer`]).
const BATCHES_IN_FLIGHT: usize = DECODERS * (2 * CHANNEL_BATCHES + 1) + 2;
/// Batches each channel between the threads holds.
const CHANNEL_BATCHES: usize = 8;

/// Raw lines with their positions (ranges of `text`, the batch's one
/// buffer); `end` is set on the last batch, or `error` when reading failed.
struct LineBatch {
    text: Arc<LineBuffer>,
    lines: Vec<(SourcePosition, SourcePosition, Range<usize>)>,
    end: Option<SourcePosition>,
    error: Option<Error>,
}

/// Decoded records with their position and the position after them.
struct DecodedBatch {
    records: Vec<(SourcePosition, SourcePosition, Result<ChangeRecord>)>,
    end: Option<SourcePosition>,
}

/// A file or standard input, read and decoded by threads of its own.
pub struct FileSource {
    name: String,
    /// The file's fingerprint as checkpoints record it (none for stdin).
    fingerprint: Option<String>,
    path: Option<std::path::PathBuf>,
    from_decoders: Vec<Receiver<DecodedBatch>>,
    /// The decoder the next batch comes from.
    turn: usize,
    next: SourcePosition,
    poll: Duration,
    /// Stops the reader thread (it may be waiting for a followed file to grow).
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl FileSource {
    /// Opens `path` (`-`: standard input, which never resumes), resuming
    /// where `checkpoint` stopped if it read this file (see
    /// [`LineSource::resume`]). `follow`: wait for the file to grow instead of
    /// ending, polling every `poll`.
    pub fn open(
        path: &Path,
        checkpoint: Option<&Resume>,
        format: InputFormat,
        follow: bool,
        poll: Duration,
        tables: Option<Arc<dyn CurrentTables>>,
    ) -> Result<Self> {
        let (name, source, fingerprint, file) = if path == Path::new("-") {
            ("-".to_owned(), LineSource::open(path, SourcePosition::default())?, None, None)
        } else {
            let name = std::fs::canonicalize(path)
                .map_err(|e| {
                    Error::Io(std::io::Error::new(e.kind(), format!("cannot open input {}: {e}", path.display())))
                })?
                .display()
                .to_string();
            let (position, state) = checkpoint
                .filter(|c| c.input == name)
                .map_or((SourcePosition::default(), None), |c| (c.position, c.state.as_deref()));
            let (source, fingerprint) = LineSource::resume(path, position, state)?;
            (name, source, Some(fingerprint.to_state()), Some(path.to_owned()))
        };
        let source = if follow { source.follow() } else { source };
        let next = source.position();
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let mut to_decoders = Vec::new();
        let mut from_decoders = Vec::new();
        for i in 0..DECODERS {
            let (line_tx, line_rx) = sync_channel::<LineBatch>(CHANNEL_BATCHES);
            let (done_tx, done_rx) = sync_channel::<DecodedBatch>(CHANNEL_BATCHES);
            to_decoders.push(line_tx);
            from_decoders.push(done_rx);
            let typed = tables.clone().map(TypedTables::new);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("fovea-decode-{i}"))
                    .spawn(move || decode_loop(line_rx, format, typed, done_tx))?,
            );
        }
        let reader_stop = Arc::clone(&stop);
        threads.push(
            std::thread::Builder::new()
                .name("fovea-read".into())
                .spawn(move || read_loop(source, to_decoders, follow, poll, &reader_stop))?,
        );
        Ok(FileSource { name, fingerprint, path: file, from_decoders, turn: 0, next, poll, stop, threads })
    }
}

impl ChangeSource for FileSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn poll(&mut self, sink: &mut dyn RecordSink) -> Result<Polled> {
        let batch = match self.from_decoders[self.turn % DECODERS].recv_timeout(self.poll) {
            Ok(b) => b,
            Err(RecvTimeoutError::Timeout) => return Ok(Polled::default()),
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::invariant("the decode thread stopped without an end"));
            }
        };
        self.turn += 1;
        let mut polled = Polled::default();
        for (pos, next, record) in batch.records {
            sink.push(record?, pos, next)?;
            self.next = next;
            polled.records += 1;
        }
        if let Some(end) = batch.end {
            self.next = end;
            polled.end = Some(end);
        }
        Ok(polled)
    }

    fn position(&self) -> SourcePosition {
        self.next
    }

    fn state_at(&mut self, _position: SourcePosition) -> Result<Option<String>> {
        Ok(self.fingerprint.clone())
    }

    fn confirm(&mut self, _position: SourcePosition) -> Result<()> {
        Ok(())
    }

    /// Bytes of a plain file not applied yet (a gzip file's size is not in
    /// stream bytes).
    fn lag(&mut self) -> Lag {
        let bytes = self
            .path
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| m.len().saturating_sub(self.next.offset));
        Lag { bytes, ..Lag::default() }
    }
}

impl Drop for FileSource {
    fn drop(&mut self) {
        // Release: the reader's Acquire load sees it and stops waiting.
        self.stop.store(true, Ordering::Release);
        // Dropping the receivers stops the threads at their next send.
        self.from_decoders.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn read_loop(mut source: LineSource, to: Vec<SyncSender<LineBatch>>, follow: bool, poll: Duration, stop: &AtomicBool) {
    let mut turn = 0usize;
    let mut send = |batch: LineBatch| {
        let sent = to[turn % to.len()].send(batch).is_ok();
        turn += 1;
        sent
    };
    // A batch's lines are read into one buffer, sized like the last one;
    // buffers come back once their records are applied.
    let pool = BufferPool::new(BATCHES_IN_FLIGHT);
    let mut capacity = 0;
    let mut text = String::new();
    let mut lines = Vec::with_capacity(BATCH_LINES);
    let mut take = |text: &mut String, lines: &mut Vec<_>, end: Option<SourcePosition>, error: Option<Error>| {
        capacity = capacity.max(text.len() + text.len() / 8);
        let text = Arc::new(pool.buffer(std::mem::replace(text, pool.take(capacity))));
        LineBatch { text, lines: std::mem::replace(lines, Vec::with_capacity(BATCH_LINES)), end, error }
    };
    // Acquire: pairs with the Release store of `FileSource::drop`.
    while !stop.load(Ordering::Acquire) {
        // The whole lines held already, in one go; the rest (a line across
        // reads, the end, an error, a followed file) a line at a time.
        let held = source.append_held_lines(&mut text, BATCH_LINES - lines.len(), |pos, next, range| {
            lines.push((pos, next, range));
        });
        match held {
            Ok(0) => {}
            Ok(_) => {
                if lines.len() == BATCH_LINES && !send(take(&mut text, &mut lines, None, None)) {
                    return;
                }
                continue;
            }
            Err(e) => {
                send(take(&mut text, &mut lines, None, Some(e)));
                return;
            }
        }
        match source.append_line(&mut text) {
            Ok(Some((pos, range))) => {
                lines.push((pos, source.position(), range));
                if lines.len() == BATCH_LINES && !send(take(&mut text, &mut lines, None, None)) {
                    return;
                }
            }
            Ok(None) if follow => {
                // At the end for now: hand over what arrived, then wait.
                if !lines.is_empty() && !send(take(&mut text, &mut lines, None, None)) {
                    return;
                }
                std::thread::sleep(poll);
            }
            Ok(None) => {
                send(take(&mut text, &mut lines, Some(source.position()), None));
                return;
            }
            Err(e) => {
                send(take(&mut text, &mut lines, None, Some(e)));
                return;
            }
        }
    }
}

fn decode_loop(
    from: Receiver<LineBatch>,
    format: InputFormat,
    mut typed: Option<TypedTables>,
    to: SyncSender<DecodedBatch>,
) {
    for batch in from {
        // A decoder panic is that line's error, not a dead thread.
        let mut decode = |pos: SourcePosition, range: Range<usize>| {
            fovea_types::error::catch_panic(
                || format!("decoding input line {}", pos.line),
                || {
                    let line = SharedLine::new(Arc::clone(&batch.text), range)
                        .ok_or_else(|| Error::invariant("a line is no range of its batch"))?;
                    decode_owned_line(line, pos, format, typed.as_mut())
                },
            )
        };
        let mut records: Vec<_> =
            batch.lines.into_iter().map(|(pos, next, range)| (pos, next, decode(pos, range))).collect();
        // Nothing after a decoding error is applied: the sink stops there.
        if let Some(i) = records.iter().position(|r| r.2.is_err()) {
            records.truncate(i + 1);
        }
        if let Some(e) = batch.error {
            let pos = records.last().map_or_else(SourcePosition::default, |r| r.1);
            records.push((pos, pos, Err(e)));
        }
        if to.send(DecodedBatch { records, end: batch.end }).is_err() {
            return;
        }
    }
}
