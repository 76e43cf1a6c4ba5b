//! Command-line surface (`gleaner workload <name> ...`): clap argument structs
//! that resolve into the library configs, and [`run`] which prints the report.

use std::num::NonZeroUsize;
use std::str::FromStr;
use std::time::Duration;

use anyhow::bail;
use clap::builder::RangedU64ValueParser;
use clap::{Args, Subcommand};

use crate::barrier::{barrier, BarrierConfig};
use crate::freqsleep::{freqsleep, FreqsleepConfig};
use crate::matmul::{matmul, MatmulConfig, MAX_MATMUL_SIZE};
use crate::messaging::{messaging, MessagingConfig};
use crate::mutex::{mutex, MutexConfig};
use crate::phase::{parse_duration_arg, Length, PhaseSpec, PhaseSpecError, FINE_WORK};
use crate::pingpong::{pingpong, PingpongConfig};
use crate::pipeline::{pipeline, PipelineConfig};
use crate::report::Report;

/// Upper bound on any thread-count option; far beyond useful, low enough that
/// a typo does not try to spawn millions of threads.
const MAX_THREADS: u64 = 4096;

fn threads_parser() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..=MAX_THREADS)
}

/// `gleaner workload`: run one bundled workload and print its report.
#[derive(Debug, Args)]
pub struct WorkloadArgs {
    /// Print one JSON object instead of a human-readable line
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub workload: WorkloadCommand,
}

#[derive(Debug, Subcommand)]
pub enum WorkloadCommand {
    /// dedup-like pipeline: thread pools joined by bounded mutex+condvar queues
    Pipeline(PipelineArgs),
    /// Threads contending for a few mutexes
    Mutex(MutexArgs),
    /// streamcluster-like bulk-synchronous episodes on a barrier
    Barrier(BarrierArgs),
    /// Two threads bouncing a token through a futex; reports round-trip latency
    Pingpong(PingpongArgs),
    /// hackbench-like: groups of senders and receivers exchanging 100-byte messages over
    /// Unix sockets (160 threads by default)
    Messaging(MessagingArgs),
    /// CPU-bound integer matrix multiply co-runner (never blocks)
    Matmul(MatmulArgs),
    /// Every thread calls nanosleep(1 ns) in a loop (idle/wakeup churn co-runner)
    Freqsleep(FreqsleepArgs),
}

#[derive(Debug, Args)]
pub struct PipelineArgs {
    /// Number of processing stages
    #[arg(long, default_value_t = 3, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub stages: usize,
    /// Worker threads in each stage
    #[arg(long, default_value_t = 2, value_parser = threads_parser())]
    pub threads_per_stage: usize,
    /// Capacity of each queue between stages
    #[arg(long = "queue", default_value_t = 16, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub queue: usize,
    /// Hash iterations per item per stage (500 = fine, 5000 = coarse)
    #[arg(long, default_value_t = FINE_WORK, conflicts_with = "phases")]
    pub work: u64,
    /// Total items pushed through the pipeline
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..), conflicts_with_all = ["duration", "phases"])]
    pub items: u64,
    /// Run for this long instead of a fixed item count (seconds, or e.g. 500ms)
    #[arg(long, value_parser = parse_duration_arg, conflicts_with = "phases")]
    pub duration: Option<Duration>,
    /// Phase schedule, e.g. "fine:5s,coarse:5s" (timed) or "fine:10000,coarse:1000" (items)
    #[arg(long)]
    pub phases: Option<PhaseSpec>,
}

#[derive(Debug, Args)]
pub struct MutexArgs {
    /// Worker threads [default: number of CPUs]
    #[arg(long, value_parser = threads_parser())]
    pub threads: Option<usize>,
    /// Number of mutexes the ops are spread over
    #[arg(long, default_value_t = 4, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub locks: usize,
    /// Hash iterations inside the lock per op
    #[arg(long = "cs", default_value_t = 100)]
    pub critical_section: u64,
    /// Hash iterations outside the lock per op (what --phases work=N changes)
    #[arg(long, default_value_t = 1000, conflicts_with = "phases")]
    pub outside: u64,
    /// Total ops across all threads
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..), conflicts_with_all = ["duration", "phases"])]
    pub ops: u64,
    /// Run for this long instead of a fixed op count (seconds, or e.g. 500ms)
    #[arg(long, value_parser = parse_duration_arg, conflicts_with = "phases")]
    pub duration: Option<Duration>,
    /// Phase schedule setting the outside work, e.g. "work=200:3s,work=20000:3s"
    #[arg(long)]
    pub phases: Option<PhaseSpec>,
}

/// Barrier's `--phases`: a plain number of episodes or a phase schedule.
#[derive(Debug, Clone)]
pub enum BarrierPhases {
    Episodes(u64),
    Schedule(PhaseSpec),
}

impl FromStr for BarrierPhases {
    type Err = PhaseSpecError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().parse::<u64>() {
            Ok(0) => Err(PhaseSpecError::ZeroLength {
                value: text.to_string(),
            }),
            Ok(episodes) => Ok(Self::Episodes(episodes)),
            Err(_) => text.parse().map(Self::Schedule),
        }
    }
}

#[derive(Debug, Args)]
pub struct BarrierArgs {
    /// Worker threads [default: number of CPUs]
    #[arg(long, value_parser = threads_parser())]
    pub threads: Option<usize>,
    /// Number of barrier episodes, or a schedule such as "work=200:3s,work=20000:3s"
    #[arg(long, default_value = "1000")]
    pub phases: BarrierPhases,
    /// Hash iterations per thread per episode [default: 10000]
    #[arg(long)]
    pub work: Option<u64>,
    /// Run for this long instead of a fixed episode count (seconds, or e.g. 500ms)
    #[arg(long, value_parser = parse_duration_arg, conflicts_with = "phases")]
    pub duration: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct PingpongArgs {
    /// Number of round trips
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "duration")]
    pub rounds: u64,
    /// Run for this long instead of a fixed number of rounds (seconds, or e.g. 500ms)
    #[arg(long, value_parser = parse_duration_arg)]
    pub duration: Option<Duration>,
    /// Write the round trips done so far to FILE every 1,024 rounds: a progress counter for
    /// `gleaner run --progress-file FILE`
    #[arg(long, value_name = "FILE")]
    pub count_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct MessagingArgs {
    /// Groups of senders and receivers
    #[arg(long, default_value_t = 4, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000))]
    pub groups: usize,
    /// Senders per group, and receivers per group (each sender writes to every receiver)
    #[arg(long, default_value_t = 20, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000))]
    pub pairs: usize,
    /// Messages each sender sends each receiver of its group
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "duration")]
    pub loops: u64,
    /// Send for this long instead of a fixed number of loops (seconds, or e.g. 500ms)
    #[arg(long, value_parser = parse_duration_arg)]
    pub duration: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct MatmulArgs {
    /// Worker threads [default: number of CPUs]
    #[arg(long, value_parser = threads_parser())]
    pub threads: Option<usize>,
    /// Matrix side length
    #[arg(long, default_value_t = 128, value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_MATMUL_SIZE as u64))]
    pub size: usize,
    /// Total multiplications across all threads (instead of --duration)
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "duration")]
    pub reps: Option<u64>,
    /// How long to run (seconds, or e.g. 500ms) [default: 10]
    #[arg(long, value_parser = parse_duration_arg)]
    pub duration: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct FreqsleepArgs {
    /// Sleeping threads [default: number of CPUs]
    #[arg(long, value_parser = threads_parser())]
    pub threads: Option<usize>,
    /// How long to run (seconds, or e.g. 500ms)
    #[arg(long, default_value = "5", value_parser = parse_duration_arg)]
    pub duration: Duration,
}

const DEFAULT_BARRIER_WORK: u64 = 10_000;
const DEFAULT_MATMUL_DURATION: Duration = Duration::from_secs(10);

fn cpu_count() -> usize {
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

/// `--phases` wins; otherwise `--duration`; otherwise the count option.
fn resolve_phases(
    phases: &Option<PhaseSpec>,
    duration: Option<Duration>,
    work: u64,
    count: u64,
) -> Result<PhaseSpec, PhaseSpecError> {
    match (phases, duration) {
        (Some(spec), _) => Ok(spec.clone()),
        (None, Some(duration)) => PhaseSpec::single(work, Length::Duration(duration)),
        (None, None) => PhaseSpec::single(work, Length::Count(count)),
    }
}

impl PipelineArgs {
    pub fn to_config(&self) -> anyhow::Result<PipelineConfig> {
        Ok(PipelineConfig {
            stages: self.stages,
            threads_per_stage: self.threads_per_stage,
            queue_capacity: self.queue,
            phases: resolve_phases(&self.phases, self.duration, self.work, self.items)?,
        })
    }
}

impl MutexArgs {
    pub fn to_config(&self) -> anyhow::Result<MutexConfig> {
        Ok(MutexConfig {
            threads: self.threads.unwrap_or_else(cpu_count),
            locks: self.locks,
            critical_section: self.critical_section,
            phases: resolve_phases(&self.phases, self.duration, self.outside, self.ops)?,
        })
    }
}

impl BarrierArgs {
    pub fn to_config(&self) -> anyhow::Result<BarrierConfig> {
        let work = self.work.unwrap_or(DEFAULT_BARRIER_WORK);
        let phases = match (&self.phases, self.duration) {
            (BarrierPhases::Schedule(_), _) if self.work.is_some() => {
                bail!("--work cannot be combined with a --phases schedule; put the work in the schedule, e.g. work=2000:3s")
            }
            (BarrierPhases::Schedule(spec), _) => spec.clone(),
            (BarrierPhases::Episodes(_), Some(duration)) => {
                PhaseSpec::single(work, Length::Duration(duration))?
            }
            (BarrierPhases::Episodes(episodes), None) => {
                PhaseSpec::single(work, Length::Count(*episodes))?
            }
        };
        Ok(BarrierConfig {
            threads: self.threads.unwrap_or_else(cpu_count),
            phases,
        })
    }
}

impl PingpongArgs {
    pub fn to_config(&self) -> PingpongConfig {
        let length = self
            .duration
            .map_or(Length::Count(self.rounds), Length::Duration);
        PingpongConfig {
            length,
            count_file: self.count_file.clone(),
        }
    }
}

impl MessagingArgs {
    pub fn to_config(&self) -> MessagingConfig {
        let length = self
            .duration
            .map_or(Length::Count(self.loops), Length::Duration);
        MessagingConfig {
            groups: self.groups,
            pairs: self.pairs,
            length,
        }
    }
}

impl MatmulArgs {
    pub fn to_config(&self) -> MatmulConfig {
        let length = match (self.reps, self.duration) {
            (Some(reps), _) => Length::Count(reps),
            (None, duration) => Length::Duration(duration.unwrap_or(DEFAULT_MATMUL_DURATION)),
        };
        MatmulConfig {
            threads: self.threads.unwrap_or_else(cpu_count),
            size: self.size,
            length,
        }
    }
}

impl FreqsleepArgs {
    pub fn to_config(&self) -> FreqsleepConfig {
        FreqsleepConfig {
            threads: self.threads.unwrap_or_else(cpu_count),
            duration: self.duration,
        }
    }
}

/// Runs the selected workload and returns its report without printing.
pub fn run_workload(command: &WorkloadCommand) -> anyhow::Result<Report> {
    let report = match command {
        WorkloadCommand::Pipeline(args) => pipeline(&args.to_config()?)?,
        WorkloadCommand::Mutex(args) => mutex(&args.to_config()?)?,
        WorkloadCommand::Barrier(args) => barrier(&args.to_config()?)?,
        WorkloadCommand::Pingpong(args) => pingpong(&args.to_config())?,
        WorkloadCommand::Messaging(args) => messaging(&args.to_config())?,
        WorkloadCommand::Matmul(args) => matmul(&args.to_config())?,
        WorkloadCommand::Freqsleep(args) => freqsleep(&args.to_config())?,
    };
    Ok(report)
}

/// Entry point for `gleaner workload`: runs the workload and prints one line
/// (human-readable, or JSON with `--json`) to stdout.
pub fn run(args: WorkloadArgs) -> anyhow::Result<()> {
    let report = run_workload(&args.workload)?;
    if args.json {
        println!("{}", report.to_json()?);
    } else {
        println!("{report}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct TestCli {
        #[command(flatten)]
        args: WorkloadArgs,
    }

    fn parse(args: &[&str]) -> Result<WorkloadArgs, clap::Error> {
        TestCli::try_parse_from(std::iter::once("workload").chain(args.iter().copied()))
            .map(|c| c.args)
    }

    #[test]
    fn pipeline_defaults_and_phases() {
        let args = parse(&["pipeline"]).unwrap();
        let WorkloadCommand::Pipeline(p) = &args.workload else {
            panic!("wrong subcommand")
        };
        let cfg = p.to_config().unwrap();
        assert_eq!(
            (cfg.stages, cfg.threads_per_stage, cfg.queue_capacity),
            (3, 2, 16)
        );
        assert_eq!(cfg.phases.phases()[0].length, Length::Count(20_000));
        assert_eq!(cfg.phases.phases()[0].work, 500);

        let args = parse(&["pipeline", "--phases", "fine:5s,coarse:5s", "--json"]).unwrap();
        assert!(args.json);
        let WorkloadCommand::Pipeline(p) = &args.workload else {
            panic!("wrong subcommand")
        };
        assert!(p.to_config().unwrap().phases.is_timed());

        let args = parse(&["pipeline", "--duration", "2", "--work", "5000"]).unwrap();
        let WorkloadCommand::Pipeline(p) = &args.workload else {
            panic!("wrong subcommand")
        };
        let cfg = p.to_config().unwrap();
        assert_eq!(
            cfg.phases.phases()[0].length,
            Length::Duration(Duration::from_secs(2))
        );
        assert_eq!(cfg.phases.phases()[0].work, 5000);
    }

    #[test]
    fn invalid_arguments_are_rejected_by_clap() {
        for bad in [
            &["pipeline", "--stages", "0"][..],
            &["pipeline", "--items", "0"],
            &["pipeline", "--items", "5", "--duration", "1"],
            &["pipeline", "--phases", "fine:1s", "--work", "10"],
            &["pipeline", "--phases", "bogus:5s"],
            &["pipeline", "--queue", "-1"],
            &["mutex", "--threads", "0"],
            &["mutex", "--threads", "abc"],
            &["mutex", "--ops", "5", "--phases", "work=1:1s"],
            &["barrier", "--phases", "0"],
            &["barrier", "--phases", "10", "--duration", "1"],
            &["pingpong", "--rounds", "3", "--duration", "1"],
            &["pingpong", "--duration", "-2"],
            &["matmul", "--size", "0"],
            &["matmul", "--reps", "2", "--duration", "1"],
            &["freqsleep", "--duration", "0"],
            &["nosuchworkload"],
        ] {
            let error = parse(bad).expect_err(&format!("{bad:?} should be rejected"));
            assert_ne!(error.exit_code(), 0, "{bad:?}");
        }
    }

    #[test]
    fn barrier_phases_accepts_count_or_schedule() {
        let args = parse(&["barrier", "--threads", "2", "--phases", "50", "--work", "7"]).unwrap();
        let WorkloadCommand::Barrier(b) = &args.workload else {
            panic!("wrong subcommand")
        };
        let cfg = b.to_config().unwrap();
        assert_eq!(cfg.phases.phases()[0].length, Length::Count(50));
        assert_eq!(cfg.phases.phases()[0].work, 7);

        let args = parse(&["barrier", "--duration", "500ms"]).unwrap();
        let WorkloadCommand::Barrier(b) = &args.workload else {
            panic!("wrong subcommand")
        };
        let cfg = b.to_config().unwrap();
        assert_eq!(
            cfg.phases.phases()[0].length,
            Length::Duration(Duration::from_millis(500))
        );
        assert_eq!(cfg.phases.phases()[0].work, DEFAULT_BARRIER_WORK);

        let args = parse(&["barrier", "--phases", "work=200:3s,work=20000:3s"]).unwrap();
        let WorkloadCommand::Barrier(b) = &args.workload else {
            panic!("wrong subcommand")
        };
        assert_eq!(b.to_config().unwrap().phases.phases().len(), 2);

        let args = parse(&["barrier", "--phases", "work=200:3s", "--work", "5"]).unwrap();
        let WorkloadCommand::Barrier(b) = &args.workload else {
            panic!("wrong subcommand")
        };
        let message = b.to_config().unwrap_err().to_string();
        assert!(message.contains("--work") && !message.contains('\n'));
    }

    #[test]
    fn matmul_defaults_to_a_timed_run() {
        let args = parse(&["matmul"]).unwrap();
        let WorkloadCommand::Matmul(m) = &args.workload else {
            panic!("wrong subcommand")
        };
        assert_eq!(
            m.to_config().length,
            Length::Duration(DEFAULT_MATMUL_DURATION)
        );
        let args = parse(&["matmul", "--reps", "3", "--threads", "2"]).unwrap();
        let WorkloadCommand::Matmul(m) = &args.workload else {
            panic!("wrong subcommand")
        };
        let cfg = m.to_config();
        assert_eq!((cfg.length, cfg.threads), (Length::Count(3), 2));
    }

    #[test]
    fn tiny_runs_through_the_cli_path() {
        for command in [
            &["pipeline", "--items", "50", "--stages", "2", "--work", "10"][..],
            &[
                "mutex",
                "--threads",
                "2",
                "--ops",
                "100",
                "--outside",
                "10",
                "--cs",
                "5",
            ],
            &[
                "barrier",
                "--threads",
                "2",
                "--phases",
                "20",
                "--work",
                "10",
            ],
            &["pingpong", "--rounds", "20"],
            &["matmul", "--threads", "2", "--size", "4", "--reps", "3"],
            &["freqsleep", "--threads", "1", "--duration", "10ms"],
        ] {
            let args = parse(command).unwrap();
            let report = run_workload(&args.workload).unwrap();
            assert_eq!(report.workload, command[0]);
        }
    }
}
