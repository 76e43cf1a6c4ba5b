//! `gleaner probe`: measure this VM's wake-up costs (the paper's Table 2) and show the
//! retention timeout Gleaner would derive from them.
//!
//! Thin glue over `gleaner_linux::wakeprobe`: argument parsing, a progress bar, and either an
//! aligned table or JSON for the bench harness.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::Path;

use anyhow::Context;
use gleaner_linux::journal::Journal;
use gleaner_linux::wakeprobe::{
    self, ProbeConfig, ProbeReport, QuickCalibration, Setting, DEFAULT_SAMPLES,
};
use gleaner_policy::retention::{MAX_TIMEOUT_NS, MIN_TIMEOUT_NS};
use indicatif::{ProgressBar, ProgressStyle};

/// Measure wake-up latency on same/busy/halted vCPUs and derive the retention timeout.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Wakes measured per setting and gap.
    #[arg(long, default_value_t = DEFAULT_SAMPLES, value_parser = parse_samples)]
    pub samples: usize,
    /// Gaps between wakes (how long the woken thread stays blocked), e.g. "20us,1ms".
    #[arg(long, default_value = "20us,50us,100us,200us,500us,1ms,2ms,5ms", value_parser = parse_gaps)]
    pub gaps: GapList,
    /// Only the ~0.5 s calibration run the daemon repeats at start-up (settings B or B-poll, and C).
    #[arg(long)]
    pub quick: bool,
    /// What `gleaner run` derives at start-up: repeated quick calibrations, outliers rejected, and whether it would be cached
    #[arg(long, conflicts_with = "quick")]
    pub calibrate: bool,
    /// Also time each wake in the kernel (sched_waking to the wakee's switch-in) with the BPF sampler, the clock of `gleaner run`'s live histogram (needs root and kernel BTF)
    #[arg(long, conflicts_with_all = ["quick", "calibrate"])]
    pub in_kernel: bool,
}

/// Gaps in nanoseconds, parsed from a comma-separated list of durations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GapList(pub Vec<u64>);

/// `--calibrate` and `--quick`: what `gleaner run` measures at start-up.
fn quick_command(
    args: &ProbeArgs,
    busy: Setting,
    hook: Option<wakeprobe::PmQosHook>,
) -> anyhow::Result<()> {
    if args.calibrate {
        let c = crate::calibration::calibrate(|| wakeprobe::quick_calibration(busy, hook.clone()));
        if args.json {
            crate::outln!("{}", serde_json::to_string_pretty(&c)?);
        } else {
            crate::outln!(
                "retention hold {:.1} µs, host polling window {:.0} µs; {}",
                c.timeout_ns as f64 / 1e3,
                c.host_poll_ns as f64 / 1e3,
                c.source
            );
        }
        return Ok(());
    }
    let cal = wakeprobe::quick_calibration(busy, hook)
        .context("quick wake-latency calibration failed")?;
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&cal)?);
    } else {
        crate::outln!("{}", (render_quick(&cal)).trim_end_matches('\n'));
    }
    Ok(())
}

pub fn run(args: ProbeArgs) -> anyhow::Result<()> {
    // Where the guest can poll, the probe holds a vCPU by PM QoS (B-poll, and the busy side
    // of `--calibrate`/`--quick`, as `gleaner run` measures it): that change is journaled and a
    // guard watches, as under `gleaner run`, so that Ctrl-C or a kill leaves nothing changed.
    let polls = wakeprobe::calibration_busy_setting(Path::new("/sys"), true) == Setting::BusyPoll;
    let guarded = if polls {
        Some(crate::daemon::GuardedJournal::start(
            &Journal::default_dir(),
        )?)
    } else {
        None
    };
    let hook = guarded.as_ref().map(|g| g.pm_qos_hook());
    let result = if args.calibrate || args.quick {
        let busy = if polls {
            Setting::BusyPoll
        } else {
            Setting::BusyYield
        };
        quick_command(&args, busy, hook)
    } else {
        full_probe(&args, hook)
    };
    let restored = guarded.map_or(Ok(()), |g| g.finish());
    result.and(restored)
}

/// The full probe: every setting at every gap.
fn full_probe(args: &ProbeArgs, hook: Option<wakeprobe::PmQosHook>) -> anyhow::Result<()> {
    let cfg = ProbeConfig {
        gaps_ns: args.gaps.0.clone(),
        samples: args.samples,
        on_pmqos_original: hook,
        in_kernel: args.in_kernel,
        ..ProbeConfig::default()
    };
    let bar = if args.json || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} measuring wakes {bar:40} {pos}/{len} ({eta} left)",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    };
    let report = wakeprobe::measure(&cfg, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let report = report.context("wake-latency probe failed")?;
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        crate::outln!("{}", (render_report(&report)).trim_end_matches('\n'));
    }
    Ok(())
}

fn parse_samples(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=100_000).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a sample count between 1 and 100000")),
    }
}

/// Parses "20us,1ms,2.5ms" (units ns, us/µs, ms, s) into nanoseconds.
pub fn parse_gaps(s: &str) -> Result<GapList, String> {
    let gaps = s
        .split(',')
        .map(|g| parse_duration_ns(g.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    if gaps.is_empty() {
        return Err("no gaps given (e.g. \"20us,1ms\")".into());
    }
    if let Some(&bad) = gaps
        .iter()
        .find(|&&g| !(wakeprobe::MIN_GAP_NS..=wakeprobe::MAX_GAP_NS).contains(&g))
    {
        return Err(format!("gap {} is outside 1us..=1s", fmt_ns(bad)));
    }
    Ok(GapList(gaps))
}

fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a duration like 20us, 1.5ms or 2s");
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (number, unit) = s.split_at(split);
    let scale = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return Err(bad()),
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    let ns = value * scale;
    if !ns.is_finite() || ns > 1e15 {
        return Err(bad());
    }
    Ok(ns.round() as u64)
}

/// 812ns, 12.3µs, 1.25ms.
fn fmt_ns(ns: u64) -> String {
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}µs", ns as f64 / 1e3)
    } else {
        format!("{:.2}ms", ns as f64 / 1e6)
    }
}

fn render_quick(cal: &QuickCalibration) -> String {
    format!(
        "busy-vCPU wake p50 {} ({}), halted-vCPU wake p50 {}\nretention timeout Gleaner would use: {}\n",
        fmt_ns(cal.busy_p50_ns),
        cal.busy_setting.label(),
        fmt_ns(cal.halted_p50_ns),
        fmt_ns(cal.timeout.ns)
    )
}

fn render_report(r: &ProbeReport) -> String {
    let mut out = String::new();
    let header = [
        "setting",
        "gap",
        "p50",
        "p90",
        "p99",
        "min",
        "n",
        "in-kernel p50",
    ];
    let mut rows: Vec<[String; 8]> = Vec::new();
    for p in &r.points {
        rows.push([
            p.setting.label().to_string(),
            fmt_ns(p.gap_ns),
            fmt_ns(p.latency.p50_ns),
            fmt_ns(p.latency.p90_ns),
            fmt_ns(p.latency.p99_ns),
            fmt_ns(p.latency.min_ns),
            p.latency.count.to_string(),
            p.in_kernel
                .as_ref()
                .map_or_else(|| "-".to_string(), |k| fmt_ns(k.p50_ns)),
        ]);
    }
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &[String]| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = " ".repeat(w - cell.chars().count());
            // Setting names read best left-aligned, numbers right-aligned.
            if i == 0 {
                let _ = write!(l, "{cell}{pad}");
            } else {
                let _ = write!(l, "  {pad}{cell}");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&header.map(String::from));
    let mut previous = None;
    for (p, row) in r.points.iter().zip(&rows) {
        if previous.is_some_and(|s| s != p.setting) {
            line(&[]);
        }
        previous = Some(p.setting);
        line(row);
    }
    out.push('\n');

    let m = &r.machine;
    let flag = match m.hypervisor_flag {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    };
    let cpus = match r.wakee_cpu {
        Some(w) => format!("waker on CPU {}, wakee on CPU {w}", r.waker_cpu),
        None => format!("both on CPU {}", r.waker_cpu),
    };
    let _ = writeln!(
        out,
        "machine:   {} vCPUs, hypervisor flag {flag}, kernel {}; {cpus}",
        m.vcpus,
        m.kernel.as_deref().unwrap_or("unknown")
    );
    let _ = writeln!(
        out,
        "cpuidle:   driver {}, governor {}",
        m.cpuidle_driver.as_deref().unwrap_or("(none)"),
        m.cpuidle_governor.as_deref().unwrap_or("(none)")
    );
    if !m.haltpoll_params.is_empty() {
        let params: Vec<String> = m
            .haltpoll_params
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(out, "haltpoll:  {}", params.join(" "));
    }
    if !r.wakee_load.is_empty() {
        let loads: Vec<String> = r
            .wakee_load
            .iter()
            .map(|l| format!("{} {:.0}%", short(l.setting), 100.0 * l.busy_fraction))
            .collect();
        let _ = writeln!(out, "wakee vCPU busy: {}", loads.join(", "));
        if let Some(c) = r
            .wakee_load
            .iter()
            .find(|l| l.setting == Setting::Halted && l.busy_fraction > 0.10)
        {
            let _ = writeln!(
                out,
                "  warning: other work kept CPU {} {:.0}% busy during C, so it rarely halted and C understates the halted-wake cost; rerun on a quiet machine",
                c.cpu,
                100.0 * c.busy_fraction
            );
        }
    }
    for s in &r.skipped {
        let _ = writeln!(out, "skipped:   {}: {}", s.setting.label(), s.reason);
    }
    if let Some(ns) = r.crossing_ns {
        let _ = writeln!(
            out,
            "crossing:  a system call's entry and return (FUTEX_WAKE, no waiter) p50 {}: in these latencies, not in the live ones (sched_waking to running)",
            fmt_ns(ns)
        );
    }
    if let Some(steal) = &r.steal {
        let _ = writeln!(
            out,
            "D:         cannot be created inside a guest; the host took {:.2}% of this guest's CPU time (steal) during the run",
            100.0 * steal.fraction
        );
    }
    match &r.derived_timeout {
        Some(d) => {
            let raw = d.halted_p50_ns.saturating_sub(d.busy_p50_ns);
            let clamped = if raw == d.timeout.ns {
                String::new()
            } else {
                format!(
                    ", clamped to {}..{}",
                    fmt_ns(MIN_TIMEOUT_NS),
                    fmt_ns(MAX_TIMEOUT_NS)
                )
            };
            let _ = writeln!(
                out,
                "retention timeout Gleaner would derive: {} (C p50 {} - {} p50 {} at gap {}{clamped})",
                fmt_ns(d.timeout.ns),
                fmt_ns(d.halted_p50_ns),
                short(d.busy_setting),
                fmt_ns(d.busy_p50_ns),
                fmt_ns(d.gap_ns)
            );
        }
        None => out.push_str("retention timeout: not derived (needs settings B and C)\n"),
    }
    let _ = writeln!(
        out,
        "{} samples per point, {:.1} s",
        r.samples_per_point,
        r.duration_ms as f64 / 1e3
    );
    out
}

fn short(setting: Setting) -> &'static str {
    match setting {
        Setting::SameVcpu => "A",
        Setting::BusyYield => "B",
        Setting::BusyPoll => "B-poll",
        Setting::Halted => "C",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        probe: ProbeArgs,
    }

    #[test]
    fn parses_gap_lists() {
        assert_eq!(
            parse_gaps("20us, 1ms,2.5ms,1s").unwrap().0,
            vec![20_000, 1_000_000, 2_500_000, 1_000_000_000]
        );
        assert_eq!(parse_gaps("1500ns,3µs").unwrap().0, vec![1_500, 3_000]);
        for bad in [
            "",
            "20",
            "us",
            "20 parsecs",
            "1ms,,2ms",
            "-5us",
            "2s",
            "500ns",
            "1e9s",
            "NaNms",
        ] {
            assert!(parse_gaps(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cli_defaults_and_errors() {
        let cli = Cli::try_parse_from(["probe"]).unwrap();
        assert_eq!(cli.probe.gaps.0, wakeprobe::DEFAULT_GAPS_NS.to_vec());
        assert_eq!(cli.probe.samples, DEFAULT_SAMPLES);
        assert!(!cli.probe.json && !cli.probe.quick);
        let cli =
            Cli::try_parse_from(["probe", "--json", "--samples", "7", "--gaps", "50us"]).unwrap();
        assert_eq!((cli.probe.samples, cli.probe.gaps.0), (7, vec![50_000]));
        assert!(Cli::try_parse_from(["probe", "--samples", "0"]).is_err());
        assert!(Cli::try_parse_from(["probe", "--gaps", "fast"]).is_err());
    }

    #[test]
    fn durations_format_in_readable_units() {
        assert_eq!(fmt_ns(812), "812ns");
        assert_eq!(fmt_ns(12_345), "12.3µs");
        assert_eq!(fmt_ns(1_250_000), "1.25ms");
    }

    #[test]
    fn short_run_renders_a_table_and_json() {
        let cfg = ProbeConfig {
            gaps_ns: vec![50_000, 200_000],
            samples: 10,
            warmup: 1,
            ..ProbeConfig::default()
        };
        let report = wakeprobe::measure(&cfg, |_, _| {}).unwrap();
        let table = render_report(&report);
        assert!(table.starts_with("setting"), "{table}");
        assert!(
            table.contains("A same vCPU") && table.contains("50.0µs") && table.contains("200.0µs"),
            "{table}"
        );
        // Every data row has all eight columns (the in-kernel one shows "-" without it). Rows are found by the settings' own labels,
        // so the B-poll rows of a guest with a cpuidle poll state count too.
        let rows = table.lines().filter(|l| {
            wakeprobe::Setting::ALL
                .iter()
                .any(|s| l.starts_with(s.label()))
        });
        let poll_rows = report
            .points
            .iter()
            .filter(|p| p.setting == wakeprobe::Setting::BusyPoll)
            .count();
        eprintln!(
            "probe test: this machine {} a cpuidle poll state ({poll_rows} B-poll rows)",
            if poll_rows > 0 { "has" } else { "has no" }
        );
        assert_eq!(rows.clone().count(), report.points.len());
        assert!(rows
            .into_iter()
            .all(|l| l.split("  ").filter(|c| !c.trim().is_empty()).count() == 8));
        assert!(
            table.contains("machine:") && table.contains("cpuidle:"),
            "{table}"
        );
        // The command path, at a gap long enough that a wakee preempted by the host for a
        // moment still blocks before its wake (at 20 µs and 3 samples a stolen host left none).
        run(ProbeArgs {
            json: true,
            samples: 5,
            gaps: GapList(vec![200_000]),
            quick: false,
            calibrate: false,
            in_kernel: false,
        })
        .unwrap();
    }
}
