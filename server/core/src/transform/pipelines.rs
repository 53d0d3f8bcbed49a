//! Pipelines: the training-time preparation of samples (`[pipelines.NAME]`), per epoch.
//! What a sample becomes is `granary_prep`'s pure function of (bytes, definition, seed,
//! epoch, sample key); this module holds the definitions, and keeps what was prepared
//! for the other jobs that read the same sample this epoch (`--prep-memory`), with the
//! preparations under way, so that requests for one sample made at once wait for one
//! preparation, and share its failure as they would its bytes. The work itself runs in
//! the node's prep pool ([`super::pool`]).

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use granary_prep::{Output, Pipeline, PipelineSpec};

use super::TransformError;
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
            Output::Png => "image/png",
        }
    }
}

/// The node's pipelines and the samples they prepared.
pub struct Pipelines {
    by_name: BTreeMap<String, Arc<NamedPipeline>>,
    kept: Kept,
}

impl Default for Pipelines {
    /// No pipelines.
    fn default() -> Pipelines {
        Pipelines {
            by_name: BTreeMap::new(),
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
    /// Where the member's data starts in the shard, where its name is not enough (a
    /// shard holding two members of one name).
    pub at: Option<u64>,
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
            at: None,
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

/// Why a preparation failed, shared by every request that waited for it: the error
/// the preparing side made, whatever its type (the node's, for its reads and the work).
pub type Failure = Arc<dyn Any + Send + Sync>;

/// A preparation under way: its bytes or its failure, once made.
type Flight = tokio::sync::OnceCell<Result<Bytes, Failure>>;

/// Prepared samples kept in memory (at most `--prep-memory` bytes, the least recently
/// read dropped first, and none left unread for [`KEPT_IDLE`]) until as many reads as
/// the registered plans that read them have taken them; and the preparations under way,
/// so that requests for one sample made at once wait for one preparation. Only an
/// optimisation: a sample dropped early is prepared again, to the same bytes.
///
/// A preparation under way is held by the requests that wait for it, not by the map
/// that finds it: where the request preparing it goes, a waiting one takes over; where
/// all go, it is gone, and the last of them takes its entry out.
struct Kept {
    memory: u64,
    done: moka::sync::Cache<PrepKey, Arc<Held>>,
    flights: Mutex<HashMap<PrepKey, Weak<Flight>>>,
}

/// A request's hold on a preparation under way: where it is the last to go, it takes
/// the preparation's entry out.
struct Waiting<'a> {
    kept: &'a Kept,
    key: &'a PrepKey,
    flight: Arc<Flight>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut flights = self.kept.flights();
        // Under the lock no other request can take a hold from the entry meanwhile.
        if Arc::strong_count(&self.flight) == 1
            && flights
                .get(self.key)
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.flight)))
        {
            flights.remove(self.key);
        }
    }
}

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

    fn flights(&self) -> std::sync::MutexGuard<'_, HashMap<PrepKey, Weak<Flight>>> {
        self.flights.locked()
    }

    /// Whether a preparation of `key` is under way.
    fn under_way(&self, key: &PrepKey) -> bool {
        self.flights()
            .get(key)
            .is_some_and(|w| w.strong_count() > 0)
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
    /// jobs without a plan say nothing of their reads). A failure is every waiting
    /// request's; the next request tries again.
    ///
    /// `reading`: whether the request reads it (a preparation made ahead of the reads
    /// is kept read by none).
    async fn get_or_prepare(
        &self,
        key: &PrepKey,
        readers: usize,
        reading: bool,
        make: impl Future<Output = Result<Bytes, Failure>>,
    ) -> Result<(Bytes, bool), Failure> {
        // Looked up under the flights' lock, under which a preparation is kept as it
        // leaves them: a sample is kept, under way, or not begun.
        let waiting = {
            let mut flights = self.flights();
            if let Some(bytes) = self.take(key, readers) {
                return Ok((bytes, true));
            }
            let flight = match flights.get(key).and_then(Weak::upgrade) {
                Some(f) => f,
                None => {
                    let f = Arc::new(Flight::new());
                    flights.insert(key.clone(), Arc::downgrade(&f));
                    f
                }
            };
            Waiting {
                kept: self,
                key,
                flight,
            }
        };
        let mut made_here = false;
        let got = {
            let made_here = &mut made_here;
            waiting
                .flight
                .get_or_init(move || {
                    *made_here = true;
                    make
                })
                .await
                .clone()
        };
        if made_here {
            let mut flights = self.flights();
            if let (Ok(bytes), true) = (&got, self.memory > 0) {
                let held = Held {
                    bytes: bytes.clone(),
                    reads: AtomicUsize::new(usize::from(reading)),
                };
                self.done.insert(key.clone(), Arc::new(held));
            }
            // Made: the next request finds it kept, or (failed) tries again.
            if flights
                .get(key)
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&waiting.flight)))
            {
                flights.remove(key);
            }
        }
        got.map(|bytes| (bytes, !made_here))
    }
}

impl Pipelines {
    /// The definitions the config names (each checked at start), their samples kept in
    /// `memory` bytes for the jobs that read them.
    pub fn new(specs: &BTreeMap<String, PipelineSpec>, memory: u64) -> Result<Pipelines, String> {
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
            kept: Kept::new(memory),
        })
    }

    /// The sample `key` names: kept for the jobs that read it, prepared for another
    /// request at the same moment, or prepared now by `make` (which reads the source
    /// and prepares it in the pool). `readers`: the registered plans that read it. An
    /// answer prepared for another request counts as `prep_shared`.
    pub async fn kept_or_prepared(
        &self,
        key: &PrepKey,
        readers: usize,
        stats: &Stats,
        make: impl Future<Output = Result<Bytes, Failure>>,
    ) -> Result<Bytes, Failure> {
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
    pub async fn prepare_ahead(
        &self,
        key: &PrepKey,
        make: impl Future<Output = Result<Bytes, Failure>>,
    ) -> Result<(), Failure> {
        if !self.room_ahead() || self.kept.done.contains_key(key) || self.kept.under_way(key) {
            return Ok(());
        }
        self.kept
            .get_or_prepare(key, 0, false, make)
            .await
            .map(|_| ())
    }

    /// Preparations under way (their entries, live or not yet taken out).
    pub fn flights(&self) -> usize {
        self.kept.flights().len()
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(n: u64) -> PrepKey {
        PrepKey {
            pipeline: "p".into(),
            fingerprint: 1,
            seed: n,
            epoch: 0,
            bucket: "b".into(),
            key: "k.jpg".into(),
            etag: "e".into(),
            member: String::new(),
            at: None,
        }
    }

    fn failure(why: &str) -> Failure {
        Arc::new(why.to_owned())
    }

    /// Thirty requests for a sample that fails at once make one preparation, and each
    /// gets its failure; the next request tries again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failure_is_shared_by_the_requests_that_waited_for_it() {
        let kept = Arc::new(Kept::new(1 << 20));
        let made = Arc::new(AtomicUsize::new(0));
        let k = key(1);
        let tasks: Vec<_> = (0..30)
            .map(|_| {
                let (kept, made, k) = (kept.clone(), made.clone(), k.clone());
                tokio::spawn(async move {
                    kept.get_or_prepare(&k, 0, true, async {
                        made.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Err(failure("not an image"))
                    })
                    .await
                })
            })
            .collect();
        for t in tasks {
            let err = t.await.unwrap().unwrap_err();
            assert_eq!(err.downcast_ref::<String>().unwrap(), "not an image");
        }
        assert_eq!(made.load(Ordering::SeqCst), 1, "prepared once for thirty");
        assert_eq!(kept.flights().len(), 0);
        let again = kept
            .get_or_prepare(&k, 0, true, async { Ok(Bytes::from_static(b"x")) })
            .await
            .unwrap();
        assert_eq!(again, (Bytes::from_static(b"x"), false));
    }

    /// A preparation whose only request goes leaves no entry behind: the sample is not
    /// "under way" for good, and a preparation ahead of the reads runs.
    #[tokio::test]
    async fn a_preparation_nobody_waits_for_leaves_no_entry() {
        let kept = Kept::new(1 << 20);
        let k = key(2);
        let never = kept.get_or_prepare(&k, 0, true, std::future::pending());
        assert!(tokio::time::timeout(Duration::from_millis(20), never)
            .await
            .is_err());
        assert!(!kept.under_way(&k));
        assert_eq!(kept.flights().len(), 0);
        // One that waits takes over from one that went.
        let mut first = Box::pin(kept.get_or_prepare(&k, 0, true, std::future::pending()));
        let mut second =
            Box::pin(kept.get_or_prepare(&k, 0, true, async { Ok(Bytes::from_static(b"y")) }));
        assert!(futures::poll!(&mut first).is_pending());
        assert!(futures::poll!(&mut second).is_pending());
        drop(first);
        assert_eq!(second.await.unwrap().0, Bytes::from_static(b"y"));
        assert_eq!(kept.flights().len(), 0);
    }
}
