//! One monotonic clock for the whole process, in milliseconds, so that a time can live
//! in an atomic and be compared on a hot path (a cache hit against the node's lease).

use std::sync::OnceLock;
use std::time::Instant;

static START: OnceLock<Instant> = OnceLock::new();

/// Milliseconds since the clock was first read in this process (at least 1, so that 0
/// can stand for "never").
pub fn now_ms() -> u64 {
    let start = START.get_or_init(Instant::now);
    start.elapsed().as_millis() as u64 + 1
}
