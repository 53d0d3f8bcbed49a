//! The node service: the layer beneath HTTP that every request path calls. It owns the
//! backend, the cache, the cluster view, the transforms and the jobs, and offers typed
//! operations on them: read (an object, a range, a shard member, a transform's result;
//! as a stream, metadata only, a committed copy only, or a local file), write, delete,
//! warm (prefetch), and the items of a GetBatch. S3 handlers, GetBatch, transforms,
//! prefetch jobs and peer requests all go through it; the node never reads its own data
//! over HTTP, and nothing here knows HTTP statuses or S3 codes (the API maps
//! [`NodeError`]).

mod batch;
mod error;
mod prefetch;
mod read;
mod rebalance;
mod write;

use std::sync::Arc;

use crate::backend::{Backend, ByteStream, ObjectMeta};
use crate::cache::{Cache, Peers};
use crate::cluster::Cluster;
use crate::jobs::Jobs;
use crate::stats::Stats;
use crate::transform::Transforms;

pub use batch::{Data, Item, Outcome};
pub use error::NodeError;
pub use prefetch::{PrefetchRequest, PREFETCH_PARALLEL};
pub use read::{etag_matches, Conditions, ReadMode, ReadRequest, Reply, Served};
pub use rebalance::{Offer, Taken};
pub use write::WriteConditions;

pub struct Node {
    /// This node's id in the cluster.
    pub id: String,
    pub backend: Arc<dyn Backend>,
    pub cache: Arc<Cache>,
    pub cluster: Arc<Cluster>,
    pub stats: Arc<Stats>,
    pub transforms: Transforms,
    pub jobs: Jobs,
    /// Bytes per second a rebalance hands over (0: no rebalance).
    pub rebalance_rate: u64,
    rebalancer: rebalance::Rebalancer,
    /// Conditional writes of one key, one after the other (of two `If-None-Match: *`
    /// creations, one wins): on the key's owner, where every write of it goes.
    write_locks: crate::keylock::KeyLocks<(String, String)>,
}

/// The cluster as the cache sees it: members that may hold a copy.
struct ClusterPeers(Arc<Cluster>);

#[async_trait::async_trait]
impl Peers for ClusterPeers {
    async fn peer_copy(&self, bucket: &str, key: &str) -> Option<(ObjectMeta, ByteStream)> {
        self.0.peer_copy(bucket, key).await
    }
}

impl Node {
    /// Wires the parts together: in a cluster, misses ask peers first, and a node that
    /// hears the cluster again after hearing no member checks its copies.
    pub fn new(
        backend: Arc<dyn Backend>,
        cache: Arc<Cache>,
        cluster: Arc<Cluster>,
        stats: Arc<Stats>,
        transforms: Transforms,
        rebalance_rate: u64,
    ) -> Arc<Node> {
        if cluster.may_have_members() {
            cache.set_peers(Arc::new(ClusterPeers(cluster.clone())));
        }
        let c = cache.clone();
        cluster.on_rejoin(move || c.revalidate_all());
        cache.set_source(backend.clone());
        Arc::new(Node {
            id: cluster.id().to_owned(),
            backend,
            cache,
            cluster,
            stats,
            transforms,
            jobs: Jobs::default(),
            rebalance_rate,
            rebalancer: Default::default(),
            write_locks: Default::default(),
        })
    }

    /// Starts what the node does in the background: the cache's watch on its disk, and a
    /// rebalance pass after each membership change (and one now). Within the runtime.
    pub fn start(self: &Arc<Self>) {
        if self.cluster.may_have_members() {
            let cache = self.cache.clone();
            self.cluster.on_trust(move |t| cache.set_trusted(t));
            self.cache.set_trusted(self.cluster.trusted());
        }
        self.cache.watch_room();
        self.start_rebalancer();
        self.rebalance_soon();
    }

    /// Objects were written or deleted through this node: the other members drop their
    /// copies before the write is acknowledged.
    pub async fn changed(&self, objects: &[(String, String)]) {
        self.cluster.invalidate_members(objects).await;
    }

    /// Objects were written or deleted through another node: drop this node's copies.
    pub fn invalidate(&self, objects: &[(String, String)]) {
        for (bucket, key) in objects {
            self.cache.invalidate(bucket, key);
        }
    }

    /// This node missed invalidations (it was down for another member): check every copy
    /// against the backend before its next hit.
    pub fn revalidate(&self) {
        self.cache.revalidate_all();
    }
}
