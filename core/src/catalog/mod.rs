//! The catalog: the versioned commit log of a lake (DESIGN §6).
//!
//! Each commit is one *version* (1, 2, 3, … contiguous) holding a
//! [`CatalogCommit`]: user-facing operations made of actions (create table,
//! evolve schema, combine, …), the replayed source transactions it makes
//! durable, and possibly a new current checkpoint with the input positions
//! it covers. After a crash the lake is exactly its newest checkpoint, and
//! the input is replayed from the positions recorded with it.
//!
//! Concurrent committers (the replayer, and the combine and storage-GC jobs
//! of later issues) each name the version they read. [`Catalog::commit`]
//! checks the versions committed since by their actions alone
//! ([`CatalogCommit::conflicts_with`]): a commit that conflicts with none is
//! rebased onto the newest version and lands as the next one (retrying
//! when another lands first); one that conflicts is refused with
//! [`Error::CatalogConflict`]. Several jobs' operations may be merged into
//! one commit by their committer.
//!
//! | backend | where |
//! |---|---|
//! | SQLite file in the lake's `_fovea/` folder (embedded default) | [`sqlite::SqliteCatalog`] |
//! | DynamoDB items (+ S3 objects for large payloads) | `fovea_aws::dynamo` |

pub mod sqlite;

use std::collections::{BTreeSet, HashSet};

use crate::cdc::SourcePosition;
use crate::checkpoint::Manifest;
use crate::engine::StaleFile;
use crate::error::{Error, Result};
use crate::ids::Ts;

pub use sqlite::SqliteCatalog;

/// A replayed source transaction.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
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

/// A user-facing catalog operation: what it did for humans, and its
/// actions (`[{"add_table": …}, {"replace_files": …, "files": [ids]}, …]`).
/// An action that changes files names them in `"files"`; that is what
/// conflict checks read.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CatalogOperation {
    /// What it did, for humans.
    pub description: String,
    /// Its actions, as JSON.
    pub actions: serde_json::Value,
    /// Mirror ts at which it happened.
    pub ts: Ts,
}

/// A checkpoint made current by a commit.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointRecord {
    /// The engine image.
    pub manifest: Manifest,
    /// Input it covers.
    pub input: String,
    /// Where to resume that input.
    pub position: SourcePosition,
    /// What the input's reader needs besides the position to resume (a
    /// PostgreSQL source's snapshot filters, a file's fingerprint).
    pub source_state: Option<String>,
}

impl CheckpointRecord {
    /// What it records of its input, for a source to reopen there.
    pub fn resume(&self) -> crate::cdc::source::Resume {
        crate::cdc::source::Resume {
            input: self.input.clone(),
            position: self.position,
            state: self.source_state.clone(),
        }
    }
}

/// What one commit adds to the catalog.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CatalogCommit {
    /// Operations, in order.
    pub operations: Vec<CatalogOperation>,
    /// Replayed source transactions it makes durable.
    pub history: Vec<HistoryEntry>,
    /// The checkpoint it makes current.
    pub checkpoint: Option<CheckpointRecord>,
}

/// What conflict checks need of a committed version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionSummary {
    /// The version.
    pub version: u64,
    /// Whether it made a new checkpoint current.
    pub checkpoint: bool,
    /// File ids its actions changed.
    pub files: BTreeSet<u64>,
}

impl CatalogCommit {
    /// File ids the actions of this commit change (`"files": [ids]`).
    pub fn files(&self) -> BTreeSet<u64> {
        let mut out = BTreeSet::new();
        for op in &self.operations {
            let actions = op.actions.as_array().map(Vec::as_slice).unwrap_or(std::slice::from_ref(&op.actions));
            for a in actions {
                if let Some(files) = a.get("files").and_then(serde_json::Value::as_array) {
                    out.extend(files.iter().filter_map(serde_json::Value::as_u64));
                }
            }
        }
        out
    }

    /// The summary conflict checks read.
    pub fn summary(&self, version: u64) -> VersionSummary {
        VersionSummary { version, checkpoint: self.checkpoint.is_some(), files: self.files() }
    }

    /// Whether this commit, made without seeing `other`, conflicts with it:
    /// both make a checkpoint current (each image would drop the other's
    /// changes), or both change one file.
    pub fn conflicts_with(&self, other: &VersionSummary) -> Option<String> {
        if self.checkpoint.is_some() && other.checkpoint {
            return Some(format!("version {} made a checkpoint current since", other.version));
        }
        let mine = self.files();
        let common: Vec<u64> = mine.intersection(&other.files).copied().collect();
        (!common.is_empty()).then(|| format!("version {} changed files {common:?} since", other.version))
    }
}

/// What [`Catalog::prune`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Versions created, and history replayed, before this (µs since the
    /// epoch) may go.
    pub before_us: i64,
    /// Except the newest this many replayed transactions: the dedup window
    /// ([`Catalog::applied_identities`]) stays whole.
    pub keep_history: usize,
}

impl Retention {
    /// Everything older than `age` now, keeping the newest `keep_history`
    /// replayed transactions.
    pub fn older_than(age: std::time::Duration, keep_history: usize) -> Self {
        let age_us = i64::try_from(age.as_micros()).unwrap_or(i64::MAX);
        Retention { before_us: now_us().saturating_sub(age_us), keep_history }
    }
}

/// What a [`Catalog::prune`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Versions (with their operations).
    pub versions: u64,
    /// Replayed transactions' history entries.
    pub history: u64,
    /// Objects in the lake that only those referenced.
    pub objects: u64,
}

/// Snapshot runs' identities start with this (they are kept whatever the
/// dedup window).
pub const SNAPSHOT_IDENTITY_PREFIX: &str = "snapshot:";

/// The catalog of one lake.
///
/// Guarantees an implementation must give:
/// * **Versions are contiguous**: [`put_version`](Catalog::put_version)
///   writes version `v` only if the newest is `v − 1`; otherwise it fails
///   with [`Error::VersionExists`] and writes nothing.
/// * **Atomicity**: a version's operations, history and checkpoint land
///   together or not at all; a failed call leaves the catalog as it was.
/// * **Fencing**: every write names the writer's lease epoch and is
///   refused with [`Error::Fenced`] unless it is the lake's current epoch
///   (epoch 0 only while no lease was ever granted), checked atomically
///   with the write.
/// * **Durability**: what a call wrote before it returned `Ok` survives a
///   crash.
/// * Reads see every version that landed before the read began.
/// * **Pruning** ([`prune`](Catalog::prune)) removes only versions and
///   history past the retention, never the newest version, the current
///   checkpoint, a snapshot run's identity or the newest `keep_history`
///   history entries; it is fenced like a commit. A commit made after
///   reading a version that has since been pruned cannot be checked
///   against what landed in between: it is refused with
///   [`Error::CatalogConflict`] ([`summaries_since`](Catalog::summaries_since)
///   fails so).
///
/// Every implementation passes `conformance::check`.
pub trait Catalog: Send + Sync {
    /// The newest version (0: none).
    fn version(&self) -> Result<u64>;
    /// Summaries of the versions after `after`, in order; a
    /// [`Error::CatalogConflict`] when some of them were pruned.
    fn summaries_since(&self, after: u64) -> Result<Vec<VersionSummary>>;
    /// Writes `commit` as `version` (see the contract).
    fn put_version(&self, epoch: u64, version: u64, commit: &CatalogCommit) -> Result<()>;
    /// The current checkpoint, if any.
    fn latest_checkpoint(&self) -> Result<Option<CheckpointRecord>>;
    /// Replayed source transactions touching `table` (all with `None`),
    /// newest first, at most `limit`.
    fn history(&self, table: Option<&str>, limit: usize) -> Result<Vec<HistoryEntry>>;
    /// Catalog operations with their versions, newest first, at most `limit`.
    fn operations(&self, limit: usize) -> Result<Vec<(u64, CatalogOperation)>>;
    /// Identities of the newest `window` replayed source transactions, and
    /// of every snapshot run ever replayed (they may be read again long
    /// after): what a replayer dedups against. Memory is bounded by the
    /// window, not by history.
    fn applied_identities(&self, window: usize) -> Result<HashSet<String>>;
    /// Replaces the storage-GC queue (files to rewrite without their stale
    /// rows), fenced like a commit.
    fn set_storage_gc_queue(&self, epoch: u64, files: &[StaleFile]) -> Result<()>;
    /// The storage-GC queue, most stale first.
    fn storage_gc_queue(&self) -> Result<Vec<StaleFile>>;
    /// Forgets the versions (their operations and history) and history
    /// entries older than `retention` allows, and the lake objects only
    /// they referenced (see the contract). Oldest first: a failure leaves
    /// a prefix pruned, and the next call goes on.
    fn prune(&self, epoch: u64, retention: &Retention) -> Result<Pruned>;

    /// Commits `commit`, made after reading `read_version`: checked against
    /// every version committed since (by their actions), rebased onto the
    /// newest and written as the next version, retried while others land
    /// first. Returns the version it landed as.
    fn commit(&self, epoch: u64, read_version: u64, commit: &CatalogCommit) -> Result<u64> {
        let mut seen = read_version;
        loop {
            let since = self.summaries_since(seen)?;
            if let Some(reason) = since.iter().find_map(|v| commit.conflicts_with(v)) {
                return Err(Error::CatalogConflict { read_version, reason });
            }
            let next = since.last().map_or(seen, |v| v.version) + 1;
            match self.put_version(epoch, next, commit) {
                Ok(()) => return Ok(next),
                // Another commit landed as `next`: check against it too.
                Err(Error::VersionExists { .. }) => seen = next - 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Commits a checkpoint with the history and operations since the last
    /// one (the replayer's commit: it is the only one making checkpoints,
    /// so it reads the newest version).
    fn commit_checkpoint(
        &self,
        epoch: u64,
        checkpoint: CheckpointRecord,
        history: &[HistoryEntry],
        operations: &[CatalogOperation],
    ) -> Result<u64> {
        let commit =
            CatalogCommit { operations: operations.to_vec(), history: history.to_vec(), checkpoint: Some(checkpoint) };
        self.commit(epoch, self.version()?, &commit)
    }
}

/// The refusal of a commit made after reading version `after` when the
/// versions since begin at `oldest` (the ones between were pruned).
pub fn pruned_since(after: u64, oldest: u64) -> Error {
    Error::CatalogConflict {
        read_version: after,
        reason: format!(
            "versions {}..{oldest} were pruned since (past the history retention): redo it from the newest version",
            after + 1
        ),
    }
}

/// µs since the epoch, now.
pub fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// The conformance suite every [`Catalog`] passes (public so that catalogs
/// in other crates, e.g. DynamoDB, run the same checks).
pub mod conformance {
    use std::collections::HashSet;
    use std::sync::Arc;

    use super::{Catalog, CatalogCommit, CatalogOperation, CheckpointRecord, HistoryEntry, Retention};
    use crate::cdc::SourcePosition;
    use crate::engine::StaleFile;
    use crate::error::Error;
    use crate::ids::{FileId, Ts};
    use crate::mvcc::TxnStore;

    /// A catalog and the timestamp store whose lease fences it (one lake's
    /// state).
    pub type State = (Arc<dyn TxnStore>, Arc<dyn Catalog>);

    /// Runs every check on new, empty states made by `new`.
    pub fn check(new: &dyn Fn() -> State) {
        versions_checkpoints_and_history(new());
        fencing(new());
        conflicts_and_rebases(new());
        concurrent_committers_land_exactly_once(new());
        large_payloads(new());
        pruning(new());
    }

    fn checkpoint(ts: u64, input: &str, padding: usize) -> CheckpointRecord {
        let engine = crate::Engine::in_memory(crate::EngineConfig::default().with_shards(1)).unwrap();
        let mut manifest = engine.write_checkpoint().unwrap();
        manifest.checkpoint_ts = ts;
        CheckpointRecord {
            manifest,
            input: format!("{input}{}", "x".repeat(padding)),
            position: SourcePosition { line: ts, offset: ts * 10 },
            source_state: Some(format!("state-{ts}")),
        }
    }

    fn history(ts: u64, id: &str) -> HistoryEntry {
        HistoryEntry {
            ts: Ts(ts),
            source_txid: id.into(),
            commit_us: Some(ts as i64 * 1000),
            tables: vec![("s.t".into(), 2), ("s.u".into(), 1)],
            rows: 3,
            replayed_us: 7,
        }
    }

    fn op(description: &str, files: &[u64]) -> CatalogOperation {
        CatalogOperation {
            description: description.into(),
            actions: serde_json::json!([{ "replace_files": "s.t", "files": files }]),
            ts: Ts(1),
        }
    }

    fn versions_checkpoints_and_history((_, catalog): State) {
        assert_eq!(catalog.version().unwrap(), 0);
        assert_eq!(catalog.latest_checkpoint().unwrap(), None);
        assert!(catalog.history(None, 10).unwrap().is_empty());
        let c1 = checkpoint(5, "in", 0);
        let v = catalog.commit_checkpoint(
            0,
            c1.clone(),
            &[history(3, "a"), history(5, "b")],
            &[op("create table s.t", &[])],
        );
        assert_eq!(v.unwrap(), 1);
        assert_eq!(catalog.latest_checkpoint().unwrap(), Some(c1));
        let c2 = checkpoint(9, "in", 0);
        assert_eq!(catalog.commit_checkpoint(0, c2.clone(), &[history(8, "snapshot:1:s.t")], &[]).unwrap(), 2);
        assert_eq!(catalog.latest_checkpoint().unwrap(), Some(c2));
        assert_eq!(catalog.version().unwrap(), 2);
        let ids: Vec<String> = catalog.history(None, 10).unwrap().into_iter().map(|h| h.source_txid).collect();
        assert_eq!(ids, ["snapshot:1:s.t", "b", "a"]);
        assert_eq!(catalog.history(Some("s.u"), 1).unwrap(), vec![history(8, "snapshot:1:s.t")]);
        assert!(catalog.history(Some("s.zzz"), 10).unwrap().is_empty());
        let ops = catalog.operations(10).unwrap();
        assert_eq!(ops, vec![(1, op("create table s.t", &[]))]);
        // The window keeps the newest, and every snapshot run.
        let window = catalog.applied_identities(1).unwrap();
        assert_eq!(window, HashSet::from(["snapshot:1:s.t".to_owned()]));
        let all = catalog.applied_identities(10).unwrap();
        assert_eq!(all, HashSet::from(["a", "b", "snapshot:1:s.t"].map(str::to_owned)));
        let window = {
            catalog.commit(0, 2, &CatalogCommit { history: vec![history(10, "c")], ..Default::default() }).unwrap();
            catalog.applied_identities(1).unwrap()
        };
        assert_eq!(window, HashSet::from(["c", "snapshot:1:s.t"].map(str::to_owned)));
        // Only identities that start with the prefix, exactly, are
        // snapshot runs.
        let near = ["snapshot;1", "snapshot", "Snapshot:1", "snapshot:"];
        let history_near: Vec<HistoryEntry> = (12..).zip(near).map(|(ts, id)| history(ts, id)).collect();
        catalog.commit(0, 3, &CatalogCommit { history: history_near, ..Default::default() }).unwrap();
        let window = catalog.applied_identities(1).unwrap();
        assert_eq!(window, HashSet::from(["snapshot:", "snapshot:1:s.t"].map(str::to_owned)));
        // An identity applied again beyond the dedup window (a source
        // transaction id reused) is history like any other.
        catalog.commit(0, 4, &CatalogCommit { history: vec![history(16, "a")], ..Default::default() }).unwrap();
        assert_eq!(catalog.history(None, 1).unwrap(), vec![history(16, "a")]);
        // Versions are contiguous: neither an existing one nor a gap.
        assert!(matches!(catalog.put_version(0, 5, &CatalogCommit::default()), Err(Error::VersionExists { .. })));
        assert!(matches!(catalog.put_version(0, 9, &CatalogCommit::default()), Err(Error::VersionExists { .. })));
        assert_eq!(catalog.version().unwrap(), 5);
        // The storage-GC queue.
        let stale = |f: u64, deleted: usize| StaleFile { table: "s.t".into(), file: FileId(f), rows: 100, deleted };
        catalog.set_storage_gc_queue(0, &[stale(1, 10), stale(2, 60)]).unwrap();
        assert_eq!(catalog.storage_gc_queue().unwrap(), vec![stale(2, 60), stale(1, 10)]);
        catalog.set_storage_gc_queue(0, &[]).unwrap();
        assert!(catalog.storage_gc_queue().unwrap().is_empty());
    }

    fn fencing((txn, catalog): State) {
        let a = txn.acquire_lease("a", 1_000_000, crate::catalog::now_us(), None).unwrap();
        assert!(matches!(
            catalog.commit_checkpoint(0, checkpoint(1, "in", 0), &[], &[]),
            Err(Error::Fenced { epoch: 0, current: 1 })
        ));
        assert_eq!(catalog.commit_checkpoint(a.epoch, checkpoint(1, "in", 0), &[], &[]).unwrap(), 1);
        let b = txn.acquire_lease("b", 1_000_000, crate::catalog::now_us(), Some(a.epoch)).unwrap();
        assert!(matches!(
            catalog.commit_checkpoint(a.epoch, checkpoint(2, "in", 0), &[history(2, "x")], &[]),
            Err(Error::Fenced { .. })
        ));
        assert!(matches!(catalog.set_storage_gc_queue(a.epoch, &[]), Err(Error::Fenced { .. })));
        let everything = Retention { before_us: i64::MAX, keep_history: 0 };
        assert!(matches!(catalog.prune(a.epoch, &everything), Err(Error::Fenced { .. })));
        // Nothing of the refused commit landed.
        assert_eq!(catalog.version().unwrap(), 1);
        assert!(catalog.history(None, 10).unwrap().is_empty());
        assert_eq!(catalog.latest_checkpoint().unwrap().map(|c| c.manifest.checkpoint_ts), Some(1));
        assert_eq!(catalog.commit_checkpoint(b.epoch, checkpoint(3, "in", 0), &[], &[]).unwrap(), 2);
    }

    fn conflicts_and_rebases((_, catalog): State) {
        let files = |ids: &[u64]| CatalogCommit { operations: vec![op("combine", ids)], ..Default::default() };
        assert_eq!(catalog.commit(0, 0, &files(&[1, 2])).unwrap(), 1);
        // Read at 0, disjoint files: rebased onto 1.
        assert_eq!(catalog.commit(0, 0, &files(&[3])).unwrap(), 2);
        // Read at 0, a file changed since: refused.
        assert!(matches!(catalog.commit(0, 0, &files(&[2, 9])), Err(Error::CatalogConflict { read_version: 0, .. })));
        // Read at 2: nothing since, lands.
        assert_eq!(catalog.commit(0, 2, &files(&[2, 9])).unwrap(), 3);
        // Checkpoints conflict with checkpoints made since, not with files.
        let cp = |ts| CatalogCommit { checkpoint: Some(checkpoint(ts, "in", 0)), ..Default::default() };
        assert_eq!(catalog.commit(0, 0, &cp(4)).unwrap(), 4);
        assert!(matches!(catalog.commit(0, 3, &cp(5)), Err(Error::CatalogConflict { .. })));
        assert_eq!(catalog.commit(0, 4, &cp(5)).unwrap(), 5);
        assert_eq!(catalog.latest_checkpoint().unwrap().map(|c| c.manifest.checkpoint_ts), Some(5));
    }

    fn concurrent_committers_land_exactly_once((_, catalog): State) {
        // Four writers, each committing operations on its own files from
        // versions it read a while ago: every commit lands once, as one of
        // contiguous versions.
        let threads: Vec<_> = (0..4u64)
            .map(|w| {
                let catalog = Arc::clone(&catalog);
                std::thread::spawn(move || {
                    let mut landed = Vec::new();
                    for i in 0..6u64 {
                        let read = catalog.version().unwrap().saturating_sub(i % 3);
                        let commit = CatalogCommit {
                            operations: vec![op(&format!("w{w}-{i}"), &[w * 100 + i])],
                            ..Default::default()
                        };
                        landed.push(catalog.commit(0, read, &commit).unwrap());
                    }
                    landed
                })
            })
            .collect();
        let mut versions: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        versions.sort_unstable();
        assert_eq!(versions, (1..=24).collect::<Vec<_>>());
        let mut ops: Vec<String> = catalog.operations(100).unwrap().into_iter().map(|(_, o)| o.description).collect();
        ops.sort();
        let mut want: Vec<String> = (0..4).flat_map(|w| (0..6).map(move |i| format!("w{w}-{i}"))).collect();
        want.sort();
        assert_eq!(ops, want);
    }

    fn large_payloads((_, catalog): State) {
        // Past what one DynamoDB item holds: a big checkpoint and history.
        let big = checkpoint(7, "in", 600_000);
        let history: Vec<HistoryEntry> = (0..5000).map(|i| history(i, &format!("txn-{i}"))).collect();
        assert_eq!(catalog.commit_checkpoint(0, big.clone(), &history, &[]).unwrap(), 1);
        assert_eq!(catalog.latest_checkpoint().unwrap(), Some(big));
        assert_eq!(catalog.history(None, 3).unwrap().len(), 3);
        assert_eq!(catalog.applied_identities(10_000).unwrap().len(), 5000);
    }

    fn pruning((_, catalog): State) {
        let ids = |c: &dyn Catalog| -> Vec<String> {
            c.history(None, 100).unwrap().into_iter().map(|h| h.source_txid).collect()
        };
        // Nothing to prune in an empty catalog.
        let everything = Retention { before_us: i64::MAX, keep_history: 0 };
        assert_eq!(catalog.prune(0, &everything).unwrap().versions, 0);
        // Five versions, one history entry each; the third makes a big
        // checkpoint current (its record goes to the lake on DynamoDB).
        let one = |ts: u64, id: &str| CatalogCommit {
            operations: vec![op(id, &[ts])],
            history: vec![history(ts, id)],
            ..Default::default()
        };
        let big = checkpoint(3, "in", 600_000);
        catalog.commit(0, 0, &one(1, "a")).unwrap();
        catalog.commit(0, 1, &one(2, "snapshot:9:s.t")).unwrap();
        catalog.commit(0, 2, &CatalogCommit { checkpoint: Some(big.clone()), ..one(3, "b") }).unwrap();
        catalog.commit(0, 3, &one(4, "c")).unwrap();
        catalog.commit(0, 4, &one(5, "d")).unwrap();
        // A retention in the past keeps everything.
        let none = Retention { before_us: 0, keep_history: 0 };
        assert_eq!(catalog.prune(0, &none).unwrap().versions, 0);
        assert_eq!(catalog.summaries_since(0).unwrap().len(), 5);
        // Everything old, but the newest two transactions stay (the dedup
        // window): versions 1–3 go.
        let window = Retention { before_us: i64::MAX, keep_history: 2 };
        let pruned = catalog.prune(0, &window).unwrap();
        assert_eq!(pruned.versions, 3, "{pruned:?}");
        assert_eq!(catalog.version().unwrap(), 5);
        let kept = ids(&*catalog);
        assert!(kept.starts_with(&["d".to_owned(), "c".to_owned()]), "{kept:?}");
        assert!(!kept.iter().any(|id| id == "a" || id == "b"), "{kept:?}");
        // Snapshot runs are remembered whatever the pruning.
        assert_eq!(
            catalog.applied_identities(2).unwrap(),
            HashSet::from(["c", "d", "snapshot:9:s.t"].map(str::to_owned))
        );
        assert_eq!(catalog.latest_checkpoint().unwrap(), Some(big));
        let ops: Vec<u64> = catalog.operations(100).unwrap().into_iter().map(|(v, _)| v).collect();
        assert_eq!(ops, [5, 4]);
        // A commit made after reading a pruned version cannot be checked.
        assert!(matches!(catalog.summaries_since(1), Err(Error::CatalogConflict { read_version: 1, .. })));
        assert!(matches!(catalog.commit(0, 2, &one(6, "e")), Err(Error::CatalogConflict { read_version: 2, .. })));
        assert_eq!(catalog.summaries_since(3).unwrap().len(), 2);
        assert_eq!(catalog.commit(0, 3, &one(6, "e")).unwrap(), 6);
        // The newest version always stays, and pruning again is a no-op
        // until more ages out.
        let pruned = catalog.prune(0, &everything).unwrap();
        assert_eq!(pruned.versions, 2, "{pruned:?}");
        assert_eq!(catalog.version().unwrap(), 6);
        assert_eq!(catalog.summaries_since(5).unwrap().len(), 1);
        assert_eq!(catalog.prune(0, &everything).unwrap().versions, 0);
        assert_eq!(catalog.commit(0, 6, &one(7, "f")).unwrap(), 7);
        assert_eq!(catalog.applied_identities(1).unwrap(), HashSet::from(["f", "snapshot:9:s.t"].map(str::to_owned)));
    }
}
