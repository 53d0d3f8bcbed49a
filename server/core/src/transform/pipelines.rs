//! Pipelines: the training-time preparation of samples (`[pipelines.NAME]`), per epoch,
//! on this node's prep threads. What a sample becomes is `granary_prep`'s pure function
//! of (bytes, definition, seed, epoch, sample key); this module holds the definitions,
//! bounds the work (`--prep-threads` at once), keeps what it prepared for the other jobs
//! that read the same sample this epoch (`--prep-memory`), and counts it.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use granary_prep::{Output, Pipeline, PipelineSpec};
use tokio::sync::Semaphore;

use super::{thread_cpu_us, TransformError};
use crate::stats::{Metric, Stats};
use crate::sync::Locked;

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

/// The node's pipelines, the threads that run them and the samples they prepared.
pub struct Pipelines {
    by_name: BTreeMap<String, Arc<NamedPipeline>>,
    threads: Semaphore,
    kept: Kept,
}

impl Default for Pipelines {
    /// No pipelines.
    fn default() -> Pipelines {
        Pipelines {
            by_name: BTreeMap::new(),
            threads: Semaphore::new(1),
            kept: Kept::new(0),
        }
    }
}

/// What a prepared sample is a function of: the pipeline (its name and definition), the
/// job's seed and epoch, and the source's version and member. Two requests with the same
/// key are answered the same bytes, so one preparation serves both.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PrepKey {
    pub pipeline: String,
    pub fingerprint: u64,
    pub seed: u64,
    pub epoch: u64,
    pub bucket: String,
    pub key: String,
    /// The source's ETag: a changed source is another sample.
    pub etag: String,
    /// The member of a shard (empty for an image object).
    pub member: String,
}

impl PrepKey {
    /// What `member` of `bucket/key` (empty for an image object) at version `etag`,
    /// prepared by `p` for `(seed, epoch)`, is kept under.
    pub fn new(
        p: &NamedPipeline,
        (seed, epoch): (u64, u64),
        bucket: &str,
        key: &str,
        etag: &str,
        member: &str,
    ) -> PrepKey {
        PrepKey {
            pipeline: p.name.clone(),
            fingerprint: p.pipeline.fingerprint(),
            seed,
            epoch,
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            etag: etag.to_owned(),
            member: member.to_owned(),
        }
    }
}

/// How long a kept sample no request reads stays: its epoch's jobs have moved on (a
/// job of the seed that registered no plan of its own cannot say when it has read it).
pub const KEPT_IDLE: std::time::Duration = std::time::Duration::from_secs(120);

/// A prepared sample kept for the readers still to come.
struct Held {
    bytes: Bytes,
    reads: AtomicUsize,
}

/// Prepared samples kept in memory (at most `--prep-memory` bytes, the least recently
/// read dropped first, and none left unread for [`KEPT_IDLE`]) until as many reads as
/// the registered plans that read them have taken them; and the preparations under way, so that requests for one sample made at
/// once wait for one preparation. Only an optimisation: a sample dropped early is
/// prepared again, to the same bytes.
struct Kept {
    memory: u64,
    done: moka::sync::Cache<PrepKey, Arc<Held>>,
    flights: Mutex<HashMap<PrepKey, Flight>>,
}

/// A preparation under way: its bytes, or `None` where it failed.
type Flight = Arc<tokio::sync::OnceCell<Option<Bytes>>>;

impl Kept {
    fn new(memory: u64) -> Kept {
        Kept {
            memory,
            done: moka::sync::Cache::builder()
                .max_capacity(memory)
                .weigher(|_, h: &Arc<Held>| u32::try_from(h.bytes.len()).unwrap_or(u32::MAX))
                .eviction_policy(moka::policy::EvictionPolicy::lru())
                .time_to_idle(KEPT_IDLE)
                .build(),
            flights: Mutex::new(HashMap::new()),
        }
    }

    fn flights(&self) -> std::sync::MutexGuard<'_, HashMap<PrepKey, Flight>> {
        self.flights.locked()
    }

    /// A kept sample, counted as read; dropped once `readers` reads have taken it.
    fn take(&self, key: &PrepKey, readers: usize) -> Option<Bytes> {
        let held = self.done.get(key)?;
        let reads = held.reads.fetch_add(1, Ordering::Relaxed) + 1;
        if readers > 1 && reads >= readers {
            self.done.invalidate(key);
        }
        Some(held.bytes.clone())
    }

    /// The sample `key`: kept, prepared by a request under way, or prepared now by
    /// `make`; and whether it was prepared for another request (shared). `readers`: the
    /// registered plans that read it, after whose reads it is dropped; with fewer than
    /// two it stays until memory runs short (jobs of one seed may share one plan, and
    /// jobs without a plan say nothing of their reads).
    ///
    /// `reading`: whether the request reads it (a preparation made ahead of the reads
    /// is kept read by none).
    async fn get_or_prepare<E>(
        &self,
        key: PrepKey,
        readers: usize,
        reading: bool,
        make: impl Future<Output = Result<Bytes, E>>,
    ) -> Result<(Bytes, bool), E> {
        // Looked up under the flights' lock, under which a preparation is kept as it
        // leaves them: a sample is kept, under way, or not begun.
        let cell = {
            let mut flights = self.flights();
            if let Some(bytes) = self.take(&key, readers) {
                return Ok((bytes, true));
            }
            flights.entry(key.clone()).or_default().clone()
        };
        let mut make = Some(make);
        let mut failed = None;
        let got = {
            let (make, failed) = (&mut make, &mut failed);
            cell.get_or_init(move || async move {
                let made = make.take()?.await;
                made.map_err(|e| *failed = Some(e)).ok()
            })
            .await
            .clone()
        };
        // `make` is spent where this request prepared the sample.
        let prepared_here = make.is_none();
        if prepared_here {
            let mut flights = self.flights();
            if let (Some(bytes), true) = (&got, self.memory > 0) {
                let held = Held {
                    bytes: bytes.clone(),
                    reads: AtomicUsize::new(usize::from(reading)),
                };
                self.done.insert(key.clone(), Arc::new(held));
            }
            if flights.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                flights.remove(&key);
            }
        }
        match (got, failed, make) {
            (Some(bytes), _, _) => Ok((bytes, !prepared_here)),
            (None, Some(e), _) => Err(e),
            // The request that was preparing it failed or went away: this one prepares
            // on its own, to the same bytes or its own error.
            (None, None, Some(make)) => make.await.map(|b| (b, false)),
            (None, None, None) => unreachable!("a preparation that failed left its error"),
        }
    }
}

impl Pipelines {
    /// The definitions the config names (each checked at start), run `threads` at once,
    /// their samples kept in `memory` bytes for the jobs that read them.
    pub fn new(
        specs: &BTreeMap<String, PipelineSpec>,
        threads: usize,
        memory: u64,
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
            kept: Kept::new(memory),
        })
    }

    /// The sample `key` names: kept for the jobs that read it, prepared for another
    /// request at the same moment, or prepared now by `make` (which reads the source
    /// and calls [`Pipelines::prepare`]). `readers`: the registered plans that read it.
    /// An answer prepared for another request counts as `prep_shared`.
    pub async fn kept_or_prepared<E>(
        &self,
        key: PrepKey,
        readers: usize,
        stats: &Stats,
        make: impl Future<Output = Result<Bytes, E>>,
    ) -> Result<Bytes, E> {
        let (bytes, shared) = self.kept.get_or_prepare(key, readers, true, make).await?;
        if shared {
            stats.add(Metric::PrepShared, 1);
        }
        Ok(bytes)
    }

    /// Whether samples prepared ahead of their reads may be kept now: what is kept
    /// holds less than half of `--prep-memory` (the other half is for the jobs' own
    /// reads, which share what they prepare).
    pub fn room_ahead(&self) -> bool {
        self.kept.memory > 0 && self.kept.done.weighted_size() < self.kept.memory / 2
    }

    /// Prepares the sample `key` names by `make` and keeps it, read by none, unless it
    /// is kept or being prepared already, or there is no room ahead.
    pub async fn prepare_ahead<E>(
        &self,
        key: PrepKey,
        make: impl Future<Output = Result<Bytes, E>>,
    ) -> Result<(), E> {
        if !self.room_ahead()
            || self.kept.done.contains_key(&key)
            || self.kept.flights().contains_key(&key)
        {
            return Ok(());
        }
        self.kept
            .get_or_prepare(key, 0, false, make)
            .await
            .map(|_| ())
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
