//! The items of a GetBatch: each an object or a shard member (optionally transformed),
//! fetched from its owner: this node's cache, or the owning member (the next owner when
//! one does not answer). Items up to [`WHOLE_BELOW`] are read whole while they wait their
//! turn; larger ones stream when it comes. How the answer is framed is the API's.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::body::Body;
use bytes::{BufMut, Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use granary_proto::encode;
use granary_proto::headers::SPILL;
use http::{header, Method, StatusCode};

use super::{Node, NodeError, ReadRequest, Reply, Served};
use crate::backend::ByteStream;
use crate::cluster::peer::FORWARD_READ_TIMEOUT;
use crate::cluster::ring::key_hash;
use crate::cluster::Member;

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
        }
    }

    /// The item's member name in the answer: `KEY`, or `KEY/ARCHPATH`.
    pub fn name(&self) -> String {
        match &self.archpath {
            Some(a) => format!("{}/{}", self.key, a),
            None => self.key.clone(),
        }
    }

    /// The object read that fetches it from another member.
    fn target(&self) -> String {
        let mut t = encode::object_path(&self.bucket, &self.key);
        let mut sep = '?';
        for (name, value) in [("archpath", &self.archpath), ("transform", &self.transform)] {
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

    fn request(&self) -> ReadRequest<'_> {
        let mut req = ReadRequest::object(&self.bucket, &self.key);
        req.member = self.archpath.as_deref();
        req.transform = self.transform.as_deref();
        req
    }
}

impl Node {
    /// Fetches one item from its owner: this node, or the owning member (the next one
    /// when it does not answer).
    pub async fn fetch_item(self: &Arc<Self>, it: &Item) -> Result<Outcome, NodeError> {
        let c = &self.cluster;
        if !c.is_single() {
            let kh = key_hash(&it.bucket, &it.key);
            for _ in 0..c.members().len() {
                let owner = c.owner_of_hash(kh);
                if c.is_me(&owner) {
                    break;
                }
                let asked = c
                    .ask(
                        &owner,
                        Method::GET,
                        &it.target(),
                        bytes::Bytes::new(),
                        FORWARD_READ_TIMEOUT,
                    )
                    .await;
                match asked {
                    Ok(resp) => return outcome(resp, &owner.id).await,
                    Err(e) => c.mark_down(&owner, e),
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
            Ok(Served::Elsewhere(m)) => match self.ask_spilled(&m, &it.target(), &[]).await {
                Ok(resp) => outcome(resp, &m.id).await,
                Err(e) => {
                    c.mark_down(&m, &e);
                    here(self.read(&req).await?).await
                }
            },
            Err(e) if e.is_missing() => Ok(Outcome::Missing),
            Err(e) => Err(e),
        }
    }

    /// Asks member `i` to read (and admit) an object this node could not admit;
    /// `tried`: the members that refused it before.
    pub(super) async fn ask_spilled(
        &self,
        m: &Member,
        target: &str,
        tried: &[&str],
    ) -> Result<http::Response<Body>, NodeError> {
        let mut refused: Vec<&str> = tried.to_vec();
        refused.push(&self.id);
        let headers = [(SPILL, refused.join(","))];
        Ok(self
            .cluster
            .ask_with(
                m,
                Method::GET,
                target,
                &headers,
                bytes::Bytes::new(),
                FORWARD_READ_TIMEOUT,
            )
            .await?)
    }
}

/// An item's outcome from another member's answer.
async fn outcome(resp: http::Response<Body>, node: &str) -> Result<Outcome, NodeError> {
    let status = resp.status();
    if status == StatusCode::NOT_FOUND {
        return Ok(Outcome::Missing);
    }
    let (parts, body) = resp.into_parts();
    if status != StatusCode::OK {
        let text = axum::body::to_bytes(body, 64 << 10)
            .await
            .unwrap_or_default();
        let message = granary_proto::xml::parse_error(&text).map_or_else(String::new, |(_, m)| m);
        return Err(NodeError::Peer {
            node: node.to_owned(),
            status: status.as_u16(),
            what: "a batch item",
            message,
        });
    }
    let size: u64 = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| NodeError::Cut("a batch item came without its length".into()))?;
    let mtime = parts
        .headers
        .get(header::LAST_MODIFIED)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let stream: ByteStream = Box::pin(body.into_data_stream().map_err(std::io::Error::other));
    found(size, mtime, stream, node).await
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
    fn targets_encode_keys_and_members() {
        let mut it = Item {
            bucket: "b".into(),
            key: "dir/a b.tar".into(),
            archpath: Some("x&y=1.jpg".into()),
            transform: None,
        };
        assert_eq!(it.target(), "/b/dir/a%20b.tar?archpath=x%26y%3D1.jpg");
        it.transform = Some("small".into());
        assert_eq!(
            it.target(),
            "/b/dir/a%20b.tar?archpath=x%26y%3D1.jpg&transform=small"
        );
        assert_eq!(it.name(), "dir/a b.tar/x&y=1.jpg");
        it.archpath = None;
        assert_eq!(it.target(), "/b/dir/a%20b.tar?transform=small");
    }
}
