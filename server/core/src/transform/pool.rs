//! The node's CPU work for samples and transforms: one pool of `--prep-threads` threads
//! and one memory budget, for every preparation (pipelines' samples, image transforms)
//! and every transform command's input and output.
//!
//! Work is admitted before it is spent. A preparation's memory (its input, the decode,
//! each step's images, the encoding: [`granary_prep::Pipeline::cost`], from the
//! definition and the input's header) is taken from the budget ([`Pool::admit`]) before
//! the input is read whole, and a thread is taken before the work starts ([`Pool::run`]).
//! Both permits move into the work itself: a request that goes away drops its wait, not
//! the work it started, which holds its thread and its memory until it ends and is
//! counted (CPU time, samples, failures) where it runs. Work nobody waits for any more
//! stops at its next step boundary ([`granary_prep::PrepError::Cancelled`]).
//!
//! The budget is [`MAX_WORK`] (one preparation of the most a preparation may take) plus
//! [`PER_THREAD`] for each prep thread, less the resizer a thread's work may leave kept
//! between images ([`KEEP_SCRATCH`]): at most that much is held by inputs waiting for a
//! thread, by work running and by kept resizers, whatever the requests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use granary_prep::pixels::KEEP_SCRATCH;
use granary_prep::{PrepError, MAX_WORK};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::stats::{Metric, Stats};

/// Budget each prep thread adds to [`MAX_WORK`]: room for many ordinary preparations
/// (a 500 x 375 photograph to a 224 crop takes about 1.6 MB) beside one large one.
pub const PER_THREAD: u64 = 64 << 20;

/// The budget is counted in KiB (a semaphore's permits are taken 2^32 at most at once).
const UNIT: u64 = 1024;

/// Which counters a kind of work adds to.
#[derive(Debug, Clone, Copy)]
pub struct Counts {
    pub cpu: Metric,
    pub done: Metric,
    pub failed: Metric,
}

/// What pipelines' preparations count.
pub const PREP: Counts = Counts {
    cpu: Metric::PrepCpu,
    done: Metric::PrepSamples,
    failed: Metric::PrepErrors,
};

/// What built-in transforms count.
pub const TRANSFORM: Counts = Counts {
    cpu: Metric::TransformCpu,
    done: Metric::TransformsRun,
    failed: Metric::TransformErrors,
};

/// The threads and the memory budget.
pub struct Pool {
    threads: Arc<Semaphore>,
    size: usize,
    memory: Arc<Semaphore>,
    budget: u64,
    stats: Arc<Stats>,
    levels: Arc<Levels>,
}

/// What the pool holds now, for the node's gauges.
#[derive(Default)]
struct Levels {
    running: AtomicU64,
    peak: AtomicU64,
    admitted: AtomicU64,
}

/// Memory taken from the budget; given back when dropped.
pub struct Admitted {
    _permit: Option<OwnedSemaphorePermit>,
    bytes: u64,
    levels: Arc<Levels>,
}

impl Admitted {
    /// The bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.levels
            .admitted
            .fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// One running preparation, counted while it lives.
struct Running(Arc<Levels>);

impl Running {
    fn new(levels: &Arc<Levels>) -> Running {
        let now = levels.running.fetch_add(1, Ordering::Relaxed) + 1;
        levels.peak.fetch_max(now, Ordering::Relaxed);
        Running(levels.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Pool {
    /// `threads` prep threads (at least one), counting into `stats`.
    pub fn new(threads: usize, stats: Arc<Stats>) -> Pool {
        let size = threads.max(1);
        let budget = MAX_WORK + size as u64 * (PER_THREAD - KEEP_SCRATCH);
        Pool {
            threads: Arc::new(Semaphore::new(size)),
            size,
            memory: Arc::new(Semaphore::new((budget / UNIT) as usize)),
            budget,
            stats,
            levels: Arc::default(),
        }
    }

    /// The prep threads.
    pub fn threads(&self) -> usize {
        self.size
    }

    /// The memory budget, in bytes: [`MAX_WORK`] + threads x ([`PER_THREAD`] - [`KEEP_SCRATCH`]).
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Preparations running now, the most that ever ran at once, and the budget's bytes
    /// held.
    pub fn levels(&self) -> (u64, u64, u64) {
        let l = &self.levels;
        (
            l.running.load(Ordering::Relaxed),
            l.peak.load(Ordering::Relaxed),
            l.admitted.load(Ordering::Relaxed),
        )
    }

    /// Counts a run refused before it was admitted (its input cannot be taken).
    pub fn failed(&self, counts: Counts) {
        self.stats.add(counts.failed, 1);
    }

    /// Takes `bytes` of the budget (at most [`MAX_WORK`]: more is taken as that much),
    /// waiting while it is held by others, in turn.
    pub async fn admit(&self, bytes: u64) -> Admitted {
        let bytes = bytes.min(MAX_WORK);
        let units = bytes.div_ceil(UNIT) as u32;
        let permit = self.memory.clone().acquire_many_owned(units).await.ok();
        self.levels.admitted.fetch_add(bytes, Ordering::Relaxed);
        Admitted {
            _permit: permit,
            bytes,
            levels: self.levels.clone(),
        }
    }

    /// Runs `work` on a prep thread once one is free, with `admitted` held until it
    /// ends; `work` is told whether anyone still waits for its result (it stops at its
    /// next step boundary where not). Its CPU time, and whether it succeeded, failed or
    /// stopped, are counted in `counts` as it ends, whether or not this future is still
    /// there to take the result.
    pub async fn run<T: Send + 'static>(
        &self,
        admitted: Admitted,
        counts: Counts,
        work: impl FnOnce(&dyn Fn() -> bool) -> Result<T, PrepError> + Send + 'static,
    ) -> Result<T, PrepError> {
        // Waiting for a thread is the caller's: dropped with it, nothing was started.
        let thread = self
            .threads
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| PrepError::Internal(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        let stats = self.stats.clone();
        let levels = self.levels.clone();
        tokio::task::spawn_blocking(move || {
            // Dropped in this order: the count before the thread is free for another.
            let held = (Running::new(&levels), admitted, thread);
            let cpu = CpuCount::start(stats, counts);
            let out = work(&|| !tx.is_closed());
            cpu.end(&out);
            // The work is over: its thread and memory are back before its result is.
            drop(held);
            // Nobody may be left to take it.
            let _ = tx.send(out);
        });
        rx.await.unwrap_or_else(|_| {
            Err(PrepError::Internal(
                "the preparation ended without a result (it panicked)".into(),
            ))
        })
    }
}

/// A work's CPU time, counted when it ends, panics included.
struct CpuCount {
    stats: Arc<Stats>,
    counts: Counts,
    start: u64,
    outcome: Option<Metric>,
}

impl CpuCount {
    fn start(stats: Arc<Stats>, counts: Counts) -> CpuCount {
        CpuCount {
            stats,
            counts,
            start: super::thread_cpu_us(),
            outcome: Some(counts.failed),
        }
    }

    fn end<T>(mut self, out: &Result<T, PrepError>) {
        self.outcome = match out {
            Ok(_) => Some(self.counts.done),
            Err(PrepError::Cancelled) => Some(Metric::PrepCancelled),
            Err(_) => Some(self.counts.failed),
        };
    }
}

impl Drop for CpuCount {
    fn drop(&mut self) {
        let spent = super::thread_cpu_us().saturating_sub(self.start);
        self.stats.add(self.counts.cpu, spent);
        if let Some(m) = self.outcome {
            self.stats.add(m, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pool(threads: usize) -> (Pool, Arc<Stats>) {
        let stats = Arc::new(Stats::default());
        (Pool::new(threads, stats.clone()), stats)
    }

    /// Work whose caller went away still holds its thread until it ends, and is counted;
    /// it is told nobody waits, and stops where it asks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_keeps_its_thread_after_its_caller_goes_and_is_counted() {
        let (pool, stats) = pool(1);
        let pool = Arc::new(pool);
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let first = {
            let pool = pool.clone();
            tokio::spawn(async move {
                let admitted = pool.admit(1 << 20).await;
                pool.run(admitted, PREP, move |go_on| {
                    started_tx.send(()).unwrap();
                    // A step, then a boundary.
                    let t = std::time::Instant::now();
                    while t.elapsed() < Duration::from_millis(300) {}
                    if !go_on() {
                        return Err(PrepError::Cancelled);
                    }
                    Ok(())
                })
                .await
            })
        };
        tokio::task::spawn_blocking(move || started_rx.recv().unwrap())
            .await
            .unwrap();
        first.abort();
        assert_eq!(pool.levels().0, 1, "the work runs on without its caller");
        // A second run waits for the one thread the first still holds.
        let admitted = pool.admit(1 << 20).await;
        let second = tokio::time::timeout(
            Duration::from_millis(100),
            pool.run(admitted, PREP, |_| Ok(())),
        )
        .await;
        assert!(second.is_err(), "ran beside the first on one thread");
        let admitted = pool.admit(1 << 20).await;
        pool.run(admitted, PREP, |_| Ok(())).await.unwrap();
        assert_eq!(pool.levels().1, 1, "never two at once");
        assert_eq!(stats.get(Metric::PrepCancelled), 1);
        assert_eq!(stats.get(Metric::PrepSamples), 1);
        assert!(
            stats.get(Metric::PrepCpu) >= 250_000,
            "{}",
            stats.get(Metric::PrepCpu)
        );
        assert_eq!(pool.levels().2, 0, "all the memory is back");
    }

    /// The budget is shared: what is admitted waits while the budget is held, and a
    /// request past one preparation's most is taken as that most.
    #[tokio::test]
    async fn admission_waits_for_the_budget() {
        let (pool, _) = pool(1);
        let per_thread = PER_THREAD - KEEP_SCRATCH;
        assert_eq!(pool.budget(), MAX_WORK + per_thread);
        let big = pool.admit(u64::MAX).await;
        assert_eq!(big.bytes(), MAX_WORK);
        let small = pool.admit(per_thread).await;
        assert_eq!(pool.levels().2, MAX_WORK + per_thread);
        let more = tokio::time::timeout(Duration::from_millis(50), pool.admit(1)).await;
        assert!(more.is_err(), "admitted past the budget");
        drop(small);
        let one = tokio::time::timeout(Duration::from_millis(50), pool.admit(1)).await;
        assert!(one.is_ok());
        drop(big);
    }

    /// A panic in the work is an error for its caller, and gives back what it held.
    #[tokio::test]
    async fn a_panic_is_an_error_and_frees_the_thread() {
        let (pool, stats) = pool(1);
        let admitted = pool.admit(10).await;
        let got: Result<(), PrepError> = pool
            .run(admitted, TRANSFORM, |_| panic!("a bug in a step"))
            .await;
        assert!(matches!(got, Err(PrepError::Internal(_))), "{got:?}");
        assert_eq!(stats.get(Metric::TransformErrors), 1);
        let admitted = pool.admit(10).await;
        pool.run(admitted, TRANSFORM, |_| Ok(())).await.unwrap();
        assert_eq!(pool.levels(), (0, 1, 0));
    }
}
