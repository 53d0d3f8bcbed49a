//! Test harness for Granary's integration tests.
//!
//! Each test starts the real `granary` binary on a free port with its own temporary data
//! directory ([`Server`]), and drives it either with `aws-sdk-s3` ([`Server::s3_client`]) or
//! with hand-written HTTP/1.1 requests ([`raw_request`]) for the inputs no SDK would send:
//! traversal paths, broken headers, garbage XML, oversized headers.
//!
//! Also here: a seekable pseudo-random byte generator ([`Pattern`]) so that a test can stream
//! gigabytes and still check any range of them, a hand SigV4 signer ([`SignedRequest`]) for
//! requests the SDK will not sign (tampered payloads, skewed clocks, signed `aws-chunked`
//! bodies), a strict XML check ([`check_xml`]), and helpers for SDK errors and MD5 ETags.

pub mod ctl;
mod data;
pub mod disk;
pub mod faults;
mod http;
mod sdk;
mod server;
mod sigv4;
mod xml;

pub use data::{
    bucket_name, encode_key, etag_of, gzip, md5_hex, multipart_etag, random_bytes, tar_of, untar,
    untar_whole, Pattern,
};
pub use faults::{Fault, FaultProxy};
pub use http::{
    raw_request, raw_request_blocking, raw_request_with_timeout, read_response_head, request_bytes,
    RawResponse,
};
pub use sdk::{expect_sdk_error, sdk_error, HasStatus};
pub use server::{
    bench_bin, granary_bin, list_files, reserve_ports, Moto, Server, ServerOpts, ACCESS, SECRET,
};
pub use sigv4::{amz_date, sha256_hex, signed_chunks_len, unix_now, SignedRequest};
pub use xml::{assert_s3_error_body, check_xml, xml_tag, xml_tags};

/// A test that cannot run here says so and why: on stderr, and in the file that
/// `GRANARY_SKIPPED` names, which `tests/run.sh` lists at the end of the run. The caller
/// then returns: a skipped test is reported, never counted as a pass unseen.
pub fn skip(reason: &str) {
    let name = std::thread::current().name().unwrap_or("?").to_owned();
    eprintln!("SKIPPED {name}: {reason}");
    if let Some(path) = std::env::var_os("GRANARY_SKIPPED") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{name}: {reason}");
        }
    }
}
