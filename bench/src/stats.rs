//! The node's own counters (`/_granary/stats`), summed over a cluster's members, that
//! the bench reads before and after a run and each epoch.

use std::collections::BTreeMap;

use crate::http::Target;

/// Granary's `/_granary/stats` counters the bench compares before and after a run (and
/// each epoch).
pub const STATS_FIELDS: [&str; 9] = [
    "bytes_from_backend",
    "bytes_from_peers",
    "bytes_served",
    "bytes_received",
    "hits",
    "misses",
    "peer_fills",
    "bypasses",
    "used_bytes",
];

/// A snapshot of [`STATS_FIELDS`].
pub type ServerStats = BTreeMap<String, i64>;

/// Granary's counters, or `None` when the endpoint has no `/_granary/stats`. With
/// `settle`, waits (up to 10 s) until no cache fill is in flight (`reserved_bytes` 0),
/// so the snapshot includes the fills of the requests already answered.
pub async fn fetch_stats(target: &Target, settle: bool) -> Option<ServerStats> {
    // A cluster: the counters of every member that is up, summed, so backend and peer
    // bytes are the cluster's whatever node the requests landed on.
    let members: Vec<String> = match target.json_at(&target.endpoint, "/_granary/cluster").await {
        Ok(v) => v["members"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|m| m["state"] == "up")
                    .filter_map(|m| m["url"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    if members.len() > 1 {
        let mut sum = ServerStats::new();
        for url in &members {
            let one = node_stats(target, Some(url), settle).await?;
            for (k, v) in one {
                *sum.entry(k).or_insert(0) += v;
            }
        }
        return Some(sum);
    }
    node_stats(target, None, settle).await
}

/// One node's counters (`url`, or the target's endpoint), after its fills commit when
/// `settle`.
async fn node_stats(target: &Target, url: Option<&str>, settle: bool) -> Option<ServerStats> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let v: serde_json::Value = match url {
            Some(u) => target.json_at(u, "/_granary/stats").await.ok()?,
            None => {
                let (status, body) = target
                    .text(http::Method::GET, "/_granary/stats", &[])
                    .await
                    .ok()?;
                if !status.is_success() {
                    return None;
                }
                serde_json::from_str(&body).ok()?
            }
        };
        let busy = v
            .get("reserved_bytes")
            .and_then(|r| r.as_i64())
            .unwrap_or(0)
            > 0;
        if settle && busy && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            continue;
        }
        let map: ServerStats = STATS_FIELDS
            .iter()
            .filter_map(|k| v.get(*k)?.as_i64().map(|n| (k.to_string(), n)))
            .collect();
        return (!map.is_empty()).then_some(map);
    }
}

/// after − before, field by field.
pub fn stats_delta(
    before: &BTreeMap<String, i64>,
    after: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    after
        .iter()
        .filter_map(|(k, a)| before.get(k).map(|b| (k.clone(), a - b)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas() {
        let b: BTreeMap<String, i64> = [("hits".into(), 3), ("misses".into(), 5)].into();
        let a: BTreeMap<String, i64> = [
            ("hits".into(), 10),
            ("misses".into(), 5),
            ("bypasses".into(), 1),
        ]
        .into();
        let d = stats_delta(&b, &a);
        assert_eq!(d.len(), 2);
        assert_eq!(d["hits"], 7);
        assert_eq!(d["misses"], 0);
    }
}
