//! Every call a member makes of another, defined once: its request and reply types, and
//! how each travels over HTTP (method, path, the headers that mark it, a JSON body; the
//! answer's status and body). The client side is [`Cluster::call`](super::Cluster::call);
//! the server side is the API's table of peer calls, which reads requests and writes
//! replies with the same definitions. A member that refuses a call answers an S3 error
//! document, whose code reaches the caller intact ([`ClusterError::Refused`]).
//!
//! | call | wire | reply |
//! |---|---|---|
//! | [`Probe`] (health, announcing the sender) | `GET /_granary/health` | [`Health`] |
//! | [`Revalidate`] | `POST /_granary/revalidate` | `()` |
//! | [`Invalidate`] | `POST /_granary/invalidate` | objects dropped |
//! | [`Take`] (a rebalance's offer) | `POST /_granary/take` | [`Taken`] |
//! | [`StartDrain`] | `POST /_granary/drain` | [`Draining`] |
//! | [`PrefetchPart`] | `POST /_granary/prefetch` (`202`) | the part's job id |
//! | [`JobStatus`], [`JobCancel`] | `GET`, `DELETE /_granary/jobs/{id}` | [`JobView`] |
//! | [`IndexShards`] (a catalog's shards, on their owner) | `POST /_granary/index` | [`Indexed`] |
//! | [`SharePlan`] (a job's plan, passed on to every member) | `POST /_granary/plans/share` | `()` |
//! | [`DropPlan`] | `POST /_granary/plans/drop` | `()` |
//! | [`PlanReport`] (a plan's progress, to its home) | `POST /_granary/plans/report` | [`Standing`] |
//! | [`Copy`] (a peer fill, a hand-over's bytes) | `GET /{bucket}/{key}` + `x-granary-peer-fill` | a committed copy, or none |
//! | [`Read`] (a batch item, a spilled read) | `GET /{bucket}/{key}?archpath=&transform=` (+ `x-granary-spill`) | the bytes, or missing |

use granary_proto::Header;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::TryStreamExt;
use granary_proto::encode;
use granary_proto::headers::{PEER_FILL, SPILL};
use granary_proto::S3Code;
use http::{HeaderMap, Method, StatusCode};
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};

use super::transport::ReplyBody;
use super::ClusterError;

/// A probe not answered within this is a failure.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a write waits for a member seen up to drop its copies.
pub const INVALIDATE_WAIT: Duration = Duration::from_secs(2);
/// How long a forwarded read waits for the owner's response headers before the owner
/// counts as gone (a hung process still accepts connections).
pub const FORWARD_READ_TIMEOUT: Duration = Duration::from_secs(5);
use crate::backend::{ByteStream, ObjectMeta};
use crate::jobs::{Counts, Obj};

/// The header a round's probe announces its sender with, and the answer's header that
/// says whether the sender is in the answering member's list ([`KNOWN`] or not).
pub const ANNOUNCE: &str = "x-granary-announce";
/// The value of [`ANNOUNCE`] in an answer from a member that lists the sender and sees
/// it up (which renews the sender's lease).
pub const KNOWN: &str = "known";
/// The value of [`ANNOUNCE`] in an answer from a member that lists the sender but does
/// not see it up (it did not answer being probed back): no lease.
pub const KNOWN_DOWN: &str = "down";
/// The most of an answer's body read for a JSON reply or an error document.
const MAX_REPLY: usize = 64 << 10;

/// How a call proves that a member sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// `x-granary-peer-auth`, binding the body (where the cluster has a secret).
    Signed,
    /// `x-granary-hop`, the body unbound and signed for any incarnation of the receiver:
    /// a probe, which anyone may also ask, and which learns the receiver's boot identity.
    Hop,
}

/// A call's request as it leaves.
pub struct Request {
    pub method: Method,
    /// Path and query.
    pub target: String,
    /// Headers that mark the call.
    pub headers: Vec<(&'static str, String)>,
    /// JSON, or empty.
    pub body: Bytes,
    pub proof: Proof,
}

impl Request {
    fn new(method: Method, target: impl Into<String>) -> Request {
        Request {
            method,
            target: target.into(),
            headers: Vec::new(),
            body: Bytes::new(),
            proof: Proof::Signed,
        }
    }

    fn json(mut self, body: &impl Serialize) -> Request {
        self.body = Bytes::from(serde_json::to_vec(body).expect("call bodies serialize"));
        self
    }
}

/// A member's answer to a call, as it came.
pub struct Answer<'a> {
    /// The member that answered.
    pub node: &'a str,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: ReplyBody,
}

impl Answer<'_> {
    /// The answer as the refusal it is: the S3 code and message its error document
    /// carries, as the member said them.
    pub async fn refused(self, what: &'static str) -> ClusterError {
        let text = read_up_to(self.body, MAX_REPLY).await.unwrap_or_default();
        let (code, message) = match granary_proto::xml::parse_error(&text) {
            Some((code, message)) => (S3Code::parse(&code), message),
            None => (None, String::from_utf8_lossy(&text).into_owned()),
        };
        ClusterError::Refused {
            node: self.node.to_owned(),
            what,
            status: self.status.as_u16(),
            code,
            message,
        }
    }

    /// The JSON reply of an answer with status `ok`.
    async fn json<T: serde::de::DeserializeOwned>(
        self,
        ok: StatusCode,
        what: &'static str,
        limit: usize,
    ) -> Result<T, ClusterError> {
        if self.status != ok {
            return Err(self.refused(what).await);
        }
        let node = self.node.to_owned();
        let garbled = |why: String| ClusterError::Garbled {
            node: node.clone(),
            what,
            why,
        };
        let text = read_up_to(self.body, limit)
            .await
            .map_err(|e| garbled(e.to_string()))?;
        serde_json::from_slice(&text).map_err(|e| garbled(e.to_string()))
    }

    /// The body as a stream of bytes.
    fn stream(self) -> ByteStream {
        Box::pin(self.body.into_data_stream().map_err(io_error))
    }
}

/// At most `limit` bytes of a body; an error beyond.
async fn read_up_to(mut body: ReplyBody, limit: usize) -> std::io::Result<Bytes> {
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(io_error)?.into_data() else {
            continue;
        };
        if out.len() + data.len() > limit {
            return Err(std::io::Error::other(format!(
                "an answer longer than {limit} bytes"
            )));
        }
        out.extend_from_slice(&data);
    }
    Ok(out.freeze())
}

/// A transport's error as an I/O error (a stream's item).
fn io_error(e: super::transport::BoxError) -> std::io::Error {
    std::io::Error::other(e)
}

/// A call one member makes of another.
pub trait Call: Send + Sync {
    /// What the caller gets back.
    type Reply: Send;
    /// What the call is about, in errors and logs.
    const WHAT: &'static str;
    /// The request that carries it.
    fn request(&self) -> Request;
    /// How long the caller waits for the answer's head.
    fn wait(&self) -> Duration;
    /// The reply an answer carries.
    fn reply(answer: Answer<'_>) -> impl Future<Output = Result<Self::Reply, ClusterError>> + Send;
}

/// A call whose request is a JSON body at a fixed route, and whose reply a JSON
/// document: the server side reads and writes both with these.
pub trait JsonCall: Serialize + serde::de::DeserializeOwned + Send + Sync {
    type Reply: Serialize + serde::de::DeserializeOwned + Send;
    const WHAT: &'static str;
    const METHOD: Method;
    const PATH: &'static str;
    /// The status of a successful answer.
    const OK: StatusCode = StatusCode::OK;
    /// How long the caller waits for the answer.
    const WAIT: Duration;
    /// The most of a reply read: one a member sends larger than this is garbled.
    const MAX_REPLY: usize = MAX_REPLY;
}

impl<C: JsonCall> Call for C {
    type Reply = <C as JsonCall>::Reply;
    const WHAT: &'static str = <C as JsonCall>::WHAT;

    fn request(&self) -> Request {
        Request::new(C::METHOD, C::PATH).json(self)
    }

    fn wait(&self) -> Duration {
        C::WAIT
    }

    async fn reply(answer: Answer<'_>) -> Result<Self::Reply, ClusterError> {
        answer
            .json(C::OK, <C as JsonCall>::WHAT, <C as JsonCall>::MAX_REPLY)
            .await
    }
}

// --- health -----------------------------------------------------------------------

/// What an announcing member is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announced {
    /// This node does not list it.
    Unknown,
    /// Listed, but not up here (it did not answer being probed back): this node may
    /// write without it, so it gets no lease from this answer.
    Down,
    /// Listed and up: its lease is renewed.
    Known,
}

/// A probe of a member's health; `announce`: from the sender's regular round (the
/// member probes back before answering if it does not see the sender up).
pub struct Probe {
    pub announce: bool,
}

/// What a node says of itself on `/_granary/health`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Health {
    /// `ok`, or `settling` (answered `503`) until the node's view is settled.
    pub status: String,
    pub node_id: String,
    /// The cache's capacity: the node's weight on the ring.
    #[serde(default)]
    pub capacity_bytes: u64,
    /// Bytes the cache could still admit.
    #[serde(default)]
    pub free_bytes: u64,
    /// Whether the cache admits new objects.
    #[serde(default = "admitting")]
    pub admitting: bool,
    /// The node's boot identity: peer requests are signed for it.
    #[serde(default)]
    pub boot_id: String,
    /// Whether the node is draining (it owns no key, and hands its copies over).
    #[serde(default, skip_serializing_if = "Drain::is_serving")]
    pub drain: Drain,
    /// Its latest hand-over of copies to their owners (a rebalance pass, or a drain's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<Handover>,
    /// Whether the node lists the prober (an announcing probe's answer only; not in the
    /// body).
    #[serde(skip)]
    pub knows_me: Option<bool>,
    /// Whether the node also sees the prober up, so that it will not write without it
    /// for a lease (an announcing probe's answer only).
    #[serde(skip)]
    pub sees_me_up: bool,
}

fn admitting() -> bool {
    true
}

/// A member's part in the cluster: serving, or leaving it by a drain
/// (`POST /_granary/cluster/drain`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum Drain {
    /// It owns its keys.
    #[default]
    Serving,
    /// It owns no key, takes no new fill, and hands every copy it holds to its owner.
    Draining,
    /// It holds no copy any more: it may be stopped and taken out of the list.
    Drained,
}

impl Drain {
    pub fn is_serving(&self) -> bool {
        *self == Drain::Serving
    }

    /// The part whose number (`as u8`: 0 serving, 1 draining, 2 drained) is `code`.
    pub fn from_code(code: u8) -> Drain {
        match code {
            0 => Drain::Serving,
            1 => Drain::Draining,
            _ => Drain::Drained,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Drain::Serving => "serving",
            Drain::Draining => "draining",
            Drain::Drained => "drained",
        }
    }
}

pub use granary_proto::cluster::Handover;

/// Drain a member ([`Drain`]): the receiver drains itself; with `undo`, it serves again.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct StartDrain {
    #[serde(default)]
    pub undo: bool,
}

/// What a member says when told to drain.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Draining {
    pub node: String,
    pub state: Drain,
}

impl JsonCall for StartDrain {
    type Reply = Draining;
    const WHAT: &'static str = "a drain";
    const WAIT: Duration = Duration::from_secs(5);
    const METHOD: Method = Method::POST;
    const PATH: &'static str = "/_granary/drain";
}

impl Health {
    pub fn settled(&self) -> bool {
        self.status == "ok"
    }
}

impl Call for Probe {
    type Reply = Health;
    const WHAT: &'static str = "a health probe";

    fn request(&self) -> Request {
        let mut r = Request::new(Method::GET, "/_granary/health");
        r.proof = Proof::Hop;
        if self.announce {
            r.headers.push((ANNOUNCE, "1".to_owned()));
        }
        r
    }

    fn wait(&self) -> Duration {
        PROBE_TIMEOUT
    }

    async fn reply(answer: Answer<'_>) -> Result<Health, ClusterError> {
        // No answer to the announcement: a member from before announcements, which
        // takes every member's invalidations.
        let said = answer.headers.get(ANNOUNCE).and_then(|v| v.to_str().ok());
        let knows_me = said.is_none_or(|v| v == KNOWN || v == KNOWN_DOWN);
        let sees_me_up = said == Some(KNOWN);
        // A member still settling answers `503` with the same fields: alive, serving.
        let ok = answer.status;
        if ok != StatusCode::OK && ok != StatusCode::SERVICE_UNAVAILABLE {
            return Err(answer.refused(Self::WHAT).await);
        }
        let mut health: Health = answer.json(ok, Self::WHAT, MAX_REPLY).await?;
        health.knows_me = Some(knows_me);
        health.sees_me_up = sees_me_up;
        Ok(health)
    }
}

impl Probe {
    /// The header an answer to an announcing probe carries: what the member was told.
    pub fn reply_header(told: Announced) -> (&'static str, &'static str) {
        let value = match told {
            Announced::Known => KNOWN,
            Announced::Down => KNOWN_DOWN,
            Announced::Unknown => "unknown",
        };
        (ANNOUNCE, value)
    }
}

// --- invalidation and revalidation ------------------------------------------------

/// Check every cached copy against the backend before its next hit (the receiver may
/// have missed changes made through the sender), or, naming a bucket, the copies under
/// a prefix of it (a user's forced revalidation, passed on to every member).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Revalidate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Revalidated {
    pub revalidate: bool,
    /// Copies marked (under a prefix; not counted for all).
    #[serde(default)]
    pub marked: usize,
}

impl JsonCall for Revalidate {
    type Reply = Revalidated;
    const WHAT: &'static str = "a revalidation";
    const WAIT: Duration = Duration::from_secs(2);
    const METHOD: Method = Method::POST;
    const PATH: &'static str = "/_granary/revalidate";
}

/// An object, by bucket and key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub bucket: String,
    pub key: String,
}

impl ObjectKey {
    pub fn new(bucket: &str, key: &str) -> ObjectKey {
        ObjectKey {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        }
    }
}

/// Drop the copies of these objects (written or deleted through the sender).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Invalidate {
    pub objects: Vec<ObjectKey>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Invalidated {
    pub invalidated: usize,
}

impl JsonCall for Invalidate {
    type Reply = Invalidated;
    const WHAT: &'static str = "an invalidation";
    const WAIT: Duration = INVALIDATE_WAIT;
    const METHOD: Method = Method::POST;
    const PATH: &'static str = "/_granary/invalidate";
}

// --- rebalance --------------------------------------------------------------------

/// A rebalance's offer: take the sender's copy of an object the receiver owns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Take {
    pub bucket: String,
    pub key: String,
    pub etag: String,
    pub size: u64,
    /// The member holding the copy.
    pub from: String,
}

/// What became of an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Taken {
    /// The owner holds that version now (it had it, or took it).
    Held,
    /// The copy is not the backend's version (or the object is gone): drop it.
    Stale,
    /// The owner has no room for it.
    NotAdmitted,
    /// The receiver does not own the key (views differ for a moment): try later.
    NotOwner,
    /// The receiver keeps nothing new yet (its view is not settled): try later.
    NotReady,
}

impl JsonCall for Take {
    type Reply = Taken;
    const WHAT: &'static str = "an offered object";
    /// The owner copies the object before it answers.
    const WAIT: Duration = Duration::from_secs(60);
    const METHOD: Method = Method::POST;
    const PATH: &'static str = "/_granary/take";
}

// --- prefetch parts and jobs ------------------------------------------------------

/// `POST /_granary/prefetch`: a bucket and prefix from a user, or (from a prefetch's
/// coordinator, as a call) the objects of one member's part.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefetchPart {
    pub bucket: String,
    #[serde(default)]
    pub prefix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<Vec<Obj>>,
    /// The coordinator's job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part_of: Option<String>,
}

/// A job as `POST /_granary/prefetch` answers it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobStarted {
    pub id: String,
    pub kind: String,
    pub state: String,
}

impl JsonCall for PrefetchPart {
    type Reply = JobStarted;
    const WHAT: &'static str = "a prefetch part";
    const WAIT: Duration = Duration::from_secs(10);
    const METHOD: Method = Method::POST;
    const PATH: &'static str = "/_granary/prefetch";
    const OK: StatusCode = StatusCode::ACCEPTED;
}

/// The route of a job.
pub fn job_path(id: &str) -> String {
    format!("/_granary/jobs/{}", encode::path(id))
}

/// A job's progress, as its node reports it.
#[derive(Debug, Clone)]
pub struct JobView(pub serde_json::Value);

impl JobView {
    pub fn counts(&self) -> Counts {
        serde_json::from_value(self.0.clone()).unwrap_or_default()
    }

    pub fn running(&self) -> bool {
        self.0["state"].as_str() == Some("running")
    }
}

/// A job's progress (a part a member runs, or a job this node does not know).
pub struct JobStatus {
    pub id: String,
}

/// Cancel a job (and its parts).
pub struct JobCancel {
    pub id: String,
}

impl Call for JobStatus {
    type Reply = JobView;
    const WHAT: &'static str = "a job's progress";

    fn request(&self) -> Request {
        Request::new(Method::GET, job_path(&self.id))
    }

    fn wait(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn reply(answer: Answer<'_>) -> Result<JobView, ClusterError> {
        answer
            .json(StatusCode::OK, Self::WHAT, MAX_REPLY)
            .await
            .map(JobView)
    }
}

impl Call for JobCancel {
    type Reply = JobView;
    const WHAT: &'static str = "a job's cancellation";

    fn request(&self) -> Request {
        Request::new(Method::DELETE, job_path(&self.id))
    }

    fn wait(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn reply(answer: Answer<'_>) -> Result<JobView, ClusterError> {
        answer
            .json(StatusCode::OK, Self::WHAT, MAX_REPLY)
            .await
            .map(JobView)
    }
}

// --- catalogs -------------------------------------------------------------------

/// A shard to index, in one version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRef {
    pub key: String,
    pub etag: String,
    pub size: u64,
}

/// Index these shards (the receiver owns them) for a catalog: their samples and where
/// each lies.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IndexShards {
    pub bucket: String,
    pub shards: Vec<ShardRef>,
}

/// The shards indexed, in the order asked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Indexed {
    pub shards: Vec<granary_proto::shards::CatalogShard>,
}

impl JsonCall for IndexShards {
    type Reply = Indexed;
    const WHAT: &'static str = "a shard index";
    /// The owner reads the shards' headers (or, compressed, the shards) first.
    const WAIT: Duration = Duration::from_secs(600);
    /// A shard's entry holds where each of its samples ends, at most 21 bytes a sample
    /// in JSON: a member's 32 shards of 256 samples came to more than the other calls'
    /// 64 KiB, and the catalog of 96 such shards on 3 nodes failed. A call asks for 64
    /// shards at most, so this holds 64 shards of about 50,000 samples each.
    const MAX_REPLY: usize = 64 << 20;
    const METHOD: Method = Method::POST;
    const PATH: &'static str = "/_granary/index";
}

// --- plans ------------------------------------------------------------------------

/// A job's plan, registered through the sender and passed on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SharePlan {
    pub spec: granary_proto::plan::PlanSpec,
}

/// What a plan call answers when there is nothing to say.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Noted {}

impl JsonCall for SharePlan {
    type Reply = Noted;
    const WHAT: &'static str = "a plan";
    const WAIT: Duration = Duration::from_secs(10);
    const METHOD: Method = Method::POST;
    const PATH: &'static str = "/_granary/plans/share";
}

/// A plan dropped through the sender.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DropPlan {
    pub id: String,
}

impl JsonCall for DropPlan {
    type Reply = Noted;
    const WHAT: &'static str = "a plan's drop";
    const WAIT: Duration = Duration::from_secs(5);
    const METHOD: Method = Method::POST;
    const PATH: &'static str = "/_granary/plans/drop";
}

/// A member's progress notes of a plan, to the plan's home.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanReport {
    /// The sender's id.
    pub from: String,
    pub report: crate::plans::Report,
}

impl JsonCall for PlanReport {
    /// `None`: the home holds no such plan.
    type Reply = Option<crate::plans::Standing>;
    const WHAT: &'static str = "a plan's progress";
    const WAIT: Duration = Duration::from_secs(2);
    const METHOD: Method = Method::POST;
    const PATH: &'static str = "/_granary/plans/report";
}

// --- object bytes between members -------------------------------------------------

/// A member's committed copy of an object, never a fill: a peer fill on a miss, and the
/// bytes a rebalance hands over.
pub struct Copy<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
}

impl Call for Copy<'_> {
    /// `None`: the member holds no copy.
    type Reply = Option<(ObjectMeta, ByteStream)>;
    const WHAT: &'static str = "a committed copy";

    fn request(&self) -> Request {
        let mut r = Request::new(Method::GET, encode::object_path(self.bucket, self.key));
        r.headers.push((PEER_FILL, "1".to_owned()));
        r
    }

    fn wait(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn reply(answer: Answer<'_>) -> Result<Self::Reply, ClusterError> {
        match answer.status {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Ok(None),
            _ => return Err(answer.refused(Self::WHAT).await),
        }
        let Some(meta) = meta_of(&answer.headers) else {
            return Err(ClusterError::Garbled {
                node: answer.node.to_owned(),
                what: Self::WHAT,
                why: "no length or ETag".to_owned(),
            });
        };
        Ok(Some((meta, answer.stream())))
    }
}

/// Whether a member's read asks for a committed copy only ([`Copy`]).
pub fn asks_copy(headers: &HeaderMap) -> bool {
    headers.contains_key(PEER_FILL)
}

/// A read of an object, a shard member or a transform's result, from the member that
/// owns it (a batch item), or from a member with room for what the sender could not
/// admit (`refused`: the ids of the members that refused it, the sender among them).
pub struct Read<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
    pub archpath: Option<&'a str>,
    pub transform: Option<&'a str>,
    pub refused: &'a [&'a str],
}

/// What a read found.
pub enum Found {
    /// The bytes: `size` of them, last modified at `mtime` (Unix seconds).
    Bytes {
        size: u64,
        mtime: u64,
        body: ByteStream,
    },
    /// No such object or member.
    Missing,
}

impl Read<'_> {
    /// The path and query of the read.
    pub fn target(&self) -> String {
        let mut t = encode::object_path(self.bucket, self.key);
        let mut sep = '?';
        for (name, value) in [("archpath", self.archpath), ("transform", self.transform)] {
            if let Some(v) = value {
                t.push(sep);
                t.push_str(name);
                t.push('=');
                t.push_str(&encode::query_value(v));
                sep = '&';
            }
        }
        t
    }
}

impl Call for Read<'_> {
    type Reply = Found;
    const WHAT: &'static str = "a read";

    fn request(&self) -> Request {
        let mut r = Request::new(Method::GET, self.target());
        if !self.refused.is_empty() {
            r.headers.push(spill_header(self.refused));
        }
        r
    }

    fn wait(&self) -> Duration {
        FORWARD_READ_TIMEOUT
    }

    async fn reply(answer: Answer<'_>) -> Result<Found, ClusterError> {
        match answer.status {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Ok(Found::Missing),
            _ => return Err(answer.refused(Self::WHAT).await),
        }
        let text = |n: http::HeaderName| {
            answer
                .headers
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let Some(size) = text(http::header::CONTENT_LENGTH).and_then(|v| v.parse().ok()) else {
            return Err(ClusterError::Garbled {
                node: answer.node.to_owned(),
                what: Self::WHAT,
                why: "no length".to_owned(),
            });
        };
        let mtime = text(http::header::LAST_MODIFIED)
            .and_then(|v| httpdate::parse_http_date(&v).ok())
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        Ok(Found::Bytes {
            size,
            mtime,
            body: answer.stream(),
        })
    }
}

/// The header that leaves a read to a member with room: the ids of the members that
/// refused it.
pub fn spill_header(refused: &[&str]) -> (&'static str, String) {
    (SPILL, refused.join(","))
}

/// The members that refused a read left to this node (from a member's request only).
pub fn spilled_by(headers: &HeaderMap) -> Vec<&str> {
    headers
        .get(SPILL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
        .collect()
}

/// An object's metadata from the headers of a `200` answer.
pub fn meta_of(h: &HeaderMap) -> Option<ObjectMeta> {
    let text = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
    let size = text("content-length")?.parse().ok()?;
    let etag = text("etag")?.trim_matches('"').to_owned();
    let last_modified = text("last-modified")
        .and_then(|v| httpdate::parse_http_date(v).ok())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut headers: Vec<Header> = h
        .iter()
        .filter(|(k, _)| granary_proto::headers::is_stored(k.as_str()))
        .filter_map(|(k, v)| Some(Header::new(k.as_str(), v.to_str().ok()?)))
        .collect();
    headers.sort();
    Some(ObjectMeta {
        size,
        etag,
        last_modified,
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_comes_from_an_answer() {
        let mut h = HeaderMap::new();
        h.insert("content-length", "12".parse().unwrap());
        h.insert("etag", "\"abc\"".parse().unwrap());
        h.insert(
            "last-modified",
            "Sun, 06 Nov 1994 08:49:37 GMT".parse().unwrap(),
        );
        h.insert("content-type", "application/x-tar".parse().unwrap());
        h.insert("x-amz-meta-shard", "7".parse().unwrap());
        h.insert("x-granary-cache", "hit".parse().unwrap());
        let m = meta_of(&h).unwrap();
        assert_eq!(m.size, 12);
        assert_eq!(m.etag, "abc");
        assert_eq!(
            m.headers,
            vec![
                Header::new("content-type", "application/x-tar"),
                Header::new("x-amz-meta-shard", "7")
            ]
        );
        h.remove("etag");
        assert!(meta_of(&h).is_none());
    }

    #[test]
    fn reads_encode_keys_members_and_who_refused_them() {
        let mut r = Read {
            bucket: "b",
            key: "dir/a b.tar",
            archpath: Some("x&y=1.jpg"),
            transform: None,
            refused: &[],
        };
        assert_eq!(r.target(), "/b/dir/a%20b.tar?archpath=x%26y%3D1.jpg");
        assert!(r.request().headers.is_empty());
        r.transform = Some("small");
        assert_eq!(
            r.target(),
            "/b/dir/a%20b.tar?archpath=x%26y%3D1.jpg&transform=small"
        );
        r.archpath = None;
        r.refused = &["n1", "n2"];
        assert_eq!(r.target(), "/b/dir/a%20b.tar?transform=small");
        let req = r.request();
        assert_eq!(req.headers, vec![(SPILL, "n1,n2".to_owned())]);
        let mut h = HeaderMap::new();
        h.insert(SPILL, "n1,n2".parse().unwrap());
        assert_eq!(spilled_by(&h), ["n1", "n2"]);
        assert!(spilled_by(&HeaderMap::new()).is_empty());
    }

    #[test]
    fn json_calls_keep_their_wire_form() {
        let inv = Invalidate {
            objects: vec![ObjectKey {
                bucket: "b".into(),
                key: "k".into(),
            }],
        };
        let req = inv.request();
        assert_eq!(
            (req.method, req.target.as_str()),
            (Method::POST, "/_granary/invalidate")
        );
        assert_eq!(&req.body[..], br#"[{"bucket":"b","key":"k"}]"#);
        let part = PrefetchPart {
            bucket: "b".into(),
            prefix: "p/".into(),
            objects: Some(vec![Obj {
                key: "p/1".into(),
                size: 3,
            }]),
            part_of: Some("j".into()),
        };
        let v: serde_json::Value = serde_json::from_slice(&part.request().body).unwrap();
        assert_eq!(v["objects"][0]["size"], 3);
        assert_eq!(v["part_of"], "j");
        // A user's prefetch names a bucket and a prefix only.
        let user: PrefetchPart = serde_json::from_str(r#"{"bucket":"b","prefix":"p/"}"#).unwrap();
        assert!(user.objects.is_none() && user.part_of.is_none());
        assert!(serde_json::from_str::<PrefetchPart>(r#"{"bucket":"b","x":1}"#).is_err());
        assert_eq!(
            serde_json::to_string(&Taken::NotAdmitted).unwrap(),
            "\"not-admitted\""
        );
        assert_eq!(
            JobStatus { id: "a b".into() }.request().target,
            "/_granary/jobs/a%20b"
        );
        let probe = Probe { announce: true }.request();
        assert_eq!(probe.proof, Proof::Hop);
        assert_eq!(probe.headers, vec![(ANNOUNCE, "1".to_owned())]);
    }

    #[tokio::test]
    async fn a_refusal_keeps_the_members_code_and_message() {
        let doc = granary_proto::xml::error_doc("SlowDown", "too busy", None, &[], "r1");
        let answer = Answer {
            node: "b",
            status: StatusCode::SERVICE_UNAVAILABLE,
            headers: HeaderMap::new(),
            body: crate::cluster::testnet::body(doc),
        };
        match answer.refused("a read").await {
            ClusterError::Refused {
                node,
                status,
                code,
                message,
                ..
            } => {
                assert_eq!((node.as_str(), status), ("b", 503));
                assert_eq!(code, Some(S3Code::SlowDown));
                assert_eq!(message, "too busy");
            }
            other => panic!("{other:?}"),
        }
        // An answer with no error document (a proxy in between): the status alone.
        let bare = Answer {
            node: "b",
            status: StatusCode::BAD_GATEWAY,
            headers: HeaderMap::new(),
            body: crate::cluster::testnet::body("upstream gone"),
        };
        let ClusterError::Refused { code, message, .. } = bare.refused("a read").await else {
            panic!("a refusal");
        };
        assert_eq!((code, message.as_str()), (None, "upstream gone"));
        // A reply that is not the call's: garbled, not refused.
        let garbled = Answer {
            node: "b",
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: crate::cluster::testnet::body("not json"),
        };
        let e = garbled
            .json::<Taken>(StatusCode::OK, "an offer", MAX_REPLY)
            .await
            .unwrap_err();
        assert!(matches!(e, ClusterError::Garbled { .. }), "{e:?}");
    }

    /// A shard index's reply may be larger than other calls': 120 KB of samples' ends
    /// is read whole for it, and garbled for a call held to 64 KiB.
    #[tokio::test]
    async fn a_shard_index_may_answer_more_than_other_calls() {
        let indexed = Indexed {
            shards: vec![granary_proto::shards::CatalogShard {
                key: "s.tar".into(),
                etag: "e".into(),
                size: 1 << 30,
                samples: 20_000,
                ends: Some((1..=20_000u64).map(|i| i * 50_000).collect()),
            }],
        };
        let json = serde_json::to_vec(&indexed).unwrap();
        assert!(json.len() > MAX_REPLY, "{}", json.len());
        let answer = || Answer {
            node: "b",
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: crate::cluster::testnet::body(json.clone()),
        };
        let got = <IndexShards as Call>::reply(answer()).await.unwrap();
        assert_eq!(got.shards[0].ends, indexed.shards[0].ends);
        let e = <PlanReport as Call>::reply(answer()).await.unwrap_err();
        assert!(
            matches!(&e, ClusterError::Garbled { why, .. } if why.contains("longer than 65536")),
            "{e:?}"
        );
    }
}
