//! `barrier`: streamcluster-like bulk-synchronous phases on a `std::sync::Barrier`.
//!
//! Barrier-heavy programs (streamcluster, bodytrack) suffer from BWW because the
//! whole team waits for the last thread to arrive and then for every sleeper to
//! be woken. Each episode, every thread does `work` hash iterations and then
//! waits at the barrier. The checksum is the sum of every thread's results, so
//! it is reproducible for fixed arguments (it changes with the thread count,
//! because each thread contributes its own share of work per episode).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;

use crate::harness::{join, spawn_gated, PhaseTally, Schedule, StartGate};
use crate::hash::{hash_work, mix};
use crate::phase::PhaseSpec;
use crate::report::{rate, Report};
use crate::{require_positive, WorkloadError};

/// Parameters of a barrier run.
#[derive(Debug, Clone)]
pub struct BarrierConfig {
    pub threads: usize,
    /// Episode counts (or durations) per phase; `work` is hash iterations per
    /// thread per episode.
    pub phases: PhaseSpec,
}

/// Encodes "no further episodes" in a decision slot.
const STOP: usize = usize::MAX;

/// Runs the barrier workload and returns its report.
pub fn barrier(cfg: &BarrierConfig) -> Result<Report, WorkloadError> {
    require_positive("threads", cfg.threads)?;

    let schedule = Schedule::new(&cfg.phases);
    let barrier = Barrier::new(cfg.threads);
    // All threads must agree on what each episode does and when to stop, or some
    // would wait at the barrier forever. The barrier leader of episode e decides
    // episode e + 2 and writes it to slot e % 2: every thread has already read
    // that slot for episode e (before arriving), and nobody reads it again until
    // after barrier e + 1, which the leader reaches only after writing.
    let decide = |episode: u64| schedule.phase_for(episode).unwrap_or(STOP);
    let slots = [AtomicUsize::new(decide(0)), AtomicUsize::new(decide(1))];
    let gate = StartGate::new();

    thread::scope(|scope| {
        let (schedule, barrier, slots, decide) = (&schedule, &barrier, &slots, &decide);
        let mut workers = Vec::with_capacity(cfg.threads);
        for thread_index in 0..cfg.threads {
            workers.push(spawn_gated(
                scope,
                &gate,
                format!("gw-barrier-{thread_index}"),
                move || {
                    let mut tally = PhaseTally::new(schedule.phase_count());
                    let mut sum = 0u64;
                    let mut episode = 0u64;
                    loop {
                        let slot = &slots[(episode % 2) as usize];
                        let phase = slot.load(Ordering::Acquire);
                        if phase == STOP {
                            break;
                        }
                        tally.count(phase);
                        let seed = mix(episode) ^ thread_index as u64;
                        sum = sum.wrapping_add(hash_work(seed, schedule.work(phase)));
                        if barrier.wait().is_leader() {
                            slot.store(decide(episode + 2), Ordering::Release);
                        }
                        episode += 1;
                    }
                    tally.finish();
                    (tally, sum)
                },
            )?);
        }

        let start = gate.open();
        schedule.run_clock();

        let mut checksum = 0u64;
        // Every thread passes every episode, so one thread's tally already
        // counts the episodes; the others only contribute later phase ends.
        let mut tally: Option<PhaseTally> = None;
        for handle in workers {
            let (worker_tally, sum) = join(handle)?;
            checksum = checksum.wrapping_add(sum);
            match tally.as_mut() {
                None => tally = Some(worker_tally),
                Some(episodes) => episodes.merge_ends(&worker_tally),
            }
        }
        let elapsed = start.elapsed();
        let tally = tally.unwrap_or_else(|| PhaseTally::new(schedule.phase_count()));

        let ops = tally.total();
        Ok(Report {
            workload: "barrier".into(),
            threads: cfg.threads,
            unit: "episodes".into(),
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

    fn config(threads: usize, phases: &str) -> BarrierConfig {
        BarrierConfig {
            threads,
            phases: phases.parse().unwrap(),
        }
    }

    #[test]
    fn runs_exact_episode_count() {
        let report = barrier(&config(3, "work=50:200")).unwrap();
        assert_eq!(report.ops, 200);
        assert_eq!(report.unit, "episodes");
        assert_eq!(report.threads, 3);
    }

    #[test]
    fn checksum_matches_recomputation_and_repeats() {
        let a = barrier(&config(2, "work=40:100,work=80:20")).unwrap();
        let b = barrier(&config(2, "work=40:100,work=80:20")).unwrap();
        assert_eq!(a.checksum, b.checksum);
        let expected = (0..120u64)
            .flat_map(|episode| (0..2u64).map(move |t| (episode, t)))
            .fold(0u64, |acc, (episode, t)| {
                let work = if episode < 100 { 40 } else { 80 };
                acc.wrapping_add(hash_work(mix(episode) ^ t, work))
            });
        assert_eq!(a.checksum, Some(expected));
        let ops: Vec<_> = a.phases.iter().map(|p| p.ops).collect();
        assert_eq!(ops, [100, 20]);
    }

    #[test]
    fn single_thread_and_single_episode_work() {
        let report = barrier(&config(1, "work=1:1")).unwrap();
        assert_eq!(report.ops, 1);
    }

    #[test]
    fn timed_run_stops_without_deadlock() {
        let report = barrier(&config(3, "work=10:20ms,work=1000:20ms")).unwrap();
        assert!(report.elapsed_s >= 0.040);
        assert_eq!(report.phases.iter().map(|p| p.ops).sum::<u64>(), report.ops);
    }
}
