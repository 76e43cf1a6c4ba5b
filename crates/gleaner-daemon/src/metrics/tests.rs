use super::*;
use gleaner_linux::status::VcpuStatus;
use gleaner_policy::Characteristics;
use serve::MAX_REQUEST;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

fn sample_status() -> InstanceStatus {
    InstanceStatus {
        pid: 42,
        command: "cgroup /sys/fs/cgroup/cpuset/db".into(),
        mode: "full".into(),
        placement: "cgroup-v1".into(),
        retention_backend: "yield".into(),
        idle_source: "tracepoint".into(),
        uptime_s: 12.5,
        start_time_unix_s: 1_700_000_100.5,
        retention_timeout_source:
            "measured: 3 of 3 runs agreed within 30 % (runs: 250, 240, 260 µs)".into(),
        slow_periods: 5,
        runnable_wait_seconds_total: 0.75,
        periods: 120,
        missed_periods: 1,
        disrupted_periods: 2,
        max_late_ms: 150.0,
        controller_nice: -10,
        allowed: "0-3".into(),
        active: "0-1".into(),
        rho: 0.9,
        eta: 1.0,
        retention_timeout: gleaner_policy::RetentionTimeout { ns: 250_000 },
        characteristics: Characteristics {
            l_comp_ns: 40_000.0,
            g_comp_ns: 80_000.0,
            l_idle_ns: 25_000.0,
            max_vcpu_util: 0.7,
            total_util: 1.25,
            idle_periods_per_sec: 9000.0,
            steal_fraction: 0.02,
            runnable_wait_fraction: 0.0,
            l_wake_path_ns: 0.0,
        },
        vcpus: vec![
            VcpuStatus {
                cpu: 0,
                active: true,
                retaining: true,
                idle_transitions_per_sec: 9500.0,
                halts_per_sec: 100.0,
                work_util: 0.7,
                steal_fraction: 0.03,
                idle_transitions_total: 114_000,
                halts_total: 1_200,
                work_seconds_total: 8.5,
                steal_seconds_total: 0.25,
            },
            VcpuStatus {
                cpu: 2,
                ..Default::default()
            },
        ],
        retention_cpu_s: 1.5,
        self_cpu_s: 2.25,
        consolidations: 3,
        rollbacks: 1,
        major_changes: 2,
        last_events: vec![],
        observe: false,
        ..Default::default()
    }
}

#[test]
fn renders_every_figure_in_base_units() {
    let snap = Snapshot {
        targets: vec![
            TargetMetrics {
                name: "db".into(),
                cgroup: "/sys/fs/cgroup/cpuset/db".into(),
                running: true,
                restarts: 0,
                status: Some(sample_status()),
                state: StateKind::Managed,
            },
            TargetMetrics {
                name: "web \"x\"".into(),
                cgroup: String::new(),
                running: false,
                restarts: 4,
                status: None,
                state: StateKind::Failing,
            },
        ],
        last_reload_successful: true,
        last_reload_success_timestamp_seconds: 1_700_000_000.0,
        process: ProcessMetrics {
            cpu_seconds: 3.5,
            resident_memory_bytes: Some(6e6),
            virtual_memory_bytes: None,
            open_fds: Some(9.0),
            max_fds: Some(1024.0),
            start_time_seconds: 1_700_000_000.0,
        },
    };
    let text = render(&snap);
    let expected_lines = [
            "gleaner_config_last_reload_successful 1",
            "gleaner_config_last_reload_success_timestamp_seconds 1700000000",
            "gleaner_target_up{target=\"db\"} 1",
            "gleaner_target_up{target=\"web \\\"x\\\"\"} 0",
            "gleaner_target_restarts_total{target=\"web \\\"x\\\"\"} 4",
            "gleaner_info{target=\"db\",cgroup=\"/sys/fs/cgroup/cpuset/db\",mode=\"full\",observe=\"false\",placement=\"cgroup-v1\",retention_backend=\"yield\",retention_timeout_source=\"measured\",idle_source=\"tracepoint\"} 1",
            "gleaner_target_state{target=\"db\",state=\"managed\"} 1",
            "gleaner_target_state{target=\"db\",state=\"failing\"} 0",
            "gleaner_target_state{target=\"web \\\"x\\\"\",state=\"failing\"} 1",
            "gleaner_slow_periods_total{target=\"db\"} 5",
            "gleaner_runnable_wait_seconds_total{target=\"db\"} 0.75",
            "gleaner_instance_start_time_seconds{target=\"db\"} 1700000100.5",
            "gleaner_vcpu_idle_transitions_total{target=\"db\",cpu=\"0\"} 114000",
            "gleaner_vcpu_halts_total{target=\"db\",cpu=\"0\"} 1200",
            "gleaner_vcpu_work_seconds_total{target=\"db\",cpu=\"0\"} 8.5",
            "gleaner_vcpu_steal_seconds_total{target=\"db\",cpu=\"0\"} 0.25",
            "process_cpu_seconds_total 3.5",
            "process_resident_memory_bytes 6000000",
            "process_max_fds 1024",
            "process_start_time_seconds 1700000000",
            "gleaner_allowed_vcpus{target=\"db\"} 4",
            "gleaner_active_vcpus{target=\"db\"} 2",
            "gleaner_consolidations_total{target=\"db\"} 3",
            "gleaner_rollbacks_total{target=\"db\"} 1",
            "gleaner_major_changes_total{target=\"db\"} 2",
            "gleaner_periods_total{target=\"db\"} 120",
            "gleaner_missed_periods_total{target=\"db\"} 1",
            "gleaner_disrupted_periods_total{target=\"db\"} 2",
            "gleaner_rho{target=\"db\"} 0.9",
            "gleaner_eta{target=\"db\"} 1",
            "gleaner_retention_timeout_seconds{target=\"db\"} 0.00025",
            "gleaner_l_comp_seconds{target=\"db\"} 0.00004",
            "gleaner_g_comp_seconds{target=\"db\"} 0.00008",
            "gleaner_l_idle_seconds{target=\"db\"} 0.000025",
            "gleaner_workload_cpus{target=\"db\"} 1.25",
            "gleaner_steal_ratio{target=\"db\"} 0.02",
            "gleaner_retention_cpu_seconds_total{target=\"db\"} 1.5",
            "gleaner_cpu_seconds_total{target=\"db\"} 2.25",
            "gleaner_vcpu_active{target=\"db\",cpu=\"0\"} 1",
            "gleaner_vcpu_active{target=\"db\",cpu=\"2\"} 0",
            "gleaner_vcpu_retaining{target=\"db\",cpu=\"0\"} 1",
            "gleaner_vcpu_idle_transitions_per_second{target=\"db\",cpu=\"0\"} 9500",
            "gleaner_vcpu_halts_per_second{target=\"db\",cpu=\"0\"} 100",
            "gleaner_vcpu_steal_ratio{target=\"db\",cpu=\"0\"} 0.03",
        ];
    let lines: Vec<&str> = text.lines().collect();
    for want in expected_lines {
        assert!(lines.contains(&want), "missing {want:?} in:\n{text}");
    }
    // A target without a status contributes no figures, only its up/restarts/state lines.
    assert!(!text.contains("gleaner_rho{target=\"web"), "{text}");
    assert!(
        !text.contains("process_virtual_memory_bytes"),
        "an unknown value is left out, not made up: {text}"
    );
    assert!(
        !text.contains("gleaner_uptime_seconds"),
        "start times, not uptimes: {text}"
    );
    let build = format!("gleaner_build_info{{version=\"{VERSION}\",commit=\"{COMMIT}\"}} 1");
    assert!(lines.contains(&build.as_str()), "{text}");
}

#[test]
fn every_family_has_help_and_type_before_its_samples_and_names_follow_conventions() {
    let snap = Snapshot {
        targets: vec![TargetMetrics {
            name: "db".into(),
            cgroup: "/x".into(),
            running: true,
            restarts: 0,
            status: Some(sample_status()),
            state: StateKind::Managed,
        }],
        last_reload_successful: false,
        last_reload_success_timestamp_seconds: 0.0,
        process: ProcessMetrics::of_self(1.0),
    };
    let text = render(&snap);
    let mut declared: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            declared.push((it.next().unwrap().into(), it.next().unwrap().into()));
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap();
            let (family, kind) = declared.last().expect("sample before any TYPE");
            assert_eq!(name, family, "sample outside its family: {line}");
            assert_eq!(
                kind == "counter",
                name.ends_with("_total"),
                "counter names end in _total: {line}"
            );
            assert!(
                name.starts_with("gleaner_") || name.starts_with("process_"),
                "{line}"
            );
            let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
            assert!(value.is_finite(), "{line}");
        }
    }
    let names: Vec<&String> = declared.iter().map(|(n, _)| n).collect();
    let mut unique = names.clone();
    unique.dedup();
    assert_eq!(names.len(), unique.len(), "a family declared twice");
    assert!(text.contains("gleaner_config_last_reload_successful 0\n"));
}

#[test]
fn grafana_dashboard_uses_only_metrics_we_export() {
    let dashboard = include_str!("../../../../packaging/grafana-dashboard.json");
    let snap = Snapshot {
        targets: vec![TargetMetrics {
            name: "db".into(),
            cgroup: "/x".into(),
            running: true,
            restarts: 0,
            status: Some(sample_status()),
            state: StateKind::Managed,
        }],
        last_reload_successful: true,
        last_reload_success_timestamp_seconds: 1.0,
        process: ProcessMetrics::default(),
    };
    let exported = render(&snap);
    let mut used = 0;
    for (i, _) in dashboard.match_indices("gleaner_") {
        let name: String = dashboard[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        assert!(
            exported.contains(&format!("# TYPE {name} ")),
            "dashboard queries {name}, which is not exported"
        );
        used += 1;
    }
    assert!(used >= 15, "only {used} metric references found");
    // Every panel queries the data source the variable picks; nothing else is declared.
    let d: serde_json::Value = serde_json::from_str(dashboard).unwrap();
    assert!(
        d.get("__inputs").is_none() && !dashboard.contains("DS_PROMETHEUS"),
        "an input no panel uses"
    );
    for p in d["panels"].as_array().unwrap() {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
    }
    // Rates come from counters, so that they hold over any scrape interval.
    assert!(
        !dashboard.contains("_per_second"),
        "a per-period gauge where a counter's rate() belongs"
    );
}

#[test]
fn endpoint_serves_metrics_only() {
    let server = MetricsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(|| "gleaner_x 1\n".to_string()),
    )
    .unwrap();
    let get = |req: &str| {
        let mut s = TcpStream::connect(server.addr()).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        resp
    };
    let ok = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(ok.contains("version=0.0.4"), "{ok}");
    assert!(ok.ends_with("\r\n\r\ngleaner_x 1\n"), "{ok}");
    assert!(get("GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    assert!(get("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    // Exactly one byte too many and no end of head: the server has read all of it when
    // it answers, so closing cannot reset the connection under the client.
    let prefix = "GET /metrics HTTP/1.1\r\nX: ";
    let huge = format!("{prefix}{}", "a".repeat(MAX_REQUEST + 1 - prefix.len()));
    assert!(get(&huge).starts_with("HTTP/1.1 431"));
    drop(server); // must return: the wake-up connection unblocks accept()
}

#[test]
fn textfile_is_replaced_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gleaner.prom");
    write_textfile(&path, "a 1\n").unwrap();
    write_textfile(&path, "a 2\n").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 2\n");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o644,
        "node_exporter must read it"
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    let err = format!(
        "{:#}",
        write_textfile(&dir.path().join("missing/g.prom"), "x").unwrap_err()
    );
    assert!(err.contains("[metrics] textfile"), "{err}");
}

#[test]
fn wake_latency_is_a_histogram_per_target_and_vcpu_state() {
    let mut w = gleaner_policy::WakeLatencies::default();
    for ns in [3_000, 3_500, 40_000] {
        w.halted.record(ns);
    }
    w.running.record(2_000);
    w.halted_waited = 2;
    w.halted_hand_offs = 1;
    let st = InstanceStatus {
        wake_latency: Some(w),
        ..Default::default()
    };
    let snap = Snapshot {
        targets: vec![TargetMetrics {
            name: "db".into(),
            running: true,
            status: Some(st),
            ..Default::default()
        }],
        ..Default::default()
    };
    let text = render(&snap);
    assert!(
        text.contains("# TYPE gleaner_wake_latency_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains(r#"gleaner_wake_latency_seconds_count{target="db",state="halted"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"gleaner_wake_latency_seconds_bucket{target="db",state="halted",le="+Inf"} 3"#
        ),
        "{text}"
    );
    // 2^12 ns = 4.096 µs: the two 3 µs wake-ups are below it, the 40 µs one is not.
    assert!(
        text.contains(
            r#"gleaner_wake_latency_seconds_bucket{target="db",state="halted",le="0.000004096"} 2"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"gleaner_wake_latency_seconds_count{target="db",state="polling"} 0"#),
        "{text}"
    );
    assert!(
        text.contains("# TYPE gleaner_wake_halted_waited_total counter")
            && text.contains(r#"gleaner_wake_halted_waited_total{target="db"} 2"#)
            && text.contains("# TYPE gleaner_wake_halted_hand_offs_total counter")
            && text.contains(r#"gleaner_wake_halted_hand_offs_total{target="db"} 1"#),
        "{text}"
    );
    // `gleaner status` shows the same share.
    let report = crate::status::wake_latency_report(snap.targets[0].status.as_ref().unwrap());
    assert!(
        report.contains(
            "waker's vCPU went idle before the wakee ran: 2 (67 %), hand-offs from a thread on another vCPU: 1"
        ),
        "{report}"
    );
}

#[test]
fn a_target_judged_by_a_counter_exports_its_progress_and_its_unjudged_periods() {
    let counted = InstanceStatus {
        judged_by: "the application's progress (file /run/tx)".into(),
        progress_total: Some(125_000),
        progress_per_sec: Some(9_800.0),
        unjudged_periods: 3,
        ..Default::default()
    };
    let snap = Snapshot {
        targets: vec![
            TargetMetrics {
                name: "db".into(),
                running: true,
                status: Some(counted),
                ..Default::default()
            },
            TargetMetrics {
                name: "web".into(),
                running: true,
                status: Some(sample_status()),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let text = render(&snap);
    for line in [
        "# TYPE gleaner_progress_total counter",
        "gleaner_progress_total{target=\"db\"} 125000",
        "gleaner_unjudged_periods_total{target=\"db\"} 3",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
    // The target judged by utilization has neither: no counter, nothing to count.
    assert!(
        !text.contains("gleaner_progress_total{target=\"web\"}")
            && !text.contains("gleaner_unjudged_periods_total{target=\"web\"}"),
        "{text}"
    );
}
