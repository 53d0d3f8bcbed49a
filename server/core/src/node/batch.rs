//! The items of a GetBatch: each an object or a shard member (optionally transformed),
//! fetched from its owner: this node's cache, or the owning member (the next owner when
//! one does not answer). Items up to [`WHOLE_BELOW`] are read whole while they wait their
//! turn; larger ones stream when it comes. How the answer is framed is the API's.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;

use super::read::{shared, unshared};
use super::{Node, NodeError, ReadRequest, Reply, Served};
use crate::backend::ByteStream;
use crate::cluster::calls::{Found, Read};
use crate::cluster::ring::key_hash;
use crate::cluster::{ClusterError, Member};
use crate::transform::pipelines::{NamedPipeline, PrepKey};
use crate::transform::Work;
use futures::TryFutureExt;
use granary_proto::shards::split_name;

/// Items up to this size are read whole while they wait their turn (so at most the
/// batch's parallelism of them are held); larger ones stream when their turn comes.
pub const WHOLE_BELOW: u64 = 1 << 20;

/// One item of a batch.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Item {
    pub bucket: String,
    pub key: String,
    #[serde(default)]
    pub archpath: Option<String>,
    /// A configured transform applied to the item (its result is cached and shared).
    #[serde(default)]
    pub transform: Option<String>,
    /// Where the member's data starts in the shard, for a name the shard holds twice:
    /// read from this node's index of the shard (never asked of a client).
    #[serde(skip)]
    pub at: Option<u64>,
}

/// An item's bytes: in memory, or a stream to read in its turn.
pub enum Data {
    Whole(Bytes),
    Stream(ByteStream),
}

/// What fetching an item found.
pub enum Outcome {
    Found { size: u64, mtime: u64, data: Data },
    Missing,
}

impl Item {
    /// A member of a shard, transformed or not.
    pub fn member(bucket: &str, key: &str, member: &str, transform: Option<&str>) -> Item {
        Item {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            archpath: Some(member.to_owned()),
            transform: transform.map(str::to_owned),
            at: None,
        }
    }

    /// The copy of the member whose data starts at `at` in the shard this node indexed
    /// (a shard that holds its name twice).
    pub fn at(self, at: u64) -> Item {
        Item {
            at: Some(at),
            ..self
        }
    }

    /// The item's member name in the answer: `KEY`, or `KEY/ARCHPATH`.
    pub fn name(&self) -> String {
        match &self.archpath {
            Some(a) => format!("{}/{}", self.key, a),
            None => self.key.clone(),
        }
    }

    /// The read that fetches it from another member; `refused`: the members that
    /// could not admit it.
    fn call<'a>(&'a self, refused: &'a [&'a str]) -> Read<'a> {
        Read {
            bucket: &self.bucket,
            key: &self.key,
            archpath: self.archpath.as_deref(),
            transform: self.transform.as_deref(),
            refused,
        }
    }

    fn request(&self) -> ReadRequest<'_> {
        let mut req = ReadRequest::object(&self.bucket, &self.key);
        req.member = self.archpath.as_deref();
        req.member_at = self.at;
        req.transform = self.transform.as_deref();
        req
    }
}

impl Node {
    /// Fetches one item from its owner: this node, or the owning member (the next one
    /// when it does not answer).
    pub async fn fetch_item(self: &Arc<Self>, it: &Item) -> Result<Outcome, NodeError> {
        let c = &self.cluster;
        // A copy found by its place in this node's index is read here.
        if !c.is_single() && it.at.is_none() {
            let kh = key_hash(&it.bucket, &it.key);
            for _ in 0..c.members().len() {
                let owner = c.owner_of_hash(kh);
                if c.is_me(&owner) {
                    break;
                }
                match c.call(&owner, &it.call(&[])).await {
                    Ok(found) => return outcome(found, &owner.id).await,
                    Err(e) if gone(&e) => c.mark_down(&owner, e),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let req = it.request();
        let here = |reply: Reply| {
            let mtime = reply
                .meta
                .last_modified
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            found(reply.size, mtime, reply.body.into_stream(), &self.id)
        };
        match self.read_or_leave(&req, &[]).await {
            Ok(Served::Here(reply)) => here(reply).await,
            Ok(Served::Elsewhere(m)) => match self.read_spilled(&m, &it.call(&[])).await {
                Ok(found) => outcome(found, &m.id).await,
                Err(e) if gone(&e) => {
                    c.mark_down(&m, &e);
                    here(self.read(&req).await?).await
                }
                Err(e) => Err(e.into()),
            },
            Err(e) if e.is_missing() => Ok(Outcome::Missing),
            Err(e) => Err(e),
        }
    }

    /// Asks member `m` to read (and admit) what this node could not admit: `read`, with
    /// this node added to the members that refused it.
    pub(super) async fn read_spilled(
        &self,
        m: &Member,
        read: &Read<'_>,
    ) -> Result<Found, ClusterError> {
        let mut refused: Vec<&str> = read.refused.to_vec();
        refused.push(&self.id);
        let read = Read {
            refused: &refused,
            ..*read
        };
        self.cluster.call(m, &read).await
    }
}

/// A pipeline applied to the members of a shard as they are fetched: those it takes are
/// prepared for (seed, epoch), each keyed by its sample.
#[derive(Clone)]
pub struct Prep {
    pub pipeline: Arc<NamedPipeline>,
    pub job: (u64, u64),
    pub shard: String,
    /// The version of the shard its members are read from (ETag, modified time in
    /// seconds): what a preparation kept for other jobs is kept under.
    pub version: (String, u64),
    /// The registered plans that read the shard in this epoch with this seed.
    pub readers: usize,
}

impl Node {
    /// A shard's members prepared by `pipeline` for `job` (seed, epoch), as read from
    /// the version `meta` describes.
    pub fn prep_of(
        &self,
        pipeline: Arc<NamedPipeline>,
        job: (u64, u64),
        bucket: &str,
        shard: &str,
        meta: &crate::backend::ObjectMeta,
    ) -> Prep {
        let mtime = meta
            .last_modified
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Prep {
            readers: self
                .plans
                .readers(bucket, shard, job.0, job.1, &pipeline.name),
            pipeline,
            job,
            shard: shard.to_owned(),
            version: (meta.etag.clone(), mtime),
        }
    }

    /// [`Node::fetch_item`], with the member prepared by `prep` where its pipeline takes
    /// it: kept from another job's read of this epoch where it can be, else prepared
    /// here (and kept for the others).
    pub async fn fetch_prepared(
        self: &Arc<Self>,
        it: &Item,
        prep: &Prep,
    ) -> Result<Outcome, NodeError> {
        let member = it.archpath.as_deref().unwrap_or(&it.key);
        if !prep.pipeline.pipeline.prepares(member) {
            return self.fetch_item(it).await;
        }
        let out = self
            .transforms
            .pipelines()
            .kept_or_prepared(
                &prep_key(it, prep),
                prep.readers,
                &self.stats,
                self.prepare_member(it, prep).map_err(shared),
            )
            .await
            .map_err(unshared)?;
        Ok(Outcome::Found {
            size: out.len() as u64,
            mtime: prep.version.1,
            data: Data::Whole(out),
        })
    }

    /// Prepares the member `it` names ahead of its reads, where it is neither kept nor
    /// being prepared: kept for them, read by none yet.
    pub(super) async fn prepare_member_ahead(
        self: &Arc<Self>,
        it: &Item,
        prep: &Prep,
    ) -> Result<(), NodeError> {
        self.transforms
            .pipelines()
            .prepare_ahead(
                &prep_key(it, prep),
                self.prepare_member(it, prep).map_err(shared),
            )
            .await
            .map_err(unshared)
    }

    /// The member `it` names, read once the prep pool admits it, and prepared by `prep`.
    async fn prepare_member(self: &Arc<Self>, it: &Item, prep: &Prep) -> Result<Bytes, NodeError> {
        let member = it.archpath.as_deref().unwrap_or(&it.key);
        let sample = split_name(member).map_or(member, |(k, _)| k);
        let key = granary_prep::sample_key(&prep.shard, sample);
        let (size, data) = match self.fetch_item(it).await? {
            Outcome::Found { size, data, .. } => (size, data),
            Outcome::Missing => return Err(NodeError::NoMember(member.to_owned())),
        };
        let body: ByteStream = match data {
            Data::Whole(b) => Box::pin(futures::stream::once(async move { Ok(b) })),
            Data::Stream(s) => s,
        };
        let input = crate::transform::gather(
            self.transforms.pool(),
            (
                Work::Prepare(&prep.pipeline.pipeline),
                crate::transform::pool::PREP,
            ),
            size,
            body,
            |e| NodeError::Cut(format!("member {member}: {e}")),
            |e| super::read::prep_refused(&prep.pipeline, &key, e),
        )
        .await?;
        self.prepare(&prep.pipeline, input, prep.job, &key).await
    }
}

/// What the member `it` names, prepared by `prep`, is kept under.
fn prep_key(it: &Item, prep: &Prep) -> PrepKey {
    let member = it.archpath.as_deref().unwrap_or(&it.key);
    let mut key = PrepKey::new(
        &prep.pipeline,
        prep.job,
        &it.bucket,
        &prep.shard,
        &prep.version.0,
        member,
    );
    key.at = it.at;
    key
}

/// Whether a call failed for want of an answer (the member is likely gone: marked down,
/// and the read goes elsewhere), not because the member refused it.
pub(super) fn gone(e: &ClusterError) -> bool {
    matches!(
        e,
        ClusterError::Unreachable { .. } | ClusterError::Timeout { .. }
    )
}

/// An item's outcome from another member's answer.
async fn outcome(found: Found, node: &str) -> Result<Outcome, NodeError> {
    match found {
        Found::Missing => Ok(Outcome::Missing),
        Found::Bytes { size, mtime, body } => self::found(size, mtime, body, node).await,
    }
}

/// An item found, of `size` bytes: read whole now when small.
async fn found(
    size: u64,
    mtime: u64,
    mut stream: ByteStream,
    node: &str,
) -> Result<Outcome, NodeError> {
    if size > WHOLE_BELOW {
        return Ok(Outcome::Found {
            size,
            mtime,
            data: Data::Stream(stream),
        });
    }
    let mut buf = BytesMut::with_capacity(size as usize);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| NodeError::Cut(format!("a batch item from node {node} was cut: {e}")))?;
        if (buf.len() + chunk.len()) as u64 > size {
            return Err(NodeError::Cut(format!(
                "a batch item from node {node} is longer than its length"
            )));
        }
        buf.put(chunk);
    }
    if buf.len() as u64 != size {
        return Err(NodeError::Cut(format!(
            "a batch item from node {node} ended at {} of {size} bytes",
            buf.len()
        )));
    }
    Ok(Outcome::Found {
        size,
        mtime,
        data: Data::Whole(buf.freeze()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_named_as_the_answer_names_them() {
        let mut it = Item {
            bucket: "b".into(),
            key: "dir/a b.tar".into(),
            archpath: Some("x&y=1.jpg".into()),
            transform: Some("small".into()),
            at: None,
        };
        assert_eq!(it.name(), "dir/a b.tar/x&y=1.jpg");
        let call = it.call(&[]);
        assert_eq!(
            call.target(),
            "/b/dir/a%20b.tar?archpath=x%26y%3D1.jpg&transform=small"
        );
        it.archpath = None;
        assert_eq!(it.name(), "dir/a b.tar");
    }
}
