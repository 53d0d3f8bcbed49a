//! Where the member list comes from, and how it is followed while the node runs:
//! - `--peer ID=URL` (repeated): fixed;
//! - `--peers-file FILE`: `ID=URL` lines, read again whenever its bytes change (polled
//!   every probe round, so the symlink swap a Kubernetes ConfigMap makes is seen too);
//! - `--peers-dns NAME:PORT`: the addresses NAME resolves to (a headless Service), asked
//!   again every few seconds; a member's id is the first label of its address's reverse
//!   name (a StatefulSet pod's host name), else the address.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::{NameServerPool, TokioConnectionProvider};
use hickory_resolver::proto::op::Query;
use hickory_resolver::proto::rr::{Name, RData, RecordType};
use hickory_resolver::proto::xfer::{DnsHandle, DnsRequestOptions};
use hickory_resolver::TokioResolver;

use super::config::{parse_peer, ClusterConfig, ConfigError};
use super::Cluster;

/// How often a DNS name is resolved again.
pub const DNS_EVERY: Duration = Duration::from_secs(3);

/// The list at start: `--peer`, or `--peers-file` as it is now (an unreadable file is an
/// error); empty for `--peers-dns` until it answers.
pub fn initial(config: &ClusterConfig) -> Result<Vec<(String, String)>, ConfigError> {
    if let Some(path) = &config.peers_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new("peers-file", format!("cannot read {}: {e}", path.display()))
        })?;
        return parse_file(&text).map_err(|message| {
            ConfigError::new("peers-file", format!("{}: {message}", path.display()))
        });
    }
    config.peer.iter().map(|p| parse_peer(p)).collect()
}

/// `ID=URL` lines; blank lines and `#` comments are skipped.
pub fn parse_file(text: &str) -> Result<Vec<(String, String)>, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| parse_peer(l).map_err(|e| e.to_string()))
        .collect()
}

/// Follows the member list's source.
pub enum Watch {
    Fixed,
    File {
        path: PathBuf,
        last: Option<Vec<u8>>,
    },
    Dns {
        name: String,
        port: u16,
        scheme: &'static str,
        dns: Box<Dns>,
        next: Instant,
    },
}

/// The two ways a name is asked about. Forward lookups go through the resolver, which
/// applies the search domains a short Service name needs; reverse lookups go straight
/// to the name servers, because the resolver answers `localhost` itself for every
/// loopback address, and a member's id must come from the server's records.
pub struct Dns {
    resolver: TokioResolver,
    servers: NameServerPool<TokioConnectionProvider>,
}

impl Watch {
    /// The watch `config` asks for.
    pub fn of(config: &ClusterConfig) -> Result<Watch, ConfigError> {
        if let Some(path) = &config.peers_file {
            return Ok(Watch::File {
                path: path.clone(),
                last: std::fs::read(path).ok(),
            });
        }
        let Some(spec) = &config.peers_dns else {
            return Ok(Watch::Fixed);
        };
        let invalid = |message: String| ConfigError::new("peers-dns", message);
        let (name, port) = spec
            .rsplit_once(':')
            .and_then(|(n, p)| Some((n.to_owned(), p.parse::<u16>().ok()?)))
            .ok_or_else(|| invalid(format!("`{spec}`: expected NAME:PORT")))?;
        let (servers, mut opts) = match config.peers_dns_server {
            Some(server) => (
                ResolverConfig::from_parts(
                    None,
                    vec![],
                    NameServerConfigGroup::from_ips_clear(&[server.ip()], server.port(), true),
                ),
                ResolverOpts::default(),
            ),
            None => hickory_resolver::system_conf::read_system_conf()
                .map_err(|e| invalid(format!("cannot read the system's DNS setup: {e}")))?,
        };
        // Every answer fresh: the point is to see the name change.
        opts.cache_size = 0;
        opts.timeout = Duration::from_secs(2);
        let pool = NameServerPool::from_config(
            NameServerConfigGroup::from(servers.name_servers().to_vec()),
            opts.clone(),
            TokioConnectionProvider::default(),
        );
        let mut builder =
            TokioResolver::builder_with_config(servers, TokioConnectionProvider::default());
        *builder.options_mut() = opts;
        let scheme = if config.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        Ok(Watch::Dns {
            name,
            port,
            scheme,
            dns: Box::new(Dns {
                resolver: builder.build(),
                servers: pool,
            }),
            next: Instant::now(),
        })
    }

    /// Reads the source again when it is due and gives the cluster what changed.
    pub async fn poll(&mut self, cluster: &Cluster) {
        match self {
            Watch::Fixed => {}
            Watch::File { path, last } => {
                let Ok(bytes) = std::fs::read(&*path) else {
                    // A ConfigMap swap has a moment without the file: keep the list.
                    return;
                };
                if last.as_ref() == Some(&bytes) {
                    return;
                }
                match parse_file(&String::from_utf8_lossy(&bytes)) {
                    Ok(list) => {
                        tracing::info!(path = %path.display(), members = list.len(), "member list read again");
                        cluster.set_members(list);
                        *last = Some(bytes);
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "member list refused")
                    }
                }
            }
            Watch::Dns {
                name,
                port,
                scheme,
                dns,
                next,
            } => {
                if Instant::now() < *next {
                    return;
                }
                *next = Instant::now() + DNS_EVERY;
                match resolve(dns, name, *port, scheme).await {
                    Ok(list) if !list.is_empty() => cluster.set_members(list),
                    Ok(_) => tracing::warn!(name = %name, "the member name resolves to no address"),
                    Err(e) => {
                        tracing::warn!(name = %name, error = %e, "cannot resolve the member name")
                    }
                }
            }
        }
    }
}

/// The members a name resolves to: `(id, url)` per address, the id the first label of
/// the address's reverse name, else the address.
async fn resolve(
    dns: &Dns,
    name: &str,
    port: u16,
    scheme: &str,
) -> Result<Vec<(String, String)>, String> {
    let ips = dns
        .resolver
        .lookup_ip(name)
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for ip in ips.iter() {
        let id = reverse_label(&dns.servers, ip)
            .await
            .unwrap_or_else(|| ip.to_string());
        out.push((id, format!("{scheme}://{}", SocketAddr::new(ip, port))));
    }
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    Ok(out)
}

/// The first label of `ip`'s reverse name, asked of the name servers themselves.
async fn reverse_label(
    servers: &NameServerPool<TokioConnectionProvider>,
    ip: std::net::IpAddr,
) -> Option<String> {
    let query = Query::query(Name::from(ip), RecordType::PTR);
    let response = servers
        .lookup(query, DnsRequestOptions::default())
        .next()
        .await?
        .ok()?;
    response
        .answers()
        .iter()
        .find_map(|record| match record.data() {
            RData::PTR(ptr) => ptr
                .0
                .iter()
                .next()
                .map(|l| String::from_utf8_lossy(l).into_owned())
                .filter(|l| !l.is_empty()),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_files_parse() {
        let list = parse_file("# the members\n a=http://127.0.0.1:1\n\nb=https://h:2/\n").unwrap();
        assert_eq!(
            list,
            vec![
                ("a".to_owned(), "http://127.0.0.1:1".to_owned()),
                ("b".to_owned(), "https://h:2".to_owned())
            ]
        );
        assert!(parse_file("a=ftp://x").is_err());
        assert!(parse_file("just-a-name").is_err());
        assert_eq!(parse_file("").unwrap(), vec![]);
    }
}
