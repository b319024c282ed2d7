//! Fault injection for testing: wrappers of a lake's backends (object
//! store, [`TxnStore`], [`Catalog`]) that fail requests the way S3 and
//! DynamoDB do, so tests can prove that replay and serve either get through
//! (retries) or stop with a clear error, and that after a restart the tables
//! are exact.
//!
//! A [`FaultPlan`] is written `seed=N,errors=P,after=P,latency_ms=N,multipart=P,deletes=P,checkpoints=P`
//! (every part optional; `FOVEA_FAULTS` in the `fovea` command line):
//!
//! | fault | what it imitates | effect |
//! |---|---|---|
//! | `errors=P` | throttling, 5xx, a connection refused | with probability P a request fails before it does anything |
//! | `after=P` | a timeout after the service applied a write | with probability P a write (put, delete, conditional update, catalog commit) is applied, then reported failed |
//! | `latency_ms=N` | a slow network | every request waits up to N ms (uniform) |
//! | `multipart=P` | an upload cut off part-way | with probability P a multipart upload fails at completion: its parts were sent, the object never appears |
//! | `deletes=P` | clean-up denied | with probability P deleting an object fails |
//! | `checkpoints=P` | a checkpoint that cannot be written | with probability P writing a checkpoint object (under `_fovea/checkpoints/`) fails before it is applied |
//!
//! Faults are drawn from one seeded generator per plan, so a run is
//! reproducible up to thread interleaving. Never for production lakes.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::catalog::{Catalog, CatalogCommit, CatalogOperation, CheckpointRecord, HistoryEntry, VersionSummary};
use crate::engine::StaleFile;
use crate::error::{Error, Result};
use crate::ids::Ts;
use crate::location::LakeBackends;
use crate::mvcc::{Lease, PersistedClock, ReaderLease, TxnStore};

/// Which faults to inject, and how often (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    /// Seed of the fault generator.
    pub seed: u64,
    /// Probability that a request fails before doing anything.
    pub errors: f64,
    /// Probability that a write is applied, then reported failed.
    pub after: f64,
    /// Upper bound of the latency added to each request.
    pub latency: Duration,
    /// Probability that a multipart upload fails at completion.
    pub multipart: f64,
    /// Probability that deleting an object fails (clean-up of old
    /// checkpoints and retired blocks), besides `errors`.
    pub deletes: f64,
    /// Probability that writing a checkpoint object fails, besides `errors`
    /// (checkpoints fail while everything else works).
    pub checkpoints: f64,
}

impl FaultPlan {
    /// Parses `seed=N,errors=P,after=P,latency_ms=N,multipart=P,deletes=P,checkpoints=P`.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |why: String| Error::Source {
            input: "FOVEA_FAULTS".into(),
            message: format!(
                "{why} (expected seed=N,errors=P,after=P,latency_ms=N,multipart=P,deletes=P,checkpoints=P)"
            ),
        };
        let mut plan = FaultPlan::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| bad(format!("{part}: no value")))?;
            let probability = || {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| bad(format!("{key}={value}: expected 0..=1")))
            };
            match key {
                "seed" => plan.seed = value.parse().map_err(|_| bad(format!("seed={value}")))?,
                "errors" => plan.errors = probability()?,
                "after" => plan.after = probability()?,
                "multipart" => plan.multipart = probability()?,
                "deletes" => plan.deletes = probability()?,
                "checkpoints" => plan.checkpoints = probability()?,
                "latency_ms" => {
                    plan.latency = Duration::from_millis(value.parse().map_err(|_| bad(format!("latency_ms={value}")))?)
                }
                _ => return Err(bad(format!("unknown fault {key}"))),
            }
        }
        Ok(plan)
    }

    /// `backends` with this plan's faults injected into each of them.
    pub fn inject(&self, backends: LakeBackends) -> LakeBackends {
        let dice = Dice::new(self);
        LakeBackends {
            store: Arc::new(FaultyStore { inner: backends.store, dice: dice.clone() }),
            txn: Arc::new(FaultyTxnStore { inner: backends.txn, dice: dice.clone() }),
            catalog: Arc::new(FaultyCatalog { inner: backends.catalog, dice }),
        }
    }
}

/// The shared fault generator of one plan.
#[derive(Clone, Debug)]
struct Dice {
    plan: FaultPlan,
    rng: Arc<Mutex<SmallRng>>,
}

impl Dice {
    fn new(plan: &FaultPlan) -> Self {
        Dice { plan: plan.clone(), rng: Arc::new(Mutex::new(SmallRng::seed_from_u64(plan.seed))) }
    }

    fn roll(&self, p: f64) -> bool {
        p > 0.0 && self.rng.lock().unwrap_or_else(|e| e.into_inner()).random_bool(p)
    }

    fn delay(&self) -> Duration {
        if self.plan.latency.is_zero() {
            return Duration::ZERO;
        }
        let max = self.plan.latency.as_micros() as u64;
        Duration::from_micros(self.rng.lock().unwrap_or_else(|e| e.into_inner()).random_range(0..=max))
    }

    /// Before a request: the latency, then maybe a failure.
    fn before(&self, op: &str) -> Result<(), String> {
        std::thread::sleep(self.delay());
        if self.roll(self.plan.errors) {
            Err(format!("injected fault: {op} failed before it was applied"))
        } else {
            Ok(())
        }
    }

    /// After a write was applied: maybe report it failed.
    fn after(&self, op: &str) -> Result<(), String> {
        if self.roll(self.plan.after) {
            Err(format!("injected fault: {op} was applied, then reported failed (a timeout)"))
        } else {
            Ok(())
        }
    }

    /// A state request (`f`) that may fail before it is made.
    fn read<T>(&self, op: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.before(op).map_err(|m| backend_fault(op, m))?;
        f()
    }

    /// A state write (`f`) that may fail before it is made, or be made and
    /// then reported failed.
    fn write<T>(&self, op: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let out = self.read(op, f)?;
        self.after(op).map_err(|m| backend_fault(op, m))?;
        Ok(out)
    }

    /// Before writing `location`: maybe fail it, if it is a checkpoint's.
    fn checkpoint_write(&self, location: &Path) -> object_store::Result<()> {
        if location.as_ref().starts_with("_fovea/checkpoints/") && self.roll(self.plan.checkpoints) {
            return Err(store_fault(format!("injected fault: writing checkpoint object {location} failed")));
        }
        Ok(())
    }

    async fn before_async(&self, op: &str) -> object_store::Result<()> {
        tokio::time::sleep(self.delay()).await;
        if self.roll(self.plan.errors) {
            Err(store_fault(format!("injected fault: {op} failed before it was applied")))
        } else {
            Ok(())
        }
    }
}

fn store_fault(message: String) -> object_store::Error {
    object_store::Error::Generic { store: "fault-injection", source: message.into() }
}

fn backend_fault(operation: &str, message: String) -> Error {
    Error::Backend { backend: "fault-injection", operation: operation.into(), key: "FOVEA_FAULTS".into(), message }
}

/// An object store that injects faults into `inner`'s requests.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    dice: Dice,
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    dice: Dice,
}

#[async_trait]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> object_store::UploadPart {
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        if self.dice.roll(self.dice.plan.multipart) {
            // The parts were sent; the object never appears.
            self.inner.abort().await?;
            return Err(store_fault("injected fault: a multipart upload was cut off before it completed".into()));
        }
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.dice.before_async(&format!("put {location}")).await?;
        self.dice.checkpoint_write(location)?;
        let put = self.inner.put_opts(location, payload, opts).await?;
        self.dice.after(&format!("put {location}")).map_err(store_fault)?;
        Ok(put)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.dice.before_async(&format!("multipart upload {location}")).await?;
        self.dice.checkpoint_write(location)?;
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(FaultyUpload { inner, dice: self.dice.clone() }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.dice.before_async(&format!("get {location}")).await?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.dice.before_async(&format!("get ranges of {location}")).await?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let dice = self.dice.clone();
        let checked = locations
            .and_then(move |path| {
                let dice = dice.clone();
                async move {
                    dice.before_async(&format!("delete {path}")).await?;
                    if dice.roll(dice.plan.deletes) {
                        return Err(store_fault(format!("injected fault: delete {path} failed")));
                    }
                    Ok(path)
                }
            })
            .boxed();
        let dice = self.dice.clone();
        self.inner
            .delete_stream(checked)
            .map(move |r| r.and_then(|path| dice.after(&format!("delete {path}")).map(|()| path).map_err(store_fault)))
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if self.dice.roll(self.dice.plan.errors) {
            let prefix = prefix.map(|p| p.to_string()).unwrap_or_default();
            return futures::stream::once(
                async move { Err(store_fault(format!("injected fault: list {prefix} failed"))) },
            )
            .boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.dice.before_async("list").await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.dice.before_async(&format!("copy {from}")).await?;
        self.inner.copy_opts(from, to, options).await?;
        self.dice.after(&format!("copy {from}")).map_err(store_fault)
    }
}

/// A [`TxnStore`] that injects faults into `inner`'s requests.
struct FaultyTxnStore {
    inner: Arc<dyn TxnStore>,
    dice: Dice,
}

impl TxnStore for FaultyTxnStore {
    fn load(&self) -> Result<PersistedClock> {
        self.dice.read("load the clock", || self.inner.load())
    }
    fn lease(&self) -> Result<Option<Lease>> {
        self.dice.read("read the lease", || self.inner.lease())
    }
    fn acquire_lease(&self, owner: &str, ttl_us: i64, now_us: i64, take_over: Option<u64>) -> Result<Lease> {
        self.dice.write("acquire the lease", || self.inner.acquire_lease(owner, ttl_us, now_us, take_over))
    }
    fn renew_lease(&self, epoch: u64, ttl_us: i64, now_us: i64) -> Result<Lease> {
        self.dice.write("renew the lease", || self.inner.renew_lease(epoch, ttl_us, now_us))
    }
    fn release_lease(&self, epoch: u64) -> Result<()> {
        self.dice.write("release the lease", || self.inner.release_lease(epoch))
    }
    fn reserve(&self, epoch: u64, from: Ts, upto: Ts) -> Result<()> {
        self.dice.write("reserve timestamps", || self.inner.reserve(epoch, from, upto))
    }
    fn save_watermarks(&self, epoch: u64, hwm: Ts, lwm: Ts) -> Result<()> {
        self.dice.write("save watermarks", || self.inner.save_watermarks(epoch, hwm, lwm))
    }
    fn register_reader(&self, id: &str, qts: Ts, expires_us: i64) -> Result<()> {
        self.dice.write("register a reader", || self.inner.register_reader(id, qts, expires_us))
    }
    fn deregister_reader(&self, id: &str) -> Result<()> {
        self.dice.write("deregister a reader", || self.inner.deregister_reader(id))
    }
    fn readers(&self, now_us: i64) -> Result<Vec<ReaderLease>> {
        self.dice.read("list readers", || self.inner.readers(now_us))
    }
    fn lake_id(&self) -> Result<Option<String>> {
        self.dice.read("read the lake id", || self.inner.lake_id())
    }
    fn bind_lake(&self, id: &str) -> Result<String> {
        self.dice.write("bind the state to its lake", || self.inner.bind_lake(id))
    }
}

/// A [`Catalog`] that injects faults into `inner`'s requests.
struct FaultyCatalog {
    inner: Arc<dyn Catalog>,
    dice: Dice,
}

impl Catalog for FaultyCatalog {
    fn version(&self) -> Result<u64> {
        self.dice.read("read the catalog version", || self.inner.version())
    }
    fn summaries_since(&self, after: u64) -> Result<Vec<VersionSummary>> {
        self.dice.read("read catalog versions", || self.inner.summaries_since(after))
    }
    fn put_version(&self, epoch: u64, version: u64, commit: &CatalogCommit) -> Result<()> {
        self.dice.write("commit a catalog version", || self.inner.put_version(epoch, version, commit))
    }
    fn latest_checkpoint(&self) -> Result<Option<CheckpointRecord>> {
        self.dice.read("read the latest checkpoint", || self.inner.latest_checkpoint())
    }
    fn history(&self, table: Option<&str>, limit: usize) -> Result<Vec<HistoryEntry>> {
        self.dice.read("read history", || self.inner.history(table, limit))
    }
    fn operations(&self, limit: usize) -> Result<Vec<(u64, CatalogOperation)>> {
        self.dice.read("read catalog operations", || self.inner.operations(limit))
    }
    fn applied_identities(&self, window: usize) -> Result<std::collections::HashSet<String>> {
        self.dice.read("read applied identities", || self.inner.applied_identities(window))
    }
    fn set_storage_gc_queue(&self, epoch: u64, files: &[StaleFile]) -> Result<()> {
        self.dice.write("write the storage-GC queue", || self.inner.set_storage_gc_queue(epoch, files))
    }
    fn prune(&self, epoch: u64, retention: &crate::catalog::Retention) -> Result<crate::catalog::Pruned> {
        self.dice.write("prune the catalog", || self.inner.prune(epoch, retention))
    }
    fn storage_gc_queue(&self) -> Result<Vec<StaleFile>> {
        self.dice.read("read the storage-GC queue", || self.inner.storage_gc_queue())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_and_refuse_nonsense() {
        let p = FaultPlan::parse("seed=7,errors=0.1,after=0.05,latency_ms=3,multipart=0.5,checkpoints=1").unwrap();
        assert_eq!(p.seed, 7);
        assert_eq!((p.errors, p.after, p.multipart, p.checkpoints), (0.1, 0.05, 0.5, 1.0));
        assert_eq!(p.latency, Duration::from_millis(3));
        assert_eq!(FaultPlan::parse("").unwrap(), FaultPlan::default());
        for bad in ["errors=2", "x=1", "seed", "latency_ms=-1"] {
            assert!(FaultPlan::parse(bad).is_err(), "{bad}");
        }
    }
}
