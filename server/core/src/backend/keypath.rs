//! How an S3 key becomes a path under its bucket's folder, and back.
//!
//! An ordinary key `a/b/c` is the file `a/b/c`, so a folder of files dropped into the
//! backend is served as is. A key that cannot be a plain path is stored by an escape
//! under `.granary-keys/`: its UTF-8 bytes in lower-case hex, cut into 128-character
//! folder names, the last piece a file named `<hex>.k`. Keys escape when
//! - a segment is empty (`a//b`, a leading or trailing `/`), `.` or `..`, longer than 255
//!   bytes, or starts with `.granary` (reserved for this layout);
//! - or the plain path is taken by the other kind of entry: key `a` while folder `a/`
//!   holds `a/b`, or key `a/b` while the file `a` is key `a`.
//!
//! Either way every path stays inside the bucket folder: no segment of a plain path can
//! climb, and an escaped path is hex.

use std::path::PathBuf;

/// The folder under a bucket that holds escaped keys.
pub const ESCAPE_DIR: &str = ".granary-keys";
/// Names starting with this are never plain key segments.
pub const RESERVED: &str = ".granary";
const CHUNK: usize = 128;
const SUFFIX: &str = ".k";

/// The plain relative path of `key`, or `None` when the key must be escaped.
pub fn plain_path(key: &str) -> Option<PathBuf> {
    let mut path = PathBuf::new();
    for seg in key.split('/') {
        if seg.is_empty()
            || seg == "."
            || seg == ".."
            || seg.len() > 255
            || seg.starts_with(RESERVED)
            || seg.contains('\0')
        {
            return None;
        }
        path.push(seg);
    }
    Some(path)
}

/// The escaped relative path of `key`.
pub fn escaped_path(key: &str) -> PathBuf {
    let hex = hex::encode(key.as_bytes());
    let mut path = PathBuf::from(ESCAPE_DIR);
    let mut rest = hex.as_str();
    while rest.len() > CHUNK {
        let (head, tail) = rest.split_at(CHUNK);
        path.push(head);
        rest = tail;
    }
    path.push(format!("{rest}{SUFFIX}"));
    path
}

/// The key of an escaped file, given the path components below `ESCAPE_DIR`.
pub fn decode_escaped<'a>(components: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let parts: Vec<&str> = components.into_iter().collect();
    let (last, dirs) = parts.split_last()?;
    let last = last.strip_suffix(SUFFIX)?;
    if last.is_empty() || last.len() > CHUNK || dirs.iter().any(|d| d.len() != CHUNK) {
        return None;
    }
    let mut hex = String::with_capacity(dirs.len() * CHUNK + last.len());
    for d in dirs {
        hex.push_str(d);
    }
    hex.push_str(last);
    let bytes = hex::decode(hex).ok()?;
    String::from_utf8(bytes).ok()
}

/// The plain key of a file at `components` (relative to the bucket), if it names one:
/// entries this layout reserves, and names that are not UTF-8, are not keys.
pub fn plain_key<'a>(components: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut key = String::new();
    for (i, c) in components.into_iter().enumerate() {
        if c.starts_with(RESERVED) {
            return None;
        }
        if i > 0 {
            key.push('/');
        }
        key.push_str(c);
    }
    (!key.is_empty()).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_keys_are_paths() {
        assert_eq!(plain_path("a/b/c"), Some(PathBuf::from("a/b/c")));
        assert_eq!(
            plain_path("shard-000001.tar"),
            Some(PathBuf::from("shard-000001.tar"))
        );
        assert_eq!(
            plain_path("with space/été ☃"),
            Some(PathBuf::from("with space/été ☃"))
        );
        for k in [
            "a//b",
            "/abs",
            "dir/",
            "./x",
            "x/../y",
            "..",
            ".granary-keys/x",
        ] {
            assert_eq!(plain_path(k), None, "{k}");
        }
        assert_eq!(plain_path(&"s".repeat(256)), None);
    }

    #[test]
    fn escape_round_trips_and_stays_inside() {
        for k in [
            "../../etc/passwd",
            "/abs",
            "a//b",
            "dir/",
            "x",
            &"z".repeat(1024),
        ] {
            let p = escaped_path(k);
            assert!(p.starts_with(ESCAPE_DIR));
            assert!(p
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_))));
            let comps: Vec<&str> = p
                .components()
                .skip(1)
                .map(|c| c.as_os_str().to_str().unwrap())
                .collect();
            assert_eq!(decode_escaped(comps).as_deref(), Some(k));
        }
        // A key of exactly one chunk and a longer one never collide: files end in `.k`.
        let one = escaped_path(&"a".repeat(64));
        let longer = escaped_path(&"a".repeat(65));
        assert!(!longer.starts_with(&one));
    }

    #[test]
    fn reserved_names_are_not_keys() {
        assert_eq!(plain_key(["a", "b"]).as_deref(), Some("a/b"));
        assert_eq!(plain_key([".granary-keys", "61.k"]), None);
    }
}
