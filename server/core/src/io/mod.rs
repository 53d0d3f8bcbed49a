//! The cache read engine: how bytes of a cache entry are read from disk. A small trait
//! with two implementations, picked at start-up: `std` (positional reads on tokio's
//! blocking pool) and `io-uring` (one ring on a dedicated thread). `auto` tries io_uring
//! and falls back to `std`, with a log line, where the kernel refuses it.

pub use granary_proto::crc;
pub mod direct;
pub mod mapped;
pub mod sendfile;
mod uring;

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;

/// Reads byte ranges of open files.
pub trait ReadEngine: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// Reads exactly `len` bytes at `offset` (an error if the file is shorter). The read
    /// starts when this is called, not when the future is first polled, so callers can
    /// read ahead; it must be called within the Tokio runtime.
    fn read_at(
        &self,
        file: Arc<File>,
        offset: u64,
        len: usize,
    ) -> BoxFuture<'static, io::Result<Bytes>>;
}

/// `pread` on the blocking pool.
pub struct StdEngine;

impl ReadEngine for StdEngine {
    fn name(&self) -> &'static str {
        "std"
    }

    fn read_at(
        &self,
        file: Arc<File>,
        offset: u64,
        len: usize,
    ) -> BoxFuture<'static, io::Result<Bytes>> {
        // Started now, not when first polled, so a caller can read ahead.
        let read = tokio::task::spawn_blocking(move || {
            let buf = read_up_to(&file, offset, len)?;
            if buf.len() < len {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "failed to fill whole buffer",
                ));
            }
            Ok(buf)
        });
        Box::pin(async move { read.await.map_err(io::Error::other)? })
    }
}

/// The byte count a read or write call returned, called again while a signal interrupts
/// it; a negative return is the call's error.
pub fn retrying(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Up to `want` bytes of `file` from `offset`, fewer only at its end. Read straight into
/// a fresh buffer's spare capacity: nothing is zeroed first.
pub fn read_up_to(file: &File, offset: u64, want: usize) -> io::Result<Bytes> {
    let mut buf = BytesMut::with_capacity(want);
    let mut filled = 0usize;
    while filled < want {
        // SAFETY: the kernel writes at most `want - filled` bytes into the buffer's
        // capacity after the `filled` bytes it already wrote.
        let n = retrying(|| unsafe {
            libc::pread(
                file.as_raw_fd(),
                buf.as_mut_ptr().add(filled).cast(),
                want - filled,
                (offset + filled as u64) as libc::off_t,
            )
        })?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    // SAFETY: the first `filled` bytes were written by pread above.
    unsafe { buf.set_len(filled) };
    Ok(buf.freeze())
}

/// Which engine to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineChoice {
    /// io_uring where the kernel allows it, else std.
    Auto,
    /// io_uring, or fail to start.
    IoUring,
    /// Positional reads on the blocking pool.
    Std,
}

impl EngineChoice {
    /// Every choice, as flags and the TOML file name them.
    pub const NAMES: [&'static str; 3] = ["auto", "io-uring", "std"];
}

impl std::str::FromStr for EngineChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<EngineChoice, String> {
        match s {
            "auto" => Ok(EngineChoice::Auto),
            "io-uring" => Ok(EngineChoice::IoUring),
            "std" => Ok(EngineChoice::Std),
            _ => Err(format!("`{s}`: expected auto, io-uring or std")),
        }
    }
}

/// Builds the chosen engine.
pub fn engine(choice: EngineChoice) -> io::Result<Arc<dyn ReadEngine>> {
    match choice {
        EngineChoice::Std => Ok(Arc::new(StdEngine)),
        EngineChoice::IoUring => Ok(Arc::new(uring::UringEngine::start()?)),
        EngineChoice::Auto => match uring::UringEngine::start() {
            Ok(e) => Ok(Arc::new(e)),
            Err(e) => {
                tracing::warn!(error = %e, "io_uring refused; cache reads use the std engine");
                Ok(Arc::new(StdEngine))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    async fn check(engine: Arc<dyn ReadEngine>) {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let f = Arc::new(f);
        let mut reads = Vec::new();
        for (off, len) in [(0u64, 10usize), (1_048_576, 1_048_576), (2_999_990, 10)] {
            reads.push((off, len, engine.read_at(f.clone(), off, len)));
        }
        for (off, len, r) in reads {
            let got = r.await.unwrap();
            assert_eq!(
                &got[..],
                &data[off as usize..off as usize + len],
                "{}",
                engine.name()
            );
        }
        assert!(
            engine.read_at(f.clone(), 2_999_990, 20).await.is_err(),
            "past the end"
        );
    }

    #[tokio::test]
    async fn engines_read_the_same_bytes() {
        check(engine(EngineChoice::Std).unwrap()).await;
        match uring::UringEngine::start() {
            Ok(e) => check(Arc::new(e)).await,
            Err(e) => eprintln!("io_uring unavailable here ({e}); only std was checked"),
        }
    }
}
