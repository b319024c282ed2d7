//! An object store that counts what goes through it: requests by kind and
//! bytes read and written. On S3 requests are what costs, so benchmarks
//! report them per replayed row, and tests use the counts to prove that a
//! reader fetched only what it needed.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, Result,
};

/// Counters of a [`MeteredStore`] (all monotonic).
#[derive(Debug, Default)]
pub struct StoreMeter {
    /// GET requests (whole objects, ranges, each range of a `get_ranges`).
    pub gets: AtomicU64,
    /// Bytes returned by GETs.
    pub bytes_read: AtomicU64,
    /// PUT requests (a multipart upload counts once per part and once to
    /// complete).
    pub puts: AtomicU64,
    /// Bytes written.
    pub bytes_written: AtomicU64,
    /// LIST requests.
    pub lists: AtomicU64,
    /// Objects deleted.
    pub deletes: AtomicU64,
}

/// A snapshot of a [`StoreMeter`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCounts {
    /// GET requests.
    pub gets: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// PUT requests.
    pub puts: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// LIST requests.
    pub lists: u64,
    /// Objects deleted.
    pub deletes: u64,
}

impl StoreCounts {
    /// Requests of every kind.
    pub fn requests(&self) -> u64 {
        self.gets + self.puts + self.lists + self.deletes
    }
}

impl StoreMeter {
    /// The counts now.
    pub fn counts(&self) -> StoreCounts {
        // Relaxed: independent statistics.
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StoreCounts {
            gets: l(&self.gets),
            bytes_read: l(&self.bytes_read),
            puts: l(&self.puts),
            bytes_written: l(&self.bytes_written),
            lists: l(&self.lists),
            deletes: l(&self.deletes),
        }
    }

    fn add(counter: &AtomicU64, n: u64) {
        // Relaxed: independent statistics.
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Wraps a store and counts its traffic in a shared [`StoreMeter`].
#[derive(Debug)]
pub struct MeteredStore {
    inner: Arc<dyn ObjectStore>,
    meter: Arc<StoreMeter>,
}

impl MeteredStore {
    /// `inner`, counted in `meter`.
    pub fn new(inner: Arc<dyn ObjectStore>, meter: Arc<StoreMeter>) -> Self {
        MeteredStore { inner, meter }
    }
}

impl fmt::Display for MeteredStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Metered({})", self.inner)
    }
}

#[derive(Debug)]
struct MeteredUpload {
    inner: Box<dyn MultipartUpload>,
    meter: Arc<StoreMeter>,
}

#[async_trait]
impl MultipartUpload for MeteredUpload {
    fn put_part(&mut self, data: PutPayload) -> object_store::UploadPart {
        StoreMeter::add(&self.meter.puts, 1);
        StoreMeter::add(&self.meter.bytes_written, data.content_length() as u64);
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        StoreMeter::add(&self.meter.puts, 1);
        self.inner.complete().await
    }

    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }
}

#[async_trait]
impl ObjectStore for MeteredStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        StoreMeter::add(&self.meter.puts, 1);
        StoreMeter::add(&self.meter.bytes_written, payload.content_length() as u64);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(MeteredUpload { inner, meter: Arc::clone(&self.meter) }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        StoreMeter::add(&self.meter.gets, 1);
        let got = self.inner.get_opts(location, options).await?;
        StoreMeter::add(&self.meter.bytes_read, got.range.end - got.range.start);
        Ok(got)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        // Through `get_opts`, so each coalesced request is counted.
        object_store::coalesce_ranges(
            ranges,
            |range| async move {
                let options = GetOptions { range: Some(range.clone().into()), ..GetOptions::default() };
                self.get_opts(location, options).await?.bytes().await
            },
            object_store::OBJECT_STORE_COALESCE_DEFAULT,
        )
        .await
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        let meter = Arc::clone(&self.meter);
        self.inner
            .delete_stream(locations)
            .inspect(move |r| {
                if r.is_ok() {
                    StoreMeter::add(&meter.deletes, 1);
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        StoreMeter::add(&self.meter.lists, 1);
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        StoreMeter::add(&self.meter.lists, 1);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        StoreMeter::add(&self.meter.puts, 1);
        self.inner.copy_opts(from, to, options).await
    }
}
