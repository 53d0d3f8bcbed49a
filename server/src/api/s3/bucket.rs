//! Bucket operations: ListBuckets, CreateBucket, HeadBucket, DeleteBucket, and the two
//! bucket properties clients ask about before anything else (location, versioning).

use axum::response::Response;
use http::{header, HeaderValue, StatusCode};

use super::xml::Doc;
use super::{empty, xml_response, Req};
use crate::api::error::S3Error;
use crate::api::AppState;

pub async fn list_buckets(state: &AppState) -> Result<Response, S3Error> {
    let buckets = state.node.backend.list_buckets().await?;
    let mut doc = Doc::new("ListAllMyBucketsResult");
    doc.open("Owner")
        .elem("ID", "granary")
        .elem("DisplayName", "granary")
        .close("Owner")
        .open("Buckets");
    for b in &buckets {
        doc.open("Bucket")
            .elem("Name", &b.name)
            .time("CreationDate", b.created)
            .close("Bucket");
    }
    doc.close("Buckets");
    Ok(xml_response(doc.finish("ListAllMyBucketsResult")))
}

pub async fn create(state: &AppState, r: Req) -> Result<Response, S3Error> {
    // The body, if any, is a CreateBucketConfiguration naming a region: one region here.
    state.node.backend.create_bucket(&r.bucket).await?;
    let mut resp = empty(StatusCode::OK);
    if let Ok(v) = HeaderValue::from_str(&format!("/{}", r.bucket)) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    Ok(resp)
}

pub async fn head(state: &AppState, r: Req) -> Result<Response, S3Error> {
    state.node.backend.head_bucket(&r.bucket).await?;
    let mut resp = empty(StatusCode::OK);
    resp.headers_mut()
        .insert("x-amz-bucket-region", HeaderValue::from_static("us-east-1"));
    Ok(resp)
}

pub async fn delete(state: &AppState, r: Req) -> Result<Response, S3Error> {
    state.node.backend.delete_bucket(&r.bucket).await?;
    Ok(empty(StatusCode::NO_CONTENT))
}

pub async fn location(state: &AppState, r: Req) -> Result<Response, S3Error> {
    state.node.backend.head_bucket(&r.bucket).await?;
    // An empty LocationConstraint is us-east-1, as S3 answers.
    Ok(xml_response(
        Doc::new("LocationConstraint").finish("LocationConstraint"),
    ))
}

pub async fn versioning(state: &AppState, r: Req) -> Result<Response, S3Error> {
    state.node.backend.head_bucket(&r.bucket).await?;
    Ok(xml_response(
        Doc::new("VersioningConfiguration").finish("VersioningConfiguration"),
    ))
}
