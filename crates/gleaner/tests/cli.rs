//! The command line as a new user meets it: refusals, exit codes and what is left behind when
//! a run ends in an ordinary but unhappy way (a closed pipe, a process that ends by itself, a
//! file that cannot be opened). Each test is a bug a user found.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

mod common;

use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const GLEANER: &str = env!("CARGO_BIN_EXE_gleaner");

fn gleaner() -> Command {
    let mut c = Command::new(GLEANER);
    c.env("GLEANER_LOG", "warn");
    c
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn journals_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".json") && n != "calibration.json")
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn recover_ignores_the_calibration_cache_beside_the_journals() {
    let state = tempfile::tempdir().unwrap();
    std::fs::write(
        state.path().join("calibration.json"),
        r#"{"boot_id":"b","timeout_ns":18000,"host_poll_ns":0}"#,
    )
    .unwrap();
    let out = gleaner()
        .args(["recover", "--state-dir"])
        .arg(state.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to recover"));
    assert!(
        state.path().join("calibration.json").exists(),
        "recover removed the calibration cache"
    );
}

#[test]
fn attach_exits_zero_when_the_process_ends_normally() {
    let state = tempfile::tempdir().unwrap();
    let mut work = Command::new("sleep").arg("1").spawn().unwrap();
    let pid = work.id().to_string();
    let g = gleaner()
        .args([
            "attach",
            "--period-ms",
            "20",
            "--mode",
            "consolidation",
            "--state-dir",
        ])
        .arg(state.path())
        .arg(&pid)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Reaped by its parent (us), as a shell reaps its job: /proc/PID disappears entirely.
    work.wait().unwrap();
    let out = g.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(journals_in(state.path()).is_empty());
}

/// `gleaner run` used to notice its workload's exit only at the end of a sleep (a whole
/// period with the BPF sampler, a tenth of one with /proc), so every run outlived its
/// workload by up to a period. With a 20 s period that is seconds; now it is the set-up.
#[test]
fn run_ends_as_soon_as_its_workload_exits_not_at_the_end_of_a_period() {
    let state = tempfile::tempdir().unwrap();
    for sampler in ["procfs", "auto"] {
        let t0 = Instant::now();
        let out = gleaner()
            .args([
                "run",
                "--observe",
                "--mode",
                "consolidation",
                "--period-ms",
                "20000",
            ])
            .args(["--sampler", sampler, "--state-dir"])
            .arg(state.path())
            .args(["--", "sleep", "0.2"])
            .output()
            .unwrap();
        let took = t0.elapsed();
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        assert!(
            took < Duration::from_millis(1800),
            "--sampler {sampler}: took {took:?} for a 0.2 s workload: {}",
            stderr_of(&out)
        );
    }
}

#[test]
fn a_closed_stderr_is_not_an_abort() {
    // `gleaner … 2>&1 | head -1`: the reader is gone before gleaner reports its error.
    let (read_end, write_end): (OwnedFd, OwnedFd) = nix::unistd::pipe().unwrap();
    drop(read_end);
    let status = gleaner()
        .args([
            "run",
            "--timeline",
            "/nonexistent-dir/timeline.jsonl",
            "--",
            "true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::from(write_end))
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), None, "killed by a signal: {status:?}");
    assert_eq!(status.code(), Some(2));
}

#[test]
fn an_unopenable_timeline_is_refused_before_the_workload_starts() {
    let state = tempfile::tempdir().unwrap();
    let marker = state.path().join("workload-ran");
    let out = gleaner()
        .args(["run", "--state-dir"])
        .arg(state.path())
        .args([
            "--timeline",
            "/nonexistent-dir/timeline.jsonl",
            "--",
            "touch",
        ])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr_of(&out);
    assert!(
        err.contains("cannot open the timeline file") && err.contains("--timeline"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !marker.exists(),
        "the workload was started although gleaner refused to manage it"
    );
}

#[test]
fn attach_refuses_init_kernel_threads_and_its_own_ancestors() {
    let state = tempfile::tempdir().unwrap();
    let me = std::process::id().to_string();
    for (pid, says) in [
        ("1", "PID 1 is init"),
        ("2", "kernel thread"),
        (me.as_str(), "ancestor of this gleaner"),
    ] {
        let out = gleaner()
            .args(["attach", "--state-dir"])
            .arg(state.path())
            .arg(pid)
            .output()
            .unwrap();
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "attach {pid}: {err}");
        assert!(
            err.contains(says) && err.contains("--system-process"),
            "attach {pid}: {err}"
        );
    }
    assert!(journals_in(state.path()).is_empty());
}

#[test]
fn non_root_attach_to_another_users_process_is_refused_before_journaling() {
    if !is_root() || !Path::new("/usr/bin/setpriv").exists() {
        common::skipped(
            "non_root_attach",
            "needs root (to start a process as another user) and /usr/bin/setpriv",
        );
        return;
    }
    let state = tempfile::tempdir().unwrap();
    // SAFETY: chmod on a path we own; the unprivileged user must be able to write the journal.
    std::fs::set_permissions(
        state.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mut work = Command::new("sleep").arg("30").spawn().unwrap();
    let started = Instant::now();
    let out = Command::new("/usr/bin/setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            GLEANER,
            "attach",
            "--state-dir",
        ])
        .arg(state.path())
        .arg(work.id().to_string())
        .env("GLEANER_LOG", "warn")
        .output()
        .unwrap();
    let _ = work.kill();
    let _ = work.wait();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("not permitted") && !err.contains("gleaner recover"),
        "{err}"
    );
    assert!(
        journals_in(state.path()).is_empty(),
        "a journal was left: {:?}",
        journals_in(state.path())
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// Voluntary context switches of process `pid` (each one a wake-up after a sleep).
fn voluntary_switches(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_quiet_guard_sleeps_until_its_pipe_closes_or_it_is_told_to_poll() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let mut guard = gleaner()
        .arg("__guard")
        .arg(dir.path().join("1.json"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = guard.id();
    // Its wake-ups in 600 ms, after 200 ms to settle what it was just told.
    let wakes = || {
        std::thread::sleep(Duration::from_millis(200));
        let before = voluntary_switches(pid);
        std::thread::sleep(Duration::from_millis(600));
        voluntary_switches(pid) - before
    };
    // Until told otherwise it checks every 100 ms whether its owner (this test) is dying.
    let polling = wakes();
    assert!(polling >= 3, "a polling guard woke {polling} times");
    // Told that no SCHED_IDLE thread can hold up its owner's exit, it waits on the pipe alone.
    let mut pipe = guard.stdin.take().unwrap();
    pipe.write_all(b"q").unwrap();
    assert_eq!(wakes(), 0, "a quiet guard woke up");
    // Told that SCHED_IDLE threads are about to start, it polls again.
    pipe.write_all(b"p").unwrap();
    let polling = wakes();
    assert!(polling >= 3, "told to poll, the guard woke {polling} times");
    // And it still ends when the pipe closes (no journal: nothing to undo).
    drop(pipe);
    let start = Instant::now();
    loop {
        if let Some(st) = guard.try_wait().unwrap() {
            assert!(st.success(), "{st:?}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the guard outlived its pipe"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shell script that runs `step` until the timeline at `timeline` holds six periods, or for
/// 15 s at most. How long six periods take is not fixed: Gleaner stretches its periods to keep
/// its own CPU within budget (up to `LONGEST_PERIOD_FACTOR` times the configured one), and a
/// debug build's cycles on a loaded CI machine cost enough for that (kernel v1147, 2026-12-03:
/// a fixed 0.8 s workload saw one period).
fn until_periods(timeline: &Path, step: &str) -> String {
    format!(
        "i=0; end=$(($(date +%s) + 15)); \
         while [ \"$(cat {t} 2>/dev/null | wc -l)\" -lt 6 ] && [ $(date +%s) -lt $end ]; do {step}; done",
        t = timeline.display()
    )
}

/// `--progress-url` with `--progress-metric`: the counter is a series of a Prometheus page on
/// loopback, fetched once a period by Gleaner itself (no curl).
#[test]
fn a_prometheus_counter_on_loopback_judges_each_period() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    // The exporter: each GET finds the counter 250 higher, split over two labelled series.
    let server = std::thread::spawn(move || {
        let mut served = 0u64;
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { break };
            let mut request = [0u8; 2048];
            let n = conn.read(&mut request).unwrap_or(0);
            if request[..n].starts_with(b"STOP") {
                break;
            }
            served += 1;
            let page = format!(
                "# TYPE work_total counter\nwork_total{{kind=\"a\"}} {}\nwork_total{{kind=\"b\"}} {}\n",
                200 * served,
                50 * served
            );
            let _ = conn.write_all(format!("HTTP/1.0 200 OK\r\n\r\n{page}").as_bytes());
        }
        served
    });
    let state = tempfile::tempdir().unwrap();
    let timeline = state.path().join("metric.jsonl");
    let out = gleaner()
        .env("GLEANER_LOG", "info")
        .args(["run", "--observe", "--period-ms", "50", "--state-dir"])
        .arg(state.path())
        .args([
            "--progress-url",
            &url,
            "--progress-metric",
            "work_total",
            "--timeline",
        ])
        .arg(&timeline)
        .args(["--", "sh", "-c", &until_periods(&timeline, "sleep 0.02")])
        .output()
        .unwrap();
    let mut stop = std::net::TcpStream::connect(
        url.trim_start_matches("http://")
            .trim_end_matches("/metrics"),
    )
    .unwrap();
    stop.write_all(b"STOP").unwrap();
    let served = server.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("metric work_total at http://127.0.0.1:"),
        "{}",
        stderr_of(&out)
    );
    let counts: Vec<u64> = std::fs::read_to_string(&timeline)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["progress"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(
        counts.len() >= 5 && served >= counts.len() as u64,
        "{counts:?}, {served} served"
    );
    // Every period saw one GET: both series summed, 250 a read.
    assert!(counts.iter().all(|&c| c == 250), "{counts:?}");
    // A URL off loopback is refused before anything runs, in one line.
    let out = gleaner()
        .args([
            "run",
            "--progress-url",
            "http://192.0.2.1:9100/metrics",
            "--progress-metric",
            "x",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = stderr_of(&out);
    assert!(
        err.contains("not a loopback address") && err.trim().lines().count() == 1,
        "{err}"
    );
}

/// `--progress-file`: changes are judged by the application's own counter, read once a
/// period; while it cannot be read no period is judged (a period judged by utilization among
/// periods judged by the count would compare two units), and the user is told why, once.
#[test]
fn a_progress_counter_is_read_each_period_and_an_unreadable_one_is_said_once() {
    let state = tempfile::tempdir().unwrap();
    let run = |counter: &Path, timeline: &Path, script: &str| {
        gleaner()
            .args(["run", "--observe", "--period-ms", "50", "--state-dir"])
            .arg(state.path())
            .arg("--progress-file")
            .arg(counter)
            .arg("--timeline")
            .arg(timeline)
            .args(["--", "sh", "-c", script])
            .output()
            .unwrap()
    };
    // The workload counts its steps into the file until the periods to check are in.
    let counter = state.path().join("count");
    let timeline = state.path().join("counted.jsonl");
    let script = until_periods(
        &timeline,
        &format!("i=$((i+1)); echo $i > {}; sleep 0.01", counter.display()),
    );
    let out = run(&counter, &timeline, &script);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let judged = std::fs::read_to_string(&timeline).unwrap().lines().count();
    assert!(judged >= 5, "{judged} periods judged: {}", stderr_of(&out));
    // A counter there before the run starts judges the first period too: its base is read
    // with the sampler's first window. (It was read only at the first period's end, which
    // left that period unjudged and the first timeline line a period late: 0.2 s here.)
    // Written by rename here, so that no read can find it empty and leave a period unjudged
    // for that reason (the rewrite in place above is read again when found empty).
    std::fs::write(&counter, "0\n").unwrap();
    let atomic = format!(
        "i=0; while [ $i -lt 100 ]; do i=$((i+1)); echo $i > {c}.new; mv {c}.new {c}; sleep 0.01; done",
        c = counter.display()
    );
    let timeline = state.path().join("from-start.jsonl");
    let out = gleaner()
        .args(["run", "--observe", "--period-ms", "400", "--state-dir"])
        .arg(state.path())
        .arg("--progress-file")
        .arg(&counter)
        .arg("--timeline")
        .arg(&timeline)
        .args(["--", "sh", "-c", &atomic])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let text = std::fs::read_to_string(&timeline).unwrap();
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let (t, planned) = (
        first["t_s"].as_f64().unwrap(),
        first["planned_s"].as_f64().unwrap(),
    );
    assert!(
        first["progress"].is_u64() && t < 1.9 * planned,
        "the first period (planned {planned} s) is not the first judged: {first}"
    );
    // A counter that never appears: no period judged, one warning naming the file.
    let missing = state.path().join("never-written");
    let timeline = state.path().join("uncounted.jsonl");
    let out = run(&missing, &timeline, "sleep 0.8");
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    let warnings: Vec<_> = err
        .lines()
        .filter(|l| l.contains("never-written"))
        .collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains("no such file") && warnings[0].contains("not judged"),
        "{err}"
    );
    let judged = std::fs::read_to_string(&timeline)
        .unwrap_or_default()
        .lines()
        .count();
    assert_eq!(judged, 0, "{err}");
}
