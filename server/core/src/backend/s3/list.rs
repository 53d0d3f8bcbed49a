//! Listing helpers: S3's pages of keys and common prefixes merged into one ordered page,
//! resumed after a common prefix, and ListParts read leniently.

use aws_sdk_s3::error::SdkError;
use aws_sdk_s3::primitives::DateTime;

use super::{time, unquote, HttpResponse};
use crate::backend::{ListPage, ListQuery, ObjectEntry, PartInfo};

/// An entry of a listing page: a key or a rolled-up common prefix.
#[derive(Debug)]
pub(super) enum Entry {
    Object(ObjectEntry),
    Prefix(String),
}

impl Entry {
    pub(super) fn name(&self) -> &str {
        match self {
            Entry::Object(o) => &o.key,
            Entry::Prefix(p) => p,
        }
    }
}

/// Keys and common prefixes of one S3 page merged in byte order (S3 sends two sorted lists).
pub(super) fn merge(objects: Vec<ObjectEntry>, prefixes: Vec<String>) -> Vec<Entry> {
    let mut out = Vec::with_capacity(objects.len() + prefixes.len());
    let mut objects = objects.into_iter().peekable();
    let mut prefixes = prefixes.into_iter().peekable();
    loop {
        let take_object = match (objects.peek(), prefixes.peek()) {
            (Some(o), Some(p)) => o.key.as_str() < p.as_str(),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        if take_object {
            out.extend(objects.next().map(Entry::Object));
        } else {
            out.extend(prefixes.next().map(Entry::Prefix));
        }
    }
    out
}

/// Decodes a name of a listing asked with `encoding-type=url` (S3 writes a space as `+`).
pub(super) fn url_decode(s: &str) -> String {
    granary_proto::encode::decode(&s.replace('+', " "))
}

/// The common prefix `after` stands for, if it is one: it ends with the delimiter and is
/// longer than the query's prefix (a key equal to the prefix is just a key).
pub(super) fn rolled<'a>(after: Option<&'a str>, q: &ListQuery) -> Option<&'a str> {
    let d = q.delimiter.as_deref().filter(|d| !d.is_empty())?;
    after.filter(|a| a.ends_with(d) && a.len() > q.prefix.len())
}

/// Adds the entries of one S3 page to `page`, skipping those under `skip` (a common prefix
/// S3 repeats after a start-after equal to it). Returns false once `page` is full; it is
/// then marked truncated if an entry was left over.
pub(super) fn fill(
    page: &mut ListPage,
    entries: Vec<Entry>,
    skip: Option<&str>,
    max: usize,
) -> bool {
    for e in entries {
        if skip.is_some_and(|s| e.name().starts_with(s)) {
            continue;
        }
        if page.objects.len() + page.common_prefixes.len() == max {
            page.is_truncated = true;
            return false;
        }
        page.last = Some(e.name().to_owned());
        match e {
            Entry::Object(o) => page.objects.push(o),
            Entry::Prefix(p) => page.common_prefixes.push(p),
        }
    }
    true
}

/// One page of ListParts.
pub(super) struct PartsPage {
    pub(super) parts: Vec<PartInfo>,
    pub(super) truncated: bool,
    pub(super) next: Option<String>,
}

/// ListParts as moto (5.2) answers it: right fields under a root named
/// `ListPartsResponse`, where S3 says `ListPartsResult` and the SDK insists on it. A 200
/// the SDK refused is read again here, whatever its root is called.
pub(super) fn lenient_parts<E>(e: &SdkError<E, HttpResponse>) -> Option<PartsPage> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Doc {
        #[serde(default, rename = "Part")]
        parts: Vec<Part>,
        #[serde(default)]
        is_truncated: bool,
        next_part_number_marker: Option<String>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Part {
        part_number: u32,
        #[serde(rename = "ETag")]
        etag: String,
        size: u64,
        last_modified: Option<String>,
    }
    let SdkError::ServiceError(ctx) = e else {
        return None;
    };
    if !ctx.raw().status().is_success() {
        return None;
    }
    let doc: Doc = granary_proto::xml::parse(ctx.raw().body().bytes()?).ok()?;
    Some(PartsPage {
        parts: doc
            .parts
            .into_iter()
            .map(|p| PartInfo {
                number: p.part_number,
                etag: unquote(Some(&p.etag)),
                size: p.size,
                last_modified: time(
                    p.last_modified
                        .and_then(|t| {
                            DateTime::from_str(&t, aws_sdk_s3::primitives::DateTimeFormat::DateTime)
                                .ok()
                        })
                        .as_ref(),
                ),
                checksum: None,
            })
            .collect(),
        truncated: doc.is_truncated,
        next: doc.next_part_number_marker,
    })
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn obj(key: &str) -> ObjectEntry {
        ObjectEntry {
            key: key.into(),
            size: 1,
            etag: "e".into(),
            last_modified: UNIX_EPOCH,
        }
    }

    fn names(page: &ListPage) -> Vec<String> {
        let mut v: Vec<String> = page
            .objects
            .iter()
            .map(|o| o.key.clone())
            .chain(page.common_prefixes.iter().cloned())
            .collect();
        v.sort();
        v
    }
    #[test]
    fn pages_merge_in_byte_order_and_skip_a_repeated_prefix() {
        let entries = merge(
            vec![obj("a"), obj("c"), obj("e")],
            vec!["b/".into(), "d/".into()],
        );
        let order: Vec<&str> = entries.iter().map(Entry::name).collect();
        assert_eq!(order, ["a", "b/", "c", "d/", "e"]);

        let mut page = ListPage::default();
        assert!(!fill(&mut page, entries, Some("b/"), 2));
        assert_eq!(names(&page), ["a", "c"]);
        assert!(page.is_truncated);
        assert_eq!(page.last.as_deref(), Some("c"));

        let mut page = ListPage::default();
        let entries = merge(vec![obj("x")], vec!["d/".into()]);
        assert!(fill(&mut page, entries, Some("d/"), 5));
        assert_eq!(names(&page), ["x"]);
        assert!(!page.is_truncated);
    }

    #[test]
    fn after_is_rolled_only_past_the_prefix() {
        let q = ListQuery {
            prefix: "dir/".into(),
            delimiter: Some("/".into()),
            after: None,
            max_keys: 10,
        };
        assert_eq!(rolled(Some("dir/sub/"), &q), Some("dir/sub/"));
        assert_eq!(rolled(Some("dir/"), &q), None);
        assert_eq!(rolled(Some("dir/key"), &q), None);
        let no_delim = ListQuery {
            delimiter: None,
            ..q
        };
        assert_eq!(rolled(Some("dir/sub/"), &no_delim), None);
    }

    #[test]
    fn url_encoded_names_decode() {
        assert_eq!(url_decode("a+b%2Bc%2Fd/%E2%82%AC"), "a b+c/d/€");
        assert_eq!(url_decode("plain/key"), "plain/key");
    }
}
