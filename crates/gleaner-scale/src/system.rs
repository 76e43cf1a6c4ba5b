//! System-wide per-CPU counters sampled around each run: vCPU idle entries and steal time.
//!
//! The BWW problem shows up as vCPUs going idle and waking again many times a
//! second (Gleaner paper, §3.2 / Figure 1), so `gleaner scale` counts idle
//! entries on the CPUs the program was restricted to. The counting itself is
//! [`gleaner_linux::idle_entries::IdleEntryCounter`], which picks the best
//! source once (cpuidle usage, the `power:cpu_idle` tracepoint, `/proc/timer_list`
//! `.idle_calls`, reschedule interrupts); this module only sums its cumulative
//! per-CPU counts over the CPUs of one run. Steal time (`/proc/stat`, read with
//! [`gleaner_linux::ProcFs`]) tells whether the host took the vCPUs away during
//! the run. Every reader takes the sysfs and procfs roots so tests can point it
//! at a fake tree.

use std::path::PathBuf;

use gleaner_linux::idle_entries::{IdleEntryCounter, IdleEntrySource};
use gleaner_linux::ProcFs;

use crate::error::ScaleError;

/// Where the sysfs and procfs trees live (`/sys`, `/proc` on a real system).
#[derive(Debug, Clone)]
pub struct SystemRoots {
    pub sys: PathBuf,
    pub proc: PathBuf,
}

impl Default for SystemRoots {
    fn default() -> Self {
        Self {
            sys: PathBuf::from("/sys"),
            proc: PathBuf::from("/proc"),
        }
    }
}

/// Idle entries on a set of CPUs, opened once for every CPU any run may use so
/// the source is chosen (and reported) once.
pub struct IdleCounter {
    counter: IdleEntryCounter,
    cpus: Vec<usize>,
}

impl IdleCounter {
    /// Opens the best idle-entry source available for `cpus`.
    pub fn open(roots: &SystemRoots, cpus: &[usize]) -> Self {
        Self {
            counter: IdleEntryCounter::open(&roots.sys, &roots.proc, cpus),
            cpus: cpus.to_vec(),
        }
    }

    pub fn source(&self) -> IdleEntrySource {
        self.counter.source()
    }

    /// Cumulative idle entries summed over `cpus` (a subset of the CPUs opened);
    /// `None` when no source is available or a CPU was not opened.
    pub fn total(&mut self, cpus: &[usize]) -> Option<u64> {
        if self.source() == IdleEntrySource::Unavailable {
            return None;
        }
        let counts = self.counter.read();
        cpus.iter()
            .map(|cpu| {
                self.cpus
                    .iter()
                    .position(|c| c == cpu)
                    .and_then(|i| counts.get(i).copied())
            })
            .sum()
    }
}

/// Human-readable name of an idle-entry source, for the report.
pub fn describe_idle_source(source: IdleEntrySource) -> &'static str {
    match source {
        IdleEntrySource::Cpuidle => "cpuidle state usage",
        IdleEntrySource::TickSched => {
            "the kernel's tick records (idle-loop passes), times the share power:cpu_idle saw halt in the BPF sampler's windows"
        }
        IdleEntrySource::TickSchedIdleTime => {
            "the kernel's tick records (idle time), over the mean halt power:cpu_idle saw in the BPF sampler's windows"
        }
        IdleEntrySource::Tracepoint => "the power:cpu_idle tracepoint",
        IdleEntrySource::TimerListAndWakeInterrupts => {
            "/proc/timer_list .idle_calls, or where more, the wake-up interrupts (a lower bound)"
        }
        IdleEntrySource::WakeInterrupts => {
            "wake-up interrupts (a proxy: wake-ups of idle vCPUs by other vCPUs; run as root for exact counts)"
        }
        IdleEntrySource::Unavailable => {
            "unavailable: no cpuidle driver, no usable power:cpu_idle tracepoint or /proc/timer_list \
             (run as root), and no RES or CAL line in /proc/interrupts"
        }
    }
}

/// Total steal time so far on `cpus`, in nanoseconds, from `/proc/stat`.
pub fn read_steal_ns(roots: &SystemRoots, cpus: &[usize]) -> Result<u64, ScaleError> {
    let stat = ProcFs::new(&roots.proc).stat()?;
    let mut total = 0;
    for &cpu in cpus {
        let line =
            stat.per_cpu
                .iter()
                .find(|c| c.cpu == cpu)
                .ok_or_else(|| ScaleError::MissingCpu {
                    path: roots.proc.join("stat"),
                    cpu,
                })?;
        total += line.times.steal_ns;
    }
    Ok(total)
}

/// The CPUs this process may run on, in ascending order.
pub fn allowed_cpus() -> Result<Vec<usize>, ScaleError> {
    Ok(gleaner_sys::affinity::thread_affinity(0)
        .map_err(ScaleError::Affinity)?
        .iter()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::Path;

    const PROC_STAT: &str = "cpu  11253 0 2115 90630 920 0 141 9 0 0\n\
        cpu0 4742 0 851 46800 66 0 80 4 0 0\n\
        cpu1 6510 0 1264 43829 854 0 61 5 0 0\n\
        intr 1 2 3\nctxt 12345\nprocs_running 1\nprocs_blocked 0\n";

    fn fake_roots(dir: &Path) -> SystemRoots {
        SystemRoots {
            sys: dir.join("sys"),
            proc: dir.join("proc"),
        }
    }

    #[test]
    fn run_totals_are_sums_over_the_runs_cpus() {
        let dir = tempfile::tempdir().unwrap();
        let roots = fake_roots(dir.path());
        for (cpu, usage) in [(2, 10), (3, 32)] {
            let state_dir = roots
                .sys
                .join(format!("devices/system/cpu/cpu{cpu}/cpuidle/state0"));
            fs::create_dir_all(&state_dir).unwrap();
            fs::write(state_dir.join("usage"), format!("{usage}\n")).unwrap();
            fs::write(state_dir.join("time"), "1000\n").unwrap();
        }
        let mut idle = IdleCounter::open(&roots, &[2, 3]);
        assert_eq!(idle.source(), IdleEntrySource::Cpuidle);
        assert_eq!(idle.total(&[3]), Some(32));
        assert_eq!(idle.total(&[2, 3]), Some(42));
        // A CPU that was not opened is not silently counted as zero.
        assert_eq!(idle.total(&[5]), None);
    }

    #[test]
    fn unavailable_source_gives_no_counts() {
        let dir = tempfile::tempdir().unwrap();
        let mut idle = IdleCounter::open(&fake_roots(dir.path()), &[0]);
        assert_eq!(idle.source(), IdleEntrySource::Unavailable);
        assert_eq!(idle.total(&[0]), None);
        assert!(describe_idle_source(idle.source()).starts_with("unavailable"));
    }

    #[test]
    fn steal_sums_requested_cpus_and_names_the_file_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let roots = fake_roots(dir.path());
        let err = read_steal_ns(&roots, &[0]).unwrap_err();
        assert!(err.to_string().contains("stat"), "{err}");
        fs::create_dir_all(&roots.proc).unwrap();
        fs::write(roots.proc.join("stat"), PROC_STAT).unwrap();
        assert_eq!(
            read_steal_ns(&roots, &[0, 1]).unwrap(),
            ProcFs::new(&roots.proc).ticks_to_ns(9)
        );
        assert!(read_steal_ns(&roots, &[7]).is_err());
    }
}
