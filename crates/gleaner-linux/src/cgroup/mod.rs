//! CPU placement back ends: how Gleaner confines a workload to its active vCPUs.
//!
//! Exists because the same policy decision ("run on CPUs 0-3") is carried out three ways
//! depending on the machine: a cgroup v2 cpuset, a cgroup v1 cpuset (+cpuacct for per-CPU
//! work), or per-thread `sched_setaffinity` when there is no root or no cpuset controller.
//! All three sit behind [`Placement`], journal every change before making it, and give back
//! exactly what was there on `restore()` (also run on drop).

pub mod affinity;
pub mod v1;
pub mod v2;

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gleaner_policy::Cpuset;
use serde::{Deserialize, Serialize};

use crate::error::{read_file, Error, Result};
use crate::journal::SharedJournal;
use crate::procfs::ProcFs;

pub use crate::affinity::{AffinityOps, SchedAffinity};
pub use crate::cgroupfs::read_procs;
pub use affinity::AffinityPlacement;
pub use v1::CgroupV1;
pub use v2::CgroupV2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementKind {
    CgroupV2,
    CgroupV1,
    Affinity,
}

impl fmt::Display for PlacementKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PlacementKind::CgroupV2 => "cgroup-v2",
            PlacementKind::CgroupV1 => "cgroup-v1",
            PlacementKind::Affinity => "affinity",
        })
    }
}

/// Confines a workload to a subset of the CPUs it was allowed.
pub trait Placement {
    fn kind(&self) -> PlacementKind;
    /// What the workload was allowed before Gleaner.
    fn allowed(&self) -> &Cpuset;
    /// Confine the workload to `cpus`, a non-empty subset of `allowed()`.
    fn set_active(&mut self, cpus: &Cpuset) -> Result<()>;
    /// (pid, tid) of every thread of the workload now.
    fn workload_tids(&self) -> Result<Vec<(u32, u32)>>;
    /// Pids of the workload's processes now. The cgroup back ends read only `cgroup.procs`,
    /// so a caller that needs no thread list (the BPF sampler) does not list every thread.
    fn workload_pids(&self) -> Result<Vec<u32>> {
        let mut pids: Vec<u32> = self.workload_tids()?.into_iter().map(|(p, _)| p).collect();
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }
    /// Per-CPU ns of work done by the workload (v1 `cpuacct.usage_percpu`), if available.
    fn per_cpu_work_ns(&self) -> Result<Option<Vec<u64>>>;
    /// Give back exactly what was there. Idempotent; failed items stay for a retry.
    fn restore(&mut self) -> Result<()>;
}

/// What the back ends read and call: `/proc`, the affinity syscalls and the journal.
/// Tests substitute a fake `/proc` tree and fake affinity calls.
#[derive(Clone)]
pub struct PlacementEnv {
    pub proc: ProcFs,
    pub affinity: Arc<dyn AffinityOps>,
    pub journal: Option<SharedJournal>,
}

impl PlacementEnv {
    /// The real `/proc` and real `sched_{get,set}affinity`.
    pub fn real(journal: Option<SharedJournal>) -> Self {
        Self {
            proc: ProcFs::new("/proc"),
            affinity: Arc::new(SchedAffinity),
            journal,
        }
    }
}

/// Where the cgroup hierarchies are mounted (already joined under the file-system root).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupMounts {
    pub v2: Option<PathBuf>,
    pub v1_cpuset: Option<PathBuf>,
    pub v1_cpuacct: Option<PathBuf>,
}

impl CgroupMounts {
    /// Reads `proc`'s `self/mountinfo`; mount points are joined under `fs_root` (`/` on a
    /// real system, a temp dir for fake trees).
    pub fn from_mountinfo(proc: &ProcFs, fs_root: &Path) -> Result<Self> {
        let mut mounts = CgroupMounts::default();
        for m in proc.mountinfo()? {
            let at = fs_root.join(m.mount_point.strip_prefix("/").unwrap_or(&m.mount_point));
            let has = |c: &str| m.super_options.iter().any(|o| o == c);
            match m.fs_type.as_str() {
                "cgroup2" if mounts.v2.is_none() => mounts.v2 = Some(at),
                "cgroup" if has("cpuset") && mounts.v1_cpuset.is_none() => {
                    mounts.v1_cpuset = Some(at)
                }
                "cgroup" if has("cpuacct") && mounts.v1_cpuacct.is_none() => {
                    mounts.v1_cpuacct = Some(at)
                }
                _ => {}
            }
        }
        Ok(mounts)
    }

    /// A cgroup directory for a path as written in `/proc/PID/cgroup` (`/a/b`).
    pub fn dir_for(mount: &Path, cgroup_path: &str) -> PathBuf {
        mount.join(cgroup_path.trim_start_matches('/'))
    }
}

/// The back end `detect` chose, and why each better one was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detection {
    pub kind: PlacementKind,
    pub mounts: CgroupMounts,
    pub skipped: Vec<(PlacementKind, String)>,
}

/// Chooses cgroup v2 (with cpuset), else v1 cpuset, else affinity.
pub fn detect(proc: &ProcFs, fs_root: &Path) -> Result<Detection> {
    let mounts = CgroupMounts::from_mountinfo(proc, fs_root)?;
    let mut skipped = vec![];
    match v2_unusable_reason(&mounts) {
        None => {
            return Ok(Detection {
                kind: PlacementKind::CgroupV2,
                mounts,
                skipped,
            })
        }
        Some(why) => skipped.push((PlacementKind::CgroupV2, why)),
    }
    match v1_unusable_reason(&mounts) {
        None => {
            return Ok(Detection {
                kind: PlacementKind::CgroupV1,
                mounts,
                skipped,
            })
        }
        Some(why) => skipped.push((PlacementKind::CgroupV1, why)),
    }
    Ok(Detection {
        kind: PlacementKind::Affinity,
        mounts,
        skipped,
    })
}

fn v2_unusable_reason(m: &CgroupMounts) -> Option<String> {
    let Some(root) = &m.v2 else {
        return Some("no cgroup2 mount".into());
    };
    let path = root.join("cgroup.controllers");
    match read_file(&path) {
        Ok(c) if c.split_whitespace().any(|w| w == "cpuset") => {}
        Ok(c) => {
            return Some(format!(
            "{} lists no cpuset controller (has: {:?}); it is bound to a v1 hierarchy or disabled",
            path.display(),
            c.trim()
        ))
        }
        Err(e) => return Some(e.to_string()),
    }
    not_writable(&root.join("cgroup.subtree_control"))
}

fn v1_unusable_reason(m: &CgroupMounts) -> Option<String> {
    let Some(root) = &m.v1_cpuset else {
        return Some("no cgroup v1 cpuset mount".into());
    };
    if let Err(e) = read_file(&root.join("cpuset.cpus")) {
        return Some(e.to_string());
    }
    not_writable(root)
}

fn not_writable(path: &Path) -> Option<String> {
    match nix::unistd::access(path, nix::unistd::AccessFlags::W_OK) {
        Ok(()) => None,
        Err(e) => Some(format!(
            "{} is not writable ({e}); run as root",
            path.display()
        )),
    }
}

/// Fails unless `cpus` is a non-empty subset of `allowed`.
pub(crate) fn check_active(cpus: &Cpuset, allowed: &Cpuset) -> Result<()> {
    if cpus.is_empty() || !cpus.is_subset(allowed) {
        return Err(Error::InvalidCpuset {
            requested: cpus.clone(),
            allowed: allowed.clone(),
        });
    }
    Ok(())
}

/// Starts, on a thread of its own, the wait that the first move of a task into a cgroup pays,
/// and keeps it paid until the returned [`CgroupPrimer`] is dropped, so that the workload's
/// move finds no wait at all.
///
/// Any move between cgroups takes `cgroup_threadgroup_rwsem` for writing, and the first
/// writer after a quiet spell waits for an RCU grace period (the rwsem's `rcu_sync`): 7-20 ms
/// on a 2-vCPU guest (`strace -T`, haltpoll guest, kernel v1147), longer while another vCPU runs in the kernel (the BPF verifier). A
/// writer within about one grace period of the last one does not wait. `gleaner run` moves
/// the workload into its cgroup before its first instruction, so that wait was the largest
/// part of its start-up. Moving this process into the cgroup it already belongs to
/// (`own_procs`, its own cgroup's `cgroup.procs`) takes the same lock and changes nothing.
///
/// One such move at the start was not enough: loading the BPF sampler (~13 ms) lies between
/// it and the workload's move, and where the grace period had lapsed by then the workload
/// waited again: `gleaner run --observe` started its workload 26-58 ms after it was started
/// itself (median 36 ms, haltpoll guest, kernel v1147, 2026-12-03), which is 1.8 % of a 2 s
/// job. The thread therefore moves this process again every 3 ms (`PRIME_INTERVAL`), well
/// within a grace period, until it is dropped or 2 s (`PRIME_LIMIT`) have passed. Errors are
/// ignored: without the head start the workload's move waits as before.
pub fn prime_cgroup_moves(own_procs: PathBuf) -> Option<CgroupPrimer> {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::Builder::new()
        .name("cgroup-prime".into())
        .spawn(move || {
            let started = Instant::now();
            let pid = std::process::id().to_string();
            while !stopped.load(Ordering::Relaxed) {
                if std::fs::write(&own_procs, &pid).is_err() || started.elapsed() >= PRIME_LIMIT {
                    break;
                }
                std::thread::park_timeout(PRIME_INTERVAL);
            }
        })
        .ok()?;
    Some(CgroupPrimer {
        stop,
        thread: Some(thread),
    })
}

/// How often [`prime_cgroup_moves`] moves this process again: twice within the shortest RCU
/// grace period seen here (~7 ms), and cheap once the lock is warm (a median 94 µs a move,
/// open and close included, against 15 ms for the first; 200 moves 3 ms apart from Python,
/// haltpoll guest, kernel v1147): about 1 ms of CPU over a start-up.
const PRIME_INTERVAL: Duration = Duration::from_millis(3);

/// How long [`prime_cgroup_moves`] keeps the lock warm at most, should its owner never drop
/// it: far more than a start-up takes.
const PRIME_LIMIT: Duration = Duration::from_secs(2);

/// Keeps cgroup moves free of their grace-period wait while it lives ([`prime_cgroup_moves`]).
/// Dropping it stops the thread without waiting for it.
pub struct CgroupPrimer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CgroupPrimer {
    /// Stops the thread and waits for it: no move happens after this returns.
    #[cfg(test)]
    fn finish(mut self) {
        self.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    fn signal(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}

impl Drop for CgroupPrimer {
    fn drop(&mut self) {
        self.signal();
    }
}

/// Builds a `pre_exec` hook that moves the freshly forked child into the given cgroups
/// (writes "0", meaning "the writing process", to each `cgroup.procs`/`tasks` file) before
/// it execs, so not one instruction of the workload runs outside them.
///
/// ```no_run
/// # use std::os::unix::process::CommandExt;
/// # fn f(files: Vec<std::path::PathBuf>) -> gleaner_linux::Result<()> {
/// let hook = gleaner_linux::cgroup::enter_cgroup_pre_exec(&files)?;
/// let mut cmd = std::process::Command::new("sleep");
/// // SAFETY: the hook only calls open/write/close, which are async-signal-safe.
/// unsafe { cmd.pre_exec(hook) };
/// # Ok(()) }
/// ```
///
/// The paths are converted to C strings here, before the fork, because the hook itself
/// must not allocate.
pub fn enter_cgroup_pre_exec(
    procs_files: &[PathBuf],
) -> Result<impl Fn() -> io::Result<()> + Send + Sync + 'static> {
    let paths = procs_files
        .iter()
        .map(|p| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| Error::parse(p, "path without NUL bytes", ""))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(move || {
        for path in &paths {
            // SAFETY: `path` is a valid NUL-terminated string; open/write/close are
            // async-signal-safe and touch no Rust-managed memory.
            unsafe {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if written != 1 {
                    return Err(err);
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
pub(crate) mod test_tree {
    //! Fake `/proc` and cgroup trees shared by the back ends' unit tests.
    use super::*;
    use std::fs;

    pub fn put(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    /// Adds a process with the given threads, start time and `/proc/PID/cgroup` text.
    pub fn add_process(
        proc_root: &Path,
        pid: u32,
        ppid: u32,
        tids: &[u32],
        start: u64,
        cgroup: &str,
    ) {
        for &tid in tids {
            let stat = format!(
                "{tid} (work er) S {ppid} 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 {} 0 {start} 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0\n",
                tids.len()
            );
            let dir = proc_root.join(format!("{pid}/task/{tid}"));
            put(&dir.join("stat"), &stat);
            put(&dir.join("children"), "");
            if tid == pid {
                put(&proc_root.join(format!("{pid}/stat")), &stat);
            }
        }
        put(&proc_root.join(format!("{pid}/cgroup")), cgroup);
    }

    pub fn set_children(proc_root: &Path, pid: u32, kids: &[u32]) {
        let text: Vec<String> = kids.iter().map(|k| k.to_string()).collect();
        put(
            &proc_root.join(format!("{pid}/task/{pid}/children")),
            &text.join(" "),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::test_tree::put;
    use super::*;

    /// The priming moves write this process's own PID into the file they are given (the
    /// cgroup it is already in), again and again until the primer is dropped; a file that
    /// cannot be written ends them, and is no error.
    #[test]
    fn priming_moves_this_process_into_its_own_cgroup_until_dropped_and_ignores_failure() {
        let dir = tempfile::tempdir().unwrap();
        let procs = dir.path().join("cgroup.procs");
        let primer = prime_cgroup_moves(procs.clone()).unwrap();
        let written = |path: &Path| {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(5) {
                if path.exists() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            false
        };
        assert!(written(&procs));
        assert_eq!(
            std::fs::read_to_string(&procs).unwrap(),
            std::process::id().to_string()
        );
        // Removed, the file comes back: the moves go on while the primer lives.
        std::fs::remove_file(&procs).unwrap();
        assert!(written(&procs), "the primer moved only once");
        primer.finish();
        std::fs::remove_file(&procs).unwrap();
        std::thread::sleep(PRIME_INTERVAL * 5);
        assert!(!procs.exists(), "a move after the primer finished");
        // Dropped, it stops as well (its thread is not waited for).
        drop(prime_cgroup_moves(procs.clone()).unwrap());
        let missing = dir.path().join("no-such-cgroup/cgroup.procs");
        prime_cgroup_moves(missing.clone()).unwrap().finish();
        assert!(!missing.exists());
    }

    const MOUNTINFO: &str = "22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    fn tree(v2_controllers: &str) -> (tempfile::TempDir, ProcFs) {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        put(&r.join("proc/self/mountinfo"), MOUNTINFO);
        put(
            &r.join("sys/fs/cgroup/unified/cgroup.controllers"),
            v2_controllers,
        );
        put(&r.join("sys/fs/cgroup/unified/cgroup.subtree_control"), "");
        put(&r.join("sys/fs/cgroup/cpuset/cpuset.cpus"), "0-1\n");
        let proc = ProcFs::with_clock_ticks(r.join("proc"), 100);
        (dir, proc)
    }

    #[test]
    fn detect_prefers_v2_with_cpuset() {
        let (dir, proc) = tree("cpuset cpu hugetlb\n");
        let d = detect(&proc, dir.path()).unwrap();
        assert_eq!(d.kind, PlacementKind::CgroupV2);
        assert_eq!(d.mounts.v2, Some(dir.path().join("sys/fs/cgroup/unified")));
        assert_eq!(
            d.mounts.v1_cpuacct,
            Some(dir.path().join("sys/fs/cgroup/cpuacct"))
        );
    }

    #[test]
    fn detect_falls_back_to_v1_like_this_machine() {
        let (dir, proc) = tree("hugetlb\n");
        let d = detect(&proc, dir.path()).unwrap();
        assert_eq!(d.kind, PlacementKind::CgroupV1);
        assert_eq!(d.skipped.len(), 1);
        assert!(
            d.skipped[0].1.contains("no cpuset controller"),
            "{}",
            d.skipped[0].1
        );
    }

    #[test]
    fn detect_falls_back_to_affinity_with_reasons() {
        let (dir, proc) = tree("hugetlb\n");
        std::fs::remove_file(dir.path().join("sys/fs/cgroup/cpuset/cpuset.cpus")).unwrap();
        let d = detect(&proc, dir.path()).unwrap();
        assert_eq!(d.kind, PlacementKind::Affinity);
        assert_eq!(
            d.skipped.iter().map(|s| s.0).collect::<Vec<_>>(),
            [PlacementKind::CgroupV2, PlacementKind::CgroupV1]
        );
        assert!(d.skipped[1].1.contains("cpuset.cpus"), "{}", d.skipped[1].1);
    }

    #[test]
    fn check_active_requires_nonempty_subset() {
        let allowed: Cpuset = "0-3".parse().unwrap();
        assert!(check_active(&"1-2".parse().unwrap(), &allowed).is_ok());
        assert!(check_active(&Cpuset::new(), &allowed).is_err());
        let err = check_active(&"3-4".parse().unwrap(), &allowed).unwrap_err();
        assert!(err.to_string().contains("0-3"), "{err}");
    }

    #[test]
    fn pre_exec_hook_writes_zero_to_each_file() {
        let dir = tempfile::tempdir().unwrap();
        let files = [dir.path().join("a"), dir.path().join("b")];
        for f in &files {
            put(f, "");
        }
        let hook = enter_cgroup_pre_exec(&files).unwrap();
        hook().unwrap();
        for f in &files {
            assert_eq!(std::fs::read_to_string(f).unwrap(), "0");
        }
        let missing = enter_cgroup_pre_exec(&[dir.path().join("none/cgroup.procs")]).unwrap();
        assert_eq!(missing().unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
