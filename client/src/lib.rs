//! `granary-client`: a typed, blocking client for a Granary node, and a training-data
//! reader on top of it.
//!
//! - [`Client`] speaks HTTP/1.1 over keep-alive `std::net` connections (no async runtime):
//!   the S3 object operations a training job needs (list, stat, get, ranges, shard members,
//!   put, delete), and the native API under `/_granary/` (health, stats, cluster view,
//!   prefetch jobs, batch reads). With [`Client::with_credentials`] every request is signed
//!   with AWS Signature Version 4.
//! - [`Dataset`] reads a prefix of tar shards the WebDataset way: shards shuffled per epoch
//!   identically on every rank, their samples split across ranks in equal contiguous
//!   spans (every sample once per epoch), members grouped into [`Sample`]s, an optional
//!   sample shuffle buffer, and runs of samples read by range from each shard's owner,
//!   ahead in background threads. It fronts [`dataset::planned`], the one reading path,
//!   which the Python `ShardDataset` uses too.
//! - [`TarReader`] is the streaming tar parser both use (GNU long names, pax paths).
//!
//! Bodies stream in both directions: uploads are read from a `Read` as they are sent, and
//! downloads are written to a `Write` (or read from an [`ObjectReader`]) as they arrive.

mod client;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dataset;
mod dates;
mod http;
mod local;
mod native;
mod objects;
mod pages;
mod sign;
mod sock;
mod split;
mod tarstream;
pub mod wire;

pub use client::{Client, Response};
pub use dataset::{Dataset, DatasetBuilder, Epoch, Sample};
pub use dates::format_time;
pub use local::{Local, LocalBytes, LocalFile, Mapping};
pub use native::{
    ArchiveList, BatchItem, ClusterView, Handover, Job, JobState, Member, MemberState, Missing,
    MISSING_PREFIX,
};
pub use objects::{GetOptions, Listing, ObjectInfo, ObjectMeta, ObjectReader, Pipelined};
pub use sign::Credentials;
pub use tarstream::TarReader;

/// Why a call failed. Each variant says which side failed: the endpoint given, the network
/// or the node (`Io`, `Protocol`), the node's answer (`Status`, `S3`, `Json`, `Xml`), the
/// caller's own files (`Local`), or the contents of a shard (`Shard`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint is neither `http://host:port` nor `unix:PATH`.
    #[error("bad endpoint `{0}`: expected http://host:port or unix:PATH")]
    Endpoint(String),
    /// Connecting, sending or receiving failed (including a response cut short).
    #[error("connection to {addr} failed: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    /// The node's answer was not valid HTTP/1.1.
    #[error("malformed HTTP response: {0}")]
    Protocol(String),
    /// A non-success status without an S3 error document.
    #[error("{status} from {path}: {body}")]
    Status {
        status: u16,
        path: String,
        body: String,
    },
    /// A non-success status with an S3 error document (`<Error><Code>…`).
    #[error("{status} {code} from {path}: {message}")]
    S3 {
        status: u16,
        code: String,
        message: String,
        path: String,
    },
    /// A native-API answer that is not the JSON expected.
    #[error("bad JSON from {path}: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    /// An S3 answer that is not the XML expected.
    #[error("bad XML from {path}: {message}")]
    Xml { path: String, message: String },
    /// The caller asked for something that cannot be sent (an empty key, rank >= world size…).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Reading the caller's upload source or writing the caller's sink failed.
    #[error("local I/O failed: {0}")]
    Local(std::io::Error),
    /// A shard could not be read as a tar of samples.
    #[error("shard {shard}: {source}")]
    Shard {
        shard: String,
        source: std::io::Error,
    },
}

impl Error {
    /// The HTTP status of an error answer, if the node answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Status { status, .. } | Error::S3 { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The S3 error code (`NoSuchKey`, `AccessDenied`…), if the answer carried one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::S3 { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether the object, bucket or job does not exist (`404`).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// Whether the same call may succeed if tried again: network failures, `5xx`, `429`.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Io { .. } | Error::Protocol(_) => true,
            Error::Status { status, .. } | Error::S3 { status, .. } => {
                *status >= 500 || *status == 429
            }
            _ => false,
        }
    }
}

/// The result of a client call.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
pub(crate) mod fake;
