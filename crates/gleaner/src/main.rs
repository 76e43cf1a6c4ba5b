//! `gleaner`: the command line. Thin on purpose: each subcommand parses its flags and hands
//! over to the crate that does the work.

mod man;

use gleaner_daemon::{config, daemon, probe, service, status};
use gleaner_sys::one_line;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "gleaner", version, about = "Mitigates the blocked-waiter wakeup problem in multicore VMs", long_about = None)]
struct Cli {
    /// Log format on stderr
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log level filter (e.g. info, debug, gleaner_linux=debug) [default: info, or $GLEANER_LOG]
    #[arg(long, global = true)]
    log: Option<String>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command under Gleaner and exit with its exit code
    Run {
        #[command(flatten)]
        flags: config::DaemonFlags,
        /// The workload: `gleaner run [OPTIONS] -- CMD ARGS...`
        #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
        command: Vec<OsString>,
    },
    /// Manage a running process tree (by thread affinity) or an existing cpuset cgroup
    Attach {
        #[command(flatten)]
        flags: config::DaemonFlags,
        /// Process whose whole tree is managed
        #[arg(required_unless_present = "cgroup", conflicts_with = "cgroup")]
        pid: Option<u32>,
        /// Existing cgroup directory (v1 cpuset or v2 with cpuset enabled)
        #[arg(long, value_name = "PATH")]
        cgroup: Option<PathBuf>,
        /// Allow PID 1, a kernel thread or an ancestor of gleaner: confines that process's
        /// whole tree (for PID 1, every process on the machine)
        #[arg(long, requires = "pid")]
        system_process: bool,
    },
    /// Run as a system service managing the cgroups in a config file, with metrics
    Daemon(service::ServiceArgs),
    /// Show the live state of running instances
    Status(status::StatusArgs),
    /// Undo what an instance that died together with its guard left behind
    Recover {
        /// Directory of crash journals [default: /run/gleaner, or $XDG_RUNTIME_DIR/gleaner]
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Measure wake-up latency on this machine (the paper's Table 2)
    Probe(probe::ProbeArgs),
    /// Run a bundled workload
    Workload(gleaner_workloads::WorkloadArgs),
    /// Diagnose why a program stops scaling with more CPUs
    Scale(gleaner_scale::ScaleArgs),
    /// Simulate hypervisor + guest scheduling with Gleaner's policy (scenario TOML)
    Sim(gleaner_sim::SimArgs),
    #[command(name = "__guard", hide = true)]
    Guard { journal: PathBuf },
    /// Print idle entries per CPU as a JSON line now and after each line read on stdin, until
    /// stdin closes (how the bench harness counts idle entries: bench/harness/idle.py)
    #[command(name = "__idle-entries", hide = true)]
    IdleEntries {
        #[arg(long, value_name = "DIR", default_value = "/sys")]
        sys_root: PathBuf,
        #[arg(long, value_name = "DIR", default_value = "/proc")]
        proc_root: PathBuf,
    },
    /// Write the man pages (generated from these definitions) into DIR
    #[command(hide = true)]
    Man {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// Where `gleaner sim lab` runs, for its results files: read through gleaner-linux's readers.
fn lab_machine() -> gleaner_sim::lab::Machine {
    let procfs = gleaner_linux::procfs::ProcFs::new("/proc");
    let sysfs = gleaner_linux::sysfs::SysFs::new("/sys");
    gleaner_sim::lab::Machine {
        kernel: procfs.kernel_release().ok(),
        cpuidle_driver: sysfs
            .cpuidle_driver()
            .ok()
            .map(|d| d.unwrap_or_else(|| "none".into())),
        loadavg_at_start: procfs.loadavg().ok().map(|l| [l.one, l.five, l.fifteen]),
        ..gleaner_sim::lab::Machine::here()
    }
}

fn main() -> ExitCode {
    // A bug must not print a backtrace at a user; the restore paths still run on unwind.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned());
        gleaner_daemon::logging::print_unstructured(&format!(
            "gleaner: internal error: {} (please report this)",
            msg.unwrap_or_else(|| "panic".into())
        ));
    }));
    let cli = Cli::parse();
    gleaner_daemon::logging::init(
        matches!(cli.log_format, LogFormat::Json),
        cli.log.as_deref(),
    );
    let result = match cli.command {
        Cmd::Run { flags, command } => daemon::manage(&flags, daemon::Target::Command(command)),
        Cmd::Attach {
            flags,
            pid,
            cgroup,
            system_process,
        } => match (pid, cgroup) {
            (Some(pid), _) => daemon::manage(
                &flags,
                daemon::Target::Pid {
                    pid,
                    system_ok: system_process,
                },
            ),
            (None, Some(dir)) => daemon::manage(&flags, daemon::Target::Cgroup(dir)),
            (None, None) => Err(anyhow::anyhow!("give a PID or --cgroup PATH")),
        },
        Cmd::Daemon(args) => service::run(
            args,
            service::ChildLogging {
                json: matches!(cli.log_format, LogFormat::Json),
                filter: cli.log.clone(),
            },
        ),
        Cmd::Status(args) => status::run(args).map(|_| 0),
        Cmd::Recover { state_dir } => daemon::recover(state_dir),
        Cmd::Probe(args) => probe::run(args).map(|_| 0),
        Cmd::Workload(args) => gleaner_workloads::run(args).map(|_| 0),
        Cmd::Scale(args) => gleaner_scale::run(args).map(|_| 0),
        Cmd::Sim(args) => gleaner_sim::run_with_machine(args, lab_machine).map(|_| 0),
        Cmd::Guard { journal } => daemon::guard_main(&journal),
        Cmd::IdleEntries {
            sys_root,
            proc_root,
        } => idle_entries(&sys_root, &proc_root),
        Cmd::Man { out } => man::write_pages(Cli::command(), &out).map(|files| {
            for f in files {
                gleaner_daemon::outln!("{}", f.display());
            }
            0
        }),
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            gleaner_daemon::logging::report_error(&one_line(&format!("{e:#}")));
            ExitCode::from(2)
        }
    }
}

/// `gleaner __idle-entries`: the bench harness counts idle entries through this, so the
/// kernel files behind them are parsed, and the best source chosen, only in
/// `gleaner_linux::idle_entries`. One counter stays open between readings because the
/// tracepoint source counts only while open.
fn idle_entries(sys_root: &Path, proc_root: &Path) -> anyhow::Result<i32> {
    use std::io::{BufRead, Write};
    let cpus: Vec<usize> = gleaner_linux::SysFs::new(sys_root)
        .online_cpus()?
        .iter()
        .collect();
    let mut counter =
        gleaner_linux::idle_entries::IdleEntryCounter::open(sys_root, proc_root, &cpus);
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    loop {
        let per_cpu: serde_json::Map<String, serde_json::Value> = cpus
            .iter()
            .zip(counter.read())
            .map(|(cpu, count)| (cpu.to_string(), count.into()))
            .collect();
        let reading = serde_json::json!({"source": counter.source(), "exact": counter.source().exact(), "per_cpu": per_cpu});
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{reading}")?;
        stdout.flush()?;
        line.clear();
        if stdin.read_line(&mut line)? == 0 {
            return Ok(0);
        }
    }
}
