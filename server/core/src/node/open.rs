//! Opening a node: its configuration (what the server makes of its flags and config
//! file), and the parts wired together from it: the backend behind its fetch cap, the
//! cache on its disk, the cluster view, the transforms.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use super::Node;
use crate::backend::{self, Backend};
use crate::cache::{Cache, CachePolicy};
use crate::cluster::{self, ClusterConfig};
use crate::io::EngineChoice;
use crate::stats::Stats;
use crate::sync::Locked;
use crate::transform::pipelines::Pipelines;
use crate::transform::{TransformSpec, Transforms};

/// Where objects come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSpec {
    /// A local directory, each sub-folder a bucket.
    Fs(PathBuf),
    /// S3 through the standard AWS configuration chain, at this endpoint when given
    /// (path-style addressing).
    S3 { endpoint: Option<String> },
}

/// Everything a node is opened with.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's name in the cluster.
    pub node_id: String,
    /// The cache lives in `DATA_DIR/cache`.
    pub data_dir: PathBuf,
    pub backend: BackendSpec,
    /// Backend reads in flight at once (0: no limit).
    pub max_backend_fetches: usize,
    /// Bytes per second read from the backend, all reads together (0: no cap).
    pub backend_rate: u64,
    /// A job's plan is dropped after this long without a sign of progress.
    pub plan_ttl: std::time::Duration,
    /// How long a hit may go on its last check against the backend.
    pub revalidate: crate::cache::Revalidation,
    /// Bytes the cache may hold; `None`: 90% of the free disk.
    pub cache_capacity: Option<u64>,
    pub cache_policy: CachePolicy,
    /// Check cache checksums while serving hits.
    pub verify_reads: bool,
    pub read_engine: EngineChoice,
    /// Which connections large hits leave by with `sendfile(2)`.
    pub sendfile: crate::io::sendfile::SendfileChoice,
    /// Cold fills are written around the page cache.
    pub direct_fills: bool,
    /// Bytes per second a rebalance hands over (0: no rebalance).
    pub rebalance_rate: u64,
    pub transforms: BTreeMap<String, TransformSpec>,
    /// Named pipelines (`[pipelines.NAME]`).
    pub pipelines: BTreeMap<String, granary_prep::PipelineSpec>,
    /// Samples prepared at once (`--prep-threads`).
    pub prep_threads: usize,
    /// Bytes of prepared samples kept for the jobs that read them (`--prep-memory`).
    pub prep_memory: u64,
    pub cluster: ClusterConfig,
}

/// Why a node could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A pipeline's definition cannot run.
    #[error("{0}")]
    Pipeline(String),
    #[error("cannot create {what} {}: {source}", path.display())]
    Dir {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cannot open the fs backend at {}: {source}", path.display())]
    Fs { path: PathBuf, source: io::Error },
    #[error("cannot set up the s3 backend: {0}")]
    S3(io::Error),
    #[error("cannot read the free space of {}: {source}", path.display())]
    FreeSpace { path: PathBuf, source: io::Error },
    #[error("cannot start the cache read engine: {0}")]
    Engine(io::Error),
    #[error("cannot open the cache at {}: {source}", path.display())]
    Cache { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Cluster(#[from] cluster::ConfigError),
}

/// The configured backend, its reads capped at `max_backend_fetches`.
async fn open_backend(config: &NodeConfig) -> Result<Arc<dyn Backend>, OpenError> {
    let store: Arc<dyn Backend> =
        match &config.backend {
            BackendSpec::Fs(dir) => Arc::new(backend::fs::FsBackend::open(dir).map_err(
                |source| OpenError::Fs {
                    path: dir.clone(),
                    source,
                },
            )?),
            BackendSpec::S3 { endpoint } => Arc::new(
                backend::s3::S3Backend::connect(endpoint.as_deref())
                    .await
                    .map_err(OpenError::S3)?,
            ),
        };
    Ok(backend::limit::Limited::wrap(
        store,
        config.max_backend_fetches,
        config.backend_rate,
    ))
}

fn create_dir(what: &'static str, path: PathBuf) -> Result<PathBuf, OpenError> {
    std::fs::create_dir_all(&path).map_err(|source| OpenError::Dir {
        what,
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

impl Node {
    /// Opens the node `config` describes. Nothing runs in the background until
    /// [`Node::start`]: the server binds its listener in between, so that a member
    /// this node's first probe announces it to can probe it back.
    pub async fn open(config: NodeConfig) -> Result<Arc<Node>, OpenError> {
        create_dir("the data dir", config.data_dir.clone())?;
        let backend = open_backend(&config).await?;
        let stats = Arc::new(Stats::default());
        let cache_dir = create_dir("the cache dir", config.data_dir.join("cache"))?;
        let capacity = match config.cache_capacity {
            Some(c) => c,
            None => {
                let free =
                    fs4::available_space(&cache_dir).map_err(|source| OpenError::FreeSpace {
                        path: cache_dir.clone(),
                        source,
                    })?;
                free / 10 * 9
            }
        };
        let engine = crate::io::engine(config.read_engine).map_err(OpenError::Engine)?;
        tracing::info!(engine = engine.name(), "cache read engine");
        crate::io::sendfile::enable(config.sendfile);
        tracing::info!(sendfile = ?config.sendfile, "large cache hits leave with sendfile where chosen");
        let cache = Cache::open(
            &cache_dir,
            capacity,
            config.cache_policy,
            config.verify_reads,
            engine,
            stats.clone(),
        )
        .map_err(|source| OpenError::Cache {
            path: cache_dir.clone(),
            source,
        })?
        .with_direct_fills(config.direct_fills)
        .with_revalidation(config.revalidate.clone());
        let cluster = Arc::new(cluster::Cluster::new(
            &config.cluster,
            &config.node_id,
            capacity,
            stats.clone(),
        )?);
        if !cluster.is_single() {
            tracing::info!(
                members = cluster.members().len(),
                route = cluster.route.as_str(),
                "cluster member"
            );
        }
        let watch = cluster::source::Watch::of(&config.cluster)?;
        let node = Node::new(
            backend,
            Arc::new(cache),
            cluster,
            stats.clone(),
            Transforms::new(
                &config.transforms,
                Pipelines::new(&config.pipelines, config.prep_memory)
                    .map_err(OpenError::Pipeline)?,
                config.prep_threads,
                stats,
            )
            .map_err(OpenError::Pipeline)?,
            config.rebalance_rate,
        );
        *node.watch.locked() = Some(watch);
        node.plans.set_ttl(config.plan_ttl);
        let journal = config.data_dir.join("journal");
        let unsettled = node
            .journal
            .keep_in(&journal)
            .map_err(|source| OpenError::Dir {
                what: "the write journal",
                path: journal,
                source,
            })?;
        if unsettled > 0 {
            tracing::warn!(
                writes = unsettled,
                "writes in flight when the node stopped: watching the backend's version of each"
            );
        }
        let drain = config.data_dir.join(super::DRAIN_FILE);
        node.keep_drain_in(drain.clone())
            .map_err(|source| OpenError::Dir {
                what: "the drain state",
                path: drain,
                source,
            })?;
        let catalogs = config.data_dir.join("catalogs");
        node.catalogs
            .keep_in(catalogs.clone())
            .map_err(|source| OpenError::Dir {
                what: "the catalog dir",
                path: catalogs,
                source,
            })?;
        Ok(node)
    }
}
