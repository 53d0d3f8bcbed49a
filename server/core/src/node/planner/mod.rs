//! The planner: each node fetches the shards it owns ahead of the ranks that will read
//! them, in the order the registered plans say, and when its cache is full drops the
//! planned entry whose next use is farthest to make room for one needed sooner.
//!
//! - **Plans.** A plan registered through any node is passed on to every member up
//!   ([`SharePlan`]), and again every [`crate::plans::RESEND_EVERY`] while its job keeps
//!   registering it, so a member that restarted learns it. A drop is passed on too.
//! - **Progress and need.** Planned reads carry their rank's place; each node notes
//!   the places it serves, and once a second reports them per plan to the plan's home
//!   (its owner on the ring), with its need for the backend: the bytes of the plan's
//!   shards it owns and still has to fetch, by deadline ([`crate::plans::Need`]), and
//!   its count of bytes from the backend. The home answers with the slowest rank's
//!   place and the ranks' rate, the members' needs summed, and the backend's
//!   throughput for the whole cluster (the members' bytes over time; its capacity where
//!   they needed more than they got). One call per plan per member per second,
//!   whatever the number of ranks ([`PlanReport`]).
//! - **The backend shared by need.** The backend is one budget. Each member counts on
//!   no more than its part of the cluster's throughput, in proportion to its need
//!   among all the members' needs (nor more than it measured itself), and runs as
//!   many fetches as its need asks at one fetch's measured throughput, so the member
//!   that owns the most misses runs the most and takes the most. Where the members
//!   together need more than the backend gives, more fetches bring no more bytes,
//!   only a larger part of them, and each holds its room in the cache while it runs:
//!   then each member runs its part of [`FETCHES`] per member, by need (at least one).
//! - **Fetching.** Every [`TICK`], the shards this node owns are ranked by their next
//!   use in seconds (places to go over the plan's rate; the earliest over all plans);
//!   which of a plan's shards this node owns is worked out once per plan and per change
//!   of owners (a member list, who is up: [`crate::cluster::Owners`]), so that a look
//!   walks this node's shards, not the plan's (BENCHMARKS.md: the look at 100 nodes).
//!   Those that fit, soonest first, in the room the plans may use are the ones worth
//!   holding (Belady's choice); the first of them not in the cache is fetched through
//!   the cache (a miss like any other:
//!   one fill, read by whoever asks meanwhile) when it fits beside what is there, or
//!   when dropping planned entries needed later than it makes room. One while the
//!   node's own clients' misses wait on the backend (demand reads go first, and the
//!   planner still gets ahead of them; a read that joins a planned fetch is none);
//!   where the backend is short, its part by need (above); else as many as the shards
//!   still missing need at one request's measured throughput, [`FETCHES`] − 1 to
//!   2 × [`FETCHES`]: members share a backend per connection, and one that owns more
//!   of the misses takes more of it.
//! - **Requests, not rooms.** That count is of requests to the backend. A shard of two
//!   or more 8 MiB ranges is fetched in ranges, side by side (`backend::ranged`), over
//!   as many of them as the count leaves, and a shard that must drop entries to fit
//!   waits for the fetch in flight to end: every fetch in flight holds its shard's room
//!   while it runs, and in a full cache that room is an entry dropped and fetched
//!   again. Measured on 64 MiB shards over 3 nodes (BENCHMARKS.md, P13): two to four
//!   fetches in flight held a quarter to half of a member's cache, and the members
//!   brought 1.2–2.4 × (D − C). Shards smaller than two ranges go as before, a request
//!   each.
//! - **Just in time.** A fetch starts no earlier than it must: it starts once the
//!   shards still missing, fetched one after another at [`SHARE`] of the member's
//!   part of the backend, would otherwise come later than [`SLACK`] before their
//!   reads. A fetch made earlier than that would drop an entry that is read before
//!   the fetched shard's turn comes, and cost its fetch again: the bytes from the
//!   backend stay at what the cache's size forces.
//!   Times come from the ranks' pace when no read waits; while clients' reads have
//!   waited on the backend within [`BEHIND`], the planner is behind, and fetches the
//!   shards still to be read in this epoch as soon as it can.
//! - **Dropping.** Only entries of a plan's shards the ranks have read in this epoch
//!   (by their places, and, where this node served the shard's read of the last
//!   epoch, by its read of this one), never one a read holds, and only for a shard
//!   needed sooner. A shard of the next epoch takes the place of an entry kept for
//!   the next epoch only when it can wait no longer: fetched early, it holds that
//!   place across the epoch's end, and the entry it replaced is fetched again. "No
//!   longer" is at the pace of this member's own fetches, not at its part of the
//!   backend by need: a member with a small part swapped entries for the next epoch
//!   half an epoch early, in chains (each swap's victim fetched back for the next),
//!   and fetched 4–6 shards an epoch where its overflow was 3 (BENCHMARKS.md, P13).
//!   Entries of no plan stay under the cache's policy. A dropped entry's next read is
//!   an ordinary miss: bytes never change.
//!
//! **What the thresholds come from.** Measured by the node: one planned fetch's
//! throughput (`Meter::one`), the backend's throughput (this member's, and the
//! cluster's at the plans' homes), the members' needs, the ranks' pace (places per
//! second, from the exchanged progress) and the time left before each shard's first
//! planned read (its place in the plan over the pace). The numbers that remain:
//! - [`SLACK`] (400 ms), [`SHARE`] (0.75) and [`BEHIND`] (2 s) were fitted to P13's
//!   first shape (2 MiB shards fetched in about 0.1 s, 12 s epochs). Derived in their
//!   place and measured over a matrix of shapes (BENCHMARKS.md, P13): the slack as one
//!   fetch's time, the share as the whole of the member's part, behind for two
//!   fetches' time. Where the backend is the bound, each made the planner bring more
//!   bytes (1.15–1.35 × (D − C) against 1.09–1.12) and the epochs longer in the same
//!   proportion; so they stay, until a derivation holds across the matrix.
//! - [`TICK`] (200 ms) and [`EXCHANGE_EVERY`] (1 s): how often to look and to report;
//!   five looks per exchange, and the staleness an exchange's period brings is
//!   counted in (`Planned::early`).
//! - [`FETCHES`] (2): fetches before one was timed, and the range around the need.
//! - The reads' lag behind a rank's furthest place: measured, as the most places a
//!   read came behind its rank's furthest place (in this epoch or the last, on any
//!   member: [`crate::plans::Plan::lag`]); at least two batches and the shuffle
//!   buffer before it is measured. A DataLoader's workers read batches in turn and a
//!   dataset reads ahead: with the default loader, a shard's second run came 56
//!   places behind a later one, where two batches are 16, and a shard still being
//!   read was dropped at each epoch's start and fetched again (BENCHMARKS.md, P13).
//!   The lag holds only shards not yet read to their end: a shard whose bytes read
//!   here in the epoch cover it (to its samples' end,
//!   [`granary_proto::plan::PlanShard::read_end`]), with the slowest rank past its
//!   last place, is done until the next epoch. Held by the
//!   lag alone, each of R ranks kept its shards up to `lag` places behind its furthest:
//!   R × lag samples of the cache in use (on P13's 48 shards of 16 samples, 4 ranks
//!   with a lag of 56 held 14 of the 24 shards a cache of half the dataset has;
//!   BENCHMARKS.md, "Many ranks").
//! - Not a limit on fetches by the throughput each more one brought: measured
//!   (a member ran one more only while one more brought 1.15 × as much), it changed
//!   nothing on 1 node and cost reads ready on 3, where members share the store per
//!   connection (BENCHMARKS.md, P13).
//! - The meter's span (500 ms) and smoothing (0.7 of the old value): a span must hold
//!   more than one piece of a fetch (1 MiB pieces; at 10 MB/s half a second holds
//!   five), and three spans follow a change.
//! - In `plans`: the rate's span (1.5 s: a report from every member), a need's
//!   freshness (three missed reports), and the deadlines a need is counted by
//!   ([`crate::plans::NEED_BY`]: doubling, within a factor of two of the exact rate).

pub mod sim;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use granary_proto::plan::{PlanMark, PlanSpec, PlanView};

use super::{Node, NodeError, ReadRequest};
use crate::cache::{Origin, Usage};
use crate::cluster::calls::{DropPlan, PlanReport, SharePlan};
use crate::cluster::ring::key_hash;
use crate::cluster::Owners;
use crate::plans::{Plan, PlansError, Standing};
use crate::stats::Metric;
use crate::sync::Locked;

/// How often the planner looks at its plans, besides when a fetch ends or a plan comes:
/// five looks per exchange of the ranks' progress (which is what moves between looks),
/// so that a fetch starts within a fifth of the exchange's age of its time. A look
/// ranks this node's shards of every plan; the simulation in BENCHMARKS.md measures it.
pub const TICK: Duration = Duration::from_millis(200);
/// How often each plan's progress, and this member's need for the backend, are
/// exchanged with the plan's home: one small call per plan per member per second
/// (BENCHMARKS.md has the bytes); the standing it brings is at most this old, and the
/// planner counts that age as time the ranks may have run ahead.
pub const EXCHANGE_EVERY: Duration = Duration::from_secs(1);
/// Planned fetches in flight: as many as the need asks at one fetch's throughput,
/// from [`FETCHES`] − 1 to 2 × [`FETCHES`]; two before one has been timed.
pub const FETCHES: usize = 2;
/// How long before its read a planned shard should be in the cache, at least.
pub const SLACK: Duration = Duration::from_millis(400);
/// The part of its share of the backend's throughput that the planner counts on when it
/// decides that a fetch of this epoch's shards can wait.
pub const SHARE: f64 = 0.75;
/// How long after a client's read waited on the backend the planner fetches as soon as
/// it can, rather than just in time.
pub const BEHIND: Duration = Duration::from_secs(2);
/// The ring key of a plan's home.
const HOME: &str = "\0plans";

/// The planner's state on a node.
#[derive(Default)]
pub struct Planner {
    wake: tokio::sync::Notify,
    /// Shards being fetched: `bucket/key`, and their fetches.
    fetching: Mutex<HashMap<String, InFlight>>,
    /// The backend's throughput as the planner's fetches see it.
    meter: Mutex<Meter>,
    exchanging: AtomicBool,
    /// The node's clients' reads waiting on the backend.
    demand: Arc<AtomicUsize>,
    /// When a client's read last waited on the backend.
    waited: Mutex<Option<Instant>>,
    /// A shard's members being prepared ahead of their reads (one shard at a time).
    prepping: AtomicBool,
    /// The shards whose members were prepared ahead: `PLAN/EPOCH/BUCKET/KEY`.
    prepped: Mutex<HashSet<String>>,
    /// Each plan's shards this node owns, by plan id.
    owned: Mutex<HashMap<String, Owned>>,
}

/// A plan's shards this node owns (their indices in the plan), as worked out for one
/// snapshot of the owners.
struct Owned {
    owners: Owners,
    spec: Arc<PlanSpec>,
    shards: Arc<[usize]>,
}

/// The backend's throughput, measured over spans in which a planned fetch was in
/// flight throughout (bytes from the backend over the span, whoever asked for them).
#[derive(Default)]
struct Meter {
    /// The span's start: when, and the node's bytes from the backend by then.
    since: Option<(Instant, u64)>,
    /// Bytes per second (0: not measured yet).
    rate: f64,
    /// One request's throughput within a planned fetch, bytes per second (0: not
    /// measured yet).
    one: f64,
}

/// `old` moved toward a new measure `r` (`r` itself where nothing was measured yet).
fn smoothed(old: f64, r: f64) -> f64 {
    if old > 0.0 {
        0.7 * old + 0.3 * r
    } else {
        r
    }
}

impl Meter {
    /// The shortest span measured.
    const SPAN: Duration = Duration::from_millis(500);

    /// A look at the backend: `busy` while a planned fetch is in flight, `bytes` the
    /// node's bytes from the backend so far.
    fn look(&mut self, busy: bool, bytes: u64, now: Instant) {
        if !busy {
            self.since = None;
            return;
        }
        match self.since {
            None => self.since = Some((now, bytes)),
            Some((at, before)) if now.duration_since(at) >= Self::SPAN => {
                let r = bytes.saturating_sub(before) as f64 / now.duration_since(at).as_secs_f64();
                self.rate = smoothed(self.rate, r);
                self.since = Some((now, bytes));
            }
            Some(_) => {}
        }
    }

    /// A planned fetch brought `bytes` in `took` over `streams` requests at once.
    fn fetched(&mut self, bytes: u64, took: Duration, streams: usize) {
        let each = bytes as f64 / streams.max(1) as f64;
        self.one = smoothed(self.one, each / took.as_secs_f64().max(1e-3));
    }
}

/// How long the first of `missing` (sizes and seconds to their reads, soonest first)
/// may wait to start, when they are fetched one after another at `rate` bytes per
/// second behind `backlog` bytes already in flight (below 0: late already); `None`
/// when nothing is missing or the rate is not known.
fn spare(missing: &[(u64, f64)], backlog: u64, rate: f64) -> Option<f64> {
    if missing.is_empty() || rate <= 0.0 {
        return None;
    }
    let mut done = backlog as f64 / rate;
    let mut latest = f64::INFINITY;
    for &(size, due) in missing {
        done += size as f64 / rate;
        latest = latest.min(due - done);
    }
    Some(latest)
}

/// The rate, in bytes per second, at which `missing` (as in [`spare`]) must come for
/// each to be in before its read.
fn need(missing: &[(u64, f64)], backlog: u64) -> f64 {
    let mut bytes = backlog as f64;
    let mut most = 0.0f64;
    for &(size, due) in missing {
        bytes += size as f64;
        most = most.max(bytes / due.max(0.05));
    }
    most
}

/// Whether a fetch should start now: the first of `missing` can wait no more than
/// `slack` and the time of one more fetch (fetches in flight share the rate, so the
/// first one started may end later than alone); always, when the rate is not known.
fn due_now(missing: &[(u64, f64)], backlog: u64, rate: f64, slack: f64) -> bool {
    let Some(&(first, _)) = missing.first() else {
        return false;
    };
    spare(missing, backlog, rate).is_none_or(|s| s <= slack + first as f64 / rate)
}

/// Whether `p`'s read comes within `slack` and its own fetch (behind `backlog` bytes in
/// flight, at `rate` bytes per second): a fetch that can wait no longer.
fn just_in_time(p: &Planned, backlog: u64, rate: f64, slack: f64) -> bool {
    spare(&[(p.size, (p.due - p.early).max(0.0))], backlog, rate).is_none_or(|s| s <= slack)
}

/// One of this node's shards as the plans see it.
struct Planned {
    bucket: String,
    key: String,
    size: u64,
    /// Seconds until its next planned read (`INFINITY`: none known; 0: being read).
    due: f64,
    /// Seconds until its first read in the next epoch.
    reuse: f64,
    /// Seconds its plan's ranks may be ahead of the place `due` is counted from (the
    /// standing's age, a report or two).
    early: f64,
    plan: Arc<Plan>,
}

/// A planned fetch in flight: its shard's size, and the requests to the backend it
/// runs.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    size: u64,
    streams: usize,
}

/// What the planner does next: fetch a shard over this many requests at once (its
/// ranges side by side: `backend::ranged`), after dropping these entries.
enum Step {
    Fetch(Planned, usize),
    DropThenFetch(Vec<Planned>, Planned, usize),
}

/// A demand read of the backend in flight, counted while it lives.
pub struct Demand(Arc<AtomicUsize>);

impl Drop for Demand {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn plans_error(e: PlansError) -> NodeError {
    match e {
        PlansError::Full => NodeError::Busy(e.to_string()),
        e => NodeError::Invalid(e.to_string()),
    }
}

/// What the planner looks at, gathered from the node (or from a simulation of one).
struct Look<'a> {
    pub usage: Usage,
    /// Planned fetches in flight, by `bucket/key`.
    pub fetching: &'a HashMap<String, InFlight>,
    /// Whether a client's read is filling `bucket/key`.
    pub filling: &'a dyn Fn(&str, &str) -> bool,
    /// This member's measure of the backend's throughput, and of one fetch's.
    pub measured: f64,
    pub one: f64,
    /// A client's read waits on the backend now.
    pub demand: bool,
    /// A client's read waited on the backend within [`BEHIND`].
    pub waited: bool,
    pub standing: Standings,
    /// Members up, this one among them.
    pub members: usize,
}

/// The plans' standings, summed: what the homes last said of the cluster's backend.
#[derive(Default)]
struct Standings {
    /// The backend's throughput for the whole cluster (0: not measured yet).
    pub backend: f64,
    /// The members' needs over all plans.
    pub need: crate::plans::Need,
}

impl Standings {
    pub fn of(plans: &[Arc<Plan>]) -> Standings {
        let mut s = Standings::default();
        for plan in plans {
            let st = plan.standing();
            s.backend = s.backend.max(st.backend);
            s.need.add(&st.need);
        }
        s
    }
}

/// What to do next: the earliest shard not in the cache (`wanted`; `held`: those in
/// it), if it fits, or fits once planned entries needed later are dropped.
fn decide(look: &Look<'_>, mut wanted: Vec<Planned>, held: Vec<Planned>) -> Option<Step> {
    // Shards being read now are the readers' to bring (by range, as they go); the
    // planner brings the next ones before their first read. A shard a client's read
    // is filling has its room already.
    wanted.retain(|p| {
        p.due > 0.0
            && p.due.is_finite()
            && !look
                .fetching
                .contains_key(&format!("{}/{}", p.bucket, p.key))
            && !(look.filling)(&p.bucket, &p.key)
    });
    // Belady's horizon: the shards needed soonest that fit in the room plans may
    // use (the cache less what entries of no plan hold) are the ones worth holding;
    // one needed later would be dropped before its read for one needed sooner, its
    // fetch wasted.
    let u = look.usage;
    let unplanned = u.used.saturating_sub(held.iter().map(|p| p.size).sum());
    let budget = u.capacity.saturating_sub(unplanned);
    let mut by_due: Vec<(f64, u64)> = held
        .iter()
        .chain(&wanted)
        .map(|p| (p.due, p.size))
        .collect();
    by_due.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Fills in flight hold their room already.
    let mut taken = u.reserved;
    let mut horizon = f64::NEG_INFINITY;
    for (due, n) in by_due {
        taken += n;
        if taken > budget {
            break;
        }
        horizon = due;
    }
    wanted.sort_by(|a, b| a.due.total_cmp(&b.due));
    let missing: Vec<(u64, f64)> = wanted
        .iter()
        .map(|p| (p.size, (p.due - p.early).max(0.0)))
        .collect();
    let backlog = look.fetching.values().map(|f| f.size).sum();
    let streams_now: usize = look.fetching.values().map(|f| f.streams).sum();
    // Behind: a client's read waited lately, and the shard first needed is still to be
    // read in this epoch. A shard for the next epoch waits for its time even then:
    // fetched early, it is the first entry dropped for a read of this epoch's.
    let waited = look.waited;
    let behind = wanted.first().is_some_and(|p| p.due < p.reuse) && waited;
    let one = look.one;
    // Clients' reads waiting on the backend go first: one planned fetch at most
    // beside them (the planner then keeps its place ahead of them, which is what
    // keeps them from waiting); reads that join a planned fetch are none of them.
    // Else as many as the shards still missing need to come in before their reads,
    // at one fetch's throughput: members share the backend per connection, so a
    // member with more to fetch takes a larger share by running more.
    // Where the members together need more than the backend gives, more fetches
    // bring no more bytes, only a larger part of them, and each holds its room in
    // the cache while it runs (a room that a small cache misses: an entry dropped
    // for it is fetched again). Then the members' fetches are split by need, [`FETCHES`]
    // per member on the whole: this member's part of them, at least one.
    let most = if look.demand {
        1
    } else if let Some(part) = part_of_backend(look, &missing, backlog) {
        ((part * (FETCHES * look.members.max(1)) as f64).round() as usize).max(1)
    } else if one > 0.0 {
        let wanted = (need(&missing, backlog) / one).ceil() as usize;
        (wanted.max(FETCHES - 1) + usize::from(waited)).clamp(1, 2 * FETCHES)
    } else {
        FETCHES
    };
    // Counted in requests to the backend: a shard large enough to be read in ranges
    // takes several (below). No more than 2 × [`FETCHES`] at once, as fetches were
    // before they were counted so (a fetch holds as many 8 MiB ranges in memory).
    let most = most.min(2 * FETCHES);
    if streams_now >= most {
        return None;
    }
    // When to start: at this member's part of the backend (below), counting on
    // [`SHARE`] of it: the throughput was measured over spans in which the share
    // of other members and of clients' reads was not the one to come, and a member
    // that starts late cannot make up the time at a share it does not have.
    let share = share_of_backend(look, &missing, backlog);
    let rate = SHARE * share;
    if !behind && !due_now(&missing, backlog, rate, SLACK.as_secs_f64()) {
        return None;
    }
    let first = wanted.into_iter().next().filter(|p| p.due <= horizon)?;
    let victims = room_for(&first, held, u)?;
    // The requests the need asks for go to one shard, read in ranges, where it is large
    // enough: each fetch in flight holds its shard's room in the cache while it runs,
    // and where the cache is full that room is an entry dropped (and fetched again).
    // So a shard that has to drop entries to fit waits for the fetch in flight
    // to end, where that one could take the requests itself.
    let ranges = crate::backend::ranged::ranges_of(first.size);
    let streams = (most - streams_now).min(ranges);
    if ranges > 1 && !victims.is_empty() && !look.fetching.is_empty() {
        return None;
    }
    if victims.is_empty() {
        return Some(Step::Fetch(first, streams));
    }
    // A shard of the next epoch fetched before this epoch's reads are over, in
    // place of an entry kept for the next epoch, takes that entry's place across
    // the epoch's end, and the entry is fetched again: only when it can wait no
    // longer (once the ranks read the next epoch, its entries read make room).
    // Its time is taken at what one of this member's fetches gets (its own measure,
    // not its part by need): the swap costs a fetch whenever it is made early, and
    // a swap made late costs at most a wait, the entries read meanwhile making room
    // without one.
    let fetch_rate = own_throughput(look).max(share);
    if first.due >= first.reuse && !just_in_time(&first, backlog, fetch_rate, SLACK.as_secs_f64()) {
        return None;
    }
    Some(Step::DropThenFetch(victims, first, streams))
}

/// The backend's throughput this member counts on when it times its fetches: its
/// part of the cluster's measured throughput, by its need (`missing` as in [`spare`],
/// behind `backlog` bytes in flight) among the members' needs as the plans' homes
/// last summed them (counted alike, by [`crate::plans::Need`]), and no more than
/// its own measure: the throughput it saw (`measured`, over spans in which it
/// fetched), as if [`FETCHES`] of `one` fetch's throughput ran at once (a span in
/// which it had the backend alone says little of one in which every member
/// fetches). Its own measure alone until the homes have measured the cluster's.
/// Where the members together need more of the backend than its measured throughput:
/// this member's part of their need (else `None`).
fn part_of_backend(look: &Look<'_>, missing: &[(u64, f64)], backlog: u64) -> Option<f64> {
    let budget = look.standing.backend;
    let (mine, total) = needs(look, missing, backlog);
    (budget > 0.0 && mine > 0.0 && total > budget).then(|| mine / total)
}

/// This member's need rate (`missing` behind `backlog`, counted as the members count
/// theirs) and the members' together, as the homes last summed them (which hold this
/// member's as it last reported it).
fn needs(look: &Look<'_>, missing: &[(u64, f64)], backlog: u64) -> (f64, f64) {
    let mine = crate::plans::Need::of(missing.iter().copied().chain([(backlog, 0.0)])).rate();
    (mine, look.standing.need.rate().max(mine))
}

/// This member's own measure of the backend: the throughput it saw, as if [`FETCHES`]
/// of one fetch's ran at once (see [`share_of_backend`]).
fn own_throughput(look: &Look<'_>) -> f64 {
    let (measured, one) = (look.measured, look.one);
    if measured > 0.0 && one > 0.0 {
        measured.min(one * FETCHES as f64)
    } else {
        measured
    }
}

fn share_of_backend(look: &Look<'_>, missing: &[(u64, f64)], backlog: u64) -> f64 {
    let budget = look.standing.backend;
    let own = own_throughput(look);
    if budget <= 0.0 || own <= 0.0 {
        return own;
    }
    // Nothing needed by anyone (or by this member alone): all of it.
    let (mine, total) = needs(look, missing, backlog);
    if total <= 0.0 || mine <= 0.0 {
        return own;
    }
    own.min(budget * mine / total)
}

/// `list` split into the shards not in the cache and those in it (`holds`: an entry's
/// size), each looked up once: a held one's `size` is its entry's.
fn split(
    list: Vec<Planned>,
    holds: impl Fn(&Planned) -> Option<u64>,
) -> (Vec<Planned>, Vec<Planned>) {
    let (mut missing, mut held) = (Vec::new(), Vec::new());
    for mut p in list {
        match holds(&p) {
            Some(n) => {
                p.size = n;
                held.push(p);
            }
            None => missing.push(p),
        }
    }
    (missing, held)
}

/// The need of shards still `missing`, by the plan that reads each first: what a
/// member reports to each plan's home.
fn need_by_plan(missing: &[Planned]) -> HashMap<String, crate::plans::Need> {
    let mut by: HashMap<String, Vec<(u64, f64)>> = HashMap::new();
    for p in missing.iter().filter(|p| p.due.is_finite()) {
        let due = (p.due - p.early).max(0.0);
        by.entry(p.plan.id.clone()).or_default().push((p.size, due));
    }
    by.into_iter()
        .map(|(id, v)| (id, crate::plans::Need::of(v)))
        .collect()
}

/// The planned entries to drop so that `target` fits: none when it fits now, `None`
/// when dropping every entry needed later than it would not do.
fn room_for(target: &Planned, mut held: Vec<Planned>, u: Usage) -> Option<Vec<Planned>> {
    let room = u.capacity.saturating_sub(u.used + u.reserved);
    if target.size <= room {
        return Some(Vec::new());
    }
    // Farthest first; only those needed later than the shard, and read already in
    // this epoch (their next read is the next epoch's, and no read of the last epoch
    // is the last one noted here: the ranks' places run ahead of a slow reader's):
    // one that is still to be read in this epoch is worth keeping until then, as an
    // entry read meanwhile will make room (dropping it for a fetch made early would
    // cost its fetch again).
    held.retain(|p| p.due > target.due && p.due >= p.reuse && !p.plan.unread_here(&p.key));
    held.sort_by(|a, b| b.due.total_cmp(&a.due));
    let mut freed = room;
    let mut victims = Vec::new();
    for v in held {
        if freed >= target.size {
            break;
        }
        freed += v.size;
        victims.push(v);
    }
    (freed >= target.size).then_some(victims)
}

/// The shards of `plans` that this node owns (`mine`), each with its earliest next use.
fn planned(
    plans: &[Arc<Plan>],
    mut mine: impl FnMut(&Plan, &Arc<PlanSpec>) -> Arc<[usize]>,
) -> Vec<Planned> {
    let mut by_key: HashMap<String, Planned> = HashMap::new();
    for plan in plans {
        let spec = plan.spec();
        let (schedule, place, rate, age) = plan.position();
        let early = age.min(EXCHANGE_EVERY).as_secs_f64();
        // Before a rate is known, places stand for seconds: the order holds.
        let rate = if rate > 0.0 { rate } else { 1.0 };
        // A rank's DataLoader workers read batches in turn, and read ahead: the
        // furthest place reported is ahead of the others' by a batch or two at least,
        // and by as much as the reads served have been seen to come behind it.
        let lag = (2 * spec.batch_size.max(1) as u64 + spec.shuffle_buffer as u64).max(plan.lag());
        let covered = plan.covered();
        for &i in mine(plan, &spec).iter() {
            let shard = &spec.shards[i];
            let secs = |p: Option<u64>| p.map_or(f64::INFINITY, |p| p as f64 / rate);
            let reuse = secs(schedule.reuse(i, place));
            // Read to its end in this epoch, and every rank past it: done until the next
            // epoch, whatever the reads' lag (which only says how late a read may come
            // of a shard not yet read whole).
            let read = shard
                .read_end()
                .is_some_and(|end| covered.get(&shard.key).is_some_and(|&c| c >= end));
            let due = if read && schedule.past(i, place) {
                reuse
            } else {
                secs(schedule.next_use(i, place, lag))
            };
            let id = format!("{}/{}", spec.bucket, shard.key);
            match by_key.get_mut(&id) {
                Some(p) if p.due <= due => p.reuse = p.reuse.min(reuse),
                Some(p) => {
                    p.due = due;
                    p.reuse = p.reuse.min(reuse);
                    p.early = early;
                    p.plan = plan.clone();
                }
                None => {
                    by_key.insert(
                        id,
                        Planned {
                            bucket: spec.bucket.clone(),
                            key: shard.key.clone(),
                            size: shard.size,
                            due,
                            reuse,
                            early,
                            plan: plan.clone(),
                        },
                    );
                }
            }
        }
    }
    by_key.into_values().collect()
}

/// The shards of `spec` (their indices) whose key hash `mine` accepts.
fn owned_shards(spec: &PlanSpec, mine: impl Fn(u64) -> bool) -> Arc<[usize]> {
    spec.shards
        .iter()
        .enumerate()
        .filter(|(_, s)| mine(key_hash(&spec.bucket, &s.key)))
        .map(|(i, _)| i)
        .collect()
}

/// Whether two versions of a plan name the same shards (a plan registered again, or
/// for its next epoch, is a new spec with the same list).
fn same_shards(a: &Arc<PlanSpec>, b: &Arc<PlanSpec>) -> bool {
    Arc::ptr_eq(a, b) || (a.bucket == b.bucket && a.shards == b.shards)
}

impl Node {
    /// A job registers its plan (through this node): held here, passed on to every
    /// member up when it is news, and the planner woken.
    pub fn register_plan(self: &Arc<Self>, spec: PlanSpec) -> Result<PlanView, NodeError> {
        let reg = self.plans.register(spec).map_err(plans_error)?;
        if reg.pass_on {
            self.plans.sent(&reg.plan);
            let spec = (*reg.plan.spec()).clone();
            let node = self.clone();
            tokio::spawn(async move {
                let call = SharePlan { spec };
                for m in node.cluster.others_up() {
                    if let Err(e) = node.cluster.call(&m, &call).await {
                        tracing::debug!(node = %m.id(), error = %e, "a member did not take a plan");
                    }
                }
            });
        }
        self.planner.wake.notify_one();
        Ok(reg.plan.view(self.plans.ttl()))
    }

    /// A plan another member passed on.
    pub fn take_plan(&self, spec: PlanSpec) -> Result<(), NodeError> {
        let reg = self.plans.register(spec).map_err(plans_error)?;
        // Passed on by its sender: not again from here.
        self.plans.sent(&reg.plan);
        self.planner.wake.notify_one();
        Ok(())
    }

    /// Drops a plan here and on every member up; whether this node held it.
    pub async fn drop_plan(self: &Arc<Self>, id: &str) -> bool {
        let held = self.plans.remove(id);
        let call = DropPlan { id: id.to_owned() };
        for m in self.cluster.others_up() {
            let _ = self.cluster.call(&m, &call).await;
        }
        held
    }

    /// A plan another member dropped.
    pub fn forget_plan(&self, id: &str) {
        self.plans.remove(id);
    }

    /// The plans this node holds, as they show.
    pub fn plans(&self) -> Vec<PlanView> {
        let ttl = self.plans.ttl();
        self.plans.all().iter().map(|p| p.view(ttl)).collect()
    }

    pub fn plan(&self, id: &str) -> Option<PlanView> {
        self.plans.get(id).map(|p| p.view(self.plans.ttl()))
    }

    /// A planned read of `key` was served here (`mark`: its `x-granary-plan`), from a
    /// committed entry or not; `bytes`: the object's bytes it reads, `[start, end)`.
    pub fn planned_read(&self, mark: &str, key: &str, bytes: Option<(u64, u64)>, origin: Origin) {
        tracing::debug!(mark, ?origin, "a planned read");
        if let Some(m) = PlanMark::parse(mark) {
            self.plans.note(&m, key, bytes, origin == Origin::Hit);
        }
    }

    /// At a plan's home: a member's report, answered with the plan's standing (`None`:
    /// no such plan here).
    pub fn plan_report(&self, call: PlanReport) -> Option<Standing> {
        let plan = self.plans.get(&call.report.id)?;
        Some(plan.merge(&call.from, call.report))
    }

    /// Counts a client's read that waits on the backend while it lives: the planner
    /// starts no fetch meanwhile.
    pub fn demand(&self) -> Demand {
        self.planner.demand.fetch_add(1, Ordering::AcqRel);
        self.waited_now();
        Demand(self.planner.demand.clone())
    }

    /// A client's read waits on the backend: on a fetch of the planner's (a read that
    /// joins it adds nothing to the backend's load, and counts as no demand), or on
    /// its own.
    pub(super) fn waited_now(&self) {
        *self.planner.waited.locked() = Some(Instant::now());
    }

    /// Whether a client's read waited on the backend within `span`.
    fn waited_within(&self, span: Duration) -> bool {
        self.planner
            .waited
            .locked()
            .is_some_and(|at| at.elapsed() < span)
    }

    /// Whether the planner is fetching `bucket/key`.
    pub(super) fn fetching_planned(&self, bucket: &str, key: &str) -> bool {
        self.planner
            .fetching
            .locked()
            .contains_key(&format!("{bucket}/{key}"))
    }

    /// Starts the planner's loop (within the runtime); it ends with the node.
    pub(super) fn start_planner(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut exchanged = Instant::now() - EXCHANGE_EVERY;
            loop {
                let wake = match weak.upgrade() {
                    Some(node) => node,
                    None => return,
                };
                tokio::select! {
                    _ = tokio::time::sleep(TICK) => {}
                    _ = wake.planner.wake.notified() => {}
                }
                let node = wake;
                for id in node.plans.expire() {
                    tracing::info!(plan = %id, "a plan expired: no progress for its ttl");
                }
                if node.plans.is_empty() {
                    continue;
                }
                if exchanged.elapsed() >= EXCHANGE_EVERY
                    && !node.planner.exchanging.swap(true, Ordering::AcqRel)
                {
                    exchanged = Instant::now();
                    let n = node.clone();
                    tokio::spawn(async move {
                        n.exchange().await;
                        n.planner.exchanging.store(false, Ordering::Release);
                    });
                }
                node.plan_step();
                node.prep_step();
            }
        });
    }

    /// One look at the plans that name a pipeline: the shard held here that is read
    /// soonest in its plan's epoch and whose members were not prepared ahead yet has
    /// them prepared now, one shard at a time (one prep thread at most, the others
    /// left to the jobs' reads), while what is kept leaves room (`room_ahead`).
    fn prep_step(self: &Arc<Self>) {
        let pipelines = self.transforms.pipelines();
        if self.planner.prepping.load(Ordering::Acquire)
            || !pipelines.room_ahead()
            || !self.plans.all().iter().any(|p| p.spec().pipeline.is_some())
        {
            return;
        }
        let mut due: Vec<(f64, String, Planned)> = self
            .planned_here()
            .into_iter()
            .filter(|p| p.due.is_finite() && p.due < p.reuse)
            .filter(|p| p.plan.spec().pipeline.is_some())
            .map(|p| {
                let spec = p.plan.spec();
                let id = format!("{}/{}/{}/{}", p.plan.id, spec.epoch, p.bucket, p.key);
                (p.due, id, p)
            })
            .collect();
        {
            let prepped = self.planner.prepped.locked();
            due.retain(|(_, id, p)| {
                !prepped.contains(id) && self.cache.holds(&p.bucket, &p.key).is_some()
            });
        }
        let Some((_, id, shard)) = due.into_iter().min_by(|a, b| a.0.total_cmp(&b.0)) else {
            return;
        };
        let spec = shard.plan.spec();
        let Some(pipeline) = spec.pipeline.as_deref().and_then(|n| self.pipeline(n).ok()) else {
            return;
        };
        {
            let mut prepped = self.planner.prepped.locked();
            // Old epochs' marks go in one sweep now and then.
            if prepped.len() >= 100_000 {
                prepped.clear();
            }
            prepped.insert(id);
        }
        self.planner.prepping.store(true, Ordering::Release);
        let node = self.clone();
        tokio::spawn(async move {
            let job = (spec.seed, spec.epoch);
            if let Err(e) = node
                .prepare_ahead(pipeline, job, &shard.bucket, &shard.key)
                .await
            {
                tracing::debug!(key = %shard.key, error = %e, "a shard's members were not prepared ahead");
            }
            node.planner.prepping.store(false, Ordering::Release);
        });
    }

    /// Prepares the members of shard `bucket/key` that `pipeline` takes, for `job`,
    /// ahead of their reads, in archive order, while there is room.
    async fn prepare_ahead(
        self: &Arc<Self>,
        pipeline: Arc<crate::transform::pipelines::NamedPipeline>,
        job: (u64, u64),
        bucket: &str,
        key: &str,
    ) -> Result<(), NodeError> {
        let (meta, idx) = self.shard_index(bucket, key).await?;
        let prep = self.prep_of(pipeline, job, bucket, key, &meta);
        for (name, m) in crate::archive::in_order(&idx) {
            if !prep.pipeline.pipeline.prepares(name) {
                continue;
            }
            if !self.transforms.pipelines().room_ahead() {
                break;
            }
            let mut it = super::Item::member(bucket, key, name, None);
            if idx.repeats(name) {
                it = it.at(m.offset);
            }
            self.prepare_member_ahead(&it, &prep).await?;
        }
        Ok(())
    }

    /// Reports each plan's progress noted here to its home, and learns its standing.
    async fn exchange(self: &Arc<Self>) {
        let mut needs = need_by_plan(&self.split_held().0);
        let backend_bytes = self.stats.get(Metric::BytesFromBackend);
        for plan in self.plans.all() {
            let need = needs.remove(&plan.id).unwrap_or_default();
            let report = plan.report(need, backend_bytes);
            let home = self.cluster.owner_of_hash(key_hash(HOME, &plan.id));
            if self.cluster.is_me(&home) {
                plan.merge(&self.id, report);
                continue;
            }
            let call = PlanReport {
                from: self.id.clone(),
                report,
            };
            match self.cluster.call(&home, &call).await {
                Ok(Some(standing)) => plan.learn(standing),
                // The home does not hold it (it restarted): give it the plan.
                Ok(None) => {
                    let share = SharePlan {
                        spec: (*plan.spec()).clone(),
                    };
                    let _ = self.cluster.call(&home, &share).await;
                }
                Err(e) => {
                    tracing::debug!(plan = %plan.id, error = %e, "no plan standing from its home")
                }
            }
        }
    }

    /// This node's shards in the plans, each with its earliest next use. Which of a
    /// plan's shards this node owns is worked out once per plan and owners (a member
    /// list, who is up), not per look: a look then walks this node's shards only.
    fn planned_here(&self) -> Vec<Planned> {
        let plans = self.plans.all();
        let owners = self.cluster.owners();
        let mut owned = self.planner.owned.locked();
        owned.retain(|id, _| plans.iter().any(|p| p.id == *id));
        planned(&plans, |plan, spec| {
            if let Some(o) = owned.get_mut(&plan.id) {
                if o.owners == owners && same_shards(&o.spec, spec) {
                    // The plan's next epoch is a new spec with the same list: kept, so
                    // that the next look compares pointers, not the lists again.
                    o.spec = spec.clone();
                    return o.shards.clone();
                }
            }
            let shards = owned_shards(spec, |kh| owners.is_mine(kh));
            owned.insert(
                plan.id.clone(),
                Owned {
                    owners: owners.clone(),
                    spec: spec.clone(),
                    shards: shards.clone(),
                },
            );
            shards
        })
    }

    /// This node's shards in the plans, by key, sorted.
    #[cfg(test)]
    pub(super) fn planned_keys_here(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.planned_here().into_iter().map(|p| p.key).collect();
        keys.sort();
        keys
    }

    /// What to do next: the earliest shard not in the cache, if it fits, or fits once
    /// planned entries needed later are dropped.
    /// This node's planned shards split into those not in the cache and those in it,
    /// each looked up once: a held one's `size` is its entry's.
    fn split_held(&self) -> (Vec<Planned>, Vec<Planned>) {
        split(self.planned_here(), |p| self.cache.holds(&p.bucket, &p.key))
    }

    fn next_step(&self, fetching: &HashMap<String, InFlight>) -> Option<Step> {
        let (wanted, held) = self.split_held();
        let (measured, one) = {
            let m = self.planner.meter.locked();
            (m.rate, m.one)
        };
        let look = Look {
            usage: self.cache.usage(),
            fetching,
            filling: &|bucket, key| self.cache.filling(bucket, key),
            measured,
            one,
            demand: self.planner.demand.load(Ordering::Acquire) > 0,
            waited: self.waited_within(BEHIND),
            standing: Standings::of(&self.plans.all()),
            members: self.cluster.others_up().len() + 1,
        };
        decide(&look, wanted, held)
    }

    /// Drops `victims` (where no read holds them) for `for_key`.
    fn drop_for(&self, victims: Vec<Planned>, for_key: &str) {
        for v in victims {
            if let Some(bytes) = self.cache.drop_if_unread(&v.bucket, &v.key) {
                v.plan.evicted(bytes);
                self.stats.add(Metric::BytesEvicted, bytes);
                tracing::debug!(key = %v.key, due_s = v.due, for_key, "dropped a planned entry needed later");
            }
        }
    }

    /// A client reads `bucket/key`: when it is a planned shard of this node's that is
    /// not in the cache, and the cache is full, the planned entries needed later than it
    /// make room, so that it is admitted rather than read through (and read again by
    /// the planner).
    pub(super) fn room_for_planned(&self, bucket: &str, key: &str) {
        if self.plans.is_empty() {
            return;
        }
        // Any planned shard fits beside what is there: nothing to drop, and no need to
        // rank the plans' shards on the read path.
        let u = self.cache.usage();
        if u.capacity.saturating_sub(u.used + u.reserved) >= self.plans.largest_shard()
            || self.cache.holds(bucket, key).is_some()
            || self.cache.filling(bucket, key)
        {
            return;
        }
        let (missing, held) = self.split_held();
        // Kept for its next epoch's read: worth a place only where that comes before
        // the next reads of the entries it would replace; else it is read through.
        let Some(mut target) = missing
            .into_iter()
            .find(|p| p.bucket == bucket && p.key == key)
        else {
            return;
        };
        target.due = target.reuse;
        if !target.due.is_finite() {
            return;
        }
        if let Some(victims) = room_for(&target, held, self.cache.usage()) {
            self.drop_for(victims, key);
        }
    }

    /// One look at the plans: starts a fetch when there is one to make.
    fn plan_step(self: &Arc<Self>) {
        if self.cache.usage().capacity == 0 {
            return;
        }
        let step = {
            let fetching = self.planner.fetching.locked();
            self.planner.meter.locked().look(
                !fetching.is_empty(),
                self.stats.get(Metric::BytesFromBackend),
                Instant::now(),
            );
            // The most there can be (`next_step` decides how many there should be).
            if fetching.len() >= 2 * FETCHES {
                return;
            }
            self.next_step(&fetching)
        };
        let (shard, streams) = match step {
            None => return,
            Some(Step::Fetch(s, n)) => (s, n),
            Some(Step::DropThenFetch(victims, s, n)) => {
                self.drop_for(victims, &s.key);
                (s, n)
            }
        };
        let id = format!("{}/{}", shard.bucket, shard.key);
        if self
            .planner
            .fetching
            .locked()
            .insert(
                id.clone(),
                InFlight {
                    size: shard.size,
                    streams,
                },
            )
            .is_some()
        {
            return;
        }
        tracing::debug!(key = %shard.key, due_s = shard.due, reuse_s = shard.reuse, streams, "a planned fetch starts");
        let node = self.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            match node.fetch_planned(&shard.bucket, &shard.key, streams).await {
                Ok(bytes) if bytes > 0 => {
                    shard.plan.fetched(bytes);
                    node.stats.add(Metric::BytesPlanned, bytes);
                    node.planner
                        .meter
                        .locked()
                        .fetched(bytes, started.elapsed(), streams);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(key = %shard.key, error = %e, "a planned fetch failed"),
            }
            node.planner.fetching.locked().remove(&id);
            node.planner.wake.notify_one();
        });
    }

    /// Brings one shard into this node's cache, over `streams` requests to the backend
    /// at once: the bytes it took from the backend.
    async fn fetch_planned(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        streams: usize,
    ) -> Result<u64, NodeError> {
        if self.cache.holds(bucket, key).is_some() {
            return Ok(0);
        }
        // Not through `read`: this is no client's read, and counts as no demand.
        // An object the cache cannot admit now is left for later, unread.
        let src = crate::backend::ranged::Ranged::new(self.backend.clone(), streams);
        let reply = match self
            .read_object_from(
                &src,
                &ReadRequest::object(bucket, key),
                crate::cache::Mode::StreamOrDecline,
            )
            .await
        {
            Err(NodeError::Cache(crate::cache::CacheError::NotAdmitted { .. })) => return Ok(0),
            r => r?,
        };
        let origin = reply.origin;
        // Counted as it starts, as the cache counts its miss: both in the same span.
        if origin == Origin::Miss {
            self.stats.add(Metric::PlannedFetches, 1);
        }
        let n = super::prefetch::drain(reply.body.into_stream()).await?;
        // The last byte read is not yet the commit: the shard is not looked for again
        // before its fill has ended.
        self.cache.fill_ended(bucket, key).await;
        Ok(if origin == Origin::Miss { n } else { 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    /// Shards still missing, fetched one after another at the backend's rate, start
    /// when the last one that can still arrive in time must; earlier would drop entries
    /// read meanwhile.
    #[test]
    fn a_fetch_starts_just_in_time() {
        // 1 MB/s; two shards of 1 MB read in 10 and 11 s: the second must start by 9 s
        // from now behind the first, the first by 8 s.
        let missing = [(MB, 10.0), (MB, 11.0)];
        let slack = 0.5;
        assert!(!due_now(&missing, 0, MB as f64, slack), "8 s to spare");
        // Read in 2.5 and 3 s: the first must start by 1 s, within slack and one fetch.
        assert!(due_now(&[(MB, 2.5), (MB, 3.0)], 0, MB as f64, slack));
        // A later shard that is due soon after pulls the first one's start earlier:
        // 1 + 1 + 1 s of fetching before 3.4 s.
        assert!(due_now(
            &[(MB, 9.0), (MB, 3.3), (MB, 3.4)],
            0,
            MB as f64,
            slack
        ));
        // Bytes in flight come first: 3 MB ahead of a shard read in 5 s.
        assert!(!due_now(&[(MB, 5.0)], 0, MB as f64, slack));
        assert!(due_now(&[(MB, 5.0)], 3 * MB, MB as f64, slack));
        // No rate known yet: now; nothing missing: never.
        assert!(due_now(&missing, 0, 0.0, slack));
        assert!(!due_now(&[], 0, MB as f64, slack));
    }

    #[test]
    fn the_rate_needed_is_the_steepest_of_the_shards_still_missing() {
        // 1 MB by 10 s, 2 MB by 11 s, 3 MB by 12 s: 0.25 MB/s would do.
        let missing = [(MB, 10.0), (MB, 11.0), (MB, 12.0)];
        assert!((need(&missing, 0) - 0.25 * MB as f64).abs() < 1.0);
        // 2 MB in flight ahead of them: 5 MB by 12 s.
        assert!((need(&missing, 2 * MB) - 5.0 / 12.0 * MB as f64).abs() < 1.0);
        // One read soon sets the pace: 1 MB in half a second.
        let soon = [(MB, 0.5), (MB, 11.0)];
        assert!((need(&soon, 0) - 2.0 * MB as f64).abs() < 1.0);
        assert_eq!(need(&[], 0), 0.0);
        // Late already: the first may wait less than nothing.
        assert!(spare(&[(4 * MB, 2.0)], 0, MB as f64).is_some_and(|s| s < 0.0));
        assert_eq!(spare(&[(MB, 2.0)], 0, 0.0), None, "no rate known");
    }

    /// Where the members together need more than the backend gives, a member's fetches
    /// are its part of the need; else none is set by need.
    #[test]
    fn where_the_backend_is_short_a_member_runs_its_part_of_the_fetches() {
        let fetching = HashMap::new();
        let filling = |_: &str, _: &str| false;
        let mut look = Look {
            usage: Usage {
                used: 0,
                reserved: 0,
                capacity: 0,
                objects: 0,
            },
            fetching: &fetching,
            filling: &filling,
            measured: 0.0,
            one: 0.0,
            demand: false,
            waited: false,
            standing: Standings {
                backend: 10.0 * MB as f64,
                need: crate::plans::Need::of([(60 * MB, 2.0)]),
            },
            members: 3,
        };
        // 20 MB by 2 s of the members' 60 MB by 2 s (30 MB/s, where the backend gives 10).
        let part = part_of_backend(&look, &[(20 * MB, 2.0)], 0).unwrap();
        assert!((part - 1.0 / 3.0).abs() < 1e-9, "{part}");
        // Of its own part of the backend, it counts on no more than it measured itself.
        assert_eq!(share_of_backend(&look, &[(20 * MB, 2.0)], 0), 0.0);
        look.measured = 20.0 * MB as f64;
        look.one = 5.0 * MB as f64;
        let share = share_of_backend(&look, &[(20 * MB, 2.0)], 0);
        assert!((share - 10.0 / 3.0 * MB as f64).abs() < 1.0, "{share}");
        // A backend with room for every need: nothing is split by need.
        look.standing.backend = 100.0 * MB as f64;
        assert_eq!(part_of_backend(&look, &[(20 * MB, 2.0)], 0), None);
        let share = share_of_backend(&look, &[(20 * MB, 2.0)], 0);
        assert!(
            (share - 10.0 * MB as f64).abs() < 1.0,
            "the measure caps: {share}"
        );
    }

    /// The meter measures only spans in which a fetch was in flight throughout.
    #[test]
    fn the_meter_counts_busy_spans_only() {
        let t0 = Instant::now();
        let mut m = Meter::default();
        m.look(true, 0, t0);
        m.look(true, 2 * MB, t0 + Duration::from_secs(1));
        assert_eq!(m.rate, 2.0 * MB as f64);
        // Idle: the span ends; bytes that came meanwhile (a client's read) do not count.
        m.look(false, 10 * MB, t0 + Duration::from_secs(2));
        m.look(true, 10 * MB, t0 + Duration::from_secs(3));
        m.look(true, 11 * MB, t0 + Duration::from_secs(4));
        assert_eq!(m.rate, 0.7 * 2.0 * MB as f64 + 0.3 * MB as f64);
        // A span shorter than the meter's is not measured yet.
        m.look(true, 20 * MB, t0 + Duration::from_millis(4100));
        assert_eq!(m.rate, 0.7 * 2.0 * MB as f64 + 0.3 * MB as f64);
    }

    /// A shard of the next epoch in place of an entry kept for it costs a fetch
    /// whenever it is made early: a member whose part of the members' need is small
    /// makes it when one of its own fetches would come just in time, not at that part.
    #[test]
    fn a_swap_for_the_next_epoch_waits_for_the_members_own_pace() {
        const SHARD: u64 = 64 << 20;
        let plans = crate::plans::Plans::new(Duration::from_secs(60));
        let plan = plans
            .register(crate::plans::test_spec(4, SHARD, 1))
            .unwrap()
            .plan;
        let shard = |i: usize, due: f64, reuse: f64| Planned {
            bucket: "b".into(),
            key: format!("p/{i}.tar"),
            size: SHARD,
            due,
            reuse,
            early: 0.0,
            plan: plan.clone(),
        };
        let held = || (1..4).map(|i| shard(i, 100.0, 100.0)).collect::<Vec<_>>();
        let filling = |_: &str, _: &str| false;
        let none = HashMap::new();
        // The backend gives 20 MB/s; the members need 66 MB/s, this one 3.4 (its
        // part, 1 MB/s, would take 67 s for the shard); its own fetches get 20 MB/s.
        let look = Look {
            usage: Usage {
                used: 3 * SHARD,
                reserved: 0,
                capacity: 3 * SHARD,
                objects: 3,
            },
            fetching: &none,
            filling: &filling,
            measured: 20.0 * MB as f64,
            one: 10.0 * MB as f64,
            demand: false,
            waited: false,
            standing: Standings {
                backend: 20.0 * MB as f64,
                need: crate::plans::Need::of([(2000 * MB, 30.0)]),
            },
            members: 3,
        };
        // Read in 20 s, fetched in 3.4: it waits (entries read meanwhile make room).
        let step = decide(&look, vec![shard(0, 20.0, 20.0)], held());
        assert!(step.is_none(), "the swap waits");
        // Read in 3 s: now.
        match decide(&look, vec![shard(0, 3.0, 3.0)], held()) {
            Some(Step::DropThenFetch(victims, s, _)) => {
                assert_eq!((victims.len(), s.key.as_str()), (1, "p/0.tar"))
            }
            _ => panic!("a swap that can wait no longer"),
        }
    }

    /// A shard read in ranges takes the requests; one that must drop entries to fit
    /// waits for the fetch in flight rather than hold a second room.
    #[test]
    fn a_large_shard_takes_the_requests_and_one_room() {
        const SHARD: u64 = 64 << 20;
        let plans = crate::plans::Plans::new(Duration::from_secs(60));
        let spec = crate::plans::test_spec(4, SHARD, 1);
        let plan = plans.register(spec).unwrap().plan;
        let shard = |i: usize, size: u64, due: f64, reuse: f64| Planned {
            bucket: "b".into(),
            key: format!("p/{i}.tar"),
            size,
            due,
            reuse,
            early: 0.0,
            plan: plan.clone(),
        };
        // A full cache of three shards read already (next needed in the next epoch).
        let held = || {
            (1..4)
                .map(|i| shard(i, SHARD, 100.0, 100.0))
                .collect::<Vec<_>>()
        };
        let full = Usage {
            used: 3 * SHARD,
            reserved: 0,
            capacity: 3 * SHARD,
            objects: 3,
        };
        let filling = |_: &str, _: &str| false;
        let none = HashMap::new();
        let look = |fetching| Look {
            usage: full,
            fetching,
            filling: &filling,
            measured: 0.0,
            one: 0.0,
            demand: false,
            waited: false,
            standing: Standings::default(),
            members: 1,
        };
        // Nothing in flight: the shard, over every request the count allows (two
        // before one was timed), for the room of the entry needed last.
        match decide(&look(&none), vec![shard(0, SHARD, 1.0, 50.0)], held()) {
            Some(Step::DropThenFetch(victims, s, streams)) => {
                assert_eq!(
                    (victims.len(), s.key.as_str(), streams),
                    (1, "p/0.tar", FETCHES)
                );
            }
            _ => panic!("a fetch, dropping one entry"),
        }
        // Another shard in flight over one request: this one waits, though a request
        // is left, rather than hold a second room.
        let in_flight = |streams| {
            HashMap::from([(
                "b/p/9.tar".to_owned(),
                InFlight {
                    size: SHARD,
                    streams,
                },
            )])
        };
        let one_in_flight = in_flight(1);
        let step = decide(
            &look(&one_in_flight),
            vec![shard(0, SHARD, 1.0, 50.0)],
            held(),
        );
        assert!(step.is_none(), "waits for the fetch in flight");
        // A shard smaller than two ranges goes beside it, over one request.
        match decide(
            &look(&one_in_flight),
            vec![shard(0, 4 << 20, 1.0, 50.0)],
            held(),
        ) {
            Some(Step::DropThenFetch(_, _, streams)) => assert_eq!(streams, 1),
            _ => panic!("a small shard's fetch"),
        }
        // Every request taken: nothing more.
        let every = in_flight(FETCHES);
        let step = decide(&look(&every), vec![shard(0, SHARD, 1.0, 50.0)], held());
        assert!(step.is_none());
    }

    /// A shard read to its end in this epoch, with every rank past it, is done until
    /// the next epoch: its next use is the next epoch's, where the reads' lag alone
    /// would hold it in use (each of R ranks holding its last `lag` places).
    #[test]
    fn a_shard_read_to_its_end_is_done_once_every_rank_is_past_it() {
        let plans = crate::plans::Plans::new(Duration::from_secs(60));
        let mut spec = crate::plans::test_spec(4, 100, 1);
        spec.batch_size = 8;
        spec.shards[0].end = Some(90);
        let plan = plans.register(spec.clone()).unwrap().plan;
        let id = plan.id.clone();
        let (schedule, ..) = plan.position();
        // The shard read first; the place its last sample is read at is 9.
        let first = (0..4)
            .min_by_key(|&i| schedule.next_use(i, 0, 0).unwrap())
            .unwrap();
        assert!(!schedule.past(first, 9) && schedule.past(first, 10));
        let key = spec.shards[first].key.clone();
        let end = spec.shards[first].read_end().unwrap();
        let due = |place: u64, bytes: Option<(u64, u64)>| {
            let mark = granary_proto::plan::PlanMark {
                plan: id.clone(),
                epoch: 0,
                rank: 0,
                place,
            };
            plans.note(&mark, &key, bytes, true);
            let all = planned(&plans.all(), |_, s| (0..s.shards.len()).collect());
            let p = all.into_iter().find(|p| p.key == key).unwrap();
            (p.due, p.reuse)
        };
        // Half its bytes read, the rank at its last place: in use.
        assert_eq!(due(9, Some((0, end / 2))).0, 0.0);
        // All of them: in use while the rank is at it...
        assert_eq!(due(9, Some((end / 2, end))).0, 0.0);
        // ...done once past it, though a read may come 16 places behind (two batches).
        let (d, reuse) = due(10, None);
        assert!(d > 0.0 && d.is_finite() && d == reuse, "{d} {reuse}");
        // The same place without its bytes read: the lag holds it in use.
        let mut other = spec.clone();
        other.job = Some("other".into());
        let other = plans.register(other).unwrap().plan;
        let mark = granary_proto::plan::PlanMark {
            plan: other.id.clone(),
            epoch: 0,
            rank: 0,
            place: 10,
        };
        plans.note(&mark, &key, None, true);
        let all = planned(&[other], |_, s| (0..s.shards.len()).collect());
        assert_eq!(all.iter().find(|p| p.key == key).unwrap().due, 0.0);
    }
}
