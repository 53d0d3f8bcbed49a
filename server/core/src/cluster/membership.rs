//! Health probing: every member asks every other for `/_granary/health` once a second.
//! An answer carries the member's id (a mismatch means a wrong URL) and its cache
//! capacity, its weight on the ring. Two failures in a row mark a member down, so a dead
//! node is routed around within about three seconds (a refused forward marks it at
//! once); the first answer after that brings it back, once the member has been told to
//! check its copies if it may have missed a change made through this node.
//!
//! A probe from the regular round announces its sender (`x-granary-announce`): a member
//! that does not see the sender up probes it back before answering, and says whether
//! its list has the sender at all (a member whose peers file or DNS answer lags does
//! not, for a moment). A node's view is settled, and it answers health `200`, after the
//! first round in which every member that answered lists it and sees it up; from then on
//! every write made through any of them reaches its copies. A round is bounded (every
//! probe times out), so a node settles even when members are down; and a member that
//! never lists it holds it back [`SETTLE_LIMIT`] at most.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::calls::{Announced, Health, Probe};
use super::source::Watch;
use super::{Cluster, Member};

/// Time between probes of one member.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// Failed probes in a row that mark a member down.
pub const FAILS_TO_DOWN: u32 = 2;
/// How long an announcing probe's answer, seeing this node up, lets it serve its copies
/// without checking them: shorter than the time members take to mark it down (about
/// 3 s: two probes after its last answer, each timing out after [`PROBE_TIMEOUT`]), and
/// well over the time between probes, so that a busy member's lease does not lapse. A
/// member that writes without this node's acknowledgment waits until the lease it last
/// granted has run out (`peer.rs`).
pub const LEASE: Duration = Duration::from_millis(2500);
/// The longest a node waits for members that answer but do not list it before it
/// settles anyway (a member whose list does not have this node is misconfigured).
pub const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// Starts probing the members (and following the member list's source), a round every
/// [`PROBE_EVERY`].
pub fn spawn(cluster: Arc<Cluster>, source: Watch) {
    tokio::spawn(async move {
        let mut rounds = Rounds::new(source);
        let mut tick = tokio::time::interval(PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            rounds.round(&cluster).await;
        }
    });
}

/// What the probe rounds carry from one to the next.
pub struct Rounds {
    source: Watch,
    /// Whether every other member was down at the end of a round, after having been
    /// up: this node was cut off (or they all died) and may have missed writes.
    alone: bool,
    heard_any: bool,
    started: Instant,
}

impl Rounds {
    pub fn new(source: Watch) -> Rounds {
        Rounds {
            source,
            alone: false,
            heard_any: false,
            started: Instant::now(),
        }
    }

    /// One round: the list's source read again, every other member probed (announcing
    /// this node), the view settled once every member that answered lists this node,
    /// the cache's trust told, and a return from isolation noticed.
    pub async fn round(&mut self, cluster: &Cluster) {
        self.source.poll(cluster).await;
        let others = cluster.others();
        let probes = others.iter().map(|m| probe_member(cluster, m, true));
        futures::future::join_all(probes).await;
        let unaware = cluster.unaware();
        let ready = unaware.is_empty() && cluster.source_ready();
        if !cluster.settled() && !ready && self.started.elapsed() < SETTLE_LIMIT {
            if unaware.is_empty() {
                tracing::info!("waiting for the member list's source to answer");
            } else {
                tracing::info!(members = ?unaware, "waiting for members to list this node");
            }
        } else if cluster.set_settled() {
            if !ready {
                tracing::warn!(members = ?unaware, "settling although the member list's source has not answered or these members do not list this node");
            }
            tracing::info!(
                members = others.len() + 1,
                up = cluster.others_up().len() + 1,
                after_ms = self.started.elapsed().as_millis() as u64,
                "cluster view settled: every member probed, and every one that answered lists this node"
            );
        }
        cluster.check_trust();
        let any_up = !cluster.others_up().is_empty();
        if any_up && self.alone {
            cluster.rejoined();
        }
        self.alone = self.heard_any && !any_up;
        self.heard_any |= any_up;
    }
}

/// Probes member `m` and records what it says; `announce`: this node's regular round
/// (the member probes back if it does not see this node up). A member heard after it may
/// have missed a change is told to check its copies before it counts as up. Whether it
/// answered.
pub async fn probe_member(c: &Cluster, m: &Arc<Member>, announce: bool) -> bool {
    use std::sync::atomic::Ordering;
    let sent = crate::clock::now_ms();
    match probe(c, m, announce).await {
        Ok(h) => {
            if m.set_boot(&h.boot_id) {
                tracing::debug!(node = %m.id, boot = %h.boot_id, "a member's incarnation");
            }
            if m.missed.swap(false, Ordering::AcqRel) {
                if let Err(e) = c.tell_revalidate(m).await {
                    m.missed.store(true, Ordering::Release);
                    c.unheard(m, &e.to_string());
                    return false;
                }
            }
            if announce {
                if let Some(aware) = h.knows_me {
                    c.set_aware(m, aware);
                }
                if h.sees_me_up {
                    m.renewed.fetch_max(sent, Ordering::AcqRel);
                }
            }
            c.heard(m, h.capacity_bytes, !h.admitting, h.free_bytes);
            c.heard_drain(m, h.drain, h.handover);
            c.check_trust();
            true
        }
        Err(why) => {
            c.unheard(m, &why);
            false
        }
    }
}

/// An announcement from member `id` (its probe): when this node does not see it up, or
/// it may have missed changes, it is probed back now, so that it is up here before the
/// announcing probe is answered. Seen up, its lease from this node runs from now.
pub async fn announced(c: &Cluster, id: &str) -> Announced {
    use std::sync::atomic::Ordering;
    let Some(m) = c.member(id) else {
        return Announced::Unknown;
    };
    if c.is_me(&m) {
        return Announced::Known;
    }
    // It probes the members it lists: this node is one.
    c.set_aware(&m, true);
    if !m.is_up() || m.missed.load(Ordering::Acquire) {
        probe_member(c, &m, false).await;
    }
    c.check_trust();
    if !m.is_up() {
        return Announced::Down;
    }
    m.granted
        .fetch_max(crate::clock::now_ms(), Ordering::AcqRel);
    Announced::Known
}

/// One probe: what the member says, or why it failed. The answer must come from the
/// member the list names (another id means a wrong URL).
async fn probe(c: &Cluster, m: &Member, announce: bool) -> Result<Health, String> {
    let h = c
        .call(m, &Probe { announce })
        .await
        .map_err(|e| e.to_string())?;
    if h.node_id != m.id {
        return Err(format!(
            "{} answers as node {}, not {}",
            m.url, h.node_id, m.id
        ));
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use http::StatusCode;

    use super::*;
    use crate::cluster::calls::{self, ANNOUNCE, KNOWN, KNOWN_DOWN};
    use crate::cluster::testnet::{answer, Net};
    use crate::cluster::ClusterConfig;
    use crate::stats::Stats;

    /// A member that answers probes as `id`, listing the prober or not.
    #[derive(Clone)]
    struct Scripted(Arc<Mutex<(String, &'static str)>>);

    impl Scripted {
        fn on(net: &Net, url: &str, id: &str) -> Scripted {
            let s = Scripted(Arc::new(Mutex::new((id.to_owned(), KNOWN))));
            s.plug(net, url);
            s
        }

        fn plug(&self, net: &Net, url: &str) {
            let s = self.clone();
            net.serve(
                url,
                Arc::new(move |req| {
                    let (id, known) = s.0.lock().unwrap().clone();
                    Box::pin(async move {
                        if req.uri().path() == "/_granary/revalidate" {
                            return answer(StatusCode::OK, &[], r#"{"revalidate":true}"#);
                        }
                        let headers: &[(&str, &str)] = if req.headers().contains_key(ANNOUNCE) {
                            &[(ANNOUNCE, known)]
                        } else {
                            &[]
                        };
                        let body = format!(
                            r#"{{"status":"ok","node_id":"{id}","capacity_bytes":100,"free_bytes":40,"admitting":true}}"#
                        );
                        answer(StatusCode::OK, headers, body)
                    })
                }),
            );
        }

        fn lists(&self, yes: bool) {
            self.0.lock().unwrap().1 = if yes { KNOWN } else { "unknown" };
        }

        fn says(&self, answer: &'static str) {
            self.0.lock().unwrap().1 = answer;
        }
    }

    fn cluster(net: &Net, me: &str, peers: &[&str]) -> Arc<Cluster> {
        let config = ClusterConfig {
            peer: peers.iter().map(|p| p.to_string()).collect(),
            ..ClusterConfig::default()
        };
        let stats = Arc::new(Stats::default());
        Arc::new(Cluster::with_transport(&config, me, 100, stats, net.transport()).unwrap())
    }

    fn count(net: &Net, url: &str, path: &str) -> usize {
        net.sent_to(url).iter().filter(|(_, t)| t == path).count()
    }

    #[tokio::test]
    async fn a_member_is_up_while_it_answers_and_checks_its_copies_when_back() {
        let net = Net::default();
        let b = Scripted::on(&net, "http://b:1", "b");
        let c = cluster(&net, "a", &["a=http://a:1", "b=http://b:1"]);
        let mut rounds = Rounds::new(Watch::Fixed);
        let m = c.member("b").unwrap();
        assert!(!m.is_up(), "down until heard");
        rounds.round(&c).await;
        assert!(m.is_up());
        assert_eq!(m.weight(), 100, "its capacity is its weight");
        assert!(c.settled() && c.trusted());
        // First heard: it may hold copies of objects changed before, so it checks them.
        assert_eq!(count(&net, "http://b:1", "/_granary/revalidate"), 1);
        let owned = |id: &str| {
            (0..200)
                .filter(|i| c.owner("bk", &i.to_string()).id == id)
                .count()
        };
        assert!((60..140).contains(&owned("b")), "{}", owned("b"));

        net.cut("http://b:1");
        rounds.round(&c).await;
        assert!(m.is_up(), "one missed probe is not enough");
        rounds.round(&c).await;
        assert!(!m.is_up(), "two are");
        assert_eq!(owned("a"), 200, "its keys go to the next member");

        net.clear();
        b.plug(&net, "http://b:1");
        rounds.round(&c).await;
        assert!(m.is_up());
        assert_eq!(
            net.sent_to("http://b:1"),
            [
                ("GET".to_owned(), "/_granary/health".to_owned()),
                ("POST".to_owned(), "/_granary/revalidate".to_owned()),
            ],
            "probed, then told to check its copies before it counts up"
        );
    }

    #[tokio::test]
    async fn the_view_settles_once_members_list_this_node_and_trust_follows() {
        let net = Net::default();
        let b = Scripted::on(&net, "http://b:1", "b");
        b.lists(false);
        let c = cluster(&net, "a", &["a=http://a:1", "b=http://b:1"]);
        let told = Arc::new(Mutex::new(Vec::new()));
        let t = told.clone();
        c.on_trust(move |trusted| t.lock().unwrap().push(trusted));
        let mut rounds = Rounds::new(Watch::Fixed);
        rounds.round(&c).await;
        assert!(c.member("b").unwrap().is_up());
        assert!(!c.settled(), "b answers but does not list this node");
        assert_eq!(c.unaware(), ["b"]);
        assert!(!c.trusted());
        b.lists(true);
        rounds.round(&c).await;
        assert!(c.settled() && c.trusted());
        assert!(c.unaware().is_empty());
        // b forgets this node (its list changed): writes through b would not reach this
        // node's copies, so they are not trusted until it lists this node again.
        b.lists(false);
        rounds.round(&c).await;
        assert!(c.settled(), "settled once is settled");
        assert!(!c.trusted());
        b.lists(true);
        rounds.round(&c).await;
        assert!(c.trusted());
        assert_eq!(*told.lock().unwrap(), [true, false, true]);
    }

    #[tokio::test]
    async fn a_member_answering_as_another_node_is_not_up() {
        let net = Net::default();
        Scripted::on(&net, "http://b:1", "x");
        let c = cluster(&net, "a", &["a=http://a:1", "b=http://b:1"]);
        let mut rounds = Rounds::new(Watch::Fixed);
        rounds.round(&c).await;
        rounds.round(&c).await;
        assert!(!c.member("b").unwrap().is_up());
        assert!(c.others_up().is_empty());
    }

    #[tokio::test]
    async fn members_join_and_leave_and_leavers_still_hear_of_writes() {
        let net = Net::default();
        Scripted::on(&net, "http://b:1", "b");
        Scripted::on(&net, "http://c:1", "c");
        let c = cluster(&net, "a", &["a=http://a:1", "b=http://b:1"]);
        let mut rounds = Rounds::new(Watch::Fixed);
        rounds.round(&c).await;
        c.set_members(vec![
            ("a".into(), "http://a:1".into()),
            ("b".into(), "http://b:1".into()),
            ("c".into(), "http://c:1".into()),
        ]);
        let joined = c.member("c").unwrap();
        assert!(!joined.is_up(), "a new member is down until probed");
        rounds.round(&c).await;
        assert!(joined.is_up());
        assert_eq!(c.others_up().len(), 2);

        c.set_members(vec![
            ("a".into(), "http://a:1".into()),
            ("c".into(), "http://c:1".into()),
        ]);
        assert!(c.member("b").is_none());
        let departed: Vec<String> = c.departed().iter().map(|m| m.id.clone()).collect();
        assert_eq!(departed, ["b"]);
        // A member whose list lags may still route b's way for a moment: it hears of
        // writes for a while.
        let invalidate = |url: &str| count(&net, url, "/_granary/invalidate");
        net.serve(
            "http://b:1",
            Arc::new(|_| Box::pin(async { answer(StatusCode::OK, &[], r#"{"invalidated":1}"#) })),
        );
        net.serve(
            "http://c:1",
            Arc::new(|_| Box::pin(async { answer(StatusCode::OK, &[], r#"{"invalidated":1}"#) })),
        );
        c.invalidate_members(&[calls::ObjectKey::new("bk", "k")])
            .await;
        assert_eq!((invalidate("http://b:1"), invalidate("http://c:1")), (1, 1));
        assert!(
            joined.is_up(),
            "a member that took the invalidation stays up"
        );
    }

    #[tokio::test]
    async fn an_announcing_member_not_seen_up_is_probed_back_first() {
        let net = Net::default();
        Scripted::on(&net, "http://b:1", "b");
        let c = cluster(&net, "a", &["a=http://a:1", "b=http://b:1"]);
        assert!(!c.member("b").unwrap().is_up());
        assert_eq!(announced(&c, "b").await, Announced::Known, "b is listed");
        assert!(
            c.member("b").unwrap().is_up(),
            "probed back before answering"
        );
        assert_eq!(count(&net, "http://b:1", "/_granary/health"), 1);
        assert_eq!(
            announced(&c, "z").await,
            Announced::Unknown,
            "z is not listed"
        );
    }

    #[tokio::test]
    async fn the_lease_runs_from_each_probe_answered_seeing_this_node_up() {
        let net = Net::default();
        let b = Scripted::on(&net, "http://b:1", "b");
        let c = cluster(&net, "a", &["a=http://a:1", "b=http://b:1"]);
        let lease = LEASE.as_millis() as u64;
        assert_eq!(c.lease_until(), u64::MAX, "no member up: none to hear from");
        let mut rounds = Rounds::new(Watch::Fixed);
        let before = crate::clock::now_ms();
        rounds.round(&c).await;
        let until = c.lease_until();
        assert!(
            (before + lease..=crate::clock::now_ms() + lease).contains(&until),
            "{until}"
        );
        // Listed but seen down by b: its answer grants nothing.
        b.says(KNOWN_DOWN);
        tokio::time::sleep(Duration::from_millis(5)).await;
        rounds.round(&c).await;
        assert_eq!(c.lease_until(), until);
        assert!(c.member("b").unwrap().is_up());
        b.says(KNOWN);
        rounds.round(&c).await;
        assert!(c.lease_until() > until);
        // b stops answering: the lease runs out before b is marked down, and b, once
        // down, is none to hear from.
        let renewed = c.lease_until();
        net.cut("http://b:1");
        rounds.round(&c).await;
        assert!(c.member("b").unwrap().is_up());
        assert_eq!(c.lease_until(), renewed, "a failed probe renews nothing");
        rounds.round(&c).await;
        assert!(!c.member("b").unwrap().is_up());
        assert_eq!(c.lease_until(), u64::MAX);
    }

    #[tokio::test]
    async fn a_write_a_member_did_not_take_waits_out_the_lease_it_was_granted() {
        let net = Net::default();
        Scripted::on(&net, "http://b:1", "b");
        let c = cluster(&net, "a", &["a=http://a:1", "b=http://b:1"]);
        assert_eq!(announced(&c, "b").await, Announced::Known);
        // b stops answering right after its lease was granted.
        net.cut("http://b:1");
        let t = std::time::Instant::now();
        c.invalidate_members(&[calls::ObjectKey::new("bk", "k")])
            .await;
        assert!(
            t.elapsed() >= LEASE - Duration::from_millis(20),
            "{:?}",
            t.elapsed()
        );
        // Down long enough, a write does not wait for it.
        c.member("b")
            .unwrap()
            .granted
            .store(1, std::sync::atomic::Ordering::Release);
        let t = std::time::Instant::now();
        c.invalidate_members(&[calls::ObjectKey::new("bk", "k")])
            .await;
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
    }
}
