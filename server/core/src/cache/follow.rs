//! Readers of a fill: every reader of an object being filled — the leader's client
//! included — streams behind the writer. Bytes the writer wrote a moment ago come from
//! its memory ([`Recent`](super::fill::Recent)); older ones from the temp file, mapped
//! (no copy in user space), its pages locked in memory, and checked block by block
//! against the checksums the writer computed from the source's bytes, so a block
//! damaged in the temp file is never sent.
//! When this node's disk fails, a reader goes on from the source ([`Resume`]).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::watch;

use super::fill::{Fill, FillState, Phase, Resume};
use super::store::BLOCK;
use crate::backend::{ByteRange, ByteStream, ObjectMeta, Refusal};
use crate::io::crc;
use crate::io::sendfile::FileBytes;

/// What a reader maps of the temp file at a time.
const WINDOW: u64 = 1 << 20;

/// Streams `[start, end)` of a fill's object, behind its writer.
pub fn follow(fill: Arc<Fill>, start: u64, end: u64) -> ByteStream {
    let stream = async_stream::try_stream! {
        let mut rx = fill.state.subscribe();
        // Counted from the start where the source has reached its first byte (the
        // leader's client), else once it takes bytes from memory: a reader waiting ahead
        // of the source does not hold the fill back.
        let behind = start <= fill.state.borrow().received;
        let mut reading = behind.then(|| Reading::new(&fill));
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
            if let Some(parts) = in_memory {
                for chunk in parts {
                    pos += chunk.len() as u64;
                    yield chunk;
                }
                // Taken: the fill may read on.
                reading.get_or_insert_with(|| Reading::new(&fill));
                fill.state.send_if_modified(|s| {
                    let further = pos > s.lead;
                    s.lead = s.lead.max(pos);
                    further
                });
                continue;
            }
            match read_back(&fill, pos, end.min(written)).await? {
                Some(chunk) => {
                    pos += chunk.len() as u64;
                    yield chunk;
                }
                // The block at `pos` is not whole yet: wait for the writer.
                None => {
                    rx.changed()
                        .await
                        .map_err(|_| io::Error::other("the fill ended without a verdict"))?;
                }
            }
        }
    };
    Box::pin(stream)
}

/// A reader counted in [`FillState::readers`] while it follows.
struct Reading(Arc<Fill>);

impl Reading {
    fn new(fill: &Arc<Fill>) -> Reading {
        fill.state.send_modify(|s| s.readers += 1);
        Reading(fill.clone())
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.state.send_modify(|s| s.readers -= 1);
    }
}

/// Waits until the bytes at `pos` are in memory or on disk, or the fill has ended;
/// returns the failure if any (`Failed` or `DiskFailed`), how many bytes are on disk,
/// and the bytes from `pos` when they are still in memory. A fill that ended without
/// them is an error: never a short body.
async fn next_step(
    rx: &mut watch::Receiver<FillState>,
    pos: u64,
    end: u64,
) -> io::Result<(Option<Phase>, u64, Option<Vec<Bytes>>)> {
    let st = rx
        .wait_for(|s| {
            s.written > pos
                || (s.received > pos && s.recent.holds(pos))
                || s.phase != Phase::Filling
        })
        .await
        .map_err(|_| io::Error::other("the fill ended without a verdict"))?;
    let failed = match &st.phase {
        p @ (Phase::Failed(_) | Phase::DiskFailed(_)) => Some(p.clone()),
        _ => None,
    };
    let in_memory = st.recent.slice(pos, end);
    if failed.is_none() && in_memory.is_none() && st.written <= pos {
        // Done or abandoned with fewer bytes than promised.
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "cache fill ended short",
        ));
    }
    Ok((failed, st.written, in_memory))
}

/// Bytes of the temp file from `pos` (up to `to`, at most a window), as a slice of a
/// mapping of it, every block checked against the writer's checksum first. `None` when
/// the block holding `pos` is not whole on disk yet. A block that fails its check ends
/// the read, and the fill is not committed.
async fn read_back(fill: &Fill, pos: u64, to: u64) -> io::Result<Option<Bytes>> {
    let file = fill
        .file
        .get()
        .cloned()
        .ok_or_else(|| io::Error::other("fill has no file"))?;
    let first = pos / BLOCK;
    let from = first * BLOCK;
    // The blocks with a checksum are on disk (the writer gives both in one change), up
    // to `to`'s block and a window.
    let (stop, sums) = {
        let st = fill.state.borrow();
        let known = st.sums.get(first as usize..).unwrap_or_default();
        let stop = (from + known.len() as u64 * BLOCK)
            .min(st.written)
            .min(to.div_ceil(BLOCK) * BLOCK)
            .min(from + WINDOW);
        let n = stop.saturating_sub(from).div_ceil(BLOCK) as usize;
        (stop, known[..n.min(known.len())].to_vec())
    };
    if stop <= pos {
        return Ok(None);
    }
    // What is checked must be what leaves: the mapping's pages locked first, so that
    // none is reclaimed and read in again unchecked before the socket takes it
    // (unmapping unlocks them); where the lock is refused, the bytes copied out, and the
    // copy checked and sent.
    let map = FileBytes::new(file, from, (stop - from) as usize)?;
    let bytes = tokio::task::spawn_blocking(move || match map.mapped().lock() {
        Ok(()) => map.into_bytes(),
        Err(_) => Bytes::copy_from_slice(map.mapped()),
    })
    .await
    .map_err(io::Error::other)?;
    for (i, block) in bytes.chunks(BLOCK as usize).enumerate() {
        if crc::crc32c(block) != sums[i] {
            tracing::error!(
                block = first as usize + i,
                "a cache fill's temp file failed its checksum; not committing it"
            );
            fill.stale.store(true, Ordering::Release);
            return Err(io::Error::other(
                "cache fill's temp file failed its checksum",
            ));
        }
    }
    Ok(Some(bytes.slice(
        (pos - from) as usize..(stop.min(to) - from) as usize,
    )))
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

/// Whether a fill should be left alone by a reader starting at `start`: far ahead of
/// the writer, a direct backend read is quicker than waiting.
pub fn far_ahead(st: &FillState, start: u64) -> bool {
    const FAR: u64 = 32 << 20;
    st.phase == Phase::Filling && start > st.received.max(st.written) + FAR
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
    use crate::cache::fill::{write_body, writer as fill_writer, Commit};
    use crate::cache::room::Room;
    use std::fs::File;
    use std::time::SystemTime;

    fn meta(size: u64) -> ObjectMeta {
        ObjectMeta {
            size,
            etag: "\"e\"".into(),
            last_modified: SystemTime::now(),
            headers: Vec::new(),
        }
    }

    fn data(len: usize) -> Bytes {
        Bytes::from((0..len as u32).map(|i| (i % 251) as u8).collect::<Vec<_>>())
    }

    async fn all(mut s: ByteStream) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(c) = s.next().await {
            out.extend_from_slice(&c?);
        }
        Ok(out)
    }

    /// A fill of `written` bytes of `data` in a temp file, with their checksums known.
    fn fill_of(dir: &std::path::Path, data: &Bytes, written: usize, phase: Phase) -> Arc<Fill> {
        let path = dir.join(format!("fill-{written}-{}", data.len()));
        std::fs::write(&path, &data[..written]).unwrap();
        let fill = Fill::new();
        let _ = fill.file.set(Arc::new(File::open(&path).unwrap()));
        let whole = written / BLOCK as usize * BLOCK as usize;
        fill.state.send_modify(|s| {
            s.meta = Some(meta(data.len() as u64));
            s.phase = phase;
            s.written = written as u64;
            s.sums = data[..whole]
                .chunks(BLOCK as usize)
                .map(crc::crc32c)
                .collect();
        });
        fill
    }

    /// A fill of `data` under way: the fill, and its writer (not started until awaited),
    /// fed by a source that sends `chunk` bytes at a time, a little at a time.
    fn filling(
        dir: &std::path::Path,
        data: &Bytes,
        chunk: usize,
    ) -> (
        Arc<Fill>,
        impl std::future::Future<Output = Result<Vec<u32>, crate::cache::fill::FillError>>,
    ) {
        let size = data.len() as u64;
        let path = dir.join("fill");
        let writer = File::create(&path).unwrap();
        let fill = Fill::new();
        let _ = fill.file.set(Arc::new(File::open(&path).unwrap()));
        fill.state.send_modify(|s| {
            s.meta = Some(meta(size));
            s.phase = Phase::Filling;
        });
        let chunks: Vec<io::Result<Bytes>> = data
            .chunks(chunk)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let body: ByteStream = Box::pin(futures::stream::iter(chunks).then(|c| async {
            tokio::task::yield_now().await;
            c
        }));
        let commit = Commit {
            bucket: "b".into(),
            key: "k".into(),
        };
        let write = write_body(
            fill.clone(),
            Arc::new(Room::new(dir)),
            fill_writer(writer, size, true),
            meta(size),
            body,
            commit,
            |_| {},
            |written| written,
        );
        (fill, async move { write.await.and_then(|written| written) })
    }

    #[tokio::test]
    async fn readers_of_a_fill_whose_disk_failed_go_on_from_the_source_and_get_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let data = data(300_000);
        let disk_failed = Phase::DiskFailed("No space left on device".into());
        let fill = fill_of(dir.path(), &data, 100_000, disk_failed.clone());
        let _ = fill.resume.set(Resume::Memory(data.clone()));
        let whole = all(follow(fill.clone(), 0, 300_000)).await.unwrap();
        assert_eq!(whole, data[..], "every byte, in order");
        let range = all(follow(fill.clone(), 250_000, 260_000)).await.unwrap();
        assert_eq!(range, data[250_000..260_000]);

        // Without anywhere to go on from, the reader is told: never a short body.
        let bare = fill_of(dir.path(), &data, 100_000, Phase::DiskFailed("full".into()));
        assert!(all(follow(bare, 0, 300_000)).await.is_err());
        // A source's failure is not gone around.
        let failed = fill_of(dir.path(), &data, 100_000, Phase::Failed("reset".into()));
        let _ = failed.resume.set(Resume::Memory(data.clone()));
        assert!(all(follow(failed, 0, 300_000)).await.is_err());
    }

    /// Readers at every distance behind the writer get every byte: from its memory close
    /// behind, from the temp file (checked) further back, ranges included.
    #[tokio::test]
    async fn readers_behind_the_writer_get_every_byte_from_memory_or_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let size = (7 << 20) + 12_345;
        let data = data(size);
        // The source sends 100 KiB chunks, a little at a time.
        let (fill, write) = filling(dir.path(), &data, 100 << 10);
        let early = tokio::spawn(all(follow(fill.clone(), 0, size as u64)));
        let crcs = write.await.unwrap();
        fill.set_phase(Phase::Done);
        assert_eq!(crcs.len(), size.div_ceil(BLOCK as usize));
        assert_eq!(
            early.await.unwrap().unwrap(),
            data[..],
            "close behind the writer"
        );
        // After the writer moved on: from the temp file, past the pieces it still holds.
        let late = all(follow(fill.clone(), 0, size as u64)).await.unwrap();
        assert_eq!(late, data[..], "from the file");
        let range = all(follow(fill.clone(), 65_535, 3 << 20)).await.unwrap();
        assert_eq!(range, data[65_535..3 << 20]);
        assert!(!fill.stale.load(Ordering::Acquire));
    }

    /// The writer says how far it has written in the same change as it gives the blocks'
    /// checksums: whatever a reader sees, the checksums are of blocks on disk (whole ones
    /// until the last byte is written), so no part of a block is checked against a whole
    /// one's checksum (which would look like damage); readers get every byte.
    #[tokio::test]
    async fn a_fills_checksums_are_of_blocks_on_disk_whenever_a_reader_looks() {
        let dir = tempfile::tempdir().unwrap();
        let size = (1 << 20) + 12_345;
        let data = data(size);
        // 100,000-byte chunks: every piece ends inside a block.
        let (fill, write) = filling(dir.path(), &data, 100_000);
        let blocks = size.div_ceil(BLOCK as usize);
        let mut rx = fill.state.subscribe();
        let watcher = tokio::spawn(async move {
            let mut seen = 0;
            loop {
                {
                    let st = rx.borrow_and_update();
                    let (n, written) = (st.sums.len() as u64, st.written);
                    assert!(
                        n * BLOCK <= written || (written == size as u64 && n == blocks as u64),
                        "{n} checksums with {written} bytes written"
                    );
                    seen += 1;
                    if n == blocks as u64 {
                        return seen;
                    }
                }
                rx.changed().await.unwrap();
            }
        });
        let reader = tokio::spawn(all(follow(fill.clone(), 0, size as u64)));
        write.await.unwrap();
        fill.set_phase(Phase::Done);
        assert!(watcher.await.unwrap() > 1, "states seen as the writer went");
        assert_eq!(reader.await.unwrap().unwrap(), data[..]);
        let late = all(follow(fill.clone(), 0, size as u64)).await.unwrap();
        assert_eq!(late, data[..], "from the file, every block checked");
        assert!(
            !fill.stale.load(Ordering::Acquire),
            "no block looked damaged"
        );
    }

    /// A block damaged in the temp file after it was written is never sent: the read
    /// ends before it, and the fill is not committed.
    #[tokio::test]
    async fn a_block_damaged_in_the_temp_file_is_never_sent() {
        let dir = tempfile::tempdir().unwrap();
        let data = data(1 << 20);
        let fill = fill_of(dir.path(), &data, 1 << 20, Phase::Filling);
        let path = dir.path().join(format!("fill-{}-{}", 1 << 20, 1 << 20));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[(3 << 16) + 7] ^= 0x5a;
        std::fs::write(&path, &bytes).unwrap();
        let mut s = follow(fill.clone(), 0, 1 << 20);
        let mut sent = 0usize;
        let mut failed = false;
        while let Some(c) = s.next().await {
            match c {
                Ok(b) => {
                    assert_eq!(b[..], data[sent..sent + b.len()], "only good bytes");
                    sent += b.len();
                }
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        assert!(
            failed && sent < 3 << 16,
            "sent {sent} bytes, failed: {failed}"
        );
        assert!(fill.stale.load(Ordering::Acquire), "not committed");
    }
}
