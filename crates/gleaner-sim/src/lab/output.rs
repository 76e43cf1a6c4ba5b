//! The lab's results: the summary printed on the terminal, and the JSON, Markdown table and
//! regret CDF plot written under `results/`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::FontStyle;

use super::{LabReport, ScenarioResult};

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot write {path}: {error} (check that the directory exists and is writable)")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot draw {path}: {detail}")]
    Plot { path: PathBuf, detail: String },
    #[error("cannot encode the lab report as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

fn pct(x: f64) -> String {
    format!("{:+.1} %", 100.0 * x)
}

/// The summary: per set, the regret quantiles, losses against `none`, phase gains, and the
/// signal correlations.
pub fn summary(report: &LabReport) -> String {
    let mut out = String::new();
    let m = &report.machine;
    let _ = writeln!(
        out,
        "commit {}; kernel {}; cpuidle {}; load at start {}; {} CPUs; {} simulated ms per scenario; {:.0} s wall; {} events",
        m.commit.as_deref().unwrap_or("unknown"),
        m.kernel.as_deref().unwrap_or("unknown"),
        m.cpuidle_driver.as_deref().unwrap_or("unknown"),
        m.loadavg_at_start.map_or("unknown".into(), |l| format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2])),
        m.cpus,
        report.duration_ms,
        report.wall_s,
        report.events
    );
    let _ = writeln!(
        out,
        "\n| set | scenarios | median regret | p90 regret | worst regret (scenario) | bench > 3 % below none | system below none | corr. util~throughput | corr. signal~throughput |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for s in &report.summaries {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} % | {:.1} % | {:.1} % ({}) | {} | {} | {:.2} | {:.2} |",
            s.set.name(),
            s.scenarios,
            100.0 * s.median_regret,
            100.0 * s.p90_regret,
            100.0 * s.worst_regret,
            s.worst_regret_scenario,
            s.bench_loss_over_3pct,
            s.system_below_none,
            s.correlation_util_vs_throughput,
            s.correlation_fallback_signal_vs_throughput
        );
    }
    for s in &report.summaries {
        let _ = writeln!(
            out,
            "\n{}: Gleaner told the application's progress (gleaner+progress): median regret {:.1} %, p90 {:.1} %; \
             Gleaner against the best static setting whatever it costs the benchmark VM: median {:.1} %, p90 {:.1} %",
            s.set.name(),
            100.0 * s.median_regret_with_progress,
            100.0 * s.p90_regret_with_progress,
            100.0 * s.median_regret_any,
            100.0 * s.p90_regret_any
        );
    }
    for s in &report.summaries {
        for (what, v) in [
            ("gleaner (holding with a yielding thread, as on a guest without a POLL state)", &s.vs_haltpoll),
            ("gleaner@poll (the same guest with a POLL state: holding by polling, as the daemon does there)", &s.vs_haltpoll_polling),
        ] {
            let _ = writeln!(
                out,
                "\n{}: against the guest's haltpoll (not a static setting: it needs a cpuidle POLL state), {what}: \
                 haltpoll's system > 3 % above Gleaner's in {} of {} scenarios (furthest: {} {}), Gleaner's > 3 % above haltpoll's in {}",
                s.set.name(),
                v.haltpoll_ahead_over_3pct,
                s.scenarios,
                v.furthest_behind.0,
                pct(v.furthest_behind.1),
                v.gleaner_ahead_over_3pct
            );
        }
    }
    for s in &report.summaries {
        if s.phased_gain_over_best_static.is_empty() {
            continue;
        }
        let gains: Vec<String> = s
            .phased_gain_over_best_static
            .iter()
            .map(|(n, g)| {
                let ceiling = s
                    .phased_headroom
                    .iter()
                    .find(|(m, _)| m == n)
                    .map_or(String::new(), |(_, h)| format!(" (ceiling {})", pct(*h)));
                format!("{n} {}{ceiling}", pct(*g))
            })
            .collect();
        // Issue 16's target: 5 % above the best single static setting. It can only be met
        // where switching static settings could gain that much (or where Gleaner does
        // something no static setting does), so both counts are given.
        let target = 0.05;
        let ceiling_of = |n: &str| {
            s.phased_headroom
                .iter()
                .find(|(m, _)| m == n)
                .map(|(_, h)| *h)
        };
        let above = s
            .phased_gain_over_best_static
            .iter()
            .filter(|(_, g)| *g >= target)
            .count();
        let with_room: Vec<&(String, f64)> = s
            .phased_gain_over_best_static
            .iter()
            .filter(|(n, _)| ceiling_of(n).is_some_and(|h| h >= target))
            .collect();
        let above_with_room = with_room.iter().filter(|(_, g)| *g >= target).count();
        let _ = writeln!(
            out,
            "\nphase-changing ({}): Gleaner >= 5 % above the best static setting in {above} of {}; of the {} whose ceiling is >= 5 %, in {above_with_room}. Gleaner vs best static (ceiling: what switching static settings at each phase change could gain at most): {}",
            s.set.name(),
            s.phased_gain_over_best_static.len(),
            with_room.len(),
            gains.join("; ")
        );
    }
    out
}

fn scenario_rows(results: &[ScenarioResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| set | scenario | best static | best static sys | none sys | haltpoll sys | retention sys | gleaner sys | gleaner+progress sys | gleaner@poll sys | regret | gleaner bench vs none | gleaner vCPUs (last) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in results {
        let sys = |label: &str| {
            r.configs
                .iter()
                .find(|c| c.config == label)
                .map_or("-".into(), |c| format!("{:.3}", c.system_speedup))
        };
        let last_active = r
            .configs
            .iter()
            .find(|c| c.config == "gleaner")
            .and_then(|c| c.active_vcpus.last().copied())
            .map_or("-".into(), |n| n.to_string());
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.3} | {} | {} | {} | {} | {} | {} | {:.1} % | {} | {} |",
            r.scenario.set.name(),
            r.scenario.name,
            r.best_static,
            r.best_static_system,
            sys("none"),
            sys("haltpoll"),
            sys("retention"),
            sys("gleaner"),
            sys("gleaner+progress"),
            sys("gleaner@poll"),
            100.0 * r.regret,
            pct(r.bench_vs_none),
            last_active
        );
    }
    out
}

fn write(path: &Path, text: &str) -> Result<(), OutputError> {
    std::fs::write(path, text).map_err(|error| OutputError::Write {
        path: path.to_path_buf(),
        error,
    })
}

/// Write `NAME.json`, `NAME.md` and `NAME-regret-cdf.png` into `dir`; returns the paths.
pub fn write_files(
    report: &LabReport,
    dir: &Path,
    name: &str,
) -> Result<Vec<PathBuf>, OutputError> {
    let json = dir.join(format!("{name}.json"));
    write(&json, &(serde_json::to_string_pretty(report)? + "\n"))?;
    let md = dir.join(format!("{name}.md"));
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# Policy lab: Gleaner against the best static setting\n"
    );
    let _ = writeln!(
        text,
        "Command: `{}` (deterministic: same commit, same numbers). \
         Speedups are each VM's throughput (compute completed per second) over its solo run as configured \
         (all vCPUs, guest `none`); `sys` sums them over the host's VMs. Regret = 1 − gleaner / best static (system), the best static setting being the best of those that keep the benchmark VM within 3 % of `none`.\n",
        report.command
    );
    if report
        .machine
        .loadavg_at_start
        .is_some_and(|l| l[0] > report.machine.cpus as f64 * 0.5)
    {
        let _ = writeln!(text, "**Load warning**: the machine was busy when this ran; the numbers are simulated and do not depend on it, the wall time does.\n");
    }
    text.push_str(&summary(report));
    let _ = writeln!(text, "\n## Every scenario\n");
    text.push_str(&scenario_rows(&report.scenarios));
    write(&md, &text)?;
    let png = dir.join(format!("{name}-regret-cdf.png"));
    plot_cdf(report, &png)?;
    Ok(vec![json, md, png])
}

fn plot_cdf(report: &LabReport, path: &Path) -> Result<(), OutputError> {
    let err = |detail: String| OutputError::Plot {
        path: path.to_path_buf(),
        detail,
    };
    // The font is compiled in (DejaVu Sans), so plotting needs no system fonts.
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| err("the built-in font could not be loaded".into()))?;
    let root = BitMapBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let regrets = |set| {
        let mut v: Vec<f64> = report
            .scenarios
            .iter()
            .filter(|r| r.scenario.set == set)
            .map(|r| 100.0 * r.regret)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let sets: Vec<_> = report.summaries.iter().map(|s| s.set).collect();
    let max = sets
        .iter()
        .flat_map(|&s| regrets(s))
        .fold(10.0_f64, f64::max)
        .ceil()
        + 1.0;
    let min = sets
        .iter()
        .flat_map(|&s| regrets(s))
        .fold(0.0_f64, f64::min)
        .floor();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Gleaner's regret against the best static setting",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(min..max, 0.0..1.0)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("regret (%) = 1 - gleaner / best static, system speedup")
        .y_desc("fraction of scenarios")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, set) in sets.iter().enumerate() {
        let v = regrets(*set);
        let n = v.len().max(1) as f64;
        let mut points = vec![(min, 0.0)];
        for (k, x) in v.iter().enumerate() {
            points.push((*x, k as f64 / n));
            points.push((*x, (k + 1) as f64 / n));
        }
        points.push((max, 1.0));
        let color = if i == 0 { BLUE } else { RED };
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(set.name())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))
}
