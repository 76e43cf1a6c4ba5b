//! System-wide per-CPU counters sampled around each run: vCPU idle entries and steal time.
//!
//! The BWW problem shows up as vCPUs going idle and waking again many times a
//! second (Gleaner paper, §3.2 / Figure 1), so `gleaner scale` counts idle
//! entries on the CPUs the program was restricted to. Kernels with a cpuidle
//! driver expose per-state entry counts in sysfs. Kernels without one (such as
//! many KVM/Firecracker guests) are counted through the `power:cpu_idle`
//! tracepoint with a per-CPU perf counter (root), which sees every idle entry;
//! the last resort is `.idle_calls` in `/proc/timer_list` (root), which on such
//! a guest counted only about one entry in five (17 against 90 switches to the
//! idle task in the same 2 s), because it only counts entries where the tick
//! could be stopped. Steal time (`/proc/stat`)
//! tells whether the host took the vCPUs away during the run. Every reader
//! takes the sysfs and procfs roots so tests can point it at a fake tree.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use perf_event::events::Tracepoint;
use perf_event::{Builder, Counter};
use serde::Serialize;

use crate::error::ScaleError;

/// Where the sysfs and procfs trees live (`/sys`, `/proc` on a real system).
#[derive(Debug, Clone)]
pub struct SystemRoots {
    pub sys: PathBuf,
    pub proc: PathBuf,
}

impl Default for SystemRoots {
    fn default() -> Self {
        Self { sys: PathBuf::from("/sys"), proc: PathBuf::from("/proc") }
    }
}

/// Which kernel interface provides idle-entry counts on this machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum IdleCounterSource {
    /// `/sys/devices/system/cpu/cpuN/cpuidle/state*/usage`, summed over states.
    Cpuidle,
    /// The `power:cpu_idle` tracepoint (this id) counted per CPU with perf.
    Tracepoint(u64),
    /// `.idle_calls` per CPU in `/proc/timer_list`.
    TimerList,
    /// Neither is readable; the string says why.
    Unavailable(String),
}

impl IdleCounterSource {
    /// Picks the first interface that yields a count for every CPU in `cpus`.
    pub fn detect(roots: &SystemRoots, cpus: &[usize]) -> Self {
        if cpus.iter().all(|&cpu| cpuidle_usage(&roots.sys, cpu).is_ok()) {
            return Self::Cpuidle;
        }
        if let Some(id) = cpu_idle_tracepoint_id(&roots.sys) {
            if open_tracepoint_counters(id, cpus).is_ok() {
                return Self::Tracepoint(id);
            }
        }
        match read_timer_list(&roots.proc) {
            Ok(counts) if cpus.iter().all(|cpu| counts.contains_key(cpu)) => Self::TimerList,
            Ok(_) => Self::Unavailable(format!(
                "no cpuidle driver, no power:cpu_idle tracepoint, and {} has no .idle_calls for every CPU",
                roots.proc.join("timer_list").display()
            )),
            Err(err) => Self::Unavailable(format!(
                "no cpuidle driver, no usable power:cpu_idle tracepoint, and {err} (run as root)"
            )),
        }
    }

    /// Human-readable name of the source, for the report.
    pub fn describe(&self) -> String {
        match self {
            Self::Cpuidle => "cpuidle state usage".to_string(),
            Self::Tracepoint(_) => "the power:cpu_idle tracepoint".to_string(),
            Self::TimerList => "/proc/timer_list .idle_calls (undercounts short idle periods)".to_string(),
            Self::Unavailable(why) => format!("unavailable: {why}"),
        }
    }

    /// Starts counting idle entries on `cpus`; [`IdleWindow::finish`] ends it.
    pub fn start(&self, roots: &SystemRoots, cpus: &[usize]) -> Result<IdleWindow, ScaleError> {
        Ok(match self {
            Self::Tracepoint(id) => {
                let mut counters = open_tracepoint_counters(*id, cpus)
                    .map_err(|source| ScaleError::Io { what: "opening the power:cpu_idle counters", source })?;
                for counter in &mut counters {
                    counter
                        .enable()
                        .map_err(|source| ScaleError::Io { what: "enabling the power:cpu_idle counters", source })?;
                }
                IdleWindow::Counting(counters)
            }
            Self::Cpuidle | Self::TimerList => IdleWindow::Snapshot(self.read_total(roots, cpus)?),
            Self::Unavailable(_) => IdleWindow::Unavailable,
        })
    }

    /// Total idle entries so far on `cpus` for the snapshot sources.
    fn read_total(&self, roots: &SystemRoots, cpus: &[usize]) -> Result<u64, ScaleError> {
        let mut total = 0;
        match self {
            Self::Cpuidle => {
                for &cpu in cpus {
                    total += cpuidle_usage(&roots.sys, cpu)?;
                }
            }
            Self::TimerList => {
                let counts = read_timer_list(&roots.proc)?;
                for cpu in cpus {
                    total += counts.get(cpu).copied().ok_or_else(|| ScaleError::MissingCpu {
                        path: roots.proc.join("timer_list"),
                        cpu: *cpu,
                    })?;
                }
            }
            Self::Tracepoint(_) | Self::Unavailable(_) => {}
        }
        Ok(total)
    }
}

/// An idle-entry count in progress, started by [`IdleCounterSource::start`].
pub enum IdleWindow {
    Snapshot(u64),
    Counting(Vec<Counter>),
    Unavailable,
}

impl IdleWindow {
    /// Idle entries on `cpus` since the window started, `None` when unavailable.
    pub fn finish(self, source: &IdleCounterSource, roots: &SystemRoots, cpus: &[usize]) -> Result<Option<u64>, ScaleError> {
        match self {
            Self::Snapshot(before) => Ok(Some(source.read_total(roots, cpus)?.saturating_sub(before))),
            Self::Counting(counters) => {
                let mut events = 0;
                for mut counter in counters {
                    events += counter
                        .read()
                        .map_err(|source| ScaleError::Io { what: "reading the power:cpu_idle counters", source })?;
                }
                // The tracepoint fires on idle entry and again on exit.
                Ok(Some(events / 2))
            }
            Self::Unavailable => Ok(None),
        }
    }
}

/// The id of `power:cpu_idle` from tracefs (or its debugfs mount), if readable.
fn cpu_idle_tracepoint_id(sys: &Path) -> Option<u64> {
    ["kernel/tracing", "kernel/debug/tracing"].iter().find_map(|tracefs| {
        let text = fs::read_to_string(sys.join(tracefs).join("events/power/cpu_idle/id")).ok()?;
        text.trim().parse().ok()
    })
}

/// One system-wide counter of the tracepoint per CPU (needs root or CAP_PERFMON).
fn open_tracepoint_counters(id: u64, cpus: &[usize]) -> std::io::Result<Vec<Counter>> {
    cpus.iter()
        .map(|&cpu| {
            Builder::new(Tracepoint::with_id(id))
                .any_pid()
                .one_cpu(cpu)
                .exclude_kernel(false)
                .build()
        })
        .collect()
}

/// Sum of `usage` over all idle states of one CPU.
fn cpuidle_usage(sys: &Path, cpu: usize) -> Result<u64, ScaleError> {
    let dir = sys.join(format!("devices/system/cpu/cpu{cpu}/cpuidle"));
    let entries = fs::read_dir(&dir).map_err(|source| ScaleError::Read { path: dir.clone(), source })?;
    let mut total = 0;
    let mut states = 0;
    for entry in entries {
        let entry = entry.map_err(|source| ScaleError::Read { path: dir.clone(), source })?;
        if !entry.file_name().to_string_lossy().starts_with("state") {
            continue;
        }
        let path = entry.path().join("usage");
        total += read_u64(&path)?;
        states += 1;
    }
    if states == 0 {
        return Err(ScaleError::MissingCpu { path: dir, cpu });
    }
    Ok(total)
}

fn read_u64(path: &Path) -> Result<u64, ScaleError> {
    let text = fs::read_to_string(path).map_err(|source| ScaleError::Read { path: path.to_owned(), source })?;
    text.trim().parse().map_err(|_| ScaleError::Parse {
        path: path.to_owned(),
        detail: format!("expected an integer, found {:?}", text.trim()),
    })
}

fn read_timer_list(proc: &Path) -> Result<BTreeMap<usize, u64>, ScaleError> {
    let path = proc.join("timer_list");
    let text = fs::read_to_string(&path).map_err(|source| ScaleError::Read { path, source })?;
    Ok(parse_timer_list_idle_calls(&text))
}

/// Maps CPU number to `.idle_calls` from the text of `/proc/timer_list`.
///
/// The per-CPU sections start with `cpu: N`; later `Tick Device` sections also
/// name CPUs but carry no `.idle_calls`, so the last `cpu:` header seen wins.
pub fn parse_timer_list_idle_calls(text: &str) -> BTreeMap<usize, u64> {
    let mut counts = BTreeMap::new();
    let mut current_cpu = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("cpu:") {
            current_cpu = rest.trim().parse::<usize>().ok();
        } else if let Some(rest) = line.strip_prefix(".idle_calls") {
            let value = rest.trim_start().trim_start_matches(':').trim();
            if let (Some(cpu), Ok(calls)) = (current_cpu, value.parse::<u64>()) {
                counts.insert(cpu, calls);
            }
        }
    }
    counts
}

/// Total steal time so far on `cpus`, in clock ticks (USER_HZ), from `/proc/stat`.
pub fn read_steal_ticks(roots: &SystemRoots, cpus: &[usize]) -> Result<u64, ScaleError> {
    let path = roots.proc.join("stat");
    let text = fs::read_to_string(&path).map_err(|source| ScaleError::Read { path: path.clone(), source })?;
    let steal = parse_proc_stat_steal(&text);
    let mut total = 0;
    for cpu in cpus {
        total += steal.get(cpu).copied().ok_or_else(|| ScaleError::MissingCpu { path: path.clone(), cpu: *cpu })?;
    }
    Ok(total)
}

/// Maps CPU number to its steal ticks (the 8th value of a `cpuN` line in `/proc/stat`).
pub fn parse_proc_stat_steal(text: &str) -> BTreeMap<usize, u64> {
    let mut steal = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(cpu) = fields.next().and_then(|name| name.strip_prefix("cpu")).and_then(|n| n.parse().ok()) else {
            continue;
        };
        // user nice system idle iowait irq softirq steal
        if let Some(Ok(ticks)) = fields.nth(7).map(str::parse::<u64>) {
            steal.insert(cpu, ticks);
        }
    }
    steal
}

/// Kernel clock ticks per second for `/proc/stat` (USER_HZ).
pub fn clock_ticks_per_second() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(ticks)) if ticks > 0 => ticks as f64,
        // USER_HZ is 100 on every mainstream Linux ABI.
        _ => 100.0,
    }
}

/// The CPUs this process may run on, in ascending order.
pub fn allowed_cpus() -> Result<Vec<usize>, ScaleError> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).map_err(ScaleError::Affinity)?;
    Ok((0..nix::sched::CpuSet::count()).filter(|&cpu| set.is_set(cpu).unwrap_or(false)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMER_LIST: &str = "Timer List Version: v0.10\n\
        cpu: 0\n clock 0:\n  .base: 0\nactive timers:\n  .nohz           : 1\n  .idle_calls     : 12740\n  .idle_sleeps    : 8344\n\
        cpu: 1\n  .idle_calls     : 7954\n\
        Tick Device: mode:     1\nPer CPU device: 0\n  .idle_calls: bogus\n";

    const PROC_STAT: &str = "cpu  11253 0 2115 90630 920 0 141 9 0 0\n\
        cpu0 4742 0 851 46800 66 0 80 4 0 0\n\
        cpu1 6510 0 1264 43829 854 0 61 5 0 0\n\
        intr 1 2 3\nctxt 12345\n";

    fn fake_roots(dir: &Path) -> SystemRoots {
        SystemRoots { sys: dir.join("sys"), proc: dir.join("proc") }
    }

    #[test]
    fn parses_idle_calls_per_cpu() {
        let counts = parse_timer_list_idle_calls(TIMER_LIST);
        assert_eq!(counts, BTreeMap::from([(0, 12740), (1, 7954)]));
    }

    #[test]
    fn parses_steal_per_cpu_and_skips_aggregate_line() {
        assert_eq!(parse_proc_stat_steal(PROC_STAT), BTreeMap::from([(0, 4), (1, 5)]));
    }

    #[test]
    fn prefers_cpuidle_and_sums_states() {
        let dir = tempfile::tempdir().unwrap();
        let roots = fake_roots(dir.path());
        for (state, usage) in [("state0", "10\n"), ("state1", "32\n")] {
            let state_dir = roots.sys.join("devices/system/cpu/cpu3/cpuidle").join(state);
            fs::create_dir_all(&state_dir).unwrap();
            fs::write(state_dir.join("usage"), usage).unwrap();
        }
        let source = IdleCounterSource::detect(&roots, &[3]);
        assert_eq!(source, IdleCounterSource::Cpuidle);
        assert_eq!(source.read_total(&roots, &[3]).unwrap(), 42);
        let window = source.start(&roots, &[3]).unwrap();
        let state_dir = roots.sys.join("devices/system/cpu/cpu3/cpuidle/state1");
        fs::write(state_dir.join("usage"), "40\n").unwrap();
        assert_eq!(window.finish(&source, &roots, &[3]).unwrap(), Some(8));
    }

    #[test]
    fn falls_back_to_timer_list_then_to_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let roots = fake_roots(dir.path());
        let missing = IdleCounterSource::detect(&roots, &[0, 1]);
        assert!(matches!(missing, IdleCounterSource::Unavailable(ref why) if why.contains("timer_list")));
        let window = missing.start(&roots, &[0]).unwrap();
        assert_eq!(window.finish(&missing, &roots, &[0]).unwrap(), None);

        fs::create_dir_all(&roots.proc).unwrap();
        fs::write(roots.proc.join("timer_list"), TIMER_LIST).unwrap();
        let source = IdleCounterSource::detect(&roots, &[0, 1]);
        assert_eq!(source, IdleCounterSource::TimerList);
        assert_eq!(source.read_total(&roots, &[0, 1]).unwrap(), 12740 + 7954);
        // A CPU the file does not describe is not silently counted as zero.
        assert!(matches!(IdleCounterSource::detect(&roots, &[5]), IdleCounterSource::Unavailable(_)));
        assert!(source.read_total(&roots, &[5]).is_err());
    }

    #[test]
    fn tracepoint_source_counts_when_the_kernel_allows_it() {
        // Real system: only meaningful as root with tracefs mounted.
        let roots = SystemRoots::default();
        let cpus = allowed_cpus().unwrap();
        let source = IdleCounterSource::detect(&roots, &cpus[..1]);
        if !matches!(source, IdleCounterSource::Tracepoint(_)) {
            eprintln!("skipping: idle source here is {}", source.describe());
            return;
        }
        let window = source.start(&roots, &cpus[..1]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(window.finish(&source, &roots, &cpus[..1]).unwrap().is_some());
    }

    #[test]
    fn tracepoint_id_is_read_from_tracefs_under_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let id_dir = dir.path().join("kernel/debug/tracing/events/power/cpu_idle");
        fs::create_dir_all(&id_dir).unwrap();
        fs::write(id_dir.join("id"), "568\n").unwrap();
        assert_eq!(cpu_idle_tracepoint_id(dir.path()), Some(568));
        assert_eq!(cpu_idle_tracepoint_id(&dir.path().join("nothing")), None);
    }

    #[test]
    fn steal_sums_requested_cpus_and_names_the_file_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let roots = fake_roots(dir.path());
        let err = read_steal_ticks(&roots, &[0]).unwrap_err();
        assert!(err.to_string().contains("stat"), "{err}");
        fs::create_dir_all(&roots.proc).unwrap();
        fs::write(roots.proc.join("stat"), PROC_STAT).unwrap();
        assert_eq!(read_steal_ticks(&roots, &[0, 1]).unwrap(), 9);
        assert!(read_steal_ticks(&roots, &[7]).is_err());
    }

    #[test]
    fn malformed_usage_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let roots = fake_roots(dir.path());
        let state_dir = roots.sys.join("devices/system/cpu/cpu0/cpuidle/state0");
        fs::create_dir_all(&state_dir).unwrap();
        fs::write(state_dir.join("usage"), "lots").unwrap();
        let err = IdleCounterSource::Cpuidle.read_total(&roots, &[0]).unwrap_err();
        assert!(err.to_string().contains("usage"), "{err}");
    }
}
