//! # fovea-model
//!
//! What a change is, before any engine sees it: identifiers and
//! timestamps ([`ids`]), table definitions and typed values ([`schema`]),
//! the errors every layer reports ([`error`]), and the change stream — its
//! decoders (Debezium, AWS DMS, pgoutput), the ordering rules that rebuild
//! source transactions, and the [`cdc::source::ChangeSource`] contract with
//! its conformance suite. Nothing here writes a lake or holds versions.
#![warn(missing_docs)]

pub mod cdc;
pub mod error;
pub mod ids;
pub mod schema;
pub mod sync;

pub use error::{Error, Result};
pub use ids::{FileId, RowId, ShardId, TableId, Ts};
pub use schema::{Row, TableDef, Value};
