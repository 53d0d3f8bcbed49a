//! `granary-bench`: a load generator and data-stall analyser for Granary and any HTTP
//! object server (nginx, S3-compatible stores such as moto or MinIO, signed with SigV4).
//!
//! `run` drives a GET/PUT mix over an object set for a number of shuffled epochs or a
//! duration and reports throughput, latency, cache outcomes per epoch, Granary's
//! counters and how long a GPU group would stall; `get` reads one object repeatedly.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use granary_bench::http::Target;
use granary_bench::listing::{generated, Object};
use granary_bench::report::{Report, RunConfig};
use granary_bench::size::{parse_duration, parse_rate, parse_size, parse_size_range, SizeRange};
use granary_bench::stats::{fetch_stats, stats_delta};
use granary_bench::workload::{self, Mode, Workload};
use granary_proto::sigv4::Signer;

#[derive(Parser)]
#[command(
    name = "granary-bench",
    version,
    about = "Load generator and data-stall analyser for Granary and any HTTP object server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Drive a GET/PUT workload over an object set for epochs or a duration.
    ///
    /// The object set is listed with ListObjectsV2 (default, or `--keys-from-list`) or
    /// named `PREFIX000000`, `PREFIX000001`, … with `--objects N --object-size SIZE`
    /// (for PUT workloads and servers that cannot list, such as nginx).
    Run(RunArgs),
    /// GET one object over and over and report MB/s, req/s and latency.
    Get(GetArgs),
    /// Simulate key placement over 10 to 1000 nodes with the node's own ring: load
    /// spread and the keys moved by a join and by a leave (no server needed).
    Ring(RingArgs),
    /// Simulate the planner at scale with the node's own planning code (plans, their
    /// exchange, schedule, ring and decisions) over simulated caches, backend and
    /// ranks (no server needed): epoch time against its bound, planned reads ready,
    /// plan-exchange bytes per member, CPU per planner look.
    PlanSim(PlanSimArgs),
    /// N random samples (members of the tar shards under a prefix) as one GetBatch
    /// against N single `?archpath=` GETs, sequential and in parallel (warm cache).
    Batch(BatchArgs),
    /// A first epoch over a cold prefix against a first epoch over a copy of it that
    /// `POST /_granary/prefetch` warmed beforehand.
    Prefetch(PrefetchArgs),
    /// Transformed reads (`?transform=`): first against repeated, and `--jobs` jobs
    /// sharing the node's results against the same jobs each transforming for itself.
    Transform(TransformArgs),
    /// One cached object read on the node's machine: HTTP over TCP loopback, HTTP over
    /// the node's Unix socket, and a local read (a descriptor of the cache file, mapped),
    /// with `--direct FILE` the page-cache ceiling: MB/s and CPU seconds per GiB.
    Local(LocalArgs),
    /// A warm object read into this process's memory by the client (`Client::get`,
    /// `Client::get_to_slice`) against a plain socket's `read(2)` into a preallocated
    /// buffer and against curl, the ways taking turns: MB/s and CPU seconds per GiB.
    Wire(WireArgs),
    /// A bounded soak: GETs, PUTs and DELETEs over a key space while the node (started
    /// by the bench with --granary) is killed and restarted; every byte read is checked
    /// against what was written, and the node's memory is sampled.
    Soak(SoakArgs),
    /// What a rebalance costs: a cluster (started by the bench over a data set it lays
    /// out) caches every object; a member joins and the others hand it its share (MB/s);
    /// then reads of random objects through every member are timed while nothing
    /// changes, and while another member joins (p50/p99 without and with).
    Rebalance(RebalanceArgs),
}

#[derive(Args)]
struct RebalanceArgs {
    /// The `granary` binary to start the members from.
    #[arg(long)]
    granary: PathBuf,
    /// An argument for every member's `granary serve` (repeat), e.g. --rebalance-rate.
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    serve_args: Vec<String>,
    /// Where the data set, the members' data directories and logs go.
    #[arg(long, default_value = "rebalance-bench")]
    dir: PathBuf,
    /// Members before the join.
    #[arg(long, default_value_t = 3)]
    members: usize,
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    object_size: u64,
    /// Reader threads.
    #[arg(long, default_value_t = 4)]
    readers: usize,
    /// How long reads are timed with nothing changing.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    steady: Duration,
    /// The longest the rebalance is waited for.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    limit: Duration,
    /// Write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct SoakArgs {
    /// The node, `http://host:port`.
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    endpoint: String,
    #[arg(long, default_value = "soak")]
    bucket: String,
    /// How long to run (`10m`).
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    duration: Duration,
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Keys in play (each worker owns an equal share).
    #[arg(long, default_value_t = 2000)]
    keys: usize,
    /// Object sizes are drawn from this range.
    #[arg(long, value_parser = parse_size_range, default_value = "1KiB-1MiB")]
    object_size: SizeRange,
    #[arg(long, default_value_t = 30)]
    pct_put: u32,
    #[arg(long, default_value_t = 10)]
    pct_delete: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Start the node from this binary (`granary`), kill and restart it, sample its RSS.
    #[arg(long)]
    granary: Option<PathBuf>,
    /// An argument for `granary serve` (repeat); its --listen must match --endpoint.
    #[arg(long = "serve-arg", allow_hyphen_values = true, requires = "granary")]
    serve_args: Vec<String>,
    /// The node's log file.
    #[arg(long, default_value = "soak-node.log")]
    node_log: PathBuf,
    /// SIGKILL and restart the node this often.
    #[arg(long, value_parser = parse_duration, requires = "granary")]
    restart_every: Option<Duration>,
    /// Start a cluster of N members instead of one node (listed in a peers file; each
    /// with its own data directory under --cluster-dir); --endpoint is not used.
    #[arg(
        long,
        value_name = "N",
        requires = "granary",
        conflicts_with = "restart_every"
    )]
    cluster: Option<usize>,
    /// Where the cluster's data directories, peers file and logs go.
    #[arg(long, default_value = "soak-cluster")]
    cluster_dir: PathBuf,
    /// With --cluster: kill and restart a member, add one, remove one, under the load.
    #[arg(long, requires = "cluster")]
    churn: bool,
    /// Also write straight to the backend at this S3 endpoint (as a pipeline would, not
    /// through Granary), --direct-pct of the requests; signed with `AWS_ACCESS_KEY_ID`
    /// and `AWS_SECRET_ACCESS_KEY` when they are set.
    #[arg(long)]
    direct_endpoint: Option<String>,
    #[arg(long, default_value_t = 5, requires = "direct_endpoint")]
    direct_pct: u32,
    /// How long after a write straight to the backend a read may still return the
    /// key's earlier state: the nodes' --revalidate-after and a second.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    direct_bound: Duration,
    /// Write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct LocalArgs {
    #[command(flatten)]
    common: Common,
    /// The node's Unix socket (its `--listen-unix`).
    #[arg(long)]
    socket: PathBuf,
    #[arg(long)]
    bucket: String,
    #[arg(long)]
    key: String,
    /// Timed reads per way.
    #[arg(long, default_value_t = 8)]
    rounds: usize,
    /// The same bytes as a plain file (e.g. the backend's), read with read(2) from the
    /// page cache as the ceiling.
    #[arg(long)]
    direct: Option<PathBuf>,
}

#[derive(Args)]
struct WireArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long)]
    bucket: String,
    #[arg(long)]
    key: String,
    /// Timed reads per way.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

#[derive(Args)]
struct TransformArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long)]
    bucket: String,
    /// Where the images (JPEG/PNG) are.
    #[arg(long, default_value = "")]
    prefix: String,
    /// The transform for the first and repeated passes.
    #[arg(long)]
    transform: String,
    /// Another name for the same steps, cold, for the shared jobs.
    #[arg(long)]
    shared: String,
    /// The same images straight from the backend, for the jobs that transform for
    /// themselves (e.g. the S3 server's URL).
    #[arg(long)]
    source_endpoint: String,
    /// Sign the source reads with this access key (with --source-secret-key).
    #[arg(long, requires = "source_secret_key")]
    source_access_key: Option<String>,
    #[arg(long, requires = "source_access_key")]
    source_secret_key: Option<String>,
    /// The transform's steps as the config gives them, as JSON (`{"resize":256,…}`).
    #[arg(long)]
    spec: String,
    #[arg(long, default_value_t = 4)]
    jobs: usize,
}

#[derive(Args)]
struct BatchArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long)]
    bucket: String,
    /// Where the `.tar` shards are.
    #[arg(long, default_value = "")]
    prefix: String,
    /// Samples per batch.
    #[arg(long, default_value_t = 256)]
    samples: usize,
    /// Rounds, each with new random samples.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args)]
struct PrefetchArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long)]
    bucket: String,
    /// The prefix read cold.
    #[arg(long)]
    cold_prefix: String,
    /// A copy of the same objects, prefetched before its epoch.
    #[arg(long)]
    warm_prefix: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args)]
struct RingArgs {
    /// Cluster sizes to simulate.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    nodes: Vec<usize>,
    /// Keys placed per simulation (`10M`, `100k`).
    #[arg(long, default_value = "10M", value_parser = parse_size)]
    keys: u64,
    /// Node weights: uniform, mixed (1, 2 and 4 TiB disks in turn); both by default.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "uniform,mixed"
    )]
    weights: Vec<granary_bench::ringsim::Weights>,
    /// Threads to place keys on [default: all cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Print the rows as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PlanSimArgs {
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    #[arg(long, default_value_t = 1000)]
    ranks: usize,
    #[arg(long, default_value_t = 100_000)]
    shards: usize,
    /// Samples per shard.
    #[arg(long, default_value_t = 16)]
    samples: u32,
    #[arg(long, value_parser = parse_size, default_value = "4MiB")]
    sample_size: u64,
    /// The cluster's cache over the dataset, C / D.
    #[arg(long, default_value_t = 0.5)]
    cache: f64,
    /// The job's consumption rate over all ranks, X (`100GB` a second).
    #[arg(long, value_parser = parse_size, default_value = "100GB")]
    job_rate: u64,
    /// The backend's throughput over B / X.
    #[arg(long, default_value_t = 0.55)]
    bx: f64,
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// How far ahead of what they consume the ranks read, in samples per rank (a
    /// loader's read-ahead: ShardDataset's 2 runs of a worker are about 2 shards').
    #[arg(long, default_value_t = 32)]
    lead: u64,
    /// Stop after this many simulated seconds (0: after `--epochs`).
    #[arg(long, default_value_t = 0.0)]
    seconds: f64,
}

#[derive(Args)]
struct Common {
    /// Server to load, `http://host:port`: Granary, a plain HTTP server such as nginx
    /// (paths `/BUCKET/KEY`), or an S3 server (with --access-key/--secret-key).
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    endpoint: String,
    /// Sign every request with SigV4 using this access key (with --secret-key).
    #[arg(long, env = "AWS_ACCESS_KEY_ID", requires = "secret_key")]
    access_key: Option<String>,
    /// The secret key that signs requests.
    #[arg(
        long,
        env = "AWS_SECRET_ACCESS_KEY",
        hide_env_values = true,
        requires = "access_key"
    )]
    secret_key: Option<String>,
    /// Region in the SigV4 scope.
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    region: String,
    /// Concurrent requests, each over its own keep-alive connection.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// The server's processes (repeat, or comma-separate: nginx's master and workers),
    /// whose CPU time (user + system, from /proc) over the run is reported per GiB read.
    #[arg(long, value_name = "PID", value_delimiter = ',')]
    server_pid: Vec<u32>,
    /// Draw a progress line on stderr while running (only when it is a terminal).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    progress: bool,
    /// Write every figure as JSON to this file (with the timeline and distributions).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw throughput over time and the latency distribution into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Number of GPUs in the consumer group of the stall analysis.
    #[arg(long, requires = "gpu_rate")]
    gpus: Option<u32>,
    /// What each GPU ingests, e.g. `600MB/s`; with --gpus, reports the fraction of time
    /// the group would wait for data and how many GPUs the measured rate feeds.
    #[arg(long, value_parser = parse_rate, requires = "gpus")]
    gpu_rate: Option<f64>,
    /// Tokio worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// Bucket of the object set.
    #[arg(long)]
    bucket: String,
    /// Key prefix: what to list, or the stem of generated names.
    #[arg(long, default_value = "")]
    prefix: String,
    /// Take the object set (keys and sizes) from ListObjectsV2 of BUCKET/PREFIX.
    /// The default when --objects is not given.
    #[arg(long, conflicts_with = "objects")]
    keys_from_list: bool,
    /// Use N generated keys `PREFIX{i:06}` instead of a listing.
    #[arg(long, value_name = "N")]
    objects: Option<usize>,
    /// Size of each generated object (`100KiB`), or a range sizes are drawn from
    /// (`64KiB-1MiB`, seeded); needed for PUTs and ranges.
    #[arg(long, value_parser = parse_size_range, requires = "objects")]
    object_size: Option<SizeRange>,
    /// Percentage of requests that are PUTs of seeded random bytes (0..=100).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    pct_put: u8,
    /// Run for this long (`30s`, `2m`); epochs repeat until it ends.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Run this many epochs, each reading every object once in a new shuffled order
    /// (default 1 when --duration is not given; with both, whichever ends first).
    #[arg(long)]
    epochs: Option<u64>,
    /// Read random ranges of this size instead of whole objects.
    #[arg(long, value_parser = parse_size)]
    range_size: Option<u64>,
    /// Check that the MD5 of each whole-object body (and of each PUT body) equals its
    /// ETag when the ETag is a plain 32-hex MD5; mismatches count as `verify` errors.
    #[arg(long)]
    verify: bool,
    /// Seed for the epoch orders, PUT bodies, ranges, sizes and the GET/PUT mix.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Snapshot Granary's `/_granary/stats` at the end of every epoch, once its cache
    /// fills have committed, for per-epoch backend and peer bytes.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    epoch_stats: bool,
}

#[derive(Args)]
struct GetArgs {
    #[command(flatten)]
    common: Common,
    /// Path of the object, `/bucket/key`.
    #[arg(long)]
    path: String,
    /// How long to run (`10s`, `1m`).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let threads = match &cli.command {
        Command::Run(a) => a.common.threads,
        Command::Get(a) => a.common.threads,
        Command::Ring(a) => return ring(a),
        Command::PlanSim(a) => return plan_sim(a),
        Command::Local(a) => return local(a),
        Command::Wire(a) => return wire(a),
        Command::Soak(a) => return soak(a),
        Command::Rebalance(a) => return rebalance(a),
        Command::Batch(a) => a.common.threads,
        Command::Prefetch(a) => a.common.threads,
        Command::Transform(a) => a.common.threads,
    };
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(t) = threads {
        rt.worker_threads(t.max(1));
    }
    let rt = rt.enable_all().build()?;
    rt.block_on(async {
        match cli.command {
            Command::Run(a) => run(a).await,
            Command::Get(a) => get(a).await,
            Command::Ring(_)
            | Command::PlanSim(_)
            | Command::Local(_)
            | Command::Wire(_)
            | Command::Soak(_)
            | Command::Rebalance(_) => {
                unreachable!("handled before the runtime starts")
            }
            Command::Batch(a) => {
                let t = target(&a.common)?;
                let r = granary_bench::samples::batch(
                    &t,
                    &a.bucket,
                    &a.prefix,
                    a.samples,
                    a.rounds,
                    a.common.workers,
                    a.seed,
                )
                .await?;
                println!(
                    "{} samples: sequential GETs / batch = {:.2}, {} parallel GETs / batch = {:.2}",
                    r.samples, r.sequential_over_batch, r.workers, r.parallel_over_batch
                );
                write_json(&a.common, &r)
            }
            Command::Prefetch(a) => {
                let t = target(&a.common)?;
                let r = granary_bench::samples::prefetch(
                    &t,
                    &a.bucket,
                    &a.cold_prefix,
                    &a.warm_prefix,
                    a.common.workers,
                    a.seed,
                )
                .await?;
                println!(
                    "{} objects: cold first epoch {:.2} s, prefetch {:.2} s, first epoch after it {:.2} s: cold / prefetched = {:.2}",
                    r.objects, r.cold_epoch_s, r.prefetch_s, r.warm_epoch_s, r.cold_over_warm
                );
                write_json(&a.common, &r)
            }
            Command::Transform(a) => {
                let t = target(&a.common)?;
                let spec: granary_core::ImageSpec =
                    serde_json::from_str(&a.spec).context("--spec")?;
                let r = granary_bench::transforms::run(
                    &t,
                    &a.bucket,
                    &a.prefix,
                    &a.transform,
                    &a.shared,
                    &a.source_endpoint,
                    a.source_access_key
                        .as_deref()
                        .zip(a.source_secret_key.as_deref())
                        .map(|(k, s)| Signer::new(k, s, &a.common.region)),
                    &spec,
                    a.jobs,
                    a.common.workers,
                )
                .await?;
                println!(
                    "{} images: first {:.0}/s, repeated {:.0}/s ({:.1}x); {} jobs sharing: {} transforms, {:.2} CPU s, {} backend B; each transforming: {} transforms, {:.2} CPU s, {} backend B",
                    r.images, r.first.images_per_s, r.repeated.images_per_s, r.repeated_over_first,
                    r.jobs, r.shared.transforms, r.shared.cpu_seconds, r.shared.backend_bytes,
                    r.each.transforms, r.each.cpu_seconds, r.each.backend_bytes
                );
                write_json(&a.common, &r)
            }
        }
    })
}

fn write_json(common: &Common, report: &impl serde::Serialize) -> anyhow::Result<()> {
    if let Some(path) = &common.json {
        let json = serde_json::to_string_pretty(report)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn local(a: &LocalArgs) -> anyhow::Result<()> {
    use granary_bench::local::{run, LocalTarget};
    let c = &a.common;
    let t = LocalTarget {
        endpoint: c.endpoint.clone(),
        socket: a.socket.clone(),
        bucket: a.bucket.clone(),
        key: a.key.clone(),
        direct: a.direct.clone(),
        credentials: c
            .access_key
            .clone()
            .zip(c.secret_key.clone())
            .map(|(k, s)| (k, s, c.region.clone())),
    };
    let r = run(&t, a.rounds)?;
    print_ways(r.object_bytes, r.rounds, &r.ways);
    println!(
        "local / TCP = {:.2}, local / Unix HTTP = {:.2}, Unix HTTP / TCP = {:.2}; CPU per GiB, TCP / local = {:.2}",
        r.local_over_tcp, r.local_over_unix, r.unix_over_tcp, r.tcp_cpu_over_local
    );
    write_json(c, &r)
}

fn print_ways(bytes: u64, rounds: usize, ways: &[granary_bench::local::Way]) {
    println!(
        "{bytes} bytes, {rounds} rounds each:\n{:<46} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12}",
        "way", "MB/s", "min", "max", "client s/GiB", "node s/GiB", "total s/GiB"
    );
    for w in ways {
        println!(
            "{:<46} {:>9.0} {:>9.0} {:>9.0} {:>12.3} {:>12.3} {:>12.3}",
            w.name,
            w.mb_per_s_median,
            w.mb_per_s_min,
            w.mb_per_s_max,
            w.client_cpu_s_per_gib,
            w.node_cpu_s_per_gib,
            w.total_cpu_s_per_gib
        );
    }
}

fn wire(a: &WireArgs) -> anyhow::Result<()> {
    let c = &a.common;
    anyhow::ensure!(
        c.access_key.is_none(),
        "wire reads an unsigned node (the plain socket does not sign)"
    );
    let r = granary_bench::wire::run(&c.endpoint, &a.bucket, &a.key, a.rounds)?;
    print_ways(r.object_bytes, r.rounds, &r.ways);
    print!(
        "{} connections: Client::get / wire = {:.2}, get_to_slice / wire = {:.2}; one connection: Client::get / wire = {:.2}",
        r.streams, r.get_over_wire, r.slice_over_wire, r.one_over_wire
    );
    match (r.get_over_curl, r.slice_over_curl) {
        (Some(g), Some(s)) => {
            println!("; Client::get / curl = {g:.2}, get_to_slice / curl = {s:.2}")
        }
        _ => println!(" (no curl here)"),
    }
    write_json(c, &r)
}

fn rebalance(a: &RebalanceArgs) -> anyhow::Result<()> {
    use granary_bench::cluster::ClusterCmd;
    use granary_bench::rebalance::{run, RebalancePlan};
    let plan = RebalancePlan {
        cmd: ClusterCmd {
            binary: a.granary.clone(),
            args: a.serve_args.clone(),
            dir: a.dir.clone(),
        },
        members: a.members,
        objects: a.objects,
        object_size: a.object_size,
        readers: a.readers,
        steady: a.steady,
        limit: a.limit,
    };
    let r = run(&plan)?;
    println!(
        "{} members, {} objects, {:.1} MB: cached/data set {:.2} before the joins, {:.2} after the rebalances",
        r.members,
        r.objects,
        r.dataset_bytes as f64 / 1e6,
        r.cached_over_dataset_before,
        r.cached_over_dataset_after
    );
    println!(
        "a member joins, nothing else running: {} objects, {:.1} MB handed to it in {:.2} s: {:.1} MB/s",
        r.moved_objects,
        r.moved_bytes as f64 / 1e6,
        r.rebalance_seconds,
        r.rebalance_mb_per_s
    );
    println!(
        "another joins under reads: {:.1} MB handed over (or held already: taken as read)",
        r.moved_bytes_under_reads as f64 / 1e6
    );
    for (what, l) in [
        ("steady", &r.steady),
        ("from the join to the first pass", &r.joining),
        ("during the rebalance", &r.during_rebalance),
    ] {
        println!(
            "reads {what}: {} reads, p50 {:.2} ms, p99 {:.2} ms, {:.1} MB/s",
            l.reads, l.p50_ms, l.p99_ms, l.mb_per_s
        );
    }
    for (what, l) in [
        ("drained, then stopped", &r.drain),
        ("stopped with no drain", &r.plain_leave),
    ] {
        println!(
            "a member leaves, {what}: it held {:.1} MB; the backend served {:.1} MB for the leave ({:.3} of it), peers {:.1} MB; {:.1} s; {} failed reads",
            l.held_bytes as f64 / 1e6,
            l.backend_bytes as f64 / 1e6,
            l.backend_over_held,
            l.peer_bytes as f64 / 1e6,
            l.seconds,
            l.failed_reads
        );
    }
    println!("failed reads: {}", r.failed_reads);
    let failed = r.failed_reads + r.drain.failed_reads + r.plain_leave.failed_reads;
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&r)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if failed > 0 {
        anyhow::bail!("reads failed");
    }
    Ok(())
}

fn soak(a: &SoakArgs) -> anyhow::Result<()> {
    use granary_bench::cluster::ClusterCmd;
    use granary_bench::soak::{run, ClusterPlan, DirectPlan, NodeCmd, SoakPlan};
    let direct_pct = if a.direct_endpoint.is_some() {
        a.direct_pct
    } else {
        0
    };
    anyhow::ensure!(
        a.pct_put + a.pct_delete + direct_pct <= 100,
        "--pct-put + --pct-delete + --direct-pct > 100"
    );
    let plan = SoakPlan {
        endpoint: a.endpoint.clone(),
        bucket: a.bucket.clone(),
        duration: a.duration,
        workers: a.workers,
        keys: a.keys,
        min_size: a.object_size.min,
        max_size: a.object_size.max,
        pct_put: a.pct_put,
        pct_delete: a.pct_delete,
        seed: a.seed,
        node: a.granary.clone().map(|binary| NodeCmd {
            binary,
            args: a.serve_args.clone(),
            log: a.node_log.clone(),
        }),
        restart_every: a.restart_every,
        cluster: match (a.cluster, &a.granary) {
            (Some(members), Some(binary)) => Some(ClusterPlan {
                cmd: ClusterCmd {
                    binary: binary.clone(),
                    args: a.serve_args.clone(),
                    dir: a.cluster_dir.clone(),
                },
                members,
                churn: a.churn,
            }),
            _ => None,
        },
        direct: a.direct_endpoint.clone().map(|endpoint| DirectPlan {
            endpoint,
            pct: direct_pct,
            bound: a.direct_bound,
            // The store's keys, as the nodes' S3 client takes them.
            credentials: match (
                std::env::var("AWS_ACCESS_KEY_ID"),
                std::env::var("AWS_SECRET_ACCESS_KEY"),
            ) {
                (Ok(access), Ok(secret)) => Some(granary_client::Credentials::new(
                    &access,
                    &secret,
                    &std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
                )),
                _ => None,
            },
        }),
    };
    let r = run(&plan)?;
    println!(
        "{:.0} s: {} GETs, {} PUTs, {} DELETEs; {:.1} GB read, {:.1} GB written; {} restarts",
        r.seconds,
        r.gets,
        r.puts,
        r.deletes,
        r.bytes_read as f64 / 1e9,
        r.bytes_written as f64 / 1e9,
        r.restarts
    );
    println!(
        "mismatched reads {}, lost acknowledged writes {}, unavailable {}, other errors {}",
        r.mismatches, r.lost_writes, r.unavailable, r.errors
    );
    if plan.direct.is_some() {
        println!(
            "writes straight to the backend {}; reads of the state before one, within its bound {}",
            r.direct_writes, r.stale_within_bound
        );
    }
    if r.rss_max_kib > 0 {
        println!(
            "node RSS: {} MiB after the first minute, {} MiB at most; per-minute highs (MiB): {:?}; \
             its own memory (RssAnon) {} MiB at most",
            r.rss_warm_kib / 1024,
            r.rss_max_kib / 1024,
            r.rss_per_minute_max_kib
                .iter()
                .map(|k| k / 1024)
                .collect::<Vec<_>>(),
            r.anon_max_kib / 1024
        );
    }
    if plan.cluster.is_some() {
        println!(
            "reads failed outside the moments after a kill {}; every key read once more at the end: {}",
            r.failed_reads, r.swept
        );
        println!(
            "cached bytes {:.1} MB for {:.1} MB of distinct objects: {:.3}x, {:.1} s after the load stopped",
            r.cached_bytes as f64 / 1e6,
            r.distinct_bytes as f64 / 1e6,
            r.cached_over_distinct,
            r.settle_seconds
        );
    }
    for p in &r.first_problems {
        println!("  {p}");
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&r)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if r.mismatches > 0 || r.lost_writes > 0 || r.errors > 0 {
        anyhow::bail!("the soak found problems");
    }
    if plan.cluster.is_some() && r.cached_over_distinct > 1.05 {
        anyhow::bail!("the cluster holds more than one copy of its objects");
    }
    Ok(())
}

fn plan_sim(a: &PlanSimArgs) -> anyhow::Result<()> {
    if a.nodes == 0 || a.ranks == 0 || a.shards == 0 || a.samples == 0 {
        anyhow::bail!("--nodes, --ranks, --shards and --samples must be at least 1");
    }
    let cfg = granary_core::PlannerSimConfig {
        nodes: a.nodes,
        ranks: a.ranks,
        shards: a.shards,
        samples: a.samples,
        sample_bytes: a.sample_size,
        cache: a.cache,
        backend: a.bx * a.job_rate as f64,
        job: a.job_rate as f64,
        epochs: a.epochs,
        lead: a.lead,
        seconds: a.seconds,
    };
    let r = granary_core::simulate_planner(&cfg);
    println!(
        "{}",
        serde_json::to_string(&serde_json::json!({
            "nodes": a.nodes, "ranks": a.ranks, "shards": a.shards, "samples": a.samples,
            "sample_bytes": a.sample_size, "cache": a.cache, "bx": a.bx, "job_rate": a.job_rate,
            "lead": a.lead, "report": r,
        }))?
    );
    Ok(())
}

fn ring(a: &RingArgs) -> anyhow::Result<()> {
    use granary_bench::ringsim;
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    if a.keys == 0 {
        anyhow::bail!("--keys must be at least 1");
    }
    let mut rows = Vec::new();
    for &n in &a.nodes {
        if n < 2 {
            anyhow::bail!("--nodes {n}: a join and a leave need at least 2 nodes");
        }
        for &w in &a.weights {
            let row = ringsim::simulate(n, w, a.keys, threads);
            if !a.json {
                eprintln!(
                    "{n} nodes, {w:?}: spread {:.3}, join moved {:.3}%, leave moved {:.3}%",
                    row.spread_max,
                    row.join_moved * 100.0,
                    row.leave_moved * 100.0
                );
            }
            rows.push(row);
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", ringsim::table(&rows));
    }
    Ok(())
}

fn target(c: &Common) -> anyhow::Result<Target> {
    let signer = match (&c.access_key, &c.secret_key) {
        (Some(a), Some(s)) => Some(Signer::new(a, s, &c.region)),
        _ => None,
    };
    Target::new(&c.endpoint, c.workers.max(1), signer)
}

async fn run(a: RunArgs) -> anyhow::Result<()> {
    let target = target(&a.common)?;
    let objects: Vec<Object> = match a.objects {
        Some(n) => {
            if a.pct_put > 0 && a.object_size.is_none() {
                bail!("--pct-put needs --object-size with --objects");
            }
            let sizes = a.object_size.unwrap_or(SizeRange { min: 0, max: 0 });
            generated(&a.prefix, n, sizes, a.seed)
        }
        None => {
            let list = target.list_objects(&a.bucket, &a.prefix).await?;
            if list.is_empty() {
                bail!(
                    "no objects under {}/{}/{}",
                    target.endpoint,
                    a.bucket,
                    a.prefix
                );
            }
            list
        }
    };
    if a.pct_put > 0 {
        target.ensure_bucket(&a.bucket).await;
    }
    let config = RunConfig {
        endpoint: target.endpoint.clone(),
        bucket: a.bucket.clone(),
        prefix: a.prefix.clone(),
        objects: objects.len(),
        object_bytes_total: objects.iter().map(|o| o.size).sum(),
        workers: a.common.workers.max(1),
        pct_put: a.pct_put,
        epochs: a
            .epochs
            .or(if a.duration.is_none() { Some(1) } else { None }),
        duration_s: a.duration.map(|d| d.as_secs_f64()),
        range_size: a.range_size,
        verify: a.verify,
        seed: a.seed,
    };
    let wl = Workload {
        target,
        bucket: a.bucket,
        objects,
        pct_put: a.pct_put,
        workers: a.common.workers.max(1),
        duration: a.duration,
        epochs: a.epochs,
        range_size: a.range_size,
        verify: a.verify,
        seed: a.seed,
        progress: a.common.progress,
        mode: Mode::Epochs,
        epoch_stats: a.epoch_stats,
    };
    measure(wl, config, &a.common).await
}

async fn get(a: GetArgs) -> anyhow::Result<()> {
    let target = target(&a.common)?;
    let path = a.path.trim_start_matches('/');
    let Some((bucket, key)) = path.split_once('/') else {
        bail!("--path must be /bucket/key, got {:?}", a.path);
    };
    let config = RunConfig {
        endpoint: target.endpoint.clone(),
        bucket: bucket.into(),
        prefix: String::new(),
        objects: 1,
        object_bytes_total: 0,
        workers: a.common.workers.max(1),
        pct_put: 0,
        epochs: None,
        duration_s: Some(a.duration.as_secs_f64()),
        range_size: None,
        verify: false,
        seed: 1,
    };
    let wl = Workload {
        target,
        bucket: bucket.into(),
        objects: vec![Object {
            key: key.into(),
            size: 0,
        }],
        pct_put: 0,
        workers: a.common.workers.max(1),
        duration: Some(a.duration),
        epochs: None,
        range_size: None,
        verify: false,
        seed: 1,
        progress: a.common.progress,
        mode: Mode::Repeat,
        epoch_stats: false,
    };
    measure(wl, config, &a.common).await
}

async fn measure(wl: Workload, config: RunConfig, common: &Common) -> anyhow::Result<()> {
    let target = wl.target.clone();
    let before = fetch_stats(&target, true).await;
    let cpu = granary_bench::report::CpuProbe::start(&common.server_pid)?;
    // The reader's side is measured beside the server's, over the same run.
    let me = [std::process::id()];
    let own = granary_bench::report::CpuProbe::start(if common.server_pid.is_empty() {
        &[]
    } else {
        &me
    })?;
    let m = workload::run(wl, before.clone()).await?;
    let cpu_s = cpu.finish()?;
    let own_s = own.finish()?;
    let delta = match (&before, fetch_stats(&target, true).await) {
        (Some(b), Some(a)) => Some(stats_delta(b, &a)),
        _ => None,
    };
    let gpu = common.gpus.zip(common.gpu_rate);
    let mut report = Report::build(config, &m, delta, gpu);
    report.server_cpu = cpu_s
        .map(|s| granary_bench::report::ServerCpu::new(&common.server_pid, s, report.bytes_read));
    report.client_cpu =
        own_s.map(|s| granary_bench::report::ServerCpu::new(&me, s, report.bytes_read));
    print!("{}", report.summary());
    if let Some(path) = &common.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &common.plot {
        granary_bench::plot::write_svg(path, &report)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if report.requests > 0 && report.errors.total == report.requests {
        bail!("every request failed");
    }
    Ok(())
}
