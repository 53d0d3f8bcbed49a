//! The S3 error every API failure ends as: one code, its HTTP status, and the XML body S3
//! clients parse. Lower layers have their own error enums; `From` impls here map each of
//! them to an S3 code in one place.

use std::fmt;

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};

use crate::backend::BackendError;

/// S3 error codes Granary answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3Code {
    AccessDenied,
    AuthorizationHeaderMalformed,
    AuthorizationQueryParametersError,
    BadDigest,
    BucketAlreadyOwnedByYou,
    BucketNotEmpty,
    EntityTooLarge,
    EntityTooSmall,
    IncompleteBody,
    InternalError,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidBucketName,
    InvalidDigest,
    InvalidPart,
    InvalidPartOrder,
    InvalidRange,
    InvalidRequest,
    KeyTooLongError,
    MalformedXML,
    MethodNotAllowed,
    MissingContentLength,
    NoSuchBucket,
    NoSuchKey,
    NoSuchUpload,
    NotFound,
    NotModified,
    PreconditionFailed,
    RequestHeaderSectionTooLarge,
    RequestTimeTooSkewed,
    ServiceUnavailable,
    SignatureDoesNotMatch,
    SlowDown,
    XAmzContentSHA256Mismatch,
}

impl S3Code {
    pub fn as_str(self) -> &'static str {
        use S3Code::*;
        match self {
            AccessDenied => "AccessDenied",
            AuthorizationHeaderMalformed => "AuthorizationHeaderMalformed",
            AuthorizationQueryParametersError => "AuthorizationQueryParametersError",
            BadDigest => "BadDigest",
            BucketAlreadyOwnedByYou => "BucketAlreadyOwnedByYou",
            BucketNotEmpty => "BucketNotEmpty",
            EntityTooLarge => "EntityTooLarge",
            EntityTooSmall => "EntityTooSmall",
            IncompleteBody => "IncompleteBody",
            InternalError => "InternalError",
            InvalidAccessKeyId => "InvalidAccessKeyId",
            InvalidArgument => "InvalidArgument",
            InvalidBucketName => "InvalidBucketName",
            InvalidDigest => "InvalidDigest",
            InvalidPart => "InvalidPart",
            InvalidPartOrder => "InvalidPartOrder",
            InvalidRange => "InvalidRange",
            InvalidRequest => "InvalidRequest",
            KeyTooLongError => "KeyTooLongError",
            MalformedXML => "MalformedXML",
            MethodNotAllowed => "MethodNotAllowed",
            MissingContentLength => "MissingContentLength",
            NoSuchBucket => "NoSuchBucket",
            NoSuchKey => "NoSuchKey",
            NoSuchUpload => "NoSuchUpload",
            NotFound => "NotFound",
            NotModified => "NotModified",
            PreconditionFailed => "PreconditionFailed",
            RequestHeaderSectionTooLarge => "RequestHeaderSectionTooLarge",
            RequestTimeTooSkewed => "RequestTimeTooSkewed",
            ServiceUnavailable => "ServiceUnavailable",
            SignatureDoesNotMatch => "SignatureDoesNotMatch",
            SlowDown => "SlowDown",
            XAmzContentSHA256Mismatch => "XAmzContentSHA256Mismatch",
        }
    }

    pub fn status(self) -> StatusCode {
        use S3Code::*;
        match self {
            AccessDenied | InvalidAccessKeyId | RequestTimeTooSkewed | SignatureDoesNotMatch => {
                StatusCode::FORBIDDEN
            }
            BucketAlreadyOwnedByYou | BucketNotEmpty => StatusCode::CONFLICT,
            NoSuchBucket | NoSuchKey | NoSuchUpload | NotFound => StatusCode::NOT_FOUND,
            InvalidRange => StatusCode::RANGE_NOT_SATISFIABLE,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            MissingContentLength => StatusCode::LENGTH_REQUIRED,
            NotModified => StatusCode::NOT_MODIFIED,
            PreconditionFailed => StatusCode::PRECONDITION_FAILED,
            RequestHeaderSectionTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            InternalError => StatusCode::INTERNAL_SERVER_ERROR,
            ServiceUnavailable | SlowDown => StatusCode::SERVICE_UNAVAILABLE,
            AuthorizationHeaderMalformed
            | AuthorizationQueryParametersError
            | BadDigest
            | EntityTooLarge
            | EntityTooSmall
            | IncompleteBody
            | InvalidArgument
            | InvalidBucketName
            | InvalidDigest
            | InvalidPart
            | InvalidPartOrder
            | InvalidRequest
            | KeyTooLongError
            | MalformedXML
            | XAmzContentSHA256Mismatch => StatusCode::BAD_REQUEST,
        }
    }
}

/// An S3 error answer: a code, a message for people, and the resource it concerns.
#[derive(Debug, Clone)]
pub struct S3Error {
    pub code: S3Code,
    pub message: String,
    pub resource: Option<String>,
}

impl S3Error {
    pub fn new(code: S3Code, message: impl Into<String>) -> S3Error {
        S3Error {
            code,
            message: message.into(),
            resource: None,
        }
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
        let mut s = String::with_capacity(256);
        s.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>");
        s.push_str(self.code.as_str());
        s.push_str("</Code><Message>");
        crate::api::s3::xml::escape_lossy_into(&mut s, &self.message);
        s.push_str("</Message>");
        if let Some(r) = &self.resource {
            s.push_str("<Resource>");
            crate::api::s3::xml::escape_lossy_into(&mut s, r);
            s.push_str("</Resource>");
        }
        s.push_str("<RequestId>");
        s.push_str(request_id);
        s.push_str("</RequestId></Error>");
        s
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
        let status = self.code.status();
        let request_id = crate::api::request_id();
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
        resp.extensions_mut().insert(self);
        resp
    }
}

impl From<BackendError> for S3Error {
    fn from(e: BackendError) -> S3Error {
        use BackendError as B;
        let code = match &e {
            B::NoSuchBucket(_) => S3Code::NoSuchBucket,
            B::NoSuchKey(_) => S3Code::NoSuchKey,
            B::NoSuchUpload(_) => S3Code::NoSuchUpload,
            B::BucketExists(_) => S3Code::BucketAlreadyOwnedByYou,
            B::BucketNotEmpty(_) => S3Code::BucketNotEmpty,
            B::InvalidBucketName(_) => S3Code::InvalidBucketName,
            B::InvalidKey(_) => S3Code::InvalidArgument,
            B::KeyTooLong => S3Code::KeyTooLongError,
            B::InvalidPart(_) => S3Code::InvalidPart,
            B::InvalidPartOrder => S3Code::InvalidPartOrder,
            B::EntityTooSmall => S3Code::EntityTooSmall,
            B::BadDigest(_) => S3Code::BadDigest,
            B::Client(err) => return err.clone(),
            B::Io(_) => S3Code::InternalError,
            B::Unavailable(_) | B::NotAdmitted(_) => S3Code::ServiceUnavailable,
        };
        if matches!(code, S3Code::InternalError | S3Code::ServiceUnavailable) {
            tracing::error!(error = %e, "backend failure");
        }
        S3Error::new(code, e.to_string())
    }
}
