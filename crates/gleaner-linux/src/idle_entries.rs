//! Counting how often each vCPU enters the guest's idle loop.
//!
//! An idle entry is the event behind BWW: on a halted vCPU the next wake-up costs a
//! hypervisor round trip. Where it can be counted depends on the kernel, so the best
//! available source is chosen once and reported:
//! 1. the cpuidle driver's per-state `usage` counters (exact; absent without a driver);
//! 2. the `power:cpu_idle` tracepoint counted per CPU with perf (exact; root or
//!    CAP_PERFMON) — on guests without a cpuidle driver this is the only exact source:
//!    `/proc/timer_list` `.idle_calls` counts the idle loop's passes that try to stop the
//!    tick, which is not every halt (a cpuidle governor may keep the tick: 17 against 90
//!    switches to idle in 2 s on the first test guest, 2026-11-23) and not only halts (a
//!    wake-up may end a pass before its halt: 6,038 passes for 4,494 halts on one CPU of the
//!    haltpoll guest with tests running, all 1,640 of 1,640 on a quiet one, 2026-11-27; the
//!    BPF sampler corrects for this, `crate::sampler`);
//! 3. `/proc/timer_list` `.idle_calls` (root; inexact as above);
//! 4. reschedule interrupts from `/proc/interrupts` (anyone; counts cross-vCPU wakes of
//!    sleeping vCPUs, the closest proxy left).

use std::path::Path;

use perf_event::events::Tracepoint;
use perf_event::{Builder, Counter};
use serde::Serialize;

use crate::procfs::{ProcFs, TimerListCpu};
use crate::sysfs::SysFs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdleEntrySource {
    Cpuidle,
    /// The BPF sampler without a cpuidle driver: the idle loop's passes and time from the
    /// kernel's own per-CPU records (`tick_sched`), times the shares `power:cpu_idle` saw halt
    /// inside its measurement windows (never chosen by [`IdleEntryCounter`]).
    TickSched,
    /// The same records where their passes miss halts (a kernel that counts only the passes
    /// that try to stop the tick): idle time from them, halts from that time over the mean
    /// halt `power:cpu_idle` measured in the windows (never chosen by [`IdleEntryCounter`]).
    TickSchedIdleTime,
    Tracepoint,
    TimerList,
    RescheduleInterrupts,
    Unavailable,
}

impl IdleEntrySource {
    /// Whether counts from this source are complete.
    pub fn exact(self) -> bool {
        matches!(self, IdleEntrySource::Cpuidle | IdleEntrySource::Tracepoint)
    }
}

/// Cumulative idle entries per CPU from the best source available.
pub struct IdleEntryCounter {
    source: IdleEntrySource,
    cpus: Vec<usize>,
    sys: SysFs,
    proc: ProcFs,
    counters: Vec<Counter>,
}

impl IdleEntryCounter {
    pub fn open(sys_root: &Path, proc_root: &Path, cpus: &[usize]) -> Self {
        let mut me = IdleEntryCounter {
            source: IdleEntrySource::Unavailable,
            cpus: cpus.to_vec(),
            sys: SysFs::new(sys_root),
            proc: ProcFs::new(proc_root),
            counters: Vec::new(),
        };
        // A source that cannot be read now (absent, root-only, malformed) is not chosen.
        if !cpus.is_empty()
            && cpus
                .iter()
                .all(|&c| matches!(me.sys.cpuidle_usage(c), Ok(Some(_))))
        {
            me.source = IdleEntrySource::Cpuidle;
        } else if let Some(counters) = me
            .sys
            .tracepoint_id("power", "cpu_idle")
            .ok()
            .flatten()
            .and_then(|id| open_tracepoint(id, cpus).ok())
        {
            me.counters = counters;
            me.source = IdleEntrySource::Tracepoint;
        } else if me
            .timer_list_calls()
            .is_some_and(|m| cpus.iter().all(|c| m.iter().any(|(k, _)| k == c)))
        {
            me.source = IdleEntrySource::TimerList;
        } else if matches!(me.proc.reschedule_interrupts(), Ok(Some(_))) {
            me.source = IdleEntrySource::RescheduleInterrupts;
        }
        me
    }

    pub fn source(&self) -> IdleEntrySource {
        self.source
    }

    /// Cumulative counts, one per CPU given to `open`, in that order. A read that fails
    /// (a file gone since `open`) counts 0 for that CPU.
    pub fn read(&mut self) -> Vec<u64> {
        self.read_with(None)
    }

    /// Like [`IdleEntryCounter::read`], taking the timer-list source's counts from
    /// `timer_list` when the caller has just read it for something else.
    pub fn read_with(&mut self, timer_list: Option<&[TimerListCpu]>) -> Vec<u64> {
        match self.source {
            IdleEntrySource::Cpuidle => self
                .cpus
                .iter()
                .map(|&c| self.sys.cpuidle_usage(c).ok().flatten().unwrap_or(0))
                .collect(),
            // The tracepoint fires on idle entry and again on exit.
            IdleEntrySource::Tracepoint => self
                .counters
                .iter_mut()
                .map(|c| c.read().unwrap_or(0) / 2)
                .collect(),
            IdleEntrySource::TimerList => {
                let m = match timer_list {
                    Some(t) => calls_of(t),
                    None => self.timer_list_calls().unwrap_or_default(),
                };
                self.cpus
                    .iter()
                    .map(|c| m.iter().find(|(k, _)| k == c).map_or(0, |(_, v)| *v))
                    .collect()
            }
            IdleEntrySource::RescheduleInterrupts => {
                let r = self
                    .proc
                    .reschedule_interrupts()
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                self.cpus
                    .iter()
                    .map(|&c| r.get(c).copied().unwrap_or(0))
                    .collect()
            }
            IdleEntrySource::TickSched
            | IdleEntrySource::TickSchedIdleTime
            | IdleEntrySource::Unavailable => vec![0; self.cpus.len()],
        }
    }

    /// `(cpu, idle_calls)` pairs from `/proc/timer_list`; `None` when it cannot be read.
    fn timer_list_calls(&self) -> Option<Vec<(usize, u64)>> {
        Some(calls_of(&self.proc.timer_list().ok().flatten()?))
    }
}

/// `(cpu, idle_calls)` pairs of a parsed `/proc/timer_list`.
fn calls_of(timer_list: &[TimerListCpu]) -> Vec<(usize, u64)> {
    timer_list.iter().map(|c| (c.cpu, c.idle_calls)).collect()
}

/// One system-wide counter of the tracepoint per CPU, enabled at once.
fn open_tracepoint(id: u64, cpus: &[usize]) -> std::io::Result<Vec<Counter>> {
    let mut counters = cpus
        .iter()
        .map(|&cpu| {
            Builder::new(Tracepoint::with_id(id))
                .any_pid()
                .one_cpu(cpu)
                .exclude_kernel(false)
                .build()
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    for c in &mut counters {
        c.enable()?;
    }
    Ok(counters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn falls_back_to_timer_list_idle_calls() {
        let dir = tempfile::tempdir().unwrap();
        let text = "cpu: 0\n  .idle_calls     : 3350\n  .idle_sleeps    : 1427\n  .idle_sleeptime : 5 nsecs\n  .iowait_sleeptime: 0 nsecs\n\
                    cpu: 1\n  .idle_calls     : 2647\n  .idle_sleeps    : 1000\n  .idle_sleeptime : 7 nsecs\n  .iowait_sleeptime: 0 nsecs\n";
        std::fs::write(dir.path().join("timer_list"), text).unwrap();
        let mut c = IdleEntryCounter::open(&dir.path().join("nosys"), dir.path(), &[0, 1]);
        assert_eq!(c.source(), IdleEntrySource::TimerList);
        assert_eq!(c.read(), vec![3350, 2647]);
        // A timer list the caller already read is used instead of reading the file again.
        std::fs::remove_file(dir.path().join("timer_list")).unwrap();
        let read = [TimerListCpu {
            cpu: 1,
            idle_calls: 9,
            idle_sleeps: 0,
            idle_sleeptime_ns: 0,
            iowait_sleeptime_ns: 0,
        }];
        assert_eq!(c.read_with(Some(&read)), vec![0, 9]);
        assert_eq!(c.read(), vec![0, 0], "the file is gone");
        // A CPU the file does not list: the source is not used.
        let c = IdleEntryCounter::open(&dir.path().join("nosys"), dir.path(), &[0, 2]);
        assert_eq!(c.source(), IdleEntrySource::Unavailable);
    }

    #[test]
    fn prefers_cpuidle_counters_and_sums_states() {
        let dir = tempfile::tempdir().unwrap();
        for (cpu, usages) in [(0, [3u64, 4]), (1, [10, 0])] {
            for (i, u) in usages.iter().enumerate() {
                let d = dir
                    .path()
                    .join(format!("devices/system/cpu/cpu{cpu}/cpuidle/state{i}"));
                std::fs::create_dir_all(&d).unwrap();
                std::fs::write(d.join("usage"), format!("{u}\n")).unwrap();
                std::fs::write(d.join("time"), "1000\n").unwrap();
            }
        }
        let mut c = IdleEntryCounter::open(dir.path(), dir.path(), &[0, 1]);
        assert_eq!(c.source(), IdleEntrySource::Cpuidle);
        assert_eq!(c.read(), vec![7, 10]);
    }

    #[test]
    fn falls_back_to_reschedule_interrupts_without_privileged_sources() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("interrupts"),
            "  RES:  5  9  Rescheduling interrupts\n",
        )
        .unwrap();
        let mut c = IdleEntryCounter::open(&dir.path().join("nosys"), dir.path(), &[1]);
        assert_eq!(c.source(), IdleEntrySource::RescheduleInterrupts);
        assert_eq!(c.read(), vec![9]);
    }
}
