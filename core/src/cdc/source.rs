//! Reading an input stream line by line with positions: a file (plain or
//! gzip, detected by its magic bytes) or standard input. A file can resume
//! at a byte offset of its decompressed stream; standard input cannot.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use super::SourcePosition;
use crate::error::{Error, Result};

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
        let mut file = File::open(path).map_err(|e| {
            Error::Io(std::io::Error::new(e.kind(), format!("cannot open input {}: {e}", path.display())))
        })?;
        let mut magic = [0u8; 2];
        let n = file.read(&mut magic)?;
        let file = File::open(path)?;
        let mut reader: Box<dyn BufRead + Send> = if n == 2 && magic == [0x1f, 0x8b] {
            Box::new(BufReader::with_capacity(1 << 20, flate2::read::MultiGzDecoder::new(file)))
        } else {
            Box::new(BufReader::with_capacity(1 << 20, file))
        };
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
        let pos = self.next;
        let n = self.reader.read_line(buf).map_err(|e| Error::Input {
            position: pos,
            table: None,
            txid: None,
            message: format!("cannot read {}: {e}", self.name),
        })?;
        if self.follow {
            if !self.partial.is_empty() {
                buf.insert_str(0, &self.partial);
            }
            if !buf.ends_with('\n') {
                self.partial = std::mem::take(buf);
                return Ok(None);
            }
            self.partial.clear();
        } else if n == 0 {
            return Ok(None);
        }
        let n = buf.len();
        self.next = SourcePosition { line: pos.line + 1, offset: pos.offset + n as u64 };
        while buf.ends_with('\n') || buf.ends_with('\r') {
            buf.pop();
        }
        Ok(Some(SourcePosition { line: pos.line + 1, offset: pos.offset }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

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
}
