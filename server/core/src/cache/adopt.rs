//! Moving objects between members (rebalance): the cache's inventory, taking a copy a
//! peer hands over, and giving up a copy once its new owner holds it.

use std::sync::Arc;

use super::flight::Joined;
use super::index;
use super::{Cache, CacheError, Counted, Fetched, Origin};
use crate::backend::{GetObject, ObjectMeta};

/// What became of a copy offered to this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adopted {
    /// This node held that version already.
    Held,
    /// Filled and committed.
    Committed,
    /// The policy did not admit it (never-evict: full).
    NotAdmitted,
    /// A write or delete of the key overlapped: nothing was kept.
    Overtaken,
}

impl Cache {
    /// Every committed entry: bucket, key and metadata.
    pub fn entries(&self) -> Vec<(String, String, ObjectMeta)> {
        self.lock_index()
            .entries()
            .into_iter()
            .filter_map(|(ikey, e)| {
                let (bucket, key) = ikey.split_once('/')?;
                Some((bucket.to_owned(), key.to_owned(), e.meta.clone()))
            })
            .collect()
    }

    /// Takes a peer's copy of `bucket/key` into the cache through the usual fill:
    /// admission, the temp file, the commit, all of it skipped when a write of the key
    /// overlaps. `fetch` gets the copy (checked against the backend, or refused with the
    /// fetcher's reason `R`); it runs while this node leads the key's fill, so a write or
    /// invalidation that lands at any point after the check keeps the copy out.
    pub async fn adopt<R>(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        etag: &str,
        fetch: impl std::future::Future<Output = Result<GetObject, R>>,
    ) -> Result<Result<Adopted, R>, CacheError> {
        let ikey = index::key_of(bucket, key);
        let held = |cache: &Cache| {
            cache
                .lock_index()
                .get(&ikey)
                .is_some_and(|e| e.meta.etag == etag)
        };
        if held(self) {
            return Ok(Ok(Adopted::Held));
        }
        let lead = match self.join(&ikey) {
            Joined::Held => {
                return Ok(Ok(if held(self) {
                    Adopted::Held
                } else {
                    Adopted::Overtaken
                }))
            }
            Joined::Follow(fill) => {
                fill.ended().await;
                return Ok(Ok(if held(self) {
                    Adopted::Committed
                } else {
                    Adopted::Overtaken
                }));
            }
            Joined::Lead(lead) => lead,
        };
        let obj = match fetch.await {
            Ok(obj) => obj,
            Err(refused) => return Ok(Err(refused)),
        };
        if !self.admit(obj.meta.size) {
            return Ok(Ok(Adopted::NotAdmitted));
        }
        let size = obj.meta.size;
        let fetched = Fetched {
            obj,
            client: None,
            origin: Origin::Peer,
            counted: Counted::Peers,
        };
        let (read, fill) = match self.start_fill(lead, bucket, key, fetched, None) {
            Ok(started) => started,
            Err(e) => {
                self.lock_index().release(size);
                return Err(e.into());
            }
        };
        let mut body = read.body.into_stream();
        while let Some(chunk) = futures::StreamExt::next(&mut body).await {
            chunk.map_err(|e| CacheError::FillFailed(e.to_string()))?;
        }
        fill.ended().await;
        Ok(Ok(if held(self) {
            Adopted::Committed
        } else {
            Adopted::Overtaken
        }))
    }

    /// Drops this node's copy of `bucket/key` if it is still the version `etag` (its new
    /// owner holds it now); true when one was dropped.
    pub fn forget(&self, bucket: &str, key: &str, etag: &str) -> bool {
        let ikey = index::key_of(bucket, key);
        let entry = self.lock_index().get(&ikey);
        match entry {
            Some(e) if e.meta.etag == etag => {
                self.drop_entry(&ikey, &e);
                true
            }
            _ => false,
        }
    }
}
