//! Checkpoints: a durable image of the engine at one timestamp, and
//! recovery from it.
//!
//! ```text
//!  write_checkpoint()                         restore()
//!  c = HWM − 1 (under the apply sequencer)    read manifest (the catalog holds it)
//!  per shard: index live at c   ─▶ object      rebuild tables, files, index, MI,
//!             deleted rows at c ─▶ objects      visibility (folded at c), open blocks
//!  per part:  blocks ≤ c referenced,          delete objects the manifest does not name
//!             blocks straddling c cut to
//!             their prefix ≤ c, active rows
//!             ≤ c written as a short block
//!  ─▶ Manifest (the caller commits it with the input position, atomically)
//! ```
//!
//! A checkpoint is an image at `c` whatever is in flight: rows with
//! `create_ts > c` (a transaction being applied, or one that failed half
//! way) are cut from block suffixes, the index keeps only versions live at
//! `c`, visibility is the deleted set at `c`. After recovery the input is
//! replayed from the position the checkpoint recorded.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use object_store::path::Path;
use serde::{Deserialize, Serialize};

use crate::buffer::{Block, BlockData, FileKind, LakeFile};
use crate::engine::{Engine, EngineConfig, Retired};
use crate::error::{Error, Result};
use crate::ids::{FileId, RowId, TableId, Ts};
use crate::index::{ChangedKeys, ImageRun, ImageWriter, PrimaryIndex, upgrade_key};
use crate::lake::{RegularFile, RowGroupInfo, block_path, create_ts_column, encode_block};
use crate::mvcc::{Clock, lock};
use crate::replay::OpenBlock;
use crate::schema::TableDef;
use crate::visibility::FileVisibility;

/// Where lake files live.
const TABLES_PREFIX: &str = "tables";
/// Where checkpoint objects live.
const CHECKPOINTS_PREFIX: &str = "_fovea/checkpoints";

/// Version of the manifest format this fovea writes: 2 has chains of
/// index deltas and counts of deleted rows; 3 names index images of
/// format 3 (keys with short integers, see [`crate::index::encode_key`]).
/// It reads 1 and 2 as well, rewriting their index keys.
pub const MANIFEST_FORMAT: u32 = 3;

/// The engine image of one checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version.
    pub format: u32,
    /// The image is the state at this timestamp.
    pub checkpoint_ts: u64,
    /// Next file id to hand out.
    pub next_file_id: u64,
    /// Rows per block.
    pub block_rows: usize,
    /// Blocks per virtual file.
    pub blocks_per_file: usize,
    /// Tables, by id.
    pub tables: Vec<TableManifest>,
    /// Shards, by id.
    pub shards: Vec<ShardManifest>,
    /// Source commit time (µs since the Unix epoch) of the newest replayed
    /// transaction the image holds, when the input gives commit times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_commit_us: Option<i64>,
}

impl Manifest {
    /// This checkpoint as the next one extends it: its index chains, or
    /// none where they are of an older format (their keys are rewritten
    /// as they are read; a chain is not extended without its sizes, so
    /// the next checkpoint writes a base).
    pub(crate) fn to_extend(&self) -> Manifest {
        let mut m = self.clone();
        if m.format < MANIFEST_FORMAT {
            m.shards.iter_mut().for_each(|s| s.index_sizes.clear());
        }
        m
    }
}

/// A table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableManifest {
    /// Qualified name.
    pub name: String,
    /// User columns.
    pub columns: Vec<ColumnManifest>,
    /// Primary-key column indices.
    pub primary_key: Vec<usize>,
    /// The highest field id the table has given a column (0 in manifests
    /// from before fovea gave field ids: see [`TableManifest::def`]).
    #[serde(default, skip_serializing_if = "is_zero_id")]
    pub last_column_id: i32,
    /// Dropped at or below the checkpoint's ts: no snapshot at it has the
    /// table (its files and index entries are still the checkpoint's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dropped: bool,
}

impl TableManifest {
    /// The manifest entry of `def`.
    pub fn of(def: &TableDef) -> Self {
        TableManifest {
            name: def.name.clone(),
            columns: def
                .schema
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| ColumnManifest {
                    name: f.name().clone(),
                    data_type: type_name(f.data_type()),
                    nullable: f.is_nullable(),
                    id: def.column_id(i),
                    since: def.column_since(i).get(),
                })
                .collect(),
            primary_key: def.primary_key.clone(),
            last_column_id: def.column_identity().last_id,
            dropped: false,
        }
    }

    /// Its user columns as an Arrow schema.
    pub fn schema(&self) -> Result<SchemaRef> {
        let fields = self
            .columns
            .iter()
            .map(|c| Ok(Field::new(&c.name, parse_type_name(&c.data_type)?, c.nullable)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(Schema::new(fields)))
    }

    /// The table it describes, with id `id`. Columns of a manifest from
    /// before fovea gave field ids get the next ones in column order (1 to
    /// n for a manifest without any, as [`TableDef::new`] gives): the
    /// files written before carry none and are read by name.
    pub fn def(&self, id: TableId) -> Result<Arc<TableDef>> {
        let mut last_id = self.columns.iter().map(|c| c.id).max().unwrap_or(0).max(self.last_column_id);
        let ids = self
            .columns
            .iter()
            .map(|c| {
                if c.id == 0 {
                    last_id += 1;
                    last_id
                } else {
                    c.id
                }
            })
            .collect();
        let since = self.columns.iter().map(|c| Ts(c.since)).collect();
        let columns = crate::schema::ColumnIdentity { ids, since, last_id };
        TableDef::with_columns(id, &self.name, self.schema()?, self.primary_key.clone(), columns)
    }
}

/// A column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ColumnManifest {
    /// Name.
    pub name: String,
    /// Type, as [`type_name`] writes it.
    pub data_type: String,
    /// NULL allowed.
    pub nullable: bool,
    /// Its field id ([`TableDef::column_id`]; 0 in manifests from before
    /// fovea gave field ids).
    #[serde(default, skip_serializing_if = "is_zero_id")]
    pub id: i32,
    /// The mirror transaction that added it to the table, 0 (left out)
    /// where it came with the table ([`TableDef::column_since`]). Older
    /// manifests have none: a lake written before fovea told a column
    /// added again from the dropped one of its name reads as it did.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub since: u64,
}

/// Whether `n` is 0 (left out of a manifest).
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Whether field id `id` is 0, none (left out of a manifest).
fn is_zero_id(id: &i32) -> bool {
    *id == 0
}

/// A shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardManifest {
    /// Next row id.
    pub next_row_id: u64,
    /// Object holding the base image of the index (formats 2 and 3: in key
    /// order, one version per key).
    pub index: String,
    /// Deltas to apply to the base, oldest first: the keys changed since
    /// the checkpoint before, each with its version at this one or removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub index_deltas: Vec<String>,
    /// Bytes of the base and of each delta (empty in format 1: there is
    /// no chain to extend).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub index_sizes: Vec<u64>,
    /// MI ranges: start, len, file, slot, offset.
    pub ranges: Vec<[u64; 5]>,
    /// Visibility writers by slot.
    pub slots: Vec<SlotManifest>,
    /// Table parts.
    pub parts: Vec<PartManifest>,
}

/// A visibility slot (one file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlotManifest {
    /// File id.
    pub file: u64,
    /// Row capacity.
    pub capacity: usize,
    /// Object with the deleted offsets (u32 LE), if any row is deleted.
    pub deleted: Option<String>,
    /// Rows deleted (unknown in format 1). A file's deleted rows only grow,
    /// so a later checkpoint with the same count names the same object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_rows: Option<usize>,
}

/// A table part.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartManifest {
    /// Table id.
    pub table: u32,
    /// Files in order.
    pub files: Vec<FileManifest>,
    /// The block the next row continues after.
    pub open: Option<OpenManifest>,
}

/// A file of a part.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileManifest {
    /// File id.
    pub id: u64,
    /// Virtual file: sealed.
    pub sealed: bool,
    /// Virtual file: blocks.
    pub blocks: Vec<BlockManifest>,
    /// Regular file.
    pub regular: Option<RegularManifest>,
}

/// A flushed block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockManifest {
    /// Block index.
    pub index: u32,
    /// Object path.
    pub path: String,
    /// Rows.
    pub rows: usize,
    /// Smallest create_ts.
    pub min_ts: u64,
    /// Largest create_ts.
    pub max_ts: u64,
}

/// A regular file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegularManifest {
    /// Object path.
    pub path: String,
    /// Row groups: offset, rows, min_ts, max_ts.
    pub row_groups: Vec<[u64; 4]>,
    /// Byte range of the footer (start, end = object size), when known:
    /// readers fetch exactly it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub footer: Option<[u64; 2]>,
}

impl RegularManifest {
    /// The file it describes (its footer is read on first use).
    pub fn file(&self) -> RegularFile {
        RegularFile::new(
            Path::from(self.path.as_str()),
            self.row_groups
                .iter()
                .map(|g| RowGroupInfo {
                    offset: g[0] as usize,
                    rows: g[1] as usize,
                    min_ts: Ts(g[2]),
                    max_ts: Ts(g[3]),
                })
                .collect(),
            self.footer.map(|[start, end]| start..end),
        )
    }
}

/// Where a part continues.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpenManifest {
    /// File id.
    pub file: u64,
    /// Visibility slot.
    pub slot: u32,
    /// Index of the last block.
    pub index: u32,
    /// Offset of the last block.
    pub offset: usize,
    /// Rows of the last block.
    pub rows: usize,
}

/// Text form of a supported column type.
pub fn type_name(t: &DataType) -> String {
    match t {
        DataType::Decimal128(p, s) => format!("decimal({p},{s})"),
        DataType::Timestamp(_, Some(_)) => "timestamptz".into(),
        DataType::Timestamp(_, None) => "timestamp".into(),
        other => format!("{other}").to_ascii_lowercase(),
    }
}

/// Parses [`type_name`].
pub fn parse_type_name(s: &str) -> Result<DataType> {
    Ok(match s {
        "boolean" => DataType::Boolean,
        "int8" => DataType::Int8,
        "int16" => DataType::Int16,
        "int32" => DataType::Int32,
        "int64" => DataType::Int64,
        "float32" => DataType::Float32,
        "float64" => DataType::Float64,
        "utf8" => DataType::Utf8,
        "binary" => DataType::Binary,
        "date32" => DataType::Date32,
        "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, None),
        "timestamptz" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        d if d.starts_with("decimal(") => {
            let inner = d.trim_start_matches("decimal(").trim_end_matches(')');
            let (p, sc) = inner.split_once(',').ok_or_else(|| corrupt(format!("bad type {d}")))?;
            DataType::Decimal128(
                p.trim().parse().map_err(|_| corrupt(format!("bad type {d}")))?,
                sc.trim().parse().map_err(|_| corrupt(format!("bad type {d}")))?,
            )
        }
        other => return Err(corrupt(format!("unknown column type {other}"))),
    })
}

fn corrupt(reason: String) -> Error {
    Error::Corrupt { what: "checkpoint manifest".into(), reason }
}

/// An error of reading `objects`, naming them where it says what was
/// corrupt (the reader of an image knows its bytes, not where they are).
fn in_objects<'p>(objects: impl IntoIterator<Item = &'p String> + Clone + 'p) -> impl Fn(Error) -> Error + 'p {
    move |e| match e {
        Error::Corrupt { what, reason } => {
            let names: Vec<&str> = objects.clone().into_iter().map(String::as_str).collect();
            Error::Corrupt { what: format!("{what} ({})", names.join(", ")), reason }
        }
        other => other,
    }
}

/// The rows the deleted-rows object `object` lists: 4-byte little-endian
/// row numbers, as a checkpoint writes them (any other length is corrupt).
/// Recovery, checkpoint readers and publishers all read them through this.
pub fn deleted_rows_of<'b>(object: &str, bytes: &'b [u8]) -> Result<impl Iterator<Item = u32> + 'b> {
    if !bytes.len().is_multiple_of(4) {
        return Err(Error::Corrupt {
            what: format!("deleted rows ({object})"),
            reason: format!("{} bytes are not a whole number of 4-byte row numbers", bytes.len()),
        });
    }
    Ok(bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
}

/// Rows of a file batch with `create_ts ≤ c` (a prefix: create_ts ascends).
fn prefix_at(batch: &RecordBatch, c: Ts) -> Result<RecordBatch> {
    let ts = create_ts_column(batch)?;
    let n = ts.values().partition_point(|&t| t as u64 <= c.get());
    Ok(batch.slice(0, n))
}

/// A base index image is rewritten (base and deltas merged into one) once
/// this many deltas follow it, or once they hold half its bytes and at
/// least [`MERGE_BYTES`].
const MAX_INDEX_DELTAS: usize = 8;

/// Deltas smaller than this are not worth a merge before
/// [`MAX_INDEX_DELTAS`] of them.
const MERGE_BYTES: u64 = 1 << 20;

/// Changed keys looked up per hold of a shard's lock.
const LOOKUPS_PER_LOCK: usize = 4096;

/// Bytes of an index image handed to the store at a time (the store
/// uploads them in parts of 8 MiB).
const IMAGE_PIECE: usize = 1 << 20;

/// What a checkpoint keeps of one shard at its timestamp.
struct ShardCapture {
    next_row_id: u64,
    ranges: Vec<[u64; 5]>,
    /// Visibility by slot.
    slots: Vec<Arc<FileVisibility>>,
    parts: Vec<PartCapture>,
}

/// What a checkpoint keeps of one table part.
struct PartCapture {
    table: TableId,
    files: Vec<LakeFile>,
    /// The active block's file and rows.
    active: Option<(FileId, RecordBatch)>,
    /// Index of the open block.
    open_index: Option<u32>,
}

/// A checkpoint captured at one timestamp and not yet written.
///
/// [`Engine::capture_checkpoint`] takes, under each shard's lock and
/// briefly, what changes in place (the keys the index changed, the MI
/// ranges, the visibility of each slot, each part's files and active rows);
/// [`PendingCheckpoint::write`] then writes the objects with applies going
/// on beside it, holding a shard's lock only to look up changed keys, a
/// few thousand at a time, and never across IO. What it reads stays as it
/// was at `c`: its snapshot keeps LWM (so memory GC) at or below `c`, and
/// storage GC swaps wait until it is written. Dropped before the manifest
/// is committed (an error, a failed commit), it gives the changed keys
/// back, so the next checkpoint writes them.
pub struct PendingCheckpoint {
    engine: Arc<Engine>,
    c: Ts,
    number: u64,
    _pin: crate::mvcc::Snapshot,
    /// Every table created by the checkpoint's ts, and whether it was
    /// dropped by then.
    tables: Vec<(Arc<TableDef>, bool)>,
    next_file_id: u64,
    /// A number no other checkpoint of the lake names objects with (a file
    /// id taken for it): the index deltas of a checkpoint at its committed
    /// checkpoint's ts go beside that one's objects under it.
    unique: u64,
    shards: Vec<ShardCapture>,
    /// Keys each shard's index changed since the committed checkpoint.
    changed: Vec<ChangedKeys>,
    /// Whether this checkpoint holds storage GC's swaps off.
    holds_image: bool,
    /// Whether the shards' objects are written at the same time, each on
    /// a thread of its own (see [`Self::write_shards_at_once`]).
    shards_at_once: bool,
}

impl PendingCheckpoint {
    /// The timestamp the checkpoint is an image at.
    pub fn ts(&self) -> Ts {
        self.c
    }

    /// The engine it is a checkpoint of.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Has [`Self::write`] write every shard's objects at the same time,
    /// each on a thread of its own, for a checkpoint that nothing else runs
    /// beside (one the caller waits for, as at the end of the input): it
    /// then takes the time of its largest shard, not of all of them in
    /// turn. A checkpoint written beside the replay writes one shard after
    /// another: it shares the cores with the replay anyway, and holds one
    /// image upload's part buffer at a time, not one per shard.
    pub fn write_shards_at_once(&mut self) {
        self.shards_at_once = true;
    }

    /// Writes the checkpoint's objects and returns its manifest, which
    /// takes effect when the caller commits it (with the input position)
    /// to the catalog and tells [`Engine::checkpoint_committed`]. Index
    /// and deleted rows are written incrementally: a delta of the keys
    /// changed since the committed checkpoint (merged into a new base image
    /// now and then), and the deleted rows only of files with new deletes.
    pub fn write(&mut self) -> Result<Manifest> {
        let out = self.write_objects();
        self.release_image();
        out
    }

    fn release_image(&mut self) {
        if std::mem::take(&mut self.holds_image) {
            *lock(&self.engine.image) = false;
            self.engine.image_written.notify_all();
        }
    }

    fn write_objects(&self) -> Result<Manifest> {
        let engine = &*self.engine;
        let c = self.c;
        // One directory per attempt, named by its unique id (which
        // carries the writer's epoch): a fenced predecessor checkpointing
        // the same ts never writes over this writer's objects.
        let dir = format!("{CHECKPOINTS_PREFIX}/{}-{:016x}", c.get(), self.unique);
        // The chain of the committed checkpoint, which `changed` is relative to.
        let committed = lock(&engine.last_checkpoint).clone();
        let write = |s: usize| self.write_shard(s, &dir, committed.as_deref());
        let shards = if self.shards_at_once && self.shards.len() > 1 {
            // The shards share nothing here but the store.
            std::thread::scope(|scope| -> Result<Vec<ShardManifest>> {
                let others: Vec<_> = (1..self.shards.len())
                    .map(|s| {
                        std::thread::Builder::new()
                            .name(format!("fovea-checkpoint-{s}"))
                            .spawn_scoped(scope, move || write(s))
                            .map_err(Error::Io)
                    })
                    .collect::<Result<_>>()?;
                let mut shards = vec![write(0)];
                for thread in others {
                    shards.push(thread.join().map_err(|_| Error::invariant("a checkpoint shard writer panicked"))?);
                }
                shards.into_iter().collect()
            })?
        } else {
            (0..self.shards.len()).map(write).collect::<Result<Vec<_>>>()?
        };
        // Objects retired before this checkpoint began are left out of it:
        // once it is committed, nothing durable names them.
        lock(&engine.retired).left_out_of(self.number, c.get(), self.next_file_id);
        Ok(Manifest {
            format: MANIFEST_FORMAT,
            checkpoint_ts: c.get(),
            next_file_id: self.next_file_id,
            block_rows: engine.config.block_rows,
            blocks_per_file: engine.config.blocks_per_file,
            tables: self
                .tables
                .iter()
                .map(|(t, dropped)| TableManifest { dropped: *dropped, ..TableManifest::of(t) })
                .collect(),
            shards,
            source_commit_us: engine.source_commit_at(c).map(|(_, us)| us),
        })
    }

    /// Writes shard `s`'s objects into `dir`: its index (a delta of the
    /// keys changed since `committed`, merged into a new base now and then),
    /// the deleted rows of files with new deletes, and what its parts need.
    fn write_shard(&self, s: usize, dir: &str, committed: Option<&Manifest>) -> Result<ShardManifest> {
        let engine = &*self.engine;
        let lake = &engine.lake;
        let c = self.c;
        let (capture, changed) = (&self.shards[s], &self.changed[s]);
        let previous = committed.and_then(|m| m.shards.get(s));
        let began = std::time::Instant::now();
        let keys = changed.sorted();
        let chain = previous.filter(|p| p.index_sizes.len() == 1 + p.index_deltas.len());
        let since = committed.map_or(0, |m| m.checkpoint_ts);
        // Without a chain to extend every key is in `changed`, and the
        // image is a base; else a delta. The committed checkpoint may
        // be an image at `c` already (no commit since): its objects
        // serve, none is written (the look-ups still are made: they
        // carry keys changed above `c` into the next set) — unless keys
        // changed all the same, their rows moved by storage GC.
        let base_path = format!("{dir}/index-{s}.bin");
        // At the committed checkpoint's ts, `dir` is that checkpoint's: what
        // is written here must not replace an object it names.
        let same_ts = since == c.get();
        let (path, write) = match chain {
            // A base at the committed checkpoint's ts (one of an older
            // format made anew) must not replace the base that
            // checkpoint's chain starts from.
            None if same_ts => (format!("{dir}/index-{s}-{}.bin", self.unique), true),
            None => (base_path.clone(), true),
            // Named by both ends: whoever writes it writes the
            // changes between the same two images.
            Some(_) if !same_ts => (format!("{dir}/index-{s}-since-{since}.delta"), true),
            Some(_) if keys.is_empty() => (String::new(), false),
            // Keys changed without a commit: storage GC moved their rows
            // (new row ids). The committed image would point them at rows
            // that no longer have a location.
            Some(_) => (format!("{dir}/index-{s}-since-{since}-{}.delta", self.unique), true),
        };
        // Streamed to the store as the look-ups go: one part of the
        // image in memory, not the image.
        let mut object = write.then(|| lake.writer(&Path::from(path.as_str())));
        let mut image = ImageWriter::new(keys.len() as u64);
        for chunk in (0..keys.len()).step_by(LOOKUPS_PER_LOCK) {
            {
                let mut shard = lock(&engine.shards[s]);
                for k in (chunk..keys.len().min(chunk + LOOKUPS_PER_LOCK)).map(|i| keys.get(i)) {
                    image.push(k, shard.index.checkpoint_version(k, c));
                }
            }
            if let Some(piece) = image.take_piece(IMAGE_PIECE)
                && let Some(object) = &mut object
            {
                object.write(&piece)?;
            }
        }
        let last = image.finish()?;
        let size = match object {
            Some(mut object) => {
                object.write(&last)?;
                object.finish()?
            }
            None => 0,
        };
        let (index, index_deltas, index_sizes) = match chain {
            Some(p) if !write => (p.index.clone(), p.index_deltas.clone(), p.index_sizes.clone()),
            None => (path, Vec::new(), vec![size]),
            Some(p) => {
                let behind: u64 = p.index_sizes[1..].iter().sum::<u64>() + size;
                // (Not at the committed checkpoint's ts: the merged base would
                // replace the one it may name under the same name.)
                if !same_ts
                    && (p.index_deltas.len() + 1 >= MAX_INDEX_DELTAS
                        || (behind > p.index_sizes[0] / 2 && behind >= MERGE_BYTES))
                {
                    // (The delta just written is named by no manifest:
                    // the next vacuum deletes it.) Streamed: the runs
                    // are read a range at a time, the merged image
                    // written a part at a time.
                    let runs_at = [&p.index].into_iter().chain(&p.index_deltas).chain([&path]);
                    let merged = runs_at.clone();
                    let sizes = p.index_sizes.iter().copied().chain([size]);
                    let mut runs: Vec<ImageRun<'_>> = runs_at
                        .zip(sizes)
                        .map(|(at, size)| {
                            let at = Path::from(at.as_str());
                            ImageRun::new(size, IMAGE_PIECE, move |range| lake.get_range(&at, range))
                        })
                        .collect();
                    let mut object = lake.writer(&Path::from(base_path.as_str()));
                    crate::index::merge_images_into(&mut runs, IMAGE_PIECE, |piece| object.write(piece))
                        .map_err(in_objects(merged))?;
                    let size = object.finish()?;
                    (base_path, Vec::new(), vec![size])
                } else {
                    let mut deltas = p.index_deltas.clone();
                    deltas.push(path);
                    let mut sizes = p.index_sizes.clone();
                    sizes.push(size);
                    (p.index.clone(), deltas, sizes)
                }
            }
        };
        tracing::debug!(
            shard = s,
            keys = keys.len(),
            deltas = index_deltas.len(),
            ms = began.elapsed().as_secs_f64() * 1e3,
            "checkpoint index"
        );
        // Deleted rows only grow while a file keeps its id: the same
        // count means the same set, and the object written then serves.
        let written: HashMap<u64, &SlotManifest> =
            previous.map(|p| p.slots.iter().map(|x| (x.file, x)).collect()).unwrap_or_default();
        let mut slots = Vec::with_capacity(capture.slots.len());
        let mut slot_of = HashMap::new();
        for (i, vis) in capture.slots.iter().enumerate() {
            slot_of.insert(vis.file(), i as u32);
            let deleted = vis.deleted_rows(c)?;
            let same = written
                .get(&vis.file().0)
                .filter(|p| p.deleted_rows == Some(deleted.len()) && p.capacity == vis.capacity());
            let deleted_path = match same {
                _ if deleted.is_empty() => None,
                Some(p) => p.deleted.clone(),
                None => {
                    let p = format!("{dir}/deleted-{}.bin", vis.file().0);
                    let bytes: Vec<u8> = deleted.iter().flat_map(|d| d.to_le_bytes()).collect();
                    lake.put(&Path::from(p.as_str()), Bytes::from(bytes))?;
                    Some(p)
                }
            };
            slots.push(SlotManifest {
                file: vis.file().0,
                capacity: vis.capacity(),
                deleted: deleted_path,
                deleted_rows: Some(deleted.len()),
            });
        }
        let mut parts = Vec::with_capacity(capture.parts.len());
        for part in &capture.parts {
            parts.push(write_part(lake, part, &slot_of, c)?);
        }
        Ok(ShardManifest {
            next_row_id: capture.next_row_id,
            index,
            index_deltas,
            index_sizes,
            ranges: capture.ranges.clone(),
            slots,
            parts,
        })
    }
}

impl Drop for PendingCheckpoint {
    fn drop(&mut self) {
        // Acquire: pairs with the Release in `checkpoint_committed`.
        // (Not by ts: an earlier checkpoint at the same ts may be the
        // committed one.)
        let committed = self.engine.committed_checkpoint.load(Ordering::Acquire) >= self.next_file_id;
        if !committed {
            for (shard, keys) in self.engine.shards.iter().zip(&self.changed) {
                if !keys.is_empty() {
                    lock(shard).index.restore_changed(keys);
                }
            }
        }
        self.release_image();
    }
}

/// Writes what a part needs beyond the objects it names already: blocks
/// still in memory, and blocks straddling `c` cut to their prefix `≤ c`.
fn write_part(
    lake: &crate::lake::Lake,
    part: &PartCapture,
    slot_of: &HashMap<FileId, u32>,
    c: Ts,
) -> Result<PartManifest> {
    let mut files = Vec::with_capacity(part.files.len());
    let mut open = None;
    for f in &part.files {
        let slot = *slot_of.get(&f.id).ok_or_else(|| Error::invariant(format!("{} has no visibility slot", f.id)))?;
        match &f.kind {
            FileKind::Regular(r) => {
                if r.row_groups.iter().any(|g| g.max_ts > c) {
                    return Err(Error::invariant(format!("regular {} holds rows newer than the checkpoint", f.id)));
                }
                files.push(FileManifest {
                    id: f.id.0,
                    sealed: true,
                    blocks: Vec::new(),
                    regular: Some(RegularManifest {
                        path: r.path.to_string(),
                        row_groups: r
                            .row_groups
                            .iter()
                            .map(|g| [g.offset as u64, g.rows as u64, g.min_ts.get(), g.max_ts.get()])
                            .collect(),
                        footer: r.footer_range.as_ref().map(|f| [f.start, f.end]),
                    }),
                });
            }
            FileKind::Virtual { blocks, sealed } => {
                let mut out = Vec::new();
                let mut offset = 0;
                let mut batches: Vec<(u32, Option<Arc<Block>>, Option<RecordBatch>)> =
                    blocks.iter().map(|b| (b.index, Some(Arc::clone(b)), None)).collect();
                if let Some((file, batch)) = &part.active
                    && *file == f.id
                {
                    let index = part.open_index.unwrap_or(blocks.len() as u32);
                    batches.push((index, None, Some(batch.clone())));
                }
                for (index, block, batch) in batches {
                    let (path, rows, min_ts, max_ts) = match (&block, batch) {
                        (Some(b), _) if b.max_ts <= c => {
                            let path = match &b.data {
                                BlockData::Flushed(p) => p.clone(),
                                BlockData::Memory(batch) => {
                                    let p = block_path(part.table, f.id, b.index, b.writer);
                                    lake.put(&p, encode_block(std::slice::from_ref(batch), b.rows)?)?;
                                    p
                                }
                            };
                            (path, b.rows, b.min_ts, b.max_ts)
                        }
                        (block, batch) => {
                            let full = match (block, batch) {
                                (_, Some(batch)) => batch,
                                (Some(b), None) => match &b.data {
                                    BlockData::Memory(batch) => batch.clone(),
                                    BlockData::Flushed(p) => lake.read_block(p)?,
                                },
                                (None, None) => unreachable!("one of block or batch is set"),
                            };
                            let cut = prefix_at(&full, c)?;
                            if cut.num_rows() == 0 {
                                break;
                            }
                            let (min_ts, max_ts) = crate::lake::ts_range(create_ts_column(&cut)?);
                            let p = crate::lake::checkpoint_block_path(part.table, f.id, index, c.get());
                            lake.put(&p, encode_block(std::slice::from_ref(&cut), cut.num_rows())?)?;
                            (p, cut.num_rows(), min_ts, max_ts)
                        }
                    };
                    open = Some(OpenManifest { file: f.id.0, slot, index, offset, rows });
                    offset += rows;
                    out.push(BlockManifest {
                        index,
                        path: path.to_string(),
                        rows,
                        min_ts: min_ts.get(),
                        max_ts: max_ts.get(),
                    });
                    if max_ts > c {
                        break;
                    }
                }
                files.push(FileManifest { id: f.id.0, sealed: *sealed, blocks: out, regular: None });
            }
        }
    }
    // Only the last, unsealed virtual file continues.
    let open = open.filter(|o| files.last().is_some_and(|f| f.id == o.file && !f.sealed && f.regular.is_none()));
    Ok(PartManifest { table: part.table.0, files, open })
}

impl Engine {
    /// Writes the objects of a checkpoint at `HWM − 1` and returns its
    /// manifest ([`Engine::capture_checkpoint`] then
    /// [`PendingCheckpoint::write`]). The checkpoint takes effect when the
    /// caller commits the manifest (with the input position) to the
    /// catalog.
    pub fn write_checkpoint(self: &Arc<Self>) -> Result<Manifest> {
        self.capture_checkpoint()?.write()
    }

    /// Captures a checkpoint at `c = HWM − 1`, to be written by
    /// [`PendingCheckpoint::write`] (on any thread, applies going on).
    /// One checkpoint is captured or written at a time: this fails while
    /// another is being written.
    pub fn capture_checkpoint(self: &Arc<Self>) -> Result<PendingCheckpoint> {
        let mut image = lock(&self.image);
        if *image {
            return Err(Error::invariant("a checkpoint is being written already: one at a time"));
        }
        let pin = self.clock.snapshot();
        let c = pin.qts();
        let number = lock(&self.retired).begin_checkpoint();
        // Release: pairs with the Acquire in `gc`.
        self.checkpointing.store(true, Ordering::Release);
        let tables = self.checkpoint_tables_at(c);
        if tables.iter().enumerate().any(|(i, (t, _))| t.id.0 as usize != i) {
            return Err(Error::invariant("tables left out of a checkpoint must be the newest ones"));
        }
        let included: HashSet<TableId> = tables.iter().map(|(t, _)| t.id).collect();
        // Built first, so that an error below gives the keys taken back.
        let mut pending = PendingCheckpoint {
            engine: Arc::clone(self),
            c,
            number,
            _pin: pin,
            tables,
            next_file_id: 0,
            unique: 0,
            shards: Vec::with_capacity(self.shards.len()),
            changed: Vec::with_capacity(self.shards.len()),
            holds_image: false,
            shards_at_once: false,
        };
        for shard in &self.shards {
            let mut shard = lock(shard);
            pending.changed.push(shard.index.take_changed(c));
            let mut parts = Vec::new();
            let mut tables: Vec<_> = shard.parts.iter().filter(|(t, _)| included.contains(t)).collect();
            tables.sort_by_key(|(t, _)| **t);
            for (table, pw) in tables {
                let mut state = lock(&pw.part.state);
                let active = match &mut state.active {
                    Some(a) => Some((a.file, a.builder.snapshot()?)),
                    None => None,
                };
                parts.push(PartCapture {
                    table: *table,
                    files: state.files.clone(),
                    active,
                    open_index: pw.open.as_ref().map(|o| o.index),
                });
            }
            pending.shards.push(ShardCapture {
                next_row_id: shard.next_row_id,
                ranges: shard
                    .main
                    .ranges()
                    .iter()
                    .map(|r| [r.start, u64::from(r.len), r.file.0, u64::from(r.file_slot), u64::from(r.offset)])
                    .collect(),
                slots: shard.writers.iter().map(|w| Arc::clone(w.visibility())).collect(),
                parts,
            });
        }
        // Relaxed: ids only need to be unique. Taken before `next_file_id`
        // is read: no process that recovers this checkpoint takes it again.
        pending.unique = self.file_ids.fetch_add(1, Ordering::Relaxed);
        // Relaxed: read after every shard lock above; ids allocated later
        // belong to nothing this checkpoint names.
        pending.next_file_id = self.file_ids.load(Ordering::Relaxed);
        *image = true;
        pending.holds_image = true;
        Ok(pending)
    }

    /// True while a captured checkpoint is being written. A maintenance
    /// loop waits for it before a round: the two at once add their memory
    /// peaks (a checkpoint's index images, combine's blocks) and their CPU.
    pub fn checkpoint_being_written(&self) -> bool {
        *lock(&self.image)
    }

    /// Waits until no checkpoint is being written and returns the guard
    /// that keeps a new one from being captured: storage GC swaps hold it
    /// (a swap moves rows a checkpoint being written reads).
    pub(crate) fn no_image_in_progress(&self) -> std::sync::MutexGuard<'_, bool> {
        let mut image = lock(&self.image);
        while *image {
            image = self.image_written.wait(image).unwrap_or_else(|p| p.into_inner());
        }
        image
    }

    /// Rebuilds an engine from a checkpoint manifest, then (when `vacuum`)
    /// deletes the objects under `tables/` and `_fovea/checkpoints/` that
    /// the manifest does not name (written after it by a process that
    /// crashed). Readers of a lake a replayer is writing must not vacuum.
    pub fn restore(
        store: Arc<dyn object_store::ObjectStore>,
        clock: Arc<Clock>,
        m: &Manifest,
        vacuum: bool,
    ) -> Result<Arc<Engine>> {
        Self::restore_with_grace(store, clock, m, vacuum, std::time::Duration::ZERO)
    }

    /// [`Engine::restore`] with a retire grace
    /// ([`EngineConfig::retire_grace`]): lake files the vacuum finds that
    /// are younger than it are retired, deleted once it has passed,
    /// instead of at once.
    pub fn restore_with_grace(
        store: Arc<dyn object_store::ObjectStore>,
        clock: Arc<Clock>,
        m: &Manifest,
        vacuum: bool,
        retire_grace: std::time::Duration,
    ) -> Result<Arc<Engine>> {
        if !(1..=MANIFEST_FORMAT).contains(&m.format) {
            return Err(corrupt(format!("format {} (this fovea reads 1 to {MANIFEST_FORMAT})", m.format)));
        }
        if clock.latest() < Ts(m.checkpoint_ts) {
            return Err(corrupt(format!(
                "the checkpoint is at ts {} but the timestamp store is at {}",
                m.checkpoint_ts,
                clock.latest()
            )));
        }
        let config = EngineConfig {
            shards: m.shards.len(),
            block_rows: m.block_rows,
            blocks_per_file: m.blocks_per_file,
            retire_grace,
        };
        let engine = Engine::open(store, clock, config)?;
        let mut key_types: HashMap<u32, Vec<DataType>> = HashMap::new();
        for t in &m.tables {
            let def = engine.restore_table(t)?;
            if t.dropped {
                // Before a table of the same name that follows it.
                engine.restore_dropped(def.id, Ts(m.checkpoint_ts));
            }
            // Index images before format 3 hold integer keys in 9 bytes:
            // their keys are rewritten by the types of the tables' key columns.
            let types = def.primary_key.iter().map(|&i| def.schema.field(i).data_type().clone()).collect();
            key_types.insert(def.id.0, types);
        }
        let upgrade = |key: &[u8]| upgrade_key(key, |t| key_types.get(&t.0).map(Vec::as_slice));
        // The chains the next checkpoint extends (none of an older format).
        let to_extend = m.to_extend();
        let c = Ts(m.checkpoint_ts);
        let lake = engine.lake.clone();
        let mut named: HashSet<String> = HashSet::new();
        engine.file_ids.store(m.next_file_id, Ordering::Relaxed);
        for (s, sm) in m.shards.iter().enumerate() {
            let mut shard = lock(&engine.shards[s]);
            named.insert(sm.index.clone());
            shard.index = PrimaryIndex::read_from(&lake.get(&Path::from(sm.index.as_str()))?, Some(&upgrade))
                .map_err(in_objects([&sm.index]))?;
            for d in &sm.index_deltas {
                named.insert(d.clone());
                shard
                    .index
                    .apply_delta(&lake.get(&Path::from(d.as_str()))?, Some(&upgrade))
                    .map_err(in_objects([d]))?;
            }
            if to_extend.shards[s].index_sizes.is_empty() {
                // No chain to extend (format 1), or one of older keys
                // (format 2): the next checkpoint writes a base image of
                // every key.
                shard.index.mark_all_changed();
            }
            shard.next_row_id = sm.next_row_id;
            shard.last_ts = c;
            for r in &sm.ranges {
                shard.main.add_range(RowId(r[0]), r[1] as u32, FileId(r[2]), r[3] as u32, r[4] as u32)?;
            }
            let mut vis_of = HashMap::new();
            for slot in &sm.slots {
                let deleted: Vec<u32> = match &slot.deleted {
                    Some(p) => {
                        named.insert(p.clone());
                        let bytes = lake.get(&Path::from(p.as_str()))?;
                        deleted_rows_of(p, &bytes)?.collect()
                    }
                    None => Vec::new(),
                };
                let (vis, writer) = FileVisibility::restore(FileId(slot.file), slot.capacity, &deleted, c)
                    .map_err(in_objects(slot.deleted.as_ref()))?;
                vis_of.insert(slot.file, vis);
                shard.writers.push(writer);
            }
            for pm in &sm.parts {
                let pw = shard
                    .parts
                    .get_mut(&TableId(pm.table))
                    .ok_or_else(|| corrupt(format!("part of unknown table {}", pm.table)))?;
                let mut files = Vec::with_capacity(pm.files.len());
                for f in &pm.files {
                    let vis =
                        Arc::clone(vis_of.get(&f.id).ok_or_else(|| corrupt(format!("file {} has no slot", f.id)))?);
                    let kind = match &f.regular {
                        Some(r) => {
                            named.insert(r.path.clone());
                            // Its footer is read when a scan first needs it.
                            FileKind::Regular(Arc::new(r.file()))
                        }
                        None => FileKind::Virtual {
                            blocks: f
                                .blocks
                                .iter()
                                .map(|b| {
                                    named.insert(b.path.clone());
                                    Arc::new(Block {
                                        index: b.index,
                                        rows: b.rows,
                                        min_ts: Ts(b.min_ts),
                                        max_ts: Ts(b.max_ts),
                                        data: BlockData::Flushed(Path::from(b.path.as_str())),
                                        writer: 0,
                                    })
                                })
                                .collect(),
                            sealed: f.sealed,
                        },
                    };
                    files.push(LakeFile { id: FileId(f.id), vis, kind });
                }
                lock(&pw.part.state).files = files;
                pw.open = pm.open.as_ref().map(|o| OpenBlock {
                    file: FileId(o.file),
                    slot: o.slot,
                    index: o.index,
                    offset: o.offset,
                    rows: o.rows,
                    capacity: o.rows,
                    row_id_start: 0,
                });
            }
        }
        drop(lake);
        // The next checkpoint extends this one's chains: the keys changed
        // since are what it writes.
        *lock(&engine.last_checkpoint) = Some(Arc::new(to_extend));
        if vacuum {
            engine.vacuum(&named, Some(m))?;
        }
        engine.checkpointing.store(true, Ordering::Release);
        Ok(engine)
    }

    /// Deletes the litter of crashed runs: objects under `tables/` and
    /// `_fovea/checkpoints/` that `named` (the restored checkpoint's
    /// objects) leaves out and that fovea provably wrote before this
    /// writer's epoch — their names carry a file id of an earlier epoch.
    /// One of this epoch or a later one cannot be a predecessor's (this
    /// writer has just been granted its epoch and wrote nothing yet): the
    /// state is older than the lake (a state table restored from an older
    /// backup), an error, and nothing is deleted. Objects fovea does not
    /// name so are left alone. Without a lease (epoch 0) every unnamed
    /// object of fovea's is litter.
    ///
    /// Lake files younger than the retire grace, left out of `restored`
    /// (the checkpoint restored), are retired instead: deleted once the
    /// grace has passed since they were written — a reader of a published
    /// Iceberg snapshot from before the restart may read them (files that
    /// combine or storage GC replaced while their retire grace ran).
    pub(crate) fn vacuum(&self, named: &HashSet<String>, restored: Option<&Manifest>) -> Result<usize> {
        let epoch = self.clock.epoch();
        let grace = lock(&self.retired).grace;
        let now_ms = crate::catalog::now_us() / 1000;
        let mut litter = Vec::new();
        let mut young = Vec::new();
        for prefix in [TABLES_PREFIX, CHECKPOINTS_PREFIX] {
            for meta in self.lake.list(&Path::from(prefix))? {
                let path = meta.location;
                if named.contains(path.as_ref()) {
                    continue;
                }
                match crate::lake::writer_epoch(&path) {
                    // (Epoch 0: no lease, an engine of its own; nothing to tell apart.)
                    Some(e) if epoch > 0 && e >= epoch => {
                        return Err(Error::WrongState(format!(
                            "the lake holds {path}, written under lease epoch {e}, but its state grants this writer \
                             epoch {epoch}: the state is older than the lake (restored from an earlier backup?). Nothing \
                             was deleted. Help: use the state the lake was last written with"
                        )));
                    }
                    Some(_) => {
                        let age = std::time::Duration::from_millis(
                            u64::try_from(now_ms - meta.last_modified.timestamp_millis()).unwrap_or_default(),
                        );
                        if prefix == TABLES_PREFIX && restored.is_some() && age < grace {
                            young.push((path, age));
                        } else {
                            litter.push(path);
                        }
                    }
                    None => tracing::warn!("{path} is not an object fovea names: recovery leaves it alone"),
                }
            }
        }
        if let (Some(m), false) = (restored, young.is_empty()) {
            let started = std::time::Instant::now();
            let mut retired = lock(&self.retired);
            for (path, age) in young {
                // Its grace runs from when it was written.
                let written = started.checked_sub(age).unwrap_or(started);
                retired.entries.push(Retired::left_out(vec![path], (m.checkpoint_ts, m.next_file_id), written));
            }
        }
        for path in &litter {
            self.lake.delete(path)?;
        }
        Ok(litter.len())
    }

    /// Deletes checkpoint objects that `current` (this writer's newest
    /// committed checkpoint) does not name and that this writer or a
    /// predecessor wrote: their names carry a writer epoch no later than
    /// this writer's. An object of a later epoch is a successor's (this
    /// writer was fenced after its commit, perhaps paused before this
    /// clean-up): it stays, and so does everything else — a fenced writer
    /// deletes nothing. Objects fovea does not name so are left alone;
    /// without a lease (epoch 0) every other unnamed object is deleted.
    /// The successor restored from `current` or a later checkpoint, so what
    /// an earlier epoch wrote and `current` leaves out is named by none of
    /// its checkpoints.
    pub fn drop_old_checkpoints(&self, current: &Manifest) -> Result<usize> {
        // A reader on another host still restoring an older checkpoint
        // keeps it (and every one after it) until it is done.
        if self.oldest_reader()?.is_some_and(|q| q.get() < current.checkpoint_ts) {
            return Ok(0);
        }
        let mut named = HashSet::new();
        for s in &current.shards {
            named.insert(s.index.clone());
            named.extend(s.index_deltas.iter().cloned());
            named.extend(s.slots.iter().filter_map(|x| x.deleted.clone()));
        }
        let epoch = self.clock.epoch();
        let mut doomed = Vec::new();
        for meta in self.lake.list(&Path::from(CHECKPOINTS_PREFIX))? {
            if named.contains(meta.location.as_ref()) {
                continue;
            }
            match crate::lake::writer_epoch(&meta.location) {
                // (Epoch 0: no lease, an engine of its own; nothing to tell apart.)
                Some(e) if epoch > 0 && e > epoch => return Err(Error::Fenced { epoch, current: e }),
                Some(_) => doomed.push(meta.location),
                // (Recovery's vacuum warns about it once; not every checkpoint.)
                None => tracing::debug!("{} is not an object fovea names: the clean-up leaves it alone", meta.location),
            }
        }
        for path in &doomed {
            self.lake.delete(path)?;
        }
        Ok(doomed.len())
    }
}
