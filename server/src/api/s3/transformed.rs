//! GetObject and HeadObject with `?transform=NAME` (and optionally `archpath=MEMBER`):
//! the object, or one member of a shard, after an on-node transform. The result is read
//! through the cache under a key naming the source's version and the transform's
//! definition (see `transform`), so it is computed once and shared. `Range` and the
//! conditional headers apply to the result.

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
