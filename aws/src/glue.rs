//! Published Iceberg tables registered in the AWS Glue Data Catalog
//! (`--iceberg-catalog glue://DATABASE`), the way Athena, EMR and Redshift
//! Spectrum find Iceberg tables: one Glue table per fovea table, of type
//! `ICEBERG`, whose `metadata_location` parameter names the current
//! metadata file and moves with every publication.
//!
//! A fovea table `schema.table` is the Glue table `schema_table`
//! (lowercase, characters other than letters, digits and `_` as `_`: the
//! names Athena accepts); two fovea tables with one Glue name are refused,
//! naming both. Updates are conditional on the Glue table's version
//! (`VersionId`) and skip Glue's version archive (one call per table and
//! publication would fill it); a table whose metadata location is already
//! newer (a newer replayer registered it) is left alone. A table dropped in
//! the source is deleted from the database (its Iceberg table stays, its
//! last snapshot empty).
//!
//! The five operations (`GetDatabase`, `GetTable`, `CreateTable`,
//! `UpdateTable`, `DeleteTable`) are AWS JSON 1.1 calls signed by
//! [`crate::signed_http`], retried there as the SDK would.

use std::collections::HashMap;
use std::sync::Mutex;

use fovea_core::lake::block_on_io;
use fovea_iceberg::spec::{IcebergType, TableMetadata};
use fovea_iceberg::{CatalogView, PublishError, TableRegistry, ViewTable};
use serde_json::{Value, json};

use crate::config::Deadlines;
use crate::signed_http::{GLUE, ServiceClient};

/// The JSON 1.1 target prefix of Glue's operations.
const TARGET: &str = "AWSGlue";

/// Glue's parameter naming the current metadata file.
const METADATA_LOCATION: &str = "metadata_location";
/// The one before (as Iceberg's Glue catalog keeps it).
const PREVIOUS_METADATA_LOCATION: &str = "previous_metadata_location";

/// The Glue database a lake's Iceberg tables are registered in.
#[derive(Debug)]
pub struct GlueRegistry {
    client: ServiceClient,
    database: String,
    /// Metadata location each Glue table was last pointed at by this
    /// process (no call while it has not moved; empty: deleted).
    registered: Mutex<HashMap<String, String>>,
}

impl GlueRegistry {
    /// The registry `glue://DATABASE` names, checked: the database must
    /// exist (the template creates it; a mistyped name is an error naming
    /// it, not a new database).
    pub fn open(url: &str) -> fovea_core::Result<Self> {
        let database = parse_url(url)?;
        let client = ServiceClient::new(GLUE, Deadlines::from_env()?)?;
        let got = block_on_io({
            let client = client.clone();
            let input = json!({ "Name": database });
            async move { client.call_json(TARGET, "GetDatabase", &input).await }
        })?;
        match got {
            Ok(_) => Ok(GlueRegistry { client, database, registered: Mutex::new(HashMap::new()) }),
            Err(e) if e.code() == "EntityNotFoundException" => Err(error(
                url,
                format!(
                    "the Glue database {database} does not exist (the template creates it; or `aws glue \
                     create-database --database-input Name={database}`)"
                ),
            )),
            Err(e) => Err(error(url, format!("GetDatabase {database} at {}: {e}", client.endpoint()))),
        }
    }

    fn url(&self) -> String {
        format!("glue://{}", self.database)
    }
}

/// Points the Glue table `name` of `database` at `location` (the metadata
/// file of `metadata`), creating it when absent.
async fn register_table(
    client: &ServiceClient,
    database: &str,
    name: &str,
    location: &str,
    metadata: &TableMetadata,
) -> Result<(), String> {
    for _attempt in 0..3 {
        let got = client.call_json(TARGET, "GetTable", &json!({ "DatabaseName": database, "Name": name })).await;
        let (current, version_id) = match got {
            Ok(out) => {
                let table = out.get("Table").ok_or("GetTable answered no table")?;
                let current = table
                    .get("Parameters")
                    .and_then(|p| p.get(METADATA_LOCATION))
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                (Some(current), table.get("VersionId").and_then(Value::as_str).map(str::to_owned))
            }
            Err(e) if e.code() == "EntityNotFoundException" => (None, None),
            Err(e) => return Err(format!("GetTable {name}: {e}")),
        };
        let input = table_input(name, location, metadata, current.clone().flatten())?;
        match current {
            None => {
                let create = json!({ "DatabaseName": database, "TableInput": input });
                match client.call_json(TARGET, "CreateTable", &create).await {
                    Ok(_) => return Ok(()),
                    // Created meanwhile: update it.
                    Err(e) if e.code() == "AlreadyExistsException" => continue,
                    Err(e) => return Err(format!("CreateTable {name}: {e}")),
                }
            }
            Some(current) => {
                if let Some(current) = &current {
                    if current == location {
                        return Ok(());
                    }
                    if newer_than(current, location) {
                        tracing::debug!(table = name, current, "Glue names newer metadata: left alone");
                        return Ok(());
                    }
                }
                let mut update = json!({ "DatabaseName": database, "TableInput": input, "SkipArchive": true });
                if let Some(v) = version_id {
                    update["VersionId"] = Value::String(v);
                }
                match client.call_json(TARGET, "UpdateTable", &update).await {
                    Ok(_) => return Ok(()),
                    // Another writer moved it meanwhile: look again.
                    Err(e) if e.code() == "ConcurrentModificationException" => continue,
                    Err(e) => return Err(format!("UpdateTable {name}: {e}")),
                }
            }
        }
    }
    Err(format!("table {name}: changed by another writer at each of 3 attempts"))
}

impl TableRegistry for GlueRegistry {
    fn register(&self, view: &CatalogView) -> fovea_iceberg::Result<()> {
        let mut by_glue_name: HashMap<String, &str> = HashMap::new();
        let mut todo = Vec::new();
        let mut errors = Vec::new();
        for (fovea_name, table) in &view.tables {
            let ViewTable::Published { metadata_location, metadata } = table else { continue };
            let name = glue_table_name(fovea_name);
            if let Some(other) = by_glue_name.insert(name.clone(), fovea_name) {
                errors.push(format!("tables {other} and {fovea_name} would both be the Glue table {name}"));
                continue;
            }
            if self.registered.lock().expect("not poisoned").get(&name) == Some(metadata_location) {
                continue;
            }
            let metadata: TableMetadata = serde_json::from_str(metadata)
                .map_err(|e| PublishError::Corrupt { what: metadata_location.clone(), reason: e.to_string() })?;
            todo.push((name, metadata_location.clone(), metadata));
        }
        // Tables dropped in the source leave the catalog (once: the
        // process remembers).
        let dropped: Vec<String> = view
            .dropped
            .iter()
            .map(|t| glue_table_name(t))
            .filter(|name| !by_glue_name.contains_key(name))
            .filter(|name| self.registered.lock().expect("not poisoned").get(name).map(String::as_str) != Some(""))
            .collect();
        let (client, database) = (self.client.clone(), self.database.clone());
        let (done, failed) = block_on_io(async move {
            let (mut done, mut failed) = (Vec::new(), Vec::new());
            for (name, location, metadata) in todo {
                match register_table(&client, &database, &name, &location, &metadata).await {
                    Ok(()) => done.push((name, location)),
                    Err(e) => failed.push(e),
                }
            }
            for name in dropped {
                let input = json!({ "DatabaseName": database, "Name": name });
                match client.call_json(TARGET, "DeleteTable", &input).await {
                    Ok(_) => done.push((name, String::new())),
                    Err(e) if e.code() == "EntityNotFoundException" => done.push((name, String::new())),
                    Err(e) => failed.push(format!("DeleteTable {name}: {e}")),
                }
            }
            (done, failed)
        })?;
        errors.extend(failed);
        self.registered.lock().expect("not poisoned").extend(done);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(PublishError::Register { catalog: self.url(), message: errors.join("; ") })
        }
    }
}

/// The database `glue://DATABASE` names.
fn parse_url(url: &str) -> fovea_core::Result<String> {
    let database = url.strip_prefix("glue://").ok_or_else(|| error(url, "expected glue://DATABASE".into()))?;
    let valid = !database.is_empty()
        && database.len() <= 255
        && database.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        return Err(error(
            url,
            format!("{database:?} is no Glue database name Athena reads (1–255 lowercase letters, digits and '_')"),
        ));
    }
    Ok(database.to_owned())
}

fn error(url: &str, message: String) -> fovea_core::Error {
    fovea_core::Error::Backend { backend: "Glue", operation: "open".into(), key: url.into(), message }
}

/// The Glue table of fovea table `schema.table`: `schema_table`,
/// lowercase, other characters than letters, digits and `_` as `_`.
pub fn glue_table_name(fovea_name: &str) -> String {
    fovea_name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect()
}

/// Whether metadata file `a` is a later version than `b` of one table
/// (`…/metadata/vN.metadata.json`).
fn newer_than(a: &str, b: &str) -> bool {
    fn split(p: &str) -> Option<(&str, u64)> {
        let (dir, file) = p.rsplit_once('/')?;
        let n = file.strip_prefix('v')?.strip_suffix(".metadata.json")?.parse().ok()?;
        Some((dir, n))
    }
    matches!((split(a), split(b)), (Some((da, na)), Some((db, nb))) if da == db && na > nb)
}

/// The Glue table input (`TableInput`) of an Iceberg table: its location,
/// its columns in Hive types (for consoles; engines read the schema from
/// the metadata), and the metadata pointer.
fn table_input(
    name: &str,
    location: &str,
    metadata: &TableMetadata,
    previous: Option<String>,
) -> Result<Value, String> {
    let schema = metadata.current_schema().ok_or("the metadata has no current schema")?;
    let mut columns = Vec::with_capacity(schema.fields.len());
    for f in &schema.fields {
        let t = IcebergType::parse(&f.field_type)
            .ok_or_else(|| format!("column {} has type {}, which fovea does not publish", f.name, f.field_type))?;
        columns.push(json!({ "Name": f.name, "Type": t.hive_type() }));
    }
    let mut parameters = serde_json::Map::new();
    parameters.insert("table_type".into(), "ICEBERG".into());
    parameters.insert(METADATA_LOCATION.into(), location.into());
    if let Some(previous) = previous {
        parameters.insert(PREVIOUS_METADATA_LOCATION.into(), previous.into());
    }
    Ok(json!({
        "Name": name,
        "TableType": "EXTERNAL_TABLE",
        "Parameters": parameters,
        "StorageDescriptor": { "Location": metadata.location, "Columns": columns },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_athenas_rules() {
        assert_eq!(glue_table_name("public.Orders"), "public_orders");
        assert_eq!(glue_table_name("tpcc.order-line"), "tpcc_order_line");
        assert_eq!(parse_url("glue://fovea_lake").unwrap(), "fovea_lake");
        for bad in ["glue://", "glue://Lake", "glue://a-b", "hive://x", "fovea"] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_a_later_version_of_the_same_table_is_newer() {
        let v = |n: u32| format!("s3://b/l/iceberg/public/t/metadata/v{n}.metadata.json");
        assert!(newer_than(&v(10), &v(9)));
        assert!(!newer_than(&v(9), &v(10)));
        assert!(!newer_than(&v(9), &v(9)));
        assert!(!newer_than("s3://b/other/metadata/v10.metadata.json", &v(9)));
    }
}
