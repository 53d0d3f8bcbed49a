//! The plans a node holds: jobs' epoch plans, registered with the cluster, and how far
//! their ranks have read. No I/O here: the node's planner (`node::planner`) fetches and
//! drops by them, and exchanges their progress with the other members.
//!
//! Progress comes from the reads themselves: a planned read carries
//! `x-granary-plan: PLAN:EPOCH:RANK:PLACE`, and the node that serves it notes the rank's
//! place. About once a second each member sends what it noted since, per plan, to the
//! plan's home (the plan's owner on the ring), which keeps the furthest place of each
//! rank and answers with the plan's standing: the slowest rank's place and the measured
//! rate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sync::Locked;
use granary_proto::plan::{PlanError, PlanMark, PlanSpec, PlanView, Schedule};
use serde::{Deserialize, Serialize};

/// How long a plan is kept without a sign of progress, unless configured.
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);
/// The shortest span a plan's rate, and the backend's throughput, are measured over: a
/// span holds a report from every member (they report every second), and no more than
/// a report or two, so that a change of pace shows within two spans.
const RATE_SPAN: Duration = Duration::from_millis(1500);
/// How long a member's need counts at the home without a new report: three missed
/// reports (members report every second; one that stops, stopped).
const FRESH: Duration = Duration::from_secs(3);
/// Most shards a plan may name.
pub const MAX_SHARDS: usize = 1 << 20;
/// Most plans a node holds.
pub const MAX_PLANS: usize = 256;
/// How often a plan's registration is passed on again to every member, while its job
/// keeps registering it (so that a member that restarted learns it).
pub const RESEND_EVERY: Duration = Duration::from_secs(30);

thread_local! {
    /// A simulation's clock on this thread (`None`: the real one).
    static SIMULATED: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// Now, on the clock plans keep time by: the real one, or a simulation's
/// ([`set_simulated_now`]), so that the planner can be driven at scale with no waiting.
pub fn now() -> Instant {
    SIMULATED.with(|c| c.get()).unwrap_or_else(Instant::now)
}

/// Time since `t`, on the plans' clock.
pub fn since(t: Instant) -> Duration {
    now().saturating_duration_since(t)
}

/// Sets this thread's plans' clock (a simulation's; `None`: the real one again).
pub fn set_simulated_now(t: Option<Instant>) {
    SIMULATED.with(|c| c.set(t));
}

/// Why a plan was refused.
#[derive(Debug, thiserror::Error)]
pub enum PlansError {
    #[error("the plan names no bucket")]
    NoBucket,
    #[error("the plan names {0} shards, more than the {MAX_SHARDS} a plan may")]
    TooLarge(usize),
    #[error("this node holds {MAX_PLANS} plans already; drop one or wait for one to expire")]
    Full,
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// The deadlines, in seconds from now, by which [`Need`] counts bytes: doubling from
/// a second to about two minutes. Eight numbers a report; a shard needed later than the
/// last one is no load on the backend yet. The first deadline is the exchange's own
/// period (a need reported is a second old when the members act on it), and doubling
/// keeps the steepest rate within a factor of two of the exact one.
pub const NEED_BY: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// Bytes still to come from the backend, by deadline: `bytes[i]` are needed later than
/// `NEED_BY[i - 1]` seconds from now and by `NEED_BY[i]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Need {
    pub bytes: Vec<u64>,
}

impl Need {
    /// The need of shards still missing: `(size, seconds to its read)`.
    pub fn of(missing: impl IntoIterator<Item = (u64, f64)>) -> Need {
        let mut bytes = vec![0u64; NEED_BY.len()];
        for (size, due) in missing {
            if let Some(i) = NEED_BY.iter().position(|&by| due <= by) {
                bytes[i] += size;
            }
        }
        Need { bytes }
    }

    pub fn add(&mut self, o: &Need) {
        if self.bytes.len() < o.bytes.len() {
            self.bytes.resize(o.bytes.len(), 0);
        }
        for (a, b) in self.bytes.iter_mut().zip(&o.bytes) {
            *a += b;
        }
    }

    /// The rate, in bytes per second, that brings every byte in by its deadline: the
    /// steepest of the bytes due by each deadline over it.
    pub fn rate(&self) -> f64 {
        let mut sum = 0.0;
        let mut most = 0.0f64;
        for (b, by) in self.bytes.iter().zip(NEED_BY) {
            sum += *b as f64;
            most = most.max(sum / by);
        }
        most
    }
}

/// A member's note of a plan's progress, sent to the plan's home.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    pub id: String,
    pub epoch: u64,
    /// Ranks' furthest places noted by this member in `epoch`.
    pub ranks: Vec<(u32, u64)>,
    /// This member's counts for the plan, since it has held it.
    pub counts: Counts,
    /// Milliseconds since this member last saw the plan used (a read or a registration).
    pub idle_ms: u64,
    /// The bytes of this plan's shards that this member owns and has still to bring
    /// from the backend, by deadline (a shard two plans read counts for the one that
    /// reads it first).
    #[serde(default)]
    pub need: Need,
    /// The member's bytes from the backend since it started, whatever asked for them:
    /// the home sums them over the members into the backend's throughput.
    #[serde(default)]
    pub backend_bytes: u64,
    /// The most places a read served here came behind its rank's furthest place noted
    /// here, in this epoch or the last ([`Plan::lag`]).
    #[serde(default)]
    pub lag: u64,
}

/// A plan's counters on one member, or summed over the cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub fetched_bytes: u64,
    pub evicted_bytes: u64,
    pub reads_ready: u64,
    pub reads_waited: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.fetched_bytes += o.fetched_bytes;
        self.evicted_bytes += o.evicted_bytes;
        self.reads_ready += o.reads_ready;
        self.reads_waited += o.reads_waited;
    }
}

/// The plan's standing as its home sums it up.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Standing {
    pub epoch: u64,
    /// The slowest rank's place (0 until every rank has been seen).
    pub place: u64,
    /// Samples all ranks have reached together.
    pub consumed: u64,
    /// Places per second per rank.
    pub rate: f64,
    /// The pace the ranks read at when no read waits: the fastest span's rate,
    /// forgotten slowly. The planner times its fetches by it, so that a job slowed by
    /// reads that waited does not make the planner later still.
    #[serde(default)]
    pub pace: f64,
    pub counts: Counts,
    pub idle_ms: u64,
    /// The members' need for the backend, summed ([`Report::need`]).
    #[serde(default)]
    pub need: Need,
    /// The backend's throughput for the whole cluster, bytes per second (0: not
    /// measured yet): what the members' needs divide among them.
    #[serde(default)]
    pub backend: f64,
    /// The most places the members' reads came behind their ranks' furthest places
    /// ([`Report::lag`]).
    #[serde(default)]
    pub lag: u64,
}

impl BackendMeter {
    /// Member `from` reports `bytes` from the backend since it started; the cluster
    /// needs `need` bytes per second of it. Over spans of [`RATE_SPAN`], the bytes all
    /// members brought are the backend's throughput; it is its capacity only where the
    /// members needed more than they got (else a lower bound, kept when above the last
    /// measure). Answers the throughput known (`old` until a span ends).
    fn add(&mut self, from: &str, bytes: u64, need: f64, old: f64, now: Instant) -> f64 {
        // A member that restarted counts from 0 again: its first report adds nothing.
        if let Some(prev) = self.last.insert(from.to_owned(), bytes) {
            self.bytes += bytes.saturating_sub(prev);
        }
        let since = *self.since.get_or_insert(now);
        let span = now.duration_since(since);
        if span < RATE_SPAN {
            return old;
        }
        let r = self.bytes as f64 / span.as_secs_f64();
        self.bytes = 0;
        self.since = Some(now);
        if need > r && old > 0.0 {
            // Saturated: the throughput is what the backend gives.
            0.5 * old + 0.5 * r
        } else {
            old.max(r)
        }
    }
}

/// One plan on this node.
pub struct Plan {
    pub id: String,
    state: Mutex<State>,
    fetched: AtomicU64,
    evicted: AtomicU64,
    ready: AtomicU64,
    waited: AtomicU64,
}

struct State {
    spec: Arc<PlanSpec>,
    schedule: Arc<Schedule>,
    /// When the registration was last passed on to every member.
    sent: Option<Instant>,
    /// When this node last saw the plan used: registered, read, or used elsewhere as
    /// the home says.
    used: Instant,
    /// Ranks' furthest places in the current epoch, noted here.
    noted: HashMap<u32, u64>,
    /// The most places a read noted here came behind its rank's furthest place: in
    /// this epoch, and in the last.
    lag: (u64, u64),
    /// The epoch of each shard's last planned read noted here, by key (keys under the
    /// dataset's prefix, no more than the plan has shards).
    last_read: HashMap<String, u64>,
    /// The bytes of each shard read here in the current epoch, by key (as `last_read`).
    covered: HashMap<String, Covered>,
    /// At the home: each member's last report.
    reports: HashMap<String, (Instant, Report)>,
    /// The standing last learned (from the home, or made here at the home).
    standing: Standing,
    /// The slowest place and when it was seen, for the rate: counted from the plan's
    /// first epoch (epochs times samples per rank, plus the place), so that the rate
    /// runs on across epochs.
    last_place: Option<(u64, Instant)>,
    /// When the standing was made (at the home) or learned (elsewhere).
    stood: Instant,
    /// At the home: the backend's bytes counted since `since`, summed over the members'
    /// reports, and each member's counter as last reported.
    backend: BackendMeter,
}

/// The backend's throughput for the whole cluster, as the home measures it from the
/// members' counters.
#[derive(Default)]
struct BackendMeter {
    last: HashMap<String, u64>,
    bytes: u64,
    since: Option<Instant>,
}

impl Plan {
    fn new(spec: PlanSpec, schedule: Schedule) -> Plan {
        let epoch = spec.epoch;
        Plan {
            id: spec.id(),
            state: Mutex::new(State {
                spec: Arc::new(spec),
                schedule: Arc::new(schedule),
                sent: None,
                used: now(),
                noted: HashMap::new(),
                lag: (0, 0),
                last_read: HashMap::new(),
                covered: HashMap::new(),
                reports: HashMap::new(),
                standing: Standing {
                    epoch,
                    ..Standing::default()
                },
                last_place: None,
                stood: now(),
                backend: BackendMeter::default(),
            }),
            fetched: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            ready: AtomicU64::new(0),
            waited: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    pub fn spec(&self) -> Arc<PlanSpec> {
        self.lock().spec.clone()
    }

    /// The plan's schedule, where its slowest rank stands in it (in places), the pace
    /// its ranks read at (places per second), and how old the standing is.
    /// How far behind its rank's furthest place a read may come: the most measured
    /// here or by any member (in this epoch or the last). A rank's reads do not come in
    /// order: a DataLoader's workers each read their batches, and a dataset reads
    /// ahead, so a shard is still read well after a later place was.
    pub fn lag(&self) -> u64 {
        let st = self.lock();
        st.lag.0.max(st.lag.1).max(st.standing.lag)
    }

    pub fn position(&self) -> (Arc<Schedule>, u64, f64, Duration) {
        let st = self.lock();
        // The standing of another epoch says nothing of this one.
        let mut place = if st.standing.epoch == st.schedule.epoch {
            st.standing.place
        } else {
            0
        };
        // Ranks noted here may be ahead of the last standing.
        if st.noted.len() >= st.spec.world_size {
            if let Some(&min) = st.noted.values().min() {
                place = place.max(min);
            }
        }
        (
            st.schedule.clone(),
            place,
            st.standing.pace,
            since(st.stood),
        )
    }

    pub fn fetched(&self, bytes: u64) {
        self.fetched.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn evicted(&self, bytes: u64) {
        self.evicted.fetch_add(bytes, Ordering::Relaxed);
    }

    fn counts(&self) -> Counts {
        Counts {
            fetched_bytes: self.fetched.load(Ordering::Relaxed),
            evicted_bytes: self.evicted.load(Ordering::Relaxed),
            reads_ready: self.ready.load(Ordering::Relaxed),
            reads_waited: self.waited.load(Ordering::Relaxed),
        }
    }

    /// Moves the plan to `epoch` (a rank reads it): the next epoch's order is the
    /// plan's own, with no resume history.
    fn advance(st: &mut State, epoch: u64) {
        if epoch <= st.spec.epoch {
            return;
        }
        let mut spec = (*st.spec).clone();
        spec.epoch = epoch;
        spec.rounds.clear();
        if let Ok(s) = Schedule::of(&spec) {
            st.spec = Arc::new(spec);
            st.schedule = Arc::new(s);
            st.noted.clear();
            st.covered.clear();
            st.lag = (0, st.lag.0);
        }
    }

    /// Per key, how far from its start the reads served here in the current epoch
    /// cover it without a gap.
    pub fn covered(&self) -> HashMap<String, u64> {
        let st = self.lock();
        st.covered
            .iter()
            .map(|(k, c)| (k.clone(), c.prefix()))
            .collect()
    }

    /// Whether `key` was read here in an earlier epoch and not yet in this one: its
    /// read of this epoch is still to come, wherever the ranks' places stand.
    pub fn unread_here(&self, key: &str) -> bool {
        let st = self.lock();
        st.last_read
            .get(key)
            .is_some_and(|&e| e < st.schedule.epoch)
    }

    /// This node's report to the plan's home: with its `need` for this plan's shards,
    /// and its `backend_bytes` so far.
    pub fn report(&self, need: Need, backend_bytes: u64) -> Report {
        let st = self.lock();
        Report {
            id: self.id.clone(),
            epoch: st.spec.epoch,
            ranks: st.noted.iter().map(|(&r, &p)| (r, p)).collect(),
            counts: self.counts(),
            idle_ms: since(st.used).as_millis() as u64,
            need,
            backend_bytes,
            lag: st.lag.0.max(st.lag.1),
        }
    }

    /// The standing last made or learned.
    pub fn standing(&self) -> Standing {
        self.lock().standing.clone()
    }

    /// At the home: takes member `from`'s report and answers with the standing.
    pub fn merge(&self, from: &str, report: Report) -> Standing {
        let mut st = self.lock();
        Plan::advance(&mut st, report.epoch);
        let report_backend = report.backend_bytes;
        st.reports.insert(from.to_owned(), (now(), report));
        // Reports from members not heard for a while are stale.
        st.reports
            .retain(|_, (at, _)| since(*at) < Duration::from_secs(10));
        let epoch = st.spec.epoch;
        let mut ranks: HashMap<u32, u64> = HashMap::new();
        let mut counts = Counts::default();
        let mut idle = u64::MAX;
        let mut need = Need::default();
        let mut lag = 0;
        for (at, r) in st.reports.values() {
            counts.add(&r.counts);
            if since(*at) < FRESH {
                need.add(&r.need);
            }
            lag = lag.max(r.lag);
            idle = idle.min(r.idle_ms);
            if r.epoch == epoch {
                for &(rank, place) in &r.ranks {
                    let p = ranks.entry(rank).or_default();
                    *p = (*p).max(place);
                }
            }
        }
        let world = st.spec.world_size.max(1);
        let place = if ranks.len() >= world {
            ranks.values().copied().min().unwrap_or(0)
        } else {
            0
        };
        let consumed = ranks.values().sum::<u64>();
        let now = now();
        // Over spans of a couple of reports: the ranks' reads come in runs, and stand
        // still at an epoch's end while the job eats what it has read.
        let at_all = epoch * st.schedule.per_rank + place;
        let mut pace = st.standing.pace;
        let rate = match st.last_place {
            Some((p, at)) if at_all > p && now.duration_since(at) >= RATE_SPAN => {
                let r = (at_all - p) as f64 / now.duration_since(at).as_secs_f64();
                st.last_place = Some((at_all, now));
                pace = if r > pace { r } else { 0.9 * pace + 0.1 * r };
                if st.standing.rate > 0.0 {
                    0.5 * st.standing.rate + 0.5 * r
                } else {
                    r
                }
            }
            // Back to an earlier place (a job resumed from a checkpoint): from here.
            Some((p, _)) if at_all < p => {
                st.last_place = Some((at_all, now));
                st.standing.rate
            }
            Some(_) => st.standing.rate,
            None => {
                st.last_place = Some((at_all, now));
                st.standing.rate
            }
        };
        if idle < since(st.used).as_millis() as u64 {
            st.used = now - Duration::from_millis(idle);
        }
        let old = st.standing.backend;
        let backend = st.backend.add(from, report_backend, need.rate(), old, now);
        st.stood = now;
        st.standing = Standing {
            epoch,
            place,
            consumed,
            rate,
            pace,
            counts,
            idle_ms: since(st.used).as_millis() as u64,
            need,
            backend,
            lag,
        };
        st.standing.clone()
    }

    /// Away from the home: the standing the home answered.
    pub fn learn(&self, standing: Standing) {
        let mut st = self.lock();
        Plan::advance(&mut st, standing.epoch);
        let used = now() - Duration::from_millis(standing.idle_ms);
        if used > st.used {
            st.used = used;
        }
        st.standing = standing;
        st.stood = now();
    }

    /// How the plan shows: its spec, the standing, and `ttl` less its idle time.
    pub fn view(&self, ttl: Duration) -> PlanView {
        let st = self.lock();
        let spec = &st.spec;
        let counts = if st.reports.is_empty() {
            // Away from the home: the cluster's counts as last learned.
            let mut c = st.standing.counts;
            if c == Counts::default() {
                c = self.counts();
            }
            c
        } else {
            st.standing.counts
        };
        PlanView {
            id: self.id.clone(),
            job: spec.job.clone(),
            pipeline: spec.pipeline.clone(),
            bucket: spec.bucket.clone(),
            prefix: spec.prefix.clone(),
            epoch: spec.epoch,
            world_size: spec.world_size,
            shards: spec.shards.len(),
            per_rank: st.schedule.per_rank,
            consumed: st.standing.consumed,
            place: st.standing.place,
            rate: st.standing.rate,
            fetched_bytes: counts.fetched_bytes,
            evicted_bytes: counts.evicted_bytes,
            reads_ready: counts.reads_ready,
            reads_waited: counts.reads_waited,
            expires_in_s: ttl.saturating_sub(since(st.used)).as_secs_f64(),
        }
    }
}

/// The plans this node holds.
pub struct Plans {
    map: Mutex<HashMap<String, Arc<Plan>>>,
    ttl_ms: AtomicU64,
    /// How many plans the map holds, read without its lock (every object read asks).
    held: std::sync::atomic::AtomicUsize,
    /// The largest shard any plan registered here has named (never lowered).
    largest: AtomicU64,
}

/// What a registration did.
pub struct Registered {
    pub plan: Arc<Plan>,
    /// The plan is new here, or at a new epoch or round, or due to be passed on again.
    pub pass_on: bool,
}

impl Plans {
    pub fn new(ttl: Duration) -> Plans {
        Plans {
            map: Mutex::new(HashMap::new()),
            ttl_ms: AtomicU64::new(ttl.as_millis() as u64),
            held: Default::default(),
            largest: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Plan>>> {
        self.map.locked()
    }

    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.load(Ordering::Relaxed))
    }

    pub fn set_ttl(&self, ttl: Duration) {
        self.ttl_ms.store(ttl.as_millis() as u64, Ordering::Relaxed);
    }

    /// Registers `spec` (new, or the next epoch or round of a plan held).
    pub fn register(&self, spec: PlanSpec) -> Result<Registered, PlansError> {
        if spec.bucket.is_empty() {
            return Err(PlansError::NoBucket);
        }
        if spec.shards.len() > MAX_SHARDS {
            return Err(PlansError::TooLarge(spec.shards.len()));
        }
        let id = spec.id();
        let largest = spec.shards.iter().map(|s| s.size).max().unwrap_or(0);
        self.largest.fetch_max(largest, Ordering::Relaxed);
        let held = self.lock().get(&id).cloned();
        if let Some(plan) = held {
            let mut st = plan.lock();
            st.used = now();
            let news = st.spec.version() != spec.version();
            if news {
                let schedule = Schedule::of(&spec)?;
                st.spec = Arc::new(spec);
                st.schedule = Arc::new(schedule);
                st.noted.clear();
                st.covered.clear();
            }
            let due = st.sent.is_none_or(|t| since(t) >= RESEND_EVERY);
            drop(st);
            return Ok(Registered {
                plan,
                pass_on: news || due,
            });
        }
        let schedule = Schedule::of(&spec)?;
        let mut map = self.lock();
        if map.len() >= MAX_PLANS && !map.contains_key(&id) {
            return Err(PlansError::Full);
        }
        let plan = map
            .entry(id)
            .or_insert_with(|| Arc::new(Plan::new(spec, schedule)))
            .clone();
        self.held.store(map.len(), Ordering::Release);
        Ok(Registered {
            plan,
            pass_on: true,
        })
    }

    /// The registration was passed on to every member now.
    pub fn sent(&self, plan: &Plan) {
        plan.lock().sent = Some(now());
    }

    pub fn get(&self, id: &str) -> Option<Arc<Plan>> {
        self.lock().get(id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Plan>> {
        let mut v: Vec<_> = self.lock().values().cloned().collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    pub fn len(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The largest shard any plan registered here has named.
    pub fn largest_shard(&self) -> u64 {
        self.largest.load(Ordering::Relaxed)
    }

    /// Whether a plan held here reads `bucket/key`'s dataset (its bucket and prefix).
    pub fn covers(&self, bucket: &str, key: &str) -> bool {
        if self.is_empty() {
            return false;
        }
        self.lock().values().any(|p| {
            let st = p.lock();
            st.spec.bucket == bucket && key.starts_with(&st.spec.prefix)
        })
    }

    /// The plans held here that read `bucket/key` in `epoch` with `seed`, prepared by
    /// `pipeline`: the jobs a sample prepared for them is kept for.
    pub fn readers(&self, bucket: &str, key: &str, seed: u64, epoch: u64, pipeline: &str) -> usize {
        if self.is_empty() {
            return 0;
        }
        self.lock()
            .values()
            .filter(|p| {
                let st = p.lock();
                let s = &st.spec;
                s.bucket == bucket
                    && s.seed == seed
                    && s.epoch == epoch
                    && s.pipeline.as_deref() == Some(pipeline)
                    && s.shards.iter().any(|sh| sh.key == key)
            })
            .count()
    }

    pub fn remove(&self, id: &str) -> bool {
        let mut map = self.lock();
        let gone = map.remove(id).is_some();
        self.held.store(map.len(), Ordering::Release);
        gone
    }

    /// Drops the plans unused for longer than the TTL; their ids.
    pub fn expire(&self) -> Vec<String> {
        let mut gone = Vec::new();
        let ttl = self.ttl();
        let mut map = self.lock();
        map.retain(|id, p| {
            let keep = since(p.lock().used) < ttl;
            if !keep {
                gone.push(id.clone());
            }
            keep
        });
        self.held.store(map.len(), Ordering::Release);
        gone
    }

    /// A planned read was served here: notes the rank's place, the bytes of the object
    /// read (`bytes`, `[start, end)`; `None` for a member's or a prepared read), and
    /// whether the read found its object committed (`ready`). Marks of plans not held
    /// are ignored.
    pub fn note(&self, mark: &PlanMark, key: &str, bytes: Option<(u64, u64)>, ready: bool) {
        let Some(plan) = self.get(&mark.plan) else {
            return;
        };
        if ready {
            plan.ready.fetch_add(1, Ordering::Relaxed);
        } else {
            plan.waited.fetch_add(1, Ordering::Relaxed);
        }
        let mut st = plan.lock();
        Plan::advance(&mut st, mark.epoch);
        st.used = now();
        if mark.epoch == st.spec.epoch {
            let p = st.noted.entry(mark.rank).or_default();
            let behind = p.saturating_sub(mark.place);
            *p = (*p).max(mark.place);
            st.lag.0 = st.lag.0.max(behind);
        }
        // On the read path: no search of the plan's shards. A key under the dataset's
        // prefix, at most as many as the plan has shards.
        if let Some(e) = st.last_read.get_mut(key) {
            *e = (*e).max(mark.epoch);
        } else if key.starts_with(&st.spec.prefix) && st.last_read.len() < st.spec.shards.len() {
            st.last_read.insert(key.to_owned(), mark.epoch);
        }
        if let (Some((start, end)), true) = (bytes, mark.epoch == st.spec.epoch) {
            if let Some(c) = st.covered.get_mut(key) {
                c.add(start, end);
            } else if st.last_read.contains_key(key) {
                let mut c = Covered::default();
                c.add(start, end);
                st.covered.insert(key.to_owned(), c);
            }
        }
    }
}

/// The bytes of an object read in an epoch: disjoint ranges `[start, end)`, in order,
/// those that touch merged. At most [`Covered::MOST`] ranges: a range apart from them
/// all past that is not kept (the object then never reads as covered, which only keeps
/// it longer).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Covered(Vec<(u64, u64)>);

impl Covered {
    const MOST: usize = 1024;

    fn add(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        // The first range that ends at or after `start`, and those that the new one
        // reaches: merged into one.
        let i = self.0.partition_point(|r| r.1 < start);
        let (mut s, mut e, mut j) = (start, end, i);
        while j < self.0.len() && self.0[j].0 <= e {
            s = s.min(self.0[j].0);
            e = e.max(self.0[j].1);
            j += 1;
        }
        if i == j && self.0.len() >= Self::MOST {
            return;
        }
        self.0.splice(i..j, [(s, e)]);
    }

    /// How far from 0 the ranges cover without a gap.
    fn prefix(&self) -> u64 {
        self.0.first().filter(|r| r.0 == 0).map_or(0, |r| r.1)
    }
}

/// A plan of `shards` shards `b/p/N.tar` of `size` bytes and 10 samples each, read by
/// `world` ranks, for tests.
#[cfg(test)]
pub(crate) fn test_spec(shards: usize, size: u64, world: usize) -> PlanSpec {
    PlanSpec {
        bucket: "b".into(),
        prefix: "p/".into(),
        shards: (0..shards)
            .map(|i| granary_proto::plan::PlanShard {
                key: format!("p/{i}.tar"),
                etag: "e".into(),
                samples: 10,
                size,
                end: None,
            })
            .collect(),
        seed: 1,
        epoch: 0,
        world_size: world,
        shuffle_buffer: 0,
        shuffle_shards: true,
        drop_last: false,
        batch_size: 1,
        rounds: vec![],
        job: None,
        pipeline: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(world: usize) -> PlanSpec {
        test_spec(4, 100, world)
    }

    fn mark(id: &str, epoch: u64, rank: u32, place: u64) -> PlanMark {
        PlanMark {
            plan: id.into(),
            epoch,
            rank,
            place,
        }
    }

    #[test]
    fn registering_again_passes_on_only_news() {
        let plans = Plans::new(Duration::from_secs(60));
        let r = plans.register(spec(2)).unwrap();
        assert!(r.pass_on);
        plans.sent(&r.plan);
        assert!(!plans.register(spec(2)).unwrap().pass_on);
        let mut next = spec(2);
        next.epoch = 1;
        let r2 = plans.register(next).unwrap();
        assert!(r2.pass_on);
        assert_eq!(r2.plan.id, r.plan.id);
        assert_eq!(plans.len(), 1);
        assert!(matches!(
            plans.register(PlanSpec {
                bucket: String::new(),
                ..spec(1)
            }),
            Err(PlansError::NoBucket)
        ));
    }

    #[test]
    fn a_plan_covers_its_datasets_keys_only() {
        let plans = Plans::new(Duration::from_secs(60));
        assert!(!plans.covers("b", "p/0.tar"), "no plan yet");
        let id = plans.register(spec(1)).unwrap().plan.id.clone();
        assert!(plans.covers("b", "p/0.tar"));
        assert!(plans.covers("b", "p/later/9.tar"), "under the prefix");
        assert!(!plans.covers("b", "q/0.tar"), "another prefix");
        assert!(!plans.covers("c", "p/0.tar"), "another bucket");
        assert!(plans.remove(&id));
        assert!(!plans.covers("b", "p/0.tar"), "dropped");
    }

    #[test]
    fn the_home_sums_members_reports_into_the_slowest_ranks_place() {
        let plans = Plans::new(Duration::from_secs(60));
        let plan = plans.register(spec(2)).unwrap().plan;
        let id = plan.id.clone();
        plans.note(&mark(&id, 0, 0, 7), "p/0.tar", None, true);
        plans.note(&mark(&id, 0, 0, 5), "p/0.tar", None, false);
        // One rank seen: the slowest place is not known yet.
        let s = plan.merge("a", plan.report(Need::default(), 0));
        assert_eq!((s.place, s.consumed), (0, 7));
        assert_eq!((s.counts.reads_ready, s.counts.reads_waited), (1, 1));
        // Another member saw rank 1.
        let other = Report {
            id: id.clone(),
            epoch: 0,
            ranks: vec![(1, 4)],
            counts: Counts {
                fetched_bytes: 100,
                ..Counts::default()
            },
            idle_ms: 0,
            ..Report::default()
        };
        let s = plan.merge("b", other);
        assert_eq!((s.place, s.consumed), (4, 11));
        assert_eq!(s.counts.fetched_bytes, 100);
        let v = plan.view(Duration::from_secs(60));
        assert_eq!((v.place, v.consumed, v.reads_ready), (4, 11, 1));
        // A mark of the next epoch moves the plan on, with no client call.
        plans.note(&mark(&id, 1, 0, 1), "p/0.tar", None, true);
        assert_eq!(plan.spec().epoch, 1);
        assert_eq!(plan.position().1, 0);
    }

    /// Reads come out of order (workers, read-ahead): how far one came behind its
    /// rank's furthest place is measured, kept for an epoch more, and shared.
    #[test]
    fn the_lag_of_reads_behind_the_furthest_place_is_measured() {
        let plans = Plans::new(Duration::from_secs(60));
        let plan = plans.register(spec(1)).unwrap().plan;
        let id = plan.id.clone();
        plans.note(&mark(&id, 0, 0, 0), "p/0.tar", None, true);
        plans.note(&mark(&id, 0, 0, 16), "p/1.tar", None, true);
        plans.note(&mark(&id, 0, 0, 64), "p/2.tar", None, true);
        plans.note(&mark(&id, 0, 0, 8), "p/0.tar", None, true);
        assert_eq!(plan.lag(), 56);
        assert_eq!(plan.report(Need::default(), 0).lag, 56);
        // The next epoch keeps the last one's.
        plans.note(&mark(&id, 1, 0, 0), "p/1.tar", None, true);
        plans.note(&mark(&id, 1, 0, 10), "p/2.tar", None, true);
        plans.note(&mark(&id, 1, 0, 6), "p/1.tar", None, true);
        assert_eq!(plan.lag(), 56);
        plans.note(&mark(&id, 2, 0, 0), "p/1.tar", None, true);
        assert_eq!(plan.lag(), 4, "two epochs on");
        // Another member's, through the home's standing.
        let other = Report {
            id: id.clone(),
            epoch: 2,
            lag: 30,
            ..Report::default()
        };
        assert_eq!(plan.merge("b", other).lag, 30);
        assert_eq!(plan.lag(), 30);
    }

    #[test]
    fn a_shard_read_last_epoch_is_unread_until_its_read_of_this_one() {
        let plans = Plans::new(Duration::from_secs(60));
        let plan = plans.register(spec(1)).unwrap().plan;
        let id = plan.id.clone();
        assert!(
            !plan.unread_here("p/0.tar"),
            "no read noted: the places decide"
        );
        plans.note(&mark(&id, 0, 0, 3), "p/0.tar", None, true);
        plans.note(&mark(&id, 0, 0, 4), "p/1.tar", None, true);
        assert!(!plan.unread_here("p/0.tar"), "read in this epoch");
        // The ranks move on to epoch 1 and read shard 1 first.
        plans.note(&mark(&id, 1, 0, 0), "p/1.tar", None, true);
        assert!(
            plan.unread_here("p/0.tar"),
            "its read of epoch 1 is still to come"
        );
        assert!(!plan.unread_here("p/1.tar"));
        plans.note(&mark(&id, 1, 0, 9), "p/0.tar", None, true);
        assert!(!plan.unread_here("p/0.tar"));
        // A key of no shard of the plan is not kept.
        plans.note(&mark(&id, 1, 0, 9), "q/x.tar", None, true);
        assert!(!plan.unread_here("q/x.tar"));
        assert_eq!(plan.lock().last_read.len(), 2);
    }

    #[test]
    fn a_need_is_the_steepest_rate_its_deadlines_ask() {
        const MB: u64 = 1_000_000;
        // 1 MB by 1 s; 2 MB more by 4 s (3 MB by then); one past every deadline.
        let n = Need::of([(MB, 0.5), (MB, 3.0), (MB, 4.0), (5 * MB, 1000.0)]);
        assert_eq!(n.bytes, vec![MB, 0, 2 * MB, 0, 0, 0, 0, 0]);
        assert!(
            (n.rate() - MB as f64).abs() < 1.0,
            "1 MB by 1 s is the steepest"
        );
        let mut all = Need::of([(4 * MB, 2.0)]);
        assert!((all.rate() - 2.0 * MB as f64).abs() < 1.0);
        all.add(&n);
        // 5 MB by 2 s.
        assert!((all.rate() - 2.5 * MB as f64).abs() < 1.0);
        assert_eq!(Need::default().rate(), 0.0);
    }

    /// The home sums the members' bytes into the backend's throughput: its capacity
    /// where they needed more, else a floor kept until a span needing more says less.
    #[test]
    fn the_home_measures_the_backends_throughput_from_the_members_counts() {
        let t0 = Instant::now();
        let s = |ms: u64| t0 + Duration::from_millis(ms);
        let mut m = BackendMeter::default();
        // First reports: counters known, nothing counted yet.
        assert_eq!(m.add("a", 1000, 0.0, 0.0, s(0)), 0.0);
        assert_eq!(m.add("b", 5000, 0.0, 0.0, s(100)), 0.0);
        // 2 s later: a brought 2 MB and b 1 MB: 1.5 MB/s; needed less, a floor.
        let r = m.add("a", 2_001_000, 0.0, 0.0, s(1000));
        assert_eq!(r, 0.0, "span not over yet");
        let r = m.add("b", 1_005_000, 0.0, r, s(2000));
        assert!((r - 1.5e6).abs() < 1.0, "{r}");
        // A span with less brought and less needed keeps the floor.
        let r2 = m.add("a", 2_501_000, 0.1e6, r, s(4000));
        assert_eq!(r2, r);
        // Members needing more than they got: the backend gives no more.
        let r3 = m.add("a", 3_001_000, 5e6, r2, s(6000));
        assert!((r3 - (0.5 * 1.5e6 + 0.5 * 0.25e6)).abs() < 1.0, "{r3}");
        // A member that restarted counts from 0: its drop adds nothing.
        m.add("b", 10, 0.0, r3, s(6500));
        assert_eq!(m.bytes, 0);
    }

    #[test]
    fn unused_plans_expire() {
        let plans = Plans::new(Duration::from_millis(50));
        let id = plans.register(spec(1)).unwrap().plan.id.clone();
        assert!(plans.expire().is_empty());
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(plans.expire(), vec![id]);
        assert!(plans.is_empty());
    }

    /// The bytes read of a shard in an epoch: ranges merged as they come, in any order,
    /// covered from its start once they leave no gap, forgotten at the next epoch.
    #[test]
    fn a_shards_bytes_read_cover_it_once_no_gap_is_left() {
        let mut c = Covered::default();
        c.add(100, 200);
        c.add(300, 400);
        assert_eq!(c.prefix(), 0);
        c.add(0, 100);
        assert_eq!(c.prefix(), 200);
        c.add(150, 350);
        c.add(5, 5);
        assert_eq!(c.0, vec![(0, 400)]);
        // At most MOST ranges apart: one more apart is not kept, one that joins them is.
        let mut many = Covered::default();
        for i in 0..Covered::MOST as u64 {
            many.add(10 * i + 1, 10 * i + 2);
        }
        many.add(100_000, 100_001);
        assert_eq!(many.0.len(), Covered::MOST);
        many.add(0, 20_000);
        assert_eq!(many.0, vec![(0, 20_000)]);

        let plans = Plans::new(Duration::from_secs(60));
        let plan = plans.register(spec(1)).unwrap().plan;
        let id = plan.id.clone();
        plans.note(&mark(&id, 0, 0, 1), "p/0.tar", Some((0, 60)), true);
        plans.note(&mark(&id, 0, 0, 2), "p/0.tar", Some((60, 100)), true);
        plans.note(&mark(&id, 0, 0, 2), "p/1.tar", None, true);
        plans.note(&mark(&id, 0, 0, 2), "q/x.tar", Some((0, 100)), true);
        let only = |k: &str, n: u64| HashMap::from([(k.to_owned(), n)]);
        assert_eq!(plan.covered(), only("p/0.tar", 100));
        plans.note(&mark(&id, 1, 0, 0), "p/1.tar", Some((0, 10)), true);
        assert_eq!(plan.covered(), only("p/1.tar", 10), "the next epoch's only");
    }
}
