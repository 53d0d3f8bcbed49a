//! The reference a simulated planner is held to: a clairvoyant schedule over the same
//! model as [`super::simulate`] (lockstep ranks reading `lead` places ahead, a read of a
//! shard still coming in streaming what has come, the backend shared per transfer), with none of a real
//! cluster's limits. It knows every epoch's order the moment the epoch starts, pools the
//! members' caches into one, and keeps the backend on one fetch at a time at its whole
//! throughput: always the missing shard read soonest (earliest deadline first), making
//! room by dropping held shards read latest (Belady's choice), only those read later
//! than the fetched one and none a rank is reading. A read that finds its shard missing
//! waits for it as in the simulation: admitted where room can be made so, else read
//! through.
//!
//! It is not a proof of the best any schedule can do; it is what knowing everything and
//! fetching in order of need does on the shape. Where it too stays far above the bound
//! max(D/X, (D − C)/B), the shape is the reason: many ranks each reading a large shard
//! for a long stretch hold their room all that stretch, and the bound counts bytes, not
//! room (BENCHMARKS.md, P13 over drawn shapes).

use std::collections::{HashSet, VecDeque};

use granary_proto::plan::{PlanSpec, Schedule};

use super::SimConfig;

/// Simulation steps are this many seconds.
const DT: f64 = 0.02;
/// Above this many shards the oracle is not run (a look walks every shard).
pub(super) const MOST_SHARDS: usize = 20_000;

struct Transfer {
    shard: usize,
    left: f64,
    admitted: bool,
}

struct Oracle<'a> {
    cfg: &'a SimConfig,
    size: u64,
    capacity: u64,
    held: Vec<bool>,
    used: u64,
    reserved: u64,
    transfers: Vec<Transfer>,
    through: HashSet<usize>,
    sched: Schedule,
    /// The job's place in the epoch (places per rank consumed).
    place: f64,
}

impl Oracle<'_> {
    /// Places until `shard` is read next (0 while a rank reads it); `None`: not again.
    fn next(&self, shard: usize) -> Option<u64> {
        self.sched.next_use(shard, self.place as u64, 0)
    }

    /// Whether a rank reads `shard` now: its read has been issued and not ended.
    fn in_use(&self, shard: usize) -> bool {
        !self.sched.past(shard, self.place as u64)
            && self
                .next(shard)
                .is_some_and(|n| n as f64 <= self.cfg.lead as f64)
    }

    fn free(&self) -> u64 {
        self.capacity.saturating_sub(self.used + self.reserved)
    }

    /// Room for a shard read in `due` places: held shards read later than that (and not
    /// now) dropped, latest first, while the room is short. Whether the room is there.
    fn make_room(&mut self, due: u64) -> bool {
        if self.free() >= self.size {
            return true;
        }
        let mut victims: Vec<(u64, usize)> = (0..self.held.len())
            .filter(|&s| self.held[s] && !self.in_use(s))
            .filter_map(|s| match self.next(s) {
                None => Some((u64::MAX, s)),
                Some(n) if n > due => Some((n, s)),
                Some(_) => None,
            })
            .collect();
        victims.sort_unstable_by(|a, b| b.cmp(a));
        let short = self.size - self.free();
        let can: u64 = victims.len() as u64 * self.size;
        if can < short {
            return false;
        }
        for (_, s) in victims {
            if self.free() >= self.size {
                break;
            }
            self.held[s] = false;
            self.used -= self.size;
        }
        true
    }

    /// A transfer of `shard`: into the cache where `admitted` (its room made), else
    /// read through.
    fn start(&mut self, shard: usize, admitted: bool) {
        if admitted {
            self.reserved += self.size;
        }
        self.transfers.push(Transfer {
            shard,
            left: self.size as f64,
            admitted,
        });
    }

    /// The backend for `dt` seconds, shared by the transfers in flight.
    fn transfer(&mut self, dt: f64) {
        if self.transfers.is_empty() {
            return;
        }
        let each = self.cfg.backend * dt / self.transfers.len() as f64;
        let mut i = 0;
        while i < self.transfers.len() {
            self.transfers[i].left -= each;
            if self.transfers[i].left > 0.5 {
                i += 1;
                continue;
            }
            let t = self.transfers.swap_remove(i);
            if t.admitted {
                self.reserved -= self.size;
                self.used += self.size;
                self.held[t.shard] = true;
            } else {
                self.through.insert(t.shard);
            }
        }
    }

    /// With the backend idle: the missing shard read soonest, where room can be made.
    fn prefetch(&mut self) {
        if !self.transfers.is_empty() {
            return;
        }
        let soonest = (0..self.held.len())
            .filter(|&s| !self.held[s] && !self.in_use(s))
            .filter_map(|s| self.next(s).map(|n| (n, s)))
            .min();
        if let Some((due, shard)) = soonest {
            if self.make_room(due) {
                self.start(shard, true);
            }
        }
    }
}

/// Each epoch's seconds under the clairvoyant schedule; empty above [`MOST_SHARDS`].
pub(super) fn epochs(cfg: &SimConfig, spec: &PlanSpec) -> Vec<f64> {
    if cfg.shards > MOST_SHARDS {
        return Vec::new();
    }
    let schedule = |epoch: u64| {
        let mut s = spec.clone();
        s.epoch = epoch;
        Schedule::of(&s).expect("a schedule")
    };
    let queue_of = |sc: &Schedule| super::first_reads(sc, cfg.shards);
    let size = cfg.samples as u64 * cfg.sample_bytes;
    let d = cfg.shards as u64 * size;
    let mut o = Oracle {
        cfg,
        size,
        capacity: (d as f64 * cfg.cache) as u64,
        held: vec![false; cfg.shards],
        used: 0,
        reserved: 0,
        transfers: Vec::new(),
        through: HashSet::new(),
        sched: schedule(0),
        place: 0.0,
    };
    let bound = (d as f64 / cfg.job).max(d.saturating_sub(o.capacity) as f64 / cfg.backend);
    let per_s = cfg.job / (cfg.ranks as f64 * cfg.sample_bytes as f64);
    let mut queue = queue_of(&o.sched);
    let mut pending: VecDeque<(u64, usize)> = VecDeque::new();
    let mut walls = Vec::new();
    let mut wall = 0.0;
    while (walls.len() as u64) < cfg.epochs {
        wall += DT;
        o.transfer(DT);
        let target = o.place + per_s * DT;
        while let Some(&(first, shard)) = queue.front() {
            if first as f64 > target + cfg.lead as f64 {
                break;
            }
            queue.pop_front();
            if o.held[shard] {
                continue;
            }
            if !o.transfers.iter().any(|t| t.shard == shard) {
                let admitted = o.make_room(0);
                o.start(shard, admitted);
            }
            pending.push_back((first, shard));
        }
        pending.retain(|&(_, shard)| !(o.held[shard] || o.through.remove(&shard)));
        let lost: Vec<usize> = pending
            .iter()
            .map(|&(_, shard)| shard)
            .filter(|&s| !o.transfers.iter().any(|t| t.shard == s))
            .collect();
        for shard in lost {
            let admitted = o.make_room(0);
            o.start(shard, admitted);
        }
        let mut limit = target;
        for &(first, shard) in &pending {
            let arrived = o
                .transfers
                .iter()
                .find(|t| t.shard == shard)
                .map_or(0.0, |t| 1.0 - t.left / size as f64);
            limit = limit.min(super::streamed_to(&o.sched, first, shard, arrived));
        }
        o.place = limit.max(o.place);
        if o.place >= o.sched.per_rank as f64 && queue.is_empty() && pending.is_empty() {
            walls.push(wall);
            wall = 0.0;
            o.sched = schedule(walls.len() as u64);
            o.place = 0.0;
            queue = queue_of(&o.sched);
        }
        o.prefetch();
        if wall > 20.0 * bound.max(1.0) {
            break;
        }
    }
    walls
}
