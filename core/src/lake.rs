//! Lake files: Parquet on an object store.
//!
//! Layout under the lake root (any [`ObjectStore`]: local directory, memory,
//! S3):
//!
//! ```text
//! tables/<table id>/blocks/<file id>-<block>.parquet   flushed write-buffer blocks (one row group each)
//! tables/<table id>/files/<file id>.parquet            regular files (one row group per former block)
//! ```
//!
//! Every file carries the user columns plus the hidden `_fovea_create_ts`
//! int64 column, ascending within the file, with row-group min/max
//! statistics. The object store is asynchronous; the engine is synchronous
//! and drives it with a blocking executor (object_store's local store runs
//! its IO inline when no Tokio runtime is around).

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use futures::executor::block_on;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder,
};
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use crate::error::{Error, Result};
use crate::ids::{FileId, TableId, Ts};

/// Path of a flushed write-buffer block.
pub fn block_path(table: TableId, file: FileId, block: u32) -> Path {
    Path::from(format!("tables/{}/blocks/{:016x}-{block:05}.parquet", table.0, file.0))
}

/// Path of a regular file.
pub fn file_path(table: TableId, file: FileId) -> Path {
    Path::from(format!("tables/{}/files/{:016x}.parquet", table.0, file.0))
}

/// A row group of a regular file.
#[derive(Clone, Copy, Debug)]
pub struct RowGroupInfo {
    /// Row offset of its first row in the file.
    pub offset: usize,
    /// Rows.
    pub rows: usize,
    /// Smallest create_ts.
    pub min_ts: Ts,
    /// Largest create_ts.
    pub max_ts: Ts,
}

/// A regular Parquet file with its parsed footer.
pub struct RegularFile {
    /// Object path.
    pub path: Path,
    /// Row groups in file order.
    pub row_groups: Vec<RowGroupInfo>,
    /// Parsed footer, reused by every scan.
    pub metadata: ArrowReaderMetadata,
    /// Size in bytes.
    pub size: usize,
}

impl RegularFile {
    /// Total rows.
    pub fn rows(&self) -> usize {
        self.row_groups.iter().map(|r| r.rows).sum()
    }
}

/// The lake's object store with the blocking helpers the engine uses.
#[derive(Clone)]
pub struct Lake {
    store: Arc<dyn ObjectStore>,
}

impl Lake {
    /// Wraps an object store.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Writes an object.
    pub fn put(&self, path: &Path, bytes: Bytes) -> Result<()> {
        block_on(self.store.put(path, PutPayload::from(bytes)))?;
        Ok(())
    }

    /// Reads a whole object.
    pub fn get(&self, path: &Path) -> Result<Bytes> {
        Ok(block_on(async { self.store.get(path).await?.bytes().await })?)
    }

    /// Deletes an object; a missing one is not an error (deletes are retried).
    pub fn delete(&self, path: &Path) -> Result<()> {
        match block_on(self.store.delete(path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads a flushed block back.
    pub fn read_block(&self, path: &Path) -> Result<RecordBatch> {
        let bytes = self.get(path)?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.with_batch_size(usize::MAX >> 1).build()?;
        one_batch(reader, path.as_ref())
    }
}

/// Drains a Parquet reader into one batch (readers may split a row group).
pub(crate) fn one_batch(reader: ParquetRecordBatchReader, what: &str) -> Result<RecordBatch> {
    let mut batches = reader.collect::<Result<Vec<_>, _>>()?;
    match batches.len() {
        0 => Err(Error::Corrupt { what: what.to_owned(), reason: "no rows".into() }),
        1 => Ok(batches.swap_remove(0)),
        _ => Ok(arrow::compute::concat_batches(&batches[0].schema(), &batches)?),
    }
}

/// Writer settings of fovea files: statistics on every column (the hidden
/// one drives row-group skipping), one row group per block.
fn writer_properties(row_group_rows: usize, compression: Compression) -> WriterProperties {
    WriterProperties::builder()
        .set_max_row_group_row_count(Some(row_group_rows.max(1)))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_compression(compression)
        .set_created_by(format!("fovea {}", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Encodes batches as one Parquet file, one row group per batch.
pub fn encode_parquet(batches: &[RecordBatch], row_group_rows: usize, compression: Compression) -> Result<Bytes> {
    let schema = batches
        .first()
        .map(|b| b.schema())
        .ok_or_else(|| Error::invariant("encode_parquet needs at least one batch"))?;
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, Some(writer_properties(row_group_rows, compression)))?;
    for b in batches {
        writer.write(b)?;
        // One row group per batch keeps row groups aligned with blocks.
        writer.flush()?;
    }
    writer.close()?;
    Ok(Bytes::from(out))
}

/// Loads the footer of a regular file held in `bytes`.
pub fn load_metadata(bytes: &Bytes) -> Result<ArrowReaderMetadata> {
    Ok(ArrowReaderMetadata::load(bytes, ArrowReaderOptions::new())?)
}

/// Min and max of a create_ts column.
pub fn ts_range(create_ts: &arrow::array::Int64Array) -> (Ts, Ts) {
    let values = create_ts.values();
    // Ascending within a block: first and last are min and max.
    let min = values.first().copied().unwrap_or(0);
    let max = values.last().copied().unwrap_or(0);
    (Ts(min as u64), Ts(max as u64))
}

/// `combine`: the blocks of a virtual file (in order) → one regular file with
/// the same file id and row order. Returns the file and its encoded size.
pub fn combine(lake: &Lake, path: Path, blocks: &[RecordBatch], row_group_rows: usize) -> Result<RegularFile> {
    let bytes = encode_parquet(blocks, row_group_rows, Compression::SNAPPY)?;
    let metadata = load_metadata(&bytes)?;
    let mut row_groups = Vec::with_capacity(blocks.len());
    let mut offset = 0;
    for b in blocks {
        let create_ts = create_ts_column(b)?;
        let (min_ts, max_ts) = ts_range(create_ts);
        row_groups.push(RowGroupInfo { offset, rows: b.num_rows(), min_ts, max_ts });
        offset += b.num_rows();
    }
    if metadata.metadata().num_row_groups() != blocks.len() {
        return Err(Error::invariant(format!(
            "combine wrote {} row groups for {} blocks",
            metadata.metadata().num_row_groups(),
            blocks.len()
        )));
    }
    let size = bytes.len();
    lake.put(&path, bytes)?;
    Ok(RegularFile { path, row_groups, metadata, size })
}

/// The hidden create_ts column of a file batch (always the last column).
pub fn create_ts_column(batch: &RecordBatch) -> Result<&arrow::array::Int64Array> {
    batch
        .columns()
        .last()
        .and_then(|c| c.as_any().downcast_ref::<arrow::array::Int64Array>())
        .ok_or_else(|| Error::invariant("a file batch lacks its _fovea_create_ts column"))
}
