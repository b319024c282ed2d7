//! Tables, their schemas and the values rows are made of.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use crate::error::{Error, Result};
use crate::ids::TableId;

/// Name of the hidden column holding each version's creation timestamp.
pub const CREATE_TS_COLUMN: &str = "_fovea_create_ts";

/// One value of a row, as the change stream delivers it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// Boolean.
    Bool(bool),
    /// Any integer type (Int8…Int64, and Date32 / Timestamp raw values).
    Int(i64),
    /// Float32 / Float64.
    Float(f64),
    /// Decimal128 unscaled value, in the column's scale.
    Decimal(i128),
    /// UTF-8 text.
    Utf8(String),
    /// Bytes.
    Binary(Vec<u8>),
}

impl Value {
    /// True for [`Value::Null`].
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("NULL"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x}"),
            Value::Decimal(d) => write!(f, "{d}"),
            Value::Utf8(s) => write!(f, "{s:?}"),
            Value::Binary(b) => write!(
                f,
                "0x{}",
                b.iter().map(|x| format!("{x:02x}")).collect::<String>()
            ),
        }
    }
}

/// A row: one value per user column, in schema order.
pub type Row = Vec<Value>;

/// A table: qualified name, user columns and primary key.
#[derive(Debug)]
pub struct TableDef {
    /// Stable id.
    pub id: TableId,
    /// Qualified name, `schema.table`.
    pub name: String,
    /// User columns only (the hidden column is added in files).
    pub schema: SchemaRef,
    /// Indices of the primary-key columns, in key order.
    pub primary_key: Vec<usize>,
    /// Schema of stored files: user columns + `_fovea_create_ts`.
    pub file_schema: SchemaRef,
}

impl TableDef {
    /// Validates and builds a table definition.
    pub fn new(
        id: TableId,
        name: impl Into<String>,
        schema: SchemaRef,
        primary_key: Vec<usize>,
    ) -> Result<Arc<Self>> {
        let name = name.into();
        if primary_key.is_empty() {
            return Err(Error::Schema {
                table: name,
                column: String::new(),
                message:
                    "a table needs a primary key (replica identity) to replay updates and deletes"
                        .into(),
            });
        }
        for &k in &primary_key {
            if k >= schema.fields().len() {
                return Err(Error::Schema {
                    table: name,
                    column: format!("#{k}"),
                    message: "primary-key column index out of range".into(),
                });
            }
        }
        for f in schema.fields() {
            if f.name() == CREATE_TS_COLUMN {
                return Err(Error::Schema {
                    table: name,
                    column: f.name().clone(),
                    message: "this column name is reserved for fovea's hidden timestamp".into(),
                });
            }
            if !is_supported(f.data_type()) {
                return Err(Error::Schema {
                    table: name,
                    column: f.name().clone(),
                    message: format!("type {} is not supported", f.data_type()),
                });
            }
        }
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(CREATE_TS_COLUMN, DataType::Int64, false));
        let file_schema = Arc::new(Schema::new(fields));
        Ok(Arc::new(TableDef {
            id,
            name,
            schema,
            primary_key,
            file_schema,
        }))
    }

    /// The primary-key values of a full row.
    pub fn key_of(&self, row: &[Value]) -> Row {
        self.primary_key.iter().map(|&i| row[i].clone()).collect()
    }

    /// Checks arity and nullability of a full row.
    pub fn check_row(&self, row: &[Value]) -> Result<()> {
        if row.len() != self.schema.fields().len() {
            return Err(Error::Schema {
                table: self.name.clone(),
                column: String::new(),
                message: format!(
                    "row has {} values, the table has {} columns",
                    row.len(),
                    self.schema.fields().len()
                ),
            });
        }
        for (f, v) in self.schema.fields().iter().zip(row) {
            if v.is_null() && !f.is_nullable() {
                return Err(Error::Schema {
                    table: self.name.clone(),
                    column: f.name().clone(),
                    message: "NULL in a NOT NULL column".into(),
                });
            }
        }
        Ok(())
    }

    /// Checks that a key has one non-null value per key column.
    pub fn check_key(&self, key: &[Value]) -> Result<()> {
        if key.len() != self.primary_key.len() || key.iter().any(Value::is_null) {
            return Err(Error::Schema {
                table: self.name.clone(),
                column: self
                    .primary_key
                    .iter()
                    .map(|&i| self.schema.field(i).name().as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                message: format!(
                    "a key needs {} non-NULL values, got {}",
                    self.primary_key.len(),
                    render_key(key)
                ),
            });
        }
        Ok(())
    }
}

/// Renders a key for error messages: `(1, "a")`.
pub fn render_key(key: &[Value]) -> String {
    format!(
        "({})",
        key.iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Column types fovea stores.
pub fn is_supported(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Boolean
            | DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Float32
            | DataType::Float64
            | DataType::Decimal128(_, _)
            | DataType::Utf8
            | DataType::Binary
            | DataType::Date32
            | DataType::Timestamp(TimeUnit::Microsecond, _)
    )
}
