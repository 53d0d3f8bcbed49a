//! The io_uring read engine: one submission ring driven by a dedicated thread. Requests
//! arrive over a channel; each becomes a `Read` SQE into a buffer the thread owns until
//! its completion, then the bytes go back over a oneshot. Short reads are resubmitted for
//! the remainder; a read at end of file fails the request.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use io_uring::{opcode, types, IoUring};
use tokio::sync::oneshot;

use super::ReadEngine;

const RING_ENTRIES: u32 = 256;

struct Request {
    file: Arc<File>,
    offset: u64,
    len: usize,
    reply: oneshot::Sender<io::Result<Bytes>>,
}

/// A request in flight: the buffer stays here, untouched, until its completion.
struct InFlight {
    req: Request,
    buf: BytesMut,
    done: usize,
}

pub struct UringEngine {
    tx: mpsc::Sender<Request>,
}

impl UringEngine {
    pub fn start() -> io::Result<UringEngine> {
        let ring = IoUring::new(RING_ENTRIES)?;
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("granary-uring".into())
            .spawn(move || drive(ring, rx))?;
        Ok(UringEngine { tx })
    }
}

impl ReadEngine for UringEngine {
    fn name(&self) -> &'static str {
        "io-uring"
    }

    fn read_at(
        &self,
        file: Arc<File>,
        offset: u64,
        len: usize,
    ) -> BoxFuture<'static, io::Result<Bytes>> {
        let (reply, rx) = oneshot::channel();
        let sent = self.tx.send(Request {
            file,
            offset,
            len,
            reply,
        });
        Box::pin(async move {
            sent.map_err(|_| io::Error::other("the io_uring thread stopped"))?;
            rx.await
                .map_err(|_| io::Error::other("the io_uring thread dropped a read"))?
        })
    }
}

fn push(ring: &mut IoUring, id: u64, f: &mut InFlight) -> io::Result<()> {
    let remaining = f.req.len - f.done;
    let sqe = opcode::Read::new(
        types::Fd(f.req.file.as_raw_fd()),
        // SAFETY: the pointer is into the heap allocation of `f.buf` (its spare capacity,
        // `len` bytes reserved), which stays in the in-flight map (moving the `BytesMut`
        // handle does not move its allocation) and is neither touched nor freed until this
        // read's completion is reaped; it has `remaining` bytes of room after `done`.
        unsafe {
            f.buf
                .spare_capacity_mut()
                .as_mut_ptr()
                .cast::<u8>()
                .add(f.done)
        },
        remaining as u32,
    )
    .offset(f.req.offset + f.done as u64)
    .build()
    .user_data(id);
    // SAFETY: the SQE refers to a buffer and a file descriptor (held by `f.req.file`)
    // that both outlive the operation, as above.
    while unsafe { ring.submission().push(&sqe) }.is_err() {
        ring.submit()?;
    }
    Ok(())
}

fn drive(mut ring: IoUring, rx: mpsc::Receiver<Request>) {
    let mut inflight: HashMap<u64, InFlight> = HashMap::new();
    let mut next_id: u64 = 0;
    loop {
        // Take new requests: wait for one when idle, else only what is queued.
        let mut new = Vec::new();
        if inflight.is_empty() {
            match rx.recv() {
                Ok(r) => new.push(r),
                Err(_) => return,
            }
        }
        while let Ok(r) = rx.try_recv() {
            new.push(r);
        }
        for req in new {
            let id = next_id;
            next_id += 1;
            let mut f = InFlight {
                // Not zeroed: the kernel writes every byte before the length is set.
                buf: BytesMut::with_capacity(req.len),
                req,
                done: 0,
            };
            if f.req.len == 0 {
                let _ = f.req.reply.send(Ok(Bytes::new()));
                continue;
            }
            if let Err(e) = push(&mut ring, id, &mut f) {
                let _ = f.req.reply.send(Err(e));
                continue;
            }
            inflight.insert(id, f);
        }
        if inflight.is_empty() {
            continue;
        }
        if let Err(e) = ring.submit_and_wait(1) {
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            for (_, f) in inflight.drain() {
                let _ = f
                    .req
                    .reply
                    .send(Err(io::Error::new(e.kind(), e.to_string())));
            }
            continue;
        }
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (id, res) in done {
            let Some(mut f) = inflight.remove(&id) else {
                continue;
            };
            if res < 0 {
                let _ = f.req.reply.send(Err(io::Error::from_raw_os_error(-res)));
            } else if res == 0 {
                let _ = f.req.reply.send(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "read past the end of a cache file",
                )));
            } else {
                f.done += res as usize;
                if f.done == f.req.len {
                    // SAFETY: the completed reads wrote all `len` bytes of the capacity
                    // reserved at creation, in order and without gaps.
                    unsafe { f.buf.set_len(f.req.len) };
                    let _ = f.req.reply.send(Ok(f.buf.freeze()));
                } else if let Err(e) = push(&mut ring, id, &mut f) {
                    let _ = f.req.reply.send(Err(e));
                } else {
                    inflight.insert(id, f);
                }
            }
        }
    }
}
