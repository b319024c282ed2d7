//! fovea's lake as Apache Iceberg tables.
//!
//! A checkpoint is one consistent point of every table, with every delete
//! as a row position. [`Publisher::publish`] turns it into one Iceberg
//! snapshot per table whose rows are exactly the table at the checkpoint's
//! timestamp: the data files are the lake's own Parquet files, as they
//! are; the rows a snapshot must not have (deleted at or before it, or
//! appended after it into a file it names) are position deletes: format 2
//! position delete files or format 3 deletion vectors. Tables
//! live at `iceberg/SCHEMA/TABLE` under the lake's root, with file metadata
//! (`metadata/vN.metadata.json` and `metadata/version-hint.text`), so any
//! reader opens one by its path.
//!
//! - [`spec`]: table metadata, schemas with stable field ids, name mapping.
//! - [`manifest`]: manifests and manifest lists (Avro).
//! - [`deletes`]: position delete files (Parquet), deletion vectors (Puffin).
//! - [`publish`]: the incremental publisher.

pub mod deletes;
pub mod manifest;
pub mod publish;
pub mod spec;

pub use publish::{
    CatalogView, DEFAULT_RETENTION, FormatVersion, Published, PublishedSnapshot, Publisher, TableRegistry, ViewTable,
    table_dir,
};

/// Why a table was not published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// A column Iceberg cannot represent, or a type change it cannot read.
    #[error("table {table}, column {column}: {message}")]
    Schema {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// What is wrong.
        message: String,
    },
    /// Published metadata that does not read as fovea wrote it.
    #[error("{what}: {reason}")]
    Corrupt {
        /// The object.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// Another publisher created the same metadata version first.
    #[error(
        "table {table}: metadata version {version} was created by another publisher meanwhile (the newer \
         publication stands)"
    )]
    Raced {
        /// The table.
        table: String,
        /// The version both wrote.
        version: u64,
    },
    /// Encoding a manifest or a delete file failed.
    #[error("encoding Iceberg metadata: {0}")]
    Encode(String),
    /// The lake's store failed.
    #[error(transparent)]
    Store(#[from] fovea_core::Error),
    /// A catalog the tables are registered in refused or failed (the
    /// tables are published all the same; the next publication registers
    /// them again).
    #[error("registering the tables in {catalog}: {message}")]
    Register {
        /// The catalog (`glue://DATABASE`).
        catalog: String,
        /// What went wrong, naming the table.
        message: String,
    },
}

/// Result of publishing.
pub type Result<T> = std::result::Result<T, PublishError>;
