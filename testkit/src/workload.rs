//! Workloads (`fovea-bench gen`): synthetic Debezium streams shaped like HyBench and
//! CH-benCHmark, as Kafka-style record lines with BEGIN/END records.
//!
//! Every row carries `fresh_ts`, the µs at which the change was produced,
//! so freshness can be measured on the replayed lake. The initial load is a
//! run of snapshot records (`op: "r"`), one transaction, as Debezium emits it.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng, rngs::SmallRng};

/// Which workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Small account table under random updates, large insert-mostly transfer table:
    /// ~67% updates, ~28% inserts, ~5% deletes, ~10 rows per transaction.
    Hybench,
    /// New orders and deliveries: updates fall on the large order_line and stock tables.
    Chbench,
}

fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// Writes Debezium records, numbering transactions and orders.
struct Emitter<'a> {
    out: &'a mut dyn Write,
    txid: u64,
    total: u64,
    per_table: Vec<(&'static str, u64)>,
    /// WAL position of the next record, as a PostgreSQL source numbers
    /// them, and the commit position of the last transaction: transactions
    /// chain through `source.sequence` (see `fovea_core::cdc::ordering`).
    lsn: u64,
    last_commit: Option<u64>,
}

impl Emitter<'_> {
    fn begin(&mut self) -> std::io::Result<()> {
        self.txid += 1;
        self.total = 0;
        self.per_table.clear();
        self.lsn += 8;
        writeln!(
            self.out,
            r#"{{"topic":"gen.transaction","key":{{"id":"{t}:{l}"}},"value":{{"status":"BEGIN","id":"{t}:{l}","event_count":null,"data_collections":null,"ts_ms":{ms}}}}}"#,
            t = self.txid,
            l = self.lsn,
            ms = now_us() / 1000
        )
    }

    fn end(&mut self) -> std::io::Result<()> {
        let collections: Vec<String> =
            self.per_table.iter().map(|(t, n)| format!(r#"{{"data_collection":"{t}","event_count":{n}}}"#)).collect();
        self.lsn += 8;
        self.last_commit = Some(self.lsn);
        writeln!(
            self.out,
            r#"{{"topic":"gen.transaction","key":{{"id":"{t}:{l}"}},"value":{{"status":"END","id":"{t}:{l}","event_count":{n},"data_collections":[{c}],"ts_ms":{ms}}}}}"#,
            t = self.txid,
            l = self.lsn,
            n = self.total,
            c = collections.join(","),
            ms = now_us() / 1000
        )
    }

    /// One row change; `key` and the images are JSON object bodies.
    fn row(
        &mut self,
        table: &'static str,
        op: char,
        key: &str,
        before: Option<&str>,
        after: Option<&str>,
        snapshot: &str,
    ) -> std::io::Result<()> {
        let (schema, name) = table.split_once('.').unwrap_or(("public", table));
        let tx = if op == 'r' {
            "null".to_owned()
        } else {
            self.total += 1;
            match self.per_table.iter_mut().find(|(t, _)| *t == table) {
                Some((_, n)) => *n += 1,
                None => self.per_table.push((table, 1)),
            }
            format!(r#"{{"id":"{}:0","total_order":{},"data_collection_order":0}}"#, self.txid, self.total)
        };
        let image = |v: Option<&str>| v.map_or("null".to_owned(), |b| format!("{{{b}}}"));
        self.lsn += 8;
        let prev = self.last_commit.map_or("null".to_owned(), |c| format!(r#"\"{c}\""#));
        writeln!(
            self.out,
            r#"{{"topic":"gen.{table}","key":{{{key}}},"value":{{"before":{},"after":{},"source":{{"connector":"fovea-gen","schema":"{schema}","table":"{name}","txId":{txid},"lsn":{l},"sequence":"[{prev},\"{l}\"]","ts_us":{us},"snapshot":"{snapshot}"}},"op":"{op}","transaction":{tx}}}}}"#,
            image(before),
            image(after),
            txid = self.txid,
            l = self.lsn,
            us = now_us(),
        )
    }
}

/// Writes a stream of `txns` transactions (plus the initial load).
pub fn generate(workload: Workload, txns: u64, seed: u64, out: &mut dyn Write) -> std::io::Result<()> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut e = Emitter { out, txid: 0, total: 0, per_table: Vec::new(), lsn: 1 << 24, last_commit: None };
    match workload {
        Workload::Hybench => hybench(&mut e, &mut rng, txns),
        Workload::Chbench => chbench(&mut e, &mut rng, txns),
    }
}

fn snapshot_marker(i: u64, n: u64) -> &'static str {
    if i + 1 == n {
        "last"
    } else if i == 0 {
        "first"
    } else {
        "true"
    }
}

fn hybench(e: &mut Emitter<'_>, rng: &mut SmallRng, txns: u64) -> std::io::Result<()> {
    let accounts = txns.clamp(1_000, 100_000);
    let mut balance = vec![1_000_000i64; accounts as usize];
    e.txid += 1;
    for k in 0..accounts {
        let after = format!(r#""id":{k},"name":"account-{k:06}","balance":1000000,"fresh_ts":{}"#, now_us());
        e.row("hybench.account", 'r', &format!(r#""id":{k}"#), None, Some(&after), snapshot_marker(k, accounts))?;
    }
    let mut transfers: Vec<i64> = Vec::new();
    let mut next_transfer = 0i64;
    for _ in 0..txns {
        e.begin()?;
        let fresh = now_us();
        for _ in 0..3 {
            let (a, b) = (rng.random_range(0..accounts), rng.random_range(0..accounts));
            let x = rng.random_range(1..10_000i64);
            for (k, d) in [(a, -x), (b, x)] {
                balance[k as usize] += d;
                let after =
                    format!(r#""id":{k},"name":"account-{k:06}","balance":{},"fresh_ts":{fresh}"#, balance[k as usize]);
                e.row("hybench.account", 'u', &format!(r#""id":{k}"#), None, Some(&after), "false")?;
            }
            let t = next_transfer;
            next_transfer += 1;
            transfers.push(t);
            let after = format!(r#""id":{t},"src":{a},"dst":{b},"amount":{x},"status":"new","fresh_ts":{fresh}"#);
            e.row("hybench.transfer", 'c', &format!(r#""id":{t}"#), None, Some(&after), "false")?;
        }
        // Settle one earlier transfer, and sometimes purge one.
        let i = rng.random_range(0..transfers.len());
        let t = transfers[i];
        let after = format!(r#""id":{t},"src":0,"dst":0,"amount":0,"status":"settled","fresh_ts":{fresh}"#);
        e.row("hybench.transfer", 'u', &format!(r#""id":{t}"#), None, Some(&after), "false")?;
        if rng.random_bool(0.5) && transfers.len() > 10 {
            let i = rng.random_range(0..transfers.len());
            let t = transfers.swap_remove(i);
            e.row("hybench.transfer", 'd', &format!(r#""id":{t}"#), Some(&format!(r#""id":{t}"#)), None, "false")?;
        }
        e.end()?;
    }
    Ok(())
}

fn chbench(e: &mut Emitter<'_>, rng: &mut SmallRng, txns: u64) -> std::io::Result<()> {
    const WAREHOUSES: i64 = 2;
    const DISTRICTS: i64 = 10;
    let items = (txns as i64).clamp(1_000, 10_000);
    let mut stock = vec![100i64; (WAREHOUSES * items) as usize];
    e.txid += 1;
    let n = (WAREHOUSES * items) as u64;
    for (i, (w, it)) in (0..WAREHOUSES).flat_map(|w| (0..items).map(move |i| (w, i))).enumerate() {
        let after =
            format!(r#""s_w_id":{w},"s_i_id":{it},"s_quantity":100,"s_ytd":0,"s_order_cnt":0,"fresh_ts":{}"#, now_us());
        e.row(
            "tpcch.stock",
            'r',
            &format!(r#""s_w_id":{w},"s_i_id":{it}"#),
            None,
            Some(&after),
            snapshot_marker(i as u64, n),
        )?;
    }
    let mut next_order = vec![0i64; (WAREHOUSES * DISTRICTS) as usize];
    let mut undelivered: Vec<(i64, i64, i64, i64)> = Vec::new();
    for _ in 0..txns {
        e.begin()?;
        let fresh = now_us();
        if rng.random_bool(0.5) || undelivered.is_empty() {
            let (w, d) = (rng.random_range(0..WAREHOUSES), rng.random_range(0..DISTRICTS));
            let o = next_order[(w * DISTRICTS + d) as usize];
            next_order[(w * DISTRICTS + d) as usize] += 1;
            let lines = rng.random_range(5..=15);
            let after = format!(
                r#""o_w_id":{w},"o_d_id":{d},"o_id":{o},"o_c_id":{},"o_carrier_id":null,"o_ol_cnt":{lines},"fresh_ts":{fresh}"#,
                rng.random_range(0..3000)
            );
            e.row(
                "tpcch.orders",
                'c',
                &format!(r#""o_w_id":{w},"o_d_id":{d},"o_id":{o}"#),
                None,
                Some(&after),
                "false",
            )?;
            for l in 0..lines {
                let item = rng.random_range(0..items);
                let q = rng.random_range(1..10);
                let s = &mut stock[(w * items + item) as usize];
                *s = if *s - q < 10 { *s - q + 91 } else { *s - q };
                let after = format!(
                    r#""s_w_id":{w},"s_i_id":{item},"s_quantity":{s},"s_ytd":{q},"s_order_cnt":1,"fresh_ts":{fresh}"#
                );
                e.row("tpcch.stock", 'u', &format!(r#""s_w_id":{w},"s_i_id":{item}"#), None, Some(&after), "false")?;
                let after = format!(
                    r#""ol_w_id":{w},"ol_d_id":{d},"ol_o_id":{o},"ol_number":{l},"ol_i_id":{item},"ol_quantity":{q},"ol_amount":{},"ol_delivery_d":null,"fresh_ts":{fresh}"#,
                    q * 317
                );
                e.row(
                    "tpcch.order_line",
                    'c',
                    &format!(r#""ol_w_id":{w},"ol_d_id":{d},"ol_o_id":{o},"ol_number":{l}"#),
                    None,
                    Some(&after),
                    "false",
                )?;
            }
            undelivered.push((w, d, o, lines));
        } else {
            let (w, d, o, lines) = undelivered.swap_remove(rng.random_range(0..undelivered.len()));
            let after = format!(
                r#""o_w_id":{w},"o_d_id":{d},"o_id":{o},"o_c_id":0,"o_carrier_id":{},"o_ol_cnt":{lines},"fresh_ts":{fresh}"#,
                rng.random_range(1..10)
            );
            e.row(
                "tpcch.orders",
                'u',
                &format!(r#""o_w_id":{w},"o_d_id":{d},"o_id":{o}"#),
                None,
                Some(&after),
                "false",
            )?;
            for l in 0..lines {
                let after = format!(
                    r#""ol_w_id":{w},"ol_d_id":{d},"ol_o_id":{o},"ol_number":{l},"ol_i_id":0,"ol_quantity":0,"ol_amount":0,"ol_delivery_d":{fresh},"fresh_ts":{fresh}"#
                );
                e.row(
                    "tpcch.order_line",
                    'u',
                    &format!(r#""ol_w_id":{w},"ol_d_id":{d},"ol_o_id":{o},"ol_number":{l}"#),
                    None,
                    Some(&after),
                    "false",
                )?;
            }
        }
        e.end()?;
    }
    Ok(())
}
