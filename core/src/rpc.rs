//! The replayer's visibility RPC for stateless scan workers: request
//! bodies (JSON) parsed, checked and answered from the running engine.
//! The transport (Flight actions in `fovea serve`) only moves bytes and
//! maps [`RpcError`] to its status codes. Every input is validated — sizes,
//! ranges, names — into an error, never a panic (a fuzz target feeds it
//! arbitrary bodies).
//!
//! - [`BITMAPS`] `{"table","file","row_groups":[…],"qts"}` → one result
//!   per row group: its deleted-row bitmap as little-endian u64 words;
//! - [`SPLIT`] `{"table","qts"}` → first result JSON: regular files with
//!   their row groups, and flushed blocks, each naming its deleted-row
//!   bitmap as `"bitmap": k`, the index of the result that holds its
//!   little-endian u64 words; second result: the visible in-memory rows as
//!   an Arrow IPC stream; then the bitmaps. All of it comes from one view
//!   of each table part, so a block flushed or combined meanwhile is read
//!   exactly once.

use std::sync::Arc;

use serde::Deserialize;

use crate::buffer::{BlockData, FileKind, PartView};
use crate::engine::Engine;
use crate::{ScanOptions, Snapshot, Ts};

/// The action answering deleted-row bitmaps of row groups.
pub const BITMAPS: &str = "fovea.bitmaps";
/// The action answering a table's splits at a snapshot.
pub const SPLIT: &str = "fovea.split";
/// Most row groups one bitmap request may name.
pub const MAX_ROW_GROUPS: usize = 4096;

/// Why a request was not answered; the variants follow gRPC's codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// Malformed or out-of-limit request.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No such table or file.
    #[error("not found: {0}")]
    NotFound(String),
    /// A snapshot that is not (or no longer) readable.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// The object is not in the state the request needs.
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// The engine failed.
    #[error("internal: {0}")]
    Internal(String),
}

/// Answers `body` of `action` ([`BITMAPS`] or [`SPLIT`]) from `engine`.
pub fn answer(engine: &Arc<Engine>, action: &str, body: &[u8]) -> Result<Vec<Vec<u8>>, RpcError> {
    match action {
        BITMAPS => bitmaps(engine, &parse_body(body)?),
        SPLIT => split(engine, &parse_body(body)?),
        other => {
            Err(RpcError::InvalidArgument(format!("unknown action {other:?}: fovea serves {BITMAPS} and {SPLIT}")))
        }
    }
}

fn internal_arrow(e: arrow::error::ArrowError) -> RpcError {
    RpcError::Internal(e.to_string())
}

fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    serde_json::from_slice(body).map_err(|e| RpcError::InvalidArgument(format!("malformed request body: {e}")))
}

#[derive(Debug, Deserialize)]
struct BitmapRequest {
    table: String,
    file: u64,
    row_groups: Vec<usize>,
    qts: u64,
}

#[derive(Debug, Deserialize)]
struct SplitRequest {
    table: String,
    qts: u64,
}

/// A registered snapshot at `qts`, or a clear error when it is out of range.
fn snapshot_at(engine: &Engine, qts: u64) -> Result<Snapshot, RpcError> {
    engine.snapshot_at(Ts(qts)).map_err(|e| RpcError::OutOfRange(e.to_string()))
}

fn views(engine: &Engine, table: &str) -> Result<Vec<PartView>, RpcError> {
    engine.views(table).map(|(_, v)| v).map_err(|e| RpcError::NotFound(e.to_string()))
}

fn words_le(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn bitmaps(engine: &Engine, req: &BitmapRequest) -> Result<Vec<Vec<u8>>, RpcError> {
    if req.row_groups.len() > MAX_ROW_GROUPS {
        return Err(RpcError::InvalidArgument(format!(
            "{} row groups requested; at most {MAX_ROW_GROUPS} per request",
            req.row_groups.len()
        )));
    }
    let snapshot = snapshot_at(engine, req.qts)?;
    let file = views(engine, &req.table)?
        .into_iter()
        .flat_map(|v| v.files)
        .find(|f| f.id.0 == req.file)
        .ok_or_else(|| RpcError::NotFound(format!("table {} has no file {}", req.table, req.file)))?;
    let FileKind::Regular(regular) = &file.kind else {
        return Err(RpcError::FailedPrecondition(format!(
            "file {} is not a regular file yet; read it with fovea.split",
            req.file
        )));
    };
    let mut out = Vec::with_capacity(req.row_groups.len());
    let mut words = Vec::new();
    for &rg in &req.row_groups {
        let info = regular.row_groups.get(rg).ok_or_else(|| {
            RpcError::InvalidArgument(format!(
                "file {} has {} row groups, not {rg}",
                req.file,
                regular.row_groups.len()
            ))
        })?;
        file.vis
            .deleted_bitmap(info.offset, info.rows, snapshot.qts(), &mut words)
            .map_err(|e| RpcError::OutOfRange(e.to_string()))?;
        out.push(words_le(&words));
    }
    Ok(out)
}

fn split(engine: &Arc<Engine>, req: &SplitRequest) -> Result<Vec<Vec<u8>>, RpcError> {
    let snapshot = snapshot_at(engine, req.qts)?;
    let def = engine.table_at(&req.table, snapshot.qts()).map_err(|e| RpcError::NotFound(e.to_string()))?;
    let mut files = Vec::new();
    let mut memory_views = Vec::new();
    let mut words = Vec::new();
    // Results 0 and 1 are the head and the in-memory rows; bitmaps follow.
    let mut bitmaps: Vec<Vec<u8>> = Vec::new();
    let mut bitmap = |words: &[u64]| {
        bitmaps.push(words_le(words));
        bitmaps.len() + 1
    };
    let qts = snapshot.qts();
    let internal = |e: crate::Error| RpcError::Internal(e.to_string());
    for view in views(engine, &req.table)? {
        let mut memory_files = Vec::new();
        for file in view.files {
            match &file.kind {
                FileKind::Regular(r) => {
                    let mut groups = Vec::new();
                    for (i, info) in r.row_groups.iter().enumerate() {
                        file.vis.deleted_bitmap(info.offset, info.rows, qts, &mut words).map_err(internal)?;
                        groups.push(serde_json::json!({"row_group": i, "offset": info.offset, "rows": info.rows, "bitmap": bitmap(&words)}));
                    }
                    files
                        .push(serde_json::json!({"file": file.id.0, "path": r.path.to_string(), "row_groups": groups}));
                }
                FileKind::Virtual { blocks, sealed } => {
                    let mut flushed = Vec::new();
                    let mut in_memory = Vec::new();
                    let mut offset = 0;
                    for b in blocks {
                        match &b.data {
                            BlockData::Flushed(path) => {
                                file.vis.deleted_bitmap(offset, b.rows, qts, &mut words).map_err(internal)?;
                                flushed.push(serde_json::json!({"block": b.index, "path": path.to_string(), "offset": offset, "rows": b.rows, "bitmap": bitmap(&words)}));
                            }
                            BlockData::Memory(_) => in_memory.push(Arc::clone(b)),
                        }
                        offset += b.rows;
                    }
                    files.push(serde_json::json!({"file": file.id.0, "flushed_blocks": flushed}));
                    if !in_memory.is_empty() {
                        memory_files.push(crate::buffer::LakeFile {
                            id: file.id,
                            vis: Arc::clone(&file.vis),
                            kind: FileKind::Virtual { blocks: keep_offsets(blocks, &in_memory), sealed: *sealed },
                        });
                    }
                }
            }
        }
        memory_views.push(PartView { files: memory_files, active: view.active });
    }
    // The in-memory rows, visibility applied, from the same views.
    let scan = crate::scan::Scan::new(
        snapshot.clone(),
        engine.lake().clone(),
        Arc::clone(&def),
        memory_views,
        ScanOptions::default(),
    )
    .map_err(internal)?;
    let schema = scan.schema();
    let batches = scan.collect_batches().map_err(internal)?;
    let mut ipc = Vec::new();
    {
        let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut ipc, &schema).map_err(internal_arrow)?;
        for b in &batches {
            w.write(b).map_err(internal_arrow)?;
        }
        w.finish().map_err(internal_arrow)?;
    }
    let head = serde_json::json!({"table": req.table, "qts": qts.get(), "files": files, "memory_rows": batches.iter().map(|b| b.num_rows()).sum::<usize>()});
    let mut out = vec![head.to_string().into_bytes(), ipc];
    out.append(&mut bitmaps);
    Ok(out)
}

/// The blocks of a virtual file for a scan of its in-memory rows only.
/// Dropping the flushed blocks would shift the offsets of the later ones,
/// so they stay in the list marked newer than any snapshot: the scan skips
/// them unread (clients read them from their paths).
fn keep_offsets(
    all: &[Arc<crate::buffer::Block>],
    in_memory: &[Arc<crate::buffer::Block>],
) -> Vec<Arc<crate::buffer::Block>> {
    all.iter()
        .map(|b| {
            if in_memory.iter().any(|m| Arc::ptr_eq(m, b)) {
                Arc::clone(b)
            } else {
                Arc::new(crate::buffer::Block {
                    index: b.index,
                    rows: b.rows,
                    min_ts: Ts(u64::MAX),
                    max_ts: Ts(u64::MAX),
                    data: b.data.clone(),
                    writer: b.writer,
                })
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineConfig, Op, Value};
    use arrow::datatypes::{DataType, Field, Schema};

    /// 500 rows flushed and combined into files, every 7th deleted, 50 new
    /// rows in memory; the qts before and after the deletes.
    fn lake() -> (Arc<Engine>, u64, u64) {
        let engine = Engine::in_memory(EngineConfig::default().with_shards(1).with_blocks(100, 2)).unwrap();
        let schema =
            Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Int64, false)]);
        let t = engine.create_table("s.t", Arc::new(schema), vec![0]).unwrap().id;
        let insert = |keys: std::ops::Range<i64>| {
            keys.map(|k| Op::Insert { table: t, row: vec![Value::Int(k), Value::Int(k)] }).collect::<Vec<_>>()
        };
        engine.apply(insert(0..500)).unwrap();
        engine.flush().unwrap();
        assert!(engine.combine().unwrap() > 0);
        let before = engine.snapshot().qts().get();
        engine.apply((0..500).step_by(7).map(|k| Op::Delete { table: t, key: vec![Value::Int(k)] }).collect()).unwrap();
        engine.apply(insert(500..550)).unwrap();
        let after = engine.snapshot().qts().get();
        (engine, before, after)
    }

    fn ones(bytes: &[u8]) -> u32 {
        bytes.iter().map(|b| b.count_ones()).sum()
    }

    #[test]
    fn split_and_bitmaps_answer_with_the_rows_deleted_at_qts() {
        let (engine, before, after) = lake();
        let deleted = (0..500).step_by(7).count() as u32;
        for (qts, want) in [(before, 0), (after, deleted)] {
            let answer = split(&engine, &SplitRequest { table: "s.t".into(), qts }).unwrap();
            let head: serde_json::Value = serde_json::from_slice(&answer[0]).unwrap();
            let memory: usize = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(&answer[1]), None)
                .unwrap()
                .map(|b| b.unwrap().num_rows())
                .sum();
            assert_eq!(
                (head["memory_rows"].as_u64(), memory),
                (Some(memory as u64), if qts == after { 50 } else { 0 })
            );
            // Every bitmap is a result of its own, named by index; together
            // they hold every deleted row once.
            let mut bits = 0;
            let mut regular = 0;
            for file in head["files"].as_array().unwrap() {
                let parts = file.get("row_groups").or_else(|| file.get("flushed_blocks")).unwrap();
                for part in parts.as_array().unwrap() {
                    let words = &answer[part["bitmap"].as_u64().unwrap() as usize];
                    let rows = part["rows"].as_u64().unwrap() as usize;
                    assert_eq!(words.len(), rows.div_ceil(64) * 8, "{part}");
                    bits += ones(words);
                }
                if let Some(groups) = file.get("row_groups") {
                    regular += 1;
                    // fovea.bitmaps gives the same words for the same row groups.
                    let row_groups: Vec<usize> = (0..groups.as_array().unwrap().len()).collect();
                    let request = BitmapRequest {
                        table: "s.t".into(),
                        file: file["file"].as_u64().unwrap(),
                        row_groups: row_groups.clone(),
                        qts,
                    };
                    let words = bitmaps(&engine, &request).unwrap();
                    for (rg, w) in row_groups.iter().zip(&words) {
                        assert_eq!(w, &answer[groups[*rg]["bitmap"].as_u64().unwrap() as usize]);
                    }
                }
            }
            assert!(regular > 0, "{head}");
            assert_eq!(bits, want, "qts {qts}: {head}");
        }
        // A bad row group is named.
        let head: serde_json::Value =
            serde_json::from_slice(&split(&engine, &SplitRequest { table: "s.t".into(), qts: after }).unwrap()[0])
                .unwrap();
        let file = head["files"].as_array().unwrap().iter().find(|f| f.get("row_groups").is_some()).unwrap();
        let err = bitmaps(
            &engine,
            &BitmapRequest {
                table: "s.t".into(),
                file: file["file"].as_u64().unwrap(),
                row_groups: vec![99],
                qts: after,
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("not 99"), "{err}");
    }
}
