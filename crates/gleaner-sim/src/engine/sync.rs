//! Threads and the synchronization objects they meet: mutexes (barging and hand-off),
//! bounded queues, barriers and spinlocks (with pause-loop exits). A thread's program runs here
//! until it computes, spins or blocks.

use std::collections::VecDeque;

use rand_chacha::ChaCha8Rng;

use super::guest::Activity;
use super::ids::{BarrierId, MutexId, ProgramId, QueueId, SpinId, ThreadId, VcpuId, VmId};
use super::wake::{WakeeState, Waker};
use super::{Event, Sim};
use crate::host::VState;
use crate::time::Ns;
use crate::workload::Dist;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TState {
    Ready,
    OnCpu,
    Blocked,
    Done,
}

pub(super) struct Thread {
    pub(super) vm: VmId,
    pub(super) prog: ProgramId,
    pub(super) op: u32,
    pub(super) iter: u64,
    pub(super) max_iter: Option<u64>,
    pub(super) state: TState,
    /// Current or last vCPU.
    pub(super) vcpu: VcpuId,
    pub(super) pin: Option<VcpuId>,
    pub(super) burst_left: Ns,
    /// The whole of the current compute burst, credited as work done when it completes.
    pub(super) burst_total: Ns,
    pub(super) spinning: bool,
    pub(super) spin_held: u32,
    /// When the thread was last woken, what its target vCPU was doing then and the vCPU of
    /// the thread that woke it (none for timers and placements), until it runs.
    pub(super) woken: Option<(Ns, WakeeState, Option<VcpuId>)>,
    pub(super) rng: ChaCha8Rng,
}

/// An op with its sync object resolved to a global index.
#[derive(Debug, Clone)]
pub(super) enum ROp {
    Compute(Dist),
    Sleep(Dist),
    Lock(MutexId),
    HandoffLock(MutexId),
    Unlock(MutexId),
    SpinLock(SpinId),
    SpinUnlock(SpinId),
    Push(QueueId),
    Pop(QueueId),
    Barrier(BarrierId),
}

#[derive(Default)]
pub(super) struct Mutex {
    pub(super) owner: Option<ThreadId>,
    pub(super) waiters: VecDeque<ThreadId>,
    /// Taken with `handoff_lock`: unlock hands ownership to the first waiter.
    pub(super) handoff: bool,
}

pub(super) struct Queue {
    pub(super) len: usize,
    pub(super) cap: usize,
    pub(super) poppers: VecDeque<ThreadId>,
    pub(super) pushers: VecDeque<ThreadId>,
}

pub(super) struct Barrier {
    pub(super) parties: usize,
    pub(super) arrived: usize,
    pub(super) waiters: Vec<ThreadId>,
}

#[derive(Default)]
pub(super) struct SpinLock {
    pub(super) owner: Option<ThreadId>,
    pub(super) spinners: Vec<ThreadId>,
}

impl Sim {
    // ---- threads ---------------------------------------------------------------------------

    pub(super) fn current_op(&self, t: ThreadId) -> ROp {
        let th = &self.threads[t];
        self.programs[th.prog][th.op as usize].clone()
    }

    pub(super) fn block_thread(&mut self, t: ThreadId) {
        let th = &mut self.threads[t];
        th.state = TState::Blocked;
        let (vm, v) = (th.vm, th.vcpu);
        self.vms[vm].thread_switches += 1;
        self.set_act(v, Activity::Idle, 0);
        self.dispatch(v, 0);
    }

    /// Run thread `t`'s program on its (executing) vCPU until it computes, spins or blocks.
    pub(super) fn thread_continue(&mut self, t: ThreadId) {
        let v = self.threads[t].vcpu;
        loop {
            let th = &mut self.threads[t];
            let prog = &self.programs[th.prog];
            if th.op as usize == prog.len() {
                th.op = 0;
                th.iter += 1;
                let vm = th.vm;
                self.vms[vm].iterations += 1;
                if th.max_iter == Some(th.iter) {
                    return self.thread_done(t);
                }
                continue;
            }
            match self.current_op(t) {
                ROp::Compute(d) => {
                    let th = &mut self.threads[t];
                    if th.burst_left == 0 {
                        th.burst_left = d.sample(&mut th.rng);
                        th.burst_total = th.burst_left;
                    }
                    let left = th.burst_left;
                    self.set_act(v, Activity::Running(t), left);
                    return;
                }
                ROp::Sleep(d) => {
                    let th = &mut self.threads[t];
                    let ns = d.sample(&mut th.rng);
                    th.op += 1;
                    self.q.push(self.now + ns, Event::SleepDone { thread: t });
                    return self.block_thread(t);
                }
                ROp::Lock(m) => {
                    let mx = &mut self.mutexes[m];
                    if mx.owner.is_none() {
                        mx.owner = Some(t);
                        self.threads[t].op += 1;
                    } else {
                        mx.waiters.push_back(t);
                        return self.block_thread(t);
                    }
                }
                ROp::HandoffLock(m) => {
                    let mx = &mut self.mutexes[m];
                    mx.handoff = true;
                    if mx.owner.is_none() || mx.owner == Some(t) {
                        // Free, or handed to this thread while it slept.
                        mx.owner = Some(t);
                        self.threads[t].op += 1;
                    } else {
                        mx.waiters.push_back(t);
                        return self.block_thread(t);
                    }
                }
                ROp::Unlock(m) => {
                    self.threads[t].op += 1;
                    let mx = &mut self.mutexes[m];
                    mx.owner = None;
                    if let Some(w) = mx.waiters.pop_front() {
                        if mx.handoff {
                            mx.owner = Some(w);
                        }
                        self.wake_thread(w, Waker::Thread(v));
                    }
                }
                ROp::Push(q) => {
                    let qu = &mut self.queues[q];
                    if qu.len < qu.cap {
                        qu.len += 1;
                        self.threads[t].op += 1;
                        if let Some(w) = self.queues[q].poppers.pop_front() {
                            self.wake_thread(w, Waker::Thread(v));
                        }
                    } else {
                        qu.pushers.push_back(t);
                        return self.block_thread(t);
                    }
                }
                ROp::Pop(q) => {
                    let qu = &mut self.queues[q];
                    if qu.len > 0 {
                        qu.len -= 1;
                        self.threads[t].op += 1;
                        if let Some(w) = self.queues[q].pushers.pop_front() {
                            self.wake_thread(w, Waker::Thread(v));
                        }
                    } else {
                        qu.poppers.push_back(t);
                        return self.block_thread(t);
                    }
                }
                ROp::Barrier(b) => {
                    self.threads[t].op += 1;
                    let ba = &mut self.barriers[b];
                    ba.arrived += 1;
                    if ba.arrived >= ba.parties {
                        ba.arrived = 0;
                        let waiters = std::mem::take(&mut ba.waiters);
                        for w in waiters {
                            self.wake_thread(w, Waker::Thread(v));
                        }
                    } else {
                        ba.waiters.push(t);
                        return self.block_thread(t);
                    }
                }
                ROp::SpinLock(s) => {
                    if self.spins[s].owner.is_none() {
                        self.acquire_spin(s, t);
                    } else {
                        let th = &mut self.threads[t];
                        th.spinning = true;
                        self.spins[s].spinners.push(t);
                        let window = self.costs.ple_window;
                        self.set_act(v, Activity::Running(t), window);
                        return;
                    }
                }
                ROp::SpinUnlock(s) => {
                    let th = &mut self.threads[t];
                    th.op += 1;
                    th.spin_held = th.spin_held.saturating_sub(1);
                    self.spins[s].owner = None;
                    self.grant_spin(s);
                }
            }
        }
    }

    pub(super) fn acquire_spin(&mut self, s: SpinId, t: ThreadId) {
        let sp = &mut self.spins[s];
        sp.owner = Some(t);
        sp.spinners.retain(|&x| x != t);
        let th = &mut self.threads[t];
        th.spinning = false;
        th.spin_held += 1;
        th.op += 1;
    }

    /// A released spinlock goes to the first spinner that is actually executing; spinners on
    /// descheduled vCPUs cannot see the release until they run again.
    pub(super) fn grant_spin(&mut self, s: SpinId) {
        let winner = self.spins[s].spinners.iter().copied().find(|&t| {
            let v = self.threads[t].vcpu;
            self.executing(v) && self.vcpus[v].act == Activity::Running(t)
        });
        if let Some(t) = winner {
            let v = self.threads[t].vcpu;
            self.pause(v);
            self.acquire_spin(s, t);
            self.thread_continue(t);
        }
    }

    /// The spinner exceeded the PLE window: VM exit, directed yield to a preempted holder.
    pub(super) fn pause_loop_exit(&mut self, v: VcpuId, t: ThreadId) {
        self.vcpus[v].c.ple_exits += 1;
        let holder_vcpu = match self.current_op(t) {
            ROp::SpinLock(s) => self.spins[s].owner.map(|h| self.threads[h].vcpu),
            _ => None,
        };
        let vc = &mut self.vcpus[v];
        vc.remaining = self.costs.ple_window;
        vc.in_overhead = true;
        let key = self.q.key_at(self.now + self.costs.ple_exit);
        vc.timer_key = key;
        self.q.push_key(key, Event::VcpuTimer { vcpu: v });
        self.refresh_acct(v);
        if let Some(h) = holder_vcpu {
            if h != v && matches!(self.host.vcpus[h.index()].state, VState::Queued(_)) {
                self.host.yield_to(h.0, self.now);
                self.apply_host_effects();
            }
        }
    }

    pub(super) fn thread_done(&mut self, t: ThreadId) {
        let th = &mut self.threads[t];
        th.state = TState::Done;
        let (vm_id, v) = (th.vm, th.vcpu);
        let vm = &mut self.vms[vm_id];
        vm.live_threads -= 1;
        vm.finite_left -= 1;
        vm.thread_switches += 1;
        if vm.finite_left == 0 && vm.done_at.is_none() {
            vm.done_at = Some(self.now);
            self.finite_vms_left -= 1;
        }
        self.set_act(v, Activity::Idle, 0);
        self.dispatch(v, 0);
    }
}
