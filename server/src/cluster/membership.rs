//! Health probing: every member asks every other for `/_granary/health` once a second.
//! An answer carries the member's id (a mismatch means a wrong `--peer` URL) and its
//! cache capacity, its weight on the ring. Two failures in a row mark a member down, so a
//! dead node is routed around within about three seconds (a refused forward marks it at
//! once); the first answer after that brings it back.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;

use super::Cluster;

/// Time between probes of one member.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// A probe not answered within this is a failure.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Failed probes in a row that mark a member down.
pub const FAILS_TO_DOWN: u32 = 2;

/// Starts probing the other members (nothing to do for a single node).
pub fn spawn(cluster: Arc<Cluster>) {
    if cluster.is_single() {
        return;
    }
    tokio::spawn(async move {
        // Whether every other member was down at the end of a round, after having been
        // up: this node was cut off (or they all died) and may have missed writes.
        let mut alone = false;
        let mut heard_any = false;
        let mut tick = tokio::time::interval(PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let others: Vec<usize> = (0..cluster.members.len())
                .filter(|&i| i != cluster.me)
                .collect();
            let probes = others.into_iter().map(|i| {
                let c = cluster.clone();
                async move {
                    let heard = match probe(&c, i).await {
                        // Back after being down: it missed this node's invalidations, so
                        // it checks its copies against the backend before it is routed to.
                        Ok(h) if c.returning(i) => c
                            .tell_revalidate(i)
                            .await
                            .map(|()| h)
                            .map_err(|e| e.to_string()),
                        other => other,
                    };
                    match heard {
                        Ok(h) => c.heard(i, h.capacity, h.full, h.free),
                        Err(why) => c.unheard(i, &why),
                    }
                }
            });
            futures::future::join_all(probes).await;
            let any_up = cluster.others_up().next().is_some();
            if any_up && alone {
                cluster.rejoined();
            }
            alone = heard_any && !any_up;
            heard_any |= any_up;
        }
    });
}

/// What a member says of itself.
struct Heard {
    capacity: u64,
    full: bool,
    free: u64,
}

/// One probe: what the member says, or why it failed.
async fn probe(c: &Cluster, i: usize) -> Result<Heard, String> {
    let m = &c.members[i];
    let req = http::Request::get(format!("{}/_granary/health", m.url))
        .header(granary_proto::headers::HOP, &c.members[c.me].id)
        .body(axum::body::Body::empty())
        .map_err(|e| e.to_string())?;
    let answer = async {
        let resp = c.http.request(req).await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("health answered {}", resp.status()));
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
