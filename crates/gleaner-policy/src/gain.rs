//! What a consolidation can gain at most, estimated from measured wake costs before it is
//! tried.
//!
//! Exists because a trial is not free: while a smaller vCPU set is judged, a workload it
//! does not suit runs slower, and on a shared host it also gives up CPU share to the other
//! VMs. Consolidation gains by turning wake-ups of halted vCPUs into wake-ups of running
//! ones; it cannot gain more than what those wake-ups cost. Where that is a few percent of
//! the workload's run time, no trial can pay for its own risk.

use crate::sample::{PeriodSample, WakeLatencies};

/// Consolidation is tried only where the halted-vCPU wake-ups cost at least this fraction of
/// the workload's run time: below it, a trial that fails costs more than one that succeeds
/// can gain. Chosen on the policy lab's tuning set only: there every scenario whose
/// consolidation trials lost against `none` had a bound of at most 8.3 % (oltp-10us-16v),
/// every one where consolidation paid at least 14 % (phase-grain-100us-4v).
pub const MIN_CONSOLIDATION_GAIN: f64 = 0.10;

/// Wake-ups of the busy kind counted before their median is trusted as the busy cost.
const MIN_BUSY_WAKES: u64 = 20;

/// The most a consolidation could gain in this period, as a fraction of the workload's run
/// time: wake-ups that found their vCPU halted, times what such a wake-up costs more than one
/// on a running vCPU (the medians measured this period; `break_even_ns`, the hold derived
/// from the probe's halted and busy wake costs, when too few busy wake-ups were seen), over
/// the workload's run time. `None` where the sampler cannot see wake-ups.
pub fn consolidation_gain_bound(sample: &PeriodSample, break_even_ns: u64) -> Option<f64> {
    let w = sample.wake_latency.as_ref()?;
    Some(gain_bound_of(w, sample.work_ns(), break_even_ns))
}

/// [`consolidation_gain_bound`] of wake-ups `w` seen over `work` ns of the workload's run
/// time: one period's, or several pooled (their histograms merged, their run times summed),
/// whose medians a single period's few dozen wake-ups cannot match.
pub fn gain_bound_of(w: &WakeLatencies, work: u64, break_even_ns: u64) -> f64 {
    if work == 0 || w.halted.count == 0 {
        return 0.0;
    }
    let halted = w.halted.quantile_ns(0.5).unwrap_or(0.0);
    let extra = if w.running.count >= MIN_BUSY_WAKES {
        (halted - w.running.quantile_ns(0.5).unwrap_or(halted)).max(0.0)
    } else {
        (break_even_ns as f64).min(halted)
    };
    w.halted.count as f64 * extra / work as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{VcpuSample, WakeLatencies};

    fn period(work_ns: u64, halted: &[(u64, u64)], running: &[(u64, u64)]) -> PeriodSample {
        let mut w = WakeLatencies::default();
        for &(n, ns) in halted {
            for _ in 0..n {
                w.halted.record(ns);
            }
        }
        for &(n, ns) in running {
            for _ in 0..n {
                w.running.record(ns);
            }
        }
        PeriodSample {
            period_ns: 100_000_000,
            vcpus: vec![VcpuSample {
                cpu: 0,
                work_ns,
                ..VcpuSample::default()
            }],
            wake_latency: Some(w),
            ..PeriodSample::default()
        }
    }

    #[test]
    fn the_bound_is_halted_wakes_times_their_extra_cost_over_run_time() {
        // Lab case oltp-10us-16v-2-co-runners: 5,400 halted wake-ups at ~27 us against
        // ~20 us on running vCPUs, 0.73 s of run time: a few percent at most.
        let oltp = period(730_000_000, &[(5_400, 27_000)], &[(26_000, 20_000)]);
        let g = consolidation_gain_bound(&oltp, 20_000).unwrap();
        assert!(g < MIN_CONSOLIDATION_GAIN, "{g}");
        // Lab case barrier-10us-8v: 3,600 halted wake-ups, none on a running vCPU, 71 ms of
        // run time: the wake-ups cost as much as the work.
        let barrier = period(71_000_000, &[(3_600, 120_000)], &[]);
        let g = consolidation_gain_bound(&barrier, 20_000).unwrap();
        assert!(g > 0.9, "{g}");
        // Nothing known: no bound.
        let mut blind = barrier.clone();
        blind.wake_latency = None;
        assert!(consolidation_gain_bound(&blind, 20_000).is_none());
    }
}
