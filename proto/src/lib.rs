//! Granary's wire protocol, in one crate without an async runtime, shared by the node,
//! the client library, the bench and the tests: what one side signs, encodes or writes
//! is what the other side checks, decodes or reads.
//!
//! - [`sigv4`]: SigV4 primitives, a signer, chunk signatures; [`sigv2`]: presigned V2.
//! - [`auth`]: checking a request's signature (header, presigned, peer) as the node does.
//! - [`peer`]: the MAC members sign their own requests with.
//! - [`xml`]: S3's XML documents, written and read; [`code`]: S3 error codes.
//! - [`crc`]: CRC32C, the checksum of every cache block (the node checks what it sends
//!   with it, and a client on the node's machine what it copies out of a cache file),
//!   and the other CRCs S3 names.
//! - [`encode`]: keys, paths and queries; [`range`]: the `Range` header;
//!   [`headers`]: header names; [`units`]: sizes and durations for people.
//! - [`http1`]: where an HTTP/1.1 answer's body ends, for the sides that read them.
//! - [`ring`]: which member owns a key (weighted rendezvous hashing), for the node's
//!   routing and for clients that read each key from its owner.
//! - [`shards`]: shards, their samples, a dataset's catalog and its index.
//! - [`plan`]: the order an epoch's samples are read in, per rank and worker: a pure
//!   function of the shards' sample counts, the seed and the epoch, so that the node
//!   can know what every rank reads next.

pub mod auth;
pub mod cluster;
pub mod code;
pub mod crc;
pub mod encode;
pub mod headers;
pub mod http1;
pub mod peer;
pub mod plan;
pub mod range;
pub mod ring;
pub mod shards;
pub mod sigv2;
pub mod sigv4;
pub mod units;
pub mod xml;

pub use code::S3Code;
pub use headers::Header;
