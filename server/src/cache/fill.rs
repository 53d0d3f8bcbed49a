//! Cold reads: one backend fetch per object however many readers ask at once.
//!
//! The first reader of an absent object becomes the fill's leader: it fetches the object
//! from the backend and a spawned task writes it to a temp file, publishing how many bytes
//! are on disk. Every reader — the leader's client included — streams from that temp file
//! behind the writer, so the first byte does not wait for the last and late readers follow
//! the bytes already written. When the last byte is written the task appends the footer,
//! fsyncs and renames the file into the cache (the commit). A fill whose source fails
//! ends every reader's stream with an error: no reader sees a short body as complete. A
//! fill whose disk fails (full) does not fail its readers: each goes on from where it is
//! with a ranged read of the same version from the source ([`Resume`]).

use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch};

use super::store::{self, BlockSums};
use crate::backend::{ByteRange, ByteStream, ObjectMeta, Refusal, Source};
use crate::io::ReadEngine;

/// Bytes per read of a follower.
const FOLLOW_CHUNK: u64 = 256 << 10;
/// The most bytes one piece of a fill holds.
const PIECE_MAX: usize = 1 << 20;

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
    pub written: u64,
    /// The last piece written, at its offset: a follower caught up with the writer takes
    /// it from memory instead of reading back what was just written.
    pub tail: Option<(u64, Piece)>,
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
        let (tx, _) = watch::channel(FillState {
            phase: Phase::Starting,
            meta: None,
            written: 0,
            tail: None,
        });
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
        st.unwrap_or(FillState {
            phase: Phase::Abandoned,
            meta: None,
            written: 0,
            tail: None,
        })
    }
}

/// Bytes as the source sent them, in order: written to the temp file with one `writev`,
/// checked and handed to readers without being copied into a buffer of their own.
#[derive(Debug, Clone, Default)]
pub struct Piece(Arc<Vec<Bytes>>);

impl Piece {
    pub fn len(&self) -> u64 {
        self.0.iter().map(|b| b.len() as u64).sum()
    }

    /// Bytes `from..to` of the piece, as slices of its parts.
    fn slice(&self, from: u64, to: u64) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut at = 0u64;
        for part in self.0.iter() {
            let len = part.len() as u64;
            let (lo, hi) = (from.max(at), to.min(at + len));
            if lo < hi {
                out.push(part.slice((lo - at) as usize..(hi - at) as usize));
            }
            at += len;
        }
        out
    }
}

/// Writes every byte of `parts` to `file`.
fn write_parts(file: &mut File, parts: &[Bytes]) -> io::Result<()> {
    let mut slices: Vec<io::IoSlice<'_>> = parts.iter().map(|b| io::IoSlice::new(b)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = file.write_vectored(rest)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

/// The object a fill writes, named in its footer.
pub struct Commit {
    pub bucket: String,
    pub key: String,
}

/// Writes `body` into the fill's temp file on a blocking thread, publishing progress.
/// Returns the block checksums once every byte is durable, or the failure.
pub async fn write_body(
    fill: Arc<Fill>,
    mut file: File,
    meta: ObjectMeta,
    mut body: ByteStream,
    commit: Commit,
    on_bytes: impl Fn(u64) + Send + 'static,
) -> Result<Vec<u32>, FillError> {
    let (tx, mut rx) = mpsc::channel::<Piece>(8);
    let writer_fill = fill.clone();
    let size = meta.size;
    let writer = tokio::task::spawn_blocking(move || -> Result<Vec<u32>, FillError> {
        let mut sums = BlockSums::default();
        let mut written = 0u64;
        while let Some(piece) = rx.blocking_recv() {
            write_parts(&mut file, &piece.0).map_err(FillError::Disk)?;
            for part in piece.0.iter() {
                sums.update(part);
            }
            let at = written;
            written += piece.len();
            writer_fill.state.send_modify(|s| {
                s.written = written;
                s.tail = Some((at, piece));
            });
        }
        if written != size {
            return Err(FillError::Source(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the backend sent {written} of {size} bytes"),
            )));
        }
        let crcs = sums.finish();
        store::write_footer(&mut file, &commit.bucket, &commit.key, &meta, &crcs)
            .and_then(|()| file.sync_all())
            .map_err(FillError::Disk)?;
        Ok(crcs)
    });
    // Each piece is what the source has sent by the time it is handed over (up to
    // PIECE_MAX): the first bytes go to the readers as soon as they arrive, and under
    // load the chunks gather into pieces by themselves. No chunk is copied.
    let mut failure = None;
    let mut ended = false;
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
            match body.next().now_or_never() {
                Some(item) => next = item,
                None => break,
            }
        }
        if failure.is_some() {
            break;
        }
        if !parts.is_empty() && tx.send(Piece(Arc::new(parts))).await.is_err() {
            break;
        }
    }
    drop(tx);
    let result = writer
        .await
        .map_err(|e| FillError::Disk(io::Error::other(e)))?;
    match (failure, result) {
        // The disk failed first: the source's bytes were not wanted any more.
        (_, Err(FillError::Disk(e))) => Err(FillError::Disk(e)),
        (Some(e), _) => Err(FillError::Source(e)),
        (None, result) => result,
    }
}

/// Streams `[start, end)` of a fill's temp file, behind its writer.
pub fn follow(fill: Arc<Fill>, engine: Arc<dyn ReadEngine>, start: u64, end: u64) -> ByteStream {
    let stream = async_stream::try_stream! {
        let mut rx = fill.state.subscribe();
        let mut pos = start;
        while pos < end {
            let (ended, written, in_memory) = next_step(&mut rx, pos, end).await?;
            match ended {
                Some(Phase::DiskFailed(why)) => {
                    // The bytes are not lost, only the copy: the rest from the source.
                    let mut rest = resume(&fill, pos, end)
                        .await
                        .map_err(|e| io::Error::other(format!("cache fill failed: {why}; {e}")))?;
                    while let Some(chunk) = rest.next().await {
                        let chunk = chunk?;
                        pos += chunk.len() as u64;
                        yield chunk;
                    }
                    if pos < end {
                        Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the source ended short"))?;
                    }
                    break;
                }
                Some(Phase::Failed(why)) => {
                    Err(io::Error::other(format!("cache fill failed: {why}")))?;
                }
                _ => {}
            }
            if written <= pos {
                // Done or abandoned with fewer bytes than promised.
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "cache fill ended short"))?;
            }
            if let Some(parts) = in_memory {
                for chunk in parts {
                    pos += chunk.len() as u64;
                    yield chunk;
                }
                continue;
            }
            let file = fill
                .file
                .get()
                .cloned()
                .ok_or_else(|| io::Error::other("fill has no file"))?;
            let n = (written.min(end) - pos).min(FOLLOW_CHUNK);
            let chunk = engine.read_at(file, pos, n as usize).await?;
            pos += n;
            yield chunk;
        }
    };
    Box::pin(stream)
}

/// Waits until the writer is past `pos` or has ended; returns the failure if any
/// (`Failed` or `DiskFailed`), how many bytes are on disk, and the bytes at `pos` when
/// the writer's last piece holds them.
async fn next_step(
    rx: &mut watch::Receiver<FillState>,
    pos: u64,
    end: u64,
) -> io::Result<(Option<Phase>, u64, Option<Vec<Bytes>>)> {
    let st = rx
        .wait_for(|s| s.written > pos || s.phase != Phase::Filling)
        .await
        .map_err(|_| io::Error::other("the fill ended without a verdict"))?;
    let failed = match &st.phase {
        p @ (Phase::Failed(_) | Phase::DiskFailed(_)) => Some(p.clone()),
        _ => None,
    };
    Ok((failed, st.written, tail_slice(&st, pos, end)))
}

/// Bytes `pos..end` of a fill's object from where its readers go on from.
async fn resume(fill: &Fill, pos: u64, end: u64) -> io::Result<ByteStream> {
    let (src, bucket, key, on_bytes) = match fill.resume.get() {
        None => return Err(io::Error::other("no source to go on from")),
        Some(Resume::Memory(b)) => {
            let piece = b.slice(pos as usize..end as usize);
            return Ok(Box::pin(futures::stream::once(async move { Ok(piece) })));
        }
        Some(Resume::Source {
            src,
            bucket,
            key,
            on_bytes,
        }) => (src, bucket, key, on_bytes.clone()),
    };
    let etag = fill.state.borrow().meta.as_ref().map(|m| m.etag.clone());
    let exact = |m: &ObjectMeta| -> Result<Option<ByteRange>, Refusal> {
        if etag.as_deref() != Some(m.etag.as_str()) {
            return Err(Refusal::Changed(
                "the object changed while it was read; retry",
            ));
        }
        Ok(Some(ByteRange { start: pos, end }))
    };
    let (obj, _) = src
        .get_object(bucket, key, &exact)
        .await
        .map_err(io::Error::other)?;
    let counted = obj.body.map(move |item| {
        if let Ok(b) = &item {
            on_bytes(b.len() as u64);
        }
        item
    });
    Ok(Box::pin(counted))
}

/// The bytes from `pos` (up to `end`) when the writer's last piece holds them.
fn tail_slice(st: &FillState, pos: u64, end: u64) -> Option<Vec<Bytes>> {
    let (at, piece) = st.tail.as_ref()?;
    let piece_end = at + piece.len();
    if *at > pos || pos >= piece_end {
        return None;
    }
    Some(piece.slice(pos - at, end.min(piece_end) - at))
}

/// Whether a fill should be left alone by a reader starting at `start`: far ahead of
/// the writer, a direct backend read is quicker than waiting.
pub fn far_ahead(st: &FillState, start: u64) -> bool {
    const FAR: u64 = 32 << 20;
    st.phase == Phase::Filling && start > st.written + FAR
}

/// Ordering helper for the stale flag.
pub fn is_stale(fill: &Fill) -> bool {
    fill.stale.load(Ordering::Acquire)
}

/// The bytes `start..end` of a stream that begins at offset 0.
pub fn slice(body: ByteStream, start: u64, end: u64) -> ByteStream {
    let stream = async_stream::try_stream! {
        let mut body = body;
        let mut at = 0u64;
        while at < end {
            let Some(chunk) = futures::StreamExt::next(&mut body).await else {
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the body ended early"))?;
                break;
            };
            let chunk = chunk?;
            let len = chunk.len() as u64;
            let lo = start.saturating_sub(at).min(len);
            let hi = end.saturating_sub(at).min(len);
            if lo < hi {
                yield chunk.slice(lo as usize..hi as usize);
            }
            at += len;
        }
    };
    Box::pin(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn meta(size: u64) -> ObjectMeta {
        ObjectMeta {
            size,
            etag: "\"e\"".into(),
            last_modified: SystemTime::now(),
            headers: Vec::new(),
        }
    }

    async fn all(mut s: ByteStream) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(c) = s.next().await {
            out.extend_from_slice(&c?);
        }
        Ok(out)
    }

    /// A fill whose disk failed after 100,000 of 300,000 bytes, with its first bytes in
    /// the temp file.
    fn failed_fill(dir: &std::path::Path, data: &Bytes, phase: Phase) -> Arc<Fill> {
        let path = dir.join("fill");
        std::fs::write(&path, &data[..100_000]).unwrap();
        let fill = Fill::new();
        let _ = fill.file.set(Arc::new(File::open(&path).unwrap()));
        fill.state.send_modify(|s| {
            s.meta = Some(meta(data.len() as u64));
            s.phase = phase;
            s.written = 100_000;
        });
        fill
    }

    #[tokio::test]
    async fn readers_of_a_fill_whose_disk_failed_go_on_from_the_source_and_get_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let data = Bytes::from((0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        let engine = crate::io::engine(crate::io::EngineChoice::Std).unwrap();
        let fill = failed_fill(
            dir.path(),
            &data,
            Phase::DiskFailed("No space left on device".into()),
        );
        let _ = fill.resume.set(Resume::Memory(data.clone()));
        let whole = all(follow(fill.clone(), engine.clone(), 0, 300_000))
            .await
            .unwrap();
        assert_eq!(whole, data[..], "every byte, in order");
        let range = all(follow(fill.clone(), engine.clone(), 250_000, 260_000))
            .await
            .unwrap();
        assert_eq!(range, data[250_000..260_000]);

        // Without anywhere to go on from, the reader is told: never a short body.
        let bare = failed_fill(dir.path(), &data, Phase::DiskFailed("full".into()));
        assert!(all(follow(bare, engine.clone(), 0, 300_000)).await.is_err());
        // A source's failure is not gone around.
        let failed = failed_fill(dir.path(), &data, Phase::Failed("reset".into()));
        let _ = failed.resume.set(Resume::Memory(data.clone()));
        assert!(all(follow(failed, engine, 0, 300_000)).await.is_err());
    }
}
