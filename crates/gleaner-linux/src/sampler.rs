//! Builds the policy's [`PeriodSample`] from what Linux exposes.
//!
//! The paper's T_work, T_yield, T_idle, S_work and S_yield (§6) come from different places
//! depending on the machine and privileges, and this module is where those choices are made
//! once, explicitly:
//!
//! * idle time and idle entries per vCPU: the cpuidle driver's counters where it has them
//!   ([`CpuidleCounters`]: exact, kept open, 8 µs a period); elsewhere, with the BPF sampler,
//!   see below; with procfs, idle time from
//!   `/proc/timer_list` `idle_sleeptime` + `iowait_sleeptime` (root, nanoseconds) when
//!   readable, else `/proc/stat` idle ticks, and idle entries from the best
//!   [`IdleEntryCounter`] source;
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
//!
//! Two samplers stand behind [`Sampler`], chosen once at start ([`SamplerPreference`]):
//!
//! * **bpf** (default where it loads, see [`crate::bpf`]): idle entries and idle time per
//!   vCPU from the cpuidle counters where there are some (then `power:cpu_idle` is attached
//!   only inside measurement windows, to classify wake-ups: its idle exit lies on every
//!   wakee's critical path); where there are none, from `power:cpu_idle` until the program
//!   has found the kernel's own per-CPU idle records and checked that their idle-loop passes
//!   cover its halts, and from then on from those ([`KernelSampler::read_tick_idle`]): their
//!   idle-loop passes and time times the shares that `power:cpu_idle`, inside the windows,
//!   saw halt ([`HaltRatio`]); on a kernel whose records count fewer passes than there are
//!   halts but whose idle time covers the halted time, idle time from the records and halts
//!   from that time over the mean halt `power:cpu_idle` measured in the windows
//!   ([`RecordCounts::TimeOnly`]);
//!   workload run time and context switches per vCPU from
//!   `sched_switch`, the queued time of workload threads while another active vCPU idles, and
//!   every wake-up of a workload thread timed from `sched_waking` to its switch-in, split by
//!   the state of the vCPU it ran on ([`WakeLatencies`]). A period's read is one map lookup
//!   plus `/proc/stat` for steal; nothing is read per thread, and the controller does not
//!   sub-sample.
//! * **procfs** (no root, no BTF, locked-down kernel): the sources listed above, under a CPU
//!   budget ([`ProcfsBudget`]): when reading every thread's files costs more than the budget,
//!   per-thread context switches are read every 2nd, 4th… period and fewer threads' run states
//!   per sub-sample. It cannot time wake-ups at all.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use gleaner_policy::{Cpuset, PeriodSample, RatesFrom, VcpuSample, WakeLatencies};

use crate::bpf::{CpuCounters, IdleSpan, KernelSampler, RecordCounts, Unavailable};
use crate::error::Result;
use crate::idle_entries::{of_cpus, IdleEntryCounter, IdleEntrySource};
use crate::procfs::{ProcFs, ProcStatFile, TaskStatFile};
use crate::retention::RetentionCounters;
use crate::sysfs::{CpuidleCounters, IdleTotals, SysFs};

/// Which sampler to run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SamplerPreference {
    /// The BPF sampler where it loads, else procfs (with one info line saying why).
    #[default]
    Auto,
    /// The BPF sampler or an error.
    Bpf,
    /// The procfs sampler even where BPF would load.
    Procfs,
}

/// The sampler that runs, as `status` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplerKind {
    Bpf,
    Procfs,
}

impl SamplerKind {
    pub fn name(self) -> &'static str {
        match self {
            SamplerKind::Bpf => "bpf",
            SamplerKind::Procfs => "procfs",
        }
    }
}

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
    /// (pid, tid) of every workload thread (for context switches); with the BPF sampler and
    /// a cgroup placement, one (pid, pid) per process (see `Sampler::wants_thread_list`).
    pub tids: Vec<(u32, u32)>,
    /// Cumulative workload ns per CPU id, when the placement back end measures it.
    pub percpu_work_ns: Option<Vec<u64>>,
    /// Cumulative workload CPU ns from the cgroup, when the back end measures it.
    pub total_work_ns: Option<u64>,
}

mod cost;
mod deltas;
pub use cost::{
    window_due, Pace, PaceHistory, ProcfsBudget, SamplingCost, Window, WindowChoice,
    FIRST_WINDOW_NS, MAX_WINDOW_SPACING_PERIODS, PROCFS_BUDGET_FRACTION, WINDOW_EVENTS,
    WINDOW_EVERY_PERIODS,
};
use deltas::work_between;
pub use deltas::{kernel_delta, wake_delta};

/// Threads whose run state is read per sub-sample; a rotating window keeps the cost flat
/// for workloads with hundreds of threads.
const RUNNABLE_WINDOW: usize = 32;

/// A sampler's kernel side, loaded before its workload is known ([`Sampler::prepare`]);
/// `None` where the procfs sampler will run.
pub struct PreparedSampler {
    kernel: Option<KernelSampler>,
}

pub struct Sampler {
    procfs: ProcFs,
    /// `/proc/stat`, read every period through one open file.
    proc_stat: ProcStatFile,
    /// Each workload process's `stat` (its thread count), read every period by the BPF
    /// sampler; kept for the processes of the last sample.
    process_stats: HashMap<u32, TaskStatFile>,
    cpus: Cpuset,
    /// The BPF sampler, when it runs; the procfs sources below are then not read.
    kernel: Option<KernelSampler>,
    /// Its counters at the previous sample, indexed by CPU id.
    kernel_prev: Vec<CpuCounters>,
    /// Wake-ups timed since start (cumulative, for `status` and the metrics).
    wake_total: WakeLatencies,
    /// Tracepoint events the BPF program handled since start.
    kernel_events: u64,
    /// The BPF sampler's current measurement window.
    window: Window,
    /// A partial window waiting to be opened by [`Sampler::begin_window`], `len` before the
    /// period ends; until then the scheduler programs are detached.
    pending_window_ns: Option<u64>,
    /// The current window was opened by `begin_window` and lasts until the next read.
    window_at_end: bool,
    /// The next read is the last ([`Sampler::sample_last`]): no window follows it.
    closing: bool,
    /// Periods since the last window was opened.
    periods_since_window: u32,
    /// Whether Gleaner's own-CPU budget can pay for a window now ([`Sampler::set_window_affordable`]).
    window_affordable: bool,
    /// Set when this period has no window ([`WINDOW_EVERY_PERIODS`]) and the last one's
    /// counts stand for it: the window it would have had ([`Sampler::measure_next_period`]).
    skipped_len_ns: Option<u64>,
    /// What the last window measured, unscaled.
    last_window: Option<WindowCounts>,
    /// The pace of the last period whose rates were measured, not reused: a later period
    /// reuses them only while its own pace resembles this ([`Pace::resembles`]).
    measured_pace: Option<Pace>,
    /// The last periods' paces, for how far this workload's pace moves on its own.
    pace_history: PaceHistory,
    budget: ProcfsBudget,
    /// Sampling CPU ns spent on the controller thread this period (procfs).
    cost_ns: u64,
    /// The parts of `cost_ns` spent reading switch counts (with listing the threads) and run
    /// states: what the budget's thinning acts on.
    switch_cost_ns: u64,
    run_state_cost_ns: u64,
    /// Periods since the per-thread switches were last read, the workload's run time in
    /// them, and the switches per ns of run time then measured: the periods between reads
    /// get as many switches as their own run time makes at that rate. Counted per period, a
    /// rate read in a start-up period (a quarter as long) stood for periods four times
    /// longer, and a ping-pong's g_comp read 33 µs instead of 8 (2026-12-02).
    switch_periods: u64,
    switch_span_work_ns: u64,
    switches_per_work_ns: Option<f64>,
    /// The period length the next period's sampling CPU is charged against, where longer
    /// than its own ([`Sampler::charge_next_as_period_of`]).
    budget_period_ns: Option<u64>,
    /// Sub-sample slices seen this period (for thinning).
    /// Full-rate sub-sample slices since run states were last read.
    slices_unread: u32,
    /// Idle-entry counts for procfs; `None` with the BPF sampler, which counts them itself.
    entries: Option<IdleEntryCounter>,
    /// Where each vCPU's idle time is read whole once a period rather than counted event by
    /// event (the BPF sampler then attaches `cpu_idle` only in windows,
    /// [`KernelSampler::idle_in_windows_only`]).
    idle_reads: Option<IdleReads>,
    /// With [`IdleReads::TickRecords`]: per vCPU, what the records and `cpu_idle` had counted
    /// when the current window opened (cumulative), and the shares of the records that
    /// `cpu_idle` saw halt ([`HaltRatio`]).
    window_records: Option<Vec<IdleSpan>>,
    /// With [`IdleReads::TickRecords`]: per vCPU, `cpu_idle`'s halts and halted time at the
    /// last read of the records (`KernelSampler::traced_at_snapshot`).
    traced_before: Vec<(u64, u64)>,
    halt_ratios: Vec<HaltRatio>,
    precise_idle: bool,
    rotate: usize,
    prev: Option<Snapshot>,
    prev_time_ns: u64,
    /// Per thread id: cumulative context switches last seen.
    switches: HashMap<u32, u64>,
    /// Set once a thread's `schedstat` was missing while its `status` was there.
    no_schedstat: bool,
    /// Per process (pid, start ticks): cumulative CPU ns last seen.
    clocks: HashMap<(u32, u64), u64>,
    /// CPU ns of workload processes that have exited.
    retired_ns: u64,
    /// Runnable sub-samples this period: (crowded, total).
    crowded: (u32, u32),
}

/// Where a sampler reads each vCPU's idle time whole, once a period.
#[derive(Debug)]
enum IdleReads {
    /// The cpuidle driver's counters of `cpus`, kept open: idle time and entries, exact
    /// (either sampler).
    Cpuidle(CpuidleCounters),
    /// The kernel's own per-CPU idle records, read by the BPF sampler where there is no
    /// driver ([`KernelSampler::read_tick_idle`]): the idle loop's passes and time, of which
    /// [`HaltRatio`] makes halts and halted time, from both or from the time alone.
    TickRecords(RecordCounts),
}

/// Halts per pass of the idle loop, and halted time per ns of the loop's time, on one vCPU,
/// where the kernel's records count the passes and time and no cpuidle driver the halts. A
/// pass that could stop the tick is counted before the vCPU halts, and a wake-up arriving in
/// between ends it without a halt (and without an IPI: the idle loop polls its flag): on a
/// quiet machine every pass halted (1,640 of 1,640 in the test of the records,
/// crates/gleaner-linux/src/bpf); with other tests running beside it, 4,494 of 6,038 did. And
/// the records' time runs from the idle loop's entry to the first interrupt, which includes
/// stopping the tick (a timer reprogrammed: a vCPU exit), where `cpu_idle`'s runs from the
/// halt to its end: `sysbench threads`' mean idle period read 17–18 µs from the cpuidle
/// driver and 25–29 µs from the records uncorrected (haltpoll guest, 2026-11-27). So
/// `cpu_idle` measures both shares wherever it is attached (the check of the records, the
/// windows, or a whole period), pooled until [`MIN_RATIO_PASSES`] passes back them (a fine
/// pipeline idles 300–450 times a second per vCPU: about 3 passes in a 10 ms window), and
/// the periods between take the last shares measured; counts are then what the cpuidle
/// driver would give.
///
/// Where the records' passes miss halts ([`RecordCounts::TimeOnly`]) the halts per ns of the
/// records' idle time stand in for the share per pass: the mean halt, as switches per ns of
/// run time give the grain between windows (`WindowCounts::scaled_to`). `cpu_idle` counts a
/// halt when it ends, with its time, so a window's mean halt is right but for the halt under
/// way when it opened, counted with only its part inside.
#[derive(Debug, Clone, Copy, PartialEq)]
struct HaltRatio {
    per_pass: f64,
    per_record_ns: f64,
    halts_per_record_ns: f64,
    /// Measured since the shares were last set.
    pending: IdleSpan,
}

/// Passes (or, with [`RecordCounts::TimeOnly`], halts) the pooled measurements must span
/// before they set the shares: shares from a handful would swing with one pass.
const MIN_RATIO_PASSES: u64 = 20;

/// Idle time in the records after which the pooled measurements set the shares however few
/// halts they saw (a vCPU that idles in long halts, or hardly at all).
const MIN_RATIO_RECORD_NS: u64 = 100_000_000;

impl Default for HaltRatio {
    fn default() -> Self {
        HaltRatio {
            per_pass: 1.0,
            per_record_ns: 1.0,
            // Nothing measured: no halts, rather than a guess of their length.
            halts_per_record_ns: 0.0,
            pending: IdleSpan::default(),
        }
    }
}

impl HaltRatio {
    /// Adds what `cpu_idle` and the records counted over one span. `Err` where what the
    /// records count cannot stand in for `cpu_idle`'s: more halts than passes, or (with
    /// [`RecordCounts::TimeOnly`]) more halted time than idle time.
    fn measure(&mut self, span: IdleSpan, counts: RecordCounts) -> std::result::Result<(), ()> {
        let covered = match counts {
            RecordCounts::PassesAndTime => crate::bpf::passes_cover_halts(span.passes, span.halts),
            RecordCounts::TimeOnly => {
                crate::bpf::idle_time_covers_halted(span.record_ns, span.halts, span.halted_ns)
            }
        };
        if !covered {
            return Err(());
        }
        let p = &mut self.pending;
        p.passes += span.passes;
        p.record_ns += span.record_ns;
        p.halts += span.halts;
        p.halted_ns += span.halted_ns;
        let enough = match counts {
            RecordCounts::PassesAndTime => p.passes >= MIN_RATIO_PASSES,
            RecordCounts::TimeOnly => {
                p.halts >= MIN_RATIO_PASSES || p.record_ns >= MIN_RATIO_RECORD_NS
            }
        };
        if enough {
            if p.passes > 0 {
                self.per_pass = (p.halts as f64 / p.passes as f64).min(1.0);
            }
            if p.record_ns > 0 {
                self.per_record_ns = (p.halted_ns as f64 / p.record_ns as f64).min(1.0);
                self.halts_per_record_ns = p.halts as f64 / p.record_ns as f64;
            }
            self.pending = IdleSpan::default();
        }
        Ok(())
    }

    /// Halts and halted time of a period whose records counted `passes` and `record_ns`.
    fn apply(&self, passes: u64, record_ns: u64, counts: RecordCounts) -> (u64, u64) {
        let halts = match counts {
            RecordCounts::PassesAndTime => passes as f64 * self.per_pass,
            RecordCounts::TimeOnly => record_ns as f64 * self.halts_per_record_ns,
        };
        (
            halts.round() as u64,
            (record_ns as f64 * self.per_record_ns).round() as u64,
        )
    }
}

/// What one measurement window counted, and how long it measured.
#[derive(Debug, Clone, Default)]
struct WindowCounts {
    covered_ns: u64,
    events: u64,
    switches: u64,
    /// The workload's run time inside the window, as the programs counted it.
    work_ns: u64,
    crowded_ns: u64,
    /// How many waits `crowded_ns` adds up.
    crowded_waits: u64,
    wake: WakeLatencies,
}

/// Crowded waits a window must have seen before its crowded time is scaled up to stand for
/// whole periods. One wait of a millisecond in a 5 ms window, scaled, reads as 18 % of every
/// period the window stands for: a ping-pong's start-up window once saw one such wait, and
/// its 18 % (over `max_runnable_wait`, 10 %) kept Gleaner from consolidating it for the ten
/// periods that reused the window, 0.5 s of a 3 s run (1 run in 24 on the `none` guest,
/// 2026-11-26). A count of k events estimates a rate within about 1/sqrt(k).
pub(crate) const MIN_SCALED_CROWDED_WAITS: u64 = 3;

impl WindowCounts {
    /// Its counts as if measured over a period of `period_ns` in which the workload ran
    /// `period_work_ns`. Switches scale with run time, not with time: g_comp (run time per
    /// switch) is then the window's own, whatever the rest of the period did. Scaled with
    /// time, a period that ran long (the controller late by 10–15 ms, the workload running
    /// without switching meanwhile) read the ping-pong's g_comp as 20–29 µs instead of the
    /// window's 9–10, failed the consolidation's grain condition, and Gleaner held both vCPUs
    /// by polling instead (x0.6 of one vCPU) in 1 to 4 runs of 10. Idle-peer queueing and
    /// wake-ups are rates in time and scale with it, except idle-peer queueing seen in fewer
    /// than [`MIN_SCALED_CROWDED_WAITS`] waits: the window's own period (`in_window`) keeps
    /// what was measured, unscaled, and the periods it stands for get none.
    fn scaled_to(
        &self,
        period_ns: u64,
        period_work_ns: u64,
        in_window: bool,
    ) -> (u64, u64, WakeLatencies) {
        let covered = self.covered_ns.max(1) as u128;
        let scale = |x: u64| (x as u128 * period_ns as u128 / covered) as u64;
        let switches = if self.work_ns > 0 {
            (self.switches as u128 * period_work_ns as u128 / self.work_ns as u128) as u64
        } else {
            scale(self.switches)
        };
        let crowded = if self.crowded_waits >= MIN_SCALED_CROWDED_WAITS {
            scale(self.crowded_ns)
        } else if in_window {
            self.crowded_ns
        } else {
            0
        };
        (
            switches,
            crowded,
            self.wake.scaled(period_ns, self.covered_ns.max(1)),
        )
    }
}

/// The workload's run time over all vCPUs.
fn total_work(vcpus: &[VcpuSample]) -> u64 {
    vcpus.iter().map(|v| v.work_ns).sum()
}

impl Sampler {
    /// The procfs sampler.
    pub fn new(procfs: ProcFs, sys_root: impl Into<PathBuf>, cpus: Cpuset) -> Self {
        let sys_root = sys_root.into();
        let list: Vec<usize> = cpus.iter().collect();
        let entries = IdleEntryCounter::open(&sys_root, procfs.root(), &list);
        // Where the cpuidle driver counts idle, its counters give idle time and entries
        // exactly for 8 µs a period; `/proc/timer_list`, the other exact source of idle time,
        // is printed whole on each read.
        let idle_reads = if entries.source() == IdleEntrySource::Cpuidle {
            CpuidleCounters::open(&SysFs::new(&sys_root), &list)
                .ok()
                .flatten()
                .map(IdleReads::Cpuidle)
        } else {
            None
        };
        let me = Self::with(procfs, cpus, Some(entries), None);
        Self {
            precise_idle: me.precise_idle && idle_reads.is_none(),
            idle_reads,
            ..me
        }
    }

    fn with(
        procfs: ProcFs,
        cpus: Cpuset,
        entries: Option<IdleEntryCounter>,
        kernel: Option<KernelSampler>,
    ) -> Self {
        let precise_idle = kernel.is_none() && matches!(procfs.timer_list(), Ok(Some(_)));
        Self {
            proc_stat: procfs.stat_file(),
            process_stats: HashMap::new(),
            procfs,
            cpus,
            kernel,
            kernel_prev: Vec::new(),
            wake_total: WakeLatencies::default(),
            kernel_events: 0,
            window: Window::default(),
            pending_window_ns: None,
            window_at_end: false,
            closing: false,
            periods_since_window: 0,
            window_affordable: true,
            skipped_len_ns: None,
            last_window: None,
            measured_pace: None,
            pace_history: PaceHistory::default(),
            budget: ProcfsBudget::new(PROCFS_BUDGET_FRACTION),
            cost_ns: 0,
            switch_cost_ns: 0,
            run_state_cost_ns: 0,
            switch_periods: 0,
            budget_period_ns: None,
            switch_span_work_ns: 0,
            switches_per_work_ns: None,
            slices_unread: 0,
            entries,
            idle_reads: None,
            window_records: None,
            halt_ratios: Vec::new(),
            traced_before: Vec::new(),
            precise_idle,
            rotate: 0,
            prev: None,
            prev_time_ns: 0,
            switches: HashMap::new(),
            no_schedstat: false,
            clocks: HashMap::new(),
            retired_ns: 0,
            crowded: (0, 0),
        }
    }

    /// Loads and attaches the sampler's kernel side that `preference` asks for, before the
    /// workload is known. With `Auto`, a BPF sampler that cannot load is reported in one info
    /// line and procfs runs instead; with `Bpf` that is an error. `gleaner run` does this
    /// before it starts the workload: the BPF verifier's tens of milliseconds of CPU then do
    /// not compete with the workload's first moments, and the sampler sees the workload from
    /// its first instruction.
    pub fn prepare(
        sys_root: &Path,
        preference: SamplerPreference,
    ) -> std::result::Result<PreparedSampler, Unavailable> {
        if preference == SamplerPreference::Procfs {
            return Ok(PreparedSampler { kernel: None });
        }
        match load_kernel_sampler(sys_root) {
            Ok(kernel) => {
                tracing::debug!("BPF sampler loaded");
                Ok(PreparedSampler {
                    kernel: Some(kernel),
                })
            }
            Err(why) if preference == SamplerPreference::Auto => {
                tracing::info!("sampling from /proc (no wake-latency histogram, CPU budget {:.1} % of one CPU): {why}", PROCFS_BUDGET_FRACTION * 100.0);
                Ok(PreparedSampler { kernel: None })
            }
            Err(why) => Err(why),
        }
    }

    /// The sampler for the workload on `cpus`, from what [`Sampler::prepare`] loaded.
    pub fn from_prepared(
        procfs: ProcFs,
        sys_root: impl Into<PathBuf>,
        cpus: Cpuset,
        prepared: PreparedSampler,
    ) -> Self {
        match prepared.kernel {
            Some(mut kernel) => {
                let list: Vec<usize> = cpus.iter().collect();
                let mut idle_reads = None;
                if kernel.idle_in_windows_only() {
                    match CpuidleCounters::open(&SysFs::new(sys_root.into()), &list) {
                        Ok(Some(c)) => idle_reads = Some(IdleReads::Cpuidle(c)),
                        // The workload's CPUs lack the counters the loader saw: the program
                        // counts idle itself, as where there is no cpuidle driver.
                        Ok(None) => kernel.count_idle_always(),
                        Err(e) => {
                            tracing::debug!("{e}");
                            kernel.count_idle_always();
                        }
                    }
                }
                Self {
                    idle_reads,
                    ..Self::with(procfs, cpus, None, Some(kernel))
                }
            }
            None => Self::new(procfs, sys_root, cpus),
        }
    }

    pub fn kind(&self) -> SamplerKind {
        if self.kernel.is_some() {
            SamplerKind::Bpf
        } else {
            SamplerKind::Procfs
        }
    }

    /// What this sampler cannot see, one phrase each, for `status`.
    pub fn blind_spots(&self) -> Vec<String> {
        match self.kind() {
            SamplerKind::Bpf => {
                let mut v = vec![
                    "wake-ups before it attached".to_string(),
                    "queued workload threads while an idle peer vCPU has an id of 64 or more"
                        .to_string(),
                ];
                if let Some(len) = self.window.len_ns {
                    v.push(format!(
                        "wake-ups and switches outside its measurement windows ({:.1} ms in one period of every {WINDOW_EVERY_PERIODS} at this event rate, to stay under {WINDOW_EVENTS} events a window; switch counts and queueing are scaled up and stand for the periods between, wake latencies are a sample)",
                        len as f64 / 1e6
                    ));
                }
                v
            }
            SamplerKind::Procfs => {
                let mut v =
                    vec!["wake latency (needs the BPF sampler: root and kernel BTF)".to_string()];
                if self.budget.level() > 0 {
                    v.push(format!(
                        "per-thread context switches between reads (every {} periods), and run states beyond {} threads at every {}th sub-sample, to stay within {:.1} % of a CPU",
                        self.budget.switch_stride(),
                        self.budget.runnable_window(),
                        self.budget.runnable_every(),
                        self.budget.fraction * 100.0
                    ));
                }
                v
            }
        }
    }

    /// Whether the controller should sub-sample run states between samples (procfs only:
    /// the BPF sampler measures queueing continuously).
    pub fn wants_sub_samples(&self) -> bool {
        self.kernel.is_none()
    }

    /// How many times a period the controller should wake to sub-sample, out of `full` at
    /// full rate: once for the BPF sampler (it measures queueing continuously), fewer under a
    /// tight procfs budget.
    pub fn sub_sample_wakeups(&self, full: u32) -> u32 {
        if self.kernel.is_some() {
            1
        } else {
            self.budget.wakeups_per_period(full.max(1))
        }
    }

    /// How long before the period ends the caller should call [`Sampler::begin_window`]:
    /// where scheduler events are too many to measure all period, the BPF sampler measures
    /// them in a window at the end of each period, with its `sched_switch` and `sched_waking`
    /// programs detached until then (see `KernelSampler::set_scheduler_programs`).
    pub fn window_lead_ns(&self) -> Option<u64> {
        self.pending_window_ns
    }

    /// Measures the coming period after all, when it was to reuse the last window's rates:
    /// the caller changed what the workload runs on (vCPUs, retention), and the rates
    /// measured before the change no longer describe it.
    pub fn measure_next_period(&mut self) {
        if let Some(len) = self.skipped_len_ns.take() {
            self.periods_since_window = 0;
            self.pending_window_ns = Some(len);
        }
    }

    /// Tells the sampler whether the controller's own-CPU budget has saved what a window
    /// costs; a window whose rates are only due for a refresh waits for it ([`window_due`]).
    pub fn set_window_affordable(&mut self, affordable: bool) {
        self.window_affordable = affordable;
    }

    /// Opens the window that [`Sampler::window_lead_ns`] asked for: attaches the scheduler
    /// programs and measures until the next read.
    pub fn begin_window(&mut self) {
        let Some(len) = self.pending_window_ns.take() else {
            return;
        };
        let now = gleaner_sys::clock::monotonic_ns();
        if let Some(k) = self.kernel.as_mut() {
            if let Err(e) = k.set_scheduler_programs(true) {
                tracing::warn!("{e}; this period's wake-ups are not measured");
                self.window_records = None;
                return;
            }
            // Where `cpu_idle`'s halts are compared with the records, both are counted from
            // here, once the programs are attached: attaching them patches kernel text, an IPI
            // to every vCPU, which cuts idle vCPUs' halts short, halts only a window has.
            // Counted from before the attach, a ping-pong's windows read 13 % more halts per
            // ns of idle than `cpu_idle` attached all along (6,673 against 5,921 in 30
            // periods; kernel 6.18.44-fc-v1045, where halts come from that rate).
            if matches!(self.idle_reads, Some(IdleReads::TickRecords(_))) {
                let cpus: Vec<usize> = self.cpus.iter().collect();
                self.window_records = k.idle_spans_of(&cpus);
            }
            k.open_window(now, None);
            tracing::trace!(
                len_ns = len,
                opening_ns = gleaner_sys::clock::monotonic_ns().saturating_sub(now),
                "window opened"
            );
        }
        self.window = Window {
            start_ns: now,
            len_ns: Some(len),
        };
        self.window_at_end = true;
    }

    /// Whether the caller must list every workload thread in [`WorkloadView::tids`] (procfs),
    /// or only its processes (BPF: `tids` may then hold one (pid, pid) per process).
    pub fn wants_thread_list(&self) -> bool {
        self.kernel.is_none()
    }

    /// Whether the next [`Sampler::sample`] reads every thread's files and so needs a fresh
    /// thread list. Under a tight budget those reads happen every few periods, and listing
    /// 1,000 threads in between (a sorted `cgroup.procs`, a directory per process) was a
    /// third of the sampler's cost.
    pub fn needs_fresh_thread_list(&self) -> bool {
        self.kernel.is_none()
            && (self.prev.is_none() || self.switch_periods + 1 >= self.budget.switch_stride())
    }

    /// Charges CPU time the caller spent for this sampler (listing the workload's threads) to
    /// the procfs budget, which must hold Gleaner's whole cost, not only the reads in here.
    pub fn charge(&mut self, cost_ns: u64) {
        if self.kernel.is_none() {
            self.cost_ns += cost_ns;
        }
    }

    /// [`Sampler::charge`] for listing the workload's threads, a cost that grows with them
    /// and that thinning saves (a fresh list is wanted only when switches are read).
    pub fn charge_thread_listing(&mut self, cost_ns: u64) {
        if self.kernel.is_none() {
            self.cost_ns += cost_ns;
            self.switch_cost_ns += cost_ns;
        }
    }

    /// Wake-ups timed since start, split by the wakee vCPU's state; `None` for procfs.
    pub fn wake_latency_total(&self) -> Option<&WakeLatencies> {
        self.kernel.as_ref().map(|_| &self.wake_total)
    }

    /// Tracepoint events the BPF program handled since start (0 for procfs).
    pub fn kernel_events(&self) -> u64 {
        self.kernel_events
    }

    pub fn budget(&self) -> &ProcfsBudget {
        &self.budget
    }

    /// Gleaner's retention threads, so that a vCPU running one counts as polling.
    pub fn set_retention_threads(&mut self, tids: &[i32]) {
        if let Some(k) = &mut self.kernel {
            k.set_retention_threads(tids);
        }
    }

    /// The vCPUs the workload may use now.
    pub fn set_active(&mut self, active: &Cpuset) {
        if let Some(k) = &mut self.kernel {
            k.set_active(active.iter());
        }
    }

    /// Where idle entries come from, as `status` names it.
    pub fn idle_source_name(&self) -> String {
        match (&self.idle_reads, &self.entries) {
            (Some(IdleReads::Cpuidle(_)), _) => "cpuidle".into(),
            (Some(IdleReads::TickRecords(RecordCounts::PassesAndTime)), _) => "tick-sched".into(),
            (Some(IdleReads::TickRecords(RecordCounts::TimeOnly)), _) => {
                "tick-sched-idle-time".into()
            }
            (None, Some(e)) => format!("{:?}", e.source()).to_lowercase(),
            (None, None) => "bpf".into(),
        }
    }

    pub fn idle_source(&self) -> IdleEntrySource {
        match self.idle_reads {
            Some(IdleReads::Cpuidle(_)) => return IdleEntrySource::Cpuidle,
            Some(IdleReads::TickRecords(RecordCounts::PassesAndTime)) => {
                return IdleEntrySource::TickSched
            }
            Some(IdleReads::TickRecords(RecordCounts::TimeOnly)) => {
                return IdleEntrySource::TickSchedIdleTime
            }
            None => {}
        }
        self.entries
            .as_ref()
            .map(|e| e.source())
            .unwrap_or(IdleEntrySource::Tracepoint)
    }

    /// Called several times per period: are workload threads queueing on one vCPU while
    /// another active vCPU has none of them? That is the moment a retention thread does harm:
    /// an idle vCPU would pull the waiting thread over by new-idle balancing, a held one does
    /// not. Reads the run state and CPU of up to [`RUNNABLE_WINDOW`] threads, rotating
    /// through larger workloads.
    /// `slices` is how many full-rate slices this wake-up stands for (see
    /// [`Sampler::sub_sample_wakeups`]).
    pub fn observe_runnable(&mut self, tids: &[(u32, u32)], active: &Cpuset, slices: u32) {
        if self.kernel.is_some() || tids.is_empty() || active.len() < 2 {
            return;
        }
        let every = self.budget.runnable_every();
        self.slices_unread += slices.max(1);
        if self.slices_unread < every {
            return;
        }
        // The remainder carries over, so the reads keep their rate when a wake-up stands for
        // a number of slices that does not divide it.
        self.slices_unread = (self.slices_unread - every).min(every - 1);
        let t0 = gleaner_sys::clock::own_thread_cpu_ns();
        self.observe_runnable_window(tids, active);
        let spent = gleaner_sys::clock::own_thread_cpu_ns().saturating_sub(t0);
        self.cost_ns += spent;
        self.run_state_cost_ns += spent;
    }

    fn observe_runnable_window(&mut self, tids: &[(u32, u32)], active: &Cpuset) {
        let n = tids.len().min(self.budget.runnable_window());
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
        let queued = active
            .iter()
            .any(|c| per_cpu.get(&c).copied().unwrap_or(0) >= 2);
        let empty = active
            .iter()
            .any(|c| per_cpu.get(&c).copied().unwrap_or(0) == 0);
        if queued && empty {
            self.crowded.0 += 1;
        }
    }

    /// Takes a snapshot at `now_ns` and returns the sample for the period since the previous
    /// one (`None` on the first call, which only primes the counters).
    pub fn sample(
        &mut self,
        now_ns: u64,
        work: &WorkloadView,
        retention: &[(usize, RetentionCounters)],
    ) -> Result<Option<PeriodSample>> {
        if self.kernel.is_some() {
            return self.sample_kernel(now_ns, work, retention);
        }
        let t0 = gleaner_sys::clock::own_thread_cpu_ns();
        let out = self.sample_procfs(now_ns, work, retention);
        self.cost_ns += gleaner_sys::clock::own_thread_cpu_ns().saturating_sub(t0);
        let budget_period_ns = std::mem::take(&mut self.budget_period_ns);
        if let Ok(Some(s)) = &out {
            let spent = SamplingCost {
                total_ns: std::mem::take(&mut self.cost_ns),
                switches_ns: std::mem::take(&mut self.switch_cost_ns),
                switches_read: self.switch_periods == 0,
                run_states_ns: std::mem::take(&mut self.run_state_cost_ns),
            };
            let period_ns = s.period_ns.max(budget_period_ns.unwrap_or(0));
            self.budget.account(spent, period_ns);
        }
        out
    }

    /// Charges the next period's sampling CPU to the procfs budget as if the period had
    /// lasted `base_ns`: the controller's start-up periods, a quarter as long, are a burst by
    /// design, and what the budget must judge is what the reads will cost at the periods that
    /// follow. Charged against the short period, its fixed reads alone took the budget, and a
    /// 2-thread ping-pong's switches went to a read every 32 periods within its first 0.2 s,
    /// a level that falls one step a read; left uncharged, 1,000 threads were read whole
    /// until the first full period, which cost 38 ms and stretched the periods to 1 s
    /// (2026-12-02).
    pub fn charge_next_as_period_of(&mut self, base_ns: u64) {
        self.budget_period_ns = Some(base_ns);
    }

    fn sample_procfs(
        &mut self,
        now_ns: u64,
        work: &WorkloadView,
        retention: &[(usize, RetentionCounters)],
    ) -> Result<Option<PeriodSample>> {
        let snap = self.snapshot(work, retention)?;
        // Under a tight budget the per-thread files are read every `stride` periods, and the
        // rate measured over those periods stands for each of them.
        self.switch_periods += 1;
        let (work_threads, switches_read) =
            if self.prev.is_none() || self.switch_periods >= self.budget.switch_stride() {
                let t0 = gleaner_sys::clock::own_thread_cpu_ns();
                let (delta, threads) = self.switch_delta(&work.tids);
                self.switch_cost_ns += gleaner_sys::clock::own_thread_cpu_ns().saturating_sub(t0);
                tracing::debug!(
                    switches = delta,
                    periods = self.switch_periods,
                    threads,
                    listed = work.tids.len(),
                    stride = self.budget.switch_stride(),
                    "read the workload threads' switches"
                );
                (threads, Some(delta))
            } else {
                (work.tids.len() as u64, None)
            };
        let crowded = std::mem::take(&mut self.crowded);
        let Some(prev) = self.prev.replace(snap.clone()) else {
            self.prev_time_ns = now_ns;
            self.switch_periods = 0;
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
        work_between(&prev, &snap, &spare, period_ns, &mut vcpus);
        let work_ns = vcpus.iter().map(|v| v.work_ns).sum();
        let work_switches = self.switches_over(switches_read, work_ns);
        let runnable_wait =
            (crowded.1 > 0).then(|| period_ns * crowded.0 as u64 / crowded.1 as u64);
        Ok(Some(PeriodSample {
            period_ns,
            vcpus,
            work_switches,
            work_threads,
            work_runnable_wait_ns: runnable_wait,
            wake_latency: None,
            progress: None,
            // Switch counts read every few periods under a tight budget are not windows.
            stale_rates: false,
            rates_from: RatesFrom::Counting,
        }))
    }

    /// The last sample, when the workload is gone or Gleaner stops: like [`Sampler::sample`],
    /// but the scheduler programs are left detached instead of opening another window
    /// (attaching them costs kernel-text patching on every CPU, for nothing at exit).
    pub fn sample_last(
        &mut self,
        now_ns: u64,
        work: &WorkloadView,
        retention: &[(usize, RetentionCounters)],
    ) -> Result<Option<PeriodSample>> {
        self.closing = true;
        self.sample(now_ns, work, retention)
    }

    /// One period from the BPF sampler's counters (plus steal from `/proc/stat`, the retention
    /// threads' own counters, and the process list for the program's workload map).
    fn sample_kernel(
        &mut self,
        now_ns: u64,
        work: &WorkloadView,
        retention: &[(usize, RetentionCounters)],
    ) -> Result<Option<PeriodSample>> {
        if self.kernel.is_none() {
            return Ok(None);
        }
        // Per vCPU: idle time (and entries, from the driver) from the cpuidle driver or the
        // kernel's records where the program counts idle only in windows (else 0 here: the
        // program's counts are used), steal and busy time from /proc/stat. The records
        // before the program's counters, as `KernelSampler::idle_spans_of` reads them.
        let idle = self.read_idle_totals().unwrap_or_default();
        let Some(kernel) = self.kernel.as_mut() else {
            return Ok(None);
        };
        // What `cpu_idle` had counted when the records were read.
        let traced_now = match self.idle_reads {
            Some(IdleReads::TickRecords(_)) => kernel.traced_at_snapshot(),
            _ => Vec::new(),
        };
        kernel.set_workload(&work.pids);
        let counters = match kernel.read() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("{e}");
                return Ok(None);
            }
        };
        let stat = self.proc_stat.read()?;
        let now_retention: HashMap<usize, RetentionCounters> = retention.iter().copied().collect();
        let prev_counters = std::mem::replace(&mut self.kernel_prev, counters);
        let traced_before = std::mem::replace(
            &mut self.traced_before,
            of_cpus(&traced_now, self.cpus.iter()),
        );
        let cpus: Vec<(u64, u64, u64, u64)> = self
            .cpus
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let idle = idle.get(i).copied().unwrap_or_default();
                stat.per_cpu.iter().find(|p| p.cpu == c).map_or(
                    (idle.idle_ns, idle.entries, 0, 0),
                    |p| {
                        (
                            idle.idle_ns,
                            idle.entries,
                            p.times.steal_ns,
                            p.times.busy_ns(),
                        )
                    },
                )
            })
            .collect();
        // Outside its measurement windows the program does not follow switches, so the
        // workload's CPU time comes from where the procfs sampler takes it: the cgroup's
        // per-CPU usage, or the processes' clocks spread over the vCPUs' busy time.
        let work_total_ns = if work.percpu_work_ns.is_some() {
            0
        } else {
            self.process_clocks(&work.pids)
        };
        let snap = Snapshot {
            cpus,
            retention: now_retention,
            percpu_work: work.percpu_work_ns.clone(),
            work_total_ns,
        };
        let now_mono = gleaner_sys::clock::monotonic_ns();
        let Some(prev) = self.prev.replace(snap.clone()) else {
            self.prev_time_ns = now_ns;
            self.kernel_events = self.kernel_prev.iter().map(|c| c.events).sum();
            // The event rate is not known yet: a short window at the end of the first
            // period measures it (`begin_window`), and the next window is sized from it.
            self.window = Window {
                start_ns: now_mono,
                len_ns: Some(FIRST_WINDOW_NS),
            };
            if let Some(k) = self.kernel.as_mut() {
                match k.set_scheduler_programs(false) {
                    Ok(()) => {
                        k.open_window(now_mono, Some(now_mono));
                        self.pending_window_ns = Some(FIRST_WINDOW_NS);
                    }
                    Err(_) => k.open_window(now_mono, None),
                }
            }
            return Ok(None);
        };
        let period_ns = now_ns.saturating_sub(self.prev_time_ns).max(1);
        self.prev_time_ns = now_ns;
        // A window opened by `begin_window` measured until now, however late this read is.
        let mut covered_ns = if self.window_at_end {
            now_mono.saturating_sub(self.window.start_ns)
        } else {
            self.window.covered_ns(now_mono)
        };
        // The programs ended the window themselves, its event budget spent: it covered
        // only up to there, and like any partial window its counts stand for the period
        // while the workload's CPU time is read whole (the programs stopped counting it).
        let cut = self.kernel.as_ref().and_then(|k| k.window_cut_at());
        if let Some(cut) = cut {
            covered_ns = covered_ns.min(cut.saturating_sub(self.window.start_ns));
        }
        let covered_ns = covered_ns.clamp(1, period_ns);
        let windowed = self.window.len_ns.is_some() || cut.is_some();
        let mut vcpus = Vec::with_capacity(self.cpus.len());
        let mut spare = Vec::with_capacity(self.cpus.len());
        let mut wake = WakeLatencies::default();
        let (mut switches, mut crowded_ns, mut crowded_waits, mut events) =
            (0u64, 0u64, 0u64, 0u64);
        let window_records = self.window_records.take();
        let mut traced_halts = Vec::new();
        for (i, cpu) in self.cpus.iter().enumerate() {
            let d = kernel_delta(&self.kernel_prev, &prev_counters, cpu);
            let r1 = snap.retention.get(&cpu).copied().unwrap_or_default();
            let r0 = prev.retention.get(&cpu).copied().unwrap_or_default();
            let yield_ns = r1.yield_ns.saturating_sub(r0.yield_ns);
            wake.merge(&d.wake);
            switches += d.work_switches;
            crowded_ns += d.crowded_wait_ns;
            crowded_waits += d.crowded_waits;
            events += d.events;
            spare.push(
                snap.cpus[i]
                    .3
                    .saturating_sub(prev.cpus[i].3)
                    .saturating_sub(yield_ns),
            );
            let (idle_ns, idle_entries) = if self.idle_reads.is_some() {
                (
                    snap.cpus[i].0.saturating_sub(prev.cpus[i].0),
                    snap.cpus[i].1.saturating_sub(prev.cpus[i].1),
                )
            } else {
                (d.idle_ns, d.idle_entries)
            };
            if matches!(self.idle_reads, Some(IdleReads::TickRecords(_))) {
                // What the records and `cpu_idle` counted since the window opened, or over
                // the whole period, both up to the moment the records were read.
                let (halts, halted_ns) = traced_now.get(cpu).copied().unwrap_or_default();
                let now = IdleSpan {
                    passes: snap.cpus[i].1,
                    record_ns: snap.cpus[i].0,
                    halts,
                    halted_ns,
                };
                let opened = window_records.as_ref().and_then(|w| w.get(i)).copied();
                let before = traced_before.get(i).map(|&(halts, halted_ns)| IdleSpan {
                    passes: prev.cpus[i].1,
                    record_ns: prev.cpus[i].0,
                    halts,
                    halted_ns,
                });
                traced_halts.push(now.since(&opened.or(before).unwrap_or(now)));
            }
            vcpus.push(VcpuSample {
                cpu,
                work_ns: d.work_ns.min(period_ns),
                yield_ns,
                idle_ns: idle_ns.min(period_ns),
                steal_ns: snap.cpus[i].2.saturating_sub(prev.cpus[i].2),
                yield_preemptions: r1.preemptions.saturating_sub(r0.preemptions),
                idle_entries,
            });
        }
        // The totals (status, metrics) keep what was observed; the period's sample, like its
        // switch counts, stands for the whole period: the policy weighs wake-ups against run
        // time read whole (`gleaner_policy::gain`).
        self.wake_total.merge(&wake);
        // A window asked for but never opened (`begin_window` not called) measured nothing.
        let unopened = self.pending_window_ns.is_some();
        let skipped = self.skipped_len_ns.take().is_some() || unopened;
        // Where the records count the idle loop's passes and time, halts and halted time are
        // what `cpu_idle` counted where it was attached all period, else the records times
        // the last shares that halted.
        let record_counts = match self.idle_reads {
            Some(IdleReads::TickRecords(counts)) if !traced_halts.is_empty() => Some(counts),
            _ => None,
        };
        if let Some(counts) = record_counts {
            // `cpu_idle` is attached with the scheduler programs, for the whole period where
            // its window had no set length (it ignores a window's end), else from
            // `begin_window`, which read the records and its counts then.
            let attached_all_period = self.window.len_ns.is_none() && !skipped;
            let measured = attached_all_period || window_records.is_some();
            self.halt_ratios.resize(vcpus.len(), HaltRatio::default());
            let mut missed = false;
            for ((v, ratio), span) in vcpus
                .iter_mut()
                .zip(&mut self.halt_ratios)
                .zip(&traced_halts)
            {
                if measured && ratio.measure(*span, counts).is_err() {
                    missed = true;
                }
                (v.idle_entries, v.idle_ns) = if attached_all_period {
                    (span.halts, span.halted_ns.min(period_ns))
                } else {
                    ratio.apply(v.idle_entries, v.idle_ns, counts)
                };
            }
            if missed {
                tracing::debug!("cpu_idle counts idle from now on: it counted more than the kernel's records ({counts:?}: {traced_halts:?})");
                self.idle_reads = None;
                if let Some(k) = self.kernel.as_mut() {
                    k.count_idle_always();
                }
            }
        }
        let mut rates_from = RatesFrom::Counting;
        let len_ns = match self.last_window.as_ref().filter(|_| skipped) {
            // No window this period: the last one's rates stand for it, and size the next.
            Some(last) => {
                work_between(&prev, &snap, &spare, period_ns, &mut vcpus);
                (switches, crowded_ns, wake) = last.scaled_to(period_ns, total_work(&vcpus), false);
                rates_from = RatesFrom::EarlierWindow;
                Window::next_len(last.events, last.covered_ns, period_ns)
            }
            None => {
                // What this period's programs counted, unscaled: the window the next periods
                // may reuse, whether it covered part of this period or all of it. Kept only
                // from windowed periods, a workload that turned busy in a period measured
                // whole (a quiet start) had its next period stand on the start-up window of
                // the first period: 1 switch where ping-pong made thousands (g_comp 86 ms
                // against 33 µs; CI, 2026-11-29 and 2026-12-01).
                let measured = WindowCounts {
                    covered_ns,
                    events,
                    switches,
                    work_ns: total_work(&vcpus),
                    crowded_ns,
                    crowded_waits,
                    wake: wake.clone(),
                };
                if windowed && !unopened {
                    rates_from = RatesFrom::ThisWindow;
                    tracing::trace!(
                        covered_ns,
                        events,
                        switches,
                        work_ns = measured.work_ns,
                        cut = cut.map(|c| c.saturating_sub(self.window.start_ns)),
                        len_ns = self.window.len_ns,
                        period_ns,
                        "window"
                    );
                    // Counts from a window stand for the whole period; the CPU time is
                    // read whole.
                    work_between(&prev, &snap, &spare, period_ns, &mut vcpus);
                    (switches, crowded_ns, wake) =
                        measured.scaled_to(period_ns, total_work(&vcpus), true);
                    self.last_window = Some(measured);
                } else if !unopened {
                    // The programs counted the whole period (its events fit the budget). Every
                    // switch is in the count, but the count is still one window's: a
                    // stretch where the vCPU ran slowly fills a quiet workload's 25 ms period
                    // as it fills a short window (g_comp 20.6 us against 1.8 in a packed
                    // ping-pong on the none guest, `daemon-2026-11-28-231357`, run 9), and the
                    // policy judges windows' grain over more than one of them.
                    rates_from = RatesFrom::ThisWindow;
                    self.last_window = Some(measured);
                }
                Window::next_len(events, covered_ns, period_ns)
            }
        };
        self.kernel_events = self.kernel_prev.iter().map(|c| c.events).sum();
        let pace = Pace::of(&vcpus, period_ns);
        if !skipped {
            self.measured_pace = Some(pace);
        }
        // A period that no longer looks like the measured one (the workload left its start-up
        // or changed phase) gets a window next period, whatever the count says.
        let spread = self.pace_history.spread();
        let rates_still_hold = self
            .measured_pace
            .is_some_and(|m| pace.resembles_given(&m, &spread));
        self.pace_history.push(pace);
        self.take_idle_from_tick_records();
        if self.closing {
            if let Some(k) = self.kernel.as_mut() {
                let _ = k.set_scheduler_programs(false);
            }
        }
        self.window = Window {
            start_ns: now_mono,
            len_ns,
        };
        self.window_at_end = false;
        self.pending_window_ns = None;
        if let Some(k) = self.kernel.as_mut().filter(|_| !self.closing) {
            match len_ns {
                // Too many events to measure all period: measure the last `len` of the next
                // one (`begin_window`), with the scheduler programs detached until then. A
                // window nobody opens measures nothing, and the next period measures whole.
                Some(len) => match k.set_scheduler_programs(false) {
                    Ok(()) => {
                        k.open_window(now_mono, Some(now_mono));
                        // What the programs counted between this period's read and now (the
                        // work above: 0.15 ms a period with the workload beside it, measured;
                        // 16 ms in the period where idle came to be read from the kernel's
                        // records and a program was detached) belongs to no window: the next
                        // window is counted from here, not from the read, or its counts would
                        // hold more than it covered.
                        if let Ok(c) = k.read() {
                            self.kernel_prev = c;
                        }
                        self.periods_since_window += 1;
                        let choice = WindowChoice {
                            measured_before: self.last_window.is_some(),
                            periods_since: self.periods_since_window,
                            rates_hold: rates_still_hold,
                            affordable: self.window_affordable,
                        };
                        let due = window_due(choice);
                        tracing::trace!(?choice, due, ?pace, "next window");
                        if due {
                            self.periods_since_window = 0;
                            self.pending_window_ns = Some(len);
                        } else {
                            self.skipped_len_ns = Some(len);
                        }
                    }
                    Err(_) => k.open_window(now_mono, Some(now_mono + len)),
                },
                None => match k.set_scheduler_programs(true) {
                    Ok(()) => k.open_window(now_mono, None),
                    Err(e) => tracing::warn!("{e}; wake-ups are not measured this period"),
                },
            }
        }
        Ok(Some(PeriodSample {
            period_ns,
            vcpus,
            work_switches: switches,
            work_threads: self.work_threads(&work.pids),
            work_runnable_wait_ns: Some(crowded_ns.min(period_ns)),
            wake_latency: Some(wake),
            progress: None,
            // Counts carried over from a window whose pace this period no longer keeps.
            stale_rates: skipped && !rates_still_hold,
            rates_from,
        }))
    }

    /// Where no cpuidle driver counts idle, idle time and entries come from the kernel's own
    /// records from the period after the BPF sampler found and checked them for every vCPU
    /// ([`KernelSampler::tick_records_found`]); this period was counted by `cpu_idle`, and
    /// the records read now are the next one's start. From then on `cpu_idle` is attached
    /// only with the scheduler programs.
    fn take_idle_from_tick_records(&mut self) {
        let Some(kernel) = self.kernel.as_mut().filter(|_| self.idle_reads.is_none()) else {
            return;
        };
        let cpus: Vec<usize> = self.cpus.iter().collect();
        if !kernel.tick_records_found(&cpus) {
            return;
        }
        let Some(counts) = kernel.record_counts() else {
            return;
        };
        let Ok(records) = kernel.read_tick_idle() else {
            kernel.count_idle_always();
            return;
        };
        if let Some(prev) = self.prev.as_mut() {
            for (i, c) in cpus.iter().enumerate() {
                if let Some(p) = prev.cpus.get_mut(i) {
                    let r = records.get(*c).copied().unwrap_or_default();
                    (p.0, p.1) = (r.idle_ns, r.entries);
                }
            }
        }
        // `cpu_idle`, attached all along, at the same moment.
        self.traced_before = of_cpus(&kernel.traced_at_snapshot(), self.cpus.iter());
        // The check's counts are the first measure of the shares that halt.
        self.halt_ratios = kernel
            .checked_spans()
            .iter()
            .map(|&span| {
                let mut r = HaltRatio::default();
                let _ = r.measure(span, counts);
                r
            })
            .collect();
        self.idle_reads = Some(IdleReads::TickRecords(counts));
    }

    /// Each CPU's idle totals, where they are read whole (`None` elsewhere): from the
    /// cpuidle driver or the kernel's records. A failed read repeats the last one: this
    /// period's idle reads as none, and the next one's covers both (a value from another
    /// source would make the next difference meaningless).
    fn read_idle_totals(&self) -> Option<Vec<IdleTotals>> {
        let read = match self.idle_reads.as_ref()? {
            IdleReads::Cpuidle(c) => c.read().map_err(|e| e.to_string()),
            IdleReads::TickRecords(_) => match self.kernel.as_ref() {
                Some(k) => k
                    .read_tick_idle()
                    .map(|all| of_cpus(&all, self.cpus.iter()))
                    .map_err(|e| e.to_string()),
                None => Err("the kernel's idle records are read by the BPF sampler".into()),
            },
        };
        match read {
            Ok(totals) => Some(totals),
            Err(e) => {
                tracing::warn!("{e}");
                Some(self.prev.as_ref().map_or_else(Vec::new, |p| {
                    p.cpus
                        .iter()
                        .map(|&(idle_ns, entries, _, _)| IdleTotals { entries, idle_ns })
                        .collect()
                }))
            }
        }
    }

    /// The threads of the workload's processes, from each one's `stat`.
    fn work_threads(&mut self, pids: &[u32]) -> u64 {
        if self.process_stats.len() != pids.len()
            || !pids.iter().all(|p| self.process_stats.contains_key(p))
        {
            let now: HashSet<u32> = pids.iter().copied().collect();
            self.process_stats.retain(|pid, _| now.contains(pid));
        }
        let procfs = &self.procfs;
        pids.iter()
            .filter_map(|&pid| {
                self.process_stats
                    .entry(pid)
                    .or_insert_with(|| procfs.task_stat_file(pid, pid))
                    .read()
                    .ok()
            })
            .map(|s| s.num_threads as u64)
            .sum()
    }

    fn snapshot(
        &mut self,
        work: &WorkloadView,
        retention: &[(usize, RetentionCounters)],
    ) -> Result<Snapshot> {
        let stat = self.proc_stat.read()?;
        let cpuidle = self.read_idle_totals();
        // One read of `/proc/timer_list` serves idle time and, where it is their source,
        // idle entries: printing it is most of the procfs sampler's own cost on a guest
        // without a cpuidle driver (38 % of `perf -p`'s samples of Gleaner during a ping-pong there).
        let timer = if self.precise_idle {
            self.procfs.timer_list().ok().flatten()
        } else {
            None
        };
        let entries = match (&cpuidle, self.entries.as_mut()) {
            (Some(_), _) | (None, None) => Vec::new(),
            (None, Some(e)) => e.read_periodic(timer.as_deref()),
        };
        let mut cpus = Vec::with_capacity(self.cpus.len());
        for (i, cpu) in self.cpus.iter().enumerate() {
            let times = stat
                .per_cpu
                .iter()
                .find(|c| c.cpu == cpu)
                .map(|c| c.times)
                .unwrap_or_default();
            let (idle, entries) = match &cpuidle {
                Some(totals) => {
                    let t = totals.get(i).copied().unwrap_or_default();
                    (t.idle_ns, t.entries)
                }
                None => (
                    timer
                        .as_ref()
                        .and_then(|t| t.iter().find(|c| c.cpu == cpu))
                        .map(|c| c.idle_sleeptime_ns + c.iowait_sleeptime_ns)
                        .unwrap_or(times.idle_ns + times.iowait_ns),
                    entries.get(i).copied().unwrap_or(0),
                ),
            };
            cpus.push((idle, entries, times.steal_ns, times.busy_ns()));
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
            let Ok(start) = self.procfs.process_start_time(pid) else {
                continue;
            };
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

    /// The workload's switches in a period in which it ran `work_ns`: where the threads'
    /// counts were read (`read`: the switches since the last read), the rate over the
    /// periods since then, else the last rate measured.
    fn switches_over(&mut self, read: Option<u64>, work_ns: u64) -> u64 {
        self.switch_span_work_ns += work_ns;
        if let Some(delta) = read {
            let span = std::mem::take(&mut self.switch_span_work_ns);
            let periods = std::mem::take(&mut self.switch_periods).max(1);
            if span == 0 {
                // No run time to scale by: the mean per period.
                self.switches_per_work_ns = None;
                return delta / periods;
            }
            self.switches_per_work_ns = Some(delta as f64 / span as f64);
        }
        match self.switches_per_work_ns {
            Some(rate) => (rate * work_ns as f64).round() as u64,
            None => 0,
        }
    }

    /// Context switches of the workload's threads since the last call, and the thread count.
    fn switch_delta(&mut self, tids: &[(u32, u32)]) -> (u64, u64) {
        let mut delta = 0;
        let mut seen = HashMap::with_capacity(tids.len());
        for &(pid, tid) in tids {
            let Some(total) = self.thread_switches(pid, tid) else {
                continue;
            };
            // A thread seen for the first time contributes nothing this period: its past
            // switches happened before we were watching. A tid reused since the last read
            // counts at most the new thread's own switches (a smaller count reads as none).
            if let Some(&before) = self.switches.get(&tid) {
                delta += total.saturating_sub(before);
            }
            seen.insert(tid, total);
        }
        let n = seen.len() as u64;
        self.switches = seen;
        (delta, n)
    }

    /// One thread's cumulative context switches: from `schedstat` (1,000 threads: 7 ms of CPU
    /// a read on the `none` guest, against 38 ms from `stat` and `status`), or from `status`
    /// on kernels without it. `None` when the thread is gone.
    fn thread_switches(&mut self, pid: u32, tid: u32) -> Option<u64> {
        if !self.no_schedstat {
            match self.procfs.task_schedstat(pid, tid) {
                Ok(s) => return Some(s.timeslices),
                Err(e) if e.is_not_found() => {}
                Err(_) => return None,
            }
        }
        let status = self.procfs.task_status(pid, tid).ok()?;
        // The thread is there but its schedstat is not: the kernel has none.
        self.no_schedstat = true;
        Some(status.voluntary_ctxt_switches + status.nonvoluntary_ctxt_switches)
    }
}

/// Index of the cpuidle state named `POLL` on `cpu` (the haltpoll and intel_idle drivers
/// have one as state 0; with driver `none` there is none).
/// Loads the BPF side for this machine as `sys_root` describes it. It does not depend on a
/// workload's vCPUs: the POLL state's index is the same on every CPU, so it is read from the
/// first online one, and the program sizes its scans by the possible CPU ids.
pub(crate) fn load_kernel_sampler(
    sys_root: &Path,
) -> std::result::Result<KernelSampler, Unavailable> {
    let sysfs = SysFs::new(sys_root);
    let online = sysfs.online_cpus().ok();
    let first = online.as_ref().and_then(|c| c.iter().next()).unwrap_or(0);
    let nr_cpus = sysfs
        .possible_cpus()
        .ok()
        .or(online)
        .and_then(|p| p.iter().max())
        .map_or(1, |m| m + 1);
    // Where the cpuidle driver counts every online CPU's idle entries and time, those are
    // read instead of traced (see sampler.bpf.c, `idle_attached_ns`).
    let idle_counted_elsewhere = sysfs.online_cpus().is_ok_and(|cpus| {
        let cpus: Vec<usize> = cpus.iter().collect();
        !cpus.is_empty() && matches!(CpuidleCounters::open(&sysfs, &cpus), Ok(Some(_)))
    });
    KernelSampler::load(
        sys_root,
        poll_state_index(&sysfs, first),
        nr_cpus,
        idle_counted_elsewhere,
    )
}

fn poll_state_index(sysfs: &SysFs, cpu: usize) -> Option<usize> {
    // States are numbered from 0 without gaps; the first missing one ends the list.
    (0..16)
        .map_while(|i| sysfs.cpuidle_state_name(cpu, i).ok().map(|name| (i, name)))
        .find(|(_, name)| name == "POLL")
        .map(|(i, _)| i)
}

/// CPU time of a whole process in ns, from its POSIX CPU clock (any process may be read).
fn process_cpu_ns(pid: u32) -> Option<u64> {
    gleaner_sys::clock::process_cpu_ns(pid)
}

#[cfg(test)]
mod tests;
