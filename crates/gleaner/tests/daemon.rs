//! End-to-end tests of `gleaner run` on this machine: real workloads, real cgroups, real
//! kill -9. They need root and a cgroup cpuset hierarchy; elsewhere they print why they skip.
//!
//! The policy assertions are about clear-cut cases only (a ping-pong that spends almost all
//! its time waking its partner, a CPU-bound job with nothing to wait for) so that they hold on
//! any 2-vCPU guest, noisy or not.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// These tests measure the machine; run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn gleaner() -> &'static str {
    env!("CARGO_BIN_EXE_gleaner")
}

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !Path::new("/sys/fs/cgroup/cpuset/cpuset.cpus").exists()
        && !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
    {
        return Some("no cgroup cpuset hierarchy".into());
    }
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    if online.trim() == "0" {
        return Some("only one CPU".into());
    }
    None
}

macro_rules! require_machine {
    () => {
        if let Some(why) = skip_reason() {
            common::skipped(module_path!(), &why);
            return;
        }
    };
}

/// The median over a timeline's periods of one of their characteristics.
fn median_characteristic(periods: &[serde_json::Value], key: &str) -> Option<f64> {
    let mut v: Vec<f64> = periods
        .iter()
        .filter_map(|p| p["characteristics"][key].as_f64())
        .collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Over a timeline's periods: the median share of this guest's time the host stole, and the
/// longest planned period (s).
fn steal_and_longest_period(periods: &[serde_json::Value]) -> (f64, f64) {
    let longest = periods
        .iter()
        .filter_map(|p| p["planned_s"].as_f64())
        .fold(0.0, f64::max);
    (
        median_characteristic(periods, "steal_fraction").unwrap_or(0.0),
        longest,
    )
}

/// Where the own-CPU budget stretched periods to this length (s), a few seconds' run holds
/// too few periods to say anything about the policy. On the haltpoll guest (2026-12-02) some
/// of Gleaner's cycles cost 1.5–4.5 ms of CPU with the host quiet and 10–88 ms while it stole
/// 30–50 % (by their pattern the cycles that open a measurement window; not instrumented
/// apart), and the budget stretched the periods to 1 s, with and without steal
/// (results/own-cpu-debt-2026-12-02); the busy-after-quiet test's note puts a debug build beside other
/// tests at 0.4 s. An open problem, reported as a skip with what was measured, not as a pass.
const STRETCHED_TOO_FAR_TO_JUDGE_S: f64 = 0.7;

fn timeline(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Cgroups named after the gleaner instance `pid` that still exist (other instances, such as
/// a service running on the same machine, are not this test's business).
fn leftover_cgroups(pid: u32) -> Vec<String> {
    [
        "/sys/fs/cgroup/cpuset",
        "/sys/fs/cgroup/cpuacct",
        "/sys/fs/cgroup/unified",
    ]
    .iter()
    .map(|root| format!("{root}/gleaner-{pid}"))
    .filter(|p| Path::new(p).exists())
    .collect()
}

/// Runs gleaner to completion, returning its pid and exit status.
fn run_gleaner(cmd: &mut Command) -> (u32, std::process::ExitStatus) {
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();
    (pid, child.wait().unwrap())
}

fn allowed_of(pid: u32) -> Option<String> {
    let mut lists = vec![];
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let s = std::fs::read_to_string(t.path().join("status")).ok()?;
        let l = s.lines().find(|l| l.starts_with("Cpus_allowed_list:"))?;
        lists.push(l.split_whitespace().nth(1)?.to_string());
    }
    lists.sort();
    lists.dedup();
    Some(lists.join(" "))
}

#[test]
fn light_ping_pong_is_consolidated_onto_one_vcpu() {
    require_machine!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let tl = dir.path().join("t.jsonl");
    let (pid, st) = run_gleaner(
        Command::new(gleaner())
            .args(["run", "--mode", "consolidation", "--state-dir"])
            .arg(dir.path())
            .arg("--timeline")
            .arg(&tl)
            .args(["--", gleaner(), "workload", "pingpong", "--duration", "4"])
            .stdout(Stdio::null()),
    );
    assert!(st.success());
    let periods = timeline(&tl);
    let (steal, period_s) = steal_and_longest_period(&periods);
    let judged = periods.len() > 10 && periods.last().is_some_and(|l| l["n_active"] == 1);
    if !judged && period_s >= STRETCHED_TOO_FAR_TO_JUDGE_S {
        common::skipped(
            "light_ping_pong_consolidation",
            &format!(
                "not consolidated or too few periods; Gleaner's own-CPU budget stretched periods to {period_s:.2} s (the host stole {:.0} % by the median): too few periods to judge the policy",
                steal * 100.0
            ),
        );
        return;
    }
    assert!(periods.len() > 10, "too few periods: {}", periods.len());
    let last = periods.last().unwrap();
    // Where other load keeps every vCPU busy, no wake-up finds a halted vCPU and not
    // consolidating is the right decision: say so instead of failing on the machine's load.
    let never_idle = median_characteristic(&periods, "idle_periods_per_sec")
        .is_some_and(|median| median < 100.0);
    if last["n_active"] != 1 && never_idle {
        common::skipped(
            "light_ping_pong_consolidation",
            "the vCPUs hardly idled during the run (median under 100 idle periods/s: other load on the machine): no halted wake-up to save",
        );
        return;
    }
    assert_eq!(
        last["n_active"],
        1,
        "ping-pong not consolidated; timeline tail: {:?}",
        &periods[periods.len().saturating_sub(5)..]
    );
    assert!(
        leftover_cgroups(pid).is_empty(),
        "{:?}",
        leftover_cgroups(pid)
    );
}

#[test]
fn cpu_bound_threads_keep_both_vcpus() {
    require_machine!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let tl = dir.path().join("t.jsonl");
    let st = Command::new(gleaner())
        .args(["run", "--state-dir"])
        .arg(dir.path())
        .arg("--timeline")
        .arg(&tl)
        .args([
            "--",
            gleaner(),
            "workload",
            "matmul",
            "--threads",
            "2",
            "--duration",
            "3",
        ])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let periods = timeline(&tl);
    assert!(periods.len() > 10);
    for p in &periods {
        assert_eq!(p["n_active"], 2, "a CPU-bound workload lost a vCPU: {p}");
    }
}

#[test]
fn exit_code_of_the_workload_is_returned() {
    require_machine!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (pid, st) = run_gleaner(
        Command::new(gleaner())
            .args(["run", "--state-dir"])
            .arg(dir.path())
            .args(["--", "sh", "-c", "exit 7"]),
    );
    assert_eq!(st.code(), Some(7));
    assert!(leftover_cgroups(pid).is_empty());
    let st = Command::new(gleaner())
        .args(["run", "--state-dir"])
        .arg(dir.path())
        .args(["--", "/nonexistent/cmd"])
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(2));
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(
        err.contains("cannot start") && err.lines().filter(|l| l.contains("error")).count() == 1,
        "{err}"
    );
}

#[test]
fn kill_9_restores_the_workload_cpus_within_a_second() {
    require_machine!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let mut g = Command::new(gleaner())
        .args(["run", "--mode", "consolidation", "--state-dir"])
        .arg(dir.path())
        .args(["--", gleaner(), "workload", "pingpong", "--duration", "8"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The workload is gleaner's child: find it by its own command line. Gleaner's other
    // child, the guard, is forked without exec and carries gleaner's command line, which names
    // the workload too, as does the workload's own process until its exec: matched on
    // "pingpong" anywhere, either was taken for the workload now and then (it is in no
    // cgroup of gleaner's).
    let is_workload = |cmdline: &str| {
        let argv: Vec<&str> = cmdline.split('\0').collect();
        argv.get(1) == Some(&"workload") && argv.get(2) == Some(&"pingpong")
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let child = loop {
        let kids = std::fs::read_to_string(format!("/proc/{}/task/{}/children", g.id(), g.id()))
            .unwrap_or_default();
        if let Some(pid) = kids
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .find(|p| {
                std::fs::read_to_string(format!("/proc/{p}/cmdline")).is_ok_and(|c| is_workload(&c))
            })
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "workload did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Give the policy time to consolidate, so that most runs kill it mid-consolidation; the
    // cgroup membership is restored either way.
    let deadline = Instant::now() + Duration::from_secs(3);
    while allowed_of(child).as_deref() == Some("0-1") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let consolidated = allowed_of(child).as_deref() != Some("0-1");
    let in_gleaner_cgroup = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .is_ok_and(|c| c.contains("/gleaner-"))
    };
    assert!(
        in_gleaner_cgroup(child),
        "workload was never placed in gleaner's cgroup"
    );
    let killed = Instant::now();
    g.kill().unwrap(); // SIGKILL
    let _ = g.wait();
    while allowed_of(child).as_deref() != Some("0-1") || in_gleaner_cgroup(child) {
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "not restored within 1 s: CPUs {:?}",
            allowed_of(child)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("consolidated before the kill: {consolidated}");
    let restored_in = killed.elapsed();
    eprintln!("restored in {restored_in:?}");
    assert!(
        Path::new(&format!("/proc/{child}")).exists(),
        "workload died with gleaner"
    );
    // The guard also removed the cgroup and the journal.
    let deadline = Instant::now() + Duration::from_secs(1);
    while !leftover_cgroups(g.id()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "cgroups left: {:?}",
            leftover_cgroups(g.id())
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The guard removes the journal last, just after the cgroups: allow it the same second.
    let journal_left = || {
        std::fs::read_dir(dir.path()).unwrap().flatten().any(|e| {
            e.path().extension().is_some_and(|x| x == "json") && e.file_name() != "calibration.json"
        })
    };
    while journal_left() {
        assert!(Instant::now() < deadline, "journal left behind");
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = Command::new("kill").arg(child.to_string()).status();
}

#[test]
fn bad_input_gets_one_line_errors() {
    let cases: &[&[&str]] = &[
        &["run", "--rho", "1.5", "--", "true"],
        &["run", "--eta", "0", "--", "true"],
        &["attach", "4000000"],
        &["run", "--config", "/nonexistent.toml", "--", "true"],
        &["run", "--mode", "bogus", "--", "true"],
    ];
    for args in cases {
        let out = Command::new(gleaner()).args(*args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        let lines: Vec<_> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(lines.iter().any(|l| l.contains("error")), "{args:?}: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[policy\nrho = 2").unwrap();
    let out = Command::new(gleaner())
        .arg("run")
        .arg("--config")
        .arg(&bad)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("malformed TOML"), "{err}");
}

/// Sums one state's per-period wake-up counts over a timeline.
fn timeline_wake_count(lines: &[serde_json::Value], state: &str) -> u64 {
    lines
        .iter()
        .filter_map(|l| l["wake_latency"][state]["count"].as_u64())
        .sum()
}

/// A workload that sleeps first and then hands messages back and forth: its first periods
/// are quiet, so their measurement window lasts the whole period, and the window it turns busy
/// in must not measure it event by event to the end, nor leave the next period with its
/// switches uncounted. Before the programs ended such a window themselves (their event
/// budget), every other period measured all of `sysbench threads` and the one between it
/// counted almost no switches (g_comp 130 ms against 2.5 µs), which the policy would have
/// acted on; the window cut at first took the CPU time with it (utilization 1.4, 0.07, 1.4 ...).
/// And a period measured whole, in which the workload turned busy, must be the window the
/// next periods reuse: reusing the first period's start-up window instead gave one a grain
/// of 86 ms (1 run in 6 here, both CI runs of 2026-11-29 and 2026-12-01).
#[test]
fn a_workload_that_turns_busy_after_a_quiet_start_is_measured_steadily() {
    require_machine!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let tl = dir.path().join("timeline.jsonl");
    let script = format!(
        "sleep 0.4; exec {} workload pingpong --duration 4",
        gleaner()
    );
    let out = Command::new(gleaner())
        .args(["run", "--observe", "--state-dir"])
        .arg(dir.path())
        .arg("--timeline")
        .arg(&tl)
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let branch = if err.contains("sampler bpf") {
        "bpf"
    } else {
        "procfs"
    };
    let lines = timeline(&tl);
    // The busy periods: after the first with half a vCPU of work (the workload turned busy
    // inside it, so its counts mix the quiet part and the start), less the last (the
    // workload ends inside it). With each, for a failure to tell its story: when it ended and
    // where its switch counts came from (one failure in CI, 2026-12-01: one period at 0.42
    // vCPUs against a median of 0.91, not seen in 14 runs by hand since).
    let busy: Vec<(f64, f64, f64, String)> = lines
        .iter()
        .map(|l| {
            let c = &l["characteristics"];
            (
                c["total_util"].as_f64().unwrap_or(0.0),
                c["g_comp_ns"].as_f64().unwrap_or(0.0),
                l["t_s"].as_f64().unwrap_or(0.0),
                l["rates_from"].as_str().unwrap_or("?").to_string(),
            )
        })
        .skip_while(|b| b.0 < 0.5)
        .skip(1)
        .collect();
    let busy = &busy[..busy.len().saturating_sub(1)];
    eprintln!(
        "{branch} branch: busy periods (utilization, g_comp ns, end s, counts from): {busy:?}"
    );
    // Four seconds of ping-pong: at least eight periods even where Gleaner's own CPU (a debug
    // build beside other tests) stretches them to 400 ms; two seconds gave six in CI.
    let (steal, period_s) = steal_and_longest_period(&lines);
    if busy.len() < 8 && period_s >= STRETCHED_TOO_FAR_TO_JUDGE_S {
        common::skipped(
            "a_workload_that_turns_busy_after_a_quiet_start_is_measured_steadily",
            &format!(
                "{} busy periods: Gleaner's own-CPU budget stretched periods to {period_s:.2} s (the host stole {:.0} % by the median), too few to judge",
                busy.len(),
                steal * 100.0
            ),
        );
        return;
    }
    assert!(busy.len() >= 8, "too few busy periods: {busy:?}");
    let mut utils: Vec<f64> = busy.iter().map(|b| b.0).collect();
    utils.sort_by(f64::total_cmp);
    let median = utils[utils.len() / 2];
    // A ping-pong's utilization moves a little from period to period; a period measured at a
    // fraction of the median is the sampler, not the workload.
    assert!(
        utils[0] > 0.5 * median,
        "a busy period measured at {:.2} vCPUs against a median of {median:.2}: {busy:?}",
        utils[0]
    );
    // Hand-offs every few microseconds: a period whose switches went uncounted shows a grain
    // of most of the period.
    let worst_grain = busy.iter().map(|b| b.1).fold(0.0, f64::max);
    assert!(
        worst_grain < 1e6,
        "a busy period with {worst_grain:.0} ns between switches: {busy:?}"
    );
}

#[test]
fn observe_ends_with_the_workloads_wake_latency_by_vcpu_state() {
    require_machine!();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let tl = dir.path().join("timeline.jsonl");
    let out = Command::new(gleaner())
        .args(["run", "--observe", "--state-dir"])
        .arg(dir.path())
        .arg("--timeline")
        .arg(&tl)
        .args([
            "--",
            gleaner(),
            "workload",
            "pingpong",
            "--duration",
            "1500ms",
        ])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    if let Some(line) = err.lines().find(|l| l.contains("sampling from /proc")) {
        eprintln!("procfs branch (BPF did not load): {line}");
        assert_eq!(err.matches("sampling from /proc").count(), 1, "{err}");
        assert!(
            err.contains("sampler procfs") && err.contains("cannot see: wake latency"),
            "{err}"
        );
        return;
    }
    eprintln!("bpf branch");
    assert!(err.contains("sampler bpf"), "{err}");
    assert!(err.contains("by the wakee vCPU's state"), "{err}");
    let lines = timeline(&tl);
    let total: u64 = ["running", "polling", "halted"]
        .iter()
        .map(|s| timeline_wake_count(&lines, s))
        .sum();
    // 1.5 s of ping-pong is tens of thousands of hand-offs even on a loaded 2-vCPU guest.
    assert!(total > 1_000, "{total} wake-ups in the timeline");
}

#[test]
fn without_privileges_the_procfs_sampler_runs_and_says_so_once() {
    require_machine!();
    if !Path::new("/usr/bin/setpriv").exists() {
        eprintln!("skipping: no setpriv to drop privileges");
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let out = Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "env"])
        .arg(format!("XDG_RUNTIME_DIR={}", dir.path().display()))
        .args([
            gleaner(),
            "run",
            "--observe",
            "--",
            gleaner(),
            "workload",
            "pingpong",
            "--rounds",
            "20000",
        ])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && err.contains("Permission denied") && err.contains("target") {
        eprintln!("skipping: the test binary is not readable by nobody: {err}");
        return;
    }
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches("sampling from /proc").count(), 1, "{err}");
    assert!(!err.contains("ERROR"), "{err}");
    assert!(err.contains("sampler procfs"), "{err}");
}
