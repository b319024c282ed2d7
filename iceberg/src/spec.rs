//! The parts of the Iceberg table spec fovea writes: table metadata,
//! schemas with stable field ids, the default name mapping, snapshots.
//!
//! Field ids follow a table's columns by name across checkpoints: a column
//! keeps its id while it keeps its name and its type stays the same or
//! changes by one of Iceberg's promotions (int → long, float → double,
//! decimal(P, S) → decimal(P′, S) with P′ ≥ P); a new column, or one whose
//! type changed otherwise, gets the next unused id. fovea's files carry no
//! Parquet field ids yet, so every reader maps file columns to fields by
//! the table's `schema.name-mapping.default`.

use std::collections::{BTreeMap, HashSet};

use arrow::datatypes::DataType;
use fovea_core::schema::TableDef;
use serde::{Deserialize, Serialize};

use crate::{PublishError, Result};

/// Table property holding the default name mapping.
pub const NAME_MAPPING_PROPERTY: &str = "schema.name-mapping.default";

/// An Iceberg primitive type fovea's columns map to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcebergType {
    /// `boolean`.
    Boolean,
    /// `int` (32-bit; also fovea's 8- and 16-bit integers).
    Int,
    /// `long`.
    Long,
    /// `float`.
    Float,
    /// `double`.
    Double,
    /// `decimal(P, S)`.
    Decimal(u8, u8),
    /// `date`.
    Date,
    /// `timestamp` (microseconds, no zone).
    Timestamp,
    /// `timestamptz` (microseconds, UTC).
    Timestamptz,
    /// `string`.
    String,
    /// `binary`.
    Binary,
}

impl IcebergType {
    /// The Iceberg type of an Arrow column type fovea stores, or why there
    /// is none.
    pub fn of(data_type: &DataType) -> std::result::Result<Self, String> {
        use arrow::datatypes::TimeUnit;
        Ok(match data_type {
            DataType::Boolean => Self::Boolean,
            DataType::Int8 | DataType::Int16 | DataType::Int32 => Self::Int,
            DataType::Int64 => Self::Long,
            DataType::Float32 => Self::Float,
            DataType::Float64 => Self::Double,
            DataType::Decimal128(p, s) if (0..=38).contains(&(*s as i16)) && *p <= 38 => Self::Decimal(*p, *s as u8),
            DataType::Date32 => Self::Date,
            DataType::Timestamp(TimeUnit::Microsecond, None) => Self::Timestamp,
            DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => Self::Timestamptz,
            DataType::Utf8 | DataType::LargeUtf8 => Self::String,
            DataType::Binary | DataType::LargeBinary => Self::Binary,
            other => return Err(format!("type {other} has no Iceberg equivalent")),
        })
    }

    /// Parses the spec's text form.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "boolean" => Self::Boolean,
            "int" => Self::Int,
            "long" => Self::Long,
            "float" => Self::Float,
            "double" => Self::Double,
            "date" => Self::Date,
            "timestamp" => Self::Timestamp,
            "timestamptz" => Self::Timestamptz,
            "string" => Self::String,
            "binary" => Self::Binary,
            d => {
                let inner = d.strip_prefix("decimal(")?.strip_suffix(')')?;
                let (p, s) = inner.split_once(',')?;
                Self::Decimal(p.trim().parse().ok()?, s.trim().parse().ok()?)
            }
        })
    }

    /// Whether a field of this type may become `to` keeping its id (the
    /// same type, or an Iceberg type promotion).
    pub fn promotes_to(self, to: IcebergType) -> bool {
        match (self, to) {
            (a, b) if a == b => true,
            (Self::Int, Self::Long) | (Self::Float, Self::Double) => true,
            (Self::Decimal(p, s), Self::Decimal(p2, s2)) => s == s2 && p2 >= p,
            _ => false,
        }
    }

    /// Whether it may be part of a row identifier (not floating point).
    fn identifies(self) -> bool {
        !matches!(self, Self::Float | Self::Double)
    }
}

impl IcebergType {
    /// The column type a Hive-style catalog (AWS Glue) lists for it, as
    /// Iceberg's own Glue catalog writes it.
    pub fn hive_type(self) -> String {
        match self {
            Self::Boolean => "boolean".into(),
            Self::Int => "int".into(),
            Self::Long => "bigint".into(),
            Self::Float => "float".into(),
            Self::Double => "double".into(),
            Self::Decimal(p, s) => format!("decimal({p},{s})"),
            Self::Date => "date".into(),
            Self::Timestamp | Self::Timestamptz => "timestamp".into(),
            Self::String => "string".into(),
            Self::Binary => "binary".into(),
        }
    }
}

impl std::fmt::Display for IcebergType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Boolean => f.write_str("boolean"),
            Self::Int => f.write_str("int"),
            Self::Long => f.write_str("long"),
            Self::Float => f.write_str("float"),
            Self::Double => f.write_str("double"),
            Self::Decimal(p, s) => write!(f, "decimal({p}, {s})"),
            Self::Date => f.write_str("date"),
            Self::Timestamp => f.write_str("timestamp"),
            Self::Timestamptz => f.write_str("timestamptz"),
            Self::String => f.write_str("string"),
            Self::Binary => f.write_str("binary"),
        }
    }
}

/// A field of a schema.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Field {
    /// Field id.
    pub id: i32,
    /// Column name.
    pub name: String,
    /// No NULL allowed.
    pub required: bool,
    /// Type, in the spec's text form.
    #[serde(rename = "type")]
    pub field_type: String,
}

/// A table schema.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Schema {
    /// Always `struct`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Schema id.
    pub schema_id: i32,
    /// The primary key's fields.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identifier_field_ids: Vec<i32>,
    /// Fields in column order.
    pub fields: Vec<Field>,
}

impl Schema {
    /// The same columns as `other` (ids, names, types, nullability, key).
    fn same_as(&self, other: &Schema) -> bool {
        self.fields == other.fields && self.identifier_field_ids == other.identifier_field_ids
    }

    /// The schema as JSON text (manifests carry it in their header).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a schema serialises")
    }
}

/// Prefix of the columns fovea keeps for itself in stored files (the
/// version's create timestamp, the row id of a table without a key): not in
/// the Iceberg schema, but in the name mapping, so readers know them as
/// columns of no field of the table.
pub const HIDDEN_PREFIX: &str = "_fovea_";

/// A table's Iceberg schema and name mapping at one checkpoint.
#[derive(Debug)]
pub struct TableSchema {
    /// The schema (a new id when its columns changed).
    pub schema: Schema,
    /// Whether the table's metadata does not have it yet.
    pub is_new: bool,
    /// The default name mapping (JSON).
    pub name_mapping: String,
    /// The highest field id assigned.
    pub last_column_id: i32,
}

/// The schema of `table` at one checkpoint: its columns under fovea's field
/// ids (the ids its files carry since fovea writes them), and the name
/// mapping for the files written before, which carry none. `previous` is
/// the table's published metadata, if any: a column whose type changed in
/// a way that is no Iceberg promotion is refused (the values stored before
/// the change are in files whose column has the old type, which Iceberg
/// readers cannot read as the new one). fovea's hidden columns are left out
/// of the schema. `file_columns` are the columns the table's new data files
/// without field ids hold: any the mapping does not name yet (added and
/// dropped again since the last publication) is mapped to an id of no
/// field, so readers skip it.
///
/// The mapping names a column by its name only where the column came with
/// the table or was added before fovea recorded when columns were added
/// (`column_since` 0): a file without field ids holds such a column under
/// its name. A column added since is in no such file: its name maps to an
/// id of no field there, so what such a file holds under it (a column
/// dropped before, of the same name) reads as NULL.
pub fn schema_of(
    table: &TableDef,
    previous: Option<&TableMetadata>,
    file_columns: &std::collections::BTreeSet<String>,
) -> Result<TableSchema> {
    let current = previous.and_then(|m| m.schemas.iter().find(|s| s.schema_id == m.current_schema_id));
    // A table created again under the name of a dropped one follows its
    // last snapshot, which has no rows: no file of the old table is read
    // under the new one's types, so any type goes.
    let replaces_dropped = previous
        .and_then(TableMetadata::current_snapshot)
        .is_some_and(|s| s.summary.contains_key(crate::publish::DROPPED_PROPERTY));
    let mut fields = Vec::with_capacity(table.schema.fields().len());
    let mut key_valid = !table.primary_key.is_empty();
    // Names files without field ids hold at fovea's id (see above).
    let mut by_name: Vec<(i32, String)> = Vec::new();
    for (i, f) in table.schema.fields().iter().enumerate() {
        let id = table.column_id(i);
        if table.column_since(i) == fovea_core::ids::Ts::ZERO {
            by_name.push((id, f.name().clone()));
        }
        let is_key = table.primary_key.contains(&i);
        if f.name().starts_with(HIDDEN_PREFIX) {
            key_valid &= !is_key;
            continue;
        }
        let ty = IcebergType::of(f.data_type()).map_err(|message| PublishError::Schema {
            table: table.name.clone(),
            column: f.name().clone(),
            message,
        })?;
        // The same field published before (its id and name).
        if let Some(p) = current
            .filter(|_| !replaces_dropped)
            .and_then(|s| s.fields.iter().find(|p| p.id == id && &p.name == f.name()))
        {
            let was = IcebergType::parse(&p.field_type).ok_or_else(|| PublishError::Schema {
                table: table.name.clone(),
                column: p.name.clone(),
                message: format!("published type {} is not one fovea writes", p.field_type),
            })?;
            if !was.promotes_to(ty) {
                return Err(PublishError::Schema {
                    table: table.name.clone(),
                    column: f.name().clone(),
                    message: format!(
                        "its type changed from {was} to {ty} in place; Iceberg readers cannot read the values \
                         stored before as {ty}, so the table's Iceberg snapshot stays at the last checkpoint \
                         before the change"
                    ),
                });
            }
        }
        if is_key {
            key_valid &= !f.is_nullable() && ty.identifies();
        }
        fields.push(Field { id, name: f.name().clone(), required: !f.is_nullable(), field_type: ty.to_string() });
    }
    let key_ids = if key_valid {
        table
            .primary_key
            .iter()
            .map(|&k| fields.iter().find(|f| f.name == *table.schema.field(k).name()).map_or(0, |f| f.id))
            .collect()
    } else {
        Vec::new()
    };
    // Every other name files without field ids may hold: those mapped
    // before (columns dropped since, hidden columns, columns only files
    // held), the hidden columns, the columns new files hold, and the names
    // of columns added since (their files carry field ids): each at an id
    // of no field, the one it had where that is still no field's.
    let before: Vec<(i32, String)> = previous
        .and_then(|m| m.properties.get(NAME_MAPPING_PROPERTY))
        .map(|json| parse_name_mapping(json))
        .transpose()
        .map_err(|reason| PublishError::Corrupt {
            what: format!("{NAME_MAPPING_PROPERTY} of table {}", table.name),
            reason,
        })?
        .unwrap_or_default();
    let hidden = table.file_schema.fields().iter().map(|f| f.name().clone()).filter(|n| n.starts_with(HIDDEN_PREFIX));
    let others: Vec<String> = before
        .iter()
        .map(|(_, n)| n.clone())
        .chain(table.schema.fields().iter().map(|f| f.name().clone()))
        .chain(hidden)
        .chain(file_columns.iter().cloned())
        .collect();
    let field_ids: HashSet<i32> = (0..table.schema.fields().len()).map(|i| table.column_id(i)).collect();
    let mut last_id = previous.map_or(0, |m| m.last_column_id).max(table.column_identity().last_id);
    let mut mapped = by_name;
    for name in others {
        if mapped.iter().any(|(_, n)| *n == name) {
            continue;
        }
        let kept = before
            .iter()
            .find(|(id, n)| *n == name && !field_ids.contains(id) && !mapped.iter().any(|(m, _)| m == id))
            .map(|(id, _)| *id);
        let id = kept.unwrap_or_else(|| {
            last_id += 1;
            last_id
        });
        mapped.push((id, name));
    }
    last_id = last_id.max(mapped.iter().map(|(id, _)| *id).max().unwrap_or(0));
    mapped.sort();
    let schema_id = match previous {
        Some(m) => m.schemas.iter().map(|s| s.schema_id).max().unwrap_or(-1) + 1,
        None => 0,
    };
    let schema = Schema { kind: "struct".into(), schema_id, identifier_field_ids: key_ids, fields };
    let name_mapping = serde_json::Value::Array(
        mapped.iter().map(|(id, name)| serde_json::json!({"field-id": id, "names": [name]})).collect(),
    )
    .to_string();
    let (schema, is_new) = match current {
        Some(c) if c.same_as(&schema) => (c.clone(), false),
        _ => (schema, true),
    };
    Ok(TableSchema { schema, is_new, name_mapping, last_column_id: last_id })
}

/// The (field id, name) pairs of a name mapping.
fn parse_name_mapping(json: &str) -> std::result::Result<Vec<(i32, String)>, String> {
    #[derive(Deserialize)]
    struct MappedField {
        #[serde(rename = "field-id")]
        field_id: Option<i32>,
        #[serde(default)]
        names: Vec<String>,
    }
    let fields: Vec<MappedField> = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for f in fields {
        // Entries without an id only group nested names; fovea has none.
        if let Some(id) = f.field_id {
            out.extend(f.names.into_iter().map(|n| (id, n)));
        }
    }
    Ok(out)
}

/// A partition spec (fovea's tables are unpartitioned).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PartitionSpec {
    /// Spec id.
    pub spec_id: i32,
    /// Partition fields (none).
    pub fields: Vec<serde_json::Value>,
}

/// A sort order (none).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SortOrder {
    /// Order id.
    pub order_id: i32,
    /// Sort fields (none).
    pub fields: Vec<serde_json::Value>,
}

/// A snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Snapshot {
    /// Snapshot id: the checkpoint's timestamp (unique, increasing).
    pub snapshot_id: i64,
    /// The snapshot before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_snapshot_id: Option<i64>,
    /// Sequence number.
    pub sequence_number: i64,
    /// When it was published.
    pub timestamp_ms: i64,
    /// Its manifest list.
    pub manifest_list: String,
    /// `operation` and fovea's properties.
    pub summary: BTreeMap<String, String>,
    /// Schema of its data.
    pub schema_id: i32,
    /// Format 3: the first row id this snapshot assigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_row_id: Option<i64>,
    /// Format 3: how many row ids it assigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_rows: Option<i64>,
}

/// An entry of the snapshot log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SnapshotLogEntry {
    /// When it became current.
    pub timestamp_ms: i64,
    /// The snapshot.
    pub snapshot_id: i64,
}

/// An entry of the metadata log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MetadataLogEntry {
    /// When it was written.
    pub timestamp_ms: i64,
    /// The metadata file.
    pub metadata_file: String,
}

/// A named reference (`main`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SnapshotRef {
    /// The snapshot it points at.
    pub snapshot_id: i64,
    /// `branch`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// Table metadata (one `vN.metadata.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TableMetadata {
    /// 2 (position deletes) or 3 (deletion vectors).
    pub format_version: u8,
    /// The table's identity, kept across versions.
    pub table_uuid: String,
    /// The table's base location.
    pub location: String,
    /// The highest sequence number assigned.
    pub last_sequence_number: i64,
    /// When it was written.
    pub last_updated_ms: i64,
    /// The highest field id assigned.
    pub last_column_id: i32,
    /// Every schema the table had.
    pub schemas: Vec<Schema>,
    /// The current one.
    pub current_schema_id: i32,
    /// One unpartitioned spec.
    pub partition_specs: Vec<PartitionSpec>,
    /// Its id.
    pub default_spec_id: i32,
    /// The highest partition field id (999: none yet).
    pub last_partition_id: i32,
    /// Properties: the name mapping, fovea's markers.
    pub properties: BTreeMap<String, String>,
    /// The current snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_snapshot_id: Option<i64>,
    /// Snapshots kept.
    pub snapshots: Vec<Snapshot>,
    /// When each kept snapshot became current.
    pub snapshot_log: Vec<SnapshotLogEntry>,
    /// Earlier metadata files.
    pub metadata_log: Vec<MetadataLogEntry>,
    /// One unsorted order.
    pub sort_orders: Vec<SortOrder>,
    /// Its id.
    pub default_sort_order_id: i32,
    /// `main` → the current snapshot.
    #[serde(default)]
    pub refs: BTreeMap<String, SnapshotRef>,
    /// Format 3: the first row id of the next data file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_row_id: Option<i64>,
}

impl TableMetadata {
    /// The current schema.
    pub fn current_schema(&self) -> Option<&Schema> {
        self.schemas.iter().find(|s| s.schema_id == self.current_schema_id)
    }

    /// The current snapshot.
    pub fn current_snapshot(&self) -> Option<&Snapshot> {
        let id = self.current_snapshot_id?;
        self.snapshots.iter().find(|s| s.snapshot_id == id)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{Field as ArrowField, Schema as ArrowSchema};
    use fovea_core::ids::TableId;

    use super::*;

    fn table(cols: &[(&str, DataType, bool)], key: Vec<usize>) -> Arc<TableDef> {
        let schema =
            ArrowSchema::new(cols.iter().map(|(n, t, null)| ArrowField::new(*n, t.clone(), *null)).collect::<Vec<_>>());
        TableDef::new(TableId(0), "public.t", Arc::new(schema), key).unwrap()
    }

    fn mapping(json: &str) -> Vec<(i32, String)> {
        parse_name_mapping(json).unwrap()
    }

    fn metadata_with(published: &TableSchema) -> TableMetadata {
        let (schema, last) = (published.schema.clone(), published.last_column_id);
        TableMetadata {
            format_version: 2,
            table_uuid: "u".into(),
            location: "l".into(),
            last_sequence_number: 0,
            last_updated_ms: 0,
            last_column_id: last,
            current_schema_id: schema.schema_id,
            schemas: vec![schema],
            partition_specs: vec![],
            default_spec_id: 0,
            last_partition_id: 999,
            properties: BTreeMap::from([(NAME_MAPPING_PROPERTY.to_owned(), published.name_mapping.clone())]),
            current_snapshot_id: None,
            snapshots: vec![],
            snapshot_log: vec![],
            metadata_log: vec![],
            sort_orders: vec![],
            default_sort_order_id: 0,
            refs: BTreeMap::new(),
            next_row_id: None,
        }
    }

    /// `t` evolved to the columns `cols` at ts `ts`, as the engine evolves
    /// a table: a column of a name it has keeps its id, another gets the
    /// next.
    fn evolved(t: &TableDef, cols: &[(&str, DataType, bool)], ts: u64) -> Arc<TableDef> {
        let schema =
            ArrowSchema::new(cols.iter().map(|(n, t, null)| ArrowField::new(*n, t.clone(), *null)).collect::<Vec<_>>());
        let old: Vec<&str> = t.schema.fields().iter().map(|f| f.name().as_str()).collect();
        let new: Vec<&str> = cols.iter().map(|c| c.0).collect();
        let columns = t.column_identity().evolve(&old, &new, fovea_core::ids::Ts(ts));
        TableDef::with_columns(TableId(0), "public.t", Arc::new(schema), vec![0], columns).unwrap()
    }

    #[test]
    fn field_ids_are_foveas_through_promotions_additions_and_columns_added_again() {
        let t1 = table(&[("id", DataType::Int32, false), ("v", DataType::Float32, true)], vec![0]);
        let first = schema_of(&t1, None, &Default::default()).unwrap();
        let s1 = first.schema.clone();
        assert!(first.is_new);
        // The hidden create_ts column is mapped at an id of its own, not in the schema.
        assert_eq!((s1.fields[0].id, s1.fields[1].id, first.last_column_id), (1, 2, 3));
        assert_eq!(s1.identifier_field_ids, vec![1]);
        assert_eq!(
            mapping(&first.name_mapping),
            vec![(1, "id".to_owned()), (2, "v".to_owned()), (3, "_fovea_create_ts".to_owned())]
        );
        let m = metadata_with(&first);
        // Unchanged: the same schema, not a new one.
        let same = schema_of(&t1, Some(&m), &Default::default()).unwrap();
        assert!(!same.is_new);
        assert_eq!((same.schema, same.last_column_id), (s1, 3));
        // Promotions keep ids; a dropped column's id is not reused (its name
        // stays mapped: old files have it); an added one gets fovea's next
        // id (3: the hidden column's mapping moves off it), and its name
        // maps to no field (files without field ids predate it).
        let t2 = evolved(&t1, &[("id", DataType::Int64, false), ("w", DataType::Utf8, true)], 10);
        let second = schema_of(&t2, Some(&m), &Default::default()).unwrap();
        let s2 = &second.schema;
        assert!(second.is_new);
        assert_eq!(s2.schema_id, 1);
        assert_eq!((s2.fields[0].id, s2.fields[0].field_type.as_str()), (1, "long"));
        assert_eq!(s2.fields[1].id, 3);
        let mapped = mapping(&second.name_mapping);
        assert_eq!(mapped.iter().find(|(_, n)| n == "v").map(|m| m.0), Some(2));
        let no_field = |name: &str| {
            let id = mapped.iter().find(|(_, n)| n == name).map(|m| m.0).unwrap_or_else(|| panic!("{name} mapped"));
            assert!(s2.fields.iter().all(|f| f.id != id), "{name} at {id}: {mapped:?}");
            assert!(id <= second.last_column_id);
        };
        no_field("_fovea_create_ts");
        no_field("w");
        // v comes back: a new field, not 2; files without ids hold the
        // dropped v under its name, mapped to no field.
        let m2 = metadata_with(&second);
        let t3 = evolved(
            &t2,
            &[("id", DataType::Int64, false), ("w", DataType::Utf8, true), ("v", DataType::Float32, true)],
            20,
        );
        let third = schema_of(&t3, Some(&m2), &Default::default()).unwrap();
        assert_eq!(
            third.schema.fields.iter().map(|f| (f.id, f.name.as_str())).collect::<Vec<_>>(),
            [(1, "id"), (3, "w"), (4, "v")]
        );
        let mapped = mapping(&third.name_mapping);
        let v = mapped.iter().find(|(_, n)| n == "v").unwrap().0;
        assert!(third.schema.fields.iter().all(|f| f.id != v), "{mapped:?}");
        let ids: HashSet<i32> = mapped.iter().map(|m| m.0).collect();
        assert_eq!(ids.len(), mapped.len(), "one name per id: {mapped:?}");
    }

    #[test]
    fn a_type_change_that_is_no_promotion_is_refused_naming_the_column() {
        let t1 = table(&[("id", DataType::Int32, false), ("v", DataType::Int32, true)], vec![0]);
        let m = metadata_with(&schema_of(&t1, None, &Default::default()).unwrap());
        let t2 = table(&[("id", DataType::Int32, false), ("v", DataType::Utf8, true)], vec![0]);
        let err = schema_of(&t2, Some(&m), &Default::default()).unwrap_err().to_string();
        assert!(err.contains("public.t") && err.contains("column v") && err.contains("int to string"), "{err}");
    }

    #[test]
    fn a_table_created_again_after_a_drop_takes_any_types() {
        let t1 = table(&[("id", DataType::Int32, false), ("v", DataType::Int32, true)], vec![0]);
        let mut m = metadata_with(&schema_of(&t1, None, &Default::default()).unwrap());
        m.snapshots.push(Snapshot {
            snapshot_id: 7,
            parent_snapshot_id: None,
            sequence_number: 1,
            timestamp_ms: 0,
            manifest_list: "l".into(),
            summary: BTreeMap::from([(crate::publish::DROPPED_PROPERTY.to_owned(), "true".to_owned())]),
            schema_id: 0,
            first_row_id: None,
            added_rows: None,
        });
        m.current_snapshot_id = Some(7);
        let t2 = table(&[("id", DataType::Int32, false), ("v", DataType::Utf8, true)], vec![0]);
        let s = schema_of(&t2, Some(&m), &Default::default()).unwrap();
        assert!(s.is_new);
        assert_eq!(s.schema.fields[1].field_type, "string");
    }

    #[test]
    fn columns_only_files_hold_are_mapped_to_ids_of_no_field() {
        let t = table(&[("id", DataType::Int64, false), ("v", DataType::Utf8, true)], vec![0]);
        let files: std::collections::BTreeSet<String> =
            ["id", "v", "gone", "_fovea_create_ts"].map(String::from).into();
        let s = schema_of(&t, None, &files).unwrap();
        let m = mapping(&s.name_mapping);
        let gone = m.iter().find(|(_, n)| n == "gone").expect("mapped").0;
        assert!(s.schema.fields.iter().all(|f| f.id != gone && f.name != "gone"), "{:?}", s.schema);
        assert_eq!(s.last_column_id, gone.max(s.last_column_id));
        // Published again: the same id, never another field's.
        let again = schema_of(&t, Some(&metadata_with(&s)), &Default::default()).unwrap();
        assert_eq!(mapping(&again.name_mapping), m);
    }

    #[test]
    fn float_or_nullable_keys_are_no_identifier() {
        let t = table(&[("k", DataType::Float64, false)], vec![0]);
        assert!(schema_of(&t, None, &Default::default()).unwrap().schema.identifier_field_ids.is_empty());
        let t = table(&[("k", DataType::Int32, true)], vec![0]);
        assert!(schema_of(&t, None, &Default::default()).unwrap().schema.identifier_field_ids.is_empty());
        // A table keyed by fovea's hidden row id: the id is no column of it.
        let t = table(&[("_fovea_rowid", DataType::Int64, false), ("v", DataType::Utf8, true)], vec![0]);
        let s = schema_of(&t, None, &Default::default()).unwrap();
        assert!(s.schema.identifier_field_ids.is_empty());
        assert_eq!(s.schema.fields.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), vec!["v"]);
        assert!(mapping(&s.name_mapping).iter().any(|(_, n)| n == "_fovea_rowid"));
    }

    #[test]
    fn types_round_trip_through_their_text() {
        for t in [
            IcebergType::Boolean,
            IcebergType::Int,
            IcebergType::Long,
            IcebergType::Float,
            IcebergType::Double,
            IcebergType::Decimal(12, 2),
            IcebergType::Date,
            IcebergType::Timestamp,
            IcebergType::Timestamptz,
            IcebergType::String,
            IcebergType::Binary,
        ] {
            assert_eq!(IcebergType::parse(&t.to_string()), Some(t));
        }
        assert_eq!(IcebergType::parse("decimal(9,3)"), Some(IcebergType::Decimal(9, 3)));
        assert!(IcebergType::Decimal(9, 3).promotes_to(IcebergType::Decimal(12, 3)));
        assert!(!IcebergType::Decimal(9, 3).promotes_to(IcebergType::Decimal(12, 4)));
    }
}
