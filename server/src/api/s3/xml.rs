//! S3's XML (see `granary_proto::xml`): request bodies parsed, refusals as
//! `MalformedXML`.

pub use granary_proto::xml::{CompleteMultipartUpload, Delete, Doc};

use crate::api::error::S3Error;

/// Parses a request body as `T`; anything else is `MalformedXML`.
pub fn parse<T: for<'de> serde::Deserialize<'de>>(body: &[u8]) -> Result<T, S3Error> {
    Ok(granary_proto::xml::parse(body)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::error::S3Code;

    #[test]
    fn malformed_bodies_are_malformed_xml() {
        let e = S3Error::from(Delete::parse(b"<Delete><Object><Key>a</Key>").unwrap_err());
        assert_eq!(e.code, S3Code::MalformedXML);
        assert!(parse::<CompleteMultipartUpload>(b"\xff\xfe").is_err());
    }

    #[test]
    fn a_body_that_panicked_the_parser_is_refused() {
        // Found by fuzz_s3_xml: quick-xml's deserializer hit `unreachable!` on it.
        let body = include_bytes!("../../../../fuzz/corpus/fuzz_s3_xml/regression-doctype-panic");
        for body in [
            &body[..],
            b"<!DOCTYPE d [<!ENTITY a \"x\">]><Delete/>",
            b"<Delete><!DOCTyPE(><Object/></Delete>",
        ] {
            let e = S3Error::from(Delete::parse(body).unwrap_err());
            assert_eq!(e.code, S3Code::MalformedXML);
        }
        // Comments and CDATA are still XML S3 accepts.
        let d = Delete::parse(
            b"<Delete><!-- c --><Object><Key><![CDATA[a<b]]></Key></Object></Delete>",
        )
        .unwrap();
        assert_eq!(d.objects[0].key, "a<b");
    }
}
