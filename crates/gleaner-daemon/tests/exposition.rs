//! The metrics exposition checked by Prometheus's own linter, `promtool check metrics`
//! (Debian package `prometheus`; or set PROMTOOL=/path/to/promtool). Without promtool the
//! test records a visible skip (target/tmp/skipped-tests.log, which test.sh prints).

use std::io::Write;
use std::process::{Command, Stdio};

use gleaner_daemon::metrics::{render, ProcessMetrics, Snapshot, TargetMetrics};
use gleaner_daemon::status::StateKind;
use gleaner_linux::status::{InstanceStatus, VcpuStatus};

fn skipped(test: &str, why: &str) {
    eprintln!("{test}: skipped: {why}");
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.log");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(f, "{test}: {why}");
    }
}

fn promtool() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("PROMTOOL") {
        return Some(p.into());
    }
    std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("promtool")).find(|p| p.is_file()))
}

/// Every family the daemon can export: a managed target with vCPUs, a failing one, the
/// process series.
fn full_snapshot() -> Snapshot {
    let status = InstanceStatus {
        pid: 42,
        mode: "full".into(),
        placement: "cgroup-v1".into(),
        retention_backend: "yield".into(),
        idle_source: "tracepoint".into(),
        retention_timeout_source: "measured: 3 of 3 runs agreed".into(),
        allowed: "0-1".into(),
        active: "0".into(),
        periods: 10,
        vcpus: vec![
            VcpuStatus { cpu: 0, active: true, retaining: true, idle_transitions_total: 10, halts_total: 2, ..Default::default() },
            VcpuStatus { cpu: 1, ..Default::default() },
        ],
        ..Default::default()
    };
    Snapshot {
        targets: vec![
            TargetMetrics { name: "db".into(), cgroup: "/sys/fs/cgroup/cpuset/db".into(), running: true, restarts: 1, status: Some(status), state: StateKind::Managed },
            TargetMetrics { name: "batch".into(), cgroup: String::new(), running: false, restarts: 0, status: None, state: StateKind::Failing },
        ],
        last_reload_successful: true,
        last_reload_success_timestamp_seconds: 1_700_000_000.0,
        process: ProcessMetrics::of_self(1_700_000_000.0),
    }
}

#[test]
fn promtool_check_metrics_passes() {
    let Some(tool) = promtool() else {
        skipped("promtool_check_metrics_passes", "promtool not found: apt-get install prometheus, or set PROMTOOL");
        return;
    };
    let text = render(&full_snapshot());
    let mut child = Command::new(&tool).args(["check", "metrics"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics: {:?}\n{said}\n--- exposition ---\n{text}", out.status);
}
