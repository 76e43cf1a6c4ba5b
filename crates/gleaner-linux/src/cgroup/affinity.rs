//! The placement back end that needs neither root nor a cpuset controller.
//!
//! Exists for unprivileged runs and kernels without usable cpusets: it walks the workload's
//! process tree and calls `sched_setaffinity` on every thread, remembering (and journaling)
//! each thread's original mask the first time it sees it. Threads that exit are skipped;
//! threads born since the last call are picked up on the next one. Threads are identified
//! by tid plus start time so a reused tid is never "restored" to someone else's mask.

use std::collections::HashMap;

use gleaner_policy::Cpuset;

use super::{check_active, Placement, PlacementEnv, PlacementKind};
use crate::error::{Error, Result};
use crate::journal::{UndoAction, UndoLog};

/// Confines a process tree by per-thread affinity.
pub struct AffinityPlacement {
    env: PlacementEnv,
    root_pid: u32,
    allowed: Cpuset,
    log: UndoLog,
    /// tid → start time of each thread whose original mask is recorded.
    recorded: HashMap<u32, u64>,
    /// Whether the tree is confined to less than `allowed` right now, and to what.
    confined: bool,
    last_active: Cpuset,
}

impl AffinityPlacement {
    /// Tracks `root_pid` and its descendants; `allowed` is the root thread's mask now.
    pub fn new(env: PlacementEnv, root_pid: u32) -> Result<Self> {
        let allowed = env.affinity.get(root_pid)?.ok_or_else(|| Error::NotFound {
            path: env.proc.root().join(root_pid.to_string()),
        })?;
        let log = UndoLog::new(env.journal.clone());
        Ok(Self {
            env,
            root_pid,
            last_active: allowed.clone(),
            allowed,
            log,
            recorded: HashMap::new(),
            confined: false,
        })
    }

    /// Threads of the tree with their start times; threads that exit meanwhile are skipped.
    fn live_threads(&self) -> Result<Vec<(u32, u32, u64)>> {
        let proc = &self.env.proc;
        let mut out = vec![];
        let tree = match proc.process_tree(self.root_pid) {
            Ok(tree) => tree,
            // The root exited and was reaped: the tree is gone, which is how an attached
            // process normally ends, not an error.
            Err(e) if e.is_not_found() => return Ok(out),
            Err(e) => return Err(e),
        };
        for pid in tree {
            let tids = match proc.threads(pid) {
                Ok(t) => t,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            };
            for tid in tids {
                match proc.task_stat(pid, tid) {
                    // Exited but not yet reaped by its parent: no longer running, not the
                    // workload any more (else a never-reaped child would keep us attached).
                    Ok(st) if matches!(st.state, 'Z' | 'X') => {}
                    Ok(st) => out.push((pid, tid, st.start_ticks)),
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(out)
    }
}

impl Placement for AffinityPlacement {
    fn kind(&self) -> PlacementKind {
        PlacementKind::Affinity
    }

    fn allowed(&self) -> &Cpuset {
        &self.allowed
    }

    fn set_active(&mut self, cpus: &Cpuset) -> Result<()> {
        check_active(cpus, &self.allowed)?;
        for (pid, tid, start) in self.live_threads()? {
            if self.recorded.get(&tid) != Some(&start) {
                let Some(current) = self.env.affinity.get(tid)? else {
                    continue;
                };
                // A thread created after we first confined the tree inherited the confined
                // mask from its creator; what it would have had without Gleaner is the
                // tree's original mask, so that is what restore must give it.
                let original = if self.confined && current.is_subset(&self.last_active) {
                    self.allowed.clone()
                } else {
                    current
                };
                self.log.record(UndoAction::ThreadAffinity {
                    pid,
                    tid,
                    start_ticks: start,
                    original,
                })?;
                self.recorded.insert(tid, start);
            }
            self.env.affinity.set(tid, cpus)?;
        }
        self.confined = *cpus != self.allowed;
        self.last_active = cpus.clone();
        Ok(())
    }

    fn workload_tids(&self) -> Result<Vec<(u32, u32)>> {
        Ok(self
            .live_threads()?
            .into_iter()
            .map(|(pid, tid, _)| (pid, tid))
            .collect())
    }

    fn per_cpu_work_ns(&self) -> Result<Option<Vec<u64>>> {
        Ok(None)
    }

    fn restore(&mut self) -> Result<()> {
        let result =
            crate::restore::undo_log(&mut self.log, &self.env.proc, self.env.affinity.as_ref());
        if self.log.is_empty() {
            self.recorded.clear();
        }
        result
    }
}

impl Drop for AffinityPlacement {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            tracing::warn!("affinity restore on drop: {e}");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::affinity::AffinityOps;
    use crate::cgroup::test_tree::{add_process, set_children};
    use crate::journal::Journal;
    use crate::procfs::ProcFs;
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    /// Threads with masks in memory; a thread absent from the map behaves as exited.
    #[derive(Default)]
    pub struct FakeAffinity {
        masks: Mutex<BTreeMap<u32, Cpuset>>,
    }

    impl FakeAffinity {
        pub fn new(threads: &[(u32, &str)]) -> Self {
            let masks = threads
                .iter()
                .map(|(t, m)| (*t, m.parse().unwrap()))
                .collect();
            Self {
                masks: Mutex::new(masks),
            }
        }
        pub fn mask(&self, tid: u32) -> Option<Cpuset> {
            self.masks.lock().unwrap().get(&tid).cloned()
        }
        pub fn add(&self, tid: u32, mask: &str) {
            self.masks
                .lock()
                .unwrap()
                .insert(tid, mask.parse().unwrap());
        }
        pub fn remove(&self, tid: u32) {
            self.masks.lock().unwrap().remove(&tid);
        }
    }

    impl AffinityOps for FakeAffinity {
        fn get(&self, tid: u32) -> Result<Option<Cpuset>> {
            Ok(self.mask(tid))
        }
        fn set(&self, tid: u32, cpus: &Cpuset) -> Result<bool> {
            Ok(self
                .masks
                .lock()
                .unwrap()
                .get_mut(&tid)
                .map(|m| *m = cpus.clone())
                .is_some())
        }
    }

    fn env(
        proc_root: &Path,
        ops: Arc<FakeAffinity>,
        journal: Option<crate::journal::SharedJournal>,
    ) -> PlacementEnv {
        PlacementEnv {
            proc: ProcFs::with_clock_ticks(proc_root, 100),
            affinity: ops,
            journal,
        }
    }

    #[test]
    fn confines_tree_tracks_new_threads_and_restores_originals() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("proc");
        add_process(&p, 100, 1, &[100, 101], 10, "0::/\n");
        add_process(&p, 200, 100, &[200], 20, "0::/\n");
        set_children(&p, 100, &[200]);
        let ops = Arc::new(FakeAffinity::new(&[
            (100, "0-3"),
            (101, "2-3"),
            (200, "0-3"),
        ]));
        let journal = Journal::create(&dir.path().join("run"), &ProcFs::new("/proc"))
            .unwrap()
            .into_shared();
        let mut place =
            AffinityPlacement::new(env(&p, ops.clone(), Some(journal.clone())), 100).unwrap();
        assert_eq!(place.allowed().to_string(), "0-3");
        assert!(place.set_active(&"4".parse().unwrap()).is_err());

        place.set_active(&"0-1".parse().unwrap()).unwrap();
        for t in [100, 101, 200] {
            assert_eq!(ops.mask(t).unwrap().to_string(), "0-1");
        }
        assert_eq!(journal.lock().unwrap().entries().len(), 3);

        // A new thread appears, one exits: the next call records/applies only what exists.
        add_process(&p, 100, 1, &[100, 101, 102], 10, "0::/\n");
        set_children(&p, 100, &[200]);
        ops.add(102, "3");
        ops.remove(200);
        place.set_active(&"0".parse().unwrap()).unwrap();
        assert_eq!(ops.mask(102).unwrap().to_string(), "0");
        assert_eq!(
            place.workload_tids().unwrap(),
            vec![(100, 100), (100, 101), (100, 102), (200, 200)]
        );

        place.restore().unwrap();
        assert_eq!(ops.mask(100).unwrap().to_string(), "0-3");
        assert_eq!(ops.mask(101).unwrap().to_string(), "2-3");
        assert_eq!(ops.mask(102).unwrap().to_string(), "3");
        assert!(journal.lock().unwrap().entries().is_empty());
        place.restore().unwrap(); // idempotent
        assert_eq!(ops.mask(101).unwrap().to_string(), "2-3");
    }

    #[test]
    fn a_root_that_exited_and_was_reaped_is_an_empty_workload_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("proc");
        add_process(&p, 100, 1, &[100], 10, "0::/\n");
        let ops = Arc::new(FakeAffinity::new(&[(100, "0-1")]));
        let place = AffinityPlacement::new(env(&p, ops.clone(), None), 100).unwrap();
        assert_eq!(place.workload_tids().unwrap(), vec![(100, 100)]);
        std::fs::remove_dir_all(p.join("100")).unwrap();
        ops.remove(100);
        assert_eq!(place.workload_tids().unwrap(), vec![]);
    }

    #[test]
    fn drop_restores() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("proc");
        add_process(&p, 100, 1, &[100], 10, "0::/\n");
        let ops = Arc::new(FakeAffinity::new(&[(100, "0-1")]));
        {
            let mut place = AffinityPlacement::new(env(&p, ops.clone(), None), 100).unwrap();
            place.set_active(&"1".parse().unwrap()).unwrap();
            assert_eq!(ops.mask(100).unwrap().to_string(), "1");
        }
        assert_eq!(ops.mask(100).unwrap().to_string(), "0-1");
    }
}
