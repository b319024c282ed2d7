//! A reader of the lake as of its newest checkpoint that opens only what
//! it reads: the manifest's file list, then per scanned file its footer
//! (one request, at a known byte range when the manifest has it) and its
//! deleted rows (one small object), on first use. The primary index, the
//! tiles and the timestamp store are never loaded — a reader process
//! needs none of them to answer at the checkpoint's snapshot.
//!
//! ```text
//!  catalog ─▶ newest manifest (tables, files, row groups, blocks, deleted-row objects)
//!  scan(t) ─▶ t's files only ─▶ per split: footer on first use, deleted rows on first use
//! ```
//!
//! Every answer is the lake as of the checkpoint's timestamp `c`: rows
//! with `create_ts ≤ c` not deleted at `c`. A registration taken before
//! the manifest was read (see [`crate::location::open_reader`]) keeps the
//! writer from retiring the files the manifest names while the reader
//! lives.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use object_store::ObjectStore;
use object_store::path::Path;

use crate::buffer::{Block, BlockData, FileKind};
use crate::checkpoint::{MANIFEST_FORMAT, Manifest};
use crate::error::{Error, Result};
use crate::ids::{FileId, TableId, Ts};
use crate::lake::Lake;
use crate::scan::{DeletedRows, Scan, ScanFile, ScanOptions, SnapshotTables};
use crate::schema::TableDef;
use crate::split::DeletedSource;
use crate::visibility::copy_bits;

/// The lake's tables as of one checkpoint; every answer is as of its
/// timestamp ([`SnapshotTables::qts`]).
pub struct CheckpointReader {
    lake: Lake,
    qts: Ts,
    tables: Vec<ReaderTable>,
    by_name: HashMap<String, usize>,
    /// Kept alive by every scan (the reader's registration).
    hold: Arc<dyn Any + Send + Sync>,
}

struct ReaderTable {
    def: Arc<TableDef>,
    files: Vec<ReaderFile>,
    /// Dropped by the checkpoint's ts: listed by no one.
    dropped: bool,
}

struct ReaderFile {
    id: FileId,
    kind: FileKind,
    deletes: Arc<CheckpointDeletes>,
}

/// The rows of one file deleted at a checkpoint, read from the lake the
/// first time a scan asks.
pub struct CheckpointDeletes {
    lake: Lake,
    file: FileId,
    /// Object with the deleted row offsets (u32 LE); none when no row is.
    path: Option<Path>,
    capacity: usize,
    words: OnceLock<Vec<u64>>,
}

impl CheckpointDeletes {
    /// The deleted rows of `file` (capacity `capacity`) listed in the
    /// object at `path`.
    pub fn new(lake: Lake, file: FileId, path: Option<Path>, capacity: usize) -> Self {
        CheckpointDeletes { lake, file, path, capacity, words: OnceLock::new() }
    }

    /// One bit per row, set where deleted.
    fn words(&self) -> Result<&[u64]> {
        if let Some(w) = self.words.get() {
            return Ok(w);
        }
        let mut words = vec![0u64; self.capacity.div_ceil(64)];
        if let Some(path) = &self.path {
            let bytes = self.lake.get(path)?;
            for row in crate::checkpoint::deleted_rows_of(path.as_ref(), &bytes)? {
                let row = row as usize;
                let word = words.get_mut(row / 64).ok_or_else(|| Error::Corrupt {
                    what: format!("deleted rows ({path})"),
                    reason: format!("row {row} beyond the capacity {} of {}", self.capacity, self.file),
                })?;
                *word |= 1 << (row % 64);
            }
        }
        // A racing thread may have set it meanwhile: the values are equal.
        Ok(self.words.get_or_init(|| words))
    }
}

impl DeletedRows for CheckpointDeletes {
    /// At the checkpoint's timestamp (the only one a reader answers at).
    fn deleted_bitmap(&self, file: FileId, start: usize, rows: usize, _qts: Ts, out: &mut Vec<u64>) -> Result<()> {
        if file != self.file || start + rows > self.capacity {
            return Err(Error::invariant(format!(
                "deleted rows {start}..{} of {file} asked of {} (capacity {})",
                start + rows,
                self.file,
                self.capacity
            )));
        }
        copy_bits(self.words()?, start, rows, out);
        Ok(())
    }

    /// The object itself: a worker reads it as this reader would.
    fn describe(&self, _file: FileId, _start: usize, _rows: usize, _qts: Ts) -> Result<DeletedSource> {
        Ok(DeletedSource::Checkpoint { path: self.path.as_ref().map(Path::to_string), capacity: self.capacity })
    }
}

impl CheckpointReader {
    /// The lake in `store` as `manifest` describes it; `hold` (the reader's
    /// registration) lives as long as the reader and its scans.
    pub fn open(store: Arc<dyn ObjectStore>, manifest: &Manifest, hold: Arc<dyn Any + Send + Sync>) -> Result<Self> {
        let corrupt = |reason: String| Error::Corrupt { what: "checkpoint manifest".into(), reason };
        if manifest.format != MANIFEST_FORMAT {
            return Err(corrupt(format!("format {} (this fovea reads {MANIFEST_FORMAT})", manifest.format)));
        }
        let lake = Lake::new(store);
        let mut tables = Vec::with_capacity(manifest.tables.len());
        let mut by_name = HashMap::new();
        for (i, t) in manifest.tables.iter().enumerate() {
            let def = t.def(TableId(i as u32))?;
            // A dropped table is not there at the checkpoint's ts (a table
            // of its name may follow it).
            if !t.dropped {
                by_name.insert(t.name.clone(), i);
            }
            tables.push(ReaderTable { def, files: Vec::new(), dropped: t.dropped });
        }
        for shard in &manifest.shards {
            let deletes: HashMap<u64, Arc<CheckpointDeletes>> = shard
                .slots
                .iter()
                .map(|s| {
                    let path = s.deleted.as_deref().map(Path::from);
                    (s.file, Arc::new(CheckpointDeletes::new(lake.clone(), FileId(s.file), path, s.capacity)))
                })
                .collect();
            for part in &shard.parts {
                let table = tables
                    .get_mut(part.table as usize)
                    .ok_or_else(|| corrupt(format!("a part of unknown table {}", part.table)))?;
                for f in &part.files {
                    let deletes =
                        Arc::clone(deletes.get(&f.id).ok_or_else(|| corrupt(format!("file {} has no slot", f.id)))?);
                    let kind = match &f.regular {
                        Some(r) => FileKind::Regular(Arc::new(r.file())),
                        None => FileKind::Virtual {
                            blocks: f
                                .blocks
                                .iter()
                                .map(|b| {
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
                    table.files.push(ReaderFile { id: FileId(f.id), kind, deletes });
                }
            }
        }
        Ok(CheckpointReader { lake, qts: Ts(manifest.checkpoint_ts), tables, by_name, hold })
    }

    /// A lake with no checkpoint yet: no tables.
    pub fn empty(store: Arc<dyn ObjectStore>, hold: Arc<dyn Any + Send + Sync>) -> Self {
        CheckpointReader { lake: Lake::new(store), qts: Ts(0), tables: Vec::new(), by_name: HashMap::new(), hold }
    }

    /// The lake.
    pub fn lake(&self) -> &Lake {
        &self.lake
    }

    /// The table named `name`.
    pub fn table(&self, name: &str) -> Result<Arc<TableDef>> {
        let i = self.by_name.get(name).ok_or_else(|| Error::UnknownTable(name.into()))?;
        Ok(Arc::clone(&self.tables[*i].def))
    }
}

impl SnapshotTables for CheckpointReader {
    fn qts(&self) -> Ts {
        self.qts
    }

    fn tables(&self) -> Vec<Arc<TableDef>> {
        self.tables.iter().filter(|t| !t.dropped).map(|t| Arc::clone(&t.def)).collect()
    }

    fn scan(&self, table: &str, options: ScanOptions) -> Result<Scan> {
        let i = *self.by_name.get(table).ok_or_else(|| Error::UnknownTable(table.into()))?;
        let t = &self.tables[i];
        let files = t
            .files
            .iter()
            .map(|f| ScanFile {
                id: f.id,
                deletes: Arc::clone(&f.deletes) as Arc<dyn DeletedRows>,
                kind: f.kind.clone(),
            })
            .collect();
        Scan::plan(Arc::clone(&self.hold), self.qts, self.lake.clone(), Arc::clone(&t.def), files, Vec::new(), options)
    }
}
