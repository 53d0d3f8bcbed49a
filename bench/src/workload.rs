//! The load itself: the epoch schedule, the HTTP client and the worker tasks.
//!
//! Workers share one cursor over a virtual sequence of requests: request `i` reads the
//! object at position `i % n` of epoch `i / n`'s shuffled order. A shared cursor splits
//! each epoch among the workers without stragglers. Epochs are sequential, as in a
//! training loop: no request of epoch `e + 1` starts before every request of epoch `e`
//! has been answered, so each epoch's cache outcomes see the fills of the one before.
//! In [`Mode::Repeat`] (the `get` command) there are no barriers: every worker reads
//! the object set round and round, all counted as one epoch.
//! Bodies are read frame by frame and never buffered whole.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{header, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use indicatif::{ProgressBar, ProgressStyle};
use md5::{Digest, Md5};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};

use crate::http::Target;
use crate::listing::Object;
use crate::stats::{fetch_stats, ServerStats};

/// The order in which epoch `epoch` visits `n` objects: a permutation of `0..n` drawn
/// from `seed` and the epoch number, so a run is repeatable and every epoch differs.
pub fn epoch_order(n: usize, seed: u64, epoch: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mix = seed ^ (epoch as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    order.shuffle(&mut StdRng::seed_from_u64(mix));
    order
}

/// Hands out `(epoch, object index)` pairs to workers in epoch order.
pub struct Schedule {
    n: usize,
    seed: u64,
    limit: Option<u64>,
    cursor: AtomicU64,
    orders: Mutex<Vec<Arc<Vec<u32>>>>,
}

impl Schedule {
    /// A schedule over `n` objects; `epochs` bounds it, `None` runs until stopped.
    pub fn new(n: usize, seed: u64, epochs: Option<u64>) -> Self {
        Schedule {
            n,
            seed,
            limit: epochs.map(|e| e * n as u64),
            cursor: AtomicU64::new(0),
            orders: Mutex::new(Vec::new()),
        }
    }

    /// The next request, or `None` once every epoch has been handed out.
    pub fn next(&self) -> Option<(usize, usize)> {
        if self.n == 0 {
            return None;
        }
        let i = self.cursor.fetch_add(1, Ordering::Relaxed);
        if self.limit.is_some_and(|l| i >= l) {
            return None;
        }
        let epoch = (i / self.n as u64) as usize;
        let pos = (i % self.n as u64) as usize;
        let order = {
            let mut orders = self.orders.lock().unwrap_or_else(|e| e.into_inner());
            while orders.len() <= epoch {
                let e = orders.len();
                orders.push(Arc::new(epoch_order(self.n, self.seed, e)));
            }
            orders[epoch].clone()
        };
        Some((epoch, order[pos] as usize))
    }
}

/// How requests are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Shuffled epochs, one after another (each waits for the last answer of the one
    /// before), counted separately.
    Epochs,
    /// The object set read round and round by every worker at once, counted as one epoch.
    Repeat,
}

/// What a run does; built by `main` from the flags.
#[derive(Clone)]
pub struct Workload {
    pub target: Target,
    pub bucket: String,
    pub objects: Vec<Object>,
    /// Percentage of requests that are PUTs, 0..=100.
    pub pct_put: u8,
    pub workers: usize,
    pub duration: Option<Duration>,
    pub epochs: Option<u64>,
    /// Read random ranges of this many bytes instead of whole objects.
    pub range_size: Option<u64>,
    pub verify: bool,
    pub seed: u64,
    /// Draw a progress line on stderr (when it is a terminal).
    pub progress: bool,
    pub mode: Mode,
    /// Snapshot the server's `/_granary/stats` at each epoch's end, after its cache fills
    /// have committed, for per-epoch backend and peer bytes.
    pub epoch_stats: bool,
}

/// `x-granary-cache` outcomes, counted over GETs that answered 2xx.
#[derive(Debug, Default, Clone, Copy, serde::Serialize, PartialEq, Eq)]
pub struct CacheCounts {
    pub hit: u64,
    pub miss: u64,
    pub peer: u64,
    pub bypass: u64,
    /// GETs without the header (not Granary, or an unknown value).
    pub none: u64,
}

impl CacheCounts {
    pub fn add(&mut self, o: &CacheCounts) {
        self.hit += o.hit;
        self.miss += o.miss;
        self.peer += o.peer;
        self.bypass += o.bypass;
        self.none += o.none;
    }

    fn count(&mut self, value: Option<&[u8]>) {
        match value {
            Some(b"hit") => self.hit += 1,
            Some(b"miss") => self.miss += 1,
            Some(b"peer") => self.peer += 1,
            Some(b"bypass") => self.bypass += 1,
            _ => self.none += 1,
        }
    }

    /// hit / (hit + miss + peer + bypass); `None` when no GET carried the header.
    pub fn hit_ratio(&self) -> Option<f64> {
        let labelled = self.hit + self.miss + self.peer + self.bypass;
        (labelled > 0).then(|| self.hit as f64 / labelled as f64)
    }
}

/// Counters for one epoch.
#[derive(Debug, Clone, Default)]
pub struct EpochCounts {
    pub requests: u64,
    pub gets: u64,
    pub puts: u64,
    /// Body bytes received by GETs.
    pub bytes_read: u64,
    /// Body bytes sent by PUTs.
    pub bytes_written: u64,
    pub errors: u64,
    pub cache: CacheCounts,
    pub first_start: Option<Instant>,
    pub last_end: Option<Instant>,
}

impl EpochCounts {
    fn merge(&mut self, o: &EpochCounts) {
        self.requests += o.requests;
        self.gets += o.gets;
        self.puts += o.puts;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.errors += o.errors;
        self.cache.add(&o.cache);
        self.first_start = match (self.first_start, o.first_start) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_end = self.last_end.max(o.last_end);
    }

    /// Seconds from the epoch's first request to its last answer.
    pub fn elapsed(&self) -> f64 {
        match (self.first_start, self.last_end) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
            _ => 0.0,
        }
    }
}

/// Throughput over one interval of the run.
#[derive(Debug, Clone, Copy, serde::Serialize, PartialEq)]
pub struct Sample {
    /// End of the interval, seconds from the start of the run.
    pub t_s: f64,
    /// Body bytes moved (read + written) in the interval, MB/s.
    pub mb_s: f64,
    /// Requests answered in the interval, per second.
    pub req_s: f64,
}

/// How often the timeline is sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// Everything measured in a run, merged over workers.
pub struct Measured {
    pub elapsed: Duration,
    pub epochs: Vec<EpochCounts>,
    /// The server's counters before the run (`[0]`) and at the end of each completed
    /// epoch; empty when the target has no `/_granary/stats` or snapshots are off.
    pub epoch_stats: Vec<ServerStats>,
    /// Throughput every [`SAMPLE_INTERVAL`].
    pub timeline: Vec<Sample>,
    /// Whole-request latency of successful requests, microseconds.
    pub latency: Histogram<u64>,
    /// Time to the first body byte (or to the headers for empty bodies), microseconds.
    pub ttfb: Histogram<u64>,
    /// Failed requests by status code, `io` for transport errors, `verify` for MD5 mismatches.
    pub errors: BTreeMap<String, u64>,
    /// Bodies whose MD5 was compared with the ETag.
    pub verified: u64,
    /// Successful requests whose ETag was not a plain MD5 or that read a range.
    pub verify_skipped: u64,
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 1 hour at 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

struct WorkerState {
    epochs: Vec<EpochCounts>,
    latency: Histogram<u64>,
    ttfb: Histogram<u64>,
    errors: BTreeMap<String, u64>,
    verified: u64,
    verify_skipped: u64,
}

struct Shared {
    wl: Workload,
    /// Each object's `/bucket/key`, encoded, and its full URI.
    paths: Vec<String>,
    uris: Vec<http::Uri>,
    schedule: Schedule,
    /// Random bytes for PUT bodies: the largest object plus a window to slide over, so
    /// each key gets different contents without generating bytes per request.
    put_data: Bytes,
    stop: AtomicBool,
    /// Requests answered (or failed); the one that completes an epoch releases the next.
    completed: AtomicU64,
    /// Epochs whose every request has been answered (and whose stats are taken).
    released: AtomicU64,
    epoch_done: tokio::sync::Notify,
    snapshots: Mutex<Vec<ServerStats>>,
    timeline: Mutex<Vec<Sample>>,
    /// Whether epoch-end snapshots are taken (asked for, and the target has stats).
    stats_on: bool,
    /// Wakes the supervisor when the workers are done.
    finished: tokio::sync::Notify,
    live_requests: AtomicU64,
    live_bytes: AtomicU64,
    live_errors: AtomicU64,
}

const PUT_WINDOW: usize = 4096;

/// Runs the workload to the end of its epochs or its duration. `before` is the server's
/// counters taken just before (settled), the first of the epoch-end snapshots.
pub async fn run(wl: Workload, before: Option<ServerStats>) -> anyhow::Result<Measured> {
    anyhow::ensure!(!wl.objects.is_empty(), "the object set is empty");
    let put_data = if wl.pct_put > 0 {
        let max = wl.objects.iter().map(|o| o.size).max().unwrap_or(0) as usize;
        let mut buf = vec![0u8; max + PUT_WINDOW];
        StdRng::seed_from_u64(wl.seed ^ 0x5EED_DA7A).fill_bytes(&mut buf);
        Bytes::from(buf)
    } else {
        Bytes::new()
    };
    // Without a bound, a duration run goes on until stopped; neither flag means one epoch.
    let epochs = match (wl.epochs, wl.duration) {
        (None, None) => Some(1),
        (e, _) => e,
    };
    let snapshots: Vec<ServerStats> = before
        .filter(|_| wl.epoch_stats && wl.mode == Mode::Epochs)
        .into_iter()
        .collect();
    let paths: Vec<String> = wl
        .objects
        .iter()
        .map(|o| Target::object_path(&wl.bucket, &o.key))
        .collect();
    let uris = paths
        .iter()
        .map(|p| format!("{}{p}", wl.target.endpoint).parse::<http::Uri>())
        .collect::<Result<Vec<_>, _>>()
        .context("an object's URI")?;
    let shared = Arc::new(Shared {
        paths,
        uris,
        schedule: Schedule::new(wl.objects.len(), wl.seed, epochs),
        put_data,
        stop: AtomicBool::new(false),
        completed: AtomicU64::new(0),
        released: AtomicU64::new(0),
        epoch_done: tokio::sync::Notify::new(),
        stats_on: !snapshots.is_empty(),
        snapshots: Mutex::new(snapshots),
        timeline: Mutex::new(Vec::new()),
        finished: tokio::sync::Notify::new(),
        live_requests: AtomicU64::new(0),
        live_bytes: AtomicU64::new(0),
        live_errors: AtomicU64::new(0),
        wl,
    });
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..shared.wl.workers.max(1) {
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move { worker(shared, w as u64).await }));
    }
    let ticker = {
        let shared = shared.clone();
        tokio::spawn(async move { supervise(shared, started, epochs).await })
    };
    let mut m = Measured {
        elapsed: Duration::ZERO,
        epochs: Vec::new(),
        epoch_stats: Vec::new(),
        timeline: Vec::new(),
        latency: histogram(),
        ttfb: histogram(),
        errors: BTreeMap::new(),
        verified: 0,
        verify_skipped: 0,
    };
    for t in tasks {
        let s = t.await.context("a worker panicked")?;
        if m.epochs.len() < s.epochs.len() {
            m.epochs.resize(s.epochs.len(), EpochCounts::default());
        }
        for (a, b) in m.epochs.iter_mut().zip(&s.epochs) {
            a.merge(b);
        }
        m.latency.add(&s.latency).context("merging histograms")?;
        m.ttfb.add(&s.ttfb).context("merging histograms")?;
        for (k, v) in s.errors {
            *m.errors.entry(k).or_default() += v;
        }
        m.verified += s.verified;
        m.verify_skipped += s.verify_skipped;
    }
    m.elapsed = started.elapsed();
    shared.stop.store(true, Ordering::Relaxed);
    shared.finished.notify_one();
    let bar = ticker.await.context("the progress task panicked")?;
    bar.finish_and_clear();
    m.epoch_stats = std::mem::take(&mut *lock(&shared.snapshots));
    m.timeline = std::mem::take(&mut *lock(&shared.timeline));
    // Epochs a duration run never reached leave no empty rows.
    while m.epochs.last().is_some_and(|e| e.requests == 0) {
        m.epochs.pop();
    }
    Ok(m)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The progress line: a bar over the requests of an epoch run or the seconds of a
/// duration run, hidden when `--progress false` or stderr is not a terminal.
fn progress_bar(wl: &Workload, epochs: Option<u64>) -> ProgressBar {
    if !wl.progress {
        return ProgressBar::hidden();
    }
    let (len, unit) = match (wl.mode, epochs, wl.duration) {
        (Mode::Epochs, Some(e), _) => (Some(e * wl.objects.len() as u64), "req"),
        (_, _, Some(d)) => (Some(d.as_secs().max(1)), "s"),
        _ => (None, ""),
    };
    let bar = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let template = format!("[{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} {unit}  {{msg}}");
    if let Ok(style) = ProgressStyle::with_template(if len.is_some() {
        &template
    } else {
        "[{elapsed_precise}] {spinner} {msg}"
    }) {
        bar.set_style(style);
    }
    bar
}

/// Samples the timeline, drives the progress line and stops a duration run at its
/// deadline; returns the progress bar when the run is over.
async fn supervise(shared: Arc<Shared>, started: Instant, epochs: Option<u64>) -> ProgressBar {
    let bar = progress_bar(&shared.wl, epochs);
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::from_std(started) + SAMPLE_INTERVAL,
        SAMPLE_INTERVAL,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_t, mut last_bytes, mut last_reqs) = (0.0f64, 0u64, 0u64);
    // A one-second window for the "now" figure on the progress line.
    let mut window: std::collections::VecDeque<(f64, u64)> = Default::default();
    loop {
        let over = tokio::select! {
            _ = tick.tick() => false,
            _ = shared.finished.notified() => true,
        };
        let t = started.elapsed().as_secs_f64();
        let bytes = shared.live_bytes.load(Ordering::Relaxed);
        let reqs = shared.live_requests.load(Ordering::Relaxed);
        let dt = t - last_t;
        if dt > 1e-3 {
            lock(&shared.timeline).push(Sample {
                t_s: t,
                mb_s: (bytes - last_bytes) as f64 / dt / 1e6,
                req_s: (reqs - last_reqs) as f64 / dt,
            });
            (last_t, last_bytes, last_reqs) = (t, bytes, reqs);
        }
        if over || shared.stop.load(Ordering::Relaxed) {
            return bar;
        }
        if let Some(d) = shared.wl.duration {
            if started.elapsed() >= d {
                shared.stop.store(true, Ordering::Relaxed);
                shared.epoch_done.notify_waiters();
            }
        }
        window.push_back((t, bytes));
        while window.len() > 5 {
            window.pop_front();
        }
        let (t0, b0) = window.front().copied().unwrap_or((0.0, 0));
        let now = if t > t0 {
            (bytes - b0) as f64 / (t - t0) / 1e6
        } else {
            0.0
        };
        match (shared.wl.mode, epochs, shared.wl.duration) {
            (Mode::Epochs, Some(_), _) => bar.set_position(reqs),
            (_, _, Some(_)) => bar.set_position(t as u64),
            _ => bar.tick(),
        }
        bar.set_message(format!(
            "{reqs} requests  {now:.1} MB/s now  {} errors",
            shared.live_errors.load(Ordering::Relaxed)
        ));
    }
}

async fn worker(shared: Arc<Shared>, id: u64) -> WorkerState {
    let mut st = WorkerState {
        epochs: Vec::new(),
        latency: histogram(),
        ttfb: histogram(),
        errors: BTreeMap::new(),
        verified: 0,
        verify_skipped: 0,
    };
    let mut rng = StdRng::seed_from_u64(
        shared
            .wl
            .seed
            .wrapping_add(id.wrapping_mul(0xA24B_AED4_963E_E407)),
    );
    while !shared.stop.load(Ordering::Relaxed) {
        let Some((epoch, idx)) = shared.schedule.next() else {
            break;
        };
        let epochs_mode = shared.wl.mode == Mode::Epochs;
        let epoch = if epochs_mode { epoch } else { 0 };
        // Wait until every request of the previous epochs has been answered.
        if epochs_mode {
            loop {
                let notified = shared.epoch_done.notified();
                if shared.released.load(Ordering::Acquire) >= epoch as u64
                    || shared.stop.load(Ordering::Relaxed)
                {
                    break;
                }
                notified.await;
            }
        }
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let is_put = shared.wl.pct_put > 0 && rng.gen_range(0..100u8) < shared.wl.pct_put;
        let start = Instant::now();
        let result = one_request(&shared, idx, is_put, &mut rng, start).await;
        let end = Instant::now();
        let done = shared.completed.fetch_add(1, Ordering::AcqRel) + 1;
        let n = shared.wl.objects.len() as u64;
        if epochs_mode && done.is_multiple_of(n) {
            // This request completed epoch `done / n - 1`: take the server's counters once
            // its fills have committed, then let the next epoch start.
            if shared.stats_on && !shared.stop.load(Ordering::Relaxed) {
                if let Some(s) = fetch_stats(&shared.wl.target, true).await {
                    lock(&shared.snapshots).push(s);
                }
            }
            shared.released.store(done / n, Ordering::Release);
            shared.epoch_done.notify_waiters();
        }
        if st.epochs.len() <= epoch {
            st.epochs.resize(epoch + 1, EpochCounts::default());
        }
        let e = &mut st.epochs[epoch];
        e.requests += 1;
        e.first_start = Some(e.first_start.map_or(start, |s| s.min(start)));
        e.last_end = Some(end);
        if is_put {
            e.puts += 1;
        } else {
            e.gets += 1;
        }
        shared.live_requests.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(done) => {
                let micros = |d: Duration| (d.as_micros() as u64).max(1);
                let _ = st.latency.record(micros(end - start));
                let _ = st.ttfb.record(micros(done.ttfb));
                if is_put {
                    e.bytes_written += done.bytes;
                } else {
                    e.bytes_read += done.bytes;
                    e.cache.count(done.cache.as_ref().map(|v| v.as_bytes()));
                }
                shared.live_bytes.fetch_add(done.bytes, Ordering::Relaxed);
                match done.verified {
                    Some(true) => st.verified += 1,
                    Some(false) => {
                        st.verified += 1;
                        e.errors += 1;
                        *st.errors.entry("verify".into()).or_default() += 1;
                        shared.live_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    None if shared.wl.verify => st.verify_skipped += 1,
                    None => {}
                }
            }
            Err(kind) => {
                e.errors += 1;
                *st.errors.entry(kind).or_default() += 1;
                shared.live_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    st
}

struct Done {
    bytes: u64,
    ttfb: Duration,
    cache: Option<http::HeaderValue>,
    /// `Some(matched)` when the MD5 was compared with the ETag.
    verified: Option<bool>,
}

/// One GET or PUT; the error is the label it is counted under (a status code or `io`).
async fn one_request(
    shared: &Shared,
    idx: usize,
    is_put: bool,
    rng: &mut StdRng,
    start: Instant,
) -> Result<Done, String> {
    let wl = &shared.wl;
    let obj = &wl.objects[idx];
    let method = if is_put { Method::PUT } else { Method::GET };
    let mut req = match &wl.target.signer {
        Some(_) => wl.target.builder(method, &shared.paths[idx], &[]),
        // Unsigned: the URI parsed once per object, cloned per request.
        None => http::Request::builder()
            .method(method)
            .uri(shared.uris[idx].clone()),
    };
    let mut body = Bytes::new();
    let mut ranged = false;
    if is_put {
        let off = (idx * 61) % PUT_WINDOW;
        body = shared.put_data.slice(off..off + obj.size as usize);
    } else {
        if let Some(r) = wl.range_size.filter(|&r| r > 0 && obj.size > 0) {
            let len = r.min(obj.size);
            let first = rng.gen_range(0..=obj.size - len);
            req = req.header(
                header::RANGE,
                format!("bytes={}-{}", first, first + len - 1),
            );
            ranged = true;
        }
    }
    let sent_md5 = (is_put && wl.verify).then(|| hex(&Md5::digest(&body)));
    let sent = body.len() as u64;
    let req = req
        .body(Full::new(body))
        .map_err(|_| "request".to_string())?;
    let resp = wl
        .target
        .client
        .request(req)
        .await
        .map_err(|_| "io".to_string())?;
    let status = resp.status();
    let cache = resp.headers().get("x-granary-cache").cloned();
    let etag = wl
        .verify
        .then(|| resp.headers().get(header::ETAG))
        .flatten()
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().trim_matches('"').to_ascii_lowercase());
    let mut body = resp.into_body();
    let mut ttfb = None;
    let mut n = 0u64;
    let mut md5 = (wl.verify && !is_put && !ranged && status == StatusCode::OK).then(Md5::new);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| "io".to_string())?;
        if let Ok(data) = frame.into_data() {
            if ttfb.is_none() {
                ttfb = Some(start.elapsed());
            }
            n += data.len() as u64;
            if let Some(h) = md5.as_mut() {
                h.update(&data);
            }
        }
    }
    if !status.is_success() {
        return Err(status.as_u16().to_string());
    }
    let plain_md5 = etag.filter(|e| e.len() == 32 && e.bytes().all(|b| b.is_ascii_hexdigit()));
    let verified = match (plain_md5, md5, sent_md5) {
        (Some(e), Some(h), _) => Some(hex(&h.finalize()) == e),
        (Some(e), None, Some(s)) => Some(s == e),
        _ => None,
    };
    Ok(Done {
        bytes: if is_put { sent } else { n },
        ttfb: ttfb.unwrap_or_else(|| start.elapsed()),
        cache,
        verified,
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn each_epoch_is_a_permutation() {
        for n in [1usize, 2, 17, 1000] {
            for e in 0..4 {
                let mut o = epoch_order(n, 42, e);
                o.sort_unstable();
                assert_eq!(o, (0..n as u32).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn epochs_differ_and_repeat_with_the_seed() {
        let a: Vec<_> = (0..5).map(|e| epoch_order(100, 7, e)).collect();
        let b: Vec<_> = (0..5).map(|e| epoch_order(100, 7, e)).collect();
        assert_eq!(a, b, "same seed, same sequence of orders");
        let distinct: HashSet<_> = a.iter().collect();
        assert_eq!(distinct.len(), 5, "every epoch has its own order");
        assert_ne!(epoch_order(100, 8, 0), a[0], "another seed, another order");
    }

    #[test]
    fn schedule_visits_every_object_once_per_epoch() {
        let s = Schedule::new(50, 3, Some(3));
        let mut seen = vec![vec![0u32; 50]; 3];
        let mut count = 0;
        while let Some((e, i)) = s.next() {
            seen[e][i] += 1;
            count += 1;
        }
        assert_eq!(count, 150);
        assert!(seen.iter().all(|ep| ep.iter().all(|&c| c == 1)));
        assert_eq!(s.next(), None);
        assert_eq!(Schedule::new(0, 3, None).next(), None);
    }

    #[test]
    fn schedule_follows_the_epoch_orders() {
        let s = Schedule::new(10, 9, Some(2));
        let got: Vec<_> = std::iter::from_fn(|| s.next()).collect();
        let want: Vec<_> = (0..2)
            .flat_map(|e| {
                epoch_order(10, 9, e)
                    .into_iter()
                    .map(move |i| (e, i as usize))
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn cache_ratio() {
        let mut c = CacheCounts::default();
        assert_eq!(c.hit_ratio(), None);
        for v in [&b"hit"[..], b"hit", b"hit", b"miss"] {
            c.count(Some(v));
        }
        c.count(None);
        assert_eq!(c.hit_ratio(), Some(0.75));
        assert_eq!(c.none, 1);
    }
}
