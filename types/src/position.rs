//! Where a change came from in its input.

/// Where a record came from: 1-based line and byte offset of the line start
/// (in the decompressed stream), or, with line 0, a WAL position (LSN).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct SourcePosition {
    /// 1-based line number.
    pub line: u64,
    /// Byte offset of the start of the line.
    pub offset: u64,
}

impl std::fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            // Positions in a WAL (PostgreSQL logical replication) have no line.
            write!(f, "LSN {}", Lsn(self.offset))
        } else {
            write!(f, "line {} (byte {})", self.line, self.offset)
        }
    }
}

/// A WAL position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl std::fmt::Display for Lsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl std::str::FromStr for Lsn {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (hi, lo) = s.split_once('/').ok_or_else(|| format!("LSN {s:?} is not of the form X/Y"))?;
        let hi = u64::from_str_radix(hi, 16).map_err(|_| format!("LSN {s:?}: bad high part"))?;
        let lo = u64::from_str_radix(lo, 16).map_err(|_| format!("LSN {s:?}: bad low part"))?;
        if hi > u64::from(u32::MAX) || lo > u64::from(u32::MAX) {
            return Err(format!("LSN {s:?} out of range"));
        }
        Ok(Lsn((hi << 32) | lo))
    }
}

impl Lsn {
    /// The position of records at this LSN, as the sink records positions
    /// (line 0 marks a WAL position; see [`SourcePosition`]'s `Display`).
    pub fn position(self) -> SourcePosition {
        SourcePosition { line: 0, offset: self.0 }
    }
}
