//! The policy lab (`gleaner sim lab`): a population of scenarios, each run with every guest
//! policy and every static setting, scored against the best static choice.
//!
//! It exists because a policy tuned on a handful of hand-picked scenarios overfits them; the
//! lab scores Gleaner on a grid it was not shaped around, in two sets (tuning, held-out; see
//! [`population`] for the rule), and reports the losses as plainly as the gains.
//!
//! **Scoring.** Every VM's throughput is the compute it completed per second (its useful work,
//! whatever its kind). Each VM is also simulated alone on the same host as the user
//! configured it (all vCPUs, guest `none`); its speedup in a configuration is its throughput
//! there over that solo throughput. The benchmark VM's speedup and the system's weighted
//! speedup (the sum over VMs) are therefore comparable across vCPU counts, unlike
//! `sim.weighted_speedup`, which compares each run with a solo run of the same configuration.
//! Regret = 1 − Gleaner's system speedup / the best static setting's, where the best static
//! setting is the one with the highest system speedup *among those that keep the benchmark
//! VM within 3 % of `none`* (shrinking a CPU-bound VM to one vCPU raises the co-runners'
//! speedups more than it lowers its own, a sacrifice no tenant's policy should make for
//! them). The regret against the unconstrained best static setting is reported too.

pub mod output;
pub mod population;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use crate::engine::Sim;
use crate::report::SimReport;
use crate::scenario::GuestPolicy;
use population::{population, GuestChoice, LabScenario, LabSet};

use gleaner_policy::PeriodSample;

#[derive(Debug, Clone, clap::Args)]
pub struct LabArgs {
    /// Which set to run (default tuning and held-out: a result on the tuning set alone proves
    /// little; `fresh`, scenarios the policy was never looked at against, only when asked)
    #[arg(long, value_enum)]
    pub set: Option<LabSet>,
    /// Instead of a set, a population drawn at random from this seed (kind, grain, VM size,
    /// contention, host policy): a seed never used before gives scenarios nobody has seen
    #[arg(long, value_name = "SEED", conflicts_with = "set")]
    pub draw: Option<u64>,
    /// How many scenarios --draw draws
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DRAW_COUNT, requires = "draw")]
    pub count: usize,
    /// Simulated time per scenario in ms (phase-changing scenarios run twice as long)
    #[arg(long, default_value_t = DEFAULT_DURATION_MS)]
    pub duration_ms: u64,
    /// Only the first N scenarios of each set (a quick check)
    #[arg(long)]
    pub limit: Option<usize>,
    /// Only the scenarios whose name contains this (e.g. `phase-`, `2:1`); applied before
    /// --limit. The summary then covers those alone.
    #[arg(long, value_name = "TEXT")]
    pub only: Option<String>,
    /// Worker threads [default: the machine's CPUs]
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Write lab-NAME.json, .md and -regret-cdf.png into this directory
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
    /// Name of the result files
    #[arg(long, default_value = "lab")]
    pub name: String,
}

impl LabArgs {
    /// The command that reproduces a run with these arguments, for the results files: every
    /// option that changes the numbers, and the output ones (`--jobs` changes only the wall
    /// time).
    pub fn command_line(&self) -> String {
        let mut cmd = String::from("gleaner sim lab");
        if let Some(set) = self.set {
            cmd += &format!(" --set {}", set.name());
        }
        if let Some(draw) = self.draw {
            cmd += &format!(" --draw {draw}");
            if self.count != DEFAULT_DRAW_COUNT {
                cmd += &format!(" --count {}", self.count);
            }
        }
        if self.duration_ms != DEFAULT_DURATION_MS {
            cmd += &format!(" --duration-ms {}", self.duration_ms);
        }
        if let Some(text) = &self.only {
            cmd += &format!(" --only '{text}'");
        }
        if let Some(n) = self.limit {
            cmd += &format!(" --limit {n}");
        }
        if let Some(dir) = &self.out_dir {
            cmd += &format!(" --out-dir {}", dir.display());
        }
        cmd + &format!(" --name {}", self.name)
    }
}

/// Simulated time per scenario unless `--duration-ms` says otherwise.
const DEFAULT_DURATION_MS: u64 = 2000;

/// Scenarios a `--draw` draws unless `--count` says otherwise: as many as a grid set has.
pub const DEFAULT_DRAW_COUNT: usize = 36;

/// Where the lab ran, for the results files (filled in by the caller, which owns the machine
/// readers).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Machine {
    pub commit: Option<String>,
    pub kernel: Option<String>,
    pub cpuidle_driver: Option<String>,
    pub loadavg_at_start: Option<[f64; 3]>,
    pub cpus: usize,
}

impl Machine {
    /// What can be known without reading kernel files: the CPU count and the commit (from
    /// `git`, when run inside the repository). The `gleaner` binary adds kernel, cpuidle
    /// driver and load through gleaner-linux's readers.
    pub fn here() -> Machine {
        let commit = std::process::Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string());
        let dirty = std::process::Command::new("git")
            .args(["status", "--porcelain", "--untracked-files=no"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .is_some_and(|o| !o.stdout.is_empty());
        Machine {
            commit: commit.map(|c| if dirty { format!("{c}+uncommitted") } else { c }),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            ..Machine::default()
        }
    }
}

/// One configuration's outcome in one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigResult {
    pub config: String,
    /// The benchmark VM's throughput over its solo throughput.
    pub bench_speedup: f64,
    /// Sum over VMs of throughput over solo throughput.
    pub system_speedup: f64,
    /// Gleaner's active vCPUs after each period (gleaner and retention only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub active_vcpus: Vec<usize>,
    /// Per-period signals of the benchmark VM, averaged over the run: what a policy sees.
    /// Workload utilization (vCPUs' worth of work).
    pub mean_total_util: f64,
    /// The signal Gleaner judges by when the application gives no progress count
    /// (`gleaner_policy::progress_signal` of the sample without `progress`).
    pub mean_fallback_signal: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    pub scenario: LabScenario,
    pub configs: Vec<ConfigResult>,
    pub best_static: String,
    pub best_static_system: f64,
    pub gleaner_system: f64,
    pub gleaner_bench: f64,
    pub none_system: f64,
    pub none_bench: f64,
    /// 1 − gleaner / best static (system speedup).
    pub regret: f64,
    /// The same for Gleaner told the application's progress.
    pub regret_with_progress: f64,
    /// The static setting with the highest system speedup whatever it costs the benchmark VM,
    /// and Gleaner's regret against it.
    pub best_static_any: String,
    pub regret_any: f64,
    /// Gleaner's benchmark-VM speedup relative to `none`'s, minus 1 (negative: a loss).
    pub bench_vs_none: f64,
    pub system_vs_none: f64,
    pub events: u64,
    /// Phase-changing scenarios: the best any policy could do by switching between static
    /// settings at each phase change ([`phase_oracle`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase_oracle: Option<PhaseOracle>,
}

/// What switching between static settings at every phase change could gain at most, from
/// each static setting's throughput in each phase run alone
/// ([`population::LabScenario::build_phase`]): the ceiling on any adaptive policy's gain
/// over the best single static setting, so that "Gleaner +x % over the best static setting"
/// can be read against what there was to take.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PhaseOracle {
    /// The setting for each phase (fine grain or all threads; coarse grain or a quarter).
    pub configs: [String; 2],
    pub system_speedup: f64,
    pub bench_speedup: f64,
    /// The best single static setting, scored by the same per-phase model.
    pub best_static: String,
    pub best_static_system: f64,
    /// oracle / best single static − 1: the most an adaptive policy could gain here.
    pub headroom: f64,
}

/// One setting's throughput while the benchmark VM runs one phase alone: the benchmark VM's
/// compute per second, and each co-runner's, in phase 0 and phase 1.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseRates {
    pub config: String,
    pub bench: [f64; 2],
    pub co_runners: [Vec<f64>; 2],
}

/// The phase oracle ([`PhaseOracle`]) from each setting's per-phase throughput `rates`, the
/// phases' shape and the VMs' solo throughputs (`solo[0]` the benchmark VM's). A pass
/// through phase p under setting c lasts max(min_ns[p], work_ns[p] / its benchmark-VM
/// rate), and the co-runners run at their rate of that phase meanwhile; the benchmark VM's
/// speedup and the system's are the time-weighted means over one pass through both phases.
/// As everywhere in the lab, only choices that keep the benchmark VM within 3 % of the
/// setting `none` (every vCPU, no hold; scored by the same model) count. Exhaustive over
/// pairs of settings: a few hundred per scenario.
pub fn phase_oracle(
    shape: &population::PhaseShape,
    rates: &[PhaseRates],
    solo: &[f64],
) -> Option<PhaseOracle> {
    let solo_bench = *solo.first().filter(|s| **s > 0.0)?;
    let score = |a: &PhaseRates, b: &PhaseRates| -> Option<(f64, f64)> {
        let t = [
            phase_time(shape, 0, a.bench[0])?,
            phase_time(shape, 1, b.bench[1])?,
        ];
        let total = t[0] + t[1];
        let bench = (shape.work_ns[0] + shape.work_ns[1]) / total / solo_bench;
        let co: f64 = (0..a.co_runners[0].len().min(b.co_runners[1].len()))
            .map(|j| match solo.get(j + 1) {
                Some(&s) if s > 0.0 => {
                    (a.co_runners[0][j] * t[0] + b.co_runners[1][j] * t[1]) / total / s
                }
                _ => 0.0,
            })
            .sum();
        Some((bench, bench + co))
    };
    let none = rates.iter().find(|r| r.config == "none")?;
    let (none_bench, _) = score(none, none)?;
    let floor = 0.97 * none_bench;
    let mut best_static: Option<(&PhaseRates, f64)> = None;
    let mut best: Option<(&PhaseRates, &PhaseRates, f64, f64)> = None;
    for (i, a) in rates.iter().enumerate() {
        for (k, b) in rates.iter().enumerate() {
            let Some((bench, system)) = score(a, b) else {
                continue;
            };
            if bench < floor {
                continue;
            }
            if i == k && best_static.is_none_or(|(_, s)| system > s) {
                best_static = Some((a, system));
            }
            if best.is_none_or(|(_, _, _, s)| system > s) {
                best = Some((a, b, bench, system));
            }
        }
    }
    let (st, st_system) = best_static?;
    let (a, b, bench, system) = best?;
    Some(PhaseOracle {
        configs: [a.config.clone(), b.config.clone()],
        system_speedup: system,
        bench_speedup: bench,
        best_static: st.config.clone(),
        best_static_system: st_system,
        headroom: system / st_system.max(1e-12) - 1.0,
    })
}

/// How long one pass through phase `p` lasts at a benchmark-VM rate of `rate`.
fn phase_time(shape: &population::PhaseShape, p: usize, rate: f64) -> Option<f64> {
    (rate > 0.0).then(|| (shape.work_ns[p] / rate).max(shape.min_ns[p]))
}

#[derive(Debug, Clone, Serialize)]
pub struct SetSummary {
    pub set: LabSet,
    pub scenarios: usize,
    pub median_regret: f64,
    pub p90_regret: f64,
    pub worst_regret: f64,
    pub worst_regret_scenario: String,
    /// Against the best static setting whatever it costs the benchmark VM.
    pub median_regret_any: f64,
    pub p90_regret_any: f64,
    /// Gleaner told the application's progress (`gleaner+progress`).
    pub median_regret_with_progress: f64,
    pub p90_regret_with_progress: f64,
    /// Scenarios where Gleaner's benchmark VM is more than 3 % below `none`'s.
    pub bench_loss_over_3pct: usize,
    /// Scenarios where Gleaner's system speedup is below `none`'s.
    pub system_below_none: usize,
    /// Against the guest's own `haltpoll` (not in the static set: it needs a cpuidle POLL
    /// state, which the static settings' guest has not): `gleaner`, which holds with a
    /// yielding thread as on a guest without one, and `gleaner@poll`, Gleaner on a guest with
    /// a POLL state, holding by polling as the daemon does there.
    pub vs_haltpoll: VsHaltpoll,
    pub vs_haltpoll_polling: VsHaltpoll,
    /// Phase-changing scenarios: Gleaner's system speedup over the best static one, minus 1.
    pub phased_gain_over_best_static: Vec<(String, f64)>,
    /// Phase-changing scenarios: the phase oracle's gain over the best single static
    /// setting, the ceiling on any adaptive policy's ([`PhaseOracle::headroom`]).
    pub phased_headroom: Vec<(String, f64)>,
    /// Spearman rank correlation, over every scenario's configurations, between a period
    /// signal and the benchmark VM's throughput (both relative to the scenario's `none`).
    pub correlation_util_vs_throughput: f64,
    /// The same for Gleaner's signal without an application progress count.
    pub correlation_fallback_signal_vs_throughput: f64,
}

/// One Gleaner configuration against `haltpoll`, over a set's scenarios.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VsHaltpoll {
    /// Scenarios where `haltpoll`'s system speedup is more than 3 % above Gleaner's.
    pub haltpoll_ahead_over_3pct: usize,
    /// Scenarios where Gleaner's is more than 3 % above `haltpoll`'s.
    pub gleaner_ahead_over_3pct: usize,
    /// The scenario where Gleaner is furthest behind, and its system speedup over
    /// `haltpoll`'s minus 1.
    pub furthest_behind: (String, f64),
}

impl VsHaltpoll {
    fn of(results: &[&ScenarioResult], gleaner: &str) -> Self {
        let gaps: Vec<(String, f64)> = results
            .iter()
            .filter_map(|r| {
                let sys = |label: &str| {
                    r.configs
                        .iter()
                        .find(|c| c.config == label)
                        .map(|c| c.system_speedup)
                };
                Some((
                    r.scenario.name.clone(),
                    sys(gleaner)? / sys("haltpoll")?.max(1e-12) - 1.0,
                ))
            })
            .collect();
        Self {
            haltpoll_ahead_over_3pct: gaps.iter().filter(|(_, g)| *g < -0.03).count(),
            gleaner_ahead_over_3pct: gaps.iter().filter(|(_, g)| *g > 0.03).count(),
            furthest_behind: gaps
                .iter()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .cloned()
                .unwrap_or_default(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LabReport {
    /// What reproduces it ([`LabArgs::command_line`]).
    pub command: String,
    pub machine: Machine,
    pub duration_ms: u64,
    pub wall_s: f64,
    pub events: u64,
    pub summaries: Vec<SetSummary>,
    pub scenarios: Vec<ScenarioResult>,
}

/// One simulation to run: a scenario in one configuration, or one VM's solo baseline.
#[derive(Debug, Clone)]
enum Job {
    Config {
        scenario: usize,
        choice: GuestChoice,
    },
    Solo {
        scenario: usize,
        vm: usize,
    },
    /// A phase-changing scenario with the benchmark VM in one phase only.
    Phase {
        scenario: usize,
        choice: GuestChoice,
        phase: usize,
    },
}

/// The signal the policy judges by on a machine where the application reports no progress.
fn fallback_signal(sample: &PeriodSample) -> f64 {
    let mut s = sample.clone();
    s.progress = None;
    gleaner_policy::progress_signal(&s)
}

struct Outcome {
    report: SimReport,
    samples: Vec<(usize, PeriodSample)>,
}

/// Run every job on `jobs` threads; results in job order.
fn run_jobs(
    scenarios: &[LabScenario],
    jobs: &[Job],
    threads: usize,
) -> anyhow::Result<Vec<Outcome>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<anyhow::Result<Outcome>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let outcome = (|| -> anyhow::Result<Outcome> {
                    let scenario = match job {
                        Job::Config { scenario, choice } => {
                            scenarios[*scenario].build(*choice, None)?
                        }
                        Job::Solo { scenario, vm } => scenarios[*scenario].build(
                            GuestChoice {
                                guest: GuestPolicy::None,
                                active_vcpus: None,
                                app_progress: false,
                                retention_polls: false,
                            },
                            Some(*vm),
                        )?,
                        Job::Phase {
                            scenario,
                            choice,
                            phase,
                        } => scenarios[*scenario]
                            .build_phase(*choice, *phase)
                            .ok_or_else(|| {
                                anyhow::anyhow!("a phase job for a scenario without phases")
                            })??,
                    };
                    let (report, samples) = Sim::new(&scenario).run_keeping_samples();
                    Ok(Outcome { report, samples })
                })();
                if let Ok(mut r) = results.lock() {
                    r[i] = Some(outcome);
                }
            });
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a lab worker panicked"))?;
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("a lab job did not run"))))
        .collect()
}

fn rate(report: &SimReport, vm: usize) -> f64 {
    let v = &report.vms[vm];
    v.completed_work_ns as f64 / report.simulated_ns.max(1) as f64
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// The q-quantile of `xs` (nearest rank).
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Spearman's rank correlation of paired values.
pub fn spearman(pairs: &[(f64, f64)]) -> f64 {
    fn ranks(xs: &[f64]) -> Vec<f64> {
        let mut idx: Vec<usize> = (0..xs.len()).collect();
        idx.sort_by(|&a, &b| xs[a].total_cmp(&xs[b]));
        let mut r = vec![0.0; xs.len()];
        let mut i = 0;
        while i < idx.len() {
            let mut j = i;
            while j + 1 < idx.len() && xs[idx[j + 1]] == xs[idx[i]] {
                j += 1;
            }
            let avg = (i + j) as f64 / 2.0;
            for k in i..=j {
                r[idx[k]] = avg;
            }
            i = j + 1;
        }
        r
    }
    if pairs.len() < 3 {
        return 0.0;
    }
    let a = ranks(&pairs.iter().map(|p| p.0).collect::<Vec<_>>());
    let b = ranks(&pairs.iter().map(|p| p.1).collect::<Vec<_>>());
    let (ma, mb) = (mean(a.iter().copied()), mean(b.iter().copied()));
    let cov: f64 = a.iter().zip(&b).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = a.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|y| (y - mb).powi(2)).sum();
    if va == 0.0 || vb == 0.0 {
        0.0
    } else {
        cov / (va * vb).sqrt()
    }
}

/// The per-phase runs of a phase-changing scenario, in pairs (phase 0, phase 1) per static
/// setting (`none` and every `static-*`): what [`phase_oracle`] needs. Empty for other
/// kinds.
fn phase_runs(s: &LabScenario) -> Vec<(GuestChoice, usize)> {
    if !s.kind.is_phased() {
        return Vec::new();
    }
    s.choices()
        .into_iter()
        .filter(|c| c.active_vcpus.is_some() || c.label() == "none")
        .flat_map(|c| [(c, 0), (c, 1)])
        .collect()
}

/// Run the lab and return its report (files are written by [`output`]).
pub fn run_lab(args: &LabArgs, machine: Machine) -> anyhow::Result<LabReport> {
    let started = std::time::Instant::now();
    let sets: Vec<LabSet> = match (args.set, args.draw) {
        (_, Some(_)) => vec![LabSet::Drawn],
        (Some(s), None) => vec![s],
        (None, None) => vec![LabSet::Tuning, LabSet::HeldOut],
    };
    if args.draw.is_some() && args.count == 0 {
        anyhow::bail!("--count 0 draws no scenario: give 1 or more (default {DEFAULT_DRAW_COUNT})");
    }
    if args.limit == Some(0) {
        anyhow::bail!(
            "--limit 0 runs no scenario: give 1 or more, or leave it out to run them all"
        );
    }
    let mut scenarios = Vec::new();
    for set in &sets {
        let duration = args.duration_ms * crate::time::MS;
        let mut pop = match (set, args.draw) {
            (LabSet::Drawn, Some(draw)) => population::drawn_population(draw, args.count, duration),
            _ => population(*set, duration),
        };
        if let Some(text) = &args.only {
            pop.retain(|s| s.name.contains(text.as_str()));
        }
        if let Some(n) = args.limit {
            pop.truncate(n);
        }
        scenarios.extend(pop);
    }
    if let (Some(text), true) = (&args.only, scenarios.is_empty()) {
        anyhow::bail!(
            "no lab scenario's name contains {text:?}: names look like \
             pipeline-10us-4v-dedicated-cfs (kind, grain, vCPUs, contention, host policy)"
        );
    }
    let mut jobs = Vec::new();
    for (i, s) in scenarios.iter().enumerate() {
        for choice in s.choices() {
            jobs.push(Job::Config {
                scenario: i,
                choice,
            });
        }
        for vm in 0..s.vm_count() {
            jobs.push(Job::Solo { scenario: i, vm });
        }
        for (choice, phase) in phase_runs(s) {
            jobs.push(Job::Phase {
                scenario: i,
                choice,
                phase,
            });
        }
    }
    // Longest first, so that the last jobs are short and both workers finish together.
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&j| {
        let s = match &jobs[j] {
            Job::Config { scenario, .. }
            | Job::Solo { scenario, .. }
            | Job::Phase { scenario, .. } => &scenarios[*scenario],
        };
        std::cmp::Reverse(s.duration_ns / s.grain_ns.max(1) * s.vcpus as u64)
    });
    let ordered: Vec<Job> = order.iter().map(|&j| jobs[j].clone()).collect();
    let threads = args.jobs.unwrap_or(machine.cpus.max(1));
    eprintln!(
        "policy lab: {} scenarios, {} simulations on {threads} threads",
        scenarios.len(),
        jobs.len()
    );
    let outcomes_ordered = run_jobs(&scenarios, &ordered, threads)?;
    let mut outcomes: Vec<Option<Outcome>> = (0..jobs.len()).map(|_| None).collect();
    for (o, &j) in outcomes_ordered.into_iter().zip(&order) {
        outcomes[j] = Some(o);
    }
    let mut results = Vec::new();
    let mut total_events = 0u64;
    let mut j = 0;
    for s in &scenarios {
        let choices = s.choices();
        let n_vms = s.vm_count();
        let config_outcomes: Vec<&Outcome> = (j..j + choices.len())
            .filter_map(|k| outcomes[k].as_ref())
            .collect();
        let solo: Vec<f64> = (j + choices.len()..j + choices.len() + n_vms)
            .filter_map(|k| outcomes[k].as_ref())
            .map(|o| rate(&o.report, 0))
            .collect();
        let phased = phase_runs(s);
        let phase_start = j + choices.len() + n_vms;
        let phase_outcomes: Vec<&Outcome> = (phase_start..phase_start + phased.len())
            .filter_map(|k| outcomes[k].as_ref())
            .collect();
        j = phase_start + phased.len();
        anyhow::ensure!(
            config_outcomes.len() == choices.len()
                && solo.len() == n_vms
                && phase_outcomes.len() == phased.len(),
            "lab results are incomplete"
        );
        let phase_oracle = s.phase_shape().and_then(|shape| {
            // Runs come in pairs per setting: phase 0, then phase 1.
            let rates: Vec<PhaseRates> = phased
                .chunks(2)
                .zip(phase_outcomes.chunks(2))
                .filter(|(c, o)| c.len() == 2 && o.len() == 2)
                .map(|(c, o)| PhaseRates {
                    config: c[0].0.label(),
                    bench: [rate(&o[0].report, 0), rate(&o[1].report, 0)],
                    co_runners: [
                        (1..n_vms).map(|vm| rate(&o[0].report, vm)).collect(),
                        (1..n_vms).map(|vm| rate(&o[1].report, vm)).collect(),
                    ],
                })
                .collect();
            phase_oracle(&shape, &rates, &solo)
        });
        total_events += config_outcomes.iter().map(|o| o.report.events).sum::<u64>();
        let configs: Vec<ConfigResult> = choices
            .iter()
            .zip(&config_outcomes)
            .map(|(choice, o)| {
                let speed = |vm: usize| {
                    if solo[vm] > 0.0 {
                        rate(&o.report, vm) / solo[vm]
                    } else {
                        0.0
                    }
                };
                let bench_samples = o.samples.iter().filter(|(vm, _)| *vm == 0).map(|(_, s)| s);
                let util = mean(
                    bench_samples
                        .clone()
                        .map(|s| s.work_ns() as f64 / s.period_ns.max(1) as f64),
                );
                ConfigResult {
                    config: choice.label(),
                    bench_speedup: speed(0),
                    system_speedup: (0..n_vms).map(speed).sum(),
                    active_vcpus: o.report.vms[0].active_vcpus.clone(),
                    mean_total_util: util,
                    mean_fallback_signal: mean(bench_samples.map(fallback_signal)),
                }
            })
            .collect();
        let find = |label: &str| configs.iter().find(|c| c.config == label);
        let (Some(none), Some(gleaner), Some(with_progress)) =
            (find("none"), find("gleaner"), find("gleaner+progress"))
        else {
            anyhow::bail!("lab configurations none and gleaner missing");
        };
        let statics = || {
            configs
                .iter()
                .filter(|c| c.config.starts_with("static-") || c.config == "none")
        };
        let best_any = statics()
            .max_by(|a, b| a.system_speedup.total_cmp(&b.system_speedup))
            .unwrap_or(none);
        let best = statics()
            .filter(|c| c.bench_speedup >= 0.97 * none.bench_speedup)
            .max_by(|a, b| a.system_speedup.total_cmp(&b.system_speedup))
            .unwrap_or(none);
        results.push(ScenarioResult {
            scenario: s.clone(),
            best_static: best.config.clone(),
            best_static_system: best.system_speedup,
            gleaner_system: gleaner.system_speedup,
            gleaner_bench: gleaner.bench_speedup,
            none_system: none.system_speedup,
            none_bench: none.bench_speedup,
            regret: 1.0 - gleaner.system_speedup / best.system_speedup.max(1e-12),
            regret_with_progress: 1.0
                - with_progress.system_speedup / best.system_speedup.max(1e-12),
            best_static_any: best_any.config.clone(),
            regret_any: 1.0 - gleaner.system_speedup / best_any.system_speedup.max(1e-12),
            bench_vs_none: gleaner.bench_speedup / none.bench_speedup.max(1e-12) - 1.0,
            system_vs_none: gleaner.system_speedup / none.system_speedup.max(1e-12) - 1.0,
            events: config_outcomes.iter().map(|o| o.report.events).sum::<u64>()
                + phase_outcomes.iter().map(|o| o.report.events).sum::<u64>(),
            configs,
            phase_oracle,
        });
    }
    let summaries = sets.iter().map(|&set| summarize(set, &results)).collect();
    Ok(LabReport {
        command: args.command_line(),
        machine,
        duration_ms: args.duration_ms,
        wall_s: started.elapsed().as_secs_f64(),
        events: total_events,
        summaries,
        scenarios: results,
    })
}

fn summarize(set: LabSet, results: &[ScenarioResult]) -> SetSummary {
    let rs: Vec<&ScenarioResult> = results.iter().filter(|r| r.scenario.set == set).collect();
    let regrets: Vec<f64> = rs.iter().map(|r| r.regret).collect();
    let worst = rs.iter().max_by(|a, b| a.regret.total_cmp(&b.regret));
    let mut util_pairs = Vec::new();
    let mut signal_pairs = Vec::new();
    for r in &rs {
        let Some(none) = r.configs.iter().find(|c| c.config == "none") else {
            continue;
        };
        for c in &r.configs {
            let tput = c.bench_speedup / none.bench_speedup.max(1e-12);
            if none.mean_total_util > 0.0 {
                util_pairs.push((c.mean_total_util / none.mean_total_util, tput));
            }
            if none.mean_fallback_signal > 0.0 {
                signal_pairs.push((c.mean_fallback_signal / none.mean_fallback_signal, tput));
            }
        }
    }
    SetSummary {
        set,
        scenarios: rs.len(),
        median_regret: quantile(&regrets, 0.5),
        p90_regret: quantile(&regrets, 0.9),
        worst_regret: worst.map_or(0.0, |r| r.regret),
        median_regret_any: quantile(&rs.iter().map(|r| r.regret_any).collect::<Vec<_>>(), 0.5),
        p90_regret_any: quantile(&rs.iter().map(|r| r.regret_any).collect::<Vec<_>>(), 0.9),
        median_regret_with_progress: quantile(
            &rs.iter()
                .map(|r| r.regret_with_progress)
                .collect::<Vec<_>>(),
            0.5,
        ),
        p90_regret_with_progress: quantile(
            &rs.iter()
                .map(|r| r.regret_with_progress)
                .collect::<Vec<_>>(),
            0.9,
        ),
        worst_regret_scenario: worst.map_or(String::new(), |r| r.scenario.name.clone()),
        bench_loss_over_3pct: rs.iter().filter(|r| r.bench_vs_none < -0.03).count(),
        system_below_none: rs.iter().filter(|r| r.system_vs_none < -1e-9).count(),
        vs_haltpoll: VsHaltpoll::of(&rs, "gleaner"),
        vs_haltpoll_polling: VsHaltpoll::of(&rs, "gleaner@poll"),
        phased_gain_over_best_static: rs
            .iter()
            .filter(|r| r.scenario.kind.is_phased())
            .map(|r| {
                (
                    r.scenario.name.clone(),
                    r.gleaner_system / r.best_static_system.max(1e-12) - 1.0,
                )
            })
            .collect(),
        phased_headroom: rs
            .iter()
            .filter_map(|r| {
                r.phase_oracle
                    .as_ref()
                    .map(|o| (r.scenario.name.clone(), o.headroom))
            })
            .collect(),
        correlation_util_vs_throughput: spearman(&util_pairs),
        correlation_fallback_signal_vs_throughput: spearman(&signal_pairs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(config: &str, bench: [f64; 2], co: [f64; 2]) -> PhaseRates {
        PhaseRates {
            config: config.into(),
            bench,
            co_runners: [vec![co[0]], vec![co[1]]],
        }
    }

    /// Two settings, each best in one phase: the oracle switches and gains what the hand
    /// computation says; where one setting is best in both phases there is nothing to gain;
    /// a pair that costs the benchmark VM more than 3 % against `none` never counts.
    #[test]
    fn the_phase_oracle_switches_where_each_phase_has_its_own_best_setting() {
        let shape = population::PhaseShape {
            rounds: [1, 1],
            work_ns: [1.0, 1.0],
            min_ns: [0.0, 0.0],
        };
        // Solo throughputs 1 (benchmark VM) and 1 (co-runner). `none`: 1.0 in both phases,
        // co-runner 0.5. `small`: slower in phase 0, faster in phase 1, and leaves the
        // co-runner more.
        let r = [
            rates("none", [1.0, 1.0], [0.5, 0.5]),
            rates("static-2", [0.5, 2.0], [0.8, 0.8]),
        ];
        let o = phase_oracle(&shape, &r, &[1.0, 1.0]).unwrap();
        // none/none: t = 1 + 1, bench 1, co 0.5: system 1.5. static-2 alone: t = 2 + 0.5,
        // bench 2/2.5 = 0.8 < 0.97: excluded. none then static-2: t = 1 + 0.5, bench
        // 2/1.5 = 1.333, co (0.5 x 1 + 0.8 x 0.5)/1.5 = 0.6: system 1.933.
        assert_eq!(o.configs, ["none".to_string(), "static-2".to_string()]);
        assert_eq!(o.best_static, "none");
        assert!((o.system_speedup - (4.0 / 3.0 + 0.6)).abs() < 1e-9, "{o:?}");
        assert!((o.headroom - ((4.0 / 3.0 + 0.6) / 1.5 - 1.0)).abs() < 1e-9);
        // A setting best in both phases: the oracle is that setting, no headroom.
        let r = [
            rates("none", [1.0, 1.0], [0.5, 0.5]),
            rates("static-2+retain", [1.2, 1.2], [0.6, 0.6]),
        ];
        let o = phase_oracle(&shape, &r, &[1.0, 1.0]).unwrap();
        assert_eq!(
            o.configs,
            ["static-2+retain".to_string(), "static-2+retain".to_string()]
        );
        assert!(o.headroom.abs() < 1e-12);
        // A phase's least duration (the sleepers of phase-threads) bounds a fast setting.
        let shape = population::PhaseShape {
            min_ns: [0.0, 2.0],
            ..shape
        };
        let r = [
            rates("none", [1.0, 1.0], [0.5, 0.5]),
            rates("static-1", [1.0, 4.0], [0.9, 0.9]),
        ];
        let o = phase_oracle(&shape, &r, &[1.0, 1.0]).unwrap();
        // static-1 in phase 1 finishes its work in 0.25 but the phase lasts 2: only the
        // co-runner gains. none: t = 1 + 2, bench 2/3, system 2/3 + 0.5.
        assert_eq!(o.configs[1], "static-1");
        assert!((o.bench_speedup - 2.0 / 3.0).abs() < 1e-9);
        // Without `none` or the solo run there is no floor to judge by.
        assert!(phase_oracle(&shape, &r[1..], &[1.0, 1.0]).is_none());
        assert!(phase_oracle(&shape, &r, &[0.0, 1.0]).is_none());
    }

    #[test]
    fn quantiles_and_rank_correlation() {
        let xs = [0.5, 0.1, 0.3, 0.2, 0.4];
        assert_eq!(quantile(&xs, 0.5), 0.3);
        assert_eq!(quantile(&xs, 0.9), 0.5);
        let up: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, (i * i) as f64)).collect();
        assert!((spearman(&up) - 1.0).abs() < 1e-12);
        let down: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, -(i as f64))).collect();
        assert!((spearman(&down) + 1.0).abs() < 1e-12);
    }

    /// The results files name the command that reproduces them, the set included: a fresh
    /// set's file that said `gleaner sim lab --out-dir …` would rerun the other two.
    #[test]
    fn the_command_line_names_every_option_that_changes_the_numbers() {
        let mut args = LabArgs {
            set: None,
            draw: None,
            count: DEFAULT_DRAW_COUNT,
            duration_ms: DEFAULT_DURATION_MS,
            limit: None,
            only: None,
            jobs: Some(7),
            out_dir: Some(PathBuf::from("results")),
            name: "lab-x".into(),
        };
        assert_eq!(
            args.command_line(),
            "gleaner sim lab --out-dir results --name lab-x"
        );
        args.set = Some(LabSet::Fresh);
        args.duration_ms = 500;
        args.only = Some("phase-".into());
        args.limit = Some(3);
        args.out_dir = None;
        assert_eq!(
            args.command_line(),
            "gleaner sim lab --set fresh --duration-ms 500 --only 'phase-' --limit 3 --name lab-x"
        );
        args.set = None;
        args.draw = Some(7);
        args.count = 10;
        assert!(args
            .command_line()
            .starts_with("gleaner sim lab --draw 7 --count 10 --duration-ms 500"));
    }

    /// A drawn population is the same for the same seed on every run, another for another
    /// seed, and spans what the grid does: every kind, size, contention and host policy, and
    /// grains between and beyond the grid's values.
    #[test]
    fn a_drawn_population_is_a_function_of_its_seed_and_spans_the_grid() {
        let d = 1_000_000_000;
        let a = population::drawn_population(1, 400, d);
        let again = population::drawn_population(1, 400, d);
        let other = population::drawn_population(2, 400, d);
        let key = |s: &LabScenario| (s.name.clone(), s.seed, s.grain_ns);
        assert_eq!(
            a.iter().map(key).collect::<Vec<_>>(),
            again.iter().map(key).collect::<Vec<_>>()
        );
        assert_ne!(
            a.iter().map(key).collect::<Vec<_>>(),
            other.iter().map(key).collect::<Vec<_>>()
        );
        let mut names: Vec<&str> = a.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), a.len(), "names are unique");
        for k in population::KINDS {
            assert!(a.iter().any(|s| s.kind == k), "{}", k.name());
        }
        for n in population::SIZES {
            assert!(a.iter().any(|s| s.vcpus == n));
        }
        for c in population::CONTENTIONS {
            assert!(a.iter().any(|s| s.contention == c));
        }
        use crate::scenario::HostPolicy;
        for p in [HostPolicy::Cfs, HostPolicy::Bal, HostPolicy::Sbco] {
            assert!(a.iter().any(|s| s.host_policy == p), "{}", p.name());
        }
        let (lo, hi) = population::DRAWN_GRAINS_NS;
        assert!(a.iter().all(|s| (lo..=hi).contains(&s.grain_ns)));
        let grid: Vec<crate::time::Ns> = [LabSet::Tuning, LabSet::HeldOut, LabSet::Fresh]
            .into_iter()
            .flat_map(|set| population(set, d))
            .map(|s| s.grain_ns)
            .collect();
        let off_grid = a.iter().filter(|s| !grid.contains(&s.grain_ns)).count();
        assert!(
            off_grid * 10 > a.len() * 9,
            "{off_grid} of {} off the grid",
            a.len()
        );
        assert!(population(LabSet::Drawn, d).is_empty());
    }

    #[test]
    fn sets_differ_in_seeds_and_parameter_values() {
        let sets = [LabSet::Tuning, LabSet::HeldOut, LabSet::Fresh]
            .map(|set| population(set, 1_000_000_000));
        for (i, a) in sets.iter().enumerate() {
            for b in &sets[i + 1..] {
                assert_eq!(a.len(), b.len());
                for x in a {
                    assert!(
                        b.iter().all(|y| y.seed != x.seed
                            && y.grain_ns != x.grain_ns
                            && y.name != x.name),
                        "{}",
                        x.name
                    );
                }
            }
        }
        // No (kind, size, contention) combination of the fresh set is in the others.
        let combo = |s: &LabScenario| (s.kind, s.vcpus, s.contention);
        let seen: Vec<_> = sets[..2].iter().flatten().map(combo).collect();
        for s in &sets[2] {
            assert!(!seen.contains(&combo(s)), "{}", s.name);
        }
        // Every size and every contention level appears in each set.
        for set in &sets {
            for n in population::SIZES {
                assert!(set.iter().any(|s| s.vcpus == n));
            }
            for c in population::CONTENTIONS {
                assert!(set.iter().any(|s| s.contention == c));
            }
            assert!(set
                .iter()
                .any(|s| s.host_policy != crate::scenario::HostPolicy::Cfs));
        }
    }

    #[test]
    fn every_configuration_of_every_scenario_builds() {
        let drawn = population::drawn_population(3, 24, 100_000_000);
        for set in [
            LabSet::Tuning,
            LabSet::HeldOut,
            LabSet::Fresh,
            LabSet::Drawn,
        ] {
            let pop = match set {
                LabSet::Drawn => drawn.clone(),
                _ => population(set, 100_000_000),
            };
            for s in pop {
                for choice in s.choices() {
                    s.build(choice, None).unwrap();
                }
                for vm in 0..s.vm_count() {
                    s.build(
                        GuestChoice {
                            guest: GuestPolicy::None,
                            active_vcpus: None,
                            app_progress: false,
                            retention_polls: false,
                        },
                        Some(vm),
                    )
                    .unwrap();
                }
                for (choice, phase) in phase_runs(&s) {
                    s.build_phase(choice, phase).unwrap().unwrap();
                }
                assert_eq!(s.kind.is_phased(), s.phase_shape().is_some());
            }
        }
    }
}
