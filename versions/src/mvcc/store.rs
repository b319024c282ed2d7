//! Durable timestamps, watermarks and the writer's lease.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::lock;
use fovea_types::error::{Error, Result};
use fovea_types::ids::Ts;

/// What a [`TxnStore`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PersistedClock {
    /// Every timestamp below this one may have been handed out.
    pub reserved: Ts,
    /// Last persisted high watermark.
    pub hwm: Ts,
    /// Last persisted low watermark.
    pub lwm: Ts,
}

/// The lease on a lake's state: one replayer at a time writes a lake. Its
/// epoch grows with every grant and is the fencing token of every write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Who holds it (see `fovea_core::lease::owner_id`).
    pub owner: String,
    /// Fencing token: grows by one with every grant.
    pub epoch: u64,
    /// When it expires unless renewed, µs since the epoch (the holder's clock).
    pub expires_us: i64,
}

/// Durable home of the timestamp allocator, the watermarks and the writer's
/// lease.
///
/// Guarantees an implementation must give:
/// * **Durability**: when a call returns `Ok`, what it wrote survives a
///   crash of the process.
/// * **Atomicity**: each call changes all its values or none; a call that
///   fails changes nothing.
/// * **Reservations never overlap**: [`reserve`](TxnStore::reserve)`(e, from,
///   upto)` succeeds only if the persisted reservation is still `from` (a
///   compare-and-set), so no two callers are ever handed the same range,
///   whatever they race with. A stale `from` is [`Error::Regression`].
/// * **Monotonic watermarks**: HWM and LWM never move backwards; an attempt
///   is [`Error::Regression`].
/// * **Fencing**: once a lease has been granted, every write (`reserve`,
///   `save_watermarks`, `renew_lease`, `release_lease`) names the epoch of
///   its caller's lease and is refused with [`Error::Fenced`] unless that is
///   the current epoch; the check and the write are one atomic step. Epoch
///   0 writes are accepted only while no lease was ever granted (in-memory
///   engines, tests).
/// * **Leases**: [`acquire_lease`](TxnStore::acquire_lease) grants a new
///   epoch (current + 1) when no lease is held, when the held one expired
///   by the caller's clock, or when the caller names the current epoch in
///   `take_over` (it knows the holder is dead); otherwise it fails with
///   [`Error::LeaseHeld`]. Expiry is judged by clocks, so hosts' clocks must
///   agree within a fraction of the lease time; safety never depends on it
///   (the epoch fences a holder that outlived its lease).
///
/// * **Readers**: a query on another host registers the snapshot it reads
///   ([`register_reader`](TxnStore::register_reader)) with an expiry it
///   keeps renewing; [`readers`](TxnStore::readers) lists the unexpired
///   ones, so the writer keeps what they read, and a dead reader stops
///   holding anything back once its registration expires. Readers are not
///   fenced (they write nothing of the lake).
///
/// The embedded implementation is [`SqliteTxnStore`]; the AWS one uses
/// DynamoDB conditional writes with the same contract. Every implementation
/// passes `conformance::check` (this module's tests).
pub trait TxnStore: Send + Sync {
    /// Reads the persisted values (zeros for a new store).
    fn load(&self) -> Result<PersistedClock>;
    /// The lease as persisted (`None` if none was ever granted).
    fn lease(&self) -> Result<Option<Lease>>;
    /// Grants the lease to `owner` for `ttl_us` from `now_us` (see the
    /// trait's contract for when).
    fn acquire_lease(&self, owner: &str, ttl_us: i64, now_us: i64, take_over: Option<u64>) -> Result<Lease>;
    /// Extends lease `epoch` to `now_us + ttl_us`.
    fn renew_lease(&self, epoch: u64, ttl_us: i64, now_us: i64) -> Result<Lease>;
    /// Ends lease `epoch` now, so the next replayer need not wait.
    fn release_lease(&self, epoch: u64) -> Result<()>;
    /// Durably raises the reservation from `from` to `upto` (exclusive).
    fn reserve(&self, epoch: u64, from: Ts, upto: Ts) -> Result<()>;
    /// Durably raises HWM and LWM.
    fn save_watermarks(&self, epoch: u64, hwm: Ts, lwm: Ts) -> Result<()>;
    /// Registers (or renews) reader `id` reading snapshot `qts` until
    /// `expires_us`.
    fn register_reader(&self, id: &str, qts: Ts, expires_us: i64) -> Result<()>;
    /// Ends reader `id`'s registration (a missing one is no error).
    fn deregister_reader(&self, id: &str) -> Result<()>;
    /// The readers registered and not expired at `now_us`.
    fn readers(&self, now_us: i64) -> Result<Vec<ReaderLease>>;
    /// The id of the lake this state belongs to (`None`: not bound yet).
    fn lake_id(&self) -> Result<Option<String>>;
    /// Binds this state to lake `id` unless it is bound already, in one
    /// atomic step; returns the id it is bound to: `id`, or the one bound
    /// before (a retry after an unknown outcome reads back its own). Not
    /// fenced: a state is bound once, before its first lease matters.
    fn bind_lake(&self, id: &str) -> Result<String>;
}

/// A query on another host, registered with the snapshot it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderLease {
    /// Who reads.
    pub id: String,
    /// The snapshot it reads (the checkpoint ts of what it restored).
    pub qts: Ts,
    /// When the registration lapses unless renewed, µs since the epoch.
    pub expires_us: i64,
}

fn check_monotonic(what: &'static str, current: Ts, proposed: Ts) -> Result<()> {
    if proposed < current {
        return Err(Error::Regression { what, current: current.get(), proposed: proposed.get() });
    }
    Ok(())
}

/// The fencing rule: `epoch` may write when it is the current one.
fn check_epoch(current: u64, epoch: u64) -> Result<()> {
    if current != epoch {
        return Err(Error::Fenced { epoch, current });
    }
    Ok(())
}

/// The granting rule of [`TxnStore::acquire_lease`], on the current lease
/// (for every implementation: its write must then be conditioned on the
/// lease not having changed since it was read).
pub fn may_grant(current: Option<&Lease>, now_us: i64, take_over: Option<u64>) -> Result<()> {
    match current {
        Some(l) if l.expires_us > now_us && take_over != Some(l.epoch) => Err(Error::LeaseHeld {
            owner: l.owner.clone(),
            epoch: l.epoch,
            remaining_ms: (l.expires_us - now_us) / 1000,
        }),
        _ => Ok(()),
    }
}

fn check_reservation(current: Ts, from: Ts, upto: Ts) -> Result<()> {
    if upto <= from {
        return Err(Error::invariant(format!("reservation from {from:?} to {upto:?} is empty")));
    }
    if current != from {
        return Err(Error::Regression {
            what: "timestamp reservation (another writer reserved meanwhile)",
            current: current.get(),
            proposed: from.get(),
        });
    }
    Ok(())
}

/// A [`TxnStore`] in memory: durable for the life of the process only.
#[derive(Debug, Default)]
pub struct MemoryTxnStore {
    state: Mutex<(PersistedClock, Option<Lease>)>,
    readers: Mutex<std::collections::BTreeMap<String, ReaderLease>>,
    lake: Mutex<Option<String>>,
}

impl MemoryTxnStore {
    fn epoch(lease: Option<&Lease>) -> u64 {
        lease.map_or(0, |l| l.epoch)
    }
}

impl TxnStore for MemoryTxnStore {
    fn load(&self) -> Result<PersistedClock> {
        Ok(lock(&self.state).0)
    }

    fn lease(&self) -> Result<Option<Lease>> {
        Ok(lock(&self.state).1.clone())
    }

    fn acquire_lease(&self, owner: &str, ttl_us: i64, now_us: i64, take_over: Option<u64>) -> Result<Lease> {
        let mut s = lock(&self.state);
        may_grant(s.1.as_ref(), now_us, take_over)?;
        let lease =
            Lease { owner: owner.to_owned(), epoch: Self::epoch(s.1.as_ref()) + 1, expires_us: now_us + ttl_us };
        s.1 = Some(lease.clone());
        Ok(lease)
    }

    fn renew_lease(&self, epoch: u64, ttl_us: i64, now_us: i64) -> Result<Lease> {
        let mut s = lock(&self.state);
        check_epoch(Self::epoch(s.1.as_ref()), epoch)?;
        let lease = s.1.as_mut().ok_or(Error::Fenced { epoch, current: 0 })?;
        lease.expires_us = now_us + ttl_us;
        Ok(lease.clone())
    }

    fn release_lease(&self, epoch: u64) -> Result<()> {
        let mut s = lock(&self.state);
        check_epoch(Self::epoch(s.1.as_ref()), epoch)?;
        if let Some(l) = s.1.as_mut() {
            l.expires_us = 0;
        }
        Ok(())
    }

    fn reserve(&self, epoch: u64, from: Ts, upto: Ts) -> Result<()> {
        let mut s = lock(&self.state);
        check_epoch(Self::epoch(s.1.as_ref()), epoch)?;
        check_reservation(s.0.reserved, from, upto)?;
        s.0.reserved = upto;
        Ok(())
    }

    fn save_watermarks(&self, epoch: u64, hwm: Ts, lwm: Ts) -> Result<()> {
        let mut s = lock(&self.state);
        check_epoch(Self::epoch(s.1.as_ref()), epoch)?;
        check_monotonic("HWM", s.0.hwm, hwm)?;
        check_monotonic("LWM", s.0.lwm, lwm)?;
        s.0.hwm = hwm;
        s.0.lwm = lwm;
        Ok(())
    }

    fn register_reader(&self, id: &str, qts: Ts, expires_us: i64) -> Result<()> {
        lock(&self.readers).insert(id.to_owned(), ReaderLease { id: id.to_owned(), qts, expires_us });
        Ok(())
    }

    fn deregister_reader(&self, id: &str) -> Result<()> {
        lock(&self.readers).remove(id);
        Ok(())
    }

    fn readers(&self, now_us: i64) -> Result<Vec<ReaderLease>> {
        Ok(lock(&self.readers).values().filter(|r| r.expires_us > now_us).cloned().collect())
    }

    fn lake_id(&self) -> Result<Option<String>> {
        Ok(lock(&self.lake).clone())
    }

    fn bind_lake(&self, id: &str) -> Result<String> {
        Ok(lock(&self.lake).get_or_insert_with(|| id.to_owned()).clone())
    }
}

/// Opens (creating the folder) a SQLite file for metadata that must
/// survive a crash: WAL journal, synchronous=FULL.
pub fn open_durable_sqlite(path: &Path) -> Result<Connection> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    // Another process's write (a lease renewal, a checkpoint) is waited for,
    // not failed on.
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    Ok(conn)
}

/// The embedded [`TxnStore`]: one row in a SQLite file (WAL mode,
/// synchronous=FULL), updated with conditions that refuse regressions and
/// stale epochs (the condition and the write are one statement).
pub struct SqliteTxnStore {
    conn: Mutex<Connection>,
}

/// The persisted row: clock, then lease.
type ClockRow = (PersistedClock, Option<Lease>);

impl SqliteTxnStore {
    /// Opens (creating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = open_durable_sqlite(path)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS clock (
                id INTEGER PRIMARY KEY CHECK (id = 0),
                reserved INTEGER NOT NULL,
                hwm INTEGER NOT NULL,
                lwm INTEGER NOT NULL
             );
             INSERT OR IGNORE INTO clock (id, reserved, hwm, lwm) VALUES (0, 0, 0, 0);",
        )?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS readers (
                id TEXT PRIMARY KEY, qts INTEGER NOT NULL, expires_us INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS lake (id INTEGER PRIMARY KEY CHECK (id = 0), lake_id TEXT NOT NULL);",
        )?;
        // Lakes written before leases lack the lease columns.
        let has_lease = conn.prepare("SELECT 1 FROM pragma_table_info('clock') WHERE name = 'epoch'")?.exists([])?;
        if !has_lease {
            conn.execute_batch(
                "ALTER TABLE clock ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
                 ALTER TABLE clock ADD COLUMN owner TEXT;
                 ALTER TABLE clock ADD COLUMN expires_us INTEGER NOT NULL DEFAULT 0;",
            )?;
        }
        Ok(Self { conn: Mutex::new(conn) })
    }

    fn read(conn: &Connection) -> Result<ClockRow> {
        let row = conn
            .query_row("SELECT reserved, hwm, lwm, epoch, owner, expires_us FROM clock WHERE id = 0", [], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            })
            .optional()?;
        let (reserved, hwm, lwm, epoch, owner, expires_us) = row.ok_or_else(|| Error::Corrupt {
            what: "timestamp store".into(),
            reason: "the clock row is missing".into(),
        })?;
        let clock = PersistedClock { reserved: Ts(reserved as u64), hwm: Ts(hwm as u64), lwm: Ts(lwm as u64) };
        let lease = (epoch > 0).then(|| Lease { owner: owner.unwrap_or_default(), epoch: epoch as u64, expires_us });
        Ok((clock, lease))
    }

    /// Runs `f` on the current row inside one write transaction (BEGIN
    /// IMMEDIATE: no other writer between the read and the write).
    fn update<T>(&self, f: impl FnOnce(&rusqlite::Transaction<'_>, ClockRow) -> Result<T>) -> Result<T> {
        let mut conn = lock(&self.conn);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let row = Self::read(&tx)?;
        let out = f(&tx, row)?;
        tx.commit()?;
        Ok(out)
    }
}

impl TxnStore for SqliteTxnStore {
    fn load(&self) -> Result<PersistedClock> {
        Ok(Self::read(&lock(&self.conn))?.0)
    }

    fn lease(&self) -> Result<Option<Lease>> {
        Ok(Self::read(&lock(&self.conn))?.1)
    }

    fn acquire_lease(&self, owner: &str, ttl_us: i64, now_us: i64, take_over: Option<u64>) -> Result<Lease> {
        self.update(|tx, (_, lease)| {
            may_grant(lease.as_ref(), now_us, take_over)?;
            let lease =
                Lease { owner: owner.to_owned(), epoch: lease.map_or(0, |l| l.epoch) + 1, expires_us: now_us + ttl_us };
            tx.execute(
                "UPDATE clock SET epoch = ?1, owner = ?2, expires_us = ?3 WHERE id = 0",
                params![lease.epoch as i64, lease.owner, lease.expires_us],
            )?;
            Ok(lease)
        })
    }

    fn renew_lease(&self, epoch: u64, ttl_us: i64, now_us: i64) -> Result<Lease> {
        self.update(|tx, (_, lease)| {
            check_epoch(lease.as_ref().map_or(0, |l| l.epoch), epoch)?;
            let mut lease = lease.ok_or(Error::Fenced { epoch, current: 0 })?;
            lease.expires_us = now_us + ttl_us;
            tx.execute("UPDATE clock SET expires_us = ?1 WHERE id = 0", params![lease.expires_us])?;
            Ok(lease)
        })
    }

    fn release_lease(&self, epoch: u64) -> Result<()> {
        self.update(|tx, (_, lease)| {
            check_epoch(lease.as_ref().map_or(0, |l| l.epoch), epoch)?;
            tx.execute("UPDATE clock SET expires_us = 0 WHERE id = 0", [])?;
            Ok(())
        })
    }

    fn reserve(&self, epoch: u64, from: Ts, upto: Ts) -> Result<()> {
        self.update(|tx, (clock, lease)| {
            check_epoch(lease.as_ref().map_or(0, |l| l.epoch), epoch)?;
            check_reservation(clock.reserved, from, upto)?;
            tx.execute("UPDATE clock SET reserved = ?1 WHERE id = 0", params![upto.get() as i64])?;
            Ok(())
        })
    }

    fn save_watermarks(&self, epoch: u64, hwm: Ts, lwm: Ts) -> Result<()> {
        self.update(|tx, (clock, lease)| {
            check_epoch(lease.as_ref().map_or(0, |l| l.epoch), epoch)?;
            check_monotonic("HWM", clock.hwm, hwm)?;
            check_monotonic("LWM", clock.lwm, lwm)?;
            tx.execute(
                "UPDATE clock SET hwm = ?1, lwm = ?2 WHERE id = 0",
                params![hwm.get() as i64, lwm.get() as i64],
            )?;
            Ok(())
        })
    }

    fn register_reader(&self, id: &str, qts: Ts, expires_us: i64) -> Result<()> {
        let conn = lock(&self.conn);
        conn.execute(
            "INSERT INTO readers (id, qts, expires_us) VALUES (?1, ?2, ?3)
             ON CONFLICT (id) DO UPDATE SET qts = excluded.qts, expires_us = excluded.expires_us",
            params![id, qts.get() as i64, expires_us],
        )?;
        // Registrations lapsed long ago are nobody's.
        conn.execute("DELETE FROM readers WHERE expires_us < ?1", params![expires_us - 3_600_000_000])?;
        Ok(())
    }

    fn deregister_reader(&self, id: &str) -> Result<()> {
        lock(&self.conn).execute("DELETE FROM readers WHERE id = ?1", params![id])?;
        Ok(())
    }

    fn readers(&self, now_us: i64) -> Result<Vec<ReaderLease>> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare("SELECT id, qts, expires_us FROM readers WHERE expires_us > ?1 ORDER BY id")?;
        let rows = stmt.query_map(params![now_us], |r| {
            Ok(ReaderLease { id: r.get(0)?, qts: Ts(r.get::<_, i64>(1)? as u64), expires_us: r.get(2)? })
        })?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    fn lake_id(&self) -> Result<Option<String>> {
        Ok(lock(&self.conn).query_row("SELECT lake_id FROM lake WHERE id = 0", [], |r| r.get(0)).optional()?)
    }

    fn bind_lake(&self, id: &str) -> Result<String> {
        let conn = lock(&self.conn);
        // One statement: the insert and the conflict check are atomic.
        conn.execute("INSERT OR IGNORE INTO lake (id, lake_id) VALUES (0, ?1)", params![id])?;
        Ok(conn.query_row("SELECT lake_id FROM lake WHERE id = 0", [], |r| r.get(0))?)
    }
}

/// The conformance suite every [`TxnStore`] passes (public so that stores
/// in other crates, e.g. DynamoDB, run the same checks).
pub mod conformance {
    use std::sync::Arc;

    use super::{Lease, PersistedClock, ReaderLease, TxnStore};
    use fovea_types::error::Error;
    use fovea_types::ids::Ts;

    /// Runs every check on a new, empty store made by `new` (called once
    /// per check).
    pub fn check(new: &dyn Fn() -> Arc<dyn TxnStore>) {
        values_and_monotonicity(new().as_ref());
        leases_and_fencing(new().as_ref());
        concurrent_reservations_never_overlap(new());
        readers_register_renew_and_expire(new().as_ref());
        bound_to_one_lake(new().as_ref());
    }

    fn bound_to_one_lake(store: &dyn TxnStore) {
        assert_eq!(store.lake_id().unwrap(), None);
        // Bound once, whatever a lease did before; a retry reads back its
        // own id, another id is answered with the bound one.
        store.acquire_lease("w", 1_000, 0, None).unwrap();
        assert_eq!(store.bind_lake("lake-a").unwrap(), "lake-a");
        assert_eq!(store.bind_lake("lake-a").unwrap(), "lake-a");
        assert_eq!(store.bind_lake("lake-b").unwrap(), "lake-a");
        assert_eq!(store.lake_id().unwrap().as_deref(), Some("lake-a"));
        // The binding leaves the clock and the lease as they were.
        assert_eq!(store.lease().unwrap().map(|l| l.epoch), Some(1));
        assert_eq!(store.load().unwrap(), PersistedClock::default());
    }

    fn readers_register_renew_and_expire(store: &dyn TxnStore) {
        assert!(store.readers(0).unwrap().is_empty());
        store.register_reader("a", Ts(5), 1_000).unwrap();
        store.register_reader("b", Ts(3), 2_000).unwrap();
        let r = |id: &str, qts, expires_us| ReaderLease { id: id.into(), qts: Ts(qts), expires_us };
        assert_eq!(store.readers(500).unwrap(), vec![r("a", 5, 1_000), r("b", 3, 2_000)]);
        // Expired: no longer listed; renewed: listed again.
        assert_eq!(store.readers(1_500).unwrap(), vec![r("b", 3, 2_000)]);
        store.register_reader("a", Ts(6), 3_000).unwrap();
        assert_eq!(store.readers(1_500).unwrap(), vec![r("a", 6, 3_000), r("b", 3, 2_000)]);
        store.deregister_reader("b").unwrap();
        store.deregister_reader("b").unwrap();
        assert_eq!(store.readers(1_500).unwrap(), vec![r("a", 6, 3_000)]);
        // Readers write nothing of the lake: a lease does not fence them.
        store.acquire_lease("w", 1_000, 0, None).unwrap();
        store.register_reader("c", Ts(1), 5_000).unwrap();
        assert_eq!(store.readers(4_000).unwrap().len(), 1);
    }

    fn values_and_monotonicity(store: &dyn TxnStore) {
        assert_eq!(store.load().unwrap(), PersistedClock::default());
        assert_eq!(store.lease().unwrap(), None);
        store.reserve(0, Ts(0), Ts(10)).unwrap();
        store.save_watermarks(0, Ts(5), Ts(3)).unwrap();
        // A stale `from`: somebody reserved meanwhile.
        assert!(matches!(store.reserve(0, Ts(0), Ts(20)), Err(Error::Regression { .. })));
        assert!(matches!(store.reserve(0, Ts(10), Ts(10)), Err(Error::Invariant(_))));
        assert!(matches!(store.save_watermarks(0, Ts(4), Ts(3)), Err(Error::Regression { what: "HWM", .. })));
        assert!(matches!(store.save_watermarks(0, Ts(6), Ts(2)), Err(Error::Regression { what: "LWM", .. })));
        // Equal watermarks are no regression (a retried save).
        store.save_watermarks(0, Ts(5), Ts(3)).unwrap();
        assert_eq!(store.load().unwrap(), PersistedClock { reserved: Ts(10), hwm: Ts(5), lwm: Ts(3) });
    }

    fn leases_and_fencing(store: &dyn TxnStore) {
        store.reserve(0, Ts(0), Ts(10)).unwrap();
        let a = store.acquire_lease("a", 1_000, 10_000, None).unwrap();
        assert_eq!(a, Lease { owner: "a".into(), epoch: 1, expires_us: 11_000 });
        assert_eq!(store.lease().unwrap(), Some(a.clone()));
        // Unleased writes are over once a lease exists.
        assert!(matches!(store.reserve(0, Ts(10), Ts(20)), Err(Error::Fenced { epoch: 0, current: 1 })));
        // Held and unexpired: refused, unless the caller names its epoch.
        assert!(matches!(
            store.acquire_lease("b", 1_000, 10_500, None),
            Err(Error::LeaseHeld { epoch: 1, remaining_ms: 0, .. })
        ));
        store.reserve(1, Ts(10), Ts(20)).unwrap();
        assert_eq!(store.renew_lease(1, 1_000, 10_900).unwrap().expires_us, 11_900);
        assert!(store.acquire_lease("b", 1_000, 11_500, None).is_err());
        // Expired: b takes over with a new epoch; a is fenced everywhere.
        let b = store.acquire_lease("b", 1_000, 12_000, None).unwrap();
        assert_eq!((b.epoch, b.owner.as_str()), (2, "b"));
        assert!(matches!(store.reserve(1, Ts(20), Ts(30)), Err(Error::Fenced { epoch: 1, current: 2 })));
        assert!(matches!(store.save_watermarks(1, Ts(9), Ts(9)), Err(Error::Fenced { .. })));
        assert!(matches!(store.renew_lease(1, 1_000, 12_100), Err(Error::Fenced { .. })));
        assert!(matches!(store.release_lease(1), Err(Error::Fenced { .. })));
        store.reserve(2, Ts(20), Ts(30)).unwrap();
        store.save_watermarks(2, Ts(9), Ts(9)).unwrap();
        // A take-over names the epoch it replaces: only one of two racing
        // takers wins.
        let c = store.acquire_lease("c", 1_000, 12_100, Some(2)).unwrap();
        assert_eq!(c.epoch, 3);
        assert!(matches!(store.acquire_lease("d", 1_000, 12_100, Some(2)), Err(Error::LeaseHeld { epoch: 3, .. })));
        // Released: the next one need not wait.
        store.release_lease(3).unwrap();
        assert_eq!(store.acquire_lease("e", 1_000, 12_200, None).unwrap().epoch, 4);
        assert_eq!(store.load().unwrap(), PersistedClock { reserved: Ts(30), hwm: Ts(9), lwm: Ts(9) });
    }

    fn concurrent_reservations_never_overlap(store: Arc<dyn TxnStore>) {
        // Four writers reserve by compare-and-set from what they last read;
        // every granted range must be disjoint from every other.
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    for _ in 0..50 {
                        let from = store.load().unwrap().reserved;
                        let upto = Ts(from.get() + 7);
                        match store.reserve(0, from, upto) {
                            Ok(()) => got.push((from.get(), upto.get())),
                            Err(Error::Regression { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                    got
                })
            })
            .collect();
        let mut all: Vec<(u64, u64)> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        all.sort_unstable();
        assert!(!all.is_empty());
        for w in all.windows(2) {
            assert!(w[0].1 <= w[1].0, "overlapping reservations {w:?}");
        }
        assert_eq!(store.load().unwrap().reserved.get(), all.last().unwrap().1);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn memory_store_conformance() {
        conformance::check(&|| Arc::new(MemoryTxnStore::default()));
    }

    #[test]
    fn sqlite_store_conformance_and_durability() {
        let dir = tempfile::tempdir().unwrap();
        let n = std::sync::atomic::AtomicUsize::new(0);
        conformance::check(&|| {
            let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Arc::new(SqliteTxnStore::open(&dir.path().join(format!("meta{i}/txn.sqlite"))).unwrap())
        });
        let path = dir.path().join("meta1/txn.sqlite");
        let reopened = SqliteTxnStore::open(&path).unwrap();
        assert_eq!(reopened.load().unwrap().reserved, Ts(30));
        assert_eq!(reopened.lease().unwrap().map(|l| l.epoch), Some(4));
    }
}
