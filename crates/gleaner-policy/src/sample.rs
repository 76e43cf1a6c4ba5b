//! What the policy is told each period, and the workload characteristics derived from it.
//!
//! Exists so that the daemon (reading procfs/cgroups) and the simulator (counting its own
//! events) feed the policy the very same numbers. Everything is integer nanoseconds and event
//! counts over one period; nothing here reads a clock.

use serde::{Deserialize, Serialize};

/// One vCPU's counters over one period.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuSample {
    pub cpu: usize,
    /// Time the workload's threads ran on this vCPU (part of T_work).
    pub work_ns: u64,
    /// Time Gleaner's retention thread spun on this vCPU (part of T_yield).
    pub yield_ns: u64,
    /// Time the vCPU was idle in the guest kernel: halted, or polling in cpuidle.
    pub idle_ns: u64,
    /// Time stolen by the hypervisor (per-CPU steal in /proc/stat).
    pub steal_ns: u64,
    /// Times the retention thread lost the vCPU to another thread: each is the end of an
    /// idle period that retention absorbed (part of S_yield).
    pub yield_preemptions: u64,
    /// Times the guest kernel entered its idle loop on this vCPU: each is an idle period that
    /// retention did not absorb (a halt, or a poll when in-kernel polling retains).
    pub idle_entries: u64,
}

impl VcpuSample {
    /// Idle periods on this vCPU: those absorbed by retention plus those the kernel saw.
    pub fn idle_periods(&self) -> u64 {
        self.yield_preemptions + self.idle_entries
    }

    /// Idle time as Gleaner understands it: time not spent on useful work, whether the
    /// retention thread spun or the kernel idled (T_idle of §6).
    pub fn idle_time_ns(&self) -> u64 {
        self.yield_ns + self.idle_ns
    }
}

/// Everything measured in one period.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodSample {
    /// Length of the period the counters cover.
    pub period_ns: u64,
    /// One entry per vCPU the workload is allowed to use, active or not.
    pub vcpus: Vec<VcpuSample>,
    /// Context switches of the workload's threads, voluntary plus involuntary (S_work).
    pub work_switches: u64,
    /// Threads in the workload at the end of the period.
    pub work_threads: u64,
    /// Time workload threads queued on one active vCPU while another active vCPU had none of
    /// them (estimated from sub-samples of the threads' run states); `None` if unknown.
    pub work_runnable_wait_ns: Option<u64>,
}

/// The paper's workload characteristics (§5, §6), averaged over the active vCPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Characteristics {
    /// l_comp: computation on a vCPU between two idle periods, T_work / S_yield.
    pub l_comp_ns: f64,
    /// g_comp: computation in a thread between two synchronization points, T_work / S_work.
    pub g_comp_ns: f64,
    /// l_idle: average length of an idle period, T_idle / S_yield.
    pub l_idle_ns: f64,
    /// Workload utilization of each active vCPU, 0..=1, indexed like `PeriodSample::vcpus`
    /// filtered to the active set.
    pub max_vcpu_util: f64,
    /// Workload utilization summed over active vCPUs (1.0 = one vCPU's worth).
    pub total_util: f64,
    /// Idle periods per second per active vCPU.
    pub idle_periods_per_sec: f64,
    /// Steal as a fraction of the period, averaged over active vCPUs.
    pub steal_fraction: f64,
    /// Fraction of the period some workload thread waited for a CPU (0 if unknown).
    pub runnable_wait_fraction: f64,
}
