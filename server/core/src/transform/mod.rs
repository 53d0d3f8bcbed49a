//! On-node transforms (`?transform=NAME`): named in the config (`[transforms.NAME]`, a
//! `kind` and its parameters), run on the node that owns the source, their results cached
//! like objects and shared by every job that asks.
//!
//! A result is a cache entry of its own, under a bucket name no S3 bucket can have
//! ([`RESULTS`]), keyed by the source's bucket, key and shard member, the source's ETag,
//! and the transform's name and definition hash. A changed source or definition is
//! another key, so a stale result is never served, and results never need rechecking.
//! The cache's fill machinery does the rest (`Cache::read_derived`): concurrent requests
//! for one result compute it once (one leader, the others stream behind it), never-evict
//! admission, checksums. The node reads the source (through its cache, so the backend is
//! read once) and hands it to [`Transforms::run`], which runs the transform under its
//! concurrency limit. This module knows definitions and how to run them, nothing of
//! where sources come from.

pub mod exec;
pub mod image;
pub mod pipelines;

use std::collections::BTreeMap;

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use granary_proto::Header;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::backend::ObjectMeta;
use crate::stats::Metric;
use crate::stats::Stats;

/// Why a transform could not give a result.
#[derive(Debug, thiserror::Error)]
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

/// The largest source a transform reads (it holds the source in memory).
pub const MAX_INPUT: u64 = 512 << 20;

/// A transform as the config defines it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum TransformDef {
    /// Decode an image, resize, center-crop, encode (see [`image`]).
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

    /// A stable hash of the definition (its canonical JSON): part of every result's key.
    pub fn hash(&self) -> u64 {
        let json = serde_json::to_vec(self).expect("a definition serialises");
        xxhash_rust::xxh3::xxh3_64(&json)
    }

    pub fn content_type(&self) -> &'static str {
        match self {
            TransformDef::Image(s) => image::content_type(s),
            TransformDef::Exec(_) => "application/octet-stream",
        }
    }

    fn concurrency(&self) -> usize {
        match self {
            TransformDef::Image(_) => std::thread::available_parallelism().map_or(2, |n| n.get()),
            TransformDef::Exec(s) => exec::concurrency(s),
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
    limit: Semaphore,
}

impl Named {
    /// Whether a shard member of this name is transformed (the others pass through).
    pub fn takes_member(&self, name: &str) -> bool {
        let base = name.rsplit('/').next().unwrap_or(name);
        let ext = base.rsplit_once('.').map_or("", |(_, e)| e);
        self.members.iter().any(|m| m.eq_ignore_ascii_case(ext))
    }
}

/// The node's transforms by name.
#[derive(Default)]
pub struct Transforms {
    by_name: BTreeMap<String, Arc<Named>>,
    pipelines: pipelines::Pipelines,
}

impl Transforms {
    pub fn new(defs: &BTreeMap<String, TransformSpec>) -> Transforms {
        let by_name = defs
            .iter()
            .map(|(name, spec)| {
                let named = Named {
                    name: name.clone(),
                    hash: spec.hash(),
                    limit: Semaphore::new(spec.def.concurrency().max(1)),
                    def: spec.def.clone(),
                    members: spec.members.clone(),
                };
                (name.clone(), Arc::new(named))
            })
            .collect();
        Transforms {
            by_name,
            pipelines: pipelines::Pipelines::default(),
        }
    }

    /// These transforms, and `pipelines` beside them.
    pub fn with_pipelines(self, pipelines: pipelines::Pipelines) -> Transforms {
        Transforms { pipelines, ..self }
    }

    /// The node's pipelines.
    pub fn pipelines(&self) -> &pipelines::Pipelines {
        &self.pipelines
    }

    pub fn get(&self, name: &str) -> Option<Arc<Named>> {
        self.by_name.get(name).cloned()
    }

    /// The named transform.
    pub fn lookup(&self, name: &str) -> Result<Arc<Named>, TransformError> {
        self.get(name)
            .ok_or_else(|| TransformError::Unknown(name.to_owned()))
    }

    /// Runs `t` on `input` under its concurrency limit; counts runs, failures and
    /// built-ins' CPU time in `stats`.
    pub async fn run(
        &self,
        t: &Named,
        input: Bytes,
        stats: &Stats,
    ) -> Result<Bytes, TransformError> {
        let failed = |why: &dyn std::fmt::Display| TransformError::Failed {
            name: t.name.clone(),
            why: why.to_string(),
        };
        let _permit = t.limit.acquire().await.map_err(|e| failed(&e))?;
        let out = match &t.def {
            TransformDef::Image(spec) => {
                let spec = spec.clone();
                let (out, cpu_us) = tokio::task::spawn_blocking(move || {
                    let start = thread_cpu_us();
                    let out = image::apply(&spec, &input);
                    (out, thread_cpu_us().saturating_sub(start))
                })
                .await
                .map_err(|e| failed(&e))?;
                stats.add(Metric::TransformCpu, cpu_us);
                out.map_err(|e| failed(&e))
            }
            TransformDef::Exec(spec) => exec::run(spec, input).await.map_err(|e| failed(&e)),
        };
        match &out {
            Ok(_) => stats.add(Metric::TransformsRun, 1),
            Err(_) => stats.add(Metric::TransformErrors, 1),
        };
        out.map(Bytes::from)
    }
}

/// What a result is computed from: its cache key (as JSON, under [`RESULTS`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Derived {
    pub bucket: String,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archpath: Option<String>,
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
fn thread_cpu_us() -> u64 {
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
        let named = Transforms::new(&filtered).get("small").unwrap();
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
