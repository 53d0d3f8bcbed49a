//! HTTP/1.1 over blocking `std::net` sockets: one pooled keep-alive connection per
//! [`Conn`], request bodies streamed from a `Read`, and response bodies read as they arrive
//! through [`BodyReader`] (content-length, chunked, or until close).
//!
//! A pooled connection the node has closed meanwhile is noticed before reuse (a
//! non-blocking peek), and a request whose body can be sent again is retried once on a
//! fresh connection when a reused one fails before the answer's head arrives.
//!
//! A node on this machine, reached over TCP at a loopback address, may offer its Unix
//! socket (`x-granary-socket: PID PATH`): the connection goes on over the socket from the
//! next request, once the process answering on it is the node's (`SO_PEERCRED`), and
//! back over TCP whenever the socket fails. The same API, without the TCP stack between
//! the two: about a quarter less CPU per byte for both ends. `GRANARY_LOCAL_SOCKET=off` in
//! the environment keeps every connection on the address it was given.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::time::Duration;

use granary_proto::Header;

use crate::pages::{huge_pages, prefault, prefault_helpers, PREFAULT_FROM};
use crate::sock::Sock;
use crate::{Error, Result};

/// A connected socket with its read buffer.
pub(crate) type Stream = BufReader<Sock>;

/// Longest status or header line accepted.
const MAX_LINE: u64 = 16 << 10;
/// Most header bytes accepted in one answer.
const MAX_HEAD: usize = 256 << 10;
/// Read buffer of a connection: large, since shards are read sequentially through it.
const READ_BUFFER: usize = 256 << 10;

/// What follows a request's head.
pub(crate) enum Body<'a> {
    Empty,
    Bytes(&'a [u8]),
    /// Exactly this many bytes from the reader (fewer is an error).
    Reader(&'a mut dyn Read, u64),
}

impl Body<'_> {
    pub(crate) fn len(&self) -> u64 {
        match self {
            Body::Empty => 0,
            Body::Bytes(b) => b.len() as u64,
            Body::Reader(_, n) => *n,
        }
    }

    /// Whether the body can be sent a second time (a reader is spent by the first).
    fn replayable(&self) -> bool {
        !matches!(self, Body::Reader(..))
    }
}

/// The status line and headers of an answer; names in lower case.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub status: u16,
    pub headers: Vec<Header>,
}

impl Head {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        Header::find(&self.headers, name)
    }
}

/// A node's address and the connection kept open to it.
pub(crate) struct Conn {
    /// `host:port`, or `unix:PATH` for a node's Unix socket.
    pub addr: String,
    stream: Option<Stream>,
    pub timeout: Duration,
    /// The node's Unix socket on this machine, where it offered one.
    local: Local,
}

/// Whether a connection given a TCP address goes over the node's Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Local {
    /// Not offered yet.
    Unknown,
    /// Offered by the node (its process id, the socket's path): tried on the next request.
    Offered(i32, String),
    /// In use: new connections go over it.
    Using(i32, String),
    /// Not for this connection: a Unix address already, turned off, or the socket failed.
    Never,
}

impl Local {
    fn at_start(addr: &str) -> Local {
        Local::given(addr, std::env::var("GRANARY_LOCAL_SOCKET").ok().as_deref())
    }

    /// What a connection to `addr` starts with, `GRANARY_LOCAL_SOCKET` being `setting`.
    fn given(addr: &str, setting: Option<&str>) -> Local {
        let off = setting.is_some_and(|v| matches!(v, "off" | "0" | "false" | "no"));
        if off || addr.starts_with("unix:") {
            Local::Never
        } else {
            Local::Unknown
        }
    }

    /// The offer in an answer's head (`PID PATH`), taken where none is known yet and the
    /// answer came over TCP from this machine.
    fn note(&mut self, head: &Head, stream: &Stream) {
        if *self != Local::Unknown {
            return;
        }
        let Some((pid, path)) = head
            .header(granary_proto::headers::SOCKET)
            .and_then(|v| v.split_once(' '))
        else {
            return;
        };
        if let Ok(pid) = pid.parse() {
            if path.starts_with('/') && stream.get_ref().to_loopback() {
                *self = Local::Offered(pid, path.to_owned());
            }
        }
    }
}

/// Where a failed exchange failed: the network (retry may help) or the caller's reader.
enum Failure {
    Net(io::Error),
    Local(io::Error),
    Protocol(String),
}

impl Conn {
    pub(crate) fn new(addr: String, timeout: Duration) -> Conn {
        Conn {
            local: Local::at_start(&addr),
            addr,
            stream: None,
            timeout,
        }
    }

    /// A connection to the same node with the same settings: what this one learned of
    /// the node's Unix socket carries over (checked again on its first use).
    pub(crate) fn fresh(&self) -> Conn {
        let mut c = Conn::new(self.addr.clone(), self.timeout);
        c.local = match &self.local {
            Local::Using(pid, path) => Local::Offered(*pid, path.clone()),
            other => other.clone(),
        };
        c
    }

    /// Whether requests go (or from the next on, will go) over the node's Unix socket,
    /// which it offered.
    pub(crate) fn on_offered_socket(&self) -> bool {
        matches!(self.local, Local::Offered(..) | Local::Using(..))
    }

    /// Keeps to the address given: an offer of the node's Unix socket is not taken.
    pub(crate) fn keep_address(&mut self) {
        self.local = Local::Never;
    }

    fn io(&self, source: io::Error) -> Error {
        Error::Io {
            addr: self.addr.clone(),
            source,
        }
    }

    /// The pooled connection if it is still open, else a new one; and whether it was pooled.
    fn take(&mut self) -> Result<(Stream, bool)> {
        if let Local::Offered(pid, path) = &self.local {
            // The pooled TCP connection is let go for the socket.
            let local = Sock::connect_local(path, *pid)
                .and_then(|s| s.set_timeouts(self.timeout).map(|()| s));
            self.local = match local {
                Ok(s) => {
                    self.stream = Some(BufReader::with_capacity(READ_BUFFER, s));
                    Local::Using(*pid, path.clone())
                }
                Err(_) => Local::Never,
            };
        }
        if let Some(s) = self.stream.take() {
            if still_open(&s) {
                return Ok((s, true));
            }
        }
        let s = match &self.local {
            Local::Using(pid, path) => match Sock::connect_local(path, *pid) {
                Ok(s) => s,
                // The node went, or another took its place: over TCP, until it offers
                // its socket again.
                Err(_) => {
                    self.local = Local::Unknown;
                    Sock::connect(&self.addr).map_err(|e| self.io(e))?
                }
            },
            _ => Sock::connect(&self.addr).map_err(|e| self.io(e))?,
        };
        s.set_timeouts(self.timeout).map_err(|e| self.io(e))?;
        Ok((BufReader::with_capacity(READ_BUFFER, s), false))
    }

    /// Keeps a connection whose last answer was read to its end, for the next request.
    pub(crate) fn put_back(&mut self, stream: Option<Stream>) {
        if stream.is_some() {
            self.stream = stream;
        }
    }

    /// Sends `head` (the request line and headers, ending with the blank line) and `body`,
    /// and reads the answer's head. `head_request` says the answer has no body whatever its
    /// headers say; `idempotent` that the request may be sent again when a reused
    /// connection fails under it.
    pub(crate) fn exchange(
        &mut self,
        head: &[u8],
        body: &mut Body<'_>,
        head_request: bool,
        idempotent: bool,
    ) -> Result<(Head, BodyReader)> {
        let mut retried = false;
        loop {
            let (mut stream, reused) = self.take()?;
            // Descriptors of an earlier answer nobody asked for are closed.
            drop(stream.get_mut().take_fds());
            match send(&mut stream, head, body).and_then(|()| read_head(&mut stream)) {
                Ok(h) => {
                    self.local.note(&h, &stream);
                    let framing = framing(&h, head_request)?;
                    let keep_alive = !h
                        .header("connection")
                        .is_some_and(|v| v.to_ascii_lowercase().contains("close"));
                    return Ok((
                        h,
                        BodyReader {
                            stream: Some(stream),
                            framing,
                            keep_alive,
                        },
                    ));
                }
                Err(Failure::Net(_)) if reused && idempotent && !retried && body.replayable() => {
                    retried = true;
                }
                Err(Failure::Net(e)) => return Err(self.io(e)),
                Err(Failure::Local(e)) => return Err(Error::Local(e)),
                Err(Failure::Protocol(m)) => return Err(Error::Protocol(m)),
            }
        }
    }
}

/// Whether a pooled connection can carry another request: nothing unread in its buffer and
/// neither end-of-stream nor stray bytes waiting on the socket.
fn still_open(s: &Stream) -> bool {
    s.buffer().is_empty() && s.get_ref().idle_and_open()
}

fn send(stream: &mut Stream, head: &[u8], body: &mut Body<'_>) -> std::result::Result<(), Failure> {
    let sock = stream.get_mut();
    match body {
        Body::Empty => sock.write_all(head).map_err(Failure::Net),
        Body::Bytes(b) if b.len() <= 64 << 10 => {
            let mut all = Vec::with_capacity(head.len() + b.len());
            all.extend_from_slice(head);
            all.extend_from_slice(b);
            sock.write_all(&all).map_err(Failure::Net)
        }
        Body::Bytes(b) => {
            sock.write_all(head).map_err(Failure::Net)?;
            sock.write_all(b).map_err(Failure::Net)
        }
        Body::Reader(r, len) => {
            sock.write_all(head).map_err(Failure::Net)?;
            let mut buf = vec![0u8; 256 << 10];
            let mut left = *len;
            while left > 0 {
                let want = buf.len().min(left as usize);
                let n = match r.read(&mut buf[..want]) {
                    Ok(0) => {
                        return Err(Failure::Local(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!(
                                "the upload source ended after {} of {len} bytes",
                                *len - left
                            ),
                        )))
                    }
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(Failure::Local(e)),
                };
                sock.write_all(&buf[..n]).map_err(Failure::Net)?;
                left -= n as u64;
            }
            Ok(())
        }
    }
}

/// Reads one line (with its CRLF) of at most [`MAX_LINE`] bytes.
fn read_line(stream: &mut Stream, line: &mut String) -> io::Result<usize> {
    line.clear();
    let n = stream.by_ref().take(MAX_LINE).read_line(line)?;
    if n as u64 == MAX_LINE && !line.ends_with('\n') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "line too long in the answer",
        ));
    }
    Ok(n)
}

fn read_head(stream: &mut Stream) -> std::result::Result<Head, Failure> {
    let mut line = String::new();
    loop {
        let n = read_line(stream, &mut line).map_err(Failure::Net)?;
        if n == 0 {
            return Err(Failure::Net(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection closed before an answer",
            )));
        }
        let status: u16 = line
            .strip_prefix("HTTP/1.")
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Failure::Protocol(format!("status line `{}`", line.trim())))?;
        let mut headers = Vec::new();
        let mut total = 0;
        loop {
            let n = read_line(stream, &mut line).map_err(Failure::Net)?;
            total += n;
            if n == 0 || total > MAX_HEAD {
                return Err(Failure::Protocol(
                    "the answer's head is cut short or too long".into(),
                ));
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push(Header::new(k.trim().to_ascii_lowercase(), v.trim()));
            }
        }
        // Interim answers (100 Continue) come before the real one.
        if (100..200).contains(&status) && status != 101 {
            continue;
        }
        return Ok(Head { status, headers });
    }
}

fn framing(h: &Head, head_request: bool) -> Result<Framing> {
    use granary_proto::http1::{body_length, BodyLength};
    let length = body_length(
        h.status,
        head_request,
        h.header("transfer-encoding"),
        h.header("content-length"),
    )
    .map_err(Error::Protocol)?;
    Ok(match length {
        BodyLength::Length(n) => Framing::Length(n),
        BodyLength::Chunked => Framing::Chunked(Chunk::Size),
        BodyLength::UntilClose => Framing::UntilClose(false),
    })
}

/// How the body's end is found.
#[derive(Debug)]
enum Framing {
    /// This many bytes are left.
    Length(u64),
    Chunked(Chunk),
    /// Until the node closes; `true` once it has.
    UntilClose(bool),
}

/// Where a chunked body stands.
#[derive(Debug)]
enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk with this many bytes left.
    Data(u64),
    /// After a chunk's data, before its CRLF.
    Crlf,
    /// The last chunk and the trailers are read.
    Done,
}

/// An answer's body, read as it arrives; owns the connection it comes on.
pub(crate) struct BodyReader {
    stream: Option<Stream>,
    framing: Framing,
    keep_alive: bool,
}

fn cut_short() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the answer ended before its last byte (the node aborted it or the connection dropped)",
    )
}

impl BodyReader {
    /// Whether the body has been read to its end.
    pub(crate) fn is_done(&self) -> bool {
        matches!(
            self.framing,
            Framing::Length(0) | Framing::Chunked(Chunk::Done) | Framing::UntilClose(true)
        )
    }

    /// The connection, if the body was read to its end and it may carry another request.
    pub(crate) fn finish(mut self) -> Option<Stream> {
        if self.is_done() && self.keep_alive && !matches!(self.framing, Framing::UntilClose(_)) {
            self.stream.take()
        } else {
            None
        }
    }

    /// The descriptors that came with the answer so far (a node's `fd` answer to a
    /// local read over its Unix socket).
    pub(crate) fn take_fds(&mut self) -> Vec<OwnedFd> {
        self.stream
            .as_mut()
            .map_or_else(Vec::new, |s| s.get_mut().take_fds())
    }

    /// Reads what is left of the body, up to `limit` bytes (more is an error): of a known
    /// length, into one buffer of that size, straight from the socket ([`Self::fill_raw`]).
    pub(crate) fn read_all(&mut self, limit: usize) -> io::Result<Vec<u8>> {
        let too_large = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the answer is larger than {limit} bytes"),
            )
        };
        if let Some(left) = self.remaining() {
            let n = usize::try_from(left)
                .ok()
                .filter(|&n| n <= limit)
                .ok_or_else(too_large)?;
            let mut out = Vec::new();
            out.try_reserve_exact(n).map_err(io::Error::other)?;
            // SAFETY: `out` has room for `n` bytes, all written if the call succeeds.
            unsafe {
                self.fill_raw(out.as_mut_ptr(), n, true)?;
                out.set_len(n);
            }
            return Ok(out);
        }
        let mut out = Vec::new();
        self.by_ref().take(limit as u64 + 1).read_to_end(&mut out)?;
        if out.len() > limit {
            return Err(too_large());
        }
        Ok(out)
    }

    /// The bytes the body still holds, where the answer said (`Content-Length`).
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self.framing {
            Framing::Length(n) => Some(n),
            _ => None,
        }
    }

    /// Reads exactly `len` bytes of a body of known length into `dst`: what the
    /// connection's buffer already holds, then straight from the socket, waiting for all
    /// of the rest in as few calls as the network allows. The bytes are copied once, by
    /// the kernel, into their place. `fresh`: the memory was never touched (a new
    /// buffer), and a large one is backed by huge pages where the kernel has them and
    /// faulted in ahead of the receive by helper threads; memory the caller brings is in
    /// use already and needs none.
    ///
    /// # Safety
    ///
    /// `dst` must be valid for writes of `len` bytes (they need not be initialised).
    pub(crate) unsafe fn fill_raw(
        &mut self,
        dst: *mut u8,
        len: usize,
        fresh: bool,
    ) -> io::Result<()> {
        let left = match self.framing {
            Framing::Length(n) if len as u64 <= n => n,
            _ => {
                return Err(io::Error::other(
                    "fill_raw needs a body of known length, at least as long",
                ))
            }
        };
        if !fresh || len < PREFAULT_FROM {
            // SAFETY: the caller vouches for `dst..dst + len`.
            return unsafe { self.fill_into(dst, len, left) };
        }
        let stop = std::sync::atomic::AtomicBool::new(false);
        let addr = dst as usize;
        huge_pages(addr, len);
        std::thread::scope(|scope| {
            let n = prefault_helpers();
            for i in 0..n {
                let stop = &stop;
                scope.spawn(move || prefault(addr, len, i, n, stop));
            }
            // SAFETY: the caller vouches for `dst..dst + len`; the helpers only advise
            // on it, and end before the scope does.
            let result = unsafe { self.fill_into(dst, len, left) };
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            result
        })
    }

    /// [`Self::fill_raw`]'s receive, `left` the body's bytes before it.
    ///
    /// # Safety
    ///
    /// As for [`Self::fill_raw`].
    unsafe fn fill_into(&mut self, dst: *mut u8, len: usize, left: u64) -> io::Result<()> {
        let stream = self.stream()?;
        let buffered = stream.buffer();
        let mut got = buffered.len().min(len);
        // SAFETY: `got` bytes of the buffer into `dst`, which holds `len >= got`; the
        // buffer is ours, not the caller's, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(buffered.as_ptr(), dst, got) };
        stream.consume(got);
        let sock = stream.get_mut();
        let mut result = Ok(());
        while got < len {
            // SAFETY: `dst + got .. dst + len` is inside what the caller vouches for.
            match unsafe { sock.recv_all_raw(dst.add(got), len - got) } {
                Ok(0) => {
                    result = Err(cut_short());
                    break;
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.framing = Framing::Length(left - got as u64);
        result
    }

    /// Reads until `buf` is full or the body ends; the bytes read. For a body of known
    /// length this waits on the socket for all of them at once ([`Self::fill_raw`]).
    pub(crate) fn read_full(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(left) = self.remaining() {
            let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            // SAFETY: `buf[..n]` is a live, writable slice.
            unsafe { self.fill_raw(buf.as_mut_ptr(), n, false)? };
            return Ok(n);
        }
        let mut got = 0;
        while got < buf.len() {
            match self.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }

    fn stream(&mut self) -> io::Result<&mut Stream> {
        self.stream
            .as_mut()
            .ok_or_else(|| io::Error::other("the connection was handed back"))
    }

    fn read_chunked(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut line = String::new();
        loop {
            let Framing::Chunked(state) = &mut self.framing else {
                unreachable!("called for chunked bodies only")
            };
            match *state {
                Chunk::Done => return Ok(0),
                Chunk::Size => {
                    let stream = self.stream.as_mut().ok_or_else(cut_short)?;
                    if read_line(stream, &mut line)? == 0 {
                        return Err(cut_short());
                    }
                    let size = granary_proto::http1::chunk_size(&line).ok_or_else(|| {
                        io::Error::new(io::ErrorKind::InvalidData, "bad chunk size")
                    })?;
                    if size == 0 {
                        // Trailers, then the blank line.
                        loop {
                            if read_line(stream, &mut line)? == 0 {
                                return Err(cut_short());
                            }
                            if line.trim().is_empty() {
                                break;
                            }
                        }
                        *state = Chunk::Done;
                    } else {
                        *state = Chunk::Data(size);
                    }
                }
                Chunk::Data(left) => {
                    if buf.is_empty() {
                        return Ok(0);
                    }
                    let want = buf.len().min(left.min(usize::MAX as u64) as usize);
                    let stream = self.stream.as_mut().ok_or_else(cut_short)?;
                    let n = stream.read(&mut buf[..want])?;
                    if n == 0 {
                        return Err(cut_short());
                    }
                    let left = left - n as u64;
                    *state = if left == 0 {
                        Chunk::Crlf
                    } else {
                        Chunk::Data(left)
                    };
                    return Ok(n);
                }
                Chunk::Crlf => {
                    let stream = self.stream.as_mut().ok_or_else(cut_short)?;
                    if read_line(stream, &mut line)? == 0 {
                        return Err(cut_short());
                    }
                    if !line.trim().is_empty() {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "no CRLF after a chunk",
                        ));
                    }
                    *state = Chunk::Size;
                }
            }
        }
    }
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.framing {
            Framing::Length(0) | Framing::UntilClose(true) => Ok(0),
            Framing::Length(left) => {
                if buf.is_empty() {
                    return Ok(0);
                }
                let want = buf.len().min(left.min(usize::MAX as u64) as usize);
                let n = self.stream()?.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(cut_short());
                }
                self.framing = Framing::Length(left - n as u64);
                Ok(n)
            }
            Framing::UntilClose(false) => {
                let n = self.stream()?.read(buf)?;
                if n == 0 && !buf.is_empty() {
                    self.framing = Framing::UntilClose(true);
                }
                Ok(n)
            }
            Framing::Chunked(_) => self.read_chunked(buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Local;

    #[test]
    fn the_environment_and_unix_addresses_turn_socket_offers_off() {
        assert_eq!(Local::given("127.0.0.1:7070", None), Local::Unknown);
        assert_eq!(Local::given("127.0.0.1:7070", Some("on")), Local::Unknown);
        for off in ["off", "0", "false", "no"] {
            assert_eq!(
                Local::given("127.0.0.1:7070", Some(off)),
                Local::Never,
                "{off}"
            );
        }
        assert_eq!(Local::given("unix:/run/g.sock", None), Local::Never);
    }
}
