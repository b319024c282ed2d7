//! Timestamps and watermarks: the whole concurrency control of fovea.
//!
//! ```text
//!            LWM                 HWM        next
//!   ─────────┼────────────────────┼──────────┼──────────▶ ts
//!   GC folds │  queries read at   │ replay   │ not yet
//!   below    │  qts ∈ [LWM, HWM)  │ writes   │ begun
//! ```
//!
//! * [`Clock::begin`] hands out timestamps from one monotonic allocator. The
//!   allocator is persisted in ranges through a [`TxnStore`], not per
//!   transaction.
//! * [`Clock::commit`] may arrive out of order; HWM advances only over the
//!   contiguous committed prefix, so every ts below HWM is fully replayed.
//! * [`Clock::snapshot`] registers a query at `qts = HWM − 1`; dropping the
//!   last clone of the [`Snapshot`] ends it. LWM is the oldest live snapshot
//!   (HWM − 1 when none) and never moves backwards.
//!
//! No conflicts are ever checked: replay runs at or above HWM, queries below
//! it, garbage collection below LWM.

mod store;

pub use store::open_durable_sqlite;
pub use store::{Lease, MemoryTxnStore, PersistedClock, ReaderLease, SqliteTxnStore, TxnStore, conformance, may_grant};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fovea_types::error::{Error, Result};
use fovea_types::ids::Ts;

/// How many timestamps are reserved in the [`TxnStore`] at a time.
pub const DEFAULT_TS_RESERVATION: u64 = 1 << 20;

/// The poison-tolerant lock every part of the engine takes.
pub use fovea_types::sync::lock;

/// The timestamp allocator, the watermarks and the registry of live queries.
pub struct Clock {
    /// Next timestamp `begin` hands out.
    next: AtomicU64,
    /// Every ts below is durably reserved in the store.
    reserved: AtomicU64,
    reservation: u64,
    store: Arc<dyn TxnStore>,
    /// Epoch of the lease this clock writes under (0: unleased).
    epoch: AtomicU64,
    reserve_lock: Mutex<()>,
    commits: Mutex<CommitState>,
    /// Mirror of `commits.hwm` for lock-free readers.
    hwm: AtomicU64,
    registry: Arc<Registry>,
}

struct CommitState {
    hwm: u64,
    /// Committed timestamps above `hwm` waiting for the gap to close.
    ahead: BTreeSet<u64>,
    /// Since when `hwm` has stood below a committed ts (`ahead` non-empty
    /// and `hwm` unmoved): see [`Clock::stall`].
    held_since: Option<std::time::Instant>,
}

/// HWM held at an uncommitted ts while later transactions have committed
/// (see [`Clock::stall`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stall {
    /// The ts HWM waits for: begun, not committed.
    pub waiting_for: Ts,
    /// Transactions committed above it, invisible until it commits.
    pub committed_after: usize,
    /// The newest of them.
    pub newest_committed: Ts,
    /// How long HWM has stood at `waiting_for` with those behind it.
    pub held_for: std::time::Duration,
}

impl Clock {
    /// Opens the clock from its store. Every timestamp below the persisted
    /// reservation is treated as finished: either it was committed and is
    /// covered by the checkpoint being recovered, or it was lost with the
    /// process and its transaction will be replayed from the input under a
    /// new timestamp.
    pub fn open(store: Arc<dyn TxnStore>) -> Result<Arc<Clock>> {
        Self::open_with_reservation(store, DEFAULT_TS_RESERVATION)
    }

    /// [`Clock::open`] with a custom reservation size (tests use small ones).
    pub fn open_with_reservation(store: Arc<dyn TxnStore>, reservation: u64) -> Result<Arc<Clock>> {
        let persisted = store.load()?;
        let start = persisted.reserved.get().max(persisted.hwm.get()).max(1);
        Ok(Arc::new(Clock {
            next: AtomicU64::new(start),
            reserved: AtomicU64::new(persisted.reserved.get()),
            reservation: reservation.max(1),
            store,
            epoch: AtomicU64::new(0),
            reserve_lock: Mutex::new(()),
            commits: Mutex::new(CommitState { hwm: start, ahead: BTreeSet::new(), held_since: None }),
            hwm: AtomicU64::new(start),
            registry: Arc::new(Registry {
                inner: Mutex::new(RegistryInner { live: BTreeMap::new(), next_seq: 1, published_lwm: start - 1 }),
                lwm: AtomicU64::new(start - 1),
            }),
        }))
    }

    /// An in-memory clock (tests, benches).
    pub fn in_memory() -> Arc<Clock> {
        Self::open(Arc::new(MemoryTxnStore::default()))
            .unwrap_or_else(|e| unreachable!("the in-memory store cannot fail: {e}"))
    }

    /// Starts a mirror transaction: the next timestamp.
    #[inline]
    pub fn begin(&self) -> Result<Ts> {
        // Relaxed: uniqueness comes from the RMW itself; ordering with the
        // data a transaction writes is established by `commit`.
        let ts = self.next.fetch_add(1, Ordering::Relaxed);
        if ts > Ts::MAX.get() {
            return Err(Error::TsExhausted(Ts(ts)));
        }
        // Acquire: pairs with the Release below so a reservation seen here
        // is durable.
        if ts >= self.reserved.load(Ordering::Acquire) {
            self.reserve_through(ts)?;
        }
        Ok(Ts(ts))
    }

    #[cold]
    fn reserve_through(&self, ts: u64) -> Result<()> {
        let _guard = lock(&self.reserve_lock);
        let mut reserved = self.reserved.load(Ordering::Acquire);
        while reserved <= ts {
            let upto = (reserved.max(ts + 1) + self.reservation).min(Ts::MAX.get() + 1);
            // From the value this clock persisted last: a writer that lost
            // the lake (another reserved since) is refused.
            self.store.reserve(self.epoch(), Ts(reserved), Ts(upto))?;
            reserved = upto;
            // Release: a `begin` that sees this value sees a durable reservation.
            self.reserved.store(reserved, Ordering::Release);
        }
        Ok(())
    }

    /// Marks `ts` as fully replayed. May arrive out of order; HWM advances
    /// over the contiguous prefix only.
    pub fn commit(&self, ts: Ts) -> Result<()> {
        let t = ts.get();
        // Relaxed: a ts that `begin` returned is below `next` in any order.
        if t >= self.next.load(Ordering::Relaxed) {
            return Err(Error::BadCommit { ts, reason: "not begun" });
        }
        let mut c = lock(&self.commits);
        if t < c.hwm || !c.ahead.insert(t) {
            return Err(Error::BadCommit { ts, reason: "already committed" });
        }
        if t == c.hwm {
            let mut h = c.hwm;
            while c.ahead.remove(&h) {
                h += 1;
            }
            c.hwm = h;
            // Release: a reader that sees the new HWM sees every write of the
            // transactions below it (they happened before their commit).
            self.hwm.store(h, Ordering::Release);
            // Held again at the new HWM if commits wait above it: from now.
            c.held_since = if c.ahead.is_empty() { None } else { Some(std::time::Instant::now()) };
        } else if c.held_since.is_none() {
            c.held_since = Some(std::time::Instant::now());
        }
        Ok(())
    }

    /// HWM held at a ts begun and not committed while transactions above it
    /// have committed (they stay invisible until it commits), with how long
    /// it has been so; `None` while HWM can pass every committed ts. Shard
    /// workers finishing out of order hold HWM for moments; a ts held for
    /// longer than replay takes is one nothing will commit — a replica that
    /// stopped advancing, which must not look healthy.
    pub fn stall(&self) -> Option<Stall> {
        let c = lock(&self.commits);
        let since = c.held_since?;
        let newest = *c.ahead.last()?;
        Some(Stall {
            waiting_for: Ts(c.hwm),
            committed_after: c.ahead.len(),
            newest_committed: Ts(newest),
            held_for: since.elapsed(),
        })
    }

    /// Ends a transaction that wrote nothing (or whose writes were undone):
    /// HWM may pass it.
    pub fn abort(&self, ts: Ts) -> Result<()> {
        self.commit(ts)
    }

    /// High watermark: every ts below it is fully replayed.
    #[inline]
    pub fn hwm(&self) -> Ts {
        // Acquire: pairs with the Release in `commit`.
        Ts(self.hwm.load(Ordering::Acquire))
    }

    /// The newest snapshot a query can read now (HWM − 1).
    pub fn latest(&self) -> Ts {
        Ts(self.hwm().get() - 1)
    }

    /// Low watermark: every query below it has finished. Monotonic.
    pub fn lwm(&self) -> Ts {
        self.registry.compute_lwm(self.hwm())
    }

    /// Registers a query at `qts = HWM − 1`.
    pub fn snapshot(&self) -> Snapshot {
        let mut reg = lock(&self.registry.inner);
        // Read HWM under the registry lock: an LWM computed concurrently is
        // either computed before (≤ this qts) or sees this registration.
        let qts = self.latest();
        reg.register(&self.registry, qts)
    }

    /// Registers the writer of the one open transaction `ts`, every
    /// transaction below which is committed (`ts` is HWM), at `qts = ts`:
    /// its reads see the writes it has applied so far, as a transaction
    /// sees its own. Not for queries: those writes may still grow, and are
    /// no one else's to see before `ts` commits. Fails when `ts` is not HWM
    /// or was not begun.
    pub fn snapshot_of_open(&self, ts: Ts) -> Result<Snapshot> {
        let mut reg = lock(&self.registry.inner);
        let hwm = self.hwm();
        // Relaxed: `ts` came from this thread's own `begin`.
        if ts != hwm || ts.get() >= self.next.load(Ordering::Relaxed) {
            return Err(Error::SnapshotUnavailable {
                requested: ts,
                reason: format!("not the one open transaction (HWM is {hwm})"),
            });
        }
        Ok(reg.register(&self.registry, ts))
    }

    /// Registers a query at an explicit past `ts` (time travel). Fails when
    /// `ts` is below LWM (garbage collected) or not yet replayed.
    pub fn snapshot_at(&self, ts: Ts) -> Result<Snapshot> {
        let mut reg = lock(&self.registry.inner);
        let latest = self.latest();
        if ts > latest {
            return Err(Error::SnapshotUnavailable {
                requested: ts,
                reason: format!("the newest replayed ts is {latest}"),
            });
        }
        if ts.get() < reg.published_lwm {
            return Err(Error::SnapshotUnavailable {
                requested: ts,
                reason: format!(
                    "versions below ts {} are garbage collected; the oldest available ts is {}",
                    reg.published_lwm, reg.published_lwm
                ),
            });
        }
        Ok(reg.register(&self.registry, ts))
    }

    /// Registration sequence number the next snapshot will get; used to
    /// retire replaced files "by snapshot": an object replaced at sequence
    /// `s` may be deleted once [`Clock::oldest_registration`] is above `s`.
    pub fn registration_seq(&self) -> u64 {
        lock(&self.registry.inner).next_seq
    }

    /// Sequence of the oldest live snapshot, or the next sequence when none.
    pub fn oldest_registration(&self) -> u64 {
        let reg = lock(&self.registry.inner);
        reg.live.keys().next().copied().unwrap_or(reg.next_seq)
    }

    /// Number of live snapshots.
    pub fn live_snapshots(&self) -> usize {
        lock(&self.registry.inner).live.len()
    }

    /// Persists HWM and LWM (monotonically) in the store.
    pub fn persist_watermarks(&self) -> Result<()> {
        let lwm = self.lwm();
        self.store.save_watermarks(self.epoch(), self.hwm(), lwm)
    }

    /// Writes from now on under lease `epoch` (see [`TxnStore`]'s fencing).
    pub fn set_epoch(&self, epoch: u64) {
        // Relaxed: read by the same threads that write through the store,
        // which orders the calls itself.
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    /// The lease epoch this clock writes under (0: unleased).
    pub fn epoch(&self) -> u64 {
        // Relaxed: see `set_epoch`.
        self.epoch.load(Ordering::Relaxed)
    }

    /// The store behind this clock.
    pub fn store(&self) -> &Arc<dyn TxnStore> {
        &self.store
    }
}

struct Registry {
    inner: Mutex<RegistryInner>,
    /// Last published LWM, for lock-free readers.
    lwm: AtomicU64,
}

struct RegistryInner {
    /// Live snapshots by registration sequence.
    live: BTreeMap<u64, Ts>,
    next_seq: u64,
    published_lwm: u64,
}

impl RegistryInner {
    fn register(&mut self, registry: &Arc<Registry>, qts: Ts) -> Snapshot {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.live.insert(seq, qts);
        Snapshot(Arc::new(SnapshotInner { qts, seq, registry: Arc::clone(registry) }))
    }
}

impl Registry {
    fn compute_lwm(&self, hwm: Ts) -> Ts {
        let mut reg = lock(&self.inner);
        // Never above the newest readable ts: a writer's snapshot of its
        // open transaction (`Clock::snapshot_of_open`) is at HWM itself.
        let newest = Ts(hwm.get() - 1);
        let oldest = reg.live.values().min().copied().unwrap_or(newest).min(newest);
        let lwm = oldest.get().max(reg.published_lwm);
        reg.published_lwm = lwm;
        // Release: pairs with Acquire in `Registry::published`.
        self.lwm.store(lwm, Ordering::Release);
        Ts(lwm)
    }
}

struct SnapshotInner {
    qts: Ts,
    seq: u64,
    registry: Arc<Registry>,
}

impl Drop for SnapshotInner {
    fn drop(&mut self) {
        lock(&self.registry.inner).live.remove(&self.seq);
    }
}

/// A registered query snapshot. Cheap to clone; the query ends when the
/// last clone is dropped, and until then LWM cannot pass `qts`.
#[derive(Clone)]
pub struct Snapshot(Arc<SnapshotInner>);

impl Snapshot {
    /// The snapshot timestamp: the query sees exactly the transactions with
    /// `ts ≤ qts`.
    #[inline]
    pub fn qts(&self) -> Ts {
        self.0.qts
    }

    /// The registration sequence number.
    pub fn seq(&self) -> u64 {
        self.0.seq
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot").field("qts", &self.0.qts).field("seq", &self.0.seq).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hwm_advances_over_contiguous_prefix_only() {
        let c = Clock::in_memory();
        let a = c.begin().unwrap();
        let b = c.begin().unwrap();
        let d = c.begin().unwrap();
        assert_eq!(c.latest(), Ts(0));
        c.commit(d).unwrap();
        c.commit(b).unwrap();
        assert_eq!(c.hwm(), a, "gap at a holds HWM");
        c.commit(a).unwrap();
        assert_eq!(c.latest(), d);
        assert!(c.commit(a).is_err());
        assert!(c.commit(Ts(1000)).is_err());
    }

    /// A stall is HWM held at an uncommitted ts with commits above it: it
    /// names that ts, counts the commits it hides, and its age starts over
    /// whenever HWM moves and is held again.
    #[test]
    fn a_stall_names_the_ts_hwm_waits_for() {
        let c = Clock::in_memory();
        let a = c.begin().unwrap();
        assert_eq!(c.stall(), None, "open, nothing committed above it");
        let b = c.begin().unwrap();
        let d = c.begin().unwrap();
        c.commit(b).unwrap();
        let s = c.stall().expect("b committed above a");
        assert_eq!((s.waiting_for, s.committed_after, s.newest_committed), (a, 1, b));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let e = c.begin().unwrap();
        c.commit(e).unwrap();
        let s = c.stall().unwrap();
        assert_eq!((s.waiting_for, s.committed_after, s.newest_committed), (a, 2, e));
        assert!(s.held_for >= std::time::Duration::from_millis(20), "held since b's commit: {s:?}");
        c.commit(a).unwrap();
        let s = c.stall().expect("HWM moved to d, e waits above it");
        assert_eq!((s.waiting_for, s.committed_after), (d, 1));
        assert!(s.held_for < std::time::Duration::from_millis(20), "held again from a's commit: {s:?}");
        c.commit(d).unwrap();
        assert_eq!(c.stall(), None);
        assert_eq!(c.hwm().get(), e.get() + 1);
    }

    /// Only the one open transaction above every committed one gets a
    /// writer's snapshot, at its own ts; it holds LWM like any snapshot.
    #[test]
    fn the_open_transaction_alone_reads_at_its_own_ts() {
        let c = Clock::in_memory();
        let a = c.begin().unwrap();
        c.commit(a).unwrap();
        assert!(c.snapshot_of_open(a).is_err(), "committed");
        let b = c.begin().unwrap();
        let own = c.snapshot_of_open(b).unwrap();
        assert_eq!(own.qts(), b);
        assert!(c.snapshot_of_open(Ts(b.get() + 1)).is_err(), "not begun");
        let d = c.begin().unwrap();
        assert!(c.snapshot_of_open(d).is_err(), "b below it is open");
        c.commit(b).unwrap();
        c.commit(d).unwrap();
        assert_eq!(c.lwm(), b, "the writer's snapshot holds LWM at its ts");
        drop(own);
        assert_eq!(c.lwm(), d);
        // Alone, it leaves LWM at the newest readable ts, not above.
        let e = c.begin().unwrap();
        let own = c.snapshot_of_open(e).unwrap();
        assert_eq!(c.lwm(), d);
        assert!(c.snapshot_at(d).is_ok(), "the newest ts stays readable");
        drop(own);
    }

    #[test]
    fn lwm_is_oldest_live_snapshot_and_monotonic() {
        let c = Clock::in_memory();
        let t1 = c.begin().unwrap();
        c.commit(t1).unwrap();
        let s1 = c.snapshot();
        assert_eq!(s1.qts(), t1);
        let t2 = c.begin().unwrap();
        c.commit(t2).unwrap();
        let s2 = c.snapshot();
        assert_eq!(c.lwm(), t1);
        let s1b = s1.clone();
        drop(s1);
        assert_eq!(c.lwm(), t1, "a clone keeps the query alive");
        drop(s1b);
        assert_eq!(c.lwm(), t2);
        drop(s2);
        assert_eq!(c.lwm(), t2);
        let err = c.snapshot_at(t1).unwrap_err().to_string();
        assert!(err.contains("oldest available ts is 2"), "{err}");
        assert!(c.snapshot_at(Ts(99)).is_err());
    }

    #[test]
    fn reservation_survives_reopen() {
        let store: Arc<dyn TxnStore> = Arc::new(MemoryTxnStore::default());
        let c = Clock::open_with_reservation(Arc::clone(&store), 4).unwrap();
        let mut last = Ts(0);
        for _ in 0..10 {
            last = c.begin().unwrap();
            c.commit(last).unwrap();
        }
        drop(c);
        let c2 = Clock::open_with_reservation(store, 4).unwrap();
        let t = c2.begin().unwrap();
        assert!(t > last, "{t:?} must be above {last:?}");
        assert_eq!(c2.hwm(), t, "unused reserved timestamps do not block HWM");
    }
}
