//! Peer authentication: requests a node makes of another member itself (peer fills,
//! invalidations, prefetch parts, rebalance offers) carry
//! `x-granary-peer-auth: NODE SECS NONCE HEX`, and every request a member sends another
//! carries `x-granary-hop` in the same form. HEX is HMAC-SHA256 under the cluster's secret
//! of the sending node, the receiving node and its boot identity (a random id each
//! process start, learned from its health answer), the time, a nonce, the method, the
//! path with its query, and the SHA-256 of the body (declared in `x-granary-peer-sha256`;
//! absent, the empty body's). So a captured request is good only at the member it was
//! sent to, in the incarnation it was sent to, with the body it was sent with, within
//! [`WINDOW`] of its time; the receiver keeps the nonces for that long and refuses a
//! second use. Health probes, which change nothing, are signed for any incarnation
//! ([`ANY_BOOT`]): they are how the boot identity is learned.
//! Forwarded client requests keep their own signatures, and their hop proves membership
//! with the body unbound ([`UNBOUND`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::sigv4::{ct_eq, hmac_sha256};

/// How far a peer's signing time may be from ours.
pub const WINDOW: Duration = Duration::from_secs(60);
/// The body hash of a request whose body a signature does not cover (a client's
/// forwarded request, signed by the client).
pub const UNBOUND: &str = "UNSIGNED-PAYLOAD";
/// The boot identity of a request signed for whichever incarnation of the receiver
/// (health probes only).
pub const ANY_BOOT: &str = "";

/// The SHA-256 of no bytes: the body hash of a request without one.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Why a peer signature was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerAuthError {
    /// Not `NODE SECS NONCE HEX`, or the MAC does not match (another secret, receiver,
    /// method, target or body).
    Bad,
    /// Signed too long ago or too far ahead.
    Skewed,
    /// Its nonce was seen already: a replay.
    Replayed,
}

/// What a valid signature says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed<'v> {
    pub node: &'v str,
    pub secs: u64,
    pub nonce: &'v str,
}

/// A request whose `x-granary-peer-auth` the node checked in full (MAC, receiver, time,
/// body, nonce): put in the request's extensions by the node; the member that signed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified(pub String);

/// What is signed of a request.
pub struct Signing<'a> {
    /// The sending node.
    pub node: &'a str,
    /// The member the request is for.
    pub to: &'a str,
    /// Its boot identity, or [`ANY_BOOT`].
    pub boot: &'a str,
    pub method: &'a str,
    /// Path and query.
    pub target: &'a str,
    /// Hex SHA-256 of the body, [`EMPTY_SHA256`], or [`UNBOUND`].
    pub body_sha256: &'a str,
}

fn mac(s: &Signing<'_>, secret: &str, secs: u64, nonce: &str) -> String {
    let msg = format!(
        "granary-peer-3\n{}\n{}\n{}\n{secs}\n{nonce}\n{}\n{}\n{}",
        s.node, s.to, s.boot, s.method, s.target, s.body_sha256
    );
    hex::encode(hmac_sha256(secret.as_bytes(), msg.as_bytes()))
}

/// The header value for a request signed at `at` with `nonce` (random, used once: 32 hex
/// digits).
pub fn sign(secret: &str, s: &Signing<'_>, at: SystemTime, nonce: &str) -> String {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{} {secs} {nonce} {}", s.node, mac(s, secret, secs, nonce))
}

/// Checks a header value against the request it came with (`s.node` is ignored: the
/// value names the sender), at time `now`. The nonce is the caller's to check for reuse.
pub fn verify<'v>(
    secret: &str,
    s: &Signing<'_>,
    value: &'v str,
    now: SystemTime,
) -> Result<Signed<'v>, PeerAuthError> {
    let mut it = value.split(' ');
    let (Some(node), Some(secs), Some(nonce), Some(got), None) =
        (it.next(), it.next(), it.next(), it.next(), it.next())
    else {
        return Err(PeerAuthError::Bad);
    };
    let secs: u64 = secs.parse().map_err(|_| PeerAuthError::Bad)?;
    if nonce.is_empty() || nonce.len() > 64 {
        return Err(PeerAuthError::Bad);
    }
    let at = UNIX_EPOCH + Duration::from_secs(secs);
    let skew = now
        .duration_since(at)
        .or_else(|_| at.duration_since(now))
        .unwrap_or_default();
    if skew > WINDOW {
        return Err(PeerAuthError::Skewed);
    }
    let signing = Signing { node, ..*s };
    if ct_eq(&mac(&signing, secret, secs, nonce), got) {
        Ok(Signed { node, secs, nonce })
    } else {
        Err(PeerAuthError::Bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(to: &'a str, method: &'a str, target: &'a str, body: &'a str) -> Signing<'a> {
        Signing {
            node: "a",
            to,
            boot: "b1",
            method,
            target,
            body_sha256: body,
        }
    }

    #[test]
    fn signatures_bind_node_receiver_and_its_boot_time_method_target_and_body() {
        let now = SystemTime::now();
        let body = crate::sigv4::sha256_hex(b"[{\"bucket\":\"b\",\"key\":\"k\"}]");
        let s = req("b", "POST", "/_granary/invalidate", &body);
        let v = sign("s", &s, now, "n1");
        let ok = verify("s", &s, &v, now).unwrap();
        assert_eq!((ok.node, ok.nonce), ("a", "n1"));
        let other_body = crate::sigv4::sha256_hex(b"[]");
        for (what, secret, changed) in [
            (
                "secret",
                "t",
                req("b", "POST", "/_granary/invalidate", &body),
            ),
            (
                "receiver",
                "s",
                req("c", "POST", "/_granary/invalidate", &body),
            ),
            (
                "method",
                "s",
                req("b", "PUT", "/_granary/invalidate", &body),
            ),
            ("target", "s", req("b", "POST", "/_granary/take", &body)),
            (
                "body",
                "s",
                req("b", "POST", "/_granary/invalidate", &other_body),
            ),
            (
                "unbound body",
                "s",
                req("b", "POST", "/_granary/invalidate", UNBOUND),
            ),
        ] {
            assert_eq!(
                verify(secret, &changed, &v, now),
                Err(PeerAuthError::Bad),
                "another {what}"
            );
        }
        // Signed for another incarnation of the receiver (it restarted since), or for
        // any: refused where its own is required.
        for boot in ["b2", ANY_BOOT] {
            let other = Signing {
                boot,
                ..req("b", "POST", "/_granary/invalidate", &body)
            };
            assert_eq!(
                verify("s", &other, &v, now),
                Err(PeerAuthError::Bad),
                "{boot}"
            );
        }
        // The sender named in the value is the one checked.
        let forged = v.replacen("a ", "c ", 1);
        assert_eq!(verify("s", &s, &forged, now), Err(PeerAuthError::Bad));
        let tampered_nonce = v.replacen(" n1 ", " n2 ", 1);
        assert_eq!(
            verify("s", &s, &tampered_nonce, now),
            Err(PeerAuthError::Bad)
        );
        for off in [WINDOW + Duration::from_secs(2), Duration::from_secs(900)] {
            assert_eq!(verify("s", &s, &v, now + off), Err(PeerAuthError::Skewed));
        }
        assert!(verify("s", &s, &v, now + WINDOW - Duration::from_secs(2)).is_ok());
        for bad in ["a b", "a 1 2", "a x n h", "a 1 n h extra"] {
            assert_eq!(verify("s", &s, bad, now), Err(PeerAuthError::Bad), "{bad}");
        }
    }

    #[test]
    fn the_empty_body_hash_is_sha256_of_nothing() {
        assert_eq!(crate::sigv4::sha256_hex(b""), EMPTY_SHA256);
    }
}
