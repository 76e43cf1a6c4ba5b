//! Private futex wait and wake: the blocking primitive under every contended mutex, used
//! directly where a measurement must block for real (no spinning, no std wrapper).

use std::io;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// `FUTEX_WAIT` while `*word == expected`, for at most `timeout` (`None`: no limit).
///
/// Returns `Ok` on a wake and also on the early returns a caller must expect anyway (the
/// word had already changed, a signal, the timeout): callers re-check the word in a loop.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> io::Result<()> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned u32 for the duration of the call; `ts_ptr` is null or
    // points to a relative timespec on this stack frame; FUTEX_WAIT ignores the rest.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            ts_ptr,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::EINTR | libc::ETIMEDOUT) => Ok(()),
        _ => Err(e),
    }
}

/// `FUTEX_WAKE` of up to `count` waiters on `word`; returns how many were woken.
pub fn wake(word: &AtomicU32, count: u32) -> io::Result<usize> {
    let count = count.min(i32::MAX as u32) as i32;
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE only uses its address and the count.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            count,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    #[test]
    fn wait_returns_at_once_on_a_changed_word_and_after_a_timeout() {
        let w = AtomicU32::new(1);
        wait(&w, 0, None).unwrap(); // EAGAIN: the word is not 0
        let t = Instant::now();
        wait(&w, 1, Some(Duration::from_millis(20))).unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(15),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(wake(&w, 1).unwrap(), 0, "nobody waits");
    }

    #[test]
    fn wake_releases_a_waiter() {
        let w = AtomicU32::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                while w.load(Ordering::Acquire) == 0 {
                    wait(&w, 0, Some(Duration::from_secs(5))).unwrap();
                }
            });
            std::thread::sleep(Duration::from_millis(10));
            w.store(1, Ordering::Release);
            wake(&w, u32::MAX).unwrap();
        });
    }
}
