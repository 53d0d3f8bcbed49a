//! `granary-bench soak`: a bounded run that mixes GETs, PUTs and DELETEs over a key space
//! while the node is killed (`SIGKILL`) and restarted, checking every byte read against
//! what was written.
//!
//! Each worker owns the keys `k` with `k % workers == worker`, so writes to one key never
//! race and the expected state of every key is known exactly: the last acknowledged write
//! (a version whose bytes are a seeded stream), a deletion, or — when a request's answer
//! was lost to a restart — either the state before it or after it, settled by the next
//! read. A GET must return exactly the expected bytes or `404`; anything else is a
//! mismatch, and an acknowledged version that reads back as an older one (or missing) is
//! a lost write. Requests that fail while the node is down are counted, not judged.
//!
//! With `--granary BIN --serve-arg ...`, the bench starts the node itself, restarts it
//! every `--restart-every`, and samples its resident memory once a second.
//!
//! With `--cluster N` it starts N members instead (listed in a peers file, see
//! [`crate::cluster`]), sends each request to one of the members serving, and changes
//! the cluster under the load: a member is killed and, once the others have had time to
//! see it down, restarted; a new member joins through the peers file; one leaves. Only
//! requests that started within moments of a kill ([`DETECTION`]) may fail; any other
//! failure is counted. At the end, once rebalance has settled, the members' cached bytes
//! are compared with the bytes of the distinct objects the bucket holds, and every key is
//! read once more through the cluster.
//!
//! With `--direct-endpoint URL --direct-pct N`, N% of the requests are writes made
//! straight to the backend (the S3 server behind the nodes), as a pipeline would make
//! them, not through Granary: a read that starts more than `--direct-bound` after one
//! (the nodes' `--revalidate-after` and a second) must not return what the key held
//! before it; earlier, it may.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use granary_client::{Client, Error};
use serde::Serialize;

use crate::cluster::{Cluster, ClusterCmd};

/// How long after a member is killed requests through the others may fail: the others
/// mark a member down within 5 s; a request in flight when it died may fail too.
pub const DETECTION: Duration = Duration::from_secs(6);
/// How long before a kill a failed request is taken to have been in flight then.
const IN_FLIGHT: Duration = Duration::from_secs(2);
/// How long the cluster is given at the end to come back to one copy of each object.
const SETTLE: Duration = Duration::from_secs(90);

/// What to run against.
#[derive(Debug, Clone)]
pub struct SoakPlan {
    pub endpoint: String,
    pub bucket: String,
    pub duration: Duration,
    pub workers: usize,
    pub keys: usize,
    pub min_size: u64,
    pub max_size: u64,
    /// Percentages of PUTs and DELETEs; the rest are GETs.
    pub pct_put: u32,
    pub pct_delete: u32,
    pub seed: u64,
    /// The node to start and restart, if the bench manages it.
    pub node: Option<NodeCmd>,
    pub restart_every: Option<Duration>,
    /// A cluster the bench starts and changes instead of one node.
    pub cluster: Option<ClusterPlan>,
    /// Writes straight to the backend, beside the ones through Granary.
    pub direct: Option<DirectPlan>,
}

/// Writes made straight to the backend.
#[derive(Debug, Clone)]
pub struct DirectPlan {
    /// The backend's S3 endpoint.
    pub endpoint: String,
    /// Percentage of requests (taken from the GETs' share).
    pub pct: u32,
    /// How long after such a write a read may still return the key's earlier state.
    pub bound: Duration,
    /// What the writes are signed with (the store refuses an unsigned overwrite of an
    /// object the nodes wrote).
    pub credentials: Option<granary_client::Credentials>,
}

/// The cluster mode.
#[derive(Debug, Clone)]
pub struct ClusterPlan {
    pub cmd: ClusterCmd,
    /// Members at the start.
    pub members: usize,
    /// Kill and restart one, add one, remove one, while the load runs.
    pub churn: bool,
}

/// How to start the node.
#[derive(Debug, Clone)]
pub struct NodeCmd {
    pub binary: PathBuf,
    pub args: Vec<String>,
    pub log: PathBuf,
}

#[derive(Debug, Default, Serialize)]
pub struct SoakReport {
    pub seconds: f64,
    pub gets: u64,
    pub puts: u64,
    pub deletes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Reads whose bytes (or absence) were not what was written.
    pub mismatches: u64,
    /// Acknowledged writes that later read back as older data or as missing.
    pub lost_writes: u64,
    /// Requests that failed while the node was down or restarting.
    pub unavailable: u64,
    /// Other errors (answers outside 2xx/404).
    pub errors: u64,
    pub restarts: u64,
    /// Resident memory of the node, KiB: after the first minute (warm), the highest, and
    /// the highest in each minute.
    pub rss_warm_kib: u64,
    pub rss_max_kib: u64,
    pub rss_per_minute_max_kib: Vec<u64>,
    /// The highest of the node's own memory (`RssAnon`), KiB: its RSS also counts the
    /// page-cache pages of the cache windows it keeps mapped between hits.
    pub anon_max_kib: u64,
    /// Cluster mode: reads that failed, other than those a kill excuses.
    pub failed_reads: u64,
    /// Cluster mode: what happened to the membership, and when (seconds from the start).
    pub events: Vec<String>,
    /// Cluster mode, at the end: the members' cached bytes, the bytes of the distinct
    /// objects in the bucket, their ratio, and how long rebalance took to get there.
    pub cached_bytes: u64,
    pub distinct_bytes: u64,
    pub cached_over_distinct: f64,
    pub settle_seconds: f64,
    /// Cluster mode: keys read in the final sweep.
    pub swept: u64,
    /// Writes made straight to the backend, and reads that returned the state before
    /// one within its bound (allowed; after the bound they count as lost writes).
    pub direct_writes: u64,
    pub stale_within_bound: u64,
    pub first_problems: Vec<String>,
}

/// The expected state of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Absent,
    /// Version `v` of `size` bytes.
    Written {
        v: u64,
        size: u64,
    },
}

/// What a key may hold: one state once a write was acknowledged (or a read settled it);
/// several while answers were lost (each lost write or delete may or may not have
/// landed). `older` keeps the states acknowledged before, to tell a lost write from
/// garbage.
#[derive(Debug, Clone)]
struct Expect {
    possible: Vec<State>,
    older: Vec<State>,
    /// After a write straight to the backend: the states before it, which reads that
    /// start before the instant may still return.
    stale: Option<(Vec<State>, Instant)>,
}

impl Expect {
    fn new() -> Expect {
        Expect {
            possible: vec![State::Absent],
            older: Vec::new(),
            stale: None,
        }
    }

    /// A write or delete was acknowledged: the key holds `s` (a write through Granary
    /// drops every copy, so no earlier state may be read after it).
    fn acked(&mut self, s: State) {
        let before = std::mem::replace(&mut self.possible, vec![s]);
        self.remember(before);
        self.stale = None;
    }

    /// A write straight to the backend: the key holds `s`; reads starting before
    /// `until` may still return what it held before.
    fn behind(&mut self, s: State, until: Instant) {
        let mut before = std::mem::replace(&mut self.possible, vec![s]);
        if let Some((earlier, _)) = self.stale.take() {
            before.extend(earlier);
        }
        self.remember(before.clone());
        self.stale = Some((before, until));
    }

    /// Whether a read that started at `started` may return `s` as a state from before a
    /// write straight to the backend.
    fn stale_ok(&self, s: &State, started: Instant) -> bool {
        self.stale
            .as_ref()
            .is_some_and(|(states, until)| started < *until && states.contains(s))
    }

    /// A write or delete whose answer was lost: `s` becomes possible too.
    fn maybe(&mut self, s: State) {
        if !self.possible.contains(&s) {
            self.possible.push(s);
        }
    }

    /// A read saw `s`, one of the possible states: it is the state now.
    fn settle(&mut self, s: State) {
        let before = std::mem::replace(&mut self.possible, vec![s]);
        self.remember(before.into_iter().filter(|x| *x != s).collect());
    }

    fn remember(&mut self, states: Vec<State>) {
        self.older.extend(states);
        let n = self.older.len();
        if n > 8 {
            self.older.drain(..n - 8);
        }
    }
}

/// Bytes of version `v` of key `k`, from `offset`.
fn fill(k: usize, v: u64, offset: u64, out: &mut [u8]) {
    let mut x = 0u64;
    // One 64-bit word per 8 bytes, from a hash of its index: any offset is cheap.
    for (i, b) in out.iter_mut().enumerate() {
        let pos = offset + i as u64;
        if i == 0 || pos.is_multiple_of(8) {
            x = splitmix(((k as u64) << 40) ^ (v << 20) ^ (pos / 8));
        }
        *b = (x >> ((pos % 8) * 8)) as u8;
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A sink that compares what it is given with version `v` of key `k`.
struct Checker {
    k: usize,
    v: u64,
    pos: u64,
    same: bool,
    buf: Vec<u8>,
}

impl Write for Checker {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.resize(data.len(), 0);
        fill(self.k, self.v, self.pos, &mut self.buf);
        self.same &= self.buf == data;
        self.pos += data.len() as u64;
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A reader of version `v` of key `k`, `size` bytes, for uploads.
struct Source {
    k: usize,
    v: u64,
    pos: u64,
    size: u64,
}

impl io::Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min((self.size - self.pos) as usize);
        fill(self.k, self.v, self.pos, &mut buf[..n]);
        self.pos += n as u64;
        Ok(n)
    }
}

#[derive(Default)]
struct Counters {
    gets: AtomicU64,
    puts: AtomicU64,
    deletes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    mismatches: AtomicU64,
    lost: AtomicU64,
    unavailable: AtomicU64,
    errors: AtomicU64,
    failed_reads: AtomicU64,
    swept: AtomicU64,
    direct_writes: AtomicU64,
    stale_within_bound: AtomicU64,
    problems: Mutex<Vec<String>>,
}

impl Counters {
    fn problem(&self, counter: &AtomicU64, what: String) {
        counter.fetch_add(1, Ordering::Relaxed);
        let mut p = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() < 20 {
            p.push(what);
        }
    }
}

/// Where requests go, and which failures are excused.
struct Targets {
    /// The endpoints serving now: the node, or the cluster's members.
    serving: RwLock<Vec<String>>,
    /// When members were killed (cluster mode).
    kills: Mutex<Vec<Instant>>,
    cluster: bool,
}

impl Targets {
    fn new(serving: Vec<String>, cluster: bool) -> Targets {
        Targets {
            serving: RwLock::new(serving),
            kills: Mutex::new(Vec::new()),
            cluster,
        }
    }

    fn pick(&self, roll: u64) -> Option<String> {
        let s = self.serving.read().unwrap_or_else(|e| e.into_inner());
        (!s.is_empty()).then(|| s[(roll % s.len() as u64) as usize].clone())
    }

    fn set(&self, endpoint: &str, serving: bool) {
        let mut s = self.serving.write().unwrap_or_else(|e| e.into_inner());
        s.retain(|e| e != endpoint);
        if serving {
            s.push(endpoint.to_owned());
        }
    }

    fn killed(&self) {
        self.kills
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Instant::now());
    }

    /// Whether the failure of a request that started at `started` is excused: one node,
    /// away (restarting); a cluster, within moments of a member's kill. Then the worker
    /// waits a moment rather than spin on refused connections.
    fn excused(&self, started: Instant, e: &Error) -> bool {
        let excused = if self.cluster {
            let kills = self.kills.lock().unwrap_or_else(|e| e.into_inner());
            kills
                .iter()
                .any(|&k| started + IN_FLIGHT >= k && started < k + DETECTION)
        } else {
            matches!(e, Error::Io { .. } | Error::Protocol(_)) || e.status() == Some(503)
        };
        if excused {
            std::thread::sleep(Duration::from_millis(20));
        }
        excused
    }
}

fn key_name(k: usize) -> String {
    format!("soak/{:02x}/{k:06}", k % 256)
}

/// One worker's loop over its keys until `stop`; then, once `sweep` is set, one read of
/// each of its keys (cluster mode).
fn worker(plan: &SoakPlan, w: usize, t: &Targets, flags: &Flags, c: &Counters) {
    let mut clients: Vec<(String, Client)> = Vec::new();
    let mine: Vec<usize> = (w..plan.keys).step_by(plan.workers).collect();
    if mine.is_empty() {
        return;
    }
    let mut expect: Vec<Expect> = vec![Expect::new(); mine.len()];
    let mut rng = splitmix(plan.seed ^ ((w as u64) << 17));
    let mut next = || {
        rng = splitmix(rng);
        rng
    };
    let mut version = 0u64;
    let mut direct = plan.direct.as_ref().and_then(|d| {
        let c = Client::new(&d.endpoint).ok()?;
        Some((d, c.with_credentials_opt(d.credentials.clone())))
    });
    while !flags.stop.load(Ordering::Relaxed) {
        let i = (next() % mine.len() as u64) as usize;
        let Some(client) = client_for(&mut clients, t, next(), c) else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let k = mine[i];
        let key = key_name(k);
        let roll = (next() % 100) as u32;
        let e = &mut expect[i];
        let started = Instant::now();
        if roll < plan.pct_put {
            version += 1;
            let v = (w as u64) << 40 | version;
            let span = plan.max_size - plan.min_size + 1;
            let size = plan.min_size + next() % span;
            let mut src = Source { k, v, pos: 0, size };
            c.puts.fetch_add(1, Ordering::Relaxed);
            let new = State::Written { v, size };
            match client.put(&plan.bucket, &key, &mut src, size) {
                Ok(_) => {
                    c.bytes_written.fetch_add(size, Ordering::Relaxed);
                    e.acked(new);
                }
                Err(err) => {
                    // It may have landed or not.
                    e.maybe(new);
                    if t.excused(started, &err) {
                        c.unavailable.fetch_add(1, Ordering::Relaxed);
                    } else {
                        c.problem(&c.errors, format!("PUT {key}: {err}"));
                    }
                }
            }
        } else if roll < plan.pct_put + plan.pct_delete {
            c.deletes.fetch_add(1, Ordering::Relaxed);
            match client.delete(&plan.bucket, &key) {
                Ok(()) => e.acked(State::Absent),
                Err(err) => {
                    e.maybe(State::Absent);
                    if t.excused(started, &err) {
                        c.unavailable.fetch_add(1, Ordering::Relaxed);
                    } else {
                        c.problem(&c.errors, format!("DELETE {key}: {err}"));
                    }
                }
            }
        } else if let Some((d, backend)) = direct
            .as_mut()
            .filter(|(d, _)| roll < plan.pct_put + plan.pct_delete + d.pct)
        {
            version += 1;
            let v = (w as u64) << 40 | version;
            let span = plan.max_size - plan.min_size + 1;
            let size = plan.min_size + next() % span;
            let mut src = Source { k, v, pos: 0, size };
            let new = State::Written { v, size };
            match backend.put(&plan.bucket, &key, &mut src, size) {
                Ok(_) => {
                    c.direct_writes.fetch_add(1, Ordering::Relaxed);
                    e.behind(new, Instant::now() + d.bound);
                }
                Err(err) => {
                    e.maybe(new);
                    c.problem(
                        &c.errors,
                        format!("PUT {key} straight to the backend: {err}"),
                    );
                }
            }
        } else {
            c.gets.fetch_add(1, Ordering::Relaxed);
            read(client, plan, k, &key, e, (t, started), c);
        }
    }
    if !t.cluster {
        return;
    }
    while !flags.sweep.load(Ordering::Relaxed) {
        if flags.abandon.load(Ordering::Relaxed) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (i, &k) in mine.iter().enumerate() {
        let Some(client) = client_for(&mut clients, t, next(), c) else {
            return;
        };
        read(
            client,
            plan,
            k,
            &key_name(k),
            &mut expect[i],
            (t, Instant::now()),
            c,
        );
        c.swept.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the workers are told.
#[derive(Default)]
struct Flags {
    /// Stop the load.
    stop: AtomicBool,
    /// Read every key once (the cluster has settled).
    sweep: AtomicBool,
    /// Exit without the sweep (the run failed).
    abandon: AtomicBool,
}

/// A client of one of the endpoints serving, made on first use.
fn client_for<'a>(
    clients: &'a mut Vec<(String, Client)>,
    t: &Targets,
    roll: u64,
    c: &Counters,
) -> Option<&'a mut Client> {
    let endpoint = t.pick(roll)?;
    let at = match clients.iter().position(|(e, _)| *e == endpoint) {
        Some(at) => at,
        None => match Client::new(&endpoint) {
            Ok(cl) => {
                clients.push((endpoint, cl.with_timeout(Duration::from_secs(30))));
                clients.len() - 1
            }
            Err(e) => {
                c.problem(&c.errors, format!("{endpoint}: {e}"));
                return None;
            }
        },
    };
    Some(&mut clients[at].1)
}

/// Reads `key` and judges what came against `e`; settles an uncertain state.
fn read(
    client: &mut Client,
    plan: &SoakPlan,
    k: usize,
    key: &str,
    e: &mut Expect,
    (t, started): (&Targets, Instant),
    c: &Counters,
) {
    // Every version the bytes may be: the possible ones first, then older ones.
    let written: Vec<(u64, u64)> = e
        .possible
        .iter()
        .chain(&e.older)
        .filter_map(|s| match s {
            State::Written { v, size } => Some((*v, *size)),
            State::Absent => None,
        })
        .collect();
    let mut sinks: Vec<Checker> = written
        .iter()
        .map(|&(v, _)| Checker {
            k,
            v,
            pos: 0,
            same: true,
            buf: Vec::new(),
        })
        .collect();
    let mut tee = Tee(&mut sinks);
    let seen = match client.get_into(&plan.bucket, key, &mut tee) {
        Ok(meta) => {
            c.bytes_read.fetch_add(meta.size, Ordering::Relaxed);
            let hit = written
                .iter()
                .zip(&sinks)
                .find(|((_, size), s)| s.same && s.pos == *size);
            match hit {
                Some(((v, size), _)) => State::Written { v: *v, size: *size },
                None => {
                    let what = format!(
                        "GET {key}: {} bytes that match no version written",
                        meta.size
                    );
                    return c.problem(&c.mismatches, what);
                }
            }
        }
        Err(err) if err.is_not_found() => State::Absent,
        Err(err) if t.excused(started, &err) => {
            c.unavailable.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(err) => {
            c.failed_reads.fetch_add(1, Ordering::Relaxed);
            return c.problem(&c.errors, format!("GET {key}: {err}"));
        }
    };
    if e.possible.contains(&seen) {
        e.settle(seen);
    } else if e.stale_ok(&seen, started) {
        c.stale_within_bound.fetch_add(1, Ordering::Relaxed);
    } else if e.older.contains(&seen) {
        c.problem(
            &c.lost,
            format!("GET {key}: {seen:?}, older than every write since"),
        );
    } else {
        c.problem(&c.mismatches, format!("GET {key}: {seen:?}, never written"));
    }
}

/// Writes to every sink.
struct Tee<'a>(&'a mut Vec<Checker>);

impl Write for Tee<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        for s in self.0.iter_mut() {
            s.write_all(data)?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The node the bench manages.
struct Node {
    cmd: NodeCmd,
    child: Child,
}

impl Node {
    fn start(cmd: &NodeCmd, endpoint: &str) -> anyhow::Result<Node> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&cmd.log)
            .with_context(|| format!("{}", cmd.log.display()))?;
        let child = Command::new(&cmd.binary)
            .arg("serve")
            .args(&cmd.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", cmd.binary.display()))?;
        let node = Node {
            cmd: cmd.clone(),
            child,
        };
        wait_healthy(endpoint)?;
        Ok(node)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then start again.
    fn restart(&mut self, endpoint: &str) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        *self = Node::start(&self.cmd, endpoint)?;
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_healthy(endpoint: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut c = Client::new(endpoint)?.with_timeout(Duration::from_secs(2));
    loop {
        if c.health().is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the node at {endpoint} did not answer /_granary/health within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A field of the process's `/proc/PID/status` in KiB (`VmRSS:`, `RssAnon:`).
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Runs the soak.
pub fn run(plan: &SoakPlan) -> anyhow::Result<SoakReport> {
    anyhow::ensure!(
        plan.workers > 0 && plan.keys >= plan.workers,
        "--keys must be at least --workers"
    );
    anyhow::ensure!(plan.min_size <= plan.max_size, "object size range is empty");
    let mut node = match (&plan.node, &plan.cluster) {
        (Some(cmd), None) => Some(Node::start(cmd, &plan.endpoint)?),
        _ => None,
    };
    let mut cluster = match &plan.cluster {
        Some(cp) => Some(Cluster::start(cp.cmd.clone(), cp.members)?),
        None => None,
    };
    let serving = match &cluster {
        Some(cl) => cl.running().iter().map(|&i| cl.endpoint(i)).collect(),
        None => vec![plan.endpoint.clone()],
    };
    let mut admin = Client::new(&serving[0])?;
    match admin.create_bucket(&plan.bucket) {
        Ok(()) => {}
        Err(e) if e.status() == Some(409) => {}
        Err(e) => return Err(e).context("creating the bucket"),
    }
    let targets = Arc::new(Targets::new(serving, cluster.is_some()));
    let flags = Arc::new(Flags::default());
    let counters = Arc::new(Counters::default());
    let started = Instant::now();
    let mut report = SoakReport::default();
    std::thread::scope(|s| -> anyhow::Result<()> {
        for w in 0..plan.workers {
            let (t, f, c) = (targets.clone(), flags.clone(), counters.clone());
            s.spawn(move || worker(plan, w, &t, &f, &c));
        }
        let result = match (&mut cluster, &plan.cluster) {
            (Some(cl), Some(cp)) => {
                let r = drive_cluster(cl, cp, plan, &targets, started, &mut report);
                flags.stop.store(true, Ordering::Relaxed);
                let r = r.and_then(|()| settle(cl, plan, &mut report));
                if r.is_ok() {
                    flags.sweep.store(true, Ordering::Relaxed);
                } else {
                    flags.abandon.store(true, Ordering::Relaxed);
                }
                r
            }
            _ => {
                let r = drive_node(node.as_mut(), plan, started, &mut report);
                flags.stop.store(true, Ordering::Relaxed);
                r
            }
        };
        result
    })?;
    let c = &counters;
    let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
    report.seconds = started.elapsed().as_secs_f64();
    report.gets = r(&c.gets);
    report.puts = r(&c.puts);
    report.deletes = r(&c.deletes);
    report.bytes_read = r(&c.bytes_read);
    report.bytes_written = r(&c.bytes_written);
    report.mismatches = r(&c.mismatches);
    report.lost_writes = r(&c.lost);
    report.direct_writes = r(&c.direct_writes);
    report.stale_within_bound = r(&c.stale_within_bound);
    report.unavailable = r(&c.unavailable);
    report.errors = r(&c.errors);
    report.failed_reads = r(&c.failed_reads);
    report.swept = r(&c.swept);
    report.first_problems = c.problems.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(report)
}

/// One node: sampled once a second, restarted every `restart_every`.
fn drive_node(
    mut node: Option<&mut Node>,
    plan: &SoakPlan,
    started: Instant,
    report: &mut SoakReport,
) -> anyhow::Result<()> {
    let mut last_restart = Instant::now();
    let mut minute_max = 0u64;
    let mut minute_start = Instant::now();
    while started.elapsed() < plan.duration {
        std::thread::sleep(Duration::from_secs(1));
        let Some(n) = node.as_deref_mut() else {
            continue;
        };
        if let Some(anon) = status_kib(n.pid(), "RssAnon:") {
            report.anon_max_kib = report.anon_max_kib.max(anon);
        }
        if let Some(rss) = status_kib(n.pid(), "VmRSS:") {
            minute_max = minute_max.max(rss);
            report.rss_max_kib = report.rss_max_kib.max(rss);
            if started.elapsed() >= Duration::from_secs(60) && report.rss_warm_kib == 0 {
                report.rss_warm_kib = rss;
            }
        }
        if minute_start.elapsed() >= Duration::from_secs(60) {
            report.rss_per_minute_max_kib.push(minute_max);
            minute_max = 0;
            minute_start = Instant::now();
        }
        if plan
            .restart_every
            .is_some_and(|every| last_restart.elapsed() >= every)
        {
            n.restart(&plan.endpoint)?;
            report.restarts += 1;
            last_restart = Instant::now();
        }
    }
    if minute_max > 0 {
        report.rss_per_minute_max_kib.push(minute_max);
    }
    Ok(())
}

/// A cluster: with `churn`, at 15% of the run a member is killed, and restarted once
/// the others have had [`DETECTION`] to see it down; at 40% one joins; at 65% one
/// leaves. Requests go only to members serving (a client would drop a dead address).
fn drive_cluster(
    cl: &mut Cluster,
    cp: &ClusterPlan,
    plan: &SoakPlan,
    t: &Targets,
    started: Instant,
    report: &mut SoakReport,
) -> anyhow::Result<()> {
    let at = |f: f64| plan.duration.mul_f64(f);
    let wait_until = |when: Duration| {
        while started.elapsed() < when {
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let mut event = |what: String| {
        let line = format!("{:.1} s: {what}", started.elapsed().as_secs_f64());
        eprintln!("{line}");
        report.events.push(line);
    };
    if cp.churn {
        wait_until(at(0.15));
        let victim = cl.running()[1 % cl.running().len()];
        t.set(&cl.endpoint(victim), false);
        t.killed();
        cl.kill(victim)?;
        event(format!("{} killed (SIGKILL)", cl.id(victim)));
        std::thread::sleep(DETECTION);
        cl.restart(victim)?;
        t.set(&cl.endpoint(victim), true);
        event(format!("{} restarted and answering health", cl.id(victim)));
        report.restarts += 1;

        wait_until(at(0.40));
        let joined = cl.join()?;
        t.set(&cl.endpoint(joined), true);
        event(format!(
            "{} joined through the peers file and answers health",
            cl.id(joined)
        ));

        wait_until(at(0.65));
        let leaving = cl.running()[0];
        t.set(&cl.endpoint(leaving), false);
        let took = cl.remove(leaving, Duration::from_secs(30))?;
        event(format!(
            "{} out of the peers file; out of every view after {:.1} s, then stopped",
            cl.id(leaving),
            took.as_secs_f64()
        ));
    }
    wait_until(plan.duration);
    Ok(())
}

/// After the load: waits (up to [`SETTLE`]) until the members' cached bytes are within
/// 1.05× of the distinct objects' bytes, and records where they stand.
fn settle(cl: &Cluster, plan: &SoakPlan, report: &mut SoakReport) -> anyhow::Result<()> {
    let started = Instant::now();
    let endpoint = cl.endpoint(cl.running()[0]);
    let mut lister = Client::new(&endpoint)?.with_timeout(Duration::from_secs(30));
    loop {
        let distinct: u64 = lister
            .list(&plan.bucket, "")
            .context("listing the bucket")?
            .iter()
            .map(|o| o.size)
            .sum();
        let cached = cl.stat_sum("used_bytes")?;
        let busy = cl.stat_sum("reserved_bytes")? > 0;
        report.cached_bytes = cached;
        report.distinct_bytes = distinct;
        report.cached_over_distinct = cached as f64 / distinct.max(1) as f64;
        report.settle_seconds = started.elapsed().as_secs_f64();
        if (!busy && report.cached_over_distinct <= 1.05) || started.elapsed() > SETTLE {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_seekable_and_distinct() {
        let mut whole = vec![0u8; 1000];
        fill(3, 7, 0, &mut whole);
        let mut part = vec![0u8; 101];
        fill(3, 7, 333, &mut part);
        assert_eq!(&whole[333..434], &part[..]);
        let mut other = vec![0u8; 1000];
        fill(3, 8, 0, &mut other);
        assert_ne!(whole, other);
        let mut c = Checker {
            k: 3,
            v: 7,
            pos: 0,
            same: true,
            buf: Vec::new(),
        };
        for piece in whole.chunks(77) {
            c.write_all(piece).unwrap();
        }
        assert!(c.same && c.pos == 1000);
        c.write_all(&[0]).unwrap();
        assert!(!c.same || c.pos == 1001);
    }
}
