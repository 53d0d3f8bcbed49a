//! Object writes: PutObject, CopyObject, DeleteObject and DeleteObjects (reads are in
//! `get`).

use axum::response::Response;
use base64::Engine;
use http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::xml::{self, Doc};
use super::{empty, quoted, xml_response, Req};
use crate::api::error::{S3Code, S3Error};
use crate::api::AppState;
use granary_core::{etag_matches, ByteRange, ObjectMeta, PutOptions, Refusal, WriteConditions};
use granary_proto::Header;

/// The headers of a write that are kept with the object.
pub fn stored_headers(h: &HeaderMap) -> Vec<Header> {
    let mut out: Vec<Header> = h
        .iter()
        .filter(|(k, _)| granary_proto::headers::is_stored(k.as_str()))
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                granary_proto::headers::text(v.as_bytes()),
            )
        })
        // `aws-chunked` is framing, not a property of the object.
        .filter_map(|(k, v)| {
            if k == "content-encoding" {
                let rest: Vec<&str> = v
                    .split(',')
                    .map(str::trim)
                    .filter(|e| !e.eq_ignore_ascii_case("aws-chunked") && !e.is_empty())
                    .collect();
                (!rest.is_empty()).then(|| Header::new(k, rest.join(", ")))
            } else {
                Some(Header::new(k, v))
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

/// PutObject.
pub async fn put(state: &AppState, mut r: Req) -> Result<Response, S3Error> {
    let expected_md5 = content_md5(&r)?;
    let mut headers = stored_headers(&r.parts.headers);
    let checksum_echo = checksum_header(&r.parts.headers);
    // Kept with the object, for reads in checksum mode (the body is checked against it).
    if let Some((name, value)) = &checksum_echo {
        if let Ok(v) = value.to_str() {
            headers.push(Header::new(name.as_str(), v));
            headers.sort();
        }
    }
    let (body, size) = r.take_body()?;
    let opts = PutOptions {
        headers,
        expected_md5,
        size,
    };
    let cond = write_conditions(&r);
    let meta = state
        .node
        .put(&r.bucket, r.key(), body, opts, &cond)
        .await?;
    let mut resp = empty(StatusCode::OK);
    resp.headers_mut().insert(header::ETAG, quoted(&meta.etag));
    if let Some((name, value)) = checksum_echo {
        resp.headers_mut().insert(name, value);
    }
    Ok(resp)
}

/// `If-Match` and `If-None-Match` on a write.
pub fn write_conditions(r: &Req) -> WriteConditions {
    WriteConditions {
        if_match: r.header("if-match").map(str::to_owned),
        if_none_match: r.header("if-none-match").map(str::to_owned),
    }
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
    let decoded = granary_proto::encode::decode_exact(raw).map_err(|_| {
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
    let cond = |meta: &ObjectMeta| -> Result<Option<ByteRange>, Refusal> {
        let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        if let Some(v) = header("x-amz-copy-source-if-match") {
            if !etag_matches(v, &meta.etag) {
                return Err(Refusal::PreconditionFailed);
            }
        }
        if let Some(v) = header("x-amz-copy-source-if-none-match") {
            if etag_matches(v, &meta.etag) {
                return Err(Refusal::PreconditionFailed);
            }
        }
        Ok(None)
    };
    let replaced = replace.then(|| stored_headers(&r.parts.headers));
    let meta = state
        .node
        .copy((&sb, &sk), &cond, (&r.bucket, r.key()), replaced)
        .await?;
    let mut doc = Doc::new("CopyObjectResult");
    doc.time("LastModified", meta.last_modified)
        .elem("ETag", &format!("\"{}\"", meta.etag));
    Ok(xml_response(doc.finish("CopyObjectResult")))
}

/// DeleteObject: `204` whether or not the key existed.
pub async fn delete(state: &AppState, r: Req) -> Result<Response, S3Error> {
    state.node.delete(&r.bucket, r.key()).await?;
    Ok(empty(StatusCode::NO_CONTENT))
}

/// DeleteObjects: up to 1,000 keys; each reported deleted or failed.
pub async fn delete_objects(state: &AppState, mut r: Req) -> Result<Response, S3Error> {
    state.node.head_bucket(&r.bucket).await?;
    let body = r.read_small_body().await?;
    let req = xml::Delete::parse(&body)?;
    if req.objects.is_empty() || req.objects.len() > 1000 {
        return Err(S3Error::new(
            S3Code::MalformedXML,
            "DeleteObjects takes 1 to 1000 keys",
        ));
    }
    let keys: Vec<String> = req.objects.into_iter().map(|o| o.key).collect();
    let outcomes = state.node.delete_many(&r.bucket, &keys).await;
    let mut doc = Doc::new("DeleteResult");
    for (key, outcome) in keys.iter().zip(outcomes) {
        match outcome {
            Ok(()) => {
                if !req.quiet {
                    doc.open("Deleted").elem("Key", key).close("Deleted");
                }
            }
            Err(e) => {
                let e = S3Error::from(e);
                doc.open("Error")
                    .elem("Key", key)
                    .elem("Code", e.code.as_str())
                    .elem("Message", &e.message)
                    .close("Error");
            }
        }
    }
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
                Header::new("content-type", "image/jpeg"),
                Header::new("x-amz-meta-label", "cat")
            ]
        );
    }
}
