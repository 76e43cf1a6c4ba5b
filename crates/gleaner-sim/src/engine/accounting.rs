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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Acct {
    Work,
    Yield,
    Idle,
    Steal,
    Overhead,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Counters {
    pub(super) work_ns: Ns,
    pub(super) yield_ns: Ns,
    pub(super) idle_ns: Ns,
    pub(super) steal_ns: Ns,
    pub(super) overhead_ns: Ns,
    pub(super) yield_preemptions: u64,
    pub(super) idle_entries: u64,
    pub(super) halts: u64,
    pub(super) ipis: u64,
    pub(super) ple_exits: u64,
    /// Steal and switch-in overhead while the guest sits in HLT (kicked, waiting for or
    /// entering a pCPU). The guest's own idle clock (`/proc/timer_list` idle_sleeptime, which
    /// gleaner-linux reads) runs from HLT until the guest resumes, so Gleaner's sample counts
    /// this as idle time too (and the host's run delay also as steal, as `/proc/stat` does).
    pub(super) halt_wait_ns: Ns,
    /// Switch-in overhead (host switch, cache refill) while a workload thread is current:
    /// the guest cannot see it apart from the thread's own run time.
    pub(super) overhead_busy_ns: Ns,
}

impl Sim {
    pub(super) fn executing(&self, v: VcpuId) -> bool {
        let vc = &self.vcpus[v];
        vc.host_running && !vc.in_overhead
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
        vc.act = act;
        vc.remaining = remaining;
        if Self::timed(act) {
            vc.remaining = vc
                .remaining
                .saturating_add(std::mem::take(&mut vc.exit_debt));
        }
        self.sync_run_state(v);
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
        let state = {
            let vc = &self.vcpus[v];
            if !vc.host_running {
                match self.host.vcpus[v.index()].state {
                    VState::Halted => Acct::Idle,
                    _ => Acct::Steal,
                }
            } else if vc.in_overhead {
                Acct::Overhead
            } else {
                match vc.act {
                    Activity::Switching(_) | Activity::Running(_) => Acct::Work,
                    Activity::Retaining => Acct::Yield,
                    Activity::Polling | Activity::Idle => Acct::Idle,
                }
            }
        };
        let now = self.now;
        let vc = &mut self.vcpus[v];
        let spent = now - vc.acct_since;
        match vc.acct {
            Acct::Work => vc.c.work_ns += spent,
            Acct::Yield => vc.c.yield_ns += spent,
            Acct::Idle => vc.c.idle_ns += spent,
            Acct::Steal => vc.c.steal_ns += spent,
            Acct::Overhead => vc.c.overhead_ns += spent,
        }
        match (vc.acct, vc.acct_guest) {
            (Acct::Steal | Acct::Overhead, 0) => vc.c.halt_wait_ns += spent,
            (Acct::Overhead, 1) => vc.c.overhead_busy_ns += spent,
            _ => {}
        }
        vc.acct = state;
        vc.acct_guest = match vc.act {
            Activity::Polling | Activity::Idle => 0,
            Activity::Switching(_) | Activity::Running(_) => 1,
            Activity::Retaining => 2,
        };
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
