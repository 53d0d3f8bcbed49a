//! The deterministic order of an epoch: a PRNG whose sequence depends on its seed alone
//! (on every platform, rank and version of this crate), the Fisher–Yates shuffle of the
//! shard list, the split of that list across ranks, and the seeds of each stage.

/// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and fully determined by its seed.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(u64);

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        finalize(self.0)
    }

    /// Uniform in `0..n` (`n > 0`), without modulo bias (Lemire's multiply-and-reject).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

/// Shuffles `items` in place (Fisher–Yates).
pub(crate) fn shuffle<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// One seed out of several numbers; distinct tuples give unrelated seeds.
pub(crate) fn derive_seed(parts: &[u64]) -> u64 {
    parts.iter().fold(GOLDEN, |h, &p| {
        finalize(h.wrapping_add(GOLDEN) ^ finalize(p))
    })
}

/// Tells the stages' seeds apart.
const SHARDS: u64 = 0x5348_4152_4453; // "SHARDS"
const SAMPLES: u64 = 0x5341_4D50_4C45; // "SAMPLE"

/// The shard order of `epoch`, the same on every rank: `shards` (sorted) shuffled by a PRNG
/// seeded from `seed` and `epoch`, or as given when `shuffle` is off.
pub(crate) fn epoch_order(
    shards: &[String],
    seed: u64,
    epoch: u64,
    shuffle_on: bool,
) -> Vec<String> {
    epoch_order_of(shards, seed, epoch, shuffle_on)
}

/// [`epoch_order`] of any items: the same permutation for the same count, seed and epoch.
pub(crate) fn epoch_order_of<T: Clone>(
    items: &[T],
    seed: u64,
    epoch: u64,
    shuffle_on: bool,
) -> Vec<T> {
    let mut order = items.to_vec();
    if shuffle_on {
        let mut rng = SplitMix64::new(derive_seed(&[SHARDS, seed, epoch]));
        shuffle(&mut order, &mut rng);
    }
    order
}

/// The shards of `rank`: those at positions `p` of the epoch's order with
/// `p % world_size == rank`.
pub(crate) fn rank_split<T: Clone>(order: &[T], rank: usize, world_size: usize) -> Vec<T> {
    order
        .iter()
        .skip(rank)
        .step_by(world_size.max(1))
        .cloned()
        .collect()
}

/// The seed of the sample shuffle buffer of one rank in one epoch.
pub(crate) fn sample_seed(seed: u64, epoch: u64, rank: usize) -> u64 {
    derive_seed(&[SAMPLES, seed, epoch, rank as u64])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("shard-{i:04}.tar")).collect()
    }

    #[test]
    fn splitmix_matches_its_reference_sequence() {
        // The first outputs of splitmix64 seeded with 0 (reference C implementation).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(r.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = SplitMix64::new(7);
        let mut seen = [0u32; 6];
        for _ in 0..6000 {
            seen[r.below(6) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 850 && c < 1150), "{seen:?}");
    }

    #[test]
    fn shard_order_is_deterministic_and_changes_per_epoch() {
        let shards = names(50);
        let a = epoch_order(&shards, 42, 0, true);
        assert_eq!(a, epoch_order(&shards, 42, 0, true));
        assert_ne!(a, shards);
        assert_ne!(a, epoch_order(&shards, 42, 1, true));
        assert_ne!(a, epoch_order(&shards, 43, 0, true));
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, shards);
        assert_eq!(epoch_order(&shards, 42, 3, false), shards);
        // Pinned: the order must not change between versions, or resumed runs diverge.
        let small = epoch_order(&names(5), 1, 0, true);
        let idx: Vec<usize> = small.iter().map(|s| s[6..10].parse().unwrap()).collect();
        assert_eq!(idx, PINNED_ORDER);
    }

    /// `epoch_order(5 shards, seed 1, epoch 0)`.
    const PINNED_ORDER: [usize; 5] = [2, 0, 1, 4, 3];

    #[test]
    fn ranks_partition_the_epoch() {
        let order = epoch_order(&names(13), 9, 2, true);
        for world in 1..=6 {
            let mut all: Vec<String> = Vec::new();
            for rank in 0..world {
                let mine = rank_split(&order, rank, world);
                let want = 13 / world + usize::from(rank < 13 % world);
                assert_eq!(mine.len(), want, "world {world} rank {rank}");
                all.extend(mine);
            }
            all.sort();
            assert_eq!(all, names(13));
        }
        assert_eq!(
            rank_split(&order, 1, 4),
            vec![order[1].clone(), order[5].clone(), order[9].clone()]
        );
    }

    #[test]
    fn seeds_differ_per_stage_rank_and_epoch() {
        let s: Vec<u64> = vec![
            sample_seed(1, 0, 0),
            sample_seed(1, 0, 1),
            sample_seed(1, 1, 0),
            sample_seed(2, 0, 0),
            derive_seed(&[SHARDS, 1, 0]),
        ];
        let mut d = s.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), s.len());
    }
}
