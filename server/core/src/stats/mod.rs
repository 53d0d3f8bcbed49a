//! This node's counters: what `/_granary/stats` (JSON) and `/_granary/metrics`
//! (Prometheus text) report.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (seconds) of the request latency histogram's buckets; `+Inf` follows.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Request latency (first byte in to last byte out), as a Prometheus histogram.
#[derive(Debug, Default)]
pub struct Latency {
    /// Per bucket, not cumulative; the last is `+Inf`.
    counts: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_us: AtomicU64,
}

impl Latency {
    pub fn record(&self, secs: f64) {
        let i = LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((secs * 1e6) as u64, Ordering::Relaxed);
    }

    /// Cumulative counts per bucket (the last is the total), and the sum in seconds.
    pub fn cumulative(&self) -> (Vec<u64>, f64) {
        let mut acc = 0;
        let counts = self
            .counts
            .iter()
            .map(|c| {
                acc += c.load(Ordering::Relaxed);
                acc
            })
            .collect();
        (counts, self.sum_us.load(Ordering::Relaxed) as f64 / 1e6)
    }
}

/// Monotonic counters, updated lock-free on the request path.
#[derive(Debug, Default)]
pub struct Stats {
    pub latency: Latency,
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
    /// Bytes of committed copies sent to peers filling from this node.
    pub bytes_to_peers: AtomicU64,
    /// Peer-fill requests answered from this node's cache.
    pub peer_serves: AtomicU64,
    /// Client requests forwarded to the key's owner.
    pub proxied: AtomicU64,
    /// Client requests answered `307` to the key's owner.
    pub redirects: AtomicU64,
    /// Transforms computed (cache misses of a transformed read).
    pub transforms_run: AtomicU64,
    /// Transformed reads answered from a cached result.
    pub transform_hits: AtomicU64,
    /// Transforms that failed (bad input, a command's failure, time or size limits).
    pub transform_errors: AtomicU64,
    /// CPU time spent in transforms, in microseconds (this process's threads for
    /// built-in transforms, the child's user and system time for commands).
    pub transform_cpu_us: AtomicU64,
    /// Object reads answered with a descriptor of the cache file (over the Unix socket).
    pub local_reads: AtomicU64,
    /// Requests refused with `503 SlowDown` at `--max-requests`.
    pub slowdowns: AtomicU64,
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
    pub transforms_run: u64,
    pub transform_hits: u64,
    pub transform_errors: u64,
    pub transform_cpu_us: u64,
    pub local_reads: u64,
    pub slowdowns: u64,
    pub bytes_to_peers: u64,
    pub peer_serves: u64,
    pub proxied: u64,
    pub redirects: u64,
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
            bytes_to_peers: r(&self.bytes_to_peers),
            peer_serves: r(&self.peer_serves),
            proxied: r(&self.proxied),
            redirects: r(&self.redirects),
            transforms_run: r(&self.transforms_run),
            transform_hits: r(&self.transform_hits),
            transform_errors: r(&self.transform_errors),
            transform_cpu_us: r(&self.transform_cpu_us),
            local_reads: r(&self.local_reads),
            slowdowns: r(&self.slowdowns),
        }
    }
}

/// User and system CPU time of this process (`libc::RUSAGE_SELF`) or of its waited-for
/// children (`libc::RUSAGE_CHILDREN`), in microseconds.
pub fn rusage_us(who: libc::c_int) -> u64 {
    // SAFETY: getrusage writes only into the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only into the struct it is given.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(ru.ru_utime) + us(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_are_cumulative() {
        let l = Latency::default();
        l.record(0.0001);
        l.record(0.003);
        l.record(20.0);
        let (c, sum) = l.cumulative();
        assert_eq!(c[0], 1);
        assert_eq!(c[3], 2, "0.003 falls in the 0.005 bucket");
        assert_eq!(*c.last().unwrap(), 3);
        assert!((sum - 20.0031).abs() < 1e-3);
    }
}
