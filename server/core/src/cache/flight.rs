//! Single flight: one fill per object however many readers ask at once (in the spirit of
//! Pingora's cache lock). The first reader of an absent object gets a [`Lead`], a guard
//! that owns the object's [`Fill`]; later readers get the same `Fill` to follow. The
//! leader either starts the fill ([`Lead::start`]: the bytes are coming, followers
//! stream behind the writer) or drops the guard, which abandons the fill: followers are
//! told at once and fetch on their own, and the next reader leads a new one. A fill
//! leaves the table when it ends (committed, failed or abandoned) or when the object is
//! invalidated, so nothing waits on a fill that nobody drives.
//!
//! The table's lock is also the cache's commit lock: every commit, invalidation and
//! unlink of an entry file happens under it (see `Cache`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use super::fill::{Fill, Phase};
use crate::sync::Locked;

/// Fills in progress by key.
pub type Table = HashMap<String, Arc<Fill>>;

#[derive(Default)]
pub struct Flights {
    table: Arc<Mutex<Table>>,
}

/// What a reader of an absent object is to do.
pub enum Joined {
    /// The object was committed since the reader looked: read the entry.
    Held,
    /// Lead a new fill.
    Lead(Lead),
    /// Follow the fill another reader leads.
    Follow(Arc<Fill>),
}

impl Flights {
    /// The table, locked: the commit lock.
    pub fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.locked()
    }

    /// Joins the fill of `key` in progress, or leads a new one. Asked under the lock
    /// (commits happen under it): `held`, whether the object was committed since the
    /// reader looked (a fill that just ended is not led again); `stale`, whether a new
    /// fill must never commit (a write of the key is under way, so the source may answer
    /// with either version).
    pub fn join(
        &self,
        key: &str,
        held: impl FnOnce() -> bool,
        stale: impl FnOnce() -> bool,
    ) -> Joined {
        let mut table = self.lock();
        if let Some(f) = table.get(key) {
            return Joined::Follow(f.clone());
        }
        if held() {
            return Joined::Held;
        }
        let fill = Fill::new();
        if stale() {
            fill.stale.store(true, Ordering::Release);
        }
        table.insert(key.to_owned(), fill.clone());
        Joined::Lead(Lead {
            table: self.table.clone(),
            key: key.to_owned(),
            fill: Some(fill),
        })
    }

    /// Takes `key`'s fill out of the table (an invalidation): it is marked stale, so it
    /// never commits, and the next reader leads a new one.
    pub fn forget(table: &mut Table, key: &str) {
        if let Some(f) = table.remove(key) {
            f.stale.store(true, Ordering::Release);
        }
    }

    /// The fill of `key` in progress, if any.
    pub fn get(&self, key: &str) -> Option<Arc<Fill>> {
        self.lock().get(key).cloned()
    }

    /// Removes `fill` from the table if it is still `key`'s (under the commit lock).
    pub fn finished(table: &mut Table, key: &str, fill: &Arc<Fill>) {
        if table.get(key).is_some_and(|f| Arc::ptr_eq(f, fill)) {
            table.remove(key);
        }
    }
}

/// The leader's guard over a fill it has not started: dropped, it abandons the fill.
pub struct Lead {
    table: Arc<Mutex<Table>>,
    key: String,
    fill: Option<Arc<Fill>>,
}

impl Lead {
    #[cfg(test)]
    pub fn fill(&self) -> &Arc<Fill> {
        self.fill
            .as_ref()
            .expect("a lead holds its fill until it ends")
    }

    /// The bytes are coming: the fill is the writer's now (it leaves the table when it
    /// ends); followers stream behind it.
    pub fn start(mut self) -> Arc<Fill> {
        self.fill.take().expect("a lead starts once")
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        if let Some(fill) = self.fill.take() {
            let mut table = self.table.locked();
            Flights::finished(&mut table, &self.key, &fill);
            drop(table);
            fill.set_phase(Phase::Abandoned);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_leader_many_followers() {
        let flights = Flights::default();
        let Joined::Lead(lead) = flights.join("k", || false, || false) else {
            panic!("the first reader leads");
        };
        let Joined::Follow(f) = flights.join("k", || false, || false) else {
            panic!("the second reader follows");
        };
        assert!(Arc::ptr_eq(&f, lead.fill()));
        assert!(matches!(
            flights.join("other", || false, || false),
            Joined::Lead(_)
        ));
        assert!(
            matches!(flights.join("new", || true, || false), Joined::Held),
            "committed since the reader looked"
        );
        let fill = lead.start();
        fill.set_phase(Phase::Filling);
        assert_eq!(f.started().await.phase, Phase::Filling);
        // Still in the table until the writer ends it.
        assert!(matches!(
            flights.join("k", || false, || false),
            Joined::Follow(_)
        ));
        Flights::finished(&mut flights.lock(), "k", &fill);
        assert!(matches!(
            flights.join("k", || false, || false),
            Joined::Lead(_)
        ));
    }

    #[tokio::test]
    async fn a_leader_that_gives_up_releases_its_followers() {
        let flights = Flights::default();
        let Joined::Lead(lead) = flights.join("k", || false, || false) else {
            panic!("leads");
        };
        let Joined::Follow(f) = flights.join("k", || false, || false) else {
            panic!("follows");
        };
        let waiting = tokio::spawn(async move { f.started().await.phase });
        drop(lead);
        assert_eq!(waiting.await.unwrap(), Phase::Abandoned);
        assert!(matches!(
            flights.join("k", || false, || false),
            Joined::Lead(_)
        ));
    }

    #[test]
    fn an_invalidated_fill_never_commits_and_is_not_joined() {
        let flights = Flights::default();
        let Joined::Lead(lead) = flights.join("k", || false, || true) else {
            panic!("leads");
        };
        assert!(
            lead.fill().stale.load(Ordering::Acquire),
            "a write is under way"
        );
        let Joined::Lead(lead) = flights.join("j", || false, || false) else {
            panic!("leads");
        };
        let fill = lead.start();
        Flights::forget(&mut flights.lock(), "j");
        assert!(fill.stale.load(Ordering::Acquire));
        let Joined::Lead(_new) = flights.join("j", || false, || false) else {
            panic!("an invalidated fill is not joined");
        };
        // The old fill ending later does not remove the new one.
        Flights::finished(&mut flights.lock(), "j", &fill);
        assert!(matches!(
            flights.join("j", || false, || false),
            Joined::Follow(_)
        ));
    }
}
