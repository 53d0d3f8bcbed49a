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
//! node started), a mapped window's blocks are checked just before they are handed on,
//! unless the window was checked whole since its pages last came in from the disk and
//! they are all resident now ([`Residency`](super::resident::Residency)): the disk is
//! where damage comes from, and memory that was checked is sent as it is. With
//! `--sendfile` every block is checked.
//!
//! A block that fails its check drops the entry, so the next read refetches it, and the
//! read fails before the bad bytes are sent. For a client on this machine the file itself
//! is handed over (`local_file`), its range checked through a mapping first. A client
//! that copies out only pages it finds resident ([`LocalReader::CopiesResident`]) is
//! handed it once the range is as the mapped path would send it: brought in, and
//! checked where the record says it must be. Its copy then follows within microseconds,
//! as the socket's copy does here.
//!
//! The window between check and send, on the mapped path: a block is checked in the page
//! cache and then copied (or sent) from the same pages by the connection's next write,
//! within microseconds to milliseconds (as long as the socket takes to accept it). Only a
//! write to the entry file in that window could change what leaves, and the node never
//! writes a committed entry. Damage on the disk reaches the page cache only when a page
//! is read in again, and that read is checked before it is sent; a page the page cache
//! holds is the one that was checked. So the window admits only another process writing
//! into the cache's files while a read is in flight, which no deployment does. (The
//! buffered path has no window: what is checked is what is sent.)

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
use crate::io::crc;
use crate::io::mapped::Mapped;
use crate::stats::Metric;

/// What a mapped hit maps at a time ([`WINDOW`]): 4 MiB costs a quarter less CPU per byte
/// than 1 MiB here (fewer mappings set up and torn down), and larger windows no less.
/// Windows stay mapped between hits, in a budget ([`maps`](super::maps)). It is also
/// what a checked hit's record of checked pages covers per mark.
use super::resident::WINDOW;
/// Where blocks are checked, the bytes checked and handed on at a time: the kernel's
/// copy into the socket then reads them from the CPU's cache.
const CHECK_STEP: u64 = 1 << 20;
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
    /// when the entry is gone. The bytes of the range are checked against their checksums
    /// first where reads are checked (`--verify-reads`, or an entry not yet read whole
    /// since it was loaded); a mismatch drops the entry and fails, as a streamed read
    /// would. For a reader that copies out resident pages only, the range is made
    /// resident and checked as a hit would send it (windows checked since their pages
    /// came in are not checked again), and the entry stays trusted.
    pub(super) async fn local_file(
        self: &Arc<Self>,
        ikey: &str,
        entry: Arc<Entry>,
        range: &RangeFn<'_>,
        reader: LocalReader,
    ) -> Result<Option<LocalFile>, CacheError> {
        let resolved = range(&entry.meta).map_err(CacheError::Refused)?;
        let size = entry.meta.size;
        let (start, end) = resolved.map_or((0, size), |r| (r.start, r.end));
        // Opened after the lookup: an entry removed meanwhile is simply not held.
        let file = match File::open(&entry.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if reader == LocalReader::CopiesResident {
            // The hit's own path, its bytes not sent: each window resident and checked
            // (or found so) before the client copies it.
            let span = Span::of(&entry, resolved, self.verify_reads);
            let opened = Some(file.try_clone()?);
            let mut pieces =
                self.clone()
                    .mapped_stream(ikey.to_owned(), entry.clone(), span, opened);
            while let Some(piece) = pieces.next().await {
                piece?;
            }
        } else {
            // The client reads the file itself, unseen: what it reads in is never trusted.
            entry.resident.share(entry.meta.size);
        }
        if reader == LocalReader::Maps
            && (self.verify_reads || !entry.verified.load(Ordering::Relaxed))
        {
            let (cache, e2, ik) = (self.clone(), entry.clone(), ikey.to_owned());
            let f2 = file.try_clone()?;
            tokio::task::spawn_blocking(move || cache.check_blocks(&ik, &e2, &f2, start, end))
                .await
                .map_err(io::Error::other)??;
        }
        self.stats.add(Metric::Hits, 1);
        self.stats.add(Metric::LocalReads, 1);
        Ok(Some(LocalFile {
            file,
            meta: entry.meta.clone(),
            offset: start,
            len: end - start,
        }))
    }

    /// Checks the blocks of an entry's file holding `start..end` against their
    /// checksums, through a mapping (no copy); marks the entry verified when that is all
    /// of it.
    fn check_blocks(
        &self,
        ikey: &str,
        entry: &Arc<Entry>,
        file: &File,
        start: u64,
        end: u64,
    ) -> io::Result<()> {
        let size = entry.meta.size;
        let block = entry.block();
        let first = start / block;
        let stop = end.div_ceil(block).saturating_mul(block).min(size);
        let from = first * block;
        // A mapping past the end of the file faults when touched: check the length first
        // (the node never shortens an entry file; only damage does).
        let long_enough = file.metadata().map(|m| m.len() >= stop);
        if !matches!(long_enough, Ok(true)) {
            self.drop_entry(ikey, entry);
            return Err(io::Error::other("cache entry is shorter than its size"));
        }
        let _reading = entry.resident.reading_in(size, from);
        // Blocks are 64 KiB or 1 MiB: multiples of the page size.
        let bytes = match Mapped::new(file, from, (stop - from) as usize) {
            Ok(m) => m,
            Err(e) => {
                self.drop_entry(ikey, entry);
                return Err(io::Error::other(format!("cache entry is unreadable: {e}")));
            }
        };
        self.check_crcs(ikey, entry, from, &bytes)?;
        if start == 0 && end == size {
            entry.verified.store(true, Ordering::Relaxed);
        }
        Ok(())
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
    /// mapping pays only where nothing in user space reads the bytes. Checked reads of an
    /// entry read it into a buffer (the check reads it anyway; the next read runs on the
    /// engine's thread meanwhile); unchecked reads of more than [`SMALL_READ`], and every
    /// read with `--sendfile`, go mapped.
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
            self.mapped_stream(ikey, entry, span, None)
        }
    }

    /// A hit as slices of mappings of its file, a [`WINDOW`] at a time (windows aligned
    /// to [`WINDOW`] in the file). Each window is in the page cache before its bytes are
    /// touched or handed on (else read in on the blocking pool), so neither the check nor
    /// the socket's copy waits on the disk in the runtime. A checked hit checks a window
    /// only where its pages came from the disk since it was last checked whole
    /// ([`Residency`](super::resident::Residency)); with `--sendfile` the kernel reads the
    /// file itself, and every block is checked. `opened`: the entry's file, where the
    /// caller has it open already.
    fn mapped_stream(
        self: Arc<Self>,
        ikey: String,
        entry: Arc<Entry>,
        span: Span,
        opened: Option<File>,
    ) -> ByteStream {
        let stream = async_stream::try_stream! {
            if span.start < span.end {
                let file = Arc::new(match opened {
                    Some(f) => f,
                    None => File::open(&entry.path)?,
                });
                // A mapping read past the end of its file faults: the node never shortens
                // an entry file, only damage does, so check once here.
                let meta = file.metadata()?;
                if meta.len() < span.stop {
                    self.drop_entry(&ikey, &entry);
                    Err(io::Error::other("cache entry is shorter than its size"))?;
                }
                let trust = span.verify && !crate::io::sendfile::enabled();
                let (res, size) = (&entry.resident, span.size);
                if trust {
                    res.observe(size, &meta);
                }
                // Blocks are 64 KiB or 1 MiB: the step and the window are multiples.
                let mut pos = span.first_block();
                while pos < span.end {
                    let w = pos / WINDOW;
                    let full_end = ((w + 1) * WINDOW).min(size);
                    let window_end = full_end.min(span.stop);
                    // The whole window, kept for the next hits where the budget allows
                    // (and the file is whole); else the bytes this hit sends, for it.
                    let kept = if meta.len() >= full_end {
                        entry.maps.window(&self.maps, &file, w, w * WINDOW, full_end)
                    } else {
                        None
                    };
                    let map = match kept {
                        Some(k) => k,
                        None => Window::once(&file, pos, (window_end - pos) as usize)?,
                    };
                    let base = map.start();
                    let (from, to) = ((pos - base) as usize, (window_end - base) as usize);
                    let resident = map.mapped().resident_range(from, to);
                    let map = if resident {
                        map
                    } else {
                        let _reading = trust.then(|| res.reading_in(size, pos));
                        map.faulted_in(from, to).await?
                    };
                    if trust {
                        map.mapped().advise_random();
                    }
                    let earlier = trust && resident && res.checked(size, w as usize);
                    let check = span.verify && !earlier;
                    let generation = if check && trust { res.begin_check() } else { 0 };
                    let step = if check { CHECK_STEP } else { WINDOW };
                    let window = map.into_bytes();
                    let mut at = pos;
                    while at < window_end && at < span.end {
                        let to = (at + step).min(window_end);
                        let part = window.slice((at - base) as usize..(to - base) as usize);
                        if check {
                            self.check_crcs(&ikey, &entry, at, &part)?;
                        } else if earlier {
                            self.stats.add(Metric::BytesCheckedEarlier, part.len() as u64);
                        }
                        // Recorded before the last yield: the body may be dropped as soon
                        // as its last byte is taken.
                        if check && trust && pos == w * WINDOW && to == full_end {
                            res.mark(size, w as usize, generation);
                        }
                        if to >= span.end && span.verify && span.whole() {
                            entry.verified.store(true, Ordering::Relaxed);
                        }
                        let (lo, hi) = (span.start.max(at) - at, span.end.min(to) - at);
                        yield part.slice(lo as usize..hi as usize);
                        at = to;
                    }
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
                let file = Arc::new(File::open(&entry.path)?);
                // What these reads (and their readahead) bring in is checked here only.
                let _reading = entry.resident.reading_in(span.size, span.first_block());
                // Reads of up to 1 MiB over the span's whole blocks, each checked on
                // arrival.
                let read = |pos: u64| {
                    let len = (span.stop - pos).min(store::READ) as usize;
                    self.engine.read_at(file.clone(), pos, len)
                };
                let mut pos = span.first_block();
                // One read ahead: the next read runs while this one is checked and
                // sent, so a single stream keeps the disk and the socket both busy.
                let mut ahead = Some(read(pos));
                while pos < span.end {
                    let buf = match ahead.take() {
                        Some(r) => r.await?,
                        None => read(pos).await?,
                    };
                    if buf.is_empty() {
                        self.drop_entry(&ikey, &entry);
                        Err(io::Error::other("cache entry is shorter than its size"))?;
                    }
                    let next = pos + buf.len() as u64;
                    if next < span.end {
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
            }
        };
        Box::pin(stream)
    }
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
}
