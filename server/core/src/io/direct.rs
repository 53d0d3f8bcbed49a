//! Writing a cache file around the page cache. A fill's bytes are written with `O_DIRECT`
//! a buffer at a time: the device takes them from memory, where a buffered write would
//! copy them into the page cache, mark every page dirty, and leave the fill's `fsync` to
//! write them all back (about three times the CPU per byte here). Bytes that already lie
//! in memory as they will in the file (received into an [`Inbox`]) are written from
//! there; others are copied into an aligned buffer first. The tail that does not fill a
//! whole block, and everything on a filesystem that refuses direct I/O, is written
//! through the page cache as before. MinIO writes its object parts the same way. The
//! aligned buffers are kept between fills, on huge pages (`slots`).

use std::alloc::{self, Layout};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use super::retrying;

/// Offsets, lengths and the buffer's address are multiples of this: a page, which every
/// block device's logical block divides.
pub const ALIGN: usize = 4096;

/// Writes a file from offset 0 on, in order.
pub struct DirectWriter {
    file: File,
    /// The bytes written a buffer at a time are copied here; taken when first needed.
    buf: Aligned,
    /// How large `buf` is.
    capacity: usize,
    /// Bytes in `buf`, not yet in the file.
    filled: usize,
    /// Parts written from where they are: contiguous in memory from a page-aligned
    /// address, the next bytes after `written`. Held until a buffer's worth has come; never
    /// at the same time as bytes in `buf`.
    run: Vec<bytes::Bytes>,
    run_len: usize,
    /// Bytes in the file.
    written: u64,
    direct: bool,
}

impl DirectWriter {
    /// Writes `file` directly, a `capacity` (a multiple of [`ALIGN`]) at a time, where its
    /// filesystem allows; `capacity == 0`, or a refusal, writes it through the page cache.
    pub fn new(file: File, capacity: usize) -> DirectWriter {
        let capacity = capacity / ALIGN * ALIGN;
        let direct = capacity > 0 && set_direct(&file, true).is_ok();
        DirectWriter {
            file,
            buf: Aligned::new(0),
            capacity: if direct { capacity } else { 0 },
            filled: 0,
            run: Vec::new(),
            run_len: 0,
            written: 0,
            direct,
        }
    }

    /// Whether bytes go around the page cache.
    #[cfg(test)]
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Bytes in the file so far: everything given, less up to a buffer still held.
    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Appends `parts`. Parts that lie in memory as they will in the file (page-aligned
    /// where a page of the file begins, each following the last: an [`Inbox`]'s) are
    /// written from where they are; others are copied into the buffer first.
    pub fn write(&mut self, parts: &[bytes::Bytes]) -> io::Result<()> {
        if !self.direct {
            let mut iov: Vec<io::IoSlice<'_>> = parts.iter().map(|b| io::IoSlice::new(b)).collect();
            self.written += pwrite_all(&self.file, &mut iov, self.written)?;
            return Ok(());
        }
        for part in parts {
            self.put(part.clone())?;
        }
        Ok(())
    }

    fn put(&mut self, mut data: bytes::Bytes) -> io::Result<()> {
        while !data.is_empty() {
            if !self.direct {
                self.release()?;
                let mut iov = [io::IoSlice::new(&data)];
                self.written += pwrite_all(&self.file, &mut iov, self.written)?;
                return Ok(());
            }
            let at = data.as_ptr() as usize;
            if self.run_len > 0 {
                if at == self.run_end() {
                    self.run_len += data.len();
                    self.run.push(std::mem::take(&mut data));
                    if self.run_len >= self.capacity {
                        self.write_run()?;
                    }
                } else {
                    // Not where the run's memory goes on: what is left of it is copied.
                    self.copy_run()?;
                }
                continue;
            }
            // `written` is page-aligned, so `filled` is where `data` goes within a page.
            let pos = self.filled;
            if at % ALIGN != pos % ALIGN {
                return self.copy_in(&data);
            }
            if pos.is_multiple_of(ALIGN) {
                if self.filled > 0 {
                    self.flush(self.filled)?;
                    continue;
                }
                self.run_len = data.len();
                self.run.push(std::mem::take(&mut data));
                if self.run_len >= self.capacity {
                    self.write_run()?;
                }
                continue;
            }
            // Copied up to the next page of the file, from where the rest can be written
            // as it lies.
            let head = data.split_to((ALIGN - pos % ALIGN).min(data.len()));
            self.copy_in(&head)?;
        }
        Ok(())
    }

    fn run_end(&self) -> usize {
        self.run[0].as_ptr() as usize + self.run_len
    }

    /// Copies `data` into the buffer, writing it out each time it is full.
    fn copy_in(&mut self, mut data: &[u8]) -> io::Result<()> {
        if self.buf.len() < self.capacity {
            self.buf = Aligned::new(self.capacity);
        }
        while !data.is_empty() {
            let n = (self.buf.len() - self.filled).min(data.len());
            self.buf.as_mut()[self.filled..self.filled + n].copy_from_slice(&data[..n]);
            self.filled += n;
            data = &data[n..];
            if self.filled == self.buf.len() {
                self.flush(self.filled)?;
            }
        }
        Ok(())
    }

    /// Copies what is held of the run into the buffer.
    fn copy_run(&mut self) -> io::Result<()> {
        for part in std::mem::take(&mut self.run) {
            self.copy_in(&part)?;
        }
        self.run_len = 0;
        Ok(())
    }

    /// Writes the run's whole pages from where they lie and keeps the rest.
    fn write_run(&mut self) -> io::Result<()> {
        let n = self.run_len / ALIGN * ALIGN;
        // SAFETY: the run's parts are contiguous from `run[0]`'s first byte (each began
        // where the last ended) and are held, so its `run_len >= n` bytes are live.
        unsafe { self.write_at(self.run[0].as_ptr(), n)? };
        let mut skip = n;
        let mut rest = Vec::new();
        for part in self.run.drain(..) {
            if skip >= part.len() {
                skip -= part.len();
            } else {
                rest.push(part.slice(skip..));
                skip = 0;
            }
        }
        self.run = rest;
        self.run_len -= n;
        Ok(())
    }

    /// Writes what is held through the page cache, once direct writes were turned off.
    fn release(&mut self) -> io::Result<()> {
        let mut iov: Vec<io::IoSlice<'_>> = Vec::with_capacity(1 + self.run.len());
        let held = &self.buf.as_mut()[..self.filled];
        iov.push(io::IoSlice::new(held));
        iov.extend(self.run.iter().map(|b| io::IoSlice::new(b)));
        self.written += pwrite_all(&self.file, &mut iov, self.written)?;
        self.filled = 0;
        self.run.clear();
        self.run_len = 0;
        Ok(())
    }

    /// Writes what is held, and gives the file back positioned at its end, through the
    /// page cache from here on.
    pub fn finish(mut self) -> io::Result<File> {
        if self.direct && self.run_len >= ALIGN {
            self.write_run()?;
        }
        self.copy_run()?;
        let whole = self.filled / ALIGN * ALIGN;
        if whole > 0 {
            self.flush(whole)?;
        }
        // `flush` may have turned direct writes off already.
        if self.direct {
            set_direct(&self.file, false)?;
        }
        // Only direct writes hold bytes back.
        if self.filled > 0 {
            let rest = &self.buf.as_mut()[..self.filled];
            self.written += pwrite_all(&self.file, &mut [io::IoSlice::new(rest)], self.written)?;
            self.filled = 0;
        }
        use std::io::Seek;
        self.file.seek(io::SeekFrom::Start(self.written))?;
        Ok(self.file)
    }

    /// Writes the first `n` bytes of the buffer (a multiple of [`ALIGN`]) and keeps the
    /// rest at its start.
    fn flush(&mut self, n: usize) -> io::Result<()> {
        // SAFETY: `n <= filled` initialised bytes of the buffer.
        unsafe { self.write_at(self.buf.ptr, n)? };
        self.buf.as_mut().copy_within(n..self.filled, 0);
        self.filled -= n;
        Ok(())
    }

    /// Writes `n` bytes (a multiple of [`ALIGN`]) from `src` at `written`. A filesystem
    /// that takes the flag but not the write, or a short write off the alignment, turns
    /// direct I/O off for the rest of the file.
    ///
    /// # Safety
    ///
    /// `src..src + n` is live memory that nothing writes meanwhile.
    unsafe fn write_at(&mut self, src: *const u8, n: usize) -> io::Result<()> {
        let mut done = 0usize;
        while done < n {
            // SAFETY: a write from `n - done` live bytes, as the caller vouches.
            let r = retrying(|| unsafe {
                libc::pwrite(
                    self.file.as_raw_fd(),
                    src.add(done).cast(),
                    n - done,
                    (self.written as libc::off_t).saturating_add(done as libc::off_t),
                )
            });
            let r = match r {
                Err(e) if self.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::debug!(error = %e, "direct writes refused; writing through the page cache");
                    set_direct(&self.file, false)?;
                    self.direct = false;
                    continue;
                }
                r => r?,
            };
            if r == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            done += r;
            if done < n && !done.is_multiple_of(ALIGN) && self.direct {
                set_direct(&self.file, false)?;
                self.direct = false;
            }
        }
        self.written += n as u64;
        Ok(())
    }
}

/// Receives a body into page-aligned blocks kept on huge pages, handing out what each
/// receive brought as `Bytes` that share the block. Offset 0 of the body is the first
/// block's first byte and each block is filled before the next, so the body lies in
/// memory as it will in a file: [`DirectWriter`] writes it from there, without a copy.
pub struct Inbox {
    block: Arc<Aligned>,
    filled: usize,
}

/// An [`Inbox`] block's size.
pub const INBOX_BLOCK: usize = 512 << 10;

impl Default for Inbox {
    fn default() -> Inbox {
        Inbox::new()
    }
}

impl Inbox {
    pub fn new() -> Inbox {
        Inbox {
            block: Arc::new(Aligned::new(INBOX_BLOCK)),
            filled: 0,
        }
    }

    /// The block's free bytes, to receive into; a full block is followed by a new one.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.filled == self.block.len() {
            *self = Inbox::new();
        }
        // SAFETY: the block's bytes past `filled` are initialised, and no `Bytes` handed
        // out covers them; only this `Inbox` writes to the block.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.block.ptr.add(self.filled),
                self.block.len() - self.filled,
            )
        }
    }

    /// The next `n` bytes of [`Self::spare`], received, as `Bytes`.
    pub fn take(&mut self, n: usize) -> bytes::Bytes {
        assert!(
            self.filled + n <= self.block.len(),
            "more than the block holds"
        );
        let at = self.filled;
        self.filled += n;
        bytes::Bytes::from_owner(Received {
            block: self.block.clone(),
            at,
            len: n,
        })
    }
}

/// Received bytes of an [`Inbox`] block, which none writes again.
struct Received {
    block: Arc<Aligned>,
    at: usize,
    len: usize,
}

impl AsRef<[u8]> for Received {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `at..at + len` of the block, received and never written again.
        unsafe { std::slice::from_raw_parts(self.block.ptr.add(self.at), self.len) }
    }
}

/// Writes every byte of `iov` at `offset`, as few calls as the kernel allows; returns
/// how many.
fn pwrite_all(file: &File, iov: &mut [io::IoSlice<'_>], offset: u64) -> io::Result<u64> {
    let mut rest = iov;
    let mut at = offset;
    while !rest.is_empty() {
        let count = rest.len().min(1024);
        // SAFETY: `count` live IoSlices, laid out as iovecs.
        let r = retrying(|| unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                rest.as_ptr().cast(),
                count as libc::c_int,
                at as libc::off_t,
            )
        })?;
        if r == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        at += r as u64;
        io::IoSlice::advance_slices(&mut rest, r);
    }
    Ok(at - offset)
}

fn set_direct(file: &File, on: bool) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: reading and setting the status flags of an open descriptor.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if on {
            flags | libc::O_DIRECT
        } else {
            flags & !libc::O_DIRECT
        };
        if libc::fcntl(fd, libc::F_SETFL, flags) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A buffer whose address is a multiple of [`ALIGN`], every byte initialised. One that
/// divides a huge page is a slot of one ([`slots`]), kept for the next fill when this one
/// is done; any other is a zeroed heap allocation.
struct Aligned {
    ptr: *mut u8,
    len: usize,
    pooled: bool,
}

// SAFETY: the buffer is owned, like a Vec<u8>.
unsafe impl Send for Aligned {}
// SAFETY: shared, as an `Inbox`'s block, its bytes are written only where no reader looks.
unsafe impl Sync for Aligned {}

impl Aligned {
    fn new(len: usize) -> Aligned {
        if len == 0 {
            return Aligned {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
                pooled: false,
            };
        }
        if let Some(ptr) = slots::take(len) {
            return Aligned {
                ptr,
                len,
                pooled: true,
            };
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("a page-aligned layout");
        // SAFETY: a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        Aligned {
            ptr,
            len,
            pooled: false,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialised bytes owned by this buffer.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        if self.pooled {
            slots::give_back(self.ptr, self.len);
        } else if self.len > 0 {
            // SAFETY: allocated in `new` with this layout.
            unsafe { alloc::dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, ALIGN)) }
        }
    }
}

/// Direct writes' buffers, carved out of 2 MiB regions the kernel is asked to back with
/// huge pages, and kept for the next fill: a buffer the socket's bytes are copied into
/// and the device reads from is one TLB entry and one page to pin, not 128, and it is
/// never faulted in again.
mod slots {
    use std::sync::Mutex;

    use crate::sync::Locked;

    /// A region: one huge page.
    pub(super) const REGION: usize = 2 << 20;
    /// The most regions kept: 32 MiB, 64 buffers of 512 KiB. Beyond them buffers come
    /// from the heap and go back to it.
    pub(super) const MAX_REGIONS: usize = 16;

    struct Slots {
        regions: usize,
        /// Free buffers by size (each size divides [`REGION`]), as addresses.
        free: Vec<(usize, Vec<usize>)>,
    }

    impl Slots {
        fn of(&mut self, len: usize) -> &mut Vec<usize> {
            let i = match self.free.iter().position(|(l, _)| *l == len) {
                Some(i) => i,
                None => {
                    self.free.push((len, Vec::new()));
                    self.free.len() - 1
                }
            };
            &mut self.free[i].1
        }
    }

    static SLOTS: Mutex<Slots> = Mutex::new(Slots {
        regions: 0,
        free: Vec::new(),
    });

    /// A free buffer of `len` bytes (a multiple of a page that divides a region), from a
    /// new region if none is free and fewer than [`MAX_REGIONS`] are kept.
    pub(super) fn take(len: usize) -> Option<*mut u8> {
        if len > REGION || !REGION.is_multiple_of(len) || !len.is_multiple_of(super::ALIGN) {
            return None;
        }
        let mut slots = SLOTS.locked();
        if let Some(at) = slots.of(len).pop() {
            return Some(at as *mut u8);
        }
        if slots.regions >= MAX_REGIONS {
            return None;
        }
        let region = map_region()?;
        slots.regions += 1;
        slots
            .of(len)
            .extend((len..REGION).step_by(len).map(|off| region as usize + off));
        Some(region)
    }

    pub(super) fn give_back(ptr: *mut u8, len: usize) {
        let mut slots = SLOTS.locked();
        slots.of(len).push(ptr as usize);
    }

    /// A zeroed region aligned to its size, advised to be backed by a huge page.
    fn map_region() -> Option<*mut u8> {
        let span = 2 * REGION;
        // SAFETY: a fresh private anonymous mapping; the parts outside the aligned region
        // are unmapped at once, and the region itself is never unmapped.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return None;
            }
            let start = p as usize;
            let aligned = start.next_multiple_of(REGION);
            if aligned > start {
                libc::munmap(p, aligned - start);
            }
            let tail = start + span - (aligned + REGION);
            if tail > 0 {
                libc::munmap((aligned + REGION) as *mut libc::c_void, tail);
            }
            libc::madvise(aligned as *mut libc::c_void, REGION, libc::MADV_HUGEPAGE);
            Some(aligned as *mut u8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::io::Write;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + i / 4093) as u8).collect()
    }

    /// Writes `len` bytes in chunks of `chunk`, checking what the writer says it has
    /// written after each, then a footer after `finish`; returns the file's bytes.
    fn write_all(dir: &std::path::Path, len: usize, chunk: usize, capacity: usize) -> Vec<u8> {
        let path = dir.join(format!("f-{len}-{chunk}-{capacity}"));
        let file = File::create(&path).unwrap();
        let mut w = DirectWriter::new(file, capacity);
        let bytes = data(len);
        let mut given = 0u64;
        for c in bytes.chunks(chunk.max(1)) {
            // Two parts a call, as a fill's pieces come.
            let (a, b) = c.split_at(c.len() / 2);
            w.write(&[Bytes::copy_from_slice(a), Bytes::copy_from_slice(b)])
                .unwrap();
            given += c.len() as u64;
            let written = w.written();
            if w.is_direct() {
                assert_eq!(written % ALIGN as u64, 0, "direct writes are whole pages");
                assert!(given - written < capacity as u64, "at most a buffer held");
            } else {
                assert_eq!(written, given, "through the page cache nothing is held");
            }
        }
        let mut file = w.finish().unwrap();
        file.write_all(b"footer").unwrap();
        drop(file);
        let got = std::fs::read(&path).unwrap();
        assert_eq!(
            got.len(),
            len + 6,
            "len {len} chunk {chunk} capacity {capacity}"
        );
        assert!(
            got[..len] == bytes[..],
            "len {len} chunk {chunk} capacity {capacity}"
        );
        assert_eq!(&got[len..], b"footer");
        got
    }

    #[test]
    fn every_byte_given_is_in_the_file_once_finished_whatever_the_sizes() {
        let dir = tempfile::tempdir().unwrap();
        for len in [
            0,
            1,
            4095,
            4096,
            4097,
            1 << 20,
            (1 << 20) + 123,
            (3 << 20) + 7,
        ] {
            for chunk in [1000, 65536, 70001, 1 << 20] {
                for capacity in [0, 1 << 20, 64 << 10] {
                    write_all(dir.path(), len, chunk, capacity);
                }
            }
        }
    }

    /// Kept buffers are page-aligned, never overlap, are written whole, and come from
    /// at most `MAX_REGIONS` regions: past them the heap gives buffers, as before.
    #[test]
    fn kept_buffers_are_aligned_disjoint_and_bounded() {
        let len = 256 << 10;
        let mut taken = Vec::new();
        while let Some(p) = slots::take(len) {
            taken.push(p as usize);
            if taken.len() > 4 * slots::MAX_REGIONS * (slots::REGION / len) {
                break;
            }
        }
        assert!(
            !taken.is_empty() && taken.len() <= slots::MAX_REGIONS * (slots::REGION / len),
            "{} buffers of {len} bytes kept",
            taken.len()
        );
        taken.sort_unstable();
        assert!(
            taken.windows(2).all(|w| w[1] - w[0] >= len),
            "overlapping buffers"
        );
        assert!(taken.iter().all(|p| p % ALIGN == 0), "unaligned buffer");
        for (i, &p) in taken.iter().enumerate() {
            // SAFETY: `len` bytes this test holds.
            unsafe { std::ptr::write_bytes(p as *mut u8, i as u8, len) };
        }
        for (i, &p) in taken.iter().enumerate() {
            // SAFETY: as above.
            let got = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
            assert!(
                got.iter().all(|&b| b == i as u8),
                "buffer {i} was written over"
            );
        }
        for &p in &taken {
            slots::give_back(p as *mut u8, len);
        }
        // A buffer given back is the next one taken of its size.
        let again = slots::take(len).expect("a buffer given back");
        assert!(taken.binary_search(&(again as usize)).is_ok());
        slots::give_back(again, len);
        // A writer whose buffer is kept writes what it is given, as one whose buffer is not.
        let dir = tempfile::tempdir().unwrap();
        write_all(dir.path(), (3 << 20) + 5, 70001, len);
    }

    /// Bytes received into an `Inbox` are written from where they lie: the copy buffer is
    /// never taken until `finish` copies the last part page. Mixed with bytes from
    /// elsewhere, every byte still lands where it belongs.
    #[test]
    fn inbox_bytes_are_written_where_they_lie() {
        let dir = tempfile::tempdir().unwrap();
        let len = (3 << 20) + 777;
        let bytes = data(len);
        for mixed in [false, true] {
            let path = dir.path().join(format!("f-{mixed}"));
            let mut w = DirectWriter::new(File::create(&path).unwrap(), 512 << 10);
            let mut inbox = Inbox::new();
            let (mut at, mut i) = (0usize, 0usize);
            while at < len {
                i += 1;
                let part = if mixed && i % 7 == 0 {
                    // A part from elsewhere, as a different source's, then a fresh inbox.
                    let n = (5000 + i * 37).min(len - at);
                    inbox = Inbox::new();
                    Bytes::copy_from_slice(&bytes[at..at + n])
                } else {
                    let spare = inbox.spare();
                    let n = (1 + (i * 40_009) % 200_000).min(spare.len()).min(len - at);
                    spare[..n].copy_from_slice(&bytes[at..at + n]);
                    inbox.take(n)
                };
                at += part.len();
                w.write(&[part]).unwrap();
                assert!(at as u64 - w.written() < 512 << 10, "at most a buffer held");
            }
            if !w.is_direct() {
                crate::testing::skipped("this filesystem refuses O_DIRECT: nothing to check");
                return;
            }
            assert_eq!(
                w.buf.len() == 0,
                !mixed,
                "copied only where the bytes were elsewhere"
            );
            drop(w.finish().unwrap());
            assert!(std::fs::read(&path).unwrap() == bytes, "mixed {mixed}");
        }
    }

    /// The point of it: what was written directly is not in the page cache (where the
    /// filesystem takes direct writes at all).
    #[test]
    fn direct_writes_leave_no_pages_in_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let len = 4 << 20;
        let path = dir.path().join("f");
        let mut w = DirectWriter::new(File::create(&path).unwrap(), 1 << 20);
        if !w.is_direct() {
            crate::testing::skipped("this filesystem refuses O_DIRECT: nothing to check");
            return;
        }
        w.write(&[Bytes::from(data(len))]).unwrap();
        assert!(w.is_direct(), "the filesystem took the flag and the writes");
        assert_eq!(w.written(), len as u64);
        drop(w.finish().unwrap());
        let file = File::open(&path).unwrap();
        let map = super::super::mapped::Mapped::new(&file, 0, len).unwrap();
        assert!(!map.resident(), "directly written pages are not cached");
        let buffered = dir.path().join("g");
        let mut w = DirectWriter::new(File::create(&buffered).unwrap(), 0);
        w.write(&[Bytes::from(data(len))]).unwrap();
        drop(w.finish().unwrap());
        let file = File::open(&buffered).unwrap();
        let map = super::super::mapped::Mapped::new(&file, 0, len).unwrap();
        assert!(map.resident(), "written through the page cache, they are");
    }
}
