//! This node's counters: what `/_granary/stats` (JSON) and `/_granary/metrics`
//! (Prometheus text) report.

use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters, updated lock-free on the request path.
#[derive(Debug, Default)]
pub struct Stats {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    /// Object reads answered from this node's committed cache.
    pub hits: AtomicU64,
    /// Object reads filled from the backend into the cache.
    pub misses: AtomicU64,
    /// Object reads filled from a peer.
    pub peer_fills: AtomicU64,
    /// Object reads served from the backend without admission.
    pub bypasses: AtomicU64,
    /// Response body bytes sent, all routes.
    pub bytes_served: AtomicU64,
    /// Request body bytes written to the backend.
    pub bytes_received: AtomicU64,
    pub bytes_from_backend: AtomicU64,
    pub bytes_from_peers: AtomicU64,
}

/// A point-in-time copy of the counters.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Snapshot {
    pub requests: u64,
    pub errors: u64,
    pub hits: u64,
    pub misses: u64,
    pub peer_fills: u64,
    pub bypasses: u64,
    pub bytes_served: u64,
    pub bytes_received: u64,
    pub bytes_from_backend: u64,
    pub bytes_from_peers: u64,
}

impl Stats {
    pub fn snapshot(&self) -> Snapshot {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            requests: r(&self.requests),
            errors: r(&self.errors),
            hits: r(&self.hits),
            misses: r(&self.misses),
            peer_fills: r(&self.peer_fills),
            bypasses: r(&self.bypasses),
            bytes_served: r(&self.bytes_served),
            bytes_received: r(&self.bytes_received),
            bytes_from_backend: r(&self.bytes_from_backend),
            bytes_from_peers: r(&self.bytes_from_peers),
        }
    }
}
