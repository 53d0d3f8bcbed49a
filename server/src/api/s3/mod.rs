//! The S3-compatible API, path-style: the request is authenticated, its path split into
//! bucket and key, and the method and sub-resource pick the operation. One file per
//! family of operations.

pub mod auth;
pub mod body;
mod bucket;
mod get;
mod list;
mod multipart;
mod object;
pub mod xml;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http::request::Parts;
use http::{header, HeaderValue, Method, StatusCode};

use super::error::{S3Code, S3Error};
pub use super::headers::{http_date, quoted};
use super::AppState;
use auth::Verdict;
use granary_core::ByteStream;

/// The one owner of everything a node serves, as listings and ACLs name it.
pub const OWNER: &str = "granary";

/// Largest XML request body read into memory (DeleteObjects of 1,000 long keys fits).
const MAX_XML_BODY: usize = 4 << 20;

/// A request after authentication and path parsing.
pub struct Req {
    pub parts: Parts,
    pub body: Body,
    pub bucket: String,
    pub key: Option<String>,
    pub query: Vec<(String, String)>,
    pub verdict: Verdict,
}

impl Req {
    pub fn q(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.query.iter().any(|(k, _)| k == name)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.parts.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or("")
    }

    /// `/bucket/key`, for error documents.
    pub fn resource(&self) -> String {
        match &self.key {
            Some(k) => format!("/{}/{}", self.bucket, k),
            None => format!("/{}", self.bucket),
        }
    }

    /// The request body as the backend should see it: decoded and verified.
    pub fn take_body(&mut self) -> Result<(ByteStream, Option<u64>), S3Error> {
        let rules =
            body::BodyRules::from_headers(&self.parts.headers, self.verdict.payload.clone())?;
        let len = rules.decoded_len;
        let raw = std::mem::take(&mut self.body)
            .into_data_stream()
            .map_err(|e| {
                std::io::Error::other(S3Error::new(
                    S3Code::IncompleteBody,
                    format!("the request body was cut short: {e}"),
                ))
            });
        Ok((body::verified(Box::pin(raw), rules), len))
    }

    /// A small body (XML, JSON), read whole.
    pub async fn read_small_body(&mut self) -> Result<Bytes, S3Error> {
        self.read_body_up_to(MAX_XML_BODY).await
    }

    /// The body read whole, refused beyond `limit` bytes.
    pub async fn read_body_up_to(&mut self, limit: usize) -> Result<Bytes, S3Error> {
        let too_large = || {
            S3Error::new(
                S3Code::EntityTooLarge,
                format!("the request body is larger than {limit} bytes"),
            )
        };
        let (mut stream, len) = self.take_body()?;
        if len.is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            if out.len() + chunk.len() > limit {
                return Err(too_large());
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(out))
    }
}

/// Splits a raw path into its bucket and decoded key.
pub(crate) fn split_path(raw: &str) -> Result<(String, Option<String>), S3Error> {
    granary_proto::encode::split_path(raw).map_err(|_| {
        S3Error::new(
            S3Code::InvalidArgument,
            "the URI is not valid UTF-8 once decoded",
        )
    })
}

pub async fn handle(state: &AppState, req: Request) -> Result<Response, S3Error> {
    let (parts, body) = req.into_parts();
    if parts.method == Method::OPTIONS {
        return Err(preflight(&parts));
    }
    let verdict = auth::authenticate(state.creds.as_ref(), state.anonymous_read, &parts)?;
    let (bucket, key) = split_path(parts.uri.path())?;
    let query = granary_proto::encode::query_pairs(parts.uri.query().unwrap_or(""));
    let span = tracing::Span::current();
    span.record("bucket", bucket.as_str());
    if let Some(k) = &key {
        span.record("key", k.as_str());
    }
    let req = Req {
        parts,
        body,
        bucket,
        key,
        query,
        verdict,
    };
    let resource = req.resource();
    dispatch(state, req).await.map_err(|e| {
        if e.resource.is_none() {
            e.with_resource(resource)
        } else {
            e
        }
    })
}

/// Sub-resources Granary does not serve; named here so they are answered `501
/// NotImplemented` (as S3, MinIO and Ceph answer what they do not serve, and clients
/// tolerate) rather than mistaken for a plain GET/PUT of the object or bucket.
const UNSERVED: &[&str] = &[
    "policy",
    "tagging",
    "cors",
    "lifecycle",
    "encryption",
    "website",
    "logging",
    "notification",
    "replication",
    "object-lock",
    "legal-hold",
    "retention",
    "ownershipControls",
    "publicAccessBlock",
    "accelerate",
    "requestPayment",
    "versions",
    "torrent",
    "restore",
    "select",
];

async fn dispatch(state: &AppState, r: Req) -> Result<Response, S3Error> {
    let op = |name: &'static str| {
        tracing::Span::current().record("op", name);
    };
    if let Some(sub) = UNSERVED.iter().find(|s| r.has(s)) {
        op("Unsupported");
        return Err(S3Error::new(
            S3Code::NotImplemented,
            format!("Granary does not serve the `{sub}` sub-resource"),
        ));
    }
    let m = r.parts.method.clone();
    if r.has("acl") && !r.bucket.is_empty() {
        return match m {
            Method::GET => {
                op("GetAcl");
                bucket::get_acl(state, r).await
            }
            Method::PUT => {
                op("PutAcl");
                bucket::put_acl(state, r).await
            }
            _ => Err(method_not_allowed()),
        };
    }
    if r.bucket.is_empty() {
        return match m {
            Method::GET => {
                op("ListBuckets");
                bucket::list_buckets(state, r).await
            }
            _ => Err(method_not_allowed()),
        };
    }
    match (&m, r.key.is_some()) {
        (&Method::GET, false) if r.has("location") => {
            op("GetBucketLocation");
            bucket::location(state, r).await
        }
        (&Method::GET, false) if r.has("versioning") => {
            op("GetBucketVersioning");
            bucket::versioning(state, r).await
        }
        (&Method::GET, false) if r.has("uploads") => {
            op("ListMultipartUploads");
            multipart::list_uploads(state, r).await
        }
        (&Method::GET, false) if r.q("list-type") == Some("2") => {
            op("ListObjectsV2");
            list::list_objects(state, r, true).await
        }
        (&Method::GET, false) => {
            op("ListObjects");
            list::list_objects(state, r, false).await
        }
        (&Method::PUT, false) => {
            op("CreateBucket");
            bucket::create(state, r).await
        }
        (&Method::HEAD, false) => {
            op("HeadBucket");
            bucket::head(state, r).await
        }
        (&Method::DELETE, false) => {
            op("DeleteBucket");
            bucket::delete(state, r).await
        }
        (&Method::POST, false) if r.has("delete") => {
            op("DeleteObjects");
            object::delete_objects(state, r).await
        }
        (&Method::GET, true) if r.has("uploadId") => {
            op("ListParts");
            multipart::list_parts(state, r).await
        }
        (&Method::GET, true) if r.has("attributes") => {
            op("GetObjectAttributes");
            get::attributes(state, r).await
        }
        (&Method::GET | &Method::HEAD, true) if r.has("transform") => {
            op("GetTransformed");
            get::get(state, r, m == Method::HEAD).await
        }
        (&Method::GET, true) if r.has("archlist") => {
            op("ListArchive");
            get::archive_list(state, r).await
        }
        (&Method::GET | &Method::HEAD, true) if r.has("archpath") => {
            op("GetArchiveMember");
            get::get(state, r, m == Method::HEAD).await
        }
        (&Method::GET, true) => {
            op("GetObject");
            get::get(state, r, false).await
        }
        (&Method::HEAD, true) => {
            op("HeadObject");
            get::get(state, r, true).await
        }
        (&Method::PUT, true) if r.has("partNumber") && r.has("uploadId") => {
            op("UploadPart");
            multipart::upload_part(state, r).await
        }
        (&Method::PUT, true) if r.parts.headers.contains_key("x-amz-copy-source") => {
            op("CopyObject");
            object::copy(state, r).await
        }
        (&Method::PUT, true) => {
            op("PutObject");
            object::put(state, r).await
        }
        (&Method::POST, true) if r.has("uploads") => {
            op("CreateMultipartUpload");
            multipart::create(state, r).await
        }
        (&Method::POST, true) if r.has("uploadId") => {
            op("CompleteMultipartUpload");
            multipart::complete(state, r).await
        }
        (&Method::DELETE, true) if r.has("uploadId") => {
            op("AbortMultipartUpload");
            multipart::abort(state, r).await
        }
        (&Method::DELETE, true) => {
            op("DeleteObject");
            object::delete(state, r).await
        }
        _ => Err(method_not_allowed()),
    }
}

/// A CORS preflight: Granary keeps no CORS rules, so it allows none. Without an
/// `Origin` it is no preflight at all: `400`, as S3 answers.
fn preflight(parts: &Parts) -> S3Error {
    tracing::Span::current().record("op", "PreflightCors");
    if parts.headers.contains_key(header::ORIGIN) {
        S3Error::new(
            S3Code::AccessDenied,
            "CORSResponse: This CORS request is not allowed",
        )
    } else {
        S3Error::new(
            S3Code::InvalidRequest,
            "Insufficient information. Origin request header needed.",
        )
    }
}

fn method_not_allowed() -> S3Error {
    S3Error::new(
        S3Code::MethodNotAllowed,
        "The specified method is not allowed against this resource.",
    )
}

/// A `200` XML response.
pub fn xml_response(body: String) -> Response {
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    resp
}

/// A response with no body and the given status.
pub fn empty(status: StatusCode) -> Response {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = status;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_bucket_and_key() {
        assert_eq!(
            split_path("/b/a%20b/c+d%2B").unwrap(),
            ("b".into(), Some("a b/c+d+".into()))
        );
        assert_eq!(
            split_path("/b/%ff").unwrap_err().code,
            S3Code::InvalidArgument
        );
    }
}
