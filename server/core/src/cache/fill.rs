//! Cold reads: one backend fetch per object however many readers ask at once.
//!
//! The first reader of an absent object becomes the fill's leader: it fetches the object
//! from the backend and a spawned task writes it to a temp file, publishing how many bytes
//! are on disk. Every reader — the leader's client included — streams behind the writer
//! (`follow`), so the first byte does not wait for the last and late readers follow the
//! bytes already written. When the last byte is written the task appends the footer,
//! fsyncs and renames the file into the cache (the commit). A fill whose source fails
//! ends every reader's stream with an error: no reader sees a short body as complete. A
//! fill whose disk fails (full) does not fail its readers: each goes on from where it is
//! with a ranged read of the same version from the source ([`Resume`]).
//!
//! The source's chunks are handed on as they came, gathered into pieces (never copied
//! into buffers of ours), checksummed, and kept in memory a little while ([`Recent`]) so
//! readers close behind the writer send them from the same memory. A large fill's file
//! is written around the page cache (`io::direct`: one copy into an aligned buffer, which
//! the device takes as it is): a third of the CPU of a write into the page cache and the
//! fsync that writes it back, and no dirty pages pushing out what hits read. The pieces
//! are written to the temp file with one `writev` where direct writes are off or refused.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch};

use super::room::{Room, Taken};
use super::store::{self, BlockSums};
use crate::backend::{ByteStream, ObjectMeta, Source};
use crate::io::direct::DirectWriter;
use crate::sync::Locked;

/// After the first piece (sent as soon as anything arrived), the source's chunks are
/// gathered into pieces of at least this much: fewer hand-overs to the writer and
/// wake-ups of readers per byte.
const PIECE_MIN: usize = 256 << 10;
/// The most bytes one piece holds.
const PIECE_MAX: usize = 1 << 20;
/// Pieces waiting for the writer: the memory a fill holds ahead of the disk.
const PIECES_QUEUED: usize = 2;
/// The longest a fill waits for its readers before it goes on without waiting again.
const PACE_WAIT: Duration = Duration::from_secs(1);
/// The bytes of the last pieces received that readers take from memory: two whole pieces,
/// so a reader a piece behind the source still sends from memory (from the temp file, a
/// direct fill's bytes are read from the disk).
const RECENT_MAX: u64 = 2 << 20;
/// A fill of at least this many bytes writes its file around the page cache, this many at
/// a time (`io::direct`).
const DIRECT_BUFFER: usize = 512 << 10;

/// Where a fill is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// The leader is asking the backend.
    Starting,
    /// Bytes are arriving; `FillState::meta` is known.
    Filling,
    /// All bytes are on disk (committed unless the entry was invalidated meanwhile).
    Done,
    /// The source failed; readers must not trust the partial file.
    Failed(String),
    /// This node's disk failed (full): readers go on from the source (see [`Resume`]).
    DiskFailed(String),
    /// The leader did not fill (not admitted, or its request failed before the body):
    /// other readers fetch on their own.
    Abandoned,
}

#[derive(Debug, Clone)]
pub struct FillState {
    pub phase: Phase,
    pub meta: Option<ObjectMeta>,
    /// Bytes the source has sent, handed to the writer (and to readers, from memory).
    pub received: u64,
    /// Bytes on disk.
    pub written: u64,
    /// The CRC32C of each block on disk: of every whole block written, and of the last
    /// one too once every byte is. Given with `written`, in one change, so a reader of
    /// the temp file checks whole blocks against their own checksums.
    pub sums: Vec<u32>,
    /// The last pieces received, at their offsets: a reader close behind takes them from
    /// memory, as soon as they arrive, instead of waiting for the disk and reading back
    /// what was just written.
    pub recent: Recent,
    /// Readers following the fill from memory, and the furthest byte any of them has
    /// taken: the source is read no further ahead of that reader than its bytes stay in
    /// `recent`.
    pub readers: usize,
    pub lead: u64,
}

impl FillState {
    fn new(phase: Phase) -> FillState {
        FillState {
            phase,
            meta: None,
            received: 0,
            written: 0,
            sums: Vec::new(),
            recent: Recent::default(),
            readers: 0,
            lead: 0,
        }
    }

    /// Takes the checksums in `crcs` (every block's from the first) that are new.
    fn add_sums(&mut self, crcs: &[u32]) {
        if let Some(new) = crcs.get(self.sums.len()..) {
            self.sums.extend_from_slice(new);
        }
    }
}

/// One object being filled.
pub struct Fill {
    pub state: watch::Sender<FillState>,
    /// The temp file, opened for reading before the first byte is written.
    pub file: std::sync::OnceLock<Arc<File>>,
    /// Set when the object was overwritten or deleted while filling: do not commit.
    pub stale: AtomicBool,
    /// Set when the bytes come from a peer rather than the backend.
    pub from_peer: AtomicBool,
    /// Where readers go on from when the disk fails.
    pub resume: std::sync::OnceLock<Resume>,
}

/// Where a fill's readers go on from when the disk fails.
pub enum Resume {
    /// The object's source, read from where the reader is, of the version being filled.
    Source {
        src: Arc<dyn Source>,
        bucket: String,
        key: String,
        /// Counts the bytes read from the source this way.
        on_bytes: Arc<dyn Fn(u64) + Send + Sync>,
    },
    /// The whole object, in memory (a computed one).
    Memory(Bytes),
}

/// Why a fill did not commit.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    /// The source failed or sent too few bytes.
    #[error("{0}")]
    Source(io::Error),
    /// This node's disk failed.
    #[error("{0}")]
    Disk(io::Error),
}

impl Fill {
    pub fn new() -> Arc<Fill> {
        let (tx, _) = watch::channel(FillState::new(Phase::Starting));
        Arc::new(Fill {
            state: tx,
            file: std::sync::OnceLock::new(),
            stale: AtomicBool::new(false),
            from_peer: AtomicBool::new(false),
            resume: std::sync::OnceLock::new(),
        })
    }

    pub fn set_phase(&self, phase: Phase) {
        self.state.send_modify(|s| s.phase = phase);
    }

    /// Waits until the fill has ended (committed, failed or abandoned).
    pub async fn ended(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx
            .wait_for(|s| !matches!(s.phase, Phase::Starting | Phase::Filling))
            .await;
    }

    /// Waits until the leader has decided; returns the state then.
    pub async fn started(&self) -> FillState {
        let mut rx = self.state.subscribe();
        let st = rx
            .wait_for(|s| s.phase != Phase::Starting)
            .await
            .map(|s| s.clone());
        st.unwrap_or(FillState::new(Phase::Abandoned))
    }
}

/// Bytes as the source sent them, in order: written to the temp file with one `writev`,
/// checked and handed to readers without being copied into a buffer of their own.
#[derive(Debug, Clone)]
pub struct Piece {
    parts: Arc<Vec<Bytes>>,
    len: u64,
}

impl Piece {
    fn new(parts: Vec<Bytes>) -> Piece {
        let len = parts.iter().map(|b| b.len() as u64).sum();
        Piece {
            parts: Arc::new(parts),
            len,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// Bytes `from..to` of the piece, as slices of its parts.
    fn slice(&self, from: u64, to: u64, out: &mut Vec<Bytes>) {
        let mut at = 0u64;
        for part in self.parts.iter() {
            let len = part.len() as u64;
            let (lo, hi) = (from.max(at), to.min(at + len));
            if lo < hi {
                out.push(part.slice((lo - at) as usize..(hi - at) as usize));
            }
            at += len;
        }
    }
}

/// The last pieces a fill wrote, at their offsets, up to [`RECENT_MAX`] bytes (and at
/// least the last one).
#[derive(Debug, Clone, Default)]
pub struct Recent {
    pieces: VecDeque<(u64, Piece)>,
    bytes: u64,
}

impl Recent {
    fn push(&mut self, at: u64, piece: Piece) {
        self.bytes += piece.len();
        self.pieces.push_back((at, piece));
        while self.bytes > RECENT_MAX && self.pieces.len() > 1 {
            if let Some((_, old)) = self.pieces.pop_front() {
                self.bytes -= old.len();
            }
        }
    }

    /// Whether the byte at `pos` is held.
    pub fn holds(&self, pos: u64) -> bool {
        self.pieces
            .iter()
            .any(|(at, p)| *at <= pos && pos < at + p.len())
    }

    /// The bytes from `pos` up to `end`, as far as the pieces held run on from `pos`.
    pub fn slice(&self, pos: u64, end: u64) -> Option<Vec<Bytes>> {
        let first = self
            .pieces
            .iter()
            .position(|(at, p)| *at <= pos && pos < at + p.len())?;
        let mut out = Vec::new();
        for (at, piece) in self.pieces.iter().skip(first) {
            if *at >= end {
                break;
            }
            piece.slice(pos.max(*at) - at, end.min(at + piece.len()) - at, &mut out);
        }
        Some(out)
    }
}

/// How a fill of `size` bytes writes `file`: around the page cache when `direct` and the
/// fill is large enough to fill the buffer.
pub fn writer(file: File, size: u64, direct: bool) -> DirectWriter {
    let buffer = if direct && size >= DIRECT_BUFFER as u64 {
        DIRECT_BUFFER
    } else {
        0
    };
    DirectWriter::new(file, buffer)
}

/// The object a fill writes, named in its footer.
pub struct Commit {
    pub bucket: String,
    pub key: String,
}

/// Writes `body` into the fill's temp file on a blocking thread, publishing progress,
/// taking its room from `room` a step ahead. Once the source has ended, `finish` is given
/// the outcome (the block checksums once every byte is durable, or the failure) on that
/// same thread, so a commit's rename and directory fsync wait there, not on a runtime
/// thread, without a hand-over to another; returns what `finish` returns.
#[allow(clippy::too_many_arguments)]
pub async fn write_body<R: Send + 'static>(
    fill: Arc<Fill>,
    room: Arc<Room>,
    out: DirectWriter,
    meta: ObjectMeta,
    mut body: ByteStream,
    commit: Commit,
    on_bytes: impl Fn(u64) + Send + 'static,
    finish: impl FnOnce(Result<Vec<u32>, FillError>) -> R + Send + 'static,
) -> Result<R, FillError> {
    let (tx, mut rx) = mpsc::channel::<Piece>(PIECES_QUEUED);
    // The source's failure, if any, sent once its body has ended.
    let (verdict_tx, verdict_rx) = tokio::sync::oneshot::channel::<Option<io::Error>>();
    // Taken by the writer; by this task only if the writer died first.
    let finish = Arc::new(std::sync::Mutex::new(Some(finish)));
    let writer_finish = finish.clone();
    let writer_fill = fill.clone();
    let size = meta.size;
    let writer = tokio::task::spawn_blocking(move || -> Option<R> {
        let written = write_file(&mut rx, out, &writer_fill, room, size, &meta, &commit);
        drop(rx);
        let failure = verdict_rx
            .blocking_recv()
            .unwrap_or_else(|_| Some(io::Error::other("the fill was given up")));
        let finish = writer_finish.locked().take()?;
        Some(finish(outcome(failure, written)))
    });
    let mut failure = None;
    let mut ended = false;
    let mut first = true;
    let mut paced = true;
    while !ended {
        let mut parts = Vec::new();
        let mut len = 0usize;
        let mut next = body.next().await;
        loop {
            match next {
                Some(Ok(chunk)) => {
                    on_bytes(chunk.len() as u64);
                    len += chunk.len();
                    if !chunk.is_empty() {
                        parts.push(chunk);
                    }
                }
                Some(Err(e)) => {
                    failure = Some(e);
                    ended = true;
                    break;
                }
                None => {
                    ended = true;
                    break;
                }
            }
            if len >= PIECE_MAX {
                break;
            }
            // The first piece leaves with what has arrived (the first byte waits for
            // nothing more); later ones gather to PIECE_MIN, taking at once whatever
            // else has arrived too.
            next = match body.next().now_or_never() {
                Some(item) => item,
                None if first || len >= PIECE_MIN => break,
                None => body.next().await,
            };
        }
        first = false;
        if failure.is_some() {
            break;
        }
        if parts.is_empty() {
            continue;
        }
        let piece = Piece::new(parts);
        if paced {
            paced = wait_for_readers(&fill).await;
        }
        // Readers have it now; the disk a moment later.
        fill.state.send_modify(|s| {
            let at = s.received;
            s.received += piece.len();
            s.recent.push(at, piece.clone());
        });
        if tx.send(piece).await.is_err() {
            break;
        }
    }
    let _ = verdict_tx.send(failure);
    drop(tx);
    match writer.await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(FillError::Disk(io::Error::other("the fill finished twice"))),
        // The writer died before it could finish: the fill is finished here, as failed.
        Err(e) => {
            let e = io::Error::other(e.to_string());
            match finish.locked().take() {
                Some(finish) => Ok(finish(Err(FillError::Disk(e)))),
                None => Err(FillError::Disk(e)),
            }
        }
    }
}

/// A fill's outcome: the disk's failure first (the source's bytes were not wanted any
/// more), then the source's, else what the writer made.
fn outcome(
    failure: Option<io::Error>,
    written: Result<Vec<u32>, FillError>,
) -> Result<Vec<u32>, FillError> {
    match (failure, written) {
        (_, Err(FillError::Disk(e))) => Err(FillError::Disk(e)),
        (Some(e), _) => Err(FillError::Source(e)),
        (None, written) => written,
    }
}

/// The writer's part of [`write_body`]: every piece into the file as it comes, progress
/// and whole blocks' checksums published, then the footer and the fsync.
fn write_file(
    rx: &mut mpsc::Receiver<Piece>,
    mut out: DirectWriter,
    writer_fill: &Fill,
    room: Arc<Room>,
    size: u64,
    meta: &ObjectMeta,
    commit: &Commit,
) -> Result<Vec<u32>, FillError> {
    let mut taken = Taken::new(room);
    let mut sums = BlockSums::default();
    let mut received = 0u64;
    while let Some(piece) = rx.blocking_recv() {
        taken.cover(out.file(), received + piece.len(), size);
        out.write(&piece.parts).map_err(FillError::Disk)?;
        for part in piece.parts.iter() {
            sums.update(part);
        }
        received += piece.len();
        // Only whole blocks in the file have their checksums given.
        let written = out.written();
        let blocks = ((written / store::BLOCK) as usize).min(sums.done().len());
        writer_fill.state.send_modify(|s| {
            s.written = written;
            s.add_sums(&sums.done()[..blocks]);
        });
    }
    if received != size {
        return Err(FillError::Source(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the backend sent {received} of {size} bytes"),
        )));
    }
    let mut file = out.finish().map_err(FillError::Disk)?;
    let crcs = sums.finish();
    writer_fill.state.send_modify(|s| {
        s.written = size;
        s.add_sums(&crcs);
    });
    store::write_footer(&mut file, &commit.bucket, &commit.key, meta, &crcs)
        .and_then(|()| file.sync_all())
        .map_err(FillError::Disk)?;
    Ok(crcs)
}

/// Waits until the furthest reader has taken every byte received so far, so the piece
/// about to be published is where it reads from memory next: a source faster than the
/// readers (a writer faster than their clients) would otherwise run past [`Recent`] and
/// leave every one of them to read back from the disk what was just written there.
/// Without readers nothing waits. Returns false when the readers kept it waiting
/// [`PACE_WAIT`]: the fill goes on at the source's pace from then on.
async fn wait_for_readers(fill: &Fill) -> bool {
    let close = |s: &FillState| s.readers == 0 || s.received <= s.lead;
    if close(&fill.state.borrow()) {
        return true;
    }
    let mut rx = fill.state.subscribe();
    let waited = tokio::time::timeout(PACE_WAIT, rx.wait_for(close)).await;
    waited.is_ok()
}

/// Ordering helper for the stale flag.
pub fn is_stale(fill: &Fill) -> bool {
    fill.stale.load(Ordering::Acquire)
}
