//! The deterministic order of an epoch: a PRNG whose sequence depends on its seed alone
//! (on every platform, rank and version of this crate), the Fisher–Yates shuffle of the
//! shard list, and the seeds of each stage. [`super::plan`] builds on these.

/// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and fully determined by its seed.
#[derive(Debug, Clone)]
pub(super) struct SplitMix64(u64);

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SplitMix64 {
    pub(super) fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        finalize(self.0)
    }

    /// Uniform in `0..n` (`n > 0`), without modulo bias (Lemire's multiply-and-reject).
    pub(super) fn below(&mut self, n: u64) -> u64 {
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
fn shuffle<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// One seed out of several numbers; distinct tuples give unrelated seeds.
pub(super) fn derive_seed(parts: &[u64]) -> u64 {
    parts.iter().fold(GOLDEN, |h, &p| {
        finalize(h.wrapping_add(GOLDEN) ^ finalize(p))
    })
}

/// Tells the shard shuffle's seeds apart from the other stages'.
const SHARDS: u64 = 0x5348_4152_4453; // "SHARDS"

/// The shard order of `epoch`, the same on every rank: `items` (shards in key order, or
/// their numbers) shuffled by a PRNG seeded from `seed` and `epoch`, or as given when
/// `shuffle_on` is off. The same count, seed and epoch give the same permutation.
pub(super) fn epoch_order_of<T: Clone>(
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
        let a = epoch_order_of(&shards, 42, 0, true);
        assert_eq!(a, epoch_order_of(&shards, 42, 0, true));
        assert_ne!(a, shards);
        assert_ne!(a, epoch_order_of(&shards, 42, 1, true));
        assert_ne!(a, epoch_order_of(&shards, 43, 0, true));
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, shards);
        assert_eq!(epoch_order_of(&shards, 42, 3, false), shards);
        // Pinned: the order must not change between versions, or resumed runs diverge.
        let small = epoch_order_of(&names(5), 1, 0, true);
        let idx: Vec<usize> = small.iter().map(|s| s[6..10].parse().unwrap()).collect();
        assert_eq!(idx, PINNED_ORDER);
    }

    /// `epoch_order_of(5 shards, seed 1, epoch 0)`.
    const PINNED_ORDER: [usize; 5] = [2, 0, 1, 4, 3];

    #[test]
    fn seeds_differ_per_stage_seed_and_epoch() {
        let s: Vec<u64> = vec![
            derive_seed(&[SHARDS, 1, 0]),
            derive_seed(&[SHARDS, 1, 1]),
            derive_seed(&[SHARDS, 2, 0]),
            derive_seed(&[SHARDS, 0, 1]),
            derive_seed(&[1, 0]),
            derive_seed(&[0, 1]),
        ];
        let mut d = s.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), s.len());
    }
}
