//! Samples of a planned epoch in output order ([`PlannedRead`]): runs fetched as each is
//! needed, and `read_ahead` runs fetched ahead by as many threads, each with its own
//! connections; the shuffle buffer's order served from the runs fetched.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::catalog::Catalog;
use super::delivered::*;
use super::fetch::*;
use super::plan::SampleId;
use super::route::{on_best, Clients};
use super::runs::*;
use super::settings::*;
use crate::{Error, GetOptions, Result, Sample};

/// The fetching threads' shared state.
pub(super) struct Shared {
    /// The next run no thread has taken, the furthest run the reader has asked for,
    /// whether reading stops, and whether a run has come in: none is read ahead of the
    /// first, so that the first sample waits on one read, and a cold start brings only
    /// what it needs.
    pub(super) progress: Mutex<(usize, usize, bool, bool)>,
    pub(super) wake: Condvar,
}

impl Shared {
    /// The progress, locked (a thread that panicked holding it left it whole).
    pub(super) fn progress(&self) -> std::sync::MutexGuard<'_, (usize, usize, bool, bool)> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A run read from a node on this machine in longer than this, and [`WAITED_PER_MIB`] for
/// each MiB of it, waited on more than a copy (the node filled it from its backend
/// first): the reader then fetches ahead, as it does where a run comes from another
/// machine. A copy out of the page cache on two busy cores takes 1-2 ms per MiB; a fill
/// from a store at a connection's 100 MB/s, 10.
pub(super) const WAITED: Duration = Duration::from_millis(10);

pub(super) const WAITED_PER_MIB: Duration = Duration::from_millis(4);

/// Runs fetched by the reader itself, as each is needed.
pub(super) struct Here {
    pub(super) runs: Arc<Vec<Run>>,
    pub(super) clients: Clients,
    /// Which runs have been fetched, and whether any has.
    pub(super) fetched: Vec<bool>,
    pub(super) any: bool,
    /// Where the fetching threads, once started, send what they fetch.
    pub(super) tx: mpsc::Sender<(usize, Result<Fetched>)>,
}

/// Samples of a planned epoch in output order (an iterator).
pub struct PlannedRead {
    pub(super) slots: usize,
    pub(super) next_slot: usize,
    pub(super) run_of_slot: Vec<u32>,
    pub(super) ready: HashMap<usize, Delivered>,
    pub(super) results: Receiver<(usize, Result<Fetched>)>,
    pub(super) shared: Arc<Shared>,
    /// Until the fetching threads start (without read-ahead, never): the runs and how
    /// they are fetched here.
    pub(super) here: Option<Here>,
    pub(super) failed: bool,
    pub(super) catalog: Arc<Catalog>,
    pub(super) settings: ReadSettings,
    /// Connections for members whose pages left memory before they were copied out.
    pub(super) spare: Option<Clients>,
}

impl PlannedRead {
    /// Reads `wanted` (in span order, each with its slot in the output `0..slots`).
    pub fn start(
        catalog: Arc<Catalog>,
        wanted: &[(SampleId, usize)],
        slots: usize,
        settings: ReadSettings,
    ) -> PlannedRead {
        PlannedRead::start_marked(catalog, wanted, slots, settings, None, None)
    }

    /// [`PlannedRead::start`], each run marked as a read of a registered plan: `mark`
    /// is the plan's mark up to the place (`PLAN:EPOCH:RANK:`), and each slot's place.
    ///
    /// Where a node on this machine may serve the runs from its cache file and
    /// `ahead_here` is off, the reader fetches each run itself as it needs it, and starts
    /// the `read_ahead` threads only once a run waits on more than a copy (it came from
    /// another member, or the node filled it first): a copy out of the page cache has no
    /// wait to hide, and threads copying ahead of a DataLoader worker take the cores the
    /// other workers and the training loop run on.
    pub(super) fn start_marked(
        catalog: Arc<Catalog>,
        wanted: &[(SampleId, usize)],
        slots: usize,
        settings: ReadSettings,
        mark: Option<(String, Vec<u32>)>,
        pipeline: Option<Arc<crate::Pipelined>>,
    ) -> PlannedRead {
        let mut runs = runs_of(&catalog, wanted);
        for r in &mut runs {
            r.pipeline = pipeline.clone();
        }
        if let Some((head, places)) = &mark {
            for r in &mut runs {
                let place = r
                    .take
                    .iter()
                    .map(|&(_, slot)| places[slot])
                    .min()
                    .unwrap_or(0);
                r.mark = Some(format!("{head}{place}"));
            }
        }
        let mut run_of_slot = vec![0u32; slots];
        for (i, r) in runs.iter().enumerate() {
            for &(_, slot) in &r.take {
                run_of_slot[slot] = i as u32;
            }
        }
        let shared = Arc::new(Shared {
            progress: Mutex::new((0, 0, false, false)),
            wake: Condvar::new(),
        });
        let (tx, results) = mpsc::channel();
        let runs = Arc::new(runs);
        let mut here = None;
        if settings.read_ahead == 0 || (settings.local != LocalReads::Off && !settings.ahead_here) {
            here = Some(Here {
                fetched: vec![false; runs.len()],
                any: false,
                clients: settings.clients(),
                runs,
                tx,
            });
        } else {
            let done = Arc::new(Vec::new());
            fetch_ahead(catalog.clone(), runs, &settings, &shared, tx, done);
        }
        PlannedRead {
            slots,
            next_slot: 0,
            run_of_slot,
            ready: HashMap::new(),
            results,
            shared,
            here,
            failed: false,
            catalog,
            settings,
            spare: None,
        }
    }

    /// `sample` with its members copied out ([`PlannedRead::copy_member`]).
    pub fn copied(&mut self, sample: ResidentSample) -> Result<Sample> {
        let mut fields = std::collections::BTreeMap::new();
        for (i, (ext, range)) in sample.fields.iter().enumerate() {
            let mut bytes = Vec::with_capacity(range.len());
            // SAFETY: `bytes` has room for the member, all written where this is `Ok`.
            unsafe {
                self.copy_member(&sample, i, bytes.as_mut_ptr())?;
                bytes.set_len(range.len());
            }
            fields.insert(ext.clone(), bytes);
        }
        Ok(Sample {
            key: sample.key,
            shard: sample.shard,
            fields,
        })
    }

    /// Copies member `i` of `sample` to `dst`: out of the page cache where its pages are
    /// still there, else from the node, which reads and checks them first (their pages
    /// left memory since the node checked the run, and the disk is not trusted unchecked).
    ///
    /// # Safety
    ///
    /// `dst` must be valid for writes of the member's length; they are all written only
    /// where this returns `Ok`.
    ///
    /// # Panics
    ///
    /// Where `sample` has no member `i`.
    pub unsafe fn copy_member(
        &mut self,
        sample: &ResidentSample,
        i: usize,
        dst: *mut u8,
    ) -> Result<()> {
        let range = sample.fields[i].1.clone();
        if range.is_empty() {
            return Ok(());
        }
        let run = &sample.run;
        // SAFETY: the caller vouches for `dst`.
        if unsafe { run.map.copy_resident(range.clone(), dst) }.map_err(Error::Local)? {
            return Ok(());
        }
        let shard = &self.catalog.shards[run.shard as usize];
        let opts = GetOptions {
            range: Some(run.start + range.start as u64..run.start + range.end as u64),
            if_match: Some(shard.etag.clone()).filter(|e| !e.is_empty()),
            ..GetOptions::default()
        };
        let bucket = &self.catalog.bucket;
        let clients = self.spare.get_or_insert_with(|| self.settings.clients());
        let len = range.len();
        let ask = |clients: &mut Clients| {
            on_best(clients, bucket, &shard.key, |c| {
                let mut room = |n: usize| {
                    if n == len {
                        Ok(dst)
                    } else {
                        Err(Error::Protocol(format!(
                            "{}: {n} bytes for a member of {len}",
                            shard.key
                        )))
                    }
                };
                // SAFETY: `room` hands out `dst` for the member's length only.
                unsafe { c.get_with_alloc(bucket, &shard.key, &opts, &mut room) }
            })
        };
        // A node that finds a block damaged cuts its answer short and drops the entry:
        // asked once more, it reads the object anew.
        match ask(clients) {
            Err(e) if e.is_retryable() => ask(clients).map(drop),
            other => other.map(drop),
        }
    }

    pub(super) fn take(&mut self, got: Result<Fetched>) -> Result<()> {
        for (slot, sample) in got? {
            self.ready.insert(slot, sample);
        }
        Ok(())
    }

    /// Fetches run `run` here; starts the fetching threads after it where it waited on
    /// more than a copy and read-ahead is asked for.
    pub(super) fn fetch_here(&mut self, run: usize) -> Result<Fetched> {
        let Some(h) = &mut self.here else {
            return Err(Error::Invalid("no run is fetched here".into()));
        };
        let began = std::time::Instant::now();
        let r = &h.runs[run];
        let shard = &self.catalog.shards[r.shard as usize];
        let bytes = r.range(shard).map_or(shard.size, |b| b.end - b.start);
        let limit = WAITED + WAITED_PER_MIB * (bytes >> 20) as u32;
        let got = fetch(&self.catalog, r, &mut h.clients, self.settings.local, true);
        // The first read's time is the connection's too: it is not judged by it.
        let judged = std::mem::replace(&mut h.any, true);
        h.fetched[run] = true;
        let waited = match &got {
            Ok((_, here)) => !here || (judged && began.elapsed() > limit),
            Err(_) => false,
        };
        if waited && self.settings.read_ahead > 0 {
            if let Some(h) = self.here.take() {
                let first = h.fetched.iter().position(|&f| !f).unwrap_or(h.runs.len());
                *self.shared.progress() = (first, run, false, true);
                let (catalog, fetched) = (self.catalog.clone(), Arc::new(h.fetched));
                fetch_ahead(catalog, h.runs, &self.settings, &self.shared, h.tx, fetched);
            }
        }
        got.map(|(samples, _)| samples)
    }

    /// Waits for run `run` from the fetching threads (any run they fetched is taken).
    pub(super) fn fetched_ahead(&mut self, run: usize) -> Result<Fetched> {
        {
            let mut p = self.shared.progress();
            p.1 = p.1.max(run);
        }
        self.shared.wake.notify_all();
        let got = match self.results.recv() {
            Ok((_, got)) => got,
            Err(_) => Err(Error::Invalid("the read-ahead threads stopped".into())),
        };
        self.shared.progress().3 = true;
        self.shared.wake.notify_all();
        got
    }
}

/// Starts `settings.read_ahead` threads, each with its own connections, fetching the
/// runs in order from the shared progress on (those marked in `done` skipped), no
/// further than `read_ahead` past the furthest the reader has asked for.
pub(super) fn fetch_ahead(
    catalog: Arc<Catalog>,
    runs: Arc<Vec<Run>>,
    settings: &ReadSettings,
    shared: &Arc<Shared>,
    tx: mpsc::Sender<(usize, Result<Fetched>)>,
    done: Arc<Vec<bool>>,
) {
    let ahead = settings.read_ahead;
    for _ in 0..ahead {
        let (catalog, runs, settings, shared, tx, done) = (
            catalog.clone(),
            runs.clone(),
            settings.clone(),
            shared.clone(),
            tx.clone(),
            done.clone(),
        );
        std::thread::spawn(move || {
            let mut clients = settings.clients();
            loop {
                let i = {
                    let mut p = shared.progress();
                    loop {
                        let (next, wanted, stop, started) = *p;
                        if stop || next >= runs.len() {
                            return;
                        }
                        if done.get(next).copied().unwrap_or(false) {
                            p.0 += 1;
                        } else if next == 0 || (started && next <= wanted + ahead) {
                            p.0 += 1;
                            break next;
                        } else {
                            p = shared.wake.wait(p).unwrap_or_else(|p| p.into_inner());
                        }
                    }
                };
                let got = fetch(&catalog, &runs[i], &mut clients, settings.local, false);
                if tx.send((i, got.map(|(samples, _)| samples))).is_err() {
                    return;
                }
            }
        });
    }
}

impl Iterator for PlannedRead {
    type Item = Result<Delivered>;

    fn next(&mut self) -> Option<Result<Delivered>> {
        if self.failed || self.next_slot >= self.slots {
            return None;
        }
        let slot = self.next_slot;
        let run = self.run_of_slot[slot] as usize;
        while !self.ready.contains_key(&slot) {
            let got = if self.here.is_some() {
                self.fetch_here(run)
            } else {
                self.fetched_ahead(run)
            };
            if let Err(e) = self.take(got) {
                self.failed = true;
                return Some(Err(e));
            }
        }
        self.next_slot += 1;
        self.ready.remove(&slot).map(Ok)
    }
}

impl Drop for PlannedRead {
    fn drop(&mut self) {
        self.shared.progress().2 = true;
        self.shared.wake.notify_all();
    }
}
