//! Object operations: GetObject and HeadObject (ranges, conditionals), PutObject,
//! CopyObject, DeleteObject and DeleteObjects.

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::local;
use super::range::RangeSpec;
use super::xml::{self, Doc};
use super::{empty, quoted, xml_response, Req};
use crate::api::AppState;
use crate::backend::{check_key, BackendError, ByteRange, ObjectMeta, PutOptions};
use crate::cache::Source;
use crate::cluster::peer::{PEER_FILL, SPILL};
use crate::error::{S3Code, S3Error};

/// Request headers stored with an object and sent back on reads.
const STORED_HEADERS: &[&str] = &[
    "content-type",
    "content-encoding",
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
];

/// Whether a header is one an object keeps (the list above, and `x-amz-meta-*`).
pub fn is_stored_header(name: &str) -> bool {
    STORED_HEADERS.contains(&name) || name.starts_with("x-amz-meta-")
}

/// The headers of a write that are kept with the object.
pub fn stored_headers(h: &HeaderMap) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = h
        .iter()
        .filter(|(k, _)| is_stored_header(k.as_str()))
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        // `aws-chunked` is framing, not a property of the object.
        .filter_map(|(k, v)| {
            if k == "content-encoding" {
                let rest: Vec<&str> = v
                    .split(',')
                    .map(str::trim)
                    .filter(|e| !e.eq_ignore_ascii_case("aws-chunked") && !e.is_empty())
                    .collect();
                (!rest.is_empty()).then(|| (k, rest.join(", ")))
            } else {
                Some((k, v))
            }
        })
        .collect();
    out.sort();
    out
}

/// `Content-MD5`, decoded.
pub fn content_md5(r: &Req) -> Result<Option<[u8; 16]>, S3Error> {
    let Some(v) = r.header("content-md5") else {
        return Ok(None);
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v.trim())
        .map_err(|_| S3Error::new(S3Code::InvalidDigest, "Content-MD5 is not base64"))?;
    let arr: [u8; 16] = bytes
        .try_into()
        .map_err(|_| S3Error::new(S3Code::InvalidDigest, "Content-MD5 is not 16 bytes"))?;
    Ok(Some(arr))
}

pub(super) fn http_date(t: SystemTime) -> HeaderValue {
    HeaderValue::from_str(&httpdate::fmt_http_date(t)).expect("HTTP dates are ASCII")
}

fn etag_matches(list: &str, etag: &str) -> bool {
    list.split(',')
        .map(str::trim)
        .any(|t| t == "*" || t.trim_start_matches("W/").trim_matches('"') == etag)
}

/// RFC 9110's evaluation order of the four conditional headers.
pub(super) fn check_conditions(h: &HeaderMap, meta: &ObjectMeta) -> Result<(), S3Error> {
    let failed = || {
        S3Error::new(
            S3Code::PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold",
        )
    };
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mtime = secs(meta.last_modified);
    let header = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
    if let Some(v) = header("if-match") {
        if !etag_matches(v, &meta.etag) {
            return Err(failed());
        }
    } else if let Some(t) =
        header("if-unmodified-since").and_then(|v| httpdate::parse_http_date(v).ok())
    {
        if mtime > secs(t) {
            return Err(failed());
        }
    }
    if let Some(v) = header("if-none-match") {
        if etag_matches(v, &meta.etag) {
            return Err(S3Error::new(S3Code::NotModified, "Not Modified"));
        }
    } else if let Some(t) =
        header("if-modified-since").and_then(|v| httpdate::parse_http_date(v).ok())
    {
        if mtime <= secs(t) {
            return Err(S3Error::new(S3Code::NotModified, "Not Modified"));
        }
    }
    Ok(())
}

/// The headers every object read carries.
pub(super) fn object_headers(
    state: &AppState,
    h: &mut HeaderMap,
    meta: &ObjectMeta,
    source: Source,
) {
    h.insert(header::ETAG, quoted(&meta.etag));
    h.insert(header::LAST_MODIFIED, http_date(meta.last_modified));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    let mut has_type = false;
    for (k, v) in &meta.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(k.as_str()), HeaderValue::from_str(v))
        {
            has_type |= name == header::CONTENT_TYPE;
            h.insert(name, value);
        }
    }
    if !has_type {
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
    }
    h.insert("x-granary-cache", HeaderValue::from_static(source.as_str()));
    if let Ok(v) = HeaderValue::from_str(&state.node_id) {
        h.insert("x-granary-node", v);
    }
}

/// `response-content-type` and friends override the stored headers.
pub(super) fn response_overrides(r: &Req, h: &mut HeaderMap) {
    for (param, name) in [
        ("response-content-type", header::CONTENT_TYPE),
        ("response-content-disposition", header::CONTENT_DISPOSITION),
        ("response-content-encoding", header::CONTENT_ENCODING),
        ("response-content-language", header::CONTENT_LANGUAGE),
        ("response-cache-control", header::CACHE_CONTROL),
        ("response-expires", header::EXPIRES),
    ] {
        if let Some(v) = r.q(param).and_then(|v| HeaderValue::from_str(v).ok()) {
            h.insert(name, v);
        }
    }
}

/// GetObject, or HeadObject when `head`.
pub async fn get(state: &AppState, r: Req, head: bool) -> Result<Response, S3Error> {
    let key = r.key().to_owned();
    let range = r.header("range").and_then(RangeSpec::parse);
    let headers = &r.parts.headers;
    let resolve = |meta: &ObjectMeta| -> Result<Option<ByteRange>, S3Error> {
        check_conditions(headers, meta)?;
        range.map(|s| s.resolve(meta.size)).transpose()
    };
    if !head && !r.parts.headers.contains_key(PEER_FILL) {
        if let Some(fds) = local::sender(&r) {
            if let Some((lf, source)) =
                local::entry(state, &state.backend, &r.bucket, &key, &resolve).await?
            {
                let mut resp = Response::new(Body::empty());
                object_headers(state, resp.headers_mut(), &lf.meta, source);
                response_overrides(&r, resp.headers_mut());
                return Ok(local::answer(resp, lf, &fds));
            }
        }
    }
    let (meta, body, resolved, source) = if r.parts.headers.contains_key(PEER_FILL) && !head {
        // A peer filling from this node: the committed copy or nothing.
        let Some(read) = state.cache.get_committed(&r.bucket, &key, &resolve)? else {
            // The usual answer to a peer's question, not a client's error.
            let mut resp = S3Error::new(S3Code::NoSuchKey, "this node holds no copy of the object")
                .with_resource(r.resource())
                .into_response();
            resp.extensions_mut().insert(crate::api::NotAnError);
            return Ok(resp);
        };
        state.stats.peer_serves.fetch_add(1, Ordering::Relaxed);
        let stats = state.stats.clone();
        let body = futures::StreamExt::map(read.body, move |item| {
            if let Ok(b) = &item {
                stats
                    .bytes_to_peers
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
            }
            item
        });
        (read.meta, Body::from_stream(body), read.range, read.source)
    } else if head {
        let (meta, source) = state
            .cache
            .head(state.backend.as_ref(), &r.bucket, &key)
            .await?;
        let resolved = resolve(&meta)?;
        (meta, Body::empty(), resolved, source)
    } else {
        // Another node with room takes what this one cannot admit; the request carries
        // the ids of the nodes that refused it, so it never comes back.
        let tried_header = r.header(SPILL).unwrap_or("").to_owned();
        let tried: Vec<&str> = tried_header.split(',').filter(|s| !s.is_empty()).collect();
        let spill = state.cluster.can_spill(&tried);
        let got = state
            .cache
            .read(&state.backend, &r.bucket, &key, &resolve, spill)
            .await;
        let read = match got {
            Err(BackendError::NotAdmitted(size)) => {
                let spilled = spill_to_peer(state, &r.parts, &r.bucket, &key, size, &tried);
                if let Some(resp) = spilled.await {
                    return Ok(resp);
                }
                state
                    .cache
                    .get(&state.backend, &r.bucket, &key, &resolve)
                    .await?
            }
            other => other?,
        };
        (
            read.meta,
            Body::from_stream(read.body),
            read.range,
            read.source,
        )
    };
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    object_headers(state, h, &meta, source);
    response_overrides(&r, h);
    set_length(&mut resp, resolved, meta.size);
    Ok(resp)
}

/// `Content-Length`, and for a range `206` with its `Content-Range`, of a body cut from
/// `size` bytes.
pub(super) fn set_length(resp: &mut Response, resolved: Option<ByteRange>, size: u64) {
    match resolved {
        Some(br) => {
            *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
            let h = resp.headers_mut();
            h.insert(header::CONTENT_LENGTH, br.len().into());
            h.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes {}-{}/{}", br.start, br.end - 1, size))
                    .expect("digits are ASCII"),
            );
        }
        None => {
            resp.headers_mut()
                .insert(header::CONTENT_LENGTH, size.into());
        }
    }
}

/// Forwards a read this node could not admit to the best-ranked member that still
/// admits; `None` when there is none or it does not answer.
async fn spill_to_peer(
    state: &AppState,
    parts: &http::request::Parts,
    bucket: &str,
    key: &str,
    size: u64,
    tried: &[&str],
) -> Option<Response> {
    let c = &state.cluster;
    let i = c.spill_target(bucket, key, size, tried)?;
    let mut headers = parts.headers.clone();
    let mut refused: Vec<&str> = tried.to_vec();
    refused.push(&state.node_id);
    headers.insert(SPILL, HeaderValue::from_str(&refused.join(",")).ok()?);
    let target = crate::cluster::peer::target_of(&parts.uri);
    match c
        .forward(i, &parts.method, &target, &headers, Body::empty())
        .await
    {
        Ok(resp) => Some(resp),
        Err(why) => {
            c.mark_down(i, &why);
            None
        }
    }
}

/// PutObject.
pub async fn put(state: &AppState, mut r: Req) -> Result<Response, S3Error> {
    check_key(r.key())?;
    let expected_md5 = content_md5(&r)?;
    let headers = stored_headers(&r.parts.headers);
    let checksum_echo = checksum_header(&r.parts.headers);
    let (body, size) = r.take_body()?;
    let opts = PutOptions {
        headers,
        expected_md5,
        size,
    };
    let meta = state
        .cache
        .put_through(&state.backend, &r.bucket, r.key(), body, opts)
        .await?;
    state
        .stats
        .bytes_received
        .fetch_add(meta.size, Ordering::Relaxed);
    state.changed(vec![(r.bucket.clone(), r.key().to_owned())]);
    let mut resp = empty(StatusCode::OK);
    resp.headers_mut().insert(header::ETAG, quoted(&meta.etag));
    if let Some((name, value)) = checksum_echo {
        resp.headers_mut().insert(name, value);
    }
    Ok(resp)
}

/// The `x-amz-checksum-*` header a client sent, to echo it once verified.
pub fn checksum_header(h: &HeaderMap) -> Option<(HeaderName, HeaderValue)> {
    h.iter()
        .find(|(k, _)| {
            k.as_str().starts_with("x-amz-checksum-")
                && k.as_str() != "x-amz-checksum-algorithm"
                && k.as_str() != "x-amz-checksum-type"
                && k.as_str() != "x-amz-checksum-mode"
        })
        .map(|(k, v)| (k.clone(), v.clone()))
}

/// Parses `x-amz-copy-source`: `[/]bucket/key[?versionId=…]`, URL-encoded.
pub fn copy_source(r: &Req) -> Result<(String, String), S3Error> {
    let raw = r.header("x-amz-copy-source").unwrap_or("");
    let raw = raw.split_once('?').map_or(raw, |(p, _)| p);
    let decoded = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| {
            S3Error::new(
                S3Code::InvalidArgument,
                "x-amz-copy-source is not valid UTF-8",
            )
        })?;
    let trimmed = decoded.strip_prefix('/').unwrap_or(&decoded);
    match trimmed.split_once('/') {
        Some((b, k)) if !b.is_empty() && !k.is_empty() => Ok((b.to_owned(), k.to_owned())),
        _ => Err(S3Error::new(
            S3Code::InvalidArgument,
            "x-amz-copy-source must be bucket/key",
        )),
    }
}

/// CopyObject: streams the source into a new write of the destination.
pub async fn copy(state: &AppState, r: Req) -> Result<Response, S3Error> {
    check_key(r.key())?;
    let (sb, sk) = copy_source(&r)?;
    let replace = r
        .header("x-amz-metadata-directive")
        .is_some_and(|d| d.eq_ignore_ascii_case("REPLACE"));
    if sb == r.bucket && sk == r.key() && !replace {
        return Err(S3Error::new(
            S3Code::InvalidRequest,
            "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes.",
        ));
    }
    let headers = &r.parts.headers;
    let cond = |meta: &ObjectMeta| -> Result<Option<ByteRange>, S3Error> {
        let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        let failed = || {
            S3Error::new(
                S3Code::PreconditionFailed,
                "At least one of the pre-conditions you specified did not hold",
            )
        };
        if let Some(v) = header("x-amz-copy-source-if-match") {
            if !etag_matches(v, &meta.etag) {
                return Err(failed());
            }
        }
        if let Some(v) = header("x-amz-copy-source-if-none-match") {
            if etag_matches(v, &meta.etag) {
                return Err(failed());
            }
        }
        Ok(None)
    };
    let (src, _) = state.backend.get_object(&sb, &sk, &cond).await?;
    let headers = if replace {
        stored_headers(&r.parts.headers)
    } else {
        src.meta.headers.clone()
    };
    let opts = PutOptions {
        headers,
        expected_md5: None,
        size: Some(src.meta.size),
    };
    let meta = state
        .cache
        .put_through(&state.backend, &r.bucket, r.key(), src.body, opts)
        .await?;
    state.changed(vec![(r.bucket.clone(), r.key().to_owned())]);
    let mut doc = Doc::new("CopyObjectResult");
    doc.time("LastModified", meta.last_modified)
        .elem("ETag", &format!("\"{}\"", meta.etag));
    Ok(xml_response(doc.finish("CopyObjectResult")))
}

/// DeleteObject: `204` whether or not the key existed.
pub async fn delete(state: &AppState, r: Req) -> Result<Response, S3Error> {
    state.backend.delete_object(&r.bucket, r.key()).await?;
    state.cache.invalidate(&r.bucket, r.key());
    state.changed(vec![(r.bucket.clone(), r.key().to_owned())]);
    Ok(empty(StatusCode::NO_CONTENT))
}

/// DeleteObjects: up to 1,000 keys; each reported deleted or failed.
pub async fn delete_objects(state: &AppState, mut r: Req) -> Result<Response, S3Error> {
    state.backend.head_bucket(&r.bucket).await?;
    let body = r.read_small_body().await?;
    let req: xml::Delete = xml::parse(&body)?;
    if req.objects.is_empty() || req.objects.len() > 1000 {
        return Err(S3Error::new(
            S3Code::MalformedXML,
            "DeleteObjects takes 1 to 1000 keys",
        ));
    }
    let mut doc = Doc::new("DeleteResult");
    let mut changed = Vec::new();
    for obj in &req.objects {
        match state.backend.delete_object(&r.bucket, &obj.key).await {
            Ok(()) => {
                state.cache.invalidate(&r.bucket, &obj.key);
                changed.push((r.bucket.clone(), obj.key.clone()));
                if !req.quiet {
                    doc.open("Deleted").elem("Key", &obj.key).close("Deleted");
                }
            }
            Err(e) => {
                let e = S3Error::from(e);
                doc.open("Error")
                    .elem("Key", &obj.key)
                    .elem("Code", e.code.as_str())
                    .elem("Message", &e.message)
                    .close("Error");
            }
        }
    }
    state.changed(changed);
    Ok(xml_response(doc.finish("DeleteResult")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_headers_drop_framing() {
        let mut h = HeaderMap::new();
        h.insert("content-type", "image/jpeg".parse().unwrap());
        h.insert("content-encoding", "aws-chunked".parse().unwrap());
        h.insert("x-amz-meta-label", "cat".parse().unwrap());
        h.insert("authorization", "secret".parse().unwrap());
        let s = stored_headers(&h);
        assert_eq!(
            s,
            vec![
                ("content-type".to_owned(), "image/jpeg".to_owned()),
                ("x-amz-meta-label".to_owned(), "cat".to_owned())
            ]
        );
    }

    #[test]
    fn etag_lists() {
        assert!(etag_matches("\"abc\"", "abc"));
        assert!(etag_matches("\"x\", \"abc\"", "abc"));
        assert!(etag_matches("*", "abc"));
        assert!(etag_matches("W/\"abc\"", "abc"));
        assert!(!etag_matches("\"abd\"", "abc"));
    }
}
