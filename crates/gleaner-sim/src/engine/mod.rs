//! The engine: state of every guest (vCPUs, threads, sync objects), the event loop, and the
//! glue between guests and the host scheduler. Split by job:
//! [`build`] (scenario to state), [`guest`] (the guest scheduler), [`wake`] (wake-up placement
//! and delivery), [`sync`] (threads and synchronization objects), [`accounting`] (time
//! accounting and timed activities), [`policy`] (gleaner-policy glue), [`report`] (the result).
//!
//!
//! A vCPU makes progress only while the host runs it (`host_running`) and it is past its
//! switch-in overhead. Its guest is always doing exactly one [`Activity`]: switching into a
//! thread, running a thread's op (a compute burst or a spin), polling (haltpoll), holding the
//! vCPU for retention, or idle (halted). Timed activities keep their remaining time while the
//! vCPU is descheduled, so a host preemption stretches them exactly as it does on hardware, and
//! a lock holder on a preempted vCPU keeps its lock (lock-holder preemption).
//!
//! How a wakeup travels (Table 2's operations):
//! * to the waker's own vCPU, or a vCPU busy with a thread: the thread is queued; it runs after
//!   the current thread blocks or its guest slice ends, paying `guest_switch` (RT);
//! * to a polling vCPU: noticed in `poll_wake`, then RT;
//! * to a vCPU held by retention: a reschedule IPI (`ipi`), then RT: setting B;
//! * to a halted vCPU: IPI, the host kicks the vCPU thread (`halt_wake`), the host schedules it
//!   (`vcpu_switch`, plus `cache_refill` if the pCPU ran another vCPU meanwhile, and any run
//!   queue wait), then RT: settings C and D.
//!
//! Time accounting is a state machine per vCPU ([`accounting::Acct`]): every state change charges the time

mod accounting;
mod build;
mod guest;
pub mod ids;
mod policy;
mod report;
mod sync;
mod wake;

use gleaner_policy::{Gleaner, PeriodSample, WakeLatencies};

use accounting::Counters;
use guest::Vcpu;
use ids::{BarrierId, MutexId, ProgramId, QueueId, SpinId, Table, ThreadId, VcpuId, VmId};
use sync::{Barrier, Mutex, Queue, ROp, SpinLock, TState, Thread};
use wake::Waker;

use crate::host::{Effect, Host, VState};
use crate::queue::EventQueue;
use crate::report::{Histogram, SimReport};
use crate::scenario::GuestPolicy;
use crate::time::Ns;

#[derive(Debug, Clone, Copy)]
enum Event {
    /// End of a vCPU's switch-in overhead or of its timed activity.
    VcpuTimer {
        vcpu: VcpuId,
        gen: u64,
    },
    HostTick {
        pcpu: u32,
        gen: u64,
    },
    HostBalance {
        pcpu: u32,
    },
    GangSlot,
    IpiArrive {
        vcpu: VcpuId,
    },
    /// The host finished kicking a halted vCPU: it becomes runnable.
    HostWake {
        vcpu: VcpuId,
    },
    SleepDone {
        thread: ThreadId,
    },
    GuestTick {
        vcpu: VcpuId,
        gen: u64,
    },
    GuestBalance {
        vm: VmId,
    },
    PolicyPeriod {
        vm: VmId,
    },
    /// Sub-sample of the workload's run states for `work_runnable_wait_ns`.
    WaitSample {
        vm: VmId,
    },
}

struct Vm {
    name: String,
    policy: GuestPolicy,
    /// The VM's first vCPU; its vCPUs are `base..base + n`.
    base: VcpuId,
    n: u32,
    active: Vec<bool>,
    finite_left: u32,
    done_at: Option<Ns>,
    iterations: u64,
    thread_switches: u64,
    /// Estimated time threads queued on one active vCPU while another had none.
    imbalance_wait_ns: Ns,
    live_threads: u64,
    latency: Histogram,
    gleaner: Option<Gleaner>,
    last: Vec<Counters>,
    last_switches: u64,
    last_wait: Ns,
    /// Compute bursts completed (the workload's useful work), and the total at the last
    /// policy period: the application progress the sample reports is the difference.
    work_done_ns: Ns,
    last_work_done_ns: Ns,
    /// Whether the policy is told `progress` (`vm.app_progress`).
    app_progress: bool,
    /// Wake latencies of the current policy period, by the wakee vCPU's state.
    period_wake: WakeLatencies,
    active_history: Vec<usize>,
    retaining_history: Vec<usize>,
    policy_events: Vec<gleaner_policy::PolicyEvent>,
    last_characteristics: Option<gleaner_policy::Characteristics>,
}

impl Vm {
    /// The VM's vCPUs, in order.
    fn vcpu_ids(&self) -> impl Iterator<Item = VcpuId> {
        let base = self.base;
        (0..self.n).map(move |i| base.offset(i))
    }

    /// Is the workload allowed on vCPU `v` (one of this VM's)?
    fn is_active(&self, v: VcpuId) -> bool {
        self.active[v.local(self.base)]
    }
}

struct Costs {
    guest_switch: Ns,
    ipi: Ns,
    ipi_send: Ns,
    halt_wake: Ns,
    poll_wake: Ns,
    ple_window: Ns,
    ple_exit: Ns,
}

struct GuestParams {
    slice: Ns,
    balance_interval: Ns,
    poll_max: Ns,
    poll_grow_start: Ns,
    poll_grow: u64,
    poll_shrink: u64,
    policy_period: Ns,
    host_balance_interval: Ns,
}

pub struct Sim {
    now: Ns,
    end: Ns,
    q: EventQueue<Event>,
    host: Host,
    vcpus: Table<VcpuId, Vcpu>,
    threads: Table<ThreadId, Thread>,
    programs: Table<ProgramId, Vec<ROp>>,
    mutexes: Table<MutexId, Mutex>,
    queues: Table<QueueId, Queue>,
    barriers: Table<BarrierId, Barrier>,
    spins: Table<SpinId, SpinLock>,
    vms: Table<VmId, Vm>,
    costs: Costs,
    g: GuestParams,
    events: u64,
    gang_slice: Ns,
    finite_vms_left: usize,
    any_finite: bool,
    scenario_name: String,
    seed: u64,
    /// Every `PeriodSample` handed to a policy, with its VM's index, when asked for
    /// ([`Sim::run_keeping_samples`]): what the policy lab correlates with throughput.
    kept_samples: Option<Vec<(usize, PeriodSample)>>,
}

impl Sim {
    /// Run to completion and report.
    pub fn run(self) -> SimReport {
        self.run_loop().0
    }

    /// Run to completion; also return every sample the VMs' policies were given.
    pub fn run_keeping_samples(mut self) -> (SimReport, Vec<(usize, PeriodSample)>) {
        self.kept_samples = Some(Vec::new());
        let (report, samples) = self.run_loop();
        (report, samples.unwrap_or_default())
    }

    fn run_loop(mut self) -> (SimReport, Option<Vec<(usize, PeriodSample)>>) {
        self.start();
        while let Some((at, ev)) = self.q.pop() {
            if at > self.end {
                self.now = self.end;
                break;
            }
            self.now = at;
            self.events += 1;
            self.handle(ev);
            if self.any_finite && self.finite_vms_left == 0 {
                break;
            }
        }
        let samples = self.kept_samples.take();
        (self.report(), samples)
    }

    fn start(&mut self) {
        for t in self.threads.ids() {
            let v = self.threads[t].vcpu;
            self.enqueue_ready(t, v);
        }
        for v in self.vcpus.ids() {
            if !self.vcpus[v].runq.is_empty() {
                self.host.wake(v.0, 0);
            }
        }
        self.apply_host_effects();
        let npcpus = self.host.pcpus.len() as u64;
        let hb = self.g.host_balance_interval;
        if !self.host.policy().is_cosched() {
            for p in 0..npcpus {
                // Staggered, as the kernel's per-CPU balance timers are.
                self.q
                    .push(hb + p * hb / npcpus, Event::HostBalance { pcpu: p as u32 });
            }
        } else {
            self.q.push(self.gang_slice, Event::GangSlot);
        }
        for vm in self.vms.ids() {
            if self.vms[vm].n > 1 {
                self.q
                    .push(self.g.balance_interval, Event::GuestBalance { vm });
            }
            if self.vms[vm].gleaner.is_some() || self.kept_samples.is_some() {
                self.q
                    .push(self.g.policy_period, Event::PolicyPeriod { vm });
                self.q
                    .push(self.wait_sample_interval(), Event::WaitSample { vm });
            }
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::VcpuTimer { vcpu, gen } => {
                if self.vcpus[vcpu].timer_gen == gen {
                    self.vcpu_timer(vcpu);
                }
            }
            Event::HostTick { pcpu, gen } => {
                self.host.tick(pcpu as usize, gen, self.now);
                self.apply_host_effects();
            }
            Event::HostBalance { pcpu } => {
                self.host.balance(pcpu as usize, self.now);
                self.apply_host_effects();
                self.q.push(
                    self.now + self.g.host_balance_interval,
                    Event::HostBalance { pcpu },
                );
            }
            Event::GangSlot => {
                self.host.gang_slot(self.now);
                self.apply_host_effects();
            }
            Event::IpiArrive { vcpu } => self.ipi_arrive(vcpu),
            Event::HostWake { vcpu } => {
                self.vcpus[vcpu].wake_pending = false;
                if self.host.vcpus[vcpu.index()].state == VState::Halted {
                    self.host.wake(vcpu.0, self.now);
                    self.apply_host_effects();
                    self.refresh_acct(vcpu);
                }
            }
            Event::SleepDone { thread } => {
                if self.threads[thread].state == TState::Blocked {
                    let v = self.threads[thread].vcpu;
                    self.wake_thread(thread, Waker::Timer(v));
                }
            }
            Event::GuestTick { vcpu, gen } => {
                if self.vcpus[vcpu].tick_gen == gen {
                    self.guest_tick(vcpu);
                }
            }
            Event::GuestBalance { vm } => {
                self.guest_balance(vm);
                self.q.push(
                    self.now + self.g.balance_interval,
                    Event::GuestBalance { vm },
                );
            }
            Event::PolicyPeriod { vm } => {
                self.policy_period(vm);
                self.q
                    .push(self.now + self.g.policy_period, Event::PolicyPeriod { vm });
            }
            Event::WaitSample { vm } => {
                self.wait_sample(vm);
                self.q.push(
                    self.now + self.wait_sample_interval(),
                    Event::WaitSample { vm },
                );
            }
        }
    }

    // ---- host glue -------------------------------------------------------------------------

    fn apply_host_effects(&mut self) {
        // Handlers below never call into the host, so the buffer can be drained and handed back.
        let mut fx = std::mem::take(&mut self.host.fx);
        for e in fx.drain(..) {
            match e {
                Effect::Run { vcpu, overhead, .. } => {
                    let vcpu = VcpuId(vcpu);
                    let vc = &mut self.vcpus[vcpu];
                    vc.host_running = true;
                    vc.in_overhead = true;
                    vc.timer_gen += 1;
                    let gen = vc.timer_gen;
                    self.q
                        .push(self.now + overhead, Event::VcpuTimer { vcpu, gen });
                    self.refresh_acct(vcpu);
                }
                Effect::Preempted { vcpu, .. } => {
                    let vcpu = VcpuId(vcpu);
                    self.pause(vcpu);
                    let vc = &mut self.vcpus[vcpu];
                    vc.host_running = false;
                    vc.in_overhead = false;
                    // An overhead timer still in flight must not fire for a vCPU that left.
                    vc.timer_gen += 1;
                    self.refresh_acct(vcpu);
                }
                Effect::Tick { pcpu, at, gen } => self.q.push(at, Event::HostTick { pcpu, gen }),
                Effect::Slot { at } => self.q.push(at, Event::GangSlot),
            }
        }
        self.host.fx = fx;
    }
}
