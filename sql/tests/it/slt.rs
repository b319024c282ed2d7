//! SQL behaviour pinned in sqllogictest files (`tests/slt/*.slt`) on a lake
//! replayed from the real pg-tiny change stream. Values are rendered as
//! PostgreSQL prints them; NULL as `NULL`. `EXPLAIN` output is reduced to
//! its `TableScan` lines, so filter and projection pushdown regressions
//! show without pinning the optimizer's other choices.
//! `SET fovea.as_of = TS` / `RESET fovea.as_of` switch queries to time travel.

use std::path::Path;
use std::sync::Arc;

use fovea_core::cdc::source::LineSource;
use fovea_core::cdc::types::format_value;
use fovea_core::cdc::{InputFormat, decode_line};
use fovea_core::location::{OpenMode, open_lake};
use fovea_core::schema::rows_from_batch;
use fovea_core::sink::{Sink, SinkConfig};
use fovea_core::{Engine, EngineConfig, Ts};
use sqllogictest::{DBOutput, DefaultColumnType};

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct SltError(String);

struct FoveaDb {
    engine: Arc<Engine>,
    as_of: Option<u64>,
    runtime: tokio::runtime::Runtime,
}

impl sqllogictest::DB for FoveaDb {
    type Error = SltError;
    type ColumnType = DefaultColumnType;

    fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SltError> {
        let trimmed = sql.trim().trim_end_matches(';');
        if let Some(ts) = trimmed.strip_prefix("SET fovea.as_of = ") {
            self.as_of = Some(ts.trim().parse().map_err(|e| SltError(format!("{e}")))?);
            return Ok(DBOutput::StatementComplete(0));
        }
        if trimmed == "RESET fovea.as_of" {
            self.as_of = None;
            return Ok(DBOutput::StatementComplete(0));
        }
        let snapshot = match self.as_of {
            Some(ts) => self.engine.snapshot_at(Ts(ts)).map_err(|e| SltError(e.to_string()))?,
            None => self.engine.snapshot(),
        };
        let batches = self
            .runtime
            .block_on(fovea_sql::query(&self.engine, &snapshot, sql))
            .map_err(|e| SltError(e.to_string()))?;
        let explain = trimmed.to_ascii_uppercase().starts_with("EXPLAIN");
        let mut rows = Vec::new();
        let mut types = Vec::new();
        for b in &batches {
            types = b.schema().fields().iter().map(|f| column_type(f.data_type())).collect();
            let dt: Vec<_> = b.schema().fields().iter().map(|f| f.data_type().clone()).collect();
            for r in rows_from_batch(b).map_err(|e| SltError(e.to_string()))? {
                rows.push(
                    r.iter()
                        .zip(&dt)
                        .map(|(v, t)| format_value(v, t).unwrap_or_else(|| "NULL".into()))
                        .collect::<Vec<_>>(),
                );
            }
        }
        if explain {
            let scans: Vec<Vec<String>> = rows
                .iter()
                .filter(|r| r[0] == "logical_plan")
                .flat_map(|r| {
                    r[1].lines()
                        .filter(|l| l.contains("TableScan"))
                        .map(|l| vec![l.trim().to_owned()])
                        .collect::<Vec<_>>()
                })
                .collect();
            return Ok(DBOutput::Rows { types: vec![DefaultColumnType::Text], rows: scans });
        }
        Ok(DBOutput::Rows { types, rows })
    }
}

fn column_type(t: &arrow::datatypes::DataType) -> DefaultColumnType {
    if t.is_integer() {
        DefaultColumnType::Integer
    } else if t.is_floating() || matches!(t, arrow::datatypes::DataType::Decimal128(_, _)) {
        DefaultColumnType::FloatingPoint
    } else {
        DefaultColumnType::Text
    }
}

/// The replayed lake, and a snapshot taken before the replay: held for the
/// whole test, it keeps every version readable for time travel.
fn replayed_lake(dir: &Path) -> (Arc<Engine>, fovea_core::Snapshot) {
    let data = crate::package_dir().join("../tests/data/pg-tiny/debezium_events.precise_schemas.jsonl.gz");
    let lake = open_lake(dir, EngineConfig::default(), OpenMode::Write).unwrap();
    let hold = lake.engine.snapshot();
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "pg-tiny", SinkConfig::default()).unwrap();
    let mut source = LineSource::open(&data, Default::default()).unwrap();
    let mut line = String::new();
    while let Some(pos) = source.next_line(&mut line).unwrap() {
        sink.push(decode_line(&line, pos, InputFormat::Auto).unwrap(), pos, source.position()).unwrap();
    }
    sink.finish_input(source.position()).unwrap();
    (lake.engine, hold)
}

#[test]
fn sqllogictest_files() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _hold) = replayed_lake(dir.path());
    let files: Vec<_> = std::fs::read_dir(crate::package_dir().join("tests/slt"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    assert!(!files.is_empty());
    for file in files {
        let engine = Arc::clone(&engine);
        let mut runner = sqllogictest::Runner::new(move || {
            let engine = Arc::clone(&engine);
            async move {
                let runtime =
                    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
                Ok(FoveaDb { engine, as_of: None, runtime })
            }
        });
        if let Err(e) = runner.run_file(&file) {
            panic!("{}: {e}", file.display());
        }
    }
}
