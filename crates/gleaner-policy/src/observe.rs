//! What a run did, or an observe-only run would have done: counts of the changes the policy
//! made or proposed, period by period, and the measured reasons when there were none.
//!
//! Exists so that every `gleaner run` ends by telling the user what Gleaner did and why, and
//! `gleaner run --observe` with a preview of full mode a user can act on, rather than a log
//! of hypothetical changes that were never made (and so never judged).

use std::collections::BTreeMap;

use crate::engine::{Decision, EventKind, Gleaner};
use crate::sample::Characteristics;

/// Accumulates the decisions of a run; in an observe-only run the policy's changes are
/// forgotten after each period with [`Gleaner::forget_changes`].
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    periods: u64,
    /// Periods in which the policy proposed each kind of change, with the first reason given.
    proposed: BTreeMap<&'static str, (u64, String)>,
    /// The characteristics of every `2^stride_log2`-th non-idle period, for the medians in
    /// the report ([`KEPT_PERIODS`]).
    kept: Vec<Characteristics>,
    stride_log2: u32,
    busy_periods: u64,
}

/// Busy periods kept for the report's medians at most: evenly spread over the run (every
/// other one is dropped and the stride doubles when the store fills), so that a daemon
/// attached for weeks keeps 256 KiB rather than one entry per period. Medians, not means: a
/// ratio per period (l_comp is run time per idle entry) is wild in a period of a few entries,
/// and two start-up periods of a ping-pong under `run --observe` (25 ms each, the vCPUs busy
/// as it started: l_comp 2.4 and 3.4 ms) made the mean l_comp of a 2 s run 247 µs against a
/// steady 16 µs (2026-11-27), and the reasons the report gave were drawn from it.
pub const KEPT_PERIODS: usize = 4096;

/// The median of `values` (the mean of the middle two for an even count; 0 for none).
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The lower median of `values` (the lower of the middle two for an even count; 0 for none):
/// where a test must not pass on a mean that lands exactly on its limit.
pub fn lower_median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[(values.len() - 1) / 2]
}

fn kind_name(kind: &EventKind) -> &'static str {
    match kind {
        EventKind::Deactivate { .. } => "deactivate a vCPU (consolidate)",
        EventKind::Rollback { .. } => "roll a consolidation back",
        EventKind::MajorChange => "reactivate every vCPU (major change)",
        EventKind::RetentionOn { .. } => "hold idle vCPUs (retention on)",
        EventKind::RetentionOff { .. } => "stop holding idle vCPUs",
    }
}

impl RunSummary {
    pub fn add(&mut self, d: &Decision, idle_util: f64) {
        self.periods += 1;
        for e in &d.events {
            let entry = self
                .proposed
                .entry(kind_name(&e.kind))
                .or_insert_with(|| (0, e.reason.clone()));
            entry.0 += 1;
        }
        let c = d.characteristics;
        if c.total_util >= idle_util {
            if self.busy_periods.is_multiple_of(1u64 << self.stride_log2) {
                self.kept.push(c);
                if self.kept.len() >= KEPT_PERIODS {
                    self.kept = self.kept.iter().copied().step_by(2).collect();
                    self.stride_log2 += 1;
                }
            }
            self.busy_periods += 1;
        }
    }

    /// Each characteristic's median over the periods in which the workload was not idle
    /// (over an even spread of them in a long run, [`KEPT_PERIODS`]); all 0 if there were
    /// none.
    pub fn median_characteristics(&self) -> Characteristics {
        let of = |f: fn(&Characteristics) -> f64| median(self.kept.iter().map(f).collect());
        Characteristics {
            l_comp_ns: of(|c| c.l_comp_ns),
            g_comp_ns: of(|c| c.g_comp_ns),
            l_idle_ns: of(|c| c.l_idle_ns),
            max_vcpu_util: of(|c| c.max_vcpu_util),
            total_util: of(|c| c.total_util),
            idle_periods_per_sec: of(|c| c.idle_periods_per_sec),
            steal_fraction: of(|c| c.steal_fraction),
            runnable_wait_fraction: of(|c| c.runnable_wait_fraction),
            l_wake_path_ns: of(|c| c.l_wake_path_ns),
        }
    }

    /// The report printed at the end of a run; `observed` for an observe-only run, whose
    /// changes were proposed, not made.
    pub fn render(&self, policy: &Gleaner, observed: bool) -> String {
        let (tag, verb, would) = if observed {
            ("observe", "would have", "would have changed nothing")
        } else {
            ("gleaner", "did", "changed nothing")
        };
        let mut out = format!(
            "{tag}: {} periods measured{}.\n",
            self.periods,
            if observed { ", nothing changed" } else { "" }
        );
        if self.periods == 0 {
            return out;
        }
        let median = self.median_characteristics();
        if self.proposed.is_empty() {
            out += &format!(
                "{tag}: {} {would}, because (medians over the busy periods):\n",
                if observed { "full mode" } else { "Gleaner" }
            );
            let why = policy.why_unchanged(&median);
            if why.is_empty() {
                out += "  - no single period met the conditions, although their medians do (the workload varies)\n";
            }
            for w in why {
                out += &format!("  - {w}\n");
            }
        } else {
            out += &format!(
                "{tag}: {} {verb}, in this many of the periods:\n",
                if observed { "full mode" } else { "Gleaner" }
            );
            for (kind, (n, reason)) in &self.proposed {
                out += &format!(
                    "  - {kind}: {n} of {} ({:.0} %); first because {reason}\n",
                    self.periods,
                    *n as f64 * 100.0 / self.periods as f64
                );
            }
        }
        out += &format!(
            "{tag}: medians: utilization {:.2} vCPUs, l_comp {:.1} µs, g_comp {:.1} µs, l_idle {:.1} µs, {:.0} idle periods/s per vCPU\n",
            median.total_util,
            median.l_comp_ns / 1e3,
            median.g_comp_ns / 1e3,
            median.l_idle_ns / 1e3,
            median.idle_periods_per_sec
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn period(l_comp_ns: f64, total_util: f64) -> Characteristics {
        Characteristics {
            l_comp_ns,
            total_util,
            ..Characteristics::default()
        }
    }

    fn decision() -> Decision {
        Decision {
            active: crate::Cpuset::first_n(2),
            retention: Vec::new(),
            events: Vec::new(),
            characteristics: Characteristics::default(),
            rho: 1.0,
            eta: 1.0,
            retention_timeout: crate::RetentionTimeout::default(),
            fresh_rates_wanted: false,
        }
    }

    /// Two start-up periods of a ping-pong whose l_comp is 100 times its steady one move the
    /// report's figure by nothing, where they moved the mean fifteenfold; idle periods are
    /// left out.
    #[test]
    fn the_report_gives_medians_of_the_busy_periods() {
        let mut s = RunSummary::default();
        let mut d = decision();
        for c in [period(2.4e6, 1.0), period(3.4e6, 1.0), period(1e9, 0.001)]
            .into_iter()
            .chain((0..18).map(|i| period(16e3 + i as f64, 0.7)))
        {
            d.characteristics = c;
            s.add(&d, 0.02);
        }
        let m = s.median_characteristics();
        assert!((16e3..16.02e3).contains(&m.l_comp_ns), "{}", m.l_comp_ns);
        assert_eq!(m.total_util, 0.7);
        assert_eq!(s.busy_periods, 20);
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0]), 2.0);
    }

    /// A run of many periods keeps at most KEPT_PERIODS of them, spread evenly: the median of
    /// a value that grows steadily over the run is still its middle.
    #[test]
    fn a_long_run_keeps_a_bounded_even_spread_of_periods() {
        let mut s = RunSummary::default();
        let mut d = decision();
        let n = 3 * KEPT_PERIODS as u64 + 17;
        for i in 0..n {
            d.characteristics = period(i as f64, 0.5);
            s.add(&d, 0.02);
        }
        assert!(s.kept.len() < KEPT_PERIODS, "{}", s.kept.len());
        assert!(s.kept.len() > KEPT_PERIODS / 4, "{}", s.kept.len());
        let m = s.median_characteristics().l_comp_ns;
        let middle = n as f64 / 2.0;
        assert!((m - middle).abs() < 0.01 * n as f64, "{m} against {middle}");
    }
}
