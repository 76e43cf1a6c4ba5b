//! The guest scheduler: a vCPU's life cycle (switch, run, idle policy, halt), its run queue
//! and slice, new-idle stealing and periodic load balancing.

use std::collections::VecDeque;

use super::accounting::{Acct, Counters, Overlap};
use super::ids::{ThreadId, VcpuId, VmId};
use super::sync::{ROp, TState};
use super::wake::{WakeeState, Waker};
use super::{Event, Sim, NO_KEY};
use crate::queue::Key;
use crate::scenario::GuestPolicy;
use crate::time::Ns;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Activity {
    /// Guest context switch (or wake path) into the thread.
    Switching(ThreadId),
    /// The thread runs its current op: a compute burst, or spinning on a spinlock.
    Running(ThreadId),
    Polling,
    Retaining,
    Idle,
}

/// What the guest's placement scans read of a vCPU: kept apart from [`Vcpu`] (272 bytes) in a
/// dense array that every change of `runq`, or of `act` between busy and not, updates
/// ([`Sim::sync_run_state`]), so a wake-up's scan of a 32-vCPU VM reads two cache lines
/// instead of 32. The scans of `select_vcpu` and `steal_thread` were a fifth of perf-1024's
/// run time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct RunState {
    /// Threads in the vCPU's run queue.
    pub(super) queued: u32,
    /// Switching into or running a thread; else idle (halted, polling or held).
    pub(super) busy: bool,
}

impl RunState {
    /// Idle with nothing queued: where a woken thread runs at once.
    pub(super) fn idle(self) -> bool {
        !self.busy && self.queued == 0
    }

    /// Threads queued or running: what the guest's balancing compares.
    pub(super) fn load(self) -> usize {
        self.queued as usize + usize::from(self.busy)
    }
}

pub(super) struct Vcpu {
    pub(super) vm: VmId,
    pub(super) act: Activity,
    /// Time left of a timed activity while it is not progressing.
    pub(super) remaining: Ns,
    /// When the timed activity ends, while it is progressing.
    pub(super) deadline: Ns,
    /// The key of the vCPU's one live timer event ([`super::NO_KEY`]: none); any other
    /// popped timer of this vCPU was superseded and is ignored.
    pub(super) timer_key: Key,
    pub(super) host_running: bool,
    pub(super) in_overhead: bool,
    pub(super) runq: VecDeque<ThreadId>,
    pub(super) acct: Acct,
    pub(super) acct_since: Ns,
    /// The counter that `acct`'s time also goes to, by the guest's activity when it was set.
    pub(super) acct_overlap: Overlap,
    pub(super) idle_since: Ns,
    /// The idle period (its `idle_since`) whose age at its first wake-up was recorded.
    pub(super) aged_idle_since: Option<Ns>,
    pub(super) poll_limit: Ns,
    /// Retention hold when the vCPU goes idle; None = halt (or poll).
    pub(super) retention: Option<Ns>,
    pub(super) ipi_pending: bool,
    pub(super) wake_pending: bool,
    /// VM exits taken by the guest code now running (IPI sends), added to its current
    /// activity: the guest sees them as time its instruction took.
    pub(super) exit_debt: Ns,
    /// The key of the live guest tick, as `timer_key`.
    pub(super) tick_key: Key,
    pub(super) tick_armed: bool,
    pub(super) c: Counters,
}

impl Sim {
    // ---- guest: vCPU life cycle ------------------------------------------------------------

    /// The vCPU starts executing guest code again (after a switch-in or a pause-loop exit).
    pub(super) fn guest_resume(&mut self, v: VcpuId) {
        match self.vcpus[v].act {
            Activity::Running(t) if self.threads[t].spinning => {
                let ROp::SpinLock(s) = self.current_op(t) else {
                    return self.resume_timer(v);
                };
                if self.spins[s].owner.is_none() {
                    self.acquire_spin(s, t);
                    self.thread_continue(t);
                } else {
                    self.resume_timer(v);
                }
            }
            Activity::Polling | Activity::Retaining | Activity::Idle => {
                let vc = &self.vcpus[v];
                if !vc.runq.is_empty() {
                    self.leave_idle(v, 0);
                } else if vc.act == Activity::Idle
                    || (vc.act == Activity::Retaining && vc.retention.is_none())
                {
                    self.vcpus[v].c.idle_entries += 1;
                    self.halt(v);
                } else {
                    self.resume_timer(v);
                }
            }
            _ => self.resume_timer(v),
        }
    }

    pub(super) fn activity_done(&mut self, v: VcpuId) {
        match self.vcpus[v].act {
            Activity::Switching(t) => {
                let th = &mut self.threads[t];
                if let Some((at, state, by)) = th.woken.take() {
                    // As the BPF sampler counts it: the waker's vCPU went idle (or to a
                    // retention hold) after the waking, so the waker waited for this wake-up;
                    // or no thread woke it (a timer on its halted vCPU), and nobody runs on
                    // while it waits.
                    let waited = by.is_none_or(|u| u == v || self.vcpus[u].idle_since >= at);
                    let vm = &mut self.vms[th.vm];
                    let latency = self.now - at;
                    vm.latency.record(latency);
                    match state {
                        WakeeState::Running => vm.period_wake.running.record(latency),
                        WakeeState::Polling => vm.period_wake.polling.record(latency),
                        WakeeState::Halted => {
                            vm.period_wake.halted.record(latency);
                            vm.period_wake.halted_waited += u64::from(waited);
                            vm.period_wake.halted_hand_offs +=
                                u64::from(waited && by.is_some_and(|u| u != v));
                        }
                    }
                }
                // Busy before and after: the run state does not change.
                self.vcpus[v].act = Activity::Running(t);
                self.thread_continue(t);
            }
            Activity::Running(t) => {
                if self.threads[t].spinning {
                    self.pause_loop_exit(v, t);
                } else {
                    let th = &mut self.threads[t];
                    th.burst_left = 0;
                    th.op += 1;
                    self.vms[th.vm].work_done_ns += std::mem::take(&mut th.burst_total);
                    self.thread_continue(t);
                }
            }
            Activity::Polling => self.halt(v),
            Activity::Retaining => {
                self.vcpus[v].c.idle_entries += 1;
                self.halt(v);
            }
            Activity::Idle => {}
        }
    }

    pub(super) fn halt(&mut self, v: VcpuId) {
        self.set_act(v, Activity::Idle, 0);
        let vc = &mut self.vcpus[v];
        // A pending ICR-write exit only delays the halt; it is not carried into the next run.
        vc.exit_debt = 0;
        vc.c.halts += 1;
        vc.host_running = false;
        vc.in_overhead = false;
        vc.timer_key = NO_KEY;
        self.host.block(v.0, self.now);
        self.refresh_acct(v);
        self.apply_host_effects();
    }

    /// The vCPU's guest has nothing to run.
    pub(super) fn go_idle(&mut self, v: VcpuId) {
        let policy = self.vms[self.vcpus[v].vm].policy;
        self.vcpus[v].idle_since = self.now;
        if !self.executing(v) {
            // Only when a deactivation empties a descheduled vCPU: it halts when it next runs.
            return self.set_act(v, Activity::Idle, 0);
        }
        let vc = &mut self.vcpus[v];
        if let Some(hold) = vc.retention {
            // Held by polling (PM QoS), a vCPU polls until work comes or the policy lifts
            // the hold at a period's end: no hold outlasts a period.
            let hold = if self.g.retention_polls {
                self.g.policy_period
            } else {
                hold
            };
            self.set_act(v, Activity::Retaining, hold);
        } else if policy == GuestPolicy::Haltpoll && vc.poll_limit > 0 {
            vc.c.idle_entries += 1;
            let limit = vc.poll_limit;
            self.set_act(v, Activity::Polling, limit);
        } else {
            vc.c.idle_entries += 1;
            self.halt(v);
        }
    }

    /// Work arrived for an idle vCPU that is executing: end the idle period and switch.
    pub(super) fn leave_idle(&mut self, v: VcpuId, extra: Ns) {
        let now = self.now;
        let g_max = self.g.poll_max;
        let (grow_start, grow, shrink) =
            (self.g.poll_grow_start, self.g.poll_grow, self.g.poll_shrink);
        let policy = self.vms[self.vcpus[v].vm].policy;
        let vc = &mut self.vcpus[v];
        if vc.act == Activity::Retaining {
            vc.c.yield_preemptions += 1;
        } else {
            vc.c.idle_exits += 1;
        }
        if policy == GuestPolicy::Haltpoll {
            // cpuidle-haltpoll's adjust_poll_limit().
            let block = now - vc.idle_since;
            if block > vc.poll_limit && block <= g_max {
                vc.poll_limit = (vc.poll_limit * grow).max(grow_start).min(g_max);
            } else if block > g_max {
                vc.poll_limit = vc.poll_limit.checked_div(shrink).unwrap_or(0);
            }
        }
        self.dispatch(v, extra);
    }

    /// The vCPU's current thread left (blocked, finished, preempted): run the next one.
    pub(super) fn dispatch(&mut self, v: VcpuId, extra: Ns) {
        let next = match self.runq_pop(v) {
            Some(t) => Some(t),
            None => self.steal_thread(v),
        };
        match next {
            Some(t) => self.switch_to(v, t, extra + self.costs.guest_switch),
            None => self.go_idle(v),
        }
    }

    pub(super) fn switch_to(&mut self, v: VcpuId, t: ThreadId, cost: Ns) {
        let th = &mut self.threads[t];
        th.state = TState::OnCpu;
        th.vcpu = v;
        self.set_act(v, Activity::Switching(t), cost);
        if !self.vcpus[v].runq.is_empty() {
            self.arm_guest_tick(v);
        }
    }

    /// New-idle balancing in the guest: take a queued thread from the busiest active sibling.
    pub(super) fn steal_thread(&mut self, v: VcpuId) -> Option<ThreadId> {
        let vm = &self.vms[self.vcpus[v].vm];
        if !vm.is_active(v) {
            return None;
        }
        // Linux's idle_balance() moves only tasks that wait behind another (the busiest queue
        // needs nr_running >= 2): a thread just woken onto a halted vCPU is that vCPU's only
        // task and stays there until the vCPU runs. Stealing it would hide BWW.
        // The first of the longest queues among the vCPUs where a thread waits behind another.
        let mut best: Option<(u32, VcpuId)> = None;
        for u in vm.stealable.iter().map(|i| vm.base.offset(i as u32)) {
            let len = self.run_state(u).queued;
            if u != v && best.is_none_or(|(l, _)| len > l) {
                best = Some((len, u));
            }
        }
        let (_, u) = best?;
        let pos = self.vcpus[u]
            .runq
            .iter()
            .rposition(|&t| self.threads[t].pin.is_none())?;
        self.runq_remove(u, pos)
    }

    /// The run state the scans read, checked against the vCPU itself in debug builds (the
    /// tests): a change of `act` or `runq` that skipped [`Sim::sync_run_state`] fails there.
    pub(super) fn run_state(&self, v: VcpuId) -> RunState {
        let rs = self.run_state[v];
        debug_assert_eq!(rs, self.run_state_of(v), "{v:?}'s run state is stale");
        debug_assert!(
            {
                let vm = &self.vms[self.vcpus[v].vm];
                let i = v.local(vm.base);
                vm.idle.contains(i) == rs.idle()
                    && vm.load_one.contains(i) == (rs.load() == 1)
                    && vm.stealable.contains(i) == (rs.queued > 0 && rs.load() >= 2)
            },
            "{v:?}'s place in its VM's sets is stale"
        );
        rs
    }

    fn run_state_of(&self, v: VcpuId) -> RunState {
        let vc = &self.vcpus[v];
        RunState {
            queued: vc.runq.len() as u32,
            busy: Self::busy(vc.act),
        }
    }

    /// Call after every change of vCPU `v`'s `runq`, or of its `act` between busy and not.
    pub(super) fn sync_run_state(&mut self, v: VcpuId) {
        let new = self.run_state_of(v);
        if std::mem::replace(&mut self.run_state[v], new) != new {
            let vm = &mut self.vms[self.vcpus[v].vm];
            let i = v.local(vm.base);
            vm.idle.set(i, new.idle());
            vm.load_one.set(i, new.load() == 1);
            vm.stealable.set(i, new.queued > 0 && new.load() >= 2);
        }
    }

    pub(super) fn runq_push(&mut self, v: VcpuId, t: ThreadId) {
        self.vcpus[v].runq.push_back(t);
        self.sync_run_state(v);
    }

    pub(super) fn runq_pop(&mut self, v: VcpuId) -> Option<ThreadId> {
        let t = self.vcpus[v].runq.pop_front();
        self.sync_run_state(v);
        t
    }

    fn runq_remove(&mut self, v: VcpuId, pos: usize) -> Option<ThreadId> {
        let t = self.vcpus[v].runq.remove(pos);
        self.sync_run_state(v);
        t
    }

    pub(super) fn arm_guest_tick(&mut self, v: VcpuId) {
        let vc = &mut self.vcpus[v];
        if vc.tick_armed {
            return;
        }
        vc.tick_armed = true;
        let key = self.q.key_at(self.now + self.g.slice);
        vc.tick_key = key;
        self.q.push_key(key, Event::GuestTick { vcpu: v });
    }

    pub(super) fn guest_tick(&mut self, v: VcpuId) {
        self.vcpus[v].tick_armed = false;
        if self.vcpus[v].runq.is_empty() {
            return;
        }
        if !self.executing(v) {
            return self.arm_guest_tick(v);
        }
        match self.vcpus[v].act {
            Activity::Running(t) if self.threads[t].spin_held == 0 => {
                self.preempt_thread(v, t);
                self.runq_push(v, t);
                self.dispatch(v, 0);
            }
            _ => self.arm_guest_tick(v),
        }
    }

    /// Take the running thread `t` off vCPU `v` (it becomes Ready; the caller queues it).
    pub(super) fn preempt_thread(&mut self, v: VcpuId, t: ThreadId) {
        let left = self.remaining_now(v);
        let th = &mut self.threads[t];
        if let Activity::Running(_) = self.vcpus[v].act {
            if th.spinning {
                // The spinner gives up its place and retries the lock when it runs again.
                th.spinning = false;
                if let ROp::SpinLock(s) = self.programs[th.prog][th.op as usize] {
                    self.spins[s].spinners.retain(|&x| x != t);
                }
            } else {
                th.burst_left = left;
            }
        }
        th.state = TState::Ready;
        let vm = th.vm;
        self.vms[vm].thread_switches += 1;
        self.set_act(v, Activity::Idle, 0);
    }

    pub(super) fn enqueue_ready(&mut self, t: ThreadId, v: VcpuId) {
        let th = &mut self.threads[t];
        th.state = TState::Ready;
        th.vcpu = v;
        self.runq_push(v, t);
    }

    // ---- guest: balancing and policy -------------------------------------------------------

    /// Periodic guest load balancing: move queued threads from the most to the least loaded
    /// active vCPU while they differ by two or more.
    pub(super) fn guest_balance(&mut self, vm_id: VmId) {
        let n = self.vms[vm_id].n;
        for _ in 0..n {
            let load = |s: &Sim, u: VcpuId| s.run_state(u).load();
            let vm = &self.vms[vm_id];
            let active: Vec<VcpuId> = vm.vcpu_ids().filter(|&u| vm.is_active(u)).collect();
            let Some(&busiest) = active
                .iter()
                .max_by_key(|&&u| (load(self, u), std::cmp::Reverse(u)))
            else {
                return;
            };
            let Some(&idlest) = active.iter().min_by_key(|&&u| (load(self, u), u)) else {
                return;
            };
            if load(self, busiest) < load(self, idlest) + 2 {
                return;
            }
            let Some(pos) = self.vcpus[busiest]
                .runq
                .iter()
                .rposition(|&t| self.allowed_on(t, idlest))
            else {
                return;
            };
            let Some(t) = self.runq_remove(busiest, pos) else {
                return;
            };
            self.threads[t].vcpu = idlest;
            self.runq_push(idlest, t);
            self.kick(idlest, Waker::Nobody);
        }
    }
}
