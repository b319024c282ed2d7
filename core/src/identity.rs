//! A lake knows its state, and its state knows the lake.
//!
//! A lake's objects and its state (timestamps, lease, catalog: a SQLite
//! file or a DynamoDB table) live apart and are named apart (`--lake`,
//! `--state`): a mistyped `--state`, a state table deleted, re-created or
//! restored from another day's backup, or a lake prefix emptied under a
//! live state would otherwise pair a lake with a state that has no record
//! of it — and a writer's recovery, finding no checkpoint, would take the
//! lake's objects for litter and delete them.
//!
//! So each lake has one identity, a random id written once in the lake
//! ([`LAKE_ID_OBJECT`], created with a conditional put) and once in its
//! state ([`TxnStore::bind_lake`], set-once). [`check`] runs before a
//! command touches anything, writer or reader:
//!
//! | lake's id | state's id | lake holds data | what happens |
//! |---|---|---|---|
//! | a | a | any | opened |
//! | a | b | any | refused |
//! | a | none | yes | refused (a new or foreign state) |
//! | a | none | no | the state is bound to a (a first open that stopped between the two writes) |
//! | none | b | any | refused (another lake, or the lake's objects were deleted) |
//! | none | none | yes, and the state has a checkpoint | a lake of before identities: bound (writer) |
//! | none | none | yes, no checkpoint | refused (a new state beside an old lake) |
//! | none | none | no | a new lake: both written (writer) |
//!
//! Identities are written lake first, then state: a crash between the two
//! leaves the case "a, none, no data", which the next writer completes.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::lake::block_on_io;
use crate::mvcc::TxnStore;

/// The lake's identity object.
pub const LAKE_ID_OBJECT: &str = "_fovea/lake.json";

/// Prefixes under which a lake's data lives (tables' files, checkpoints,
/// catalog payloads): a lake with an object under one holds data.
const DATA_PREFIXES: [&str; 3] = ["tables", "_fovea/checkpoints", "_fovea/catalog"];

/// What [`LAKE_ID_OBJECT`] holds.
#[derive(Debug, Serialize, Deserialize)]
struct LakeIdentity {
    lake_id: String,
    created_us: i64,
}

/// Whether the command may create identities (a writer) or only read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The lake's writer: completes or creates the identities.
    Write,
    /// A reader: writes nothing.
    Read,
}

/// Checks that the lake in `store` and the state in `txn`/`catalog` belong
/// together (see the module's table), binding them where the table says
/// so and `access` allows; returns the lake's id (`None`: a lake without
/// one, opened by a reader). An error names what it found and how to go on.
pub fn check(
    store: &Arc<dyn ObjectStore>,
    txn: &dyn TxnStore,
    catalog: &dyn Catalog,
    access: Access,
) -> Result<Option<String>> {
    // The state first: a writer creating the lake writes the lake's id
    // object before it binds the state, so a state found bound here has
    // its lake's id object in place when the lake is read next (read the
    // other way round, a reader racing a new lake's first open saw a bound
    // state and no id, and called the lake another).
    let in_state = txn.lake_id()?;
    let in_lake = read_lake_id(store)?;
    match (in_lake, in_state) {
        (Some(a), Some(b)) if a == b => Ok(Some(a)),
        (Some(a), Some(b)) => Err(Error::WrongState(format!(
            "the lake is lake {a} but the state belongs to lake {b}: they do not go together (a mistyped --state or \
             --lake?). Nothing was touched. Help: name the state this lake was written with"
        ))),
        (Some(a), None) => {
            if holds_data(store)? {
                return Err(Error::WrongState(format!(
                    "the lake is lake {a} and holds data, but the state has no record of any lake (a new state: a \
                     mistyped --state, or the lake's state deleted or restored from another backup). Nothing was \
                     touched. Help: name the state this lake was written with; to start the lake over, delete its \
                     objects first"
                )));
            }
            match access {
                // A first open that stopped after writing the lake's id.
                Access::Write => bind(txn, &a).map(Some),
                Access::Read => Ok(Some(a)),
            }
        }
        (None, Some(b)) => Err(Error::WrongState(format!(
            "the state belongs to lake {b}, but the lake has no identity: another lake (a mistyped --lake?), or \
             this lake's objects were deleted. Nothing was touched. Help: name the lake this state belongs to; to \
             start over, use a new state"
        ))),
        (None, None) => {
            let data = holds_data(store)?;
            if data && catalog.latest_checkpoint()?.is_none() {
                return Err(Error::WrongState(
                    "the lake holds data but the state has no checkpoint of it (a new state: a mistyped --state, or \
                     the lake's state deleted or restored from another backup). Nothing was touched. Help: name the \
                     state this lake was written with; to start the lake over, delete its objects first"
                        .into(),
                ));
            }
            match access {
                // A new lake, or one written before identities with its state.
                Access::Write => {
                    let id = create_lake_id(store, &new_lake_id())?;
                    bind(txn, &id).map(Some)
                }
                Access::Read => Ok(None),
            }
        }
    }
}

/// Binds the state to lake `id`; refused if it is bound to another (a
/// writer of another lake bound it meanwhile).
fn bind(txn: &dyn TxnStore, id: &str) -> Result<String> {
    let bound = txn.bind_lake(id)?;
    if bound != id {
        return Err(Error::WrongState(format!(
            "the lake is lake {id} but its state was just bound to lake {bound} by another writer. Nothing was touched"
        )));
    }
    Ok(bound)
}

/// A new random lake id: 128 bits, hex.
fn new_lake_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The id the lake's identity object holds, if it has one.
pub fn read_lake_id(store: &Arc<dyn ObjectStore>) -> Result<Option<String>> {
    let store = Arc::clone(store);
    let got = block_on_io(async move {
        match store.get(&Path::from(LAKE_ID_OBJECT)).await {
            Ok(r) => r.bytes().await.map(Some),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    })??;
    got.map(|bytes| {
        serde_json::from_slice::<LakeIdentity>(&bytes).map(|l| l.lake_id).map_err(|e| Error::Corrupt {
            what: format!("the lake's identity ({LAKE_ID_OBJECT})"),
            reason: e.to_string(),
        })
    })
    .transpose()
}

/// Writes the lake's identity `id` unless it has one; returns the one it
/// has (another writer's, if one came first).
fn create_lake_id(store: &Arc<dyn ObjectStore>, id: &str) -> Result<String> {
    let body = LakeIdentity { lake_id: id.to_owned(), created_us: crate::catalog::now_us() };
    let bytes = Bytes::from(serde_json::to_vec(&body).map_err(|e| Error::invariant(e.to_string()))?);
    let put = {
        let store = Arc::clone(store);
        block_on_io(async move {
            let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
            store.put_opts(&Path::from(LAKE_ID_OBJECT), PutPayload::from(bytes), options).await
        })?
    };
    match put {
        Ok(_) => Ok(id.to_owned()),
        // Written before: by another writer, or by this one's request whose
        // answer was lost. Either way the object says.
        Err(object_store::Error::AlreadyExists { .. }) => {
            read_lake_id(store)?.ok_or_else(|| Error::invariant(format!("{LAKE_ID_OBJECT} exists and does not exist")))
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether the lake has an object under one of its data prefixes.
fn holds_data(store: &Arc<dyn ObjectStore>) -> Result<bool> {
    for prefix in DATA_PREFIXES {
        let store = Arc::clone(store);
        let first = block_on_io(async move { store.list(Some(&Path::from(prefix))).next().await })?;
        match first {
            Some(Ok(_)) => return Ok(true),
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    Ok(false)
}
