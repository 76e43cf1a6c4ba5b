//! Undoing what Gleaner changed: one journal entry, a back end's own log, or a whole journal
//! left by an instance that died.
//!
//! Exists apart from `journal` so that recording and undoing do not import each other: the
//! journal only records; this module reads a record and writes the original back through the
//! same file and system-call layers the back ends use (`cgroupfs`, `affinity`, the `write_file`
//! helper). The back ends' own `restore()` calls [`undo_log`], and the guard and
//! `gleaner recover` call [`undo`] on a dead instance's journal, so the crash path runs the
//! same code as the tested normal path.

use std::path::Path;

use crate::affinity::{AffinityOps, SchedAffinity};
use crate::cgroupfs::{move_process, read_procs, remove_cgroup_dir, write_cgroup_value};
use crate::error::{write_file, Error, Result};
use crate::journal::{Journal, UndoAction, UndoLog};
use crate::procfs::ProcFs;

/// Undoes a back end's own log (its `restore()`), newest first; failed entries stay.
pub fn undo_log(log: &mut UndoLog, proc: &ProcFs, ops: &dyn AffinityOps) -> Result<()> {
    log.undo_all(|action| undo_action(action, proc, ops))
}

/// Undoes every entry of `journal`, newest first, with real `sched_setaffinity`. Entries that
/// were undone are removed from the file; the rest stay for a later retry and are reported.
pub fn undo(journal: &mut Journal, proc: &ProcFs) -> Result<()> {
    undo_with(journal, proc, &SchedAffinity)
}

pub fn undo_with(journal: &mut Journal, proc: &ProcFs, ops: &dyn AffinityOps) -> Result<()> {
    let mut errors = vec![];
    let mut done = vec![];
    for entry in journal.entries().iter().rev() {
        match undo_action(&entry.action, proc, ops) {
            Ok(()) => done.push(entry.id),
            Err(e) => errors.push(e),
        }
    }
    if let Err(e) = journal.forget(&done) {
        errors.push(e);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::Restore { errors })
    }
}

/// Held while journals in a state directory are undone and rewritten after their owner died,
/// so that an instance's guard and `gleaner recover` never restore the same journal at once:
/// both rewrite it through `<pid>.json.tmp`, so one's rename could fail, or bring the journal
/// back after the other removed it. An advisory `flock` on the directory, released on drop or
/// when the holder dies; the lock is held only for the few system calls of an undo.
#[derive(Debug)]
pub struct RestoreLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

impl RestoreLock {
    /// Waits for the lock on `dir` (a directory that exists).
    pub fn acquire(dir: &Path) -> Result<Self> {
        let file = std::fs::File::open(dir).map_err(|e| Error::io(dir, e))?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map(Self)
            .map_err(|(_, errno)| Error::io(dir, std::io::Error::from(errno)))
    }
}

/// Undoes one change. Things that are already gone (an exited thread, a removed cgroup, a
/// reused pid) count as undone: there is nothing left to give back.
pub fn undo_action(action: &UndoAction, proc: &ProcFs, ops: &dyn AffinityOps) -> Result<()> {
    match action {
        UndoAction::CreatedCgroup { dir, fallback } => {
            // Missing: the directory is gone already (or, in a fake tree, never held a task).
            let pids = match read_procs(dir) {
                Ok(p) => p,
                Err(e) if e.is_not_found() => vec![],
                Err(e) => return Err(e),
            };
            for pid in pids {
                move_process(&fallback.join("cgroup.procs"), pid)?;
            }
            remove_cgroup_dir(dir)
        }
        UndoAction::MovedProcess {
            pid,
            start_ticks,
            from,
        } => {
            if !same_task(proc.process_start_time(*pid), *start_ticks)? {
                return Ok(());
            }
            move_process(&from.join("cgroup.procs"), *pid).map(|_| ())
        }
        UndoAction::EnabledController {
            subtree_control,
            controller,
        } => write_file(subtree_control, &format!("-{controller}")),
        UndoAction::CgroupFile { file, original } => write_cgroup_value(file, original),
        UndoAction::ThreadAffinity {
            pid,
            tid,
            start_ticks,
            original,
        } => {
            let start = proc.task_stat(*pid, *tid).map(|s| s.start_ticks);
            if !same_task(start, *start_ticks)? {
                return Ok(());
            }
            ops.set(*tid, original).map(|_| ())
        }
        UndoAction::PmQos { file, original, .. } => write_file(file, &original.to_string()),
        UndoAction::CpuidleStateDisable { file, original, .. } => {
            write_file(file, if *original { "1" } else { "0" })
        }
        UndoAction::HaltpollParam { file, original, .. } => write_file(file, original),
    }
}

/// Whether the task read now is the one recorded (it exists and started at the same tick).
fn same_task(start_now: Result<u64>, recorded: u64) -> Result<bool> {
    match start_now {
        Ok(s) => Ok(s == recorded),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::affinity::tests::FakeAffinity;
    use crate::sysfs::PmQosLatency;
    use gleaner_policy::Cpuset;
    use std::fs;

    use crate::journal::tests::fake_proc;

    #[test]
    fn undo_restores_files_and_affinity_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let proc = fake_proc(
            &r.join("proc"),
            &[(1, 1, 500), (10, 10, 1000), (10, 11, 1001)],
        );
        let file = r.join("guest_halt_poll_ns");
        fs::write(&file, "50000").unwrap();
        let qos = r.join("pm_qos_resume_latency_us");
        fs::write(&qos, "20").unwrap();
        let mut j = Journal::create(&r.join("run"), &ProcFs::new("/proc")).unwrap();
        // The same file changed twice: undo must leave the first original in place.
        j.record(UndoAction::HaltpollParam {
            name: "n".into(),
            file: file.clone(),
            original: "200000".into(),
        })
        .unwrap();
        j.record(UndoAction::HaltpollParam {
            name: "n".into(),
            file: file.clone(),
            original: "100000".into(),
        })
        .unwrap();
        j.record(UndoAction::PmQos {
            cpu: 0,
            file: qos.clone(),
            original: PmQosLatency::NoConstraint,
        })
        .unwrap();
        let poll_disable = r.join("disable");
        fs::write(&poll_disable, "1").unwrap();
        j.record(UndoAction::CpuidleStateDisable {
            cpu: 0,
            file: poll_disable.clone(),
            original: false,
        })
        .unwrap();
        let all: Cpuset = "0-1".parse().unwrap();
        j.record(UndoAction::ThreadAffinity {
            pid: 10,
            tid: 11,
            start_ticks: 1001,
            original: all.clone(),
        })
        .unwrap();
        // tid 12 exited; tid 10's record is from an older task that had the same tid.
        j.record(UndoAction::ThreadAffinity {
            pid: 10,
            tid: 12,
            start_ticks: 1002,
            original: all.clone(),
        })
        .unwrap();
        j.record(UndoAction::ThreadAffinity {
            pid: 10,
            tid: 10,
            start_ticks: 7,
            original: all.clone(),
        })
        .unwrap();
        let ops = FakeAffinity::new(&[(10, "0"), (11, "0")]);
        undo_with(&mut j, &proc, &ops).unwrap();
        assert_eq!(fs::read_to_string(&file).unwrap(), "200000");
        assert_eq!(fs::read_to_string(&qos).unwrap(), "0");
        assert_eq!(fs::read_to_string(&poll_disable).unwrap(), "0");
        assert_eq!(ops.mask(11), Some(all));
        assert_eq!(
            ops.mask(10).unwrap().to_string(),
            "0",
            "reused tid must not be touched"
        );
        assert!(j.entries().is_empty());
        assert!(Journal::load(j.path()).unwrap().entries().is_empty());
    }

    #[test]
    fn failed_undo_keeps_the_entry_for_retry() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let mut j = Journal::create(&r.join("run"), &ProcFs::new("/proc")).unwrap();
        let missing_dir = r.join("no/such/dir/param");
        j.record(UndoAction::HaltpollParam {
            name: "p".into(),
            file: missing_dir,
            original: "1".into(),
        })
        .unwrap();
        let err = undo_with(&mut j, &ProcFs::new("/proc"), &FakeAffinity::new(&[])).unwrap_err();
        assert!(
            matches!(&err, Error::Restore { errors } if errors.len() == 1),
            "{err}"
        );
        assert_eq!(Journal::load(j.path()).unwrap().entries().len(), 1);
    }

    #[test]
    fn restore_lock_excludes_a_second_restorer_until_dropped() {
        use nix::fcntl::{Flock, FlockArg};
        let dir = tempfile::tempdir().unwrap();
        let try_other = || {
            Flock::lock(
                fs::File::open(dir.path()).unwrap(),
                FlockArg::LockExclusiveNonblock,
            )
            .is_ok()
        };
        let held = RestoreLock::acquire(dir.path()).unwrap();
        assert!(
            !try_other(),
            "a second restorer got the lock while the first held it"
        );
        drop(held);
        assert!(try_other());
        assert!(RestoreLock::acquire(&dir.path().join("absent"))
            .unwrap_err()
            .to_string()
            .contains("absent"));
    }
}
