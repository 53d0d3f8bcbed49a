//! The native API under `/_granary/`: health, stats (JSON) and metrics (Prometheus text).

use std::fmt::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, Method, StatusCode};
use serde_json::json;

use super::error::{S3Code, S3Error};
use super::{s3, AppState};

pub async fn handle(state: &Arc<AppState>, req: Request) -> Response {
    let node = &state.node;
    let path = req.uri().path().trim_end_matches('/');
    tracing::Span::current().record("op", path);
    let get = req.method() == Method::GET || req.method() == Method::HEAD;
    match (path, get) {
        ("/_granary/health", true) => {
            // A member's probe from its regular round announces it: see it up first,
            // and say whether it is in this node's list.
            let mut known = None;
            if req
                .headers()
                .contains_key(crate::cluster::membership::ANNOUNCE)
            {
                if let Some(id) = super::FromMember::of(&req) {
                    known = Some(crate::cluster::membership::announced(&node.cluster, id).await);
                }
            }
            let u = node.cache.usage();
            let settled = node.cluster.settled();
            let mut resp = json_response(json!({
                "status": if settled { "ok" } else { "settling" },
                "node_id": node.id,
                "capacity_bytes": u.capacity,
                "free_bytes": node.cache.free(),
                "admitting": !node.cache.refusing(),
            }));
            if !settled {
                // Not every member probed yet: not ready to agree on owners.
                *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                resp.extensions_mut().insert(super::NotAnError);
            }
            if let Some(known) = known {
                resp.headers_mut().insert(
                    crate::cluster::membership::ANNOUNCE,
                    http::HeaderValue::from_static(if known {
                        crate::cluster::membership::KNOWN
                    } else {
                        "unknown"
                    }),
                );
            }
            resp
        }
        ("/_granary/cluster", true) => {
            let q = granary_proto::encode::query_pairs(req.uri().query().unwrap_or(""));
            let arg = |n: &str| q.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
            let urls = inside(state, &req);
            match (arg("bucket"), arg("key")) {
                (Some(b), Some(k)) => json_response(node.cluster.view_json(Some((b, k)), urls)),
                (None, None) => json_response(node.cluster.view_json(None, urls)),
                _ => S3Error::new(
                    S3Code::InvalidArgument,
                    "give both bucket= and key= to ask for an owner",
                )
                .into_response(),
            }
        }
        ("/_granary/batch", _) => match super::batch::handle(state, req).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        ("/_granary/prefetch", _) => match prefetch(state, req).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        ("/_granary/jobs", true) => {
            match s3::auth::authenticate(
                state.creds.as_ref(),
                state.anonymous_read,
                &req.into_parts().0,
            ) {
                Ok(_) => json_response(serde_json::Value::Array(
                    node.jobs.all().iter().map(|j| j.to_json()).collect(),
                )),
                Err(e) => e.into_response(),
            }
        }
        (p, _) if p.starts_with("/_granary/jobs/") => match job(state, req).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        ("/_granary/invalidate", false) if req.method() == Method::POST => {
            match invalidate(state, req).await {
                Ok(r) => r,
                Err(e) => e.into_response(),
            }
        }
        ("/_granary/take", false) if req.method() == Method::POST => match take(state, req).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        ("/_granary/revalidate", false) if req.method() == Method::POST => {
            let (parts, _) = req.into_parts();
            match s3::auth::peer_only(&state.node.cluster, &parts) {
                Ok(()) => {
                    node.revalidate();
                    json_response(json!({"revalidate": true}))
                }
                Err(e) => e.into_response(),
            }
        }
        ("/_granary/stats", true) => {
            let mut stats = stats_json(state);
            if !inside(state, &req) {
                let kind = state.node.backend.describe();
                stats["backend"] = json!(kind.split(':').next().unwrap_or(""));
            }
            json_response(stats)
        }
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
    s3::auth::peer_only(&state.node.cluster, &parts)?;
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
    let objects: Vec<(String, String)> = items.into_iter().map(|it| (it.bucket, it.key)).collect();
    state.node.invalidate(&objects);
    Ok(json_response(json!({"invalidated": objects.len()})))
}

/// `POST /_granary/take` (from a member, during a rebalance): take its copy of an object
/// this node owns, `{"bucket","key","etag","size","from"}`; answered with what became of
/// it (`"held"`, `"stale"`, `"not-admitted"`, `"not-owner"`).
async fn take(state: &AppState, req: Request) -> Result<Response, S3Error> {
    let (parts, body) = req.into_parts();
    s3::auth::peer_only(&state.node.cluster, &parts)?;
    let body = axum::body::to_bytes(body, 64 << 10)
        .await
        .map_err(|_| S3Error::new(S3Code::EntityTooLarge, "the offer is too large"))?;
    let offer: crate::node::Offer = serde_json::from_slice(&body)
        .map_err(|e| S3Error::new(S3Code::InvalidArgument, format!("bad offer: {e}")))?;
    let taken = state.node.take(&offer).await?;
    Ok(json_response(
        serde_json::to_value(taken).unwrap_or_default(),
    ))
}

/// `POST /_granary/prefetch`: `{"bucket","prefix"}` starts a cluster-wide prefetch,
/// answered `202 {"id"}`.
async fn prefetch(state: &Arc<AppState>, req: Request) -> Result<Response, S3Error> {
    let (parts, body) = req.into_parts();
    if parts.method != Method::POST {
        return Err(S3Error::new(S3Code::MethodNotAllowed, "use POST"));
    }
    let verdict = s3::auth::authenticate(state.creds.as_ref(), state.anonymous_read, &parts)?;
    let mut r = s3::Req {
        parts,
        body,
        bucket: String::new(),
        key: None,
        query: Vec::new(),
        verdict,
    };
    let raw = r.read_body_up_to(MAX_PART_BODY).await?;
    let asked: crate::node::PrefetchRequest = serde_json::from_slice(&raw).map_err(|e| {
        S3Error::new(
            S3Code::InvalidArgument,
            format!("the body must be {{\"bucket\":…,\"prefix\":…}}: {e}"),
        )
    })?;
    let resource = format!("/{}/{}", asked.bucket, asked.prefix);
    let job = state
        .node
        .start_prefetch(asked)
        .await
        .map_err(|e| S3Error::from(e).with_resource(resource))?;
    let mut resp =
        json_response(json!({"id": job.id, "kind": job.kind, "state": job.state().as_str()}));
    *resp.status_mut() = StatusCode::ACCEPTED;
    Ok(resp)
}

/// `GET|DELETE /_granary/jobs/{id}`: a job's progress, or its cancellation. A job this
/// node does not know is looked for on the other members (it was taken by another).
async fn job(state: &Arc<AppState>, req: Request) -> Result<Response, S3Error> {
    let (parts, _) = req.into_parts();
    s3::auth::authenticate(state.creds.as_ref(), state.anonymous_read, &parts)?;
    let id = parts.uri.path().trim_end_matches('/')["/_granary/jobs/".len()..].to_owned();
    let delete = match parts.method {
        Method::GET | Method::HEAD => false,
        Method::DELETE => true,
        _ => return Err(S3Error::new(S3Code::MethodNotAllowed, "use GET or DELETE")),
    };
    if let Some(job) = state.node.jobs.get(&id) {
        if delete {
            crate::jobs::cancel(&job);
        }
        return Ok(json_response(job.to_json()));
    }
    let c = &state.node.cluster;
    if super::FromMember::of_parts(&parts).is_none() {
        let target = format!("/_granary/jobs/{id}");
        for m in c.others_up() {
            let asked = c
                .ask(
                    &m,
                    parts.method.clone(),
                    &target,
                    bytes::Bytes::new(),
                    std::time::Duration::from_secs(2),
                )
                .await;
            if let Ok(resp) = asked {
                if resp.status() == StatusCode::OK {
                    return Ok(resp);
                }
            }
        }
    }
    Err(S3Error::new(S3Code::NotFound, format!("no job {id}"))
        .with_resource(parts.uri.path().to_owned()))
}

/// A prefetch part names its objects: room for a few hundred thousand keys.
const MAX_PART_BODY: usize = 64 << 20;

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

/// Built-in transforms' thread time and transform commands' user and system time.
/// Whether a request may see where things are (the backend's path or endpoint, the
/// members' URLs): on an open node anyone; with credentials, a signed request or a
/// member's. Health checks and Prometheus scrapes need neither.
fn inside(state: &AppState, req: &Request) -> bool {
    let Some(creds) = state.creds.as_ref() else {
        return true;
    };
    let (parts, _) = Request::new(()).into_parts();
    let mut parts = parts;
    parts.method = req.method().clone();
    parts.uri = req.uri().clone();
    parts.headers = req.headers().clone();
    granary_proto::auth::authenticate(Some(creds), false, &parts).is_ok_and(|v| v.signed)
}

fn transform_cpu_seconds(s: &crate::stats::Snapshot) -> f64 {
    (s.transform_cpu_us + crate::transform::children_cpu_us()) as f64 / 1e6
}

fn stats_json(state: &AppState) -> serde_json::Value {
    let node = &state.node;
    let s = node.stats.snapshot();
    let u = node.cache.usage();
    json!({
        "node_id": node.id,
        "policy": node.cache.policy().as_str(),
        "backend": node.backend.describe(),
        "used_bytes": u.used,
        "reserved_bytes": u.reserved,
        "capacity_bytes": u.capacity,
        "disk_free_bytes": node.cache.disk_free(),
        "admitting": !node.cache.refusing(),
        "objects": u.objects,
        "tar_indexes_built": node.cache.indexes_built(),
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
        "transforms_run": s.transforms_run,
        "transform_hits": s.transform_hits,
        "transform_errors": s.transform_errors,
        "transform_cpu_seconds": transform_cpu_seconds(&s),
        "local_reads": s.local_reads,
        "bytes_sent_from_files": crate::io::sendfile::bytes_sent_from_files(),
        "slowdowns": s.slowdowns,
        "process_cpu_seconds": crate::stats::rusage_us(libc::RUSAGE_SELF) as f64 / 1e6,
        "requests": s.requests,
        "errors": s.errors,
    })
}

fn metrics_text(state: &AppState) -> String {
    let node = &state.node;
    let s = node.stats.snapshot();
    let u = node.cache.usage();
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
        ("transforms_total", "transforms computed", s.transforms_run),
        (
            "transform_hits_total",
            "transformed reads answered from a cached result",
            s.transform_hits,
        ),
        (
            "transform_errors_total",
            "transforms that failed",
            s.transform_errors,
        ),
        (
            "slowdowns_total",
            "requests refused with 503 SlowDown at the request limit",
            s.slowdowns,
        ),
        (
            "local_reads_total",
            "object reads answered with a descriptor of the cache file",
            s.local_reads,
        ),
        (
            "bytes_sent_from_files_total",
            "bytes of cache hits that left with sendfile, not copied through the node",
            crate::io::sendfile::bytes_sent_from_files(),
        ),
    ];
    for (name, help, v) in counters {
        let _ = writeln!(out, "# HELP granary_{name} {help}");
        let _ = writeln!(out, "# TYPE granary_{name} counter");
        let _ = writeln!(out, "granary_{name}{{node=\"{}\"}} {v}", node.id);
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
    let seconds = [
        (
            "transform_cpu_seconds_total",
            "CPU time spent in transforms",
            transform_cpu_seconds(&s),
        ),
        (
            "process_cpu_seconds_total",
            "user and system CPU time of the node",
            crate::stats::rusage_us(libc::RUSAGE_SELF) as f64 / 1e6,
        ),
    ];
    for (name, help, v) in seconds {
        let _ = writeln!(out, "# HELP granary_{name} {help}");
        let _ = writeln!(out, "# TYPE granary_{name} counter");
        let _ = writeln!(out, "granary_{name}{{node=\"{}\"}} {v}", node.id);
    }
    let (counts, sum) = node.stats.latency.cumulative();
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
            node.id
        );
    }
    let total = counts.last().copied().unwrap_or(0);
    let _ = writeln!(
        out,
        "granary_request_duration_seconds_sum{{node=\"{}\"}} {sum}",
        node.id
    );
    let _ = writeln!(
        out,
        "granary_request_duration_seconds_count{{node=\"{}\"}} {total}",
        node.id
    );
    for (name, help, v) in gauges {
        let _ = writeln!(out, "# HELP granary_{name} {help}");
        let _ = writeln!(out, "# TYPE granary_{name} gauge");
        let _ = writeln!(out, "granary_{name}{{node=\"{}\"}} {v}", node.id);
    }
    out
}
