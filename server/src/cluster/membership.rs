//! Health probing: every member asks every other for `/_granary/health` once a second.
//! An answer carries the member's id (a mismatch means a wrong URL) and its cache
//! capacity, its weight on the ring. Two failures in a row mark a member down, so a dead
//! node is routed around within about three seconds (a refused forward marks it at
//! once); the first answer after that brings it back, once the member has been told to
//! check its copies if it may have missed a change made through this node.
//!
//! A probe from the regular round announces its sender (`x-granary-announce`): a member
//! that does not see the sender up probes it back before answering. So a node's first
//! round, after which it answers health `200` (its view is settled), leaves every member
//! it reached seeing it up; and a round is bounded (every probe times out), so a node
//! settles even when members are down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;

use super::source::Watch;
use super::{Cluster, Member};

/// Time between probes of one member.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// A probe not answered within this is a failure.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Failed probes in a row that mark a member down.
pub const FAILS_TO_DOWN: u32 = 2;
/// The header a round's probe announces its sender with.
pub const ANNOUNCE: &str = "x-granary-announce";

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
            if !cluster
                .settled
                .swap(true, std::sync::atomic::Ordering::AcqRel)
            {
                tracing::info!(
                    members = others.len() + 1,
                    up = cluster.others_up().len() + 1,
                    after_ms = started.elapsed().as_millis() as u64,
                    "cluster view settled: every member probed once"
                );
            }
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
/// have missed a change is told to check its copies before it counts as up.
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
            c.heard(m, h.capacity, h.full, h.free);
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
/// announcing probe is answered.
pub async fn announced(c: &Cluster, id: &str) {
    let Some(m) = c.member(id) else {
        return;
    };
    if c.is_me(&m) {
        return;
    }
    if !m.is_up() || m.missed.load(std::sync::atomic::Ordering::Acquire) {
        probe_member(c, &m, false).await;
    }
}

/// What a member says of itself.
struct Heard {
    capacity: u64,
    full: bool,
    free: u64,
}

/// One probe: what the member says, or why it failed. A member still settling answers
/// `503` with the same fields: it is alive and serving.
async fn probe(c: &Cluster, m: &Member, announce: bool) -> Result<Heard, String> {
    let method = http::Method::GET;
    let target = "/_granary/health";
    let mut req = http::Request::get(format!("{}{target}", m.url))
        .header(granary_proto::headers::HOP, c.hop_value(&method, target));
    if announce {
        req = req.header(ANNOUNCE, "1");
    }
    let req = req
        .body(axum::body::Body::empty())
        .map_err(|e| e.to_string())?;
    let answer = async {
        let resp = c.http.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        if !status.is_success() && status != http::StatusCode::SERVICE_UNAVAILABLE {
            return Err(format!("health answered {status}"));
        }
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        serde_json::from_slice::<serde_json::Value>(&body).map_err(|e| e.to_string())
    };
    let v = tokio::time::timeout(PROBE_TIMEOUT, answer)
        .await
        .map_err(|_| "health probe timed out".to_owned())??;
    if v["node_id"] != m.id.as_str() {
        return Err(format!(
            "{} answers as node {}, not {}",
            m.url, v["node_id"], m.id
        ));
    }
    Ok(Heard {
        capacity: v["capacity_bytes"].as_u64().unwrap_or(0),
        full: v["admitting"] == false,
        free: v["free_bytes"].as_u64().unwrap_or(0),
    })
}
