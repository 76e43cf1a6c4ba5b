//! `gleaner daemon` end to end: the real binary, a real loopback scrape, real signals.
//!
//! The reload test runs as any user (its target's cgroup does not exist, so no CPU is ever
//! touched). The real-cgroup test needs root and a cgroup v1 cpuset hierarchy and prints why
//! it skips otherwise; it creates `gleaner-test-svc-<pid>`, runs a short workload in it and
//! removes it on every exit path (guards below), checking the CPUs were given back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const GLEANER: &str = env!("CARGO_BIN_EXE_gleaner");

/// A running `gleaner daemon`; SIGTERM and reap on every exit path.
struct Daemon {
    child: Child,
    lines: Receiver<String>,
    log: Vec<String>,
}

impl Daemon {
    fn start(config: &Path) -> Daemon {
        Daemon::start_as(&[], config)
    }

    /// Started through `wrapper` (e.g. `setpriv` with the unit's capabilities).
    fn start_as(wrapper: &[String], config: &Path) -> Daemon {
        Daemon::start_with(wrapper, &[], config)
    }

    /// Started through `wrapper`, with `env` added to its environment.
    fn start_with(wrapper: &[String], env: &[(&str, String)], config: &Path) -> Daemon {
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(GLEANER);
                c
            }
            None => Command::new(GLEANER),
        };
        let mut child = cmd
            .args(["daemon", "--config"])
            .arg(config)
            .env("GLEANER_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gleaner daemon");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Daemon {
            child,
            lines,
            log: vec![],
        }
    }

    /// Waits for a log line containing `needle`; returns it.
    fn wait_log(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        if let Some(l) = self.log.iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.log.push(line.clone());
            if line.contains(needle) {
                return line;
            }
        }
        panic!(
            "no log line with {needle:?} within {timeout:?}; log so far:\n{}",
            self.log.join("\n")
        );
    }

    /// Everything logged so far, for failure messages.
    fn log_text(&mut self) -> String {
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
            self.log.push(line);
        }
        self.log.join("\n")
    }

    fn metrics_addr(&mut self) -> SocketAddr {
        let line = self.wait_log("listening on http://", Duration::from_secs(10));
        let rest = line.split("http://").nth(1).unwrap();
        rest.split('/').next().unwrap().parse().unwrap()
    }

    fn signal(&self, sig: libc::c_int) {
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }

    /// SIGTERM, then the exit code (killed after 20 s).
    fn stop(&mut self) -> Option<i32> {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

/// One scrape over loopback, parsed into `name{labels}` -> value.
fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
    let body = resp.split("\r\n\r\n").nth(1).unwrap();
    parse_exposition(body)
}

fn parse_exposition(body: &str) -> BTreeMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// Scrapes until `pred` holds; returns that scrape.
fn scrape_until(
    addr: SocketAddr,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&BTreeMap<String, f64>) -> bool,
) -> BTreeMap<String, f64> {
    let deadline = Instant::now() + timeout;
    loop {
        let m = scrape(addr);
        if pred(&m) {
            return m;
        }
        if Instant::now() > deadline {
            panic!("{what} not seen within {timeout:?}; last scrape: {m:#?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn write_config(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    // A root daemon refuses a config others can write.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn sighup_with_a_broken_config_keeps_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("gleaner.toml");
    let valid = |target: &str| {
        format!(
            "state_dir = \"{}\"\nretention_timeout_us = 100\n[metrics]\nlisten = \"127.0.0.1:0\"\n[[target]]\nname = \"{target}\"\ncgroup = \"{}\"\n",
            state.display(),
            dir.path().join("absent").display()
        )
    };
    write_config(&config, &valid("a"));
    let mut daemon = Daemon::start(&config);
    let addr = daemon.metrics_addr();
    daemon.wait_log("waiting:", Duration::from_secs(10));
    let m = scrape(addr);
    assert_eq!(m["gleaner_config_last_reload_successful"], 1.0);
    assert_eq!(m["gleaner_target_up{target=\"a\"}"], 0.0);
    let loaded_at = m["gleaner_config_last_reload_success_timestamp_seconds"];

    // Broken: rho out of range in a new target. Nothing of it may be applied.
    write_config(
        &config,
        &format!(
            "{}[[target]]\nname = \"b\"\ncgroup = \"/x\"\n[target.policy]\nrho = 2.0\n",
            valid("a")
        ),
    );
    daemon.signal(libc::SIGHUP);
    let line = daemon.wait_log("reload failed", Duration::from_secs(10));
    assert!(
        line.contains("keeping the running configuration")
            && line.contains("rho = 2 is outside (0, 1]"),
        "{line}"
    );
    let m = scrape_until(addr, Duration::from_secs(5), "failed reload", |m| {
        m["gleaner_config_last_reload_successful"] == 0.0
    });
    assert!(m.contains_key("gleaner_target_up{target=\"a\"}"), "{m:#?}");
    assert!(!m.contains_key("gleaner_target_up{target=\"b\"}"), "{m:#?}");
    assert_eq!(
        m["gleaner_config_last_reload_success_timestamp_seconds"],
        loaded_at
    );

    // Unreadable TOML is refused the same way, and the daemon keeps serving.
    write_config(&config, "[metrics\n");
    daemon.signal(libc::SIGHUP);
    daemon.log.clear();
    let line = daemon.wait_log("reload failed", Duration::from_secs(10));
    assert!(line.contains("malformed TOML"), "{line}");

    // A valid config is applied: target a replaced by target c.
    write_config(&config, &valid("c"));
    daemon.signal(libc::SIGHUP);
    daemon.wait_log("configuration reloaded", Duration::from_secs(10));
    let m = scrape_until(addr, Duration::from_secs(5), "successful reload", |m| {
        m["gleaner_config_last_reload_successful"] == 1.0
    });
    assert!(m.contains_key("gleaner_target_up{target=\"c\"}"), "{m:#?}");
    assert!(!m.contains_key("gleaner_target_up{target=\"a\"}"), "{m:#?}");
    assert_eq!(daemon.stop(), Some(0));
}

#[test]
fn check_flag_validates_without_starting() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gleaner.toml");
    write_config(
        &config,
        "[[target]]\nunit = \"mysql.service\"\n[metrics]\nlisten = \"127.0.0.1:9477\"\n",
    );
    let out = Command::new(GLEANER)
        .args(["daemon", "--check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("valid") && text.contains("target mysql.service"),
        "{text}"
    );
    write_config(&config, "[metrics]\nlisten = \"0.0.0.0:9477\"\n");
    let out = Command::new(GLEANER)
        .args(["daemon", "--check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("allow_non_loopback") && err.lines().count() == 1,
        "{err}"
    );
}

/// A cpuset cgroup created for the test and removed on every exit path: its processes are
/// killed first (they are the test's own workload).
struct TestCgroup {
    dir: PathBuf,
}

impl TestCgroup {
    fn create() -> Option<TestCgroup> {
        TestCgroup::create_named("svc")
    }

    /// `gleaner-test-<what>-<pid>` in the v1 cpuset hierarchy, with all CPUs and memory nodes.
    fn create_named(what: &str) -> Option<TestCgroup> {
        if unsafe { libc::geteuid() } != 0 {
            common::skipped("service cgroup test", "needs root to create a cgroup");
            return None;
        }
        let root = Path::new("/sys/fs/cgroup/cpuset");
        if !root.join("cpuset.cpus").exists() {
            common::skipped(
                "service cgroup test",
                &format!("no cgroup v1 cpuset hierarchy at {}", root.display()),
            );
            return None;
        }
        let cpus = std::fs::read_to_string(root.join("cpuset.cpus")).unwrap();
        if !cpus.trim().contains(['-', ',']) {
            common::skipped(
                "service cgroup test",
                &format!("needs at least 2 CPUs, have {}", cpus.trim()),
            );
            return None;
        }
        let dir = root.join(format!("gleaner-test-{what}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let cg = TestCgroup { dir };
        std::fs::write(cg.dir.join("cpuset.cpus"), cpus.trim()).unwrap();
        std::fs::write(
            cg.dir.join("cpuset.mems"),
            std::fs::read_to_string(root.join("cpuset.mems"))
                .unwrap()
                .trim(),
        )
        .unwrap();
        Some(cg)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if std::fs::remove_dir(&self.dir).is_ok()
                || !self.dir.exists()
                || Instant::now() > deadline
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Kills and reaps on every exit path.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn daemon_manages_a_real_cgroup_and_its_metrics_move_with_the_workload() {
    let Some(cg) = TestCgroup::create() else {
        return;
    };
    let original_cpus = std::fs::read_to_string(cg.dir.join("cpuset.cpus")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let textfile = dir.path().join("gleaner.prom");
    let config = dir.path().join("gleaner.toml");
    let text = format!(
        "state_dir = \"{}\"\nretention_timeout_us = 100\n[metrics]\nlisten = \"127.0.0.1:0\"\ntextfile = \"{}\"\ntextfile_interval_s = 1\n[[target]]\nname = \"svc\"\ncgroup = \"{}\"\n",
        state.display(),
        textfile.display(),
        cg.dir.display()
    );
    write_config(&config, &text);

    // The workload idles 1 s, then runs a small pipeline (blocking hand-offs: idle
    // transitions) for 4 s, then idles again; it enters the cgroup before exec.
    let script = format!(
        "echo $$ > {}/cgroup.procs && sleep 1 && {GLEANER} workload pipeline --stages 2 --threads-per-stage 1 --duration 4s >/dev/null && exec sleep 30",
        cg.dir.display()
    );
    let _workload = Reaped(
        Command::new("sh")
            .arg("-c")
            .arg(&script)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut daemon = Daemon::start(&config);
    let addr = daemon.metrics_addr();

    let up = |m: &BTreeMap<String, f64>| {
        m.get("gleaner_target_up{target=\"svc\"}") == Some(&1.0)
            && m.contains_key("gleaner_periods_total{target=\"svc\"}")
    };
    let first = scrape_until(addr, Duration::from_secs(10), "the target managed", up);
    let p0 = first["gleaner_periods_total{target=\"svc\"}"];
    let busy = scrape_until(
        addr,
        Duration::from_secs(10),
        "the workload's CPU use",
        |m| {
            m.get("gleaner_workload_cpus{target=\"svc\"}")
                .is_some_and(|v| *v > 0.2)
        },
    );
    // Idle transitions depend on what else this machine runs; they must be there per vCPU.
    let transitions: Vec<f64> = busy
        .iter()
        .filter(|(k, _)| k.starts_with("gleaner_vcpu_idle_transitions_per_second{target=\"svc\""))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(
        transitions.len() as f64,
        busy["gleaner_allowed_vcpus{target=\"svc\"}"],
        "{busy:#?}"
    );
    assert!(
        transitions.iter().all(|t| t.is_finite() && *t >= 0.0),
        "{busy:#?}"
    );
    let later = scrape_until(addr, Duration::from_secs(10), "periods advancing", |m| {
        m.get("gleaner_periods_total{target=\"svc\"}")
            .is_some_and(|p| *p >= p0 + 10.0)
    });
    assert!(
        later["gleaner_cpu_seconds_total{target=\"svc\"}"]
            > first["gleaner_cpu_seconds_total{target=\"svc\"}"]
    );
    assert_eq!(
        later["gleaner_instance_start_time_seconds{target=\"svc\"}"],
        first["gleaner_instance_start_time_seconds{target=\"svc\"}"]
    );
    let idle_total = |m: &BTreeMap<String, f64>| {
        m.iter()
            .filter(|(k, _)| k.starts_with("gleaner_vcpu_idle_transitions_total{target=\"svc\""))
            .map(|(_, v)| *v)
            .sum::<f64>()
    };
    assert!(
        idle_total(&later) >= idle_total(&first),
        "a counter never goes down: {first:#?} {later:#?}"
    );
    assert_eq!(
        later["gleaner_allowed_vcpus{target=\"svc\"}"],
        original_cpus
            .trim()
            .parse::<gleaner_policy::Cpuset>()
            .unwrap()
            .len() as f64
    );
    assert_eq!(later["gleaner_target_restarts_total{target=\"svc\"}"], 0.0);
    // When the pipeline ends (the workload then only sleeps), its CPU use falls back.
    scrape_until(
        addr,
        Duration::from_secs(10),
        "the workload's CPU use falling",
        |m| {
            m.get("gleaner_workload_cpus{target=\"svc\"}")
                .is_some_and(|v| *v < 0.05)
        },
    );

    // The node_exporter textfile carries the same families.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !textfile.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let tf = parse_exposition(&std::fs::read_to_string(&textfile).unwrap());
    assert_eq!(tf["gleaner_target_up{target=\"svc\"}"], 1.0, "{tf:#?}");

    // A broken reload leaves the running instance alone: same instance, still counting.
    let pid_before = daemon.wait_log("managing target", Duration::from_secs(1));
    write_config(
        &config,
        &text.replace("retention_timeout_us = 100", "retention_timeout_us = 0"),
    );
    daemon.signal(libc::SIGHUP);
    daemon.wait_log("reload failed", Duration::from_secs(10));
    let after = scrape_until(
        addr,
        Duration::from_secs(10),
        "periods advancing after the failed reload",
        |m| {
            m.get("gleaner_periods_total{target=\"svc\"}")
                .is_some_and(|p| *p >= later["gleaner_periods_total{target=\"svc\"}"] + 5.0)
        },
    );
    let log = daemon.log_text();
    assert_eq!(
        after["gleaner_config_last_reload_successful"], 0.0,
        "log:\n{log}"
    );
    assert_eq!(
        after["gleaner_target_restarts_total{target=\"svc\"}"], 0.0,
        "{pid_before}\nlog:\n{log}"
    );
    assert_eq!(
        daemon
            .log
            .iter()
            .filter(|l| l.contains("managing target"))
            .count(),
        1,
        "{pid_before}"
    );

    assert_eq!(daemon.stop(), Some(0), "log:\n{}", daemon.log.join("\n"));
    assert_eq!(
        std::fs::read_to_string(cg.dir.join("cpuset.cpus")).unwrap(),
        original_cpus,
        "CPUs given back"
    );
    assert!(!textfile.exists(), "stale textfile removed on stop");
    let journals: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .collect();
    assert!(journals.is_empty(), "journals left: {journals:?}");
}

/// `setpriv` arguments that give a process exactly what packaging/gleaner.service gives the
/// daemon: the capability bounding set named there, no inheritable or ambient capabilities,
/// no new privileges. Read from the unit file, so the test follows any change to it.
fn unit_capabilities() -> Vec<String> {
    let unit = gleaner_daemon::unit::UNIT;
    assert!(
        unit.lines()
            .any(|l| l.starts_with("CapabilityBoundingSet=")),
        "the unit names no CapabilityBoundingSet"
    );
    assert!(unit.lines().any(|l| l == "NoNewPrivileges=yes"));
    assert!(unit.lines().any(|l| l == "AmbientCapabilities="));
    gleaner_daemon::unit::setpriv_args()
}

fn setpriv_works() -> bool {
    let mut c = unit_capabilities();
    c.push("true".into());
    Command::new(&c[0])
        .args(&c[1..])
        .status()
        .is_ok_and(|s| s.success())
}

/// Issue 15 item 1: under the unit's capability set (no CAP_DAC_OVERRIDE, so the v1 cpuset
/// root, mode 0555, is not writable) an existing cgroup v1 group must be managed, `--check`
/// must say so, and a group whose cpuset.cpus cannot be written must be reported as failing
/// by both `--check` and the running daemon (`gleaner status`), with the same reason.
#[test]
fn daemon_under_the_units_capabilities_manages_a_cgroup_v1_target() {
    if unsafe { libc::geteuid() } == 0 && !setpriv_works() {
        common::skipped(
            "daemon_under_the_units_capabilities_manages_a_cgroup_v1_target",
            "setpriv (util-linux) is missing or cannot drop capabilities here",
        );
        return;
    }
    let Some(cg) = TestCgroup::create_named("caps") else {
        return;
    };
    let Some(ro) = TestCgroup::create_named("caps-ro") else {
        return;
    };
    let original_cpus = std::fs::read_to_string(cg.dir.join("cpuset.cpus")).unwrap();
    // The read-only group: only its owner's write bit is off, as an operator might leave it.
    std::fs::set_permissions(
        ro.dir.join("cpuset.cpus"),
        std::fs::Permissions::from_mode(0o444),
    )
    .unwrap();
    let workload = |dir: &Path| {
        Reaped(
            Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "echo $$ > {}/cgroup.procs && exec sleep 60",
                    dir.display()
                ))
                .spawn()
                .unwrap(),
        )
    };
    let _w1 = workload(&cg.dir);
    let _w2 = workload(&ro.dir);
    let deadline = Instant::now() + Duration::from_secs(5);
    while [&cg.dir, &ro.dir].iter().any(|d| {
        std::fs::read_to_string(d.join("cgroup.procs"))
            .unwrap_or_default()
            .trim()
            .is_empty()
    }) {
        assert!(
            Instant::now() < deadline,
            "the workloads did not enter their cgroups"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("gleaner.toml");
    write_config(
        &config,
        &format!(
            "state_dir = \"{}\"\nretention_timeout_us = 100\n[metrics]\nlisten = \"127.0.0.1:0\"\n[[target]]\nname = \"caps\"\ncgroup = \"{}\"\n[[target]]\nname = \"readonly\"\ncgroup = \"{}\"\n",
            state.display(),
            cg.dir.display(),
            ro.dir.display()
        ),
    );
    let caps = unit_capabilities();

    // --check under the same capabilities: the writable group resolves, the other cannot be managed.
    let out = Command::new(&caps[0])
        .args(&caps[1..])
        .arg(GLEANER)
        .args(["daemon", "--check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let check = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{out:?}");
    let line_of = |name: &str| {
        check
            .lines()
            .find(|l| l.contains(&format!("target {name}:")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line_of("caps").ends_with(&format!("-> {}", cg.dir.display())),
        "{check}"
    );
    assert!(
        line_of("readonly").contains("cannot be managed")
            && line_of("readonly").contains("not writable"),
        "{check}"
    );

    let mut daemon = Daemon::start_as(&caps, &config);
    let addr = daemon.metrics_addr();
    let managed = scrape_until(
        addr,
        Duration::from_secs(20),
        "the v1 target managed under the unit's capabilities",
        |m| {
            m.get("gleaner_periods_total{target=\"caps\"}")
                .is_some_and(|p| *p >= 3.0)
        },
    );
    assert_eq!(managed["gleaner_target_up{target=\"caps\"}"], 1.0);
    assert_eq!(
        managed["gleaner_target_state{target=\"caps\",state=\"managed\"}"],
        1.0
    );
    assert_eq!(
        managed["gleaner_target_state{target=\"readonly\",state=\"failing\"}"], 1.0,
        "{managed:#?}"
    );
    assert_eq!(
        managed["gleaner_target_restarts_total{target=\"caps\"}"],
        0.0,
        "log:\n{}",
        daemon.log_text()
    );

    // `gleaner status --config` finds the state directory from the config and shows both.
    let out = Command::new(GLEANER)
        .args(["status", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{out:?}");
    assert!(
        status.contains("target caps: managed by instance"),
        "{status}"
    );
    assert!(
        status.contains("target readonly: failing:") && status.contains("not writable"),
        "{status}"
    );

    assert_eq!(daemon.stop(), Some(0), "log:\n{}", daemon.log.join("\n"));
    assert_eq!(
        std::fs::read_to_string(cg.dir.join("cpuset.cpus")).unwrap(),
        original_cpus,
        "CPUs given back"
    );
    assert!(
        !state.join("daemon.status").exists(),
        "the daemon's status file outlived it"
    );
}

fn assert_all_json(lines: &[String]) {
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| {
            panic!(
                "not a JSON line ({e}): {l:?}\nall lines:\n{}",
                lines.join("\n")
            )
        });
        assert!(
            v.get("fields").is_none(),
            "fields nested instead of flat: {l}"
        );
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{l}");
    }
}

/// Issue 15 item 4: under `--log-format json` the daemon's lines, its instances' and their
/// guards' are all JSON, flat, lists as arrays.
#[test]
fn json_logs_are_json_throughout() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("gleaner.toml");
    let cfg = |name: &str| {
        format!(
            "state_dir = \"{}\"\nretention_timeout_us = 100\n[metrics]\nlisten = \"127.0.0.1:0\"\n[[target]]\nname = \"{name}\"\ncgroup = \"{}\"\n",
            state.display(),
            dir.path().join("absent").display()
        )
    };
    write_config(&config, &cfg("a"));
    let mut child = Command::new(GLEANER)
        .args(["--log-format", "json", "daemon", "--config"])
        .arg(&config)
        .env("GLEANER_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut daemon = Daemon {
        child,
        lines,
        log: vec![],
    };
    daemon.wait_log("waiting", Duration::from_secs(10));
    write_config(&config, &cfg("b"));
    daemon.signal(libc::SIGHUP);
    let reloaded = daemon.wait_log("configuration reloaded", Duration::from_secs(10));
    let v: serde_json::Value = serde_json::from_str(&reloaded).unwrap();
    assert_eq!(v["added"], serde_json::json!(["b"]), "{reloaded}");
    assert_eq!(v["removed"], serde_json::json!(["a"]), "{reloaded}");
    assert_eq!(daemon.stop(), Some(0));
    let log = daemon.log_text();
    assert_all_json(&daemon.log);
    assert!(!log.is_empty());

    // An instance killed at once: its guard restores and says so, in JSON as well.
    let run_state = dir.path().join("run");
    let mut inst = Command::new(GLEANER)
        .args(["--log-format", "json", "run", "--state-dir"])
        .arg(&run_state)
        .args([
            "--period-ms",
            "20",
            "--retention-timeout-us",
            "50",
            "--",
            "sleep",
            "30",
        ])
        .env("GLEANER_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = inst.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !run_state.join(format!("{pid}.status")).exists() {
        assert!(
            Instant::now() < deadline,
            "the instance never wrote its status"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The workload (sleep) shares the stderr pipe: it is killed too, so the pipe closes
    // once the guard has exited.
    let workload: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let after_comm = stat
                .rsplit_once(')')
                .map(|(_, r)| r.to_string())
                .unwrap_or_default();
            after_comm.split_whitespace().nth(1) == Some(&pid.to_string())
                && stat.contains("(sleep)")
        })
        .collect();
    let _ = inst.kill();
    let _ = inst.wait();
    for p in workload {
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    let mut text = String::new();
    inst.stderr
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let lines: Vec<String> = text.lines().map(String::from).collect();
    assert_all_json(&lines);
    assert!(
        lines.iter().any(|l| l.contains("gleaner guard")),
        "no line from the guard:\n{text}"
    );
}

/// What systemd sees of a `Type=notify` service with `WatchdogSec=`, short of running under
/// systemd (this test machine's PID 1 is not systemd): the daemon is started with the
/// environment systemd gives it, a datagram socket standing in for systemd's, and must
/// announce readiness, feed the watchdog at half its interval, announce a reload and its end,
/// and announce stopping on SIGTERM.
#[test]
fn daemon_speaks_systemds_notify_protocol() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let config = dir.path().join("gleaner.toml");
    write_config(
        &config,
        &format!(
            "state_dir = \"{}\"\nretention_timeout_us = 100\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
            dir.path().join("state").display()
        ),
    );
    // WatchdogSec=0.4s: pings are due every 0.2 s.
    let env = [
        ("NOTIFY_SOCKET", socket_path.display().to_string()),
        ("WATCHDOG_USEC", "400000".to_string()),
    ];
    let mut daemon = Daemon::start_with(&[], &env, &config);
    let mut seen: Vec<String> = Vec::new();
    let collect_until =
        |seen: &mut Vec<String>, done: &dyn Fn(&[String]) -> bool, within: Duration| {
            let deadline = Instant::now() + within;
            let mut buf = [0u8; 4096];
            while !done(seen) && Instant::now() < deadline {
                if let Ok(n) = socket.recv(&mut buf) {
                    seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                }
            }
            done(seen)
        };
    let count =
        |seen: &[String], what: &str| seen.iter().filter(|m| m.lines().any(|l| l == what)).count();
    assert!(
        collect_until(
            &mut seen,
            &|s| count(s, "READY=1") >= 1,
            Duration::from_secs(10)
        ),
        "no READY=1: {seen:?}\n{}",
        daemon.log_text()
    );
    // Two pings within two seconds: the interval is 0.2 s, so missing both means no watchdog.
    let start = seen.len();
    assert!(
        collect_until(
            &mut seen,
            &|s| count(&s[start..], "WATCHDOG=1") >= 2,
            Duration::from_secs(2)
        ),
        "watchdog not fed: {seen:?}"
    );
    daemon.signal(libc::SIGHUP);
    assert!(
        collect_until(
            &mut seen,
            &|s| count(s, "RELOADING=1") >= 1 && count(s, "READY=1") >= 2,
            Duration::from_secs(10)
        ),
        "no reload announced: {seen:?}"
    );
    daemon.signal(libc::SIGTERM);
    assert!(
        collect_until(
            &mut seen,
            &|s| count(s, "STOPPING=1") >= 1,
            Duration::from_secs(10)
        ),
        "no STOPPING=1: {seen:?}"
    );
    assert_eq!(daemon.stop(), Some(0));
}
