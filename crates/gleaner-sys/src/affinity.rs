//! CPU affinity of threads (`sched_getaffinity`/`sched_setaffinity`).
//!
//! Masks are sized to the CPU ids involved rather than to glibc's fixed 1024-bit
//! `cpu_set_t`, so CPU ids up to `gleaner_policy::cpuset::MAX_CPU` work everywhere.

use std::io;

use gleaner_policy::Cpuset;

const WORD_BITS: usize = 8 * std::mem::size_of::<libc::c_ulong>();
/// Words for every CPU id a [`Cpuset`] can hold (8192 CPUs).
const MAX_WORDS: usize = (gleaner_policy::cpuset::MAX_CPU + 1).div_ceil(WORD_BITS);

/// A kernel CPU mask built ahead of time, so that applying it allocates nothing (safe
/// between `fork` and `exec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuMask {
    words: Vec<libc::c_ulong>,
}

impl CpuMask {
    pub fn new(cpus: &Cpuset) -> Self {
        // At least 1024 bits: the kernel rejects masks shorter than its own nr_cpu_ids.
        let words = (cpus.last().unwrap_or(0) / WORD_BITS + 1).max(1024 / WORD_BITS);
        let mut mask = vec![0 as libc::c_ulong; words];
        for cpu in cpus.iter() {
            mask[cpu / WORD_BITS] |= 1 << (cpu % WORD_BITS);
        }
        Self { words: mask }
    }

    /// Sets the mask of thread `tid` (0: the calling thread). Allocates nothing.
    pub fn apply(&self, tid: libc::pid_t) -> io::Result<()> {
        // SAFETY: the pointer and byte length describe `self.words`, which outlives the call.
        let rc = unsafe {
            libc::sched_setaffinity(
                tid,
                self.words.len() * std::mem::size_of::<libc::c_ulong>(),
                self.words.as_ptr() as *const libc::cpu_set_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Sets the CPU mask of thread `tid` (0: the calling thread).
pub fn set_thread_affinity(tid: libc::pid_t, cpus: &Cpuset) -> io::Result<()> {
    CpuMask::new(cpus).apply(tid)
}

/// Sets the calling thread's CPU mask.
pub fn set_current_thread_affinity(cpus: &Cpuset) -> io::Result<()> {
    set_thread_affinity(0, cpus)
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    set_current_thread_affinity(&[cpu].into_iter().collect())
}

/// CPUs thread `tid` (0: the calling thread) may run on. `ESRCH` when it does not exist.
pub fn thread_affinity(tid: libc::pid_t) -> io::Result<Cpuset> {
    let mut mask = vec![0 as libc::c_ulong; MAX_WORDS];
    // SAFETY: the pointer and byte length describe `mask`, which outlives the call.
    let rc = unsafe {
        libc::sched_getaffinity(
            tid,
            mask.len() * std::mem::size_of::<libc::c_ulong>(),
            mask.as_mut_ptr() as *mut libc::cpu_set_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..mask.len() * WORD_BITS)
        .filter(|&cpu| mask[cpu / WORD_BITS] & (1 << (cpu % WORD_BITS)) != 0)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_and_read_back_on_a_scratch_thread() {
        std::thread::spawn(|| {
            let all = thread_affinity(0).unwrap();
            assert!(!all.is_empty());
            let first = all.first().unwrap();
            pin_current_thread(first).unwrap();
            assert_eq!(thread_affinity(0).unwrap(), [first].into_iter().collect());
            set_current_thread_affinity(&all).unwrap();
            assert_eq!(thread_affinity(0).unwrap(), all);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn errors_name_the_cause() {
        let offline: Cpuset = [gleaner_policy::cpuset::MAX_CPU].into_iter().collect();
        assert_eq!(
            std::thread::spawn(move || set_current_thread_affinity(&offline)
                .unwrap_err()
                .raw_os_error())
            .join()
            .unwrap(),
            Some(libc::EINVAL)
        );
        // No thread has id i32::MAX on any Linux (pid_max is at most 2^22).
        assert_eq!(
            thread_affinity(i32::MAX).unwrap_err().raw_os_error(),
            Some(libc::ESRCH)
        );
    }

    #[test]
    fn masks_cover_high_cpu_ids() {
        let high: Cpuset = [3, 4000].into_iter().collect();
        let m = CpuMask::new(&high);
        assert_eq!(m.words.len(), 4000 / WORD_BITS + 1);
        assert_eq!(m.words[4000 / WORD_BITS], 1 << (4000 % WORD_BITS));
        assert_eq!(CpuMask::new(&Cpuset::new()).words.len(), 1024 / WORD_BITS);
    }
}
