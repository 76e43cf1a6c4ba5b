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
//! Modules: [`fit`] (pure models), [`classify`] (pure diagnosis), [`run`]
//! (spawning and perf counters), [`system`] (idle and steal counters),
//! [`report`] (summary, table, JSON, PNG plot).

pub mod classify;
pub mod error;
pub mod fit;
pub mod report;
pub mod run;
pub mod system;

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};

pub use error::ScaleError;
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
    /// Runs per CPU count; the median wall time is used.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub repeat: u32,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also draw speedup and the key counters against cores into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Pass the program's stdout through (to stderr, keeping the report clean);
    /// by default it is discarded. Its stderr is always shown.
    #[arg(long)]
    pub show_output: bool,
    /// The program to measure and its arguments, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Runs the whole diagnosis and prints the report (table or JSON) to stdout.
pub fn run(args: ScaleArgs) -> anyhow::Result<()> {
    let report = measure(&args, &SystemRoots::default())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report::render_table(&report));
    }
    if let Some(path) = &args.plot {
        report::write_plot(&report, path)?;
        if !args.json {
            println!("plot written to {}", path.display());
        }
    }
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
    for repeat in 1..=args.repeat {
        for (index, &count) in counts.iter().enumerate() {
            progress.set_message(format!("{count} CPU(s), run {repeat}"));
            let measurement = runner.measure(&command, &allowed[..count], &mut idle);
            let measurement = match measurement {
                Ok(measurement) => measurement,
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
    };
    let per_count = counts.iter().zip(runs).map(|(&count, runs)| (allowed[..count].to_vec(), runs)).collect();
    Ok(report::build(setup, per_count))
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
                return Err(ScaleError::TooManyCpus { requested: count, available });
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
        assert_eq!(too_many.to_string(), "--cpus 99 exceeds the 2 CPUs this process may use: use counts up to 2");
        for err in [zero, too_many] {
            assert!(!err.to_string().contains('\n'));
        }
    }

    #[test]
    fn missing_command_and_zero_repeat_are_rejected_before_running() {
        let roots = SystemRoots::default();
        let err = measure(&ScaleArgs { repeat: 3, ..Default::default() }, &roots).unwrap_err();
        assert!(matches!(err, ScaleError::MissingCommand));
        assert!(err.to_string().contains("after `--`"));
        let args = ScaleArgs { repeat: 0, command: vec!["true".into()], ..Default::default() };
        assert!(matches!(measure(&args, &roots).unwrap_err(), ScaleError::ZeroRepeat));
        let args = ScaleArgs { repeat: 1, cpus: vec![99], command: vec!["true".into()], ..Default::default() };
        assert!(matches!(measure(&args, &roots).unwrap_err(), ScaleError::TooManyCpus { requested: 99, .. }));
    }

    #[test]
    fn failing_command_is_named_with_its_cpu_count() {
        let args =
            ScaleArgs { repeat: 1, cpus: vec![1], command: vec!["false".into()], ..Default::default() };
        let err = measure(&args, &SystemRoots::default()).unwrap_err();
        assert!(matches!(err, ScaleError::CommandFailed { cpus: 1, run: 1, .. }), "{err}");
    }

    #[test]
    fn clap_parses_the_documented_command_line() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ScaleArgs,
        }
        let cli = Cli::try_parse_from(["scale", "--cpus", "1,2", "--repeat", "2", "--json", "--", "sh", "-c", "true"])
            .unwrap();
        assert_eq!(cli.args.cpus, vec![1, 2]);
        assert_eq!(cli.args.repeat, 2);
        assert!(cli.args.json);
        assert_eq!(cli.args.command, vec!["sh", "-c", "true"]);
        assert!(Cli::try_parse_from(["scale", "--cpus", "x", "--", "true"]).is_err());
    }
}
