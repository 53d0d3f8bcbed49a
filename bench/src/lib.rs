//! `granary-bench` as a library: the pieces the binary and its tests share.
//!
//! - [`cluster`]: a cluster of real `granary` processes the bench starts and changes.
//! - [`size`]: human sizes, rates and durations on the command line.
//! - [`http`]: the target (endpoint, client, signer), listing, bucket requests.
//! - [`listing`]: the object set (ListObjectsV2 or generated names).
//! - [`workload`]: epoch schedule, HTTP client, worker tasks.
//! - [`report`]: the JSON report and the human summary.
//! - [`stall`]: the data-stall analysis for a group of GPUs.
//! - [`stats`]: the node's counters, before and after a run.
//! - [`plot`]: the `--plot` SVG.
//! - [`rebalance`]: `granary-bench rebalance`, what handing objects to a new member costs.
//! - [`ringsim`]: `granary-bench ring`, key placement over simulated clusters.
//! - [`samples`]: `granary-bench batch` and `prefetch`, the training-data features.
//! - [`transforms`]: `granary-bench transform`, shared on-node transforms.

pub mod cluster;
pub mod http;
pub mod listing;
pub mod local;
pub mod plot;
pub mod rebalance;
pub mod report;
pub mod ringsim;
pub mod samples;
pub mod size;
pub mod soak;
pub mod stall;
pub mod stats;
pub mod transforms;
pub mod wire;
pub mod workload;
