//! PostgreSQL's logical replication protocol (`pgoutput`, version 1).
//!
//! [`PgOutputDecoder`] turns the binary messages of a publication — as a
//! walsender streams them, or as `pg_logical_slot_peek_binary_changes`
//! returns them — into whole source transactions ([`PgTransaction`]).
//! Values arrive in PostgreSQL's text output, which [`super::types`]
//! converts like any other input. Relation messages give the column types
//! (OID and typmod), so tables are created with PostgreSQL's types rather
//! than inferred ones.
//!
//! Quirks handled (see `shared/cdc/README.md`):
//! - an unchanged out-of-line (TOAST) value (`'u'`) becomes
//!   [`UNAVAILABLE`]: the sink keeps the previous value of that column;
//! - replica identity DEFAULT sends the old key only when the key changed,
//!   FULL sends the whole old row: a changed key becomes an update whose
//!   before image is the old key (unchanged TOAST values are kept from the
//!   old key's row);
//! - `TRUNCATE` is reported as such; the caller decides what it means.
//!
//! Memory is bounded however big a transaction is (proto 1 sends a
//! transaction only once it committed, all of it): past
//! [`SpillConfig::memory_bytes`] of messages, the rest of the transaction
//! is written, as received, to an unnamed temporary file and decoded again
//! from there, in order, each time its rows are read
//! ([`PgTransaction::for_each_row`], [`PgTransaction::into_rows`]).
//!
//! [`XidSnapshot`] answers whether a transaction was visible to an
//! exported snapshot (`pg_current_snapshot()`), which is how an initial
//! copy and the stream of a slot fit together without loss or overlap.

use std::collections::{HashMap, VecDeque};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use arrow::datatypes::DataType;
use serde_json::Value as Json;

use super::ddl::sql_type;
use super::debezium::UNAVAILABLE;
use super::{Columns, DeclaredColumn, ROWID_COLUMN, RowChange, RowOp, SmolStr, input_error, rowid_column};
use fovea_types::error::Result;

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
pub const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;

/// A commit time in µs since 2000-01-01 as µs since 1970; one out of
/// range is an error, not a wrapped number.
fn commit_micros(pg_us: i64) -> Result<i64, String> {
    pg_us.checked_add(PG_EPOCH_OFFSET_US).ok_or_else(|| format!("commit time {pg_us} is out of range"))
}

pub use fovea_types::position::Lsn;

/// One column of a relation.
#[derive(Clone, Debug)]
struct RelColumn {
    name: String,
    data_type: DataType,
    in_identity: bool,
}

/// A published table as the last Relation message described it.
#[derive(Clone, Debug)]
struct Relation {
    table: String,
    columns: Vec<RelColumn>,
    /// Replica identity: `d` default (primary key), `n` nothing, `f` full, `i` index.
    identity: u8,
}

/// When a transaction's messages stop being held in memory, and where the
/// rest goes.
#[derive(Clone, Debug)]
pub struct SpillConfig {
    /// Bytes of pgoutput messages of one transaction held (decoded) in
    /// memory; the messages after them are spilled. Decoded rows take about
    /// ten times their message's size.
    pub memory_bytes: usize,
    /// Directory of the temporary files (unnamed: nothing is left behind,
    /// even after a crash).
    pub dir: PathBuf,
}

impl Default for SpillConfig {
    fn default() -> Self {
        SpillConfig { memory_bytes: 8 << 20, dir: std::env::temp_dir() }
    }
}

/// A committed source transaction.
#[derive(Debug, Default)]
pub struct PgTransaction {
    /// Top-level transaction id (32 bits, as pgoutput sends it).
    pub xid: u32,
    /// LSN of the commit record.
    pub final_lsn: Lsn,
    /// LSN just past the commit record: a slot confirmed here will not send
    /// this transaction again.
    pub end_lsn: Lsn,
    /// Commit time, µs since the Unix epoch.
    pub commit_us: i64,
    /// Row changes in order; of a spilled transaction, the ones held in
    /// memory (the first).
    rows: Vec<RowChange>,
    /// Tables truncated, in order, with the index of the row they precede
    /// (among all rows, spilled ones included).
    pub truncates: Vec<(usize, String)>,
    /// Bytes of the messages decoded into `rows`.
    bytes: usize,
    /// The messages being spilled, while the transaction is received.
    spilling: Option<SpillWriter>,
    /// The rows after `rows`, once committed.
    spilled: Option<Spilled>,
}

/// Messages of a transaction being written to its spill file.
#[derive(Debug)]
struct SpillWriter {
    /// The decoder as it was before the first spilled message: what the
    /// spilled messages are decoded with, each time they are read.
    start: Box<PgOutputDecoder>,
    file: BufWriter<std::fs::File>,
    messages: u64,
}

/// The spilled rows of a committed transaction.
#[derive(Debug)]
struct Spilled {
    start: Box<PgOutputDecoder>,
    file: std::fs::File,
    messages: u64,
    rows: usize,
}

/// Reads spilled messages back, in order, decoding each with the decoder
/// state they were received in.
struct SpillReader {
    decoder: PgOutputDecoder,
    input: BufReader<std::fs::File>,
    left: u64,
}

impl SpillReader {
    fn open(spilled: &Spilled) -> Result<Self> {
        let mut file = spilled.file.try_clone()?;
        file.seek(SeekFrom::Start(0))?;
        Ok(SpillReader { decoder: spilled.start.scratch(), input: BufReader::new(file), left: spilled.messages })
    }

    /// The rows and the truncated tables of the next message.
    fn next_message(&mut self) -> Result<Option<(Vec<RowChange>, Vec<String>)>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        let mut head = [0u8; 12];
        self.input.read_exact(&mut head)?;
        let lsn = Lsn(u64::from_le_bytes(head[..8].try_into().unwrap_or_else(|_| unreachable!("8 bytes"))));
        let len = u32::from_le_bytes(head[8..].try_into().unwrap_or_else(|_| unreachable!("4 bytes"))) as usize;
        let mut data = vec![0u8; len];
        self.input.read_exact(&mut data)?;
        self.decoder.decode_in_transaction(lsn, &data)?;
        let txn =
            self.decoder.current.as_mut().unwrap_or_else(|| unreachable!("a scratch decoder is in a transaction"));
        let truncated = txn.truncates.drain(..).map(|(_, t)| t).collect();
        Ok(Some((std::mem::take(&mut txn.rows), truncated)))
    }
}

/// The rows of a transaction, in order, by value ([`PgTransaction::into_rows`]).
pub struct TxnRows {
    memory: std::vec::IntoIter<RowChange>,
    spilled: Option<SpillReader>,
    queue: VecDeque<RowChange>,
}

impl Iterator for TxnRows {
    type Item = Result<RowChange>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(r) = self.memory.next() {
            return Some(Ok(r));
        }
        loop {
            if let Some(r) = self.queue.pop_front() {
                return Some(Ok(r));
            }
            match self.spilled.as_mut()?.next_message() {
                Ok(Some((rows, _))) => self.queue.extend(rows),
                Ok(None) => {
                    self.spilled = None;
                    return None;
                }
                Err(e) => {
                    self.spilled = None;
                    return Some(Err(e));
                }
            }
        }
    }
}

impl PgTransaction {
    /// The transaction's identity in fovea's history (`xid:commit LSN`).
    pub fn identity(&self) -> String {
        format!("{}:{}", self.xid, self.final_lsn)
    }

    /// How many rows it changes.
    pub fn len(&self) -> usize {
        self.rows.len() + self.spilled_rows()
    }

    /// Whether it changes no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many of its rows were spilled to disk.
    pub fn spilled_rows(&self) -> usize {
        self.spilled.as_ref().map_or(0, |s| s.rows)
    }

    /// Calls `f` with every row, in order (spilled rows are decoded again).
    pub fn for_each_row(&self, mut f: impl FnMut(&RowChange)) -> Result<()> {
        self.rows.iter().for_each(&mut f);
        if let Some(spilled) = &self.spilled {
            let mut reader = SpillReader::open(spilled)?;
            while let Some((rows, _)) = reader.next_message()? {
                rows.iter().for_each(&mut f);
            }
        }
        Ok(())
    }

    /// Its rows by value, in order; an error (reading or decoding a
    /// spilled message) ends them.
    pub fn into_rows(self) -> Result<TxnRows> {
        let spilled = self.spilled.as_ref().map(SpillReader::open).transpose()?;
        Ok(TxnRows { memory: self.rows.into_iter(), spilled, queue: VecDeque::new() })
    }
}

/// Decodes pgoutput messages into whole transactions.
#[derive(Debug, Default)]
pub struct PgOutputDecoder {
    relations: HashMap<u32, Relation>,
    /// Primary keys by `schema.table`, from the catalog; they win over the
    /// relation's replica identity (which is every column under FULL).
    primary_keys: HashMap<String, Vec<String>>,
    current: Option<PgTransaction>,
    /// The LSN of the last change message and how many rows it carried so
    /// far (several rows share the LSN of a multi-insert record).
    last_change: (Lsn, u64),
    /// When to spill; `None`: never (the decoders that read spills back).
    spill: Option<SpillConfig>,
    /// The relation id the newest Relation message gave each table name
    /// (`schema.table`): a table dropped and created again, or another
    /// renamed to its name, shows here with a new id.
    relids: HashMap<String, u32>,
}

/// A big-endian reader over one message.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len()).ok_or_else(|| {
            format!("message ends at byte {} but {} more bytes were expected at byte {}", self.data.len(), n, self.at)
        })?;
        let s = &self.data[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn i16(&mut self) -> std::result::Result<i16, String> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().unwrap_or_else(|_| unreachable!("2 bytes"))))
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().unwrap_or_else(|_| unreachable!("4 bytes"))))
    }
    fn i32(&mut self) -> std::result::Result<i32, String> {
        Ok(self.u32()? as i32)
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().unwrap_or_else(|_| unreachable!("8 bytes"))))
    }
    fn cstr(&mut self) -> std::result::Result<String, String> {
        let rest = &self.data[self.at..];
        let n = rest.iter().position(|&b| b == 0).ok_or("unterminated string")?;
        let s = std::str::from_utf8(&rest[..n]).map_err(|e| format!("string is not UTF-8: {e}"))?.to_owned();
        self.at += n + 1;
        Ok(s)
    }
}

/// A tuple's values: `None` NULL, `Some(None)` unchanged TOAST, `Some(Some(text))`.
type Tuple = Vec<Option<Option<String>>>;

fn read_tuple(r: &mut Reader<'_>) -> std::result::Result<Tuple, String> {
    let n = r.i16()?;
    let mut out = Vec::with_capacity(n.max(0) as usize);
    for _ in 0..n {
        out.push(match r.u8()? {
            b'n' => None,
            b'u' => Some(None),
            b't' => {
                let len = r.i32()?;
                let bytes = r.take(usize::try_from(len).map_err(|_| format!("negative value length {len}"))?)?;
                Some(Some(std::str::from_utf8(bytes).map_err(|e| format!("value is not UTF-8: {e}"))?.to_owned()))
            }
            b'b' => return Err("binary tuple data: the slot must be read with binary 'false'".into()),
            k => return Err(format!("unknown tuple value kind {:?}", k as char)),
        });
    }
    Ok(out)
}

/// The Arrow type of a PostgreSQL type OID and typmod.
pub fn pg_type(oid: u32, typmod: i32) -> DataType {
    let name = match oid {
        16 => "boolean",
        17 => "bytea",
        20 | 26 => "bigint",
        21 => "smallint",
        23 => "integer",
        700 => "real",
        701 => "double precision",
        1082 => "date",
        1114 => "timestamp",
        1184 => "timestamptz",
        1700 if typmod >= 4 => {
            let (p, s) = (((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF);
            return sql_type(&format!("numeric({p},{s})")).unwrap_or(DataType::Utf8);
        }
        1700 => "numeric",
        _ => "text",
    };
    sql_type(name).unwrap_or(DataType::Utf8)
}

impl PgOutputDecoder {
    /// A decoder that has seen no relation yet, spilling transactions
    /// past [`SpillConfig::default`].
    pub fn new() -> Self {
        Self::with_spill(SpillConfig::default())
    }

    /// A decoder that has seen no relation yet, spilling transactions past
    /// `spill`.
    pub fn with_spill(spill: SpillConfig) -> Self {
        PgOutputDecoder { spill: Some(spill), ..Self::default() }
    }

    /// A decoder in the state this one is in, inside a transaction, that
    /// never spills: spilled messages are decoded with it.
    fn scratch(&self) -> PgOutputDecoder {
        PgOutputDecoder {
            relations: self.relations.clone(),
            primary_keys: self.primary_keys.clone(),
            current: Some(PgTransaction::default()),
            last_change: self.last_change,
            spill: None,
            relids: self.relids.clone(),
        }
    }

    /// The id of the relation the newest Relation message named `table`
    /// (`schema.table`), if one did in this session.
    pub fn relation_id(&self, table: &str) -> Option<u32> {
        self.relids.get(table).copied()
    }

    /// Sets the primary key of `table` (`schema.table`), from the catalog.
    pub fn set_primary_key(&mut self, table: &str, columns: Vec<String>) {
        self.primary_keys.insert(table.to_owned(), columns);
    }

    /// The decoder for a new decoding session (each peek of a slot is
    /// one): relations are described again, primary keys are kept.
    pub fn fresh_session(self) -> Self {
        PgOutputDecoder { primary_keys: self.primary_keys, spill: self.spill, ..Self::default() }
    }

    /// Whether a transaction's BEGIN came and its COMMIT did not yet.
    pub fn in_transaction(&self) -> bool {
        self.current.is_some()
    }

    /// Decodes one message written at `lsn`; returns the transaction its
    /// Commit message completes.
    pub fn decode(&mut self, lsn: Lsn, data: &[u8]) -> Result<Option<PgTransaction>> {
        if self.spills(data) {
            self.spill_message(lsn, data)?;
            return Ok(None);
        }
        let bytes = data.len();
        let Some(mut txn) = self.decode_in_transaction(lsn, data)? else {
            if let Some(txn) = self.current.as_mut() {
                txn.bytes += bytes;
            }
            return Ok(None);
        };
        if let Some(writer) = txn.spilling.take() {
            let file = writer.file.into_inner().map_err(|e| e.into_error())?;
            let mut spilled = Spilled { start: writer.start, file, messages: writer.messages, rows: 0 };
            // Read once now: a bad message is this transaction's error
            // (naming its position), the truncates get their row
            // indices, and this decoder takes the relations described
            // while spilling.
            let mut reader = SpillReader::open(&spilled)?;
            let mut at = txn.rows.len();
            while let Some((rows, truncated)) = reader.next_message()? {
                txn.truncates.extend(truncated.into_iter().map(|t| (at, t)));
                at += rows.len();
            }
            spilled.rows = at - txn.rows.len();
            self.relations = reader.decoder.relations;
            self.relids = reader.decoder.relids;
            self.last_change = reader.decoder.last_change;
            txn.spilled = Some(spilled);
        }
        Ok(Some(txn))
    }

    /// [`PgOutputDecoder::decode`] without spilling.
    fn decode_in_transaction(&mut self, lsn: Lsn, data: &[u8]) -> Result<Option<PgTransaction>> {
        let position = lsn.position();
        let txid = self.current.as_ref().map(|t| t.xid.to_string());
        self.decode_inner(lsn, data).map_err(|(table, m)| input_error(position, table.as_deref(), txid.as_deref(), m))
    }

    /// Whether `data` goes to the open transaction's spill file: a
    /// message inside a transaction (not its COMMIT) once the transaction
    /// holds its share of memory.
    fn spills(&self, data: &[u8]) -> bool {
        let (Some(txn), Some(spill)) = (&self.current, &self.spill) else { return false };
        data.first().is_some_and(|&k| k != b'C' && k != b'B')
            && (txn.spilling.is_some() || txn.bytes >= spill.memory_bytes)
    }

    fn spill_message(&mut self, lsn: Lsn, data: &[u8]) -> Result<()> {
        let position = lsn.position();
        let start = self.current.as_ref().filter(|t| t.spilling.is_none()).map(|_| Box::new(self.scratch()));
        let dir = self.spill.as_ref().map(|s| s.dir.clone()).unwrap_or_default();
        let txn = self.current.as_mut().unwrap_or_else(|| unreachable!("spills() checked a transaction is open"));
        let xid = txn.xid.to_string();
        let context = |e: std::io::Error| {
            input_error(position, None, Some(&xid), format!("spilling a large transaction to {}: {e}", dir.display()))
        };
        if let Some(start) = start {
            let file = tempfile::tempfile_in(&dir).map_err(context)?;
            tracing::debug!(xid = txn.xid, rows_in_memory = txn.rows.len(), "spilling the rest of a large transaction");
            txn.spilling = Some(SpillWriter { start, file: BufWriter::new(file), messages: 0 });
        }
        let len = u32::try_from(data.len())
            .map_err(|_| input_error(position, None, Some(&xid), "a pgoutput message over 4 GiB".to_owned()))?;
        let writer = txn.spilling.as_mut().unwrap_or_else(|| unreachable!("created above"));
        let written = writer
            .file
            .write_all(&lsn.0.to_le_bytes())
            .and_then(|()| writer.file.write_all(&len.to_le_bytes()))
            .and_then(|()| writer.file.write_all(data));
        written.map_err(context)?;
        writer.messages += 1;
        Ok(())
    }

    fn next_rowid(&mut self, lsn: Lsn) -> i64 {
        if self.last_change.0 == lsn {
            self.last_change.1 += 1;
        } else {
            self.last_change = (lsn, 0);
        }
        ((lsn.0 << 12) | (self.last_change.1 & 0xFFF)) as i64
    }

    fn decode_inner(
        &mut self,
        lsn: Lsn,
        data: &[u8],
    ) -> std::result::Result<Option<PgTransaction>, (Option<String>, String)> {
        let mut r = Reader { data, at: 0 };
        let plain = |m: String| (None, m);
        let kind = r.u8().map_err(plain)?;
        match kind {
            b'B' => {
                let final_lsn = Lsn(r.u64().map_err(plain)?);
                let commit_ts = r.u64().map_err(plain)? as i64;
                let xid = r.u32().map_err(plain)?;
                if let Some(open) = &self.current {
                    return Err(plain(format!("BEGIN of xid {xid} while xid {} is still open", open.xid)));
                }
                self.current = Some(PgTransaction {
                    xid,
                    final_lsn,
                    commit_us: commit_micros(commit_ts).map_err(plain)?,
                    ..PgTransaction::default()
                });
                Ok(None)
            }
            b'C' => {
                let _flags = r.u8().map_err(plain)?;
                let commit_lsn = Lsn(r.u64().map_err(plain)?);
                let end_lsn = Lsn(r.u64().map_err(plain)?);
                let commit_ts = r.u64().map_err(plain)? as i64;
                let mut txn = self.current.take().ok_or_else(|| plain("COMMIT without BEGIN".into()))?;
                if commit_lsn != txn.final_lsn {
                    return Err(plain(format!(
                        "COMMIT at {commit_lsn} does not match its BEGIN's final LSN {}",
                        txn.final_lsn
                    )));
                }
                txn.end_lsn = end_lsn;
                txn.commit_us = commit_micros(commit_ts).map_err(plain)?;
                Ok(Some(txn))
            }
            b'R' => {
                let id = r.u32().map_err(plain)?;
                let namespace = r.cstr().map_err(plain)?;
                let name = r.cstr().map_err(plain)?;
                let identity = r.u8().map_err(plain)?;
                let n = r.i16().map_err(plain)?;
                let mut columns = Vec::new();
                for _ in 0..n {
                    let flags = r.u8().map_err(plain)?;
                    let col = r.cstr().map_err(plain)?;
                    let oid = r.u32().map_err(plain)?;
                    let typmod = r.i32().map_err(plain)?;
                    columns.push(RelColumn { name: col, data_type: pg_type(oid, typmod), in_identity: flags & 1 == 1 });
                }
                let table = if namespace.is_empty() { name } else { format!("{namespace}.{name}") };
                self.relids.insert(table.clone(), id);
                self.relations.insert(id, Relation { table, columns, identity });
                Ok(None)
            }
            b'Y' | b'O' | b'M' => Ok(None),
            b'I' | b'U' | b'D' => {
                let id = r.u32().map_err(plain)?;
                let rel = self
                    .relations
                    .get(&id)
                    .ok_or_else(|| plain(format!("change for relation {id} before its Relation message")))?;
                let in_table = |m: String| (Some(rel.table.clone()), m);
                let mut old = None;
                let mut new = None;
                loop {
                    if r.at == data.len() {
                        break;
                    }
                    match r.u8().map_err(in_table)? {
                        b'K' | b'O' => old = Some(read_tuple(&mut r).map_err(in_table)?),
                        b'N' => new = Some(read_tuple(&mut r).map_err(in_table)?),
                        k => return Err(in_table(format!("unknown tuple tag {:?}", k as char))),
                    }
                }
                let rowid = self.next_rowid(lsn);
                let rows = self
                    .row_changes(id, kind, old, new, rowid)
                    .map_err(|m| (Some(rel_name(&self.relations, id)), m))?;
                let txn = self.current.as_mut().ok_or_else(|| plain("row change outside a transaction".into()))?;
                txn.rows.extend(rows);
                Ok(None)
            }
            b'T' => {
                let n = r.u32().map_err(plain)?;
                let _options = r.u8().map_err(plain)?;
                let mut names = Vec::new();
                for _ in 0..n {
                    let id = r.u32().map_err(plain)?;
                    names.push(rel_name(&self.relations, id));
                }
                let txn = self.current.as_mut().ok_or_else(|| plain("TRUNCATE outside a transaction".into()))?;
                let at = txn.rows.len();
                txn.truncates.extend(names.into_iter().map(|t| (at, t)));
                Ok(None)
            }
            k => Err(plain(format!("unknown pgoutput message {:?}", k as char))),
        }
    }

    fn row_changes(
        &self,
        id: u32,
        kind: u8,
        old: Option<Tuple>,
        new: Option<Tuple>,
        rowid: i64,
    ) -> std::result::Result<Vec<RowChange>, String> {
        let rel = &self.relations[&id];
        let mut key_names: Vec<String> = match self.primary_keys.get(&rel.table) {
            Some(k) => k.clone(),
            None if rel.identity == b'd' || rel.identity == b'i' => {
                rel.columns.iter().filter(|c| c.in_identity).map(|c| c.name.clone()).collect()
            }
            None => Vec::new(),
        };
        // Streamed rows of a table without a key get `LSN << 12 | n` as
        // their hidden row id (n: the row's place among rows of one WAL
        // record), copied rows their ordinal in the copy: the two never meet.
        // Their updates and deletes name the row by its whole old image,
        // which only REPLICA IDENTITY FULL sends: the sink finds the row.
        let keyless = key_names.is_empty();
        if keyless {
            if kind != b'I' && rel.identity != b'f' {
                return Err(format!(
                    "{} on a table without a primary key or replica identity FULL: its row cannot be found. Help: ALTER TABLE … REPLICA IDENTITY FULL, or add a primary key",
                    if kind == b'U' { "UPDATE" } else { "DELETE" }
                ));
            }
            key_names.push(ROWID_COLUMN.to_owned());
        }
        let columns = |t: &Tuple, keys_only: bool| -> std::result::Result<Columns, String> {
            if t.len() != rel.columns.len() {
                return Err(format!("tuple has {} values but the relation has {} columns", t.len(), rel.columns.len()));
            }
            Ok(rel
                .columns
                .iter()
                .zip(t)
                .filter(|(c, _)| !keys_only || key_names.contains(&c.name))
                .map(|(c, v)| (c.name.clone(), json_of(v, &c.data_type)))
                .collect())
        };
        let mut declared = rel
            .columns
            .iter()
            .map(|c| DeclaredColumn { name: c.name.clone(), data_type: c.data_type.clone(), nullable: true })
            .collect::<Vec<_>>();
        if keyless {
            declared.push(rowid_column());
        }
        let change = |op: RowOp, before: Option<Columns>, after: Option<Columns>| RowChange {
            table: SmolStr::new(&rel.table),
            op,
            key: None,
            before,
            after,
            txid: None,
            commit_us: None,
            snapshot: None,
            declared: Some(declared.clone()),
            key_names: Some(key_names.clone()),
            in_transaction_block: true,
            omits_nulls: false,
            typed: None,
        };
        let missing = |what: &str| format!("{} message without {what} tuple", kind as char);
        Ok(match kind {
            b'I' => {
                let mut after = columns(new.as_ref().ok_or_else(|| missing("a new"))?, false)?;
                if keyless {
                    after.push((ROWID_COLUMN.to_owned(), Json::from(rowid)));
                }
                vec![change(RowOp::Insert, None, Some(after))]
            }
            b'D' => {
                let old = old.ok_or_else(|| missing("an old"))?;
                vec![change(RowOp::Delete, Some(columns(&old, !keyless)?), None)]
            }
            _ if keyless => {
                let old = old.as_ref().ok_or_else(|| missing("an old"))?;
                let after = columns(new.as_ref().ok_or_else(|| missing("a new"))?, false)?;
                vec![change(RowOp::Update, Some(columns(old, false)?), Some(after))]
            }
            _ => {
                let after = columns(new.as_ref().ok_or_else(|| missing("a new"))?, false)?;
                let old_key = old.as_ref().map(|o| columns(o, true)).transpose()?;
                let key_of = |cols: &Columns| -> Vec<Json> {
                    key_names
                        .iter()
                        .map(|k| cols.iter().find(|(n, _)| n == k).map_or(Json::Null, |(_, v)| v.clone()))
                        .collect()
                };
                // A changed key is an update with the old key as its before
                // image (the engine moves the row): the unchanged TOAST
                // values of the new image are the old key's row's.
                match old_key {
                    Some(before) if key_of(&before) != key_of(&after) => {
                        vec![change(RowOp::Update, Some(before), Some(after))]
                    }
                    _ => vec![change(RowOp::Update, None, Some(after))],
                }
            }
        })
    }
}

fn rel_name(relations: &HashMap<u32, Relation>, id: u32) -> String {
    relations.get(&id).map_or_else(|| format!("relation {id}"), |r| r.table.clone())
}

/// The JSON the sink takes for a text value of type `t`.
fn json_of(v: &Option<Option<String>>, t: &DataType) -> Json {
    match v {
        None => Json::Null,
        Some(None) => Json::String(UNAVAILABLE.to_owned()),
        Some(Some(text)) => text_json(text.clone(), t),
    }
}

/// A value in PostgreSQL's text output as the sink takes it: the text
/// itself, but bytea's `\x…` hex as base64.
pub fn text_json(text: String, t: &DataType) -> Json {
    if *t == DataType::Binary
        && let Some(bytes) = text.strip_prefix("\\x").and_then(hex_bytes)
    {
        use base64::Engine as _;
        return Json::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    Json::String(text)
}

fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// An exported snapshot's visibility (`pg_current_snapshot()`:
/// `xmin:xmax:xip,…`, 64-bit transaction ids).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct XidSnapshot {
    /// Every transaction below is finished.
    pub xmin: u64,
    /// Every transaction at or above had not started.
    pub xmax: u64,
    /// Transactions in progress when the snapshot was taken.
    pub xip: Vec<u64>,
}

impl std::str::FromStr for XidSnapshot {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("snapshot {s:?} is not of the form xmin:xmax:xip,…");
        let mut parts = s.trim().splitn(3, ':');
        let xmin = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let xmax = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let xip = match parts.next() {
            Some("") | None => Vec::new(),
            Some(list) => {
                list.split(',').map(|x| x.trim().parse().map_err(|_| bad())).collect::<std::result::Result<_, _>>()?
            }
        };
        Ok(XidSnapshot { xmin, xmax, xip })
    }
}

impl XidSnapshot {
    /// Whether a transaction with 32-bit id `xid` that committed was
    /// visible to this snapshot. The epoch is taken from `xmax`: the
    /// transaction is within 2³¹ of it (wraparound protection ensures).
    pub fn sees(&self, xid: u32) -> bool {
        let epoch = self.xmax >> 32;
        let mut full = (epoch << 32) | u64::from(xid);
        if full > self.xmax && epoch > 0 && full - self.xmax > (1 << 31) {
            full -= 1 << 32;
        }
        full < self.xmin || (full < self.xmax && !self.xip.contains(&full))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation(id: u32, identity: u8, cols: &[(&str, u32, i32, bool)]) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(id.to_be_bytes());
        m.extend(b"public\0t\0");
        m.push(identity);
        m.extend((cols.len() as i16).to_be_bytes());
        for (name, oid, typmod, key) in cols {
            m.push(u8::from(*key));
            m.extend(name.as_bytes());
            m.push(0);
            m.extend(oid.to_be_bytes());
            m.extend(typmod.to_be_bytes());
        }
        m
    }

    fn tuple(values: &[Option<&str>]) -> Vec<u8> {
        let mut m = (values.len() as i16).to_be_bytes().to_vec();
        for v in values {
            match v {
                None => m.push(b'n'),
                Some("<toast>") => m.push(b'u'),
                Some(s) => {
                    m.push(b't');
                    m.extend((s.len() as i32).to_be_bytes());
                    m.extend(s.as_bytes());
                }
            }
        }
        m
    }

    fn begin(lsn: u64, xid: u32) -> Vec<u8> {
        let mut m = vec![b'B'];
        m.extend(lsn.to_be_bytes());
        m.extend(1_000_000i64.to_be_bytes());
        m.extend(xid.to_be_bytes());
        m
    }

    fn commit(lsn: u64, end: u64) -> Vec<u8> {
        let mut m = vec![b'C', 0];
        m.extend(lsn.to_be_bytes());
        m.extend(end.to_be_bytes());
        m.extend(2_000_000i64.to_be_bytes());
        m
    }

    #[test]
    fn decodes_a_transaction_with_key_change_toast_and_types() {
        let mut d = PgOutputDecoder::new();
        let cols = [("id", 23, -1, true), ("amount", 1700, (12 << 16) + 2 + 4, false), ("note", 25, -1, false)];
        assert!(d.decode(Lsn(1), &relation(7, b'd', &cols)).unwrap().is_none());
        d.decode(Lsn(10), &begin(100, 42)).unwrap();
        let mut ins = vec![b'I'];
        ins.extend(7u32.to_be_bytes());
        ins.push(b'N');
        ins.extend(tuple(&[Some("1"), Some("3.50"), None]));
        d.decode(Lsn(11), &ins).unwrap();
        let mut upd = vec![b'U'];
        upd.extend(7u32.to_be_bytes());
        upd.push(b'N');
        upd.extend(tuple(&[Some("1"), Some("4.00"), Some("<toast>")]));
        d.decode(Lsn(12), &upd).unwrap();
        let mut moved = vec![b'U'];
        moved.extend(7u32.to_be_bytes());
        moved.push(b'K');
        moved.extend(tuple(&[Some("1"), None, None]));
        moved.push(b'N');
        moved.extend(tuple(&[Some("2"), Some("4.00"), Some("<toast>")]));
        d.decode(Lsn(13), &moved).unwrap();
        let txn = d.decode(Lsn(14), &commit(100, 150)).unwrap().expect("committed");
        assert_eq!((txn.xid, txn.final_lsn, txn.end_lsn), (42, Lsn(100), Lsn(150)));
        assert_eq!(txn.commit_us, 2_000_000 + PG_EPOCH_OFFSET_US);
        let ops: Vec<RowOp> = txn.rows.iter().map(|r| r.op).collect();
        assert_eq!(ops, [RowOp::Insert, RowOp::Update, RowOp::Update]);
        assert_eq!(txn.rows[0].table, "public.t");
        assert_eq!(txn.rows[0].key_names.as_deref(), Some(&["id".to_owned()][..]));
        assert_eq!(txn.rows[0].declared.as_ref().unwrap()[1].data_type, DataType::Decimal128(12, 2));
        assert_eq!(txn.rows[1].after.as_ref().unwrap()[2].1, Json::String(UNAVAILABLE.into()));
        assert_eq!(txn.rows[2].before.as_ref().unwrap(), &vec![("id".to_owned(), Json::String("1".into()))]);
        assert_eq!(txn.rows[2].after.as_ref().unwrap()[0].1, Json::String("2".into()));
        assert_eq!((txn.len(), txn.spilled_rows()), (3, 0));
    }

    /// A transaction decoded by `d`, message by message from `lsn` on.
    fn decode_all(d: &mut PgOutputDecoder, lsn: u64, messages: &[Vec<u8>]) -> Result<Option<PgTransaction>> {
        let mut last = None;
        for (i, m) in messages.iter().enumerate() {
            last = d.decode(Lsn(lsn + i as u64), m)?;
        }
        Ok(last)
    }

    fn insert(rel: u32, values: &[Option<&str>]) -> Vec<u8> {
        let mut m = vec![b'I'];
        m.extend(rel.to_be_bytes());
        m.push(b'N');
        m.extend(tuple(values));
        m
    }

    #[test]
    fn a_spilled_transaction_reads_back_exactly_as_one_held_in_memory() {
        let cols = [("id", 23, -1, true), ("v", 25, -1, false)];
        let mut messages = vec![relation(7, b'd', &cols), begin(1000, 5)];
        for i in 0..40 {
            messages.push(insert(7, &[Some(&i.to_string()), Some("before")]));
        }
        // The table gains a column while the transaction is being spilled,
        // and is truncated: later messages decode with the new relation.
        messages.push(relation(7, b'd', &[("id", 23, -1, true), ("v", 25, -1, false), ("w", 20, -1, false)]));
        let mut truncate = vec![b'T'];
        truncate.extend(1u32.to_be_bytes());
        truncate.push(0);
        truncate.extend(7u32.to_be_bytes());
        messages.push(truncate);
        for i in 40..60 {
            messages.push(insert(7, &[Some(&i.to_string()), Some("after"), Some("9")]));
        }
        messages.push(commit(1000, 1010));
        let dir = tempfile::tempdir().unwrap();
        let mut small = PgOutputDecoder::with_spill(SpillConfig { memory_bytes: 200, dir: dir.path().into() });
        let mut held = PgOutputDecoder::with_spill(SpillConfig { memory_bytes: usize::MAX, dir: dir.path().into() });
        let spilled = decode_all(&mut small, 1, &messages).unwrap().expect("committed");
        let in_memory = decode_all(&mut held, 1, &messages).unwrap().expect("committed");
        assert!(spilled.spilled_rows() > 40, "{}", spilled.spilled_rows());
        assert_eq!((spilled.len(), in_memory.len(), in_memory.spilled_rows()), (60, 60, 0));
        assert_eq!(spilled.truncates, vec![(40, "public.t".to_owned())]);
        assert_eq!(spilled.truncates, in_memory.truncates);
        let mut seen = Vec::new();
        spilled.for_each_row(|r| seen.push(format!("{r:?}"))).unwrap();
        let read: Vec<String> = spilled.into_rows().unwrap().map(|r| format!("{:?}", r.unwrap())).collect();
        let expected: Vec<String> = in_memory.into_rows().unwrap().map(|r| format!("{:?}", r.unwrap())).collect();
        assert_eq!(seen, expected);
        assert_eq!(read, expected);
        assert!(read[59].contains("\"w\"") && !read[0].contains("\"w\""), "{}", read[59]);
        // The relation described while spilling holds for the next one.
        let next = decode_all(
            &mut small,
            100,
            &[begin(2000, 6), insert(7, &[Some("1"), None, Some("3")]), commit(2000, 2010)],
        );
        assert_eq!(next.unwrap().unwrap().len(), 1);
        // Nothing is left in the directory (the files are unnamed).
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_bad_spilled_message_is_an_error_naming_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = PgOutputDecoder::with_spill(SpillConfig { memory_bytes: 0, dir: dir.path().into() });
        let mut messages = vec![relation(7, b'd', &[("id", 23, -1, true)]), begin(1000, 5), insert(7, &[Some("1")])];
        messages.push(insert(9, &[Some("2")]));
        messages.push(commit(1000, 1010));
        let e = decode_all(&mut d, 0x1_0000_0000, &messages).unwrap_err().to_string();
        assert!(e.contains("1/3") && e.contains("relation 9"), "{e}");
        // A spill directory that does not exist is an error naming it.
        let missing = dir.path().join("missing");
        let mut d = PgOutputDecoder::with_spill(SpillConfig { memory_bytes: 0, dir: missing.clone() });
        let e = decode_all(&mut d, 1, &messages[..3]).unwrap_err().to_string();
        assert!(e.contains("spilling") && e.contains(&missing.display().to_string()), "{e}");
    }

    #[test]
    fn truncated_and_unknown_messages_are_errors_naming_the_lsn() {
        let mut d = PgOutputDecoder::new();
        let e = d.decode(Lsn(0x1_0000_0010), &[b'B', 0, 0]).unwrap_err().to_string();
        assert!(e.contains("1/10"), "{e}");
        let e = d.decode(Lsn(5), b"Z").unwrap_err().to_string();
        assert!(e.contains("unknown pgoutput message"), "{e}");
        let mut ins = vec![b'I'];
        ins.extend(9u32.to_be_bytes());
        let e = d.decode(Lsn(5), &ins).unwrap_err().to_string();
        assert!(e.contains("relation 9"), "{e}");
    }

    #[test]
    fn replica_identity_full_uses_the_primary_key_from_the_catalog() {
        let mut d = PgOutputDecoder::new();
        d.set_primary_key("public.t", vec!["id".into()]);
        d.decode(Lsn(1), &relation(7, b'f', &[("id", 20, -1, true), ("v", 25, -1, true)])).unwrap();
        d.decode(Lsn(2), &begin(3, 1)).unwrap();
        let mut upd = vec![b'U'];
        upd.extend(7u32.to_be_bytes());
        upd.push(b'O');
        upd.extend(tuple(&[Some("5"), Some("a")]));
        upd.push(b'N');
        upd.extend(tuple(&[Some("5"), Some("b")]));
        d.decode(Lsn(2), &upd).unwrap();
        let txn = d.decode(Lsn(4), &commit(3, 4)).unwrap().unwrap();
        assert_eq!(txn.rows.len(), 1);
        assert_eq!(txn.rows[0].op, RowOp::Update);
    }

    #[test]
    fn a_table_without_key_gets_row_ids_and_refuses_updates() {
        let mut d = PgOutputDecoder::new();
        d.set_primary_key("public.t", vec![]);
        d.decode(Lsn(1), &relation(7, b'd', &[("v", 25, -1, false)])).unwrap();
        d.decode(Lsn(2), &begin(9, 1)).unwrap();
        let mut ins = vec![b'I'];
        ins.extend(7u32.to_be_bytes());
        ins.push(b'N');
        ins.extend(tuple(&[Some("a")]));
        d.decode(Lsn(5), &ins).unwrap();
        d.decode(Lsn(5), &ins).unwrap();
        d.decode(Lsn(6), &ins).unwrap();
        let txn = d.decode(Lsn(9), &commit(9, 10)).unwrap().unwrap();
        let ids: Vec<Json> = txn.rows.iter().map(|r| r.after.as_ref().unwrap()[1].1.clone()).collect();
        assert_eq!(ids, [Json::from(5 << 12), Json::from((5 << 12) | 1), Json::from(6 << 12)]);
        assert_eq!(txn.rows[0].key_names.as_deref(), Some(&[ROWID_COLUMN.to_owned()][..]));
        d.decode(Lsn(11), &begin(12, 2)).unwrap();
        let mut del = vec![b'D'];
        del.extend(7u32.to_be_bytes());
        del.push(b'O');
        del.extend(tuple(&[Some("a")]));
        let e = d.decode(Lsn(11), &del).unwrap_err().to_string();
        assert!(e.contains("public.t") && e.contains("primary key"), "{e}");
    }

    #[test]
    fn snapshot_visibility_follows_xmin_xmax_and_in_progress() {
        let s: XidSnapshot = "100:105:101,103".parse().unwrap();
        assert!(s.sees(99) && s.sees(100) && s.sees(102) && s.sees(104));
        assert!(!s.sees(101) && !s.sees(103) && !s.sees(105) && !s.sees(200));
        // Across an epoch boundary: xmax in epoch 1, an old xid of epoch 0.
        let s = XidSnapshot { xmin: (1 << 32) + 5, xmax: (1 << 32) + 10, xip: vec![] };
        assert!(s.sees(u32::MAX - 3));
        assert!(s.sees(7) && !s.sees(12));
        assert!("1:2".parse::<XidSnapshot>().is_ok());
        assert!("x".parse::<XidSnapshot>().is_err());
        assert_eq!("0/16B3748".parse::<Lsn>().unwrap().to_string(), "0/16B3748");
    }
}
