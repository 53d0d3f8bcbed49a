//! An entry's file windows kept mapped between hits. Setting up a window's mapping and
//! tearing it down costs the kernel about what copying its bytes costs: a page-table
//! entry made for every page the socket's copy touches, and on unmap each one removed
//! and the other CPUs' TLBs flushed. A hit over a window already mapped pays only the
//! copy (BENCHMARKS.md, "Warm hits: windows kept mapped").
//!
//! - The mappings live in their [`Entry`](super::index::Entry): dropped with it, so a
//!   removed entry's file is let go when its last reader ends, and a new entry of the key
//!   never sees an old file's pages.
//! - All of them together are bounded by a budget of mapped bytes ([`MapBudget`], a
//!   quarter of the machine's memory). Windows are kept first come, as the cache keeps
//!   entries; once the budget is spent, a hit maps its other windows for itself and lets
//!   them go, as every hit did before.
//! - Kept pages are the page cache's own. They count in the node's RSS as file pages
//!   (`RssFile`), not in its own memory (`RssAnon`).
//! - A kept window is sealed by the first checked hit over it: its pages locked in
//!   memory (`mlock`), then checked whole. The kernel never reclaims a locked page, so a
//!   sealed window's bytes are the ones checked for as long as it is kept, and hits send
//!   them with no check and no look at the page cache. Locked bytes have a budget of
//!   their own ([`MapBudget`], an eighth of the machine's memory): windows past it, and
//!   every window where the process may not lock memory, are read into buffers and
//!   checked there by each hit (`hit.rs`).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::io::mapped::Mapped;
use crate::io::sendfile::FileBytes;
use crate::sync::Locked;

/// Bytes of windows all entries may keep mapped at once, and of those, the bytes they
/// may keep locked in memory (sealed windows).
#[derive(Debug)]
pub struct MapBudget {
    used: AtomicU64,
    limit: AtomicU64,
    locked: AtomicU64,
    lock_limit: AtomicU64,
}

impl MapBudget {
    /// `limit` bytes mapped, half of them locked.
    pub fn new(limit: u64) -> MapBudget {
        MapBudget {
            used: AtomicU64::new(0),
            limit: AtomicU64::new(limit),
            locked: AtomicU64::new(0),
            lock_limit: AtomicU64::new(limit / 2),
        }
    }

    /// Keeps no more than `limit` bytes mapped from now on.
    #[cfg(test)]
    pub fn limit_to(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Locks no more than `limit` bytes from now on.
    #[cfg(test)]
    pub fn limit_locks_to(&self, limit: u64) {
        self.lock_limit.store(limit, Ordering::Relaxed);
    }

    /// A quarter of the machine's memory kept mapped: a node's hot windows are as many
    /// as the page cache can hold anyway, and the page tables cost 1/512 of what they
    /// map. An eighth locked: memory the kernel can no longer reclaim for anyone, so
    /// less than the page cache would hold of the node's hot windows anyway.
    /// The machine's memory is the node's memory cgroup's limit where that is less (a
    /// container): locked pages are charged there and never reclaimed.
    pub fn of_machine() -> MapBudget {
        // SAFETY: sysconf has no preconditions.
        let (pages, size) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let memory = u64::try_from(pages).unwrap_or(0) * u64::try_from(size).unwrap_or(0);
        MapBudget::new(memory.min(cgroup_limit().unwrap_or(u64::MAX)) / 4)
    }

    /// Mapped bytes kept now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes locked in memory now (sealed windows).
    pub fn locked(&self) -> u64 {
        self.locked.load(Ordering::Relaxed)
    }

    fn take(&self, n: u64) -> bool {
        take(&self.used, &self.limit, n)
    }

    fn give(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// This process's memory cgroup's limit in bytes, where it has one (cgroup v2
/// `memory.max`, or v1 `memory.limit_in_bytes`).
fn cgroup_limit() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        let file = if controllers.is_empty() {
            std::path::Path::new("/sys/fs/cgroup")
                .join(path)
                .join("memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            std::path::Path::new("/sys/fs/cgroup/memory")
                .join(path)
                .join("memory.limit_in_bytes")
        } else {
            return None;
        };
        // "max", or v1's page-rounded i64::MAX: no limit.
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    })
}

/// Adds `n` to `used` where the sum stays within `limit`.
fn take(used: &AtomicU64, limit: &AtomicU64, n: u64) -> bool {
    used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
        u.checked_add(n)
            .filter(|&t| t <= limit.load(Ordering::Relaxed))
    })
    .is_ok()
}

/// A kept window's seal: not tried, being sealed by a hit, sealed (locked and checked),
/// or refused (the lock was).
const OPEN: u8 = 0;
const SEALING: u8 = 1;
const SEALED: u8 = 2;
const REFUSED: u8 = 3;

/// A window kept mapped; gives its bytes back to the budget when the last hit using it
/// and its entry are done with it.
pub(super) struct Kept {
    map: FileBytes,
    budget: Arc<MapBudget>,
    seal: AtomicU8,
}

impl Drop for Kept {
    fn drop(&mut self) {
        let len = self.map.mapped().len() as u64;
        self.budget.give(len);
        // Unmapped with it, which unlocks its pages.
        if self.seal.load(Ordering::Acquire) == SEALED {
            self.budget.locked.fetch_sub(len, Ordering::Relaxed);
        }
    }
}

impl Kept {
    /// Whether its pages are locked in memory and were checked whole since they were.
    pub(super) fn sealed(&self) -> bool {
        self.seal.load(Ordering::Acquire) == SEALED
    }

    /// Claims the window's sealing for the caller: `false` where it is sealed, being
    /// sealed, or its lock was refused.
    pub(super) fn claim(&self) -> bool {
        self.seal
            .compare_exchange(OPEN, SEALING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Seals a window claimed ([`Kept::claim`]): locks its pages in memory (reading in
    /// those that are not there, blocking: call it off the runtime's threads), then
    /// `check`s its bytes. `Ok(false)` where the lock budget is spent (left open, for a
    /// later hit to try) or the lock is refused (never tried again); an error where the
    /// check fails.
    pub(super) fn seal(&self, check: impl FnOnce(&[u8]) -> io::Result<()>) -> io::Result<bool> {
        let len = self.map.mapped().len() as u64;
        let budget = &self.budget;
        if !take(&budget.locked, &budget.lock_limit, len) {
            self.seal.store(OPEN, Ordering::Release);
            return Ok(false);
        }
        let done = self
            .map
            .mapped()
            .lock()
            .map_err(|e| (e, false))
            .and_then(|()| check(self.map.mapped()).map_err(|e| (e, true)));
        match done {
            Ok(()) => {
                self.seal.store(SEALED, Ordering::Release);
                Ok(true)
            }
            Err((e, locked)) => {
                budget.locked.fetch_sub(len, Ordering::Relaxed);
                self.seal.store(REFUSED, Ordering::Release);
                if locked {
                    // Damage: the entry is dropped, and the window with it.
                    return Err(e);
                }
                tracing::debug!(error = %e, "a window's pages could not be locked; hits read it into buffers");
                Ok(false)
            }
        }
    }
}

/// `Bytes` over a kept window.
struct KeptBytes(Arc<Kept>);

impl AsRef<[u8]> for KeptBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.map.as_ref()
    }
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes mapped", self.map.mapped().len())
    }
}

/// An entry's kept windows, by window number.
#[derive(Debug, Default)]
pub struct Maps {
    windows: Mutex<HashMap<u64, Arc<Kept>>>,
    /// The file's times when a hit last saw them ([`Maps::observe`]).
    stamp: AtomicU64,
}

impl Maps {
    /// A hit saw the entry's file with `meta`. The node never writes a committed entry,
    /// so where its modification or change time moved since, someone else wrote it:
    /// every window is let go (unmapped, so unlocked), to be sealed anew, checked.
    pub(super) fn observe(&self, meta: &std::fs::Metadata) {
        let stamp = stamp(meta);
        if self.stamp.swap(stamp, Ordering::Relaxed) != stamp {
            self.windows.locked().clear();
        }
    }

    /// Window `number` of the file, `start..end` of it (the file holds those bytes):
    /// the one kept, else mapped now and kept when the budget allows; `None` when it
    /// does not, or the mapping is refused.
    pub(super) fn window(
        &self,
        budget: &Arc<MapBudget>,
        file: &Arc<File>,
        number: u64,
        start: u64,
        end: u64,
    ) -> Option<Window> {
        let mut windows = self.windows.locked();
        if let Some(k) = windows.get(&number) {
            return Some(Window::Kept(k.clone(), start));
        }
        let len = end - start;
        if !budget.take(len) {
            return None;
        }
        // A mapping refused (an address-space limit) is left to the hit to map for itself.
        let Ok(map) = FileBytes::new(file.clone(), start, len as usize) else {
            budget.give(len);
            return None;
        };
        let kept = Arc::new(Kept {
            map,
            budget: budget.clone(),
            seal: AtomicU8::new(OPEN),
        });
        windows.insert(number, kept.clone());
        Some(Window::Kept(kept, start))
    }

    /// Where each kept window is mapped, and its length.
    #[cfg(test)]
    pub fn bases(&self) -> Vec<(usize, usize)> {
        let windows = self.windows.locked();
        windows
            .values()
            .map(|k| (k.map.mapped().base(), k.map.mapped().len()))
            .collect()
    }

    /// How many windows are kept.
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.windows.locked().len()
    }
}

/// A window's mapping for one hit: a kept one, or one made for this hit alone; each with
/// the file offset of its first byte.
pub(super) enum Window {
    Kept(Arc<Kept>, u64),
    Once(FileBytes, u64),
}

impl Window {
    /// A mapping of `len` bytes of `file` from `start`, for this hit alone.
    pub(super) fn once(file: &Arc<File>, start: u64, len: usize) -> io::Result<Window> {
        Ok(Window::Once(
            FileBytes::new(file.clone(), start, len)?,
            start,
        ))
    }

    /// The kept window, where this is one.
    pub(super) fn kept(&self) -> Option<&Arc<Kept>> {
        match self {
            Window::Kept(k, _) => Some(k),
            Window::Once(..) => None,
        }
    }

    pub(super) fn mapped(&self) -> &Mapped {
        match self {
            Window::Kept(k, _) => k.map.mapped(),
            Window::Once(m, _) => m.mapped(),
        }
    }

    /// Where its first byte lies in the file.
    pub(super) fn start(&self) -> u64 {
        match self {
            Window::Kept(_, s) | Window::Once(_, s) => *s,
        }
    }

    /// The same window with the pages holding its bytes `from..to` in the page cache,
    /// read in on the blocking pool where they are not.
    pub(super) async fn faulted_in(self, from: usize, to: usize) -> io::Result<Window> {
        tokio::task::spawn_blocking(move || {
            self.mapped().fault_in_range(from, to);
            self
        })
        .await
        .map_err(io::Error::other)
    }

    /// The whole mapping as `Bytes`; its slices stay sendable.
    pub(super) fn into_bytes(self) -> Bytes {
        match self {
            Window::Kept(k, _) => Bytes::from_owner(KeptBytes(k)),
            Window::Once(m, _) => m.into_bytes(),
        }
    }
}

/// A file's modification and change times, folded into one word.
fn stamp(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    (meta.mtime() as u64)
        .wrapping_mul(1_000_000_007)
        .wrapping_add(meta.mtime_nsec() as u64)
        .rotate_left(17)
        ^ (meta.ctime() as u64)
            .wrapping_mul(1_000_000_009)
            .wrapping_add(meta.ctime_nsec() as u64)
}
