//! Whether this node's copies can be trusted as they are, and its lease: what members
//! say of it when probed (they list it, they see it up) decides whether its hits are
//! served unchecked (ARCHITECTURE.md, "The lease").

use std::sync::atomic::Ordering;

use super::{membership, Cluster, Member};

impl Cluster {
    /// Whether this node's cached copies can be served as they are: its view is
    /// settled, it is in its own list, and every member it sees up lists it and sees it
    /// up (said so when last probed), so every write made through them reaches its
    /// copies. Otherwise each hit is checked against the backend, and nothing new is
    /// cached, until it holds again.
    pub fn trusted(&self) -> bool {
        let v = self.view();
        self.settled()
            && self.listed.load(Ordering::Acquire)
            && v.members
                .iter()
                .all(|m| m.id == self.id || !m.is_up() || m.aware.load(Ordering::Acquire))
    }

    /// What to do when [`Cluster::trusted`] changes (called with the new value).
    pub fn on_trust(&self, f: impl Fn(bool) + Send + Sync + 'static) {
        let _ = self.on_trust.set(Box::new(f));
    }

    /// This process's boot identity (told in health answers).
    pub fn boot(&self) -> &str {
        &self.boot
    }

    /// Until when (`clock::now_ms`) no member can write without awaiting this node:
    /// [`membership::LEASE`] after the oldest of the last renewals by the members seen
    /// up (each its answer to an announcing probe, seeing this node up; see
    /// ARCHITECTURE.md). `u64::MAX` while no other member is up: none of them is
    /// routed to, and one that writes meanwhile tells this node to check its copies
    /// before it sees it up again.
    pub fn lease_until(&self) -> u64 {
        let lease = membership::LEASE.as_millis() as u64;
        self.others_up()
            .iter()
            .map(|m| m.renewed.load(Ordering::Acquire).saturating_add(lease))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// What to do with [`Cluster::lease_until`] (told after every probe).
    pub fn on_lease(&self, f: impl Fn(u64) + Send + Sync + 'static) {
        let _ = self.on_lease.set(Box::new(f));
    }

    /// Tells `on_trust` when [`Cluster::trusted`] changed since it was last told, and
    /// `on_lease` the lease.
    pub(crate) fn check_trust(&self) {
        let until = self.lease_until();
        let out = crate::clock::now_ms() > until;
        if self.lapsed.swap(out, Ordering::AcqRel) != out && self.settled() {
            if out {
                tracing::warn!("lease out: a member seen up has not renewed it in time (or none is up); checking every hit against the backend");
            } else {
                tracing::info!(
                    "lease renewed: every copy is checked once more before its next hit"
                );
            }
        }
        if let Some(f) = self.on_lease.get() {
            f(until);
        }
        let now = self.trusted();
        if self.trust_told.swap(now, Ordering::AcqRel) != now {
            if !now && self.settled() {
                tracing::info!("not every member lists this node: checking every hit against the backend until they do");
            }
            if let Some(f) = self.on_trust.get() {
                f(now);
            }
        }
    }

    /// Records whether member `m` lists this node, as its answer to an announcing probe
    /// said.
    pub(crate) fn set_aware(&self, m: &Member, aware: bool) {
        m.aware.store(aware, Ordering::Release);
    }

    /// Members seen up that do not list this node, as they last said.
    pub fn unaware(&self) -> Vec<String> {
        self.others_up()
            .into_iter()
            .filter(|m| !m.aware.load(Ordering::Acquire))
            .map(|m| m.id.clone())
            .collect()
    }

    /// Marks the view settled (once); true the first time.
    pub(crate) fn set_settled(&self) -> bool {
        let first = !self.settled.swap(true, Ordering::AcqRel);
        self.check_trust();
        first
    }
}
