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
mod vcpuset;
mod wake;

use gleaner_policy::{Gleaner, PeriodSample, WakeLatencies};

use accounting::Counters;
use guest::Vcpu;
use ids::{BarrierId, MutexId, ProgramId, QueueId, SpinId, Table, ThreadId, VcpuId, VmId};
use sync::{Barrier, Mutex, Queue, ROp, SpinLock, TState, Thread};
use vcpuset::VcpuSet;
use wake::Waker;

use crate::host::{Effect, Host, VState};
use crate::queue::{last_key_at, time_of, EventQueue, Key};
use crate::report::{Histogram, SimReport};
use crate::scenario::GuestPolicy;
use crate::time::Ns;

/// A queued event: 8 bytes, half the queue's traffic of one with a generation number. A
/// timer that can be superseded is live while its owner still holds its key (`timer_key`,
/// `tick_key`, [`TickSlot`]): re-arming or cancelling replaces the key, exactly where a
/// generation number was bumped before.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// End of a vCPU's switch-in overhead or of its timed activity.
    VcpuTimer {
        vcpu: VcpuId,
    },
    /// A pCPU's slice timer ([`TickSlot`]).
    HostTick {
        pcpu: u32,
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

/// No event's key (keys are distinct and this one is never made): no live timer.
const NO_KEY: Key = Key::MAX;

struct Vm {
    name: String,
    policy: GuestPolicy,
    /// The VM's first vCPU; its vCPUs are `base..base + n`.
    base: VcpuId,
    n: u32,
    /// Where the workload may run (the cpuset Gleaner sets).
    active: VcpuSet,
    /// By [`guest::RunState`], for the placement searches ([`vcpuset`]): idle with nothing
    /// queued; one thread running or queued; a thread waiting behind another.
    idle: VcpuSet,
    load_one: VcpuSet,
    stealable: VcpuSet,
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
    /// When the last policy period ended: periods differ in length at start-up
    /// (`Gleaner::next_period_ns`).
    last_period_at: Ns,
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
        self.active.contains(v.local(self.base))
    }
}

struct Costs {
    guest_switch: Ns,
    /// At most `guest_switch`.
    idle_exit_path: Ns,
    ipi: Ns,
    ipi_send: Ns,
    halt_wake: Ns,
    poll_wake: Ns,
    ple_window: Ns,
    ple_exit: Ns,
}

/// A pCPU's slice timer, re-armed lazily. The host re-arms it at every vCPU switch, almost
/// always later than the armed one, so queueing each arming left about 24 superseded ticks
/// per pCPU in the event queue (25,000 of its 27,000 entries at the end of perf-1024), each
/// popped only to be ignored. Instead a superseded tick stays queued as the carrier of the
/// latest one, which is queued, under the key it was given when armed, when the carrier
/// pops; an arming earlier than the queued entry is queued at once.
///
/// A superseded tick was counted as a processed event when it popped (the report's `events`),
/// so its key is kept in [`Sim::superseded`] and counted once the run has passed it: the
/// count, and every key (so the order of every event), are those of queueing every arming.
#[derive(Default, Clone, Copy)]
struct TickSlot {
    /// The latest arming, with its key and the host's generation for it; None once it fired.
    due: Option<(Key, u64)>,
    /// The key of this pCPU's one queued entry that will be acted on (at or before `due`);
    /// any other queued tick of this pCPU is dropped when it pops.
    queued: Option<Key>,
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
    /// `GuestConfig::retention_polls`.
    retention_polls: bool,
}

pub struct Sim {
    now: Ns,
    end: Ns,
    q: EventQueue<Event>,
    host: Host,
    vcpus: Table<VcpuId, Vcpu>,
    /// Each vCPU's [`guest::RunState`], dense for the placement scans.
    run_state: Table<VcpuId, guest::RunState>,
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
    /// Per pCPU: its slice timer ([`TickSlot`]).
    ticks: Vec<TickSlot>,
    /// Keys of superseded host ticks not yet passed; those passed are in `superseded_passed`.
    superseded: Vec<Key>,
    superseded_passed: u64,
    /// When `superseded` is folded into `superseded_passed` next.
    superseded_cap: usize,
    /// The key of the event being handled.
    cur_key: Key,
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
        // Superseded ticks up to this key were (would have been) popped and counted.
        let mut counted_to = Key::MAX;
        while let Some((key, ev)) = self.q.pop_key() {
            let at = time_of(key);
            if at > self.end {
                self.now = self.end;
                counted_to = last_key_at(self.end);
                break;
            }
            self.now = at;
            let mut tick_gen = 0;
            if let Event::HostTick { pcpu } = ev {
                match self.host_tick_fires(pcpu, key) {
                    Some(gen) => tick_gen = gen,
                    None => continue,
                }
            }
            self.cur_key = key;
            self.events += 1;
            self.handle(ev, key, tick_gen);
            if self.any_finite && self.finite_vms_left == 0 {
                counted_to = key;
                break;
            }
        }
        let passed = self.superseded.iter().filter(|&&k| k <= counted_to);
        if counted_to == Key::MAX {
            // The queue ran dry: the last event popped would have been the latest tick.
            if let Some(&last) = passed.clone().max() {
                self.now = self.now.max(time_of(last));
            }
        }
        self.events += self.superseded_passed + passed.count() as u64;
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
                    .push(self.next_policy_period(vm), Event::PolicyPeriod { vm });
                self.q
                    .push(self.wait_sample_interval(), Event::WaitSample { vm });
            }
        }
    }

    /// Handle the event popped with `key`; `tick_gen` is the host's generation of a firing
    /// host tick.
    fn handle(&mut self, ev: Event, key: Key, tick_gen: u64) {
        match ev {
            Event::VcpuTimer { vcpu } => {
                if self.vcpus[vcpu].timer_key == key {
                    self.vcpu_timer(vcpu);
                }
            }
            Event::HostTick { pcpu } => {
                self.host.tick(pcpu as usize, tick_gen, self.now);
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
            Event::GuestTick { vcpu } => {
                if self.vcpus[vcpu].tick_key == key {
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
                self.q.push(
                    self.now + self.next_policy_period(vm),
                    Event::PolicyPeriod { vm },
                );
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
                    // One of two fixed delays (with or without cache refill): FIFO lanes.
                    vc.timer_key =
                        self.q
                            .push_delayed(self.now, overhead, Event::VcpuTimer { vcpu });
                    self.refresh_acct(vcpu);
                }
                Effect::Preempted { vcpu, .. } => {
                    let vcpu = VcpuId(vcpu);
                    self.pause(vcpu);
                    let vc = &mut self.vcpus[vcpu];
                    vc.host_running = false;
                    vc.in_overhead = false;
                    // An overhead timer still in flight must not fire for a vCPU that left.
                    vc.timer_key = NO_KEY;
                    self.refresh_acct(vcpu);
                }
                Effect::Tick { pcpu, at, gen } => self.arm_host_tick(pcpu, at, gen),
                Effect::Slot { at } => self.q.push(at, Event::GangSlot),
            }
        }
        self.host.fx = fx;
    }

    /// The host armed `pcpu`'s slice timer for `at` ([`TickSlot`]).
    fn arm_host_tick(&mut self, pcpu: u32, at: Ns, gen: u64) {
        let key = self.q.key_at(at);
        let slot = &mut self.ticks[pcpu as usize];
        if let Some((old, _)) = slot.due.replace((key, gen)) {
            self.superseded.push(old);
        }
        match slot.queued {
            Some(q) if q <= key => {} // pops first and queues this one then
            _ => {
                slot.queued = Some(key);
                self.q.push_key(key, Event::HostTick { pcpu });
            }
        }
        if self.superseded.len() >= self.superseded_cap {
            // Count the ones already passed (at most a few ms old: the last tick's slice).
            let cur = self.cur_key;
            let before = self.superseded.len();
            self.superseded.retain(|&k| k > cur);
            self.superseded_passed += (before - self.superseded.len()) as u64;
            self.superseded_cap = (2 * self.superseded.len()).max(4096);
        }
    }

    /// A host tick for `pcpu` popped with `key`: if it is the latest arming, to handle and
    /// count, the host's generation for it; otherwise None, after queueing the latest arming
    /// if this entry carried it ([`TickSlot`]).
    fn host_tick_fires(&mut self, pcpu: u32, key: Key) -> Option<u64> {
        let slot = &mut self.ticks[pcpu as usize];
        if slot.queued != Some(key) {
            return None;
        }
        slot.queued = None;
        match slot.due {
            Some((due, gen)) if due == key => {
                slot.due = None;
                Some(gen)
            }
            Some((due, _)) => {
                slot.queued = Some(due);
                self.q.push_key(due, Event::HostTick { pcpu });
                None
            }
            None => None,
        }
    }
}
