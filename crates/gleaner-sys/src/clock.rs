//! Clocks read with `clock_gettime` and sleeping on `CLOCK_MONOTONIC`.

use std::io;

const NS_PER_SEC: u64 = 1_000_000_000;

fn read(clock: libc::clockid_t) -> io::Result<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec on this stack frame.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((ts.tv_sec as u64)
        .saturating_mul(NS_PER_SEC)
        .saturating_add(ts.tv_nsec as u64))
}

/// CLOCK_MONOTONIC in nanoseconds; served by the vDSO, so it costs no system call.
pub fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC always exists on Linux and `ts` is valid, so this cannot fail.
    read(libc::CLOCK_MONOTONIC).unwrap_or(0)
}

/// CPU time used so far by the calling process, all threads, in nanoseconds.
pub fn own_process_cpu_ns() -> u64 {
    // Like CLOCK_MONOTONIC, the calling process's CPU clock always exists.
    read(libc::CLOCK_PROCESS_CPUTIME_ID).unwrap_or(0)
}

/// CPU time used so far by the calling thread, in nanoseconds (what a piece of work on this
/// thread cost, unaffected by the process's other threads).
pub fn own_thread_cpu_ns() -> u64 {
    // The calling thread's CPU clock always exists.
    read(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0)
}

/// CPU time used so far by process `pid` (any process may be read), in nanoseconds.
/// `None` once the process is gone.
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: writes one clockid into a local we own.
    if unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) } != 0 {
        return None;
    }
    read(clock).ok()
}

/// Sleeps `ns` on CLOCK_MONOTONIC, resuming after signals.
pub fn sleep_ns(ns: u64) {
    let mut request = libc::timespec {
        tv_sec: (ns / NS_PER_SEC) as libc::time_t,
        tv_nsec: (ns % NS_PER_SEC) as libc::c_long,
    };
    loop {
        let mut remaining = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: both pointers refer to valid timespecs that outlive the call.
        let rc =
            unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, 0, &request, &mut remaining) };
        if rc != libc::EINTR {
            return;
        }
        request = remaining;
    }
}

/// Busy-waits `ns` nanoseconds on the monotonic clock, keeping the CPU running (where
/// [`sleep_ns`] would let it idle, and a vCPU halt).
pub fn spin_ns(ns: u64) {
    let until = monotonic_ns().saturating_add(ns);
    while monotonic_ns() < until {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_advance() {
        let t = monotonic_ns();
        sleep_ns(2_000_000);
        assert!(monotonic_ns() >= t + 2_000_000);
        let cpu = own_process_cpu_ns();
        let spin = monotonic_ns();
        while monotonic_ns() - spin < 5_000_000 {
            std::hint::spin_loop();
        }
        assert!(own_process_cpu_ns() > cpu);
        assert!(process_cpu_ns(std::process::id()).is_some_and(|ns| ns > 0));
        // Above the largest pid_max (2^22), so no such process exists.
        assert_eq!(process_cpu_ns(4_194_305), None);
    }
}
