//! The end of a run: final accounting and the [`SimReport`].

use super::Sim;
use crate::report::{SimReport, VcpuReport, VmReport};

impl Sim {
    pub(super) fn report(mut self) -> SimReport {
        for v in self.vcpus.ids().collect::<Vec<_>>() {
            self.refresh_acct(v);
        }
        self.host.finish(self.now);
        let now = self.now;
        let vms = self
            .vms
            .iter()
            .map(|vm| {
                let vcpus: Vec<VcpuReport> = vm
                    .vcpu_ids()
                    .map(|u| {
                        let (c, h) = (&self.vcpus[u].c, &self.host.vcpus[u.index()]);
                        VcpuReport {
                            vcpu: u.local(vm.base),
                            switches_in: h.switches_in,
                            preemptions: h.preemptions,
                            migrations: h.migrations,
                            halts: c.halts,
                            idle_entries: c.idle_entries,
                            yield_preemptions: c.yield_preemptions,
                            ipis_received: c.ipis,
                            ple_exits: c.ple_exits,
                            work_ns: c.work_ns(),
                            yield_ns: c.yield_ns(),
                            idle_ns: c.idle_ns(),
                            steal_ns: c.steal_ns(),
                            overhead_ns: c.overhead_ns(),
                        }
                    })
                    .collect();
                let measured = vm.done_at.unwrap_or(now).max(1);
                VmReport {
                    name: vm.name.clone(),
                    guest_policy: vm.policy.name().to_string(),
                    finished: vm.done_at.is_some(),
                    run_time_ns: vm.done_at,
                    iterations: vm.iterations,
                    completed_work_ns: vm.work_done_ns,
                    throughput_per_s: vm.iterations as f64 * 1e9 / measured as f64,
                    wake_latency: vm.latency.summary(),
                    vcpu_switches: vcpus.iter().map(|c| c.switches_in).sum(),
                    idle_transitions: vcpus
                        .iter()
                        .map(|c| c.idle_entries + c.yield_preemptions)
                        .sum(),
                    steal_ns: vcpus.iter().map(|c| c.steal_ns).sum(),
                    work_ns: vcpus.iter().map(|c| c.work_ns).sum(),
                    thread_switches: vm.thread_switches,
                    vcpus,
                    active_vcpus: vm.active_history.clone(),
                    retaining_vcpus: vm.retaining_history.clone(),
                    policy_events: vm.policy_events.clone(),
                    last_characteristics: vm.last_characteristics,
                    solo_run_time_ns: None,
                    solo_throughput_per_s: None,
                    speedup: None,
                }
            })
            .collect();
        SimReport {
            scenario: self.scenario_name.clone(),
            seed: self.seed,
            host_policy: self.host.policy().name().to_string(),
            pcpus: self.host.pcpus.len(),
            simulated_ns: now,
            events: self.events,
            host: self.host.stats.clone(),
            pcpu_busy_ns: self.host.pcpus.iter().map(|p| p.busy_ns).collect(),
            vms,
            weighted_speedup: None,
        }
    }
}
