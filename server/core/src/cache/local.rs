//! Local reads: a committed entry's file for a client on this machine, the object
//! filled into the cache first when it is absent.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;

use super::index;
use super::{Body, Cache, CacheError, LocalReader, Origin, Read};
use crate::backend::{ByteRange, RangeFn, Source};

impl Cache {
    /// [`Mode::Local`]: the entry's file; else `fill` it (false: it cannot be held) and
    /// look again. `None` when it is not held: the caller reads it the usual way.
    pub(super) async fn local<F, Fut, E>(
        self: &Arc<Self>,
        stored: Option<(&dyn Source, &str, &str)>,
        ikey: &str,
        range: &RangeFn<'_>,
        reader: LocalReader,
        fill: F,
    ) -> Result<Option<Read>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<bool, E>>,
        E: From<CacheError>,
    {
        if let Some(read) = self
            .local_now(stored, ikey, range, reader, Origin::Hit)
            .await?
        {
            return Ok(Some(read));
        }
        if self.refusing() || !fill().await? {
            return Ok(None);
        }
        Ok(self
            .local_now(stored, ikey, range, reader, Origin::Miss)
            .await?)
    }

    /// The current entry's file, if this node holds one.
    pub(super) async fn local_now(
        self: &Arc<Self>,
        stored: Option<(&dyn Source, &str, &str)>,
        ikey: &str,
        range: &RangeFn<'_>,
        reader: LocalReader,
        origin: Origin,
    ) -> Result<Option<Read>, CacheError> {
        let cached = self.lock_index().get(ikey);
        let Some(entry) = cached else {
            return Ok(None);
        };
        if let Some((src, bucket, key)) = stored {
            if !self.still_current(src, bucket, key, ikey, &entry).await? {
                return Ok(None);
            }
        }
        let Some(lf) = self.local_file(ikey, entry, range, reader).await? else {
            return Ok(None);
        };
        let whole = lf.offset == 0 && lf.len == lf.meta.size;
        Ok(Some(Read {
            meta: lf.meta.clone(),
            range: (!whole).then_some(ByteRange {
                start: lf.offset,
                end: lf.offset + lf.len,
            }),
            body: Body::File(lf),
            origin,
        }))
    }

    /// Brings an object of `src` into the cache and waits for its commit: false when the
    /// policy does not admit it.
    pub async fn hold(
        self: &Arc<Self>,
        src: &dyn Source,
        bucket: &str,
        key: &str,
    ) -> Result<bool, CacheError> {
        if self.holds(bucket, key).is_some() {
            return Ok(true);
        }
        let ikey = index::key_of(bucket, key);
        let read = self
            .stream(src, bucket, key, &ikey, &|_| Ok(None), false)
            .await?;
        self.drain_fill(bucket, key, read).await
    }

    /// Reads a whole-object read to its end so that its fill commits, and waits for the
    /// commit; false for a read that is not admitted (dropping it stops the source).
    pub(super) async fn drain_fill(
        &self,
        bucket: &str,
        key: &str,
        read: Read,
    ) -> Result<bool, CacheError> {
        if read.origin == Origin::Bypass {
            return Ok(false);
        }
        let mut body = read.body.into_stream();
        while let Some(chunk) = body.next().await {
            chunk.map_err(|e| CacheError::FillFailed(e.to_string()))?;
        }
        if let Some(f) = self.flights.get(&index::key_of(bucket, key)) {
            f.ended().await;
        }
        Ok(true)
    }
}
