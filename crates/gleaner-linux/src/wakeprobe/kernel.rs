//! The probe's own wakes timed in the kernel, by the BPF sampler `gleaner run` uses.
//!
//! Exists so that the probe and a workload's live histogram can be compared like with like.
//! The probe's own clock runs from before the waker's `FUTEX_WAKE` to the wakee's return to
//! user space; the sampler's from `sched_waking` to the wakee's switch-in, which leaves out
//! the waker's system call entry and the wakee's way back out of the kernel (about 1 µs on
//! the haltpoll guest). With `--in-kernel` each probe point also reports the sampler's
//! latency for the same wakes, so a disagreement between the live histogram and the probe
//! is about the vCPU states, not about two clocks.
//!
//! Which wakes: the probe's process is the sampler's workload. The waker's own wakes from its
//! gap timer switch in on the waker's vCPU, so on another vCPU only the wakee's wakes are
//! counted; on the same vCPU (setting A), the timer wakes find that vCPU idle and the wakee's
//! find the waker running, so A takes the `running` wakes.

use serde::{Deserialize, Serialize};

use super::{ProbeConfig, Setting};
use crate::bpf::{CpuCounters, KernelSampler};
use crate::sampler::{load_kernel_sampler, wake_delta};

/// One probe point's wakes as the BPF sampler timed them (those that found the wakee's vCPU
/// in the setting's state; the yield thread of B is not Gleaner's, so it counts as running).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelTiming {
    /// Median `sched_waking` to switch-in, ns, from the sampler's histogram: within its
    /// bucket's width (at most 25 %) of the exact median.
    pub p50_ns: u64,
    /// Mean, ns: exact (the program sums the latencies), but moved by rare long wakes.
    pub mean_ns: u64,
    /// Wakes timed.
    pub count: u64,
    /// How many of them found the wakee's vCPU running, polling or halted (the sampler's
    /// classification, as in `gleaner status`).
    pub running: u64,
    pub polling: u64,
    pub halted: u64,
}

/// The loaded sampler, attached for the whole probe.
pub(super) struct KernelClock {
    sampler: KernelSampler,
}

impl KernelClock {
    /// Loads the sampler with this process as its workload and its scheduler programs
    /// attached throughout; the error says why it cannot (no root, no BTF).
    pub fn open(cfg: &ProbeConfig) -> Result<Self, String> {
        let mut sampler = load_kernel_sampler(&cfg.sysfs_root).map_err(|e| e.to_string())?;
        sampler.set_workload(&[std::process::id()]);
        sampler
            .set_scheduler_programs(true)
            .map_err(|e| e.to_string())?;
        sampler.open_window_with_budget(gleaner_sys::clock::monotonic_ns(), None, u64::MAX);
        Ok(Self { sampler })
    }

    /// Every CPU's cumulative counters (empty if the map cannot be read).
    pub fn read(&self) -> Vec<CpuCounters> {
        self.sampler.read().unwrap_or_default()
    }

    /// The wakes of `setting`'s wakee between two reads.
    pub fn timing(
        before: &[CpuCounters],
        after: &[CpuCounters],
        setting: Setting,
        wakee_cpu: usize,
    ) -> Option<KernelTiming> {
        let (a, b) = (after.get(wakee_cpu)?, before.get(wakee_cpu)?);
        let d = wake_delta(&a.wake, &b.wake);
        // The state the setting puts the wakee's vCPU in: wakes that found it otherwise (a
        // kernel thread happened to run there) are counted but not timed.
        let timed = match setting {
            Setting::SameVcpu | Setting::BusyYield => &d.running,
            Setting::BusyPoll => &d.polling,
            Setting::Halted => &d.halted,
        };
        Some(KernelTiming {
            p50_ns: timed.quantile_ns(0.5)?.round() as u64,
            mean_ns: timed.mean_ns()?.round() as u64,
            count: timed.count,
            running: d.running.count,
            polling: d.polling.count,
            halted: d.halted.count,
        })
    }
}
