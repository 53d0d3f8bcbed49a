//! [`Dataset`]: training samples out of a prefix of tar shards, WebDataset style, for
//! data-parallel training.
//!
//! Each epoch:
//! 1. the shards (every key under the prefix ending in `.tar`, `.tar.gz` or `.tgz`, in
//!    key order) are shuffled with a PRNG seeded by `seed` and the epoch — the same order
//!    on every rank, since it depends on nothing else;
//! 2. rank `r` of `world_size` takes the shards at positions `p` with
//!    `p % world_size == r`. Ranks get `⌊n/w⌋` or `⌈n/w⌉` shards, so when shards are not a
//!    multiple of the world size some ranks read one more shard (and shards may hold
//!    different numbers of samples): a training loop that needs equal step counts must
//!    cap or pad them itself;
//! 3. each shard's members are grouped into [`Sample`]s (consecutive members sharing a
//!    key), and with `shuffle_buffer > 0` mixed through a buffer of that many samples,
//!    seeded by `seed`, the epoch and the rank.
//!
//! Every sample of the dataset is thus yielded exactly once per epoch across all ranks.
//! With `read_ahead > 0`, that many shards download in background threads (each over its
//! own connection) while the current one is read; with `0`, each shard is streamed as it
//! is consumed and only the sample being built is in memory.

pub mod catalog;
mod fetch;
mod order;
pub mod plan;
pub mod planned;
mod samples;

use std::time::Duration;

pub use samples::Sample;

use crate::{Client, Credentials, Error, Result};
use fetch::Fetcher;
use order::SplitMix64;
use samples::ShardSamples;

/// The extensions that mark a shard.
const SHARD_SUFFIXES: [&str; 3] = [".tar", ".tar.gz", ".tgz"];

/// Whether a key names a shard (`.tar`, `.tar.gz`, `.tgz`).
pub fn is_shard(key: &str) -> bool {
    SHARD_SUFFIXES.iter().any(|s| key.ends_with(s))
}

/// The shards under `prefix`, in key order; an error when there are none.
pub(crate) fn shard_keys(client: &mut Client, bucket: &str, prefix: &str) -> Result<Vec<String>> {
    let mut keys: Vec<String> = client
        .list(bucket, prefix)?
        .into_iter()
        .map(|o| o.key)
        .filter(|k| is_shard(k))
        .collect();
    keys.sort();
    if keys.is_empty() {
        return Err(Error::Invalid(format!(
            "no .tar, .tar.gz or .tgz objects under {bucket}/{prefix}"
        )));
    }
    Ok(keys)
}

/// Whether a shard is compressed (`.tar.gz`, `.tgz`): read whole, never by range.
pub fn is_compressed(key: &str) -> bool {
    key.ends_with(".tar.gz") || key.ends_with(".tgz")
}

/// Settings of a [`Dataset`]; [`DatasetBuilder::build`] lists the shards.
#[derive(Debug, Clone)]
pub struct DatasetBuilder {
    endpoint: String,
    bucket: String,
    prefix: String,
    seed: u64,
    rank: usize,
    world_size: usize,
    shuffle_shards: bool,
    shuffle_buffer: usize,
    read_ahead: usize,
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
            shuffle_shards: true,
            shuffle_buffer: 0,
            read_ahead: 0,
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

    /// How many ranks split the shards (default 1).
    pub fn world_size(mut self, world_size: usize) -> Self {
        self.world_size = world_size;
        self
    }

    /// Whether each epoch shuffles the shard order (default on); off, shards are taken in
    /// key order every epoch.
    pub fn shuffle_shards(mut self, on: bool) -> Self {
        self.shuffle_shards = on;
        self
    }

    /// Samples held to mix across shards (0, the default: no sample shuffle).
    pub fn shuffle_buffer(mut self, samples: usize) -> Self {
        self.shuffle_buffer = samples;
        self
    }

    /// Shards downloaded ahead by as many background threads, each over its own
    /// connection (0, the default: stream each shard as it is read). At most this many
    /// shards are downloading or waiting in memory besides the one being read.
    pub fn read_ahead(mut self, shards: usize) -> Self {
        self.read_ahead = shards;
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

    /// Checks the settings and lists the shards under the prefix.
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
        let shards = shard_keys(&mut client.fresh(), &self.bucket, &self.prefix)?;
        Ok(Dataset {
            settings: self,
            client,
            shards,
        })
    }
}

/// A sharded dataset as one rank sees it; see the module documentation for the order.
pub struct Dataset {
    settings: DatasetBuilder,
    client: Client,
    shards: Vec<String>,
}

impl Dataset {
    /// Settings with their defaults: one rank, no sample shuffle, no read-ahead.
    pub fn builder() -> DatasetBuilder {
        DatasetBuilder::default()
    }

    /// Every shard of the dataset, in key order.
    pub fn shards(&self) -> &[String] {
        &self.shards
    }

    /// The shards every rank walks in `epoch`, in order.
    pub fn epoch_order(&self, epoch: u64) -> Vec<String> {
        let s = &self.settings;
        order::epoch_order(&self.shards, s.seed, epoch, s.shuffle_shards)
    }

    /// The shards this rank reads in `epoch`, in order.
    pub fn epoch_shards(&self, epoch: u64) -> Vec<String> {
        let s = &self.settings;
        order::rank_split(&self.epoch_order(epoch), s.rank, s.world_size)
    }

    /// This rank's samples of `epoch`. A shard that cannot be fetched or read yields one
    /// error and the epoch goes on with the next shard.
    pub fn epoch(&self, epoch: u64) -> Epoch {
        let s = &self.settings;
        Epoch {
            fetcher: Fetcher::new(
                self.client.fresh(),
                &s.bucket,
                self.epoch_shards(epoch),
                s.read_ahead,
            ),
            current: None,
            buffer: Vec::with_capacity(s.shuffle_buffer.min(1 << 16)),
            capacity: s.shuffle_buffer,
            rng: SplitMix64::new(order::sample_seed(s.seed, epoch, s.rank)),
            exhausted: false,
        }
    }
}

/// The samples of one rank in one epoch (an iterator; see [`Dataset::epoch`]).
pub struct Epoch {
    fetcher: Fetcher,
    current: Option<ShardSamples>,
    buffer: Vec<crate::Sample>,
    capacity: usize,
    rng: SplitMix64,
    exhausted: bool,
}

impl Epoch {
    /// The next sample in shard order, before any shuffle buffer.
    fn pull(&mut self) -> Option<Result<Sample>> {
        loop {
            if let Some(cur) = &mut self.current {
                match cur.next() {
                    Some(Ok(s)) => return Some(Ok(s)),
                    Some(Err(e)) => {
                        self.current = None;
                        return Some(Err(e));
                    }
                    None => self.current = None,
                }
            }
            let (key, stream) = self.fetcher.next()?;
            match stream {
                Ok(r) => self.current = Some(ShardSamples::new(key, r)),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

impl Iterator for Epoch {
    type Item = Result<Sample>;

    fn next(&mut self) -> Option<Result<Sample>> {
        if self.capacity == 0 {
            return self.pull();
        }
        while !self.exhausted && self.buffer.len() < self.capacity {
            match self.pull() {
                Some(Ok(s)) => self.buffer.push(s),
                Some(Err(e)) => return Some(Err(e)),
                None => self.exhausted = true,
            }
        }
        if self.buffer.is_empty() {
            return None;
        }
        let i = self.rng.below(self.buffer.len() as u64) as usize;
        Some(Ok(self.buffer.swap_remove(i)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeServer, Reply};

    #[test]
    fn shard_keys_are_recognised() {
        assert!(is_shard("a/b-0001.tar"));
        assert!(is_shard("x.tar.gz"));
        assert!(is_shard("x.tgz"));
        assert!(!is_shard("x.tar.zst"));
        assert!(!is_shard("x.json"));
    }

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

    /// A node that serves a listing of `shards` and each shard's bytes by key, on any
    /// number of connections, until the test process ends.
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
                        loop {
                            line.clear();
                            if r.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line.trim().is_empty() {
                                break;
                            }
                        }
                        let body = if target.contains("list-type=2") {
                            let mut x =
                                String::from("<ListBucketResult><IsTruncated>false</IsTruncated>");
                            for (k, v) in shards.iter() {
                                x.push_str(&format!(
                                    "<Contents><Key>{k}</Key><Size>{}</Size></Contents>",
                                    v.len()
                                ));
                            }
                            x.push_str(
                                "<Contents><Key>d/notes.txt</Key><Size>1</Size></Contents>\
                                 </ListBucketResult>",
                            );
                            x.into_bytes()
                        } else {
                            let key = target.trim_start_matches("/b/");
                            shards.iter().find(|(k, _)| k == key).unwrap().1.clone()
                        };
                        let head =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
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

    #[test]
    fn ranks_read_every_sample_once_in_a_per_epoch_order() {
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
                    for sample in ds.epoch(epoch) {
                        let sample = sample.unwrap();
                        let (s, i): (usize, usize) = {
                            let text = String::from_utf8(sample.fields["cls"].clone()).unwrap();
                            let (a, b) = text.split_once('-').unwrap();
                            (a.parse().unwrap(), b.parse().unwrap())
                        };
                        assert_eq!(sample.fields["bin"], vec![s as u8; i + 1]);
                        assert_eq!(sample.shard, format!("d/shard-{s}.tar"));
                        order.push(sample.key.clone());
                        seen.push(sample.key);
                    }
                }
                seen.sort();
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
    fn a_missing_shard_is_one_error_and_the_epoch_goes_on() {
        let tar = tar_of(&[("a.cls".to_owned(), b"1".to_vec())]);
        let list = "<ListBucketResult><IsTruncated>false</IsTruncated>\
            <Contents><Key>p/0.tar</Key><Size>1</Size></Contents>\
            <Contents><Key>p/1.tar</Key><Size>1</Size></Contents></ListBucketResult>";
        let gone = "<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>";
        let server = FakeServer::start(vec![
            Reply::ok(list.as_bytes().to_vec()),
            Reply::status(404, gone.as_bytes().to_vec()),
            Reply::ok(tar),
        ]);
        let ds = Dataset::builder()
            .endpoint(&server.endpoint())
            .bucket("b")
            .prefix("p/")
            .shuffle_shards(false)
            .build()
            .unwrap();
        let got: Vec<Result<Sample>> = ds.epoch(0).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].as_ref().unwrap_err().code(), Some("NoSuchKey"));
        assert_eq!(got[1].as_ref().unwrap().key, "a");
        server.finish();
    }
}
