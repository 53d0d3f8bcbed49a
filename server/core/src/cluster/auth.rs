//! Members' requests, signed and checked: each request to a member carries a MAC under
//! the cluster's secret that names the receiving member and its boot, the method and
//! target, within a window, with a nonce no request that changes something may use
//! twice (`x-granary-hop`; `granary_proto::peer` has the wire format).

use std::time::SystemTime;

use super::Cluster;

/// The path and query of a request.
fn target_of(parts: &http::request::Parts) -> &str {
    parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str())
}

/// The path members probe.
const HEALTH: &str = "/_granary/health";

/// Whether a request changes something (its nonce must not be used twice).
fn changes(method: &http::Method) -> bool {
    !matches!(*method, http::Method::GET | http::Method::HEAD)
}

/// A request to member `m` signed by this node: its method, target and body hash.
pub(crate) struct Outgoing<'a> {
    pub method: &'a http::Method,
    pub target: &'a str,
    pub body_sha256: &'a str,
}

impl Cluster {
    /// The member a request came from, when it proves it (`x-granary-hop`: a MAC under
    /// the cluster's secret naming this node, the method and target, within the window,
    /// its nonce unused for a request that changes something); in an open cluster (no
    /// secret), whatever the header says.
    pub fn member_of(&self, parts: &http::request::Parts) -> Option<String> {
        let value = parts
            .headers
            .get(granary_proto::headers::HOP)?
            .to_str()
            .ok()?;
        match &self.secret {
            None => Some(value.to_owned()),
            Some(secret) => {
                let once = changes(&parts.method);
                self.check_signed(secret, parts, value, granary_proto::peer::UNBOUND, once)
                    .ok()
            }
        }
    }

    /// Checks a member's own request (`x-granary-peer-auth`) as [`Cluster::member_of`]
    /// does, with the body's hash its `x-granary-peer-sha256` declares (which the caller
    /// must then check the body against): the signing member and that hash; `None` with
    /// no such header or in an open cluster.
    pub fn peer_of(
        &self,
        parts: &http::request::Parts,
    ) -> Result<Option<(String, String)>, granary_proto::peer::PeerAuthError> {
        use granary_proto::{headers, peer};
        let (Some(secret), Some(value)) = (&self.secret, parts.headers.get(headers::PEER_AUTH))
        else {
            return Ok(None);
        };
        let value = value.to_str().map_err(|_| peer::PeerAuthError::Bad)?;
        let body = match parts.headers.get(headers::PEER_SHA256) {
            Some(h) => h.to_str().map_err(|_| peer::PeerAuthError::Bad)?,
            None => peer::EMPTY_SHA256,
        };
        // A member's own request is good once, a read included: a peer fill answers
        // without the client's credentials.
        let node = self.check_signed(secret, parts, value, body, true)?;
        Ok(Some((node, body.to_owned())))
    }

    fn check_signed(
        &self,
        secret: &str,
        parts: &http::request::Parts,
        value: &str,
        body_sha256: &str,
        once: bool,
    ) -> Result<String, granary_proto::peer::PeerAuthError> {
        use granary_proto::peer;
        let now = SystemTime::now();
        let mut signing = peer::Signing {
            node: "",
            to: &self.id,
            boot: &self.boot,
            method: parts.method.as_str(),
            target: target_of(parts),
            body_sha256,
        };
        let mut signed = peer::verify(secret, &signing, value, now);
        // A probe is signed for any incarnation: it is how members learn this one.
        if signed.is_err() && parts.method == http::Method::GET && parts.uri.path() == HEALTH {
            signing.boot = peer::ANY_BOOT;
            signed = peer::verify(secret, &signing, value, now);
        }
        let signed = signed?;
        let now_secs = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if once
            && !self
                .nonces
                .first_use(signed.node, signed.nonce, signed.secs, now_secs)
        {
            tracing::warn!(
                node = signed.node,
                target = target_of(parts),
                "a member's request replayed; refused"
            );
            return Err(peer::PeerAuthError::Replayed);
        }
        Ok(signed.node.to_owned())
    }

    /// Whether a request a member made itself proved it (`x-granary-peer-auth`, checked
    /// in full by the API on arrival, see [`Cluster::peer_of`]); an open cluster takes
    /// any.
    pub fn peer_authenticated(&self, parts: &http::request::Parts) -> bool {
        self.secret.is_none()
            || parts
                .extensions
                .get::<granary_proto::peer::Verified>()
                .is_some()
    }

    /// A signature of this node's for a request to member `to` (`x-granary-hop`,
    /// `x-granary-peer-auth`): its proof of membership. In an open cluster, its id.
    pub(crate) fn sign_for(&self, to: &str, boot: &str, out: &Outgoing<'_>) -> String {
        match &self.secret {
            Some(secret) => granary_proto::peer::sign(
                secret,
                &granary_proto::peer::Signing {
                    node: &self.id,
                    to,
                    boot,
                    method: out.method.as_str(),
                    target: out.target,
                    body_sha256: out.body_sha256,
                },
                SystemTime::now(),
                &uuid::Uuid::new_v4().simple().to_string(),
            ),
            None => self.id.clone(),
        }
    }
}
