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
        let mut child = Command::new(GLEANER)
            .args(["daemon", "--config"])
            .arg(config)
            .env("GLEANER_LOG", "info")
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
        Daemon { child, lines, log: vec![] }
    }

    /// Waits for a log line containing `needle`; returns it.
    fn wait_log(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        if let Some(l) = self.log.iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        while let Ok(line) = self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            self.log.push(line.clone());
            if line.contains(needle) {
                return line;
            }
        }
        panic!("no log line with {needle:?} within {timeout:?}; log so far:\n{}", self.log.join("\n"));
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
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
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
fn scrape_until(addr: SocketAddr, timeout: Duration, what: &str, pred: impl Fn(&BTreeMap<String, f64>) -> bool) -> BTreeMap<String, f64> {
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
    write_config(&config, &format!("{}[[target]]\nname = \"b\"\ncgroup = \"/x\"\n[target.policy]\nrho = 2.0\n", valid("a")));
    daemon.signal(libc::SIGHUP);
    let line = daemon.wait_log("reload failed", Duration::from_secs(10));
    assert!(line.contains("keeping the running configuration") && line.contains("rho = 2 is outside (0, 1]"), "{line}");
    let m = scrape_until(addr, Duration::from_secs(5), "failed reload", |m| m["gleaner_config_last_reload_successful"] == 0.0);
    assert!(m.contains_key("gleaner_target_up{target=\"a\"}"), "{m:#?}");
    assert!(!m.contains_key("gleaner_target_up{target=\"b\"}"), "{m:#?}");
    assert_eq!(m["gleaner_config_last_reload_success_timestamp_seconds"], loaded_at);

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
    let m = scrape_until(addr, Duration::from_secs(5), "successful reload", |m| m["gleaner_config_last_reload_successful"] == 1.0);
    assert!(m.contains_key("gleaner_target_up{target=\"c\"}"), "{m:#?}");
    assert!(!m.contains_key("gleaner_target_up{target=\"a\"}"), "{m:#?}");
    assert_eq!(daemon.stop(), Some(0));
}

#[test]
fn check_flag_validates_without_starting() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gleaner.toml");
    write_config(&config, "[[target]]\nunit = \"mysql.service\"\n[metrics]\nlisten = \"127.0.0.1:9477\"\n");
    let out = Command::new(GLEANER).args(["daemon", "--check", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("valid") && text.contains("target mysql.service"), "{text}");
    write_config(&config, "[metrics]\nlisten = \"0.0.0.0:9477\"\n");
    let out = Command::new(GLEANER).args(["daemon", "--check", "--config"]).arg(&config).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("allow_non_loopback") && err.lines().count() == 1, "{err}");
}

/// A cpuset cgroup created for the test and removed on every exit path: its processes are
/// killed first (they are the test's own workload).
struct TestCgroup {
    dir: PathBuf,
}

impl TestCgroup {
    fn create() -> Option<TestCgroup> {
        if unsafe { libc::geteuid() } != 0 {
            common::skipped("service cgroup test", "needs root to create a cgroup");
            return None;
        }
        let root = Path::new("/sys/fs/cgroup/cpuset");
        if !root.join("cpuset.cpus").exists() {
            common::skipped("service cgroup test", &format!("no cgroup v1 cpuset hierarchy at {}", root.display()));
            return None;
        }
        let cpus = std::fs::read_to_string(root.join("cpuset.cpus")).unwrap();
        if !cpus.trim().contains(['-', ',']) {
            common::skipped("service cgroup test", &format!("needs at least 2 CPUs, have {}", cpus.trim()));
            return None;
        }
        let dir = root.join(format!("gleaner-test-svc-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let cg = TestCgroup { dir };
        std::fs::write(cg.dir.join("cpuset.cpus"), cpus.trim()).unwrap();
        std::fs::write(cg.dir.join("cpuset.mems"), std::fs::read_to_string(root.join("cpuset.mems")).unwrap().trim()).unwrap();
        Some(cg)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() || Instant::now() > deadline {
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
    let Some(cg) = TestCgroup::create() else { return };
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
    let _workload = Reaped(Command::new("sh").arg("-c").arg(&script).stdout(Stdio::null()).spawn().unwrap());
    let mut daemon = Daemon::start(&config);
    let addr = daemon.metrics_addr();

    let up = |m: &BTreeMap<String, f64>| m.get("gleaner_target_up{target=\"svc\"}") == Some(&1.0) && m.contains_key("gleaner_periods_total{target=\"svc\"}");
    let first = scrape_until(addr, Duration::from_secs(10), "the target managed", up);
    let p0 = first["gleaner_periods_total{target=\"svc\"}"];
    let busy = scrape_until(addr, Duration::from_secs(10), "the workload's CPU use", |m| m.get("gleaner_workload_cpus{target=\"svc\"}").is_some_and(|v| *v > 0.2));
    // Idle transitions depend on what else this machine runs; they must be there per vCPU.
    let transitions: Vec<f64> = busy.iter().filter(|(k, _)| k.starts_with("gleaner_vcpu_idle_transitions_per_second{target=\"svc\"")).map(|(_, v)| *v).collect();
    assert_eq!(transitions.len() as f64, busy["gleaner_allowed_vcpus{target=\"svc\"}"], "{busy:#?}");
    assert!(transitions.iter().all(|t| t.is_finite() && *t >= 0.0), "{busy:#?}");
    let later = scrape_until(addr, Duration::from_secs(10), "periods advancing", |m| m.get("gleaner_periods_total{target=\"svc\"}").is_some_and(|p| *p >= p0 + 10.0));
    assert!(later["gleaner_cpu_seconds_total{target=\"svc\"}"] > first["gleaner_cpu_seconds_total{target=\"svc\"}"]);
    assert!(later["gleaner_uptime_seconds{target=\"svc\"}"] > first["gleaner_uptime_seconds{target=\"svc\"}"]);
    assert_eq!(later["gleaner_allowed_vcpus{target=\"svc\"}"], original_cpus.trim().parse::<gleaner_policy::Cpuset>().unwrap().len() as f64);
    assert_eq!(later["gleaner_target_restarts_total{target=\"svc\"}"], 0.0);
    // When the pipeline ends (the workload then only sleeps), its CPU use falls back.
    scrape_until(addr, Duration::from_secs(10), "the workload's CPU use falling", |m| m.get("gleaner_workload_cpus{target=\"svc\"}").is_some_and(|v| *v < 0.05));

    // The node_exporter textfile carries the same families.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !textfile.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let tf = parse_exposition(&std::fs::read_to_string(&textfile).unwrap());
    assert_eq!(tf["gleaner_target_up{target=\"svc\"}"], 1.0, "{tf:#?}");

    // A broken reload leaves the running instance alone: same instance, still counting.
    let pid_before = daemon.wait_log("managing target", Duration::from_secs(1));
    write_config(&config, &text.replace("retention_timeout_us = 100", "retention_timeout_us = 0"));
    daemon.signal(libc::SIGHUP);
    daemon.wait_log("reload failed", Duration::from_secs(10));
    let after = scrape_until(addr, Duration::from_secs(10), "periods advancing after the failed reload", |m| {
        m.get("gleaner_periods_total{target=\"svc\"}").is_some_and(|p| *p >= later["gleaner_periods_total{target=\"svc\"}"] + 5.0)
    });
    let log = daemon.log_text();
    assert_eq!(after["gleaner_config_last_reload_successful"], 0.0, "log:\n{log}");
    assert_eq!(after["gleaner_target_restarts_total{target=\"svc\"}"], 0.0, "{pid_before}\nlog:\n{log}");
    assert_eq!(daemon.log.iter().filter(|l| l.contains("managing target")).count(), 1, "{pid_before}");

    assert_eq!(daemon.stop(), Some(0), "log:\n{}", daemon.log.join("\n"));
    assert_eq!(std::fs::read_to_string(cg.dir.join("cpuset.cpus")).unwrap(), original_cpus, "CPUs given back");
    assert!(!textfile.exists(), "stale textfile removed on stop");
    let journals: Vec<_> = std::fs::read_dir(&state).unwrap().flatten().filter(|e| e.path().extension().is_some_and(|x| x == "json")).collect();
    assert!(journals.is_empty(), "journals left: {journals:?}");
}
