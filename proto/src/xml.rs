//! S3's XML, both ways: a small writer for the node's answers, a guarded reader for the
//! request bodies it takes (DeleteObjects, CompleteMultipartUpload), and the answers
//! clients read (listings, bucket lists, error documents).

use std::time::SystemTime;

use serde::Deserialize;

pub const XMLNS: &str = "http://s3.amazonaws.com/doc/2006-03-01/";

/// A body that is not the XML it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XmlError(pub String);

impl std::fmt::Display for XmlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for XmlError {}

/// Appends `text` with XML's five special characters escaped. Control characters, which
/// XML 1.0 cannot carry, become character references as S3 writes them in listings
/// (clients that may meet them ask for `encoding-type=url`).
pub fn escape_into(out: &mut String, text: &str) {
    escape(out, text, false)
}

/// Like `escape_into`, but control characters become `%XX`, so that the document parses
/// everywhere: for error documents, which name a key the client sent.
pub fn escape_lossy_into(out: &mut String, text: &str) {
    escape(out, text, true)
}

fn escape(out: &mut String, text: &str, percent_controls: bool) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 cannot carry most control characters; S3 writes them as references.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => {
                if percent_controls {
                    out.push_str(&format!("%{:02X}", c as u32));
                } else {
                    out.push_str(&format!("&#x{:X};", c as u32));
                }
            }
            c => out.push(c),
        }
    }
}

/// A response document under construction.
pub struct Doc(String);

impl Doc {
    /// Starts a document whose root element is `root` in S3's namespace.
    pub fn new(root: &str) -> Doc {
        let mut s = String::with_capacity(1024);
        s.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<");
        s.push_str(root);
        s.push_str(" xmlns=\"");
        s.push_str(XMLNS);
        s.push_str("\">");
        Doc(s)
    }

    pub fn open(&mut self, tag: &str) -> &mut Doc {
        self.0.push('<');
        self.0.push_str(tag);
        self.0.push('>');
        self
    }

    /// `<tag a="v" ...>`, the values escaped.
    pub fn open_with(&mut self, tag: &str, attrs: &[(&str, &str)]) -> &mut Doc {
        self.0.push('<');
        self.0.push_str(tag);
        for (name, value) in attrs {
            self.0.push(' ');
            self.0.push_str(name);
            self.0.push_str("=\"");
            escape_into(&mut self.0, value);
            self.0.push('"');
        }
        self.0.push('>');
        self
    }

    pub fn close(&mut self, tag: &str) -> &mut Doc {
        self.0.push_str("</");
        self.0.push_str(tag);
        self.0.push('>');
        self
    }

    /// `<tag>text</tag>`, escaped.
    pub fn elem(&mut self, tag: &str, text: &str) -> &mut Doc {
        self.open(tag);
        escape_into(&mut self.0, text);
        self.close(tag)
    }

    pub fn time(&mut self, tag: &str, t: SystemTime) -> &mut Doc {
        self.elem(tag, &iso8601(t))
    }

    pub fn finish(mut self, root: &str) -> String {
        self.close(root);
        self.0
    }
}

/// An S3 error document: `<Error><Code>…</Code><Message>…</Message>…</Error>`.
pub fn error_doc(
    code: &str,
    message: &str,
    resource: Option<&str>,
    details: &[(&str, String)],
    request_id: &str,
) -> String {
    let mut s = String::with_capacity(256);
    s.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>");
    s.push_str(code);
    s.push_str("</Code><Message>");
    escape_lossy_into(&mut s, message);
    s.push_str("</Message>");
    if let Some(r) = resource {
        s.push_str("<Resource>");
        escape_lossy_into(&mut s, r);
        s.push_str("</Resource>");
    }
    // The fields some codes carry (`ActualObjectSize` with `InvalidRange`, ...).
    for (tag, text) in details {
        s.push('<');
        s.push_str(tag);
        s.push('>');
        escape_lossy_into(&mut s, text);
        s.push_str("</");
        s.push_str(tag);
        s.push('>');
    }
    s.push_str("<RequestId>");
    s.push_str(request_id);
    s.push_str("</RequestId></Error>");
    s
}

/// `2009-10-12T17:50:30.000Z`, as S3 writes times in XML.
pub fn iso8601(t: SystemTime) -> String {
    let dt = time::OffsetDateTime::from(t);
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    dt.format(&fmt).unwrap_or_default()
}

/// Parses an RFC 3339 time as listings write it (`2024-02-29T12:34:56.000Z`).
pub fn parse_iso8601(s: &str) -> Option<SystemTime> {
    time::OffsetDateTime::parse(s.trim(), &time::format_description::well_known::Rfc3339)
        .ok()
        .map(SystemTime::from)
}

/// Parses a request body as `T`. Document type declarations are refused: S3's bodies
/// have none, and they are where XML parsers are weakest (entity expansion, and a
/// deserializer panic fuzzing found). Only comments and CDATA may follow `<!`.
pub fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, XmlError> {
    let text = checked_text(body)?;
    // Defence in depth: a parser panic on some other input is a refused body, not a
    // dropped connection.
    match std::panic::catch_unwind(|| quick_xml::de::from_str::<T>(text)) {
        Ok(parsed) => parsed.map_err(|e| XmlError(e.to_string())),
        Err(_) => Err(XmlError("the parser gave up on it".into())),
    }
}

/// A body as UTF-8 text with no document type declaration.
fn checked_text(body: &[u8]) -> Result<&str, XmlError> {
    let text =
        std::str::from_utf8(body).map_err(|_| XmlError("the XML body is not UTF-8".into()))?;
    let declares = text.match_indices("<!").any(|(i, _)| {
        let rest = &text[i + 2..];
        !(rest.starts_with("--") || rest.starts_with("[CDATA["))
    });
    if declares {
        return Err(XmlError(
            "document type declarations are not accepted".into(),
        ));
    }
    Ok(text)
}

/// The body of DeleteObjects.
#[derive(Debug, Default)]
pub struct Delete {
    pub objects: Vec<DeleteObject>,
    pub quiet: bool,
}

#[derive(Debug)]
pub struct DeleteObject {
    pub key: String,
}

impl Delete {
    /// Parses a DeleteObjects body. Keys are bytes: their white space is theirs (the
    /// serde reader trims text, which turned key `" "` into an empty one).
    pub fn parse(body: &[u8]) -> Result<Delete, XmlError> {
        use quick_xml::events::Event;
        let text = checked_text(body)?;
        let mut reader = quick_xml::Reader::from_str(text);
        reader.config_mut().trim_text(false);
        let bad = |e: &dyn std::fmt::Display| XmlError(e.to_string());
        let mut path: Vec<Vec<u8>> = Vec::new();
        let mut text = String::new();
        let mut key: Option<String> = None;
        let mut out = Delete::default();
        let mut rooted = false;
        loop {
            match reader.read_event().map_err(|e| bad(&e))? {
                Event::Start(e) => {
                    path.push(e.local_name().as_ref().to_vec());
                    rooted = true;
                    text.clear();
                }
                Event::Empty(e)
                    if path_is(&path, &[b"Delete", b"Object"])
                        && e.local_name().as_ref() == b"Key" =>
                {
                    key = Some(String::new());
                }
                Event::Text(t) => text.push_str(&t.unescape().map_err(|e| bad(&e))?),
                Event::CData(t) => text.push_str(
                    std::str::from_utf8(&t).map_err(|_| XmlError("CDATA is not UTF-8".into()))?,
                ),
                Event::End(_) => {
                    if path_is(&path, &[b"Delete", b"Object", b"Key"]) {
                        key = Some(std::mem::take(&mut text));
                    } else if path_is(&path, &[b"Delete", b"Object"]) {
                        let key = key
                            .take()
                            .ok_or_else(|| XmlError("an Object without a Key".into()))?;
                        out.objects.push(DeleteObject { key });
                    } else if path_is(&path, &[b"Delete", b"Quiet"]) {
                        out.quiet = text.trim() == "true";
                    }
                    path.pop();
                    text.clear();
                }
                Event::Eof => break,
                _ => {}
            }
            if path.first().is_some_and(|root| root != b"Delete") {
                return Err(XmlError("the document is not a Delete".into()));
            }
        }
        if !rooted || !path.is_empty() {
            return Err(XmlError("the document is not one whole Delete".into()));
        }
        Ok(out)
    }
}

fn path_is(path: &[Vec<u8>], want: &[&[u8]]) -> bool {
    path.len() == want.len() && path.iter().zip(want).all(|(a, b)| a == b)
}

/// The body of CompleteMultipartUpload.
#[derive(Debug, Deserialize)]
pub struct CompleteMultipartUpload {
    #[serde(rename = "Part", default)]
    pub parts: Vec<CompletedPart>,
}

#[derive(Debug, Deserialize)]
pub struct CompletedPart {
    #[serde(rename = "PartNumber")]
    pub number: u32,
    #[serde(rename = "ETag")]
    pub etag: String,
}

/// The text of every element named `tag` in a document, in order, unescaped; empty when
/// the document does not parse.
pub fn elements(doc: &str, tag: &str) -> Vec<String> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(doc);
    let mut out = Vec::new();
    let mut inside: Option<String> = None;
    let mut depth = 0usize;
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) => {
                if let Some(text) = inside.as_mut() {
                    depth += 1;
                    let _ = text;
                } else if e.local_name().as_ref() == tag.as_bytes() {
                    inside = Some(String::new());
                    depth = 0;
                }
            }
            Ok(Event::Empty(e))
                if inside.is_none() && e.local_name().as_ref() == tag.as_bytes() =>
            {
                out.push(String::new());
            }
            Ok(Event::Text(t)) => {
                if let Some(text) = inside.as_mut() {
                    match t.unescape() {
                        Ok(s) => text.push_str(&s),
                        Err(_) => text.push_str(&String::from_utf8_lossy(&t)),
                    }
                }
            }
            Ok(Event::CData(t)) => {
                if let Some(text) = inside.as_mut() {
                    text.push_str(&String::from_utf8_lossy(&t));
                }
            }
            Ok(Event::End(_)) => {
                if inside.is_some() {
                    if depth == 0 {
                        out.extend(inside.take());
                    } else {
                        depth -= 1;
                    }
                }
            }
            Ok(Event::Eof) | Err(_) => return out,
            Ok(_) => {}
        }
    }
}

/// The text of the first element named `tag`.
pub fn element(doc: &str, tag: &str) -> Option<String> {
    elements(doc, tag).into_iter().next()
}

/// `(Code, Message)` of an S3 error document, if `body` is one.
pub fn parse_error(body: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(body).ok()?;
    if !text.contains("<Error>") {
        return None;
    }
    let code = element(text, "Code")?;
    Some((code, element(text, "Message").unwrap_or_default()))
}

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub size: u64,
    /// Without quotes.
    pub etag: String,
    pub last_modified: Option<SystemTime>,
}

/// One page of a ListObjects (v1 or v2) answer, keys decoded when the page says
/// `EncodingType` is `url`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ListPage {
    pub objects: Vec<Listed>,
    pub prefixes: Vec<String>,
    pub is_truncated: bool,
    /// v2's token for the next page.
    pub next_token: Option<String>,
    /// v1's marker for the next page.
    pub next_marker: Option<String>,
}

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
    next_marker: Option<String>,
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

impl ListPage {
    /// Parses a listing page; an error document or anything else is an error.
    pub fn parse(body: &[u8]) -> Result<ListPage, XmlError> {
        if let Some((code, message)) = parse_error(body) {
            return Err(XmlError(format!("listing failed: {code} {message}")));
        }
        let text = std::str::from_utf8(body).map_err(|e| XmlError(e.to_string()))?;
        if !text.contains("<ListBucketResult") {
            return Err(XmlError("not a ListBucketResult".into()));
        }
        let r: ListBucketResult =
            quick_xml::de::from_str(text).map_err(|e| XmlError(e.to_string()))?;
        let url = r
            .encoding_type
            .as_deref()
            .is_some_and(|e| e.eq_ignore_ascii_case("url"));
        let decode = |s: String| if url { crate::encode::decode(&s) } else { s };
        Ok(ListPage {
            objects: r
                .contents
                .into_iter()
                .map(|c| Listed {
                    key: decode(c.key),
                    size: c.size,
                    etag: crate::encode::unquote(&c.etag).to_owned(),
                    last_modified: c.last_modified.as_deref().and_then(parse_iso8601),
                })
                .collect(),
            prefixes: r
                .common_prefixes
                .into_iter()
                .map(|p| decode(p.prefix))
                .collect(),
            is_truncated: r.is_truncated,
            next_token: r.next_continuation_token.filter(|t| !t.is_empty()),
            next_marker: r.next_marker.filter(|t| !t.is_empty()).map(decode),
        })
    }
}

/// Bucket names of a ListBuckets answer.
pub fn parse_buckets(body: &[u8]) -> Result<Vec<String>, XmlError> {
    let text = std::str::from_utf8(body).map_err(|e| XmlError(e.to_string()))?;
    if !text.contains("ListAllMyBucketsResult") {
        return Err(XmlError("not a ListAllMyBucketsResult".into()));
    }
    Ok(elements(text, "Name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_delete() {
        let d = Delete::parse(
            br#"<?xml version="1.0"?><Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Object><Key>a&amp;b</Key></Object><Object><Key>c</Key><VersionId>x</VersionId></Object><Quiet>true</Quiet></Delete>"#,
        )
        .unwrap();
        assert_eq!(d.objects.len(), 2);
        assert_eq!(d.objects[0].key, "a&b");
        assert!(d.quiet);
        // Keys keep their white space.
        let d = Delete::parse(
            b"<Delete><Object><Key> </Key></Object><Object><Key>_ </Key></Object><Object><Key>\n a\t</Key></Object></Delete>",
        )
        .unwrap();
        let keys: Vec<&str> = d.objects.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, [" ", "_ ", "\n a\t"]);
        assert!(!d.quiet);
    }

    #[test]
    fn parses_complete() {
        let c: CompleteMultipartUpload = parse(
            br#"<CompleteMultipartUpload><Part><ETag>"abc"</ETag><PartNumber>1</PartNumber><ChecksumCRC32>x</ChecksumCRC32></Part><Part><PartNumber>2</PartNumber><ETag>def</ETag></Part></CompleteMultipartUpload>"#,
        )
        .unwrap();
        assert_eq!(c.parts.len(), 2);
        assert_eq!(c.parts[0].number, 1);
        assert_eq!(c.parts[0].etag, "\"abc\"");
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            &b"not xml"[..],
            b"<Delete><Object><Key>a</Key>",
            b"\xff\xfe",
            b"<Complete><Part><PartNumber>x</PartNumber></Part></Complete>",
        ] {
            assert!(Delete::parse(bad).is_err() || parse::<CompleteMultipartUpload>(bad).is_err());
        }
        assert!(Delete::parse(b"<Delete><Object><Key>a</Key>").is_err());
    }

    #[test]
    fn declarations_are_refused() {
        assert!(Delete::parse(b"<!DOCTYPE d [<!ENTITY a \"x\">]><Delete/>").is_err());
        assert!(Delete::parse(b"<Delete><!DOCTyPE(><Object/></Delete>").is_err());
        // Comments and CDATA are still XML S3 accepts.
        let d = Delete::parse(
            b"<Delete><!-- c --><Object><Key><![CDATA[a<b]]></Key></Object></Delete>",
        )
        .unwrap();
        assert_eq!(d.objects[0].key, "a<b");
    }

    #[test]
    fn escapes() {
        let mut s = String::new();
        escape_into(&mut s, "a<b>&\"'\u{1}");
        assert_eq!(s, "a&lt;b&gt;&amp;&quot;&apos;&#x1;");
        let mut s = String::new();
        escape_lossy_into(&mut s, "k\u{0}\u{1f}<");
        assert_eq!(s, "k%00%1F&lt;");
        let e = error_doc("NoSuchKey", "a <b>", Some("/b/k\u{1}"), &[], "ID");
        assert_eq!(
            parse_error(e.as_bytes()),
            Some(("NoSuchKey".into(), "a <b>".into()))
        );
        assert_eq!(element(&e, "Resource").as_deref(), Some("/b/k%01"));
        let e = error_doc(
            "InvalidRange",
            "no",
            None,
            &[("ActualObjectSize", "0".into())],
            "ID",
        );
        assert_eq!(element(&e, "ActualObjectSize").as_deref(), Some("0"));
    }

    const PAGE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>bkt</Name><Prefix>d/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <Contents><Key>d/a&amp;b.tar</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>
    <ETag>&quot;0123&quot;</ETag><Size>1048576</Size><StorageClass>STANDARD</StorageClass></Contents>
  <Contents>
    <Key>d/caf&#233; &lt;1&gt;</Key>
    <Size>7</Size>
  </Contents>
  <CommonPrefixes><Prefix>d/sub/</Prefix></CommonPrefixes>
  <NextContinuationToken>tok+/=1</NextContinuationToken>
</ListBucketResult>"#;

    #[test]
    fn listings_parse() {
        let p = ListPage::parse(PAGE.as_bytes()).unwrap();
        assert_eq!(p.objects.len(), 2);
        assert_eq!(p.objects[0].key, "d/a&b.tar");
        assert_eq!(p.objects[0].size, 1 << 20);
        assert_eq!(p.objects[0].etag, "0123");
        assert!(p.objects[0].last_modified.is_some());
        assert_eq!(p.objects[1].key, "d/café <1>");
        assert_eq!(p.prefixes, ["d/sub/"]);
        assert!(p.is_truncated);
        assert_eq!(p.next_token.as_deref(), Some("tok+/=1"));
        let url = PAGE
            .replace("<MaxKeys>", "<EncodingType>url</EncodingType><MaxKeys>")
            .replace("d/caf&#233; &lt;1&gt;", "d/caf%C3%A9%20%3C1%3E");
        assert_eq!(
            ListPage::parse(url.as_bytes()).unwrap().objects[1].key,
            "d/café <1>"
        );
        let last = "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>";
        assert_eq!(
            ListPage::parse(last.as_bytes()).unwrap(),
            ListPage::default()
        );
        let e = ListPage::parse(b"<Error><Code>NoSuchBucket</Code><Message>m</Message></Error>")
            .unwrap_err();
        assert!(e.0.contains("NoSuchBucket"), "{e}");
    }

    #[test]
    fn bucket_lists_and_elements() {
        let doc = r#"<ListAllMyBucketsResult><Owner><ID>x</ID></Owner><Buckets><Bucket><Name>a</Name><CreationDate>t</CreationDate></Bucket><Bucket><Name>b&amp;c</Name></Bucket></Buckets></ListAllMyBucketsResult>"#;
        assert_eq!(parse_buckets(doc.as_bytes()).unwrap(), ["a", "b&c"]);
        assert_eq!(
            elements("<a><k>1</k><b><k>2</k></b><k/></a>", "k"),
            ["1", "2", ""]
        );
        assert_eq!(
            element("<a><k><![CDATA[x<y]]></k></a>", "k").as_deref(),
            Some("x<y")
        );
        assert_eq!(element("<a>", "k"), None);
    }
}
