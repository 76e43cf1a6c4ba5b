//! The result of one workload run, printed as a human line or as JSON.
//!
//! Every workload fills the same [`Report`] so the CLI, the Python bench harness
//! and other crates can treat them uniformly: throughput for the whole run, per
//! phase throughput for adaptation experiments, and a checksum that proves the
//! work was done and lets tests assert determinism.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

/// Outcome of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Workload name (`pipeline`, `mutex`, ...).
    pub workload: String,
    /// Number of threads the workload created.
    pub threads: usize,
    /// What one op is (`items`, `ops`, `episodes`, `round_trips`, `reps`, `sleeps`).
    pub unit: String,
    /// Completed units of work.
    pub ops: u64,
    pub elapsed_s: f64,
    /// `ops / elapsed_s`.
    pub throughput_per_s: f64,
    /// Fold of all hash-loop results; equal for equal arguments when the run is
    /// bounded by counts. Absent for workloads that compute nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checksum: Option<u64>,
    /// One entry per phase, in order; a run without `--phases` has one.
    pub phases: Vec<PhaseReport>,
    /// Pipeline only: items each stage processed (all equal to `ops`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage_items: Option<Vec<u64>>,
    /// Pingpong only: round-trip latency distribution.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ns: Option<LatencySummary>,
}

/// Throughput of one phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseReport {
    pub label: String,
    /// Hash iterations per unit of work in this phase, where that applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work: Option<u64>,
    pub ops: u64,
    pub elapsed_s: f64,
    pub throughput_per_s: f64,
}

/// Percentiles of a latency sample (nearest-rank, within 1/64), in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LatencySummary {
    pub samples: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

/// `ops / elapsed`, or 0 when no time elapsed (avoids inf/NaN in JSON).
pub(crate) fn rate(ops: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        ops as f64 / secs
    } else {
        0.0
    }
}

impl Report {
    /// Serialises the report as a single-line JSON object.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

impl fmt::Display for Report {
    /// One human-readable line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: threads={} {}={} elapsed={:.3}s throughput={:.1} {}/s",
            self.workload,
            self.threads,
            self.unit,
            self.ops,
            self.elapsed_s,
            self.throughput_per_s,
            self.unit
        )?;
        if let Some(checksum) = self.checksum {
            write!(f, " checksum={checksum:016x}")?;
        }
        if let Some(latency) = &self.latency_ns {
            write!(
                f,
                " rtt_us p50={:.1} p90={:.1} p99={:.1} max={:.1}",
                latency.p50 as f64 / 1e3,
                latency.p90 as f64 / 1e3,
                latency.p99 as f64 / 1e3,
                latency.max as f64 / 1e3
            )?;
        }
        if self.phases.len() > 1 {
            let phases: Vec<String> = self
                .phases
                .iter()
                .map(|p| {
                    format!(
                        "{} {} in {:.3}s = {:.1}/s",
                        p.label, p.ops, p.elapsed_s, p.throughput_per_s
                    )
                })
                .collect();
            write!(f, " phases=[{}]", phases.join("; "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_is_zero_for_zero_elapsed() {
        assert_eq!(rate(10, Duration::ZERO), 0.0);
        assert_eq!(rate(10, Duration::from_secs(2)), 5.0);
    }
}
