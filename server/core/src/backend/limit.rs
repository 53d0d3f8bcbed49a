//! A cap on backend reads in flight (`--max-backend-fetches`): every `get_object` holds a
//! place from the request until its body ends or is dropped. A read that finds no place
//! within [`WAIT`] is refused with S3's `503 SlowDown`, so a node under a storm of cold
//! reads neither opens unbounded connections to the store nor queues clients for ever.
//! Everything else passes straight through.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::Semaphore;

use super::{
    Backend, BackendError, BucketInfo, ByteRange, ByteStream, GetObject, ListPage, ListQuery,
    ObjectMeta, ObjectParts, PartInfo, PartOf, PutOptions, RangeFn, Result, Source, UploadInfo,
};

/// How long a read waits for a place before it is refused.
pub const WAIT: Duration = Duration::from_secs(2);

/// `inner` with at most `max` reads in flight.
pub struct Limited {
    inner: Arc<dyn Backend>,
    places: Arc<Semaphore>,
    max: usize,
}

impl Limited {
    /// Wraps `inner`; `max == 0` returns it unwrapped.
    pub fn wrap(inner: Arc<dyn Backend>, max: usize) -> Arc<dyn Backend> {
        if max == 0 {
            return inner;
        }
        Arc::new(Limited {
            inner,
            places: Arc::new(Semaphore::new(max)),
            max,
        })
    }

    /// Waits up to [`WAIT`] for a place (a timer only when none is free at once).
    async fn wait_for_place(&self) -> Result<tokio::sync::OwnedSemaphorePermit> {
        tokio::time::timeout(WAIT, self.places.clone().acquire_owned())
            .await
            .map_err(|_| {
                BackendError::Busy(format!(
                    "{} backend reads are in flight, the most this node makes; retry",
                    self.max
                ))
            })?
            .map_err(|_| BackendError::Unavailable("the node is stopping".into()))
    }

    /// Runs one read holding a place; the place is given back when the body ends.
    async fn hold<'a, F>(&self, read: F) -> Result<(GetObject, Option<ByteRange>)>
    where
        F: std::future::Future<Output = Result<(GetObject, Option<ByteRange>)>> + Send + 'a,
    {
        let place = match self.places.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => self.wait_for_place().await?,
        };
        let (obj, range) = read.await?;
        // The place lives as long as the body stream.
        let body: ByteStream = Box::pin(obj.body.map(move |item| {
            let _held = &place;
            item
        }));
        Ok((
            GetObject {
                meta: obj.meta,
                body,
            },
            range,
        ))
    }
}

#[async_trait]
impl Source for Limited {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn head_object(&self, bucket: &str, key: &str) -> Result<ObjectMeta> {
        self.inner.head_object(bucket, key).await
    }

    async fn parts_of(&self, bucket: &str, key: &str) -> Result<Option<ObjectParts>> {
        self.inner.parts_of(bucket, key).await
    }

    async fn part_of(&self, bucket: &str, key: &str, n: usize) -> Result<PartOf> {
        self.inner.part_of(bucket, key, n).await
    }

    async fn get_object(
        &self,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<(GetObject, Option<ByteRange>)> {
        self.hold(self.inner.get_object(bucket, key, range)).await
    }

    async fn get_object_whole_likely(
        &self,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<(GetObject, Option<ByteRange>)> {
        self.hold(self.inner.get_object_whole_likely(bucket, key, range))
            .await
    }
}

#[async_trait]
impl Backend for Limited {
    async fn list_buckets(&self) -> Result<Vec<BucketInfo>> {
        self.inner.list_buckets().await
    }

    async fn create_bucket(&self, bucket: &str) -> Result<()> {
        self.inner.create_bucket(bucket).await
    }

    async fn head_bucket(&self, bucket: &str) -> Result<()> {
        self.inner.head_bucket(bucket).await
    }

    async fn delete_bucket(&self, bucket: &str) -> Result<()> {
        self.inner.delete_bucket(bucket).await
    }

    async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        body: ByteStream,
        opts: PutOptions,
    ) -> Result<ObjectMeta> {
        self.inner.put_object(bucket, key, body, opts).await
    }

    async fn delete_object(&self, bucket: &str, key: &str) -> Result<()> {
        self.inner.delete_object(bucket, key).await
    }

    async fn list_objects(&self, bucket: &str, query: &ListQuery) -> Result<ListPage> {
        self.inner.list_objects(bucket, query).await
    }

    async fn create_multipart(&self, bucket: &str, key: &str, opts: PutOptions) -> Result<String> {
        self.inner.create_multipart(bucket, key, opts).await
    }

    async fn upload_part(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        body: ByteStream,
        opts: PutOptions,
    ) -> Result<PartInfo> {
        self.inner
            .upload_part(bucket, key, upload_id, part, body, opts)
            .await
    }

    async fn list_parts(&self, bucket: &str, key: &str, upload_id: &str) -> Result<Vec<PartInfo>> {
        self.inner.list_parts(bucket, key, upload_id).await
    }

    async fn complete_multipart(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        headers: &[(String, String)],
    ) -> Result<ObjectMeta> {
        self.inner
            .complete_multipart(bucket, key, upload_id, parts, headers)
            .await
    }

    async fn abort_multipart(&self, bucket: &str, key: &str, upload_id: &str) -> Result<()> {
        self.inner.abort_multipart(bucket, key, upload_id).await
    }

    async fn list_uploads(&self, bucket: &str, prefix: &str) -> Result<Vec<UploadInfo>> {
        self.inner.list_uploads(bucket, prefix).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fs::FsBackend;

    #[tokio::test]
    async fn reads_beyond_the_cap_slow_down_until_a_body_ends() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FsBackend::open(dir.path()).unwrap();
        fs.create_bucket("bkt").await.unwrap();
        let body: ByteStream = Box::pin(futures::stream::once(async {
            Ok(bytes::Bytes::from_static(b"payload"))
        }));
        fs.put_object("bkt", "k", body, PutOptions::default())
            .await
            .unwrap();
        let b = Limited::wrap(Arc::new(fs), 1);
        let (first, _) = b.get_object("bkt", "k", &|_| Ok(None)).await.unwrap();
        let started = tokio::time::Instant::now();
        let refused = b.get_object("bkt", "k", &|_| Ok(None)).await;
        let Err(BackendError::Busy(_)) = refused else {
            panic!("a second read while the first body is open");
        };
        assert!(started.elapsed() >= WAIT);
        // The first body read to its end gives the place back.
        let got: Vec<_> = first.body.collect().await;
        assert_eq!(got.len(), 1);
        drop(got);
        let (again, _) = b.get_object("bkt", "k", &|_| Ok(None)).await.unwrap();
        let bytes: Vec<_> = again.body.collect().await;
        assert_eq!(bytes[0].as_ref().unwrap().as_ref(), b"payload");
    }
}
