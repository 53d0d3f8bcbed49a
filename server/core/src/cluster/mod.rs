//! The cluster: its members, which of them are up, and which one owns a key.
//!
//! Every node works from a member list (`--peer ID=URL`, itself included, or one that
//! changes while it runs: `--peers-file`, `--peers-dns`; see `source`). Each key has one
//! owner by weighted rendezvous hashing (`ring`), weights being the members' cache
//! capacities, so mixed disks fill evenly. The list and the ring over it form a [`View`],
//! swapped whole when the list or a weight changes; a member's state (up, its room, what
//! it may have missed) lives in its [`Member`], shared by every view that lists it.
//!
//! Members are probed every second (`membership`); one that fails two probes in a row,
//! or refuses a forwarded request, is down and its keys go to the next member in the
//! key's ranking until it answers again. A node answers `/_granary/health` only once it
//! has probed every member and every one that answered lists it (its view is settled),
//! and its probes announce it: a member that hears from a member it does not see up
//! probes it back before answering, so when every member answers health, they all see
//! one another.
//!
//! A node trusts its cached copies ([`Cluster::trusted`]) only while every member it
//! sees up lists it, so that every write made through them reaches its copies (writes
//! wait for that, `peer::invalidate_members`); members taken out of the list are still
//! told of writes for [`DEPARTED_GRACE`]. The argument is in ARCHITECTURE.md.
//!
//! Requests between members carry proof of membership (`x-granary-hop`, a MAC under the
//! cluster's secret: `--cluster-secret`, else the secret key), so members' headers mean
//! nothing from anyone else.

mod auth;
pub mod calls;
mod config;
mod error;
mod member;
pub mod membership;
pub mod peer;
mod replay;
pub mod ring;
pub mod source;
#[cfg(test)]
pub(crate) mod testnet;
pub mod transport;
mod trust;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::stats::Stats;
use crate::sync::{Locked, RwLocked};
use calls::{Drain, Handover};
use ring::key_hash;

pub(crate) use auth::Outgoing;
pub use config::{parse_peer, ClusterConfig, ConfigError, RouteMode};
pub use error::ClusterError;
use member::list_was_empty;
pub use member::{Member, Owners, View};

/// How long writes still tell a member taken out of the list (every member's list has
/// caught up long before: a peers file is read every second, DNS every few seconds).
pub const DEPARTED_GRACE: Duration = Duration::from_secs(60);

pub struct Cluster {
    /// This node's id.
    id: String,
    /// This process's boot identity: members sign their requests to it for this
    /// incarnation, so what was signed for an earlier one is refused.
    boot: String,
    view: RwLock<Arc<View>>,
    pub(crate) route: RouteMode,
    /// What members prove membership with; `None`: an open cluster, whose members'
    /// headers are taken as they come.
    secret: Option<String>,
    /// Nonces of members' requests that changed something, for replays.
    nonces: replay::Nonces,
    /// How this node's own URL is written when it must add itself to a list.
    own_url: String,
    /// How requests reach members.
    transport: Box<dyn transport::Transport>,
    pub(crate) stats: Arc<Stats>,
    /// Set once every member has been probed once and every member that answered lists
    /// this node (see `membership`).
    settled: AtomicBool,
    /// The member list follows a file or a DNS name: others may join at any time.
    dynamic: bool,
    /// This node is in its own member list (a node taken out of the list keeps serving
    /// until it is stopped, but no longer hears of every change).
    listed: AtomicBool,
    /// The member list's source has answered once (a DNS name may not at first).
    source_ready: AtomicBool,
    /// [`Cluster::trusted`] as last told to `on_trust`.
    trust_told: AtomicBool,
    /// Members taken out of the list lately, and when: writes still tell them, since a
    /// member whose list lags may route to them for a moment.
    departed: std::sync::Mutex<Vec<(Arc<Member>, Instant)>>,
    /// Called with whether this node's cached copies can be trusted (see [`Cluster::trusted`]),
    /// each time that changes.
    on_trust: OnceLock<Box<dyn Fn(bool) + Send + Sync>>,
    /// Called with [`Cluster::lease_until`] after every probe.
    on_lease: OnceLock<Box<dyn Fn(u64) + Send + Sync>>,
    /// Whether the lease was out when last told to `on_lease` (for the log).
    lapsed: AtomicBool,
    /// Called when this node hears a member again after hearing none: it may have
    /// missed invalidations meanwhile.
    on_rejoin: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Called when the member list changes or a member comes back: cached objects may
    /// have new owners.
    on_change: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Cluster {
    /// The members `config` names (`--peer`; `--peers-file` read now; or this node alone
    /// until `--peers-dns` answers), this node weighing `capacity`. Other members start
    /// down until their first probe answers.
    pub fn new(
        config: &ClusterConfig,
        node_id: &str,
        capacity: u64,
        stats: Arc<Stats>,
    ) -> Result<Cluster, ConfigError> {
        let http = transport::Http::new(config.tls_cert.as_deref())
            .map_err(|message| ConfigError::new("peer", message))?;
        Cluster::with_transport(config, node_id, capacity, stats, Box::new(http))
    }

    /// [`Cluster::new`], its requests to members sent by `transport`.
    pub fn with_transport(
        config: &ClusterConfig,
        node_id: &str,
        capacity: u64,
        stats: Arc<Stats>,
        transport: Box<dyn transport::Transport>,
    ) -> Result<Cluster, ConfigError> {
        let scheme = if config.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        let own_url = format!("{scheme}://{}", config.listen);
        let list = source::initial(config)?;
        let cluster = Cluster {
            id: node_id.to_owned(),
            boot: uuid::Uuid::new_v4().simple().to_string(),
            view: RwLock::new(Arc::new(View::new(Vec::new(), 0))),
            route: config.route,
            secret: config.secret.clone(),
            nonces: Default::default(),
            own_url,
            transport,
            stats,
            settled: AtomicBool::new(false),
            dynamic: config.peers_file.is_some() || config.peers_dns.is_some(),
            listed: AtomicBool::new(true),
            source_ready: AtomicBool::new(config.peers_dns.is_none()),
            trust_told: AtomicBool::new(false),
            departed: std::sync::Mutex::new(Vec::new()),
            on_trust: OnceLock::new(),
            on_lease: OnceLock::new(),
            lapsed: AtomicBool::new(false),
            on_rejoin: OnceLock::new(),
            on_change: OnceLock::new(),
        };
        let strict = !config.peer.is_empty();
        cluster.install(list, strict, capacity)?;
        Ok(cluster)
    }

    /// Makes `list` the member list. With `strict` (a static `--peer` list) this node
    /// must be in it; otherwise it is added when missing (a DNS name that does not yet
    /// resolve to it). Members already known keep their state.
    fn install(
        &self,
        mut list: Vec<(String, String)>,
        strict: bool,
        capacity: u64,
    ) -> Result<bool, ConfigError> {
        let invalid = |message: String| ConfigError::new("peer", message);
        let listed = list.iter().any(|(id, _)| *id == self.id);
        if !listed {
            if strict && !list.is_empty() {
                return Err(invalid(format!(
                    "this node's id `{}` is not among the peers; set --node-id to one of them",
                    self.id
                )));
            }
            list.push((self.id.clone(), self.own_url.clone()));
        }
        list.sort();
        if let Some(w) = list.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(invalid(format!("node `{}` is listed twice", w[0].0)));
        }
        let mut guard = self.view.write_locked();
        let old = guard.clone();
        let same = old.members.len() == list.len()
            && old
                .members
                .iter()
                .zip(&list)
                .all(|(m, (id, url))| m.id == *id && m.url == *url);
        if same {
            return Ok(false);
        }
        let members: Vec<Arc<Member>> = list
            .into_iter()
            .map(|(id, url)| {
                old.members
                    .iter()
                    .find(|m| m.id == id && m.url == url)
                    .cloned()
                    .unwrap_or_else(|| {
                        let m = Member::new(id, url);
                        if m.id == self.id {
                            m.up.store(true, Ordering::Release);
                            m.missed.store(false, Ordering::Release);
                            m.weight.store(capacity, Ordering::Relaxed);
                        }
                        Arc::new(m)
                    })
            })
            .collect();
        let me = members
            .iter()
            .position(|m| m.id == self.id)
            .expect("this node is listed");
        for m in &members {
            if !old.members.iter().any(|o| Arc::ptr_eq(o, m)) && !old.members.is_empty() {
                tracing::info!(node = %m.id, url = %m.url, "cluster member added");
            }
        }
        let mut departed = self.departed.locked();
        departed.retain(|(m, at)| {
            at.elapsed() < DEPARTED_GRACE && !members.iter().any(|n| n.id == m.id)
        });
        for m in &old.members {
            if !members.iter().any(|n| Arc::ptr_eq(n, m)) {
                tracing::info!(node = %m.id, url = %m.url, "cluster member removed");
                if m.id != self.id {
                    departed.push((m.clone(), Instant::now()));
                }
            }
        }
        drop(departed);
        *guard = Arc::new(View::new(members, me));
        drop(guard);
        // An empty list (DNS not answering yet) says nothing of this node.
        let listed = listed || list_was_empty(&self.view());
        if self.listed.swap(listed, Ordering::AcqRel) != listed && !listed {
            tracing::warn!("this node is no longer in the member list: it serves without trusting its cache until it is listed again");
        }
        Ok(true)
    }

    /// Members taken out of the list within [`DEPARTED_GRACE`].
    pub fn departed(&self) -> Vec<Arc<Member>> {
        let mut d = self.departed.locked();
        d.retain(|(_, at)| at.elapsed() < DEPARTED_GRACE);
        d.iter().map(|(m, _)| m.clone()).collect()
    }

    /// Takes a new member list from the source (`--peers-file`, `--peers-dns`); a
    /// changed list may give cached objects new owners.
    pub fn set_members(&self, list: Vec<(String, String)>) {
        let capacity = self.me().weight();
        match self.install(list, false, capacity) {
            Ok(true) => self.changed(),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "member list refused"),
        }
        self.source_ready.store(true, Ordering::Release);
        self.check_trust();
    }

    /// Whether the member list's source has answered (always, but for a DNS name that
    /// has not resolved yet).
    pub fn source_ready(&self) -> bool {
        self.source_ready.load(Ordering::Acquire)
    }

    /// What to do when this node, cut off from every other member, hears one again.
    pub fn on_rejoin(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_rejoin.set(Box::new(f));
    }

    /// What to do when objects may have new owners (the list changed, a member returned).
    pub fn on_change(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_change.set(Box::new(f));
    }

    fn rejoined(&self) {
        tracing::warn!("heard the cluster again after hearing no member; cached copies will be checked against the backend");
        if let Some(f) = self.on_rejoin.get() {
            f();
        }
    }

    fn changed(&self) {
        if let Some(f) = self.on_change.get() {
            f();
        }
    }

    /// The members and the ring, as they are now.
    pub fn view(&self) -> Arc<View> {
        self.view.read_locked().clone()
    }

    /// Who owns which key now (see [`Owners`]).
    pub fn owners(&self) -> Owners {
        Owners::of(self.view())
    }

    /// The ring again over the same members (a weight changed).
    fn rebuild_ring(&self) {
        let mut guard = self.view.write_locked();
        let v = &**guard;
        *guard = Arc::new(View::new(v.members.clone(), v.me));
    }

    /// This node's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// This node as a member.
    pub fn me(&self) -> Arc<Member> {
        let v = self.view();
        v.members[v.me].clone()
    }

    pub fn is_me(&self, m: &Member) -> bool {
        m.id == self.id
    }

    /// Whether other members are listed now or may be (a list that follows a file or a
    /// DNS name).
    pub fn may_have_members(&self) -> bool {
        self.dynamic || !self.is_single()
    }

    /// True when this node is the whole cluster.
    pub fn is_single(&self) -> bool {
        self.view().members.len() == 1
    }

    /// Every member, this node included.
    pub fn members(&self) -> Vec<Arc<Member>> {
        self.view().members.clone()
    }

    /// The member named `id`, if listed.
    pub fn member(&self, id: &str) -> Option<Arc<Member>> {
        self.view().members.iter().find(|m| m.id == id).cloned()
    }

    /// Whether this node has probed every member once since it started.
    pub fn settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// The member that owns the key now: the best-ranked member that is up. This node
    /// when no member of positive weight is up.
    pub fn owner_of_hash(&self, kh: u64) -> Arc<Member> {
        self.view().owner_of_hash(kh).clone()
    }

    pub fn owner(&self, bucket: &str, key: &str) -> Arc<Member> {
        self.owner_of_hash(key_hash(bucket, key))
    }

    /// Up members other than this one, best-ranked for the key first.
    pub fn others_ranked(&self, bucket: &str, key: &str) -> Vec<Arc<Member>> {
        let v = self.view();
        v.ring
            .ranked(key_hash(bucket, key))
            .into_iter()
            .map(|i| &v.members[i])
            .filter(|m| m.id != self.id && m.is_up())
            .cloned()
            .collect()
    }

    /// Members other than this one.
    pub fn others(&self) -> Vec<Arc<Member>> {
        let v = self.view();
        v.members
            .iter()
            .filter(|m| m.id != self.id)
            .cloned()
            .collect()
    }

    /// Up members other than this one.
    pub fn others_up(&self) -> Vec<Arc<Member>> {
        let mut v = self.others();
        v.retain(|m| m.is_up());
        v
    }

    /// Marks a member down now (a forwarded request found it gone); the next probe
    /// that answers brings it back, after telling it to check its copies.
    pub fn mark_down(&self, m: &Member, why: impl std::fmt::Display) {
        if self.is_me(m) {
            return;
        }
        m.missed.store(true, Ordering::Release);
        if m.up.swap(false, Ordering::AcqRel) {
            tracing::warn!(node = %m.id, reason = %why, "cluster member down");
        }
    }

    /// Notes that member `m` did not hear of a change made through this node.
    pub(crate) fn missed(&self, m: &Member) {
        m.missed.store(true, Ordering::Release);
    }

    /// Whether a member could take an object of `size` bytes (0: unknown) that others
    /// could not admit, as last heard. `tried` are the ids of members that refused it.
    fn has_room(&self, m: &Member, size: u64, tried: &[&str]) -> bool {
        !self.is_me(m)
            && m.may_own()
            && !m.is_full()
            && m.free.load(Ordering::Relaxed) >= size.max(1)
            && !tried.contains(&m.id.as_str())
    }

    /// Whether another member could take an object this node cannot admit. Cheap: no
    /// ranking, so it can be asked on every read.
    pub fn can_spill(&self, tried: &[&str]) -> bool {
        let v = self.view();
        v.members.len() > 1 && v.members.iter().any(|m| self.has_room(m, 0, tried))
    }

    /// Where to leave an object of `size` bytes this node cannot admit: the best-ranked
    /// other member that, as last heard, is up and has room, and has not refused it.
    pub fn spill_target(
        &self,
        bucket: &str,
        key: &str,
        size: u64,
        tried: &[&str],
    ) -> Option<Arc<Member>> {
        self.others_ranked(bucket, key)
            .into_iter()
            .find(|m| self.has_room(m, size, tried))
    }

    /// Records a probe's answer: up, with this weight, admitting or not, with this many
    /// bytes of room.
    fn heard(&self, m: &Member, weight: u64, full: bool, free: u64) {
        m.fails.store(0, Ordering::Relaxed);
        m.full.store(full, Ordering::Relaxed);
        m.free.store(free, Ordering::Relaxed);
        if m.weight.swap(weight, Ordering::Relaxed) != weight {
            self.rebuild_ring();
        }
        if !m.up.swap(true, Ordering::AcqRel) {
            tracing::info!(node = %m.id, weight, "cluster member up");
            self.changed();
        }
    }

    /// Records a member's part and hand-over as its health answer says: a member that
    /// starts or stops draining changes which keys the others own.
    fn heard_drain(&self, m: &Member, drain: Drain, handover: Option<Handover>) {
        *m.handover.locked() = handover;
        if m.set_drain(drain) {
            tracing::info!(node = %m.id, state = drain.as_str(), "cluster member's part");
            self.changed();
        }
    }

    /// Sets this node's part ([`Drain`]); a change is a change of owners.
    pub fn set_drain(&self, drain: Drain) {
        if self.me().set_drain(drain) {
            tracing::info!(state = drain.as_str(), "this node's part in the cluster");
            self.changed();
        }
    }

    /// Records a failed probe; the second in a row marks the member down.
    fn unheard(&self, m: &Member, why: &str) {
        let fails = m.fails.fetch_add(1, Ordering::Relaxed) + 1;
        if fails >= membership::FAILS_TO_DOWN {
            self.mark_down(m, why);
        }
    }

    /// `/_granary/cluster`: the members (`with_urls`: and where they listen) and, for a
    /// key, its owner.
    pub fn view_json(&self, key: Option<(&str, &str)>, with_urls: bool) -> serde_json::Value {
        let v = self.view();
        let members: Vec<_> = v
            .members
            .iter()
            .map(|m| {
                let state = match (m.is_up(), m.drain()) {
                    (false, _) => "down",
                    (true, Drain::Serving) => "up",
                    (true, d) => d.as_str(),
                };
                let mut j = json!({
                    "id": m.id,
                    "state": state,
                    "weight": m.weight(),
                    "admitting": !m.is_full(),
                });
                if let Some(h) = m.handover.locked().clone() {
                    j["handover"] = json!(h);
                }
                if with_urls {
                    j["url"] = json!(m.url);
                }
                j
            })
            .collect();
        let mut out = json!({
            "node_id": self.id,
            "route": self.route.as_str(),
            "settled": self.settled(),
            // Whether hits are served without a check against the backend: settled,
            // listed, every member seen up aware of this node, and within the lease.
            "trusted": self.trusted() && crate::clock::now_ms() <= self.lease_until(),
            "members": members,
        });
        if let Some((bucket, key)) = key {
            out["owner"] = json!(v.owner_of_hash(key_hash(bucket, key)).id);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(peers: &[&str]) -> ClusterConfig {
        ClusterConfig {
            peer: peers.iter().map(|s| s.to_string()).collect(),
            ..ClusterConfig::default()
        }
    }

    fn owned_by(c: &Cluster, id: &str) -> usize {
        (0..1000)
            .filter(|i| c.owner("bk", &i.to_string()).id == id)
            .count()
    }

    #[test]
    fn membership_is_checked() {
        let stats = Arc::new(Stats::default());
        let c = Cluster::new(&config(&[]), "solo", 10, stats.clone()).unwrap();
        assert!(c.is_single());
        assert_eq!(c.owner("b", "k").id, "solo");
        let peers = ["b=http://127.0.0.1:2", "a=http://127.0.0.1:1"];
        let c = Cluster::new(&config(&peers), "b", 10, stats.clone()).unwrap();
        assert_eq!(c.me().id, "b");
        assert_eq!(c.members().len(), 2);
        // The other member is down until heard: every key is ours.
        assert!(!c.members()[0].is_up());
        assert!((0..100).all(|i| c.owner("b", &i.to_string()).id == "b"));
        assert!(Cluster::new(&config(&peers), "c", 10, stats.clone()).is_err());
        let dup = ["a=http://127.0.0.1:1", "a=http://127.0.0.1:2"];
        assert!(Cluster::new(&config(&dup), "a", 10, stats).is_err());
    }

    #[test]
    fn owners_follow_probes() {
        let stats = Arc::new(Stats::default());
        let peers = ["a=http://127.0.0.1:1", "b=http://127.0.0.1:2"];
        let c = Cluster::new(&config(&peers), "a", 100, stats).unwrap();
        let b = c.member("b").unwrap();
        c.heard(&b, 100, false, 100);
        let owned_by_b = owned_by(&c, "b");
        assert!((400..600).contains(&owned_by_b), "{owned_by_b}");
        // One failed probe is not enough; two are.
        c.unheard(&b, "test");
        assert!(b.is_up());
        c.unheard(&b, "test");
        assert!(!b.is_up());
        assert_eq!(owned_by(&c, "a"), 1000);
        c.heard(&b, 300, false, 300);
        let owned_by_b = owned_by(&c, "b");
        assert!(
            (680..820).contains(&owned_by_b),
            "weight 3:1 → {owned_by_b}"
        );
        let v = c.view_json(Some(("bk", "1")), true);
        assert_eq!(v["members"][1]["weight"], 300);
        assert_eq!(v["members"][1]["state"], "up");
        // The view names a key's owner as the ring ranks it: `b` for a key it owns,
        // `a` once `b` is down.
        let key = (0..)
            .map(|i| i.to_string())
            .find(|k| c.owner_of_hash(key_hash("bk", k)).id() == "b")
            .unwrap();
        assert_eq!(c.view_json(Some(("bk", &key)), true)["owner"], "b");
        c.unheard(&b, "test");
        c.unheard(&b, "test");
        assert_eq!(c.view_json(Some(("bk", &key)), true)["owner"], "a");
    }

    #[test]
    fn a_new_list_keeps_known_members_and_their_state() {
        let stats = Arc::new(Stats::default());
        let c = Cluster::new(&config(&[]), "a", 100, stats).unwrap();
        c.set_members(vec![
            ("a".into(), "http://127.0.0.1:1".into()),
            ("b".into(), "http://127.0.0.1:2".into()),
        ]);
        let b = c.member("b").unwrap();
        assert!(
            !b.is_up() && b.missed.load(Ordering::Acquire),
            "new: down, and it missed what came before"
        );
        c.heard(&b, 100, false, 100);
        c.set_members(vec![
            ("b".into(), "http://127.0.0.1:2".into()),
            ("c".into(), "http://127.0.0.1:3".into()),
        ]);
        // This node stays a member even when the list leaves it out (DNS not updated yet).
        assert_eq!(
            c.members()
                .iter()
                .map(|m| m.id.as_str())
                .collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert!(
            Arc::ptr_eq(&c.member("b").unwrap(), &b),
            "b keeps its state"
        );
        assert!(b.is_up());
        assert!(!c.member("c").unwrap().is_up());
    }
}
