//! `freqsleep`: every CPU sleeps for 1 ns over and over.
//!
//! The paper's second co-runner: unlike matmul it keeps vCPUs cycling between
//! idle and busy, generating a constant stream of timer wakeups and idle
//! transitions (the very events whose cost BWW is about) while using little CPU.
//! The report's throughput is sleeps per second across all threads.

use std::thread;
use std::time::{Duration, Instant};

use crate::harness::{join, spawn_gated, StartGate};
use crate::report::{rate, PhaseReport, Report};
use crate::{require_positive, WorkloadError};

/// Parameters of a freqsleep run.
#[derive(Debug, Clone)]
pub struct FreqsleepConfig {
    pub threads: usize,
    pub duration: Duration,
}

/// One nanosleep(2) call asking for 1 ns, as in the paper's freqsleep. The
/// return value is ignored: the only possible failure is EINTR, which still
/// counts as a trip through the sleep/wakeup path.
fn sleep_one_nanosecond() {
    let request = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1,
    };
    // SAFETY: `request` is a valid timespec; a null remainder pointer is allowed.
    unsafe {
        libc::nanosleep(&request, std::ptr::null_mut());
    }
}

/// Runs the freqsleep workload and returns its report.
pub fn freqsleep(cfg: &FreqsleepConfig) -> Result<Report, WorkloadError> {
    require_positive("threads", cfg.threads)?;
    let gate = StartGate::new();

    thread::scope(|scope| {
        let mut workers = Vec::with_capacity(cfg.threads);
        for thread_index in 0..cfg.threads {
            let duration = cfg.duration;
            workers.push(spawn_gated(
                scope,
                &gate,
                format!("gw-sleep-{thread_index}"),
                move || {
                    // None (too far in the future to represent) means run until killed.
                    let deadline = Instant::now().checked_add(duration);
                    let mut sleeps = 0u64;
                    // Sleep first, then check: every thread sleeps at least once.
                    loop {
                        sleep_one_nanosecond();
                        sleeps += 1;
                        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                            break;
                        }
                    }
                    sleeps
                },
            )?);
        }

        let start = gate.open();
        let mut sleeps = 0u64;
        for handle in workers {
            sleeps += join(handle)?;
        }
        let elapsed = start.elapsed();

        Ok(Report {
            workload: "freqsleep".into(),
            threads: cfg.threads,
            unit: "sleeps".into(),
            ops: sleeps,
            elapsed_s: elapsed.as_secs_f64(),
            throughput_per_s: rate(sleeps, elapsed),
            checksum: None,
            phases: vec![PhaseReport {
                label: "run".into(),
                work: None,
                ops: sleeps,
                elapsed_s: elapsed.as_secs_f64(),
                throughput_per_s: rate(sleeps, elapsed),
            }],
            stage_items: None,
            latency_ns: None,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_sleeps_until_the_deadline() {
        let report = freqsleep(&FreqsleepConfig {
            threads: 2,
            duration: Duration::from_millis(20),
        })
        .unwrap();
        assert!(report.ops >= 2);
        assert!(report.elapsed_s >= 0.020);
        assert!(report.checksum.is_none());
    }
}
