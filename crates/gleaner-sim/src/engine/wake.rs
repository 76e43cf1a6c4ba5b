//! Wake-ups: where the guest places a woken thread, and how the wake travels to that vCPU
//! (queued behind a busy one, noticed by a poller, an IPI to a held one, or an IPI and a host
//! kick to a halted one).

use super::guest::Activity;
use super::ids::{ThreadId, VcpuId};
use super::Event;
use super::Sim;
use crate::host::VState;

/// What a woken thread's target vCPU was doing at the wake-up (the split of
/// `PeriodSample::wake_latency`): busy or the waker's own, idle in a polling state (haltpoll,
/// a retention hold), or idle in HLT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WakeeState {
    Running,
    Polling,
    Halted,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Waker {
    /// A thread running on this vCPU (the unlock, push or barrier arrival that wakes).
    Thread(VcpuId),
    /// A timer on this vCPU (the sleeping thread's own).
    Timer(VcpuId),
    /// Placement by the policy or a balancer, from no particular vCPU.
    Nobody,
}

impl Sim {
    // ---- guest: wakeups --------------------------------------------------------------------

    pub(super) fn allowed_on(&self, t: ThreadId, u: VcpuId) -> bool {
        let th = &self.threads[t];
        match th.pin {
            Some(p) => p == u,
            None => self.vms[th.vm].is_active(u),
        }
    }

    pub(super) fn vcpu_idle(&self, u: VcpuId) -> bool {
        self.run_state(u).idle()
    }

    /// Guest wakeup placement: the previous vCPU if idle, else any idle vCPU, else the least
    /// loaded one. Idle includes halted: the guest cannot tell, which is the BWW problem.
    pub(super) fn select_vcpu(&self, t: ThreadId, waker: Waker) -> VcpuId {
        // A timer fires on the vCPU the thread slept on; try_to_wake_up then runs the usual
        // placement (select_idle_sibling), so the timer's vCPU is taken only if it is idle.
        // Queueing the thread behind a busy (possibly host-preempted) vCPU while others sit
        // idle would be an artefact Linux does not have.
        if let Waker::Timer(u) = waker {
            if self.allowed_on(t, u) && self.vcpu_idle(u) {
                return u;
            }
        }
        let th = &self.threads[t];
        let vm = &self.vms[th.vm];
        let prev = th.vcpu;
        // `allowed_on` with the thread and its VM looked up once: this runs at every wakeup.
        let allowed = |u: VcpuId| match th.pin {
            Some(p) => p == u,
            None => vm.is_active(u),
        };
        if allowed(prev) && self.vcpu_idle(prev) {
            return prev;
        }
        let local = prev.local(vm.base);
        if th.pin.is_none() {
            // The walk below, from the VM's sets: the first active idle vCPU after prev (prev
            // itself is not one), else, none being idle, the first from prev with the least
            // load there can be, one thread.
            let next = if local + 1 == vm.n as usize {
                0
            } else {
                local + 1
            };
            if let Some(i) = vm
                .idle
                .first_common_from(&vm.active, next)
                .or_else(|| vm.load_one.first_common_from(&vm.active, local))
            {
                return vm.base.offset(i as u32);
            }
        }
        // (prev + i) % n without a division (both terms < n).
        let at = |i: u32| {
            let j = local as u32 + i;
            vm.base.offset(if j >= vm.n { j - vm.n } else { j })
        };
        if let Some(u) = (1..vm.n).map(at).find(|&u| allowed(u) && self.vcpu_idle(u)) {
            return u;
        }
        (0..vm.n)
            .map(at)
            .filter(|&u| allowed(u))
            .min_by_key(|&u| self.run_state(u).load())
            .unwrap_or(prev)
    }

    pub(super) fn wake_thread(&mut self, t: ThreadId, waker: Waker) {
        let v = self.select_vcpu(t, waker);
        let state = match (self.vcpus[v].act, waker) {
            // A thread waking another onto its own vCPU: that vCPU is running (the waker).
            // A timer is not like that: it fires on a halted vCPU too, which the host kicks.
            (_, Waker::Thread(u)) if u == v => WakeeState::Running,
            (Activity::Switching(_) | Activity::Running(_), _) => WakeeState::Running,
            (Activity::Polling | Activity::Retaining, _) => WakeeState::Polling,
            (Activity::Idle, _) => WakeeState::Halted,
        };
        let by = match waker {
            Waker::Thread(u) => Some(u),
            Waker::Timer(_) | Waker::Nobody => None,
        };
        // The first wake-up into an idle period ends it; others queue behind it.
        if state != WakeeState::Running
            && self.vcpus[v].aged_idle_since != Some(self.vcpus[v].idle_since)
        {
            let since = self.vcpus[v].idle_since;
            self.vcpus[v].aged_idle_since = Some(since);
            self.vms[self.vcpus[v].vm]
                .period_wake
                .idle_age
                .record(self.now - since);
        }
        self.threads[t].woken = Some((self.now, state, by));
        self.enqueue_ready(t, v);
        self.kick(v, waker);
    }

    /// Make vCPU `v` notice the thread just queued on it.
    pub(super) fn kick(&mut self, v: VcpuId, waker: Waker) {
        match self.vcpus[v].act {
            Activity::Switching(_) | Activity::Running(_) => self.arm_guest_tick(v),
            Activity::Polling => {
                if self.executing(v) {
                    self.pause(v);
                    let extra = self.costs.poll_wake;
                    self.leave_idle(v, extra);
                }
            }
            // A vCPU held by in-kernel polling sees the queued thread by itself, no IPI.
            Activity::Retaining if self.g.retention_polls => {
                if self.executing(v) {
                    self.pause(v);
                    let extra = self.costs.poll_wake;
                    self.leave_idle(v, extra);
                }
            }
            Activity::Retaining => match waker {
                // The vCPU's own timer interrupts the yielding thread locally.
                Waker::Timer(u) if u == v => {
                    if self.executing(v) {
                        self.pause(v);
                        self.leave_idle(v, 0);
                    }
                }
                _ => self.send_ipi(v, waker),
            },
            Activity::Idle => {
                if self.host.vcpus[v.index()].state != VState::Halted {
                    return;
                }
                match waker {
                    // The vCPU's own timer: the host's hrtimer kicks it, no IPI.
                    Waker::Timer(u) if u == v => self.host_kick(v),
                    _ => self.send_ipi(v, waker),
                }
            }
        }
    }

    pub(super) fn send_ipi(&mut self, v: VcpuId, from: Waker) {
        if self.vcpus[v].ipi_pending {
            return;
        }
        if let Waker::Thread(sender) = from {
            // Writing the APIC ICR exits to the VMM on the sender.
            self.vcpus[sender].exit_debt += self.costs.ipi_send;
        }
        let vc = &mut self.vcpus[v];
        vc.ipi_pending = true;
        vc.c.ipis += 1;
        // A fixed delay after now: a FIFO lane of the queue.
        self.q
            .push_delayed(self.now, self.costs.ipi, Event::IpiArrive { vcpu: v });
    }

    pub(super) fn host_kick(&mut self, v: VcpuId) {
        let vc = &mut self.vcpus[v];
        if vc.wake_pending {
            return;
        }
        vc.wake_pending = true;
        self.q
            .push_delayed(self.now, self.costs.halt_wake, Event::HostWake { vcpu: v });
    }

    pub(super) fn ipi_arrive(&mut self, v: VcpuId) {
        self.vcpus[v].ipi_pending = false;
        if self.host.vcpus[v.index()].state == VState::Halted {
            return self.host_kick(v);
        }
        let vc = &self.vcpus[v];
        if self.executing(v)
            && matches!(vc.act, Activity::Retaining | Activity::Polling)
            && !vc.runq.is_empty()
        {
            self.pause(v);
            self.leave_idle(v, 0);
        }
        // Otherwise the vCPU is busy (the thread waits its turn) or not executing (the
        // interrupt is taken when it next enters the guest: see guest_resume).
    }
}
