//! The live state of a running instance, as `gleaner status` shows it.
//!
//! Written by the controller every period to a file only its owner (and root) can read,
//! replaced atomically so a reader never sees half a file. A file, rather than a socket, means
//! the status endpoint accepts no commands at all: nobody can change Gleaner's state through it.

use std::path::{Path, PathBuf};

use gleaner_policy::{Characteristics, PolicyEvent, RetentionTimeout, WakeLatencies};
use serde::{Deserialize, Serialize};

use crate::error::{write_private_atomic, Durability, Error, Result};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VcpuStatus {
    pub cpu: usize,
    pub active: bool,
    pub retaining: bool,
    /// Idle periods per second seen on this vCPU last period (held or halted).
    pub idle_transitions_per_sec: f64,
    /// Of those, the ones that ended in a halt (the kernel's idle loop).
    pub halts_per_sec: f64,
    pub work_util: f64,
    pub steal_fraction: f64,
    /// Idle periods begun on this vCPU since the instance started (held or halted), over
    /// every sampled period: a counter, so that a scrape of any interval sees them all.
    #[serde(default)]
    pub idle_transitions_total: u64,
    /// Of those, the ones that ended in the kernel's idle loop (a halt, or a poll).
    #[serde(default)]
    pub halts_total: u64,
    /// Time the workload's threads ran on this vCPU since the instance started.
    #[serde(default)]
    pub work_seconds_total: f64,
    /// Time the hypervisor stole from this vCPU since the instance started.
    #[serde(default)]
    pub steal_seconds_total: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceStatus {
    pub pid: u32,
    pub command: String,
    pub mode: String,
    pub observe: bool,
    pub placement: String,
    pub retention_backend: String,
    pub idle_source: String,
    pub uptime_s: f64,
    /// Unix time the instance started, in seconds (a `*_start_time_seconds` metric).
    #[serde(default)]
    pub start_time_unix_s: f64,
    /// How the retention hold was obtained (configured, measured, cached, default) and why.
    #[serde(default)]
    pub retention_timeout_source: String,
    /// What changes are judged by: the workload's utilization, or the application's own
    /// progress counter and where it is read (`--progress-file`, `--progress-command`).
    #[serde(default)]
    pub judged_by: String,
    /// Periods not judged because the progress counter could not be read.
    #[serde(default)]
    pub unjudged_periods: u64,
    /// The application's progress counted over the judged periods (what its counter grew by
    /// while Gleaner read it; zero until the first), and the last judged period's rate per
    /// second; `None` where changes are judged by utilization.
    #[serde(default)]
    pub progress_total: Option<u64>,
    #[serde(default)]
    pub progress_per_sec: Option<f64>,
    pub periods: u64,
    /// Periods whose end-of-period work (read, decide, apply, record) took longer than a
    /// sub-sample slice.
    #[serde(default)]
    pub slow_periods: u64,
    /// Time some workload thread waited for a CPU while another active vCPU had none of
    /// them, summed over sampled periods.
    #[serde(default)]
    pub runnable_wait_seconds_total: f64,
    /// Control deadlines skipped because the loop woke more than one interval late.
    #[serde(default)]
    pub missed_periods: u64,
    /// Periods that lasted more than twice their plan; their samples were discarded.
    #[serde(default)]
    pub disrupted_periods: u64,
    /// Latest wake-up after its deadline so far, in milliseconds.
    #[serde(default)]
    pub max_late_ms: f64,
    /// Nice value of the controller thread (-10 when it could be raised).
    #[serde(default)]
    pub controller_nice: i32,
    pub allowed: String,
    pub active: String,
    pub rho: f64,
    pub eta: f64,
    /// The hold the policy decided on last (it adapts the measured one to steal).
    pub retention_timeout: RetentionTimeout,
    pub characteristics: Characteristics,
    pub vcpus: Vec<VcpuStatus>,
    /// CPU time Gleaner's retention threads spent holding vCPUs, cumulative.
    pub retention_cpu_s: f64,
    /// Gleaner's own CPU time, cumulative (controller plus retention threads).
    pub self_cpu_s: f64,
    pub consolidations: u64,
    pub rollbacks: u64,
    pub major_changes: u64,
    /// The most recent decisions, oldest first.
    pub last_events: Vec<PolicyEvent>,
    /// Which sampler measures: `bpf` (in-kernel, see `gleaner_linux::bpf`) or `procfs`.
    #[serde(default)]
    pub sampler: String,
    /// What that sampler cannot see, one phrase each (empty: nothing known).
    #[serde(default)]
    pub sampler_blind_spots: Vec<String>,
    /// procfs sampler: its own CPU time, smoothed, as a fraction of one CPU (0 for bpf).
    #[serde(default)]
    pub sampler_cost_fraction: f64,
    /// procfs sampler: how far it thinned its per-thread reads to stay within budget
    /// (0 = reads every thread every period; level L reads switches every 2^L periods).
    #[serde(default)]
    pub sampler_thin_level: u32,
    /// bpf sampler: tracepoint events its programs handled since start, cumulative.
    #[serde(default)]
    pub bpf_events: u64,
    /// Wake-up latency of the workload's threads since start (bpf sampler only; `None` with
    /// procfs), from the waker's `sched_waking` to the wakee's switch-in, split by what the
    /// vCPU the wakee ran on was doing at the waking moment (`running`, `polling`, `halted`).
    ///
    /// Every field is a cumulative counter that only grows while the instance runs, so a
    /// Prometheus histogram can be rendered from it directly: per state, `buckets[i]` counts
    /// the wake-ups with latency in `[2^i, 2^(i+1))` ns (bucket 0 also holds 0 and 1 ns, the
    /// last bucket everything from 2^31 ns up) — per bucket, not yet summed, so `le` bucket
    /// `2^(i+1)` ns is the sum of `buckets[0..=i]`; `count` is the number of wake-ups and
    /// `sum_ns` their total latency in ns (divide by 1e9 for `_sum` in seconds).
    #[serde(default)]
    pub wake_latency: Option<WakeLatencies>,
}

pub fn status_path(state_dir: &Path, pid: u32) -> PathBuf {
    state_dir.join(format!("{pid}.status"))
}

/// Replaces the status file atomically with mode 0600.
pub fn write_status(path: &Path, status: &InstanceStatus) -> Result<()> {
    let text = serde_json::to_vec_pretty(status)
        .map_err(|e| Error::parse(path, "status", &e.to_string()))?;
    write_private_atomic(path, &text, Durability::Volatile)
}

/// Every status file in `state_dir` whose instance is still alive.
pub fn read_statuses(state_dir: &Path) -> Result<Vec<InstanceStatus>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(state_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(state_dir, e)),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name
            .strip_suffix(".status")
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let status: InstanceStatus = serde_json::from_str(&text)
            .map_err(|e| Error::parse(&path, "status file", &e.to_string()))?;
        out.push(status);
    }
    out.sort_by_key(|s| s.pid);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn status_round_trips_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let path = status_path(dir.path(), me);
        let s = InstanceStatus {
            pid: me,
            active: "0".into(),
            ..Default::default()
        };
        write_status(&path, &s).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(read_statuses(dir.path()).unwrap(), vec![s]);
        // A dead instance's file is ignored.
        write_status(
            &status_path(dir.path(), u32::MAX - 1),
            &InstanceStatus::default(),
        )
        .unwrap();
        assert_eq!(read_statuses(dir.path()).unwrap().len(), 1);
    }
}
