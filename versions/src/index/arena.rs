//! The SPI's storage: versions packed into 28-byte entries in an arena of
//! chunks, long keys beside, and the log of displaced versions.

use hashbrown::HashMap;

use fovea_types::error::{Error, Result};
use fovea_types::ids::{RowId, TS_BITS_MASK};

/// Row id meaning "deleted" in a version list.
pub(super) const TOMBSTONE: u64 = u64::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Version {
    pub(super) ts: u64,
    pub(super) row: u64,
}

/// A version an update displaced: entry `entry` had `version` until
/// `until` (the ts of the version after it).
#[derive(Clone, Copy, Debug)]
pub(super) struct Displaced {
    pub(super) entry: u32,
    pub(super) until: u64,
    pub(super) version: Version,
}

/// The versions a checkpoint at `c` reads of the keys changed after it:
/// per entry, its first displaced version with `until > c` (of
/// `older[..scanned]`).
pub(super) struct VersionsAt {
    pub(super) c: u64,
    pub(super) scanned: usize,
    pub(super) first: HashMap<u32, Version, foldhash::fast::FixedState>,
}

impl VersionsAt {
    pub(super) fn new(c: u64) -> Self {
        VersionsAt { c, scanned: 0, first: HashMap::with_hasher(foldhash::fast::FixedState::with_seed(0x01de_4a11)) }
    }

    /// Takes in the displaced versions after the ones scanned so far.
    pub(super) fn scan(&mut self, older: &[Displaced]) {
        for d in &older[self.scanned..] {
            if d.until > self.c {
                self.first.entry(d.entry).or_insert(d.version);
            }
        }
        self.scanned = older.len();
    }

    /// Entry `i`'s version at `c`, given that its newest is above `c`.
    pub(super) fn get(&self, i: u32) -> Option<Version> {
        self.first.get(&i).copied().filter(|v| v.ts <= self.c)
    }
}

/// Entries per chunk of the entry arena (224 KiB).
pub(super) const CHUNK_BITS: u32 = 13;
pub(super) const CHUNK: usize = 1 << CHUNK_BITS;
/// Key bytes an entry holds inline.
pub(super) const INLINE_KEY: usize = 13;
/// Length byte of an entry whose key is in the arena's long keys.
pub(super) const LONG_KEY: u8 = 0xFF;
/// Length byte of an unused entry.
pub(super) const FREE: u8 = 0xFE;

/// Bits of a packed version's ts (all a [`Ts`] uses).
pub(super) const TS_BITS: u32 = TS_BITS_MASK.count_ones();
const _: () = assert!(TS_BITS_MASK == (1 << TS_BITS) - 1);
/// A packed version's row id: all ones is a tombstone, so row ids are
/// below it ([`RowId::LIMIT`]).
pub(super) const PACKED_TOMBSTONE: u64 = (1 << (112 - TS_BITS)) - 1;
const _: () = assert!(RowId::LIMIT == PACKED_TOMBSTONE);

impl Version {
    /// Whether the version packs into an entry (a ts of at most 52 bits, a
    /// row id below [`RowId::LIMIT`] or a tombstone).
    pub(super) fn fits(self) -> bool {
        self.ts <= TS_BITS_MASK && (self.row == TOMBSTONE || self.row < PACKED_TOMBSTONE)
    }
}

/// A [`Version`] in 14 bytes (LE): the ts in the low 52 bits, the row id
/// in the 60 above ([`PACKED_TOMBSTONE`] for a tombstone).
#[derive(Clone, Copy)]
pub(super) struct PackedVersion([u8; 14]);

impl PackedVersion {
    /// `v` packed; `None` when it does not fit ([`Version::fits`]).
    #[inline]
    pub(super) fn new(v: Version) -> Option<Self> {
        if !v.fits() {
            return None;
        }
        let row = if v.row == TOMBSTONE { PACKED_TOMBSTONE } else { v.row };
        let bits = u128::from(v.ts) | (u128::from(row) << TS_BITS);
        let mut packed = [0; 14];
        packed.copy_from_slice(&bits.to_le_bytes()[..14]);
        Some(PackedVersion(packed))
    }

    #[inline]
    pub(super) fn get(self) -> Version {
        let mut bytes = [0; 16];
        bytes[..14].copy_from_slice(&self.0);
        let bits = u128::from_le_bytes(bytes);
        let row = (bits >> TS_BITS) as u64;
        Version { ts: bits as u64 & TS_BITS_MASK, row: if row == PACKED_TOMBSTONE { TOMBSTONE } else { row } }
    }
}

/// A key and its newest version: 28 bytes, byte-aligned.
#[derive(Clone, Copy)]
pub(super) struct Entry {
    /// The key inline, its length in the last byte; or [`LONG_KEY`] there
    /// and the index of the key in [`Arena::long_keys`] in the first four
    /// bytes (LE); or [`FREE`].
    pub(super) key: [u8; INLINE_KEY + 1],
    pub(super) newest: PackedVersion,
}

// The entry size the module docs give.
const _: () = assert!(std::mem::size_of::<Entry>() == 28);

impl Entry {
    const FREE: Entry = {
        let mut key = [0; INLINE_KEY + 1];
        key[INLINE_KEY] = FREE;
        Entry { key, newest: PackedVersion([0; 14]) }
    };

    pub(super) fn is_used(&self) -> bool {
        self.key[INLINE_KEY] != FREE
    }

    #[inline]
    pub(super) fn newest(&self) -> Version {
        self.newest.get()
    }
}

/// The index's entries, in chunks (no growth by copying, at most one
/// chunk of slack), with a free list of entries memory GC emptied.
#[derive(Default)]
pub(super) struct Arena {
    pub(super) chunks: Vec<Box<[Entry]>>,
    /// Entries handed out so far (used or free).
    pub(super) next: u32,
    pub(super) free: Vec<u32>,
    /// Keys longer than [`INLINE_KEY`] bytes; an emptied one is free.
    pub(super) long_keys: Vec<Box<[u8]>>,
    pub(super) free_long: Vec<u32>,
    /// Bytes of the long keys (kept, so memory is reported without a walk).
    pub(super) long_bytes: usize,
}

impl Arena {
    #[inline]
    pub(super) fn entry(&self, i: u32) -> &Entry {
        &self.chunks[(i >> CHUNK_BITS) as usize][i as usize & (CHUNK - 1)]
    }

    #[inline]
    pub(super) fn entry_mut(&mut self, i: u32) -> &mut Entry {
        &mut self.chunks[(i >> CHUNK_BITS) as usize][i as usize & (CHUNK - 1)]
    }

    #[inline]
    pub(super) fn key_of<'a>(&'a self, e: &'a Entry) -> &'a [u8] {
        match e.key[INLINE_KEY] {
            LONG_KEY => {
                let at = u32::from_le_bytes([e.key[0], e.key[1], e.key[2], e.key[3]]);
                &self.long_keys[at as usize]
            }
            len => &e.key[..len as usize],
        }
    }

    #[inline]
    pub(super) fn key(&self, i: u32) -> &[u8] {
        self.key_of(self.entry(i))
    }

    /// A new entry for `key` with `newest`.
    pub(super) fn alloc(&mut self, key: &[u8], newest: PackedVersion) -> u32 {
        let mut slot = [0u8; INLINE_KEY + 1];
        if key.len() <= INLINE_KEY {
            slot[..key.len()].copy_from_slice(key);
            slot[INLINE_KEY] = key.len() as u8;
        } else {
            self.long_bytes += key.len();
            let at = match self.free_long.pop() {
                Some(at) => {
                    self.long_keys[at as usize] = key.into();
                    at
                }
                None => {
                    self.long_keys.push(key.into());
                    (self.long_keys.len() - 1) as u32
                }
            };
            slot[..4].copy_from_slice(&at.to_le_bytes());
            slot[INLINE_KEY] = LONG_KEY;
        }
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.next;
                if i as usize == self.chunks.len() * CHUNK {
                    self.chunks.push(vec![Entry::FREE; CHUNK].into_boxed_slice());
                }
                self.next += 1;
                i
            }
        };
        *self.entry_mut(i) = Entry { key: slot, newest };
        i
    }

    /// Frees entry `i` (and its long key).
    pub(super) fn release(&mut self, i: u32) {
        let e = *self.entry(i);
        if e.key[INLINE_KEY] == LONG_KEY {
            let at = u32::from_le_bytes([e.key[0], e.key[1], e.key[2], e.key[3]]);
            self.long_bytes -= self.long_keys[at as usize].len();
            self.long_keys[at as usize] = Box::default();
            self.free_long.push(at);
        }
        *self.entry_mut(i) = Entry::FREE;
        self.free.push(i);
    }

    /// Every used entry with its number.
    pub(super) fn used(&self) -> impl Iterator<Item = (u32, &Entry)> + '_ {
        self.chunks
            .iter()
            .enumerate()
            .flat_map(|(c, chunk)| chunk.iter().enumerate().map(move |(j, e)| (((c << CHUNK_BITS) | j) as u32, e)))
            .filter(|(_, e)| e.is_used())
    }

    pub(super) fn memory_bytes(&self) -> usize {
        self.chunks.len() * CHUNK * std::mem::size_of::<Entry>()
            + self.free.capacity() * 4
            + self.long_keys.capacity() * std::mem::size_of::<Box<[u8]>>()
            + self.long_bytes
            + self.free_long.capacity() * 4
    }
}

/// `v` packed into an entry, or an error if it does not fit.
#[inline]
pub(super) fn pack(v: Version) -> Result<PackedVersion> {
    PackedVersion::new(v).ok_or_else(|| {
        Error::invariant(format!("index version at ts{} of row {} is beyond the ts or row-id range", v.ts, v.row))
    })
}
