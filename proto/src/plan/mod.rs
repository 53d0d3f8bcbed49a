//! Which samples each rank and each DataLoader worker reads in an epoch, and in what
//! order, at sample level (the client's datasets read by it; the node plans fetches by
//! it): a pure function of the per-shard sample counts, the seed, the
//! epoch, and the resume history. No bytes are read here.
//!
//! 1. **The epoch's list.** Shards (in key order) are shuffled by `(seed, epoch)` as
//!    `order::epoch_order_of` does, and their samples laid end to end, each shard's in
//!    archive order. The list depends on nothing else: not on the world size, the
//!    workers or the batch size.
//! 2. **Ranks.** Rank `r` of `W` takes the contiguous span `[r·q, (r+1)·q)` of the list,
//!    `q = ⌈n/W⌉` (positions past the end wrap to the start: a few samples repeated so
//!    that every rank yields `q`), or `q = ⌊n/W⌋` with `drop_last` (the last `n − qW`
//!    samples left out). Contiguous spans keep reads sequential: a rank reads whole runs
//!    of its shards, never every `W`-th sample of all of them.
//! 3. **Shuffle buffer.** A rank's span goes through a buffer of `shuffle_buffer`
//!    samples, WebDataset's way (fill it, then emit a random slot per sample read), but
//!    computed on positions, seeded by `(seed, epoch, rank, resume round)`: the order a
//!    rank's training loop sees is known without reading a byte, and a sample comes at
//!    most `shuffle_buffer` places after the point its span reaches it.
//! 4. **Workers.** Worker `w` of `k` takes the batches `i ≡ w (mod k)` of the rank's
//!    order (batches of `batch_size`). A DataLoader takes batches from its workers in
//!    turn, so the training loop sees the rank's order itself, whatever `k` is: what was
//!    consumed after `c` samples per rank is the first `c` of each rank's order.
//! 5. **Resume.** A state records, per round, the world size, buffer and `drop_last`, and
//!    the samples all ranks consumed. The samples not consumed, in list order, are the
//!    next round's list, which any world size splits again as in 2. Rounds chain, so an
//!    epoch may be resumed any number of times, on any world sizes.

mod order;
mod schedule;
mod wire;

use order::{derive_seed, epoch_order_of, SplitMix64};
pub use schedule::Schedule;
pub use wire::{PlanMark, PlanRound, PlanShard, PlanSpec, PlanView};

/// A sample: its shard's number (in the dataset's key order) and its place in the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleId {
    pub shard: u32,
    pub index: u32,
}

/// How one round of an epoch was split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub world_size: usize,
    pub shuffle_buffer: usize,
    pub drop_last: bool,
}

/// A finished part of an epoch: how it was split and how many samples all ranks
/// consumed under that split (a multiple of its world size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    pub split: Split,
    pub consumed: u64,
}

/// A plan or resume the counts cannot satisfy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("{consumed} samples consumed is not a multiple of the world size {world_size}: every rank consumes as many")]
    Uneven { consumed: u64, world_size: usize },
    #[error("{consumed} samples consumed, but {world_size} ranks hold only {total} in the round")]
    TooMany {
        consumed: u64,
        world_size: usize,
        total: u64,
    },
    #[error("world size must be at least 1 and rank below it (rank {rank} of {world_size})")]
    Rank { rank: usize, world_size: usize },
}

/// Tells the buffer's seeds apart from the other stages'.
const BUFFER: u64 = 0x4255_4646_4552; // "BUFFER"

/// The epoch's list: shards shuffled by `(seed, epoch)` (or in key order), each shard's
/// samples in archive order. `counts[s]` is shard `s`'s sample count.
pub fn epoch_list(counts: &[u32], seed: u64, epoch: u64, shuffle_shards: bool) -> Vec<SampleId> {
    let shards: Vec<u32> = (0..counts.len() as u32).collect();
    let order = epoch_order_of(&shards, seed, epoch, shuffle_shards);
    let mut list = Vec::with_capacity(counts.iter().map(|&c| c as usize).sum());
    for s in order {
        list.extend((0..counts[s as usize]).map(|index| SampleId { shard: s, index }));
    }
    list
}

/// Samples per rank in a round of `n` samples.
pub fn per_rank(n: usize, split: &Split) -> usize {
    let w = split.world_size.max(1);
    if split.drop_last {
        n / w
    } else {
        n.div_ceil(w)
    }
}

/// The positions in `0..len` in the order a buffer of `size` slots emits them.
fn buffer_order(len: usize, size: usize, rng: &mut SplitMix64) -> Vec<usize> {
    if size <= 1 {
        return (0..len).collect();
    }
    let mut out = Vec::with_capacity(len);
    let mut buf: Vec<usize> = Vec::with_capacity(size.min(len));
    for j in 0..len {
        buf.push(j);
        if buf.len() >= size {
            let k = rng.below(buf.len() as u64) as usize;
            out.push(buf.swap_remove(k));
        }
    }
    while !buf.is_empty() {
        let k = rng.below(buf.len() as u64) as usize;
        out.push(buf.swap_remove(k));
    }
    out
}

/// Rank `rank`'s order in a round of `n` samples: places in its span `0..q`, in the
/// order the training loop sees them. Place `j` is list position `(rank·q + j) mod n`
/// (past the end: padding, from the start).
fn rank_places(
    n: usize,
    rank: usize,
    split: &Split,
    seed: u64,
    epoch: u64,
    round: usize,
) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let mut rng = SplitMix64::new(derive_seed(&[
        BUFFER,
        seed,
        epoch,
        rank as u64,
        round as u64,
    ]));
    buffer_order(per_rank(n, split), split.shuffle_buffer, &mut rng)
}

/// The list position of place `j` of rank `rank`'s span.
fn position(n: usize, q: usize, rank: usize, j: usize) -> usize {
    (rank * q + j) % n
}

/// What one rank reads in one epoch, given the rounds before this one.
#[derive(Debug, Clone)]
pub struct RankPlan {
    /// The samples in the order the rank's training loop sees them.
    pub order: Vec<SampleId>,
    /// For each entry of `order`, its place in the rank's span: reading the span in this
    /// order reads the rank's shards front to back.
    pub span_pos: Vec<u32>,
}

impl RankPlan {
    /// The entries worker `worker` of `workers` yields: batches `i ≡ worker (mod
    /// workers)` of `batch_size` samples, as indexes into `order`.
    pub fn worker_entries(&self, worker: usize, workers: usize, batch_size: usize) -> Vec<usize> {
        let (k, b) = (workers.max(1), batch_size.max(1));
        (0..self.order.len())
            .filter(|i| (i / b) % k == worker)
            .collect()
    }
}

/// The list left for the next round: the samples of `list` none of the round's ranks
/// consumed, in list order.
fn remaining(
    list: &[SampleId],
    round: &Round,
    seed: u64,
    epoch: u64,
    index: usize,
) -> Result<Vec<SampleId>, PlanError> {
    let split = &round.split;
    let w = split.world_size;
    if w == 0 {
        return Err(PlanError::Rank {
            rank: 0,
            world_size: 0,
        });
    }
    if !round.consumed.is_multiple_of(w as u64) {
        return Err(PlanError::Uneven {
            consumed: round.consumed,
            world_size: w,
        });
    }
    let n = list.len();
    let q = per_rank(n, split);
    let c = (round.consumed / w as u64) as usize;
    if c > q {
        return Err(PlanError::TooMany {
            consumed: round.consumed,
            world_size: w,
            total: (q * w) as u64,
        });
    }
    let mut taken = vec![false; n];
    for rank in 0..w {
        for j in rank_places(n, rank, split, seed, epoch, index)
            .into_iter()
            .take(c)
        {
            taken[position(n, q, rank, j)] = true;
        }
    }
    // With drop_last, the samples past the ranks' spans were left out of the epoch.
    let end = (q * w).min(n);
    Ok(list[..end]
        .iter()
        .zip(&taken)
        .filter(|(_, &t)| !t)
        .map(|(s, _)| *s)
        .collect())
}

/// The list an epoch's next round splits: `list` less what `rounds` (the resume history,
/// oldest first) consumed.
pub fn round_list(
    list: Vec<SampleId>,
    rounds: &[Round],
    seed: u64,
    epoch: u64,
) -> Result<Vec<SampleId>, PlanError> {
    let mut list = list;
    for (i, r) in rounds.iter().enumerate() {
        list = remaining(&list, r, seed, epoch, i)?;
    }
    Ok(list)
}

/// Rank `rank`'s plan for an epoch whose list is `list`, after `rounds` (the resume
/// history, oldest first), under `split`.
pub fn rank_plan(
    list: Vec<SampleId>,
    rounds: &[Round],
    split: &Split,
    rank: usize,
    seed: u64,
    epoch: u64,
) -> Result<RankPlan, PlanError> {
    if split.world_size == 0 || rank >= split.world_size {
        return Err(PlanError::Rank {
            rank,
            world_size: split.world_size,
        });
    }
    let list = round_list(list, rounds, seed, epoch)?;
    let n = list.len();
    let q = per_rank(n, split);
    let places = rank_places(n, rank, split, seed, epoch, rounds.len());
    Ok(RankPlan {
        order: places
            .iter()
            .map(|&j| list[position(n, q, rank, j)])
            .collect(),
        span_pos: places.into_iter().map(|j| j as u32).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn split(world_size: usize, shuffle_buffer: usize, drop_last: bool) -> Split {
        Split {
            world_size,
            shuffle_buffer,
            drop_last,
        }
    }

    fn counts() -> Vec<u32> {
        vec![7, 3, 12, 1, 9, 5, 10]
    }

    fn tally(ids: impl IntoIterator<Item = SampleId>) -> HashMap<SampleId, usize> {
        let mut m = HashMap::new();
        for id in ids {
            *m.entry(id).or_default() += 1;
        }
        m
    }

    #[test]
    fn every_sample_once_and_equal_counts_for_any_world_size_and_workers() {
        let c = counts();
        let n: usize = c.iter().map(|&x| x as usize).sum();
        for world in 1..=5 {
            for buffer in [0, 4] {
                for drop_last in [false, true] {
                    let s = split(world, buffer, drop_last);
                    let mut seen = Vec::new();
                    for rank in 0..world {
                        let plan =
                            rank_plan(epoch_list(&c, 3, 1, true), &[], &s, rank, 3, 1).unwrap();
                        let q = if drop_last {
                            n / world
                        } else {
                            n.div_ceil(world)
                        };
                        assert_eq!(plan.order.len(), q);
                        for workers in [1, 2, 3] {
                            let mut e: Vec<usize> = (0..workers)
                                .flat_map(|w| plan.worker_entries(w, workers, 4))
                                .collect();
                            e.sort();
                            assert_eq!(e, (0..q).collect::<Vec<_>>());
                        }
                        seen.extend(plan.order);
                    }
                    let t = tally(seen);
                    if drop_last {
                        assert_eq!(t.len(), n - n % world);
                        assert!(t.values().all(|&v| v == 1));
                    } else {
                        assert_eq!(t.len(), n, "world {world}");
                        let repeated: usize = t.values().map(|v| v - 1).sum();
                        assert_eq!(repeated, n.div_ceil(world) * world - n);
                    }
                }
            }
        }
    }

    #[test]
    fn the_order_depends_on_seed_and_epoch_alone() {
        let c = counts();
        let s = split(2, 8, false);
        let a = rank_plan(epoch_list(&c, 5, 0, true), &[], &s, 1, 5, 0).unwrap();
        let b = rank_plan(epoch_list(&c, 5, 0, true), &[], &s, 1, 5, 0).unwrap();
        assert_eq!(a.order, b.order);
        let e1 = rank_plan(epoch_list(&c, 5, 1, true), &[], &s, 1, 5, 1).unwrap();
        assert_ne!(a.order, e1.order);
        let s6 = rank_plan(epoch_list(&c, 6, 0, true), &[], &s, 1, 6, 0).unwrap();
        assert_ne!(a.order, s6.order);
    }

    #[test]
    fn reading_a_span_in_order_reads_shards_front_to_back() {
        let c = counts();
        let s = split(3, 0, false);
        let plan = rank_plan(epoch_list(&c, 1, 0, true), &[], &s, 1, 1, 0).unwrap();
        assert_eq!(
            plan.span_pos,
            (0..plan.order.len() as u32).collect::<Vec<_>>()
        );
        for w in plan.order.windows(2) {
            if w[0].shard == w[1].shard {
                assert_eq!(w[1].index, w[0].index + 1);
            }
        }
        let buffered = rank_plan(
            epoch_list(&c, 1, 0, true),
            &[],
            &split(3, 5, false),
            1,
            1,
            0,
        )
        .unwrap();
        for (i, &p) in buffered.span_pos.iter().enumerate() {
            assert!((p as usize) < i + 5, "entry {i} reaches {p}");
        }
        let mut sorted = buffered.order.clone();
        sorted.sort();
        let mut plain = plan.order.clone();
        plain.sort();
        assert_eq!(sorted, plain);
    }

    /// Consumes `c` samples per rank under `s` after `rounds`, returning them.
    fn consume(c: &[u32], rounds: &[Round], s: &Split, per_rank: usize) -> Vec<SampleId> {
        (0..s.world_size)
            .flat_map(|rank| {
                let p = rank_plan(epoch_list(c, 9, 2, true), rounds, s, rank, 9, 2).unwrap();
                p.order.into_iter().take(per_rank).collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn resuming_on_other_world_sizes_loses_and_repeats_nothing() {
        // 48 samples: 4 ranks of 12; 3 ranks of the 28 left (drop_last off, so 10 each
        // with 2 repeated); then 2 ranks.
        let c = vec![10, 6, 14, 8, 10];
        for buffer in [0, 3] {
            let s4 = split(4, buffer, false);
            let first = consume(&c, &[], &s4, 5);
            let r1 = Round {
                split: s4,
                consumed: 20,
            };
            let s3 = split(3, buffer, false);
            let second = consume(&c, &[r1], &s3, 6);
            let r2 = Round {
                split: s3,
                consumed: 18,
            };
            let s2 = split(2, buffer, false);
            let rest = consume(&c, &[r1, r2], &s2, usize::MAX);
            let all: Vec<SampleId> = first.into_iter().chain(second).chain(rest).collect();
            let t = tally(all);
            assert_eq!(t.len(), 48);
            assert!(t.values().all(|&v| v == 1), "buffer {buffer}: {t:?}");
        }
    }

    #[test]
    fn bad_resumes_are_refused() {
        let c = counts();
        let list = epoch_list(&c, 0, 0, true);
        let s = split(4, 0, false);
        let uneven = Round {
            split: s,
            consumed: 6,
        };
        assert!(matches!(
            rank_plan(list.clone(), &[uneven], &s, 0, 0, 0),
            Err(PlanError::Uneven { .. })
        ));
        let too_many = Round {
            split: s,
            consumed: 400,
        };
        assert!(matches!(
            rank_plan(list.clone(), &[too_many], &s, 0, 0, 0),
            Err(PlanError::TooMany { .. })
        ));
        assert!(matches!(
            rank_plan(list, &[], &s, 4, 0, 0),
            Err(PlanError::Rank { .. })
        ));
    }
}
