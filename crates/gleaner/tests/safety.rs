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
mod safety_support;

use safety_support::*;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// Each CPU's `pm_qos_resume_latency_us`, and its POLL state's `disable` flag where it has
/// one (poll retention disables POLL for a moment when it turns polling off).
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
            let poll_disabled = fs::read_to_string(format!(
                "/sys/devices/system/cpu/{name}/cpuidle/state0/disable"
            ))
            .unwrap_or_default();
            Some((
                cpu,
                format!("{} (POLL disable {})", value.trim(), poll_disabled.trim()),
            ))
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
