//! # fovea-versions
//!
//! Which version of which row a snapshot sees, held in memory: timestamps,
//! watermarks and snapshots with the stores that make them durable
//! ([`mvcc`]: the `TxnStore` contract, its memory and SQLite backends and
//! their conformance suite), tile visibility with its garbage collection
//! ([`visibility`]), and the primary index from keys to row locations with
//! its checkpoint images ([`index`]). No lake files and no object store:
//! the engine (`fovea-core`) writes and reads those.
#![warn(missing_docs)]

pub mod index;
pub mod mvcc;
pub mod visibility;
