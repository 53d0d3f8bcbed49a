//! S3's error codes: the names clients match on, and the HTTP status each goes with.

/// S3 error codes Granary answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3Code {
    AccessDenied,
    AuthorizationHeaderMalformed,
    AuthorizationQueryParametersError,
    BadDigest,
    BucketAlreadyExists,
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
    InvalidPartNumber,
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
    NotImplemented,
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
    /// Every code.
    pub const ALL: &'static [S3Code] = &[
        S3Code::AccessDenied,
        S3Code::AuthorizationHeaderMalformed,
        S3Code::AuthorizationQueryParametersError,
        S3Code::BadDigest,
        S3Code::BucketAlreadyExists,
        S3Code::BucketAlreadyOwnedByYou,
        S3Code::BucketNotEmpty,
        S3Code::EntityTooLarge,
        S3Code::EntityTooSmall,
        S3Code::IncompleteBody,
        S3Code::InternalError,
        S3Code::InvalidAccessKeyId,
        S3Code::InvalidArgument,
        S3Code::InvalidBucketName,
        S3Code::InvalidDigest,
        S3Code::InvalidPart,
        S3Code::InvalidPartNumber,
        S3Code::InvalidPartOrder,
        S3Code::InvalidRange,
        S3Code::InvalidRequest,
        S3Code::KeyTooLongError,
        S3Code::MalformedXML,
        S3Code::MethodNotAllowed,
        S3Code::MissingContentLength,
        S3Code::NoSuchBucket,
        S3Code::NoSuchKey,
        S3Code::NoSuchUpload,
        S3Code::NotFound,
        S3Code::NotImplemented,
        S3Code::NotModified,
        S3Code::PreconditionFailed,
        S3Code::RequestHeaderSectionTooLarge,
        S3Code::RequestTimeTooSkewed,
        S3Code::ServiceUnavailable,
        S3Code::SignatureDoesNotMatch,
        S3Code::SlowDown,
        S3Code::XAmzContentSHA256Mismatch,
    ];

    /// The code of its name, for codes Granary answers with.
    pub fn parse(name: &str) -> Option<S3Code> {
        Self::ALL.iter().copied().find(|c| c.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        use S3Code::*;
        match self {
            AccessDenied => "AccessDenied",
            AuthorizationHeaderMalformed => "AuthorizationHeaderMalformed",
            AuthorizationQueryParametersError => "AuthorizationQueryParametersError",
            BadDigest => "BadDigest",
            BucketAlreadyExists => "BucketAlreadyExists",
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
            InvalidPartNumber => "InvalidPartNumber",
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
            NotImplemented => "NotImplemented",
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

    pub fn status(self) -> u16 {
        use S3Code::*;
        match self {
            AccessDenied | InvalidAccessKeyId | RequestTimeTooSkewed | SignatureDoesNotMatch => 403,
            BucketAlreadyExists | BucketAlreadyOwnedByYou | BucketNotEmpty => 409,
            NoSuchBucket | NoSuchKey | NoSuchUpload | NotFound => 404,
            InvalidRange | InvalidPartNumber => 416,
            MethodNotAllowed => 405,
            MissingContentLength => 411,
            NotModified => 304,
            PreconditionFailed => 412,
            RequestHeaderSectionTooLarge => 431,
            InternalError => 500,
            NotImplemented => 501,
            ServiceUnavailable | SlowDown => 503,
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
            | XAmzContentSHA256Mismatch => 400,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_have_statuses() {
        for c in S3Code::ALL {
            assert_eq!(S3Code::parse(c.as_str()), Some(*c));
            assert!((300..600).contains(&c.status()), "{c:?}");
        }
        assert_eq!(S3Code::NoSuchKey.status(), 404);
        assert_eq!(S3Code::parse("Nope"), None);
    }
}
