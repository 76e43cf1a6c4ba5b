//! The `gleaner sim` command line: one scenario, or a sweep of one parameter over a list.
//!
//! Prints a summary table (or the JSON with `--json`) and writes the full JSON report with
//! `--out`. A sweep's JSON is `{ "sweep": PATH, "values": [...], "runs": [report, ...] }`.

use std::path::PathBuf;

use anyhow::Context;
use serde::Serialize;

use crate::lab::{output, run_lab, LabArgs, Machine};
use crate::report::{table, SimReport};
use crate::scenario::{parse_value, read_text, Scenario, Sweep};
use crate::simulate_counting;

#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SimArgs {
    #[command(subcommand)]
    pub command: Option<SimCommand>,
    /// Scenario file (TOML), e.g. scenarios/table2-c.toml
    #[arg(required = true)]
    pub scenario: Option<PathBuf>,
    /// Run once per value of a scenario field: PATH=V1,V2,... (e.g. host.pcpus=4,8,16,
    /// vm.0.guest=none,gleaner; several fields at once: vm.0.guest+vm.1.guest=none,gleaner)
    #[arg(long)]
    pub sweep: Option<String>,
    /// Write the full report as JSON to FILE
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Override the scenario's random seed
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print the JSON report on stdout instead of the summary table
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum SimCommand {
    /// The policy lab: a generated population of scenarios, each run with none, haltpoll,
    /// retention, gleaner and every static vCPU count (with and without retention); prints
    /// Gleaner's regret against the best static setting on a tuning and a held-out set (or a
    /// third, fresh one, or a population drawn at random from a seed)
    Lab(LabArgs),
}

#[derive(Serialize)]
struct SweepReport<'a> {
    sweep: &'a str,
    values: &'a [String],
    /// Per run: mean over VMs of each VM's speedup relative to the first run (Figure 7(b)).
    relative_to_first: Vec<Option<f64>>,
    runs: &'a [SimReport],
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    run_with_machine(args, Machine::here)
}

/// As [`run`]; `machine` describes where the lab runs, for its results files (the caller owns
/// the readers of the machine's state).
pub fn run_with_machine(args: SimArgs, machine: impl FnOnce() -> Machine) -> anyhow::Result<()> {
    if let Some(SimCommand::Lab(lab)) = &args.command {
        return run_lab_command(lab, machine());
    }
    let Some(scenario_path) = args.scenario.clone() else {
        anyhow::bail!("give a scenario file (e.g. scenarios/table2-c.toml) or `lab`");
    };
    run_scenario(args, &scenario_path)
}

fn run_lab_command(args: &LabArgs, machine: Machine) -> anyhow::Result<()> {
    // Made before the population runs, so that a place it cannot write fails at once, not
    // after the minutes the lab takes.
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "cannot create the lab's output directory {} (give --out-dir a directory you can write)",
                dir.display()
            )
        })?;
    }
    let report = run_lab(args, machine)?;
    print!("{}", output::summary(&report));
    if let Some(dir) = &args.out_dir {
        for path in output::write_files(&report, dir, &args.name)? {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn run_scenario(args: SimArgs, scenario_path: &std::path::Path) -> anyhow::Result<()> {
    // Wall time of the simulations alone, for the events/s line on stderr (stdout stays the
    // deterministic report).
    let mut events = 0u64;
    let mut busy = std::time::Duration::ZERO;
    let mut timed = |scenario: &Scenario| {
        let started = std::time::Instant::now();
        let (report, n) = simulate_counting(scenario);
        busy += started.elapsed();
        events += n;
        report
    };
    let text = read_text(scenario_path)?;
    let base = parse_value(&text, scenario_path)?;
    let (json, rows_text) = match &args.sweep {
        None => {
            let mut scenario = Scenario::from_value_in(base, Some(&text), scenario_path)?;
            if let Some(seed) = args.seed {
                scenario.seed = seed;
            }
            let report = timed(&scenario);
            let text = table(&[(None, &report, None)]);
            (serde_json::to_string_pretty(&report)?, text)
        }
        Some(spec) => {
            let sweep = Sweep::parse(spec)?;
            let mut reports = Vec::new();
            for k in 0..sweep.values.len() {
                let mut value = base.clone();
                sweep.apply(&mut value, k)?;
                let mut scenario = Scenario::from_value(value, scenario_path)
                    .with_context(|| format!("with {}={}", sweep.path, sweep.labels[k]))?;
                if let Some(seed) = args.seed {
                    scenario.seed = seed;
                }
                reports.push(timed(&scenario));
            }
            let relative: Vec<Option<f64>> =
                reports.iter().map(|r| r.relative_to(&reports[0])).collect();
            let rows: Vec<_> = reports
                .iter()
                .zip(&sweep.labels)
                .zip(&relative)
                .map(|((r, label), rel)| (Some(label.clone()), r, *rel))
                .collect();
            let text = table(&rows);
            let out = SweepReport {
                sweep: &sweep.path,
                values: &sweep.labels,
                relative_to_first: relative.clone(),
                runs: &reports,
            };
            (serde_json::to_string_pretty(&out)?, text)
        }
    };
    if let Some(path) = &args.out {
        std::fs::write(path, format!("{json}\n")).with_context(|| {
            format!(
                "cannot write {}: check the directory exists",
                path.display()
            )
        })?;
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{rows_text}");
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let secs = busy.as_secs_f64();
    if secs > 0.0 {
        eprintln!(
            "{events} events in {secs:.2} s of simulation: {:.2} M events/s",
            events as f64 / secs / 1e6
        );
    }
    Ok(())
}
