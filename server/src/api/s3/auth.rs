//! Request authentication, as `granary_proto::auth` checks it (SigV4 in the header and
//! in presigned queries, SigV2 presigned queries, peer signatures), its refusals as S3
//! errors. The verdict also says how the body is signed, which the body decoder
//! (`body.rs`) then enforces chunk by chunk.

use http::request::Parts;

pub use granary_proto::auth::{Credentials, Payload, Verdict};

use crate::api::error::{S3Code, S3Error};

/// Authenticates a request; see [`granary_proto::auth::authenticate`].
pub fn authenticate(
    creds: Option<&Credentials>,
    anonymous_read: bool,
    parts: &Parts,
) -> Result<Verdict, S3Error> {
    Ok(granary_proto::auth::authenticate(
        creds,
        anonymous_read,
        parts,
    )?)
}

/// Only a member (`x-granary-peer-auth` under the cluster's secret) may make this
/// request; in an open cluster (no secret), anyone.
pub fn peer_only(node: &granary_core::Node, parts: &Parts) -> Result<(), S3Error> {
    if node.peer_authenticated(parts) {
        Ok(())
    } else {
        Err(S3Error::new(
            S3Code::AccessDenied,
            "only cluster members may ask this",
        ))
    }
}
