//! Counting how often each vCPU enters the guest's idle loop.
//!
//! An idle entry is the event behind BWW: on a halted vCPU the next wake-up costs a
//! hypervisor round trip. Where it can be counted depends on the kernel, so the best
//! available source is chosen once and reported:
//! 1. the cpuidle driver's per-state `usage` counters (exact; absent without a driver);
//! 2. the `power:cpu_idle` tracepoint counted per CPU with perf (exact; root or
//!    CAP_PERFMON) — on guests without a cpuidle driver this is the only exact source;
//! 3. `/proc/timer_list` `.idle_calls`, or the wake-up interrupts where they say more
//!    (root; a lower bound). `.idle_calls` counts the idle loop's passes that try to stop
//!    the tick, which is not every halt (a cpuidle governor may keep the tick: 17 against 90
//!    switches to idle in 2 s on the first test guest, 2026-11-23; a kernel without a
//!    cpuidle driver may count only the passes that do stop it: 22 a second against 60,000
//!    halts in a ping-pong on 6.18.44-fc-v1045, 2026-12-02) and not only halts (a wake-up may
//!    end a pass before its halt: 6,038 passes for 4,494 halts on one CPU of the haltpoll
//!    guest with tests running, 2026-11-27; the BPF sampler corrects for this,
//!    `crate::sampler`). Every wake-up of a halted vCPU by another is an interrupt, so where
//!    those outnumber the passes they are the count: read every
//!    [`WAKE_INTERRUPTS_EVERY`]th period (the file costs as much as the timer list), as wake-ups per ns
//!    of idle time, applied to each period's idle time;
//! 4. the wake-up interrupts alone from `/proc/interrupts` (anyone; counts cross-vCPU wakes
//!    of sleeping vCPUs, the closest proxy left).

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
    /// `/proc/timer_list` `.idle_calls`, or where more, the wake-up interrupts' count.
    TimerListAndWakeInterrupts,
    /// Reschedule and function-call IPIs from `/proc/interrupts`.
    WakeInterrupts,
    Unavailable,
}

impl IdleEntrySource {
    /// Whether counts from this source are complete.
    pub fn exact(self) -> bool {
        matches!(self, IdleEntrySource::Cpuidle | IdleEntrySource::Tracepoint)
    }
}

/// Periodic reads ([`IdleEntryCounter::read_periodic`]) between two reads of
/// `/proc/interrupts` under [`IdleEntrySource::TimerListAndWakeInterrupts`]: the file costs
/// 79 µs a read on the 2-vCPU `none` guest (the timer list 90 µs; 3,000 reads of each through
/// one open file, 2026-12-02), 0.08 % of a 100 ms
/// period every period, where the procfs sampler's whole budget is 0.5 %. Wake-ups per ns of
/// idle change with the workload's grain, which the policy judges over several periods
/// anyway.
pub const WAKE_INTERRUPTS_EVERY: u32 = 8;

/// Cumulative idle entries per CPU from the best source available.
pub struct IdleEntryCounter {
    source: IdleEntrySource,
    cpus: Vec<usize>,
    sys: SysFs,
    proc: ProcFs,
    counters: Vec<Counter>,
    /// Under [`IdleEntrySource::TimerListAndWakeInterrupts`].
    timer_and_wakes: Option<TimerAndWakes>,
}

/// Idle time a CPU must have spent since the interrupts were last read for its wake-ups per
/// ns of idle to be measured again: over less, one wake-up more or less would swing it (the
/// first read, right after `open`, sees microseconds).
const MIN_WAKE_SPAN_IDLE_NS: u64 = 1_000_000;

/// The state behind [`IdleEntrySource::TimerListAndWakeInterrupts`], per CPU in the
/// counter's order: what the last read saw, and the wake-ups per ns of idle measured over the
/// last span of at least [`MIN_WAKE_SPAN_IDLE_NS`] of idle between reads of the interrupts.
struct TimerAndWakes {
    calls: Vec<u64>,
    idle_ns: Vec<u64>,
    /// At the start of each CPU's span; `None` until `/proc/interrupts` was first read.
    wakes: Option<Vec<u64>>,
    idle_since_wakes_ns: Vec<u64>,
    /// `None` until measured.
    wakes_per_idle_ns: Vec<Option<f64>>,
    totals: Vec<u64>,
    periodic_reads_since_wakes: u32,
    /// Periodic reads left that read the interrupts every time while a CPU's wake-ups per ns
    /// of idle are still unmeasured: a CPU that never idles stops forcing them.
    first_reads_left: u32,
}

impl TimerAndWakes {
    fn new(now: &[TimerListCpu], wakes: Option<Vec<u64>>, cpus: &[usize]) -> Self {
        let calls = timer_list_column(now, cpus, |c| c.idle_calls);
        TimerAndWakes {
            idle_ns: timer_list_column(now, cpus, idle_ns_of),
            wakes: wakes.map(|w| of_cpus(&w, cpus.iter().copied())),
            idle_since_wakes_ns: vec![0; cpus.len()],
            wakes_per_idle_ns: vec![None; cpus.len()],
            totals: calls.clone(),
            calls,
            periodic_reads_since_wakes: 0,
            first_reads_left: WAKE_INTERRUPTS_EVERY,
        }
    }

    /// Whether the next periodic read reads the interrupts.
    fn wakes_due(&self) -> bool {
        self.periodic_reads_since_wakes + 1 >= WAKE_INTERRUPTS_EVERY
            || (self.first_reads_left > 0 && self.wakes_per_idle_ns.iter().any(Option::is_none))
    }

    /// Adds the entries since the last read: per CPU the larger of the idle-loop passes and
    /// the idle time times the wake-ups per ns of idle, re-measured when `wakes` is given.
    fn advance(&mut self, now: &[TimerListCpu], wakes: Option<Vec<u64>>, cpus: &[usize]) {
        self.first_reads_left = self.first_reads_left.saturating_sub(1);
        self.periodic_reads_since_wakes = match wakes {
            Some(_) => 0,
            None => self.periodic_reads_since_wakes.saturating_add(1),
        };
        let wakes = wakes.map(|w| of_cpus(&w, cpus.iter().copied()));
        for (i, cpu) in cpus.iter().enumerate() {
            // A CPU the list lacks this time adds nothing, rather than a drop to 0 and a jump
            // back.
            let Some(now) = now.iter().find(|c| c.cpu == *cpu) else {
                continue;
            };
            let (calls, idle_ns) = (now.idle_calls, idle_ns_of(now));
            let new_calls = calls.saturating_sub(self.calls[i]);
            let new_idle_ns = idle_ns.saturating_sub(self.idle_ns[i]);
            (self.calls[i], self.idle_ns[i]) = (calls, idle_ns);
            self.idle_since_wakes_ns[i] += new_idle_ns;
            if let (Some(w), Some(start)) = (&wakes, self.wakes.as_mut()) {
                let idle = self.idle_since_wakes_ns[i];
                if idle >= MIN_WAKE_SPAN_IDLE_NS {
                    let new_wakes = w[i].saturating_sub(start[i]);
                    self.wakes_per_idle_ns[i] = Some(new_wakes as f64 / idle as f64);
                    start[i] = w[i];
                    self.idle_since_wakes_ns[i] = 0;
                }
            }
            let per_ns = self.wakes_per_idle_ns[i].unwrap_or(0.0);
            let from_wakes = (new_idle_ns as f64 * per_ns).round() as u64;
            self.totals[i] += new_calls.max(from_wakes);
        }
        if self.wakes.is_none() && wakes.is_some() {
            // The first read of the interrupts (none could be read at `open`) measured
            // nothing: it starts every CPU's span.
            self.wakes = wakes;
            self.idle_since_wakes_ns.iter_mut().for_each(|n| *n = 0);
        }
    }
}

fn idle_ns_of(c: &TimerListCpu) -> u64 {
    c.idle_sleeptime_ns + c.iowait_sleeptime_ns
}

/// One field of the timer list per CPU in `cpus`' order; 0 for a CPU it does not list.
fn timer_list_column(
    t: &[TimerListCpu],
    cpus: &[usize],
    f: impl Fn(&TimerListCpu) -> u64,
) -> Vec<u64> {
    cpus.iter()
        .map(|&cpu| t.iter().find(|c| c.cpu == cpu).map_or(0, &f))
        .collect()
}

/// The entries of `by_id` (indexed by CPU id) for `cpus`, in their order; the default for a
/// CPU it lacks. The one such lookup of the Linux side (the sampler's too).
pub(crate) fn of_cpus<T: Copy + Default>(
    by_id: &[T],
    cpus: impl IntoIterator<Item = usize>,
) -> Vec<T> {
    cpus.into_iter()
        .map(|c| by_id.get(c).copied().unwrap_or_default())
        .collect()
}

impl IdleEntryCounter {
    pub fn open(sys_root: &Path, proc_root: &Path, cpus: &[usize]) -> Self {
        let mut me = IdleEntryCounter {
            source: IdleEntrySource::Unavailable,
            cpus: cpus.to_vec(),
            sys: SysFs::new(sys_root),
            proc: ProcFs::new(proc_root),
            counters: Vec::new(),
            timer_and_wakes: None,
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
        } else if let Some(timer_list) = me
            .proc
            .timer_list()
            .ok()
            .flatten()
            .filter(|t| cpus.iter().all(|c| t.iter().any(|t| t.cpu == *c)))
        {
            let wakes = me.proc.wake_interrupts().ok().flatten();
            me.timer_and_wakes = Some(TimerAndWakes::new(&timer_list, wakes, cpus));
            me.source = IdleEntrySource::TimerListAndWakeInterrupts;
        } else if matches!(me.proc.wake_interrupts(), Ok(Some(_))) {
            me.source = IdleEntrySource::WakeInterrupts;
        }
        me
    }

    pub fn source(&self) -> IdleEntrySource {
        self.source
    }

    /// Cumulative counts, one per CPU given to `open`, in that order, every source read
    /// afresh. A read that fails (a file gone since `open`) counts 0 more for that CPU.
    pub fn read(&mut self) -> Vec<u64> {
        self.read_sources(None, true)
    }

    /// Like [`IdleEntryCounter::read`], for a caller that reads once a period: the timer-list
    /// source's passes and idle time come from `timer_list` when the caller has just read it
    /// for something else, and the wake-up interrupts it weighs them against are read every
    /// [`WAKE_INTERRUPTS_EVERY`]th call.
    pub fn read_periodic(&mut self, timer_list: Option<&[TimerListCpu]>) -> Vec<u64> {
        let wakes_due = self
            .timer_and_wakes
            .as_ref()
            .is_some_and(TimerAndWakes::wakes_due);
        self.read_sources(timer_list, wakes_due)
    }

    fn read_sources(&mut self, timer_list: Option<&[TimerListCpu]>, wakes_due: bool) -> Vec<u64> {
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
            IdleEntrySource::TimerListAndWakeInterrupts => {
                let read_now;
                let now = match timer_list {
                    Some(t) => t,
                    None => {
                        read_now = self.proc.timer_list().ok().flatten().unwrap_or_default();
                        &read_now
                    }
                };
                let wakes = if wakes_due {
                    self.proc.wake_interrupts().ok().flatten()
                } else {
                    None
                };
                let Some(state) = self.timer_and_wakes.as_mut() else {
                    return vec![0; self.cpus.len()];
                };
                state.advance(now, wakes, &self.cpus);
                state.totals.clone()
            }
            IdleEntrySource::WakeInterrupts => of_cpus(
                &self
                    .proc
                    .wake_interrupts()
                    .ok()
                    .flatten()
                    .unwrap_or_default(),
                self.cpus.iter().copied(),
            ),
            IdleEntrySource::TickSched
            | IdleEntrySource::TickSchedIdleTime
            | IdleEntrySource::Unavailable => vec![0; self.cpus.len()],
        }
    }
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

    fn timer_list_text(cpus: &[(usize, u64, u64)]) -> String {
        cpus.iter()
            .map(|(cpu, calls, idle_ns)| {
                format!(
                    "cpu: {cpu}\n  .idle_calls     : {calls}\n  .idle_sleeps    : 1\n  .idle_sleeptime : {idle_ns} nsecs\n  .iowait_sleeptime: 0 nsecs\n"
                )
            })
            .collect()
    }

    fn interrupts_text(res: [u64; 2], cal: [u64; 2]) -> String {
        format!(
            "           CPU0       CPU1\n  RES: {} {}  Rescheduling interrupts\n  CAL: {} {}  Function call interrupts\n",
            res[0], res[1], cal[0], cal[1]
        )
    }

    #[test]
    fn falls_back_to_timer_list_idle_calls() {
        let dir = tempfile::tempdir().unwrap();
        let text = timer_list_text(&[(0, 3350, 5), (1, 2647, 7)]);
        std::fs::write(dir.path().join("timer_list"), text).unwrap();
        let mut c = IdleEntryCounter::open(&dir.path().join("nosys"), dir.path(), &[0, 1]);
        assert_eq!(c.source(), IdleEntrySource::TimerListAndWakeInterrupts);
        assert_eq!(c.read(), vec![3350, 2647]);
        // A timer list the caller already read is used instead of reading the file again; a
        // CPU it lacks adds nothing.
        std::fs::remove_file(dir.path().join("timer_list")).unwrap();
        let read = [TimerListCpu {
            cpu: 1,
            idle_calls: 2657,
            idle_sleeps: 0,
            idle_sleeptime_ns: 9,
            iowait_sleeptime_ns: 0,
        }];
        assert_eq!(c.read_periodic(Some(&read)), vec![3350, 2657]);
        assert_eq!(
            c.read(),
            vec![3350, 2657],
            "the file is gone: nothing added"
        );
        // A CPU the file does not list: the source is not used.
        std::fs::write(dir.path().join("timer_list"), timer_list_text(&[(0, 1, 1)])).unwrap();
        let c = IdleEntryCounter::open(&dir.path().join("nosys"), dir.path(), &[0, 2]);
        assert_eq!(c.source(), IdleEntrySource::Unavailable);
    }

    /// The counts of kernel 6.18.44-fc-v1045 without a cpuidle driver in a ping-pong
    /// (2026-12-02): about 20 passes a second against 60,000 halts, each woken by another
    /// vCPU's function-call IPI.
    #[test]
    fn where_wake_up_interrupts_outnumber_the_passes_they_count_the_idle_entries() {
        let dir = tempfile::tempdir().unwrap();
        let write = |calls: [u64; 2], idle_ms: [u64; 2], cal: [u64; 2]| {
            let ns = idle_ms.map(|ms| ms * 1_000_000);
            let t = timer_list_text(&[(0, calls[0], ns[0]), (1, calls[1], ns[1])]);
            std::fs::write(dir.path().join("timer_list"), t).unwrap();
            let i = interrupts_text([5, 5], cal);
            std::fs::write(dir.path().join("interrupts"), i).unwrap();
        };
        write([100, 100], [1_000, 1_000], [10_000, 10_000]);
        let mut c = IdleEntryCounter::open(&dir.path().join("nosys"), dir.path(), &[0, 1]);
        assert_eq!(c.source(), IdleEntrySource::TimerListAndWakeInterrupts);
        // Right after `open` too little idle time to measure anything: passes only.
        write([101, 101], [1_000, 1_000], [10_001, 10_001]);
        assert_eq!(c.read_periodic(None), vec![101, 101]);
        // A period of 50 ms idle each: 2 passes and 3,001 wake-ups on CPU 0 (counted from
        // `open`: the short span went on); on CPU 1 the passes are more (tick-stopping
        // halts the interrupts do not see).
        write([103, 201], [1_050, 1_050], [13_001, 10_051]);
        assert_eq!(c.read_periodic(None), vec![101 + 3_001, 201]);
        // Between reads of the interrupts the measured wake-ups per ns of idle stand in:
        // 60 a ms on CPU 0, while CPU 1's passes still win. The file is not read (its counts
        // would say otherwise).
        for k in 1..WAKE_INTERRUPTS_EVERY {
            let k = u64::from(k);
            let idle = 1_050 + 10 * k;
            write(
                [103 + k, 201 + 100 * k],
                [idle, idle],
                [99_000_000, 99_000_000],
            );
            let from_wakes = (10.0 * 3_001.0 / 50.0_f64).round() as u64;
            assert_eq!(
                c.read_periodic(None),
                vec![3_102 + from_wakes * k, 201 + 100 * k]
            );
        }
        let before = 3_102 + 600 * u64::from(WAKE_INTERRUPTS_EVERY - 1);
        // The eighth read measures them again: 1,000 wake-ups over the 100 ms of idle since,
        // 300 of them in this period's 30 ms.
        write([120, 1_000], [1_150, 1_150], [14_001, 10_131]);
        assert_eq!(c.read_periodic(None), vec![before + 300, 1_000]);
        // `read` measures them every time.
        write([121, 1_001], [1_160, 1_160], [19_001, 10_131]);
        assert_eq!(c.read(), vec![before + 300 + 5_000, 1_001]);
    }

    #[test]
    fn interrupts_first_read_after_open_start_the_spans_and_measure_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let write_timer = |calls: u64, idle_ms: u64| {
            let t = timer_list_text(&[(0, calls, idle_ms * 1_000_000)]);
            std::fs::write(dir.path().join("timer_list"), t).unwrap();
        };
        write_timer(10, 100);
        let mut c = IdleEntryCounter::open(&dir.path().join("nosys"), dir.path(), &[0]);
        // The interrupts appear after `open`, with counts from the boot on.
        std::fs::write(
            dir.path().join("interrupts"),
            interrupts_text([0, 0], [50_000, 0]),
        )
        .unwrap();
        write_timer(11, 150);
        assert_eq!(
            c.read_periodic(None),
            vec![11],
            "the boot's 50,000 are no period's"
        );
        std::fs::write(
            dir.path().join("interrupts"),
            interrupts_text([0, 0], [51_000, 0]),
        )
        .unwrap();
        write_timer(12, 160);
        assert_eq!(c.read_periodic(None), vec![11 + 1_000]);
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
    fn falls_back_to_wake_up_interrupts_without_privileged_sources() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("interrupts"),
            interrupts_text([5, 9], [100, 200]),
        )
        .unwrap();
        let mut c = IdleEntryCounter::open(&dir.path().join("nosys"), dir.path(), &[1]);
        assert_eq!(c.source(), IdleEntrySource::WakeInterrupts);
        assert_eq!(c.read(), vec![209]);
    }
}
