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
use crate::cluster::ring::key_hash;
use crate::cluster::transport::PeerBody;
use crate::cluster::transport::ReplyBody;
use crate::cluster::{ClusterError, Member, RouteMode};
use crate::stats::Metric;

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
    pub async fn announced(&self, member: &str) -> crate::cluster::calls::Announced {
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

    /// A client's request for a key this node may not own, passed on to the key's
    /// owner; while an owner does not answer, it is marked down and the next owner
    /// asked (this node, perhaps), so no read fails for a member that died. A write,
    /// whose body is spent once sent, is not sent twice: the client retries it.
    /// `body`: the request's, taken (through `peer`) only for a write that goes on.
    pub async fn forward_to_owner<B>(
        &self,
        to: &ToOwner<'_>,
        body: &mut Option<B>,
        peer: impl Fn(B) -> PeerBody,
    ) -> Forwarded {
        let read = *to.method == Method::GET || *to.method == Method::HEAD;
        let empty = || crate::cluster::peer::full(bytes::Bytes::new());
        for _ in 0..self.cluster.members().len() {
            let Some(m) = self.owner_elsewhere(to.bucket, to.key) else {
                return Forwarded::Here;
            };
            // Its path and query as sent on: made only for a request that goes on.
            let target = crate::cluster::peer::target_of(to.uri);
            if read && to.may_redirect && self.cluster.route == RouteMode::Redirect {
                self.stats.add(Metric::Redirects, 1);
                return Forwarded::Redirect {
                    location: format!("{}{}", m.url(), target),
                    owner: m.id().to_owned(),
                };
            }
            let send = match body.take() {
                Some(b) if !read => peer(b),
                kept => {
                    *body = kept;
                    empty()
                }
            };
            match self
                .cluster
                .forward(&m, to.method, &target, to.headers, send)
                .await
            {
                Ok(resp) => return Forwarded::Answered(resp),
                Err(why) => {
                    self.cluster.mark_down(&m, why);
                    if !read {
                        return Forwarded::Unavailable {
                            owner: m.id().to_owned(),
                        };
                    }
                }
            }
        }
        Forwarded::Here
    }

    /// The member that owns the key now when it is not this node.
    fn owner_elsewhere(&self, bucket: &str, key: &str) -> Option<Arc<Member>> {
        let owner = self.cluster.owner_of_hash(key_hash(bucket, key));
        (!self.cluster.is_me(&owner)).then_some(owner)
    }

    /// A read this node could not admit, passed on to member `m`, which has room: the
    /// request names the members that refused it (`tried`, this node added), so it
    /// never comes back.
    pub(super) async fn forward_spilled(
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
        self.cluster
            .forward(m, &parts.method, &target, &headers, body)
            .await
    }
}

/// A client's request for a key, on its way to the key's owner ([`Node::forward_to_owner`]).
pub struct ToOwner<'a> {
    pub bucket: &'a str,
    /// The key the owner is found by (an object's, or a name standing for one).
    pub key: &'a str,
    pub method: &'a Method,
    /// The request's URI (its path and query are sent on).
    pub uri: &'a http::Uri,
    pub headers: &'a HeaderMap,
    /// The client can follow a redirect (an unsigned read names no host): with
    /// `--route redirect` it is sent one.
    pub may_redirect: bool,
}

/// What came of passing a request on to its key's owner.
pub enum Forwarded {
    /// The owner answered: its answer, streamed back.
    Answered(Response<ReplyBody>),
    /// Serve it here: this node owns the key (once the owners that did not answer
    /// were marked down), or no owner answered a read.
    Here,
    /// Send the client to the owner (`--route redirect`): where, and the owner's id.
    Redirect { location: String, owner: String },
    /// The owner did not answer a write, whose body is spent: the client retries.
    Unavailable { owner: String },
}
