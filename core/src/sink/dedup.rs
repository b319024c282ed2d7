//! The dedup window: identities of the source transactions applied
//! lately (and of every snapshot run), so a redelivered one is skipped.

use std::collections::VecDeque;

use crate::catalog::SNAPSHOT_IDENTITY_PREFIX;
use crate::cdc::SourcePosition;
use crate::replay::Op;
use std::hash::Hasher;
use twox_hash::XxHash64;

use super::*;

/// Records of a snapshot run that make up its identity (fewer when the run
/// is shorter). The run's first chunk waits until they have arrived.
pub const SNAPSHOT_IDENTITY_ROWS: u64 = 4096;

/// One table's records in a snapshot run: their identity digest and
/// what became of them.
pub(super) struct Segment {
    pub(super) table: String,
    /// No longer fed once the segment is settled.
    pub(super) digest: XxHash64,
    pub(super) rows: u64,
    pub(super) state: SegmentState,
}

impl Segment {
    /// `snapshot:<digest>:<table>` (final once the segment is settled).
    pub(super) fn identity(&self) -> String {
        format!("{SNAPSHOT_IDENTITY_PREFIX}{:016x}:{}", self.digest.finish(), self.table)
    }
}

pub(super) enum SegmentState {
    /// Digesting: the operations wait here.
    Pending(Vec<(Op, SourcePosition)>),
    /// New: its operations go with the transaction.
    Applied,
    /// Already applied by an earlier run: its records are dropped.
    Skipped,
}

/// The identities a sink dedups against: the newest `capacity` source
/// transactions and every snapshot run. Each is kept as its 128-bit
/// XXH3: the default window of 2²⁰ takes about 52 MB (set and order),
/// against about 140 MB as two `String`s an identity. Two identities
/// sharing a hash — which would skip a transaction — is a chance of about
/// n²/2¹²⁹, 10⁻²⁷ for a million.
pub(super) struct AppliedWindow {
    pub(super) capacity: usize,
    pub(super) set: hashbrown::HashSet<u128, foldhash::fast::FixedState>,
    /// The source transactions in the set, oldest first.
    pub(super) order: VecDeque<u128>,
}

/// What the window keeps of an identity.
pub(super) fn identity_hash(id: &str) -> u128 {
    twox_hash::XxHash3_128::oneshot(id.as_bytes())
}

impl AppliedWindow {
    pub(super) fn new(capacity: usize) -> Self {
        AppliedWindow {
            capacity: capacity.max(1),
            set: hashbrown::HashSet::with_hasher(foldhash::fast::FixedState::with_seed(0xd3d0_0b5e)),
            order: VecDeque::new(),
        }
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.set.contains(&identity_hash(id))
    }

    /// Remembers a history entry's identity: a snapshot run's names each
    /// of its tables' identities.
    pub(super) fn insert_entry(&mut self, entry: &str) {
        for id in entry.split(SEGMENT_SEPARATOR) {
            self.insert(id);
        }
    }

    pub(super) fn insert(&mut self, id: &str) {
        let hash = identity_hash(id);
        if id.starts_with(SNAPSHOT_IDENTITY_PREFIX) {
            self.set.insert(hash);
            return;
        }
        if self.set.insert(hash) {
            self.order.push_back(hash);
            if self.order.len() > self.capacity
                && let Some(old) = self.order.pop_front()
            {
                self.set.remove(&old);
            }
        }
    }
}
