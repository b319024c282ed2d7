//! Durable timestamps and watermarks.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use super::lock;
use crate::error::{Error, Result};
use crate::ids::Ts;

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

/// Durable home of the timestamp allocator and the watermarks.
///
/// Guarantees an implementation must give:
/// * **Durability**: when [`reserve`](TxnStore::reserve) or
///   [`save_watermarks`](TxnStore::save_watermarks) returns `Ok`, the value
///   survives a crash of the process.
/// * **Monotonicity**: no persisted value ever moves backwards; an attempt
///   returns [`Error::Regression`] and changes nothing. This is also what
///   fences a stale writer: one that lost the race cannot move values.
/// * **Atomicity**: each call changes all its values or none.
///
/// The embedded implementation is [`SqliteTxnStore`]; the AWS one uses
/// DynamoDB conditional writes with the same contract.
pub trait TxnStore: Send + Sync {
    /// Reads the persisted values (zeros for a new store).
    fn load(&self) -> Result<PersistedClock>;
    /// Durably raises the reservation to `upto` (exclusive).
    fn reserve(&self, upto: Ts) -> Result<()>;
    /// Durably raises HWM and LWM.
    fn save_watermarks(&self, hwm: Ts, lwm: Ts) -> Result<()>;
}

fn check_monotonic(what: &'static str, current: Ts, proposed: Ts) -> Result<()> {
    if proposed < current {
        return Err(Error::Regression { what, current: current.get(), proposed: proposed.get() });
    }
    Ok(())
}

/// A [`TxnStore`] in memory: durable for the life of the process only.
#[derive(Debug, Default)]
pub struct MemoryTxnStore {
    state: Mutex<PersistedClock>,
}

impl TxnStore for MemoryTxnStore {
    fn load(&self) -> Result<PersistedClock> {
        Ok(*lock(&self.state))
    }

    fn reserve(&self, upto: Ts) -> Result<()> {
        let mut s = lock(&self.state);
        check_monotonic("timestamp reservation", s.reserved, upto)?;
        s.reserved = upto;
        Ok(())
    }

    fn save_watermarks(&self, hwm: Ts, lwm: Ts) -> Result<()> {
        let mut s = lock(&self.state);
        check_monotonic("HWM", s.hwm, hwm)?;
        check_monotonic("LWM", s.lwm, lwm)?;
        s.hwm = hwm;
        s.lwm = lwm;
        Ok(())
    }
}

/// Opens (creating the folder) a SQLite file for metadata that must
/// survive a crash: WAL journal, synchronous=FULL.
pub(crate) fn open_durable_sqlite(path: &Path) -> Result<Connection> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

/// The embedded [`TxnStore`]: one row in a SQLite file (WAL mode,
/// synchronous=FULL), updated with conditions that refuse regressions.
pub struct SqliteTxnStore {
    conn: Mutex<Connection>,
}

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
        Ok(Self { conn: Mutex::new(conn) })
    }
}

impl TxnStore for SqliteTxnStore {
    fn load(&self) -> Result<PersistedClock> {
        let conn = lock(&self.conn);
        let row = conn
            .query_row("SELECT reserved, hwm, lwm FROM clock WHERE id = 0", [], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
            })
            .optional()?;
        let (reserved, hwm, lwm) = row.ok_or_else(|| Error::Corrupt {
            what: "timestamp store".into(),
            reason: "the clock row is missing".into(),
        })?;
        Ok(PersistedClock { reserved: Ts(reserved as u64), hwm: Ts(hwm as u64), lwm: Ts(lwm as u64) })
    }

    fn reserve(&self, upto: Ts) -> Result<()> {
        let conn = lock(&self.conn);
        let n =
            conn.execute("UPDATE clock SET reserved = ?1 WHERE id = 0 AND reserved <= ?1", params![upto.get() as i64])?;
        if n != 1 {
            let current: i64 = conn.query_row("SELECT reserved FROM clock WHERE id = 0", [], |r| r.get(0))?;
            return Err(Error::Regression {
                what: "timestamp reservation",
                current: current as u64,
                proposed: upto.get(),
            });
        }
        Ok(())
    }

    fn save_watermarks(&self, hwm: Ts, lwm: Ts) -> Result<()> {
        let conn = lock(&self.conn);
        let n = conn.execute(
            "UPDATE clock SET hwm = ?1, lwm = ?2 WHERE id = 0 AND hwm <= ?1 AND lwm <= ?2",
            params![hwm.get() as i64, lwm.get() as i64],
        )?;
        if n != 1 {
            let (h, l): (i64, i64) =
                conn.query_row("SELECT hwm, lwm FROM clock WHERE id = 0", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
            let (what, current, proposed) =
                if (h as u64) > hwm.get() { ("HWM", h, hwm.get()) } else { ("LWM", l, lwm.get()) };
            return Err(Error::Regression { what, current: current as u64, proposed });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conformance(store: &dyn TxnStore) {
        assert_eq!(store.load().unwrap(), PersistedClock::default());
        store.reserve(Ts(10)).unwrap();
        store.save_watermarks(Ts(5), Ts(3)).unwrap();
        assert!(matches!(store.reserve(Ts(9)), Err(Error::Regression { .. })));
        assert!(matches!(store.save_watermarks(Ts(4), Ts(3)), Err(Error::Regression { what: "HWM", .. })));
        assert!(matches!(store.save_watermarks(Ts(6), Ts(2)), Err(Error::Regression { what: "LWM", .. })));
        assert_eq!(store.load().unwrap(), PersistedClock { reserved: Ts(10), hwm: Ts(5), lwm: Ts(3) });
    }

    #[test]
    fn memory_store_conformance() {
        conformance(&MemoryTxnStore::default());
    }

    #[test]
    fn sqlite_store_conformance_and_durability() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta/txn.sqlite");
        conformance(&SqliteTxnStore::open(&path).unwrap());
        let reopened = SqliteTxnStore::open(&path).unwrap();
        assert_eq!(reopened.load().unwrap().reserved, Ts(10));
    }
}
