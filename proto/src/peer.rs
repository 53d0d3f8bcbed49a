//! Peer authentication: requests a node makes of another member itself (peer fills,
//! invalidations, prefetch parts) carry `x-granary-peer-auth: NODE SECS HEX`, HEX being
//! HMAC-SHA256 under the cluster's secret of the node, the time, the method and the path
//! with its query. Forwarded client requests keep their own signatures instead.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::sigv4::{ct_eq, hmac_sha256};

/// How far a peer's time may be from ours.
pub const MAX_SKEW: Duration = Duration::from_secs(15 * 60);

/// Why a peer signature was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerAuthError {
    /// Not `NODE SECS HEX`, or the MAC does not match.
    Bad,
    /// Signed too long ago or too far ahead.
    Skewed,
}

fn mac(secret: &str, node: &str, secs: u64, method: &str, target: &str) -> String {
    let msg = format!("granary-peer\n{node}\n{secs}\n{method}\n{target}");
    hex::encode(hmac_sha256(secret.as_bytes(), msg.as_bytes()))
}

/// The header value for a request `method target` (path and query) node `node` makes at
/// `at`.
pub fn sign(secret: &str, node: &str, method: &str, target: &str, at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{node} {secs} {}", mac(secret, node, secs, method, target))
}

/// Checks a header value against the request it came with, at time `now`; the signing
/// node's id when it holds.
pub fn verify<'v>(
    secret: &str,
    method: &str,
    target: &str,
    value: &'v str,
    now: SystemTime,
) -> Result<&'v str, PeerAuthError> {
    let mut it = value.split(' ');
    let (Some(node), Some(secs), Some(got), None) = (it.next(), it.next(), it.next(), it.next())
    else {
        return Err(PeerAuthError::Bad);
    };
    let secs: u64 = secs.parse().map_err(|_| PeerAuthError::Bad)?;
    let at = UNIX_EPOCH + Duration::from_secs(secs);
    let skew = now
        .duration_since(at)
        .or_else(|_| at.duration_since(now))
        .unwrap_or_default();
    if skew > MAX_SKEW {
        return Err(PeerAuthError::Skewed);
    }
    if ct_eq(&mac(secret, node, secs, method, target), got) {
        Ok(node)
    } else {
        Err(PeerAuthError::Bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_bind_node_time_method_and_target() {
        let now = SystemTime::now();
        let v = sign("s", "a", "POST", "/_granary/invalidate", now);
        assert_eq!(
            verify("s", "POST", "/_granary/invalidate", &v, now),
            Ok("a")
        );
        assert_eq!(
            verify("t", "POST", "/_granary/invalidate", &v, now),
            Err(PeerAuthError::Bad)
        );
        assert_eq!(
            verify("s", "GET", "/_granary/invalidate", &v, now),
            Err(PeerAuthError::Bad)
        );
        assert_eq!(
            verify("s", "POST", "/_granary/x", &v, now),
            Err(PeerAuthError::Bad)
        );
        let later = now + Duration::from_secs(3600);
        assert_eq!(
            verify("s", "POST", "/_granary/invalidate", &v, later),
            Err(PeerAuthError::Skewed)
        );
        assert_eq!(
            verify("s", "POST", "/", "a b", now),
            Err(PeerAuthError::Bad)
        );
    }
}
