//! On-node transforms (`?transform=NAME`) and pipelines (`?pipeline=NAME`): named in
//! the config, run on the node that owns the source.
//!
//! A transform's result is a cache entry of its own, under a bucket name no S3 bucket
//! can have ([`RESULTS`]), keyed by the source's bucket, key and shard member, the
//! source's ETag, and the transform's name and definition hash. A changed source or
//! definition is another key, so a stale result is never served, and results never need
//! rechecking. The cache's fill machinery does the rest (`Cache::read_derived`):
//! concurrent requests for one result compute it once (one leader, the others stream
//! behind it), never-evict admission, checksums.
//!
//! An `image` transform is a pipeline of `granary_prep`'s deterministic steps (resize,
//! center crop) and runs as pipelines run: one image stack, one set of limits. Every
//! run, of a transform or a pipeline, is admitted to the node's prep pool ([`pool`])
//! before its input is read whole ([`Work::cost`], then [`gather`]). This module knows
//! definitions and how to run them, nothing of where sources come from.

pub mod exec;
pub mod image;
pub mod pipelines;
pub mod pool;

use std::collections::BTreeMap;

use std::sync::Arc;
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use granary_prep::{Pipeline, PrepError};
use granary_proto::Header;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::backend::{ByteStream, ObjectMeta};
use crate::stats::Stats;
use pool::{Admitted, Pool};

/// Why a transform could not give a result.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransformError {
    /// The request names a transform this node does not have: the client's side.
    #[error("no transform named `{0}` is configured on this node")]
    Unknown(String),
    /// The source is larger than a transform reads: the client's side.
    #[error("transforms read sources of up to {limit} bytes; this one has {size}")]
    TooLarge { limit: u64, size: u64 },
    /// The transform ran and failed (undecodable input, a command that failed, hung or
    /// flooded): this node's side, for this input; a retry does not help.
    #[error("transform `{name}` failed: {why}")]
    Failed { name: String, why: String },
    /// The request names a pipeline this node does not have: the client's side.
    #[error(
        "no pipeline named `{0}` is configured on this node (GET /_granary/pipelines lists them)"
    )]
    UnknownPipeline(String),
    /// A sample could not be prepared (undecodable, oversized): this node's answer for
    /// this input; a retry does not help.
    #[error("pipeline `{pipeline}` could not prepare sample `{sample}`: {why}")]
    Prep {
        pipeline: String,
        sample: String,
        why: String,
    },
}

/// The bucket name results are cached under: `_` is not allowed in S3 bucket names, so
/// no client object can share a cache key with a result.
pub const RESULTS: &str = "_transformed";

/// The largest source a transform command reads (it holds the source in memory).
pub const MAX_INPUT: u64 = 512 << 20;

/// Bytes of a source read before what a run takes is known: an image's header lies in
/// them (a JPEG's frame header follows its metadata segments). Past them, the run is
/// taken to need the most a preparation may.
pub const PROBE: usize = 256 << 10;

/// The image stack's version, in every `image` transform's hash: results made by an
/// earlier stack (another decoder, another rounding) are other keys.
const IMAGE_STACK: u64 = 2;

/// A transform as the config defines it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum TransformDef {
    /// Decode an image, resize, center-crop, encode: a pipeline (see [`image`]).
    Image(image::ImageSpec),
    /// Run a program: the source on its stdin, the result from its stdout (see [`exec`]).
    Exec(exec::ExecSpec),
}

impl TransformDef {
    pub fn validate(&self) -> std::result::Result<(), String> {
        match self {
            TransformDef::Image(s) => s.validate(),
            TransformDef::Exec(s) => s.validate(),
        }
    }

    /// A stable hash of the definition (its canonical JSON, and for an image transform
    /// the image stack's version): part of every result's key.
    pub fn hash(&self) -> u64 {
        let json = serde_json::to_vec(self).expect("a definition serialises");
        match self {
            TransformDef::Image(_) => xxhash_rust::xxh3::xxh3_64_with_seed(&json, IMAGE_STACK),
            TransformDef::Exec(_) => xxhash_rust::xxh3::xxh3_64(&json),
        }
    }

    pub fn content_type(&self) -> &'static str {
        match self {
            TransformDef::Image(s) => image::content_type(s),
            TransformDef::Exec(_) => "application/octet-stream",
        }
    }
}

/// A transform as configured: its definition, and for `.tar` shards the extensions of
/// the members it applies to (`members = ["jpg", "png"]`). With `members`, `?transform=`
/// on a `.tar` shard answers the shard with those members transformed and the others as
/// they are; without, it transforms the object as a whole.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformSpec {
    pub def: TransformDef,
    pub members: Vec<String>,
}

impl<'de> Deserialize<'de> for TransformSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(d)?;
        let members = match table.remove("members") {
            None => Vec::new(),
            Some(v) => v
                .try_into::<Vec<String>>()
                .map_err(|e| D::Error::custom(format!("members: {e}")))?,
        };
        let def = TransformDef::deserialize(toml::Value::Table(table)).map_err(D::Error::custom)?;
        Ok(TransformSpec {
            def,
            members: members
                .iter()
                .map(|m| m.trim_start_matches('.').to_ascii_lowercase())
                .collect(),
        })
    }
}

impl TransformSpec {
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.members.iter().any(|m| m.is_empty()) {
            return Err("members names extensions, none of them empty".into());
        }
        self.def.validate()
    }

    /// The definition's hash, and the member filter's when there is one.
    pub fn hash(&self) -> u64 {
        let h = self.def.hash();
        if self.members.is_empty() {
            return h;
        }
        let filter = self.members.join("\n");
        xxhash_rust::xxh3::xxh3_64_with_seed(filter.as_bytes(), h)
    }
}

/// One configured transform.
pub struct Named {
    pub name: String,
    pub def: TransformDef,
    /// Extensions of the shard members it applies to (empty: whole objects).
    pub members: Vec<String>,
    pub hash: u64,
    run: Run,
}

/// How a transform runs.
enum Run {
    /// In the prep pool, as a pipeline.
    Image(Pipeline),
    /// A command, at most its `concurrency` at once.
    Exec(exec::ExecSpec, Semaphore),
}

impl Named {
    /// Whether a shard member of this name is transformed (the others pass through).
    pub fn takes_member(&self, name: &str) -> bool {
        let base = name.rsplit('/').next().unwrap_or(name);
        let ext = base.rsplit_once('.').map_or("", |(_, e)| e);
        self.members.iter().any(|m| m.eq_ignore_ascii_case(ext))
    }

    /// What a run of it is.
    pub fn work(&self) -> Work<'_> {
        match &self.run {
            Run::Image(p) => Work::Prepare(p),
            Run::Exec(spec, _) => Work::Command(spec),
        }
    }
}

/// What a source is read whole for.
#[derive(Clone, Copy)]
pub enum Work<'a> {
    /// A preparation: what it takes follows from the image's header.
    Prepare(&'a Pipeline),
    /// A command: its input, and at most its output.
    Command(&'a exec::ExecSpec),
}

impl Work<'_> {
    /// The bytes of the pool's budget a run on a source of `size` bytes whose first
    /// bytes are `prefix` takes; `Ok(None)` where more of the source must be seen first.
    /// `whole`: `prefix` is all there is to see (the source, or [`PROBE`] bytes of it).
    pub fn cost(&self, prefix: &[u8], size: u64, whole: bool) -> Result<Option<u64>, PrepError> {
        match self {
            Work::Prepare(p) => match granary_prep::pixels::probe(prefix, size)? {
                Some(header) => p.cost(&header, size).map(Some),
                None if whole => Ok(Some(granary_prep::MAX_WORK)),
                None => Ok(None),
            },
            Work::Command(spec) => Ok(Some(size + spec.max_output)),
        }
    }

    /// Whether a source of `size` bytes may be read whole for it at all: a command
    /// reads up to [`MAX_INPUT`] (a preparation's most is its cost's).
    pub fn takes(&self, size: u64) -> Result<(), TransformError> {
        match self {
            Work::Command(_) if size > MAX_INPUT => Err(TransformError::TooLarge {
                limit: MAX_INPUT,
                size,
            }),
            _ => Ok(()),
        }
    }

    /// Whether the cost depends on the source's first bytes.
    fn probes(&self) -> bool {
        matches!(self, Work::Prepare(_))
    }
}

/// A source read whole, with the budget its run takes.
pub struct Input {
    pub bytes: Bytes,
    pub admitted: Admitted,
}

/// Reads `body` (`size` bytes) whole for `work`, admitted to `pool` first: its first
/// bytes (up to [`PROBE`]) are read to learn what the run takes, and a source that is
/// not an image, or would take too much, is refused before the rest is read (counted
/// as a failure in `counts`); the rest is read once the pool admits it. `cut`: a read's
/// failure; `refused`: what refusing the run is.
pub async fn gather<E>(
    pool: &Pool,
    (work, counts): (Work<'_>, pool::Counts),
    size: u64,
    mut body: ByteStream,
    cut: impl Fn(std::io::Error) -> E,
    refused: impl Fn(PrepError) -> E,
) -> Result<Input, E> {
    let long = |got: u64| {
        cut(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the source sent {got} bytes where it has {size}"),
        ))
    };
    let mut head = BytesMut::new();
    let cost = loop {
        let seen = head.len() >= PROBE || head.len() as u64 == size || !work.probes();
        match work.cost(&head, size, seen) {
            Ok(Some(cost)) => break cost,
            Ok(None) => {}
            Err(e) => {
                pool.failed(counts);
                return Err(refused(e));
            }
        }
        match body.next().await {
            Some(chunk) => head.extend_from_slice(&chunk.map_err(&cut)?),
            None => {
                return Err(cut(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the source ended at {} of {size} bytes", head.len()),
                )))
            }
        }
        if head.len() as u64 > size {
            return Err(long(head.len() as u64));
        }
    };
    let admitted = pool.admit(cost).await;
    let mut input = BytesMut::with_capacity(size as usize);
    input.extend_from_slice(&head);
    drop(head);
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(&cut)?;
        if (input.len() + chunk.len()) as u64 > size {
            return Err(long((input.len() + chunk.len()) as u64));
        }
        input.extend_from_slice(&chunk);
    }
    if (input.len() as u64) < size {
        return Err(cut(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("the source ended at {} of {size} bytes", input.len()),
        )));
    }
    Ok(Input {
        bytes: input.freeze(),
        admitted,
    })
}

/// The node's transforms by name, its pipelines, and the pool both run in.
pub struct Transforms {
    by_name: BTreeMap<String, Arc<Named>>,
    pipelines: pipelines::Pipelines,
    pool: Pool,
    stats: Arc<Stats>,
}

impl Default for Transforms {
    /// None, and a pool of one thread counting into stats of its own.
    fn default() -> Transforms {
        let stats = Arc::new(Stats::default());
        Transforms {
            by_name: BTreeMap::new(),
            pipelines: pipelines::Pipelines::default(),
            pool: Pool::new(1, stats.clone()),
            stats,
        }
    }
}

impl Transforms {
    /// The configured transforms (each checked), `pipelines` beside them, run on
    /// `threads` prep threads, counted in `stats`.
    pub fn new(
        defs: &BTreeMap<String, TransformSpec>,
        pipelines: pipelines::Pipelines,
        threads: usize,
        stats: Arc<Stats>,
    ) -> Result<Transforms, String> {
        let mut by_name = BTreeMap::new();
        for (name, spec) in defs {
            let run = match &spec.def {
                TransformDef::Image(s) => Run::Image(
                    s.pipeline()
                        .map_err(|e| format!("[transforms.{name}]: {e}"))?,
                ),
                TransformDef::Exec(s) => {
                    Run::Exec(s.clone(), Semaphore::new(exec::concurrency(s).max(1)))
                }
            };
            let named = Named {
                name: name.clone(),
                hash: spec.hash(),
                def: spec.def.clone(),
                members: spec.members.clone(),
                run,
            };
            by_name.insert(name.clone(), Arc::new(named));
        }
        Ok(Transforms {
            by_name,
            pipelines,
            pool: Pool::new(threads, stats.clone()),
            stats,
        })
    }

    /// The node's pipelines.
    pub fn pipelines(&self) -> &pipelines::Pipelines {
        &self.pipelines
    }

    /// The prep pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn get(&self, name: &str) -> Option<Arc<Named>> {
        self.by_name.get(name).cloned()
    }

    /// The named transform.
    pub fn lookup(&self, name: &str) -> Result<Arc<Named>, TransformError> {
        self.get(name)
            .ok_or_else(|| TransformError::Unknown(name.to_owned()))
    }

    /// Runs `t` on `input` (read by [`gather`] for `t.work()`): an image transform in
    /// the pool, a command under its concurrency limit. Counts runs, failures and CPU.
    pub async fn run(&self, t: &Named, input: Input) -> Result<Bytes, TransformError> {
        let failed = |why: &dyn std::fmt::Display| TransformError::Failed {
            name: t.name.clone(),
            why: why.to_string(),
        };
        match &t.run {
            Run::Image(p) => {
                let (p, bytes) = (p.clone(), input.bytes);
                let out = self
                    .pool
                    .run(input.admitted, pool::TRANSFORM, move |go_on| {
                        p.prepare_while(&bytes, (0, 0, ""), go_on)
                    })
                    .await
                    .map_err(|e| failed(&e))?;
                Ok(Bytes::from(out.bytes))
            }
            Run::Exec(spec, limit) => {
                let _run = limit.acquire().await.map_err(|e| failed(&e))?;
                let out = exec::run(spec, input.bytes).await;
                drop(input.admitted);
                match &out {
                    Ok(_) => self.stats.add(crate::stats::Metric::TransformsRun, 1),
                    Err(_) => self.stats.add(crate::stats::Metric::TransformErrors, 1),
                };
                out.map(Bytes::from).map_err(|e| failed(&e))
            }
        }
    }
}

/// What a result is computed from: its cache key (as JSON, under [`RESULTS`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Derived {
    pub bucket: String,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archpath: Option<String>,
    /// Where the member's data starts, for a shard holding two members of its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
    pub etag: String,
    pub transform: String,
    pub hash: String,
}

impl Derived {
    pub fn new(bucket: &str, key: &str, archpath: Option<&str>, etag: &str, t: &Named) -> Self {
        Derived {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            archpath: archpath.map(str::to_owned),
            at: None,
            etag: etag.to_owned(),
            transform: t.name.clone(),
            hash: format!("{:016x}", t.hash),
        }
    }

    /// The result's key in the cache.
    pub fn cache_key(&self) -> String {
        serde_json::to_string(self).expect("a key serialises")
    }
}

/// The metadata of a result: its length, an ETag that names its bytes, and the
/// transform's content type.
pub fn result_meta(t: &Named, out: &[u8]) -> ObjectMeta {
    ObjectMeta {
        size: out.len() as u64,
        etag: format!("{:032x}", xxhash_rust::xxh3::xxh3_128(out)),
        last_modified: SystemTime::now(),
        headers: vec![Header::new("content-type", t.def.content_type())],
    }
}

/// CPU time of the calling thread, in microseconds.
pub(crate) fn thread_cpu_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into the timespec it is given.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0;
    if ok {
        ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
    } else {
        0
    }
}

/// CPU time of every child this process has reaped (transform commands: the node starts
/// no other children), in microseconds.
pub fn children_cpu_us() -> u64 {
    crate::stats::rusage_us(libc::RUSAGE_CHILDREN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_parse_from_toml_and_hash_stably() {
        let text = r#"
            [small]
            kind = "image"
            resize = 32
            crop = [24, 24]
            format = "raw"

            [upper]
            kind = "exec"
            command = ["tr", "a-z", "A-Z"]
            timeout_secs = 2.0
        "#;
        let specs: BTreeMap<String, TransformSpec> = toml::from_str(text).unwrap();
        let defs: BTreeMap<String, TransformDef> =
            specs.into_iter().map(|(k, v)| (k, v.def)).collect();
        assert!(matches!(defs["small"], TransformDef::Image(_)));
        assert!(matches!(defs["upper"], TransformDef::Exec(_)));
        for d in defs.values() {
            d.validate().unwrap();
        }
        let again: BTreeMap<String, TransformSpec> = toml::from_str(text).unwrap();
        assert_eq!(defs["small"].hash(), again["small"].def.hash());
        assert_eq!(
            again["small"].hash(),
            again["small"].def.hash(),
            "no filter, same hash"
        );
        let filtered: BTreeMap<String, TransformSpec> = toml::from_str(&text.replace(
            "format = \"raw\"",
            "format = \"raw\"\nmembers = [\".JPG\", \"png\"]",
        ))
        .unwrap();
        assert_eq!(filtered["small"].members, ["jpg", "png"]);
        assert_ne!(filtered["small"].hash(), again["small"].hash());
        let stats = Arc::new(Stats::default());
        let named = Transforms::new(&filtered, Default::default(), 1, stats)
            .unwrap()
            .get("small")
            .unwrap();
        assert!(named.takes_member("a/000001.JPG") && named.takes_member("x.png"));
        assert!(!named.takes_member("000001.cls") && !named.takes_member("png"));
        let mut changed = defs["small"].clone();
        if let TransformDef::Image(s) = &mut changed {
            s.resize = Some(33);
        }
        assert_ne!(changed.hash(), defs["small"].hash());
        assert!(toml::from_str::<BTreeMap<String, TransformSpec>>("[x]\nkind = \"nope\"").is_err());
        assert!(
            toml::from_str::<BTreeMap<String, TransformSpec>>("[x]\nkind = \"image\"\nsize = 3")
                .is_err(),
            "unknown parameters are refused"
        );
    }

    #[test]
    fn derived_keys_name_every_input() {
        let d = Derived {
            bucket: "b".into(),
            key: "s.tar".into(),
            archpath: Some("a b&c.jpg".into()),
            at: None,
            etag: "\"e1\"".into(),
            transform: "small".into(),
            hash: "00ff".into(),
        };
        let k = d.cache_key();
        let back: Derived = serde_json::from_str(&k).unwrap();
        assert_eq!(back.archpath.as_deref(), Some("a b&c.jpg"));
        let other = Derived {
            etag: "\"e2\"".into(),
            ..d.clone()
        };
        assert_ne!(other.cache_key(), k);
    }
}
