//! Read-only mappings of cache files: how a hit's bytes are checked and handed to the
//! connection without a copy in user space. A mapping costs no read: its pages are the
//! page cache's own, and the only copy of a byte is the kernel's, into the socket (or
//! none, with `sendfile`). Mapped pages count in the node's RSS (as file pages) while
//! they are mapped: callers map a window of an entry at a time, and keep it for the next
//! hits only within a budget (`cache/maps.rs`).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Bytes of a file mapped read-only; unmapped on drop.
pub struct Mapped {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone.
unsafe impl Send for Mapped {}
// SAFETY: as above: shared references only read it.
unsafe impl Sync for Mapped {}

impl Mapped {
    /// Maps `len` bytes of `file` from `offset` (a multiple of the page size). The file
    /// must hold them: a mapped page past its end faults when touched.
    pub fn new(file: &File, offset: u64, len: usize) -> io::Result<Mapped> {
        if len == 0 {
            return Ok(Mapped {
                base: std::ptr::null_mut(),
                len: 0,
            });
        }
        // SAFETY: a fresh private read-only mapping of an open file; the kernel checks the
        // range and the descriptor.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: advice on the mapping just made; failure is harmless.
        unsafe { libc::madvise(base, len, libc::MADV_SEQUENTIAL) };
        Ok(Mapped { base, len })
    }

    /// The address of the first byte (null when empty).
    pub fn base(&self) -> usize {
        self.base as usize
    }

    /// Whether every page of the mapping is in the page cache now: then touching it
    /// never waits on the disk.
    pub fn resident(&self) -> bool {
        self.resident_range(0, self.len)
    }

    /// The pages of bytes `from..to` of the mapping, widened to whole pages: its start,
    /// its length; `None` when empty.
    fn pages(&self, from: usize, to: usize) -> Option<(*mut libc::c_void, usize)> {
        let page = page_size();
        let (from, to) = (from / page * page, to.min(self.len));
        (from < to).then(|| {
            // SAFETY: `from` is inside the mapping.
            (
                unsafe { self.base.cast::<u8>().add(from) }.cast(),
                to - from,
            )
        })
    }

    /// Whether every page holding bytes `from..to` of the mapping is in the page cache
    /// now.
    pub fn resident_range(&self, from: usize, to: usize) -> bool {
        let Some((base, len)) = self.pages(from, to) else {
            return true;
        };
        let mut vec = vec![0u8; len.div_ceil(page_size())];
        // SAFETY: `vec` has one byte per page of this range of a live mapping.
        let r = unsafe { libc::mincore(base, len, vec.as_mut_ptr()) };
        r == 0 && vec.iter().all(|b| b & 1 == 1)
    }

    /// Locks the mapping's pages in memory (`mlock`), reading in those that are not
    /// resident, waiting for them (blocking: call it off the runtime's threads). A
    /// locked page is never reclaimed while the mapping lives, so a touch of it (the
    /// socket's copy, `sendfile`) reads what was in memory when it was checked, never
    /// the disk; unmapping unlocks it. Refused where the process may not lock that much
    /// (`RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`).
    pub fn lock(&self) -> io::Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        // SAFETY: locking the pages of this live mapping.
        if unsafe { libc::mlock(self.base, self.len) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        // A lock that failed part way may hold some pages: none is kept.
        // SAFETY: as above.
        unsafe { libc::munlock(self.base, self.len) };
        Err(e)
    }

    /// Reads the mapping's pages in from the disk, waiting for them (blocking: call it
    /// off the runtime's threads). The pages come in by faults (`MADV_POPULATE_READ`, or
    /// a touch of each page where the kernel lacks it), whose readahead of a sequential
    /// mapping builds large folios: `MADV_WILLNEED` read them as single pages, and every
    /// later hit on the entry mapped and sent them a page at a time (0.35 against 0.24
    /// CPU s/GiB unchecked here, and the first read from the disk at 0.9 against
    /// 2.5 GB/s).
    pub fn fault_in(&self) {
        self.fault_in_range(0, self.len);
    }

    /// [`Mapped::fault_in`] of the pages holding bytes `from..to` of the mapping.
    pub fn fault_in_range(&self, from: usize, to: usize) {
        let Some((base, len)) = self.pages(from, to) else {
            return;
        };
        // SAFETY: populating this range of a live read-only mapping; an old kernel says
        // EINVAL.
        if unsafe { libc::madvise(base, len, libc::MADV_POPULATE_READ) } == 0 {
            return;
        }
        let step = page_size();
        let start = base as usize - self.base as usize;
        let bytes: &[u8] = self;
        let mut sum = 0u8;
        for at in (start..start + len).step_by(step) {
            // SAFETY: `at` is inside the mapping; a volatile read so the touch stays.
            sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(bytes.as_ptr().add(at)) });
        }
        std::hint::black_box(sum);
    }
}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

impl std::ops::Deref for Mapped {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `len` bytes from `base` stay mapped readable while self lives. Entry
        // files are never written or truncated after their commit; the callers check the
        // file's length before mapping it.
        unsafe { std::slice::from_raw_parts(self.base.cast::<u8>(), self.len) }
    }
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if !self.base.is_null() {
            // SAFETY: unmaps exactly the mapping this value made.
            unsafe { libc::munmap(self.base, self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_mapping_holds_the_files_bytes_and_can_be_faulted_in() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
        f.write_all(&data).unwrap();
        let m = Mapped::new(&f, 64 << 10, 512 << 10).unwrap();
        m.fault_in();
        assert!(m.resident(), "just written and touched");
        assert_eq!(&m[..], &data[64 << 10..576 << 10]);
        assert!(m.resident_range(5000, 9000) && m.resident_range(7, 7));
        let empty = Mapped::new(&f, 0, 0).unwrap();
        assert!(empty.is_empty() && empty.resident());
    }

    /// Pages only on the disk (written around the page cache) are in memory once
    /// faulted in, and read back as written.
    #[test]
    fn pages_only_on_the_disk_are_resident_once_faulted_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
        let mut w = super::super::direct::DirectWriter::new(File::create(&path).unwrap(), 1 << 20);
        w.write(&[bytes::Bytes::from(data.clone())]).unwrap();
        let direct = w.is_direct();
        drop(w.finish().unwrap());
        let f = File::open(&path).unwrap();
        let m = Mapped::new(&f, 1 << 20, 2 << 20).unwrap();
        if direct {
            assert!(!m.resident(), "written around the page cache");
        }
        m.fault_in_range(8192 + 5, 12288);
        assert!(m.resident_range(8192, 12288), "one page faulted in");
        if direct {
            // Readahead reads forward only.
            assert!(!m.resident_range(0, 8192), "the pages before it not");
        }
        m.fault_in();
        assert!(m.resident(), "faulted in");
        assert!(m[..] == data[1 << 20..3 << 20]);
    }
}
