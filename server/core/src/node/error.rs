//! Why a node operation failed. Each layer's error is kept whole (the API maps every one
//! of them to an S3 code in one place); the node adds what only it can say.

use crate::backend::{BackendError, Refusal};
use crate::cache::CacheError;
use crate::cluster::ClusterError;
use crate::transform::TransformError;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Cache(CacheError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Transform(#[from] TransformError),
    /// A request the node cannot serve as asked: the client's side.
    #[error("{0}")]
    Invalid(String),
    /// A shard member that is not in the shard.
    #[error("the shard has no member `{0}`")]
    NoMember(String),
    /// The object is not a readable tar shard.
    #[error("cannot read the object as a tar shard: {0}")]
    NotAShard(String),
    /// What was being read changed or left the cache meanwhile: retry.
    #[error("{0}")]
    Changed(&'static str),
    /// A shard could not be held in the cache for a whole-shard transform.
    #[error("the shard could not be admitted to the cache (is it full?), so its members cannot be transformed one by one; name members with archpath")]
    ShardNotHeld,
    /// The node runs as much of this as it takes at once: retry later.
    #[error("{0}")]
    Busy(String),
    /// A source's bytes stopped short while the node read them for itself.
    #[error("{0}")]
    Cut(String),
    /// The failure of work that several requests waited for (one preparation of a
    /// sample), as each of them gets it.
    #[error(transparent)]
    Shared(std::sync::Arc<NodeError>),
}

impl From<CacheError> for NodeError {
    fn from(e: CacheError) -> NodeError {
        match e {
            // Keep a source's own error whole, so that it maps like the backend's.
            CacheError::Source(b) => NodeError::Backend(b),
            e => NodeError::Cache(e),
        }
    }
}

impl From<Refusal> for NodeError {
    fn from(r: Refusal) -> NodeError {
        NodeError::Cache(CacheError::Refused(r))
    }
}

impl NodeError {
    /// Whether the thing asked for does not exist (a key, a bucket, a shard member).
    pub fn is_missing(&self) -> bool {
        match self {
            NodeError::Shared(e) => e.is_missing(),
            e => matches!(
                e,
                NodeError::Backend(BackendError::NoSuchKey(_) | BackendError::NoSuchBucket(_))
                    | NodeError::NoMember(_)
            ),
        }
    }

    /// Whether the same request may succeed later.
    pub fn is_retryable(&self) -> bool {
        match self {
            NodeError::Backend(e) => e.is_retryable(),
            NodeError::Cache(e) => e.is_retryable(),
            NodeError::Cluster(e) => e.is_retryable(),
            NodeError::Shared(e) => e.is_retryable(),
            NodeError::Changed(_)
            | NodeError::Cut(_)
            | NodeError::ShardNotHeld
            | NodeError::Busy(_) => true,
            NodeError::Transform(_)
            | NodeError::Invalid(_)
            | NodeError::NoMember(_)
            | NodeError::NotAShard(_) => false,
        }
    }
}
