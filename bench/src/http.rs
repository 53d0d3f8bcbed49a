//! The HTTP side shared by the workload and the report: the target (endpoint, keep-alive
//! client, optional SigV4 signer) and the small control requests (listing, stats, bucket
//! creation) whose bodies are read whole.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use granary_proto::encode;
use granary_proto::sigv4::{Request as Signable, Signer, UNSIGNED_PAYLOAD};

use crate::listing::{parse_list_page, Object};

/// The HTTP client every worker shares: a pool of keep-alive HTTP/1.1 connections.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Builds the shared client, keeping up to `workers` idle connections to the host.
pub fn http_client(workers: usize) -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(workers.max(1))
        .pool_idle_timeout(Duration::from_secs(90))
        .build(conn)
}

/// The server under load: where it is, how requests reach it and how they are signed.
#[derive(Clone)]
pub struct Target {
    /// `http://host:port`, no trailing slash.
    pub endpoint: String,
    /// `host:port`, as signed.
    pub host: String,
    pub client: HttpClient,
    /// Signs every request with SigV4 when set (S3 servers that refuse anonymous requests).
    pub signer: Option<Arc<Signer>>,
}

impl Target {
    /// A target for `endpoint` (`http://host:port`) with room for `workers` connections.
    pub fn new(endpoint: &str, workers: usize, signer: Option<Signer>) -> anyhow::Result<Self> {
        let endpoint = endpoint.trim_end_matches('/');
        let Some(host) = endpoint.strip_prefix("http://") else {
            anyhow::bail!(
                "--endpoint must be http://host:port (HTTPS is not supported), got {endpoint:?}"
            );
        };
        anyhow::ensure!(
            !host.is_empty() && !host.contains('/'),
            "--endpoint must be http://host:port, got {endpoint:?}"
        );
        Ok(Target {
            endpoint: endpoint.to_owned(),
            host: host.to_owned(),
            client: http_client(workers),
            signer: signer.map(Arc::new),
        })
    }

    /// `/bucket/key`, percent-encoded as sent and signed.
    pub fn object_path(bucket: &str, key: &str) -> String {
        encode::object_path(bucket, key)
    }

    /// A request builder for `method path?query`, signed when the target signs.
    /// `path` is already encoded; `query` holds decoded pairs.
    pub fn builder(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
    ) -> http::request::Builder {
        let q = encode::query_string(query.iter().copied());
        let uri = if q.is_empty() {
            format!("{}{path}", self.endpoint)
        } else {
            format!("{}{path}?{q}", self.endpoint)
        };
        let mut b = Request::builder().method(method.clone()).uri(uri);
        if let Some(s) = &self.signer {
            // Bodies go as `UNSIGNED-PAYLOAD`, as the AWS SDKs send them over TLS and S3
            // takes over plain HTTP: signing costs two hashes of a few hundred bytes.
            let signed = s.sign(
                &Signable {
                    method: method.as_str(),
                    path,
                    query: &q,
                    headers: &[("host", &self.host)],
                    payload_hash: UNSIGNED_PAYLOAD,
                },
                std::time::SystemTime::now(),
            );
            for (name, value) in signed.headers {
                b = b.header(name, value);
            }
        }
        b
    }

    /// A request whose (small) body is read whole: listings, stats, bucket creation.
    pub async fn text(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
    ) -> anyhow::Result<(StatusCode, String)> {
        let req = self
            .builder(method.clone(), path, query)
            .body(Full::new(Bytes::new()))?;
        let resp = self
            .client
            .request(req)
            .await
            .with_context(|| format!("{method} {}{path}", self.endpoint))?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// An unsigned GET of a native JSON route on another node (`url` is the node's base).
    pub async fn json_at(&self, url: &str, path: &str) -> anyhow::Result<serde_json::Value> {
        let req = Request::get(format!("{}{path}", url.trim_end_matches('/')))
            .body(Full::new(Bytes::new()))?;
        let resp = self
            .client
            .request(req)
            .await
            .with_context(|| format!("GET {url}{path}"))?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            anyhow::bail!("GET {url}{path}: {status}");
        }
        Ok(serde_json::from_slice(&body)?)
    }

    /// Lists `bucket` under `prefix` with ListObjectsV2, following continuation tokens.
    pub async fn list_objects(&self, bucket: &str, prefix: &str) -> anyhow::Result<Vec<Object>> {
        let path = format!("/{}", encode::query_value(bucket));
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![("list-type", "2"), ("prefix", prefix)];
            if let Some(t) = &token {
                query.push(("continuation-token", t));
            }
            let (status, body) = self.text(Method::GET, &path, &query).await?;
            let page = parse_list_page(&body)
                .with_context(|| format!("listing {path} (status {status})"))?;
            anyhow::ensure!(status.is_success(), "listing {path} answered {status}");
            out.extend(page.objects);
            match page.next_token {
                Some(t) => token = Some(t),
                None => return Ok(out),
            }
        }
    }

    /// `PUT /bucket` so a PUT workload has somewhere to write; any answer is accepted
    /// (409 when it exists, 405 from servers without buckets).
    pub async fn ensure_bucket(&self, bucket: &str) {
        let _ = self
            .text(
                Method::PUT,
                &format!("/{}", encode::query_value(bucket)),
                &[],
            )
            .await;
    }
}
