//! The backends on a local AWS (moto): the `TxnStore` and `Catalog`
//! conformance suites on DynamoDB (compare-and-set reservations and catalog
//! commits under racing writers, monotonic watermarks, leases and fencing,
//! conflicts and rebases, payloads too large for an item), the state table
//! created on first use, and the S3 lake: range reads, multipart uploads,
//! clear errors.
//!
//! One test: it sets the AWS environment before any other thread runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use fovea_aws::catalog::DynamoCatalog;
use fovea_aws::dynamo::DynamoState;
use fovea_core::catalog::Catalog;
use fovea_core::lake::Lake;
use fovea_core::mvcc::{TxnStore, conformance};
use object_store::path::Path;

#[test]
fn backends_on_a_local_aws() {
    let moto = fovea_testkit::moto::Moto::start(&fovea_testkit::moto::script()).unwrap();
    let kinesalite = fovea_testkit::moto::Kinesalite::start().unwrap();
    for (k, v) in moto.env().into_iter().chain(kinesalite.env()) {
        // SAFETY: this binary has one test and this is its first statement:
        // no other thread exists yet that could read the environment.
        unsafe { std::env::set_var(k, v) };
    }
    dynamodb_txn_store_conforms();
    dynamodb_catalog_conforms(&moto);
    every_write_kind_recognises_its_own_success_after_a_lost_answer(&moto);
    a_catalog_commit_reported_failed_after_it_landed_keeps_its_payloads(&moto);
    pruning_deletes_the_objects_of_versions_and_checkpoints_gone(&moto);
    a_lease_grant_reported_failed_after_it_landed_is_held();
    a_missing_table_without_create_is_a_clear_error();
    s3_lake_reads_ranges_and_uploads_in_parts(&moto);
    s3_errors_name_the_url();
    kinesis_sources_conform(&kinesalite);
}

/// Kinesis streams fed as Debezium Server feeds them (row records keyed by
/// their key, BEGIN/END by transaction id, spread over the shards):
/// [`fovea_core::cdc::conformance`] with one shard and with three.
fn kinesis_sources_conform(kinesalite: &fovea_testkit::moto::Kinesalite) {
    use fovea_core::cdc::conformance::{SourceFixture, SuiteTxn, check};
    use fovea_core::cdc::source::{ChangeSource, Resume};
    use fovea_testkit::kinesis::{KinesisProducer, debezium_server_record};

    struct KinesisFixture {
        producer: KinesisProducer,
        stream: String,
    }

    impl SourceFixture for KinesisFixture {
        fn append(&mut self, txns: &[SuiteTxn]) -> fovea_core::Result<()> {
            let mut records = Vec::new();
            for line in txns.iter().flat_map(SuiteTxn::debezium_lines) {
                records.extend(debezium_server_record(&line)?);
            }
            self.producer.put(&self.stream, &records).map(drop)
        }

        fn open(&mut self, resume: Option<Resume>) -> fovea_core::Result<Box<dyn ChangeSource>> {
            let url = format!("kinesis://{}?poll_ms=10", self.stream);
            let options = fovea_aws::kinesis::KinesisOptions::parse(&url, fovea_core::cdc::InputFormat::Auto, false)?;
            Ok(Box::new(fovea_aws::kinesis::KinesisSource::open(options, resume.as_ref())?))
        }

        fn ends(&self) -> bool {
            true
        }
    }

    for shards in [1, 3] {
        let producer = KinesisProducer::connect(Some(&kinesalite.endpoint)).unwrap();
        let stream = format!("conformance-{shards}");
        producer.create_stream(&stream, shards).unwrap();
        check(&mut KinesisFixture { producer, stream });
    }
}

fn dynamodb_txn_store_conforms() {
    let n = AtomicUsize::new(0);
    conformance::check(&|| {
        let i = n.fetch_add(1, Ordering::Relaxed);
        let state = DynamoState::connect(&format!("dynamodb://fovea-conformance-{i}"), true).unwrap();
        Arc::new(state.txn_store()) as Arc<dyn TxnStore>
    });
    // A second connection to an existing table sees the same state.
    let again = DynamoState::connect("dynamodb://fovea-conformance-1", true).unwrap();
    assert_eq!(again.txn_store().lease().unwrap().map(|l| l.epoch), Some(4));
    // A table fovea created lets DynamoDB delete lapsed reader items.
    let ttl = fovea_core::lake::block_on_io(async {
        let config = fovea_aws::config::sdk_config().unwrap();
        aws_sdk_dynamodb::Client::new(&config).describe_time_to_live().table_name("fovea-conformance-1").send().await
    })
    .unwrap()
    .unwrap();
    let spec = ttl.time_to_live_description().unwrap();
    assert_eq!(spec.attribute_name(), Some(fovea_aws::dynamo::EXPIRES_AT));
    assert_eq!(spec.time_to_live_status().map(|s| s.as_str()), Some("ENABLED"));
}

/// Every conditional write the state and the catalog make (reservations,
/// watermarks, the lease, reader registrations, the lake's identity,
/// catalog versions, the storage-GC queue, pruning) has its answer lost
/// after it was applied, one write in three: both conformance suites still
/// pass — each write recognises its own success.
fn every_write_kind_recognises_its_own_success_after_a_lost_answer(moto: &fovea_testkit::moto::Moto) {
    let injector = FailAfterApplying::every_nth_write(3);
    let n = AtomicUsize::new(0);
    conformance::check(&|| {
        let i = n.fetch_add(1, Ordering::Relaxed);
        let state = DynamoState::connect(&format!("dynamodb://fovea-lost-{i}"), true).unwrap();
        Arc::new(state.with_interceptor(injector.clone()).txn_store()) as Arc<dyn TxnStore>
    });
    moto.create_bucket("fovea-lost").unwrap();
    fovea_core::catalog::conformance::check(&|| {
        let i = n.fetch_add(1, Ordering::Relaxed);
        let state = DynamoState::connect(&format!("dynamodb://fovea-lost-{i}"), true)
            .unwrap()
            .with_interceptor(injector.clone());
        let store = fovea_aws::s3::s3_store(&format!("s3://fovea-lost/{i}")).unwrap();
        let txn = Arc::new(state.txn_store()) as Arc<dyn TxnStore>;
        let catalog = Arc::new(DynamoCatalog::new(state, store)) as Arc<dyn Catalog>;
        (txn, catalog)
    });
    assert!(injector.fired.load(Ordering::Relaxed) > 10, "the faults were not injected");
}

fn dynamodb_catalog_conforms(moto: &fovea_testkit::moto::Moto) {
    moto.create_bucket("fovea-catalog").unwrap();
    let n = AtomicUsize::new(0);
    fovea_core::catalog::conformance::check(&|| {
        let i = n.fetch_add(1, Ordering::Relaxed);
        let state = DynamoState::connect(&format!("dynamodb://fovea-catalog-{i}"), true).unwrap();
        let store = fovea_aws::s3::s3_store(&format!("s3://fovea-catalog/{i}")).unwrap();
        let txn = Arc::new(state.txn_store()) as Arc<dyn TxnStore>;
        let catalog = Arc::new(DynamoCatalog::new(state, store)) as Arc<dyn Catalog>;
        (txn, catalog)
    });
}

fn a_missing_table_without_create_is_a_clear_error() {
    let err = DynamoState::connect("dynamodb://fovea-missing", false).unwrap_err().to_string();
    assert!(err.contains("fovea-missing") && err.contains("does not exist"), "{err}");
    let err = DynamoState::connect("dynamodb://x", true).unwrap_err().to_string();
    assert!(err.contains("expected dynamodb://TABLE"), "{err}");
}

fn s3_lake_reads_ranges_and_uploads_in_parts(moto: &fovea_testkit::moto::Moto) {
    moto.create_bucket("fovea-lake").unwrap();
    let store = fovea_aws::s3::s3_store("s3://fovea-lake/lakes/one").unwrap();
    let lake = Lake::new(store);
    // Above the multipart threshold: uploaded in parts, read back exactly.
    let big: Vec<u8> =
        (0..fovea_core::lake::MULTIPART_THRESHOLD as u32 + 12_345).map(|i| (i * 7 % 251) as u8).collect();
    let path = Path::from("big.bin");
    lake.put(&path, Bytes::from(big.clone())).unwrap();
    assert_eq!(lake.get(&path).unwrap().as_ref(), big.as_slice());
    let ranges = lake.get_ranges(&path, vec![5..10, 1_000_000..1_000_004]).unwrap();
    assert_eq!(ranges[0].as_ref(), &big[5..10]);
    assert_eq!(ranges[1].as_ref(), &big[1_000_000..1_000_004]);
    // The prefix keeps lakes apart.
    let listed = lake.list(&Path::from("")).unwrap();
    assert_eq!(listed.len(), 1);
    lake.delete(&path).unwrap();
    lake.delete(&path).unwrap();
}

fn s3_errors_name_the_url() {
    let err = fovea_aws::s3::s3_store("s3://no-such-bucket-here/x").err().unwrap().to_string();
    assert!(err.contains("s3://no-such-bucket-here/x"), "{err}");
}

/// Fails the next call of one operation after DynamoDB applied it (as a
/// timeout after success would): fault injection at the SDK level.
#[derive(Clone, Debug)]
struct FailAfterApplying {
    /// The operation whose next call fails (`TransactWriteItems`, …; `*`:
    /// every write).
    operation: &'static str,
    armed: Arc<std::sync::atomic::AtomicBool>,
    fired: Arc<AtomicUsize>,
    /// With `Some(n)`: every `n`-th successful call fails, armed or not.
    every: Option<usize>,
    seen: Arc<AtomicUsize>,
}

impl FailAfterApplying {
    fn on(operation: &'static str) -> Self {
        FailAfterApplying { operation, armed: Arc::default(), fired: Arc::default(), every: None, seen: Arc::default() }
    }

    /// Every `n`-th write that succeeded (of any kind) fails after it
    /// was applied.
    fn every_nth_write(n: usize) -> Self {
        FailAfterApplying { every: Some(n), ..Self::on("*") }
    }
}

/// DynamoDB operations that write.
const WRITES: [&str; 5] = ["UpdateItem", "PutItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"];

impl aws_sdk_dynamodb::config::Intercept for FailAfterApplying {
    fn name(&self) -> &'static str {
        "FailAfterApplying"
    }

    fn modify_before_completion(
        &self,
        context: &mut aws_sdk_dynamodb::config::interceptors::FinalizerInterceptorContextMut<'_>,
        _components: &aws_sdk_dynamodb::config::RuntimeComponents,
        cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let operation = cfg.load::<aws_smithy_runtime_api::client::orchestrator::Metadata>().map(|m| m.name());
        if let Some(n) = self.every {
            let succeeded = matches!(context.output_or_error(), Some(Ok(_)));
            let write = operation.is_some_and(|o| WRITES.contains(&o));
            // Relaxed: a counter of this test's calls.
            if succeeded && write && (self.seen.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(n) {
                self.fired.fetch_add(1, Ordering::Relaxed);
                return Err("injected: the answer was lost after the write was applied".into());
            }
            return Ok(());
        }
        if operation == Some(self.operation) && self.armed.swap(false, Ordering::Relaxed) {
            self.fired.fetch_add(1, Ordering::Relaxed);
            return Err("injected: the answer was lost after the transaction was applied".into());
        }
        Ok(())
    }
}

/// A catalog commit whose answer is lost after it landed (payloads too
/// large for an item, so they live in the lake) is recognised as landed by
/// reading its version back: the commit succeeds, its payload objects
/// stay, and the catalog reads whole. (It used to delete the payloads of
/// any commit that returned an error: the lake then named objects that no
/// longer existed.)
fn a_catalog_commit_reported_failed_after_it_landed_keeps_its_payloads(moto: &fovea_testkit::moto::Moto) {
    use fovea_core::catalog::{CatalogCommit, CatalogOperation, HistoryEntry};
    moto.create_bucket("fovea-ambiguous").unwrap();
    let injector = FailAfterApplying::on("TransactWriteItems");
    let state = DynamoState::connect("dynamodb://fovea-ambiguous", true).unwrap().with_interceptor(injector.clone());
    let store = fovea_aws::s3::s3_store("s3://fovea-ambiguous/lake").unwrap();
    let catalog = DynamoCatalog::new(state, Arc::clone(&store));
    let history: Vec<HistoryEntry> = (0..5000)
        .map(|i| HistoryEntry {
            ts: fovea_core::Ts(i + 1),
            source_txid: format!("txn-{i}"),
            commit_us: Some(i as i64),
            tables: vec![("s.t".into(), 1)],
            rows: 1,
            replayed_us: 0,
        })
        .collect();
    let commit = CatalogCommit {
        operations: vec![CatalogOperation {
            description: "big".into(),
            actions: serde_json::json!([]),
            ts: fovea_core::Ts(1),
        }],
        history,
        checkpoint: None,
    };
    injector.armed.store(true, Ordering::Relaxed);
    catalog.put_version(0, 1, &commit).unwrap();
    assert_eq!(injector.fired.load(Ordering::Relaxed), 1, "the fault was not injected");
    // A storage-GC queue longer than an item holds goes to the lake, and a
    // shorter one replacing it leaves no object behind.
    let stale = |n: u64| -> Vec<fovea_core::engine::StaleFile> {
        (0..n)
            .map(|i| fovea_core::engine::StaleFile {
                table: format!("schema_{i}.a_table_with_a_long_name"),
                file: fovea_core::FileId(i),
                rows: 1000,
                deleted: (i % 900) as usize + 1,
            })
            .collect()
    };
    catalog.set_storage_gc_queue(0, &stale(20_000)).unwrap();
    assert_eq!(catalog.storage_gc_queue().unwrap().len(), 20_000);
    let payloads =
        || fovea_core::lake::Lake::new(Arc::clone(&store)).list(&Path::from("_fovea/catalog")).unwrap().len();
    let with_long_queue = payloads();
    catalog.set_storage_gc_queue(0, &stale(3)).unwrap();
    assert_eq!(catalog.storage_gc_queue().unwrap().len(), 3);
    assert_eq!(payloads(), with_long_queue - 1, "the long queue's object stays");
    assert_eq!(catalog.version().unwrap(), 1);
    assert_eq!(catalog.history(None, 10).unwrap().len(), 10, "the payload reads back");
    assert_eq!(catalog.applied_identities(10_000).unwrap().len(), 5000);
}

/// Pruning deletes the lake objects that only pruned versions named (a
/// large history payload, the record of a checkpoint replaced since, an
/// orphan of a commit whose outcome was never known) and keeps the current
/// checkpoint's record.
fn pruning_deletes_the_objects_of_versions_and_checkpoints_gone(moto: &fovea_testkit::moto::Moto) {
    use fovea_core::catalog::{CatalogCommit, CheckpointRecord, HistoryEntry, Retention};
    moto.create_bucket("fovea-pruning").unwrap();
    let state = DynamoState::connect("dynamodb://fovea-pruning", true).unwrap();
    let store = fovea_aws::s3::s3_store("s3://fovea-pruning/lake").unwrap();
    let lake = fovea_core::lake::Lake::new(Arc::clone(&store));
    let catalog = DynamoCatalog::new(state, Arc::clone(&store));
    let engine = fovea_core::Engine::in_memory(fovea_core::EngineConfig::default().with_shards(1)).unwrap();
    let big_checkpoint = |ts: u64| {
        let mut manifest = engine.write_checkpoint().unwrap();
        manifest.checkpoint_ts = ts;
        Some(CheckpointRecord {
            manifest,
            input: "x".repeat(600_000),
            position: fovea_core::cdc::SourcePosition { line: ts, offset: 0 },
            source_state: None,
        })
    };
    let history: Vec<HistoryEntry> = (0..5000)
        .map(|i| HistoryEntry {
            ts: fovea_core::Ts(i + 1),
            source_txid: format!("txn-{i}"),
            commit_us: None,
            tables: vec![("s.t".into(), 1)],
            rows: 1,
            replayed_us: 0,
        })
        .collect();
    catalog.commit(0, 0, &CatalogCommit { history, ..Default::default() }).unwrap();
    catalog.commit(0, 1, &CatalogCommit { checkpoint: big_checkpoint(2), ..Default::default() }).unwrap();
    catalog.commit(0, 2, &CatalogCommit { checkpoint: big_checkpoint(3), ..Default::default() }).unwrap();
    catalog.commit(0, 3, &CatalogCommit::default()).unwrap();
    let orphan = Path::from(format!("_fovea/catalog/version-{:020}-someone-7.json", 2));
    lake.put(&orphan, bytes::Bytes::from_static(b"{}")).unwrap();
    let objects = || -> Vec<String> {
        let mut names: Vec<String> =
            lake.list(&Path::from("_fovea/catalog")).unwrap().into_iter().map(|o| o.location.to_string()).collect();
        names.sort();
        names
    };
    assert_eq!(objects().len(), 4, "{:?}", objects());
    let pruned = catalog.prune(0, &Retention { before_us: i64::MAX, keep_history: 0 }).unwrap();
    assert_eq!((pruned.versions, pruned.history, pruned.objects), (3, 5000, 3), "{pruned:?} {:?}", objects());
    let left = objects();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].starts_with(&format!("_fovea/catalog/checkpoint-{:020}-", 3)), "{left:?}");
    assert_eq!(catalog.latest_checkpoint().unwrap().map(|c| c.position.line), Some(3));
}

/// A lease grant whose answer is lost after DynamoDB applied it is
/// recognised as this grant (owner, epoch and expiry) and held, instead of
/// failing the start or waiting out a lease this process holds.
fn a_lease_grant_reported_failed_after_it_landed_is_held() {
    let injector = FailAfterApplying::on("UpdateItem");
    let state =
        DynamoState::connect("dynamodb://fovea-ambiguous-lease", true).unwrap().with_interceptor(injector.clone());
    let store = state.txn_store();
    injector.armed.store(true, Ordering::Relaxed);
    let lease = store.acquire_lease("me/1/1", 60_000_000, 1_000, None).unwrap();
    assert_eq!(injector.fired.load(Ordering::Relaxed), 1, "the fault was not injected");
    assert_eq!(lease.epoch, 1);
    assert_eq!(store.lease().unwrap(), Some(lease.clone()));
    // Another owner's grant at the same moment is still refused.
    let err = store.acquire_lease("other/2/2", 60_000_000, 2_000, None).unwrap_err();
    assert!(matches!(err, fovea_core::Error::LeaseHeld { .. }), "{err}");
    store.renew_lease(lease.epoch, 60_000_000, 3_000).unwrap();
}
