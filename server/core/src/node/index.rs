//! Indexing a shard for a catalog: its samples and where each lies, read as cheaply as
//! the shard allows.
//!
//! - A `.tar` this node holds: the member index of its cache entry (built once).
//! - A `.tar` it does not hold: its headers, by range reads of the backend (one request
//!   each, pinned to the version), in one of two ways chosen per shard. Hopping reads a
//!   small window at each header (1 KiB; doubled while reads keep continuing one
//!   another), so
//!   a member of 64 KiB costs about 1.5% of its bytes, but a request; reading through
//!   takes the shard in 8 MiB windows: all its bytes, few requests. A shard starts
//!   hopping; once its first members are passed ([`MEASURE`]), the share of bytes
//!   hopping read decides the rest: at most [`HOP_SHARE`], it goes on hopping (large
//!   members: the backend serves a few percent of the dataset to catalogue it); more
//!   (small members, whose headers lie close together), it reads through. Bytes come
//!   first because the backend is what a dataset larger than the cache waits on; on a
//!   store close by with a high request latency, reading through would be quicker
//!   (BENCHMARKS.md measures both).
//! - A compressed shard: read whole (through the cache, which keeps it), its headers
//!   noted as the decompressed bytes pass.
//!
//! Every read asks for the version catalogued: a shard changed meanwhile fails its
//! index, and the catalog is built again for the new version.

use std::io::{self, Read, Seek, SeekFrom};
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use granary_proto::shards::{is_compressed, sample_spans, CatalogShard};

use super::{Node, NodeError, ReadRequest};
use crate::backend::{Backend, ByteRange};
use crate::cluster::calls::ShardRef;
use crate::stats::Metric;

/// The window a read takes at a header it jumped to.
const HOP: u64 = 1 << 10;
/// The largest window, reached by reads that keep continuing one another, and the
/// window of a shard read through.
const MAX_WINDOW: u64 = 8 << 20;
/// Members passed over (or bytes covered) before a shard's way is chosen.
pub const MEASURE: (u64, u64) = (16, 4 << 20);
/// The most of a shard's bytes hopping may read for it to go on hopping.
pub const HOP_SHARE: f64 = 0.05;

/// How a shard's headers are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Hopping, until the first members are passed.
    Measuring,
    Hop,
    Through,
}

impl Node {
    /// The samples of one shard, in the version `s` names.
    pub async fn index_shard(
        self: &Arc<Self>,
        bucket: &str,
        s: &ShardRef,
    ) -> Result<CatalogShard, NodeError> {
        let members = if is_compressed(&s.key) {
            self.members_read_through(bucket, s).await?
        } else if let Some((meta, idx)) = self
            .cache
            .tar_index(&*self.backend, bucket, &s.key)
            .await?
            .filter(|(meta, _)| meta.etag == s.etag)
        {
            debug_assert_eq!(meta.size, s.size);
            crate::archive::in_order(&idx)
                .into_iter()
                .map(|(name, m)| (name.clone(), m.offset, m.size))
                .collect()
        } else {
            self.members_by_headers(bucket, s).await?
        };
        self.stats.add(Metric::ShardsIndexed, 1);
        Ok(CatalogShard::of_spans(
            &s.key,
            &s.etag,
            s.size,
            &sample_spans(members),
        ))
    }

    /// Indexes `shards` here, a few at once, in their order.
    pub async fn index_shards(
        self: &Arc<Self>,
        bucket: &str,
        shards: &[ShardRef],
    ) -> Result<Vec<CatalogShard>, NodeError> {
        let each: Vec<_> = shards.iter().map(|s| self.index_shard(bucket, s)).collect();
        futures::stream::iter(each)
            .buffered(INDEXING_PARALLEL)
            .try_collect()
            .await
    }

    /// A compressed shard's members: the shard read whole through the cache, its
    /// decompressed stream walked.
    async fn members_read_through(
        self: &Arc<Self>,
        bucket: &str,
        s: &ShardRef,
    ) -> Result<Vec<(String, u64, u64)>, NodeError> {
        let mut req = ReadRequest::object(bucket, &s.key);
        req.conditions.if_match = Some(format!("\"{}\"", s.etag));
        let body = self.read(&req).await?.body.into_stream();
        let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(
            body.map_err(io::Error::other),
        ));
        tokio::task::spawn_blocking(move || {
            crate::archive::members_streamed(flate2::read::MultiGzDecoder::new(reader))
        })
        .await
        .map_err(|e| NodeError::Cut(e.to_string()))?
        .map_err(|e| NodeError::NotAShard(e.to_string()))
    }

    /// A `.tar`'s members, its headers read by range from the backend.
    async fn members_by_headers(
        &self,
        bucket: &str,
        s: &ShardRef,
    ) -> Result<Vec<(String, u64, u64)>, NodeError> {
        let mut r = Ranged {
            rt: tokio::runtime::Handle::current(),
            src: self.backend.clone(),
            bucket: bucket.to_owned(),
            key: s.key.clone(),
            etag: s.etag.clone(),
            size: s.size,
            pos: 0,
            window: Bytes::new(),
            at: 0,
            next: HOP,
            reads: 0,
            read: 0,
            failed: None,
            way: Way::Measuring,
            skips: 0,
            streak: 0,
        };
        let (listed, r) = tokio::task::spawn_blocking(move || {
            let listed = crate::archive::members_of(&mut r);
            (listed, r)
        })
        .await
        .map_err(|e| NodeError::Cut(e.to_string()))?;
        self.stats.add(Metric::BytesFromBackend, r.read);
        tracing::debug!(key = %s.key, way = ?r.way, reads = r.reads, bytes = r.read, size = s.size, "shard indexed by its headers");
        if let Some(e) = r.failed {
            return Err(e);
        }
        listed.map_err(|e| NodeError::NotAShard(e.to_string()))
    }
}

/// Shards one node indexes at once.
pub const INDEXING_PARALLEL: usize = 8;

/// A shard in the backend, readable and seekable, each read a range request of the
/// version catalogued (run on the blocking pool: it waits on the runtime).
struct Ranged {
    rt: tokio::runtime::Handle,
    src: Arc<dyn Backend>,
    bucket: String,
    key: String,
    etag: String,
    size: u64,
    pos: u64,
    /// The bytes of the last read, from offset `at`.
    window: Bytes,
    at: u64,
    /// The size of the next read's window.
    next: u64,
    /// Reads made, and bytes they brought.
    reads: u64,
    read: u64,
    /// Why a read failed, as the node says it (the tar parser sees an I/O error).
    failed: Option<NodeError>,
    way: Way,
    /// Forward seeks: members whose data the parser passed over.
    skips: u64,
    /// Reads in a row that each continued the one before.
    streak: u32,
}

impl Ranged {
    /// The window of the next read.
    fn window_for_next(&mut self) -> u64 {
        let continues = self.pos == self.at + self.window.len() as u64 && self.reads > 0;
        // Three reads in a row that each continued the last: many small members close
        // together, a window twice as large. Fewer are the headers after a sample's
        // small members (a label, a caption): another hop's worth each.
        self.streak = if continues { self.streak + 1 } else { 0 };
        match self.way {
            Way::Through => MAX_WINDOW,
            Way::Measuring | Way::Hop if self.streak >= 3 => (self.next * 2).min(MAX_WINDOW),
            Way::Measuring | Way::Hop => HOP,
        }
    }

    /// Once the first members are passed: the way for the rest of the shard.
    fn choose(&mut self) {
        let share = self.read as f64 / self.pos.max(1) as f64;
        self.way = if share <= HOP_SHARE {
            Way::Hop
        } else {
            Way::Through
        };
        tracing::debug!(key = %self.key, way = ?self.way, share, "indexing way chosen");
    }

    fn fetch(&mut self) -> io::Result<()> {
        if self.way == Way::Measuring && (self.skips >= MEASURE.0 || self.pos >= MEASURE.1) {
            self.choose();
        }
        self.next = self.window_for_next();
        let range = ByteRange {
            start: self.pos,
            end: (self.pos + self.next).min(self.size),
        };
        let (src, bucket, key) = (self.src.clone(), self.bucket.clone(), self.key.clone());
        let etag = self.etag.clone();
        let got = self.rt.block_on(async move {
            let mut body = src.get_range(&bucket, &key, &etag, range).await?;
            let mut out = bytes::BytesMut::with_capacity(range.len() as usize);
            while let Some(chunk) = body.next().await {
                out.extend_from_slice(&chunk.map_err(crate::backend::BackendError::Body)?);
            }
            Ok::<_, crate::backend::BackendError>(out.freeze())
        });
        match got {
            Ok(bytes) if bytes.len() as u64 == range.len() => {
                self.reads += 1;
                self.read += bytes.len() as u64;
                self.at = range.start;
                self.window = bytes;
                Ok(())
            }
            Ok(_) => {
                let e = io::Error::new(io::ErrorKind::UnexpectedEof, "a short range read");
                self.failed = Some(NodeError::Cut(e.to_string()));
                Err(e)
            }
            Err(e) => {
                let io = io::Error::other(e.to_string());
                self.failed = Some(e.into());
                Err(io)
            }
        }
    }
}

impl Read for Ranged {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.size || buf.is_empty() {
            return Ok(0);
        }
        let inside = self.pos >= self.at && self.pos < self.at + self.window.len() as u64;
        if !inside {
            self.fetch()?;
        }
        let from = (self.pos - self.at) as usize;
        let n = buf.len().min(self.window.len() - from);
        buf[..n].copy_from_slice(&self.window[from..from + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for Ranged {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
        };
        let pos = pos.ok_or_else(|| io::Error::other("a seek before the start"))?;
        if pos > self.pos {
            self.skips += 1;
        }
        self.pos = pos;
        Ok(self.pos)
    }
}
