//! Rebalance: when the member list changes or a member comes back, each node walks its
//! cache and hands every object it no longer owns to the object's owner, which takes it
//! as a peer fill checked against the backend's ETag; the old copy is dropped once the
//! owner holds that version. So the cluster's disks keep about one copy of each object
//! whatever joins, leaves, dies and returns, and never-evict capacity is not lost to
//! copies nobody reads.
//!
//! - A pass runs a moment after the last change ([`DEBOUNCE`]), once the view is
//!   settled, and once at start (a node that restarted mid-way finishes the job).
//! - It is a job (`kind: rebalance`) in `/_granary/jobs`, paced to `--rebalance-rate`
//!   bytes per second (0 turns rebalance off).
//! - Objects left behind for a passing reason (the owner did not answer, or did not yet
//!   see itself as owner) are offered again in a later pass ([`RETRY`]); those the owner
//!   has no room for stay where they are, as a spilled copy would.
//! - It fails no read: the copy stays readable until its owner holds it, and a reader
//!   of the key on the owner meanwhile follows the fill or reads the backend.
//! - A member that goes down is not a change to act on: its keys' next owners fill
//!   them on demand, and hand them back when it returns.
//! - Transform results whose source has another owner now are dropped, not moved: they
//!   are recomputed where their source is read.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::{Node, NodeError};
use crate::backend::{BackendError, GetObject, ObjectMeta};
use crate::cache::Adopted;
use crate::cluster::calls::{Take, Taken};
use crate::cluster::Member;
use crate::jobs::Job;
use crate::stats::Metric;
use crate::sync::Locked;
use crate::transform::{Derived, RESULTS};

/// How long membership must stay still before a pass starts.
pub const DEBOUNCE: Duration = Duration::from_secs(2);
/// How long after a pass that left objects for a passing reason the next one starts.
pub const RETRY: Duration = Duration::from_secs(10);

/// Wakes the rebalancer.
#[derive(Default)]
pub struct Rebalancer {
    wake: Notify,
    pending: AtomicBool,
    /// The latest pass's job.
    last: std::sync::Mutex<Option<Arc<Job>>>,
}

impl Rebalancer {
    pub(super) fn last(&self) -> Option<Arc<Job>> {
        self.last.locked().clone()
    }
}

impl Node {
    /// Starts the rebalancer: a pass a moment after each change, and one now.
    pub(super) fn start_rebalancer(self: &Arc<Self>) {
        if self.rebalance_rate == 0 {
            tracing::info!("rebalance off (--rebalance-rate 0)");
            return;
        }
        let weak = Arc::downgrade(self);
        self.cluster.on_change(move || {
            if let Some(node) = weak.upgrade() {
                node.rebalance_soon();
            }
        });
        let node = self.clone();
        tokio::spawn(async move {
            let r = &node.rebalancer;
            loop {
                // Quiet for DEBOUNCE, and settled, before a pass.
                loop {
                    r.pending.store(false, Ordering::Release);
                    tokio::time::sleep(DEBOUNCE).await;
                    if !r.pending.load(Ordering::Acquire) && node.cluster.settled() {
                        break;
                    }
                }
                node.rebalance().await;
                r.wake.notified().await;
            }
        });
    }

    /// Schedules a pass (the member list changed, or a member came back).
    pub fn rebalance_soon(&self) {
        self.rebalancer.pending.store(true, Ordering::Release);
        self.rebalancer.wake.notify_one();
    }

    /// One pass: every object this node holds and another member owns is offered to
    /// its owner, paced to the rebalance rate.
    pub(super) async fn rebalance(self: &Arc<Self>) {
        if self.cluster.is_single() {
            return;
        }
        let mut moves: Vec<(String, String, ObjectMeta, Arc<Member>)> = Vec::new();
        let mut dropped = 0;
        for (bucket, key, meta) in self.cache.entries() {
            if bucket == RESULTS {
                let source = serde_json::from_str::<Derived>(&key)
                    .ok()
                    .map(|d| self.cluster.owner(&d.bucket, &d.key));
                if source.is_some_and(|o| !self.cluster.is_me(&o))
                    && self.cache.forget(&bucket, &key, &meta.etag)
                {
                    dropped += 1;
                }
                continue;
            }
            let owner = self.cluster.owner(&bucket, &key);
            if !self.cluster.is_me(&owner) {
                moves.push((bucket, key, meta, owner));
            }
        }
        if moves.is_empty() {
            if dropped > 0 {
                tracing::info!(
                    dropped,
                    "rebalance: transform results of sources owned elsewhere dropped"
                );
            }
            self.note_drained();
            return;
        }
        let job = Arc::new(Job::new("rebalance", "", "", None));
        job.add_total(moves.len() as u64, moves.iter().map(|m| m.2.size).sum());
        self.jobs.insert(job.clone());
        *self.rebalancer.last.locked() = Some(job.clone());
        tracing::info!(job = %job.id, objects = moves.len(), "rebalance: handing objects to their owners");
        let mut pace = Pace::new(self.rebalance_rate);
        let mut again = false;
        for (bucket, key, meta, owner) in moves {
            if job.is_cancelled() {
                break;
            }
            pace.take(meta.size).await;
            match self.offer(&owner, &bucket, &key, &meta).await {
                Ok(taken @ (Taken::Held | Taken::Stale)) => {
                    self.cache.forget(&bucket, &key, &meta.etag);
                    if matches!(taken, Taken::Held) {
                        self.stats.add(Metric::BytesHandedOver, meta.size);
                    }
                    job.done_one(meta.size);
                }
                Ok(Taken::NotAdmitted) => {
                    // A draining node holds on until the owner has room.
                    again |= !self.drain_state().is_serving();
                    job.skipped_one();
                }
                Ok(Taken::NotOwner | Taken::NotReady) => {
                    again = true;
                    job.skipped_one();
                }
                Err(e) => {
                    tracing::warn!(job = %job.id, key = %key, node = %owner.id, error = %e, "rebalance: an object was not handed over");
                    // An owner that went down is handed its objects when it returns.
                    again |= owner.is_up();
                    job.failed_one();
                }
            }
        }
        job.finish_counted();
        tracing::info!(job = %job.id, progress = %job.to_json(), "rebalance done");
        self.note_drained();
        if again {
            let node = Arc::downgrade(self);
            tokio::spawn(async move {
                tokio::time::sleep(RETRY).await;
                if let Some(node) = node.upgrade() {
                    node.rebalance_soon();
                }
            });
        }
    }

    /// Offers this node's copy of `bucket/key` to its owner.
    async fn offer(
        &self,
        owner: &Member,
        bucket: &str,
        key: &str,
        meta: &ObjectMeta,
    ) -> Result<Taken, NodeError> {
        let offer = Take {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            etag: meta.etag.clone(),
            size: meta.size,
            from: self.id.clone(),
        };
        self.cluster.call(owner, &offer).await.map_err(|e| {
            if super::batch::gone(&e) {
                self.cluster.mark_down(owner, &e);
            }
            e.into()
        })
    }

    /// Takes an object a member offers ([`Take`]): its copy, checked against
    /// the backend, filled into this node's cache when this node owns the key. The check
    /// and the copy run while the cache leads the key's fill, so a write that lands
    /// meanwhile keeps the offered (old) copy out.
    pub async fn take(self: &Arc<Self>, offer: &Take) -> Result<Taken, NodeError> {
        let (bucket, key) = (offer.bucket.as_str(), offer.key.as_str());
        if !self.cluster.is_me(&self.cluster.owner(bucket, key)) {
            return Ok(Taken::NotOwner);
        }
        if !self.cache.trusted() {
            return Ok(Taken::NotReady);
        }
        let fetch = async {
            let now = match self.backend.head_object(bucket, key).await {
                Ok(m) => m,
                Err(BackendError::NoSuchKey(_) | BackendError::NoSuchBucket(_)) => {
                    return Err(Ok(Taken::Stale))
                }
                Err(e) => return Err(Err(NodeError::from(e))),
            };
            if now.etag != offer.etag {
                return Err(Ok(Taken::Stale));
            }
            let from = self
                .cluster
                .member(&offer.from)
                .ok_or_else(|| Err(NodeError::Invalid(format!("no member `{}`", offer.from))))?;
            let Some((meta, body)) = self.cluster.copy_from(&[from], bucket, key).await else {
                return Err(Err(NodeError::Cut(format!(
                    "member {} no longer holds {bucket}/{key}",
                    offer.from
                ))));
            };
            if meta.etag != now.etag || meta.size != now.size {
                return Err(Ok(Taken::Stale));
            }
            Ok(GetObject { meta: now, body })
        };
        if self.cache.holds(bucket, key).is_some() {
            // Whichever version it is, the owner's own copy stands (a write through it
            // replaced it, or it is the same one).
            return Ok(Taken::Held);
        }
        let adopted = match self.cache.adopt(bucket, key, &offer.etag, fetch).await? {
            Ok(a) => a,
            Err(refused) => return refused,
        };
        Ok(match adopted {
            Adopted::Held | Adopted::Committed => Taken::Held,
            Adopted::NotAdmitted => Taken::NotAdmitted,
            // A write of the key came through meanwhile: the offered copy is old.
            Adopted::Overtaken => Taken::Stale,
        })
    }
}

/// Paces bytes to a rate (bytes per second).
struct Pace {
    rate: u64,
    started: Instant,
    sent: u64,
}

impl Pace {
    fn new(rate: u64) -> Pace {
        Pace {
            rate,
            started: Instant::now(),
            sent: 0,
        }
    }

    /// Waits until `n` more bytes fit the rate.
    async fn take(&mut self, n: u64) {
        if self.rate == 0 {
            return;
        }
        let due = Duration::from_secs_f64(self.sent as f64 / self.rate as f64);
        let elapsed = self.started.elapsed();
        if due > elapsed {
            tokio::time::sleep(due - elapsed).await;
        }
        self.sent += n;
    }
}
