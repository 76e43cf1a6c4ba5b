//! The placement back ends against the real kernel, on spawned `sleep` processes.
//!
//! The unit tests prove the file protocol against fake trees; these prove the kernel agrees:
//! that a cpuset write really changes `Cpus_allowed_list`, that tasks really go back and the
//! created cgroup really disappears. The cgroup tests need root and a v1 cpuset hierarchy
//! and print why they skip otherwise; the affinity test runs as any user.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use gleaner_linux::cgroup::v1::V1Mounts;
use gleaner_linux::cgroup::{enter_cgroup_pre_exec, AffinityPlacement, CgroupMounts, CgroupV1};
use gleaner_linux::{Journal, Placement, PlacementEnv, ProcFs};
use gleaner_policy::Cpuset;

/// Kills and reaps the child on every exit path, panics included.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(cmd: &mut Command) -> Reaped {
    Reaped(cmd.spawn().expect("spawn test child"))
}

fn allowed_list(pid: u32) -> Cpuset {
    ProcFs::new("/proc")
        .task_status(pid, pid)
        .unwrap()
        .cpus_allowed
}

/// Reports a skip on stderr and in `target/tmp/skipped-tests.log`, which `test.sh` prints at
/// the end (cargo hides the stderr of passing tests, so a skip would look like a pass).
fn skipped(test: &str, why: &str) {
    use std::io::Write;
    eprintln!("{test}: skipped: {why}");
    let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.log");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = writeln!(f, "{test}: {why}");
    }
}

fn v1_mounts_or_skip(test: &str) -> Option<V1Mounts> {
    if unsafe { libc::geteuid() } != 0 {
        skipped(test, "needs root to create cgroups");
        return None;
    }
    let mounts = CgroupMounts::from_mountinfo(&ProcFs::new("/proc"), Path::new("/")).unwrap();
    let Some(m) = V1Mounts::from_detected(&mounts) else {
        skipped(test, "no cgroup v1 cpuset hierarchy mounted");
        return None;
    };
    Some(m)
}

#[test]
fn v1_cpuset_confines_and_restores_a_real_process() {
    let Some(mounts) = v1_mounts_or_skip("v1_cpuset_confines_and_restores_a_real_process") else {
        return;
    };
    let child = spawn(Command::new("sleep").arg("30"));
    let pid = child.0.id();
    let before = allowed_list(pid);
    let proc = ProcFs::new("/proc");
    let cgroups_before = proc.cgroup_of(pid).unwrap();

    let run = tempfile::tempdir().unwrap();
    let journal = Journal::create(run.path(), &proc).unwrap().into_shared();
    let id = format!("test-{}", std::process::id());
    let mut cg = CgroupV1::create(
        PlacementEnv::real(Some(journal.clone())),
        mounts.clone(),
        "/",
        &id,
        &[pid],
    )
    .unwrap();
    let dir = cg.cpuset_dir().to_path_buf();
    assert_eq!(
        proc.cgroup_of(pid).unwrap().v1("cpuset"),
        Some(format!("/gleaner-{id}").as_str())
    );
    assert_eq!(cg.workload_tids().unwrap(), vec![(pid, pid)]);
    if mounts.cpuacct.is_some() {
        let per_cpu = cg.per_cpu_work_ns().unwrap().unwrap();
        assert_eq!(per_cpu.len(), proc.stat().unwrap().per_cpu.len());
    }

    cg.set_active(&"0".parse().unwrap()).unwrap();
    assert_eq!(allowed_list(pid).to_string(), "0");

    cg.restore().unwrap();
    assert!(!dir.exists(), "{} still exists", dir.display());
    assert_eq!(allowed_list(pid), before);
    assert_eq!(proc.cgroup_of(pid).unwrap(), cgroups_before);
    assert!(journal.lock().unwrap().entries().is_empty());
}

#[test]
fn v1_child_started_inside_via_pre_exec_goes_back_out() {
    let Some(mounts) = v1_mounts_or_skip("v1_child_started_inside_via_pre_exec_goes_back_out")
    else {
        return;
    };
    let proc = ProcFs::new("/proc");
    let id = format!("spawn-{}", std::process::id());
    let mut cg = CgroupV1::create(PlacementEnv::real(None), mounts, "/", &id, &[]).unwrap();
    cg.set_active(&"0".parse().unwrap()).unwrap();
    let hook = enter_cgroup_pre_exec(&cg.procs_files()).unwrap();
    let mut cmd = Command::new("sleep");
    cmd.arg("30");
    // SAFETY: the hook only calls open/write/close.
    unsafe { cmd.pre_exec(hook) };
    let child = spawn(&mut cmd);
    let pid = child.0.id();
    assert_eq!(
        allowed_list(pid).to_string(),
        "0",
        "confined from its first instruction"
    );
    assert_eq!(
        proc.cgroup_of(pid).unwrap().v1("cpuset"),
        Some(format!("/gleaner-{id}").as_str())
    );

    let dir = cg.cpuset_dir().to_path_buf();
    cg.restore().unwrap();
    assert!(!dir.exists());
    assert_eq!(
        proc.cgroup_of(pid).unwrap().v1("cpuset"),
        proc.own_cgroup().unwrap().v1("cpuset")
    );
}

#[test]
fn affinity_confines_a_process_tree_and_restores_it() {
    let online = ProcFs::new("/proc").online_cpus().unwrap();
    if online.len() < 2 || !online.contains(0) {
        skipped("affinity test", "needs CPU 0 and at least 2 online CPUs");
        return;
    }
    let child = spawn(Command::new("sh").args(["-c", "sleep 30 & sleep 31 & wait"]));
    let pid = child.0.id();
    let proc = ProcFs::new("/proc");
    let deadline = Instant::now() + Duration::from_secs(5);
    let tree = loop {
        let tree = proc.process_tree(pid).unwrap();
        if tree.len() == 3 || Instant::now() > deadline {
            break tree;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(tree.len(), 3, "sh and its two sleeps: {tree:?}");
    let before: Vec<Cpuset> = tree.iter().map(|&p| allowed_list(p)).collect();

    let mut place = AffinityPlacement::new(PlacementEnv::real(None), pid).unwrap();
    place.set_active(&"0".parse().unwrap()).unwrap();
    for &p in &tree {
        assert_eq!(allowed_list(p).to_string(), "0", "pid {p}");
    }
    place.restore().unwrap();
    let after: Vec<Cpuset> = tree.iter().map(|&p| allowed_list(p)).collect();
    assert_eq!(after, before);
}
