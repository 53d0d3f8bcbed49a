//! The in-memory index of committed entries and the byte accounting of the admission
//! policy. `never-evict` admits an object while `used + reserved + size <= capacity` and
//! never removes anything to make room; `lru` removes least recently read entries until
//! the object fits. In-flight fills hold a reservation, so two fills can never together
//! overshoot the capacity. Counts are exact to the byte of object data.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use super::admission::{Admission, Refused};
use crate::backend::ObjectMeta;
use crate::cache::CachePolicy;

/// A committed cache entry.
#[derive(Debug)]
pub struct Entry {
    pub path: PathBuf,
    /// The file the path named when the entry was committed or loaded (device, inode);
    /// `None` where it could not be asked. The key's next version is published at the
    /// same path: another file.
    file: Option<(u64, u64)>,
    pub meta: ObjectMeta,
    pub crcs: Arc<[u32]>,
    /// Whether every block was checked since the entry was loaded from disk; entries
    /// committed by this process start verified.
    pub verified: AtomicBool,
    /// The cache's generation when the entry was last known to match the backend; an
    /// entry older than the cache's current generation is checked against the backend
    /// before it is served (see `Cache::revalidate_all`).
    pub checked: std::sync::atomic::AtomicU64,
    /// When (`clock::now_ms`) it was last known to match the backend: its commit or
    /// its last check; 0 for an entry loaded from disk.
    pub checked_at: std::sync::atomic::AtomicU64,
    /// Windows of its file kept mapped between hits (see `maps`).
    pub maps: super::maps::Maps,
}

impl Entry {
    /// An entry this process has just committed: every block checked as it was
    /// written, and the object current in the cache's `generation` as of now.
    pub fn fresh(path: PathBuf, meta: ObjectMeta, crcs: Vec<u32>, generation: u64) -> Entry {
        Entry {
            file: file_id(&path),
            path,
            meta,
            crcs: Arc::from(crcs),
            verified: AtomicBool::new(true),
            maps: Default::default(),
            checked: AtomicU64::new(generation),
            checked_at: AtomicU64::new(crate::clock::now_ms()),
        }
    }

    /// An entry found on disk at start: checked block by block before it is trusted,
    /// and against the source before its first hit once the cache knows it is in a
    /// cluster (which starts a new generation after `generation`).
    pub fn loaded(path: PathBuf, meta: ObjectMeta, crcs: Vec<u32>, generation: u64) -> Entry {
        Entry {
            file: file_id(&path),
            path,
            meta,
            crcs: Arc::from(crcs),
            verified: AtomicBool::new(false),
            maps: Default::default(),
            checked: AtomicU64::new(generation),
            checked_at: AtomicU64::new(0),
        }
    }

    /// Opens the entry's file: `NotFound` where the path is gone, or names another
    /// file now (the key's next version, published after this entry was looked up: a
    /// read that opens it late must not send that version's bytes as this one's).
    pub fn open(&self) -> io::Result<File> {
        let file = File::open(&self.path)?;
        if let Some(id) = self.file {
            let m = file.metadata()?;
            if (m.dev(), m.ino()) != id {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "the cache entry's file was replaced",
                ));
            }
        }
        Ok(file)
    }

    /// Bytes per checksum of this entry.
    pub fn block(&self) -> u64 {
        super::store::block_of(self.meta.size, self.crcs.len())
    }
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[derive(Debug)]
struct Slot {
    entry: Arc<Entry>,
    tick: u64,
}

/// Entries and their accounting.
#[derive(Debug)]
pub struct Index {
    policy: CachePolicy,
    capacity: u64,
    map: HashMap<String, Slot>,
    /// Read order for `lru`: tick → key.
    order: BTreeMap<u64, String>,
    tick: u64,
    used: u64,
    reserved: u64,
}

/// Numbers for stats.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub used: u64,
    pub reserved: u64,
    pub capacity: u64,
    pub objects: u64,
}

/// The map key of an object.
pub fn key_of(bucket: &str, key: &str) -> String {
    format!("{bucket}/{key}")
}

impl Index {
    pub fn new(policy: CachePolicy, capacity: u64) -> Index {
        Index {
            policy,
            capacity,
            map: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            used: 0,
            reserved: 0,
        }
    }

    pub fn usage(&self) -> Usage {
        Usage {
            used: self.used,
            reserved: self.reserved,
            capacity: self.capacity,
            objects: self.map.len() as u64,
        }
    }

    /// Every entry: its key and the entry (not a read: the LRU order stays).
    pub fn entries(&self) -> Vec<(String, Arc<Entry>)> {
        self.map
            .iter()
            .map(|(k, s)| (k.clone(), s.entry.clone()))
            .collect()
    }

    /// Whether `key` has an entry (not a read: the LRU order stays).
    pub fn contains(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// The entry of `key`, not marked as read.
    pub fn peek(&self, key: &str) -> Option<Arc<Entry>> {
        self.map.get(key).map(|s| s.entry.clone())
    }

    /// The entry of `key`, marked as read now.
    pub fn get(&mut self, key: &str) -> Option<Arc<Entry>> {
        self.tick += 1;
        let tick = self.tick;
        let slot = self.map.get_mut(key)?;
        if self.policy == CachePolicy::Lru {
            self.order.remove(&slot.tick);
            self.order.insert(tick, key.to_owned());
        }
        slot.tick = tick;
        Some(slot.entry.clone())
    }

    /// What the policy says of an object of `size` bytes; an admitted object's bytes are
    /// reserved, and the entries evicted to make room (LRU) are gone from the index (their
    /// files are the caller's to remove).
    pub fn admit(&mut self, size: u64) -> Admission {
        let fits = |ix: &Index| ix.used + ix.reserved + size <= ix.capacity;
        let mut evicted = Vec::new();
        match self.policy {
            CachePolicy::NeverEvict => {
                if !fits(self) {
                    return Admission::Refused(if size > self.capacity {
                        Refused::TooLarge
                    } else {
                        Refused::Full
                    });
                }
            }
            CachePolicy::Lru => {
                if size > self.capacity {
                    return Admission::Refused(Refused::TooLarge);
                }
                // Fills in flight hold their room: evicting every entry would not do.
                if self.reserved + size > self.capacity {
                    return Admission::Refused(Refused::Full);
                }
                while !fits(self) {
                    let Some((_, key)) = self.order.pop_first() else {
                        return Admission::Refused(Refused::Full);
                    };
                    if let Some(slot) = self.map.remove(&key) {
                        self.used -= slot.entry.meta.size;
                        evicted.push(slot.entry.path.clone());
                    }
                }
            }
        }
        self.reserved += size;
        Admission::Admitted { evicted }
    }

    /// Gives back a reservation whose fill did not commit.
    pub fn release(&mut self, size: u64) {
        self.reserved -= size;
    }

    /// Turns a reservation into a committed entry. A previous entry of the key is
    /// replaced (its file was overwritten by the commit's rename).
    pub fn commit(&mut self, key: String, entry: Entry, reserved: u64) {
        self.reserved -= reserved;
        self.insert(key, entry);
    }

    /// Adds an entry found on disk at start-up (no reservation).
    pub fn insert(&mut self, key: String, entry: Entry) {
        if let Some(old) = self.map.remove(&key) {
            self.used -= old.entry.meta.size;
            self.order.remove(&old.tick);
        }
        self.tick += 1;
        self.used += entry.meta.size;
        if self.policy == CachePolicy::Lru {
            self.order.insert(self.tick, key.clone());
        }
        self.map.insert(
            key,
            Slot {
                entry: Arc::new(entry),
                tick: self.tick,
            },
        );
    }

    /// Removes `key`'s entry, if it is still the one given (or any, with `None`).
    pub fn remove(&mut self, key: &str, only: Option<&Arc<Entry>>) -> Option<Arc<Entry>> {
        let slot = self.map.get(key)?;
        if only.is_some_and(|e| !Arc::ptr_eq(e, &slot.entry)) {
            return None;
        }
        let slot = self.map.remove(key)?;
        self.used -= slot.entry.meta.size;
        self.order.remove(&slot.tick);
        Some(slot.entry)
    }
}
