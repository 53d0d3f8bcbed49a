//! GetObject and HeadObject with `?transform=NAME` (and optionally `archpath=MEMBER`):
//! the object, or one member of a shard, after an on-node transform. The result is read
//! through the cache under a key naming the source's version and the transform's
//! definition (see `transform`), so it is computed once and shared. `Range` and the
//! conditional headers apply to the result.
//!
//! A transform with a member filter (`members = ["jpg", …]`) asked of a whole `.tar`
//! shard answers the shard as a tar stream, its members in order: those the filter takes
//! transformed (each result cached like a member's), the others as they are.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use http::HeaderValue;

use super::object::{check_conditions, object_headers, response_overrides, set_length};
use super::range::RangeSpec;
use super::Req;
use crate::api::AppState;
use crate::backend::{Backend, ByteRange, ObjectMeta};
use crate::cache::Source;
use crate::error::{S3Code, S3Error};
use crate::transform::{Computed, Derived, RESULTS};

pub async fn get(state: &AppState, r: Req, head: bool) -> Result<Response, S3Error> {
    let t = state.transforms.lookup(r.q("transform").unwrap_or(""))?;
    let key = r.key().to_owned();
    let member = r.q("archpath");
    if member.is_some_and(|m| crate::archive::normalize(m).is_empty()) {
        return Err(S3Error::new(
            S3Code::InvalidArgument,
            "archpath must name a member of the shard",
        ));
    }
    if member.is_some() && crate::archive::Format::of(&key).is_none() {
        return Err(S3Error::new(
            S3Code::InvalidArgument,
            "archpath reads members of .tar, .tar.gz and .tgz objects",
        ));
    }
    if member.is_none() && !t.members.is_empty() {
        let bucket = r.bucket.clone();
        drop(r);
        return whole_shard(state, &bucket, &key, &t, head).await;
    }
    // The source's version names the result.
    let (source, _) = state
        .cache
        .head(state.backend.as_ref(), &r.bucket, &key)
        .await?;
    let derived = Derived::new(&r.bucket, &key, member, &source.etag, &t);
    let computed: Arc<dyn Backend> = Arc::new(Computed { state: state.arc() });
    let range = r.header("range").and_then(RangeSpec::parse);
    let headers = &r.parts.headers;
    let resolve = |meta: &ObjectMeta| -> Result<Option<ByteRange>, S3Error> {
        check_conditions(headers, meta)?;
        range.map(|s| s.resolve(meta.size)).transpose()
    };
    if !head {
        if let Some(fds) = super::local::sender(&r) {
            let ckey = derived.cache_key();
            let got = super::local::entry(state, &computed, RESULTS, &ckey, &resolve);
            if let Some((lf, source)) = got.await? {
                if source == Source::Hit {
                    state.stats.transform_hits.fetch_add(1, Ordering::Relaxed);
                }
                let mut resp = Response::new(Body::empty());
                let h = resp.headers_mut();
                object_headers(state, h, &lf.meta, source);
                if let Ok(v) = HeaderValue::from_str(&t.name) {
                    h.insert("x-granary-transform", v);
                }
                response_overrides(&r, h);
                return Ok(super::local::answer(resp, lf, &fds));
            }
        }
    }
    let read = state
        .cache
        .get(&computed, RESULTS, &derived.cache_key(), &resolve)
        .await?;
    if read.source == Source::Hit {
        state.stats.transform_hits.fetch_add(1, Ordering::Relaxed);
    }
    let body = if head {
        Body::empty()
    } else {
        Body::from_stream(read.body)
    };
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    object_headers(state, h, &read.meta, read.source);
    if let Ok(v) = HeaderValue::from_str(&t.name) {
        h.insert("x-granary-transform", v);
    }
    response_overrides(&r, h);
    set_length(&mut resp, read.range, read.meta.size);
    Ok(resp)
}

/// `?transform=` with a member filter on a whole `.tar` shard.
async fn whole_shard(
    state: &AppState,
    bucket: &str,
    key: &str,
    t: &crate::transform::Named,
    head: bool,
) -> Result<Response, S3Error> {
    if crate::archive::Format::of(key) != Some(crate::archive::Format::Tar) {
        return Err(S3Error::new(
            S3Code::InvalidArgument,
            format!(
                "transform `{}` applies to the members of .tar shards; name one member of a compressed shard with archpath",
                t.name
            ),
        ));
    }
    if head {
        return Err(S3Error::new(
            S3Code::InvalidRequest,
            "a transformed shard's size is known once it is built: use GET",
        ));
    }
    let idx = shard_index(state, bucket, key).await?;
    let mut members: Vec<(&String, &crate::archive::Member)> = idx.iter().collect();
    members.sort_by_key(|(_, m)| m.offset);
    let names: Vec<String> = members.iter().map(|(n, _)| (*n).clone()).collect();
    let items = names
        .iter()
        .map(|n| {
            let apply = t.takes_member(n).then_some(t.name.as_str());
            crate::api::batch::Item::member(bucket, key, n, apply)
        })
        .collect();
    let mut resp = crate::api::batch::stream(state.arc(), names, items, false).await?;
    if let Ok(v) = HeaderValue::from_str(&t.name) {
        resp.headers_mut().insert("x-granary-transform", v);
    }
    Ok(resp)
}

/// The member index of a `.tar` shard, reading it into the cache first if needed.
async fn shard_index(
    state: &AppState,
    bucket: &str,
    key: &str,
) -> Result<Arc<crate::archive::TarIndex>, S3Error> {
    if let Some((_, idx)) = state.cache.tar_index(&state.backend, bucket, key).await? {
        return Ok(idx);
    }
    let read = state
        .cache
        .get(&state.backend, bucket, key, &|_| Ok(None))
        .await?;
    let mut body = read.body;
    while let Some(chunk) = futures::StreamExt::next(&mut body).await {
        chunk.map_err(super::io_to_s3)?;
    }
    // The fill commits just after its last byte.
    for _ in 0..250 {
        if let Some((_, idx)) = state.cache.tar_index(&state.backend, bucket, key).await? {
            return Ok(idx);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Err(S3Error::new(
        S3Code::ServiceUnavailable,
        "the shard could not be admitted to the cache (is it full?), so its members cannot be transformed one by one; name members with archpath",
    ))
}
