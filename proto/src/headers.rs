//! Header names of Granary's own protocol, between clients and nodes and between
//! members, and the object headers S3 keeps with an object.

/// Where a read's bytes came from: `hit`, `miss`, `peer` or `bypass`.
pub const CACHE: &str = "x-granary-cache";
/// The node that holds (or would hold) the object.
pub const NODE: &str = "x-granary-node";
/// The transform a result came from.
pub const TRANSFORM: &str = "x-granary-transform";
/// Marks a request made by a member: serve it here, do not route it again.
pub const HOP: &str = "x-granary-hop";
/// Asks for a member's committed copy only: `404` rather than a fill.
pub const PEER_FILL: &str = "x-granary-peer-fill";
/// A read the key's owner could not admit, left to this node, with the ids of the nodes
/// that refused it.
pub const SPILL: &str = "x-granary-spill";
/// A member's proof of membership on requests it makes itself (see `peer`).
pub const PEER_AUTH: &str = "x-granary-peer-auth";
/// The hex SHA-256 of the body of a member's own request, which its `x-granary-peer-auth`
/// covers (absent: no body).
pub const PEER_SHA256: &str = "x-granary-peer-sha256";
/// A request for the cache file's descriptor instead of the bytes (`fd`, or
/// [`LOCAL_RESIDENT`]), and on the answer, where in the file the bytes lie.
pub const LOCAL: &str = "x-granary-local";
/// The [`LOCAL`] of a client that copies the range out of the file only where it finds
/// every page of it resident, touching nothing else (so that it reads nothing in from
/// the disk), and otherwise asks for the bytes. `fd`: the client maps the file.
pub const LOCAL_RESIDENT: &str = "fd-resident";
pub const LOCAL_OFFSET: &str = "x-granary-local-offset";
pub const LOCAL_LENGTH: &str = "x-granary-local-length";
/// On a descriptor answer to [`LOCAL_RESIDENT`]: the checksums of the blocks holding the
/// bytes asked ([`BlockChecks`](crate::crc::BlockChecks)), against which the client
/// checks what it copies out.
pub const LOCAL_CHECKS: &str = "x-granary-local-checks";
/// On answers over TCP to a client on the node's machine (a loopback address), where the
/// node also serves its Unix socket: `PID PATH`, the node's process id and the socket's
/// absolute path. The client may go on over the socket, once the process answering on it
/// is that one (`SO_PEERCRED`).
pub const SOCKET: &str = "x-granary-socket";

/// One header: its name (lower case where it is stored with an object) and its value as
/// text (see [`text`]). Serialized as the `[name, value]` pair it replaced, so the
/// metadata already written in cache footers and extended attributes reads back as
/// before.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(from = "(String, String)", into = "(String, String)")]
pub struct Header {
    pub name: String,
    pub value: String,
}

impl Header {
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Header {
        Header {
            name: name.into(),
            value: value.into(),
        }
    }

    /// The value of the first header named `name` (compared without case).
    pub fn find<'h>(headers: &'h [Header], name: &str) -> Option<&'h str> {
        headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str())
    }
}

impl From<(String, String)> for Header {
    fn from((name, value): (String, String)) -> Header {
        Header { name, value }
    }
}

impl From<Header> for (String, String) {
    fn from(h: Header) -> (String, String) {
        (h.name, h.value)
    }
}

/// Request headers stored with an object and sent back on reads (besides
/// `x-amz-meta-*`).
const STORED: &[&str] = &[
    "content-type",
    "content-encoding",
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
];

/// Whether a header is one an object keeps (the list above, and `x-amz-meta-*`).
pub fn is_stored(name: &str) -> bool {
    STORED.contains(&name) || name.starts_with("x-amz-meta-")
}

/// A header value's bytes as text: UTF-8 when they are (what clients send for
/// non-ASCII metadata), else each byte one character (ISO 8859-1, as HTTP/1.1 reads
/// `obs-text`). A value with bytes beyond ASCII is kept, not dropped.
pub fn text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => bytes.iter().map(|&b| char::from(b)).collect(),
    }
}

/// The bytes to send for a stored header value: ISO 8859-1 where every character fits
/// (what clients' HTTP stacks decode header bytes as, so `é` reads back as `é`), else
/// UTF-8.
pub fn latin1_bytes(text: &str) -> Vec<u8> {
    if text.chars().all(|c| u32::from(c) <= 0xff) {
        text.chars().map(|c| u32::from(c) as u8).collect()
    } else {
        text.as_bytes().to_vec()
    }
}

/// On a planned read: `PLAN_ID:EPOCH:RANK:PLACE`, the plan the read belongs to and where
/// the reading rank stands in it (the place in its span of the read's first sample).
pub const PLAN: &str = "x-granary-plan";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_is_stored_as_the_pair_it_replaced() {
        let h = vec![Header::new("content-type", "text/plain")];
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(json, r#"[["content-type","text/plain"]]"#);
        let back: Vec<Header> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, h);
        assert_eq!(Header::find(&back, "Content-Type"), Some("text/plain"));
        assert_eq!(Header::find(&back, "etag"), None);
    }

    #[test]
    fn header_bytes_round_trip_through_text() {
        // Bytes that are not UTF-8 come back as they went.
        for bytes in [&b"plain"[..], b"Hello World\xe9", b"\x80\xff"] {
            assert_eq!(latin1_bytes(&text(bytes)), bytes);
        }
        assert_eq!(text(b"Hello World\xe9"), "Hello World\u{e9}");
        // UTF-8 is read as such, and sent back in the bytes HTTP stacks decode it from.
        assert_eq!(text("caf\u{e9}".as_bytes()), "caf\u{e9}");
        assert_eq!(latin1_bytes("caf\u{e9}"), b"caf\xe9");
        assert_eq!(latin1_bytes("\u{2603}"), "\u{2603}".as_bytes());
    }
}
