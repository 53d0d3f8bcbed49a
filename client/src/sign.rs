//! AWS Signature Version 4 in the `Authorization` header, for every request a
//! [`Client`](crate::Client) with credentials sends.
//!
//! The path and query given are already encoded the way SigV4 canonicalises them
//! (everything but `A-Za-z0-9-._~` escaped, `/` kept in paths), so what is sent is what
//! is signed. Streamed bodies are signed as `UNSIGNED-PAYLOAD`; small bodies by their hash.

use std::fmt;
use std::time::SystemTime;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The payload hash of a body that is not hashed (streamed uploads).
pub(crate) const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// An access key, its secret, and the region the signatures are scoped to (Granary
/// answers for one region; `us-east-1` unless it was configured otherwise).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The access key id, sent in every signature's scope.
    pub access_key: String,
    /// The secret the signatures are keyed with; never sent.
    pub secret_key: String,
    /// The region of the signing scope.
    pub region: String,
}

impl Credentials {
    /// Credentials from their parts.
    pub fn new(access_key: &str, secret_key: &str, region: &str) -> Credentials {
        Credentials {
            access_key: access_key.to_owned(),
            secret_key: secret_key.to_owned(),
            region: region.to_owned(),
        }
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<hidden>")
            .field("region", &self.region)
            .finish()
    }
}

/// Hex SHA-256 of `data`.
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(data);
    m.finalize().into_bytes().into()
}

/// `YYYYMMDDTHHMMSSZ` for a time.
pub(crate) fn amz_date(at: SystemTime) -> String {
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    time::OffsetDateTime::from(at)
        .format(format)
        .expect("every SystemTime formats")
}

/// What one request signs.
pub(crate) struct Signable<'a> {
    pub method: &'a str,
    /// The encoded path, as sent.
    pub path: &'a str,
    /// Encoded `(name, value)` pairs of the query, as sent.
    pub query: &'a [(String, String)],
    /// Headers to sign besides the two SigV4 adds; names in lower case, `host` among them.
    pub headers: &'a [(String, String)],
    /// Hex SHA-256 of the body, or [`UNSIGNED_PAYLOAD`].
    pub payload_hash: &'a str,
}

/// Signs a request at time `at`; returns the headers to add to it: `x-amz-date`,
/// `x-amz-content-sha256` and `authorization`.
pub(crate) fn sign(
    creds: &Credentials,
    req: &Signable<'_>,
    at: SystemTime,
) -> Vec<(String, String)> {
    let date_time = amz_date(at);
    let day = &date_time[..8];
    let scope = format!("{day}/{}/s3/aws4_request", creds.region);

    let mut headers: Vec<(String, String)> = req
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.to_ascii_lowercase(),
                v.split_whitespace().collect::<Vec<_>>().join(" "),
            )
        })
        .collect();
    headers.push(("x-amz-content-sha256".into(), req.payload_hash.into()));
    headers.push(("x-amz-date".into(), date_time.clone()));
    headers.sort();
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed_headers = headers
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(";");

    let mut query: Vec<&(String, String)> = req.query.iter().collect();
    query.sort();
    let canonical_query = query
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let path = if req.path.is_empty() { "/" } else { req.path };

    let canonical_request = format!(
        "{}\n{path}\n{canonical_query}\n{canonical_headers}\n{signed_headers}\n{}",
        req.method, req.payload_hash
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{date_time}\n{scope}\n{}",
        sha256_hex(canonical_request.as_bytes())
    );
    let mut key = hmac(
        format!("AWS4{}", creds.secret_key).as_bytes(),
        day.as_bytes(),
    );
    for part in [creds.region.as_str(), "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex::encode(hmac(&key, string_to_sign.as_bytes()));
    vec![
        ("x-amz-date".into(), date_time),
        ("x-amz-content-sha256".into(), req.payload_hash.into()),
        (
            "authorization".into(),
            format!(
                "AWS4-HMAC-SHA256 Credential={}/{scope},SignedHeaders={signed_headers},Signature={signature}",
                creds.access_key
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn example_creds() -> Credentials {
        Credentials::new(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "us-east-1",
        )
    }

    /// 2013-05-24T00:00:00Z, the time of the AWS documentation's examples.
    fn example_time() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_369_353_600)
    }

    fn authorization(out: &[(String, String)]) -> &str {
        &out.iter().find(|(k, _)| k == "authorization").unwrap().1
    }

    #[test]
    fn get_object_example_of_the_aws_documentation() {
        let headers = vec![
            (
                "host".to_owned(),
                "examplebucket.s3.amazonaws.com".to_owned(),
            ),
            ("range".to_owned(), "bytes=0-9".to_owned()),
        ];
        let out = sign(
            &example_creds(),
            &Signable {
                method: "GET",
                path: "/test.txt",
                query: &[],
                headers: &headers,
                payload_hash: EMPTY,
            },
            example_time(),
        );
        assert_eq!(
            authorization(&out),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,\
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,\
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
        assert_eq!(out[0], ("x-amz-date".into(), "20130524T000000Z".into()));
    }

    #[test]
    fn list_objects_example_of_the_aws_documentation() {
        let headers = vec![(
            "host".to_owned(),
            "examplebucket.s3.amazonaws.com".to_owned(),
        )];
        // Given out of order: the canonical query sorts them.
        let query = vec![
            ("prefix".to_owned(), "J".to_owned()),
            ("max-keys".to_owned(), "2".to_owned()),
        ];
        let out = sign(
            &example_creds(),
            &Signable {
                method: "GET",
                path: "/",
                query: &query,
                headers: &headers,
                payload_hash: EMPTY,
            },
            example_time(),
        );
        assert!(authorization(&out).ends_with(
            "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
        ));
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let text = format!("{:?}", example_creds());
        assert!(text.contains("AKIAIOSFODNN7EXAMPLE"));
        assert!(!text.contains("wJalrXUtnFEMI"));
    }
}
