//! Builds the policy's [`PeriodSample`] from what Linux exposes.
//!
//! The paper's T_work, T_yield, T_idle, S_work and S_yield (§6) come from different places
//! depending on the machine and privileges, and this module is where those choices are made
//! once, explicitly:
//!
//! * idle time per vCPU: `/proc/timer_list` `idle_sleeptime` + `iowait_sleeptime` (root,
//!   nanoseconds) when readable, else `/proc/stat` idle ticks;
//! * idle entries per vCPU: the best [`IdleEntryCounter`] source;
//! * steal per vCPU: `/proc/stat`;
//! * workload time per vCPU: the cgroup v1 `cpuacct.usage_percpu` when the placement has it,
//!   else the workload's processes' CPU clocks (nanosecond precise) spread over the vCPUs in
//!   proportion to their non-retention busy time;
//! * S_work: voluntary plus involuntary context switches of every workload thread;
//! * runnable wait: sub-samples of the workload threads' run states and CPUs, counting the
//!   moments when threads queue on one active vCPU while another has none of them (PSI of
//!   the whole system would count Gleaner's own SCHED_IDLE threads as waiting, and so would
//!   turn retention off by its mere presence; the system's runnable count would blame the
//!   workload for everyone else's threads).
//!
//! schedstat `run_delay` is not used: it does not see BWW (a wakee is enqueued only after its
//! vCPU left HLT), and on this test bed it is all zeros anyway.

use std::collections::HashMap;
use std::path::PathBuf;

use gleaner_policy::{Cpuset, PeriodSample, VcpuSample};

use crate::error::Result;
use crate::idle_entries::{IdleEntryCounter, IdleEntrySource};
use crate::procfs::ProcFs;
use crate::retention::RetentionCounters;

/// Cumulative counters at one instant.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    /// Per allowed CPU: idle ns, idle entries, steal ns, busy ns (guest time, any task).
    cpus: Vec<(u64, u64, u64, u64)>,
    retention: HashMap<usize, RetentionCounters>,
    percpu_work: Option<Vec<u64>>,
    work_total_ns: u64,
}

/// What the caller knows about the workload at the end of a period.
#[derive(Debug, Clone, Default)]
pub struct WorkloadView {
    /// Processes of the workload (for their CPU clocks).
    pub pids: Vec<u32>,
    /// (pid, tid) of every workload thread (for context switches).
    pub tids: Vec<(u32, u32)>,
    /// Cumulative workload ns per CPU id, when the placement back end measures it.
    pub percpu_work_ns: Option<Vec<u64>>,
    /// Cumulative workload CPU ns from the cgroup, when the back end measures it.
    pub total_work_ns: Option<u64>,
}

/// Threads whose run state is read per sub-sample; a rotating window keeps the cost flat
/// for workloads with hundreds of threads.
const RUNNABLE_WINDOW: usize = 32;

pub struct Sampler {
    procfs: ProcFs,
    cpus: Cpuset,
    entries: IdleEntryCounter,
    precise_idle: bool,
    rotate: usize,
    prev: Option<Snapshot>,
    prev_time_ns: u64,
    /// Per thread (tid, start ticks): cumulative context switches last seen.
    switches: HashMap<(u32, u64), u64>,
    /// Per process (pid, start ticks): cumulative CPU ns last seen.
    clocks: HashMap<(u32, u64), u64>,
    /// CPU ns of workload processes that have exited.
    retired_ns: u64,
    /// Runnable sub-samples this period: (crowded, total).
    crowded: (u32, u32),
}


impl Sampler {
    pub fn new(procfs: ProcFs, sys_root: impl Into<PathBuf>, cpus: Cpuset) -> Self {
        let sys_root = sys_root.into();
        let list: Vec<usize> = cpus.iter().collect();
        let entries = IdleEntryCounter::open(&sys_root, procfs.root(), &list);
        let precise_idle = matches!(procfs.timer_list(), Ok(Some(_)));
        Self { procfs, cpus, entries, precise_idle, rotate: 0, prev: None, prev_time_ns: 0, switches: HashMap::new(), clocks: HashMap::new(), retired_ns: 0, crowded: (0, 0) }
    }

    pub fn idle_source(&self) -> IdleEntrySource {
        self.entries.source()
    }

    /// Called several times per period: are workload threads queueing on one vCPU while
    /// another active vCPU has none of them? That is the moment a retention thread does harm:
    /// an idle vCPU would pull the waiting thread over by new-idle balancing, a held one does
    /// not. Reads the run state and CPU of up to [`RUNNABLE_WINDOW`] threads, rotating
    /// through larger workloads.
    pub fn observe_runnable(&mut self, tids: &[(u32, u32)], active: &Cpuset) {
        if tids.is_empty() || active.len() < 2 {
            return;
        }
        let n = tids.len().min(RUNNABLE_WINDOW);
        let mut per_cpu: HashMap<usize, usize> = HashMap::new();
        let mut seen = 0usize;
        for k in 0..n {
            let (pid, tid) = tids[(self.rotate + k) % tids.len()];
            if let Ok(st) = self.procfs.task_stat(pid, tid) {
                seen += 1;
                if st.state == 'R' {
                    *per_cpu.entry(st.processor).or_default() += 1;
                }
            }
        }
        self.rotate = (self.rotate + n) % tids.len();
        if seen == 0 {
            return;
        }
        self.crowded.1 += 1;
        let queued = active.iter().any(|c| per_cpu.get(&c).copied().unwrap_or(0) >= 2);
        let empty = active.iter().any(|c| per_cpu.get(&c).copied().unwrap_or(0) == 0);
        if queued && empty {
            self.crowded.0 += 1;
        }
    }

    /// Takes a snapshot at `now_ns` and returns the sample for the period since the previous
    /// one (`None` on the first call, which only primes the counters).
    pub fn sample(&mut self, now_ns: u64, work: &WorkloadView, retention: &[(usize, RetentionCounters)]) -> Result<Option<PeriodSample>> {
        let snap = self.snapshot(work, retention)?;
        let (work_switches, work_threads) = self.switch_delta(&work.tids);
        let crowded = std::mem::take(&mut self.crowded);
        let Some(prev) = self.prev.replace(snap.clone()) else {
            self.prev_time_ns = now_ns;
            return Ok(None);
        };
        let period_ns = now_ns.saturating_sub(self.prev_time_ns).max(1);
        self.prev_time_ns = now_ns;

        let mut vcpus = Vec::with_capacity(self.cpus.len());
        let mut spare = Vec::with_capacity(self.cpus.len());
        for (i, cpu) in self.cpus.iter().enumerate() {
            let (idle1, entries1, steal1, busy1) = snap.cpus[i];
            let (idle0, entries0, steal0, busy0) = prev.cpus[i];
            let r1 = snap.retention.get(&cpu).copied().unwrap_or_default();
            let r0 = prev.retention.get(&cpu).copied().unwrap_or_default();
            let yield_ns = r1.yield_ns.saturating_sub(r0.yield_ns);
            let busy = busy1.saturating_sub(busy0);
            spare.push(busy.saturating_sub(yield_ns));
            vcpus.push(VcpuSample {
                cpu,
                work_ns: 0,
                yield_ns,
                idle_ns: idle1.saturating_sub(idle0).min(period_ns),
                steal_ns: steal1.saturating_sub(steal0),
                yield_preemptions: r1.preemptions.saturating_sub(r0.preemptions),
                idle_entries: entries1.saturating_sub(entries0),
            });
        }
        match (&snap.percpu_work, &prev.percpu_work) {
            (Some(now), Some(before)) => {
                for v in &mut vcpus {
                    let a = now.get(v.cpu).copied().unwrap_or(0);
                    let b = before.get(v.cpu).copied().unwrap_or(0);
                    v.work_ns = a.saturating_sub(b).min(period_ns);
                }
            }
            _ => {
                let total = snap.work_total_ns.saturating_sub(prev.work_total_ns);
                spread(total, &spare, period_ns, &mut vcpus);
            }
        }
        let runnable_wait = (crowded.1 > 0).then(|| period_ns * crowded.0 as u64 / crowded.1 as u64);
        Ok(Some(PeriodSample { period_ns, vcpus, work_switches, work_threads, work_runnable_wait_ns: runnable_wait, wake_latency: None, progress: None }))
    }

    fn snapshot(&mut self, work: &WorkloadView, retention: &[(usize, RetentionCounters)]) -> Result<Snapshot> {
        let stat = self.procfs.stat()?;
        let timer = if self.precise_idle { self.procfs.timer_list().ok().flatten() } else { None };
        let entries = self.entries.read();
        let mut cpus = Vec::with_capacity(self.cpus.len());
        for (i, cpu) in self.cpus.iter().enumerate() {
            let times = stat.per_cpu.iter().find(|c| c.cpu == cpu).map(|c| c.times).unwrap_or_default();
            let idle = timer
                .as_ref()
                .and_then(|t| t.iter().find(|c| c.cpu == cpu))
                .map(|c| c.idle_sleeptime_ns + c.iowait_sleeptime_ns)
                .unwrap_or(times.idle_ns + times.iowait_ns);
            cpus.push((idle, entries.get(i).copied().unwrap_or(0), times.steal_ns, times.busy_ns()));
        }
        // The per-CPU figures, when the back end has them, make the total unnecessary.
        let work_total_ns = match (work.total_work_ns, &work.percpu_work_ns) {
            (Some(ns), _) => ns,
            (None, Some(_)) => 0,
            (None, None) => self.process_clocks(&work.pids),
        };
        Ok(Snapshot {
            cpus,
            retention: retention.iter().copied().collect(),
            percpu_work: work.percpu_work_ns.clone(),
            work_total_ns,
        })
    }

    /// Sum of the workload processes' CPU time, kept cumulative across processes that exit
    /// (their last reading is folded into `retired_ns`, so a fork-heavy workload does not
    /// make this map grow) and immune to PID reuse.
    fn process_clocks(&mut self, pids: &[u32]) -> u64 {
        let mut seen = HashMap::with_capacity(pids.len());
        for &pid in pids {
            let Ok(start) = self.procfs.process_start_time(pid) else { continue };
            if let Some(ns) = process_cpu_ns(pid) {
                seen.insert((pid, start), ns);
            }
        }
        for (key, ns) in self.clocks.drain() {
            if !seen.contains_key(&key) {
                self.retired_ns += ns;
            }
        }
        self.clocks = seen;
        self.retired_ns + self.clocks.values().sum::<u64>()
    }

    /// Context switches of the workload's threads since the last call, and the thread count.
    fn switch_delta(&mut self, tids: &[(u32, u32)]) -> (u64, u64) {
        let mut delta = 0;
        let mut seen = HashMap::with_capacity(tids.len());
        for &(pid, tid) in tids {
            let Ok(stat) = self.procfs.task_stat(pid, tid) else { continue };
            let Ok(status) = self.procfs.task_status(pid, tid) else { continue };
            let total = status.voluntary_ctxt_switches + status.nonvoluntary_ctxt_switches;
            let key = (tid, stat.start_ticks);
            // A thread seen for the first time contributes nothing this period: its past
            // switches happened before we were watching.
            if let Some(&before) = self.switches.get(&key) {
                delta += total.saturating_sub(before);
            }
            seen.insert(key, total);
        }
        let n = seen.len() as u64;
        self.switches = seen;
        (delta, n)
    }
}

/// Spreads `total` workload ns over vCPUs in proportion to their non-retention busy time,
/// never more than a period per vCPU.
fn spread(total: u64, spare: &[u64], period_ns: u64, vcpus: &mut [VcpuSample]) {
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

/// CPU time of a whole process in ns, from its POSIX CPU clock (any process may be read).
fn process_cpu_ns(pid: u32) -> Option<u64> {
    gleaner_sys::clock::process_cpu_ns(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exited_processes_keep_counting_without_being_remembered() {
        let mut s = Sampler::new(ProcFs::new("/proc"), "/nonexistent-sys", Cpuset::first_n(1));
        let me = std::process::id();
        let before = s.process_clocks(&[me]);
        assert!(before > 0);
        // The process is gone from the workload: its time stays in the total, not in the map.
        let after = s.process_clocks(&[]);
        assert_eq!(after, before);
        assert!(s.clocks.is_empty());
    }

    #[test]
    fn spreads_work_by_spare_busy_time() {
        let mut v = vec![VcpuSample { cpu: 0, ..Default::default() }, VcpuSample { cpu: 1, ..Default::default() }];
        spread(90, &[20, 10], 1000, &mut v);
        assert_eq!((v[0].work_ns, v[1].work_ns), (60, 30));
        spread(5000, &[0, 0], 1000, &mut v);
        assert_eq!((v[0].work_ns, v[1].work_ns), (1000, 1000));
    }

}
