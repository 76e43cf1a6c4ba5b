//! What the samplers may cost, and how they stay within it.
//!
//! Exists apart from the samplers because the cost rules are the same kind of decision for
//! both, and pure: the procfs sampler thins its per-thread reads under a CPU budget
//! ([`ProcfsBudget`]); the BPF sampler measures scheduler events in a window per period sized
//! from their rate ([`Window`]). Both are tested here with made-up costs and rates.

use super::RUNNABLE_WINDOW;

/// Default CPU budget of the procfs sampler: 0.5 % of one CPU.
pub const PROCFS_BUDGET_FRACTION: f64 = 0.005;

/// Deepest thinning step: per-thread switches read every 2^6 = 64 periods.
pub(super) const MAX_THIN_LEVEL: u32 = 6;

/// Keeps the procfs sampler's own CPU time within a fraction of one CPU by thinning what it
/// reads per thread, each kind of read by its own cost: at run-state level `R`, run states are
/// sub-sampled at every `2^R`-th slice for `32 >> R` threads (at least 4); at switch level `S`,
/// per-thread context switches are read every `2^S` periods (the rate measured over those
/// periods is reported for each of them). A level rises when its reads' smoothed cost is over
/// the room they have (by as many levels as halvings it takes to fit) and falls one at a time
/// when it is under a quarter of it.
///
/// The room of the per-thread reads is the budget less the reads of every period that
/// thinning cannot touch (`/proc/stat`, the idle records, the cgroup's usage), but never less
/// than a quarter of it: where those alone take the budget, the controller stretches its
/// periods to hold Gleaner's whole CPU (`controller::OwnCpuBudget`), and thinning on top of
/// that only blinded the sampler. Each kind of read has that room less the other's cost, and
/// never less than half of it: a few threads' switch counts (a few µs a period) are not
/// thinned for their run-state sub-samples (ten a period). Judged by the whole cost, a
/// two-thread ping-pong on the `none` guest (kernel 6.18.44-fc-v1045, root: `/proc/timer_list`
/// read every period) went to the deepest level, its switches read every 64 periods, and read
/// one switch a period where it made 130,000 (g_comp 92 ms): Gleaner never consolidated it
/// (2026-12-02).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcfsBudget {
    /// Allowed sampling CPU as a fraction of one CPU.
    pub fraction: f64,
    /// Run-state sub-sample thinning.
    level: u32,
    /// Per-thread switch read thinning.
    switch_level: u32,
    /// Whether a period was accounted: the first is taken as is.
    accounted: bool,
    /// Smoothed sampling CPU per period, as fractions of the period: the reads of every
    /// period, switch counts (with listing the threads) and run states.
    fixed_cost: f64,
    switch_cost: f64,
    run_state_cost: f64,
}

/// One period's sampling CPU, and the parts of it that thinning acts on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SamplingCost {
    pub total_ns: u64,
    /// Reading per-thread switch counts and listing the threads for them.
    pub switches_ns: u64,
    /// Whether the switch counts were read this period (every `switch_stride` periods): the
    /// periods between cost nothing there, and are not evidence that the reads got cheap.
    pub switches_read: bool,
    /// Reading per-thread run states (the sub-samples).
    pub run_states_ns: u64,
}

impl ProcfsBudget {
    pub fn new(fraction: f64) -> Self {
        Self {
            fraction,
            level: 0,
            switch_level: 0,
            accounted: false,
            fixed_cost: 0.0,
            switch_cost: 0.0,
            run_state_cost: 0.0,
        }
    }

    /// How far the reads are thinned: the deeper of the two levels (for `status`).
    pub fn level(&self) -> u32 {
        self.level.max(self.switch_level)
    }

    /// Smoothed cost as a fraction of one CPU.
    pub fn cost_fraction(&self) -> f64 {
        self.fixed_cost + self.switch_cost + self.run_state_cost
    }

    /// Per-thread switch counts are read every this many periods.
    pub fn switch_stride(&self) -> u64 {
        1 << self.switch_level
    }

    /// Threads whose run state one sub-sample reads.
    pub fn runnable_window(&self) -> usize {
        (RUNNABLE_WINDOW >> self.level).max(4)
    }

    /// Run states are read at every this-many-th sub-sample slice (of the full-rate
    /// schedule, `n` slices a period).
    pub fn runnable_every(&self) -> u32 {
        1 << self.level
    }

    /// Controller wake-ups per period for run-state sub-samples, out of `n` at full rate.
    /// The controller sleeps through the slices in which nothing would be read: every
    /// wake-up is a vCPU wake-up, and at the deepest level waking for each of ten slices a
    /// period only to skip them cost more than the reads (perf: a third of Gleaner's CPU).
    pub fn wakeups_per_period(&self, n: u32) -> u32 {
        (n >> self.level).max(1)
    }

    /// Takes one period's sampling CPU time and adapts the levels.
    pub fn account(&mut self, spent: SamplingCost, period_ns: u64) {
        let period = period_ns.max(1) as f64;
        let frac = |ns: u64| ns as f64 / period;
        let switches = spent.switches_ns.min(spent.total_ns);
        let run_states = spent.run_states_ns.min(spent.total_ns - switches);
        let now_fixed = frac(spent.total_ns - switches - run_states);
        // A read every `stride` periods costs its share in each of them.
        let now_switches = frac(switches) / self.switch_stride() as f64;
        let now_run_states = frac(run_states);
        // First period: take it as is; then smooth over about four periods (switch reads:
        // four reads; the periods between them are no evidence that the reads got cheap).
        let smooth = |old: f64, now: f64| 0.75 * old + 0.25 * now;
        let first = !std::mem::replace(&mut self.accounted, true);
        if first {
            (self.fixed_cost, self.switch_cost, self.run_state_cost) =
                (now_fixed, now_switches, now_run_states);
        } else {
            self.fixed_cost = smooth(self.fixed_cost, now_fixed);
            self.run_state_cost = smooth(self.run_state_cost, now_run_states);
            if spent.switches_read {
                self.switch_cost = smooth(self.switch_cost, now_switches);
            }
        }
        let fixed = self.fixed_cost;
        let room = (self.fraction - fixed).max(self.fraction / 4.0);
        // Run states first: the switch counts are what the policy's grain stands on.
        let run_room = (room - self.switch_cost).max(room / 2.0);
        thin(&mut self.level, &mut self.run_state_cost, run_room);
        if spent.switches_read || first {
            let switch_room = (room - self.run_state_cost).max(room / 2.0);
            thin(&mut self.switch_level, &mut self.switch_cost, switch_room);
        }
    }
}

/// Moves one kind of read's thinning `level` so that its smoothed `cost` fits `room`, halving
/// (or doubling) the cost estimate with each level: the new level's cost is not known yet.
fn thin(level: &mut u32, cost: &mut f64, room: f64) {
    if *cost > room && *level < MAX_THIN_LEVEL {
        // As many levels at once as the excess asks for. One at a time, reaching the deepest
        // level took six periods that each read every thread (1,000 threads: 7 ms of CPU a
        // read on the `none` guest).
        let steps = (*cost / room).log2().ceil().max(1.0) as u32;
        let to = (*level + steps).min(MAX_THIN_LEVEL);
        *cost /= f64::from(1u32 << (to - *level));
        *level = to;
    } else if *cost < room / 4.0 && *level > 0 {
        *level -= 1;
        *cost *= 2.0;
    }
}

/// Scheduler events the BPF sampler measures per period at most: the measurement window is
/// sized from the last period's event rate so that no more fall into it. 2,000 events of
/// about 150 ns are 0.3 ms of a 100 ms period: a workload with fewer is measured throughout,
/// a ping-pong at 200,000 hand-offs a second for a few milliseconds of each period. It is
/// also each CPU's budget inside any one window (`window_cpu_events` in sampler.bpf.c): a
/// workload that turns busy in a window sized for a quiet period ends that window there,
/// instead of being measured event by event to the period's end.
pub const WINDOW_EVENTS: u64 = 2_000;

/// The shortest window, as a fraction of the period: below it the sample of wake-ups in a
/// period becomes too small to say anything about that period.
const MIN_WINDOW_FRACTION: u64 = 20;

/// The first period's window, before any event rate is known: the shortest a window gets
/// at the default 100 ms period. Measuring a first period whole cost a 0.5 s messaging
/// benchmark (160 threads, ~1 M scheduler events a second) several percent.
pub const FIRST_WINDOW_NS: u64 = 5_000_000;

/// Where windows are needed at all (too many events to measure every period whole), one
/// period in this many has one; the others reuse its rates. Opening a window attaches the
/// `sched_switch` and `sched_waking` programs and closing it detaches them, and each of the
/// four patches kernel text on every CPU with synchronous IPIs: on the haltpoll guest that
/// took the controller 6.4 ms of CPU a second at a window every 100 ms period, and `sysbench
/// threads` ran x1.047 of bare under `run --observe` (x1.016 with 1 s periods; medians of 6
/// interleaved rounds). Rates of
/// events per second move slowly next to a second; a phase change shows in utilization at once.
pub const WINDOW_EVERY_PERIODS: u32 = 10;

/// Where a window's rates still describe the workload, the next one waits for the own-CPU
/// budget to have saved its cost (`controller::OwnCpuBudget::window_affordable`), but never
/// longer than this many periods. A window costs far more than the period around it: its
/// programs' attach and detach patch kernel text by IPIs to every vCPU, each a hypervisor
/// round trip that the sender waits for, and longer where the target vCPU halted. On the
/// haltpoll guest (kernel 6.18.44-fc-v1045, 2026-12-02) a packed ping-pong's window cycles
/// took 2.1–3.0 ms of CPU (attach 0.5–0.9 ms, detach 0.45–0.85 ms), the others 0.33–0.40 ms,
/// so a window every [`WINDOW_EVERY_PERIODS`] put Gleaner over its share and the budget
/// stretched every period to 0.4–0.9 s; the steady rates need no such haste, the periods'
/// reads and decisions do.
pub const MAX_WINDOW_SPACING_PERIODS: u32 = 100;

/// What decides whether the coming period is measured in a window ([`window_due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowChoice {
    /// Whether any window was measured before, whose rates could stand for this period.
    pub measured_before: bool,
    /// Periods since the last window.
    pub periods_since: u32,
    /// Whether this period's pace resembles the last window's ([`Pace::resembles`]).
    pub rates_hold: bool,
    /// Whether Gleaner's own-CPU budget has saved what a window costs.
    pub affordable: bool,
}

/// Whether the coming period gets a window. Without one measured, or where the pace moved
/// away from it (a start-up left, a phase change), at once, whatever it costs: the policy
/// starts no change on stale rates. Where the rates still hold, every
/// [`WINDOW_EVERY_PERIODS`] periods once the budget can pay for it, and at the latest after
/// [`MAX_WINDOW_SPACING_PERIODS`].
pub fn window_due(c: WindowChoice) -> bool {
    !c.measured_before
        || !c.rates_hold
        || c.periods_since >= MAX_WINDOW_SPACING_PERIODS
        || (c.periods_since >= WINDOW_EVERY_PERIODS && c.affordable)
}

/// What a period's continuously counted side looked like, per second: idle periods and
/// workload CPU time of all vCPUs. These are read whole every period, windows or not, so they
/// tell whether the last window's switch and wake rates still describe the workload
/// ([`Pace::resembles`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pace {
    pub idle_periods_per_s: f64,
    pub work_ns_per_s: f64,
}

/// How far a period's pace may stray from its window's before the window is measured again:
/// a third of the idle period rate, a fifth of the CPU time. Steady workloads on the haltpoll
/// guest moved less between periods (sysbench threads: idle periods ±20 %, utilization ±10 %); a
/// workload that left its start-up or changed phase moves more (ping-pong starting: 230 idle
/// periods a second, then 21,000; utilization 1.0, then 0.6).
const PACE_IDLE_TOLERANCE: f64 = 1.0 / 3.0;
const PACE_WORK_TOLERANCE: f64 = 0.2;
/// Below these the rates are noise: 1,000 idle periods a second, 2 % of one CPU. A packed
/// ping-pong on the haltpoll guest (one vCPU busy throughout, the other left to housekeeping)
/// read 55–320 idle periods a second from period to period (2026-12-02): with the floor at
/// 200, one period in two or three looked like a new pace and asked for a window, each
/// 2–3 ms of Gleaner's CPU. A thousand a second, a wake-up every millisecond, is not what
/// a consolidation is decided on; a workload moving from a few hundred to thousands still
/// moves past the tolerance.
const PACE_IDLE_FLOOR: f64 = 1_000.0;
const PACE_WORK_FLOOR: f64 = 0.02e9;

impl Pace {
    /// The pace of `vcpus` over a period of `period_ns`.
    pub fn of(vcpus: &[gleaner_policy::VcpuSample], period_ns: u64) -> Self {
        let secs = period_ns.max(1) as f64 / 1e9;
        Self {
            idle_periods_per_s: vcpus.iter().map(|v| v.idle_periods() as f64).sum::<f64>() / secs,
            work_ns_per_s: vcpus.iter().map(|v| v.work_ns as f64).sum::<f64>() / secs,
        }
    }

    /// Whether a later period at this pace still behaves like `window`'s period, so that the
    /// window's rates may stand for it. Reusing a start-up window for ten periods made
    /// ping-pong's switch counts ten times too high under 25 ms periods, and its consolidation
    /// never came.
    pub fn resembles(&self, window: &Pace) -> bool {
        self.resembles_given(window, &Pace::default())
    }

    /// [`Pace::resembles`] for a workload whose pace moves by `spread` from period to period
    /// on its own ([`PaceHistory::spread`]): a move within [`PACE_NOISE_SPREADS`] of it is
    /// the workload's noise, not a new pace.
    pub fn resembles_given(&self, window: &Pace, spread: &Pace) -> bool {
        let close = |a: f64, b: f64, tol: f64, floor: f64, noise: f64| {
            (a - b).abs() <= (tol * a.max(b).max(floor)).max(PACE_NOISE_SPREADS * noise)
        };
        close(
            self.idle_periods_per_s,
            window.idle_periods_per_s,
            PACE_IDLE_TOLERANCE,
            PACE_IDLE_FLOOR,
            spread.idle_periods_per_s,
        ) && close(
            self.work_ns_per_s,
            window.work_ns_per_s,
            PACE_WORK_TOLERANCE,
            PACE_WORK_FLOOR,
            spread.work_ns_per_s,
        )
    }
}

/// How many of its own period-to-period spreads a workload's pace may move before that is a
/// new pace. Three median absolute deviations are about two standard deviations of a normal
/// spread; the median keeps a real change, once it is under half of the history, from
/// widening the spread it is judged by.
pub const PACE_NOISE_SPREADS: f64 = 3.0;

/// Periods whose pace [`PaceHistory`] keeps.
const PACE_HISTORY: usize = 8;

/// The last few periods' paces, for how much a workload's pace moves on its own. A fine
/// pipeline (`gleaner workload pipeline --work 500`) on the haltpoll guest swung between 800
/// and 20,000 idle periods a second and 1.2–1.9 CPUs of work from one 100 ms period to the
/// next (2026-12-02): against fixed tolerances every second or third period read as a new
/// pace and asked for a window at once, 2 ms of Gleaner's CPU each, which stretched its
/// periods to 0.3–0.4 s.
#[derive(Debug, Clone, Default)]
pub struct PaceHistory {
    recent: std::collections::VecDeque<Pace>,
}

impl PaceHistory {
    pub fn push(&mut self, pace: Pace) {
        if self.recent.len() == PACE_HISTORY {
            self.recent.pop_front();
        }
        self.recent.push_back(pace);
    }

    /// Each rate's median absolute deviation over the kept periods; zero with fewer than
    /// four (too few to tell noise from a change).
    pub fn spread(&self) -> Pace {
        if self.recent.len() < 4 {
            return Pace::default();
        }
        use gleaner_policy::observe::median;
        let mad = |rate: fn(&Pace) -> f64| {
            let values: Vec<f64> = self.recent.iter().map(rate).collect();
            let m = median(values.clone());
            median(values.iter().map(|v| (v - m).abs()).collect())
        };
        Pace {
            idle_periods_per_s: mad(|p| p.idle_periods_per_s),
            work_ns_per_s: mad(|p| p.work_ns_per_s),
        }
    }
}

/// The BPF sampler's measurement window for the current period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// When it opened (CLOCK_MONOTONIC ns).
    pub start_ns: u64,
    /// How long it lasts; `None`: until the next period, every event measured.
    pub len_ns: Option<u64>,
}

impl Window {
    /// The part of a period from `start_ns` to `now_ns` that the window covered.
    pub fn covered_ns(&self, now_ns: u64) -> u64 {
        let elapsed = now_ns.saturating_sub(self.start_ns);
        self.len_ns.map_or(elapsed, |l| l.min(elapsed))
    }

    /// The next window's length, from `events` seen in `covered_ns` of measuring, for a
    /// period of `period_ns`: the whole period when that many events fit in
    /// [`WINDOW_EVENTS`], else the time in which that many are expected.
    pub fn next_len(events: u64, covered_ns: u64, period_ns: u64) -> Option<u64> {
        if covered_ns == 0 {
            return None;
        }
        let expected = events as u128 * period_ns as u128 / covered_ns as u128;
        if expected <= WINDOW_EVENTS as u128 {
            return None;
        }
        let len = (WINDOW_EVENTS as u128 * covered_ns as u128 / events.max(1) as u128) as u64;
        Some(len.clamp(period_ns / MIN_WINDOW_FRACTION, period_ns))
    }
}
