//! Arrow Flight SQL for clients, and the visibility RPC for scan workers.
//!
//! A query's snapshot is taken when it is planned (`GetFlightInfo`) and
//! kept until its ticket is fetched (`DoGet`), so every table of the query
//! is read at one snapshot. A query held longer than the long-query
//! threshold gets a visibility checkpoint ([`fovea_core::frozen`]) and
//! releases its registration, so LWM and memory GC move on.
//!
//! The visibility RPC for scan workers ([`fovea_core::rpc`]) is served as
//! Flight actions with JSON bodies.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::FlightSqlService;
use arrow_flight::sql::server::PeekableFlightDataStream;
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult,
    Any, CommandGetCatalogs, CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables,
    CommandPreparedStatementQuery, CommandStatementQuery, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo,
    TicketStatementQuery,
};
use arrow_flight::{Action, FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use fovea_core::frozen::FrozenVisibility;
use fovea_core::rpc::{self, RpcError};
use fovea_core::storage_gc::StorageGcPause;
use fovea_core::{Engine, Snapshot};
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use tonic::{Request, Response, Status};

use super::metrics::Metrics;

/// Largest request body accepted by the visibility RPC.
const MAX_REQUEST_BYTES: usize = 1 << 20;
/// A planned query whose ticket is not fetched within this is dropped.
const UNCLAIMED_QUERY: Duration = Duration::from_secs(600);
/// Planned queries not fetched yet a server holds at most (each holds a
/// snapshot, so LWM and storage GC wait for it): more are refused until
/// some are fetched or expire.
const MAX_PLANNED_QUERIES: usize = 1024;

/// Security options.
#[derive(Clone, Debug, Default)]
pub struct FlightOptions {
    /// Bearer token every RPC must carry, if set.
    pub token: Option<String>,
    /// The server's certificate and key: TLS on every connection.
    pub tls: Option<tonic::transport::Identity>,
}

enum HeldSnapshot {
    /// Registered: LWM waits for it.
    Live(Snapshot),
    /// Released after a visibility checkpoint written at `path`; storage GC
    /// is held off while it is read (its bitmaps name the files of its time).
    Checkpointed { frozen: Arc<FrozenVisibility>, path: object_store::path::Path, _pause: StorageGcPause },
}

struct PlannedQuery {
    sql: String,
    /// Values bound to the SQL's `$n` placeholders (prepared statements).
    params: Vec<fovea_sql::datafusion::common::ScalarValue>,
    /// The plan made when the query was submitted (at its live snapshot):
    /// executed as is unless the query was moved to a visibility checkpoint.
    frame: Option<fovea_sql::DataFrame>,
    held: HeldSnapshot,
    planned: Instant,
}

/// Queries planned and not fetched yet, with their snapshots.
pub struct QueryRegistry {
    queries: Mutex<HashMap<u64, PlannedQuery>>,
    next: AtomicU64,
}

impl Default for QueryRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl QueryRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        QueryRegistry { queries: Mutex::new(HashMap::new()), next: AtomicU64::new(1) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, PlannedQuery>> {
        self.queries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(
        &self,
        sql: String,
        params: Vec<fovea_sql::datafusion::common::ScalarValue>,
        frame: fovea_sql::DataFrame,
        snapshot: Snapshot,
    ) -> Result<u64, Status> {
        let mut queries = self.lock();
        if queries.len() >= MAX_PLANNED_QUERIES {
            return Err(Status::resource_exhausted(format!(
                "{MAX_PLANNED_QUERIES} planned queries are waiting to be fetched; fetch or let some expire ({UNCLAIMED_QUERY:?}) first"
            )));
        }
        // Relaxed: a unique counter, nothing is published through it.
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let query = PlannedQuery {
            sql,
            params,
            frame: Some(frame),
            held: HeldSnapshot::Live(snapshot),
            planned: Instant::now(),
        };
        queries.insert(id, query);
        Ok(id)
    }

    fn take(&self, id: u64) -> Option<PlannedQuery> {
        self.lock().remove(&id)
    }

    /// Writes visibility checkpoints for queries held longer than
    /// `threshold` and releases their snapshots; drops queries never
    /// fetched. Returns the number of checkpoints written.
    pub fn checkpoint_long_queries(&self, engine: &Engine, threshold: Duration) -> fovea_core::Result<usize> {
        let due: Vec<(u64, Snapshot)> = self
            .lock()
            .iter()
            .filter_map(|(id, q)| match &q.held {
                HeldSnapshot::Live(s) if q.planned.elapsed() >= threshold => Some((*id, s.clone())),
                _ => None,
            })
            .collect();
        let mut written = 0;
        for (id, snapshot) in due {
            let name = format!("q{}-{id}", snapshot.qts().get());
            let pause = engine.pause_storage_gc();
            let (path, frozen) = FrozenVisibility::checkpoint(engine, &snapshot, &name)?;
            tracing::info!(query = id, qts = snapshot.qts().get(), files = frozen.files(), %path, "visibility checkpoint");
            if let Some(q) = self.lock().get_mut(&id) {
                // The plan holds the live snapshot: planned again at the
                // checkpoint when fetched.
                q.frame = None;
                q.held = HeldSnapshot::Checkpointed { frozen: Arc::new(frozen), path, _pause: pause };
                written += 1;
            } else {
                engine.lake().delete(&path)?;
            }
        }
        let expired: Vec<PlannedQuery> = {
            let mut queries = self.lock();
            let ids: Vec<u64> =
                queries.iter().filter(|(_, q)| q.planned.elapsed() >= UNCLAIMED_QUERY).map(|(id, _)| *id).collect();
            ids.into_iter().filter_map(|id| queries.remove(&id)).collect()
        };
        for q in expired {
            release(engine, q.held)?;
        }
        Ok(written)
    }
}

fn release(engine: &Engine, held: HeldSnapshot) -> fovea_core::Result<()> {
    if let HeldSnapshot::Checkpointed { path, .. } = held {
        engine.lake().delete(&path)?;
    }
    Ok(())
}

/// The Flight SQL service.
#[derive(Clone)]
pub struct FoveaFlight {
    engine: Arc<Engine>,
    metrics: Arc<Metrics>,
    queries: Arc<QueryRegistry>,
    prepared: Arc<PreparedStatements>,
}

/// Prepared statements open: SQL with `$n` placeholders, the parameter
/// types the plan infers, and the values bound last. Bounded: past
/// [`MAX_PREPARED`] the least recently used one is closed.
#[derive(Default)]
pub struct PreparedStatements {
    statements: Mutex<HashMap<u64, Prepared>>,
    next: AtomicU64,
}

struct Prepared {
    sql: String,
    parameters: arrow::datatypes::SchemaRef,
    bound: Vec<fovea_sql::datafusion::common::ScalarValue>,
    used: Instant,
}

/// Prepared statements a server keeps open at most.
const MAX_PREPARED: usize = 4096;

impl PreparedStatements {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Prepared>> {
        self.statements.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, sql: String, parameters: arrow::datatypes::SchemaRef) -> u64 {
        // Relaxed: a unique counter, nothing is published through it.
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut statements = self.lock();
        if statements.len() >= MAX_PREPARED
            && let Some(oldest) = statements.iter().min_by_key(|(_, p)| p.used).map(|(id, _)| *id)
        {
            statements.remove(&oldest);
        }
        statements.insert(id, Prepared { sql, parameters, bound: Vec::new(), used: Instant::now() });
        id
    }

    fn handle(bytes: &[u8]) -> Result<u64, Status> {
        <[u8; 8]>::try_from(bytes)
            .map(u64::from_le_bytes)
            .map_err(|_| Status::invalid_argument("malformed prepared statement handle"))
    }

    /// The statement's SQL and bound values.
    fn get(&self, id: u64) -> Result<(String, Vec<fovea_sql::datafusion::common::ScalarValue>), Status> {
        let mut statements = self.lock();
        let p = statements
            .get_mut(&id)
            .ok_or_else(|| Status::not_found(format!("no prepared statement {id}: closed, or never created")))?;
        p.used = Instant::now();
        Ok((p.sql.clone(), p.bound.clone()))
    }
}

/// `?` placeholders (ODBC, JDBC, ADBC) as DataFusion's `$1`, `$2`, …; text
/// in quotes and comments is left alone.
pub fn number_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == c {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == '\n' {
                        break;
                    }
                }
            }
            '?' => {
                n += 1;
                out.push_str(&format!("${n}"));
            }
            _ => out.push(c),
        }
    }
    out
}

/// The parameter types of `sql` as planned (`$1`, `$2`, … in order; a type
/// the plan cannot infer is text).
async fn parameter_schema(
    ctx: &fovea_sql::datafusion::prelude::SessionContext,
    sql: &str,
) -> Result<(fovea_sql::DataFrame, arrow::datatypes::SchemaRef), Status> {
    let frame = ctx.sql(sql).await.map_err(status)?;
    let types = frame.logical_plan().get_parameter_types().map_err(status)?;
    let mut names: Vec<&String> = types.keys().collect();
    names.sort_by_key(|n| n.trim_start_matches('$').parse::<usize>().unwrap_or(usize::MAX));
    let fields: Vec<arrow::datatypes::Field> = names
        .into_iter()
        .map(|n| {
            let t = types[n].clone().unwrap_or(arrow::datatypes::DataType::Utf8);
            arrow::datatypes::Field::new(n.as_str(), t, true)
        })
        .collect();
    Ok((frame, Arc::new(arrow::datatypes::Schema::new(fields))))
}

/// A one-batch metadata answer as a Flight stream.
fn metadata_stream<E: std::fmt::Display>(batch: Result<RecordBatch, E>) -> Result<FlightStream, Status> {
    let batch = batch.map_err(status)?;
    Ok(stream_batches(batch.schema(), vec![batch]))
}

/// The answer to a query planned and registered as `id`: its ticket, to
/// fetch with `DoGet`.
fn planned_info(
    id: u64,
    schema: &arrow::datatypes::Schema,
    descriptor: FlightDescriptor,
) -> Result<Response<FlightInfo>, Status> {
    let ticket = TicketStatementQuery { statement_handle: id.to_le_bytes().to_vec().into() };
    metadata_info(ticket.as_any().encode_to_vec(), schema, descriptor)
}

/// The one column of a `GetTableTypes` answer.
fn table_types_schema() -> arrow::datatypes::SchemaRef {
    Arc::new(arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
        "table_type",
        arrow::datatypes::DataType::Utf8,
        false,
    )]))
}

fn metadata_info(
    ticket: Vec<u8>,
    schema: &arrow::datatypes::Schema,
    descriptor: FlightDescriptor,
) -> Result<Response<FlightInfo>, Status> {
    let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(ticket));
    let info =
        FlightInfo::new().try_with_schema(schema).map_err(status)?.with_endpoint(endpoint).with_descriptor(descriptor);
    Ok(Response::new(info))
}

fn status(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(e.to_string())
}

fn sql_info() -> &'static SqlInfoData {
    static INFO: std::sync::OnceLock<SqlInfoData> = std::sync::OnceLock::new();
    INFO.get_or_init(|| {
        let mut b = SqlInfoDataBuilder::new();
        b.append(SqlInfo::FlightSqlServerName, "fovea");
        b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        b.append(SqlInfo::FlightSqlServerArrowVersion, "1.3");
        b.append(SqlInfo::FlightSqlServerReadOnly, true);
        b.append(SqlInfo::FlightSqlServerSql, true);
        b.append(SqlInfo::FlightSqlServerSubstrait, false);
        b.append(SqlInfo::FlightSqlServerTransaction, 0i32); // SQL_SUPPORTED_TRANSACTION_NONE
        b.append(SqlInfo::FlightSqlServerCancel, false);
        b.append(SqlInfo::FlightSqlServerStatementTimeout, 0i32);
        b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
        b.append(SqlInfo::SqlDdlCatalog, false);
        b.append(SqlInfo::SqlDdlSchema, false);
        b.append(SqlInfo::SqlDdlTable, false);
        b.build().unwrap_or_else(|e| unreachable!("static sql info: {e}"))
    })
}

/// Observes a query's duration, from its planning to the end of its result
/// stream (or the client dropping it).
struct QueryTimer {
    began: Instant,
    histogram: super::metrics::Distribution,
}

impl Drop for QueryTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.began.elapsed().as_secs_f64());
    }
}

type FlightStream = Pin<Box<dyn Stream<Item = Result<arrow_flight::FlightData, Status>> + Send + 'static>>;

fn stream_batches(schema: arrow::datatypes::SchemaRef, batches: Vec<RecordBatch>) -> FlightStream {
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(futures::stream::iter(batches.into_iter().map(Ok)))
        .map_err(|e| Status::internal(e.to_string()));
    Box::pin(stream)
}

impl FoveaFlight {
    /// Executes a planned query as a stream: batches are sent as the scans
    /// produce them; a visibility checkpoint it read is deleted once the
    /// stream ends (or is dropped by the client).
    async fn run(&self, q: PlannedQuery) -> Result<FlightStream, Status> {
        let frame = match (q.frame, &q.held) {
            (Some(frame), HeldSnapshot::Live(_)) => frame,
            (_, held) => {
                let ctx = match held {
                    HeldSnapshot::Live(s) => fovea_sql::session(&self.engine, s),
                    HeldSnapshot::Checkpointed { frozen, .. } => {
                        fovea_sql::session_at_checkpoint(&self.engine, &self.engine.snapshot(), Arc::clone(frozen))
                    }
                }
                .map_err(status)?;
                let frame = ctx.sql(&q.sql).await.map_err(status)?;
                if q.params.is_empty() { frame } else { frame.with_param_values(q.params).map_err(status)? }
            }
        };
        let schema = Arc::new(frame.schema().as_arrow().clone());
        let batches = frame.execute_stream().await.map_err(status)?;
        // Relaxed: a statistic.
        self.metrics.queries.fetch_add(1, Ordering::Relaxed);
        let timer = QueryTimer { began: q.planned, histogram: self.metrics.query_seconds.clone() };
        let cleanup = HeldUntilEnd { engine: Arc::clone(&self.engine), held: Some(q.held) };
        let batches = batches.map(move |b| {
            // Moved in: released (and timed) when the stream ends or is dropped.
            let _ = (&cleanup, &timer);
            b.map_err(|e| arrow_flight::error::FlightError::ExternalError(Box::new(e)))
        });
        let stream = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(batches)
            .map_err(|e| Status::internal(e.to_string()));
        Ok(Box::pin(stream))
    }
}

/// A query's snapshot or visibility checkpoint, released when its result
/// stream is dropped.
struct HeldUntilEnd {
    engine: Arc<Engine>,
    held: Option<HeldSnapshot>,
}

impl Drop for HeldUntilEnd {
    fn drop(&mut self) {
        if let Some(held) = self.held.take()
            && let Err(e) = release(&self.engine, held)
        {
            tracing::warn!("cannot delete a query's visibility checkpoint: {e}");
        }
    }
}

#[tonic::async_trait]
impl FlightSqlService for FoveaFlight {
    type FlightService = FoveaFlight;

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let snapshot = self.engine.snapshot();
        let ctx = fovea_sql::session(&self.engine, &snapshot).map_err(status)?;
        let plan = ctx.sql(&query.query).await.map_err(status)?;
        let schema = plan.schema().as_arrow().clone();
        let id = self.queries.insert(query.query.clone(), Vec::new(), plan, snapshot)?;
        planned_info(id, &schema, request.into_inner())
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let id = <[u8; 8]>::try_from(ticket.statement_handle.as_ref())
            .map(u64::from_le_bytes)
            .map_err(|_| Status::invalid_argument("malformed statement handle"))?;
        let q = self.queries.take(id).ok_or_else(|| {
            Status::not_found(format!("no planned query {id}: fetched already, or expired after {UNCLAIMED_QUERY:?}"))
        })?;
        Ok(Response::new(self.run(q).await?))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        metadata_info(query.as_any().encode_to_vec(), &schema, request.into_inner())
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append(fovea_sql::CATALOG);
        Ok(Response::new(metadata_stream(builder.build())?))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        metadata_info(query.as_any().encode_to_vec(), &schema, request.into_inner())
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        let mut schemas: Vec<String> =
            fovea_sql::tables(committed_tables(&self.engine)).into_iter().map(|(s, _, _)| s).collect();
        schemas.dedup();
        for s in schemas {
            builder.append(fovea_sql::CATALOG, s);
        }
        Ok(Response::new(metadata_stream(builder.build())?))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        metadata_info(query.as_any().encode_to_vec(), &schema, request.into_inner())
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        for (schema, table, columns) in fovea_sql::tables(committed_tables(&self.engine)) {
            builder.append(fovea_sql::CATALOG, schema, table, "TABLE", &columns).map_err(status)?;
        }
        Ok(Response::new(metadata_stream(builder.build())?))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        metadata_info(query.as_any().encode_to_vec(), &table_types_schema(), request.into_inner())
    }

    async fn do_get_table_types(
        &self,
        _query: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let schema = table_types_schema();
        let types: arrow::array::ArrayRef = Arc::new(arrow::array::StringArray::from(vec!["TABLE"]));
        Ok(Response::new(metadata_stream(RecordBatch::try_new(schema, vec![types]))?))
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        _request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let sql = number_placeholders(&query.query);
        let snapshot = self.engine.snapshot();
        let ctx = fovea_sql::session(&self.engine, &snapshot).map_err(status)?;
        let (frame, parameters) = parameter_schema(&ctx, &sql).await?;
        let dataset = frame.schema().as_arrow().clone();
        let encode = |schema: &arrow::datatypes::Schema| -> Result<bytes::Bytes, Status> {
            let message: arrow_flight::IpcMessage =
                arrow_flight::SchemaAsIpc::new(schema, &arrow::ipc::writer::IpcWriteOptions::default())
                    .try_into()
                    .map_err(status)?;
            Ok(message.0)
        };
        let parameter_schema = if parameters.fields().is_empty() { bytes::Bytes::new() } else { encode(&parameters)? };
        let id = self.prepared.insert(sql, parameters);
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: id.to_le_bytes().to_vec().into(),
            dataset_schema: encode(&dataset)?,
            parameter_schema,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        _request: Request<Action>,
    ) -> Result<(), Status> {
        let id = PreparedStatements::handle(&query.prepared_statement_handle)?;
        self.prepared.lock().remove(&id);
        Ok(())
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let id = PreparedStatements::handle(&query.prepared_statement_handle)?;
        let parameters = {
            let statements = self.prepared.lock();
            let p = statements.get(&id).ok_or_else(|| Status::not_found(format!("no prepared statement {id}")))?;
            Arc::clone(&p.parameters)
        };
        let stream = request.into_inner().map_err(|e| arrow_flight::error::FlightError::Tonic(Box::new(e)));
        let batches: Vec<RecordBatch> = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(stream)
            .try_collect()
            .await
            .map_err(status)?;
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        if rows != 1 {
            return Err(Status::invalid_argument(format!(
                "a query binds one row of parameters; got {rows} (execute it once per row)"
            )));
        }
        let batch = batches.into_iter().find(|b| b.num_rows() == 1).ok_or_else(|| Status::internal("no row"))?;
        if batch.num_columns() != parameters.fields().len() {
            return Err(Status::invalid_argument(format!(
                "the statement has {} parameters; {} were bound",
                parameters.fields().len(),
                batch.num_columns()
            )));
        }
        let mut bound = Vec::with_capacity(batch.num_columns());
        for (i, field) in parameters.fields().iter().enumerate() {
            let value =
                fovea_sql::datafusion::common::ScalarValue::try_from_array(batch.column(i), 0).map_err(status)?;
            // The client's type (int64 for a Python int) cast to the one the
            // plan expects (int32 for an integer column).
            let value = value
                .cast_to(field.data_type())
                .map_err(|e| Status::invalid_argument(format!("parameter {} ({}): {e}", i + 1, field.data_type())))?;
            bound.push(value);
        }
        if let Some(p) = self.prepared.lock().get_mut(&id) {
            p.bound = bound;
            p.used = Instant::now();
        }
        Ok(DoPutPreparedStatementResult { prepared_statement_handle: Some(query.prepared_statement_handle) })
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let id = PreparedStatements::handle(&cmd.prepared_statement_handle)?;
        let (sql, bound) = self.prepared.get(id)?;
        let snapshot = self.engine.snapshot();
        let ctx = fovea_sql::session(&self.engine, &snapshot).map_err(status)?;
        let mut frame = ctx.sql(&sql).await.map_err(status)?;
        if !bound.is_empty() {
            frame = frame.with_param_values(bound.clone()).map_err(status)?;
        }
        let schema = frame.schema().as_arrow().clone();
        let query_id = self.queries.insert(sql, bound, frame, snapshot)?;
        planned_info(query_id, &schema, request.into_inner())
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(sql_info()).schema();
        metadata_info(query.as_any().encode_to_vec(), &schema, request.into_inner())
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let builder = query.into_builder(sql_info());
        let schema = builder.schema();
        let batch = builder.build().map_err(status)?;
        Ok(Response::new(stream_batches(schema, vec![batch])))
    }

    async fn do_get_fallback(
        &self,
        _request: Request<Ticket>,
        message: Any,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        Err(Status::unimplemented(format!("fovea does not serve {}", message.type_url)))
    }

    async fn do_action_fallback(
        &self,
        request: Request<Action>,
    ) -> Result<Response<<Self as FlightService>::DoActionStream>, Status> {
        let action = request.into_inner();
        if action.body.len() > MAX_REQUEST_BYTES {
            return Err(Status::invalid_argument(format!(
                "request of {} bytes is over the limit of {MAX_REQUEST_BYTES}",
                action.body.len()
            )));
        }
        let engine = Arc::clone(&self.engine);
        let results = tokio::task::spawn_blocking(move || rpc::answer(&engine, &action.r#type, &action.body))
            .await
            .map_err(status)?
            .map_err(|e| match e {
                RpcError::InvalidArgument(m) => Status::invalid_argument(m),
                RpcError::NotFound(m) => Status::not_found(m),
                RpcError::OutOfRange(m) => Status::out_of_range(m),
                RpcError::FailedPrecondition(m) => Status::failed_precondition(m),
                RpcError::Internal(m) => Status::internal(m),
            })?;
        let stream =
            futures::stream::iter(results.into_iter().map(|body| Ok(arrow_flight::Result { body: body.into() })));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// The tables of the newest snapshot (not one a transaction still in
/// flight is creating), for the catalog listings.
fn committed_tables(engine: &Arc<Engine>) -> Vec<Arc<fovea_core::TableDef>> {
    use fovea_core::scan::SnapshotTables;
    engine.at(engine.snapshot()).tables()
}

/// Serves Flight SQL on `listener` until the runtime stops.
/// The set-up (TLS included) is checked before the server runs: an error
/// is returned here, not logged by a server that never serves.
pub fn serve_flight(
    listener: tokio::net::TcpListener,
    engine: Arc<Engine>,
    metrics: Arc<Metrics>,
    queries: Arc<QueryRegistry>,
    options: FlightOptions,
) -> crate::replay::CliResult<impl Future<Output = ()> + Send + 'static> {
    let service = FoveaFlight { engine, metrics: Arc::clone(&metrics), queries, prepared: Arc::default() };
    let token = options.token.map(|t| format!("Bearer {t}"));
    let check = move |request: Request<()>| -> Result<Request<()>, Status> {
        let Some(expected) = &token else { return Ok(request) };
        let given = request.metadata().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        // Constant time (a length mismatch answers at once; the length of
        // the token is no secret worth the trouble).
        if bool::from(subtle::ConstantTimeEq::ct_eq(given.as_bytes(), expected.as_bytes())) {
            Ok(request)
        } else {
            metrics.error("unauthenticated");
            Err(Status::unauthenticated("missing or wrong bearer token"))
        }
    };
    let server = tonic::service::interceptor::InterceptedService::new(
        FlightServiceServer::new(service).max_decoding_message_size(MAX_REQUEST_BYTES * 2),
        check,
    );
    let incoming = tokio_stream_listener(listener);
    let mut builder = tonic::transport::Server::builder();
    if let Some(identity) = options.tls {
        builder = builder
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .map_err(|e| format!("Flight SQL TLS (--tls-cert/--tls-key): {}", crate::replay::error_chain(&e)))?;
    }
    Ok(async move {
        if let Err(e) = builder.add_service(server).serve_with_incoming(incoming).await {
            tracing::error!("Flight SQL server stopped: {}", crate::replay::error_chain(&e));
        }
    })
}

/// A channel to a Flight SQL server: `grpc://` / `http://` in plaintext,
/// `grpc+tls://` / `https://` with TLS trusting `tls_ca` (PEM) or the
/// system's roots.
pub async fn flight_channel(
    url: &str,
    tls_ca: Option<&std::path::Path>,
) -> Result<tonic::transport::Channel, Box<dyn std::error::Error + Send + Sync>> {
    let (scheme, rest) =
        url.split_once("://").ok_or_else(|| format!("{url}: expected grpc://HOST:PORT or grpc+tls://HOST:PORT"))?;
    let tls = match scheme {
        "grpc" | "http" => false,
        "grpc+tls" | "https" => true,
        other => return Err(format!("{url}: unknown scheme {other} (grpc:// or grpc+tls://)").into()),
    };
    if !tls && tls_ca.is_some() {
        return Err(format!("{url}: --tls-ca given for a plaintext address (use grpc+tls://)").into());
    }
    let mut endpoint =
        tonic::transport::Endpoint::from_shared(format!("{}://{rest}", if tls { "https" } else { "http" }))?;
    if tls {
        let host = endpoint.uri().host().unwrap_or_default().trim_matches(['[', ']']).to_owned();
        endpoint = endpoint.tls_config(crate::tls::client_tls(tls_ca, &host)?)?;
    }
    Ok(endpoint.connect().await?)
}

fn tokio_stream_listener(
    listener: tokio::net::TcpListener,
) -> impl Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |l| async move {
        let r = l.accept().await.map(|(s, _)| s);
        Some((r, l))
    })
}

/// A Flight SQL client: runs `sql` on the server at `url` and returns its batches.
pub async fn remote_query(
    url: &str,
    tls_ca: Option<&std::path::Path>,
    token: Option<&str>,
    sql: &str,
) -> Result<Vec<RecordBatch>, Box<dyn std::error::Error + Send + Sync>> {
    let channel = flight_channel(url, tls_ca).await?;
    let mut client = arrow_flight::sql::client::FlightSqlServiceClient::new(channel);
    if let Some(t) = token {
        client.set_token(t.to_owned());
    }
    let info = client.execute(sql.to_owned(), None).await?;
    let mut out = Vec::new();
    for endpoint in info.endpoint {
        let ticket = endpoint.ticket.ok_or("endpoint without ticket")?;
        let mut stream = client.do_get(ticket).await?;
        while let Some(batch) = stream.next().await {
            out.push(batch?);
        }
    }
    Ok(out)
}
