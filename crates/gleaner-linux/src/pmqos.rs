//! Second retention back end: let the guest kernel's cpuidle poll instead of halting.
//!
//! Writing `n/a` to `devices/system/cpu/cpuN/power/pm_qos_resume_latency_us` says "no resume
//! latency is acceptable on this CPU", so the cpuidle governor may only pick the POLL state:
//! an idle vCPU spins in the guest kernel and never exits to the hypervisor, which is what a
//! retention thread achieves from user level, without a thread and with a faster wake (the
//! waker only sets a flag the poller watches, no IPI). It needs a cpuidle driver with a POLL
//! state (e.g. `haltpoll`); without one (`current_driver` is `none`) the kernel halts through
//! `default_idle` and ignores the QoS value, so [`PollRetention::new`] reports it unavailable.
//!
//! Writing the original value back does not by itself stop the polling under the `haltpoll`
//! governor: once a CPU has polled, the governor polls again after every poll that a
//! wake-up ended, so a vCPU woken every few microseconds keeps polling for seconds (measured
//! on the haltpoll guest under `sysbench threads`: 1.7-2.3 s after the restore, and after
//! Gleaner had exited). Turning polling off therefore also disables the POLL state for a few
//! milliseconds ([`KICK`]): the CPU halts, the governor's poll limit shrinks to nothing, and
//! POLL is enabled again (halts then continued on that guest).
//!
//! Both files are system state: the original value of each is handed to a caller hook (the
//! crash journal, see `journal::undo_recorder`) before the first write, and written back by
//! [`PollRetention::restore`] and on drop. A CPU whose QoS file reads `n/a` already when
//! managing starts polls by someone else's setting (the user's, or another Gleaner instance
//! holding it), and is never written: taking that `n/a` for the original and writing it back
//! after the other instance had restored the real value left the CPU polling for good. The files are read and written through [`SysFs`],
//! the one place that knows their format.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use gleaner_policy::Cpuset;

use crate::error::{snippet, Error, Result};
use crate::journal::UndoAction;
use crate::sysfs::{PmQosLatency, SysFs};

/// Receives what undoes a change (a CPU's original QoS value, or its POLL state's original
/// `disable` flag) before that file is first written. An error aborts the write: without a
/// journal entry a crash could leave the CPU polling forever, or never polling.
pub type OriginalHook = Box<dyn FnMut(UndoAction) -> Result<()> + Send>;

/// How long the POLL state stays disabled when polling is turned off (see the module docs):
/// long enough for a busy vCPU to halt a few times, short enough not to matter to a user
/// whose guest polls on its own.
pub const KICK: Duration = Duration::from_millis(5);

/// One managed CPU: its QoS file, the value found there at start, and whether we have
/// changed it (and reported the original) yet.
struct QosFile {
    path: PathBuf,
    original: PmQosLatency,
    reported: bool,
    polling: bool,
    dirty: bool,
    /// The POLL state's `disable` flag as found (`None`: unreadable, never touched), whether
    /// it was journaled, and whether it is disabled by us right now.
    poll_disabled_originally: Option<bool>,
    kick_reported: bool,
    kicked: bool,
}

/// Poll-instead-of-halt retention for a set of CPUs.
pub struct PollRetention {
    sys: SysFs,
    files: BTreeMap<usize, QosFile>,
    on_original: OriginalHook,
}

impl fmt::Debug for PollRetention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let polling: Cpuset = self
            .files
            .iter()
            .filter(|(_, q)| q.polling)
            .map(|(&c, _)| c)
            .collect();
        f.debug_struct("PollRetention")
            .field("polling", &polling.to_string())
            .finish()
    }
}

impl PollRetention {
    /// Checks that polling can work on every CPU of `cpus` under `sys` (normally `/sys`) and
    /// reads the original QoS values. Nothing is written yet.
    pub fn new(sys: &SysFs, cpus: &Cpuset, on_original: OriginalHook) -> Result<Self> {
        let Some(driver) = sys.cpuidle_driver()? else {
            return Err(unavailable(format!(
                "no cpuidle driver is active ({} is absent, empty or \"none\"); idle vCPUs halt via default_idle and ignore PM QoS",
                sys.root().join("devices/system/cpu/cpuidle/current_driver").display()
            )));
        };
        let mut files = BTreeMap::new();
        for cpu in cpus.iter() {
            let name = sys.cpuidle_state_name(cpu, 0).map_err(|e| {
                unavailable(format!(
                    "cpuidle driver {:?} exposes no state0 for CPU {cpu} ({e})",
                    snippet(&driver)
                ))
            })?;
            if name != "POLL" {
                return Err(unavailable(format!(
                    "CPU {cpu}'s first idle state is {:?}, not POLL (cpuidle driver {:?})",
                    snippet(&name),
                    snippet(&driver)
                )));
            }
            let original = sys.pm_qos_resume_latency(cpu)?;
            files.insert(
                cpu,
                QosFile {
                    path: sys.pm_qos_path(cpu),
                    original,
                    reported: false,
                    polling: false,
                    dirty: false,
                    poll_disabled_originally: sys.cpuidle_state_disabled(cpu, 0).ok(),
                    kick_reported: false,
                    kicked: false,
                },
            );
        }
        Ok(Self {
            sys: sys.clone(),
            files,
            on_original,
        })
    }

    /// CPUs under management.
    pub fn cpus(&self) -> Cpuset {
        self.files.keys().copied().collect()
    }

    /// `on`: the CPU polls when idle. `off`: its original QoS value is back.
    pub fn set(&mut self, cpu: usize, on: bool) -> Result<()> {
        let managed = self.cpus().to_string();
        let file = self
            .files
            .get_mut(&cpu)
            .ok_or(Error::NotManaged { cpu, managed })?;
        if file.polling == on {
            return Ok(());
        }
        if file.original == PmQosLatency::ZeroLatency {
            // It polls already, by someone else's setting, which is theirs to undo: a second
            // instance that wrote its "original" `n/a` back after the first had restored the
            // real value left the CPU polling for good (the haltpoll guest, 2026-12-02: CPU 1
            // read `n/a` after the tests, and every later wake-latency probe found its halted
            // wakee polling).
            file.polling = on;
            return Ok(());
        }
        if !file.reported {
            (self.on_original)(UndoAction::PmQos {
                cpu,
                file: file.path.clone(),
                original: file.original,
            })
            .map_err(|source| Error::Unrecorded {
                path: file.path.clone(),
                source: Box::new(source),
            })?;
            file.reported = true;
        }
        let value = if on {
            PmQosLatency::ZeroLatency
        } else {
            file.original
        };
        // Marked dirty before the write: a failed write may still have changed the file.
        file.dirty = true;
        self.sys.set_pm_qos_resume_latency(cpu, value)?;
        file.polling = on;
        if !on {
            self.kick(cpu)?;
        }
        Ok(())
    }

    /// Disables `cpu`'s POLL state until [`PollRetention::settle`], so that it halts (see
    /// the module docs). Skipped where the flag could not be read or POLL was disabled
    /// already.
    fn kick(&mut self, cpu: usize) -> Result<()> {
        let Some(file) = self.files.get_mut(&cpu) else {
            return Ok(());
        };
        if file.poll_disabled_originally != Some(false) || file.kicked {
            return Ok(());
        }
        let path = self.sys.cpuidle_state_disable_path(cpu, 0);
        if !file.kick_reported {
            (self.on_original)(UndoAction::CpuidleStateDisable {
                cpu,
                file: path.clone(),
                original: false,
            })
            .map_err(|source| Error::Unrecorded {
                path,
                source: Box::new(source),
            })?;
            file.kick_reported = true;
        }
        // Marked before the write: a failed write may still have changed the file.
        file.kicked = true;
        self.sys.set_cpuidle_state_disabled(cpu, 0, true)
    }

    /// Ends the kicks that [`PollRetention::set`] started: waits [`KICK`] once if any CPU's
    /// POLL state is disabled, then enables it again. Call after a round of `set`s.
    pub fn settle(&mut self) -> Result<()> {
        if !self.files.values().any(|f| f.kicked) {
            return Ok(());
        }
        std::thread::sleep(KICK);
        let mut errors = Vec::new();
        for (&cpu, file) in self.files.iter_mut().filter(|(_, f)| f.kicked) {
            match self.sys.set_cpuidle_state_disabled(cpu, 0, false) {
                Ok(()) => file.kicked = false,
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Restore { errors })
        }
    }

    /// Writes every changed file back to its original value, and makes the CPUs that polled
    /// halt again (the kick, see the module docs). All files are attempted even if one
    /// fails; every failure is reported.
    pub fn restore(&mut self) -> Result<()> {
        let mut errors = Vec::new();
        let mut halt = Vec::new();
        for (&cpu, file) in self.files.iter_mut().filter(|(_, f)| f.dirty) {
            match self.sys.set_pm_qos_resume_latency(cpu, file.original) {
                Ok(()) => {
                    file.dirty = false;
                    file.polling = false;
                    halt.push(cpu);
                }
                Err(e) => errors.push(e),
            }
        }
        for cpu in halt {
            if let Err(e) = self.kick(cpu) {
                errors.push(e);
            }
        }
        if let Err(e) = self.settle() {
            errors.push(e);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Restore { errors })
        }
    }
}

impl Drop for PollRetention {
    fn drop(&mut self) {
        // Drop cannot report; callers that want the error call `restore()` first, after
        // which this is a no-op. The journal still holds the originals for `gleaner recover`.
        let _ = self.restore();
    }
}

fn unavailable(reason: String) -> Error {
    Error::PollUnavailable { reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    type Journal = Arc<Mutex<Vec<(PathBuf, String)>>>;

    /// A fake sysfs with a POLL-capable cpuidle driver on CPUs 0..n.
    fn fake_sysfs(n: usize, driver: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let cpu = dir.path().join("devices/system/cpu");
        fs::create_dir_all(cpu.join("cpuidle")).unwrap();
        fs::write(cpu.join("cpuidle/current_driver"), format!("{driver}\n")).unwrap();
        for i in 0..n {
            fs::create_dir_all(cpu.join(format!("cpu{i}/cpuidle/state0"))).unwrap();
            fs::create_dir_all(cpu.join(format!("cpu{i}/power"))).unwrap();
            fs::write(cpu.join(format!("cpu{i}/cpuidle/state0/name")), "POLL\n").unwrap();
            fs::write(qos(dir.path(), i), "0\n").unwrap();
        }
        dir
    }

    fn qos(root: &Path, cpu: usize) -> PathBuf {
        root.join(format!(
            "devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us"
        ))
    }

    fn read(root: &Path, cpu: usize) -> String {
        fs::read_to_string(qos(root, cpu))
            .unwrap()
            .trim()
            .to_string()
    }

    fn recording_hook() -> (OriginalHook, Journal) {
        let journal: Journal = Arc::default();
        let j = Arc::clone(&journal);
        let hook: OriginalHook = Box::new(move |action| {
            let entry = match action {
                UndoAction::PmQos { file, original, .. } => (file, original.to_string()),
                UndoAction::CpuidleStateDisable { file, original, .. } => {
                    (file, original.to_string())
                }
                other => panic!("unexpected undo action {other:?}"),
            };
            j.lock().unwrap().push(entry);
            Ok(())
        });
        (hook, journal)
    }

    fn new(root: &Path, cpus: &Cpuset, hook: OriginalHook) -> Result<PollRetention> {
        PollRetention::new(&SysFs::new(root), cpus, hook)
    }

    fn cpus(s: &str) -> Cpuset {
        s.parse().unwrap()
    }

    #[test]
    fn polls_and_restores_reporting_originals_first() {
        let root = fake_sysfs(2, "haltpoll");
        fs::write(qos(root.path(), 1), "25\n").unwrap();
        let (hook, journal) = recording_hook();
        let mut p = new(root.path(), &cpus("0-1"), hook).unwrap();
        assert!(
            journal.lock().unwrap().is_empty(),
            "nothing reported before a write"
        );

        p.set(1, true).unwrap();
        assert_eq!(read(root.path(), 1), "n/a");
        assert_eq!(read(root.path(), 0), "0");
        assert_eq!(
            *journal.lock().unwrap(),
            vec![(qos(root.path(), 1), "25".to_string())]
        );

        p.set(1, false).unwrap();
        assert_eq!(read(root.path(), 1), "25");
        p.set(1, true).unwrap();
        p.set(0, true).unwrap();
        assert_eq!(
            journal.lock().unwrap().len(),
            2,
            "each original is reported once"
        );

        p.restore().unwrap();
        assert_eq!(
            (read(root.path(), 0), read(root.path(), 1)),
            ("0".into(), "25".into())
        );
    }

    fn poll_disable(root: &Path, cpu: usize) -> PathBuf {
        root.join(format!(
            "devices/system/cpu/cpu{cpu}/cpuidle/state0/disable"
        ))
    }

    /// Turning polling off disables POLL until `settle`, journaled first, so that the
    /// haltpoll governor's sticky polling ends; `settle` and `restore` enable it again.
    #[test]
    fn turning_polling_off_kicks_the_cpu_out_of_poll_and_settles() {
        let root = fake_sysfs(2, "haltpoll");
        for cpu in 0..2 {
            fs::write(poll_disable(root.path(), cpu), "0\n").unwrap();
        }
        let disabled = |cpu| fs::read_to_string(poll_disable(root.path(), cpu)).unwrap();
        let (hook, journal) = recording_hook();
        let mut p = new(root.path(), &cpus("0-1"), hook).unwrap();
        p.set(0, true).unwrap();
        assert_eq!(disabled(0).trim(), "0", "turning polling on does not kick");
        p.set(0, false).unwrap();
        assert_eq!(disabled(0), "1");
        assert_eq!(
            journal.lock().unwrap().last().unwrap(),
            &(poll_disable(root.path(), 0), "false".to_string()),
            "the flag is journaled before it is written"
        );
        p.settle().unwrap();
        assert_eq!(disabled(0), "0");
        // Restore kicks every CPU that polled, and leaves POLL enabled.
        p.set(0, true).unwrap();
        p.set(1, true).unwrap();
        p.restore().unwrap();
        assert_eq!((disabled(0), disabled(1)), ("0".into(), "0".into()));
        assert_eq!(
            journal.lock().unwrap().len(),
            4,
            "each original is journaled once"
        );
        // A POLL state the user had disabled is left alone.
        fs::write(poll_disable(root.path(), 1), "1\n").unwrap();
        let (hook, _) = recording_hook();
        let mut p = new(root.path(), &cpus("1"), hook).unwrap();
        p.set(1, true).unwrap();
        p.restore().unwrap();
        assert_eq!(disabled(1), "1\n");
    }

    #[test]
    fn drop_restores() {
        let root = fake_sysfs(2, "haltpoll");
        {
            let (hook, _journal) = recording_hook();
            let mut p = new(root.path(), &cpus("0-1"), hook).unwrap();
            p.set(0, true).unwrap();
            p.set(1, true).unwrap();
            assert_eq!(read(root.path(), 0), "n/a");
        }
        assert_eq!(
            (read(root.path(), 0), read(root.path(), 1)),
            ("0".into(), "0".into())
        );
    }

    #[test]
    fn unavailable_without_a_polling_driver() {
        for driver in ["none", ""] {
            let root = fake_sysfs(2, driver);
            let (hook, _) = recording_hook();
            let err = new(root.path(), &cpus("0-1"), hook).unwrap_err();
            assert!(matches!(err, Error::PollUnavailable { .. }), "{err}");
        }
        // No cpuidle directory at all.
        let empty = tempfile::tempdir().unwrap();
        let (hook, _) = recording_hook();
        let err = new(empty.path(), &cpus("0"), hook).unwrap_err();
        assert!(matches!(err, Error::PollUnavailable { .. }), "{err}");
        // A driver whose first state is not POLL.
        let root = fake_sysfs(2, "acpi_idle");
        fs::write(
            root.path()
                .join("devices/system/cpu/cpu1/cpuidle/state0/name"),
            "C1\n",
        )
        .unwrap();
        let (hook, _) = recording_hook();
        let err = new(root.path(), &cpus("0-1"), hook).unwrap_err();
        assert!(err.to_string().contains("not POLL"), "{err}");
        // A CPU that does not exist.
        let (hook, _) = recording_hook();
        let err = new(root.path(), &cpus("0,7"), hook).unwrap_err();
        assert!(matches!(err, Error::PollUnavailable { .. }), "{err}");
    }

    #[test]
    fn malformed_content_is_an_error() {
        for bad in ["", "abc\n", "-1\n", "12 34\n", "99999999999999\n"] {
            let root = fake_sysfs(1, "haltpoll");
            fs::write(qos(root.path(), 0), bad).unwrap();
            let (hook, _) = recording_hook();
            let err = new(root.path(), &cpus("0"), hook).unwrap_err();
            assert!(matches!(err, Error::Parse { .. }), "{bad:?}: {err}");
        }
        let root = fake_sysfs(1, "haltpoll");
        fs::write(qos(root.path(), 0), "n/a\n").unwrap();
        let (hook, _) = recording_hook();
        assert!(new(root.path(), &cpus("0"), hook).is_ok());
    }

    #[test]
    fn failed_write_still_restores_the_others() {
        let root = fake_sysfs(2, "haltpoll");
        let (hook, _) = recording_hook();
        let mut p = new(root.path(), &cpus("0-1"), hook).unwrap();
        p.set(0, true).unwrap();
        // CPU 1's file turns into a directory: its write fails.
        fs::remove_file(qos(root.path(), 1)).unwrap();
        fs::create_dir(qos(root.path(), 1)).unwrap();
        let err = p.set(1, true).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        let err = p.restore().unwrap_err();
        assert!(
            matches!(&err, Error::Restore { errors } if errors.len() == 1),
            "{err}"
        );
        assert_eq!(read(root.path(), 0), "0", "the healthy CPU is restored");
        drop(p);
        assert_eq!(read(root.path(), 0), "0");
    }

    #[test]
    fn journal_failure_prevents_the_write() {
        let root = fake_sysfs(1, "haltpoll");
        let hook: OriginalHook = Box::new(|_| {
            Err(Error::NotFound {
                path: "/run/gleaner/1.json".into(),
            })
        });
        let mut p = new(root.path(), &cpus("0"), hook).unwrap();
        let err = p.set(0, true).unwrap_err();
        assert!(matches!(err, Error::Unrecorded { .. }), "{err}");
        assert_eq!(read(root.path(), 0), "0");
        let err = p.set(3, true).unwrap_err();
        assert!(matches!(err, Error::NotManaged { cpu: 3, .. }), "{err}");
    }

    /// Two instances on one CPU: the second starts while the first holds it polling, so it
    /// finds `n/a`. In either order of their ends, and with the second turning its polling
    /// off and on again after the first has ended, the CPU is back at the real original once
    /// both are done.
    #[test]
    fn a_second_instance_does_not_leave_the_first_ones_poll_behind() {
        for second_ends_first in [false, true] {
            let root = fake_sysfs(1, "haltpoll");
            let (hook_a, _) = recording_hook();
            let (hook_b, journal_b) = recording_hook();
            let mut a = new(root.path(), &cpus("0"), hook_a).unwrap();
            a.set(0, true).unwrap();
            let mut b = new(root.path(), &cpus("0"), hook_b).unwrap();
            b.set(0, true).unwrap();
            assert!(
                journal_b.lock().unwrap().is_empty(),
                "the second instance found the first one's n/a and wrote nothing"
            );
            if second_ends_first {
                b.restore().unwrap();
                assert_eq!(read(root.path(), 0), "n/a", "the first one still polls");
                a.restore().unwrap();
            } else {
                a.restore().unwrap();
                assert_eq!(read(root.path(), 0), "0");
                b.set(0, false).unwrap();
                assert_eq!(
                    read(root.path(), 0),
                    "0",
                    "turned off over the first's restore"
                );
                b.set(0, true).unwrap();
                b.restore().unwrap();
            }
            assert_eq!(
                read(root.path(), 0),
                "0",
                "second instance ended first: {second_ends_first}"
            );
        }
    }

    #[test]
    fn this_machine_reports_unavailable_or_works() {
        // Reads the real /sys but writes nothing: `new` only checks and reads.
        let (hook, journal) = recording_hook();
        match new(Path::new("/sys"), &cpus("0"), hook) {
            Err(Error::PollUnavailable { reason }) => assert!(!reason.is_empty()),
            Err(e) => panic!("unexpected error: {e}"),
            Ok(p) => assert_eq!(p.cpus(), cpus("0")),
        }
        assert!(journal.lock().unwrap().is_empty());
    }
}
