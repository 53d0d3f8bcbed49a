//! A whole object read over several connections at once: byte ranges of one version,
//! requested side by side and handed on in order.
//!
//! Where members share a short backend per connection (TCP shares a link so, and an
//! egress cap on a store does too), a member's part of it is its number of connections.
//! A planner that needs more of the backend than one connection brings would otherwise
//! run more fetches, each holding a shard's room in the cache while it runs, room that
//! a small cache takes from entries it keeps (and fetches again). Read in ranges, one
//! fetch takes as many connections as its need asks, and holds one room.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use super::{ByteRange, GetObject, ObjectMeta, ObjectParts, RangeFn, Result, Source};

/// The size of each range: what AWS advises for byte-range fetches of large objects
/// ("typical sizes for byte-range requests are 8 MB or 16 MB"), and eight of the
/// cache's 1 MiB fill pieces. An object smaller than two ranges is read in one request.
pub const RANGE: u64 = 8 << 20;

/// The ranges an object of `size` bytes is read in: 1 for one smaller than two ranges.
pub fn ranges_of(size: u64) -> usize {
    if size < 2 * RANGE {
        1
    } else {
        size.div_ceil(RANGE) as usize
    }
}

/// A source that reads whole objects with `streams` requests in flight (memory: that
/// many ranges, held until their turn); every other call goes to `inner` as it is.
pub struct Ranged<S: Source + ?Sized> {
    inner: Arc<S>,
    streams: usize,
}

impl<S: Source + ?Sized> Ranged<S> {
    pub fn new(inner: Arc<S>, streams: usize) -> Ranged<S> {
        Ranged {
            inner,
            streams: streams.max(1),
        }
    }
}

/// Range `r` of version `etag`, read whole.
async fn range_bytes<S: Source + ?Sized>(
    src: Arc<S>,
    (bucket, key, etag): (Arc<str>, Arc<str>, Arc<str>),
    r: ByteRange,
) -> io::Result<Vec<Bytes>> {
    let body = src
        .get_range(&bucket, &key, &etag, r)
        .await
        .map_err(io::Error::other)?;
    gather(body, r.len()).await
}

/// A body read whole; one that is not `len` bytes long is an error.
async fn gather(body: super::ByteStream, len: u64) -> io::Result<Vec<Bytes>> {
    let parts: Vec<Bytes> = body.try_collect().await?;
    let got: u64 = parts.iter().map(|b| b.len() as u64).sum();
    if got != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("a range of {len} bytes came with {got}"),
        ));
    }
    Ok(parts)
}

#[async_trait]
impl<S: Source + ?Sized> Source for Ranged<S> {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn head_object(&self, bucket: &str, key: &str) -> Result<ObjectMeta> {
        self.inner.head_object(bucket, key).await
    }

    async fn get_object(
        &self,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<(GetObject, Option<ByteRange>)> {
        self.inner.get_object(bucket, key, range).await
    }

    async fn get_object_whole_likely(
        &self,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<(GetObject, Option<ByteRange>)> {
        if self.streams < 2 {
            return self.inner.get_object_whole_likely(bucket, key, range).await;
        }
        // The first range from the request that learns the version; the caller's
        // decision is taken on that version's metadata, as it would be.
        let split = AtomicBool::new(false);
        let first = |meta: &ObjectMeta| {
            let wanted = range(meta)?;
            if wanted.is_none() && ranges_of(meta.size) > 1 {
                split.store(true, Ordering::Relaxed);
                return Ok(Some(ByteRange::from(0..RANGE)));
            }
            Ok(wanted)
        };
        let (obj, resolved) = self.inner.get_object(bucket, key, &first).await?;
        if !split.load(Ordering::Relaxed) {
            return Ok((obj, resolved));
        }
        let GetObject { meta, body } = obj;
        let size = meta.size;
        let version: (Arc<str>, Arc<str>, Arc<str>) =
            (bucket.into(), key.into(), meta.etag.as_str().into());
        let inner = self.inner.clone();
        let head = futures::future::Either::Left(gather(body, RANGE));
        let rest = (1..ranges_of(size) as u64).map(move |i| {
            let r = ByteRange::from(i * RANGE..size.min((i + 1) * RANGE));
            futures::future::Either::Right(range_bytes(inner.clone(), version.clone(), r))
        });
        let body = futures::stream::iter(std::iter::once(head).chain(rest))
            .buffered(self.streams)
            .map_ok(|parts| futures::stream::iter(parts.into_iter().map(Ok)))
            .try_flatten();
        Ok((
            GetObject {
                meta,
                body: Box::pin(body),
            },
            None,
        ))
    }

    async fn get_range(
        &self,
        bucket: &str,
        key: &str,
        etag: &str,
        range: ByteRange,
    ) -> Result<super::ByteStream> {
        self.inner.get_range(bucket, key, etag, range).await
    }

    async fn parts_of(&self, bucket: &str, key: &str) -> Result<Option<ObjectParts>> {
        self.inner.parts_of(bucket, key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::mem::Mem;
    use crate::sync::Locked;
    use std::sync::Mutex;

    #[tokio::test]
    async fn a_whole_object_read_in_ranges_is_every_byte_in_order() {
        let mem = Mem::with(&[]);
        for size in [0u64, 5, RANGE, 2 * RANGE - 1, 2 * RANGE, 3 * RANGE + 12_345] {
            let bytes: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4099) as u8).collect();
            let key = format!("k{size}");
            mem.objects
                .locked()
                .insert(key.clone(), Bytes::from(bytes.clone()));
            for streams in [1, 2, 5] {
                let src = Ranged::new(mem.clone(), streams);
                let asked = Mutex::new(0);
                let all = |_: &ObjectMeta| {
                    *asked.locked() += 1;
                    Ok(None)
                };
                let before = mem.gets.load(std::sync::atomic::Ordering::SeqCst);
                let (obj, resolved) = src.get_object_whole_likely("b", &key, &all).await.unwrap();
                assert_eq!(resolved, None);
                assert_eq!(obj.meta.size, size);
                assert_eq!(*asked.locked(), 1, "the caller decides once");
                let got: Vec<Bytes> = obj.body.try_collect().await.unwrap();
                assert_eq!(got.concat(), bytes, "size {size}, {streams} streams");
                let requests = if streams > 1 { ranges_of(size) } else { 1 };
                let opened = mem.gets.load(std::sync::atomic::Ordering::SeqCst) - before;
                assert_eq!(opened, requests, "one request per range");
            }
        }
    }

    #[tokio::test]
    async fn a_range_asked_for_is_read_as_asked() {
        let bytes: Vec<u8> = (0..3 * RANGE).map(|i| i as u8).collect();
        let mem = Mem::with(&[("k", Bytes::from(bytes.clone()))]);
        let src = Ranged::new(mem, 4);
        let part = |_: &ObjectMeta| Ok(Some(ByteRange::from(10..20)));
        let (obj, resolved) = src.get_object_whole_likely("b", "k", &part).await.unwrap();
        assert_eq!(resolved, Some(ByteRange::from(10..20)));
        let got: Vec<Bytes> = obj.body.try_collect().await.unwrap();
        assert_eq!(got.concat(), &bytes[10..20]);
    }
}
