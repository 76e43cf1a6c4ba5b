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
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use gleaner_linux::cgroup::v1::V1Mounts;
use gleaner_linux::journal::Journal;
use gleaner_linux::status::{status_path, InstanceStatus};
use gleaner_linux::{detect, Detection, PlacementKind, ProcFs};
use serde::{Deserialize, Serialize};

use crate::config::{is_root, DaemonConfig};
use crate::metrics::{self, MetricsServer, Snapshot, TargetMetrics};
use crate::notify::{notify, Watchdog};
use crate::status::{
    daemon_status_path, write_daemon_status, DaemonStatus, TargetState, TargetStatus,
};

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

/// Where a target's cgroup is.
#[derive(Debug, Clone, PartialEq)]
pub enum CgroupRef {
    /// A cgroup directory given as is.
    Path(PathBuf),
    /// A systemd unit (`mysql.service`, `db.slice`), resolved under the cpuset hierarchy.
    Unit(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TargetConfig {
    /// Label in metrics and logs; defaults to the unit name or the cgroup's last component.
    pub name: String,
    pub cgroup: CgroupRef,
    /// The service-wide daemon keys with this target's overrides applied, validated.
    pub daemon: DaemonConfig,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// None: no HTTP endpoint.
    pub listen: Option<SocketAddr>,
    pub textfile: Option<PathBuf>,
    pub textfile_interval: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServiceConfig {
    pub state_dir: PathBuf,
    pub metrics: MetricsConfig,
    pub targets: Vec<TargetConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct MetricsFile {
    listen: String,
    allow_non_loopback: bool,
    textfile: Option<PathBuf>,
    textfile_interval_s: u64,
}

impl Default for MetricsFile {
    fn default() -> Self {
        MetricsFile {
            listen: DEFAULT_LISTEN.into(),
            allow_non_loopback: false,
            textfile: None,
            textfile_interval_s: 15,
        }
    }
}

/// Reads and validates the service configuration. As root, a file others can write is
/// refused for the same reason as in `gleaner run --config`.
pub fn load(path: &Path) -> Result<ServiceConfig> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {}: check the path, or pass --config FILE",
            path.display()
        )
    })?;
    if is_root() {
        use std::os::unix::fs::MetadataExt;
        let meta =
            std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
        if meta.mode() & 0o022 != 0 {
            bail!(
                "{} is writable by group or others: run `chmod go-w {}`",
                path.display(),
                path.display()
            );
        }
    }
    parse(&text).with_context(|| format!("{}", path.display()))
}

/// Parses a service configuration: the usual daemon keys, `[metrics]`, `[[target]]`.
pub fn parse(text: &str) -> Result<ServiceConfig> {
    let mut table: toml::Table = toml::from_str(text)
        .map_err(|e| anyhow!("malformed TOML: {}", one_line(&e.to_string())))?;
    let metrics_file: MetricsFile = match table.remove("metrics") {
        Some(v) => v
            .try_into()
            .map_err(|e| anyhow!("[metrics]: {}", one_line(&e.to_string())))?,
        None => MetricsFile::default(),
    };
    let target_tables = match table.remove("target") {
        None => Vec::new(),
        Some(toml::Value::Array(a)) => a,
        Some(_) => bail!("`target` must be a list of tables: write each as [[target]]"),
    };
    let base: DaemonConfig = toml::Value::Table(table.clone())
        .try_into()
        .map_err(|e| anyhow!("{}", one_line(&e.to_string())))?;
    base.validate()?;
    let state_dir = base.state_dir.clone().unwrap_or_else(Journal::default_dir);

    let mut targets: Vec<TargetConfig> = Vec::new();
    for (i, value) in target_tables.into_iter().enumerate() {
        let toml::Value::Table(mut t) = value else {
            bail!("target #{}: write it as a [[target]] table", i + 1)
        };
        let mut take_str = |key: &str| -> Result<Option<String>> {
            match t.remove(key) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(s)),
                Some(other) => bail!(
                    "target #{}: `{key}` must be a string, not {}",
                    i + 1,
                    other.type_str()
                ),
            }
        };
        let (cgroup, unit, name) = (take_str("cgroup")?, take_str("unit")?, take_str("name")?);
        let cgroup = match (cgroup, unit) {
            (Some(c), None) => CgroupRef::Path(check_cgroup_path(&c).with_context(|| format!("target #{}", i + 1))?),
            (None, Some(u)) => CgroupRef::Unit(check_unit(&u).with_context(|| format!("target #{}", i + 1))?),
            _ => bail!("target #{}: give exactly one of `cgroup = \"/sys/fs/cgroup/...\"` or `unit = \"name.service\"`", i + 1),
        };
        let name = match name {
            Some(n) => n,
            None => match &cgroup {
                CgroupRef::Unit(u) => u.clone(),
                CgroupRef::Path(p) => p
                    .file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .unwrap_or_default(),
            },
        };
        if name.is_empty()
            || name.len() > 100
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.@:-".contains(c))
        {
            bail!("target #{}: name {name:?} must be 1-100 of A-Z a-z 0-9 _ . @ : - (set `name = \"...\"`)", i + 1);
        }
        if targets.iter().any(|o| o.name == name) {
            bail!("two targets are named {name:?}: give one a different `name = \"...\"`");
        }
        if t.contains_key("state_dir") {
            bail!("target {name:?}: state_dir is service-wide: set it at the top of the file");
        }
        let mut merged = table.clone();
        merge(&mut merged, t);
        let daemon: DaemonConfig = toml::Value::Table(merged)
            .try_into()
            .map_err(|e| anyhow!("target {name:?}: {}", one_line(&e.to_string())))?;
        daemon
            .validate()
            .with_context(|| format!("target {name:?}"))?;
        targets.push(TargetConfig {
            name,
            cgroup,
            daemon: DaemonConfig {
                state_dir: Some(state_dir.clone()),
                ..daemon
            },
        });
    }

    let listen = match metrics_file.listen.trim() {
        "" => None,
        s => {
            let addr: SocketAddr = s.parse().map_err(|_| anyhow!("[metrics] listen = {s:?} is not an address: use e.g. \"{DEFAULT_LISTEN}\", or \"\" to turn the endpoint off"))?;
            if !addr.ip().is_loopback() && !metrics_file.allow_non_loopback {
                bail!("[metrics] listen = \"{addr}\" is not a loopback address: use 127.0.0.1, or set allow_non_loopback = true if other hosts must scrape it");
            }
            Some(addr)
        }
    };
    if !(1..=3600).contains(&metrics_file.textfile_interval_s) {
        bail!(
            "[metrics] textfile_interval_s = {} is out of range: use 1 to 3600 (default 15)",
            metrics_file.textfile_interval_s
        );
    }
    if let Some(p) = &metrics_file.textfile {
        if !p.is_absolute() || p.file_name().is_none() {
            bail!("[metrics] textfile = {:?} must be an absolute file path such as /var/lib/prometheus/node-exporter/gleaner.prom", p);
        }
    }
    let metrics = MetricsConfig {
        listen,
        textfile: metrics_file.textfile,
        textfile_interval: Duration::from_secs(metrics_file.textfile_interval_s),
    };
    Ok(ServiceConfig {
        state_dir,
        metrics,
        targets,
    })
}

/// Overlays `over` on `base`; tables merge key by key so `[target.policy] rho = 0.9` keeps
/// the service-wide `[policy]` keys it does not name.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

fn check_cgroup_path(s: &str) -> Result<PathBuf> {
    let p = PathBuf::from(s);
    if !p.is_absolute()
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        bail!("cgroup = {s:?} must be an absolute path without `..`, e.g. /sys/fs/cgroup/system.slice/mysql.service");
    }
    Ok(p)
}

fn check_unit(s: &str) -> Result<String> {
    let ok_suffix = [".service", ".slice", ".scope"]
        .iter()
        .any(|x| s.ends_with(x) && s.len() > x.len());
    if !ok_suffix || s.contains('/') || s.chars().any(char::is_whitespace) {
        bail!("unit = {s:?} is not a unit name: use e.g. \"mysql.service\" or \"db.slice\"");
    }
    Ok(s.to_string())
}

/// The cgroup path systemd gives `unit` when it sets no `Slice=`: services and scopes live
/// in `system.slice`, and a slice `a-b.slice` nests as `a.slice/a-b.slice`.
pub fn default_unit_cgroup(unit: &str) -> PathBuf {
    if let Some(stem) = unit.strip_suffix(".slice") {
        if stem == "-" {
            return PathBuf::new();
        }
        let mut path = PathBuf::new();
        let parts: Vec<&str> = stem.split('-').collect();
        for n in 1..=parts.len() {
            path.push(format!("{}.slice", parts[..n].join("-")));
        }
        return path;
    }
    Path::new("system.slice").join(unit)
}

/// The unit's cgroup relative to a hierarchy root: what systemd says (it knows `Slice=`
/// and transient units), else the default placement.
fn unit_cgroup(unit: &str) -> PathBuf {
    let asked = Command::new("systemctl")
        .args(["show", "--property=ControlGroup", "--value", unit])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| s.starts_with('/'));
    match asked {
        Some(s) => PathBuf::from(s.trim_start_matches('/')),
        None => default_unit_cgroup(unit),
    }
}

/// Why a target is not managed now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "why", rename_all = "lowercase")]
pub enum Unmanaged {
    /// It will be once its cgroup exists and holds a process (looked at again every 2 s).
    Waiting(String),
    /// It cannot be managed as configured, or its instance failed; the reason names the fix.
    Failing(String),
}

impl Unmanaged {
    pub fn why(&self) -> &str {
        match self {
            Unmanaged::Waiting(w) | Unmanaged::Failing(w) => w,
        }
    }
}

/// The cgroup directory of `target` on this machine, or why it is not managed now.
fn resolve(target: &CgroupRef) -> std::result::Result<PathBuf, Unmanaged> {
    let det = detect(&ProcFs::new("/proc"), Path::new("/"))
        .map_err(|e| Unmanaged::Failing(format!("cannot read cgroup mounts: {e}")))?;
    resolve_in(target, &det)
}

/// [`resolve`] against given mounts. The test of the cgroup's own files is the one the
/// instance makes before it touches anything ([`crate::daemon::cgroup_target_backend`]), so
/// `--check` and the daemon say what the instance will do.
fn resolve_in(target: &CgroupRef, det: &Detection) -> std::result::Result<PathBuf, Unmanaged> {
    let dir = match target {
        CgroupRef::Path(p) => p.clone(),
        CgroupRef::Unit(unit) => {
            let root = match det.kind {
                PlacementKind::CgroupV2 => det.mounts.v2.clone(),
                _ => V1Mounts::from_detected(&det.mounts).map(|m| m.cpuset),
            }
            .ok_or_else(|| {
                Unmanaged::Failing(
                    "no cpuset controller on this machine: Gleaner cannot manage a unit here"
                        .to_string(),
                )
            })?;
            let dir = root.join(unit_cgroup(unit));
            if !dir.is_dir() && det.kind != PlacementKind::CgroupV2 {
                return Err(Unmanaged::Failing(format!(
                    "{} does not exist: on cgroup v1 systemd makes no cpuset group per unit; boot with cgroup v2, or give `cgroup = ` a cpuset group the unit runs in",
                    dir.display()
                )));
            }
            dir
        }
    };
    if !dir.is_dir() {
        return Err(Unmanaged::Waiting(format!(
            "{} does not exist yet (is the unit running?)",
            dir.display()
        )));
    }
    crate::daemon::cgroup_target_backend(&det.mounts, &dir)
        .map_err(|why| Unmanaged::Failing(format!("{}: {why}", dir.display())))?;
    if !has_tasks(&dir) {
        return Err(Unmanaged::Waiting(format!(
            "{} has no processes yet",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Whether any cgroup in the subtree at `dir` holds a process (an empty one would make its
/// instance exit at once: nothing to manage).
fn has_tasks(dir: &Path) -> bool {
    if gleaner_linux::cgroup::read_procs(dir).is_ok_and(|pids| !pids.is_empty()) {
        return true;
    }
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && has_tasks(&e.path()))
        })
        .unwrap_or(false)
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

fn child_config_path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join(format!("target-{name}.toml"))
}

/// Instance configs left by a daemon that was killed (its instances stopped with it).
fn remove_stale_instance_configs(state_dir: &Path) {
    for entry in std::fs::read_dir(state_dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with("target-") && name.ends_with(".toml") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Starts `gleaner attach --cgroup DIR` for one target with its resolved configuration.
fn spawn_instance(
    exe: &Path,
    logging: &ChildLogging,
    state_dir: &Path,
    target: &TargetConfig,
    dir: &Path,
    last_line: &Arc<Mutex<String>>,
) -> Result<Child> {
    let cfg_path = child_config_path(state_dir, &target.name);
    let text =
        toml::to_string(&target.daemon).context("cannot serialize the target's configuration")?;
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&cfg_path)
            .with_context(|| format!("cannot write {}", cfg_path.display()))?;
        f.write_all(text.as_bytes())
            .with_context(|| format!("cannot write {}", cfg_path.display()))?;
    }
    let mut c = Command::new(exe);
    c.arg("--log-format")
        .arg(if logging.json { "json" } else { "text" });
    if let Some((k, v)) = crate::logging::child_env() {
        c.env(k, v);
    }
    if let Some(f) = &logging.filter {
        c.arg("--log").arg(f);
    }
    c.arg("attach")
        .arg("--cgroup")
        .arg(dir)
        .arg("--config")
        .arg(&cfg_path);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for var in crate::notify::ENV_VARS {
        c.env_remove(var);
    }
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (setpgid, prctl, getppid) between fork and exec.
    unsafe {
        c.pre_exec(move || {
            // Own process group: a terminal's Ctrl-C or a group signal reaches only the
            // supervisor, which stops instances in order.
            libc::setpgid(0, 0);
            // If the supervisor dies without stopping us, stop (and restore) on our own.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            if libc::getppid() != parent {
                return Err(std::io::Error::other("supervisor exited"));
            }
            Ok(())
        })
    };
    let mut child = c
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    if let Some(stderr) = child.stderr.take() {
        let name = target.name.clone();
        let json = logging.json;
        let last = last_line.clone();
        if let Ok(mut l) = last.lock() {
            l.clear();
        }
        let _ = std::thread::Builder::new()
            .name(format!("log-{name}"))
            .spawn(move || forward_log(stderr, &name, json, &last));
    }
    Ok(child)
}

/// Passes an instance's log lines on, marked with its target: a `target_name` field in
/// JSON lines (as in the daemon's own lines), a `[name]` prefix in text.
fn forward_log(from: impl std::io::Read, name: &str, json: bool, last: &Mutex<String>) {
    let stderr = std::io::stderr();
    for line in BufReader::new(from).lines() {
        let Ok(line) = line else { break };
        if let Ok(mut l) = last.lock() {
            line.clone_into(&mut l);
        }
        let out = tag_line(&line, name, json);
        let _ = writeln!(stderr.lock(), "{out}");
    }
}

/// The message of a log line as an instance wrote it (JSON or text), for `status`.
fn last_message(line: &str) -> String {
    let msg = match serde_json::from_str::<serde_json::Value>(line) {
        Ok(v) => v
            .get("message")
            .or_else(|| v.get("fields").and_then(|f| f.get("message")))
            .and_then(|m| m.as_str())
            .map(String::from)
            .unwrap_or_else(|| line.to_string()),
        Err(_) => line.to_string(),
    };
    let msg = one_line(&msg);
    if msg.is_empty() {
        return "it logged nothing".into();
    }
    msg.chars().take(400).collect()
}

fn tag_line(line: &str, name: &str, json: bool) -> String {
    // A journald priority prefix stays first, where journald looks for it.
    let (priority, rest) = crate::logging::split_priority(line);
    if json {
        let object = match serde_json::from_str::<serde_json::Value>(rest) {
            Ok(serde_json::Value::Object(m)) => Some(m),
            // Not JSON (printed before the child's logging was up): made JSON here.
            _ => {
                serde_json::from_str::<serde_json::Value>(&crate::logging::wrap_unstructured(rest))
                    .ok()
                    .and_then(|v| match v {
                        serde_json::Value::Object(m) => Some(m),
                        _ => None,
                    })
            }
        };
        if let Some(mut m) = object {
            m.insert("target_name".into(), serde_json::Value::String(name.into()));
            return format!("{priority}{}", serde_json::Value::Object(m));
        }
    }
    format!("{priority}[{name}] {rest}")
}

#[cfg(test)]
mod tests;
