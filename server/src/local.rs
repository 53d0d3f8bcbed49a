//! Delivery to processes on this node: the HTTP API over a Unix domain socket
//! (`--listen-unix`), and on it, zero-copy reads that hand the client a read-only file
//! descriptor of the cached object instead of its bytes.
//!
//! A client asks with `x-granary-local: fd` on an ordinary GET (routing, auth,
//! anonymous-read and conditions as for any GET). When this node holds the object, the
//! answer has no body: its headers say where the bytes lie in the file
//! (`x-granary-local-offset`, `x-granary-local-length`), and the descriptor travels as
//! `SCM_RIGHTS` ancillary data with the answer's first bytes. The client maps it. Where no
//! descriptor can be given (another node owns the key, the cache cannot admit the
//! object, a TCP connection), the answer is the usual one with the bytes as its body.
//!
//! Clients on this machine that were given the node's TCP address learn of the socket
//! from [`advertise`]'s header and go on over it: HTTP over a Unix socket costs both ends
//! about a quarter less CPU per byte than over loopback TCP (no TCP stack, no ACKs).
//!
//! [`FdListener`] accepts Unix connections as [`FdStream`]s. Each connection's
//! [`FdSender`] is handed to its requests as connect info; a handler queues a descriptor
//! on it, and the stream attaches every queued descriptor to its next write, which is the
//! head of the answer being sent (HTTP/1 answers a connection's requests one at a time).

use granary_core::sendfile;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{UnixListener, UnixStream};

/// Descriptors waiting for the next write of one connection.
#[derive(Clone, Default)]
pub struct FdSender(Arc<Mutex<Vec<OwnedFd>>>);

impl FdSender {
    /// Queues `fd` to leave with the next bytes written on the connection (the answer's
    /// head). It is closed here once sent, or with the connection.
    pub fn send(&self, fd: OwnedFd) {
        self.lock().push(fd);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<OwnedFd>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type Incoming<'a> = axum::serve::IncomingStream<'a, crate::limits::Timed<FdListener>>;

impl axum::extract::connect_info::Connected<Incoming<'_>> for FdSender {
    fn connect_info(stream: Incoming<'_>) -> Self {
        stream.io().inner().sender.clone()
    }
}

/// A Unix listener whose connections can carry descriptors.
pub struct FdListener(UnixListener);

impl FdListener {
    /// Listens on `path`, replacing a socket file a previous run left there.
    pub fn bind(path: &Path) -> io::Result<FdListener> {
        if let Ok(md) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if md.file_type().is_socket() {
                std::fs::remove_file(path)?;
            }
        }
        UnixListener::bind(path).map(FdListener)
    }
}

impl axum::serve::Listener for FdListener {
    type Io = FdStream;
    type Addr = tokio::net::unix::SocketAddr;

    async fn accept(&mut self) -> (FdStream, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((inner, addr)) => {
                    let stream = FdStream {
                        inner,
                        sender: FdSender::default(),
                    };
                    return (stream, addr);
                }
                // Out of descriptors, or a connection reset before it was accepted.
                Err(e) => {
                    tracing::warn!(error = %e, "unix socket accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// One Unix connection: reads as usual; a write sends the queued descriptors with it.
pub struct FdStream {
    inner: UnixStream,
    sender: FdSender,
}

impl FdStream {
    /// Writes `bufs` with `fds` attached, when the socket takes them.
    fn poll_send_fds(
        &self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
        fds: &[RawFd],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.inner.poll_write_ready(cx))?;
            let sock = self.inner.as_raw_fd();
            match self
                .inner
                .try_io(Interest::WRITABLE, || send_with_fds(sock, bufs, fds))
            {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return Poll::Ready(other),
            }
        }
    }

    fn poll_write_all_bufs(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let queued = {
            let q = self.sender.lock();
            if q.is_empty() {
                None
            } else {
                Some(q.iter().map(|f| f.as_raw_fd()).collect::<Vec<_>>())
            }
        };
        let Some(fds) = queued else {
            return Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        };
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        let n = ready!(self.poll_send_fds(cx, bufs, &fds))?;
        // Sent (the receiver holds its own copies): close ours.
        self.sender.lock().clear();
        Poll::Ready(Ok(n))
    }
}

/// `sendmsg` of `bufs` with `fds` as `SCM_RIGHTS`.
fn send_with_fds(sock: RawFd, bufs: &[IoSlice<'_>], fds: &[RawFd]) -> io::Result<usize> {
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    // u64 words keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data; every pointer set below outlives the call, and the
    // control buffer holds exactly one header of CMSG_LEN(fd_bytes) within `space`.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len() as _;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(cmsg), fd_bytes);
        let n = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

impl AsyncRead for FdStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for FdStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_all_bufs(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_all_bufs(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl sendfile::FileSink for FdStream {
    /// Sends a file range with `sendfile(2)`, unless descriptors wait for this write.
    fn poll_send_file(
        &mut self,
        cx: &mut Context<'_>,
        fd: RawFd,
        offset: u64,
        len: usize,
    ) -> Option<Poll<io::Result<usize>>> {
        if !self.sender.lock().is_empty() {
            return None;
        }
        let inner = &self.inner;
        Some(sendfile::poll_sendfile_on(
            cx,
            inner,
            |cx| inner.poll_write_ready(cx),
            |f| inner.try_io(Interest::WRITABLE, f),
            fd,
            offset,
            len,
        ))
    }
}

/// Adds `x-granary-socket: PID PATH` to every answer over TCP to a client at a loopback
/// address (on this machine), so that it may go on over the node's Unix socket at
/// `path`. Answers to other clients are left alone: the socket is of no use to them.
pub fn advertise(app: axum::Router, path: &Path) -> io::Result<axum::Router> {
    use axum::extract::{ConnectInfo, Request};
    use axum::http::HeaderValue;
    use axum::middleware::Next;

    let path = std::path::absolute(path)?;
    let value = HeaderValue::from_str(&format!("{} {}", std::process::id(), path.display()))
        .map_err(|_| io::Error::other("the socket's path cannot go in a header"))?;
    Ok(app.layer(axum::middleware::from_fn(
        move |ConnectInfo(TcpPeer(peer)): ConnectInfo<TcpPeer>, req: Request, next: Next| {
            let value = value.clone();
            async move {
                let mut resp = next.run(req).await;
                if peer.ip().is_loopback() {
                    resp.headers_mut()
                        .insert(granary_proto::headers::SOCKET, value);
                }
                resp
            }
        },
    )))
}

/// A TCP connection's client address, as connect info.
#[derive(Debug, Clone, Copy)]
pub struct TcpPeer(pub std::net::SocketAddr);

impl<L>
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, crate::limits::Timed<L>>>
    for TcpPeer
where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
    L::Io: sendfile::FileSink,
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, crate::limits::Timed<L>>) -> TcpPeer {
        TcpPeer(*stream.remote_addr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    use tokio::io::AsyncWriteExt;

    /// `recvmsg` of up to `buf.len()` bytes and the descriptors that came with them.
    fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> (usize, Vec<OwnedFd>) {
        let mut control = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut fds = Vec::new();
        // SAFETY: the buffers outlive the call; descriptors are taken out of the
        // control messages the kernel filled.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control) as _;
            let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            assert!(n >= 0, "{}", io::Error::last_os_error());
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<RawFd>();
                    let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                    for i in 0..count {
                        fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
            (n as usize, fds)
        }
    }

    #[tokio::test]
    async fn a_queued_descriptor_leaves_with_the_next_write() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let mut stream = FdStream {
            inner: UnixStream::from_std(a).unwrap(),
            sender: FdSender::default(),
        };
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"entry bytes").unwrap();
        stream.write_all(b"first").await.unwrap();
        stream.sender.send(OwnedFd::from(file.try_clone().unwrap()));
        stream.write_all(b"second").await.unwrap();
        stream.write_all(b"third").await.unwrap();
        drop(stream);

        // Reads may join the writes; the descriptor comes with the read holding the
        // first byte of the write it was queued for (offset 5).
        let mut data = Vec::new();
        let mut fds = Vec::new();
        loop {
            let mut buf = [0u8; 64];
            let (n, got) = recv_with_fds(b.as_raw_fd(), &mut buf);
            if n == 0 {
                break;
            }
            if !got.is_empty() {
                assert!(
                    data.len() <= 5 && data.len() + n > 5,
                    "fd came with bytes {}..{}",
                    data.len(),
                    data.len() + n
                );
            }
            fds.extend(got);
            data.extend_from_slice(&buf[..n]);
        }
        assert_eq!(data, b"firstsecondthird");
        assert_eq!(fds.len(), 1);
        let mut got = String::new();
        let mut f = std::fs::File::from(fds.into_iter().next().unwrap());
        std::io::Seek::rewind(&mut f).unwrap();
        f.read_to_string(&mut got).unwrap();
        assert_eq!(got, "entry bytes");
    }
}
