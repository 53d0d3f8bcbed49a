//! Keys the SDK will not send. aws-sdk-s3 takes a key of white space alone (`" "`) for an
//! unset one when it builds an operation's endpoint parameters, and fails the request
//! before it is made, though S3 stores such keys like any other. Such a key goes into the
//! builder as a stand-in ([`arg`]), and [`Keyed::keyed`] puts the real key,
//! percent-encoded, back into the request's path before it is signed: the store sees,
//! and the signature covers, the key itself.

use aws_sdk_s3::client::customize::CustomizableOperation;

/// What the builder gets in place of a refused key: a key of its own, so that its
/// encoding in the path is itself.
const STAND_IN: &str = "granary-stand-in-for-a-blank-key";

/// Whether the SDK refuses `key` (its test: `trim().is_empty()`).
fn refused(key: &str) -> bool {
    !key.is_empty() && key.trim().is_empty()
}

/// The key to give an operation's builder.
pub(super) fn arg(key: &str) -> &str {
    if refused(key) {
        STAND_IN
    } else {
        key
    }
}

/// Sends a key given to the builder as [`arg`]`(key)` as `key` itself.
pub(super) trait Keyed {
    fn keyed(self, key: &str) -> Self;
}

impl<T, E, B> Keyed for CustomizableOperation<T, E, B> {
    fn keyed(self, key: &str) -> Self {
        if !refused(key) {
            return self;
        }
        let encoded = format!("/{}", granary_proto::encode::path(key));
        self.mutate_request(move |req| {
            if let Some(uri) = repath(req.uri(), &encoded) {
                // The SDK's own bytes and percent-encoded ones: it always parses.
                let _ = req.set_uri(uri);
            }
        })
    }
}

/// `uri` with the stand-in, the last segment of its path, replaced by `encoded`.
fn repath(uri: &str, encoded: &str) -> Option<String> {
    let (path, query) = uri
        .split_once('?')
        .map_or((uri, None), |(p, q)| (p, Some(q)));
    let head = path.strip_suffix(STAND_IN)?.strip_suffix('/')?;
    Some(match query {
        Some(q) => format!("{head}{encoded}?{q}"),
        None => format!("{head}{encoded}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blank_key_goes_out_as_itself() {
        assert_eq!(arg(" "), STAND_IN);
        assert_eq!(arg(" \t\n"), STAND_IN);
        assert_eq!(arg(" a "), " a ");
        assert_eq!(arg(""), "");
        let uri = format!("http://127.0.0.1:5000/bkt/{STAND_IN}?x-id=PutObject");
        assert_eq!(
            repath(&uri, "/%20%09").as_deref(),
            Some("http://127.0.0.1:5000/bkt/%20%09?x-id=PutObject")
        );
        let uri = format!("http://127.0.0.1:5000/bkt/{STAND_IN}");
        assert_eq!(
            repath(&uri, "/%20").as_deref(),
            Some("http://127.0.0.1:5000/bkt/%20")
        );
        assert_eq!(repath("http://h/bkt/other?x=1", "/%20"), None);
    }
}
