//! S3's answers and transport failures mapped onto `BackendError`: which side failed (the
//! client's request, this node's configuration, the store) and whether a retry can help.

use crate::backend::BackendError;

/// An error and its sources, `outer: inner: root`, for messages that reach users and logs.
pub(super) fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// What a call was about.
#[derive(Clone, Copy)]
pub(super) enum Target<'a> {
    Bucket(&'a str),
    Object(&'a str, &'a str),
    Upload(&'a str),
}

/// S3's error code (and status) → `BackendError`.
pub(super) fn from_code(
    code: Option<&str>,
    status: u16,
    message: &str,
    target: Target<'_>,
    backend: &str,
) -> BackendError {
    let (bucket, key) = match target {
        Target::Bucket(b) => (b, ""),
        Target::Object(b, k) => (b, k),
        Target::Upload(_) => ("", ""),
    };
    let code = code.unwrap_or(match status {
        404 => "NotFound",
        _ => "",
    });
    match code {
        // The client asked for something that is not there.
        "NoSuchKey" => BackendError::NoSuchKey(key.to_owned()),
        "NoSuchBucket" => BackendError::NoSuchBucket(bucket.to_owned()),
        "NoSuchUpload" => match target {
            Target::Upload(id) => BackendError::NoSuchUpload(id.to_owned()),
            _ => BackendError::NoSuchUpload(String::new()),
        },
        "NotFound" => match target {
            Target::Object(_, k) => BackendError::NoSuchKey(k.to_owned()),
            Target::Bucket(b) => BackendError::NoSuchBucket(b.to_owned()),
            Target::Upload(id) => BackendError::NoSuchUpload(id.to_owned()),
        },
        // The client's request conflicts with the store's state or breaks its rules.
        // Another account's bucket is not this node's to "create again".
        "BucketAlreadyOwnedByYou" => BackendError::BucketExists(bucket.to_owned()),
        "BucketNotEmpty" => BackendError::BucketNotEmpty(bucket.to_owned()),
        "InvalidBucketName" => BackendError::invalid_bucket(bucket, message),
        "InvalidPartOrder" => BackendError::InvalidPartOrder,
        "EntityTooSmall" => BackendError::EntityTooSmall,
        "BadDigest" => BackendError::BadDigest(if message.is_empty() {
            "the Content-MD5 you specified did not match what we received".into()
        } else {
            message.to_owned()
        }),
        "KeyTooLongError" => BackendError::KeyTooLong,
        // The store refuses this node's credentials or policy: the node's configuration,
        // not the client's signature; retry will not help.
        _ if status == 403 => BackendError::Denied(format!(
            "the S3 backend at {backend} denied access ({code}): {message}; check the node's AWS credentials"
        )),
        // The store failed or is overloaded (the SDK retried first): its side; a later
        // retry may help.
        _ if status >= 500 || code == "SlowDown" => BackendError::Unavailable(format!(
            "the S3 backend at {backend} failed with {status} {code}: {message}"
        )),
        _ => match passthrough(code) {
            // Other refusals of the client's request keep S3's own code.
            Some(c) => BackendError::StoreRefused {
                code: c.to_owned(),
                message: message.to_owned(),
            },
            // Redirects (wrong region) and codes we do not know: the node's setup or the
            // store; report them as the store's failure with its words.
            None => BackendError::Unavailable(format!(
                "the S3 backend at {backend} answered {status} {code}: {message}"
            )),
        },
    }
}

/// S3 codes of client errors that pass through unchanged.
fn passthrough(code: &str) -> Option<&str> {
    const KEPT: &[&str] = &[
        "BucketAlreadyExists",
        "InvalidPart",
        "InvalidArgument",
        "InvalidRequest",
        "InvalidRange",
        "InvalidDigest",
        "EntityTooLarge",
        "IncompleteBody",
        "MalformedXML",
        "MissingContentLength",
        "MethodNotAllowed",
        "PreconditionFailed",
        "NotModified",
    ];
    KEPT.iter().copied().find(|k| *k == code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_map_to_their_side() {
        let obj = Target::Object("bkt", "k");
        let m = |code: Option<&str>, status| from_code(code, status, "msg", obj, "http://s3");
        assert!(matches!(m(Some("NoSuchKey"), 404), BackendError::NoSuchKey(k) if k == "k"));
        assert!(matches!(m(None, 404), BackendError::NoSuchKey(_)));
        assert!(matches!(
            m(Some("NoSuchBucket"), 404),
            BackendError::NoSuchBucket(b) if b == "bkt"
        ));
        assert!(matches!(
            m(Some("BadDigest"), 400),
            BackendError::BadDigest(_)
        ));
        assert!(matches!(
            m(Some("InternalError"), 500),
            BackendError::Unavailable(_)
        ));
        assert!(matches!(
            m(Some("SlowDown"), 503),
            BackendError::Unavailable(_)
        ));
        assert!(matches!(
            m(Some("SignatureDoesNotMatch"), 403),
            BackendError::Denied(_)
        ));
        assert!(matches!(
            m(Some("PreconditionFailed"), 412),
            BackendError::StoreRefused { code, .. } if code == "PreconditionFailed"
        ));
        assert!(matches!(
            from_code(
                Some("BucketAlreadyOwnedByYou"),
                409,
                "",
                Target::Bucket("b"),
                ""
            ),
            BackendError::BucketExists(_)
        ));
        assert!(matches!(
            from_code(None, 404, "", Target::Bucket("b"), ""),
            BackendError::NoSuchBucket(_)
        ));
        assert!(matches!(
            from_code(Some("NoSuchUpload"), 404, "", Target::Upload("u1"), ""),
            BackendError::NoSuchUpload(u) if u == "u1"
        ));
    }
}
