//! The cluster: its members, which of them are up, and which one owns a key.
//!
//! Every node is given the same member list (`--peer ID=URL`, itself included). Each key
//! has one owner by weighted rendezvous hashing (`ring`), weights being the members' cache
//! capacities, so mixed disks fill evenly. Members are probed every second
//! (`membership`); one that fails two probes in a row, or refuses a forwarded request,
//! is down and its keys go to the next member in the key's ranking until it answers
//! again. A request for a key owned elsewhere is proxied or redirected there (`route`);
//! a miss on the owner is filled from a peer that holds the object before the backend
//! (`peer`).

mod error;
pub mod membership;
pub mod peer;
pub mod ring;

pub use error::ClusterError;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde_json::json;

use granary_proto::auth::Credentials;

use crate::config::{parse_peer, Config, ConfigError, RouteMode};
use crate::stats::Stats;
use ring::{key_hash, Ring, RingNode};

/// One member of the cluster, this node included.
#[derive(Debug)]
pub struct Member {
    pub id: String,
    /// Base URL, without a trailing `/`.
    pub url: String,
    up: AtomicBool,
    /// Probes failed in a row.
    fails: AtomicU32,
    /// The member's cache capacity in bytes, as it reports it; 0 until first heard.
    weight: AtomicU64,
    /// The member's cache has stopped admitting (never-evict, full), as last heard.
    full: AtomicBool,
    /// Bytes the member's cache could still admit, as last heard.
    free: AtomicU64,
    /// Heard at least once: a later return from down is a return, not a first meeting.
    met: AtomicBool,
}

impl Member {
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

pub struct Cluster {
    me: usize,
    members: Vec<Member>,
    /// Rebuilt when a member's weight changes; up/down does not change it.
    ring: RwLock<Arc<Ring>>,
    pub route: RouteMode,
    pub(crate) creds: Option<Credentials>,
    pub(crate) http: peer::HttpClient,
    pub(crate) stats: Arc<Stats>,
    /// Called when this node hears a member again after hearing none: it may have
    /// missed invalidations meanwhile.
    on_rejoin: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Cluster {
    /// The members named by `config.peer` (or this node alone), this node weighing
    /// `capacity`. Other members start down until their first probe answers.
    pub fn new(
        config: &Config,
        node_id: &str,
        capacity: u64,
        stats: Arc<Stats>,
    ) -> Result<Cluster, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            field: "peer",
            message,
        };
        let mut list: Vec<(String, String)> = config
            .peer
            .iter()
            .map(|p| parse_peer(p))
            .collect::<Result<_, _>>()?;
        if list.is_empty() {
            let scheme = if config.tls_cert.is_some() {
                "https"
            } else {
                "http"
            };
            list.push((node_id.to_owned(), format!("{scheme}://{}", config.listen)));
        }
        list.sort();
        if let Some(w) = list.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(invalid(format!("node `{}` is listed twice", w[0].0)));
        }
        let me = list
            .iter()
            .position(|(id, _)| id == node_id)
            .ok_or_else(|| {
                invalid(format!(
                "this node's id `{node_id}` is not among the peers; set --node-id to one of them"
            ))
            })?;
        let members = list
            .into_iter()
            .enumerate()
            .map(|(i, (id, url))| Member {
                id,
                url,
                up: AtomicBool::new(i == me),
                fails: AtomicU32::new(0),
                weight: AtomicU64::new(if i == me { capacity } else { 0 }),
                full: AtomicBool::new(false),
                free: AtomicU64::new(0),
                met: AtomicBool::new(i == me),
            })
            .collect();
        let cluster = Cluster {
            me,
            members,
            ring: RwLock::new(Arc::new(Ring::new([]))),
            route: config.route,
            creds: config.credentials(),
            http: peer::http_client(config.tls_cert.as_deref())
                .map_err(|e| invalid(format!("{e:#}")))?,
            stats,
            on_rejoin: std::sync::OnceLock::new(),
        };
        cluster.rebuild_ring();
        Ok(cluster)
    }

    /// What to do when this node, cut off from every other member, hears one again.
    pub fn on_rejoin(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_rejoin.set(Box::new(f));
    }

    fn rejoined(&self) {
        tracing::warn!("heard the cluster again after hearing no member; cached copies will be checked against the backend");
        if let Some(f) = self.on_rejoin.get() {
            f();
        }
    }

    fn rebuild_ring(&self) {
        let ring = Ring::new(self.members.iter().map(|m| RingNode {
            id: m.id.clone(),
            weight: m.weight() as f64,
        }));
        debug_assert!(ring
            .nodes()
            .iter()
            .zip(&self.members)
            .all(|(n, m)| n.id == m.id));
        *self.ring.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(ring);
    }

    fn ring(&self) -> Arc<Ring> {
        self.ring.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// True when this node is the whole cluster.
    pub fn is_single(&self) -> bool {
        self.members.len() == 1
    }

    pub fn me(&self) -> usize {
        self.me
    }

    pub fn member(&self, i: usize) -> &Member {
        &self.members[i]
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The member that owns the key now: the best-ranked member that is up. This node
    /// when no member of positive weight is up.
    pub fn owner_of_hash(&self, kh: u64) -> usize {
        self.ring()
            .owner_where(kh, |i| self.members[i].is_up())
            .unwrap_or(self.me)
    }

    pub fn owner(&self, bucket: &str, key: &str) -> usize {
        self.owner_of_hash(key_hash(bucket, key))
    }

    /// Up members other than this one, best-ranked for the key first.
    pub fn others_ranked(&self, bucket: &str, key: &str) -> Vec<usize> {
        self.ring()
            .ranked(key_hash(bucket, key))
            .into_iter()
            .filter(|&i| i != self.me && self.members[i].is_up())
            .collect()
    }

    /// Up members other than this one.
    pub fn others_up(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.members.len()).filter(move |&i| i != self.me && self.members[i].is_up())
    }

    /// Marks a member down now (a forwarded request found it gone); the next probe
    /// that answers brings it back.
    pub fn mark_down(&self, i: usize, why: impl std::fmt::Display) {
        if i == self.me {
            return;
        }
        let m = &self.members[i];
        if m.up.swap(false, Ordering::AcqRel) {
            tracing::warn!(node = %m.id, reason = %why, "cluster member down");
        }
    }

    /// Whether a member could take an object of `size` bytes (0: unknown) that others
    /// could not admit, as last heard. `tried` are the ids of members that refused it.
    fn has_room(&self, i: usize, size: u64, tried: &[&str]) -> bool {
        let m = &self.members[i];
        i != self.me
            && m.is_up()
            && !m.is_full()
            && m.free.load(Ordering::Relaxed) >= size.max(1)
            && !tried.contains(&m.id.as_str())
    }

    /// Whether another member could take an object this node cannot admit. Cheap: no
    /// ranking, so it can be asked on every read.
    pub fn can_spill(&self, tried: &[&str]) -> bool {
        (0..self.members.len()).any(|i| self.has_room(i, 0, tried))
    }

    /// Where to leave an object of `size` bytes this node cannot admit: the best-ranked
    /// other member that, as last heard, is up and has room, and has not refused it.
    pub fn spill_target(
        &self,
        bucket: &str,
        key: &str,
        size: u64,
        tried: &[&str],
    ) -> Option<usize> {
        if self.is_single() {
            return None;
        }
        self.others_ranked(bucket, key)
            .into_iter()
            .find(|&i| self.has_room(i, size, tried))
    }

    /// Records a probe's answer: up, with this weight, admitting or not, with this many
    /// bytes of room.
    fn heard(&self, i: usize, weight: u64, full: bool, free: u64) {
        let m = &self.members[i];
        m.fails.store(0, Ordering::Relaxed);
        m.full.store(full, Ordering::Relaxed);
        m.free.store(free, Ordering::Relaxed);
        m.met.store(true, Ordering::Relaxed);
        if m.weight.swap(weight, Ordering::Relaxed) != weight {
            self.rebuild_ring();
        }
        if !m.up.swap(true, Ordering::AcqRel) {
            tracing::info!(node = %m.id, weight, "cluster member up");
        }
    }

    /// Whether member `i` is down after having been up: while it was down, this node
    /// sent it no invalidations.
    fn returning(&self, i: usize) -> bool {
        let m = &self.members[i];
        m.met.load(Ordering::Relaxed) && !m.is_up()
    }

    /// Records a failed probe; the second in a row marks the member down.
    fn unheard(&self, i: usize, why: &str) {
        let m = &self.members[i];
        let fails = m.fails.fetch_add(1, Ordering::Relaxed) + 1;
        if fails >= membership::FAILS_TO_DOWN {
            self.mark_down(i, why);
        }
    }

    /// `/_granary/cluster`: the members and, for a key, its owner.
    pub fn view(&self, key: Option<(&str, &str)>) -> serde_json::Value {
        let members: Vec<_> = self
            .members
            .iter()
            .map(|m| {
                json!({
                    "id": m.id,
                    "url": m.url,
                    "state": if m.is_up() { "up" } else { "down" },
                    "weight": m.weight(),
                    "admitting": !m.is_full(),
                })
            })
            .collect();
        let mut v = json!({
            "node_id": self.members[self.me].id,
            "route": match self.route {
                RouteMode::Proxy => "proxy",
                RouteMode::Redirect => "redirect",
            },
            "members": members,
        });
        if let Some((bucket, key)) = key {
            v["owner"] = json!(self.members[self.owner(bucket, key)].id);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(peers: &[&str]) -> Config {
        Config {
            peer: peers.iter().map(|s| s.to_string()).collect(),
            ..Config::default()
        }
    }

    #[test]
    fn membership_is_checked() {
        let stats = Arc::new(Stats::default());
        let c = Cluster::new(&config(&[]), "solo", 10, stats.clone()).unwrap();
        assert!(c.is_single());
        assert_eq!(c.owner("b", "k"), c.me());
        let peers = ["b=http://127.0.0.1:2", "a=http://127.0.0.1:1"];
        let c = Cluster::new(&config(&peers), "b", 10, stats.clone()).unwrap();
        assert_eq!(c.member(c.me()).id, "b");
        assert_eq!(c.members().len(), 2);
        // The other member is down until heard: every key is ours.
        assert!(!c.member(0).is_up());
        assert!((0..100).all(|i| c.owner("b", &i.to_string()) == c.me()));
        assert!(Cluster::new(&config(&peers), "c", 10, stats.clone()).is_err());
        let dup = ["a=http://127.0.0.1:1", "a=http://127.0.0.1:2"];
        assert!(Cluster::new(&config(&dup), "a", 10, stats).is_err());
    }

    #[test]
    fn owners_follow_probes() {
        let stats = Arc::new(Stats::default());
        let peers = ["a=http://127.0.0.1:1", "b=http://127.0.0.1:2"];
        let c = Cluster::new(&config(&peers), "a", 100, stats).unwrap();
        c.heard(1, 100, false, 100);
        let owned_by_b = (0..1000)
            .filter(|i| c.owner("bk", &i.to_string()) == 1)
            .count();
        assert!((400..600).contains(&owned_by_b), "{owned_by_b}");
        // One failed probe is not enough; two are.
        c.unheard(1, "test");
        assert!(c.member(1).is_up());
        c.unheard(1, "test");
        assert!(!c.member(1).is_up());
        assert!((0..1000).all(|i| c.owner("bk", &i.to_string()) == 0));
        c.heard(1, 300, false, 300);
        let owned_by_b = (0..1000)
            .filter(|i| c.owner("bk", &i.to_string()) == 1)
            .count();
        assert!(
            (680..820).contains(&owned_by_b),
            "weight 3:1 → {owned_by_b}"
        );
        let v = c.view(Some(("bk", "1")));
        assert_eq!(v["members"][1]["weight"], 300);
        assert_eq!(v["members"][1]["state"], "up");
        assert!(v["owner"] == "a" || v["owner"] == "b");
    }
}
