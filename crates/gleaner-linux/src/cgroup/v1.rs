//! The cgroup v1 cpuset (+cpuacct) back end.
//!
//! Exists because many guests (this project's included) still bind cpuset and cpuacct to
//! v1 hierarchies, and v1 cpuacct gives what v2 lacks: per-CPU work in ns
//! (`cpuacct.usage_percpu`). Creates `gleaner-<id>` in the cpuset hierarchy (with
//! `cpuset.mems` copied from the parent, as v1 requires before tasks may join) and a
//! matching group in the cpuacct hierarchy, or attaches to an existing cpuset cgroup.
//!
//! v1 rewrites a task's affinity mask when it joins a cpuset or the cpuset changes, so the
//! masks of the moved threads are journaled too and put back after they return.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use gleaner_policy::Cpuset;

use super::v2::{pids_in_subtree, threads_of};
use super::{check_active, CgroupMounts, Placement, PlacementEnv, PlacementKind};
use crate::cgroupfs::move_process;
use crate::error::{read_cpuset, read_file, write_file, Error, RereadFile, Result};
use crate::journal::{UndoAction, UndoLog};

/// Where the v1 hierarchies are mounted.
#[derive(Debug, Clone)]
pub struct V1Mounts {
    pub cpuset: PathBuf,
    pub cpuacct: Option<PathBuf>,
}

impl V1Mounts {
    pub fn from_detected(m: &CgroupMounts) -> Option<Self> {
        Some(V1Mounts {
            cpuset: m.v1_cpuset.clone()?,
            cpuacct: m.v1_cpuacct.clone(),
        })
    }
}

pub struct CgroupV1 {
    env: PlacementEnv,
    mounts: V1Mounts,
    cpuset_dir: PathBuf,
    /// The cpuacct group with the same relative path, when that hierarchy exists.
    cpuacct_dir: Option<PathBuf>,
    /// Its `cpuacct.usage_percpu`, read every period through one open file; closed before
    /// the group is removed.
    usage_percpu: Mutex<Option<RereadFile>>,
    allowed: Cpuset,
    log: UndoLog,
}

impl CgroupV1 {
    /// Creates `gleaner-<id>` under `parent` (a path relative to the hierarchy roots, e.g.
    /// "/") in the cpuset and cpuacct hierarchies and moves `pids` in. With no pids, start
    /// the workload inside with [`super::enter_cgroup_pre_exec`] on [`CgroupV1::procs_files`].
    /// Anything done before a failure is undone before the error is returned.
    pub fn create(
        env: PlacementEnv,
        mounts: V1Mounts,
        parent: &str,
        id: &str,
        pids: &[u32],
    ) -> Result<Self> {
        let rel = format!("{}/gleaner-{id}", parent.trim_matches('/'));
        let mut me = CgroupV1 {
            log: UndoLog::new(env.journal.clone()),
            cpuset_dir: CgroupMounts::dir_for(&mounts.cpuset, &rel),
            cpuacct_dir: mounts
                .cpuacct
                .as_ref()
                .filter(|m| **m != mounts.cpuset)
                .map(|m| CgroupMounts::dir_for(m, &rel)),
            usage_percpu: Mutex::new(None),
            allowed: Cpuset::new(),
            mounts,
            env,
        };
        match me.build(parent, pids) {
            Ok(()) => Ok(me),
            Err(e) => {
                let _ = me.restore(); // the original error is the one to report
                Err(e)
            }
        }
    }

    fn build(&mut self, parent: &str, pids: &[u32]) -> Result<()> {
        let parent_dir = CgroupMounts::dir_for(&self.mounts.cpuset, parent);
        let mems = read_file(&parent_dir.join("cpuset.mems"))?;
        self.allowed = match read_cpuset(&parent_dir.join("cpuset.effective_cpus")) {
            Err(e) if e.is_not_found() => read_cpuset(&parent_dir.join("cpuset.cpus"))?,
            other => other?,
        };
        let own = match pids.first() {
            Some(&pid) => self.env.proc.cgroup_of(pid)?,
            None => self.env.proc.own_cgroup()?,
        };
        let dirs = [
            Some((
                "cpuset",
                self.mounts.cpuset.clone(),
                self.cpuset_dir.clone(),
            )),
            self.cpuacct_mount_and_dir(),
        ];
        for (controller, mount, dir) in dirs.into_iter().flatten() {
            let back = own.v1(controller).unwrap_or("/");
            self.log.record(UndoAction::CreatedCgroup {
                dir: dir.clone(),
                fallback: CgroupMounts::dir_for(&mount, back),
            })?;
            if let Err(e) = std::fs::create_dir(&dir) {
                self.log.discard_last()?; // not ours: never remove it
                return Err(Error::io(&dir, e));
            }
        }
        write_file(&self.cpuset_dir.join("cpuset.mems"), mems.trim())?;
        write_file(
            &self.cpuset_dir.join("cpuset.cpus"),
            &self.allowed.to_string(),
        )?;
        for &pid in pids {
            self.add_process(pid)?;
        }
        Ok(())
    }

    fn cpuacct_mount_and_dir(&self) -> Option<(&'static str, PathBuf, PathBuf)> {
        Some((
            "cpuacct",
            self.mounts.cpuacct.clone()?,
            self.cpuacct_dir.clone()?,
        ))
    }

    /// Attaches to an existing cpuset cgroup `dir`; its `cpuset.cpus` is written back on
    /// restore. Uses the cpuacct group at the same relative path if there is one.
    pub fn attach(env: PlacementEnv, mounts: V1Mounts, dir: &Path) -> Result<Self> {
        let cpus_file = dir.join("cpuset.cpus");
        let original = read_file(&cpus_file)?.trim().to_string();
        let allowed: Cpuset = original
            .parse()
            .map_err(|_| Error::parse(&cpus_file, "CPU list", &original))?;
        let cpuacct_dir = match (&mounts.cpuacct, dir.strip_prefix(&mounts.cpuset)) {
            (Some(m), Ok(rel)) if *m != mounts.cpuset => {
                Some(m.join(rel)).filter(|d| d.join("cpuacct.usage_percpu").exists())
            }
            _ => None,
        };
        let mut log = UndoLog::new(env.journal.clone());
        log.record(UndoAction::CgroupFile {
            file: cpus_file,
            original,
        })?;
        Ok(CgroupV1 {
            env,
            mounts,
            cpuset_dir: dir.to_path_buf(),
            cpuacct_dir,
            usage_percpu: Mutex::new(None),
            allowed,
            log,
        })
    }

    /// Moves a process into the created groups, recording its cgroups and thread masks.
    pub fn add_process(&mut self, pid: u32) -> Result<()> {
        let proc = &self.env.proc;
        let cg = proc.cgroup_of(pid)?;
        let start_ticks = proc.process_start_time(pid)?;
        for tid in proc.threads(pid)? {
            let start = match proc.task_stat(pid, tid) {
                Ok(st) => st.start_ticks,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            };
            if let Some(original) = self.env.affinity.get(tid)? {
                self.log.record(UndoAction::ThreadAffinity {
                    pid,
                    tid,
                    start_ticks: start,
                    original,
                })?;
            }
        }
        let targets = [
            Some((
                "cpuset",
                self.mounts.cpuset.clone(),
                self.cpuset_dir.clone(),
            )),
            self.cpuacct_mount_and_dir(),
        ];
        for (controller, mount, dir) in targets.into_iter().flatten() {
            let from = cg.v1(controller).unwrap_or("/");
            self.log.record(UndoAction::MovedProcess {
                pid,
                start_ticks,
                from: CgroupMounts::dir_for(&mount, from),
            })?;
            move_process(&dir.join("cgroup.procs"), pid)?;
        }
        Ok(())
    }

    pub fn cpuset_dir(&self) -> &Path {
        &self.cpuset_dir
    }

    /// The files a child writes "0" into (before exec) to start inside these groups.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        std::iter::once(&self.cpuset_dir)
            .chain(&self.cpuacct_dir)
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }
}

impl Placement for CgroupV1 {
    fn kind(&self) -> PlacementKind {
        PlacementKind::CgroupV1
    }

    fn allowed(&self) -> &Cpuset {
        &self.allowed
    }

    fn set_active(&mut self, cpus: &Cpuset) -> Result<()> {
        check_active(cpus, &self.allowed)?;
        write_file(&self.cpuset_dir.join("cpuset.cpus"), &cpus.to_string())
    }

    fn workload_tids(&self) -> Result<Vec<(u32, u32)>> {
        threads_of(&self.env, &pids_in_subtree(&self.cpuset_dir)?)
    }

    fn workload_pids(&self) -> Result<Vec<u32>> {
        let mut pids = pids_in_subtree(&self.cpuset_dir)?;
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    fn per_cpu_work_ns(&self) -> Result<Option<Vec<u64>>> {
        let Some(dir) = &self.cpuacct_dir else {
            return Ok(None);
        };
        let mut file = self.usage_percpu.lock().unwrap_or_else(|e| e.into_inner());
        file.get_or_insert_with(|| RereadFile::new(dir.join("cpuacct.usage_percpu")))
            .parse(parse_usage_percpu)
            .map(Some)
    }

    fn restore(&mut self) -> Result<()> {
        *self
            .usage_percpu
            .get_mut()
            .unwrap_or_else(|e| e.into_inner()) = None;
        crate::restore::undo_log(&mut self.log, &self.env.proc, self.env.affinity.as_ref())
    }
}

/// `cpuacct.usage_percpu`: one count of ns per possible CPU.
fn parse_usage_percpu(path: &Path, text: &str) -> Result<Vec<u64>> {
    let values = text
        .split_whitespace()
        .map(|w| w.parse().map_err(|_| Error::parse(path, "per-CPU ns", w)))
        .collect::<Result<Vec<u64>>>()?;
    if values.is_empty() {
        return Err(Error::parse(path, "per-CPU ns", text));
    }
    Ok(values)
}

impl Drop for CgroupV1 {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            tracing::warn!("cgroup v1 restore on drop: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::affinity::tests::FakeAffinity;
    use crate::cgroup::test_tree::{add_process, put};
    use crate::procfs::ProcFs;
    use std::fs;
    use std::sync::Arc;

    struct Tree {
        _dir: tempfile::TempDir,
        proc: PathBuf,
        mounts: V1Mounts,
    }

    /// Like this guest: cpuset and cpuacct as separate v1 hierarchies, CPUs 0-1, mems 0;
    /// workload 100 (threads 100, 101) in the root groups.
    fn tree() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        let cpuset = dir.path().join("sys/fs/cgroup/cpuset");
        let cpuacct = dir.path().join("sys/fs/cgroup/cpuacct");
        put(&cpuset.join("cpuset.cpus"), "0-1\n");
        put(&cpuset.join("cpuset.effective_cpus"), "0-1\n");
        put(&cpuset.join("cpuset.mems"), "0\n");
        put(&cpuset.join("cgroup.procs"), "1\n");
        put(&cpuacct.join("cgroup.procs"), "1\n");
        add_process(
            &proc,
            100,
            1,
            &[100, 101],
            50,
            "3:cpuset:/\n2:cpuacct:/\n0::/\n",
        );
        put(&proc.join("self/cgroup"), "3:cpuset:/\n2:cpuacct:/\n0::/\n");
        Tree {
            _dir: dir,
            proc,
            mounts: V1Mounts {
                cpuset,
                cpuacct: Some(cpuacct),
            },
        }
    }

    fn env(t: &Tree, ops: Arc<FakeAffinity>) -> PlacementEnv {
        PlacementEnv {
            proc: ProcFs::with_clock_ticks(&t.proc, 100),
            affinity: ops,
            journal: None,
        }
    }

    fn text(p: &Path) -> String {
        fs::read_to_string(p).unwrap()
    }

    #[test]
    fn create_copies_mems_moves_into_both_hierarchies_and_restores() {
        let t = tree();
        let ops = Arc::new(FakeAffinity::new(&[(100, "0-1"), (101, "1")]));
        let mut cg =
            CgroupV1::create(env(&t, ops.clone()), t.mounts.clone(), "/", "5", &[100]).unwrap();
        let cs = t.mounts.cpuset.join("gleaner-5");
        let ca = t.mounts.cpuacct.clone().unwrap().join("gleaner-5");
        assert_eq!(cg.cpuset_dir(), cs);
        assert_eq!(text(&cs.join("cpuset.mems")), "0");
        assert_eq!(text(&cs.join("cpuset.cpus")), "0-1");
        assert_eq!(
            (
                text(&cs.join("cgroup.procs")),
                text(&ca.join("cgroup.procs"))
            ),
            ("100".into(), "100".into())
        );
        assert_eq!(
            cg.procs_files(),
            vec![cs.join("cgroup.procs"), ca.join("cgroup.procs")]
        );

        put(
            &ca.join("cpuacct.usage_percpu"),
            "50691390922 60055701040 \n",
        );
        assert_eq!(
            cg.per_cpu_work_ns().unwrap(),
            Some(vec![50_691_390_922, 60_055_701_040])
        );

        cg.set_active(&"1".parse().unwrap()).unwrap();
        assert_eq!(text(&cs.join("cpuset.cpus")), "1");
        ops.add(101, "1"); // what the kernel does to masks on a v1 cpuset change
        ops.add(100, "1");

        cg.restore().unwrap();
        assert!(!cs.exists() && !ca.exists());
        assert_eq!(text(&t.mounts.cpuset.join("cgroup.procs")), "100");
        assert_eq!(
            text(&t.mounts.cpuacct.clone().unwrap().join("cgroup.procs")),
            "100"
        );
        assert_eq!(ops.mask(100).unwrap().to_string(), "0-1");
        assert_eq!(
            ops.mask(101).unwrap().to_string(),
            "1",
            "a pinned thread stays pinned"
        );
    }

    #[test]
    fn garbage_usage_percpu_is_an_error() {
        let t = tree();
        let cg = CgroupV1::create(
            env(&t, Arc::new(FakeAffinity::new(&[]))),
            t.mounts.clone(),
            "/",
            "g",
            &[],
        )
        .unwrap();
        let ca = t.mounts.cpuacct.clone().unwrap().join("gleaner-g");
        put(&ca.join("cpuacct.usage_percpu"), "12 x3\n");
        assert!(matches!(cg.per_cpu_work_ns(), Err(Error::Parse { .. })));
        put(&ca.join("cpuacct.usage_percpu"), "\n");
        assert!(matches!(cg.per_cpu_work_ns(), Err(Error::Parse { .. })));
    }

    #[test]
    fn failed_create_undoes_partial_work() {
        let t = tree();
        // The cpuacct group exists already (someone else's): the cpuset group we made must go.
        put(
            &t.mounts
                .cpuacct
                .clone()
                .unwrap()
                .join("gleaner-x/cgroup.procs"),
            "9\n",
        );
        let err = CgroupV1::create(
            env(&t, Arc::new(FakeAffinity::new(&[]))),
            t.mounts.clone(),
            "/",
            "x",
            &[100],
        )
        .err()
        .unwrap();
        assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
        assert!(!t.mounts.cpuset.join("gleaner-x").exists());
        assert!(t.mounts.cpuacct.clone().unwrap().join("gleaner-x").exists());
    }

    #[test]
    fn attach_restores_original_cpus() {
        let t = tree();
        let dir = t.mounts.cpuset.join("db");
        put(&dir.join("cpuset.cpus"), "0-1\n");
        put(&dir.join("cgroup.procs"), "100\n");
        put(
            &t.mounts
                .cpuacct
                .clone()
                .unwrap()
                .join("db/cpuacct.usage_percpu"),
            "1 2\n",
        );
        let mut cg = CgroupV1::attach(
            env(&t, Arc::new(FakeAffinity::new(&[]))),
            t.mounts.clone(),
            &dir,
        )
        .unwrap();
        assert_eq!(cg.per_cpu_work_ns().unwrap(), Some(vec![1, 2]));
        assert_eq!(cg.workload_tids().unwrap(), vec![(100, 100), (100, 101)]);
        cg.set_active(&"0".parse().unwrap()).unwrap();
        assert_eq!(text(&dir.join("cpuset.cpus")), "0");
        cg.restore().unwrap();
        assert_eq!(text(&dir.join("cpuset.cpus")), "0-1");
        assert!(dir.exists());
    }
}
