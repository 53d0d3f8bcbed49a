//! GetObject and HeadObject with `?archpath=MEMBER`: one file out of a tar shard
//! (`.tar`, `.tar.gz`, `.tgz`), through the member index of a cached `.tar` or by scanning
//! the shard's stream (see `archive`). Conditional headers apply to the shard; `Range`
//! applies to the member.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::response::Response;
use http::{header, HeaderValue};

use super::local;
use super::object::{check_conditions, http_date, set_length};
use super::range::RangeSpec;
use super::Req;
use crate::api::AppState;
use crate::archive::{self, Format};
use crate::backend::{ByteRange, ByteStream, ObjectMeta};
use crate::cache::fill_slice;
use crate::cache::Source;
use crate::error::{S3Code, S3Error};
use crate::local::FdSender;

fn no_member(member: &str) -> S3Error {
    S3Error::new(
        S3Code::NoSuchKey,
        format!("the shard has no member `{member}`"),
    )
}

pub async fn get(state: &AppState, r: Req, head: bool) -> Result<Response, S3Error> {
    let key = r.key().to_owned();
    let member = r.q("archpath").unwrap_or("").to_owned();
    if archive::normalize(&member).is_empty() {
        return Err(S3Error::new(
            S3Code::InvalidArgument,
            "archpath must name a member of the shard",
        ));
    }
    let format = Format::of(&key).ok_or_else(|| {
        S3Error::new(
            S3Code::InvalidArgument,
            "archpath reads members of .tar, .tar.gz and .tgz objects",
        )
    })?;
    let range = r.header("range").and_then(RangeSpec::parse);
    let headers = &r.parts.headers;
    if format == Format::Tar && !head {
        if let Some(fds) = local::sender(&r) {
            let at = (r.bucket.as_str(), key.as_str(), member.as_str());
            if let Some(resp) = local_member(state, at, &r.parts.headers, range, &fds).await? {
                return Ok(resp);
            }
        }
    }
    if format == Format::Tar {
        let indexed = state
            .cache
            .tar_index(&state.backend, &r.bucket, &key)
            .await?;
        if let Some((meta, idx)) = indexed {
            check_conditions(headers, &meta)?;
            let m = *idx
                .get(archive::normalize(&member))
                .ok_or_else(|| no_member(&member))?;
            let resolved = range.map(|s| s.resolve(m.size)).transpose()?;
            let (a, b) = resolved.map_or((0, m.size), |x| (x.start, x.end));
            let body: ByteStream = if head {
                Box::pin(futures::stream::empty())
            } else {
                let part = ByteRange {
                    start: m.offset + a,
                    end: m.offset + b,
                };
                let read = state
                    .cache
                    .get_committed(&r.bucket, &key, &|_| Ok(Some(part)))?
                    .ok_or_else(|| {
                        S3Error::new(
                            S3Code::ServiceUnavailable,
                            "the shard left the cache while it was read; retry",
                        )
                    })?;
                read.body
            };
            state.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(respond(state, &meta, m.size, resolved, body, Source::Hit));
        }
    }
    // Not indexed: the shard's stream, through the cache like any read, scanned.
    let whole = |meta: &ObjectMeta| -> Result<Option<ByteRange>, S3Error> {
        check_conditions(headers, meta)?;
        Ok(None)
    };
    let read = state
        .cache
        .get(&state.backend, &r.bucket, &key, &whole)
        .await?;
    let (size, body) = archive::scan(read.body, format, &member)
        .await
        .map_err(|e| {
            S3Error::new(
                S3Code::InvalidArgument,
                format!("cannot read the object as a tar shard: {e}"),
            )
        })?
        .ok_or_else(|| no_member(&member))?;
    let resolved = range.map(|s| s.resolve(size)).transpose()?;
    let body = match (head, resolved) {
        (true, _) => Box::pin(futures::stream::empty()) as ByteStream,
        (false, Some(x)) => fill_slice(body, x.start, x.end),
        (false, None) => body,
    };
    Ok(respond(
        state,
        &read.meta,
        size,
        resolved,
        body,
        read.source,
    ))
}

/// A member of a `.tar` shard as a descriptor of the shard's cache file (filled first
/// when this node does not hold it); `None` when this node cannot hold the shard.
async fn local_member(
    state: &AppState,
    (bucket, key, member): (&str, &str, &str),
    headers: &http::HeaderMap,
    range: Option<RangeSpec>,
    fds: &FdSender,
) -> Result<Option<Response>, S3Error> {
    let cache = &state.cache;
    let mut source = Source::Hit;
    let mut indexed = cache.tar_index(&state.backend, bucket, key).await?;
    if indexed.is_none()
        && !cache.refusing()
        && local::fill(state, &state.backend, bucket, key).await?
    {
        source = Source::Miss;
        indexed = cache.tar_index(&state.backend, bucket, key).await?;
    }
    let Some((meta, idx)) = indexed else {
        return Ok(None);
    };
    check_conditions(headers, &meta)?;
    let m = *idx
        .get(archive::normalize(member))
        .ok_or_else(|| no_member(member))?;
    let resolved = range.map(|s| s.resolve(m.size)).transpose()?;
    let (a, b) = resolved.map_or((0, m.size), |x| (x.start, x.end));
    let part = local::member_range(meta.etag.clone(), m.offset, a, b);
    let Some(lf) = cache.local_file(&state.backend, bucket, key, &part).await? else {
        return Ok(None);
    };
    if source == Source::Hit {
        state.stats.hits.fetch_add(1, Ordering::Relaxed);
    }
    let empty = Box::pin(futures::stream::empty()) as ByteStream;
    let resp = respond(state, &meta, m.size, resolved, empty, source);
    Ok(Some(local::answer(resp, lf, fds)))
}

fn respond(
    state: &AppState,
    shard: &ObjectMeta,
    size: u64,
    resolved: Option<ByteRange>,
    body: ByteStream,
    source: Source,
) -> Response {
    let mut resp = Response::new(Body::from_stream(body));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::LAST_MODIFIED, http_date(shard.last_modified));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert("x-granary-cache", HeaderValue::from_static(source.as_str()));
    if let Ok(v) = HeaderValue::from_str(&state.node_id) {
        h.insert("x-granary-node", v);
    }
    set_length(&mut resp, resolved, size);
    resp
}
