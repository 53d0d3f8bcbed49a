//! When each shard of a plan is read, from the plan alone: the places (samples into
//! each rank's span) at which some rank reads it in the epoch's current round, and in
//! the next epoch. Ranks read their spans front to back (the shuffle buffer only mixes
//! what the front has reached), so a rank at place `p` reads next whatever its span
//! holds from `p` on, and a shard is next read at the earliest such place of any rank.

use super::{epoch_list, per_rank, round_list, PlanError, PlanSpec, Split};

/// A plan's reads of each shard, in places per rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub epoch: u64,
    /// Samples per rank in the epoch's current round.
    pub per_rank: u64,
    /// Per shard: the places `[first, end)` of the current round at which ranks read it.
    this: Vec<Option<(u64, u64)>>,
    /// Per shard: the first place of the next epoch at which a rank reads it.
    next: Vec<Option<u64>>,
}

/// Per shard, the places `[first, end)` at which the ranks of a round read it.
fn spans(
    counts: &[u32],
    list: &[super::SampleId],
    split: &Split,
) -> (u64, Vec<Option<(u64, u64)>>) {
    let mut out = vec![None; counts.len()];
    let n = list.len();
    let q = per_rank(n, split);
    if n == 0 || q == 0 {
        return (0, out);
    }
    for i in 0..q * split.world_size.max(1) {
        let place = (i % q) as u64;
        let shard = list[i % n].shard as usize;
        let span: &mut Option<(u64, u64)> = &mut out[shard];
        *span = Some(match *span {
            None => (place, place + 1),
            Some((a, b)) => (a.min(place), b.max(place + 1)),
        });
    }
    (q as u64, out)
}

impl Schedule {
    /// The schedule of `spec`'s epoch (after its rounds) and of the epoch after it.
    pub fn of(spec: &PlanSpec) -> Result<Schedule, PlanError> {
        let counts = spec.counts();
        let rounds: Vec<_> = spec.rounds.iter().map(|&r| r.into()).collect();
        let split = spec.split();
        let list = epoch_list(&counts, spec.seed, spec.epoch, spec.shuffle_shards);
        let list = round_list(list, &rounds, spec.seed, spec.epoch)?;
        let (per_rank, this) = spans(&counts, &list, &split);
        let next_list = epoch_list(&counts, spec.seed, spec.epoch + 1, spec.shuffle_shards);
        let (_, next) = spans(&counts, &next_list, &split);
        Ok(Schedule {
            epoch: spec.epoch,
            per_rank,
            this,
            next: next.into_iter().map(|s| s.map(|(a, _)| a)).collect(),
        })
    }

    /// Places (per rank) from `place` in the current round until shard `shard` is read
    /// again: 0 while the ranks read it, the rest of this epoch plus its place in the
    /// next once they are past it; `None` when neither epoch reads it. A shard stays in
    /// use until `place` is `lag` places past its end (a rank's readers do not all stand
    /// at its furthest place).
    pub fn next_use(&self, shard: usize, place: u64, lag: u64) -> Option<u64> {
        if let Some(Some((first, end))) = self.this.get(shard) {
            if place < end + lag {
                return Some(first.saturating_sub(place));
            }
        }
        let first = (*self.next.get(shard)?)?;
        Some(self.per_rank.saturating_sub(place) + first)
    }

    /// The places `[first, end)` of the current round at which ranks read shard `shard`.
    pub fn span(&self, shard: usize) -> Option<(u64, u64)> {
        self.this.get(shard).copied().flatten()
    }

    /// Whether every rank's place is past the last at which a rank reads shard `shard`
    /// in the current round (`place`: the slowest rank's), or no rank reads it.
    pub fn past(&self, shard: usize, place: u64) -> bool {
        match self.this.get(shard) {
            Some(Some((_, end))) => place >= *end,
            _ => true,
        }
    }

    /// Places from `place` until shard `shard` is read in the next epoch (after the
    /// ranks' reads of it in this one).
    pub fn reuse(&self, shard: usize, place: u64) -> Option<u64> {
        let first = (*self.next.get(shard)?)?;
        Some(self.per_rank.saturating_sub(place) + first)
    }

    /// Shards in the plan.
    pub fn shards(&self) -> usize {
        self.this.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{rank_plan, PlanRound, PlanShard};
    use super::*;

    fn spec(counts: &[u32], world: usize) -> PlanSpec {
        PlanSpec {
            bucket: "b".into(),
            prefix: String::new(),
            shards: counts
                .iter()
                .enumerate()
                .map(|(i, &samples)| PlanShard {
                    key: format!("s{i}"),
                    etag: String::new(),
                    samples,
                    size: 0,
                    end: None,
                })
                .collect(),
            seed: 5,
            epoch: 2,
            world_size: world,
            shuffle_buffer: 3,
            shuffle_shards: true,
            drop_last: false,
            batch_size: 1,
            rounds: vec![],
            job: None,
            pipeline: None,
        }
    }

    /// The schedule agrees with the ranks' own plans: a shard's first place is where
    /// the first rank's span reaches it, and it is read at no place past its end.
    #[test]
    fn a_shards_places_are_where_the_ranks_spans_hold_it() {
        let counts = [4u32, 7, 2, 9, 5, 3];
        for world in [1usize, 2, 3] {
            let s = spec(&counts, world);
            let sch = Schedule::of(&s).unwrap();
            let list = epoch_list(&counts, s.seed, s.epoch, true);
            let mut first = vec![u64::MAX; counts.len()];
            let mut end = vec![0u64; counts.len()];
            for rank in 0..world {
                let p = rank_plan(list.clone(), &[], &s.split(), rank, s.seed, s.epoch).unwrap();
                assert_eq!(p.order.len() as u64, sch.per_rank);
                for (id, &place) in p.order.iter().zip(&p.span_pos) {
                    let sh = id.shard as usize;
                    first[sh] = first[sh].min(place as u64);
                    end[sh] = end[sh].max(place as u64 + 1);
                }
            }
            for sh in 0..counts.len() {
                assert_eq!(
                    sch.next_use(sh, 0, 0),
                    Some(first[sh]),
                    "world {world} shard {sh}"
                );
                // Being read: needed now.
                assert_eq!(sch.next_use(sh, end[sh] - 1, 0), Some(0));
                // Past it: the next epoch's reads.
                let later = sch.next_use(sh, end[sh], 0).unwrap();
                assert!(later >= sch.per_rank - end[sh], "world {world} shard {sh}");
                // Readers lagging behind the furthest place still hold it.
                assert_eq!(sch.next_use(sh, end[sh], 2), Some(0));
            }
        }
    }

    #[test]
    fn a_resumed_round_schedules_only_what_is_left() {
        let counts = [4u32, 4, 4, 4];
        let mut s = spec(&counts, 2);
        s.shuffle_buffer = 0;
        s.shuffle_shards = false;
        // 8 of 16 consumed by 2 ranks of 8 each: the first 4 of each span, so shards
        // 0 and 2 are done, and 1 and 3 are left for the next round.
        s.rounds.push(PlanRound {
            world_size: 2,
            shuffle_buffer: 0,
            drop_last: false,
            consumed: 8,
        });
        let sch = Schedule::of(&s).unwrap();
        assert_eq!(sch.per_rank, 4);
        assert_eq!(sch.next_use(1, 0, 0), Some(0));
        assert_eq!(sch.next_use(3, 0, 0), Some(0));
        // Shard 0 is read again only in the next epoch, after this round's 4 places;
        // in key order, rank 0 reads it first.
        assert_eq!(sch.next_use(0, 0, 0), Some(4));
        assert_eq!(sch.next_use(2, 0, 0), Some(4));
        assert_eq!(sch.next_use(9, 0, 0), None);
    }
}
