//! Manifests and manifest lists: Avro object container files with the
//! spec's field ids (format 2 and 3 fields fovea fills; optional metrics
//! left out, which every reader treats as unknown).

use std::collections::HashMap;

use apache_avro::types::Value;
use apache_avro::{Reader, Schema as AvroSchema, Writer};

use crate::{PublishError, Result};

/// Field id of a position delete file's `file_path` column.
pub const DELETE_FILE_PATH_ID: i32 = 2147483546;
/// Field id of a position delete file's `pos` column.
pub const DELETE_POS_ID: i32 = 2147483545;

/// Status of a manifest entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Carried from an earlier snapshot.
    Existing = 0,
    /// Added by this snapshot.
    Added = 1,
    /// Removed by this snapshot.
    Deleted = 2,
}

/// What a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// Rows.
    Data = 0,
    /// Position deletes (format 2 files, or format 3 deletion vectors).
    PositionDeletes = 1,
}

/// A data or delete file as a manifest lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct DataFile {
    /// Rows or deletes.
    pub content: Content,
    /// Absolute location.
    pub path: String,
    /// `PARQUET` or `PUFFIN`.
    pub format: &'static str,
    /// Rows (for deletes: deleted positions).
    pub record_count: i64,
    /// Bytes of the object.
    pub size: i64,
    /// The one data file a delete file applies to.
    pub referenced_data_file: Option<String>,
    /// Deletion vector: where its blob is in the Puffin file.
    pub content_offset: Option<i64>,
    /// Deletion vector: the blob's length.
    pub content_size: Option<i64>,
    /// Format 3 data files: the row id of the first row.
    pub first_row_id: Option<i64>,
}

/// A manifest entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Added, carried or removed.
    pub status: Status,
    /// The snapshot that added the file.
    pub snapshot_id: i64,
    /// The data sequence number of the file.
    pub sequence_number: i64,
    /// The sequence number of the snapshot that added the file.
    pub file_sequence_number: i64,
    /// The file.
    pub file: DataFile,
}

/// A manifest as a manifest list lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct ManifestFile {
    /// Absolute location.
    pub path: String,
    /// Bytes.
    pub length: i64,
    /// Data or delete files.
    pub content: Content,
    /// Sequence number of the snapshot that added it.
    pub sequence_number: i64,
    /// Smallest data sequence number of its live files.
    pub min_sequence_number: i64,
    /// The snapshot that added it.
    pub added_snapshot_id: i64,
    /// Entries by status.
    pub added_files: i32,
    /// Entries by status.
    pub existing_files: i32,
    /// Entries by status.
    pub deleted_files: i32,
    /// Rows by status.
    pub added_rows: i64,
    /// Rows by status.
    pub existing_rows: i64,
    /// Rows by status.
    pub deleted_rows: i64,
    /// Format 3: the first row id its data files' rows get.
    pub first_row_id: Option<i64>,
}

fn entry_schema(format_version: u8) -> String {
    let v3 = if format_version >= 3 {
        r#",{"name":"first_row_id","type":["null","long"],"default":null,"field-id":142},
           {"name":"content_offset","type":["null","long"],"default":null,"field-id":144},
           {"name":"content_size_in_bytes","type":["null","long"],"default":null,"field-id":145}"#
    } else {
        ""
    };
    format!(
        r#"{{"type":"record","name":"manifest_entry","fields":[
  {{"name":"status","type":"int","field-id":0}},
  {{"name":"snapshot_id","type":["null","long"],"default":null,"field-id":1}},
  {{"name":"sequence_number","type":["null","long"],"default":null,"field-id":3}},
  {{"name":"file_sequence_number","type":["null","long"],"default":null,"field-id":4}},
  {{"name":"data_file","field-id":2,"type":{{"type":"record","name":"r2","fields":[
    {{"name":"content","type":"int","field-id":134}},
    {{"name":"file_path","type":"string","field-id":100}},
    {{"name":"file_format","type":"string","field-id":101}},
    {{"name":"partition","field-id":102,"type":{{"type":"record","name":"r102","fields":[]}}}},
    {{"name":"record_count","type":"long","field-id":103}},
    {{"name":"file_size_in_bytes","type":"long","field-id":104}},
    {{"name":"lower_bounds","default":null,"field-id":125,"type":["null",{{"type":"array","logicalType":"map","items":
      {{"type":"record","name":"k126_v127","fields":[{{"name":"key","type":"int","field-id":126}},{{"name":"value","type":"bytes","field-id":127}}]}}}}]}},
    {{"name":"upper_bounds","default":null,"field-id":128,"type":["null",{{"type":"array","logicalType":"map","items":
      {{"type":"record","name":"k129_v130","fields":[{{"name":"key","type":"int","field-id":129}},{{"name":"value","type":"bytes","field-id":130}}]}}}}]}},
    {{"name":"key_metadata","type":["null","bytes"],"default":null,"field-id":131}},
    {{"name":"sort_order_id","type":["null","int"],"default":null,"field-id":140}},
    {{"name":"referenced_data_file","type":["null","string"],"default":null,"field-id":143}}{v3}
  ]}}}}
]}}"#
    )
}

const MANIFEST_LIST_SCHEMA_V2: &str = r#"{"type":"record","name":"manifest_file","fields":[
  {"name":"manifest_path","type":"string","field-id":500},
  {"name":"manifest_length","type":"long","field-id":501},
  {"name":"partition_spec_id","type":"int","field-id":502},
  {"name":"content","type":"int","field-id":517},
  {"name":"sequence_number","type":"long","field-id":515},
  {"name":"min_sequence_number","type":"long","field-id":516},
  {"name":"added_snapshot_id","type":"long","field-id":503},
  {"name":"added_files_count","type":"int","field-id":504},
  {"name":"existing_files_count","type":"int","field-id":505},
  {"name":"deleted_files_count","type":"int","field-id":506},
  {"name":"added_rows_count","type":"long","field-id":512},
  {"name":"existing_rows_count","type":"long","field-id":513},
  {"name":"deleted_rows_count","type":"long","field-id":514},
  {"name":"partitions","default":null,"field-id":507,"type":["null",{"type":"array","element-id":508,"items":
    {"type":"record","name":"r508","fields":[
      {"name":"contains_null","type":"boolean","field-id":509},
      {"name":"contains_nan","type":["null","boolean"],"default":null,"field-id":518},
      {"name":"lower_bound","type":["null","bytes"],"default":null,"field-id":510},
      {"name":"upper_bound","type":["null","bytes"],"default":null,"field-id":511}]}}]},
  {"name":"key_metadata","type":["null","bytes"],"default":null,"field-id":519}"#;

fn manifest_list_schema(format_version: u8) -> String {
    let v3 = if format_version >= 3 {
        r#",{"name":"first_row_id","type":["null","long"],"default":null,"field-id":520}"#
    } else {
        ""
    };
    format!("{MANIFEST_LIST_SCHEMA_V2}{v3}]}}")
}

fn parse(schema: &str) -> AvroSchema {
    AvroSchema::parse_str(schema).expect("the spec's Avro schemas parse")
}

fn opt_long(v: Option<i64>) -> Value {
    match v {
        Some(v) => Value::Union(1, Box::new(Value::Long(v))),
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

fn opt_string(v: Option<&str>) -> Value {
    match v {
        Some(v) => Value::Union(1, Box::new(Value::String(v.to_owned()))),
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

fn null() -> Value {
    Value::Union(0, Box::new(Value::Null))
}

/// A bounds map with one entry, `field` → `bytes`.
fn bound(field: i32, bytes: &[u8]) -> Value {
    let kv = Value::Record(vec![("key".into(), Value::Int(field)), ("value".into(), Value::Bytes(bytes.to_vec()))]);
    Value::Union(1, Box::new(Value::Array(vec![kv])))
}

/// What a manifest's header says of its table.
pub struct ManifestHeader<'a> {
    /// The table schema as JSON.
    pub schema_json: &'a str,
    /// Its id.
    pub schema_id: i32,
    /// Table format version.
    pub format_version: u8,
    /// Data or delete files.
    pub content: Content,
}

/// A manifest holding `entries` (all of `header.content`).
pub fn write_manifest(header: &ManifestHeader<'_>, entries: &[Entry]) -> Result<Vec<u8>> {
    let schema = parse(&entry_schema(header.format_version));
    let mut writer = Writer::new(&schema, Vec::new());
    let meta = [
        ("schema", header.schema_json.to_owned()),
        ("schema-id", header.schema_id.to_string()),
        ("partition-spec", "[]".to_owned()),
        ("partition-spec-id", "0".to_owned()),
        ("format-version", header.format_version.to_string()),
        ("content", if header.content == Content::Data { "data" } else { "deletes" }.to_owned()),
    ];
    for (k, v) in meta {
        writer.add_user_metadata(k.to_owned(), v).map_err(avro)?;
    }
    for e in entries {
        let f = &e.file;
        let (lower, upper) = match (&f.referenced_data_file, f.format) {
            // Position delete files of one data file: its path bounds the
            // file_path column, so readers match them without opening them.
            (Some(data), "PARQUET") => {
                (bound(DELETE_FILE_PATH_ID, data.as_bytes()), bound(DELETE_FILE_PATH_ID, data.as_bytes()))
            }
            _ => (null(), null()),
        };
        let mut file = vec![
            ("content".into(), Value::Int(f.content as i32)),
            ("file_path".into(), Value::String(f.path.clone())),
            ("file_format".into(), Value::String(f.format.to_owned())),
            ("partition".into(), Value::Record(vec![])),
            ("record_count".into(), Value::Long(f.record_count)),
            ("file_size_in_bytes".into(), Value::Long(f.size)),
            ("lower_bounds".into(), lower),
            ("upper_bounds".into(), upper),
            ("key_metadata".into(), null()),
            ("sort_order_id".into(), null()),
            ("referenced_data_file".into(), opt_string(f.referenced_data_file.as_deref())),
        ];
        if header.format_version >= 3 {
            file.push(("first_row_id".into(), opt_long(f.first_row_id)));
            file.push(("content_offset".into(), opt_long(f.content_offset)));
            file.push(("content_size_in_bytes".into(), opt_long(f.content_size)));
        }
        let record = Value::Record(vec![
            ("status".into(), Value::Int(e.status as i32)),
            ("snapshot_id".into(), opt_long(Some(e.snapshot_id))),
            ("sequence_number".into(), opt_long(Some(e.sequence_number))),
            ("file_sequence_number".into(), opt_long(Some(e.file_sequence_number))),
            ("data_file".into(), Value::Record(file)),
        ]);
        writer.append(record).map_err(avro)?;
    }
    writer.into_inner().map_err(avro)
}

/// A manifest list naming `manifests`.
pub fn write_manifest_list(
    format_version: u8,
    snapshot_id: i64,
    parent: Option<i64>,
    sequence_number: i64,
    manifests: &[ManifestFile],
) -> Result<Vec<u8>> {
    let schema = parse(&manifest_list_schema(format_version));
    let mut writer = Writer::new(&schema, Vec::new());
    let mut meta = vec![
        ("snapshot-id", snapshot_id.to_string()),
        ("sequence-number", sequence_number.to_string()),
        ("format-version", format_version.to_string()),
    ];
    if let Some(p) = parent {
        meta.push(("parent-snapshot-id", p.to_string()));
    }
    for (k, v) in meta {
        writer.add_user_metadata(k.to_owned(), v).map_err(avro)?;
    }
    for m in manifests {
        let mut fields = vec![
            ("manifest_path".into(), Value::String(m.path.clone())),
            ("manifest_length".into(), Value::Long(m.length)),
            ("partition_spec_id".into(), Value::Int(0)),
            ("content".into(), Value::Int(m.content as i32)),
            ("sequence_number".into(), Value::Long(m.sequence_number)),
            ("min_sequence_number".into(), Value::Long(m.min_sequence_number)),
            ("added_snapshot_id".into(), Value::Long(m.added_snapshot_id)),
            ("added_files_count".into(), Value::Int(m.added_files)),
            ("existing_files_count".into(), Value::Int(m.existing_files)),
            ("deleted_files_count".into(), Value::Int(m.deleted_files)),
            ("added_rows_count".into(), Value::Long(m.added_rows)),
            ("existing_rows_count".into(), Value::Long(m.existing_rows)),
            ("deleted_rows_count".into(), Value::Long(m.deleted_rows)),
            ("partitions".into(), null()),
            ("key_metadata".into(), null()),
        ];
        if format_version >= 3 {
            fields.push(("first_row_id".into(), opt_long(m.first_row_id)));
        }
        writer.append(Value::Record(fields)).map_err(avro)?;
    }
    writer.into_inner().map_err(avro)
}

/// The manifests a manifest list names.
pub fn read_manifest_list(path: &str, bytes: &[u8]) -> Result<Vec<ManifestFile>> {
    let corrupt = |reason: String| PublishError::Corrupt { what: path.to_owned(), reason };
    let reader = Reader::new(bytes).map_err(|e| corrupt(e.to_string()))?;
    let mut out = Vec::new();
    for value in reader {
        let value = value.map_err(|e| corrupt(e.to_string()))?;
        let f = Fields::of(&value).map_err(&corrupt)?;
        out.push(ManifestFile {
            path: f.string("manifest_path").map_err(&corrupt)?,
            length: f.long("manifest_length").map_err(&corrupt)?,
            content: content(f.int("content").map_err(&corrupt)?).map_err(&corrupt)?,
            sequence_number: f.long("sequence_number").map_err(&corrupt)?,
            min_sequence_number: f.long("min_sequence_number").map_err(&corrupt)?,
            added_snapshot_id: f.long("added_snapshot_id").map_err(&corrupt)?,
            added_files: f.int("added_files_count").map_err(&corrupt)?,
            existing_files: f.int("existing_files_count").map_err(&corrupt)?,
            deleted_files: f.int("deleted_files_count").map_err(&corrupt)?,
            added_rows: f.long("added_rows_count").map_err(&corrupt)?,
            existing_rows: f.long("existing_rows_count").map_err(&corrupt)?,
            deleted_rows: f.long("deleted_rows_count").map_err(&corrupt)?,
            first_row_id: f.opt_long("first_row_id").map_err(&corrupt)?,
        });
    }
    Ok(out)
}

/// The entries of manifest `m` (its `bytes`), sequence numbers (and in
/// format 3, data files' first row ids) inherited from it where an entry
/// has none.
pub fn read_manifest(m: &ManifestFile, bytes: &[u8]) -> Result<Vec<Entry>> {
    let corrupt = |reason: String| PublishError::Corrupt { what: m.path.clone(), reason };
    let reader = Reader::new(bytes).map_err(|e| corrupt(e.to_string()))?;
    let mut out = Vec::new();
    for value in reader {
        let value = value.map_err(|e| corrupt(e.to_string()))?;
        let e = Fields::of(&value).map_err(&corrupt)?;
        let status = match e.int("status").map_err(&corrupt)? {
            0 => Status::Existing,
            1 => Status::Added,
            2 => Status::Deleted,
            s => return Err(corrupt(format!("entry status {s}"))),
        };
        let data_file = e.get("data_file").map_err(&corrupt)?;
        let f = Fields::of(data_file).map_err(&corrupt)?;
        let format = match f.string("file_format").map_err(&corrupt)?.to_ascii_uppercase().as_str() {
            "PARQUET" => "PARQUET",
            "PUFFIN" => "PUFFIN",
            other => return Err(corrupt(format!("file format {other}"))),
        };
        out.push(Entry {
            status,
            snapshot_id: e.opt_long("snapshot_id").map_err(&corrupt)?.unwrap_or(m.added_snapshot_id),
            sequence_number: e.opt_long("sequence_number").map_err(&corrupt)?.unwrap_or(m.sequence_number),
            file_sequence_number: e.opt_long("file_sequence_number").map_err(&corrupt)?.unwrap_or(m.sequence_number),
            file: DataFile {
                content: content(f.int("content").map_err(&corrupt)?).map_err(&corrupt)?,
                path: f.string("file_path").map_err(&corrupt)?,
                format,
                record_count: f.long("record_count").map_err(&corrupt)?,
                size: f.long("file_size_in_bytes").map_err(&corrupt)?,
                referenced_data_file: f.opt_string("referenced_data_file").map_err(&corrupt)?,
                content_offset: f.opt_long("content_offset").map_err(&corrupt)?,
                content_size: f.opt_long("content_size_in_bytes").map_err(&corrupt)?,
                first_row_id: f.opt_long("first_row_id").map_err(&corrupt)?,
            },
        });
    }
    if let (Content::Data, Some(first)) = (m.content, m.first_row_id) {
        inherit_row_ids(first, &mut out);
    }
    Ok(out)
}

/// Format 3: each data file of a manifest written without a row id
/// inherits one from the manifest's `first_row_id`, after the rows of the
/// files before it (in manifest order) that did too.
pub fn inherit_row_ids(first_row_id: i64, entries: &mut [Entry]) {
    let mut next = first_row_id;
    for e in entries.iter_mut().filter(|e| e.file.first_row_id.is_none()) {
        e.file.first_row_id = Some(next);
        next += e.file.record_count;
    }
}

fn content(v: i32) -> std::result::Result<Content, String> {
    match v {
        0 => Ok(Content::Data),
        1 => Ok(Content::PositionDeletes),
        2 => Err("equality deletes (fovea writes none)".into()),
        c => Err(format!("content {c}")),
    }
}

fn avro(e: apache_avro::Error) -> PublishError {
    PublishError::Encode(e.to_string())
}

/// The fields of a record by name.
struct Fields<'v>(HashMap<&'v str, &'v Value>);

impl<'v> Fields<'v> {
    fn of(v: &'v Value) -> std::result::Result<Self, String> {
        match v {
            Value::Record(fields) => Ok(Fields(fields.iter().map(|(k, v)| (k.as_str(), v)).collect())),
            other => Err(format!("expected a record, found {other:?}")),
        }
    }

    fn get(&self, name: &str) -> std::result::Result<&'v Value, String> {
        let v = self.0.get(name).copied().ok_or_else(|| format!("no field {name}"))?;
        Ok(match v {
            Value::Union(_, inner) => inner,
            v => v,
        })
    }

    fn opt(&self, name: &str) -> std::result::Result<Option<&'v Value>, String> {
        match self.0.get(name).copied() {
            None => Ok(None),
            Some(_) => match self.get(name)? {
                Value::Null => Ok(None),
                v => Ok(Some(v)),
            },
        }
    }

    fn long(&self, name: &str) -> std::result::Result<i64, String> {
        self.opt_long(name)?.ok_or_else(|| format!("{name} is null"))
    }

    fn opt_long(&self, name: &str) -> std::result::Result<Option<i64>, String> {
        match self.opt(name)? {
            None => Ok(None),
            Some(Value::Long(v)) => Ok(Some(*v)),
            Some(Value::Int(v)) => Ok(Some(i64::from(*v))),
            Some(other) => Err(format!("{name}: expected a long, found {other:?}")),
        }
    }

    fn int(&self, name: &str) -> std::result::Result<i32, String> {
        match self.get(name)? {
            Value::Int(v) => Ok(*v),
            other => Err(format!("{name}: expected an int, found {other:?}")),
        }
    }

    fn string(&self, name: &str) -> std::result::Result<String, String> {
        self.opt_string(name)?.ok_or_else(|| format!("{name} is null"))
    }

    fn opt_string(&self, name: &str) -> std::result::Result<Option<String>, String> {
        match self.opt(name)? {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!("{name}: expected a string, found {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(status: Status, path: &str, deletes_of: Option<&str>) -> Entry {
        Entry {
            status,
            snapshot_id: 7,
            sequence_number: 3,
            file_sequence_number: 3,
            file: DataFile {
                content: if deletes_of.is_some() { Content::PositionDeletes } else { Content::Data },
                path: path.into(),
                format: "PARQUET",
                record_count: 10,
                size: 1234,
                referenced_data_file: deletes_of.map(str::to_owned),
                content_offset: None,
                content_size: None,
                first_row_id: None,
            },
        }
    }

    #[test]
    fn manifests_read_back_as_written_in_both_formats() {
        for version in [2, 3] {
            let entries = vec![
                entry(Status::Added, "file:///l/a.parquet", None),
                entry(Status::Existing, "file:///l/b.parquet", None),
            ];
            let header =
                ManifestHeader { schema_json: "{}", schema_id: 0, format_version: version, content: Content::Data };
            let bytes = write_manifest(&header, &entries).unwrap();
            let m = ManifestFile {
                path: "m.avro".into(),
                length: bytes.len() as i64,
                content: Content::Data,
                sequence_number: 3,
                min_sequence_number: 3,
                added_snapshot_id: 7,
                added_files: 1,
                existing_files: 1,
                deleted_files: 0,
                added_rows: 10,
                existing_rows: 10,
                deleted_rows: 0,
                first_row_id: (version >= 3).then_some(0),
            };
            // Format 3: files without a row id inherit one from the manifest.
            let mut inherited = entries.clone();
            if version >= 3 {
                inherited[0].file.first_row_id = Some(0);
                inherited[1].file.first_row_id = Some(10);
            }
            assert_eq!(read_manifest(&m, &bytes).unwrap(), inherited);
            let deletes = vec![entry(Status::Added, "file:///l/d.parquet", Some("file:///l/a.parquet"))];
            let header = ManifestHeader { content: Content::PositionDeletes, ..header };
            let delete_manifest = ManifestFile { content: Content::PositionDeletes, first_row_id: None, ..m.clone() };
            let read = read_manifest(&delete_manifest, &write_manifest(&header, &deletes).unwrap()).unwrap();
            assert_eq!(read, deletes);
            let list = write_manifest_list(version, 7, Some(6), 3, std::slice::from_ref(&m)).unwrap();
            assert_eq!(read_manifest_list("l.avro", &list).unwrap(), vec![m]);
        }
    }

    #[test]
    fn a_damaged_manifest_is_an_error_naming_it() {
        let m = ManifestFile {
            path: "s3://b/t/metadata/m.avro".into(),
            length: 3,
            content: Content::Data,
            sequence_number: 1,
            min_sequence_number: 1,
            added_snapshot_id: 1,
            added_files: 0,
            existing_files: 0,
            deleted_files: 0,
            added_rows: 0,
            existing_rows: 0,
            deleted_rows: 0,
            first_row_id: None,
        };
        let err = read_manifest(&m, b"not avro").unwrap_err().to_string();
        assert!(err.contains("s3://b/t/metadata/m.avro"), "{err}");
    }
}
