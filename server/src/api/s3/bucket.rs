//! Bucket operations: ListBuckets, CreateBucket, HeadBucket, DeleteBucket, the two
//! bucket properties clients ask about before anything else (location, versioning), and
//! the one ACL Granary has: the owner's full control, of every bucket and object.

use axum::response::Response;
use http::{header, HeaderValue, StatusCode};

use super::xml::Doc;
use super::OWNER;
use super::{empty, xml_response, Req};
use crate::api::error::{S3Code, S3Error};
use crate::api::AppState;
use granary_core::BackendError;
use granary_core::NodeError;

/// ListBuckets; with `max-buckets` a page of them, the next page after
/// `continuation-token`; with `prefix`, those whose names start with it.
pub async fn list_buckets(state: &AppState, r: Req) -> Result<Response, S3Error> {
    let max = match r.q("max-buckets") {
        None => usize::MAX,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=10_000).contains(n))
            .ok_or_else(|| {
                S3Error::new(
                    S3Code::InvalidArgument,
                    "max-buckets must be an integer from 1 to 10000",
                )
            })?,
    };
    let prefix = r.q("prefix").unwrap_or("");
    let after = r.q("continuation-token").unwrap_or("");
    let mut buckets = state.node.list_buckets().await?;
    buckets.sort_by(|a, b| a.name.cmp(&b.name));
    let mut page: Vec<_> = buckets
        .iter()
        .filter(|b| b.name.starts_with(prefix) && b.name.as_str() > after)
        .collect();
    let more = page.len() > max;
    page.truncate(max);
    let mut doc = Doc::new("ListAllMyBucketsResult");
    doc.open("Owner")
        .elem("ID", OWNER)
        .elem("DisplayName", OWNER)
        .close("Owner")
        .open("Buckets");
    for b in &page {
        doc.open("Bucket")
            .elem("Name", &b.name)
            .time("CreationDate", b.created)
            .close("Bucket");
    }
    doc.close("Buckets");
    if more {
        if let Some(last) = page.last() {
            doc.elem("ContinuationToken", &last.name);
        }
    }
    if r.has("prefix") {
        doc.elem("Prefix", prefix);
    }
    Ok(xml_response(doc.finish("ListAllMyBucketsResult")))
}

pub async fn create(state: &AppState, r: Req) -> Result<Response, S3Error> {
    // The body, if any, is a CreateBucketConfiguration naming a region: one region here,
    // us-east-1, where creating a bucket you own already succeeds.
    match state.node.create_bucket(&r.bucket).await {
        Ok(()) | Err(NodeError::Backend(BackendError::BucketExists(_))) => {}
        Err(e) => return Err(e.into()),
    }
    let mut resp = empty(StatusCode::OK);
    if let Ok(v) = HeaderValue::from_str(&format!("/{}", r.bucket)) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    Ok(resp)
}

pub async fn head(state: &AppState, r: Req) -> Result<Response, S3Error> {
    state.node.head_bucket(&r.bucket).await?;
    let mut resp = empty(StatusCode::OK);
    resp.headers_mut()
        .insert("x-amz-bucket-region", HeaderValue::from_static("us-east-1"));
    Ok(resp)
}

pub async fn delete(state: &AppState, r: Req) -> Result<Response, S3Error> {
    state.node.delete_bucket(&r.bucket).await?;
    Ok(empty(StatusCode::NO_CONTENT))
}

pub async fn location(state: &AppState, r: Req) -> Result<Response, S3Error> {
    state.node.head_bucket(&r.bucket).await?;
    // An empty LocationConstraint is us-east-1, as S3 answers.
    Ok(xml_response(
        Doc::new("LocationConstraint").finish("LocationConstraint"),
    ))
}

pub async fn versioning(state: &AppState, r: Req) -> Result<Response, S3Error> {
    state.node.head_bucket(&r.bucket).await?;
    Ok(xml_response(
        Doc::new("VersioningConfiguration").finish("VersioningConfiguration"),
    ))
}

/// GetBucketAcl and GetObjectAcl: the owner has full control (the bucket or the object
/// must exist).
pub async fn get_acl(state: &AppState, r: Req) -> Result<Response, S3Error> {
    exists(state, &r.bucket, r.key.as_deref()).await?;
    let mut doc = Doc::new("AccessControlPolicy");
    doc.open("Owner")
        .elem("ID", OWNER)
        .elem("DisplayName", OWNER)
        .close("Owner")
        .open("AccessControlList")
        .open("Grant")
        .open_with(
            "Grantee",
            &[
                ("xmlns:xsi", "http://www.w3.org/2001/XMLSchema-instance"),
                ("xsi:type", "CanonicalUser"),
            ],
        )
        .elem("ID", OWNER)
        .elem("DisplayName", OWNER)
        .close("Grantee")
        .elem("Permission", "FULL_CONTROL")
        .close("Grant")
        .close("AccessControlList");
    Ok(xml_response(doc.finish("AccessControlPolicy")))
}

/// PutBucketAcl and PutObjectAcl: only the ACL every bucket and object has already
/// (`x-amz-acl: private`, or none) is taken; any other grant is `501`.
pub async fn put_acl(state: &AppState, mut r: Req) -> Result<Response, S3Error> {
    exists(state, &r.bucket, r.key.as_deref()).await?;
    let canned = r.header("x-amz-acl").map(str::to_owned);
    let grants = r
        .parts
        .headers
        .keys()
        .any(|k| k.as_str().starts_with("x-amz-grant-"));
    let body = r.read_small_body().await?;
    let private = match canned.as_deref() {
        Some(c) => c == "private" && body.is_empty(),
        None => !grants && owner_only(&body),
    };
    if !private {
        return Err(S3Error::new(
            S3Code::NotImplemented,
            "Granary keeps one ACL: the owner's full control",
        ));
    }
    Ok(empty(StatusCode::OK))
}

/// Whether an AccessControlPolicy body grants nothing beyond the owner's full control.
fn owner_only(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body);
    let perms = granary_proto::xml::elements(&text, "Permission");
    let ids = granary_proto::xml::elements(&text, "ID");
    body.is_empty() || (perms.iter().all(|p| p == "FULL_CONTROL") && ids.iter().all(|i| i == OWNER))
}

/// The bucket, or with a key the object, exists.
async fn exists(state: &AppState, bucket: &str, key: Option<&str>) -> Result<(), S3Error> {
    match key {
        None => state.node.head_bucket(bucket).await?,
        Some(k) => {
            state.node.head_object(bucket, k).await?;
        }
    }
    Ok(())
}
