//! Which windows of an entry a checked hit may send without checking them again: those
//! checked since their pages last came in from the disk. ZFS's model: a block is
//! verified when it is read from the disk, and memory that was verified is served as it
//! is. The page cache is the kernel's, so the node keeps its own record per window of
//! [`WINDOW`] bytes, and asks the kernel (`mincore`) what is resident:
//!
//! - Every read of an entry's file that may bring pages in from the disk is announced
//!   ([`Residency::reading_in`]) before it starts and while it runs: a mapped window
//!   found not resident, a buffered read, a range checked for a local client. It voids
//!   the marks of the windows from where it starts to the end (the kernel's readahead
//!   only reads forward, as far as it likes).
//! - A window checked whole is marked with the generation its check began in, if no
//!   read-in runs and none voided the window since.
//! - A hit sends a window unchecked only if `mincore` says every page of it is resident
//!   now and then no read-in runs and the window's mark is newer than its last voiding.
//!   Every mapping is advised random before its pages are touched, so the node's own
//!   touches (the check, the socket's copy) read nothing ahead unannounced.
//! - The node never writes a committed entry: a change of the file's modification or
//!   change time (read at each hit's start) is someone else's write, and voids every
//!   mark.
//!
//! A file handed to a client on this machine (`local_file`) is read by a process the
//! node does not see: its entry is never trusted again. What the record cannot see is
//! another process reading the cache's files (a backup, `cat`), whose readahead may
//! bring in pages unchecked; no deployment does that.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::OnceLock;

/// The bytes one mark covers: a mapped hit's window.
pub const WINDOW: u64 = 4 << 20;

/// One window's record.
#[derive(Debug, Default)]
struct Window {
    /// The generation its last whole check began in (0: none).
    checked: AtomicU64,
    /// The generation of the last read-in that may have reached it.
    voided: AtomicU64,
}

/// An entry's record of checked windows.
#[derive(Debug)]
pub struct Residency {
    /// Bumped by every read-in and every check; starts at 1.
    generation: AtomicU64,
    /// Read-ins running now.
    reading: AtomicUsize,
    /// Per window; made on first use.
    windows: OnceLock<Box<[Window]>>,
    /// The file was handed to a reader outside the node.
    shared: AtomicBool,
    /// The file's times when last seen ([`Residency::observe`]).
    stamp: AtomicU64,
}

impl Default for Residency {
    fn default() -> Residency {
        Residency {
            generation: AtomicU64::new(1),
            reading: AtomicUsize::new(0),
            windows: OnceLock::new(),
            shared: AtomicBool::new(false),
            stamp: AtomicU64::new(0),
        }
    }
}

/// A read-in announced: it runs until this is dropped.
pub struct ReadIn<'r>(&'r Residency);

impl Drop for ReadIn<'_> {
    fn drop(&mut self) {
        self.0.reading.fetch_sub(1, SeqCst);
    }
}

impl Residency {
    fn table(&self, size: u64) -> &[Window] {
        self.windows.get_or_init(|| {
            (0..size.div_ceil(WINDOW).max(1))
                .map(|_| Window::default())
                .collect()
        })
    }

    /// Pages of the entry (of `size` bytes) from byte `from` on may come in from the disk
    /// while the returned guard lives: their windows' marks are void.
    pub fn reading_in(&self, size: u64, from: u64) -> ReadIn<'_> {
        self.reading.fetch_add(1, SeqCst);
        let g = self.generation.fetch_add(1, SeqCst) + 1;
        for w in &self.table(size)[(from / WINDOW) as usize..] {
            w.voided.fetch_max(g, SeqCst);
        }
        ReadIn(self)
    }

    /// Every mark is void (the file changed, or someone else reads it).
    fn void_all(&self, size: u64) {
        drop(self.reading_in(size, 0));
    }

    /// The entry's file goes to a reader the node does not see: no window is trusted
    /// from now on.
    pub fn share(&self, size: u64) {
        self.shared.store(true, SeqCst);
        self.void_all(size);
    }

    /// A hit saw the file with `meta`: if its modification or change time moved since,
    /// someone wrote it, and every mark is void.
    pub fn observe(&self, size: u64, meta: &std::fs::Metadata) {
        let stamp = stamp(meta);
        if self.stamp.swap(stamp, SeqCst) != stamp {
            self.void_all(size);
        }
    }

    /// Takes the file's times as they are now without voiding a mark: as if a change on
    /// the disk had left them alone (bit rot does).
    #[cfg(test)]
    pub fn overlook_times(&self, meta: &std::fs::Metadata) {
        self.stamp.store(stamp(meta), SeqCst);
    }

    /// A whole check of a window begins: its generation, for [`Residency::mark`].
    pub fn begin_check(&self) -> u64 {
        self.generation.fetch_add(1, SeqCst) + 1
    }

    /// Window `w` (of an entry of `size` bytes), found resident just now, was checked
    /// whole since its pages last came in from the disk.
    pub fn checked(&self, size: u64, w: usize) -> bool {
        if self.shared.load(SeqCst) || self.reading.load(SeqCst) != 0 {
            return false;
        }
        self.table(size).get(w).is_some_and(|r| {
            let voided = r.voided.load(SeqCst);
            r.checked.load(SeqCst) > voided
        })
    }

    /// Window `w` was checked whole, the check begun in `generation`: marked, unless a
    /// read-in runs or voided it since.
    pub fn mark(&self, size: u64, w: usize, generation: u64) {
        if self.shared.load(SeqCst) || self.reading.load(SeqCst) != 0 {
            return;
        }
        if let Some(r) = self.table(size).get(w) {
            if r.voided.load(SeqCst) < generation {
                r.checked.fetch_max(generation, SeqCst);
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: u64 = 4 * WINDOW;

    #[test]
    fn a_mark_holds_until_a_read_in_reaches_its_window() {
        let r = Residency::default();
        assert!(!r.checked(SIZE, 0), "nothing is checked at first");
        for w in 0..4 {
            let g = r.begin_check();
            r.mark(SIZE, w, g);
        }
        assert!((0..4).all(|w| r.checked(SIZE, w)));
        assert!(!r.checked(SIZE, 9), "past the last window");
        // A read-in from window 2 on: while it runs nothing is trusted; after it, the
        // windows before it still are.
        let g = r.begin_check();
        let read = r.reading_in(SIZE, 2 * WINDOW + 5);
        assert!(!r.checked(SIZE, 0), "not while a read-in runs");
        r.mark(SIZE, 3, g);
        drop(read);
        assert!(r.checked(SIZE, 0) && r.checked(SIZE, 1));
        assert!(
            !r.checked(SIZE, 2) && !r.checked(SIZE, 3),
            "voided, and a check it raced marks nothing"
        );
        let g = r.begin_check();
        r.mark(SIZE, 2, g);
        assert!(r.checked(SIZE, 2));
        // A check begun before a read-in that has since ended marks nothing.
        let g = r.begin_check();
        drop(r.reading_in(SIZE, 0));
        r.mark(SIZE, 3, g);
        assert!(!r.checked(SIZE, 3));
    }

    #[test]
    fn a_write_or_a_local_reader_voids_every_mark() {
        let r = Residency::default();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        r.observe(SIZE, &meta);
        let g = r.begin_check();
        r.mark(SIZE, 1, g);
        r.observe(SIZE, &meta);
        assert!(r.checked(SIZE, 1), "the same times change nothing");
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"y").unwrap();
        r.observe(SIZE, &std::fs::metadata(&path).unwrap());
        assert!(!r.checked(SIZE, 1), "a write voids every mark");
        let g = r.begin_check();
        r.mark(SIZE, 1, g);
        assert!(r.checked(SIZE, 1));
        r.share(SIZE);
        let g = r.begin_check();
        r.mark(SIZE, 1, g);
        assert!(!r.checked(SIZE, 1), "a shared entry is never trusted");
    }
}
