//! The node's disk cache in front of the backend: reads are answered from a committed
//! entry (`hit`), from a fill in progress that admits the object (`miss`), or straight
//! from the backend when the policy does not admit it (`bypass`). Writes through the node
//! invalidate the entry. See `fill` for the cold-read path, `store` for the files,
//! `index` for the policies and their accounting.

mod fill;
mod index;
mod store;
mod write;

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;

use crate::backend::{
    Backend, BackendError, ByteRange, ByteStream, GetObject, ObjectMeta, RangeFn,
};
use crate::config::CachePolicy;
use crate::error::S3Error;
use crate::io::ReadEngine;
use crate::stats::Stats;
use fill::{Fill, Phase};
use index::{Entry, Index};

pub use fill::slice as fill_slice;
pub use index::Usage;

/// Where the bytes of a read came from (`x-granary-cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Hit,
    Miss,
    Peer,
    Bypass,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Hit => "hit",
            Source::Miss => "miss",
            Source::Peer => "peer",
            Source::Bypass => "bypass",
        }
    }
}

/// Other nodes that may hold a committed copy of an object (the cluster).
#[async_trait::async_trait]
pub trait Peers: Send + Sync {
    /// A peer's committed copy: its metadata and the whole body.
    async fn peer_copy(&self, bucket: &str, key: &str) -> Option<(ObjectMeta, ByteStream)>;
}

#[async_trait::async_trait]
impl Peers for crate::cluster::Cluster {
    async fn peer_copy(&self, bucket: &str, key: &str) -> Option<(ObjectMeta, ByteStream)> {
        crate::cluster::Cluster::peer_copy(self, bucket, key).await
    }
}

/// A committed entry's file for a client on this node: the file's bytes from `offset`,
/// `len` of them, are the range asked (the object starts at 0; the checksums and
/// metadata follow it). Entry files are never written after their commit, so the bytes
/// stay valid while the file is open, even if the entry is replaced or removed.
pub struct LocalFile {
    pub file: File,
    pub meta: ObjectMeta,
    pub offset: u64,
    pub len: u64,
}

/// An object read: metadata, the bytes of the resolved range, and their source.
pub struct Read {
    pub meta: ObjectMeta,
    pub range: Option<ByteRange>,
    pub body: ByteStream,
    pub source: Source,
}

pub struct Cache {
    objects: PathBuf,
    tmp: PathBuf,
    index: Mutex<Index>,
    fills: Mutex<HashMap<String, Arc<Fill>>>,
    verify_reads: bool,
    engine: Arc<dyn ReadEngine>,
    stats: Arc<Stats>,
    policy: CachePolicy,
    /// Bytes of small, verified entries kept in memory: a hit on them skips the open and
    /// the read. Keyed like the index; dropped with the entry.
    hot: moka::sync::Cache<String, (Arc<Entry>, Bytes)>,
    /// Writes through this node in progress, per key (locked only under the fills lock).
    writes: Mutex<write::Writes>,
    /// Where a miss looks before the backend.
    peers: std::sync::OnceLock<Arc<dyn Peers>>,
    /// Member indexes of cached `.tar` entries, built on first use, dropped with the entry
    /// (keyed like the index; an index of another entry of the key is rebuilt).
    tar_indexes: moka::sync::Cache<String, (Arc<Entry>, Arc<crate::archive::TarIndex>)>,
    /// Set when never-evict refuses an object for want of room; cleared when an entry
    /// is removed.
    refusing: AtomicBool,
    /// Entries checked before this generation are checked against the backend before
    /// they are served. 0 (nothing to check) on a single node.
    generation: std::sync::atomic::AtomicU64,
}

/// Entries up to this size are kept in memory once read whole.
const HOT_MAX_OBJECT: u64 = 256 << 10;
/// Memory for hot small objects.
const HOT_CAPACITY: u64 = 256 << 20;
/// Memory for the member indexes of cached tar shards (about 48 bytes and the name per
/// member: a million members in 64 MiB at 20-byte names).
const TAR_INDEX_CAPACITY: u64 = 64 << 20;

impl Cache {
    /// Opens the cache under `dir`, rebuilding the index from the entries on disk.
    /// Temp files of fills a killed process left are removed; files that are not whole
    /// entries are removed too. `capacity == 0` disables admission.
    pub fn open(
        dir: &Path,
        capacity: u64,
        policy: CachePolicy,
        verify_reads: bool,
        engine: Arc<dyn ReadEngine>,
        stats: Arc<Stats>,
    ) -> io::Result<Cache> {
        let objects = dir.join("objects");
        let tmp = dir.join("tmp");
        let mut index = Index::new(policy, capacity);
        for path in store::scan(&objects, &tmp)? {
            let loaded = File::open(&path).and_then(|f| store::read_footer(&f));
            match loaded {
                Ok(Some(l)) if store::entry_path(&objects, &l.bucket, &l.key) == path => {
                    index.insert(
                        index::key_of(&l.bucket, &l.key),
                        Entry {
                            path,
                            meta: l.meta,
                            crcs: Arc::from(l.crcs),
                            verified: AtomicBool::new(false),
                            // Loaded from disk: checked against the backend before its
                            // first hit once the cache knows it is in a cluster.
                            checked: std::sync::atomic::AtomicU64::new(0),
                        },
                    );
                }
                _ => {
                    tracing::warn!(path = %path.display(), "dropping a damaged cache entry");
                    let _ = fs::remove_file(&path);
                }
            }
        }
        let u = index.usage();
        tracing::info!(
            objects = u.objects,
            used = u.used,
            capacity,
            policy = policy.as_str(),
            "cache index loaded"
        );
        Ok(Cache {
            objects,
            tmp,
            index: Mutex::new(index),
            fills: Mutex::new(HashMap::new()),
            verify_reads,
            engine,
            stats,
            policy,
            hot: moka::sync::Cache::builder()
                .max_capacity(HOT_CAPACITY)
                .weigher(|_, (_, b): &(Arc<Entry>, Bytes)| b.len().try_into().unwrap_or(u32::MAX))
                .build(),
            writes: Mutex::new(write::Writes::default()),
            peers: std::sync::OnceLock::new(),
            tar_indexes: moka::sync::Cache::builder()
                .max_capacity(TAR_INDEX_CAPACITY)
                .weigher(
                    |_, (_, idx): &(Arc<Entry>, Arc<crate::archive::TarIndex>)| {
                        let bytes: usize = idx.keys().map(|k| k.len() + 48).sum();
                        bytes.try_into().unwrap_or(u32::MAX)
                    },
                )
                .build(),
            refusing: AtomicBool::new(false),
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Lets misses fill from peers that hold the object before the backend. In a
    /// cluster, writes may have happened through other nodes while this one was away, so
    /// entries it restarted with are checked against the backend before their first hit.
    pub fn set_peers(&self, peers: Arc<dyn Peers>) {
        let _ = self.peers.set(peers);
        self.revalidate_all();
    }

    /// Every entry is checked against the backend (one HEAD: same ETag and size) before
    /// its next hit: for a node that was cut off from its cluster, which may have missed
    /// the invalidations of writes made through other nodes meanwhile.
    pub fn revalidate_all(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The member index of a committed entry of a `.tar` object, built on first use:
    /// `None` when the object is not cached here.
    pub async fn tar_index(
        &self,
        backend: &Arc<dyn Backend>,
        bucket: &str,
        key: &str,
    ) -> Result<Option<(ObjectMeta, Arc<crate::archive::TarIndex>)>, BackendError> {
        let ikey = index::key_of(bucket, key);
        let Some(entry) = self.lock_index().get(&ikey) else {
            return Ok(None);
        };
        if !self
            .still_current(backend, bucket, key, &ikey, &entry)
            .await?
        {
            return Ok(None);
        }
        if let Some((e, idx)) = self.tar_indexes.get(&ikey) {
            if Arc::ptr_eq(&e, &entry) {
                return Ok(Some((entry.meta.clone(), idx)));
            }
        }
        let (path, size) = (entry.path.clone(), entry.meta.size);
        let built = tokio::task::spawn_blocking(move || {
            File::open(&path).and_then(|f| crate::archive::index_tar(&f, size))
        })
        .await
        .map_err(|e| BackendError::Io(io::Error::other(e)))?;
        let idx = Arc::new(built.map_err(|e| {
            BackendError::Client(S3Error::new(
                crate::error::S3Code::InvalidArgument,
                format!("the object is not a readable tar archive: {e}"),
            ))
        })?);
        self.tar_indexes.insert(ikey, (entry.clone(), idx.clone()));
        Ok(Some((entry.meta.clone(), idx)))
    }

    /// Whether an entry may be served: one checked since the cache's generation began
    /// is (a load and a compare); an older one is checked against the backend, and
    /// dropped when the backend holds another version (or none).
    async fn still_current(
        &self,
        backend: &Arc<dyn Backend>,
        bucket: &str,
        key: &str,
        ikey: &str,
        entry: &Arc<Entry>,
    ) -> Result<bool, BackendError> {
        let generation = self.generation();
        if backend.computed() || entry.checked.load(Ordering::Acquire) >= generation {
            return Ok(true);
        }
        match backend.head_object(bucket, key).await {
            Ok(now) if now.etag == entry.meta.etag && now.size == entry.meta.size => {
                entry.checked.store(generation, Ordering::Release);
                Ok(true)
            }
            Ok(_) | Err(BackendError::NoSuchKey(_)) => {
                tracing::info!(key = %ikey, "a cached copy is no longer the backend's; dropping it");
                self.drop_entry(ikey, entry);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    pub fn policy(&self) -> CachePolicy {
        self.policy
    }

    pub fn usage(&self) -> Usage {
        self.lock_index().usage()
    }

    fn lock_index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_writes(&self) -> std::sync::MutexGuard<'_, write::Writes> {
        self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_fills(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Fill>>> {
        self.fills.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Metadata of an object: from the cache when it holds it, else the backend.
    pub async fn head(
        &self,
        backend: &dyn Backend,
        bucket: &str,
        key: &str,
    ) -> Result<(ObjectMeta, Source), BackendError> {
        let cached = self.lock_index().get(&index::key_of(bucket, key));
        if let Some(e) = cached {
            return Ok((e.meta.clone(), Source::Hit));
        }
        Ok((backend.head_object(bucket, key).await?, Source::Bypass))
    }

    /// Reads an object through the cache. `range` sees the object's metadata first and
    /// decides which bytes to send (or refuses, for failed preconditions).
    pub async fn get(
        self: &Arc<Self>,
        backend: &Arc<dyn Backend>,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<Read, BackendError> {
        self.read(backend, bucket, key, range, false).await
    }

    /// The size of this node's committed copy of the object, if it holds one.
    pub fn holds(&self, bucket: &str, key: &str) -> Option<u64> {
        self.lock_index()
            .get(&index::key_of(bucket, key))
            .map(|e| e.meta.size)
    }

    /// True once a never-evict cache has refused an object for want of room (until an
    /// entry is removed).
    pub fn refusing(&self) -> bool {
        self.refusing.load(Ordering::Acquire)
    }

    /// [`Cache::get`]; with `spill`, a miss this node cannot admit (and no peer holds)
    /// fails with [`BackendError::NotAdmitted`] (carrying the object's size when known)
    /// before any byte is read from the backend, so that the caller can leave the
    /// object to a node with room.
    pub async fn read(
        self: &Arc<Self>,
        backend: &Arc<dyn Backend>,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
        spill: bool,
    ) -> Result<Read, BackendError> {
        let ikey = index::key_of(bucket, key);
        // Bound first: the index lock is not held while the read is set up.
        let cached = self.lock_index().get(&ikey);
        if let Some(entry) = cached {
            if self
                .still_current(backend, bucket, key, &ikey, &entry)
                .await?
            {
                let read = self.serve_entry(&ikey, entry, range)?;
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(read);
            }
        }
        // Join a fill in progress, or lead a new one.
        let (fill, leader) = {
            let mut fills = self.lock_fills();
            match fills.get(&ikey) {
                Some(f) => (f.clone(), false),
                None => {
                    let f = Fill::new();
                    // A write of the key is under way: the backend may answer with the
                    // old version or the new one, so this fill serves its readers but
                    // never commits.
                    if self.lock_writes().active(&ikey) {
                        f.stale.store(true, Ordering::Release);
                    }
                    fills.insert(ikey.clone(), f.clone());
                    (f, true)
                }
            }
        };
        if leader {
            return self.lead(backend, bucket, key, fill, range, spill).await;
        }
        let st = fill.started().await;
        if st.phase == Phase::Filling || st.phase == Phase::Done {
            let meta = st.meta.clone().expect("a started fill knows its object");
            let resolved = range(&meta).map_err(BackendError::Client)?;
            let start = resolved.map_or(0, |r| r.start);
            if !fill::far_ahead(&st, start) {
                let source = if fill.from_peer.load(Ordering::Acquire) {
                    self.stats.peer_fills.fetch_add(1, Ordering::Relaxed);
                    Source::Peer
                } else {
                    self.stats.misses.fetch_add(1, Ordering::Relaxed);
                    Source::Miss
                };
                let end = resolved.map_or(meta.size, |r| r.end);
                return Ok(Read {
                    meta,
                    range: resolved,
                    body: fill::follow(fill, self.engine.clone(), start, end),
                    source,
                });
            }
        }
        // The fill is of no use to this reader: read the backend directly.
        self.bypass(backend, bucket, key, range).await
    }

    /// Reads an object only if this node holds a committed copy (a peer filling from
    /// this node): `None` otherwise, never a fill.
    pub fn get_committed(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<Option<Read>, BackendError> {
        let ikey = index::key_of(bucket, key);
        let cached = self.lock_index().get(&ikey);
        cached
            .map(|entry| self.serve_entry(&ikey, entry, range))
            .transpose()
    }

    /// A committed entry's file, opened read-only, to hand to a client on this node:
    /// `None` when this node holds no current copy. The bytes of the range are checked
    /// against their checksums first where reads are checked (`--verify-reads`, or an
    /// entry not yet read whole since it was loaded); a mismatch drops the entry and
    /// fails, as a streamed read would.
    pub async fn local_file(
        self: &Arc<Self>,
        backend: &Arc<dyn Backend>,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<Option<LocalFile>, BackendError> {
        let ikey = index::key_of(bucket, key);
        let cached = self.lock_index().get(&ikey);
        let Some(entry) = cached else {
            return Ok(None);
        };
        if !self
            .still_current(backend, bucket, key, &ikey, &entry)
            .await?
        {
            return Ok(None);
        }
        let resolved = range(&entry.meta).map_err(BackendError::Client)?;
        let size = entry.meta.size;
        let (start, end) = resolved.map_or((0, size), |r| (r.start, r.end));
        // Opened after the lookup: an entry removed meanwhile is simply not held.
        let file = match File::open(&entry.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if self.verify_reads || !entry.verified.load(Ordering::Relaxed) {
            let (cache, e2, ik) = (self.clone(), entry.clone(), ikey.clone());
            let f2 = file.try_clone()?;
            tokio::task::spawn_blocking(move || cache.check_blocks(&ik, &e2, &f2, start, end))
                .await
                .map_err(io::Error::other)??;
        }
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        self.stats.local_reads.fetch_add(1, Ordering::Relaxed);
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
        // Blocks are 64 KiB or 1 MiB: multiples of the page size.
        let bytes = match store::Mapped::new(file, from, (stop - from) as usize) {
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
        for (i, chunk) in bytes.chunks(block as usize).enumerate() {
            if entry.crcs.get(first + i) != Some(&crc32c::crc32c(chunk)) {
                tracing::error!(key = %ikey, block = first + i, "cache entry failed its checksum; dropping it");
                self.drop_entry(ikey, entry);
                return Err(io::Error::other("cache entry failed its checksum"));
            }
        }
        Ok(())
    }

    /// Waits for a fill of the object in progress, if any, to end (committed or not).
    pub async fn fill_ended(&self, bucket: &str, key: &str) {
        let fill = self.lock_fills().get(&index::key_of(bucket, key)).cloned();
        if let Some(f) = fill {
            let mut rx = f.state.subscribe();
            let _ = rx
                .wait_for(|s| !matches!(s.phase, Phase::Starting | Phase::Filling))
                .await;
        }
    }

    /// A committed entry's bytes, of the range `range` picks: from memory for a hot
    /// small object, else the entry file.
    fn serve_entry(
        self: &Arc<Self>,
        ikey: &str,
        entry: Arc<Entry>,
        range: &RangeFn<'_>,
    ) -> Result<Read, BackendError> {
        let resolved = range(&entry.meta).map_err(BackendError::Client)?;
        let hot = self
            .hot
            .get(ikey)
            .filter(|(e, _)| Arc::ptr_eq(e, &entry))
            .map(|(_, b)| b);
        let body = match hot {
            Some(bytes) => {
                let (a, b) =
                    resolved.map_or((0, bytes.len()), |r| (r.start as usize, r.end as usize));
                let piece = bytes.slice(a..b);
                Box::pin(futures::stream::once(async move { Ok(piece) })) as ByteStream
            }
            None => self
                .clone()
                .hit_stream(ikey.to_owned(), entry.clone(), resolved),
        };
        Ok(Read {
            meta: entry.meta.clone(),
            range: resolved,
            body,
            source: Source::Hit,
        })
    }

    /// A peer's copy of the object, if one holds the version the backend has now (a
    /// peer may hold a version written before it last heard of a change).
    async fn peer_copy(
        &self,
        backend: &Arc<dyn Backend>,
        bucket: &str,
        key: &str,
    ) -> Option<GetObject> {
        if backend.computed() {
            return None;
        }
        let peers = self.peers.get()?;
        let (meta, body) = peers.peer_copy(bucket, key).await?;
        match backend.head_object(bucket, key).await {
            Ok(now) if now.etag == meta.etag && now.size == meta.size => {
                Some(GetObject { meta: now, body })
            }
            _ => None,
        }
    }

    async fn bypass(
        &self,
        backend: &Arc<dyn Backend>,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<Read, BackendError> {
        let (obj, resolved) = backend.get_object(bucket, key, range).await?;
        self.stats.bypasses.fetch_add(1, Ordering::Relaxed);
        Ok(Read {
            meta: obj.meta,
            range: resolved,
            body: if backend.computed() {
                obj.body
            } else {
                self.count_backend(obj.body)
            },
            source: Source::Bypass,
        })
    }

    fn count_backend(&self, body: ByteStream) -> ByteStream {
        let stats = self.stats.clone();
        Box::pin(body.map(move |item| {
            if let Ok(b) = &item {
                stats
                    .bytes_from_backend
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
            }
            item
        }))
    }

    async fn lead(
        self: &Arc<Self>,
        backend: &Arc<dyn Backend>,
        bucket: &str,
        key: &str,
        fill: Arc<Fill>,
        range: &RangeFn<'_>,
        spill: bool,
    ) -> Result<Read, BackendError> {
        let ikey = index::key_of(bucket, key);
        // Decide admission inside the backend call, once the size is known: admitted
        // fetches the whole object, not admitted fetches only the client's range. With
        // `spill`, an object this node cannot admit is left to another node (the caller
        // forwards the request there): the decision stops the backend read.
        let decision: Mutex<Option<(ObjectMeta, Option<ByteRange>, bool)>> = Mutex::new(None);
        let decide_with = |meta: &ObjectMeta, spill: bool| -> Result<Option<ByteRange>, S3Error> {
            let client = range(meta)?;
            let admitted = self.reserve(meta.size);
            *decision.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((meta.clone(), client, admitted));
            if !admitted && spill {
                return Err(S3Error::new(
                    crate::error::S3Code::ServiceUnavailable,
                    "not admitted here; left to another node",
                ));
            }
            Ok(if admitted { None } else { client })
        };
        let abandon = |cache: &Cache| {
            cache.lock_fills().remove(&ikey);
            fill.set_phase(Phase::Abandoned);
        };
        // A peer's copy first: the previous owner after a membership change, or the node
        // an object this one could not admit was left to.
        let mut origin = Source::Miss;
        let got = match self.peer_copy(backend, bucket, key).await {
            Some(obj) => {
                origin = Source::Peer;
                decide_with(&obj.meta, false)
                    .map(|_| (obj, None))
                    .map_err(BackendError::Client)
            }
            None if spill && self.refusing.load(Ordering::Acquire) => {
                abandon(self);
                // The size is not known yet: any node with room may take it.
                return Err(BackendError::NotAdmitted(0));
            }
            None => {
                backend
                    .get_object_whole_likely(bucket, key, &|m| decide_with(m, spill))
                    .await
            }
        };
        let decided = decision.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (obj, _) = match got {
            Ok(v) => v,
            Err(e) => {
                match &decided {
                    Some((meta, _, true)) => self.lock_index().release(meta.size),
                    Some((meta, _, false)) if spill && origin == Source::Miss => {
                        abandon(self);
                        return Err(BackendError::NotAdmitted(meta.size));
                    }
                    _ => {}
                }
                abandon(self);
                return Err(e);
            }
        };
        let (meta, client, admitted) = decided.expect("get_object consulted the range");
        if !admitted {
            abandon(self);
            if origin == Source::Peer {
                // The peer sends the whole object; this reader gets its range of it.
                self.stats.peer_fills.fetch_add(1, Ordering::Relaxed);
                let (start, end) = client.map_or((0, meta.size), |r| (r.start, r.end));
                let stats = self.stats.clone();
                let body = fill::slice(obj.body, start, end).map(move |item| {
                    if let Ok(b) = &item {
                        stats
                            .bytes_from_peers
                            .fetch_add(b.len() as u64, Ordering::Relaxed);
                    }
                    item
                });
                return Ok(Read {
                    meta,
                    range: client,
                    body: Box::pin(body),
                    source: Source::Peer,
                });
            }
            self.stats.bypasses.fetch_add(1, Ordering::Relaxed);
            return Ok(Read {
                meta: obj.meta,
                range: client,
                body: if backend.computed() {
                    obj.body
                } else {
                    self.count_backend(obj.body)
                },
                source: Source::Bypass,
            });
        }
        let temp = self
            .tmp
            .join(format!("fill-{}", uuid::Uuid::new_v4().simple()));
        let opened = File::create(&temp).and_then(|w| File::open(&temp).map(|r| (w, r)));
        let (writer, reader) = match opened {
            Ok(v) => v,
            Err(e) => {
                self.lock_index().release(meta.size);
                abandon(self);
                tracing::error!(error = %e, "cannot create a cache temp file; serving through");
                self.stats.bypasses.fetch_add(1, Ordering::Relaxed);
                return self.bypass(backend, bucket, key, range).await;
            }
        };
        let _ = fill.file.set(Arc::new(reader));
        fill.state.send_modify(|s| {
            s.meta = Some(meta.clone());
            s.phase = Phase::Filling;
        });
        if origin == Source::Peer {
            self.stats.peer_fills.fetch_add(1, Ordering::Relaxed);
            fill.from_peer.store(true, Ordering::Release);
        } else {
            self.stats.misses.fetch_add(1, Ordering::Relaxed);
        }
        let commit = fill::Commit {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        };
        let dest = store::entry_path(&self.objects, bucket, key);
        let cache = self.clone();
        let task_fill = fill.clone();
        let task_meta = meta.clone();
        let stats = self.stats.clone();
        let computed = backend.computed();
        tokio::spawn(async move {
            let on_bytes = move |n: u64| {
                let counter = if origin == Source::Peer {
                    &stats.bytes_from_peers
                } else if computed {
                    return;
                } else {
                    &stats.bytes_from_backend
                };
                counter.fetch_add(n, Ordering::Relaxed);
            };
            let result = fill::write_body(
                task_fill.clone(),
                writer,
                task_meta.clone(),
                obj.body,
                commit,
                on_bytes,
            )
            .await;
            cache.finish_fill(ikey, task_fill, task_meta, temp, dest, result);
        });
        let start = client.map_or(0, |r| r.start);
        let end = client.map_or(meta.size, |r| r.end);
        if fill::far_ahead(&fill.state.borrow(), start) {
            // The fill goes on in the background; this reader's range, far into the
            // object, comes from the backend now rather than after the bytes before it.
            let etag = meta.etag.clone();
            let exact = move |m: &ObjectMeta| -> Result<Option<ByteRange>, S3Error> {
                if m.etag != etag {
                    return Err(S3Error::new(
                        crate::error::S3Code::ServiceUnavailable,
                        "the object changed while it was read; retry",
                    ));
                }
                Ok(client)
            };
            let (obj, _) = backend.get_object(bucket, key, &exact).await?;
            return Ok(Read {
                meta,
                range: client,
                body: if backend.computed() {
                    obj.body
                } else {
                    self.count_backend(obj.body)
                },
                source: Source::Miss,
            });
        }
        Ok(Read {
            meta,
            range: client,
            body: fill::follow(fill, self.engine.clone(), start, end),
            source: origin,
        })
    }

    fn finish_fill(
        &self,
        ikey: String,
        fill: Arc<Fill>,
        meta: ObjectMeta,
        temp: PathBuf,
        dest: PathBuf,
        result: io::Result<Vec<u32>>,
    ) {
        let size = meta.size;
        // Decide and commit under the fills lock: `invalidate` takes it too, so an
        // overwrite or delete either comes after the commit (and removes the entry) or
        // before it (and the fill, seen stale here, does not commit).
        let mut fills = self.lock_fills();
        let outcome = match result {
            Err(e) => Err(e),
            // Every byte arrived, but the object changed meanwhile: readers of the old
            // version may finish; nothing is committed.
            Ok(_) if fill::is_stale(&fill) => Ok(None),
            Ok(crcs) => dest
                .parent()
                .map_or(Ok(()), fs::create_dir_all)
                .and_then(|()| fs::rename(&temp, &dest))
                .map(|()| Some(crcs)),
        };
        match outcome {
            Ok(Some(crcs)) => {
                self.lock_index().commit(
                    ikey.clone(),
                    Entry {
                        path: dest.clone(),
                        meta,
                        crcs: Arc::from(crcs),
                        verified: AtomicBool::new(true),
                        checked: std::sync::atomic::AtomicU64::new(self.generation()),
                    },
                    size,
                );
                fill.set_phase(Phase::Done);
            }
            Ok(None) => {
                let _ = fs::remove_file(&temp);
                self.lock_index().release(size);
                fill.set_phase(Phase::Done);
            }
            Err(e) => {
                let _ = fs::remove_file(&temp);
                self.lock_index().release(size);
                tracing::warn!(key = %ikey, error = %e, "cache fill failed");
                fill.set_phase(Phase::Failed(e.to_string()));
            }
        }
        if fills.get(&ikey).is_some_and(|f| Arc::ptr_eq(f, &fill)) {
            fills.remove(&ikey);
        }
        drop(fills);
        // Make the rename durable.
        if let Some(parent) = dest.parent() {
            if let Ok(d) = File::open(parent) {
                let _ = d.sync_all();
            }
        }
    }

    /// Reserves room for `size` bytes, removing the files of entries the policy evicts.
    /// Under the fills lock, as every commit and unlink of an entry file is: an evicted
    /// key's file cannot be a newer commit of that key.
    fn reserve(&self, size: u64) -> bool {
        let _fills = self.lock_fills();
        match self.lock_index().reserve(size) {
            Some(evicted) => {
                for p in evicted {
                    let _ = fs::remove_file(p);
                }
                true
            }
            None => {
                if self.policy == CachePolicy::NeverEvict {
                    self.refusing.store(true, Ordering::Release);
                }
                false
            }
        }
    }

    /// Drops one entry (if it is still `key`'s) and its file, under the fills lock.
    fn drop_entry(&self, key: &str, entry: &Arc<Entry>) {
        let _fills = self.lock_fills();
        self.hot.invalidate(key);
        self.tar_indexes.invalidate(key);
        if let Some(e) = self.lock_index().remove(key, Some(entry)) {
            let _ = fs::remove_file(&e.path);
            self.refusing.store(false, Ordering::Release);
        }
    }

    /// Drops the cached copy of an object written or deleted through this node, and
    /// keeps a fill in progress from committing the old bytes.
    pub fn invalidate(&self, bucket: &str, key: &str) {
        let ikey = index::key_of(bucket, key);
        let mut fills = self.lock_fills();
        if let Some(f) = fills.remove(&ikey) {
            f.stale.store(true, Ordering::Release);
        }
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .bump(&ikey);
        self.hot.invalidate(&ikey);
        self.tar_indexes.invalidate(&ikey);
        if let Some(e) = self.lock_index().remove(&ikey, None) {
            let _ = fs::remove_file(&e.path);
            self.refusing.store(false, Ordering::Release);
        }
        drop(fills);
    }

    /// Streams a committed entry, checking each block's CRC32C before sending it. On a
    /// mismatch the stream ends with an error (the response is cut short) and the entry
    /// is dropped, so the next read refetches it.
    fn hit_stream(
        self: Arc<Self>,
        ikey: String,
        entry: Arc<Entry>,
        range: Option<ByteRange>,
    ) -> ByteStream {
        let size = entry.meta.size;
        let (start, end) = range.map_or((0, size), |r| (r.start, r.end));
        let verify = self.verify_reads || !entry.verified.load(Ordering::Relaxed);
        let stream = async_stream::try_stream! {
            if start < end {
                let file = Arc::new(File::open(&entry.path)?);
                // Reads of up to 1 MiB, from the block holding `start` to the end of
                // the block holding `end - 1`: whole blocks, each checked on arrival.
                let block = entry.block();
                let stop = end.div_ceil(block).saturating_mul(block).min(size);
                let read = |pos: u64| {
                    let len = (stop - pos).min(store::READ) as usize;
                    self.engine.read_at(file.clone(), pos, len)
                };
                let mut pos = start / block * block;
                // One read ahead: the next read runs while this one is checked and
                // sent, so a single stream keeps the disk and the socket both busy.
                let mut ahead = Some(read(pos));
                while pos < end {
                    let buf = match ahead.take() {
                        Some(r) => r.await?,
                        None => read(pos).await?,
                    };
                    if buf.is_empty() {
                        self.drop_entry(&ikey, &entry);
                        Err(io::Error::other("cache entry is shorter than its size"))?;
                    }
                    let next = pos + buf.len() as u64;
                    if next < end {
                        ahead = Some(read(next));
                    }
                    if verify {
                        self.check_crcs(&ikey, &entry, pos, &buf)?;
                    }
                    let lo = (start.max(pos) - pos) as usize;
                    let hi = (end.min(next) - pos) as usize;
                    if size <= HOT_MAX_OBJECT && start == 0 && end == size {
                        self.hot.insert(ikey.clone(), (entry.clone(), buf.clone()));
                    }
                    let piece: Bytes = buf.slice(lo..hi);
                    yield piece;
                    pos = next;
                }
                if start == 0 && end == size {
                    entry.verified.store(true, Ordering::Relaxed);
                }
            }
        };
        Box::pin(stream)
    }
}
