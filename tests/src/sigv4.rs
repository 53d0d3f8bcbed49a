//! SigV4 by hand, for requests the SDK would never sign: tampered bodies, skewed clocks,
//! hand-framed `aws-chunked` uploads. Signed with `granary_proto::sigv4`, the code the
//! node verifies with (so these tests check the node against the AWS SDK's signatures
//! elsewhere, and hand-made requests against the same canonical form).

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use granary_proto::sigv4::{self, Request, Signer};

pub use granary_proto::sigv4::sha256_hex;

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `YYYYMMDDTHHMMSSZ` (SigV4's `x-amz-date`) for a Unix time.
pub fn amz_date(unix: u64) -> String {
    sigv4::amz_date_unix(unix)
}

/// A SigV4 signature of one request, and what is needed to sign `aws-chunked` chunks after it.
#[derive(Clone, Debug)]
pub struct SignedRequest {
    /// Headers to send: `x-amz-date`, `x-amz-content-sha256`, `Authorization`.
    pub headers: Vec<(String, String)>,
    /// The request's signature: the seed of a chunk-signature chain.
    pub signature: String,
    chunks: sigv4::ChunkSigner,
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
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let host = host.to_string();
        let mut headers: Vec<(&str, &str)> = vec![("host", &host)];
        headers.extend(extra_headers.iter().map(|(k, v)| (*k, v.trim())));
        let signed = Signer::new(access, secret, "us-east-1").sign(
            &Request {
                method,
                path,
                query,
                headers: &headers,
                payload_hash: payload_sha256,
            },
            UNIX_EPOCH + Duration::from_secs(unix),
        );
        let [(d, date), (c, content), (a, authorization)] = signed.headers;
        SignedRequest {
            headers: vec![
                (d.to_owned(), date),
                (c.to_owned(), content),
                (a.to_owned(), authorization),
            ],
            signature: signed.chunks.seed_signature.clone(),
            chunks: signed.chunks,
        }
    }

    /// The `chunk-signature` of a chunk whose predecessor's signature is `previous`.
    pub fn chunk_signature(&self, previous: &str, chunk: &[u8]) -> String {
        self.chunks.chunk_signature(previous, &sha256_hex(chunk))
    }

    /// A `STREAMING-AWS4-HMAC-SHA256-PAYLOAD` body of `chunks`, each signed in the chain
    /// started by this request, ending with the signed empty chunk.
    pub fn signed_chunks(&self, chunks: &[&[u8]]) -> Vec<u8> {
        self.chunks.frame(chunks)
    }
}

/// Length of the `STREAMING-AWS4-HMAC-SHA256-PAYLOAD` framing of chunks of these sizes.
pub fn signed_chunks_len(sizes: &[usize]) -> usize {
    sigv4::framed_len(sizes)
}
