//! Scheduling of threads: policy, thread ids, context-switch counts and timer slack.

use std::io;

/// The kernel id of the calling thread (through the system call: musl before 1.2.3 has no
/// `gettid` wrapper).
pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as libc::pid_t }
}

/// Puts thread `tid` (0: the calling thread) under scheduling `policy` at priority 0.
///
/// Why the raw system call: musl's `sched_setscheduler` is a stub that always fails with
/// ENOSYS (POSIX makes the policy per process, Linux per thread, and musl refuses to pretend),
/// and Gleaner ships as a static musl binary (the test bed's guest image), so the libc wrapper
/// would disable retention there. The system call is the same on glibc.
pub fn set_thread_sched_policy(tid: libc::pid_t, policy: libc::c_int) -> io::Result<()> {
    // Zeroed rather than a struct literal: musl's sched_param has extra fields.
    // SAFETY: sched_param is plain old data; all-zero is priority 0.
    let param: libc::sched_param = unsafe { std::mem::zeroed() };
    // SAFETY: `param` is a valid sched_param that outlives the call; the kernel only reads it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            tid,
            policy,
            &param as *const libc::sched_param,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Scheduling policy of thread `tid` (0: the calling thread), through the system call for
/// the same reason as [`set_thread_sched_policy`].
pub fn thread_sched_policy(tid: libc::pid_t) -> io::Result<libc::c_int> {
    // SAFETY: sched_getscheduler takes a thread id and reads nothing from memory.
    let rc = unsafe { libc::syscall(libc::SYS_sched_getscheduler, tid) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as libc::c_int)
    }
}

/// Voluntary + involuntary context switches of the calling thread so far. A
/// `sched_yield()` that finds nothing else to run does not count as a switch; one that lets
/// another thread run does. `None` only if getrusage fails, which it cannot for
/// RUSAGE_THREAD.
pub fn thread_context_switches() -> Option<u64> {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage; RUSAGE_THREAD is the calling thread.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) } != 0 {
        return None;
    }
    Some((usage.ru_nvcsw as u64).wrapping_add(usage.ru_nivcsw as u64))
}

/// Sets the calling thread's timer slack (how late the kernel may fire its timers to batch
/// wake-ups; 50 µs by default). Per thread, gone with the thread.
pub fn set_current_thread_timer_slack_ns(ns: u64) -> io::Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn thread_sched_policy_is_set_on_the_caller_and_on_another_thread() {
        // Fails with ENOSYS when built for musl through the libc wrapper (see
        // set_thread_sched_policy).
        let (tid_tx, tid_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            let own = set_thread_sched_policy(0, libc::SCHED_IDLE);
            tid_tx.send((gettid(), own)).unwrap();
            done_rx.recv().unwrap();
        });
        let (tid, own) = tid_rx.recv().unwrap();
        own.unwrap();
        assert_eq!(thread_sched_policy(tid).unwrap(), libc::SCHED_IDLE);
        // Back to SCHED_OTHER from outside, as the guard does for a dying instance's threads.
        set_thread_sched_policy(tid, libc::SCHED_OTHER).unwrap();
        assert_eq!(thread_sched_policy(tid).unwrap(), libc::SCHED_OTHER);
        done_tx.send(()).unwrap();
        worker.join().unwrap();
        assert!(thread_sched_policy(i32::MAX).is_err());
    }

    #[test]
    fn switches_count_and_timer_slack_sets() {
        assert!(gettid() > 0);
        let before = thread_context_switches().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(
            thread_context_switches().unwrap() > before,
            "a sleep is a voluntary switch"
        );
        std::thread::spawn(|| set_current_thread_timer_slack_ns(1).unwrap())
            .join()
            .unwrap();
    }
}
