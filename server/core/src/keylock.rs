//! One async lock per key, held only while something is under way for that key: two
//! conditional writes of one object (the node), two builds of one shard's member index
//! (the cache) go one after the other. A key's lock is dropped once nobody holds it.

use crate::sync::Locked;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};

pub type KeyLock = tokio::sync::Mutex<()>;

pub struct KeyLocks<K>(Mutex<HashMap<K, Weak<KeyLock>>>);

impl<K> Default for KeyLocks<K> {
    fn default() -> Self {
        KeyLocks(Mutex::new(HashMap::new()))
    }
}

impl<K: Eq + Hash> KeyLocks<K> {
    /// The lock of `key`: the one its holders hold, or a new one.
    pub fn of(&self, key: K) -> Arc<KeyLock> {
        let mut map = self.0.locked();
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(lock) = map.get(&key).and_then(Weak::upgrade) {
            return lock;
        }
        let lock = Arc::new(KeyLock::new(()));
        map.insert(key, Arc::downgrade(&lock));
        lock
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.locked().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lock_per_key_while_it_is_held() {
        let locks = KeyLocks::default();
        let a = locks.of(("b", "k"));
        assert!(Arc::ptr_eq(&a, &locks.of(("b", "k"))));
        assert!(!Arc::ptr_eq(&a, &locks.of(("b", "other"))));
        drop(a);
        let _ = locks.of(("b", "k2"));
        assert_eq!(locks.len(), 1, "released locks are dropped");
    }
}
