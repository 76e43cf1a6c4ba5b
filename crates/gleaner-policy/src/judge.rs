//! The judge: was a change a slowdown? Statistics only, no policy state.
//!
//! Kept apart from the state machine in `engine` because it is the part that decides whether
//! the policy may lose against doing nothing: every change is measured against a sample of
//! the periods before it, with the noise of that sample (not a fixed threshold), and a change
//! whose loss is already clear is undone early instead of after the full judging window.

/// Periods of evidence collected before a change is accepted; one period is too noisy.
pub(crate) const JUDGE_PERIODS: u32 = 3;

/// Quiet periods remembered as the "before" sample of the next change's test.
pub(crate) const QUIET_WINDOW: usize = 8;

/// Evidence about a change, collected over [`JUDGE_PERIODS`] periods after it settled.
#[derive(Debug, Clone, Default)]
pub(crate) struct Verdict {
    values: Vec<f64>,
    max_vcpu_util: f64,
}

/// What the periods after a change showed.
#[derive(Debug, Clone)]
pub(crate) struct Evidence {
    pub mean: f64,
    pub values: Vec<f64>,
    /// Standard deviation of one period's value.
    pub sd: f64,
    pub periods: usize,
    pub busiest: f64,
}

impl Verdict {
    /// The busiest vCPU seen so far in the judging window.
    pub fn max_vcpu_util(&self) -> f64 {
        self.max_vcpu_util
    }

    /// Adds a period's judged value (progress, else utilization) and its busiest vCPU;
    /// returns the evidence once enough periods were seen.
    pub fn observe(&mut self, value: f64, max_vcpu_util: f64) -> Option<Evidence> {
        self.values.push(value);
        self.max_vcpu_util = self.max_vcpu_util.max(max_vcpu_util);
        if self.values.len() < JUDGE_PERIODS as usize {
            return None;
        }
        let out = Evidence::of(&self.values, self.max_vcpu_util);
        *self = Verdict::default();
        Some(out)
    }
}

impl Evidence {
    pub fn of(values: &[f64], busiest: f64) -> Evidence {
        let (mean, sd) = mean_sd(values);
        Evidence {
            mean,
            values: values.to_vec(),
            sd,
            periods: values.len(),
            busiest,
        }
    }
}

pub(crate) fn mean_sd(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

pub(crate) fn relative_drop(before: f64, after: f64) -> f64 {
    if before <= 0.0 {
        return 0.0;
    }
    (before - after) / before
}

/// One-sided 99 % quantile of Student's t with `dof` degrees of freedom: with a before-sample
/// of two or three periods the noise is barely known, and the bar for calling a drop real
/// rises accordingly instead of trusting a standard deviation taken from two numbers.
fn t99(dof: usize) -> f64 {
    const T: [f64; 10] = [31.82, 6.96, 4.54, 3.75, 3.36, 3.143, 3.00, 2.90, 2.82, 2.76];
    match dof {
        0 => f64::INFINITY,
        d if d <= T.len() => T[d - 1],
        _ => 2.33,
    }
}

/// Has the change whose before-sample is `before` and whose periods since it was made (its
/// settling periods included) are `after` clearly slowed the workload, before the full
/// judging window is in? Returns the relative drop if so.
///
/// A Welch-style test at 99 % with Student's t for the degrees of freedom both samples give
/// (the after-sample's spread is taken as at least the before-sample's, as two or three
/// periods understate it), and never for a drop under `min_drop`. Needs two before-periods
/// (one gives no noise estimate) and two after-periods: one period is never acted on alone,
/// and the active set never changes in two consecutive periods.
pub(crate) fn clear_drop(before: &[f64], after: &[f64], min_drop: f64) -> Option<f64> {
    if before.len() < 2 || after.len() < 2 {
        return None;
    }
    let (mb, sdb) = mean_sd(before);
    let (ma, sda) = mean_sd(after);
    if mb <= 0.0 {
        return None;
    }
    let sda = sda.max(sdb);
    let se = (sdb.powi(2) / before.len() as f64 + sda.powi(2) / after.len() as f64).sqrt();
    let dof = before.len() + after.len() - 2;
    let drop = relative_drop(mb, ma);
    (drop > min_drop && drop * mb > t99(dof) * se).then_some(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clear_drop_needs_noise_knowledge_and_two_periods() {
        // Steady before, 30 % lower after: clear with two periods each side.
        assert!(clear_drop(&[10.0, 10.01], &[7.0, 7.01], 0.05).is_some());
        // One before-period: the noise is unknown.
        assert!(clear_drop(&[10.0], &[7.0, 7.0], 0.05).is_none());
        // One after-period: never acted on alone.
        assert!(clear_drop(&[10.0, 10.0, 10.0], &[7.0], 0.05).is_none());
        // A workload that swings +-20 % on its own: a 15 % lower mean is not clear.
        assert!(clear_drop(&[12.0, 8.0, 12.0, 8.0], &[8.5, 8.5], 0.05).is_none());
        // Under the minimum drop, however steady.
        assert!(clear_drop(&[10.0, 10.0, 10.0], &[9.7, 9.7], 0.05).is_none());
    }
}
