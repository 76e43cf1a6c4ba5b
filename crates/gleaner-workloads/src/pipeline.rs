//! `pipeline`: a dedup-like chain of thread pools joined by bounded queues.
//!
//! PARSEC dedup is the paper's worst BWW victim: its stages hand items through
//! mutex+condvar queues, so threads block and wake constantly, and fine-grained
//! items make the wakeup cost dominate. This workload reproduces that shape:
//! a source thread feeds `stages` pools of `threads_per_stage` workers, each
//! worker applies `work` hash iterations per item, and a sink restores the
//! original order (as dedup's reorder stage does) and folds every item into an
//! order-dependent checksum. The checksum depends only on the item count and
//! the per-phase work, never on thread counts or timing.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;

use crate::harness::{join, spawn_gated, PhaseTally, Schedule, StartGate};
use crate::hash::{fold_ordered, hash_work, mix};
use crate::phase::PhaseSpec;
use crate::report::{rate, Report};
use crate::{require_positive, WorkloadError};

/// Parameters of a pipeline run.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Number of processing stages (each a pool of threads).
    pub stages: usize,
    pub threads_per_stage: usize,
    /// Capacity of each bounded queue between stages.
    pub queue_capacity: usize,
    /// Item counts (or durations) per phase; `work` is hash iterations per item per stage.
    pub phases: PhaseSpec,
}

/// A unit flowing through the pipeline.
#[derive(Debug, Clone, Copy)]
struct Item {
    seq: u64,
    phase: usize,
    work: u64,
    value: u64,
}

/// A bounded FIFO built from a mutex and two condition variables, like the
/// queues in dedup. It closes when every producer has called `producer_done`.
#[derive(Debug)]
struct BoundedQueue<T> {
    state: Mutex<QueueState<T>>,
    not_empty: Condvar,
    not_full: Condvar,
    capacity: usize,
}

#[derive(Debug)]
struct QueueState<T> {
    items: VecDeque<T>,
    producers_left: usize,
}

impl<T> BoundedQueue<T> {
    fn new(capacity: usize, producers: usize) -> Self {
        Self {
            state: Mutex::new(QueueState {
                items: VecDeque::with_capacity(capacity),
                producers_left: producers,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends `item`, blocking while the queue is full.
    fn push(&self, item: T) {
        let mut state = self.lock();
        while state.items.len() >= self.capacity {
            state = self
                .not_full
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.items.push_back(item);
        drop(state);
        self.not_empty.notify_one();
    }

    /// Takes the oldest item, blocking while empty; `None` once closed and drained.
    fn pop(&self) -> Option<T> {
        let mut state = self.lock();
        loop {
            if let Some(item) = state.items.pop_front() {
                drop(state);
                self.not_full.notify_one();
                return Some(item);
            }
            if state.producers_left == 0 {
                return None;
            }
            state = self
                .not_empty
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Called once by each producer when it will push no more.
    fn producer_done(&self) {
        let mut state = self.lock();
        state.producers_left = state.producers_left.saturating_sub(1);
        if state.producers_left == 0 {
            drop(state);
            // Every blocked consumer must see the close, not just one.
            self.not_empty.notify_all();
        }
    }
}

/// Distinguishes stages so the same item hashes differently in each.
fn stage_salt(stage: usize) -> u64 {
    mix(stage as u64 + 1)
}

/// What the sink learned: the ordered checksum and whether delivery was exact.
struct SinkResult {
    checksum: u64,
    delivered_in_order: u64,
    stranded: usize,
    tally: PhaseTally,
}

/// Runs the pipeline and returns its report. Fails if a thread cannot be
/// started or if items were lost, duplicated or reordered beyond repair.
pub fn pipeline(cfg: &PipelineConfig) -> Result<Report, WorkloadError> {
    require_positive("stages", cfg.stages)?;
    require_positive("threads_per_stage", cfg.threads_per_stage)?;
    require_positive("queue_capacity", cfg.queue_capacity)?;

    let schedule = Schedule::new(&cfg.phases);
    // queues[s] feeds stage s; queues[stages] feeds the sink.
    let queues: Vec<BoundedQueue<Item>> = (0..=cfg.stages)
        .map(|s| {
            BoundedQueue::new(
                cfg.queue_capacity,
                if s == 0 { 1 } else { cfg.threads_per_stage },
            )
        })
        .collect();
    let gate = StartGate::new();

    thread::scope(|scope| {
        let (schedule, queues) = (&schedule, &queues);

        let source = spawn_gated(scope, &gate, "gw-pipe-src".into(), move || {
            let mut seq = 0u64;
            while let Some(phase) = schedule.phase_for(seq) {
                queues[0].push(Item {
                    seq,
                    phase,
                    work: schedule.work(phase),
                    value: mix(seq),
                });
                seq += 1;
            }
            queues[0].producer_done();
            seq
        })?;

        let mut stage_workers = Vec::with_capacity(cfg.stages);
        for stage in 0..cfg.stages {
            let mut workers = Vec::with_capacity(cfg.threads_per_stage);
            for worker in 0..cfg.threads_per_stage {
                let name = format!("gw-pipe-{stage}.{worker}");
                workers.push(spawn_gated(scope, &gate, name, move || {
                    let salt = stage_salt(stage);
                    let mut processed = 0u64;
                    while let Some(mut item) = queues[stage].pop() {
                        item.value = hash_work(item.value ^ salt, item.work);
                        queues[stage + 1].push(item);
                        processed += 1;
                    }
                    queues[stage + 1].producer_done();
                    processed
                })?);
            }
            stage_workers.push(workers);
        }

        let sink = spawn_gated(scope, &gate, "gw-pipe-sink".into(), move || {
            let mut tally = PhaseTally::new(schedule.phase_count());
            let mut pending = BinaryHeap::new();
            let (mut next_seq, mut checksum) = (0u64, 0u64);
            while let Some(item) = queues[cfg.stages].pop() {
                tally.count(item.phase);
                pending.push(Reverse((item.seq, item.value)));
                // Release every item that is now next in sequence.
                while let Some(&Reverse((seq, value))) = pending.peek() {
                    if seq != next_seq {
                        break;
                    }
                    pending.pop();
                    checksum = fold_ordered(checksum, value);
                    next_seq += 1;
                }
            }
            tally.finish();
            // A lost item leaves its successors stranded; a duplicate stays
            // behind because its sequence number was already released.
            SinkResult {
                checksum,
                delivered_in_order: next_seq,
                stranded: pending.len(),
                tally,
            }
        })?;

        let start = gate.open();
        schedule.run_clock();

        let injected = join(source)?;
        let mut stage_items = Vec::with_capacity(cfg.stages);
        for workers in stage_workers {
            let mut processed = 0u64;
            for handle in workers {
                processed += join(handle)?;
            }
            stage_items.push(processed);
        }
        let sink = join(sink)?;
        let elapsed = start.elapsed();

        let exact = sink.delivered_in_order == injected
            && sink.stranded == 0
            && stage_items.iter().all(|&n| n == injected);
        if !exact {
            return Err(WorkloadError::PipelineMismatch {
                injected,
                delivered: sink.delivered_in_order,
                stranded: sink.stranded,
                stage_items,
            });
        }

        Ok(Report {
            workload: "pipeline".into(),
            threads: cfg.stages * cfg.threads_per_stage + 2,
            unit: "items".into(),
            ops: injected,
            elapsed_s: elapsed.as_secs_f64(),
            throughput_per_s: rate(injected, elapsed),
            checksum: Some(sink.checksum),
            phases: schedule.phase_reports(&sink.tally, start),
            stage_items: Some(stage_items),
            latency_ns: None,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phase::Length;
    use std::time::Duration;

    fn config(stages: usize, threads_per_stage: usize, phases: &str) -> PipelineConfig {
        PipelineConfig {
            stages,
            threads_per_stage,
            queue_capacity: 4,
            phases: phases.parse().unwrap(),
        }
    }

    #[test]
    fn delivers_exactly_every_item_through_every_stage() {
        let report = pipeline(&config(3, 2, "work=20:500")).unwrap();
        assert_eq!(report.ops, 500);
        assert_eq!(report.stage_items, Some(vec![500, 500, 500]));
        assert_eq!(report.threads, 8);
        assert_eq!(report.phases.len(), 1);
        assert_eq!(report.phases[0].ops, 500);
    }

    #[test]
    fn checksum_is_deterministic_across_runs_and_thread_counts() {
        let a = pipeline(&config(2, 1, "work=50:300")).unwrap();
        let b = pipeline(&config(2, 1, "work=50:300")).unwrap();
        let c = pipeline(&config(2, 4, "work=50:300")).unwrap();
        assert_eq!(a.checksum, b.checksum);
        assert_eq!(a.checksum, c.checksum);
        // Matches a single-threaded recomputation of the same item chain.
        let expected = (0..300u64).fold(0, |acc, seq| {
            let value = (0..2).fold(mix(seq), |v, stage| hash_work(v ^ stage_salt(stage), 50));
            fold_ordered(acc, value)
        });
        assert_eq!(a.checksum, Some(expected));
    }

    #[test]
    fn checksum_depends_on_work_and_stage_count() {
        let base = pipeline(&config(2, 1, "work=50:100")).unwrap();
        let more_work = pipeline(&config(2, 1, "work=51:100")).unwrap();
        let more_stages = pipeline(&config(3, 1, "work=50:100")).unwrap();
        assert_ne!(base.checksum, more_work.checksum);
        assert_ne!(base.checksum, more_stages.checksum);
    }

    #[test]
    fn counted_phases_report_exact_per_phase_counts() {
        let report = pipeline(&config(2, 2, "fine:120,coarse:30")).unwrap();
        assert_eq!(report.ops, 150);
        let counts: Vec<_> = report
            .phases
            .iter()
            .map(|p| (p.label.as_str(), p.work, p.ops))
            .collect();
        assert_eq!(
            counts,
            [("fine", Some(500), 120), ("coarse", Some(5000), 30)]
        );
    }

    #[test]
    fn timed_phases_stop_and_account_every_item() {
        let phases = PhaseSpec::new(vec![
            crate::phase::Phase {
                label: "a".into(),
                work: 10,
                length: Length::Duration(Duration::from_millis(30)),
            },
            crate::phase::Phase {
                label: "b".into(),
                work: 100,
                length: Length::Duration(Duration::from_millis(30)),
            },
        ])
        .unwrap();
        let cfg = PipelineConfig {
            stages: 2,
            threads_per_stage: 2,
            queue_capacity: 8,
            phases,
        };
        let report = pipeline(&cfg).unwrap();
        assert!(report.elapsed_s >= 0.060);
        assert_eq!(report.phases.iter().map(|p| p.ops).sum::<u64>(), report.ops);
        assert_eq!(report.stage_items, Some(vec![report.ops, report.ops]));
    }

    #[test]
    fn rejects_zero_sizes() {
        let mut cfg = config(1, 1, "fine:1");
        cfg.queue_capacity = 0;
        assert!(matches!(
            pipeline(&cfg),
            Err(WorkloadError::ZeroParameter {
                name: "queue_capacity"
            })
        ));
    }
}
