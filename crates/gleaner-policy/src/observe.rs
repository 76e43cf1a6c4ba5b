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
    /// Sum of the characteristics over non-idle periods, for the average in the report.
    sum: Characteristics,
    busy_periods: u64,
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
        let c = &d.characteristics;
        if c.total_util >= idle_util {
            self.busy_periods += 1;
            let s = &mut self.sum;
            s.l_comp_ns += c.l_comp_ns;
            s.g_comp_ns += c.g_comp_ns;
            s.l_idle_ns += c.l_idle_ns;
            s.max_vcpu_util += c.max_vcpu_util;
            s.total_util += c.total_util;
            s.idle_periods_per_sec += c.idle_periods_per_sec;
            s.steal_fraction += c.steal_fraction;
            s.runnable_wait_fraction += c.runnable_wait_fraction;
        }
    }

    /// Mean characteristics over the periods in which the workload was not idle.
    pub fn mean_characteristics(&self) -> Characteristics {
        let n = self.busy_periods.max(1) as f64;
        let s = &self.sum;
        Characteristics {
            l_comp_ns: s.l_comp_ns / n,
            g_comp_ns: s.g_comp_ns / n,
            l_idle_ns: s.l_idle_ns / n,
            max_vcpu_util: s.max_vcpu_util / n,
            total_util: s.total_util / n,
            idle_periods_per_sec: s.idle_periods_per_sec / n,
            steal_fraction: s.steal_fraction / n,
            runnable_wait_fraction: s.runnable_wait_fraction / n,
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
        let mean = self.mean_characteristics();
        if self.proposed.is_empty() {
            out += &format!(
                "{tag}: {} {would}, because (means over the busy periods):\n",
                if observed { "full mode" } else { "Gleaner" }
            );
            let why = policy.why_unchanged(&mean);
            if why.is_empty() {
                out += "  - no single period met the conditions, although their means do (the workload varies)\n";
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
            "{tag}: means: utilization {:.2} vCPUs, l_comp {:.1} µs, g_comp {:.1} µs, l_idle {:.1} µs, {:.0} idle periods/s per vCPU\n",
            mean.total_util,
            mean.l_comp_ns / 1e3,
            mean.g_comp_ns / 1e3,
            mean.l_idle_ns / 1e3,
            mean.idle_periods_per_sec
        );
        out
    }
}
