//! `pingpong`: two threads passing a token through a raw futex.
//!
//! This isolates the cost the paper is about: one thread blocks in
//! `FUTEX_WAIT`, the other wakes it with `FUTEX_WAKE`, and in a VM the wakeup
//! of an idle vCPU costs an IPI plus a VM exit/entry. Each round trip (ping
//! hands the token over and waits for it to come back) is timed, so the report
//! carries p50/p90/p99 round-trip latency. The futex is used directly (not a
//! std primitive) so no spinning hides the blocking.

use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::Instant;

use crate::harness::{join, spawn_gated, StartGate};
use crate::latency::LatencyHistogram;
use crate::phase::Length;
use crate::report::{rate, PhaseReport, Report};
use crate::WorkloadError;

/// Parameters of a pingpong run.
#[derive(Debug, Clone)]
pub struct PingpongConfig {
    /// Number of round trips, or how long to keep bouncing.
    pub length: Length,
    /// Where the round trips done so far are written every [`COUNT_EVERY`] rounds: the
    /// application progress counter `gleaner run --progress-file` reads.
    pub count_file: Option<std::path::PathBuf>,
}

/// Round trips between two writes of the count file: one `pwrite` per ~10 ms of ping-pong at
/// 100,000 round trips/s, nothing against the exchange itself.
pub const COUNT_EVERY: u64 = 1024;

/// Writes the counter over the file's first bytes at a fixed width, so a reader never sees a
/// shorter number with the tail of a longer one.
fn write_count(file: &std::fs::File, path: &std::path::Path, n: u64) -> Result<(), WorkloadError> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(format!("{n:>20}\n").as_bytes(), 0)
        .map_err(|source| WorkloadError::CountFile {
            path: path.to_path_buf(),
            source,
        })
}

/// Token values stored in the futex word.
const PING_TURN: u32 = 0;
const PONG_TURN: u32 = 1;
const STOP: u32 = 2;

/// Blocks while `word == expected`. Spurious returns (value already changed,
/// signal) are not errors: callers re-check the word in a loop.
fn futex_wait(word: &AtomicU32, expected: u32) -> Result<(), WorkloadError> {
    gleaner_sys::futex::wait(word, expected, None).map_err(|source| WorkloadError::Futex {
        operation: "FUTEX_WAIT",
        source,
    })
}

/// Wakes one waiter on `word` (if any).
fn futex_wake(word: &AtomicU32) -> Result<(), WorkloadError> {
    gleaner_sys::futex::wake(word, 1)
        .map(drop)
        .map_err(|source| WorkloadError::Futex {
            operation: "FUTEX_WAKE",
            source,
        })
}

/// Sets the word to STOP and wakes the partner when a side leaves, on every
/// exit path, so an error on one side cannot leave the other blocked forever.
struct StopOnDrop<'a>(&'a AtomicU32);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(STOP, Ordering::Release);
        // Nothing useful can be done with a failed wake while unwinding out.
        let _ = futex_wake(self.0);
    }
}

/// The measuring side: hands the token over and times until it returns.
fn ping(
    word: &AtomicU32,
    length: Length,
    count: Option<(&std::fs::File, &std::path::Path)>,
) -> Result<LatencyHistogram, WorkloadError> {
    let _stop = StopOnDrop(word);
    let deadline = match length {
        // A duration too large to represent as an Instant means "no deadline".
        Length::Duration(duration) => Instant::now().checked_add(duration),
        Length::Count(_) => None,
    };
    let rounds = match length {
        Length::Count(n) => n,
        Length::Duration(_) => u64::MAX,
    };
    let mut round_trips = LatencyHistogram::new();
    for done in 0..rounds {
        if let Some((file, path)) = count.filter(|_| done % COUNT_EVERY == 0) {
            write_count(file, path, done)?;
        }
        let sent = Instant::now();
        if deadline.is_some_and(|d| sent >= d) {
            break;
        }
        // Compare-exchange rather than store, so a STOP written by a failing
        // partner is never overwritten.
        if word
            .compare_exchange(PING_TURN, PONG_TURN, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(WorkloadError::PartnerStopped);
        }
        futex_wake(word)?;
        loop {
            match word.load(Ordering::Acquire) {
                PING_TURN => break,
                PONG_TURN => futex_wait(word, PONG_TURN)?,
                _ => return Err(WorkloadError::PartnerStopped),
            }
        }
        round_trips.record(u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    if let Some((file, path)) = count {
        write_count(file, path, round_trips.samples())?;
    }
    Ok(round_trips)
}

/// The echoing side: returns the token each time it arrives; counts hand-backs.
fn pong(word: &AtomicU32) -> Result<u64, WorkloadError> {
    let _stop = StopOnDrop(word);
    let mut returned = 0u64;
    loop {
        match word.load(Ordering::Acquire) {
            PONG_TURN => {
                if word
                    .compare_exchange(PONG_TURN, PING_TURN, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    return Ok(returned); // ping stopped meanwhile
                }
                futex_wake(word)?;
                returned += 1;
            }
            PING_TURN => futex_wait(word, PING_TURN)?,
            _ => return Ok(returned),
        }
    }
}

/// Runs the pingpong workload and returns its report.
pub fn pingpong(cfg: &PingpongConfig) -> Result<Report, WorkloadError> {
    if cfg.length == Length::Count(0) {
        return Err(WorkloadError::ZeroParameter { name: "rounds" });
    }
    let count_file = cfg
        .count_file
        .as_ref()
        .map(|path| {
            std::fs::File::create(path).map_err(|source| WorkloadError::CountFile {
                path: path.clone(),
                source,
            })
        })
        .transpose()?;
    let word = AtomicU32::new(PING_TURN);
    let gate = StartGate::new();

    thread::scope(|scope| {
        let word = &word;
        let length = cfg.length;
        let pong_handle = spawn_gated(scope, &gate, "gw-pong".into(), move || pong(word))?;
        let count = count_file.as_ref().zip(cfg.count_file.as_deref());
        let ping_handle = spawn_gated(scope, &gate, "gw-ping".into(), move || {
            ping(word, length, count)
        })?;
        let start = gate.open();
        let round_trips = join(ping_handle)?;
        let returned = join(pong_handle)?;
        let elapsed = start.elapsed();
        // Pong's own error explains a PartnerStopped from ping, so report it first.
        let returned = returned?;
        let round_trips = round_trips?;
        let rounds = round_trips.samples();
        if returned != rounds {
            return Err(WorkloadError::PingpongMismatch {
                sent: rounds,
                returned,
            });
        }

        Ok(Report {
            workload: "pingpong".into(),
            threads: 2,
            unit: "round_trips".into(),
            ops: rounds,
            elapsed_s: elapsed.as_secs_f64(),
            throughput_per_s: rate(rounds, elapsed),
            checksum: None,
            phases: vec![PhaseReport {
                label: "run".into(),
                work: None,
                ops: rounds,
                elapsed_s: elapsed.as_secs_f64(),
                throughput_per_s: rate(rounds, elapsed),
            }],
            stage_items: None,
            latency_ns: round_trips.summary(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn counted_run_does_exact_round_trips_with_ordered_percentiles() {
        let report = pingpong(&PingpongConfig {
            length: Length::Count(300),
            count_file: None,
        })
        .unwrap();
        assert_eq!(report.ops, 300);
        let latency = report.latency_ns.unwrap();
        assert_eq!(latency.samples, 300);
        assert!(latency.p50 > 0);
        assert!(
            latency.p50 <= latency.p90 && latency.p90 <= latency.p99 && latency.p99 <= latency.max
        );
    }

    #[test]
    fn the_count_file_holds_the_round_trips_done() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("count");
        let report = pingpong(&PingpongConfig {
            length: Length::Count(3 * COUNT_EVERY + 5),
            count_file: Some(path.clone()),
        })
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim().parse::<u64>().unwrap(), report.ops, "{text:?}");
        // An unwritable place: one line naming the file and the fix, before any thread starts.
        let err = pingpong(&PingpongConfig {
            length: Length::Count(10),
            count_file: Some(dir.path().join("no-such-dir").join("count")),
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("no-such-dir") && err.contains("--count-file"),
            "{err}"
        );
    }

    #[test]
    fn timed_run_stops() {
        let report = pingpong(&PingpongConfig {
            length: Length::Duration(Duration::from_millis(30)),
            count_file: None,
        })
        .unwrap();
        assert!(report.elapsed_s >= 0.030);
        assert_eq!(report.latency_ns.map(|l| l.samples), Some(report.ops));
    }

    #[test]
    fn rejects_zero_rounds() {
        assert!(matches!(
            pingpong(&PingpongConfig {
                length: Length::Count(0),
                count_file: None,
            }),
            Err(WorkloadError::ZeroParameter { name: "rounds" })
        ));
    }
}
