//! The S3 error every API failure ends as: one code, its HTTP status, and the XML body S3
//! clients parse. Every lower layer has its own error enum; the `From` impls here are the
//! one place they become S3 codes.

use std::fmt;

use axum::response::{IntoResponse, Response};
use granary_proto::auth::AuthError;
use granary_proto::xml::XmlError;
use http::{HeaderValue, StatusCode};

use granary_core::{BackendError, CacheError, ClusterError, NodeError, Refusal, TransformError};

pub use granary_proto::S3Code;

/// An S3 error answer: a code, a message for people, and the resource it concerns.
#[derive(Debug, Clone)]
pub struct S3Error {
    pub code: S3Code,
    pub message: String,
    pub resource: Option<String>,
    /// Fields some codes carry in the document (`ActualObjectSize` with `InvalidRange`).
    pub details: Vec<(&'static str, String)>,
    /// Headers some answers carry (`ETag` with `304`).
    pub headers: Vec<(http::HeaderName, HeaderValue)>,
    /// The backend failed (unreachable, erring, denying): counted as a backend error.
    pub backend_failed: bool,
}

impl S3Error {
    pub fn new(code: S3Code, message: impl Into<String>) -> S3Error {
        S3Error {
            code,
            message: message.into(),
            resource: None,
            details: Vec::new(),
            headers: Vec::new(),
            backend_failed: false,
        }
    }

    pub fn with_detail(mut self, tag: &'static str, text: impl Into<String>) -> S3Error {
        self.details.push((tag, text.into()));
        self
    }

    pub fn with_header(mut self, name: http::HeaderName, value: HeaderValue) -> S3Error {
        self.headers.push((name, value));
        self
    }

    pub fn with_resource(mut self, resource: impl Into<String>) -> S3Error {
        self.resource = Some(resource.into());
        self
    }

    pub fn internal(message: impl fmt::Display) -> S3Error {
        S3Error::new(S3Code::InternalError, message.to_string())
    }

    /// The S3 XML error document.
    pub fn to_xml(&self, request_id: &str) -> String {
        granary_proto::xml::error_doc(
            self.code.as_str(),
            &self.message,
            self.resource.as_deref(),
            &self.details,
            request_id,
        )
    }
}

impl fmt::Display for S3Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for S3Error {}

impl IntoResponse for S3Error {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let request_id = super::request_id();
        let mut resp = if status == StatusCode::NOT_MODIFIED {
            Response::new(axum::body::Body::empty())
        } else {
            Response::new(axum::body::Body::from(self.to_xml(&request_id)))
        };
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        if status != StatusCode::NOT_MODIFIED {
            h.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/xml"),
            );
        }
        if let Ok(v) = HeaderValue::from_str(&request_id) {
            h.insert("x-amz-request-id", v);
        }
        if let Ok(code) = HeaderValue::from_str(self.code.as_str()) {
            h.insert("x-amz-error-code", code);
        }
        // A HEAD's answer has no body: the message goes in a header too (where it is
        // plain ASCII), so that a client can say more than the status.
        if let Ok(message) = HeaderValue::from_str(&self.message) {
            h.insert("x-amz-error-message", message);
        }
        for (name, value) in &self.headers {
            h.insert(name.clone(), value.clone());
        }
        resp.extensions_mut().insert(self);
        resp
    }
}

/// The request body's own verdict (a bad chunk signature, a checksum mismatch, a short
/// body), which the body decoder (`s3::body`) hands down inside the stream's errors: the
/// one place it is taken back out.
fn body_verdict(e: &std::io::Error) -> Option<S3Error> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<S3Error>())
        .cloned()
}

impl From<std::io::Error> for S3Error {
    fn from(e: std::io::Error) -> S3Error {
        body_verdict(&e).unwrap_or_else(|| S3Error::internal(e))
    }
}

impl From<Refusal> for S3Error {
    fn from(r: Refusal) -> S3Error {
        let message = r.to_string();
        match r {
            Refusal::PreconditionFailed => S3Error::new(S3Code::PreconditionFailed, message),
            // A 304 names the version the client holds.
            Refusal::NotModified {
                etag,
                last_modified,
            } => S3Error::new(S3Code::NotModified, message)
                .with_header(http::header::ETAG, super::headers::quoted(&etag))
                .with_header(
                    http::header::LAST_MODIFIED,
                    super::headers::http_date(last_modified),
                ),
            // The AWS CRT learns an empty object's size from this field.
            Refusal::Unsatisfiable { size } => S3Error::new(S3Code::InvalidRange, message)
                .with_detail("ActualObjectSize", size.to_string()),
            Refusal::Changed(_) | Refusal::Declined => {
                S3Error::new(S3Code::ServiceUnavailable, message)
            }
        }
    }
}

impl From<BackendError> for S3Error {
    fn from(e: BackendError) -> S3Error {
        S3Error::from(&e)
    }
}

impl From<&BackendError> for S3Error {
    fn from(e: &BackendError) -> S3Error {
        use BackendError as B;
        let code = match e {
            B::NoSuchBucket(_) => S3Code::NoSuchBucket,
            B::NoSuchKey(_) => S3Code::NoSuchKey,
            B::NoSuchUpload(_) => S3Code::NoSuchUpload,
            B::BucketExists(_) => S3Code::BucketAlreadyOwnedByYou,
            B::BucketNotEmpty(_) => S3Code::BucketNotEmpty,
            B::InvalidBucketName { .. } => S3Code::InvalidBucketName,
            B::InvalidKey(_) => S3Code::InvalidArgument,
            B::KeyTooLong => S3Code::KeyTooLongError,
            B::InvalidPart(_) => S3Code::InvalidPart,
            B::InvalidPartOrder => S3Code::InvalidPartOrder,
            B::NoParts => S3Code::MalformedXML,
            B::EntityTooSmall => S3Code::EntityTooSmall,
            B::BadDigest(_) => S3Code::BadDigest,
            B::IncompleteBody(_) => S3Code::IncompleteBody,
            B::LengthRequired(_) => S3Code::MissingContentLength,
            B::Refused(r) => return S3Error::from(r.clone()),
            B::Body(io) => {
                return body_verdict(io).unwrap_or_else(|| {
                    S3Error::new(
                        S3Code::IncompleteBody,
                        format!("the request body was cut short: {io}"),
                    )
                })
            }
            B::StoreRefused { code, .. } => S3Code::parse(code).unwrap_or(S3Code::InvalidRequest),
            B::Denied(_) => S3Code::AccessDenied,
            B::Busy(_) => S3Code::SlowDown,
            B::Io(_) => S3Code::InternalError,
            B::Unavailable(_) => S3Code::ServiceUnavailable,
        };
        let mut err = S3Error::new(code, e.to_string());
        if matches!(
            code,
            S3Code::InternalError | S3Code::ServiceUnavailable | S3Code::SlowDown
        ) || matches!(e, B::Denied(_))
        {
            tracing::error!(error = %e, "backend failure");
            err.backend_failed = true;
        }
        err
    }
}

impl From<CacheError> for S3Error {
    fn from(e: CacheError) -> S3Error {
        S3Error::from(&e)
    }
}

impl From<&CacheError> for S3Error {
    fn from(e: &CacheError) -> S3Error {
        let code = match e {
            CacheError::Source(b) => return b.into(),
            CacheError::Refused(r) => return r.clone().into(),
            CacheError::NotHeld => S3Code::NoSuchKey,
            CacheError::NotTar(_) => S3Code::InvalidArgument,
            CacheError::NotAdmitted { .. } => S3Code::ServiceUnavailable,
            CacheError::FillFailed(_) | CacheError::Disk(_) => S3Code::InternalError,
        };
        S3Error::new(code, e.to_string())
    }
}

impl From<ClusterError> for S3Error {
    fn from(e: ClusterError) -> S3Error {
        S3Error::from(&e)
    }
}

impl From<&ClusterError> for S3Error {
    fn from(e: &ClusterError) -> S3Error {
        match e {
            // The member's own answer, as it gave it.
            ClusterError::Refused {
                code: Some(code),
                message,
                ..
            } => S3Error::new(*code, message.clone()),
            ClusterError::Refused { status, .. } => {
                let code = match status {
                    400 => S3Code::InvalidArgument,
                    403 => S3Code::AccessDenied,
                    404 => S3Code::NoSuchKey,
                    503 => S3Code::ServiceUnavailable,
                    _ => S3Code::InternalError,
                };
                S3Error::new(code, e.to_string())
            }
            ClusterError::Garbled { .. } => S3Error::new(S3Code::InternalError, e.to_string()),
            ClusterError::Unreachable { .. } | ClusterError::Timeout { .. } => {
                S3Error::new(S3Code::ServiceUnavailable, format!("{e}; retry"))
            }
        }
    }
}

impl From<TransformError> for S3Error {
    fn from(e: TransformError) -> S3Error {
        S3Error::from(&e)
    }
}

impl From<&TransformError> for S3Error {
    fn from(e: &TransformError) -> S3Error {
        let code = match e {
            TransformError::Unknown(_) => S3Code::InvalidArgument,
            TransformError::TooLarge { .. } => S3Code::EntityTooLarge,
            TransformError::Failed { .. } | TransformError::Prep { .. } => S3Code::InternalError,
            TransformError::UnknownPipeline(_) => S3Code::InvalidArgument,
        };
        S3Error::new(code, e.to_string())
    }
}

impl From<NodeError> for S3Error {
    fn from(e: NodeError) -> S3Error {
        S3Error::from(&e)
    }
}

/// By reference: a failure several requests share (one preparation's) maps for each of
/// them as it would for one.
impl From<&NodeError> for S3Error {
    fn from(e: &NodeError) -> S3Error {
        let code = match e {
            NodeError::Backend(b) => return b.into(),
            NodeError::Cache(c) => return c.into(),
            NodeError::Cluster(c) => return c.into(),
            NodeError::Transform(t) => return t.into(),
            NodeError::Shared(e) => return S3Error::from(&**e),
            NodeError::Invalid(_) | NodeError::NotAShard(_) => S3Code::InvalidArgument,
            NodeError::NoMember(_) => S3Code::NoSuchKey,
            NodeError::Changed(_) | NodeError::ShardNotHeld => S3Code::ServiceUnavailable,
            NodeError::Cut(_) => S3Code::InternalError,
            NodeError::Busy(_) => S3Code::SlowDown,
        };
        S3Error::new(code, e.to_string())
    }
}

impl From<AuthError> for S3Error {
    fn from(e: AuthError) -> S3Error {
        S3Error::new(e.code, e.message)
    }
}

impl From<XmlError> for S3Error {
    fn from(e: XmlError) -> S3Error {
        S3Error::new(
            S3Code::MalformedXML,
            format!("The XML you provided was not well-formed or did not validate against our published schema: {e}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_members_code_reaches_the_client() {
        let refused = |status, code| ClusterError::Refused {
            node: "b".into(),
            what: "a batch item",
            status,
            code,
            message: "from b".into(),
        };
        let e = S3Error::from(NodeError::from(refused(503, Some(S3Code::SlowDown))));
        assert_eq!((e.code, e.message.as_str()), (S3Code::SlowDown, "from b"));
        let e = S3Error::from(refused(400, Some(S3Code::InvalidRange)));
        assert_eq!(e.code, S3Code::InvalidRange);
        // No document: the status says what it can.
        assert_eq!(S3Error::from(refused(403, None)).code, S3Code::AccessDenied);
        assert_eq!(
            S3Error::from(refused(502, None)).code,
            S3Code::InternalError
        );
        let gone = ClusterError::Timeout { node: "b".into() };
        assert_eq!(S3Error::from(gone).code, S3Code::ServiceUnavailable);
    }
}
