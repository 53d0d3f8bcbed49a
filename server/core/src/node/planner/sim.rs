//! The planner at scale, simulated: the real plans (registration, notes, reports to the
//! home, standings), the real schedule, ring and decisions (`planned`, `decide`), over
//! simulated caches, a simulated backend and simulated ranks. No I/O and no waiting:
//! time is the plans' simulated clock, advanced a tenth of a [`TICK`] at a time.
//!
//! The model:
//! - **The backend** gives `backend` bytes per second in all, shared equally by the
//!   transfers in flight (per connection, as S3 and the pacing proxy of P13 do).
//! - **The ranks** consume in lockstep (a data-parallel job waits for its slowest rank
//!   every step), at `job` bytes per second in all, and read `lead` places ahead of
//!   what they consume (a loader's read-ahead). A shard's first planned read finds it
//!   in its owner's cache (ready), or waits on the fetch in flight or on a read of the
//!   backend (a demand read: admitted where the cache has room or the node's read
//!   makes it, dropping planned entries needed later than the shard's next epoch,
//!   else read through). A waiting read streams: the ranks consume the shard's places
//!   front to back over its span as far as its bytes have come, and no further.
//! - **Progress** is noted where reads are served: each member notes the ranks whose
//!   reads it served in a tick (rank `r` reads from the owner of the shard at its
//!   place, modelled as a hash of the rank and the shard's span), and reports to each
//!   plan's home every [`EXCHANGE_EVERY`], as a real member does; the calls' bodies are
//!   serialized as the real ones, to count the bytes.
//! - **The planner** looks once per tick and once more for each fetch that ended on
//!   the member, as the node's loop does (woken by the fetch's end). The backend and
//!   the ranks move in tenths of a tick, so a fetch shorter than a tick ends in time.

mod oracle;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use granary_proto::plan::{PlanMark, PlanShard, PlanSpec, Schedule};
use granary_proto::ring::Ring;

use super::{
    decide, need_by_plan, owned_shards, planned, room_for, split, InFlight, Look, Meter, Planned,
    Standings, Step, BEHIND, EXCHANGE_EVERY, HOME, TICK,
};
use crate::cache::Usage;
use crate::cluster::calls::PlanReport;
use crate::cluster::ring::key_hash;
use crate::plans::{set_simulated_now, Plans};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub nodes: usize,
    pub ranks: usize,
    pub shards: usize,
    /// Samples per shard.
    pub samples: u32,
    pub sample_bytes: u64,
    /// The cluster's cache over the dataset, C / D.
    pub cache: f64,
    /// The backend's throughput for the whole cluster, B, bytes per second.
    pub backend: f64,
    /// The job's consumption, X, bytes per second over all ranks.
    pub job: f64,
    pub epochs: u64,
    /// How far ahead of what they consume the ranks read, in places (samples per
    /// rank): a loader's read-ahead.
    pub lead: u64,
    /// Stop after this many simulated seconds (0: after `epochs`).
    pub seconds: f64,
}

/// One simulated epoch.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SimEpoch {
    pub epoch: u64,
    pub wall_s: f64,
    /// max(D / X, (D − C) / B).
    pub bound_s: f64,
    /// Shards whose first read found them in the cache, over all shards read.
    pub ready: f64,
    pub backend_over_d_minus_c: f64,
    /// The epoch under a clairvoyant schedule of the same shape (`oracle`): what
    /// knowing every order and fetching in order of need does; `None` above
    /// 20,000 shards.
    pub oracle_s: Option<f64>,
}

/// What the simulation measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SimReport {
    pub epochs: Vec<SimEpoch>,
    /// Plan-exchange bytes (reports and standings, as JSON bodies) per member per
    /// second, sent and received; and at the busiest home.
    pub exchange_bytes_per_node_s: f64,
    pub exchange_bytes_busiest_node_s: f64,
    /// CPU per planner look on one member (ranking the plans' shards and deciding),
    /// microseconds: the mean and the largest.
    pub look_us_mean: f64,
    pub look_us_max: f64,
    /// Working out which of the plan's shards one member owns, as the node does (the
    /// ring over every member, per shard), microseconds: once per plan and per change
    /// of owners (the looks above walk the member's own shards).
    pub owned_us: f64,
    /// CPU to make one epoch's schedule (each member makes it as the plan advances),
    /// microseconds.
    pub schedule_us: f64,
    /// Simulated seconds, and the seconds this simulation took.
    pub simulated_s: f64,
    pub sim_s: f64,
}

const BUCKET: &str = "sim";
/// Simulation steps per planner tick.
const STEPS: u32 = 10;

/// A transfer from the backend in flight.
struct Transfer {
    shard: usize,
    size: u64,
    left: f64,
    /// A client's read (else the planner's fetch).
    demand: bool,
    /// Admitted: room reserved in the cache.
    admitted: bool,
    started: Instant,
    /// Requests it runs at once (a planned fetch read in ranges).
    streams: usize,
}

/// A member, simulated.
struct Member {
    id: String,
    plans: Plans,
    /// Shards held, and their sizes.
    held: HashMap<usize, u64>,
    used: u64,
    reserved: u64,
    capacity: u64,
    /// Planned fetches in flight: `bucket/key`, and sizes.
    fetching: HashMap<String, InFlight>,
    transfers: Vec<Transfer>,
    meter: Meter,
    backend_bytes: u64,
    waited_at: Option<Instant>,
    /// Looks owed this tick: one, and one per fetch that ended.
    looks: usize,
    /// Plan-exchange bytes this member sent and received.
    exchange_bytes: u64,
}

impl Member {
    fn usage(&self) -> Usage {
        Usage {
            used: self.used,
            reserved: self.reserved,
            capacity: self.capacity,
            objects: self.held.len() as u64,
        }
    }
}

fn key_of(i: usize) -> String {
    format!("p/shard-{i:06}.tar")
}

/// Runs the simulation.
pub fn simulate(cfg: &SimConfig) -> SimReport {
    let wall = Instant::now();
    let t0 = Instant::now();
    let mut now = t0;
    set_simulated_now(Some(now));
    let ids: Vec<String> = (0..cfg.nodes).map(|i| format!("n{i:04}")).collect();
    let ring = Ring::uniform(ids.iter().cloned());
    let shard_bytes = cfg.samples as u64 * cfg.sample_bytes;
    let keys: Vec<String> = (0..cfg.shards).map(key_of).collect();
    let owner: Vec<usize> = keys
        .iter()
        .map(|k| ring.owner(key_hash(BUCKET, k)).unwrap_or(0))
        .collect();
    let index: HashMap<&str, usize> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_str(), i))
        .collect();
    let d = cfg.shards as u64 * shard_bytes;
    let c = (d as f64 * cfg.cache) as u64;
    let spec = PlanSpec {
        bucket: BUCKET.into(),
        prefix: "p/".into(),
        shards: keys
            .iter()
            .map(|k| PlanShard {
                key: k.clone(),
                etag: "e".into(),
                samples: cfg.samples,
                size: shard_bytes,
                end: None,
            })
            .collect(),
        seed: 7,
        epoch: 0,
        world_size: cfg.ranks,
        shuffle_buffer: 0,
        shuffle_shards: true,
        drop_last: false,
        batch_size: 1,
        rounds: vec![],
        job: None,
        pipeline: None,
    };
    let mut members: Vec<Member> = ids
        .iter()
        .map(|id| Member {
            id: id.clone(),
            plans: Plans::new(Duration::from_secs(3600)),
            held: HashMap::new(),
            used: 0,
            reserved: 0,
            capacity: c / cfg.nodes as u64,
            fetching: HashMap::new(),
            transfers: Vec::new(),
            meter: Meter::default(),
            backend_bytes: 0,
            waited_at: None,
            looks: 0,
            exchange_bytes: 0,
        })
        .collect();
    let plan_id = spec.id();
    for m in &members {
        m.plans.register(spec.clone()).expect("a valid plan");
    }
    let home = ring.owner(key_hash(HOME, &plan_id)).unwrap_or(0);
    // Which shards each member owns, worked out as the node does (on member 0: its
    // cost), and for every member from the owners above.
    let owned_us = {
        let start = Instant::now();
        let list = owned_shards(&spec, |kh| ring.owner(kh) == Some(0));
        std::hint::black_box(list.len());
        start.elapsed().as_secs_f64() * 1e6
    };
    let mine: Vec<Arc<[usize]>> = (0..cfg.nodes)
        .map(|i| (0..cfg.shards).filter(|&s| owner[s] == i).collect())
        .collect();

    let places_per_s = cfg.job / (cfg.ranks as f64 * cfg.sample_bytes as f64);
    let mut epoch = 0u64;
    let mut schedule_us = 0.0;
    let mut sched = {
        let s = Instant::now();
        let sc = Schedule::of(&spec).expect("a schedule");
        schedule_us += s.elapsed().as_secs_f64() * 1e6;
        sc
    };
    let queue_of = |sc: &Schedule| first_reads(sc, cfg.shards);
    let mut queue = queue_of(&sched);
    let mut place = 0.0f64;
    let mut epochs = Vec::new();
    let mut epoch_start = now;
    let mut epoch_backend = 0u64;
    let mut waited = 0u64;
    // Shards read through (not admitted) whose read has come in: readable once.
    let mut read_through: std::collections::HashSet<usize> = Default::default();
    // Reads that found no entry, waiting for their shard: first place, shard.
    let mut pending: VecDeque<(u64, usize)> = VecDeque::new();
    // How far ahead of what they consume the ranks read: `lead` places.
    let lead = cfg.lead as f64;
    let mut last_exchange = now;
    let (mut looks, mut look_total, mut look_max) = (0u64, 0.0f64, 0.0f64);
    // The backend and the ranks move in steps of a tenth of a tick, so that fetches
    // shorter than a tick end when they end; the planner looks every tick, and at the
    // step in which a fetch of its ended (the node's loop is woken by the fetch's end).
    let step = TICK / STEPS;
    let tick = step.as_secs_f64();
    let mut steps = 0u32;
    let bound = (d as f64 / cfg.job).max(d.saturating_sub(c) as f64 / cfg.backend);

    while epoch < cfg.epochs {
        now += step;
        steps += 1;
        set_simulated_now(Some(now));
        // The backend, shared per connection.
        let n: usize = members
            .iter()
            .flat_map(|m| &m.transfers)
            .map(|t| t.streams)
            .sum();
        if n > 0 {
            let each = cfg.backend * tick / n as f64;
            for m in members.iter_mut() {
                let mut ended = Vec::new();
                for (i, t) in m.transfers.iter_mut().enumerate() {
                    let got = (each * t.streams as f64).min(t.left);
                    t.left -= got;
                    m.backend_bytes += got as u64;
                    epoch_backend += got as u64;
                    if t.left <= 0.5 {
                        ended.push(i);
                    }
                }
                for i in ended.into_iter().rev() {
                    let t = m.transfers.swap_remove(i);
                    if t.admitted {
                        m.reserved -= t.size;
                        m.used += t.size;
                        m.held.insert(t.shard, t.size);
                    } else {
                        read_through.insert(t.shard);
                    }
                    if !t.demand {
                        m.fetching.remove(&format!("{BUCKET}/{}", keys[t.shard]));
                        m.meter
                            .fetched(t.size, now.duration_since(t.started), t.streams);
                        m.looks += 1;
                    }
                }
            }
        }
        // The ranks, in lockstep: they read `lead` places ahead of what they consume,
        // and each shard's first read needs it at its owner. A read that does not find
        // it waits on a fetch in flight or on a read of the backend; the job consumes
        // up to the first place of the oldest read still waiting.
        let target = place + places_per_s * tick;
        while let Some(&(first, shard)) = queue.front() {
            if first as f64 > target + lead {
                break;
            }
            queue.pop_front();
            let m = &mut members[owner[shard]];
            let mark = PlanMark {
                plan: plan_id.clone(),
                epoch,
                rank: (shard % cfg.ranks) as u32,
                place: first,
            };
            if m.held.contains_key(&shard) {
                m.plans
                    .note(&mark, &keys[shard], Some((0, shard_bytes)), true);
                continue;
            }
            waited += 1;
            m.plans
                .note(&mark, &keys[shard], Some((0, shard_bytes)), false);
            m.waited_at = Some(now);
            if !m.transfers.iter().any(|t| t.shard == shard) {
                // A full cache makes room as the node's read does
                // (`Node::room_for_planned`): entries needed later than the shard's
                // next epoch are dropped, else it is read through.
                if m.capacity.saturating_sub(m.used + m.reserved) < shard_bytes {
                    make_room(m, &mine[owner[shard]], &index, &keys[shard]);
                }
                let room = m.capacity.saturating_sub(m.used + m.reserved);
                let admitted = room >= shard_bytes;
                if admitted {
                    m.reserved += shard_bytes;
                }
                m.transfers.push(Transfer {
                    shard,
                    size: shard_bytes,
                    left: shard_bytes as f64,
                    demand: true,
                    admitted,
                    started: now,
                    streams: 1,
                });
            }
            pending.push_back((first, shard));
        }
        // Reads still waiting: done once their shard is in, or read through; meanwhile
        // they stream what has come of it, as a read joined to a fill does.
        pending.retain(|&(_, shard)| {
            !(members[owner[shard]].held.contains_key(&shard) || read_through.remove(&shard))
        });
        let mut limit = target;
        for &(first, shard) in &pending {
            let m = &mut members[owner[shard]];
            m.waited_at = Some(now);
            let arrived = match m.transfers.iter().find(|t| t.shard == shard) {
                Some(t) => 1.0 - t.left / t.size as f64,
                None => {
                    // Its entry was dropped before the read came to it (a real read
                    // holds it): read again.
                    m.transfers.push(Transfer {
                        shard,
                        size: shard_bytes,
                        left: shard_bytes as f64,
                        demand: true,
                        admitted: false,
                        started: now,
                        streams: 1,
                    });
                    0.0
                }
            };
            limit = limit.min(streamed_to(&sched, first, shard, arrived));
        }
        place = limit.max(place);
        // Ready counts each shard once: at its pop (a waited shard pops later).
        // Progress: each member notes the ranks it served this tick.
        let p = place.min(sched.per_rank as f64) as u64;
        let span = cfg.samples.max(1) as u64;
        for r in 0..cfg.ranks {
            let served = owner[(r * 7919 + (p / span) as usize * 104_729) % cfg.shards];
            let mark = PlanMark {
                plan: plan_id.clone(),
                epoch,
                rank: r as u32,
                place: p,
            };
            members[served].plans.note(&mark, "", None, true);
        }
        // The epoch's end.
        if place >= sched.per_rank as f64 && queue.is_empty() && pending.is_empty() {
            let shards_read = cfg.shards as u64;
            let ready = shards_read.saturating_sub(waited);
            epochs.push(SimEpoch {
                epoch,
                wall_s: now.duration_since(epoch_start).as_secs_f64(),
                bound_s: bound,
                ready: ready as f64 / shards_read as f64,
                backend_over_d_minus_c: epoch_backend as f64 / d.saturating_sub(c).max(1) as f64,
                oracle_s: None,
            });
            epoch += 1;
            epoch_start = now;
            epoch_backend = 0;
            waited = 0;
            place = 0.0;
            let mut next = spec.clone();
            next.epoch = epoch;
            let s = Instant::now();
            sched = Schedule::of(&next).expect("a schedule");
            schedule_us = schedule_us.max(s.elapsed().as_secs_f64() * 1e6);
            queue = queue_of(&sched);
            for m in &members {
                m.plans.note(
                    &PlanMark {
                        plan: plan_id.clone(),
                        epoch,
                        rank: 0,
                        place: 0,
                    },
                    "",
                    None,
                    true,
                );
            }
        }
        // The exchange: every member reports to the plan's home.
        if now.duration_since(last_exchange) >= EXCHANGE_EVERY {
            last_exchange = now;
            for i in 0..members.len() {
                let m = &members[i];
                let (missing, _) = split_here(m, &mine[i], &index);
                let need = need_by_plan(&missing).remove(&plan_id).unwrap_or_default();
                let Some(plan) = m.plans.get(&plan_id) else {
                    continue;
                };
                let report = plan.report(need, m.backend_bytes);
                let call = PlanReport {
                    from: m.id.clone(),
                    report,
                };
                let Some(at_home) = members[home].plans.get(&plan_id) else {
                    continue;
                };
                if i == home {
                    at_home.merge(&call.from, call.report);
                    continue;
                }
                let sent = serde_json::to_vec(&call).map_or(0, |v| v.len() as u64);
                let standing = at_home.merge(&call.from, call.report);
                let back = serde_json::to_vec(&Some(&standing)).map_or(0, |v| v.len() as u64);
                plan.learn(standing);
                members[i].exchange_bytes += sent + back;
                members[home].exchange_bytes += sent + back;
            }
        }
        // The planners.
        for (i, m) in members.iter_mut().enumerate() {
            let n = std::mem::take(&mut m.looks) + usize::from(steps.is_multiple_of(STEPS));
            if n == 0 {
                continue;
            }
            m.meter.look(!m.fetching.is_empty(), m.backend_bytes, now);
            for _ in 0..n {
                let start = Instant::now();
                let step = look(m, &mine[i], cfg.nodes, &index);
                let us = start.elapsed().as_secs_f64() * 1e6;
                looks += 1;
                look_total += us;
                look_max = look_max.max(us);
                let Some(step) = step else { break };
                let (shard, streams) = match step {
                    Step::Fetch(s, n) => (s, n),
                    Step::DropThenFetch(victims, s, n) => {
                        for v in victims {
                            if let Some(size) = m.held.remove(&index[v.key.as_str()]) {
                                m.used -= size;
                            }
                        }
                        (s, n)
                    }
                };
                let si = index[shard.key.as_str()];
                let room = m.capacity.saturating_sub(m.used + m.reserved);
                if room < shard.size {
                    break;
                }
                m.reserved += shard.size;
                m.fetching.insert(
                    format!("{BUCKET}/{}", shard.key),
                    InFlight {
                        size: shard.size,
                        streams,
                    },
                );
                m.transfers.push(Transfer {
                    shard: si,
                    size: shard.size,
                    left: shard.size as f64,
                    demand: false,
                    admitted: true,
                    started: now,
                    streams,
                });
            }
        }
        // A stuck simulation ends, and one cut short.
        if now.duration_since(epoch_start).as_secs_f64() > 20.0 * bound.max(1.0)
            || (cfg.seconds > 0.0 && now.duration_since(t0).as_secs_f64() >= cfg.seconds)
        {
            break;
        }
    }
    set_simulated_now(None);
    for (e, wall) in epochs.iter_mut().zip(oracle::epochs(cfg, &spec)) {
        e.oracle_s = Some(wall);
    }
    let secs = now.duration_since(t0).as_secs_f64().max(1e-9);
    let per_node: Vec<f64> = members
        .iter()
        .map(|m| m.exchange_bytes as f64 / secs)
        .collect();
    SimReport {
        epochs,
        exchange_bytes_per_node_s: per_node.iter().sum::<f64>() / per_node.len().max(1) as f64,
        exchange_bytes_busiest_node_s: per_node.iter().copied().fold(0.0, f64::max),
        look_us_mean: look_total / looks.max(1) as f64,
        look_us_max: look_max,
        owned_us,
        schedule_us,
        simulated_s: secs,
        sim_s: wall.elapsed().as_secs_f64(),
    }
}

/// The epoch's shards by their first place: (place, shard), those read in this round.
fn first_reads(sc: &Schedule, shards: usize) -> VecDeque<(u64, usize)> {
    let mut q: Vec<(u64, usize)> = (0..shards)
        .filter_map(|i| sc.next_use(i, 0, 0).map(|f| (f, i)))
        .filter(|&(f, _)| f < sc.per_rank)
        .collect();
    q.sort_unstable();
    q.into()
}

/// How far the ranks can consume while shard `shard`, first read at place `first`,
/// is still coming in (`arrived`, the fraction that has): its places are read front to
/// back over its span, so the place its arrived bytes reach.
fn streamed_to(sched: &Schedule, first: u64, shard: usize, arrived: f64) -> f64 {
    let (_, end) = sched.span(shard).unwrap_or((first, first + 1));
    first as f64 + arrived.clamp(0.0, 1.0) * end.saturating_sub(first) as f64
}

/// A member's planned shards (`mine`), not held and held, as `Node::split_held` splits them.
fn split_here(
    m: &Member,
    mine: &Arc<[usize]>,
    index: &HashMap<&str, usize>,
) -> (Vec<Planned>, Vec<Planned>) {
    split(planned(&m.plans.all(), |_, _| mine.clone()), |p| {
        m.held.get(&index[p.key.as_str()]).copied()
    })
}

/// A client's read of `key` on a full cache, as `Node::room_for_planned` makes room
/// for it: the planned entries needed later than its next epoch's read are dropped.
fn make_room(m: &mut Member, mine: &Arc<[usize]>, index: &HashMap<&str, usize>, key: &str) {
    let (missing, held) = split_here(m, mine, index);
    let Some(mut target) = missing.into_iter().find(|p| p.key == key) else {
        return;
    };
    target.due = target.reuse;
    if !target.due.is_finite() {
        return;
    }
    for v in room_for(&target, held, m.usage()).unwrap_or_default() {
        if let Some(size) = m.held.remove(&index[v.key.as_str()]) {
            m.used -= size;
        }
    }
}

/// One look of a member's planner (`mine`: its shards), as `Node::next_step` makes it.
fn look(
    m: &Member,
    mine: &Arc<[usize]>,
    members: usize,
    index: &HashMap<&str, usize>,
) -> Option<Step> {
    let plans = m.plans.all();
    let (wanted, held) = split_here(m, mine, index);
    // Shards a client's read is bringing have their room already, as fills do.
    let filling = |_: &str, k: &str| {
        index
            .get(k)
            .is_some_and(|&s| m.transfers.iter().any(|t| t.demand && t.shard == s))
    };
    let now = crate::plans::now();
    let look = Look {
        usage: m.usage(),
        fetching: &m.fetching,
        filling: &filling,
        measured: m.meter.rate,
        one: m.meter.one,
        demand: m.transfers.iter().any(|t| t.demand),
        waited: m
            .waited_at
            .is_some_and(|at| now.duration_since(at) < BEHIND),
        standing: Standings::of(&plans),
        members,
    };
    if wanted.is_empty() {
        return None;
    }
    decide(&look, wanted, held)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(cache: f64, bx: f64) -> SimConfig {
        SimConfig {
            nodes: 3,
            ranks: 4,
            shards: 96,
            samples: 16,
            sample_bytes: 256 << 10,
            cache,
            backend: bx * 48.0 * (1 << 20) as f64,
            job: 48.0 * (1 << 20) as f64,
            epochs: 3,
            lead: 32,
            seconds: 0.0,
        }
    }

    /// With most of the dataset cached and a backend near the job's rate, the planner
    /// has every read of a later epoch ready, and brings from the backend about what the
    /// cache cannot hold; the exchange's bytes are counted.
    #[test]
    fn a_small_cluster_keeps_its_reads_ready() {
        let r = simulate(&small(0.8, 0.9));
        assert_eq!(r.epochs.len(), 3, "{r:?}");
        let last = &r.epochs[2];
        assert!(last.ready >= 0.95, "{r:?}");
        assert!(last.wall_s <= 1.1 * last.bound_s, "{r:?}");
        assert!(r.epochs[0].ready < 0.5, "the first epoch is cold: {r:?}");
        assert!(r.exchange_bytes_per_node_s > 0.0);
        assert!(r.look_us_mean > 0.0);
    }

    /// Without a cache the backend is the bound: every read waits, and the epochs
    /// take the backend's time for the whole dataset at least.
    #[test]
    fn with_no_room_every_read_waits_on_the_backend() {
        let r = simulate(&SimConfig {
            epochs: 2,
            ..small(0.0, 0.9)
        });
        assert_eq!(r.epochs.len(), 2, "{r:?}");
        for e in &r.epochs {
            assert_eq!(e.ready, 0.0, "{r:?}");
            assert!(e.wall_s >= 0.95 * e.bound_s, "{r:?}");
        }
    }

    /// The clairvoyant reference: with room for the whole dataset its later epochs run
    /// at the job's pace; with no room every byte comes from the backend, and no
    /// schedule beats the backend's time for the dataset.
    #[test]
    fn the_oracle_meets_the_bound_where_it_can_and_never_beats_it() {
        let full = simulate(&small(1.0, 0.5));
        for e in &full.epochs[1..] {
            let o = e.oracle_s.expect("an oracle epoch");
            assert!(o <= 1.03 * e.bound_s, "{full:?}");
        }
        let none = simulate(&SimConfig {
            epochs: 2,
            ..small(0.0, 0.9)
        });
        for e in &none.epochs {
            let o = e.oracle_s.expect("an oracle epoch");
            assert!(o >= 0.97 * e.bound_s, "{none:?}");
        }
    }

    /// Many ranks in lockstep miss together: 30 shards at once at each of a rank's
    /// shards. Their reads, admitted in place of entries needed later (as the node's
    /// read makes room), keep the cache the planner's; read through, they left it
    /// holding half the next epoch's reads (ready 0.50 on this shape).
    #[test]
    fn many_ranks_in_lockstep_keep_most_reads_ready() {
        let r = simulate(&SimConfig {
            nodes: 1,
            ranks: 30,
            shards: 960,
            job: 32.0 * (1 << 20) as f64,
            backend: 0.55 * 32.0 * (1 << 20) as f64,
            ..small(0.5, 0.55)
        });
        assert_eq!(r.epochs.len(), 3, "{r:?}");
        for e in &r.epochs[1..] {
            assert!(e.ready >= 0.75, "{r:?}");
            assert!(e.wall_s <= 1.12 * e.bound_s, "{r:?}");
        }
    }
}
