//! Leases on a lake: the writer's (one replayer at a time), and readers'
//! registrations (a query on another host keeps what it reads).
//!
//! ```text
//!  acquire ─▶ granted (epoch e) ─▶ renew every ttl/3 ─▶ … ─▶ release on drop
//!     │ held by a live replayer: wait (log once), retry until it expires
//!     │ held by a dead process on this host: take over at once (naming e)
//!     ▼
//!  every write of the holder names e (TxnStore, catalog commits): after a
//!  take-over (epoch e+1) nothing the old holder writes lands — it is fenced
//!  and stops with [`Error::Fenced`] when it notices (renewal or a write).
//! ```
//!
//! Expiry is judged by wall clocks, so the hosts of two replayers must agree
//! on the time within a fraction of the lease time; correctness never rests
//! on it, only on the epoch.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::catalog::now_us;
use crate::error::{Error, Result};
use crate::mvcc::{TxnStore, lock};

/// Default lease time: a replayer that stops renewing is taken over this
/// long after its last renewal.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15);

/// This process as a lease owner: `host/pid/start time`, so a replayer
/// restarted on the same host can tell its dead predecessor from a live one.
pub fn owner_id() -> String {
    let pid = std::process::id();
    format!("{}/{pid}/{}", host_name(), process_start(pid).unwrap_or_default())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// The start time of process `pid` (clock ticks since boot), when known.
fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22; the command name (field 2) may hold spaces, so count from
    // the closing parenthesis.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19).map(str::to_owned)
}

/// Whether `owner` names a process of this host that no longer runs. An
/// owner of another host, or one that cannot be checked, counts as alive.
fn is_dead_local(owner: &str) -> bool {
    let mut parts = owner.split('/');
    let (Some(host), Some(pid), Some(start)) = (parts.next(), parts.next(), parts.next()) else { return false };
    if host != host_name() || start.is_empty() {
        return false;
    }
    let Ok(pid) = pid.parse::<u32>() else { return false };
    process_start(pid).as_deref() != Some(start)
}

/// A thread that calls its tick every `period` until the tick says stop or
/// the `Renewal` is dropped (which wakes it and waits for it).
struct Renewal {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Renewal {
    fn spawn(name: &str, period: Duration, mut tick: impl FnMut() -> bool + Send + 'static) -> Result<Self> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new().name(name.into()).spawn(move || {
                let (flag, wake) = &*stop;
                loop {
                    let mut stopped = lock(flag);
                    // A drop before this thread first waits set the flag
                    // already: waiting a whole period would delay it.
                    if !*stopped {
                        stopped = wake.wait_timeout(stopped, period).unwrap_or_else(|p| p.into_inner()).0;
                    }
                    if *stopped {
                        return;
                    }
                    // The tick makes requests: not under the lock, so a
                    // drop never waits for one to set the flag.
                    drop(stopped);
                    if !tick() {
                        return;
                    }
                }
            })?
        };
        Ok(Renewal { stop, thread: Some(thread) })
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        *lock(&self.stop.0) = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Holds a lake's lease: renews it on a thread, releases it on drop.
pub struct LeaseKeeper {
    store: Arc<dyn TxnStore>,
    epoch: u64,
    /// The epoch that fenced this holder (0 while it holds the lease).
    fenced_by: Arc<AtomicU64>,
    /// Until when the lease holds by this process's clock: the start of the
    /// last successful renewal (or the grant) plus the lease time. Past it,
    /// another replayer may take over: this one stops writing for good.
    valid_until_us: Arc<AtomicI64>,
    renewal: Option<Renewal>,
}

impl LeaseKeeper {
    /// Acquires the lease of `store` for `ttl`, waiting while a live
    /// replayer holds it (logged once) and taking over at once from a dead
    /// process of this host.
    pub fn acquire(store: Arc<dyn TxnStore>, ttl: Duration) -> Result<Self> {
        let owner = owner_id();
        let ttl_us = ttl.as_micros() as i64;
        let mut logged = false;
        let lease = loop {
            let take_over = match store.lease()? {
                Some(l) if l.expires_us > now_us() && is_dead_local(&l.owner) => Some(l.epoch),
                _ => None,
            };
            match store.acquire_lease(&owner, ttl_us, now_us(), take_over) {
                Ok(lease) => break lease,
                Err(Error::LeaseHeld { owner: holder, epoch, remaining_ms }) => {
                    if !logged {
                        tracing::warn!(
                            holder,
                            epoch,
                            remaining_ms,
                            "waiting for the lake's lease: another replayer holds it; taking over when it expires"
                        );
                        logged = true;
                    }
                    std::thread::sleep(Duration::from_millis(remaining_ms.clamp(10, 500) as u64));
                }
                Err(e) => return Err(e),
            }
        };
        if logged {
            tracing::warn!(epoch = lease.epoch, "took over the lake's lease");
        }
        let epoch = lease.epoch;
        let fenced_by = Arc::new(AtomicU64::new(0));
        let valid_until_us = Arc::new(AtomicI64::new(lease.expires_us));
        let renewal = {
            let (store, fenced_by, valid_until_us) =
                (Arc::clone(&store), Arc::clone(&fenced_by), Arc::clone(&valid_until_us));
            Renewal::spawn("fovea-lease", ttl / 3, move || {
                // The lease runs from the request's start: an answer that
                // comes late never extends it past what the store granted.
                let asked = now_us();
                match store.renew_lease(epoch, ttl_us, asked) {
                    Ok(_) => {
                        // Relaxed: see `check`; a later renewal's value is
                        // never smaller (`fetch_max`).
                        valid_until_us.fetch_max(asked + ttl_us, Ordering::Relaxed);
                        true
                    }
                    Err(Error::Fenced { current, .. }) => {
                        tracing::error!(epoch, current, "lost the lake's lease: another replayer took over");
                        // Relaxed: see `check`.
                        fenced_by.store(current.max(1), Ordering::Relaxed);
                        false
                    }
                    // Expired meanwhile: renewing no longer helps (another
                    // replayer may have taken over); `check` stops the writer.
                    Err(e) if now_us() >= valid_until_us.load(Ordering::Relaxed) => {
                        tracing::error!(epoch, error = %e, "the lake's lease expired without a successful renewal: stopping");
                        false
                    }
                    // A transient failure: the next period tries again (the
                    // lease lasts three of them).
                    Err(e) => {
                        tracing::warn!(error = %e, "renewing the lake's lease failed; retrying");
                        true
                    }
                }
            })?
        };
        Ok(LeaseKeeper { store, epoch, fenced_by, valid_until_us, renewal: Some(renewal) })
    }

    /// The epoch every write of this holder names.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// [`Error::Fenced`] once another replayer took the lease over;
    /// [`Error::LeaseExpired`] once the lease's time passed without a
    /// successful renewal (a stalled or unreachable state store), for good.
    pub fn check(&self) -> Result<()> {
        // Relaxed: flags; the store's own checks are what fence writes.
        match self.fenced_by.load(Ordering::Relaxed) {
            0 => {}
            current => return Err(Error::Fenced { epoch: self.epoch, current }),
        }
        let late_us = now_us() - self.valid_until_us.load(Ordering::Relaxed);
        if late_us >= 0 {
            return Err(Error::LeaseExpired { epoch: self.epoch, late_ms: late_us / 1000 });
        }
        Ok(())
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        // No renewal after the release.
        drop(self.renewal.take());
        // Relaxed: see `check`. Released only while no one took it over.
        if self.fenced_by.load(Ordering::Relaxed) == 0
            && let Err(e) = self.store.release_lease(self.epoch)
        {
            tracing::warn!(error = %e, "releasing the lake's lease failed (the next replayer waits for it to expire)");
        }
    }
}

/// A reader's registration: the snapshot it reads, renewed on a thread
/// until dropped, so the writer keeps the objects of that snapshot (and a
/// reader that dies stops holding them once the registration lapses).
pub struct ReaderRegistration {
    shared: Arc<ReaderShared>,
    renewal: Option<Renewal>,
}

struct ReaderShared {
    store: Arc<dyn TxnStore>,
    id: String,
    qts: AtomicU64,
    ttl: Duration,
}

impl ReaderShared {
    fn register(&self) -> Result<()> {
        // Relaxed: the value itself is the message.
        let qts = crate::Ts(self.qts.load(Ordering::Relaxed));
        self.store.register_reader(&self.id, qts, now_us() + self.ttl.as_micros() as i64)
    }
}

impl ReaderRegistration {
    /// Registers this process as a reader of `store`'s lake at snapshot 0
    /// (keeping everything) until [`Self::set_qts`] names what it reads.
    pub fn register(store: Arc<dyn TxnStore>, ttl: Duration) -> Result<Self> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        // Relaxed: only uniqueness matters.
        let id = format!("{}/{}", owner_id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let shared = Arc::new(ReaderShared { store, id, qts: AtomicU64::new(0), ttl });
        shared.register()?;
        let renewal = {
            let shared = Arc::clone(&shared);
            Renewal::spawn("fovea-reader", ttl / 3, move || {
                if let Err(e) = shared.register() {
                    tracing::warn!(error = %e, "renewing this reader's registration failed; retrying");
                }
                true
            })?
        };
        Ok(ReaderRegistration { shared, renewal: Some(renewal) })
    }

    /// Names the snapshot this reader reads from now on.
    pub fn set_qts(&self, qts: crate::Ts) -> Result<()> {
        // Relaxed: see `ReaderShared::register`.
        self.shared.qts.store(qts.get(), Ordering::Relaxed);
        self.shared.register()
    }
}

impl Drop for ReaderRegistration {
    fn drop(&mut self) {
        // No renewal after the deregistration.
        drop(self.renewal.take());
        if let Err(e) = self.shared.store.deregister_reader(&self.shared.id) {
            tracing::warn!(error = %e, "ending this reader's registration failed (it lapses by itself)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::MemoryTxnStore;

    #[test]
    fn a_dead_local_owner_is_taken_over_at_once_a_live_one_is_waited_for() {
        let store: Arc<dyn TxnStore> = Arc::new(MemoryTxnStore::default());
        // A process of this host that no longer runs (pid 0's start differs).
        let dead = format!("{}/999999999/1", host_name());
        store.acquire_lease(&dead, 60_000_000, now_us(), None).unwrap();
        let keeper = LeaseKeeper::acquire(Arc::clone(&store), Duration::from_secs(60)).unwrap();
        assert_eq!(keeper.epoch(), 2);
        keeper.check().unwrap();
        // This process is alive: a second keeper waits until the first is
        // released.
        let waiter = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || LeaseKeeper::acquire(store, Duration::from_secs(60)).map(|k| k.epoch()))
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished());
        drop(keeper);
        assert_eq!(waiter.join().unwrap().unwrap(), 3);
    }

    #[test]
    fn a_renewal_stops_at_once_when_dropped_however_long_its_period() {
        // Dropped before its thread first waits, and while it waits: both
        // stop at once (a failed open used to wait out a whole period).
        for pause in [Duration::ZERO, Duration::from_millis(50)] {
            let renewal = Renewal::spawn("test-renewal", Duration::from_secs(60), || true).unwrap();
            std::thread::sleep(pause);
            let began = std::time::Instant::now();
            drop(renewal);
            assert!(began.elapsed() < Duration::from_secs(1), "drop took {:?}", began.elapsed());
        }
        // A tick in progress does not hold up the drop's flag.
        let ticking = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&ticking);
        let renewal = Renewal::spawn("test-renewal", Duration::from_millis(1), move || {
            // Relaxed: a test counter.
            seen.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
            true
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(60));
        let began = std::time::Instant::now();
        drop(renewal);
        assert!(began.elapsed() < Duration::from_millis(500));
        assert!(ticking.load(Ordering::Relaxed) >= 1);
    }

    /// A state store that stops answering renewals.
    struct Unanswering(MemoryTxnStore);

    impl TxnStore for Unanswering {
        fn load(&self) -> Result<crate::mvcc::PersistedClock> {
            self.0.load()
        }
        fn lease(&self) -> Result<Option<crate::mvcc::Lease>> {
            self.0.lease()
        }
        fn acquire_lease(
            &self,
            owner: &str,
            ttl_us: i64,
            now: i64,
            take_over: Option<u64>,
        ) -> Result<crate::mvcc::Lease> {
            self.0.acquire_lease(owner, ttl_us, now, take_over)
        }
        fn renew_lease(&self, _: u64, _: i64, _: i64) -> Result<crate::mvcc::Lease> {
            std::thread::sleep(Duration::from_millis(30));
            Err(Error::Backend {
                backend: "test",
                operation: "renew".into(),
                key: "lease".into(),
                message: "timed out".into(),
            })
        }
        fn release_lease(&self, epoch: u64) -> Result<()> {
            self.0.release_lease(epoch)
        }
        fn reserve(&self, epoch: u64, from: crate::Ts, upto: crate::Ts) -> Result<()> {
            self.0.reserve(epoch, from, upto)
        }
        fn save_watermarks(&self, epoch: u64, hwm: crate::Ts, lwm: crate::Ts) -> Result<()> {
            self.0.save_watermarks(epoch, hwm, lwm)
        }
        fn register_reader(&self, id: &str, qts: crate::Ts, expires_us: i64) -> Result<()> {
            self.0.register_reader(id, qts, expires_us)
        }
        fn deregister_reader(&self, id: &str) -> Result<()> {
            self.0.deregister_reader(id)
        }
        fn readers(&self, now: i64) -> Result<Vec<crate::mvcc::ReaderLease>> {
            self.0.readers(now)
        }
        fn lake_id(&self) -> Result<Option<String>> {
            self.0.lake_id()
        }
        fn bind_lake(&self, id: &str) -> Result<String> {
            self.0.bind_lake(id)
        }
    }

    /// Renewals that fail without an answer: the holder stops once its
    /// lease's time has passed, for good (not only while the store is down),
    /// and not before.
    #[test]
    fn a_holder_whose_renewals_fail_stops_when_its_lease_expires() {
        let store: Arc<dyn TxnStore> = Arc::new(Unanswering(MemoryTxnStore::default()));
        let ttl = Duration::from_millis(400);
        let began = std::time::Instant::now();
        let keeper = LeaseKeeper::acquire(Arc::clone(&store), ttl).unwrap();
        keeper.check().unwrap();
        let deadline = began + Duration::from_secs(5);
        while keeper.check().is_ok() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(began.elapsed() >= ttl, "stopped before the lease's time: {:?}", began.elapsed());
        let err = keeper.check().unwrap_err();
        assert!(matches!(err, Error::LeaseExpired { epoch: 1, .. }), "{err}");
        assert!(err.to_string().contains("without a successful renewal"), "{err}");
    }

    #[test]
    fn a_holder_taken_over_is_fenced() {
        let store: Arc<dyn TxnStore> = Arc::new(MemoryTxnStore::default());
        // A lease long enough that a loaded machine renews it in time: the
        // holder must learn of the takeover at a renewal, not by expiry.
        let keeper = LeaseKeeper::acquire(Arc::clone(&store), Duration::from_millis(1500)).unwrap();
        // Another host takes over (as after this one paused past its lease).
        store.acquire_lease("other-host/1/1", 60_000_000, now_us(), Some(keeper.epoch())).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while keeper.check().is_ok() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let checked = keeper.check();
        assert!(matches!(checked, Err(Error::Fenced { epoch: 1, current: 2 })), "{checked:?}");
        assert!(matches!(store.reserve(1, crate::Ts(0), crate::Ts(5)), Err(Error::Fenced { .. })));
    }
}
