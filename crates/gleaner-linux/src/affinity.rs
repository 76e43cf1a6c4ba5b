//! The two thread-affinity system calls behind a trait, for the placement back ends and for
//! `restore`.
//!
//! Exists so that the code that confines threads (the affinity and cgroup v1 back ends) and
//! the code that gives their masks back after a crash (`restore`) call them one way, and so
//! that their tests can run against fake threads; it sits below both. Errors name the thread
//! and the call.

use gleaner_policy::Cpuset;
use nix::errno::Errno;

use crate::error::{Error, Result};

/// The two affinity syscalls, behind a trait so tests can run against fake threads.
pub trait AffinityOps: Send + Sync {
    /// The thread's mask; `None` if the thread no longer exists.
    fn get(&self, tid: u32) -> Result<Option<Cpuset>>;
    /// Sets the thread's mask; `false` if the thread no longer exists.
    fn set(&self, tid: u32, cpus: &Cpuset) -> Result<bool>;
}

/// The real `sched_getaffinity` / `sched_setaffinity`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SchedAffinity;

impl AffinityOps for SchedAffinity {
    fn get(&self, tid: u32) -> Result<Option<Cpuset>> {
        match gleaner_sys::affinity::thread_affinity(raw_tid(tid)) {
            Ok(set) => Ok(Some(set)),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(None),
            Err(e) => Err(affinity_error(tid, "sched_getaffinity", &e)),
        }
    }

    fn set(&self, tid: u32, cpus: &Cpuset) -> Result<bool> {
        match gleaner_sys::affinity::set_thread_affinity(raw_tid(tid), cpus) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
            Err(e) => Err(affinity_error(tid, "sched_setaffinity", &e)),
        }
    }
}

fn raw_tid(tid: u32) -> libc::pid_t {
    libc::pid_t::try_from(tid).unwrap_or(libc::pid_t::MAX)
}

fn affinity_error(tid: u32, op: &'static str, e: &std::io::Error) -> Error {
    Error::Affinity {
        tid,
        op,
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_syscalls_on_this_thread_round_trip() {
        // Reads and rewrites our own mask unchanged: exercises the mask conversion both ways.
        let me = gleaner_sys::sched::gettid() as u32;
        let mask = SchedAffinity.get(me).unwrap().unwrap();
        assert!(!mask.is_empty());
        assert!(SchedAffinity.set(me, &mask).unwrap());
        assert_eq!(SchedAffinity.get(me).unwrap().unwrap(), mask);
        assert_eq!(
            SchedAffinity.get(i32::MAX as u32).unwrap(),
            None,
            "no such thread"
        );
    }
}
