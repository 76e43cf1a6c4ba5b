//! Safety tests of the `gleaner` binary on the real kernel (issue 5).
//!
//! Exists because the guarantees that matter most — a workload is never left confined, a
//! cgroup is never left behind, a bad input never crashes Gleaner — only hold if they hold
//! for the real binary against the real cgroup v1 cpuset and affinity calls, killed for real.
//! Tests that need root and a v1 cpuset hierarchy print why and pass when those are missing.
//! Every test uses its own state dir and checks that its `gleaner-<pid>` cgroups, journal and
//! status file are gone afterwards. The random-moment kill test is `tests/kill_test.sh`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const CPUSET: &str = "/sys/fs/cgroup/cpuset";
const CPUACCT: &str = "/sys/fs/cgroup/cpuacct";

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// True (after printing why) when this machine cannot run the real-cgroup tests.
fn skip_without_root_v1(test: &str) -> bool {
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

fn gleaner() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gleaner"));
    c.env("GLEANER_LOG", "warn");
    c
}

/// `gleaner run|attach` flags that keep a test short and skip the wake-latency calibration.
fn fast_flags(state: &Path) -> Vec<String> {
    flags_with_period(state, 20)
}

/// As `fast_flags`, with control periods of `period_ms`.
fn flags_with_period(state: &Path, period_ms: u32) -> Vec<String> {
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

fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

fn status_line(pid: u32, tid: u32, key: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(key)
            .map(|v| v.trim_start_matches(':').trim().to_string())
    })
}

fn allowed_cpus(pid: u32) -> Option<String> {
    status_line(pid, pid, "Cpus_allowed_list")
}

fn is_alive(pid: u32) -> bool {
    status_line(pid, pid, "State").is_some_and(|s| !s.starts_with('Z') && !s.starts_with('X'))
}

/// The v1 cpuset and cpuacct paths of a process, from `/proc/PID/cgroup`.
fn v1_cgroups(pid: &str) -> Vec<(String, String)> {
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

fn cgroup_dirs(gleaner_pid: u32) -> [PathBuf; 2] {
    [
        Path::new(CPUSET).join(format!("gleaner-{gleaner_pid}")),
        Path::new(CPUACCT).join(format!("gleaner-{gleaner_pid}")),
    ]
}

/// Asserts that instance `gleaner_pid` left no cgroup, journal or status file.
fn assert_nothing_left(gleaner_pid: u32, state: &Path) {
    for d in cgroup_dirs(gleaner_pid) {
        assert!(!d.exists(), "{} left behind", d.display());
    }
    for ext in ["json", "status"] {
        let f = state.join(format!("{gleaner_pid}.{ext}"));
        assert!(!f.exists(), "{} left behind", f.display());
    }
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A started `gleaner run|attach` whose stderr goes to a file: the workload inherits that
/// stderr, so a pipe would stay open (and `wait_with_output` block) as long as it lives.
struct Started {
    child: Child,
    stderr: tempfile::NamedTempFile,
}

impl Started {
    fn new(cmd: &mut Command) -> Self {
        let stderr = tempfile::NamedTempFile::new().unwrap();
        let child = cmd
            .stdout(Stdio::null())
            .stderr(stderr.reopen().unwrap())
            .spawn()
            .unwrap();
        Started { child, stderr }
    }

    fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for exit; returns (exit code, stderr text).
    fn finish(mut self) -> (Option<i32>, String) {
        let status = self.child.wait().unwrap();
        (
            status.code(),
            fs::read_to_string(self.stderr.path()).unwrap_or_default(),
        )
    }
}

/// Kills a process the test started and reaps it.
fn kill_child(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

fn kill_pid(pid: u32) {
    // SAFETY: kill has no memory preconditions; the pid is one this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// Reads the first pid in a cgroup's `cgroup.procs`, waiting for the workload to enter it.
fn workload_pid_in(dir: &Path) -> u32 {
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
struct Managed {
    state: tempfile::TempDir,
    gleaner: Started,
    gleaner_pid: u32,
    workload_pid: u32,
}

impl Managed {
    /// Starts `gleaner run` with `period_ms` periods on `workload` and waits (5 s at most) for
    /// the workload to enter its cgroup and for `periods` periods to pass.
    fn start(period_ms: u32, workload: &[&str], periods: u64) -> Self {
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

    fn periods(&self) -> u64 {
        periods_in_status(self.state.path(), self.gleaner_pid)
    }

    fn status(&self) -> serde_json::Value {
        status_json(self.state.path(), self.gleaner_pid)
    }

    /// Sends SIGTERM and waits; returns (exit code, stderr, state dir). The workload is left
    /// running: the caller inspects and then kills it.
    fn terminate(self) -> (Option<i32>, String, tempfile::TempDir) {
        signal(self.gleaner_pid, libc::SIGTERM);
        let (code, err) = self.gleaner.finish();
        (code, err, self.state)
    }
}

fn periods_in_status(state: &Path, gleaner_pid: u32) -> u64 {
    status_json(state, gleaner_pid)["periods"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn workload_that_exits_at_once_leaves_nothing_and_passes_its_exit_code() {
    if skip_without_root_v1("workload_that_exits_at_once") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    for (cmd, code) in [(vec!["true"], 0), (vec!["sh", "-c", "exit 3"], 3)] {
        let child = gleaner()
            .arg("run")
            .args(fast_flags(state.path()))
            .arg("--")
            .args(&cmd)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "{cmd:?}: {}",
            stderr_of(&out)
        );
        assert_nothing_left(pid, state.path());
    }
    let child = gleaner()
        .arg("run")
        .args(fast_flags(state.path()))
        .args(["--", "/nonexistent/program"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot start") && err.contains("check the command exists"),
        "{err}"
    );
    assert_nothing_left(pid, state.path());
}

/// Whether this guest's cpuidle driver has a POLL state (driver `haltpoll`): only then can
/// retention run by PM QoS polling. Machines of the project's kind differ in this.
fn has_poll_state() -> bool {
    fs::read_to_string("/sys/devices/system/cpu/cpu0/cpuidle/state0/name")
        .map(|n| n.trim() == "POLL")
        .unwrap_or(false)
}

fn pm_qos_values() -> Vec<String> {
    let mut v: Vec<(usize, String)> = fs::read_dir("/sys/devices/system/cpu")
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            let cpu: usize = name.strip_prefix("cpu")?.parse().ok()?;
            let value = fs::read_to_string(format!(
                "/sys/devices/system/cpu/{name}/power/pm_qos_resume_latency_us"
            ))
            .ok()?;
            Some((cpu, value.trim().to_string()))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, value)| value).collect()
}

fn yielding_threads(gp: u32) -> usize {
    fs::read_dir(format!("/proc/{gp}/task"))
        .map(|d| {
            d.filter(|t| {
                let tid = t.as_ref().unwrap().file_name();
                fs::read_to_string(format!("/proc/{gp}/task/{}/comm", tid.to_string_lossy()))
                    .unwrap_or_default()
                    .starts_with("gleaner-ret")
            })
            .count()
        })
        .unwrap_or(0)
}

/// SIGKILL of `gleaner run --mode always-yield` while it retains through `backend`; within a
/// second the guard must have undone everything.
fn sigkill_while_retaining(backend: &str) {
    let state = tempfile::tempdir().unwrap();
    let me = std::process::id().to_string();
    let qos_before = pm_qos_values();
    let mut g = gleaner()
        .arg("run")
        .args(fast_flags(state.path()))
        .args([
            "--mode",
            "always-yield",
            "--retention-backend",
            backend,
            "--",
            "sleep",
            "30",
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let gp = g.id();
    let work = workload_pid_in(&cgroup_dirs(gp)[0]);
    assert!(
        wait_until(Duration::from_secs(5), || periods_in_status(
            state.path(),
            gp
        ) >= 3),
        "controller never ran"
    );
    match backend {
        "yield" => assert!(
            yielding_threads(gp) > 0,
            "always-yield mode started no yielding threads"
        ),
        _ => assert_ne!(
            pm_qos_values(),
            qos_before,
            "always-yield mode with poll retention changed no pm_qos_resume_latency_us"
        ),
    }

    g.kill().unwrap();
    let killed = Instant::now();
    g.wait().unwrap();
    let restored = wait_until(Duration::from_secs(1), || {
        cgroup_dirs(gp).iter().all(|d| !d.exists())
            && !state.path().join(format!("{gp}.json")).exists()
            && v1_cgroups(&work.to_string()) == v1_cgroups(&me)
            && pm_qos_values() == qos_before
    });
    let took = killed.elapsed();
    let alive = is_alive(work);
    let cpus = allowed_cpus(work);
    kill_pid(work);
    assert!(
        restored,
        "not restored within 1 s of SIGKILL: cgroups {:?}, pm_qos {:?} (was {:?})",
        v1_cgroups(&work.to_string()),
        pm_qos_values(),
        qos_before
    );
    eprintln!("{backend} retention: restored {took:?} after SIGKILL");
    assert!(alive, "the workload died with gleaner");
    assert_eq!(
        cpus,
        allowed_cpus(std::process::id()),
        "workload's allowed CPUs differ from before"
    );
    assert!(
        !Path::new(&format!("/proc/{gp}")).exists(),
        "gleaner (and its yielding threads) still exist"
    );
    assert_nothing_left(gp, state.path());
}

#[test]
fn sigkill_mid_run_is_undone_by_the_guard_within_a_second() {
    if skip_without_root_v1("sigkill_mid_run") {
        return;
    }
    sigkill_while_retaining("yield");
}

#[test]
fn sigkill_mid_run_with_poll_retention_restores_pm_qos_within_a_second() {
    if skip_without_root_v1("sigkill_mid_run_poll") {
        return;
    }
    if !has_poll_state() {
        common::skipped("sigkill_mid_run_poll", "this guest's cpuidle driver has no POLL state (driver `none`), so poll retention cannot run");
        return;
    }
    eprintln!(
        "sigkill_mid_run_poll: this guest has a cpuidle POLL state: testing PM QoS poll retention"
    );
    sigkill_while_retaining("poll");
}

#[test]
fn sigterm_restores_and_leaves_the_workload_running_on_all_cpus() {
    if skip_without_root_v1("sigterm_restores") {
        return;
    }
    let m = Managed::start(20, &["sleep", "30"], 2);
    let (gp, work) = (m.gleaner_pid, m.workload_pid);
    let (code, err, state) = m.terminate();
    let alive = is_alive(work);
    let cgroups = v1_cgroups(&work.to_string());
    let cpus = allowed_cpus(work);
    kill_pid(work);
    assert_eq!(code, Some(128 + libc::SIGTERM), "{err}");
    assert!(err.contains("keeps running with all its CPUs"), "{err}");
    assert!(alive);
    assert_eq!(cgroups, v1_cgroups(&std::process::id().to_string()));
    assert_eq!(cpus, allowed_cpus(std::process::id()));
    assert_nothing_left(gp, state.path());
}

/// A workload that forks, has children exit, changes its own affinity, moves one process to
/// another cgroup and finally execs: Gleaner follows none of that wrongly.
#[test]
fn misbehaving_workload_neither_crashes_gleaner_nor_gets_acted_on_after_leaving() {
    if skip_without_root_v1("misbehaving_workload") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let root_cpuset = Path::new(CPUSET).join("cgroup.procs");
    // The mover leaves for the root cpuset first (which resets its mask), then pins itself.
    let script = format!(
        r#"T={t}
sh -c 'echo $$ > {root}; taskset -pc 0 $$ >/dev/null; echo $$ > '$T'/moved; exec sleep 30' &
sleep 30 & echo $! > $T/child
(sleep 0.05; exit 0) &
sleep 0.6
exec sleep 0.3"#,
        t = scratch.path().display(),
        root = root_cpuset.display()
    );
    let child = Started::new(
        gleaner()
            .arg("run")
            .args(fast_flags(state.path()))
            .args(["--", "sh", "-c", &script]),
    );
    let gp = child.id();
    let (code, err) = child.finish();
    let read_pid = |name: &str| {
        fs::read_to_string(scratch.path().join(name))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
    };
    let (moved, kid) = (read_pid("moved"), read_pid("child"));
    let facts = (
        moved.map(|p| (is_alive(p), allowed_cpus(p), v1_cgroups(&p.to_string()))),
        kid.map(|p| (is_alive(p), allowed_cpus(p), v1_cgroups(&p.to_string()))),
    );
    moved.into_iter().chain(kid).for_each(kill_pid);
    assert_eq!(code, Some(0), "{err}");
    let me = v1_cgroups(&std::process::id().to_string());
    let (alive, cpus, cgroups) = facts.0.expect("mover never ran");
    assert!(alive);
    assert_eq!(
        cpus.as_deref(),
        Some("0"),
        "gleaner changed the affinity a process chose for itself after leaving"
    );
    assert_eq!(
        cgroups, me,
        "the process that moved itself is not where it moved (cpuacct must be restored too)"
    );
    let (alive, cpus, cgroups) = facts.1.expect("child never ran");
    assert!(
        alive,
        "a forked child died with the workload's main process"
    );
    assert_eq!(cpus, allowed_cpus(std::process::id()));
    assert_eq!(
        cgroups, me,
        "a forked child left in gleaner's cgroup was not moved back"
    );
    assert_nothing_left(gp, state.path());
}

#[test]
fn attach_refuses_missing_pid_and_stops_when_the_pid_exits() {
    let state = tempfile::tempdir().unwrap();
    // A pid above the kernel's maximum (4194304) can never exist.
    let out = gleaner()
        .arg("attach")
        .args(fast_flags(state.path()))
        .arg("4294967")
        .output()
        .unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no process with PID 4294967") && !err.trim().contains('\n'),
        "{err}"
    );

    // A workload that is gone before attach is a clear error, not a crash.
    let mut quick = Command::new("true").spawn().unwrap();
    let pid = quick.id();
    quick.wait().unwrap();
    let out = gleaner()
        .arg("attach")
        .args(fast_flags(state.path()))
        .arg(pid.to_string())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));

    // A workload that exits while attached ends the run cleanly with nothing left, even
    // though its parent (this test) does not reap it: a zombie is no longer the workload.
    let sleeper = Command::new("sleep").arg("0.4").spawn().unwrap();
    let g = Started::new(
        gleaner()
            .arg("attach")
            .args(fast_flags(state.path()))
            .arg(sleeper.id().to_string()),
    );
    let gp = g.id();
    let watchdog = Instant::now();
    let (code, err) = g.finish();
    kill_child(sleeper);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        watchdog.elapsed() < Duration::from_secs(5),
        "gleaner kept running after the workload exited"
    );
    assert_nothing_left(gp, state.path());
}

#[test]
fn cgroup_removed_by_someone_else_is_reported_and_the_workload_kept() {
    if skip_without_root_v1("cgroup_removed") {
        return;
    }
    let m = Managed::start(20, &["sleep", "30"], 2);
    let (gp, work) = (m.gleaner_pid, m.workload_pid);
    for (mount, dir) in [CPUSET, CPUACCT].iter().zip(cgroup_dirs(gp)) {
        fs::write(Path::new(mount).join("cgroup.procs"), work.to_string()).unwrap();
        fs::remove_dir(&dir).unwrap();
    }
    let (state, g) = (m.state, m.gleaner);
    let (code, err) = g.finish();
    let alive = is_alive(work);
    kill_pid(work);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("stopped managing the workload") && err.contains("does not exist"),
        "{err}"
    );
    assert!(alive, "the workload must survive its cgroup being removed");
    assert_nothing_left(gp, state.path());
}

/// Hotplug cannot be driven in this VM; the kernel's effect of taking CPU N offline on a v1
/// cpuset (N disappears from `cpuset.cpus`) is simulated by writing that file.
#[test]
fn cpu_leaving_the_cpuset_is_survived_and_everything_restored() {
    if skip_without_root_v1("cpu_offline") {
        return;
    }
    let all = fs::read_to_string(Path::new(CPUSET).join("cpuset.effective_cpus")).unwrap();
    let Some(first) = all
        .trim()
        .split([',', '-'])
        .next()
        .filter(|_| all.contains(['-', ',']))
    else {
        common::skipped("cpu_offline", "needs at least two CPUs");
        return;
    };
    let m = Managed::start(20, &["sleep", "30"], 2);
    let (gp, work) = (m.gleaner_pid, m.workload_pid);
    fs::write(cgroup_dirs(gp)[0].join("cpuset.cpus"), first).unwrap();
    let before = m.periods();
    assert!(
        wait_until(Duration::from_secs(5), || m.periods() >= before + 3),
        "controller stopped after the CPU left"
    );
    let (code, err, state) = m.terminate();
    let cpus = allowed_cpus(work);
    kill_pid(work);
    assert_eq!(code, Some(128 + libc::SIGTERM), "{err}");
    assert_eq!(
        cpus,
        allowed_cpus(std::process::id()),
        "the CPU that came back is not usable by the workload"
    );
    assert_nothing_left(gp, state.path());
}

#[test]
fn config_writable_by_others_is_refused_as_root() {
    if !is_root() {
        common::skipped(
            "config_writable_by_others",
            "the check applies only when running as root",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("gleaner.toml");
    fs::write(&cfg, "period_ms = 50\n").unwrap();
    for mode in [0o666, 0o620] {
        fs::set_permissions(&cfg, fs::Permissions::from_mode(mode)).unwrap();
        let out = gleaner()
            .arg("run")
            .args(fast_flags(dir.path()))
            .arg("--config")
            .arg(&cfg)
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "mode {mode:o}: {err}");
        assert!(err.contains("chmod go-w"), "{err}");
    }
    fs::set_permissions(&cfg, fs::Permissions::from_mode(0o644)).unwrap();
    let out = gleaner()
        .arg("run")
        .args(fast_flags(dir.path()))
        .arg("--config")
        .arg(&cfg)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
}

#[test]
fn bad_config_and_flags_are_one_line_errors_before_anything_changes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    fs::write(&cfg, "[policy]\nrho = 7\n").unwrap();
    fs::set_permissions(&cfg, fs::Permissions::from_mode(0o600)).unwrap();
    for args in [
        vec!["--config", cfg.to_str().unwrap()],
        vec!["--rho", "0"],
        vec!["--eta", "1.5"],
        vec!["--config", "/nonexistent.toml"],
    ] {
        let child = gleaner()
            .arg("run")
            .args(fast_flags(dir.path()))
            .args(&args)
            .args(["--", "true"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("internal error"),
            "{err}"
        );
        assert_nothing_left(pid, dir.path());
    }
}

#[test]
fn status_file_is_private_and_readable_through_status() {
    if skip_without_root_v1("status_file_is_private") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let run_dir = state.path().join("run");
    let g = gleaner()
        .arg("run")
        .args(fast_flags(&run_dir))
        .args(["--", "sleep", "30"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let gp = g.id();
    let work = workload_pid_in(&cgroup_dirs(gp)[0]);
    assert!(wait_until(Duration::from_secs(5), || periods_in_status(
        &run_dir, gp
    ) >= 1));
    let mode = |p: PathBuf| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let file_mode = mode(run_dir.join(format!("{gp}.status")));
    let journal_mode = mode(run_dir.join(format!("{gp}.json")));
    let dir_mode = mode(run_dir.clone());
    let out = gleaner()
        .args(["status", "--json", "--state-dir"])
        .arg(&run_dir)
        .output()
        .unwrap();
    let other = nobody_command(gleaner().args(["status", "--state-dir"]).arg(&run_dir))
        .map(|mut c| c.output().unwrap());
    // SAFETY: gp is the child this test started.
    unsafe { libc::kill(gp as i32, libc::SIGTERM) };
    let _ = g.wait_with_output();
    kill_pid(work);
    assert_eq!((file_mode, journal_mode, dir_mode), (0o600, 0o600, 0o700));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        listed["instances"][0]["pid"].as_u64(),
        Some(gp as u64),
        "{listed}"
    );
    if let Some(other) = other {
        let err = stderr_of(&other);
        assert_eq!(
            other.status.code(),
            Some(2),
            "another user could read the status: {}",
            String::from_utf8_lossy(&other.stdout)
        );
        assert!(
            err.contains("cannot read status files")
                && err.to_lowercase().contains("permission denied"),
            "{err}"
        );
    }
    assert_nothing_left(gp, &run_dir);
}

/// `cmd` wrapped to run as user nobody through `setpriv`, if both exist and we are root.
fn nobody_command(cmd: &mut Command) -> Option<Command> {
    if !is_root() || !Path::new("/usr/bin/setpriv").exists() {
        common::skipped(
            "other-user part of a safety test",
            "needs root and /usr/bin/setpriv",
        );
        return None;
    }
    let mut c = Command::new("/usr/bin/setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    Some(c)
}

#[test]
fn without_root_the_affinity_back_end_runs_and_says_what_is_off() {
    let state = tempfile::tempdir().unwrap();
    fs::set_permissions(state.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let run_dir = state.path().join("nobody");
    let mut base = gleaner();
    base.env("GLEANER_LOG", "info")
        .arg("run")
        .args(fast_flags(&run_dir))
        .args(["--", "sleep", "0.3"]);
    let Some(mut c) = nobody_command(&mut base) else {
        return;
    };
    let out = c.output().unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("placement=affinity") || err.contains("placement\":\"affinity"),
        "{err}"
    );
    assert!(
        err.contains("not running as root"),
        "no message about what is off: {err}"
    );
    assert!(
        fs::read_dir(&run_dir).map(|d| d.count()).unwrap_or(0) == 0,
        "state left in {}",
        run_dir.display()
    );
}

/// The status file of instance `gleaner_pid`, parsed, or Null while there is none.
fn status_json(state: &Path, gleaner_pid: u32) -> serde_json::Value {
    fs::read_to_string(state.join(format!("{gleaner_pid}.status")))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null)
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill has no memory preconditions; the pid is one this test started.
    unsafe { libc::kill(pid as i32, sig) };
}

/// A stall (here SIGSTOP for a second; in production a paused or migrated VM, or a forward
/// step of the monotonic clock) is counted and its period discarded, not fed to the policy,
/// and the loop goes back to its normal schedule afterwards.
#[test]
fn a_stall_is_counted_its_period_discarded_and_the_loop_carries_on() {
    if skip_without_root_v1("stall") {
        return;
    }
    let m = Managed::start(50, &["sleep", "30"], 3);
    let (gp, work) = (m.gleaner_pid, m.workload_pid);
    let before = m.status();
    signal(gp, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(1200));
    signal(gp, libc::SIGCONT);
    let resumed = wait_until(Duration::from_secs(5), || {
        let s = m.status();
        s["disrupted_periods"].as_u64() >= Some(1)
            && s["periods"].as_u64() >= before["periods"].as_u64().map(|p| p + 3)
    });
    let after = m.status();
    let (code, err, state) = m.terminate();
    kill_pid(work);
    assert!(
        resumed,
        "no discarded period, or no periods after the stall: {after}\n{err}"
    );
    // 1.2 s at 50 ms periods; the idle workload is sampled every 150 ms, so deadlines are
    // checked at 15 ms slices only while busy: any count of whole periods above 10 will do.
    assert!(
        after["missed_periods"].as_u64() > Some(10),
        "the stall was not counted: {after}"
    );
    assert!(after["max_late_ms"].as_f64() > Some(1000.0), "{after}");
    for key in ["rollbacks", "major_changes"] {
        assert_eq!(
            after[key], before[key],
            "the stall's sample reached the policy ({key}): {after}"
        );
    }
    assert!(
        err.contains("its sample was discarded"),
        "the stall was not logged: {err}"
    );
    assert_eq!(code, Some(128 + libc::SIGTERM), "{err}");
    assert_nothing_left(gp, state.path());
}

/// Steps the wall clock (CLOCK_REALTIME) by `secs` and steps it back when dropped, also when
/// the test fails: the machine's time is the user's, not ours.
struct WallClockStep {
    secs: i64,
}

impl WallClockStep {
    fn by(secs: i64) -> Option<Self> {
        step_wall_clock(secs).then_some(Self { secs })
    }
}

impl Drop for WallClockStep {
    fn drop(&mut self) {
        if !step_wall_clock(-self.secs) {
            eprintln!(
                "could not step the wall clock back by {} s: correct it by hand",
                self.secs
            );
        }
    }
}

fn step_wall_clock(secs: i64) -> bool {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: reads into and writes from a local timespec.
    unsafe {
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) == 0 && {
            ts.tv_sec += secs as libc::time_t;
            libc::clock_settime(libc::CLOCK_REALTIME, &ts) == 0
        }
    }
}

/// The wall clock jumps an hour forward and two back (an NTP step, an operator's `date -s`):
/// Gleaner times everything on the monotonic clock, so its periods neither stall nor burst
/// and nothing is discarded.
#[test]
fn wall_clock_jumps_do_not_disturb_the_control_loop() {
    if skip_without_root_v1("wall_clock_jumps") {
        return;
    }
    let m = Managed::start(100, &["sleep", "30"], 2);
    let (gp, work) = (m.gleaner_pid, m.workload_pid);
    let mut advanced = Vec::new();
    {
        let p0 = m.periods();
        let Some(_forward) = WallClockStep::by(3600) else {
            let _ = m.terminate();
            kill_pid(work);
            common::skipped("wall_clock_jumps", "cannot set CLOCK_REALTIME here");
            return;
        };
        advanced.push(wait_until(Duration::from_secs(3), || m.periods() >= p0 + 2));
        let p1 = m.periods();
        let _back = WallClockStep::by(-7200);
        advanced.push(wait_until(Duration::from_secs(3), || m.periods() >= p1 + 2));
    }
    let after = m.status();
    let (code, err, state) = m.terminate();
    kill_pid(work);
    assert_eq!(
        advanced,
        [true, true],
        "periods stopped advancing after a wall-clock step: {after}"
    );
    assert_eq!(after["disrupted_periods"].as_u64(), Some(0), "{after}");
    assert!(
        after["uptime_s"].as_f64() < Some(60.0),
        "uptime followed the wall clock: {after}"
    );
    assert_eq!(code, Some(128 + libc::SIGTERM), "{err}");
    assert_nothing_left(gp, state.path());
}

/// Makes a directory read-only through a read-only bind mount of itself (how a container
/// runtime or an operator makes a cgroup read-only), and undoes it when dropped.
struct ReadOnlyBind(PathBuf);

impl ReadOnlyBind {
    fn over(dir: &Path) -> Option<Self> {
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid NUL-terminated paths; null fstype and data are allowed for bind mounts.
        let bound = unsafe {
            libc::mount(
                c.as_ptr(),
                c.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        } == 0;
        if !bound {
            return None;
        }
        let guard = Self(dir.to_path_buf());
        // SAFETY: as above.
        let ro = unsafe {
            libc::mount(
                std::ptr::null(),
                c.as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
                std::ptr::null(),
            )
        } == 0;
        ro.then_some(guard)
    }
}

impl Drop for ReadOnlyBind {
    fn drop(&mut self) {
        let c = std::ffi::CString::new(self.0.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid path; MNT_DETACH cannot fail on a busy mount.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Someone makes Gleaner's cgroup read-only while it manages ping-pong. When Gleaner next
/// writes it (to consolidate), it stops, gives the workload back its CPUs and cgroups, says
/// in one line what happened and what is left, and `gleaner recover` removes what is left.
#[test]
fn cgroup_made_read_only_is_reported_restored_and_recoverable() {
    if skip_without_root_v1("cgroup_read_only") {
        return;
    }
    // 200 ms periods leave time to make the cgroup read-only before the first consolidation
    // (after two warm-up periods), so no period is waited for.
    let m = Managed::start(
        200,
        &[
            env!("CARGO_BIN_EXE_gleaner"),
            "workload",
            "pingpong",
            "--rounds",
            "1000000000",
        ],
        0,
    );
    let (gp, work) = (m.gleaner_pid, m.workload_pid);
    let dir = cgroup_dirs(gp)[0].clone();
    let Some(ro) = ReadOnlyBind::over(&dir) else {
        let _ = m.terminate();
        kill_pid(work);
        common::skipped(
            "cgroup_read_only",
            &format!("cannot bind-mount {} read-only", dir.display()),
        );
        return;
    };
    let (state, mut g) = (m.state, m.gleaner);
    let mut exit = None;
    let ended = wait_until(Duration::from_secs(20), || {
        if exit.is_none() {
            exit = g.child.try_wait().ok().flatten();
        }
        exit.is_some()
    });
    if !ended {
        signal(gp, libc::SIGTERM);
        exit = g.child.wait().ok();
    }
    let (alive, cpus, cgroups) = (
        is_alive(work),
        allowed_cpus(work),
        v1_cgroups(&work.to_string()),
    );
    kill_pid(work);
    let err = fs::read_to_string(g.stderr.path()).unwrap_or_default();
    drop(ro);
    assert!(
        ended,
        "gleaner did not stop after its cgroup became read-only: {err}"
    );
    assert_eq!(exit.and_then(|e| e.code()), Some(2), "{err}");
    let last = err
        .lines()
        .rfind(|l| l.starts_with("gleaner: error:"))
        .unwrap_or_default();
    assert!(
        last.contains("read-only file system") && last.contains("gleaner recover"),
        "{err}"
    );
    assert!(alive, "the workload must survive");
    assert_eq!(
        cpus,
        allowed_cpus(std::process::id()),
        "the workload was left confined"
    );
    assert_eq!(
        cgroups,
        v1_cgroups(&std::process::id().to_string()),
        "the workload was left in gleaner's cgroup"
    );
    // Run at once, so `recover` may meet the guard's own retry of the restore: both must agree.
    let out = gleaner()
        .args(["recover", "--state-dir"])
        .arg(state.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let gone = |d: &PathBuf| !d.exists();
    wait_until(Duration::from_secs(2), || {
        cgroup_dirs(gp).iter().all(gone) && !state.path().join(format!("{gp}.json")).exists()
    });
    assert_nothing_left(gp, state.path());
}
