//! What an observe-only run would have done: counts of the changes the policy proposed,
//! period by period, and the measured reasons when it proposed none.
//!
//! Exists so that `gleaner run --observe` ends with a preview of full mode a user can act on,
//! rather than a log of hypothetical changes that were never made (and so never judged).

use std::collections::BTreeMap;

use crate::engine::{Decision, EventKind, Gleaner};
use crate::sample::Characteristics;

/// Accumulates the decisions of an observe-only run (the policy's changes forgotten after
/// each period with [`Gleaner::forget_changes`]).
#[derive(Debug, Clone, Default)]
pub struct ObserveSummary {
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

impl ObserveSummary {
    pub fn add(&mut self, d: &Decision, idle_util: f64) {
        self.periods += 1;
        for e in &d.events {
            let entry = self.proposed.entry(kind_name(&e.kind)).or_insert_with(|| (0, e.reason.clone()));
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

    /// The report printed at the end of an observe-only run.
    pub fn render(&self, policy: &Gleaner) -> String {
        let mut out = format!("observe: {} periods measured, nothing changed.\n", self.periods);
        if self.periods == 0 {
            return out;
        }
        let mean = self.mean_characteristics();
        if self.proposed.is_empty() {
            out += "observe: full mode would have changed nothing, because (means over the busy periods):\n";
            let why = policy.why_unchanged(&mean);
            if why.is_empty() {
                out += "  - no single period met the conditions, although their means do (the workload varies)\n";
            }
            for w in why {
                out += &format!("  - {w}\n");
            }
        } else {
            out += "observe: full mode would have, in this many of the periods:\n";
            for (kind, (n, reason)) in &self.proposed {
                out += &format!("  - {kind}: {n} of {} ({:.0} %); first because {reason}\n", self.periods, *n as f64 * 100.0 / self.periods as f64);
            }
        }
        out += &format!(
            "observe: means: utilization {:.2} vCPUs, l_comp {:.1} µs, g_comp {:.1} µs, l_idle {:.1} µs, {:.0} idle periods/s per vCPU\n",
            mean.total_util,
            mean.l_comp_ns / 1e3,
            mean.g_comp_ns / 1e3,
            mean.l_idle_ns / 1e3,
            mean.idle_periods_per_sec
        );
        out
    }
}
