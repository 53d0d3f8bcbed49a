//! What members say of themselves in the cluster view (`GET /_granary/cluster`, and the
//! health answers it is made from), in the shapes both the node and its clients read.

use serde::{Deserialize, Serialize};

/// How far a member's latest hand-over of copies to their owners (a rebalance pass, or
/// its drain) has got.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    /// Still handing over.
    pub running: bool,
    pub objects_done: u64,
    pub objects_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
}
