//! `granary-bench ring`: the placement of keys over a simulated cluster, with the node's
//! own `Ring` (weighted rendezvous hashing). For each cluster size it places K keys and
//! reports the load spread (each node's keys over its fair share, by weight) and the
//! keys that move when one node joins and when one leaves, beside the ideal (the joining
//! node's share; the leaving node's share), and how many keys moved between two nodes
//! that did not change (none, for a consistent placement).

use std::time::Instant;

use granary_core::{key_hash, Ring, RingNode};
use serde::Serialize;

/// How node weights are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Weights {
    /// Every node the same.
    Uniform,
    /// Disks of 1, 2 and 4 TiB in turn: a cluster that grew over time.
    Mixed,
}

/// One simulated cluster size and weighting.
#[derive(Debug, Clone, Serialize)]
pub struct SimRow {
    pub nodes: usize,
    pub weights: Weights,
    pub keys: u64,
    /// Largest node's keys over its fair share (1.0 is perfect).
    pub spread_max: f64,
    /// Smallest node's keys over its fair share.
    pub spread_min: f64,
    /// Fraction of keys that moved when one node joined.
    pub join_moved: f64,
    /// The joining node's fair share: the least a join can move.
    pub join_ideal: f64,
    /// Fraction of keys that moved when one node left.
    pub leave_moved: f64,
    /// The leaving node's fair share.
    pub leave_ideal: f64,
    /// Keys that moved between two nodes that neither joined nor left.
    pub stray_moves: u64,
    /// Wall time of one owner lookup, averaged over the threads.
    pub ns_per_lookup: f64,
}

fn weight_of(i: usize, w: Weights) -> f64 {
    match w {
        Weights::Uniform => 1.0,
        Weights::Mixed => [1.0, 2.0, 4.0][i % 3] * (1u64 << 40) as f64,
    }
}

fn node(i: usize, w: Weights) -> RingNode {
    RingNode {
        id: format!("node-{i:04}"),
        weight: weight_of(i, w),
    }
}

#[derive(Default)]
struct Tally {
    /// Keys per node of the base ring (indexed like the base ring).
    load: Vec<u64>,
    join_moved: u64,
    leave_moved: u64,
    stray: u64,
}

/// Simulates `nodes` nodes over `keys` keys on `threads` threads.
pub fn simulate(nodes: usize, weights: Weights, keys: u64, threads: usize) -> SimRow {
    assert!(nodes >= 2, "a join and a leave need at least two nodes");
    let base = Ring::new((0..nodes).map(|i| node(i, weights)));
    let joined = Ring::new((0..=nodes).map(|i| node(i, weights)));
    // The node that leaves: the first, so every weight class is exercised over sizes.
    let leaver = 0;
    let left = Ring::new(
        (0..nodes)
            .filter(|&i| i != leaver)
            .map(|i| node(i, weights)),
    );
    let id_of = |r: &Ring, i: usize| r.nodes()[i].id.clone();
    // Map each ring's indices to the base ring's ids once, to compare owners cheaply.
    let to_base = |r: &Ring| -> Vec<usize> {
        (0..r.len())
            .map(|i| base.index_of(&id_of(r, i)).unwrap_or(usize::MAX))
            .collect()
    };
    let joined_map = to_base(&joined);
    let left_map = to_base(&left);
    let leaver_idx = base
        .index_of(&format!("node-{leaver:04}"))
        .expect("present");
    let threads = threads.max(1);
    let started = Instant::now();
    let tallies: Vec<Tally> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (base, joined, left) = (&base, &joined, &left);
                let (joined_map, left_map) = (&joined_map, &left_map);
                s.spawn(move || {
                    let mut tally = Tally {
                        load: vec![0; base.len()],
                        ..Tally::default()
                    };
                    let lo = keys * t as u64 / threads as u64;
                    let hi = keys * (t as u64 + 1) / threads as u64;
                    let mut name = String::with_capacity(32);
                    for k in lo..hi {
                        use std::fmt::Write;
                        name.clear();
                        let _ = write!(name, "shard-{k:09}.tar");
                        let kh = key_hash("dataset", &name);
                        let o = base.owner(kh).expect("nodes of positive weight");
                        tally.load[o] += 1;
                        let j = joined_map[joined.owner(kh).expect("nodes")];
                        if j != o {
                            tally.join_moved += 1;
                            // A moved key may only go to the new node (not in base).
                            if j != usize::MAX {
                                tally.stray += 1;
                            }
                        }
                        let l = left_map[left.owner(kh).expect("nodes")];
                        if l != o {
                            tally.leave_moved += 1;
                            if o != leaver_idx {
                                tally.stray += 1;
                            }
                        }
                    }
                    tally
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("simulation thread"))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut total = Tally {
        load: vec![0; base.len()],
        ..Tally::default()
    };
    for t in tallies {
        for (a, b) in total.load.iter_mut().zip(&t.load) {
            *a += b;
        }
        total.join_moved += t.join_moved;
        total.leave_moved += t.leave_moved;
        total.stray += t.stray;
    }
    let w_base: f64 = base.nodes().iter().map(|n| n.weight).sum();
    let ratios: Vec<f64> = base
        .nodes()
        .iter()
        .zip(&total.load)
        .map(|(n, &l)| l as f64 / (keys as f64 * n.weight / w_base))
        .collect();
    let w_new = weight_of(nodes, weights);
    let w_leaver = weight_of(leaver, weights);
    SimRow {
        nodes,
        weights,
        keys,
        spread_max: ratios.iter().copied().fold(f64::MIN, f64::max),
        spread_min: ratios.iter().copied().fold(f64::MAX, f64::min),
        join_moved: total.join_moved as f64 / keys as f64,
        join_ideal: w_new / (w_base + w_new),
        leave_moved: total.leave_moved as f64 / keys as f64,
        leave_ideal: w_leaver / w_base,
        stray_moves: total.stray,
        ns_per_lookup: elapsed * threads as f64 * 1e9 / (3.0 * keys as f64),
    }
}

/// The rows as a Markdown table.
pub fn table(rows: &[SimRow]) -> String {
    let mut out = String::from(
        "| nodes | weights | keys | spread max/mean | min/mean | moved on join (ideal) | moved on leave (ideal) | stray moves | ns/lookup |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.3}% ({:.3}%) | {:.3}% ({:.3}%) | {} | {:.0} |\n",
            r.nodes,
            match r.weights {
                Weights::Uniform => "uniform",
                Weights::Mixed => "mixed 1:2:4",
            },
            r.keys,
            r.spread_max,
            r.spread_min,
            r.join_moved * 100.0,
            r.join_ideal * 100.0,
            r.leave_moved * 100.0,
            r.leave_ideal * 100.0,
            r.stray_moves,
            r.ns_per_lookup,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_clusters_place_fairly_and_move_little() {
        for w in [Weights::Uniform, Weights::Mixed] {
            let r = simulate(10, w, 200_000, 2);
            assert_eq!(r.stray_moves, 0, "{r:?}");
            assert!(r.spread_max < 1.05 && r.spread_min > 0.95, "{r:?}");
            assert!((r.join_moved - r.join_ideal).abs() < 0.01, "{r:?}");
            assert!((r.leave_moved - r.leave_ideal).abs() < 0.01, "{r:?}");
        }
    }
}
