//! Multipart upload: create, upload part (and upload part copy), complete (ETag
//! `md5(part md5s)-N`), abort, list parts, list uploads. The AWS CLI uses it for every
//! file over 8 MiB.

use axum::response::Response;
use http::{header, StatusCode};

use super::object::{checksum_header, content_md5, copy_source, stored_headers};
use granary_proto::range::RangeSpec;

use super::xml::{self, Doc};
use super::{empty, quoted, xml_response, Req};
use crate::api::error::{S3Code, S3Error};
use crate::api::AppState;
use crate::backend::{check_key, ByteRange, ObjectMeta, PutOptions, Refusal};

fn upload_id(r: &Req) -> &str {
    r.q("uploadId").unwrap_or("")
}

pub async fn create(state: &AppState, r: Req) -> Result<Response, S3Error> {
    check_key(r.key())?;
    let opts = PutOptions {
        headers: stored_headers(&r.parts.headers),
        ..PutOptions::default()
    };
    let id = state
        .node
        .backend
        .create_multipart(&r.bucket, r.key(), opts)
        .await?;
    let mut doc = Doc::new("InitiateMultipartUploadResult");
    doc.elem("Bucket", &r.bucket)
        .elem("Key", r.key())
        .elem("UploadId", &id);
    let mut resp = xml_response(doc.finish("InitiateMultipartUploadResult"));
    if let Some(v) = r.parts.headers.get("x-amz-checksum-algorithm") {
        resp.headers_mut()
            .insert("x-amz-checksum-algorithm", v.clone());
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
    let opts = PutOptions {
        headers: Vec::new(),
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
    let meta = state
        .node
        .complete((&r.bucket, r.key(), &id), &parts, &cond)
        .await?;
    let mut doc = Doc::new("CompleteMultipartUploadResult");
    doc.elem("Location", &format!("/{}/{}", r.bucket, r.key()))
        .elem("Bucket", &r.bucket)
        .elem("Key", r.key())
        .elem("ETag", &format!("\"{}\"", meta.etag));
    let mut resp = xml_response(doc.finish("CompleteMultipartUploadResult"));
    resp.headers_mut().insert(header::ETAG, quoted(&meta.etag));
    Ok(resp)
}

pub async fn abort(state: &AppState, r: Req) -> Result<Response, S3Error> {
    state
        .node
        .backend
        .abort_multipart(&r.bucket, r.key(), upload_id(&r))
        .await?;
    Ok(empty(StatusCode::NO_CONTENT))
}

pub async fn list_parts(state: &AppState, r: Req) -> Result<Response, S3Error> {
    let id = upload_id(&r).to_owned();
    let parts = state
        .node
        .backend
        .list_parts(&r.bucket, r.key(), &id)
        .await?;
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
    let uploads = state.node.backend.list_uploads(&r.bucket, prefix).await?;
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
