//! Cache hits sent with `sendfile(2)` (`--sendfile true`): bytes leave from their file
//! without a copy in user space or into the socket.
//!
//! hyper writes a body as the `Bytes` it is given. A large cache hit's body is made of
//! slices of a read-only mapping of the entry file ([`FileBytes`]). With sendfile on,
//! each live mapping is registered here by address. A connection that can
//! ([`FileSink`]: TCP and Unix sockets) looks up every large slice it is asked to
//! write; a slice of a registered mapping leaves with `sendfile(2)` from the same file
//! range, so the kernel moves page-cache pages to the socket. Any other writer (TLS, a
//! test's buffer), and every writer with sendfile off, copies from the mapping: the same
//! bytes, with the kernel's one copy.
//!
//! `--sendfile auto` (the default) sends files to readers on other machines only. With
//! every window of a warm hit sealed (locked, then checked), the pages sent are the
//! pages checked, and the node spends less CPU per byte than the kernel's copy from the
//! mapping, about nginx's with `sendfile on` (BENCHMARKS.md, "The peer at its best").
//! A reader on this machine (loopback, the Unix socket) then copies out of page-cache
//! pages in 4 KiB fragments instead of freshly written socket buffers: one stream into
//! its own memory ran at half the speed, at 2.7 times its CPU, so those connections get
//! the copy. Across a NIC the receiver's cost does not depend on how the bytes left.
//!
//! Soundness: a mapping stays registered until its last `Bytes` is dropped, and a write
//! borrows the slice it sends, so the descriptor looked up stays open during the call.
//! Addresses of live mappings never overlap, so a lookup cannot name the wrong file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncWrite, Interest};

use super::mapped::Mapped;
use crate::sync::RwLocked;

/// Where a registered mapping's bytes lie: its file and the offset of its first byte.
struct Region {
    end: usize,
    file: Arc<File>,
    offset: u64,
}

/// The [`SendfileChoice`] in force, as its `u8`: mappings are registered unless `Off`.
static CHOICE: AtomicU8 = AtomicU8::new(SendfileChoice::Off as u8);
static REGIONS: RwLock<BTreeMap<usize, Region>> = RwLock::new(BTreeMap::new());
/// How many mappings are registered: writers skip the lookup while there are none.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Bytes sent with `sendfile` since the process started.
static SENT: AtomicU64 = AtomicU64::new(0);

/// Which connections send cache hits with `sendfile` (`--sendfile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SendfileChoice {
    /// None: every hit is copied from its mapping by the kernel.
    Off,
    /// Connections from other machines; readers on this one get the copy.
    Auto,
    /// Every connection that can.
    On,
}

impl SendfileChoice {
    /// Every choice, as flags and the TOML file name them.
    pub const NAMES: [&'static str; 3] = ["auto", "true", "false"];
}

impl std::str::FromStr for SendfileChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<SendfileChoice, String> {
        match s {
            "auto" => Ok(SendfileChoice::Auto),
            "true" => Ok(SendfileChoice::On),
            "false" => Ok(SendfileChoice::Off),
            _ => Err(format!("`{s}`: expected auto, true or false")),
        }
    }
}

/// Sends the slices of every [`FileBytes`] made from now on with `sendfile`, on the
/// connections `choice` names.
pub fn enable(choice: SendfileChoice) {
    CHOICE.store(choice as u8, Ordering::Relaxed);
}

/// Whether this connection sends registered slices with `sendfile`: decided once, as it
/// is accepted.
pub fn wanted<T: FileSink>(io: &T) -> bool {
    match CHOICE.load(Ordering::Relaxed) {
        c if c == SendfileChoice::On as u8 => true,
        c if c == SendfileChoice::Auto as u8 => !io.on_this_machine(),
        _ => false,
    }
}

/// Whether mappings are sent with `sendfile`.
pub fn enabled() -> bool {
    CHOICE.load(Ordering::Relaxed) != SendfileChoice::Off as u8
}

/// Bytes that left with `sendfile` since the process started.
pub fn bytes_sent_from_files() -> u64 {
    SENT.load(Ordering::Relaxed)
}

/// Slices shorter than this are written as they are: a lookup and a `sendfile` call
/// cost more than copying them.
const SEND_FILE_MIN: usize = 16 << 10;

/// A mapping of a file range, whose slices a [`FileSink`] sends from the file when
/// sendfile is on.
pub struct FileBytes {
    map: Mapped,
    registered: bool,
}

impl FileBytes {
    /// Maps `len` bytes of `file` from `offset` (a multiple of the page size), and
    /// registers the mapping when sendfile is on.
    pub fn new(file: Arc<File>, offset: u64, len: usize) -> io::Result<FileBytes> {
        let map = Mapped::new(&file, offset, len)?;
        let registered = len > 0 && enabled();
        if registered {
            let base = map.base();
            let region = Region {
                end: base + len,
                file,
                offset,
            };
            REGIONS.write_locked().insert(base, region);
            LIVE.fetch_add(1, Ordering::Relaxed);
        }
        Ok(FileBytes { map, registered })
    }

    /// The mapped bytes (reading them faults pages in from the page cache).
    pub fn mapped(&self) -> &Mapped {
        &self.map
    }

    /// The whole mapping as `Bytes`; its slices stay sendable.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for FileBytes {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for FileBytes {
    fn drop(&mut self) {
        if self.registered {
            REGIONS.write_locked().remove(&self.map.base());
            LIVE.fetch_sub(1, Ordering::Relaxed);
        }
        // `map` unmaps after the region is gone.
    }
}

/// The descriptor and file offset of `buf`'s bytes, when they lie in a registered
/// mapping. The descriptor is open while `buf`'s mapping lives.
fn lookup(buf: &[u8]) -> Option<(RawFd, u64)> {
    let at = buf.as_ptr() as usize;
    let regions = REGIONS.read_locked();
    let (base, region) = regions.range(..=at).next_back()?;
    (at + buf.len() <= region.end)
        .then(|| (region.file.as_raw_fd(), region.offset + (at - base) as u64))
}

/// A connection that may send file ranges itself.
pub trait FileSink: AsyncWrite + Unpin {
    /// Whether the reader is on this machine (its copy out of page-cache pages costs it
    /// more than out of the socket's own buffers); yes unless the connection knows.
    fn on_this_machine(&self) -> bool {
        true
    }

    /// Sends up to `len` bytes of `fd` from `offset`; `None` where this connection cannot
    /// (its bytes are then written from the mapping), as by default.
    fn poll_send_file(
        &mut self,
        _cx: &mut Context<'_>,
        _fd: RawFd,
        _offset: u64,
        _len: usize,
    ) -> Option<Poll<io::Result<usize>>> {
        None
    }
}

/// Writes `bufs` to `io`: the slices before the first sendable one with one `writev`, or
/// a sendable first slice with `sendfile`. Returns what one call moved, as a write does.
pub fn poll_write_vectored<T: FileSink>(
    io: &mut T,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    if LIVE.load(Ordering::Relaxed) > 0 {
        let first = bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= SEND_FILE_MIN)
            .find_map(|(i, b)| lookup(b).map(|at| (i, at)));
        if let Some((i, (fd, offset))) = first {
            if i > 0 {
                return Pin::new(io).poll_write_vectored(cx, &bufs[..i]);
            }
            if let Some(r) = io.poll_send_file(cx, fd, offset, bufs[0].len()) {
                return r;
            }
        }
    }
    Pin::new(io).poll_write_vectored(cx, bufs)
}

/// [`poll_write_vectored`] for one buffer.
pub fn poll_write<T: FileSink>(
    io: &mut T,
    cx: &mut Context<'_>,
    buf: &[u8],
) -> Poll<io::Result<usize>> {
    if buf.len() >= SEND_FILE_MIN && LIVE.load(Ordering::Relaxed) > 0 {
        if let Some((fd, offset)) = lookup(buf) {
            if let Some(r) = io.poll_send_file(cx, fd, offset, buf.len()) {
                return r;
            }
        }
    }
    Pin::new(io).poll_write(cx, buf)
}

/// `sendfile(2)` from `fd` to a non-blocking socket, when the socket is writable.
pub fn poll_sendfile_on<S: AsRawFd>(
    cx: &mut Context<'_>,
    socket: &S,
    poll_ready: impl Fn(&mut Context<'_>) -> Poll<io::Result<()>>,
    try_io: impl Fn(&mut dyn FnMut() -> io::Result<usize>) -> io::Result<usize>,
    fd: RawFd,
    offset: u64,
    len: usize,
) -> Poll<io::Result<usize>> {
    // One call moves at most this much, so one connection does not hold a thread long.
    const MAX: usize = 8 << 20;
    let out = socket.as_raw_fd();
    loop {
        ready!(poll_ready(cx))?;
        let mut send = || {
            let mut off = offset as libc::off_t;
            // SAFETY: both descriptors are open for the call; `off` is a local the kernel
            // advances.
            let n = unsafe { libc::sendfile(out, fd, &mut off, len.min(MAX)) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        };
        match try_io(&mut send) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => {
                if let Ok(n) = &r {
                    SENT.fetch_add(*n as u64, Ordering::Relaxed);
                }
                return Poll::Ready(r);
            }
        }
    }
}

/// A peer on a loopback address, or on this end's own address, is on this machine.
fn same_machine(local: std::net::SocketAddr, peer: std::net::SocketAddr) -> bool {
    let ip = |a: std::net::SocketAddr| match a.ip() {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), Into::into),
        v4 => v4,
    };
    ip(peer).is_loopback() || ip(peer) == ip(local)
}

impl FileSink for tokio::net::TcpStream {
    fn on_this_machine(&self) -> bool {
        match (self.local_addr(), self.peer_addr()) {
            (Ok(local), Ok(peer)) => same_machine(local, peer),
            _ => true,
        }
    }

    fn poll_send_file(
        &mut self,
        cx: &mut Context<'_>,
        fd: RawFd,
        offset: u64,
        len: usize,
    ) -> Option<Poll<io::Result<usize>>> {
        let this = &*self;
        Some(poll_sendfile_on(
            cx,
            this,
            |cx| this.poll_write_ready(cx),
            |f| this.try_io(Interest::WRITABLE, f),
            fd,
            offset,
            len,
        ))
    }
}

impl FileSink for tokio::io::DuplexStream {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn file_of(len: usize) -> (Arc<File>, Vec<u8>) {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..len as u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        (Arc::new(f), data)
    }

    #[tokio::test]
    async fn a_mapped_slice_leaves_by_sendfile_with_the_files_bytes() {
        enable(SendfileChoice::On);
        let (file, data) = file_of(3 << 20);
        let bytes = FileBytes::new(file, 4096, (3 << 20) - 4096)
            .unwrap()
            .into_bytes();
        let piece = bytes.slice(100..(2 << 20) + 7);
        assert_eq!(lookup(&piece).map(|(_, o)| o), Some(4096 + 100));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut out = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = b"head:";
        let mut sent = 0;
        let total = head.len() + piece.len();
        while sent < total {
            let n = std::future::poll_fn(|cx| {
                let bufs = if sent < head.len() {
                    vec![IoSlice::new(&head[sent..]), IoSlice::new(&piece)]
                } else {
                    vec![IoSlice::new(&piece[sent - head.len()..])]
                };
                poll_write_vectored(&mut out, cx, &bufs)
            })
            .await
            .unwrap();
            assert!(n > 0);
            sent += n;
        }
        out.shutdown().await.unwrap();
        drop(out);
        let got = reader.await.unwrap();
        assert_eq!(&got[..5], head);
        assert_eq!(&got[5..], &data[4096 + 100..4096 + (2 << 20) + 7]);
        drop((bytes, piece));
        assert!(lookup(&data[..SEND_FILE_MIN]).is_none());
    }

    #[test]
    fn readers_on_this_machine_are_told_apart_from_others() {
        let at = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert!(same_machine(at("127.0.0.1:7070"), at("127.0.0.1:40000")));
        assert!(same_machine(at("127.0.0.1:7070"), at("127.0.0.9:40000")));
        assert!(same_machine(at("[::1]:7070"), at("[::1]:40000")));
        assert!(same_machine(
            at("[::ffff:10.0.0.5]:7070"),
            at("[::ffff:127.0.0.1]:1")
        ));
        // The node's own address, reached from this machine.
        assert!(same_machine(at("10.0.0.5:7070"), at("10.0.0.5:51000")));
        assert!(same_machine(
            at("[::ffff:10.0.0.5]:7070"),
            at("10.0.0.5:51000")
        ));
        assert!(!same_machine(at("10.0.0.5:7070"), at("10.0.0.6:51000")));
        assert!(!same_machine(
            at("[2001:db8::1]:7070"),
            at("[2001:db8::2]:51000")
        ));
    }

    #[tokio::test]
    async fn a_loopback_connection_is_on_this_machine() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let out = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (inbound, _) = listener.accept().await.unwrap();
        assert!(out.on_this_machine());
        assert!(inbound.on_this_machine());
        let (duplex, _) = tokio::io::duplex(64);
        assert!(duplex.on_this_machine());
    }

    #[tokio::test]
    async fn a_writer_that_cannot_sendfile_reads_the_mapping() {
        enable(SendfileChoice::On);
        let (file, data) = file_of(1 << 20);
        let bytes = FileBytes::new(file, 0, 1 << 20).unwrap().into_bytes();
        let (mut a, mut b) = tokio::io::duplex(4 << 20);
        let n = std::future::poll_fn(|cx| poll_write(&mut a, cx, &bytes))
            .await
            .unwrap();
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(&got[..], &data[..n]);
    }
}
