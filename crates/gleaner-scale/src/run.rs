//! Runs the measured program on a chosen set of CPUs and collects its counters.
//!
//! The child is forked by hand rather than through `std::process::Command`
//! because the counters must be attached *before* the program starts, the way
//! `perf stat` does it: the child sets its CPU affinity (the same mechanism as
//! Gleaner's affinity back end), then blocks on a pipe; the parent opens
//! `perf_event_open` counters on the child's pid with `inherit` (so every
//! thread and subprocess it creates is counted) and `enable_on_exec`, then
//! releases it. `std`'s `spawn` waits for `exec` to succeed, so a child that
//! waits for its parent inside `pre_exec` would deadlock it.
//!
//! Context switches per kind come from `wait4`'s rusage of that one child,
//! which works without any perf support; software perf events add total
//! switches, migrations and task clock; hardware events are used where the
//! CPU exposes them.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Instant;

use gleaner_sys::affinity::CpuMask;
use nix::fcntl::OFlag;
use nix::sys::signal::{kill, Signal};
use nix::unistd::{ForkResult, Pid};
use perf_event::events::{Cache, CacheId, CacheOp, CacheResult, Hardware, Software};
use perf_event::{Builder, Counter};
use serde::Serialize;

use crate::error::ScaleError;
use crate::system::{read_steal_ns, IdleCounter, SystemRoots};

/// Software perf events counted for the child and all its descendants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SoftwareEvent {
    ContextSwitches,
    CpuMigrations,
    /// CPU time in nanoseconds.
    TaskClock,
}

impl SoftwareEvent {
    pub const ALL: [Self; 3] = [Self::ContextSwitches, Self::CpuMigrations, Self::TaskClock];

    fn builder(self) -> Builder<'static> {
        Builder::new(match self {
            Self::ContextSwitches => Software::CONTEXT_SWITCHES,
            Self::CpuMigrations => Software::CPU_MIGRATIONS,
            Self::TaskClock => Software::TASK_CLOCK,
        })
    }
}

/// Whether a hardware event measures the work itself or the cost of running it,
/// following the payload/overhead split of the many-core PThreads study.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventRole {
    /// Data misses: caused by the algorithm touching its data.
    Payload,
    /// Instruction and TLB misses: needed only to let threads make progress.
    Overhead,
    /// Context for the others (instructions, cycles, LLC misses).
    Context,
}

/// Hardware events, where the CPU (or hypervisor) exposes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HardwareEvent {
    Instructions,
    Cycles,
    L1dMisses,
    L1iMisses,
    DtlbMisses,
    ItlbMisses,
    LlcMisses,
}

impl HardwareEvent {
    pub const ALL: [Self; 7] = [
        Self::Instructions,
        Self::Cycles,
        Self::L1dMisses,
        Self::L1iMisses,
        Self::DtlbMisses,
        Self::ItlbMisses,
        Self::LlcMisses,
    ];

    pub fn role(self) -> EventRole {
        match self {
            Self::L1dMisses => EventRole::Payload,
            Self::L1iMisses | Self::DtlbMisses | Self::ItlbMisses => EventRole::Overhead,
            Self::Instructions | Self::Cycles | Self::LlcMisses => EventRole::Context,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Instructions => "instructions",
            Self::Cycles => "cycles",
            Self::L1dMisses => "L1d misses",
            Self::L1iMisses => "L1i misses",
            Self::DtlbMisses => "dTLB misses",
            Self::ItlbMisses => "iTLB misses",
            Self::LlcMisses => "LLC misses",
        }
    }

    fn builder(self) -> Builder<'static> {
        let read_miss = |which| Cache {
            which,
            operation: CacheOp::READ,
            result: CacheResult::MISS,
        };
        match self {
            Self::Instructions => Builder::new(Hardware::INSTRUCTIONS),
            Self::Cycles => Builder::new(Hardware::CPU_CYCLES),
            Self::L1dMisses => Builder::new(read_miss(CacheId::L1D)),
            Self::L1iMisses => Builder::new(read_miss(CacheId::L1I)),
            Self::DtlbMisses => Builder::new(read_miss(CacheId::DTLB)),
            Self::ItlbMisses => Builder::new(read_miss(CacheId::ITLB)),
            Self::LlcMisses => Builder::new(read_miss(CacheId::LL)),
        }
    }
}

/// Which perf events this machine lets us open, decided once before any run so
/// that a missing facility is reported once rather than per run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CounterPlan {
    pub software: Vec<SoftwareEvent>,
    pub hardware: Vec<HardwareEvent>,
    /// Hardware events count user space only (the kernel refused kernel counting).
    pub hardware_user_only: bool,
    /// One line per unavailable facility, saying what is used instead.
    pub notes: Vec<String>,
}

impl CounterPlan {
    /// Tries each event on this process (disabled, closed again at once).
    pub fn probe() -> Self {
        let mut plan = Self::default();
        let mut software_errors = Vec::new();
        for event in SoftwareEvent::ALL {
            match event.builder().exclude_kernel(false).build() {
                Ok(_) => plan.software.push(event),
                Err(err) => software_errors.push(err),
            }
        }
        if let Some(err) = software_errors.first() {
            plan.notes.push(format!(
                "software perf events unavailable ({err}); context switches come from getrusage{}",
                permission_hint(err)
            ));
        }

        let mut hardware_errors: Vec<(HardwareEvent, std::io::Error)> = Vec::new();
        for event in HardwareEvent::ALL {
            let opened = event
                .builder()
                .exclude_kernel(false)
                .build()
                .or_else(|err| {
                    if err.raw_os_error() == Some(libc::EACCES) {
                        plan.hardware_user_only = true;
                        event.builder().exclude_kernel(true).build()
                    } else {
                        Err(err)
                    }
                });
            match opened {
                Ok(_) => plan.hardware.push(event),
                Err(err) => hardware_errors.push((event, err)),
            }
        }
        if plan.hardware.is_empty() {
            if let Some((_, err)) = hardware_errors.first() {
                plan.notes.push(format!(
                    "hardware counters unavailable on this CPU (perf_event_open: {err}); \
                     using software events, rusage and idle counters only{}",
                    permission_hint(err)
                ));
            }
        } else if !hardware_errors.is_empty() {
            let missing: Vec<&str> = hardware_errors
                .iter()
                .map(|(event, _)| event.label())
                .collect();
            plan.notes.push(format!(
                "hardware events not supported here: {}",
                missing.join(", ")
            ));
        }
        if plan.hardware_user_only && !plan.hardware.is_empty() {
            plan.notes.push(
                "hardware counters count user space only (kernel.perf_event_paranoid); run as root for full counts"
                    .to_string(),
            );
        }
        plan
    }
}

fn permission_hint(err: &std::io::Error) -> &'static str {
    match err.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            " (run as root or set kernel.perf_event_paranoid to 1 or less)"
        }
        _ => "",
    }
}

/// A command resolved once, before any fork, so the child only calls `execv`.
#[derive(Debug)]
pub struct PreparedCommand {
    pub display: String,
    path: CString,
    argv: Vec<CString>,
}

impl PreparedCommand {
    pub fn new(command: &[String]) -> Result<Self, ScaleError> {
        let program = command.first().ok_or(ScaleError::MissingCommand)?;
        let path =
            resolve_program(program, std::env::var_os("PATH").as_deref()).ok_or_else(|| {
                ScaleError::CommandNotFound {
                    program: program.clone(),
                }
            })?;
        let to_cstring = |text: &str| {
            CString::new(text).map_err(|_| ScaleError::NulInArgument {
                argument: text.to_string(),
            })
        };
        let argv = command
            .iter()
            .map(|arg| to_cstring(arg))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            display: command.join(" "),
            path: to_cstring(&path.to_string_lossy())?,
            argv,
        })
    }
}

/// Finds `program` like a shell does: a name with a slash is used as given,
/// anything else is looked up in `PATH`. Only executable regular files match.
fn resolve_program(program: &str, path_var: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |candidate: &Path| {
        candidate
            .metadata()
            .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.is_empty() {
        return None;
    }
    if program.contains('/') {
        let candidate = PathBuf::from(program);
        return executable(&candidate).then_some(candidate);
    }
    std::env::split_paths(path_var?)
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate))
}

/// Everything measured about one run of the program.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub wall_s: f64,
    /// User + system CPU time of the child and its descendants (rusage).
    pub cpu_s: f64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// Software perf events that could be opened for this run.
    pub software: BTreeMap<SoftwareEvent, u64>,
    /// Hardware perf events, scaled for multiplexing.
    pub hardware: BTreeMap<HardwareEvent, u64>,
    /// Idle entries on the run's CPUs during the run (system-wide, so other
    /// activity on those CPUs counts too).
    pub idle_entries: Option<u64>,
    /// Steal time on the run's CPUs during the run.
    pub steal_s: Option<f64>,
    #[serde(skip)]
    pub exit_status: ExitStatus,
    /// The figure read from the program's output in throughput mode (`--metric`).
    pub metric: Option<f64>,
    /// The tail of the program's stdout (see [`OutputCollector`]); emptied once read.
    #[serde(skip)]
    pub stdout: Vec<u8>,
}

/// Keeps at most this much of a run's stdout (its tail, where summaries are).
const STDOUT_KEEP_BYTES: usize = 4 << 20;
/// How long to wait for stdout to close after the child exited: a background
/// process it left behind may hold the pipe open indefinitely.
const STDOUT_DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads the child's stdout on a thread while the parent waits for the child,
/// so a chatty program never blocks on a full pipe. Keeps the last
/// [`STDOUT_KEEP_BYTES`] and, with `--show-output`, copies everything to stderr.
struct OutputCollector {
    buffer: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    closed: std::sync::mpsc::Receiver<()>,
}

impl OutputCollector {
    fn start(pipe: OwnedFd, echo_to_stderr: bool) -> Self {
        use std::io::{Read, Write};
        let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (closed_tx, closed) = std::sync::mpsc::channel();
        let shared = std::sync::Arc::clone(&buffer);
        std::thread::spawn(move || {
            let mut pipe = std::fs::File::from(pipe);
            let mut chunk = [0u8; 16 * 1024];
            loop {
                let read = match pipe.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(read) => read,
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                if echo_to_stderr {
                    // A closed stderr must not stop the collection.
                    let _ = std::io::stderr().write_all(&chunk[..read]);
                }
                let Ok(mut kept) = shared.lock() else { break };
                kept.extend_from_slice(&chunk[..read]);
                if kept.len() > 2 * STDOUT_KEEP_BYTES {
                    let cut = kept.len() - STDOUT_KEEP_BYTES;
                    kept.drain(..cut);
                }
            }
            let _ = closed_tx.send(());
        });
        Self { buffer, closed }
    }

    /// What was read by the time stdout closed (or [`STDOUT_DRAIN_WAIT`] after
    /// the child exited, if something else still holds it open).
    fn finish(self) -> Vec<u8> {
        let _ = self.closed.recv_timeout(STDOUT_DRAIN_WAIT);
        match self.buffer.lock() {
            Ok(mut kept) => std::mem::take(&mut *kept),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }
}

/// Runs commands and gathers the counters chosen up front.
pub struct Runner {
    pub roots: SystemRoots,
    pub plan: CounterPlan,
    pub show_output: bool,
}

impl Runner {
    pub fn new(roots: SystemRoots, plan: CounterPlan, show_output: bool) -> Self {
        Self {
            roots,
            plan,
            show_output,
        }
    }

    /// Runs `command` once with its affinity set to `cpus` and returns what was
    /// measured; `idle` must have been opened on (at least) `cpus`.
    pub fn measure(
        &self,
        command: &PreparedCommand,
        cpus: &[usize],
        idle: &mut IdleCounter,
    ) -> Result<Measurement, ScaleError> {
        // Built here: applying it after the fork must not allocate.
        let cpu_mask = CpuMask::new(&cpus.iter().copied().collect());
        let (go_read, go_write) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|source| ScaleError::Os {
                what: "creating the start pipe",
                source,
            })?;
        let (error_read, error_write) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|source| ScaleError::Os {
                what: "creating the exec-error pipe",
                source,
            })?;
        // Always captured: throughput mode reads the metric from it, and wall-time
        // mode looks in it for a known benchmark to name in its fixed-time warning.
        let (stdout_read, stdout_target) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|source| ScaleError::Os {
                what: "creating the child's stdout pipe",
                source,
            })?;
        let mut argv_pointers: Vec<*const libc::c_char> =
            command.argv.iter().map(|arg| arg.as_ptr()).collect();
        argv_pointers.push(std::ptr::null());

        // SAFETY: the child branch only makes async-signal-safe system calls on
        // data prepared above and never returns (it execs or `_exit`s).
        let fork = unsafe { nix::unistd::fork() }.map_err(|source| ScaleError::Os {
            what: "fork",
            source,
        })?;
        let child = match fork {
            ForkResult::Child => child_after_fork(ChildSetup {
                cpu_mask: &cpu_mask,
                go_read: &go_read,
                error_write: &error_write,
                stdout_target: &stdout_target,
                path: &command.path,
                argv: &argv_pointers,
            }),
            ForkResult::Parent { child } => child,
        };
        drop((go_read, error_write, stdout_target));
        let mut guard = ChildGuard {
            pid: child,
            reaped: false,
        };
        let stdout = OutputCollector::start(stdout_read, self.show_output);

        let software =
            self.open_counters(child, &self.plan.software, |event| event.builder(), false);
        let hardware = self.open_counters(
            child,
            &self.plan.hardware,
            |event| event.builder(),
            self.plan.hardware_user_only,
        );
        let idle_before = idle.total(cpus);
        let steal_before = read_steal_ns(&self.roots, cpus).ok();

        let started = Instant::now();
        nix::unistd::write(&go_write, &[1]).map_err(|source| ScaleError::Os {
            what: "starting the child",
            source,
        })?;
        drop(go_write);
        if let Some(exec_error) = read_exec_error(&error_read)? {
            guard.reap()?;
            return Err(exec_error.into_error(&command.display));
        }
        let (status, usage) = guard.reap()?;
        let wall_s = started.elapsed().as_secs_f64();
        let stdout = stdout.finish();

        let idle_entries = idle_before
            .zip(idle.total(cpus))
            .map(|(before, after)| after.saturating_sub(before));
        let steal_after = read_steal_ns(&self.roots, cpus).ok();
        let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
        Ok(Measurement {
            wall_s,
            cpu_s: seconds(usage.ru_utime) + seconds(usage.ru_stime),
            voluntary_switches: usage.ru_nvcsw.max(0) as u64,
            involuntary_switches: usage.ru_nivcsw.max(0) as u64,
            software: read_counters(software),
            hardware: read_counters(hardware),
            idle_entries,
            steal_s: steal_before
                .zip(steal_after)
                .map(|(before, after)| after.saturating_sub(before) as f64 / 1e9),
            exit_status: status,
            metric: None,
            stdout,
        })
    }

    /// Opens one inherited, enable-on-exec counter per event on `pid`. An event
    /// that fails here (it passed the probe) is simply absent from this run.
    fn open_counters<E: Copy>(
        &self,
        pid: Pid,
        events: &[E],
        builder: impl Fn(E) -> Builder<'static>,
        user_only: bool,
    ) -> Vec<(E, Counter)> {
        events
            .iter()
            .filter_map(|&event| {
                builder(event)
                    .observe_pid(pid.as_raw())
                    .any_cpu()
                    .inherit(true)
                    .enable_on_exec(true)
                    .exclude_kernel(user_only)
                    .exclude_hv(true)
                    .build()
                    .ok()
                    .map(|counter| (event, counter))
            })
            .collect()
    }
}

/// Reads each counter, scaling by enabled/running time when the kernel multiplexed it.
fn read_counters<E: Ord>(counters: Vec<(E, Counter)>) -> BTreeMap<E, u64> {
    counters
        .into_iter()
        .filter_map(|(event, mut counter)| {
            let reading = counter.read_count_and_time().ok()?;
            let count = if reading.time_running > 0 && reading.time_running < reading.time_enabled {
                (reading.count as u128 * reading.time_enabled as u128
                    / reading.time_running as u128) as u64
            } else {
                reading.count
            };
            Some((event, count))
        })
        .collect()
}

/// What the child needs between fork and exec, all prepared by the parent.
struct ChildSetup<'a> {
    cpu_mask: &'a CpuMask,
    go_read: &'a OwnedFd,
    error_write: &'a OwnedFd,
    stdout_target: &'a OwnedFd,
    path: &'a CStr,
    argv: &'a [*const libc::c_char],
}

/// Stage codes the child reports through the exec-error pipe.
const STAGE_AFFINITY: u32 = 1;
const STAGE_EXEC: u32 = 2;

fn child_after_fork(setup: ChildSetup<'_>) -> ! {
    let report = |stage: u32, errno: i32| {
        let mut message = [0u8; 8];
        message[..4].copy_from_slice(&stage.to_ne_bytes());
        message[4..].copy_from_slice(&errno.to_ne_bytes());
        let _ = nix::unistd::write(setup.error_write, &message);
        // SAFETY: `_exit` skips atexit handlers and destructors, which must not
        // run in a forked copy of the parent.
        unsafe { libc::_exit(127) }
    };
    if let Err(e) = setup.cpu_mask.apply(0) {
        report(STAGE_AFFINITY, e.raw_os_error().unwrap_or(0));
    }
    let mut go = [0u8; 1];
    // EOF (the parent gave up before releasing us) or an error: exit quietly.
    if !matches!(nix::unistd::read(setup.go_read.as_raw_fd(), &mut go), Ok(1)) {
        // SAFETY: as above.
        unsafe { libc::_exit(127) }
    }
    // SAFETY: plain syscalls on descriptors and NUL-terminated strings owned by
    // the parent's stack frame, which the fork copied.
    unsafe {
        libc::dup2(setup.stdout_target.as_raw_fd(), libc::STDOUT_FILENO);
        libc::execv(setup.path.as_ptr(), setup.argv.as_ptr());
    }
    report(STAGE_EXEC, nix::errno::Errno::last_raw())
}

struct ExecError {
    stage: u32,
    errno: i32,
}

impl ExecError {
    fn into_error(self, program: &str) -> ScaleError {
        let source = nix::errno::Errno::from_raw(self.errno);
        match self.stage {
            STAGE_AFFINITY => ScaleError::Os {
                what: "setting the child's CPU affinity",
                source,
            },
            _ => ScaleError::Exec {
                program: program.to_string(),
                source: std::io::Error::from_raw_os_error(self.errno),
            },
        }
    }
}

/// Reads the child's failure report; EOF means `execv` succeeded (the pipe is close-on-exec).
fn read_exec_error(error_read: &OwnedFd) -> Result<Option<ExecError>, ScaleError> {
    let mut message = [0u8; 8];
    let mut filled = 0;
    while filled < message.len() {
        match nix::unistd::read(error_read.as_raw_fd(), &mut message[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(source) => {
                return Err(ScaleError::Os {
                    what: "reading the exec-error pipe",
                    source,
                })
            }
        }
    }
    if filled < message.len() {
        return Ok(None);
    }
    let word = |range: std::ops::Range<usize>| {
        let mut bytes = [0u8; 4];
        bytes.copy_from_slice(&message[range]);
        bytes
    };
    Ok(Some(ExecError {
        stage: u32::from_ne_bytes(word(0..4)),
        errno: i32::from_ne_bytes(word(4..8)),
    }))
}

/// Owns the forked child: it is reaped on success and killed and reaped on any
/// early return, so no run leaves a stray or zombie process behind.
struct ChildGuard {
    pid: Pid,
    reaped: bool,
}

impl ChildGuard {
    fn reap(&mut self) -> Result<(ExitStatus, libc::rusage), ScaleError> {
        let mut status = 0;
        // SAFETY: rusage is plain old data; zeroed is a valid value.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: valid pointers to locals; `pid` is our own child.
            let result = unsafe { libc::wait4(self.pid.as_raw(), &mut status, 0, &mut usage) };
            if result == self.pid.as_raw() {
                self.reaped = true;
                return Ok((ExitStatus::from_raw(status), usage));
            }
            let errno = nix::errno::Errno::last();
            if errno != nix::errno::Errno::EINTR {
                return Err(ScaleError::Os {
                    what: "waiting for the child",
                    source: errno,
                });
            }
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = kill(self.pid, Signal::SIGKILL);
            let _ = self.reap();
        }
    }
}

#[cfg(test)]
mod tests;
