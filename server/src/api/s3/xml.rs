//! S3's XML: a small writer for responses and serde-parsed request bodies
//! (DeleteObjects, CompleteMultipartUpload). Any body that does not parse is `MalformedXML`.

use std::time::SystemTime;

use serde::Deserialize;

use crate::error::{S3Code, S3Error};

pub const XMLNS: &str = "http://s3.amazonaws.com/doc/2006-03-01/";

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

/// `2009-10-12T17:50:30.000Z`, as S3 writes times in XML.
pub fn iso8601(t: SystemTime) -> String {
    let dt = time::OffsetDateTime::from(t);
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    dt.format(&fmt).unwrap_or_default()
}

/// Parses a request body as `T`.
pub fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, S3Error> {
    let malformed = |why: String| {
        S3Error::new(
            S3Code::MalformedXML,
            format!("The XML you provided was not well-formed or did not validate against our published schema: {why}"),
        )
    };
    let text = std::str::from_utf8(body)
        .map_err(|_| S3Error::new(S3Code::MalformedXML, "the XML body is not UTF-8"))?;
    // S3's request bodies have no document type; declarations are where XML parsers
    // are weakest (entity expansion, and a deserializer panic fuzzing found). Only
    // comments and CDATA may follow `<!`.
    let declares = text.match_indices("<!").any(|(i, _)| {
        let rest = &text[i + 2..];
        !(rest.starts_with("--") || rest.starts_with("[CDATA["))
    });
    if declares {
        return Err(malformed(
            "document type declarations are not accepted".into(),
        ));
    }
    // Defence in depth: a parser panic on some other input is a refused body, not a
    // dropped connection.
    match std::panic::catch_unwind(|| quick_xml::de::from_str::<T>(text)) {
        Ok(parsed) => parsed.map_err(|e| malformed(e.to_string())),
        Err(_) => Err(malformed("the parser gave up on it".into())),
    }
}

/// The body of DeleteObjects.
#[derive(Debug, Deserialize)]
pub struct Delete {
    #[serde(rename = "Object", default)]
    pub objects: Vec<DeleteObject>,
    #[serde(rename = "Quiet", default)]
    pub quiet: bool,
}

#[derive(Debug, Deserialize)]
pub struct DeleteObject {
    #[serde(rename = "Key")]
    pub key: String,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_delete() {
        let d: Delete = parse(
            br#"<?xml version="1.0"?><Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Object><Key>a&amp;b</Key></Object><Object><Key>c</Key><VersionId>x</VersionId></Object><Quiet>true</Quiet></Delete>"#,
        )
        .unwrap();
        assert_eq!(d.objects.len(), 2);
        assert_eq!(d.objects[0].key, "a&b");
        assert!(d.quiet);
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
            assert!(
                parse::<Delete>(bad).is_err() || parse::<CompleteMultipartUpload>(bad).is_err()
            );
        }
        let e = parse::<Delete>(b"<Delete><Object><Key>a</Key>").unwrap_err();
        assert_eq!(e.code, S3Code::MalformedXML);
    }

    #[test]
    fn a_body_that_panicked_the_parser_is_refused() {
        // Found by fuzz_s3_xml: quick-xml's deserializer hit `unreachable!` on it.
        let body = include_bytes!("../../../../fuzz/corpus/fuzz_s3_xml/regression-doctype-panic");
        let e = parse::<Delete>(body).unwrap_err();
        assert_eq!(e.code, S3Code::MalformedXML);
        let e = parse::<Delete>(b"<!DOCTYPE d [<!ENTITY a \"x\">]><Delete/>").unwrap_err();
        assert_eq!(e.code, S3Code::MalformedXML);
        let e = parse::<Delete>(b"<Delete><!DOCTyPE(><Object/></Delete>").unwrap_err();
        assert_eq!(e.code, S3Code::MalformedXML);
        // Comments and CDATA are still XML S3 accepts.
        let d = parse::<Delete>(
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
    }
}
