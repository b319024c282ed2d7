//! A fovea scan whose splits run elsewhere, as a DataFusion `ExecutionPlan`.
//!
//! ```text
//!  TableProvider::scan ─▶ one view of the table ─▶ Scan::tasks() (no data read)
//!  ─▶ group_tasks: consecutive tasks, spread over the worker's concurrency within its group_size
//!  ─▶ groups dealt round-robin over min(worker concurrency, groups) partitions
//!  execute(p) ─▶ partition p's groups one after another ─▶ SplitWorker::run ─▶ batches
//! ```
//! Each partition has one invocation running at a time, so a query has at
//! most the worker's concurrency of invocations in flight. A group's rows
//! arrive whole from the worker (it retries; see [`SplitWorker`]), so a
//! split is never half in an answer. The query's snapshot is held by the session's
//! source (a registered snapshot or reader registration) for as long as
//! the session lives.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Statistics};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use fovea_core::scan_worker::{SplitWorker, group_tasks};

use crate::exec::{fmt_pushdown, scan_properties, scan_statistics};
use fovea_core::split::SplitTask;
use futures::{StreamExt, TryFutureExt, TryStreamExt};

/// The worker a session's scans run on, and the query they belong to.
#[derive(Clone, Debug)]
pub struct RemoteScans {
    /// The worker.
    pub worker: Arc<dyn SplitWorker>,
    /// The query's id (names its spilled answers).
    pub query: Arc<str>,
    /// Numbers the query's invocations (groups of tasks) across its tables.
    next_group: Arc<AtomicUsize>,
}

impl RemoteScans {
    /// Scans of query `query` on `worker`.
    pub fn new(worker: Arc<dyn SplitWorker>, query: &str) -> Self {
        RemoteScans { worker, query: query.into(), next_group: Arc::default() }
    }

    /// A new, unique query id.
    pub fn new_query_id() -> String {
        static SEQUENCE: AtomicUsize = AtomicUsize::new(0);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        // Relaxed: uniqueness within the process only needs atomicity.
        let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        format!("{:x}-{:x}-{n}", now.as_micros(), std::process::id())
    }
}

/// A fovea table's visible rows at one snapshot, read by a [`SplitWorker`].
pub struct RemoteScanExec {
    table: String,
    /// Per partition: (group number in the query, the group's tasks).
    partitions: Vec<Vec<(usize, Vec<SplitTask>)>>,
    remote: RemoteScans,
    schema: SchemaRef,
    stored_rows: usize,
    limit: Option<usize>,
    filter: Option<String>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl fmt::Debug for RemoteScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteScanExec").field("table", &self.table).field("worker", &self.remote.worker).finish()
    }
}

impl RemoteScanExec {
    /// `tasks` of `table` (all of one view, producing `schema`) on
    /// `remote`, grouped by [`group_tasks`] for the worker.
    pub fn new(
        table: &str,
        schema: SchemaRef,
        tasks: Vec<SplitTask>,
        remote: RemoteScans,
        limit: Option<usize>,
        filter: Option<String>,
    ) -> Self {
        let stored_rows = tasks.iter().map(|t| t.rows).sum();
        let groups = group_tasks(tasks, remote.worker.group_size());
        let n = remote.worker.concurrency().clamp(1, groups.len().max(1));
        let mut partitions: Vec<Vec<(usize, Vec<SplitTask>)>> = vec![Vec::new(); n];
        // Relaxed: numbering only needs atomicity.
        let first = remote.next_group.fetch_add(groups.len(), Ordering::Relaxed);
        for (i, group) in groups.into_iter().enumerate() {
            partitions[i % n].push((first + i, group));
        }
        let properties = scan_properties(&schema, n);
        RemoteScanExec {
            table: table.to_owned(),
            partitions,
            remote,
            schema,
            stored_rows,
            limit,
            filter,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for RemoteScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RemoteScanExec: table={}, worker={:?}, partitions={}, invocations={}, splits={}",
            self.table,
            self.remote.worker,
            self.partitions.len(),
            self.partitions.iter().map(Vec::len).sum::<usize>(),
            self.partitions.iter().flatten().map(|(_, g)| g.len()).sum::<usize>()
        )?;
        fmt_pushdown(f, &self.schema, self.filter.as_deref(), self.limit)
    }
}

impl ExecutionPlan for RemoteScanExec {
    fn name(&self) -> &str {
        "RemoteScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::common::Result<TreeNodeRecursion>,
    ) -> datafusion::common::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal("RemoteScanExec has no children".into()))
        }
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> datafusion::common::Result<SendableRecordBatchStream> {
        let tasks = self
            .partitions
            .get(partition)
            .cloned()
            .ok_or_else(|| DataFusionError::Internal(format!("no partition {partition} of {}", self.table)))?;
        let splits_read = MetricBuilder::new(&self.metrics).counter("splits_read", partition);
        let invocations = MetricBuilder::new(&self.metrics).counter("invocations", partition);
        let rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let worker = Arc::clone(&self.remote.worker);
        let query = Arc::clone(&self.remote.query);
        let schema = Arc::clone(&self.schema);
        let table = self.table.clone();
        let stream = futures::stream::iter(tasks)
            .then(move |(n, group)| {
                let splits = group.len();
                worker.run(&query, n, group).map_ok(move |batches| (splits, batches))
            })
            .map_err(|e| DataFusionError::External(Box::new(e)))
            .map_ok(move |(splits, batches)| {
                splits_read.add(splits);
                invocations.add(1);
                let schema = Arc::clone(&schema);
                let table = table.clone();
                let rows = rows.clone();
                futures::stream::iter(batches.into_iter().map(move |batch: RecordBatch| {
                    if batch.schema().fields() != schema.fields() {
                        return Err(DataFusionError::Execution(format!(
                            "a scan worker returned columns {:?} for {table}, expected {:?}",
                            batch.schema().fields(),
                            schema.fields()
                        )));
                    }
                    rows.add(batch.num_rows());
                    Ok(batch)
                }))
            })
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn partition_statistics(&self, partition: Option<usize>) -> datafusion::common::Result<Arc<Statistics>> {
        let stored = match partition {
            Some(p) => self.partitions.get(p).map_or(0, |g| g.iter().flat_map(|(_, g)| g).map(|t| t.rows).sum()),
            None => self.stored_rows,
        };
        Ok(scan_statistics(&self.schema, stored, self.limit))
    }
}
