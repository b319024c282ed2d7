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
//! statistics.
//!
//! IO: the object store is asynchronous, the engine synchronous. Every
//! request runs on one process-wide IO runtime (`fovea-io`, a Tokio
//! runtime: S3 clients need one) and the calling thread waits for its
//! result, so no engine thread ever drives network IO itself. Parquet is
//! read by ranges: a footer with one request for the object's tail, then
//! only the column chunks of the row groups and columns a reader asks for
//! (parquet's push decoder says which byte ranges it needs; they are
//! fetched in one `get_ranges` call, which coalesces neighbours). Objects
//! above [`MULTIPART_THRESHOLD`] are uploaded in parts.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use parquet::DecodeResult;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::push_decoder::{ParquetPushDecoder, ParquetPushDecoderBuilder};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::Compression;
use parquet::file::metadata::ParquetMetaDataPushDecoder;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use crate::error::{Error, Result};
use crate::ids::{FileId, TableId, Ts};
use crate::schema::StoredColumns;

/// Objects at least this large are uploaded in parts (S3 needs parts of
/// 5 MiB or more).
pub const MULTIPART_THRESHOLD: usize = 16 << 20;
/// Size of one uploaded part.
const MULTIPART_PART: usize = 8 << 20;
/// Bytes of an object's tail fetched to find its footer in one request
/// (fovea's footers are a few KiB; a small block is read whole).
pub const FOOTER_FETCH: u64 = 64 << 10;

/// Path of a flushed write-buffer block, sealed by a writer of lease
/// epoch `writer` (blocks of one file may be written by successive
/// writers: the epoch keeps a fenced one from writing over its
/// successor's).
pub fn block_path(table: TableId, file: FileId, block: u32, writer: u64) -> Path {
    Path::from(format!("tables/{}/blocks/{:016x}-{block:05}-e{writer}.parquet", table.0, file.0))
}

/// Path of the rows of block `block` of virtual file `file` a checkpoint at
/// `checkpoint` holds that no flushed block does yet (the open block, or
/// the prefix of a block up to the checkpoint): written for that
/// checkpoint alone, so the next checkpoint names another object.
pub fn checkpoint_block_path(table: TableId, file: FileId, block: u32, checkpoint: u64) -> Path {
    Path::from(format!("tables/{}/blocks/{:016x}-{block:05}-c{checkpoint}.parquet", table.0, file.0))
}

/// Whether `path` (an object path or a URI ending in one) names a
/// [`checkpoint_block_path`].
pub fn is_checkpoint_block(path: &str) -> bool {
    path.strip_suffix(".parquet")
        .and_then(|p| p.rsplit_once("-c"))
        .is_some_and(|(head, ts)| head.contains("/blocks/") && !ts.is_empty() && ts.bytes().all(|b| b.is_ascii_digit()))
}

/// Path of a regular file.
pub fn file_path(table: TableId, file: FileId) -> Path {
    Path::from(format!("tables/{}/files/{:016x}.parquet", table.0, file.0))
}

/// Path of one combine round's output for virtual file `file`: named also
/// by `round`, an id this writer allocated (file ids carry the writer's
/// epoch), so no two rounds — of this writer or of a predecessor that does
/// not know yet that it is fenced — ever write or discard the same object.
pub fn combined_path(table: TableId, file: FileId, round: FileId) -> Path {
    Path::from(format!("tables/{}/files/{:016x}-{:016x}.parquet", table.0, file.0, round.0))
}

/// The lease epoch of the writer that created `path`, from the file id
/// its name carries (file ids hold their writer's epoch in their high
/// bits, [`crate::engine::FILE_ID_EPOCH_SHIFT`]): blocks and regular files
/// by their file id (a checkpoint's own blocks, [`checkpoint_block_path`],
/// by their file's: their writer's epoch is that or later), combine outputs
/// by their round, checkpoint objects by the unique id in their names.
/// `None` for a name fovea does not give.
pub fn writer_epoch(path: &Path) -> Option<u64> {
    let hex = |s: &str| (s.len() == 16).then(|| u64::from_str_radix(s, 16).ok()).flatten();
    let epoch = |id: u64| id >> crate::engine::FILE_ID_EPOCH_SHIFT;
    let parts: Vec<&str> = path.as_ref().split('/').collect();
    match parts.as_slice() {
        ["tables", table, kind, name] if table.bytes().all(|b| b.is_ascii_digit()) => {
            let stem = name.strip_suffix(".parquet")?;
            match (*kind, stem.split_once('-')) {
                ("files", None) => hex(stem).map(epoch),
                // A combine round's output: the round is this writer's id.
                ("files", Some((file, round))) => hex(file).and(hex(round)).map(epoch),
                ("blocks", Some((file, rest))) => {
                    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
                    if let Some((block, ts)) = rest.split_once("-c") {
                        // FILE-BLOCK-cTS, a checkpoint's own block: its
                        // file's epoch, a lower bound of its writer's (a
                        // successor writes them for a predecessor's open file).
                        let ts_digits = !ts.is_empty() && ts.bytes().all(|b| b.is_ascii_digit());
                        return (digits(block) && ts_digits).then(|| hex(file).map(epoch)).flatten();
                    }
                    match rest.split_once("-e") {
                        // FILE-BLOCK-eEPOCH: the writer's epoch.
                        Some((block, writer)) if digits(block) => hex(file).and(writer.parse().ok()),
                        // FILE-BLOCK (lakes written before): the file's.
                        None if digits(rest) => hex(file).map(epoch),
                        _ => None,
                    }
                }
                _ => None,
            }
        }
        // `_fovea/checkpoints/TS-UNIQUE/…`: the attempt's unique id.
        ["_fovea", "checkpoints", dir, _] if dir.contains('-') => {
            let (ts, unique) = dir.split_once('-')?;
            ts.bytes().all(|b| b.is_ascii_digit()).then_some(())?;
            hex(unique).map(epoch)
        }
        // `_fovea/checkpoints/TS/NAME-…-UNIQUE.EXT` (lakes written before):
        // the unique id that ends the stem, if any.
        ["_fovea", "checkpoints", ts, name] if ts.bytes().all(|b| b.is_ascii_digit()) => {
            let stem = name.rsplit_once('.').map_or(*name, |(stem, _)| stem);
            stem.rsplit('-').next()?.parse::<u64>().ok().map(epoch)
        }
        _ => None,
    }
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

/// A regular Parquet file. Its footer is read when a reader first needs
/// it (a reader of a lake with many files opens only those it reads) and
/// then reused by every scan.
pub struct RegularFile {
    /// Object path.
    pub path: Path,
    /// Row groups in file order.
    pub row_groups: Vec<RowGroupInfo>,
    /// Where the footer is (its length field and magic included), when
    /// known: read with exactly one request for those bytes.
    pub footer_range: Option<Range<u64>>,
    metadata: OnceLock<ArrowReaderMetadata>,
}

impl RegularFile {
    /// A file whose footer is read on first use (from `footer_range` when
    /// known, else from the object's tail).
    pub fn new(path: Path, row_groups: Vec<RowGroupInfo>, footer_range: Option<Range<u64>>) -> Self {
        RegularFile { path, row_groups, footer_range, metadata: OnceLock::new() }
    }

    /// The file with its footer already parsed (`metadata` must be this
    /// file's): readers need no request for it.
    pub fn with_metadata(self, metadata: ArrowReaderMetadata) -> Self {
        // Already set (read before): the same footer, kept.
        let _ = self.metadata.set(metadata);
        self
    }

    /// Total rows.
    pub fn rows(&self) -> usize {
        self.row_groups.iter().map(|r| r.rows).sum()
    }

    /// The parsed footer, read from `lake` the first time. Two threads that
    /// race here both read it; one result is kept (they are equal).
    pub fn metadata(&self, lake: &Lake) -> Result<&ArrowReaderMetadata> {
        if let Some(m) = self.metadata.get() {
            return Ok(m);
        }
        let footer = lake.read_footer_in(&self.path, self.footer_range.clone())?;
        Ok(self.metadata.get_or_init(|| footer.metadata))
    }
}

/// Where the footer of a Parquet object of `bytes` is: its last 8 bytes
/// are the footer's length (u32 LE) and `PAR1`.
pub fn footer_range(bytes: &[u8]) -> Option<Range<u64>> {
    let size = bytes.len();
    let len_at = size.checked_sub(8)?;
    let len = u32::from_le_bytes(bytes[len_at..len_at + 4].try_into().ok()?) as usize;
    let start = len_at.checked_sub(len)?;
    (&bytes[size - 4..] == b"PAR1").then_some(start as u64..size as u64)
}

/// A Parquet object's footer, with the tail bytes fetched to read it (they
/// often hold column chunks too: a small object is read whole).
pub struct Footer {
    /// The parsed footer.
    pub metadata: ArrowReaderMetadata,
    /// The object's size.
    pub size: u64,
    /// The fetched tail: its first byte's offset and the bytes.
    pub tail: (u64, Bytes),
}

/// The runtime every lake request runs on.
fn io_runtime() -> &'static tokio::runtime::Runtime {
    static IO: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    IO.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fovea-io")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start the IO runtime: {e}"))
    })
}

/// Runs `fut` on the IO runtime and waits for its output. For the
/// synchronous callers of asynchronous clients (object stores, the AWS
/// SDK); never call it from a task of the IO runtime itself.
pub fn block_on_io<F>(fut: F) -> Result<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    // Unconstrained: on a thread that is inside another tokio runtime (an
    // async test, a DataFusion task) the join handle would otherwise draw
    // on that runtime's cooperative budget, which this blocking wait never
    // lets refill — after some hundred IO calls every poll returned Pending
    // and the caller spun forever.
    futures::executor::block_on(tokio::task::unconstrained(io_runtime().spawn(fut)))
        .map_err(|e| Error::invariant(format!("an IO task failed: {e}")))
}

/// Runs `fut` on the IO runtime; the returned future (awaited on any
/// runtime) yields its output. For asynchronous callers of clients that
/// keep connections on the IO runtime.
pub fn spawn_io<F>(fut: F) -> impl std::future::Future<Output = Result<F::Output>> + Send + 'static
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handle = io_runtime().spawn(fut);
    async move { handle.await.map_err(|e| Error::invariant(format!("an IO task failed: {e}"))) }
}

/// The lake's object store with the blocking helpers the engine uses.
#[derive(Clone)]
pub struct Lake {
    store: Arc<dyn ObjectStore>,
}

impl std::fmt::Debug for Lake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lake({})", self.store)
    }
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

    /// Runs `f` (given the store) on the IO runtime and waits for it.
    fn run<T, F, Fut>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn ObjectStore>) -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>> + Send + 'static,
    {
        Ok(block_on_io(f(Arc::clone(&self.store)))??)
    }

    /// Writes an object (in parts when large).
    pub fn put(&self, path: &Path, bytes: Bytes) -> Result<()> {
        let path = path.clone();
        self.run(move |store| async move {
            if bytes.len() < MULTIPART_THRESHOLD {
                store.put(&path, PutPayload::from(bytes)).await?;
            } else {
                let upload = store.put_multipart(&path).await?;
                let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_PART);
                writer.put(bytes);
                writer.finish().await?;
            }
            Ok(())
        })
    }

    /// A writer of the object at `path` that uploads it in parts as its
    /// bytes come ([`ObjectWriter`]): an object built piece by piece takes
    /// one part of memory, not all of it.
    pub fn writer(&self, path: &Path) -> ObjectWriter {
        ObjectWriter { store: Arc::clone(&self.store), path: path.clone(), buf: Vec::new(), upload: None, size: 0 }
    }

    /// Reads a whole object (metadata objects that are used whole).
    pub fn get(&self, path: &Path) -> Result<Bytes> {
        let path = path.clone();
        self.run(move |store| async move { store.get(&path).await?.bytes().await })
    }

    /// Reads a byte range of an object.
    pub fn get_range(&self, path: &Path, range: Range<u64>) -> Result<Bytes> {
        let path = path.clone();
        self.run(move |store| async move { store.get_range(&path, range).await })
    }

    /// Reads byte ranges of an object in one call.
    pub fn get_ranges(&self, path: &Path, ranges: Vec<Range<u64>>) -> Result<Vec<Bytes>> {
        let path = path.clone();
        self.run(move |store| async move { store.get_ranges(&path, &ranges).await })
    }

    /// Deletes an object; a missing one is not an error (deletes are retried).
    pub fn delete(&self, path: &Path) -> Result<()> {
        let path = path.clone();
        self.run(move |store| async move {
            match store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    /// Every object under `prefix`.
    pub fn list(&self, prefix: &Path) -> Result<Vec<ObjectMeta>> {
        let prefix = prefix.clone();
        self.run(move |store| async move { store.list(Some(&prefix)).try_collect().await })
    }

    /// Reads the footer of the Parquet object at `path` with one request
    /// for its last [`FOOTER_FETCH`] bytes (a second one only for a larger
    /// footer).
    pub fn read_footer(&self, path: &Path) -> Result<Footer> {
        self.read_footer_in(path, None)
    }

    /// [`Self::read_footer`], fetching exactly `known` (the footer's bytes,
    /// ending at the object's end) when given.
    pub fn read_footer_in(&self, path: &Path, known: Option<Range<u64>>) -> Result<Footer> {
        let p = path.clone();
        let (tail, size) = self.run(move |store| async move {
            let range = match &known {
                Some(r) => GetRange::Bounded(r.clone()),
                None => GetRange::Suffix(FOOTER_FETCH),
            };
            let options = GetOptions { range: Some(range), ..GetOptions::default() };
            let got = store.get_opts(&p, options).await?;
            let size = got.meta.size;
            Ok((got.bytes().await?, size))
        })?;
        let tail = (size - tail.len() as u64, tail);
        let mut decoder = ParquetMetaDataPushDecoder::try_new(size)?;
        decoder.push_range(tail.0..size, tail.1.clone())?;
        let metadata = loop {
            match decoder.try_decode()? {
                DecodeResult::Data(m) => break m,
                DecodeResult::NeedsData(ranges) => {
                    let data = self.get_ranges(path, ranges.clone())?;
                    decoder.push_ranges(ranges, data)?;
                }
                DecodeResult::Finished => {
                    return Err(Error::Corrupt { what: path.to_string(), reason: "no Parquet footer".into() });
                }
            }
        };
        let metadata = ArrowReaderMetadata::try_new(Arc::new(metadata), ArrowReaderOptions::new())?;
        Ok(Footer { metadata, size, tail })
    }

    /// Reads `row_groups` of the Parquet object at `path` (footer
    /// `metadata`), the columns of `projection` only, fetching just their
    /// byte ranges; `held` are bytes already fetched (a footer's tail).
    pub fn read_row_groups(
        &self,
        path: &Path,
        metadata: &ArrowReaderMetadata,
        row_groups: Vec<usize>,
        projection: ProjectionMask,
        held: Option<&(u64, Bytes)>,
    ) -> Result<RecordBatch> {
        let rows: i64 = row_groups.iter().map(|&rg| metadata.metadata().row_group(rg).num_rows()).sum();
        let mut batches = Vec::new();
        let decoder = row_groups_decoder(metadata, row_groups, projection, rows as usize)?;
        self.decode(path, decoder, held, |b| {
            batches.push(b);
            Ok(())
        })?;
        match batches.len() {
            0 => Err(Error::Corrupt { what: path.to_string(), reason: "no rows".into() }),
            1 => Ok(batches.swap_remove(0)),
            _ => Ok(arrow::compute::concat_batches(&batches[0].schema(), &batches)?),
        }
    }

    /// Reads a flushed block back, every column (a footer request; a small
    /// block is read whole by it).
    pub fn read_block(&self, path: &Path) -> Result<RecordBatch> {
        self.read_block_columns(path, None)
    }

    /// Runs `decoder` (of the Parquet object at `path`, from
    /// [`row_groups_decoder`]) to its end, handing each batch to `each` as
    /// soon as it is decoded, fetching just the byte ranges it asks for;
    /// `held` are bytes already fetched (a footer's tail).
    pub fn decode(
        &self,
        path: &Path,
        mut decoder: ParquetPushDecoder,
        held: Option<&(u64, Bytes)>,
        mut each: impl FnMut(RecordBatch) -> Result<()>,
    ) -> Result<()> {
        loop {
            match decoder.try_decode()? {
                DecodeResult::NeedsData(ranges) => {
                    let (inside, outside): (Vec<_>, Vec<_>) = ranges.into_iter().partition(|r| {
                        held.is_some_and(|(start, bytes)| r.start >= *start && r.end <= start + bytes.len() as u64)
                    });
                    if let Some((start, bytes)) = held {
                        for r in inside {
                            let slice = bytes.slice((r.start - start) as usize..(r.end - start) as usize);
                            decoder.push_range(r, slice)?;
                        }
                    }
                    if !outside.is_empty() {
                        let data = self.get_ranges(path, outside.clone())?;
                        decoder.push_ranges(outside, data)?;
                    }
                }
                DecodeResult::Data(b) => each(b)?,
                DecodeResult::Finished => return Ok(()),
            }
        }
    }

    /// Reads a flushed block back, the named columns only (`None`: all).
    pub fn read_block_columns(&self, path: &Path, columns: Option<&[(&str, i32)]>) -> Result<RecordBatch> {
        let footer = self.read_footer(path)?;
        let projection = columns.map_or_else(ProjectionMask::all, |columns| projection_of(&footer.metadata, columns));
        let groups = (0..footer.metadata.metadata().num_row_groups()).collect();
        self.read_row_groups(path, &footer.metadata, groups, projection, Some(&footer.tail))
    }
}

/// A decoder of `row_groups` of a Parquet object (footer `metadata`), the
/// columns of `projection` only, into batches of at most `batch_rows` rows.
pub fn row_groups_decoder(
    metadata: &ArrowReaderMetadata,
    row_groups: Vec<usize>,
    projection: ProjectionMask,
    batch_rows: usize,
) -> Result<ParquetPushDecoder> {
    Ok(ParquetPushDecoderBuilder::new_with_metadata(metadata.clone())
        .with_row_groups(row_groups)
        .with_projection(projection)
        .with_batch_size(batch_rows.max(1))
        .build()?)
}

/// The projection of the stored columns `columns` (name, field id), found
/// by field id in a file that carries field ids, else by name ([`StoredColumns`]);
/// columns a file does not have (written before they were added) are left
/// out, and readers read them as NULL.
pub fn projection_of(metadata: &ArrowReaderMetadata, columns: &[(&str, i32)]) -> ProjectionMask {
    let stored = metadata.schema();
    let how = StoredColumns::of(stored);
    let roots: Vec<usize> = columns.iter().filter_map(|&(name, id)| how.index(stored, name, id)).collect();
    ProjectionMask::roots(metadata.metadata().file_metadata().schema_descr(), roots)
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

/// Encodes the batches of a block file, one row group per batch,
/// uncompressed and without dictionaries: a block lives until its virtual
/// file is combined (which encodes its rows again, with dictionaries and
/// compression), and building dictionaries was a fifth of the replay's
/// flush work (parquet's interner hashing every value) for files read
/// once or twice.
pub fn encode_block(batches: &[RecordBatch], row_group_rows: usize) -> Result<Bytes> {
    let schema =
        batches.first().map(|b| b.schema()).ok_or_else(|| Error::invariant("encode_block needs at least one batch"))?;
    let properties = writer_properties(row_group_rows, Compression::UNCOMPRESSED)
        .into_builder()
        .set_dictionary_enabled(false)
        .build();
    // Sized for the values as they are in memory (about what an
    // uncompressed file without dictionaries takes): no regrowth.
    let mut out = Vec::with_capacity(batches.iter().map(RecordBatch::get_array_memory_size).sum::<usize>() + 4096);
    let mut writer = ArrowWriter::try_new(&mut out, schema, Some(properties))?;
    for b in batches {
        writer.write(b)?;
        // One row group per batch keeps row groups aligned with blocks.
        writer.flush()?;
    }
    writer.close()?;
    Ok(Bytes::from(out))
}

/// Whether a dictionary is likely to pay for a column whose values are
/// like `column`'s: not where more than half of a sample of its values
/// (the first [`DICTIONARY_SAMPLE`] non-null ones) are distinct (keys,
/// timestamps, measurements). There the dictionary holds most values once
/// more, an index of at least 9 bits rides on every row, and building it
/// (parquet's interner hashing every value of every row group) was a
/// quarter of a combine's CPU. Columns too short to judge, and of other
/// types (nested; boolean, which has no dictionary), keep parquet's
/// default.
fn dictionary_pays(column: &dyn arrow::array::Array) -> bool {
    use arrow::array::AsArray as _;
    use arrow::datatypes::DataType;
    let present = (0..column.len()).filter(|&i| column.is_valid(i)).take(DICTIONARY_SAMPLE);
    let data = column.to_data();
    let values: Box<dyn Iterator<Item = &[u8]>> = match column.data_type() {
        DataType::Utf8 => Box::new(present.map(|i| column.as_string::<i32>().value(i).as_bytes())),
        DataType::LargeUtf8 => Box::new(present.map(|i| column.as_string::<i64>().value(i).as_bytes())),
        DataType::Utf8View => Box::new(present.map(|i| column.as_string_view().value(i).as_bytes())),
        DataType::Binary => Box::new(present.map(|i| column.as_binary::<i32>().value(i))),
        DataType::LargeBinary => Box::new(present.map(|i| column.as_binary::<i64>().value(i))),
        DataType::BinaryView => Box::new(present.map(|i| column.as_binary_view().value(i))),
        DataType::FixedSizeBinary(_) => Box::new(present.map(|i| column.as_fixed_size_binary().value(i))),
        t if t.is_primitive() => {
            let (Some(width), Some(values)) = (t.primitive_width(), data.buffers().first()) else { return true };
            // The values of a primitive array, from its offset on.
            let values = &values.as_slice()[data.offset() * width..];
            Box::new(present.map(move |i| &values[i * width..(i + 1) * width]))
        }
        _ => return true,
    };
    let mut distinct: hashbrown::HashSet<&[u8], foldhash::fast::FixedState> = Default::default();
    let mut sampled = 0;
    for value in values {
        sampled += 1;
        distinct.insert(value);
    }
    sampled < DICTIONARY_SAMPLE / 4 || distinct.len() * 2 <= sampled
}

/// Values [`dictionary_pays`] samples.
const DICTIONARY_SAMPLE: usize = 1024;

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

/// Writes a regular file a block at a time, each block one row group (a
/// combine: the blocks of a virtual file, in order, make one regular file
/// with the same file id and row order): a combine or rewrite holds the
/// encoded file and one block, not every block decoded at once.
pub struct RegularFileWriter {
    writer: Option<ArrowWriter<Vec<u8>>>,
    row_group_rows: usize,
    row_groups: Vec<RowGroupInfo>,
    rows: usize,
}

impl RegularFileWriter {
    /// A file of row groups of at most `row_group_rows` rows.
    pub fn new(row_group_rows: usize) -> Self {
        RegularFileWriter { writer: None, row_group_rows, row_groups: Vec::new(), rows: 0 }
    }

    /// Appends `block` as the next row group (the first block's schema is
    /// the file's).
    pub fn push(&mut self, block: &RecordBatch) -> Result<()> {
        let writer = match &mut self.writer {
            Some(w) => w,
            None => {
                // Dictionaries where the first block says they pay.
                let mut properties = writer_properties(self.row_group_rows, Compression::SNAPPY).into_builder();
                for (field, column) in block.schema().fields().iter().zip(block.columns()) {
                    if !dictionary_pays(column.as_ref()) {
                        properties = properties.set_column_dictionary_enabled(field.name().as_str().into(), false);
                    }
                }
                self.writer.insert(ArrowWriter::try_new(Vec::new(), block.schema(), Some(properties.build()))?)
            }
        };
        writer.write(block)?;
        // One row group per block keeps row groups aligned with blocks.
        writer.flush()?;
        let (min_ts, max_ts) = ts_range(create_ts_column(block)?);
        self.row_groups.push(RowGroupInfo { offset: self.rows, rows: block.num_rows(), min_ts, max_ts });
        self.rows += block.num_rows();
        Ok(())
    }

    /// Rows pushed.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The encoded file, footer included.
    pub fn finish(self) -> Result<(Bytes, Vec<RowGroupInfo>)> {
        let writer = self.writer.ok_or_else(|| Error::invariant("a regular file needs at least one block"))?;
        Ok((Bytes::from(writer.into_inner()?), self.row_groups))
    }

    /// Finishes the file and writes it to `path` of `lake`.
    pub fn put(self, lake: &Lake, path: Path) -> Result<RegularFile> {
        let (bytes, row_groups) = self.finish()?;
        let metadata = load_metadata(&bytes)?;
        if metadata.metadata().num_row_groups() != row_groups.len() {
            return Err(Error::invariant(format!(
                "combine wrote {} row groups for {} blocks",
                metadata.metadata().num_row_groups(),
                row_groups.len()
            )));
        }
        let file = RegularFile::new(path, row_groups, footer_range(&bytes));
        // Parsed already: readers of this process need no request for it.
        let _ = file.metadata.set(metadata);
        lake.put(&file.path, bytes)?;
        Ok(file)
    }
}

/// An object written piece by piece ([`Lake::writer`]).
///
/// Contract:
/// * nothing is visible at the path until [`ObjectWriter::finish`]
///   returns; then the whole object is (a single PUT when it stays below
///   one part, else a multipart upload completed at once, as S3 and the
///   local store do it);
/// * at most one part of bytes ([`MULTIPART_PART`], 8 MiB) is held: each
///   full part is uploaded before `write` returns, so every part but the
///   last is at least that large (S3 asks for 5 MiB);
/// * an error leaves nothing at the path, and an upload begun is aborted;
///   so is one whose writer is dropped unfinished.
pub struct ObjectWriter {
    store: Arc<dyn ObjectStore>,
    path: Path,
    buf: Vec<u8>,
    upload: Option<Box<dyn object_store::MultipartUpload>>,
    size: u64,
}

impl ObjectWriter {
    /// Appends `bytes`, uploading a part when one is full.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.buf.extend_from_slice(bytes);
        self.size += bytes.len() as u64;
        if self.buf.len() >= MULTIPART_PART {
            self.send_part()?;
        }
        Ok(())
    }

    /// Bytes written so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn send_part(&mut self) -> Result<()> {
        let part = Bytes::from(std::mem::take(&mut self.buf));
        let upload = match &mut self.upload {
            Some(upload) => upload,
            None => {
                let (store, path) = (Arc::clone(&self.store), self.path.clone());
                self.upload.insert(block_on_io(async move { store.put_multipart(&path).await })??)
            }
        };
        let sent = block_on_io(upload.put_part(PutPayload::from(part)))?;
        if let Err(e) = sent {
            self.abort();
            return Err(e.into());
        }
        Ok(())
    }

    /// Writes what is left and makes the object visible; returns its size.
    pub fn finish(mut self) -> Result<u64> {
        let rest = Bytes::from(std::mem::take(&mut self.buf));
        match self.upload.take() {
            None => {
                let (store, path) = (Arc::clone(&self.store), self.path.clone());
                block_on_io(async move { store.put(&path, PutPayload::from(rest)).await })??;
            }
            Some(mut upload) => {
                let path = self.path.clone();
                let done = block_on_io(async move {
                    let sent = async {
                        if !rest.is_empty() {
                            upload.put_part(PutPayload::from(rest)).await?;
                        }
                        upload.complete().await.map(|_| ())
                    }
                    .await;
                    if sent.is_err()
                        && let Err(e) = upload.abort().await
                    {
                        // The caller hears of the first error; parts left
                        // behind expire by the bucket's lifecycle rules.
                        tracing::warn!(%path, error = %e, "could not abort a multipart upload");
                    }
                    sent
                });
                done??;
            }
        }
        Ok(self.size)
    }

    /// Aborts an upload begun (best effort, in the background: parts a
    /// failed abort leaves behind expire by the bucket's lifecycle rules).
    fn abort(&mut self) {
        if let Some(mut upload) = self.upload.take() {
            let path = self.path.clone();
            io_runtime().spawn(async move {
                if let Err(e) = upload.abort().await {
                    tracing::warn!(%path, error = %e, "could not abort a multipart upload");
                }
            });
        }
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        self.abort();
    }
}

/// The hidden create_ts column of a file batch (always the last column).
pub fn create_ts_column(batch: &RecordBatch) -> Result<&arrow::array::Int64Array> {
    batch
        .columns()
        .last()
        .and_then(|c| c.as_any().downcast_ref::<arrow::array::Int64Array>())
        .ok_or_else(|| Error::invariant("a file batch lacks its _fovea_create_ts column"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metered::{MeteredStore, StoreMeter};
    use object_store::memory::InMemory;

    #[test]
    fn checkpoint_blocks_are_told_from_flushed_blocks_and_files_by_name() {
        let (t, f) = (TableId(3), FileId(0x2a));
        let c = checkpoint_block_path(t, f, 7, 1234);
        assert!(is_checkpoint_block(c.as_ref()));
        assert!(is_checkpoint_block(&format!("s3://bucket/lake/{c}")));
        for other in [
            block_path(t, f, 7, 3).to_string(),
            file_path(t, f).to_string(),
            combined_path(t, f, FileId(9)).to_string(),
            "tables/3/files/x-c12.parquet".into(),
            "tables/3/blocks/000000000000002a-00007-c.parquet".into(),
            "tables/3/blocks/000000000000002a-00007-c12x.parquet".into(),
        ] {
            assert!(!is_checkpoint_block(&other), "{other}");
        }
    }

    #[test]
    fn writer_epochs_come_from_the_names_fovea_gives() {
        let id = |epoch: u64, n: u64| FileId((epoch << crate::engine::FILE_ID_EPOCH_SHIFT) + n);
        let t = TableId(3);
        assert_eq!(writer_epoch(&file_path(t, id(4, 9))), Some(4));
        // A block by the writer that sealed it, whatever its file's epoch.
        assert_eq!(writer_epoch(&block_path(t, id(2, 1), 7, 3)), Some(3));
        assert_eq!(writer_epoch(&Path::from(format!("tables/3/blocks/{:016x}-00007.parquet", id(2, 1).0))), Some(2));
        // A checkpoint's own block: its file's epoch.
        assert_eq!(writer_epoch(&checkpoint_block_path(t, id(2, 1), 7, 1234)), Some(2));
        for odd in ["-00007-c.parquet", "-00007-c12x.parquet", "-7-c12.parquet"] {
            assert_eq!(writer_epoch(&Path::from(format!("tables/3/blocks/{:016x}{odd}", id(2, 1).0))), None, "{odd}");
        }
        // A combine round's output is its round's (the writer that ran it).
        assert_eq!(writer_epoch(&combined_path(t, id(1, 5), id(6, 2))), Some(6));
        let unique = id(5, 77).0;
        assert_eq!(writer_epoch(&Path::from(format!("_fovea/checkpoints/120-{unique:016x}/index-0.bin"))), Some(5));
        assert_eq!(writer_epoch(&Path::from(format!("_fovea/checkpoints/120/index-0-{unique}.bin"))), Some(5));
        assert_eq!(writer_epoch(&Path::from("_fovea/checkpoints/120/index-1.bin")), Some(0));
        for other in [
            "tables/3/files/notes.txt",
            "tables/x/files/0000000000000001.parquet",
            "tables/3/README",
            "_fovea/lake.json",
        ] {
            assert_eq!(writer_epoch(&Path::from(other)), None, "{other}");
        }
    }

    fn metered_lake() -> (Lake, Arc<StoreMeter>) {
        let meter = Arc::new(StoreMeter::default());
        (Lake::new(Arc::new(MeteredStore::new(Arc::new(InMemory::new()), Arc::clone(&meter)))), meter)
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn an_object_written_in_pieces_appears_whole_at_finish() {
        for (pieces, piece, puts) in [(3, 100, 1), (20, 1 << 20, 4)] {
            let (lake, meter) = metered_lake();
            let path = Path::from("a/b.bin");
            let mut writer = lake.writer(&path);
            let mut expected = Vec::new();
            for i in 0..pieces {
                let b = bytes(piece, i as u8);
                writer.write(&b).unwrap();
                expected.extend_from_slice(&b);
                assert!(lake.get(&path).is_err(), "nothing visible before finish");
            }
            assert_eq!(writer.size(), expected.len() as u64);
            assert_eq!(writer.finish().unwrap(), expected.len() as u64);
            assert_eq!(lake.get(&path).unwrap().as_ref(), expected.as_slice());
            // One PUT below a part; else a part per 8 MiB and the completion.
            assert_eq!(meter.counts().puts, puts, "{pieces} pieces of {piece} bytes");
        }
    }

    #[test]
    fn an_object_writer_dropped_unfinished_leaves_nothing() {
        let (lake, _) = metered_lake();
        let path = Path::from("a/c.bin");
        let mut writer = lake.writer(&path);
        writer.write(&bytes(MULTIPART_PART + 10, 1)).unwrap();
        drop(writer);
        assert!(lake.get(&path).is_err());
        assert!(lake.list(&Path::from("a")).unwrap().is_empty());
    }

    #[test]
    fn a_combined_file_has_dictionaries_where_values_repeat_only() {
        use arrow::array::{ArrayRef, Int64Array, StringArray};
        use arrow::datatypes::{DataType, Field, Schema};
        let rows = 4000i64;
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("status", DataType::Utf8, false),
            Field::new("tiny", DataType::Int64, true),
            Field::new("pairs", DataType::Int64, false),
            Field::new("mostly_distinct", DataType::Int64, false),
            Field::new(crate::schema::CREATE_TS_COLUMN, DataType::Int64, false),
        ]));
        let block = |from: i64| {
            let columns: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from_iter_values(from..from + rows)),
                // Unique where present, mostly NULL.
                Arc::new(StringArray::from_iter((from..from + rows).map(|i| (i % 3 == 0).then(|| format!("n{i}"))))),
                Arc::new(StringArray::from_iter_values(
                    (from..from + rows).map(|i| ["new", "paid", "sent"][i as usize % 3]),
                )),
                // Unique, but too few values present to judge.
                Arc::new(Int64Array::from_iter((from..from + rows).map(|i| (i % 40 == 0).then_some(i)))),
                // Half distinct: a dictionary still pays.
                Arc::new(Int64Array::from_iter_values((from..from + rows).map(|i| i / 2))),
                // Three values in four distinct: it does not.
                Arc::new(Int64Array::from_iter_values((from..from + rows).map(|i| i - (i % 4 == 3) as i64))),
                Arc::new(Int64Array::from_iter_values(from..from + rows)),
            ];
            RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
        };
        let mut writer = RegularFileWriter::new(rows as usize);
        writer.push(&block(0)).unwrap();
        writer.push(&block(rows)).unwrap();
        let (bytes, groups) = writer.finish().unwrap();
        assert_eq!(groups.len(), 2);
        let metadata = load_metadata(&bytes).unwrap();
        for group in metadata.metadata().row_groups() {
            let dictionary: Vec<bool> = group.columns().iter().map(|c| c.dictionary_page_offset().is_some()).collect();
            assert_eq!(dictionary, [false, false, true, true, true, false, false]);
        }
        // The values read back as written.
        let read: Vec<RecordBatch> = parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(bytes, 8192)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let read = arrow::compute::concat_batches(&schema, &read).unwrap();
        assert_eq!(read, arrow::compute::concat_batches(&schema, &[block(0), block(rows)]).unwrap());
    }
}
