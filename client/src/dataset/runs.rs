//! A planned epoch's reads as runs: consecutive samples of one shard fetched with one
//! range read, gaps of other workers' samples read through when small ([`GAP`]).

use std::sync::Arc;

use super::catalog::{Catalog, ShardInfo};
use super::plan::SampleId;
use crate::{Error, Result};

/// Bytes of other workers' samples a run reads through rather than starting another:
/// up to this much, or up to a quarter of the run's bytes so far. A run read through a
/// node that serves it straight from the backend (a shard its cache does not hold)
/// costs the backend every byte it spans, so a gap as large as the samples around it
/// (two DataLoader workers taking batches in turn) is two requests, not one.
pub(super) const GAP: u64 = 64 << 10;

/// Largest run read with one request.
pub(super) const MAX_RUN: u64 = 16 << 20;

/// One range read: samples `first..=last` of a shard, of which `take` (sample index,
/// slot in the output) are wanted.
#[derive(Debug, Clone)]
pub(super) struct Run {
    pub(super) shard: u32,
    pub(super) first: u32,
    pub(super) last: u32,
    pub(super) take: Vec<(u32, usize)>,
    /// Its `x-granary-plan`, in a planned epoch.
    pub(super) mark: Option<String>,
    /// The pipeline its members are prepared by, for the epoch's seed and epoch.
    pub(super) pipeline: Option<Arc<crate::Pipelined>>,
}

impl Run {
    /// The bytes of `shard` (its own) the run reads by range; `None` for a shard read
    /// from its start.
    pub(super) fn range(&self, shard: &ShardInfo) -> Option<std::ops::Range<u64>> {
        shard
            .ranged()
            .then(|| shard.span(self.first).start..shard.span(self.last).end)
    }
}

/// Splits the wanted samples, given in span order with their output slots, into runs.
pub(super) fn runs_of(catalog: &Catalog, wanted: &[(SampleId, usize)]) -> Vec<Run> {
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

/// Takes a run's wanted samples (with their slots) out of `samples`, which are the
/// shard's from sample `first` on.
pub(super) fn pick<T>(
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
