//! The primary index: where the live version of a key is.
//!
//! * **Single-point index (SPI)**: `(table, encoded key) → [(ts, row id | tombstone)]`,
//!   versions in ts order; [`PrimaryIndex::lookup`] returns the newest entry
//!   `≤ ts`. One partition per shard, used by that shard's writer only, so a
//!   plain hash map (foldhash) with no locks. A slot is 64 bytes: the key
//!   inline up to 16 bytes (a table and an integer key take 13) and two
//!   versions inline (an update's old and new one until memory GC,
//!   [`PrimaryIndex::purge`], drops the old: with one version inline every
//!   update spilled to the heap, and index updates/s fell by a third).
//! * **Main index (MI)**: row-id ranges → (file, row offset). Every write-buffer
//!   block reserves a contiguous range of row ids, so one MI entry per block.
//!   Combining blocks into a regular file keeps file id and offsets: the MI
//!   never changes then.
//!
//! Keys are encoded order-preservingly ([`encode_key`]): comparing encodings
//! byte-wise compares the keys column by column.

use hashbrown::HashMap;
use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::ids::{FileId, RowId, TableId, Ts};
use crate::schema::Value;

/// An encoded key: table id then the order-preserving key bytes.
pub type KeyBytes = SmallVec<[u8; 16]>;

/// Row id meaning "deleted" in a version list.
const TOMBSTONE: u64 = u64::MAX;

/// Encodes `(table, key)` so that byte order equals key order.
///
/// Per value: `0x00` for NULL, else `0x01` followed by integers as big-endian
/// with the sign bit flipped, floats by the IEEE total-order trick, decimals
/// as 16 bytes, strings and bytes with `0x00` escaped as `0x00 0xFF` and
/// terminated by `0x00 0x00`.
pub fn encode_key(table: TableId, key: &[Value]) -> KeyBytes {
    let mut out = KeyBytes::new();
    out.extend_from_slice(&table.0.to_be_bytes());
    for v in key {
        match v {
            Value::Null => out.push(0),
            Value::Bool(b) => out.extend_from_slice(&[1, *b as u8]),
            Value::Int(i) => {
                out.push(1);
                out.extend_from_slice(&((*i as u64) ^ (1 << 63)).to_be_bytes());
            }
            Value::Float(f) => {
                let bits = f.to_bits();
                let ordered = if bits >> 63 == 1 { !bits } else { bits ^ (1 << 63) };
                out.push(1);
                out.extend_from_slice(&ordered.to_be_bytes());
            }
            Value::Decimal(d) => {
                out.push(1);
                out.extend_from_slice(&((*d as u128) ^ (1 << 127)).to_be_bytes());
            }
            Value::Utf8(s) => escape_bytes(&mut out, s.as_bytes()),
            Value::Binary(b) => escape_bytes(&mut out, b),
        }
    }
    out
}

fn escape_bytes(out: &mut KeyBytes, bytes: &[u8]) {
    out.push(1);
    for &b in bytes {
        if b == 0 {
            out.extend_from_slice(&[0, 0xFF]);
        } else {
            out.push(b);
        }
    }
    out.extend_from_slice(&[0, 0]);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Version {
    ts: u64,
    row: u64,
}

type Versions = SmallVec<[Version; 2]>;

// The slot size the module docs give.
const _: () = assert!(std::mem::size_of::<(KeyBytes, Versions)>() == 64);

/// The newest of `versions` at or below `ts`.
fn version_at(versions: &Versions, ts: Ts) -> Option<&Version> {
    versions.iter().rev().find(|v| v.ts <= ts.get())
}

/// One shard's partition of the single-point index.
pub struct PrimaryIndex {
    map: HashMap<KeyBytes, Versions, foldhash::fast::FixedState>,
    /// Keys changed since the last [`PrimaryIndex::take_changed`] (what an
    /// incremental checkpoint writes).
    changed: ChangedKeys,
    /// A key whose newest version is above this ts is in `changed` (or,
    /// until the checkpoint that took them has looked them up with
    /// [`PrimaryIndex::checkpoint_version`], in the keys it took): the ts
    /// `changed` was last taken at.
    changed_floor: u64,
}

/// Keys an index changed (a version pushed, a row moved) since some
/// point, each stored as `len: u32 LE` then the key bytes; a key may
/// appear more than once.
#[derive(Default)]
pub struct ChangedKeys {
    bytes: Vec<u8>,
}

impl ChangedKeys {
    fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(&(key.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(key);
    }

    /// Appends every key of `other`.
    pub fn append(&mut self, other: &ChangedKeys) {
        self.bytes.extend_from_slice(&other.bytes);
    }

    /// True when no key changed.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.bytes.capacity()
    }

    /// The distinct keys, in byte order.
    pub fn sorted(&self) -> Vec<&[u8]> {
        let mut keys = Vec::new();
        let mut rest = self.bytes.as_slice();
        while rest.len() >= 4 {
            let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            keys.push(&rest[4..4 + len]);
            rest = &rest[4 + len..];
        }
        keys.sort_unstable();
        keys.dedup();
        keys
    }
}

/// The version of a key a snapshot sees: `(ts, Some(row))` when live,
/// `(ts, None)` for a tombstone.
pub type VersionAt = (Ts, Option<RowId>);

impl Default for PrimaryIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl PrimaryIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            map: HashMap::with_hasher(foldhash::fast::FixedState::with_seed(0x5eed_f0ea)),
            changed: ChangedKeys::default(),
            changed_floor: 0,
        }
    }

    /// Number of keys with at least one version.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no key is indexed.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Reserves room for `additional` more keys.
    pub fn reserve(&mut self, additional: usize) {
        self.map.reserve(additional);
    }

    /// The row id of the newest version `≤ ts`, or `None` when there is none
    /// or it is a tombstone.
    pub fn lookup(&self, key: &[u8], ts: Ts) -> Option<RowId> {
        let v = version_at(self.map.get(key)?, ts)?;
        (v.row != TOMBSTONE).then_some(RowId(v.row))
    }

    /// Hands over the keys changed since the last call (or since the
    /// index was created or restored), for a checkpoint at `c`, and starts
    /// a new set. Keys with versions above `c` already (transactions in
    /// flight) join the new set when the checkpoint looks them up
    /// ([`Self::checkpoint_version`]); until then the handed-over set
    /// stands for them, and must be given back ([`Self::restore_changed`])
    /// if the checkpoint does not take effect.
    pub fn take_changed(&mut self, c: Ts) -> ChangedKeys {
        self.changed_floor = c.get();
        std::mem::take(&mut self.changed)
    }

    /// The version of a key [`Self::take_changed`] handed over, as the
    /// checkpoint at `c` writes it (`None` row: removed); a key with
    /// versions above `c` joins the keys changed since.
    pub fn checkpoint_version(&mut self, key: &[u8], c: Ts) -> VersionAt {
        let Some(versions) = self.map.get(key) else { return (c, None) };
        if versions.last().is_some_and(|v| v.ts > c.get()) {
            self.changed.push(key);
        }
        version_at(versions, c).map_or((c, None), |v| (Ts(v.ts), (v.row != TOMBSTONE).then_some(RowId(v.row))))
    }

    /// Gives back keys [`Self::take_changed`] handed over, when what they
    /// were taken for (a checkpoint) did not take effect.
    pub fn restore_changed(&mut self, keys: &ChangedKeys) {
        self.changed.append(keys);
    }

    /// Counts every key as changed (the next checkpoint writes them all).
    pub fn mark_all_changed(&mut self) {
        for k in self.map.keys() {
            self.changed.push(k);
        }
    }

    /// The row id of the newest version, if live (the writer's view).
    #[inline]
    pub fn latest(&self, key: &[u8]) -> Option<RowId> {
        let v = self.map.get(key)?.last()?;
        (v.row != TOMBSTONE).then_some(RowId(v.row))
    }

    /// Records that `key` lives at `row` from `ts` on.
    #[inline]
    pub fn put(&mut self, key: &[u8], ts: Ts, row: RowId) -> Result<()> {
        self.push(key, Version { ts: ts.get(), row: row.0 })
    }

    /// Records that `key` is deleted from `ts` on.
    #[inline]
    pub fn tombstone(&mut self, key: &[u8], ts: Ts) -> Result<()> {
        self.push(key, Version { ts: ts.get(), row: TOMBSTONE })
    }

    #[inline]
    fn push(&mut self, key: &[u8], v: Version) -> Result<()> {
        let versions = self.map.entry_ref(key).or_default();
        // A key whose newest version is above the floor was pushed since
        // `changed` was taken, so it is in it already.
        if versions.last().is_none_or(|l| l.ts <= self.changed_floor) {
            self.changed.push(key);
        }
        if let Some(last) = versions.last_mut() {
            if last.ts > v.ts {
                return Err(Error::invariant(format!(
                    "index version at ts{} after one at ts{}: a shard applies in timestamp order",
                    v.ts, last.ts
                )));
            }
            if last.ts == v.ts {
                // Same transaction touched the key again: the last write wins.
                *last = v;
                return Ok(());
            }
        }
        versions.push(v);
        Ok(())
    }

    /// Drops versions no snapshot `≥ lwm` can see: for every key, all but the
    /// newest version `≤ lwm`, and the key itself when that one is a tombstone
    /// with nothing newer.
    pub fn purge(&mut self, lwm: Ts) -> usize {
        let lwm = lwm.get();
        let mut dropped = 0;
        self.map.retain(|_, versions| {
            let Some(keep_from) = versions.iter().rposition(|v| v.ts <= lwm) else {
                return true;
            };
            dropped += keep_from;
            if keep_from > 0 {
                versions.drain(..keep_from);
            }
            if versions.len() == 1 && versions[0].row == TOMBSTONE {
                dropped += 1;
                return false;
            }
            if versions.spilled() && versions.len() <= versions.inline_size() {
                versions.shrink_to_fit();
            }
            true
        });
        dropped
    }

    /// The index as a snapshot at `ts` sees it: one version per key live at
    /// `ts`, nothing newer (checkpoints are images at one timestamp).
    pub fn live_at(&self, ts: Ts) -> PrimaryIndex {
        let mut out = PrimaryIndex::new();
        out.map.reserve(self.map.len());
        for (k, versions) in &self.map {
            if let Some(v) = version_at(versions, ts)
                && v.row != TOMBSTONE
            {
                out.map.insert(k.clone(), std::iter::once(*v).collect());
            }
        }
        out
    }

    /// Every row id some version points at (tombstones left out), for
    /// checks before [`Self::remap_rows`].
    pub fn rows(&self) -> impl Iterator<Item = RowId> + '_ {
        self.map.values().flatten().filter(|v| v.row != TOMBSTONE).map(|v| RowId(v.row))
    }

    /// Moves every version pointing at a row id `moved` maps to the row id
    /// it returns (storage GC moved the row to a new file); the others stay.
    pub fn remap_rows(&mut self, moved: impl Fn(RowId) -> Option<RowId>) {
        for (k, versions) in self.map.iter_mut() {
            let mut any = false;
            for v in versions.iter_mut() {
                if v.row != TOMBSTONE
                    && let Some(to) = moved(RowId(v.row))
                {
                    v.row = to.0;
                    any = true;
                }
            }
            if any && versions.last().is_none_or(|l| l.ts <= self.changed_floor) {
                self.changed.push(k);
            }
        }
    }

    /// Approximate bytes used.
    pub fn memory_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(KeyBytes, Versions)>() + 1;
        let spilled: usize = self
            .map
            .iter()
            .map(|(k, v)| {
                (if k.spilled() { k.capacity() } else { 0 })
                    + if v.spilled() { v.capacity() * std::mem::size_of::<Version>() } else { 0 }
            })
            .sum();
        self.map.capacity() * slot + spilled + self.changed.memory_bytes()
    }

    /// Serialises every version of every key (format 1, which older
    /// checkpoints hold): magic, version, entries, CRC32.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(INDEX_MAGIC);
        out.extend_from_slice(&INDEX_FORMAT.to_le_bytes());
        out.extend_from_slice(&(self.map.len() as u64).to_le_bytes());
        for (k, versions) in &self.map {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
            out.extend_from_slice(&(versions.len() as u32).to_le_bytes());
            for v in versions {
                out.extend_from_slice(&v.ts.to_le_bytes());
                out.extend_from_slice(&v.row.to_le_bytes());
            }
        }
        let crc = crc32fast::hash(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
    }

    /// Restores an index written by [`PrimaryIndex::write_to`] (format 1)
    /// or by [`write_image`] (format 2; removals in it are skipped).
    pub fn read_from(bytes: &[u8]) -> Result<Self> {
        let (format, n, mut r) = open_image(bytes)?;
        let mut index = PrimaryIndex::new();
        index.map.reserve(n.min(r.bytes.len() / 8));
        if format == IMAGE_FORMAT {
            for _ in 0..n {
                let (key, ts, row) = r.entry()?;
                if row != TOMBSTONE {
                    index.insert_restored(key, Version { ts, row });
                }
            }
        } else {
            for _ in 0..n {
                let klen = r.u32().ok_or_else(|| image_corrupt("truncated key"))? as usize;
                let key = KeyBytes::from_slice(r.take(klen).ok_or_else(|| image_corrupt("truncated key"))?);
                let vlen = r.u32().ok_or_else(|| image_corrupt("truncated versions"))? as usize;
                let mut versions = Versions::with_capacity(vlen.min(1024));
                for _ in 0..vlen {
                    let ts = r.u64().ok_or_else(|| image_corrupt("truncated version"))?;
                    let row = r.u64().ok_or_else(|| image_corrupt("truncated version"))?;
                    // Restored versions are none of the changes since.
                    index.changed_floor = index.changed_floor.max(ts);
                    versions.push(Version { ts, row });
                }
                index.map.insert(key, versions);
            }
        }
        if r.pos != r.bytes.len() {
            return Err(image_corrupt("trailing bytes"));
        }
        Ok(index)
    }

    fn insert_restored(&mut self, key: &[u8], v: Version) {
        // Restored versions are none of the changes since.
        self.changed_floor = self.changed_floor.max(v.ts);
        self.map.insert(KeyBytes::from_slice(key), std::iter::once(v).collect());
    }

    /// Applies a delta [`write_image`] wrote (with removals): each key
    /// takes the version the delta has for it, a removal drops it.
    pub fn apply_delta(&mut self, bytes: &[u8]) -> Result<()> {
        let (format, n, mut r) = open_image(bytes)?;
        if format != IMAGE_FORMAT {
            return Err(image_corrupt(&format!("a delta must be of format {IMAGE_FORMAT}, not {format}")));
        }
        for _ in 0..n {
            let (key, ts, row) = r.entry()?;
            if row == TOMBSTONE {
                self.map.remove(key);
            } else {
                self.insert_restored(key, Version { ts, row });
            }
        }
        if r.pos != r.bytes.len() {
            return Err(image_corrupt("trailing bytes"));
        }
        Ok(())
    }
}

/// Format of the index images checkpoints write ([`write_image`]).
const IMAGE_FORMAT: u32 = 2;

/// Writes an index image of format 2: for each key, in strictly
/// ascending byte order, the version a snapshot sees (`None` row: the key
/// is removed; a base image leaves those out with `keep_removed` false,
/// a delta keeps them). Magic, format, count, entries (key length u32,
/// key, ts u64, row u64 with `u64::MAX` for removed), CRC32; all LE.
pub fn write_image<'a>(entries: impl IntoIterator<Item = (&'a [u8], VersionAt)>, keep_removed: bool) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(INDEX_MAGIC);
    out.extend_from_slice(&IMAGE_FORMAT.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    let mut count = 0u64;
    for (key, (ts, row)) in entries {
        if row.is_none() && !keep_removed {
            continue;
        }
        push_entry(&mut out, key, ts.get(), row.map_or(TOMBSTONE, |r| r.0));
        count += 1;
    }
    finish_image(out, count)
}

fn push_entry(out: &mut Vec<u8>, key: &[u8], ts: u64, row: u64) {
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&ts.to_le_bytes());
    out.extend_from_slice(&row.to_le_bytes());
}

fn finish_image(mut out: Vec<u8>, count: u64) -> Vec<u8> {
    let at = INDEX_MAGIC.len() + 4;
    out[at..at + 8].copy_from_slice(&count.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Folds a base image and the deltas after it (oldest first; all of
/// format 2, so in key order) into one base image, in one streaming pass:
/// for a key in several, the newest wins; removed keys are left out.
pub fn merge_images(runs: &[&[u8]]) -> Result<Vec<u8>> {
    struct Run<'a> {
        reader: Reader<'a>,
        left: usize,
        head: Option<(&'a [u8], u64, u64)>,
    }
    impl<'a> Run<'a> {
        fn advance(&mut self) -> Result<()> {
            let previous = self.head.map(|h| h.0);
            self.head = if self.left == 0 {
                if self.reader.pos != self.reader.bytes.len() {
                    return Err(image_corrupt("trailing bytes"));
                }
                None
            } else {
                self.left -= 1;
                let e = self.reader.entry()?;
                if previous.is_some_and(|p| p >= e.0) {
                    return Err(image_corrupt("keys out of order"));
                }
                Some(e)
            };
            Ok(())
        }
    }
    let mut heads = Vec::with_capacity(runs.len());
    let mut size = 0;
    for bytes in runs {
        let (format, n, reader) = open_image(bytes)?;
        if format != IMAGE_FORMAT {
            return Err(image_corrupt(&format!("only images of format {IMAGE_FORMAT} merge, not {format}")));
        }
        size += bytes.len();
        let mut run = Run { reader, left: n, head: None };
        run.advance()?;
        heads.push(run);
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(INDEX_MAGIC);
    out.extend_from_slice(&IMAGE_FORMAT.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    let mut count = 0u64;
    loop {
        // The smallest key at a head; the newest run holding it wins.
        let mut best: Option<(usize, &[u8])> = None;
        for (i, run) in heads.iter().enumerate() {
            if let Some((key, ..)) = run.head
                && best.is_none_or(|(_, b)| key <= b)
            {
                best = Some((i, key));
            }
        }
        let Some((winner, key)) = best else { break };
        let (_, ts, row) = heads[winner].head.ok_or_else(|| Error::invariant("merge head vanished"))?;
        if row != TOMBSTONE {
            push_entry(&mut out, key, ts, row);
            count += 1;
        }
        for run in &mut heads {
            if run.head.is_some_and(|h| h.0 == key) {
                run.advance()?;
            }
        }
    }
    Ok(finish_image(out, count))
}

fn image_corrupt(reason: &str) -> Error {
    Error::Corrupt { what: "index snapshot".into(), reason: reason.into() }
}

/// Checks magic, CRC and format; returns the format, the entry count and a
/// reader at the first entry (over the bytes before the CRC).
fn open_image(bytes: &[u8]) -> Result<(u32, usize, Reader<'_>)> {
    if bytes.len() < INDEX_MAGIC.len() + 4 + 8 + 4 {
        return Err(image_corrupt("too short"));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32fast::hash(body).to_le_bytes() != crc {
        return Err(image_corrupt("checksum mismatch"));
    }
    let mut r = Reader { bytes: body, pos: 0 };
    if r.take(INDEX_MAGIC.len()).ok_or_else(|| image_corrupt("truncated"))? != INDEX_MAGIC {
        return Err(image_corrupt("bad magic"));
    }
    let format = r.u32().ok_or_else(|| image_corrupt("truncated"))?;
    if format != INDEX_FORMAT && format != IMAGE_FORMAT {
        return Err(image_corrupt(&format!(
            "format {format} is not supported (expected {INDEX_FORMAT} or {IMAGE_FORMAT})"
        )));
    }
    let n = r.u64().ok_or_else(|| image_corrupt("truncated"))? as usize;
    Ok((format, n, r))
}

const INDEX_MAGIC: &[u8; 8] = b"FOVEAIDX";
const INDEX_FORMAT: u32 = 1;

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    /// One format-2 entry: key, ts, row.
    fn entry(&mut self) -> Result<(&'a [u8], u64, u64)> {
        let truncated = || image_corrupt("truncated entry");
        let klen = self.u32().ok_or_else(truncated)? as usize;
        let key = self.take(klen).ok_or_else(truncated)?;
        let ts = self.u64().ok_or_else(truncated)?;
        let row = self.u64().ok_or_else(truncated)?;
        Ok((key, ts, row))
    }
}

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
    ranges: Vec<RangeEntry>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn arb_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::Int),
            any::<bool>().prop_map(Value::Bool),
            "[a\\x00b]{0,4}".prop_map(Value::Utf8),
            any::<i128>().prop_map(Value::Decimal),
            (-1e9f64..1e9).prop_map(Value::Float),
        ]
    }

    fn cmp_values(a: &Value, b: &Value) -> std::cmp::Ordering {
        use Value::*;
        match (a, b) {
            (Null, Null) => std::cmp::Ordering::Equal,
            (Null, _) => std::cmp::Ordering::Less,
            (_, Null) => std::cmp::Ordering::Greater,
            (Int(x), Int(y)) => x.cmp(y),
            (Bool(x), Bool(y)) => x.cmp(y),
            (Utf8(x), Utf8(y)) => x.cmp(y),
            (Decimal(x), Decimal(y)) => x.cmp(y),
            (Float(x), Float(y)) => x.total_cmp(y),
            _ => unreachable!("same column, same type"),
        }
    }

    proptest! {
        #[test]
        fn key_encoding_preserves_order(
            kind in 0usize..5,
            pairs in proptest::collection::vec((arb_value(), arb_value(), any::<i64>(), any::<i64>()), 1..50)
        ) {
            for (a, b, x, y) in pairs {
                // Same type per column: keep a pair only when both are of `kind` or null.
                let same = std::mem::discriminant(&a) == std::mem::discriminant(&b) || a.is_null() || b.is_null();
                if !same { continue; }
                let _ = kind;
                let ka = encode_key(TableId(1), &[a.clone(), Value::Int(x)]);
                let kb = encode_key(TableId(1), &[b.clone(), Value::Int(y)]);
                let expect = cmp_values(&a, &b).then(x.cmp(&y));
                prop_assert_eq!(ka.as_slice().cmp(kb.as_slice()), expect, "{:?} {:?}", a, b);
            }
        }

        /// Model test of the versioned SPI with purge and restore.
        #[test]
        fn spi_matches_oracle(ops in proptest::collection::vec((0i64..20, 0u8..4), 1..300)) {
            let mut index = PrimaryIndex::new();
            let mut oracle: BTreeMap<i64, Vec<(u64, Option<u64>)>> = BTreeMap::new();
            let mut ts = 0u64;
            let mut lwm = 0u64;
            for (k, action) in ops {
                let key = encode_key(TableId(3), &[Value::Int(k)]);
                match action {
                    0 => { ts += 1; index.put(&key, Ts(ts), RowId(ts * 10)).unwrap(); oracle.entry(k).or_default().push((ts, Some(ts * 10))); }
                    1 => { ts += 1; index.tombstone(&key, Ts(ts)).unwrap(); oracle.entry(k).or_default().push((ts, None)); }
                    2 => { lwm = ts; index.purge(Ts(lwm)); }
                    _ => {
                        let mut bytes = Vec::new();
                        index.write_to(&mut bytes);
                        index = PrimaryIndex::read_from(&bytes).unwrap();
                    }
                }
                for (&k, versions) in &oracle {
                    let key = encode_key(TableId(3), &[Value::Int(k)]);
                    for q in lwm..=ts {
                        let expect = versions.iter().rev().find(|v| v.0 <= q).and_then(|v| v.1).map(RowId);
                        prop_assert_eq!(index.lookup(&key, Ts(q)), expect, "key {} at {}", k, q);
                    }
                }
            }
        }
    }

    /// Images of changed keys, in chains of deltas and merged, restore what
    /// the index holds at each checkpoint (a model of the checkpoint chain).
    #[test]
    fn chains_of_deltas_restore_the_index_at_each_checkpoint() {
        let mut index = PrimaryIndex::new();
        let mut runs: Vec<Vec<u8>> = Vec::new();
        let mut ts = 0u64;
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            seed >> 33
        };
        for checkpoint in 0..12 {
            for _ in 0..300 {
                ts += 1;
                let key = encode_key(TableId(1), &[Value::Int((next() % 150) as i64)]);
                if next() % 4 == 0 {
                    if index.latest(&key).is_some() {
                        index.tombstone(&key, Ts(ts)).unwrap();
                    }
                } else {
                    index.put(&key, Ts(ts), RowId(ts)).unwrap();
                }
                if next() % 50 == 0 {
                    index.purge(Ts(ts.saturating_sub(20)));
                }
            }
            // Versions after the image (a transaction in flight) are left out.
            let c = Ts(ts - 5);
            let changed = index.take_changed(c);
            let keys = changed.sorted();
            let versions: Vec<VersionAt> = keys.iter().map(|k| index.checkpoint_version(k, c)).collect();
            let image = write_image(keys.iter().copied().zip(versions), checkpoint > 0);
            runs.push(image);
            if runs.len() == 4 {
                let slices: Vec<&[u8]> = runs.iter().map(Vec::as_slice).collect();
                runs = vec![merge_images(&slices).unwrap()];
            }
            let mut restored = PrimaryIndex::read_from(&runs[0]).unwrap();
            for d in &runs[1..] {
                restored.apply_delta(d).unwrap();
            }
            let live = index.live_at(c);
            assert_eq!(restored.len(), live.len(), "checkpoint {checkpoint}");
            for k in 0..150i64 {
                let key = encode_key(TableId(1), &[Value::Int(k)]);
                assert_eq!(restored.latest(&key), live.latest(&key), "key {k} at checkpoint {checkpoint}");
            }
            // The changes after `c` are in the next set of changed keys.
            for (k, v) in &index.map {
                if v.last().is_some_and(|v| v.ts > c.get()) {
                    assert!(index.changed.sorted().contains(&k.as_slice()), "{k:?} changed after {c:?}");
                }
            }
        }
    }

    #[test]
    fn merge_refuses_runs_out_of_order() {
        let a = encode_key(TableId(1), &[Value::Int(1)]);
        let b = encode_key(TableId(1), &[Value::Int(2)]);
        let v = (Ts(1), Some(RowId(1)));
        let unordered = write_image([(b.as_slice(), v), (a.as_slice(), v)], false);
        let err = merge_images(&[&unordered]).err().unwrap().to_string();
        assert!(err.contains("out of order"), "{err}");
    }

    #[test]
    fn corrupt_snapshot_is_refused() {
        let mut index = PrimaryIndex::new();
        index.put(&encode_key(TableId(1), &[Value::Int(1)]), Ts(1), RowId(0)).unwrap();
        let mut bytes = Vec::new();
        index.write_to(&mut bytes);
        bytes[12] ^= 1;
        let err = PrimaryIndex::read_from(&bytes).err().unwrap().to_string();
        assert!(err.contains("checksum"), "{err}");
    }

    #[test]
    fn main_index_locates_ranges() {
        let mut mi = MainIndex::default();
        mi.add_range(RowId(0), 8192, FileId(1), 0, 0).unwrap();
        mi.add_range(RowId(8192), 8192, FileId(2), 1, 0).unwrap();
        mi.add_range(RowId(20000), 8192, FileId(1), 0, 8192).unwrap();
        assert_eq!(mi.locate(RowId(5)).unwrap().offset, 5);
        assert_eq!(mi.locate(RowId(8193)).unwrap().file, FileId(2));
        assert_eq!(mi.locate(RowId(20001)).unwrap().offset, 8193);
        assert!(mi.locate(RowId(17000)).is_none());
        assert!(mi.add_range(RowId(100), 1, FileId(3), 2, 0).is_err());
    }
}
