//! The HTTP side shared by the workload and the report: the keep-alive client and the
//! small control requests (listing, stats, bucket creation) whose bodies are read whole.

use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::listing::{encode, parse_list_page, Object};

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

/// Lists `bucket` under `prefix` with ListObjectsV2, following continuation tokens.
pub async fn list_objects(
    client: &HttpClient,
    endpoint: &str,
    bucket: &str,
    prefix: &str,
) -> anyhow::Result<Vec<Object>> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut uri = format!(
            "{endpoint}/{}?list-type=2&prefix={}",
            encode(bucket, false),
            encode(prefix, false)
        );
        if let Some(t) = &token {
            uri.push_str("&continuation-token=");
            uri.push_str(&encode(t, false));
        }
        let (status, body) = get_text(client, &uri).await?;
        let page =
            parse_list_page(&body).with_context(|| format!("listing {uri} (status {status})"))?;
        anyhow::ensure!(status.is_success(), "listing {uri} answered {status}");
        out.extend(page.objects);
        match page.next_token {
            Some(t) => token = Some(t),
            None => return Ok(out),
        }
    }
}

/// A GET whose (small) body is read whole: listings and stats.
pub async fn get_text(client: &HttpClient, uri: &str) -> anyhow::Result<(StatusCode, String)> {
    let req = Request::get(uri).body(Full::new(Bytes::new()))?;
    let resp = client
        .request(req)
        .await
        .with_context(|| format!("GET {uri}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// `PUT /bucket` so a PUT workload has somewhere to write; any answer is accepted
/// (409 when it exists, 405 from servers without buckets).
pub async fn ensure_bucket(client: &HttpClient, endpoint: &str, bucket: &str) {
    let uri = format!("{endpoint}/{}", encode(bucket, false));
    if let Ok(req) = Request::put(uri).body(Full::new(Bytes::new())) {
        if let Ok(resp) = client.request(req).await {
            let _ = resp.into_body().collect().await;
        }
    }
}
