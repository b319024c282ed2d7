//! Schema changes on a live PostgreSQL 15 while `fovea serve` follows it,
//! as applications make them: statements back to back with no pause.
//!
//! - The sequence of issue #43 (renamed column, type changes each followed
//!   at once by writes) on pgbench tables ends exact, and stays so after a
//!   restart; the replica never reports itself stalled.
//! - A model test: random sequences of DDL (columns added with and without
//!   defaults, dropped, renamed, retyped in place and by a copy, defaults,
//!   NOT NULL, tables created, dropped, renamed, truncated), each followed
//!   at once by writes, from one session, while two more sessions write
//!   with no pauses (cross-table transactions among them), and `fovea
//!   serve` is killed and restarted at random points. PostgreSQL is the
//!   model: after each sequence every table equals PostgreSQL's, in values,
//!   columns and types. `FOVEA_DDL_SEQUENCES` sequences (default 4; the
//!   soak runs hundreds), seeds from `FOVEA_DDL_SEED` (default: fixed).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{PgCluster, Server};
use rand::rngs::SmallRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

/// The replayer under test, with frequent checkpoints (restarts resume
/// from one) and a short stall bound.
const ARGS: &[&str] = &["--checkpoint-secs", "0.5", "--gc-secs", "1", "--stall-secs", "8"];

fn client(pg: &PgCluster) -> postgres::Client {
    postgres::Client::connect(&pg.url("bench"), postgres::NoTls).unwrap()
}

/// The Arrow type fovea gives a column of PostgreSQL type `pg` (as
/// `format_type` names it), as DataFusion's information_schema writes it.
fn arrow_type(pg: &str) -> String {
    let t = match pg {
        "smallint" => "Int16",
        "integer" => "Int32",
        "bigint" => "Int64",
        "real" => "Float32",
        "double precision" => "Float64",
        "date" => "Date32",
        "timestamp without time zone" => "Timestamp(µs)",
        "boolean" => "Boolean",
        "text" => "Utf8",
        t if t.starts_with("character") => "Utf8",
        t if t.starts_with("numeric(") => {
            let inner = &t["numeric(".len()..t.len() - 1];
            let (p, s) = inner.split_once(',').unwrap();
            return format!("Decimal128({p}, {s})");
        }
        other => panic!("the model makes no column of type {other}"),
    };
    t.to_owned()
}

/// The published tables of database `bench`, by `schema.table`.
fn pg_tables(pg: &PgCluster) -> Vec<String> {
    pg.psql(
        "bench",
        "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'fovea_pub' ORDER BY 1",
    )
    .lines()
    .map(str::to_owned)
    .collect()
}

/// `(name, format_type)` of each column of `table`, in order.
fn pg_columns(pg: &PgCluster, table: &str) -> Vec<(String, String)> {
    let sql = format!(
        "SELECT attname || '|' || format_type(atttypid, atttypmod) FROM pg_attribute \
         WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
    );
    pg.psql("bench", &sql)
        .lines()
        .map(|l| {
            let (n, t) = l.split_once('|').unwrap();
            (n.to_owned(), t.to_owned())
        })
        .collect()
}

/// How `table` differs in fovea from PostgreSQL (columns, types, rows), if
/// it does.
fn compare_table(pg: &PgCluster, server: &Server, table: &str, order: &str) -> Result<(), String> {
    let columns = pg_columns(pg, table);
    let (schema, name) = table.split_once('.').unwrap();
    let mut want: Vec<String> = columns.iter().map(|(n, t)| format!("{n},{}", arrow_type(t))).collect();
    want.sort();
    let got = server.sql(&format!(
        "SELECT column_name, data_type FROM information_schema.columns \
         WHERE table_schema = '{schema}' AND table_name = '{name}' ORDER BY column_name"
    ))?;
    let got: Vec<String> = got.lines().map(|l| l.replace('"', "")).collect();
    let want_text: Vec<String> = want.iter().map(|l| l.replace(", ", ",").replace('"', "")).collect();
    let got_text: Vec<String> = got.iter().map(|l| l.replace(", ", ",")).collect();
    if want_text != got_text {
        return Err(format!("{table}: columns in PostgreSQL {want_text:?}, in fovea {got_text:?}"));
    }
    let list = columns.iter().map(|(n, _)| format!("\"{n}\"")).collect::<Vec<_>>().join(", ");
    let expected = pg.psql("bench", &format!("COPY (SELECT {list} FROM {table} ORDER BY {order}) TO STDOUT WITH CSV"));
    let got = server.sql(&format!("SELECT {list} FROM {table} ORDER BY {order}"))?;
    if got != expected {
        let (e, g): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), got.lines().collect());
        let first = e.iter().zip(&g).position(|(a, b)| a != b).unwrap_or(e.len().min(g.len()));
        return Err(format!(
            "{table}: {} rows in PostgreSQL, {} in fovea; first difference at row {first}:\n  pg:    {:?}\n  fovea: {:?}",
            e.len(),
            g.len(),
            e.get(first),
            g.get(first)
        ));
    }
    Ok(())
}

/// Every published table equals PostgreSQL's, and fovea has no other.
fn compare_all(pg: &PgCluster, server: &Server, order: &dyn Fn(&str) -> String) -> Result<(), String> {
    let tables = pg_tables(pg);
    for table in &tables {
        compare_table(pg, server, table, &order(table))?;
    }
    let mirrored = server.sql(
        "SELECT table_schema || '.' || table_name FROM information_schema.tables \
         WHERE table_schema NOT IN ('information_schema') ORDER BY 1",
    )?;
    let extra: Vec<&str> = mirrored.lines().filter(|t| !tables.iter().any(|p| p == t)).collect();
    if !extra.is_empty() {
        return Err(format!("fovea has tables PostgreSQL does not: {extra:?}"));
    }
    Ok(())
}

/// `GET /healthz`: the status line and body.
fn healthz(server: &Server) -> String {
    use std::io::{Read, Write};
    let addr = server.metrics.as_ref().unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

/// Waits until fovea equals PostgreSQL (it catches up while transactions
/// are applied), failing with the last difference once nothing was applied
/// for 60 s; the replica must not report itself stalled meanwhile.
fn converge(pg: &PgCluster, server: &Server, order: &dyn Fn(&str) -> String, what: &str) {
    let began = Instant::now();
    let mut progress = (-1.0, Instant::now());
    loop {
        let health = healthz(server);
        assert!(
            health.starts_with("HTTP/1.1 200"),
            "{what}: the replica reports itself unhealthy: {health}\n{}",
            server.log()
        );
        let error = match compare_all(pg, server, order) {
            Ok(()) => return,
            Err(e) => e,
        };
        let applied = server.metric("fovea_transactions_total");
        if applied != progress.0 {
            progress = (applied, Instant::now());
        }
        if progress.1.elapsed() > Duration::from_secs(60) || began.elapsed() > Duration::from_secs(600) {
            panic!("{what}: fovea does not equal PostgreSQL: {error}\n{}", server.log());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn publish_all(pg: &PgCluster) -> String {
    pg.psql("bench", "CREATE PUBLICATION fovea_pub FOR ALL TABLES");
    format!("{}?slot=fovea_slot&publication=fovea_pub&create_slot=true", pg.url("bench"))
}

/// Issue #43's statements, each autocommitted right after the last.
#[test]
fn schema_changes_followed_at_once_by_writes_end_exact() {
    let pg = PgCluster::start();
    let init = pg.pgbench("bench", &["-i", "-s", "1", "-q"]).output().unwrap();
    assert!(init.status.success(), "pgbench -i: {}", String::from_utf8_lossy(&init.stderr));
    let input = publish_all(&pg);
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let order = |t: &str| {
        match t {
            "public.pgbench_accounts" => "aid",
            "public.pgbench_branches" => "bid",
            "public.pgbench_tellers" => "tid",
            _ => "tid, bid, aid, delta, mtime",
        }
        .to_owned()
    };
    let server = Server::start(&lake, &input, ARGS);
    converge(&pg, &server, &order, "the initial copy");
    let mut c = client(&pg);
    for statement in [
        "ALTER TABLE pgbench_tellers RENAME COLUMN filler TO f2",
        "UPDATE pgbench_tellers SET f2 = 'y' WHERE tid < 5",
        "ALTER TABLE pgbench_history ALTER COLUMN delta TYPE bigint",
        "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 5000000000, now())",
        "ALTER TABLE pgbench_accounts ALTER COLUMN abalance TYPE numeric(20,2)",
        "UPDATE pgbench_accounts SET abalance = abalance + 0.25 WHERE aid <= 1000",
        "ALTER TABLE pgbench_tellers ALTER COLUMN tbalance TYPE smallint",
        "UPDATE pgbench_tellers SET tbalance = 7 WHERE tid = 1",
    ] {
        c.batch_execute(statement).unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    converge(&pg, &server, &order, "after the statements");
    assert_eq!(server.sql("SELECT sum(abalance) FROM public.pgbench_accounts").unwrap(), "250.00\n");
    // A column dropped and added again under its name is a new column:
    // NULL in the rows not written since (never the dropped values), in
    // the same type or another.
    for statement in [
        "UPDATE pgbench_tellers SET f2 = 'w' WHERE tid <= 4",
        "ALTER TABLE pgbench_tellers DROP COLUMN f2",
        "UPDATE pgbench_tellers SET tbalance = 3 WHERE tid = 5",
        "ALTER TABLE pgbench_tellers ADD COLUMN f2 varchar(20)",
        "UPDATE pgbench_tellers SET f2 = 'n' WHERE tid = 2",
        "ALTER TABLE pgbench_branches DROP COLUMN filler",
        "ALTER TABLE pgbench_branches ADD COLUMN filler int; UPDATE pgbench_branches SET filler = 1",
        "ALTER TABLE pgbench_branches DROP COLUMN filler; ALTER TABLE pgbench_branches ADD COLUMN filler text; \
         UPDATE pgbench_branches SET filler = 't' WHERE bid = 1",
    ] {
        c.batch_execute(statement).unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    converge(&pg, &server, &order, "after columns dropped and added again");
    assert_eq!(
        server.sql("SELECT count(f2) FROM public.pgbench_tellers").unwrap(),
        "1\n",
        "only the teller written since f2 came back has one"
    );
    // One more write elsewhere becomes visible too: HWM moves on.
    c.batch_execute("UPDATE pgbench_branches SET bbalance = bbalance + 1").unwrap();
    converge(&pg, &server, &order, "after one more write");
    assert_eq!(server.metric("fovea_stalled"), 0.0);
    let log = server.stop();
    assert!(!log.contains("stalled"), "{log}");
    // The same kind of statements while fovea is down: it meets them all
    // committed, so the copies they need all see the same snapshot.
    for statement in [
        "ALTER TABLE pgbench_branches RENAME COLUMN filler TO f3",
        "UPDATE pgbench_branches SET f3 = 'z'",
        "ALTER TABLE pgbench_tellers ALTER COLUMN tbalance TYPE bigint",
        "UPDATE pgbench_tellers SET tbalance = 6000000000 WHERE tid = 2",
        "ALTER TABLE pgbench_accounts ALTER COLUMN abalance TYPE integer USING abalance::integer",
        "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid <= 10",
    ] {
        c.batch_execute(statement).unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    let server = Server::start(&lake, &input, ARGS);
    converge(&pg, &server, &order, "after a restart");
    c.batch_execute("UPDATE pgbench_branches SET bbalance = bbalance + 1").unwrap();
    converge(&pg, &server, &order, "after one more write");
    let log = server.stop();
    assert!(!log.contains("stalled"), "{log}");
}

/// Column types of the model and the values it writes into them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    Small,
    Int,
    Big,
    Real,
    Double,
    Num12,
    Num20,
    Text,
    Varchar,
    Date,
    Ts,
    Bool,
}

const TYPES: &[Ty] = &[
    Ty::Small,
    Ty::Int,
    Ty::Big,
    Ty::Real,
    Ty::Double,
    Ty::Num12,
    Ty::Num20,
    Ty::Text,
    Ty::Varchar,
    Ty::Date,
    Ty::Ts,
    Ty::Bool,
];

impl Ty {
    fn sql(self) -> &'static str {
        match self {
            Ty::Small => "smallint",
            Ty::Int => "integer",
            Ty::Big => "bigint",
            Ty::Real => "real",
            Ty::Double => "double precision",
            Ty::Num12 => "numeric(12,2)",
            Ty::Num20 => "numeric(20,2)",
            Ty::Text => "text",
            Ty::Varchar => "varchar(20)",
            Ty::Date => "date",
            Ty::Ts => "timestamp",
            Ty::Bool => "boolean",
        }
    }

    /// A literal of this type (now and then one only this type holds).
    fn value(self, rng: &mut SmallRng) -> String {
        if rng.random_bool(0.1) {
            return "NULL".into();
        }
        match self {
            Ty::Small => rng.random_range(-3000..3000).to_string(),
            Ty::Int if rng.random_bool(0.1) => "2000000000".into(),
            Ty::Int => rng.random_range(-100_000..100_000).to_string(),
            Ty::Big if rng.random_bool(0.2) => "5000000000".into(),
            Ty::Big => rng.random_range(-100_000..100_000i64).to_string(),
            Ty::Real => format!("{}::real", rng.random_range(-1000..1000) as f32 / 7.0),
            Ty::Double => {
                format!("{:e}", rng.random_range(-1000..1000) as f64 / 3.0 * 10f64.powi(rng.random_range(-9..15)))
            }
            Ty::Num12 => format!("{}.{:02}", rng.random_range(-99_999_999..99_999_999), rng.random_range(0..100)),
            Ty::Num20 if rng.random_bool(0.2) => "123456789012345.67".into(),
            Ty::Num20 => format!("{}.{:02}", rng.random_range(-9999..9999), rng.random_range(0..100)),
            Ty::Text | Ty::Varchar => {
                let words = ["a", "b c", "it''s", "x,y", "  ", "ü", "long text"];
                format!("'{}{}'", words.choose(rng).unwrap(), rng.random_range(0..1000))
            }
            Ty::Date => format!("DATE '2026-01-01' + {}", rng.random_range(-500..500)),
            Ty::Ts => {
                format!("TIMESTAMP '2026-01-01 00:00:00' + {} * interval '61.5 seconds'", rng.random_range(-9999..9999))
            }
            Ty::Bool => rng.random_bool(0.5).to_string(),
        }
    }

    /// Types a column of this type is changed to (`USING c::new`); some
    /// fail on the values a table holds, as they would for a user.
    fn changes(self) -> &'static [Ty] {
        const NUMBERS: &[Ty] = &[Ty::Small, Ty::Int, Ty::Big, Ty::Real, Ty::Double, Ty::Num12, Ty::Num20, Ty::Text];
        match self {
            Ty::Small | Ty::Int | Ty::Big | Ty::Real | Ty::Double | Ty::Num12 | Ty::Num20 => NUMBERS,
            Ty::Text | Ty::Varchar => &[Ty::Text, Ty::Varchar],
            Ty::Date => &[Ty::Ts, Ty::Text],
            Ty::Ts => &[Ty::Date, Ty::Text],
            Ty::Bool => &[Ty::Text],
        }
    }
}

/// The model's view of a table: `id int PRIMARY KEY, n int NOT NULL`
/// (never changed: the writing sessions use them) and columns that are.
#[derive(Clone, Debug)]
struct Table {
    name: String,
    columns: Vec<(String, Ty)>,
    /// Columns dropped since, which a step may add again under their name.
    dropped: Vec<String>,
}

/// How the model changes when a step's statements succeed.
type ModelChange = Box<dyn FnOnce(&mut Model)>;

/// The names of the tables that exist, shared with the writing sessions.
type Names = Arc<Mutex<Vec<String>>>;

struct Model {
    rng: SmallRng,
    tables: Vec<Table>,
    names: Names,
    next: u64,
}

impl Model {
    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }

    fn publish_names(&self) {
        *self.names.lock().unwrap() = self.tables.iter().map(|t| t.name.clone()).collect();
    }

    fn create_table(&mut self) -> String {
        let name = self.fresh("t");
        let columns: Vec<(String, Ty)> = (0..self.rng.random_range(1..4))
            .map(|_| (self.fresh("c"), *TYPES.choose(&mut self.rng).unwrap()))
            .collect();
        let defs: String = columns.iter().map(|(c, t)| format!(", {c} {}", t.sql())).collect();
        let table = Table { name: name.clone(), columns, dropped: Vec::new() };
        let n = self.rng.random_range(0..30);
        let rows = self.insert_rows(&table, n);
        self.tables.push(table);
        format!("CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL DEFAULT 0{defs}); {rows}")
    }

    fn insert_rows(&mut self, t: &Table, rows: usize) -> String {
        if rows == 0 {
            return String::new();
        }
        let cols: String = t.columns.iter().map(|(c, _)| format!(", {c}")).collect();
        let values: Vec<String> = (0..rows)
            .map(|_| {
                let id = self.rng.random_range(0..500);
                let vals: String =
                    t.columns.iter().map(|(_, ty)| format!(", ({})::{}", ty.value(&mut self.rng), ty.sql())).collect();
                format!("({id}, 0{vals})")
            })
            .collect();
        // Ids repeat: the last of them wins.
        format!(
            "INSERT INTO {} (id, n{cols}) SELECT DISTINCT ON (id) * FROM (VALUES {}) v (id, n{cols}) ORDER BY id \
             ON CONFLICT (id) DO NOTHING;",
            t.name,
            values.join(", ")
        )
    }

    /// One step of the migration session: a schema change followed at once
    /// by a write that uses it, or writes alone. Returns the statements
    /// and how the model changes if they succeed.
    fn step(&mut self) -> (String, ModelChange) {
        if self.tables.is_empty() {
            let sql = self.create_table();
            let table = self.tables.pop().unwrap();
            return (sql, Box::new(move |m| m.tables.push(table)));
        }
        let i = self.rng.random_range(0..self.tables.len());
        let t = self.tables[i].clone();
        let name = t.name.clone();
        let pick = self.rng.random_range(0..100);
        let some_column = (!t.columns.is_empty()).then(|| t.columns[self.rng.random_range(0..t.columns.len())].clone());
        match (pick, some_column) {
            (0..=9, _) => {
                let c = self.fresh("c");
                let ty = *TYPES.choose(&mut self.rng).unwrap();
                let v = ty.value(&mut self.rng);
                let sql = format!(
                    "ALTER TABLE {name} ADD COLUMN {c} {}; UPDATE {name} SET {c} = {v} WHERE id % 3 = 0",
                    ty.sql()
                );
                (sql, Box::new(move |m| m.tables[i].columns.push((c, ty))))
            }
            (10..=16, _) => {
                let c = self.fresh("c");
                let ty = *TYPES.choose(&mut self.rng).unwrap();
                let d = ty.value(&mut self.rng);
                let v = ty.value(&mut self.rng);
                let sql = format!(
                    "ALTER TABLE {name} ADD COLUMN {c} {} DEFAULT {d}; UPDATE {name} SET {c} = {v} WHERE id % 4 = 1",
                    ty.sql()
                );
                (sql, Box::new(move |m| m.tables[i].columns.push((c, ty))))
            }
            (17..=23, Some((c, _))) => {
                let sql = format!("ALTER TABLE {name} DROP COLUMN {c}; UPDATE {name} SET n = n + 1 WHERE id % 5 = 0");
                (
                    sql,
                    Box::new(move |m| {
                        m.tables[i].columns.retain(|(x, _)| *x != c);
                        m.tables[i].dropped.push(c);
                    }),
                )
            }
            // A dropped column added again under its name (a new column,
            // NULL in the rows not written since), in any type.
            (78..=85, _) if !t.dropped.is_empty() => {
                let c = t.dropped[self.rng.random_range(0..t.dropped.len())].clone();
                let ty = *TYPES.choose(&mut self.rng).unwrap();
                let v = ty.value(&mut self.rng);
                let sql = format!(
                    "ALTER TABLE {name} ADD COLUMN {c} {}; UPDATE {name} SET {c} = {v} WHERE id % 3 = 1",
                    ty.sql()
                );
                (
                    sql,
                    Box::new(move |m| {
                        m.tables[i].dropped.retain(|x| *x != c);
                        m.tables[i].columns.push((c, ty));
                    }),
                )
            }
            (24..=31, Some((c, ty))) => {
                let new = self.fresh("c");
                let v = ty.value(&mut self.rng);
                let sql = format!(
                    "ALTER TABLE {name} RENAME COLUMN {c} TO {new}; UPDATE {name} SET {new} = {v} WHERE id % 2 = 0"
                );
                (
                    sql,
                    Box::new(move |m| {
                        m.tables[i].columns.iter_mut().filter(|(x, _)| *x == c).for_each(|x| x.0 = new.clone())
                    }),
                )
            }
            (32..=47, Some((c, ty))) => {
                let to = *ty.changes().choose(&mut self.rng).unwrap();
                let v = to.value(&mut self.rng);
                let both = self.rng.random_bool(0.3);
                let alter = format!("ALTER TABLE {name} ALTER COLUMN {c} TYPE {} USING {c}::{}", to.sql(), to.sql());
                let write = format!("UPDATE {name} SET {c} = {v} WHERE id % 3 = 2");
                // Now and then the change and its write in one transaction.
                let sql = if both { format!("BEGIN; {alter}; {write}; COMMIT") } else { format!("{alter}; {write}") };
                (sql, Box::new(move |m| m.tables[i].columns.iter_mut().filter(|(x, _)| *x == c).for_each(|x| x.1 = to)))
            }
            (48..=52, Some((c, ty))) => {
                let d = ty.value(&mut self.rng);
                let sql = format!(
                    "ALTER TABLE {name} ALTER COLUMN {c} SET DEFAULT {d}; INSERT INTO {name} (id, n) VALUES ({}, 0) ON CONFLICT (id) DO UPDATE SET n = {name}.n + 1",
                    self.rng.random_range(500..600)
                );
                (sql, Box::new(|_| {}))
            }
            (53..=57, Some((c, ty))) => {
                let v = match ty.value(&mut self.rng) {
                    v if v == "NULL" => ty.value(&mut self.rng).replace("NULL", "DEFAULT"),
                    v => v,
                };
                let sql = if self.rng.random_bool(0.5) {
                    format!(
                        "UPDATE {name} SET {c} = {v} WHERE {c} IS NULL; ALTER TABLE {name} ALTER COLUMN {c} SET NOT NULL"
                    )
                } else {
                    format!(
                        "ALTER TABLE {name} ALTER COLUMN {c} DROP NOT NULL; UPDATE {name} SET {c} = NULL WHERE id % 7 = 0"
                    )
                };
                (sql, Box::new(|_| {}))
            }
            (58..=63, _) => {
                let sql = self.create_table();
                let table = self.tables.pop().unwrap();
                (sql, Box::new(move |m| m.tables.push(table)))
            }
            (64..=67, _) if self.tables.len() > 1 => {
                let sql = format!("DROP TABLE {name}");
                (sql, Box::new(move |m| m.tables.retain(|t| t.name != name)))
            }
            (68..=72, _) => {
                let new = self.fresh("t");
                let sql = format!("ALTER TABLE {name} RENAME TO {new}; UPDATE {new} SET n = n + 10 WHERE id % 2 = 1");
                (sql, Box::new(move |m| m.tables[i].name = new))
            }
            (73..=76, _) => {
                let n = self.rng.random_range(1..10);
                let rows = self.insert_rows(&t, n);
                let sql = format!("TRUNCATE {name}; {rows}");
                (sql, Box::new(|_| {}))
            }
            _ => {
                let n = self.rng.random_range(1..20);
                let rows = self.insert_rows(&t, n);
                let set = match &t.columns.first() {
                    Some((c, ty)) => format!("{c} = {}", ty.value(&mut self.rng)),
                    None => "n = n - 1".into(),
                };
                let sql = format!(
                    "{rows} UPDATE {name} SET {set} WHERE id % 11 = {}; DELETE FROM {name} WHERE id % 13 = {}",
                    self.rng.random_range(0..11),
                    self.rng.random_range(0..13)
                );
                (sql, Box::new(|_| {}))
            }
        }
    }
}

/// A writing session: until `stop`, writes by `id` and `n` to the tables
/// that exist, one statement right after the other, now and then two
/// tables in one transaction. Errors (a table dropped or locked away) are
/// counted, not fatal.
fn writer(
    pg: &PgCluster,
    names: Names,
    seed: u64,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    let url = pg.url("bench");
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut rng = SmallRng::seed_from_u64(seed);
        while !stop.load(Ordering::Relaxed) {
            let tables = names.lock().unwrap().clone();
            let Some(t) = tables.choose(&mut rng) else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            let id = rng.random_range(0..500);
            let sql = match rng.random_range(0..10) {
                0..=3 => format!("UPDATE {t} SET n = n + 1 WHERE id = {id}"),
                4..=6 => {
                    format!("INSERT INTO {t} (id, n) VALUES ({id}, 1) ON CONFLICT (id) DO UPDATE SET n = {t}.n + 1")
                }
                7 => format!("DELETE FROM {t} WHERE id = {id}"),
                _ => {
                    let u = tables.choose(&mut rng).unwrap();
                    format!(
                        "BEGIN; UPDATE {t} SET n = n - 1 WHERE id = {id}; INSERT INTO {u} (id, n) VALUES ({}, 2) ON CONFLICT (id) DO UPDATE SET n = {u}.n + 2; COMMIT",
                        rng.random_range(0..500)
                    )
                }
            };
            if c.batch_execute(&sql).is_ok() {
                done.fetch_add(1, Ordering::Relaxed);
            } else {
                let _ = c.batch_execute("ROLLBACK");
            }
        }
    })
}

#[test]
fn random_schema_changes_and_writes_with_kills_end_exact() {
    let sequences: u64 = std::env::var("FOVEA_DDL_SEQUENCES").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let steps: usize = std::env::var("FOVEA_DDL_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let seed0: u64 = std::env::var("FOVEA_DDL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(43);
    let pg = PgCluster::start();
    let input = publish_all(&pg);
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let order = |_: &str| "id".to_owned();
    let names: Names = Arc::default();
    let mut model =
        Model { rng: SmallRng::seed_from_u64(seed0), tables: Vec::new(), names: Arc::clone(&names), next: 0 };
    let mut migrations = client(&pg);
    for _ in 0..3 {
        let sql = model.create_table();
        migrations.batch_execute(&sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }
    model.publish_names();
    let mut server = Some(Server::start(&lake, &input, ARGS));
    converge(&pg, server.as_ref().unwrap(), &order, "the initial copy");
    let (mut ok, mut failed, mut kills) = (0u64, 0u64, 0u64);
    for sequence in 0..sequences {
        let seed = seed0.wrapping_mul(1000).wrapping_add(sequence);
        model.rng = SmallRng::seed_from_u64(seed);
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let writers: Vec<_> = (0..2)
            .map(|w| writer(&pg, Arc::clone(&names), seed * 7 + w, Arc::clone(&stop), Arc::clone(&done)))
            .collect();
        // The schema changes start once the sessions write (on a loaded
        // machine connecting takes longer than the 30 changes).
        let began = Instant::now();
        while done.load(Ordering::Relaxed) == 0 && began.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(10));
        }
        // Kill points: a SIGKILL in half the sequences, restarted at once or
        // a few steps later.
        let kill_at = model.rng.random_bool(0.5).then(|| model.rng.random_range(0..steps));
        let restart_after = model.rng.random_range(0..4);
        let mut down_since = None;
        for step in 0..steps {
            if Some(step) == kill_at {
                server.take().unwrap().kill();
                kills += 1;
                down_since = Some(step);
            }
            if down_since.is_some_and(|s| step >= s + restart_after) && server.is_none() {
                server = Some(Server::start(&lake, &input, ARGS));
                down_since = None;
            }
            let (sql, apply) = model.step();
            match migrations.batch_execute(&sql) {
                Ok(()) => {
                    apply(&mut model);
                    model.publish_names();
                    ok += 1;
                }
                Err(_) => {
                    let _ = migrations.batch_execute("ROLLBACK");
                    failed += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        assert!(
            done.load(Ordering::Relaxed) > 0,
            "sequence {sequence} (seed {seed}): no write of the writing sessions succeeded"
        );
        if server.is_none() {
            server = Some(Server::start(&lake, &input, ARGS));
        }
        converge(
            &pg,
            server.as_ref().unwrap(),
            &order,
            &format!("sequence {sequence} (FOVEA_DDL_SEED={seed0}, seed {seed})"),
        );
    }
    // Most migration steps must have run (a few fail on values, as a
    // user's would): the model exercised schema changes, not errors.
    assert!(ok > failed * 2, "{ok} steps succeeded, {failed} failed");
    eprintln!("{sequences} sequences: {ok} steps, {failed} refused by PostgreSQL, {kills} kills");
    let log = server.take().unwrap().stop();
    assert!(!log.contains("stalled"), "{log}");
}
