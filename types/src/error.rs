//! The error type of the engine and everything it reads.

use crate::ids::{FileId, Ts};

/// Everything that can go wrong in the engine. Variants say what a caller can
/// act on; messages say what happened and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operation conflicts with the live state of a key: an insert over a
    /// live key, a delete or update of a key without a live version.
    #[error("table {table}: {message} (key {key})")]
    KeyConflict {
        /// Qualified table name.
        table: String,
        /// The primary key, rendered for humans.
        key: String,
        /// What conflicted.
        message: String,
        /// Index of the failing operation in the call's operation list.
        op: Option<usize>,
    },
    /// A row does not fit the table's schema.
    #[error("table {table}, column {column}: {message}")]
    Schema {
        /// Qualified table name.
        table: String,
        /// Column name.
        column: String,
        /// What is wrong.
        message: String,
    },
    /// Bad input: names where it came from (position, table, source
    /// transaction). Nothing of the failing transaction was applied.
    #[error("input {position}{}{}: {message}", table.as_ref().map(|t| format!(", table {t}")).unwrap_or_default(), txid.as_ref().map(|t| format!(", source transaction {t}")).unwrap_or_default())]
    Input {
        /// Where in the input.
        position: crate::position::SourcePosition,
        /// The table, when known.
        table: Option<String>,
        /// The source transaction, when known.
        txid: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// A table name or id that the engine does not know.
    #[error("unknown table {0}")]
    UnknownTable(String),
    /// A table was created twice.
    #[error("table {0} already exists")]
    TableExists(String),
    /// A snapshot at a timestamp that is no longer (or not yet) available.
    #[error("snapshot at ts {requested} is not available: {reason}")]
    SnapshotUnavailable {
        /// The requested timestamp.
        requested: Ts,
        /// Why, with the available range.
        reason: String,
    },
    /// A bitmap was requested below the base timestamp of a tile: its deletes
    /// were folded by memory GC. Visibility checkpoints serve such queries.
    #[error(
        "visibility of file {file} at ts {qts} was folded into ts {base_ts} by memory GC. Help: hold a snapshot (or a visibility checkpoint) to keep older versions readable"
    )]
    BelowVisibilityBase {
        /// The file.
        file: FileId,
        /// The requested snapshot.
        qts: Ts,
        /// The tile's base timestamp.
        base_ts: Ts,
    },
    /// Timestamps ran past 52 bits.
    #[error("timestamp space exhausted at {0}")]
    TsExhausted(Ts),
    /// Commit of a timestamp that was not begun or was already committed.
    #[error("commit of ts {ts}: {reason}")]
    BadCommit {
        /// The timestamp.
        ts: Ts,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A persisted value would move backwards (a second writer, or a restored
    /// old copy of the metadata).
    #[error("{what} would regress from {current} to {proposed}. Help: another replayer may be writing to this lake")]
    Regression {
        /// Which value.
        what: &'static str,
        /// The persisted value.
        current: u64,
        /// The value that was refused.
        proposed: u64,
    },
    /// This process no longer holds the lake's lease: another replayer took
    /// over (its epoch is newer), so nothing this one writes may land.
    #[error(
        "fenced: this replayer's lease (epoch {epoch}) was taken over (the lake is now at epoch {current}); it stops without writing. Help: another fovea replay/serve writes this lake now"
    )]
    Fenced {
        /// The epoch this process held.
        epoch: u64,
        /// The lake's epoch now.
        current: u64,
    },
    /// This process's lease expired without a successful renewal (the
    /// state store did not answer in time): another replayer may take the
    /// lake over now, so this one stops writing.
    #[error(
        "the lake's lease (epoch {epoch}) expired {late_ms} ms ago without a successful renewal (the state store did not answer in time): this replayer stops before writing more, as another may take the lake over now. Help: check the state store; a restart takes the lease again"
    )]
    LeaseExpired {
        /// The epoch this process held.
        epoch: u64,
        /// How long ago it expired.
        late_ms: i64,
    },
    /// The lake's lease is held by a live replayer.
    #[error("the lake's lease is held by {owner} (epoch {epoch}) for another {remaining_ms} ms")]
    LeaseHeld {
        /// Who holds it.
        owner: String,
        /// Its epoch.
        epoch: u64,
        /// Until it expires unless renewed.
        remaining_ms: i64,
    },
    /// A catalog version was written by another committer first (or the
    /// version asked for is not the next one).
    #[error("catalog version {version} is taken (the newest is {newest})")]
    VersionExists {
        /// The version asked for.
        version: u64,
        /// The newest version.
        newest: u64,
    },
    /// A catalog commit conflicts with a version committed after the one
    /// it read: it must be redone from the newer state.
    #[error("catalog commit made at version {read_version} conflicts: {reason}")]
    CatalogConflict {
        /// The version the committer read.
        read_version: u64,
        /// What conflicts.
        reason: String,
    },
    /// The input failed outside any record (a connection, a stream's
    /// shards, the producer's configuration).
    #[error("input {input}: {message}")]
    Source {
        /// The input, as its checkpoints name it.
        input: String,
        /// What went wrong, and what to change.
        message: String,
    },
    /// A request to a state backend (DynamoDB) failed after its retries.
    #[error("{backend} {operation} on {key}: {message}")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// The request.
        operation: String,
        /// The item, table or object it was about.
        key: String,
        /// What the backend said.
        message: String,
    },
    /// The lake and its state do not belong together (a mistyped
    /// `--state`, a deleted or restored state, a lake emptied under its
    /// state): nothing was touched.
    #[error("{0}")]
    WrongState(String),
    /// Corrupt or unsupported persisted bytes (index snapshot, metadata).
    #[error("corrupt {what}: {reason}")]
    Corrupt {
        /// What was being read.
        what: String,
        /// Why it was refused.
        reason: String,
    },
    /// An internal invariant failed; a bug in fovea.
    #[error("internal invariant violated: {0}. This is a bug in fovea; please report it")]
    Invariant(String),
    /// Object storage failed. Retrying may help.
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),
    /// Parquet encoding or decoding failed.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Arrow failed (building or filtering batches).
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The embedded SQLite metadata failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Local IO failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// True when retrying the same call may succeed (transient storage errors).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::ObjectStore(_) | Error::Io(_))
    }

    /// A broken internal invariant: a bug, reported instead of a panic.
    pub fn invariant(msg: impl Into<String>) -> Self {
        Error::Invariant(msg.into())
    }
}

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs `f` on a background thread's behalf, turning a panic into an
/// error naming `what` (the thread would otherwise die without saying so,
/// and whoever waits for its work would wait forever).
///
/// Unwind safety: the state `f` touches is behind mutexes whose poisoning
/// readers ignore; the error stops the work that panicked (replay stops at
/// that transaction, a flush leaves its block in memory) and nothing the
/// panic left half-done is committed.
pub fn catch_panic<T>(what: impl FnOnce() -> String, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Err(Error::invariant(format!("{} panicked: {message}", what())))
    })
}
