//! Building the simulation from a validated scenario: host, vCPUs, threads with their
//! programs resolved to sync-object indices, and per-VM policy state.

use std::collections::{BTreeMap, VecDeque};

use gleaner_policy::{Cpuset, Gleaner, Mode, PolicyConfig, WakeLatencies};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::accounting::{Acct, Counters, Overlap};
use super::guest::{Activity, Vcpu};
use super::ids::{BarrierId, Id, MutexId, QueueId, SpinId};
use super::sync::{Barrier, Mutex, Queue, ROp, SpinLock, TState, Thread};
use super::vcpuset::VcpuSet;
use super::{Costs, GuestParams, Sim, TickSlot, Vm, NO_KEY};
use crate::host::{Host, HostParams, VmSpec};
use crate::queue::EventQueue;
use crate::report::Histogram;
use crate::scenario::{GuestPolicy, Scenario, DEFAULT_QUEUE_CAPACITY};
use crate::workload::Op;

/// The id of the sync object named `name` in this VM, allocating the next free one (`next`)
/// the first time the name is seen.
fn intern<I: Id>(map: &mut BTreeMap<String, I>, name: &str, next: &mut usize) -> I {
    if let Some(&i) = map.get(name) {
        return i;
    }
    let i = I::from_index(*next);
    *next += 1;
    map.insert(name.to_string(), i);
    i
}

impl Sim {
    /// Build the initial state. The scenario must have been validated (Scenario::load does).
    pub fn new(s: &Scenario) -> Sim {
        let mut specs = Vec::new();
        for (i, vm) in s.vms.iter().enumerate() {
            let allowed = vm.host_cpus.as_ref().map(|_| {
                s.host_cpus(i)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| c as u32)
                    .collect()
            });
            specs.push(VmSpec {
                vcpus: vm.vcpus,
                weight: vm.weight,
                allowed,
                pinned: vm.pin_vcpus,
            });
        }
        let hp = HostParams {
            policy: s.host.policy,
            latency: s.host.sched_latency.0,
            min_gran: s.host.min_granularity.0,
            wakeup_gran: s.host.wakeup_granularity.0,
            llc_size: s.host.llc_size,
            alpha: s.host.sbco_alpha,
            gang_slice: s.gang_slice(),
            vcpu_switch: s.costs.vcpu_switch.0,
            cache_refill: s.costs.cache_refill.0,
        };
        let host = Host::new(hp, s.host.pcpus, &specs, s.seed);
        let mut sim = Sim {
            now: 0,
            end: s.sim.duration.0,
            q: EventQueue::default(),
            host,
            vcpus: Default::default(),
            run_state: Default::default(),
            threads: Default::default(),
            programs: Default::default(),
            mutexes: Default::default(),
            queues: Default::default(),
            barriers: Default::default(),
            spins: Default::default(),
            vms: Default::default(),
            costs: Costs {
                guest_switch: s.costs.guest_switch.0,
                idle_exit_path: s.costs.idle_exit_path.0.min(s.costs.guest_switch.0),
                ipi: s.costs.ipi.0,
                ipi_send: s.costs.ipi_send.0,
                halt_wake: s.costs.halt_wake.0,
                poll_wake: s.costs.poll_wake.0,
                ple_window: s.costs.ple_window.0.max(1),
                ple_exit: s.costs.ple_exit.0,
            },
            g: GuestParams {
                slice: s.guest.slice.0,
                balance_interval: s.guest.balance_interval.0,
                poll_max: s.guest.halt_poll_max.0,
                poll_grow_start: s.guest.halt_poll_grow_start.0,
                poll_grow: s.guest.halt_poll_grow,
                poll_shrink: s.guest.halt_poll_shrink,
                policy_period: s.guest.policy_period.0,
                host_balance_interval: s.host.balance_interval.0,
                retention_polls: s.guest.retention_polls,
            },
            events: 0,
            ticks: vec![TickSlot::default(); s.host.pcpus],
            superseded: Vec::new(),
            superseded_passed: 0,
            superseded_cap: 4096,
            cur_key: 0,
            gang_slice: s.gang_slice(),
            finite_vms_left: 0,
            any_finite: false,
            scenario_name: s.name.clone(),
            seed: s.seed,
            kept_samples: None,
        };
        for (i, vm) in s.vms.iter().enumerate() {
            sim.add_vm(s, i, vm);
        }
        sim
    }

    pub(super) fn add_vm(&mut self, s: &Scenario, index: usize, cfg: &crate::scenario::VmConfig) {
        let vm_id = self.vms.next_id();
        let base = self.vcpus.next_id();
        let hold = s.retention_timeout(index);
        for _ in 0..cfg.vcpus {
            self.run_state.push(Default::default());
            self.vcpus.push(Vcpu {
                vm: vm_id,
                act: Activity::Idle,
                remaining: 0,
                deadline: 0,
                timer_key: NO_KEY,
                host_running: false,
                in_overhead: false,
                runq: VecDeque::new(),
                acct: Acct::Idle,
                acct_since: 0,
                acct_overlap: Overlap::Nothing,
                idle_since: 0,
                aged_idle_since: None,
                poll_limit: 0,
                retention: (cfg.guest == GuestPolicy::Hold).then_some(hold),
                ipi_pending: false,
                wake_pending: false,
                exit_debt: 0,
                tick_key: NO_KEY,
                tick_armed: false,
                c: Counters::default(),
            });
        }
        let gleaner = match cfg.guest {
            GuestPolicy::Retention | GuestPolicy::Gleaner => {
                let mut pc: PolicyConfig = cfg.gleaner.clone().unwrap_or_default();
                pc.retention_timeout = gleaner_policy::RetentionTimeout { ns: hold };
                pc.min_time_slice_ns = s.guest.slice.0;
                if cfg.guest == GuestPolicy::Retention {
                    pc.mode = Mode::Retention;
                }
                // Validated with the scenario; an error here would be a bug in validation.
                Gleaner::new(pc, Cpuset::first_n(cfg.vcpus)).ok()
            }
            _ => None,
        };
        let (groups, queue_caps) = cfg.expanded();
        // A fixed cpuset for the workload (the lab's static settings): the first k vCPUs.
        let confined = cfg.active_vcpus.unwrap_or(cfg.vcpus).clamp(1, cfg.vcpus);
        // Sync objects are named per VM and numbered over the host.
        let mut mutex_ids: BTreeMap<String, MutexId> = BTreeMap::new();
        let mut spin_ids: BTreeMap<String, SpinId> = BTreeMap::new();
        let mut queue_ids: BTreeMap<String, QueueId> = BTreeMap::new();
        let mut barrier_ids: BTreeMap<String, BarrierId> = BTreeMap::new();
        let (mut mutex_count, mut spin_count, mut queue_count, mut barrier_count) = (
            self.mutexes.len(),
            self.spins.len(),
            self.queues.len(),
            self.barriers.len(),
        );
        let mut barrier_users: BTreeMap<BarrierId, usize> = BTreeMap::new();
        let mut finite = 0u32;
        let mut local_thread = 0usize;
        for group in &groups {
            let prog: Vec<ROp> = group
                .program
                .iter()
                .map(|op| match op {
                    Op::Compute(d) => ROp::Compute(d.clone()),
                    Op::Sleep(d) => ROp::Sleep(d.clone()),
                    Op::Lock(m) => ROp::Lock(intern(&mut mutex_ids, m, &mut mutex_count)),
                    Op::HandoffLock(m) => {
                        ROp::HandoffLock(intern(&mut mutex_ids, m, &mut mutex_count))
                    }
                    Op::Unlock(m) => ROp::Unlock(intern(&mut mutex_ids, m, &mut mutex_count)),
                    Op::SpinLock(m) => ROp::SpinLock(intern(&mut spin_ids, m, &mut spin_count)),
                    Op::SpinUnlock(m) => ROp::SpinUnlock(intern(&mut spin_ids, m, &mut spin_count)),
                    Op::Push(q) => ROp::Push(intern(&mut queue_ids, q, &mut queue_count)),
                    Op::Pop(q) => ROp::Pop(intern(&mut queue_ids, q, &mut queue_count)),
                    Op::Barrier(b) => ROp::Barrier(intern(&mut barrier_ids, b, &mut barrier_count)),
                })
                .collect();
            let mut seen = Vec::new();
            for op in &prog {
                if let ROp::Barrier(b) = op {
                    if !seen.contains(b) {
                        seen.push(*b);
                        *barrier_users.entry(*b).or_default() += group.count;
                    }
                }
            }
            let prog_id = self.programs.push(prog);
            for _ in 0..group.count {
                let id = self.threads.next_id();
                let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
                rng.set_stream(id.0 as u64);
                let pin = group.pin.map(|p| base.offset(p as u32));
                let vcpu = pin.unwrap_or(base.offset((local_thread % confined) as u32));
                if group.iterations.is_some() {
                    finite += 1;
                }
                self.threads.push(Thread {
                    vm: vm_id,
                    prog: prog_id,
                    op: 0,
                    iter: 0,
                    max_iter: group.iterations,
                    state: TState::Ready,
                    vcpu,
                    pin,
                    burst_left: 0,
                    burst_total: 0,
                    spinning: false,
                    spin_held: 0,
                    woken: None,
                    rng,
                });
                local_thread += 1;
            }
        }
        self.mutexes.grow_to(mutex_count, Mutex::default);
        self.spins.grow_to(spin_count, SpinLock::default);
        let mut queues: Vec<(QueueId, usize)> = queue_ids
            .iter()
            .map(|(name, &id)| {
                (
                    id,
                    queue_caps
                        .get(name)
                        .copied()
                        .unwrap_or(DEFAULT_QUEUE_CAPACITY),
                )
            })
            .collect();
        queues.sort();
        for (_, cap) in queues {
            self.queues.push(Queue {
                len: 0,
                cap,
                poppers: VecDeque::new(),
                pushers: VecDeque::new(),
            });
        }
        let mut barriers: Vec<(BarrierId, usize)> = barrier_ids
            .iter()
            .map(|(name, &id)| {
                let users = barrier_users.get(&id).copied().unwrap_or(1);
                (id, cfg.barriers.get(name).copied().unwrap_or(users))
            })
            .collect();
        barriers.sort();
        for (_, parties) in barriers {
            self.barriers.push(Barrier {
                parties,
                arrived: 0,
                waiters: Vec::new(),
            });
        }
        if finite > 0 {
            self.any_finite = true;
            self.finite_vms_left += 1;
        }
        self.vms.push(Vm {
            name: if cfg.name.is_empty() {
                format!("vm{}", vm_id.0)
            } else {
                cfg.name.clone()
            },
            policy: cfg.guest,
            base,
            n: cfg.vcpus as u32,
            active: VcpuSet::from_flags((0..cfg.vcpus).map(|i| i < confined)),
            // Every vCPU starts idle (`RunState::default()`).
            idle: VcpuSet::from_flags((0..cfg.vcpus).map(|_| true)),
            load_one: VcpuSet::new(cfg.vcpus),
            stealable: VcpuSet::new(cfg.vcpus),
            finite_left: finite,
            done_at: None,
            iterations: 0,
            thread_switches: 0,
            imbalance_wait_ns: 0,
            live_threads: local_thread as u64,
            latency: Histogram::default(),
            gleaner,
            last: vec![Counters::default(); cfg.vcpus],
            last_switches: 0,
            last_wait: 0,
            work_done_ns: 0,
            last_work_done_ns: 0,
            last_period_at: 0,
            app_progress: cfg.app_progress,
            period_wake: WakeLatencies::default(),
            active_history: Vec::new(),
            retaining_history: Vec::new(),
            policy_events: Vec::new(),
            last_characteristics: None,
        });
    }
}
