//! `mutex`: threads contending for a few `std::sync::Mutex`es.
//!
//! Mutex-heavy applications (dedup, ferret, cholesky in the paper) are the ones
//! Gleaner helps most: a contended lock parks waiters in the kernel and every
//! release pays a cross-vCPU wakeup. Each op does `work` hash iterations outside
//! any lock, then takes one of `locks` mutexes (chosen by hashing the op index)
//! and does `critical_section` iterations inside it, adding the result to the
//! protected value. Op `i` is always done by thread `i % threads`, and all
//! results are combined commutatively, so a counted run's checksum is the same
//! for any thread count.

use std::sync::{Mutex, PoisonError};
use std::thread;

use crate::harness::{join, spawn_gated, PhaseTally, Schedule, StartGate};
use crate::hash::{hash_work, mix};
use crate::phase::PhaseSpec;
use crate::report::{rate, Report};
use crate::{require_positive, WorkloadError};

/// Makes the outside-the-lock hash differ from the critical-section hash of the same op.
const OUTSIDE_SALT: u64 = 0x5DEE_CE66_D1CE_4E5B;

/// Parameters of a mutex run.
#[derive(Debug, Clone)]
pub struct MutexConfig {
    pub threads: usize,
    /// Number of distinct mutexes; few locks means heavy contention.
    pub locks: usize,
    /// Hash iterations done while holding the lock.
    pub critical_section: u64,
    /// Op counts (or durations) per phase; `work` is hash iterations outside the lock.
    pub phases: PhaseSpec,
}

/// Runs the mutex workload and returns its report.
pub fn mutex(cfg: &MutexConfig) -> Result<Report, WorkloadError> {
    require_positive("threads", cfg.threads)?;
    require_positive("locks", cfg.locks)?;

    let schedule = Schedule::new(&cfg.phases);
    let locks: Vec<Mutex<u64>> = (0..cfg.locks).map(|_| Mutex::new(0)).collect();
    let gate = StartGate::new();
    let stride = cfg.threads as u64;
    let lock_count = cfg.locks as u64;

    thread::scope(|scope| {
        let (schedule, locks) = (&schedule, &locks);
        let mut workers = Vec::with_capacity(cfg.threads);
        for thread_index in 0..cfg.threads {
            workers.push(spawn_gated(
                scope,
                &gate,
                format!("gw-mutex-{thread_index}"),
                move || {
                    let mut tally = PhaseTally::new(schedule.phase_count());
                    let mut outside_sum = 0u64;
                    let mut op = thread_index as u64;
                    while let Some(phase) = schedule.phase_for(op) {
                        tally.count(phase);
                        let outside = hash_work(op ^ OUTSIDE_SALT, schedule.work(phase));
                        outside_sum = outside_sum.wrapping_add(outside);
                        let lock = &locks[(mix(op) % lock_count) as usize];
                        let mut protected = lock.lock().unwrap_or_else(PoisonError::into_inner);
                        *protected = protected.wrapping_add(hash_work(op, cfg.critical_section));
                        drop(protected);
                        op += stride;
                    }
                    tally.finish();
                    (tally, outside_sum)
                },
            )?);
        }

        let start = gate.open();
        schedule.run_clock();

        let mut tally = PhaseTally::new(schedule.phase_count());
        let mut checksum = 0u64;
        for handle in workers {
            let (worker_tally, outside_sum) = join(handle)?;
            tally.merge(&worker_tally);
            checksum = checksum.wrapping_add(outside_sum);
        }
        let elapsed = start.elapsed();
        for lock in locks {
            checksum = checksum.wrapping_add(*lock.lock().unwrap_or_else(PoisonError::into_inner));
        }

        let ops = tally.total();
        Ok(Report {
            workload: "mutex".into(),
            threads: cfg.threads,
            unit: "ops".into(),
            ops,
            elapsed_s: elapsed.as_secs_f64(),
            throughput_per_s: rate(ops, elapsed),
            checksum: Some(checksum),
            phases: schedule.phase_reports(&tally, start),
            stage_items: None,
            latency_ns: None,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(threads: usize, locks: usize, phases: &str) -> MutexConfig {
        MutexConfig {
            threads,
            locks,
            critical_section: 20,
            phases: phases.parse().unwrap(),
        }
    }

    #[test]
    fn completes_exact_op_count() {
        let report = mutex(&config(3, 2, "work=30:1000")).unwrap();
        assert_eq!(report.ops, 1000);
        assert_eq!(report.phases[0].ops, 1000);
        assert_eq!(report.unit, "ops");
    }

    #[test]
    fn checksum_is_deterministic_across_runs_and_thread_counts() {
        let one = mutex(&config(1, 2, "work=30:500")).unwrap();
        let again = mutex(&config(1, 2, "work=30:500")).unwrap();
        let four = mutex(&config(4, 2, "work=30:500")).unwrap();
        assert_eq!(one.checksum, again.checksum);
        assert_eq!(one.checksum, four.checksum);
        // The lock count only routes ops; the commutative sum does not see it.
        let other_locks = mutex(&config(2, 3, "work=30:500")).unwrap();
        assert_eq!(one.checksum, other_locks.checksum);
        let other_work = mutex(&config(1, 2, "work=31:500")).unwrap();
        assert_ne!(one.checksum, other_work.checksum);
    }

    #[test]
    fn counted_phases_are_exact() {
        let report = mutex(&config(2, 1, "work=10:300,work=100:50")).unwrap();
        let ops: Vec<_> = report.phases.iter().map(|p| p.ops).collect();
        assert_eq!(ops, [300, 50]);
        assert_eq!(report.ops, 350);
    }

    #[test]
    fn timed_run_stops() {
        let report = mutex(&config(2, 1, "work=10:20ms,work=100:20ms")).unwrap();
        assert!(report.elapsed_s >= 0.040);
        assert_eq!(report.phases.iter().map(|p| p.ops).sum::<u64>(), report.ops);
    }

    #[test]
    fn rejects_zero_locks() {
        assert!(matches!(
            mutex(&config(1, 0, "fine:1")),
            Err(WorkloadError::ZeroParameter { name: "locks" })
        ));
    }
}
