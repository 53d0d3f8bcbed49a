//! A counting allocator, to hold a preparation to its cost where it runs (the fuzz target,
//! `examples/peak.rs`): a binary installs [`Counting`] as its global allocator, and
//! [`peak_of`] says the most bytes held at once while a closure ran, above what was held
//! before. Counts are process-wide: measure on one thread at a time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator, counting the bytes it holds.
pub struct Counting;

static NOW: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call goes to the system allocator unchanged; the counts are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let size = layout.size() as u64;
        let now = NOW.fetch_add(size, Ordering::Relaxed) + size;
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NOW.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// The most bytes held at once while `run` ran, above what was held when it began (0
/// where [`Counting`] is not the global allocator).
pub fn peak_of(run: impl FnOnce()) -> u64 {
    let base = NOW.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    run();
    PEAK.load(Ordering::Relaxed).saturating_sub(base)
}
