//! Background jobs: prefetch (`POST /_granary/prefetch`), their progress
//! (`GET /_granary/jobs/{id}`) and cancellation (`DELETE`).
//!
//! A prefetch lists a bucket/prefix on the node that took it (the coordinator), splits the
//! keys by owner, and hands every other member its share as a part job; each owner reads
//! its own keys through its cache, a bounded number at a time, and the coordinator sums
//! the parts' progress. A member that does not take its part, or is lost during it, has
//! its share read by the coordinator instead (the next owner while it is down). A key
//! already cached costs no read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use futures::StreamExt;
use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::api::{s3, AppState};
use crate::backend::ListQuery;
use crate::cluster::peer::object_path;
use crate::error::{S3Code, S3Error};

/// Objects one node reads at a time for a prefetch.
pub const PREFETCH_PARALLEL: usize = 8;
/// How often the coordinator asks members for their parts' progress.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// Finished jobs are kept this long for their progress to be read.
const KEEP_FINISHED: Duration = Duration::from_secs(3600);
/// The most jobs kept (finished ones beyond it are forgotten first).
const MAX_JOBS: usize = 1000;

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
struct Counts {
    #[serde(default)]
    objects_done: u64,
    #[serde(default)]
    bytes_done: u64,
    #[serde(default)]
    errors: u64,
    #[serde(default)]
    skipped: u64,
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
    /// Parts on other members: (member index, part id, last progress heard).
    parts: Mutex<Vec<(usize, String, Counts)>>,
    message: Mutex<Option<String>>,
    started: Instant,
    finished: Mutex<Option<Instant>>,
}

impl Job {
    fn new(kind: &'static str, bucket: &str, prefix: &str, part_of: Option<String>) -> Job {
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

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    fn finish(&self, state: JobState) {
        // Cancelled stays cancelled.
        let _ = self.state.compare_exchange(
            JobState::Running as u8,
            state as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        *self.finished.lock().expect("job lock") = Some(Instant::now());
    }

    fn fail(&self, why: String) {
        tracing::warn!(job = %self.id, reason = %why, "job failed");
        *self.message.lock().expect("job lock") = Some(why);
        self.finish(JobState::Failed);
    }

    /// The job's progress, this node's share and its parts' together.
    pub fn to_json(&self) -> serde_json::Value {
        let mut c = Counts {
            objects_done: self.objects_done.load(Ordering::Relaxed),
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
        };
        let parts = self.parts.lock().expect("job lock");
        for (_, _, p) in parts.iter() {
            c.objects_done += p.objects_done;
            c.bytes_done += p.bytes_done;
            c.errors += p.errors;
            c.skipped += p.skipped;
        }
        let elapsed = self
            .finished
            .lock()
            .expect("job lock")
            .unwrap_or_else(Instant::now)
            .duration_since(self.started);
        json!({
            "id": self.id,
            "kind": self.kind,
            "state": self.state().as_str(),
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
            "message": *self.message.lock().expect("job lock"),
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
    pub fn get(&self, id: &str) -> Option<Arc<Job>> {
        self.map.lock().expect("jobs lock").get(id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Job>> {
        let mut v: Vec<_> = self
            .map
            .lock()
            .expect("jobs lock")
            .values()
            .cloned()
            .collect();
        v.sort_by_key(|j| j.started);
        v
    }

    fn insert(&self, job: Arc<Job>) {
        let mut map = self.map.lock().expect("jobs lock");
        let now = Instant::now();
        map.retain(|_, j| {
            j.finished
                .lock()
                .expect("job lock")
                .is_none_or(|t| now.duration_since(t) < KEEP_FINISHED)
        });
        if map.len() >= MAX_JOBS {
            let mut done: Vec<(Instant, String)> = map
                .values()
                .filter_map(|j| (*j.finished.lock().expect("job lock")).map(|t| (t, j.id.clone())))
                .collect();
            done.sort();
            for (_, id) in done.iter().take(map.len() + 1 - MAX_JOBS) {
                map.remove(id);
            }
        }
        map.insert(job.id.clone(), job);
    }
}

/// What `POST /_granary/prefetch` takes: a bucket and prefix from a user, or (from the
/// coordinator) the objects of one member's part.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefetchRequest {
    pub bucket: String,
    #[serde(default)]
    pub prefix: String,
    #[serde(default)]
    pub objects: Option<Vec<Obj>>,
    #[serde(default)]
    pub part_of: Option<String>,
}

/// Starts a prefetch; answers once the bucket is known to exist.
pub async fn start_prefetch(
    state: &Arc<AppState>,
    req: PrefetchRequest,
) -> Result<Arc<Job>, S3Error> {
    if req.bucket.is_empty() {
        return Err(S3Error::new(S3Code::InvalidArgument, "name a bucket"));
    }
    if let Some(objects) = req.objects {
        // A part handed over by the coordinator: read these keys here.
        let job = Arc::new(Job::new("prefetch", &req.bucket, &req.prefix, req.part_of));
        job.objects_total
            .store(objects.len() as u64, Ordering::Relaxed);
        job.bytes_total
            .store(objects.iter().map(|o| o.size).sum(), Ordering::Relaxed);
        state.jobs.insert(job.clone());
        let (st, j) = (state.clone(), job.clone());
        tokio::spawn(async move {
            read_here(&st, &j, objects).await;
            j.finish(done_state(&j));
        });
        return Ok(job);
    }
    state.backend.head_bucket(&req.bucket).await?;
    let job = Arc::new(Job::new("prefetch", &req.bucket, &req.prefix, None));
    state.jobs.insert(job.clone());
    let (st, j) = (state.clone(), job.clone());
    tokio::spawn(async move { coordinate(st, j).await });
    Ok(job)
}

fn done_state(job: &Job) -> JobState {
    if job.errors.load(Ordering::Relaxed) > 0 {
        JobState::Failed
    } else {
        JobState::Done
    }
}

/// The coordinator's side: list, split by owner, hand out parts, read its own share,
/// follow the parts to their end.
async fn coordinate(state: Arc<AppState>, job: Arc<Job>) {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        if job.is_cancelled() {
            return;
        }
        let q = ListQuery {
            prefix: job.prefix.clone(),
            delimiter: None,
            after: after.clone(),
            max_keys: 1000,
        };
        let page = match state.backend.list_objects(&job.bucket, &q).await {
            Ok(p) => p,
            Err(e) => return job.fail(format!("listing failed: {}", S3Error::from(e).message)),
        };
        for o in page.objects {
            job.objects_total.fetch_add(1, Ordering::Relaxed);
            job.bytes_total.fetch_add(o.size, Ordering::Relaxed);
            all.push(Obj {
                key: o.key,
                size: o.size,
            });
        }
        if !page.is_truncated || page.last.is_none() {
            break;
        }
        after = page.last;
    }
    let c = &state.cluster;
    let mut shares: Vec<Vec<Obj>> = vec![Vec::new(); c.members().len()];
    for o in all {
        let owner = c.owner(&job.bucket, &o.key);
        shares[owner].push(o);
    }
    let mine = std::mem::take(&mut shares[c.me()]);
    let mut followers = Vec::new();
    for (i, share) in shares.into_iter().enumerate() {
        if share.is_empty() {
            continue;
        }
        let (st, j) = (state.clone(), job.clone());
        followers.push(tokio::spawn(
            async move { hand_over(&st, &j, i, share).await },
        ));
    }
    read_here(&state, &job, mine).await;
    for f in followers {
        if let Ok(Some(left)) = f.await {
            // The member could not do its part: read it here.
            read_here(&state, &job, left).await;
        }
    }
    job.finish(done_state(&job));
}

/// Gives member `i` its share and follows it to the end. Returns the share back when
/// the member did not take it or was lost on the way.
async fn hand_over(state: &AppState, job: &Job, i: usize, share: Vec<Obj>) -> Option<Vec<Obj>> {
    let c = &state.cluster;
    let body = json!({
        "bucket": job.bucket,
        "prefix": job.prefix,
        "objects": share,
        "part_of": job.id,
    })
    .to_string();
    let asked = c
        .ask(
            i,
            Method::POST,
            "/_granary/prefetch",
            Body::from(body),
            Duration::from_secs(10),
        )
        .await;
    let part_id = match asked {
        Ok(resp) if resp.status() == StatusCode::ACCEPTED => {
            let v: Option<serde_json::Value> = axum::body::to_bytes(resp.into_body(), 64 << 10)
                .await
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            v.and_then(|v| v["id"].as_str().map(str::to_owned))
        }
        Ok(resp) => {
            tracing::warn!(job = %job.id, node = %c.member(i).id, status = %resp.status(), "member refused a prefetch part");
            None
        }
        Err(why) => {
            c.mark_down(i, &why);
            None
        }
    };
    let Some(part_id) = part_id else {
        return Some(share);
    };
    let slot = {
        let mut parts = job.parts.lock().expect("job lock");
        parts.push((i, part_id.clone(), Counts::default()));
        parts.len() - 1
    };
    let path = format!("/_granary/jobs/{part_id}");
    let mut misses = 0;
    loop {
        tokio::time::sleep(POLL_EVERY).await;
        if job.is_cancelled() {
            let _ = c
                .ask(
                    i,
                    Method::DELETE,
                    &path,
                    Body::empty(),
                    Duration::from_secs(2),
                )
                .await;
            return None;
        }
        let heard = match c
            .ask(i, Method::GET, &path, Body::empty(), Duration::from_secs(2))
            .await
        {
            Ok(resp) if resp.status() == StatusCode::OK => {
                axum::body::to_bytes(resp.into_body(), 64 << 10)
                    .await
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            }
            _ => None,
        };
        let Some(v) = heard else {
            misses += 1;
            if misses >= 3 {
                tracing::warn!(job = %job.id, node = %c.member(i).id, "lost a prefetch part; reading it here");
                job.parts.lock().expect("job lock")[slot].2 = Counts::default();
                return Some(share);
            }
            continue;
        };
        misses = 0;
        if let Ok(counts) = serde_json::from_value::<Counts>(v.clone()) {
            job.parts.lock().expect("job lock")[slot].2 = counts;
        }
        if v["state"].as_str() != Some("running") {
            return None;
        }
    }
}

/// Reads `objects` through this node's cache, `PREFETCH_PARALLEL` at a time.
async fn read_here(state: &AppState, job: &Job, objects: Vec<Obj>) {
    futures::stream::iter(objects)
        .for_each_concurrent(PREFETCH_PARALLEL, |o| async move {
            if job.is_cancelled() {
                return;
            }
            match warm(state, &job.bucket, &o.key).await {
                Ok(Some(n)) => {
                    job.objects_done.fetch_add(1, Ordering::Relaxed);
                    job.bytes_done.fetch_add(n, Ordering::Relaxed);
                }
                Ok(None) => {
                    job.skipped.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(job = %job.id, key = %o.key, error = %e.message, "prefetch read failed");
                    job.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .await;
}

/// Brings one object into this node's cache: its size once it is there, `None` when the
/// cluster has no room left for it (never-evict: the rest are served through).
async fn warm(state: &AppState, bucket: &str, key: &str) -> Result<Option<u64>, S3Error> {
    if let Some(size) = state.cache.holds(bucket, key) {
        return Ok(Some(size));
    }
    if state.cache.refusing() && !state.cluster.can_spill(&[]) {
        return Ok(None);
    }
    let resp = s3::read_local(state, &object_path(bucket, key)).await?;
    let mut body = resp.into_body().into_data_stream();
    let mut n = 0u64;
    while let Some(chunk) = body.next().await {
        n += chunk
            .map_err(|e| S3Error::internal(format!("read cut short: {e}")))?
            .len() as u64;
    }
    Ok(Some(n))
}

/// Cancels a job (and its parts, through the coordinator's follower).
pub fn cancel(job: &Job) {
    job.cancelled.store(true, Ordering::Release);
    if job.state() == JobState::Running {
        job.state
            .store(JobState::Cancelled as u8, Ordering::Release);
        *job.finished.lock().expect("job lock") = Some(Instant::now());
    }
}
