//! The embedded catalog: a SQLite file in the lake's metadata folder.
//!
//! It holds what makes a lake durable and explainable:
//!
//! | table | what |
//! |---|---|
//! | `checkpoints` | the newest checkpoint manifest with the input and position it covers |
//! | `history` | every replayed source transaction: source id, commit time, mirror ts, tables, rows |
//! | `operations` | the commit log of catalog operations (create table, combine, …), DESIGN §6 |
//!
//! A checkpoint commits in one SQLite transaction together with the history
//! and operations since the previous one: after a crash, the lake is exactly
//! the last checkpoint, and the input is replayed from its position.
//!
//! Fencing: every write names the writer's lease epoch and checks it
//! against the timestamp store's lease row (attached as `txn`) in the same
//! transaction. The check is a no-op update of that row, which takes its
//! write lock until the commit, so a take-over cannot slip in between the
//! check and the commit: a replayer that lost the lake writes nothing.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use crate::cdc::SourcePosition;
use crate::checkpoint::Manifest;
use crate::engine::{Engine, EngineConfig, METADATA_DIR};
use crate::error::{Error, Result};
use crate::ids::Ts;
use crate::mvcc::{Clock, SqliteTxnStore, lock};

/// A replayed source transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct HistoryEntry {
    /// Mirror timestamp.
    pub ts: Ts,
    /// Source transaction identity.
    pub source_txid: String,
    /// Source commit time, µs.
    pub commit_us: Option<i64>,
    /// Rows per table.
    pub tables: Vec<(String, u64)>,
    /// Rows in all.
    pub rows: u64,
    /// When it became visible, µs.
    pub replayed_us: i64,
}

/// A catalog operation of the commit log.
#[derive(Clone, Debug, PartialEq)]
pub struct CatalogOperation {
    /// What it did, for humans.
    pub description: String,
    /// Its actions, as JSON.
    pub actions: serde_json::Value,
    /// Mirror ts at which it happened.
    pub ts: Ts,
}

/// The newest checkpoint.
#[derive(Clone, Debug)]
pub struct CheckpointRecord {
    /// The engine image.
    pub manifest: Manifest,
    /// Input it covers.
    pub input: String,
    /// Where to resume that input.
    pub position: SourcePosition,
    /// What the input's reader needs besides the position to resume (a
    /// PostgreSQL source's snapshot filters), as it wrote it.
    pub source_state: Option<String>,
}

/// The catalog of one lake.
pub struct Catalog {
    conn: Mutex<Connection>,
}

impl Catalog {
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
             CREATE UNIQUE INDEX IF NOT EXISTS history_source ON history (source_txid);
             CREATE TABLE IF NOT EXISTS operations (
                 version INTEGER PRIMARY KEY AUTOINCREMENT, description TEXT NOT NULL,
                 actions TEXT NOT NULL, ts INTEGER NOT NULL, created_us INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS storage_gc_queue (
                 table_name TEXT NOT NULL, file_id INTEGER NOT NULL, rows INTEGER NOT NULL,
                 deleted INTEGER NOT NULL, seen_us INTEGER NOT NULL, PRIMARY KEY (table_name, file_id));",
        )?;
        // Lakes written before sources had state lack the column.
        let has_state =
            conn.prepare("SELECT 1 FROM pragma_table_info('checkpoints') WHERE name = 'source_state'")?.exists([])?;
        if !has_state {
            conn.execute("ALTER TABLE checkpoints ADD COLUMN source_state TEXT", [])?;
        }
        Ok(Self { conn: Mutex::new(conn) })
    }

    /// The newest checkpoint, if any.
    pub fn latest_checkpoint(&self) -> Result<Option<CheckpointRecord>> {
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
            let manifest = serde_json::from_str(&m)
                .map_err(|e| Error::Corrupt { what: "checkpoint manifest".into(), reason: e.to_string() })?;
            Ok(CheckpointRecord {
                manifest,
                input,
                position: SourcePosition { line: line as u64, offset: offset as u64 },
                source_state,
            })
        })
        .transpose()
    }

    /// Commits a checkpoint with the history and operations since the last
    /// one, atomically, if lease `epoch` is still the lake's
    /// ([`Error::Fenced`] otherwise); older checkpoints are dropped.
    #[allow(clippy::too_many_arguments)]
    pub fn commit_checkpoint(
        &self,
        epoch: u64,
        manifest: &Manifest,
        input: &str,
        position: SourcePosition,
        source_state: Option<&str>,
        history: &[HistoryEntry],
        operations: &[CatalogOperation],
    ) -> Result<()> {
        let mut conn = lock(&self.conn);
        let tx = fenced(&mut conn, epoch)?;
        let now = now_us();
        for h in history {
            let tables = serde_json::to_string(&h.tables.iter().map(|(t, n)| (t.as_str(), *n)).collect::<Vec<_>>())
                .map_err(|e| Error::invariant(e.to_string()))?;
            tx.execute(
                "INSERT INTO history (ts, source_txid, commit_us, tables, rows, replayed_us) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![h.ts.get() as i64, h.source_txid, h.commit_us, tables, h.rows as i64, h.replayed_us],
            )?;
        }
        for op in operations {
            tx.execute(
                "INSERT INTO operations (description, actions, ts, created_us) VALUES (?1, ?2, ?3, ?4)",
                params![op.description, op.actions.to_string(), op.ts.get() as i64, now],
            )?;
        }
        let m = serde_json::to_string(manifest).map_err(|e| Error::invariant(e.to_string()))?;
        tx.execute(
            "INSERT INTO checkpoints (ts, manifest, input, input_line, input_offset, created_us, source_state) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![manifest.checkpoint_ts as i64, m, input, position.line as i64, position.offset as i64, now, source_state],
        )?;
        tx.execute("DELETE FROM checkpoints WHERE id < (SELECT max(id) FROM checkpoints)", [])?;
        tx.commit()?;
        Ok(())
    }

    /// Replaces the storage-GC queue (files to rewrite without their stale
    /// rows) with `files`.
    pub fn set_storage_gc_queue(&self, epoch: u64, files: &[crate::engine::StaleFile]) -> Result<()> {
        let mut conn = lock(&self.conn);
        let tx = fenced(&mut conn, epoch)?;
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

    /// The storage-GC queue, most stale first.
    pub fn storage_gc_queue(&self) -> Result<Vec<crate::engine::StaleFile>> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare(
            "SELECT table_name, file_id, rows, deleted FROM storage_gc_queue ORDER BY CAST(deleted AS REAL) / rows DESC",
        )?;
        let rows = stmt
            .query_map([], |r| {
                Ok(crate::engine::StaleFile {
                    table: r.get(0)?,
                    file: crate::ids::FileId(r.get::<_, i64>(1)? as u64),
                    rows: r.get::<_, i64>(2)? as usize,
                    deleted: r.get::<_, i64>(3)? as usize,
                })
            })?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }

    /// Identities of every source transaction replayed so far.
    pub fn applied(&self) -> Result<HashSet<String>> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare("SELECT source_txid FROM history")?;
        let ids = stmt.query_map([], |r| r.get::<_, String>(0))?.collect::<Result<_, _>>()?;
        Ok(ids)
    }

    /// Replayed source transactions, newest first.
    pub fn history(&self, table: Option<&str>, limit: usize) -> Result<Vec<HistoryEntry>> {
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
            let (ts, source_txid, commit_us, tables, n, replayed_us) = row?;
            let tables: Vec<(String, u64)> = serde_json::from_str(&tables).unwrap_or_default();
            if table.is_some_and(|t| !tables.iter().any(|(name, _)| name == t)) {
                continue;
            }
            out.push(HistoryEntry { ts: Ts(ts as u64), source_txid, commit_us, tables, rows: n as u64, replayed_us });
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Catalog operations, newest first.
    pub fn operations(&self, limit: usize) -> Result<Vec<(i64, CatalogOperation)>> {
        let conn = lock(&self.conn);
        let mut stmt =
            conn.prepare("SELECT version, description, actions, ts FROM operations ORDER BY version DESC LIMIT ?1")?;
        let rows = stmt.query_map(params![limit as i64], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, i64>(3)?))
        })?;
        rows.map(|r| {
            let (v, description, actions, ts) = r?;
            Ok((
                v,
                CatalogOperation {
                    description,
                    actions: serde_json::from_str(&actions).unwrap_or_default(),
                    ts: Ts(ts as u64),
                },
            ))
        })
        .collect()
    }
}

/// A write transaction that holds lease `epoch`: the no-op update of the
/// lease row checks the epoch and keeps that row's write lock until the
/// transaction ends.
fn fenced(conn: &mut Connection, epoch: u64) -> Result<rusqlite::Transaction<'_>> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let held = tx.execute("UPDATE txn.clock SET epoch = epoch WHERE id = 0 AND epoch = ?1", params![epoch as i64])?;
    if held != 1 {
        let current: i64 = tx.query_row("SELECT epoch FROM txn.clock WHERE id = 0", [], |r| r.get(0))?;
        return Err(Error::Fenced { epoch, current: current as u64 });
    }
    Ok(tx)
}

/// µs since the epoch, now.
pub fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// A lake directory opened: the engine (restored from the newest checkpoint
/// when there is one), its catalog, that checkpoint, and for a writer the
/// lake's lease.
pub struct OpenLake {
    /// The engine.
    pub engine: Arc<Engine>,
    /// The catalog.
    pub catalog: Arc<Catalog>,
    /// The checkpoint it was restored from.
    pub checkpoint: Option<CheckpointRecord>,
    /// The lease a writer holds (renewed until dropped).
    pub lease: Option<crate::lease::LeaseKeeper>,
}

/// How a lake is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// The one writer: takes the lake's lease (waiting while a live
    /// replayer holds it), then deletes unreferenced objects.
    Write,
    /// A reader beside a possibly running writer: nothing is deleted.
    Read,
}

/// Opens the lake in `dir` (creating it), restoring its newest checkpoint.
pub fn open_lake(dir: &Path, config: EngineConfig, mode: OpenMode) -> Result<OpenLake> {
    open_lake_with(dir, config, mode, crate::lease::DEFAULT_LEASE_TTL)
}

/// [`open_lake`] with the lease time of a writer.
pub fn open_lake_with(dir: &Path, config: EngineConfig, mode: OpenMode, lease_ttl: Duration) -> Result<OpenLake> {
    std::fs::create_dir_all(dir)?;
    let meta = dir.join(METADATA_DIR);
    let txn_path = meta.join("txn.sqlite");
    let txn: Arc<dyn crate::mvcc::TxnStore> = Arc::new(SqliteTxnStore::open(&txn_path)?);
    // The lease first: the checkpoint read below is then the newest one,
    // and no replayer that lost the lake can commit another.
    let lease = match mode {
        OpenMode::Write => Some(crate::lease::LeaseKeeper::acquire(Arc::clone(&txn), lease_ttl)?),
        OpenMode::Read => None,
    };
    let catalog = Arc::new(Catalog::open(&meta.join("catalog.sqlite"), &txn_path)?);
    let checkpoint = catalog.latest_checkpoint()?;
    let store: Arc<dyn object_store::ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir)?);
    let clock = Clock::open(txn)?;
    if let Some(l) = &lease {
        clock.set_epoch(l.epoch());
    }
    let engine = match &checkpoint {
        Some(c) => Engine::restore(store, clock, &c.manifest, mode == OpenMode::Write)?,
        None if mode == OpenMode::Read => Engine::open(store, clock, config)?,
        None => {
            // Objects without a checkpoint were written by a run that died
            // before its first one: nothing references them.
            let engine = Engine::open(store, clock, config)?;
            engine.vacuum(&HashSet::new())?;
            engine
        }
    };
    if let Some(l) = &lease {
        engine.fence_file_ids(l.epoch());
    }
    if let Some(c) = &checkpoint {
        engine.checkpoint_committed(&c.manifest);
    }
    // The newest replayed transaction of the checkpoint keeps freshness known.
    if let Some(c) = &checkpoint
        && let Some(h) = catalog.history(None, 1)?.into_iter().next()
        && h.ts.get() <= c.manifest.checkpoint_ts
        && let Some(us) = h.commit_us
    {
        engine.note_source_commit(h.ts, us);
    }
    Ok(OpenLake { engine, catalog, checkpoint, lease })
}
