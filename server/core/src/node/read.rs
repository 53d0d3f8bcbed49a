//! Reads: an object, a range of it, a member of a tar shard (`archpath`), or a
//! transform's result, with the client's conditions, in one of four modes (stream,
//! metadata, committed copy only, local file). Every read goes through the cache.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt;
use granary_proto::range::RangeSpec;

use std::sync::Arc;

use super::{Node, NodeError};
use crate::archive::{self, Format};
use crate::backend::{BackendError, ByteRange, ObjectMeta, Refusal};
use crate::cache::{self, Body, CacheError, DeriveError, LocalReader, Mode, Origin};
use crate::cluster::transport::ReplyBody;
use crate::cluster::Member;
use crate::stats::Metric;
use crate::transform::pipelines::{Failure, NamedPipeline, PrepKey};
use crate::transform::{self, pool, Derived, Input, Named, TransformError, Work, RESULTS};
use futures::TryFutureExt;
use granary_prep::PrepError;
use http::request::Parts;
use http::Response;

/// The conditional headers of a read, parsed.
#[derive(Debug, Clone, Default)]
pub struct Conditions {
    pub if_match: Option<String>,
    pub if_none_match: Option<String>,
    pub if_modified_since: Option<SystemTime>,
    pub if_unmodified_since: Option<SystemTime>,
}

/// Whether an `If-Match`/`If-None-Match` list names `etag` (or is `*`).
pub fn etag_matches(list: &str, etag: &str) -> bool {
    list.split(',')
        .map(granary_proto::encode::unquote)
        .any(|t| t == "*" || t == etag)
}

impl Conditions {
    /// Whether the object may be served: S3's order, `If-Match` before
    /// `If-Unmodified-Since`, `If-None-Match` before `If-Modified-Since`.
    pub fn check(&self, meta: &ObjectMeta) -> Result<(), Refusal> {
        let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mtime = secs(meta.last_modified);
        if let Some(v) = &self.if_match {
            if !etag_matches(v, &meta.etag) {
                return Err(Refusal::PreconditionFailed);
            }
        } else if let Some(t) = self.if_unmodified_since {
            if mtime > secs(t) {
                return Err(Refusal::PreconditionFailed);
            }
        }
        if let Some(v) = &self.if_none_match {
            if etag_matches(v, &meta.etag) {
                return Err(not_modified(meta));
            }
        } else if let Some(t) = self.if_modified_since {
            if mtime <= secs(t) {
                return Err(not_modified(meta));
            }
        }
        Ok(())
    }
}

fn not_modified(meta: &ObjectMeta) -> Refusal {
    Refusal::NotModified {
        etag: meta.etag.clone(),
        last_modified: meta.last_modified,
    }
}

/// How a read is to be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// The bytes, streamed.
    Stream,
    /// Metadata only (HEAD).
    Head,
    /// A committed copy only, never a fill (a peer asking for it).
    Committed,
    /// The cache file itself for a client on this machine, where it can be held; the
    /// client reads it as it says.
    Local(LocalReader),
}

/// What to read.
#[derive(Debug, Clone)]
pub struct ReadRequest<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
    /// A member of the object as a tar shard (`archpath`).
    pub member: Option<&'a str>,
    /// Where the member's data starts in the shard: which copy of a name the shard
    /// holds twice (read from this node's index of the shard, never elsewhere).
    pub member_at: Option<u64>,
    /// A configured transform applied to the object or member.
    pub transform: Option<&'a str>,
    pub range: Option<RangeSpec>,
    pub conditions: Conditions,
    pub mode: ReadMode,
}

impl<'a> ReadRequest<'a> {
    /// The whole object, streamed, unconditionally.
    pub fn object(bucket: &'a str, key: &'a str) -> ReadRequest<'a> {
        ReadRequest {
            bucket,
            key,
            member: None,
            member_at: None,
            transform: None,
            range: None,
            conditions: Conditions::default(),
            mode: ReadMode::Stream,
        }
    }
}

/// A read's answer: the metadata of the object read (of the shard, for a member), the
/// size of what was read (the member's, for a member), the range of it sent, and where
/// the bytes came from.
pub struct Reply {
    pub meta: ObjectMeta,
    pub size: u64,
    pub range: Option<ByteRange>,
    pub origin: Origin,
    pub body: Body,
}

impl Reply {
    fn of(read: cache::Read) -> Reply {
        Reply {
            size: read.meta.size,
            meta: read.meta,
            range: read.range,
            origin: read.origin,
            body: read.body,
        }
    }
}

/// A client's read that may have been left to another member ([`Node::read_spilling`]).
pub enum Spilled {
    Here(Reply),
    /// The member with room answered: its answer, streamed back.
    Answered(Response<ReplyBody>),
}

/// A read that may be left to another member ([`Node::read_or_leave`]).
pub(crate) enum Served {
    Here(Reply),
    /// This node cannot admit the object and this member has room: ask it.
    Elsewhere(Arc<Member>),
}

/// The bytes a range names in an object of `size` bytes.
fn resolve(range: Option<RangeSpec>, size: u64) -> Result<Option<ByteRange>, Refusal> {
    let Some(spec) = range else {
        return Ok(None);
    };
    spec.answer(size)
        .map(|r| r.map(ByteRange::from))
        .map_err(|_| Refusal::Unsatisfiable { size })
}

impl Node {
    /// Reads what `req` names. Member and transform reads are boxed: their futures are
    /// large, and a plain object read (the hot path) should not carry their size.
    pub async fn read(self: &Arc<Self>, req: &ReadRequest<'_>) -> Result<Reply, NodeError> {
        match (req.transform, req.member) {
            (Some(t), _) => Box::pin(self.read_transformed(req, t)).await,
            (None, Some(m)) => Box::pin(self.read_member(req, m)).await,
            (None, None) => {
                self.room_for_planned(req.bucket, req.key);
                let reply = self.read_object(req, mode_of(req.mode)).await?;
                Ok(self.counted_as_demand(req, reply))
            }
        }
    }

    /// A client's read waiting on the backend: the planner, when it has plans, waits
    /// for it while its body lives (with none, nothing to count on the read path).
    fn counted_as_demand(&self, req: &ReadRequest<'_>, mut reply: Reply) -> Reply {
        if !matches!(reply.origin, Origin::Miss | Origin::Bypass) || self.plans.is_empty() {
            return reply;
        }
        if reply.origin == Origin::Miss && self.fetching_planned(req.bucket, req.key) {
            self.waited_now();
            return reply;
        }
        tracing::debug!(origin = ?reply.origin, range = ?reply.range, "a client's read waits on the backend");
        reply.body = match std::mem::replace(&mut reply.body, Body::Empty) {
            Body::Stream(s) => {
                let demand = self.demand();
                Body::Stream(Box::pin(s.map(move |item| {
                    let _held = &demand;
                    item
                })))
            }
            // A file (a local read, filled first) or nothing: no wait here.
            other => other,
        };
        reply
    }

    /// [`Node::read`], but an object this node cannot admit is left to a member with
    /// room, as last heard (`tried`: the ids of members that refused it already).
    pub(crate) async fn read_or_leave(
        self: &Arc<Self>,
        req: &ReadRequest<'_>,
        tried: &[&str],
    ) -> Result<Served, NodeError> {
        let plain = req.transform.is_some() || req.member.is_some() || req.mode != ReadMode::Stream;
        // A planned dataset's shards stay with their owners: the planner makes room for
        // them there, and a copy left elsewhere would hold room no plan counts on.
        if plain || !self.cluster.can_spill(tried) || self.plans.covers(req.bucket, req.key) {
            return self.read(req).await.map(Served::Here);
        }
        let reply = match self.read_object(req, Mode::StreamOrDecline).await {
            Err(NodeError::Cache(CacheError::NotAdmitted { size })) => {
                match self.cluster.spill_target(req.bucket, req.key, size, tried) {
                    Some(i) => return Ok(Served::Elsewhere(i)),
                    None => self.read_object(req, Mode::Stream).await,
                }
            }
            other => other,
        }?;
        Ok(Served::Here(self.counted_as_demand(req, reply)))
    }

    /// [`Node::read_or_leave`] as a client's read: an object left to a member with
    /// room is read through it (`parts`: the client's request), and when that member
    /// does not answer it is marked down and the object read here.
    pub async fn read_spilling(
        self: &Arc<Self>,
        req: &ReadRequest<'_>,
        parts: &Parts,
        tried: &[&str],
    ) -> Result<Spilled, NodeError> {
        match self.read_or_leave(req, tried).await? {
            Served::Here(reply) => Ok(Spilled::Here(reply)),
            Served::Elsewhere(m) => match self.forward_spilled(&m, parts, tried).await {
                Ok(resp) => Ok(Spilled::Answered(resp)),
                Err(why) => {
                    self.cluster.mark_down(&m, why);
                    Ok(Spilled::Here(self.read(req).await?))
                }
            },
        }
    }

    pub(super) async fn read_object(
        self: &Arc<Self>,
        req: &ReadRequest<'_>,
        mode: Mode,
    ) -> Result<Reply, NodeError> {
        self.read_object_from(&*self.backend, req, mode).await
    }

    /// [`Node::read_object`] with the cache's misses read from `src`.
    pub(super) async fn read_object_from(
        self: &Arc<Self>,
        src: &dyn crate::backend::Source,
        req: &ReadRequest<'_>,
        mode: Mode,
    ) -> Result<Reply, NodeError> {
        let range = |meta: &ObjectMeta| -> Result<Option<ByteRange>, Refusal> {
            req.conditions.check(meta)?;
            resolve(req.range, meta.size)
        };
        let read = self
            .cache
            .read(src, req.bucket, req.key, &range, mode)
            .await?;
        let mut reply = Reply::of(read);
        if mode == Mode::Committed {
            // A peer filling from this node.
            self.stats.add(Metric::PeerServes, 1);
            let stats = self.stats.clone();
            let body = reply.body.into_stream().map(move |item| {
                if let Ok(b) = &item {
                    stats.add(Metric::BytesToPeers, b.len() as u64);
                }
                item
            });
            reply.body = Body::Stream(Box::pin(body));
        }
        Ok(reply)
    }

    /// A member of a `.tar`, `.tar.gz` or `.tgz` shard: through the member index of a
    /// cached `.tar`, or by scanning the shard's stream. Conditions apply to the shard,
    /// the range to the member.
    async fn read_member(
        self: &Arc<Self>,
        req: &ReadRequest<'_>,
        member: &str,
    ) -> Result<Reply, NodeError> {
        let format = shard_format(req.key, member)?;
        if let (Format::Tar, ReadMode::Local(reader)) = (format, req.mode) {
            if let Some(reply) = self.local_member(req, member, reader).await? {
                return Ok(reply);
            }
        }
        let src = &*self.backend;
        let head = req.mode == ReadMode::Head;
        if format == Format::Tar {
            if let Some((meta, idx)) = self.cache.tar_index(src, req.bucket, req.key).await? {
                req.conditions.check(&meta)?;
                let name = archive::normalize(member);
                let m = *match req.member_at {
                    Some(at) => idx.at(name, at),
                    None => idx.get(name),
                }
                .ok_or_else(|| NodeError::NoMember(member.to_owned()))?;
                let range = resolve(req.range, m.size)?;
                let (a, b) = range.map_or((0, m.size), |x| (x.start, x.end));
                let body = if head {
                    Body::Empty
                } else {
                    let part = ByteRange {
                        start: m.offset + a,
                        end: m.offset + b,
                    };
                    let read = self
                        .cache
                        .read(
                            src,
                            req.bucket,
                            req.key,
                            &|_| Ok(Some(part)),
                            Mode::Committed,
                        )
                        .await;
                    match read {
                        Ok(read) => read.body,
                        Err(CacheError::NotHeld) => {
                            return Err(NodeError::Changed(
                                "the shard left the cache while it was read; retry",
                            ))
                        }
                        Err(e) => return Err(e.into()),
                    }
                };
                self.stats.add(Metric::Hits, 1);
                return Ok(Reply {
                    meta,
                    size: m.size,
                    range,
                    origin: Origin::Hit,
                    body,
                });
            }
        }
        if req.member_at.is_some() {
            // Which copy of the name was found in an index this node no longer holds.
            return Err(NodeError::Changed(
                "the shard left the cache while its members were read; retry",
            ));
        }
        // Not indexed: the shard's stream, through the cache like any read, scanned.
        let whole = |meta: &ObjectMeta| -> Result<Option<ByteRange>, Refusal> {
            req.conditions.check(meta)?;
            Ok(None)
        };
        let read = self
            .cache
            .read(src, req.bucket, req.key, &whole, Mode::Stream)
            .await?;
        let (size, body) = archive::scan(read.body.into_stream(), format, member)
            .await
            .map_err(|e| NodeError::NotAShard(e.to_string()))?
            .ok_or_else(|| NodeError::NoMember(member.to_owned()))?;
        let range = resolve(req.range, size)?;
        let body = match (head, range) {
            (true, _) => Body::Empty,
            (false, Some(x)) => Body::Stream(cache::slice(body, x.start, x.end)),
            (false, None) => Body::Stream(body),
        };
        Ok(Reply {
            meta: read.meta,
            size,
            range,
            origin: read.origin,
            body,
        })
    }

    /// A member of a `.tar` shard as a range of the shard's cache file (the shard filled
    /// first when this node does not hold it); `None` when this node cannot hold it.
    async fn local_member(
        self: &Arc<Self>,
        req: &ReadRequest<'_>,
        member: &str,
        reader: LocalReader,
    ) -> Result<Option<Reply>, NodeError> {
        let (src, cache) = (&*self.backend, &self.cache);
        let mut origin = Origin::Hit;
        let mut indexed = cache.tar_index(src, req.bucket, req.key).await?;
        if indexed.is_none() && !cache.refusing() && cache.hold(src, req.bucket, req.key).await? {
            origin = Origin::Miss;
            indexed = cache.tar_index(src, req.bucket, req.key).await?;
        }
        let Some((meta, idx)) = indexed else {
            return Ok(None);
        };
        req.conditions.check(&meta)?;
        let m = *idx
            .get(archive::normalize(member))
            .ok_or_else(|| NodeError::NoMember(member.to_owned()))?;
        let range = resolve(req.range, m.size)?;
        let (a, b) = range.map_or((0, m.size), |x| (x.start, x.end));
        let etag = meta.etag.clone();
        // Still the shard whose index gave the offset.
        let part = move |shard: &ObjectMeta| -> Result<Option<ByteRange>, Refusal> {
            if shard.etag != etag {
                return Err(Refusal::Changed(
                    "the shard changed while it was read; retry",
                ));
            }
            Ok(Some(ByteRange {
                start: m.offset + a,
                end: m.offset + b,
            }))
        };
        let read = cache
            .read(src, req.bucket, req.key, &part, Mode::Local(reader))
            .await?;
        let Body::File(file) = read.body else {
            return Ok(None);
        };
        Ok(Some(Reply {
            meta,
            size: m.size,
            range,
            origin,
            body: Body::File(file),
        }))
    }

    /// An object or shard member after a configured transform. The result is read
    /// through the cache under a key naming the source's version and the transform's
    /// definition, so it is computed once, shared, and never stale.
    async fn read_transformed(
        self: &Arc<Self>,
        req: &ReadRequest<'_>,
        name: &str,
    ) -> Result<Reply, NodeError> {
        let t = self.transforms.lookup(name)?;
        if let Some(member) = req.member {
            shard_format(req.key, member)?;
        }
        // The source's version names the result.
        let source = self
            .cache
            .read(
                &*self.backend,
                req.bucket,
                req.key,
                &|_| Ok(None),
                Mode::Head,
            )
            .await?
            .meta;
        let mut derived = Derived::new(req.bucket, req.key, req.member, &source.etag, &t);
        derived.at = req.member_at;
        let range = |meta: &ObjectMeta| -> Result<Option<ByteRange>, Refusal> {
            req.conditions.check(meta)?;
            resolve(req.range, meta.size)
        };
        let mode = match req.mode {
            ReadMode::Local(reader) => Mode::Local(reader),
            _ => Mode::Stream,
        };
        let compute = || self.compute(&derived, &t);
        let read = self
            .cache
            .read_derived(RESULTS, &derived.cache_key(), &range, mode, compute)
            .await
            .map_err(|e| match e {
                DeriveError::Compute(e) => e,
                DeriveError::Cache(e) => e.into(),
            })?;
        if read.origin == Origin::Hit {
            self.stats.add(Metric::TransformHits, 1);
        }
        let mut reply = Reply::of(read);
        if req.mode == ReadMode::Head {
            reply.body = Body::Empty;
        }
        Ok(reply)
    }

    /// Computes a result: the source read whole once the prep pool admits it (refused
    /// where the transform cannot take it, before the rest of it is read), still the
    /// version the result is keyed by, then the transform.
    async fn compute(
        self: &Arc<Self>,
        d: &Derived,
        t: &Named,
    ) -> Result<(ObjectMeta, Bytes), NodeError> {
        let mut req = ReadRequest::object(&d.bucket, &d.key);
        req.member = d.archpath.as_deref();
        req.member_at = d.at;
        let refused = |e: PrepError| -> NodeError {
            TransformError::Failed {
                name: t.name.clone(),
                why: e.to_string(),
            }
            .into()
        };
        let work = (t.work(), pool::TRANSFORM);
        let (meta, input) = self.read_input(&req, work, refused).await?;
        if meta.etag != d.etag {
            return Err(NodeError::Changed(
                "the source changed while it was transformed; retry",
            ));
        }
        let out = self.transforms.run(t, input).await?;
        Ok((transform::result_meta(t, &out), out))
    }

    /// An object or shard member read whole for `work` (a transform or a pipeline), once
    /// the prep pool admits what the work takes ([`transform::gather`]); `refused`: the
    /// error of a source the work cannot take.
    pub(super) async fn read_input(
        self: &Arc<Self>,
        req: &ReadRequest<'_>,
        work: (Work<'_>, pool::Counts),
        refused: impl Fn(PrepError) -> NodeError,
    ) -> Result<(ObjectMeta, Input), NodeError> {
        let source = match req.member {
            Some(m) => self.read_member(req, m).await?,
            None => self.read_object(req, Mode::Stream).await?,
        };
        let cut =
            |e: std::io::Error| -> NodeError { BackendError::Unavailable(e.to_string()).into() };
        let input = transform::gather(
            self.transforms.pool(),
            work,
            source.size,
            source.body.into_stream(),
            cut,
            refused,
        )
        .await?;
        Ok((source.meta, input))
    }

    /// An image object prepared by pipeline `p` for (seed, epoch), keyed by its key;
    /// refused where `if_match` does not name its version.
    pub async fn read_prepared(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        p: &Arc<NamedPipeline>,
        job: (u64, u64),
        if_match: Option<&str>,
    ) -> Result<Bytes, NodeError> {
        // The source's version names the sample: a kept one is served without reading it.
        let req = ReadRequest::object(bucket, key);
        let meta = self
            .cache
            .read(&*self.backend, bucket, key, &|_| Ok(None), Mode::Head)
            .await?
            .meta;
        Conditions {
            if_match: if_match.map(str::to_owned),
            ..Conditions::default()
        }
        .check(&meta)?;
        let etag = meta.etag;
        let kept_as = PrepKey::new(p, job, bucket, key, &etag, "");
        let readers = self.plans.readers(bucket, key, job.0, job.1, &p.name);
        let make = async {
            let refused = |e| prep_refused(p, key, e);
            let (meta, input) = self
                .read_input(&req, (Work::Prepare(&p.pipeline), pool::PREP), refused)
                .await?;
            if meta.etag != etag {
                return Err(NodeError::Changed(
                    "the source changed while it was prepared; retry",
                ));
            }
            self.prepare(p, input, job, key).await
        };
        let pipelines = self.transforms.pipelines();
        pipelines
            .kept_or_prepared(&kept_as, readers, &self.stats, make.map_err(shared))
            .await
            .map_err(unshared)
    }

    /// The member index of a `.tar` shard and the version it indexes, reading the shard
    /// into the cache first if need be (for a transform of its members one by one, or a
    /// listing of them).
    pub async fn shard_index(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
    ) -> Result<(ObjectMeta, Arc<archive::TarIndex>), NodeError> {
        let src = &*self.backend;
        if let Some(found) = self.cache.tar_index(src, bucket, key).await? {
            return Ok(found);
        }
        if self.cache.hold(src, bucket, key).await? {
            if let Some(found) = self.cache.tar_index(src, bucket, key).await? {
                return Ok(found);
            }
        }
        Err(NodeError::ShardNotHeld)
    }
}

/// The cache mode of a read mode.
fn mode_of(mode: ReadMode) -> Mode {
    match mode {
        ReadMode::Stream => Mode::Stream,
        ReadMode::Head => Mode::Head,
        ReadMode::Committed => Mode::Committed,
        ReadMode::Local(reader) => Mode::Local(reader),
    }
}

/// The shard format of `key` for reading `member` out of it.
fn shard_format(key: &str, member: &str) -> Result<Format, NodeError> {
    if archive::normalize(member).is_empty() {
        return Err(NodeError::Invalid(
            "archpath must name a member of the shard".into(),
        ));
    }
    Format::of(key).ok_or_else(|| {
        NodeError::Invalid("archpath reads members of .tar, .tar.gz and .tgz objects".into())
    })
}

/// Why pipeline `p` could not prepare `sample`.
pub(super) fn prep_refused(p: &NamedPipeline, sample: &str, e: PrepError) -> NodeError {
    TransformError::Prep {
        pipeline: p.name.clone(),
        sample: sample.to_owned(),
        why: e.to_string(),
    }
    .into()
}

/// A failure, as every request that waited for one preparation shares it.
pub(super) fn shared(e: NodeError) -> Failure {
    Arc::new(e)
}

/// A shared failure, back as the node's error.
pub(super) fn unshared(f: Failure) -> NodeError {
    match f.downcast::<NodeError>() {
        Ok(e) => NodeError::Shared(e),
        Err(_) => NodeError::Busy("a preparation failed in a way this node does not know".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hot path's future is moved and boxed on every request (axum boxes handler
    /// futures): the big, rare branches (members, transforms, local files) are boxed so
    /// that a plain object read does not carry their size. A future of 16 KiB cost a
    /// 100 KiB warm GET 80% more instructions in memcpy alone.
    #[test]
    fn the_object_read_future_stays_small() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Arc::new(crate::stats::Stats::default());
        let engine = crate::io::engine(crate::io::EngineChoice::Std).unwrap();
        let cache = crate::cache::Cache::open(
            &dir.path().join("cache"),
            1 << 20,
            crate::cache::CachePolicy::NeverEvict,
            true,
            engine,
            stats.clone(),
        )
        .unwrap();
        let backend =
            Arc::new(crate::backend::fs::FsBackend::open(&dir.path().join("origin")).unwrap());
        let cluster = crate::cluster::Cluster::new(
            &crate::cluster::ClusterConfig::default(),
            "solo",
            1,
            stats.clone(),
        )
        .unwrap();
        let node = Node::new(
            backend,
            Arc::new(cache),
            Arc::new(cluster),
            stats,
            crate::transform::Transforms::default(),
            0,
        );
        let req = ReadRequest::object("b", "k");
        let read = node.read(&req);
        let leave = node.read_or_leave(&req, &[]);
        assert!(std::mem::size_of_val(&read) < 4096);
        assert!(std::mem::size_of_val(&leave) < 4096);
    }

    fn meta(etag: &str, mtime: u64) -> ObjectMeta {
        ObjectMeta {
            size: 1,
            etag: etag.into(),
            last_modified: UNIX_EPOCH + std::time::Duration::from_secs(mtime),
            headers: Vec::new(),
        }
    }

    #[test]
    fn etag_lists() {
        assert!(etag_matches("\"abc\"", "abc"));
        assert!(etag_matches("\"x\", \"abc\"", "abc"));
        assert!(etag_matches("*", "abc"));
        assert!(etag_matches("W/\"abc\"", "abc"));
        assert!(!etag_matches("\"abd\"", "abc"));
    }

    #[test]
    fn conditions_in_s3_order() {
        let m = meta("e", 1000);
        let at = |s| Some(UNIX_EPOCH + std::time::Duration::from_secs(s));
        let c = Conditions {
            if_match: Some("\"e\"".into()),
            if_unmodified_since: at(10),
            ..Conditions::default()
        };
        assert_eq!(
            c.check(&m),
            Ok(()),
            "If-Match wins over If-Unmodified-Since"
        );
        let c = Conditions {
            if_none_match: Some("\"x\"".into()),
            if_modified_since: at(5000),
            ..Conditions::default()
        };
        assert_eq!(
            c.check(&m),
            Ok(()),
            "If-None-Match wins over If-Modified-Since"
        );
        let c = Conditions {
            if_modified_since: at(1000),
            ..Conditions::default()
        };
        assert_eq!(c.check(&m), Err(not_modified(&m)));
        let c = Conditions {
            if_match: Some("\"y\"".into()),
            ..Conditions::default()
        };
        assert_eq!(c.check(&m), Err(Refusal::PreconditionFailed));
    }
}
