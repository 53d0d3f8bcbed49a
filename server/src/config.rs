//! The node's configuration: one serde tree, filled from defaults, then an optional TOML
//! file (`--config`), then `GRANARY_*` environment variables and flags (clap gives both,
//! flags winning). Field names are the flag names with `_` for `-`.

use std::net::SocketAddr;
use std::path::PathBuf;

use granary_core::{parse_peer, BackendSpec, CachePolicy, ClusterConfig, NodeConfig, RouteMode};
use granary_proto::units::{parse_duration, parse_duration_or_never, parse_size};
use serde::{Deserialize, Deserializer};

/// Everything `granary serve` needs to start.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to serve HTTP on.
    pub listen: SocketAddr,
    /// Root for the cache and for the default fs backend.
    pub data_dir: PathBuf,
    /// `fs:DIR` or `s3`; `None` means `fs:<data_dir>/origin`.
    pub backend: Option<String>,
    /// S3-compatible endpoint for the `s3` backend (path-style addressing).
    pub s3_endpoint: Option<String>,
    /// Bytes the disk cache may hold; `None` means 90% of the free disk.
    #[serde(deserialize_with = "de_opt_size")]
    pub cache_capacity: Option<u64>,
    /// Admission policy of the disk cache.
    pub cache_policy: CachePolicy,
    /// This node's name in the cluster; `None` means the host name.
    pub node_id: Option<String>,
    /// Cluster members as `ID=URL`, this node included.
    pub peer: Vec<String>,
    /// The members as a file of `ID=URL` lines, followed while the node runs.
    pub peers_file: Option<PathBuf>,
    /// The members as the addresses of a DNS name (`NAME:PORT`), resolved again every
    /// few seconds.
    pub peers_dns: Option<String>,
    /// The DNS server `peers_dns` asks instead of the system's (`IP:PORT`).
    pub peers_dns_server: Option<SocketAddr>,
    /// Bytes per second a rebalance hands to other members (0: no rebalance).
    #[serde(deserialize_with = "de_size")]
    pub rebalance_rate: u64,
    /// What members prove membership with (a MAC over each request they send one
    /// another); unset, the secret key. A cluster with neither is open: anyone may
    /// speak as a member.
    pub cluster_secret: Option<String>,
    /// How a request that lands on a non-owner is answered.
    pub route: RouteMode,
    /// Access key; with `secret_key`, S3 requests must be signed.
    pub access_key: Option<String>,
    /// Secret key paired with `access_key`.
    pub secret_key: Option<String>,
    /// With credentials set, still allow unsigned read-only requests.
    pub anonymous_read: bool,
    /// Verify cache checksums while serving hits.
    pub verify_reads: bool,
    /// Which connections large cache hits leave by with `sendfile(2)` from the page cache
    /// (their windows locked and checked), instead of the kernel's copy from a mapping
    /// into the socket: `auto` (readers on other machines), `true` (all), `false`.
    #[serde(deserialize_with = "de_sendfile")]
    pub sendfile: granary_core::SendfileChoice,
    /// Write cold fills around the page cache (`O_DIRECT`), where the filesystem allows.
    pub direct_fills: bool,
    /// Also serve the same API on this Unix domain socket.
    pub listen_unix: Option<PathBuf>,
    /// TLS certificate chain (PEM) for HTTPS.
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for HTTPS.
    pub tls_key: Option<PathBuf>,
    /// How cache entries are read from disk.
    pub read_engine: granary_core::EngineChoice,
    /// Requests served at once; beyond them `503 SlowDown`. 0: no limit.
    pub max_requests: usize,
    /// Backend reads in flight at once; a read that waits longer than a moment for a
    /// place is answered `503 SlowDown`. 0: no limit.
    pub max_backend_fetches: usize,
    /// Bytes per second read from the backend, all reads together (0: no cap).
    #[serde(deserialize_with = "de_size")]
    pub backend_rate: u64,
    /// A connection with no byte read or written for this long is closed.
    #[serde(deserialize_with = "de_duration")]
    pub idle_timeout: std::time::Duration,
    /// A job's plan is dropped after this long without a sign of progress.
    #[serde(deserialize_with = "de_duration")]
    pub plan_ttl: std::time::Duration,
    /// A hit whose last check against the backend is older than this checks the
    /// backend's ETag first; `None` (`never`): immutable data, never checked.
    #[serde(deserialize_with = "de_opt_duration")]
    pub revalidate_after: Option<std::time::Duration>,
    /// Per-bucket settings (`[buckets.NAME]` in the TOML file).
    pub buckets: std::collections::BTreeMap<String, BucketConfig>,
    /// Named on-node transforms (`[transforms.NAME]` in the TOML file).
    pub transforms: std::collections::BTreeMap<String, granary_core::TransformSpec>,
    /// Named pipelines: training-time sample preparation per epoch
    /// (`[pipelines.NAME]` in the TOML file).
    pub pipelines: std::collections::BTreeMap<String, granary_prep::PipelineSpec>,
    /// Threads that prepare samples at once; `None`: the CPUs.
    pub prep_threads: Option<usize>,
    /// Bytes of prepared samples kept for the jobs that read them.
    #[serde(deserialize_with = "de_size")]
    pub prep_memory: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:7070".parse().expect("static address"),
            data_dir: PathBuf::from("./granary-data"),
            backend: None,
            s3_endpoint: None,
            cache_capacity: None,
            cache_policy: CachePolicy::NeverEvict,
            node_id: None,
            peer: Vec::new(),
            peers_file: None,
            peers_dns: None,
            peers_dns_server: None,
            cluster_secret: None,
            rebalance_rate: 100_000_000,
            route: RouteMode::Proxy,
            access_key: None,
            secret_key: None,
            anonymous_read: false,
            verify_reads: true,
            sendfile: granary_core::SendfileChoice::Auto,
            direct_fills: true,
            listen_unix: None,
            tls_cert: None,
            tls_key: None,
            read_engine: granary_core::EngineChoice::Auto,
            max_requests: 1024,
            max_backend_fetches: 64,
            backend_rate: 0,
            idle_timeout: std::time::Duration::from_secs(120),
            plan_ttl: std::time::Duration::from_secs(60),
            revalidate_after: None,
            buckets: Default::default(),
            transforms: Default::default(),
            pipelines: Default::default(),
            prep_threads: None,
            prep_memory: 1 << 30,
        }
    }
}

/// A bucket's own settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketConfig {
    /// `revalidate_after` for this bucket (a duration or `never`); unset: the node's.
    #[serde(default, deserialize_with = "de_some_opt_duration")]
    pub revalidate_after: Option<Option<std::time::Duration>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("invalid value for {field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

impl From<granary_core::ClusterConfigError> for ConfigError {
    fn from(e: granary_core::ClusterConfigError) -> ConfigError {
        ConfigError::Invalid {
            field: e.field,
            message: e.message,
        }
    }
}

impl Config {
    /// Reads a TOML config file over the defaults.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let config: Config = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        config.check_pipelines(path, &text)?;
        Ok(config)
    }

    /// Each pipeline's definition can run; the error names the pipeline, the field and
    /// the line of the TOML its table starts on (the node checks again as it opens).
    fn check_pipelines(&self, path: &std::path::Path, text: &str) -> Result<(), ConfigError> {
        for (name, spec) in &self.pipelines {
            let valid_name = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            let problem = if valid_name {
                granary_prep::Pipeline::new(spec.clone())
                    .err()
                    .map(|e| e.to_string())
            } else {
                Some("a pipeline's name is letters, digits, `_` and `-`".to_owned())
            };
            let Some(message) = problem else { continue };
            let header = format!("[pipelines.{name}]");
            let at = text
                .lines()
                .position(|l| l.trim_start().starts_with(&header))
                .map(|line| format!(" ({}, line {})", path.display(), line + 1))
                .unwrap_or_default();
            return Err(ConfigError::Invalid {
                field: "pipelines",
                message: format!("[pipelines.{name}]{at}: {message}"),
            });
        }
        Ok(())
    }

    /// The backend this config names.
    pub fn backend_spec(&self) -> Result<BackendSpec, ConfigError> {
        match self.backend.as_deref() {
            None => Ok(BackendSpec::Fs(self.data_dir.join("origin"))),
            Some("s3") => Ok(BackendSpec::S3 {
                endpoint: self.s3_endpoint.clone(),
            }),
            Some(s) => match s.strip_prefix("fs:") {
                Some(dir) if !dir.is_empty() => Ok(BackendSpec::Fs(PathBuf::from(dir))),
                _ => Err(ConfigError::Invalid {
                    field: "backend",
                    message: format!("`{s}`: expected `fs:DIR` or `s3`"),
                }),
            },
        }
    }

    /// The credentials the config sets (`--access-key` with `--secret-key`), if any.
    pub fn credentials(&self) -> Option<granary_proto::auth::Credentials> {
        match (&self.access_key, &self.secret_key) {
            (Some(a), Some(s)) => Some(granary_proto::auth::Credentials {
                access_key: a.clone(),
                secret_key: s.clone(),
            }),
            _ => None,
        }
    }

    /// What members prove membership with: `--cluster-secret`, else the secret key.
    pub fn cluster_secret(&self) -> Option<String> {
        self.cluster_secret
            .clone()
            .filter(|s| !s.is_empty())
            .or_else(|| self.secret_key.clone())
    }

    /// This node's id: the configured one or the host name.
    pub fn node_id(&self) -> String {
        if let Some(id) = &self.node_id {
            return id.clone();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "granary".to_owned())
    }

    /// What the node service is opened with.
    pub fn node_config(&self) -> Result<NodeConfig, ConfigError> {
        Ok(NodeConfig {
            node_id: self.node_id(),
            data_dir: self.data_dir.clone(),
            backend: self.backend_spec()?,
            max_backend_fetches: self.max_backend_fetches,
            backend_rate: self.backend_rate,
            plan_ttl: self.plan_ttl,
            revalidate: granary_core::Revalidation {
                default: self.revalidate_after,
                buckets: self
                    .buckets
                    .iter()
                    .filter_map(|(name, b)| Some((name.clone(), b.revalidate_after?)))
                    .collect(),
            },
            cache_capacity: self.cache_capacity,
            cache_policy: self.cache_policy,
            verify_reads: self.verify_reads,
            read_engine: self.read_engine,
            sendfile: self.sendfile,
            direct_fills: self.direct_fills,
            rebalance_rate: self.rebalance_rate,
            transforms: self.transforms.clone(),
            pipelines: self.pipelines.clone(),
            prep_memory: self.prep_memory,
            prep_threads: self.prep_threads.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
            }),
            cluster: ClusterConfig {
                listen: self.listen,
                tls_cert: self.tls_cert.clone(),
                peer: self.peer.clone(),
                peers_file: self.peers_file.clone(),
                peers_dns: self.peers_dns.clone(),
                peers_dns_server: self.peers_dns_server,
                route: self.route,
                secret: self.cluster_secret(),
            },
        })
    }

    /// Checks cross-field rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.backend_spec()?;
        if self.access_key.is_some() != self.secret_key.is_some() {
            return Err(ConfigError::Invalid {
                field: "access-key",
                message: "--access-key and --secret-key go together".into(),
            });
        }
        if self.idle_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                field: "idle-timeout",
                message: "must be more than 0".into(),
            });
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::Invalid {
                field: "tls-cert",
                message: "--tls-cert and --tls-key go together".into(),
            });
        }
        let sources = [
            !self.peer.is_empty(),
            self.peers_file.is_some(),
            self.peers_dns.is_some(),
        ];
        if sources.iter().filter(|s| **s).count() > 1 {
            return Err(ConfigError::Invalid {
                field: "peer",
                message: "give the members one way: --peer, --peers-file or --peers-dns".into(),
            });
        }
        for p in &self.peer {
            let (id, url) = parse_peer(p)?;
            if url.starts_with("https://") && self.tls_cert.is_none() {
                return Err(ConfigError::Invalid {
                    field: "peer",
                    message: format!(
                        "peer `{id}` is https: members trust the certificates of --tls-cert, so set it"
                    ),
                });
            }
        }
        if self.prep_threads == Some(0) {
            return Err(ConfigError::Invalid {
                field: "prep_threads",
                message: "at least 1".into(),
            });
        }
        for (name, def) in &self.transforms {
            def.validate().map_err(|message| ConfigError::Invalid {
                field: "transforms",
                message: format!("[transforms.{name}]: {message}"),
            })?;
        }
        Ok(())
    }
}

/// A duration as the TOML gives it: seconds, or text (`30s`, `2m`).
#[derive(Deserialize)]
#[serde(untagged)]
enum Dur {
    Secs(u64),
    Text(String),
}

/// `sendfile = true`, `false` or `"auto"` (also `"true"`, `"false"`).
fn de_sendfile<'de, D: Deserializer<'de>>(d: D) -> Result<granary_core::SendfileChoice, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Choice {
        Flag(bool),
        Text(String),
    }
    match Choice::deserialize(d)? {
        Choice::Flag(true) => Ok(granary_core::SendfileChoice::On),
        Choice::Flag(false) => Ok(granary_core::SendfileChoice::Off),
        Choice::Text(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<std::time::Duration, D::Error> {
    match Dur::deserialize(d)? {
        Dur::Secs(n) => Ok(std::time::Duration::from_secs(n)),
        Dur::Text(s) => parse_duration(&s).map_err(serde::de::Error::custom),
    }
}

/// A duration, or `never`.
fn de_opt_duration<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<std::time::Duration>, D::Error> {
    match Dur::deserialize(d)? {
        Dur::Secs(n) => Ok(Some(std::time::Duration::from_secs(n))),
        Dur::Text(s) => parse_duration_or_never(&s).map_err(serde::de::Error::custom),
    }
}

fn de_some_opt_duration<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<std::time::Duration>>, D::Error> {
    de_opt_duration(d).map(Some)
}

fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    de_opt_size(d)?.ok_or_else(|| serde::de::Error::custom("a size is required"))
}

fn de_opt_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Int(u64),
        Text(String),
    }
    match Option::<Size>::deserialize(d)? {
        None => Ok(None),
        Some(Size::Int(n)) => Ok(Some(n)),
        Some(Size::Text(s)) => parse_size(&s).map(Some).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_file() {
        let c: Config = toml::from_str(
            "listen = \"127.0.0.1:9000\"\ncache_capacity = \"2GiB\"\ncache_policy = \"lru\"\npeer = [\"a=http://127.0.0.1:1\"]\n",
        )
        .unwrap();
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.cache_capacity, Some(2 << 30));
        assert_eq!(c.cache_policy, CachePolicy::Lru);
        assert_eq!(c.peer.len(), 1);
        assert!(toml::from_str::<Config>("bogus = 1").is_err());
    }

    #[test]
    fn sendfile_takes_a_flag_or_auto() {
        use granary_core::SendfileChoice;
        assert_eq!(Config::default().sendfile, SendfileChoice::Auto);
        let of = |t: &str| toml::from_str::<Config>(t).map(|c| c.sendfile);
        assert_eq!(of("sendfile = true").unwrap(), SendfileChoice::On);
        assert_eq!(of("sendfile = false").unwrap(), SendfileChoice::Off);
        assert_eq!(of("sendfile = \"auto\"").unwrap(), SendfileChoice::Auto);
        assert_eq!(of("sendfile = \"true\"").unwrap(), SendfileChoice::On);
        assert!(of("sendfile = \"sometimes\"").is_err());
        assert!(of("sendfile = 1").is_err());
    }

    #[test]
    fn backend_specs() {
        let mut c = Config::default();
        assert_eq!(
            c.backend_spec().unwrap(),
            BackendSpec::Fs(PathBuf::from("./granary-data/origin"))
        );
        c.backend = Some("fs:/srv/data".into());
        assert_eq!(
            c.backend_spec().unwrap(),
            BackendSpec::Fs(PathBuf::from("/srv/data"))
        );
        c.backend = Some("s3".into());
        assert_eq!(
            c.backend_spec().unwrap(),
            BackendSpec::S3 { endpoint: None }
        );
        c.backend = Some("gcs".into());
        assert!(c.backend_spec().is_err());
    }
}
