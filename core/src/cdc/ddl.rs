//! Table definitions from SQL `CREATE TABLE` statements: exact column types
//! and primary keys for inputs that carry none (schema-less Debezium, DMS).
//!
//! ```
//! use fovea_core::cdc::ddl::parse_ddl;
//! let t = parse_ddl("CREATE TABLE public.t (id bigint NOT NULL, v numeric(12,2), PRIMARY KEY (id));").unwrap();
//! assert_eq!(t[0].name, "public.t");
//! assert_eq!(t[0].primary_key, vec!["id".to_string()]);
//! ```

use arrow::datatypes::{DataType, TimeUnit};

use super::DeclaredColumn;

/// One table from a DDL file.
#[derive(Clone, Debug, PartialEq)]
pub struct TableDdl {
    /// `schema.table` (`public.` when unqualified).
    pub name: String,
    /// Columns in order.
    pub columns: Vec<DeclaredColumn>,
    /// Primary-key column names.
    pub primary_key: Vec<String>,
}

/// Arrow type of a PostgreSQL type name.
pub fn sql_type(t: &str) -> Option<DataType> {
    let t = t.trim().to_ascii_lowercase();
    let base = t.split('(').next().unwrap_or("").trim();
    let args: Vec<i64> = t
        .split_once('(')
        .and_then(|(_, a)| a.split_once(')'))
        .map(|(a, _)| a.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_default();
    Some(match base {
        "smallint" | "int2" | "smallserial" => DataType::Int16,
        "integer" | "int" | "int4" | "serial" => DataType::Int32,
        "bigint" | "int8" | "bigserial" | "oid" => DataType::Int64,
        "real" | "float4" => DataType::Float32,
        "double precision" | "float8" | "float" => DataType::Float64,
        "numeric" | "decimal" => {
            let p = args.first().copied().unwrap_or(38).clamp(1, 38) as u8;
            let s = args.get(1).copied().unwrap_or(if args.is_empty() { 10 } else { 0 }).clamp(0, 38) as i8;
            DataType::Decimal128(p.max(s as u8), s)
        }
        "boolean" | "bool" => DataType::Boolean,
        "date" => DataType::Date32,
        "timestamp" | "timestamp without time zone" => DataType::Timestamp(TimeUnit::Microsecond, None),
        "timestamptz" | "timestamp with time zone" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        "bytea" => DataType::Binary,
        "text"
        | "varchar"
        | "character varying"
        | "char"
        | "character"
        | "bpchar"
        | "uuid"
        | "json"
        | "jsonb"
        | "time"
        | "time without time zone"
        | "interval" => DataType::Utf8,
        _ => return None,
    })
}

/// Parses every `CREATE TABLE` statement of `sql`.
pub fn parse_ddl(sql: &str) -> Result<Vec<TableDdl>, String> {
    let mut out = Vec::new();
    let lower = sql.to_ascii_lowercase();
    let mut rest = 0;
    while let Some(i) = lower[rest..].find("create table") {
        let start = rest + i + "create table".len();
        let open = sql[start..].find('(').ok_or("CREATE TABLE without a column list")? + start;
        let mut name = sql[start..open]
            .trim()
            .trim_start_matches("IF NOT EXISTS")
            .trim_start_matches("if not exists")
            .trim()
            .replace('"', "");
        if !name.contains('.') {
            name = format!("public.{name}");
        }
        let mut depth = 0;
        let mut close = None;
        for (j, c) in sql[open..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(open + j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let close = close.ok_or_else(|| format!("table {name}: unbalanced parentheses"))?;
        let body = &sql[open + 1..close];
        let mut columns = Vec::new();
        let mut primary_key = Vec::new();
        for item in split_top_level(body) {
            let item = item.trim();
            let li = item.to_ascii_lowercase();
            if li.starts_with("primary key") {
                let cols = item.split_once('(').and_then(|(_, c)| c.split_once(')')).map(|(c, _)| c).unwrap_or("");
                primary_key = cols.split(',').map(|c| c.trim().replace('"', "")).filter(|c| !c.is_empty()).collect();
                continue;
            }
            if li.starts_with("constraint")
                || li.starts_with("unique")
                || li.starts_with("foreign")
                || li.starts_with("check")
                || item.is_empty()
            {
                continue;
            }
            let (col, ty) = item
                .split_once(char::is_whitespace)
                .ok_or_else(|| format!("table {name}: column {item:?} has no type"))?;
            let col = col.replace('"', "");
            let lt = ty.to_ascii_lowercase();
            let cut = [
                "not null",
                " null",
                "primary key",
                "default",
                "references",
                "unique",
                "check",
                "generated",
                "collate",
            ]
            .iter()
            .filter_map(|k| lt.find(k))
            .min()
            .unwrap_or(lt.len());
            let data_type = sql_type(&ty[..cut])
                .ok_or_else(|| format!("table {name}, column {col}: unsupported type {:?}", ty[..cut].trim()))?;
            if lt.contains("primary key") {
                primary_key = vec![col.clone()];
            }
            columns.push(DeclaredColumn {
                name: col,
                data_type,
                nullable: !lt.contains("not null") && !lt.contains("primary key"),
            });
        }
        for k in &primary_key {
            if let Some(c) = columns.iter_mut().find(|c| &c.name == k) {
                c.nullable = false;
            }
        }
        out.push(TableDdl { name, columns, primary_key });
        rest = close;
    }
    Ok(out)
}

fn split_top_level(body: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in body.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&body[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tables_types_and_keys() {
        let t = parse_ddl(
            "create table tpcc.customer (c_w_id integer not null, c_d_id smallint not null, c_balance numeric(12,2) not null,
             c_since timestamp with time zone, c_data text, primary key (c_w_id, c_d_id));
             CREATE TABLE hist (hid bigint PRIMARY KEY, mtime timestamp without time zone, filler character(22));",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].primary_key, ["c_w_id", "c_d_id"]);
        assert_eq!(t[0].columns[2].data_type, DataType::Decimal128(12, 2));
        assert_eq!(t[0].columns[3].data_type, DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())));
        assert_eq!(t[1].name, "public.hist");
        assert_eq!(t[1].primary_key, ["hid"]);
        assert!(!t[1].columns[0].nullable);
        assert!(parse_ddl("create table x (a geometry)").is_err());
    }
}
