//! Sleeping that ends early when a watched process exits or a signal arrives.
//!
//! Exists because the controller sleeps a whole control period (100 ms) between samples:
//! polled that way, a workload that has exited is noticed up to a period late, and every
//! `gleaner run` then outlives its workload by 50 ms on average: 2 % of a two-second job,
//! twice the measurement budget Gleaner has. A pidfd (Linux 5.3) becomes readable when its
//! process exits, and `ppoll` returns on that, on the timeout, or on any signal that has a
//! handler (poll is never restarted after a handler, whatever `SA_RESTART` says), so one call
//! sleeps exactly as long as there is nothing to do.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// Why [`sleep_or_readable`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// The whole timeout passed.
    Timeout,
    /// The watched file descriptor became readable (a pidfd: its process exited).
    Readable,
    /// A signal handler ran.
    Signal,
}

/// A pidfd for `pid`: readable once the process has exited. Fails with ENOSYS before Linux
/// 5.3 and ESRCH for a process that is already gone.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no memory
    // is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sleeps up to `timeout`, returning early when `fd` (if any) is readable or a signal
/// handler runs.
pub fn sleep_or_readable(fd: Option<BorrowedFd<'_>>, timeout: Duration) -> io::Result<Woken> {
    // time_t is 64 bits on every 64-bit Linux target (and named differently by musl's libc
    // crate), so the seconds are clamped as i64 and converted with `as _`.
    let secs = i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX);
    let ts = libc::timespec {
        tv_sec: secs as _,
        // Below 10^9, so it fits every c_long.
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    let mut pfd = libc::pollfd {
        fd: fd.map_or(-1, |f| f.as_raw_fd()),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` and `ts` live on this stack frame for the whole call; a negative fd is
    // ignored by the kernel (it then only waits for the timeout or a signal); a null sigmask
    // keeps the thread's mask.
    let n = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EINTR) => Ok(Woken::Signal),
            _ => Err(e),
        };
    }
    if n > 0 && pfd.revents != 0 {
        return Ok(Woken::Readable);
    }
    Ok(Woken::Timeout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::time::Instant;

    #[test]
    fn a_pidfd_wakes_the_sleeper_when_its_process_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.05")
            .spawn()
            .unwrap();
        let fd = pidfd_open(child.id()).unwrap();
        let t0 = Instant::now();
        let woken = sleep_or_readable(Some(fd.as_fd()), Duration::from_secs(5)).unwrap();
        assert_eq!(woken, Woken::Readable);
        assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
        child.wait().unwrap();
    }

    #[test]
    fn without_an_event_the_whole_timeout_passes() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let fd = pidfd_open(child.id()).unwrap();
        let t0 = Instant::now();
        let woken = sleep_or_readable(Some(fd.as_fd()), Duration::from_millis(20)).unwrap();
        assert_eq!(woken, Woken::Timeout);
        assert!(t0.elapsed() >= Duration::from_millis(20));
        child.kill().unwrap();
        child.wait().unwrap();
        let woken = sleep_or_readable(None, Duration::from_millis(1)).unwrap();
        assert_eq!(woken, Woken::Timeout);
    }

    #[test]
    fn a_process_that_does_not_exist_has_no_pidfd() {
        // PIDs above pid_max (at most 2^22) are never used.
        let e = pidfd_open(1 << 30).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH));
    }
}
