//! The S3 XML documents the client reads: ListObjectsV2 pages, ListBuckets, and error
//! bodies; plus decoding of query strings and HTTP/ISO dates.

use std::time::SystemTime;

use percent_encoding::percent_decode_str;
use serde::Deserialize;

use crate::objects::ObjectInfo;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListBucketResult {
    #[serde(default)]
    contents: Vec<Contents>,
    #[serde(default)]
    common_prefixes: Vec<CommonPrefix>,
    #[serde(default)]
    is_truncated: bool,
    next_continuation_token: Option<String>,
    encoding_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Contents {
    key: String,
    #[serde(default)]
    size: u64,
    #[serde(rename = "ETag", default)]
    etag: String,
    last_modified: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CommonPrefix {
    prefix: String,
}

/// One page of a listing.
#[derive(Debug, Default)]
pub(crate) struct ListPage {
    pub objects: Vec<ObjectInfo>,
    pub prefixes: Vec<String>,
    pub next: Option<String>,
}

/// Parses a ListObjectsV2 page; keys and prefixes are decoded when the page says
/// `EncodingType` is `url`.
pub(crate) fn parse_list(body: &[u8]) -> Result<ListPage, String> {
    let text = std::str::from_utf8(body).map_err(|e| e.to_string())?;
    let r: ListBucketResult = quick_xml::de::from_str(text).map_err(|e| e.to_string())?;
    let url = r
        .encoding_type
        .as_deref()
        .is_some_and(|e| e.eq_ignore_ascii_case("url"));
    let decode = |s: String| -> String {
        if url {
            percent_decode_str(&s).decode_utf8_lossy().into_owned()
        } else {
            s
        }
    };
    let objects = r
        .contents
        .into_iter()
        .map(|c| ObjectInfo {
            key: decode(c.key),
            size: c.size,
            etag: unquote(&c.etag),
            last_modified: c.last_modified.as_deref().and_then(parse_iso8601),
        })
        .collect();
    let prefixes = r
        .common_prefixes
        .into_iter()
        .map(|p| decode(p.prefix))
        .collect();
    let next = r
        .next_continuation_token
        .filter(|t| r.is_truncated && !t.is_empty());
    Ok(ListPage {
        objects,
        prefixes,
        next,
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListAllMyBucketsResult {
    #[serde(default)]
    buckets: Buckets,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct Buckets {
    #[serde(default)]
    bucket: Vec<BucketEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct BucketEntry {
    name: String,
}

/// Bucket names of a ListBuckets answer.
pub(crate) fn parse_buckets(body: &[u8]) -> Result<Vec<String>, String> {
    let text = std::str::from_utf8(body).map_err(|e| e.to_string())?;
    let r: ListAllMyBucketsResult = quick_xml::de::from_str(text).map_err(|e| e.to_string())?;
    Ok(r.buckets.bucket.into_iter().map(|b| b.name).collect())
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ErrorDoc {
    code: String,
    #[serde(default)]
    message: String,
}

/// `(Code, Message)` of an S3 error document, if `body` is one.
pub(crate) fn parse_error(body: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(body).ok()?;
    if !text.contains("<Error>") {
        return None;
    }
    let doc: ErrorDoc = quick_xml::de::from_str(text).ok()?;
    Some((doc.code, doc.message))
}

/// An ETag without its quotes.
pub(crate) fn unquote(etag: &str) -> String {
    etag.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_owned()
}

/// Decoded `(name, value)` pairs of a raw query string.
pub(crate) fn decode_query(query: &str) -> Vec<(String, String)> {
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    query
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// `2024-02-29T12:34:56.000Z` (listings).
pub(crate) fn parse_iso8601(s: &str) -> Option<SystemTime> {
    time::OffsetDateTime::parse(s.trim(), &time::format_description::well_known::Rfc3339)
        .ok()
        .map(SystemTime::from)
}

/// `Thu, 29 Feb 2024 12:34:56 GMT` (`Last-Modified`).
pub(crate) fn parse_http_date(s: &str) -> Option<SystemTime> {
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    time::PrimitiveDateTime::parse(s.trim(), format)
        .ok()
        .map(|t| SystemTime::from(t.assume_utc()))
}

/// RFC 3339 text of a time, to the second, in UTC.
pub fn format_time(t: SystemTime) -> String {
    let format =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    time::OffsetDateTime::from(t)
        .format(format)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn list_pages_parse() {
        let body = br#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix>d%2F</Prefix><MaxKeys>1000</MaxKeys><EncodingType>url</EncodingType><IsTruncated>true</IsTruncated><KeyCount>3</KeyCount><NextContinuationToken>abc</NextContinuationToken><Contents><Key>d/a%20b.tar</Key><LastModified>2024-02-29T12:34:56.000Z</LastModified><ETag>&quot;0123&quot;</ETag><Size>10</Size><StorageClass>STANDARD</StorageClass></Contents><Contents><Key>d/%C3%A9.tar</Key><LastModified>2024-02-29T12:34:56.000Z</LastModified><ETag>"4567-2"</ETag><Size>20</Size><StorageClass>STANDARD</StorageClass></Contents><CommonPrefixes><Prefix>d/sub/</Prefix></CommonPrefixes></ListBucketResult>"#;
        let page = parse_list(body).unwrap();
        assert_eq!(page.objects.len(), 2);
        assert_eq!(page.objects[0].key, "d/a b.tar");
        assert_eq!(page.objects[0].size, 10);
        assert_eq!(page.objects[0].etag, "0123");
        assert_eq!(
            page.objects[0].last_modified,
            Some(UNIX_EPOCH + Duration::from_secs(1_709_210_096))
        );
        assert_eq!(page.objects[1].key, "d/é.tar");
        assert_eq!(page.objects[1].etag, "4567-2");
        assert_eq!(page.prefixes, vec!["d/sub/".to_owned()]);
        assert_eq!(page.next.as_deref(), Some("abc"));
    }

    #[test]
    fn an_empty_last_page_parses() {
        let body = br#"<ListBucketResult><Name>b</Name><Prefix></Prefix><IsTruncated>false</IsTruncated><KeyCount>0</KeyCount></ListBucketResult>"#;
        let page = parse_list(body).unwrap();
        assert!(page.objects.is_empty());
        assert!(page.next.is_none());
    }

    #[test]
    fn bucket_lists_parse() {
        let body = br#"<ListAllMyBucketsResult><Owner><ID>granary</ID></Owner><Buckets><Bucket><Name>a</Name><CreationDate>2024-01-01T00:00:00.000Z</CreationDate></Bucket><Bucket><Name>b</Name></Bucket></Buckets></ListAllMyBucketsResult>"#;
        assert_eq!(parse_buckets(body).unwrap(), vec!["a", "b"]);
        let none = br#"<ListAllMyBucketsResult><Owner><ID>granary</ID></Owner><Buckets></Buckets></ListAllMyBucketsResult>"#;
        assert!(parse_buckets(none).unwrap().is_empty());
    }

    #[test]
    fn error_documents_parse() {
        let body = b"<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>no &amp; no</Message><RequestId>1</RequestId></Error>";
        assert_eq!(
            parse_error(body),
            Some(("AccessDenied".into(), "no & no".into()))
        );
        assert_eq!(parse_error(b"{\"error\":1}"), None);
    }

    #[test]
    fn dates_parse() {
        let t = UNIX_EPOCH + Duration::from_secs(1_709_210_096);
        assert_eq!(parse_http_date("Thu, 29 Feb 2024 12:34:56 GMT"), Some(t));
        assert_eq!(format_time(t), "2024-02-29T12:34:56Z");
        assert_eq!(parse_http_date("yesterday"), None);
    }
}
