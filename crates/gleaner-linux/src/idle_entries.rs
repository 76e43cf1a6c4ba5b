//! Counting how often each vCPU enters the guest's idle loop.
//!
//! An idle entry is the event behind BWW: on a halted vCPU the next wake-up costs a
//! hypervisor round trip. Where it can be counted depends on the kernel, so the best
//! available source is chosen once and reported:
//! 1. the cpuidle driver's per-state `usage` counters (exact; absent without a driver);
//! 2. the `power:cpu_idle` tracepoint counted per CPU with perf (exact; root or
//!    CAP_PERFMON) — on guests without a cpuidle driver this is the only exact source:
//!    `/proc/timer_list` `.idle_calls` only counts entries that try to stop the tick, and was
//!    measured here to miss most of them (17 against 90 switches to idle in 2 s);
//! 3. `/proc/timer_list` `.idle_calls` (root; undercounts as above);
//! 4. reschedule interrupts from `/proc/interrupts` (anyone; counts cross-vCPU wakes of
//!    sleeping vCPUs, the closest proxy left).

use std::path::{Path, PathBuf};

use perf_event::events::Tracepoint;
use perf_event::{Builder, Counter};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdleEntrySource {
    Cpuidle,
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
    sys_root: PathBuf,
    proc_root: PathBuf,
    counters: Vec<Counter>,
}

impl IdleEntryCounter {
    pub fn open(sys_root: &Path, proc_root: &Path, cpus: &[usize]) -> Self {
        let mut me = IdleEntryCounter {
            source: IdleEntrySource::Unavailable,
            cpus: cpus.to_vec(),
            sys_root: sys_root.to_path_buf(),
            proc_root: proc_root.to_path_buf(),
            counters: Vec::new(),
        };
        if cpus.iter().all(|&c| cpuidle_usage(sys_root, c).is_some()) && !cpus.is_empty() {
            me.source = IdleEntrySource::Cpuidle;
        } else if let Some(counters) = tracepoint_id(sys_root).and_then(|id| open_tracepoint(id, cpus).ok()) {
            me.counters = counters;
            me.source = IdleEntrySource::Tracepoint;
        } else if read_timer_list_calls(proc_root).is_some_and(|m| cpus.iter().all(|c| m.iter().any(|(k, _)| k == c))) {
            me.source = IdleEntrySource::TimerList;
        } else if read_res(proc_root).is_some() {
            me.source = IdleEntrySource::RescheduleInterrupts;
        }
        me
    }

    pub fn source(&self) -> IdleEntrySource {
        self.source
    }

    /// Cumulative counts, one per CPU given to `open`, in that order.
    pub fn read(&mut self) -> Vec<u64> {
        match self.source {
            IdleEntrySource::Cpuidle => self.cpus.iter().map(|&c| cpuidle_usage(&self.sys_root, c).unwrap_or(0)).collect(),
            // The tracepoint fires on idle entry and again on exit.
            IdleEntrySource::Tracepoint => self.counters.iter_mut().map(|c| c.read().unwrap_or(0) / 2).collect(),
            IdleEntrySource::TimerList => {
                let m = read_timer_list_calls(&self.proc_root).unwrap_or_default();
                self.cpus.iter().map(|c| m.iter().find(|(k, _)| k == c).map_or(0, |(_, v)| *v)).collect()
            }
            IdleEntrySource::RescheduleInterrupts => {
                let r = read_res(&self.proc_root).unwrap_or_default();
                self.cpus.iter().map(|&c| r.get(c).copied().unwrap_or(0)).collect()
            }
            IdleEntrySource::Unavailable => vec![0; self.cpus.len()],
        }
    }
}

fn tracepoint_id(sys: &Path) -> Option<u64> {
    ["kernel/tracing", "kernel/debug/tracing"].iter().find_map(|t| {
        std::fs::read_to_string(sys.join(t).join("events/power/cpu_idle/id")).ok()?.trim().parse().ok()
    })
}

/// One system-wide counter of the tracepoint per CPU, enabled at once.
fn open_tracepoint(id: u64, cpus: &[usize]) -> std::io::Result<Vec<Counter>> {
    let mut counters = cpus
        .iter()
        .map(|&cpu| Builder::new(Tracepoint::with_id(id)).any_pid().one_cpu(cpu).exclude_kernel(false).build())
        .collect::<std::io::Result<Vec<_>>>()?;
    for c in &mut counters {
        c.enable()?;
    }
    Ok(counters)
}

/// Idle entries of one CPU summed over its cpuidle states; `None` without a cpuidle driver.
pub fn cpuidle_usage(sys_root: &Path, cpu: usize) -> Option<u64> {
    let dir = sys_root.join(format!("devices/system/cpu/cpu{cpu}/cpuidle"));
    let mut total = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("state") {
            continue;
        }
        if let Some(n) = std::fs::read_to_string(entry.path().join("usage")).ok().and_then(|t| t.trim().parse::<u64>().ok()) {
            total = Some(total.unwrap_or(0) + n);
        }
    }
    total
}

fn read_timer_list_calls(proc_root: &Path) -> Option<Vec<(usize, u64)>> {
    let text = std::fs::read_to_string(proc_root.join("timer_list")).ok()?;
    Some(parse_timer_list_calls(&text))
}

/// `(cpu, idle_calls)` pairs from `/proc/timer_list`.
pub fn parse_timer_list_calls(text: &str) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    let mut cpu = None;
    for line in text.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("cpu:") {
            cpu = rest.trim().parse().ok();
        } else if let Some(rest) = l.strip_prefix(".idle_calls") {
            if let (Some(c), Some(v)) = (cpu, rest.trim_start_matches([' ', ':']).trim().parse().ok()) {
                out.push((c, v));
            }
        }
    }
    out
}

fn read_res(proc_root: &Path) -> Option<Vec<u64>> {
    parse_reschedule_interrupts(&std::fs::read_to_string(proc_root.join("interrupts")).ok()?)
}

/// Per-CPU reschedule-IPI counts (the `RES:` row of `/proc/interrupts`).
pub fn parse_reschedule_interrupts(text: &str) -> Option<Vec<u64>> {
    let line = text.lines().find(|l| l.trim_start().starts_with("RES:"))?;
    let counts = line.trim_start()["RES:".len()..].split_whitespace().map_while(|w| w.parse::<u64>().ok()).collect::<Vec<_>>();
    (!counts.is_empty()).then_some(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_reschedule_interrupts() {
        let text = "           CPU0       CPU1\n  LOC:       6089       7079   Local timer interrupts\n  RES:       2907       5804   Rescheduling interrupts\n";
        assert_eq!(parse_reschedule_interrupts(text), Some(vec![2907, 5804]));
        assert_eq!(parse_reschedule_interrupts("garbage"), None);
        assert_eq!(parse_reschedule_interrupts("RES: x y"), None);
    }

    #[test]
    fn parses_timer_list_idle_calls() {
        let text = "cpu: 0\n  .idle_calls     : 3350\n  .idle_sleeps    : 1427\ncpu: 1\n  .idle_calls     : 2647\n";
        assert_eq!(parse_timer_list_calls(text), vec![(0, 3350), (1, 2647)]);
        assert!(parse_timer_list_calls("cpu: x\n.idle_calls: y").is_empty());
    }

    #[test]
    fn prefers_cpuidle_counters_and_sums_states() {
        let dir = tempfile::tempdir().unwrap();
        for (cpu, usages) in [(0, [3u64, 4]), (1, [10, 0])] {
            for (i, u) in usages.iter().enumerate() {
                let d = dir.path().join(format!("devices/system/cpu/cpu{cpu}/cpuidle/state{i}"));
                std::fs::create_dir_all(&d).unwrap();
                std::fs::write(d.join("usage"), format!("{u}\n")).unwrap();
            }
        }
        let mut c = IdleEntryCounter::open(dir.path(), dir.path(), &[0, 1]);
        assert_eq!(c.source(), IdleEntrySource::Cpuidle);
        assert_eq!(c.read(), vec![7, 10]);
    }

    #[test]
    fn falls_back_to_reschedule_interrupts_without_privileged_sources() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("interrupts"), "  RES:  5  9  Rescheduling interrupts\n").unwrap();
        let mut c = IdleEntryCounter::open(&dir.path().join("nosys"), dir.path(), &[1]);
        assert_eq!(c.source(), IdleEntrySource::RescheduleInterrupts);
        assert_eq!(c.read(), vec![9]);
    }
}
