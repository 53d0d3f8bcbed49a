//! Request bodies on their way to the backend: `aws-chunked` framing removed, chunk and
//! trailer signatures checked, the signed SHA-256 and any `x-amz-checksum-*` (header or
//! trailer) verified. Bytes flow on as they arrive; a verdict that fails ends the stream
//! with an error *before* its end, so the backend never commits a body that failed.

use std::io;

use base64::Engine;
use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;
use http::HeaderMap;
use sha2::{Digest, Sha256};

use super::auth::Payload;
use crate::api::error::{S3Code, S3Error};
use granary_core::{crc, ByteStream};

/// Longest chunk header or trailer line accepted.
const MAX_LINE: usize = 4096;

/// A checksum algorithm of the `x-amz-checksum-*` family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumAlg {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

impl ChecksumAlg {
    pub fn from_name(name: &str) -> Option<ChecksumAlg> {
        Some(match name.to_ascii_lowercase().as_str() {
            "crc32" => ChecksumAlg::Crc32,
            "crc32c" => ChecksumAlg::Crc32c,
            "crc64nvme" => ChecksumAlg::Crc64Nvme,
            "sha1" => ChecksumAlg::Sha1,
            "sha256" => ChecksumAlg::Sha256,
            _ => return None,
        })
    }

    pub fn header_name(self) -> &'static str {
        match self {
            ChecksumAlg::Crc32 => "x-amz-checksum-crc32",
            ChecksumAlg::Crc32c => "x-amz-checksum-crc32c",
            ChecksumAlg::Crc64Nvme => "x-amz-checksum-crc64nvme",
            ChecksumAlg::Sha1 => "x-amz-checksum-sha1",
            ChecksumAlg::Sha256 => "x-amz-checksum-sha256",
        }
    }
}

impl ChecksumAlg {
    /// The algorithm of an `x-amz-checksum-*` header name.
    pub fn of_header(name: &str) -> Option<ChecksumAlg> {
        name.strip_prefix("x-amz-checksum-")
            .and_then(ChecksumAlg::from_name)
    }

    /// A CRC's polynomial (reflected) and width: what combining CRCs needs.
    fn crc(self) -> Option<crc::Crc> {
        match self {
            ChecksumAlg::Crc32 => Some(crc::Crc::Crc32),
            ChecksumAlg::Crc32c => Some(crc::Crc::Crc32c),
            ChecksumAlg::Crc64Nvme => Some(crc::Crc::Crc64Nvme),
            ChecksumAlg::Sha1 | ChecksumAlg::Sha256 => None,
        }
    }
}

/// The checksum S3 gives an object completed from parts with these checksums (base64,
/// each with its part's size): COMPOSITE, the algorithm over the parts' digests, then
/// `-N`; FULL_OBJECT (CRCs only), the checksum of the whole object, combined from the
/// parts' without reading them. `None` when a part's checksum is not one of `alg`.
pub fn combined(alg: ChecksumAlg, parts: &[(&str, u64)], full_object: bool) -> Option<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let digests: Vec<Vec<u8>> = parts
        .iter()
        .map(|(v, _)| b64.decode(v).ok())
        .collect::<Option<_>>()?;
    if !full_object {
        let mut c = Checksum::new(alg);
        for d in &digests {
            c.update(d);
        }
        return Some(format!("{}-{}", c.finish(), parts.len()));
    }
    let kind = alg.crc()?;
    let width = kind.width();
    let mut acc: Option<u64> = None;
    for (d, (_, len)) in digests.iter().zip(parts) {
        if d.len() * 8 != width {
            return None;
        }
        let crc = d.iter().fold(0u64, |a, b| (a << 8) | u64::from(*b));
        acc = Some(match acc {
            None => crc,
            Some(a) => crc::combine(kind, a, crc, *len),
        });
    }
    let bytes = acc?.to_be_bytes();
    Some(b64.encode(&bytes[8 - width / 8..]))
}

/// A running checksum.
pub enum Checksum {
    Crc32(crc32fast::Hasher),
    Crc32c(u32),
    Crc64Nvme(crc::Crc64Nvme),
    Sha1(sha1::Sha1),
    Sha256(Sha256),
}

impl Checksum {
    pub fn new(alg: ChecksumAlg) -> Checksum {
        match alg {
            ChecksumAlg::Crc32 => Checksum::Crc32(crc32fast::Hasher::new()),
            ChecksumAlg::Crc32c => Checksum::Crc32c(0),
            ChecksumAlg::Crc64Nvme => Checksum::Crc64Nvme(crc::Crc64Nvme::default()),
            ChecksumAlg::Sha1 => Checksum::Sha1(sha1::Sha1::new()),
            ChecksumAlg::Sha256 => Checksum::Sha256(Sha256::new()),
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            Checksum::Crc32(h) => h.update(data),
            Checksum::Crc32c(c) => *c = crc::crc32c_append(*c, data),
            Checksum::Crc64Nvme(d) => d.update(data),
            Checksum::Sha1(h) => h.update(data),
            Checksum::Sha256(h) => h.update(data),
        }
    }

    /// The base64 of the big-endian digest, as S3 writes it.
    pub fn finish(self) -> String {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        match self {
            Checksum::Crc32(h) => b64(&h.finalize().to_be_bytes()),
            Checksum::Crc32c(c) => b64(&c.to_be_bytes()),
            Checksum::Crc64Nvme(d) => b64(&d.finish().to_be_bytes()),
            Checksum::Sha1(h) => b64(&h.finalize()),
            Checksum::Sha256(h) => b64(&h.finalize()),
        }
    }
}

/// What the headers say the body must satisfy.
pub struct BodyRules {
    pub payload: Payload,
    /// A checksum the client sent or will send: its algorithm and, for the header form,
    /// its value (for the trailer form it comes at the end of the body).
    pub checksum: Option<(ChecksumAlg, Option<String>)>,
    /// The length of the payload after `aws-chunked` decoding.
    pub decoded_len: Option<u64>,
}

impl BodyRules {
    /// Reads the checksum and length rules from the request headers.
    pub fn from_headers(h: &HeaderMap, payload: Payload) -> Result<BodyRules, S3Error> {
        let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
        let streaming = matches!(
            payload,
            Payload::StreamingSigned { .. } | Payload::StreamingUnsigned
        );
        let mut checksum = None;
        for (name, value) in h.iter() {
            if let Some(alg) = name
                .as_str()
                .strip_prefix("x-amz-checksum-")
                .and_then(ChecksumAlg::from_name)
            {
                let v = value.to_str().map_err(|_| bad_checksum_header())?;
                checksum = Some((alg, Some(v.to_owned())));
            }
        }
        if let Some(trailer) = get("x-amz-trailer") {
            if let Some(alg) = trailer
                .trim()
                .strip_prefix("x-amz-checksum-")
                .and_then(ChecksumAlg::from_name)
            {
                checksum = Some((alg, None));
            }
        }
        let decoded_len = if streaming {
            let v = get("x-amz-decoded-content-length").ok_or_else(|| {
                S3Error::new(
                    S3Code::MissingContentLength,
                    "aws-chunked bodies need x-amz-decoded-content-length",
                )
            })?;
            Some(v.parse().map_err(|_| {
                S3Error::new(
                    S3Code::InvalidArgument,
                    "x-amz-decoded-content-length is not a number",
                )
            })?)
        } else {
            get("content-length").and_then(|v| v.parse().ok())
        };
        Ok(BodyRules {
            payload,
            checksum,
            decoded_len,
        })
    }
}

fn bad_checksum_header() -> S3Error {
    S3Error::new(
        S3Code::InvalidRequest,
        "an x-amz-checksum header is not valid text",
    )
}

fn fail(code: S3Code, msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, S3Error::new(code, msg))
}

/// Wraps the raw request body so it yields the payload and fails on any broken rule.
pub fn verified(raw: ByteStream, rules: BodyRules) -> ByteStream {
    let BodyRules {
        payload,
        checksum,
        decoded_len,
    } = rules;
    let (chunked, signer, sha) = match payload {
        Payload::Unsigned => (false, None, None),
        Payload::Sha256(h) => (false, None, Some(h)),
        Payload::StreamingSigned { ctx, .. } => (true, Some(ctx), None),
        Payload::StreamingUnsigned => (true, None, None),
    };
    let stream = async_stream::try_stream! {
        let mut sum = checksum.as_ref().map(|(alg, _)| Checksum::new(*alg));
        let mut sha_state = sha.map(|_| Sha256::new());
        let mut total: u64 = 0;
        let mut trailer_value: Option<String> = None;
        if chunked {
            let mut r = ChunkReader { inner: raw, buf: BytesMut::new() };
            let mut prev_sig = signer.as_ref().map(|s| s.seed_signature.clone());
            loop {
                let line = r.line().await?.ok_or_else(|| fail(S3Code::IncompleteBody, "the aws-chunked body ended early"))?;
                let (size, chunk_sig) = parse_chunk_header(&line)?;
                let mut chunk_sha = signer.as_ref().map(|_| Sha256::new());
                let mut left = size;
                while left > 0 {
                    let data = r.take(left).await?;
                    left -= data.len();
                    if let Some(h) = chunk_sha.as_mut() { h.update(&data); }
                    if let Some(s) = sum.as_mut() { s.update(&data); }
                    total += data.len() as u64;
                    yield data;
                }
                if let (Some(signer), Some(h)) = (signer.as_ref(), chunk_sha) {
                    let prev = prev_sig.take().unwrap_or_default();
                    let want = signer.chunk_signature(&prev, &hex::encode(h.finalize()));
                    if chunk_sig.as_deref() != Some(want.as_str()) {
                        Err(fail(S3Code::SignatureDoesNotMatch, "a chunk signature does not match"))?;
                    }
                    prev_sig = Some(want);
                }
                if size == 0 {
                    break;
                }
                r.expect_crlf().await?;
            }
            // Trailers, up to an empty line or the end of the body.
            let mut trailer_bytes = Vec::new();
            let mut trailer_sig = None;
            while let Some(line) = r.line().await? {
                if line.is_empty() { break; }
                let text = std::str::from_utf8(&line).map_err(|_| fail(S3Code::InvalidRequest, "a trailer is not UTF-8"))?;
                let (name, value) = text.split_once(':').ok_or_else(|| fail(S3Code::InvalidRequest, "a trailer line has no `:`"))?;
                let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_owned());
                if name == "x-amz-trailer-signature" {
                    trailer_sig = Some(value);
                    continue;
                }
                trailer_bytes.extend_from_slice(format!("{name}:{value}\n").as_bytes());
                if let Some((alg, _)) = &checksum {
                    if name == alg.header_name() {
                        trailer_value = Some(value);
                    }
                }
            }
            if let (Some(signer), Some(got)) = (signer.as_ref(), trailer_sig) {
                let prev = prev_sig.take().unwrap_or_default();
                let want = signer.trailer_signature(&prev, &hex::encode(Sha256::digest(&trailer_bytes)));
                if got != want {
                    Err(fail(S3Code::SignatureDoesNotMatch, "the trailer signature does not match"))?;
                }
            }
        } else {
            let mut raw = raw;
            while let Some(data) = raw.next().await {
                let data = data?;
                if let Some(h) = sha_state.as_mut() { h.update(&data); }
                if let Some(s) = sum.as_mut() { s.update(&data); }
                total += data.len() as u64;
                yield data;
            }
        }
        if let Some(want) = decoded_len {
            if want != total {
                Err(fail(S3Code::IncompleteBody, format!("expected {want} bytes, received {total}")))?;
            }
        }
        if let (Some(want), Some(h)) = (sha, sha_state) {
            if want[..] != h.finalize()[..] {
                Err(fail(S3Code::XAmzContentSHA256Mismatch, "the body does not hash to x-amz-content-sha256"))?;
            }
        }
        if let (Some((alg, header_value)), Some(s)) = (checksum, sum) {
            let want = header_value.or(trailer_value).ok_or_else(|| {
                fail(S3Code::InvalidRequest, format!("the trailer {} never came", alg.header_name()))
            })?;
            let got = s.finish();
            if got != want {
                Err(fail(S3Code::BadDigest, format!("the {} you specified did not match the calculated checksum", alg.header_name())))?;
            }
        }
    };
    Box::pin(stream)
}

/// `1000;chunk-signature=abc` → (4096, Some("abc")).
fn parse_chunk_header(line: &[u8]) -> io::Result<(usize, Option<String>)> {
    let text = std::str::from_utf8(line).map_err(|_| bad_chunk())?;
    let (size, ext) = match text.split_once(';') {
        Some((s, e)) => (s, Some(e)),
        None => (text, None),
    };
    let size = usize::from_str_radix(size.trim(), 16).map_err(|_| bad_chunk())?;
    if size > 1 << 30 {
        return Err(bad_chunk());
    }
    let sig = ext.and_then(|e| {
        e.split(';')
            .find_map(|kv| kv.trim().strip_prefix("chunk-signature="))
            .map(str::to_owned)
    });
    Ok((size, sig))
}

fn bad_chunk() -> io::Error {
    fail(
        S3Code::IncompleteBody,
        "an aws-chunked chunk header is malformed",
    )
}

/// Reads lines and counted bytes from a body stream.
struct ChunkReader {
    inner: ByteStream,
    buf: BytesMut,
}

impl ChunkReader {
    async fn fill(&mut self) -> io::Result<bool> {
        match self.inner.next().await {
            Some(Ok(b)) => {
                self.buf.extend_from_slice(&b);
                Ok(true)
            }
            Some(Err(e)) => Err(e),
            None => Ok(false),
        }
    }

    /// The next line without its CRLF; `None` at the end of the body.
    async fn line(&mut self) -> io::Result<Option<Bytes>> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf.split_to(i).freeze();
                self.buf.advance(2);
                return Ok(Some(line));
            }
            if self.buf.len() > MAX_LINE {
                return Err(bad_chunk());
            }
            if !self.fill().await? {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                // A last line without CRLF.
                return Ok(Some(self.buf.split().freeze()));
            }
        }
    }

    /// Up to `max` bytes (at least one).
    async fn take(&mut self, max: usize) -> io::Result<Bytes> {
        if self.buf.is_empty() && !self.fill().await? {
            return Err(fail(
                S3Code::IncompleteBody,
                "the aws-chunked body ended inside a chunk",
            ));
        }
        let n = max.min(self.buf.len());
        Ok(self.buf.split_to(n).freeze())
    }

    async fn expect_crlf(&mut self) -> io::Result<()> {
        while self.buf.len() < 2 {
            if !self.fill().await? {
                return Err(bad_chunk());
            }
        }
        if &self.buf[..2] != b"\r\n" {
            return Err(bad_chunk());
        }
        self.buf.advance(2);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_checksums_combine_as_s3_combines_them() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let (a, b, c) = (vec![b'A'; 1000], vec![b'B'; 77], vec![b'C'; 5]);
        let whole: Vec<u8> = [a.clone(), b.clone(), c.clone()].concat();
        let of = |alg, data: &[u8]| {
            let mut ck = Checksum::new(alg);
            ck.update(data);
            ck.finish()
        };
        for alg in [
            ChecksumAlg::Crc32,
            ChecksumAlg::Crc32c,
            ChecksumAlg::Crc64Nvme,
        ] {
            let parts = [(of(alg, &a), 1000), (of(alg, &b), 77), (of(alg, &c), 5)];
            let parts: Vec<(&str, u64)> = parts.iter().map(|(v, n)| (v.as_str(), *n)).collect();
            assert_eq!(
                combined(alg, &parts, true),
                Some(of(alg, &whole)),
                "{alg:?}"
            );
        }
        // COMPOSITE: the digests' digest, as in Ceph's s3-tests (three 5 MiB parts of
        // 'A', 'B' and 'C').
        let mib5 = 5 << 20;
        let parts: Vec<String> = [b'A', b'B', b'C']
            .iter()
            .map(|ch| of(ChecksumAlg::Sha256, &vec![*ch; mib5]))
            .collect();
        assert_eq!(parts[0], "275VF5loJr1YYawit0XSHREhkFXYkkPKGuoK0x9VKxI=");
        let parts: Vec<(&str, u64)> = parts.iter().map(|v| (v.as_str(), mib5 as u64)).collect();
        assert_eq!(
            combined(ChecksumAlg::Sha256, &parts, false).as_deref(),
            Some("uWBwpe1dxI4Vw8Gf0X9ynOdw/SS6VBzfWm9giiv1sf4=-3")
        );
        assert_eq!(combined(ChecksumAlg::Sha256, &parts, true), None);
        let parts: Vec<String> = [b'A', b'B', b'C']
            .iter()
            .map(|ch| of(ChecksumAlg::Crc64Nvme, &vec![*ch; mib5]))
            .collect();
        assert_eq!(parts[0], "L/E4WYn8v98=");
        let parts: Vec<(&str, u64)> = parts.iter().map(|v| (v.as_str(), mib5 as u64)).collect();
        assert_eq!(
            combined(ChecksumAlg::Crc64Nvme, &parts, true).as_deref(),
            Some("i+6LR0y3eFo=")
        );
        assert_eq!(
            combined(ChecksumAlg::Crc32, &[("not base64!", 1)], true),
            None
        );
        let _ = b64;
    }

    fn stream_of(parts: Vec<&'static [u8]>) -> ByteStream {
        Box::pin(futures::stream::iter(
            parts.into_iter().map(|p| Ok(Bytes::from_static(p))),
        ))
    }

    async fn collect(s: ByteStream) -> Result<Vec<u8>, S3Error> {
        let mut s = s;
        let mut out = Vec::new();
        while let Some(item) = s.next().await {
            match item {
                Ok(b) => out.extend_from_slice(&b),
                Err(e) => {
                    return Err(e
                        .get_ref()
                        .and_then(|i| i.downcast_ref::<S3Error>())
                        .cloned()
                        .unwrap_or_else(|| S3Error::internal(e)))
                }
            }
        }
        Ok(out)
    }

    fn crc32_b64(data: &[u8]) -> String {
        let mut c = Checksum::new(ChecksumAlg::Crc32);
        c.update(data);
        c.finish()
    }

    #[tokio::test]
    async fn unsigned_trailer_is_decoded_and_checked() {
        let good = format!("x-amz-checksum-crc32:{}\r\n", crc32_b64(b"hello world"));
        let body: &'static [u8] = Box::leak(
            format!("5\r\nhello\r\n6\r\n world\r\n0\r\n{good}\r\n")
                .into_bytes()
                .into_boxed_slice(),
        );
        // Split at awkward places to exercise buffering.
        let s = stream_of(vec![&body[..3], &body[3..11], &body[11..]]);
        let rules = BodyRules {
            payload: Payload::StreamingUnsigned,
            checksum: Some((ChecksumAlg::Crc32, None)),
            decoded_len: Some(11),
        };
        assert_eq!(collect(verified(s, rules)).await.unwrap(), b"hello world");

        let bad: &'static [u8] = b"5\r\nhello\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n";
        let rules = BodyRules {
            payload: Payload::StreamingUnsigned,
            checksum: Some((ChecksumAlg::Crc32, None)),
            decoded_len: Some(5),
        };
        let e = collect(verified(stream_of(vec![bad]), rules))
            .await
            .unwrap_err();
        assert_eq!(e.code, S3Code::BadDigest);
    }

    #[tokio::test]
    async fn short_and_malformed_bodies_fail() {
        let rules = || BodyRules {
            payload: Payload::StreamingUnsigned,
            checksum: None,
            decoded_len: Some(10),
        };
        let e = collect(verified(stream_of(vec![b"a\r\nhello"]), rules()))
            .await
            .unwrap_err();
        assert_eq!(e.code, S3Code::IncompleteBody);
        let e = collect(verified(stream_of(vec![b"zz\r\n"]), rules()))
            .await
            .unwrap_err();
        assert_eq!(e.code, S3Code::IncompleteBody);
        let plain = BodyRules {
            payload: Payload::Sha256([0; 32]),
            checksum: None,
            decoded_len: Some(3),
        };
        let e = collect(verified(stream_of(vec![b"abc"]), plain))
            .await
            .unwrap_err();
        assert_eq!(e.code, S3Code::XAmzContentSHA256Mismatch);
    }

    #[test]
    fn known_checksums() {
        // Values S3 documents / computes for "hello world".
        let mut c = Checksum::new(ChecksumAlg::Crc32);
        c.update(b"hello world");
        assert_eq!(c.finish(), "DUoRhQ==");
        let mut c = Checksum::new(ChecksumAlg::Crc32c);
        c.update(b"hello world");
        assert_eq!(c.finish(), "yZRlqg==");
        let mut c = Checksum::new(ChecksumAlg::Sha256);
        c.update(b"hello world");
        assert_eq!(c.finish(), "uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek=");
    }
}
