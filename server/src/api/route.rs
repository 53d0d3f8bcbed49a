//! Routing a client's request to the key's owner. Object requests (`/{bucket}/{key}`,
//! reads, writes and multipart uploads alike) for a key owned by another member are
//! proxied there, or with `--route redirect` answered `307` to it when the client can
//! follow: an unsigned GET or HEAD (a signed request names the host it was signed for, so
//! it is proxied). Bucket requests (listing, DeleteObjects) are served by any node.
//!
//! When the owner does not answer, a read is retried on the next owner (this node,
//! perhaps) and the owner is marked down, so no read fails for a node that died; a
//! write, whose body is spent, is answered `503` for the client to retry.

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use http_body_util::BodyExt;

use super::error::{S3Code, S3Error};
use super::AppState;
use granary_core::{Forwarded, PeerBody, ToOwner};

/// What routing made of a request.
pub enum Routed {
    /// Serve it here.
    Local(Request),
    /// Answered by (or about) another member.
    Answered(Response),
}

/// A client's body as it goes on to a member.
pub fn peer_body(body: Body) -> PeerBody {
    body.map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        .boxed_unsync()
}

pub async fn route(state: &AppState, req: Request) -> Routed {
    let node = &state.node;
    // A member sent it: serve it here (it routed it already).
    if node.is_single() || super::FromMember::of(&req).is_some() {
        return Routed::Local(req);
    }
    let Ok((bucket, Some(key))) = granary_proto::encode::split_path(req.uri().path()) else {
        return Routed::Local(req);
    };
    let (parts, body) = req.into_parts();
    let to = ToOwner {
        bucket: &bucket,
        key: &key,
        method: &parts.method,
        uri: &parts.uri,
        headers: &parts.headers,
        // A signed request names the host it was signed for: it is proxied.
        may_redirect: !granary_proto::auth::client_signed(&parts),
    };
    let mut body = Some(body);
    match node.forward_to_owner(&to, &mut body, peer_body).await {
        Forwarded::Answered(resp) => Routed::Answered(resp.map(Body::new)),
        Forwarded::Here => {
            Routed::Local(Request::from_parts(parts, body.take().unwrap_or_default()))
        }
        Forwarded::Redirect { location, owner } => {
            let mut resp = Response::new(Body::empty());
            *resp.status_mut() = StatusCode::TEMPORARY_REDIRECT;
            let h = resp.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&location) {
                h.insert(header::LOCATION, v);
            }
            if let Ok(v) = HeaderValue::from_str(&owner) {
                h.insert("x-granary-node", v);
            }
            Routed::Answered(resp)
        }
        Forwarded::Unavailable { owner } => Routed::Answered(
            S3Error::new(
                S3Code::ServiceUnavailable,
                format!("node {owner}, the owner of this key, did not answer; retry"),
            )
            .with_resource(format!("/{bucket}/{key}"))
            .into_response(),
        ),
    }
}
