//! The figures of a run: one serde `Report` written by `--json`, and the human summary.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use granary_proto::units::fmt_bytes;

use crate::stall::Stall;
use crate::stats::{ServerStats, STATS_FIELDS};
use crate::workload::{CacheCounts, Measured, Sample};

/// What the run was asked to do, echoed into the report.
#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    pub endpoint: String,
    pub bucket: String,
    pub prefix: String,
    pub objects: usize,
    pub object_bytes_total: u64,
    pub workers: usize,
    pub pct_put: u8,
    pub epochs: Option<u64>,
    pub duration_s: Option<f64>,
    pub range_size: Option<u64>,
    pub verify: bool,
    pub seed: u64,
}

/// Percentiles of a histogram, microseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Percentiles {
    pub count: u64,
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Self {
        Percentiles {
            count: h.len(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        }
    }
}

/// One point of a latency distribution.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Quantile {
    /// 0..=100.
    pub percentile: f64,
    pub micros: u64,
}

/// The percentiles a distribution is reported at (and plotted over).
pub const DISTRIBUTION: [f64; 16] = [
    0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.99, 100.0,
];

/// A histogram at [`DISTRIBUTION`]'s percentiles; empty when it holds nothing.
pub fn distribution(h: &Histogram<u64>) -> Vec<Quantile> {
    if h.is_empty() {
        return Vec::new();
    }
    DISTRIBUTION
        .iter()
        .map(|&p| Quantile {
            percentile: p,
            micros: if p >= 100.0 {
                h.max()
            } else {
                h.value_at_quantile(p / 100.0)
            },
        })
        .collect()
}

/// One epoch's figures.
#[derive(Debug, Clone, Serialize)]
pub struct EpochReport {
    /// 1-based.
    pub epoch: usize,
    pub requests: u64,
    pub gets: u64,
    pub puts: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
    pub elapsed_s: f64,
    /// (bytes read + bytes written) / elapsed, MB/s.
    pub throughput_mb_s: f64,
    pub cache: CacheCounts,
    /// hit / (hit + miss + peer + bypass); null when no GET carried `x-granary-cache`.
    pub hit_ratio: Option<f64>,
    /// GPU stall for this epoch's read throughput (with `--gpus`).
    pub stall: Option<Stall>,
    /// Granary's counters over this epoch (its fills committed); null without
    /// `/_granary/stats` or for an epoch a duration run cut short.
    pub server_stats_delta: Option<ServerStats>,
}

/// The GPU consumer group of the stall analysis.
#[derive(Debug, Clone, Serialize)]
pub struct GpuConfig {
    pub gpus: u32,
    pub gpu_rate_mb_s: f64,
}

/// Errors of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Errors {
    pub total: u64,
    /// By HTTP status, `io` for transport failures, `verify` for MD5/ETag mismatches.
    pub by_status: BTreeMap<String, u64>,
}

/// `--verify` outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Verify {
    pub checked: u64,
    pub mismatched: u64,
    /// Answers that could not be checked (multipart ETag, range reads, no ETag).
    pub skipped: u64,
}

/// Everything a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub config: RunConfig,
    pub elapsed_s: f64,
    pub requests: u64,
    pub gets: u64,
    pub puts: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub throughput_mb_s: f64,
    pub read_throughput_mb_s: f64,
    pub write_throughput_mb_s: f64,
    pub requests_per_s: f64,
    pub latency_us: Percentiles,
    pub ttfb_us: Percentiles,
    /// Latency at [`DISTRIBUTION`]'s percentiles, microseconds.
    pub latency_distribution: Vec<Quantile>,
    pub ttfb_distribution: Vec<Quantile>,
    /// Throughput every 250 ms.
    pub timeline: Vec<Sample>,
    pub errors: Errors,
    pub verify: Option<Verify>,
    pub cache: CacheCounts,
    pub hit_ratio: Option<f64>,
    pub epochs: Vec<EpochReport>,
    /// after − before of Granary's `/_granary/stats`; null when the endpoint has none.
    pub server_stats_delta: Option<BTreeMap<String, i64>>,
    pub gpu: Option<GpuConfig>,
    /// Overall stall for the run's read throughput (with `--gpus`).
    pub stall: Option<Stall>,
    /// The server's CPU over the run (with `--server-pid`).
    pub server_cpu: Option<ServerCpu>,
    /// The bench's own CPU over the run (the reading side), with `--server-pid`.
    pub client_cpu: Option<ServerCpu>,
}

/// CPU time of the server's processes over a run, and per GiB read.
#[derive(Debug, Clone, Serialize)]
pub struct ServerCpu {
    pub pids: Vec<u32>,
    pub cpu_s: f64,
    pub cpu_s_per_gib: f64,
}

impl ServerCpu {
    pub fn new(pids: &[u32], cpu_s: f64, bytes_read: u64) -> ServerCpu {
        let gib = bytes_read as f64 / (1u64 << 30) as f64;
        ServerCpu {
            pids: pids.to_vec(),
            cpu_s,
            cpu_s_per_gib: if gib > 0.0 { cpu_s / gib } else { 0.0 },
        }
    }
}

/// The CPU time (user + system) of some processes, all their threads, from /proc.
pub fn cpu_seconds(pids: &[u32]) -> std::io::Result<f64> {
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut ticks = 0u64;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the command's closing parenthesis: utime and stime are 14 and 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        for i in [11, 12] {
            ticks += f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    Ok(ticks as f64 / tick)
}

/// The server's CPU time at the start of a run; `finish` gives what the run used.
pub struct CpuProbe {
    pids: Vec<u32>,
    start: f64,
}

impl CpuProbe {
    pub fn start(pids: &[u32]) -> std::io::Result<CpuProbe> {
        Ok(CpuProbe {
            pids: pids.to_vec(),
            start: cpu_seconds(pids)?,
        })
    }

    /// Seconds used since `start`; `None` without processes to watch.
    pub fn finish(self) -> std::io::Result<Option<f64>> {
        if self.pids.is_empty() {
            return Ok(None);
        }
        Ok(Some(cpu_seconds(&self.pids)? - self.start))
    }
}

impl Report {
    /// Assembles the report; `gpu` is `(gpus, bytes/s each)`.
    pub fn build(
        config: RunConfig,
        m: &Measured,
        stats_delta: Option<BTreeMap<String, i64>>,
        gpu: Option<(u32, f64)>,
    ) -> Self {
        let secs = m.elapsed.as_secs_f64().max(1e-9);
        let sum = |f: fn(&crate::workload::EpochCounts) -> u64| m.epochs.iter().map(f).sum::<u64>();
        let (requests, gets, puts) = (sum(|e| e.requests), sum(|e| e.gets), sum(|e| e.puts));
        let (bytes_read, bytes_written) = (sum(|e| e.bytes_read), sum(|e| e.bytes_written));
        let mut cache = CacheCounts::default();
        let epochs: Vec<EpochReport> = m
            .epochs
            .iter()
            .enumerate()
            .map(|(i, e)| {
                cache.add(&e.cache);
                let el = e.elapsed();
                let rate = |b: u64| if el > 0.0 { b as f64 / el } else { 0.0 };
                EpochReport {
                    epoch: i + 1,
                    requests: e.requests,
                    gets: e.gets,
                    puts: e.puts,
                    bytes_read: e.bytes_read,
                    bytes_written: e.bytes_written,
                    errors: e.errors,
                    elapsed_s: el,
                    throughput_mb_s: rate(e.bytes_read + e.bytes_written) / 1e6,
                    cache: e.cache,
                    hit_ratio: e.cache.hit_ratio(),
                    stall: gpu.map(|(n, r)| Stall::new(rate(e.bytes_read), n, r)),
                    server_stats_delta: match (m.epoch_stats.get(i), m.epoch_stats.get(i + 1)) {
                        (Some(b), Some(a)) => Some(crate::stats::stats_delta(b, a)),
                        _ => None,
                    },
                }
            })
            .collect();
        let errors_total = m.errors.values().sum();
        Report {
            elapsed_s: secs,
            requests,
            gets,
            puts,
            bytes_read,
            bytes_written,
            throughput_mb_s: (bytes_read + bytes_written) as f64 / secs / 1e6,
            read_throughput_mb_s: bytes_read as f64 / secs / 1e6,
            write_throughput_mb_s: bytes_written as f64 / secs / 1e6,
            requests_per_s: requests as f64 / secs,
            latency_us: Percentiles::of(&m.latency),
            ttfb_us: Percentiles::of(&m.ttfb),
            latency_distribution: distribution(&m.latency),
            ttfb_distribution: distribution(&m.ttfb),
            timeline: m.timeline.clone(),
            errors: Errors {
                total: errors_total,
                by_status: m.errors.clone(),
            },
            verify: config.verify.then(|| Verify {
                checked: m.verified,
                mismatched: m.errors.get("verify").copied().unwrap_or(0),
                skipped: m.verify_skipped,
            }),
            hit_ratio: cache.hit_ratio(),
            cache,
            epochs,
            server_stats_delta: stats_delta,
            gpu: gpu.map(|(gpus, r)| GpuConfig {
                gpus,
                gpu_rate_mb_s: r / 1e6,
            }),
            stall: gpu.map(|(n, r)| Stall::new(bytes_read as f64 / secs, n, r)),
            server_cpu: None,
            client_cpu: None,
            config,
        }
    }

    /// The human summary printed at the end of a run.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let c = &self.config;
        let _ = writeln!(
            s,
            "granary-bench: {} objects ({}) in {}/{}{}, {} workers, {}% PUT{}",
            c.objects,
            fmt_bytes(c.object_bytes_total),
            c.endpoint,
            c.bucket,
            if c.prefix.is_empty() {
                String::new()
            } else {
                format!(" prefix {}", c.prefix)
            },
            c.workers,
            c.pct_put,
            c.range_size
                .map_or(String::new(), |r| format!(", ranges of {}", fmt_bytes(r))),
        );
        let _ = writeln!(
            s,
            "  {} requests ({} GET, {} PUT) in {:.2}s: {:.1} MB/s ({:.1} read, {:.1} write), {:.0} req/s",
            self.requests, self.gets, self.puts, self.elapsed_s, self.throughput_mb_s,
            self.read_throughput_mb_s, self.write_throughput_mb_s, self.requests_per_s
        );
        if let Some(cpu) = &self.server_cpu {
            let _ = writeln!(
                s,
                "  server CPU: {:.2}s, {:.3} s/GiB read (pids {:?})",
                cpu.cpu_s, cpu.cpu_s_per_gib, cpu.pids
            );
        }
        if let Some(cpu) = &self.client_cpu {
            let _ = writeln!(
                s,
                "  bench CPU: {:.2}s, {:.3} s/GiB read",
                cpu.cpu_s, cpu.cpu_s_per_gib
            );
        }
        let _ = writeln!(
            s,
            "  bytes: {} read, {} written",
            fmt_bytes(self.bytes_read),
            fmt_bytes(self.bytes_written)
        );
        let ms = |us: u64| us as f64 / 1e3;
        let l = &self.latency_us;
        let _ = writeln!(
            s,
            "  latency ms: p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}   first byte ms: p50 {:.2}  p99 {:.2}",
            ms(l.p50), ms(l.p90), ms(l.p99), ms(l.max), ms(self.ttfb_us.p50), ms(self.ttfb_us.p99)
        );
        if self.errors.total > 0 {
            let by: Vec<String> = self
                .errors
                .by_status
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let _ = writeln!(s, "  errors: {} ({})", self.errors.total, by.join(", "));
        } else {
            let _ = writeln!(s, "  errors: 0");
        }
        if let Some(v) = &self.verify {
            let _ = writeln!(
                s,
                "  verify: {} checked, {} mismatched, {} not checkable",
                v.checked, v.mismatched, v.skipped
            );
        }
        let ratio = |r: Option<f64>| r.map_or("n/a".to_string(), |r| format!("{r:.3}"));
        let per_epoch_stats = self.epochs.iter().any(|e| e.server_stats_delta.is_some());
        let _ = writeln!(
            s,
            "  epoch  requests   MB/s      secs   hit/miss/peer/bypass   hit ratio{}{}",
            if per_epoch_stats { "   backend MB" } else { "" },
            if self.stall.is_some() { "   stall" } else { "" }
        );
        const SHOWN: usize = 20;
        for e in self.epochs.iter().take(SHOWN) {
            let backend = match (&e.server_stats_delta, per_epoch_stats) {
                (Some(d), _) => format!(
                    "   {:>10.1}",
                    d.get("bytes_from_backend").copied().unwrap_or(0) as f64 / 1e6
                ),
                (None, true) => format!("   {:>10}", "n/a"),
                (None, false) => String::new(),
            };
            let _ = writeln!(
                s,
                "  {:>5}  {:>8}  {:>8.1}  {:>7.2}   {:>20}   {:>9}{backend}{}",
                e.epoch,
                e.requests,
                e.throughput_mb_s,
                e.elapsed_s,
                format!(
                    "{}/{}/{}/{}",
                    e.cache.hit, e.cache.miss, e.cache.peer, e.cache.bypass
                ),
                ratio(e.hit_ratio),
                e.stall
                    .as_ref()
                    .map_or(String::new(), |st| format!("   {:.3}", st.stall_fraction)),
            );
        }
        if self.epochs.len() > SHOWN {
            let _ = writeln!(s, "  … {} more epochs in --json", self.epochs.len() - SHOWN);
        }
        let _ = writeln!(s, "  overall hit ratio: {}", ratio(self.hit_ratio));
        if let Some(d) = &self.server_stats_delta {
            let parts: Vec<String> = STATS_FIELDS
                .iter()
                .filter_map(|k| d.get(*k).map(|v| format!("{k} {v:+}")))
                .collect();
            let _ = writeln!(s, "  server stats delta: {}", parts.join(", "));
        }
        if let (Some(g), Some(st)) = (&self.gpu, &self.stall) {
            let _ = writeln!(
                s,
                "  stall: {} GPUs × {:.0} MB/s = {:.0} MB/s demand; read {:.1} MB/s -> waiting {:.1}% of the time; feeds at most {} GPUs",
                g.gpus, g.gpu_rate_mb_s, st.demand_mb_s, st.measured_mb_s, st.stall_fraction * 100.0, st.max_gpus
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        for v in 1..=100u64 {
            h.record(v * 1000).unwrap();
        }
        let p = Percentiles::of(&h);
        assert_eq!(p.count, 100);
        assert!(h.equivalent(p.p50, 50_000), "{}", p.p50);
        assert!(h.equivalent(p.p99, 99_000), "{}", p.p99);
        assert!(h.equivalent(p.max, 100_000), "{}", p.max);
    }
}
