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
/// A request for the cache file's descriptor instead of the bytes (`fd`), and on the
/// answer, where in the file the bytes lie.
pub const LOCAL: &str = "x-granary-local";
pub const LOCAL_OFFSET: &str = "x-granary-local-offset";
pub const LOCAL_LENGTH: &str = "x-granary-local-length";

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
