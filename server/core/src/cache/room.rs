//! The disk's own limit. The configured capacity is what the cache may hold; the
//! filesystem under it may hold less (a smaller disk, other files growing beside the
//! cache). Every admission also asks the filesystem: an object is admitted only while
//! the free space covers every reservation in flight plus a margin. When the disk says
//! no (at admission, or ENOSPC in the middle of a fill) the cache stops admitting — health
//! says `admitting: false`, so members spill to others — and a watcher admits again
//! once the filesystem has room.
//!
//! A fill takes its room from the filesystem a step ahead of its writes ([`Taken`]):
//! the blocks are preallocated, so the writes find them ready (a tenth of a cold fill's
//! CPU on ext4 here) and a fill keeps the room it has taken when something else fills
//! the disk. Those bytes are gone from the free space and still in the reservations, so
//! admission counts them back once.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Space the cache leaves free on its filesystem: 1% of it, at most 64 MiB (footers,
/// directories, the filesystem's own blocks).
fn margin(total: u64) -> u64 {
    (total / 100).min(64 << 20)
}

pub struct Room {
    dir: PathBuf,
    /// The disk refused (no room for a reservation, or ENOSPC during a fill).
    full: AtomicBool,
    /// Free bytes when last looked, less the margin.
    free: AtomicU64,
    /// Free bytes when the disk last refused: it admits again only once it has gained
    /// room since (its own fills in flight only ever take room, so a refusal they caused
    /// does not undo itself, and what was left to other members is not taken back).
    free_at_refusal: AtomicU64,
    /// Bytes left free (see [`margin`]).
    margin: u64,
    /// Bytes the fills in flight have taken from the filesystem (see [`Taken`]).
    taken: AtomicU64,
}

impl Room {
    pub fn new(dir: &Path) -> Room {
        let room = Room {
            dir: dir.to_owned(),
            full: AtomicBool::new(false),
            free: AtomicU64::new(u64::MAX),
            free_at_refusal: AtomicU64::new(0),
            margin: fs4::total_space(dir).map_or(0, margin),
            taken: AtomicU64::new(0),
        };
        let _ = room.look();
        room
    }

    /// Free bytes for the cache now (the filesystem's available space less the margin);
    /// `None` when the filesystem does not answer.
    pub fn look(&self) -> Option<u64> {
        let free = fs4::available_space(&self.dir)
            .ok()?
            .saturating_sub(self.margin);
        self.free.store(free, Ordering::Relaxed);
        Some(free)
    }

    /// Free bytes for the reservations in flight: [`Room::look`] plus what their fills
    /// have taken already. Counted before looking, so a step taken in between is missed
    /// on the side of refusing.
    pub fn look_for_reservations(&self) -> Option<u64> {
        let taken = self.taken.load(Ordering::Acquire);
        self.look().map(|free| free + taken)
    }

    /// Free bytes for the cache when last looked.
    pub fn free(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    /// Whether the disk refused and has not had room since.
    pub fn full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    /// Whether `free` bytes (as [`Room::look_for_reservations`] found them) hold every
    /// reservation in flight, `reserved` bytes (the new one included). No answer from the
    /// filesystem is no refusal.
    pub fn fits(&self, free: Option<u64>, reserved: u64) -> bool {
        match free {
            Some(free) if free < reserved => {
                self.refused("no room on the cache's filesystem");
                false
            }
            _ => true,
        }
    }

    /// The disk refused: stop admitting until it has room.
    pub fn refused(&self, why: &str) {
        let now = self.look().unwrap_or(0);
        self.free_at_refusal.fetch_min(now, Ordering::AcqRel);
        if !self.full.swap(true, Ordering::AcqRel) {
            self.free_at_refusal.store(now, Ordering::Release);
            tracing::warn!(
                dir = %self.dir.display(),
                free = self.free(),
                why,
                "the cache's disk is full; serving through until it has room"
            );
        }
    }

    /// Looks again (the watcher): admits again once the filesystem has gained 1 MiB
    /// since the refusal and has room for the reservations in flight and a little more
    /// (1 MiB, or the margin if larger).
    pub fn recheck(&self, reserved: u64) {
        let taken = self.taken.load(Ordering::Acquire);
        let Some(free) = self.look() else { return };
        if !self.full() {
            return;
        }
        let wanted = reserved + self.margin.max(1 << 20);
        let gained = free >= self.free_at_refusal.load(Ordering::Acquire) + (1 << 20);
        if free + taken >= wanted && gained {
            self.full.store(false, Ordering::Release);
            tracing::info!(dir = %self.dir.display(), free, "the cache's disk has room again; admitting");
        }
    }
}

/// How far ahead of its writes a fill takes room.
const STEP: u64 = 4 << 20;

/// The room one fill has taken from the filesystem: the first `end` bytes of its file
/// have their blocks (preallocated, or written where preallocation failed). Given back
/// to the count when dropped, which the fill does before its reservation is released.
pub struct Taken {
    room: Arc<Room>,
    end: u64,
    preallocate: bool,
}

impl Taken {
    pub fn new(room: Arc<Room>) -> Taken {
        Taken {
            room,
            end: 0,
            preallocate: true,
        }
    }

    /// Makes the first `need` bytes of `file` (a fill of `size`) taken, preallocating
    /// up to a step further. A filesystem that cannot preallocate, or a full disk, shows
    /// in the writes: from then on only what is written counts.
    pub fn cover(&mut self, file: &File, need: u64, size: u64) {
        if need <= self.end {
            return;
        }
        let mut end = need;
        if self.preallocate {
            let want = (self.end + STEP).max(need).min(size.max(need));
            // SAFETY: fallocate on an open descriptor; KEEP_SIZE leaves the size alone.
            let r = unsafe {
                libc::fallocate(
                    file.as_raw_fd(),
                    libc::FALLOC_FL_KEEP_SIZE,
                    self.end.min(i64::MAX as u64) as libc::off_t,
                    (want - self.end).min(i64::MAX as u64) as libc::off_t,
                )
            };
            if r == 0 {
                end = want;
            } else {
                self.preallocate = false;
                tracing::debug!(error = %io::Error::last_os_error(), "fill not preallocated");
            }
        }
        self.room.taken.fetch_add(end - self.end, Ordering::AcqRel);
        self.end = end;
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.room.taken.fetch_sub(self.end, Ordering::AcqRel);
    }
}

/// Whether an I/O error says the disk is full (or the quota spent).
pub fn is_full(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull
        || matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_the_disk_cannot_hold_and_admits_again_once_it_can() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ballast"), vec![7u8; 8 << 20]).unwrap();
        let room = Room::new(dir.path());
        let free = room.free();
        assert!(
            free > 0 && free < u64::MAX,
            "looked at the filesystem: {free}"
        );
        assert!(room.fits(room.look(), 1 << 10));
        assert!(!room.full());
        assert!(
            !room.fits(room.look(), free + (1 << 30)),
            "more than the disk has"
        );
        assert!(room.full());
        room.recheck(free + (1 << 30));
        assert!(room.full(), "still no room for what is in flight");
        room.recheck(0);
        assert!(room.full(), "nothing freed since the refusal");
        std::fs::remove_file(dir.path().join("ballast")).unwrap();
        room.recheck(0);
        assert!(!room.full(), "room again once space is freed");
        room.refused("ENOSPC");
        assert!(room.full());
    }

    #[test]
    fn a_fills_room_is_taken_a_step_ahead_and_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let room = Arc::new(Room::new(dir.path()));
        let file = File::create(dir.path().join("fill")).unwrap();
        let mut taken = Taken::new(room.clone());
        taken.cover(&file, 100, 10 * STEP);
        assert_eq!(room.taken.load(Ordering::Acquire), STEP, "a step ahead");
        assert_eq!(file.metadata().unwrap().len(), 0, "the size is left alone");
        let blocks = |f: &File| std::os::unix::fs::MetadataExt::blocks(&f.metadata().unwrap());
        assert!(blocks(&file) * 512 >= STEP, "the blocks are the file's");
        taken.cover(&file, STEP, 10 * STEP);
        assert_eq!(room.taken.load(Ordering::Acquire), STEP, "inside the step");
        taken.cover(&file, STEP + 1, STEP + 10);
        assert_eq!(
            room.taken.load(Ordering::Acquire),
            STEP + 10,
            "never past the object's end"
        );
        drop(taken);
        assert_eq!(room.taken.load(Ordering::Acquire), 0, "given back");
    }

    #[test]
    fn enospc_is_full() {
        assert!(is_full(&io::Error::from_raw_os_error(libc::ENOSPC)));
        assert!(is_full(&io::Error::from_raw_os_error(libc::EDQUOT)));
        assert!(!is_full(&io::Error::from_raw_os_error(libc::EIO)));
    }
}
