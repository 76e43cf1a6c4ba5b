use super::*;
use std::os::unix::process::ExitStatusExt;

fn measurement(wall_s: f64, idle: u64) -> Measurement {
    Measurement {
        wall_s,
        cpu_s: 0.9,
        voluntary_switches: 10,
        involuntary_switches: 2,
        software: BTreeMap::from([(SoftwareEvent::CpuMigrations, 3)]),
        hardware: BTreeMap::new(),
        idle_entries: Some(idle),
        steal_s: Some(0.0),
        exit_status: std::process::ExitStatus::from_raw(0),
        metric: None,
        stdout: Vec::new(),
    }
}

/// A run of a fixed-time benchmark: `cpu_s` of CPU time in 2 s, printing `rate`.
fn fixed_time_run(cpu_s: f64, rate: Option<f64>) -> Measurement {
    Measurement {
        wall_s: 2.0,
        cpu_s,
        metric: rate,
        ..measurement(2.0, 100)
    }
}

fn throughput_setup(higher_is_better: bool) -> Setup {
    let metric =
        crate::metric::Metric::parse(crate::metric::EXAMPLE_REGEX, !higher_is_better).unwrap();
    Setup {
        metric: Some(metric.setup()),
        ..setup()
    }
}

fn setup() -> Setup {
    Setup {
        command: "demo --threads 4".to_string(),
        allowed_cpus: vec![0, 1, 2, 3],
        repeat: 3,
        idle_source: IdleEntrySource::TimerListAndWakeInterrupts,
        counters: CounterPlan::default(),
        metric: None,
        detected_metric: None,
    }
}

fn sample_report() -> ScaleReport {
    build(
        setup(),
        vec![
            (
                vec![0],
                vec![
                    measurement(1.0, 10),
                    measurement(1.2, 12),
                    measurement(0.9, 11),
                ],
            ),
            (vec![0, 1], vec![measurement(0.55, 20); 3]),
            (vec![0, 1, 2, 3], vec![measurement(0.4, 40); 3]),
        ],
    )
}

#[test]
fn median_handles_odd_even_and_empty() {
    assert_eq!(median([3.0, 1.0, 2.0].into_iter()), Some(2.0));
    assert_eq!(median([4.0, 1.0, 2.0, 3.0].into_iter()), Some(2.5));
    assert_eq!(median(std::iter::empty()), None);
}

#[test]
fn rows_use_median_wall_time_for_speedup() {
    let report = sample_report();
    assert_eq!(report.rows[0].wall_s, 1.0);
    assert!((report.rows[1].speedup - 1.0 / 0.55).abs() < 1e-12);
    assert!((report.rows[2].efficiency - 2.5 / 4.0).abs() < 1e-12);
    assert_eq!(report.rows[2].idle_entries_per_s, Some(100.0));
    assert_eq!(report.rows[2].migrations, Some(3.0));
    // No software context-switch counter in these runs: shown as absent, not zero.
    assert_eq!(report.rows[2].context_switches, None);
    assert_eq!(
        report
            .fits
            .predictions
            .iter()
            .map(|p| p.cpus)
            .collect::<Vec<_>>(),
        vec![8, 16, 32]
    );
}

#[test]
fn table_has_one_aligned_row_per_cpu_count() {
    let table = render_table(&sample_report());
    let lines: Vec<&str> = table.lines().collect();
    let header = lines
        .iter()
        .position(|line| line.trim_start().starts_with("cpus"))
        .unwrap();
    for (offset, cpus) in ["1", "2", "4"].iter().enumerate() {
        let row = lines[header + 1 + offset];
        assert_eq!(row.split_whitespace().next(), Some(*cpus), "{table}");
        assert_eq!(
            row.chars().count(),
            lines[header].chars().count(),
            "misaligned:\n{table}"
        );
    }
    assert!(table.contains("Limiter:"));
    assert!(table.contains("USL model predictions, not measurements"));
}

#[test]
fn json_carries_rows_fits_and_diagnosis() {
    let json = serde_json::to_value(sample_report()).unwrap();
    assert_eq!(json["rows"].as_array().unwrap().len(), 3);
    assert!(json["fits"]["amdahl"]["serial_fraction"].is_number());
    assert!(json["diagnosis"]["primary"]["limiter"].is_string());
    assert_eq!(
        json["setup"]["idle_source"],
        "timer-list-and-wake-interrupts"
    );
}

#[test]
fn throughput_mode_takes_speedup_from_the_metric() {
    // sysbench-like: 2 s at every count, the rate nearly doubles.
    let report = build(
        throughput_setup(true),
        vec![
            (
                vec![0],
                vec![
                    fixed_time_run(2.0, Some(1000.0)),
                    fixed_time_run(2.0, Some(1100.0)),
                    fixed_time_run(2.0, Some(900.0)),
                ],
            ),
            (vec![0, 1], vec![fixed_time_run(4.0, Some(1900.0)); 3]),
        ],
    );
    assert_eq!(report.rows[0].metric, Some(1000.0));
    assert_eq!(report.rows[0].speedup, 1.0);
    assert!((report.rows[1].speedup - 1.9).abs() < 1e-12);
    assert!((report.rows[1].efficiency - 0.95).abs() < 1e-12);
    // Twice the work in the same time: per-run counts compare per unit of work.
    assert!((report.rows[1].relative_work - 1.9).abs() < 1e-12);
    // The fits use the metric speedup: almost no serial fraction (wall time would say s = 1).
    assert!(
        report.fits.amdahl.unwrap().serial_fraction < 0.1,
        "{:?}",
        report.fits.amdahl
    );
    assert_eq!(
        report.diagnosis.primary.limiter,
        crate::classify::Limiter::ScalesWell
    );
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    let table = render_table(&report);
    assert!(table.contains("speedup from the metric"), "{table}");
    let header = table
        .lines()
        .find(|line| line.trim_start().starts_with("cpus"))
        .unwrap();
    assert!(header.contains("metric"), "{table}");
    assert!(table.contains("±10%"), "spread of the metric: {table}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["setup"]["metric"]["higher_is_better"], true);
    assert_eq!(json["rows"][1]["metric"], 1900.0);
}

#[test]
fn lower_is_better_inverts_the_ratio() {
    let report = build(
        throughput_setup(false),
        vec![
            (vec![0], vec![fixed_time_run(2.0, Some(8.0))]),
            (vec![0, 1], vec![fixed_time_run(2.0, Some(5.0))]),
        ],
    );
    assert!((report.rows[1].speedup - 1.6).abs() < 1e-12);
    assert_eq!(report.rows[1].relative_work, 1.0);
}

#[test]
fn constant_wall_time_is_flagged_in_wall_time_mode() {
    let fixed_time = || {
        vec![
            (vec![0], vec![fixed_time_run(2.0, None)]),
            (
                vec![0, 1],
                vec![Measurement {
                    wall_s: 2.04,
                    ..fixed_time_run(4.0, None)
                }],
            ),
        ]
    };
    let report = build(
        Setup {
            detected_metric: Some("sysbench"),
            ..setup()
        },
        fixed_time(),
    );
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    let warning = &report.warnings[0];
    assert!(
        warning.contains("seems to run for a fixed time"),
        "{warning}"
    );
    assert!(warning.contains("CPU time grew 2.0x"), "{warning}");
    assert!(warning.contains("--metric sysbench"), "{warning}");
    assert!(render_table(&report).contains(&format!("WARNING: {warning}")));
    assert_eq!(
        serde_json::to_value(&report).unwrap()["warnings"][0],
        warning.as_str()
    );

    // CPU time flat too (a serial program): both readings are offered, with a regex example.
    let serial = build(
        setup(),
        vec![
            (vec![0], vec![fixed_time_run(2.0, None)]),
            (vec![0, 1], vec![fixed_time_run(2.0, None)]),
        ],
    );
    assert!(
        serial.warnings[0].contains("uses one CPU only"),
        "{:?}",
        serial.warnings
    );
    assert!(
        serial.warnings[0].contains(crate::metric::EXAMPLE_REGEX),
        "{:?}",
        serial.warnings
    );

    // A real change in wall time, or throughput mode: no warning.
    assert!(sample_report().warnings.is_empty());
    assert!(!render_table(&sample_report()).contains("WARNING"));
    let mut throughput = fixed_time();
    for (_, runs) in &mut throughput {
        runs[0].metric = Some(10.0);
    }
    assert!(build(throughput_setup(true), throughput)
        .warnings
        .is_empty());
}

#[test]
fn plot_is_a_png_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scale.png");
    write_plot(&sample_report(), &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let err = write_plot(&sample_report(), &dir.path().join("missing-dir/scale.png")).unwrap_err();
    assert!(err.to_string().contains("missing-dir"), "{err}");
}
