//! Granary's node below HTTP: the node service ([`Node`], its one front) and the parts
//! it is made of, each importing only the ones below it:
//! - `node`: the service every request path calls (reads, writes, batches, prefetch,
//!   rebalance, the node's side of members' calls);
//! - `cache`, `cluster`, `transform`, `jobs`: the parts the node is made of (`cluster`
//!   also defines every member-to-member call, `cluster::calls`, and its client);
//! - `backend`, `io`: object stores and disk reads;
//! - `stats`: the counter table every view of the node's counters comes from.
//!
//! No HTTP server lives here: the `granary` server crate serves the node (S3 and native
//! routes, the table of members' calls, the one mapping of errors to S3 codes).

mod archive;
mod backend;
mod cache;
mod clock;
mod cluster;
mod io;
mod jobs;
mod keylock;
mod node;
mod plans;
mod stats;
mod sync;
#[cfg(test)]
mod testing;
mod transform;

/// The planner driven at scale with no I/O (`granary-bench plan-sim`).
pub use node::{simulate_planner, SimConfig as PlannerSimConfig, SimReport as PlannerSimReport};
pub use node::{Node, NodeConfig, NodeError, OpenError};

// The node's front: every name the server crate serves the node through, so that the
// server imports from here alone and the modules' layout stays the node's own business.
pub use archive::{
    in_order as members_in_order, index_tar, Format as ArchiveFormat, Member as ArchiveMember,
    TarIndex,
};
pub use backend::{
    check_key, keypath, BackendError, ByteRange, ByteStream, ListPage, ListQuery, ObjectMeta,
    ObjectParts, PartRange, PutOptions, Refusal,
};
pub use cache::{Body, CacheError, CachePolicy, LocalFile, Origin, Revalidation};
/// Every member-to-member call, typed: the server's table of their handlers.
pub use cluster::calls;
pub use cluster::calls::JsonCall;
pub use cluster::transport::PeerBody;
pub use cluster::{
    parse_peer, ClusterConfig, ClusterError, ConfigError as ClusterConfigError, RouteMode,
};
pub use io::sendfile::SendfileChoice;
pub use io::{crc, sendfile, EngineChoice};
pub use node::{
    etag_matches, is_member_call, BackendSpec, Conditions, Data, Forwarded, Item, LocalReader,
    Outcome, Prep, ReadMode, ReadRequest, Reply, Spilled, ToOwner, WriteConditions,
};
pub use stats::{rusage_us, Exposition, Metric};

// What the bench drives with no node: the ring, the image transform.
pub use cluster::ring::{key_hash, Ring, RingNode};
pub use transform::image::{apply as apply_image, ImageSpec};
pub use transform::{Named, TransformError, TransformSpec};
