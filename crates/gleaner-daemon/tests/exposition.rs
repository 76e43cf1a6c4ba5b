//! The metrics exposition checked by Prometheus's own linter, `promtool check metrics`
//! (Debian package `prometheus`; or set PROMTOOL=/path/to/promtool). Without promtool the
//! test records a visible skip (target/tmp/skipped-tests.log, which test.sh prints).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

use std::io::Write;
use std::process::{Command, Stdio};

use gleaner_daemon::metrics::{render, ProcessMetrics, Snapshot, TargetMetrics};
use gleaner_daemon::status::StateKind;
use gleaner_linux::status::{InstanceStatus, VcpuStatus};

fn skipped(test: &str, why: &str) {
    eprintln!("{test}: skipped: {why}");
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.log");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = writeln!(f, "{test}: {why}");
    }
}

fn promtool() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("PROMTOOL") {
        return Some(p.into());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("promtool"))
            .find(|p| p.is_file())
    })
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
            VcpuStatus {
                cpu: 0,
                active: true,
                retaining: true,
                idle_transitions_total: 10,
                halts_total: 2,
                ..Default::default()
            },
            VcpuStatus {
                cpu: 1,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    Snapshot {
        targets: vec![
            TargetMetrics {
                name: "db".into(),
                cgroup: "/sys/fs/cgroup/cpuset/db".into(),
                running: true,
                restarts: 1,
                status: Some(status),
                state: StateKind::Managed,
            },
            TargetMetrics {
                name: "batch".into(),
                cgroup: String::new(),
                running: false,
                restarts: 0,
                status: None,
                state: StateKind::Failing,
            },
        ],
        last_reload_successful: true,
        last_reload_success_timestamp_seconds: 1_700_000_000.0,
        process: ProcessMetrics::of_self(1_700_000_000.0),
    }
}

/// The wake-latency histogram family, as it will carry the instances' cumulative histograms.
fn histogram_text() -> String {
    let mut h = gleaner_policy::LatencyHistogram::default();
    for ns in [800, 1_500, 3_000, 40_000, 40_000, 90_000_000] {
        h.record(ns);
    }
    let mut out = String::new();
    let series = vec![
        (vec![("target", "db"), ("state", "halted")], &h),
        (vec![("target", "db"), ("state", "running")], &h),
    ];
    gleaner_daemon::metrics::histogram_family(
        &mut out,
        "gleaner_wake_latency_seconds",
        "Wake-up latency by the wakee vCPU's state.",
        &series,
    );
    out
}

#[test]
fn histograms_are_cumulative_in_seconds_with_inf_sum_and_count() {
    let text = histogram_text();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.contains(&"# TYPE gleaner_wake_latency_seconds histogram"),
        "{text}"
    );
    // 800 ns < 1.024 µs; 1.5 µs and 3 µs < 4.096 µs; 40 µs < 65.5 µs; 90 ms only in +Inf.
    for want in [
        "gleaner_wake_latency_seconds_bucket{target=\"db\",state=\"halted\",le=\"0.000001024\"} 1",
        "gleaner_wake_latency_seconds_bucket{target=\"db\",state=\"halted\",le=\"0.000004096\"} 3",
        "gleaner_wake_latency_seconds_bucket{target=\"db\",state=\"halted\",le=\"0.000065536\"} 5",
        "gleaner_wake_latency_seconds_bucket{target=\"db\",state=\"halted\",le=\"0.016777216\"} 5",
        "gleaner_wake_latency_seconds_bucket{target=\"db\",state=\"halted\",le=\"+Inf\"} 6",
        "gleaner_wake_latency_seconds_count{target=\"db\",state=\"halted\"} 6",
        "gleaner_wake_latency_seconds_sum{target=\"db\",state=\"halted\"} 0.0900853",
    ] {
        assert!(lines.contains(&want), "missing {want}:\n{text}");
    }
}

#[test]
fn promtool_check_metrics_passes() {
    let Some(tool) = promtool() else {
        skipped(
            "promtool_check_metrics_passes",
            "promtool not found: apt-get install prometheus, or set PROMTOOL",
        );
        return;
    };
    let text = render(&full_snapshot()) + &histogram_text();
    let mut child = Command::new(&tool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {:?}\n{said}\n--- exposition ---\n{text}",
        out.status
    );
}
