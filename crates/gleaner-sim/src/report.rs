//! What a run produces: per-VM run time / throughput, wake latencies, vCPU switches, idle
//! transitions, steal, and weighted speedup; as JSON and as a summary table.
//!
//! Weighted speedup (paper §7.2.1). For each VM i, its speedup in the shared run relative to
//! running alone on the same host with the same seed is
//!   s_i = solo_run_time_i / shared_run_time_i          (a VM with finite work), or
//!   s_i = shared_throughput_i / solo_throughput_i      (an endless VM, e.g. matmul, MySQL),
//! and the weighted speedup of the run is Σ_i s_i. With N VMs it is N when sharing costs
//! nothing, 1 when the host is simply time-shared, and below 1 when sharing destroys work.
//! The paper's Figure 7(b) normalizes to the Gleaner-off run instead; a sweep over the guest
//! policy reports that too (`relative_to_first`: mean over VMs of each VM's speedup relative
//! to the sweep's first value).
//!
//! Latencies go into a log-linear histogram (32 sub-buckets per power of two, ≤ 3 % error) so
//! memory stays constant however many wakeups a run has; min, max and mean are exact.

use serde::Serialize;

use crate::host::HostStats;
use crate::time::{fmt_ns, Ns};

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;

#[derive(Debug, Clone, Default)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    min: Ns,
    max: Ns,
}

fn bucket_of(v: Ns) -> usize {
    if v < SUB {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros() - SUB_BITS;
    let sub = (v >> exp) - SUB;
    ((exp as u64 + 1) * SUB + sub) as usize
}

fn bucket_range(b: usize) -> (Ns, Ns) {
    let b = b as u64;
    if b < SUB {
        return (b, b + 1);
    }
    let exp = b / SUB - 1;
    let sub = b % SUB;
    let lo = (SUB + sub) << exp;
    (lo, lo + (1 << exp))
}

impl Histogram {
    pub fn record(&mut self, v: Ns) {
        let b = bucket_of(v);
        if self.counts.len() <= b {
            self.counts.resize(b + 1, 0);
        }
        self.counts[b] += 1;
        self.min = if self.total == 0 { v } else { self.min.min(v) };
        self.max = self.max.max(v);
        self.total += 1;
        self.sum += v as u128;
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The q-quantile (0..=1), as the midpoint of its bucket clamped to [min, max].
    pub fn quantile(&self, q: f64) -> Ns {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, hi) = bucket_range(b);
                return (lo + (hi - lo) / 2).clamp(self.min, self.max);
            }
        }
        self.max
    }

    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            count: self.total,
            mean_ns: if self.total == 0 {
                0.0
            } else {
                self.sum as f64 / self.total as f64
            },
            min_ns: self.min,
            p50_ns: self.quantile(0.5),
            p90_ns: self.quantile(0.9),
            p99_ns: self.quantile(0.99),
            max_ns: self.max,
            buckets: self
                .counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(b, &c)| {
                    let (lo, hi) = bucket_range(b);
                    [lo, hi, c]
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ns: f64,
    pub min_ns: Ns,
    pub p50_ns: Ns,
    pub p90_ns: Ns,
    pub p99_ns: Ns,
    pub max_ns: Ns,
    /// Non-empty buckets as [low_ns, high_ns (exclusive), count].
    pub buckets: Vec<[u64; 3]>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VcpuReport {
    pub vcpu: usize,
    /// Times the host switched this vCPU onto a pCPU.
    pub switches_in: u64,
    pub preemptions: u64,
    pub migrations: u64,
    /// Halts: the vCPU left its pCPU because the guest had nothing to run.
    pub halts: u64,
    /// Idle-loop entries not absorbed by retention (halts and polls).
    pub idle_entries: u64,
    /// Idle periods that retention absorbed (the yielding thread lost the vCPU to work).
    pub yield_preemptions: u64,
    pub ipis_received: u64,
    pub ple_exits: u64,
    pub work_ns: Ns,
    pub yield_ns: Ns,
    pub idle_ns: Ns,
    pub steal_ns: Ns,
    /// Host-side switch-in costs (VM entry, cache refill, pause-loop exits).
    pub overhead_ns: Ns,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VmReport {
    pub name: String,
    pub guest_policy: String,
    /// Every thread with finite work finished.
    pub finished: bool,
    /// Time at which the last finite thread finished.
    pub run_time_ns: Option<Ns>,
    /// Completed program iterations (items, transactions, chunks, phases...).
    pub iterations: u64,
    /// Compute bursts the workload completed, in ns: its useful work whatever its kind.
    pub completed_work_ns: Ns,
    /// Iterations per second over the run time (finished) or the whole run (endless).
    pub throughput_per_s: f64,
    pub wake_latency: LatencySummary,
    pub vcpu_switches: u64,
    /// Idle transitions: halts plus absorbed idle periods, the paper's Figure 1 x-axis.
    pub idle_transitions: u64,
    pub steal_ns: Ns,
    pub work_ns: Ns,
    pub thread_switches: u64,
    pub vcpus: Vec<VcpuReport>,
    /// Number of active vCPUs after each Gleaner period.
    pub active_vcpus: Vec<usize>,
    /// vCPUs with retention on after each Gleaner period.
    pub retaining_vcpus: Vec<usize>,
    /// Gleaner's decisions with their reasons, as the daemon logs them.
    pub policy_events: Vec<gleaner_policy::PolicyEvent>,
    /// The workload characteristics Gleaner measured in its last period.
    pub last_characteristics: Option<gleaner_policy::Characteristics>,
    /// Solo baseline and this VM's speedup against it (when weighted speedup is on).
    pub solo_run_time_ns: Option<Ns>,
    pub solo_throughput_per_s: Option<f64>,
    pub speedup: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PcpuReport {
    pub pcpu: usize,
    pub busy_ns: Ns,
}

#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    pub scenario: String,
    pub seed: u64,
    pub host_policy: String,
    pub pcpus: usize,
    pub simulated_ns: Ns,
    pub events: u64,
    pub host: HostStats,
    pub pcpu_busy_ns: Vec<Ns>,
    pub vms: Vec<VmReport>,
    pub weighted_speedup: Option<f64>,
}

impl SimReport {
    /// Speedup of each VM relative to the same VM in `base`, averaged over VMs (Figure 7(b)).
    pub fn relative_to(&self, base: &SimReport) -> Option<f64> {
        if self.vms.len() != base.vms.len() {
            return None;
        }
        let mut sum = 0.0;
        for (now, then) in self.vms.iter().zip(&base.vms) {
            sum += speedup_of(now, then.run_time_ns, then.throughput_per_s)?;
        }
        Some(sum / self.vms.len() as f64)
    }
}

/// Speedup of `vm` against a baseline run time (finite work) or throughput (endless).
pub fn speedup_of(vm: &VmReport, base_time: Option<Ns>, base_tput: f64) -> Option<f64> {
    match (vm.run_time_ns, base_time) {
        (Some(now), Some(then)) if now > 0 => Some(then as f64 / now as f64),
        (None, None) if base_tput > 0.0 => Some(vm.throughput_per_s / base_tput),
        _ => None,
    }
}

/// The summary table: one row per VM (per sweep value when `label` is given).
pub fn table(rows: &[(Option<String>, &SimReport, Option<f64>)]) -> String {
    let mut out = String::new();
    let header = [
        "sweep",
        "vm",
        "guest",
        "host",
        "run time",
        "thruput/s",
        "wake p50",
        "wake p99",
        "vcpu sw",
        "idle tr",
        "steal",
        "speedup",
        "wspeedup",
        "rel",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for (label, r, rel) in rows {
        for (i, vm) in r.vms.iter().enumerate() {
            let first = i == 0;
            let total = r.simulated_ns.max(1) * vm.vcpus.len() as u64;
            lines.push(vec![
                label.clone().unwrap_or_else(|| "-".into()),
                vm.name.clone(),
                vm.guest_policy.clone(),
                r.host_policy.clone(),
                match vm.run_time_ns {
                    Some(t) => fmt_ns(t as f64),
                    None if vm.finished => "-".into(),
                    None => "(endless)".into(),
                },
                format!("{:.1}", vm.throughput_per_s),
                fmt_ns(vm.wake_latency.p50_ns as f64),
                fmt_ns(vm.wake_latency.p99_ns as f64),
                vm.vcpu_switches.to_string(),
                vm.idle_transitions.to_string(),
                format!("{:.1}%", 100.0 * vm.steal_ns as f64 / total as f64),
                vm.speedup.map_or("-".into(), |s| format!("{s:.3}")),
                if first {
                    r.weighted_speedup.map_or("-".into(), |s| format!("{s:.3}"))
                } else {
                    String::new()
                },
                if first {
                    rel.map_or("-".into(), |s| format!("{s:.3}"))
                } else {
                    String::new()
                },
            ]);
        }
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for line in lines {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:>w$}", w = *w))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_with_small_error() {
        for v in [0u64, 1, 31, 32, 33, 1000, 37_000, 96_000, 1 << 40] {
            let (lo, hi) = bucket_range(bucket_of(v));
            assert!(lo <= v && v < hi, "{v} not in [{lo}, {hi})");
            assert!((hi - lo) as f64 <= (v as f64 / 32.0).max(1.0) + 1.0);
        }
    }

    #[test]
    fn quantiles_of_a_known_sample() {
        let mut h = Histogram::default();
        for v in 1..=100u64 {
            h.record(v * 1000);
        }
        let s = h.summary();
        assert_eq!(s.count, 100);
        assert_eq!(s.min_ns, 1000);
        assert_eq!(s.max_ns, 100_000);
        assert!((s.mean_ns - 50_500.0).abs() < 1e-9);
        assert!(
            (s.p50_ns as f64 - 50_000.0).abs() < 50_000.0 * 0.04,
            "{}",
            s.p50_ns
        );
        assert!(
            (s.p99_ns as f64 - 99_000.0).abs() < 99_000.0 * 0.04,
            "{}",
            s.p99_ns
        );
        let mut one = Histogram::default();
        one.record(37_000);
        assert_eq!(one.quantile(0.5), 37_000, "clamped to the exact min/max");
    }
}
