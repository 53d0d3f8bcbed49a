//! How a planned epoch is read: the settings, the epoch's spec, and local reads.

use std::time::Duration;

use super::plan::{Round, Split};
use super::route::{Clients, Router};
use crate::Credentials;

/// How a planned epoch is read.
#[derive(Debug, Clone)]
pub struct ReadSettings {
    pub router: Router,
    pub credentials: Option<Credentials>,
    pub timeout: Duration,
    /// Runs fetched ahead, by as many threads (0: each run fetched when it is needed).
    pub read_ahead: usize,
    /// Whether runs copied out of the cache file of a node on this machine are fetched
    /// ahead too. Off for a reader that is one of several processes sharing the cores
    /// (a DataLoader worker): it copies each such run when it needs it, and starts its
    /// read-ahead threads only once a run waits on more than a copy.
    pub ahead_here: bool,
    /// How shards of a node on this machine are read.
    pub local: LocalReads,
    /// Register the epoch's plan with the cluster, so that its nodes fetch each shard
    /// ahead of its first read, and mark each read with where the rank stands.
    pub plan: bool,
    /// Samples prepared by this pipeline on the shards' owners, for the epoch's seed
    /// and epoch: each run's members arrive prepared (through the socket, never out
    /// of a cache file).
    pub pipeline: Option<String>,
}

/// How a planned epoch reads the shards of a node it reaches over the node's Unix socket
/// (a `unix:` endpoint, or the socket the node offered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalReads {
    /// As any client: the bytes come through the socket.
    Off,
    /// Each run copied out of the node's cache file where it is resident there: bytes,
    /// as with `Off`, with no copy through the socket. A fetching thread copies the run
    /// whole ([`Client::get_resident`](crate::Client::get_resident)); a reader fetching
    /// its own runs keeps each mapped and copies every member once, as its sample is
    /// delivered ([`Delivered::Resident`]).
    Copied,
    /// Each run's samples delivered as ranges of the node's cache file
    /// ([`Delivered::Mapped`]); bytes where the node sends bytes.
    Mapped,
}

impl ReadSettings {
    /// Connections for one fetching thread.
    pub(super) fn clients(&self) -> Clients {
        Clients::new(self.router.clone(), self.credentials.clone(), self.timeout)
    }
}

/// Which part of which epoch to read: the dataset's order settings, the resume history,
/// this round's split, and the reader's place in it.
#[derive(Debug, Clone)]
pub struct EpochSpec {
    pub seed: u64,
    pub epoch: u64,
    pub shuffle_shards: bool,
    pub rounds: Vec<Round>,
    pub split: Split,
    pub rank: usize,
    /// This DataLoader worker and how many there are (0 of 1 without workers).
    pub worker: usize,
    pub workers: usize,
    /// The DataLoader's batch size: workers take whole batches in turn.
    pub batch_size: usize,
}
