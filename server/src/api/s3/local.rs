//! GetObject, and shard members with `?archpath=`, answered with a read-only descriptor
//! of the cache file instead of the bytes: for clients on this node that ask with
//! `x-granary-local: fd` over the Unix socket (see `crate::local` for the transport).
//! An object this node does not hold is filled first; where that cannot be (the cache
//! admits no more, the read fails over to the usual path), the answer is the usual one.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::Response;
use futures::StreamExt;
use http::{header, HeaderValue};

use super::Req;
use crate::api::AppState;
use crate::backend::{Backend, ByteRange, RangeFn};
use crate::cache::{LocalFile, Source};
use crate::error::S3Error;
use crate::local::{FdSender, LOCAL, LOCAL_LENGTH, LOCAL_OFFSET};

/// The connection's descriptor channel, when the request asks for a descriptor and came
/// over the Unix socket.
pub fn sender(r: &Req) -> Option<FdSender> {
    if !r
        .header(LOCAL)
        .is_some_and(|v| v.eq_ignore_ascii_case("fd"))
    {
        return None;
    }
    r.parts
        .extensions
        .get::<ConnectInfo<FdSender>>()
        .map(|c| c.0.clone())
}

/// The entry file of `bucket/key` with the range `range` picks, filling the object into
/// this node's cache first when it is not there; the source of the bytes with it.
/// `None` when this node cannot hold the object.
/// `backend` is where the object comes from: the node's backend, or the transforms'.
pub async fn entry(
    state: &AppState,
    backend: &Arc<dyn Backend>,
    bucket: &str,
    key: &str,
    range: &RangeFn<'_>,
) -> Result<Option<(LocalFile, Source)>, S3Error> {
    let cache = &state.cache;
    if let Some(lf) = cache.local_file(backend, bucket, key, range).await? {
        state.stats.hits.fetch_add(1, Ordering::Relaxed);
        return Ok(Some((lf, Source::Hit)));
    }
    if cache.refusing() || !fill(state, backend, bucket, key).await? {
        return Ok(None);
    }
    let got = cache.local_file(backend, bucket, key, range).await?;
    Ok(got.map(|lf| (lf, Source::Miss)))
}

/// Reads the whole object through the cache so that it is committed; false when the
/// cache did not admit it.
pub async fn fill(
    state: &AppState,
    backend: &Arc<dyn Backend>,
    bucket: &str,
    key: &str,
) -> Result<bool, S3Error> {
    let read = state.cache.get(backend, bucket, key, &|_| Ok(None)).await?;
    if read.source == Source::Bypass {
        // Dropping the body stops the backend read.
        return Ok(false);
    }
    let mut body = read.body;
    while let Some(chunk) = body.next().await {
        chunk.map_err(|e| S3Error::internal(format!("filling the cache failed: {e}")))?;
    }
    state.cache.fill_ended(bucket, key).await;
    Ok(true)
}

/// The range of a shard's file holding bytes `a..b` of the member at `offset`, provided
/// the shard is still the version `etag` whose index gave the offset.
pub fn member_range(
    etag: String,
    offset: u64,
    a: u64,
    b: u64,
) -> impl Fn(&crate::backend::ObjectMeta) -> Result<Option<ByteRange>, S3Error> + Sync {
    move |meta| {
        if meta.etag != etag {
            return Err(S3Error::new(
                crate::error::S3Code::ServiceUnavailable,
                "the shard changed while it was read; retry",
            ));
        }
        Ok(Some(ByteRange {
            start: offset + a,
            end: offset + b,
        }))
    }
}

/// Turns `resp` (an answer's headers, its body empty) into a descriptor answer: the file
/// leaves with the answer's head; the headers say which of its bytes were asked.
pub fn answer(mut resp: Response, lf: LocalFile, fds: &FdSender) -> Response {
    let h = resp.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(0u64));
    h.remove(header::CONTENT_RANGE);
    h.insert(LOCAL, HeaderValue::from_static("fd"));
    h.insert(LOCAL_OFFSET, HeaderValue::from(lf.offset));
    h.insert(LOCAL_LENGTH, HeaderValue::from(lf.len));
    *resp.status_mut() = http::StatusCode::OK;
    *resp.body_mut() = Body::empty();
    fds.send(OwnedFd::from(lf.file));
    resp
}
