//! Reading a planned epoch: the samples one rank (or one of its DataLoader workers) takes,
//! in the plan's order, fetched as runs.
//!
//! The entries are read in span order (front to back through the rank's shards), in
//! runs: consecutive samples of one shard, fetched with one range read of the listed
//! version (`If-Match`), gaps of other workers' samples read through when they are small
//! against the run ([`GAP`]).
//! A compressed shard is read whole. Each run goes to its shard's owner, then to the
//! next members in the ring's order when the owner cannot be reached, as
//! [`super::route`] routes it. `read_ahead` runs are fetched ahead by
//! as many threads, each with its own connections; the shuffle buffer's order is then
//! served from the runs fetched, which is why the buffer costs memory, not requests.

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::catalog::{Catalog, ShardInfo};
use super::plan::{epoch_list, rank_plan, PlanRound, PlanShard, PlanSpec, Round, SampleId, Split};
use super::route::{on_best, Clients, Router};
use super::samples::ShardSamples;
use crate::{Credentials, Error, GetOptions, Result, Sample};

/// Bytes of other workers' samples a run reads through rather than starting another:
/// up to this much, or up to a quarter of the run's bytes so far. A run read through a
/// node that serves it straight from the backend (a shard its cache does not hold)
/// costs the backend every byte it spans, so a gap as large as the samples around it
/// (two DataLoader workers taking batches in turn) is two requests, not one.
const GAP: u64 = 64 << 10;
/// Largest run read with one request.
const MAX_RUN: u64 = 16 << 20;

/// How a planned epoch is read.
#[derive(Debug, Clone)]
pub struct ReadSettings {
    pub router: Router,
    pub credentials: Option<Credentials>,
    pub timeout: Duration,
    /// Runs fetched ahead, by as many threads (0: each run fetched when it is needed).
    pub read_ahead: usize,
    /// Whether runs copied out of the cache file of a node on this machine are fetched
    /// ahead too. Off for a reader that is one of several processes sharing the cores
    /// (a DataLoader worker): it copies each such run when it needs it, and starts its
    /// read-ahead threads only once a run waits on more than a copy.
    pub ahead_here: bool,
    /// How shards of a node on this machine are read.
    pub local: LocalReads,
    /// Register the epoch's plan with the cluster, so that its nodes fetch each shard
    /// ahead of its first read, and mark each read with where the rank stands.
    pub plan: bool,
    /// Samples prepared by this pipeline on the shards' owners, for the epoch's seed
    /// and epoch: each run's members arrive prepared (through the socket, never out
    /// of a cache file).
    pub pipeline: Option<String>,
}

/// How a planned epoch reads the shards of a node it reaches over the node's Unix socket
/// (a `unix:` endpoint, or the socket the node offered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalReads {
    /// As any client: the bytes come through the socket.
    Off,
    /// Each run copied out of the node's cache file where it is resident there: bytes,
    /// as with `Off`, with no copy through the socket. A fetching thread copies the run
    /// whole ([`Client::get_resident`](crate::Client::get_resident)); a reader fetching
    /// its own runs keeps each mapped and copies every member once, as its sample is
    /// delivered ([`Delivered::Resident`]).
    Copied,
    /// Each run's samples delivered as ranges of the node's cache file
    /// ([`Delivered::Mapped`]); bytes where the node sends bytes.
    Mapped,
}

impl ReadSettings {
    /// Connections for one fetching thread.
    fn clients(&self) -> Clients {
        Clients::new(self.router.clone(), self.credentials.clone(), self.timeout)
    }
}

/// One range read: samples `first..=last` of a shard, of which `take` (sample index,
/// slot in the output) are wanted.
#[derive(Debug, Clone)]
struct Run {
    shard: u32,
    first: u32,
    last: u32,
    take: Vec<(u32, usize)>,
    /// Its `x-granary-plan`, in a planned epoch.
    mark: Option<String>,
    /// The pipeline its members are prepared by, for the epoch's seed and epoch.
    pipeline: Option<Arc<crate::Pipelined>>,
}

impl Run {
    /// The bytes of `shard` (its own) the run reads by range; `None` for a shard read
    /// from its start.
    fn range(&self, shard: &ShardInfo) -> Option<std::ops::Range<u64>> {
        shard
            .ranged()
            .then(|| shard.span(self.first).start..shard.span(self.last).end)
    }
}

/// Splits the wanted samples, given in span order with their output slots, into runs.
fn runs_of(catalog: &Catalog, wanted: &[(SampleId, usize)]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for &(id, slot) in wanted {
        let shard = &catalog.shards[id.shard as usize];
        let joins = runs.last().is_some_and(|r| {
            if r.shard != id.shard || id.index <= r.last {
                return false;
            }
            // A shard read from its start is read once, whole.
            if !shard.ranged() {
                return true;
            }
            let (prev_end, start) = (shard.span(r.last).end, shard.span(id.index).start);
            let run_start = shard.span(r.first).start;
            let gap = start - prev_end;
            (gap <= GAP || gap <= (prev_end - run_start) / 4)
                && shard.span(id.index).end - run_start <= MAX_RUN
        });
        match runs.last_mut() {
            Some(r) if joins => {
                r.last = id.index;
                r.take.push((id.index, slot));
            }
            _ => runs.push(Run {
                shard: id.shard,
                first: id.index,
                last: id.index,
                take: vec![(id.index, slot)],
                mark: None,
                pipeline: None,
            }),
        }
    }
    runs
}

/// A sample as it is delivered: its bytes, ranges of the run's bytes read whole, or
/// where they lie in the node's cache file on this machine (a local read: the bytes are
/// mapped, never copied).
#[derive(Debug)]
pub enum Delivered {
    Owned(Sample),
    Buffered(BufferedSample),
    Mapped(MappedSample),
    Resident(ResidentSample),
}

/// A sample whose members are ranges of its run's bytes, received whole into one buffer
/// (no copy between the socket and it): a caller copies each member out once, into
/// what it hands on.
#[derive(Debug, Clone)]
pub struct BufferedSample {
    /// The members' common name up to the first `.` of the file name.
    pub key: String,
    /// The object key of the shard it came from.
    pub shard: String,
    /// The run's bytes.
    pub run: Arc<Vec<u8>>,
    /// Extension and range in `run`; in archive order.
    pub fields: Vec<(String, std::ops::Range<usize>)>,
}

impl BufferedSample {
    /// The sample with its members copied out.
    pub fn into_sample(self) -> Sample {
        let fields = self
            .fields
            .into_iter()
            .map(|(ext, r)| (ext, self.run[r].to_vec()))
            .collect();
        Sample {
            key: self.key,
            shard: self.shard,
            fields,
        }
    }
}

/// A sample whose members are ranges of a run mapped from the cache file of a node on
/// this machine, every page of it in the page cache when it was read (the node checked
/// them just before): each member is copied out once, by
/// [`PlannedRead::copy_member`], straight from the cache into what the caller hands on.
#[derive(Debug, Clone)]
pub struct ResidentSample {
    /// The members' common name up to the first `.` of the file name.
    pub key: String,
    /// The object key of the shard it came from.
    pub shard: String,
    run: Arc<ResidentRun>,
    /// Extension and range of the run's bytes; in archive order.
    pub fields: Vec<(String, std::ops::Range<usize>)>,
}

/// A run's bytes mapped, and where they lie in their shard (to ask the node for a member
/// whose pages left memory).
#[derive(Debug)]
struct ResidentRun {
    map: crate::Mapping,
    shard: u32,
    start: u64,
}

/// A sample whose members are ranges of a node's cache file.
#[derive(Debug, Clone)]
pub struct MappedSample {
    /// The members' common name up to the first `.` of the file name.
    pub key: String,
    /// The object key of the shard it came from.
    pub shard: String,
    /// The file the node passed for the run the sample was read in.
    pub file: Arc<RunFile>,
    /// Extension, offset in the file, length; in archive order.
    pub fields: Vec<(String, u64, u64)>,
}

/// A node's cache file, passed for one run: read-only, open while a sample needs it.
#[derive(Debug)]
pub struct RunFile {
    pub file: std::fs::File,
    /// Where the run's bytes start in the file, and how many there are.
    pub offset: u64,
    pub len: u64,
}

/// Takes a run's wanted samples (with their slots) out of `samples`, which are the
/// shard's from sample `first` on.
fn pick<T>(
    samples: impl Iterator<Item = Result<T>>,
    first: u32,
    run: &Run,
    shard: &str,
) -> Result<Vec<(usize, T)>> {
    let mut take = run.take.iter().peekable();
    let mut out = Vec::with_capacity(run.take.len());
    for (index, sample) in (first..).zip(samples) {
        let sample = sample?;
        // Each sample is wanted once at most in a run (indexes rise strictly).
        if let Some(&&(i, slot)) = take.peek() {
            if i == index {
                out.push((slot, sample));
                take.next();
            }
        }
        if take.peek().is_none() {
            return Ok(out);
        }
    }
    Err(Error::Shard {
        shard: shard.to_owned(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the shard holds fewer samples than it was listed with",
        ),
    })
}

/// Bytes in memory, read by a tar reader that jumps over what it does not hand out.
struct InMemory<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Read for InMemory<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn jump(r: &mut InMemory<'_>, n: u64) -> std::io::Result<u64> {
    let k = (n.min((r.buf.len() - r.pos) as u64)) as usize;
    r.pos += k;
    Ok(k as u64)
}

/// A sample's key and its members: extension, where the member's bytes start, their
/// length.
type Members = (String, Vec<(String, u64, u64)>);

/// A run's samples in bytes held whole, in archive order, its headers walked in place.
/// A sample with two members of one extension is an error, as in a streamed shard.
fn samples_in(shard: &str, buf: &[u8]) -> Result<Vec<Members>> {
    let broken = |source| Error::Shard {
        shard: shard.to_owned(),
        source,
    };
    let mut tar = crate::TarReader::with_skipper(InMemory { buf, pos: 0 }, jump);
    let mut out: Vec<Members> = Vec::new();
    while let Some((name, size)) = tar.next_header().map_err(broken)? {
        let at = tar.get_mut().pos as u64;
        if at + size > buf.len() as u64 {
            let cut = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "tar entry cut short");
            return Err(broken(cut));
        }
        let Some((key, ext)) = granary_proto::shards::split_name(&name) else {
            continue;
        };
        match out.last_mut() {
            Some((k, fields)) if k == key => {
                if fields.iter().any(|(e, _, _)| *e == ext) {
                    let msg = format!("sample {key} has two `.{ext}` members");
                    let twice = std::io::Error::new(std::io::ErrorKind::InvalidData, msg);
                    return Err(broken(twice));
                }
                fields.push((ext, at, size));
            }
            _ => out.push((key.to_owned(), vec![(ext, at, size)])),
        }
    }
    Ok(out)
}

/// The samples of a run the node passed as a file: its headers walked in the mapping,
/// each member a range of the file.
fn mapped_samples(shard: &str, local: crate::LocalFile) -> Result<Vec<Result<MappedSample>>> {
    let map = local.map().map_err(Error::Local)?;
    let samples = samples_in(shard, &map)?;
    drop(map);
    let (offset, len) = (local.offset(), local.len());
    let file = Arc::new(RunFile {
        file: local.into_fd().into(),
        offset,
        len,
    });
    Ok(samples
        .into_iter()
        .map(|(key, fields)| {
            Ok(MappedSample {
                key,
                shard: shard.to_owned(),
                file: file.clone(),
                fields: fields
                    .into_iter()
                    .map(|(ext, at, size)| (ext, offset + at, size))
                    .collect(),
            })
        })
        .collect())
}

/// Members as ranges of the bytes they were walked in.
fn ranges(fields: Vec<(String, u64, u64)>) -> Vec<(String, std::ops::Range<usize>)> {
    fields
        .into_iter()
        .map(|(ext, at, size)| (ext, at as usize..(at + size) as usize))
        .collect()
}

/// The samples of a run received whole: each member a range of its bytes.
fn buffered_samples(shard: &str, run: Vec<u8>) -> Result<Vec<Result<BufferedSample>>> {
    let samples = samples_in(shard, &run)?;
    let run = Arc::new(run);
    Ok(samples
        .into_iter()
        .map(|(key, fields)| {
            Ok(BufferedSample {
                key,
                shard: shard.to_owned(),
                run: run.clone(),
                fields: ranges(fields),
            })
        })
        .collect())
}

/// Fetches one run: the wanted samples with their slots; from a node on this machine, as
/// `local` says. `inline`: the reader fetches it itself, as it needs it (a run copied out
/// of a node's cache file then stays mapped, and each member is copied out as its sample
/// is delivered; a fetching thread copies the run whole, off the reader's thread). The
/// flag: whether the member that served it is on this machine (a first read may go over
/// TCP and learn of the node's socket in its answer).
fn fetch(
    catalog: &Catalog,
    run: &Run,
    clients: &mut Clients,
    local: LocalReads,
    inline: bool,
) -> Result<(Fetched, bool)> {
    let shard = &catalog.shards[run.shard as usize];
    let opts = GetOptions {
        range: run.range(shard),
        if_match: Some(shard.etag.clone()).filter(|e| !e.is_empty()),
        plan: run.mark.clone(),
        pipeline: run.pipeline.as_deref().cloned(),
        ..GetOptions::default()
    };
    on_best(clients, &catalog.bucket, &shard.key, |c| {
        let got = fetch_from(c, catalog, run, &opts, local, inline)?;
        Ok((got, c.reads_locally()))
    })
}

/// Fetches one run from the member `c` reaches (see [`fetch`]), as `opts` ask.
fn fetch_from(
    c: &mut crate::Client,
    catalog: &Catalog,
    run: &Run,
    opts: &GetOptions,
    local: LocalReads,
    inline: bool,
) -> Result<Fetched> {
    let shard = &catalog.shards[run.shard as usize];
    let ranged = opts.range.is_some();
    // The sample the bytes start at: the run's first, or the shard's.
    let from = if ranged { run.first } else { 0 };
    let local = match local {
        _ if shard.compressed() || !c.reads_locally() => LocalReads::Off,
        // A shard read from its start (its spans unknown) streams.
        LocalReads::Copied if !ranged => LocalReads::Off,
        other => other,
    };
    let owned = |stream: Box<dyn Read + Send>, first: u32| {
        let samples = ShardSamples::new(shard.key.clone(), stream).map(|s| s.map(Delivered::Owned));
        pick(samples, first, run, &shard.key)
    };
    // Bytes held whole: their headers walked in place, each member a range of them.
    let buffered = |bytes: Vec<u8>| {
        let samples = buffered_samples(&shard.key, bytes)?
            .into_iter()
            .map(|s| s.map(Delivered::Buffered));
        pick(samples, from, run, &shard.key)
    };
    if local == LocalReads::Copied && !inline {
        return buffered(c.get_resident(&catalog.bucket, &shard.key, opts)?);
    }
    if local == LocalReads::Copied {
        let map = match c.open_resident(&catalog.bucket, &shard.key, opts)? {
            crate::LocalBytes::Mapped(map) => map,
            crate::LocalBytes::Fetched(bytes) => return buffered(bytes),
        };
        // Headers walked in the mapping, whose every page is in memory: the node
        // brought them in just before it answered. A header damaged on the disk fails
        // its tar checksum, and a member's copy is checked with the whole blocks it
        // lies in, its header's bytes among them where they share one.
        let samples = samples_in(&shard.key, &map)?;
        let start = opts.range.as_ref().map_or(0, |r| r.start);
        let mapped = Arc::new(ResidentRun {
            map,
            shard: run.shard,
            start,
        });
        let samples = samples.into_iter().map(|(key, fields)| {
            Ok(Delivered::Resident(ResidentSample {
                key,
                shard: shard.key.clone(),
                run: mapped.clone(),
                fields: ranges(fields),
            }))
        });
        return pick(samples, from, run, &shard.key);
    }
    if local == LocalReads::Mapped {
        return match c.open_local(&catalog.bucket, &shard.key, opts)? {
            crate::Local::File(f) => {
                let samples = mapped_samples(&shard.key, f)?
                    .into_iter()
                    .map(|s| s.map(Delivered::Mapped));
                pick(samples, from, run, &shard.key)
            }
            crate::Local::Bytes(bytes, _) => buffered(bytes),
        };
    }
    if ranged && !shard.compressed() {
        // A range (at most `MAX_RUN` and its last sample) received whole, straight
        // from the socket. A connection cut mid-answer is an `Io` error: another
        // member may serve the run. A shard read from its start streams.
        return buffered(c.get_with(&catalog.bucket, &shard.key, opts)?);
    }
    let cut = Arc::new(AtomicBool::new(false));
    let reader = Watched {
        inner: c.open_with(&catalog.bucket, &shard.key, opts)?,
        failed: cut.clone(),
    };
    let got = if shard.compressed() {
        owned(Box::new(flate2::read::MultiGzDecoder::new(reader)), 0)
    } else {
        owned(Box::new(reader), from)
    };
    match got {
        // The connection failed mid-answer (the member stopped): another member may
        // serve the run whole, and nothing of this one was delivered.
        Err(Error::Shard { source, .. }) if cut.load(Ordering::Relaxed) => Err(Error::Io {
            addr: c.endpoint().to_owned(),
            source,
        }),
        other => other,
    }
}

/// A body that notes whether reading it failed, so that a cut connection is told apart
/// from a shard that is not a tar.
struct Watched<R> {
    inner: R,
    failed: Arc<AtomicBool>,
}

impl<R: Read> Read for Watched<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf).inspect_err(|_| {
            self.failed.store(true, Ordering::Relaxed);
        })
    }
}

/// A run's samples, each with its output slot.
type Fetched = Vec<(usize, Delivered)>;

/// The fetching threads' shared state.
struct Shared {
    /// The next run no thread has taken, the furthest run the reader has asked for,
    /// whether reading stops, and whether a run has come in: none is read ahead of the
    /// first, so that the first sample waits on one read, and a cold start brings only
    /// what it needs.
    progress: Mutex<(usize, usize, bool, bool)>,
    wake: Condvar,
}

impl Shared {
    /// The progress, locked (a thread that panicked holding it left it whole).
    fn progress(&self) -> std::sync::MutexGuard<'_, (usize, usize, bool, bool)> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A run read from a node on this machine in longer than this, and [`WAITED_PER_MIB`] for
/// each MiB of it, waited on more than a copy (the node filled it from its backend
/// first): the reader then fetches ahead, as it does where a run comes from another
/// machine. A copy out of the page cache on two busy cores takes 1-2 ms per MiB; a fill
/// from a store at a connection's 100 MB/s, 10.
const WAITED: Duration = Duration::from_millis(10);
const WAITED_PER_MIB: Duration = Duration::from_millis(4);

/// Runs fetched by the reader itself, as each is needed.
struct Here {
    runs: Arc<Vec<Run>>,
    clients: Clients,
    /// Which runs have been fetched, and whether any has.
    fetched: Vec<bool>,
    any: bool,
    /// Where the fetching threads, once started, send what they fetch.
    tx: mpsc::Sender<(usize, Result<Fetched>)>,
}

/// Samples of a planned epoch in output order (an iterator).
pub struct PlannedRead {
    slots: usize,
    next_slot: usize,
    run_of_slot: Vec<u32>,
    ready: HashMap<usize, Delivered>,
    results: Receiver<(usize, Result<Fetched>)>,
    shared: Arc<Shared>,
    /// Until the fetching threads start (without read-ahead, never): the runs and how
    /// they are fetched here.
    here: Option<Here>,
    failed: bool,
    catalog: Arc<Catalog>,
    settings: ReadSettings,
    /// Connections for members whose pages left memory before they were copied out.
    spare: Option<Clients>,
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
    fn start_marked(
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

    fn take(&mut self, got: Result<Fetched>) -> Result<()> {
        for (slot, sample) in got? {
            self.ready.insert(slot, sample);
        }
        Ok(())
    }

    /// Fetches run `run` here; starts the fetching threads after it where it waited on
    /// more than a copy and read-ahead is asked for.
    fn fetch_here(&mut self, run: usize) -> Result<Fetched> {
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
    fn fetched_ahead(&mut self, run: usize) -> Result<Fetched> {
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
fn fetch_ahead(
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

/// Which part of which epoch to read: the dataset's order settings, the resume history,
/// this round's split, and the reader's place in it.
#[derive(Debug, Clone)]
pub struct EpochSpec {
    pub seed: u64,
    pub epoch: u64,
    pub shuffle_shards: bool,
    pub rounds: Vec<Round>,
    pub split: Split,
    pub rank: usize,
    /// This DataLoader worker and how many there are (0 of 1 without workers).
    pub worker: usize,
    pub workers: usize,
    /// The DataLoader's batch size: workers take whole batches in turn.
    pub batch_size: usize,
}

/// The samples `spec`'s rank and worker take in its epoch, in the order they yield them.
pub fn plan_epoch(catalog: &Catalog, spec: &EpochSpec) -> Result<Vec<(SampleId, u32)>> {
    if spec.workers == 0 || spec.worker >= spec.workers {
        return Err(Error::Invalid(format!(
            "worker {} of {}",
            spec.worker, spec.workers
        )));
    }
    let list = epoch_list(
        &catalog.counts(),
        spec.seed,
        spec.epoch,
        spec.shuffle_shards,
    );
    let plan = rank_plan(
        list,
        &spec.rounds,
        &spec.split,
        spec.rank,
        spec.seed,
        spec.epoch,
    )
    .map_err(|e| Error::Invalid(e.to_string()))?;
    Ok(plan
        .worker_entries(spec.worker, spec.workers, spec.batch_size)
        .into_iter()
        .map(|e| (plan.order[e], plan.span_pos[e]))
        .collect())
}

/// Starts reading `spec`'s samples.
pub fn read_epoch(
    catalog: Arc<Catalog>,
    spec: &EpochSpec,
    mut settings: ReadSettings,
) -> Result<PlannedRead> {
    // Prepared members come through the socket: a node's cache file holds the source.
    let pipeline = settings.pipeline.clone().map(|name| {
        settings.local = LocalReads::Off;
        Arc::new(crate::Pipelined {
            name,
            seed: spec.seed,
            epoch: spec.epoch,
        })
    });
    let entries = plan_epoch(&catalog, spec)?;
    let slots = entries.len();
    let mut wanted: Vec<(u32, SampleId, usize)> = entries
        .into_iter()
        .enumerate()
        .map(|(slot, (id, place))| (place, id, slot))
        .collect();
    wanted.sort_unstable_by_key(|w| w.0);
    let mark = if settings.plan {
        register(&catalog, spec, &settings).map(|id| {
            let mut places = vec![0u32; slots];
            for &(place, _, slot) in &wanted {
                places[slot] = place;
            }
            (format!("{id}:{}:{}:", spec.epoch, spec.rank), places)
        })
    } else {
        None
    };
    let wanted: Vec<(SampleId, usize)> = wanted.into_iter().map(|(_, id, s)| (id, s)).collect();
    Ok(PlannedRead::start_marked(
        catalog, &wanted, slots, settings, mark, pipeline,
    ))
}

/// The plan of `spec`'s epoch, as the cluster takes it.
pub fn plan_spec(catalog: &Catalog, spec: &EpochSpec) -> PlanSpec {
    PlanSpec {
        bucket: catalog.bucket.clone(),
        prefix: catalog.prefix.clone(),
        shards: catalog
            .shards
            .iter()
            .map(|s| PlanShard {
                key: s.key.clone(),
                etag: s.etag.clone(),
                samples: s.count,
                size: s.size,
            })
            .collect(),
        seed: spec.seed,
        epoch: spec.epoch,
        world_size: spec.split.world_size,
        shuffle_buffer: spec.split.shuffle_buffer,
        shuffle_shards: spec.shuffle_shards,
        drop_last: spec.split.drop_last,
        batch_size: spec.batch_size,
        rounds: spec
            .rounds
            .iter()
            .map(|r| PlanRound {
                world_size: r.split.world_size,
                shuffle_buffer: r.split.shuffle_buffer,
                drop_last: r.split.drop_last,
                consumed: r.consumed,
            })
            .collect(),
        job: None,
        pipeline: None,
    }
}

/// Registers `spec`'s plan with the cluster through the dataset's node: the plan's id,
/// or `None` where it is not taken (a node without plans): the reads are the same.
pub fn register(catalog: &Catalog, spec: &EpochSpec, settings: &ReadSettings) -> Option<String> {
    let plan = PlanSpec {
        pipeline: settings.pipeline.clone(),
        ..plan_spec(catalog, spec)
    };
    let mut c = crate::Client::new(settings.router.endpoint())
        .ok()?
        .with_credentials_opt(settings.credentials.clone())
        .with_timeout(settings.timeout.min(Duration::from_secs(10)));
    c.register_plan(&plan).ok().map(|v| v.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run whose answer is cut mid-way is read whole from the next member: a shard read
    /// from its start (streamed), and a range of a spanned shard (received whole).
    #[test]
    fn a_run_cut_mid_answer_is_read_whole_from_the_next_member() {
        use super::super::catalog::{SampleSpan, ShardInfo};
        use crate::fake::{tar_of, FakeServer, Reply};
        use crate::{ClusterView, Member, MemberState};
        use granary_proto::ring::{key_hash, Ring};
        let tar = tar_of(&[
            ("s/0.bin", &[7u8; 3000]),
            ("s/1.bin", &[8u8; 3000]),
            ("s/2.bin", &[9u8; 3000]),
        ]);
        // Each sample: a header and 3000 bytes padded to 3072.
        let spanned: Vec<SampleSpan> = (0..3u64)
            .map(|i| SampleSpan {
                start: i * 3584,
                end: (i + 1) * 3584,
            })
            .collect();
        for spans in [None, Some(spanned)] {
            let ranged = spans.is_some();
            let body = if ranged {
                tar[..3 * 3584].to_vec()
            } else {
                tar.clone()
            };
            // The owner stops halfway through; the next member serves the run whole.
            let cut = Reply::ok(body[..body.len() / 2].to_vec())
                .with_header("content-length", &body.len().to_string())
                .then_close();
            let owner = FakeServer::start(vec![cut]);
            let next = FakeServer::start(vec![Reply::ok(body.clone())]);
            let order = Ring::uniform(["a", "b"]).ranked(key_hash("bk", "d/s.tar"));
            let urls = if order[0] == 0 {
                [owner.endpoint(), next.endpoint()]
            } else {
                [next.endpoint(), owner.endpoint()]
            };
            let members = ["a", "b"]
                .iter()
                .zip(&urls)
                .map(|(id, url)| Member {
                    id: (*id).into(),
                    url: url.clone(),
                    state: MemberState::Up,
                    weight: 100.0,
                    handover: None,
                })
                .collect();
            let view = ClusterView {
                node_id: "a".into(),
                members,
                owner: None,
            };
            let router = Router::from_view(&next.endpoint(), &view);
            let catalog = Catalog {
                bucket: "bk".into(),
                prefix: "d/".into(),
                shards: vec![ShardInfo {
                    key: "d/s.tar".into(),
                    etag: String::new(),
                    count: 3,
                    spans,
                    size: 0,
                }],
            };
            let run = Run {
                shard: 0,
                first: 0,
                last: 2,
                take: vec![(0, 0), (2, 1)],
                mark: None,
                pipeline: None,
            };
            let mut clients = Clients::new(router, None, Duration::from_secs(5));
            let (got, here) = fetch(&catalog, &run, &mut clients, LocalReads::Off, true).unwrap();
            assert!(!here, "a run read over HTTP is not taken from a file here");
            let got: Vec<(usize, Vec<u8>)> = got
                .into_iter()
                .map(|(slot, d)| match d {
                    Delivered::Buffered(s) if ranged => {
                        (slot, s.into_sample().fields["bin"].clone())
                    }
                    Delivered::Owned(s) if !ranged => (slot, s.fields["bin"].clone()),
                    other => panic!("{other:?} for a run ranged: {ranged}"),
                })
                .collect();
            assert_eq!(got, vec![(0, vec![7u8; 3000]), (1, vec![9u8; 3000])]);
            let asked = owner.finish();
            assert_eq!(asked.len(), 1);
            let range = asked[0].header("range").map(str::to_owned);
            assert_eq!(range, ranged.then(|| format!("bytes=0-{}", 3 * 3584 - 1)));
            assert_eq!(next.finish().len(), 1);
        }
    }

    #[test]
    fn runs_join_near_samples_of_one_shard_and_split_at_gaps_and_limits() {
        use super::super::catalog::{SampleSpan, ShardInfo};
        let spans = |sizes: &[u64]| {
            let mut at = 0;
            sizes
                .iter()
                .map(|&n| {
                    let s = SampleSpan {
                        start: at,
                        end: at + n,
                    };
                    at += n;
                    s
                })
                .collect::<Vec<_>>()
        };
        let shard = |key: &str, sizes: &[u64]| ShardInfo {
            key: key.into(),
            etag: "e".into(),
            count: sizes.len() as u32,
            spans: Some(spans(sizes)),
            size: 0,
        };
        let catalog = Catalog {
            bucket: "bk".into(),
            prefix: String::new(),
            shards: vec![
                shard("a.tar", &[1024; 8]),
                shard(
                    "b.tar",
                    &[300 << 10, 300 << 10, 300 << 10, 10 << 20, 8 << 20],
                ),
                shard("c.tar.gz", &[10; 4]),
                // Catalogued from an index: its count, no spans.
                ShardInfo {
                    key: "d.tar".into(),
                    etag: "e".into(),
                    count: 10,
                    spans: None,
                    size: 0,
                },
                shard("e.tar", &[1 << 20, 200 << 10, 1 << 20]),
            ],
        };
        let id = |shard, index| SampleId { shard, index };
        let wanted = vec![
            (id(0, 0), 0),
            (id(0, 2), 1),
            (id(0, 5), 2),
            (id(0, 3), 3), // goes back: a new run
            (id(1, 0), 4),
            (id(1, 2), 5), // a 300 KiB gap after 300 KiB: a new run
            (id(1, 3), 6),
            (id(1, 4), 7), // past 16 MiB: a new run
            (id(2, 0), 8),
            (id(2, 3), 9), // compressed: one run, read whole
            (id(3, 1), 10),
            (id(3, 8), 11), // no spans: one run, read from the start
            (id(4, 0), 12),
            (id(4, 2), 13), // a 200 KiB gap after 1 MiB: read through
        ];
        let runs = runs_of(&catalog, &wanted);
        let shape: Vec<(u32, u32, u32, usize)> = runs
            .iter()
            .map(|r| (r.shard, r.first, r.last, r.take.len()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0, 0, 5, 3),
                (0, 3, 3, 1),
                (1, 0, 0, 1),
                (1, 2, 3, 2),
                (1, 4, 4, 1),
                (2, 0, 3, 2),
                (3, 1, 8, 2),
                (4, 0, 2, 2)
            ]
        );
    }
}
