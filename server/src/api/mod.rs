//! The HTTP surface: one entry point that checks the request's size, opens its tracing
//! span, and hands it to the native API (`/_granary/…`) or, once routed to the key's
//! owner, the S3 API (everything else). Handlers parse requests, call the node service
//! (`granary_core::node`) and write answers; `error` maps every layer's error to an S3 code.

pub mod batch;
pub mod error;
pub mod headers;
pub mod native;
pub mod route;
pub mod s3;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tracing::{field::Empty, Instrument, Span};

use granary_proto::auth::Credentials;

use crate::config::Config;
use error::{S3Code, S3Error};
use granary_core::Metric;
use granary_core::Node;
use route::Routed;

/// The member a request came from, when it proves membership (see
/// `Cluster::member_of`); set on every request by `entry`. Members' own headers
/// (`x-granary-hop`, `-spill`, `-peer-fill`, `-announce`) count only with it.
#[derive(Debug, Clone, Default)]
pub struct FromMember(pub Option<String>);

impl FromMember {
    /// The member a request came from, if it proved it.
    pub fn of<B>(req: &http::Request<B>) -> Option<&str> {
        req.extensions()
            .get::<FromMember>()
            .and_then(|m| m.0.as_deref())
    }

    /// The same, for a request taken apart.
    pub fn of_parts(parts: &http::request::Parts) -> Option<&str> {
        parts
            .extensions
            .get::<FromMember>()
            .and_then(|m| m.0.as_deref())
    }
}

/// Marks an error status that is a normal answer (a peer asking for a copy this node
/// does not hold): not counted in `errors`.
#[derive(Debug, Clone, Copy)]
pub struct NotAnError;

/// Request headers beyond this many bytes in total are refused with `431`.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// What every request handler shares: the node, and what HTTP needs of the config.
pub struct AppState {
    pub node: Arc<Node>,
    pub creds: Option<Credentials>,
    pub anonymous_read: bool,
    pub max_requests: usize,
    /// Requests in progress, against `--max-requests`.
    pub requests: crate::limits::RequestLimit,
}

impl AppState {
    pub fn new(config: &Config, node: Arc<Node>) -> Arc<AppState> {
        Arc::new(AppState {
            node,
            creds: config.credentials(),
            anonymous_read: config.anonymous_read,
            max_requests: config.max_requests,
            requests: crate::limits::RequestLimit::new(config.max_requests),
        })
    }
}

/// The axum router: every path goes through `entry`.
pub fn router(state: Arc<AppState>) -> axum::Router {
    axum::Router::new().fallback(entry).with_state(state)
}

static REQUEST_SEQ: AtomicU64 = AtomicU64::new(1);

/// A request id unique within this process run, for `x-amz-request-id` and logs.
pub fn request_id() -> String {
    let n = REQUEST_SEQ.fetch_add(1, Ordering::Relaxed);
    format!("{:016X}", n ^ (std::process::id() as u64) << 40)
}

async fn entry(State(state): State<Arc<AppState>>, mut req: Request) -> Response {
    let span = tracing::info_span!(
        "request",
        op = Empty,
        method = %req.method(),
        bucket = Empty,
        key = Empty,
        status = Empty,
        bytes = Empty,
    );
    let started = Instant::now();
    // Health probes (members judge each other by them) and the counters are answered
    // whatever the load.
    let exempt = matches!(
        req.uri().path(),
        "/_granary/health" | "/_granary/stats" | "/_granary/metrics"
    );
    let permit = if exempt {
        None
    } else {
        match state.requests.admit() {
            Ok(p) => p,
            Err(crate::limits::AtLimit) => {
                state.node.stats().add(Metric::Slowdowns, 1);
                let resp = S3Error::new(
                    S3Code::SlowDown,
                    format!(
                        "the node is serving {} requests, its most; retry",
                        state.max_requests
                    ),
                )
                .into_response();
                return finish(&state, span, started, resp, None);
            }
        }
    };
    // A member's own request proves membership with its signature; a forwarded one with
    // its hop.
    if req
        .headers()
        .contains_key(granary_proto::headers::PEER_AUTH)
    {
        req = match peer_checked(&state, req).await {
            Ok(req) => req,
            Err(e) => return finish(&state, span, started, e.into_response(), permit),
        };
    }
    let verified = req
        .extensions()
        .get::<granary_proto::peer::Verified>()
        .map(|v| v.0.clone());
    if let Some(node) = verified {
        req.extensions_mut().insert(FromMember(Some(node)));
    } else if req.headers().contains_key(granary_proto::headers::HOP) {
        let (parts, body) = req.into_parts();
        let member = state.node.member_of(&parts);
        req = Request::from_parts(parts, body);
        req.extensions_mut().insert(FromMember(member));
    }
    let resp = async {
        let header_bytes: usize = req
            .headers()
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum();
        if header_bytes > MAX_HEADER_BYTES {
            return S3Error::new(
                S3Code::RequestHeaderSectionTooLarge,
                format!(
                    "request headers total {header_bytes} bytes; the limit is {MAX_HEADER_BYTES}"
                ),
            )
            .into_response();
        }
        if req.uri().path().starts_with("/_granary/") || req.uri().path() == "/_granary" {
            native::handle(&state, req).await
        } else {
            let req = match route::route(&state, req).await {
                Routed::Local(req) => req,
                Routed::Answered(resp) => return resp,
            };
            match s3::handle(&state, req).await {
                Ok(r) => r,
                Err(e) => e.into_response(),
            }
        }
    }
    .instrument(span.clone())
    .await;
    finish(&state, span, started, resp, permit)
}

/// The most body a member's own request may carry (a prefetch part's key list).
const MAX_PEER_BODY: usize = 64 << 20;

/// A member's own request (`x-granary-peer-auth`), checked in full before anything else
/// sees it: the signature names this node, is recent and unused, and its body is the one
/// signed (read here, and handed on as read). Marked [`granary_proto::peer::Verified`].
async fn peer_checked(state: &AppState, req: Request) -> Result<Request, S3Error> {
    use granary_proto::peer::{PeerAuthError, Verified, EMPTY_SHA256};
    let (mut parts, body) = req.into_parts();
    let (node, sha) = match state.node.peer_of(&parts) {
        Ok(Some(signed)) => signed,
        Ok(None) => return Ok(Request::from_parts(parts, body)),
        Err(PeerAuthError::Skewed) => {
            return Err(S3Error::new(
                S3Code::RequestTimeTooSkewed,
                "a member's request signed too long ago or too far ahead",
            ))
        }
        Err(PeerAuthError::Bad) => {
            return Err(S3Error::new(
                S3Code::AccessDenied,
                "Access Denied: bad peer signature",
            ))
        }
        Err(PeerAuthError::Replayed) => {
            return Err(S3Error::new(
                S3Code::AccessDenied,
                "Access Denied: a member's request seen before",
            ))
        }
    };
    let body = if sha == EMPTY_SHA256
        && matches!(parts.method, http::Method::GET | http::Method::HEAD)
    {
        body
    } else {
        let bytes = axum::body::to_bytes(body, MAX_PEER_BODY)
            .await
            .map_err(|_| S3Error::new(S3Code::EntityTooLarge, "a member's body is too large"))?;
        if granary_proto::sigv4::sha256_hex(&bytes) != sha {
            return Err(S3Error::new(
                S3Code::AccessDenied,
                "Access Denied: the body is not the one the member signed",
            ));
        }
        axum::body::Body::from(bytes)
    };
    parts.extensions.insert(Verified(node));
    Ok(Request::from_parts(parts, body))
}

/// Records the status, and counts the body's bytes as they leave; the request's place
/// (`permit`) is given back when the body is done.
fn finish(
    state: &Arc<AppState>,
    span: Span,
    started: Instant,
    resp: Response,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Response {
    let status = resp.status();
    span.record("status", status.as_u16());
    let stats = state.node.stats();
    stats.add(Metric::Requests, 1);
    if (status.is_client_error() || status.is_server_error())
        && resp.extensions().get::<NotAnError>().is_none()
    {
        stats.add(Metric::Errors, 1);
        if status.is_server_error() {
            stats.add(Metric::ServerErrors, 1);
        }
        if resp
            .extensions()
            .get::<error::S3Error>()
            .is_some_and(|e| e.backend_failed)
        {
            stats.add(Metric::BackendErrors, 1);
        }
    }
    let (mut parts, body) = resp.into_parts();
    // Keep the length the body knows (the stream below forgets it).
    if let Some(n) = http_body::Body::size_hint(&body).exact() {
        let bodyless =
            status == http::StatusCode::NO_CONTENT || status == http::StatusCode::NOT_MODIFIED;
        if !bodyless && !parts.headers.contains_key(http::header::CONTENT_LENGTH) {
            parts.headers.insert(http::header::CONTENT_LENGTH, n.into());
        }
    }
    let mut tally = Tally {
        span,
        started,
        bytes: 0,
        state: state.clone(),
        _permit: permit,
    };
    let stream = body.into_data_stream().map(move |item| {
        let t = &mut tally;
        if let Ok(b) = &item {
            t.bytes += b.len() as u64;
        }
        item
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Logs a request when its response body is done (or dropped by a client that left).
struct Tally {
    span: Span,
    started: Instant,
    bytes: u64,
    state: Arc<AppState>,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Drop for Tally {
    fn drop(&mut self) {
        let stats = self.state.node.stats();
        stats.add(Metric::BytesServed, self.bytes);
        stats.record_latency(self.started.elapsed().as_secs_f64());
        self.span.record("bytes", self.bytes);
        let _e = self.span.enter();
        tracing::debug!(
            elapsed_ms = self.started.elapsed().as_secs_f64() * 1e3,
            "done"
        );
    }
}
