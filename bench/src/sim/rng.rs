//! A tiny seeded generator (SplitMix64) for the simulation's draws, so a
//! run is reproducible from its seed without pulling in `rand`.

use std::time::Duration;

/// SplitMix64: one 64-bit state, a Weyl step and a mixing function.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// An independent stream for `label` (a node, a pod, a purpose).
    pub fn fork(&mut self, label: u64) -> Rng {
        Rng(self.next_u64() ^ label.wrapping_mul(0xD6E8_FEB8_6659_FD93))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        // The top 53 bits: exactly representable in an f64.
        #[allow(clippy::cast_precision_loss)]
        let top = (self.next_u64() >> 11) as f64;
        top / 9_007_199_254_740_992.0
    }

    /// Uniform in `[lo, hi)` (`lo` when they are equal).
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo);
        lo + span.mul_f64(self.unit())
    }

    /// Exponentially distributed with `mean` (a Poisson process's gaps).
    pub fn exp(&mut self, mean: Duration) -> Duration {
        // 1 - unit() is in (0, 1]: its log is finite.
        mean.mul_f64(-(1.0 - self.unit()).ln())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_ranges_hold() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(Rng::new(8).next_u64(), xs[0]);
        let (lo, hi) = (Duration::from_secs(8), Duration::from_secs(12));
        let mut r = Rng::new(1);
        let draws: Vec<Duration> = (0..10_000).map(|_| r.between(lo, hi)).collect();
        assert!(draws.iter().all(|d| (lo..hi).contains(d)));
        let mean = draws.iter().sum::<Duration>() / 10_000;
        assert!((mean.as_secs_f64() - 10.0).abs() < 0.1, "{mean:?}");
        let e: Duration = (0..10_000).map(|_| r.exp(Duration::from_secs(60))).sum();
        assert!(((e / 10_000).as_secs_f64() - 60.0).abs() < 3.0, "{e:?}");
    }
}
