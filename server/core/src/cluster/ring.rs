//! The cluster's weighted rendezvous ring: the protocol crate's, which clients share to
//! route each key to its owner themselves.

pub use granary_proto::ring::*;
