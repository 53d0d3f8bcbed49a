//! Pipelines: the training-time preparation of samples (`[pipelines.NAME]`), per epoch,
//! on this node's prep threads. What a sample becomes is `granary_prep`'s pure function
//! of (bytes, definition, seed, epoch, sample key); this module holds the definitions,
//! bounds the work (`--prep-threads` at once) and counts it.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use granary_prep::{Output, Pipeline, PipelineSpec};
use tokio::sync::Semaphore;

use super::{thread_cpu_us, TransformError};
use crate::stats::{Metric, Stats};

/// A configured pipeline.
#[derive(Debug)]
pub struct NamedPipeline {
    pub name: String,
    pub pipeline: Pipeline,
}

impl NamedPipeline {
    /// The content type of what it prepares.
    pub fn content_type(&self) -> &'static str {
        match self.pipeline.spec().output {
            Output::Raw => "application/octet-stream",
            Output::Jpeg => "image/jpeg",
        }
    }
}

/// The node's pipelines and the threads that run them.
pub struct Pipelines {
    by_name: BTreeMap<String, Arc<NamedPipeline>>,
    threads: Semaphore,
}

impl Default for Pipelines {
    /// No pipelines.
    fn default() -> Pipelines {
        Pipelines {
            by_name: BTreeMap::new(),
            threads: Semaphore::new(1),
        }
    }
}

impl Pipelines {
    /// The definitions the config names (each checked at start), run `threads` at once.
    pub fn new(
        specs: &BTreeMap<String, PipelineSpec>,
        threads: usize,
    ) -> Result<Pipelines, String> {
        let mut by_name = BTreeMap::new();
        for (name, spec) in specs {
            let pipeline =
                Pipeline::new(spec.clone()).map_err(|e| format!("[pipelines.{name}]: {e}"))?;
            let named = NamedPipeline {
                name: name.clone(),
                pipeline,
            };
            by_name.insert(name.clone(), Arc::new(named));
        }
        Ok(Pipelines {
            by_name,
            threads: Semaphore::new(threads.max(1)),
        })
    }

    pub fn lookup(&self, name: &str) -> Result<Arc<NamedPipeline>, TransformError> {
        self.by_name
            .get(name)
            .cloned()
            .ok_or_else(|| TransformError::UnknownPipeline(name.to_owned()))
    }

    /// Every definition, by name (`GET /_granary/pipelines`).
    pub fn json(&self) -> serde_json::Value {
        let all: serde_json::Map<String, serde_json::Value> = self
            .by_name
            .iter()
            .map(|(name, p)| {
                let def = serde_json::to_value(p.pipeline.spec()).expect("a spec serialises");
                (name.clone(), def)
            })
            .collect();
        serde_json::json!({ "pipelines": all })
    }

    /// Prepares `input` as sample `key` of `epoch` for a job seeded `seed`, on a prep
    /// thread (at most `--prep-threads` at once); counts the sample and its CPU time.
    pub async fn prepare(
        &self,
        p: &Arc<NamedPipeline>,
        input: Bytes,
        (seed, epoch): (u64, u64),
        key: &str,
        stats: &Stats,
    ) -> Result<Bytes, TransformError> {
        let failed = |why: String| TransformError::Prep {
            pipeline: p.name.clone(),
            sample: key.to_owned(),
            why,
        };
        let _thread = self
            .threads
            .acquire()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let (job, sample) = (p.clone(), key.to_owned());
        let (out, cpu_us) = tokio::task::spawn_blocking(move || {
            let start = thread_cpu_us();
            let out = job.pipeline.prepare(&input, seed, epoch, &sample);
            (out, thread_cpu_us().saturating_sub(start))
        })
        .await
        .map_err(|e| failed(e.to_string()))?;
        stats.add(Metric::PrepCpu, cpu_us);
        match out {
            Ok(prepared) => {
                stats.add(Metric::PrepSamples, 1);
                Ok(Bytes::from(prepared.bytes))
            }
            Err(e) => {
                stats.add(Metric::PrepErrors, 1);
                Err(failed(e.to_string()))
            }
        }
    }
}
