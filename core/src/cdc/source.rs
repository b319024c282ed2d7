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
            return Ok(Self { reader: Box::new(BufReader::new(std::io::stdin())), next: start, name: "stdin".into() });
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
        Ok(Self { reader, next: start, name: PathBuf::from(path).display().to_string() })
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
        if n == 0 {
            return Ok(None);
        }
        self.next = SourcePosition { line: pos.line + 1, offset: pos.offset + n as u64 };
        while buf.ends_with('\n') || buf.ends_with('\r') {
            buf.pop();
        }
        Ok(Some(SourcePosition { line: pos.line + 1, offset: pos.offset }))
    }
}
