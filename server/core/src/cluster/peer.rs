//! The transport between members: one HTTP client, the proof of membership every request
//! carries, the typed [`Cluster::call`] that every member-to-member call goes through
//! (`calls` defines them), and [`Cluster::forward`], which streams a client's request to
//! the key's owner.
//!
//! Every request to a member proves membership (so the receiver serves it locally instead
//! of routing it again) with a MAC under the cluster's secret: forwarded client requests
//! and probes in `x-granary-hop`; calls a node makes itself in `x-granary-peer-auth`,
//! which also binds the body and stands in for a client's signature. Forwarded client
//! requests keep the client's `Host` and signature, which the owner checks as if it had
//! been asked directly.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use granary_proto::headers::{HOP, PEER_AUTH, PEER_SHA256};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use http_body_util::{BodyExt, Full};

use super::calls::{self, Call, ObjectKey, Proof, FORWARD_READ_TIMEOUT};
use super::transport::{PeerBody, ReplyBody};
use super::{Cluster, ClusterError, Member};
use crate::backend::{ByteStream, ObjectMeta};
use crate::stats::Metric;

/// A body of these bytes.
pub fn full(bytes: Bytes) -> PeerBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Peers asked for a copy on a miss: the next in the key's ranking, who held the key
/// before a membership change or while this node was down.
const PEER_FILL_CANDIDATES: usize = 2;

/// A request's path and query, as forwarded.
pub fn target_of(uri: &http::Uri) -> String {
    uri.path_and_query()
        .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned())
}

/// Headers that describe one connection, not the message: never forwarded.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// A request to member `m` for `target` (path and query), unmarked.
fn bare_request(m: &Member, method: &Method, target: &str, body: PeerBody) -> Request<PeerBody> {
    let mut req = Request::new(body);
    *req.method_mut() = method.clone();
    *req.uri_mut() = format!("{}{}", m.url, target).parse().unwrap_or_default();
    req
}

impl Cluster {
    /// Makes call `c` of member `m`: its request, proven as the call says, sent; the
    /// reply, or why none came within the call's wait.
    pub async fn call<C: Call>(&self, m: &Member, c: &C) -> Result<C::Reply, ClusterError> {
        let out = c.request();
        let wait = c.wait();
        let mut resp = self.send_call(m, &out, wait).await?;
        // Refused as signed for another incarnation: the member restarted since it was
        // last probed. Learn its boot identity and ask once more.
        if resp.status() == http::StatusCode::FORBIDDEN
            && out.proof == Proof::Signed
            && self.secret.is_some()
        {
            let probe = Box::pin(self.call(m, &calls::Probe { announce: false })).await;
            if probe.is_ok_and(|h| m.set_boot(&h.boot_id)) {
                resp = self.send_call(m, &out, wait).await?;
            }
        }
        let (parts, body) = resp.into_parts();
        let answer = calls::Answer {
            node: &m.id,
            status: parts.status,
            headers: parts.headers,
            body,
        };
        // The reply's body (a JSON document) is bounded by the same wait; a stream's
        // bytes are the caller's to read.
        match tokio::time::timeout(wait, C::reply(answer)).await {
            Ok(reply) => reply,
            Err(_) => Err(self.timeout(m)),
        }
    }

    /// Sends a call's request to member `m`, proven as the call says: the answer's
    /// head, or why none came within `wait`.
    async fn send_call(
        &self,
        m: &Member,
        out: &calls::Request,
        wait: Duration,
    ) -> Result<Response<ReplyBody>, ClusterError> {
        let mut req = match out.proof {
            Proof::Signed => self.own_request(m, out.method.clone(), &out.target, out.body.clone()),
            Proof::Hop => self.request_to(
                m,
                granary_proto::peer::ANY_BOOT,
                &out.method,
                &out.target,
                full(out.body.clone()),
            ),
        };
        let h = req.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        for (k, v) in &out.headers {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.insert(*k, v);
            }
        }
        match tokio::time::timeout(wait, self.transport.send(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(self.unreachable(m, &*e)),
            Err(_) => Err(self.timeout(m)),
        }
    }

    /// A request to member `m` made by this node, proving membership with
    /// `x-granary-peer-auth` over the body's hash where the cluster has a secret (which
    /// stands in for `x-granary-hop` too), else with `x-granary-hop`.
    fn own_request(
        &self,
        m: &Member,
        method: Method,
        target: &str,
        body: Bytes,
    ) -> Request<PeerBody> {
        let boot = m.boot();
        if self.secret.is_none() {
            return self.request_to(m, &boot, &method, target, full(body));
        }
        let sha = if body.is_empty() {
            granary_proto::peer::EMPTY_SHA256.to_owned()
        } else {
            granary_proto::sigv4::sha256_hex(&body)
        };
        let value = self.sign_for(
            &m.id,
            &boot,
            &super::Outgoing {
                method: &method,
                target,
                body_sha256: &sha,
            },
        );
        let mut req = bare_request(m, &method, target, full(body));
        if let Ok(v) = HeaderValue::from_str(&value) {
            req.headers_mut().insert(PEER_AUTH, v);
        }
        if sha != granary_proto::peer::EMPTY_SHA256 {
            if let Ok(h) = HeaderValue::from_str(&sha) {
                req.headers_mut().insert(PEER_SHA256, h);
            }
        }
        req
    }

    /// A request to member `m` (in incarnation `boot`) for `target` (path and query),
    /// marked as coming from a member (`x-granary-hop`, with its proof).
    fn request_to(
        &self,
        m: &Member,
        boot: &str,
        method: &Method,
        target: &str,
        body: PeerBody,
    ) -> Request<PeerBody> {
        let mut req = bare_request(m, method, target, body);
        if let Ok(v) = HeaderValue::from_str(&self.hop_value(&m.id, boot, method, target)) {
            req.headers_mut().insert(HOP, v);
        }
        req
    }

    /// The `x-granary-hop` value of a request to member `to`: this node's proof of
    /// membership, the body unbound (a forwarded client request is the client's to sign).
    fn hop_value(&self, to: &str, boot: &str, method: &Method, target: &str) -> String {
        self.sign_for(
            to,
            boot,
            &super::Outgoing {
                method,
                target,
                body_sha256: granary_proto::peer::UNBOUND,
            },
        )
    }

    /// Sends a client's request on to member `m` and streams its answer back. An error
    /// means no answer came (the member is likely gone); the body may be spent.
    pub async fn forward(
        &self,
        m: &Member,
        method: &Method,
        target: &str,
        headers: &HeaderMap,
        body: PeerBody,
    ) -> Result<Response<ReplyBody>, ClusterError> {
        let mut req = self.request_to(m, &m.boot(), method, target, body);
        let h = req.headers_mut();
        for (k, v) in headers {
            if !hop_by_hop(k) && k.as_str() != HOP && k.as_str() != PEER_AUTH {
                h.append(k.clone(), v.clone());
            }
        }
        let read = method == Method::GET || method == Method::HEAD;
        let send = self.transport.send(req);
        // A write's answer comes after its whole body: only reads are timed.
        let answered = if read {
            tokio::time::timeout(FORWARD_READ_TIMEOUT, send)
                .await
                .map_err(|_| self.timeout(m))?
        } else {
            send.await
        };
        let mut resp = answered.map_err(|e| self.unreachable(m, &*e))?;
        self.stats.add(Metric::Proxied, 1);
        let drop: Vec<HeaderName> = resp
            .headers()
            .keys()
            .filter(|k| hop_by_hop(k))
            .cloned()
            .collect();
        for k in drop {
            resp.headers_mut().remove(k);
        }
        Ok(resp)
    }

    fn unreachable(&self, m: &Member, e: &dyn std::error::Error) -> ClusterError {
        ClusterError::Unreachable {
            node: m.id.clone(),
            why: chain(e),
        }
    }

    fn timeout(&self, m: &Member) -> ClusterError {
        ClusterError::Timeout { node: m.id.clone() }
    }

    /// A committed copy of the object from a peer that holds one, its metadata as the
    /// peer sends it. Asks the next members in the key's ranking; `None` when none has
    /// it or none answers in time.
    pub async fn peer_copy(&self, bucket: &str, key: &str) -> Option<(ObjectMeta, ByteStream)> {
        let candidates: Vec<Arc<Member>> = self
            .others_ranked(bucket, key)
            .into_iter()
            .take(PEER_FILL_CANDIDATES)
            .collect();
        self.copy_from(&candidates, bucket, key).await
    }

    /// A committed copy of the object from one of `members` (the first that answers with
    /// one); `None` when none holds it or answers in time.
    pub async fn copy_from(
        &self,
        members: &[Arc<Member>],
        bucket: &str,
        key: &str,
    ) -> Option<(ObjectMeta, ByteStream)> {
        let call = calls::Copy { bucket, key };
        let asks = members
            .iter()
            .map(|m| {
                let call = &call;
                Box::pin(async move {
                    match self.call(m, call).await {
                        Ok(Some(copy)) => Ok(copy),
                        _ => Err(()),
                    }
                })
            })
            .collect::<Vec<_>>();
        if asks.is_empty() {
            return None;
        }
        let (copy, _rest) = futures::future::select_ok(asks).await.ok()?;
        Some(copy)
    }

    /// Asks member `m`, back after being down (or first heard, or after an invalidation
    /// did not reach it), to check its cached copies against the backend before serving
    /// them.
    pub async fn tell_revalidate(&self, m: &Member) -> Result<(), ClusterError> {
        self.call(m, &calls::Revalidate::default())
            .await
            .map(|_| ())
    }

    /// Tells every other member to check its copies under `bucket/prefix` before their
    /// next hits: the copies they marked, and whether every member took it. One that
    /// did not is marked `missed`, so it checks all its copies before it is routed to
    /// again.
    pub async fn revalidate_members(self: &Arc<Self>, bucket: &str, prefix: &str) -> (usize, bool) {
        let mut targets = self.others();
        targets.extend(self.departed());
        let call = Arc::new(calls::Revalidate {
            bucket: Some(bucket.to_owned()),
            prefix: prefix.to_owned(),
        });
        let told = targets.into_iter().map(|m| {
            let (cluster, call) = (self.clone(), call.clone());
            async move {
                match cluster.call(&m, &*call).await {
                    Ok(r) => Some(r.marked),
                    Err(e) => {
                        tracing::info!(node = %m.id, error = %e, "a member did not take a revalidation; it checks every copy when back");
                        cluster.missed(&m);
                        None
                    }
                }
            }
        });
        let answers = futures::future::join_all(told).await;
        let marked = answers.iter().flatten().sum();
        (marked, answers.iter().all(Option::is_some))
    }

    /// Tells the other members to drop their copies of these objects (written or
    /// deleted through this node), and waits for them: the write is acknowledged only
    /// once every member seen up has dropped its copies, so no read that starts after it
    /// finds an older version anywhere.
    ///
    /// - A member seen up that does not take it within [`INVALIDATE_WAIT`] is marked
    ///   down: it is routed around, and told to check its copies before it is counted up
    ///   again.
    /// - A member seen down is told too, without waiting (it may be back already), and
    ///   is marked as having missed it. A member that just restarted trusts none of its
    ///   copies until every member sees it up (see `membership`), so it serves nothing
    ///   this write made stale.
    /// - Members taken out of the list within [`super::DEPARTED_GRACE`] are told as
    ///   well: a member whose list lags may route to them for a moment.
    pub async fn invalidate_members(self: &Arc<Self>, objects: &[ObjectKey]) {
        if objects.is_empty() {
            return;
        }
        let mut targets = self.others();
        targets.extend(self.departed());
        if targets.is_empty() {
            return;
        }
        let call = Arc::new(calls::Invalidate {
            objects: objects.to_vec(),
        });
        let mut waits = Vec::new();
        let mut unacknowledged = Vec::new();
        for m in targets {
            let wait = m.is_up();
            if !wait {
                self.missed(&m);
                unacknowledged.push(m.clone());
            }
            let (cluster, call, member) = (self.clone(), call.clone(), m.clone());
            let told = tokio::spawn(async move {
                let Err(e) = cluster.call(&m, &*call).await else {
                    return true;
                };
                if m.is_up() {
                    cluster.mark_down(&m, format!("it did not take an invalidation: {e}"));
                } else {
                    cluster.missed(&m);
                }
                false
            });
            if wait {
                waits.push((member, told));
            }
        }
        for (m, told) in waits {
            if !told.await.unwrap_or(false) {
                unacknowledged.push(m);
            }
        }
        // A member that did not take it may still be serving its copies on the lease
        // this node last granted it: the write is acknowledged once that has run out.
        let lease = super::membership::LEASE.as_millis() as u64;
        let until = unacknowledged
            .iter()
            .map(|m| m.granted.load(Ordering::Acquire) + lease)
            .max()
            .unwrap_or(0);
        let now = crate::clock::now_ms();
        if until > now {
            tracing::info!(
                wait_ms = until - now,
                "a member did not take an invalidation: waiting out the lease it holds"
            );
            tokio::time::sleep(Duration::from_millis(until - now)).await;
        }
    }
}

/// An error and its sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    msg
}
