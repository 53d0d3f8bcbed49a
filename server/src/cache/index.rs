//! The in-memory index of committed entries and the byte accounting of the admission
//! policy. `never-evict` admits an object while `used + reserved + size <= capacity` and
//! never removes anything to make room; `lru` removes least recently read entries until
//! the object fits. In-flight fills hold a reservation, so two fills can never together
//! overshoot the capacity. Counts are exact to the byte of object data.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::backend::ObjectMeta;
use crate::config::CachePolicy;

/// A committed cache entry.
#[derive(Debug)]
pub struct Entry {
    pub path: PathBuf,
    pub meta: ObjectMeta,
    pub crcs: Arc<[u32]>,
    /// Whether every block was checked since the entry was loaded from disk; entries
    /// committed by this process start verified.
    pub verified: AtomicBool,
    /// The cache's generation when the entry was last known to match the backend; an
    /// entry older than the cache's current generation is checked against the backend
    /// before it is served (see `Cache::revalidate_all`).
    pub checked: std::sync::atomic::AtomicU64,
}

impl Entry {
    /// Bytes per checksum of this entry.
    pub fn block(&self) -> u64 {
        super::store::block_of(self.meta.size, self.crcs.len())
    }
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

    /// Reserves room for an object of `size` bytes. Returns the files of entries evicted
    /// to make room (to be removed by the caller), or `None` if it cannot be admitted.
    pub fn reserve(&mut self, size: u64) -> Option<Vec<PathBuf>> {
        let fits = |ix: &Index| ix.used + ix.reserved + size <= ix.capacity;
        let mut evicted = Vec::new();
        match self.policy {
            CachePolicy::NeverEvict => {
                if !fits(self) {
                    return None;
                }
            }
            CachePolicy::Lru => {
                if size > self.capacity {
                    return None;
                }
                while !fits(self) {
                    let (_, key) = self.order.pop_first()?;
                    if let Some(slot) = self.map.remove(&key) {
                        self.used -= slot.entry.meta.size;
                        evicted.push(slot.entry.path.clone());
                    }
                }
            }
        }
        self.reserved += size;
        Some(evicted)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn entry(size: u64) -> Entry {
        Entry {
            path: PathBuf::from(format!("/e{size}")),
            meta: ObjectMeta {
                size,
                etag: String::new(),
                last_modified: SystemTime::now(),
                headers: Vec::new(),
            },
            crcs: Arc::from(Vec::new()),
            verified: AtomicBool::new(true),
            checked: std::sync::atomic::AtomicU64::new(0),
        }
    }

    #[test]
    fn never_evict_admits_until_full_counting_reservations() {
        let mut ix = Index::new(CachePolicy::NeverEvict, 100);
        assert!(ix.reserve(60).is_some());
        assert!(ix.reserve(50).is_none(), "in-flight 60 + 50 > 100");
        assert!(ix.reserve(40).is_some());
        ix.commit("a".into(), entry(60), 60);
        ix.release(40);
        let u = ix.usage();
        assert_eq!((u.used, u.reserved, u.objects), (60, 0, 1));
        assert!(ix.reserve(41).is_none());
        assert_eq!(ix.reserve(40).map(|v| v.len()), Some(0));
        ix.commit("b".into(), entry(40), 40);
        assert_eq!(ix.usage().used, 100);
        assert!(ix.reserve(1).is_none(), "full: nothing is ever removed");
        assert!(ix.get("a").is_some());
    }

    #[test]
    fn lru_evicts_least_recently_read() {
        let mut ix = Index::new(CachePolicy::Lru, 100);
        for (k, s) in [("a", 40), ("b", 40)] {
            ix.reserve(s).unwrap();
            ix.commit(k.into(), entry(s), s);
        }
        ix.get("a");
        let evicted = ix.reserve(40).unwrap();
        assert_eq!(evicted, vec![PathBuf::from("/e40")]);
        assert!(ix.get("b").is_none(), "b was least recently read");
        assert!(ix.get("a").is_some());
        assert!(ix.reserve(101).is_none());
        assert_eq!(ix.usage().used + ix.usage().reserved, 80);
    }

    #[test]
    fn remove_only_the_given_entry() {
        let mut ix = Index::new(CachePolicy::NeverEvict, 100);
        ix.insert("a".into(), entry(10));
        let old = ix.get("a").unwrap();
        ix.insert("a".into(), entry(20));
        assert!(ix.remove("a", Some(&old)).is_none());
        assert_eq!(ix.usage().used, 20);
        assert!(ix.remove("a", None).is_some());
        assert_eq!(ix.usage().used, 0);
    }
}
