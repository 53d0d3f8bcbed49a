//! HTTP between members: forwarding a client's request to the key's owner, asking peers
//! for a committed copy of an object (a peer fill), and telling peers to drop copies of
//! an object written or deleted through this node.
//!
//! Every request to a member proves membership (so the receiver serves it locally instead
//! of routing it again) with a MAC under the cluster's secret: forwarded client requests
//! in `x-granary-hop`; requests a node makes itself in `x-granary-peer-auth`, which also
//! binds the body and stands in for a client's signature. Forwarded client requests keep the client's
//! `Host` and signature, which the owner checks as if it had been asked directly.

use std::time::{Duration, SystemTime};

use axum::body::Body;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use granary_proto::headers::{HOP, PEER_AUTH, PEER_FILL, PEER_SHA256};

use std::sync::Arc;

use super::{Cluster, ClusterError, Member};
use crate::backend::{ByteStream, ObjectMeta};

pub type HttpClient = Client<HttpsConnector<HttpConnector>, Body>;

/// How long a forwarded read waits for the owner's response headers before the owner
/// counts as gone (a hung process still accepts connections).
pub const FORWARD_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a peer fill waits for a peer's answer before going to the backend.
const PEER_FILL_TIMEOUT: Duration = Duration::from_secs(2);
/// Peers asked for a copy on a miss: the next in the key's ranking, who held the key
/// before a membership change or while this node was down.
const PEER_FILL_CANDIDATES: usize = 2;

/// The client members speak to each other with: `http://` peers in plain HTTP, `https://`
/// peers over TLS, trusting the certificates of `trust` (the node's own `--tls-cert`: the
/// members of a cluster share a certificate or its issuer) and nothing else.
pub fn http_client(trust: Option<&std::path::Path>) -> anyhow::Result<HttpClient> {
    use anyhow::Context as _;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    if let Some(path) = trust {
        let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        for cert in certs {
            let cert = cert.with_context(|| format!("bad PEM in {}", path.display()))?;
            roots.add(cert).with_context(|| {
                format!("a certificate of {} cannot be trusted", path.display())
            })?;
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut conn = HttpConnector::new();
    conn.set_connect_timeout(Some(Duration::from_secs(1)));
    conn.set_nodelay(true);
    conn.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(conn);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(https))
}

/// A request's path and query, as forwarded.
pub fn target_of(uri: &http::Uri) -> String {
    uri.path_and_query()
        .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned())
}

/// Headers that describe one connection, not the message: never forwarded.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// A request to member `m` for `target` (path and query), unmarked.
fn bare_request(m: &Member, method: &Method, target: &str, body: Body) -> Request<Body> {
    let mut req = Request::new(body);
    *req.method_mut() = method.clone();
    *req.uri_mut() = format!("{}{}", m.url, target).parse().unwrap_or_default();
    req
}

impl Cluster {
    /// A request to member `m` made by this node, proving membership with
    /// `x-granary-peer-auth` over the body's hash where the cluster has a secret (which
    /// stands in for `x-granary-hop` too), else with `x-granary-hop`.
    fn own_request(&self, m: &Member, method: Method, target: &str, body: Bytes) -> Request<Body> {
        if self.secret.is_none() {
            return self.request_to(m, &method, target, Body::from(body));
        }
        let sha = if body.is_empty() {
            granary_proto::peer::EMPTY_SHA256.to_owned()
        } else {
            granary_proto::sigv4::sha256_hex(&body)
        };
        let value = self.sign_for(
            &m.id,
            &super::Outgoing {
                method: &method,
                target,
                body_sha256: &sha,
            },
        );
        let mut req = bare_request(m, &method, target, Body::from(body));
        if let Ok(v) = HeaderValue::from_str(&value) {
            req.headers_mut().insert(PEER_AUTH, v);
        }
        if sha != granary_proto::peer::EMPTY_SHA256 {
            if let Ok(h) = HeaderValue::from_str(&sha) {
                req.headers_mut().insert(PEER_SHA256, h);
            }
        }
        req
    }

    /// A request to member `m` for `target` (path and query), marked as coming from a
    /// member (`x-granary-hop`, with its proof).
    fn request_to(&self, m: &Member, method: &Method, target: &str, body: Body) -> Request<Body> {
        let mut req = bare_request(m, method, target, body);
        if let Ok(v) = HeaderValue::from_str(&self.hop_value(&m.id, method, target)) {
            req.headers_mut().insert(HOP, v);
        }
        req
    }

    /// The `x-granary-hop` value of a request to member `to`: this node's proof of
    /// membership, the body unbound (a forwarded client request is the client's to sign).
    pub(crate) fn hop_value(&self, to: &str, method: &Method, target: &str) -> String {
        self.sign_for(
            to,
            &super::Outgoing {
                method,
                target,
                body_sha256: granary_proto::peer::UNBOUND,
            },
        )
    }

    /// Sends a client's request on to member `m` and streams its answer back. An error
    /// means no answer came (the member is likely gone); the body may be spent.
    pub async fn forward(
        &self,
        m: &Member,
        method: &Method,
        target: &str,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<Response<Body>, ClusterError> {
        let mut req = self.request_to(m, method, target, body);
        let h = req.headers_mut();
        for (k, v) in headers {
            if !hop_by_hop(k) && k.as_str() != HOP && k.as_str() != PEER_AUTH {
                h.append(k.clone(), v.clone());
            }
        }
        let read = method == Method::GET || method == Method::HEAD;
        let send = self.http.request(req);
        // A write's answer comes after its whole body: only reads are timed.
        let answered = if read {
            tokio::time::timeout(FORWARD_READ_TIMEOUT, send)
                .await
                .map_err(|_| self.timeout(m))?
        } else {
            send.await
        };
        let resp = answered.map_err(|e| self.unreachable(m, &e))?;
        self.stats
            .proxied
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (mut parts, incoming) = resp.into_parts();
        let drop: Vec<HeaderName> = parts
            .headers
            .keys()
            .filter(|k| hop_by_hop(k))
            .cloned()
            .collect();
        for k in drop {
            parts.headers.remove(k);
        }
        Ok(Response::from_parts(parts, Body::new(incoming)))
    }

    /// A request this node makes of member `m` for its own ends (a batch item, a part of
    /// a prefetch job): the answer, or why none came within `wait`.
    pub async fn ask(
        &self,
        m: &Member,
        method: Method,
        target: &str,
        body: Bytes,
        wait: Duration,
    ) -> Result<Response<Body>, ClusterError> {
        self.ask_with(m, method, target, &[], body, wait).await
    }

    /// [`Cluster::ask`] with more headers.
    pub async fn ask_with(
        &self,
        m: &Member,
        method: Method,
        target: &str,
        headers: &[(&'static str, String)],
        body: Bytes,
        wait: Duration,
    ) -> Result<Response<Body>, ClusterError> {
        let mut req = self.own_request(m, method, target, body);
        let h = req.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        for (k, v) in headers {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.insert(*k, v);
            }
        }
        match tokio::time::timeout(wait, self.http.request(req)).await {
            Ok(Ok(resp)) => {
                let (parts, incoming) = resp.into_parts();
                Ok(Response::from_parts(parts, Body::new(incoming)))
            }
            Ok(Err(e)) => Err(self.unreachable(m, &e)),
            Err(_) => Err(self.timeout(m)),
        }
    }

    fn unreachable(&self, m: &Member, e: &dyn std::error::Error) -> ClusterError {
        ClusterError::Unreachable {
            node: m.id.clone(),
            why: chain(e),
        }
    }

    fn timeout(&self, m: &Member) -> ClusterError {
        ClusterError::Timeout { node: m.id.clone() }
    }

    /// A committed copy of the object from a peer that holds one, its metadata as the
    /// peer sends it. Asks the next members in the key's ranking; `None` when none has
    /// it or none answers in time.
    pub async fn peer_copy(&self, bucket: &str, key: &str) -> Option<(ObjectMeta, ByteStream)> {
        let candidates: Vec<Arc<Member>> = self
            .others_ranked(bucket, key)
            .into_iter()
            .take(PEER_FILL_CANDIDATES)
            .collect();
        self.copy_from(&candidates, bucket, key).await
    }

    /// A committed copy of the object from one of `members` (the first that answers with
    /// one); `None` when none holds it or answers in time.
    pub async fn copy_from(
        &self,
        members: &[Arc<Member>],
        bucket: &str,
        key: &str,
    ) -> Option<(ObjectMeta, ByteStream)> {
        let target = granary_proto::encode::object_path(bucket, key);
        let asks = members
            .iter()
            .map(|m| {
                let mut req = self.own_request(m, Method::GET, &target, Bytes::new());
                req.headers_mut()
                    .insert(PEER_FILL, HeaderValue::from_static("1"));
                let ask = self.http.request(req);
                Box::pin(async move {
                    match tokio::time::timeout(PEER_FILL_TIMEOUT, ask).await {
                        Ok(Ok(resp)) if resp.status() == http::StatusCode::OK => Ok(resp),
                        _ => Err(()),
                    }
                })
            })
            .collect::<Vec<_>>();
        if asks.is_empty() {
            return None;
        }
        let (resp, _rest) = futures::future::select_ok(asks).await.ok()?;
        let meta = meta_of(resp.headers())?;
        let body = http_body_util::BodyExt::into_data_stream(resp.into_body())
            .map_err(std::io::Error::other)
            .boxed();
        Some((meta, body))
    }

    /// Asks member `m`, back after being down (or first heard, or after an invalidation
    /// did not reach it), to check its cached copies against the backend before serving
    /// them (`POST /_granary/revalidate`).
    pub async fn tell_revalidate(&self, m: &Member) -> Result<(), ClusterError> {
        let req = self.own_request(m, Method::POST, "/_granary/revalidate", Bytes::new());
        match tokio::time::timeout(Duration::from_secs(2), self.http.request(req)).await {
            Ok(Ok(r)) if r.status().is_success() => Ok(()),
            Ok(Ok(r)) => Err(ClusterError::Answered {
                node: m.id.clone(),
                status: r.status().as_u16(),
            }),
            Ok(Err(e)) => Err(self.unreachable(m, &e)),
            Err(_) => Err(self.timeout(m)),
        }
    }

    /// Tells the other members to drop their copies of these objects (written or
    /// deleted through this node), and waits for them: the write is acknowledged only
    /// once every member seen up has dropped its copies, so no read that starts after it
    /// finds an older version anywhere.
    ///
    /// - A member seen up that does not take it within [`INVALIDATE_WAIT`] is marked
    ///   down: it is routed around, and told to check its copies before it is counted up
    ///   again.
    /// - A member seen down is told too, without waiting (it may be back already), and
    ///   is marked as having missed it. A member that just restarted trusts none of its
    ///   copies until every member sees it up (see `membership`), so it serves nothing
    ///   this write made stale.
    /// - Members taken out of the list within [`super::DEPARTED_GRACE`] are told as
    ///   well: a member whose list lags may route to them for a moment.
    pub async fn invalidate_members(self: &Arc<Self>, objects: &[(String, String)]) {
        if objects.is_empty() {
            return;
        }
        let mut targets = self.others();
        targets.extend(self.departed());
        if targets.is_empty() {
            return;
        }
        let list: Vec<_> = objects
            .iter()
            .map(|(b, k)| serde_json::json!({"bucket": b, "key": k}))
            .collect();
        let body = Bytes::from(serde_json::Value::Array(list).to_string());
        let mut waits = Vec::new();
        for m in targets {
            let wait = m.is_up();
            if !wait {
                self.missed(&m);
            }
            let mut req = self.own_request(&m, Method::POST, "/_granary/invalidate", body.clone());
            req.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            let send = self.http.request(req);
            let cluster = self.clone();
            let told = tokio::spawn(async move {
                let failed = match tokio::time::timeout(INVALIDATE_WAIT, send).await {
                    Ok(Ok(r)) if r.status().is_success() => None,
                    Ok(Ok(r)) => Some(format!("it answered {}", r.status())),
                    Ok(Err(e)) => Some(chain(&e)),
                    Err(_) => Some("no answer in time".to_owned()),
                };
                if let Some(why) = failed {
                    if m.is_up() {
                        cluster.mark_down(&m, format!("it did not take an invalidation: {why}"));
                    } else {
                        cluster.missed(&m);
                    }
                }
            });
            if wait {
                waits.push(told);
            }
        }
        futures::future::join_all(waits).await;
    }
}

/// How long a write waits for a member seen up to drop its copies.
pub const INVALIDATE_WAIT: Duration = Duration::from_secs(2);

/// An error and its sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    msg
}

/// An object's metadata from the headers of a `200` answer.
pub fn meta_of(h: &HeaderMap) -> Option<ObjectMeta> {
    let text = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
    let size = text("content-length")?.parse().ok()?;
    let etag = text("etag")?.trim_matches('"').to_owned();
    let last_modified = text("last-modified")
        .and_then(|v| httpdate::parse_http_date(v).ok())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut headers: Vec<(String, String)> = h
        .iter()
        .filter(|(k, _)| granary_proto::headers::is_stored(k.as_str()))
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    headers.sort();
    Some(ObjectMeta {
        size,
        etag,
        last_modified,
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_comes_from_an_answer() {
        let mut h = HeaderMap::new();
        h.insert("content-length", "12".parse().unwrap());
        h.insert("etag", "\"abc\"".parse().unwrap());
        h.insert(
            "last-modified",
            "Sun, 06 Nov 1994 08:49:37 GMT".parse().unwrap(),
        );
        h.insert("content-type", "application/x-tar".parse().unwrap());
        h.insert("x-amz-meta-shard", "7".parse().unwrap());
        h.insert("x-granary-cache", "hit".parse().unwrap());
        let m = meta_of(&h).unwrap();
        assert_eq!(m.size, 12);
        assert_eq!(m.etag, "abc");
        assert_eq!(
            m.headers,
            vec![
                ("content-type".to_owned(), "application/x-tar".to_owned()),
                ("x-amz-meta-shard".to_owned(), "7".to_owned())
            ]
        );
        h.remove("etag");
        assert!(meta_of(&h).is_none());
    }
}
