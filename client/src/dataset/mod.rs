//! [`Dataset`]: training samples out of a prefix of tar shards, WebDataset style, for
//! data-parallel training. It is a typed front over the planned reader, the one reading
//! path of this crate (`granary.ShardDataset` reads by it too): [`catalog`] lists the
//! shards and where each sample lies in them, [`plan`] says which samples each rank
//! yields and in what order, [`planned`] reads them, and [`route`] sends each read to
//! the member that owns the shard.
//!
//! [`DatasetBuilder::build`] lists the shards (every key under the prefix ending in
//! `.tar`, `.tar.gz` or `.tgz`) and their samples once. Each epoch then:
//! 1. the shards are shuffled by `(seed, epoch)` — the same order on every rank, since it
//!    depends on nothing else — and their samples laid end to end, each shard's members
//!    grouped into [`Sample`]s (consecutive members sharing a key) in archive order;
//! 2. rank `r` of `world_size` `W` takes the contiguous span `[r·q, (r+1)·q)` of that
//!    list. With `q = ⌈n/W⌉` (the default) the last rank's span wraps to the start, so a
//!    few samples are repeated to pad; with `drop_last`, `q = ⌊n/W⌋` and the last
//!    `n mod W` samples are left out. Either way every rank yields the same count
//!    ([`Dataset::epoch_len`]), so step counts agree, and every sample comes exactly once
//!    per epoch across the ranks, up to that padding or remainder;
//! 3. with `shuffle_buffer > 0`, a rank's span is mixed through a buffer of that many
//!    samples, seeded by `seed`, the epoch and the rank. The order is known before a byte
//!    is read ([`Dataset::plan`]): the same seed and epoch give the same order;
//! 4. the span is read front to back in runs (consecutive samples of one shard, one range
//!    read of the version listed; a compressed shard whole), each from its shard's owner
//!    in the cluster, with `read_ahead` runs fetched ahead by as many threads.
//!
//! A run that cannot be read (the shard gone, or changed since it was listed) ends the
//! epoch with that error.

pub mod catalog;
pub use granary_proto::plan;
mod ahead;
mod delivered;
mod fetch;
pub mod planned;
pub mod route;
mod runs;
mod samples;
mod settings;

use std::sync::Arc;
use std::time::Duration;

pub use catalog::{is_compressed, is_shard};
pub use samples::Sample;

use crate::{Client, Credentials, Error, Result};
use catalog::{Catalog, ShardInfo};
use plan::{SampleId, Split};
use planned::{read_epoch, Delivered, EpochSpec, LocalReads, PlannedRead, ReadSettings};
use route::Router;

/// Settings of a [`Dataset`]; [`DatasetBuilder::build`] lists the shards.
#[derive(Debug, Clone)]
pub struct DatasetBuilder {
    endpoint: String,
    bucket: String,
    prefix: String,
    seed: u64,
    rank: usize,
    world_size: usize,
    drop_last: bool,
    shuffle_shards: bool,
    shuffle_buffer: usize,
    read_ahead: usize,
    read_ahead_here: bool,
    route: bool,
    plan: bool,
    pipeline: Option<String>,
    credentials: Option<Credentials>,
    timeout: Duration,
}

impl Default for DatasetBuilder {
    fn default() -> Self {
        DatasetBuilder {
            endpoint: "http://127.0.0.1:7070".into(),
            bucket: String::new(),
            prefix: String::new(),
            seed: 0,
            rank: 0,
            world_size: 1,
            drop_last: false,
            shuffle_shards: true,
            shuffle_buffer: 0,
            read_ahead: 0,
            read_ahead_here: true,
            route: true,
            plan: true,
            pipeline: None,
            credentials: None,
            timeout: Duration::from_secs(60),
        }
    }
}

impl DatasetBuilder {
    /// The node to read from, `http://host:port` (default `http://127.0.0.1:7070`).
    pub fn endpoint(mut self, endpoint: &str) -> Self {
        self.endpoint = endpoint.to_owned();
        self
    }

    /// The bucket the shards are in.
    pub fn bucket(mut self, bucket: &str) -> Self {
        self.bucket = bucket.to_owned();
        self
    }

    /// The key prefix the shards share (`train/`); empty for the whole bucket.
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// Seeds the shard order and the sample shuffle; every rank must use the same seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// This process's rank, `0..world_size`.
    pub fn rank(mut self, rank: usize) -> Self {
        self.rank = rank;
        self
    }

    /// How many ranks split the samples (default 1).
    pub fn world_size(mut self, world_size: usize) -> Self {
        self.world_size = world_size;
        self
    }

    /// When the samples are not a multiple of the world size: leave the remainder out of
    /// the epoch (on), or repeat a few samples so every rank has as many (off, the
    /// default).
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }

    /// Whether each epoch shuffles the shard order (default on); off, shards are taken in
    /// key order every epoch.
    pub fn shuffle_shards(mut self, on: bool) -> Self {
        self.shuffle_shards = on;
        self
    }

    /// Samples held to mix a rank's span (0, the default: no sample shuffle).
    pub fn shuffle_buffer(mut self, samples: usize) -> Self {
        self.shuffle_buffer = samples;
        self
    }

    /// Runs (consecutive samples of one shard, up to 16 MiB) fetched ahead by as many
    /// background threads, each over its own connections (0, the default: each run is
    /// fetched when the epoch reaches it). Runs fetched ahead wait in memory.
    pub fn read_ahead(mut self, runs: usize) -> Self {
        self.read_ahead = runs;
        self
    }

    /// Whether runs copied out of the cache file of a node on this machine are fetched
    /// ahead too (on, the default: the copies overlap the reader's own work). Off where
    /// the reader is one of several processes sharing the cores, as DataLoader workers
    /// are: each such run is copied when it is needed, and the read-ahead threads start
    /// only once a run waits on more than a copy (it came from another member, or the
    /// node filled it from its backend first).
    pub fn read_ahead_here(mut self, on: bool) -> Self {
        self.read_ahead_here = on;
        self
    }

    /// Samples prepared by the node's pipeline `name` (`[pipelines.NAME]`) for the
    /// dataset's seed and each epoch: the members it takes arrive prepared, the same
    /// bytes as `?pipeline=NAME&seed=&epoch=` (default: none, members as stored).
    pub fn pipeline(mut self, name: Option<&str>) -> Self {
        self.pipeline = name.map(str::to_owned);
        self
    }

    /// Whether each shard is read from its owner, as the cluster's ring says (on, the
    /// default), or everything through the endpoint given.
    pub fn route(mut self, on: bool) -> Self {
        self.route = on;
        self
    }

    /// Whether each epoch registers its plan with the cluster (on, the default), so
    /// that its nodes fetch each shard before its first read. The samples and their
    /// order are the same either way.
    pub fn plan(mut self, on: bool) -> Self {
        self.plan = on;
        self
    }

    /// Signs requests with these credentials.
    pub fn credentials(mut self, access_key: &str, secret_key: &str, region: &str) -> Self {
        self.credentials = Some(Credentials::new(access_key, secret_key, region));
        self
    }

    /// Longest stall of a socket read or write (default 60 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Checks the settings, asks the node for the cluster's ring (with `route`), and
    /// lists the shards under the prefix and their samples.
    pub fn build(self) -> Result<Dataset> {
        if self.bucket.is_empty() {
            return Err(Error::Invalid("a dataset needs a bucket".into()));
        }
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(Error::Invalid(format!(
                "rank {} of world size {}",
                self.rank, self.world_size
            )));
        }
        let client = Client::new(&self.endpoint)?
            .with_credentials_opt(self.credentials.clone())
            .with_timeout(self.timeout);
        let router = if self.route {
            Router::discover(&mut client.fresh())?
        } else {
            Router::single(client.endpoint())
        };
        let catalog = Catalog::build(&client, &router, &self.bucket, &self.prefix)?;
        Ok(Dataset {
            settings: self,
            catalog: Arc::new(catalog),
            router,
        })
    }
}

/// A sharded dataset as one rank sees it; see the module documentation for the order.
pub struct Dataset {
    settings: DatasetBuilder,
    catalog: Arc<Catalog>,
    router: Router,
}

impl Dataset {
    /// Settings with their defaults: one rank, no sample shuffle, no read-ahead.
    pub fn builder() -> DatasetBuilder {
        DatasetBuilder::default()
    }

    /// The shards and where their samples lie, as listed when the dataset was built.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Every shard of the dataset, in key order.
    pub fn shards(&self) -> &[ShardInfo] {
        &self.catalog.shards
    }

    /// Samples in the dataset.
    pub fn len(&self) -> usize {
        self.catalog.len()
    }

    pub fn is_empty(&self) -> bool {
        self.catalog.is_empty()
    }

    /// Samples each rank yields in every epoch, the same on every rank.
    pub fn epoch_len(&self) -> usize {
        plan::per_rank(self.catalog.len(), &self.split())
    }

    /// This rank's samples of `epoch`, in the order [`Dataset::epoch`] yields them: a
    /// shard's number in [`Dataset::shards`] and the sample's place in it.
    pub fn plan(&self, epoch: u64) -> Result<Vec<SampleId>> {
        let entries = planned::plan_epoch(&self.catalog, &self.spec(epoch))?;
        Ok(entries.into_iter().map(|(id, _)| id).collect())
    }

    /// This rank's samples of `epoch`. The first error (a run that cannot be read) is
    /// the epoch's last item.
    pub fn epoch(&self, epoch: u64) -> Epoch {
        let s = &self.settings;
        let settings = ReadSettings {
            router: self.router.clone(),
            credentials: s.credentials.clone(),
            timeout: s.timeout,
            read_ahead: s.read_ahead,
            ahead_here: s.read_ahead_here,
            // A node on this machine: each run copied out of its cache file.
            local: LocalReads::Copied,
            plan: s.plan,
            pipeline: s.pipeline.clone(),
        };
        match read_epoch(self.catalog.clone(), &self.spec(epoch), settings) {
            Ok(read) => Epoch {
                read: Some(read),
                failed: None,
            },
            Err(e) => Epoch {
                read: None,
                failed: Some(e),
            },
        }
    }

    fn split(&self) -> Split {
        let s = &self.settings;
        Split {
            world_size: s.world_size,
            shuffle_buffer: s.shuffle_buffer,
            drop_last: s.drop_last,
        }
    }

    /// The whole of `epoch` for this rank, read by one worker.
    fn spec(&self, epoch: u64) -> EpochSpec {
        let s = &self.settings;
        EpochSpec {
            seed: s.seed,
            epoch,
            shuffle_shards: s.shuffle_shards,
            rounds: Vec::new(),
            split: self.split(),
            rank: s.rank,
            worker: 0,
            workers: 1,
            batch_size: 1,
        }
    }
}

/// The samples of one rank in one epoch (an iterator; see [`Dataset::epoch`]).
pub struct Epoch {
    read: Option<PlannedRead>,
    /// Why the epoch could not start, yielded once.
    failed: Option<Error>,
}

impl Iterator for Epoch {
    type Item = Result<Sample>;

    fn next(&mut self) -> Option<Result<Sample>> {
        if let Some(e) = self.failed.take() {
            return Some(Err(e));
        }
        Some(match self.read.as_mut()?.next()? {
            Ok(Delivered::Owned(sample)) => Ok(sample),
            Ok(Delivered::Buffered(b)) => Ok(b.into_sample()),
            Ok(Delivered::Resident(r)) => self.read.as_mut()?.copied(r),
            // Never asked for: a node passes files for mapped reads only.
            Ok(Delivered::Mapped(m)) => Err(Error::Invalid(format!(
                "sample {} of {} came as a file, which was not asked for",
                m.key, m.shard
            ))),
            Err(e) => Err(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeServer, Reply};
    use std::collections::BTreeMap;

    #[test]
    fn bad_settings_are_refused_before_any_request() {
        let err = Dataset::builder().bucket("b").rank(4).world_size(4).build();
        assert!(matches!(err, Err(Error::Invalid(_))));
        let err = Dataset::builder().bucket("b").world_size(0).build();
        assert!(matches!(err, Err(Error::Invalid(_))));
        let err = Dataset::builder().build();
        assert!(matches!(err, Err(Error::Invalid(_))));
    }

    fn tar_of(members: &[(String, Vec<u8>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, name, data.as_slice()).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// The answer to one request of [`shard_server`]: status, extra headers, body.
    fn answer(
        shards: &[(String, Vec<u8>)],
        target: &str,
        headers: &BTreeMap<String, String>,
    ) -> (u16, String, Vec<u8>) {
        if target.contains("list-type=2") {
            let mut x = String::from("<ListBucketResult><IsTruncated>false</IsTruncated>");
            for (k, v) in shards {
                x.push_str(&format!(
                    "<Contents><Key>{k}</Key><Size>{}</Size></Contents>",
                    v.len()
                ));
            }
            x.push_str(
                "<Contents><Key>d/notes.txt</Key><Size>1</Size></Contents></ListBucketResult>",
            );
            return (200, String::new(), x.into_bytes());
        }
        // No catalogs (a node from before them), no cluster view (read through this node
        // alone), no member lists (each shard is read once to list its samples).
        if target.starts_with("/_granary/catalog") {
            let doc = b"<Error><Code>NotFound</Code><Message>no native route</Message></Error>";
            return (
                404,
                "content-type: application/xml\r\n".into(),
                doc.to_vec(),
            );
        }
        if target.starts_with("/_granary/") || target.contains("?archlist") {
            return (501, String::new(), Vec::new());
        }
        let key = target.trim_start_matches("/b/");
        let Some(i) = shards.iter().position(|(k, _)| k == key) else {
            return (404, String::new(), Vec::new());
        };
        let etag = format!("\"v{i}\"");
        if headers.get("if-match").is_some_and(|m| *m != etag) {
            return (412, String::new(), Vec::new());
        }
        let body = &shards[i].1;
        let etag_header = format!("etag: {etag}\r\n");
        match headers.get("range") {
            Some(r) => {
                let (a, b) = r.trim_start_matches("bytes=").split_once('-').unwrap();
                let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
                let range = format!("content-range: bytes {a}-{b}/{}\r\n", body.len());
                (206, etag_header + &range, body[a..=b].to_vec())
            }
            None => (200, etag_header, body.clone()),
        }
    }

    /// A node that serves a listing of `shards` and each shard's bytes by key, whole or a
    /// range, checking `If-Match`, on any number of connections, until the test process
    /// ends.
    fn shard_server(shards: Vec<(String, Vec<u8>)>) -> String {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let shards = std::sync::Arc::new(shards);
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { return };
                let shards = shards.clone();
                std::thread::spawn(move || {
                    let mut r = BufReader::new(s);
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let target = line.split_whitespace().nth(1).unwrap().to_owned();
                        let mut headers = BTreeMap::new();
                        loop {
                            line.clear();
                            if r.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            let Some((k, v)) = line.trim().split_once(':') else {
                                break;
                            };
                            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
                        }
                        let (status, extra, body) = answer(&shards, &target, &headers);
                        let head = format!(
                            "HTTP/1.1 {status} X\r\n{extra}content-length: {}\r\n\r\n",
                            body.len()
                        );
                        let s = r.get_mut();
                        if s.write_all(head.as_bytes()).is_err() || s.write_all(&body).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        endpoint
    }

    /// 7 shards of 3 to 9 samples, 42 in all: `s{s}/{i:03}` with a `cls` of `s-i` and a
    /// `bin` of `i + 1` bytes `s`.
    fn seven_shards() -> (Vec<(String, Vec<u8>)>, Vec<String>) {
        let mut shards = Vec::new();
        let mut all = Vec::new();
        for s in 0..7 {
            let mut members = Vec::new();
            for i in 0..(3 + s) {
                let key = format!("s{s}/{i:03}");
                members.push((format!("{key}.cls"), format!("{s}-{i}").into_bytes()));
                members.push((format!("{key}.bin"), vec![s as u8; i + 1]));
                all.push(key);
            }
            shards.push((format!("d/shard-{s}.tar"), tar_of(&members)));
        }
        all.sort();
        (shards, all)
    }

    #[test]
    fn ranks_read_every_sample_once_in_a_per_epoch_order() {
        let (shards, all) = seven_shards();
        let endpoint = shard_server(shards);
        let mut orders = Vec::new();
        for (read_ahead, buffer) in [(0, 0), (2, 5)] {
            for epoch in 0..2u64 {
                let mut seen = Vec::new();
                let mut order = Vec::new();
                for rank in 0..4 {
                    let ds = Dataset::builder()
                        .endpoint(&endpoint)
                        .bucket("b")
                        .prefix("d/")
                        .seed(11)
                        .rank(rank)
                        .world_size(4)
                        .read_ahead(read_ahead)
                        .shuffle_buffer(buffer)
                        .build()
                        .unwrap();
                    assert_eq!(ds.shards().len(), 7);
                    assert_eq!((ds.len(), ds.epoch_len()), (42, 11));
                    // What is read is what was planned, in order.
                    let planned: Vec<String> = ds
                        .plan(epoch)
                        .unwrap()
                        .iter()
                        .map(|id| format!("s{}/{:03}", id.shard, id.index))
                        .collect();
                    let mut mine = Vec::new();
                    for sample in ds.epoch(epoch) {
                        let sample = sample.unwrap();
                        let (s, i): (usize, usize) = {
                            let text = String::from_utf8(sample.fields["cls"].clone()).unwrap();
                            let (a, b) = text.split_once('-').unwrap();
                            (a.parse().unwrap(), b.parse().unwrap())
                        };
                        assert_eq!(sample.key, format!("s{s}/{i:03}"));
                        assert_eq!(sample.fields["bin"], vec![s as u8; i + 1]);
                        assert_eq!(sample.shard, format!("d/shard-{s}.tar"));
                        mine.push(sample.key);
                    }
                    assert_eq!(mine, planned, "rank {rank}");
                    order.extend(mine.iter().cloned());
                    seen.extend(mine);
                }
                // 44 places for 42 samples: the last rank's span wraps to repeat 2.
                assert_eq!(seen.len(), 44);
                seen.sort();
                let repeats = seen.len() - {
                    seen.dedup();
                    seen.len()
                };
                assert_eq!(repeats, 2);
                assert_eq!(
                    seen, all,
                    "read_ahead {read_ahead} buffer {buffer} epoch {epoch}"
                );
                orders.push(order);
            }
        }
        assert_ne!(orders[0], orders[1]);
        assert_ne!(orders[2], orders[3]);
        assert_ne!(orders[0], orders[2]);
    }

    #[test]
    fn with_drop_last_the_remainder_is_left_out_and_nothing_repeats() {
        let (shards, all) = seven_shards();
        let endpoint = shard_server(shards);
        let mut seen = Vec::new();
        for rank in 0..4 {
            let ds = Dataset::builder()
                .endpoint(&endpoint)
                .bucket("b")
                .prefix("d/")
                .seed(3)
                .rank(rank)
                .world_size(4)
                .drop_last(true)
                .build()
                .unwrap();
            assert_eq!(ds.epoch_len(), 10);
            let got: Vec<String> = ds.epoch(1).map(|s| s.unwrap().key).collect();
            assert_eq!(got.len(), 10);
            seen.extend(got);
        }
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 40);
        assert!(seen.iter().all(|k| all.contains(k)));
    }

    #[test]
    fn a_shard_changed_since_it_was_listed_ends_the_epoch_with_its_error() {
        let list = "<ListBucketResult><IsTruncated>false</IsTruncated>\
            <Contents><Key>p/0.tar</Key><Size>2048</Size></Contents></ListBucketResult>";
        let members = r#"{"etag":"v1","size":2048,"members":[["a.cls",512,1]]}"#;
        let changed = "<Error><Code>PreconditionFailed</Code><Message>no</Message></Error>";
        let old_node = "<Error><Code>NotFound</Code><Message>no route</Message></Error>";
        let server = FakeServer::start(vec![
            Reply::status(404, Vec::new()),
            Reply::status(404, old_node.as_bytes().to_vec()),
            Reply::ok(list.as_bytes().to_vec()),
            Reply::ok(members.as_bytes().to_vec()).with_header("content-type", "application/json"),
            Reply::status(412, changed.as_bytes().to_vec()),
        ]);
        let ds = Dataset::builder()
            .endpoint(&server.endpoint())
            .bucket("b")
            .prefix("p/")
            .plan(false)
            .build()
            .unwrap();
        assert_eq!(ds.catalog().counts(), vec![1]);
        assert_eq!(ds.shards()[0].etag, "v1");
        let got: Vec<Result<Sample>> = ds.epoch(0).collect();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].as_ref().unwrap_err().code(),
            Some("PreconditionFailed")
        );
        let reqs = server.finish();
        assert_eq!(reqs[0].target, "/_granary/cluster");
        assert_eq!(reqs[1].target, "/_granary/catalog?bucket=b&prefix=p%2F");
        assert_eq!(reqs[3].target, "/b/p/0.tar?archlist=");
        assert_eq!(reqs[4].target, "/b/p/0.tar");
        assert_eq!(reqs[4].header("range"), Some("bytes=0-1023"));
        assert_eq!(reqs[4].header("if-match"), Some("\"v1\""));
    }

    /// The cluster's catalog is one request; a shard it knows by count only (from the
    /// dataset's index) is read from its start, and its samples picked from the stream.
    #[test]
    fn one_request_brings_the_catalog_and_unspanned_shards_are_read_from_the_start() {
        let tar = crate::fake::tar_of(&[("s/0.cls", b"0"), ("s/1.cls", b"1"), ("s/2.cls", b"2")]);
        let catalog = format!(
            r#"{{"bucket":"b","prefix":"p/","version":"v","from_index":true,
               "shards":[{{"key":"p/0.tar","etag":"v1","size":{},"samples":3}}]}}"#,
            tar.len()
        );
        let server = FakeServer::start(vec![
            Reply::status(404, Vec::new()),
            Reply::ok(catalog.into_bytes()).with_header("content-type", "application/json"),
            Reply::ok(tar.clone()).with_header("etag", "\"v1\""),
        ]);
        let ds = Dataset::builder()
            .endpoint(&server.endpoint())
            .bucket("b")
            .prefix("p/")
            .shuffle_shards(false)
            .plan(false)
            .build()
            .unwrap();
        assert_eq!(ds.catalog().counts(), vec![3]);
        assert!(!ds.shards()[0].ranged());
        let keys: Vec<String> = ds.epoch(0).map(|s| s.unwrap().key).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(sorted, ["s/0", "s/1", "s/2"]);
        let reqs = server.finish();
        assert_eq!(reqs.len(), 3, "the view, the catalog, one read");
        assert_eq!(reqs[2].target, "/b/p/0.tar");
        assert_eq!(reqs[2].header("range"), None, "read from its start");
        assert_eq!(reqs[2].header("if-match"), Some("\"v1\""));
    }

    /// With its plan (the default), an epoch first registers the plan with the node it
    /// was given, and each read says where the rank stands.
    #[test]
    fn a_planned_epoch_registers_its_plan_and_marks_its_reads() {
        let tar = crate::fake::tar_of(&[("s/0.cls", b"0"), ("s/1.cls", b"1")]);
        let catalog = format!(
            r#"{{"bucket":"b","prefix":"p/","version":"v","from_index":true,
               "shards":[{{"key":"p/0.tar","etag":"v1","size":{},"samples":2}}]}}"#,
            tar.len()
        );
        let view = r#"{"id":"00ab","bucket":"b","prefix":"p/","epoch":3,"world_size":1,
            "consumed":0,"fetched_bytes":0,"evicted_bytes":0,"reads_ready":0,
            "reads_waited":0,"expires_in_s":60.0}"#;
        let server = FakeServer::start(vec![
            Reply::status(404, Vec::new()),
            Reply::ok(catalog.into_bytes()).with_header("content-type", "application/json"),
            Reply::ok(view.as_bytes().to_vec()).with_header("content-type", "application/json"),
            Reply::ok(tar.clone()).with_header("etag", "\"v1\""),
        ]);
        let ds = Dataset::builder()
            .endpoint(&server.endpoint())
            .bucket("b")
            .prefix("p/")
            .seed(5)
            .build()
            .unwrap();
        let keys: Vec<String> = ds.epoch(3).map(|s| s.unwrap().key).collect();
        assert_eq!(keys.len(), 2);
        let reqs = server.finish();
        assert_eq!(reqs.len(), 4, "the view, the catalog, the plan, one read");
        assert_eq!(
            (reqs[2].method.as_str(), reqs[2].target.as_str()),
            ("POST", "/_granary/plans")
        );
        let plan: plan::PlanSpec = serde_json::from_slice(&reqs[2].body).unwrap();
        assert_eq!((plan.bucket.as_str(), plan.prefix.as_str()), ("b", "p/"));
        assert_eq!((plan.seed, plan.epoch, plan.world_size), (5, 3, 1));
        assert_eq!(plan.shards.len(), 1);
        assert_eq!(
            (plan.shards[0].etag.as_str(), plan.shards[0].samples),
            ("v1", 2)
        );
        assert_eq!(reqs[3].header("x-granary-plan"), Some("00ab:3:0:0"));
    }
}
