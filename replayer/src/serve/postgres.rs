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
use fovea_core::cdc::pgoutput::{Lsn, PgOutputDecoder, PgTransaction, SpillConfig, XidSnapshot, pg_type, text_json};
use fovea_core::cdc::source::{ChangeSource, Lag, Polled, RecordSink};
use fovea_core::cdc::types::format_value;
use fovea_core::cdc::{ChangeRecord, DeclaredColumn, ROWID_COLUMN, RowChange, RowOp, SourcePosition, rowid_column};
use fovea_core::schema::{TypeChange, rows_from_batch};
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
    /// When a large transaction spills to disk while it arrives.
    pub spill: SpillConfig,
}

impl PgInput {
    /// Parses `postgres://…?slot=NAME&publication=NAME[&create_slot=true]
    /// [&sslmode=MODE&sslrootcert=FILE][&spill_bytes=N&spill_dir=DIR]`.
    pub fn parse(url: &str) -> CliResult<Self> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (tls, pairs) = PgTls::take_from(query.split('&').filter(|p| !p.is_empty()))?;
        let mut kept = Vec::new();
        let (mut slot, mut publication, mut create_slot) = (None, None, false);
        let mut spill = SpillConfig::default();
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
                "spill_bytes" => {
                    spill.memory_bytes =
                        v.parse().map_err(|_| format!("spill_bytes={v}: expected a number of bytes"))?;
                }
                "spill_dir" => spill.dir = v.into(),
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
        Ok(PgInput { conninfo, slot, publication, create_slot, tls, spill })
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

/// How far PostgreSQL's WAL is ahead of a checkpoint and of the slot,
/// read with no replayer running (`fovea status --input postgres://…`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotBacklog {
    /// The slot.
    pub slot: String,
    /// A replayer streams from the slot now.
    pub active: bool,
    /// The server's WAL position now.
    pub wal: Lsn,
    /// Where the slot is confirmed up to: WAL from there on is kept for it.
    pub confirmed: Option<Lsn>,
    /// Where a replayer starting from the checkpoint resumes (`None`: no
    /// checkpoint of this slot).
    pub checkpoint: Option<Lsn>,
}

impl SlotBacklog {
    /// Bytes of WAL the slot keeps (from `confirmed` to now).
    pub fn retained_bytes(&self) -> Option<u64> {
        self.confirmed.map(|c| self.wal.0.saturating_sub(c.0))
    }

    /// Bytes of WAL from the checkpoint to now.
    pub fn checkpoint_behind_bytes(&self) -> Option<u64> {
        self.checkpoint.map(|c| self.wal.0.saturating_sub(c.0))
    }
}

/// The slot of input `url` as the server has it now, and where
/// `checkpoint` (if it is of this slot) resumes.
pub fn slot_backlog(url: &str, checkpoint: Option<&fovea_core::cdc::source::Resume>) -> CliResult<SlotBacklog> {
    let input = PgInput::parse(url)?;
    let name = input.name();
    let mut client = connect(&input)?;
    let row = client
        .query_opt(
            "SELECT active, confirmed_flush_lsn::text, \
             (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text \
             FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()",
            &[&input.slot],
        )
        .map_err(|e| format!("{name}: {}", crate::replay::error_chain(&e)))?
        .ok_or_else(|| format!("{name}: replication slot {} does not exist in this database", input.slot))?;
    let lsn = |text: Option<String>| text.map(|t| t.parse::<Lsn>()).transpose();
    let wal = lsn(row.get(2))?.ok_or_else(|| format!("{name}: the server gave no WAL position"))?;
    Ok(SlotBacklog {
        slot: input.slot.clone(),
        active: row.get(0),
        wal,
        confirmed: lsn(row.get(1))?,
        checkpoint: checkpoint.filter(|c| c.input == name).map(|c| Lsn(c.position.offset)),
    })
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
    /// Mirror transactions this source made of its own (copies, and drops
    /// of tables gone from the source) so far: each is named by its number,
    /// so no two share an identity (one named like one applied before would
    /// be skipped as a duplicate).
    #[serde(default)]
    copies: u64,
    /// The relation id of each copied table when it was copied: rows of
    /// another relation under its name (the table dropped and created
    /// again, another renamed to its name) need a copy of their own.
    #[serde(default)]
    relids: BTreeMap<String, u32>,
    /// Tables that are gone from the source (dropped, renamed, or no longer
    /// published), with the relation id whose rows are moot from then on:
    /// the mirror dropped them; their rows still in the stream are skipped.
    #[serde(default)]
    gone: BTreeMap<String, u32>,
    /// The number (`attnum`) of each column of each copied table as last
    /// seen: a column of the same name with another number was dropped and
    /// added again, its old rows' values replaced by the new column's.
    #[serde(default)]
    attnums: BTreeMap<String, BTreeMap<String, i16>>,
}

/// The columns of the published tables as the catalog showed them once the
/// WAL reached `at` (every schema change committed before `at` is in them).
#[derive(Debug)]
struct CatalogSchemas {
    at: Lsn,
    /// `schema.table` → `(name, attnum, type)` in column order.
    tables: BTreeMap<String, Vec<(String, i16, arrow::datatypes::DataType)>>,
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
    /// The server ended the regular session (see [`session_ended`]) before
    /// the client noticed it closed: connect anew before the next query.
    client_lost: bool,
    /// A copy transaction is open in the sink (an error then is fatal:
    /// the sink cannot take a new transaction before its END).
    copy_open: bool,
    /// After a lost connection: when to try again, and the next delay.
    retry_at: Option<std::time::Instant>,
    /// Delays before reconnecting: exponential with jitter, begun at the
    /// first lost connection and dropped by a poll that went well.
    backoff: Option<backon::ExponentialBackoff>,
    last_publication_check: std::time::Instant,
    /// The catalog's columns, read at the last schema check (see
    /// [`PgSource::check_schemas`]).
    schemas: Option<CatalogSchemas>,
    /// What the stream delivered so far (diagnostics).
    counts: StreamCounts,
    last_counts_log: std::time::Instant,
}

/// What the replication stream delivered, for the log.
#[derive(Clone, Copy, Debug, Default)]
struct StreamCounts {
    /// Committed transactions received.
    received: u64,
    /// Received again (ending at or before the applied position): skipped.
    already_applied: u64,
    /// Rows dropped because an initial copy holds them.
    filtered_rows: u64,
    /// Keepalives that moved the applied position.
    keepalive_moves: u64,
    /// Transactions too big for memory, and their rows spilled to disk.
    spilled_transactions: u64,
    spilled_rows: u64,
}

/// First and longest delay before reconnecting after a lost connection.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(250);
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// Reconnect delays: from [`RETRY_FIRST`], doubling up to [`RETRY_MAX`],
/// each plus up to as much again of random jitter (clients of a restarted
/// server do not reconnect in step), never giving up.
fn reconnect_backoff() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::default()
        .with_min_delay(RETRY_FIRST)
        .with_max_delay(RETRY_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

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
            decoder: PgOutputDecoder::with_spill(input.spill.clone()),
            input,
            client,
            state,
            applied,
            confirmed,
            stream: None,
            stream_failed: false,
            client_lost: false,
            copy_open: false,
            retry_at: None,
            backoff: None,
            last_publication_check: std::time::Instant::now() - std::time::Duration::from_secs(3600),
            schemas: None,
            counts: StreamCounts::default(),
            last_counts_log: std::time::Instant::now(),
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
            // Not streaming (yet, or while reconnecting): advance the slot
            // directly. When that fails too (PostgreSQL is restarting, the
            // old session still holds the slot), the stream started next
            // reports the position as flushed: the checkpoint is committed,
            // so nothing is lost by confirming it later.
            None => {
                let advanced = if self.client.is_closed() {
                    Err("the connection is closed".to_owned())
                } else {
                    self.client
                        .query_one(
                            "SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)",
                            &[&self.input.slot, &lsn.to_string()],
                        )
                        .map(drop)
                        .map_err(|e| crate::replay::error_chain(&e))
                };
                if let Err(e) = advanced {
                    tracing::warn!("cannot confirm {lsn} to the slot now (confirmed when streaming resumes): {e}");
                }
            }
        }
        self.confirmed = lsn;
        Ok(())
    }

    /// Copies published tables not copied yet (at start, and when tables
    /// join the publication) as one transaction each time.
    pub fn copy_new_tables(&mut self, sink: &mut dyn RecordSink, engine: &Engine) -> CliResult<u64> {
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
        // Copied tables no longer published (dropped, renamed, taken out of
        // the publication): the stream carries no more of their changes.
        if published.is_empty()
            && self
                .client
                .query_opt("SELECT 1 FROM pg_publication WHERE pubname = $1", &[&self.input.publication])?
                .is_none()
        {
            // Not a publication that lists no tables: none at all. No table
            // is dropped for that.
            return Err(format!("publication {} no longer exists", self.input.publication).into());
        }
        let listed: BTreeSet<&String> = published.iter().collect();
        let left: Vec<String> = self.state.copied.iter().filter(|t| !listed.contains(t)).cloned().collect();
        if !left.is_empty() {
            self.forget_tables(&left, sink, engine)?;
        }
        let new: Vec<String> = published.into_iter().filter(|t| !self.state.copied.contains(t)).collect();
        if new.is_empty() {
            return Ok(0);
        }
        self.copy_tables(&new, sink, engine)
    }

    /// Drops `tables`, gone from the source (dropped, renamed away, no
    /// longer published), from the mirror in a mirror transaction of their
    /// own, and drops their rows the stream still holds (by relation id).
    /// A table of that name seen again is copied anew.
    fn forget_tables(&mut self, tables: &[String], sink: &mut dyn RecordSink, engine: &Engine) -> CliResult<()> {
        self.state.copies += 1;
        let identity = format!("gone:{}:{}", self.state.copies, self.applied);
        let position = self.applied.position();
        let mut begun = false;
        for table in tables {
            tracing::warn!(%table, "the table is gone from the source (dropped, renamed or no longer published): dropped from the mirror");
            self.state.copied.remove(table);
            self.state.attnums.remove(table);
            if let Some(relid) = self.state.relids.remove(table) {
                self.state.gone.insert(table.clone(), relid);
            }
            if engine.table(table).is_err() {
                continue;
            }
            if !begun {
                begun = true;
                let begin =
                    ChangeRecord::Begin { txid: identity.clone(), commit_us: Some(fovea_core::catalog::now_us()) };
                sink.push(begin, position, position)?;
                self.copy_open = true;
            }
            sink.push(ChangeRecord::Drop { table: table.clone(), txid: identity.clone() }, position, position)?;
        }
        sink.set_source_state(Some(self.state()));
        if begun {
            let end =
                ChangeRecord::End { txid: identity, event_count: Some(0), per_table: Vec::new(), commit_us: None };
            sink.push(end, position, position)?;
            self.copy_open = false;
        }
        Ok(())
    }

    /// Schema changes the stream does not show: pgoutput describes a table
    /// again only with its next changed row, so a column added (with a
    /// default or without), retyped, or dropped and added again under its
    /// name shows nowhere while no row of the table changes. Each check
    /// compares the mirror with the catalog as the previous check read it,
    /// once the stream has passed the WAL position read before it (so every
    /// change committed before that read was applied): a table whose
    /// columns or types differ, or one of whose columns has another number
    /// than when last seen, is copied again. (A change committed after the
    /// read may make a copy needless, never one missed: the next check sees
    /// it.)
    fn check_schemas(&mut self, sink: &mut dyn RecordSink, engine: &Engine) -> CliResult<()> {
        if let Some(read) = self.schemas.take_if(|r| self.applied >= r.at) {
            let mut stale = Vec::new();
            for (table, columns) in read.tables {
                if !self.state.copied.contains(&table) {
                    continue;
                }
                let Ok(def) = engine.table(&table) else { continue };
                let mirror: BTreeMap<&str, &arrow::datatypes::DataType> = def
                    .schema
                    .fields()
                    .iter()
                    .filter(|f| f.name() != ROWID_COLUMN)
                    .map(|f| (f.name().as_str(), f.data_type()))
                    .collect();
                let source: BTreeMap<&str, &arrow::datatypes::DataType> =
                    columns.iter().map(|(n, _, t)| (n.as_str(), t)).collect();
                let seen = self.state.attnums.get(&table);
                let renumbered = columns
                    .iter()
                    .find(|(n, a, _)| seen.and_then(|s| s.get(n)).is_some_and(|was| was != a))
                    .map(|(n, _, _)| n.clone());
                if mirror != source || renumbered.is_some() {
                    tracing::warn!(
                        %table,
                        dropped_and_added = renumbered.as_deref().unwrap_or(""),
                        "the table's columns changed at the source with no row changed since: copying the table again"
                    );
                    stale.push(table);
                } else {
                    let numbers = columns.into_iter().map(|(n, a, _)| (n, a)).collect();
                    self.state.attnums.insert(table, numbers);
                }
            }
            if !stale.is_empty() {
                self.copy_tables(&stale, sink, engine)?;
            }
        }
        if self.schemas.is_none() {
            match self.read_schemas() {
                Ok(read) => self.schemas = Some(read),
                // Read again at the next check (a lost connection shows in
                // the stream's reads).
                Err(e) => tracing::warn!("reading the published tables' columns: {}", crate::replay::error_chain(&*e)),
            }
        }
        Ok(())
    }

    /// The published tables' columns now, and the WAL position read just
    /// before them.
    fn read_schemas(&mut self) -> CliResult<CatalogSchemas> {
        let at = self.server_lsn()?;
        let rows = self.client.query(
            "SELECT p.schemaname || '.' || p.tablename, a.attname::text, a.attnum, a.atttypid::int8, a.atttypmod \
             FROM pg_publication_tables p \
             JOIN pg_namespace n ON n.nspname = p.schemaname \
             JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename \
             JOIN pg_attribute a ON a.attrelid = c.oid \
             WHERE p.pubname = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' \
             ORDER BY 1, a.attnum",
            &[&self.input.publication],
        )?;
        let mut tables: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for r in rows {
            let column = (r.get::<_, String>(1), r.get::<_, i16>(2), pg_type(r.get::<_, i64>(3) as u32, r.get(4)));
            tables.entry(r.get(0)).or_default().push(column);
        }
        Ok(CatalogSchemas { at, tables })
    }

    fn copy_tables(&mut self, tables: &[String], sink: &mut dyn RecordSink, engine: &Engine) -> CliResult<u64> {
        let mut copy = connect(&self.input)?;
        let mut txn = copy
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()?;
        // Each table is locked before the snapshot is taken (LOCK takes
        // none): a table rewrite (ALTER COLUMN … TYPE, TRUNCATE, VACUUM
        // FULL) committed after the snapshot but before the table was first
        // read would otherwise show the copy an empty table (such rewrites
        // are not MVCC-safe). One committed before the lock is in the
        // snapshot; none can commit while the copy holds the lock. A table
        // that no longer exists is not copied.
        let mut present = Vec::new();
        let mut gone = Vec::new();
        for table in tables {
            let mut locking = txn.savepoint("fovea_lock")?;
            match locking.batch_execute(&format!("LOCK TABLE {} IN ACCESS SHARE MODE", relation(table)?)) {
                Ok(()) => {
                    locking.commit()?;
                    present.push(table.clone());
                }
                Err(e) if is_undefined_relation(&e) => {
                    locking.rollback()?;
                    gone.push(table.clone());
                }
                Err(e) => return Err(e.into()),
            }
        }
        if !gone.is_empty() {
            // Rows of the relation the stream names it by are moot now.
            for table in &gone {
                if let Some(relid) = self.decoder.relation_id(table) {
                    self.state.relids.insert(table.clone(), relid);
                }
            }
            self.forget_tables(&gone, sink, engine)?;
        }
        if present.is_empty() {
            return Ok(0);
        }
        // The first statement after the locks takes the snapshot; the insert
        // position read with it bounds the commits the snapshot can see.
        let row = txn.query_one("SELECT pg_current_snapshot()::text, pg_current_wal_insert_lsn()::text", &[])?;
        let snapshot: XidSnapshot = row.get::<_, String>(0).parse()?;
        let until: Lsn = row.get::<_, String>(1).parse()?;
        self.state.copies += 1;
        let identity = format!("copy:{}:{}:{until}", self.state.copies, snapshot.xmax);
        let position = self.applied.position();
        sink.push(
            ChangeRecord::Begin { txid: identity.clone(), commit_us: Some(fovea_core::catalog::now_us()) },
            position,
            position,
        )?;
        // From here until END the sink's transaction is open: an error ends
        // the run (it resumes from the last checkpoint).
        self.copy_open = true;
        let mut rows = 0u64;
        let mut per_table = Vec::new();
        let mut relids = Vec::new();
        let mut attnums = Vec::new();
        for table in &present {
            let rel = relation(table)?;
            let relid: i64 = txn.query_one("SELECT $1::text::regclass::oid::int8", &[&rel])?.get(0);
            relids.push((table.clone(), relid as u32));
            let columns = txn.query(
                "SELECT attname::text, atttypid::int8, atttypmod, attnum FROM pg_attribute \
                 WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
                &[&rel],
            )?;
            attnums
                .push((table.clone(), columns.iter().map(|c| (c.get::<_, String>(0), c.get::<_, i16>(3))).collect()));
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
            // A table without a primary key is keyed by a hidden row id.
            let keyless = key.is_empty();
            let (declared, key) = if keyless {
                let mut d = declared;
                d.push(rowid_column());
                (d, vec![ROWID_COLUMN.to_owned()])
            } else {
                (declared, key)
            };
            let row_change = |after: Option<fovea_core::cdc::Columns>| RowChange {
                after,
                ..replace_record(table, &identity, declared.clone(), key.clone())
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
                    sink.push(ChangeRecord::Row(row_change(Some(after))), position, position)?;
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
        for (table, relid) in relids {
            self.state.gone.remove(&table);
            self.state.copied.insert(table.clone());
            self.state.relids.insert(table, relid);
        }
        self.state.attnums.extend(attnums);
        self.state.filters.push(CopyFilter { tables: present.iter().cloned().collect(), snapshot, until: until.0 });
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
    pub fn poll(&mut self, sink: &mut dyn RecordSink, engine: &Engine) -> CliResult<PollOutcome> {
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
                self.backoff = None;
                Ok(out)
            }
            Err(e) => {
                // The regular session ended too, or only the stream failed.
                let ended = self.client.is_closed() || session_ended(&*e);
                if self.copy_open || !(ended || self.stream_failed || self.client_lost) {
                    return Err(e);
                }
                self.client_lost |= ended;
                let delay = self.backoff.get_or_insert_with(reconnect_backoff).next().unwrap_or(RETRY_MAX);
                tracing::warn!(retry_in = ?delay, "PostgreSQL connection lost: {}", crate::replay::error_chain(&*e));
                self.stream = None;
                self.stream_failed = false;
                self.retry_at = Some(std::time::Instant::now() + delay);
                Ok(PollOutcome { disconnected: true, ..PollOutcome::default() })
            }
        }
    }

    fn poll_connected(&mut self, sink: &mut dyn RecordSink, engine: &Engine) -> CliResult<PollOutcome> {
        if self.client_lost || self.client.is_closed() {
            self.client = connect(&self.input)?;
            self.client_lost = false;
            tracing::info!("reconnected to PostgreSQL");
        }
        if self.last_publication_check.elapsed() >= std::time::Duration::from_secs(1) {
            self.copy_new_tables(sink, engine)?;
            self.check_schemas(sink, engine)?;
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
                        self.counts.keepalive_moves += 1;
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
        if self.last_counts_log.elapsed() >= std::time::Duration::from_secs(5) {
            self.last_counts_log = std::time::Instant::now();
            tracing::debug!(
                applied = %self.applied,
                confirmed = %self.confirmed,
                counts = ?self.counts,
                hwm = engine.clock().hwm().get(),
                "stream"
            );
        }
        Ok(out)
    }

    /// Hands one committed transaction to the sink (unless already applied),
    /// streaming its rows (a spilled transaction never is in memory whole).
    fn apply(
        &mut self,
        txn: PgTransaction,
        sink: &mut dyn RecordSink,
        engine: &Engine,
        out: &mut PollOutcome,
    ) -> CliResult<()> {
        self.counts.received += 1;
        // Received again after a restart: already applied.
        if txn.end_lsn <= self.applied {
            self.counts.already_applied += 1;
            return Ok(());
        }
        if txn.spilled_rows() > 0 {
            self.counts.spilled_transactions += 1;
            self.counts.spilled_rows += txn.spilled_rows() as u64;
            tracing::info!(
                xid = txn.xid,
                rows = txn.len(),
                spilled = txn.spilled_rows(),
                "a large transaction was spilled to disk while it arrived"
            );
        }
        let mut copy = BTreeSet::new();
        let mut added = BTreeSet::new();
        // Rows a copy already holds decide nothing: the copy has the table
        // as it was at its snapshot, which saw this transaction.
        let covered: BTreeSet<&str> = self
            .state
            .filters
            .iter()
            .filter(|f| f.snapshot.sees(txn.xid))
            .flat_map(|f| f.tables.iter().map(String::as_str))
            .collect();
        // A column whose new type the rows replicated so far cannot be
        // converted to exactly (`ALTER COLUMN … TYPE`): the table is copied
        // again, in the new type, instead of stopping the replica.
        txn.for_each_row(|r| {
            if copy.contains(&r.table) || covered.contains(r.table.as_str()) {
                return;
            }
            let relid = self.decoder.relation_id(&r.table);
            if relid.is_some() && relid == self.state.gone.get(r.table.as_str()).copied() {
                // A gone table's own rows: dropped (see `push_transaction`).
            } else if !self.state.copied.contains(r.table.as_str()) {
                copy.insert(r.table.clone());
            } else if let (Some(now), Some(&then)) = (relid, self.state.relids.get(r.table.as_str()))
                && now != then
            {
                tracing::warn!(table = %r.table, "another relation has the table's name (dropped and created again, or renamed to it): copying the table again");
                copy.insert(r.table.clone());
            } else if needs_copy_again(engine, r) {
                tracing::warn!(table = %r.table, "a column's type changed in a way that cannot be applied in place: copying the table again");
                copy.insert(r.table.clone());
            } else {
                added.extend(new_columns(engine, r).map(|c| (r.table.clone(), c)));
            }
        })?;
        // A column new to the mirror whose old rows PostgreSQL shows with
        // values the stream never carried (a renamed column, one added with
        // a default — kept as the "missing value" or written by a table
        // rewrite): the table is copied again. Old rows of a plain added
        // column are NULL, as the mirror reads them.
        for (table, column) in added {
            if !copy.contains(&table) && self.has_values(&table, &column) {
                tracing::warn!(%table, %column, "a new column holds values in rows the stream did not carry (renamed, or added with a default): copying the table again");
                copy.insert(table);
            }
        }
        if !copy.is_empty() {
            // Committed before the copy's snapshot: the copy holds it.
            let tables: Vec<String> = copy.into_iter().map(String::from).collect();
            self.copy_tables(&tables, sink, engine)?;
        }
        let end = txn.end_lsn;
        if self.push_transaction(txn, sink, engine)? {
            out.transactions += 1;
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

    /// Whether any row of `table` in the source has a value in `column`
    /// (asked when the column is new to the mirror). An error answers yes:
    /// copying again is always exact.
    fn has_values(&mut self, table: &str, column: &str) -> bool {
        let Some((schema_name, table_name)) = table.split_once('.') else { return true };
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM ONLY {}.{} WHERE {} IS NOT NULL)",
            quote_ident(schema_name),
            quote_ident(table_name),
            quote_ident(column)
        );
        match self.client.query_one(&sql, &[]) {
            Ok(row) => row.get(0),
            Err(e) => {
                tracing::debug!(%table, %column, error = %e, "checking a new column's values");
                true
            }
        }
    }

    /// Pushes `txn` to the sink as BEGIN, rows, END, row by row: without
    /// the rows of tables an initial copy already holds (it saw the
    /// transaction), and with each `TRUNCATE t` as deletes of t's rows
    /// live before the transaction (t's earlier rows in it are moot).
    /// Returns whether anything was pushed.
    fn push_transaction(
        &mut self,
        mut txn: PgTransaction,
        sink: &mut dyn RecordSink,
        engine: &Engine,
    ) -> CliResult<bool> {
        let covered: Vec<&CopyFilter> = self.state.filters.iter().filter(|f| f.snapshot.sees(txn.xid)).collect();
        let (gone, decoder) = (&self.state.gone, &self.decoder);
        let dropped = |table: &str| {
            covered.iter().any(|f| f.tables.contains(table))
                || gone.get(table).is_some_and(|&g| decoder.relation_id(table) == Some(g))
        };
        let truncates: Vec<(usize, String)> =
            std::mem::take(&mut txn.truncates).into_iter().filter(|(_, t)| !dropped(t)).collect();
        // A table's rows before its last truncate in the transaction are moot.
        let mut moot_before: BTreeMap<&str, usize> = BTreeMap::new();
        for (at, t) in &truncates {
            moot_before.insert(t, *at);
        }
        // Rows live before the transaction go at its first truncate of the
        // table; the scans are planned at the snapshot before it and read
        // as their turn comes.
        let mut wipes: Vec<(usize, String, fovea_core::Scan)> = Vec::new();
        if !truncates.is_empty() {
            sink.sync()?;
            let snapshot = engine.snapshot();
            for (at, table) in &truncates {
                if wipes.iter().any(|(_, t, _)| t == table) {
                    continue;
                }
                let Ok(def) = engine.table(table) else { continue };
                let options =
                    fovea_core::ScanOptions { projection: Some(def.primary_key.clone()), ..Default::default() };
                match engine.scan(&snapshot, table, options) {
                    Ok(scan) => wipes.push((*at, table.clone(), scan)),
                    // Not in the mirror at the snapshot: nothing to delete.
                    Err(fovea_core::Error::UnknownTable(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let mut records = TxnRecords::new(&txn);
        let mut wipes = wipes.into_iter().peekable();
        let (mut filtered, mut at) = (0u64, 0usize);
        for row in txn.into_rows()? {
            let row = row?;
            while let Some((_, table, scan)) = wipes.next_if(|(w, _, _)| *w <= at) {
                records.wipe(sink, engine, &table, scan)?;
            }
            at += 1;
            if dropped(&row.table) {
                filtered += 1;
            } else if moot_before.get(row.table.as_str()).is_none_or(|&m| at > m) {
                records.row(sink, row)?;
            }
        }
        for (_, table, scan) in wipes {
            records.wipe(sink, engine, &table, scan)?;
        }
        self.counts.filtered_rows += filtered;
        records.end(sink)
    }
}

/// One source transaction's records as they are pushed to the sink: BEGIN
/// before the first row, END with the counts after the last.
struct TxnRecords {
    identity: String,
    first: SourcePosition,
    end: SourcePosition,
    commit_us: i64,
    begun: bool,
    count: u64,
    per_table: Vec<(String, u64)>,
}

impl TxnRecords {
    fn new(txn: &PgTransaction) -> Self {
        TxnRecords {
            identity: txn.identity(),
            first: txn.final_lsn.position(),
            end: txn.end_lsn.position(),
            commit_us: txn.commit_us,
            begun: false,
            count: 0,
            per_table: Vec::new(),
        }
    }

    fn row(&mut self, sink: &mut dyn RecordSink, mut row: RowChange) -> CliResult<()> {
        if !self.begun {
            self.begun = true;
            let begin = ChangeRecord::Begin { txid: self.identity.clone(), commit_us: Some(self.commit_us) };
            sink.push(begin, self.first, self.first)?;
        }
        self.count += 1;
        match self.per_table.iter_mut().find(|(t, _)| *t == row.table) {
            Some((_, n)) => *n += 1,
            None => self.per_table.push((row.table.to_string(), 1)),
        }
        row.txid = Some(self.identity.as_str().into());
        sink.push(ChangeRecord::Row(row), self.first, self.first)?;
        Ok(())
    }

    /// Deletes of every row `scan` (of `table`'s key columns) reads.
    fn wipe(
        &mut self,
        sink: &mut dyn RecordSink,
        engine: &Engine,
        table: &str,
        scan: fovea_core::Scan,
    ) -> CliResult<()> {
        let def = engine.table(table)?;
        let names: Vec<String> = def.primary_key.iter().map(|&i| def.schema.field(i).name().clone()).collect();
        let types: Vec<_> = def.primary_key.iter().map(|&i| def.schema.field(i).data_type().clone()).collect();
        for batch in scan {
            for key in rows_from_batch(&batch?)? {
                let before = names
                    .iter()
                    .zip(&key)
                    .zip(&types)
                    .map(|((n, v), t)| (n.clone(), format_value(v, t).map_or(Json::Null, Json::String)))
                    .collect();
                let delete = RowChange {
                    table: table.into(),
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
                    omits_nulls: false,
                    typed: None,
                };
                self.row(sink, delete)?;
            }
        }
        Ok(())
    }

    /// Pushes END if anything was pushed; returns whether.
    fn end(self, sink: &mut dyn RecordSink) -> CliResult<bool> {
        if self.begun {
            let end = ChangeRecord::End {
                txid: self.identity,
                event_count: Some(self.count),
                per_table: self.per_table,
                commit_us: Some(self.commit_us),
            };
            sink.push(end, self.first, self.end)?;
        }
        Ok(self.begun)
    }
}

/// The columns `r` declares that its mirror table does not have (yet).
fn new_columns<'a>(engine: &Engine, r: &'a RowChange) -> impl Iterator<Item = String> + 'a {
    let def = engine.table(&r.table).ok();
    r.declared
        .iter()
        .flatten()
        .filter(move |c| def.as_ref().is_some_and(|d| d.schema.index_of(&c.name).is_err()))
        .map(|c| c.name.clone())
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
        checkpoint: Option<&fovea_core::cdc::source::Resume>,
        engine: std::sync::Arc<Engine>,
        metrics: Option<std::sync::Arc<super::metrics::Metrics>>,
    ) -> CliResult<Self> {
        let input = PgInput::parse(spec)?;
        let name = input.name();
        let resume = checkpoint.filter(|c| c.input == name).map(|c| (c.position, c.state.clone()));
        Ok(PgChangeSource { pg: PgSource::open(input, resume)?, name, engine, metrics, copied_once: false })
    }

    fn source_error(&self, e: Box<dyn std::error::Error + Send + Sync>) -> fovea_core::Error {
        into_core(e, &self.name)
    }
}

/// The boxed errors of the PostgreSQL input, as the core's: an input error
/// (a record's) stays one.
fn into_core(e: Box<dyn std::error::Error + Send + Sync>, input: &str) -> fovea_core::Error {
    match e.downcast::<fovea_core::Error>() {
        Ok(core) => *core,
        // The whole chain: a PostgreSQL error says only "db error" itself,
        // its source carries the server's message and SQLSTATE.
        Err(other) => {
            fovea_core::Error::Source { input: input.to_owned(), message: crate::replay::error_chain(&*other) }
        }
    }
}

impl ChangeSource for PgChangeSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn poll(&mut self, sink: &mut dyn RecordSink) -> fovea_core::Result<Polled> {
        if !self.copied_once {
            self.copied_once = true;
            let copied = self.pg.copy_new_tables(sink, &self.engine).map_err(|e| into_core(e, &self.name))?;
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

/// A copy's record of `table` (in the copy transaction `identity`) with
/// the columns the source declares and its key: as
/// [`ChangeRecord::Replace`], it gives the mirror table these columns and
/// no rows; with an after image, it is a copied row.
fn replace_record(table: &str, identity: &str, declared: Vec<DeclaredColumn>, key: Vec<String>) -> RowChange {
    RowChange {
        table: table.into(),
        op: RowOp::Insert,
        key: None,
        before: None,
        after: None,
        txid: Some(identity.into()),
        commit_us: None,
        snapshot: None,
        declared: Some(declared),
        key_names: Some(key),
        in_transaction_block: true,
        omits_nulls: false,
        typed: None,
    }
}

/// `"schema"."table"` of a `schema.table` name.
fn relation(table: &str) -> CliResult<String> {
    let (schema_name, table_name) = table.split_once('.').ok_or_else(|| format!("table name {table} has no schema"))?;
    Ok(format!("{}.{}", quote_ident(schema_name), quote_ident(table_name)))
}

/// Whether `e` (or an error in its chain) says the server ended the
/// session: the connection closed, or SQLSTATE class 08 (connection
/// exception) or 57 (operator intervention: the server shutting down or
/// restarting, the backend terminated, the server still starting up, a
/// statement cancelled). A query that fails so is retried on a new
/// connection. The client may not know yet that it closed: the server's
/// FATAL answers the query, and the connection ends after it.
fn session_ended(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(|e| {
        e.downcast_ref::<postgres::Error>().is_some_and(|pe| {
            pe.is_closed() || pe.code().is_some_and(|c| c.code().starts_with("08") || c.code().starts_with("57"))
        })
    })
}

/// Whether `e` says a table (or its schema) does not exist.
fn is_undefined_relation(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    e.code().is_some_and(|c| *c == SqlState::UNDEFINED_TABLE || *c == SqlState::INVALID_SCHEMA_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that, like `postgres::Error`, says little itself and the
    /// rest in its source.
    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("db error")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn input_errors_carry_their_whole_chain() {
        let e = Outer(std::io::Error::other("ERROR: replication slot \"s\" is active for PID 42"));
        let core = into_core(Box::new(e), "postgres://h/db#slot=s");
        let text = core.to_string();
        assert!(
            text.contains("postgres://h/db#slot=s") && text.contains("db error: ERROR: replication slot"),
            "{text}"
        );
    }

    #[test]
    fn reconnect_delays_grow_with_jitter_and_never_end() {
        let delays: Vec<_> = reconnect_backoff().take(50).collect();
        assert_eq!(delays.len(), 50, "never gives up");
        for (i, d) in delays.iter().enumerate() {
            // Doubling from RETRY_FIRST, capped at RETRY_MAX, plus jitter of
            // at most as much again.
            let base = (RETRY_FIRST * 2u32.pow(i.min(10) as u32)).min(RETRY_MAX);
            assert!(*d >= base && *d <= base * 2, "delay {i}: {d:?} outside [{base:?}, {:?}]", base * 2);
        }
        // Jitter: two schedules differ.
        assert_ne!(delays, reconnect_backoff().take(50).collect::<Vec<_>>());
    }

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
