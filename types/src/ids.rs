//! Newtypes for every identifier that could be confused with another.

use std::fmt;

/// Mask of the timestamp bits actually used (DESIGN §5: 52 bits).
pub const TS_BITS_MASK: u64 = fovea_scan_wasm::TS_MASK;

/// A mirror-transaction timestamp. Only the low 52 bits are used, so a
/// timestamp packs into a delete entry next to a 12-bit tile offset.
///
/// `Ts(0)` is "before everything": the snapshot of an empty lake.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Ts(pub u64);

impl Ts {
    /// The state before any transaction.
    pub const ZERO: Ts = Ts(0);
    /// The largest usable timestamp.
    pub const MAX: Ts = Ts(TS_BITS_MASK);

    /// The raw value.
    #[inline]
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for Ts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ts{}", self.0)
    }
}

impl fmt::Display for Ts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// A row id: allocated per shard, increasing; the main index maps it to
    /// a file and an offset.
    RowId(u64),
    "row"
);
impl RowId {
    /// Row ids are below this (2^60 - 1): an index entry packs a row id in
    /// 60 bits beside a 52-bit timestamp, all ones meaning "deleted".
    pub const LIMIT: u64 = (1 << 60) - 1;
}

id_type!(
    /// A lake file id: assigned when a virtual file opens and kept when it
    /// becomes a regular file (so row locations are stable).
    FileId(u64),
    "file"
);
id_type!(
    /// A table id, stable for the life of the lake.
    TableId(u32),
    "table"
);
id_type!(
    /// A shard: owner of an index partition, its write buffers and their files.
    ShardId(u32),
    "shard"
);
