//! `fovea status`: how a lake stands, in one screen or as JSON — from its
//! state store, its catalog and the objects they name alone: no engine is
//! restored and no reader registered, so it is cheap beside a running
//! replayer and works while none runs. With `--input`, also what the
//! input holds beyond the checkpoint: per Kinesis shard how far behind its
//! newest record the checkpoint's position is, for a PostgreSQL slot the
//! WAL bytes from the checkpoint and from the slot's confirmed position to
//! now — what a replayer starting now has to read first.

use std::collections::BTreeMap;
use std::io::Write;

use fovea_core::catalog::{CheckpointRecord, now_us};
use fovea_core::checkpoint::Manifest;
use fovea_core::identity::Access;
use fovea_core::mvcc::{Lease, PersistedClock, ReaderLease};
use serde_json::{Value, json};

use crate::lakes::LakeArgs;
use crate::replay::CliResult;

/// Everything `fovea status` reports, gathered first and then shown.
struct LakeStatus {
    lake: String,
    lake_id: Option<String>,
    now_us: i64,
    clock: PersistedClock,
    lease: Option<Lease>,
    readers: Vec<ReaderLease>,
    checkpoint: Option<CheckpointRecord>,
    /// Newest replayed transaction: mirror ts, source commit µs.
    newest: Option<(u64, Option<i64>)>,
    tables: Vec<TableStatus>,
    /// The input beyond the checkpoint (`--input`).
    input: Option<InputBacklog>,
}

/// What an input holds beyond a checkpoint.
enum InputBacklog {
    Kinesis {
        shards: Vec<fovea_aws::kinesis::ShardBacklog>,
        /// The stream consumer of `consumer=`, per stream (enhanced fan-out).
        consumers: Vec<fovea_aws::kinesis::ConsumerState>,
    },
    Postgres(crate::serve::postgres::SlotBacklog),
}

impl InputBacklog {
    /// Reads `spec`'s input as `checkpoint` leaves it.
    fn read(spec: &str, checkpoint: Option<&CheckpointRecord>) -> CliResult<Self> {
        let resume = checkpoint.map(CheckpointRecord::resume);
        if spec.starts_with("kinesis://") {
            let options = fovea_aws::kinesis::KinesisOptions::parse(spec, fovea_core::cdc::InputFormat::Auto, true)?;
            return Ok(InputBacklog::Kinesis {
                shards: fovea_aws::kinesis::checkpoint_backlog(&options, resume.as_ref())?,
                consumers: fovea_aws::kinesis::consumer_states(&options)?,
            });
        }
        if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
            return Ok(InputBacklog::Postgres(crate::serve::postgres::slot_backlog(spec, resume.as_ref())?));
        }
        Err(format!("--input {spec}: status reads a Kinesis stream (kinesis://…) or a PostgreSQL slot (postgres://…)")
            .into())
    }

    fn to_json(&self) -> Value {
        match self {
            InputBacklog::Kinesis { shards, consumers } => json!({
                "kind": "kinesis",
                "consumers": consumers.iter().map(|c| json!({
                    "stream": c.stream,
                    "name": c.name,
                    "status": c.status,
                    "arn": c.arn,
                })).collect::<Vec<_>>(),
                "shards": shards.iter().map(|s| json!({
                    "shard": s.shard,
                    "resumes": s.resumes,
                    "closed": s.closed,
                    "millis_behind": s.millis_behind,
                    "waiting": s.waiting,
                })).collect::<Vec<_>>(),
            }),
            InputBacklog::Postgres(p) => json!({
                "kind": "postgres",
                "slot": p.slot,
                "active": p.active,
                "wal_lsn": p.wal.to_string(),
                "confirmed_lsn": p.confirmed.map(|l| l.to_string()),
                "checkpoint_lsn": p.checkpoint.map(|l| l.to_string()),
                "retained_bytes": p.retained_bytes(),
                "checkpoint_behind_bytes": p.checkpoint_behind_bytes(),
            }),
        }
    }

    fn write_text(&self, out: &mut dyn Write) -> CliResult<()> {
        match self {
            InputBacklog::Kinesis { shards, consumers } => {
                let behind = shards.iter().filter_map(|s| s.millis_behind).max();
                writeln!(
                    out,
                    "input       {} shards; the checkpoint is {} behind the newest record",
                    shards.len(),
                    behind.map_or("nowhere".to_owned(), |ms| duration(ms as f64 / 1e3))
                )?;
                for s in shards {
                    let lag = match (s.millis_behind, s.waiting) {
                        (Some(ms), Some(true)) => {
                            format!("records waiting, {} behind the newest", duration(ms as f64 / 1e3))
                        }
                        (Some(_), _) => "nothing waiting".to_owned(),
                        (None, _) => "read to its end".to_owned(),
                    };
                    let closed = if s.closed { " (closed)" } else { "" };
                    writeln!(out, "  {:<40} resumes {}{closed}: {lag}", s.shard, s.resumes)?;
                }
                for c in consumers {
                    let how = match c.status.as_str() {
                        "ACTIVE" => "read by enhanced fan-out",
                        "not registered" => "a replayer registers it when it starts",
                        status if status.starts_with("unavailable") => "a replayer reads this stream by polling",
                        _ => "a replayer waits until it is active",
                    };
                    writeln!(out, "  consumer {} of stream {}: {} ({how})", c.name, c.stream, c.status)?;
                }
            }
            InputBacklog::Postgres(p) => {
                let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
                writeln!(
                    out,
                    "input       slot {} ({}); WAL now at {}, confirmed at {} ({} kept for the slot)",
                    p.slot,
                    if p.active { "streaming to a replayer" } else { "no replayer streaming" },
                    p.wal,
                    p.confirmed.map_or("nothing".to_owned(), |l| l.to_string()),
                    p.retained_bytes().map_or("none".to_owned(), mb),
                )?;
                match (p.checkpoint, p.checkpoint_behind_bytes()) {
                    (Some(at), Some(behind)) => {
                        writeln!(out, "            the checkpoint resumes at {at}: {} of WAL behind now", mb(behind))?
                    }
                    _ => writeln!(out, "            no checkpoint of this slot")?,
                }
            }
        }
        Ok(())
    }
}

/// One table at the lake's newest checkpoint.
struct TableStatus {
    name: String,
    dropped: bool,
    /// Files (regular and virtual).
    files: usize,
    /// Regular (combined) files among them.
    regular_files: usize,
    /// Flushed blocks of virtual files.
    blocks: usize,
    rows_stored: u64,
    /// Rows deleted as of the checkpoint (files whose count the checkpoint
    /// records).
    rows_deleted: u64,
    /// Files whose deleted share is at least the storage-GC threshold.
    files_past_gc_threshold: usize,
    /// Files with deleted rows whose count the checkpoint does not record
    /// (written by a fovea before it did): left out of `rows_deleted`.
    files_deleted_unknown: usize,
    /// The Iceberg snapshot its metadata names now, if published.
    iceberg: Option<fovea_iceberg::PublishedSnapshot>,
}

/// Prints the status of `lake` (as one JSON object with `json`); a file's
/// stale share at or past `gc_threshold` counts it as storage-GC backlog.
pub fn status(
    lake: &LakeArgs,
    input: Option<&str>,
    gc_threshold: f64,
    json: bool,
    out: &mut dyn Write,
) -> CliResult<()> {
    let mut status = gather(lake, gc_threshold)?;
    if let Some(spec) = input {
        status.input = Some(InputBacklog::read(spec, status.checkpoint.as_ref())?);
    }
    if json {
        writeln!(out, "{}", to_json(&status))?;
    } else {
        write_text(&status, gc_threshold, out)?;
    }
    Ok(())
}

fn gather(lake: &LakeArgs, gc_threshold: f64) -> CliResult<LakeStatus> {
    let backends = lake.existing_lake()?;
    let lake_id =
        fovea_core::identity::check(&backends.store, backends.txn.as_ref(), backends.catalog.as_ref(), Access::Read)?;
    let now = now_us();
    let clock = backends.txn.load()?;
    let lease = backends.txn.lease()?;
    let readers = backends.txn.readers(now)?;
    let checkpoint = backends.catalog.latest_checkpoint()?;
    let newest = backends.catalog.history(None, 1)?.into_iter().next().map(|h| (h.ts.get(), h.commit_us));
    let publisher = fovea_iceberg::Publisher::new(
        std::sync::Arc::clone(&backends.store),
        &lake.root_uri()?,
        fovea_iceberg::FormatVersion::V2,
    );
    let mut tables = Vec::new();
    if let Some(record) = &checkpoint {
        for (id, t) in record.manifest.tables.iter().enumerate() {
            // A dropped table's Iceberg directory may be a newer table's
            // of the same name: not read for it.
            let iceberg = if t.dropped { None } else { publisher.published(&t.name)? };
            tables.push(table_status(&record.manifest, id, gc_threshold, iceberg));
        }
    }
    Ok(LakeStatus {
        lake: lake.lake.clone(),
        lake_id,
        now_us: now,
        clock,
        lease,
        readers,
        checkpoint,
        newest,
        tables,
        input: None,
    })
}

/// Table `id` of `manifest`, its files counted.
fn table_status(
    manifest: &Manifest,
    id: usize,
    gc_threshold: f64,
    iceberg: Option<fovea_iceberg::PublishedSnapshot>,
) -> TableStatus {
    let mut t = TableStatus {
        name: manifest.tables[id].name.clone(),
        dropped: manifest.tables[id].dropped,
        files: 0,
        regular_files: 0,
        blocks: 0,
        rows_stored: 0,
        rows_deleted: 0,
        files_past_gc_threshold: 0,
        files_deleted_unknown: 0,
        iceberg,
    };
    for shard in &manifest.shards {
        let slots: BTreeMap<u64, &fovea_core::checkpoint::SlotManifest> =
            shard.slots.iter().map(|s| (s.file, s)).collect();
        for f in shard.parts.iter().filter(|p| p.table as usize == id).flat_map(|p| &p.files) {
            t.files += 1;
            let rows: u64 = match &f.regular {
                Some(r) => {
                    t.regular_files += 1;
                    r.row_groups.iter().map(|g| g[1]).sum()
                }
                None => {
                    t.blocks += f.blocks.len();
                    f.blocks.iter().map(|b| b.rows as u64).sum()
                }
            };
            t.rows_stored += rows;
            let slot = slots.get(&f.id);
            if slot.is_some_and(|s| s.deleted.is_some() && s.deleted_rows.is_none()) {
                t.files_deleted_unknown += 1;
            }
            let deleted = slot.and_then(|s| s.deleted_rows).unwrap_or(0) as u64;
            t.rows_deleted += deleted;
            // As storage GC counts them: one deleted row at least.
            if deleted > 0 && deleted as f64 / rows as f64 >= gc_threshold {
                t.files_past_gc_threshold += 1;
            }
        }
    }
    t
}

/// The lake's writer, as its lease says at `now`.
enum Writer<'l> {
    /// No lease was ever granted.
    None,
    /// Its holder ended it.
    Released(&'l Lease),
    /// Held, for this many seconds yet unless renewed.
    Held(&'l Lease, f64),
    /// Not renewed in time, this many seconds ago.
    Expired(&'l Lease, f64),
}

impl<'l> Writer<'l> {
    fn of(lease: Option<&'l Lease>, now: i64) -> Self {
        match lease {
            None => Writer::None,
            Some(l) if l.expires_us == 0 => Writer::Released(l),
            Some(l) if l.expires_us > now => Writer::Held(l, (l.expires_us - now) as f64 / 1e6),
            Some(l) => Writer::Expired(l, (now - l.expires_us) as f64 / 1e6),
        }
    }
}

fn to_json(s: &LakeStatus) -> Value {
    let (state, secs) = match Writer::of(s.lease.as_ref(), s.now_us) {
        Writer::None => ("none", None),
        Writer::Released(_) => ("released", None),
        Writer::Held(_, left) => ("held", Some(left)),
        Writer::Expired(_, since) => ("expired", Some(since)),
    };
    let checkpoint = s.checkpoint.as_ref().map(|c| {
        json!({
            "checkpoint_ts": c.manifest.checkpoint_ts,
            "input": c.input,
            "position": c.position.to_string(),
            "source_commit_us": c.manifest.source_commit_us,
        })
    });
    let tables: Vec<Value> = s
        .tables
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "dropped": t.dropped,
                "files": t.files,
                "regular_files": t.regular_files,
                "blocks": t.blocks,
                "rows_stored": t.rows_stored,
                "rows_deleted": t.rows_deleted,
                "files_past_gc_threshold": t.files_past_gc_threshold,
                "files_deleted_unknown": t.files_deleted_unknown,
                "iceberg": t.iceberg.as_ref().map(|i| json!({
                    "format_version": i.format_version,
                    "metadata_version": i.metadata_version,
                    "checkpoint_ts": i.checkpoint_ts,
                })),
            })
        })
        .collect();
    json!({
        "lake": s.lake,
        "lake_id": s.lake_id,
        "now_us": s.now_us,
        "writer": {
            "state": state,
            "owner": s.lease.as_ref().map(|l| l.owner.clone()),
            "epoch": s.lease.as_ref().map(|l| l.epoch),
            "expires_us": s.lease.as_ref().map(|l| l.expires_us),
            "seconds": secs,
        },
        "hwm": s.clock.hwm.get(),
        "lwm": s.clock.lwm.get(),
        "reserved": s.clock.reserved.get(),
        "checkpoint": checkpoint,
        "newest_replayed": s.newest.map(|(ts, commit)| json!({"ts": ts, "source_commit_us": commit})),
        "readers": s.readers.iter().map(|r| json!({"id": r.id, "ts": r.qts.get(), "expires_us": r.expires_us})).collect::<Vec<_>>(),
        "tables": tables,
        "input": s.input.as_ref().map(InputBacklog::to_json),
    })
}

fn write_text(s: &LakeStatus, gc_threshold: f64, out: &mut dyn Write) -> CliResult<()> {
    let time = fovea_core::cdc::types::format_timestamp;
    let ago = |us: i64| format!("{} ago", duration((s.now_us - us) as f64 / 1e6));
    writeln!(out, "lake        {} (id {})", s.lake, s.lake_id.as_deref().unwrap_or("not bound yet"))?;
    let writer = match Writer::of(s.lease.as_ref(), s.now_us) {
        Writer::None => "no writer yet".to_owned(),
        Writer::Held(l, left) => {
            format!("lease epoch {} held by {}, {} left unless renewed", l.epoch, l.owner, duration(left))
        }
        Writer::Released(l) => format!("none (lease epoch {} of {} released)", l.epoch, l.owner),
        Writer::Expired(l, since) => format!("lease epoch {} of {} expired {} ago", l.epoch, l.owner, duration(since)),
    };
    writeln!(out, "writer      {writer}")?;
    writeln!(
        out,
        "watermarks  HWM {}  LWM {}  reserved below {}",
        s.clock.hwm.get(),
        s.clock.lwm.get(),
        s.clock.reserved.get()
    )?;
    match &s.newest {
        Some((ts, Some(commit))) => {
            writeln!(out, "replayed    up to mirror ts {ts}: source commit {} UTC ({})", time(*commit), ago(*commit))?
        }
        Some((ts, None)) => writeln!(out, "replayed    up to mirror ts {ts} (no source commit time known)")?,
        None => writeln!(out, "replayed    nothing yet")?,
    }
    match &s.checkpoint {
        Some(c) => {
            let commit =
                c.manifest.source_commit_us.map_or_else(String::new, |us| format!(", source commit {} UTC", time(us)));
            writeln!(
                out,
                "checkpoint  mirror ts {} of {} at {}{commit}",
                c.manifest.checkpoint_ts, c.input, c.position
            )?;
        }
        None => writeln!(out, "checkpoint  none yet")?,
    }
    if let Some(input) = &s.input {
        input.write_text(out)?;
    }
    match s.readers.iter().min_by_key(|r| r.qts) {
        Some(oldest) => writeln!(
            out,
            "readers     {} registered; the oldest reads ts {} ({})",
            s.readers.len(),
            oldest.qts.get(),
            oldest.id
        )?,
        None => writeln!(out, "readers     none registered")?,
    }
    let live: Vec<&TableStatus> = s.tables.iter().filter(|t| !t.dropped).collect();
    writeln!(
        out,
        "tables      {} ({} dropped); storage-GC backlog: {} files with ≥ {:.0}% of their rows deleted",
        live.len(),
        s.tables.len() - live.len(),
        live.iter().map(|t| t.files_past_gc_threshold).sum::<usize>(),
        gc_threshold * 100.0
    )?;
    let checkpoint_ts = s.checkpoint.as_ref().map(|c| c.manifest.checkpoint_ts);
    for t in live {
        let share = if t.rows_stored == 0 { 0.0 } else { t.rows_deleted as f64 * 100.0 / t.rows_stored as f64 };
        let iceberg = match &t.iceberg {
            None => "not published".to_owned(),
            Some(i) => match (i.checkpoint_ts, checkpoint_ts) {
                (Some(p), Some(c)) if p == c => format!("Iceberg v{} at the checkpoint", i.format_version),
                (Some(p), Some(c)) if p > c => {
                    format!("Iceberg v{} at checkpoint {p}, past this one", i.format_version)
                }
                (Some(p), _) => format!("Iceberg v{} at checkpoint {p} (behind)", i.format_version),
                (None, _) => format!("Iceberg v{}, no snapshot", i.format_version),
            },
        };
        writeln!(
            out,
            "  {:<32} {:>4} files ({} combined) {:>5} blocks {:>12} rows stored {:>5.1}% deleted {:>3} past GC  {iceberg}",
            t.name, t.files, t.regular_files, t.blocks, t.rows_stored, share, t.files_past_gc_threshold
        )?;
        if t.files_deleted_unknown > 0 {
            writeln!(
                out,
                "  {:<32} ({} files' deleted rows not counted: their checkpoint does not record how many)",
                "", t.files_deleted_unknown
            )?;
        }
    }
    Ok(())
}

/// `secs` as people read it: seconds, minutes, hours or days.
fn duration(secs: f64) -> String {
    match secs {
        s if s < 120.0 => format!("{s:.1} s"),
        s if s < 7_200.0 => format!("{:.1} min", s / 60.0),
        s if s < 172_800.0 => format!("{:.1} h", s / 3_600.0),
        s => format!("{:.1} days", s / 86_400.0),
    }
}
