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
//! - Kept pages are the page cache's own. The kernel still reclaims them under pressure,
//!   and a hit learns that from `mincore` as for any window (`hit.rs`, `resident.rs`).
//!   They count in the node's RSS as file pages (`RssFile`), not in its own memory
//!   (`RssAnon`).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::io::mapped::Mapped;
use crate::io::sendfile::FileBytes;

/// Bytes of windows all entries may keep mapped at once.
#[derive(Debug)]
pub struct MapBudget {
    used: AtomicU64,
    limit: AtomicU64,
}

impl MapBudget {
    pub fn new(limit: u64) -> MapBudget {
        MapBudget {
            used: AtomicU64::new(0),
            limit: AtomicU64::new(limit),
        }
    }

    /// Keeps no more than `limit` bytes mapped from now on.
    #[cfg(test)]
    pub fn limit_to(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// A quarter of the machine's memory: a node's hot windows are as many as the page
    /// cache can hold anyway, and the page tables cost 1/512 of what they map.
    pub fn of_machine() -> MapBudget {
        // SAFETY: sysconf has no preconditions.
        let (pages, size) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let memory = u64::try_from(pages).unwrap_or(0) * u64::try_from(size).unwrap_or(0);
        MapBudget::new(memory / 4)
    }

    /// Mapped bytes kept now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                u.checked_add(n)
                    .filter(|&t| t <= self.limit.load(Ordering::Relaxed))
            })
            .is_ok()
    }

    fn give(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A window kept mapped; gives its bytes back to the budget when the last hit using it
/// and its entry are done with it.
pub(super) struct Kept {
    map: FileBytes,
    budget: Arc<MapBudget>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.budget.give(self.map.mapped().len() as u64);
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
}

impl Maps {
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
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
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
        });
        windows.insert(number, kept.clone());
        Some(Window::Kept(kept, start))
    }

    /// How many windows are kept.
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.windows.lock().unwrap_or_else(|p| p.into_inner()).len()
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
