//! Checks on the XML documents the server answers with.

use anyhow::{anyhow, bail, Context, Result};

/// Panics unless `body` is a well-formed S3 error document:
/// `<Error><Code>…</Code><Message>…</Message>…</Error>`.
pub fn assert_s3_error_body(body: &[u8]) {
    let text = String::from_utf8_lossy(body);
    let root = check_xml(body).unwrap_or_else(|e| panic!("error body is not XML ({e}): {text:?}"));
    assert_eq!(root, "Error", "root element of error body: {text:?}");
    let code = xml_tag(&text, "Code").unwrap_or_default();
    assert!(
        !code.is_empty() && code.chars().all(|c| c.is_ascii_alphanumeric()),
        "<Code> missing or not an S3 code in {text:?}"
    );
    assert!(
        xml_tag(&text, "Message").is_some(),
        "<Message> missing in {text:?}"
    );
}

/// Checks that `doc` is one well-formed XML 1.0 document (UTF-8, matching tags, one root,
/// valid references, no characters XML 1.0 forbids) and returns its root element's name.
/// This is what boto3's and the SDKs' parsers need to read an answer.
pub fn check_xml(doc: &[u8]) -> Result<String> {
    use quick_xml::events::Event;
    let text = std::str::from_utf8(doc).context("not UTF-8")?;
    let forbidden = |s: &str| {
        s.chars()
            .find(|&c| matches!(c, '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{fffe}' | '\u{ffff}'))
    };
    let mut reader = quick_xml::Reader::from_str(text);
    let mut stack: Vec<String> = Vec::new();
    let mut root = None;
    loop {
        let event = reader.read_event().context("malformed XML")?;
        let opened = match &event {
            Event::Start(e) | Event::Empty(e) => {
                for attr in e.attributes() {
                    let value = attr.context("bad attribute")?.unescape_value()?;
                    if let Some(c) = forbidden(&value) {
                        bail!("forbidden character {c:?} in an attribute");
                    }
                }
                Some(String::from_utf8_lossy(e.name().as_ref()).into_owned())
            }
            _ => None,
        };
        if let Some(name) = opened {
            if stack.is_empty() {
                if root.is_some() {
                    bail!("more than one root element");
                }
                root = Some(name.clone());
            }
            if matches!(event, Event::Start(_)) {
                stack.push(name);
            }
            continue;
        }
        match event {
            Event::End(_) => {
                stack.pop().ok_or_else(|| anyhow!("unmatched end tag"))?;
            }
            Event::Text(t) => {
                let s = t.unescape().context("bad reference")?;
                if let Some(c) = forbidden(&s) {
                    bail!("forbidden character {c:?} in text");
                }
                if stack.is_empty() && !s.trim().is_empty() {
                    bail!("text outside the root element");
                }
            }
            Event::CData(c) => {
                if stack.is_empty() {
                    bail!("CDATA outside the root element");
                }
                if let Some(ch) = forbidden(&String::from_utf8_lossy(&c)) {
                    bail!("forbidden character {ch:?} in CDATA");
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !stack.is_empty() {
        bail!("unclosed elements {stack:?}");
    }
    root.ok_or_else(|| anyhow!("no root element"))
}

/// The text of the first `<tag>…</tag>` in `xml` (no entity decoding).
pub fn xml_tag(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = xml.find(&open)? + open.len();
    let len = xml[start..].find(&close)?;
    Some(xml[start..start + len].to_string())
}

/// Every `<tag>…</tag>` text in `xml`, in order.
pub fn xml_tags(xml: &str, tag: &str) -> Vec<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        rest = &rest[i + open.len()..];
        let Some(j) = rest.find(&close) else { break };
        out.push(rest[..j].to_string());
        rest = &rest[j + close.len()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_xml_rejects_what_parsers_reject() {
        assert_eq!(
            check_xml(b"<?xml version=\"1.0\"?><A><B>x &amp; y</B></A>").unwrap(),
            "A"
        );
        for bad in [
            &b"<A><B></A>"[..],
            b"<A>",
            b"<A/><B/>",
            b"<A>&#x0;</A>",
            b"<A>\x01</A>",
            b"<A>&nope;</A>",
            b"text",
            b"<A>\xff</A>",
        ] {
            assert!(
                check_xml(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn xml_helpers() {
        let x = "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>m</Message></Error>";
        assert_s3_error_body(x.as_bytes());
        assert_eq!(xml_tag(x, "Code").as_deref(), Some("NoSuchKey"));
        assert_eq!(xml_tags("<K>a</K><K>b</K>", "K"), vec!["a", "b"]);
    }
}
