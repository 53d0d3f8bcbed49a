//! Hits: a committed entry's bytes, from memory for a small hot object; else from its
//! file, in one of two ways, chosen by what was measured cheaper (BENCHMARKS.md, "Warm
//! hits: how the bytes leave"):
//! - small objects (the memory tier keeps them) and small ranges (shard members): read
//!   into buffers through the read engine, each 64 KiB block checked against its CRC32C
//!   there where reads are checked, the next read running on the engine's thread
//!   meanwhile;
//! - larger reads: as slices of a read-only mapping of the file, a window at a time, so
//!   no byte is copied in user space: the kernel copies each from the page cache into
//!   the socket, or with `--sendfile` sends the pages themselves (`io::sendfile`). The
//!   windows' mappings are kept for the next hits, in a budget ([`maps`](super::maps)).
//!
//! Where reads are checked (`--verify-reads`, or an entry not yet read whole since the
//! node started), the bytes that leave are the bytes checked, whatever the kernel
//! reclaims meanwhile. The kernel reads a mapped page when the socket takes it, which
//! may be long after any check: a page reclaimed in between would come in again from
//! the disk, unchecked, and leave. So a mapped window leaves only sealed: its pages
//! locked in memory first, then checked whole ([`maps`](super::maps)). A locked page is
//! never reclaimed, so a sealed window is sent with no further check for as long as it
//! is kept (`bytes_checked_earlier`). A window that cannot be sealed (not kept, the lock
//! budget spent, locks refused) is read into buffers and checked there, as small reads
//! are: what is checked is what is sent.
//!
//! A block that fails its check drops the entry, so the next read refetches it, and the
//! read fails before the bad bytes are sent. For a client on this machine the file itself
//! is handed over (`local_file`). A client that maps it has its range checked first. A
//! client that copies out only pages it finds resident ([`LocalReader::CopiesResident`])
//! gets the range brought in (sealed where it can be) and the CRC32Cs of its blocks
//! ([`BlockChecks`]), and checks its copy against them: the bytes it keeps are the
//! bytes checked, whatever was reclaimed between the node's answer and its copy.

use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;

use super::index::Entry;
use super::maps::Window;
use super::{store, Body, Cache, CacheError, LocalFile, LocalReader, Origin, Read, HOT_MAX_OBJECT};
use crate::backend::{ByteRange, ByteStream, RangeFn};
use crate::io::crc::{self, BlockChecks};
use crate::stats::Metric;

/// What a mapped hit maps at a time: 4 MiB costs a quarter less CPU per byte than 1 MiB
/// here (fewer mappings set up and torn down), and larger windows no less. Windows stay
/// mapped between hits, in a budget ([`maps`](super::maps)), and are sealed whole.
pub const WINDOW: u64 = 4 << 20;
/// Reads up to this long (shard members, small ranges) are read into a buffer: a
/// mapping's set-up and tear-down cost more than copying them.
const SMALL_READ: u64 = 1 << 20;

impl Cache {
    /// A committed entry's bytes, of the range `range` picks: from memory for a hot
    /// small object, else the entry file.
    pub(super) fn serve_entry(
        self: &Arc<Self>,
        ikey: &str,
        entry: Arc<Entry>,
        range: &RangeFn<'_>,
    ) -> Result<Read, CacheError> {
        let resolved = range(&entry.meta).map_err(CacheError::Refused)?;
        let hot = self
            .hot
            .get(ikey)
            .filter(|(e, _)| Arc::ptr_eq(e, &entry))
            .map(|(_, b)| b);
        let body: ByteStream = match hot {
            Some(bytes) => {
                let (a, b) =
                    resolved.map_or((0, bytes.len()), |r| (r.start as usize, r.end as usize));
                let piece = bytes.slice(a..b);
                Box::pin(futures::stream::once(async move { Ok(piece) }))
            }
            None => self
                .clone()
                .hit_stream(ikey.to_owned(), entry.clone(), resolved),
        };
        Ok(Read {
            meta: entry.meta.clone(),
            range: resolved,
            body: Body::Stream(body),
            origin: Origin::Hit,
        })
    }

    /// A committed entry's file, opened read-only, for a client on this machine: `None`
    /// when the entry is gone. The range is brought in, its windows sealed where they
    /// can be. For a reader that maps it, the windows not sealed are checked against
    /// their checksums where reads are checked (`--verify-reads`, or an entry not yet
    /// read whole since it was loaded); a mismatch drops the entry and fails, as a
    /// streamed read would. For a reader that copies out resident pages only, the answer
    /// carries the checksums of the range's blocks, against which it checks its copy.
    pub(super) async fn local_file(
        self: &Arc<Self>,
        ikey: &str,
        entry: Arc<Entry>,
        range: &RangeFn<'_>,
        reader: LocalReader,
    ) -> Result<Option<Box<LocalFile>>, CacheError> {
        let resolved = range(&entry.meta).map_err(CacheError::Refused)?;
        let size = entry.meta.size;
        let (start, end) = resolved.map_or((0, size), |r| (r.start, r.end));
        // Opened after the lookup: an entry removed meanwhile is simply not held.
        let file = match entry.open() {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        // A reader that maps the range reads what it finds: its windows not sealed are
        // checked first where reads are. One that copies it out checks its copy.
        let span = Span::of(&entry, resolved, self.verify_reads);
        let check = reader == LocalReader::Maps && span.verify;
        self.bring_in(ikey, &entry, Arc::new(file.try_clone()?), span, check)
            .await?;
        if check && span.whole() {
            entry.verified.store(true, Ordering::Relaxed);
        }
        let checks = (reader == LocalReader::CopiesResident).then(|| span.checks(&entry));
        self.stats.add(Metric::Hits, 1);
        self.stats.add(Metric::LocalReads, 1);
        Ok(Some(Box::new(LocalFile {
            file,
            meta: entry.meta.clone(),
            offset: start,
            len: end - start,
            checks,
        })))
    }

    /// The windows of `span` in the page cache, for a client on this machine: each
    /// sealed where it can be ([`Cache::seal`]), else read in, and with `check` its
    /// blocks of the span checked (on the blocking pool; a mismatch drops the entry).
    async fn bring_in(
        self: &Arc<Self>,
        ikey: &str,
        entry: &Arc<Entry>,
        file: Arc<File>,
        span: Span,
        check: bool,
    ) -> Result<(), CacheError> {
        let meta = file.metadata()?;
        let len = meta.len();
        if len < span.stop {
            self.drop_entry(ikey, entry);
            return Err(io::Error::other("cache entry is shorter than its size").into());
        }
        entry.maps.observe(&meta);
        let mut pos = span.first_block();
        while pos < span.stop {
            let w = pos / WINDOW;
            let full_end = ((w + 1) * WINDOW).min(span.size);
            let window_end = full_end.min(span.stop);
            let kept = if len >= full_end {
                entry
                    .maps
                    .window(&self.maps, &file, w, w * WINDOW, full_end)
            } else {
                None
            };
            let map = match kept {
                Some(k) => k,
                None => Window::once(&file, pos, (window_end - pos) as usize)?,
            };
            if self.seal(ikey, entry, &map).await? == Seal::Open {
                let base = map.start();
                let (from, to) = ((pos - base) as usize, (window_end - base) as usize);
                let (cache, entry, ikey) = (self.clone(), entry.clone(), ikey.to_owned());
                tokio::task::spawn_blocking(move || {
                    map.mapped().fault_in_range(from, to);
                    if check {
                        return cache.check_crcs(&ikey, &entry, pos, &map.mapped()[from..to]);
                    }
                    Ok(())
                })
                .await
                .map_err(io::Error::other)??;
            }
            pos = window_end;
        }
        Ok(())
    }

    /// Seals `window` where it is a kept one not sealed yet, and no other hit seals it
    /// now: locks its pages and checks them whole, on the blocking pool
    /// ([`Kept::seal`](super::maps::Kept::seal)). A check that fails drops the entry.
    async fn seal(
        self: &Arc<Self>,
        ikey: &str,
        entry: &Arc<Entry>,
        window: &Window,
    ) -> io::Result<Seal> {
        let Some(kept) = window.kept() else {
            return Ok(Seal::Open);
        };
        if kept.sealed() {
            return Ok(Seal::Earlier);
        }
        if !kept.claim() {
            return Ok(Seal::Open);
        }
        let (cache, entry, ikey) = (self.clone(), entry.clone(), ikey.to_owned());
        let (kept, at) = (kept.clone(), window.start());
        let sealed = tokio::task::spawn_blocking(move || {
            kept.seal(|bytes| cache.check_crcs(&ikey, &entry, at, bytes))
        })
        .await
        .map_err(io::Error::other)??;
        Ok(if sealed { Seal::Now } else { Seal::Open })
    }

    /// Checks `bytes`, whole blocks of an entry from `pos` (a block boundary), against
    /// their checksums; a mismatch drops the entry and fails.
    fn check_crcs(&self, ikey: &str, entry: &Arc<Entry>, pos: u64, bytes: &[u8]) -> io::Result<()> {
        let block = entry.block();
        let first = (pos / block) as usize;
        self.stats.add(Metric::BytesChecked, bytes.len() as u64);
        for (i, chunk) in bytes.chunks(block as usize).enumerate() {
            if entry.crcs.get(first + i) != Some(&crc::crc32c(chunk)) {
                tracing::error!(key = %ikey, block = first + i, "cache entry failed its checksum; dropping it");
                self.drop_entry(ikey, entry);
                return Err(io::Error::other("cache entry failed its checksum"));
            }
        }
        Ok(())
    }

    /// Streams a committed entry, checking each block's CRC32C before sending it (where
    /// reads are checked). On a mismatch the stream ends with an error (the response is
    /// cut short) and the entry is dropped, so the next read refetches it.
    ///
    /// Which way the bytes go is measured (BENCHMARKS.md, "Warm hits: how the bytes
    /// leave"): mapping a window costs the kernel about what copying it costs, so the
    /// mapping pays only where nothing in user space reads the bytes each time: small
    /// reads go into buffers; larger ones go mapped, from windows sealed once where reads
    /// are checked.
    pub(super) fn hit_stream(
        self: Arc<Self>,
        ikey: String,
        entry: Arc<Entry>,
        range: Option<ByteRange>,
    ) -> ByteStream {
        let span = Span::of(&entry, range, self.verify_reads);
        if span.size <= HOT_MAX_OBJECT || span.end - span.start <= SMALL_READ {
            self.read_stream(ikey, entry, span)
        } else {
            self.mapped_stream(ikey, entry, span)
        }
    }

    /// A hit as slices of mappings of its file, a [`WINDOW`] at a time (windows aligned
    /// to [`WINDOW`] in the file). A checked hit sends a window mapped only once it is
    /// sealed (its pages locked, then checked whole), and reads any other window into
    /// buffers, checked there ([`Cache::read_range`]). An unchecked hit sends every
    /// window mapped, its pages read in first on the blocking pool where they are not,
    /// so that the socket's copy never waits on the disk in the runtime.
    fn mapped_stream(self: Arc<Self>, ikey: String, entry: Arc<Entry>, span: Span) -> ByteStream {
        let stream = async_stream::try_stream! {
            if span.start < span.end {
                let file = Arc::new(entry.open()?);
                // A mapping read past the end of its file faults: the node never shortens
                // an entry file, only damage does, so check once here.
                let meta = file.metadata()?;
                let len = meta.len();
                if len < span.stop {
                    self.drop_entry(&ikey, &entry);
                    Err(io::Error::other("cache entry is shorter than its size"))?;
                }
                entry.maps.observe(&meta);
                let size = span.size;
                // Blocks are 64 KiB or 1 MiB: the window is a multiple.
                let mut pos = span.first_block();
                while pos < span.end {
                    let w = pos / WINDOW;
                    let full_end = ((w + 1) * WINDOW).min(size);
                    let window_end = full_end.min(span.stop);
                    // The whole window, kept for the next hits where the budget allows;
                    // else the bytes this hit sends, for it.
                    let kept = if len >= full_end {
                        entry.maps.window(&self.maps, &file, w, w * WINDOW, full_end)
                    } else {
                        None
                    };
                    let (lo, hi) = (span.start.max(pos), span.end.min(window_end));
                    if span.verify {
                        let seal = match &kept {
                            Some(k) => self.seal(&ikey, &entry, k).await?,
                            None => Seal::Open,
                        };
                        if seal == Seal::Open {
                            let mut parts = self.clone().read_range(
                                ikey.clone(), entry.clone(), file.clone(), span, pos, window_end,
                            );
                            while let Some(part) = parts.next().await {
                                yield part?;
                            }
                            pos = window_end;
                            continue;
                        }
                        if seal == Seal::Earlier {
                            self.stats.add(Metric::BytesCheckedEarlier, hi - lo);
                        }
                    }
                    let map = match kept {
                        Some(k) => k,
                        None => Window::once(&file, pos, (window_end - pos) as usize)?,
                    };
                    let base = map.start();
                    let (from, to) = ((pos - base) as usize, (window_end - base) as usize);
                    // A sealed window's pages are locked: in memory.
                    let map = if span.verify || map.mapped().resident_range(from, to) {
                        map
                    } else {
                        map.faulted_in(from, to).await?
                    };
                    // Recorded before the last yield: the body may be dropped as soon as
                    // its last byte is taken.
                    if hi >= span.end && span.verify && span.whole() {
                        entry.verified.store(true, Ordering::Relaxed);
                    }
                    let window = map.into_bytes();
                    yield window.slice((lo - base) as usize..(hi - base) as usize);
                    pos = window_end;
                }
            }
        };
        Box::pin(stream)
    }

    /// A small hit read through the read engine into memory (kept in the memory tier
    /// when it is the whole object).
    fn read_stream(self: Arc<Self>, ikey: String, entry: Arc<Entry>, span: Span) -> ByteStream {
        let stream = async_stream::try_stream! {
            if span.start < span.end {
                let file = Arc::new(entry.open()?);
                let (from, to) = (span.first_block(), span.stop);
                let mut parts = self.read_range(ikey, entry, file, span, from, to);
                while let Some(part) = parts.next().await {
                    yield part?;
                }
            }
        };
        Box::pin(stream)
    }

    /// Bytes `from..to` of an entry's file (`from` a block's start, `to` one or the
    /// span's stop) read into buffers through the read engine, each checked on arrival
    /// where the span is checked; the span's bytes of them streamed.
    fn read_range(
        self: Arc<Self>,
        ikey: String,
        entry: Arc<Entry>,
        file: Arc<File>,
        span: Span,
        from: u64,
        to: u64,
    ) -> ByteStream {
        let stream = async_stream::try_stream! {
            // Reads of up to 1 MiB over whole blocks.
            let read = |pos: u64| {
                let len = (to - pos).min(store::READ) as usize;
                self.engine.read_at(file.clone(), pos, len)
            };
            let mut pos = from;
            // One read ahead: the next read runs while this one is checked and sent, so
            // a single stream keeps the disk and the socket both busy.
            let mut ahead = Some(read(pos));
            while pos < to && pos < span.end {
                let buf = match ahead.take() {
                    Some(r) => r.await?,
                    None => read(pos).await?,
                };
                if buf.is_empty() {
                    self.drop_entry(&ikey, &entry);
                    Err(io::Error::other("cache entry is shorter than its size"))?;
                }
                let next = pos + buf.len() as u64;
                if next < to && next < span.end {
                    ahead = Some(read(next));
                }
                if span.verify {
                    self.check_crcs(&ikey, &entry, pos, &buf)?;
                }
                let lo = (span.start.max(pos) - pos) as usize;
                let hi = (span.end.min(next) - pos) as usize;
                if span.size <= HOT_MAX_OBJECT && span.whole() {
                    self.hot.insert(ikey.clone(), (entry.clone(), buf.clone()));
                }
                // Before the last yield: the body may be dropped once it is taken.
                if next >= span.end && span.whole() {
                    entry.verified.store(true, Ordering::Relaxed);
                }
                let piece: Bytes = buf.slice(lo..hi);
                yield piece;
                pos = next;
            }
        };
        Box::pin(stream)
    }
}

/// Whether a window is sealed ([`Cache::seal`]): by an earlier hit, by this one just
/// now, or not (it is to be read into buffers and checked there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seal {
    Open,
    Now,
    Earlier,
}

/// What a hit reads of an entry: bytes `start..end` of an object of `size`, in whole
/// blocks of `block` bytes, from the block holding `start` to `stop` (the end of the
/// block holding `end - 1`); each block checked or not.
#[derive(Clone, Copy)]
struct Span {
    size: u64,
    start: u64,
    end: u64,
    block: u64,
    stop: u64,
    verify: bool,
}

impl Span {
    fn of(entry: &Entry, range: Option<ByteRange>, verify_reads: bool) -> Span {
        let size = entry.meta.size;
        let (start, end) = range.map_or((0, size), |r| (r.start, r.end));
        let block = entry.block();
        Span {
            size,
            start,
            end,
            block,
            stop: end.div_ceil(block).saturating_mul(block).min(size),
            verify: verify_reads || !entry.verified.load(Ordering::Relaxed),
        }
    }

    /// Whether the span is the whole object.
    fn whole(&self) -> bool {
        self.start == 0 && self.end == self.size
    }

    /// Where the block holding `start` begins.
    fn first_block(&self) -> u64 {
        self.start / self.block * self.block
    }

    /// The checksums of the blocks holding the span, for a reader that checks its copy.
    fn checks(&self, entry: &Entry) -> BlockChecks {
        let first = self.start / self.block;
        let blocks = (self.stop - self.first_block()).div_ceil(self.block) as usize;
        BlockChecks {
            block: self.block,
            first,
            end: self.stop,
            crcs: entry
                .crcs
                .iter()
                .skip(first as usize)
                .take(blocks)
                .copied()
                .collect(),
        }
    }
}
