//! `granary-bench rebalance`: what moving objects to a new member costs. The bench lays
//! out a data set in a directory, starts a cluster over it (the `fs:` backend, shared) and
//! reads every object once so each is cached on its owner. Then:
//!
//! 1. a member joins with nothing else going on: the rebalance's throughput (bytes handed
//!    over per second of the passes, all members together);
//! 2. reads of random objects through every member are timed while nothing changes;
//! 3. another member joins while the reads go on: their latency from the join until the
//!    first pass starts (the new member fills its keys from their old owners as they are
//!    read), and while the passes run.
//!
//! 4. two members leave, under the same reads: one drained first (`POST
//!    /_granary/cluster/drain`: it hands its copies to their new owners, then it is
//!    stopped and taken out of the list), one stopped and taken out with no drain. After each,
//!    every object is read once more: the bytes the backend served for the leave, against
//!    what the leaving member held.
//!
//! It reports the figures, and the cached bytes over the data set's before the joins and
//! after the rebalances.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use granary_client::Client;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::cluster::{Cluster, ClusterCmd};

/// What to run.
#[derive(Debug, Clone)]
pub struct RebalancePlan {
    /// The members; `cmd.args` get `--backend fs:<dir>/origin` added.
    pub cmd: ClusterCmd,
    pub members: usize,
    pub objects: usize,
    pub object_size: u64,
    /// Reader threads.
    pub readers: usize,
    /// How long reads are measured with nothing changing.
    pub steady: Duration,
    /// The longest the rebalance is waited for.
    pub limit: Duration,
}

#[derive(Debug, Default, Serialize)]
pub struct RebalanceReport {
    pub members: usize,
    pub objects: usize,
    pub dataset_bytes: u64,
    /// Cached bytes over data set bytes once every object was read, and after the
    /// rebalance that followed the join.
    pub cached_over_dataset_before: f64,
    pub cached_over_dataset_after: f64,
    /// The first join, alone: bytes and objects the members handed to the new one.
    pub moved_bytes: u64,
    pub moved_objects: u64,
    /// From the first pass's start to the last one's end.
    pub rebalance_seconds: f64,
    /// `moved_bytes` over `rebalance_seconds`, MB/s.
    pub rebalance_mb_per_s: f64,
    /// The second join, under reads: what the passes handed over (objects the new member
    /// took while they were read count too: it held them when offered).
    pub moved_bytes_under_reads: u64,
    pub steady: Latency,
    /// From the join until the first pass starts (the new member takes its keys' reads,
    /// filling from the old owners).
    pub joining: Latency,
    /// While passes run.
    pub during_rebalance: Latency,
    /// Reads that failed or returned the wrong length.
    pub failed_reads: u64,
    /// A member drained, then stopped: what it held, how long the drain took, and the
    /// bytes the backend served from the drain's start until every object was read again.
    pub drain: Leave,
    /// A member stopped and taken out of the list with no drain: the same figures (its
    /// keys' new owners refill them).
    pub plain_leave: Leave,
}

/// What one member's leave cost.
#[derive(Debug, Default, Serialize)]
pub struct Leave {
    pub held_bytes: u64,
    pub seconds: f64,
    pub backend_bytes: u64,
    /// Bytes the remaining members filled from peers meanwhile (the leaving member while
    /// it still answered, or one another).
    pub peer_bytes: u64,
    /// `backend_bytes` over `held_bytes`.
    pub backend_over_held: f64,
    pub failed_reads: u64,
}

/// Read latencies, milliseconds.
#[derive(Debug, Default, Serialize)]
pub struct Latency {
    pub reads: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mb_per_s: f64,
}

fn object_key(i: usize) -> String {
    format!("obj-{i:06}")
}

/// Bytes of object `i` (cheap, distinct per object).
fn object_bytes(i: usize, size: u64) -> Vec<u8> {
    let mut out = vec![0u8; size as usize];
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    out
}

const BUCKET: &str = "rebalance";

/// Readers of random objects through the given members until `stop`; latencies go into
/// the histogram that `phase` points at.
struct Readers {
    stop: Arc<AtomicBool>,
    endpoints: Arc<Mutex<Vec<String>>>,
    hist: Arc<Mutex<Histogram<u64>>>,
    bytes: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Readers {
    fn start(n: usize, endpoints: Vec<String>, objects: usize, size: u64) -> Readers {
        let stop = Arc::new(AtomicBool::new(false));
        let endpoints = Arc::new(Mutex::new(endpoints));
        let hist = Arc::new(Mutex::new(new_hist()));
        let bytes = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let threads = (0..n)
            .map(|t| {
                let (stop, endpoints, hist) = (stop.clone(), endpoints.clone(), hist.clone());
                let (bytes, failed) = (bytes.clone(), failed.clone());
                std::thread::spawn(move || {
                    let mut rng = (t as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                    let mut next = || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    let mut clients: Vec<(String, Client)> = Vec::new();
                    let mut buf = vec![0u8; 256 << 10];
                    while !stop.load(Ordering::Relaxed) {
                        let endpoint = {
                            let e = endpoints.lock().unwrap_or_else(|p| p.into_inner());
                            e[(next() % e.len() as u64) as usize].clone()
                        };
                        let at = match clients.iter().position(|(e, _)| *e == endpoint) {
                            Some(at) => at,
                            None => {
                                let Ok(c) = Client::new(&endpoint) else {
                                    failed.fetch_add(1, Ordering::Relaxed);
                                    continue;
                                };
                                clients.push((endpoint, c.with_timeout(Duration::from_secs(30))));
                                clients.len() - 1
                            }
                        };
                        let key = object_key((next() % objects as u64) as usize);
                        let started = Instant::now();
                        let got = clients[at].1.open(BUCKET, &key).and_then(|mut r| {
                            let mut n = 0u64;
                            loop {
                                match r.read(&mut buf) {
                                    Ok(0) => return Ok(n),
                                    Ok(k) => n += k as u64,
                                    Err(e) => return Err(granary_client::Error::Local(e)),
                                }
                            }
                        });
                        match got {
                            Ok(n) if n == size => {
                                let us = started.elapsed().as_micros() as u64;
                                let _ = hist
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .record(us.max(1));
                                bytes.fetch_add(n, Ordering::Relaxed);
                            }
                            _ => {
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        Readers {
            stop,
            endpoints,
            hist,
            bytes,
            failed,
            threads,
        }
    }

    /// The latencies since the last call, and a fresh histogram for the next phase.
    fn take(&self, seconds: f64) -> Latency {
        let h = std::mem::replace(
            &mut *self.hist.lock().unwrap_or_else(|p| p.into_inner()),
            new_hist(),
        );
        let bytes = self.bytes.swap(0, Ordering::Relaxed);
        Latency {
            reads: h.len(),
            p50_ms: h.value_at_quantile(0.5) as f64 / 1000.0,
            p99_ms: h.value_at_quantile(0.99) as f64 / 1000.0,
            mb_per_s: bytes as f64 / 1e6 / seconds.max(1e-9),
        }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        self.failed.load(Ordering::Relaxed)
    }
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds")
}

/// Runs the measurement.
pub fn run(plan: &RebalancePlan) -> anyhow::Result<RebalanceReport> {
    anyhow::ensure!(plan.members >= 2, "--members must be at least 2");
    anyhow::ensure!(
        plan.objects > 0 && plan.object_size > 0,
        "an empty data set"
    );
    let origin = plan.cmd.dir.join("origin");
    let bucket_dir = origin.join(BUCKET);
    std::fs::create_dir_all(&bucket_dir)
        .with_context(|| format!("creating {}", bucket_dir.display()))?;
    for i in 0..plan.objects {
        let path = bucket_dir.join(object_key(i));
        if std::fs::metadata(&path).map(|m| m.len()).ok() != Some(plan.object_size) {
            std::fs::write(&path, object_bytes(i, plan.object_size))?;
        }
    }
    let mut cmd = plan.cmd.clone();
    cmd.args
        .extend(["--backend".to_owned(), format!("fs:{}", origin.display())]);
    let mut cluster = Cluster::start(cmd, plan.members)?;
    let dataset = plan.objects as u64 * plan.object_size;
    let mut report = RebalanceReport {
        members: plan.members,
        objects: plan.objects,
        dataset_bytes: dataset,
        ..RebalanceReport::default()
    };

    // Every object cached on its owner.
    let mut warm = Client::new(&cluster.endpoint(0))?.with_timeout(Duration::from_secs(60));
    let mut sink = Vec::new();
    for i in 0..plan.objects {
        sink.clear();
        warm.get_into(BUCKET, &object_key(i), &mut sink)?;
    }
    let settle = Instant::now();
    while cluster.stat_sum("reserved_bytes")? > 0 && settle.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    report.cached_over_dataset_before = cluster.stat_sum("used_bytes")? as f64 / dataset as f64;

    // 1. A member joins with nothing else going on.
    let passes = join_and_wait(&mut cluster, plan.limit, None)?;
    report.moved_bytes = sum_u64(&passes, "bytes_done");
    report.moved_objects = sum_u64(&passes, "objects_done");
    report.rebalance_seconds = passes
        .iter()
        .map(|j| j["elapsed_seconds"].as_f64().unwrap_or(0.0))
        .fold(0.0, f64::max);
    report.rebalance_mb_per_s =
        report.moved_bytes as f64 / 1e6 / report.rebalance_seconds.max(1e-9);

    // 2. Reads with nothing changing.
    let endpoints: Vec<String> = cluster
        .running()
        .iter()
        .map(|&i| cluster.endpoint(i))
        .collect();
    let readers = Readers::start(plan.readers, endpoints, plan.objects, plan.object_size);
    std::thread::sleep(Duration::from_secs(1));
    readers.take(1.0);
    std::thread::sleep(plan.steady);
    report.steady = readers.take(plan.steady.as_secs_f64());

    // 3. Another member joins under the reads.
    let passes = join_and_wait(
        &mut cluster,
        plan.limit,
        Some(&mut report_phases(&readers, &mut report)),
    )?;
    report.moved_bytes_under_reads = sum_u64(&passes, "bytes_done");
    report.failed_reads = readers.stop();

    // 4. Two leaves under reads: a drain, then a plain one.
    report.drain = leave(&mut cluster, plan, true)?;
    report.plain_leave = leave(&mut cluster, plan, false)?;
    let settle = Instant::now();
    while cluster.stat_sum("reserved_bytes")? > 0 && settle.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    report.cached_over_dataset_after = cluster.stat_sum("used_bytes")? as f64 / dataset as f64;
    Ok(report)
}

/// The first running member leaves, under reads through the others: drained first with
/// `drain`, else stopped first. Every object is read once after, through another member.
fn leave(cluster: &mut Cluster, plan: &RebalancePlan, drain: bool) -> anyhow::Result<Leave> {
    let running = cluster.running();
    anyhow::ensure!(running.len() >= 2, "no member would be left");
    let (gone, rest) = (running[0], running[1..].to_vec());
    let settle = Instant::now();
    while cluster.stat_sum("reserved_bytes")? > 0 && settle.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let backend = |cluster: &Cluster, who: &[usize]| -> anyhow::Result<u64> {
        who.iter()
            .map(|&i| cluster.stat(i, "bytes_from_backend"))
            .sum()
    };
    let mut out = Leave {
        held_bytes: cluster.stat(gone, "used_bytes")?,
        ..Leave::default()
    };
    let rest_before = backend(cluster, &rest)?;
    let peers_before: u64 = rest
        .iter()
        .map(|&i| cluster.stat(i, "bytes_from_peers"))
        .sum::<anyhow::Result<u64>>()?;
    let gone_before = backend(cluster, &[gone])?;
    let endpoints = rest.iter().map(|&i| cluster.endpoint(i)).collect();
    let readers = Readers::start(plan.readers, endpoints, plan.objects, plan.object_size);
    let started = Instant::now();
    let mut gone_during = 0;
    if drain {
        let id = cluster.id(gone).to_owned();
        let mut c = Client::new(&cluster.endpoint(rest[0]))?.with_timeout(Duration::from_secs(10));
        c.drain(&id)?;
        loop {
            let drained = c
                .cluster()?
                .members
                .iter()
                .any(|m| m.id == id && m.state == granary_client::MemberState::Drained);
            if drained {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < plan.limit,
                "{id} not drained in {:?}",
                plan.limit
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        gone_during = backend(cluster, &[gone])? - gone_before;
    } else {
        // Stopped first, as a member is decommissioned without a drain (or lost): its
        // copies go with it.
        cluster.kill(gone)?;
    }
    cluster.remove(gone, Duration::from_secs(30))?;
    out.failed_reads = readers.stop();
    let mut c = Client::new(&cluster.endpoint(rest[0]))?.with_timeout(Duration::from_secs(60));
    let mut sink = Vec::new();
    for i in 0..plan.objects {
        sink.clear();
        c.get_into(BUCKET, &object_key(i), &mut sink)?;
    }
    out.seconds = started.elapsed().as_secs_f64();
    out.backend_bytes = backend(cluster, &rest)? - rest_before + gone_during;
    out.peer_bytes = rest
        .iter()
        .map(|&i| cluster.stat(i, "bytes_from_peers"))
        .sum::<anyhow::Result<u64>>()?
        - peers_before;
    out.backend_over_held = out.backend_bytes as f64 / out.held_bytes.max(1) as f64;
    Ok(out)
}

fn sum_u64(jobs: &[serde_json::Value], field: &str) -> u64 {
    jobs.iter().map(|j| j[field].as_u64().unwrap_or(0)).sum()
}

/// What happens at the two moments of a join under reads: the new member's address
/// given to the readers, then the latencies taken when the first pass starts and when
/// the last ends.
struct Phases<'a> {
    readers: &'a Readers,
    report: &'a mut RebalanceReport,
    joined: Instant,
    first_pass: Option<Instant>,
}

fn report_phases<'a>(readers: &'a Readers, report: &'a mut RebalanceReport) -> Phases<'a> {
    Phases {
        readers,
        report,
        joined: Instant::now(),
        first_pass: None,
    }
}

/// A new member joins; returns the rebalance jobs that followed, once none runs (or after
/// `limit`).
fn join_and_wait(
    cluster: &mut Cluster,
    limit: Duration,
    mut phases: Option<&mut Phases<'_>>,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let before: Vec<String> = job_ids(cluster)?;
    // Each member that was there runs a pass of its own (they see the change at
    // different moments).
    let senders = cluster.running().len();
    let joined_at = Instant::now();
    let joined = cluster.join()?;
    if let Some(p) = phases.as_deref_mut() {
        p.joined = joined_at;
        p.readers
            .endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cluster.endpoint(joined));
    }
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let passes: Vec<serde_json::Value> = cluster
            .rebalance_jobs()?
            .into_iter()
            .filter(|j| !before.iter().any(|id| j["id"] == id.as_str()))
            .collect();
        if let Some(p) = phases.as_deref_mut() {
            if p.first_pass.is_none() && !passes.is_empty() {
                p.first_pass = Some(Instant::now());
                p.report.joining = p.readers.take(p.joined.elapsed().as_secs_f64());
            }
        }
        let running = passes.iter().any(|j| j["state"] == "running");
        if (passes.len() >= senders && !running) || joined_at.elapsed() > limit {
            if let Some(p) = phases.as_deref_mut() {
                let since = p.first_pass.unwrap_or(p.joined);
                p.report.during_rebalance = p.readers.take(since.elapsed().as_secs_f64());
            }
            return Ok(passes);
        }
    }
}

fn job_ids(cluster: &Cluster) -> anyhow::Result<Vec<String>> {
    Ok(cluster
        .rebalance_jobs()?
        .iter()
        .filter_map(|j| j["id"].as_str().map(str::to_owned))
        .collect())
}
