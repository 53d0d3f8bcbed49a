//! Hostile and broken requests, sent byte for byte: traversal paths, NUL in keys, malformed
//! ranges, garbage XML, bad signatures, oversized headers, truncated bodies. Every answer must
//! be a clean S3 error (never a 5xx), the node must stay healthy after each, and nothing may
//! appear outside the data directory.

use std::collections::HashSet;
use std::io::{BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use aws_sdk_s3::primitives::ByteStream;
use base64::Engine as _;
use granary_tests::{
    amz_date, assert_s3_error_body, bucket_name, check_xml, list_files, random_bytes,
    read_response_head, sha256_hex, signed_chunks_len, unix_now, xml_tag, xml_tags, RawResponse,
    Server, ServerOpts, SignedRequest, ACCESS, SECRET,
};
use md5::{Digest, Md5};

mod bodies;
mod paths;
mod requests;
mod signatures;

/// A server plus a sentinel directory beside its data dir and a snapshot of every file
/// outside the data dir, to prove that no request wrote (or read) outside it.
struct Sandbox {
    server: Server,
    sentinel: PathBuf,
    sentinel_bytes: Vec<u8>,
    before: HashSet<PathBuf>,
}

impl Sandbox {
    fn start(opts: ServerOpts) -> Sandbox {
        let server = Server::start(opts).expect("start granary");
        let outside = server.root().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        let sentinel = outside.join("x");
        let sentinel_bytes = b"SENTINEL: must never be served or overwritten".to_vec();
        std::fs::write(&sentinel, &sentinel_bytes).unwrap();
        let before = list_files(server.root(), Some(server.data_dir()));
        assert!(
            before.contains(&sentinel),
            "the snapshot must see the sentinel"
        );
        Sandbox {
            server,
            sentinel,
            sentinel_bytes,
            before,
        }
    }

    async fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> RawResponse {
        self.server
            .raw(method, path, headers, body)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: no answer: {e:#}"))
    }

    /// Panics if anything was created or changed outside the data dir.
    fn assert_nothing_outside(&self) {
        let now = list_files(self.server.root(), Some(self.server.data_dir()));
        let new: Vec<_> = now.difference(&self.before).collect();
        assert!(
            new.is_empty(),
            "files appeared outside the data dir: {new:?}"
        );
        assert_eq!(
            std::fs::read(&self.sentinel).unwrap(),
            self.sentinel_bytes,
            "sentinel file changed"
        );
    }

    /// Creates a bucket with an unsigned raw PUT (the server must be open).
    async fn create_bucket(&self, bucket: &str) {
        let resp = self.raw("PUT", &format!("/{bucket}"), &[], b"").await;
        assert_eq!(resp.status, 200, "PUT /{bucket}: {}", resp.text());
    }
}

/// Panics unless `resp` is a 4xx with an S3 XML error body.
fn assert_client_error(resp: &RawResponse, what: &str) {
    assert!(
        (400..500).contains(&resp.status),
        "{what}: expected a 4xx S3 error, got {} {}",
        resp.status,
        resp.text()
    );
    assert_s3_error_body(&resp.body);
}

fn content_md5(body: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(Md5::digest(body))
}
