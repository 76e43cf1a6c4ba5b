//! Crash-recovery journal: what Gleaner changed, written down before it changes it.
//!
//! Exists because Gleaner rewrites system state (cgroups, thread affinity, PM QoS, haltpoll
//! parameters) and may be killed by SIGKILL or a crash, where no destructor runs. Every
//! change is first appended to `<gleaner-pid>.json` (atomically: temp file + rename, mode
//! 0600); `gleaner recover` finds journals whose owner is dead and has `restore` undo them.
//! This module only records and finds records; it knows nothing of how a change is undone,
//! so the back ends that record through it are not imported by it.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gleaner_policy::Cpuset;
use serde::{Deserialize, Serialize};

use crate::error::{write_private_atomic, Durability, Error, Result};
use crate::procfs::ProcFs;
use crate::sysfs::PmQosLatency;

/// One change Gleaner is about to make, with what is needed to undo it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum UndoAction {
    /// Gleaner creates cgroup `dir`; undo moves the processes still in it to `fallback`
    /// (a cgroup directory) and removes it.
    CreatedCgroup { dir: PathBuf, fallback: PathBuf },
    /// Gleaner moves process `pid` (identified with its start time) out of cgroup `from`.
    MovedProcess {
        pid: u32,
        start_ticks: u64,
        from: PathBuf,
    },
    /// Gleaner writes `+controller` into this `cgroup.subtree_control`.
    EnabledController {
        subtree_control: PathBuf,
        controller: String,
    },
    /// Gleaner rewrites a cgroup file (an attached cgroup's `cpuset.cpus`).
    CgroupFile { file: PathBuf, original: String },
    /// Gleaner changes a thread's CPU affinity.
    ThreadAffinity {
        pid: u32,
        tid: u32,
        start_ticks: u64,
        original: Cpuset,
    },
    /// Gleaner changes a CPU's `pm_qos_resume_latency_us`.
    PmQos {
        cpu: usize,
        file: PathBuf,
        original: PmQosLatency,
    },
    /// Gleaner disables a cpuidle state for a moment (`cpuN/cpuidle/stateK/disable`; see
    /// `pmqos::PollRetention`); undo writes the original flag back.
    CpuidleStateDisable {
        cpu: usize,
        file: PathBuf,
        original: bool,
    },
    /// Gleaner changes a haltpoll module parameter.
    HaltpollParam {
        name: String,
        file: PathBuf,
        original: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EntryId(pub u64);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub id: EntryId,
    #[serde(flatten)]
    pub action: UndoAction,
}

/// The file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalState {
    pub owner_pid: u32,
    /// Owner's start time in ticks since boot; tells a live owner from a reused pid.
    pub owner_start_ticks: u64,
    pub next_id: u64,
    /// In the order the changes were made; undone in reverse.
    pub entries: Vec<JournalEntry>,
}

/// An open journal file.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    state: JournalState,
}

/// A journal shared by the back ends and the controller of one Gleaner process.
pub type SharedJournal = Arc<Mutex<Journal>>;

impl Journal {
    /// `/run/gleaner` for root, else `$XDG_RUNTIME_DIR/gleaner`, else a per-user temp dir.
    pub fn default_dir() -> PathBuf {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if euid == 0 {
            return PathBuf::from("/run/gleaner");
        }
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(d) if !d.is_empty() => PathBuf::from(d).join("gleaner"),
            _ => std::env::temp_dir().join(format!("gleaner-{euid}")),
        }
    }

    /// Starts an empty journal for this process in `dir` (created 0700 if missing).
    pub fn create(dir: &Path, proc: &ProcFs) -> Result<Journal> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Error::io(dir, e))?;
        let owner_pid = std::process::id();
        let journal = Journal {
            path: dir.join(format!("{owner_pid}.json")),
            state: JournalState {
                owner_pid,
                owner_start_ticks: proc.process_start_time(owner_pid)?,
                next_id: 0,
                entries: vec![],
            },
        };
        journal.persist()?;
        Ok(journal)
    }

    pub fn load(path: &Path) -> Result<Journal> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let state = serde_json::from_str(&text).map_err(|source| Error::Json {
            path: path.into(),
            source,
        })?;
        Ok(Journal {
            path: path.into(),
            state,
        })
    }

    pub fn into_shared(self) -> SharedJournal {
        Arc::new(Mutex::new(self))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn state(&self) -> &JournalState {
        &self.state
    }

    pub fn entries(&self) -> &[JournalEntry] {
        &self.state.entries
    }

    /// Appends `action` and writes the file. Returns only once it is on disk, so the caller
    /// may then make the change; on error the entry is not kept and the change must not be made.
    pub fn record(&mut self, action: UndoAction) -> Result<EntryId> {
        let id = EntryId(self.state.next_id);
        self.state.next_id += 1;
        self.state.entries.push(JournalEntry { id, action });
        if let Err(e) = self.persist() {
            self.state.entries.pop();
            return Err(e);
        }
        Ok(id)
    }

    /// Drops entries that have been undone (or whose change never happened).
    pub fn forget(&mut self, ids: &[EntryId]) -> Result<()> {
        self.state.entries.retain(|e| !ids.contains(&e.id));
        self.persist()
    }

    /// Deletes the file, after everything has been restored.
    pub fn remove(self) -> Result<()> {
        std::fs::remove_file(&self.path).map_err(|e| Error::io(&self.path, e))
    }

    fn persist(&self) -> Result<()> {
        let json = serde_json::to_vec_pretty(&self.state).map_err(|source| Error::Json {
            path: self.path.clone(),
            source,
        })?;
        write_private_atomic(&self.path, &json, Durability::Fsync)
    }
}

/// A hook for [`crate::pmqos::PollRetention`] (its `OriginalHook`): journals what undoes a
/// change (a CPU's original `pm_qos_resume_latency_us`, or a cpuidle state's `disable` flag)
/// before the first write to that file.
pub fn undo_recorder(
    journal: SharedJournal,
) -> impl FnMut(UndoAction) -> Result<()> + Send + 'static {
    move |action| {
        lock(&journal).record(action)?;
        Ok(())
    }
}

/// Journals in `dir` whose owner is dead, or whose pid now belongs to another process.
/// Unreadable or corrupt files are returned as errors, so one bad file blocks no recovery.
pub fn stale_journals(dir: &Path, proc: &ProcFs) -> Result<Vec<Result<Journal>>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut paths: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| is_journal_name(p))
        .collect();
    paths.sort();
    let mut stale = vec![];
    for path in paths {
        let journal = match Journal::load(&path) {
            Ok(j) => j,
            // Removed since the listing: its owner or guard finished with it.
            Err(_) if !path.exists() => continue,
            Err(e) => {
                stale.push(Err(e));
                continue;
            }
        };
        let owner_alive = match proc.process_start_time(journal.state.owner_pid) {
            Ok(start) => start == journal.state.owner_start_ticks,
            Err(e) if e.is_not_found() => false,
            Err(e) => return Err(e),
        };
        if !owner_alive {
            stale.push(Ok(journal));
        }
    }
    Ok(stale)
}

/// Journals are named `<owner pid>.json`; the state directory also holds other files (the
/// daemon's calibration cache, status files), which are not journals and must not be read as
/// such.
fn is_journal_name(path: &Path) -> bool {
    path.extension().is_some_and(|x| x == "json")
        && path
            .file_stem()
            .and_then(|s| s.to_str())
            .is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
}

/// The undo log of one back end: its own entries, each mirrored to the shared journal
/// (when there is one) before the change is made.
#[derive(Debug, Default)]
pub struct UndoLog {
    journal: Option<SharedJournal>,
    entries: Vec<(Option<EntryId>, UndoAction)>,
}

impl UndoLog {
    pub fn new(journal: Option<SharedJournal>) -> Self {
        Self {
            journal,
            entries: vec![],
        }
    }

    pub fn record(&mut self, action: UndoAction) -> Result<()> {
        let id = match &self.journal {
            Some(j) => Some(lock(j).record(action.clone())?),
            None => None,
        };
        self.entries.push((id, action));
        Ok(())
    }

    /// Drops the newest entry because its change failed before happening (e.g. `mkdir`
    /// refused): undoing it would touch something Gleaner did not create.
    pub fn discard_last(&mut self) -> Result<()> {
        if let Some((Some(id), _)) = self.entries.pop() {
            if let Some(j) = &self.journal {
                lock(j).forget(&[id])?;
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Undoes all entries newest first with `undo` (see `restore::undo_log`); failed ones
    /// stay for a retry. Idempotent. The log only keeps the books: how a change is undone is
    /// `restore`'s business.
    pub fn undo_all(&mut self, mut undo: impl FnMut(&UndoAction) -> Result<()>) -> Result<()> {
        let mut errors = vec![];
        let mut kept = vec![];
        let mut done_ids = vec![];
        while let Some((id, action)) = self.entries.pop() {
            match undo(&action) {
                Ok(()) => done_ids.extend(id),
                Err(e) => {
                    errors.push(e);
                    kept.push((id, action));
                }
            }
        }
        kept.reverse();
        self.entries = kept;
        if let (Some(j), false) = (&self.journal, done_ids.is_empty()) {
            if let Err(e) = lock(j).forget(&done_ids) {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Restore { errors })
        }
    }
}

/// A poisoned lock only means another thread panicked mid-record; the journal on disk is
/// still whole (records are atomic), so keep using it.
fn lock(j: &SharedJournal) -> std::sync::MutexGuard<'_, Journal> {
    j.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    /// A fake /proc holding only the processes the tests name, with a chosen start time.
    pub(crate) fn fake_proc(root: &Path, tasks: &[(u32, u32, u64)]) -> ProcFs {
        for &(pid, tid, start) in tasks {
            let stat = format!(
                "{tid} (w) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0\n"
            );
            let dir = root.join(format!("{pid}/task/{tid}"));
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("stat"), &stat).unwrap();
            if pid == tid {
                fs::write(root.join(format!("{pid}/stat")), &stat).unwrap();
            }
        }
        ProcFs::with_clock_ticks(root, 100)
    }

    #[test]
    fn record_persists_atomically_with_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let proc = ProcFs::new("/proc");
        let mut j = Journal::create(&dir.path().join("run"), &proc).unwrap();
        assert_eq!(j.path(), dir.path().join(format!("run/{me}.json")));
        let action = UndoAction::HaltpollParam {
            name: "guest_halt_poll_ns".into(),
            file: "/x/guest_halt_poll_ns".into(),
            original: "200000".into(),
        };
        j.record(action.clone()).unwrap();
        let mode = fs::metadata(j.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let back = Journal::load(j.path()).unwrap();
        assert_eq!(back.entries()[0].action, action);
        assert_eq!(back.state().owner_pid, me);
        assert!(!j.path().with_extension("json.tmp").exists());
    }

    #[test]
    fn undo_recorder_journals_cpu_and_value() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::create(dir.path(), &ProcFs::new("/proc"))
            .unwrap()
            .into_shared();
        let mut hook = undo_recorder(j.clone());
        let file = Path::new("/sys/devices/system/cpu/cpu3/power/pm_qos_resume_latency_us");
        let qos = |cpu, original| UndoAction::PmQos {
            cpu,
            file: file.into(),
            original,
        };
        hook(qos(3, PmQosLatency::NoConstraint)).unwrap();
        // A journal that can no longer be written refuses, so the change is not made.
        let path = j.lock().unwrap().path().to_path_buf();
        fs::remove_dir_all(dir.path()).unwrap();
        assert!(hook(qos(4, PmQosLatency::Us(20))).is_err());
        let j = j.lock().unwrap();
        assert_eq!(j.entries().len(), 1);
        assert_eq!(
            j.entries()[0].action,
            UndoAction::PmQos {
                cpu: 3,
                file: file.into(),
                original: PmQosLatency::NoConstraint
            }
        );
        assert!(!path.exists());
    }

    #[test]
    fn stale_journals_are_those_of_dead_or_reused_owners() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let proc = fake_proc(&r.join("proc"), &[(100, 100, 5000), (200, 200, 6000)]);
        let run = r.join("run");
        fs::create_dir(&run).unwrap();
        let write = |pid: u32, start: u64| {
            let st = JournalState {
                owner_pid: pid,
                owner_start_ticks: start,
                next_id: 0,
                entries: vec![],
            };
            fs::write(
                run.join(format!("{pid}.json")),
                serde_json::to_string(&st).unwrap(),
            )
            .unwrap();
        };
        write(100, 5000); // alive
        write(200, 1); // pid reused by a process started later
        write(300, 7000); // dead
        fs::write(run.join("400.json"), "{ truncated").unwrap();
        // The daemon's calibration cache lives beside the journals and is not one.
        fs::write(
            run.join("calibration.json"),
            r#"{"boot_id":"x","timeout_ns":1}"#,
        )
        .unwrap();
        let stale = stale_journals(&run, &proc).unwrap();
        let owners: Vec<u32> = stale
            .iter()
            .filter_map(|j| j.as_ref().ok())
            .map(|j| j.state().owner_pid)
            .collect();
        assert_eq!(owners, vec![200, 300]);
        assert_eq!(stale.iter().filter(|j| j.is_err()).count(), 1);
        assert!(stale_journals(&r.join("absent"), &proc).unwrap().is_empty());
    }
}
