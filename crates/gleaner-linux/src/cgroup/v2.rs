//! The cgroup v2 cpuset back end.
//!
//! Exists because on a unified hierarchy one `cpuset.cpus` write confines a whole workload,
//! threads born later included, with no per-thread bookkeeping. Two modes: create
//! `gleaner-<id>` under a parent (enabling `+cpuset` there if needed, and undoing that), or
//! attach to an existing cgroup and put its `cpuset.cpus` back afterwards.
//!
//! Only `+cpuset` is enabled: `cpu.stat` (`usage_usec`) and `cpu.pressure`, which Gleaner
//! reads, exist in every v2 cgroup without the `cpu` controller.

use std::path::{Path, PathBuf};

use gleaner_policy::Cpuset;

use super::{check_active, CgroupMounts, Placement, PlacementEnv, PlacementKind};
use crate::cgroupfs::{move_process, read_procs};
use crate::error::{read_cpuset, read_file, write_file, Error, Result, FIX_CPUSET_V2};
use crate::journal::{UndoAction, UndoLog};
use crate::procfs::{read_pressure, Pressure};

pub struct CgroupV2 {
    env: PlacementEnv,
    mount: PathBuf,
    dir: PathBuf,
    allowed: Cpuset,
    log: UndoLog,
}

impl CgroupV2 {
    /// Creates `<parent>/gleaner-<id>` confined to the parent's effective CPUs and moves
    /// `pids` into it. With no pids, start the workload in it with
    /// [`super::enter_cgroup_pre_exec`] on [`CgroupV2::procs_file`]. Anything done before a
    /// failure is undone before the error is returned.
    pub fn create(
        env: PlacementEnv,
        mount: &Path,
        parent: &Path,
        id: &str,
        pids: &[u32],
    ) -> Result<Self> {
        let controllers_file = parent.join("cgroup.controllers");
        let controllers = read_file(&controllers_file)?;
        if !controllers.split_whitespace().any(|c| c == "cpuset") {
            return Err(Error::CgroupNotEnabled {
                path: controllers_file,
                fix: format!("{FIX_CPUSET_V2} of its parent (or unbind cpuset from cgroup v1)"),
            });
        }
        // Where processes go back on restore: each moved pid's own cgroup, recorded per pid;
        // the fallback covers processes started inside (children of `gleaner run`).
        let fallback_path = match pids.first() {
            Some(&pid) => env.proc.cgroup_of(pid)?,
            None => env.proc.own_cgroup()?,
        };
        let fallback_rel = fallback_path.v2().ok_or_else(|| {
            Error::parse(env.proc.root().join("self/cgroup"), "cgroup v2 line", "")
        })?;
        let mut me = CgroupV2 {
            log: UndoLog::new(env.journal.clone()),
            mount: mount.to_path_buf(),
            dir: parent.join(format!("gleaner-{id}")),
            allowed: Cpuset::new(),
            env,
        };
        match me.build(parent, &CgroupMounts::dir_for(mount, fallback_rel), pids) {
            Ok(()) => Ok(me),
            Err(e) => {
                let _ = me.restore(); // the original error is the one to report
                Err(e)
            }
        }
    }

    fn build(&mut self, parent: &Path, fallback: &Path, pids: &[u32]) -> Result<()> {
        let subtree = parent.join("cgroup.subtree_control");
        if !read_file(&subtree)?
            .split_whitespace()
            .any(|c| c == "cpuset")
        {
            self.log.record(UndoAction::EnabledController {
                subtree_control: subtree.clone(),
                controller: "cpuset".into(),
            })?;
            write_file(&subtree, "+cpuset")?;
        }
        self.allowed = read_cpuset(&parent.join("cpuset.cpus.effective"))?;
        self.log.record(UndoAction::CreatedCgroup {
            dir: self.dir.clone(),
            fallback: fallback.to_path_buf(),
        })?;
        if let Err(e) = std::fs::create_dir(&self.dir) {
            self.log.discard_last()?; // not ours: never remove it
            return Err(Error::io(&self.dir, e));
        }
        write_file(&self.dir.join("cpuset.cpus"), &self.allowed.to_string())?;
        for &pid in pids {
            self.add_process(pid)?;
        }
        Ok(())
    }

    /// Attaches to an existing cgroup directory; its `cpuset.cpus` is written back on restore.
    pub fn attach(env: PlacementEnv, mount: &Path, dir: &Path) -> Result<Self> {
        let cpus_file = dir.join("cpuset.cpus");
        let original = read_file(&cpus_file)?.trim().to_string();
        let allowed = read_cpuset(&dir.join("cpuset.cpus.effective"))?;
        let mut log = UndoLog::new(env.journal.clone());
        log.record(UndoAction::CgroupFile {
            file: cpus_file,
            original,
        })?;
        Ok(CgroupV2 {
            env,
            mount: mount.to_path_buf(),
            dir: dir.to_path_buf(),
            allowed,
            log,
        })
    }

    /// Moves a process (all its threads) into the created cgroup, recording where it was.
    pub fn add_process(&mut self, pid: u32) -> Result<()> {
        let cg = self.env.proc.cgroup_of(pid)?;
        let from = cg.v2().ok_or_else(|| {
            Error::parse(
                self.env.proc.root().join(format!("{pid}/cgroup")),
                "cgroup v2 line",
                "",
            )
        })?;
        let start_ticks = self.env.proc.process_start_time(pid)?;
        self.log.record(UndoAction::MovedProcess {
            pid,
            start_ticks,
            from: CgroupMounts::dir_for(&self.mount, from),
        })?;
        move_process(&self.procs_file(), pid)?;
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file a child writes "0" into (before exec) to start inside this cgroup.
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    pub fn pressure(&self) -> Result<Pressure> {
        read_pressure(&self.dir.join("cpu.pressure"))
    }
}

/// Pids in `dir` and every cgroup below it (an attached cgroup may have children).
pub(crate) fn pids_in_subtree(dir: &Path) -> Result<Vec<u32>> {
    let mut pids = read_procs(dir)?;
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for entry in rd.filter_map(|e| e.ok()) {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            match pids_in_subtree(&entry.path()) {
                Ok(more) => pids.extend(more),
                Err(e) if e.is_not_found() => {} // removed while we walked
                Err(e) => return Err(e),
            }
        }
    }
    Ok(pids)
}

/// (pid, tid) for every thread of `pids`; processes that exited are skipped.
pub(crate) fn threads_of(env: &PlacementEnv, pids: &[u32]) -> Result<Vec<(u32, u32)>> {
    let mut out = vec![];
    for &pid in pids {
        match env.proc.threads(pid) {
            Ok(tids) => out.extend(tids.into_iter().map(|t| (pid, t))),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

impl Placement for CgroupV2 {
    fn kind(&self) -> PlacementKind {
        PlacementKind::CgroupV2
    }

    fn allowed(&self) -> &Cpuset {
        &self.allowed
    }

    fn set_active(&mut self, cpus: &Cpuset) -> Result<()> {
        check_active(cpus, &self.allowed)?;
        write_file(&self.dir.join("cpuset.cpus"), &cpus.to_string())
    }

    fn workload_tids(&self) -> Result<Vec<(u32, u32)>> {
        threads_of(&self.env, &pids_in_subtree(&self.dir)?)
    }

    fn workload_pids(&self) -> Result<Vec<u32>> {
        let mut pids = pids_in_subtree(&self.dir)?;
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    fn per_cpu_work_ns(&self) -> Result<Option<Vec<u64>>> {
        Ok(None)
    }

    fn restore(&mut self) -> Result<()> {
        crate::restore::undo_log(&mut self.log, &self.env.proc, self.env.affinity.as_ref())
    }
}

impl Drop for CgroupV2 {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            tracing::warn!("cgroup v2 restore on drop: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::affinity::tests::FakeAffinity;
    use crate::cgroup::test_tree::{add_process, put};
    use crate::journal::Journal;
    use crate::procfs::ProcFs;
    use crate::restore::undo_with;
    use std::fs;
    use std::sync::Arc;

    struct Tree {
        _dir: tempfile::TempDir,
        proc: PathBuf,
        mount: PathBuf,
        run: PathBuf,
    }

    /// A v2 hierarchy with cpuset available at the root but not yet enabled for children,
    /// and a workload process 100 in /user.slice; gleaner itself is in /gleaner.slice.
    fn tree(controllers: &str) -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        let mount = dir.path().join("sys/fs/cgroup");
        put(&mount.join("cgroup.controllers"), controllers);
        put(&mount.join("cgroup.subtree_control"), "memory\n");
        put(&mount.join("cpuset.cpus.effective"), "0-3\n");
        put(&mount.join("user.slice/cgroup.procs"), "100\n");
        put(&mount.join("gleaner.slice/cgroup.procs"), "");
        add_process(&proc, 100, 1, &[100, 101], 50, "0::/user.slice\n");
        put(&proc.join("self/cgroup"), "0::/gleaner.slice\n");
        Tree {
            run: dir.path().join("run"),
            _dir: dir,
            proc,
            mount,
        }
    }

    fn env(t: &Tree, journal: Option<crate::journal::SharedJournal>) -> PlacementEnv {
        PlacementEnv {
            proc: ProcFs::with_clock_ticks(&t.proc, 100),
            affinity: Arc::new(FakeAffinity::new(&[])),
            journal,
        }
    }

    fn text(p: &Path) -> String {
        fs::read_to_string(p).unwrap()
    }

    #[test]
    fn create_enables_cpuset_moves_process_and_restores_everything() {
        let t = tree("cpuset cpu memory\n");
        let journal = Journal::create(&t.run, &ProcFs::new("/proc"))
            .unwrap()
            .into_shared();
        let mut cg = CgroupV2::create(
            env(&t, Some(journal.clone())),
            &t.mount,
            &t.mount,
            "7",
            &[100],
        )
        .unwrap();
        let dir = t.mount.join("gleaner-7");
        assert_eq!(cg.dir(), dir);
        assert_eq!(text(&t.mount.join("cgroup.subtree_control")), "+cpuset");
        assert_eq!(cg.allowed().to_string(), "0-3");
        assert_eq!(text(&dir.join("cpuset.cpus")), "0-3");
        assert_eq!(text(&dir.join("cgroup.procs")), "100");
        assert_eq!(cg.workload_tids().unwrap(), vec![(100, 100), (100, 101)]);
        assert_eq!(journal.lock().unwrap().entries().len(), 3);

        cg.set_active(&"1-2".parse().unwrap()).unwrap();
        assert_eq!(text(&dir.join("cpuset.cpus")), "1-2");
        assert!(cg.set_active(&"2-5".parse().unwrap()).is_err());
        assert_eq!(cg.per_cpu_work_ns().unwrap(), None);

        cg.restore().unwrap();
        assert_eq!(text(&t.mount.join("user.slice/cgroup.procs")), "100");
        assert!(!dir.exists());
        assert_eq!(text(&t.mount.join("cgroup.subtree_control")), "-cpuset");
        assert!(journal.lock().unwrap().entries().is_empty());
        cg.restore().unwrap();
    }

    #[test]
    fn processes_started_inside_go_back_to_gleaners_cgroup() {
        let t = tree("cpuset\n");
        put(&t.mount.join("cgroup.subtree_control"), "cpuset\n");
        let cg = CgroupV2::create(env(&t, None), &t.mount, &t.mount, "run", &[]).unwrap();
        // As if the pre_exec hook had put child 300 in (a fake file just holds the pid).
        put(&cg.procs_file(), "300\n");
        drop(cg);
        assert_eq!(text(&t.mount.join("gleaner.slice/cgroup.procs")), "300");
        assert!(!t.mount.join("gleaner-run").exists());
        assert_eq!(
            text(&t.mount.join("cgroup.subtree_control")),
            "cpuset\n",
            "was enabled already: untouched"
        );
    }

    #[test]
    fn missing_controller_names_the_fix() {
        let t = tree("memory hugetlb\n");
        let err = CgroupV2::create(env(&t, None), &t.mount, &t.mount, "1", &[100])
            .err()
            .unwrap();
        assert!(matches!(err, Error::CgroupNotEnabled { .. }));
        assert!(err.to_string().contains("+cpuset"), "{err}");
        assert!(!t.mount.join("gleaner-1").exists());
    }

    #[test]
    fn existing_group_is_never_taken_over_or_removed() {
        let t = tree("cpuset\n");
        put(&t.mount.join("gleaner-9/cgroup.procs"), "555\n");
        let err = CgroupV2::create(env(&t, None), &t.mount, &t.mount, "9", &[])
            .err()
            .unwrap();
        assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
        assert_eq!(text(&t.mount.join("gleaner-9/cgroup.procs")), "555\n");
        assert_eq!(
            text(&t.mount.join("cgroup.subtree_control")),
            "-cpuset",
            "own change undone"
        );
    }

    #[test]
    fn attach_writes_original_cpus_back_and_reads_stats() {
        let t = tree("cpuset\n");
        let dir = t.mount.join("user.slice");
        put(&dir.join("cpuset.cpus"), "\n");
        put(&dir.join("cpuset.cpus.effective"), "0-3\n");
        put(
            &dir.join("cpu.stat"),
            "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n",
        );
        put(&dir.join("cpu.pressure"), "some avg10=0.00 avg60=0.00 avg300=0.00 total=42\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=7\n");
        put(&dir.join("child/cgroup.procs"), "200\n");
        add_process(&t.proc, 200, 1, &[200], 60, "0::/user.slice/child\n");
        let mut cg = CgroupV2::attach(env(&t, None), &t.mount, &dir).unwrap();
        assert_eq!(cg.allowed().to_string(), "0-3");
        assert_eq!(cg.pressure().unwrap().some_total_us, 42);
        assert_eq!(
            cg.workload_tids().unwrap(),
            vec![(100, 100), (100, 101), (200, 200)]
        );
        cg.set_active(&"0".parse().unwrap()).unwrap();
        assert_eq!(text(&dir.join("cpuset.cpus")), "0");
        cg.restore().unwrap();
        assert_eq!(
            text(&dir.join("cpuset.cpus")),
            "\n",
            "empty (inherit) written back as a newline"
        );
        assert!(dir.exists());
    }

    #[test]
    fn journal_alone_undoes_a_crashed_run() {
        let t = tree("cpuset\n");
        let journal = Journal::create(&t.run, &ProcFs::new("/proc"))
            .unwrap()
            .into_shared();
        let cg = CgroupV2::create(
            env(&t, Some(journal.clone())),
            &t.mount,
            &t.mount,
            "crash",
            &[100],
        )
        .unwrap();
        std::mem::forget(cg); // as if SIGKILLed: no destructor runs
        let path = journal.lock().unwrap().path().to_path_buf();
        let mut loaded = Journal::load(&path).unwrap();
        undo_with(
            &mut loaded,
            &ProcFs::with_clock_ticks(&t.proc, 100),
            &FakeAffinity::new(&[]),
        )
        .unwrap();
        assert!(!t.mount.join("gleaner-crash").exists());
        assert_eq!(text(&t.mount.join("user.slice/cgroup.procs")), "100");
        assert_eq!(text(&t.mount.join("cgroup.subtree_control")), "-cpuset");
    }
}
