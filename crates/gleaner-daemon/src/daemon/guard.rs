//! The guard and `gleaner recover`: the two ways a change is undone when the instance that
//! made it cannot undo it itself.
//!
//! Apart from `run`/`attach` because they run in other processes: the guard is a child in its
//! own session that waits for the instance's pipe to close (SIGKILL, abort) and then undoes the
//! journal; `recover` is what an operator runs when the guard died too.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use gleaner_linux::journal::{self, Journal};
use gleaner_linux::restore;
use gleaner_linux::ProcFs;

/// Starts the guard: a separate process (own session, so a terminal's Ctrl-C does not reach
/// it) that waits for our end of a pipe to close and then undoes our journal.
pub(super) fn spawn_guard(journal_path: &Path) -> Result<GuardHandle> {
    let exe = std::env::current_exe().context("cannot find our own executable for the guard")?;
    let mut c = Command::new(exe);
    // The guard logs the way its instance does (JSON lines under --log-format json).
    c.args(crate::logging::child_args())
        .arg("__guard")
        .arg(journal_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
    if let Some((k, v)) = crate::logging::child_env() {
        c.env(k, v);
    }
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            libc::setsid();
            Ok(())
        })
    };
    let child = c.spawn().context("cannot start the guard process")?;
    Ok(GuardHandle { child })
}

pub struct GuardHandle {
    child: Child,
}

/// The byte an instance writes to its guard's pipe to say it has no SCHED_IDLE thread now
/// (see [`GuardNotifier::quiet`]).
const QUIET: u8 = b'q';
/// The byte that says it is about to start some (see [`GuardNotifier::poll`]).
const POLL: u8 = b'p';

impl GuardHandle {
    /// A second handle on the guard's pipe, for telling it whether to poll.
    pub fn notifier(&self) -> GuardNotifier {
        use std::os::fd::AsFd;
        GuardNotifier {
            pipe: self
                .child
                .stdin
                .as_ref()
                .and_then(|s| s.as_fd().try_clone_to_owned().ok())
                .map(std::fs::File::from),
        }
    }
}

/// Tells the guard whether its owner may have SCHED_IDLE threads. Where it has none, a kill
/// closes the pipe at once and the guard sleeps until it does; where it may, the guard also
/// checks every 100 ms whether its owner is dying (such a thread can hold up the exit for
/// seconds on a saturated vCPU). So Gleaner wakes nothing between its periods unless it holds
/// vCPUs by yielding threads.
pub struct GuardNotifier {
    pipe: Option<std::fs::File>,
}

impl GuardNotifier {
    /// No SCHED_IDLE thread now, nor until [`GuardNotifier::poll`].
    pub fn quiet(&self) {
        self.send(QUIET);
    }

    /// SCHED_IDLE threads are about to start: said before they do.
    pub fn poll(&self) {
        self.send(POLL);
    }

    fn send(&self, byte: u8) {
        use std::io::Write;
        if let Some(mut pipe) = self.pipe.as_ref() {
            // A guard that is gone cannot be told, and has nothing left to poll for.
            let _ = pipe.write_all(&[byte]);
        }
    }
}

impl Drop for GuardHandle {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        // The guard exits as soon as it has checked the journal; reap it if it already has.
        let _ = self.child.try_wait();
    }
}

/// The guard's body (`gleaner __guard JOURNAL`): block until the pipe closes, then undo.
pub fn guard_main(journal_path: &Path) -> Result<i32> {
    use nix::sys::signal::{signal, SigHandler, Signal};
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGPIPE,
    ] {
        // SAFETY: ignoring a signal installs no handler code.
        let _ = unsafe { signal(sig, SigHandler::SigIgn) };
    }
    // Our parent is the instance we guard.
    let owner = std::os::unix::process::parent_id();
    // The guard sleeps until it must restore, and then it must not queue behind the load it
    // is restoring from (the kill test measured > 1 s on a busy 2-vCPU VM). Raising its own
    // priority needs CAP_SYS_NICE; without it the guard runs at the normal priority.
    // SAFETY: setpriority on this process only; it has no memory preconditions.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -10) };
    let proc = ProcFs::new("/proc");
    let mut sink = [0u8; 64];
    let mut stdin = std::io::stdin();
    let mut restored_early = false;
    // 100 ms: a tenth of the 1 s restore promise. -1 (wait for the pipe only) while the
    // instance says it has no SCHED_IDLE thread ([`QUIET`], until [`POLL`]).
    let mut poll_ms: libc::c_int = 100;
    loop {
        let mut fds = [libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: `fds` is one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, poll_ms) };
        if ready > 0 {
            match stdin.read(&mut sink) {
                Ok(n) if n > 0 => {
                    // The last word counts.
                    match sink[..n].iter().rev().find(|&&b| b == QUIET || b == POLL) {
                        Some(&QUIET) => poll_ms = -1,
                        Some(_) => poll_ms = 100,
                        None => {}
                    }
                    continue;
                }
                _ => break, // the pipe closed: the instance is gone
            }
        }
        // A SIGKILLed process closes the pipe only once its last thread has exited, and a
        // SCHED_IDLE retention thread on a vCPU the workload saturates can wait seconds to
        // run (measured by tests/kill_test.sh). Its threads run no more user code once the
        // kill is pending, so undo now; the journal is kept, and undone again after the pipe
        // closes, for a system call that was already in flight when the kill came.
        if !restored_early && owner_is_dying(&proc, owner) {
            hasten_exit(&proc, owner);
            if let Ok(j) = Journal::load(journal_path) {
                for e in j.entries().iter().rev() {
                    let _ = restore::undo_action(
                        &e.action,
                        &proc,
                        &gleaner_linux::cgroup::SchedAffinity,
                    );
                }
            }
            restored_early = true;
        }
    }
    // Not while `gleaner recover` is restoring this journal too (see RestoreLock). Without
    // the lock the guard still restores; it just may race a concurrent recover.
    let _restoring = journal_path.parent().map(restore::RestoreLock::acquire);
    let _ = std::fs::remove_file(journal_path.with_extension("json.tmp")); // killed mid-write
    if !journal_path.exists() {
        return Ok(0); // clean exit, or killed before the journal existed: nothing to undo
    }
    let mut j = Journal::load(journal_path)?;
    let n = j.entries().len();
    restore::undo(&mut j, &proc)
        .context("guard could not undo every change; run `gleaner recover`")?;
    // The dead instance could not remove its status file either; `status` would skip it, but
    // a stale file is clutter that outlives the pid. Removed before the journal, so that a
    // missing journal means the guard is done.
    let _ = std::fs::remove_file(journal_path.with_extension("status"));
    let _ = j.remove();
    if n > 0 {
        tracing::warn!(journal = %journal_path.display(), restored = n, "gleaner guard: the instance ended without cleaning up; restored {n} change(s)");
    }
    Ok(0)
}

/// Moves the dying instance's SCHED_IDLE retention threads back to SCHED_OTHER, so that they
/// get a CPU to finish exiting on instead of lingering behind a busy workload.
fn hasten_exit(proc: &ProcFs, pid: u32) {
    let Ok(tids) = proc.threads(pid) else { return };
    for tid in tids {
        // Best effort: a thread that already exited has nothing left to hasten.
        let _ = gleaner_sys::sched::set_thread_sched_policy(tid as libc::pid_t, libc::SCHED_OTHER);
    }
}

/// Whether `pid` has a SIGKILL pending (it is being killed) or has exited already; a status
/// that cannot be read means it is gone.
fn owner_is_dying(proc: &ProcFs, pid: u32) -> bool {
    proc.process_status(pid).map_or(true, |st| st.is_dying())
}

/// `gleaner recover`: undo what instances that died with their guard left behind.
pub fn recover(state_dir: Option<PathBuf>) -> Result<i32> {
    let dir = state_dir.unwrap_or_else(Journal::default_dir);
    let proc = ProcFs::new("/proc");
    let mut failed = 0;
    let mut done = 0;
    // A guard finishing its own restore holds this until it is done; its journal is then gone.
    // No state directory: nothing to lock, and nothing to recover (said below).
    let _restoring = match restore::RestoreLock::acquire(&dir) {
        Err(e) if e.is_not_found() => None,
        lock => Some(lock?),
    };
    for j in journal::stale_journals(&dir, &proc)? {
        match j {
            Ok(mut j) => {
                let path = j.path().to_path_buf();
                let n = j.entries().len();
                match restore::undo(&mut j, &proc) {
                    Ok(()) => {
                        let _ = j.remove();
                        crate::outln!("recovered {}: undid {n} change(s)", path.display());
                        done += 1;
                    }
                    Err(e) => {
                        crate::errln!("gleaner: {}: {e}", path.display());
                        failed += 1;
                    }
                }
            }
            Err(e) => {
                crate::errln!("gleaner: {e}");
                failed += 1;
            }
        }
    }
    if done == 0 && failed == 0 {
        crate::outln!("nothing to recover in {}", dir.display());
    }
    Ok(if failed > 0 { 1 } else { 0 })
}
