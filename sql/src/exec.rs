//! The streaming scan of a fovea table as a DataFusion `ExecutionPlan`.
//!
//! ```text
//!  TableProvider::scan ─▶ Engine::scan (one view; no data read) ─▶ Scan::partition(n)
//!  execute(p) ─▶ a blocking task runs partition p's splits in order ─▶ channel (2 batches) ─▶ stream
//! ```
//! Memory stays bounded whatever the table size: a partition holds the
//! batch being decoded and at most two waiting ones. A `LIMIT` pushed into
//! the scan stops each partition once it returned that many rows; a
//! consumer that stops early (a `LIMIT` above) drops the stream and the
//! task stops at its next batch. Planning (`EXPLAIN`) reads no data.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Statistics};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties, SendableRecordBatchStream,
};
use fovea_core::Scan;

/// Batches a partition decodes ahead of its consumer.
const AHEAD: usize = 2;

/// A fovea table's visible rows at one snapshot, as partitions of splits.
pub struct FoveaScanExec {
    table: String,
    /// One scan per partition, all from one view of the table.
    scans: Vec<Scan>,
    schema: SchemaRef,
    limit: Option<usize>,
    filter: Option<String>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl fmt::Debug for FoveaScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FoveaScanExec").field("table", &self.table).field("partitions", &self.scans.len()).finish()
    }
}

impl FoveaScanExec {
    /// Divides `scan` of `table` into at most `partitions` partitions.
    pub fn new(table: &str, scan: Scan, partitions: usize, limit: Option<usize>, filter: Option<String>) -> Self {
        let schema = scan.schema();
        let scans: Vec<Scan> = scan.with_limit(limit).partition(partitions);
        let properties = scan_properties(&schema, scans.len());
        FoveaScanExec {
            table: table.to_owned(),
            scans,
            schema,
            limit,
            filter,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    fn splits(&self) -> usize {
        self.scans.iter().map(Scan::splits).sum()
    }
}

impl DisplayAs for FoveaScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FoveaScanExec: table={}, partitions={}, splits={}", self.table, self.scans.len(), self.splits())?;
        fmt_pushdown(f, &self.schema, self.filter.as_deref(), self.limit)
    }
}

impl ExecutionPlan for FoveaScanExec {
    fn name(&self) -> &str {
        "FoveaScanExec"
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
            Err(DataFusionError::Internal("FoveaScanExec has no children".into()))
        }
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> datafusion::common::Result<SendableRecordBatchStream> {
        let mut scan = self
            .scans
            .get(partition)
            .cloned()
            .ok_or_else(|| DataFusionError::Internal(format!("no partition {partition} of {}", self.table)))?;
        let splits_read = MetricBuilder::new(&self.metrics).counter("splits_read", partition);
        let rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<datafusion::common::Result<RecordBatch>>(AHEAD);
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|e| DataFusionError::Execution(format!("scans run on a tokio runtime: {e}")))?;
        // The scan reads files synchronously: off the async workers. It
        // stops when the consumer drops the stream (send fails).
        handle.spawn_blocking(move || {
            loop {
                let before = scan.metrics().splits_read;
                let next = scan.next_batch();
                splits_read.add(scan.metrics().splits_read - before);
                let item = match next {
                    Ok(Some(batch)) => {
                        rows.add(batch.num_rows());
                        Ok(batch)
                    }
                    Ok(None) => return,
                    Err(e) => Err(DataFusionError::External(Box::new(e))),
                };
                let failed = item.is_err();
                if tx.blocking_send(item).is_err() || failed {
                    return;
                }
            }
        });
        let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        Ok(Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn partition_statistics(&self, partition: Option<usize>) -> datafusion::common::Result<Arc<Statistics>> {
        let stored = match partition {
            Some(p) => self.scans.get(p).map_or(0, Scan::stored_rows),
            None => self.scans.iter().map(Scan::stored_rows).sum(),
        };
        Ok(scan_statistics(&self.schema, stored, self.limit))
    }
}

/// Plan properties of a scan of `partitions` partitions (shared by the
/// in-process and the remote scan).
pub(crate) fn scan_properties(schema: &SchemaRef, partitions: usize) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(Arc::clone(schema)),
        Partitioning::UnknownPartitioning(partitions),
        EmissionType::Incremental,
        Boundedness::Bounded,
    ))
}

/// `, projection=[…]` and the pushed-down filter and limit of a scan's
/// plan line.
pub(crate) fn fmt_pushdown(
    f: &mut fmt::Formatter<'_>,
    schema: &SchemaRef,
    filter: Option<&str>,
    limit: Option<usize>,
) -> fmt::Result {
    let columns: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    write!(f, ", projection=[{}]", columns.join(", "))?;
    if let Some(filter) = filter {
        write!(f, ", filter={filter}")?;
    }
    if let Some(limit) = limit {
        write!(f, ", limit={limit}")?;
    }
    Ok(())
}

/// Statistics of a scan: stored rows bound the visible ones (deleted and
/// newer versions are among them), and so does a pushed-down limit.
pub(crate) fn scan_statistics(schema: &SchemaRef, stored: usize, limit: Option<usize>) -> Arc<Statistics> {
    let mut stats = Statistics::new_unknown(schema);
    stats.num_rows = Precision::Inexact(limit.map_or(stored, |l| l.min(stored)));
    Arc::new(stats)
}
