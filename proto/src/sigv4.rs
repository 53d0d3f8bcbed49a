//! AWS Signature Version 4, both sides: the primitives (HMAC, the signing key, the
//! canonical request, the string to sign), a [`Signer`] for requests this workspace sends
//! (the client, the bench, the tests, peers), and the [`ChunkSigner`] that signs and checks
//! `aws-chunked` chunk and trailer signatures. The node's verifier (`auth`) rebuilds a
//! request's canonical form with the same functions, so what is signed here is what is
//! checked there.
//!
//! Why not `aws-sigv4` for the signing side: a verifier has to rebuild the canonical
//! request from what the client says it signed (its `SignedHeaders`, its raw path and
//! query), which `aws-sigv4` does not offer (its canonical request is private and it picks
//! the headers it signs), so the canonicalisation must exist here anyway; signing with it
//! too keeps one definition. The unit tests check this signer against `aws-sigv4`
//! signature for signature.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use percent_encoding::percent_decode_str;
use sha2::{Digest, Sha256};

use crate::encode::{self, AWS_ENCODE, AWS_ENCODE_PATH};

/// The algorithm name SigV4 requests carry.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// Hex SHA-256 of no bytes.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
/// The payload hash of a body that is not hashed.
pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";
/// `aws-chunked` with a signature per chunk.
pub const STREAMING_SIGNED: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
/// `aws-chunked` with a signature per chunk and a signed trailer.
pub const STREAMING_SIGNED_TRAILER: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";
/// `aws-chunked` without signatures, a trailer checksum only.
pub const STREAMING_UNSIGNED_TRAILER: &str = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";

/// HMAC-SHA256 of `data` under `key`.
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(data);
    m.finalize().into_bytes().into()
}

/// Hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Compares two strings in time that does not depend on where they differ.
pub fn ct_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// `YYYYMMDDTHHMMSSZ` (`x-amz-date`) of a time.
pub fn amz_date(at: SystemTime) -> String {
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    time::OffsetDateTime::from(at)
        .format(format)
        .expect("every SystemTime before the year 10000 formats")
}

/// [`amz_date`] of a Unix time in seconds.
pub fn amz_date_unix(secs: u64) -> String {
    amz_date(UNIX_EPOCH + Duration::from_secs(secs))
}

/// Parses `20130524T000000Z`.
pub fn parse_amz_date(s: &str) -> Option<SystemTime> {
    let fmt = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let dt = time::PrimitiveDateTime::parse(s, &fmt).ok()?;
    let secs = dt.assume_utc().unix_timestamp();
    (secs >= 0).then(|| UNIX_EPOCH + Duration::from_secs(secs as u64))
}

/// A request's date as S3 reads it, in any of the forms signers send: an HTTP date
/// (IMF-fixdate, RFC 850, asctime), or `x-amz-date`'s basic ISO 8601. Like S3 and RGW, it
/// does not check the weekday (`Tue, 07 Jul 2010` is a Wednesday) and takes any year from
/// 1970 through 9999, so that a date far off answers `RequestTimeTooSkewed`, not a
/// refusal to read it. Before 1970: `None`.
pub fn parse_request_date(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    if let Some(t) = httpdate::parse_http_date(s)
        .ok()
        .or_else(|| parse_amz_date(s))
    {
        return Some(t);
    }
    // IMF-fixdate with the weekday dropped, whatever it said.
    let rest = s.split_once(',').map_or(s, |(_, r)| r).trim();
    let rest = rest
        .strip_suffix("GMT")
        .or_else(|| rest.strip_suffix("UTC"))
        .or_else(|| rest.strip_suffix('Z'))
        .unwrap_or(rest)
        .trim_end();
    let fmt = time::macros::format_description!(
        "[day padding:none] [month repr:short case_sensitive:false] [year] [hour]:[minute]:[second]"
    );
    let dt = time::PrimitiveDateTime::parse(rest, &fmt).ok()?;
    let secs = dt.assume_utc().unix_timestamp();
    (secs >= 0).then(|| UNIX_EPOCH + Duration::from_secs(secs as u64))
}

/// The key a day's signatures are made with: `AWS4{secret}` through the day, region,
/// service and `aws4_request`.
pub fn signing_key(secret: &str, day: &str, region: &str, service: &str) -> [u8; 32] {
    let k = hmac_sha256(format!("AWS4{secret}").as_bytes(), day.as_bytes());
    let k = hmac_sha256(&k, region.as_bytes());
    let k = hmac_sha256(&k, service.as_bytes());
    hmac_sha256(&k, b"aws4_request")
}

/// The canonical URI of a raw (as sent) path: decoded, then encoded the SigV4 way.
pub fn canonical_uri(raw_path: &str) -> String {
    if raw_path.is_empty() {
        return "/".to_owned();
    }
    let decoded = percent_decode_str(raw_path).collect::<Vec<u8>>();
    percent_encoding::percent_encode(&decoded, AWS_ENCODE_PATH).to_string()
}

/// The canonical query of a raw query string: every pair decoded and encoded again,
/// sorted; a presigned request's own `X-Amz-Signature` left out when `skip_signature`.
pub fn canonical_query(raw_query: &str, skip_signature: bool) -> String {
    let mut pairs: Vec<(String, String)> = raw_query
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
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out
}

/// A header value as SigV4 canonicalises it: trimmed, inner runs of spaces folded.
fn fold_spaces(v: &[u8]) -> String {
    String::from_utf8_lossy(v)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The canonical headers: `name:value\n` for each signed name (lower case, in the order
/// given), a repeated header's values joined with `,`. `values(name)` gives a header's
/// values as received.
pub fn canonical_headers<'a, I>(signed: &[&str], values: impl Fn(&str) -> I) -> String
where
    I: IntoIterator<Item = &'a [u8]>,
{
    let mut out = String::new();
    for name in signed {
        out.push_str(name);
        out.push(':');
        let folded: Vec<String> = values(name).into_iter().map(fold_spaces).collect();
        out.push_str(&folded.join(","));
        out.push('\n');
    }
    out
}

/// The canonical request.
pub fn canonical_request(
    method: &str,
    canonical_uri: &str,
    canonical_query: &str,
    canonical_headers: &str,
    signed_headers: &str,
    payload_hash: &str,
) -> String {
    format!("{method}\n{canonical_uri}\n{canonical_query}\n{canonical_headers}\n{signed_headers}\n{payload_hash}")
}

/// The string to sign of a canonical request.
pub fn string_to_sign(amz_date: &str, scope: &str, canonical_request: &str) -> String {
    format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical_request.as_bytes())
    )
}

/// A credential scope: `AK/20130524/us-east-1/s3/aws4_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope<'a> {
    pub access_key: &'a str,
    pub date: &'a str,
    pub region: &'a str,
    pub service: &'a str,
}

impl<'a> Scope<'a> {
    /// Splits a `Credential` value; `None` when it is malformed.
    pub fn parse(credential: &'a str) -> Option<Scope<'a>> {
        // The access key itself may not contain '/', so split from the right.
        let mut it = credential.rsplitn(5, '/');
        let term = it.next();
        let service = it.next();
        let region = it.next();
        let date = it.next();
        let access_key = it.next();
        match (access_key, date, region, service, term) {
            (Some(ak), Some(d), Some(r), Some(s), Some("aws4_request")) if d.len() == 8 => {
                Some(Scope {
                    access_key: ak,
                    date: d,
                    region: r,
                    service: s,
                })
            }
            _ => None,
        }
    }

    /// `20130524/us-east-1/s3/aws4_request`.
    pub fn text(&self) -> String {
        format!(
            "{}/{}/{}/aws4_request",
            self.date, self.region, self.service
        )
    }

    pub fn signing_key(&self, secret: &str) -> [u8; 32] {
        signing_key(secret, self.date, self.region, self.service)
    }
}

/// What chunk and trailer signatures chain from: the request's signing key, time and
/// scope, and its own signature (the seed).
#[derive(Debug, Clone)]
pub struct ChunkSigner {
    pub key: [u8; 32],
    pub amz_date: String,
    pub scope: String,
    pub seed_signature: String,
}

impl ChunkSigner {
    /// The signature of a chunk whose data hashes to `data_sha256` (hex), following the
    /// signature `prev`.
    pub fn chunk_signature(&self, prev: &str, data_sha256: &str) -> String {
        let sts = format!(
            "AWS4-HMAC-SHA256-PAYLOAD\n{}\n{}\n{prev}\n{EMPTY_SHA256}\n{data_sha256}",
            self.amz_date, self.scope
        );
        hex::encode(hmac_sha256(&self.key, sts.as_bytes()))
    }

    /// The signature of the trailer whose canonical bytes hash to `trailer_sha256`.
    pub fn trailer_signature(&self, prev: &str, trailer_sha256: &str) -> String {
        let sts = format!(
            "AWS4-HMAC-SHA256-TRAILER\n{}\n{}\n{prev}\n{trailer_sha256}",
            self.amz_date, self.scope
        );
        hex::encode(hmac_sha256(&self.key, sts.as_bytes()))
    }

    /// A `STREAMING-AWS4-HMAC-SHA256-PAYLOAD` body of `chunks`, each signed in the chain
    /// that starts at the seed, ending with the signed empty chunk.
    pub fn frame(&self, chunks: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut prev = self.seed_signature.clone();
        for chunk in chunks.iter().copied().chain(std::iter::once(&b""[..])) {
            let sig = self.chunk_signature(&prev, &sha256_hex(chunk));
            out.extend_from_slice(
                format!("{:x};chunk-signature={sig}\r\n", chunk.len()).as_bytes(),
            );
            out.extend_from_slice(chunk);
            out.extend_from_slice(b"\r\n");
            prev = sig;
        }
        out
    }
}

/// The length of [`ChunkSigner::frame`] of chunks of these sizes.
pub fn framed_len(sizes: &[usize]) -> usize {
    sizes
        .iter()
        .copied()
        .chain(std::iter::once(0))
        .map(|n| format!("{n:x}").len() + ";chunk-signature=".len() + 64 + 2 + n + 2)
        .sum()
}

/// A request to sign: its path and query as they are sent (already encoded), the headers
/// to sign besides the two the signer adds (`host` among them), and the payload hash.
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub payload_hash: &'a str,
}

/// A signed request: the headers to add (`x-amz-date`, `x-amz-content-sha256`,
/// `authorization`), and what chunk signatures chain from.
#[derive(Debug, Clone)]
pub struct Signed {
    pub headers: [(&'static str, String); 3],
    pub chunks: ChunkSigner,
}

impl Signed {
    /// The request's signature: the seed of its chunk-signature chain.
    pub fn signature(&self) -> &str {
        &self.chunks.seed_signature
    }
}

/// Signs requests for the `s3` service with one access key, deriving the signing key
/// once per UTC day.
pub struct Signer {
    access_key: String,
    secret_key: String,
    region: String,
    /// `(YYYYMMDD, signing key)` of the last day used.
    key: Mutex<Option<(String, [u8; 32])>>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("access_key", &self.access_key)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl Clone for Signer {
    fn clone(&self) -> Self {
        Signer::new(&self.access_key, &self.secret_key, &self.region)
    }
}

impl Signer {
    pub fn new(access_key: &str, secret_key: &str, region: &str) -> Signer {
        Signer {
            access_key: access_key.to_owned(),
            secret_key: secret_key.to_owned(),
            region: region.to_owned(),
            key: Mutex::new(None),
        }
    }

    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    fn key_of(&self, day: &str) -> [u8; 32] {
        let mut cached = self.key.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((d, k)) = cached.as_ref() {
            if d == day {
                return *k;
            }
        }
        let k = signing_key(&self.secret_key, day, &self.region, "s3");
        *cached = Some((day.to_owned(), k));
        k
    }

    /// Signs `req` as made at `at`.
    pub fn sign(&self, req: &Request<'_>, at: SystemTime) -> Signed {
        let date = amz_date(at);
        let day = &date[..8];
        let scope = format!("{day}/{}/s3/aws4_request", self.region);
        let mut headers: Vec<(String, &str)> = req
            .headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), *v))
            .collect();
        headers.push(("x-amz-content-sha256".into(), req.payload_hash));
        headers.push(("x-amz-date".into(), &date));
        headers.sort_by(|a, b| a.0.cmp(&b.0));
        let names: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
        let signed_headers = names.join(";");
        let canonical = canonical_request(
            req.method,
            &canonical_uri(req.path),
            &canonical_query(req.query, false),
            &canonical_headers(&names, |n| {
                headers
                    .iter()
                    .filter(|(k, _)| k == n)
                    .map(|(_, v)| v.as_bytes())
                    .collect::<Vec<_>>()
            }),
            &signed_headers,
            req.payload_hash,
        );
        let key = self.key_of(day);
        let sts = string_to_sign(&date, &scope, &canonical);
        let signature = hex::encode(hmac_sha256(&key, sts.as_bytes()));
        let authorization = format!(
            "{ALGORITHM} Credential={}/{scope},SignedHeaders={signed_headers},Signature={signature}",
            self.access_key
        );
        Signed {
            headers: [
                ("x-amz-date", date.clone()),
                ("x-amz-content-sha256", req.payload_hash.to_owned()),
                ("authorization", authorization),
            ],
            chunks: ChunkSigner {
                key,
                amz_date: date,
                scope,
                seed_signature: signature,
            },
        }
    }

    /// A presigned query (`X-Amz-*` parameters, signature last) for `method path` valid
    /// `expires` seconds from `at`, signing the `host` header only.
    pub fn presign(
        &self,
        method: &str,
        path: &str,
        host: &str,
        expires: u64,
        at: SystemTime,
    ) -> String {
        let date = amz_date(at);
        let day = &date[..8];
        let scope = format!("{day}/{}/s3/aws4_request", self.region);
        let credential = format!("{}/{scope}", self.access_key);
        let query = format!(
            "X-Amz-Algorithm={ALGORITHM}&X-Amz-Credential={}&X-Amz-Date={date}&X-Amz-Expires={expires}&X-Amz-SignedHeaders=host",
            encode::query_value(&credential)
        );
        let canonical = canonical_request(
            method,
            &canonical_uri(path),
            &canonical_query(&query, false),
            &format!("host:{host}\n"),
            "host",
            UNSIGNED_PAYLOAD,
        );
        let sts = string_to_sign(&date, &scope, &canonical);
        let signature = hex::encode(hmac_sha256(&self.key_of(day), sts.as_bytes()));
        format!("{query}&X-Amz-Signature={signature}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AK: &str = "AKIAIOSFODNN7EXAMPLE";
    const SK: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    /// 2013-05-24T00:00:00Z, the time of the AWS documentation's examples.
    fn example_time() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_369_353_600)
    }

    fn authorization(s: &Signed) -> &str {
        &s.headers[2].1
    }

    /// The "GET Object" example of the AWS SigV4 documentation for S3.
    #[test]
    fn get_object_example_of_the_aws_documentation() {
        let s = Signer::new(AK, SK, "us-east-1").sign(
            &Request {
                method: "GET",
                path: "/test.txt",
                query: "",
                headers: &[
                    ("host", "examplebucket.s3.amazonaws.com"),
                    ("range", "bytes=0-9"),
                ],
                payload_hash: EMPTY_SHA256,
            },
            example_time(),
        );
        assert_eq!(
            authorization(&s),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,\
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,\
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
        assert_eq!(s.headers[0], ("x-amz-date", "20130524T000000Z".into()));
    }

    /// The "GET Bucket (List Objects)" example: the canonical query sorts its pairs.
    #[test]
    fn list_objects_example_of_the_aws_documentation() {
        let s = Signer::new(AK, SK, "us-east-1").sign(
            &Request {
                method: "GET",
                path: "/",
                query: "prefix=J&max-keys=2",
                headers: &[("host", "examplebucket.s3.amazonaws.com")],
                payload_hash: EMPTY_SHA256,
            },
            example_time(),
        );
        assert!(authorization(&s).ends_with(
            "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
        ));
    }

    /// The chunked-upload example of the AWS documentation ("Transferring Payload in
    /// Multiple Chunks").
    #[test]
    fn chunk_signatures_of_the_aws_documentation() {
        let scope =
            Scope::parse("AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request").unwrap();
        let signer = ChunkSigner {
            key: scope.signing_key(SK),
            amz_date: "20130524T000000Z".into(),
            scope: scope.text(),
            seed_signature: "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
                .into(),
        };
        let s1 = signer.chunk_signature(&signer.seed_signature, &sha256_hex(&[b'a'; 65536]));
        assert_eq!(
            s1,
            "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"
        );
        let s2 = signer.chunk_signature(&s1, &sha256_hex(&[b'a'; 1024]));
        assert_eq!(
            s2,
            "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497"
        );
        assert_eq!(
            signer.chunk_signature(&s2, EMPTY_SHA256),
            "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"
        );
        let body = signer.frame(&[&[1u8; 70_000][..], &[2u8; 5][..]]);
        assert_eq!(body.len(), framed_len(&[70_000, 5]));
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(canonical_uri("/b/a%20b/%E2%98%83"), "/b/a%20b/%E2%98%83");
        assert_eq!(canonical_uri("/b/a+b!"), "/b/a%2Bb%21");
        assert_eq!(canonical_uri(""), "/");
        assert_eq!(
            canonical_query("prefix=a%2Fb&list-type=2&x", false),
            "list-type=2&prefix=a%2Fb&x="
        );
        assert_eq!(canonical_query("X-Amz-Signature=abc&a=1", true), "a=1");
    }

    #[test]
    fn credential_scopes() {
        assert!(Scope::parse("AK/20130524/us-east-1/s3/aws4_request").is_some());
        assert!(Scope::parse("A/K/20130524/us-east-1/s3/aws4_request")
            .is_some_and(|s| s.access_key == "A/K"));
        assert!(Scope::parse("AK/2013/us-east-1/s3/aws4_request").is_none());
        assert!(Scope::parse("garbage").is_none());
    }

    #[test]
    fn dates() {
        assert_eq!(amz_date_unix(0), "19700101T000000Z");
        assert_eq!(amz_date_unix(1_709_210_096), "20240229T123456Z");
        assert_eq!(parse_amz_date("20130524T000000Z"), Some(example_time()));
        assert_eq!(parse_amz_date("2013-05-24"), None);
    }

    /// The signer agrees with `aws-sigv4`, the AWS SDK's own signer, signature for
    /// signature, on paths and queries that need encoding.
    #[test]
    fn signatures_equal_aws_sigv4() {
        use aws_sigv4::http_request::{
            sign, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
            UriPathNormalizationMode,
        };
        use aws_sigv4::sign::v4::SigningParams;
        let identity = aws_credential_types::Credentials::new(AK, SK, None, None, "test").into();
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        settings.payload_checksum_kind = aws_sigv4::http_request::PayloadChecksumKind::XAmzSha256;
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_123);
        let params = SigningParams::builder()
            .identity(&identity)
            .region("eu-west-3")
            .name("s3")
            .time(at)
            .settings(settings)
            .build()
            .unwrap()
            .into();
        let host = "127.0.0.1:7070";
        for (path, query) in [
            (
                "/bkt/a%20b/%C3%A9%2B1.tar",
                "archpath=x%2Fy.jpg&transform=small",
            ),
            ("/bkt", "list-type=2&prefix=d%2F&max-keys=10"),
            ("/bkt/k", "uploads="),
        ] {
            let uri = format!("http://{host}{path}?{query}");
            let theirs = sign(
                SignableRequest::new(
                    "PUT",
                    &uri,
                    [("host", host)].into_iter(),
                    SignableBody::Precomputed(UNSIGNED_PAYLOAD.into()),
                )
                .unwrap(),
                &params,
            )
            .unwrap()
            .output()
            .headers()
            .find(|(k, _)| *k == "authorization")
            .map(|(_, v)| v.to_owned())
            .unwrap();
            let ours = Signer::new(AK, SK, "eu-west-3").sign(
                &Request {
                    method: "PUT",
                    path,
                    query,
                    headers: &[("host", host)],
                    payload_hash: UNSIGNED_PAYLOAD,
                },
                at,
            );
            let sig = |a: &str| a.rsplit("Signature=").next().unwrap().to_owned();
            assert_eq!(sig(authorization(&ours)), sig(&theirs), "{path}?{query}");
        }
    }
}
