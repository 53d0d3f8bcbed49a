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

use super::calls::{Health, Probe};
use super::source::Watch;
use super::{Cluster, Member};

/// Time between probes of one member.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// A probe not answered within this is a failure.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Failed probes in a row that mark a member down.
pub const FAILS_TO_DOWN: u32 = 2;
/// The longest a node waits for members that answer but do not list it before it
/// settles anyway (a member whose list does not have this node is misconfigured).
pub const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// Starts probing the members (and following the member list's source).
pub fn spawn(cluster: Arc<Cluster>, mut source: Watch) {
    tokio::spawn(async move {
        // Whether every other member was down at the end of a round, after having been
        // up: this node was cut off (or they all died) and may have missed writes.
        let mut alone = false;
        let mut heard_any = false;
        let started = Instant::now();
        let mut tick = tokio::time::interval(PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            source.poll(&cluster).await;
            let others = cluster.others();
            let probes = others.iter().map(|m| probe_member(&cluster, m, true));
            futures::future::join_all(probes).await;
            let unaware = cluster.unaware();
            let ready = unaware.is_empty() && cluster.source_ready();
            if !cluster.settled() && !ready && started.elapsed() < SETTLE_LIMIT {
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
                    after_ms = started.elapsed().as_millis() as u64,
                    "cluster view settled: every member probed, and every one that answered lists this node"
                );
            }
            cluster.check_trust();
            let any_up = !cluster.others_up().is_empty();
            if any_up && alone {
                cluster.rejoined();
            }
            alone = heard_any && !any_up;
            heard_any |= any_up;
        }
    });
}

/// Probes member `m` and records what it says; `announce`: this node's regular round
/// (the member probes back if it does not see this node up). A member heard after it may
/// have missed a change is told to check its copies before it counts as up. Whether it
/// answered.
pub async fn probe_member(c: &Cluster, m: &Arc<Member>, announce: bool) -> bool {
    use std::sync::atomic::Ordering;
    match probe(c, m, announce).await {
        Ok(h) => {
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
            }
            c.heard(m, h.capacity_bytes, !h.admitting, h.free_bytes);
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
/// announcing probe is answered. Whether this node lists it.
pub async fn announced(c: &Cluster, id: &str) -> bool {
    let Some(m) = c.member(id) else {
        return false;
    };
    if c.is_me(&m) {
        return true;
    }
    // It probes the members it lists: this node is one.
    c.set_aware(&m, true);
    if !m.is_up() || m.missed.load(std::sync::atomic::Ordering::Acquire) {
        probe_member(c, &m, false).await;
    }
    c.check_trust();
    true
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
