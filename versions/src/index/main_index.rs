//! The main index (MI): row-id ranges → (file, row offset).

use fovea_types::error::{Error, Result};
use fovea_types::ids::{FileId, RowId};

/// Where a row id lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLocation {
    /// The file (virtual or regular: same id).
    pub file: FileId,
    /// Slot of the file's visibility writer in its shard.
    pub file_slot: u32,
    /// Row offset in the file.
    pub offset: u32,
}

/// One MI entry: row ids `[start, start + len)` at `offset` of `file`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeEntry {
    /// First row id.
    pub start: u64,
    /// Row ids in the range.
    pub len: u32,
    /// The file.
    pub file: FileId,
    /// Slot of the file's visibility writer in its shard.
    pub file_slot: u32,
    /// Row offset of `start` in the file.
    pub offset: u32,
}

/// One shard's main index: row-id ranges → file locations.
#[derive(Default)]
pub struct MainIndex {
    /// Sorted by `start`, non-overlapping (ranges are reserved in increasing order).
    pub(super) ranges: Vec<RangeEntry>,
}

impl MainIndex {
    /// Adds the range `[start, start + len)` at `offset` of `file`.
    pub fn add_range(&mut self, start: RowId, len: u32, file: FileId, file_slot: u32, offset: u32) -> Result<()> {
        if let Some(last) = self.ranges.last()
            && start.0 < last.start + u64::from(last.len)
        {
            return Err(Error::invariant(format!("row-id range {start:?} overlaps the previous one")));
        }
        self.ranges.push(RangeEntry { start: start.0, len, file, file_slot, offset });
        Ok(())
    }

    /// The location of `row`.
    #[inline]
    pub fn locate(&self, row: RowId) -> Option<RowLocation> {
        let i = self.ranges.partition_point(|r| r.start <= row.0).checked_sub(1)?;
        let r = &self.ranges[i];
        let delta = row.0 - r.start;
        (delta < u64::from(r.len)).then(|| RowLocation {
            file: r.file,
            file_slot: r.file_slot,
            offset: r.offset + delta as u32,
        })
    }

    /// Replaces every range of `file` by `with` (the file's rows, moved by
    /// storage GC; `None`: it kept none). `with` must start above every
    /// range: its row ids are new.
    pub fn replace_file(&mut self, file: FileId, with: Option<RangeEntry>) -> Result<()> {
        if let (Some(w), Some(last)) = (&with, self.ranges.last())
            && w.start < last.start + u64::from(last.len)
        {
            return Err(Error::invariant(format!("row-id range at {} for {} overlaps older ones", w.start, w.file)));
        }
        self.ranges.retain(|r| r.file != file);
        self.ranges.extend(with);
        Ok(())
    }

    /// The ranges, in row-id order (checkpoints).
    pub fn ranges(&self) -> &[RangeEntry] {
        &self.ranges
    }

    /// Bytes used.
    pub fn memory_bytes(&self) -> usize {
        self.ranges.capacity() * std::mem::size_of::<RangeEntry>()
    }
}
