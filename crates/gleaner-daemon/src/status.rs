//! `gleaner status`: what the service and each running instance are doing, and why.
//!
//! Instances write `<pid>.status` every period (see `gleaner_linux::status`); the service
//! writes `daemon.status` whenever a target's state changes, so that a target that is not
//! managed (waiting for its cgroup, or failing) is shown with its reason instead of being
//! absent. Both files are in the state directory, which `--config` names for the service.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use gleaner_linux::journal::Journal;
use gleaner_linux::status::{read_statuses, InstanceStatus};
use serde::{Deserialize, Serialize};

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
    /// Directory of status files [default: state_dir of --config, else /run/gleaner, or $XDG_RUNTIME_DIR/gleaner]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// The service's configuration, for its state_dir [default: /etc/gleaner/gleaner.toml if it exists]
    #[arg(long, value_name = "FILE", conflicts_with = "state_dir")]
    config: Option<PathBuf>,
    /// Redraw every second, with each instance's wake latency over the last second, until Ctrl-C
    #[arg(long, conflicts_with = "json")]
    watch: bool,
}

/// How a configured target stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateKind {
    /// An instance manages it and has completed a period.
    Managed,
    /// An instance was started and has not completed its first period (calibrating).
    Starting,
    /// Its cgroup does not exist yet or holds no process.
    #[default]
    Waiting,
    /// It cannot be managed as configured, or its instance failed; retried with back-off.
    Failing,
}

impl StateKind {
    pub fn word(self) -> &'static str {
        match self {
            StateKind::Managed => "managed",
            StateKind::Starting => "starting",
            StateKind::Waiting => "waiting",
            StateKind::Failing => "failing",
        }
    }
}

/// A target's state and, unless managed, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetState {
    Managed,
    Starting,
    Waiting(String),
    Failing(String),
}

impl TargetState {
    pub fn kind(&self) -> StateKind {
        match self {
            TargetState::Managed => StateKind::Managed,
            TargetState::Starting => StateKind::Starting,
            TargetState::Waiting(_) => StateKind::Waiting,
            TargetState::Failing(_) => StateKind::Failing,
        }
    }

    pub fn why(&self) -> Option<&str> {
        match self {
            TargetState::Waiting(w) | TargetState::Failing(w) => Some(w),
            _ => None,
        }
    }
}

/// One configured target as the service sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetStatus {
    pub name: String,
    /// The cgroup directory it resolved to; empty while it cannot be resolved.
    pub cgroup: String,
    pub state: StateKind,
    /// Why it is waiting or failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The instance managing it, whose `<pid>.status` has the details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_pid: Option<u32>,
    /// Instances started after the first.
    pub restarts: u64,
}

/// What `gleaner daemon` writes to `daemon.status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonStatus {
    pub pid: u32,
    pub config: PathBuf,
    pub targets: Vec<TargetStatus>,
}

impl DaemonStatus {
    /// One line for `systemctl status` (sd_notify STATUS=) and the table's heading.
    pub fn summary(&self) -> String {
        let count = |k: StateKind| self.targets.iter().filter(|t| t.state == k).count();
        let mut parts = vec![format!("{} managed", count(StateKind::Managed))];
        for k in [StateKind::Starting, StateKind::Waiting, StateKind::Failing] {
            if count(k) > 0 {
                parts.push(format!("{} {}", count(k), k.word()));
            }
        }
        format!("{} target(s): {}", self.targets.len(), parts.join(", "))
    }
}

pub fn daemon_status_path(state_dir: &Path) -> PathBuf {
    state_dir.join("daemon.status")
}

/// Replaces `daemon.status` atomically (a reader never sees half a file), mode 0600 like
/// the instances' status files.
pub fn write_daemon_status(state_dir: &Path, status: &DaemonStatus) -> Result<()> {
    let text = serde_json::to_vec_pretty(status).context("cannot serialize the daemon status")?;
    // Rewritten on every target change and meaningless after a reboot: no fsync.
    gleaner_linux::error::write_private_atomic(
        &daemon_status_path(state_dir),
        &text,
        gleaner_linux::error::Durability::Volatile,
    )?;
    Ok(())
}

/// The service's status if a daemon wrote one and is still running.
pub fn read_daemon_status(state_dir: &Path) -> Result<Option<DaemonStatus>> {
    let path = daemon_status_path(state_dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let status: DaemonStatus = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a daemon status file", path.display()))?;
    Ok(Path::new(&format!("/proc/{}", status.pid))
        .exists()
        .then_some(status))
}

/// Everything `gleaner status --json` prints.
#[derive(Debug, Serialize)]
struct Report<'a> {
    daemon: Option<&'a DaemonStatus>,
    instances: Vec<Instance<'a>>,
}

#[derive(Debug, Serialize)]
struct Instance<'a> {
    /// The service target it manages; absent for `gleaner run`/`attach` started by hand.
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<&'a str>,
    #[serde(flatten)]
    status: &'a InstanceStatus,
}

/// The state directory `status` reads: `--state-dir`, else the one `--config` (or the default
/// service config, if it exists) names, else the default.
fn state_dir_of(args: &StatusArgs) -> Result<PathBuf> {
    if let Some(d) = &args.state_dir {
        return Ok(d.clone());
    }
    match &args.config {
        Some(path) => Ok(crate::service::load(path)?.state_dir),
        None => {
            let default = Path::new(crate::service::DEFAULT_CONFIG);
            match std::fs::read_to_string(default)
                .ok()
                .map(|t| crate::service::parse(&t))
            {
                Some(Ok(cfg)) => Ok(cfg.state_dir),
                // A broken service config must not hide the instances from `status`.
                Some(Err(e)) => {
                    crate::errln!(
                        "gleaner: {} is invalid ({}); looking in {}",
                        default.display(),
                        e,
                        Journal::default_dir().display()
                    );
                    Ok(Journal::default_dir())
                }
                None => Ok(Journal::default_dir()),
            }
        }
    }
}

pub fn run(args: StatusArgs) -> Result<()> {
    let dir = state_dir_of(&args)?;
    if args.watch {
        return watch(&dir);
    }
    let all = read_statuses(&dir)
        .with_context(|| format!("cannot read status files in {}", dir.display()))?;
    let daemon = read_daemon_status(&dir)?;
    crate::outln!(
        "{}",
        report(&dir, daemon.as_ref(), &all, args.json)?.trim_end()
    );
    Ok(())
}

fn report(
    dir: &Path,
    daemon: Option<&DaemonStatus>,
    all: &[InstanceStatus],
    json: bool,
) -> Result<String> {
    let target_of = |pid: u32| {
        daemon
            .and_then(|d| d.targets.iter().find(|t| t.instance_pid == Some(pid)))
            .map(|t| t.name.as_str())
    };
    if json {
        let instances = all
            .iter()
            .map(|s| Instance {
                target: target_of(s.pid),
                status: s,
            })
            .collect();
        return Ok(serde_json::to_string_pretty(&Report { daemon, instances })? + "\n");
    }
    let mut out = String::new();
    if let Some(d) = daemon {
        out += &format!(
            "gleaner daemon pid {} ({}) — {}\n",
            d.pid,
            d.config.display(),
            d.summary()
        );
        if d.targets.is_empty() {
            out += "  no [[target]] configured: serving metrics only\n";
        }
        for t in &d.targets {
            let cgroup = if t.cgroup.is_empty() {
                String::new()
            } else {
                format!(" {}", t.cgroup)
            };
            let word = t.state.word();
            match (t.state, &t.why) {
                (StateKind::Managed | StateKind::Starting, _) => {
                    let pid = t
                        .instance_pid
                        .map(|p| format!(" by instance {p}"))
                        .unwrap_or_default();
                    out += &format!("target {}: {word}{pid}{cgroup}\n", t.name);
                }
                (_, why) => {
                    out += &format!(
                        "target {}: {word}: {}\n",
                        t.name,
                        why.as_deref().unwrap_or("")
                    )
                }
            }
            if t.restarts > 0 {
                out += &format!("  restarted {} time(s)\n", t.restarts);
            }
            if let Some(s) = t.instance_pid.and_then(|p| all.iter().find(|s| s.pid == p)) {
                out += &render(s);
            }
        }
    }
    let by_hand: Vec<&InstanceStatus> = all.iter().filter(|s| target_of(s.pid).is_none()).collect();
    if daemon.is_none() && by_hand.is_empty() {
        out += &format!(
            "no running gleaner instance (looked in {})\n",
            dir.display()
        );
    }
    for s in by_hand {
        out += &render(s);
    }
    Ok(out)
}

/// Redraws every instance's status each second, adding its wake latency over that second.
fn watch(dir: &std::path::Path) -> Result<()> {
    let mut before: std::collections::HashMap<u32, gleaner_policy::WakeLatencies> =
        Default::default();
    loop {
        let all = read_statuses(dir)
            .with_context(|| format!("cannot read status files in {}", dir.display()))?;
        let mut screen = String::from("\x1b[H\x1b[2J");
        if all.is_empty() {
            screen += &format!(
                "no running gleaner instance (looked in {})\n",
                dir.display()
            );
        }
        for s in &all {
            screen += &render(s);
            if let Some(now) = &s.wake_latency {
                let Some(prev) = before.insert(s.pid, now.clone()) else {
                    continue;
                };
                let d = gleaner_linux::sampler::wake_delta(now, &prev);
                screen += "  last second:";
                for (name, h) in [
                    ("running", &d.running),
                    ("polling", &d.polling),
                    ("halted", &d.halted),
                ] {
                    let p50 = h.quantile_ns(0.5).map(us).unwrap_or_else(|| "-".into());
                    screen += &format!("  {name} p50 {p50} ({})", h.count);
                }
                screen += "\n";
            }
        }
        crate::outln!("{}", screen.trim_end_matches('\n'));
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// The workload's wake latency by the wakee vCPU's state (p50/p99/count), or which sampler
/// runs and why it has none.
pub fn wake_latency_report(s: &InstanceStatus) -> String {
    let mut out = format!("  sampler {}", s.sampler);
    if s.sampler == "procfs" {
        out += &format!(
            " (own CPU {:.2} % of one CPU, thinning level {})",
            s.sampler_cost_fraction * 100.0,
            s.sampler_thin_level
        );
    }
    out += "\n";
    for b in &s.sampler_blind_spots {
        out += &format!("    cannot see: {b}\n");
    }
    let Some(w) = &s.wake_latency else { return out };
    out += "  wake latency of the workload's threads (sched_waking to running), by the wakee vCPU's state:\n";
    out += "    state       p50        p99        count\n";
    for (name, h) in [
        ("running", &w.running),
        ("polling", &w.polling),
        ("halted", &w.halted),
    ] {
        let q = |p: f64| h.quantile_ns(p).map(us).unwrap_or_else(|| "-".into());
        out += &format!(
            "    {:<8} {:>10} {:>10} {:>10}\n",
            name,
            q(0.5),
            q(0.99),
            h.count
        );
    }
    if w.halted.count > 0 {
        // Whether a hold could pay: a cheaper wake-up helps only where someone waits for it.
        out += &format!(
            "    halted wake-ups whose waker's vCPU went idle before the wakee ran: {} ({:.0} %), hand-offs from a thread on another vCPU: {}\n",
            w.halted_waited,
            100.0 * w.halted_waited.min(w.halted.count) as f64 / w.halted.count as f64,
            w.halted_hand_offs
        );
    }
    out
}

fn us(ns: f64) -> String {
    format!("{:.1} µs", ns / 1e3)
}

pub fn render(s: &InstanceStatus) -> String {
    let c = &s.characteristics;
    let mut out = String::new();
    out += &format!("gleaner pid {} — {}\n", s.pid, s.command);
    out += &format!(
        "  mode {}{}  placement {}  retention {}  idle counts from {}  up {:.0} s ({} periods)\n",
        s.mode,
        if s.observe { " (observe only)" } else { "" },
        s.placement,
        s.retention_backend,
        s.idle_source,
        s.uptime_s,
        s.periods
    );
    // A hold that never times out (always-yield) is stored as u64::MAX ns.
    let hold = if s.retention_timeout.ns == gleaner_policy::FOREVER_NS {
        "none (held until work arrives)".to_string()
    } else {
        format!("{:.1} µs", s.retention_timeout.as_us_f64())
    };
    out += &format!(
        "  active vCPUs {} of {}   rho {:.3}  eta {:.3}  retention timeout {hold}\n",
        s.active, s.allowed, s.rho, s.eta
    );
    // The wake-up path out of idle, which §5's conditions count as idle time (the
    // policy's `Characteristics::l_wait_ns`), where there was one: without it a consolidation
    // of l_comp 7.4 us against l_idle 7.3 us would read as against the rule.
    let wake_path = if c.l_wake_path_ns > 0.0 {
        format!(" + wake-up path {}", us(c.l_wake_path_ns))
    } else {
        String::new()
    };
    out += &format!(
        "  l_comp {}  g_comp {}  l_idle {}{wake_path}  utilization {:.2}  runnable wait {:.0} %  steal {:.1} %\n",
        us(c.l_comp_ns),
        us(c.g_comp_ns),
        us(c.l_idle_ns),
        c.total_util,
        c.runnable_wait_fraction * 100.0,
        c.steal_fraction * 100.0
    );
    if !s.judged_by.is_empty() {
        out += &format!("  changes judged by {}", s.judged_by);
        if let Some(rate) = s.progress_per_sec {
            out += &format!(", last read {rate:.1}/s");
        }
        if s.unjudged_periods > 0 {
            out += &format!(
                " ({} periods not judged: the counter could not be read)",
                s.unjudged_periods
            );
        }
        out += "\n";
    }
    out += &format!(
        "  consolidations {}  rollbacks {}  major changes {}  retention CPU {:.2} s  gleaner CPU {:.2} s\n",
        s.consolidations, s.rollbacks, s.major_changes, s.retention_cpu_s, s.self_cpu_s
    );
    out += &format!(
        "  periods missed {}  discarded {}  latest wake-up {:.1} ms late  controller nice {}\n",
        s.missed_periods, s.disrupted_periods, s.max_late_ms, s.controller_nice
    );
    out += "  vCPU  active  held  work %  idle transitions/s  halts/s  steal %\n";
    for v in &s.vcpus {
        out += &format!(
            "  {:>4}  {:>6}  {:>4}  {:>6.1}  {:>18.0}  {:>7.0}  {:>7.1}\n",
            v.cpu,
            if v.active { "yes" } else { "no" },
            if v.retaining { "yes" } else { "no" },
            v.work_util * 100.0,
            v.idle_transitions_per_sec,
            v.halts_per_sec,
            v.steal_fraction * 100.0
        );
    }
    out += &wake_latency_report(s);
    if !s.last_events.is_empty() {
        out += "  last decisions:\n";
        for e in s.last_events.iter().rev().take(8) {
            out += &format!("    period {:>5}: {:?} — {}\n", e.period, e.kind, e.reason);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn always_yield_shows_its_mode_name_and_no_timeout() {
        let s = InstanceStatus {
            mode: gleaner_policy::Mode::AlwaysYield.to_string(),
            retention_timeout: gleaner_policy::RetentionTimeout {
                ns: gleaner_policy::FOREVER_NS,
            },
            ..InstanceStatus::default()
        };
        let text = render(&s);
        assert!(text.contains("mode always-yield"), "{text}");
        assert!(
            text.contains("retention timeout none (held until work arrives)"),
            "{text}"
        );
        let s = InstanceStatus {
            retention_timeout: gleaner_policy::RetentionTimeout { ns: 18_000 },
            ..s
        };
        assert!(render(&s).contains("retention timeout 18.0 µs"));
    }

    #[test]
    fn a_counter_judge_shows_its_source_its_last_rate_and_what_it_could_not_read() {
        let s = InstanceStatus {
            judged_by:
                "the application's progress (metric tx_total at http://127.0.0.1:9100/metrics)"
                    .into(),
            progress_total: Some(5_000),
            progress_per_sec: Some(1234.5),
            unjudged_periods: 2,
            ..InstanceStatus::default()
        };
        let text = render(&s);
        assert!(
            text.contains("changes judged by the application's progress (metric tx_total at http://127.0.0.1:9100/metrics), last read 1234.5/s (2 periods not judged: the counter could not be read)"),
            "{text}"
        );
    }

    #[test]
    fn the_wake_up_path_is_shown_beside_l_idle_where_there_was_one() {
        let mut s = InstanceStatus::default();
        s.characteristics.l_comp_ns = 7_400.0;
        s.characteristics.l_idle_ns = 7_300.0;
        assert!(
            render(&s).contains("l_idle 7.3 µs  utilization"),
            "{}",
            render(&s)
        );
        s.characteristics.l_wake_path_ns = 1_500.0;
        let text = render(&s);
        assert!(
            text.contains("l_idle 7.3 µs + wake-up path 1.5 µs  utilization"),
            "{text}"
        );
    }

    fn daemon_with(targets: Vec<TargetStatus>) -> DaemonStatus {
        DaemonStatus {
            pid: std::process::id(),
            config: "/etc/gleaner/gleaner.toml".into(),
            targets,
        }
    }

    fn target(name: &str, state: StateKind, why: Option<&str>, pid: Option<u32>) -> TargetStatus {
        TargetStatus {
            name: name.into(),
            cgroup: String::new(),
            state,
            why: why.map(String::from),
            instance_pid: pid,
            restarts: 0,
        }
    }

    #[test]
    fn every_configured_target_is_shown_with_its_state_and_reason() {
        let d = daemon_with(vec![
            target("db", StateKind::Managed, None, Some(4242)),
            target(
                "batch",
                StateKind::Failing,
                Some("/sys/fs/cgroup/cpuset/batch/cpuset.cpus is not writable (EACCES)"),
                None,
            ),
            target(
                "web.service",
                StateKind::Waiting,
                Some("/sys/fs/cgroup/system.slice/web.service does not exist yet"),
                None,
            ),
        ]);
        let inst = InstanceStatus {
            pid: 4242,
            command: "cgroup /sys/fs/cgroup/cpuset/db".into(),
            ..Default::default()
        };
        let by_hand = InstanceStatus {
            pid: 77,
            command: "sleep 30".into(),
            ..Default::default()
        };
        let text = report(
            Path::new("/run/gleaner"),
            Some(&d),
            &[inst.clone(), by_hand.clone()],
            false,
        )
        .unwrap();
        assert!(
            text.contains("3 target(s): 1 managed, 1 waiting, 1 failing"),
            "{text}"
        );
        assert!(
            text.contains("target db: managed by instance 4242"),
            "{text}"
        );
        assert!(
            text.contains(
                "target batch: failing: /sys/fs/cgroup/cpuset/batch/cpuset.cpus is not writable"
            ),
            "{text}"
        );
        assert!(text.contains("target web.service: waiting: "), "{text}");
        assert!(
            text.contains("gleaner pid 77 — sleep 30"),
            "an instance started by hand is listed too: {text}"
        );
        assert!(!text.contains("no running gleaner instance"), "{text}");

        let json: serde_json::Value = serde_json::from_str(
            &report(Path::new("/x"), Some(&d), &[inst, by_hand], true).unwrap(),
        )
        .unwrap();
        assert_eq!(json["daemon"]["targets"][1]["state"], "failing");
        assert_eq!(json["instances"][0]["target"], "db");
        assert_eq!(json["instances"][0]["pid"], 4242);
        assert!(json["instances"][1].get("target").is_none());
    }

    #[test]
    fn a_daemon_whose_targets_all_fail_is_not_reported_as_absent() {
        let d = daemon_with(vec![target(
            "a",
            StateKind::Failing,
            Some("no cpuset"),
            None,
        )]);
        let text = report(Path::new("/run/gleaner"), Some(&d), &[], false).unwrap();
        assert!(!text.contains("no running gleaner instance"), "{text}");
        assert!(text.contains("target a: failing: no cpuset"), "{text}");
        let none = report(Path::new("/run/gleaner"), None, &[], false).unwrap();
        assert!(none.contains("no running gleaner instance"), "{none}");
    }

    #[test]
    fn daemon_status_round_trips_and_a_dead_daemons_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let d = daemon_with(vec![target("a", StateKind::Waiting, Some("x"), None)]);
        write_daemon_status(dir.path(), &d).unwrap();
        assert_eq!(read_daemon_status(dir.path()).unwrap(), Some(d));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(daemon_status_path(dir.path()))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        write_daemon_status(
            dir.path(),
            &DaemonStatus {
                pid: u32::MAX - 1,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(read_daemon_status(dir.path()).unwrap(), None);
    }

    #[test]
    fn state_dir_comes_from_the_service_config() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("g.toml");
        std::fs::write(&cfg, "state_dir = \"/srv/gleaner-state\"\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o600)).unwrap();
        let args = StatusArgs {
            json: false,
            state_dir: None,
            config: Some(cfg),
            watch: false,
        };
        assert_eq!(
            state_dir_of(&args).unwrap(),
            Path::new("/srv/gleaner-state")
        );
    }
}
