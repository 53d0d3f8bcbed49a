//! Limits on backend reads. A cap on reads in flight (`--max-backend-fetches`): every
//! `get_object` holds a place from the request until its body ends or is dropped; a read
//! that finds no place within [`WAIT`] is refused with S3's `503 SlowDown`, so a node
//! under a storm of cold reads neither opens unbounded connections to the store nor
//! queues clients for ever. And a cap on the bytes per second all reads bring
//! (`--backend-rate`): each piece of a body waits for its turn at that rate, for
//! operators who must bound egress, and for benchmarks of a slow store. Everything else
//! passes straight through.

use granary_proto::Header;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::Semaphore;

use super::{
    Backend, BackendError, BucketInfo, ByteRange, ByteStream, GetObject, ListPage, ListQuery,
    ObjectMeta, ObjectParts, PartInfo, PartOf, PutOptions, RangeFn, Result, Source, UploadInfo,
};
use crate::sync::Locked;

/// How long a read waits for a place before it is refused.
pub const WAIT: Duration = Duration::from_secs(2);

/// `inner` with at most `max` reads in flight (0: any), bringing at most `rate` bytes per
/// second between them (0: no cap).
pub struct Limited {
    inner: Arc<dyn Backend>,
    places: Arc<Semaphore>,
    max: usize,
    pace: Option<Arc<Pace>>,
}

/// How far behind the clock the rate's turns may start: a piece that comes a little
/// late (a timer's lateness, a read's own time) takes up the time lost, so the bytes
/// passed over any span come to the rate, not to less; after an idle spell, at most
/// this much goes at once.
const CATCH_UP: Duration = Duration::from_millis(20);

/// Turns at a rate: the time each piece of bytes may pass.
struct Pace {
    bytes_per_sec: f64,
    next: Mutex<Instant>,
}

impl Pace {
    /// When `n` more bytes have passed: their turn starts right after the bytes given
    /// turns before them (or [`CATCH_UP`] ago, when that is later), and lasts as long as
    /// `n` bytes take at the rate.
    fn turn(&self, n: usize) -> Instant {
        self.turn_at(n, Instant::now())
    }

    fn turn_at(&self, n: usize, now: Instant) -> Instant {
        let mut next = self.next.locked();
        let at = (*next).max(now.checked_sub(CATCH_UP).unwrap_or(now));
        *next = at + Duration::from_secs_f64(n as f64 / self.bytes_per_sec);
        *next
    }
}

impl Limited {
    /// Wraps `inner`; with no cap at all, returns it unwrapped.
    pub fn wrap(inner: Arc<dyn Backend>, max: usize, rate: u64) -> Arc<dyn Backend> {
        if max == 0 && rate == 0 {
            return inner;
        }
        Arc::new(Limited {
            inner,
            places: Arc::new(Semaphore::new(if max == 0 {
                Semaphore::MAX_PERMITS
            } else {
                max
            })),
            max,
            pace: (rate > 0).then(|| {
                Arc::new(Pace {
                    bytes_per_sec: rate as f64,
                    next: Mutex::new(Instant::now()),
                })
            }),
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
        let body = self.paced(obj.body, place);
        Ok((
            GetObject {
                meta: obj.meta,
                body,
            },
            range,
        ))
    }

    /// A body that keeps its read's place while it lasts, and comes at the rate.
    fn paced(&self, body: ByteStream, place: tokio::sync::OwnedSemaphorePermit) -> ByteStream {
        // The place lives as long as the body stream.
        let body: ByteStream = Box::pin(body.map(move |item| {
            let _held = &place;
            item
        }));
        match &self.pace {
            None => body,
            Some(pace) => {
                let pace = pace.clone();
                Box::pin(body.then(move |item| {
                    let at = item.as_ref().map_or(Instant::now(), |b| pace.turn(b.len()));
                    async move {
                        tokio::time::sleep_until(at.into()).await;
                        item
                    }
                }))
            }
        }
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

    async fn get_range(
        &self,
        bucket: &str,
        key: &str,
        etag: &str,
        range: ByteRange,
    ) -> Result<ByteStream> {
        let place = match self.places.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => self.wait_for_place().await?,
        };
        let body = self.inner.get_range(bucket, key, etag, range).await?;
        Ok(self.paced(body, place))
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
        headers: &[Header],
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
        let b = Limited::wrap(Arc::new(fs), 1, 0);
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

    /// Two reads together bring their bytes at the rate, not each at it; every byte
    /// comes.
    #[tokio::test]
    async fn reads_together_keep_to_the_rate() {
        let mem = crate::backend::mem::Mem::with(&[
            ("a", bytes::Bytes::from(vec![1u8; 512 << 10])),
            ("b", bytes::Bytes::from(vec![2u8; 512 << 10])),
        ]);
        let b = Limited::wrap(mem, 0, 2 << 20);
        let started = std::time::Instant::now();
        let read = |key: &'static str| {
            let b = b.clone();
            async move {
                let (obj, _) = b.get_object("bkt", key, &|_| Ok(None)).await.unwrap();
                let chunks: Vec<bytes::Bytes> = obj.body.map(|c| c.unwrap()).collect().await;
                chunks.concat()
            }
        };
        let (a, bb) = tokio::join!(read("a"), read("b"));
        assert_eq!((a, bb), (vec![1u8; 512 << 10], vec![2u8; 512 << 10]));
        // 1 MiB at 2 MiB/s: half a second, less the catch-up the first piece may take.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(500) - CATCH_UP, "{took:?}");
    }

    /// Pieces that each come a little after their turn (a timer's lateness) still pass
    /// at the rate over the whole read; after an idle spell, no more than the catch-up
    /// goes at once.
    #[test]
    fn lateness_is_taken_up_not_lost() {
        let start = Instant::now();
        let pace = Pace {
            bytes_per_sec: 1_000_000.0,
            next: Mutex::new(start),
        };
        // 100 pieces of 10 kB, each asked for 2 ms after the last turn ended.
        let mut now = start;
        let mut end = start;
        for _ in 0..100 {
            end = pace.turn_at(10_000, now);
            now = end + Duration::from_millis(2);
        }
        // 1 MB at 1 MB/s: one second, not 1.2.
        assert_eq!(end - start, Duration::from_secs(1));
        // Idle for a second: the next piece's turn starts the catch-up before now.
        let now = end + Duration::from_secs(1);
        assert_eq!(
            pace.turn_at(10_000, now),
            now - CATCH_UP + Duration::from_millis(10)
        );
    }
}
