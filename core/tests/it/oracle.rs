//! The naive MVCC oracle: plain vectors of versions with create and delete
//! timestamps. Everything the engine answers is compared against it.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use fovea_core::schema::rows_from_batch;
use fovea_core::{Engine, Op, Row, ScanOptions, Snapshot, TableId, Value};

#[derive(Clone, Debug)]
pub struct Version {
    pub create: u64,
    pub delete: Option<u64>,
    pub row: Row,
}

#[derive(Clone, Debug, Default)]
pub struct TableModel {
    pub pk: Vec<usize>,
    /// The transaction that created it (0: before all).
    pub created: u64,
    pub versions: Vec<Version>,
    /// Rendered key → index of its live version.
    pub live: HashMap<String, usize>,
}

#[derive(Clone, Debug, Default)]
pub struct Oracle {
    pub tables: Vec<TableModel>,
}

pub fn render(key: &[Value]) -> String {
    format!("{key:?}")
}

impl Oracle {
    pub fn new(pks: &[Vec<usize>]) -> Self {
        Oracle { tables: pks.iter().map(|pk| TableModel { pk: pk.clone(), ..Default::default() }).collect() }
    }

    /// A table added later (empty) by the transaction at `ts`: snapshots
    /// below `ts` do not have it.
    pub fn add_table(&mut self, pk: Vec<usize>, ts: u64) {
        self.tables.push(TableModel { pk, created: ts, ..Default::default() });
    }

    /// Whether table `t` exists at `qts`.
    pub fn exists(&self, t: usize, qts: u64) -> bool {
        self.tables[t].created <= qts
    }

    fn key_of(&self, t: usize, row: &Row) -> String {
        render(&self.tables[t].pk.iter().map(|&i| row[i].clone()).collect::<Vec<_>>())
    }

    /// Applies a transaction at `ts`; all or nothing. Returns whether it was valid.
    pub fn apply(&mut self, ts: u64, ops: &[Op]) -> bool {
        // Validate against live keys plus the transaction's own changes.
        let mut overlay: HashMap<(usize, String), bool> = HashMap::new();
        let live = |o: &HashMap<(usize, String), bool>, t: usize, k: &String, me: &Oracle| {
            o.get(&(t, k.clone())).copied().unwrap_or_else(|| me.tables[t].live.contains_key(k))
        };
        for op in ops {
            match op {
                Op::Insert { table, row } => {
                    let (t, k) = (table.0 as usize, self.key_of(table.0 as usize, row));
                    if live(&overlay, t, &k, self) {
                        return false;
                    }
                    overlay.insert((t, k), true);
                }
                Op::Delete { table, key } => {
                    let (t, k) = (table.0 as usize, render(key));
                    if !live(&overlay, t, &k, self) {
                        return false;
                    }
                    overlay.insert((t, k), false);
                }
                Op::Upsert { table, row } => {
                    overlay.insert((table.0 as usize, self.key_of(table.0 as usize, row)), true);
                }
                Op::Update { table, key, row } => {
                    let t = table.0 as usize;
                    let (old, new) = (render(key), self.key_of(t, row));
                    if !live(&overlay, t, &old, self) {
                        return false;
                    }
                    overlay.insert((t, old.clone()), false);
                    if old != new && live(&overlay, t, &new, self) {
                        return false;
                    }
                    overlay.insert((t, new), true);
                }
            }
        }
        for op in ops {
            match op {
                Op::Insert { table, row } => self.insert(table.0 as usize, ts, row.clone()),
                Op::Delete { table, key } => self.delete(table.0 as usize, ts, &render(key)),
                Op::Upsert { table, row } => {
                    let t = table.0 as usize;
                    let k = self.key_of(t, row);
                    if self.tables[t].live.contains_key(&k) {
                        self.delete(t, ts, &k);
                    }
                    self.insert(t, ts, row.clone());
                }
                Op::Update { table, key, row } => {
                    self.delete(table.0 as usize, ts, &render(key));
                    self.insert(table.0 as usize, ts, row.clone());
                }
            }
        }
        true
    }

    fn insert(&mut self, t: usize, ts: u64, row: Row) {
        let k = self.key_of(t, &row);
        let m = &mut self.tables[t];
        m.versions.push(Version { create: ts, delete: None, row });
        m.live.insert(k, m.versions.len() - 1);
    }

    fn delete(&mut self, t: usize, ts: u64, k: &str) {
        let m = &mut self.tables[t];
        let i = m.live.remove(k).expect("validated");
        m.versions[i].delete = Some(ts);
    }

    /// Visible rows of table `t` at `qts`, in canonical order.
    pub fn visible(&self, t: usize, qts: u64) -> Vec<Row> {
        let mut rows: Vec<Row> = self.tables[t]
            .versions
            .iter()
            .filter(|v| v.create <= qts && v.delete.is_none_or(|d| d > qts))
            .map(|v| v.row.clone())
            .collect();
        canonical(&mut rows);
        rows
    }
}

pub fn canonical(rows: &mut [Row]) {
    rows.sort_by_cached_key(|r| format!("{r:?}"));
}

/// Scans `table` at `snapshot` and returns its rows in canonical order.
pub fn scan_rows(engine: &Engine, snapshot: &Snapshot, table: &str, options: ScanOptions) -> Vec<Row> {
    scan_rows_on(engine.scan(snapshot, table, options).expect("plan"))
}

/// The rows of a planned scan, canonical order.
pub fn scan_rows_on(scan: fovea_core::Scan) -> Vec<Row> {
    let batches = scan.collect_batches().expect("scan");
    let mut rows: Vec<Row> = batches.iter().flat_map(|b| rows_from_batch(b).expect("convert")).collect();
    canonical(&mut rows);
    rows
}

pub const ACCOUNTS: &str = "s.accounts";
pub const ITEMS: &str = "s.items";

/// Two tables: one with an int key, one with a composite (int, text) key.
pub fn create_tables(engine: &Engine) -> Oracle {
    let accounts = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("balance", DataType::Decimal128(12, 2), false),
    ]);
    let items = Schema::new(vec![
        Field::new("w", DataType::Int32, false),
        Field::new("code", DataType::Utf8, false),
        Field::new("qty", DataType::Int64, true),
        Field::new("flag", DataType::Boolean, true),
    ]);
    let a = engine.create_table(ACCOUNTS, Arc::new(accounts), vec![0]).unwrap();
    let i = engine.create_table(ITEMS, Arc::new(items), vec![0, 1]).unwrap();
    assert_eq!((a.id, i.id), (TableId(0), TableId(1)));
    Oracle::new(&[vec![0], vec![0, 1]])
}

/// A table created later, shaped like `s.accounts` (its rows come from
/// [`row`] and [`key`] with any `t` other than 1).
pub fn extra_table(engine: &Engine, name: &str, ts: fovea_core::Ts) -> fovea_core::Result<Arc<fovea_core::TableDef>> {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("balance", DataType::Decimal128(12, 2), false),
    ]);
    engine.create_table_at(name, Arc::new(schema), vec![0], ts)
}

/// Key values of logical key `k` in table `t` (every table but 1 is
/// shaped like `s.accounts`).
pub fn key(t: usize, k: i64) -> Row {
    match t {
        1 => vec![Value::Int(k % 3), Value::Utf8(format!("c{}", k / 3))],
        _ => vec![Value::Int(k)],
    }
}

/// A full row of table `t` with logical key `k` and payload `p`.
pub fn row(t: usize, k: i64, p: i64) -> Row {
    match t {
        1 => {
            let mut r = key(1, k);
            r.push(if p % 4 == 0 { Value::Null } else { Value::Int(p) });
            r.push(if p % 3 == 0 { Value::Null } else { Value::Bool(p % 2 == 0) });
            r
        }
        _ => vec![
            Value::Int(k),
            if p % 5 == 0 { Value::Null } else { Value::Utf8(format!("n{p}")) },
            Value::Decimal(i128::from(p) * 7),
        ],
    }
}
