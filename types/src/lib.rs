//! # fovea-types
//!
//! What every part of fovea speaks: identifiers ([`ids`]), tables, schemas
//! and the values rows are made of ([`schema`]), where a change came from
//! in its input ([`position`]), the error type ([`error`]) and the
//! poison-tolerant lock ([`sync`]). No engine, no IO: the decoders
//! (`fovea-cdc`) and the engine (`fovea-core`) both build on it.
#![warn(missing_docs)]

pub mod error;
pub mod ids;
pub mod position;
pub mod schema;
pub mod sync;

pub use error::{Error, Result};
pub use ids::{FileId, RowId, ShardId, TableId, Ts};
pub use schema::{Row, TableDef, Value};
