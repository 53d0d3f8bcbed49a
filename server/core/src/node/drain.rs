//! Drain: a member leaves the cluster handing its data over instead of dropping it.
//!
//! `POST /_granary/cluster/drain {"node": ID}` through any node reaches the member
//! ([`StartDrain`]), which from then on:
//! - owns no key: its health answers say `draining`, and every member ranks owners
//!   without it within a probe (about a second), so new reads and fills go to the
//!   members that own its keys after it leaves;
//! - takes no new fill (its cache admits nothing), and no member spills to it;
//! - hands every copy it holds to its new owner, as a rebalance does, paced to
//!   `--rebalance-rate`: the owner takes the bytes from it, checked against the
//!   backend's ETag (a HEAD), so the leave costs the backend nothing but those HEADs;
//! - keeps serving its copies meanwhile: an owner's miss of a key not yet handed over
//!   fills from the draining member, which ranks first among the key's holders;
//! - says `drained` once it holds nothing. It may then be stopped and taken out of the
//!   member list.
//!
//! The state is kept in the data dir (`drain`), so a member restarted mid-way drains on,
//! and one drained stays out of the ring until the file is removed.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Node, NodeError};
use crate::cluster::calls::{Drain, Draining, Handover, StartDrain};

/// The file in the data dir that holds the node's drain state.
pub const DRAIN_FILE: &str = "drain";

impl Node {
    /// Where the drain state is kept, and the state kept there: drains on when a
    /// restarted node finds itself draining or drained.
    pub(super) fn keep_drain_in(&self, path: PathBuf) -> std::io::Result<()> {
        let state = match std::fs::read_to_string(&path) {
            Ok(s) => match s.trim() {
                "drained" => Drain::Drained,
                _ => Drain::Draining,
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Drain::Serving,
            Err(e) => return Err(e),
        };
        let _ = self.drain_file.set(path);
        if !state.is_serving() {
            tracing::warn!(
                state = state.as_str(),
                "this node was draining when it stopped: it drains on"
            );
            self.set_drain(state);
        }
        Ok(())
    }

    /// This node's part in the cluster.
    pub fn drain_state(&self) -> Drain {
        self.cluster.me().drain()
    }

    /// Drains member `id` (with `undo`, makes it serve again): this node, or another
    /// through its [`StartDrain`] call.
    pub async fn drain_member(
        self: &Arc<Self>,
        id: &str,
        undo: bool,
    ) -> Result<Draining, NodeError> {
        if id == self.id {
            return self.drain_here(undo);
        }
        let m = self
            .cluster
            .member(id)
            .ok_or_else(|| NodeError::Invalid(format!("the cluster has no member `{id}`")))?;
        Ok(self.cluster.call(&m, &StartDrain { undo }).await?)
    }

    /// Drains this node, or with `undo` makes it serve again: what a [`StartDrain`] call
    /// asks of it.
    pub fn drain_here(self: &Arc<Self>, undo: bool) -> Result<Draining, NodeError> {
        if undo {
            Ok(self.undrain())
        } else {
            self.drain()
        }
    }

    /// Ends this node's drain (or its drained state): it owns its keys again, admits
    /// again, and the other members hand it back the copies of its keys (a change of
    /// owners, as a member's return is).
    pub fn undrain(self: &Arc<Self>) -> Draining {
        if !self.drain_state().is_serving() {
            tracing::info!("drain undone: this node serves its keys again");
            self.set_drain(Drain::Serving);
            self.rebalance_soon();
        }
        Draining {
            node: self.id.clone(),
            state: self.drain_state(),
        }
    }

    /// Starts draining this node (nothing changes when it already is).
    pub fn drain(self: &Arc<Self>) -> Result<Draining, NodeError> {
        if self.rebalance_rate == 0 {
            return Err(NodeError::Invalid(format!(
                "node `{}` hands nothing over (--rebalance-rate 0): it cannot drain",
                self.id
            )));
        }
        if self.cluster.is_single() {
            return Err(NodeError::Invalid(format!(
                "node `{}` is the only member: there is no one to hand its copies to",
                self.id
            )));
        }
        if self.drain_state().is_serving() {
            self.set_drain(Drain::Draining);
            self.rebalance_soon();
        }
        Ok(Draining {
            node: self.id.clone(),
            state: self.drain_state(),
        })
    }

    /// Sets, keeps and acts on this node's drain state.
    pub(super) fn set_drain(&self, state: Drain) {
        if let Some(path) = self.drain_file.get() {
            let kept = match state {
                Drain::Serving => std::fs::remove_file(path).or_else(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        Ok(())
                    } else {
                        Err(e)
                    }
                }),
                s => std::fs::write(path, s.as_str()),
            };
            if let Err(e) = kept {
                tracing::warn!(path = %path.display(), error = %e, "the drain state could not be kept: a restart would forget it");
            }
        }
        self.cache.close(!state.is_serving());
        self.cluster.set_drain(state);
    }

    /// After a hand-over pass: a draining node that holds nothing more is drained.
    pub(super) fn note_drained(&self) {
        if self.drain_state() == Drain::Draining && self.cache.usage().objects == 0 {
            tracing::info!("drained: every copy this node held is with its owner");
            self.set_drain(Drain::Drained);
        }
    }

    /// How far this node's latest hand-over has got (for its health answers).
    pub(super) fn handover(&self) -> Option<Handover> {
        let job = self.rebalancer.last()?;
        let [objects_done, objects_total, bytes_done, bytes_total] = job.progress();
        Some(Handover {
            running: job.state() == crate::jobs::JobState::Running,
            objects_done,
            objects_total,
            bytes_done,
            bytes_total,
        })
    }
}
