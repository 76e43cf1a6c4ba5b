//! Shared run-time machinery: starting worker threads together, switching
//! phases, and counting per-phase progress.
//!
//! Workloads block on each other (barriers, queues, futexes), so a worker that
//! fails to spawn would leave the others waiting forever. Every worker therefore
//! waits at a [`StartGate`] first; only when all threads exist is the gate opened
//! (and the clock started), otherwise it is aborted and the spawned workers exit
//! without touching the shared sync objects.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::thread::{self, Scope, ScopedJoinHandle};
use std::time::Instant;

use crate::phase::{Length, PhaseSpec};
use crate::report::{rate, PhaseReport};
use crate::WorkloadError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GateState {
    Closed,
    Open,
    Aborted,
}

/// A one-shot gate: workers block until the spawner opens or aborts it.
#[derive(Debug)]
pub(crate) struct StartGate {
    state: Mutex<GateState>,
    changed: Condvar,
    /// When the gate opened: the common start of timed runs.
    opened_at: std::sync::OnceLock<std::time::Instant>,
}

impl StartGate {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(GateState::Closed),
            changed: Condvar::new(),
            opened_at: std::sync::OnceLock::new(),
        }
    }

    /// Blocks until the gate is opened (returns true) or aborted (false).
    fn wait(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while *state == GateState::Closed {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *state == GateState::Open
    }

    fn set(&self, new_state: GateState) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // Once decided, the gate stays decided: an abort cannot be undone.
        if *state == GateState::Closed {
            *state = new_state;
        }
        self.changed.notify_all();
    }

    /// Lets all waiting workers run, and returns when: the start a run's elapsed time counts
    /// from, as its timed workers' deadlines do. Taken after the opening instead, a run of
    /// 20 ms whose opener was preempted by its workers measured under 20 ms.
    pub(crate) fn open(&self) -> std::time::Instant {
        let _ = self.opened_at.set(std::time::Instant::now());
        self.set(GateState::Open);
        self.opened_at().unwrap_or_else(std::time::Instant::now)
    }

    /// When the gate opened; `None` before. A timed worker's deadline counts from here, not
    /// from its own first instruction: 1,000 workers leave the gate one by one through its
    /// mutex, the last of them seconds later on a busy 2-vCPU guest, and a `--duration 10`
    /// run of `matmul --threads 1000` lasted 59-106 s.
    pub(crate) fn opened_at(&self) -> Option<std::time::Instant> {
        self.opened_at.get().copied()
    }

    /// Makes all waiting workers return without running their bodies.
    pub(crate) fn abort(&self) {
        self.set(GateState::Aborted);
    }
}

/// Spawns a named scoped thread that runs `body` once `gate` opens.
/// On spawn failure the gate is aborted so already-spawned workers exit.
pub(crate) fn spawn_gated<'scope, 'env, T, F>(
    scope: &'scope Scope<'scope, 'env>,
    gate: &'scope StartGate,
    name: String,
    body: F,
) -> Result<ScopedJoinHandle<'scope, Option<T>>, WorkloadError>
where
    F: FnOnce() -> T + Send + 'scope,
    T: Send + 'scope,
{
    thread::Builder::new()
        .name(name.clone())
        .spawn_scoped(scope, move || gate.wait().then(body))
        .map_err(|source| {
            gate.abort();
            WorkloadError::Spawn {
                thread: name,
                source,
            }
        })
}

/// Joins a worker started with [`spawn_gated`] after the gate was opened.
pub(crate) fn join<T>(handle: ScopedJoinHandle<'_, Option<T>>) -> Result<T, WorkloadError> {
    let thread = handle.thread().name().unwrap_or("worker").to_string();
    match handle.join() {
        Ok(Some(value)) => Ok(value),
        // None means the gate was aborted; callers only join after opening it,
        // so both cases mean the worker did not finish its body.
        Ok(None) | Err(_) => Err(WorkloadError::WorkerFailed { thread }),
    }
}

/// Sentinel phase index meaning "the run is over".
const DONE: usize = usize::MAX;

/// Decides which phase a unit of work belongs to.
///
/// Counted specs map the unit's global index to a phase, so the set of work
/// done (and the checksum) does not depend on timing or thread count. Timed
/// specs are driven by [`Schedule::run_clock`] on the spawning thread, which
/// advances an atomic phase index that workers poll.
#[derive(Debug)]
pub(crate) struct Schedule<'spec> {
    spec: &'spec PhaseSpec,
    /// For counted specs: exclusive end index of each phase (cumulative counts).
    counted_ends: Vec<u64>,
    clock: AtomicUsize,
}

impl<'spec> Schedule<'spec> {
    pub(crate) fn new(spec: &'spec PhaseSpec) -> Self {
        let mut end = 0u64;
        let counted_ends = spec
            .phases()
            .iter()
            .map(|phase| {
                if let Length::Count(count) = phase.length {
                    end = end.saturating_add(count);
                }
                end
            })
            .collect();
        Self {
            spec,
            counted_ends,
            clock: AtomicUsize::new(0),
        }
    }

    /// Phase of the unit with global index `index`, or `None` once the run is over.
    pub(crate) fn phase_for(&self, index: u64) -> Option<usize> {
        if self.spec.is_timed() {
            // Relaxed: the index is only a hint about what to do next; no data
            // is published through it.
            let phase = self.clock.load(Ordering::Relaxed);
            (phase != DONE).then_some(phase)
        } else {
            self.counted_ends.iter().position(|&end| index < end)
        }
    }

    /// Hash iterations per unit of work in `phase`.
    pub(crate) fn work(&self, phase: usize) -> u64 {
        self.spec.phases()[phase].work
    }

    pub(crate) fn phase_count(&self) -> usize {
        self.spec.phases().len()
    }

    /// For timed specs, sleeps through each phase, advancing the phase index,
    /// then signals the end of the run. Returns immediately for counted specs.
    pub(crate) fn run_clock(&self) {
        if !self.spec.is_timed() {
            return;
        }
        for (index, phase) in self.spec.phases().iter().enumerate() {
            self.clock.store(index, Ordering::Relaxed);
            if let Length::Duration(duration) = phase.length {
                thread::sleep(duration);
            }
        }
        self.clock.store(DONE, Ordering::Relaxed);
    }

    /// Builds per-phase reports from merged tallies; phase `i`'s window runs
    /// from the end of phase `i - 1` (or `start`) to the last moment a worker
    /// was still doing phase-`i` work.
    pub(crate) fn phase_reports(&self, tally: &PhaseTally, start: Instant) -> Vec<PhaseReport> {
        let mut window_start = start;
        self.spec
            .phases()
            .iter()
            .enumerate()
            .map(|(index, phase)| {
                let window_end =
                    tally.ended_at[index].map_or(window_start, |t| t.max(window_start));
                let elapsed = window_end - window_start;
                window_start = window_end;
                PhaseReport {
                    label: phase.label.clone(),
                    work: Some(phase.work),
                    ops: tally.ops[index],
                    elapsed_s: elapsed.as_secs_f64(),
                    throughput_per_s: rate(tally.ops[index], elapsed),
                }
            })
            .collect()
    }
}

/// Per-thread count of work units per phase and when each phase ended.
#[derive(Debug, Clone)]
pub(crate) struct PhaseTally {
    pub(crate) ops: Vec<u64>,
    ended_at: Vec<Option<Instant>>,
    current: Option<usize>,
}

impl PhaseTally {
    pub(crate) fn new(phase_count: usize) -> Self {
        Self {
            ops: vec![0; phase_count],
            ended_at: vec![None; phase_count],
            current: None,
        }
    }

    /// Counts one unit of `phase` work about to be done. Reading the clock
    /// only on phase changes keeps this cheap enough for per-op use.
    pub(crate) fn count(&mut self, phase: usize) {
        if self.current != Some(phase) {
            self.stamp_current();
            self.current = Some(phase);
        }
        self.ops[phase] += 1;
    }

    /// Marks the end of the current phase; call once when the worker stops.
    pub(crate) fn finish(&mut self) {
        self.stamp_current();
        self.current = None;
    }

    fn stamp_current(&mut self) {
        if let Some(phase) = self.current {
            self.ended_at[phase] = Some(Instant::now());
        }
    }

    /// Adds another thread's counts; a phase ends when its last worker leaves it.
    pub(crate) fn merge(&mut self, other: &PhaseTally) {
        for (mine, theirs) in self.ops.iter_mut().zip(&other.ops) {
            *mine += theirs;
        }
        self.merge_ends(other);
    }

    /// Keeps the later end of each phase without adding counts, for workers
    /// that all do the same units (every thread passes every barrier episode).
    pub(crate) fn merge_ends(&mut self, other: &PhaseTally) {
        for (mine, theirs) in self.ended_at.iter_mut().zip(&other.ended_at) {
            *mine = (*mine).max(*theirs);
        }
    }

    pub(crate) fn total(&self) -> u64 {
        self.ops.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_schedule_maps_indices_to_phases() {
        let spec: PhaseSpec = "fine:3,coarse:2".parse().unwrap();
        let schedule = Schedule::new(&spec);
        let phases: Vec<_> = (0..6).map(|i| schedule.phase_for(i)).collect();
        assert_eq!(phases, [Some(0), Some(0), Some(0), Some(1), Some(1), None]);
        assert_eq!(schedule.work(1), crate::phase::COARSE_WORK);
    }

    #[test]
    fn timed_schedule_follows_clock_and_ends() {
        let spec: PhaseSpec = "fine:1ms,coarse:1ms".parse().unwrap();
        let schedule = Schedule::new(&spec);
        assert_eq!(schedule.phase_for(12345), Some(0));
        schedule.run_clock();
        assert_eq!(schedule.phase_for(0), None);
    }

    #[test]
    fn tally_counts_and_merges() {
        let mut a = PhaseTally::new(2);
        a.count(0);
        a.count(0);
        a.count(1);
        a.finish();
        let mut b = PhaseTally::new(2);
        b.count(1);
        b.finish();
        a.merge(&b);
        assert_eq!(a.ops, [2, 2]);
        assert_eq!(a.total(), 4);
        assert!(a.ended_at[0].unwrap() <= a.ended_at[1].unwrap());
    }

    #[test]
    fn aborted_gate_skips_worker_bodies() {
        let gate = StartGate::new();
        let ran = std::sync::atomic::AtomicBool::new(false);
        thread::scope(|scope| {
            let handle = spawn_gated(scope, &gate, "gw-test".into(), || {
                ran.store(true, Ordering::SeqCst);
            })
            .unwrap();
            gate.abort();
            gate.open(); // must not undo the abort
            assert!(matches!(
                join(handle),
                Err(WorkloadError::WorkerFailed { .. })
            ));
        });
        assert!(!ran.load(Ordering::SeqCst));
    }
}
