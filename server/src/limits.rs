//! Load limits: how many requests a node serves at once (`--max-requests`; beyond it S3's
//! `503 SlowDown`, which S3 clients back off and retry), and how long a connection may
//! make no progress (`--idle-timeout`: no byte read or written, whether the client is
//! idle between requests, sends its headers a byte a minute, or stops reading an answer).
//! Backend fetches are capped in `backend::limit`. At start the node raises its
//! open-file limit to the hard limit ([`raise_open_files`]): every connection, cache
//! file and backend stream is a descriptor.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Raises the soft limit on open files to the hard limit: the soft limit a shell hands
/// down (often 1,024, or 512) is reached by idle client connections alone, and then
/// health checks and reads fail to accept. Returns `(before, after)`.
pub fn raise_open_files() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the kernel to fill and read.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((before, lim.rlim_cur))
}

/// Every place of the request limit is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtLimit;

/// Requests in progress, counted from the head's arrival to the last byte of the answer.
pub struct RequestLimit {
    permits: Option<Arc<Semaphore>>,
}

impl RequestLimit {
    /// At most `max` at once; `0` means no limit.
    pub fn new(max: usize) -> RequestLimit {
        RequestLimit {
            permits: (max > 0).then(|| Arc::new(Semaphore::new(max))),
        }
    }

    /// A place for one more request, or `Err(AtLimit)` when the node is at its limit.
    /// Without a limit the permit is `None`.
    pub fn admit(&self) -> Result<Option<OwnedSemaphorePermit>, AtLimit> {
        match &self.permits {
            None => Ok(None),
            Some(s) => s.clone().try_acquire_owned().map(Some).map_err(|_| AtLimit),
        }
    }
}

/// A listener whose connections end after `idle` without progress.
pub struct Timed<L> {
    inner: L,
    idle: Duration,
}

impl<L> Timed<L> {
    pub fn new(inner: L, idle: Duration) -> Timed<L> {
        Timed { inner, idle }
    }
}

impl<L> axum::serve::Listener for Timed<L>
where
    L: axum::serve::Listener,
    L::Io: sendfile::FileSink,
{
    type Io = IdleIo<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = self.inner.accept().await;
        (IdleIo::new(io, self.idle), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection that fails with `TimedOut` once neither a read nor a write has moved a
/// byte for `idle` while one of them waits. Progress only records the time (no timer
/// work per read or write); the timer is moved to the last progress when it fires.
pub struct IdleIo<T> {
    inner: T,
    /// Whether this connection sends cache hits with `sendfile` (decided as it is
    /// accepted: `--sendfile` and where the reader is).
    files: bool,
    idle: Duration,
    last: Instant,
    deadline: Pin<Box<Sleep>>,
}

impl<T: sendfile::FileSink> IdleIo<T> {
    fn new(inner: T, idle: Duration) -> IdleIo<T> {
        IdleIo {
            files: sendfile::wanted(&inner),
            inner,
            idle,
            last: Instant::now(),
            deadline: Box::pin(tokio::time::sleep(idle)),
        }
    }
}

impl<T> IdleIo<T> {
    /// The connection under the timer.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// Notes progress when `moved` is true, and passes a ready result on; while
    /// pending, an error once `idle` has passed since the last progress.
    fn judge<R>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<R>>,
        moved: impl Fn(&R) -> bool,
    ) -> Poll<io::Result<R>> {
        match r {
            Poll::Ready(r) => {
                if r.as_ref().is_ok_and(&moved) {
                    self.last = Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending => loop {
                if self.deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let due = self.last + self.idle;
                if due <= Instant::now() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no progress on the connection for {:?}", self.idle),
                    )));
                }
                // Progress since the timer was set: wait out the rest from there.
                self.deadline.as_mut().reset(due);
            },
        }
    }
}

use std::future::Future;

use granary_core::sendfile;

impl<T: AsyncRead + Unpin> AsyncRead for IdleIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        let moved = buf.filled().len() > before;
        this.judge(cx, r, |_| moved)
    }
}

/// Writes go through [`sendfile`]: slices of a cache entry's mapping leave from the file
/// where the connection can send files.
impl<T: sendfile::FileSink> AsyncWrite for IdleIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = if this.files {
            sendfile::poll_write(&mut this.inner, cx, buf)
        } else {
            Pin::new(&mut this.inner).poll_write(cx, buf)
        };
        this.judge(cx, r, |n| *n > 0)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = if this.files {
            sendfile::poll_write_vectored(&mut this.inner, cx, bufs)
        } else {
            Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
        };
        this.judge(cx, r, |n| *n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.judge(cx, r, |_| false)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_connection_without_progress_times_out() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut io = IdleIo::new(a, Duration::from_millis(300));
        b.write_all(b"hi").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 2);
        // Nothing more comes: the read fails once 300 ms pass without a byte.
        let started = Instant::now();
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(290));
    }

    #[tokio::test]
    async fn a_reader_that_stops_reading_times_the_writer_out() {
        let (a, _b) = tokio::io::duplex(16);
        let mut io = IdleIo::new(a, Duration::from_millis(300));
        let err = io.write_all(&[7u8; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn the_request_limit_admits_up_to_its_size() {
        let limit = RequestLimit::new(2);
        let a = limit.admit().unwrap();
        let b = limit.admit().unwrap();
        assert!(limit.admit().is_err());
        drop(a);
        assert!(limit.admit().is_ok());
        drop(b);
        assert!(RequestLimit::new(0).admit().unwrap().is_none());
    }
}
