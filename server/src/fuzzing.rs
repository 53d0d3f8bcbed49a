//! Fuzz targets for every parser that faces the network, each a function of arbitrary
//! bytes that panics only when an invariant breaks (a panic in the code under test is a
//! finding too). `fuzz/` drives them with libFuzzer (`cargo fuzz run fuzz_NAME`); the tests
//! below run each over its seed corpus (`fuzz/corpus/fuzz_NAME/`) and a few thousand mutations
//! of it on every test run. See `docs/reliability.md`.

use std::io::Write;
use std::os::fd::FromRawFd;

use bytes::Bytes;
use futures::StreamExt;

use granary_proto::auth::{self, Credentials, Payload};
use granary_proto::range::RangeSpec;
use granary_proto::xml;

use crate::api::s3::body::{self, BodyRules, ChecksumAlg};
use granary_core::{keypath, ByteStream};

/// A fuzz target: a function of arbitrary bytes.
pub type Target = fn(&[u8]);

/// Every target, by the name its corpus and its libFuzzer binary have (`fuzz_NAME`).
pub const TARGETS: &[(&str, Target)] = &[
    ("range", range),
    ("s3_xml", s3_xml),
    ("sigv4", sigv4),
    ("aws_chunked", aws_chunked),
    ("keys", keys),
    ("tar_index", tar_index),
    ("prep", prep),
];

/// `Range` headers: a range that parses resolves inside the object or is refused.
pub fn range(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Some(spec) = RangeSpec::parse(&text) else {
        return;
    };
    for size in [0, 1, 7, 4096, 1 << 40, u64::MAX] {
        if let Ok(r) = spec.resolve(size) {
            assert!(
                r.start < r.end && r.end <= size,
                "{spec:?} of {size}: {r:?}"
            );
        }
    }
}

/// DeleteObjects and CompleteMultipartUpload bodies: parsed or refused, never a panic.
pub fn s3_xml(data: &[u8]) {
    if let Ok(d) = xml::Delete::parse(data) {
        let _ = d.objects.iter().map(|o| o.key.len()).sum::<usize>();
    }
    if let Ok(c) = xml::parse::<xml::CompleteMultipartUpload>(data) {
        let _ = c.parts.iter().map(|p| p.etag.len()).sum::<usize>();
    }
}

/// Requests with arbitrary targets and SigV4-looking headers and query strings: checked
/// and refused, never a panic, and never accepted as signed without the secret.
pub fn sigv4(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut pieces = text.split('\n');
    let target = pieces.next().unwrap_or("/");
    let Ok(uri) = target.parse::<http::Uri>() else {
        return;
    };
    let mut req = http::Request::builder().method("PUT").uri(uri);
    for line in pieces {
        if let Some((k, v)) = line.split_once(':') {
            if let (Ok(k), Ok(v)) = (
                http::HeaderName::try_from(k.trim()),
                http::HeaderValue::from_str(v.trim()),
            ) {
                req = req.header(k, v);
            }
        }
    }
    let Ok(req) = req.body(()) else {
        return;
    };
    let (parts, ()) = req.into_parts();
    let creds = Credentials {
        access_key: "AKIDFUZZ".into(),
        secret_key: "a secret no input can know".into(),
    };
    if let Ok(v) = auth::authenticate(Some(&creds), false, &parts) {
        assert!(!v.signed, "accepted as signed without the secret: {target}");
    }
    let _ = granary_proto::encode::query_pairs(parts.uri.query().unwrap_or(""));
    let _ = granary_proto::encode::split_path(parts.uri.path());
}

/// `aws-chunked` bodies (no signatures; with and without a trailing CRC32C): decoded or
/// refused; a decoded payload is never longer than the body.
pub fn aws_chunked(data: &[u8]) {
    for checksum in [None, Some((ChecksumAlg::Crc32c, None))] {
        let rules = BodyRules {
            payload: Payload::StreamingUnsigned,
            checksum,
            decoded_len: None,
        };
        // The body arrives in pieces, so the decoder's buffering is exercised too.
        let pieces: Vec<std::io::Result<Bytes>> = data
            .chunks(7)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let raw: ByteStream = Box::pin(futures::stream::iter(pieces));
        let decoded = body::verified(raw, rules);
        let total = futures::executor::block_on(decoded.fold(Some(0usize), |n, item| async move {
            match (n, item) {
                (Some(n), Ok(b)) => Some(n + b.len()),
                _ => None,
            }
        }));
        if let Some(n) = total {
            assert!(n <= data.len(), "decoded {n} bytes from {}", data.len());
        }
    }
}

/// Keys to paths: a plain path stays below its bucket and maps back to the key; an
/// escaped path maps back to the key.
pub fn keys(data: &[u8]) {
    let Ok(key) = std::str::from_utf8(data) else {
        return;
    };
    if granary_core::check_key(key).is_err() {
        return;
    }
    if let Some(p) = keypath::plain_path(key) {
        let parts: Vec<&str> = p.iter().map(|c| c.to_str().expect("from a str")).collect();
        for c in p.components() {
            assert!(
                matches!(c, std::path::Component::Normal(_)),
                "{key:?} gave {p:?}"
            );
        }
        assert_eq!(keypath::plain_key(parts).as_deref(), Some(key));
    }
    let e = keypath::escaped_path(key);
    let parts: Vec<&str> = e
        .iter()
        .skip(1)
        .map(|c| c.to_str().expect("hex is UTF-8"))
        .collect();
    assert_eq!(keypath::decode_escaped(parts).as_deref(), Some(key));
}

/// Tar member indexes of arbitrary bytes: built or refused; a member lies inside them.
pub fn tar_index(data: &[u8]) {
    // SAFETY: memfd_create returns a new descriptor this function owns.
    let fd = unsafe { libc::memfd_create(c"fuzz-tar".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor, owned by the file from here on.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(data).expect("memfd write");
    // The entry's footer follows the object: parsing must stop at the object's end.
    file.write_all(b"GRNRYC01 footer bytes that are no tar header")
        .expect("memfd write");
    if let Ok(index) = granary_core::index_tar(&file, data.len() as u64) {
        for (name, m) in granary_core::members_in_order(&index) {
            let end = m.offset.checked_add(m.size);
            assert!(
                end.is_some_and(|e| e <= data.len() as u64),
                "{name}: {m:?} past {} bytes",
                data.len()
            );
        }
    }
}

/// Images (JPEG, PNG, anything) through step lists: prepared or refused, never a panic
/// ([`granary_prep::fuzz::prep_measured`], inputs whose preparation would take up to 16
/// MiB: the libFuzzer binary and granary-prep's own test hold larger ones to their cost).
pub fn prep(data: &[u8]) {
    granary_prep::fuzz::prep_measured(data, 16 << 20, &|run| {
        run();
        None
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// The seed corpus of a target.
    fn corpus(name: &str) -> Vec<Vec<u8>> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/corpus")
            .join(format!("fuzz_{name}"));
        let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| std::fs::read(e.unwrap().path()).unwrap())
            .collect();
        out.sort();
        out
    }

    /// A small mutator (bit flips, byte sets, inserts, deletes, splices), seeded.
    fn mutate(seed: &mut u64, input: &[u8], other: &[u8]) -> Vec<u8> {
        let mut next = || {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*seed >> 33) as usize
        };
        let mut v = input.to_vec();
        for _ in 0..1 + next() % 4 {
            let at = if v.is_empty() { 0 } else { next() % v.len() };
            match next() % 6 {
                0 if !v.is_empty() => v[at] ^= 1 << (next() % 8),
                1 if !v.is_empty() => v[at] = b"\0\r\n-=;,/.:0129aAfFxX\xff"[next() % 21],
                2 => v.insert(at, (next() % 256) as u8),
                3 if !v.is_empty() => {
                    v.remove(at);
                }
                4 if !other.is_empty() => {
                    let from = next() % other.len();
                    let len = (next() % 64).min(other.len() - from);
                    v.splice(at..at, other[from..from + len].iter().copied());
                }
                _ => v.truncate(at),
            }
        }
        v
    }

    #[test]
    fn every_target_survives_its_corpus_and_mutations_of_it() {
        for (name, target) in TARGETS {
            let seeds = corpus(name);
            assert!(!seeds.is_empty(), "{name} has no seeds");
            let mut seed = 0x9e37_79b9_7f4a_7c15;
            for s in &seeds {
                target(s);
            }
            for i in 0..20_000 {
                let a = &seeds[i % seeds.len()];
                let b = &seeds[(i * 7 + 3) % seeds.len()];
                target(&mutate(&mut seed, a, b));
            }
        }
    }
}
