//! Writes through the node are cached too: a PUT's body is teed into a cache temp file
//! while it streams to the backend, and committed as the key's entry once the backend
//! has taken the object (with the backend's ETag). Writes that overlap another write or
//! a delete of the same key do not commit: the cache never holds a version the backend
//! may not have last.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

use super::flight::Flights;
use super::index::{self, Entry};
use super::store::{self, BlockSums};
use super::Cache;
use crate::backend::{Backend, BackendError, ByteStream, ObjectMeta, PutOptions};

/// Per key: how many writes are running, and a counter bumped by every write start and
/// every invalidation.
#[derive(Debug, Default)]
pub struct Writes {
    keys: HashMap<String, (u32, u64)>,
}

impl Writes {
    /// Registers a write; returns its ticket and whether it is the key's only one.
    fn begin(&mut self, key: &str) -> (u64, bool) {
        let e = self.keys.entry(key.to_owned()).or_default();
        let alone = e.0 == 0;
        e.0 += 1;
        e.1 += 1;
        (e.1, alone)
    }

    /// Ends a write; returns whether nothing else touched the key since it began.
    fn end(&mut self, key: &str, ticket: u64) -> bool {
        let Some(e) = self.keys.get_mut(key) else {
            return false;
        };
        let untouched = e.1 == ticket;
        e.0 -= 1;
        if e.0 == 0 {
            self.keys.remove(key);
        }
        untouched
    }

    /// Whether a write of the key is under way.
    pub fn active(&self, key: &str) -> bool {
        self.keys.contains_key(key)
    }

    /// Marks the key touched (an invalidation).
    pub fn bump(&mut self, key: &str) {
        if let Some(e) = self.keys.get_mut(key) {
            e.1 += 1;
        }
    }
}

impl Cache {
    /// Writes an object to the backend, caching its bytes on the way when the policy
    /// admits them and the length is known.
    pub async fn put_through(
        self: &Arc<Self>,
        backend: &dyn Backend,
        bucket: &str,
        key: &str,
        body: ByteStream,
        opts: PutOptions,
    ) -> Result<ObjectMeta, BackendError> {
        let ikey = index::key_of(bucket, key);
        self.invalidate(bucket, key);
        let size = match opts.size {
            Some(size) if self.admit(size) => size,
            _ => {
                let meta = backend.put_object(bucket, key, body, opts).await?;
                self.invalidate(bucket, key);
                return Ok(meta);
            }
        };
        // The write is registered in the same step as the fills of the old version are
        // forgotten: a fill led between the two would be neither stale nor seen by the
        // write, and could commit the old bytes after the write's.
        let (ticket, alone) = {
            let mut table = self.flights.lock();
            self.invalidate_locked(&mut table, &ikey);
            self.lock_writes().begin(&ikey)
        };
        let temp = self
            .tmp
            .join(format!("put-{}", uuid::Uuid::new_v4().simple()));
        let (tx, mut rx) = mpsc::channel::<Bytes>(8);
        let writer_path = temp.clone();
        let writer = tokio::task::spawn_blocking(move || -> io::Result<(File, Vec<u32>, u64)> {
            let mut file = File::create(&writer_path)?;
            let mut sums = BlockSums::default();
            let mut n = 0u64;
            while let Some(chunk) = rx.blocking_recv() {
                file.write_all(&chunk)?;
                sums.update(&chunk);
                n += chunk.len() as u64;
            }
            Ok((file, sums.finish(), n))
        });
        // The cache copy must never slow or fail the write itself: if the writer falls
        // over, the tee stops feeding it and the commit is skipped.
        let feeding = Arc::new(AtomicBool::new(true));
        let tee_feeding = feeding.clone();
        let tee = body.then(move |item| {
            let tx = tx.clone();
            let feeding = tee_feeding.clone();
            async move {
                if let Ok(b) = &item {
                    if feeding.load(Ordering::Relaxed) && tx.send(b.clone()).await.is_err() {
                        feeding.store(false, Ordering::Relaxed);
                    }
                }
                item
            }
        });
        let result = backend.put_object(bucket, key, Box::pin(tee), opts).await;
        let written = writer.await.map_err(io::Error::other).and_then(|r| r);
        // The footer and fsync happen while the write is still registered, so a delete
        // or another write in the meantime is seen below.
        let prepared = match (&result, written) {
            (Ok(meta), Ok((mut file, crcs, n)))
                if feeding.load(Ordering::Relaxed) && n == meta.size =>
            {
                // The fsync waits on the disk (a large write's copy for seconds): not on a
                // runtime thread.
                let (bucket, key, meta) = (bucket.to_owned(), key.to_owned(), meta.clone());
                tokio::task::spawn_blocking(move || {
                    store::write_footer(&mut file, &bucket, &key, &meta, &crcs)
                        .and_then(|()| file.sync_all())
                        .map(|()| crcs)
                })
                .await
                .map_err(io::Error::other)
                .and_then(|r| r)
            }
            (Ok(_), Ok(_)) => Err(io::Error::other("the cache copy is incomplete")),
            (_, Err(e)) => Err(e),
            (Err(_), Ok(_)) => Err(io::Error::other("the backend refused the write")),
        };
        let dest = store::entry_path(&self.objects, bucket, key);
        let mut commit_lock = self.flights.lock();
        // A fill led while the write was under way may hold either version: it never
        // commits (it was marked stale), and from now on no reader follows it either.
        Flights::forget(&mut commit_lock, &ikey);
        let untouched = self.lock_writes().end(&ikey, ticket);
        let committed = prepared.and_then(|crcs| {
            if !(alone && untouched) {
                return Err(io::Error::other(
                    "the write overlapped another change of the key",
                ));
            }
            store::publish(&temp, &dest).map(|()| crcs)
        });
        match (&result, committed) {
            (Ok(meta), Ok(crcs)) => {
                self.lock_index().commit(
                    ikey,
                    Entry::fresh(dest, meta.clone(), crcs, self.generation()),
                    size,
                );
            }
            (_, committed) => {
                if let Err(e) = committed {
                    if super::room::is_full(&e) {
                        self.room.refused("a write's copy met a full disk");
                    }
                    tracing::debug!(key = %ikey, error = %e, "write not cached");
                }
                self.lock_index().release(size);
                let _ = fs::remove_file(&temp);
            }
        }
        drop(commit_lock);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lone_untouched_write_commits() {
        let mut w = Writes::default();
        let (t, alone) = w.begin("k");
        assert!(alone);
        assert!(w.end("k", t), "nothing else happened");
        let (t1, alone1) = w.begin("k");
        let (t2, alone2) = w.begin("k");
        assert!(alone1 && !alone2);
        assert!(!w.end("k", t1), "a second write began after the first");
        assert!(w.end("k", t2));
        let (t, _) = w.begin("k");
        w.bump("k");
        assert!(!w.end("k", t), "a delete came in between");
        assert!(w.keys.is_empty());
    }
}
