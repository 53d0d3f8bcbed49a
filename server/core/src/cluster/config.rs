//! What a cluster is made from: where this node listens, where the member list comes
//! from, how requests for other members' keys are answered, and what members prove
//! membership with. Filled by the server from its flags and config file.

use std::net::SocketAddr;
use std::path::PathBuf;

/// How a request for a key owned by another node is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouteMode {
    /// Stream the owner's response through.
    Proxy,
    /// Answer `307` to the owner.
    Redirect,
}

impl RouteMode {
    /// Every mode, as flags and the TOML file name them.
    pub const NAMES: [&'static str; 2] = ["proxy", "redirect"];

    pub fn as_str(self) -> &'static str {
        match self {
            RouteMode::Proxy => "proxy",
            RouteMode::Redirect => "redirect",
        }
    }
}

impl std::str::FromStr for RouteMode {
    type Err = String;

    fn from_str(s: &str) -> Result<RouteMode, String> {
        match s {
            "proxy" => Ok(RouteMode::Proxy),
            "redirect" => Ok(RouteMode::Redirect),
            _ => Err(format!("`{s}`: expected proxy or redirect")),
        }
    }
}

/// The cluster's part of a node's configuration.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Where this node serves HTTP: its own URL when it must add itself to a list.
    pub listen: SocketAddr,
    /// The node's TLS certificate: members speak HTTPS and trust it (they share one, or
    /// its issuer).
    pub tls_cert: Option<PathBuf>,
    /// Members as `ID=URL`, this node included (a fixed list).
    pub peer: Vec<String>,
    /// The members as a file of `ID=URL` lines, followed while the node runs.
    pub peers_file: Option<PathBuf>,
    /// The members as the addresses of a DNS name (`NAME:PORT`).
    pub peers_dns: Option<String>,
    /// The DNS server `peers_dns` asks instead of the system's.
    pub peers_dns_server: Option<SocketAddr>,
    /// How a request that lands on a non-owner is answered.
    pub route: RouteMode,
    /// What members prove membership with; `None`: an open cluster.
    pub secret: Option<String>,
}

impl Default for ClusterConfig {
    fn default() -> ClusterConfig {
        ClusterConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            tls_cert: None,
            peer: Vec::new(),
            peers_file: None,
            peers_dns: None,
            peers_dns_server: None,
            route: RouteMode::Proxy,
            secret: None,
        }
    }
}

/// A member list or its source that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid value for {field}: {message}")]
pub struct ConfigError {
    /// The flag (and config field) at fault.
    pub field: &'static str,
    pub message: String,
}

impl ConfigError {
    pub fn new(field: &'static str, message: impl Into<String>) -> ConfigError {
        ConfigError {
            field,
            message: message.into(),
        }
    }
}

/// Splits `ID=URL`.
pub fn parse_peer(s: &str) -> Result<(String, String), ConfigError> {
    match s.split_once('=') {
        Some((id, url))
            if !id.is_empty() && (url.starts_with("http://") || url.starts_with("https://")) =>
        {
            Ok((id.to_owned(), url.trim_end_matches('/').to_owned()))
        }
        _ => Err(ConfigError::new(
            "peer",
            format!("`{s}`: expected ID=http://host:port"),
        )),
    }
}
