//! The primary index: where the live version of a key is.
//!
//! * **Single-point index (SPI)**: `(table, encoded key) → [(ts, row id | tombstone)]`,
//!   versions in ts order; [`PrimaryIndex::lookup`] returns the newest entry
//!   `≤ ts`. One partition per shard, used by that shard's writer only, so
//!   no locks. A key is a 28-byte entry — the key inline up to 13 bytes (a
//!   table and an integer key take 5 to 13, four integers below 256 at
//!   most 12; longer keys live beside) and its
//!   newest version packed in 14 (a 52-bit ts, a 60-bit row id) — in an
//!   arena of 8,192-entry chunks, found through a hash table (foldhash) of
//!   4-byte entry numbers: 34–38 bytes a key with the table's load factor
//!   (32-byte entries, versions unpacked, took 41). Older versions (an update's old row,
//!   until memory GC, [`PrimaryIndex::purge`], drops it) are appended to a
//!   log of displaced versions (32 bytes each, no second hash lookup per
//!   update); only checkpoints, for keys changed after their ts, read it.
//!   A hash map of 64-byte slots (the key and two versions inline)
//!   took 110–136 bytes a key.
//! * **Main index (MI)**: row-id ranges → (file, row offset). Every write-buffer
//!   block reserves a contiguous range of row ids, so one MI entry per block.
//!   Combining blocks into a regular file keeps file id and offsets: the MI
//!   never changes then.
//!
//! Keys are encoded order-preservingly ([`encode_key`]): comparing encodings
//! byte-wise compares the keys column by column.

mod arena;
mod image;
mod key;
mod main_index;

use std::hash::BuildHasher;

use hashbrown::HashTable;

use fovea_types::error::{Error, Result};
use fovea_types::ids::{RowId, Ts};

use arena::*;
use image::*;
pub use image::{ImageRun, ImageWriter, KeyUpgrade, merge_images, merge_images_into, write_image};
pub use key::encode_key_values;
pub use key::{KeyBytes, RoutingKey, encode_key, encode_row_key, routing_key, upgrade_key};
pub use main_index::{MainIndex, RangeEntry, RowLocation};

/// Where a key is in a [`PrimaryIndex`] ([`PrimaryIndex::latest_slot`]),
/// until the index next changes.
#[derive(Clone, Copy, Debug)]
pub struct KeySlot(u32);

/// One shard's partition of the single-point index.
pub struct PrimaryIndex {
    /// Entry numbers, by the hash of their key.
    table: HashTable<u32>,
    entries: Arena,
    /// The versions updates displaced, in the order they were displaced
    /// (so a key's are in ts order), until memory GC drops those no
    /// snapshot sees: an append, not a second hash lookup, per update.
    older: Vec<Displaced>,
    /// What the checkpoint being captured has read of `older`.
    versions_at: Option<VersionsAt>,
    hasher: foldhash::fast::FixedState,
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
    /// Keys in `bytes` (repeats counted).
    count: usize,
}

impl ChangedKeys {
    fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(&(key.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(key);
        self.count += 1;
    }

    /// Appends every key of `other`.
    pub fn append(&mut self, other: &ChangedKeys) {
        self.bytes.extend_from_slice(&other.bytes);
        self.count += other.count;
    }

    /// True when no key changed.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.bytes.capacity()
    }

    /// The distinct keys, in byte order: 4 bytes a key (offsets into
    /// the keys held here; 8 above 4 GiB of keys), not a 16-byte slice.
    pub fn sorted(&self) -> SortedKeys<'_> {
        let offsets = match u32::try_from(self.bytes.len()) {
            Ok(_) => Offsets::Narrow(self.sorted_offsets(|at| at as u32)),
            Err(_) => Offsets::Wide(self.sorted_offsets(|at| at as u64)),
        };
        SortedKeys { bytes: &self.bytes, offsets }
    }

    fn sorted_offsets<T: Copy + Into<u64>>(&self, narrow: impl Fn(usize) -> T) -> Vec<T> {
        // Each key beside its first 16 bytes as numbers: most keys (a
        // table id and an integer or a short text) are told apart by
        // those alone, so the sort mostly compares numbers in hand instead
        // of bytes behind two offsets. Zero padding makes a short key tie
        // with a longer one only where the longer goes on with zeros; the
        // bytes decide there.
        let mut keyed: Vec<(u64, u64, T)> = Vec::with_capacity(self.count);
        let mut at = 0;
        while at + 4 <= self.bytes.len() {
            let key = key_at(&self.bytes, at);
            let mut head = [0u8; 16];
            let n = key.len().min(16);
            head[..n].copy_from_slice(&key[..n]);
            let (high, low) = head.split_at(8);
            let number = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap_or_else(|_| unreachable!("8 bytes")));
            keyed.push((number(high), number(low), narrow(at)));
            at += 4 + key.len();
        }
        let key = |o: T| key_at(&self.bytes, o.into() as usize);
        keyed.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)).then_with(|| key(a.2).cmp(key(b.2))));
        keyed.dedup_by(|a, b| (a.0, a.1) == (b.0, b.1) && key(a.2) == key(b.2));
        keyed.into_iter().map(|(_, _, offset)| offset).collect()
    }
}

fn key_len_at(bytes: &[u8], at: usize) -> usize {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize
}

/// The key whose length prefix is at `at` of a [`ChangedKeys`]' bytes.
fn key_at(bytes: &[u8], at: usize) -> &[u8] {
    &bytes[at + 4..at + 4 + key_len_at(bytes, at)]
}

enum Offsets {
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

/// The distinct keys of a [`ChangedKeys`] in byte order
/// ([`ChangedKeys::sorted`]).
pub struct SortedKeys<'a> {
    bytes: &'a [u8],
    offsets: Offsets,
}

impl<'a> SortedKeys<'a> {
    /// Number of keys.
    pub fn len(&self) -> usize {
        match &self.offsets {
            Offsets::Narrow(o) => o.len(),
            Offsets::Wide(o) => o.len(),
        }
    }

    /// True when there is no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Key `i` (in byte order).
    pub fn get(&self, i: usize) -> &'a [u8] {
        let at = match &self.offsets {
            Offsets::Narrow(o) => o[i] as usize,
            Offsets::Wide(o) => o[i] as usize,
        };
        key_at(self.bytes, at)
    }

    /// The keys in byte order.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        (0..self.len()).map(|i| self.get(i))
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
            table: HashTable::new(),
            entries: Arena::default(),
            older: Vec::new(),
            versions_at: None,
            hasher: foldhash::fast::FixedState::with_seed(0x5eed_f0ea),
            changed: ChangedKeys::default(),
            changed_floor: 0,
        }
    }

    /// Number of keys with at least one version.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True when no key is indexed.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Reserves room for `additional` more keys.
    pub fn reserve(&mut self, additional: usize) {
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.table.reserve(additional, |&i| hasher.hash_one(entries.key(i)));
    }

    /// The entry of `key`.
    #[inline]
    fn find(&self, key: &[u8]) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        self.table.find(hash, |&i| self.entries.key(i) == key).copied()
    }

    /// A new entry for `key` (not in the index) with one version.
    fn insert_new(&mut self, key: &[u8], hash: u64, v: PackedVersion) -> u32 {
        let i = self.entries.alloc(key, v);
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.table.insert_unique(hash, i, |&j| hasher.hash_one(entries.key(j)));
        i
    }

    /// Removes entry `i` and its versions.
    fn remove_entry(&mut self, i: u32) {
        if self.older.iter().any(|d| d.entry == i) {
            self.older.retain(|d| d.entry != i);
            self.versions_at = None;
        }
        self.forget_entry(i);
    }

    /// Removes entry `i`, which has no displaced versions left.
    fn forget_entry(&mut self, i: u32) {
        let hash = self.hasher.hash_one(self.entries.key(i));
        if let Ok(found) = self.table.find_entry(hash, |&j| j == i) {
            found.remove();
        }
        self.entries.release(i);
    }

    /// Sets `key`'s versions to `versions` (oldest first, not empty; a
    /// version that does not fit an entry is a corrupt image).
    fn set_versions(&mut self, key: &[u8], versions: &[Version]) -> Result<()> {
        let Some((&newest, older)) = versions.split_last() else { return Ok(()) };
        let out_of_range =
            |v: &Version| image_corrupt(&format!("version at ts{} of row {} is out of range", v.ts, v.row));
        // Older versions are kept unpacked, but pack when they come up
        // again (`live_at`): every version fits, as pushed ones do.
        if let Some(v) = older.iter().find(|v| !v.fits()) {
            return Err(out_of_range(v));
        }
        let newest = PackedVersion::new(newest).ok_or_else(|| out_of_range(&newest))?;
        let hash = self.hasher.hash_one(key);
        let i = match self.table.find(hash, |&i| self.entries.key(i) == key).copied() {
            Some(i) => {
                if self.older.iter().any(|d| d.entry == i) {
                    self.older.retain(|d| d.entry != i);
                    self.versions_at = None;
                }
                self.entries.entry_mut(i).newest = newest;
                i
            }
            None => self.insert_new(key, hash, newest),
        };
        for (v, next) in older.iter().zip(versions.iter().skip(1)) {
            self.older.push(Displaced { entry: i, until: next.ts, version: *v });
        }
        Ok(())
    }

    /// Entry `i`'s newest version at or below `ts` (older ones are looked
    /// for in every displaced version: not a path of the writer's).
    fn version_at(&self, i: u32, ts: u64) -> Option<Version> {
        let newest = self.entries.entry(i).newest();
        if newest.ts <= ts {
            return Some(newest);
        }
        let first = self.older.iter().find(|d| d.entry == i && d.until > ts)?;
        Some(first.version).filter(|v| v.ts <= ts)
    }

    /// Every entry's older versions, oldest first.
    fn older_by_entry(&self) -> std::collections::HashMap<u32, Vec<Version>> {
        let mut by_entry: std::collections::HashMap<u32, Vec<Version>> = std::collections::HashMap::new();
        for d in &self.older {
            by_entry.entry(d.entry).or_default().push(d.version);
        }
        by_entry
    }

    /// The row id of the newest version `≤ ts`, or `None` when there is none
    /// or it is a tombstone.
    pub fn lookup(&self, key: &[u8], ts: Ts) -> Option<RowId> {
        let v = self.version_at(self.find(key)?, ts.get())?;
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
        let Some(i) = self.find(key) else { return (c, None) };
        let newest = self.entries.entry(i).newest();
        let v = if newest.ts <= c.get() {
            Some(newest)
        } else {
            self.changed.push(key);
            let at = match &mut self.versions_at {
                Some(at) if at.c == c.get() => at,
                slot => slot.insert(VersionsAt::new(c.get())),
            };
            at.scan(&self.older);
            at.get(i)
        };
        v.map_or((c, None), |v| (Ts(v.ts), (v.row != TOMBSTONE).then_some(RowId(v.row))))
    }

    /// Gives back keys [`Self::take_changed`] handed over, when what they
    /// were taken for (a checkpoint) did not take effect.
    pub fn restore_changed(&mut self, keys: &ChangedKeys) {
        self.changed.append(keys);
    }

    /// Counts every key as changed (the next checkpoint writes them all).
    pub fn mark_all_changed(&mut self) {
        for (_, e) in self.entries.used() {
            self.changed.push(self.entries.key_of(e));
        }
    }

    /// The row id of the newest version, if live (the writer's view).
    #[inline]
    pub fn latest(&self, key: &[u8]) -> Option<RowId> {
        let v = self.entries.entry(self.find(key)?).newest();
        (v.row != TOMBSTONE).then_some(RowId(v.row))
    }

    /// The newest version of `key` if it is live (the writer's view),
    /// with where the key is: an update or delete that found it this way
    /// records its next version there ([`Self::put_at`],
    /// [`Self::tombstone_at`]) without looking the key up again.
    #[inline]
    pub fn latest_slot(&self, key: &[u8]) -> Option<(KeySlot, RowId)> {
        let i = self.find(key)?;
        let v = self.entries.entry(i).newest();
        (v.row != TOMBSTONE).then_some((KeySlot(i), RowId(v.row)))
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

    /// [`Self::put`] of the key [`Self::latest_slot`] found at `slot`, the
    /// index unchanged since.
    #[inline]
    pub fn put_at(&mut self, slot: KeySlot, key: &[u8], ts: Ts, row: RowId) -> Result<()> {
        self.push_at(slot, key, Version { ts: ts.get(), row: row.0 })
    }

    /// [`Self::tombstone`] of the key [`Self::latest_slot`] found at
    /// `slot`, the index unchanged since.
    #[inline]
    pub fn tombstone_at(&mut self, slot: KeySlot, key: &[u8], ts: Ts) -> Result<()> {
        self.push_at(slot, key, Version { ts: ts.get(), row: TOMBSTONE })
    }

    #[inline]
    fn push(&mut self, key: &[u8], v: Version) -> Result<()> {
        let packed = pack(v)?;
        let hash = self.hasher.hash_one(key);
        let Some(i) = self.table.find(hash, |&i| self.entries.key(i) == key).copied() else {
            self.changed.push(key);
            self.insert_new(key, hash, packed);
            return Ok(());
        };
        self.push_version(i, key, v, packed)
    }

    #[inline]
    fn push_at(&mut self, slot: KeySlot, key: &[u8], v: Version) -> Result<()> {
        let packed = pack(v)?;
        // A slot is only good until the index changes: one that no longer
        // holds the key is the caller's bug, refused rather than followed
        // (one compare of an entry just read).
        let i = slot.0;
        if i >= self.entries.next || !self.entries.entry(i).is_used() || self.entries.key(i) != key {
            return Err(Error::invariant("an index slot used after the index changed"));
        }
        self.push_version(i, key, v, packed)
    }

    /// Records `v` (packed: `packed`) as the newest version of entry `i`,
    /// which holds `key`.
    #[inline]
    fn push_version(&mut self, i: u32, key: &[u8], v: Version, packed: PackedVersion) -> Result<()> {
        let entry = self.entries.entry_mut(i);
        let last = entry.newest();
        // A key whose newest version is above the floor was pushed since
        // `changed` was taken, so it is in it already.
        if last.ts <= self.changed_floor {
            self.changed.push(key);
        }
        if last.ts > v.ts {
            return Err(Error::invariant(format!(
                "index version at ts{} after one at ts{}: a shard applies in timestamp order",
                v.ts, last.ts
            )));
        }
        entry.newest = packed;
        // The same transaction touching the key again: the last write wins.
        if last.ts < v.ts {
            self.older.push(Displaced { entry: i, until: v.ts, version: last });
        }
        Ok(())
    }

    /// Drops versions no snapshot `≥ lwm` can see: for every key, all but the
    /// newest version `≤ lwm`, and the key itself when that one is a tombstone
    /// with nothing newer.
    pub fn purge(&mut self, lwm: Ts) -> usize {
        let lwm = lwm.get();
        // A version displaced at or below the LWM is one no snapshot sees.
        let window = self.older.len();
        self.older.retain(|d| d.until > lwm);
        self.versions_at = None;
        let mut dropped = window - self.older.len();
        // Keys whose one version left is a tombstone no snapshot sees past
        // (their displaced versions, until at most that tombstone's ts,
        // went above: no walk of the log per key).
        let gone: Vec<u32> = self
            .entries
            .used()
            .filter(|(_, e)| {
                let v = e.newest();
                v.row == TOMBSTONE && v.ts <= lwm
            })
            .map(|(i, _)| i)
            .collect();
        dropped += gone.len();
        for i in gone {
            self.forget_entry(i);
        }
        // The room the window since the last GC needed stays (the next one
        // likely needs it again); a burst's goes back.
        if self.older.capacity() > 4 * window.max(4096) {
            self.older.shrink_to(2 * window.max(4096));
        }
        dropped
    }

    /// The index as a snapshot at `ts` sees it: one version per key live at
    /// `ts`, nothing newer (checkpoints are images at one timestamp).
    pub fn live_at(&self, ts: Ts) -> PrimaryIndex {
        let mut out = PrimaryIndex::new();
        out.reserve(self.len());
        let mut older = VersionsAt::new(ts.get());
        older.scan(&self.older);
        for (i, e) in self.entries.used() {
            let newest = e.newest();
            // A displaced version always packs: it was an entry's newest,
            // or was checked when restored (`set_versions`).
            let v = if newest.ts <= ts.get() { Some(e.newest) } else { older.get(i).and_then(PackedVersion::new) };
            if let Some(v) = v
                && v.get().row != TOMBSTONE
            {
                let key = self.entries.key_of(e);
                out.insert_new(key, out.hasher.hash_one(key), v);
            }
        }
        out
    }

    /// Every row id some version points at (tombstones left out), for
    /// checks before [`Self::remap_rows`].
    pub fn rows(&self) -> impl Iterator<Item = RowId> + '_ {
        let newest = self.entries.used().map(|(_, e)| e.newest());
        newest.chain(self.older.iter().map(|d| d.version)).filter(|v| v.row != TOMBSTONE).map(|v| RowId(v.row))
    }

    /// Moves every version pointing at a row id `moved` maps to the row id
    /// it returns (storage GC moved the row to a new file); the others stay.
    /// `moved` returns row ids below [`RowId::LIMIT`] (the caller checks
    /// its range first; one beyond it panics).
    pub fn remap_rows(&mut self, moved: impl Fn(RowId) -> Option<RowId>) {
        let remap = |v: &mut Version| {
            if v.row != TOMBSTONE
                && let Some(to) = moved(RowId(v.row))
            {
                v.row = to.0;
                return true;
            }
            false
        };
        let mut moved_entries = Vec::new();
        for i in 0..self.entries.next {
            let entry = self.entries.entry_mut(i);
            let mut v = entry.newest();
            if entry.is_used() && remap(&mut v) {
                #[allow(clippy::expect_used, reason = "the caller checks the new row ids' range (documented)")]
                let packed = PackedVersion::new(v).expect("remapped row id below RowId::LIMIT");
                entry.newest = packed;
                moved_entries.push(i);
            }
        }
        for d in &mut self.older {
            if remap(&mut d.version) {
                moved_entries.push(d.entry);
            }
        }
        self.versions_at = None;
        moved_entries.sort_unstable();
        moved_entries.dedup();
        for i in moved_entries {
            if self.entries.entry(i).newest().ts <= self.changed_floor {
                self.changed.push(self.entries.key(i));
            }
        }
    }

    /// Approximate bytes used (constant time: metrics read it often).
    pub fn memory_bytes(&self) -> usize {
        // A table bucket is an entry number and a control byte.
        let versions_at =
            self.versions_at.as_ref().map_or(0, |v| v.first.capacity() * (std::mem::size_of::<(u32, Version)>() + 1));
        self.table.capacity() * 5
            + self.entries.memory_bytes()
            + self.older.capacity() * std::mem::size_of::<Displaced>()
            + versions_at
            + self.changed.memory_bytes()
    }

    /// Serialises every version of every key (format 1, which older
    /// checkpoints hold): magic, version, entries, CRC32.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(INDEX_MAGIC);
        out.extend_from_slice(&INDEX_FORMAT.to_le_bytes());
        out.extend_from_slice(&(self.len() as u64).to_le_bytes());
        let older = self.older_by_entry();
        for (i, e) in self.entries.used() {
            let k = self.entries.key_of(e);
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
            let older = older.get(&i).map_or(&[][..], Vec::as_slice);
            out.extend_from_slice(&(older.len() as u32 + 1).to_le_bytes());
            for v in older.iter().chain([&e.newest()]) {
                out.extend_from_slice(&v.ts.to_le_bytes());
                out.extend_from_slice(&v.row.to_le_bytes());
            }
        }
        let crc = crc32fast::hash(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
    }

    /// Restores an index written by [`write_image`] (format 3, or 2 whose
    /// keys `upgrade` rewrites; removals in it are skipped) or by
    /// [`PrimaryIndex::write_to`] (format 1, keys rewritten by `upgrade`).
    /// Without `upgrade` an image of an older format is refused.
    pub fn read_from(bytes: &[u8], upgrade: Option<KeyUpgrade<'_>>) -> Result<Self> {
        let (format, n, mut r) = open_image(bytes)?;
        let upgrade = key_upgrade(format, upgrade)?;
        let mut index = PrimaryIndex::new();
        index.reserve(n.min(r.bytes.len() / 8));
        if format != INDEX_FORMAT {
            for _ in 0..n {
                let (key, ts, row) = r.entry()?;
                if row != TOMBSTONE {
                    let upgraded = upgrade.map(|u| u(key)).transpose()?;
                    index.insert_restored(upgraded.as_deref().unwrap_or(key), Version { ts, row })?;
                }
            }
        } else {
            let mut versions = Vec::new();
            for _ in 0..n {
                let klen = r.u32().ok_or_else(|| image_corrupt("truncated key"))? as usize;
                let key = r.take(klen).ok_or_else(|| image_corrupt("truncated key"))?;
                let vlen = r.u32().ok_or_else(|| image_corrupt("truncated versions"))? as usize;
                versions.clear();
                for _ in 0..vlen {
                    let ts = r.u64().ok_or_else(|| image_corrupt("truncated version"))?;
                    let row = r.u64().ok_or_else(|| image_corrupt("truncated version"))?;
                    // Restored versions are none of the changes since.
                    index.changed_floor = index.changed_floor.max(ts);
                    versions.push(Version { ts, row });
                }
                if versions.is_empty() {
                    return Err(image_corrupt("a key without versions"));
                }
                let upgraded = upgrade.map(|u| u(key)).transpose()?;
                index.set_versions(upgraded.as_deref().unwrap_or(key), &versions)?;
            }
        }
        if r.pos != r.bytes.len() {
            return Err(image_corrupt("trailing bytes"));
        }
        Ok(index)
    }

    fn insert_restored(&mut self, key: &[u8], v: Version) -> Result<()> {
        // Restored versions are none of the changes since.
        self.changed_floor = self.changed_floor.max(v.ts);
        self.set_versions(key, &[v])
    }

    /// Applies a delta [`write_image`] wrote (with removals): each key
    /// takes the version the delta has for it, a removal drops it. A
    /// delta of format 2 has its keys rewritten by `upgrade` (refused
    /// without).
    pub fn apply_delta(&mut self, bytes: &[u8], upgrade: Option<KeyUpgrade<'_>>) -> Result<()> {
        let (format, n, mut r) = open_image(bytes)?;
        if format == INDEX_FORMAT {
            return Err(image_corrupt(&format!(
                "a delta must be of format {IMAGE_FORMAT} or {IMAGE_FORMAT_WIDE_INTS}, not {format}"
            )));
        }
        let upgrade = key_upgrade(format, upgrade)?;
        for _ in 0..n {
            let (key, ts, row) = r.entry()?;
            let upgraded = upgrade.map(|u| u(key)).transpose()?;
            let key = upgraded.as_deref().unwrap_or(key);
            if row == TOMBSTONE {
                if let Some(i) = self.find(key) {
                    self.remove_entry(i);
                }
            } else {
                self.insert_restored(key, Version { ts, row })?;
            }
        }
        if r.pos != r.bytes.len() {
            return Err(image_corrupt("trailing bytes"));
        }
        Ok(())
    }

    /// Every key with its newest version's ts (tests).
    #[cfg(test)]
    fn newest_versions(&self) -> Vec<(Vec<u8>, u64)> {
        self.entries.used().map(|(_, e)| (self.entries.key_of(e).to_vec(), e.newest().ts)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::DataType;
    use bytes::Bytes;
    use fovea_types::ids::{FileId, TableId};
    use fovea_types::schema::{TableDef, Value};

    #[test]
    fn a_rows_key_encodes_as_its_key_values_do() {
        use arrow::datatypes::{DataType, Field, Schema};
        let schema = Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("id", DataType::Int64, false),
            Field::new("at", DataType::Int64, false),
        ]);
        let table = TableDef::new(TableId(3), "s.t", std::sync::Arc::new(schema), vec![2, 0]).unwrap();
        let row = vec![Value::Utf8("a\u{0}b".into()), Value::Int(-5), Value::Int(7)];
        assert_eq!(encode_row_key(&table, &row), encode_key(table.id, &[Value::Int(7), Value::Utf8("a\u{0}b".into())]));
    }
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
            // Every third key is too long to sit in its entry.
            let key_of = |k: i64| if k % 3 == 0 {
                encode_key(TableId(3), &[Value::Utf8("a long key ".repeat(k as usize + 2))])
            } else {
                encode_key(TableId(3), &[Value::Int(k)])
            };
            for (k, action) in ops {
                let key = key_of(k);
                match action {
                    0 => { ts += 1; index.put(&key, Ts(ts), RowId(ts * 10)).unwrap(); oracle.entry(k).or_default().push((ts, Some(ts * 10))); }
                    1 => { ts += 1; index.tombstone(&key, Ts(ts)).unwrap(); oracle.entry(k).or_default().push((ts, None)); }
                    2 => { lwm = ts; index.purge(Ts(lwm)); }
                    _ => {
                        let mut bytes = Vec::new();
                        index.write_to(&mut bytes);
                        // The keys written are today's: read as they are.
                        index = PrimaryIndex::read_from(&bytes, Some(&|k| Ok(KeyBytes::from_slice(k)))).unwrap();
                    }
                }
                prop_assert_eq!(index.len(), oracle.len() - removed(&oracle, lwm));
                let long_bytes: usize = index.entries.long_keys.iter().map(|k| k.len()).sum();
                prop_assert_eq!(index.entries.long_bytes, long_bytes);
                for (&k, versions) in &oracle {
                    let key = key_of(k);
                    for q in lwm..=ts {
                        let expect = versions.iter().rev().find(|v| v.0 <= q).and_then(|v| v.1).map(RowId);
                        prop_assert_eq!(index.lookup(&key, Ts(q)), expect, "key {} at {}", k, q);
                    }
                }
            }
        }
    }

    /// Keys of the oracle memory GC has dropped from the index (their
    /// newest version is a tombstone at or below `lwm`).
    fn removed(oracle: &BTreeMap<i64, Vec<(u64, Option<u64>)>>, lwm: u64) -> usize {
        oracle.values().filter(|v| v.last().is_some_and(|l| l.1.is_none() && l.0 <= lwm)).count()
    }

    /// An index of integer keys takes about 40 bytes a key (entry + table
    /// bucket at its load factor), whatever the number of keys; entries
    /// memory GC empties are filled again before the arena grows.
    #[test]
    fn an_integer_key_takes_about_forty_bytes() {
        let mut index = PrimaryIndex::new();
        let key = |k: i64| encode_key(TableId(7), &[Value::Int(k)]);
        for n in [100_000i64, 200_000, 300_000] {
            for k in 0..n {
                index.put(&key(k), Ts(1), RowId(k as u64)).unwrap();
            }
            // What a checkpoint would take (the changed keys' list).
            drop(index.take_changed(Ts(1)));
            let per_key = index.memory_bytes() as f64 / index.len() as f64;
            assert!(per_key <= 40.0, "{per_key} bytes a key with {n} keys");
        }
        let arena = index.entries.chunks.len();
        for k in 0..100_000 {
            index.tombstone(&key(k), Ts(2)).unwrap();
        }
        assert_eq!(index.purge(Ts(2)), 100_000 * 2);
        assert_eq!(index.len(), 200_000);
        for k in 300_000..400_000 {
            index.put(&key(k), Ts(3), RowId(k as u64)).unwrap();
        }
        assert_eq!(index.entries.chunks.len(), arena, "freed entries are taken again");
        assert_eq!(index.lookup(&key(5), Ts(3)), None);
        assert_eq!(index.lookup(&key(5), Ts(1)), None, "purged below the LWM");
        assert_eq!(index.lookup(&key(150_000), Ts(3)), Some(RowId(150_000)));
        assert_eq!(index.lookup(&key(350_000), Ts(3)), Some(RowId(350_000)));
    }

    #[test]
    fn an_image_written_in_pieces_is_the_image_written_whole() {
        let keys: Vec<_> = (0..5000i64).map(|k| encode_key(TableId(4), &[Value::Int(k)])).collect();
        let version = |k: usize| (Ts(k as u64 + 1), (!k.is_multiple_of(7)).then_some(RowId(k as u64)));
        let whole = write_image(keys.iter().enumerate().map(|(k, key)| (key.as_slice(), version(k))), true);
        let mut image = ImageWriter::new(keys.len() as u64);
        let mut pieces = Vec::new();
        for (k, key) in keys.iter().enumerate() {
            image.push(key, version(k));
            pieces.extend(image.take_piece(4096));
        }
        assert!(pieces.len() > 10);
        pieces.push(image.finish().unwrap());
        assert_eq!(pieces.concat(), whole);
        // As a base: the removals are skipped.
        let restored = PrimaryIndex::read_from(&whole, None).unwrap();
        assert_eq!(restored.len(), keys.len() - keys.len().div_ceil(7));
        assert_eq!(restored.lookup(&keys[7], Ts(9)), None);
        assert_eq!(restored.lookup(&keys[8], Ts(9)), Some(RowId(8)));
        // A count that is not kept is an error, not a corrupt image.
        let mut short = ImageWriter::new(2);
        short.push(&keys[0], version(0));
        assert!(short.finish().is_err());
    }

    #[test]
    fn changed_keys_sort_and_drop_repeats() {
        let mut changed = ChangedKeys::default();
        for k in [b"b".as_slice(), b"a", b"ab", b"b", b"", b"a\0"] {
            changed.push(k);
        }
        let sorted: Vec<&[u8]> = changed.sorted().iter().collect();
        assert_eq!(sorted, [b"".as_slice(), b"a", b"a\0", b"ab", b"b"]);
    }

    proptest::proptest! {
        /// Changed keys come out as the distinct keys sorted by their
        /// bytes: short and long, ties in the first 16 bytes, zeros after
        /// a shorter key's end.
        #[test]
        fn changed_keys_sort_as_their_bytes(
            keys in proptest::collection::vec(
                (proptest::collection::vec(proptest::prop_oneof![Just(0u8), Just(1u8), Just(255u8), any::<u8>()], 0..24), 0usize..3),
                0..200,
            ),
        ) {
            let mut changed = ChangedKeys::default();
            let mut model = std::collections::BTreeSet::new();
            for (key, repeats) in &keys {
                for _ in 0..=*repeats {
                    changed.push(key);
                }
                model.insert(key.as_slice());
            }
            let sorted: Vec<&[u8]> = changed.sorted().iter().collect();
            proptest::prop_assert_eq!(sorted, model.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn keys_around_the_inline_length_and_versions_at_the_range_ends() {
        let mut index = PrimaryIndex::new();
        // Table (4 bytes), tag, then text: keys of 7 to 20 bytes, inline
        // and beside.
        let keys: Vec<_> = (0..14).map(|n| encode_key(TableId(2), &[Value::Utf8("x".repeat(n))])).collect();
        assert!(keys.iter().any(|k| k.len() == INLINE_KEY) && keys.iter().any(|k| k.len() == INLINE_KEY + 1));
        let last_row = RowId::LIMIT - 1;
        for (i, k) in keys.iter().enumerate() {
            let row = if i % 2 == 0 { RowId(i as u64) } else { RowId(last_row - i as u64) };
            index.put(k, Ts(5), row).unwrap();
        }
        index.put(&keys[0], Ts::MAX, RowId(last_row)).unwrap();
        index.tombstone(&keys[1], Ts::MAX).unwrap();
        for (i, k) in keys.iter().enumerate() {
            let row = if i % 2 == 0 { RowId(i as u64) } else { RowId(last_row - i as u64) };
            assert_eq!(index.lookup(k, Ts(5)), Some(row), "key of {} bytes", k.len());
        }
        assert_eq!(index.latest(&keys[0]), Some(RowId(last_row)));
        assert_eq!(index.lookup(&keys[1], Ts::MAX), None);
        assert_eq!(index.checkpoint_version(&keys[1], Ts::MAX), (Ts::MAX, None));
        // Beyond the ranges: refused, and nothing changes.
        assert!(index.put(&keys[2], Ts(6), RowId(RowId::LIMIT)).is_err());
        assert!(index.put(&keys[2], Ts(Ts::MAX.get() + 1), RowId(1)).is_err());
        assert_eq!(index.lookup(&keys[2], Ts(7)), Some(RowId(2)));
        // Through an image: the same versions; one out of range is corrupt.
        let mut at_5: Vec<_> = keys.iter().map(|k| (k.as_slice(), (Ts(5), index.lookup(k, Ts(5))))).collect();
        at_5.sort_by(|a, b| a.0.cmp(b.0));
        let restored = PrimaryIndex::read_from(&write_image(at_5, false), None).unwrap();
        for k in &keys {
            assert_eq!(restored.lookup(k, Ts(5)), index.lookup(k, Ts(5)));
        }
        let bad = write_image([(keys[0].as_slice(), (Ts(5), Some(RowId(RowId::LIMIT))))], false);
        assert!(PrimaryIndex::read_from(&bad, None).is_err());
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
            // The writer goes on between the checkpoint's look-ups (it
            // reads in chunks, the shard applying in between).
            let keys: Vec<Vec<u8>> = keys.iter().map(<[u8]>::to_vec).collect();
            let mut versions: Vec<VersionAt> = Vec::new();
            for part in keys.chunks(keys.len() / 3 + 1) {
                versions.extend(part.iter().map(|k| index.checkpoint_version(k, c)));
                for _ in 0..5 {
                    ts += 1;
                    let key = encode_key(TableId(1), &[Value::Int((next() % 150) as i64)]);
                    index.put(&key, Ts(ts), RowId(ts)).unwrap();
                }
            }
            let image = write_image(keys.iter().map(Vec::as_slice).zip(versions), checkpoint > 0);
            runs.push(image);
            if runs.len() == 4 {
                let slices: Vec<&[u8]> = runs.iter().map(Vec::as_slice).collect();
                let merged = merge_images(&slices).unwrap();
                // Read and written in pieces, as a checkpoint streams it:
                // the same bytes.
                let (mut streamed, mut pieces) = (Vec::new(), 0);
                let fetched = std::cell::Cell::new(0);
                let mut in_pieces: Vec<ImageRun<'_>> = slices
                    .iter()
                    .map(|r| {
                        ImageRun::new(r.len() as u64, 7, |range| {
                            fetched.set(fetched.get() + 1);
                            Ok(Bytes::copy_from_slice(&r[range.start as usize..range.end as usize]))
                        })
                    })
                    .collect();
                let size = merge_images_into(&mut in_pieces, 64, |p| {
                    streamed.extend_from_slice(p);
                    pieces += 1;
                    Ok(())
                })
                .unwrap();
                assert_eq!((streamed.as_slice(), size), (merged.as_slice(), merged.len() as u64));
                assert!(pieces > 1 || merged.len() < 64);
                // Two passes, 7 bytes a fetch.
                let total: usize = slices.iter().map(|r| r.len()).sum();
                assert!(fetched.get() >= 2 * total / 7, "{} fetches of {total} bytes", fetched.get());
                drop(in_pieces);
                runs = vec![merged];
            }
            let mut restored = PrimaryIndex::read_from(&runs[0], None).unwrap();
            for d in &runs[1..] {
                restored.apply_delta(d, None).unwrap();
            }
            let live = index.live_at(c);
            assert_eq!(restored.len(), live.len(), "checkpoint {checkpoint}");
            for k in 0..150i64 {
                let key = encode_key(TableId(1), &[Value::Int(k)]);
                assert_eq!(restored.latest(&key), live.latest(&key), "key {k} at checkpoint {checkpoint}");
            }
            // The changes after `c` are in the next set of changed keys.
            for (k, newest) in index.newest_versions() {
                if newest > c.get() {
                    assert!(index.changed.sorted().iter().any(|x| x == k.as_slice()), "{k:?} changed after {c:?}");
                }
            }
        }
    }

    #[test]
    fn merge_refuses_a_corrupt_or_short_run() {
        let keys: Vec<_> = (0..100i64).map(|k| encode_key(TableId(1), &[Value::Int(k)])).collect();
        let image = write_image(keys.iter().map(|k| (k.as_slice(), (Ts(1), Some(RowId(1))))), false);
        assert!(merge_images(&[&image]).is_ok());
        let mut flipped = image.clone();
        flipped[image.len() / 2] ^= 0x10;
        let err = merge_images(&[&image, &flipped]).err().unwrap().to_string();
        assert!(err.contains("checksum") || err.contains("order") || err.contains("truncated"), "{err}");
        for cut in [1, 4, 5, image.len() / 2, image.len() - 3] {
            assert!(merge_images(&[&image[..image.len() - cut]]).is_err(), "cut {cut}");
        }
        // A run longer than the manifest said, read by ranges.
        let mut short = [ImageRun::new(image.len() as u64 + 8, 16, |r| {
            Ok(Bytes::copy_from_slice(&image[r.start as usize..(r.end as usize).min(image.len())]))
        })];
        assert!(merge_images_into(&mut short, 64, |_| Ok(())).is_err());
    }

    /// The CRC is hashed as ranges are fetched: whatever the fetch size
    /// (ranges ending inside a field, inside the CRC), a sound image
    /// merges and one bit flipped in a version (where only the CRC can
    /// tell) is refused.
    #[test]
    fn the_checksum_holds_for_any_fetch_size() {
        let keys: Vec<_> = (0..50i64).map(|k| encode_key(TableId(1), &[Value::Int(k)])).collect();
        let image = write_image(keys.iter().map(|k| (k.as_slice(), (Ts(7), Some(RowId(9))))), false);
        // The last entry's row id: the 8 bytes before the CRC.
        let mut flipped = image.clone();
        flipped[image.len() - 4 - 3] ^= 0x01;
        for fetch in (1..=13).chain([image.len() - 4, image.len() - 1, image.len()]) {
            let run = |bytes: &[u8]| {
                let bytes = bytes.to_vec();
                let mut runs = [ImageRun::new(bytes.len() as u64, fetch, move |r| {
                    Ok(Bytes::copy_from_slice(&bytes[r.start as usize..r.end as usize]))
                })];
                let mut n = 0;
                merge_images_into(&mut runs, 64, |_| {
                    n += 1;
                    Ok(())
                })
                .map(|_| n)
            };
            assert!(run(&image).is_ok(), "fetch {fetch}");
            let err = run(&flipped).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("checksum"), "fetch {fetch}: {err}");
        }
    }

    /// The key encoding of images before format 3 (integers as `0x01`
    /// and 8 bytes, sign bit flipped; the rest as today).
    fn wide_int_key(table: TableId, key: &[Value]) -> Vec<u8> {
        let mut out = table.0.to_be_bytes().to_vec();
        for v in key {
            match v {
                Value::Int(i) => {
                    out.push(1);
                    out.extend_from_slice(&((*i as u64) ^ (1 << 63)).to_be_bytes());
                }
                other => out.extend_from_slice(&encode_key(TableId(0), std::slice::from_ref(other))[4..]),
            }
        }
        out
    }

    /// An image of format 2 (today's layout, older keys).
    fn wide_int_image(entries: &[(Vec<u8>, VersionAt)], keep_removed: bool) -> Vec<u8> {
        let mut image = write_image(entries.iter().map(|(k, v)| (k.as_slice(), *v)), keep_removed);
        image[INDEX_MAGIC.len()..INDEX_MAGIC.len() + 4].copy_from_slice(&IMAGE_FORMAT_WIDE_INTS.to_le_bytes());
        let body = image.len() - 4;
        let crc = crc32fast::hash(&image[..body]);
        image[body..].copy_from_slice(&crc.to_le_bytes());
        image
    }

    #[test]
    fn integers_take_the_bytes_they_need_in_order() {
        let key = |i: i64| encode_key(TableId(1), &[Value::Int(i)]);
        let cases: [(i64, &[u8]); 9] = [
            (i64::MIN, &[0x77, 0x80, 0, 0, 0, 0, 0, 0, 0]),
            (-257, &[0x7D, 0xFE, 0xFF]),
            (-256, &[0x7E, 0x00]),
            (-1, &[0x7F]),
            (0, &[0x80]),
            (1, &[0x81, 1]),
            (255, &[0x81, 0xFF]),
            (256, &[0x82, 1, 0]),
            (i64::MAX, &[0x88, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]),
        ];
        for w in cases.windows(2) {
            assert!(key(w[0].0) < key(w[1].0), "{} {}", w[0].0, w[1].0);
        }
        for (i, bytes) in cases {
            assert_eq!(&key(i)[4..], bytes, "{i}");
        }
        // A four-integer key of small numbers stays inline in the index.
        let composite = encode_key(TableId(7), &[Value::Int(1), Value::Int(9), Value::Int(3000), Value::Int(14)]);
        assert!(composite.len() <= INLINE_KEY, "{}", composite.len());
        assert!(encode_key(TableId(1), &[Value::Null]) < key(i64::MIN));
    }

    #[test]
    fn older_keys_are_refused_where_they_do_not_parse() {
        let types = [DataType::Int64, DataType::Utf8];
        let upgrade = |k: &[u8]| upgrade_key(k, |t| (t.0 == 1).then_some(&types[..]));
        let good = wide_int_key(TableId(1), &[Value::Int(5), Value::Utf8("a".into())]);
        assert_eq!(upgrade(&good).unwrap(), encode_key(TableId(1), &[Value::Int(5), Value::Utf8("a".into())]));
        for (bad, why) in [
            (wide_int_key(TableId(2), &[Value::Int(5), Value::Utf8("a".into())]), "names table 2"),
            (good[..good.len() - 1].to_vec(), "ends inside a string"),
            (good[..7].to_vec(), "ends inside an integer"),
            ([&good[..], &[0]].concat(), "bytes after its last column"),
            (good[..13].to_vec(), "ends before its last column"),
            ([&good[..4], &[7]].concat(), "tagged 7"),
        ] {
            let err = upgrade(&bad).err().unwrap().to_string();
            assert!(err.contains(why), "{why}: {err}");
        }
    }

    #[test]
    fn images_of_format_2_are_read_with_their_keys_rewritten() {
        let types = [DataType::Int64, DataType::Utf8];
        let upgrade = |k: &[u8]| upgrade_key(k, |t| (t.0 == 1).then_some(&types[..]));
        let values = |i: i64| [Value::Int(i * 1000 - 5000), Value::Utf8(format!("k{i}"))];
        let v = |ts: u64, row: Option<u64>| (Ts(ts), row.map(RowId));
        let mut base: Vec<_> = (0..10).map(|i| (wide_int_key(TableId(1), &values(i)), v(5, Some(i as u64)))).collect();
        base.sort();
        // A delta removes key 3 and moves key 4.
        let mut delta = vec![
            (wide_int_key(TableId(1), &values(3)), v(8, None)),
            (wide_int_key(TableId(1), &values(4)), v(8, Some(40))),
        ];
        delta.sort();
        let (base, delta) = (wide_int_image(&base, false), wide_int_image(&delta, true));
        let err = PrimaryIndex::read_from(&base, None).err().unwrap().to_string();
        assert!(err.contains("format 2"), "{err}");
        let mut index = PrimaryIndex::read_from(&base, Some(&upgrade)).unwrap();
        assert!(index.apply_delta(&delta, None).is_err());
        index.apply_delta(&delta, Some(&upgrade)).unwrap();
        for i in 0..10 {
            let expect = match i {
                3 => None,
                4 => Some(RowId(40)),
                i => Some(RowId(i as u64)),
            };
            assert_eq!(index.lookup(&encode_key(TableId(1), &values(i)), Ts(9)), expect, "{i}");
        }
    }

    proptest! {
        /// Every key of an older image, of every key type, becomes the
        /// key today's encoding gives the same values, and routes as it did.
        #[test]
        fn older_keys_upgrade_to_todays(key in proptest::collection::vec(arb_value(), 1..4)) {
            let types: Vec<DataType> = key
                .iter()
                .map(|v| match v {
                    Value::Int(_) | Value::Null => DataType::Int64,
                    Value::Bool(_) => DataType::Boolean,
                    Value::Float(_) => DataType::Float64,
                    Value::Decimal(_) => DataType::Decimal128(38, 2),
                    Value::Utf8(_) => DataType::Utf8,
                    Value::Binary(_) => DataType::Binary,
                })
                .collect();
            let old = wide_int_key(TableId(4), &key);
            let upgraded = upgrade_key(&old, |t| (t.0 == 4).then_some(&types[..])).unwrap();
            prop_assert_eq!(upgraded, encode_key(TableId(4), &key));
            // Shards are still chosen by the older encoding.
            let routed = routing_key(TableId(4), &key);
            prop_assert_eq!(routed.as_slice(), old.as_slice());
        }
    }

    #[test]
    fn a_found_slot_takes_the_next_version_until_the_index_changes() {
        let mut index = PrimaryIndex::new();
        let (a, b) = (encode_key(TableId(1), &[Value::Int(1)]), encode_key(TableId(1), &[Value::Int(2)]));
        assert!(index.latest_slot(&a).is_none());
        index.put(&a, Ts(1), RowId(10)).unwrap();
        let (slot, row) = index.latest_slot(&a).unwrap();
        assert_eq!(row, RowId(10));
        index.put_at(slot, &a, Ts(2), RowId(20)).unwrap();
        assert_eq!(index.lookup(&a, Ts(1)), Some(RowId(10)), "the displaced version stays for older snapshots");
        assert_eq!(index.lookup(&a, Ts(2)), Some(RowId(20)));
        let (slot, _) = index.latest_slot(&a).unwrap();
        index.tombstone_at(slot, &a, Ts(3)).unwrap();
        assert!(index.latest_slot(&a).is_none());
        assert_eq!(index.lookup(&a, Ts(3)), None);
        // A slot of another key, or of a key since removed, is refused.
        assert!(index.put_at(slot, &b, Ts(4), RowId(40)).is_err());
        index.purge(Ts(3));
        assert!(index.put_at(slot, &a, Ts(4), RowId(40)).is_err());
        assert_eq!(index.lookup(&a, Ts(4)), None);
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
        let err = PrimaryIndex::read_from(&bytes, Some(&|k| Ok(KeyBytes::from_slice(k)))).err().unwrap().to_string();
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
