//! `gleaner scale`: diagnose why a program stops scaling with more (v)CPUs.
//!
//! The program is run restricted to 1, 2, 4, … CPUs (CPU affinity set between
//! fork and exec), several times each. For every CPU count the tool reports
//! wall time, speedup and efficiency next to the counters that explain them:
//! vCPU idle entries per second (the blocked-waiter-wakeup signature), context
//! switches, migrations, steal time and, where the CPU exposes them, hardware
//! payload/overhead events. Amdahl and USL fits summarise the curve and
//! [`classify`] names the most likely limiter with its evidence.
//!
//! Speedup comes from wall time by default, which only works for programs that
//! do a fixed amount of work. For benchmarks that run for a fixed time and
//! print their rate, `--metric` reads that figure from their output instead
//! ([`metric`]); in wall-time mode the report warns when wall time hardly
//! changes across CPU counts, the sign of such a benchmark.
//!
//! Modules: [`fit`] (pure models), [`classify`] (pure diagnosis), [`metric`]
//! (reading the figure of merit from output), [`run`] (spawning and perf
//! counters), [`system`] (idle and steal counters), [`report`] (summary,
//! table, JSON, PNG plot).

pub mod classify;
pub mod error;
pub mod fit;
pub mod metric;
pub mod report;
pub mod run;
pub mod system;

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};

pub use error::ScaleError;
use metric::{Metric, ReadError};
use report::{ScaleReport, Setup};
use run::{CounterPlan, Measurement, PreparedCommand, Runner};
use system::{allowed_cpus, IdleCounter, SystemRoots};

/// Command-line surface of `gleaner scale`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ScaleArgs {
    /// CPU counts to measure, comma-separated [default: 1,2,4,… up to the CPUs
    /// this process may use]. 1 is always measured too: it is the speedup baseline.
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    pub cpus: Vec<usize>,
    /// Runs per CPU count; the median wall time (or metric) is used.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub repeat: u32,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also draw speedup and the key counters against cores into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Throughput mode: compute speedup from a figure the program prints
    /// instead of its wall time, as metric(N) / metric(1). Needed for programs
    /// that run for a fixed time (e.g. `sysbench --time=10`), whose wall time
    /// cannot change. Either a built-in recognizer: `sysbench` (total number of
    /// events / total time, any sysbench test) or `gleaner-workload` (the
    /// `throughput=` of `gleaner workload`); or a regular expression whose first
    /// capture group is the number, e.g. 'events per second:\s*([0-9.]+)'.
    /// The program's stdout is searched; the last match counts. Higher is
    /// better unless --lower-is-better.
    #[arg(long, value_name = "NAME|REGEX")]
    pub metric: Option<String>,
    /// The --metric is a latency or a time: speedup = metric(1) / metric(N).
    #[arg(long)]
    pub lower_is_better: bool,
    /// Pass the program's stdout through (to stderr, keeping the report clean);
    /// by default it is only searched for --metric. Its stderr is always shown.
    #[arg(long)]
    pub show_output: bool,
    /// The program to measure and its arguments, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Runs the whole diagnosis and prints the report (table or JSON) to stdout.
pub fn run(args: ScaleArgs) -> anyhow::Result<()> {
    let report = measure(&args, &SystemRoots::default())?;
    write_report(&mut std::io::stdout().lock(), &report, &args)
}

/// Prints the report and writes the plot. Write errors on `out` are ignored:
/// a reader that closed the pipe early (`gleaner scale … | head -1`) has
/// taken what it wanted, and must not make us panic (as `println!` would).
pub fn write_report(
    out: &mut impl std::io::Write,
    report: &ScaleReport,
    args: &ScaleArgs,
) -> anyhow::Result<()> {
    if args.json {
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(report)?);
    } else {
        let _ = write!(out, "{}", report::render_table(report));
    }
    if let Some(path) = &args.plot {
        report::write_plot(report, path)?;
        if !args.json {
            let _ = writeln!(out, "plot written to {}", path.display());
        }
    }
    let _ = out.flush();
    Ok(())
}

/// Validates the arguments, runs every CPU count `repeat` times and builds the report.
pub fn measure(args: &ScaleArgs, roots: &SystemRoots) -> Result<ScaleReport, ScaleError> {
    if args.command.is_empty() {
        return Err(ScaleError::MissingCommand);
    }
    if args.repeat == 0 {
        return Err(ScaleError::ZeroRepeat);
    }
    if args.lower_is_better && args.metric.is_none() {
        return Err(ScaleError::LowerWithoutMetric);
    }
    // Parsed before anything runs, so a bad regex costs no measurement.
    let metric = args
        .metric
        .as_deref()
        .map(|spec| Metric::parse(spec, args.lower_is_better))
        .transpose()?;
    let allowed = allowed_cpus()?;
    let counts = cpu_counts(&args.cpus, allowed.len())?;
    let command = PreparedCommand::new(&args.command)?;

    let largest = counts.last().copied().unwrap_or(1);
    // Opened once on every CPU any run uses: one source for the whole report.
    let mut idle = IdleCounter::open(roots, &allowed[..largest]);
    let runner = Runner::new(roots.clone(), CounterPlan::probe(), args.show_output);

    let progress = ProgressBar::new(counts.len() as u64 * u64::from(args.repeat));
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} runs  {msg}") {
        progress.set_style(style);
    }
    // Repeats are interleaved across CPU counts so slow drift on the host
    // (thermal, neighbours) spreads over all counts instead of biasing one.
    let mut runs: Vec<Vec<Measurement>> = vec![Vec::new(); counts.len()];
    let mut detected_metric = None;
    for repeat in 1..=args.repeat {
        for (index, &count) in counts.iter().enumerate() {
            progress.set_message(format!("{count} CPU(s), run {repeat}"));
            let measurement = runner.measure(&command, &allowed[..count], &mut idle);
            let measurement = match measurement {
                Ok(mut measurement) => {
                    let stdout = String::from_utf8_lossy(&std::mem::take(&mut measurement.stdout))
                        .into_owned();
                    if repeat == 1 && index == 0 {
                        detected_metric = metric::detect_preset(&stdout);
                    }
                    if let Some(metric) = &metric {
                        if measurement.exit_status.success() {
                            match read_metric(metric, &stdout, count, repeat) {
                                Ok(value) => measurement.metric = Some(value),
                                Err(err) => {
                                    progress.finish_and_clear();
                                    return Err(err);
                                }
                            }
                        }
                    }
                    measurement
                }
                Err(err) => {
                    progress.finish_and_clear();
                    return Err(err);
                }
            };
            if !measurement.exit_status.success() {
                progress.finish_and_clear();
                return Err(ScaleError::CommandFailed {
                    cpus: count,
                    run: repeat,
                    status: measurement.exit_status.to_string(),
                });
            }
            runs[index].push(measurement);
            progress.inc(1);
        }
    }
    progress.finish_and_clear();

    let setup = Setup {
        command: command.display.clone(),
        allowed_cpus: allowed.clone(),
        repeat: args.repeat,
        idle_source: idle.source(),
        counters: runner.plan.clone(),
        metric: metric.as_ref().map(Metric::setup),
        detected_metric,
    };
    let per_count = counts
        .iter()
        .zip(runs)
        .map(|(&count, runs)| (allowed[..count].to_vec(), runs))
        .collect();
    Ok(report::build(setup, per_count))
}

/// Reads the metric from one run's stdout, naming the run and the fix when it cannot.
fn read_metric(metric: &Metric, stdout: &str, cpus: usize, run: u32) -> Result<f64, ScaleError> {
    let spec = metric.spec().to_string();
    metric.read(stdout).map_err(|err| match err {
        ReadError::NoMatch => {
            let hint = metric::detect_preset(stdout)
                .filter(|preset| *preset != spec)
                .map(|preset| format!("; its output looks like {preset}'s: try --metric {preset}"))
                .unwrap_or_default();
            ScaleError::MetricNoMatch {
                metric: spec,
                cpus,
                run,
                hint,
            }
        }
        ReadError::NotANumber(text) => ScaleError::MetricNotANumber {
            metric: spec,
            text,
            cpus,
            run,
        },
        ReadError::NotPositive(value) => ScaleError::MetricNotPositive {
            metric: spec,
            value,
            cpus,
            run,
        },
    })
}

/// The CPU counts to measure: the user's list (validated, sorted, with 1 added
/// as the baseline) or 1, 2, 4, … up to `available`, ending at `available`.
pub fn cpu_counts(requested: &[usize], available: usize) -> Result<Vec<usize>, ScaleError> {
    let mut counts = if requested.is_empty() {
        let mut powers: Vec<usize> = std::iter::successors(Some(1usize), |n| n.checked_mul(2))
            .take_while(|&n| n <= available)
            .collect();
        if powers.last() != Some(&available) && available > 0 {
            powers.push(available);
        }
        powers
    } else {
        for &count in requested {
            if count == 0 {
                return Err(ScaleError::ZeroCpus { available });
            }
            if count > available {
                return Err(ScaleError::TooManyCpus {
                    requested: count,
                    available,
                });
            }
        }
        let mut counts = requested.to_vec();
        counts.push(1);
        counts
    };
    counts.sort_unstable();
    counts.dedup();
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_counts_are_powers_of_two_ending_at_the_limit() {
        assert_eq!(cpu_counts(&[], 1).unwrap(), vec![1]);
        assert_eq!(cpu_counts(&[], 2).unwrap(), vec![1, 2]);
        assert_eq!(cpu_counts(&[], 6).unwrap(), vec![1, 2, 4, 6]);
        assert_eq!(cpu_counts(&[], 16).unwrap(), vec![1, 2, 4, 8, 16]);
    }

    #[test]
    fn requested_counts_are_sorted_deduplicated_and_include_the_baseline() {
        assert_eq!(cpu_counts(&[4, 2, 4], 8).unwrap(), vec![1, 2, 4]);
    }

    #[test]
    fn bad_counts_are_one_line_errors() {
        let zero = cpu_counts(&[0], 2).unwrap_err();
        assert!(zero.to_string().starts_with("--cpus 0"), "{zero}");
        let too_many = cpu_counts(&[1, 99], 2).unwrap_err();
        assert_eq!(
            too_many.to_string(),
            "--cpus 99 exceeds the 2 CPUs this process may use: use counts up to 2"
        );
        for err in [zero, too_many] {
            assert!(!err.to_string().contains('\n'));
        }
    }

    #[test]
    fn missing_command_and_zero_repeat_are_rejected_before_running() {
        let roots = SystemRoots::default();
        let err = measure(
            &ScaleArgs {
                repeat: 3,
                ..Default::default()
            },
            &roots,
        )
        .unwrap_err();
        assert!(matches!(err, ScaleError::MissingCommand));
        assert!(err.to_string().contains("after `--`"));
        let args = ScaleArgs {
            repeat: 0,
            command: vec!["true".into()],
            ..Default::default()
        };
        assert!(matches!(
            measure(&args, &roots).unwrap_err(),
            ScaleError::ZeroRepeat
        ));
        let args = ScaleArgs {
            repeat: 1,
            cpus: vec![99],
            command: vec!["true".into()],
            ..Default::default()
        };
        assert!(matches!(
            measure(&args, &roots).unwrap_err(),
            ScaleError::TooManyCpus { requested: 99, .. }
        ));
    }

    #[test]
    fn failing_command_is_named_with_its_cpu_count() {
        let args = ScaleArgs {
            repeat: 1,
            cpus: vec![1],
            command: vec!["false".into()],
            ..Default::default()
        };
        let err = measure(&args, &SystemRoots::default()).unwrap_err();
        assert!(
            matches!(
                err,
                ScaleError::CommandFailed {
                    cpus: 1,
                    run: 1,
                    ..
                }
            ),
            "{err}"
        );
    }

    /// A short run of `sh -c SCRIPT` at 1 CPU (and 2 where allowed).
    fn shell_args(script: &str, metric: Option<&str>) -> ScaleArgs {
        let cpus = if allowed_cpus().unwrap().len() >= 2 {
            vec![1, 2]
        } else {
            vec![1]
        };
        ScaleArgs {
            repeat: 1,
            cpus,
            metric: metric.map(String::from),
            command: vec!["sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }
    }

    #[test]
    fn metric_errors_are_one_line_and_come_before_or_at_the_first_run() {
        let roots = SystemRoots::default();
        // A bad regex fails before anything runs (the command would fail if it ran).
        let err = measure(&shell_args("exit 1", Some("([0-9")), &roots).unwrap_err();
        assert!(matches!(err, ScaleError::MetricRegex { .. }), "{err}");
        let err = measure(
            &ScaleArgs {
                lower_is_better: true,
                ..shell_args("exit 1", None)
            },
            &roots,
        )
        .unwrap_err();
        assert!(matches!(err, ScaleError::LowerWithoutMetric), "{err}");

        let mut messages = vec![err.to_string()];
        let err = measure(
            &shell_args("echo rate unknown", Some(r"rate: ([0-9.]+)")),
            &roots,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                ScaleError::MetricNoMatch {
                    cpus: 1,
                    run: 1,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("--show-output"), "{err}");
        messages.push(err.to_string());
        let err = measure(
            &shell_args("echo rate: 1.2.3", Some(r"rate: ([0-9.]+)")),
            &roots,
        )
        .unwrap_err();
        assert!(matches!(err, ScaleError::MetricNotANumber { .. }), "{err}");
        messages.push(err.to_string());
        // The error points to the preset that would read the output.
        let sysbench = "printf 'total time: 2.0s\\ntotal number of events: 10\\n'";
        let err = measure(
            &shell_args(sysbench, Some(r"events per second:\s*([0-9.]+)")),
            &roots,
        )
        .unwrap_err();
        assert!(err.to_string().ends_with("try --metric sysbench"), "{err}");
        messages.push(err.to_string());
        for message in messages {
            assert!(!message.contains('\n'), "{message}");
        }
    }

    #[test]
    fn a_closed_stdout_is_not_a_panic() {
        struct ClosedPipe;
        impl std::io::Write for ClosedPipe {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
        }
        let args = shell_args("true", None);
        let report = measure(&args, &SystemRoots::default()).unwrap();
        write_report(&mut ClosedPipe, &report, &args).unwrap();
        write_report(&mut ClosedPipe, &report, &ScaleArgs { json: true, ..args }).unwrap();
    }

    #[test]
    fn clap_parses_the_documented_command_line() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ScaleArgs,
        }
        let cli = Cli::try_parse_from([
            "scale", "--cpus", "1,2", "--repeat", "2", "--json", "--", "sh", "-c", "true",
        ])
        .unwrap();
        assert_eq!(cli.args.cpus, vec![1, 2]);
        assert_eq!(cli.args.repeat, 2);
        assert!(cli.args.json);
        assert_eq!(cli.args.command, vec!["sh", "-c", "true"]);
        assert_eq!(cli.args.metric, None);
        let cli = Cli::try_parse_from([
            "scale",
            "--metric",
            r"p50=([0-9.]+)",
            "--lower-is-better",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(cli.args.metric.as_deref(), Some(r"p50=([0-9.]+)"));
        assert!(cli.args.lower_is_better);
        assert!(Cli::try_parse_from(["scale", "--cpus", "x", "--", "true"]).is_err());
    }
}
