//! SQL over fovea tables with DataFusion.
//!
//! ```text
//!  query ─▶ one snapshot: a running engine's (qts = HWM − 1, or AS OF), or a
//!           lake read as of its newest checkpoint (no engine in the reader)
//!        ─▶ SessionContext with a FoveaTable per table, all at that snapshot
//!        ─▶ DataFusion plans; FoveaTable::scan pushes projection, simple
//!           comparisons and LIMIT into the VFoR scan (row groups pruned on
//!           user-column and _fovea_create_ts statistics), DataFusion
//!           re-checks filters; the scan is a FoveaScanExec streaming its
//!           splits by partition (see `exec`)
//! ```
//!
//! The snapshot lives as long as the session: LWM cannot pass it while the
//! query runs, whatever replay and GC do meanwhile.

mod exec;
mod remote;

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
pub use datafusion;
use datafusion::catalog::{MemorySchemaProvider, Session};
use datafusion::common::{DataFusionError, ScalarValue, TableReference};
pub use datafusion::dataframe::DataFrame;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
pub use exec::FoveaScanExec;
use fovea_core::frozen::FrozenVisibility;
use fovea_core::scan::{CmpOp, Predicate};
use fovea_core::{Engine, ScanOptions, Snapshot, SnapshotTables, TableDef, Value, VisibilityMode};
pub use remote::{RemoteScanExec, RemoteScans};

/// Columns fovea adds to a table (never shown to SQL) start with this.
pub const HIDDEN_PREFIX: &str = "_fovea_";

/// The catalog every fovea table is in (`fovea.schema.table`; SQL may leave
/// it out).
pub const CATALOG: &str = "fovea";

/// Every table of `defs` as SQL sees it, sorted: schema, table, and its
/// columns (fovea's hidden ones left out).
pub fn tables(defs: Vec<Arc<TableDef>>) -> Vec<(String, String, arrow::datatypes::Schema)> {
    let mut out: Vec<_> = defs
        .into_iter()
        .map(|def| {
            let (schema, table) = def.name.split_once('.').unwrap_or(("public", def.name.as_str()));
            let fields: Vec<_> = def
                .schema
                .fields()
                .iter()
                .filter(|f| !f.name().starts_with(HIDDEN_PREFIX))
                .map(|f| f.as_ref().clone())
                .collect();
            (schema.to_owned(), table.to_owned(), arrow::datatypes::Schema::new(fields))
        })
        .collect();
    out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    out
}

/// A fovea table as DataFusion sees it, at one snapshot.
pub struct FoveaTable {
    source: Arc<dyn SnapshotTables>,
    def: Arc<TableDef>,
    visibility: VisibilityMode,
    frozen: Option<Arc<FrozenVisibility>>,
    /// Where the splits run when not in this process.
    remote: Option<RemoteScans>,
    /// The table's columns SQL sees (all but fovea's hidden `_fovea_*`
    /// ones, such as the row id of a table without a primary key).
    columns: Vec<usize>,
    schema: SchemaRef,
}

impl std::fmt::Debug for FoveaTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FoveaTable").field("table", &self.def.name).field("qts", &self.source.qts()).finish()
    }
}

impl FoveaTable {
    /// `def` of `source` (at its snapshot).
    pub fn new(source: Arc<dyn SnapshotTables>, def: Arc<TableDef>) -> Self {
        let columns: Vec<usize> = (0..def.schema.fields().len())
            .filter(|&i| !def.schema.field(i).name().starts_with(HIDDEN_PREFIX))
            .collect();
        let schema = Arc::new(arrow::datatypes::Schema::new(
            columns.iter().map(|&i| def.schema.field(i).clone()).collect::<Vec<_>>(),
        ));
        FoveaTable { source, def, visibility: VisibilityMode::Enforced, frozen: None, remote: None, columns, schema }
    }

    /// The same with visibility off: every stored version, for measuring
    /// what VFoR costs. Never for answers.
    pub fn without_visibility(mut self) -> Self {
        self.visibility = VisibilityMode::Off;
        self
    }

    /// The same reading at a visibility checkpoint (see
    /// [`fovea_core::frozen`]); `snapshot` then only keeps the files read.
    pub fn at_checkpoint(mut self, frozen: Arc<FrozenVisibility>) -> Self {
        self.frozen = Some(frozen);
        self
    }

    /// A filter expression as a fovea predicate, when it has that shape.
    fn predicate(&self, e: &Expr) -> Option<Predicate> {
        match e {
            Expr::BinaryExpr(BinaryExpr { left, op: Operator::And, right }) => {
                Some(Predicate::And(vec![self.predicate(left)?, self.predicate(right)?]))
            }
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                let (column, literal, op) = match (left.as_ref(), right.as_ref()) {
                    (Expr::Column(c), Expr::Literal(v, _)) => (c, v, *op),
                    (Expr::Literal(v, _), Expr::Column(c)) => (c, v, op.swap()?),
                    _ => return None,
                };
                let op = match op {
                    Operator::Eq => CmpOp::Eq,
                    Operator::NotEq => CmpOp::NotEq,
                    Operator::Lt => CmpOp::Lt,
                    Operator::LtEq => CmpOp::LtEq,
                    Operator::Gt => CmpOp::Gt,
                    Operator::GtEq => CmpOp::GtEq,
                    _ => return None,
                };
                let index = self.def.schema.index_of(&column.name).ok()?;
                let value = literal_value(literal, self.def.schema.field(index).data_type())?;
                Some(Predicate::Compare { column: index, op, value })
            }
            _ => None,
        }
    }
}

/// A literal as a fovea value of a column of type `t`, when exact.
fn literal_value(v: &ScalarValue, t: &arrow::datatypes::DataType) -> Option<Value> {
    use arrow::datatypes::DataType as T;
    Some(match (v, t) {
        (ScalarValue::Int8(Some(x)), _) => Value::Int((*x).into()),
        (ScalarValue::Int16(Some(x)), _) => Value::Int((*x).into()),
        (ScalarValue::Int32(Some(x)), _) => Value::Int((*x).into()),
        (ScalarValue::Int64(Some(x)), _) => Value::Int(*x),
        (ScalarValue::UInt8(Some(x)), _) => Value::Int((*x).into()),
        (ScalarValue::UInt16(Some(x)), _) => Value::Int((*x).into()),
        (ScalarValue::UInt32(Some(x)), _) => Value::Int((*x).into()),
        (ScalarValue::Float64(Some(x)), T::Float64 | T::Float32) => Value::Float(*x),
        (ScalarValue::Boolean(Some(x)), T::Boolean) => Value::Bool(*x),
        (ScalarValue::Utf8(Some(x)) | ScalarValue::LargeUtf8(Some(x)), T::Utf8) => Value::Utf8(x.clone()),
        (ScalarValue::Decimal128(Some(x), _, s), T::Decimal128(_, cs)) if s == cs => Value::Decimal(*x),
        (ScalarValue::Date32(Some(x)), T::Date32) => Value::Int((*x).into()),
        (ScalarValue::TimestampMicrosecond(Some(x), _), T::Timestamp(_, _)) => Value::Int(*x),
        _ => return None,
    })
    .filter(|v| !matches!(v, Value::Int(_)) || t.is_integer() || matches!(t, T::Date32 | T::Timestamp(_, _)))
}

#[async_trait]
impl TableProvider for FoveaTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::common::Result<Vec<TableProviderFilterPushDown>> {
        // Inexact: fovea prunes and filters, DataFusion checks again (NULL
        // semantics and types stay DataFusion's).
        Ok(filters
            .iter()
            .map(|f| match self.predicate(f) {
                Some(_) => TableProviderFilterPushDown::Inexact,
                None => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let pushed: Vec<&Expr> = filters.iter().filter(|f| self.predicate(f).is_some()).collect();
        let predicates: Vec<Predicate> = pushed.iter().filter_map(|f| self.predicate(f)).collect();
        let filter = match predicates.len() {
            0 => None,
            1 => predicates.into_iter().next(),
            _ => Some(Predicate::And(predicates)),
        };
        let options = ScanOptions {
            projection: Some(match projection {
                Some(p) => p.iter().map(|&i| self.columns[i]).collect(),
                None => self.columns.clone(),
            }),
            filter,
            visibility: self.visibility,
            frozen: self.frozen.clone(),
            batch_rows: None,
        };
        // Planning takes one view of the table and reads no data.
        let scan = self.source.scan(&self.def.name, options).map_err(|e| DataFusionError::External(Box::new(e)))?;
        let shown =
            (!pushed.is_empty()).then(|| pushed.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(" AND "));
        if let Some(remote) = &self.remote {
            let schema = scan.schema();
            let tasks = scan.with_limit(limit).tasks().map_err(|e| DataFusionError::External(Box::new(e)))?;
            return Ok(Arc::new(RemoteScanExec::new(&self.def.name, schema, tasks, remote.clone(), limit, shown)));
        }
        let partitions = state.config_options().execution.target_partitions;
        Ok(Arc::new(FoveaScanExec::new(&self.def.name, scan, partitions, limit, shown)))
    }
}

/// A DataFusion session where every fovea table is registered under its
/// qualified name (`schema.table`), all at `snapshot`.
pub fn session(engine: &Arc<Engine>, snapshot: &Snapshot) -> datafusion::common::Result<SessionContext> {
    session_with(engine, snapshot, VisibilityMode::Enforced)
}

/// [`session`] with a visibility mode (`Off` only to measure VFoR's cost).
pub fn session_with(
    engine: &Arc<Engine>,
    snapshot: &Snapshot,
    visibility: VisibilityMode,
) -> datafusion::common::Result<SessionContext> {
    session_full(Arc::new(engine.at(snapshot.clone())), visibility, None, None)
}

/// A session reading at a visibility checkpoint: every table as of
/// `frozen.qts()`, with `snapshot` (any current one) keeping files alive.
pub fn session_at_checkpoint(
    engine: &Arc<Engine>,
    snapshot: &Snapshot,
    frozen: Arc<FrozenVisibility>,
) -> datafusion::common::Result<SessionContext> {
    session_full(Arc::new(engine.at(snapshot.clone())), VisibilityMode::Enforced, Some(frozen), None)
}

/// A session over any tables at one snapshot (a running engine's, or a
/// lake read as of its newest checkpoint, [`fovea_core::reader`]).
pub fn session_on(source: Arc<dyn SnapshotTables>) -> datafusion::common::Result<SessionContext> {
    session_full(source, VisibilityMode::Enforced, None, None)
}

/// [`session_on`] with a visibility mode (`Off` only to measure VFoR's cost).
pub fn session_on_with(
    source: Arc<dyn SnapshotTables>,
    visibility: VisibilityMode,
) -> datafusion::common::Result<SessionContext> {
    session_full(source, visibility, None, None)
}

/// A session over `source`'s tables whose scans run on `remote`'s worker
/// (one split task per invocation) instead of in this process.
pub fn session_remote(
    source: Arc<dyn SnapshotTables>,
    remote: RemoteScans,
) -> datafusion::common::Result<SessionContext> {
    session_full(source, VisibilityMode::Enforced, None, Some(remote))
}

fn session_full(
    source: Arc<dyn SnapshotTables>,
    visibility: VisibilityMode,
    frozen: Option<Arc<FrozenVisibility>>,
    remote: Option<RemoteScans>,
) -> datafusion::common::Result<SessionContext> {
    // information_schema too: tools list tables and columns with it.
    let config = datafusion::prelude::SessionConfig::new()
        .with_default_catalog_and_schema(CATALOG, "public")
        .with_information_schema(true);
    let ctx = SessionContext::new_with_config(config);
    let catalog = ctx.catalog(CATALOG).ok_or_else(|| DataFusionError::Internal("no default catalog".into()))?;
    for def in source.tables() {
        let (schema, table) = def.name.split_once('.').unwrap_or(("public", def.name.as_str()));
        if catalog.schema(schema).is_none() {
            catalog.register_schema(schema, Arc::new(MemorySchemaProvider::new()))?;
        }
        let mut provider = FoveaTable::new(Arc::clone(&source), Arc::clone(&def));
        provider.visibility = visibility;
        provider.frozen = frozen.clone();
        provider.remote = remote.clone();
        ctx.register_table(TableReference::partial(schema, table), Arc::new(provider))?;
    }
    Ok(ctx)
}

/// Runs `sql` at `snapshot` and returns the result batches.
pub async fn query(
    engine: &Arc<Engine>,
    snapshot: &Snapshot,
    sql: &str,
) -> datafusion::common::Result<Vec<RecordBatch>> {
    query_on(Arc::new(engine.at(snapshot.clone())), sql).await
}

/// Runs `sql` on `source`'s tables and returns the result batches.
pub async fn query_on(source: Arc<dyn SnapshotTables>, sql: &str) -> datafusion::common::Result<Vec<RecordBatch>> {
    Ok(answer(source, None, sql).await?.batches)
}

/// Runs `sql` on `source`'s tables with every scan's splits on `worker`,
/// then lets the worker clean up after the query (whatever the outcome).
pub async fn query_remote(
    source: Arc<dyn SnapshotTables>,
    worker: Arc<dyn fovea_core::scan_worker::SplitWorker>,
    sql: &str,
) -> datafusion::common::Result<Vec<RecordBatch>> {
    Ok(answer(source, Some(worker), sql).await?.batches)
}

/// The answer to a statement: its schema (also when no row comes) and its
/// rows.
#[derive(Debug)]
pub struct Answer {
    /// The columns of the answer.
    pub schema: arrow::datatypes::SchemaRef,
    /// Its rows.
    pub batches: Vec<RecordBatch>,
}

/// Runs `sql` on `source`'s tables: in this process, or with every scan's
/// splits on `worker` when given — the worker then cleans up after the
/// query, whatever its outcome.
pub async fn answer(
    source: Arc<dyn SnapshotTables>,
    worker: Option<Arc<dyn fovea_core::scan_worker::SplitWorker>>,
    sql: &str,
) -> datafusion::common::Result<Answer> {
    let run = |ctx: SessionContext| async move {
        let frame = ctx.sql(sql).await?;
        let schema = Arc::new(frame.schema().as_arrow().clone());
        Ok::<_, DataFusionError>(Answer { schema, batches: frame.collect().await? })
    };
    let Some(worker) = worker else { return run(session_on(source)?).await };
    let query = RemoteScans::new_query_id();
    let remote = RemoteScans::new(Arc::clone(&worker), &query);
    let answer = async { run(session_remote(source, remote)?).await }.await;
    let cleaned = worker.finish(&query).await;
    let answer = answer?;
    cleaned.map_err(|e| DataFusionError::External(Box::new(e)))?;
    Ok(answer)
}
