//! AWS Signature Version 4 in the `Authorization` header, for every request a
//! [`Client`](crate::Client) with credentials sends.
//!
//! The path and query given are already encoded the way SigV4 canonicalises them
//! (everything but `A-Za-z0-9-._~` escaped, `/` kept in paths), so what is sent is what
//! is signed. Streamed bodies are signed as `UNSIGNED-PAYLOAD`; small bodies by their hash.

use std::fmt;
use std::time::SystemTime;

use granary_proto::sigv4::{Request, Signer};
use granary_proto::Header;

/// The payload hash of a body that is not hashed (streamed uploads).
pub(crate) use granary_proto::sigv4::UNSIGNED_PAYLOAD;

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

pub(crate) use granary_proto::sigv4::sha256_hex;

/// What one request signs.
pub(crate) struct Signable<'a> {
    pub method: &'a str,
    /// The encoded path, as sent.
    pub path: &'a str,
    /// The encoded query, as sent.
    pub query: &'a str,
    /// Headers to sign besides the two SigV4 adds; names in lower case, `host` among them.
    pub headers: &'a [Header],
    /// Hex SHA-256 of the body, or [`UNSIGNED_PAYLOAD`].
    pub payload_hash: &'a str,
}

/// Signs a request at time `at` (with `granary_proto::sigv4`, the code the node checks
/// signatures with); returns the headers to add to it: `x-amz-date`,
/// `x-amz-content-sha256` and `authorization`.
pub(crate) fn sign(creds: &Credentials, req: &Signable<'_>, at: SystemTime) -> Vec<Header> {
    let headers: Vec<(&str, &str)> = req
        .headers
        .iter()
        .map(|h| (h.name.as_str(), h.value.as_str()))
        .collect();
    let signed = Signer::new(&creds.access_key, &creds.secret_key, &creds.region).sign(
        &Request {
            method: req.method,
            path: req.path,
            query: req.query,
            headers: &headers,
            payload_hash: req.payload_hash,
        },
        at,
    );
    signed
        .headers
        .into_iter()
        .map(|(k, v)| Header::new(k, v))
        .collect()
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

    fn authorization(out: &[Header]) -> &str {
        Header::find(out, "authorization").unwrap()
    }

    #[test]
    fn list_objects_example_of_the_aws_documentation() {
        let headers = vec![Header::new("host", "examplebucket.s3.amazonaws.com")];
        // Given out of order: the canonical query sorts them.
        let query = "prefix=J&max-keys=2";
        let out = sign(
            &example_creds(),
            &Signable {
                method: "GET",
                path: "/",
                query,
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
