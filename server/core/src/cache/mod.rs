//! The node's disk cache in front of its object source: reads are answered from a
//! committed entry (`hit`), from a fill in progress that admits the object (`miss`), from
//! a peer's copy (`peer`), or straight from the source when the policy does not admit it
//! (`bypass`). Writes through the node are cached too, and invalidate older copies.
//!
//! One read entry point, [`Cache::read`], takes a [`Mode`]; [`Cache::read_derived`] is
//! the same machinery for objects computed on demand (transform results), which the
//! caller computes when the cache asks. The parts: `flight` (one fill per object),
//! `fill` (the cold-read tee and the followers behind it), `hit` (verified reads of
//! committed entries), `admission` (the policy's verdict), `index` (entries and their
//! accounting), `store` (the files on disk), `write` (writes through the cache).

mod admission;
mod adopt;
mod derived;
mod error;
mod fill;
mod flight;
mod follow;
mod hit;
mod index;
mod local;
mod maps;
mod miss;
mod room;
mod store;
#[cfg(test)]
mod tests;
mod write;

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::backend::{BackendError, ByteRange, ByteStream, GetObject, ObjectMeta, RangeFn, Source};
use crate::io::ReadEngine;
use crate::stats::Metric;
use crate::stats::Stats;
use flight::Flights;
use index::{Entry, Index};

use crate::sync::Locked;
pub use admission::CachePolicy;
pub use adopt::Adopted;
pub use error::{CacheError, DeriveError};
pub use follow::slice;
pub use index::Usage;

/// Where the bytes of a read came from (`x-granary-cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Hit,
    Miss,
    Peer,
    Bypass,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Hit => "hit",
            Origin::Miss => "miss",
            Origin::Peer => "peer",
            Origin::Bypass => "bypass",
        }
    }
}

/// What a read wants of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The bytes: a hit, else a fill (a peer's copy or the source), else, when the policy
    /// does not admit the object, straight from the source.
    Stream,
    /// As `Stream`, but an object this node cannot admit, and no peer holds, is refused
    /// with [`CacheError::NotAdmitted`] before any byte is read, so that the caller can
    /// leave it to a node with room.
    StreamOrDecline,
    /// Only a committed copy (a peer asking for it): [`CacheError::NotHeld`] otherwise;
    /// never a fill, never counted as a hit.
    Committed,
    /// The entry's file for a client on this machine, filled first when absent; an
    /// object that cannot be held is read as with `Stream`.
    Local(LocalReader),
    /// Metadata only: the entry's, else the source's.
    Head,
}

/// How a client on this machine reads the cache file it is handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalReader {
    /// It maps the file: the range is checked before it is handed over.
    Maps,
    /// It copies out the range only where it finds every page of it resident, else asks
    /// for the bytes: the range is brought in first (sealed where it can be), and the
    /// answer carries its blocks' checksums, against which the client checks its copy.
    CopiesResident,
}

/// Other nodes that may hold a committed copy of an object (the cluster).
#[async_trait::async_trait]
pub trait Peers: Send + Sync {
    /// A peer's committed copy: its metadata and the whole body.
    async fn peer_copy(&self, bucket: &str, key: &str) -> Option<(ObjectMeta, ByteStream)>;
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
    /// For a reader that copies the range out ([`LocalReader::CopiesResident`]): the
    /// checksums of the blocks holding it, to check its copy against.
    pub checks: Option<crate::io::crc::BlockChecks>,
}

/// A read's bytes.
pub enum Body {
    Stream(ByteStream),
    /// The entry's file ([`Mode::Local`]).
    File(Box<LocalFile>),
    /// None asked ([`Mode::Head`]).
    Empty,
}

impl Body {
    /// The bytes as a stream (a file's range read from it; nothing for `Empty`).
    pub fn into_stream(self) -> ByteStream {
        match self {
            Body::Stream(s) => s,
            Body::Empty => Box::pin(futures::stream::empty()),
            Body::File(lf) => {
                let file = Arc::new(lf.file);
                let (offset, len) = (lf.offset, lf.len);
                Box::pin(futures::stream::once(async move {
                    tokio::task::spawn_blocking(move || {
                        let mut buf = vec![0u8; len as usize];
                        std::os::unix::fs::FileExt::read_exact_at(&*file, &mut buf, offset)?;
                        Ok(Bytes::from(buf))
                    })
                    .await
                    .map_err(io::Error::other)?
                }))
            }
        }
    }
}

/// An object read: metadata, the resolved range, the bytes, and where they came from.
pub struct Read {
    pub meta: ObjectMeta,
    pub range: Option<ByteRange>,
    pub body: Body,
    pub origin: Origin,
}

/// What a leader fetched for a fill.
struct Fetched {
    /// The whole object if admitted, else the client's range of it.
    obj: GetObject,
    /// The range the client asked for.
    client: Option<ByteRange>,
    origin: Origin,
    counted: Counted,
}

/// Which counter a fill's bytes add to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counted {
    Backend,
    Peers,
    /// Computed here: neither.
    Nowhere,
}

pub struct Cache {
    objects: PathBuf,
    tmp: PathBuf,
    index: Mutex<Index>,
    flights: Flights,
    verify_reads: bool,
    /// Whether large fills write around the page cache.
    direct_fills: bool,
    engine: Arc<dyn ReadEngine>,
    stats: Arc<Stats>,
    policy: CachePolicy,
    /// Bytes of small, verified entries kept in memory: a hit on them skips the open and
    /// the read. Keyed like the index; dropped with the entry.
    hot: moka::sync::Cache<String, (Arc<Entry>, Bytes)>,
    /// Writes through this node in progress, per key (locked only under the commit lock).
    writes: Mutex<write::Writes>,
    /// Where a miss looks before the source.
    peers: std::sync::OnceLock<Arc<dyn Peers>>,
    /// Bytes of entry windows kept mapped between hits, all entries together.
    maps: Arc<maps::MapBudget>,
    /// Member indexes of cached `.tar` entries, built on first use, dropped with the entry
    /// (keyed like the index; an index of another entry of the key is rebuilt).
    tar_indexes: moka::sync::Cache<String, (Arc<Entry>, Arc<crate::archive::TarIndex>)>,
    /// A shard's member index is built once however many reads ask for it at once.
    index_builds: crate::keylock::KeyLocks<String>,
    /// Set when never-evict refuses an object for want of room; cleared when an entry
    /// is removed.
    refusing: AtomicBool,
    /// Admits nothing new, whatever its room: the node is leaving the cluster (drain).
    closed: AtomicBool,
    /// The filesystem's own limit, watched while running.
    room: Arc<room::Room>,
    /// The source a fill's readers go on from when this node's disk fails mid-fill.
    source: std::sync::OnceLock<Arc<dyn Source>>,
    /// Whether copies may be served as they are and new ones kept. A cluster member
    /// whose view is not settled (members may still write without telling it) checks
    /// each hit against the source, and keeps nothing new, until it is.
    trusted: AtomicBool,
    /// Entries checked before this generation are checked against the source before
    /// they are served. [`FIRST_GENERATION`] (nothing to check) on a single node; an
    /// entry marked 0 is checked whatever the generation.
    generation: AtomicU64,
    /// How old a check against the source may be before a hit checks again: per
    /// bucket, else the default; `None`: never.
    revalidate: Revalidation,
    /// Until when (`clock::now_ms`) this node has heard from its cluster recently
    /// enough that no member can have written without telling it: past it, every hit is
    /// checked against the source. `u64::MAX` on a single node.
    lease_until: AtomicU64,
}

/// The generation a cache starts in; entries marked below it are checked first.
const FIRST_GENERATION: u64 = 1;

/// How long a hit may go on a check against the source (`--revalidate-after`, and per
/// bucket `[buckets.NAME] revalidate_after`); `None`: never (immutable data).
#[derive(Debug, Clone, Default)]
pub struct Revalidation {
    pub default: Option<std::time::Duration>,
    pub buckets: HashMap<String, Option<std::time::Duration>>,
}

impl Revalidation {
    /// The longest a hit of `bucket` may go on its last check, in milliseconds.
    fn after_ms(&self, bucket: &str) -> Option<u64> {
        if self.buckets.is_empty() {
            return self.default.map(|d| d.as_millis() as u64);
        }
        let after = match self.buckets.get(bucket) {
            Some(a) => *a,
            None => self.default,
        };
        after.map(|d| d.as_millis() as u64)
    }
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
                        Entry::loaded(path, l.meta, l.crcs, FIRST_GENERATION),
                    );
                }
                _ => {
                    tracing::warn!(path = %path.display(), "dropping a damaged cache entry");
                    let _ = fs::remove_file(&path);
                }
            }
        }
        let u = index.usage();
        let room = Arc::new(room::Room::new(dir));
        if u.used + room.free() < capacity {
            tracing::warn!(
                capacity,
                disk = u.used + room.free(),
                "the cache's filesystem holds less than its capacity; it admits what the disk holds"
            );
        }
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
            flights: Flights::default(),
            verify_reads,
            direct_fills: true,
            engine,
            stats,
            policy,
            hot: moka::sync::Cache::builder()
                .max_capacity(HOT_CAPACITY)
                .weigher(|_, (_, b): &(Arc<Entry>, Bytes)| b.len().try_into().unwrap_or(u32::MAX))
                .build(),
            writes: Mutex::new(write::Writes::default()),
            peers: std::sync::OnceLock::new(),
            maps: Arc::new(maps::MapBudget::of_machine()),
            tar_indexes: moka::sync::Cache::builder()
                .max_capacity(TAR_INDEX_CAPACITY)
                .weigher(
                    |_, (_, idx): &(Arc<Entry>, Arc<crate::archive::TarIndex>)| {
                        idx.weight().try_into().unwrap_or(u32::MAX)
                    },
                )
                .build(),
            index_builds: Default::default(),
            refusing: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            room,
            source: std::sync::OnceLock::new(),
            trusted: AtomicBool::new(true),
            generation: AtomicU64::new(FIRST_GENERATION),
            revalidate: Revalidation::default(),
            lease_until: AtomicU64::new(u64::MAX),
        })
    }

    /// How long a hit may go on its last check against the source.
    pub fn with_revalidation(mut self, revalidate: Revalidation) -> Cache {
        self.revalidate = revalidate;
        self
    }

    /// Every entry of `bucket` whose key starts with `prefix` is checked against the
    /// source before its next hit: the number marked.
    pub fn revalidate_prefix(&self, bucket: &str, prefix: &str) -> usize {
        let start = index::key_of(bucket, prefix);
        let entries = self.lock_index().entries();
        let mut marked = 0;
        for (ikey, e) in entries {
            if ikey.starts_with(&start) {
                e.checked.store(0, Ordering::Release);
                marked += 1;
            }
        }
        marked
    }

    /// Whether large fills write their files around the page cache (`O_DIRECT`, where
    /// the filesystem allows); on by default.
    pub fn with_direct_fills(mut self, direct: bool) -> Cache {
        self.direct_fills = direct;
        self
    }

    /// Lets misses fill from peers that hold the object before the source. In a
    /// cluster, writes may have happened through other nodes while this one was away, so
    /// entries it restarted with are checked against the source before their first hit.
    pub fn set_peers(&self, peers: Arc<dyn Peers>) {
        let _ = self.peers.set(peers);
        self.revalidate_all();
    }

    /// Every entry is checked against the source (one HEAD: same ETag and size) before
    /// its next hit: for a node that was cut off from its cluster, which may have missed
    /// the invalidations of writes made through other nodes meanwhile.
    pub fn revalidate_all(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Trusts this node's copies or not (see [`Cache::trusted`]). Trusted again, every
    /// copy is checked once more before its next hit: a check made while distrusted may
    /// predate a write nobody told this node of.
    pub fn set_trusted(&self, trusted: bool) {
        if trusted && !self.trusted.load(Ordering::Acquire) {
            self.revalidate_all();
        }
        self.trusted.store(trusted, Ordering::Release);
    }

    /// Extends (or ends) the lease: copies are trusted until `until_ms` on
    /// `clock::now_ms`. A lease renewed after it lapsed checks nothing more: a member
    /// that wrote without reaching this node meanwhile told it to check its copies
    /// before renewing it (ARCHITECTURE.md, The lease).
    pub fn set_lease(&self, until_ms: u64) {
        self.lease_until.store(until_ms, Ordering::Release);
    }

    /// Whether copies are served without a check against the source on every hit, and
    /// new objects admitted: the cluster's trust, within the lease.
    pub fn trusted(&self) -> bool {
        if !self.trusted.load(Ordering::Acquire) {
            return false;
        }
        // A single node, or one with no member up, holds no lease: no clock read.
        let until = self.lease_until.load(Ordering::Acquire);
        until == u64::MAX || crate::clock::now_ms() <= until
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn policy(&self) -> CachePolicy {
        self.policy
    }

    /// The accounting, against the configured capacity (the node's weight in its
    /// cluster, steady whatever the disk does).
    pub fn usage(&self) -> Usage {
        self.lock_index().usage()
    }

    /// Bytes of entry files kept mapped between hits (`maps`).
    pub fn mapped_bytes(&self) -> u64 {
        self.maps.used()
    }

    /// Of those, the bytes locked in memory (sealed windows, `maps`).
    pub fn locked_bytes(&self) -> u64 {
        self.maps.locked()
    }

    /// Bytes the cache may still take: the capacity's room, or less when the filesystem
    /// has less (as last looked).
    pub fn free(&self) -> u64 {
        let u = self.usage();
        let room = u.capacity.saturating_sub(u.used + u.reserved);
        room.min(self.room.free())
    }

    /// The filesystem's free bytes for the cache (less its margin), as last looked.
    pub fn disk_free(&self) -> u64 {
        self.room.free()
    }

    /// True once a never-evict cache has refused an object for want of room (until an
    /// entry is removed), and while the disk is full.
    pub fn refusing(&self) -> bool {
        self.refusing.load(Ordering::Acquire)
            || self.closed.load(Ordering::Acquire)
            || self.room.full()
    }

    /// Stops (or starts again) admitting new objects, whatever the room: a node that
    /// leaves the cluster keeps what it holds until it is handed over, and fills nothing.
    pub fn close(&self, closed: bool) {
        self.closed.store(closed, Ordering::Release);
    }

    /// Names the source that readers of a fill go on from, from where they are, when
    /// this node's disk fails in the middle of the fill (reads through other sources
    /// fail with the fill).
    pub fn set_source(&self, src: Arc<dyn Source>) {
        let _ = self.source.set(src);
    }

    /// Watches the filesystem while the process runs: a full disk admits again once it
    /// has room. Within the runtime.
    pub fn watch_room(self: &Arc<Self>) {
        let cache = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(c) = cache.upgrade() else { return };
                let reserved = c.lock_index().usage().reserved;
                c.room.recheck(reserved);
            }
        });
    }

    /// The size of this node's committed copy of the object, if it holds one.
    pub fn holds(&self, bucket: &str, key: &str) -> Option<u64> {
        self.lock_index()
            .get(&index::key_of(bucket, key))
            .map(|e| e.meta.size)
    }

    /// Whether a fill of `bucket/key` is in flight (its room reserved already).
    pub fn filling(&self, bucket: &str, key: &str) -> bool {
        self.flights.get(&index::key_of(bucket, key)).is_some()
    }

    fn lock_index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.locked()
    }

    fn lock_writes(&self) -> std::sync::MutexGuard<'_, write::Writes> {
        self.writes.locked()
    }

    /// Reads an object of `src` through the cache. `range` sees the object's metadata
    /// first and decides which bytes to send, or refuses (preconditions, ranges).
    pub async fn read(
        self: &Arc<Self>,
        src: &dyn Source,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
        mode: Mode,
    ) -> Result<Read, CacheError> {
        let ikey = index::key_of(bucket, key);
        // Distrusted, this node keeps nothing new: not a refusal to leave to a member
        // with room.
        let mode = match mode {
            Mode::StreamOrDecline if !self.trusted() => Mode::Stream,
            m => m,
        };
        match mode {
            Mode::Head => {
                // Bound first: the index lock is not held while the source is asked.
                let cached = self.lock_index().get(&ikey);
                let current = match cached {
                    Some(e) if self.still_current(src, bucket, key, &ikey, &e).await? => Some(e),
                    _ => None,
                };
                let (meta, origin) = match current {
                    Some(e) => (e.meta.clone(), Origin::Hit),
                    None => (src.head_object(bucket, key).await?, Origin::Bypass),
                };
                let range = range(&meta).map_err(CacheError::Refused)?;
                Ok(Read {
                    meta,
                    range,
                    body: Body::Empty,
                    origin,
                })
            }
            Mode::Committed => {
                let cached = self.lock_index().get(&ikey);
                let entry = cached.ok_or(CacheError::NotHeld)?;
                self.serve_entry(&ikey, entry, range)
            }
            Mode::Local(reader) => {
                // Boxed: the hot paths should not carry the size of this one's future.
                let stored = Some((src, bucket, key));
                let held = Box::pin(
                    self.local(stored, &ikey, range, reader, || self.hold(src, bucket, key)),
                );
                match held.await? {
                    Some(read) => Ok(read),
                    None => self.stream(src, bucket, key, &ikey, range, false).await,
                }
            }
            Mode::Stream => self.stream(src, bucket, key, &ikey, range, false).await,
            Mode::StreamOrDecline => self.stream(src, bucket, key, &ikey, range, true).await,
        }
    }

    /// The member index of a committed entry of a `.tar` object, built on first use:
    /// `None` when the object is not cached here.
    pub async fn tar_index(
        &self,
        src: &dyn Source,
        bucket: &str,
        key: &str,
    ) -> Result<Option<(ObjectMeta, Arc<crate::archive::TarIndex>)>, CacheError> {
        let ikey = index::key_of(bucket, key);
        let Some(entry) = self.lock_index().get(&ikey) else {
            return Ok(None);
        };
        if !self.still_current(src, bucket, key, &ikey, &entry).await? {
            return Ok(None);
        }
        let built = |c: &Cache| {
            c.tar_indexes
                .get(&ikey)
                .filter(|(e, _)| Arc::ptr_eq(e, &entry))
                .map(|(_, idx)| idx)
        };
        if let Some(idx) = built(self) {
            return Ok(Some((entry.meta.clone(), idx)));
        }
        // One build per entry: who waited finds it built.
        let lock = self.index_builds.of(ikey.clone());
        let _building = lock.lock().await;
        if let Some(idx) = built(self) {
            return Ok(Some((entry.meta.clone(), idx)));
        }
        let (file_of, size) = (entry.clone(), entry.meta.size);
        let built = tokio::task::spawn_blocking(move || {
            file_of
                .open()
                .and_then(|f| crate::archive::index_tar(&f, size))
        })
        .await
        .map_err(io::Error::other)?;
        let idx = Arc::new(built.map_err(|e| CacheError::NotTar(e.to_string()))?);
        self.stats.add(Metric::TarIndexesBuilt, 1);
        self.tar_indexes.insert(ikey, (entry.clone(), idx.clone()));
        Ok(Some((entry.meta.clone(), idx)))
    }

    /// Whether an entry may be served: one checked since the cache's generation began
    /// is (a load and a compare); an older one is checked against the source, and
    /// dropped when the source holds another version (or none).
    async fn still_current(
        &self,
        src: &dyn Source,
        bucket: &str,
        key: &str,
        ikey: &str,
        entry: &Arc<Entry>,
    ) -> Result<bool, CacheError> {
        let generation = self.generation();
        let fresh = || match self.revalidate.after_ms(bucket) {
            None => true,
            Some(after) => {
                let at = entry.checked_at.load(Ordering::Acquire);
                crate::clock::now_ms().saturating_sub(at) <= after
            }
        };
        if entry.checked.load(Ordering::Acquire) >= generation && self.trusted() && fresh() {
            return Ok(true);
        }
        self.stats.add(Metric::HitChecks, 1);
        match src.head_object(bucket, key).await {
            Ok(now) if now.etag == entry.meta.etag && now.size == entry.meta.size => {
                entry.checked.store(generation, Ordering::Release);
                entry
                    .checked_at
                    .store(crate::clock::now_ms(), Ordering::Release);
                Ok(true)
            }
            Ok(_) | Err(BackendError::NoSuchKey(_)) => {
                tracing::info!(key = %ikey, "a cached copy is no longer the backend's; dropping it");
                self.drop_entry(ikey, entry);
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Drops one entry (if it is still `key`'s) and its file, under the commit lock.
    fn drop_entry(&self, key: &str, entry: &Arc<Entry>) {
        let _commit = self.flights.lock();
        self.hot.invalidate(key);
        self.tar_indexes.invalidate(key);
        if let Some(e) = self.lock_index().remove(key, Some(entry)) {
            let _ = fs::remove_file(&e.path);
            self.refusing.store(false, Ordering::Release);
        }
    }

    /// Waits for the fill of `bucket/key` in flight, if any, to end (committed or not).
    pub async fn fill_ended(&self, bucket: &str, key: &str) {
        let fill = self.flights.get(&index::key_of(bucket, key));
        if let Some(f) = fill {
            f.ended().await;
        }
    }

    /// Drops this node's copy of `bucket/key` unless a read holds it (a read that has
    /// found the entry keeps it until its last byte): the bytes given back, or `None`.
    /// What a planner drops to make room; the object's next read is an ordinary miss.
    pub fn drop_if_unread(&self, bucket: &str, key: &str) -> Option<u64> {
        let ikey = index::key_of(bucket, key);
        let _commit = self.flights.lock();
        let mut ix = self.lock_index();
        let entry = ix.peek(&ikey)?;
        // The index's reference and this one; the memory tier and the member indexes
        // may hold one each, where they hold this entry (a read of an earlier version
        // may have left its own there). Any more is a read's.
        let holds = |e: Option<Arc<Entry>>| usize::from(e.is_some_and(|e| Arc::ptr_eq(&e, &entry)));
        let kept = 2
            + holds(self.hot.get(&ikey).map(|(e, _)| e))
            + holds(self.tar_indexes.get(&ikey).map(|(e, _)| e));
        if Arc::strong_count(&entry) > kept {
            return None;
        }
        let e = ix.remove(&ikey, Some(&entry))?;
        drop(ix);
        self.hot.invalidate(&ikey);
        self.tar_indexes.invalidate(&ikey);
        let _ = fs::remove_file(&e.path);
        self.refusing.store(false, Ordering::Release);
        Some(e.meta.size)
    }

    /// Drops the cached copy of an object written or deleted through this node, and
    /// keeps a fill in progress from committing the old bytes.
    pub fn invalidate(&self, bucket: &str, key: &str) {
        let ikey = index::key_of(bucket, key);
        let mut table = self.flights.lock();
        self.invalidate_locked(&mut table, &ikey);
    }

    /// [`Cache::invalidate`] under the commit lock, which the caller holds (`table`).
    fn invalidate_locked(&self, table: &mut flight::Table, ikey: &str) {
        Flights::forget(table, ikey);
        self.lock_writes().bump(ikey);
        self.hot.invalidate(ikey);
        self.tar_indexes.invalidate(ikey);
        if let Some(e) = self.lock_index().remove(ikey, None) {
            let _ = fs::remove_file(&e.path);
            self.refusing.store(false, Ordering::Release);
        }
    }
}
