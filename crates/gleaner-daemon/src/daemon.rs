//! `gleaner run` and `gleaner attach`: put a workload under Gleaner and keep it safe.
//!
//! The order of operations is the safety argument:
//! 1. the crash journal exists and the guard process watches us *before* anything changes;
//! 2. every change is journaled before it is made (the back ends do this);
//! 3. on any exit we restore through the same undo code, then delete the journal; if we die
//!    without running a destructor (SIGKILL, abort), the guard sees its pipe close and undoes
//!    the journal within milliseconds; if the guard dies too, `gleaner recover` does it.

use std::cell::Cell;
use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use gleaner_linux::cgroup::{
    enter_cgroup_pre_exec, prime_cgroup_moves, v1::V1Mounts, AffinityPlacement, CgroupMounts,
    CgroupPrimer, CgroupV1, CgroupV2,
};
use gleaner_linux::controller::{Controller, ControllerOptions, ExitWatch, Retainer, StopReason};
use gleaner_linux::journal::{self, Journal};
use gleaner_linux::pmqos::PollRetention;
use gleaner_linux::restore;
use gleaner_linux::retention::{LazyRetentionPool, YielderParams};
use gleaner_linux::sampler::Sampler;
use gleaner_linux::status::status_path;
use gleaner_linux::wakeprobe::{self, PmQosHook};
use gleaner_linux::{detect, Placement, PlacementEnv, PlacementKind, ProcFs, SharedJournal, SysFs};
use gleaner_policy::{Gleaner, Mode, RetentionTimeout};

use crate::calibration::{calibrate, entries_with, parse_cache, usable_entry, CacheEntry};
use crate::config::{BackendChoice, DaemonConfig, DaemonFlags, RetentionBackendChoice};

/// The signal that asked us to stop, 0 if none.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
}

fn install_stop_handlers() -> Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_stop_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }
            .with_context(|| format!("cannot install a {sig} handler"))?;
    }
    Ok(())
}

/// What is managed: a command we start, a process tree, or a cgroup.
pub enum Target {
    Command(Vec<OsString>),
    /// A running process tree; `system_ok` lets it be PID 1, a kernel thread or one of
    /// Gleaner's own ancestors (see [`refuse_system_process`]).
    Pid {
        pid: u32,
        system_ok: bool,
    },
    Cgroup(PathBuf),
}

/// Refuses a process whose tree is the whole system or holds Gleaner itself: confining PID 1
/// confines every process, a kernel thread's affinity is the kernel's business, and an
/// ancestor's tree contains the Gleaner instance and its guard.
pub fn refuse_system_process(proc: &ProcFs, pid: u32, own_pid: u32) -> Result<()> {
    const FLAG: &str = "pass --system-process if you mean to confine that whole process tree";
    if pid == 1 {
        bail!("PID 1 is init: managing it would confine every process on the machine; {FLAG}");
    }
    let stat = proc
        .task_stat(pid, pid)
        .with_context(|| format!("cannot read process {pid}"))?;
    // Kernel threads are kthreadd (PID 2) and its children.
    if pid == 2 || stat.ppid == 2 {
        bail!(
            "PID {pid} ({}) is a kernel thread, not a program Gleaner can manage; {FLAG}",
            stat.comm
        );
    }
    let mut p = own_pid;
    for _ in 0..4096 {
        if p == pid {
            bail!("PID {pid} ({}) is an ancestor of this gleaner: its tree contains Gleaner itself; {FLAG}", stat.comm);
        }
        match proc.task_stat(p, p) {
            Ok(st) if st.ppid > 1 => p = st.ppid,
            _ => break,
        }
    }
    Ok(())
}

/// Checks that we may change `pid`'s CPU affinity before anything is journaled: a change
/// journaled and then refused would leave a journal that `gleaner recover` can never clear.
/// Setting a thread's mask to what it already is checks the same permission and changes
/// nothing.
fn check_may_set_affinity(pid: u32) -> Result<()> {
    use gleaner_linux::cgroup::{AffinityOps, SchedAffinity};
    let current = SchedAffinity.get(pid)?.ok_or_else(|| {
        anyhow!("no process with PID {pid}: give the PID of a running process (see `ps`)")
    })?;
    match SchedAffinity.set(pid, &current) {
        Ok(_) => Ok(()),
        Err(gleaner_linux::Error::Affinity { errno: nix::errno::Errno::EPERM, .. }) => bail!(
            "not permitted to change the CPU affinity of PID {pid} (it belongs to another user): run gleaner as that user, or as root"
        ),
        Err(e) => Err(e.into()),
    }
}

/// Runs Gleaner on `target` until it ends or we are told to stop; returns the exit code.
pub fn manage(flags: &DaemonFlags, target: Target) -> Result<i32> {
    let cfg = flags.resolve()?;
    if let Target::Command(cmd) = &target {
        if cmd.is_empty() {
            bail!("no command given: use `gleaner run [OPTIONS] -- CMD ARGS...`");
        }
    }
    let proc = ProcFs::new("/proc");
    if let Target::Pid { pid, system_ok } = target {
        if proc.process_start_time(pid).is_err() {
            bail!("no process with PID {pid}: give the PID of a running process (see `ps`)");
        }
        if !system_ok {
            refuse_system_process(&proc, pid, std::process::id())?;
        }
        check_may_set_affinity(pid)?;
    }
    // Opened before anything starts or changes: an unopenable file is an error the user can
    // fix, not a reason to leave a started workload unmanaged.
    let timeline = match &cfg.timeline {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| {
                    format!(
                        "cannot open the timeline file {}: give --timeline a path you can write",
                        p.display()
                    )
                })?,
        ),
        None => None,
    };
    let detection = detect(&proc, Path::new("/")).context("cannot read /proc/self/mountinfo")?;
    let kind = choose_backend(cfg.backend, &detection, &target)?;
    // First, so that its wait passes while the guard starts, and kept up until the workload
    // has moved into its cgroup (see `prime_cgroup_moves`).
    let primer = match (&target, own_procs_file(&proc, &detection, kind)) {
        (Target::Command(_), Some(own_procs)) => prime_cgroup_moves(own_procs),
        _ => None,
    };
    let state_dir = cfg.state_dir.clone().unwrap_or_else(Journal::default_dir);
    let guarded = GuardedJournal::start(&state_dir)?;
    install_stop_handlers()?;

    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        manage_inner(
            &cfg, target, detection, kind, timeline, &proc, &guarded, &state_dir, primer,
        )
    }));
    // Back ends restored on their way out (drop runs during unwinding too); what they could
    // not restore is still in the journal: try once more, then leave it to the guard.
    let leftovers = guarded.finish();
    let _ = std::fs::remove_file(status_path(&state_dir, std::process::id()));
    let code = match outcome {
        Ok(r) => r?,
        Err(_) => {
            bail!("internal error (a bug, please report it); the workload's CPUs were restored")
        }
    };
    leftovers?;
    Ok(code)
}

#[allow(clippy::too_many_arguments)]
fn manage_inner(
    cfg: &DaemonConfig,
    target: Target,
    detection: gleaner_linux::Detection,
    kind: PlacementKind,
    timeline: Option<std::fs::File>,
    proc: &ProcFs,
    guarded: &GuardedJournal,
    state_dir: &Path,
    primer: Option<CgroupPrimer>,
) -> Result<i32> {
    let journal = guarded.journal();
    let env = PlacementEnv::real(Some(journal.clone()));
    if kind == PlacementKind::Affinity && !crate::config::is_root() {
        let why: Vec<String> = detection
            .skipped
            .iter()
            .map(|(k, w)| format!("{k}: {w}"))
            .collect();
        tracing::warn!(
            "not running as root: CPUs are confined by thread affinity ({}); off without root: cgroup placement and cpuacct per-CPU work, PM QoS poll retention, exact idle-entry counts (tracepoint, /proc/timer_list); see docs/SAFETY.md",
            why.join("; ")
        );
    }
    let costs = wake_costs(cfg, state_dir, journal);
    let timeout = costs.timeout;
    // Before the workload starts: the sampler then sees it from its first instruction, and
    // loading it (~10 ms of CPU, kernel BTF and the verifier) overlaps the grace period that
    // `prime_cgroup_moves` started, which the workload's move into its cgroup would otherwise
    // wait for.
    let prepared = Sampler::prepare(Path::new("/sys"), cfg.sampler.preference())
        .map_err(|why| anyhow!("--sampler bpf: {why}; use --sampler auto to fall back to /proc"))?;

    let mut child: Option<Child> = None;
    let mut placement: Box<dyn Placement> = match (&target, kind) {
        (Target::Command(cmd), PlacementKind::CgroupV2) => {
            let mount = detection
                .mounts
                .v2
                .clone()
                .ok_or_else(|| anyhow!("no cgroup2 mount"))?;
            let own = proc.own_cgroup()?.v2().unwrap_or("/").to_string();
            let parent = mount.join(own.trim_start_matches('/'));
            match CgroupV2::create(
                env.clone(),
                &mount,
                &parent,
                &std::process::id().to_string(),
                &[],
            ) {
                Ok(cg) => {
                    child = Some(spawn(cmd, Some(vec![cg.procs_file()]))?);
                    Box::new(cg)
                }
                // cgroup v2 allows no controller in the subtree of a cgroup that holds
                // processes (a systemd session scope, say): with `--backend auto` the
                // workload is confined by affinity instead, and the user is told why.
                Err(e) if cfg.backend == BackendChoice::Auto => {
                    tracing::warn!(
                        "cannot use a cgroup v2 cpuset here ({e}); using thread affinity"
                    );
                    let c = spawn(cmd, None)?;
                    let pid = c.id();
                    child = Some(c);
                    Box::new(AffinityPlacement::new(env, pid)?)
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e).context("cannot create the workload's cgroup"))
                }
            }
        }
        (Target::Command(cmd), PlacementKind::CgroupV1) => {
            let mounts = V1Mounts::from_detected(&detection.mounts)
                .ok_or_else(|| anyhow!("no cgroup v1 cpuset mount"))?;
            let own = proc.own_cgroup()?.v1("cpuset").unwrap_or("/").to_string();
            let cg = CgroupV1::create(env, mounts, &own, &std::process::id().to_string(), &[])
                .context("cannot create the workload's cgroup")?;
            child = Some(spawn(cmd, Some(cg.procs_files()))?);
            Box::new(cg)
        }
        (Target::Command(cmd), PlacementKind::Affinity) => {
            let c = spawn(cmd, None)?;
            let pid = c.id();
            child = Some(c);
            Box::new(AffinityPlacement::new(env, pid)?)
        }
        (Target::Pid { pid, .. }, _) => Box::new(AffinityPlacement::new(env, *pid)?),
        (Target::Cgroup(dir), PlacementKind::CgroupV2) => {
            let mount = detection
                .mounts
                .v2
                .clone()
                .ok_or_else(|| anyhow!("no cgroup2 mount"))?;
            Box::new(CgroupV2::attach(env, &mount, dir)?)
        }
        (Target::Cgroup(dir), _) => {
            let mounts = V1Mounts::from_detected(&detection.mounts)
                .ok_or_else(|| anyhow!("no cgroup v1 cpuset mount"))?;
            Box::new(CgroupV1::attach(env, mounts, dir)?)
        }
    };
    // The workload has moved into its cgroup: nothing more to keep warm.
    drop(primer);
    let allowed = placement.allowed().clone();
    tracing::info!(placement = %placement.kind(), allowed = %allowed, timeout_us = timeout.as_us_f64(), "managing workload");

    let mut policy_cfg = cfg.policy.clone();
    policy_cfg.retention_timeout = timeout;
    if policy_cfg.min_retain_idle_ns == 0 {
        policy_cfg.min_retain_idle_ns = costs.host_poll_ns;
    }
    if policy_cfg.probe_halted_wake_ns == 0 {
        policy_cfg.probe_halted_wake_ns = costs.halted_wake_ns;
    }
    let policy = Gleaner::new(policy_cfg, allowed.clone()).map_err(|e| anyhow!("{e}"))?;
    let wants_retention = !cfg.observe
        && matches!(
            cfg.policy.mode,
            Mode::Full | Mode::Retention | Mode::AlwaysYield
        );
    let mut poll = None;
    let mut pool = None;
    let mut retention_name = "none".to_string();
    if wants_retention {
        match choose_retention(cfg.retention_backend, &allowed, journal)? {
            Ok(p) => {
                poll = Some(p);
                retention_name = "poll".into();
            }
            Err(why) => {
                tracing::info!("retention by yielding threads: {why}");
                let notifier = guarded.guard_notifier();
                pool = Some(LazyRetentionPool::new(
                    &allowed,
                    YielderParams::default(),
                    Box::new(move || notifier.poll()),
                ));
                retention_name = "yield".into();
            }
        }
    }
    // Wake costs measured: no SCHED_IDLE thread of ours exists now, and the yielding pool,
    // if any, tells the guard before it starts one.
    guarded.guard_notifier().quiet();
    let retainer = match (&pool, &mut poll) {
        (Some(p), _) => Retainer::Yield(p),
        (None, Some(p)) => Retainer::Poll(p),
        _ => Retainer::None,
    };
    let command = match &target {
        Target::Command(c) => c
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        Target::Pid { pid, .. } => format!("pid {pid}"),
        Target::Cgroup(d) => format!("cgroup {}", d.display()),
    };
    let opts = ControllerOptions {
        period: Duration::from_millis(cfg.period_ms),
        observe: cfg.observe,
        sub_samples: 10,
        status_path: Some(status_path(state_dir, std::process::id())),
        timeline,
        command,
        placement_name: placement.kind().to_string(),
        retention_backend: retention_name,
        retention_timeout_source: costs.source.clone(),
        progress: cfg.progress_source().map(|source| {
            tracing::info!(
                "changes are judged by the application's progress, read from {source} once a period"
            );
            gleaner_linux::progress::ProgressReader::new(source)
        }),
    };
    let sampler = Sampler::from_prepared(ProcFs::new("/proc"), "/sys", allowed.clone(), prepared);

    let exited: Cell<Option<ExitStatus>> = Cell::new(None);
    let child_cell = std::cell::RefCell::new(child);
    let stop = || {
        if STOP_SIGNAL.load(Ordering::SeqCst) != 0 {
            return true;
        }
        if let Some(c) = child_cell.borrow_mut().as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                exited.set(Some(status));
                return true;
            }
        }
        false
    };
    let mut watch = match (&target, child_cell.borrow().as_ref()) {
        (_, Some(c)) => ExitWatch::process(c.id()),
        (Target::Pid { pid, .. }, None) => ExitWatch::process(*pid),
        _ => ExitWatch::signals_only(),
    };
    let (result, summary, final_status) = {
        let mut controller = Controller::new(policy, placement.as_mut(), retainer, sampler, opts);
        let result = controller.run(&stop, &mut watch);
        (result, controller.summary(), controller.status().clone())
    };
    // What Gleaner did and why, or why it did nothing: the user's first question.
    crate::errln!("{}", summary.trim_end());
    if cfg.observe {
        crate::errln!(
            "{}",
            crate::status::wake_latency_report(&final_status).trim_end()
        );
    }
    // Give everything back before reporting anything, error or not.
    let restored = placement.restore();
    if let Some(p) = &mut poll {
        let _ = p.restore();
    }
    if let Some(p) = pool.take() {
        p.stop();
    }
    // One line that says both what stopped Gleaner and, if anything, what is still left.
    let reason = match (result, restored) {
        (Ok(reason), Ok(())) => reason,
        (Err(e), Ok(())) => {
            return Err(anyhow::Error::new(e)
                .context("Gleaner stopped managing the workload; its CPUs were restored"))
        }
        (Err(e), Err(left)) => {
            return Err(anyhow::Error::new(e).context(format!("Gleaner stopped managing the workload but could not undo everything ({left}); run `gleaner recover` once that is fixed")));
        }
        (Ok(_), Err(left)) => {
            return Err(anyhow::Error::new(left)
                .context("could not restore every CPU setting; run `gleaner recover`"))
        }
    };
    let sig = STOP_SIGNAL.load(Ordering::SeqCst);
    let mut child = child_cell.into_inner();
    if exited.get().is_none() && sig != 0 {
        // Give a workload that got the same Ctrl-C a moment to exit, to report its status.
        if let Some(c) = child.as_mut() {
            for _ in 0..20 {
                if let Ok(Some(st)) = c.try_wait() {
                    exited.set(Some(st));
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(match (exited.get(), reason) {
        (Some(st), _) => exit_code(st),
        (None, StopReason::WorkloadGone) => 0,
        (None, StopReason::Requested) => {
            if child.is_some() {
                tracing::warn!(
                    signal = sig,
                    "stopped by signal {sig}; the workload keeps running with all its CPUs"
                );
            }
            128 + sig
        }
    })
}

/// `cgroup.procs` of the cgroup this process is in, in the hierarchy `kind` places the
/// workload in; `None` for affinity placement or where it cannot be read.
fn own_procs_file(
    proc: &ProcFs,
    detection: &gleaner_linux::Detection,
    kind: PlacementKind,
) -> Option<PathBuf> {
    let own = proc.own_cgroup().ok()?;
    let (mount, path) = match kind {
        PlacementKind::CgroupV1 => (detection.mounts.v1_cpuset.as_ref()?, own.v1("cpuset")?),
        PlacementKind::CgroupV2 => (detection.mounts.v2.as_ref()?, own.v2()?),
        PlacementKind::Affinity => return None,
    };
    Some(CgroupMounts::dir_for(mount, path).join("cgroup.procs"))
}

fn exit_code(st: ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

fn spawn(cmd: &[OsString], cgroup_procs: Option<Vec<PathBuf>>) -> Result<Child> {
    let mut c = Command::new(&cmd[0]);
    c.args(&cmd[1..]);
    if let Some(files) = cgroup_procs {
        let hook = enter_cgroup_pre_exec(&files)?;
        // SAFETY: the hook only calls open/write/close (async-signal-safe) on pre-built paths.
        unsafe { c.pre_exec(hook) };
    }
    c.spawn().with_context(|| {
        format!(
            "cannot start {:?}: check the command exists and is executable",
            cmd[0]
        )
    })
}

fn choose_backend(
    choice: BackendChoice,
    det: &gleaner_linux::Detection,
    target: &Target,
) -> Result<PlacementKind> {
    if let Target::Cgroup(dir) = target {
        // An existing cgroup is judged by its own files, not by whether a new cgroup could be
        // created at the hierarchy's root (see `cgroup_target_backend`).
        let kind = cgroup_target_backend(&det.mounts, dir)
            .map_err(|why| anyhow!("--cgroup {}: {why}", dir.display()))?;
        return match choice {
            BackendChoice::Auto => Ok(kind),
            BackendChoice::CgroupV2 if kind == PlacementKind::CgroupV2 => Ok(kind),
            BackendChoice::CgroupV1 if kind == PlacementKind::CgroupV1 => Ok(kind),
            _ => bail!("--cgroup {} is a {kind} cgroup, but the {} back end was asked for: use --backend auto", dir.display(), choice_name(choice)),
        };
    }
    let why = |k: PlacementKind| {
        det.skipped
            .iter()
            .find(|(s, _)| *s == k)
            .map(|(_, w)| w.clone())
    };
    let want = match choice {
        BackendChoice::Auto => match target {
            // Another process's threads are confined by affinity: moving someone else's
            // process into a new cgroup would change its accounting and limits.
            Target::Pid { .. } => return Ok(PlacementKind::Affinity),
            _ => return Ok(det.kind),
        },
        BackendChoice::CgroupV2 => PlacementKind::CgroupV2,
        BackendChoice::CgroupV1 => PlacementKind::CgroupV1,
        BackendChoice::Affinity => PlacementKind::Affinity,
    };
    if let Some(reason) = why(want) {
        bail!("the {want} back end cannot be used here: {reason}; use --backend auto");
    }
    Ok(want)
}

fn choice_name(choice: BackendChoice) -> &'static str {
    match choice {
        BackendChoice::Auto => "auto",
        BackendChoice::CgroupV2 => "cgroup-v2",
        BackendChoice::CgroupV1 => "cgroup-v1",
        BackendChoice::Affinity => "affinity",
    }
}

/// Which back end manages the existing cgroup `dir`, or why none can.
///
/// Managing an existing cgroup writes only that cgroup's `cpuset.cpus` (and reads its
/// `cgroup.procs`), so that file is what is tested. The hierarchy root does not matter: a
/// v1 root directory is mode 0555, which a root process without CAP_DAC_OVERRIDE (the
/// service unit's capability set) cannot write, yet it can write the root-owned 0644 files
/// of any cgroup. `gleaner daemon --check` and the daemon call this too, so the check
/// says what running will do.
pub fn cgroup_target_backend(
    mounts: &gleaner_linux::cgroup::CgroupMounts,
    dir: &Path,
) -> std::result::Result<PlacementKind, String> {
    // The longest mount that contains `dir` (a v1 hierarchy may be mounted inside the v2 one).
    let under = |m: &Option<PathBuf>| {
        m.as_ref()
            .filter(|m| dir.starts_with(m))
            .map(|m| m.components().count())
    };
    let kind = match (under(&mounts.v2), under(&mounts.v1_cpuset)) {
        (Some(a), Some(b)) if b > a => PlacementKind::CgroupV1,
        (Some(_), _) => PlacementKind::CgroupV2,
        (None, Some(_)) => PlacementKind::CgroupV1,
        (None, None) => {
            let shown = |m: &Option<PathBuf>| {
                m.as_ref()
                    .map(|m| m.display().to_string())
                    .unwrap_or_else(|| "none".into())
            };
            return Err(format!(
                "not inside a cpuset hierarchy (cgroup v2 at {}, v1 cpuset at {}): give a cgroup directory under one of them",
                shown(&mounts.v2),
                shown(&mounts.v1_cpuset)
            ));
        }
    };
    let cpus = dir.join("cpuset.cpus");
    if !cpus.exists() {
        return Err(match kind {
            PlacementKind::CgroupV2 => format!(
                "{} does not exist: the cpuset controller is not enabled for this cgroup; for a unit run `systemctl set-property UNIT AllowedCPUs=0-N`, else add +cpuset to the parent's cgroup.subtree_control",
                cpus.display()
            ),
            _ => format!("{} does not exist: not a cpuset cgroup", cpus.display()),
        });
    }
    match nix::unistd::access(
        &cpus,
        nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
    ) {
        Ok(()) => Ok(kind),
        Err(e) => Err(format!(
            "{} is not writable ({e}): run Gleaner as root, or as the owner of a delegated cgroup",
            cpus.display()
        )),
    }
}

/// Picks in-kernel polling where it works (and is asked for or automatic), else yielding
/// threads; `Err(reason)` inside means "use yielding threads".
fn choose_retention(
    choice: RetentionBackendChoice,
    cpus: &gleaner_policy::Cpuset,
    journal: &SharedJournal,
) -> Result<std::result::Result<PollRetention, String>> {
    if choice == RetentionBackendChoice::Yield {
        return Ok(Err("asked for".into()));
    }
    let hook: gleaner_linux::pmqos::OriginalHook =
        Box::new(journal::undo_recorder(journal.clone()));
    match PollRetention::new(&SysFs::new("/sys"), cpus, hook) {
        Ok(p) => Ok(Ok(p)),
        Err(e) if choice == RetentionBackendChoice::Poll => {
            bail!("--retention-backend poll cannot be used here: {e}; use --retention-backend auto")
        }
        Err(e) => Ok(Err(e.to_string())),
    }
}

/// How long a default hold is kept when calibration found every vCPU busy (see
/// [`crate::calibration`]).
const BUSY_CALIBRATION_KEPT_S: u64 = 600;

/// What the wake-cost measurement tells the policy.
struct WakeCosts {
    timeout: RetentionTimeout,
    /// How long the host keeps polling a halted vCPU (see `QuickCalibration::host_poll_ns`).
    host_poll_ns: u64,
    /// The probe's median halted wake-up (`Calibrated::halted_wake_ns`; 0: not measured).
    halted_wake_ns: u64,
    /// How the hold was obtained, for `gleaner status`.
    source: String,
}

/// The configured hold, or one derived from repeated wake-latency measurements (see
/// [`crate::calibration`]); an agreed measurement is cached for the boot.
fn wake_costs(cfg: &DaemonConfig, state_dir: &Path, journal: &SharedJournal) -> WakeCosts {
    if let Some(timeout) = cfg.retention_timeout() {
        return WakeCosts {
            timeout,
            host_poll_ns: 0,
            halted_wake_ns: 0,
            source: "configured (retention_timeout_us)".into(),
        };
    }
    if !matches!(cfg.policy.mode, Mode::Full | Mode::Retention) {
        return WakeCosts {
            timeout: RetentionTimeout::default(),
            host_poll_ns: 0,
            halted_wake_ns: 0,
            source: "default (no retention in this mode)".into(),
        };
    }
    // The busy wake the hold is weighed against is the back end's that will hold vCPUs.
    let busy = wakeprobe::calibration_busy_setting(
        Path::new("/sys"),
        cfg.retention_backend != RetentionBackendChoice::Yield,
    );
    // Without a boot id (a /proc without it) the cache never matches, so it is measured anew.
    let boot = ProcFs::new("/proc").boot_id().unwrap_or_default();
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let cache = state_dir.join("calibration.json");
    let read_cache = || {
        std::fs::read_to_string(&cache)
            .map(|t| parse_cache(&t))
            .unwrap_or_default()
    };
    if let Some(c) = usable_entry(&read_cache(), &boot, now_s, busy) {
        return WakeCosts {
            timeout: RetentionTimeout { ns: c.timeout_ns },
            host_poll_ns: c.host_poll_ns,
            halted_wake_ns: c.halted_wake_ns,
            source: format!("cached; {}", c.source),
        };
    }
    let hook = pm_qos_hook(journal);
    let mut c = calibrate(|| wakeprobe::quick_calibration(busy, Some(hook.clone())));
    // An agreed measurement holds for the boot. A default kept because every run found the
    // vCPUs busy is kept for a while only: each start on a busy machine would otherwise pay
    // for runs that cannot succeed, and a quieter start later measures for real.
    let (cached, expires_unix_s) = if c.trusted {
        tracing::info!(
            timeout_us = c.timeout_ns / 1000,
            host_poll_us = c.host_poll_ns / 1000,
            "calibrated retention: {}",
            c.source
        );
        c.source.push_str(" (for this boot)");
        (true, None)
    } else {
        let kept = c.vcpus_busy;
        c.source.push_str(&if kept {
            format!(
                "; measuring again at a start after {} min",
                BUSY_CALIBRATION_KEPT_S / 60
            )
        } else {
            "; measuring again at the next start".to_string()
        });
        tracing::warn!(
            timeout_us = c.timeout_ns / 1000,
            "retention hold: {}",
            c.source
        );
        (kept, kept.then_some(now_s + BUSY_CALIBRATION_KEPT_S))
    };
    if cached {
        let entry = CacheEntry {
            boot_id: boot,
            timeout_ns: c.timeout_ns,
            host_poll_ns: c.host_poll_ns,
            halted_wake_ns: c.halted_wake_ns,
            source: c.source.clone(),
            expires_unix_s,
            busy_setting: Some(busy),
        };
        // Whole or not at all: two instances may calibrate at the same time.
        let tmp = state_dir.join(format!(".calibration.json.{}.tmp", std::process::id()));
        // Read again: another instance may have cached the other busy setting meanwhile.
        let entries = entries_with(read_cache(), entry);
        let written = serde_json::to_string(&entries).ok().is_some_and(|text| {
            std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, &cache).is_ok()
        });
        if !written {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    WakeCosts {
        timeout: RetentionTimeout { ns: c.timeout_ns },
        host_poll_ns: c.host_poll_ns,
        halted_wake_ns: c.halted_wake_ns,
        source: c.source,
    }
}

/// The crash journal and the guard watching it: what exists before anything is changed.
pub struct GuardedJournal {
    journal: SharedJournal,
    guard: GuardHandle,
}

impl GuardedJournal {
    /// Starts the guard, then creates the journal in `state_dir`. The guard starts first, so
    /// that a kill at any moment after this leaves no journal: it deletes one that was created
    /// (empty or not) and ignores one that never was.
    pub fn start(state_dir: &Path) -> Result<Self> {
        let proc = ProcFs::new("/proc");
        let guard = spawn_guard(&state_dir.join(format!("{}.json", std::process::id())))?;
        let journal = Journal::create(state_dir, &proc).with_context(|| {
            format!(
                "cannot create the crash journal in {}: pass --state-dir DIR you can write",
                state_dir.display()
            )
        })?;
        Ok(Self {
            journal: journal.into_shared(),
            guard,
        })
    }

    pub fn journal(&self) -> &SharedJournal {
        &self.journal
    }

    /// See [`GuardNotifier`].
    pub fn guard_notifier(&self) -> GuardNotifier {
        self.guard.notifier()
    }

    /// Journals a CPU's original PM QoS value before it is changed (for `wakeprobe`).
    pub fn pm_qos_hook(&self) -> PmQosHook {
        pm_qos_hook(&self.journal)
    }

    /// Undoes what is left in the journal and deletes it, then lets the guard go (it undoes
    /// whatever could still not be undone, and exits).
    pub fn finish(self) -> Result<()> {
        let leftovers = finish_journal(&self.journal, &ProcFs::new("/proc"));
        drop(self.guard);
        leftovers
    }
}

/// A [`PmQosHook`] that records each original value in `journal` before it is changed.
fn pm_qos_hook(journal: &SharedJournal) -> PmQosHook {
    let record = std::sync::Mutex::new(journal::undo_recorder(journal.clone()));
    std::sync::Arc::new(move |action| {
        let mut record = record
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        record(action)
    })
}

/// Undoes whatever the back ends left in the journal and deletes it if empty.
fn finish_journal(journal: &SharedJournal, proc: &ProcFs) -> Result<()> {
    let mut j = journal
        .lock()
        .map_err(|_| anyhow!("journal lock poisoned"))?;
    if !j.entries().is_empty() {
        restore::undo(&mut j, proc)
            .context("could not undo every change; run `gleaner recover`")?;
    }
    std::fs::remove_file(j.path())
        .or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        })
        .context("cannot remove the journal")?;
    Ok(())
}

mod guard;
use guard::spawn_guard;
pub use guard::{guard_main, recover, GuardHandle, GuardNotifier};

#[cfg(test)]
mod tests;
