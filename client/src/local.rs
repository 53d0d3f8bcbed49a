//! Local reads: a process on the same machine as a node reads cached objects with no
//! copy through a socket. Over the node's Unix socket (`--listen-unix`) the client asks
//! for an object with `x-granary-local: fd`; the node answers with a read-only file
//! descriptor of its cache file (`SCM_RIGHTS`) and where the bytes lie in it, and the
//! client maps them ([`LocalFile::map`]). The node fills a cold object first. Where no
//! descriptor can be had — the client is on another machine, the node cannot cache the
//! object, another node owns it — the same call reads the bytes over HTTP instead.
//!
//! Access rules are those of any read: the request is signed (or anonymous where the node
//! allows anonymous reads), and a refused one is an error like any other.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use crate::client::Client;
use crate::objects::{get_request, GetOptions, ObjectMeta};
use crate::{Error, Result};

use granary_proto::crc::BlockChecks;
use granary_proto::headers::{LOCAL, LOCAL_CHECKS, LOCAL_RESIDENT};
/// Largest object read into memory when a node answers a local read with the bytes.
const MAX_FETCHED: usize = usize::MAX - 1;

/// A read-only descriptor of a node's cache file and the bytes of it that were asked.
#[derive(Debug)]
pub struct LocalFile {
    fd: OwnedFd,
    offset: u64,
    len: u64,
    meta: ObjectMeta,
    /// The checksums of the blocks holding the bytes, where the node sent them (asked
    /// with [`LOCAL_RESIDENT`]).
    checks: Option<BlockChecks>,
}

impl LocalFile {
    /// The descriptor (read-only: the node opened the file for reading).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Where the asked bytes start in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// How many bytes were asked.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no bytes were asked (an empty object).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The answer's headers (`size` is [`LocalFile::len`]).
    pub fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    /// Maps the asked bytes into memory, read-only. The node never writes a cache file
    /// after it is complete, so the mapping stays valid after the descriptor is closed,
    /// even if the object is replaced or removed meanwhile.
    pub fn map(&self) -> io::Result<Mapping> {
        // Shards are read front to back: ask for read-ahead.
        Mapping::new(
            self.fd.as_fd(),
            self.offset,
            self.len,
            libc::MADV_SEQUENTIAL,
        )
    }

    /// The asked bytes mapped, where every page of them is in the page cache now
    /// (`mincore`) and the node sent the checksums of their blocks; `None` where not.
    /// Asked for with [`LOCAL_RESIDENT`]: the node brought the range in just before it
    /// answered. The mapping (of the whole blocks holding the bytes) is advised random,
    /// so a touch brings in no neighbour. Its bytes are copied out with
    /// [`Mapping::copy_resident`], which checks the copy against the blocks' checksums.
    pub fn map_resident(self) -> io::Result<Option<Mapping>> {
        let Some(checks) = self.checks else {
            return Ok(None);
        };
        let start = checks.start();
        if self.offset < start || self.offset + self.len > checks.end {
            return Ok(None);
        }
        let mut map = Mapping::new(
            self.fd.as_fd(),
            start,
            checks.end - start,
            libc::MADV_RANDOM,
        )?;
        // The asked bytes within the blocks.
        map.skip += (self.offset - start) as usize;
        map.len = self.len as usize;
        if !map.resident(0..map.len)? {
            return Ok(None);
        }
        map.file = Some(self.fd);
        map.checks = Some(checks);
        Ok(Some(map))
    }

    /// The descriptor, for the caller to keep.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

/// What a local read got: the node's file, or the bytes when it could not give one.
#[derive(Debug)]
pub enum Local {
    File(LocalFile),
    Bytes(Vec<u8>, ObjectMeta),
}

/// Read-only mapped bytes of a file; unmapped on drop.
pub struct Mapping {
    /// Start of the mapping (page aligned); null for an empty one.
    base: *mut libc::c_void,
    map_len: usize,
    /// Where the asked bytes start within the mapping.
    skip: usize,
    len: usize,
    /// The file, kept where its bytes are copied out only while it is the node's
    /// ([`Mapping::copy_resident`]).
    file: Option<OwnedFd>,
    /// The checksums of the blocks mapped (the whole mapping), where copies are checked.
    checks: Option<BlockChecks>,
}

// SAFETY: the mapping is read-only and owned: shared references read immutable memory.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from `offset`, with `advice` for the kernel.
    fn new(fd: BorrowedFd<'_>, offset: u64, len: u64, advice: libc::c_int) -> io::Result<Mapping> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        if len == 0 {
            return Ok(Mapping {
                base: std::ptr::null_mut(),
                map_len: 0,
                skip: 0,
                len: 0,
                file: None,
                checks: None,
            });
        }
        // SAFETY: sysconf reads a constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let start = offset / page * page;
        let skip = (offset - start) as usize;
        let map_len = skip + len;
        // SAFETY: a fresh shared read-only mapping of the descriptor's file; the kernel
        // checks the range and the descriptor's access mode.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                start as libc::off_t,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping {
            base,
            map_len,
            skip,
            len,
            file: None,
            checks: None,
        };
        // SAFETY: advice on the mapping just made.
        if unsafe { libc::madvise(base, map_len, advice) } != 0 && advice == libc::MADV_RANDOM {
            // Without it, a touch could read pages in: the caller relies on it.
            return Err(io::Error::last_os_error());
        }
        Ok(map)
    }

    /// Whether every page of bytes `range` (of the asked bytes) is in the page cache now.
    fn resident(&self, range: std::ops::Range<usize>) -> io::Result<bool> {
        self.resident_mapped(self.skip + range.start..self.skip + range.end)
    }

    /// Whether every page of bytes `range` of the mapping (from its first byte) is in
    /// the page cache now.
    fn resident_mapped(&self, range: std::ops::Range<usize>) -> io::Result<bool> {
        if range.is_empty() {
            return Ok(true);
        }
        // SAFETY: sysconf reads a constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let from = range.start / page * page;
        let len = range.end - from;
        let mut vec = vec![0u8; len.div_ceil(page)];
        // SAFETY: `from..from + len` lies in the mapping (page aligned), and `vec` has a
        // byte per page of it.
        let got = unsafe {
            libc::mincore(
                self.base.cast::<u8>().add(from).cast(),
                len,
                vec.as_mut_ptr(),
            )
        };
        if got != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.iter().all(|v| v & 1 == 1))
    }

    /// Whether the node still keeps the file (it is linked): one it dropped — found a
    /// block of it damaged, or made room — may hold pages it read in and refused.
    fn kept(&self) -> io::Result<bool> {
        let Some(fd) = &self.file else {
            return Ok(true);
        };
        // SAFETY: `stat` is plain data, for which all zeroes is a value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat of an open descriptor into a struct of ours.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st.st_nlink > 0)
    }

    /// Copies bytes `range` (of the asked bytes) to `dst`, and checks the copy against
    /// its blocks' checksums: `true` where it holds. `false` where a page of the blocks
    /// is not in the page cache now, the node no longer keeps the file, or the copy
    /// fails its check; `dst` may then be written, and the caller asks the node for the
    /// bytes. A page taken from memory between the look and the copy is read in again by
    /// the copy (one page: the mapping is advised random), and the check catches it if
    /// the disk damaged it. Needs a mapping from [`LocalFile::map_resident`] (else
    /// `false`).
    ///
    /// # Safety
    ///
    /// `dst` must be valid for writes of `range.len()` bytes.
    ///
    /// # Panics
    ///
    /// Where `range` is not within the asked bytes.
    pub unsafe fn copy_resident(
        &self,
        range: std::ops::Range<usize>,
        dst: *mut u8,
    ) -> io::Result<bool> {
        let src = &self[range.clone()];
        let Some(checks) = &self.checks else {
            return Ok(false);
        };
        if src.is_empty() {
            return Ok(true);
        }
        // The whole blocks holding the range, from the mapping's first byte (the first
        // block's start).
        let (at, block) = ((self.skip + range.start) as u64, checks.block);
        let from = at / block * block;
        let to = ((self.skip + range.end) as u64)
            .div_ceil(block)
            .saturating_mul(block)
            .min(self.map_len as u64);
        if !self.resident_mapped(from as usize..to as usize)? || !self.kept()? {
            return Ok(false);
        }
        // SAFETY: the caller vouches for `dst`; `src` is mapped while self lives.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        // SAFETY: just written, `src.len()` bytes.
        let copy = unsafe { std::slice::from_raw_parts(dst, src.len()) };
        Ok(checks.holds(self.blocks(), checks.start() + at, copy))
    }

    /// The whole mapping, from its first byte.
    fn blocks(&self) -> &[u8] {
        if self.map_len == 0 {
            return &[];
        }
        // SAFETY: `map_len` bytes from `base` are mapped readable while self lives.
        unsafe { std::slice::from_raw_parts(self.base.cast::<u8>(), self.map_len) }
    }
}

impl std::ops::Deref for Mapping {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `skip + len` bytes from `base` are mapped readable while self lives.
        unsafe { std::slice::from_raw_parts(self.base.cast::<u8>().add(self.skip), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if !self.base.is_null() {
            // SAFETY: unmaps exactly the mapping this value made.
            unsafe { libc::munmap(self.base, self.map_len) };
        }
    }
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping").field("len", &self.len).finish()
    }
}

/// The bytes of a local read: mapped from the node's cache file, or fetched over HTTP.
#[derive(Debug)]
pub enum LocalBytes {
    Mapped(Mapping),
    Fetched(Vec<u8>),
}

impl LocalBytes {
    /// Whether the bytes are the node's file, mapped (no copy was made).
    pub fn is_mapped(&self) -> bool {
        matches!(self, LocalBytes::Mapped(_))
    }
}

impl std::ops::Deref for LocalBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            LocalBytes::Mapped(m) => m,
            LocalBytes::Fetched(v) => v,
        }
    }
}

impl Client {
    /// Local reads go over the node's Unix socket at `path` when it can be reached (the
    /// node runs on this machine); other calls, and local reads when it cannot, use the
    /// endpoint.
    pub fn with_local_socket(mut self, path: impl AsRef<Path>) -> Client {
        let endpoint = format!("unix:{}", path.as_ref().display());
        self.local = Client::new(&endpoint).ok().map(|l| {
            Box::new(
                l.with_credentials_opt(self.credentials().cloned())
                    .with_timeout(self.timeout()),
            )
        });
        self
    }

    /// Reads an object (a range, a member, a transform result, as `opts` says) as a
    /// descriptor of the node's cache file where one can be had, else as bytes over HTTP.
    pub fn open_local(&mut self, bucket: &str, key: &str, opts: &GetOptions) -> Result<Local> {
        self.open_local_as(bucket, key, opts, "fd")
    }

    /// Reads what `opts` asks for as bytes. Where the node is on this machine, they are
    /// copied out of its cache file rather than sent through the socket, if every page of
    /// them is resident; else, and elsewhere, they come over HTTP ([`Client::get_with`]).
    pub fn get_resident(&mut self, bucket: &str, key: &str, opts: &GetOptions) -> Result<Vec<u8>> {
        match self.open_resident(bucket, key, opts)? {
            LocalBytes::Fetched(bytes) => Ok(bytes),
            LocalBytes::Mapped(map) => {
                let mut out = Vec::new();
                out.try_reserve_exact(map.len()).map_err(|_| {
                    Error::Invalid(format!(
                        "{bucket}/{key}: {} bytes do not fit in memory",
                        map.len()
                    ))
                })?;
                // SAFETY: `out` has room for the bytes, all written where this is true.
                if unsafe { map.copy_resident(0..map.len(), out.as_mut_ptr()) }
                    .map_err(|e| self.io(e))?
                {
                    // SAFETY: as above.
                    unsafe { out.set_len(map.len()) };
                    return Ok(out);
                }
                self.get_with(bucket, key, opts)
            }
        }
    }

    /// What `opts` asks for as a mapping of the cache file of a node on this machine
    /// where every page of it is in the page cache ([`LocalFile::map_resident`]): its
    /// bytes are to be copied out at once, or later with [`Mapping::copy_resident`].
    /// Else the bytes, over HTTP.
    pub fn open_resident(
        &mut self,
        bucket: &str,
        key: &str,
        opts: &GetOptions,
    ) -> Result<LocalBytes> {
        if self.reads_locally() {
            match self.open_local_as(bucket, key, opts, LOCAL_RESIDENT)? {
                Local::Bytes(bytes, _) => return Ok(LocalBytes::Fetched(bytes)),
                Local::File(f) => {
                    if let Some(map) = f.map_resident().map_err(Error::Local)? {
                        return Ok(LocalBytes::Mapped(map));
                    }
                }
            }
        }
        self.get_with(bucket, key, opts).map(LocalBytes::Fetched)
    }

    /// [`Client::open_local`], the descriptor asked for with `how` (`x-granary-local`).
    fn open_local_as(
        &mut self,
        bucket: &str,
        key: &str,
        opts: &GetOptions,
        how: &str,
    ) -> Result<Local> {
        if let Some(mut local) = self.local.take() {
            let got = local.ask_local(bucket, key, opts, how);
            self.local = Some(local);
            match got {
                // The socket is not there (another machine) or went away: read over HTTP.
                Err(Error::Io { .. }) => {}
                other => return other,
            }
        } else if self.reads_locally() {
            return self.ask_local(bucket, key, opts, how);
        }
        let mut bytes = Vec::new();
        let meta = self.get_with_into(bucket, key, opts, &mut bytes)?;
        Ok(Local::Bytes(bytes, meta))
    }

    /// Reads a whole object, mapped from the node's cache file where possible.
    pub fn get_local(&mut self, bucket: &str, key: &str) -> Result<LocalBytes> {
        self.get_local_with(bucket, key, &GetOptions::default())
    }

    /// Reads what `opts` asks for, mapped from the node's cache file where possible.
    pub fn get_local_with(
        &mut self,
        bucket: &str,
        key: &str,
        opts: &GetOptions,
    ) -> Result<LocalBytes> {
        match self.open_local(bucket, key, opts)? {
            Local::File(f) => f.map().map(LocalBytes::Mapped).map_err(|e| self.io(e)),
            Local::Bytes(b, _) => Ok(LocalBytes::Fetched(b)),
        }
    }

    /// Asks this client's node for a descriptor.
    fn ask_local(
        &mut self,
        bucket: &str,
        key: &str,
        opts: &GetOptions,
        how: &str,
    ) -> Result<Local> {
        let req = get_request(bucket, key, opts)?.header(LOCAL, how);
        let (h, mut body) = self.call(req)?;
        let meta = ObjectMeta::from_head(&h);
        if h.header(LOCAL) != Some("fd") {
            let bytes = body.read_all(MAX_FETCHED).map_err(|e| self.io(e))?;
            self.done(body);
            return Ok(Local::Bytes(bytes, meta));
        }
        let fd = body.take_fds().pop();
        self.done(body);
        let number = |name: &str| -> Result<u64> {
            h.header(name)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| Error::Protocol(format!("a descriptor answer without {name}")))
        };
        let (offset, len) = (
            number("x-granary-local-offset")?,
            number("x-granary-local-length")?,
        );
        let fd = fd.ok_or_else(|| {
            Error::Protocol("the node answered with a descriptor, but none arrived".into())
        })?;
        let checks = h.header(LOCAL_CHECKS).and_then(BlockChecks::parse);
        Ok(Local::File(LocalFile {
            fd,
            offset,
            len,
            meta: ObjectMeta { size: len, ..meta },
            checks,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A range is copied out only while every page of it is resident and the file is
    /// still linked: once the file's pages are dropped from the page cache,
    /// `copy_resident` declines and reads nothing in, and once the file is removed (the
    /// node dropped the entry) it declines even where the pages are there.
    #[test]
    fn only_resident_pages_of_a_kept_file_are_copied_out() {
        let path = std::env::temp_dir().join(format!("granary-resident-{}", std::process::id()));
        let data: Vec<u8> = (0..(1u32 << 20))
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        drop(f);
        const AT: usize = 4096 + 7;
        const BLOCK: u64 = 64 << 10;
        let end = ((AT + 500_000) as u64).div_ceil(BLOCK) * BLOCK;
        let checks = BlockChecks {
            block: BLOCK,
            first: 0,
            end,
            crcs: data[..end as usize]
                .chunks(BLOCK as usize)
                .map(granary_proto::crc::crc32c)
                .collect(),
        };
        let open_with = |checks: Option<BlockChecks>| LocalFile {
            fd: std::fs::File::open(&path).unwrap().into(),
            offset: AT as u64,
            len: 500_000,
            meta: ObjectMeta::default(),
            checks,
        };
        let open = || open_with(Some(checks.clone()));
        assert!(
            open_with(None).map_resident().unwrap().is_none(),
            "nothing to check a copy against"
        );
        // Written a moment ago: resident.
        let map = open().map_resident().unwrap().expect("resident pages");
        let mut out = vec![0u8; 100_000];
        // SAFETY: `out` holds 100,000 bytes.
        let copy = |map: &Mapping, from: usize, out: &mut Vec<u8>| unsafe {
            map.copy_resident(from..from + 100_000, out.as_mut_ptr())
                .unwrap()
        };
        assert!(copy(&map, 1000, &mut out));
        assert!(out == data[AT + 1000..AT + 101_000]);
        drop(map);

        // A copy that does not sum to its blocks' checksums is refused: here the
        // checksum of block 2 (bytes 131,072..196,608 of the file) is wrong.
        let mut wrong = checks.clone();
        wrong.crcs[2] ^= 1;
        let map = open_with(Some(wrong))
            .map_resident()
            .unwrap()
            .expect("resident");
        assert!(copy(&map, 1000, &mut out), "blocks 0 and 1");
        assert!(out == data[AT + 1000..AT + 101_000]);
        assert!(!copy(&map, 130_000, &mut out), "blocks 2 and 3");
        assert!(copy(&map, 200_000, &mut out), "blocks 3 and 4");
        assert!(out == data[AT + 200_000..AT + 300_000]);
        let mut one = [0u8; 1];
        // SAFETY: `one` holds one byte.
        let in_block_2 = unsafe { map.copy_resident(140_000..140_001, one.as_mut_ptr()) };
        assert!(!in_block_2.unwrap(), "one byte of block 2");
        drop(map);

        // Mapped while resident, untouched; then the pages dropped from memory.
        let map = open().map_resident().unwrap().expect("resident pages");
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: advice on our own descriptor.
        let dropped =
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(dropped, 0);
        assert!(open().map_resident().unwrap().is_none(), "the pages left");
        assert!(!copy(&map, 1000, &mut out));
        assert!(
            !map.resident(0..500_000).unwrap(),
            "declining read nothing in"
        );
        drop(map);

        // Read in again; then the file removed (the node dropped the entry).
        assert!(std::fs::read(&path).unwrap() == data);
        let map = open().map_resident().unwrap().expect("resident pages");
        assert!(
            copy(&map, 1000, &mut out),
            "resident, and the file is linked"
        );
        std::fs::remove_file(&path).unwrap();
        assert!(
            !copy(&map, 1000, &mut out),
            "the file is no longer the node's"
        );
    }
}
