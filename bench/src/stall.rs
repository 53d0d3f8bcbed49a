//! The data-stall question DS-Analyzer asks: given the throughput the storage tier
//! delivered, how long would a group of GPUs, each ingesting at a fixed rate, sit idle
//! waiting for data, and how many such GPUs could it keep busy?
//!
//! The figures carry the names of `granary.analyze`'s report (`fetch_stall`,
//! `prep_stall`, `bound`), which measures the same for a user's own training loop: here
//! the consumers are modelled and do no prep, so the stall is all fetch.

use serde::Serialize;

/// Fraction of wall time a consumer group of `gpus` GPUs, each ingesting `gpu_rate`
/// bytes/s, waits for data when storage delivers `measured` bytes/s:
/// `max(0, 1 - measured / (gpus * gpu_rate))`. Zero demand never stalls.
pub fn stall_fraction(measured: f64, gpus: u32, gpu_rate: f64) -> f64 {
    let demand = f64::from(gpus) * gpu_rate;
    if demand <= 0.0 || !measured.is_finite() {
        return 0.0;
    }
    (1.0 - measured / demand).clamp(0.0, 1.0)
}

/// The largest number of GPUs at `gpu_rate` bytes/s that `measured` bytes/s can feed
/// without stalling: `floor(measured / gpu_rate)`.
pub fn max_gpus(measured: f64, gpu_rate: f64) -> u64 {
    if gpu_rate <= 0.0 || !measured.is_finite() || measured <= 0.0 {
        return 0;
    }
    (measured / gpu_rate).floor() as u64
}

/// The stall figures for one measured throughput.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stall {
    /// Delivered throughput, MB/s (10^6 bytes).
    pub measured_mb_s: f64,
    /// What the GPU group ingests, MB/s: gpus × gpu rate.
    pub demand_mb_s: f64,
    /// Fraction of time the GPU group would wait for data, 0..1.
    pub stall_fraction: f64,
    /// The most GPUs at this rate the measured throughput feeds.
    pub max_gpus: u64,
    /// As `granary.analyze` names them: the stall is fetching's (`stall_fraction`)...
    pub fetch_stall: f64,
    /// ...none of it prep's (the modelled consumers prepare nothing)...
    pub prep_stall: f64,
    /// ...and what bounds the consumers: `"fetch"` where they wait 5% of the time or
    /// more (`granary.analyze`'s threshold), else `"step"`.
    pub bound: &'static str,
}

impl Stall {
    /// Stall figures for `measured` bytes/s against `gpus` × `gpu_rate` bytes/s.
    pub fn new(measured: f64, gpus: u32, gpu_rate: f64) -> Self {
        let stall = stall_fraction(measured, gpus, gpu_rate);
        Stall {
            measured_mb_s: measured / 1e6,
            demand_mb_s: f64::from(gpus) * gpu_rate / 1e6,
            stall_fraction: stall,
            max_gpus: max_gpus(measured, gpu_rate),
            fetch_stall: stall,
            prep_stall: 0.0,
            bound: if stall < 0.05 { "step" } else { "fetch" },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formula() {
        // 4 GPUs at 600 MB/s demand 2400 MB/s; 1800 MB/s delivered leaves them idle 25%.
        assert!((stall_fraction(1800e6, 4, 600e6) - 0.25).abs() < 1e-12);
        // Faster than demand: no stall, never negative.
        assert_eq!(stall_fraction(5000e6, 4, 600e6), 0.0);
        assert_eq!(stall_fraction(2400e6, 4, 600e6), 0.0);
        // Nothing delivered: always waiting.
        assert_eq!(stall_fraction(0.0, 4, 600e6), 1.0);
        // No demand: no stall.
        assert_eq!(stall_fraction(100.0, 0, 600e6), 0.0);
    }

    #[test]
    fn gpus_fed() {
        assert_eq!(max_gpus(1800e6, 600e6), 3);
        assert_eq!(max_gpus(1799e6, 600e6), 2);
        assert_eq!(max_gpus(599e6, 600e6), 0);
        assert_eq!(max_gpus(1e9, 0.0), 0);
    }

    #[test]
    fn stall_struct() {
        let s = Stall::new(1200e6, 4, 600e6);
        assert_eq!(s.measured_mb_s, 1200.0);
        assert_eq!(s.demand_mb_s, 2400.0);
        assert_eq!(s.stall_fraction, 0.5);
        assert_eq!(s.max_gpus, 2);
        assert_eq!((s.fetch_stall, s.prep_stall, s.bound), (0.5, 0.0, "fetch"));
        let fed = Stall::new(2450e6, 4, 600e6);
        assert_eq!((fed.fetch_stall, fed.bound), (0.0, "step"));
    }
}
