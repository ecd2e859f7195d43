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
    let rank = |q: f64| -> f64 {
        if n == 0 {
            return f64::NAN;
        }
        let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
        ms[i]
    };
    Summary {
        n,
        p50: rank(0.50),
        p95: rank(0.95),
        p99: rank(0.99),
        max: rank(1.0),
        mean: if n == 0 {
            f64::NAN
        } else {
            ms.iter().sum::<f64>() / n as f64
        },
    }
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
