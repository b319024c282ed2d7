//! Where a lake lives and how it is opened.
//!
//! A lake is three backends (DESIGN §2): an object store for its files, a
//! [`TxnStore`] for timestamps, watermarks and the writer's lease, and a
//! [`Catalog`]. The embedded default keeps all three in a local directory
//! (`_fovea/txn.sqlite`, `_fovea/catalog.sqlite`); on AWS they are S3 and
//! DynamoDB (`fovea_aws`), and any mix that implements the traits works the
//! same way.
//!
//! Opening for writing takes the lease first (waiting while a live
//! replayer holds it): the checkpoint read after it is then the newest one,
//! and no replayer that lost the lake can commit another. Opening for
//! reading registers the reader first (see [`ReaderRegistration`]), so the
//! writer keeps the checkpoint and files it reads.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;

use crate::catalog::{Catalog, CheckpointRecord, SqliteCatalog};
use crate::engine::{Engine, EngineConfig, METADATA_DIR};
use crate::error::{Error, Result};
use crate::identity::Access;
use crate::lease::{DEFAULT_LEASE_TTL, LeaseKeeper, ReaderRegistration};
use crate::mvcc::{Clock, SqliteTxnStore, TxnStore};
use crate::reader::CheckpointReader;

/// The backends of one lake.
#[derive(Clone)]
pub struct LakeBackends {
    /// Where its files are.
    pub store: Arc<dyn ObjectStore>,
    /// Its timestamps, watermarks and lease.
    pub txn: Arc<dyn TxnStore>,
    /// Its catalog.
    pub catalog: Arc<dyn Catalog>,
}

impl LakeBackends {
    /// The embedded lake in directory `dir` (created if missing).
    pub fn local(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let meta = dir.join(METADATA_DIR);
        let txn_path = meta.join("txn.sqlite");
        let txn: Arc<dyn TxnStore> = Arc::new(SqliteTxnStore::open(&txn_path)?);
        let catalog: Arc<dyn Catalog> = Arc::new(SqliteCatalog::open(&meta.join("catalog.sqlite"), &txn_path)?);
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir)?);
        Ok(LakeBackends { store, txn, catalog })
    }
}

impl LakeBackends {
    /// With `FOVEA_FAULTS` set (tests only), the backends with the faults it
    /// plans injected ([`crate::faults`]); a build without the `faults`
    /// feature refuses it rather than ignore it. Unset: as they are.
    pub fn with_env_faults(self) -> Result<Self> {
        let plan = std::env::var("FOVEA_FAULTS").unwrap_or_default();
        if plan.is_empty() {
            return Ok(self);
        }
        #[cfg(feature = "faults")]
        {
            tracing::warn!(faults = %plan, "injecting faults into the lake's backends (FOVEA_FAULTS: testing only)");
            Ok(crate::faults::FaultPlan::parse(&plan)?.inject(self))
        }
        #[cfg(not(feature = "faults"))]
        Err(Error::Source {
            input: "FOVEA_FAULTS".into(),
            message: "set, but this build has no fault injection (the `faults` feature)".into(),
        })
    }
}

/// A lake opened: the engine (restored from the newest checkpoint when
/// there is one), its catalog, that checkpoint, and for a writer the lease.
pub struct OpenLake {
    /// The engine.
    pub engine: Arc<Engine>,
    /// The catalog.
    pub catalog: Arc<dyn Catalog>,
    /// The checkpoint it was restored from.
    pub checkpoint: Option<CheckpointRecord>,
    /// The lease a writer holds (renewed until dropped).
    pub lease: Option<LeaseKeeper>,
    /// A reader's registration: the writer keeps what it reads.
    pub reader: Option<ReaderRegistration>,
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

/// Opens the lake in directory `dir` (creating it), restoring its newest
/// checkpoint.
pub fn open_lake(dir: &Path, config: EngineConfig, mode: OpenMode) -> Result<OpenLake> {
    open(LakeBackends::local(dir)?, config, mode, DEFAULT_LEASE_TTL)
}

/// [`open_lake`] with the lease time of a writer.
pub fn open_lake_with(dir: &Path, config: EngineConfig, mode: OpenMode, lease_ttl: Duration) -> Result<OpenLake> {
    open(LakeBackends::local(dir)?, config, mode, lease_ttl)
}

/// Opens the lake of `backends`; a writer's lease lasts `lease_ttl`.
pub fn open(backends: LakeBackends, config: EngineConfig, mode: OpenMode, lease_ttl: Duration) -> Result<OpenLake> {
    let LakeBackends { store, txn, catalog } = backends;
    // Before anything is touched: the lake and its state belong together.
    let access = if mode == OpenMode::Write { Access::Write } else { Access::Read };
    crate::identity::check(&store, txn.as_ref(), catalog.as_ref(), access)?;
    let (lease, reader) = match mode {
        OpenMode::Write => (Some(LeaseKeeper::acquire(Arc::clone(&txn), lease_ttl)?), None),
        // Registered before the catalog is read, so the writer cannot drop
        // the checkpoint this reader is about to restore.
        OpenMode::Read => (None, Some(ReaderRegistration::register(Arc::clone(&txn), lease_ttl)?)),
    };
    let checkpoint = catalog.latest_checkpoint()?;
    if let (Some(r), Some(c)) = (&reader, &checkpoint) {
        r.set_qts(crate::Ts(c.manifest.checkpoint_ts))?;
    }
    // A writer's recovery deletes the objects its checkpoint does not name
    // (a crashed run's litter) — but not while readers on other hosts are
    // registered: they may read an older checkpoint's objects. The litter
    // then waits for a recovery without readers (its file ids are fenced,
    // nothing new collides with it).
    let readers = match mode {
        OpenMode::Write => txn.readers(crate::catalog::now_us())?.len(),
        OpenMode::Read => 0,
    };
    if readers > 0 {
        tracing::info!(readers, "registered readers: recovery deletes no unnamed objects this time");
    }
    let vacuum = mode == OpenMode::Write && readers == 0;
    let clock = Clock::open(txn)?;
    if let Some(l) = &lease {
        clock.set_epoch(l.epoch());
    }
    let engine = match &checkpoint {
        Some(c) => Engine::restore_with_grace(store, clock, &c.manifest, vacuum, config.retire_grace).map_err(|e| match e {
            Error::ObjectStore(object_store::Error::NotFound { path, .. }) => Error::WrongState(format!(
                "the state's checkpoint (ts {}) names {path}, which the lake no longer holds: the state is older than \
                 the lake (restored from an earlier backup?) or the lake lost objects. Nothing was deleted. Help: use \
                 the state the lake was last written with",
                c.manifest.checkpoint_ts
            )),
            other => other,
        })?,
        None if !vacuum => Engine::open(store, clock, config)?,
        None => {
            // Objects without a checkpoint were written by a run that died
            // before its first one: nothing references them.
            let engine = Engine::open(store, clock, config)?;
            engine.vacuum(&HashSet::new(), None)?;
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
    Ok(OpenLake { engine, catalog, checkpoint, lease, reader })
}

/// A lake opened for reading as of its newest checkpoint, without its
/// engine (see [`crate::reader`]).
pub struct OpenReader {
    /// The tables as of the checkpoint (no tables before the first one).
    pub reader: Arc<CheckpointReader>,
    /// The catalog.
    pub catalog: Arc<dyn Catalog>,
    /// The timestamp store, where the lake's readers (this one too) are
    /// registered.
    pub txn: Arc<dyn TxnStore>,
    /// The checkpoint read.
    pub checkpoint: Option<CheckpointRecord>,
    /// The newest replayed source transaction the checkpoint holds: its
    /// mirror ts and source commit time (µs since the epoch), when known.
    pub source_commit: Option<(crate::Ts, i64)>,
}

/// Opens the lake of `backends` for reading at its newest checkpoint:
/// registers the reader (renewed every `ttl / 3`; the writer keeps what it
/// reads), reads the manifest, and nothing else until a scan asks.
pub fn open_reader(backends: LakeBackends, ttl: Duration) -> Result<OpenReader> {
    let LakeBackends { store, txn, catalog } = backends;
    crate::identity::check(&store, txn.as_ref(), catalog.as_ref(), Access::Read)?;
    // Registered before the catalog is read: the writer cannot drop the
    // checkpoint about to be read.
    let registration = ReaderRegistration::register(Arc::clone(&txn), ttl)?;
    let checkpoint = catalog.latest_checkpoint()?;
    let reader = match &checkpoint {
        Some(c) => {
            registration.set_qts(crate::Ts(c.manifest.checkpoint_ts))?;
            CheckpointReader::open(store, &c.manifest, Arc::new(registration))?
        }
        None => CheckpointReader::empty(store, Arc::new(registration)),
    };
    let source_commit = match &checkpoint {
        Some(c) => catalog
            .history(None, 1)?
            .into_iter()
            .next()
            .filter(|h| h.ts.get() <= c.manifest.checkpoint_ts)
            .and_then(|h| Some((h.ts, h.commit_us?))),
        None => None,
    };
    Ok(OpenReader { reader: Arc::new(reader), catalog, txn, checkpoint, source_commit })
}
