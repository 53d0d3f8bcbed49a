//! Request authentication, as `granary_proto::auth` checks it (SigV4 in the header and
//! in presigned queries, SigV2 presigned queries, peer signatures), its refusals as S3
//! errors. The verdict also says how the body is signed, which the body decoder
//! (`body.rs`) then enforces chunk by chunk.

use http::request::Parts;

pub use granary_proto::auth::{Credentials, Payload, Verdict};
use granary_proto::headers::PEER_AUTH;

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

/// With credentials set, only a member (`x-granary-peer-auth`) may make this request.
pub fn peer_only(creds: Option<&Credentials>, parts: &Parts) -> Result<(), S3Error> {
    let Some(creds) = creds else {
        return Ok(());
    };
    let value = parts
        .headers
        .get(PEER_AUTH)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| S3Error::new(S3Code::AccessDenied, "only cluster members may ask this"))?;
    granary_proto::auth::check_peer(creds, parts, value)?;
    Ok(())
}
