//! Derived objects: computed on demand (a transform's result, keyed by its inputs, so it
//! never changes and needs no check against a source) and cached like any object by the
//! same single flight: one computation however many readers ask at once.

use std::future::Future;

use std::sync::Arc;

use bytes::Bytes;

use super::flight::Joined;
use super::index;
use super::{Body, Cache, CacheError, Counted, DeriveError, Fetched, Mode, Origin, Read};
use crate::backend::{ByteStream, GetObject, ObjectMeta, RangeFn};
use crate::stats::Metric;

impl Cache {
    /// Reads an object computed on demand (a transform's result, keyed by its inputs, so
    /// it never changes and needs no check against a source): a hit, or one computation
    /// however many readers ask at once, its result admitted and shared like a fill.
    /// `compute` runs in the reader that leads the fill, or in a reader that finds the
    /// leader gave up. Modes: `Stream`, `Local` (others read as `Stream`).
    pub async fn read_derived<F, Fut, E>(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
        mode: Mode,
        compute: F,
    ) -> Result<Read, DeriveError<E>>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(ObjectMeta, Bytes), E>>,
    {
        let ikey = index::key_of(bucket, key);
        if let Mode::Local(reader) = mode {
            let fill = || async {
                let read = self
                    .derived(bucket, key, &ikey, &|_| Ok(None), &compute)
                    .await?;
                self.drain_fill(bucket, key, read)
                    .await
                    .map_err(DeriveError::Cache)
            };
            if let Some(read) = self.local(None, &ikey, range, reader, fill).await? {
                return Ok(read);
            }
        }
        self.derived(bucket, key, &ikey, range, &compute).await
    }

    pub(super) async fn derived<F, Fut, E>(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        ikey: &str,
        range: &RangeFn<'_>,
        compute: &F,
    ) -> Result<Read, DeriveError<E>>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(ObjectMeta, Bytes), E>>,
    {
        let lead = loop {
            let cached = self.lock_index().get(ikey);
            if let Some(entry) = cached {
                let read = self.serve_entry(ikey, entry, range)?;
                self.stats.add(Metric::Hits, 1);
                return Ok(read);
            }
            match self.join(ikey) {
                // Committed since the lookup (results are never dropped but by damage).
                Joined::Held => continue,
                Joined::Lead(lead) => break lead,
                Joined::Follow(fill) => {
                    if let Some(read) = self.follow(fill, range).await? {
                        return Ok(read);
                    }
                    // The leader gave up: compute here, and serve it through.
                    let (meta, bytes) = compute().await.map_err(DeriveError::Compute)?;
                    return Ok(self.computed_through(meta, bytes, range)?);
                }
            }
        };
        let (meta, bytes) = compute().await.map_err(DeriveError::Compute)?;
        let client = range(&meta).map_err(CacheError::Refused)?;
        if !self.admit(meta.size) {
            drop(lead);
            return Ok(self.computed_through(meta, bytes, range)?);
        }
        let resume = Some(super::fill::Resume::Memory(bytes.clone()));
        let body: ByteStream = Box::pin(futures::stream::once(async move { Ok(bytes) }));
        let fetched = Fetched {
            obj: GetObject { meta, body },
            client,
            origin: Origin::Miss,
            counted: Counted::Nowhere,
        };
        let size = fetched.obj.meta.size;
        match self.start_fill(lead, bucket, key, fetched, resume) {
            Ok((read, _)) => Ok(read),
            Err(e) => {
                self.lock_index().release(size);
                Err(CacheError::Disk(e).into())
            }
        }
    }

    /// A computed object not admitted: its range, served from memory.
    pub(super) fn computed_through(
        &self,
        meta: ObjectMeta,
        bytes: Bytes,
        range: &RangeFn<'_>,
    ) -> Result<Read, CacheError> {
        let client = range(&meta).map_err(CacheError::Refused)?;
        let piece = match client {
            Some(r) => bytes.slice(r.start as usize..r.end as usize),
            None => bytes,
        };
        self.stats.add(Metric::Bypasses, 1);
        Ok(Read {
            meta,
            range: client,
            body: Body::Stream(Box::pin(futures::stream::once(async move { Ok(piece) }))),
            origin: Origin::Bypass,
        })
    }
}
