//! Keys, paths and query strings on the wire: S3 clients encode every byte but the
//! unreserved characters `A-Za-z0-9-._~` (and `/` in paths), which is also SigV4's
//! canonical form. One set of encoders for everything the workspace sends and reads.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Everything but the unreserved characters `A-Za-z0-9-._~`.
pub const AWS_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');
/// The same, keeping `/` (for paths).
pub const AWS_ENCODE_PATH: &AsciiSet = &AWS_ENCODE.remove(b'/');

/// A query name or value, encoded.
pub fn query_value(s: &str) -> String {
    utf8_percent_encode(s, AWS_ENCODE).to_string()
}

/// A key (or any path part), encoded, `/` kept.
pub fn path(s: &str) -> String {
    utf8_percent_encode(s, AWS_ENCODE_PATH).to_string()
}

/// `/bucket/key`, encoded.
pub fn object_path(bucket: &str, key: &str) -> String {
    format!("/{}/{}", path(bucket), path(key))
}

/// `name=value&…` of decoded pairs, each encoded, in the order given.
pub fn query_string<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (k, v) in pairs {
        if !out.is_empty() {
            out.push('&');
        }
        out.push_str(&query_value(k));
        out.push('=');
        out.push_str(&query_value(v));
    }
    out
}

/// Percent-decodes, replacing bytes that are not UTF-8.
pub fn decode(s: &str) -> String {
    percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// Decoded `(name, value)` pairs of a raw query string, in order.
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// Whether a raw query string has a parameter `name`.
pub fn query_has(query: &str, name: &str) -> bool {
    query
        .split('&')
        .any(|kv| kv.split('=').next() == Some(name))
}

/// A path whose decoded bytes are not UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotUtf8;

/// Percent-decodes; bytes that are not UTF-8 are an error.
pub fn decode_exact(s: &str) -> Result<String, NotUtf8> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| NotUtf8)
}

/// Splits a raw path-style path into its bucket and decoded key (`None`: a bucket or
/// the root).
pub fn split_path(raw: &str) -> Result<(String, Option<String>), NotUtf8> {
    let rest = raw.strip_prefix('/').unwrap_or(raw);
    let (bucket, key) = match rest.split_once('/') {
        Some((b, k)) => (b, (!k.is_empty()).then_some(k)),
        None => (rest, None),
    };
    Ok((decode_exact(bucket)?, key.map(decode_exact).transpose()?))
}

/// An ETag without its quotes (or a weak marker).
pub fn unquote(etag: &str) -> &str {
    etag.trim().trim_start_matches("W/").trim_matches('"')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_encoded_like_s3_clients_do() {
        assert_eq!(object_path("b", "a b/c+d~"), "/b/a%20b/c%2Bd~");
        assert_eq!(object_path("b", "ü/%"), "/b/%C3%BC/%25");
        assert_eq!(query_value("x&y=1.jpg"), "x%26y%3D1.jpg");
        assert_eq!(
            query_string([("prefix", "x y"), ("list-type", "2")]),
            "prefix=x%20y&list-type=2"
        );
    }

    #[test]
    fn queries_decode() {
        assert_eq!(
            query_pairs("a=1&b=x%20y&c&d=%2F"),
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "x y".into()),
                ("c".into(), "".into()),
                ("d".into(), "/".into())
            ]
        );
        assert!(query_has("uploads&x=1", "uploads"));
        assert!(!query_has("uploadsx=1", "uploads"));
    }

    #[test]
    fn paths_split_into_bucket_and_key() {
        assert_eq!(split_path("/").unwrap(), ("".into(), None));
        assert_eq!(split_path("/b").unwrap(), ("b".into(), None));
        assert_eq!(split_path("/b/").unwrap(), ("b".into(), None));
        assert_eq!(
            split_path("/b/a%20b/c+d%2B").unwrap(),
            ("b".into(), Some("a b/c+d+".into()))
        );
        assert_eq!(
            split_path("/b/..%2f..%2fx").unwrap(),
            ("b".into(), Some("../../x".into()))
        );
        assert_eq!(
            split_path("/b//x").unwrap(),
            ("b".into(), Some("/x".into()))
        );
        assert!(split_path("/b/%ff").is_err());
    }

    #[test]
    fn etags_unquote() {
        assert_eq!(unquote("\"abc\""), "abc");
        assert_eq!(unquote("W/\"abc\" "), "abc");
        assert_eq!(unquote("abc"), "abc");
    }
}
