//! Table definitions from SQL `CREATE TABLE` statements: exact column types
//! and primary keys for inputs that carry none (schema-less Debezium, DMS).
//!
//! ```
//! use fovea_cdc::ddl::parse_ddl;
//! let t = parse_ddl("CREATE TABLE public.t (id bigint NOT NULL, v numeric(12,2), PRIMARY KEY (id));").unwrap();
//! assert_eq!(t[0].name, "public.t");
//! assert_eq!(t[0].primary_key, vec!["id".to_string()]);
//! ```

use arrow::datatypes::{DataType, TimeUnit};
use sqlparser::ast::{
    AlterTableOperation, ColumnOption, CreateTable, Expr, Ident, ObjectName, PrimaryKeyConstraint, Statement,
    TableConstraint,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};

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

/// Arrow type of a PostgreSQL type name (any case; type arguments in
/// parentheses wherever they stand: `numeric(12,2)`, `timestamp(3) with
/// time zone`).
pub fn sql_type(t: &str) -> Option<DataType> {
    let t = t.trim().to_ascii_lowercase();
    let args: Vec<i64> = t
        .split_once('(')
        .and_then(|(_, a)| a.split_once(')'))
        .map(|(a, _)| a.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_default();
    // The name without its arguments, words separated by one space.
    let mut bare = String::with_capacity(t.len());
    let mut depth = 0;
    for c in t.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            c if depth == 0 => bare.push(c),
            _ => {}
        }
    }
    let base = bare.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(match base.as_str() {
        "smallint" | "int2" | "smallserial" => DataType::Int16,
        "integer" | "int" | "int4" | "serial" => DataType::Int32,
        "bigint" | "int8" | "bigserial" | "oid" => DataType::Int64,
        "real" | "float4" => DataType::Float32,
        "double precision" | "float8" | "float" => DataType::Float64,
        // Without a precision a numeric holds any number of digits at any
        // scale of its own (and NaN, ±Infinity); with more than 38 digits it
        // does not fit a Decimal128. Either is kept as PostgreSQL's text of
        // each value, exactly, as Debezium's VariableScaleDecimal is.
        "numeric" | "decimal" if args.first().is_none_or(|&p| p > 38) => DataType::Utf8,
        "numeric" | "decimal" => {
            let p = args[0].clamp(1, 38) as u8;
            let s = args.get(1).copied().unwrap_or(0).clamp(0, 38) as i8;
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

/// The deepest parenthesis nesting [`parse_ddl`] hands to the parser
/// (`CHECK` constraints as pg_dump writes them nest 5 or 6 deep; 24 levels
/// of the fuzz target's worst nesting parse in about 3 ms).
pub const MAX_NESTING: usize = 24;

/// Parses the tables of a SQL schema file: every `CREATE TABLE`, with the
/// primary keys declared in it or added later by `ALTER TABLE … ADD
/// [CONSTRAINT …] PRIMARY KEY (…)` (as `pg_dump --schema-only` writes
/// them). Parsed with `sqlparser` (PostgreSQL dialect) statement by
/// statement: psql meta-commands (`\connect`, `\restrict`) and `COPY …
/// FROM stdin` data are skipped, as are statements about anything else
/// (sequences, functions, owners …) even where the parser does not know
/// them (those are not handed to the parser at all); a `CREATE TABLE` it
/// cannot read is an error naming its line. So is a `CREATE` or `ALTER
/// TABLE` nesting parentheses deeper than [`MAX_NESTING`]: sqlparser's
/// backtracking takes time exponential in the depth of some nestings
/// (unclosed function calls: 40 levels took 4 s, found by the `ddl` fuzz
/// target), and no table definition needs that many.
pub fn parse_ddl(sql: &str) -> Result<Vec<TableDdl>, String> {
    let dialect = PostgreSqlDialect {};
    let sql = without_psql_input(sql);
    let tokens = Tokenizer::new(&dialect, &sql).tokenize_with_location().map_err(|e| e.to_string())?;
    let mut tables: Vec<TableDdl> = Vec::new();
    let mut added_keys: Vec<(String, Vec<String>, u64)> = Vec::new();
    for statement in tokens.split(|t| t.token == Token::SemiColon) {
        let mut words = statement.iter().filter(|t| !matches!(t.token, Token::Whitespace(_)));
        let Some(first) = words.next() else { continue };
        let line = first.span.start.line;
        // CREATE [GLOBAL | LOCAL] [TEMP | TEMPORARY | UNLOGGED] TABLE …
        let keyword = |t: &TokenWithSpan| match &t.token {
            Token::Word(w) => Some(w.keyword),
            _ => None,
        };
        let modifiers = [Keyword::GLOBAL, Keyword::LOCAL, Keyword::TEMP, Keyword::TEMPORARY, Keyword::UNLOGGED];
        let creates_table = keyword(first) == Some(Keyword::CREATE)
            && words.find_map(|t| keyword(t).filter(|k| !modifiers.contains(k))) == Some(Keyword::TABLE);
        let alters_table = keyword(first) == Some(Keyword::ALTER)
            && statement.iter().filter(|t| !matches!(t.token, Token::Whitespace(_))).nth(1).and_then(keyword)
                == Some(Keyword::TABLE);
        if !creates_table && !alters_table {
            // Not about a table: whatever it is, it defines nothing fovea reads.
            continue;
        }
        let mut depth = 0usize;
        for t in statement {
            match t.token {
                Token::LParen => {
                    depth += 1;
                    if depth > MAX_NESTING {
                        return Err(format!(
                            "line {}: parentheses nested deeper than {MAX_NESTING} (at line {}, column {}): \
                             fovea reads no table definition that deep",
                            line, t.span.start.line, t.span.start.column
                        ));
                    }
                }
                Token::RParen => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        // `CREATE UNLOGGED TABLE` (which sqlparser does not know) declares
        // its columns as any table does.
        let mut statement = statement.to_vec();
        if creates_table
            && let Some(i) =
                statement.iter().position(|t| matches!(&t.token, Token::Word(w) if w.keyword == Keyword::UNLOGGED))
        {
            statement.remove(i);
        }
        let parsed = Parser::new(&dialect).with_tokens_with_locations(statement).parse_statement();
        match parsed {
            Ok(Statement::CreateTable(t)) => tables.push(table_of(&t).map_err(|e| format!("line {line}: {e}"))?),
            Ok(Statement::AlterTable(a)) => {
                for op in &a.operations {
                    if let AlterTableOperation::AddConstraint { constraint: TableConstraint::PrimaryKey(pk), .. } = op {
                        let columns = key_columns(pk).map_err(|e| format!("line {line}: {e}"))?;
                        added_keys.push((table_name(&a.name)?, columns, line));
                    }
                }
            }
            Ok(_) => {}
            Err(e) if creates_table => return Err(format!("line {line}: {e}")),
            // An ALTER TABLE the parser does not know (ALTER TABLE … OWNER
            // TO, ATTACH PARTITION …) adds no primary key.
            Err(_) => {}
        }
    }
    for (name, key, line) in added_keys {
        // A key for a table the file does not create names nothing here.
        if let Some(t) = tables.iter_mut().find(|t| t.name == name) {
            for k in &key {
                let column = t.columns.iter_mut().find(|c| &c.name == k);
                column.ok_or_else(|| format!("line {line}: table {name} has no key column {k}"))?.nullable = false;
            }
            t.primary_key = key;
        }
    }
    Ok(tables)
}

/// `sql` without psql meta-command lines and `COPY … FROM stdin` data
/// (which are not SQL), lines kept (blank) so positions stay right.
fn without_psql_input(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut in_copy_data = false;
    for line in sql.lines() {
        let trimmed = line.trim_start();
        let skip = in_copy_data || trimmed.starts_with('\\');
        if in_copy_data {
            in_copy_data = trimmed != "\\.";
        } else if trimmed.to_ascii_lowercase().starts_with("copy ")
            && trimmed.trim_end().to_ascii_lowercase().ends_with("from stdin;")
        {
            in_copy_data = true;
        }
        if !skip {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// An identifier as written, without its quotes. (Not folded to lower case
/// as PostgreSQL folds unquoted names: the file must name tables and columns
/// as the change records do, and records of other sources — DMS from MySQL
/// or Oracle — keep their case; `pg_dump` writes PostgreSQL's names as they
/// are.)
fn ident(i: &Ident) -> String {
    i.value.clone()
}

/// `schema.table` of a table name (`public.` when unqualified).
fn table_name(name: &ObjectName) -> Result<String, String> {
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|p| p.as_ident().map(ident).ok_or_else(|| format!("table name {name} is not an identifier")))
        .collect::<Result<_, _>>()?;
    Ok(match parts.as_slice() {
        [table] => format!("public.{table}"),
        [.., schema, table] => format!("{schema}.{table}"),
        [] => return Err("a table without a name".into()),
    })
}

/// The column names of a primary key.
fn key_columns(pk: &PrimaryKeyConstraint) -> Result<Vec<String>, String> {
    pk.columns
        .iter()
        .map(|c| match &c.column.expr {
            Expr::Identifier(i) => Ok(ident(i)),
            other => Err(format!("primary key on an expression ({other}) is not supported")),
        })
        .collect()
}

fn table_of(t: &CreateTable) -> Result<TableDdl, String> {
    let name = table_name(&t.name)?;
    let mut primary_key = Vec::new();
    let mut columns = Vec::with_capacity(t.columns.len());
    for c in &t.columns {
        let col = ident(&c.name);
        let text = c.data_type.to_string();
        let data_type =
            sql_type(&text).ok_or_else(|| format!("table {name}, column {col}: unsupported type {text:?}"))?;
        let mut nullable = true;
        for o in &c.options {
            match &o.option {
                ColumnOption::NotNull => nullable = false,
                ColumnOption::PrimaryKey(_) => {
                    nullable = false;
                    primary_key = vec![col.clone()];
                }
                _ => {}
            }
        }
        columns.push(DeclaredColumn { name: col, data_type, nullable });
    }
    for constraint in &t.constraints {
        if let TableConstraint::PrimaryKey(pk) = constraint {
            primary_key = key_columns(pk).map_err(|e| format!("table {name}: {e}"))?;
        }
    }
    for k in &primary_key {
        let column = columns.iter_mut().find(|c| &c.name == k);
        column.ok_or_else(|| format!("table {name}: key column {k} is not a column"))?.nullable = false;
    }
    Ok(TableDdl { name, columns, primary_key })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `ddl` fuzz target's timeout: unclosed nested function calls in
    /// a statement that is no table took seconds in sqlparser's
    /// backtracking (time exponential in the nesting).
    const NESTED_CALLS: &str = r#"
CRE intege;if chars (
 c.histo.history (
rac  (  ryacpr(b):int (  ryacpr(biyiry (
rac  (  ryacpr(b):int (  ryacpr(c.pgbench_brc.hisisot.htostory (
rac  (  ryacpr(b):int (  ryacpr(bac#te=l7s (
 c.histo.history (
rac  (  ryacpr(b):int (  ryacpr(biyiry (
rac  (  ryacpr(b):int (  ryacpr(c.pgbench_brc.hisisot.htostory (
rac  (  ryacpr(b):int (  ryacpr(biyiry (
rac  (  ryacpr(b):intK;"#;

    #[test]
    fn statements_about_no_table_are_not_parsed() {
        assert_eq!(parse_ddl(NESTED_CALLS).unwrap(), Vec::new());
    }

    #[test]
    fn a_table_statement_nested_too_deep_is_refused_naming_its_line() {
        let body = &NESTED_CALLS[NESTED_CALLS.find("if chars (").unwrap() + 10..];
        for sql in [
            format!("CREATE TABLE ok (a int);\n\nCREATE TABLE t (a int CHECK ({body}));"),
            format!("CREATE TABLE ok (a int);\n\nALTER TABLE ONLY t ADD CONSTRAINT c CHECK ({body});"),
        ] {
            let err = parse_ddl(&sql).unwrap_err();
            assert!(err.starts_with("line 3: parentheses nested deeper than 24"), "{err}");
        }
        // As deep as pg_dump writes CHECK constraints is read.
        let t = parse_ddl(
            "CREATE TABLE t (s varchar(8) CHECK (((s)::text = ANY ((ARRAY['a'::character varying, \
             'b'::character varying])::text[]))), PRIMARY KEY (s));",
        )
        .unwrap();
        assert_eq!(t[0].primary_key, ["s"]);
    }

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

    /// What `pg_dump --schema-only` writes around its tables, and SQL the
    /// old hand-written scanner misread.
    #[test]
    fn reads_pg_dump_output_and_tricky_sql() {
        let sql = r#"--
-- PostgreSQL database dump: create table comment (x int) must not count
--
\restrict AbCdEf
SET statement_timeout = 0;
SELECT pg_catalog.set_config('search_path', '', false);
CREATE FUNCTION public.g() RETURNS TABLE (x int) LANGUAGE sql AS $$ SELECT 1 $$ PARALLEL SAFE LEAKPROOF WINDOW COST 5 ROWS 7 SET x FROM CURRENT SUPPORT h;
CREATE FUNCTION public.f() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN CREATE TABLE inside_a_body (x int); RETURN NEW; END; $$;
CREATE TABLE public.orders (
    "Id" bigint NOT NULL,
    note text DEFAULT 'a, (b)'::text,
    placed timestamp(3) with time zone,
    Total numeric(12,2),
    CONSTRAINT positive CHECK ((Total > (0)::numeric))
);
ALTER TABLE public.orders OWNER TO postgres;
CREATE SEQUENCE public.orders_id_seq START WITH 1 INCREMENT BY 1 NO MINVALUE NO MAXVALUE CACHE 1;
COPY public.orders ("Id", note) FROM stdin;
1\tcreate table nonsense (
\.
CREATE UNLOGGED TABLE Lines (order_id bigint, n integer, PRIMARY KEY (order_id, n));
ALTER TABLE ONLY public.orders
    ADD CONSTRAINT orders_pkey PRIMARY KEY ("Id");
"#;
        let t = parse_ddl(sql).unwrap();
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["public.orders", "public.Lines"]);
        let cols: Vec<&str> = t[0].columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(cols, ["Id", "note", "placed", "Total"]);
        assert_eq!(t[0].primary_key, ["Id"]);
        assert!(!t[0].columns[0].nullable);
        assert_eq!(t[0].columns[2].data_type, DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())));
        assert_eq!(t[0].columns[3].data_type, DataType::Decimal128(12, 2));
        assert_eq!(t[1].primary_key, ["order_id", "n"]);
        // An unsupported type names the table, the column and the line.
        let e = parse_ddl("SET x = 1;\n\nCREATE TABLE t (id int PRIMARY KEY, g integer[]);").unwrap_err();
        assert!(e.contains("line 3") && e.contains("public.t") && e.contains("column g"), "{e}");
        let e = parse_ddl("CREATE TABLE t (id int PRIMARY KEY,, x int);").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
    }
}
