//! `gleaner daemon`: Gleaner as a long-lived system service managing configured cgroups.
//!
//! Exists so an operator installs Gleaner like node_exporter or irqbalance: one config file
//! (`/etc/gleaner/gleaner.toml`), one unit, metrics on loopback, SIGHUP to reload.
//!
//! Each `[[target]]` is managed by its own `gleaner attach --cgroup DIR` child process, the
//! exact code path an operator runs by hand. That keeps every safety property of
//! `attach` for the service: each instance has its own crash journal and guard process, a
//! crash of one instance is undone by its guard without touching the others, and `gleaner
//! status` / `gleaner recover` see the instances as they see any other. This process only
//! supervises: it resolves targets, starts instances one at a time (so their wake-latency
//! calibrations do not disturb each other), restarts them with back-off, reloads the
//! configuration on SIGHUP and serves the instances' status files as Prometheus metrics.

use gleaner_sys::one_line;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Args;
use gleaner_linux::status::{status_path, InstanceStatus};

use crate::metrics::{self, MetricsServer, Snapshot, TargetMetrics};
use crate::notify::{notify, Watchdog};
use crate::status::{
    daemon_status_path, write_daemon_status, DaemonStatus, TargetState, TargetStatus,
};

mod config;
mod instances;
mod targets;

pub use config::{load, parse, CgroupRef, MetricsConfig, ServiceConfig, TargetConfig};
use instances::{child_config_path, last_message, remove_stale_instance_configs, spawn_instance};
use targets::resolve;
pub use targets::{default_unit_cgroup, Unmanaged};

pub const DEFAULT_CONFIG: &str = "/etc/gleaner/gleaner.toml";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9477";

#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// Service configuration: daemon keys, [metrics] and one [[target]] per managed cgroup
    #[arg(long, value_name = "FILE", default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// Validate the configuration, print the targets it resolves to, and exit
    #[arg(long)]
    pub check: bool,
}

/// How the instances log: the same format and filter as the service itself.
#[derive(Debug, Clone)]
pub struct ChildLogging {
    pub json: bool,
    pub filter: Option<String>,
}

static STOP: AtomicBool = AtomicBool::new(false);
static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

extern "C" fn on_reload(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() -> Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let stop = SigAction::new(
        SigHandler::Handler(on_stop),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    let reload = SigAction::new(
        SigHandler::Handler(on_reload),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: both handlers only store to an atomic, which is async-signal-safe.
    unsafe {
        sigaction(Signal::SIGTERM, &stop).context("cannot install a SIGTERM handler")?;
        sigaction(Signal::SIGINT, &stop).context("cannot install a SIGINT handler")?;
        sigaction(Signal::SIGHUP, &reload).context("cannot install a SIGHUP handler")?;
    }
    Ok(())
}

/// `gleaner daemon`: returns the exit code.
pub fn run(args: ServiceArgs, logging: ChildLogging) -> Result<i32> {
    let cfg = load(&args.config)?;
    if args.check {
        print_check(&args.config, &cfg);
        return Ok(0);
    }
    install_signal_handlers()?;
    create_private_dir(&cfg.state_dir)?;
    let exe =
        std::env::current_exe().context("cannot find our own executable to start instances")?;
    let mut sup = Supervisor::new(args.config, cfg, exe, logging)?;
    // Ready: the configuration is valid and the metrics endpoint is bound. Targets are
    // managed as they become due; `gleaner status` shows each one's state.
    notify("READY=1");
    let result = sup.run();
    sup.shutdown();
    result.map(|_| 0)
}

fn print_check(path: &Path, cfg: &ServiceConfig) {
    crate::outln!("{}: valid", path.display());
    crate::outln!("  state dir {}", cfg.state_dir.display());
    match cfg.metrics.listen {
        Some(a) => crate::outln!("  metrics   http://{a}/metrics"),
        None => crate::outln!("  metrics   no HTTP endpoint"),
    }
    if let Some(t) = &cfg.metrics.textfile {
        crate::outln!(
            "  textfile  {} every {} s",
            t.display(),
            cfg.metrics.textfile_interval.as_secs()
        );
    }
    if cfg.targets.is_empty() {
        crate::outln!("  no [[target]]: nothing will be managed");
    }
    for t in &cfg.targets {
        let now = match resolve(&t.cgroup) {
            Ok(dir) => dir.display().to_string(),
            Err(Unmanaged::Waiting(why)) => format!("waiting: {why}"),
            Err(Unmanaged::Failing(why)) => format!("cannot be managed: {why}"),
        };
        crate::outln!(
            "  target {}: mode {:?}, period {} ms, rho {}, eta {} -> {now}",
            t.name,
            t.daemon.policy.mode,
            t.daemon.period_ms,
            t.daemon.policy.rho,
            t.daemon.policy.eta
        );
    }
}

fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| {
            format!(
                "cannot create state directory {}: set state_dir to a directory you can write",
                dir.display()
            )
        })
}

/// What the metrics thread needs to know about one target.
#[derive(Debug, Clone)]
struct TargetView {
    name: String,
    cgroup: String,
    pid: Option<u32>,
    restarts: u64,
    state: TargetState,
}

#[derive(Debug, Clone, Default)]
struct Shared {
    targets: Vec<TargetView>,
    reload_ok: bool,
    reload_ts: f64,
    state_dir: PathBuf,
    /// Unix time the daemon started (`process_start_time_seconds`).
    started: f64,
}

/// Builds a scrape from the instances' status files (each written atomically by its
/// controller every period).
fn snapshot(shared: &Mutex<Shared>) -> Snapshot {
    let s = match shared.lock() {
        Ok(g) => g.clone(),
        Err(p) => p.into_inner().clone(),
    };
    let targets = s
        .targets
        .iter()
        .map(|t| TargetMetrics {
            name: t.name.clone(),
            cgroup: t.cgroup.clone(),
            running: t.pid.is_some(),
            restarts: t.restarts,
            state: t.state.kind(),
            status: t
                .pid
                .and_then(|pid| read_status(&status_path(&s.state_dir, pid))),
        })
        .collect();
    Snapshot {
        targets,
        last_reload_successful: s.reload_ok,
        last_reload_success_timestamp_seconds: s.reload_ts,
        process: metrics::ProcessMetrics::of_self(s.started),
    }
}

fn read_status(path: &Path) -> Option<InstanceStatus> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// One target and the instance managing it, if any.
struct TargetRun {
    cfg: TargetConfig,
    child: Option<Child>,
    started_at: Instant,
    starts: u64,
    not_before: Instant,
    backoff: Duration,
    /// Why the target is not managed, logged once per change.
    unmanaged: Option<Unmanaged>,
    cgroup: Option<PathBuf>,
    /// The running instance's latest log line: why it failed, if it does.
    last_line: Arc<Mutex<String>>,
}

impl TargetRun {
    fn new(cfg: TargetConfig) -> Self {
        let now = Instant::now();
        TargetRun {
            cfg,
            child: None,
            started_at: now,
            starts: 0,
            not_before: now,
            backoff: MIN_BACKOFF,
            unmanaged: Some(Unmanaged::Waiting("not looked at yet".into())),
            cgroup: None,
            last_line: Arc::new(Mutex::new(String::new())),
        }
    }

    /// What `gleaner status` and the metrics show for this target.
    fn state(&self, state_dir: &Path) -> TargetState {
        match (&self.child, &self.unmanaged) {
            (Some(c), _) if status_path(state_dir, c.id()).exists() => TargetState::Managed,
            (Some(_), _) => TargetState::Starting,
            (None, Some(Unmanaged::Failing(w))) => TargetState::Failing(w.clone()),
            (None, Some(Unmanaged::Waiting(w))) => TargetState::Waiting(w.clone()),
            (None, None) => TargetState::Waiting("restarting".into()),
        }
    }
}

const TICK: Duration = Duration::from_millis(200);
const MIN_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How often a target that has no cgroup or no processes yet is looked at again.
const WAIT_RECHECK: Duration = Duration::from_secs(2);
/// An instance that ran this long had a healthy run: its failure restarts the back-off.
const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// Longest wait for an instance to restore and exit after SIGTERM before it is killed (its
/// guard then restores from the journal).
const STOP_GRACE: Duration = Duration::from_secs(10);
/// An instance still calibrating after this long no longer holds up the next one.
const START_GATE: Duration = Duration::from_secs(60);

struct Supervisor {
    config_path: PathBuf,
    cfg: ServiceConfig,
    exe: PathBuf,
    logging: ChildLogging,
    targets: Vec<TargetRun>,
    shared: Arc<Mutex<Shared>>,
    server: Option<MetricsServer>,
    next_textfile: Instant,
    /// What `daemon.status` says now; rewritten only when it changes.
    last_status: DaemonStatus,
    watchdog: Watchdog,
}

impl Supervisor {
    fn new(
        config_path: PathBuf,
        cfg: ServiceConfig,
        exe: PathBuf,
        logging: ChildLogging,
    ) -> Result<Self> {
        let shared = Arc::new(Mutex::new(Shared {
            reload_ok: true,
            reload_ts: unix_now(),
            state_dir: cfg.state_dir.clone(),
            targets: vec![],
            started: unix_now(),
        }));
        if cfg.targets.is_empty() {
            tracing::warn!(
                "no [[target]] in {}: serving metrics only; add a target and reload",
                config_path.display()
            );
        }
        remove_stale_instance_configs(&cfg.state_dir);
        let targets = cfg.targets.iter().cloned().map(TargetRun::new).collect();
        let listen = cfg.metrics.listen;
        let mut sup = Supervisor {
            config_path,
            cfg,
            exe,
            logging,
            targets,
            shared,
            server: None,
            next_textfile: Instant::now(),
            last_status: DaemonStatus::default(),
            watchdog: Watchdog::from_env(),
        };
        // The first scrape already lists every configured target.
        sup.publish();
        sup.server = start_server(listen, &sup.shared)?;
        tracing::info!(config = %sup.config_path.display(), targets = sup.cfg.targets.len(), "gleaner daemon started");
        Ok(sup)
    }

    fn run(&mut self) -> Result<()> {
        while !STOP.load(Ordering::SeqCst) {
            if RELOAD.swap(false, Ordering::SeqCst) {
                notify("RELOADING=1");
                self.reload();
                notify("READY=1");
            }
            self.reap();
            self.start_due();
            self.publish();
            self.watchdog.tick();
            if Instant::now() >= self.next_textfile {
                self.write_textfile();
                self.next_textfile = Instant::now() + self.cfg.metrics.textfile_interval;
            }
            std::thread::sleep(TICK);
        }
        tracing::info!("stopping: restoring every target's CPUs");
        Ok(())
    }

    /// Notices instances that ended and schedules their restart.
    fn reap(&mut self) {
        for t in &mut self.targets {
            let Some(child) = &mut t.child else { continue };
            let status = match child.try_wait() {
                Ok(Some(st)) => st,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(target_name = %t.cfg.name, "cannot check instance {}: {e}", child.id());
                    continue;
                }
            };
            let ran = t.started_at.elapsed();
            t.child = None;
            let _ = std::fs::remove_file(child_config_path(&self.cfg.state_dir, &t.cfg.name));
            if status.success() {
                // The cgroup emptied (the unit stopped): wait for processes to come back.
                tracing::info!(target_name = %t.cfg.name, "workload gone after {:.0} s; waiting for processes in its cgroup", ran.as_secs_f64());
                t.backoff = MIN_BACKOFF;
                t.not_before = Instant::now() + MIN_BACKOFF;
                t.unmanaged = Some(Unmanaged::Waiting(
                    "its workload ended; waiting for processes in its cgroup".into(),
                ));
            } else {
                if ran >= HEALTHY_RUN {
                    t.backoff = MIN_BACKOFF;
                }
                let last = t.last_line.lock().map(|l| l.clone()).unwrap_or_default();
                tracing::warn!(target_name = %t.cfg.name, "instance ended with {status}; its CPUs were restored; retrying in {} s", t.backoff.as_secs());
                t.unmanaged = Some(Unmanaged::Failing(format!(
                    "instance ended with {status} ({}); retrying in {} s",
                    last_message(&last),
                    t.backoff.as_secs()
                )));
                t.not_before = Instant::now() + t.backoff;
                t.backoff = (t.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// Starts instances for targets that are due, one at a time: an instance that is still
    /// starting up (no status file yet, e.g. calibrating its retention timeout) holds up the
    /// next, so two calibrations never run at once.
    fn start_due(&mut self) {
        let starting = self.targets.iter().any(|t| {
            t.child.as_ref().is_some_and(|c| {
                !status_path(&self.cfg.state_dir, c.id()).exists()
                    && t.started_at.elapsed() < START_GATE
            })
        });
        if starting {
            return;
        }
        let now = Instant::now();
        let Some(t) = self
            .targets
            .iter_mut()
            .find(|t| t.child.is_none() && now >= t.not_before)
        else {
            return;
        };
        match resolve(&t.cfg.cgroup) {
            Err(why) => {
                // Logged once per change of reason; a target that cannot be managed is an
                // error an operator must fix, one that is waiting is normal.
                let already = matches!((&t.unmanaged, &why), (Some(Unmanaged::Waiting(a)), Unmanaged::Waiting(b)) | (Some(Unmanaged::Failing(a)), Unmanaged::Failing(b)) if a == b);
                if !already {
                    match &why {
                        Unmanaged::Waiting(w) => {
                            tracing::info!(target_name = %t.cfg.name, "waiting: {w}")
                        }
                        Unmanaged::Failing(w) => {
                            tracing::error!(target_name = %t.cfg.name, "cannot be managed: {w}")
                        }
                    }
                }
                t.unmanaged = Some(why);
                t.cgroup = None;
                t.not_before = now + WAIT_RECHECK;
            }
            Ok(dir) => match spawn_instance(
                &self.exe,
                &self.logging,
                &self.cfg.state_dir,
                &t.cfg,
                &dir,
                &t.last_line,
            ) {
                Ok(child) => {
                    tracing::info!(target_name = %t.cfg.name, cgroup = %dir.display(), pid = child.id(), "managing target");
                    t.child = Some(child);
                    t.started_at = now;
                    t.starts += 1;
                    t.unmanaged = None;
                    t.cgroup = Some(dir);
                }
                Err(e) => {
                    tracing::error!(target_name = %t.cfg.name, "cannot start an instance: {e:#}");
                    t.unmanaged = Some(Unmanaged::Failing(format!(
                        "cannot start an instance: {}",
                        one_line(&format!("{e:#}"))
                    )));
                    t.not_before = now + t.backoff;
                    t.backoff = (t.backoff * 2).min(MAX_BACKOFF);
                }
            },
        }
    }

    fn publish(&mut self) {
        let views: Vec<TargetView> = self
            .targets
            .iter()
            .map(|t| TargetView {
                name: t.cfg.name.clone(),
                cgroup: t
                    .cgroup
                    .as_ref()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default(),
                pid: t.child.as_ref().map(|c| c.id()),
                restarts: t.starts.saturating_sub(1),
                state: t.state(&self.cfg.state_dir),
            })
            .collect();
        let status = DaemonStatus {
            pid: std::process::id(),
            config: self.config_path.clone(),
            targets: views
                .iter()
                .map(|v| TargetStatus {
                    name: v.name.clone(),
                    cgroup: v.cgroup.clone(),
                    instance_pid: v.pid,
                    restarts: v.restarts,
                    state: v.state.kind(),
                    why: v.state.why().map(String::from),
                })
                .collect(),
        };
        if status != self.last_status {
            // `gleaner status` reads this to show every target, managed or not.
            if let Err(e) = write_daemon_status(&self.cfg.state_dir, &status) {
                tracing::warn!("{e:#}");
            }
            notify(&format!("STATUS={}", status.summary()));
            self.last_status = status;
        }
        if let Ok(mut s) = self.shared.lock() {
            s.targets = views;
        }
    }

    fn write_textfile(&self) {
        if let Some(path) = &self.cfg.metrics.textfile {
            if let Err(e) = metrics::write_textfile(path, &metrics::render(&snapshot(&self.shared)))
            {
                tracing::warn!("{e:#}");
            }
        }
    }

    /// SIGHUP: re-read and validate; apply only a fully valid configuration, else keep
    /// the running one and say why. Targets whose settings did not change keep their
    /// instance: their workload is not touched.
    fn reload(&mut self) {
        let new = match load(&self.config_path) {
            Ok(c) => c,
            Err(e) => return self.reload_failed(&format!("{e:#}")),
        };
        if new.state_dir != self.cfg.state_dir {
            return self.reload_failed(&format!(
                "state_dir changed from {} to {}: running instances keep their journals there; restart the service to move it",
                self.cfg.state_dir.display(),
                new.state_dir.display()
            ));
        }
        if new.metrics.listen != self.cfg.metrics.listen {
            // Bind the new address before dropping the old one, so a bad address fails the
            // whole reload instead of leaving no endpoint.
            match start_server(new.metrics.listen, &self.shared) {
                Ok(server) => self.server = server,
                Err(e) => return self.reload_failed(&format!("{e:#}")),
            }
        }
        if new.metrics.textfile != self.cfg.metrics.textfile {
            if let Some(old) = &self.cfg.metrics.textfile {
                let _ = std::fs::remove_file(old);
            }
        }
        let (mut added, mut removed, mut changed, mut kept) = (vec![], vec![], vec![], 0);
        let mut old: Vec<TargetRun> = std::mem::take(&mut self.targets);
        for t in &mut old {
            if !new.targets.iter().any(|n| n.name == t.cfg.name) {
                stop_instances(std::slice::from_mut(t), &self.cfg.state_dir);
                removed.push(t.cfg.name.clone());
            }
        }
        for cfg in &new.targets {
            match old.iter().position(|t| t.cfg.name == cfg.name) {
                Some(i) if old[i].cfg == *cfg => {
                    self.targets.push(old.swap_remove(i));
                    kept += 1;
                }
                Some(i) => {
                    let mut t = old.swap_remove(i);
                    stop_instances(std::slice::from_mut(&mut t), &self.cfg.state_dir);
                    t.cfg = cfg.clone();
                    t.not_before = Instant::now();
                    t.backoff = MIN_BACKOFF;
                    self.targets.push(t);
                    changed.push(cfg.name.clone());
                }
                None => {
                    self.targets.push(TargetRun::new(cfg.clone()));
                    added.push(cfg.name.clone());
                }
            }
        }
        self.cfg = new;
        self.next_textfile = Instant::now();
        self.publish();
        if let Ok(mut s) = self.shared.lock() {
            s.reload_ok = true;
            s.reload_ts = unix_now();
        }
        tracing::info!(added = ?added, removed = ?removed, restarted = ?changed, unchanged = kept, "configuration reloaded from {}", self.config_path.display());
    }

    fn reload_failed(&self, why: &str) {
        // The metric first: whoever reads the log line must find the scrape agreeing.
        if let Ok(mut s) = self.shared.lock() {
            s.reload_ok = false;
        }
        tracing::error!(
            "reload failed, keeping the running configuration: {}",
            one_line(why)
        );
    }

    fn shutdown(&mut self) {
        notify("STOPPING=1");
        stop_instances(&mut self.targets, &self.cfg.state_dir);
        let _ = std::fs::remove_file(daemon_status_path(&self.cfg.state_dir));
        self.server = None;
        if let Some(p) = &self.cfg.metrics.textfile {
            // Stale figures would look live to node_exporter.
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // Normally already done by shutdown(); this covers an unwinding panic.
        stop_instances(&mut self.targets, &self.cfg.state_dir);
    }
}

fn start_server(
    listen: Option<SocketAddr>,
    shared: &Arc<Mutex<Shared>>,
) -> Result<Option<MetricsServer>> {
    let Some(addr) = listen else { return Ok(None) };
    let shared = shared.clone();
    let server = MetricsServer::start(addr, Arc::new(move || metrics::render(&snapshot(&shared))))?;
    tracing::info!(
        "metrics endpoint listening on http://{}/metrics",
        server.addr()
    );
    Ok(Some(server))
}

/// Asks every instance to restore and exit (all at once, so shutdown takes one grace
/// period, not one per target), then kills the ones that did not; their guards restore.
fn stop_instances(targets: &mut [TargetRun], state_dir: &Path) {
    for t in targets.iter() {
        if let Some(c) = &t.child {
            // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        }
    }
    let deadline = Instant::now() + STOP_GRACE;
    for t in targets.iter_mut() {
        let Some(mut child) = t.child.take() else {
            continue;
        };
        loop {
            match child.try_wait() {
                Ok(Some(st)) => {
                    tracing::info!(target_name = %t.cfg.name, "instance {} stopped ({st})", child.id());
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    tracing::warn!(target_name = %t.cfg.name, "instance {} did not stop in {} s; killing it (its guard restores the CPUs)", child.id(), STOP_GRACE.as_secs());
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
        let _ = std::fs::remove_file(child_config_path(state_dir, &t.cfg.name));
    }
}

#[cfg(test)]
mod tests;
