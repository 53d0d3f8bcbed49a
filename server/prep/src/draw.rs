//! The random draws of one sample's preparation: a stream that is a pure function of the
//! pipeline's fingerprint, the job's seed, the epoch and the sample's key, so any member,
//! after any restart, for any job, draws the same crop and flip.

use xxhash_rust::xxh3::Xxh3;

/// A sample's draws, in the order its steps take them (SplitMix64 over a seed hashed from
/// what the draws are a function of).
#[derive(Debug, Clone)]
pub struct Draws {
    state: u64,
}

impl Draws {
    /// The draws of sample `key` in `epoch` of a job seeded `seed`, for the pipeline whose
    /// fingerprint is `pipeline`.
    pub fn new(pipeline: u64, seed: u64, epoch: u64, key: &str) -> Draws {
        let mut h = Xxh3::new();
        for n in [pipeline, seed, epoch] {
            h.update(&n.to_le_bytes());
        }
        h.update(key.as_bytes());
        Draws { state: h.digest() }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A float uniform in `[0, 1)`, from 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A float uniform in `[lo, hi)` (`lo` where they are equal).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// An integer uniform in `0..n` (`n` > 0), unbiased (Lemire's multiply, with
    /// rejection).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_a_function_of_their_inputs_alone() {
        let take = |d: &mut Draws| (0..8).map(|_| d.next_u64()).collect::<Vec<_>>();
        let a = take(&mut Draws::new(1, 2, 3, "s/0001"));
        assert_eq!(a, take(&mut Draws::new(1, 2, 3, "s/0001")));
        for other in [
            Draws::new(9, 2, 3, "s/0001"),
            Draws::new(1, 9, 3, "s/0001"),
            Draws::new(1, 2, 9, "s/0001"),
            Draws::new(1, 2, 3, "s/0002"),
        ] {
            assert_ne!(a, take(&mut other.clone()));
        }
    }

    #[test]
    fn uniform_and_below_cover_their_ranges_evenly() {
        let mut d = Draws::new(0, 0, 0, "k");
        let mut counts = [0u32; 7];
        for _ in 0..70_000 {
            counts[d.below(7) as usize] += 1;
        }
        for c in counts {
            assert!((9_500..10_500).contains(&c), "{counts:?}");
        }
        let xs: Vec<f64> = (0..10_000).map(|_| d.uniform(2.0, 3.0)).collect();
        assert!(xs.iter().all(|x| (2.0..3.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 2.5).abs() < 0.01, "{mean}");
        assert_eq!(d.uniform(4.0, 4.0), 4.0);
    }
}
