//! # fovea-core
//!
//! The engine of fovea as a synchronous library: it replays mirror
//! transactions into Parquet lake files and answers snapshot scans, with
//! no AWS and no SQL engine inside.
#![warn(missing_docs)]

#[cfg(feature = "faults")]
pub mod faults;
/// The change model and the decoders of change streams (the `fovea-cdc` crate).
pub use fovea_cdc as cdc;
pub use fovea_types::{error, ids, schema};
pub use fovea_versions::{index, mvcc, visibility};
pub mod workers;

pub use error::{Error, Result};
pub use ids::{FileId, RowId, ShardId, TableId, Ts};
pub mod buffer;
pub mod catalog;
pub mod checkpoint;
pub mod compact;
pub mod engine;
pub mod frozen;
pub mod identity;
pub mod lake;
pub mod lease;
pub mod location;
pub mod metered;
pub mod reader;
pub mod replay;
pub mod rewrite;
pub mod rpc;
pub mod scan;
pub mod scan_worker;
pub mod sink;
pub mod split;
pub mod storage_gc;

pub use engine::{Engine, EngineConfig};
pub use mvcc::{Clock, Snapshot, Stall};
pub use replay::Op;
pub use scan::{Scan, ScanOptions, SnapshotTables, VisibilityMode};
pub use schema::{Row, TableDef, Value};
