//! A lake named by its URLs, as every client of fovea names one: a local
//! directory (its state in SQLite files under `DIR/_fovea` by default) or
//! `s3://BUCKET/PREFIX`, with its state store `dynamodb://TABLE`
//! (required for an `s3://` lake). The command line (`--lake`, `--state`)
//! and the Python package (`lake=`, `state=`) open lakes here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fovea_core::Result;
use fovea_core::catalog::Catalog;
use fovea_core::engine::METADATA_DIR;
use fovea_core::error::Error;
use fovea_core::location::LakeBackends;
use fovea_core::metered::{MeteredStore, StoreMeter};
use object_store::ObjectStore;

use crate::catalog::DynamoCatalog;
use crate::dynamo::DynamoState;

/// Where a lake and its state are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LakeAddress {
    /// The lake: a directory, or `s3://BUCKET/PREFIX`.
    pub lake: String,
    /// Its state store, `dynamodb://TABLE`; `None` for a local lake's
    /// embedded SQLite state.
    pub state: Option<String>,
}

impl LakeAddress {
    /// The lake at `lake` with its state at `state`.
    pub fn new(lake: impl Into<String>, state: Option<String>) -> Self {
        LakeAddress { lake: lake.into(), state }
    }

    /// The lake's directory, when it is local.
    pub fn dir(&self) -> Option<PathBuf> {
        (!self.lake.starts_with("s3://")).then(|| PathBuf::from(&self.lake))
    }

    /// Whether the address is well formed, before anything is contacted:
    /// an `s3://BUCKET[/PREFIX]` lake with a `dynamodb://TABLE` state (a
    /// local lake's state is optional).
    pub fn check(&self) -> Result<()> {
        if self.dir().is_none() {
            crate::s3::parse_s3_url(&self.lake)?;
            if self.state.is_none() {
                return Err(self.no_state());
            }
        }
        if let Some(state) = &self.state {
            crate::dynamo::parse_dynamodb_url(state)?;
        }
        Ok(())
    }

    fn no_state(&self) -> Error {
        Error::WrongState(format!(
            "the lake {} has no state store: it needs dynamodb://TABLE (its timestamps, lease and catalog) — --state on the command line, state= in Python",
            self.lake
        ))
    }

    /// The lake's backends, its object store counted in `meter` when given,
    /// and its DynamoDB state when it has one (to count its writes).
    /// `create`: a missing DynamoDB state table is created (a writer's
    /// first start), else it is an error naming it.
    pub fn backends(
        &self,
        create: bool,
        meter: Option<Arc<StoreMeter>>,
    ) -> Result<(LakeBackends, Option<DynamoState>)> {
        // A malformed state URL is refused before S3 is contacted.
        self.check()?;
        let metered = |store: Arc<dyn ObjectStore>| -> Arc<dyn ObjectStore> {
            match &meter {
                Some(m) => Arc::new(MeteredStore::new(store, Arc::clone(m))),
                None => store,
            }
        };
        let state = match (self.dir(), self.state.as_deref()) {
            (Some(dir), None) => {
                let local = LakeBackends::local(&dir)?;
                return Ok((LakeBackends { store: metered(local.store), ..local }, None));
            }
            (_, Some(state)) => state,
            // Refused by `check` already.
            (None, None) => return Err(self.no_state()),
        };
        let store = match self.dir() {
            Some(dir) => {
                std::fs::create_dir_all(&dir)?;
                metered(Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&dir)?))
            }
            None => metered(crate::s3::s3_store(&self.lake)?),
        };
        let dynamo = DynamoState::connect(state, create)?;
        let catalog: Arc<dyn Catalog> = Arc::new(DynamoCatalog::new(dynamo.clone(), Arc::clone(&store)));
        Ok((LakeBackends { txn: Arc::new(dynamo.txn_store()), catalog, store }, Some(dynamo)))
    }

    /// The backends of a lake that must exist already, for a reader: nothing
    /// is created (a local folder that is not a lake, or a missing state
    /// table, is an error naming it).
    pub fn existing(&self) -> Result<LakeBackends> {
        if let Some(dir) = self.dir()
            && self.state.is_none()
        {
            check_local_lake(&dir)?;
        }
        Ok(self.backends(false, None)?.0)
    }
}

/// A local folder is a lake when it has fovea's metadata folder.
fn check_local_lake(dir: &Path) -> Result<()> {
    if dir.join(METADATA_DIR).is_dir() {
        Ok(())
    } else {
        Err(Error::WrongState(format!("{} is not a fovea lake (no {METADATA_DIR} folder)", dir.display())))
    }
}
