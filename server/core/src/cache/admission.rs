//! Admission: whether an object gets room in the cache. The policy (in the index, which
//! keeps the byte accounting) answers with an [`Admission`]: admitted, with the entries
//! it evicted to make room (LRU only), or refused and why. `never-evict` admits while
//! `used + reserved + size <= capacity` and never removes anything; once it refuses for
//! want of room (or for any object, when it has none) the cache is `refusing` (health
//! says so, members spill to others) until an entry is removed. Whatever the policy
//! says, the filesystem has the last word (`room`).

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::Cache;

/// Cache admission policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CachePolicy {
    /// Admit until full, then serve the rest straight through; never remove.
    NeverEvict,
    /// Least recently used, for comparison.
    Lru,
}

impl CachePolicy {
    /// Every policy, as flags and the TOML file name them.
    pub const NAMES: [&'static str; 2] = ["never-evict", "lru"];

    pub fn as_str(self) -> &'static str {
        match self {
            CachePolicy::NeverEvict => "never-evict",
            CachePolicy::Lru => "lru",
        }
    }
}

impl std::str::FromStr for CachePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<CachePolicy, String> {
        match s {
            "never-evict" => Ok(CachePolicy::NeverEvict),
            "lru" => Ok(CachePolicy::Lru),
            _ => Err(format!("`{s}`: expected never-evict or lru")),
        }
    }
}

/// The policy's answer for an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Room is reserved for it; these entry files were evicted to make it (LRU).
    Admitted {
        evicted: Vec<PathBuf>,
    },
    Refused(Refused),
}

/// Why an object was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The cache is full (or its room is held by fills in flight).
    Full,
    /// The object is larger than the whole cache.
    TooLarge,
}

#[cfg(test)]
impl Admission {
    pub fn is_admitted(&self) -> bool {
        matches!(self, Admission::Admitted { .. })
    }
}

impl Cache {
    /// Asks the policy for room for `size` bytes (none while distrusted, closed or while
    /// the disk is full), then the filesystem; removes the files of the entries the policy evicts.
    /// Under the commit lock, as every commit and unlink of an entry file is: an evicted
    /// key's file cannot be a newer commit of that key.
    pub(super) fn admit(&self, size: u64) -> bool {
        if !self.trusted() || self.room.full() || self.closed.load(Ordering::Acquire) {
            return false;
        }
        // Asked before the locks: they serialize every commit.
        let disk_free = self.room.look_for_reservations();
        let _commit = self.flights.lock();
        let mut index = self.lock_index();
        match index.admit(size) {
            Admission::Admitted { evicted } => {
                for p in evicted {
                    let _ = fs::remove_file(p);
                }
                if !self.room.fits(disk_free, index.usage().reserved) {
                    index.release(size);
                    return false;
                }
                true
            }
            Admission::Refused(_) => {
                if self.policy == CachePolicy::NeverEvict {
                    self.refusing.store(true, Ordering::Release);
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::index::{Entry, Index};
    use super::*;
    use crate::backend::ObjectMeta;
    use crate::cache::CachePolicy;
    use std::path::PathBuf;
    use std::time::SystemTime;

    fn entry(size: u64) -> Entry {
        let meta = ObjectMeta {
            size,
            etag: String::new(),
            last_modified: SystemTime::now(),
            headers: Vec::new(),
        };
        Entry::fresh(PathBuf::from(format!("/e{size}")), meta, Vec::new(), 0)
    }

    #[test]
    fn never_evict_admits_until_full_counting_reservations() {
        let mut ix = Index::new(CachePolicy::NeverEvict, 100);
        assert!(ix.admit(60).is_admitted());
        assert_eq!(
            ix.admit(50),
            Admission::Refused(Refused::Full),
            "in-flight 60 + 50 > 100"
        );
        assert!(ix.admit(40).is_admitted());
        ix.commit("a".into(), entry(60), 60);
        ix.release(40);
        let u = ix.usage();
        assert_eq!((u.used, u.reserved, u.objects), (60, 0, 1));
        assert!(!ix.admit(41).is_admitted());
        assert_eq!(ix.admit(40), Admission::Admitted { evicted: vec![] });
        ix.commit("b".into(), entry(40), 40);
        assert_eq!(ix.usage().used, 100);
        assert!(!ix.admit(1).is_admitted(), "full: nothing is ever removed");
        assert_eq!(ix.admit(101), Admission::Refused(Refused::TooLarge));
        assert!(ix.get("a").is_some());
    }

    #[test]
    fn lru_evicts_least_recently_read() {
        let mut ix = Index::new(CachePolicy::Lru, 100);
        for (k, s) in [("a", 40), ("b", 40)] {
            assert!(ix.admit(s).is_admitted());
            ix.commit(k.into(), entry(s), s);
        }
        ix.get("a");
        assert_eq!(
            ix.admit(40),
            Admission::Admitted {
                evicted: vec![PathBuf::from("/e40")]
            }
        );
        assert!(ix.get("b").is_none(), "b was least recently read");
        assert!(ix.get("a").is_some());
        assert_eq!(ix.admit(101), Admission::Refused(Refused::TooLarge));
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
