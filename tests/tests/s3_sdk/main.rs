//! The S3 API as `aws-sdk-s3` sees it: buckets, objects, keys, listing, ranges,
//! conditionals, deletes, copies, multipart uploads, presigned URLs and authentication,
//! against a real `granary` started with credentials.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, Delete, ObjectIdentifier};
use aws_sdk_s3::Client;
use base64::Engine as _;
use granary_tests::{
    bucket_name, etag_of, expect_sdk_error, md5_hex, multipart_etag, random_bytes, request_bytes,
    sdk_error, unix_now, Server, ServerOpts, ACCESS, SECRET,
};
use md5::{Digest, Md5};
mod auth;
mod buckets;
mod listing;
mod multipart;
mod objects;
mod reads;

const MIB: usize = 1024 * 1024;

use granary_proto::encode;

/// A credentialed server, a client for it, and a fresh bucket.
async fn setup(prefix: &str) -> (Server, Client, String) {
    let server = Server::start(ServerOpts::with_credentials()).expect("start granary");
    let s3 = server.s3_client();
    let bucket = bucket_name(prefix);
    s3.create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("create bucket");
    (server, s3, bucket)
}

async fn put(s3: &Client, bucket: &str, key: &str, data: &[u8]) -> String {
    let out = s3
        .put_object()
        .bucket(bucket)
        .key(key)
        .body(ByteStream::from(data.to_vec()))
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "put {key:?}: {}",
                aws_sdk_s3::error::DisplayErrorContext(&e)
            )
        });
    out.e_tag().expect("PutObject answers an ETag").to_string()
}

async fn get(s3: &Client, bucket: &str, key: &str) -> Vec<u8> {
    let out = s3
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "get {key:?}: {}",
                aws_sdk_s3::error::DisplayErrorContext(&e)
            )
        });
    out.body.collect().await.expect("read body").to_vec()
}

/// Every key of the bucket (under `prefix`), following continuation tokens.
async fn list_all(s3: &Client, bucket: &str, prefix: Option<&str>) -> Vec<(String, i64, String)> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = s3
            .list_objects_v2()
            .bucket(bucket)
            .set_prefix(prefix.map(str::to_string))
            .set_continuation_token(token.clone())
            .send()
            .await
            .expect("ListObjectsV2");
        for obj in page.contents() {
            out.push((
                obj.key().unwrap_or_default().to_string(),
                obj.size().unwrap_or(-1),
                obj.e_tag().unwrap_or_default().to_string(),
            ));
        }
        if page.is_truncated() == Some(true) {
            token = page.next_continuation_token().map(str::to_string);
            assert!(
                token.is_some(),
                "truncated page without a continuation token"
            );
        } else {
            return out;
        }
    }
}

/// Path and query of an absolute `http://host/...` URL.
fn path_and_query(url: &str) -> &str {
    let rest = url.strip_prefix("http://").expect("http URL");
    &rest[rest.find('/').expect("URL has a path")..]
}

async fn start_upload(s3: &Client, bucket: &str, key: &str) -> String {
    s3.create_multipart_upload()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .expect("CreateMultipartUpload")
        .upload_id()
        .expect("UploadId")
        .to_string()
}

async fn upload_part(
    s3: &Client,
    bucket: &str,
    key: &str,
    id: &str,
    n: i32,
    data: &[u8],
) -> CompletedPart {
    let out = s3
        .upload_part()
        .bucket(bucket)
        .key(key)
        .upload_id(id)
        .part_number(n)
        .body(ByteStream::from(data.to_vec()))
        .send()
        .await
        .expect("UploadPart");
    CompletedPart::builder()
        .part_number(n)
        .e_tag(out.e_tag().expect("part ETag"))
        .build()
}

async fn complete(
    s3: &Client,
    bucket: &str,
    key: &str,
    id: &str,
    parts: Vec<CompletedPart>,
) -> Result<
    aws_sdk_s3::operation::complete_multipart_upload::CompleteMultipartUploadOutput,
    aws_sdk_s3::error::SdkError<
        aws_sdk_s3::operation::complete_multipart_upload::CompleteMultipartUploadError,
    >,
> {
    s3.complete_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(parts))
                .build(),
        )
        .send()
        .await
}
