//! A fixed-size log-linear latency histogram.
//!
//! A timed pingpong run records hundreds of thousands of round trips per
//! second; keeping every sample would grow memory without bound. Values below
//! 128 ns are counted exactly; larger values share a bucket with neighbours
//! within 1/64 (about 1.6 %) of them, which is far finer than run-to-run noise.
//! The whole u64 range fits in under 4 000 counters.

use crate::report::LatencySummary;

/// Values below this are counted in their own bucket.
const EXACT_LIMIT: u64 = 128;
/// Buckets per power of two above `EXACT_LIMIT` (6 bits of mantissa).
const SUB_BUCKETS: u64 = 64;
/// 128 exact buckets plus 64 per octave for octaves 2^7 .. 2^63.
const BUCKETS: usize = (EXACT_LIMIT + (64 - 7) * SUB_BUCKETS) as usize;

#[derive(Debug, Clone)]
pub(crate) struct LatencyHistogram {
    counts: Vec<u64>,
    samples: u64,
    max: u64,
}

/// Bucket holding `value`.
fn bucket_of(value: u64) -> usize {
    if value < EXACT_LIMIT {
        return value as usize;
    }
    // value = mantissa << shift with mantissa in [64, 128).
    let shift = 63 - value.leading_zeros() - 6;
    let mantissa = value >> shift;
    (EXACT_LIMIT + u64::from(shift - 1) * SUB_BUCKETS + (mantissa - SUB_BUCKETS)) as usize
}

/// Largest value that falls in `bucket`.
fn bucket_upper_bound(bucket: usize) -> u64 {
    let bucket = bucket as u64;
    if bucket < EXACT_LIMIT {
        return bucket;
    }
    let offset = bucket - EXACT_LIMIT;
    let shift = offset / SUB_BUCKETS + 1;
    let mantissa = offset % SUB_BUCKETS + SUB_BUCKETS;
    // For the very last bucket (mantissa + 1) << shift is 2^64, which wraps to
    // 0; subtracting 1 then wraps to u64::MAX, the correct bound.
    ((mantissa + 1) << shift).wrapping_sub(1)
}

impl LatencyHistogram {
    pub(crate) fn new() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            samples: 0,
            max: 0,
        }
    }

    pub(crate) fn record(&mut self, value_ns: u64) {
        self.counts[bucket_of(value_ns)] += 1;
        self.samples += 1;
        self.max = self.max.max(value_ns);
    }

    pub(crate) fn samples(&self) -> u64 {
        self.samples
    }

    /// Nearest-rank percentile: the smallest value with at least `fraction`
    /// of the samples at or below it, reported as its bucket's upper bound
    /// (never above the true maximum).
    fn percentile(&self, fraction: f64) -> u64 {
        let rank = ((fraction * self.samples as f64).ceil() as u64).clamp(1, self.samples);
        let mut seen = 0u64;
        for (bucket, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return bucket_upper_bound(bucket).min(self.max);
            }
        }
        self.max
    }

    /// Percentile summary; `None` when nothing was recorded.
    pub(crate) fn summary(&self) -> Option<LatencySummary> {
        (self.samples > 0).then(|| LatencySummary {
            samples: self.samples,
            p50: self.percentile(0.50),
            p90: self.percentile(0.90),
            p99: self.percentile(0.99),
            max: self.max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_values_are_exact() {
        let mut histogram = LatencyHistogram::new();
        for value in (1..=100).rev() {
            histogram.record(value);
        }
        let summary = histogram.summary().unwrap();
        assert_eq!(summary.samples, 100);
        assert_eq!(
            (summary.p50, summary.p90, summary.p99, summary.max),
            (50, 90, 99, 100)
        );
    }

    #[test]
    fn empty_histogram_has_no_summary() {
        assert_eq!(LatencyHistogram::new().summary(), None);
    }

    #[test]
    fn extreme_values_fit() {
        let mut histogram = LatencyHistogram::new();
        histogram.record(0);
        histogram.record(u64::MAX);
        let summary = histogram.summary().unwrap();
        assert_eq!((summary.p50, summary.max), (0, u64::MAX));
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    proptest! {
        #[test]
        fn buckets_contain_their_values(value in any::<u64>()) {
            let bucket = bucket_of(value);
            prop_assert!(bucket < BUCKETS);
            prop_assert!(value <= bucket_upper_bound(bucket));
            // The bound is within 1/64 of the value (exact below 128).
            prop_assert!(bucket_upper_bound(bucket) - value <= value / 64);
        }

        #[test]
        fn percentiles_are_close_to_exact_ones(mut values in prop::collection::vec(1u64..10_000_000, 1..300)) {
            let mut histogram = LatencyHistogram::new();
            for &value in &values {
                histogram.record(value);
            }
            let summary = histogram.summary().unwrap();
            values.sort_unstable();
            let exact = |p: f64| values[((p * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1];
            for (approx, p) in [(summary.p50, 0.5), (summary.p90, 0.9), (summary.p99, 0.99)] {
                let truth = exact(p);
                prop_assert!(approx >= truth && approx - truth <= truth / 64, "p{p}: {approx} vs {truth}");
            }
            prop_assert_eq!(summary.max, *values.last().unwrap());
        }
    }
}
