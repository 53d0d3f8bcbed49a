//! The client's socket: TCP, or a Unix domain socket to a node on the same machine. On a
//! Unix socket every read is a `recvmsg` that keeps the file descriptors a node sends
//! along with an answer (`SCM_RIGHTS`), for [`Sock::take_fds`].

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Most descriptors kept from one read (a node sends one per answer).
const MAX_FDS: usize = 8;

/// A connected socket.
pub(crate) enum Sock {
    Tcp(TcpStream),
    Unix {
        stream: UnixStream,
        /// Descriptors received and not yet taken.
        fds: Vec<OwnedFd>,
    },
}

impl Sock {
    /// Connects to `addr`: `unix:PATH`, or `host:port`.
    pub(crate) fn connect(addr: &str) -> io::Result<Sock> {
        match addr.strip_prefix("unix:") {
            Some(path) => Ok(Sock::Unix {
                stream: UnixStream::connect(path)?,
                fds: Vec::new(),
            }),
            None => {
                let s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                Ok(Sock::Tcp(s))
            }
        }
    }

    /// Connects to the Unix socket at `path`, on which process `pid` must be the one
    /// answering (`SO_PEERCRED`): a node on this machine that offered its socket.
    pub(crate) fn connect_local(path: &str, pid: i32) -> io::Result<Sock> {
        let stream = UnixStream::connect(path)?;
        // SAFETY: a plain C struct, all zeroes until the kernel fills it in.
        let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: `cred` and `len` describe a buffer the size of a `ucred`.
        let r = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        if cred.pid != pid {
            return Err(io::Error::other(format!(
                "process {} answers on {path}, not the node's {pid}",
                cred.pid
            )));
        }
        Ok(Sock::Unix {
            stream,
            fds: Vec::new(),
        })
    }

    /// Whether this is a TCP connection to an address of this machine (loopback).
    pub(crate) fn to_loopback(&self) -> bool {
        matches!(self, Sock::Tcp(s) if s.peer_addr().is_ok_and(|a| a.ip().is_loopback()))
    }

    pub(crate) fn set_timeouts(&self, timeout: Duration) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => {
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))
            }
            Sock::Unix { stream, .. } => {
                stream.set_read_timeout(Some(timeout))?;
                stream.set_write_timeout(Some(timeout))
            }
        }
    }

    fn raw(&self) -> RawFd {
        match self {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Unix { stream, .. } => stream.as_raw_fd(),
        }
    }

    /// Whether the peer has neither closed nor sent anything unasked: a pooled
    /// connection that can carry another request.
    pub(crate) fn idle_and_open(&self) -> bool {
        let mut b = [0u8; 1];
        // SAFETY: recv writes at most one byte into `b`.
        let n = unsafe {
            libc::recv(
                self.raw(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
    }

    /// The descriptors received so far, oldest first.
    pub(crate) fn take_fds(&mut self) -> Vec<OwnedFd> {
        match self {
            Sock::Tcp(_) => Vec::new(),
            Sock::Unix { fds, .. } => std::mem::take(fds),
        }
    }
}

impl Sock {
    /// Receives up to `len` bytes into `dst`, waiting for all of them (`MSG_WAITALL`: one
    /// call and one wake-up where `read` takes one per burst the network delivers); fewer
    /// only when the peer closes, the read timeout passes, a signal comes, or (on a Unix
    /// socket) descriptors arrive.
    ///
    /// # Safety
    ///
    /// `dst` must be valid for writes of `len` bytes (they need not be initialised).
    pub(crate) unsafe fn recv_all_raw(&mut self, dst: *mut u8, len: usize) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => {
                // SAFETY: the caller vouches for `dst..dst + len`.
                let n = unsafe { libc::recv(s.as_raw_fd(), dst.cast(), len, libc::MSG_WAITALL) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            }
            Sock::Unix { stream, fds } => {
                // SAFETY: as above.
                unsafe { recv_with_fds(stream.as_raw_fd(), dst, len, libc::MSG_WAITALL, fds) }
            }
        }
    }
}

/// `recvmsg` of up to `len` bytes into `dst`, keeping any descriptors that arrive in `fds`.
///
/// # Safety
///
/// `dst` must be valid for writes of `len` bytes.
unsafe fn recv_with_fds(
    sock: RawFd,
    dst: *mut u8,
    len: usize,
    flags: libc::c_int,
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) };
    let mut control = vec![0u64; (space as usize).div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: dst.cast(),
        iov_len: len,
    };
    // SAFETY: every pointer in `msg` outlives the call (the caller vouches for `dst`); the
    // kernel writes at most `msg_controllen` bytes of control data, and the descriptors
    // are read out of the SCM_RIGHTS messages it wrote, each taken once
    // (MSG_CMSG_CLOEXEC: not inherited).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC | flags);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        Ok(n as usize)
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(buf),
            // SAFETY: `buf` is a live, writable slice.
            Sock::Unix { stream, fds } => unsafe {
                recv_with_fds(stream.as_raw_fd(), buf.as_mut_ptr(), buf.len(), 0, fds)
            },
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(buf),
            Sock::Unix { stream, .. } => stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.flush(),
            Sock::Unix { stream, .. } => stream.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_reads_keep_passed_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let fd = file.as_raw_fd();
        let data = b"HTTP/1.1 200 OK\r\n";
        let iov = libc::iovec {
            iov_base: data.as_ptr() as *mut _,
            iov_len: data.len(),
        };
        // SAFETY: as in recv_with_fds, for one descriptor.
        unsafe {
            let space = libc::CMSG_SPACE(4) as usize;
            let mut control = vec![0u64; space.div_ceil(8)];
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &iov as *const _ as *mut _;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as _;
            libc::CMSG_DATA(c).cast::<RawFd>().write_unaligned(fd);
            assert_eq!(libc::sendmsg(a.as_raw_fd(), &msg, 0), data.len() as isize);
        }
        let mut sock = Sock::Unix {
            stream: b,
            fds: Vec::new(),
        };
        assert!(!sock.idle_and_open(), "bytes are waiting");
        let mut buf = [0u8; 64];
        let n = sock.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], data);
        let fds = sock.take_fds();
        assert_eq!(fds.len(), 1);
        assert!(sock.take_fds().is_empty());
        let ours = std::fs::metadata("/proc/self/exe").unwrap();
        let theirs = std::fs::File::from(fds.into_iter().next().unwrap())
            .metadata()
            .unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((theirs.dev(), theirs.ino()), (ours.dev(), ours.ino()));
        assert!(sock.idle_and_open());
        drop(a);
        assert!(!sock.idle_and_open(), "the peer closed");
    }
}
