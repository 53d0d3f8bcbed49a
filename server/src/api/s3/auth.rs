//! Request authentication: AWS Signature Version 4 in the `Authorization` header and in
//! presigned query strings, and Signature Version 2 presigned query strings (what boto3's
//! presigner makes by default). The verdict also says how the body is signed, which the
//! body decoder (`body.rs`) then enforces chunk by chunk.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use hmac::{Hmac, Mac};
use http::request::Parts;
use http::{HeaderMap, Method};
use percent_encoding::{percent_decode_str, AsciiSet, NON_ALPHANUMERIC};
use sha2::{Digest, Sha256};

use crate::error::{S3Code, S3Error};

type HmacSha256 = Hmac<Sha256>;

/// How far a signed request's date may be from ours.
const MAX_SKEW: Duration = Duration::from_secs(15 * 60);
/// The longest validity a presigned V4 URL may claim (S3's limit: 7 days).
const MAX_PRESIGN_EXPIRES: u64 = 7 * 24 * 3600;
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// The configured credentials.
#[derive(Clone)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
}

impl Credentials {
    /// The credentials a config sets (`--access-key` with `--secret-key`), if any.
    pub fn from_config(config: &crate::config::Config) -> Option<Credentials> {
        match (&config.access_key, &config.secret_key) {
            (Some(a), Some(s)) => Some(Credentials {
                access_key: a.clone(),
                secret_key: s.clone(),
            }),
            _ => None,
        }
    }
}

/// How the request body is to be checked.
#[derive(Debug, Clone)]
pub enum Payload {
    /// Not signed (no credentials configured, `UNSIGNED-PAYLOAD`, or a presigned URL).
    Unsigned,
    /// The hex SHA-256 the signature covers; the body must hash to it.
    Sha256([u8; 32]),
    /// `aws-chunked` with a signature per chunk (and, with `trailer`, over the trailer).
    StreamingSigned { ctx: ChunkSigner, trailer: bool },
    /// `aws-chunked` without signatures, trailer checksum only.
    StreamingUnsigned,
}

/// What chunk signatures chain from.
#[derive(Debug, Clone)]
pub struct ChunkSigner {
    pub key: [u8; 32],
    pub amz_date: String,
    pub scope: String,
    pub seed_signature: String,
}

impl ChunkSigner {
    /// The expected signature of a chunk whose data hashes to `data_sha256` (hex),
    /// following `prev`.
    pub fn chunk_signature(&self, prev: &str, data_sha256: &str) -> String {
        let sts = format!(
            "AWS4-HMAC-SHA256-PAYLOAD\n{}\n{}\n{}\n{}\n{}",
            self.amz_date, self.scope, prev, EMPTY_SHA256, data_sha256
        );
        hex::encode(hmac(&self.key, sts.as_bytes()))
    }

    /// The expected signature of the trailer whose canonical bytes hash to `sha256`.
    pub fn trailer_signature(&self, prev: &str, trailer_sha256: &str) -> String {
        let sts = format!(
            "AWS4-HMAC-SHA256-TRAILER\n{}\n{}\n{}\n{}",
            self.amz_date, self.scope, prev, trailer_sha256
        );
        hex::encode(hmac(&self.key, sts.as_bytes()))
    }
}

/// The outcome of authentication.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Whether the request carried a valid signature (false: anonymous).
    pub signed: bool,
    pub payload: Payload,
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(data);
    m.finalize().into_bytes().into()
}

fn ct_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn err(code: S3Code, msg: &str) -> S3Error {
    S3Error::new(code, msg)
}

/// Authenticates a request. With no credentials configured every request passes and only
/// the body framing (`aws-chunked`) is taken from the headers. `anonymous_read` lets
/// unsigned GET/HEAD requests through.
pub fn authenticate(
    creds: Option<&Credentials>,
    anonymous_read: bool,
    parts: &Parts,
) -> Result<Verdict, S3Error> {
    let content_sha = header(&parts.headers, "x-amz-content-sha256");
    let Some(creds) = creds else {
        let payload = match content_sha {
            Some(s) if s.starts_with("STREAMING-") => Payload::StreamingUnsigned,
            _ => Payload::Unsigned,
        };
        return Ok(Verdict {
            signed: false,
            payload,
        });
    };
    let query = parts.uri.query().unwrap_or("");
    if let Some(v) = header(&parts.headers, PEER_AUTH) {
        check_peer_auth(creds, parts, v)?;
        return Ok(Verdict {
            signed: true,
            payload: Payload::Unsigned,
        });
    }
    if let Some(auth) = header(&parts.headers, "authorization") {
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
        return Ok(Verdict {
            signed: false,
            payload: Payload::Unsigned,
        });
    }
    Err(err(
        S3Code::AccessDenied,
        "Access Denied: the request is not signed",
    ))
}

/// The header on requests one node makes of another (peer fills, invalidations):
/// `NODE SECS HEX`, HEX being HMAC-SHA256 under the secret key of the node, the time,
/// the method and the path with its query. Proxied client requests keep their own
/// signatures instead; only requests a node makes itself carry this.
pub const PEER_AUTH: &str = "x-granary-peer-auth";

fn peer_mac(creds: &Credentials, node: &str, secs: u64, method: &str, target: &str) -> String {
    let msg = format!("granary-peer\n{node}\n{secs}\n{method}\n{target}");
    hex::encode(hmac(creds.secret_key.as_bytes(), msg.as_bytes()))
}

/// The `x-granary-peer-auth` value for a request this node makes.
pub fn peer_auth_value(creds: &Credentials, node: &str, method: &Method, target: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mac = peer_mac(creds, node, secs, method.as_str(), target);
    format!("{node} {secs} {mac}")
}

/// Checks an `x-granary-peer-auth` value against this request.
pub fn check_peer_auth(creds: &Credentials, parts: &Parts, value: &str) -> Result<(), S3Error> {
    let bad = || err(S3Code::AccessDenied, "Access Denied: bad peer signature");
    let mut it = value.split(' ');
    let (Some(node), Some(secs), Some(mac), None) = (it.next(), it.next(), it.next(), it.next())
    else {
        return Err(bad());
    };
    let secs: u64 = secs.parse().map_err(|_| bad())?;
    check_skew(UNIX_EPOCH + Duration::from_secs(secs))?;
    let target = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str());
    let want = peer_mac(creds, node, secs, parts.method.as_str(), target);
    if ct_eq(&want, mac) {
        Ok(())
    } else {
        Err(bad())
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Whether the raw query has a parameter `name`.
pub fn query_has(query: &str, name: &str) -> bool {
    query
        .split('&')
        .any(|kv| kv.split('=').next() == Some(name))
}

/// Decoded query pairs, in order.
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// Everything but the unreserved characters `A-Za-z0-9-._~`.
const AWS_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');
/// The same, keeping `/` (for paths).
const AWS_ENCODE_PATH: &AsciiSet = &AWS_ENCODE.remove(b'/');

fn canonical_uri(raw_path: &str) -> String {
    let decoded = percent_decode_str(raw_path).collect::<Vec<u8>>();
    percent_encoding::percent_encode(&decoded, AWS_ENCODE_PATH).to_string()
}

fn canonical_query(query: &str, skip_signature: bool) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
        .filter(|(k, _)| !(skip_signature && *k == "X-Amz-Signature"))
        .map(|(k, v)| {
            let k: Vec<u8> = percent_decode_str(k).collect();
            let v: Vec<u8> = percent_decode_str(v).collect();
            (
                percent_encoding::percent_encode(&k, AWS_ENCODE).to_string(),
                percent_encoding::percent_encode(&v, AWS_ENCODE).to_string(),
            )
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

fn canonical_headers(h: &HeaderMap, signed: &[&str]) -> String {
    let mut out = String::new();
    for name in signed {
        out.push_str(name);
        out.push(':');
        let values: Vec<String> = h
            .get_all(*name)
            .iter()
            .map(|v| {
                String::from_utf8_lossy(v.as_bytes())
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        out.push_str(&values.join(","));
        out.push('\n');
    }
    out
}

/// Parses `20130524T000000Z`.
fn parse_amz_date(s: &str) -> Option<SystemTime> {
    let fmt = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let dt = time::PrimitiveDateTime::parse(s, &fmt).ok()?;
    let secs = dt.assume_utc().unix_timestamp();
    (secs >= 0).then(|| UNIX_EPOCH + Duration::from_secs(secs as u64))
}

fn check_skew(at: SystemTime) -> Result<(), S3Error> {
    let now = SystemTime::now();
    let skew = now
        .duration_since(at)
        .or_else(|_| at.duration_since(now))
        .unwrap_or_default();
    if skew > MAX_SKEW {
        return Err(err(
            S3Code::RequestTimeTooSkewed,
            "The difference between the request time and the server's time is too large.",
        ));
    }
    Ok(())
}

/// `AK/20130524/us-east-1/s3/aws4_request` split into the key and the scope parts.
struct Scope<'a> {
    access_key: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
}

impl<'a> Scope<'a> {
    fn parse(credential: &'a str, code: S3Code) -> Result<Scope<'a>, S3Error> {
        // The access key itself may not contain '/', so split from the right.
        let mut it = credential.rsplitn(5, '/');
        let term = it.next();
        let service = it.next();
        let region = it.next();
        let date = it.next();
        let access_key = it.next();
        match (access_key, date, region, service, term) {
            (Some(ak), Some(d), Some(r), Some(s), Some("aws4_request")) if d.len() == 8 => {
                Ok(Scope {
                    access_key: ak,
                    date: d,
                    region: r,
                    service: s,
                })
            }
            _ => Err(err(code, "the Credential is malformed")),
        }
    }

    fn text(&self) -> String {
        format!(
            "{}/{}/{}/aws4_request",
            self.date, self.region, self.service
        )
    }

    fn signing_key(&self, secret: &str) -> [u8; 32] {
        let k = hmac(format!("AWS4{secret}").as_bytes(), self.date.as_bytes());
        let k = hmac(&k, self.region.as_bytes());
        let k = hmac(&k, self.service.as_bytes());
        hmac(&k, b"aws4_request")
    }
}

fn check_access_key(creds: &Credentials, ak: &str) -> Result<(), S3Error> {
    if ak != creds.access_key {
        return Err(err(
            S3Code::InvalidAccessKeyId,
            "The AWS Access Key Id you provided does not exist in our records.",
        ));
    }
    Ok(())
}

fn string_to_sign(amz_date: &str, scope: &str, canonical_request: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    )
}

fn mismatch() -> S3Error {
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
    ) -> Result<[u8; 32], S3Error> {
        let signed: Vec<&str> = self.signed_headers.split(';').collect();
        let canonical_request = format!(
            "{}\n{}\n{}\n{}\n{}\n{}",
            parts.method.as_str(),
            canonical_uri(parts.uri.path()),
            canonical_query(parts.uri.query().unwrap_or(""), self.presigned),
            canonical_headers(&parts.headers, &signed),
            self.signed_headers,
            self.content_sha
        );
        let key = self.scope.signing_key(&creds.secret_key);
        let sts = string_to_sign(self.amz_date, &self.scope.text(), &canonical_request);
        let expected = hex::encode(hmac(&key, sts.as_bytes()));
        if !ct_eq(&expected, signature) {
            tracing::debug!(%canonical_request, "signature mismatch");
            return Err(mismatch());
        }
        Ok(key)
    }
}

fn header_v4(creds: &Credentials, parts: &Parts, auth: &str) -> Result<Verdict, S3Error> {
    let malformed = || {
        err(
            S3Code::AuthorizationHeaderMalformed,
            "the Authorization header is malformed",
        )
    };
    let rest = auth.strip_prefix("AWS4-HMAC-SHA256 ").ok_or_else(|| {
        if auth.starts_with("AWS ") {
            err(
                S3Code::AccessDenied,
                "Signature Version 2 headers are not accepted; use SigV4",
            )
        } else {
            malformed()
        }
    })?;
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
    let scope = Scope::parse(credential, S3Code::AuthorizationHeaderMalformed)?;
    check_access_key(creds, scope.access_key)?;
    let amz_date = header(&parts.headers, "x-amz-date")
        .ok_or_else(|| err(S3Code::AccessDenied, "the request has no x-amz-date header"))?;
    let at = parse_amz_date(amz_date).ok_or_else(malformed)?;
    if !amz_date.starts_with(scope.date) {
        return Err(malformed());
    }
    check_skew(at)?;
    let content_sha = header(&parts.headers, "x-amz-content-sha256").unwrap_or("UNSIGNED-PAYLOAD");
    let signed: Vec<&str> = signed_headers.split(';').collect();
    if !signed.contains(&"host") {
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
        "UNSIGNED-PAYLOAD" => Payload::Unsigned,
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" | "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER" => {
            Payload::StreamingSigned {
                ctx: ChunkSigner {
                    key,
                    amz_date: amz_date.to_owned(),
                    scope: scope.text(),
                    seed_signature: signature.to_owned(),
                },
                trailer: content_sha.ends_with("-TRAILER"),
            }
        }
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER" => Payload::StreamingUnsigned,
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
    Ok(Verdict {
        signed: true,
        payload,
    })
}

fn presigned_v4(creds: &Credentials, parts: &Parts) -> Result<Verdict, S3Error> {
    let q = query_pairs(parts.uri.query().unwrap_or(""));
    let get = |name: &str| q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let bad = |m: &str| err(S3Code::AuthorizationQueryParametersError, m);
    if get("X-Amz-Algorithm") != Some("AWS4-HMAC-SHA256") {
        return Err(bad("X-Amz-Algorithm must be AWS4-HMAC-SHA256"));
    }
    let credential = get("X-Amz-Credential").ok_or_else(|| bad("X-Amz-Credential is missing"))?;
    let amz_date = get("X-Amz-Date").ok_or_else(|| bad("X-Amz-Date is missing"))?;
    let expires: u64 = get("X-Amz-Expires")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad("X-Amz-Expires must be a number of seconds"))?;
    let signed_headers =
        get("X-Amz-SignedHeaders").ok_or_else(|| bad("X-Amz-SignedHeaders is missing"))?;
    let signature = get("X-Amz-Signature").ok_or_else(|| bad("X-Amz-Signature is missing"))?;
    if expires > MAX_PRESIGN_EXPIRES {
        return Err(bad("X-Amz-Expires must be less than a week (in seconds)"));
    }
    let scope = Scope::parse(credential, S3Code::AuthorizationQueryParametersError)?;
    check_access_key(creds, scope.access_key)?;
    let at = parse_amz_date(amz_date).ok_or_else(|| bad("X-Amz-Date is malformed"))?;
    let now = SystemTime::now();
    if now > at + Duration::from_secs(expires) {
        return Err(err(S3Code::AccessDenied, "Request has expired"));
    }
    if at > now + MAX_SKEW {
        return Err(err(S3Code::AccessDenied, "Request is not valid yet"));
    }
    let content_sha = get("X-Amz-Content-Sha256").unwrap_or("UNSIGNED-PAYLOAD");
    let check = V4Check {
        scope: &scope,
        amz_date,
        signed_headers,
        content_sha,
        presigned: true,
    };
    check.verify(creds, parts, signature)?;
    Ok(Verdict {
        signed: true,
        payload: Payload::Unsigned,
    })
}

/// Sub-resources that take part in a V2 canonical resource.
const V2_SUBRESOURCES: &[&str] = &[
    "acl",
    "cors",
    "delete",
    "lifecycle",
    "location",
    "logging",
    "notification",
    "partNumber",
    "policy",
    "requestPayment",
    "response-cache-control",
    "response-content-disposition",
    "response-content-encoding",
    "response-content-language",
    "response-content-type",
    "response-expires",
    "restore",
    "tagging",
    "torrent",
    "uploadId",
    "uploads",
    "versionId",
    "versioning",
    "versions",
    "website",
];

fn presigned_v2(creds: &Credentials, parts: &Parts) -> Result<Verdict, S3Error> {
    let q = query_pairs(parts.uri.query().unwrap_or(""));
    let get = |name: &str| q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let access_key = get("AWSAccessKeyId").unwrap_or("");
    check_access_key(creds, access_key)?;
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
    let signature = get("Signature").unwrap_or("");
    let mut amz: Vec<(String, String)> = parts
        .headers
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-amz-"))
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).trim().to_owned(),
            )
        })
        .collect();
    amz.sort();
    let mut resource = parts.uri.path().to_owned();
    let mut subs: Vec<&(String, String)> = q
        .iter()
        .filter(|(k, _)| V2_SUBRESOURCES.contains(&k.as_str()))
        .collect();
    subs.sort_by(|a, b| a.0.cmp(&b.0));
    for (i, (k, v)) in subs.iter().enumerate() {
        resource.push(if i == 0 { '?' } else { '&' });
        resource.push_str(k);
        if !v.is_empty() {
            resource.push('=');
            resource.push_str(v);
        }
    }
    let mut sts = format!(
        "{}\n{}\n{}\n{}\n",
        parts.method.as_str(),
        header(&parts.headers, "content-md5").unwrap_or(""),
        header(&parts.headers, "content-type").unwrap_or(""),
        expires_text
    );
    for (k, v) in &amz {
        sts.push_str(&format!("{k}:{v}\n"));
    }
    sts.push_str(&resource);
    let mut m = Hmac::<sha1::Sha1>::new_from_slice(creds.secret_key.as_bytes())
        .expect("HMAC takes any key length");
    m.update(sts.as_bytes());
    let expected = base64::engine::general_purpose::STANDARD.encode(m.finalize().into_bytes());
    if !ct_eq(&expected, signature) {
        return Err(mismatch());
    }
    Ok(Verdict {
        signed: true,
        payload: Payload::Unsigned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> Credentials {
        Credentials {
            access_key: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
        }
    }

    /// The "GET Object" example of the AWS SigV4 documentation for S3.
    #[test]
    fn aws_documented_get_object_signature() {
        let scope = Scope::parse(
            "AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request",
            S3Code::AuthorizationHeaderMalformed,
        )
        .unwrap();
        let mut h = HeaderMap::new();
        h.insert("host", "examplebucket.s3.amazonaws.com".parse().unwrap());
        h.insert("range", "bytes=0-9".parse().unwrap());
        h.insert("x-amz-content-sha256", EMPTY_SHA256.parse().unwrap());
        h.insert("x-amz-date", "20130524T000000Z".parse().unwrap());
        let signed = ["host", "range", "x-amz-content-sha256", "x-amz-date"];
        let cr = format!(
            "GET\n{}\n{}\n{}\n{}\n{}",
            canonical_uri("/test.txt"),
            canonical_query("", false),
            canonical_headers(&h, &signed),
            signed.join(";"),
            EMPTY_SHA256
        );
        let sts = string_to_sign("20130524T000000Z", &scope.text(), &cr);
        let sig = hex::encode(hmac(
            &scope.signing_key(&creds().secret_key),
            sts.as_bytes(),
        ));
        assert_eq!(
            sig,
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    /// The chunked-upload example of the AWS documentation ("Signature Calculations for
    /// the Authorization Header: Transferring Payload in Multiple Chunks").
    #[test]
    fn aws_documented_chunk_signatures() {
        let scope = Scope::parse(
            "AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request",
            S3Code::AuthorizationHeaderMalformed,
        )
        .unwrap();
        let signer = ChunkSigner {
            key: scope.signing_key(&creds().secret_key),
            amz_date: "20130524T000000Z".into(),
            scope: scope.text(),
            seed_signature: "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
                .into(),
        };
        let chunk1 = vec![b'a'; 65536];
        let s1 = signer.chunk_signature(
            &signer.seed_signature,
            &hex::encode(Sha256::digest(&chunk1)),
        );
        assert_eq!(
            s1,
            "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"
        );
        let chunk2 = vec![b'a'; 1024];
        let s2 = signer.chunk_signature(&s1, &hex::encode(Sha256::digest(&chunk2)));
        assert_eq!(
            s2,
            "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497"
        );
        let s3 = signer.chunk_signature(&s2, EMPTY_SHA256);
        assert_eq!(
            s3,
            "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"
        );
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(canonical_uri("/b/a%20b/%E2%98%83"), "/b/a%20b/%E2%98%83");
        assert_eq!(canonical_uri("/b/a+b!"), "/b/a%2Bb%21");
        assert_eq!(
            canonical_query("prefix=a%2Fb&list-type=2&x", false),
            "list-type=2&prefix=a%2Fb&x="
        );
        assert_eq!(canonical_query("X-Amz-Signature=abc&a=1", true), "a=1");
    }

    #[test]
    fn credential_scopes() {
        assert!(Scope::parse(
            "AK/20130524/us-east-1/s3/aws4_request",
            S3Code::AccessDenied
        )
        .is_ok());
        assert!(Scope::parse("AK/2013/us-east-1/s3/aws4_request", S3Code::AccessDenied).is_err());
        assert!(Scope::parse("garbage", S3Code::AccessDenied).is_err());
    }
}
