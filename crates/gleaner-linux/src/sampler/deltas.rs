//! The arithmetic between two reads: counter deltas of the BPF sampler, and the workload's
//! CPU time per vCPU.
//!
//! Apart from the samplers because it is pure (numbers in, numbers out) and shared by both,
//! and so tested with made-up counters.

use gleaner_policy::{VcpuSample, WakeLatencies};

use super::Snapshot;
use crate::bpf::CpuCounters;

/// The per-CPU counters of the BPF sampler between two reads, and their wake-up histograms
/// merged over the vCPUs in `cpus`.
pub fn kernel_delta(now: &[CpuCounters], before: &[CpuCounters], cpu: usize) -> CpuCounters {
    let a = now.get(cpu).cloned().unwrap_or_default();
    let b = before.get(cpu).cloned().unwrap_or_default();
    CpuCounters {
        idle_entries: a.idle_entries.saturating_sub(b.idle_entries),
        idle_ns: a.idle_ns.saturating_sub(b.idle_ns),
        work_ns: a.work_ns.saturating_sub(b.work_ns),
        work_switches: a.work_switches.saturating_sub(b.work_switches),
        crowded_wait_ns: a.crowded_wait_ns.saturating_sub(b.crowded_wait_ns),
        crowded_waits: a.crowded_waits.saturating_sub(b.crowded_waits),
        events: a.events.saturating_sub(b.events),
        wake: wake_delta(&a.wake, &b.wake),
    }
}

/// `now − before` of cumulative wake-latency histograms.
pub fn wake_delta(now: &WakeLatencies, before: &WakeLatencies) -> WakeLatencies {
    let sub = |a: &gleaner_policy::LatencyHistogram, b: &gleaner_policy::LatencyHistogram| {
        let mut h = a.clone();
        for (x, y) in h.buckets.iter_mut().zip(b.buckets.iter()) {
            *x = x.saturating_sub(*y);
        }
        h.count = a.count.saturating_sub(b.count);
        h.sum_ns = a.sum_ns.saturating_sub(b.sum_ns);
        h
    };
    WakeLatencies {
        running: sub(&now.running, &before.running),
        polling: sub(&now.polling, &before.polling),
        halted: sub(&now.halted, &before.halted),
        halted_waited: now.halted_waited.saturating_sub(before.halted_waited),
        halted_hand_offs: now.halted_hand_offs.saturating_sub(before.halted_hand_offs),
        idle_age: sub(&now.idle_age, &before.idle_age),
    }
}

/// The workload's CPU time per vCPU between two snapshots: the cgroup's per-CPU usage where
/// the placement has one, else the processes' total spread over the vCPUs' busy time
/// (`spare`: busy minus retention, per vCPU).
pub(super) fn work_between(
    prev: &Snapshot,
    now: &Snapshot,
    spare: &[u64],
    period_ns: u64,
    vcpus: &mut [VcpuSample],
) {
    match (&now.percpu_work, &prev.percpu_work) {
        (Some(after), Some(before)) => {
            for v in vcpus.iter_mut() {
                let a = after.get(v.cpu).copied().unwrap_or(0);
                let b = before.get(v.cpu).copied().unwrap_or(0);
                v.work_ns = a.saturating_sub(b).min(period_ns);
            }
        }
        _ => {
            let total = now.work_total_ns.saturating_sub(prev.work_total_ns);
            spread(total, spare, period_ns, vcpus);
        }
    }
}

/// Spreads `total` workload ns over vCPUs in proportion to their non-retention busy time,
/// never more than a period per vCPU.
pub(super) fn spread(total: u64, spare: &[u64], period_ns: u64, vcpus: &mut [VcpuSample]) {
    let sum: u64 = spare.iter().sum();
    if sum == 0 {
        let n = vcpus.len().max(1) as u64;
        for v in vcpus.iter_mut() {
            v.work_ns = (total / n).min(period_ns);
        }
        return;
    }
    for (v, s) in vcpus.iter_mut().zip(spare) {
        v.work_ns = ((total as u128 * *s as u128 / sum as u128) as u64).min(period_ns);
    }
}
