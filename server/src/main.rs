//! `granary serve [flags]`: flags (and `GRANARY_*` env) over an optional TOML file over
//! the defaults, into a `Config`, into a running node.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use granary_core::{CachePolicy, EngineChoice, RouteMode, SendfileChoice};
use granary_proto::units::{parse_duration, parse_size};
use granary_server::config::Config;

#[derive(Parser)]
#[command(
    name = "granary",
    version,
    about = "Granary: a caching S3-compatible data tier for deep-learning training"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node.
    Serve(ServeArgs),
}

/// Every flag can also be set as `GRANARY_<FLAG>` or in the `--config` TOML file
/// (flags win over env, env over the file).
#[derive(Args)]
struct ServeArgs {
    /// TOML file with any of the settings below (names with `_` for `-`).
    #[arg(long, env = "GRANARY_CONFIG")]
    config: Option<PathBuf>,
    /// Address to serve HTTP on [default: 127.0.0.1:7070].
    #[arg(long, env = "GRANARY_LISTEN")]
    listen: Option<SocketAddr>,
    /// Root for the cache and the default fs backend [default: ./granary-data].
    #[arg(long, env = "GRANARY_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// `fs:DIR` or `s3` [default: fs:<data-dir>/origin].
    #[arg(long, env = "GRANARY_BACKEND")]
    backend: Option<String>,
    /// S3-compatible endpoint URL (path-style addressing).
    #[arg(long, env = "GRANARY_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
    /// Bytes the disk cache may hold (`10GiB`, `500MB`, `0` = no cache) [default: 90% of free disk].
    #[arg(long, env = "GRANARY_CACHE_CAPACITY", value_parser = parse_size)]
    cache_capacity: Option<u64>,
    /// Cache admission policy [default: never-evict].
    #[arg(long, env = "GRANARY_CACHE_POLICY", value_parser = named::<CachePolicy>(&CachePolicy::NAMES))]
    cache_policy: Option<CachePolicy>,
    /// This node's name in the cluster [default: the host name].
    #[arg(long, env = "GRANARY_NODE_ID")]
    node_id: Option<String>,
    /// A cluster member as ID=URL; repeat for each, this node included.
    #[arg(long = "peer", env = "GRANARY_PEER", value_delimiter = ',')]
    peer: Vec<String>,
    /// The members as a file of ID=URL lines, read again when it changes (a Kubernetes
    /// ConfigMap); instead of --peer.
    #[arg(long, env = "GRANARY_PEERS_FILE")]
    peers_file: Option<PathBuf>,
    /// The members as the addresses NAME resolves to (a headless Service), resolved again
    /// every few seconds; a member's id is its reverse name's first label, else its
    /// address. Instead of --peer.
    #[arg(long, env = "GRANARY_PEERS_DNS", value_name = "NAME:PORT")]
    peers_dns: Option<String>,
    /// The DNS server --peers-dns asks instead of the system's.
    #[arg(long, env = "GRANARY_PEERS_DNS_SERVER", value_name = "IP:PORT")]
    peers_dns_server: Option<std::net::SocketAddr>,
    /// Bytes per second a rebalance hands to other members after a membership change
    /// (`100MB`; 0: no rebalance) [default: 100MB].
    #[arg(long, env = "GRANARY_REBALANCE_RATE", value_parser = parse_size)]
    rebalance_rate: Option<u64>,
    /// What members prove membership with [default: the secret key; neither: an open
    /// cluster, whose members' headers anyone may send].
    #[arg(long, env = "GRANARY_CLUSTER_SECRET", hide_env_values = true)]
    cluster_secret: Option<String>,
    /// Answer requests for keys owned elsewhere by proxying or with 307 [default: proxy].
    #[arg(long, env = "GRANARY_ROUTE", value_parser = named::<RouteMode>(&RouteMode::NAMES))]
    route: Option<RouteMode>,
    /// Access key; with --secret-key, S3 requests must be signed (SigV4 or presigned).
    #[arg(long, env = "GRANARY_ACCESS_KEY")]
    access_key: Option<String>,
    /// Secret key paired with --access-key.
    #[arg(long, env = "GRANARY_SECRET_KEY", hide_env_values = true)]
    secret_key: Option<String>,
    /// With credentials set, still allow unsigned GET/HEAD (plain training URLs).
    #[arg(long, env = "GRANARY_ANONYMOUS_READ")]
    anonymous_read: bool,
    /// Verify cache checksums while serving hits [default: true].
    #[arg(long, env = "GRANARY_VERIFY_READS")]
    verify_reads: Option<bool>,
    /// Send large cache hits with sendfile(2) from the page cache (windows locked and
    /// checked) instead of copying them from a mapping into the socket: auto (to readers
    /// on other machines; readers on this one read the copy faster), true (to all), false
    /// [default: auto].
    #[arg(long, env = "GRANARY_SENDFILE", value_parser = named::<SendfileChoice>(&SendfileChoice::NAMES))]
    sendfile: Option<SendfileChoice>,
    /// Write cold fills around the page cache (O_DIRECT, 512 KiB at a time), where
    /// the filesystem allows: about a third of the CPU of writing through it and fsyncing,
    /// and no dirty pages to push out what hits read; hits after a fill read the disk
    /// once. `false` keeps fills in the page cache, for nodes whose memory holds the
    /// working set [default: true].
    #[arg(long, env = "GRANARY_DIRECT_FILLS")]
    direct_fills: Option<bool>,
    /// Also serve the same API on this Unix domain socket.
    #[arg(long, env = "GRANARY_LISTEN_UNIX")]
    listen_unix: Option<PathBuf>,
    /// TLS certificate chain (PEM) to serve HTTPS.
    #[arg(long, env = "GRANARY_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) to serve HTTPS.
    #[arg(long, env = "GRANARY_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// How cache entries are read from disk: auto (io_uring, else std), io-uring, std [default: auto].
    #[arg(long, env = "GRANARY_READ_ENGINE", value_parser = named::<EngineChoice>(&EngineChoice::NAMES))]
    read_engine: Option<EngineChoice>,
    /// Requests served at once; beyond them 503 SlowDown (0: no limit) [default: 1024].
    #[arg(long, env = "GRANARY_MAX_REQUESTS")]
    max_requests: Option<usize>,
    /// Backend reads in flight at once; one that cannot start within 2 s is answered
    /// 503 SlowDown (0: no limit) [default: 64].
    #[arg(long, env = "GRANARY_MAX_BACKEND_FETCHES")]
    max_backend_fetches: Option<usize>,
    /// Bytes per second this node reads from its backend, all reads together (`200MB`;
    /// 0: no cap) [default: 0].
    #[arg(long, env = "GRANARY_BACKEND_RATE", value_parser = parse_size)]
    backend_rate: Option<u64>,
    /// Close a connection after this long with no byte read or written (`120s`, `2m`)
    /// [default: 120s].
    #[arg(long, env = "GRANARY_IDLE_TIMEOUT", value_parser = parse_duration)]
    idle_timeout: Option<std::time::Duration>,
    /// Drop a job's registered plan after this long without a sign of progress (`60s`,
    /// `2m`) [default: 60s].
    #[arg(long, env = "GRANARY_PLAN_TTL", value_parser = parse_duration)]
    plan_ttl: Option<std::time::Duration>,
    /// Threads that prepare samples for pipelines (`[pipelines.NAME]` in the TOML) at
    /// once [default: the CPUs].
    #[arg(long, env = "GRANARY_PREP_THREADS")]
    prep_threads: Option<usize>,
    /// Memory a node keeps prepared samples in until the jobs that read them this
    /// epoch have (`1GiB`; 0: none kept, preparations still shared while under way)
    /// [default: 1GiB].
    #[arg(long, env = "GRANARY_PREP_MEMORY", value_parser = parse_size)]
    prep_memory: Option<u64>,
    /// Check a hit against the backend's ETag when its last check is older than this
    /// (`30s`, `10m`; `never` for immutable data); per bucket in the TOML as
    /// `[buckets.NAME] revalidate_after` [default: never].
    #[arg(long, env = "GRANARY_REVALIDATE_AFTER", value_parser = parse_revalidate)]
    revalidate_after: Option<Revalidate>,
}

/// `--revalidate-after`: a duration, or never.
#[derive(Debug, Clone, Copy)]
struct Revalidate(Option<std::time::Duration>);

fn parse_revalidate(s: &str) -> Result<Revalidate, String> {
    granary_proto::units::parse_duration_or_never(s).map(Revalidate)
}

impl ServeArgs {
    fn into_config(self) -> anyhow::Result<Config> {
        let mut c = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f { c.$f = v; } )* };
        }
        macro_rules! set_opt {
            ($($f:ident),*) => { $( if self.$f.is_some() { c.$f = self.$f; } )* };
        }
        set!(
            listen,
            data_dir,
            cache_policy,
            route,
            verify_reads,
            sendfile,
            direct_fills,
            read_engine,
            max_requests,
            max_backend_fetches,
            backend_rate,
            idle_timeout,
            plan_ttl,
            rebalance_rate,
            prep_memory
        );
        if self.prep_threads.is_some() {
            c.prep_threads = self.prep_threads;
        }
        set_opt!(
            backend,
            s3_endpoint,
            cache_capacity,
            node_id,
            access_key,
            secret_key,
            listen_unix,
            tls_cert,
            tls_key,
            peers_file,
            peers_dns,
            peers_dns_server,
            cluster_secret
        );
        if !self.peer.is_empty() {
            c.peer = self.peer;
        }
        if self.anonymous_read {
            c.anonymous_read = true;
        }
        if let Some(Revalidate(after)) = self.revalidate_after {
            c.revalidate_after = after;
        }
        c.validate()?;
        Ok(c)
    }
}

/// Keeps glibc from returning freed memory to the kernel block by block, and from
/// keeping it in many arenas. Checked hits and cold fills allocate buffers of up to 1 MiB
/// and free them once the socket and the disk have taken them; with glibc's defaults each
/// such buffer is a fresh `mmap` (page faults and kernel zeroing: a quarter of the CPU of
/// a warm GET), and each of the blocking pool's threads may keep its own arena of freed
/// buffers (half the node's RSS while eight streams fill, `P6` in BENCHMARKS.md). Two
/// arenas keep both in check.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator parameters; called before any thread starts.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 16 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

fn main() -> anyhow::Result<()> {
    tune_allocator();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let config = args.into_config()?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(granary_server::run(config))
        }
    }
}

/// A flag that takes one of `names`, parsed into what it names.
fn named<T>(names: &'static [&'static str]) -> impl TypedValueParser<Value = T>
where
    T: std::str::FromStr<Err = String> + Clone + Send + Sync + 'static,
{
    PossibleValuesParser::new(names).map(|s| s.parse::<T>().expect("every listed name parses"))
}
