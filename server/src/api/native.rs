//! The native API under `/_granary/`: health, stats (JSON) and metrics (Prometheus text).

use std::fmt::Write;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, Method, StatusCode};
use serde_json::json;

use super::{s3, AppState};
use crate::error::{S3Code, S3Error};

pub async fn handle(state: &AppState, req: Request) -> Response {
    let path = req.uri().path().trim_end_matches('/');
    tracing::Span::current().record("op", path);
    let get = req.method() == Method::GET || req.method() == Method::HEAD;
    match (path, get) {
        ("/_granary/health", true) => {
            let u = state.cache.usage();
            json_response(json!({
                "status": "ok",
                "node_id": state.node_id,
                "capacity_bytes": u.capacity,
                "free_bytes": u.capacity.saturating_sub(u.used + u.reserved),
                "admitting": !state.cache.refusing(),
            }))
        }
        ("/_granary/cluster", true) => {
            let q = s3::auth::query_pairs(req.uri().query().unwrap_or(""));
            let arg = |n: &str| q.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
            match (arg("bucket"), arg("key")) {
                (Some(b), Some(k)) => json_response(state.cluster.view(Some((b, k)))),
                (None, None) => json_response(state.cluster.view(None)),
                _ => S3Error::new(
                    S3Code::InvalidArgument,
                    "give both bucket= and key= to ask for an owner",
                )
                .into_response(),
            }
        }
        ("/_granary/invalidate", false) if req.method() == Method::POST => {
            match invalidate(state, req).await {
                Ok(r) => r,
                Err(e) => e.into_response(),
            }
        }
        ("/_granary/revalidate", false) if req.method() == Method::POST => {
            let (parts, _) = req.into_parts();
            match peer_only(state, &parts) {
                Ok(()) => {
                    state.cache.revalidate_all();
                    json_response(json!({"revalidate": true}))
                }
                Err(e) => e.into_response(),
            }
        }
        ("/_granary/stats", true) => json_response(stats_json(state)),
        ("/_granary/metrics", true) => {
            let mut resp = Response::new(Body::from(metrics_text(state)));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            resp
        }
        (
            "/_granary/health" | "/_granary/stats" | "/_granary/metrics" | "/_granary/cluster",
            false,
        ) => S3Error::new(S3Code::MethodNotAllowed, "use GET").into_response(),
        _ => S3Error::new(S3Code::NotFound, format!("no native route {path}"))
            .with_resource(path.to_owned())
            .into_response(),
    }
}

/// `POST /_granary/invalidate` (from a peer): drops this node's copies of the objects
/// listed, `[{"bucket":…,"key":…}]`, written or deleted through another node.
async fn invalidate(state: &AppState, req: Request) -> Result<Response, S3Error> {
    let (parts, body) = req.into_parts();
    peer_only(state, &parts)?;
    let body = axum::body::to_bytes(body, MAX_INVALIDATE_BODY)
        .await
        .map_err(|_| S3Error::new(S3Code::EntityTooLarge, "the list is too large"))?;
    #[derive(serde::Deserialize)]
    struct Item {
        bucket: String,
        key: String,
    }
    let items: Vec<Item> = serde_json::from_slice(&body)
        .map_err(|e| S3Error::new(S3Code::MalformedXML, format!("bad JSON: {e}")))?;
    for it in &items {
        state.cache.invalidate(&it.bucket, &it.key);
    }
    Ok(json_response(json!({"invalidated": items.len()})))
}

/// With credentials set, only a member (`x-granary-peer-auth`) may call this route.
fn peer_only(state: &AppState, parts: &http::request::Parts) -> Result<(), S3Error> {
    if let Some(creds) = &state.creds {
        let value = parts
            .headers
            .get(s3::auth::PEER_AUTH)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                S3Error::new(S3Code::AccessDenied, "only cluster members may ask this")
            })?;
        s3::auth::check_peer_auth(creds, parts, value)?;
    }
    Ok(())
}

/// 1,000 keys of 1 KiB and their buckets, with room to spare.
const MAX_INVALIDATE_BODY: usize = 4 << 20;

fn json_response(v: serde_json::Value) -> Response {
    let mut resp = (StatusCode::OK, v.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn stats_json(state: &AppState) -> serde_json::Value {
    let s = state.stats.snapshot();
    let u = state.cache.usage();
    json!({
        "node_id": state.node_id,
        "policy": state.cache.policy().as_str(),
        "backend": state.backend.describe(),
        "used_bytes": u.used,
        "reserved_bytes": u.reserved,
        "capacity_bytes": u.capacity,
        "objects": u.objects,
        "hits": s.hits,
        "misses": s.misses,
        "peer_fills": s.peer_fills,
        "bypasses": s.bypasses,
        "bytes_served": s.bytes_served,
        "bytes_received": s.bytes_received,
        "bytes_from_backend": s.bytes_from_backend,
        "bytes_from_peers": s.bytes_from_peers,
        "bytes_to_peers": s.bytes_to_peers,
        "peer_serves": s.peer_serves,
        "proxied": s.proxied,
        "redirects": s.redirects,
        "requests": s.requests,
        "errors": s.errors,
    })
}

fn metrics_text(state: &AppState) -> String {
    let s = state.stats.snapshot();
    let u = state.cache.usage();
    let mut out = String::new();
    let counters = [
        ("requests_total", "HTTP requests answered", s.requests),
        (
            "errors_total",
            "requests answered with 4xx or 5xx",
            s.errors,
        ),
        (
            "cache_hits_total",
            "object reads from this node's cache",
            s.hits,
        ),
        (
            "cache_misses_total",
            "object reads filled from the backend",
            s.misses,
        ),
        (
            "cache_peer_fills_total",
            "object reads filled from a peer",
            s.peer_fills,
        ),
        (
            "cache_bypasses_total",
            "object reads served without admission",
            s.bypasses,
        ),
        (
            "bytes_served_total",
            "response body bytes sent",
            s.bytes_served,
        ),
        (
            "bytes_received_total",
            "request body bytes stored",
            s.bytes_received,
        ),
        (
            "backend_bytes_total",
            "bytes read from the backend",
            s.bytes_from_backend,
        ),
        (
            "peer_bytes_total",
            "bytes read from peers",
            s.bytes_from_peers,
        ),
        (
            "peer_bytes_sent_total",
            "bytes of cached objects sent to peers filling from this node",
            s.bytes_to_peers,
        ),
        (
            "proxied_total",
            "requests forwarded to the key's owner",
            s.proxied,
        ),
        (
            "redirects_total",
            "requests answered 307 to the key's owner",
            s.redirects,
        ),
    ];
    for (name, help, v) in counters {
        let _ = writeln!(out, "# HELP granary_{name} {help}");
        let _ = writeln!(out, "# TYPE granary_{name} counter");
        let _ = writeln!(out, "granary_{name}{{node=\"{}\"}} {v}", state.node_id);
    }
    let gauges = [
        (
            "cache_used_bytes",
            "bytes of object data in the cache",
            u.used,
        ),
        (
            "cache_reserved_bytes",
            "bytes reserved by fills in progress",
            u.reserved,
        ),
        (
            "cache_capacity_bytes",
            "bytes the cache may hold",
            u.capacity,
        ),
        ("cache_objects", "objects in the cache", u.objects),
    ];
    let (counts, sum) = state.stats.latency.cumulative();
    let _ = writeln!(
        out,
        "# HELP granary_request_duration_seconds request time, first byte in to last byte out"
    );
    let _ = writeln!(out, "# TYPE granary_request_duration_seconds histogram");
    for (i, c) in counts.iter().enumerate() {
        let le = crate::stats::LATENCY_BUCKETS
            .get(i)
            .map_or("+Inf".to_owned(), |b| b.to_string());
        let _ = writeln!(
            out,
            "granary_request_duration_seconds_bucket{{node=\"{}\",le=\"{le}\"}} {c}",
            state.node_id
        );
    }
    let total = counts.last().copied().unwrap_or(0);
    let _ = writeln!(
        out,
        "granary_request_duration_seconds_sum{{node=\"{}\"}} {sum}",
        state.node_id
    );
    let _ = writeln!(
        out,
        "granary_request_duration_seconds_count{{node=\"{}\"}} {total}",
        state.node_id
    );
    for (name, help, v) in gauges {
        let _ = writeln!(out, "# HELP granary_{name} {help}");
        let _ = writeln!(out, "# TYPE granary_{name} gauge");
        let _ = writeln!(out, "granary_{name}{{node=\"{}\"}} {v}", state.node_id);
    }
    out
}
