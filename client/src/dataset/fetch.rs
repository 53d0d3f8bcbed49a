//! One run fetched from its shard's owner, or the next members in the ring's order
//! when the owner cannot be reached ([`super::route`]).

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::catalog::Catalog;
use super::delivered::*;
use super::route::{on_best, Clients};
use super::runs::*;
use super::samples::ShardSamples;
use super::settings::*;
use crate::{Error, GetOptions, Result};

/// Fetches one run: the wanted samples with their slots; from a node on this machine, as
/// `local` says. `inline`: the reader fetches it itself, as it needs it (a run copied out
/// of a node's cache file then stays mapped, and each member is copied out as its sample
/// is delivered; a fetching thread copies the run whole, off the reader's thread). The
/// flag: whether the member that served it is on this machine (a first read may go over
/// TCP and learn of the node's socket in its answer).
pub(super) fn fetch(
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
pub(super) fn fetch_from(
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
pub(super) struct Watched<R> {
    pub(super) inner: R,
    pub(super) failed: Arc<AtomicBool>,
}

impl<R: Read> Read for Watched<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf).inspect_err(|_| {
            self.failed.store(true, Ordering::Relaxed);
        })
    }
}

/// A run's samples, each with its output slot.
pub(super) type Fetched = Vec<(usize, Delivered)>;
