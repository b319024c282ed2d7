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
    let moto = fovea_aws::moto::Moto::start(&fovea_aws::moto::script()).unwrap();
    for (k, v) in moto.env() {
        // SAFETY: this binary has one test and this is its first statement:
        // no other thread exists yet that could read the environment.
        unsafe { std::env::set_var(k, v) };
    }
    dynamodb_txn_store_conforms();
    dynamodb_catalog_conforms(&moto);
    a_missing_table_without_create_is_a_clear_error();
    s3_lake_reads_ranges_and_uploads_in_parts(&moto);
    s3_errors_name_the_url();
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
}

fn dynamodb_catalog_conforms(moto: &fovea_aws::moto::Moto) {
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

fn s3_lake_reads_ranges_and_uploads_in_parts(moto: &fovea_aws::moto::Moto) {
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
