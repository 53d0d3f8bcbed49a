//! Multipart upload: create, upload part (and upload part copy), complete (ETag
//! `md5(part md5s)-N`), abort, list parts, list uploads. The AWS CLI uses it for every
//! file over 8 MiB.

use axum::response::Response;
use http::{header, StatusCode};

use super::body::{self, ChecksumAlg};
use super::object::{checksum_header, content_md5, copy_source, stored_headers};
use granary_proto::range::RangeSpec;
use granary_proto::Header;

use super::xml::{self, Doc};
use super::{empty, quoted, xml_response, Req};
use crate::api::error::{S3Code, S3Error};
use crate::api::AppState;
use granary_core::NodeError;
use granary_core::{BackendError, ByteRange, ObjectMeta, PutOptions, Refusal};

fn upload_id(r: &Req) -> &str {
    r.q("uploadId").unwrap_or("")
}

pub async fn create(state: &AppState, r: Req) -> Result<Response, S3Error> {
    let opts = PutOptions {
        headers: stored_headers(&r.parts.headers),
        ..PutOptions::default()
    };
    let id = state
        .node
        .create_multipart(&r.bucket, r.key(), opts)
        .await?;
    let mut doc = Doc::new("InitiateMultipartUploadResult");
    doc.elem("Bucket", &r.bucket)
        .elem("Key", r.key())
        .elem("UploadId", &id);
    let mut resp = xml_response(doc.finish("InitiateMultipartUploadResult"));
    for name in ["x-amz-checksum-algorithm", "x-amz-checksum-type"] {
        if let Some(v) = r.parts.headers.get(name) {
            resp.headers_mut().insert(name, v.clone());
        }
    }
    Ok(resp)
}

pub async fn upload_part(state: &AppState, mut r: Req) -> Result<Response, S3Error> {
    let part: u32 = r
        .q("partNumber")
        .and_then(|p| p.parse().ok())
        .filter(|p| (1..=10_000).contains(p))
        .ok_or_else(|| {
            S3Error::new(
                S3Code::InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive",
            )
        })?;
    let id = upload_id(&r).to_owned();
    if r.parts.headers.contains_key("x-amz-copy-source") {
        return upload_part_copy(state, r, part, id).await;
    }
    let expected_md5 = content_md5(&r)?;
    let echo = checksum_header(&r.parts.headers);
    let (body, size) = r.take_body()?;
    // The part's checksum is kept with it, for the completion's checksum.
    let headers = echo
        .iter()
        .filter_map(|(k, v)| Some(Header::new(k.as_str(), v.to_str().ok()?)))
        .collect();
    let opts = PutOptions {
        headers,
        expected_md5,
        size,
    };
    let info = state
        .node
        .upload_part((&r.bucket, r.key(), &id), part, body, opts)
        .await?;
    let mut resp = empty(StatusCode::OK);
    resp.headers_mut().insert(header::ETAG, quoted(&info.etag));
    if let Some((k, v)) = echo {
        resp.headers_mut().insert(k, v);
    }
    Ok(resp)
}

async fn upload_part_copy(
    state: &AppState,
    r: Req,
    part: u32,
    id: String,
) -> Result<Response, S3Error> {
    let (sb, sk) = copy_source(&r)?;
    let range = match r.header("x-amz-copy-source-range") {
        Some(v) => Some(RangeSpec::parse(v).ok_or_else(|| {
            S3Error::new(
                S3Code::InvalidArgument,
                "x-amz-copy-source-range must be bytes=first-last",
            )
        })?),
        None => None,
    };
    // Unlike a read's range, a copied part's names bytes the source has, every one.
    let resolve = |meta: &ObjectMeta| -> Result<Option<ByteRange>, Refusal> {
        let unsatisfiable = Refusal::Unsatisfiable { size: meta.size };
        match range {
            None => Ok(None),
            Some(RangeSpec::From {
                start,
                last: Some(last),
            }) if last < meta.size => Ok(Some(ByteRange::from(start..last + 1))),
            Some(_) => Err(unsatisfiable),
        }
    };
    let info = state
        .node
        .upload_part_copy((&r.bucket, r.key(), &id), part, (&sb, &sk), &resolve)
        .await?;
    let mut doc = Doc::new("CopyPartResult");
    doc.time("LastModified", info.last_modified)
        .elem("ETag", &format!("\"{}\"", info.etag));
    Ok(xml_response(doc.finish("CopyPartResult")))
}

pub async fn complete(state: &AppState, mut r: Req) -> Result<Response, S3Error> {
    // A completion's `x-amz-checksum-*` is the object's, not its XML body's: taken out
    // before the body is read (and checked against the parts' below).
    let named = r.parts.headers.iter().find_map(|(k, v)| {
        let alg = ChecksumAlg::of_header(k.as_str())?;
        Some((alg, k.as_str().to_owned(), v.to_str().ok()?.to_owned()))
    });
    if let Some((_, name, _)) = &named {
        r.parts.headers.remove(name.as_str());
    }
    let body = r.read_small_body().await?;
    let req: xml::CompleteMultipartUpload = xml::parse(&body)?;
    if req.parts.is_empty() {
        return Err(S3Error::new(
            S3Code::MalformedXML,
            "The XML you provided was not well-formed or did not validate against our published schema",
        ));
    }
    let mut parts: Vec<(u32, String)> = req
        .parts
        .into_iter()
        .map(|p| (p.number, p.etag.trim().trim_matches('"').to_owned()))
        .collect();
    // A part named twice in a row (sent again while the first was in flight): the last
    // naming counts.
    parts.dedup_by(|later, earlier| {
        let same = later.0 == earlier.0;
        if same {
            std::mem::swap(later, earlier);
        }
        same
    });
    let id = upload_id(&r).to_owned();
    let cond = super::object::write_conditions(&r);
    let full_object = match r.header("x-amz-checksum-type") {
        Some(t) => t.eq_ignore_ascii_case("FULL_OBJECT"),
        None => named.as_ref().is_some_and(|(_, _, v)| !v.contains('-')),
    };
    let checksum =
        completion_checksum(state, (&r.bucket, r.key(), &id), named, full_object, &parts).await?;
    let meta = state
        .node
        .complete((&r.bucket, r.key(), &id), &parts, &checksum, &cond)
        .await?;
    let mut doc = Doc::new("CompleteMultipartUploadResult");
    doc.elem("Location", &format!("/{}/{}", r.bucket, r.key()))
        .elem("Bucket", &r.bucket)
        .elem("Key", r.key())
        .elem("ETag", &format!("\"{}\"", meta.etag));
    for Header { name, value } in &meta.headers {
        if let Some(alg) = name.strip_prefix("x-amz-checksum-") {
            let tag = match alg {
                "type" => "ChecksumType".to_owned(),
                alg => format!("Checksum{}", alg.to_ascii_uppercase()),
            };
            doc.elem(&tag, value);
        }
    }
    let mut resp = xml_response(doc.finish("CompleteMultipartUploadResult"));
    resp.headers_mut().insert(header::ETAG, quoted(&meta.etag));
    Ok(resp)
}

/// The checksum a completion names (`x-amz-checksum-sha256: …-N` COMPOSITE, or a
/// FULL_OBJECT CRC), checked against the one the parts' checksums make; with none named,
/// the COMPOSITE one of parts that all have checksums. The headers to keep with the
/// object: none when the parts were uploaded without checksums the backend kept.
async fn completion_checksum(
    state: &AppState,
    (bucket, key, id): (&str, &str, &str),
    named: Option<(ChecksumAlg, String, String)>,
    full_object: bool,
    parts: &[(u32, String)],
) -> Result<Vec<Header>, S3Error> {
    let stored = match state.node.list_parts(bucket, key, id).await {
        Ok(stored) => stored,
        // Completed already (the completion answers again) or never begun: the
        // completion itself says which.
        Err(NodeError::Backend(BackendError::NoSuchUpload(_))) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut found = Vec::with_capacity(parts.len());
    for (n, etag) in parts {
        // A part the upload does not have: the completion itself refuses it.
        let Some(part) = stored.iter().find(|p| p.number == *n && p.etag == *etag) else {
            return Ok(Vec::new());
        };
        found.push((*n, part.checksum.as_ref(), part.size));
    }
    let Some((alg, name)) = named
        .as_ref()
        .map(|(alg, name, _)| (*alg, name.clone()))
        .or_else(|| {
            let (name, _) = found.first()?.1?;
            Some((ChecksumAlg::of_header(name)?, name.clone()))
        })
    else {
        return Ok(Vec::new());
    };
    let bad = |why: &str| {
        S3Error::new(
            S3Code::BadDigest,
            format!("the {name} you specified did not match the calculated checksum: {why}"),
        )
    };
    let mut with = Vec::with_capacity(found.len());
    for (n, checksum, size) in &found {
        match checksum {
            Some((of, v)) if *of == name => with.push((v.as_str(), *size)),
            Some(_) if named.is_some() => {
                return Err(bad(&format!("part {n} was uploaded with another checksum")))
            }
            _ => {}
        }
    }
    if with.len() < found.len() {
        // Parts kept without checksums (or a backend that keeps none): nothing to check
        // a named checksum against when none has one, and nothing to keep.
        return match named {
            Some(_) if !with.is_empty() => Err(bad("some parts were uploaded without one")),
            _ => Ok(Vec::new()),
        };
    }
    let computed = body::combined(alg, &with, full_object)
        .ok_or_else(|| bad("the parts' checksums do not combine so"))?;
    if named.as_ref().is_some_and(|(_, _, v)| *v != computed) {
        return Err(bad("the parts' checksums make another"));
    }
    let kind = if full_object {
        "FULL_OBJECT"
    } else {
        "COMPOSITE"
    };
    Ok(vec![
        Header::new(name, computed),
        Header::new("x-amz-checksum-type", kind),
    ])
}

pub async fn abort(state: &AppState, r: Req) -> Result<Response, S3Error> {
    state
        .node
        .abort_multipart(&r.bucket, r.key(), upload_id(&r))
        .await?;
    Ok(empty(StatusCode::NO_CONTENT))
}

pub async fn list_parts(state: &AppState, r: Req) -> Result<Response, S3Error> {
    let id = upload_id(&r).to_owned();
    let parts = state.node.list_parts(&r.bucket, r.key(), &id).await?;
    let max: usize = r
        .q("max-parts")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
        .min(1000);
    let marker: u32 = r
        .q("part-number-marker")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let after: Vec<_> = parts.iter().filter(|p| p.number > marker).collect();
    let truncated = after.len() > max;
    let shown = &after[..after.len().min(max)];
    let mut doc = Doc::new("ListPartsResult");
    doc.elem("Bucket", &r.bucket)
        .elem("Key", r.key())
        .elem("UploadId", &id)
        .elem("PartNumberMarker", &marker.to_string())
        .elem(
            "NextPartNumberMarker",
            &shown.last().map_or(marker, |p| p.number).to_string(),
        )
        .elem("MaxParts", &max.to_string())
        .elem("IsTruncated", if truncated { "true" } else { "false" })
        .elem("StorageClass", "STANDARD");
    for p in shown {
        doc.open("Part")
            .elem("PartNumber", &p.number.to_string())
            .time("LastModified", p.last_modified)
            .elem("ETag", &format!("\"{}\"", p.etag))
            .elem("Size", &p.size.to_string())
            .close("Part");
    }
    Ok(xml_response(doc.finish("ListPartsResult")))
}

pub async fn list_uploads(state: &AppState, r: Req) -> Result<Response, S3Error> {
    let prefix = r.q("prefix").unwrap_or("");
    let uploads = state.node.list_uploads(&r.bucket, prefix).await?;
    let mut doc = Doc::new("ListMultipartUploadsResult");
    doc.elem("Bucket", &r.bucket)
        .elem("KeyMarker", "")
        .elem("UploadIdMarker", "")
        .elem("Prefix", prefix)
        .elem("MaxUploads", "1000")
        .elem("IsTruncated", "false");
    for u in &uploads {
        doc.open("Upload")
            .elem("Key", &u.key)
            .elem("UploadId", &u.upload_id)
            .time("Initiated", u.initiated)
            .elem("StorageClass", "STANDARD")
            .close("Upload");
    }
    Ok(xml_response(doc.finish("ListMultipartUploadsResult")))
}
