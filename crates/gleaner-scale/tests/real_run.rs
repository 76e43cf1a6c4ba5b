//! End-to-end: measures a tiny deterministic shell loop at 1 and 2 CPUs on this
//! machine and checks the report has both rows with finite speedups.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

use gleaner_scale::report::render_table;
use gleaner_scale::system::{allowed_cpus, SystemRoots};
use gleaner_scale::{measure, ScaleArgs};

#[test]
fn shell_loop_at_one_and_two_cpus() {
    let cpus = if allowed_cpus().unwrap().len() >= 2 {
        vec![1, 2]
    } else {
        vec![1]
    };
    let args = ScaleArgs {
        cpus: cpus.clone(),
        repeat: 2,
        command: [
            "sh",
            "-c",
            "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done",
        ]
        .map(String::from)
        .to_vec(),
        ..Default::default()
    };
    let report = measure(&args, &SystemRoots::default()).unwrap();

    assert_eq!(
        report.rows.iter().map(|row| row.cpus).collect::<Vec<_>>(),
        cpus
    );
    for row in &report.rows {
        assert!(row.speedup.is_finite() && row.speedup > 0.0, "{row:?}");
        assert!(row.wall_s > 0.0 && row.wall_s < 2.0, "{row:?}");
        assert_eq!(row.runs.len(), 2);
        // The loop is CPU-bound: most of its wall time is CPU time.
        assert!(row.runs.iter().all(|run| run.cpu_s > 0.0));
    }
    assert_eq!(report.rows[0].speedup, 1.0);

    let table = render_table(&report);
    let header = table
        .lines()
        .position(|line| line.trim_start().starts_with("cpus"))
        .unwrap();
    for (offset, cpus) in cpus.iter().enumerate() {
        let row = table.lines().nth(header + 1 + offset).unwrap();
        assert_eq!(
            row.split_whitespace().next(),
            Some(cpus.to_string().as_str()),
            "{table}"
        );
    }
    assert!(table.contains("Limiter:"), "{table}");
}
