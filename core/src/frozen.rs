//! Visibility checkpoints: the deleted-row bitmaps of every file as of one
//! snapshot, written to the lake so a long-running query no longer holds
//! LWM back.
//!
//! Memory GC folds tile visibility below LWM, after which a snapshot below
//! LWM cannot be answered from the tiles. A query held open past a
//! threshold gets its bitmaps captured ([`FrozenVisibility::capture`]),
//! written to `visibility/q<qts>-<id>.fvc` and read back; it then scans with
//! [`crate::ScanOptions::frozen`] and releases its registration. Data files
//! stay readable: combine keeps file ids and row offsets, and rows newer than
//! the snapshot are masked by their create timestamps as always. A file
//! unknown to the checkpoint was created after it, so none of its rows is
//! visible at `qts` anyway.
//!
//! Format (little-endian): `FOVEAVC\0`, version u32 (1), qts u64, file
//! count u64, then per file: id u64, word count u64, words u64…; last a
//! CRC-32 of everything before it.

use std::collections::HashMap;

use bytes::Bytes;
use object_store::path::Path;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::ids::{FileId, Ts};
use crate::mvcc::Snapshot;
use crate::visibility::copy_bits;

const MAGIC: &[u8; 8] = b"FOVEAVC\0";
const VERSION: u32 = 1;

/// Deleted-row bitmaps of every file at one `qts`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrozenVisibility {
    qts: Ts,
    files: HashMap<FileId, Vec<u64>>,
}

impl FrozenVisibility {
    /// Captures the bitmaps of every file of every table at `snapshot`
    /// (which must still be registered).
    pub fn capture(engine: &Engine, snapshot: &Snapshot) -> Result<Self> {
        let qts = snapshot.qts();
        let mut files = HashMap::new();
        let mut words = Vec::new();
        // Every table's parts, those of tables dropped after `qts` too.
        for part in engine.all_parts() {
            let view = part.view()?;
            let all = view.files.iter().map(|f| &f.vis).chain(view.active.as_ref().map(|a| &a.vis));
            for vis in all {
                if files.contains_key(&vis.file()) {
                    continue;
                }
                vis.deleted_bitmap(0, vis.capacity(), qts, &mut words)?;
                files.insert(vis.file(), std::mem::take(&mut words));
            }
        }
        Ok(FrozenVisibility { qts, files })
    }

    /// The snapshot timestamp the bitmaps are for.
    pub fn qts(&self) -> Ts {
        self.qts
    }

    /// Files captured.
    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// Deleted bits of rows `[start, start + rows)` of `file` into `out`
    /// (a file unknown to the checkpoint has none).
    pub fn deleted_bitmap(&self, file: FileId, start: usize, rows: usize, out: &mut Vec<u64>) {
        copy_bits(self.files.get(&file).map_or(&[][..], Vec::as_slice), start, rows, out);
    }

    /// The checkpoint's bytes.
    pub fn encode(&self) -> Bytes {
        let mut out = Vec::with_capacity(32 + self.files.values().map(|w| 16 + w.len() * 8).sum::<usize>());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.qts.get().to_le_bytes());
        out.extend_from_slice(&(self.files.len() as u64).to_le_bytes());
        let mut ids: Vec<&FileId> = self.files.keys().collect();
        ids.sort_unstable();
        for id in ids {
            let words = &self.files[id];
            out.extend_from_slice(&id.0.to_le_bytes());
            out.extend_from_slice(&(words.len() as u64).to_le_bytes());
            for w in words {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Bytes::from(out)
    }

    /// Reads a checkpoint written by [`Self::encode`]; `what` names it in errors.
    pub fn decode(bytes: &[u8], what: &str) -> Result<Self> {
        let corrupt = |reason: String| Error::Corrupt { what: what.to_owned(), reason };
        if bytes.len() < 8 + 4 + 8 + 8 + 4 || &bytes[..8] != MAGIC {
            return Err(corrupt("not a visibility checkpoint (bad magic or too short)".into()));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let crc = u32::from_le_bytes(crc.try_into().map_err(|_| corrupt("short checksum".into()))?);
        if crc32fast::hash(body) != crc {
            return Err(corrupt("checksum mismatch".into()));
        }
        let mut at = 8;
        let u64_at = |at: &mut usize| -> Result<u64> {
            let b = body.get(*at..*at + 8).ok_or_else(|| corrupt(format!("truncated at byte {at}")))?;
            *at += 8;
            Ok(u64::from_le_bytes(b.try_into().unwrap_or_else(|_| unreachable!("8 bytes"))))
        };
        let version = u32::from_le_bytes(body[8..12].try_into().unwrap_or_else(|_| unreachable!("4 bytes")));
        if version != VERSION {
            return Err(corrupt(format!("version {version}, this build reads {VERSION}")));
        }
        at += 4;
        let qts = Ts(u64_at(&mut at)?);
        let n = u64_at(&mut at)?;
        let mut files = HashMap::new();
        for _ in 0..n {
            let id = FileId(u64_at(&mut at)?);
            let count = u64_at(&mut at)?;
            if count > (body.len() as u64) / 8 {
                return Err(corrupt(format!("file {id} claims {count} words")));
            }
            let words = (0..count).map(|_| u64_at(&mut at)).collect::<Result<Vec<_>>>()?;
            files.insert(id, words);
        }
        if at != body.len() {
            return Err(corrupt(format!("{} trailing bytes", body.len() - at)));
        }
        Ok(FrozenVisibility { qts, files })
    }

    /// Captures at `snapshot`, writes the checkpoint to the lake as `name`,
    /// and returns what reading it back gives (the copy queries use).
    pub fn checkpoint(engine: &Engine, snapshot: &Snapshot, name: &str) -> Result<(Path, Self)> {
        let frozen = Self::capture(engine, snapshot)?;
        let path = Path::from(format!("visibility/{name}.fvc"));
        engine.lake().put(&path, frozen.encode())?;
        let back = Self::decode(&engine.lake().get(&path)?, path.as_ref())?;
        Ok((path, back))
    }
}

impl crate::scan::DeletedRows for FrozenVisibility {
    /// At the checkpoint's own qts, whatever the scan's.
    fn deleted_bitmap(&self, file: FileId, start: usize, rows: usize, _qts: Ts, out: &mut Vec<u64>) -> Result<()> {
        FrozenVisibility::deleted_bitmap(self, file, start, rows, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_detects_damage() {
        let mut files = HashMap::new();
        files.insert(FileId(3), vec![0b1010, u64::MAX, 1]);
        files.insert(FileId(9), vec![]);
        let f = FrozenVisibility { qts: Ts(42), files };
        let bytes = f.encode();
        assert_eq!(FrozenVisibility::decode(&bytes, "t").unwrap(), f);
        let mut bad = bytes.to_vec();
        bad[30] ^= 1;
        assert!(FrozenVisibility::decode(&bad, "t").unwrap_err().to_string().contains("checksum"));
        assert!(FrozenVisibility::decode(&bytes[..10], "t").is_err());
        let mut out = Vec::new();
        f.deleted_bitmap(FileId(3), 1, 70, &mut out);
        assert_eq!(out, vec![0b101 | (1u64 << 63), 0b11_1111]);
        f.deleted_bitmap(FileId(7), 0, 10, &mut out);
        assert_eq!(out, vec![0]);
    }
}
