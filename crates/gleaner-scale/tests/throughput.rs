//! End-to-end throughput mode: a fake fixed-time benchmark that prints a rate
//! and sleeps the same time at every CPU count. Timed by wall clock it looks
//! like no scaling at all, so the report must say so; read through `--metric`,
//! its speedup is the ratio of the printed rates.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

use gleaner_scale::report::render_table;
use gleaner_scale::system::{allowed_cpus, SystemRoots};
use gleaner_scale::{measure, ScaleArgs};

const FAKE_BENCHMARK: &str = r#"echo "events per second: 123.4"; sleep 0.1"#;
/// The same, sleeping long enough that a few ms of scheduling delay on a busy
/// machine stay well inside the 5% tolerance.
const LONGER_FAKE_BENCHMARK: &str = r#"echo "events per second: 123.4"; sleep 0.5"#;

fn args(metric: Option<&str>) -> ScaleArgs {
    let cpus = if allowed_cpus().unwrap().len() >= 2 {
        vec![1, 2]
    } else {
        vec![1]
    };
    eprintln!("measuring at CPU counts {cpus:?}");
    ScaleArgs {
        cpus,
        repeat: 1,
        metric: metric.map(String::from),
        command: ["sh", "-c", FAKE_BENCHMARK].map(String::from).to_vec(),
        ..Default::default()
    }
}

#[test]
fn metric_read_from_the_output_gives_the_speedup() {
    let report = measure(
        &args(Some(r"events per second:\s*([0-9.]+)")),
        &SystemRoots::default(),
    )
    .unwrap();
    for row in &report.rows {
        assert_eq!(row.metric, Some(123.4), "{row:?}");
        assert_eq!(row.runs[0].metric, Some(123.4));
        // The same rate at every count: speedup exactly 1, whatever the wall clock did.
        assert_eq!(row.speedup, 1.0, "{row:?}");
    }
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    let table = render_table(&report);
    assert!(
        table.contains("speedup from the metric: first capture group of"),
        "{table}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(
        json["setup"]["metric"]["spec"],
        r"events per second:\s*([0-9.]+)"
    );
}

#[test]
fn wall_time_mode_warns_about_a_fixed_time_program() {
    let args = ScaleArgs {
        command: ["sh", "-c", LONGER_FAKE_BENCHMARK]
            .map(String::from)
            .to_vec(),
        ..args(None)
    };
    let mut report = measure(&args, &SystemRoots::default()).unwrap();
    if report.rows.len() < 2 {
        eprintln!("one CPU allowed: only checking that no warning is made from a single count");
        assert!(report.warnings.is_empty());
        return;
    }
    // The sleep dominates: wall time is within 5% (25 ms) at 1 and 2 CPUs
    // unless the machine stalls a run; two retries absorb such stalls.
    for _ in 0..2 {
        if report.warnings.is_empty() {
            report = measure(&args, &SystemRoots::default()).unwrap();
        }
    }
    assert_eq!(
        report.warnings.len(),
        1,
        "{:?}",
        report.rows.iter().map(|r| r.wall_s).collect::<Vec<_>>()
    );
    assert!(
        report.warnings[0].contains("--metric"),
        "{}",
        report.warnings[0]
    );
    assert!(render_table(&report).contains("WARNING: wall time stayed within 5%"));
}
