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

pub mod archive;
pub mod backend;
pub mod cache;
mod clock;
pub mod cluster;
pub mod io;
pub mod jobs;
mod keylock;
pub mod node;
pub mod plans;
pub mod stats;
pub mod transform;

pub use node::{Node, NodeConfig, NodeError, OpenError};
