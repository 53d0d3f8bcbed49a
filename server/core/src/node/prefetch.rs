//! Prefetch (`POST /_granary/prefetch`): warming a bucket/prefix cluster-wide.
//!
//! The node that takes the job (the coordinator) lists the prefix, splits the keys by
//! owner, and hands every other member its share as a part job; each owner reads its own
//! keys through its cache, a bounded number at a time, and the coordinator sums the
//! parts' progress. A member that does not take its part, or is lost during it, has its
//! share read by the coordinator instead (the next owner while it is down). A key
//! already cached costs no read.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::batch::gone;
use super::{Node, NodeError, ReadRequest, Served};
use crate::backend::ListQuery;
use crate::cluster::calls::{Found, JobCancel, JobStatus, PrefetchPart, Read};
use crate::cluster::Member;
use crate::jobs::{Counts, Job, Obj};

/// Objects one node reads at a time for a prefetch.
pub const PREFETCH_PARALLEL: usize = 8;
/// How often the coordinator asks members for their parts' progress.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// Keys listed, split and handed out at a time by a prefetch's coordinator.
const BATCH: usize = 10_000;
/// Batches whose parts may run on the members at once.
const BATCHES_IN_FLIGHT: usize = 2;

impl Node {
    /// Starts a prefetch; answers once the bucket is known to exist.
    pub async fn start_prefetch(
        self: &Arc<Self>,
        req: PrefetchPart,
    ) -> Result<Arc<Job>, NodeError> {
        if req.bucket.is_empty() {
            return Err(NodeError::Invalid("name a bucket".into()));
        }
        if let Some(objects) = req.objects {
            // A part handed over by the coordinator: read these keys here.
            let job = Arc::new(Job::new("prefetch", &req.bucket, &req.prefix, req.part_of));
            job.add_total(objects.len() as u64, objects.iter().map(|o| o.size).sum());
            self.jobs.insert(job.clone());
            let (node, j) = (self.clone(), job.clone());
            tokio::spawn(async move {
                node.read_here(&j, objects).await;
                j.finish_counted();
            });
            return Ok(job);
        }
        let running = self.jobs.running("prefetch");
        if running >= crate::jobs::MAX_RUNNING_PREFETCHES {
            return Err(NodeError::Busy(format!(
                "this node runs {running} prefetches already; retry once one has ended"
            )));
        }
        self.backend.head_bucket(&req.bucket).await?;
        let job = Arc::new(Job::new("prefetch", &req.bucket, &req.prefix, None));
        self.jobs.insert(job.clone());
        let (node, j) = (self.clone(), job.clone());
        tokio::spawn(async move { node.coordinate(j).await });
        Ok(job)
    }

    /// The coordinator's side, a batch of keys at a time (so that a prefix of millions
    /// of keys is never held whole): list a batch, split it by owner, hand the members
    /// their parts, read its own share, and go on listing while the parts run (at most
    /// [`BATCHES_IN_FLIGHT`] batches' parts at once); then follow the parts to their end.
    async fn coordinate(self: Arc<Self>, job: Arc<Job>) {
        let mut after = None;
        let mut followers: std::collections::VecDeque<Vec<tokio::task::JoinHandle<_>>> =
            Default::default();
        loop {
            if job.is_cancelled() {
                return;
            }
            let (batch, more) = match self.list_batch(&job, &mut after).await {
                Ok(listed) => listed,
                Err(e) => return job.fail(format!("listing failed: {e}")),
            };
            let c = &self.cluster;
            let mut mine = Vec::new();
            let mut shares: Vec<(Arc<Member>, Vec<Obj>)> = Vec::new();
            for o in batch {
                let owner = c.owner(&job.bucket, &o.key);
                if c.is_me(&owner) {
                    mine.push(o);
                } else if let Some((_, share)) = shares.iter_mut().find(|(m, _)| m.id == owner.id) {
                    share.push(o);
                } else {
                    shares.push((owner, vec![o]));
                }
            }
            let mut parts = Vec::new();
            for (m, share) in shares {
                let (node, j) = (self.clone(), job.clone());
                parts.push(tokio::spawn(
                    async move { node.hand_over(&j, &m, share).await },
                ));
            }
            followers.push_back(parts);
            self.read_here(&job, mine).await;
            while followers.len() > BATCHES_IN_FLIGHT || (!more && !followers.is_empty()) {
                let parts = followers.pop_front().expect("not empty");
                for f in parts {
                    if let Ok(Some(left)) = f.await {
                        // The member could not do its part: read it here.
                        self.read_here(&job, left).await;
                    }
                }
            }
            if !more {
                break;
            }
        }
        job.finish_counted();
    }

    /// The next batch of keys after `after` (up to [`BATCH`]), counted into the job's
    /// total; whether more follow.
    async fn list_batch(
        &self,
        job: &Job,
        after: &mut Option<String>,
    ) -> Result<(Vec<Obj>, bool), crate::backend::BackendError> {
        let mut batch = Vec::new();
        loop {
            let q = ListQuery {
                prefix: job.prefix.clone(),
                delimiter: None,
                after: after.clone(),
                max_keys: 1000,
            };
            let page = self.backend.list_objects(&job.bucket, &q).await?;
            for o in page.objects {
                job.add_total(1, o.size);
                batch.push(Obj {
                    key: o.key,
                    size: o.size,
                });
            }
            let more = page.is_truncated && page.last.is_some();
            *after = page.last;
            if !more || batch.len() >= BATCH || job.is_cancelled() {
                return Ok((batch, more));
            }
        }
    }

    /// Gives member `m` its share and follows it to the end. Returns the share back when
    /// the member did not take it or was lost on the way.
    async fn hand_over(&self, job: &Job, m: &Member, share: Vec<Obj>) -> Option<Vec<Obj>> {
        let c = &self.cluster;
        let part = PrefetchPart {
            bucket: job.bucket.clone(),
            prefix: job.prefix.clone(),
            objects: Some(share),
            part_of: Some(job.id.clone()),
        };
        let part_id = match c.call(m, &part).await {
            Ok(started) => started.id,
            Err(e) => {
                if gone(&e) {
                    c.mark_down(m, &e);
                } else {
                    tracing::warn!(job = %job.id, node = %m.id, error = %e, "member refused a prefetch part");
                }
                return part.objects;
            }
        };
        let slot = job.add_part(m.id.clone(), part_id.clone());
        let mut misses = 0;
        loop {
            tokio::time::sleep(POLL_EVERY).await;
            if job.is_cancelled() {
                let _ = c.call(m, &JobCancel { id: part_id }).await;
                return None;
            }
            let Ok(view) = c
                .call(
                    m,
                    &JobStatus {
                        id: part_id.clone(),
                    },
                )
                .await
            else {
                misses += 1;
                if misses >= 3 {
                    tracing::warn!(job = %job.id, node = %m.id, "lost a prefetch part; reading it here");
                    job.set_part(slot, Counts::default());
                    return part.objects;
                }
                continue;
            };
            misses = 0;
            job.set_part(slot, view.counts());
            if !view.running() {
                return None;
            }
        }
    }

    /// Reads `objects` through this node's cache, `PREFETCH_PARALLEL` at a time.
    async fn read_here(self: &Arc<Self>, job: &Job, objects: Vec<Obj>) {
        futures::stream::iter(objects)
            .for_each_concurrent(PREFETCH_PARALLEL, |o| async move {
                if job.is_cancelled() {
                    return;
                }
                match self.warm(&job.bucket, &o.key).await {
                    Ok(Some(n)) => job.done_one(n),
                    Ok(None) => job.skipped_one(),
                    Err(e) => {
                        tracing::warn!(job = %job.id, key = %o.key, error = %e, "prefetch read failed");
                        job.failed_one();
                    }
                }
            })
            .await;
    }

    /// Brings one object into the cluster's cache (this node's, or a member with room
    /// when this one has none): its size once it is there, `None` when the cluster has
    /// no room left for it (never-evict: the rest are served through).
    pub async fn warm(self: &Arc<Self>, bucket: &str, key: &str) -> Result<Option<u64>, NodeError> {
        if let Some(size) = self.cache.holds(bucket, key) {
            return Ok(Some(size));
        }
        if self.cache.refusing() && !self.cluster.can_spill(&[]) {
            return Ok(None);
        }
        let req = ReadRequest::object(bucket, key);
        let body = match self.read_or_leave(&req, &[]).await? {
            Served::Here(reply) => reply.body.into_stream(),
            Served::Elsewhere(m) => {
                let read = Read {
                    bucket,
                    key,
                    archpath: None,
                    transform: None,
                    refused: &[],
                };
                match self.read_spilled(&m, &read).await {
                    Ok(Found::Bytes { body, .. }) => body,
                    Ok(Found::Missing) => {
                        return Err(crate::backend::BackendError::NoSuchKey(key.to_owned()).into())
                    }
                    Err(e) if gone(&e) => {
                        self.cluster.mark_down(&m, &e);
                        self.read(&req).await?.body.into_stream()
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        };
        Ok(Some(drain(body).await?))
    }
}

/// Reads a body to its end (its bytes are being written into the cache): how many.
pub(super) async fn drain(mut body: crate::backend::ByteStream) -> Result<u64, NodeError> {
    let mut n = 0u64;
    while let Some(chunk) = body.next().await {
        n += chunk
            .map_err(|e| NodeError::Cut(format!("read cut short: {e}")))?
            .len() as u64;
    }
    Ok(n)
}
