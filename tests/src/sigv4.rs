//! SigV4 by hand, for requests the SDK would never sign: tampered bodies, skewed clocks,
//! hand-framed `aws-chunked` uploads.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `YYYYMMDDTHHMMSSZ` (SigV4's `x-amz-date`) for a Unix time.
pub fn amz_date(unix: u64) -> String {
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    time::OffsetDateTime::from_unix_timestamp(unix as i64)
        .ok()
        .and_then(|t| t.format(format).ok())
        .expect("a Unix time before the year 10000")
}

/// Hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(data))
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// A SigV4 signature of one request, and what is needed to sign `aws-chunked` chunks after it.
#[derive(Clone, Debug)]
pub struct SignedRequest {
    /// Headers to send: `x-amz-date`, `x-amz-content-sha256`, `Authorization`.
    pub headers: Vec<(String, String)>,
    /// The request's signature: the seed of a chunk-signature chain.
    pub signature: String,
    amz_date: String,
    scope: String,
    key: Vec<u8>,
}

impl SignedRequest {
    /// The headers to send, borrowed, for [`crate::request_bytes`].
    pub fn header_refs(&self) -> Vec<(&str, &str)> {
        self.headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    /// Signs `path_and_query` (sent as is; its query parameters already URI-encoded) with
    /// `access`/`secret` at time `unix`, covering `host`, `extra_headers` and the payload hash.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        method: &str,
        path_and_query: &str,
        host: SocketAddr,
        extra_headers: &[(&str, &str)],
        payload_sha256: &str,
        access: &str,
        secret: &str,
        unix: u64,
    ) -> SignedRequest {
        let amz_date = amz_date(unix);
        let day = &amz_date[..8];
        let scope = format!("{day}/us-east-1/s3/aws4_request");
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let mut params: Vec<(String, String)> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| match p.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (p.to_string(), String::new()),
            })
            .collect();
        params.sort();
        let canonical_query = params
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let host = host.to_string();
        let mut headers: Vec<(String, String)> = vec![
            ("host".into(), host),
            ("x-amz-content-sha256".into(), payload_sha256.into()),
            ("x-amz-date".into(), amz_date.clone()),
        ];
        for (k, v) in extra_headers {
            headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
        }
        headers.sort();
        let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
        let signed_headers = headers
            .iter()
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
            .join(";");
        let canonical_request = format!(
            "{method}\n{path}\n{canonical_query}\n{canonical_headers}\n{signed_headers}\n{payload_sha256}"
        );
        let string_to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            sha256_hex(canonical_request.as_bytes())
        );
        let mut key = hmac_sha256(format!("AWS4{secret}").as_bytes(), day.as_bytes());
        for part in ["us-east-1", "s3", "aws4_request"] {
            key = hmac_sha256(&key, part.as_bytes());
        }
        let signature = hex::encode(hmac_sha256(&key, string_to_sign.as_bytes()));
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={access}/{scope}, SignedHeaders={signed_headers}, Signature={signature}"
        );
        SignedRequest {
            headers: vec![
                ("x-amz-date".into(), amz_date.clone()),
                ("x-amz-content-sha256".into(), payload_sha256.into()),
                ("Authorization".into(), authorization),
            ],
            signature,
            amz_date,
            scope,
            key,
        }
    }

    /// The `chunk-signature` of a chunk whose predecessor's signature is `previous`.
    pub fn chunk_signature(&self, previous: &str, chunk: &[u8]) -> String {
        let string_to_sign = format!(
            "AWS4-HMAC-SHA256-PAYLOAD\n{}\n{}\n{previous}\n{}\n{}",
            self.amz_date,
            self.scope,
            sha256_hex(b""),
            sha256_hex(chunk)
        );
        hex::encode(hmac_sha256(&self.key, string_to_sign.as_bytes()))
    }

    /// A `STREAMING-AWS4-HMAC-SHA256-PAYLOAD` body of `chunks`, each signed in the chain
    /// started by this request, ending with the signed empty chunk.
    pub fn signed_chunks(&self, chunks: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut previous = self.signature.clone();
        for chunk in chunks.iter().copied().chain(std::iter::once(&b""[..])) {
            let sig = self.chunk_signature(&previous, chunk);
            out.extend_from_slice(
                format!("{:x};chunk-signature={sig}\r\n", chunk.len()).as_bytes(),
            );
            out.extend_from_slice(chunk);
            out.extend_from_slice(b"\r\n");
            previous = sig;
        }
        out
    }
}

/// Length of the `STREAMING-AWS4-HMAC-SHA256-PAYLOAD` framing of chunks of these sizes.
pub fn signed_chunks_len(sizes: &[usize]) -> usize {
    sizes
        .iter()
        .copied()
        .chain(std::iter::once(0))
        .map(|n| format!("{n:x}").len() + ";chunk-signature=".len() + 64 + 2 + n + 2)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigv4_matches_the_aws_documentation_example() {
        // "Example: GET Object" from the S3 SigV4 header-signing documentation.
        let key = {
            let mut k = hmac_sha256(b"AWS4wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", b"20130524");
            for part in ["us-east-1", "s3", "aws4_request"] {
                k = hmac_sha256(&k, part.as_bytes());
            }
            k
        };
        let canonical = "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\nx-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\nx-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let sts = format!(
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n{}",
            sha256_hex(canonical.as_bytes())
        );
        assert_eq!(
            hex::encode(hmac_sha256(&key, sts.as_bytes())),
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn signed_chunks_len_matches_the_framing() {
        let signer = SignedRequest::new(
            "PUT",
            "/b/k",
            "127.0.0.1:1".parse().unwrap(),
            &[],
            "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
            "a",
            "s",
            0,
        );
        let body = signer.signed_chunks(&[&[1u8; 70_000][..], &[2u8; 5][..]]);
        assert_eq!(body.len(), signed_chunks_len(&[70_000, 5]));
    }

    #[test]
    fn amz_date_formats() {
        assert_eq!(amz_date(0), "19700101T000000Z");
        assert_eq!(amz_date(1_709_210_096), "20240229T123456Z");
    }
}
