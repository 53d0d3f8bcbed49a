//! The node service: the layer beneath HTTP that every request path calls. It owns the
//! backend, the cache, the cluster view, the transforms and the jobs, and offers typed
//! operations on them: read (an object, a range, a shard member, a transform's result;
//! as a stream, metadata only, a committed copy only, or a local file), write, delete,
//! warm (prefetch), and the items of a GetBatch. S3 handlers, GetBatch, transforms,
//! prefetch jobs and peer requests all go through it; the node never reads its own data
//! over HTTP, and nothing here knows HTTP statuses or S3 codes (the API maps
//! [`NodeError`]).

mod batch;
mod calls;
mod catalog;
mod drain;
mod error;
mod index;
mod journal;
mod objects;
mod open;
mod peer;
mod planner;
mod prefetch;
mod read;
mod rebalance;
#[cfg(test)]
mod tests;
mod write;

use std::sync::{Arc, Mutex};

use crate::backend::{Backend, ByteStream, ObjectMeta};
use crate::cache::{Cache, CachePolicy, Peers};
use crate::cluster::calls::ObjectKey;
use crate::cluster::source::Watch;
use crate::cluster::Cluster;
use crate::jobs::Jobs;
use crate::stats::{Metric, Snapshot, Stats};
use crate::transform::pipelines::NamedPipeline;
use crate::transform::{Named, TransformError, Transforms};

pub use crate::cache::LocalReader;
use crate::sync::Locked;
pub use batch::{Data, Item, Outcome, Prep};
pub use calls::is_member_call;
pub use drain::DRAIN_FILE;
pub use error::NodeError;
pub use open::{BackendSpec, NodeConfig, OpenError};
pub use peer::{Forwarded, ToOwner};
pub use planner::sim::{simulate as simulate_planner, SimConfig, SimReport};
pub(crate) use read::Served;
pub use read::{etag_matches, Conditions, ReadMode, ReadRequest, Reply, Spilled};
pub use write::WriteConditions;

/// The node service. Its parts are its own: every layer above reaches them through its
/// methods.
pub struct Node {
    /// This node's id in the cluster.
    id: String,
    backend: Arc<dyn Backend>,
    cache: Arc<Cache>,
    cluster: Arc<Cluster>,
    stats: Arc<Stats>,
    transforms: Transforms,
    jobs: Jobs,
    /// Bytes per second a rebalance hands over (0: no rebalance).
    rebalance_rate: u64,
    rebalancer: rebalance::Rebalancer,
    /// Conditional writes of one key, one after the other (of two `If-None-Match: *`
    /// creations, one wins): on the key's owner, where every write of it goes.
    write_locks: crate::keylock::KeyLocks<ObjectKey>,
    /// The member list's source, followed once the node starts.
    watch: Mutex<Option<Watch>>,
    /// Datasets' catalogs, built once per version.
    catalogs: catalog::Catalogs,
    /// Jobs' plans, and the planner that fetches and drops by them.
    plans: crate::plans::Plans,
    planner: planner::Planner,
    /// Writes in flight, on disk until their outcome is known.
    journal: journal::Journal,
    /// Where the drain state is kept (`drain`).
    drain_file: std::sync::OnceLock<std::path::PathBuf>,
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
            watch: Mutex::new(None),
            catalogs: Default::default(),
            plans: crate::plans::Plans::new(crate::plans::DEFAULT_TTL),
            planner: Default::default(),
            journal: Default::default(),
            drain_file: Default::default(),
        })
    }

    /// Starts what the node does in the background: probing the members (and following
    /// the member list's source), the cache's watch on its disk, and a rebalance pass
    /// after each membership change (and one now). Within the runtime.
    pub fn start(self: &Arc<Self>) {
        let watch = self.watch.locked().take();
        if let Some(watch) = watch {
            crate::cluster::membership::spawn(self.cluster.clone(), watch);
        }
        if self.cluster.may_have_members() {
            let cache = self.cache.clone();
            self.cluster.on_trust(move |t| cache.set_trusted(t));
            self.cache.set_trusted(self.cluster.trusted());
            let cache = self.cache.clone();
            self.cluster.on_lease(move |until| cache.set_lease(until));
            self.cache.set_lease(self.cluster.lease_until());
        }
        self.cache.watch_room();
        self.start_settling();
        self.start_rebalancer();
        self.rebalance_soon();
        self.start_planner();
    }

    /// Objects were written or deleted through this node: the other members drop their
    /// copies before the write is acknowledged.
    pub async fn changed(&self, objects: &[ObjectKey]) {
        for o in objects {
            self.catalogs.touched(&o.bucket, &o.key);
        }
        self.cluster.invalidate_members(objects).await;
    }

    /// Every copy under `bucket/prefix` here is checked against the backend before its
    /// next hit: the number marked.
    pub fn revalidate_prefix(&self, bucket: &str, prefix: &str) -> usize {
        self.cache.revalidate_prefix(bucket, prefix)
    }

    /// A user's forced revalidation: every copy under `bucket/prefix`, on every member,
    /// is checked before its next hit. The copies marked, and whether every member took
    /// it (one that did not checks all its copies before it is routed to again).
    pub async fn revalidate_everywhere(&self, bucket: &str, prefix: &str) -> (usize, bool) {
        let here = self.cache.revalidate_prefix(bucket, prefix);
        let (there, all) = self.cluster.revalidate_members(bucket, prefix).await;
        (here + there, all)
    }

    /// This node missed invalidations (it was down for another member): check every copy
    /// against the backend before its next hit.
    pub fn revalidate(&self) {
        self.cache.revalidate_all();
    }

    /// This node's id in the cluster.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The counters, for the layer above to count what only it sees (requests, bytes
    /// sent, latency).
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Every counter and gauge now: the counters, the cache's levels, and what is
    /// sampled from elsewhere (CPU time, sendfile's bytes).
    pub fn stats_snapshot(&self) -> Snapshot {
        let mut s = self.stats.snapshot();
        let u = self.cache.usage();
        s.set(Metric::UsedBytes, u.used);
        s.set(Metric::ReservedBytes, u.reserved);
        s.set(Metric::CapacityBytes, u.capacity);
        s.set(Metric::Objects, u.objects);
        s.set(Metric::MappedBytes, self.cache.mapped_bytes());
        s.set(Metric::LockedBytes, self.cache.locked_bytes());
        s.set(Metric::DiskFreeBytes, self.cache.disk_free());
        s.set(Metric::Plans, self.plans.len() as u64);
        s.set(Metric::PrefetchJobs, self.jobs.running("prefetch") as u64);
        let members = self.cluster.members();
        s.set(Metric::Members, members.len() as u64);
        s.set(
            Metric::MembersUp,
            members.iter().filter(|m| m.is_up()).count() as u64,
        );
        s.set(Metric::DrainState, self.drain_state() as u64);
        let pool = self.transforms.pool();
        let (running, peak, admitted) = pool.levels();
        s.set(Metric::PrepRunning, running);
        s.set(Metric::PrepRunningPeak, peak);
        s.set(Metric::PrepAdmittedBytes, admitted);
        s.set(Metric::PrepBudgetBytes, pool.budget());
        s.set(
            Metric::PrepUnderWay,
            self.transforms.pipelines().flights() as u64,
        );
        let left = self
            .handover()
            .filter(|h| h.running)
            .map_or(0, |h| h.bytes_total.saturating_sub(h.bytes_done));
        s.set(Metric::HandoverBytesLeft, left);
        s.set(
            Metric::TransformCpu,
            s.get(Metric::TransformCpu) + crate::transform::children_cpu_us(),
        );
        s.set(
            Metric::BytesSentFromFiles,
            crate::io::sendfile::bytes_sent_from_files(),
        );
        s.set(
            Metric::ProcessCpu,
            crate::stats::rusage_us(libc::RUSAGE_SELF),
        );
        s
    }

    /// The cache's admission policy.
    pub fn cache_policy(&self) -> CachePolicy {
        self.cache.policy()
    }

    /// Whether the cache admits new objects.
    pub fn admitting(&self) -> bool {
        !self.cache.refusing()
    }

    /// The backend, for logs and operators: `fs:/path`, `s3:endpoint`.
    pub fn backend_name(&self) -> String {
        self.backend.describe()
    }

    /// A configured transform.
    pub fn transform(&self, name: &str) -> Result<Arc<Named>, TransformError> {
        self.transforms.lookup(name)
    }

    /// A configured pipeline.
    pub fn pipeline(&self, name: &str) -> Result<Arc<NamedPipeline>, TransformError> {
        self.transforms.pipelines().lookup(name)
    }

    /// Every pipeline's definition, by name (`GET /_granary/pipelines`).
    pub fn pipelines_json(&self) -> serde_json::Value {
        self.transforms.pipelines().json()
    }

    /// Prepares `input` as sample `key` by pipeline `p` for (seed, epoch), in the prep
    /// pool (with the memory `input` was admitted with).
    pub(crate) async fn prepare(
        &self,
        p: &Arc<NamedPipeline>,
        input: crate::transform::Input,
        (seed, epoch): (u64, u64),
        key: &str,
    ) -> Result<bytes::Bytes, NodeError> {
        let (job, sample, bytes) = (p.clone(), key.to_owned(), input.bytes);
        let out = self
            .transforms
            .pool()
            .run(input.admitted, crate::transform::pool::PREP, move |go_on| {
                job.pipeline
                    .prepare_while(&bytes, (seed, epoch, &sample), go_on)
            })
            .await
            .map_err(|e| read::prep_refused(p, key, e))?;
        Ok(bytes::Bytes::from(out.bytes))
    }
}
