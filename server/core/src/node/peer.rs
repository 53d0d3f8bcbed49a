//! The node as its members and the routing layer see it: its health, what it does with
//! members' calls (invalidations, revalidations; offers and prefetch parts are in
//! `rebalance` and `prefetch`), jobs here or on another member, who a request came from,
//! and where a request for a key this node does not own goes.

use std::sync::Arc;

use granary_proto::peer::PeerAuthError;
use http::request::Parts;
use http::{HeaderMap, Method, Response};

use super::Node;
use crate::cluster::calls::{self, Health, Invalidate, Invalidated, JobCancel, JobStatus};
use crate::cluster::peer::PeerBody;
use crate::cluster::ring::key_hash;
use crate::cluster::transport::ReplyBody;
use crate::cluster::{ClusterError, Member, RouteMode};

impl Node {
    /// What `/_granary/health` says: `ok` once the node's view is settled (members
    /// agree on owners), with the cache's room.
    pub fn health(&self) -> Health {
        Health {
            status: if self.cluster.settled() {
                "ok"
            } else {
                "settling"
            }
            .to_owned(),
            node_id: self.id.clone(),
            capacity_bytes: self.cache.usage().capacity,
            free_bytes: self.cache.free(),
            admitting: !self.cache.refusing(),
            boot_id: self.cluster.boot().to_owned(),
            drain: self.drain_state(),
            handover: self.handover(),
            knows_me: None,
            sees_me_up: false,
        }
    }

    /// A member's probe announced it: probed back first when this node does not see it
    /// up. Whether this node lists it, and sees it up (which renews its lease).
    pub async fn announced(&self, member: &str) -> crate::cluster::membership::Announced {
        crate::cluster::membership::announced(&self.cluster, member).await
    }

    /// A member's [`Invalidate`]: objects written or deleted through it.
    pub fn take_invalidation(&self, call: &Invalidate) -> Invalidated {
        for o in &call.objects {
            self.cache.invalidate(&o.bucket, &o.key);
            self.catalogs.touched(&o.bucket, &o.key);
        }
        Invalidated {
            invalidated: call.objects.len(),
        }
    }

    /// Every job this node knows, as JSON, oldest first.
    pub fn jobs_json(&self) -> Vec<serde_json::Value> {
        self.jobs.all().iter().map(|j| j.to_json()).collect()
    }

    /// A job's progress (cancelled first with `cancel`). A job this node does not know
    /// is looked for on the other members with `ask_members` (another took it).
    pub async fn job(
        &self,
        id: &str,
        cancel: bool,
        ask_members: bool,
    ) -> Option<serde_json::Value> {
        if let Some(job) = self.jobs.get(id) {
            if cancel {
                crate::jobs::cancel(&job);
            }
            return Some(job.to_json());
        }
        if !ask_members {
            return None;
        }
        let id = id.to_owned();
        for m in self.cluster.others_up() {
            let asked = if cancel {
                self.cluster.call(&m, &JobCancel { id: id.clone() }).await
            } else {
                self.cluster.call(&m, &JobStatus { id: id.clone() }).await
            };
            if let Ok(view) = asked {
                return Some(view.0);
            }
        }
        None
    }

    /// The member a forwarded request came from, when its `x-granary-hop` proves it (in
    /// an open cluster, whatever the header says).
    pub fn member_of(&self, parts: &Parts) -> Option<String> {
        self.cluster.member_of(parts)
    }

    /// The member that signed a request it made itself (`x-granary-peer-auth`), and the
    /// body hash it declares (the caller checks the body against it).
    pub fn peer_of(&self, parts: &Parts) -> Result<Option<(String, String)>, PeerAuthError> {
        self.cluster.peer_of(parts)
    }

    /// Whether a member's own request proved it (checked on arrival); an open cluster
    /// takes any.
    pub fn peer_authenticated(&self, parts: &Parts) -> bool {
        self.cluster.peer_authenticated(parts)
    }

    /// `/_granary/cluster`: the members (`with_urls`: where they listen) and, for a key,
    /// its owner.
    pub fn cluster_view(&self, key: Option<(&str, &str)>, with_urls: bool) -> serde_json::Value {
        self.cluster.view_json(key, with_urls)
    }

    /// Whether this node is the whole cluster.
    pub fn is_single(&self) -> bool {
        self.cluster.is_single()
    }

    /// How requests for other members' keys are answered.
    pub fn route_mode(&self) -> RouteMode {
        self.cluster.route
    }

    /// How many members the cluster lists, this node included: the most owners a
    /// request may be routed to in turn.
    pub fn member_count(&self) -> usize {
        self.cluster.members().len()
    }

    /// The member that owns the key now when it is not this node.
    pub fn owner_elsewhere(&self, bucket: &str, key: &str) -> Option<Arc<Member>> {
        let owner = self.cluster.owner_of_hash(key_hash(bucket, key));
        (!self.cluster.is_me(&owner)).then_some(owner)
    }

    /// Streams a client's request on to member `m` (its owner, or a member with room),
    /// and its answer back. An error means no answer came; the caller marks it down.
    pub async fn forward(
        &self,
        m: &Member,
        method: &Method,
        target: &str,
        headers: &HeaderMap,
        body: PeerBody,
    ) -> Result<Response<ReplyBody>, ClusterError> {
        self.cluster.forward(m, method, target, headers, body).await
    }

    /// [`Node::forward`] of a read this node could not admit to member `m`, which has
    /// room: the request names the members that refused it (`tried`, this node added),
    /// so it never comes back.
    pub async fn forward_spilled(
        &self,
        m: &Member,
        parts: &Parts,
        tried: &[&str],
    ) -> Result<Response<ReplyBody>, ClusterError> {
        let mut refused = tried.to_vec();
        refused.push(&self.id);
        let (name, value) = calls::spill_header(&refused);
        let mut headers = parts.headers.clone();
        if let Ok(v) = http::HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
        let target = crate::cluster::peer::target_of(&parts.uri);
        let body = crate::cluster::peer::full(bytes::Bytes::new());
        self.forward(m, &parts.method, &target, &headers, body)
            .await
    }

    /// Marks a member down now (a request found it gone).
    pub fn mark_down(&self, m: &Member, why: impl std::fmt::Display) {
        self.cluster.mark_down(m, why);
    }
}
