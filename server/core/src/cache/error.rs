//! Why a cache operation failed, and whose side it is on.

use std::io;

use crate::backend::{BackendError, Refusal};

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The source the object is read from failed.
    #[error(transparent)]
    Source(BackendError),
    /// The caller's range function refused the object (a precondition, a range, a
    /// changed version).
    #[error("{0}")]
    Refused(Refusal),
    /// A read that asked to be told: this node cannot admit the object and no peer holds
    /// it (`size` 0 when not known yet). Nothing was read from the source.
    #[error("the object ({size} bytes) was not admitted to this node's cache")]
    NotAdmitted { size: u64 },
    /// A read of committed copies only: this node holds none.
    #[error("this node holds no copy of the object")]
    NotHeld,
    /// The object was asked for as a tar shard and is not one.
    #[error("the object is not a readable tar archive: {0}")]
    NotTar(String),
    /// A fill this read waited on failed (the source or the disk); a retry may help.
    #[error("filling the cache failed: {0}")]
    FillFailed(String),
    /// This node's disk failed.
    #[error("cache storage error: {0}")]
    Disk(#[from] io::Error),
}

impl From<BackendError> for CacheError {
    fn from(e: BackendError) -> CacheError {
        match e {
            BackendError::Refused(r) => CacheError::Refused(r),
            e => CacheError::Source(e),
        }
    }
}

impl CacheError {
    /// Whether the same read may succeed later.
    pub fn is_retryable(&self) -> bool {
        match self {
            CacheError::Source(e) => e.is_retryable(),
            CacheError::Refused(r) => matches!(r, Refusal::Changed(_)),
            CacheError::FillFailed(_) | CacheError::Disk(_) => true,
            CacheError::NotAdmitted { .. } | CacheError::NotHeld | CacheError::NotTar(_) => false,
        }
    }
}

/// A read of a derived object (computed on demand, see `Cache::read_derived`): the
/// computation failed, or the cache did.
#[derive(Debug, thiserror::Error)]
pub enum DeriveError<E> {
    #[error(transparent)]
    Compute(E),
    #[error(transparent)]
    Cache(#[from] CacheError),
}
