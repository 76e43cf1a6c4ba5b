//! What the safety tests share: starting `gleaner` on a real workload, reading its cgroups,
//! threads and status, and checking that nothing is left behind.
//!
//! A module of its own so that the safety tests can be split by what they break (the
//! instance killed or stopped, in `safety.rs`; the environment changed under it, in
//! `environment.rs`); each test crate uses only part of it.

#![allow(dead_code)] // each test crate that includes this uses only some of it

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::common;

pub const CPUSET: &str = "/sys/fs/cgroup/cpuset";
pub const CPUACCT: &str = "/sys/fs/cgroup/cpuacct";

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// True (after printing why) when this machine cannot run the real-cgroup tests.
pub fn skip_without_root_v1(test: &str) -> bool {
    if !is_root() {
        common::skipped(test, "needs root");
        return true;
    }
    if !Path::new(CPUSET).join("cpuset.cpus").exists() {
        common::skipped(test, &format!("no cgroup v1 cpuset hierarchy at {CPUSET}"));
        return true;
    }
    false
}

pub fn gleaner() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gleaner"));
    c.env("GLEANER_LOG", "warn");
    c
}

/// `gleaner run|attach` flags that keep a test short and skip the wake-latency calibration.
pub fn fast_flags(state: &Path) -> Vec<String> {
    flags_with_period(state, 20)
}

/// As `fast_flags`, with control periods of `period_ms`.
pub fn flags_with_period(state: &Path, period_ms: u32) -> Vec<String> {
    let period = period_ms.to_string();
    [
        "--state-dir",
        state.to_str().unwrap(),
        "--period-ms",
        &period,
        "--retention-timeout-us",
        "50",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

pub fn status_line(pid: u32, tid: u32, key: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(key)
            .map(|v| v.trim_start_matches(':').trim().to_string())
    })
}

pub fn allowed_cpus(pid: u32) -> Option<String> {
    status_line(pid, pid, "Cpus_allowed_list")
}

pub fn is_alive(pid: u32) -> bool {
    status_line(pid, pid, "State").is_some_and(|s| !s.starts_with('Z') && !s.starts_with('X'))
}

/// The v1 cpuset and cpuacct paths of a process, from `/proc/PID/cgroup`.
pub fn v1_cgroups(pid: &str) -> Vec<(String, String)> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut out: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctl, path) = (parts.next()?, parts.next()?, parts.next()?);
            ctl.split(',')
                .find(|c| *c == "cpuset" || *c == "cpuacct")
                .map(|c| (c.to_string(), path.to_string()))
        })
        .collect();
    out.sort();
    out
}

pub fn cgroup_dirs(gleaner_pid: u32) -> [PathBuf; 2] {
    [
        Path::new(CPUSET).join(format!("gleaner-{gleaner_pid}")),
        Path::new(CPUACCT).join(format!("gleaner-{gleaner_pid}")),
    ]
}

/// Asserts that instance `gleaner_pid` left no cgroup, journal or status file.
pub fn assert_nothing_left(gleaner_pid: u32, state: &Path) {
    for d in cgroup_dirs(gleaner_pid) {
        assert!(!d.exists(), "{} left behind", d.display());
    }
    for ext in ["json", "status"] {
        let f = state.join(format!("{gleaner_pid}.{ext}"));
        assert!(!f.exists(), "{} left behind", f.display());
    }
}

pub fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A started `gleaner run|attach` whose stderr goes to a file: the workload inherits that
/// stderr, so a pipe would stay open (and `wait_with_output` block) as long as it lives.
pub struct Started {
    pub child: Child,
    pub stderr: tempfile::NamedTempFile,
}

impl Started {
    pub fn new(cmd: &mut Command) -> Self {
        let stderr = tempfile::NamedTempFile::new().unwrap();
        let child = cmd
            .stdout(Stdio::null())
            .stderr(stderr.reopen().unwrap())
            .spawn()
            .unwrap();
        Started { child, stderr }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for exit; returns (exit code, stderr text).
    pub fn finish(mut self) -> (Option<i32>, String) {
        let status = self.child.wait().unwrap();
        (
            status.code(),
            fs::read_to_string(self.stderr.path()).unwrap_or_default(),
        )
    }
}

/// Kills a process the test started and reaps it.
pub fn kill_child(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

pub fn kill_pid(pid: u32) {
    // SAFETY: kill has no memory preconditions; the pid is one this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// Reads the first pid in a cgroup's `cgroup.procs`, waiting for the workload to enter it.
pub fn workload_pid_in(dir: &Path) -> u32 {
    let procs = dir.join("cgroup.procs");
    let mut pid = None;
    assert!(
        wait_until(Duration::from_secs(5), || {
            pid = fs::read_to_string(&procs)
                .ok()
                .and_then(|t| t.split_whitespace().next().and_then(|w| w.parse().ok()));
            pid.is_some()
        }),
        "no workload appeared in {}",
        procs.display()
    );
    pid.unwrap()
}

/// A `gleaner run` managing a workload: the workload is in Gleaner's cgroup and the
/// controller has run its first periods. Most environment-change tests start from here.
pub struct Managed {
    pub state: tempfile::TempDir,
    pub gleaner: Started,
    pub gleaner_pid: u32,
    pub workload_pid: u32,
}

impl Managed {
    /// Starts `gleaner run` with `period_ms` periods on `workload` and waits (5 s at most) for
    /// the workload to enter its cgroup and for `periods` periods to pass.
    pub fn start(period_ms: u32, workload: &[&str], periods: u64) -> Self {
        let state = tempfile::tempdir().unwrap();
        let gleaner = Started::new(
            gleaner()
                .arg("run")
                .args(flags_with_period(state.path(), period_ms))
                .arg("--")
                .args(workload),
        );
        let gleaner_pid = gleaner.id();
        let workload_pid = workload_pid_in(&cgroup_dirs(gleaner_pid)[0]);
        let started = Self {
            state,
            gleaner,
            gleaner_pid,
            workload_pid,
        };
        assert!(
            wait_until(Duration::from_secs(5), || started.periods() >= periods),
            "the controller never ran {periods} periods"
        );
        started
    }

    pub fn periods(&self) -> u64 {
        periods_in_status(self.state.path(), self.gleaner_pid)
    }

    pub fn status(&self) -> serde_json::Value {
        status_json(self.state.path(), self.gleaner_pid)
    }

    /// Sends SIGTERM and waits; returns (exit code, stderr, state dir). The workload is left
    /// running: the caller inspects and then kills it.
    pub fn terminate(self) -> (Option<i32>, String, tempfile::TempDir) {
        signal(self.gleaner_pid, libc::SIGTERM);
        let (code, err) = self.gleaner.finish();
        (code, err, self.state)
    }
}

pub fn periods_in_status(state: &Path, gleaner_pid: u32) -> u64 {
    status_json(state, gleaner_pid)["periods"]
        .as_u64()
        .unwrap_or(0)
}

/// The status file of instance `gleaner_pid`, parsed, or Null while there is none.
pub fn status_json(state: &Path, gleaner_pid: u32) -> serde_json::Value {
    fs::read_to_string(state.join(format!("{gleaner_pid}.status")))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null)
}

pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill has no memory preconditions; the pid is one this test started.
    unsafe { libc::kill(pid as i32, sig) };
}
