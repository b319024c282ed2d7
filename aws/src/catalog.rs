//! The catalog on DynamoDB, in the lake's state table (beside the clock
//! item of [`crate::dynamo`]).
//!
//! | item (`pk` / `sk`) | holds |
//! |---|---|
//! | `head` / `head` | `version`: the newest version; `history_total` / `history_pruned`: history entries committed / pruned since counting began |
//! | `version` / 20-digit version | one version: `checkpoint` (bool), `files` (JSON), `history_count`, `created_us`, its operations and history (`payload`, JSON, or `payload_ref`: an object in the lake) |
//! | `checkpoint` / `current` | the current checkpoint record (`record` or `record_ref`) and its `version` |
//! | `snapshot` / identity | every snapshot run ever replayed (dedup keeps them forever) |
//! | `gcqueue` / `queue` | the storage-GC queue (`files`, JSON) |
//!
//! A version lands in one `TransactWriteItems`: a condition check that the
//! clock item still holds the writer's epoch, the head moved from `v − 1`
//! to `v` on condition, the version item created on condition that it does
//! not exist, the checkpoint item and the snapshot identities. So versions
//! are contiguous, a version lands whole or not at all, and a fenced writer
//! lands nothing. Payloads larger than [`INLINE_LIMIT`] (items hold 400 KB)
//! are written to the lake first, under a name no other writer uses, and
//! referenced; a commit that then fails deletes them again.
//!
//! Pruning deletes the oldest version items past the retention in
//! transactions fenced like commits (each also adds what it removed to the
//! head's `history_pruned`, so the history still stored is known without
//! reading it), then the payload objects of versions gone and the records
//! of checkpoints no longer current — by the version their names carry,
//! so orphans of commits whose outcome was never known go too.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, Delete, Put, TransactWriteItem, Update};
use bytes::Bytes;
use object_store::ObjectStore;
use object_store::path::Path;

use fovea_core::catalog::{
    Catalog, CatalogCommit, CatalogOperation, CheckpointRecord, HistoryEntry, Pruned, Retention,
    SNAPSHOT_IDENTITY_PREFIX, VersionSummary, now_us, pruned_since,
};
use fovea_core::engine::StaleFile;
use fovea_core::lake::{Lake, block_on_io};
use fovea_core::{Error, Result};

use crate::dynamo::{CLOCK, DynamoState, EPOCH_HOLDS, Item, backend_error, describe, n, num, num_i};

/// Largest payload kept inside an item; larger ones go to the lake.
pub const INLINE_LIMIT: usize = 300 << 10;

/// Where referenced payloads live in the lake.
const PAYLOAD_PREFIX: &str = "_fovea/catalog";

/// The catalog of a lake on DynamoDB.
pub struct DynamoCatalog {
    state: DynamoState,
    lake: Lake,
}

/// A version's operations and history, as stored.
#[derive(serde::Serialize, serde::Deserialize)]
struct Payload {
    operations: Vec<CatalogOperation>,
    history: Vec<HistoryEntry>,
}

fn version_key(v: u64) -> String {
    format!("{v:020}")
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn string(item: &Item, name: &str) -> Option<String> {
    match item.get(name) {
        Some(AttributeValue::S(s)) => Some(s.clone()),
        _ => None,
    }
}

fn corrupt(what: String, e: impl std::fmt::Display) -> Error {
    Error::Corrupt { what, reason: e.to_string() }
}

/// Version items deleted per pruning transaction (DynamoDB takes 100
/// actions; two are the epoch check and the head's count).
const PRUNE_BATCH: usize = 98;
/// Pruning transactions per [`Catalog::prune`] call: a long backlog (a lake
/// pruned for the first time) goes over several checkpoints, none held
/// back long.
const PRUNE_BATCHES_PER_CALL: usize = 16;

/// The version a payload object's name carries (`KIND-VERSION-…`), and its
/// kind.
fn payload_version(path: &Path) -> Option<(&str, u64)> {
    let name = path.filename()?;
    let (kind, rest) = name.split_once('-')?;
    let version = rest.get(..20)?.parse().ok()?;
    Some((kind, version))
}

/// A name for a payload object that no other writer picks.
fn payload_path(kind: &str, version: u64) -> Path {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    // Relaxed: only uniqueness within this process matters; the owner id
    // tells processes apart.
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let owner = fovea_core::lease::owner_id().replace('/', "-");
    Path::from(format!("{PAYLOAD_PREFIX}/{kind}-{}-{owner}-{seq}.json", version_key(version)))
}

impl DynamoCatalog {
    /// The catalog in `state`'s table; large payloads go to `store` (the
    /// lake's object store).
    pub fn new(state: DynamoState, store: Arc<dyn ObjectStore>) -> Self {
        DynamoCatalog { state, lake: Lake::new(store) }
    }

    fn key_str(&self, pk: &str, sk: &str) -> String {
        format!("{}/{pk}/{sk}", self.state.table())
    }

    /// Every item of partition `pk` with a sort key above `after`, ascending.
    fn query(&self, pk: &str, after: Option<&str>) -> Result<Vec<Item>> {
        let mut out = Vec::new();
        self.state.visit(pk, after, false, |item| {
            out.push(item.clone());
            Ok(true)
        })?;
        Ok(out)
    }

    /// The payload of a version item (inline or in the lake).
    fn payload(&self, item: &Item) -> Result<(u64, Payload)> {
        let version = num(item, "version")?;
        let text = self.text_of(item, "payload", &format!("payload of catalog version {version}"))?;
        let payload =
            serde_json::from_str(&text).map_err(|e| corrupt(format!("payload of catalog version {version}"), e))?;
        Ok((version, payload))
    }

    /// The text [`Self::inline_or_ref`] stored under `attr`: inline, or
    /// read from the lake object `<attr>_ref` names.
    fn text_of(&self, item: &Item, attr: &str, what: &str) -> Result<String> {
        match (string(item, attr), string(item, &format!("{attr}_ref"))) {
            (Some(text), _) => Ok(text),
            (None, Some(r)) => String::from_utf8(self.lake.get(&Path::from(r.as_str()))?.to_vec())
                .map_err(|e| corrupt(format!("{what} at {r}"), e)),
            (None, None) => Err(corrupt(what.to_owned(), format!("neither {attr} nor {attr}_ref"))),
        }
    }

    /// Versions newest first, with their payloads, while `more` says so.
    fn newest_payloads(&self, mut more: impl FnMut(u64, Payload) -> bool) -> Result<()> {
        self.state.visit("version", None, true, |item| {
            let (version, payload) = self.payload(item)?;
            Ok(more(version, payload))
        })
    }

    /// Stores `text` inline under `attr`, or in the lake under
    /// `attr_ref` when large; returns the attribute and the object written.
    fn inline_or_ref(
        &self,
        attr: &str,
        kind: &str,
        version: u64,
        text: String,
    ) -> Result<((String, AttributeValue), Option<Path>)> {
        if text.len() <= INLINE_LIMIT {
            return Ok(((attr.to_owned(), s(text)), None));
        }
        let path = payload_path(kind, version);
        self.lake.put(&path, Bytes::from(text))?;
        Ok(((format!("{attr}_ref"), s(path.to_string())), Some(path)))
    }

    /// Runs one transaction: `Ok(Err(reasons))` when it was cancelled by
    /// its conditions (one code per item). A cancellation by a concurrent
    /// transaction on the same items (`TransactionConflict`) is retried.
    fn transact(
        &self,
        items: Vec<TransactWriteItem>,
        what: &str,
    ) -> Result<std::result::Result<(), Vec<Option<String>>>> {
        // Conflicts: up to 10 retries, 20 ms doubling to 1 s, with jitter
        // (writers that conflicted do not retry in step).
        let mut delays = {
            use backon::BackoffBuilder as _;
            backon::ExponentialBuilder::default()
                .with_min_delay(std::time::Duration::from_millis(20))
                .with_max_delay(std::time::Duration::from_secs(1))
                .with_factor(2.0)
                .with_jitter()
                .with_max_times(10)
                .build()
        };
        loop {
            // The SDK gives the request an idempotency token, kept across
            // its own retries: a retried commit that had landed is no
            // failure.
            let request = self.state.client.transact_write_items().set_transact_items(Some(items.clone()));
            // Re-sent while its outcome is unknown (the callers recognise
            // a transaction refused because its own first send landed).
            let out = crate::dynamo::send_write(|| {
                let request = request.clone();
                block_on_io(async move { request.send().await })
            })?;
            let reasons = match out {
                Ok(_) => return Ok(Ok(())),
                Err(e) => match e.as_service_error() {
                    Some(TransactWriteItemsError::TransactionCanceledException(c)) => {
                        c.cancellation_reasons().iter().map(|r| r.code().map(str::to_owned)).collect::<Vec<_>>()
                    }
                    _ => return Err(backend_error("TransactWriteItems", &self.key_str(what, "*"), describe(&e))),
                },
            };
            let conflict = reasons.iter().any(|r| r.as_deref() == Some("TransactionConflict"));
            match delays.next() {
                Some(delay) if conflict => std::thread::sleep(delay),
                _ => return Ok(Err(reasons)),
            }
        }
    }

    fn epoch_check(&self, epoch: u64) -> Result<TransactWriteItem> {
        let check = ConditionCheck::builder()
            .table_name(self.state.table())
            .set_key(Some(DynamoState::key(CLOCK, CLOCK)))
            .condition_expression(EPOCH_HOLDS)
            .expression_attribute_names("#epoch", "epoch")
            .expression_attribute_values(":epoch", n(epoch))
            .expression_attribute_values(":zero", n(0))
            .build()
            .map_err(|e| Error::Invariant(e.to_string()))?;
        Ok(TransactWriteItem::builder().condition_check(check).build())
    }

    fn current_epoch(&self) -> Result<u64> {
        self.state.get(CLOCK, CLOCK)?.map_or(Ok(0), |i| num(&i, "epoch"))
    }

    /// Deletes the payload objects of versions below `first_kept` (pruned:
    /// named by no item) and the records of checkpoints older than the
    /// current one (replaced: named by no item), orphans included.
    fn prune_objects(&self, first_kept: u64, pruned: &mut Pruned) -> Result<()> {
        let current = match self.state.get("checkpoint", "current")? {
            Some(item) => Some((num(&item, "version")?, string(&item, "record_ref"))),
            None => None,
        };
        for object in self.lake.list(&Path::from(PAYLOAD_PREFIX))? {
            let Some((kind, version)) = payload_version(&object.location) else { continue };
            let gone = match kind {
                "version" => version < first_kept,
                "checkpoint" => current
                    .as_ref()
                    .is_some_and(|(v, record)| version < *v && record.as_deref() != Some(object.location.as_ref())),
                _ => false,
            };
            if gone {
                self.lake.delete(&object.location)?;
                pruned.objects += 1;
            }
        }
        Ok(())
    }

    fn put(&self, item: Item, condition: Option<&str>) -> Result<TransactWriteItem> {
        let mut put = Put::builder().table_name(self.state.table()).set_item(Some(item));
        if let Some(c) = condition {
            put = put.condition_expression(c);
        }
        Ok(TransactWriteItem::builder().put(put.build().map_err(|e| Error::Invariant(e.to_string()))?).build())
    }
}

impl Catalog for DynamoCatalog {
    fn version(&self) -> Result<u64> {
        self.state.get("head", "head")?.map_or(Ok(0), |i| num(&i, "version"))
    }

    fn summaries_since(&self, after: u64) -> Result<Vec<VersionSummary>> {
        let summaries = self
            .query("version", Some(&version_key(after)))?
            .iter()
            .map(|item| {
                let version = num(item, "version")?;
                let files: BTreeSet<u64> = serde_json::from_str(&string(item, "files").unwrap_or_else(|| "[]".into()))
                    .map_err(|e| corrupt(format!("files of catalog version {version}"), e))?;
                let checkpoint = matches!(item.get("checkpoint"), Some(AttributeValue::Bool(true)));
                Ok(VersionSummary { version, checkpoint, files })
            })
            .collect::<Result<Vec<_>>>()?;
        match summaries.first() {
            Some(first) if first.version > after + 1 => Err(pruned_since(after, first.version)),
            _ => Ok(summaries),
        }
    }

    fn put_version(&self, epoch: u64, version: u64, commit: &CatalogCommit) -> Result<()> {
        let mut written = Vec::new();
        // Names this attempt's version item: after an error whose outcome is
        // unknown (a timeout after the transaction landed), reading the item
        // back tells whether it was this commit that landed.
        let nonce = crate::dynamo::reservation_nonce();
        let mut outcome_unknown = false;
        let result = (|| {
            let payload = serde_json::to_string(&Payload {
                operations: commit.operations.clone(),
                history: commit.history.clone(),
            })
            .map_err(|e| Error::Invariant(e.to_string()))?;
            let (payload_attr, object) = self.inline_or_ref("payload", "version", version, payload)?;
            written.extend(object);
            let mut item = DynamoState::key("version", &version_key(version));
            item.insert("version".into(), n(version));
            item.insert("checkpoint".into(), AttributeValue::Bool(commit.checkpoint.is_some()));
            item.insert(
                "files".into(),
                s(serde_json::to_string(&commit.files()).map_err(|e| Error::Invariant(e.to_string()))?),
            );
            item.insert("epoch".into(), n(epoch));
            item.insert("history_count".into(), n(commit.history.len() as u64));
            item.insert("created_us".into(), AttributeValue::N(now_us().to_string()));
            item.insert("nonce".into(), s(nonce.clone()));
            item.insert(payload_attr.0, payload_attr.1);
            let head = Update::builder()
                .table_name(self.state.table())
                .set_key(Some(DynamoState::key("head", "head")))
                .update_expression("SET #version = :v ADD #total :count")
                .condition_expression("#version = :prev OR (attribute_not_exists(#version) AND :prev = :zero)")
                .expression_attribute_names("#version", "version")
                .expression_attribute_names("#total", "history_total")
                .expression_attribute_values(":v", n(version))
                .expression_attribute_values(":count", n(commit.history.len() as u64))
                .expression_attribute_values(":prev", n(version.saturating_sub(1)))
                .expression_attribute_values(":zero", n(0))
                .build()
                .map_err(|e| Error::Invariant(e.to_string()))?;
            let mut items = vec![
                self.epoch_check(epoch)?,
                TransactWriteItem::builder().update(head).build(),
                self.put(item, Some("attribute_not_exists(pk)"))?,
            ];
            if let Some(c) = &commit.checkpoint {
                let text = serde_json::to_string(c).map_err(|e| Error::Invariant(e.to_string()))?;
                let (record_attr, object) = self.inline_or_ref("record", "checkpoint", version, text)?;
                written.extend(object);
                let mut cp = DynamoState::key("checkpoint", "current");
                cp.insert("version".into(), n(version));
                cp.insert(record_attr.0, record_attr.1);
                items.push(self.put(cp, None)?);
            }
            let snapshots: Vec<&str> = commit
                .history
                .iter()
                .map(|h| h.source_txid.as_str())
                .filter(|id| id.starts_with(SNAPSHOT_IDENTITY_PREFIX))
                .collect();
            if items.len() + snapshots.len() > 100 {
                return Err(Error::Invariant(format!(
                    "one catalog commit holds {} snapshot runs; at most {} fit one DynamoDB transaction",
                    snapshots.len(),
                    100 - items.len()
                )));
            }
            for id in snapshots {
                let mut it = DynamoState::key("snapshot", id);
                it.insert("version".into(), n(version));
                items.push(self.put(it, None)?);
            }
            let transacted = match self.transact(items, "version") {
                Ok(t) => t,
                Err(e) => {
                    outcome_unknown = true;
                    return Err(e);
                }
            };
            match transacted {
                Ok(()) => Ok(()),
                Err(reasons) => {
                    let failed = |i: usize| reasons.get(i).and_then(Option::as_deref) == Some("ConditionalCheckFailed");
                    if failed(0) {
                        Err(Error::Fenced { epoch, current: self.current_epoch()? })
                    } else if failed(1) || failed(2) {
                        Err(Error::VersionExists { version, newest: self.version()? })
                    } else {
                        Err(backend_error(
                            "TransactWriteItems",
                            &self.key_str("version", &version_key(version)),
                            format!("cancelled: {reasons:?}"),
                        ))
                    }
                }
            }
        })();
        // Whether this commit's version item is there (its nonce names it).
        let landed = || {
            self.state
                .get("version", &version_key(version))
                .map(|item| item.is_some_and(|item| string(&item, "nonce").as_deref() == Some(nonce.as_str())))
        };
        match result {
            Ok(()) => Ok(()),
            // The transaction may have landed: its outcome is unknown, or it
            // was refused because the version exists — perhaps by this very
            // commit, landed by a send whose answer was lost (a re-send then
            // fails the conditions).
            Err(e) if outcome_unknown || matches!(e, Error::VersionExists { .. } | Error::Fenced { .. }) => {
                match landed() {
                    Ok(true) => {
                        tracing::warn!(version, error = %e, "a catalog commit reported failed had landed");
                        Ok(())
                    }
                    // Refused, and not this commit's: its payloads are
                    // nobody's.
                    Ok(false) if !outcome_unknown => {
                        for p in written {
                            let _ = self.lake.delete(&p);
                        }
                        Err(e)
                    }
                    // Not landed, or unknown still: its payloads stay (a
                    // late landing would name them); an orphan costs one
                    // object, a deleted payload a lake that does not open.
                    _ => Err(e),
                }
            }
            Err(e) => {
                // Refused by its conditions, or never sent: its payloads
                // are nobody's.
                for p in written {
                    let _ = self.lake.delete(&p);
                }
                Err(e)
            }
        }
    }

    fn latest_checkpoint(&self) -> Result<Option<CheckpointRecord>> {
        let Some(item) = self.state.get("checkpoint", "current")? else { return Ok(None) };
        let text = self.text_of(&item, "record", "the current checkpoint record")?;
        serde_json::from_str(&text).map(Some).map_err(|e| corrupt("the current checkpoint record".into(), e))
    }

    fn history(&self, table: Option<&str>, limit: usize) -> Result<Vec<HistoryEntry>> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.newest_payloads(|_, payload| {
            for h in payload.history.into_iter().rev() {
                if table.is_none_or(|t| h.tables.iter().any(|(name, _)| name == t)) {
                    out.push(h);
                }
                if out.len() >= limit {
                    return false;
                }
            }
            true
        })?;
        Ok(out)
    }

    fn operations(&self, limit: usize) -> Result<Vec<(u64, CatalogOperation)>> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.newest_payloads(|version, payload| {
            for op in payload.operations.into_iter().rev() {
                out.push((version, op));
                if out.len() >= limit {
                    return false;
                }
            }
            true
        })?;
        Ok(out)
    }

    fn applied_identities(&self, window: usize) -> Result<HashSet<String>> {
        let mut out = HashSet::new();
        let mut seen = 0usize;
        if window > 0 {
            self.newest_payloads(|_, payload| {
                for h in payload.history.into_iter().rev() {
                    out.insert(h.source_txid);
                    seen += 1;
                    if seen >= window {
                        return false;
                    }
                }
                true
            })?;
        }
        for item in self.query("snapshot", None)? {
            if let Some(id) = string(&item, "sk") {
                out.insert(id);
            }
        }
        Ok(out)
    }

    fn set_storage_gc_queue(&self, epoch: u64, files: &[StaleFile]) -> Result<()> {
        let rows: Vec<(String, u64, usize, usize)> =
            files.iter().map(|f| (f.table.clone(), f.file.0, f.rows, f.deleted)).collect();
        let mut item = DynamoState::key("gcqueue", "queue");
        let text = serde_json::to_string(&rows).map_err(|e| Error::Invariant(e.to_string()))?;
        // A long queue goes to the lake, as large payloads do (an item holds
        // 400 KB); the object of the queue it replaces goes once it landed.
        let previous = self.state.get("gcqueue", "queue")?.and_then(|i| string(&i, "files_ref"));
        let ((attr, value), object) = self.inline_or_ref("files", "gcqueue", epoch, text)?;
        item.insert(attr, value);
        match self.transact(vec![self.epoch_check(epoch)?, self.put(item, None)?], "gcqueue") {
            Ok(Ok(())) => {
                if let Some(p) = previous {
                    let _ = self.lake.delete(&Path::from(p.as_str()));
                }
                Ok(())
            }
            Ok(Err(_)) => {
                if let Some(o) = &object {
                    let _ = self.lake.delete(o);
                }
                Err(Error::Fenced { epoch, current: self.current_epoch()? })
            }
            // Unknown outcome: the object may be named now; it stays.
            Err(e) => Err(e),
        }
    }

    fn prune(&self, epoch: u64, retention: &Retention) -> Result<Pruned> {
        let mut pruned = Pruned::default();
        // Each deleting transaction checks the epoch too; this read refuses
        // a fenced pruner that would delete objects only.
        let current = self.current_epoch()?;
        if current != epoch {
            return Err(Error::Fenced { epoch, current });
        }
        let Some(head) = self.state.get("head", "head")? else { return Ok(pruned) };
        let newest = num(&head, "version")?;
        // History entries stored (counted since lakes count them: fewer,
        // never more, so the window is never cut short).
        let mut stored = num(&head, "history_total")?.saturating_sub(num(&head, "history_pruned")?);
        let keep = retention.keep_history as u64;
        // Cancelled transactions (a concurrent pruner took some items
        // first) are read again, a few times.
        let (mut batches, mut cancelled) = (0, 0);
        loop {
            // The oldest versions that may go, one batch of them.
            let mut doomed: Vec<(u64, u64, Option<String>)> = Vec::new();
            let mut first_kept = newest;
            self.state.visit("version", None, false, |item| {
                let version = num(item, "version")?;
                let count = match item.get("history_count") {
                    Some(_) => num(item, "history_count")?,
                    None => self.payload(item)?.1.history.len() as u64,
                };
                let old = version < newest && num_i(item, "created_us")? < retention.before_us;
                if !old || stored.saturating_sub(count) < keep || doomed.len() == PRUNE_BATCH {
                    first_kept = version;
                    return Ok(false);
                }
                stored -= count;
                doomed.push((version, count, string(item, "payload_ref")));
                Ok(true)
            })?;
            if doomed.is_empty() || batches == PRUNE_BATCHES_PER_CALL {
                // Stopping short, the oldest version left is the first of
                // those this round would have deleted.
                let first_kept = doomed.first().map_or(first_kept, |d| d.0);
                self.prune_objects(first_kept, &mut pruned)?;
                return Ok(pruned);
            }
            batches += 1;
            let removed: u64 = doomed.iter().map(|d| d.1).sum();
            let head = Update::builder()
                .table_name(self.state.table())
                .set_key(Some(DynamoState::key("head", "head")))
                .update_expression("ADD #pruned :removed")
                .expression_attribute_names("#pruned", "history_pruned")
                .expression_attribute_values(":removed", n(removed))
                .build()
                .map_err(|e| Error::Invariant(e.to_string()))?;
            let mut items = vec![self.epoch_check(epoch)?, TransactWriteItem::builder().update(head).build()];
            for (version, _, _) in &doomed {
                let delete = Delete::builder()
                    .table_name(self.state.table())
                    .set_key(Some(DynamoState::key("version", &version_key(*version))))
                    .condition_expression("attribute_exists(pk)")
                    .build()
                    .map_err(|e| Error::Invariant(e.to_string()))?;
                items.push(TransactWriteItem::builder().delete(delete).build());
            }
            match self.transact(items, "version")? {
                Ok(()) => {}
                Err(reasons) if reasons.first().and_then(Option::as_deref) == Some("ConditionalCheckFailed") => {
                    return Err(Error::Fenced { epoch, current: self.current_epoch()? });
                }
                Err(reasons) if cancelled < 3 => {
                    // Another pruner took some of them first: read again.
                    cancelled += 1;
                    tracing::debug!("a catalog prune was cancelled ({reasons:?}); reading the versions again");
                    continue;
                }
                Err(reasons) => {
                    return Err(backend_error(
                        "TransactWriteItems",
                        &self.key_str("version", "*"),
                        format!("pruning cancelled again and again: {reasons:?}"),
                    ));
                }
            }
            pruned.versions += doomed.len() as u64;
            pruned.history += removed;
            for r in doomed.iter().filter_map(|d| d.2.as_deref()) {
                self.lake.delete(&Path::from(r))?;
                pruned.objects += 1;
            }
        }
    }

    fn storage_gc_queue(&self) -> Result<Vec<StaleFile>> {
        let Some(item) = self.state.get("gcqueue", "queue")? else { return Ok(Vec::new()) };
        let text = match (string(&item, "files"), string(&item, "files_ref")) {
            (None, None) => String::new(),
            _ => self.text_of(&item, "files", "the storage-GC queue")?,
        };
        let rows: Vec<(String, u64, usize, usize)> =
            serde_json::from_str(&text).map_err(|e| corrupt("the storage-GC queue".into(), e))?;
        let mut files: Vec<StaleFile> = rows
            .into_iter()
            .map(|(table, file, rows, deleted)| StaleFile { table, file: fovea_core::FileId(file), rows, deleted })
            .collect();
        files.sort_by(|a, b| {
            let f = |x: &StaleFile| x.deleted as f64 / x.rows.max(1) as f64;
            f(b).total_cmp(&f(a))
        });
        Ok(files)
    }
}
