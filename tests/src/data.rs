//! Test data: seekable pseudo-random bytes, random bytes, MD5 ETags, bucket names.

use md5::{Digest, Md5};

/// A seekable stream of pseudo-random bytes: byte `i` depends only on `seed` and `i`, so a
/// test can stream any amount without keeping it and still check any range afterwards.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    seed: u64,
}

impl Pattern {
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// Fills `buf` with the bytes at `offset..offset + buf.len()`.
    pub fn fill(&self, offset: u64, buf: &mut [u8]) {
        let mut pos = offset;
        let mut i = 0;
        while i < buf.len() {
            let word = splitmix64(self.seed ^ (pos / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let bytes = word.to_le_bytes();
            let within = (pos % 8) as usize;
            let n = (8 - within).min(buf.len() - i);
            buf[i..i + n].copy_from_slice(&bytes[within..within + n]);
            i += n;
            pos += n as u64;
        }
    }

    /// The bytes at `offset..offset + len`.
    pub fn bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.fill(offset, &mut v);
        v
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `len` random bytes.
pub fn random_bytes(len: usize) -> Vec<u8> {
    use rand::RngCore;
    let mut v = vec![0; len];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

/// Hex MD5 of `data`.
pub fn md5_hex(data: &[u8]) -> String {
    hex::encode(Md5::digest(data))
}

/// The ETag S3 gives a single-part object: `"<hex md5>"`, quotes included.
pub fn etag_of(data: &[u8]) -> String {
    format!("\"{}\"", md5_hex(data))
}

/// The ETag S3 gives a multipart object: `"<hex md5 of the parts' binary md5s>-N"`.
pub fn multipart_etag(parts: &[&[u8]]) -> String {
    let mut concat = Vec::with_capacity(16 * parts.len());
    for part in parts {
        concat.extend_from_slice(&Md5::digest(part));
    }
    format!("\"{}-{}\"", md5_hex(&concat), parts.len())
}

/// A unique, valid bucket name starting with `prefix`.
pub fn bucket_name(prefix: &str) -> String {
    let suffix = random_bytes(4);
    format!("{prefix}-{}", hex::encode(suffix))
}

/// A tar of `(name, bytes)` members (GNU headers, so long names take extension blocks;
/// every member dated 2023-11-14).
pub fn tar_of(members: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        b.append_data(&mut h, name, data.as_slice())
            .expect("a member into memory");
    }
    b.into_inner().expect("a tar in memory")
}

/// The members of a tar, in order: `(name, bytes)`. Panics on a malformed archive.
pub fn untar(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut ar = tar::Archive::new(bytes);
    let mut out = Vec::new();
    for e in ar.entries().expect("a tar stream") {
        let mut e = e.expect("a tar member");
        let name = String::from_utf8(e.path_bytes().into_owned()).expect("a UTF-8 name");
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data).expect("member bytes");
        out.push((name, data));
    }
    out
}

/// The members of a tar stream, or `None` where it is not a whole archive (a member
/// cut short, or no end-of-archive blocks): what a reader of a stream cut after its
/// first byte finds.
pub fn untar_whole(bytes: &[u8]) -> Option<usize> {
    let mut ar = tar::Archive::new(bytes);
    let mut n = 0;
    for e in ar.entries().ok()? {
        let mut e = e.ok()?;
        let mut sink = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut sink).ok()?;
        n += 1;
    }
    // A whole tar ends with two zero blocks.
    let tail = bytes.get(bytes.len().checked_sub(1024)?..)?;
    tail.iter().all(|&b| b == 0).then_some(n)
}

/// `data` gzip-compressed (a `.tar.gz` of a tar).
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, data).expect("gzip into memory");
    gz.finish().expect("gzip into memory")
}

/// A key as S3 clients put it in a path: percent-encoded, unreserved characters and `/`
/// kept.
pub fn encode_key(key: &str) -> String {
    granary_proto::encode::path(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_seekable() {
        let p = Pattern::new(7);
        let all = p.bytes(0, 100);
        for start in 0..20u64 {
            assert_eq!(p.bytes(start, 37), all[start as usize..start as usize + 37]);
        }
        assert_ne!(Pattern::new(8).bytes(0, 100), all);
    }

    #[test]
    fn multipart_etag_matches_s3() {
        // Single part of "hello": md5(md5("hello")) with -1.
        let inner = Md5::digest(b"hello");
        let expect = format!("\"{}-1\"", hex::encode(Md5::digest(inner)));
        assert_eq!(multipart_etag(&[b"hello"]), expect);
    }
}
