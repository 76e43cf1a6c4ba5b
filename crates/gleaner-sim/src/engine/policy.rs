//! Glue to gleaner-policy: the per-period `PeriodSample` built from the VM's counters, the
//! decision applied (active vCPUs, retention holds), and the sub-sampled runnable wait.

use gleaner_policy::{PeriodSample, RetentionAction, VcpuSample, WakeLatencies};

use super::guest::Activity;
use super::ids::{ThreadId, VcpuId, VmId};
use super::vcpuset::VcpuSet;
use super::wake::Waker;
use super::Sim;
use crate::time::Ns;

impl Sim {
    pub(super) fn wait_sample_interval(&self) -> Ns {
        (self.g.policy_period / 100).max(1)
    }

    /// Does some active vCPU hold two or more runnable workload threads while another active
    /// vCPU holds none? Sampled, as gleaner-linux's sampler does from the threads' run states
    /// and CPUs.
    pub(super) fn wait_sample(&mut self, vm_id: VmId) {
        let vm = &self.vms[vm_id];
        if vm.active.len() < 2 {
            return;
        }
        let (mut queued, mut empty) = (false, false);
        for u in vm.vcpu_ids() {
            if !vm.is_active(u) {
                continue;
            }
            let vc = &self.vcpus[u];
            let running = usize::from(matches!(
                vc.act,
                Activity::Switching(_) | Activity::Running(_)
            ));
            let runnable = vc.runq.len() + running;
            queued |= runnable >= 2;
            empty |= runnable == 0;
        }
        if queued && empty {
            let step = self.wait_sample_interval();
            self.vms[vm_id].imbalance_wait_ns += step;
        }
    }
    /// How long VM `vm_id`'s next policy period lasts: what its policy asks for, as the
    /// daemon's controller does (`Gleaner::next_period_ns`); the configured period without one.
    pub(super) fn next_policy_period(&self, vm_id: VmId) -> Ns {
        let base = self.g.policy_period;
        self.vms[vm_id]
            .gleaner
            .as_ref()
            .map_or(base, |g| g.next_period_ns(base))
    }

    /// One Gleaner period: sample the VM's counters, step the policy, apply the decision.
    pub(super) fn policy_period(&mut self, vm_id: VmId) {
        let (base, n) = (self.vms[vm_id].base, self.vms[vm_id].n);
        for i in 0..n {
            self.refresh_acct(base.offset(i));
        }
        let vm = &self.vms[vm_id];
        let mut vcpus = Vec::with_capacity(n as usize);
        for i in 0..n as usize {
            let (now, then) = (&self.vcpus[base.offset(i as u32)].c, &vm.last[i]);
            vcpus.push(VcpuSample {
                cpu: i,
                // The switch out of idle's first part is the kernel's, not the thread's.
                work_ns: ((now.work_ns() + now.overhead_busy_ns())
                    - (then.work_ns() + then.overhead_busy_ns()))
                .saturating_sub((now.idle_exits - then.idle_exits) * self.costs.idle_exit_path),
                yield_ns: now.yield_ns() - then.yield_ns(),
                idle_ns: (now.idle_ns() + now.halt_wait_ns())
                    - (then.idle_ns() + then.halt_wait_ns()),
                steal_ns: now.steal_ns() - then.steal_ns(),
                yield_preemptions: now.yield_preemptions - then.yield_preemptions,
                idle_entries: now.idle_entries - then.idle_entries,
            });
        }
        let sample = PeriodSample {
            period_ns: (self.now - vm.last_period_at).max(1),
            vcpus,
            work_switches: vm.thread_switches - vm.last_switches,
            work_threads: vm.live_threads,
            work_runnable_wait_ns: Some(vm.imbalance_wait_ns - vm.last_wait),
            wake_latency: Some(vm.period_wake.clone()),
            // In microseconds of the workload's compute completed: every simulated workload's
            // useful work, whatever its kind (items, transactions, barrier rounds).
            progress: Some((vm.work_done_ns - vm.last_work_done_ns) / 1_000),
            // The simulator counts every event of every period: nothing is carried over.
            stale_rates: false,
            rates_from: gleaner_policy::RatesFrom::Counting,
        };
        let vm = &mut self.vms[vm_id];
        vm.period_wake = WakeLatencies::default();
        vm.last_work_done_ns = vm.work_done_ns;
        vm.last_period_at = self.now;
        vm.last = (0..n)
            .map(|i| self.vcpus[base.offset(i)].c.clone())
            .collect();
        vm.last_switches = vm.thread_switches;
        vm.last_wait = vm.imbalance_wait_ns;
        // Kept with the workload's true progress, told or not: a trace shows what each
        // period achieved next to the signal the policy judged it by.
        if let Some(kept) = self.kept_samples.as_mut() {
            kept.push((vm_id.index(), sample.clone()));
        }
        let mut sample = sample;
        if !vm.app_progress {
            sample.progress = None;
        }
        let Some(gleaner) = vm.gleaner.as_mut() else {
            return;
        };
        let decision = gleaner.step(&sample);
        vm.active_history.push(decision.active.len());
        vm.retaining_history.push(
            decision
                .retention
                .iter()
                .filter(|(_, a)| *a != RetentionAction::Off)
                .count(),
        );
        vm.policy_events.extend(decision.events.iter().cloned());
        vm.last_characteristics = Some(decision.characteristics);
        for (cpu, action) in &decision.retention {
            if *cpu >= n as usize {
                continue;
            }
            let u = base.offset(*cpu as u32);
            self.vcpus[u].retention = match action {
                RetentionAction::Off => None,
                RetentionAction::Retain { timeout_ns } => Some(*timeout_ns),
            };
            // A vCPU held right now by a hold that was just switched off releases at once.
            if self.vcpus[u].act == Activity::Retaining
                && self.vcpus[u].retention.is_none()
                && self.executing(u)
            {
                self.vcpus[u].c.idle_entries += 1;
                self.halt(u);
            }
        }
        let new_active = VcpuSet::from_flags((0..n as usize).map(|i| decision.active.contains(i)));
        if !new_active.is_empty() && new_active != self.vms[vm_id].active {
            self.vms[vm_id].active = new_active.clone();
            for i in 0..n {
                if !new_active.contains(i as usize) {
                    self.evict(base.offset(i));
                }
            }
        }
    }

    /// vCPU `u` was deactivated: move its workload threads to active vCPUs (a cpuset change
    /// migrates them at once).
    pub(super) fn evict(&mut self, u: VcpuId) {
        while let Some(t) = self.runq_pop(u) {
            self.requeue(t);
        }
        if let Activity::Switching(t) | Activity::Running(t) = self.vcpus[u].act {
            let th = &self.threads[t];
            if th.pin.is_none() && th.spin_held == 0 {
                self.preempt_thread(u, t);
                self.requeue(t);
                self.dispatch(u, 0);
            }
        }
    }

    pub(super) fn requeue(&mut self, t: ThreadId) {
        let v = self.select_vcpu(t, Waker::Nobody);
        self.enqueue_ready(t, v);
        self.kick(v, Waker::Nobody);
    }
}
