//! # fovea-versions
//!
//! fovea's version storage, in memory and without IO to the lake: the
//! watermark MVCC clock and the state-store contract it persists through
//! ([`mvcc`]), the tile visibility that marks every deleted row version
//! ([`visibility`]), and the primary index from key to row location
//! ([`index`]). The engine (`fovea-core`) ties them to lake files.
#![warn(missing_docs)]

pub mod index;
pub mod mvcc;
pub mod visibility;

// The change model under the same paths the engine uses.
use fovea_model::{error, ids, schema};
