//! The object set of a run: listed with ListObjectsV2 or named `PREFIX{i:06}`.
//!
//! The listing parser scans the XML as text: it only needs `<Key>`, `<Size>`,
//! `<IsTruncated>` and `<NextContinuationToken>`, and stays independent of any one
//! server's namespace or formatting.

use crate::size::SizeRange;

/// One object to read or write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub key: String,
    /// Size in bytes; 0 when not known (a plain GET of a named key).
    pub size: u64,
}

/// The objects `P000000`, `P000001`, …, each of a size drawn uniformly from
/// `sizes` (seeded, so a PUT run and a later GET run agree on them).
pub fn generated(prefix: &str, count: usize, sizes: SizeRange, seed: u64) -> Vec<Object> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x0B1E_C751_2E5D);
    (0..count)
        .map(|i| Object {
            key: format!("{prefix}{i:06}"),
            size: if sizes.min == sizes.max {
                sizes.min
            } else {
                rng.gen_range(sizes.min..=sizes.max)
            },
        })
        .collect()
}

/// One page of a ListObjectsV2 answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    pub objects: Vec<Object>,
    /// The token for the next page when the listing is truncated.
    pub next_token: Option<String>,
}

/// Parses one ListObjectsV2 page.
pub fn parse_list_page(xml: &str) -> anyhow::Result<ListPage> {
    if xml.contains("<Error>") {
        let code = element(xml, "Code").unwrap_or_default();
        let msg = element(xml, "Message").unwrap_or_default();
        anyhow::bail!("listing failed: {code} {msg}");
    }
    let mut page = ListPage::default();
    let mut rest = xml;
    while let Some(start) = rest.find("<Contents>") {
        let after = &rest[start + "<Contents>".len()..];
        let end = after
            .find("</Contents>")
            .ok_or_else(|| anyhow::anyhow!("listing: <Contents> without </Contents>"))?;
        let block = &after[..end];
        let key = element(block, "Key")
            .ok_or_else(|| anyhow::anyhow!("listing: <Contents> without <Key>"))?;
        let size = match element(block, "Size") {
            Some(s) => s
                .trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("listing: bad <Size> {s:?}"))?,
            None => 0,
        };
        page.objects.push(Object { key, size });
        rest = &after[end..];
    }
    let truncated = element(xml, "IsTruncated").is_some_and(|t| t.trim() == "true");
    if truncated {
        page.next_token = element(xml, "NextContinuationToken").filter(|t| !t.is_empty());
        if page.next_token.is_none() {
            anyhow::bail!("listing is truncated but has no NextContinuationToken");
        }
    }
    Ok(page)
}

/// The unescaped text of the first `<name>…</name>` in `xml`.
fn element(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = xml.find(&open)? + open.len();
    let len = xml[start..].find(&close)?;
    Some(unescape(&xml[start..start + len]))
}

/// Undoes XML escaping: the five named entities and numeric references.
pub fn unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let Some(semi) = tail.find(';') else {
            out.push_str(tail);
            return out;
        };
        let ent = &tail[1..semi];
        let ch = match ent {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => ent
                .strip_prefix("#x")
                .or_else(|| ent.strip_prefix("#X"))
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match ch {
            Some(c) => {
                out.push(c);
                rest = &tail[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Percent-encodes a value for a URL path (keeping `/`) or a query (`keep_slash` false).
pub fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE1: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>bkt</Name><Prefix>d/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <Contents><Key>d/a&amp;b.tar</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>
    <ETag>&quot;0123&quot;</ETag><Size>1048576</Size><StorageClass>STANDARD</StorageClass></Contents>
  <Contents>
    <Key>d/caf&#233; &lt;1&gt;</Key>
    <Size>7</Size>
  </Contents>
  <NextContinuationToken>tok+/=1</NextContinuationToken>
</ListBucketResult>"#;

    #[test]
    fn parses_keys_sizes_and_token() {
        let p = parse_list_page(PAGE1).unwrap();
        assert_eq!(p.objects.len(), 2);
        assert_eq!(p.objects[0].key, "d/a&b.tar");
        assert_eq!(p.objects[0].size, 1_048_576);
        assert_eq!(p.objects[1].key, "d/café <1>");
        assert_eq!(p.objects[1].size, 7);
        assert_eq!(p.next_token.as_deref(), Some("tok+/=1"));
    }

    #[test]
    fn last_page_and_empty() {
        let last = "<ListBucketResult><IsTruncated>false</IsTruncated>\
                    <Contents><Key>x</Key><Size>3</Size></Contents></ListBucketResult>";
        let p = parse_list_page(last).unwrap();
        assert_eq!(
            p.objects,
            vec![Object {
                key: "x".into(),
                size: 3
            }]
        );
        assert_eq!(p.next_token, None);
        let empty = "<ListBucketResult><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated></ListBucketResult>";
        assert_eq!(parse_list_page(empty).unwrap().objects.len(), 0);
    }

    #[test]
    fn errors_are_reported() {
        let err = "<Error><Code>NoSuchBucket</Code><Message>no such bucket</Message></Error>";
        let e = parse_list_page(err).unwrap_err().to_string();
        assert!(e.contains("NoSuchBucket"), "{e}");
        assert!(parse_list_page("<IsTruncated>true</IsTruncated>").is_err());
        assert!(parse_list_page("<Contents><Size>1</Size></Contents>").is_err());
    }

    #[test]
    fn generated_names() {
        let fixed = SizeRange { min: 10, max: 10 };
        let g = generated("p/", 3, fixed, 1);
        assert_eq!(g.len(), 3);
        assert_eq!(g[0].key, "p/000000");
        assert_eq!(g[2].key, "p/000002");
        assert!(g.iter().all(|o| o.size == 10));
        let range = SizeRange { min: 100, max: 200 };
        let a = generated("p/", 50, range, 7);
        assert!(a.iter().all(|o| (100..=200).contains(&o.size)));
        assert!(a.iter().any(|o| o.size != a[0].size), "sizes vary");
        assert_eq!(a, generated("p/", 50, range, 7), "same seed, same sizes");
    }

    #[test]
    fn encoding() {
        assert_eq!(encode("a b/c+d", true), "a%20b/c%2Bd");
        assert_eq!(encode("a/b", false), "a%2Fb");
        assert_eq!(unescape("a&amp;&#x41;&bogus;"), "a&A&bogus;");
    }
}
