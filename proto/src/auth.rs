//! Checking a request's signature, as the node does: AWS SigV4 in the `Authorization`
//! header and in presigned queries, SigV2 presigned queries, and peer authentication.
//! The verdict also says how the body is signed, which the node's body decoder then
//! enforces chunk by chunk.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::request::Parts;
use http::{HeaderMap, Method};

use crate::code::S3Code;
use crate::encode::{query_has, query_pairs};
use crate::sigv4::{self, ChunkSigner, Scope};
use crate::{headers, peer, sigv2};

/// How far a signed request's date may be from ours.
pub const MAX_SKEW: Duration = Duration::from_secs(15 * 60);
/// The longest validity a presigned V4 URL may claim (S3's limit: 7 days).
pub const MAX_PRESIGN_EXPIRES: u64 = 7 * 24 * 3600;

/// The node's credentials.
#[derive(Clone)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// How the request body is to be checked.
#[derive(Debug, Clone)]
pub enum Payload {
    /// Not signed (no credentials configured, `UNSIGNED-PAYLOAD`, or a presigned URL).
    Unsigned,
    /// The SHA-256 the signature covers; the body must hash to it.
    Sha256([u8; 32]),
    /// `aws-chunked` with a signature per chunk (and, with `trailer`, over the trailer).
    StreamingSigned { ctx: ChunkSigner, trailer: bool },
    /// `aws-chunked` without signatures, trailer checksum only.
    StreamingUnsigned,
}

/// The outcome of authentication.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Whether the request carried a valid signature (false: anonymous).
    pub signed: bool,
    pub payload: Payload,
    /// The member that signed it, for requests a member made itself.
    pub peer: Option<String>,
}

impl Verdict {
    fn anonymous(payload: Payload) -> Verdict {
        Verdict {
            signed: false,
            payload,
            peer: None,
        }
    }

    fn signed(payload: Payload) -> Verdict {
        Verdict {
            signed: true,
            payload,
            peer: None,
        }
    }
}

/// A refused request: the S3 code to answer with and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthError {
    pub code: S3Code,
    pub message: String,
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for AuthError {}

fn err(code: S3Code, msg: &str) -> AuthError {
    AuthError {
        code,
        message: msg.to_owned(),
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Whether the request carries a signature of a client (which names its host).
pub fn client_signed(parts: &Parts) -> bool {
    let q = parts.uri.query().unwrap_or("");
    parts.headers.contains_key(http::header::AUTHORIZATION)
        || query_has(q, "X-Amz-Signature")
        || query_has(q, "Signature")
}

/// Authenticates a request. With no credentials configured every request passes and only
/// the body framing (`aws-chunked`) is taken from the headers. `anonymous_read` lets
/// unsigned GET/HEAD requests through.
pub fn authenticate(
    creds: Option<&Credentials>,
    anonymous_read: bool,
    parts: &Parts,
) -> Result<Verdict, AuthError> {
    let content_sha = header(&parts.headers, "x-amz-content-sha256");
    let Some(creds) = creds else {
        let payload = match content_sha {
            Some(s) if s.starts_with("STREAMING-") => Payload::StreamingUnsigned,
            _ => Payload::Unsigned,
        };
        return Ok(Verdict::anonymous(payload));
    };
    let query = parts.uri.query().unwrap_or("");
    if parts.headers.contains_key(headers::PEER_AUTH) {
        // The node checks a member's signature in full before anything else (it keeps
        // the nonces and hashes the body): see `peer`.
        let Some(peer::Verified(node)) = parts.extensions.get::<peer::Verified>() else {
            return Err(err(
                S3Code::AccessDenied,
                "Access Denied: bad peer signature",
            ));
        };
        return Ok(Verdict {
            peer: Some(node.clone()),
            ..Verdict::signed(Payload::Unsigned)
        });
    }
    if let Some(auth) = header(&parts.headers, "authorization") {
        if let Some(v2) = auth.strip_prefix("AWS ") {
            return header_v2(creds, parts, v2);
        }
        return header_v4(creds, parts, auth);
    }
    if query_has(query, "X-Amz-Signature") || query_has(query, "X-Amz-Algorithm") {
        return presigned_v4(creds, parts);
    }
    if query_has(query, "Signature") && query_has(query, "AWSAccessKeyId") {
        return presigned_v2(creds, parts);
    }
    let read_only = parts.method == Method::GET || parts.method == Method::HEAD;
    if anonymous_read && read_only {
        return Ok(Verdict::anonymous(Payload::Unsigned));
    }
    Err(err(
        S3Code::AccessDenied,
        "Access Denied: the request is not signed",
    ))
}

fn skewed() -> AuthError {
    err(
        S3Code::RequestTimeTooSkewed,
        "The difference between the request time and the server's time is too large.",
    )
}

fn check_skew(at: SystemTime) -> Result<(), AuthError> {
    let now = SystemTime::now();
    let skew = now
        .duration_since(at)
        .or_else(|_| at.duration_since(now))
        .unwrap_or_default();
    if skew > MAX_SKEW {
        return Err(skewed());
    }
    Ok(())
}

fn check_access_key(creds: &Credentials, ak: &str) -> Result<(), AuthError> {
    if ak != creds.access_key {
        return Err(err(
            S3Code::InvalidAccessKeyId,
            "The AWS Access Key Id you provided does not exist in our records.",
        ));
    }
    Ok(())
}

fn mismatch() -> AuthError {
    err(
        S3Code::SignatureDoesNotMatch,
        "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
    )
}

/// What a SigV4 signature covers, from the header or the presigned query.
struct V4Check<'a> {
    scope: &'a Scope<'a>,
    amz_date: &'a str,
    signed_headers: &'a str,
    content_sha: &'a str,
    /// A presigned query: its own `X-Amz-Signature` is left out of the canonical query.
    presigned: bool,
}

impl V4Check<'_> {
    /// Recomputes the signature; returns the signing key when it matches.
    fn verify(
        &self,
        creds: &Credentials,
        parts: &Parts,
        signature: &str,
    ) -> Result<[u8; 32], AuthError> {
        let signed: Vec<&str> = self.signed_headers.split(';').collect();
        let canonical = sigv4::canonical_request(
            parts.method.as_str(),
            &sigv4::canonical_uri(parts.uri.path()),
            &sigv4::canonical_query(parts.uri.query().unwrap_or(""), self.presigned),
            &sigv4::canonical_headers(&signed, |name| {
                parts.headers.get_all(name).iter().map(|v| v.as_bytes())
            }),
            self.signed_headers,
            self.content_sha,
        );
        let key = self.scope.signing_key(&creds.secret_key);
        let sts = sigv4::string_to_sign(self.amz_date, &self.scope.text(), &canonical);
        let expected = hex::encode(sigv4::hmac_sha256(&key, sts.as_bytes()));
        if !sigv4::ct_eq(&expected, signature) {
            return Err(mismatch());
        }
        Ok(key)
    }
}

fn header_v4(creds: &Credentials, parts: &Parts, auth: &str) -> Result<Verdict, AuthError> {
    let malformed = || {
        err(
            S3Code::AuthorizationHeaderMalformed,
            "the Authorization header is malformed",
        )
    };
    let rest = auth
        .strip_prefix(sigv4::ALGORITHM)
        .and_then(|r| r.strip_prefix(' '))
        .ok_or_else(malformed)?;
    let (mut credential, mut signed_headers, mut signature) = (None, None, None);
    for item in rest.split(',') {
        let item = item.trim();
        if let Some(v) = item.strip_prefix("Credential=") {
            credential = Some(v);
        } else if let Some(v) = item.strip_prefix("SignedHeaders=") {
            signed_headers = Some(v);
        } else if let Some(v) = item.strip_prefix("Signature=") {
            signature = Some(v);
        }
    }
    let (Some(credential), Some(signed_headers), Some(signature)) =
        (credential, signed_headers, signature)
    else {
        return Err(malformed());
    };
    let scope = Scope::parse(credential).ok_or_else(|| {
        err(
            S3Code::AuthorizationHeaderMalformed,
            "the Credential is malformed",
        )
    })?;
    // The signed time: `x-amz-date`, or else the `Date` header (as S3 accepts), which
    // the string to sign writes in the same basic ISO 8601 form.
    let dated = match header(&parts.headers, "x-amz-date") {
        Some(d) => d.to_owned(),
        None => header(&parts.headers, "date")
            .and_then(sigv4::parse_request_date)
            .map(sigv4::amz_date)
            .ok_or_else(|| {
                err(
                    S3Code::AccessDenied,
                    "the request has no x-amz-date or Date header",
                )
            })?,
    };
    let amz_date = dated.as_str();
    let at = sigv4::parse_amz_date(amz_date).ok_or_else(malformed)?;
    if !amz_date.starts_with(scope.date) {
        return Err(malformed());
    }
    check_skew(at)?;
    check_access_key(creds, scope.access_key)?;
    let content_sha =
        header(&parts.headers, "x-amz-content-sha256").unwrap_or(sigv4::UNSIGNED_PAYLOAD);
    if !signed_headers.split(';').any(|h| h == "host") {
        return Err(malformed());
    }
    let check = V4Check {
        scope: &scope,
        amz_date,
        signed_headers,
        content_sha,
        presigned: false,
    };
    let key = check.verify(creds, parts, signature)?;
    let payload = match content_sha {
        sigv4::UNSIGNED_PAYLOAD => Payload::Unsigned,
        sigv4::STREAMING_SIGNED | sigv4::STREAMING_SIGNED_TRAILER => Payload::StreamingSigned {
            ctx: ChunkSigner {
                key,
                amz_date: amz_date.to_owned(),
                scope: scope.text(),
                seed_signature: signature.to_owned(),
            },
            trailer: content_sha == sigv4::STREAMING_SIGNED_TRAILER,
        },
        sigv4::STREAMING_UNSIGNED_TRAILER => Payload::StreamingUnsigned,
        hexsha => {
            let mut h = [0u8; 32];
            hex::decode_to_slice(hexsha, &mut h).map_err(|_| {
                err(
                    S3Code::InvalidArgument,
                    "x-amz-content-sha256 must be a hex SHA-256 or a known payload mode",
                )
            })?;
            Payload::Sha256(h)
        }
    };
    Ok(Verdict::signed(payload))
}

fn presigned_v4(creds: &Credentials, parts: &Parts) -> Result<Verdict, AuthError> {
    let q = query_pairs(parts.uri.query().unwrap_or(""));
    let get = |name: &str| q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let bad = |m: &str| err(S3Code::AuthorizationQueryParametersError, m);
    if get("X-Amz-Algorithm") != Some(sigv4::ALGORITHM) {
        return Err(bad("X-Amz-Algorithm must be AWS4-HMAC-SHA256"));
    }
    let credential = get("X-Amz-Credential").ok_or_else(|| bad("X-Amz-Credential is missing"))?;
    let amz_date = get("X-Amz-Date").ok_or_else(|| bad("X-Amz-Date is missing"))?;
    let expires: i64 = get("X-Amz-Expires")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad("X-Amz-Expires must be a number of seconds"))?;
    let signed_headers =
        get("X-Amz-SignedHeaders").ok_or_else(|| bad("X-Amz-SignedHeaders is missing"))?;
    let signature = get("X-Amz-Signature").ok_or_else(|| bad("X-Amz-Signature is missing"))?;
    // A URL that could never be valid is refused as an expired one is (as Ceph's
    // conformance suite expects of S3 servers).
    let expires = u64::try_from(expires)
        .ok()
        .filter(|e| *e <= MAX_PRESIGN_EXPIRES)
        .ok_or_else(|| {
            err(
                S3Code::AccessDenied,
                "X-Amz-Expires must be from 0 to a week (604800 seconds)",
            )
        })?;
    let scope = Scope::parse(credential).ok_or_else(|| bad("the Credential is malformed"))?;
    check_access_key(creds, scope.access_key)?;
    let at = sigv4::parse_amz_date(amz_date).ok_or_else(|| bad("X-Amz-Date is malformed"))?;
    let now = SystemTime::now();
    if now > at + Duration::from_secs(expires) {
        return Err(err(S3Code::AccessDenied, "Request has expired"));
    }
    if at > now + MAX_SKEW {
        return Err(err(S3Code::AccessDenied, "Request is not valid yet"));
    }
    let content_sha = get("X-Amz-Content-Sha256").unwrap_or(sigv4::UNSIGNED_PAYLOAD);
    let check = V4Check {
        scope: &scope,
        amz_date,
        signed_headers,
        content_sha,
        presigned: true,
    };
    check.verify(creds, parts, signature)?;
    Ok(Verdict::signed(Payload::Unsigned))
}

/// The `x-amz-*` headers a V2 signature covers: lower-case names, trimmed values.
fn amz_headers(h: &HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .filter(|(k, _)| k.as_str().starts_with("x-amz-"))
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).trim().to_owned(),
            )
        })
        .collect()
}

fn presigned_v2(creds: &Credentials, parts: &Parts) -> Result<Verdict, AuthError> {
    let q = query_pairs(parts.uri.query().unwrap_or(""));
    let get = |name: &str| q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    check_access_key(creds, get("AWSAccessKeyId").unwrap_or(""))?;
    let expires_text = get("Expires").unwrap_or("");
    let expires: u64 = expires_text.parse().map_err(|_| {
        err(
            S3Code::AccessDenied,
            "Expires must be a Unix time in seconds",
        )
    })?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if now > expires {
        return Err(err(S3Code::AccessDenied, "Request has expired"));
    }
    let amz = amz_headers(&parts.headers);
    let sts = sigv2::StringToSign {
        method: parts.method.as_str(),
        content_md5: header(&parts.headers, "content-md5").unwrap_or(""),
        content_type: header(&parts.headers, "content-type").unwrap_or(""),
        expires: expires_text,
        amz_headers: &amz,
        path: parts.uri.path(),
        query: &q,
    };
    let expected = sigv2::signature(&creds.secret_key, &sts.text());
    if !sigv4::ct_eq(&expected, get("Signature").unwrap_or("")) {
        return Err(mismatch());
    }
    Ok(Verdict::signed(Payload::Unsigned))
}

/// `Authorization: AWS KEY:SIGNATURE` (Signature Version 2, as s3cmd and older SDKs send
/// it): HMAC-SHA1 over the method, `Content-MD5`, `Content-Type`, the `Date` (empty when
/// `x-amz-date` is sent, which is signed among the `x-amz-*` headers), the `x-amz-*`
/// headers and the resource. The body is not signed (`Content-MD5`, when sent, is
/// checked against it as on any request).
fn header_v2(creds: &Credentials, parts: &Parts, v2: &str) -> Result<Verdict, AuthError> {
    let Some((ak, signature)) = v2.trim().split_once(':') else {
        return Err(err(
            S3Code::AuthorizationHeaderMalformed,
            "the Authorization header is malformed: AWS KEY:SIGNATURE",
        ));
    };
    // The date first: a request far off in time is `RequestTimeTooSkewed` whatever its
    // key and signature, as S3 answers.
    let amz_date = header(&parts.headers, "x-amz-date");
    let date = amz_date
        .or_else(|| header(&parts.headers, "date"))
        .ok_or_else(|| {
            err(
                S3Code::AccessDenied,
                "AWS authentication requires a valid Date or x-amz-date header",
            )
        })?;
    let at = sigv4::parse_request_date(date).ok_or_else(|| {
        err(
            S3Code::AccessDenied,
            "AWS authentication requires a valid Date or x-amz-date header",
        )
    })?;
    check_skew(at)?;
    check_access_key(creds, ak)?;
    let amz = amz_headers(&parts.headers);
    let q = query_pairs(parts.uri.query().unwrap_or(""));
    let path = parts.uri.path();
    // A bucket's own resource is `/bucket/` to some signers (botocore) and `/bucket` to
    // others: either is taken.
    let bucket_only = path.len() > 1 && !path[1..].contains('/');
    let with_slash = format!("{path}/");
    let resources: &[&str] = if bucket_only {
        &[path, &with_slash]
    } else {
        &[path]
    };
    let matches = resources.iter().any(|resource| {
        let sts = sigv2::StringToSign {
            method: parts.method.as_str(),
            content_md5: header(&parts.headers, "content-md5").unwrap_or(""),
            content_type: header(&parts.headers, "content-type").unwrap_or(""),
            expires: if amz_date.is_some() { "" } else { date },
            amz_headers: &amz,
            path: resource,
            query: &q,
        };
        sigv4::ct_eq(&sigv2::signature(&creds.secret_key, &sts.text()), signature)
    });
    if !matches {
        return Err(mismatch());
    }
    Ok(Verdict::signed(Payload::Unsigned))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sigv4::{Request, Signer};

    fn creds() -> Credentials {
        Credentials {
            access_key: "AK".into(),
            secret_key: "SK".into(),
        }
    }

    fn parts(method: &str, target: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder().method(method).uri(target);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    /// What the signer signs, the verifier accepts; anything changed is refused.
    #[test]
    fn the_signer_and_the_verifier_agree() {
        let signer = Signer::new("AK", "SK", "us-east-1");
        let (path, query) = ("/b/a%20b%2B.tar", "archpath=x%2Fy&list-type=2");
        let signed = signer.sign(
            &Request {
                method: "GET",
                path,
                query,
                headers: &[("host", "127.0.0.1:7070"), ("range", "bytes=0-9")],
                payload_hash: sigv4::UNSIGNED_PAYLOAD,
            },
            SystemTime::now(),
        );
        let mut headers: Vec<(&str, &str)> =
            vec![("host", "127.0.0.1:7070"), ("range", "bytes=0-9")];
        headers.extend(signed.headers.iter().map(|(k, v)| (*k, v.as_str())));
        let target = format!("{path}?{query}");
        let v = authenticate(Some(&creds()), false, &parts("GET", &target, &headers)).unwrap();
        assert!(v.signed && matches!(v.payload, Payload::Unsigned));
        headers[1].1 = "bytes=0-10";
        let e = authenticate(Some(&creds()), false, &parts("GET", &target, &headers)).unwrap_err();
        assert_eq!(e.code, S3Code::SignatureDoesNotMatch);
        let e = authenticate(Some(&creds()), false, &parts("GET", "/b/k", &[])).unwrap_err();
        assert_eq!(e.code, S3Code::AccessDenied);
        assert!(
            authenticate(Some(&creds()), true, &parts("GET", "/b/k", &[])).is_ok_and(|v| !v.signed)
        );
    }

    /// A request dated by `Date` instead of `x-amz-date` (S3 accepts either).
    #[test]
    fn a_request_dated_by_its_date_header_verifies() {
        let at = UNIX_EPOCH
            + Duration::from_secs(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_secs(),
            );
        let http_date = httpdate::fmt_http_date(at);
        let date = sigv4::amz_date(at);
        let scope = format!("{}/us-east-1/s3/aws4_request", &date[..8]);
        let names = ["date", "host", "x-amz-content-sha256"];
        let values = [http_date.as_str(), "h:1", sigv4::UNSIGNED_PAYLOAD];
        let canonical = sigv4::canonical_request(
            "GET",
            &sigv4::canonical_uri("/b/k"),
            &sigv4::canonical_query("", false),
            &sigv4::canonical_headers(&names, |n| {
                let i = names.iter().position(|m| *m == n).unwrap();
                vec![values[i].as_bytes()]
            }),
            &names.join(";"),
            sigv4::UNSIGNED_PAYLOAD,
        );
        let key = sigv4::signing_key("SK", &date[..8], "us-east-1", "s3");
        let sts = sigv4::string_to_sign(&date, &scope, &canonical);
        let signature = hex::encode(sigv4::hmac_sha256(&key, sts.as_bytes()));
        let auth = format!(
            "{} Credential=AK/{scope},SignedHeaders={},Signature={signature}",
            sigv4::ALGORITHM,
            names.join(";")
        );
        let mut headers: Vec<(&str, &str)> = names.iter().copied().zip(values).collect();
        headers.push(("authorization", &auth));
        let v = authenticate(Some(&creds()), false, &parts("GET", "/b/k", &headers)).unwrap();
        assert!(v.signed);
        // A Date other than the signed one does not verify.
        let other = httpdate::fmt_http_date(at + Duration::from_secs(1));
        headers[0].1 = &other;
        let e = authenticate(Some(&creds()), false, &parts("GET", "/b/k", &headers)).unwrap_err();
        assert_eq!(e.code, S3Code::SignatureDoesNotMatch);
    }

    /// Dates as s3-tests' `*_bad_date_*_aws2` send them: far off in time is
    /// `RequestTimeTooSkewed` whatever the weekday, key and signature say; no date, or
    /// none S3 reads (before 1970 among them), is `AccessDenied`.
    #[test]
    fn a_date_far_off_is_skewed_before_anything_else_is_checked() {
        let v2 = |date: &str, key: &str| {
            let auth = format!("AWS {key}:c2lnbmF0dXJl");
            let headers = [("date", date), ("authorization", auth.as_str())];
            authenticate(Some(&creds()), false, &parts("PUT", "/b/k", &headers))
                .unwrap_err()
                .code
        };
        for date in [
            "Tue, 07 Jul 2010 21:53:04 GMT",
            "Tue, 07 Jul 9999 21:53:04 GMT",
            "Wed, 7 jul 2010 21:53:04 GMT",
            "20100707T215304Z",
        ] {
            assert_eq!(v2(date, "AK"), S3Code::RequestTimeTooSkewed, "{date}");
            assert_eq!(v2(date, "wrong"), S3Code::RequestTimeTooSkewed, "{date}");
        }
        for date in [
            "Tue, 07 Jul 1950 21:53:04 GMT",
            "Bad Date",
            "",
            "07/07/2010",
        ] {
            assert_eq!(v2(date, "AK"), S3Code::AccessDenied, "{date:?}");
        }
        // Today with the wrong weekday is read: the signature is what fails.
        let now = httpdate::fmt_http_date(SystemTime::now());
        let (weekday, rest) = now.split_once(',').unwrap();
        let other = if weekday == "Mon" { "Tue" } else { "Mon" };
        assert_eq!(
            v2(&format!("{other},{rest}"), "AK"),
            S3Code::SignatureDoesNotMatch
        );
        // SigV4 dated by its `Date` header, and by x-amz-date.
        for (name, date) in [
            ("date", "Tue, 07 Jul 2010 21:53:04 GMT"),
            ("x-amz-date", "20100707T215304Z"),
        ] {
            let auth = format!(
                "{} Credential=wrong/20100707/us-east-1/s3/aws4_request,SignedHeaders=host,Signature=00",
                sigv4::ALGORITHM
            );
            let headers = [
                (name, date),
                ("host", "h:1"),
                ("authorization", auth.as_str()),
            ];
            let e = authenticate(Some(&creds()), false, &parts("GET", "/b/k", &headers));
            assert_eq!(e.unwrap_err().code, S3Code::RequestTimeTooSkewed, "{name}");
        }
    }

    #[test]
    fn presigned_queries_verify() {
        let signer = Signer::new("AK", "SK", "us-east-1");
        let q = signer.presign("GET", "/b/k%20x", "h:1", 60, SystemTime::now());
        let target = format!("/b/k%20x?{q}");
        let v = authenticate(
            Some(&creds()),
            false,
            &parts("GET", &target, &[("host", "h:1")]),
        )
        .unwrap();
        assert!(v.signed);
        let e = authenticate(
            Some(&creds()),
            false,
            &parts("GET", &target, &[("host", "h:2")]),
        )
        .unwrap_err();
        assert_eq!(e.code, S3Code::SignatureDoesNotMatch);
    }

    #[test]
    fn a_peer_signature_counts_once_the_node_has_checked_it() {
        let mut p = parts(
            "POST",
            "/_granary/invalidate",
            &[(headers::PEER_AUTH, "n1 1 n 00")],
        );
        assert_eq!(
            authenticate(Some(&creds()), false, &p).unwrap_err().code,
            S3Code::AccessDenied,
            "not checked: refused"
        );
        p.extensions.insert(peer::Verified("n1".into()));
        let v = authenticate(Some(&creds()), false, &p).unwrap();
        assert_eq!(v.peer.as_deref(), Some("n1"));
    }
}
