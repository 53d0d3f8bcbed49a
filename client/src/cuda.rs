//! Delivery into GPU memory (feature `cuda`): an object, a byte stream or a batch read
//! straight into device memory, the network receive overlapped with the copies to the
//! device.
//!
//! # Double buffering
//!
//! A [`DeviceReader`] owns a CUDA stream on one device and two page-locked (pinned) host
//! buffers of `chunk` bytes (4 MiB by default), A and B, each with an event. Bytes flow
//! like this:
//!
//! ```text
//! network → host:   [fill A: 0..4M] [fill B: 4..8M] [fill A: 8..12M] [fill B: …]
//! host → device:                    [copy A: 0..4M] [copy B: 4..8M]  [copy A: …]
//!                                                   ^ wait for A's copy, then refill A
//! ```
//!
//! 1. Fill A from the socket until it holds `chunk` bytes (or the body ends).
//! 2. Enqueue an asynchronous host-to-device copy of A to its offset in the device buffer
//!    and record A's event after it. The call returns at once; the copy engine moves A
//!    while the CPU goes on.
//! 3. Fill B from the socket meanwhile, enqueue its copy, record B's event.
//! 4. Before A is written again, wait on A's event (its copy is usually long done: a PCIe
//!    copy of 4 MiB takes a fraction of the time the network needs to deliver the next
//!    4 MiB), and so on, alternating.
//!
//! The copies must come from pinned memory to run asynchronously (a copy from ordinary
//! pageable memory is staged by the driver and blocks), and two buffers are what it takes
//! to keep the network and the copy engine busy at the same time. Every call returns only
//! once the last copy has finished, so the [`DeviceBuf`] it hands out is ready for any
//! stream; kernels queued on [`DeviceReader::stream`] are ordered after the copies anyway.
//!
//! # Large objects
//!
//! A large object the node holds comes in parts over several connections, as
//! [`Client::get`] reads it (`split.rs`): this reader receives the first part, and helper
//! readers (one per connection, each with its own stream and two staging buffers, kept
//! between reads) each receive the next part into device memory of their own, which this
//! reader copies into place on its stream, device to device, and frees.
//!
//! # Batches
//!
//! [`DeviceReader::read_batch`] reads the tar stream of `POST /_granary/batch` and parses
//! its headers as they arrive (GNU long names and pax paths resolved, like
//! [`TarReader`](crate::TarReader)), sending the members' bytes to the device back to back
//! through the same two buffers; [`DeviceBatch::members`] says where each one landed. The
//! batch's total size is not known up front, so the device buffer starts at the size of
//! the previous batch read by the same reader (at least two chunks) and grows by doubling:
//! a larger buffer is allocated and what was already copied moves over with one
//! device-to-device copy, queued on the same stream after the pending host copies. The
//! moves cost a few device-memory bandwidth passes, far below the network's time, and the
//! size hint means a training loop of like-sized batches stops growing after the first.
//!
//! # Without a GPU
//!
//! The driver (`libcuda`) is loaded at run time. [`available`] says whether it loads and
//! reports a device, without panicking where it does not; [`DeviceReader::new`] fails with
//! [`GpuError::NoDevice`] there.

use std::io::{self, Read};
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError,
    PinnedHostSlice,
};

use crate::http::BodyReader;
use crate::objects::get_request;
use crate::split::{First, FirstPart, Parts};
use crate::{BatchItem, Client, Error, GetOptions, Missing, TarReader};

/// The cudarc version this module is built with, for handing [`DeviceBuf`]s to kernels.
pub use cudarc;

/// Default size of each of the two pinned staging buffers.
pub const DEFAULT_CHUNK: usize = 4 << 20;

/// Why delivery to the device failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No CUDA driver could be loaded, or it has no device with this ordinal.
    #[error("no CUDA device {ordinal}: {count} found (no NVIDIA driver, or no GPU visible to it)")]
    NoDevice { ordinal: usize, count: usize },
    /// A CUDA driver call failed.
    #[error("CUDA driver failed {what}: {source}")]
    Driver {
        what: &'static str,
        source: DriverError,
    },
    /// The request to the node failed, or its answer is not what was asked for.
    #[error(transparent)]
    Client(#[from] Error),
    /// Reading the body as it arrived failed.
    #[error("reading the body failed: {0}")]
    Io(#[from] io::Error),
    /// The body ended before the size it announced.
    #[error("{what} cut short: {got} of {expected} bytes")]
    Short {
        what: String,
        expected: u64,
        got: u64,
    },
    /// The caller asked for something that cannot be done (a zero chunk size…).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// Maps a driver error to [`GpuError::Driver`], saying what was being done.
fn driver(what: &'static str) -> impl FnOnce(DriverError) -> GpuError {
    move |source| GpuError::Driver { what, source }
}

fn to_usize(n: u64) -> Result<usize, GpuError> {
    usize::try_from(n).map_err(|_| GpuError::Invalid(format!("{n} bytes do not fit in memory")))
}

/// Whether a CUDA driver loads and reports at least one device. Never panics: on a machine
/// without the driver it is `false`.
pub fn available() -> bool {
    device_count() > 0
}

/// The number of CUDA devices; 0 where no driver can be loaded. Probed once per process.
pub fn device_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(probe_devices)
}

fn probe_devices() -> usize {
    // SAFETY: only tries to open the driver library by its usual names, and closes it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return 0;
    }
    // cudarc panics on the first symbol a driver older than its bindings lacks: such a
    // driver counts as none.
    match std::panic::catch_unwind(CudaContext::device_count) {
        Ok(Ok(n)) => usize::try_from(n).unwrap_or(0),
        _ => 0,
    }
}

/// Bytes in device memory. The allocation may be larger than the bytes (a batch's buffer
/// grows by doubling); [`view`](Self::view) is exactly the bytes.
#[derive(Debug)]
pub struct DeviceBuf {
    data: CudaSlice<u8>,
    len: usize,
}

impl DeviceBuf {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated (at least [`len`](Self::len)).
    pub fn capacity(&self) -> usize {
        self.data.len()
    }

    /// The bytes, as a view to hand to kernels.
    pub fn view(&self) -> CudaView<'_, u8> {
        self.data.slice(..self.len)
    }

    /// The bytes, as a mutable view.
    pub fn view_mut(&mut self) -> CudaViewMut<'_, u8> {
        self.data.slice_mut(..self.len)
    }

    /// The whole allocation (the bytes first, then any spare capacity).
    pub fn slice(&self) -> &CudaSlice<u8> {
        &self.data
    }

    /// The allocation and the number of bytes at its start.
    pub fn into_parts(self) -> (CudaSlice<u8>, usize) {
        (self.data, self.len)
    }

    /// Copies the bytes back to host memory (for checks; waits for the copy).
    pub fn to_host(&self) -> Result<Vec<u8>, GpuError> {
        if self.len == 0 {
            return Ok(Vec::new());
        }
        let stream = self.data.stream();
        let out = stream
            .clone_dtoh(&self.view())
            .map_err(driver("copying device bytes back to the host"))?;
        stream
            .synchronize()
            .map_err(driver("waiting for the copy back to the host"))?;
        Ok(out)
    }
}

/// A batch in device memory: the members' bytes back to back, and where each one is.
#[derive(Debug)]
pub struct DeviceBatch {
    /// All members' bytes, in the order the node sent them.
    pub buf: DeviceBuf,
    /// Each member's name (`KEY`, `KEY/ARCHPATH`, or `__404__/NAME` for a missing item
    /// with [`Missing::Mark`]) and its byte range in `buf`.
    pub members: Vec<(String, Range<u64>)>,
}

impl DeviceBatch {
    /// The bytes of member `index`, as a view to hand to kernels.
    pub fn member(&self, index: usize) -> Option<CudaView<'_, u8>> {
        let (_, r) = self.members.get(index)?;
        let (start, end) = (usize::try_from(r.start).ok()?, usize::try_from(r.end).ok()?);
        self.buf.data.try_slice(start..end)
    }
}

/// Reads objects, streams and batches into device memory through two pinned staging
/// buffers (see the [module docs](self)).
#[derive(Debug)]
pub struct DeviceReader {
    stream: Arc<CudaStream>,
    host: [PinnedHostSlice<u8>; 2],
    copied: [CudaEvent; 2],
    /// The last batch's size: where the next batch's device buffer starts.
    batch_hint: u64,
    /// Readers on the same device that receive a large object's other parts, each with
    /// its own stream and staging buffers (kept between reads).
    helpers: Vec<DeviceReader>,
}

fn pinned_pair(ctx: &Arc<CudaContext>, chunk: usize) -> Result<[PinnedHostSlice<u8>; 2], GpuError> {
    if chunk == 0 {
        return Err(GpuError::Invalid("a chunk of 0 bytes".into()));
    }
    // SAFETY: the bytes are uninitialised; every byte copied out was written first (the
    // staging logic copies only the filled part of a buffer). Flags 0: ordinary cached
    // page-locked memory, which the socket reads write into.
    let alloc = || unsafe { ctx.alloc_pinned_with_flags::<u8>(chunk, 0) };
    let what = "allocating a pinned host buffer";
    Ok([
        alloc().map_err(driver(what))?,
        alloc().map_err(driver(what))?,
    ])
}

impl DeviceReader {
    /// A reader on device `ordinal`, with two pinned buffers of [`DEFAULT_CHUNK`] bytes.
    pub fn new(ordinal: usize) -> Result<DeviceReader, GpuError> {
        let count = device_count();
        if ordinal >= count {
            return Err(GpuError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("opening the device's context"))?;
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        let host = pinned_pair(&ctx, DEFAULT_CHUNK)?;
        let event = || ctx.new_event(None).map_err(driver("creating an event"));
        let copied = [event()?, event()?];
        Ok(DeviceReader {
            stream,
            host,
            copied,
            batch_hint: 0,
            helpers: Vec::new(),
        })
    }

    /// The same reader with staging buffers of `bytes` each (replaces the current ones).
    pub fn with_chunk(mut self, bytes: usize) -> Result<DeviceReader, GpuError> {
        self.stream
            .synchronize()
            .map_err(driver("waiting for pending copies"))?;
        self.host = pinned_pair(self.stream.context(), bytes)?;
        Ok(self)
    }

    /// The size of each staging buffer.
    pub fn chunk(&self) -> usize {
        self.host[0].len()
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// The stream the copies run on (and the buffers handed out are allocated on); work
    /// queued on it runs after them.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Reads what `opts` asks for of an object into device memory, receiving and copying
    /// at the same time; fails if fewer bytes arrive than the answer announced. A large
    /// object the node holds comes in parts over several connections at once, as
    /// [`Client::get`] reads it: each helper reader receives its parts into device
    /// memory of its own, copied into place on the device.
    pub fn read_object(
        &mut self,
        client: &mut Client,
        bucket: &str,
        key: &str,
        opts: &GetOptions,
    ) -> Result<DeviceBuf, GpuError> {
        let what = format!("object {bucket}/{key}");
        if client.may_split(opts) {
            match client.first_part(bucket, key, opts)? {
                First::Empty => {}
                First::Whole(body) => return self.read_answer(client, body, &what),
                First::Part(part) if part.hit => {
                    return self.read_parts(client, bucket, key, part, &what)
                }
                First::Part(mut part) => {
                    // A miss: the rest behind the node's fill, on one connection.
                    let rest = part.first.end..part.total;
                    let mut rest = client.part_answer(bucket, key, &part.pinned, rest)?;
                    let from = client.endpoint();
                    let mut src =
                        BodyFilling(&mut part.body, from).chain(BodyFilling(&mut rest, from));
                    let buf = self.read_stream(&mut src, part.total, &what)?;
                    client.done(rest);
                    return Ok(buf);
                }
            }
        }
        let (_, body) = client.call(get_request(bucket, key, opts)?)?;
        self.read_answer(client, body, &what)
    }

    /// Reads the answer `body` whole into device memory; its connection goes back to
    /// `client`.
    fn read_answer(
        &mut self,
        client: &mut Client,
        mut body: BodyReader,
        what: &str,
    ) -> Result<DeviceBuf, GpuError> {
        let size = body.remaining().unwrap_or(0);
        let buf = self.read_stream(&mut BodyFilling(&mut body, client.endpoint()), size, what)?;
        client.done(body);
        Ok(buf)
    }

    /// A large hit: this reader takes the first answer, and up to `client.streams()`
    /// helper readers, each on a helper connection, take the next
    /// [`PART`](crate::split::PART) bytes until none is left; each part is copied into
    /// place on this reader's stream as it arrives.
    fn read_parts(
        &mut self,
        client: &mut Client,
        bucket: &str,
        key: &str,
        first: FirstPart,
        what: &str,
    ) -> Result<DeviceBuf, GpuError> {
        let FirstPart {
            mut body,
            first,
            total,
            pinned,
            ..
        } = first;
        // A helper per connection, no more than there are parts.
        let streams = client
            .streams()
            .min((total - first.end).div_ceil(crate::split::PART) as usize);
        let ordinal = self.ordinal();
        let mut readers = std::mem::take(&mut self.helpers);
        while readers.len() < streams {
            readers.push(DeviceReader::new(ordinal)?);
        }
        let mut clients = client.take_helpers(streams);
        let from = client.endpoint().to_owned();
        let from = from.as_str();
        let todo = Parts::new(first.end..total);
        let (tx, rx) = std::sync::mpsc::channel::<Result<(u64, DeviceBuf), GpuError>>();
        let mut stage = self.stage(total)?;
        let result = std::thread::scope(|scope| {
            for (reader, c) in readers.iter_mut().zip(clients.iter_mut()).take(streams) {
                let (tx, todo, pinned) = (tx.clone(), &todo, &pinned);
                scope.spawn(move || {
                    while let Some(range) = todo.take() {
                        let part = c
                            .part_answer(bucket, key, pinned, range.clone())
                            .map_err(GpuError::from)
                            .and_then(|body| reader.read_answer(c, body, what));
                        let failed = part.is_err();
                        if tx.send(part.map(|b| (range.start, b))).is_err() || failed {
                            todo.stop();
                            return;
                        }
                    }
                });
            }
            drop(tx);
            let first_len = deliver_stream(
                &mut stage,
                &mut BodyFilling(&mut body, from),
                first.end,
                what,
            );
            let gathered = first_len.and_then(|_| {
                let mut got = first.end;
                for part in rx.iter() {
                    let (start, buf) = part?;
                    stage.place(&buf, start)?;
                    got += buf.len() as u64;
                }
                Ok(got)
            });
            todo.stop();
            gathered
        });
        let buf = match result {
            Ok(got) if got == total => stage.into_buf(total),
            Ok(got) => Err(GpuError::Short {
                what: what.to_owned(),
                expected: total,
                got,
            }),
            Err(e) => Err(e),
        };
        self.helpers = readers;
        client.helpers = clients;
        client.done(body);
        buf
    }

    /// Reads `src` to its end into device memory. `size` is the expected length (the
    /// buffer is allocated for it up front and grows if more arrives); fewer bytes is an
    /// error.
    pub fn read_from(&mut self, src: &mut dyn Read, size: u64) -> Result<DeviceBuf, GpuError> {
        self.read_stream(src, size, "stream")
    }

    fn read_stream(
        &mut self,
        src: &mut dyn Read,
        size: u64,
        what: &str,
    ) -> Result<DeviceBuf, GpuError> {
        let mut stage = self.stage(size)?;
        let len = deliver_stream(&mut stage, src, size, what)?;
        stage.into_buf(len)
    }

    /// `POST /_granary/batch` read into device memory: the members back to back, in the
    /// order the node sends them (that of `items`).
    pub fn read_batch(
        &mut self,
        client: &mut Client,
        items: &[BatchItem],
        missing: Missing,
    ) -> Result<DeviceBatch, GpuError> {
        let mut reader = client.open_batch(items, missing)?;
        let start = self.batch_hint.max(2 * self.chunk() as u64);
        let mut stage = self.stage(start)?;
        let (len, members) = deliver_batch(&mut stage, &mut reader, items.len())?;
        let buf = stage.into_buf(len)?;
        self.batch_hint = len;
        Ok(DeviceBatch { buf, members })
    }

    /// Copies bytes already in host memory to the device through the same pinned buffers:
    /// the ceiling [`read_object`](Self::read_object) is measured against.
    pub fn copy_from_host(&mut self, bytes: &[u8]) -> Result<DeviceBuf, GpuError> {
        let mut stage = self.stage(bytes.len() as u64)?;
        let mut pipe = Pipe::new(&mut stage)?;
        pipe.push(bytes)?;
        let len = pipe.finish()?;
        stage.into_buf(len)
    }

    /// The staging buffers, with a device buffer of `capacity` bytes to copy into.
    fn stage(&mut self, capacity: u64) -> Result<DeviceStage<'_>, GpuError> {
        let dst = device_alloc(&self.stream, capacity)?;
        Ok(DeviceStage {
            stream: &self.stream,
            host: &mut self.host,
            copied: &self.copied,
            dst,
        })
    }
}

impl Drop for DeviceReader {
    fn drop(&mut self) {
        // Copies out of the pinned buffers may still run after a failed read: they must end
        // before the buffers are freed.
        let _ = self.stream.synchronize();
    }
}

/// An answer's body from the node at `.1`, read a staging buffer at a time, each read
/// waiting for the whole buffer in one receive.
struct BodyFilling<'r>(&'r mut BodyReader, &'r str);

impl Read for BodyFilling<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0
            .read_full(buf)
            .map_err(|e| io::Error::new(e.kind(), format!("reading from {}: {e}", self.1)))
    }
}

/// A device buffer of `len` bytes (at least one, so an empty object still has an address).
fn device_alloc(stream: &Arc<CudaStream>, len: u64) -> Result<CudaSlice<u8>, GpuError> {
    let len = to_usize(len)?.max(1);
    // SAFETY: uninitialised device bytes; only those written are handed out as the
    // buffer's contents.
    unsafe { stream.alloc::<u8>(len) }.map_err(driver("allocating device memory"))
}

/// The device side of the staging: two host buffers, the copies out of them, and the
/// destination they go to. The [`Pipe`] drives it; tests drive a fake one.
trait Stage {
    /// The size of each host buffer.
    fn chunk(&self) -> usize;
    /// The bytes the destination holds.
    fn capacity(&self) -> u64;
    /// Host buffer `i` (0 or 1), to write into. Only called after [`wait`](Self::wait)`(i)`.
    fn host(&mut self, i: usize) -> Result<&mut [u8], GpuError>;
    /// Blocks until the last copy out of host buffer `i` has finished.
    fn wait(&mut self, i: usize) -> Result<(), GpuError>;
    /// Enqueues the copy of `host(i)[..n]` to destination offset `at`, and marks buffer
    /// `i` busy until it finishes.
    fn copy(&mut self, i: usize, n: usize, at: u64) -> Result<(), GpuError>;
    /// Replaces the destination with one of `capacity` bytes holding its first `keep`.
    fn reserve(&mut self, capacity: u64, keep: u64) -> Result<(), GpuError>;
    /// Blocks until every enqueued copy has finished.
    fn sync(&mut self) -> Result<(), GpuError>;
}

/// The real [`Stage`]: a [`DeviceReader`]'s pinned buffers and events, and a device buffer.
struct DeviceStage<'r> {
    stream: &'r Arc<CudaStream>,
    host: &'r mut [PinnedHostSlice<u8>; 2],
    copied: &'r [CudaEvent; 2],
    dst: CudaSlice<u8>,
}

impl DeviceStage<'_> {
    /// Copies `part` (read by another reader, on its own stream) to offset `at` of the
    /// destination, and waits for the copy, so the part may be freed.
    fn place(&mut self, part: &DeviceBuf, at: u64) -> Result<(), GpuError> {
        let (at, len) = (to_usize(at)?, part.len());
        if at + len > self.dst.len() {
            return Err(GpuError::Invalid(format!(
                "a part of {len} bytes at {at} does not fit in {}",
                self.dst.len()
            )));
        }
        self.stream
            .memcpy_dtod(
                &part.data.slice(..len),
                &mut self.dst.slice_mut(at..at + len),
            )
            .map_err(driver("copying a part into place"))?;
        self.sync()
    }

    fn into_buf(self, len: u64) -> Result<DeviceBuf, GpuError> {
        Ok(DeviceBuf {
            data: self.dst,
            len: to_usize(len)?,
        })
    }
}

impl Stage for DeviceStage<'_> {
    fn chunk(&self) -> usize {
        self.host[0].len()
    }

    fn capacity(&self) -> u64 {
        self.dst.len() as u64
    }

    fn host(&mut self, i: usize) -> Result<&mut [u8], GpuError> {
        self.host[i]
            .as_mut_slice()
            .map_err(driver("mapping a pinned buffer"))
    }

    fn wait(&mut self, i: usize) -> Result<(), GpuError> {
        self.copied[i]
            .synchronize()
            .map_err(driver("waiting for a copy to the device"))
    }

    fn copy(&mut self, i: usize, n: usize, at: u64) -> Result<(), GpuError> {
        let at = to_usize(at)?;
        let host = self.host[i]
            .as_slice()
            .map_err(driver("mapping a pinned buffer"))?;
        let mut dst = self.dst.slice_mut(at..at + n);
        self.stream
            .memcpy_htod(&host[..n], &mut dst)
            .map_err(driver("enqueueing a copy to the device"))?;
        self.copied[i]
            .record(self.stream)
            .map_err(driver("recording a copy's event"))
    }

    fn reserve(&mut self, capacity: u64, keep: u64) -> Result<(), GpuError> {
        let keep = to_usize(keep)?;
        let mut grown = device_alloc(self.stream, capacity)?;
        if keep > 0 {
            self.stream
                .memcpy_dtod(&self.dst.slice(..keep), &mut grown.slice_mut(..keep))
                .map_err(driver("moving bytes to a larger device buffer"))?;
        }
        // The old buffer is freed in stream order, after the copies that read it.
        self.dst = grown;
        Ok(())
    }

    fn sync(&mut self) -> Result<(), GpuError> {
        self.stream
            .synchronize()
            .map_err(driver("waiting for the copies to the device"))
    }
}

/// The capacity to grow to when `needed` bytes do not fit in `capacity`: double, or
/// `needed` if that is more.
fn grown(capacity: u64, needed: u64) -> u64 {
    needed.max(capacity.saturating_mul(2))
}

/// The double-buffering logic: fills one host buffer while the other's copy runs.
struct Pipe<'s, S: Stage> {
    stage: &'s mut S,
    chunk: usize,
    /// The buffer being filled.
    cur: usize,
    /// Bytes in it.
    fill: usize,
    /// Bytes whose copies are enqueued: the destination offset of `cur`'s first byte.
    sent: u64,
}

impl<'s, S: Stage> Pipe<'s, S> {
    fn new(stage: &'s mut S) -> Result<Pipe<'s, S>, GpuError> {
        // A copy from an earlier call that failed midway may still read buffer 0.
        stage.wait(0)?;
        Ok(Pipe {
            chunk: stage.chunk(),
            stage,
            cur: 0,
            fill: 0,
            sent: 0,
        })
    }

    /// Bytes taken in so far (the destination offset of the next one).
    fn total(&self) -> u64 {
        self.sent + self.fill as u64
    }

    /// Reads from `src` until it ends or `limit` bytes have been taken; the bytes taken.
    fn pull(&mut self, src: &mut dyn Read, limit: u64) -> Result<u64, GpuError> {
        let mut taken = 0u64;
        while taken < limit {
            if self.fill == self.chunk {
                self.flush()?;
            }
            let room = self.chunk - self.fill;
            let want = usize::try_from(limit - taken).map_or(room, |left| left.min(room));
            let buf = self.stage.host(self.cur)?;
            let n = match src.read(&mut buf[self.fill..self.fill + want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(GpuError::Io(e)),
            };
            self.fill += n;
            taken += n as u64;
        }
        Ok(taken)
    }

    /// Takes in bytes already in memory.
    fn push(&mut self, mut bytes: &[u8]) -> Result<(), GpuError> {
        while !bytes.is_empty() {
            if self.fill == self.chunk {
                self.flush()?;
            }
            let n = (self.chunk - self.fill).min(bytes.len());
            let buf = self.stage.host(self.cur)?;
            buf[self.fill..self.fill + n].copy_from_slice(&bytes[..n]);
            self.fill += n;
            bytes = &bytes[n..];
        }
        Ok(())
    }

    /// Enqueues the copy of the buffer being filled (growing the destination first if it
    /// would not fit), then switches to the other buffer once its last copy is done.
    fn flush(&mut self) -> Result<(), GpuError> {
        if self.fill == 0 {
            return Ok(());
        }
        let end = self.total();
        let capacity = self.stage.capacity();
        if end > capacity {
            self.stage.reserve(grown(capacity, end), self.sent)?;
        }
        self.stage.copy(self.cur, self.fill, self.sent)?;
        self.sent = end;
        self.fill = 0;
        self.cur ^= 1;
        self.stage.wait(self.cur)
    }

    /// Sends what is left and waits for every copy; the bytes delivered.
    fn finish(mut self) -> Result<u64, GpuError> {
        self.flush()?;
        self.stage.sync()?;
        Ok(self.sent)
    }
}

/// Delivers `src` to its end; at least `expected` bytes must come.
fn deliver_stream<S: Stage>(
    stage: &mut S,
    src: &mut dyn Read,
    expected: u64,
    what: &str,
) -> Result<u64, GpuError> {
    let mut pipe = Pipe::new(stage)?;
    pipe.pull(src, u64::MAX)?;
    let got = pipe.finish()?;
    if got < expected {
        return Err(GpuError::Short {
            what: what.to_owned(),
            expected,
            got,
        });
    }
    Ok(got)
}

/// Each member's name and byte range in the destination.
type Members = Vec<(String, Range<u64>)>;

/// Delivers the regular files of the tar stream `src` back to back; the bytes delivered
/// and each member's name and range.
fn deliver_batch<S: Stage>(
    stage: &mut S,
    src: &mut dyn Read,
    expected_members: usize,
) -> Result<(u64, Members), GpuError> {
    let mut pipe = Pipe::new(stage)?;
    let mut members = Vec::with_capacity(expected_members);
    let mut tar = TarReader::new(src);
    while let Some((name, size)) = tar.next_header().map_err(batch_error)? {
        let start = pipe.total();
        let got = pipe.pull(&mut tar.data(), size)?;
        if got != size {
            return Err(GpuError::Short {
                what: format!("batch member {name}"),
                expected: size,
                got,
            });
        }
        members.push((name, start..start + size));
    }
    // The end-of-archive blocks, and a failure the node may report after them.
    io::copy(tar.get_mut(), &mut io::sink())?;
    Ok((pipe.finish()?, members))
}

/// A tar stream that does not parse is the node's fault; a read that fails is the network's.
fn batch_error(e: io::Error) -> GpuError {
    match e.kind() {
        io::ErrorKind::InvalidData => {
            GpuError::Client(Error::Protocol(format!("batch answer: {e}")))
        }
        _ => GpuError::Io(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{tar_of, FakeServer, Reply};

    /// A [`Stage`] in host memory that checks the double-buffering rules: a buffer is never
    /// written while its copy may still run, and copies never pass the destination's end.
    struct FakeStage {
        bufs: [Vec<u8>; 2],
        busy: [bool; 2],
        dst: Vec<u8>,
        /// `(buffer, bytes, offset)` of each copy.
        copies: Vec<(usize, usize, u64)>,
        /// `(capacity, kept)` of each growth.
        grew: Vec<(u64, u64)>,
    }

    impl FakeStage {
        fn new(chunk: usize, capacity: u64) -> FakeStage {
            FakeStage {
                bufs: [vec![0xAA; chunk], vec![0xBB; chunk]],
                busy: [false; 2],
                dst: vec![0; capacity as usize],
                copies: Vec::new(),
                grew: Vec::new(),
            }
        }

        fn delivered(&self, len: u64) -> &[u8] {
            &self.dst[..len as usize]
        }
    }

    impl Stage for FakeStage {
        fn chunk(&self) -> usize {
            self.bufs[0].len()
        }

        fn capacity(&self) -> u64 {
            self.dst.len() as u64
        }

        fn host(&mut self, i: usize) -> Result<&mut [u8], GpuError> {
            assert!(!self.busy[i], "buffer {i} written while its copy may run");
            Ok(&mut self.bufs[i])
        }

        fn wait(&mut self, i: usize) -> Result<(), GpuError> {
            self.busy[i] = false;
            Ok(())
        }

        fn copy(&mut self, i: usize, n: usize, at: u64) -> Result<(), GpuError> {
            assert!(!self.busy[i], "buffer {i} copied twice without a wait");
            let at = at as usize;
            assert!(at + n <= self.dst.len(), "copy past the destination's end");
            self.dst[at..at + n].copy_from_slice(&self.bufs[i][..n]);
            // Scribble on the source: a refill before the wait would now show.
            self.bufs[i].fill(0xEE);
            self.busy[i] = true;
            self.copies.push((i, n, at as u64));
            Ok(())
        }

        fn reserve(&mut self, capacity: u64, keep: u64) -> Result<(), GpuError> {
            let mut grown = vec![0u8; capacity as usize];
            grown[..keep as usize].copy_from_slice(&self.dst[..keep as usize]);
            self.dst = grown;
            self.grew.push((capacity, keep));
            Ok(())
        }

        fn sync(&mut self) -> Result<(), GpuError> {
            self.busy = [false; 2];
            Ok(())
        }
    }

    /// A reader handing out at most `step` bytes per call, like a socket.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.step).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + i / 251) as u8).collect()
    }

    #[test]
    fn streams_alternate_buffers_in_full_chunks() {
        let data = pattern(1000);
        let mut stage = FakeStage::new(64, 1000);
        let mut src = Trickle {
            data: &data,
            step: 7,
        };
        let len = deliver_stream(&mut stage, &mut src, 1000, "object").unwrap();
        assert_eq!(len, 1000);
        assert_eq!(stage.delivered(len), &data[..]);
        assert!(stage.grew.is_empty(), "a known size needs no growth");
        // 15 full chunks and the 40-byte rest, alternating buffers, back to back.
        assert_eq!(stage.copies.len(), 16);
        for (n, &(buf, bytes, at)) in stage.copies.iter().enumerate() {
            assert_eq!(buf, n % 2);
            assert_eq!(at, n as u64 * 64);
            assert_eq!(bytes, if n < 15 { 64 } else { 40 });
        }
    }

    #[test]
    fn host_bytes_go_through_the_same_buffers() {
        let data = pattern(300);
        let mut stage = FakeStage::new(128, 300);
        let mut pipe = Pipe::new(&mut stage).unwrap();
        pipe.push(&data[..100]).unwrap();
        pipe.push(&data[100..]).unwrap();
        assert_eq!(pipe.finish().unwrap(), 300);
        assert_eq!(stage.delivered(300), &data[..]);
        let sizes: Vec<usize> = stage.copies.iter().map(|c| c.1).collect();
        assert_eq!(sizes, vec![128, 128, 44]);
    }

    #[test]
    fn an_unknown_size_grows_the_destination_by_doubling() {
        assert_eq!(grown(10, 11), 20);
        assert_eq!(grown(10, 50), 50);
        assert_eq!(grown(0, 5), 5);
        assert_eq!(grown(u64::MAX - 1, u64::MAX), u64::MAX);
        let data = pattern(1000);
        // A missing Content-Length reads as size 0.
        let mut stage = FakeStage::new(64, 1);
        let len = deliver_stream(&mut stage, &mut &data[..], 0, "object").unwrap();
        assert_eq!(stage.delivered(len), &data[..]);
        let caps: Vec<u64> = stage.grew.iter().map(|g| g.0).collect();
        assert_eq!(caps, vec![64, 128, 256, 512, 1024]);
        // Each growth keeps exactly what was already sent.
        let kept: Vec<u64> = stage.grew.iter().map(|g| g.1).collect();
        assert_eq!(kept, vec![0, 64, 128, 256, 512]);
    }

    #[test]
    fn a_short_body_is_an_error_that_says_so() {
        let data = pattern(50);
        let mut stage = FakeStage::new(16, 100);
        let err = deliver_stream(&mut stage, &mut &data[..], 100, "object b/k").unwrap_err();
        assert!(
            matches!(
                &err,
                GpuError::Short {
                    expected: 100,
                    got: 50,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "object b/k cut short: 50 of 100 bytes");
    }

    #[test]
    fn garbage_and_cut_tars_are_errors() {
        let garbage = vec![b'x'; 1024];
        let mut stage = FakeStage::new(256, 1024);
        let err = deliver_batch(&mut stage, &mut &garbage[..], 1).unwrap_err();
        assert!(
            matches!(&err, GpuError::Client(Error::Protocol(m)) if m.starts_with("batch answer: tar")),
            "{err:?}"
        );
        let bytes = tar_of(&[("a", &[1u8; 4000])]);
        let mut stage = FakeStage::new(256, 1024);
        let err = deliver_batch(&mut stage, &mut &bytes[..2000], 1).unwrap_err();
        assert!(
            matches!(&err, GpuError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof),
            "{err:?}"
        );
        let mut stage = FakeStage::new(256, 1024);
        assert!(deliver_batch(&mut stage, &mut &bytes[..300], 1).is_err());
        let mut stage = FakeStage::new(256, 1024);
        let (n, members) = deliver_batch(&mut stage, &mut &[][..], 0).unwrap();
        assert_eq!((n, members.len()), (0, 0));
    }

    #[test]
    fn a_batch_from_the_node_lands_back_to_back() {
        let long = format!("shard.tar/{}x.jpg", "deep/".repeat(40));
        let big = pattern(3000);
        let tar = tar_of(&[("a.bin", b"AAA"), (&long, &big), ("__404__/gone", b"")]);
        let server = FakeServer::start(vec![Reply::ok(tar).chunked(333)]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let items = [BatchItem::object("b", "a.bin")];
        let mut reader = c.open_batch(&items, Missing::Mark).unwrap();
        let mut stage = FakeStage::new(256, 512);
        let (len, members) = deliver_batch(&mut stage, &mut reader, 3).unwrap();
        assert_eq!(len, 3003);
        assert_eq!(
            members,
            vec![
                ("a.bin".to_owned(), 0..3),
                (long, 3..3003),
                ("__404__/gone".to_owned(), 3003..3003),
            ]
        );
        assert_eq!(&stage.delivered(len)[..3], b"AAA");
        assert_eq!(&stage.delivered(len)[3..], &big[..]);
        let caps: Vec<u64> = stage.grew.iter().map(|g| g.0).collect();
        assert_eq!(caps, vec![1024, 2048, 4096]);
        let reqs = server.finish();
        assert_eq!(reqs[0].target, "/_granary/batch?missing=mark");
    }

    #[test]
    fn an_object_from_the_node_streams_through() {
        let data = pattern(10_000);
        let server = FakeServer::start(vec![Reply::ok(data.clone())]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let mut reader = c.open("b", "k").unwrap();
        let size = reader.meta().size;
        assert_eq!(size, 10_000);
        let mut stage = FakeStage::new(1024, size);
        let len = deliver_stream(&mut stage, &mut reader, size, "object b/k").unwrap();
        assert_eq!(stage.delivered(len), &data[..]);
        server.finish();
    }

    #[test]
    fn without_a_device_nothing_panics() {
        let count = device_count();
        assert_eq!(available(), count > 0);
        if count == 0 {
            let err = DeviceReader::new(0).unwrap_err();
            assert!(matches!(
                err,
                GpuError::NoDevice {
                    ordinal: 0,
                    count: 0
                }
            ));
            assert!(err.to_string().contains("no CUDA device 0"), "{err}");
        }
        let err = DeviceReader::new(count).unwrap_err();
        assert!(matches!(err, GpuError::NoDevice { .. }), "{err:?}");
    }

    fn gpu() -> Option<DeviceReader> {
        if !available() {
            eprintln!("skipped: no CUDA device");
            return None;
        }
        Some(DeviceReader::new(0).unwrap().with_chunk(64 << 10).unwrap())
    }

    #[test]
    fn gpu_objects_arrive_intact() {
        let Some(mut gpu) = gpu() else { return };
        let data = pattern((1 << 20) + 12345);
        let server = FakeServer::start(vec![
            Reply::ok(data.clone()),
            Reply::ok(data.clone()).chunked(100_000),
            Reply::ok(Vec::new()),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let opts = GetOptions::default();
        let buf = gpu.read_object(&mut c, "b", "k", &opts).unwrap();
        assert_eq!(buf.len(), data.len());
        assert_eq!(buf.capacity(), data.len());
        assert_eq!(buf.to_host().unwrap(), data);
        // Chunked: no Content-Length, so the buffer grows.
        let buf = gpu.read_object(&mut c, "b", "k", &opts).unwrap();
        assert_eq!(buf.to_host().unwrap(), data);
        let empty = gpu.read_object(&mut c, "b", "empty", &opts).unwrap();
        assert!(empty.is_empty());
        assert!(empty.to_host().unwrap().is_empty());
        server.finish();
    }

    #[test]
    fn gpu_batches_arrive_intact() {
        let Some(mut gpu) = gpu() else { return };
        let long = format!("shard.tar/{}x.jpg", "deep/".repeat(40));
        let big = pattern(300_000);
        let tar = tar_of(&[("a.bin", b"AAA"), (&long, &big), ("__404__/gone", b"")]);
        let server = FakeServer::start(vec![
            Reply::ok(tar.clone()).chunked(4096),
            Reply::ok(tar).chunked(4096),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let items = [BatchItem::object("b", "a.bin")];
        for _ in 0..2 {
            let batch = gpu.read_batch(&mut c, &items, Missing::Mark).unwrap();
            assert_eq!(batch.members.len(), 3);
            assert_eq!(batch.members[1], (long.clone(), 3..300_003));
            let host = batch.buf.to_host().unwrap();
            assert_eq!(&host[..3], b"AAA");
            assert_eq!(&host[3..], &big[..]);
            assert_eq!(batch.member(0).map(|v| v.len()), Some(3));
            assert_eq!(batch.member(2).map(|v| v.len()), Some(0));
            assert!(batch.member(3).is_none());
        }
        server.finish();
    }

    #[test]
    fn gpu_host_copies_arrive_intact() {
        let Some(mut gpu) = gpu() else { return };
        for len in [0, 1, 64 << 10, (3 << 20) + 7] {
            let data = pattern(len);
            let buf = gpu.copy_from_host(&data).unwrap();
            assert_eq!(buf.len(), len);
            assert_eq!(buf.to_host().unwrap(), data);
        }
    }
}
