//! AWS Signature Version 4 for the bench's requests, so it can load S3 servers that
//! refuse anonymous requests (moto, MinIO, Granary with credentials).
//!
//! Bodies are sent as `UNSIGNED-PAYLOAD`, as the AWS SDKs do over TLS and as S3 accepts
//! over plain HTTP, so signing costs two SHA-256 passes over a few hundred bytes, not a
//! pass over the object. The signing key is derived once per UTC day.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::listing::encode;

/// The payload hash the bench sends.
pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// Credentials and region; signs requests for the `s3` service.
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

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// The canonical query string of decoded `(name, value)` pairs: encoded, sorted.
pub fn canonical_query(params: &[(&str, &str)]) -> String {
    let mut enc: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (encode(k, false), encode(v, false)))
        .collect();
    enc.sort();
    enc.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// `YYYYMMDDTHHMMSSZ` (SigV4's `x-amz-date`) for a Unix time.
pub fn amz_date(unix: u64) -> String {
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    time::OffsetDateTime::from_unix_timestamp(unix as i64)
        .ok()
        .and_then(|t| t.format(format).ok())
        .expect("a Unix time before the year 10000")
}

impl Signer {
    pub fn new(access_key: &str, secret_key: &str, region: &str) -> Self {
        Signer {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            region: region.into(),
            key: Mutex::new(None),
        }
    }

    fn signing_key(&self, day: &str) -> [u8; 32] {
        let mut cached = self.key.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((d, k)) = cached.as_ref() {
            if d == day {
                return *k;
            }
        }
        let k = hmac(
            &hmac(
                &hmac(
                    &hmac(
                        format!("AWS4{}", self.secret_key).as_bytes(),
                        day.as_bytes(),
                    ),
                    self.region.as_bytes(),
                ),
                b"s3",
            ),
            b"aws4_request",
        );
        *cached = Some((day.to_owned(), k));
        k
    }

    /// The headers that sign a request now: `x-amz-date`, `x-amz-content-sha256`,
    /// `authorization`. `path` is already URI-encoded (as sent), `query` canonical.
    pub fn sign(
        &self,
        method: &str,
        host: &str,
        path: &str,
        query: &str,
    ) -> [(&'static str, String); 3] {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.sign_at(method, host, path, query, unix)
    }

    /// [`Signer::sign`] at a given Unix time.
    pub fn sign_at(
        &self,
        method: &str,
        host: &str,
        path: &str,
        query: &str,
        unix: u64,
    ) -> [(&'static str, String); 3] {
        let date = amz_date(unix);
        let day = &date[..8];
        let canonical = format!(
            "{method}\n{path}\n{query}\nhost:{host}\nx-amz-content-sha256:{UNSIGNED_PAYLOAD}\nx-amz-date:{date}\n\nhost;x-amz-content-sha256;x-amz-date\n{UNSIGNED_PAYLOAD}"
        );
        let scope = format!("{day}/{}/s3/aws4_request", self.region);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{date}\n{scope}\n{}",
            hex::encode(Sha256::digest(canonical.as_bytes()))
        );
        let sig = hex::encode(hmac(&self.signing_key(day), to_sign.as_bytes()));
        [
            ("x-amz-date", date),
            ("x-amz-content-sha256", UNSIGNED_PAYLOAD.to_owned()),
            (
                "authorization",
                format!(
                    "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={sig}",
                    self.access_key
                ),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(amz_date(0), "19700101T000000Z");
        // 2013-05-24T00:00:00Z, the date of AWS's S3 signing examples.
        assert_eq!(amz_date(1_369_353_600), "20130524T000000Z");
        assert_eq!(amz_date(1_709_251_199), "20240229T235959Z");
    }

    #[test]
    fn canonical_queries() {
        assert_eq!(
            canonical_query(&[("prefix", "x y"), ("list-type", "2"), ("max-keys", "")]),
            "list-type=2&max-keys=&prefix=x%20y"
        );
    }

    /// AWS's documented S3 "GET Object" example: its string to sign (whose canonical
    /// request signs a Range header this signer never sends) signed with the key this
    /// signer derives gives the documented signature.
    #[test]
    fn signing_key_matches_the_aws_example() {
        let s = Signer::new(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "us-east-1",
        );
        // From the SigV4 documentation (service "s3", 20130524).
        let k = s.signing_key("20130524");
        let sig = hex::encode(hmac(
            &k,
            b"AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972",
        ));
        assert_eq!(
            sig,
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn signed_headers() {
        let s = Signer::new("AK", "SK", "us-east-1");
        let h = s.sign_at("GET", "127.0.0.1:7070", "/b/k", "", 1_369_353_600);
        assert_eq!(h[0], ("x-amz-date", "20130524T000000Z".to_string()));
        assert_eq!(h[1].1, UNSIGNED_PAYLOAD);
        assert!(h[2].1.starts_with(
            "AWS4-HMAC-SHA256 Credential=AK/20130524/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature="
        ));
        // Deterministic, and the signature depends on the path.
        assert_eq!(
            h,
            s.sign_at("GET", "127.0.0.1:7070", "/b/k", "", 1_369_353_600)
        );
        assert_ne!(
            h[2],
            s.sign_at("GET", "127.0.0.1:7070", "/b/j", "", 1_369_353_600)[2]
        );
    }
}
