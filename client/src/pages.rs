//! Memory about to be written by a receive: backed by huge pages where the kernel has
//! them, and faulted in ahead of the receive by helper threads, so that a large read
//! into a new buffer does not pay a page fault and a zeroing per 4 KiB on its one thread.

/// Bodies at least this large land in memory faulted in ahead of the receive.
pub(crate) const PREFAULT_FROM: usize = 32 << 20;
/// The stripe each helper faults in at a time.
const PREFAULT_STEP: usize = 8 << 20;

/// How many threads fault a large destination in ahead of its receive: one per four
/// cores, one to four.
pub(crate) fn prefault_helpers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).clamp(1, 4))
}

/// Faults in helper `i` of `n`'s stripes of `len` bytes at `addr` (memory about to be
/// written): stripes `i`, `i + n`, … of [`PREFAULT_STEP`] bytes, front to back
/// (`MADV_POPULATE_WRITE`; nothing where the kernel lacks it), until done or `stop`.
///
/// Run beside a receive into the same memory, the helpers take the page faults of a
/// buffer never touched before (a new buffer per read), which the kernel must zero
/// before the copy may write it: on one thread that costs about as much as the copy
/// itself. The helpers do it ahead of the receive, side by side; pages the receive got
/// to first are left as they are.
pub(crate) fn prefault(
    addr: usize,
    len: usize,
    i: usize,
    n: usize,
    stop: &std::sync::atomic::AtomicBool,
) {
    let end = addr + len;
    let first = addr.next_multiple_of(4096);
    let mut at = first + i * PREFAULT_STEP;
    while at < end && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let step = PREFAULT_STEP.min(end - at);
        // SAFETY: populating pages of memory the caller owns for writing; no byte changes.
        if unsafe { libc::madvise(at as *mut libc::c_void, step, libc::MADV_POPULATE_WRITE) } != 0 {
            return;
        }
        at += n * PREFAULT_STEP;
    }
}

/// The size of a transparent huge page on x86-64 and arm64 (4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// Asks for `len` bytes at `addr` (a new buffer, about to be written whole) to be backed
/// by transparent huge pages where the kernel has them (`MADV_HUGEPAGE`, for the 2 MiB
/// pages inside it): one fault and one zeroing per 2 MiB instead of 512, and a TLB entry
/// per 2 MiB for the copy. Nothing changes where the kernel says no (THP `never`).
pub(crate) fn huge_pages(addr: usize, len: usize) {
    let start = addr.next_multiple_of(HUGE_PAGE);
    let end = (addr + len) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: advice on memory the caller owns; no byte changes.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}
