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
///
/// Where a halted vCPU wakes about as fast as a running one ([`host_polls_halted`]), the
/// extra of one over the other says nothing of what packing gains, and hand-offs count their
/// whole latency instead: a halted wake-up from a thread on another vCPU whose vCPU then went
/// idle before the wakee ran (`WakeLatencies::halted_hand_offs`), during whose latency
/// neither of the pair ran. Packed onto one vCPU, the wakee runs as soon as its waker blocks.
/// On a guest with cpuidle driver `none` (its host polls a freshly halted vCPU) a ping-pong's
/// halted and running wake-ups both took about 6 us, the extra bounded the gain at 0 and
/// Gleaner never tried one vCPU, which ran it 2.1-2.4x faster. Elsewhere the extra stays the
/// measure: in the policy lab, where a halted wake-up costs more than a running one, counting
/// hand-offs whole started trials that cost an oversubscribed pipeline 5 %. A timer's
/// wake-up is no hand-off: packing has no waker to put beside it.
pub fn gain_bound_of(w: &WakeLatencies, work: u64, break_even_ns: u64) -> f64 {
    if work == 0 || !host_polls_halted(w, break_even_ns) {
        return bound_for(w, w.halted.count, work, break_even_ns);
    }
    let hand_offs = w.halted_hand_offs.min(w.halted.count);
    let whole = hand_offs as f64 * w.halted.quantile_ns(0.5).unwrap_or(0.0) / work as f64;
    whole + bound_for(w, w.halted.count - hand_offs, work, break_even_ns)
}

/// Whether the host still polls a vCPU that has just halted, so that a halted wake-up costs
/// no VM exit and host reschedule more than a running one: the halted wake-ups' median is
/// within [`POLLED_HALT_RATIO`] of the running ones' (at least [`MIN_BUSY_WAKES`] of those
/// seen) and below `break_even_ns`, what the probe measured a halt to add. Both are needed:
/// on an oversubscribed host every wake-up waits for a physical CPU, running and halted
/// alike, and neither is fast.
fn host_polls_halted(w: &WakeLatencies, break_even_ns: u64) -> bool {
    match (w.halted.quantile_ns(0.5), w.running.quantile_ns(0.5)) {
        (Some(halted), Some(running)) if w.running.count >= MIN_BUSY_WAKES => {
            halted <= POLLED_HALT_RATIO * running && halted <= break_even_ns as f64
        }
        _ => false,
    }
}

/// Halted wake-ups within this factor of running ones cost about the same: the rule by which
/// the retention calibration (`gleaner_daemon::calibration`) also tells a probe run that
/// never saw a real halt.
pub const POLLED_HALT_RATIO: f64 = 1.5;

/// The share of idle periods a hold of `hold_ns` must end with a wake-up (its hit ratio)
/// to pay for the holds that time out: each hit saves what a wake-up of a halted vCPU costs
/// more than one of a polling vCPU (the medians measured; a running vCPU's where too few
/// polled wake-ups were seen), each miss burns the whole hold, so a hold pays from
/// `hold / (hold + extra)` on. `None` where too few wake-ups of either kind were seen.
///
/// Why not one fixed share: what a hit saves spans two orders of magnitude. In the
/// simulator's fig7 the dedup VM consolidated to 4 of 16 vCPUs on a shared host woke a
/// halted vCPU in 100-1,100 µs against 19 µs polled; its 20 µs holds caught 30-40 % of the
/// idle periods, under the fixed half that stopped them, while holding there was worth 14 %
/// of its throughput (4 vCPUs with and without retention). Where a halted vCPU wakes
/// nearly as fast as a held one, the share needed approaches one and no hold pays.
pub fn hold_break_even_hit_ratio(w: &WakeLatencies, hold_ns: u64) -> Option<f64> {
    // As many wake-ups of each kind as a busy median needs ([`MIN_BUSY_WAKES`]).
    if w.halted.count < MIN_BUSY_WAKES {
        return None;
    }
    let halted = w.halted.quantile_ns(0.5)?;
    let cheap = if w.polling.count >= MIN_BUSY_WAKES {
        w.polling.quantile_ns(0.5)?
    } else if w.running.count >= MIN_BUSY_WAKES {
        w.running.quantile_ns(0.5)?
    } else {
        return None;
    };
    let extra = (halted - cheap).max(0.0);
    let hold = hold_ns as f64;
    Some(if hold + extra > 0.0 {
        hold / (hold + extra)
    } else {
        1.0
    })
}

/// What holding the idle vCPUs could gain at most in this period, as a fraction of the
/// workload's run time: [`consolidation_gain_bound`], except where the wake-ups show that
/// nobody waits for the halted ones. That is where almost none of them had a waker whose
/// vCPU went idle before the wakee ran (`WakeLatencies::halted_waited`, under
/// [`MAX_WAITED_SHARE`]) and most wake-ups found their vCPU running anyway: a thread pool
/// larger than its vCPUs, whose wakers always have another thread to run. There only the
/// waited-for wake-ups count.
///
/// Why: a hold makes a wake-up cheaper, which pays only where the wake-up delays the
/// workload. `sysbench threads` (a lock convoy, 8 threads on 2 vCPUs) woke a halted vCPU
/// once in ten wake-ups, a bound of up to 25 % over all of them, yet no waker ever waited, and
/// holding (Gleaner's, or haltpoll's 200 µs poll set by hand) cost it 4-12 % of its
/// throughput: faster wake-ups only handed its locks over more often. In the ping-pong 99 %
/// of the wakers waited. The second condition keeps the bound whole where every wake-up
/// finds a halted vCPU and the wakers run on: a barrier's last arrival releasing the others,
/// or a thread's own timer, whose latency delays the workload although no waker idles (the
/// policy lab's barrier, lock and timer scenarios on dedicated hosts gain 5-21 % from holds).
pub fn hold_gain_bound(sample: &PeriodSample, break_even_ns: u64) -> Option<f64> {
    let w = sample.wake_latency.as_ref()?;
    Some(hold_gain_bound_of(w, sample.work_ns(), break_even_ns))
}

/// [`hold_gain_bound`] of wake-ups `w` seen over `work` ns of the workload's run time (one
/// period's, or a whole run's pooled, as `Gleaner::why_unchanged` reads them).
pub fn hold_gain_bound_of(w: &WakeLatencies, work: u64, break_even_ns: u64) -> f64 {
    let nobody_waits = (w.halted_waited as f64) < MAX_WAITED_SHARE * w.halted.count as f64
        && w.running.count > w.halted.count;
    let count = if nobody_waits {
        w.halted_waited
    } else {
        w.halted.count
    };
    bound_for(w, count, work, break_even_ns)
}

/// Below this share of halted wake-ups with a waiting waker, nobody is taken to wait for
/// them ([`hold_gain_bound`]): `sysbench threads` had none in any period, the ping-pong 99 %,
/// the policy lab's fine-grained pipeline (the one scenario with both kinds) about 20 %.
pub const MAX_WAITED_SHARE: f64 = 0.05;

/// The bound for `count` of the halted wake-ups in `w`, each costing the halted median's
/// extra over the running one.
fn bound_for(w: &WakeLatencies, count: u64, work: u64, break_even_ns: u64) -> f64 {
    if work == 0 || w.halted.count == 0 || count == 0 {
        return 0.0;
    }
    let halted = w.halted.quantile_ns(0.5).unwrap_or(0.0);
    let extra = if w.running.count >= MIN_BUSY_WAKES {
        (halted - w.running.quantile_ns(0.5).unwrap_or(halted)).max(0.0)
    } else {
        (break_even_ns as f64).min(halted)
    };
    count.min(w.halted.count) as f64 * extra / work as f64
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

    /// Measured on the haltpoll guest: `sysbench threads` in its second (25 ms) period under
    /// `gleaner run --mode full`, 392 halted wake-ups at ~20 us among 3,460 on running vCPUs
    /// at ~2 us, 29 ms of run time (a bound of 0.25, and Gleaner held both vCPUs from the
    /// next period on), no waker waiting in any period under `--observe`; the ping-pong
    /// ~5,000 halted at ~18 us per 100 ms period, 99 % waited for, 73 ms of run time.
    #[test]
    fn a_hold_counts_only_waited_for_wake_ups_where_the_wakers_run_on() {
        let mut convoy = period(29_000_000, &[(392, 20_500)], &[(3_460, 1_800)]);
        let all = consolidation_gain_bound(&convoy, 20_000).unwrap();
        assert!(all > MIN_CONSOLIDATION_GAIN, "{all}");
        assert_eq!(hold_gain_bound(&convoy, 20_000), Some(0.0));
        // A few waited-for ones (under 5 %) count alone.
        convoy.wake_latency.as_mut().unwrap().halted_waited = 10;
        let few = hold_gain_bound(&convoy, 20_000).unwrap();
        assert!(few > 0.0 && few < all / 20.0, "{few}");

        let mut pingpong = period(73_000_000, &[(5_000, 18_000)], &[(40, 1_500)]);
        pingpong.wake_latency.as_mut().unwrap().halted_waited = 4_950;
        let g = hold_gain_bound(&pingpong, 20_000).unwrap();
        assert!(g > 1.0, "{g}");

        // Lab case barrier-200us-16v-dedicated: every wake-up finds a halted vCPU, the last
        // arrival runs on: nobody idles, yet the latency delays the round; the bound stays.
        let barrier = period(1_080_000_000, &[(4_875, 37_000)], &[]);
        assert_eq!(
            hold_gain_bound(&barrier, 20_000),
            consolidation_gain_bound(&barrier, 20_000)
        );
    }

    /// Measured on a guest with cpuidle driver `none` (its host polls a halted vCPU for a
    /// while): the ping-pong's `gleaner run` timeline, one 100 ms period, 12,229 halted
    /// wake-ups at ~6 us, half of them waited for, 204 on running vCPUs at ~9 us, 91 ms of
    /// run time. One vCPU ran it 2.1-2.4x faster (`taskset -c 0`), yet the halted wake-ups'
    /// extra over running ones bounded the gain at 0, and Gleaner never tried it.
    #[test]
    fn a_hand_off_counts_its_whole_latency_where_a_halted_vcpu_wakes_as_fast_as_a_running_one() {
        let mut pingpong = period(91_000_000, &[(12_229, 6_000)], &[(204, 9_000)]);
        let extra_only = consolidation_gain_bound(&pingpong, 21_000).unwrap();
        assert_eq!(extra_only, 0.0);
        let w = pingpong.wake_latency.as_mut().unwrap();
        w.halted_waited = 6_086;
        w.halted_hand_offs = 6_086;
        let g = consolidation_gain_bound(&pingpong, 21_000).unwrap();
        assert!(g > MIN_CONSOLIDATION_GAIN, "{g}");
        // The hold's bound is unchanged: a hold saves only the extra of a halted wake-up.
        assert_eq!(hold_gain_bound(&pingpong, 21_000), Some(0.0));
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

    /// A hold pays from the hit ratio at which its hits' savings cover its misses: 20 µs
    /// holds against halted wake-ups 400 µs dearer than polled ones pay from 1 in 21; where a
    /// halted vCPU wakes in 30 µs against 10 µs on a running one (no polled ones seen), from
    /// half of them; with too few wake-ups of either kind nothing is said.
    #[test]
    fn a_hold_pays_from_the_share_its_hits_save_for_its_misses() {
        // (count, latency) of halted, polled and running wake-ups.
        let wakes = |kinds: [(u64, u64); 3]| {
            let mut w = WakeLatencies::default();
            for (hist, (n, ns)) in [&mut w.halted, &mut w.polling, &mut w.running]
                .into_iter()
                .zip(kinds)
            {
                (0..n).for_each(|_| hist.record(ns));
            }
            w
        };
        let r = hold_break_even_hit_ratio(&wakes([(100, 420_000), (100, 20_000), (0, 0)]), 20_000);
        assert!((0.04..0.06).contains(&r.unwrap()), "{r:?}");
        let r = hold_break_even_hit_ratio(&wakes([(100, 30_000), (0, 0), (100, 10_000)]), 20_000);
        assert!((0.4..0.6).contains(&r.unwrap()), "{r:?}");
        let few = wakes([(100, 30_000), (0, 0), (1, 10_000)]);
        assert_eq!(hold_break_even_hit_ratio(&few, 20_000), None);
    }
}
