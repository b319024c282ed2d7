//! The embedded catalog: a SQLite file in the lake's metadata folder.
//!
//! | table | what |
//! |---|---|
//! | `catalog_versions` | one row per version: whether it made a checkpoint current, the files its actions changed |
//! | `catalog_operations` | the operations of each version (create table, combine, …), DESIGN §6 |
//! | `history` | every replayed source transaction: source id, commit time, mirror ts, tables, rows |
//! | `checkpoints` | the current checkpoint manifest with the input and position it covers |
//! | `storage_gc_queue` | regular files whose stale fraction passed the threshold |
//!
//! A version lands in one SQLite transaction. Fencing: the transaction
//! first updates the timestamp store's lease row (attached as `txn`) on the
//! condition that it still holds the writer's epoch; that takes the row's
//! write lock until the commit, so a take-over cannot slip in between the
//! check and the write, and a replayer that lost the lake writes nothing.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use super::{
    Catalog, CatalogCommit, CatalogOperation, CheckpointRecord, HistoryEntry, Pruned, Retention, VersionSummary, now_us,
};
use crate::cdc::SourcePosition;
use crate::engine::StaleFile;
use crate::error::{Error, Result};
use crate::ids::Ts;
use crate::mvcc::lock;

/// The catalog of one lake, in SQLite.
pub struct SqliteCatalog {
    conn: Mutex<Connection>,
}

fn corrupt(what: String, e: impl std::fmt::Display) -> Error {
    Error::Corrupt { what, reason: e.to_string() }
}

fn to_json<T: serde::Serialize>(what: &str, v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::invariant(format!("{what} does not serialize: {e}")))
}

impl SqliteCatalog {
    /// Opens (creating) the catalog at `path`, fenced by the lease of the
    /// timestamp store at `txn` (a [`crate::mvcc::SqliteTxnStore`] file).
    pub fn open(path: &Path, txn: &Path) -> Result<Self> {
        // The store's tables exist before the catalog attaches them.
        drop(crate::mvcc::SqliteTxnStore::open(txn)?);
        let conn = crate::mvcc::open_durable_sqlite(path)?;
        conn.execute("ATTACH DATABASE ?1 AS txn", params![txn.display().to_string()])?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS checkpoints (
                 id INTEGER PRIMARY KEY AUTOINCREMENT, ts INTEGER NOT NULL, manifest TEXT NOT NULL,
                 input TEXT NOT NULL, input_line INTEGER NOT NULL, input_offset INTEGER NOT NULL,
                 created_us INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS history (
                 ts INTEGER PRIMARY KEY, source_txid TEXT NOT NULL, commit_us INTEGER,
                 tables TEXT NOT NULL, rows INTEGER NOT NULL, replayed_us INTEGER NOT NULL);
             DROP INDEX IF EXISTS history_source;
             DROP INDEX IF EXISTS history_source_txid;
             CREATE TABLE IF NOT EXISTS catalog_versions (
                 version INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, checkpoint INTEGER NOT NULL,
                 files TEXT NOT NULL, created_us INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS catalog_operations (
                 id INTEGER PRIMARY KEY AUTOINCREMENT, version INTEGER NOT NULL, description TEXT NOT NULL,
                 actions TEXT NOT NULL, ts INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS storage_gc_queue (
                 table_name TEXT NOT NULL, file_id INTEGER NOT NULL, rows INTEGER NOT NULL,
                 deleted INTEGER NOT NULL, seen_us INTEGER NOT NULL, PRIMARY KEY (table_name, file_id));",
        )?;
        // Only snapshot runs are looked up by identity (every other
        // transaction by recency, `ts`): the index holds just those, so a
        // checkpoint's history rows (one per source transaction) go in
        // without an index insert each.
        conn.execute_batch(&format!(
            "CREATE INDEX IF NOT EXISTS history_snapshots ON history (source_txid) WHERE {};",
            snapshot_identities()
        ))?;
        // Lakes written before sources had state lack the column.
        let has_state =
            conn.prepare("SELECT 1 FROM pragma_table_info('checkpoints') WHERE name = 'source_state'")?.exists([])?;
        if !has_state {
            conn.execute("ALTER TABLE checkpoints ADD COLUMN source_state TEXT", [])?;
        }
        // Lakes written before pruning did not count history per version
        // (0 there: pruning keeps more, never less).
        let has_count = conn
            .prepare("SELECT 1 FROM pragma_table_info('catalog_versions') WHERE name = 'history_count'")?
            .exists([])?;
        if !has_count {
            conn.execute("ALTER TABLE catalog_versions ADD COLUMN history_count INTEGER NOT NULL DEFAULT 0", [])?;
        }
        // Lakes written before versions kept operations unversioned: they
        // become version 0's.
        let old_ops =
            conn.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'operations'")?.exists([])?;
        if old_ops {
            conn.execute_batch(
                "BEGIN IMMEDIATE;
                 INSERT INTO catalog_operations (version, description, actions, ts)
                     SELECT 0, description, actions, ts FROM operations ORDER BY version;
                 DROP TABLE operations;
                 COMMIT;",
            )?;
        }
        Ok(Self { conn: Mutex::new(conn) })
    }

    /// Starts a write transaction holding lease `epoch` (see the module
    /// docs).
    fn fenced(conn: &mut Connection, epoch: u64) -> Result<rusqlite::Transaction<'_>> {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let held =
            tx.execute("UPDATE txn.clock SET epoch = epoch WHERE id = 0 AND epoch = ?1", params![epoch as i64])?;
        if held != 1 {
            let current: i64 = tx.query_row("SELECT epoch FROM txn.clock WHERE id = 0", [], |r| r.get(0))?;
            return Err(Error::Fenced { epoch, current: current as u64 });
        }
        Ok(tx)
    }

    fn newest(conn: &Connection) -> Result<u64> {
        Ok(conn.query_row("SELECT coalesce(max(version), 0) FROM catalog_versions", [], |r| r.get::<_, i64>(0))? as u64)
    }
}

impl Catalog for SqliteCatalog {
    fn version(&self) -> Result<u64> {
        Self::newest(&lock(&self.conn))
    }

    fn summaries_since(&self, after: u64) -> Result<Vec<VersionSummary>> {
        let conn = lock(&self.conn);
        let oldest: Option<i64> = conn.query_row("SELECT min(version) FROM catalog_versions", [], |r| r.get(0))?;
        if let Some(oldest) = oldest.filter(|&o| o as u64 > after + 1) {
            return Err(super::pruned_since(after, oldest as u64));
        }
        let mut stmt = conn
            .prepare("SELECT version, checkpoint, files FROM catalog_versions WHERE version > ?1 ORDER BY version")?;
        let rows = stmt.query_map(params![after as i64], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
        })?;
        rows.map(|row| {
            let (version, checkpoint, files) = row?;
            let files: BTreeSet<u64> =
                serde_json::from_str(&files).map_err(|e| corrupt(format!("files of catalog version {version}"), e))?;
            Ok(VersionSummary { version: version as u64, checkpoint: checkpoint != 0, files })
        })
        .collect()
    }

    fn put_version(&self, epoch: u64, version: u64, commit: &CatalogCommit) -> Result<()> {
        let mut conn = lock(&self.conn);
        let tx = Self::fenced(&mut conn, epoch)?;
        let newest = Self::newest(&tx)?;
        if version != newest + 1 {
            return Err(Error::VersionExists { version, newest });
        }
        let now = now_us();
        tx.execute(
            "INSERT INTO catalog_versions (version, epoch, checkpoint, files, created_us, history_count)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                version as i64,
                epoch as i64,
                i64::from(commit.checkpoint.is_some()),
                to_json("files", &commit.files())?,
                now,
                commit.history.len() as i64
            ],
        )?;
        // One statement for the transaction's history rows (a checkpoint
        // carries one per source transaction: tens of thousands).
        let mut insert_history = tx.prepare_cached(
            "INSERT INTO history (ts, source_txid, commit_us, tables, rows, replayed_us) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        for h in &commit.history {
            insert_history.execute(params![
                h.ts.get() as i64,
                h.source_txid,
                h.commit_us,
                to_json("history tables", &h.tables)?,
                h.rows as i64,
                h.replayed_us
            ])?;
        }
        drop(insert_history);
        for op in &commit.operations {
            tx.execute(
                "INSERT INTO catalog_operations (version, description, actions, ts) VALUES (?1, ?2, ?3, ?4)",
                params![version as i64, op.description, op.actions.to_string(), op.ts.get() as i64],
            )?;
        }
        if let Some(c) = &commit.checkpoint {
            tx.execute(
                "INSERT INTO checkpoints (ts, manifest, input, input_line, input_offset, created_us, source_state) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    c.manifest.checkpoint_ts as i64,
                    to_json("checkpoint manifest", &c.manifest)?,
                    c.input,
                    c.position.line as i64,
                    c.position.offset as i64,
                    now,
                    c.source_state
                ],
            )?;
            tx.execute("DELETE FROM checkpoints WHERE id < (SELECT max(id) FROM checkpoints)", [])?;
        }
        tx.commit()?;
        Ok(())
    }

    fn latest_checkpoint(&self) -> Result<Option<CheckpointRecord>> {
        let conn = lock(&self.conn);
        let row = conn
            .query_row(
                "SELECT manifest, input, input_line, input_offset, source_state FROM checkpoints ORDER BY id DESC LIMIT 1",
                [],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, Option<String>>(4)?,
                    ))
                },
            )
            .optional()?;
        row.map(|(m, input, line, offset, source_state)| {
            let manifest = serde_json::from_str(&m).map_err(|e| corrupt("checkpoint manifest".into(), e))?;
            Ok(CheckpointRecord {
                manifest,
                input,
                position: SourcePosition { line: line as u64, offset: offset as u64 },
                source_state,
            })
        })
        .transpose()
    }

    fn history(&self, table: Option<&str>, limit: usize) -> Result<Vec<HistoryEntry>> {
        let conn = lock(&self.conn);
        let mut stmt =
            conn.prepare("SELECT ts, source_txid, commit_us, tables, rows, replayed_us FROM history ORDER BY ts DESC")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<i64>>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, i64>(5)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            if out.len() >= limit {
                break;
            }
            let (ts, source_txid, commit_us, tables, n, replayed_us) = row?;
            let tables: Vec<(String, u64)> = serde_json::from_str(&tables)
                .map_err(|e| corrupt(format!("tables of the history entry at ts {ts}"), e))?;
            if table.is_some_and(|t| !tables.iter().any(|(name, _)| name == t)) {
                continue;
            }
            out.push(HistoryEntry { ts: Ts(ts as u64), source_txid, commit_us, tables, rows: n as u64, replayed_us });
        }
        Ok(out)
    }

    fn operations(&self, limit: usize) -> Result<Vec<(u64, CatalogOperation)>> {
        let conn = lock(&self.conn);
        let mut stmt =
            conn.prepare("SELECT version, description, actions, ts FROM catalog_operations ORDER BY id DESC LIMIT ?1")?;
        let rows = stmt.query_map(params![limit as i64], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, i64>(3)?))
        })?;
        rows.map(|r| {
            let (v, description, actions, ts) = r?;
            let actions = serde_json::from_str(&actions)
                .map_err(|e| corrupt(format!("actions of operation {description:?} (version {v})"), e))?;
            Ok((v as u64, CatalogOperation { description, actions, ts: Ts(ts as u64) }))
        })
        .collect()
    }

    fn applied_identities(&self, window: usize) -> Result<HashSet<String>> {
        let conn = lock(&self.conn);
        let mut out = HashSet::new();
        let mut newest = conn.prepare("SELECT source_txid FROM history ORDER BY ts DESC LIMIT ?1")?;
        for id in newest.query_map(params![window as i64], |r| r.get::<_, String>(0))? {
            out.insert(id?);
        }
        // The same condition as the partial index's, so the index serves.
        let mut snapshots =
            conn.prepare(&format!("SELECT source_txid FROM history WHERE {}", snapshot_identities()))?;
        for id in snapshots.query_map([], |r| r.get(0))? {
            out.insert(id?);
        }
        Ok(out)
    }

    fn set_storage_gc_queue(&self, epoch: u64, files: &[StaleFile]) -> Result<()> {
        let mut conn = lock(&self.conn);
        let tx = Self::fenced(&mut conn, epoch)?;
        tx.execute("DELETE FROM storage_gc_queue", [])?;
        let now = now_us();
        for f in files {
            tx.execute(
                "INSERT INTO storage_gc_queue (table_name, file_id, rows, deleted, seen_us) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![f.table, f.file.0 as i64, f.rows as i64, f.deleted as i64, now],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    fn prune(&self, epoch: u64, retention: &Retention) -> Result<Pruned> {
        let mut conn = lock(&self.conn);
        let tx = Self::fenced(&mut conn, epoch)?;
        let pruned = Self::prune_in(&tx, retention)?;
        tx.commit()?;
        Ok(pruned)
    }

    fn storage_gc_queue(&self) -> Result<Vec<StaleFile>> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare(
            "SELECT table_name, file_id, rows, deleted FROM storage_gc_queue ORDER BY CAST(deleted AS REAL) / rows DESC",
        )?;
        let rows = stmt
            .query_map([], |r| {
                Ok(StaleFile {
                    table: r.get(0)?,
                    file: crate::ids::FileId(r.get::<_, i64>(1)? as u64),
                    rows: r.get::<_, i64>(2)? as usize,
                    deleted: r.get::<_, i64>(3)? as usize,
                })
            })?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }
}

impl SqliteCatalog {
    fn prune_in(tx: &rusqlite::Transaction<'_>, retention: &Retention) -> Result<Pruned> {
        let newest = Self::newest(tx)? as i64;
        // The oldest version that stays: young, the newest, or holding some
        // of the newest `keep_history` transactions (counted from the newest
        // version down).
        let oldest_kept: i64 = tx.query_row(
            "SELECT coalesce(min(version), ?2) FROM (
                 SELECT version, created_us,
                        sum(history_count) OVER (ORDER BY version DESC) - history_count AS newer
                 FROM catalog_versions)
             WHERE created_us >= ?1 OR version >= ?2 OR newer < ?3",
            params![retention.before_us, newest, retention.keep_history as i64],
            |r| r.get(0),
        )?;
        let versions = tx.execute("DELETE FROM catalog_versions WHERE version < ?1", params![oldest_kept])?;
        // Operations of versions gone (and of version 0: kept unversioned
        // by lakes older than versions).
        tx.execute("DELETE FROM catalog_operations WHERE version < ?1", params![oldest_kept])?;
        // The newest `keep_history` stay: those older than the oldest of
        // them may go (none while fewer are stored).
        let history = tx.execute(
            &format!(
                "DELETE FROM history WHERE replayed_us < ?1
                     AND ts < (SELECT ts FROM history ORDER BY ts DESC LIMIT 1 OFFSET ?2)
                     AND NOT ({})",
                snapshot_identities()
            ),
            params![retention.before_us, retention.keep_history.saturating_sub(1) as i64],
        )?;
        Ok(Pruned { versions: versions as u64, history: history as u64, objects: 0 })
    }
}

/// The SQL condition of a history row of a snapshot run: its identity
/// starts with [`super::SNAPSHOT_IDENTITY_PREFIX`] (a range of the text, as
/// an index can serve it; `LIKE` is case-insensitive and cannot).
fn snapshot_identities() -> String {
    let prefix = super::SNAPSHOT_IDENTITY_PREFIX;
    // The first text after every text that starts with the prefix: its
    // last character, one up (the prefix is ASCII and does not end in DEL).
    let (head, last) = prefix.split_at(prefix.len() - 1);
    let above = format!("{head}{}", char::from(last.as_bytes()[0] + 1));
    format!("source_txid >= '{prefix}' AND source_txid < '{above}'")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::mvcc::{SqliteTxnStore, TxnStore};

    /// Snapshot runs are found through their partial index, not by a scan
    /// of every source transaction's history row.
    #[test]
    fn snapshot_runs_are_searched_in_their_index() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = SqliteCatalog::open(&dir.path().join("catalog.sqlite"), &dir.path().join("txn.sqlite")).unwrap();
        let conn = lock(&catalog.conn);
        let sql = format!("EXPLAIN QUERY PLAN SELECT source_txid FROM history WHERE {}", snapshot_identities());
        let plan: Vec<String> =
            conn.prepare(&sql).unwrap().query_map([], |r| r.get::<_, String>(3)).unwrap().map(|r| r.unwrap()).collect();
        assert!(plan.iter().any(|p| p.starts_with("SEARCH") && p.contains("history_snapshots")), "{plan:?}");
    }

    #[test]
    fn sqlite_catalog_conformance() {
        let dir = tempfile::tempdir().unwrap();
        let n = AtomicUsize::new(0);
        super::super::conformance::check(&|| {
            let d = dir.path().join(n.fetch_add(1, Ordering::Relaxed).to_string());
            let txn = Arc::new(SqliteTxnStore::open(&d.join("txn.sqlite")).unwrap()) as Arc<dyn TxnStore>;
            let catalog = Arc::new(SqliteCatalog::open(&d.join("catalog.sqlite"), &d.join("txn.sqlite")).unwrap());
            (txn, catalog as Arc<dyn Catalog>)
        });
    }
}
