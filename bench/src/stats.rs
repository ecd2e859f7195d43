//! Latency samples and their summary.

use std::time::Duration;

use serde::Serialize;

/// Summary of a set of durations, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

/// Nearest-rank percentiles: every figure is a sample that really happened.
pub fn summarize(samples: &[Duration]) -> Summary {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    let n = ms.len();
    // Nearest rank: the smallest sample with at least `pct`% at or below it.
    let rank = |pct: usize| -> f64 {
        if n == 0 {
            return f64::NAN;
        }
        let i = (pct * n).div_ceil(100).clamp(1, n) - 1;
        ms[i]
    };
    Summary {
        n,
        p50: rank(50),
        p95: rank(95),
        p99: rank(99),
        max: rank(100),
        mean: if n == 0 {
            f64::NAN
        } else {
            ms.iter().sum::<f64>() / float(n)
        },
    }
}

/// A count as a float for averages and ratios. The bench's counts (cycles,
/// samples, KiB, bytes) stay far below 2^52, where `f64` is exact.
#[allow(clippy::cast_precision_loss)]
pub fn float(n: impl TryInto<u64>) -> f64 {
    n.try_into().map_or(f64::INFINITY, |n: u64| n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let sum = summarize(&s);
        assert_eq!(
            (sum.p50, sum.p95, sum.p99, sum.max),
            (50.0, 95.0, 99.0, 100.0)
        );
        let one = summarize(&[Duration::from_millis(7)]);
        assert_eq!((one.p50, one.p99, one.max), (7.0, 7.0, 7.0));
        assert!(summarize(&[]).p50.is_nan());
    }
}
