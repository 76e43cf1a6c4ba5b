//! Retention threads ("yielding threads", paper §4.1 and §6): keep an idle vCPU busy for a
//! short while so that a wake-up landing on it costs a reschedule IPI (Table 2 setting B)
//! instead of the hypervisor rescheduling a halted vCPU (setting C).
//!
//! One thread per retained vCPU, pinned to it, calls `sched_yield()` in a loop and times each
//! iteration. An iteration much longer than an uncontended yield, during which the thread was
//! switched out, means another thread ran on the vCPU: the workload woke up, the hold paid
//! off, and it is counted as a preemption (the paper's S_yield). Short iterations add to the yield time (T_yield) and to the
//! current hold; when the hold reaches the timeout the thread sleeps, so the guest halts the
//! vCPU and the hypervisor can give the physical CPU to someone else.
//!
//! Everything the controller needs is exposed as cumulative atomic counters, so reading them
//! never stalls the threads.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use gleaner_policy::Cpuset;
use gleaner_sys::affinity::pin_current_thread;
use gleaner_sys::clock::monotonic_ns as now_ns;
use gleaner_sys::sched::{gettid, set_thread_sched_policy, thread_context_switches};
use serde::{Deserialize, Serialize};

/// What a retention thread does with its vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RetentionMode {
    /// Parked on a condition variable: the thread costs no CPU and the vCPU may halt.
    Off,
    /// Hold the vCPU with `sched_yield()` for up to `timeout_ns` of uninterrupted idleness,
    /// then release it. `u64::MAX` (see [`RetentionMode::HOLD_FOREVER`]) never releases.
    Yield { timeout_ns: u64 },
}

impl RetentionMode {
    /// Hold without a timeout; used by the wake probe to build Table 2's setting B.
    pub const HOLD_FOREVER: RetentionMode = RetentionMode::Yield {
        timeout_ns: u64::MAX,
    };
}

/// Tuning of the yield loop. The defaults follow the brief: 1 ms first release, doubling to
/// at most 20 ms, preemption threshold calibrated at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YielderParams {
    /// First sleep after a timeout.
    pub min_release_ns: u64,
    /// Longest sleep after consecutive timeouts with no preemption in between.
    pub max_release_ns: u64,
    /// Iterations longer than this count as preemptions. `None` calibrates it per thread
    /// from the median uncontended `sched_yield()` cost (see [`preemption_threshold_ns`]).
    pub preempt_threshold_ns: Option<u64>,
}

impl Default for YielderParams {
    fn default() -> Self {
        Self {
            min_release_ns: 1_000_000,
            max_release_ns: 20_000_000,
            preempt_threshold_ns: None,
        }
    }
}

/// Cumulative, monotonic counters of one retention thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionCounters {
    /// Time spent in uncontended yield iterations: the vCPU was held with nothing to run (T_yield).
    pub yield_ns: u64,
    /// Yield iterations during which another thread ran on the vCPU (S_yield).
    pub preemptions: u64,
    /// Holds that reached the timeout and released the vCPU.
    pub timeouts: u64,
    /// Time spent sleeping after timeouts (vCPU released to the hypervisor).
    pub released_ns: u64,
}

/// A retention thread as the rest of the system sees it: the controller must keep these
/// thread ids out of the workload's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionThread {
    pub cpu: usize,
    pub tid: i32,
}

#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error("cannot pin a retention thread to CPU {cpu}: {source} (is the CPU online and in this process's affinity mask?)")]
    Pin { cpu: usize, source: io::Error },
    #[error("cannot put the retention thread on CPU {cpu} into SCHED_IDLE: {source}")]
    SchedIdle { cpu: usize, source: io::Error },
    #[error("cannot start a retention thread for CPU {cpu}: {source}")]
    Spawn { cpu: usize, source: io::Error },
    #[error("the retention thread for CPU {cpu} exited during start-up")]
    Died { cpu: usize },
    #[error("CPU {cpu} has no retention thread (the pool covers CPUs {pool})")]
    NotInPool { cpu: usize, pool: String },
}

/// Preemption threshold from uncontended yield-iteration costs: ten times the median, but at
/// least 5 µs (clock and syscall jitter) and at most 50 µs. The cap matters when start-up
/// happens on a busy vCPU: then many calibration yields really switch threads, the median is
/// inflated, and without the cap short workload bursts would go unnoticed.
fn preemption_threshold_ns(samples: &mut [u64]) -> u64 {
    const FLOOR_NS: u64 = 5_000;
    const CAP_NS: u64 = 50_000;
    if samples.is_empty() {
        return FLOOR_NS;
    }
    samples.sort_unstable();
    let median = samples[samples.len() / 2];
    median.saturating_mul(10).clamp(FLOOR_NS, CAP_NS)
}

/// What the yield loop does after one timed iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Another thread ran on the vCPU during the iteration; the hold starts over.
    Preempted,
    /// Nothing else ran; the iteration's time was spent holding the vCPU.
    Held,
    /// The hold reached the timeout: release the vCPU by sleeping this long.
    Release { sleep_ns: u64 },
}

/// The yield loop's decisions, kept apart from clocks and system calls so they can be tested
/// with made-up iteration times.
///
/// Release sleeps back off: each consecutive timeout without a preemption in between doubles
/// the sleep, up to the maximum. A vCPU whose workload has gone quiet is then held for one
/// timeout per sleep at a shrinking duty cycle (e.g. 30 µs per 20 ms = 0.15 %), so an idle
/// workload costs almost nothing; the first preemption resets the sleep so an active workload
/// is held promptly again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HoldTracker {
    threshold_ns: u64,
    held_ns: u64,
    next_sleep_ns: u64,
    min_sleep_ns: u64,
    max_sleep_ns: u64,
}

impl HoldTracker {
    fn new(threshold_ns: u64, params: &YielderParams) -> Self {
        let min_sleep_ns = params.min_release_ns.max(1);
        Self {
            threshold_ns,
            held_ns: 0,
            next_sleep_ns: min_sleep_ns,
            min_sleep_ns,
            max_sleep_ns: params.max_release_ns.max(min_sleep_ns),
        }
    }

    /// `switched_out` is asked only about long iterations: timing alone cannot tell a thread
    /// that ran from an interrupt or the hypervisor stealing the vCPU (in a guest a timer tick
    /// alone can take several µs). Long iterations without a switch still count as holding:
    /// the vCPU was ours and had nothing else to run.
    fn on_iteration(
        &mut self,
        iteration_ns: u64,
        timeout_ns: u64,
        switched_out: impl FnOnce() -> bool,
    ) -> Step {
        if iteration_ns > self.threshold_ns && switched_out() {
            self.restart();
            return Step::Preempted;
        }
        self.held_ns = self.held_ns.saturating_add(iteration_ns);
        if self.held_ns < timeout_ns {
            return Step::Held;
        }
        self.held_ns = 0;
        let sleep_ns = self.next_sleep_ns;
        self.next_sleep_ns = self.next_sleep_ns.saturating_mul(2).min(self.max_sleep_ns);
        Step::Release { sleep_ns }
    }

    /// The workload used the vCPU (or retention was switched off): start afresh.
    fn restart(&mut self) {
        self.held_ns = 0;
        self.next_sleep_ns = self.min_sleep_ns;
    }
}

// Mode word of a slot: a yield timeout, or one of two reserved values. Timeouts at or above
// YIELD_MAX_NS (about 584 years) mean "forever" anyway.
const STATE_OFF: u64 = u64::MAX;
const STATE_STOP: u64 = u64::MAX - 1;
const YIELD_MAX_NS: u64 = u64::MAX - 2;

fn encode(mode: RetentionMode) -> u64 {
    match mode {
        RetentionMode::Off => STATE_OFF,
        RetentionMode::Yield { timeout_ns } => timeout_ns.min(YIELD_MAX_NS),
    }
}

/// State shared between the pool (controller side) and one retention thread.
struct Slot {
    cpu: usize,
    state: AtomicU64,
    lock: Mutex<()>,
    wake: Condvar,
    tid: AtomicI32,
    /// True while the thread waits in Off mode; lets callers see that a switch took effect.
    parked: AtomicBool,
    yield_ns: AtomicU64,
    preemptions: AtomicU64,
    timeouts: AtomicU64,
    released_ns: AtomicU64,
}

impl Slot {
    fn new(cpu: usize) -> Self {
        Self {
            cpu,
            state: AtomicU64::new(STATE_OFF),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            tid: AtomicI32::new(0),
            parked: AtomicBool::new(false),
            yield_ns: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            released_ns: AtomicU64::new(0),
        }
    }

    fn guard(&self) -> MutexGuard<'_, ()> {
        // The mutex protects no data (the state is atomic), so a poisoned lock is still usable.
        self.lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Changes the mode word and wakes the thread if it is parked or sleeping. Taking the lock
    /// between the store and the notify closes the race with a thread that has just checked
    /// the old state and is about to wait.
    fn set_state(&self, state: u64) {
        if self.state.swap(state, Ordering::AcqRel) != state {
            drop(self.guard());
            self.wake.notify_all();
        }
    }

    fn counters(&self) -> RetentionCounters {
        RetentionCounters {
            yield_ns: self.yield_ns.load(Ordering::Relaxed),
            preemptions: self.preemptions.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            released_ns: self.released_ns.load(Ordering::Relaxed),
        }
    }
}

/// One retention thread per vCPU of a set. Threads start in [`RetentionMode::Off`].
pub struct RetentionPool {
    slots: Vec<Arc<Slot>>,
    handles: Vec<JoinHandle<()>>,
}

impl fmt::Debug for RetentionPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetentionPool")
            .field("cpus", &self.cpus().to_string())
            .finish()
    }
}

impl RetentionPool {
    /// Starts a thread on every CPU of `cpus` and returns once each is pinned, calibrated and
    /// SCHED_IDLE. If any CPU fails, the threads already started are stopped again.
    pub fn start(cpus: &Cpuset, params: YielderParams) -> Result<Self, RetentionError> {
        let mut pool = RetentionPool {
            slots: Vec::new(),
            handles: Vec::new(),
        };
        let (ready_tx, ready_rx) = mpsc::channel();
        for cpu in cpus.iter() {
            let slot = Arc::new(Slot::new(cpu));
            let thread_slot = Arc::clone(&slot);
            let ready = ready_tx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("gleaner-ret{cpu}"))
                .spawn(move || retention_thread(&thread_slot, params, ready))
                .map_err(|source| RetentionError::Spawn { cpu, source })?;
            pool.slots.push(slot);
            pool.handles.push(handle);
        }
        drop(ready_tx);
        for slot in &pool.slots {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e), // `pool` drops here and joins the others
                Err(_) => return Err(RetentionError::Died { cpu: slot.cpu }),
            }
        }
        Ok(pool)
    }

    pub fn cpus(&self) -> Cpuset {
        self.slots.iter().map(|s| s.cpu).collect()
    }

    /// Kernel thread ids of the retention threads.
    pub fn threads(&self) -> Vec<RetentionThread> {
        self.slots
            .iter()
            .map(|s| RetentionThread {
                cpu: s.cpu,
                tid: s.tid.load(Ordering::Acquire),
            })
            .collect()
    }

    /// Switches one vCPU's thread; a parked or sleeping thread is woken at once.
    pub fn set_mode(&self, cpu: usize, mode: RetentionMode) -> Result<(), RetentionError> {
        let slot = self.slot(cpu)?;
        slot.set_state(encode(mode));
        Ok(())
    }

    pub fn mode(&self, cpu: usize) -> Result<RetentionMode, RetentionError> {
        let slot = self.slot(cpu)?;
        Ok(match slot.state.load(Ordering::Acquire) {
            STATE_OFF | STATE_STOP => RetentionMode::Off,
            timeout_ns => RetentionMode::Yield { timeout_ns },
        })
    }

    /// Whether the thread of `cpu` has acted on an Off and is parked (it may lag a
    /// [`set_mode`](Self::set_mode) while a workload keeps its vCPU busy).
    #[cfg(test)]
    fn is_parked(&self, cpu: usize) -> Result<bool, RetentionError> {
        Ok(self.slot(cpu)?.parked.load(Ordering::Acquire))
    }

    /// Cumulative counters per CPU, in CPU order.
    pub fn counters(&self) -> Vec<(usize, RetentionCounters)> {
        self.slots.iter().map(|s| (s.cpu, s.counters())).collect()
    }

    /// Stops and joins all threads (also done on drop).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn slot(&self, cpu: usize) -> Result<&Slot, RetentionError> {
        self.slots
            .iter()
            .find(|s| s.cpu == cpu)
            .map(|s| s.as_ref())
            .ok_or_else(|| RetentionError::NotInPool {
                cpu,
                pool: self.cpus().to_string(),
            })
    }

    fn shutdown(&mut self) {
        for slot in &self.slots {
            slot.set_state(STATE_STOP);
        }
        for handle in self.handles.drain(..) {
            // A retention thread has no panicking code path; if one panicked anyway there is
            // nothing left to clean up for it.
            let _ = handle.join();
        }
    }
}

impl Drop for RetentionPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A [`RetentionPool`] started the first time a vCPU is to be held, not before.
///
/// A run whose policy never holds a vCPU (most runs: the policy's preconditions for retention
/// are narrow) then never has a SCHED_IDLE thread. That matters beyond the threads' own
/// footprint: a SCHED_IDLE thread on a vCPU the workload saturates can hold up the process's
/// exit after SIGKILL for seconds, which is why the daemon's guard polls its owner while such
/// threads may exist, and a process without them lets the guard sleep.
pub struct LazyRetentionPool {
    cpus: Cpuset,
    params: YielderParams,
    /// Called once, right before the threads start.
    before_start: Box<dyn Fn()>,
    /// The pool, or why it could not start (then it is not tried again).
    pool: std::cell::OnceCell<Result<RetentionPool, String>>,
}

impl LazyRetentionPool {
    pub fn new(cpus: &Cpuset, params: YielderParams, before_start: Box<dyn Fn()>) -> Self {
        Self {
            cpus: cpus.clone(),
            params,
            before_start,
            pool: std::cell::OnceCell::new(),
        }
    }

    /// The pool, if it has started.
    pub fn started(&self) -> Option<&RetentionPool> {
        self.pool.get().and_then(|p| p.as_ref().ok())
    }

    /// The pool, started now if it was not; the error of a failed start, every time after it.
    pub fn get_or_start(&self) -> Result<&RetentionPool, &str> {
        self.pool
            .get_or_init(|| {
                (self.before_start)();
                RetentionPool::start(&self.cpus, self.params).map_err(|e| {
                    tracing::warn!("cannot start retention threads, so no vCPU is held: {e}");
                    e.to_string()
                })
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// Stops and joins the threads, if they were started (also done on drop).
    pub fn stop(self) {
        if let Some(Ok(pool)) = self.pool.into_inner() {
            pool.stop();
        }
    }
}

fn retention_thread(
    slot: &Slot,
    params: YielderParams,
    ready: mpsc::Sender<Result<(), RetentionError>>,
) {
    let cpu = slot.cpu;
    slot.tid.store(gettid(), Ordering::Release);
    if let Err(source) = pin_current_thread(cpu) {
        let _ = ready.send(Err(RetentionError::Pin { cpu, source }));
        return;
    }
    // Calibrate while still SCHED_OTHER: as SCHED_IDLE the thread would barely run on a busy
    // vCPU and would measure the workload instead of the yield.
    let threshold_ns = params.preempt_threshold_ns.unwrap_or_else(|| {
        let mut samples = yield_iteration_costs(201);
        preemption_threshold_ns(&mut samples)
    });
    // SCHED_IDLE: the kernel runs this thread only when nothing else wants the vCPU and
    // preempts it as soon as a workload thread wakes. sched_yield() alone is not enough:
    // under CFS/EEVDF a yielding SCHED_OTHER thread still competes for its fair share, so it
    // would delay the workload it is meant to help.
    if let Err(source) = set_thread_sched_policy(0, libc::SCHED_IDLE) {
        let _ = ready.send(Err(RetentionError::SchedIdle { cpu, source }));
        return;
    }
    let _ = ready.send(Ok(()));
    drop(ready);
    yield_loop(slot, params, threshold_ns);
}

fn yield_loop(slot: &Slot, params: YielderParams, threshold_ns: u64) {
    let mut hold = HoldTracker::new(threshold_ns, &params);
    let mut last = now_ns();
    let mut switches = thread_context_switches();
    loop {
        let state = slot.state.load(Ordering::Acquire);
        match state {
            STATE_STOP => return,
            STATE_OFF => {
                let guard = slot.guard();
                slot.parked.store(true, Ordering::Release);
                let guard = slot
                    .wake
                    .wait_while(guard, |_| slot.state.load(Ordering::Acquire) == STATE_OFF)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                slot.parked.store(false, Ordering::Release);
                drop(guard);
                hold.restart();
                last = now_ns();
                switches = thread_context_switches();
            }
            timeout_ns => {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
                // Time whole iterations rather than just the syscall: a workload thread may
                // preempt us anywhere in the loop, not only inside sched_yield().
                let t = now_ns();
                let iteration_ns = t.saturating_sub(last);
                last = t;
                let switched_out = || {
                    let now = thread_context_switches();
                    // Without a count, fall back to timing alone.
                    let moved = now.is_none() || now != switches;
                    switches = now;
                    moved
                };
                match hold.on_iteration(iteration_ns, timeout_ns, switched_out) {
                    Step::Preempted => {
                        slot.preemptions.fetch_add(1, Ordering::Relaxed);
                    }
                    Step::Held => {
                        slot.yield_ns.fetch_add(iteration_ns, Ordering::Relaxed);
                    }
                    Step::Release { sleep_ns } => {
                        slot.yield_ns.fetch_add(iteration_ns, Ordering::Relaxed);
                        slot.timeouts.fetch_add(1, Ordering::Relaxed);
                        let slept = release(slot, state, sleep_ns);
                        slot.released_ns.fetch_add(slept, Ordering::Relaxed);
                        last = now_ns();
                        switches = thread_context_switches(); // sleeping switched us out
                    }
                }
            }
        }
    }
}

/// Sleeps `sleep_ns` so the guest can halt the vCPU. A futex wait with a timeout releases the
/// vCPU exactly like `clock_nanosleep`, but a mode change or stop ends it at once.
fn release(slot: &Slot, state: u64, sleep_ns: u64) -> u64 {
    let start = now_ns();
    let guard = slot.guard();
    let _ = slot
        .wake
        .wait_timeout_while(guard, Duration::from_nanos(sleep_ns), |_| {
            slot.state.load(Ordering::Acquire) == state
        })
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    now_ns().saturating_sub(start)
}

/// Durations of `n` back-to-back `sched_yield()` + clock iterations on the calling thread.
fn yield_iteration_costs(n: usize) -> Vec<u64> {
    let mut samples = Vec::with_capacity(n);
    let mut last = now_ns();
    for _ in 0..n {
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
        let t = now_ns();
        samples.push(t.saturating_sub(last));
        last = t;
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;
    use gleaner_sys::affinity::thread_affinity;
    use gleaner_sys::sched::thread_sched_policy;
    use std::time::Instant;

    /// CPU time consumed so far by a thread of this process (the kernel's per-thread
    /// CPU-time clock id encoding: ~tid << 3 | CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD).
    fn thread_cpu_ns(tid: i32) -> u64 {
        let clock = ((!tid) << 3) | 6;
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
        assert_eq!(rc, 0, "thread clock of {tid}");
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    fn my_cpus() -> Cpuset {
        thread_affinity(0).unwrap()
    }

    /// Polls `cond` until it holds or `limit` passes.
    fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        cond()
    }

    /// Threads of this process named like the pool's.
    fn retention_threads_running() -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.starts_with("gleaner-ret"))
            .count()
    }

    #[test]
    fn a_lazy_pool_starts_its_threads_at_the_first_hold_and_says_so_first() {
        let cpu = my_cpus().last().unwrap();
        let told = std::rc::Rc::new(std::cell::Cell::new(0));
        let seen = told.clone();
        let lazy = LazyRetentionPool::new(
            &[cpu].into_iter().collect(),
            YielderParams::default(),
            Box::new(move || {
                // Said before any thread exists (other tests' pools may run beside this one,
                // so only the count of this call is checked here).
                seen.set(seen.get() + 1);
            }),
        );
        assert!(lazy.started().is_none());
        assert_eq!(told.get(), 0);
        let pool = lazy.get_or_start().unwrap();
        assert_eq!(pool.cpus().iter().collect::<Vec<_>>(), vec![cpu]);
        assert!(pool.threads().iter().all(|t| t.tid > 0));
        assert!(retention_threads_running() >= 1);
        lazy.get_or_start().unwrap();
        assert_eq!(told.get(), 1, "started once, said once");
        assert!(lazy.started().is_some());
        lazy.stop();
    }

    #[test]
    fn a_lazy_pool_that_cannot_start_says_why_and_does_not_retry() {
        // A CPU this thread may not run on: the pool cannot pin a thread there.
        let absent = my_cpus().last().unwrap() + 4096;
        let told = std::rc::Rc::new(std::cell::Cell::new(0));
        let seen = told.clone();
        let lazy = LazyRetentionPool::new(
            &[absent].into_iter().collect(),
            YielderParams::default(),
            Box::new(move || seen.set(seen.get() + 1)),
        );
        let first = lazy.get_or_start().unwrap_err().to_string();
        assert!(first.contains(&absent.to_string()), "{first}");
        assert_eq!(lazy.get_or_start().unwrap_err(), first);
        assert_eq!(told.get(), 1);
        assert!(lazy.started().is_none());
        lazy.stop();
    }

    fn one_cpu_pool(params: YielderParams) -> (RetentionPool, usize) {
        let cpu = my_cpus().last().unwrap();
        let pool = RetentionPool::start(&[cpu].into_iter().collect(), params).unwrap();
        (pool, cpu)
    }

    #[test]
    fn threshold_is_ten_medians_within_bounds() {
        assert_eq!(
            preemption_threshold_ns(&mut [900, 100, 1_000, 800, 700]),
            8_000
        );
        assert_eq!(preemption_threshold_ns(&mut [100, 120, 130]), 5_000);
        assert_eq!(
            preemption_threshold_ns(&mut [1_000_000, 2_000_000, 90]),
            50_000
        );
        assert_eq!(preemption_threshold_ns(&mut []), 5_000);
    }

    #[test]
    fn hold_times_out_backs_off_and_resets_on_preemption() {
        let params = YielderParams {
            min_release_ns: 1_000_000,
            max_release_ns: 20_000_000,
            preempt_threshold_ns: None,
        };
        let mut hold = HoldTracker::new(5_000, &params);
        // 1 µs iterations against a 3 µs timeout: every third iteration releases.
        let mut sleeps = Vec::new();
        let not_asked = || -> bool { panic!("short iterations never look at context switches") };
        for _ in 0..21 {
            match hold.on_iteration(1_000, 3_000, not_asked) {
                Step::Release { sleep_ns } => sleeps.push(sleep_ns / 1_000_000),
                Step::Held => {}
                Step::Preempted => panic!("1 µs is below the threshold"),
            }
        }
        assert_eq!(sleeps, vec![1, 2, 4, 8, 16, 20, 20]);
        // A preemption resets both the hold and the backoff.
        assert_eq!(hold.on_iteration(1_000, 3_000, not_asked), Step::Held);
        assert_eq!(hold.on_iteration(6_000, 3_000, || true), Step::Preempted);
        assert_eq!(hold.on_iteration(1_000, 3_000, not_asked), Step::Held);
        assert_eq!(hold.on_iteration(1_000, 3_000, not_asked), Step::Held);
        assert_eq!(
            hold.on_iteration(1_000, 3_000, not_asked),
            Step::Release {
                sleep_ns: 1_000_000
            }
        );
        // A long iteration without a context switch (interrupt, steal) is still holding and
        // counts towards the timeout.
        assert_eq!(hold.on_iteration(6_000, 10_000, || false), Step::Held);
        assert_eq!(
            hold.on_iteration(6_000, 10_000, || false),
            Step::Release {
                sleep_ns: 2_000_000
            }
        );
        // An iteration exactly at the threshold still counts as holding.
        assert_eq!(hold.on_iteration(5_000, u64::MAX, not_asked), Step::Held);
        // Holding forever never releases, even after a long hold.
        for _ in 0..1000 {
            assert_eq!(
                hold.on_iteration(4_999, YIELD_MAX_NS, not_asked),
                Step::Held
            );
        }
        // Degenerate parameters stay usable.
        let mut z = HoldTracker::new(
            5_000,
            &YielderParams {
                min_release_ns: 0,
                max_release_ns: 0,
                preempt_threshold_ns: None,
            },
        );
        assert_eq!(
            z.on_iteration(1, 0, not_asked),
            Step::Release { sleep_ns: 1 }
        );
    }

    #[test]
    fn pool_on_all_cpus_is_pinned_and_sched_idle_and_stops() {
        let cpus = my_cpus();
        let pool = RetentionPool::start(&cpus, YielderParams::default()).unwrap();
        assert_eq!(pool.cpus(), cpus);
        let threads = pool.threads();
        assert_eq!(threads.len(), cpus.len());
        for t in &threads {
            assert!(t.tid > 0);
            assert_eq!(
                thread_sched_policy(t.tid).unwrap(),
                libc::SCHED_IDLE,
                "{t:?}"
            );
            let pinned: Cpuset = [t.cpu].into_iter().collect();
            assert_eq!(thread_affinity(t.tid).unwrap(), pinned, "{t:?}");
            assert_eq!(pool.mode(t.cpu).unwrap(), RetentionMode::Off);
        }
        let tids: Vec<i32> = threads.iter().map(|t| t.tid).collect();
        pool.stop();
        // `join` returns once the kernel has cleared the thread's tid, which happens before
        // the exiting thread is reaped; its /proc entry can outlive the join by a moment
        // (seen on a CI machine). A thread that really kept running would stay for good.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        for tid in tids {
            let path = format!("/proc/self/task/{tid}");
            while std::path::Path::new(&path).exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert!(
                !std::path::Path::new(&path).exists(),
                "{path} still exists 2 s after stop"
            );
        }
    }

    #[test]
    fn unknown_cpu_is_an_error_not_a_panic() {
        let (pool, cpu) = one_cpu_pool(YielderParams::default());
        let err = pool.set_mode(cpu + 1, RetentionMode::Off).unwrap_err();
        assert!(matches!(err, RetentionError::NotInPool { .. }), "{err}");
        let offline: Cpuset = [gleaner_policy::cpuset::MAX_CPU].into_iter().collect();
        let err = RetentionPool::start(&offline, YielderParams::default()).unwrap_err();
        assert!(
            matches!(err, RetentionError::Pin { cpu, .. } if cpu == gleaner_policy::cpuset::MAX_CPU),
            "{err}"
        );
    }

    #[test]
    fn off_mode_costs_no_cpu_and_yield_mode_holds() {
        let (pool, cpu) = one_cpu_pool(YielderParams::default());
        let tid = pool.threads()[0].tid;
        let before = thread_cpu_ns(tid);
        std::thread::sleep(Duration::from_millis(200));
        let parked_cpu = thread_cpu_ns(tid) - before;
        assert!(
            parked_cpu < 2_000_000,
            "parked thread used {parked_cpu} ns of CPU"
        );
        assert_eq!(pool.counters()[0].1, RetentionCounters::default());

        // Yield mode takes effect: the loop runs and either holds the idle vCPU or, if other
        // threads keep it busy (parallel tests, builds), is preempted by them.
        pool.set_mode(cpu, RetentionMode::HOLD_FOREVER).unwrap();
        let looping = eventually(Duration::from_millis(1500), || {
            let c = pool.counters()[0].1;
            c.yield_ns > 0 || c.preemptions > 0
        });
        assert!(looping, "{:?}", pool.counters());
        assert!(thread_cpu_ns(tid) > before);

        // Back to Off: once the thread has parked, nothing moves any more.
        pool.set_mode(cpu, RetentionMode::Off).unwrap();
        assert!(eventually(Duration::from_millis(1500), || pool
            .is_parked(cpu)
            .unwrap()));
        let parked = pool.counters()[0].1;
        let cpu_at_park = thread_cpu_ns(tid);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(pool.counters()[0].1, parked);
        assert!(thread_cpu_ns(tid) - cpu_at_park < 1_000_000);
    }

    #[test]
    fn short_timeout_releases_with_backoff_and_counters_are_monotonic() {
        let params = YielderParams {
            min_release_ns: 1_000_000,
            max_release_ns: 4_000_000,
            ..Default::default()
        };
        let (pool, cpu) = one_cpu_pool(params);
        pool.set_mode(cpu, RetentionMode::Yield { timeout_ns: 20_000 })
            .unwrap();
        let mut prev = RetentionCounters::default();
        let mut monotonic = true;
        let reached = eventually(Duration::from_millis(1500), || {
            let c = pool.counters()[0].1;
            monotonic &= c.yield_ns >= prev.yield_ns
                && c.preemptions >= prev.preemptions
                && c.timeouts >= prev.timeouts
                && c.released_ns >= prev.released_ns;
            prev = c;
            c.timeouts >= 3
        });
        assert!(monotonic);
        if !reached && prev.preemptions > 0 && prev.yield_ns < 60_000 {
            // Other threads kept the vCPU busy the whole time, so there was no idle time to
            // hold and nothing to time out; the HoldTracker test covers the logic.
            eprintln!(
                "vCPU {cpu} was saturated by other threads ({prev:?}); timeout path not exercised"
            );
            return;
        }
        assert!(reached, "only {prev:?} after 1.5 s");
        pool.set_mode(cpu, RetentionMode::Off).unwrap();
        let c = pool.counters()[0].1;
        // Every completed release slept at least the minimum (the last one may be cut short by
        // the switch to Off); the backoff itself is covered by the HoldTracker test.
        assert!(c.released_ns >= (c.timeouts - 1) * 1_000_000, "{c:?}");
        assert!(c.yield_ns >= c.timeouts * 20_000, "{c:?}");
    }

    #[test]
    fn competing_thread_on_the_same_cpu_preempts_the_hold() {
        let (pool, cpu) = one_cpu_pool(YielderParams::default());
        pool.set_mode(cpu, RetentionMode::HOLD_FOREVER).unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                pin_current_thread(cpu).unwrap();
                // A bursty workload: compute for 1 ms, block for 0.3 ms. Each wake-up
                // preempts the SCHED_IDLE holder.
                while !stop.load(Ordering::Relaxed) {
                    let t = now_ns();
                    while now_ns() - t < 1_000_000 {
                        std::hint::spin_loop();
                    }
                    std::thread::sleep(Duration::from_micros(300));
                }
            });
            let seen = eventually(Duration::from_millis(1500), || {
                pool.counters()[0].1.preemptions >= 3
            });
            stop.store(true, Ordering::Relaxed);
            assert!(seen, "counters {:?}", pool.counters());
        });
        pool.stop();
    }
}
