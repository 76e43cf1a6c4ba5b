//! The daemon's loop: sample, ask the policy, apply, report — once per period.
//!
//! This is the only place where the pure policy meets the machine. It owns no policy logic:
//! every choice comes from [`gleaner_policy::Gleaner`]; this module only measures, applies the
//! decision through the placement and retention back ends, and records what happened.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gleaner_policy::{
    Cpuset, Decision, EventKind, Gleaner, PolicyEvent, RetentionAction, RunSummary,
};
use gleaner_sys::wait::{pidfd_open, sleep_or_readable, Woken};

use crate::cgroup::{Placement, PlacementKind};
use crate::error::Result;
use crate::pacer::{is_disrupted, Pacer, Wake};
use crate::pmqos::PollRetention;
use crate::retention::{LazyRetentionPool, RetentionCounters, RetentionMode};
use crate::sampler::{Sampler, WorkloadView};
use crate::status::{write_status, InstanceStatus, VcpuStatus};

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The managed workload has no threads left.
    WorkloadGone,
    /// The caller asked us to stop (a signal).
    Requested,
}

/// How the loop sleeps between samples: until the next deadline, or until the workload's
/// process exits or a signal arrives, whichever comes first. Polling for the exit once a
/// period made every `gleaner run` outlive its workload by half a period on average.
pub struct ExitWatch {
    /// Readable once the watched process has exited; dropped then, because a process tree
    /// may live on after its root and the loop must not spin on a descriptor that stays
    /// readable.
    pidfd: Option<OwnedFd>,
    /// The process exited since [`ExitWatch::take_exited`] last asked.
    exited: bool,
}

impl ExitWatch {
    /// Watches process `pid`. Where no pidfd can be had (Linux before 5.3, a process
    /// already gone) the loop sleeps whole slices as before; signals still wake it.
    pub fn process(pid: u32) -> Self {
        Self {
            pidfd: pidfd_open(pid).ok(),
            exited: false,
        }
    }

    /// Wakes only for signals: a cgroup target has no one process whose exit ends it.
    pub fn signals_only() -> Self {
        Self {
            pidfd: None,
            exited: false,
        }
    }

    /// Whether the watched process exited since the last call: the workload's process list
    /// must then be read again at once.
    fn take_exited(&mut self) -> bool {
        std::mem::take(&mut self.exited)
    }

    /// Sleeps for `nap`; returns true as soon as `stop()` says so after an early wake-up.
    fn sleep(&mut self, nap: Duration, stop: &dyn Fn() -> bool) -> bool {
        let deadline = Instant::now() + nap;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match sleep_or_readable(self.pidfd.as_ref().map(|f| f.as_fd()), left) {
                Ok(Woken::Timeout) => return false,
                Ok(Woken::Readable) => {
                    self.pidfd = None;
                    self.exited = true;
                    if stop() {
                        return true;
                    }
                }
                Ok(Woken::Signal) => {
                    if stop() {
                        return true;
                    }
                }
                Err(_) => {
                    std::thread::sleep(left);
                    return false;
                }
            }
        }
    }
}

pub struct ControllerOptions {
    pub period: Duration,
    /// Decide and log, but change nothing.
    pub observe: bool,
    /// Runnable-thread sub-samples per period.
    pub sub_samples: u32,
    pub status_path: Option<PathBuf>,
    pub timeline: Option<File>,
    /// Shown by `status`.
    pub command: String,
    pub placement_name: String,
    pub retention_backend: String,
    /// How the retention hold was obtained, for `status` (e.g. "measured: 3 runs agreed").
    pub retention_timeout_source: String,
    /// The application's own progress counter, if the user gave one: changes are then judged
    /// by what it grew by, and a period whose count could not be read is not judged at all.
    pub progress: Option<crate::progress::ProgressReader>,
}

/// How idle vCPUs are held, if at all.
pub enum Retainer<'a> {
    /// Retention is off for this run (consolidation only, or observing).
    None,
    /// SCHED_IDLE yielding threads, started the first time a vCPU is held.
    Yield(&'a LazyRetentionPool),
    /// The guest's cpuidle poll state through PM QoS.
    Poll(&'a mut PollRetention),
}

impl Retainer<'_> {
    /// Ends what turning polling off started this period (see `PollRetention::settle`).
    fn settle(&mut self) {
        if let Retainer::Poll(poll) = self {
            if let Err(e) = poll.settle() {
                tracing::warn!("cpuidle POLL state: {e}");
            }
        }
    }

    fn counters(&self) -> Vec<(usize, RetentionCounters)> {
        match self {
            Retainer::Yield(lazy) => lazy.started().map(|p| p.counters()).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    fn apply(&mut self, cpu: usize, action: RetentionAction) {
        match self {
            Retainer::None => {}
            Retainer::Yield(lazy) => {
                let (mode, pool) = match action {
                    // Threads that never started hold nothing to turn off.
                    RetentionAction::Off => (RetentionMode::Off, lazy.started()),
                    RetentionAction::Retain { timeout_ns } => (
                        RetentionMode::Yield { timeout_ns },
                        // A failed start was logged when it failed, and is not retried.
                        lazy.get_or_start().ok(),
                    ),
                };
                // A CPU outside the pool (none is expected) simply cannot be held.
                if let Some(pool) = pool {
                    let _ = pool.set_mode(cpu, mode);
                }
            }
            Retainer::Poll(poll) => {
                // In-kernel polling has no timeout of its own: the policy's per-period
                // on/off decision is the timeout, at period granularity.
                if let Err(e) = poll.set(cpu, action != RetentionAction::Off) {
                    tracing::warn!("PM QoS on CPU {cpu}: {e}");
                }
            }
        }
    }
}

/// An idle workload is sampled this many times less often.
const IDLE_STRETCH: u32 = 3;

/// The longest a period may legitimately last, as a multiple of the configured one: an idle
/// workload's period ([`IDLE_STRETCH`]) stretched as far as the own-CPU budget goes
/// ([`MAX_PERIOD_STRETCH`]). Whoever waits for periods to advance (tests, an operator's
/// watchdog) must allow this much before calling the loop stuck.
pub const LONGEST_PERIOD_FACTOR: u32 = IDLE_STRETCH * MAX_PERIOD_STRETCH;

/// Number of past decisions kept for `status`.
const EVENT_HISTORY: usize = 20;

/// What the control loop hands to the recorder thread.
enum Record {
    Status(Box<InstanceStatus>),
    Timeline(String),
}

/// Writes the status file and the timeline on a thread of its own.
///
/// Why: file-system writes can block for a long time (an ext4 journal commit behind other
/// writers). In a soak on the project's VM, writing the status file and timeline line inside
/// the control loop took up to 217 ms and made it miss periods, while a probe thread at the
/// same priority never woke more than 9 ms late in 30 minutes. The loop now only hands records over; a full
/// queue (the disk stalled for seconds) drops status updates rather than stalling control.
struct Recorder {
    tx: Option<std::sync::mpsc::SyncSender<Record>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The recorder thread's own CPU time so far (ns), published after each write: part of
    /// Gleaner's own cost, which the period stretch holds to its share ([`OwnCpuBudget`]).
    cpu_ns: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Recorder {
    fn start(status_path: Option<PathBuf>, mut timeline: Option<File>) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Record>(256);
        let cpu_ns = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let published = cpu_ns.clone();
        let thread = std::thread::Builder::new()
            .name("gleaner-record".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    // Write every timeline line, but only the newest of the queued statuses.
                    let mut latest = None;
                    for r in std::iter::once(first).chain(rx.try_iter()) {
                        match r {
                            Record::Status(s) => latest = Some(s),
                            Record::Timeline(line) => {
                                if let Some(f) = &mut timeline {
                                    let _ = writeln!(f, "{line}");
                                }
                            }
                        }
                    }
                    if let (Some(path), Some(st)) = (&status_path, latest) {
                        if let Err(e) = write_status(path, &st) {
                            tracing::warn!("cannot write status file: {e}");
                        }
                    }
                    published.store(
                        gleaner_sys::clock::own_thread_cpu_ns(),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                }
            });
        match thread {
            Ok(t) => Self {
                tx: Some(tx),
                thread: Some(t),
                cpu_ns,
            },
            Err(e) => {
                tracing::warn!("no status file or timeline: cannot start the recorder thread: {e}");
                Self {
                    tx: None,
                    thread: None,
                    cpu_ns,
                }
            }
        }
    }

    fn send(&self, r: Record) {
        if let Some(tx) = &self.tx {
            let _ = tx.try_send(r);
        }
    }

    /// The recorder thread's CPU time so far, as of its last write.
    fn cpu_ns(&self) -> u64 {
        self.cpu_ns.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Recorder {
    /// Flushes what is queued and waits, so that nothing writes the status file after the
    /// caller removed it.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub struct Controller<'a> {
    policy: Gleaner,
    placement: &'a mut dyn Placement,
    retainer: Retainer<'a>,
    sampler: Sampler,
    opts: ControllerOptions,
    applied_active: Cpuset,
    /// The retention actions applied last (a change asks the sampler for a fresh window).
    applied_retention: Vec<(usize, RetentionAction)>,
    status: InstanceStatus,
    started: Instant,
    recorder: Recorder,
    retention_tids_sent: bool,
    /// What the policy did (or, observing, would have done), and the kinds of change it
    /// proposed in the previous period of an observe-only run (logged once per run of
    /// periods, not every period).
    summary: RunSummary,
    last_observed: Vec<std::mem::Discriminant<EventKind>>,
    /// Cumulative per-vCPU counters, by CPU number, kept across periods.
    totals: std::collections::BTreeMap<usize, VcpuTotals>,
    slow_log: RateLimit,
    /// Unreadable progress counters are logged at most once a minute.
    progress_log: RateLimit,
    /// Gleaner's own CPU against its share of the time: sizes the periods.
    own_cpu: OwnCpuBudget,
    /// Whether the stretch of the period was logged.
    stretch_logged: bool,
    /// When the status file was last handed to the recorder (see [`STATUS_INTERVAL`]).
    status_sent: Option<Instant>,
    /// The applied configuration when the status was last handed over.
    status_shown: Option<AppliedConfig>,
}

/// How often the status file is rewritten when nothing changes. Its readers are people
/// (`gleaner status`, `--watch`) and the service's metrics, scraped every few seconds; writing
/// it every period woke the recorder thread ten times a second and, with 1,000 workload
/// threads, was a fifth of Gleaner's own CPU. A change of configuration is written at once.
/// Events that change nothing applied do not count as a change (`status_due`): not every
/// system has `/run` in memory, and on this project's Firecracker guest, where it is the root
/// disk, `gleaner run --observe` on a 2.7 s `sysbench threads` repeated its "would hold" event
/// nearly every period and replaced the status file each time (each replacement makes ext4
/// flush the new file, `auto_da_alloc`): 31–40 disk writes per run, now 18–19, as many as
/// `gleaner run -- true` makes (16: the journal's, at start and end).
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// How long the controller may go without listing the workload's processes and threads.
/// The BPF sampler follows forks in the kernel (it adds every child of a workload process),
/// so the list only catches processes moved into the cgroup from outside; the procfs sampler
/// lists threads when it reads them (every period, or every few under a tight budget).
/// Reading `cgroup.procs` makes the kernel sort every thread's id: with 1,000 threads that
/// was half of Gleaner's CPU when done every period. The workload's exit is noticed at once
/// by the exit watch; a cgroup target that empties is noticed within this interval.
pub const PROCESS_LIST_INTERVAL: Duration = Duration::from_secs(1);

/// One vCPU's counters since the instance started.
#[derive(Debug, Clone, Copy, Default)]
struct VcpuTotals {
    idle_transitions: u64,
    halts: u64,
    work_ns: u64,
    steal_ns: u64,
}

/// Lets one message through per interval and counts the ones it held back.
#[derive(Debug)]
pub struct RateLimit {
    every: Duration,
    last: Option<Instant>,
    held_back: u64,
}

impl RateLimit {
    pub fn new(every: Duration) -> Self {
        RateLimit {
            every,
            last: None,
            held_back: 0,
        }
    }

    /// `Some(n)`: log now, `n` occurrences were held back since the last one logged.
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.every => {
                self.held_back += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held_back))
            }
        }
    }
}

impl<'a> Controller<'a> {
    pub fn new(
        policy: Gleaner,
        placement: &'a mut dyn Placement,
        retainer: Retainer<'a>,
        sampler: Sampler,
        opts: ControllerOptions,
    ) -> Self {
        let allowed = policy.allowed().clone();
        let status = InstanceStatus {
            pid: std::process::id(),
            start_time_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            retention_timeout_source: opts.retention_timeout_source.clone(),
            judged_by: match &opts.progress {
                Some(reader) => format!("the application's progress ({})", reader.source()),
                None => "utilization".into(),
            },
            // Zero from the start where a counter judges: "none counted yet", not "no counter".
            progress_total: opts.progress.as_ref().map(|_| 0),
            command: opts.command.clone(),
            mode: policy.config().mode.to_string(),
            observe: opts.observe,
            placement: opts.placement_name.clone(),
            retention_backend: opts.retention_backend.clone(),
            idle_source: sampler.idle_source_name(),
            sampler: sampler.kind().name().to_string(),
            sampler_blind_spots: sampler.blind_spots(),
            allowed: allowed.to_string(),
            active: allowed.to_string(),
            ..Default::default()
        };
        let recorder = Recorder::start(
            opts.status_path.clone(),
            opts.timeline.as_ref().and_then(|f| f.try_clone().ok()),
        );
        let mut sampler = sampler;
        sampler.set_active(&allowed);
        let period = opts.period;
        Self {
            policy,
            placement,
            retainer,
            sampler,
            opts,
            applied_active: allowed,
            applied_retention: Vec::new(),
            status,
            started: Instant::now(),
            recorder,
            summary: RunSummary::default(),
            last_observed: Vec::new(),
            totals: Default::default(),
            slow_log: RateLimit::new(Duration::from_secs(60)),
            progress_log: RateLimit::new(Duration::from_secs(60)),
            own_cpu: OwnCpuBudget::new(period),
            stretch_logged: false,
            retention_tids_sent: false,
            status_sent: None,
            status_shown: None,
        }
    }

    /// What the policy did (or, observing, would have done) and why: printed at the end.
    pub fn summary(&self) -> String {
        self.summary.render(&self.policy, self.opts.observe)
    }

    /// The latest status (also after `run` returned: `gleaner run --observe` prints the
    /// wake latencies from it).
    pub fn status(&self) -> &InstanceStatus {
        &self.status
    }

    /// Tells the sampler which threads are Gleaner's retention threads, once they all have
    /// started (a vCPU running one counts as polling, not busy).
    fn send_retention_tids(&mut self) {
        if self.retention_tids_sent {
            return;
        }
        let tids: Vec<i32> = match &self.retainer {
            // Not yet started: asked again next period.
            Retainer::Yield(lazy) => match lazy.started() {
                Some(pool) => pool.threads().iter().map(|t| t.tid).collect(),
                None => return,
            },
            _ => Vec::new(),
        };
        if tids.iter().all(|&t| t > 0) {
            self.sampler.set_retention_threads(&tids);
            self.retention_tids_sent = true;
        }
    }

    /// Runs until the workload is gone or `stop()` says so; `watch` ends a sleep early when
    /// the workload exits or a signal arrives, so that `stop()` is asked at once.
    pub fn run(&mut self, stop: &dyn Fn() -> bool, watch: &mut ExitWatch) -> Result<StopReason> {
        self.status.controller_nice = raise_own_priority();
        let t0 = Instant::now();
        let now_ns = || t0.elapsed().as_nanos() as u64;
        let (view, counters) = (self.view()?, self.retention_counters());
        self.sampler.sample(now_ns(), &view, &counters)?;
        // The counter's base is taken with the sampler's first window, so that the first
        // period is judged too (a counter gives a period's count only from a second read).
        if let Some(reader) = self.opts.progress.as_mut() {
            reader.start();
        }
        let mut pacer = Pacer::new(now_ns());
        let mut last_sample_ns = now_ns();
        let full_rate = self.opts.sub_samples.max(1);
        let mut view = self.view()?;
        let mut viewed_at = Instant::now();
        // Gleaner's own CPU is counted from here, cycle by cycle: everything the controller
        // thread does (sub-sample wake-ups and window openings included) and the recorder's.
        let mut cycle_start_cpu = (
            gleaner_sys::clock::own_thread_cpu_ns(),
            self.recorder.cpu_ns(),
        );
        let mut cycle_start = Instant::now();
        // What the cycle that just ended was; `None` before the first.
        let mut last_cycle: Option<CycleKind> = None;
        // Cycles begun, for what counts as start-up below.
        let mut cycles_begun: u64 = 0;
        loop {
            // The last cycle is closed here, at the top, so that one that ended early (a
            // disrupted period, one the progress counter could not judge) is accounted for
            // like the rest. Closed at the end of the judged path only, such a cycle's CPU
            // went into the next one's: a start-up period the host stalled (steal 30–50 % on
            // the haltpoll guest, 2026-12-02) carried 37 ms of start-up work into the first
            // charged cycle, and the periods stretched to 1 s before ping-pong's first decision.
            if let Some(kind) = last_cycle.take() {
                let cycle_end_cpu = (
                    gleaner_sys::clock::own_thread_cpu_ns(),
                    self.recorder.cpu_ns(),
                );
                let cycle_cpu_ns = cycle_end_cpu.0.saturating_sub(cycle_start_cpu.0)
                    + cycle_end_cpu.1.saturating_sub(cycle_start_cpu.1);
                let cycle_ns = cycle_start.elapsed().as_nanos() as u64;
                tracing::trace!(
                    cycle_cpu_us = cycle_cpu_ns / 1_000,
                    cycle_ms = cycle_ns / 1_000_000,
                    start_up = kind.start_up,
                    window = kind.window,
                    "cycle"
                );
                if !kind.start_up {
                    self.own_cpu.add(cycle_ns, cycle_cpu_ns, kind.window);
                }
                (cycle_start_cpu, cycle_start) = (cycle_end_cpu, Instant::now());
            }
            // An idle workload is neither sub-sampled nor sampled every period: each wake-up
            // of a thread costs a vCPU exit here, and an idle workload has nothing to decide.
            // Gleaner then wakes a few times a second, which keeps it under 1 % of a CPU.
            let busy = self.status.characteristics.total_util >= self.policy.config().idle_util
                || self.status.periods == 0;
            // The BPF sampler measures queueing continuously: one wake-up per period
            // suffices; the procfs sampler wakes less often under a tight budget.
            let wakeups = self.sampler.sub_sample_wakeups(full_rate);
            // Short periods at start-up (`Gleaner::next_period_ns`), the configured one after,
            // stretched where one period's own work would cost the workload too much.
            let base = self.own_cpu.period();
            if base > self.opts.period && !self.stretch_logged {
                self.stretch_logged = true;
                tracing::info!(
                    own_cpu_ms = self.own_cpu.typical_ns() as f64 / 1e6,
                    window_ms = self.own_cpu.window_cost_ns() as f64 / 1e6,
                    period_ms = base.as_millis() as u64,
                    "Gleaner's own CPU is over its 0.45 % of the time here (a cycle's typical cost, or a debt a costlier one left): periods stretched"
                );
            }
            let period = Duration::from_nanos(self.policy.next_period_ns(base.as_nanos() as u64));
            // The policy's start-up periods (the first eight, a quarter as long) are a burst
            // by design, bounded and once per run, so that a short job gets its first
            // decision within about 0.2 s: the budget does not charge them. Charged, their
            // 0.4–1.2 ms cycles (ping-pong, BPF sampler) stretched them to 50–130 ms and put
            // the ping-pong's consolidation at 0.2–0.5 s instead of 0.08–0.13 s.
            //
            // The first cycles are start-up by their count too, not only by their length: a
            // stalled first period (the host, or a stopped process) ends the short periods at
            // once (`Gleaner::period_disrupted`), and the start-up's one-off work that comes
            // after it, the programs' first attach above all (start-up window cycles of 12–14 ms
            // of CPU against 2.6–4.0 ms later in `sysbench threads`, haltpoll guest, kernel
            // v1147), was then charged: the
            // debt stretched the periods to 0.8–1 s, and a ping-pong Gleaner was stopped for
            // 0.2 s at its start packed at 1.1–1.8 s instead of 0.08–0.15 s (one run of 12
            // in the daemon suite did so on its own, 2026-12-03).
            let start_up =
                period < base || cycles_begun < u64::from(self.policy.config().startup_periods);
            cycles_begun += 1;
            let mut cycle = CycleKind {
                start_up,
                window: false,
            };
            let (slices, slice) = if busy {
                (wakeups, period / wakeups)
            } else {
                (1, period * IDLE_STRETCH)
            };
            let slice_ns = slice.as_nanos() as u64;
            for _ in 0..slices {
                let nap = Duration::from_nanos(pacer.next(now_ns(), slice_ns));
                // The BPF sampler's partial window ends with the period: wake once before
                // the end to open it (`Sampler::begin_window`).
                let lead = self
                    .sampler
                    .window_lead_ns()
                    .map(Duration::from_nanos)
                    .filter(|l| *l < nap);
                if watch.sleep(lead.map_or(nap, |l| nap - l), stop) {
                    self.final_read(now_ns());
                    return Ok(StopReason::Requested);
                }
                if let Some(l) = lead {
                    self.sampler.begin_window();
                    cycle.window = true;
                    if watch.sleep(l, stop) {
                        self.final_read(now_ns());
                        return Ok(StopReason::Requested);
                    }
                }
                let wake = pacer.woke(now_ns(), slice_ns, period.as_nanos() as u64);
                self.note_wake(wake);
                if stop() {
                    self.final_read(now_ns());
                    return Ok(StopReason::Requested);
                }
                if busy {
                    self.sampler.observe_runnable(
                        &view.tids,
                        &self.applied_active,
                        full_rate / wakeups,
                    );
                }
            }
            last_cycle = Some(cycle);
            let work_start = Instant::now();
            // The controller thread's CPU at the start of the period's own work: both the
            // sampler's charge and the period's cost (`stretched_period`) count from here.
            let list_cost = gleaner_sys::clock::own_thread_cpu_ns();
            let listed = if self.placement.kind() == PlacementKind::Affinity
                || self.sampler.needs_fresh_thread_list()
                || watch.take_exited()
                || viewed_at.elapsed() >= PROCESS_LIST_INTERVAL
            {
                view = self.view()?;
                viewed_at = work_start;
                self.lists_threads()
            } else {
                // The thread list is reused; the per-CPU work counters are read every period.
                view.percpu_work_ns = self.placement.per_cpu_work_ns()?;
                false
            };
            let spent = gleaner_sys::clock::own_thread_cpu_ns().saturating_sub(list_cost);
            if listed {
                self.sampler.charge_thread_listing(spent);
            } else {
                self.sampler.charge(spent);
            }
            if view.tids.is_empty() {
                self.final_read(now_ns());
                return Ok(StopReason::WorkloadGone);
            }
            self.send_retention_tids();
            let counters = self.retention_counters();
            let viewed = work_start.elapsed();
            let now = now_ns();
            if start_up {
                self.sampler
                    .charge_next_as_period_of(base.as_nanos() as u64);
            }
            self.sampler
                .set_window_affordable(self.own_cpu.window_affordable());
            let Some(sample) = self.sampler.sample(now, &view, &counters)? else {
                continue;
            };
            // Counters count every sampled period, a discarded one too: what happened in a
            // stall happened.
            self.accumulate(&sample);
            let sampled = work_start.elapsed();
            // Read with every sampler window, a disrupted one too: the count then covers the
            // same period as the sample (skipped on a disrupted period, the next period's
            // count held two periods' progress against one period's length).
            let progress = self.opts.progress.as_mut().map(|reader| reader.delta());
            let (planned_ns, measured_ns) =
                (slice_ns * slices as u64, now.saturating_sub(last_sample_ns));
            last_sample_ns = now;
            if is_disrupted(planned_ns, measured_ns) {
                // The sample above re-based the counters; its contents describe the stall.
                self.note_disrupted(planned_ns, measured_ns);
                self.policy.period_disrupted();
                continue;
            }
            let mut sample = sample;
            if let Some(read) = progress {
                // Judged by the application's count or not at all: a period judged by
                // utilization among periods judged by the count would compare two units.
                match read {
                    Ok(Some(done)) => {
                        sample.progress = Some(done);
                        let st = &mut self.status;
                        st.progress_total = Some(st.progress_total.unwrap_or(0) + done);
                        st.progress_per_sec =
                            Some(done as f64 * 1e9 / sample.period_ns.max(1) as f64);
                    }
                    Ok(None) => continue,
                    Err(e) => {
                        self.status.unjudged_periods += 1;
                        if let Some(missed) = self.progress_log.admit(Instant::now()) {
                            tracing::warn!(
                                "{e}; this period is not judged ({missed} more since the last warning)"
                            );
                        }
                        continue;
                    }
                }
            }
            let decision = self.policy.step(&sample);
            if self.opts.observe {
                // Nothing is applied: count what would have been done, log a kind of change
                // only when it was not proposed the period before, and judge the next period
                // from the configuration that really runs.
                self.summary.add(&decision, self.policy.config().idle_util);
                let kinds: Vec<_> = decision
                    .events
                    .iter()
                    .map(|e| std::mem::discriminant(&e.kind))
                    .collect();
                for e in decision.events.iter().filter(|e| {
                    !self
                        .last_observed
                        .contains(&std::mem::discriminant(&e.kind))
                }) {
                    tracing::info!(period = e.period, event = ?e.kind, observe = true, "would: {}", e.reason);
                }
                self.last_observed = kinds;
                self.policy.forget_changes();
            } else {
                self.summary.add(&decision, self.policy.config().idle_util);
                for e in &decision.events {
                    tracing::info!(period = e.period, event = ?e.kind, observe = false, "{}", e.reason);
                }
            }
            tracing::debug!(characteristics = ?decision.characteristics, active = %decision.active, "period");
            // A change of grain seen in one measurement window is acted on only once a fresh
            // window repeats it (`PeriodSample::rates_from`): measure the next period rather
            // than carry this window's counts over.
            if decision.fresh_rates_wanted {
                self.sampler.measure_next_period();
            }
            if !self.opts.observe {
                self.apply(&decision)?;
            }
            let applied = work_start.elapsed();
            self.record(&sample, &decision, t0.elapsed(), planned_ns);
            // The period's own work normally takes well under a millisecond; when it takes
            // longer than a sub-sample slice, say where the time went.
            // Under load this can happen every period: counted always (gleaner_slow_periods_total),
            // logged at most once a minute with how many were not logged.
            let total = work_start.elapsed();
            if total > slice {
                self.status.slow_periods += 1;
                if let Some(unlogged) = self.slow_log.admit(Instant::now()) {
                    tracing::warn!(
                        total_ms = total.as_millis() as u64,
                        read_workload_ms = viewed.as_millis() as u64,
                        sample_ms = (sampled - viewed).as_millis() as u64,
                        decide_apply_ms = (applied - sampled).as_millis() as u64,
                        record_ms = (total - applied).as_millis() as u64,
                        not_logged_since_last = unlogged,
                        "the end-of-period work took longer than a sub-sample slice (logged at most once a minute)"
                    );
                }
            }
        }
    }

    fn accumulate(&mut self, sample: &gleaner_policy::PeriodSample) {
        for v in &sample.vcpus {
            let t = self.totals.entry(v.cpu).or_default();
            t.idle_transitions += v.idle_periods();
            t.halts += v.idle_entries;
            t.work_ns += v.work_ns;
            t.steal_ns += v.steal_ns;
        }
        self.status.runnable_wait_seconds_total +=
            sample.work_runnable_wait_ns.unwrap_or(0) as f64 / 1e9;
    }

    /// Counts the wake-ups of the last, partial period, so that the totals `run --observe`
    /// prints cover the whole run (BPF sampler only: its counters need no workload threads).
    fn final_read(&mut self, now_ns: u64) {
        if self.sampler.wants_sub_samples() {
            return;
        }
        if let Ok(Some(_)) =
            self.sampler
                .sample_last(now_ns, &WorkloadView::default(), &self.retention_counters())
        {
            self.status.wake_latency = self.sampler.wake_latency_total().cloned();
            self.status.bpf_events = self.sampler.kernel_events();
        }
    }

    fn note_wake(&mut self, wake: Wake) {
        let st = &mut self.status;
        st.max_late_ms = st.max_late_ms.max(wake.late_ns as f64 / 1e6);
        if wake.missed_periods > 0 {
            st.missed_periods += wake.missed_periods;
            tracing::warn!(
                late_ms = wake.late_ns / 1_000_000,
                missed_periods = wake.missed_periods,
                "the control loop woke more than a period late"
            );
        }
    }

    fn note_disrupted(&mut self, planned_ns: u64, measured_ns: u64) {
        self.status.disrupted_periods += 1;
        tracing::warn!(
            planned_ms = planned_ns / 1_000_000,
            measured_ms = measured_ns / 1_000_000,
            "a period lasted more than twice its plan (process stopped, VM paused or machine overloaded); its sample was discarded and nothing was changed"
        );
    }

    /// Whether a view lists the workload's threads, not only its processes: the /proc
    /// sampler reads each thread, and the affinity back end re-applies its mask to new ones.
    fn lists_threads(&self) -> bool {
        self.sampler.wants_thread_list() || self.placement.kind() == PlacementKind::Affinity
    }

    fn view(&self) -> Result<WorkloadView> {
        if !self.lists_threads() {
            // The BPF sampler needs only the processes; listing every thread would make the
            // daemon's period cost grow with the workload's thread count.
            let pids = self.placement.workload_pids()?;
            let tids = pids.iter().map(|&p| (p, p)).collect();
            // The BPF sampler counts the workload's CPU time only inside its measurement
            // windows; the cgroup's own per-CPU count covers the rest.
            return Ok(WorkloadView {
                pids,
                tids,
                percpu_work_ns: self.placement.per_cpu_work_ns()?,
                total_work_ns: None,
            });
        }
        let tids = self.placement.workload_tids()?;
        let mut pids: Vec<u32> = tids.iter().map(|(p, _)| *p).collect();
        pids.sort_unstable();
        pids.dedup();
        Ok(WorkloadView {
            pids,
            tids,
            percpu_work_ns: self.placement.per_cpu_work_ns()?,
            total_work_ns: None,
        })
    }

    fn retention_counters(&self) -> Vec<(usize, RetentionCounters)> {
        self.retainer.counters()
    }

    fn apply(&mut self, d: &Decision) -> Result<()> {
        // Threads created since the last change inherit a cpuset from their cgroup but an
        // affinity mask only from their creator, so the affinity back end is re-applied every
        // period while the workload is consolidated.
        let refresh = self.placement.kind() == PlacementKind::Affinity
            && d.active != *self.placement.allowed();
        let changed = d.active != self.applied_active || d.retention != self.applied_retention;
        if d.active != self.applied_active || refresh {
            self.placement.set_active(&d.active)?;
            self.applied_active = d.active.clone();
            self.sampler.set_active(&d.active);
        }
        for (cpu, action) in &d.retention {
            self.retainer.apply(*cpu, *action);
        }
        self.retainer.settle();
        if changed {
            self.applied_retention = d.retention.clone();
            self.sampler.measure_next_period();
        }
        Ok(())
    }

    fn record(
        &mut self,
        sample: &gleaner_policy::PeriodSample,
        d: &Decision,
        elapsed: Duration,
        planned_ns: u64,
    ) {
        let secs = sample.period_ns as f64 / 1e9;
        let st = &mut self.status;
        st.uptime_s = self.started.elapsed().as_secs_f64();
        st.periods += 1;
        st.active = d.active.to_string();
        st.rho = d.rho;
        st.eta = d.eta;
        st.retention_timeout = d.retention_timeout;
        st.characteristics = d.characteristics;
        st.vcpus = sample
            .vcpus
            .iter()
            .map(|v| VcpuStatus {
                cpu: v.cpu,
                active: d.active.contains(v.cpu),
                retaining: d
                    .retention
                    .iter()
                    .any(|(c, a)| *c == v.cpu && *a != RetentionAction::Off),
                idle_transitions_per_sec: v.idle_periods() as f64 / secs,
                halts_per_sec: v.idle_entries as f64 / secs,
                work_util: v.work_ns as f64 / sample.period_ns as f64,
                steal_fraction: v.steal_ns as f64 / sample.period_ns as f64,
                idle_transitions_total: self.totals.get(&v.cpu).map_or(0, |t| t.idle_transitions),
                halts_total: self.totals.get(&v.cpu).map_or(0, |t| t.halts),
                work_seconds_total: self.totals.get(&v.cpu).map_or(0, |t| t.work_ns) as f64 / 1e9,
                steal_seconds_total: self.totals.get(&v.cpu).map_or(0, |t| t.steal_ns) as f64 / 1e9,
            })
            .collect();
        st.retention_cpu_s = self
            .retainer
            .counters()
            .iter()
            .map(|(_, c)| c.yield_ns)
            .sum::<u64>() as f64
            / 1e9;
        st.self_cpu_s = own_cpu_seconds();
        st.sampler_blind_spots = self.sampler.blind_spots();
        st.sampler_cost_fraction = self.sampler.budget().cost_fraction();
        st.sampler_thin_level = self.sampler.budget().level();
        st.bpf_events = self.sampler.kernel_events();
        st.wake_latency = self.sampler.wake_latency_total().cloned();
        for e in &d.events {
            match e.kind {
                EventKind::Deactivate { .. } => st.consolidations += 1,
                EventKind::Rollback { .. } => st.rollbacks += 1,
                EventKind::MajorChange => st.major_changes += 1,
                _ => {}
            }
        }
        push_events(&mut st.last_events, &d.events);
        let shown = AppliedConfig {
            active: self.applied_active.clone(),
            retention: self.applied_retention.clone(),
        };
        let since_sent = self.status_sent.map(|t| t.elapsed());
        if status_due(
            since_sent,
            !d.events.is_empty(),
            self.status_shown.as_ref(),
            &shown,
        ) {
            self.recorder.send(Record::Status(Box::new(st.clone())));
            self.status_sent = Some(Instant::now());
            self.status_shown = Some(shown);
        }
        if self.opts.timeline.is_some() {
            let line = serde_json::json!({
                "t_s": elapsed.as_secs_f64(),
                "planned_s": planned_ns as f64 / 1e9,
                "active": d.active.to_string(),
                "n_active": d.active.len(),
                "retaining": d.retention.iter().filter(|(_, a)| *a != RetentionAction::Off).map(|(c, _)| *c).collect::<Vec<_>>(),
                "characteristics": d.characteristics,
                "rho": d.rho,
                "eta": d.eta,
                "events": d.events,
                "observe": self.opts.observe,
                "wake_latency": sample.wake_latency,
                "rates_from": sample.rates_from,
                "progress": sample.progress,
                "fresh_rates_wanted": d.fresh_rates_wanted,
            });
            self.recorder.send(Record::Timeline(line.to_string()));
        }
    }
}

/// What is applied to the workload: the active vCPUs and each one's retention.
#[derive(Clone, PartialEq)]
struct AppliedConfig {
    active: Cpuset,
    retention: Vec<(usize, RetentionAction)>,
}

/// Whether the status file is rewritten this period: the first time, once
/// [`STATUS_INTERVAL`] has passed, and at once when a decision applied a new configuration.
/// Events that change nothing applied (observing, "would hold" nearly every period) wait for
/// the interval like the counters do.
fn status_due(
    since_sent: Option<Duration>,
    events: bool,
    shown: Option<&AppliedConfig>,
    applied: &AppliedConfig,
) -> bool {
    since_sent.is_none_or(|t| t >= STATUS_INTERVAL) || (events && shown != Some(applied))
}

fn push_events(history: &mut Vec<PolicyEvent>, new: &[PolicyEvent]) {
    history.extend(new.iter().cloned());
    if history.len() > EVENT_HISTORY {
        history.drain(..history.len() - EVENT_HISTORY);
    }
}

/// What one control cycle was, for its accounting.
#[derive(Debug, Clone, Copy)]
struct CycleKind {
    /// One of the policy's short start-up periods, which the budget does not charge.
    start_up: bool,
    /// It opened a measurement window (attaching and then detaching the scheduler programs).
    window: bool,
}

/// CPU time of this process (controller and retention threads), in seconds.
pub fn own_cpu_seconds() -> f64 {
    gleaner_sys::clock::own_process_cpu_ns() as f64 / 1e9
}

/// The controller thread's nice value when the process may raise it (CAP_SYS_NICE).
///
/// The controller spends well under 1 % of a CPU, but its samples must be taken on time
/// even when the workload keeps every vCPU's run queue long (the soak runs at a load of 5 on
/// 2 vCPUs). Nice, not a real-time class: a bug that made the loop spin would then still
/// share the CPU with the workload instead of starving it.
pub const CONTROLLER_NICE: i32 = -10;

/// Gleaner's own CPU in one period (the controller thread's whole cycle: its sub-sample
/// wake-ups, the period's read, decision and apply; and the recorder thread's writes) may cost
/// at most 1 / `PERIOD_WORK_SHARE` of the period: 0.45 %, a tenth under the 0.5 % of one CPU
/// Gleaner's own measurement is allowed (the procfs sampler's budget,
/// `PROCFS_BUDGET_FRACTION`). A bucket aimed at the bound itself lands on either side of it:
/// at 1/200, with ping-pong's 0.5 ms cycles on a host running slow, the process measured
/// 0.495–0.524 % in six runs (2026-12-02). Until
/// 2026-11-26 only the end-of-period work counted, smoothed over four periods: with 1,000 busy
/// threads the procfs sampler then held its reads at 0.67 % of a CPU at its deepest thinning
/// and the process ran at 0.50–0.58 %, the thinned per-thread reads (8–15 ms every 32–64
/// periods) a spike that four periods forgot.
///
/// On this project's KVM guest that work stays well under 0.5 ms of a 100 ms period with the
/// BPF sampler (its own CPU measured at 4dc792b, 0.17–0.28 % of a CPU, is 0.17–0.28 ms a
/// period) and nothing is stretched; the procfs sampler's periods stretch now and then, to at
/// most 133 ms with 1,000 busy threads and 292 ms with 160 messaging threads (median 100 ms;
/// `gleaner run --sampler procfs --timeline FILE`, 6d23903). In the test bed's emulated (TCG) guests
/// it took 4–25 ms, and measuring alone (`run --observe`) slowed a fine pipeline to
/// x0.77–0.81 of bare with 100 ms periods and x0.90 with periods stretched to 1 % (505–880
/// ms): the work lands on a vCPU the coupled pipeline needs, and a stage stalled behind it
/// stalls the others. Stretched to 0.5 % (0.9–1 s there) it still ran x0.86, so not all of
/// that loss is per period (testbed/results/fig7-modes-20261125T040102Z/NOTE.md).
const PERIOD_WORK_SHARE: u32 = 220;

/// Periods are stretched to at most this multiple of the configured period.
const MAX_PERIOD_STRETCH: u32 = 10;

/// Gleaner's own CPU held to its share of the time (1 / [`PERIOD_WORK_SHARE`]) by a token
/// bucket. Each control cycle earns its share of the time it lasted and spends what it cost;
/// the next period lasts long enough to earn what a cycle typically costs and to repay any
/// debt a costlier cycle left (the first period's full read, or a thinned read of every
/// thread: 8–15 ms every 32–64 periods for 1,000 threads under the procfs sampler). The
/// balance is capped at one configured period's earnings, or at what a measurement window
/// costs where that is more, so quiet periods save nothing for a later burst but the window
/// a refresh is waiting for: over any run of cycles Gleaner's CPU is at most its share of
/// their time, plus that cap, plus the debt the last of them left, as long as no period hits
/// [`MAX_PERIOD_STRETCH`].
///
/// A typical cycle is the median of the last few, not their average: an average carries a
/// spike into the next periods' length on top of the debt that repays it. Averaged over
/// sixteen cycles, the first period's read (18 ms with 1,000 threads) kept the periods of a
/// 20 s run stretched (Gleaner at 0.19–0.22 % of a CPU, against its 0.5 %); the rule before
/// (the end-of-period work only, averaged over four) let it run at 0.49–0.53 %.
///
/// Cycles that opened a BPF measurement window are kept apart: what they cost beyond a
/// typical cycle is a window's price, which a refresh of rates that still hold waits to have
/// saved ([`OwnCpuBudget::window_affordable`], `sampler::window_due`) instead of stretching
/// the periods after it. Taken as cycles like the others, a packed ping-pong's windows (2.1–3.0
/// ms against 0.33–0.40 ms on the haltpoll guest) left a debt after each that stretched its
/// periods to 0.4–0.9 s.
#[derive(Debug, Clone)]
pub struct OwnCpuBudget {
    base: Duration,
    balance_ns: f64,
    /// The last few cycles' costs without a window, whose median is a typical cycle's: an
    /// average would carry a spike into the following periods, which the debt already repays.
    recent_ns: std::collections::VecDeque<u64>,
    /// What the last few window cycles cost beyond a typical cycle.
    window_extra_ns: std::collections::VecDeque<u64>,
}

/// How many cycles' costs [`OwnCpuBudget`] takes a typical cycle's cost from.
const OWN_CPU_RECENT: usize = 9;
/// How many window cycles [`OwnCpuBudget`] takes a window's price from (their median: one
/// window the host stalled, 10–88 ms under steal, does not set it alone).
const WINDOW_COST_RECENT: usize = 5;

fn median(values: &std::collections::VecDeque<u64>) -> u64 {
    let mut sorted: Vec<u64> = values.iter().copied().collect();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or(0)
}

fn push_recent(values: &mut std::collections::VecDeque<u64>, cap: usize, value: u64) {
    if values.len() == cap {
        values.pop_front();
    }
    values.push_back(value);
}

impl OwnCpuBudget {
    /// A budget for periods of `base` (the configured period), starting with a full balance.
    pub fn new(base: Duration) -> Self {
        let mut b = Self {
            base,
            balance_ns: 0.0,
            recent_ns: std::collections::VecDeque::with_capacity(OWN_CPU_RECENT),
            window_extra_ns: std::collections::VecDeque::with_capacity(WINDOW_COST_RECENT),
        };
        b.balance_ns = b.cap_ns();
        b
    }

    fn cap_ns(&self) -> f64 {
        (self.base.as_nanos() as f64 / f64::from(PERIOD_WORK_SHARE))
            .max(self.window_cost_ns() as f64)
    }

    /// Accounts one cycle: it lasted `elapsed_ns`, cost `cost_ns` of CPU and opened a
    /// measurement window or not.
    pub fn add(&mut self, elapsed_ns: u64, cost_ns: u64, window: bool) {
        let earned = elapsed_ns as f64 / f64::from(PERIOD_WORK_SHARE);
        if window {
            let extra = cost_ns.saturating_sub(self.typical_ns());
            push_recent(&mut self.window_extra_ns, WINDOW_COST_RECENT, extra);
        } else {
            push_recent(&mut self.recent_ns, OWN_CPU_RECENT, cost_ns);
        }
        self.balance_ns = (self.balance_ns + earned - cost_ns as f64).min(self.cap_ns());
    }

    /// A cycle's typical cost (ns of CPU): the median of the last few without a window.
    pub fn typical_ns(&self) -> u64 {
        median(&self.recent_ns)
    }

    /// What a window costs beyond a typical cycle (the median of the last few); 0 before
    /// one was measured.
    pub fn window_cost_ns(&self) -> u64 {
        median(&self.window_extra_ns)
    }

    /// Whether the balance holds a window's price, so that opening one leaves no debt for
    /// the periods after it to repay.
    pub fn window_affordable(&self) -> bool {
        self.balance_ns >= self.window_cost_ns() as f64
    }

    /// The next period: the configured one, or longer where it would not earn a typical
    /// cycle's cost and any debt (at most [`MAX_PERIOD_STRETCH`] times the configured one).
    pub fn period(&self) -> Duration {
        let owed = (self.typical_ns() as f64 - self.balance_ns).max(0.0);
        stretched_period(self.base, owed as u64)
    }
}

/// The period to run: the configured `period`, or longer where `cpu_ns` of Gleaner's own CPU
/// must be earned within it at 1 / [`PERIOD_WORK_SHARE`] (at most `MAX_PERIOD_STRETCH` times the configured one).
pub fn stretched_period(period: Duration, cpu_ns: u64) -> Duration {
    let wanted = Duration::from_nanos(cpu_ns.saturating_mul(u64::from(PERIOD_WORK_SHARE)));
    wanted.clamp(period, period * MAX_PERIOD_STRETCH)
}

/// Raises this thread's (only this thread's: Linux nice is per thread) priority to
/// [`CONTROLLER_NICE`]; returns the nice value in effect. Called after the workload and the
/// guard were started, so neither inherits it.
fn raise_own_priority() -> i32 {
    let tid = gleaner_sys::sched::gettid() as libc::id_t;
    // SAFETY: a plain syscall on the calling thread.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, CONTROLLER_NICE) } == 0 {
        return CONTROLLER_NICE;
    }
    tracing::debug!(
        "controller runs at normal priority: cannot raise it ({})",
        std::io::Error::last_os_error()
    );
    // SAFETY: as above. getpriority returns the nice value directly (-1 is a valid nice).
    unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_is_rewritten_at_once_only_for_a_newly_applied_configuration() {
        let all = AppliedConfig {
            active: Cpuset::first_n(2),
            retention: vec![],
        };
        let one = AppliedConfig {
            active: Cpuset::first_n(1),
            retention: vec![],
        };
        let soon = Some(Duration::from_millis(100));
        // The first status, and one a second later, whatever happened.
        assert!(status_due(None, false, None, &all));
        assert!(status_due(Some(STATUS_INTERVAL), false, Some(&all), &all));
        // Observing: an event every period, nothing applied: no rewrite before the interval.
        assert!(!status_due(soon, true, Some(&all), &all));
        assert!(!status_due(soon, false, Some(&all), &all));
        // A consolidation applied: at once.
        assert!(status_due(soon, true, Some(&all), &one));
    }

    #[test]
    fn periods_stretch_only_where_their_own_work_exceeds_its_share() {
        let p = Duration::from_millis(100);
        // A KVM guest's 0.3 ms of work: the configured period.
        assert_eq!(stretched_period(p, 300_000), p);
        assert_eq!(stretched_period(p, 0), p);
        // 2.5 ms of work (an emulated guest): 550 ms periods.
        assert_eq!(stretched_period(p, 2_500_000), Duration::from_millis(550));
        // Never more than ten times the configured period.
        assert_eq!(stretched_period(p, 5_000_000), Duration::from_secs(1));
        assert_eq!(stretched_period(p, u64::MAX), Duration::from_secs(1));
    }

    /// The procfs sampler under a tight budget: a first period that reads every thread,
    /// cheap cycles, and every 32nd reads every thread again (the shape measured with 1,000
    /// busy threads: 18 ms, 0.35 ms and 8–15 ms). Gleaner's whole cost stays within its share
    /// of the run's time, spikes included, and the periods come back to the configured one
    /// soon after each spike.
    #[test]
    fn own_cpu_budget_holds_a_spiky_cost_to_its_share_and_recovers() {
        let base = Duration::from_millis(100);
        let cost = |k: u64| match k {
            0 => 18_000_000,
            k if k % 32 == 31 => 12_000_000,
            _ => 350_000,
        };
        let mut budget = OwnCpuBudget::new(base);
        let (mut spent, mut elapsed, mut excess) = (0u64, 0u64, 0u64);
        let earned_per_base = base.as_nanos() as u64 / u64::from(PERIOD_WORK_SHARE);
        let mut stretched = Vec::new();
        for k in 0..3200 {
            let period = budget.period();
            if period > base {
                stretched.push(k);
            }
            let ns = period.as_nanos() as u64;
            elapsed += ns;
            spent += cost(k);
            excess += cost(k).saturating_sub(earned_per_base);
            budget.add(ns, cost(k), false);
        }
        let share = spent as f64 / elapsed as f64;
        assert!(
            share <= 1.0 / f64::from(PERIOD_WORK_SHARE),
            "own CPU {:.3} % of the run",
            share * 100.0
        );
        // Stretched no more than it takes to earn what the costly cycles spent beyond a
        // configured period's earnings (5 % slack).
        let stretch_ns = elapsed - 3200 * base.as_nanos() as u64;
        let needed_ns = excess * u64::from(PERIOD_WORK_SHARE);
        assert!(
            stretch_ns as f64 <= 1.05 * needed_ns as f64,
            "stretched {stretch_ns} ns, needed {needed_ns}"
        );
        // Each spike is repaid within three periods (at most 1 s each), then back to 100 ms;
        // the first read's 18 ms, 3.96 s of earnings at 1/220, within five.
        let after_start = stretched.iter().filter(|&&k| k < 31).count();
        assert!(
            after_start <= 5,
            "periods stretched after the first: {stretched:?}"
        );
        assert!(
            stretched.len() <= 4 + 3 * (3200 / 32),
            "{} stretched periods",
            stretched.len()
        );
    }

    /// A workload whose every cycle costs more than its share (an emulated guest's 2.5 ms):
    /// periods settle where each earns its cost, and never beyond ten times the configured one.
    #[test]
    fn own_cpu_budget_stretches_steady_costs_to_their_share_and_no_further() {
        let base = Duration::from_millis(100);
        for (cost, want) in [
            (300_000u64, base),
            (2_500_000, Duration::from_millis(550)),
            (50_000_000, base * 10),
        ] {
            let mut budget = OwnCpuBudget::new(base);
            for _ in 0..50 {
                let p = budget.period();
                budget.add(p.as_nanos() as u64, cost, false);
            }
            let got = budget.period();
            let diff = got.as_nanos().abs_diff(want.as_nanos());
            assert!(
                diff <= want.as_nanos() / 100,
                "cost {cost} ns: period {got:?}, want {want:?}"
            );
        }
    }

    /// Runs `periods` cycles as the controller does with the BPF sampler: a cycle costs
    /// `cycle_ns`, one that opens a window `window_extra_ns` more; a window comes whenever
    /// `sampler::window_due` says so for rates that still hold (affordability taken from the
    /// budget, or ignored where `wait_for_budget` is false: windows every ten periods, the
    /// rule before). Returns the periods run, the periods between windows, and Gleaner's
    /// CPU over the time they took, as a fraction.
    fn run_with_windows(
        cycle_ns: u64,
        window_extra_ns: u64,
        periods: u32,
        wait_for_budget: bool,
    ) -> (Vec<Duration>, Vec<u32>, f64) {
        let base = Duration::from_millis(100);
        let mut budget = OwnCpuBudget::new(base);
        let (mut lengths, mut spacings) = (Vec::new(), Vec::new());
        let (mut since, mut measured_before, mut window_next) = (0u32, false, true);
        let (mut elapsed, mut cpu) = (0u64, 0u64);
        for _ in 0..periods {
            let p = budget.period();
            let cost = cycle_ns + if window_next { window_extra_ns } else { 0 };
            budget.add(p.as_nanos() as u64, cost, window_next);
            lengths.push(p);
            elapsed += p.as_nanos() as u64;
            cpu += cost;
            if window_next {
                measured_before = true;
            }
            since += 1;
            window_next = crate::sampler::window_due(crate::sampler::WindowChoice {
                measured_before,
                periods_since: since,
                rates_hold: true,
                affordable: !wait_for_budget || budget.window_affordable(),
            });
            if window_next {
                spacings.push(since);
                since = 0;
            }
        }
        (lengths, spacings, cpu as f64 / elapsed as f64)
    }

    /// A packed ping-pong on the haltpoll guest, as measured (2026-12-02): cycles of 0.35 ms,
    /// windows 2.2 ms dearer. A window every ten periods stretched the periods after each
    /// to repay it; waiting for the budget to have saved a window's price keeps every period
    /// at 100 ms, spaces the windows by what the cycles leave over, and holds the same share.
    #[test]
    fn a_refresh_window_waits_for_its_price_instead_of_stretching_the_periods_after_it() {
        let share = 1.0 / f64::from(PERIOD_WORK_SHARE);
        let base = Duration::from_millis(100);
        let (before, _, before_cpu) = run_with_windows(350_000, 2_200_000, 600, false);
        assert!(
            before.iter().filter(|&&p| p > base).count() >= 40,
            "windows every ten periods stretch: {before:?}"
        );
        assert!(before_cpu <= share * 1.01, "{before_cpu}");
        let (lengths, spacings, cpu) = run_with_windows(350_000, 2_200_000, 600, true);
        // Only the first window, priced when it came, leaves a debt behind it.
        let stretched: Vec<usize> = (0..lengths.len()).filter(|&k| lengths[k] > base).collect();
        assert!(stretched.iter().all(|&k| k < 5), "stretched: {stretched:?}");
        // The first three settle the typical cycle and the window's price.
        // 2.2 ms saved at (0.4545 - 0.35) ms a period: a window every 22 periods (21 to save,
        // the window's own).
        let steady = &spacings[3..];
        assert!(
            steady.iter().all(|&s| (20..=23).contains(&s)),
            "spacings {spacings:?}"
        );
        assert!(cpu <= share * 1.01, "own CPU {cpu} over its share {share}");
    }

    /// Where a cycle alone costs more than its share, nothing is saved for a window: the
    /// periods stretch as before, and the rates are still refreshed at the latest spacing.
    #[test]
    fn a_window_that_is_never_affordable_still_comes_at_the_latest_spacing() {
        let share = 1.0 / f64::from(PERIOD_WORK_SHARE);
        let (_, spacings, cpu) = run_with_windows(600_000, 2_200_000, 1_000, true);
        assert!(!spacings.is_empty(), "no window after the first");
        assert!(
            spacings
                .iter()
                .all(|&s| s <= crate::sampler::MAX_WINDOW_SPACING_PERIODS),
            "{spacings:?}"
        );
        assert!(cpu <= share * 1.02, "own CPU {cpu} over its share {share}");
    }

    #[test]
    fn rate_limit_lets_one_through_per_interval_and_counts_the_rest() {
        let mut limit = RateLimit::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(limit.admit(t0), Some(0));
        for s in 1..24 {
            assert_eq!(limit.admit(t0 + Duration::from_secs(s)), None, "second {s}");
        }
        assert_eq!(limit.admit(t0 + Duration::from_secs(60)), Some(23));
        assert_eq!(limit.admit(t0 + Duration::from_secs(61)), None);
        assert_eq!(limit.admit(t0 + Duration::from_secs(200)), Some(1));
    }
}
