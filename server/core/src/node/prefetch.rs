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
use granary_proto::encode;
use http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::{Node, NodeError, ReadRequest, Served};
use crate::backend::ListQuery;
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

/// What `POST /_granary/prefetch` takes: a bucket and prefix from a user, or (from the
/// coordinator) the objects of one member's part.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefetchRequest {
    pub bucket: String,
    #[serde(default)]
    pub prefix: String,
    #[serde(default)]
    pub objects: Option<Vec<Obj>>,
    #[serde(default)]
    pub part_of: Option<String>,
}

impl Node {
    /// Starts a prefetch; answers once the bucket is known to exist.
    pub async fn start_prefetch(
        self: &Arc<Self>,
        req: PrefetchRequest,
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

    /// Gives member `i` its share and follows it to the end. Returns the share back when
    /// the member did not take it or was lost on the way.
    async fn hand_over(&self, job: &Job, m: &Member, share: Vec<Obj>) -> Option<Vec<Obj>> {
        let c = &self.cluster;
        let body = json!({
            "bucket": job.bucket,
            "prefix": job.prefix,
            "objects": share,
            "part_of": job.id,
        })
        .to_string();
        let asked = c
            .ask(
                m,
                Method::POST,
                "/_granary/prefetch",
                body.into(),
                Duration::from_secs(10),
            )
            .await;
        let part_id = match asked {
            Ok(resp) if resp.status() == StatusCode::ACCEPTED => {
                let v: Option<serde_json::Value> = axum::body::to_bytes(resp.into_body(), 64 << 10)
                    .await
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok());
                v.and_then(|v| v["id"].as_str().map(str::to_owned))
            }
            Ok(resp) => {
                tracing::warn!(job = %job.id, node = %m.id, status = %resp.status(), "member refused a prefetch part");
                None
            }
            Err(why) => {
                c.mark_down(m, why);
                None
            }
        };
        let Some(part_id) = part_id else {
            return Some(share);
        };
        let slot = job.add_part(m.id.clone(), part_id.clone());
        let path = format!("/_granary/jobs/{part_id}");
        let mut misses = 0;
        loop {
            tokio::time::sleep(POLL_EVERY).await;
            if job.is_cancelled() {
                let _ = c
                    .ask(
                        m,
                        Method::DELETE,
                        &path,
                        bytes::Bytes::new(),
                        Duration::from_secs(2),
                    )
                    .await;
                return None;
            }
            let heard = match c
                .ask(
                    m,
                    Method::GET,
                    &path,
                    bytes::Bytes::new(),
                    Duration::from_secs(2),
                )
                .await
            {
                Ok(resp) if resp.status() == StatusCode::OK => {
                    axum::body::to_bytes(resp.into_body(), 64 << 10)
                        .await
                        .ok()
                        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                }
                _ => None,
            };
            let Some(v) = heard else {
                misses += 1;
                if misses >= 3 {
                    tracing::warn!(job = %job.id, node = %m.id, "lost a prefetch part; reading it here");
                    job.set_part(slot, Counts::default());
                    return Some(share);
                }
                continue;
            };
            misses = 0;
            if let Ok(counts) = serde_json::from_value::<Counts>(v.clone()) {
                job.set_part(slot, counts);
            }
            if v["state"].as_str() != Some("running") {
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
        let mut body = match self.read_or_leave(&req, &[]).await? {
            Served::Here(reply) => reply.body.into_stream(),
            Served::Elsewhere(m) => {
                let target = encode::object_path(bucket, key);
                match self.ask_spilled(&m, &target, &[]).await {
                    Ok(resp) if resp.status() == StatusCode::OK => Box::pin(
                        http_body_util::BodyExt::into_data_stream(resp.into_body())
                            .map(|c| c.map_err(std::io::Error::other)),
                    ),
                    Ok(resp) => {
                        return Err(NodeError::Peer {
                            node: m.id.clone(),
                            status: resp.status().as_u16(),
                            what: "a prefetched object",
                            message: String::new(),
                        })
                    }
                    Err(e) => {
                        self.cluster.mark_down(&m, &e);
                        self.read(&req).await?.body.into_stream()
                    }
                }
            }
        };
        let mut n = 0u64;
        while let Some(chunk) = body.next().await {
            n += chunk
                .map_err(|e| NodeError::Cut(format!("read cut short: {e}")))?
                .len() as u64;
        }
        Ok(Some(n))
    }
}
