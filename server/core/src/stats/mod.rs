//! This node's counters and gauges, declared once in the table below: each row is a
//! [`Metric`] with its name in `/_granary/stats` (JSON), its Prometheus name (every
//! series labelled with the node's id), its kind and its help. Request paths bump
//! counters lock-free ([`Stats::add`]); a [`Snapshot`] holds every row's value at one
//! moment (counters read, gauges sampled by the node), and both views are made from it:
//! the JSON fields ([`Snapshot::json`]) and the Prometheus exposition
//! ([`Snapshot::exposition`], written by `prometheus-client`).

mod exposition;

use std::sync::atomic::{AtomicU64, Ordering};

/// What a row counts, and so how each view shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A count that only grows.
    Counter,
    /// Microseconds that only grow: seconds in both views.
    Seconds,
    /// A level sampled when the snapshot is taken.
    Gauge,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub metric: Metric,
    pub kind: Kind,
    /// The field of `/_granary/stats`.
    pub json: &'static str,
    /// The Prometheus name, after `granary_` (counters get `_total`).
    pub name: &'static str,
    pub help: &'static str,
}

macro_rules! table {
    ($( $(#[$doc:meta])* $metric:ident: $kind:ident, $json:literal, $name:literal, $help:literal; )*) => {
        /// Every value a node reports, in table order.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Metric { $( $(#[$doc])* $metric, )* }

        /// The table: `ROWS[m as usize]` describes `m`.
        pub const ROWS: &[Row] = &[ $( Row {
            metric: Metric::$metric,
            kind: Kind::$kind,
            json: $json,
            name: $name,
            help: $help,
        }, )* ];
    };
}

table! {
    Requests: Counter, "requests", "requests", "HTTP requests answered";
    Errors: Counter, "errors", "errors", "requests answered with 4xx or 5xx";
    ServerErrors: Counter, "server_errors", "server_errors", "requests answered with 5xx";
    /// Client requests answered with an error because the backend failed them.
    BackendErrors: Counter, "backend_errors", "backend_errors",
        "requests failed by the backend (unreachable, erring, refusing access, slowing down)";
    /// Copies handed to their owners by a rebalance pass or a drain.
    BytesHandedOver: Counter, "bytes_handed_over", "handed_over_bytes",
        "bytes of copies handed to their owners (rebalance, drain)";
    /// Object reads answered from this node's committed cache.
    Hits: Counter, "hits", "cache_hits", "object reads from this node's cache";
    /// Object reads filled from the backend into the cache.
    Misses: Counter, "misses", "cache_misses", "object reads filled from the backend";
    PeerFills: Counter, "peer_fills", "cache_peer_fills", "object reads filled from a peer";
    /// Object reads served from the backend without admission.
    Bypasses: Counter, "bypasses", "cache_bypasses", "object reads served without admission";
    /// Response body bytes sent, all routes.
    BytesServed: Counter, "bytes_served", "bytes_served", "response body bytes sent";
    /// Request body bytes written to the backend.
    BytesReceived: Counter, "bytes_received", "bytes_received", "request body bytes stored";
    BytesFromBackend: Counter, "bytes_from_backend", "backend_bytes", "bytes read from the backend";
    BytesFromPeers: Counter, "bytes_from_peers", "peer_bytes", "bytes read from peers";
    BytesToPeers: Counter, "bytes_to_peers", "peer_bytes_sent",
        "bytes of cached objects sent to peers filling from this node";
    PeerServes: Counter, "peer_serves", "peer_serves",
        "peer fills answered from this node's cache";
    /// Client requests forwarded to the key's owner.
    Proxied: Counter, "proxied", "proxied", "requests forwarded to the key's owner";
    Redirects: Counter, "redirects", "redirects", "requests answered 307 to the key's owner";
    /// Transforms computed (cache misses of a transformed read).
    TransformsRun: Counter, "transforms_run", "transforms", "transforms computed";
    TransformHits: Counter, "transform_hits", "transform_hits",
        "transformed reads answered from a cached result";
    /// Transforms that failed (bad input, a command's failure, time or size limits).
    TransformErrors: Counter, "transform_errors", "transform_errors", "transforms that failed";
    /// This process's threads for built-in transforms, and (sampled) the user and system
    /// time of transform commands.
    TransformCpu: Seconds, "transform_cpu_seconds", "transform_cpu_seconds",
        "CPU time spent in transforms";
    /// Samples prepared by a pipeline (`?pipeline=`).
    PrepSamples: Counter, "prep_samples", "prep_samples", "samples prepared by pipelines";
    /// Answers served from a preparation made for another request.
    PrepShared: Counter, "prep_shared", "prep_shared",
        "prepared samples served from a preparation made for another request";
    /// Samples a pipeline could not prepare (undecodable or oversized input).
    PrepErrors: Counter, "prep_errors", "prep_errors", "samples a pipeline could not prepare";
    /// The prep threads' CPU time.
    PrepCpu: Seconds, "prep_cpu_seconds", "prep_cpu_seconds",
        "CPU time spent preparing samples";
    /// Preparations stopped between two steps: every request waiting for them had gone.
    PrepCancelled: Counter, "prep_cancelled", "prep_cancelled",
        "preparations stopped because nobody waited for them any more";
    /// Sampled from the prep pool.
    PrepRunning: Gauge, "prep_running", "prep_running",
        "preparations running on the prep threads now";
    /// Sampled from the prep pool: at most `--prep-threads`.
    PrepRunningPeak: Gauge, "prep_running_peak", "prep_running_peak",
        "the most preparations that ran at once since the node started";
    /// Sampled from the prep pool.
    PrepAdmittedBytes: Gauge, "prep_admitted_bytes", "prep_admitted_bytes",
        "bytes of the prep memory budget held by inputs and work";
    PrepBudgetBytes: Gauge, "prep_budget_bytes", "prep_budget_bytes",
        "the prep memory budget: 1 GiB plus 64 MiB per prep thread";
    /// Sampled: preparations requests wait for, one each however many wait.
    PrepUnderWay: Gauge, "prep_under_way", "prep_under_way",
        "preparations under way that requests wait for";
    /// Object reads answered with a descriptor of the cache file (over the Unix socket).
    LocalReads: Counter, "local_reads", "local_reads",
        "object reads answered with a descriptor of the cache file";
    /// Sampled from the sendfile path's own count.
    BytesSentFromFiles: Counter, "bytes_sent_from_files", "bytes_sent_from_files",
        "bytes of cache hits that left with sendfile, not copied through the node";
    /// Requests refused with `503 SlowDown` at `--max-requests`.
    Slowdowns: Counter, "slowdowns", "slowdowns",
        "requests refused with 503 SlowDown at the request limit";
    TarIndexesBuilt: Counter, "tar_indexes_built", "tar_indexes_built",
        "shard member indexes built";
    ShardsIndexed: Counter, "shards_indexed", "shards_indexed",
        "shards indexed for datasets' catalogs";
    CatalogsBuilt: Counter, "catalogs_built", "catalogs_built",
        "datasets' catalogs built (once per version)";
    BytesPlanned: Counter, "bytes_planned", "planned_fetch_bytes",
        "bytes fetched from the backend ahead of the plans that need them";
    PlannedFetches: Counter, "planned_fetches", "planned_fetches",
        "objects fetched ahead of the plans that need them (counted among the misses)";
    HitChecks: Counter, "hit_checks", "cache_hit_checks",
        "cached copies checked against the backend before a hit (revalidation, trust)";
    BytesChecked: Counter, "bytes_checked", "hit_checked_bytes",
        "bytes of hits checked against their CRC32C as they left";
    BytesCheckedEarlier: Counter, "bytes_checked_earlier", "hit_checked_earlier_bytes",
        "bytes of checked hits sent from memory checked since it came from the disk";
    BytesEvicted: Counter, "bytes_evicted", "evicted_bytes",
        "bytes of planned entries dropped for ones needed sooner";
    /// Sampled.
    ProcessCpu: Seconds, "process_cpu_seconds", "process_cpu_seconds",
        "user and system CPU time of the node";
    UsedBytes: Gauge, "used_bytes", "cache_used_bytes", "bytes of object data in the cache";
    ReservedBytes: Gauge, "reserved_bytes", "cache_reserved_bytes",
        "bytes reserved by fills in progress";
    CapacityBytes: Gauge, "capacity_bytes", "cache_capacity_bytes", "bytes the cache may hold";
    Objects: Gauge, "objects", "cache_objects", "objects in the cache";
    /// Page-cache pages, counted in the node's RSS as file pages.
    MappedBytes: Gauge, "mapped_bytes", "cache_mapped_bytes",
        "bytes of cache files kept mapped between hits";
    /// Of those, the pages of sealed windows: locked in memory, checked.
    LockedBytes: Gauge, "locked_bytes", "cache_locked_bytes",
        "bytes of cache files locked in memory, checked, sent with no further check";
    DiskFreeBytes: Gauge, "disk_free_bytes", "cache_disk_free_bytes",
        "bytes free on the cache's filesystem";
    Plans: Gauge, "plans", "plans", "jobs' plans this node holds";
    PrefetchJobs: Gauge, "prefetch_jobs", "prefetch_jobs_running",
        "prefetch jobs this node coordinates that are running";
    Members: Gauge, "members", "cluster_members", "members in this node's list, itself included";
    MembersUp: Gauge, "members_up", "cluster_members_up",
        "members this node sees up, itself included";
    /// 0 serving, 1 draining, 2 drained.
    DrainState: Gauge, "drain_state", "drain_state",
        "this node's part in the cluster: 0 serving, 1 draining, 2 drained";
    HandoverBytesLeft: Gauge, "handover_bytes_left", "handover_bytes_left",
        "bytes of this node's running hand-over (rebalance, drain) not yet with their owners";
}

/// How many rows the table has.
pub const METRICS: usize = ROWS.len();

impl Metric {
    pub fn row(self) -> &'static Row {
        &ROWS[self as usize]
    }
}

/// Upper bounds (seconds) of the request latency histogram's buckets; `+Inf` follows.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The histogram's name (after `granary_`) and help.
const LATENCY: (&str, &str) = (
    "request_duration_seconds",
    "request time, first byte in to last byte out",
);

/// Request latency (first byte in to last byte out), as a Prometheus histogram.
#[derive(Debug, Default)]
struct Latency {
    /// Per bucket, not cumulative; the last is `+Inf`.
    counts: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_us: AtomicU64,
}

impl Latency {
    fn record(&self, secs: f64) {
        let i = LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((secs * 1e6) as u64, Ordering::Relaxed);
    }

    /// Cumulative counts per bucket (the last is the total), and the sum in seconds.
    fn cumulative(&self) -> Histogram {
        let mut acc = 0;
        let counts = self
            .counts
            .iter()
            .map(|c| {
                acc += c.load(Ordering::Relaxed);
                acc
            })
            .collect();
        Histogram {
            counts,
            sum: self.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

/// A histogram at one moment: cumulative counts per bucket of [`LATENCY_BUCKETS`] (the
/// last, `+Inf`, is the total), and the sum of what was observed.
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    pub counts: Vec<u64>,
    pub sum: f64,
}

/// The node's counters, updated lock-free on the request path.
#[derive(Debug)]
pub struct Stats {
    values: [AtomicU64; METRICS],
    latency: Latency,
}

impl Default for Stats {
    fn default() -> Stats {
        Stats {
            values: std::array::from_fn(|_| AtomicU64::new(0)),
            latency: Latency::default(),
        }
    }
}

impl Stats {
    /// Adds `n` to a counter (microseconds, for a row in seconds).
    pub fn add(&self, m: Metric, n: u64) {
        debug_assert!(m.row().kind != Kind::Gauge, "{m:?} is sampled, not counted");
        self.values[m as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// A counter's value now.
    pub fn get(&self, m: Metric) -> u64 {
        self.values[m as usize].load(Ordering::Relaxed)
    }

    /// Records a request's time.
    pub fn record_latency(&self, secs: f64) {
        self.latency.record(secs);
    }

    /// Every counter now; gauges and sampled rows are the caller's to set.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            values: std::array::from_fn(|i| self.values[i].load(Ordering::Relaxed)),
            latency: self.latency.cumulative(),
        }
    }
}

/// Every row's value at one moment, and the latency histogram.
#[derive(Debug, Clone)]
pub struct Snapshot {
    values: [u64; METRICS],
    latency: Histogram,
}

impl Snapshot {
    pub fn get(&self, m: Metric) -> u64 {
        self.values[m as usize]
    }

    pub fn set(&mut self, m: Metric, v: u64) {
        self.values[m as usize] = v;
    }

    pub fn latency(&self) -> &Histogram {
        &self.latency
    }

    /// Every row as `/_granary/stats` names it: counts and gauges as integers, times
    /// in seconds.
    pub fn json(&self) -> serde_json::Map<String, serde_json::Value> {
        ROWS.iter()
            .map(|r| {
                let v = self.get(r.metric);
                let v = match r.kind {
                    Kind::Seconds => serde_json::json!(v as f64 / 1e6),
                    Kind::Counter | Kind::Gauge => serde_json::json!(v),
                };
                (r.json.to_owned(), v)
            })
            .collect()
    }

    /// The Prometheus exposition of every row and the latency histogram, each series
    /// labelled `node="ID"`, in `format`.
    pub fn exposition(&self, node: &str, format: Exposition) -> String {
        let om = exposition::write(self, node);
        match format {
            Exposition::OpenMetrics => om,
            Exposition::Text => exposition::to_text(&om),
        }
    }
}

/// The two formats a scraper may ask for: Prometheus text (0.0.4) unless its `Accept`
/// names OpenMetrics, as Prometheus's own client libraries answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposition {
    /// `text/plain; version=0.0.4`.
    Text,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Exposition {
    /// The format an `Accept` header asks for: OpenMetrics where one of its media
    /// ranges names it with a weight above 0, else Prometheus text.
    pub fn accepting(accept: Option<&str>) -> Exposition {
        let wants_om = accept.unwrap_or("").split(',').any(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("");
            let q = parts
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.parse::<f64>().ok())
                .unwrap_or(1.0);
            media.eq_ignore_ascii_case("application/openmetrics-text") && q > 0.0
        });
        if wants_om {
            Exposition::OpenMetrics
        } else {
            Exposition::Text
        }
    }

    /// Its Content-Type.
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::Text => "text/plain; version=0.0.4; charset=utf-8",
            Exposition::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// User and system CPU time of this process (`libc::RUSAGE_SELF`) or of its waited-for
/// children (`libc::RUSAGE_CHILDREN`), in microseconds.
pub fn rusage_us(who: libc::c_int) -> u64 {
    // SAFETY: getrusage writes only into the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only into the struct it is given.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(ru.ru_utime) + us(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_order_and_its_names_are_unique() {
        for (i, r) in ROWS.iter().enumerate() {
            assert_eq!(r.metric as usize, i, "{:?}", r.metric);
            assert!(!r.help.is_empty());
        }
        let mut json: Vec<_> = ROWS.iter().map(|r| r.json).collect();
        let mut names: Vec<_> = ROWS.iter().map(|r| r.name).collect();
        names.push(LATENCY.0);
        for list in [&mut json, &mut names] {
            let n = list.len();
            list.sort();
            list.dedup();
            assert_eq!(list.len(), n, "a name is used twice");
        }
    }

    #[test]
    fn latency_buckets_are_cumulative() {
        let s = Stats::default();
        s.record_latency(0.0001);
        s.record_latency(0.003);
        s.record_latency(20.0);
        let h = s.snapshot().latency;
        assert_eq!(h.counts[0], 1);
        assert_eq!(h.counts[3], 2, "0.003 falls in the 0.005 bucket");
        assert_eq!(*h.counts.last().unwrap(), 3);
        assert!((h.sum - 20.0031).abs() < 1e-3);
    }

    #[test]
    fn both_views_come_from_one_snapshot() {
        let s = Stats::default();
        s.add(Metric::Hits, 3);
        s.add(Metric::TransformCpu, 1_500_000);
        s.record_latency(0.002);
        let mut snap = s.snapshot();
        snap.set(Metric::UsedBytes, 4096);
        let j = snap.json();
        assert_eq!(j["hits"], 3);
        assert_eq!(j["transform_cpu_seconds"], 1.5);
        assert_eq!(j["used_bytes"], 4096);
        assert_eq!(j["misses"], 0);
        assert_eq!(j.len(), METRICS);
        let has_lines = |text: &str, lines: &[&str]| {
            for line in lines {
                assert!(text.lines().any(|l| l == *line), "no `{line}` in:\n{text}");
            }
        };
        let text = snap.exposition("n1", Exposition::OpenMetrics);
        has_lines(
            &text,
            &[
                "# TYPE granary_cache_hits counter",
                "granary_cache_hits_total{node=\"n1\"} 3",
                "granary_transform_cpu_seconds_total{node=\"n1\"} 1.5",
                "# TYPE granary_cache_used_bytes gauge",
                "granary_cache_used_bytes{node=\"n1\"} 4096",
                "granary_cache_misses_total{node=\"n1\"} 0",
                "# TYPE granary_request_duration_seconds histogram",
                "granary_request_duration_seconds_bucket{node=\"n1\",le=\"0.0025\"} 1",
                "granary_request_duration_seconds_bucket{node=\"n1\",le=\"+Inf\"} 1",
                "granary_request_duration_seconds_count{node=\"n1\"} 1",
                "# EOF",
            ],
        );
        // Prometheus text: a counter's family is named as its samples, no `# EOF`.
        let plain = snap.exposition("n1", Exposition::Text);
        has_lines(
            &plain,
            &[
                "# TYPE granary_cache_hits_total counter",
                "granary_cache_hits_total{node=\"n1\"} 3",
                "# TYPE granary_cache_used_bytes gauge",
                "# TYPE granary_request_duration_seconds histogram",
                "granary_request_duration_seconds_count{node=\"n1\"} 1",
            ],
        );
        assert!(!plain.contains("# EOF") && !plain.contains("# TYPE granary_cache_hits counter"));
        let help = plain.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(
            help,
            text.lines().filter(|l| l.starts_with("# HELP ")).count()
        );
    }

    #[test]
    fn the_scraper_chooses_the_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(
            Exposition::accepting(Some(prometheus)),
            Exposition::OpenMetrics
        );
        assert_eq!(
            Exposition::accepting(Some("Application/OpenMetrics-Text")),
            Exposition::OpenMetrics
        );
        assert_eq!(
            Exposition::accepting(Some("text/plain; version=0.0.4")),
            Exposition::Text
        );
        assert_eq!(
            Exposition::accepting(Some("application/openmetrics-text; q=0")),
            Exposition::Text
        );
        assert_eq!(Exposition::accepting(Some("*/*")), Exposition::Text);
        assert_eq!(Exposition::accepting(None), Exposition::Text);
    }
}
