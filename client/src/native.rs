//! The native API under `/_granary/`: health, stats, the cluster view, prefetch jobs and
//! batch reads (GetBatch: many objects and shard members in one tar stream).

use std::io::{Read, Write};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use crate::client::{Client, Req};
use crate::http::Body;
use crate::objects::ObjectReader;
use crate::tarstream::TarReader;
use crate::{Error, Result};

/// Largest JSON answer read.
const MAX_JSON: usize = 16 << 20;
/// The most a catalog may take (a sample's end is a few bytes: tens of millions of
/// samples).
const MAX_CATALOG: usize = 512 << 20;

/// A cluster member's state as the answering node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Answering its peers (a drain's answer says `serving`).
    #[serde(alias = "serving")]
    Up,
    /// Not answering: its keys go to the next owner.
    Down,
    /// Leaving by a drain: it owns no key and hands its copies to their owners.
    Draining,
    /// Drained: it holds nothing; it may be stopped.
    Drained,
    /// A state this client does not know.
    #[serde(other)]
    Unknown,
}

impl MemberState {
    /// `up`, `down`, `draining`, `drained` or `unknown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            MemberState::Up => "up",
            MemberState::Down => "down",
            MemberState::Draining => "draining",
            MemberState::Drained => "drained",
            MemberState::Unknown => "unknown",
        }
    }
}

/// One member of the cluster.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Member {
    /// Its `--node-id`.
    pub id: String,
    /// Where it serves, `http://host:port` (shown to signed requests, or by an open
    /// cluster).
    #[serde(default)]
    pub url: String,
    pub state: MemberState,
    /// Its share of the keys, relative to the others.
    #[serde(default)]
    pub weight: f64,
    /// Its latest hand-over of copies to their owners (a rebalance pass, or its drain).
    #[serde(default)]
    pub handover: Option<Handover>,
}

pub use granary_proto::cluster::Handover;

/// `GET /_granary/cluster`: the members as the answering node sees them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ClusterView {
    /// The node that answered.
    pub node_id: String,
    pub members: Vec<Member>,
    /// The member that owns the key asked about ([`Client::owner_of`]).
    #[serde(default)]
    pub owner: Option<String>,
}

/// `?archlist`: a `.tar` shard's regular files.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ArchiveList {
    /// The version listed, without quotes.
    pub etag: String,
    pub size: u64,
    /// Name, data offset, size; in archive order.
    pub members: Vec<(String, u64, u64)>,
}

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Still working.
    Running,
    /// Finished (possibly with per-object errors, counted in [`Job::errors`]).
    Done,
    /// Stopped by an error (see [`Job::message`]).
    Failed,
    /// Stopped by `DELETE /_granary/jobs/{id}`.
    Cancelled,
    /// A state this client does not know.
    #[serde(other)]
    Unknown,
}

impl JobState {
    /// Whether the job will not change any more.
    pub fn is_finished(&self) -> bool {
        !matches!(self, JobState::Running)
    }

    /// The name the node uses.
    pub fn as_str(&self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Unknown => "unknown",
        }
    }
}

/// A background job's progress (`GET /_granary/jobs/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Job {
    pub id: String,
    /// What the job does (`prefetch`).
    #[serde(default)]
    pub kind: String,
    pub state: JobState,
    /// Objects read (or found cached) so far.
    #[serde(default)]
    pub objects_done: u64,
    /// Objects the job covers (known once the listing is done).
    #[serde(default)]
    pub objects_total: u64,
    /// Bytes of the objects done so far.
    #[serde(default)]
    pub bytes_done: u64,
    /// Bytes of all the objects the job covers.
    #[serde(default)]
    pub bytes_total: u64,
    /// How many objects failed (a list of errors counts as its length).
    #[serde(default, deserialize_with = "count")]
    pub errors: u64,
    /// Why the job failed, or other news from the node.
    #[serde(default)]
    pub message: Option<String>,
}

/// A number, or the length of a list.
fn count<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Count {
        N(u64),
        List(Vec<serde_json::Value>),
        Null(()),
    }
    Ok(match Count::deserialize(d)? {
        Count::N(n) => n,
        Count::List(l) => l.len() as u64,
        Count::Null(()) => 0,
    })
}

/// One item of a batch read: an object, or one member of a tar shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchItem {
    pub bucket: String,
    /// The object, or the shard when `archpath` is set.
    pub key: String,
    /// The member of the shard to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archpath: Option<String>,
}

impl BatchItem {
    /// A whole object.
    pub fn object(bucket: &str, key: &str) -> BatchItem {
        BatchItem {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            archpath: None,
        }
    }

    /// One member of a tar shard.
    pub fn member(bucket: &str, key: &str, archpath: &str) -> BatchItem {
        BatchItem {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            archpath: Some(archpath.to_owned()),
        }
    }

    /// The tar member name the node gives this item: `KEY` or `KEY/ARCHPATH`.
    pub fn member_name(&self) -> String {
        match &self.archpath {
            Some(a) => format!("{}/{a}", self.key),
            None => self.key.clone(),
        }
    }
}

/// What a batch does with an item that does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Missing {
    /// Fail the request (`404` before the first byte; an aborted stream after it).
    #[default]
    Error,
    /// Send an empty member named `__404__/NAME` and go on.
    Mark,
}

impl Missing {
    /// The value of `?missing=`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Missing::Error => "error",
            Missing::Mark => "mark",
        }
    }
}

/// The prefix of the member name a batch with [`Missing::Mark`] gives a missing item.
pub const MISSING_PREFIX: &str = "__404__/";

#[derive(Deserialize)]
struct JobId {
    id: String,
}

impl Client {
    fn json<T: serde::de::DeserializeOwned>(&mut self, req: Req<'_>) -> Result<T> {
        let path = req.target();
        let (_, body) = self.call_bytes(req, MAX_JSON)?;
        serde_json::from_slice(&body).map_err(|source| Error::Json { path, source })
    }

    /// `GET` of a native-API route (`/_granary/…`; the path and query already encoded),
    /// its JSON answer as it is.
    pub fn get_json(&mut self, target: &str) -> Result<serde_json::Value> {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let mut req = Req::new("GET", path.to_owned());
        req.query = granary_proto::encode::query_pairs(query);
        self.json(req)
    }

    /// `GET /_granary/health`: succeeds when the node serves.
    pub fn health(&mut self) -> Result<serde_json::Value> {
        self.json(Req::new("GET", "/_granary/health".into()))
    }

    /// `GET /_granary/stats`: the node's counters.
    pub fn stats(&mut self) -> Result<serde_json::Value> {
        self.json(Req::new("GET", "/_granary/stats".into()))
    }

    /// `GET /_granary/cluster`: the members and their states.
    pub fn cluster(&mut self) -> Result<ClusterView> {
        self.json(Req::new("GET", "/_granary/cluster".into()))
    }

    /// `POST /_granary/cluster/drain`: member `node` hands every copy it holds to the
    /// members that own them without it, then takes no new fills; its state now
    /// (`draining`, or `drained`).
    pub fn drain(&mut self, node: &str) -> Result<MemberState> {
        self.drain_call(node, false)
    }

    /// Ends member `node`'s drain: it serves its keys again (its state then shows `up`).
    pub fn undrain(&mut self, node: &str) -> Result<MemberState> {
        self.drain_call(node, true)
    }

    fn drain_call(&mut self, node: &str, undo: bool) -> Result<MemberState> {
        #[derive(Deserialize)]
        struct Answer {
            state: MemberState,
        }
        let body = serde_json::json!({ "node": node, "undo": undo }).to_string();
        let req = Req::new("POST", "/_granary/cluster/drain".into())
            .header("content-type", "application/json")
            .body(Body::Bytes(body.as_bytes()));
        let a: Answer = self.json(req)?;
        Ok(a.state)
    }

    /// `GET /_granary/cluster?bucket=&key=`: the view, with the key's owner.
    pub fn owner_of(&mut self, bucket: &str, key: &str) -> Result<ClusterView> {
        let req = Req::new("GET", "/_granary/cluster".into())
            .query("bucket", bucket)
            .query("key", key);
        self.json(req)
    }

    /// `GET /_granary/catalog?bucket=&prefix=`: the dataset's catalog, built once by the
    /// cluster per version of the dataset and kept.
    pub fn catalog(
        &mut self,
        bucket: &str,
        prefix: &str,
    ) -> Result<granary_proto::shards::Catalog> {
        self.catalog_with(bucket, prefix, false)
    }

    /// [`Client::catalog`]; with `shards_only`, built from the shards themselves
    /// even where the dataset has an index (to write a new one).
    pub fn catalog_with(
        &mut self,
        bucket: &str,
        prefix: &str,
        shards_only: bool,
    ) -> Result<granary_proto::shards::Catalog> {
        let mut req = Req::new("GET", "/_granary/catalog".into())
            .query("bucket", bucket)
            .query("prefix", prefix);
        if shards_only {
            req = req.query("index", "ignore");
        }
        let path = req.target();
        let (_, body) = self.call_bytes(req, MAX_CATALOG)?;
        serde_json::from_slice(&body).map_err(|source| Error::Json { path, source })
    }

    /// `GET /{bucket}/{key}?archlist`: the regular files of a `.tar` shard in archive
    /// order, each with its data offset and size, in the version the ETag names.
    pub fn list_archive(&mut self, bucket: &str, key: &str) -> Result<ArchiveList> {
        let req = Req::new("GET", crate::client::object_path(bucket, key)?).query("archlist", "");
        let path = req.target();
        let (h, mut body) = self.call(req)?;
        // A node from before member lists sends the shard itself: not read.
        if h.header("content-type") != Some("application/json") {
            return Err(Error::Invalid(format!("{path}: no member list")));
        }
        let bytes = body.read_all(MAX_JSON).map_err(|e| self.io(e))?;
        self.done(body);
        serde_json::from_slice(&bytes).map_err(|source| Error::Json { path, source })
    }

    /// `POST /_granary/prefetch`: starts warming the cache cluster-wide with every object
    /// under `prefix`; returns the job's id.
    pub fn prefetch(&mut self, bucket: &str, prefix: &str) -> Result<String> {
        let body = serde_json::json!({"bucket": bucket, "prefix": prefix}).to_string();
        let req = Req::new("POST", "/_granary/prefetch".into())
            .header("content-type", "application/json")
            .body(Body::Bytes(body.as_bytes()));
        let id: JobId = self.json(req)?;
        Ok(id.id)
    }

    /// `POST /_granary/plans`: registers a job's plan with the cluster; how it shows
    /// (its `id` among the rest).
    pub fn register_plan(
        &mut self,
        plan: &granary_proto::plan::PlanSpec,
    ) -> Result<granary_proto::plan::PlanView> {
        let body = serde_json::to_vec(plan).map_err(|e| Error::Invalid(e.to_string()))?;
        let req = Req::new("POST", "/_granary/plans".into())
            .header("content-type", "application/json")
            .body(Body::Bytes(&body));
        self.json(req)
    }

    /// `GET /_granary/plans`: the plans the cluster holds.
    pub fn plans(&mut self) -> Result<Vec<granary_proto::plan::PlanView>> {
        #[derive(Deserialize)]
        struct Plans {
            plans: Vec<granary_proto::plan::PlanView>,
        }
        let p: Plans = self.json(Req::new("GET", "/_granary/plans".into()))?;
        Ok(p.plans)
    }

    /// `DELETE /_granary/plans/{id}`: drops a plan cluster-wide; its fetching stops.
    pub fn drop_plan(&mut self, id: &str) -> Result<()> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(Error::Invalid(format!("not a plan id: {id:?}")));
        }
        self.call_bytes(
            Req::new("DELETE", format!("/_granary/plans/{id}")),
            MAX_JSON,
        )?;
        Ok(())
    }

    fn job_path(id: &str) -> Result<String> {
        if id.is_empty() {
            return Err(Error::Invalid("empty job id".into()));
        }
        Ok(format!(
            "/_granary/jobs/{}",
            granary_proto::encode::query_value(id)
        ))
    }

    /// `GET /_granary/jobs/{id}`: a job's progress.
    pub fn job(&mut self, id: &str) -> Result<Job> {
        self.json(Req::new("GET", Self::job_path(id)?))
    }

    /// `DELETE /_granary/jobs/{id}`: cancels a job; returns its state after (a job that
    /// had already finished keeps its state).
    pub fn cancel_job(&mut self, id: &str) -> Result<Job> {
        self.json(Req::new("DELETE", Self::job_path(id)?))
    }

    /// Polls a job every `interval` until it finishes, calling `progress` with each
    /// reading; returns the last one.
    pub fn wait_job(
        &mut self,
        id: &str,
        interval: Duration,
        mut progress: impl FnMut(&Job),
    ) -> Result<Job> {
        loop {
            let job = self.job(id)?;
            progress(&job);
            if job.state.is_finished() {
                return Ok(job);
            }
            std::thread::sleep(interval);
        }
    }

    fn batch_request(missing: Missing, body: &[u8]) -> Req<'_> {
        Req::new("POST", "/_granary/batch".into())
            .query("missing", missing.as_str())
            .header("content-type", "application/json")
            .body(Body::Bytes(body))
    }

    /// `POST /_granary/batch`: streams the tar of `items` (in order) into `sink` as it
    /// arrives; returns the number of bytes written.
    pub fn batch_into(
        &mut self,
        items: &[BatchItem],
        missing: Missing,
        sink: &mut dyn Write,
    ) -> Result<u64> {
        let json = serde_json::to_vec(items).expect("batch items serialize");
        let (_, mut body) = self.call(Self::batch_request(missing, &json))?;
        let mut buf = vec![0u8; 256 << 10];
        let mut total = 0u64;
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io(e)),
            };
            sink.write_all(&buf[..n]).map_err(Error::Local)?;
            total += n as u64;
        }
        self.done(body);
        Ok(total)
    }

    /// `POST /_granary/batch`, opened for reading as the tar stream arrives (wrap it in a
    /// [`TarReader`] to walk the members). The reader takes this client's connection.
    pub fn open_batch(&mut self, items: &[BatchItem], missing: Missing) -> Result<ObjectReader> {
        let json = serde_json::to_vec(items).expect("batch items serialize");
        let (h, body) = self.call(Self::batch_request(missing, &json))?;
        Ok(ObjectReader::new(&h, body, self.endpoint()))
    }

    /// `POST /_granary/batch`, read into memory: `(member name, bytes)` in the order of
    /// `items`. Names are `KEY` or `KEY/ARCHPATH`; with [`Missing::Mark`] a missing item is
    /// an empty member named `__404__/NAME`.
    pub fn batch(
        &mut self,
        items: &[BatchItem],
        missing: Missing,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        let json = serde_json::to_vec(items).expect("batch items serialize");
        let (_, mut body) = self.call(Self::batch_request(missing, &json))?;
        let mut out = Vec::with_capacity(items.len());
        let mut tar = TarReader::new(&mut body);
        let parsed: std::io::Result<()> = (|| {
            while let Some(member) = tar.next_file()? {
                out.push(member);
            }
            // The end-of-archive blocks and anything after them, so the connection is reusable.
            std::io::copy(tar.get_mut(), &mut std::io::sink())?;
            Ok(())
        })();
        parsed.map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => Error::Protocol(format!("batch answer: {e}")),
            _ => self.io(e),
        })?;
        self.done(body);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::tar_of;
    use crate::fake::{FakeServer, Reply};

    #[test]
    fn cluster_views_parse() {
        let body = br#"{"node_id":"a","route":"proxy","members":[{"id":"a","url":"http://127.0.0.1:1","state":"up","weight":1,"admitting":true},{"id":"b","url":"http://127.0.0.1:2","state":"down","weight":2.5}],"owner":"b"}"#;
        let server = FakeServer::start(vec![Reply::ok(body.to_vec())]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let v = c.owner_of("bkt", "a b/c").unwrap();
        assert_eq!(v.node_id, "a");
        assert_eq!(v.members.len(), 2);
        assert_eq!(v.members[1].state, MemberState::Down);
        assert_eq!(v.members[1].weight, 2.5);
        assert_eq!(v.owner.as_deref(), Some("b"));
        let reqs = server.finish();
        assert_eq!(reqs[0].target, "/_granary/cluster?bucket=bkt&key=a%20b%2Fc");
    }

    #[test]
    fn prefetch_posts_json_and_jobs_parse() {
        let server = FakeServer::start(vec![
            Reply::status(202, br#"{"id":"j-1"}"#.to_vec()),
            Reply::ok(br#"{"id":"j-1","kind":"prefetch","state":"running","objects_done":1,"objects_total":4,"bytes_done":10,"bytes_total":40,"errors":0}"#.to_vec()),
            Reply::ok(br#"{"id":"j-1","kind":"prefetch","state":"done","objects_done":4,"objects_total":4,"bytes_done":40,"bytes_total":40,"errors":["x","y"]}"#.to_vec()),
            Reply::ok(br#"{"id":"j-1","state":"cancelled"}"#.to_vec()),
        ]);
        let mut c =
            Client::new(&server.endpoint())
                .unwrap()
                .with_credentials("AK", "SK", "us-east-1");
        let id = c.prefetch("b", "shards/").unwrap();
        assert_eq!(id, "j-1");
        let mut seen = Vec::new();
        let job = c
            .wait_job(&id, Duration::from_millis(1), |j| seen.push(j.bytes_done))
            .unwrap();
        assert_eq!(seen, vec![10, 40]);
        assert_eq!(job.state, JobState::Done);
        assert_eq!(job.objects_total, 4);
        assert_eq!(job.errors, 2);
        assert_eq!(c.cancel_job(&id).unwrap().state, JobState::Cancelled);
        let reqs = server.finish();
        assert_eq!(reqs[0].method, "POST");
        assert_eq!(reqs[0].target, "/_granary/prefetch");
        let body: serde_json::Value = serde_json::from_slice(&reqs[0].body).unwrap();
        assert_eq!(body, serde_json::json!({"bucket":"b","prefix":"shards/"}));
        // A JSON body is signed by its hash.
        assert_eq!(
            reqs[0].header("x-amz-content-sha256"),
            Some(crate::sign::sha256_hex(&reqs[0].body).as_str())
        );
        assert_eq!(reqs[1].target, "/_granary/jobs/j-1");
        assert_eq!(reqs[3].method, "DELETE");
        assert_eq!(reqs[3].target, "/_granary/jobs/j-1");
    }

    #[test]
    fn batches_post_items_and_parse_the_tar() {
        let long = format!("shard.tar/{}x.jpg", "deep/".repeat(40));
        let tar = tar_of(&[
            ("a.bin", b"AAA"),
            (&long, b"member bytes"),
            ("__404__/gone", b""),
        ]);
        let server = FakeServer::start(vec![
            Reply::ok(tar.clone()).chunked(1000),
            Reply::ok(tar.clone()).chunked(777),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let items = vec![
            BatchItem::object("b", "a.bin"),
            BatchItem::member("b", "shard.tar", &long["shard.tar/".len()..]),
            BatchItem::object("b", "gone"),
        ];
        let got = c.batch(&items, Missing::Mark).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], ("a.bin".to_owned(), b"AAA".to_vec()));
        assert_eq!(got[1].0, items[1].member_name());
        assert_eq!(got[1].1, b"member bytes");
        assert_eq!(got[2], (format!("{MISSING_PREFIX}gone"), Vec::new()));
        let mut raw = Vec::new();
        let n = c.batch_into(&items, Missing::Error, &mut raw).unwrap();
        assert_eq!(n, tar.len() as u64);
        assert_eq!(raw, tar);
        let reqs = server.finish();
        assert_eq!(reqs[0].target, "/_granary/batch?missing=mark");
        assert_eq!(reqs[1].target, "/_granary/batch?missing=error");
        assert_eq!(reqs[0].connection, reqs[1].connection);
        let sent: serde_json::Value = serde_json::from_slice(&reqs[0].body).unwrap();
        assert_eq!(
            sent,
            serde_json::json!([
                {"bucket":"b","key":"a.bin"},
                {"bucket":"b","key":"shard.tar","archpath":&long["shard.tar/".len()..]},
                {"bucket":"b","key":"gone"},
            ])
        );
    }

    #[test]
    fn an_aborted_batch_stream_is_an_error() {
        let tar = tar_of(&[("a.bin", &[1u8; 5000][..]), ("b.bin", b"B")]);
        let server = FakeServer::start(vec![Reply::ok(tar[..3000].to_vec())
            .chunked(1000)
            .aborted()]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let err = c
            .batch(&[BatchItem::object("b", "a.bin")], Missing::Error)
            .unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
        server.finish();
    }
}
