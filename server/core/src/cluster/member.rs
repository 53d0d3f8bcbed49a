//! A member of the cluster as this node knows it ([`Member`]: its state as last heard),
//! and the members at one moment with the ring over them ([`View`]).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use super::calls::{Drain, Handover};
use super::ring::{Ring, RingNode};
use crate::sync::Locked;

/// Whether a view is this node alone, added to an empty list.
pub(super) fn list_was_empty(v: &View) -> bool {
    v.members.len() == 1
}

/// One member of the cluster, this node included.
#[derive(Debug)]
pub struct Member {
    pub(crate) id: String,
    /// Base URL, without a trailing `/`.
    pub(crate) url: String,
    pub(super) up: AtomicBool,
    /// Probes failed in a row.
    pub(super) fails: AtomicU32,
    /// The member's cache capacity in bytes, as it reports it; 0 until first heard.
    pub(super) weight: AtomicU64,
    /// The member's cache has stopped admitting (never-evict, full), as last heard.
    pub(super) full: AtomicBool,
    /// Bytes the member's cache could still admit, as last heard.
    pub(super) free: AtomicU64,
    /// This node may have changed objects the member holds copies of without telling
    /// it: it was down or not yet heard from, or an invalidation did not reach it. It is
    /// told to check its copies before it is routed to again.
    pub(super) missed: AtomicBool,
    /// The member lists this node, as its answer to this node's last announcing probe
    /// said: writes made through it reach this node's copies.
    pub(super) aware: AtomicBool,
    /// Its boot identity, as its last health answer said: this node's requests to it are
    /// signed for that incarnation only.
    pub(super) boot: std::sync::Mutex<String>,
    /// When (`clock::now_ms`) this node sent its last announcing probe that the member
    /// answered seeing it up: the member will not write without awaiting this node
    /// before [`membership::LEASE`] after that, so this node's lease runs until then.
    pub(super) renewed: AtomicU64,
    /// When this node last answered the member's announcement seeing it up: the
    /// member's lease from this node runs until [`membership::LEASE`] after that at the
    /// latest, so a write not acknowledged by it waits that long.
    pub(super) granted: AtomicU64,
    /// Its part in the cluster ([`Drain`] as a number): a draining member owns no key.
    pub(super) drain: AtomicU8,
    /// Its latest hand-over of copies, as last heard.
    pub(super) handover: std::sync::Mutex<Option<Handover>>,
}

impl Member {
    pub(super) fn new(id: String, url: String) -> Member {
        Member {
            id,
            url,
            up: AtomicBool::new(false),
            fails: AtomicU32::new(0),
            weight: AtomicU64::new(0),
            full: AtomicBool::new(false),
            free: AtomicU64::new(0),
            missed: AtomicBool::new(true),
            aware: AtomicBool::new(false),
            boot: std::sync::Mutex::new(String::new()),
            renewed: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            drain: AtomicU8::new(0),
            handover: std::sync::Mutex::new(None),
        }
    }

    /// Its part in the cluster, as last heard (this node's: as it is).
    pub fn drain(&self) -> Drain {
        Drain::from_code(self.drain.load(Ordering::Acquire))
    }

    /// Sets its part; whether it changed.
    pub(super) fn set_drain(&self, d: Drain) -> bool {
        self.drain.swap(d as u8, Ordering::AcqRel) != d as u8
    }

    /// Whether it may own keys: up, and not leaving by a drain.
    pub(super) fn may_own(&self) -> bool {
        self.is_up() && self.drain().is_serving()
    }

    /// Its boot identity as last heard (empty before its first health answer).
    pub(crate) fn boot(&self) -> String {
        self.boot.locked().clone()
    }

    /// Records its boot identity from a health answer; whether it changed (the member
    /// restarted).
    pub(crate) fn set_boot(&self, boot: &str) -> bool {
        let mut b = self.boot.locked();
        if *b == boot {
            return false;
        }
        *b = boot.to_owned();
        true
    }

    /// The member's id in the cluster.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where it listens: a base URL, without a trailing `/`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    pub fn weight(&self) -> u64 {
        self.weight.load(Ordering::Relaxed)
    }

    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }
}

/// The members as this node sees them at one moment, sorted by id, and the ring over
/// them (ring index `i` is `members[i]`).
pub struct View {
    pub(super) members: Vec<Arc<Member>>,
    pub(super) ring: Ring,
    pub(super) me: usize,
}

impl View {
    pub(super) fn new(members: Vec<Arc<Member>>, me: usize) -> View {
        let ring = Ring::new(members.iter().map(|m| RingNode {
            id: m.id.clone(),
            weight: m.weight() as f64,
        }));
        View { members, ring, me }
    }

    pub fn members(&self) -> &[Arc<Member>] {
        &self.members
    }

    /// The member that owns the key now: the best-ranked member that is up and not
    /// draining; this node when none of positive weight is.
    pub(super) fn owner_of_hash(&self, kh: u64) -> &Arc<Member> {
        let i = self
            .ring
            .owner_where(kh, |i| self.members[i].may_own())
            .unwrap_or(self.me);
        &self.members[i]
    }
}

/// Who owns which key at one moment: a view, and which of its members could own keys
/// then (up, and not leaving by a drain). Two equal snapshots give every key the same
/// owner, so what was worked out from one (a plan's shards by owner) holds while the
/// snapshot taken now equals it.
#[derive(Clone)]
pub struct Owners {
    view: Arc<View>,
    may_own: Vec<bool>,
}

impl Owners {
    pub(super) fn of(view: Arc<View>) -> Owners {
        let may_own = view.members.iter().map(|m| m.may_own()).collect();
        Owners { view, may_own }
    }

    /// Whether this node owns the key hashed to `kh` (as [`View::owner_of_hash`]
    /// would have said when the snapshot was taken).
    pub fn is_mine(&self, kh: u64) -> bool {
        let v = &self.view;
        v.ring.owner_where(kh, |i| self.may_own[i]).unwrap_or(v.me) == v.me
    }
}

impl PartialEq for Owners {
    fn eq(&self, other: &Owners) -> bool {
        Arc::ptr_eq(&self.view, &other.view) && self.may_own == other.may_own
    }
}
