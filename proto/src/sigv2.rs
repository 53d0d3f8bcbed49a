//! Signature Version 2 for presigned query strings (`AWSAccessKeyId`, `Expires`,
//! `Signature`), what boto3's presigner makes by default: HMAC-SHA1 over the method,
//! `Content-MD5`, `Content-Type`, the expiry, the `x-amz-*` headers and the resource.

use base64::Engine;
use hmac::{Hmac, Mac};

/// Sub-resources that take part in a V2 canonical resource.
pub const SUBRESOURCES: &[&str] = &[
    "acl",
    "cors",
    "delete",
    "lifecycle",
    "location",
    "logging",
    "notification",
    "partNumber",
    "policy",
    "requestPayment",
    "response-cache-control",
    "response-content-disposition",
    "response-content-encoding",
    "response-content-language",
    "response-content-type",
    "response-expires",
    "restore",
    "tagging",
    "torrent",
    "uploadId",
    "uploads",
    "versionId",
    "versioning",
    "versions",
    "website",
];

/// What a V2 signature covers.
pub struct StringToSign<'a> {
    pub method: &'a str,
    pub content_md5: &'a str,
    pub content_type: &'a str,
    pub expires: &'a str,
    /// `x-amz-*` headers, lower-case names, trimmed values.
    pub amz_headers: &'a [(String, String)],
    /// The raw path.
    pub path: &'a str,
    /// Decoded query pairs; the sub-resources among them are signed.
    pub query: &'a [(String, String)],
}

impl StringToSign<'_> {
    pub fn text(&self) -> String {
        let mut amz: Vec<&(String, String)> = self.amz_headers.iter().collect();
        amz.sort();
        let mut resource = self.path.to_owned();
        let mut subs: Vec<&(String, String)> = self
            .query
            .iter()
            .filter(|(k, _)| SUBRESOURCES.contains(&k.as_str()))
            .collect();
        subs.sort_by(|a, b| a.0.cmp(&b.0));
        for (i, (k, v)) in subs.iter().enumerate() {
            resource.push(if i == 0 { '?' } else { '&' });
            resource.push_str(k);
            if !v.is_empty() {
                resource.push('=');
                resource.push_str(v);
            }
        }
        let mut sts = format!(
            "{}\n{}\n{}\n{}\n",
            self.method, self.content_md5, self.content_type, self.expires
        );
        for (k, v) in amz {
            sts.push_str(&format!("{k}:{v}\n"));
        }
        sts.push_str(&resource);
        sts
    }
}

/// The base64 HMAC-SHA1 signature of `string_to_sign`.
pub fn signature(secret: &str, string_to_sign: &str) -> String {
    let mut m =
        Hmac::<sha1::Sha1>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    m.update(string_to_sign.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(m.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The query-string authentication example of the S3 SigV2 documentation.
    #[test]
    fn documented_example() {
        let sts = StringToSign {
            method: "GET",
            content_md5: "",
            content_type: "",
            expires: "1175139620",
            amz_headers: &[],
            path: "/johnsmith/photos/puppy.jpg",
            query: &[],
        };
        assert_eq!(
            signature("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", &sts.text()),
            "NpgCjnDzrM+WFzoENXmpNDUsSn8="
        );
    }
}
