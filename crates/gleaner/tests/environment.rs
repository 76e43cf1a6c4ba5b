//! Safety tests of the `gleaner` binary when the environment changes under it: its cgroup
//! removed or made read-only, a CPU leaving the cpuset, the wall clock stepped, a stalled
//! period, hostile configuration and files, no root.
//!
//! Exists for the same reason as `safety.rs` (which kills and stops the instance itself):
//! the guarantees only hold if they hold for the real binary on the real kernel. Tests that
//! need root and a v1 cpuset hierarchy print why and pass when those are missing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

mod common;
mod safety_support;

use safety_support::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

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

/// How long `a_stall_is_counted_its_period_discarded_and_the_loop_carries_on` stops Gleaner:
/// longer than its longest period (50 ms × 3 idle × 10 own-CPU stretch).
/// Longer than twice the longest period (1.5 s, below), so that the period holding the stall
/// is discarded (`pacer::is_disrupted`: over twice its plan) wherever the stall lands. At
/// 1.7 s it was counted only where it fell into a short period's sleep: in CI on the haltpoll
/// guest (2026-12-02) the periods were stretched, the stop landed in a period's own work
/// (`record_ms=1710`) and the next period, 1.7 s against its plan, was judged as usual.
const STALL_MS: u64 = 3_200;

/// A stall (here SIGSTOP for 3.2 s; in production a paused or migrated VM, or a forward
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
    std::thread::sleep(Duration::from_millis(STALL_MS));
    signal(gp, libc::SIGCONT);
    // Three periods of up to 1.5 s each (see below), with room for CI's parallel tests.
    let resumed = wait_until(Duration::from_secs(10), || {
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
    // The stall is counted in whole periods of the schedule in effect: 50 ms while the
    // workload is busy, three times that for this idle one (the controller's IDLE_STRETCH),
    // and up to ten times more where Gleaner's own work outgrows its 0.45 % of a period
    // (MAX_PERIOD_STRETCH: a 50 ms period allows 250 µs, and re-attaching the BPF programs
    // for a window under the other tests' load costs more; CI counted 3 and a run beside the
    // other tests 5, where 24 is the unstretched count). So the stall lasts longer than twice
    // the longest period, 1.5 s, and at least one is counted.
    assert!(
        after["missed_periods"].as_u64() >= Some(1),
        "the stall was not counted: {after}"
    );
    assert!(
        after["max_late_ms"].as_f64() > Some(STALL_MS as f64 - 100.0),
        "{after}"
    );
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
    // Two of the longest periods the loop may take by its own rules (an idle workload's,
    // stretched as far as the own-CPU budget goes: up to 3 s at 100 ms) and the status file's
    // interval; a loop thrown by a step would stall for the step, an hour. The fixed 3 s this
    // waited before was shorter than that contract, and the test failed once in CI on
    // 2026-11-28 (no status rewrite for 3 s after the step back; cause not established: the
    // 12 runs here since passed, and none stretched an idle workload's periods).
    let patience = Duration::from_millis(
        2 * 100 * u64::from(gleaner_linux::controller::LONGEST_PERIOD_FACTOR),
    ) + gleaner_linux::controller::STATUS_INTERVAL;
    let mut advanced = Vec::new();
    {
        let p0 = m.periods();
        let Some(_forward) = WallClockStep::by(3600) else {
            let _ = m.terminate();
            kill_pid(work);
            common::skipped("wall_clock_jumps", "cannot set CLOCK_REALTIME here");
            return;
        };
        advanced.push(wait_until(patience, || m.periods() >= p0 + 2));
        let p1 = m.periods();
        let _back = WallClockStep::by(-7200);
        advanced.push(wait_until(patience, || m.periods() >= p1 + 2));
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
    // On a machine whose vCPUs never idle (other load soaks up every idle moment), ping-pong's
    // wake-ups never find a halted vCPU and the policy rightly consolidates nothing; with a
    // test running beside this one (cargo runs two at once on 2 vCPUs), the first eligible
    // period can also find consolidation's conditions unmet and holding worth it, and held
    // vCPUs' short idle periods keep consolidation's load condition unmet from then on (seen
    // twice in CI runs on this guest). Either way the read-only cgroup is never written, and
    // what this test checks did not happen. Clean up what the SIGTERM under the read-only
    // mount could not, and say so.
    if !ended && !err.contains("deactivate a vCPU (consolidate)") {
        let _ = gleaner()
            .args(["recover", "--state-dir"])
            .arg(state.path())
            .output();
        wait_until(Duration::from_secs(2), || {
            cgroup_dirs(gp).iter().all(|d| !d.exists())
        });
        assert_nothing_left(gp, state.path());
        let why: Vec<&str> = err
            .lines()
            .filter(|l| l.trim_start().starts_with("- "))
            .map(str::trim)
            .collect();
        let why = why.join("; ");
        common::skipped(
            "cgroup_read_only",
            &format!("Gleaner consolidated nothing in 20 s (the machine was too busy for ping-pong's vCPUs to idle, or it held them instead), so the read-only cgroup was never written: {why}"),
        );
        return;
    }
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
