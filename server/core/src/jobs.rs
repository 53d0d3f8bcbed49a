//! Background jobs and their progress (`GET /_granary/jobs/{id}`): the registry of a
//! node's jobs, each job's counters and state, and cancellation (`DELETE`). What a job
//! does is its owner's: a prefetch is run by the node service (`node::prefetch`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sync::Locked;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Finished jobs are kept this long for their progress to be read.
const KEEP_FINISHED: Duration = Duration::from_secs(3600);
/// The most jobs kept (finished ones beyond it are forgotten first).
const MAX_JOBS: usize = 1000;
/// The most prefetches a node coordinates at once; a client asking for more is told to
/// slow down (each one lists its prefix and keeps every member reading).
pub const MAX_RUNNING_PREFETCHES: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum JobState {
    Running = 0,
    Done = 1,
    Failed = 2,
    Cancelled = 3,
}

impl JobState {
    fn from_u8(v: u8) -> JobState {
        match v {
            1 => JobState::Done,
            2 => JobState::Failed,
            3 => JobState::Cancelled,
            _ => JobState::Running,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
}

/// An object a prefetch reads.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Obj {
    pub key: String,
    pub size: u64,
}

/// Progress as a member reports it for its part.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct Counts {
    #[serde(default)]
    pub objects_done: u64,
    #[serde(default)]
    pub bytes_done: u64,
    #[serde(default)]
    pub errors: u64,
    #[serde(default)]
    pub skipped: u64,
}

/// One job: its description, counters and state.
pub struct Job {
    pub id: String,
    pub kind: &'static str,
    pub bucket: String,
    pub prefix: String,
    /// The coordinator's job id, for a part run on behalf of another node.
    pub part_of: Option<String>,
    state: AtomicU8,
    cancelled: AtomicBool,
    objects_total: AtomicU64,
    bytes_total: AtomicU64,
    objects_done: AtomicU64,
    bytes_done: AtomicU64,
    errors: AtomicU64,
    skipped: AtomicU64,
    /// Parts on other members: (member id, part id, last progress heard).
    parts: Mutex<Vec<(String, String, Counts)>>,
    message: Mutex<Option<String>>,
    started: Instant,
    finished: Mutex<Option<Instant>>,
}

impl Job {
    pub fn new(kind: &'static str, bucket: &str, prefix: &str, part_of: Option<String>) -> Job {
        Job {
            id: uuid::Uuid::new_v4().simple().to_string(),
            kind,
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
            part_of,
            state: AtomicU8::new(JobState::Running as u8),
            cancelled: AtomicBool::new(false),
            objects_total: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
            objects_done: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            parts: Mutex::new(Vec::new()),
            message: Mutex::new(None),
            started: Instant::now(),
            finished: Mutex::new(None),
        }
    }

    pub fn state(&self) -> JobState {
        JobState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Objects and bytes done here (parts on other members aside), and the totals.
    pub fn progress(&self) -> [u64; 4] {
        [
            self.objects_done.load(Ordering::Relaxed),
            self.objects_total.load(Ordering::Relaxed),
            self.bytes_done.load(Ordering::Relaxed),
            self.bytes_total.load(Ordering::Relaxed),
        ]
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    pub fn finish(&self, state: JobState) {
        // Cancelled stays cancelled.
        let _ = self.state.compare_exchange(
            JobState::Running as u8,
            state as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        *self.finished.locked() = Some(Instant::now());
    }

    pub fn fail(&self, why: String) {
        tracing::warn!(job = %self.id, reason = %why, "job failed");
        *self.message.locked() = Some(why);
        self.finish(JobState::Failed);
    }

    /// Done, or failed when any object failed.
    pub fn finish_counted(&self) {
        self.finish(if self.errors.load(Ordering::Relaxed) > 0 {
            JobState::Failed
        } else {
            JobState::Done
        });
    }

    /// Adds objects to the job's total.
    pub fn add_total(&self, objects: u64, bytes: u64) {
        self.objects_total.fetch_add(objects, Ordering::Relaxed);
        self.bytes_total.fetch_add(bytes, Ordering::Relaxed);
    }

    /// One object done, of `bytes` bytes.
    pub fn done_one(&self, bytes: u64) {
        self.objects_done.fetch_add(1, Ordering::Relaxed);
        self.bytes_done.fetch_add(bytes, Ordering::Relaxed);
    }

    /// One object left out (no room for it anywhere).
    pub fn skipped_one(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    /// One object failed.
    pub fn failed_one(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A part handed to member `member` as its job `id`; its slot for progress.
    pub fn add_part(&self, member: String, id: String) -> usize {
        let mut parts = self.parts.locked();
        parts.push((member, id, Counts::default()));
        parts.len() - 1
    }

    /// A part's progress as last heard.
    pub fn set_part(&self, slot: usize, counts: Counts) {
        self.parts.locked()[slot].2 = counts;
    }

    /// The job's progress, this node's share and its parts' together.
    pub fn to_json(&self) -> serde_json::Value {
        // The state first: a job seen ended has every count it ended with (the counts
        // are all made before `finish`, whose store this load acquires).
        let state = self.state();
        let mut c = Counts {
            objects_done: self.objects_done.load(Ordering::Relaxed),
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
        };
        let parts = self.parts.locked();
        for (_, _, p) in parts.iter() {
            c.objects_done += p.objects_done;
            c.bytes_done += p.bytes_done;
            c.errors += p.errors;
            c.skipped += p.skipped;
        }
        let elapsed = self
            .finished
            .locked()
            .unwrap_or_else(Instant::now)
            .duration_since(self.started);
        json!({
            "id": self.id,
            "kind": self.kind,
            "state": state.as_str(),
            "bucket": self.bucket,
            "prefix": self.prefix,
            "objects_done": c.objects_done,
            "objects_total": self.objects_total.load(Ordering::Relaxed),
            "bytes_done": c.bytes_done,
            "bytes_total": self.bytes_total.load(Ordering::Relaxed),
            "errors": c.errors,
            "skipped": c.skipped,
            "nodes": parts.len() + 1,
            "part_of": self.part_of,
            "message": *self.message.locked(),
            "elapsed_seconds": elapsed.as_secs_f64(),
        })
    }
}

/// This node's jobs by id.
#[derive(Default)]
pub struct Jobs {
    map: Mutex<HashMap<String, Arc<Job>>>,
}

impl Jobs {
    /// Jobs of `kind` this node runs for its clients (not parts run for another node)
    /// that have not ended.
    pub fn running(&self, kind: &str) -> usize {
        self.map
            .locked()
            .values()
            .filter(|j| j.kind == kind && j.part_of.is_none() && j.state() == JobState::Running)
            .count()
    }

    pub fn get(&self, id: &str) -> Option<Arc<Job>> {
        self.map.locked().get(id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Job>> {
        let mut v: Vec<_> = self.map.locked().values().cloned().collect();
        v.sort_by_key(|j| j.started);
        v
    }

    pub fn insert(&self, job: Arc<Job>) {
        let mut map = self.map.locked();
        let now = Instant::now();
        map.retain(|_, j| {
            j.finished
                .locked()
                .is_none_or(|t| now.duration_since(t) < KEEP_FINISHED)
        });
        if map.len() >= MAX_JOBS {
            let mut done: Vec<(Instant, String)> = map
                .values()
                .filter_map(|j| (*j.finished.locked()).map(|t| (t, j.id.clone())))
                .collect();
            done.sort();
            for (_, id) in done.iter().take(map.len() + 1 - MAX_JOBS) {
                map.remove(id);
            }
        }
        map.insert(job.id.clone(), job);
    }
}

/// Cancels a job (and its parts, through the coordinator's follower).
pub fn cancel(job: &Job) {
    job.cancelled.store(true, Ordering::Release);
    if job.state() == JobState::Running {
        job.state
            .store(JobState::Cancelled as u8, Ordering::Release);
        *job.finished.locked() = Some(Instant::now());
    }
}
