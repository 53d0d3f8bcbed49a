//! The S3 backend: objects live in S3 or an S3-compatible store (MinIO, Ceph, moto),
//! reached through aws-sdk-s3 with the standard AWS configuration chain.
//!
//! This module owns the SDK client and its settings (endpoint, path-style addressing,
//! timeouts, retries, checksum modes), the translation of every `Backend` call into one or
//! a few S3 requests, the streaming of bodies between our `ByteStream` and the SDK's
//! (never buffering an object), the mapping of stored headers to and from S3's fields and
//! user metadata, and the mapping of S3's answers and transport failures onto
//! `BackendError`, saying which side failed and whether a retry can help.

mod body;
mod errors;
mod keys;
mod list;
mod wire;

use granary_proto::Header;
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_config::meta::region::RegionProviderChain;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
use aws_sdk_s3::config::{
    Region, RequestChecksumCalculation, ResponseChecksumValidation, StalledStreamProtectionConfig,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::{ByteStream as SdkByteStream, DateTime, SdkBody};
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, EncodingType};
use aws_sdk_s3::Client;
use base64::Engine;

use self::body::{download, UploadBody};
use self::errors::{causes, from_code, Target};
use self::keys::Keyed;
use self::list::{fill, lenient_parts, merge, rolled, url_decode, PartsPage};
use super::{
    check_key, known_bucket, valid_bucket_name, Backend, BackendError, BucketInfo, ByteRange,
    ByteStream, GetObject, ListPage, ListQuery, ObjectEntry, ObjectMeta, PartInfo, PartOf,
    PartRange, PutOptions, RangeFn, Result, Source, UploadInfo,
};
use crate::sync::Locked;

/// The region when the configuration chain names none.
const DEFAULT_REGION: &str = "us-east-1";
/// Time to set up a TCP (and TLS) connection to the store.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time from sending a request to the first byte of its answer. Uploads lift it: their
/// answer comes only after the whole body, which arrives at the pace of our own client.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(30);
/// A download that delivers nothing for this long while being read is cut off.
const STALL_GRACE: Duration = Duration::from_secs(20);
/// Tries of a GET whose object was replaced between its HEAD and its GET.
const GET_ATTEMPTS: usize = 3;
/// S3's largest page of keys.
const MAX_PAGE: usize = 1000;

type HttpResponse = aws_sdk_s3::config::http::HttpResponse;

/// A bucket store reached over the S3 API; cheap to share (the client pools connections).
pub struct S3Backend {
    client: Client,
    /// The configured endpoint, for `describe` and error messages.
    endpoint: Option<String>,
}

impl S3Backend {
    /// `err`, a store's failure on an upload, unless the upload is gone: some stores
    /// (moto) fail a part or a completion of an unknown upload with `500`, which clients
    /// would retry; S3 says `404 NoSuchUpload`, and so does the node, once a listing of
    /// the upload's parts confirms it.
    async fn unless_gone(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        err: BackendError,
    ) -> BackendError {
        if !matches!(err, BackendError::Unavailable(_)) {
            return err;
        }
        match self.list_parts(bucket, key, upload_id).await {
            Err(gone @ BackendError::NoSuchUpload(_)) => gone,
            _ => err,
        }
    }

    /// Builds the client from the AWS configuration chain (environment, profiles, IMDS…)
    /// and `endpoint`, an S3-compatible store addressed path-style. Nothing is sent yet:
    /// credentials are resolved on the first request.
    pub async fn connect(endpoint: Option<&str>) -> io::Result<S3Backend> {
        if let Some(ep) = endpoint {
            let ok = ep.parse::<http::Uri>().is_ok_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
            });
            if !ok {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("--s3-endpoint `{ep}` is not an http:// or https:// URL"),
                ));
            }
        }
        let region = RegionProviderChain::default_provider().or_else(Region::new(DEFAULT_REGION));
        let sdk = aws_config::defaults(BehaviorVersion::latest())
            .region(region)
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT)
                    .read_timeout(FIRST_BYTE_TIMEOUT)
                    .build(),
            )
            // Connection failures, timeouts, 5xx and throttling are retried with backoff.
            .retry_config(RetryConfig::standard())
            // Upload bodies come from our clients, whose pauses are not the store's stalls.
            .stalled_stream_protection(
                StalledStreamProtectionConfig::enabled()
                    .upload_enabled(false)
                    .grace_period(STALL_GRACE)
                    .build(),
            )
            .load()
            .await;
        let mut conf = aws_sdk_s3::config::Builder::from(&sdk)
            // Plain-HTTP reads arrive in aligned blocks a fill writes from (`wire`).
            .http_client(wire::client())
            // Streamed bodies of known length need no checksum trailers; Content-MD5 is
            // sent where the client gave one.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        if let Some(ep) = endpoint {
            conf = conf.endpoint_url(ep).force_path_style(true);
        }
        Ok(S3Backend {
            client: Client::from_conf(conf.build()),
            endpoint: endpoint.map(|e| e.trim_end_matches('/').to_owned()),
        })
    }

    /// Where the store is, for messages.
    fn location(&self) -> &str {
        self.endpoint.as_deref().unwrap_or("AWS")
    }

    /// Maps a failed SDK call onto `BackendError`. `target` names what the call was about,
    /// for S3's bodiless 404s (HEAD) and for the `NoSuch*` messages.
    fn map_err<E>(&self, e: SdkError<E, HttpResponse>, target: Target<'_>) -> BackendError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let backend = self.location();
        match &e {
            // The store answered: its code says who is at fault.
            SdkError::ServiceError(ctx) => {
                let status = ctx.raw().status().as_u16();
                let err = ctx.err();
                let message = err.message().unwrap_or("").to_owned();
                from_code(err.code(), status, &message, target, backend)
            }
            // No answer in time (the SDK retried first): the store's side; retry may help.
            SdkError::TimeoutError(_) => BackendError::Unavailable(format!(
                "the S3 backend at {backend} did not answer in time: {}",
                causes(&e)
            )),
            // Connection refused or reset, DNS, TLS (after the SDK's retries): the store or
            // the network to it; retry may help once it is back.
            SdkError::DispatchFailure(_) => BackendError::Unavailable(format!(
                "the S3 backend at {backend} cannot be reached: {}",
                causes(&e)
            )),
            // An answer we could not read: the store's side.
            SdkError::ResponseError(_) => BackendError::Unavailable(format!(
                "the S3 backend at {backend} sent an unreadable answer: {}",
                causes(&e)
            )),
            // The request could not be built or signed (no credentials in the AWS chain,
            // say): this node's configuration; retry will not help until it is fixed.
            _ => BackendError::Io(io::Error::other(format!(
                "cannot send a request to the S3 backend at {backend}: {}",
                causes(&e)
            ))),
        }
    }

    /// GETs `resolved` (all of it when `None`) of the version `meta` names, pinned with
    /// `If-Match`; `None` when that version is gone (replaced or deleted meanwhile).
    /// How a read of `bucket/key` (version `etag`) up to byte `end` is resumed from an
    /// offset: a ranged GET pinned with `If-Match`, whose length must be the rest.
    fn reopen(&self, bucket: &str, key: &str, etag: &str, end: u64) -> Option<body::Reopen> {
        if end == 0 {
            return None;
        }
        let (client, bucket, key) = (self.client.clone(), bucket.to_owned(), key.to_owned());
        let etag = format!("\"{etag}\"");
        Some(Box::new(move |from: u64| {
            let req = client
                .get_object()
                .bucket(&bucket)
                .key(keys::arg(&key))
                .if_match(&etag)
                .range(format!("bytes={from}-{}", end - 1))
                .customize()
                .keyed(&key);
            Box::pin(async move {
                let out = req.send().await.map_err(|e| io::Error::other(causes(&e)))?;
                let got = size(out.content_length());
                if got != end - from {
                    return Err(io::Error::other(format!(
                        "{got} bytes answered for the {} left",
                        end - from
                    )));
                }
                Ok(out.body)
            })
        }))
    }

    async fn get_version(
        &self,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        resolved: Option<ByteRange>,
    ) -> Result<Option<(GetObject, Option<ByteRange>)>> {
        let (start, len) = resolved.map_or((0, meta.size), |r| (r.start, r.len()));
        if len == 0 {
            let body: ByteStream = Box::pin(futures::stream::empty());
            return Ok(Some((GetObject { meta, body }, resolved)));
        }
        let mut req = self
            .client
            .get_object()
            .bucket(bucket)
            .key(keys::arg(key))
            .if_match(format!("\"{}\"", meta.etag));
        if resolved.is_some() {
            req = req.range(format!("bytes={}-{}", start, start + len - 1));
        }
        match req.customize().keyed(key).send().await {
            Ok(out) => {
                let got = size(out.content_length());
                if got != len {
                    return Err(BackendError::Unavailable(format!(
                        "the S3 backend at {} answered {got} bytes for a read of {len}",
                        self.location()
                    )));
                }
                let reopen = self.reopen(bucket, key, &meta.etag, start + len);
                let body = download(out.body, start, len, self.location().to_owned(), reopen);
                Ok(Some((GetObject { meta, body }, resolved)))
            }
            Err(e) => match self.map_err(e, Target::Object(bucket, key)) {
                BackendError::StoreRefused { code, .. } if code == "PreconditionFailed" => Ok(None),
                BackendError::NoSuchKey(_) => Ok(None),
                other => Err(other),
            },
        }
    }

    /// A bodiless 404 of a HEAD: the key is missing, or its bucket is.
    /// A failed read of an object, mapped; a missing key is told from a missing bucket.
    async fn object_err<E>(
        &self,
        e: SdkError<E, HttpResponse>,
        bucket: &str,
        key: &str,
    ) -> BackendError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        match self.map_err(e, Target::Object(bucket, key)) {
            BackendError::NoSuchKey(_) => self.missing(bucket, key).await,
            other => other,
        }
    }

    async fn missing(&self, bucket: &str, key: &str) -> BackendError {
        match self.head_bucket(bucket).await {
            Err(e @ BackendError::NoSuchBucket(_)) => e,
            _ => BackendError::NoSuchKey(key.to_owned()),
        }
    }

    /// Sends `body` of `size` bytes with `send`, reporting a failure of the body itself
    /// (the client's side) rather than the SDK's view of it.
    async fn upload<T, E, F, Fut>(
        &self,
        body: ByteStream,
        size: u64,
        expected_md5: Option<[u8; 16]>,
        target: Target<'_>,
        send: F,
    ) -> Result<T>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        F: FnOnce(SdkByteStream) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, SdkError<E, HttpResponse>>>,
    {
        let failure = Arc::new(Mutex::new(None));
        let body = UploadBody::new(body, size, expected_md5, failure.clone());
        let result = send(SdkByteStream::new(SdkBody::from_body_1_x(body))).await;
        let body_failure = failure.locked().take();
        match (result, body_failure) {
            (Ok(v), None) => Ok(v),
            (_, Some(e)) => Err(e),
            (Err(e), None) => Err(self.map_err(e, target)),
        }
    }
}

/// An ETag as S3 sends it (quoted), as `ObjectMeta` keeps it (bare).
/// An object's metadata from a HeadObject or GetObject answer (two SDK types with the
/// same accessors).
macro_rules! object_meta {
    ($out:expr) => {{
        let out = &$out;
        ObjectMeta {
            size: size(out.content_length()),
            etag: unquote(out.e_tag()),
            last_modified: time(out.last_modified()),
            headers: stored_headers(
                [
                    ("content-type", out.content_type()),
                    ("cache-control", out.cache_control()),
                    ("content-disposition", out.content_disposition()),
                    ("content-encoding", out.content_encoding()),
                    ("content-language", out.content_language()),
                    ("expires", out.expires_string()),
                ],
                out.metadata(),
            ),
        }
    }};
}

/// The first byte of a `Content-Range: bytes A-B/T`.
fn range_start(v: &str) -> Option<u64> {
    v.trim()
        .strip_prefix("bytes ")?
        .split('-')
        .next()?
        .trim()
        .parse()
        .ok()
}

fn unquote(etag: Option<&str>) -> String {
    etag.unwrap_or("").trim().trim_matches('"').to_owned()
}

fn time(t: Option<&DateTime>) -> SystemTime {
    t.and_then(|t| SystemTime::try_from(*t).ok())
        .unwrap_or(UNIX_EPOCH)
}

fn size(n: Option<i64>) -> u64 {
    n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0)
}

/// Stored headers from S3's fields and user metadata, sorted by name (as the API layer
/// stores them).
fn stored_headers(
    fields: [(&str, Option<&str>); 6],
    metadata: Option<&HashMap<String, String>>,
) -> Vec<Header> {
    let mut out: Vec<Header> = fields
        .into_iter()
        .filter_map(|(k, v)| Some(Header::new(k, v?)))
        .collect();
    if let Some(md) = metadata {
        out.extend(
            md.iter()
                .map(|(k, v)| Header::new(format!("x-amz-meta-{}", k.to_ascii_lowercase()), v)),
        );
    }
    out.sort();
    out
}

/// Sets stored headers on a PutObject or CreateMultipartUpload request.
macro_rules! with_headers {
    ($req:expr, $headers:expr) => {{
        let mut req = $req;
        for Header { name, value } in $headers {
            let value = value.clone();
            req = match name.as_str() {
                "content-type" => req.content_type(value),
                "cache-control" => req.cache_control(value),
                "content-disposition" => req.content_disposition(value),
                "content-encoding" => req.content_encoding(value),
                "content-language" => req.content_language(value),
                "expires" => match httpdate::parse_http_date(&value) {
                    Ok(t) => req.expires(DateTime::from(t)),
                    Err(_) => {
                        tracing::debug!(%value, "Expires is not an HTTP date; not stored on S3");
                        req
                    }
                },
                other => match other.strip_prefix("x-amz-meta-") {
                    Some(k) => req.metadata(k, value),
                    None => req,
                },
            };
        }
        req
    }};
}

#[async_trait]
impl Source for S3Backend {
    fn describe(&self) -> String {
        format!("s3:{}", self.endpoint.as_deref().unwrap_or("aws"))
    }

    async fn head_object(&self, bucket: &str, key: &str) -> Result<ObjectMeta> {
        check_key(key)?;
        known_bucket(bucket)?;
        let out = match self
            .client
            .head_object()
            .bucket(bucket)
            .key(keys::arg(key))
            .customize()
            .keyed(key)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) => return Err(self.object_err(e, bucket, key).await),
        };
        Ok(object_meta!(out))
    }

    /// HEADs with `partNumber`: part 1 says how many parts there are; part N its length,
    /// its checksum and, in `Content-Range`, where it begins. A store that does not send
    /// `Content-Range` (moto) is asked for the lengths of the parts before N. The object's
    /// ETag is read before and after (moto names the part's own ETag on a part's HEAD):
    /// if it changed meanwhile, `503` (retried).
    async fn part_of(&self, bucket: &str, key: &str, n: usize) -> Result<PartOf> {
        check_key(key)?;
        known_bucket(bucket)?;
        let head = |n: usize| async move {
            match self
                .client
                .head_object()
                .bucket(bucket)
                .key(keys::arg(key))
                .part_number(n as i32)
                .checksum_mode(aws_sdk_s3::types::ChecksumMode::Enabled)
                .customize()
                .keyed(key)
                .send()
                .await
            {
                Ok(out) => Ok(out),
                Err(e) => Err(self.object_err(e, bucket, key).await),
            }
        };
        let etag = self.head_object(bucket, key).await?.etag;
        let first = head(1).await?;
        let count = first.parts_count().map_or(1, |c| c.max(1) as usize);
        let checksum_type = first.checksum_type().map(|t| t.as_str().to_owned());
        let changed = || {
            BackendError::Unavailable(format!(
                "`{bucket}/{key}` changed while its parts were looked up; retry"
            ))
        };
        if n > count {
            return Ok(PartOf {
                etag,
                count,
                part: None,
                checksum_type,
            });
        }
        let out = if n == 1 { first } else { head(n).await? };
        let start = match out.content_range().and_then(range_start) {
            Some(start) => start,
            None if n == 1 => 0,
            None => {
                let mut start = 0;
                for i in 1..n {
                    start += size(head(i).await?.content_length());
                }
                start
            }
        };
        if self.head_object(bucket, key).await?.etag != etag {
            return Err(changed());
        }
        let checksum = [
            ("x-amz-checksum-crc32", out.checksum_crc32()),
            ("x-amz-checksum-crc32c", out.checksum_crc32_c()),
            ("x-amz-checksum-crc64nvme", out.checksum_crc64_nvme()),
            ("x-amz-checksum-sha1", out.checksum_sha1()),
            ("x-amz-checksum-sha256", out.checksum_sha256()),
        ]
        .into_iter()
        .find_map(|(name, v)| v.map(|v| (name.to_owned(), v.to_owned())));
        Ok(PartOf {
            etag,
            count,
            part: Some(PartRange {
                start,
                len: size(out.content_length()),
                checksum,
            }),
            checksum_type,
        })
    }

    /// HEAD for the metadata the closure decides on, then a GET of just the bytes it
    /// chose, pinned to that version with `If-Match`; if the object was replaced in
    /// between, both are repeated.
    async fn get_object(
        &self,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<(GetObject, Option<ByteRange>)> {
        for _ in 0..GET_ATTEMPTS {
            let meta = self.head_object(bucket, key).await?;
            let resolved = range(&meta).map_err(BackendError::Refused)?;
            if let Some(got) = self.get_version(bucket, key, meta, resolved).await? {
                return Ok(got);
            }
        }
        Err(BackendError::Unavailable(format!(
            "`{bucket}/{key}` on the S3 backend at {} changed during each of {GET_ATTEMPTS} reads",
            self.location()
        )))
    }

    /// One GET of the range, pinned to the version (`If-Match`), without a HEAD first.
    async fn get_range(
        &self,
        bucket: &str,
        key: &str,
        etag: &str,
        range: ByteRange,
    ) -> Result<ByteStream> {
        check_key(key)?;
        known_bucket(bucket)?;
        let meta = ObjectMeta {
            size: range.end,
            etag: etag.to_owned(),
            last_modified: std::time::UNIX_EPOCH,
            headers: Vec::new(),
        };
        match self.get_version(bucket, key, meta, Some(range)).await? {
            Some((obj, _)) => Ok(obj.body),
            None => Err(BackendError::Refused(super::Refusal::Changed(
                "the object changed",
            ))),
        }
    }

    /// One GET of the whole object; its answer's metadata is what the closure decides on.
    /// When the closure wants only part of it (a range the cache will not fill), that
    /// part is fetched pinned to the same version, as in [`Source::get_object`](super::Source::get_object).
    async fn get_object_whole_likely(
        &self,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<(GetObject, Option<ByteRange>)> {
        check_key(key)?;
        known_bucket(bucket)?;
        let out = match self
            .client
            .get_object()
            .bucket(bucket)
            .key(keys::arg(key))
            .customize()
            .keyed(key)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) => return Err(self.object_err(e, bucket, key).await),
        };
        let meta = object_meta!(out);
        let resolved = range(&meta).map_err(BackendError::Refused)?;
        match resolved {
            Some(r) if !(r.start == 0 && r.end == meta.size) => {
                // Only part of it is wanted: drop this answer (closing its connection) and
                // read that part of the same version; if it was replaced meanwhile, the
                // general path starts over with the new one.
                drop(out);
                match self.get_version(bucket, key, meta, resolved).await? {
                    Some(got) => Ok(got),
                    None => self.get_object(bucket, key, range).await,
                }
            }
            _ => {
                let reopen = self.reopen(bucket, key, &meta.etag, meta.size);
                let body = download(out.body, 0, meta.size, self.location().to_owned(), reopen);
                Ok((GetObject { meta, body }, resolved))
            }
        }
    }
}

#[async_trait]
impl Backend for S3Backend {
    async fn list_buckets(&self) -> Result<Vec<BucketInfo>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let resp = self
                .client
                .list_buckets()
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| self.map_err(e, Target::Bucket("")))?;
            out.extend(resp.buckets().iter().filter_map(|b| {
                Some(BucketInfo {
                    name: b.name()?.to_owned(),
                    created: time(b.creation_date()),
                })
            }));
            match resp.continuation_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_owned()),
                _ => break,
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn create_bucket(&self, bucket: &str) -> Result<()> {
        if !valid_bucket_name(bucket) {
            return Err(BackendError::invalid_bucket(bucket, ""));
        }
        let mut req = self.client.create_bucket().bucket(bucket);
        // Outside us-east-1, S3 wants the region named in the body.
        if let Some(region) = self.client.config().region().map(|r| r.as_ref().to_owned()) {
            if region != DEFAULT_REGION {
                req = req.create_bucket_configuration(
                    aws_sdk_s3::types::CreateBucketConfiguration::builder()
                        .location_constraint(region.as_str().into())
                        .build(),
                );
            }
        }
        req.send()
            .await
            .map_err(|e| self.map_err(e, Target::Bucket(bucket)))?;
        Ok(())
    }

    async fn head_bucket(&self, bucket: &str) -> Result<()> {
        known_bucket(bucket)?;
        self.client
            .head_bucket()
            .bucket(bucket)
            .send()
            .await
            .map_err(|e| self.map_err(e, Target::Bucket(bucket)))?;
        Ok(())
    }

    async fn delete_bucket(&self, bucket: &str) -> Result<()> {
        known_bucket(bucket)?;
        self.client
            .delete_bucket()
            .bucket(bucket)
            .send()
            .await
            .map_err(|e| self.map_err(e, Target::Bucket(bucket)))?;
        Ok(())
    }

    async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        body: ByteStream,
        opts: PutOptions,
    ) -> Result<ObjectMeta> {
        check_key(key)?;
        known_bucket(bucket)?;
        let size = required_size(&opts)?;
        let out = self
            .upload(
                body,
                size,
                opts.expected_md5,
                Target::Object(bucket, key),
                |body| {
                    let mut req = self
                        .client
                        .put_object()
                        .bucket(bucket)
                        .key(keys::arg(key))
                        .content_length(size as i64)
                        .set_content_md5(opts.expected_md5.map(md5_header))
                        .body(body);
                    req = with_headers!(req, &opts.headers);
                    req.customize()
                        .keyed(key)
                        .config_override(upload_timeouts())
                        .send()
                },
            )
            .await?;
        Ok(ObjectMeta {
            size,
            etag: unquote(out.e_tag()),
            last_modified: SystemTime::now(),
            headers: opts.headers,
        })
    }

    async fn delete_object(&self, bucket: &str, key: &str) -> Result<()> {
        check_key(key)?;
        known_bucket(bucket)?;
        self.client
            .delete_object()
            .bucket(bucket)
            .key(keys::arg(key))
            .customize()
            .keyed(key)
            .send()
            .await
            .map_err(|e| self.map_err(e, Target::Object(bucket, key)))?;
        Ok(())
    }

    /// ListObjectsV2 from `start-after = after`. S3 has no way to start after a common
    /// prefix, so a page that follows one may begin with it again: it is skipped, and one
    /// key more than needed is asked for so that a skip never leaves the page short.
    async fn list_objects(&self, bucket: &str, query: &ListQuery) -> Result<ListPage> {
        known_bucket(bucket)?;
        let delimiter = query.delimiter.clone().filter(|d| !d.is_empty());
        let mut page = ListPage::default();
        let mut start_after = query.after.clone();
        loop {
            let have = page.objects.len() + page.common_prefixes.len();
            let ask = (query.max_keys - have + 2).min(MAX_PAGE);
            let resp = self
                .client
                .list_objects_v2()
                .bucket(bucket)
                .prefix(&query.prefix)
                .set_delimiter(delimiter.clone())
                .set_start_after(start_after.clone())
                .max_keys(ask as i32)
                .encoding_type(EncodingType::Url)
                .send()
                .await
                .map_err(|e| self.map_err(e, Target::Bucket(bucket)))?;
            let objects = resp
                .contents()
                .iter()
                .map(|o| ObjectEntry {
                    key: url_decode(o.key().unwrap_or("")),
                    size: size(o.size()),
                    etag: unquote(o.e_tag()),
                    last_modified: time(o.last_modified()),
                })
                .collect();
            let prefixes = resp
                .common_prefixes()
                .iter()
                .filter_map(|p| p.prefix().map(url_decode))
                .collect();
            let entries = merge(objects, prefixes);
            let last_seen = entries.last().map(|e| e.name().to_owned());
            let skip = rolled(start_after.as_deref(), query);
            if !fill(&mut page, entries, skip, query.max_keys) {
                return Ok(page);
            }
            if !resp.is_truncated().unwrap_or(false) {
                return Ok(page);
            }
            match last_seen {
                Some(l) if Some(&l) != start_after.as_ref() => start_after = Some(l),
                // S3 says more follow but gave nothing new: let the client ask again.
                _ => {
                    page.is_truncated = page.last.is_some();
                    return Ok(page);
                }
            }
        }
    }

    async fn create_multipart(&self, bucket: &str, key: &str, opts: PutOptions) -> Result<String> {
        check_key(key)?;
        known_bucket(bucket)?;
        let req = self
            .client
            .create_multipart_upload()
            .bucket(bucket)
            .key(keys::arg(key));
        let out = with_headers!(req, &opts.headers)
            .customize()
            .keyed(key)
            .send()
            .await
            .map_err(|e| self.map_err(e, Target::Object(bucket, key)))?;
        out.upload_id().map(str::to_owned).ok_or_else(|| {
            BackendError::Unavailable(format!(
                "the S3 backend at {} started an upload without an UploadId",
                self.location()
            ))
        })
    }

    async fn upload_part(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        body: ByteStream,
        opts: PutOptions,
    ) -> Result<PartInfo> {
        check_key(key)?;
        known_bucket(bucket)?;
        let size = required_size(&opts)?;
        let out = self
            .upload(
                body,
                size,
                opts.expected_md5,
                Target::Upload(upload_id),
                |body| {
                    self.client
                        .upload_part()
                        .bucket(bucket)
                        .key(keys::arg(key))
                        .upload_id(upload_id)
                        .part_number(part as i32)
                        .content_length(size as i64)
                        .set_content_md5(opts.expected_md5.map(md5_header))
                        .body(body)
                        .customize()
                        .keyed(key)
                        .config_override(upload_timeouts())
                        .send()
                },
            )
            .await;
        let out = match out {
            Ok(out) => out,
            Err(e) => return Err(self.unless_gone(bucket, key, upload_id, e).await),
        };
        Ok(PartInfo {
            number: part,
            etag: unquote(out.e_tag()),
            size,
            last_modified: SystemTime::now(),
            checksum: None,
        })
    }

    async fn list_parts(&self, bucket: &str, key: &str, upload_id: &str) -> Result<Vec<PartInfo>> {
        check_key(key)?;
        known_bucket(bucket)?;
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let result = self
                .client
                .list_parts()
                .bucket(bucket)
                .key(keys::arg(key))
                .upload_id(upload_id)
                .set_part_number_marker(marker.take())
                .customize()
                .keyed(key)
                .send()
                .await;
            let page = match result {
                Ok(resp) => PartsPage {
                    parts: resp
                        .parts()
                        .iter()
                        .filter_map(|p| {
                            Some(PartInfo {
                                number: u32::try_from(p.part_number()?).ok()?,
                                etag: unquote(p.e_tag()),
                                size: size(p.size()),
                                last_modified: time(p.last_modified()),
                                checksum: None,
                            })
                        })
                        .collect(),
                    truncated: resp.is_truncated().unwrap_or(false),
                    next: resp.next_part_number_marker().map(str::to_owned),
                },
                Err(e) => match lenient_parts(&e) {
                    Some(page) => page,
                    None => return Err(self.map_err(e, Target::Upload(upload_id))),
                },
            };
            out.extend(page.parts);
            match page.next {
                Some(m) if page.truncated && !m.is_empty() => marker = Some(m),
                _ => break,
            }
        }
        Ok(out)
    }

    async fn complete_multipart(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        _headers: &[Header],
    ) -> Result<ObjectMeta> {
        check_key(key)?;
        known_bucket(bucket)?;
        if parts.is_empty() {
            return Err(BackendError::NoParts);
        }
        if parts.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(BackendError::InvalidPartOrder);
        }
        let completed = CompletedMultipartUpload::builder()
            .set_parts(Some(
                parts
                    .iter()
                    .map(|(n, etag)| {
                        CompletedPart::builder()
                            .part_number(*n as i32)
                            .e_tag(format!("\"{}\"", etag.trim_matches('"')))
                            .build()
                    })
                    .collect(),
            ))
            .build();
        let result = self
            .client
            .complete_multipart_upload()
            .bucket(bucket)
            .key(keys::arg(key))
            .upload_id(upload_id)
            .multipart_upload(completed)
            .customize()
            .keyed(key)
            .send()
            .await;
        let out = match result {
            Ok(out) => out,
            Err(e) => {
                let err = self.map_err(e, Target::Upload(upload_id));
                return Err(match err {
                    // S3 does not say which part: find the first one it cannot have.
                    BackendError::StoreRefused { code, message } if code == "InvalidPart" => {
                        let have = self
                            .list_parts(bucket, key, upload_id)
                            .await
                            .unwrap_or_default();
                        let bad = parts.iter().find(|(n, etag)| {
                            !have
                                .iter()
                                .any(|p| p.number == *n && p.etag == etag.trim_matches('"'))
                        });
                        match bad {
                            Some((n, _)) => BackendError::InvalidPart(*n),
                            None => BackendError::StoreRefused { code, message },
                        }
                    }
                    other => self.unless_gone(bucket, key, upload_id, other).await,
                });
            }
        };
        let etag = unquote(out.e_tag());
        // The completion answer has no size or headers: read them back. If the key was
        // replaced or deleted in the instant since, this version's size is unknown.
        match self.head_object(bucket, key).await {
            Ok(meta) if meta.etag == etag => Ok(meta),
            _ => {
                tracing::debug!(
                    bucket,
                    key,
                    "completed object replaced before it was read back"
                );
                Ok(ObjectMeta {
                    size: 0,
                    etag,
                    last_modified: SystemTime::now(),
                    headers: Vec::new(),
                })
            }
        }
    }

    async fn abort_multipart(&self, bucket: &str, key: &str, upload_id: &str) -> Result<()> {
        check_key(key)?;
        known_bucket(bucket)?;
        self.client
            .abort_multipart_upload()
            .bucket(bucket)
            .key(keys::arg(key))
            .upload_id(upload_id)
            .customize()
            .keyed(key)
            .send()
            .await
            .map_err(|e| self.map_err(e, Target::Upload(upload_id)))?;
        Ok(())
    }

    async fn list_uploads(&self, bucket: &str, prefix: &str) -> Result<Vec<UploadInfo>> {
        known_bucket(bucket)?;
        let mut out = Vec::new();
        let (mut key_marker, mut id_marker): (Option<String>, Option<String>) = (None, None);
        loop {
            let resp = self
                .client
                .list_multipart_uploads()
                .bucket(bucket)
                .prefix(prefix)
                .set_key_marker(key_marker.take())
                .set_upload_id_marker(id_marker.take())
                .send()
                .await
                .map_err(|e| self.map_err(e, Target::Bucket(bucket)))?;
            out.extend(resp.uploads().iter().filter_map(|u| {
                Some(UploadInfo {
                    key: u.key()?.to_owned(),
                    upload_id: u.upload_id()?.to_owned(),
                    initiated: time(u.initiated()),
                })
            }));
            if !resp.is_truncated().unwrap_or(false) {
                break;
            }
            key_marker = resp.next_key_marker().map(str::to_owned);
            id_marker = resp.next_upload_id_marker().map(str::to_owned);
            if key_marker.is_none() && id_marker.is_none() {
                break;
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key).then(a.initiated.cmp(&b.initiated)));
        Ok(out)
    }
}

/// S3 needs every body's length up front.
fn required_size(opts: &PutOptions) -> Result<u64> {
    opts.size.ok_or(BackendError::LengthRequired(
        "the S3 backend needs the body's length: send Content-Length (or x-amz-decoded-content-length)",
    ))
}

fn md5_header(md5: [u8; 16]) -> String {
    base64::engine::general_purpose::STANDARD.encode(md5)
}

/// Uploads keep the connect timeout but wait for their answer as long as the body takes.
fn upload_timeouts() -> aws_sdk_s3::config::Builder {
    aws_sdk_s3::config::Builder::default().timeout_config(
        TimeoutConfig::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .disable_read_timeout()
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_come_back_sorted_with_metadata_in_lower_case() {
        let mut md = HashMap::new();
        md.insert("Owner".to_string(), "me".to_string());
        let h = stored_headers(
            [
                ("content-type", Some("text/plain")),
                ("cache-control", None),
                ("content-disposition", None),
                ("content-encoding", Some("gzip")),
                ("content-language", None),
                ("expires", None),
            ],
            Some(&md),
        );
        assert_eq!(
            h,
            vec![
                Header::new("content-encoding", "gzip"),
                Header::new("content-type", "text/plain"),
                Header::new("x-amz-meta-owner", "me"),
            ]
        );
        assert_eq!(unquote(Some("\"abc-2\"")), "abc-2");
    }
}
