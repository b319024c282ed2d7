//! The fuzz targets' bodies: what each target does with the bytes it is
//! given, for every decoder of untrusted input (Debezium, DMS, pgoutput,
//! the DDL parser, checkpoint manifests, index images, visibility
//! checkpoints, split tasks, the visibility RPC).
//!
//! Two drivers run them: cargo fuzz (`fuzz/`, libFuzzer on the nightly
//! toolchain, `scripts/fuzz.sh SECONDS`) mutates inputs to find new
//! findings; this crate's corpus test (`tests/corpus.rs`) replays every
//! seed and every input kept so far on the stable toolchain, in the
//! workspace's test build. [`seeds`] writes the seed inputs in the real
//! formats.
//!
//! Each body must return for any input, never panic nor hang: a decoder
//! answers bad bytes with an error.

pub mod seeds;

use std::sync::{Arc, OnceLock};

use arrow::datatypes::{DataType, Field, Schema};
use fovea_core::checkpoint::Manifest;
use fovea_core::error::Result;
use fovea_core::frozen::FrozenVisibility;
use fovea_core::index::{KeyBytes, PrimaryIndex, merge_images, upgrade_key};
use fovea_core::lake::Lake;
use fovea_core::split::SplitTask;
use fovea_core::{Engine, EngineConfig, Op, TableId, Value, rpc};

/// A fuzz target: its name (the directory of its corpus, the binary in
/// `fuzz/`) and its body.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// Name of the target, its corpus directory and its cargo-fuzz binary.
    pub name: &'static str,
    /// What the target does with one input.
    pub run: fn(&[u8]),
    /// Whether a panic that fovea itself catches (and turns into the
    /// operation's error) is allowed. Only where production code catches
    /// panics of a library on purpose (arrow-ipc on malformed streams, in
    /// a split task's scan); anywhere else any panic is a finding, caught
    /// or not.
    pub caught_panics_allowed: bool,
}

/// Every target, in the order `scripts/fuzz.sh` runs them.
pub const TARGETS: &[Target] = &[
    Target { name: "debezium", run: debezium, caught_panics_allowed: false },
    Target { name: "dms", run: dms, caught_panics_allowed: false },
    Target { name: "pgoutput", run: pgoutput, caught_panics_allowed: false },
    Target { name: "ddl", run: ddl, caught_panics_allowed: false },
    Target { name: "checkpoint_manifest", run: checkpoint_manifest, caught_panics_allowed: false },
    Target { name: "index_image", run: index_image, caught_panics_allowed: false },
    Target { name: "visibility_checkpoint", run: visibility_checkpoint, caught_panics_allowed: false },
    Target { name: "split_task", run: split_task, caught_panics_allowed: true },
    Target { name: "rpc", run: rpc_request, caught_panics_allowed: false },
];

/// Debezium records in every form (Kafka envelope, bare values, schema
/// envelopes, transaction metadata), decoded as Debezium and as detected.
pub fn debezium(data: &[u8]) {
    if let Ok(line) = std::str::from_utf8(data) {
        let at = fovea_core::cdc::SourcePosition { line: 1, offset: 0 };
        let _ = fovea_core::cdc::decode_line(line, at, fovea_core::cdc::InputFormat::Debezium);
        let _ = fovea_core::cdc::decode_line(line, at, fovea_core::cdc::InputFormat::Auto);
    }
}

/// AWS DMS records.
pub fn dms(data: &[u8]) {
    if let Ok(line) = std::str::from_utf8(data) {
        let at = fovea_core::cdc::SourcePosition { line: 1, offset: 0 };
        let _ = fovea_core::cdc::decode_line(line, at, fovea_core::cdc::InputFormat::Dms);
    }
}

/// pgoutput messages as a replication session delivers them: the input is
/// a sequence of messages, each a length byte and that many bytes, decoded
/// by one decoder in order (relations, then rows that refer to them).
pub fn pgoutput(data: &[u8]) {
    use fovea_core::cdc::pgoutput::{Lsn, PgOutputDecoder};
    let mut decoder = PgOutputDecoder::new();
    decoder.set_primary_key("public.t", vec!["id".into()]);
    let mut rest = data;
    let mut lsn = 1;
    while let Some((&len, tail)) = rest.split_first() {
        let (message, next) = tail.split_at((len as usize).min(tail.len()));
        let _ = decoder.decode(Lsn(lsn), message);
        lsn += 1;
        rest = next;
    }
}

/// The DDL parser of `--schema-file` and the type names it maps.
pub fn ddl(data: &[u8]) {
    if let Ok(sql) = std::str::from_utf8(data) {
        let _ = fovea_core::cdc::ddl::parse_ddl(sql);
        let _ = fovea_core::cdc::ddl::sql_type(sql);
    }
}

/// A checkpoint's manifest as a catalog returns it: parsed, then every
/// table's columns and key rebuilt as a restore or a reader does.
pub fn checkpoint_manifest(data: &[u8]) {
    let Ok(manifest) = serde_json::from_slice::<Manifest>(data) else { return };
    for (i, table) in manifest.tables.iter().enumerate() {
        let _ = table.def(TableId(i as u32));
    }
}

/// The input with its CRC-32 appended, so a decoder that checks the
/// checksum first reaches the parser behind it.
fn with_checksum(data: &[u8]) -> Vec<u8> {
    let mut bytes = data.to_vec();
    bytes.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    bytes
}

/// Keys of table 1 (an integer and a string) and table 2 (a boolean, a
/// float, a decimal and bytes), as a checkpoint's tables would have them.
fn upgrade(key: &[u8]) -> Result<KeyBytes> {
    static ONE: [DataType; 2] = [DataType::Int64, DataType::Utf8];
    static TWO: [DataType; 4] = [DataType::Boolean, DataType::Float64, DataType::Decimal128(38, 2), DataType::Binary];
    upgrade_key(key, |t| match t.0 {
        1 => Some(&ONE[..]),
        2 => Some(&TWO[..]),
        _ => None,
    })
}

/// The primary index images of a checkpoint: a base (format 1 to 3), a
/// delta applied to it, and a merge of a chain; keys of older formats
/// rewritten. The input is the body (its checksum appended), then the
/// input as stored.
pub fn index_image(data: &[u8]) {
    let bytes = with_checksum(data);
    if let Ok(mut index) = PrimaryIndex::read_from(&bytes, Some(&upgrade)) {
        let _ = index.apply_delta(&bytes, Some(&upgrade));
    }
    let _ = PrimaryIndex::new().apply_delta(&bytes, Some(&upgrade));
    let _ = merge_images(&[&bytes, &bytes]);
    let _ = PrimaryIndex::read_from(data, Some(&upgrade));
}

/// A visibility checkpoint object: the body with its checksum appended,
/// then the input as stored.
pub fn visibility_checkpoint(data: &[u8]) {
    let _ = FrozenVisibility::decode(&with_checksum(data), "fuzz");
    let _ = FrozenVisibility::decode(data, "fuzz");
}

/// A split task as a stateless worker receives it (JSON from a planner,
/// Flight or a Lambda event): parsed and run over an empty in-memory lake
/// — inline rows (Arrow IPC) and deleted-row bitmaps are decoded and
/// applied; objects it names are missing, which must be an error.
pub fn split_task(data: &[u8]) {
    static LAKE: OnceLock<Lake> = OnceLock::new();
    let lake = LAKE.get_or_init(|| Lake::new(Arc::new(object_store::memory::InMemory::new()))).clone();
    let Ok(task) = serde_json::from_slice::<SplitTask>(data) else { return };
    if let Ok(scan) = task.scan(lake) {
        for batch in scan {
            if batch.is_err() {
                break;
            }
        }
    }
}

/// The engine the RPC target asks: table `s.t`, 500 rows combined into
/// regular files, every 7th deleted, 50 more rows in flushed blocks and
/// 10 in memory (snapshots 1 to 4 exist).
fn rpc_engine() -> &'static Arc<Engine> {
    static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let build = || -> Result<Arc<Engine>> {
            let engine = Engine::in_memory(EngineConfig::default().with_shards(1).with_blocks(100, 2))?;
            let schema =
                Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Utf8, true)]);
            let t = engine.create_table("s.t", Arc::new(schema), vec![0])?.id;
            let insert = |keys: std::ops::Range<i64>| {
                keys.map(|k| Op::Insert { table: t, row: vec![Value::Int(k), Value::Utf8(format!("v{k}"))] })
                    .collect::<Vec<_>>()
            };
            engine.apply(insert(0..500))?;
            engine.flush()?;
            engine.combine()?;
            engine.apply((0..500).step_by(7).map(|k| Op::Delete { table: t, key: vec![Value::Int(k)] }).collect())?;
            engine.apply(insert(500..550))?;
            engine.flush()?;
            engine.apply(insert(550..560))?;
            Ok(engine)
        };
        build().unwrap_or_else(|e| panic!("the RPC target's engine: {e}"))
    })
}

/// The replayer's visibility RPC as a scan worker calls it: the first byte
/// picks the action (`fovea.bitmaps`, `fovea.split`, or an unknown one),
/// the rest is the request body. Any body gets an answer or an error.
pub fn rpc_request(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else { return };
    let action = match which % 3 {
        0 => rpc::BITMAPS,
        1 => rpc::SPLIT,
        _ => "fovea.unknown",
    };
    let _ = rpc::answer(rpc_engine(), action, body);
}
