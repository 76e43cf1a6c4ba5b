//! Time accounting: which counter a vCPU's time goes to, and the timed activity it is doing.
//!
//! A state machine per vCPU ([`Acct`]): every state change charges the time since the last
//! change to the state being left, so the counters are exact to the nanosecond. They feed both
//! the report and Gleaner's `PeriodSample`. Timed activities keep their remaining time while
//! the vCPU is descheduled, so a host preemption stretches them as it does on hardware.

use super::guest::Activity;
use super::ids::VcpuId;
use super::{Event, Sim, NO_KEY};
use crate::host::VState;
use crate::time::Ns;

/// A vCPU's accounting state; its discriminant is its counter's index in
/// [`Counters::time_ns`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Acct {
    Work,
    Yield,
    Idle,
    Steal,
    Overhead,
}

/// The counter that also takes the time of an accounting state, by what the guest was doing
/// when the state began (see [`Counters::halt_wait_ns`] and [`Counters::overhead_busy_ns`]);
/// its discriminant is its index in [`Counters::time_ns`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Overlap {
    HaltWait = 5,
    OverheadBusy = 6,
    /// No second counter: a slot of [`Counters::time_ns`] that nothing reads.
    Nothing = 7,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Counters {
    /// Time by [`Acct`], then by [`Overlap`]: each state change adds the time spent to two
    /// slots, with no branch on which.
    time_ns: [Ns; 8],
    pub(super) yield_preemptions: u64,
    pub(super) idle_entries: u64,
    pub(super) halts: u64,
    /// Idle periods (halted or polling, not retention holds) that ended in a switch to a
    /// woken thread: each spent `Costs::idle_exit_path` of that switch on the kernel's
    /// path out of idle.
    pub(super) idle_exits: u64,
    pub(super) ipis: u64,
    pub(super) ple_exits: u64,
}

impl Counters {
    pub(super) fn work_ns(&self) -> Ns {
        self.time_ns[Acct::Work as usize]
    }

    pub(super) fn yield_ns(&self) -> Ns {
        self.time_ns[Acct::Yield as usize]
    }

    pub(super) fn idle_ns(&self) -> Ns {
        self.time_ns[Acct::Idle as usize]
    }

    pub(super) fn steal_ns(&self) -> Ns {
        self.time_ns[Acct::Steal as usize]
    }

    pub(super) fn overhead_ns(&self) -> Ns {
        self.time_ns[Acct::Overhead as usize]
    }

    /// Steal and switch-in overhead while the guest sits in HLT (kicked, waiting for or
    /// entering a pCPU). The guest's own idle clock (`/proc/timer_list` idle_sleeptime, which
    /// gleaner-linux reads) runs from HLT until the guest resumes, so Gleaner's sample counts
    /// this as idle time too (and the host's run delay also as steal, as `/proc/stat` does).
    pub(super) fn halt_wait_ns(&self) -> Ns {
        self.time_ns[Overlap::HaltWait as usize]
    }

    /// Switch-in overhead (host switch, cache refill) while a workload thread is current:
    /// the guest cannot see it apart from the thread's own run time.
    pub(super) fn overhead_busy_ns(&self) -> Ns {
        self.time_ns[Overlap::OverheadBusy as usize]
    }
}

impl Sim {
    pub(super) fn executing(&self, v: VcpuId) -> bool {
        let vc = &self.vcpus[v];
        vc.host_running && !vc.in_overhead
    }

    /// Switching into or running a thread ([`super::guest::RunState::busy`]).
    pub(super) fn busy(act: Activity) -> bool {
        matches!(act, Activity::Switching(_) | Activity::Running(_))
    }

    pub(super) fn timed(act: Activity) -> bool {
        !matches!(act, Activity::Idle)
    }

    /// Stop the progress of the current timed activity, keeping what is left of it.
    pub(super) fn pause(&mut self, v: VcpuId) {
        if !self.executing(v) {
            return;
        }
        let now = self.now;
        let vc = &mut self.vcpus[v];
        if Self::timed(vc.act) {
            vc.remaining = vc.deadline.saturating_sub(now);
            vc.timer_key = NO_KEY;
        }
    }

    /// Let the current timed activity progress from now.
    pub(super) fn resume_timer(&mut self, v: VcpuId) {
        if !self.executing(v) {
            return;
        }
        let now = self.now;
        let vc = &mut self.vcpus[v];
        if Self::timed(vc.act) {
            vc.deadline = now.saturating_add(vc.remaining);
            let key = self.q.key_at(vc.deadline);
            vc.timer_key = key;
            self.q.push_key(key, Event::VcpuTimer { vcpu: v });
        }
    }

    pub(super) fn set_act(&mut self, v: VcpuId, act: Activity, remaining: Ns) {
        self.pause(v);
        let vc = &mut self.vcpus[v];
        let was_busy = Self::busy(vc.act);
        vc.act = act;
        vc.remaining = remaining;
        if Self::timed(act) {
            vc.remaining = vc
                .remaining
                .saturating_add(std::mem::take(&mut vc.exit_debt));
        }
        // The run state reads of the activity only whether it is busy (half the calls here
        // keep that, switching into a thread and then running it, say).
        if Self::busy(act) != was_busy {
            self.sync_run_state(v);
        }
        self.resume_timer(v);
        self.refresh_acct(v);
    }

    /// Time left of the current timed activity as of now.
    pub(super) fn remaining_now(&self, v: VcpuId) -> Ns {
        let vc = &self.vcpus[v];
        if self.executing(v) {
            vc.deadline.saturating_sub(self.now)
        } else {
            vc.remaining
        }
    }

    pub(super) fn refresh_acct(&mut self, v: VcpuId) {
        let vc = &self.vcpus[v];
        // The guest's activity: idle (HLT or polling), a workload thread, or a retention hold.
        let (busy_state, guest_idle, guest_thread) = match vc.act {
            Activity::Switching(_) | Activity::Running(_) => (Acct::Work, false, true),
            Activity::Retaining => (Acct::Yield, false, false),
            Activity::Polling | Activity::Idle => (Acct::Idle, true, false),
        };
        let state = if !vc.host_running {
            match self.host.vcpus[v.index()].state {
                VState::Halted => Acct::Idle,
                _ => Acct::Steal,
            }
        } else if vc.in_overhead {
            Acct::Overhead
        } else {
            busy_state
        };
        let overlap = match state {
            Acct::Steal | Acct::Overhead if guest_idle => Overlap::HaltWait,
            Acct::Overhead if guest_thread => Overlap::OverheadBusy,
            _ => Overlap::Nothing,
        };
        let now = self.now;
        let vc = &mut self.vcpus[v];
        let spent = now - vc.acct_since;
        vc.c.time_ns[vc.acct as usize] += spent;
        vc.c.time_ns[vc.acct_overlap as usize] += spent;
        vc.acct = state;
        vc.acct_overlap = overlap;
        vc.acct_since = now;
    }

    pub(super) fn vcpu_timer(&mut self, v: VcpuId) {
        if self.vcpus[v].in_overhead {
            self.vcpus[v].in_overhead = false;
            self.refresh_acct(v);
            self.guest_resume(v);
        } else {
            self.activity_done(v);
        }
    }
}
