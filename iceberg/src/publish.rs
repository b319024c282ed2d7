//! Publishing a checkpoint: for every table, one Iceberg snapshot whose
//! rows are exactly the table at the checkpoint's timestamp `c`.
//!
//! ```text
//!  checkpoint manifest (files, blocks, deleted-row objects at c)
//!    per table ─▶ data files: its regular files and flushed blocks, as they are
//!              ─▶ deletes: per data file, rows deleted at ≤ c and rows created after c
//!                          (format 2: one position delete file each; format 3: one
//!                          deletion vector each, in a Puffin file; named by content)
//!              ─▶ manifests (data, deletes) ─▶ manifest list
//!              ─▶ metadata/v{N+1}.metadata.json (created only if absent)
//!              ─▶ metadata/version-hint.text = N+1
//! ```
//!
//! Incremental: a manifest of the snapshot before whose files are all still
//! in this one is listed again as it is (at most 16 of each content; past
//! that the smaller half is folded into the new manifest); one new manifest
//! of each content lists the rest — new files `ADDED`, files of manifests
//! not carried `EXISTING` (their snapshot and sequence numbers kept) —
//! and the blocks a checkpoint wrote for itself alone (replaced at the next
//! one) are in a manifest of their own with the files this snapshot
//! removes, `DELETED` (blocks combined into a regular file, files storage
//! GC rewrote, delete files replaced). So a checkpoint writes manifests
//! for what changed, not for the whole table. A delete file's name is a
//! hash of its data file and positions, so an unchanged set of deletes is
//! the same file.
//!
//! Readers only ever follow metadata files: everything a snapshot names is
//! written before its metadata file, which is created only if no other
//! publisher created that version. A checkpoint not newer than the table's
//! current snapshot is not published again. Earlier snapshots stay in the
//! metadata (time travel by snapshot id = checkpoint ts) until the one
//! after them is older than the retention — as long as a publishing
//! replayer keeps the data files combine and storage GC replaced. Objects
//! under a table's directory that no kept snapshot names are deleted once
//! they are older than the retention.
//!
//! Format 3 adds row lineage: every data file gets a range of row ids
//! (`first_row_id`), assigned once from the table's `next-row-id`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fovea_core::catalog::CheckpointRecord;
use fovea_core::checkpoint::{FileManifest, Manifest, SlotManifest, TableManifest};
use fovea_core::ids::TableId;
use fovea_core::lake::{Lake, block_on_io};
use fovea_core::schema::{CREATE_TS_COLUMN, CREATE_TS_FIELD_ID};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::deletes::{deletion_vector_file, position_delete_file};
use crate::manifest::{
    Content, DataFile, Entry, ManifestFile, ManifestHeader, Status, inherit_row_ids, read_manifest, read_manifest_list,
    write_manifest, write_manifest_list,
};
use crate::spec::{
    MetadataLogEntry, NAME_MAPPING_PROPERTY, PartitionSpec, Snapshot, SnapshotLogEntry, SnapshotRef, SortOrder,
    TableMetadata, schema_of,
};
use crate::{PublishError, Result};

/// Where a lake's Iceberg tables live, under its root.
pub const ICEBERG_PREFIX: &str = "iceberg";

/// Snapshot summary property of a dropped table's last snapshot (it has no
/// rows).
pub const DROPPED_PROPERTY: &str = "fovea.dropped";

/// Snapshot summary property: the checkpoint's mirror timestamp.
pub const CHECKPOINT_TS_PROPERTY: &str = "fovea.checkpoint-ts";

/// Snapshot summary property: when the newest source transaction the
/// snapshot holds committed in the source (ms since the Unix epoch; absent
/// when the input gives no commit times). A snapshot's freshness is its
/// `timestamp-ms` minus this.
pub const SOURCE_COMMIT_PROPERTY: &str = "fovea.source-commit-ms";

/// How long objects no current snapshot names stay (and, in a replayer
/// that publishes, lake files combine and storage GC replaced: see
/// `Engine::set_retire_grace`): a reader that loaded the metadata before
/// has this long to read what it names.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(600);

/// Publications [`Publisher::view_at`] answers at most.
pub const RECENT_VIEWS_KEPT: usize = 256;

/// Manifests of each content a snapshot carries unchanged from the one
/// before, at most (see `carried_manifests`).
const MANIFESTS_CARRIED: usize = 16;

/// Snapshots a table's metadata keeps at most besides those registered
/// readers read (see `expire_snapshots`).
pub const SNAPSHOTS_KEPT: usize = 100;

/// Earlier metadata files the metadata log lists.
const METADATA_LOG_KEPT: usize = 10;

/// Which Iceberg format tables are published in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FormatVersion {
    /// Format 2: position delete files (Athena, and every other reader).
    V2,
    /// Format 3: deletion vectors in Puffin files, row lineage (Spark with
    /// Iceberg 1.8+, Trino, DuckDB 1.4+, Snowflake; not Athena).
    V3,
}

impl FormatVersion {
    /// Parses `v2` or `v3` (or `2`, `3`).
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        match s {
            "v2" | "2" => Ok(Self::V2),
            "v3" | "3" => Ok(Self::V3),
            other => Err(format!("--iceberg {other}: expected v2 (position deletes) or v3 (deletion vectors)")),
        }
    }

    /// The format's number in table metadata.
    pub fn number(self) -> u8 {
        match self {
            Self::V2 => 2,
            Self::V3 => 3,
        }
    }
}

/// What one publication did.
#[derive(Debug, Default)]
pub struct Published {
    /// Tables given a new snapshot.
    pub tables: usize,
    /// Tables whose current snapshot was already at or past the checkpoint.
    pub current: usize,
    /// Tables that could not be published, with why (each keeps its
    /// snapshot before).
    pub refused: Vec<PublishError>,
    /// Position delete files written.
    pub delete_files_written: usize,
    /// Objects no snapshot names any more, deleted.
    pub objects_deleted: usize,
    /// Bytes of the objects written: deletes, manifests, manifest lists,
    /// metadata (data files are the lake's: never written).
    pub bytes_written: u64,
}

/// What a table's Iceberg metadata names now ([`Publisher::published`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedSnapshot {
    /// The metadata file's version (`vN.metadata.json`).
    pub metadata_version: u64,
    /// Its Iceberg format.
    pub format_version: u8,
    /// The checkpoint its current snapshot holds (`None`: no snapshot, or
    /// not one fovea published).
    pub checkpoint_ts: Option<u64>,
}

/// Every table of one publication, all at one checkpoint: what an Iceberg
/// catalog serves (`fovea serve --iceberg-rest`), so an engine that loads
/// several tables sees one consistent state of all of them.
#[derive(Debug)]
pub struct CatalogView {
    /// The checkpoint every table is at.
    pub checkpoint_ts: u64,
    /// Tables by fovea name (`schema.table`).
    pub tables: BTreeMap<String, ViewTable>,
    /// Tables dropped in the source that have an Iceberg table (its last
    /// snapshot without rows): not served, and removed from catalogs.
    pub dropped: std::collections::BTreeSet<String>,
}

/// A table of a [`CatalogView`].
#[derive(Debug)]
pub enum ViewTable {
    /// Its metadata at the view's checkpoint.
    Published {
        /// Absolute location of the metadata file.
        metadata_location: String,
        /// The metadata file's JSON.
        metadata: Arc<str>,
    },
    /// Not published at the view's checkpoint, and why (its last snapshot
    /// is at an older one: a catalog must not hand it out as this one).
    Refused(String),
}

/// A catalog that names each table's current metadata file (AWS Glue, as
/// Athena finds tables), told after every publication.
///
/// Contract: [`TableRegistry::register`] points every published table of
/// the view at its metadata location, creating the catalog's table when it
/// has none; it never moves a table back to an older metadata file than
/// the catalog has (a newer publisher registered it); it is idempotent (a
/// view registered twice changes nothing the second time). An error leaves
/// each table at its location before or the view's, never another.
pub trait TableRegistry: Send + Sync + std::fmt::Debug {
    /// Registers the published tables of `view`.
    fn register(&self, view: &CatalogView) -> Result<()>;
}

/// Publishes a lake's checkpoints as Iceberg tables.
pub struct Publisher {
    lake: Lake,
    /// The lake's root as an absolute URI, no trailing slash.
    root: String,
    format: FormatVersion,
    retention: Duration,
    /// Deleted rows by deleted-rows object, from earlier publications
    /// (objects are immutable; only those the last one used are kept).
    deleted: Mutex<HashMap<String, Arc<Vec<u32>>>>,
    /// The objects each kept snapshot names (its manifest list, manifests,
    /// delete files), by manifest list URI.
    snapshot_objects: Mutex<HashMap<String, Arc<Vec<String>>>>,
    /// The newest complete publication.
    view: Mutex<Option<Arc<CatalogView>>>,
    /// Recent publications, oldest first, with when the next one replaced
    /// them (`None`: the newest), for readers pinned to one checkpoint.
    recent: Mutex<std::collections::VecDeque<(Arc<CatalogView>, Option<Instant>)>>,
    /// What this publisher last published of each table, by directory.
    tables: Mutex<HashMap<String, TableCache>>,
    /// Where the tables are registered after every publication.
    registry: Option<Arc<dyn TableRegistry>>,
    /// Where the lake's readers register (the timestamp store): a snapshot
    /// a registered reader reads is kept past the retention.
    readers: Option<Arc<dyn fovea_core::mvcc::TxnStore>>,
    /// A table published in a newer format than `format` stays in it
    /// (instead of being refused).
    keep_newer_format: bool,
}

/// A table as this publisher last published it: the next publication
/// starts from it instead of reading metadata and manifests back, once a
/// HEAD has shown no one published after it.
struct TableCache {
    version: u64,
    metadata: TableMetadata,
    json: Arc<str>,
    /// The current snapshot's files and manifests.
    live: LiveFiles,
    /// When objects no kept snapshot names were last looked for.
    cleaned_at: Option<Instant>,
}

/// The files of a snapshot as its manifests list them (removed ones left
/// out), and the manifests.
#[derive(Debug, Default, PartialEq)]
struct LiveFiles {
    /// Data files by path.
    data: HashMap<String, Entry>,
    /// Delete files by path.
    deletes: HashMap<String, Entry>,
    /// Every manifest of the snapshot, in manifest list order.
    manifests: Vec<LiveManifest>,
}

/// A manifest of a snapshot and the files it lists as live: the next
/// snapshot lists it again as it is while all of them still are.
#[derive(Clone, Debug, PartialEq)]
struct LiveManifest {
    file: ManifestFile,
    paths: Vec<String>,
}

impl Publisher {
    /// A publisher of the lake in `store` whose root is at `root_uri`
    /// (`file:///abs/dir` or `s3://bucket/prefix`; data files are named by
    /// it in manifests).
    pub fn new(store: Arc<dyn ObjectStore>, root_uri: &str, format: FormatVersion) -> Self {
        Publisher {
            lake: Lake::new(store),
            root: root_uri.trim_end_matches('/').to_owned(),
            format,
            retention: DEFAULT_RETENTION,
            deleted: Mutex::new(HashMap::new()),
            snapshot_objects: Mutex::new(HashMap::new()),
            view: Mutex::new(None),
            recent: Mutex::new(std::collections::VecDeque::new()),
            tables: Mutex::new(HashMap::new()),
            registry: None,
            readers: None,
            keep_newer_format: false,
        }
    }

    /// Publishes a table already published in a newer format than the
    /// publisher's in that one (format 3 stays 3), instead of refusing it:
    /// for a publisher whose format is a default, not a user's choice.
    pub fn keeping_newer_formats(mut self) -> Self {
        self.keep_newer_format = true;
        self
    }

    /// Keeps, past the retention, the snapshot each reader registered in
    /// `store` (the lake's timestamp store) reads — the newest at or
    /// below its timestamp — and those after it, until the reader is
    /// done: the writer keeps the data files of a registered reader's
    /// snapshot as long (its retire and storage GC wait for it).
    pub fn with_readers(mut self, store: Arc<dyn fovea_core::mvcc::TxnStore>) -> Self {
        self.readers = Some(store);
        self
    }

    /// The newest publication that reached every table: each at its
    /// checkpoint (`None` before the first).
    pub fn view(&self) -> Option<Arc<CatalogView>> {
        self.view.lock().expect("not poisoned").clone()
    }

    /// The publication at checkpoint `ts`, while what it names is kept: up
    /// to half the retention after a newer one replaced it, and at most
    /// [`RECENT_VIEWS_KEPT`] of them.
    pub fn view_at(&self, ts: u64) -> Option<Arc<CatalogView>> {
        let recent = self.recent.lock().expect("not poisoned");
        recent
            .iter()
            .find(|(v, replaced)| v.checkpoint_ts == ts && self.still_served(*replaced))
            .map(|(v, _)| Arc::clone(v))
    }

    /// Whether a publication a newer one replaced at `replaced` (`None`:
    /// the newest) is still answered: for half the retention, so what it
    /// names is kept while a pinned reader reads it.
    fn still_served(&self, replaced: Option<Instant>) -> bool {
        replaced.is_none_or(|at| at.elapsed() < self.retention / 2)
    }

    /// Keeps objects no current snapshot names for `retention` (default
    /// 10 minutes) before deleting them.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Registers the tables in `registry` after every publication.
    pub fn with_registry(mut self, registry: Arc<dyn TableRegistry>) -> Self {
        self.registry = Some(registry);
        self
    }

    /// What the Iceberg metadata of the table named `table` names now, as
    /// the store has it (`None`: never published).
    pub fn published(&self, table: &str) -> Result<Option<PublishedSnapshot>> {
        let meta_dir = format!("{}/metadata", table_dir(table));
        Ok(self.current_metadata(&meta_dir)?.map(|(version, m)| PublishedSnapshot {
            metadata_version: version,
            format_version: m.format_version,
            checkpoint_ts: m
                .current_snapshot()
                .and_then(|s| s.summary.get(CHECKPOINT_TS_PROPERTY))
                .and_then(|v| v.parse().ok()),
        }))
    }

    /// The absolute location of the table named `table` (`schema.name`).
    pub fn table_location(&self, table: &str) -> String {
        format!("{}/{}", self.root, table_dir(table))
    }

    /// Publishes `checkpoint`: every table it has gets a snapshot of its
    /// rows at the checkpoint's timestamp. A table that cannot be published
    /// keeps its snapshot before and is named in [`Published::refused`];
    /// an error of the lake's store stops the publication (the next one
    /// starts again from the tables' current metadata).
    pub fn publish(&self, checkpoint: &CheckpointRecord) -> Result<Published> {
        let manifest = &checkpoint.manifest;
        let mut published = Published::default();
        let mut used = HashSet::new();
        let held = match &self.readers {
            Some(store) => store.readers(fovea_core::catalog::now_us())?.iter().map(|r| r.qts.get()).min(),
            None => None,
        };
        let mut view =
            CatalogView { checkpoint_ts: manifest.checkpoint_ts, tables: BTreeMap::new(), dropped: Default::default() };
        for (i, t) in manifest.tables.iter().enumerate() {
            // A dropped table whose name a newer table has: that one's.
            if t.dropped && manifest.tables.iter().any(|o| !o.dropped && o.name == t.name) {
                continue;
            }
            let entry = match self.publish_table(checkpoint, TableId(i as u32), t, held, &mut used) {
                Ok(TableOutcome::Published { delete_files_written, bytes_written, objects_deleted, current }) => {
                    published.tables += 1;
                    published.bytes_written += bytes_written;
                    published.delete_files_written += delete_files_written;
                    published.objects_deleted += objects_deleted;
                    current
                }
                Ok(TableOutcome::Current(current)) => {
                    published.current += 1;
                    current
                }
                Ok(TableOutcome::Absent { existed }) => {
                    if existed {
                        view.dropped.insert(t.name.clone());
                    }
                    continue;
                }
                Err(e @ (PublishError::Schema { .. } | PublishError::Corrupt { .. })) => {
                    tracing::warn!("not published as Iceberg: {e}");
                    let entry = ViewTable::Refused(e.to_string());
                    published.refused.push(e);
                    entry
                }
                Err(e) => return Err(e),
            };
            // A dropped table is not served (its snapshot is empty).
            if t.dropped {
                view.dropped.insert(t.name.clone());
            } else {
                view.tables.insert(t.name.clone(), entry);
            }
        }
        self.deleted.lock().expect("not poisoned").retain(|k, _| used.contains(k));
        self.snapshot_objects.lock().expect("not poisoned").retain(|k, _| used.contains(k));
        let view = Arc::new(view);
        *self.view.lock().expect("not poisoned") = Some(Arc::clone(&view));
        {
            let mut recent = self.recent.lock().expect("not poisoned");
            if let Some((_, replaced)) = recent.back_mut() {
                *replaced = Some(Instant::now());
            }
            recent.push_back((Arc::clone(&view), None));
            while recent.len() > RECENT_VIEWS_KEPT || recent.front().is_some_and(|(_, r)| !self.still_served(*r)) {
                recent.pop_front();
            }
        }
        if let Some(registry) = &self.registry {
            registry.register(&view)?;
        }
        Ok(published)
    }

    fn publish_table(
        &self,
        checkpoint: &CheckpointRecord,
        id: TableId,
        table: &TableManifest,
        held: Option<u64>,
        used: &mut HashSet<String>,
    ) -> Result<TableOutcome> {
        let manifest = &checkpoint.manifest;
        let c = manifest.checkpoint_ts;
        let dir = table_dir(&table.name);
        let meta_dir = format!("{dir}/metadata");
        // What this publisher published last, if no one published after it
        // (one HEAD); else the table as the store has it.
        let cached = self.tables.lock().expect("not poisoned").remove(&dir);
        let cached = match cached {
            Some(t) if !self.exists(&metadata_path(&meta_dir, t.version + 1))? => Some(t),
            _ => None,
        };
        let previous = match &cached {
            Some(t) => Some((t.version, t.metadata.clone())),
            None => self.current_metadata(&meta_dir)?,
        };
        // The format of this snapshot: the publisher's, or the newer one the
        // table is published in already when the publisher keeps it.
        let table_format = match &previous {
            Some((_, m)) if self.keep_newer_format && m.format_version == FormatVersion::V3.number() => {
                FormatVersion::V3
            }
            _ => self.format,
        };
        if let Some((_, m)) = &previous
            && m.format_version > table_format.number()
        {
            return Err(PublishError::Corrupt {
                what: format!("table {}", table.name),
                reason: format!(
                    "it is published in Iceberg format {}, and a table cannot go back to format {} (publish it \
                     with --iceberg v{})",
                    m.format_version,
                    table_format.number(),
                    m.format_version
                ),
            });
        }
        let prev_snapshot = previous.as_ref().and_then(|(_, m)| m.current_snapshot().cloned());
        // A dropped table: one last snapshot without rows (readers of its
        // path or its catalog entry find it empty, not stale; time travel
        // still reads it before), none if it was never published or that
        // snapshot is there already.
        let dropped_before = prev_snapshot.as_ref().is_some_and(|s| s.summary.contains_key(DROPPED_PROPERTY));
        if table.dropped && (prev_snapshot.is_none() || dropped_before) {
            if let Some(t) = cached {
                self.tables.lock().expect("not poisoned").insert(dir, t);
            }
            return Ok(TableOutcome::Absent { existed: prev_snapshot.is_some() });
        }
        if let Some(s) = &prev_snapshot {
            let published_ts: Option<u64> = s.summary.get(CHECKPOINT_TS_PROPERTY).and_then(|v| v.parse().ok());
            if let Some(p) = published_ts.filter(|&p| p > c) {
                return Err(PublishError::Corrupt {
                    what: format!("table {}", table.name),
                    reason: format!(
                        "its Iceberg snapshot is at checkpoint {p}, past this replayer's {c}: a newer replayer \
                         publishes it"
                    ),
                });
            }
            if published_ts == Some(c) {
                let (version, metadata) = previous.as_ref().expect("a snapshot has its metadata");
                let json = match &cached {
                    Some(t) => Arc::clone(&t.json),
                    None => serde_json::to_string(metadata).expect("metadata serialises").into(),
                };
                let current = ViewTable::Published {
                    metadata_location: self.uri(&metadata_path(&meta_dir, *version)),
                    metadata: Arc::clone(&json),
                };
                if let Some(t) = cached {
                    self.tables.lock().expect("not poisoned").insert(dir, t);
                }
                return Ok(TableOutcome::Current(current));
            }
        }
        let def =
            table.def(id).map_err(|e| PublishError::Corrupt { what: table.name.clone(), reason: e.to_string() })?;
        // The snapshot before: its live entries by path.
        let cleaned_at = cached.as_ref().and_then(|t| t.cleaned_at);
        let LiveFiles { data: prev_data, deletes: prev_deletes, manifests: prev_manifests } =
            match (cached, &prev_snapshot) {
                (Some(t), _) => t.live,
                (None, Some(s)) => self.live_entries(s)?,
                (None, None) => LiveFiles::default(),
            };

        // Files new to the table: their sizes and the columns they hold
        // from their footers (a column added and dropped again between
        // two publications is in files but in no published schema: the
        // name mapping must still name it, or readers refuse the file).
        let files = if table.dropped { Vec::new() } else { self.data_files(manifest, id)? };
        let mut new_sizes: HashMap<String, u64> = HashMap::new();
        let mut file_columns: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        for file in &files {
            let uri = self.uri(&file.path);
            if prev_data.contains_key(&uri) {
                continue;
            }
            let footer = self.lake.read_footer_in(&file.path, file.footer.clone())?;
            // Files with field ids are read by them: their names need no
            // mapping.
            let stored = footer.metadata.schema();
            if !stored.fields().iter().any(|f| fovea_core::schema::field_id(f).is_some()) {
                file_columns.extend(stored.fields().iter().map(|f| f.name().clone()));
            }
            new_sizes.insert(uri, footer.size);
        }
        let published = schema_of(&def, previous.as_ref().map(|(_, m)| m), &file_columns)?;
        let (schema, new_schema, last_column_id) = (published.schema, published.is_new, published.last_column_id);

        let sequence_number = previous.as_ref().map_or(0, |(_, m)| m.last_sequence_number) + 1;
        let snapshot_id = c as i64;
        let added = |file: DataFile| Entry {
            status: Status::Added,
            snapshot_id,
            sequence_number,
            file_sequence_number: sequence_number,
            file,
        };

        let mut data_entries = Vec::new();
        let mut delete_entries = Vec::new();
        let mut delete_files_written = 0;
        let mut delete_bytes_written = 0u64;
        let mut live_deletes = HashSet::new();
        let mut live_data = HashSet::new();
        let mut checkpoint_blocks = HashSet::new();
        for file in files {
            let uri = self.uri(&file.path);
            let entry = match prev_data.get(&uri) {
                Some(e) => e.clone(),
                None => {
                    let size = new_sizes[&uri];
                    added(DataFile {
                        content: Content::Data,
                        path: uri.clone(),
                        format: "PARQUET",
                        record_count: file.rows as i64,
                        size: size as i64,
                        referenced_data_file: None,
                        content_offset: None,
                        content_size: None,
                        first_row_id: None,
                    })
                }
            };
            if fovea_core::lake::is_checkpoint_block(file.path.as_ref()) {
                checkpoint_blocks.insert(uri.clone());
            }
            data_entries.push(entry);
            live_data.insert(uri.clone());
            let positions = self.positions(&file, c, used)?;
            if positions.is_empty() {
                continue;
            }
            let extension = match table_format {
                FormatVersion::V2 => "parquet",
                FormatVersion::V3 => "puffin",
            };
            let name = format!("{dir}/deletes/{}-{:016x}.{extension}", file.fovea_file, content_hash(&uri, &positions));
            let delete_uri = self.uri(&Path::from(name.as_str()));
            live_deletes.insert(delete_uri.clone());
            match prev_deletes.get(&delete_uri) {
                Some(e) => delete_entries.push(e.clone()),
                None => {
                    // Format 3 forbids new position delete files: a
                    // deletion vector (which replaces any delete file of
                    // the data file before, as a format 2 table's upgrade
                    // requires).
                    let (bytes, format, content_offset, content_size) = match table_format {
                        FormatVersion::V2 => (position_delete_file(&uri, &positions)?, "PARQUET", None, None),
                        FormatVersion::V3 => {
                            let dv = deletion_vector_file(&uri, &positions)?;
                            (dv.bytes, "PUFFIN", Some(dv.offset), Some(dv.length))
                        }
                    };
                    let size = bytes.len() as i64;
                    self.lake.put(&Path::from(name.as_str()), Bytes::from(bytes))?;
                    delete_files_written += 1;
                    delete_bytes_written += size as u64;
                    delete_entries.push(added(DataFile {
                        content: Content::PositionDeletes,
                        path: delete_uri,
                        format,
                        record_count: positions.len() as i64,
                        size,
                        referenced_data_file: Some(uri),
                        content_offset,
                        content_size,
                        first_row_id: None,
                    }));
                }
            }
        }
        // Files of the snapshot before that this one no longer has.
        let gone = |prev: HashMap<String, Entry>, live: &HashSet<String>| -> Vec<Entry> {
            let mut gone: Vec<Entry> = prev
                .into_values()
                .filter(|e| !live.contains(&e.file.path))
                .map(|e| Entry { status: Status::Deleted, snapshot_id, ..e })
                .collect();
            gone.sort_by(|a, b| a.file.path.cmp(&b.file.path));
            gone
        };
        let mut removed_data = gone(prev_data, &live_data);
        let removed_deletes = gone(prev_deletes, &live_deletes);
        let operation = if table.dropped {
            "delete"
        } else if removed_data.is_empty() && removed_deletes.is_empty() && delete_files_written == 0 {
            "append"
        } else {
            "overwrite"
        };
        let mut summary = BTreeMap::from([
            ("operation".to_owned(), operation.to_owned()),
            (CHECKPOINT_TS_PROPERTY.to_owned(), c.to_string()),
            ("fovea.input".to_owned(), checkpoint.input.clone()),
            ("fovea.source-position".to_owned(), checkpoint.position.to_string()),
        ]);
        if let Some(us) = manifest.source_commit_us {
            summary.insert(SOURCE_COMMIT_PROPERTY.to_owned(), us.div_euclid(1000).to_string());
        }
        if table.dropped {
            summary.insert(DROPPED_PROPERTY.to_owned(), "true".to_owned());
        }
        // Entries of the snapshot before keep their status (a manifest
        // listed again as it is says what it said); the ones added now
        // are this snapshot's.
        let added_now = |e: &&Entry| e.status == Status::Added && e.snapshot_id == snapshot_id;
        let rows = |entries: &mut dyn Iterator<Item = &Entry>| -> i64 { entries.map(|e| e.file.record_count).sum() };
        summary.insert("added-data-files".into(), data_entries.iter().filter(added_now).count().to_string());
        summary.insert("added-records".into(), rows(&mut data_entries.iter().filter(added_now)).to_string());
        summary.insert("deleted-data-files".into(), removed_data.len().to_string());
        summary.insert("added-delete-files".into(), delete_entries.iter().filter(added_now).count().to_string());
        summary.insert("added-position-deletes".into(), rows(&mut delete_entries.iter().filter(added_now)).to_string());
        summary.insert("removed-delete-files".into(), removed_deletes.len().to_string());
        summary.insert("total-data-files".into(), data_entries.len().to_string());
        summary.insert("total-delete-files".into(), delete_entries.len().to_string());
        summary.insert("total-records".into(), rows(&mut data_entries.iter()).to_string());
        summary.insert("total-position-deletes".into(), rows(&mut delete_entries.iter()).to_string());
        summary.insert("total-equality-deletes".into(), "0".into());
        summary.insert("total-files-size".into(), {
            let bytes: i64 = data_entries.iter().chain(&delete_entries).map(|e| e.file.size).sum();
            bytes.to_string()
        });

        // The manifests of the snapshot before whose files are all still
        // live are listed again as they are; one new manifest per content
        // lists the rest: added files, files of the manifests not carried
        // (as existing), and removed files. A table upgraded to another
        // format gets all its manifests written again.
        let carry = previous.as_ref().is_some_and(|(_, m)| m.format_version == table_format.number());
        let (carried_data, carried_deletes) = if carry {
            (
                carried_manifests(&prev_manifests, Content::Data, &live_data),
                carried_manifests(&prev_manifests, Content::PositionDeletes, &live_deletes),
            )
        } else {
            Default::default()
        };
        let (carried_data_entries, mut new_data_entries) = split_carried(data_entries, &carried_data, snapshot_id);
        let (carried_delete_entries, mut new_delete_entries) =
            split_carried(delete_entries, &carried_deletes, snapshot_id);
        let lineage = (table_format >= FormatVersion::V3).then(|| {
            row_lineage(
                previous.as_ref().and_then(|(_, m)| m.next_row_id).unwrap_or(0),
                &mut new_data_entries,
                &mut removed_data,
            )
        });
        // Blocks a checkpoint wrote for itself alone are replaced at the
        // next one: a manifest of their own, so the one of settled files
        // is carried.
        // The files this snapshot removes are listed there too (a manifest
        // no later snapshot lists).
        let (mut tail_entries, settled_entries): (Vec<Entry>, Vec<Entry>) =
            new_data_entries.into_iter().partition(|e| checkpoint_blocks.contains(&e.file.path));
        let (settled_live, tail_live) = (settled_entries.len(), tail_entries.len());
        tail_entries.extend(removed_data);
        let deletes_live = new_delete_entries.len();
        new_delete_entries.extend(removed_deletes);

        // The new manifests, the manifest list, the metadata file.
        let version = previous.as_ref().map_or(0, |(v, _)| *v) + 1;
        let schema_json = schema.to_json();
        let format = table_format.number();
        let mut manifests: Vec<LiveManifest> = Vec::new();
        let mut manifest_bytes_written = 0u64;
        // What the next publication starts from: the live files of this
        // snapshot as a reader of its manifests has them (added data files
        // with the row ids they inherit).
        let mut live = LiveFiles::default();
        let mut next_row_id = lineage.map(|l| l.manifest_first_row_id);
        for (content, mut entries, live_count, carried, suffix) in [
            (Content::Data, settled_entries, settled_live, carried_data, "data"),
            (Content::Data, tail_entries, tail_live, Vec::new(), "tail"),
            (Content::PositionDeletes, new_delete_entries, deletes_live, carried_deletes, "deletes"),
        ] {
            if !entries.is_empty() {
                let header = ManifestHeader {
                    schema_json: &schema_json,
                    schema_id: schema.schema_id,
                    format_version: format,
                    content,
                };
                let bytes = write_manifest(&header, &entries)?;
                let path = format!("{meta_dir}/{snapshot_id}-v{version}-{suffix}.avro");
                let length = bytes.len() as i64;
                self.lake.put(&Path::from(path.as_str()), Bytes::from(bytes))?;
                manifest_bytes_written += length as u64;
                let live_of = |s: Status| entries.iter().filter(move |e| e.status == s);
                let added_rows: i64 = live_of(Status::Added).map(|e| e.file.record_count).sum();
                // Format 3: the data files it adds get their row ids from here.
                let first_row_id = match (content, next_row_id.as_mut()) {
                    (Content::Data, Some(next)) => {
                        let first = *next;
                        *next += added_rows;
                        Some(first)
                    }
                    _ => None,
                };
                let file = ManifestFile {
                    path: self.uri(&Path::from(path.as_str())),
                    length,
                    content,
                    sequence_number,
                    min_sequence_number: entries
                        .iter()
                        .filter(|e| e.status != Status::Deleted)
                        .map(|e| e.sequence_number)
                        .min()
                        .unwrap_or(sequence_number),
                    added_snapshot_id: snapshot_id,
                    added_files: live_of(Status::Added).count() as i32,
                    existing_files: live_of(Status::Existing).count() as i32,
                    deleted_files: live_of(Status::Deleted).count() as i32,
                    added_rows,
                    existing_rows: live_of(Status::Existing).map(|e| e.file.record_count).sum(),
                    deleted_rows: live_of(Status::Deleted).map(|e| e.file.record_count).sum(),
                    first_row_id,
                };
                entries.truncate(live_count);
                if let Some(first) = first_row_id {
                    inherit_row_ids(first, &mut entries);
                }
                let paths = entries.iter().map(|e| e.file.path.clone()).collect();
                manifests.push(LiveManifest { file, paths });
                let into = match content {
                    Content::Data => &mut live.data,
                    Content::PositionDeletes => &mut live.deletes,
                };
                into.extend(entries.into_iter().map(|e| (e.file.path.clone(), e)));
            }
            manifests.extend(carried);
        }
        let by_path = |entries: Vec<Entry>| entries.into_iter().map(|e| (e.file.path.clone(), e));
        live.data.extend(by_path(carried_data_entries));
        live.deletes.extend(by_path(carried_delete_entries));
        let parent = prev_snapshot.as_ref().map(|s| s.snapshot_id);
        let listed: Vec<ManifestFile> = manifests.iter().map(|m| m.file.clone()).collect();
        let list = write_manifest_list(format, snapshot_id, parent, sequence_number, &listed)?;
        let list_bytes = list.len() as u64;
        let list_path = format!("{meta_dir}/snap-{snapshot_id}-v{version}.avro");
        self.lake.put(&Path::from(list_path.as_str()), Bytes::from(list))?;

        let now = now_ms();
        let snapshot = Snapshot {
            snapshot_id,
            parent_snapshot_id: parent,
            sequence_number,
            timestamp_ms: now,
            manifest_list: self.uri(&Path::from(list_path.as_str())),
            summary,
            schema_id: schema.schema_id,
            first_row_id: lineage.map(|l| l.first_row_id),
            added_rows: lineage.map(|l| l.next_row_id - l.first_row_id),
        };
        let metadata = match previous {
            Some((prev_version, prev)) => {
                let mut m = prev;
                let mut log = std::mem::take(&mut m.metadata_log);
                log.push(MetadataLogEntry {
                    timestamp_ms: m.last_updated_ms,
                    metadata_file: self.uri(&metadata_path(&meta_dir, prev_version)),
                });
                let skip = log.len().saturating_sub(METADATA_LOG_KEPT);
                m.metadata_log = log.split_off(skip);
                if new_schema {
                    m.schemas.push(schema.clone());
                }
                m.current_schema_id = schema.schema_id;
                m.last_column_id = last_column_id;
                m.last_sequence_number = sequence_number;
                m.last_updated_ms = now;
                m.properties.insert(NAME_MAPPING_PROPERTY.into(), published.name_mapping.clone());
                m.current_snapshot_id = Some(snapshot_id);
                m.format_version = format;
                m.properties.insert("format-version".to_owned(), format.to_string());
                m.next_row_id = lineage.map(|l| l.next_row_id);
                m.snapshots.push(snapshot);
                m.snapshot_log.push(SnapshotLogEntry { timestamp_ms: now, snapshot_id });
                expire_snapshots(&mut m, cutoff_ms(self.retention), held);
                m.refs = main_ref(snapshot_id);
                m
            }
            None => TableMetadata {
                format_version: format,
                table_uuid: uuid::Uuid::new_v4().to_string(),
                location: self.uri(&Path::from(dir.as_str())),
                last_sequence_number: sequence_number,
                last_updated_ms: now,
                last_column_id,
                current_schema_id: schema.schema_id,
                schemas: vec![schema.clone()],
                partition_specs: vec![PartitionSpec { spec_id: 0, fields: vec![] }],
                default_spec_id: 0,
                last_partition_id: 999,
                properties: BTreeMap::from([
                    (NAME_MAPPING_PROPERTY.to_owned(), published.name_mapping.clone()),
                    ("format-version".to_owned(), format.to_string()),
                    ("fovea.table".to_owned(), table.name.clone()),
                    ("write.parquet.compression-codec".to_owned(), "zstd".to_owned()),
                ]),
                current_snapshot_id: Some(snapshot_id),
                snapshots: vec![snapshot],
                snapshot_log: vec![SnapshotLogEntry { timestamp_ms: now, snapshot_id }],
                metadata_log: vec![],
                sort_orders: vec![SortOrder { order_id: 0, fields: vec![] }],
                default_sort_order_id: 0,
                refs: main_ref(snapshot_id),
                next_row_id: lineage.map(|l| l.next_row_id),
            },
        };
        let json = serde_json::to_vec(&metadata).expect("metadata serialises");
        let metadata_bytes = json.len() as u64;
        let json_text = json.clone();
        let path = metadata_path(&meta_dir, version);
        let created = block_on_io({
            let store = Arc::clone(self.lake.store());
            let path = path.clone();
            async move { store.put_opts(&path, PutPayload::from(json), PutOptions::from(PutMode::Create)).await }
        })?;
        match created {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                return Err(PublishError::Raced { table: table.name.clone(), version });
            }
            Err(e) => return Err(PublishError::Store(fovea_core::Error::from(e))),
        }
        self.lake.put(&Path::from(format!("{meta_dir}/version-hint.text")), Bytes::from(version.to_string()))?;

        // Objects no kept snapshot names any more.
        let list_uri = self.uri(&Path::from(list_path.as_str()));
        let mut this_snapshot = vec![list_path];
        this_snapshot.extend(manifests.iter().filter_map(|m| self.object_of(&m.file.path)));
        this_snapshot.extend(live_deletes.iter().filter_map(|d| self.object_of(d)));
        self.snapshot_objects.lock().expect("not poisoned").insert(list_uri.clone(), Arc::new(this_snapshot));
        let mut named: HashSet<String> = HashSet::new();
        named.insert(metadata_path(&meta_dir, version).to_string());
        for s in &metadata.snapshots {
            named.extend(self.objects_of(s, used)?.iter().cloned());
        }
        // Only objects older than the retention go: looking for them once
        // a tenth of it is enough.
        let (objects_deleted, cleaned_at) = match cleaned_at {
            Some(at) if at.elapsed() < self.retention / 10 => (0, Some(at)),
            _ => (self.delete_unnamed(&dir, &meta_dir, version, &named)?, Some(Instant::now())),
        };
        let json: Arc<str> = String::from_utf8(json_text).expect("JSON is UTF-8").into();
        let current = ViewTable::Published {
            metadata_location: self.uri(&metadata_path(&meta_dir, version)),
            metadata: Arc::clone(&json),
        };
        live.manifests = manifests;
        self.tables.lock().expect("not poisoned").insert(dir, TableCache { version, metadata, json, live, cleaned_at });
        let bytes_written = delete_bytes_written + manifest_bytes_written + list_bytes + metadata_bytes;
        Ok(TableOutcome::Published { delete_files_written, bytes_written, objects_deleted, current })
    }

    /// The files and manifests of snapshot `s` as the store has them.
    fn live_entries(&self, s: &Snapshot) -> Result<LiveFiles> {
        let mut live = LiveFiles::default();
        let list = self.get_uri(&s.manifest_list)?;
        for m in read_manifest_list(&s.manifest_list, &list)? {
            let bytes = self.get_uri(&m.path)?;
            let mut paths = Vec::new();
            for e in read_manifest(&m, &bytes)?.into_iter().filter(|e| e.status != Status::Deleted) {
                paths.push(e.file.path.clone());
                match e.file.content {
                    Content::Data => live.data.insert(e.file.path.clone(), e),
                    Content::PositionDeletes => live.deletes.insert(e.file.path.clone(), e),
                };
            }
            live.manifests.push(LiveManifest { file: m, paths });
        }
        Ok(live)
    }

    /// The objects under the lake's root snapshot `s` names besides data
    /// files: its manifest list, its manifests and their delete files.
    fn objects_of(&self, s: &Snapshot, used: &mut HashSet<String>) -> Result<Arc<Vec<String>>> {
        used.insert(s.manifest_list.clone());
        if let Some(known) = self.snapshot_objects.lock().expect("not poisoned").get(&s.manifest_list) {
            return Ok(Arc::clone(known));
        }
        let mut objects: Vec<String> = self.object_of(&s.manifest_list).into_iter().collect();
        let list = self.get_uri(&s.manifest_list)?;
        for m in read_manifest_list(&s.manifest_list, &list)? {
            objects.extend(self.object_of(&m.path));
            if m.content == Content::PositionDeletes {
                let bytes = self.get_uri(&m.path)?;
                let entries = read_manifest(&m, &bytes)?;
                objects.extend(
                    entries.iter().filter(|e| e.status != Status::Deleted).filter_map(|e| self.object_of(&e.file.path)),
                );
            }
        }
        let objects = Arc::new(objects);
        self.snapshot_objects.lock().expect("not poisoned").insert(s.manifest_list.clone(), Arc::clone(&objects));
        Ok(objects)
    }

    /// The newest metadata file of the table at `meta_dir` and its version:
    /// the version hint's, or a later one a publisher created without
    /// getting to update the hint.
    fn current_metadata(&self, meta_dir: &str) -> Result<Option<(u64, TableMetadata)>> {
        let hint_path = Path::from(format!("{meta_dir}/version-hint.text"));
        let mut version = match self.get_opt(&hint_path)? {
            Some(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                text.trim().parse::<u64>().map_err(|_| PublishError::Corrupt {
                    what: hint_path.to_string(),
                    reason: format!("{:?} is not a version number", text.trim()),
                })?
            }
            None => 0,
        };
        while self.exists(&metadata_path(meta_dir, version + 1))? {
            version += 1;
        }
        if version == 0 {
            return Ok(None);
        }
        let path = metadata_path(meta_dir, version);
        let bytes = self.lake.get(&path)?;
        let metadata: TableMetadata = serde_json::from_slice(&bytes)
            .map_err(|e| PublishError::Corrupt { what: path.to_string(), reason: e.to_string() })?;
        Ok(Some((version, metadata)))
    }

    /// The data files of table `id` at the checkpoint: each regular file,
    /// each flushed block of a virtual file.
    fn data_files<'m>(&self, manifest: &'m Manifest, id: TableId) -> Result<Vec<CurrentFile<'m>>> {
        let mut out = Vec::new();
        for shard in &manifest.shards {
            let slots: HashMap<u64, &SlotManifest> = shard.slots.iter().map(|s| (s.file, s)).collect();
            for part in shard.parts.iter().filter(|p| p.table == id.0) {
                for f in &part.files {
                    let slot = slots.get(&f.id).copied();
                    out.extend(files_of(f, slot));
                }
            }
        }
        Ok(out)
    }

    /// Positions of `file`'s rows not in the snapshot at `c`: deleted at or
    /// before it, or created after it. Ascending.
    fn positions(&self, file: &CurrentFile<'_>, c: u64, used: &mut HashSet<String>) -> Result<Vec<u64>> {
        let mut positions = Vec::new();
        if let Some(object) = file.slot.and_then(|s| s.deleted.as_ref()) {
            used.insert(object.clone());
            let cached = self.deleted.lock().expect("not poisoned").get(object).cloned();
            let rows = match cached {
                Some(rows) => rows,
                None => {
                    let bytes = self.lake.get(&Path::from(object.as_str()))?;
                    let mut rows: Vec<u32> = fovea_core::checkpoint::deleted_rows_of(object, &bytes)?.collect();
                    rows.sort_unstable();
                    let rows = Arc::new(rows);
                    self.deleted.lock().expect("not poisoned").insert(object.clone(), Arc::clone(&rows));
                    rows
                }
            };
            let (start, end) = (file.offset as u32, (file.offset + file.rows) as u32);
            let from = rows.partition_point(|&r| r < start);
            let to = rows.partition_point(|&r| r < end);
            positions.extend(rows[from..to].iter().map(|&r| u64::from(r - start)));
        }
        if file.max_ts > c {
            // Rows of later transactions in a file the checkpoint names
            // (create_ts ascends within a file: a suffix).
            let first_after = self.first_row_after(file, c)?;
            let keep = positions.partition_point(|&p| p < first_after as u64);
            positions.truncate(keep);
            positions.extend(first_after as u64..file.rows as u64);
        }
        Ok(positions)
    }

    /// Position of the first row of `file` created after `c`.
    fn first_row_after(&self, file: &CurrentFile<'_>, c: u64) -> Result<usize> {
        let batch = self.lake.read_block_columns(&file.path, Some(&[(CREATE_TS_COLUMN, CREATE_TS_FIELD_ID)]))?;
        let ts = fovea_core::lake::create_ts_column(&batch)?;
        Ok(ts.values().partition_point(|&t| t as u64 <= c))
    }

    fn delete_unnamed(&self, dir: &str, meta_dir: &str, version: u64, named: &HashSet<String>) -> Result<usize> {
        let cutoff = cutoff_ms(self.retention);
        let objects = self.lake.list(&Path::from(dir))?;
        // Only the publisher of the newest version cleans up: one that lost a
        // race to a newer publication leaves that one's objects alone.
        if self.exists(&metadata_path(meta_dir, version + 1))? {
            return Ok(0);
        }
        let hint = format!("{meta_dir}/version-hint.text");
        let mut deleted = 0;
        for o in objects {
            let p = o.location.to_string();
            if named.contains(&p) || p == hint || o.last_modified.timestamp_millis() > cutoff {
                continue;
            }
            self.lake.delete(&o.location)?;
            deleted += 1;
        }
        Ok(deleted)
    }

    fn uri(&self, path: &Path) -> String {
        format!("{}/{}", self.root, path)
    }

    /// The object path of a URI under the lake's root.
    fn object_of(&self, uri: &str) -> Option<String> {
        uri.strip_prefix(&self.root).and_then(|p| p.strip_prefix('/')).map(str::to_owned)
    }

    fn get_uri(&self, uri: &str) -> Result<Bytes> {
        let path = self.object_of(uri).ok_or_else(|| PublishError::Corrupt {
            what: uri.to_owned(),
            reason: format!("not under the lake's root {}", self.root),
        })?;
        Ok(self.lake.get(&Path::from(path.as_str()))?)
    }

    fn get_opt(&self, path: &Path) -> Result<Option<Bytes>> {
        let store = Arc::clone(self.lake.store());
        let p = path.clone();
        match block_on_io(async move {
            match store.get(&p).await {
                Ok(r) => r.bytes().await,
                Err(e) => Err(e),
            }
        })? {
            Ok(b) => Ok(Some(b)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(PublishError::Store(fovea_core::Error::from(e))),
        }
    }

    fn head_opt(&self, path: &Path) -> Result<Option<u64>> {
        let store = Arc::clone(self.lake.store());
        let p = path.clone();
        match block_on_io(async move { store.head(&p).await })? {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(PublishError::Store(fovea_core::Error::from(e))),
        }
    }

    fn exists(&self, path: &Path) -> Result<bool> {
        Ok(self.head_opt(path)?.is_some())
    }
}

enum TableOutcome {
    Published {
        delete_files_written: usize,
        bytes_written: u64,
        objects_deleted: usize,
        current: ViewTable,
    },
    /// Its snapshot was at or past the checkpoint already.
    Current(ViewTable),
    /// A dropped table with nothing to publish (`existed`: its Iceberg
    /// table has its last snapshot already).
    Absent {
        existed: bool,
    },
}

/// One data file of a table at a checkpoint.
struct CurrentFile<'m> {
    /// The fovea file it is (or is a block of).
    fovea_file: u64,
    path: Path,
    rows: usize,
    /// Where its footer is, when the checkpoint knows it.
    footer: Option<std::ops::Range<u64>>,
    /// The fovea file's deleted rows.
    slot: Option<&'m SlotManifest>,
    /// Offset of its first row in the fovea file.
    offset: usize,
    /// Its newest row's create_ts.
    max_ts: u64,
}

fn files_of<'m>(f: &'m FileManifest, slot: Option<&'m SlotManifest>) -> Vec<CurrentFile<'m>> {
    match &f.regular {
        Some(r) => vec![CurrentFile {
            fovea_file: f.id,
            path: Path::from(r.path.as_str()),
            rows: r.row_groups.iter().map(|g| g[1] as usize).sum(),
            footer: r.footer.map(|[start, end]| start..end),
            slot,
            offset: 0,
            max_ts: r.row_groups.iter().map(|g| g[3]).max().unwrap_or(0),
        }],
        None => {
            let mut offset = 0;
            f.blocks
                .iter()
                .map(|b| {
                    let file = CurrentFile {
                        fovea_file: f.id,
                        path: Path::from(b.path.as_str()),
                        rows: b.rows,
                        footer: None,
                        slot,
                        offset,
                        max_ts: b.max_ts,
                    };
                    offset += b.rows;
                    file
                })
                .collect()
        }
    }
}

/// The directory of table `name` (`schema.table`) under the lake's root:
/// `iceberg/SCHEMA/TABLE`, each part kept to letters, digits, `_`, `-`
/// (other characters become `_`, and a hash of the name keeps two names
/// apart).
pub fn table_dir(name: &str) -> String {
    let (namespace, table) = name.split_once('.').unwrap_or(("default", name));
    let clean = |s: &str| -> String {
        let c: String =
            s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
        if c == s && !c.is_empty() {
            c
        } else {
            let mut h = twox_hash::XxHash64::with_seed(0);
            h.write(s.as_bytes());
            format!("{c}-{:08x}", h.finish() as u32)
        }
    };
    format!("{ICEBERG_PREFIX}/{}/{}", clean(namespace), clean(table))
}

fn metadata_path(meta_dir: &str, version: u64) -> Path {
    Path::from(format!("{meta_dir}/v{version}.metadata.json"))
}

fn main_ref(snapshot_id: i64) -> BTreeMap<String, SnapshotRef> {
    BTreeMap::from([("main".to_owned(), SnapshotRef { snapshot_id, kind: "branch".into() })])
}

fn content_hash(data_uri: &str, positions: &[u64]) -> u64 {
    let mut h = twox_hash::XxHash64::with_seed(0);
    h.write(data_uri.as_bytes());
    for p in positions {
        h.write(&p.to_le_bytes());
    }
    h.finish()
}

fn now_ms() -> i64 {
    fovea_core::catalog::now_us() / 1000
}

/// Milliseconds since the epoch `retention` ago.
fn cutoff_ms(retention: Duration) -> i64 {
    now_ms() - retention.as_millis() as i64
}

/// Drops the snapshots of `m` that stopped being current before `cutoff`
/// (ms): a snapshot is kept while the one after it is younger than the
/// retention — the time a publishing replayer keeps the data files it
/// names that combine and storage GC replaced — so time travel to a kept
/// snapshot reads exactly what it read when it was current; the newest
/// [`SNAPSHOTS_KEPT`] at most. The snapshot a reader registered at ts
/// `held` reads (the newest of a checkpoint at or below it) is kept too,
/// and every one after it.
fn expire_snapshots(m: &mut TableMetadata, cutoff: i64, held: Option<u64>) {
    let mut first_kept = 0;
    while first_kept + 1 < m.snapshots.len() && m.snapshots[first_kept + 1].timestamp_ms <= cutoff {
        first_kept += 1;
    }
    // At most SNAPSHOTS_KEPT (frequent checkpoints would make every
    // metadata file long): what a dropped one names stays for the
    // retention since it was written (`delete_unnamed`), so its readers
    // still find it; only time travel back to it is gone.
    first_kept = first_kept.max(m.snapshots.len().saturating_sub(SNAPSHOTS_KEPT));
    if let Some(held) = held {
        // Snapshot ids are checkpoint timestamps, ascending.
        let read = m.snapshots.iter().rposition(|s| s.snapshot_id as u64 <= held).unwrap_or(0);
        first_kept = first_kept.min(read);
    }
    m.snapshots.drain(..first_kept);
    let kept: HashSet<i64> = m.snapshots.iter().map(|s| s.snapshot_id).collect();
    m.snapshot_log.retain(|e| kept.contains(&e.snapshot_id));
}

/// The manifests of `content` of the snapshot before that the next one
/// lists again as they are: those whose files are all `live` (and that
/// list a live file: one of only removed files is its snapshot's), at most
/// [`MANIFESTS_CARRIED`] — past that, only the half with the most files
/// (the others' files go into the new manifest), so a reader opens few
/// manifests and a file is written into a new one about log(n) times.
fn carried_manifests(prev: &[LiveManifest], content: Content, live: &HashSet<String>) -> Vec<LiveManifest> {
    let mut carried: Vec<&LiveManifest> = prev
        .iter()
        .filter(|m| m.file.content == content && !m.paths.is_empty() && m.paths.iter().all(|p| live.contains(p)))
        .collect();
    if carried.len() > MANIFESTS_CARRIED {
        let mut by_size: Vec<usize> = (0..carried.len()).collect();
        by_size.sort_by_key(|&i| std::cmp::Reverse(carried[i].paths.len()));
        let kept: HashSet<usize> = by_size.into_iter().take(MANIFESTS_CARRIED / 2).collect();
        carried = carried.into_iter().enumerate().filter(|(i, _)| kept.contains(i)).map(|(_, m)| m).collect();
    }
    carried.into_iter().cloned().collect()
}

/// Splits a snapshot's live `entries` into those the `carried` manifests
/// list and the rest, which the new manifest lists (as existing, where
/// they were in the snapshot before).
fn split_carried(entries: Vec<Entry>, carried: &[LiveManifest], snapshot_id: i64) -> (Vec<Entry>, Vec<Entry>) {
    let listed: HashSet<&str> = carried.iter().flat_map(|m| m.paths.iter().map(String::as_str)).collect();
    let (carried, mut listed_again): (Vec<Entry>, Vec<Entry>) =
        entries.into_iter().partition(|e| listed.contains(e.file.path.as_str()));
    for e in listed_again.iter_mut().filter(|e| e.snapshot_id != snapshot_id) {
        e.status = Status::Existing;
    }
    (carried, listed_again)
}

/// Format 3 row ids of one snapshot.
#[derive(Clone, Copy, Debug)]
struct RowLineage {
    /// The table's `next-row-id` before it: the snapshot's `first-row-id`.
    first_row_id: i64,
    /// The data manifest's `first_row_id`: its added files' ids start here.
    manifest_first_row_id: i64,
    /// The table's `next-row-id` after it.
    next_row_id: i64,
}

/// Assigns row ids from `next_row_id`: data files carried without one (a
/// format 2 table upgraded) get theirs written in the manifest; the files
/// this snapshot adds (written without one) inherit theirs from the
/// manifest's `first_row_id`, in manifest order.
fn row_lineage(next_row_id: i64, carried: &mut [Entry], removed: &mut [Entry]) -> RowLineage {
    let mut next = next_row_id;
    for e in carried.iter_mut().chain(removed.iter_mut()) {
        if e.status != Status::Added && e.file.first_row_id.is_none() {
            e.file.first_row_id = Some(next);
            next += e.file.record_count;
        }
    }
    let manifest_first_row_id = next;
    next += carried.iter().filter(|e| e.status == Status::Added).map(|e| e.file.record_count).sum::<i64>();
    RowLineage { first_row_id: next_row_id, manifest_first_row_id, next_row_id: next }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").field("root", &self.root).field("format", &self.format).finish_non_exhaustive()
    }
}

impl fovea_core::sink::CheckpointPublisher for Publisher {
    fn publish(&self, checkpoint: &CheckpointRecord) -> std::result::Result<(), String> {
        let p = Publisher::publish(self, checkpoint).map_err(|e| e.to_string())?;
        tracing::debug!(
            checkpoint_ts = checkpoint.manifest.checkpoint_ts,
            tables = p.tables,
            delete_files = p.delete_files_written,
            deleted = p.objects_deleted,
            "published as Iceberg"
        );
        if p.refused.is_empty() {
            Ok(())
        } else {
            Err(p.refused.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{DataFile, ManifestHeader};

    fn data(status: Status, path: &str, rows: i64, first_row_id: Option<i64>) -> Entry {
        Entry {
            status,
            snapshot_id: 1,
            sequence_number: 1,
            file_sequence_number: 1,
            file: DataFile {
                content: Content::Data,
                path: path.into(),
                format: "PARQUET",
                record_count: rows,
                size: 100,
                referenced_data_file: None,
                content_offset: None,
                content_size: None,
                first_row_id,
            },
        }
    }

    #[test]
    fn row_ids_are_assigned_once_and_read_back_by_inheritance() {
        // An upgraded format 2 table: a carried file without an id gets one
        // written; added files inherit from the manifest after it.
        let mut carried = vec![
            data(Status::Existing, "a", 10, None),
            data(Status::Existing, "b", 5, Some(3)),
            data(Status::Added, "c", 7, None),
            data(Status::Added, "d", 2, None),
        ];
        let mut removed = vec![data(Status::Deleted, "e", 4, Some(0))];
        let l = row_lineage(100, &mut carried, &mut removed);
        assert_eq!((l.first_row_id, l.manifest_first_row_id, l.next_row_id), (100, 110, 119));
        assert_eq!(carried[0].file.first_row_id, Some(100));
        assert_eq!(carried[1].file.first_row_id, Some(3), "an assigned id is kept");
        assert_eq!(removed[0].file.first_row_id, Some(0));

        let mut entries = carried.clone();
        entries.extend(removed);
        let header = ManifestHeader { schema_json: "{}", schema_id: 0, format_version: 3, content: Content::Data };
        let bytes = write_manifest(&header, &entries).unwrap();
        let m = ManifestFile {
            path: "m.avro".into(),
            length: bytes.len() as i64,
            content: Content::Data,
            sequence_number: 1,
            min_sequence_number: 1,
            added_snapshot_id: 1,
            added_files: 2,
            existing_files: 2,
            deleted_files: 1,
            added_rows: 9,
            existing_rows: 15,
            deleted_rows: 4,
            first_row_id: Some(l.manifest_first_row_id),
        };
        let ids: Vec<Option<i64>> = read_manifest(&m, &bytes).unwrap().iter().map(|e| e.file.first_row_id).collect();
        assert_eq!(ids, vec![Some(100), Some(3), Some(110), Some(117), Some(0)]);
    }

    /// Writes and commits `engine`'s checkpoint and publishes it.
    fn publish_checkpoint(engine: &Arc<fovea_core::Engine>, publisher: &Publisher) -> Published {
        let manifest = engine.write_checkpoint().unwrap();
        engine.checkpoint_committed(&manifest);
        let record = CheckpointRecord { manifest, input: "t".into(), position: Default::default(), source_state: None };
        publisher.publish(&record).unwrap()
    }

    /// The live entries of a table's current snapshot as its manifests in
    /// the store have them (what a fresh publisher starts from).
    fn entries_in_store(p: &Publisher, table: &str) -> LiveFiles {
        let (_, m) = p.current_metadata(&format!("{}/metadata", table_dir(table))).unwrap().unwrap();
        p.live_entries(m.current_snapshot().unwrap()).unwrap()
    }

    /// Whether what `p` remembers of `table` is what its manifests say.
    fn assert_cache_is_store(p: &Publisher, table: &str, case: &str) -> LiveFiles {
        let live = entries_in_store(p, table);
        let tables = p.tables.lock().unwrap();
        let cached = &tables.get(&table_dir(table)).unwrap().live;
        assert_eq!(cached.data, live.data, "{case}");
        assert_eq!(cached.deletes, live.deletes, "{case}");
        assert_eq!(cached.manifests, live.manifests, "{case}");
        live
    }

    #[test]
    fn what_a_publisher_remembers_of_a_table_is_what_its_manifests_say() {
        use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
        use fovea_core::{Engine, EngineConfig, Op, Value};
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open_dir(dir.path(), EngineConfig::default()).unwrap();
        let schema = Arc::new(ArrowSchema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        let t = engine.create_table("s.t", schema, vec![0]).unwrap();
        let root = format!("file://{}", dir.path().canonicalize().unwrap().display());
        // The same table published in format 2, then upgraded to 3.
        for (base, format) in [(0, FormatVersion::V2), (10_000, FormatVersion::V3)] {
            let publisher = Publisher::new(Arc::clone(engine.lake().store()), &root, format);
            for round in 0..4i64 {
                let key = |k: i64| base + round * 100 + k;
                let mut ops: Vec<Op> =
                    (0..50).map(|k| Op::Insert { table: t.id, row: vec![Value::Int(key(k)), Value::Int(0)] }).collect();
                if round > 0 {
                    ops.push(Op::Delete { table: t.id, key: vec![Value::Int(key(-93))] });
                    ops.push(Op::Update {
                        table: t.id,
                        key: vec![Value::Int(base + 3)],
                        row: vec![Value::Int(base + 3), Value::Int(round)],
                    });
                }
                engine.apply(ops).unwrap();
                engine.flush().unwrap();
                if round == 2 {
                    engine.combine().unwrap();
                }
                let published = publish_checkpoint(&engine, &publisher);
                assert!(published.refused.is_empty(), "{:?}", published.refused);
                let live = assert_cache_is_store(&publisher, "s.t", &format!("{format:?}, round {round}"));
                if format == FormatVersion::V3 {
                    assert!(live.data.values().all(|e| e.file.first_row_id.is_some()));
                }
            }
        }
    }

    /// A snapshot lists the manifests of the one before whose files are
    /// all still live as they are, writes one new manifest per content for
    /// the rest, and never lists more than the carried bound plus that
    /// one; the files they list are the table's rows at every checkpoint.
    #[test]
    fn unchanged_manifests_are_listed_again_and_their_number_stays_bounded() {
        use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
        use fovea_core::{Engine, EngineConfig, Op, Value};
        for format in [FormatVersion::V2, FormatVersion::V3] {
            let dir = tempfile::tempdir().unwrap();
            // Blocks of 8 rows: some are flushed in every round or two,
            // the rest is written by each checkpoint for itself.
            let config = EngineConfig { block_rows: 8, blocks_per_file: 4, ..EngineConfig::default() };
            let engine = Engine::open_dir(dir.path(), config).unwrap();
            let schema = Arc::new(ArrowSchema::new(vec![Field::new("id", DataType::Int64, false)]));
            let t = engine.create_table("s.t", schema, vec![0]).unwrap();
            let root = format!("file://{}", dir.path().canonicalize().unwrap().display());
            let publisher = Publisher::new(Arc::clone(engine.lake().store()), &root, format);
            let mut rows = 0i64;
            let mut previous: Option<LiveFiles> = None;
            let (mut folded, mut tails) = (false, false);
            for round in 0..3 * MANIFESTS_CARRIED as i64 {
                let case = format!("{format:?}, round {round}");
                let mut ops: Vec<Op> =
                    (0..10).map(|k| Op::Insert { table: t.id, row: vec![Value::Int(round * 10 + k)] }).collect();
                rows += 10;
                // Now and then a row of an early file goes: that file's
                // deletes change, its data manifest does not.
                let deletes = round % 5 == 4;
                if deletes {
                    ops.push(Op::Delete { table: t.id, key: vec![Value::Int(round / 5)] });
                    rows -= 1;
                }
                engine.apply(ops).unwrap();
                engine.flush().unwrap();
                let published = publish_checkpoint(&engine, &publisher);
                assert!(published.refused.is_empty(), "{case}: {:?}", published.refused);
                let live = assert_cache_is_store(&publisher, "s.t", &case);
                let of = |live: &LiveFiles, content: Content| -> Vec<ManifestFile> {
                    live.manifests.iter().filter(|m| m.file.content == content).map(|m| m.file.clone()).collect()
                };
                // The carried ones, and the new one (data: and the tail's).
                for (content, new) in [(Content::Data, 2), (Content::PositionDeletes, 1)] {
                    assert!(of(&live, content).len() <= MANIFESTS_CARRIED + new, "{case}: {:?}", live.manifests);
                }
                // The rows its files hold less the deleted ones: the table's.
                let count = |m: &HashMap<String, Entry>| m.values().map(|e| e.file.record_count).sum::<i64>();
                assert_eq!(count(&live.data) - count(&live.deletes), rows, "{case}");
                // The manifests of flushed blocks (the checkpoint's own
                // blocks, and the files a snapshot removes, are in one of
                // their own that no later snapshot lists).
                let settled = |live: &LiveFiles| -> Vec<ManifestFile> {
                    let all = of(live, Content::Data);
                    all.into_iter().filter(|m| !m.path.ends_with("-tail.avro")).collect()
                };
                tails |= live.data.keys().any(|p| fovea_core::lake::is_checkpoint_block(p));
                if let Some(before) = &previous {
                    let (now, then) = (settled(&live), settled(before));
                    if then.len() <= MANIFESTS_CARRIED {
                        // No flushed block went: every manifest of them is
                        // listed again, and a new one lists only blocks
                        // flushed since.
                        assert!(then.iter().all(|m| now.contains(m)), "{case}: {then:?} {now:?}");
                        let new: Vec<&ManifestFile> = now.iter().filter(|m| !then.contains(m)).collect();
                        assert!(new.len() <= 1, "{case}");
                        assert!(new.iter().all(|m| (m.existing_files, m.deleted_files) == (0, 0)), "{case}");
                    } else {
                        folded = true;
                        assert!(now.len() <= MANIFESTS_CARRIED / 2 + 1, "{case}: {now:?}");
                    }
                }
                previous = Some(live);
            }
            assert!(folded && tails, "{format:?}: manifests were never folded ({folded}), or no tail ({tails})");
        }
    }

    /// A column dropped and added again under its name is a new field
    /// (a new id; the files from before carry the dropped one's), published
    /// whether the drop was published or not, or no publication came before.
    #[test]
    fn a_column_added_again_under_its_name_is_a_new_field() {
        use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
        use fovea_core::{Engine, EngineConfig, Op, Value};
        let field = |name: &str, nullable: bool| Field::new(name, DataType::Int64, nullable);
        let with_note = Arc::new(ArrowSchema::new(vec![field("id", false), field("note", true)]));
        let without = Arc::new(ArrowSchema::new(vec![field("id", false)]));
        for (case, publish_first, publish_between) in [
            ("drop published", true, true),
            ("drop unpublished", true, false),
            ("first publication after", false, false),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let engine = Engine::open_dir(dir.path(), EngineConfig::default()).unwrap();
            let t = engine.create_table("s.t", Arc::clone(&with_note), vec![0]).unwrap();
            engine.apply(vec![Op::Insert { table: t.id, row: vec![Value::Int(1), Value::Int(10)] }]).unwrap();
            engine.flush().unwrap();
            let root = format!("file://{}", dir.path().canonicalize().unwrap().display());
            let publisher = Publisher::new(Arc::clone(engine.lake().store()), &root, FormatVersion::V2);
            let publish = |engine: &Arc<Engine>| {
                let p = publish_checkpoint(engine, &publisher);
                assert!(p.refused.is_empty(), "{case}: {:?}", p.refused);
            };
            let evolve = |schema: &Arc<ArrowSchema>, row: Vec<Value>| {
                let ts = engine.begin().unwrap();
                engine.evolve_table("s.t", Arc::clone(schema), ts).unwrap();
                engine.apply_at(ts, vec![Op::Insert { table: t.id, row }]).unwrap();
                engine.commit(ts).unwrap();
                engine.flush().unwrap();
            };
            if publish_first {
                publish(&engine);
            }
            evolve(&without, vec![Value::Int(2)]);
            if publish_between {
                publish(&engine);
            }
            evolve(&with_note, vec![Value::Int(3), Value::Int(30)]);
            publish(&engine);
            let (_, m) = publisher.current_metadata(&format!("{}/metadata", table_dir("s.t"))).unwrap().unwrap();
            let fields: Vec<(i32, &str)> =
                m.current_schema().unwrap().fields.iter().map(|f| (f.id, f.name.as_str())).collect();
            assert_eq!(fields, [(1, "id"), (3, "note")], "{case}");
            assert!(m.last_column_id >= 3, "{case}");
        }
    }

    /// Past the retention, a snapshot a registered reader reads is kept
    /// with what it names, until the reader is gone.
    #[test]
    fn a_registered_readers_snapshot_outlives_the_retention_until_it_is_done() {
        use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
        use fovea_core::{Engine, EngineConfig, Op, Value};
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open_dir(dir.path(), EngineConfig::default()).unwrap();
        let schema = Arc::new(ArrowSchema::new(vec![Field::new("id", DataType::Int64, false)]));
        let t = engine.create_table("s.t", schema, vec![0]).unwrap();
        let root = format!("file://{}", dir.path().canonicalize().unwrap().display());
        let store = Arc::clone(engine.clock().store());
        let publisher = Publisher::new(Arc::clone(engine.lake().store()), &root, FormatVersion::V2)
            .with_retention(Duration::ZERO)
            .with_readers(Arc::clone(&store));
        let publish = |k: i64| {
            engine.apply(vec![Op::Insert { table: t.id, row: vec![Value::Int(k)] }]).unwrap();
            assert!(publish_checkpoint(&engine, &publisher).refused.is_empty());
            let (_, m) = publisher.current_metadata(&format!("{}/metadata", table_dir("s.t"))).unwrap().unwrap();
            (m.current_snapshot().unwrap().snapshot_id as u64, m)
        };
        let (first, _) = publish(1);
        // A reader at a ts between the first checkpoint and the second.
        store.register_reader("r", fovea_core::ids::Ts(first), fovea_core::catalog::now_us() + 60_000_000).unwrap();
        publish(2);
        let (_, m2) = publish(3);
        let ids: Vec<i64> = m2.snapshots.iter().map(|s| s.snapshot_id).collect();
        assert_eq!(ids.first(), Some(&(first as i64)), "held: {ids:?}");
        let held = &m2.snapshots[0];
        let list = held.manifest_list.strip_prefix("file://").unwrap();
        assert!(std::path::Path::new(list).exists(), "its manifest list is kept");
        // The reader is done: the next publication keeps the newest alone.
        store.deregister_reader("r").unwrap();
        let (last, m3) = publish(4);
        assert_eq!(m3.snapshots.iter().map(|s| s.snapshot_id).collect::<Vec<_>>(), vec![last as i64]);
    }

    #[test]
    fn a_dropped_table_gets_one_last_snapshot_without_rows() {
        use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
        use fovea_core::{Engine, EngineConfig, Op, Value};
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open_dir(dir.path(), EngineConfig::default()).unwrap();
        let schema = Arc::new(ArrowSchema::new(vec![Field::new("id", DataType::Int64, false)]));
        let kept = engine.create_table("s.kept", Arc::clone(&schema), vec![0]).unwrap();
        let gone = engine.create_table("s.gone", Arc::clone(&schema), vec![0]).unwrap();
        let rows = |t: &fovea_core::schema::TableDef| -> Vec<Op> {
            (0..10).map(|k| Op::Insert { table: t.id, row: vec![Value::Int(k)] }).collect()
        };
        engine.apply([rows(&kept), rows(&gone)].concat()).unwrap();
        let root = format!("file://{}", dir.path().canonicalize().unwrap().display());
        let publisher = Publisher::new(Arc::clone(engine.lake().store()), &root, FormatVersion::V2);
        let publish = |engine: &Arc<Engine>| publish_checkpoint(engine, &publisher);
        assert_eq!(publish(&engine).tables, 2);
        let ts = engine.begin().unwrap();
        engine.drop_table_at("s.gone", ts).unwrap();
        engine.commit(ts).unwrap();
        let p = publish(&engine);
        assert_eq!((p.tables, p.refused.len()), (2, 0));
        let view = publisher.view().unwrap();
        assert!(!view.tables.contains_key("s.gone") && view.tables.contains_key("s.kept"), "{view:?}");
        assert!(view.dropped.contains("s.gone"), "catalogs are told to remove it: {view:?}");
        let (version, m) = publisher.current_metadata(&format!("{}/metadata", table_dir("s.gone"))).unwrap().unwrap();
        let s = m.current_snapshot().unwrap();
        assert_eq!(s.summary.get(DROPPED_PROPERTY).map(String::as_str), Some("true"));
        assert_eq!(s.summary["total-records"], "0");
        assert_eq!(s.summary["operation"], "delete");
        assert_eq!(m.snapshots.len(), 2, "the snapshot before the drop is kept for time travel");
        // Later checkpoints leave it as it is.
        engine.apply(vec![Op::Insert { table: kept.id, row: vec![Value::Int(99)] }]).unwrap();
        let p = publish(&engine);
        assert_eq!(p.tables, 1);
        let (again, _) = publisher.current_metadata(&format!("{}/metadata", table_dir("s.gone"))).unwrap().unwrap();
        assert_eq!(again, version);
        assert!(publisher.view().unwrap().dropped.contains("s.gone"), "still removed from catalogs");
    }

    fn snapshot(id: i64, timestamp_ms: i64) -> Snapshot {
        Snapshot {
            snapshot_id: id,
            parent_snapshot_id: None,
            sequence_number: id,
            timestamp_ms,
            manifest_list: format!("snap-{id}.avro"),
            summary: BTreeMap::new(),
            schema_id: 0,
            first_row_id: None,
            added_rows: None,
        }
    }

    #[test]
    fn a_snapshot_is_kept_while_the_one_after_it_is_younger_than_the_retention() {
        let mut m: TableMetadata = serde_json::from_value(serde_json::json!({
            "format-version": 2, "table-uuid": "u", "location": "l", "last-sequence-number": 4,
            "last-updated-ms": 0, "last-column-id": 0, "schemas": [], "current-schema-id": 0,
            "partition-specs": [], "default-spec-id": 0, "last-partition-id": 999, "properties": {},
            "snapshots": [], "snapshot-log": [], "metadata-log": [], "sort-orders": [],
            "default-sort-order-id": 0
        }))
        .unwrap();
        for (id, ts) in [(1, 100), (2, 200), (3, 300), (4, 400)] {
            m.snapshots.push(snapshot(id, ts));
            m.snapshot_log.push(SnapshotLogEntry { timestamp_ms: ts, snapshot_id: id });
        }
        let ids = |m: &TableMetadata| m.snapshots.iter().map(|s| s.snapshot_id).collect::<Vec<_>>();
        // A reader registered at ts 2 holds snapshot 2 and those after it
        // past the retention, one at 3 snapshot 3 on; one past the newest
        // holds nothing more.
        for held in [2, 3] {
            let mut kept = m.clone();
            expire_snapshots(&mut kept, 10_000, Some(held));
            assert_eq!(ids(&kept), (held as i64..=4).collect::<Vec<_>>());
        }
        let mut kept = m.clone();
        expire_snapshots(&mut kept, 10_000, Some(9));
        assert_eq!(ids(&kept), vec![4]);
        // Snapshot 1 stopped being current at 200, 2 at 300: with the
        // cutoff at 250, 2 is still within the retention.
        expire_snapshots(&mut m, 250, None);
        assert_eq!(ids(&m), vec![2, 3, 4]);
        assert_eq!(m.snapshot_log.iter().map(|e| e.snapshot_id).collect::<Vec<_>>(), vec![2, 3, 4]);
        // The current snapshot is never expired.
        expire_snapshots(&mut m, 10_000, None);
        assert_eq!(ids(&m), vec![4]);
        // Within the retention, the newest SNAPSHOTS_KEPT; a reader's
        // snapshot and those after it however many they are.
        let n = SNAPSHOTS_KEPT as i64 + 50;
        for id in 5..5 + n {
            m.snapshots.push(snapshot(id, 1_000 + id));
            m.snapshot_log.push(SnapshotLogEntry { timestamp_ms: 1_000 + id, snapshot_id: id });
        }
        let mut kept = m.clone();
        expire_snapshots(&mut kept, 0, Some(10));
        assert_eq!(ids(&kept), (10..5 + n).collect::<Vec<_>>());
        expire_snapshots(&mut m, 0, None);
        assert_eq!(ids(&m), (5 + n - SNAPSHOTS_KEPT as i64..5 + n).collect::<Vec<_>>());
        assert_eq!(m.snapshot_log.len(), SNAPSHOTS_KEPT);
    }
}
