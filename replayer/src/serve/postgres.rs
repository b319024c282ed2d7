//! PostgreSQL logical replication as an input.
//!
//! The slot is read with the streaming replication protocol
//! ([`super::replication`], pgoutput proto 1): changes arrive as PostgreSQL
//! decodes them, so freshness is the decoding delay, not a poll interval.
//! The position reported as flushed is only ever one a committed fovea
//! checkpoint covers, so PostgreSQL keeps every WAL record fovea may still
//! need after a crash; transactions that arrive again after a restart are
//! skipped by their commit LSN. (A first version polled the slot over SQL
//! with `pg_logical_slot_peek_binary_changes`: every peek decoded the whole
//! unconfirmed window again, which forced a checkpoint every second and
//! still gave P50 freshness of ~380 ms under pgbench; streaming needs
//! neither.) Catalog queries, the initial copy and the WAL position for the
//! lag metric use an ordinary connection.
//!
//! Initial copy without loss or overlap: the slot is created first; then,
//! in one `REPEATABLE READ` transaction, fovea reads `pg_current_snapshot()`
//! and the WAL insert position, and copies the published tables. A streamed
//! transaction is visible to that snapshot exactly when its changes are in
//! the copy, so its rows of those tables are dropped; every transaction the
//! snapshot does not see committed after the slot's start and is streamed.
//! Once the stream passes the recorded WAL position no later transaction can
//! be visible to the snapshot and the filter is dropped. A table that joins
//! the publication later is copied the same way when it first shows.

use std::collections::{BTreeMap, BTreeSet};

use fovea_core::Engine;
use fovea_core::cdc::pgoutput::{
    Lsn, PgOutputDecoder, PgTransaction, ROWID_COLUMN, XidSnapshot, pg_type, rowid_column, text_json,
};
use fovea_core::cdc::source::{ChangeSource, Lag, Polled};
use fovea_core::cdc::types::format_value;
use fovea_core::cdc::{ChangeRecord, DeclaredColumn, RowChange, RowOp, SourcePosition};
use fovea_core::schema::{TypeChange, rows_from_batch};
use fovea_core::sink::Sink;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::replication::{Event, ReplicationStream};
use crate::replay::CliResult;
use crate::tls::{PgConnector, PgTls};

/// Rows fetched per round trip of the initial copy.
const COPY_BATCH: usize = 10_000;

/// Where to read: a connection string and the slot and publication names.
#[derive(Clone, Debug)]
pub struct PgInput {
    /// The connection string without fovea's own parameters.
    pub conninfo: String,
    /// Logical replication slot.
    pub slot: String,
    /// Publication the slot decodes.
    pub publication: String,
    /// Create the slot if it does not exist.
    pub create_slot: bool,
    /// TLS: `sslmode` and `sslrootcert` as libpq reads them.
    pub tls: PgTls,
}

impl PgInput {
    /// Parses `postgres://…?slot=NAME&publication=NAME[&create_slot=true]
    /// [&sslmode=MODE&sslrootcert=FILE]`.
    pub fn parse(url: &str) -> CliResult<Self> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (tls, pairs) = PgTls::take_from(query.split('&').filter(|p| !p.is_empty()))?;
        let mut kept = Vec::new();
        let (mut slot, mut publication, mut create_slot) = (None, None, false);
        for pair in pairs {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "slot" => slot = Some(v.to_owned()),
                "publication" => publication = Some(v.to_owned()),
                "create_slot" => {
                    create_slot = match v {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        other => return Err(format!("create_slot={other}: expected true or false").into()),
                    }
                }
                _ => kept.push(pair),
            }
        }
        let slot = slot.ok_or("the postgres input needs ?slot=NAME")?;
        let publication = publication.ok_or("the postgres input needs &publication=NAME")?;
        for (what, name) in [("slot", &slot), ("publication", &publication)] {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("{what} name {name:?}: use letters, digits and _").into());
            }
        }
        let conninfo = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        Ok(PgInput { conninfo, slot, publication, create_slot, tls })
    }

    /// The connection string for `postgres`, with the TLS mode it knows
    /// (the certificate checks are fovea's connector's).
    fn postgres_conninfo(&self) -> String {
        let sep = if self.conninfo.contains('?') { '&' } else { '?' };
        format!("{}{sep}{}", self.conninfo, self.tls.postgres_param())
    }

    /// The server, database and user, without the password (for errors).
    fn shown(&self) -> String {
        match self.conninfo.split_once('@') {
            Some((scheme_user, rest)) => {
                let user =
                    scheme_user.rsplit_once(':').filter(|(s, _)| s.contains("//")).map_or(scheme_user, |(u, _)| u);
                format!("{user}@{rest}")
            }
            None => self.conninfo.clone(),
        }
    }

    /// The input's name in checkpoints: the server and slot, without the
    /// password.
    pub fn name(&self) -> String {
        format!("{}#slot={}", self.shown(), self.slot)
    }
}

/// Rows of transactions a snapshot copy already holds are dropped.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct CopyFilter {
    tables: BTreeSet<String>,
    snapshot: XidSnapshot,
    /// No transaction committing at or after this WAL position is visible
    /// to the snapshot.
    until: u64,
}

/// What a checkpoint records for this source besides the position.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct PgState {
    /// Tables copied (by `schema.table`).
    copied: BTreeSet<String>,
    filters: Vec<CopyFilter>,
}

/// What one poll did.
#[derive(Clone, Copy, Debug, Default)]
pub struct PollOutcome {
    /// Transactions handed to the sink.
    pub transactions: u64,
    /// The connection to PostgreSQL was lost (a reconnect is scheduled).
    pub disconnected: bool,
    /// The applied position moved past WAL without changes for fovea.
    pub moved: bool,
}

/// A PostgreSQL logical replication slot followed by polling.
pub struct PgSource {
    input: PgInput,
    client: postgres::Client,
    decoder: PgOutputDecoder,
    state: PgState,
    /// End of the last transaction handed to the sink (or skipped).
    applied: Lsn,
    /// The slot's confirmed position as fovea last set it.
    confirmed: Lsn,
    /// The replication stream, started at the first poll.
    stream: Option<ReplicationStream>,
    /// The stream failed (or could not start): the connection is lost.
    stream_failed: bool,
    /// A copy transaction is open in the sink (an error then is fatal:
    /// the sink cannot take a new transaction before its END).
    copy_open: bool,
    /// After a lost connection: when to try again, and the next delay.
    retry_at: Option<std::time::Instant>,
    backoff: std::time::Duration,
    last_publication_check: std::time::Instant,
}

/// First and longest delay before reconnecting after a lost connection.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(250);
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// A poll hands the sink at most this many transactions…
const POLL_TRANSACTIONS: u64 = 4096;
/// …or reads for at most this long, so checkpoints and stops stay timely.
const POLL_TIME: std::time::Duration = std::time::Duration::from_millis(50);

fn connect(input: &PgInput) -> CliResult<postgres::Client> {
    let conninfo = input.postgres_conninfo();
    let connected = match PgConnector::new(&input.tls)? {
        Some(tls) => postgres::Client::connect(&conninfo, tls),
        None => postgres::Client::connect(&conninfo, postgres::NoTls),
    };
    // Named without the password.
    let mut client = connected
        .map_err(|e| format!("cannot connect to PostgreSQL ({}): {}", input.shown(), crate::replay::error_chain(&e)))?;
    // Text output in UTC and ISO, which the value parsers take.
    client.batch_execute("SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET extra_float_digits = 1")?;
    Ok(client)
}

impl PgSource {
    /// Connects, checks (or creates) the slot and publication, and resumes
    /// from a checkpoint's position and state.
    pub fn open(input: PgInput, resume: Option<(SourcePosition, Option<String>)>) -> CliResult<Self> {
        let mut client = connect(&input)?;
        let publication = client.query_opt("SELECT 1 FROM pg_publication WHERE pubname = $1", &[&input.publication])?;
        if publication.is_none() {
            return Err(format!(
                "publication {} does not exist: CREATE PUBLICATION {} FOR TABLE … (or FOR ALL TABLES)",
                input.publication, input.publication
            )
            .into());
        }
        let slot = client.query_opt(
            "SELECT plugin, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()",
            &[&input.slot],
        )?;
        let confirmed = match slot {
            Some(row) => {
                let plugin: String = row.get(0);
                if plugin != "pgoutput" {
                    return Err(format!("slot {} uses plugin {plugin}; fovea reads pgoutput", input.slot).into());
                }
                let lsn: Option<String> = row.get(1);
                lsn.map(|l| l.parse::<Lsn>()).transpose()?.unwrap_or_default()
            }
            None if input.create_slot => {
                let row = client.query_one(
                    "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                    &[&input.slot],
                )?;
                let lsn: String = row.get(0);
                tracing::info!(slot = %input.slot, %lsn, "created replication slot");
                lsn.parse::<Lsn>()?
            }
            None => {
                return Err(format!(
                    "replication slot {} does not exist; add &create_slot=true to create it",
                    input.slot
                )
                .into());
            }
        };
        let (applied, state) = match resume {
            Some((position, state)) => {
                let state = match state {
                    Some(s) => serde_json::from_str(&s).map_err(|e| format!("checkpointed source state: {e}"))?,
                    None => PgState::default(),
                };
                (Lsn(position.offset).max(confirmed), state)
            }
            None => (confirmed, PgState::default()),
        };
        Ok(PgSource {
            input,
            client,
            decoder: PgOutputDecoder::new(),
            state,
            applied,
            confirmed,
            stream: None,
            stream_failed: false,
            copy_open: false,
            retry_at: None,
            backoff: RETRY_FIRST,
            last_publication_check: std::time::Instant::now() - std::time::Duration::from_secs(3600),
        })
    }

    /// The position a checkpoint taken now resumes at.
    pub fn position(&self) -> SourcePosition {
        self.applied.position()
    }

    /// The state a checkpoint taken now records.
    pub fn state(&self) -> String {
        serde_json::to_string(&self.state).unwrap_or_else(|_| unreachable!("plain data serialises"))
    }

    /// End of the last transaction handed to the sink.
    pub fn applied(&self) -> Lsn {
        self.applied
    }

    /// The server's WAL insert position (how far the source is).
    pub fn server_lsn(&mut self) -> CliResult<Lsn> {
        let row = self.client.query_one("SELECT pg_current_wal_insert_lsn()::text", &[])?;
        Ok(row.get::<_, String>(0).parse::<Lsn>()?)
    }

    /// Confirms `position` (covered by a committed checkpoint) to the slot,
    /// so PostgreSQL may recycle the WAL before it.
    pub fn confirm(&mut self, position: SourcePosition) -> CliResult<()> {
        let lsn = Lsn(position.offset);
        if lsn <= self.confirmed {
            return Ok(());
        }
        match &mut self.stream {
            Some(stream) => {
                if let Err(e) = stream.confirm(lsn) {
                    // Reported again when the stream is back (it starts with
                    // this flushed position).
                    tracing::warn!("cannot confirm {lsn} to the slot now: {e}");
                    self.stream = None;
                }
            }
            // Not streaming yet (the slot is not in use): advance it directly.
            None => {
                self.client.query_one(
                    "SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)",
                    &[&self.input.slot, &lsn.to_string()],
                )?;
            }
        }
        self.confirmed = lsn;
        Ok(())
    }

    /// Copies published tables not copied yet (at start, and when tables
    /// join the publication) as one transaction each time.
    pub fn copy_new_tables(&mut self, sink: &mut Sink) -> CliResult<u64> {
        self.last_publication_check = std::time::Instant::now();
        let published: Vec<String> = self
            .client
            .query(
                "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1",
                &[&self.input.publication],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let new: Vec<String> = published.into_iter().filter(|t| !self.state.copied.contains(t)).collect();
        if new.is_empty() {
            return Ok(0);
        }
        self.copy_tables(&new, sink)
    }

    fn copy_tables(&mut self, tables: &[String], sink: &mut Sink) -> CliResult<u64> {
        let mut copy = connect(&self.input)?;
        let mut txn = copy
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()?;
        // The first statement takes the snapshot; the insert position read
        // after it bounds the commits the snapshot can see.
        let row = txn.query_one("SELECT pg_current_snapshot()::text, pg_current_wal_insert_lsn()::text", &[])?;
        let snapshot: XidSnapshot = row.get::<_, String>(0).parse()?;
        let until: Lsn = row.get::<_, String>(1).parse()?;
        let identity = format!("copy:{}:{until}", snapshot.xmax);
        let position = self.applied.position();
        sink.push(
            ChangeRecord::Begin { txid: identity.clone(), commit_us: Some(fovea_core::catalog::now_us()) },
            position,
            position,
        )?;
        let mut rows = 0u64;
        let mut per_table = Vec::new();
        for table in tables {
            let (schema_name, table_name) =
                table.split_once('.').ok_or_else(|| format!("table name {table} has no schema"))?;
            let rel = format!("{}.{}", quote_ident(schema_name), quote_ident(table_name));
            let columns = txn.query(
                "SELECT attname::text, atttypid::int8, atttypmod FROM pg_attribute \
                 WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
                &[&rel],
            )?;
            let declared: Vec<DeclaredColumn> = columns
                .iter()
                .map(|c| DeclaredColumn {
                    name: c.get(0),
                    data_type: pg_type(c.get::<_, i64>(1) as u32, c.get(2)),
                    nullable: true,
                })
                .collect();
            let key: Vec<String> = txn
                .query(
                    "SELECT a.attname::text FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid \
                     AND a.attnum = ANY(i.indkey::int2[]) WHERE i.indrelid = $1::text::regclass AND i.indisprimary \
                     ORDER BY array_position(i.indkey::int2[], a.attnum)",
                    &[&rel],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            self.decoder.set_primary_key(table, key.clone());
            // A table without a primary key is mirrored insert-only with a hidden row id.
            let keyless = key.is_empty();
            let (declared, key) = if keyless {
                let mut d = declared;
                d.push(rowid_column());
                (d, vec![ROWID_COLUMN.to_owned()])
            } else {
                (declared, key)
            };
            let row_change = |after: Option<fovea_core::cdc::Columns>| RowChange {
                table: table.clone(),
                op: RowOp::Insert,
                key: None,
                before: None,
                after,
                txid: Some(identity.clone()),
                commit_us: None,
                snapshot: None,
                declared: Some(declared.clone()),
                key_names: Some(key.clone()),
                in_transaction_block: true,
            };
            // An empty table exists in the mirror too; a table the mirror
            // has (copied again after a type change, or back in the
            // publication) gets exactly the copied rows, in the copied types.
            sink.push(ChangeRecord::Replace(Box::new(row_change(None))), position, position)?;
            let source_columns = if keyless { &declared[..declared.len() - 1] } else { &declared[..] };
            // Plain columns through the simple query protocol: PostgreSQL's
            // own text output (a cast to text would trim char(n) padding).
            let list: Vec<String> = source_columns.iter().map(|c| quote_ident(&c.name)).collect();
            txn.batch_execute(&format!(
                "DECLARE fovea_copy NO SCROLL CURSOR FOR SELECT {} FROM {rel}",
                list.join(", ")
            ))?;
            let mut n = 0u64;
            loop {
                let batch = txn.simple_query(&format!("FETCH {COPY_BATCH} FROM fovea_copy"))?;
                let mut fetched = 0;
                for message in &batch {
                    let postgres::SimpleQueryMessage::Row(r) = message else { continue };
                    fetched += 1;
                    let mut after: fovea_core::cdc::Columns = source_columns
                        .iter()
                        .enumerate()
                        .map(|(i, c)| {
                            let v = r.get(i).map(str::to_owned);
                            (c.name.clone(), v.map_or(Json::Null, |s| text_json(s, &c.data_type)))
                        })
                        .collect();
                    if keyless {
                        after.push((ROWID_COLUMN.to_owned(), Json::from(n)));
                    }
                    sink.push(ChangeRecord::Row(Box::new(row_change(Some(after)))), position, position)?;
                    n += 1;
                }
                if fetched == 0 {
                    break;
                }
            }
            txn.batch_execute("CLOSE fovea_copy")?;
            tracing::info!(table, rows = n, "copied");
            rows += n;
            per_table.push((table.clone(), n));
        }
        txn.commit()?;
        // The state that includes the copy must go with the checkpoint that
        // includes its transaction: set it before END is pushed.
        self.state.copied.extend(tables.iter().cloned());
        self.state.filters.push(CopyFilter { tables: tables.iter().cloned().collect(), snapshot, until: until.0 });
        sink.set_source_state(Some(self.state()));
        per_table.retain(|(_, n)| *n > 0);
        sink.push(
            ChangeRecord::End { txid: identity, event_count: Some(rows), per_table, commit_us: None },
            position,
            position,
        )?;
        self.copy_open = false;
        Ok(rows)
    }

    /// Reads what the slot has beyond what was applied and hands it to the
    /// sink, transaction by transaction. A lost connection is not an error:
    /// the outcome says so and the next polls reconnect, with growing
    /// delays, and resume after the last applied transaction.
    pub fn poll(&mut self, sink: &mut Sink, engine: &Engine) -> CliResult<PollOutcome> {
        if let Some(at) = self.retry_at {
            let now = std::time::Instant::now();
            if now < at {
                std::thread::sleep((at - now).min(POLL_TIME));
                return Ok(PollOutcome { disconnected: true, ..PollOutcome::default() });
            }
            self.retry_at = None;
        }
        match self.poll_connected(sink, engine) {
            Ok(out) => {
                self.backoff = RETRY_FIRST;
                Ok(out)
            }
            Err(e) if !self.copy_open && (self.stream_failed || self.client.is_closed()) => {
                tracing::warn!(retry_in = ?self.backoff, "PostgreSQL connection lost: {e}");
                self.stream = None;
                self.stream_failed = false;
                self.retry_at = Some(std::time::Instant::now() + self.backoff);
                self.backoff = (self.backoff * 2).min(RETRY_MAX);
                Ok(PollOutcome { disconnected: true, ..PollOutcome::default() })
            }
            Err(e) => Err(e),
        }
    }

    fn poll_connected(&mut self, sink: &mut Sink, engine: &Engine) -> CliResult<PollOutcome> {
        if self.client.is_closed() {
            self.client = connect(&self.input)?;
            tracing::info!("reconnected to PostgreSQL");
        }
        if self.last_publication_check.elapsed() >= std::time::Duration::from_secs(1) {
            self.copy_new_tables(sink)?;
        }
        let mut stream = match self.stream.take() {
            Some(s) => s,
            None => {
                // A new session describes every relation again.
                self.decoder = std::mem::take(&mut self.decoder).fresh_session();
                let s = ReplicationStream::start(&self.input, self.applied, self.confirmed)
                    .inspect_err(|_| self.stream_failed = true)?;
                tracing::info!(slot = %self.input.slot, from = %self.applied, "streaming");
                s
            }
        };
        let mut out = PollOutcome::default();
        let mut began = std::time::Instant::now();
        // The stream is put back only when reading went well: after an
        // error it is dropped (disconnected) with the error.
        // Wait up to POLL_TIME for the first message, then take what follows
        // without a pause.
        let mut wait = POLL_TIME;
        while out.transactions < POLL_TRANSACTIONS && began.elapsed() < POLL_TIME {
            let (lsn, data) = match stream.next(wait).inspect_err(|_| self.stream_failed = true)? {
                Event::Idle => break,
                Event::Keepalive(end) => {
                    // Everything before `end` was sent: with no transaction
                    // half-received, WAL up to it holds nothing more for us
                    // (vacuum, other databases…), so the slot may move past it.
                    if !self.decoder.in_transaction() && end > self.applied {
                        self.applied = end;
                        out.moved = true;
                    }
                    continue;
                }
                Event::Data(lsn, data) => (lsn, data),
            };
            if wait == POLL_TIME {
                // Data flows: read on for at most POLL_TIME from here.
                wait = std::time::Duration::from_millis(1);
                began = std::time::Instant::now();
            }
            let Some(txn) = self.decoder.decode(lsn, &data)? else { continue };
            self.apply(txn, sink, engine, &mut out)?;
        }
        self.stream = Some(stream);
        Ok(out)
    }

    /// Hands one committed transaction to the sink (unless already applied).
    fn apply(&mut self, txn: PgTransaction, sink: &mut Sink, engine: &Engine, out: &mut PollOutcome) -> CliResult<()> {
        // Received again after a restart: already applied.
        if txn.end_lsn <= self.applied {
            return Ok(());
        }
        let mut copy: BTreeSet<String> =
            txn.rows.iter().map(|r| r.table.clone()).filter(|t| !self.state.copied.contains(t)).collect();
        // A column whose new type the rows replicated so far cannot be
        // converted to exactly (`ALTER COLUMN … TYPE`): the table is copied
        // again, in the new type, instead of stopping the replica.
        for r in &txn.rows {
            if !copy.contains(&r.table) && needs_copy_again(engine, r) {
                tracing::warn!(table = %r.table, "a column's type changed in a way that cannot be applied in place: copying the table again");
                copy.insert(r.table.clone());
            }
        }
        if !copy.is_empty() {
            // Committed before the copy's snapshot: the copy holds it.
            let tables: Vec<String> = copy.into_iter().collect();
            self.copy_tables(&tables, sink)?;
        }
        let end = txn.end_lsn;
        let txn = self.filter(txn);
        let txn = self.expand_truncates(txn, sink, engine)?;
        if !txn.rows.is_empty() {
            out.transactions += 1;
            for (record, position, next) in txn.into_records() {
                sink.push(record, position, next)?;
            }
        }
        self.applied = end;
        // Filters no transaction from here on can match.
        let before = self.state.filters.len();
        self.state.filters.retain(|f| f.until > end.0);
        if self.state.filters.len() != before {
            sink.set_source_state(Some(self.state()));
        }
        Ok(())
    }

    /// Drops the rows a copy already holds.
    fn filter(&self, mut txn: PgTransaction) -> PgTransaction {
        if self.state.filters.is_empty() {
            return txn;
        }
        let covered: Vec<&CopyFilter> = self.state.filters.iter().filter(|f| f.snapshot.sees(txn.xid)).collect();
        if covered.is_empty() {
            return txn;
        }
        let dropped = |table: &str| covered.iter().any(|f| f.tables.contains(table));
        let mut kept = Vec::with_capacity(txn.rows.len());
        let mut truncates = Vec::new();
        let mut pending = txn.truncates.into_iter().peekable();
        for (i, row) in txn.rows.into_iter().enumerate() {
            while let Some((_, t)) = pending.next_if(|(at, _)| *at <= i) {
                if !dropped(&t) {
                    truncates.push((kept.len(), t));
                }
            }
            if !dropped(&row.table) {
                kept.push(row);
            }
        }
        for (_, t) in pending {
            if !dropped(&t) {
                truncates.push((kept.len(), t));
            }
        }
        txn.rows = kept;
        txn.truncates = truncates;
        txn
    }

    /// `TRUNCATE t` in a transaction: t's earlier rows in it are moot, and
    /// every row of t live before it is deleted.
    fn expand_truncates(&self, mut txn: PgTransaction, sink: &mut Sink, engine: &Engine) -> CliResult<PgTransaction> {
        if txn.truncates.is_empty() {
            return Ok(txn);
        }
        sink.sync()?;
        let truncates = std::mem::take(&mut txn.truncates);
        let mut rows = std::mem::take(&mut txn.rows).into_iter().enumerate().collect::<Vec<_>>();
        let mut deletes: BTreeMap<usize, Vec<RowChange>> = BTreeMap::new();
        for (at, table) in truncates {
            rows.retain(|(i, r)| *i >= at || r.table != table);
            let Ok(def) = engine.table(&table) else { continue };
            let snapshot = engine.snapshot();
            let batches = engine.scan(&snapshot, &table, fovea_core::ScanOptions::default())?.collect_batches()?;
            let names: Vec<String> = def.primary_key.iter().map(|&i| def.schema.field(i).name().clone()).collect();
            let types: Vec<_> = def.primary_key.iter().map(|&i| def.schema.field(i).data_type().clone()).collect();
            for b in &batches {
                for row in rows_from_batch(b)? {
                    let key = def.key_of(&row);
                    let before = names
                        .iter()
                        .zip(&key)
                        .zip(&types)
                        .map(|((n, v), t)| (n.clone(), format_value(v, t).map_or(Json::Null, Json::String)))
                        .collect();
                    deletes.entry(at).or_default().push(RowChange {
                        table: table.clone(),
                        op: RowOp::Delete,
                        key: None,
                        before: Some(before),
                        after: None,
                        txid: None,
                        commit_us: None,
                        snapshot: None,
                        declared: None,
                        key_names: Some(names.clone()),
                        in_transaction_block: true,
                    });
                }
            }
        }
        let mut out = Vec::new();
        let mut rows = rows.into_iter().peekable();
        for (at, dels) in deletes {
            while let Some((_, r)) = rows.next_if(|(i, _)| *i < at) {
                out.push(r);
            }
            out.extend(dels);
        }
        out.extend(rows.map(|(_, r)| r));
        txn.rows = out;
        Ok(txn)
    }
}

/// Whether a row declares a column type its mirror table cannot hold nor
/// be widened to in place ([`TypeChange::Recopy`]).
fn needs_copy_again(engine: &Engine, r: &RowChange) -> bool {
    let (Some(declared), Ok(def)) = (r.declared.as_ref(), engine.table(&r.table)) else { return false };
    declared.iter().any(|c| {
        def.schema.index_of(&c.name).is_ok_and(|i| {
            let current = def.schema.field(i).data_type();
            current != &c.data_type
                && TypeChange::of(current, &c.data_type, def.primary_key.contains(&i)) == TypeChange::Recopy
        })
    })
}

/// `"name"` with inner quotes doubled.
/// A [`PgSource`] as a [`ChangeSource`]: the first poll copies the
/// published tables not copied yet; lost connections are counted and
/// retried, not errors.
pub struct PgChangeSource {
    pg: PgSource,
    name: String,
    engine: std::sync::Arc<Engine>,
    metrics: Option<std::sync::Arc<super::metrics::Metrics>>,
    copied_once: bool,
}

impl PgChangeSource {
    /// Connects to the slot of `spec`, resuming after `checkpoint` when it
    /// read this slot.
    pub fn open(
        spec: &str,
        checkpoint: Option<&fovea_core::catalog::CheckpointRecord>,
        engine: std::sync::Arc<Engine>,
        metrics: Option<std::sync::Arc<super::metrics::Metrics>>,
    ) -> CliResult<Self> {
        let input = PgInput::parse(spec)?;
        let name = input.name();
        let resume = checkpoint.filter(|c| c.input == name).map(|c| (c.position, c.source_state.clone()));
        Ok(PgChangeSource { pg: PgSource::open(input, resume)?, name, engine, metrics, copied_once: false })
    }

    fn source_error(&self, e: impl std::fmt::Display) -> fovea_core::Error {
        fovea_core::Error::Source { input: self.name.clone(), message: e.to_string() }
    }
}

/// The boxed errors of the PostgreSQL input, as the core's: an input error
/// (a record's) stays one.
fn into_core(e: Box<dyn std::error::Error + Send + Sync>, input: &str) -> fovea_core::Error {
    match e.downcast::<fovea_core::Error>() {
        Ok(core) => *core,
        Err(other) => fovea_core::Error::Source { input: input.to_owned(), message: other.to_string() },
    }
}

impl ChangeSource for PgChangeSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn poll(&mut self, sink: &mut Sink) -> fovea_core::Result<Polled> {
        if !self.copied_once {
            self.copied_once = true;
            let copied = self.pg.copy_new_tables(sink).map_err(|e| into_core(e, &self.name))?;
            if copied > 0 {
                return Ok(Polled { records: copied, ..Polled::default() });
            }
        }
        let out = self.pg.poll(sink, &self.engine).map_err(|e| into_core(e, &self.name))?;
        if out.disconnected
            && let Some(m) = &self.metrics
        {
            m.error("postgres_connection");
        }
        Ok(Polled { records: out.transactions, moved: out.moved, end: None })
    }

    fn position(&self) -> SourcePosition {
        self.pg.position()
    }

    fn state_at(&mut self, _position: SourcePosition) -> fovea_core::Result<Option<String>> {
        // Transactions arrive whole and in commit order: the state is the
        // source's now.
        Ok(Some(self.pg.state()))
    }

    fn confirm(&mut self, position: SourcePosition) -> fovea_core::Result<()> {
        self.pg.confirm(position).map_err(|e| self.source_error(e))
    }

    fn lag(&mut self) -> Lag {
        let bytes = self.pg.server_lsn().ok().map(|l| l.0.saturating_sub(self.pg.applied().0));
        Lag { bytes, ..Lag::default() }
    }
}

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_input_url_and_hides_the_password() {
        let i = PgInput::parse(
            "postgres://u:secret@127.0.0.1:5432/db?slot=s1&publication=p1&create_slot=true&sslmode=disable",
        )
        .unwrap();
        assert_eq!((i.slot.as_str(), i.publication.as_str(), i.create_slot), ("s1", "p1", true));
        // TLS settings are not part of the input's name (checkpoints).
        assert_eq!(i.conninfo, "postgres://u:secret@127.0.0.1:5432/db");
        assert_eq!(i.postgres_conninfo(), "postgres://u:secret@127.0.0.1:5432/db?sslmode=disable");
        assert_eq!(i.name(), "postgres://u@127.0.0.1:5432/db#slot=s1");
        assert_eq!(i.tls.mode, crate::tls::SslMode::Disable);
        assert!(PgInput::parse("postgres://h/db?publication=p").is_err());
        assert!(PgInput::parse("postgres://h/db?slot=a;drop&publication=p").is_err());
    }
}
