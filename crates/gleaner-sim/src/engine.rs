//! The engine: state of every guest (vCPUs, threads, sync objects), the event loop, and the
//! glue between guests and the host scheduler.
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
//! Time accounting is a state machine per vCPU ([`Acct`]): every state change charges the time
//! since the last change to the state being left, so the counters are exact to the nanosecond.
//! They feed both the report and Gleaner's `PeriodSample`.

use std::collections::{BTreeMap, VecDeque};

use gleaner_policy::{Cpuset, Gleaner, Mode, PeriodSample, PolicyConfig, RetentionAction, VcpuSample};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::host::{Effect, Host, HostParams, VState, VmSpec};
use crate::queue::EventQueue;
use crate::report::{Histogram, SimReport, VcpuReport, VmReport};
use crate::scenario::{GuestPolicy, Scenario, DEFAULT_QUEUE_CAPACITY};
use crate::time::Ns;
use crate::workload::{Dist, Op};

#[derive(Debug, Clone, Copy)]
enum Event {
    /// End of a vCPU's switch-in overhead or of its timed activity.
    VcpuTimer { vcpu: u32, gen: u64 },
    HostTick { pcpu: u32, gen: u64 },
    HostBalance { pcpu: u32 },
    GangSlot,
    IpiArrive { vcpu: u32 },
    /// The host finished kicking a halted vCPU: it becomes runnable.
    HostWake { vcpu: u32 },
    SleepDone { thread: u32 },
    GuestTick { vcpu: u32, gen: u64 },
    GuestBalance { vm: u32 },
    PolicyPeriod { vm: u32 },
    /// Sub-sample of the workload's run states for `work_runnable_wait_ns`.
    WaitSample { vm: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activity {
    /// Guest context switch (or wake path) into the thread.
    Switching(u32),
    /// The thread runs its current op: a compute burst, or spinning on a spinlock.
    Running(u32),
    Polling,
    Retaining,
    Idle,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acct {
    Work,
    Yield,
    Idle,
    Steal,
    Overhead,
}

#[derive(Debug, Clone, Default)]
struct Counters {
    work_ns: Ns,
    yield_ns: Ns,
    idle_ns: Ns,
    steal_ns: Ns,
    overhead_ns: Ns,
    yield_preemptions: u64,
    idle_entries: u64,
    halts: u64,
    ipis: u64,
    ple_exits: u64,
    /// Steal and switch-in overhead while the guest sits in HLT (kicked, waiting for or
    /// entering a pCPU). The guest's own idle clock (`/proc/timer_list` idle_sleeptime, which
    /// gleaner-linux reads) runs from HLT until the guest resumes, so Gleaner's sample counts
    /// this as idle time too (and the host's run delay also as steal, as `/proc/stat` does).
    halt_wait_ns: Ns,
    /// Switch-in overhead (host switch, cache refill) while a workload thread is current:
    /// the guest cannot see it apart from the thread's own run time.
    overhead_busy_ns: Ns,
}

struct Vcpu {
    vm: u32,
    act: Activity,
    /// Time left of a timed activity while it is not progressing.
    remaining: Ns,
    /// When the timed activity ends, while it is progressing.
    deadline: Ns,
    timer_gen: u64,
    host_running: bool,
    in_overhead: bool,
    runq: VecDeque<u32>,
    acct: Acct,
    acct_since: Ns,
    /// The guest's activity class when `acct` was set: 0 idle (HLT/poll), 1 workload thread,
    /// 2 other (retention hold).
    acct_guest: u8,
    idle_since: Ns,
    poll_limit: Ns,
    /// Retention hold when the vCPU goes idle; None = halt (or poll).
    retention: Option<Ns>,
    ipi_pending: bool,
    wake_pending: bool,
    /// VM exits taken by the guest code now running (IPI sends), added to its current
    /// activity: the guest sees them as time its instruction took.
    exit_debt: Ns,
    tick_gen: u64,
    tick_armed: bool,
    c: Counters,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TState {
    Ready,
    OnCpu,
    Blocked,
    Done,
}

struct Thread {
    vm: u32,
    prog: u32,
    op: u32,
    iter: u64,
    max_iter: Option<u64>,
    state: TState,
    /// Current or last vCPU (global id).
    vcpu: u32,
    pin: Option<u32>,
    burst_left: Ns,
    spinning: bool,
    spin_held: u32,
    woken_at: Option<Ns>,
    rng: ChaCha8Rng,
}

/// An op with its sync object resolved to a global index.
#[derive(Debug, Clone)]
enum ROp {
    Compute(Dist),
    Sleep(Dist),
    Lock(u32),
    HandoffLock(u32),
    Unlock(u32),
    SpinLock(u32),
    SpinUnlock(u32),
    Push(u32),
    Pop(u32),
    Barrier(u32),
}

#[derive(Default)]
struct Mutex {
    owner: Option<u32>,
    waiters: VecDeque<u32>,
    /// Taken with `handoff_lock`: unlock hands ownership to the first waiter.
    handoff: bool,
}

struct Queue {
    len: usize,
    cap: usize,
    poppers: VecDeque<u32>,
    pushers: VecDeque<u32>,
}

struct Barrier {
    parties: usize,
    arrived: usize,
    waiters: Vec<u32>,
}

#[derive(Default)]
struct SpinLock {
    owner: Option<u32>,
    spinners: Vec<u32>,
}

struct Vm {
    name: String,
    policy: GuestPolicy,
    base: u32,
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
    active_history: Vec<usize>,
    retaining_history: Vec<usize>,
    policy_events: Vec<gleaner_policy::PolicyEvent>,
    last_characteristics: Option<gleaner_policy::Characteristics>,
}

#[derive(Debug, Clone, Copy)]
enum Waker {
    /// A thread running on this vCPU (the unlock, push or barrier arrival that wakes).
    Thread(u32),
    /// A timer on this vCPU (the sleeping thread's own).
    Timer(u32),
    /// Placement by the policy or a balancer, from no particular vCPU.
    Nobody,
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
    vcpus: Vec<Vcpu>,
    threads: Vec<Thread>,
    programs: Vec<Vec<ROp>>,
    mutexes: Vec<Mutex>,
    queues: Vec<Queue>,
    barriers: Vec<Barrier>,
    spins: Vec<SpinLock>,
    vms: Vec<Vm>,
    costs: Costs,
    g: GuestParams,
    events: u64,
    gang_slice: Ns,
    finite_vms_left: usize,
    any_finite: bool,
    scenario_name: String,
    seed: u64,
}

fn intern(map: &mut BTreeMap<String, u32>, name: &str, next: &mut u32) -> u32 {
    if let Some(&i) = map.get(name) {
        return i;
    }
    let i = *next;
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
                s.host_cpus(i).unwrap_or_default().into_iter().map(|c| c as u32).collect()
            });
            specs.push(VmSpec { vcpus: vm.vcpus, weight: vm.weight, allowed, pinned: vm.pin_vcpus });
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
            vcpus: Vec::new(),
            threads: Vec::new(),
            programs: Vec::new(),
            mutexes: Vec::new(),
            queues: Vec::new(),
            barriers: Vec::new(),
            spins: Vec::new(),
            vms: Vec::new(),
            costs: Costs {
                guest_switch: s.costs.guest_switch.0,
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
            },
            events: 0,
            gang_slice: s.gang_slice(),
            finite_vms_left: 0,
            any_finite: false,
            scenario_name: s.name.clone(),
            seed: s.seed,
        };
        for (i, vm) in s.vms.iter().enumerate() {
            sim.add_vm(s, i, vm);
        }
        sim
    }

    fn add_vm(&mut self, s: &Scenario, index: usize, cfg: &crate::scenario::VmConfig) {
        let vm_id = self.vms.len() as u32;
        let base = self.vcpus.len() as u32;
        let hold = s.retention_timeout(index);
        for _ in 0..cfg.vcpus {
            self.vcpus.push(Vcpu {
                vm: vm_id,
                act: Activity::Idle,
                remaining: 0,
                deadline: 0,
                timer_gen: 0,
                host_running: false,
                in_overhead: false,
                runq: VecDeque::new(),
                acct: Acct::Idle,
                acct_since: 0,
                acct_guest: 0,
                idle_since: 0,
                poll_limit: 0,
                retention: (cfg.guest == GuestPolicy::Hold).then_some(hold),
                ipi_pending: false,
                wake_pending: false,
                exit_debt: 0,
                tick_gen: 0,
                tick_armed: false,
                c: Counters::default(),
            });
        }
        let gleaner = match cfg.guest {
            GuestPolicy::Retention | GuestPolicy::Gleaner => {
                let mut pc: PolicyConfig = cfg.gleaner.clone().unwrap_or_default();
                pc.retention_timeout_ns = hold;
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
        let (mut mutex_ids, mut spin_ids, mut queue_ids, mut barrier_ids) =
            (BTreeMap::new(), BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        let (mut nm, mut ns, mut nq, mut nb) = (
            self.mutexes.len() as u32,
            self.spins.len() as u32,
            self.queues.len() as u32,
            self.barriers.len() as u32,
        );
        let mut barrier_users: BTreeMap<u32, usize> = BTreeMap::new();
        let mut finite = 0u32;
        let mut local_thread = 0usize;
        for group in &groups {
            let prog: Vec<ROp> = group
                .program
                .iter()
                .map(|op| match op {
                    Op::Compute(d) => ROp::Compute(d.clone()),
                    Op::Sleep(d) => ROp::Sleep(d.clone()),
                    Op::Lock(m) => ROp::Lock(intern(&mut mutex_ids, m, &mut nm)),
                    Op::HandoffLock(m) => ROp::HandoffLock(intern(&mut mutex_ids, m, &mut nm)),
                    Op::Unlock(m) => ROp::Unlock(intern(&mut mutex_ids, m, &mut nm)),
                    Op::SpinLock(m) => ROp::SpinLock(intern(&mut spin_ids, m, &mut ns)),
                    Op::SpinUnlock(m) => ROp::SpinUnlock(intern(&mut spin_ids, m, &mut ns)),
                    Op::Push(q) => ROp::Push(intern(&mut queue_ids, q, &mut nq)),
                    Op::Pop(q) => ROp::Pop(intern(&mut queue_ids, q, &mut nq)),
                    Op::Barrier(b) => ROp::Barrier(intern(&mut barrier_ids, b, &mut nb)),
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
            let prog_id = self.programs.len() as u32;
            self.programs.push(prog);
            for _ in 0..group.count {
                let id = self.threads.len() as u32;
                let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
                rng.set_stream(id as u64);
                let pin = group.pin.map(|p| base + p as u32);
                let vcpu = pin.unwrap_or(base + (local_thread % cfg.vcpus) as u32);
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
                    spinning: false,
                    spin_held: 0,
                    woken_at: None,
                    rng,
                });
                local_thread += 1;
            }
        }
        self.mutexes.resize_with(nm as usize, Mutex::default);
        self.spins.resize_with(ns as usize, SpinLock::default);
        let mut queues: Vec<(u32, usize)> = queue_ids
            .iter()
            .map(|(name, &id)| (id, queue_caps.get(name).copied().unwrap_or(DEFAULT_QUEUE_CAPACITY)))
            .collect();
        queues.sort();
        for (_, cap) in queues {
            self.queues.push(Queue { len: 0, cap, poppers: VecDeque::new(), pushers: VecDeque::new() });
        }
        let mut barriers: Vec<(u32, usize)> = barrier_ids
            .iter()
            .map(|(name, &id)| {
                let users = barrier_users.get(&id).copied().unwrap_or(1);
                (id, cfg.barriers.get(name).copied().unwrap_or(users))
            })
            .collect();
        barriers.sort();
        for (_, parties) in barriers {
            self.barriers.push(Barrier { parties, arrived: 0, waiters: Vec::new() });
        }
        if finite > 0 {
            self.any_finite = true;
            self.finite_vms_left += 1;
        }
        self.vms.push(Vm {
            name: if cfg.name.is_empty() { format!("vm{vm_id}") } else { cfg.name.clone() },
            policy: cfg.guest,
            base,
            n: cfg.vcpus as u32,
            active: vec![true; cfg.vcpus],
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
            active_history: Vec::new(),
            retaining_history: Vec::new(),
            policy_events: Vec::new(),
            last_characteristics: None,
        });
    }

    /// Run to completion and report.
    pub fn run(mut self) -> SimReport {
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
        self.report()
    }

    fn start(&mut self) {
        for t in 0..self.threads.len() as u32 {
            let v = self.threads[t as usize].vcpu;
            self.enqueue_ready(t, v);
        }
        for v in 0..self.vcpus.len() as u32 {
            if !self.vcpus[v as usize].runq.is_empty() {
                self.host.wake(v, 0);
            }
        }
        self.apply_host_effects();
        let npcpus = self.host.pcpus.len() as u64;
        let hb = self.g.host_balance_interval;
        if !self.host.policy().is_cosched() {
            for p in 0..npcpus {
                // Staggered, as the kernel's per-CPU balance timers are.
                self.q.push(hb + p * hb / npcpus, Event::HostBalance { pcpu: p as u32 });
            }
        } else {
            self.q.push(self.gang_slice, Event::GangSlot);
        }
        for vm in 0..self.vms.len() as u32 {
            if self.vms[vm as usize].n > 1 {
                self.q.push(self.g.balance_interval, Event::GuestBalance { vm });
            }
            if self.vms[vm as usize].gleaner.is_some() {
                self.q.push(self.g.policy_period, Event::PolicyPeriod { vm });
                self.q.push(self.wait_sample_interval(), Event::WaitSample { vm });
            }
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::VcpuTimer { vcpu, gen } => {
                if self.vcpus[vcpu as usize].timer_gen == gen {
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
                self.q.push(self.now + self.g.host_balance_interval, Event::HostBalance { pcpu });
            }
            Event::GangSlot => {
                self.host.gang_slot(self.now);
                self.apply_host_effects();
            }
            Event::IpiArrive { vcpu } => self.ipi_arrive(vcpu),
            Event::HostWake { vcpu } => {
                self.vcpus[vcpu as usize].wake_pending = false;
                if self.host.vcpus[vcpu as usize].state == VState::Halted {
                    self.host.wake(vcpu, self.now);
                    self.apply_host_effects();
                    self.refresh_acct(vcpu);
                }
            }
            Event::SleepDone { thread } => {
                if self.threads[thread as usize].state == TState::Blocked {
                    let v = self.threads[thread as usize].vcpu;
                    self.wake_thread(thread, Waker::Timer(v));
                }
            }
            Event::GuestTick { vcpu, gen } => {
                if self.vcpus[vcpu as usize].tick_gen == gen {
                    self.guest_tick(vcpu);
                }
            }
            Event::GuestBalance { vm } => {
                self.guest_balance(vm);
                self.q.push(self.now + self.g.balance_interval, Event::GuestBalance { vm });
            }
            Event::PolicyPeriod { vm } => {
                self.policy_period(vm);
                self.q.push(self.now + self.g.policy_period, Event::PolicyPeriod { vm });
            }
            Event::WaitSample { vm } => {
                self.wait_sample(vm);
                self.q.push(self.now + self.wait_sample_interval(), Event::WaitSample { vm });
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
                    let vc = &mut self.vcpus[vcpu as usize];
                    vc.host_running = true;
                    vc.in_overhead = true;
                    vc.timer_gen += 1;
                    let gen = vc.timer_gen;
                    self.q.push(self.now + overhead, Event::VcpuTimer { vcpu, gen });
                    self.refresh_acct(vcpu);
                }
                Effect::Preempted { vcpu, .. } => {
                    self.pause(vcpu);
                    let vc = &mut self.vcpus[vcpu as usize];
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

    fn executing(&self, v: u32) -> bool {
        let vc = &self.vcpus[v as usize];
        vc.host_running && !vc.in_overhead
    }

    fn timed(act: Activity) -> bool {
        !matches!(act, Activity::Idle)
    }

    /// Stop the progress of the current timed activity, keeping what is left of it.
    fn pause(&mut self, v: u32) {
        if !self.executing(v) {
            return;
        }
        let now = self.now;
        let vc = &mut self.vcpus[v as usize];
        if Self::timed(vc.act) {
            vc.remaining = vc.deadline.saturating_sub(now);
            vc.timer_gen += 1;
        }
    }

    /// Let the current timed activity progress from now.
    fn resume_timer(&mut self, v: u32) {
        if !self.executing(v) {
            return;
        }
        let now = self.now;
        let vc = &mut self.vcpus[v as usize];
        if Self::timed(vc.act) {
            vc.deadline = now.saturating_add(vc.remaining);
            vc.timer_gen += 1;
            let gen = vc.timer_gen;
            let at = vc.deadline;
            self.q.push(at, Event::VcpuTimer { vcpu: v, gen });
        }
    }

    fn set_act(&mut self, v: u32, act: Activity, remaining: Ns) {
        self.pause(v);
        let vc = &mut self.vcpus[v as usize];
        vc.act = act;
        vc.remaining = remaining;
        if Self::timed(act) {
            vc.remaining = vc.remaining.saturating_add(std::mem::take(&mut vc.exit_debt));
        }
        self.resume_timer(v);
        self.refresh_acct(v);
    }

    /// Time left of the current timed activity as of now.
    fn remaining_now(&self, v: u32) -> Ns {
        let vc = &self.vcpus[v as usize];
        if self.executing(v) {
            vc.deadline.saturating_sub(self.now)
        } else {
            vc.remaining
        }
    }

    fn refresh_acct(&mut self, v: u32) {
        let state = {
            let vc = &self.vcpus[v as usize];
            if !vc.host_running {
                match self.host.vcpus[v as usize].state {
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
        let vc = &mut self.vcpus[v as usize];
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

    fn vcpu_timer(&mut self, v: u32) {
        if self.vcpus[v as usize].in_overhead {
            self.vcpus[v as usize].in_overhead = false;
            self.refresh_acct(v);
            self.guest_resume(v);
        } else {
            self.activity_done(v);
        }
    }

    // ---- guest: vCPU life cycle ------------------------------------------------------------

    /// The vCPU starts executing guest code again (after a switch-in or a pause-loop exit).
    fn guest_resume(&mut self, v: u32) {
        match self.vcpus[v as usize].act {
            Activity::Running(t) if self.threads[t as usize].spinning => {
                let ROp::SpinLock(s) = self.current_op(t) else { return self.resume_timer(v) };
                if self.spins[s as usize].owner.is_none() {
                    self.acquire_spin(s, t);
                    self.thread_continue(t);
                } else {
                    self.resume_timer(v);
                }
            }
            Activity::Polling | Activity::Retaining | Activity::Idle => {
                let vc = &self.vcpus[v as usize];
                if !vc.runq.is_empty() {
                    self.leave_idle(v, 0);
                } else if vc.act == Activity::Idle
                    || (vc.act == Activity::Retaining && vc.retention.is_none())
                {
                    self.vcpus[v as usize].c.idle_entries += 1;
                    self.halt(v);
                } else {
                    self.resume_timer(v);
                }
            }
            _ => self.resume_timer(v),
        }
    }

    fn activity_done(&mut self, v: u32) {
        match self.vcpus[v as usize].act {
            Activity::Switching(t) => {
                let th = &mut self.threads[t as usize];
                if let Some(at) = th.woken_at.take() {
                    let vm = th.vm as usize;
                    self.vms[vm].latency.record(self.now - at);
                }
                self.vcpus[v as usize].act = Activity::Running(t);
                self.thread_continue(t);
            }
            Activity::Running(t) => {
                if self.threads[t as usize].spinning {
                    self.pause_loop_exit(v, t);
                } else {
                    let th = &mut self.threads[t as usize];
                    th.burst_left = 0;
                    th.op += 1;
                    self.thread_continue(t);
                }
            }
            Activity::Polling => self.halt(v),
            Activity::Retaining => {
                self.vcpus[v as usize].c.idle_entries += 1;
                self.halt(v);
            }
            Activity::Idle => {}
        }
    }

    fn halt(&mut self, v: u32) {
        self.set_act(v, Activity::Idle, 0);
        let vc = &mut self.vcpus[v as usize];
        // A pending ICR-write exit only delays the halt; it is not carried into the next run.
        vc.exit_debt = 0;
        vc.c.halts += 1;
        vc.host_running = false;
        vc.in_overhead = false;
        vc.timer_gen += 1;
        self.host.block(v, self.now);
        self.refresh_acct(v);
        self.apply_host_effects();
    }

    /// The vCPU's guest has nothing to run.
    fn go_idle(&mut self, v: u32) {
        let policy = self.vms[self.vcpus[v as usize].vm as usize].policy;
        self.vcpus[v as usize].idle_since = self.now;
        if !self.executing(v) {
            // Only when a deactivation empties a descheduled vCPU: it halts when it next runs.
            return self.set_act(v, Activity::Idle, 0);
        }
        let vc = &mut self.vcpus[v as usize];
        if let Some(hold) = vc.retention {
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
    fn leave_idle(&mut self, v: u32, extra: Ns) {
        let now = self.now;
        let g_max = self.g.poll_max;
        let (grow_start, grow, shrink) = (self.g.poll_grow_start, self.g.poll_grow, self.g.poll_shrink);
        let policy = self.vms[self.vcpus[v as usize].vm as usize].policy;
        let vc = &mut self.vcpus[v as usize];
        if vc.act == Activity::Retaining {
            vc.c.yield_preemptions += 1;
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
    fn dispatch(&mut self, v: u32, extra: Ns) {
        let next = match self.vcpus[v as usize].runq.pop_front() {
            Some(t) => {
                Some(t)
            }
            None => self.steal_thread(v),
        };
        match next {
            Some(t) => self.switch_to(v, t, extra + self.costs.guest_switch),
            None => self.go_idle(v),
        }
    }

    fn switch_to(&mut self, v: u32, t: u32, cost: Ns) {
        let th = &mut self.threads[t as usize];
        th.state = TState::OnCpu;
        th.vcpu = v;
        self.set_act(v, Activity::Switching(t), cost);
        if !self.vcpus[v as usize].runq.is_empty() {
            self.arm_guest_tick(v);
        }
    }

    /// New-idle balancing in the guest: take a queued thread from the busiest active sibling.
    fn steal_thread(&mut self, v: u32) -> Option<u32> {
        let vm = &self.vms[self.vcpus[v as usize].vm as usize];
        if !vm.active[(v - vm.base) as usize] {
            return None;
        }
        let (base, n) = (vm.base, vm.n);
        // Linux's idle_balance() moves only tasks that wait behind another (the busiest queue
        // needs nr_running >= 2): a thread just woken onto a halted vCPU is that vCPU's only
        // task and stays there until the vCPU runs. Stealing it would hide BWW.
        let mut best: Option<(usize, u32)> = None;
        for u in base..base + n {
            let vc = &self.vcpus[u as usize];
            let len = vc.runq.len();
            let load = len + usize::from(matches!(vc.act, Activity::Switching(_) | Activity::Running(_)));
            if u != v && len > 0 && load >= 2 && best.is_none_or(|(l, _)| len > l) {
                best = Some((len, u));
            }
        }
        let (_, u) = best?;
        let pos = self.vcpus[u as usize]
            .runq
            .iter()
            .rposition(|&t| self.threads[t as usize].pin.is_none())?;
        self.vcpus[u as usize].runq.remove(pos)
    }

    fn arm_guest_tick(&mut self, v: u32) {
        let vc = &mut self.vcpus[v as usize];
        if vc.tick_armed {
            return;
        }
        vc.tick_armed = true;
        vc.tick_gen += 1;
        let gen = vc.tick_gen;
        self.q.push(self.now + self.g.slice, Event::GuestTick { vcpu: v, gen });
    }

    fn guest_tick(&mut self, v: u32) {
        self.vcpus[v as usize].tick_armed = false;
        if self.vcpus[v as usize].runq.is_empty() {
            return;
        }
        if !self.executing(v) {
            return self.arm_guest_tick(v);
        }
        match self.vcpus[v as usize].act {
            Activity::Running(t) if self.threads[t as usize].spin_held == 0 => {
                self.preempt_thread(v, t);
                self.vcpus[v as usize].runq.push_back(t);
                self.dispatch(v, 0);
            }
            _ => self.arm_guest_tick(v),
        }
    }

    /// Take the running thread `t` off vCPU `v` (it becomes Ready; the caller queues it).
    fn preempt_thread(&mut self, v: u32, t: u32) {
        let left = self.remaining_now(v);
        let th = &mut self.threads[t as usize];
        if let Activity::Running(_) = self.vcpus[v as usize].act {
            if th.spinning {
                // The spinner gives up its place and retries the lock when it runs again.
                th.spinning = false;
                if let ROp::SpinLock(s) = self.programs[th.prog as usize][th.op as usize] {
                    self.spins[s as usize].spinners.retain(|&x| x != t);
                }
            } else {
                th.burst_left = left;
            }
        }
        th.state = TState::Ready;
        let vm = th.vm as usize;
        self.vms[vm].thread_switches += 1;
        self.set_act(v, Activity::Idle, 0);
    }

    fn wait_sample_interval(&self) -> Ns {
        (self.g.policy_period / 100).max(1)
    }

    /// Does some active vCPU hold two or more runnable workload threads while another active
    /// vCPU holds none? Sampled, as gleaner-linux's sampler does from the threads' run states
    /// and CPUs.
    fn wait_sample(&mut self, vm_id: u32) {
        let vm = &self.vms[vm_id as usize];
        if vm.active.iter().filter(|&&a| a).count() < 2 {
            return;
        }
        let (mut queued, mut empty) = (false, false);
        for i in 0..vm.n {
            if !vm.active[i as usize] {
                continue;
            }
            let vc = &self.vcpus[(vm.base + i) as usize];
            let running = usize::from(matches!(vc.act, Activity::Switching(_) | Activity::Running(_)));
            let runnable = vc.runq.len() + running;
            queued |= runnable >= 2;
            empty |= runnable == 0;
        }
        if queued && empty {
            let step = self.wait_sample_interval();
            self.vms[vm_id as usize].imbalance_wait_ns += step;
        }
    }

    fn enqueue_ready(&mut self, t: u32, v: u32) {
        let th = &mut self.threads[t as usize];
        th.state = TState::Ready;
        th.vcpu = v;
        self.vcpus[v as usize].runq.push_back(t);
    }

    // ---- guest: wakeups --------------------------------------------------------------------

    fn allowed_on(&self, t: u32, u: u32) -> bool {
        let th = &self.threads[t as usize];
        match th.pin {
            Some(p) => p == u,
            None => {
                let vm = &self.vms[th.vm as usize];
                vm.active[(u - vm.base) as usize]
            }
        }
    }

    fn vcpu_idle(&self, u: u32) -> bool {
        let vc = &self.vcpus[u as usize];
        matches!(vc.act, Activity::Polling | Activity::Retaining | Activity::Idle) && vc.runq.is_empty()
    }

    /// Guest wakeup placement: the previous vCPU if idle, else any idle vCPU, else the least
    /// loaded one. Idle includes halted: the guest cannot tell, which is the BWW problem.
    fn select_vcpu(&self, t: u32, waker: Waker) -> u32 {
        // A timer fires on the vCPU the thread slept on; try_to_wake_up then runs the usual
        // placement (select_idle_sibling), so the timer's vCPU is taken only if it is idle.
        // Queueing the thread behind a busy (possibly host-preempted) vCPU while others sit
        // idle would be an artefact Linux does not have.
        if let Waker::Timer(u) = waker {
            if self.allowed_on(t, u) && self.vcpu_idle(u) {
                return u;
            }
        }
        let th = &self.threads[t as usize];
        let vm = &self.vms[th.vm as usize];
        let prev = th.vcpu;
        if self.allowed_on(t, prev) && self.vcpu_idle(prev) {
            return prev;
        }
        let at = |i: u32| vm.base + (prev - vm.base + i) % vm.n;
        if let Some(u) = (1..vm.n).map(at).find(|&u| self.allowed_on(t, u) && self.vcpu_idle(u)) {
            return u;
        }
        (0..vm.n)
            .map(at)
            .filter(|&u| self.allowed_on(t, u))
            .min_by_key(|&u| {
                let vc = &self.vcpus[u as usize];
                vc.runq.len() + usize::from(matches!(vc.act, Activity::Switching(_) | Activity::Running(_)))
            })
            .unwrap_or(prev)
    }

    fn wake_thread(&mut self, t: u32, waker: Waker) {
        self.threads[t as usize].woken_at = Some(self.now);
        let v = self.select_vcpu(t, waker);
        self.enqueue_ready(t, v);
        self.kick(v, waker);
    }

    /// Make vCPU `v` notice the thread just queued on it.
    fn kick(&mut self, v: u32, waker: Waker) {
        match self.vcpus[v as usize].act {
            Activity::Switching(_) | Activity::Running(_) => self.arm_guest_tick(v),
            Activity::Polling => {
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
                if self.host.vcpus[v as usize].state != VState::Halted {
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

    fn send_ipi(&mut self, v: u32, from: Waker) {
        if self.vcpus[v as usize].ipi_pending {
            return;
        }
        if let Waker::Thread(sender) = from {
            // Writing the APIC ICR exits to the VMM on the sender.
            self.vcpus[sender as usize].exit_debt += self.costs.ipi_send;
        }
        let vc = &mut self.vcpus[v as usize];
        vc.ipi_pending = true;
        vc.c.ipis += 1;
        self.q.push(self.now + self.costs.ipi, Event::IpiArrive { vcpu: v });
    }

    fn host_kick(&mut self, v: u32) {
        let vc = &mut self.vcpus[v as usize];
        if vc.wake_pending {
            return;
        }
        vc.wake_pending = true;
        self.q.push(self.now + self.costs.halt_wake, Event::HostWake { vcpu: v });
    }

    fn ipi_arrive(&mut self, v: u32) {
        self.vcpus[v as usize].ipi_pending = false;
        if self.host.vcpus[v as usize].state == VState::Halted {
            return self.host_kick(v);
        }
        let vc = &self.vcpus[v as usize];
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

    // ---- threads ---------------------------------------------------------------------------

    fn current_op(&self, t: u32) -> ROp {
        let th = &self.threads[t as usize];
        self.programs[th.prog as usize][th.op as usize].clone()
    }

    fn block_thread(&mut self, t: u32) {
        let th = &mut self.threads[t as usize];
        th.state = TState::Blocked;
        let (vm, v) = (th.vm as usize, th.vcpu);
        self.vms[vm].thread_switches += 1;
        self.set_act(v, Activity::Idle, 0);
        self.dispatch(v, 0);
    }

    /// Run thread `t`'s program on its (executing) vCPU until it computes, spins or blocks.
    fn thread_continue(&mut self, t: u32) {
        let v = self.threads[t as usize].vcpu;
        loop {
            let th = &mut self.threads[t as usize];
            let prog = &self.programs[th.prog as usize];
            if th.op as usize == prog.len() {
                th.op = 0;
                th.iter += 1;
                let vm = th.vm as usize;
                self.vms[vm].iterations += 1;
                if th.max_iter == Some(th.iter) {
                    return self.thread_done(t);
                }
                continue;
            }
            match self.current_op(t) {
                ROp::Compute(d) => {
                    let th = &mut self.threads[t as usize];
                    if th.burst_left == 0 {
                        th.burst_left = d.sample(&mut th.rng);
                    }
                    let left = th.burst_left;
                    self.set_act(v, Activity::Running(t), left);
                    return;
                }
                ROp::Sleep(d) => {
                    let th = &mut self.threads[t as usize];
                    let ns = d.sample(&mut th.rng);
                    th.op += 1;
                    self.q.push(self.now + ns, Event::SleepDone { thread: t });
                    return self.block_thread(t);
                }
                ROp::Lock(m) => {
                    let mx = &mut self.mutexes[m as usize];
                    if mx.owner.is_none() {
                        mx.owner = Some(t);
                        self.threads[t as usize].op += 1;
                    } else {
                        mx.waiters.push_back(t);
                        return self.block_thread(t);
                    }
                }
                ROp::HandoffLock(m) => {
                    let mx = &mut self.mutexes[m as usize];
                    mx.handoff = true;
                    if mx.owner.is_none() || mx.owner == Some(t) {
                        // Free, or handed to this thread while it slept.
                        mx.owner = Some(t);
                        self.threads[t as usize].op += 1;
                    } else {
                        mx.waiters.push_back(t);
                        return self.block_thread(t);
                    }
                }
                ROp::Unlock(m) => {
                    self.threads[t as usize].op += 1;
                    let mx = &mut self.mutexes[m as usize];
                    mx.owner = None;
                    if let Some(w) = mx.waiters.pop_front() {
                        if mx.handoff {
                            mx.owner = Some(w);
                        }
                        self.wake_thread(w, Waker::Thread(v));
                    }
                }
                ROp::Push(q) => {
                    let qu = &mut self.queues[q as usize];
                    if qu.len < qu.cap {
                        qu.len += 1;
                        self.threads[t as usize].op += 1;
                        if let Some(w) = self.queues[q as usize].poppers.pop_front() {
                            self.wake_thread(w, Waker::Thread(v));
                        }
                    } else {
                        qu.pushers.push_back(t);
                        return self.block_thread(t);
                    }
                }
                ROp::Pop(q) => {
                    let qu = &mut self.queues[q as usize];
                    if qu.len > 0 {
                        qu.len -= 1;
                        self.threads[t as usize].op += 1;
                        if let Some(w) = self.queues[q as usize].pushers.pop_front() {
                            self.wake_thread(w, Waker::Thread(v));
                        }
                    } else {
                        qu.poppers.push_back(t);
                        return self.block_thread(t);
                    }
                }
                ROp::Barrier(b) => {
                    self.threads[t as usize].op += 1;
                    let ba = &mut self.barriers[b as usize];
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
                    if self.spins[s as usize].owner.is_none() {
                        self.acquire_spin(s, t);
                    } else {
                        let th = &mut self.threads[t as usize];
                        th.spinning = true;
                        self.spins[s as usize].spinners.push(t);
                        let window = self.costs.ple_window;
                        self.set_act(v, Activity::Running(t), window);
                        return;
                    }
                }
                ROp::SpinUnlock(s) => {
                    let th = &mut self.threads[t as usize];
                    th.op += 1;
                    th.spin_held = th.spin_held.saturating_sub(1);
                    self.spins[s as usize].owner = None;
                    self.grant_spin(s);
                }
            }
        }
    }

    fn acquire_spin(&mut self, s: u32, t: u32) {
        let sp = &mut self.spins[s as usize];
        sp.owner = Some(t);
        sp.spinners.retain(|&x| x != t);
        let th = &mut self.threads[t as usize];
        th.spinning = false;
        th.spin_held += 1;
        th.op += 1;
    }

    /// A released spinlock goes to the first spinner that is actually executing; spinners on
    /// descheduled vCPUs cannot see the release until they run again.
    fn grant_spin(&mut self, s: u32) {
        let winner = self.spins[s as usize].spinners.iter().copied().find(|&t| {
            let v = self.threads[t as usize].vcpu;
            self.executing(v) && self.vcpus[v as usize].act == Activity::Running(t)
        });
        if let Some(t) = winner {
            let v = self.threads[t as usize].vcpu;
            self.pause(v);
            self.acquire_spin(s, t);
            self.thread_continue(t);
        }
    }

    /// The spinner exceeded the PLE window: VM exit, directed yield to a preempted holder.
    fn pause_loop_exit(&mut self, v: u32, t: u32) {
        self.vcpus[v as usize].c.ple_exits += 1;
        let holder_vcpu = match self.current_op(t) {
            ROp::SpinLock(s) => self.spins[s as usize].owner.map(|h| self.threads[h as usize].vcpu),
            _ => None,
        };
        let vc = &mut self.vcpus[v as usize];
        vc.remaining = self.costs.ple_window;
        vc.in_overhead = true;
        vc.timer_gen += 1;
        let gen = vc.timer_gen;
        self.q.push(self.now + self.costs.ple_exit, Event::VcpuTimer { vcpu: v, gen });
        self.refresh_acct(v);
        if let Some(h) = holder_vcpu {
            if h != v && matches!(self.host.vcpus[h as usize].state, VState::Queued(_)) {
                self.host.yield_to(h, self.now);
                self.apply_host_effects();
            }
        }
    }

    fn thread_done(&mut self, t: u32) {
        let th = &mut self.threads[t as usize];
        th.state = TState::Done;
        let (vm_id, v) = (th.vm as usize, th.vcpu);
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

    // ---- guest: balancing and policy -------------------------------------------------------

    /// Periodic guest load balancing: move queued threads from the most to the least loaded
    /// active vCPU while they differ by two or more.
    fn guest_balance(&mut self, vm_id: u32) {
        let (base, n) = (self.vms[vm_id as usize].base, self.vms[vm_id as usize].n);
        for _ in 0..n {
            let load = |s: &Sim, u: u32| {
                let vc = &s.vcpus[u as usize];
                vc.runq.len() + usize::from(matches!(vc.act, Activity::Switching(_) | Activity::Running(_)))
            };
            let active: Vec<u32> =
                (base..base + n).filter(|&u| self.vms[vm_id as usize].active[(u - base) as usize]).collect();
            let Some(&busiest) = active.iter().max_by_key(|&&u| (load(self, u), std::cmp::Reverse(u))) else {
                return;
            };
            let Some(&idlest) = active.iter().min_by_key(|&&u| (load(self, u), u)) else { return };
            if load(self, busiest) < load(self, idlest) + 2 {
                return;
            }
            let Some(pos) = self.vcpus[busiest as usize].runq.iter().rposition(|&t| self.allowed_on(t, idlest))
            else {
                return;
            };
            let Some(t) = self.vcpus[busiest as usize].runq.remove(pos) else { return };
            self.threads[t as usize].vcpu = idlest;
            self.vcpus[idlest as usize].runq.push_back(t);
            self.kick(idlest, Waker::Nobody);
        }
    }

    /// One Gleaner period: sample the VM's counters, step the policy, apply the decision.
    fn policy_period(&mut self, vm_id: u32) {
        let (base, n) = (self.vms[vm_id as usize].base, self.vms[vm_id as usize].n);
        for u in base..base + n {
            self.refresh_acct(u);
        }
        let vm = &self.vms[vm_id as usize];
        let mut vcpus = Vec::with_capacity(n as usize);
        for i in 0..n as usize {
            let (now, then) = (&self.vcpus[base as usize + i].c, &vm.last[i]);
            vcpus.push(VcpuSample {
                cpu: i,
                work_ns: (now.work_ns + now.overhead_busy_ns) - (then.work_ns + then.overhead_busy_ns),
                yield_ns: now.yield_ns - then.yield_ns,
                idle_ns: (now.idle_ns + now.halt_wait_ns) - (then.idle_ns + then.halt_wait_ns),
                steal_ns: now.steal_ns - then.steal_ns,
                yield_preemptions: now.yield_preemptions - then.yield_preemptions,
                idle_entries: now.idle_entries - then.idle_entries,
            });
        }
        let sample = PeriodSample {
            period_ns: self.g.policy_period,
            vcpus,
            work_switches: vm.thread_switches - vm.last_switches,
            work_threads: vm.live_threads,
            work_runnable_wait_ns: Some(vm.imbalance_wait_ns - vm.last_wait),
            wake_latency: None,
            progress: None,
        };
        let vm = &mut self.vms[vm_id as usize];
        vm.last = (0..n as usize).map(|i| self.vcpus[base as usize + i].c.clone()).collect();
        vm.last_switches = vm.thread_switches;
        vm.last_wait = vm.imbalance_wait_ns;
        let Some(gleaner) = vm.gleaner.as_mut() else { return };
        let decision = gleaner.step(&sample);
        vm.active_history.push(decision.active.len());
        vm.retaining_history.push(
            decision.retention.iter().filter(|(_, a)| *a != RetentionAction::Off).count(),
        );
        vm.policy_events.extend(decision.events.iter().cloned());
        vm.last_characteristics = Some(decision.characteristics);
        for (cpu, action) in &decision.retention {
            if *cpu >= n as usize {
                continue;
            }
            let u = base + *cpu as u32;
            self.vcpus[u as usize].retention = match action {
                RetentionAction::Off => None,
                RetentionAction::Retain { timeout_ns } => Some(*timeout_ns),
            };
            // A vCPU held right now by a hold that was just switched off releases at once.
            if self.vcpus[u as usize].act == Activity::Retaining
                && self.vcpus[u as usize].retention.is_none()
                && self.executing(u)
            {
                self.vcpus[u as usize].c.idle_entries += 1;
                self.halt(u);
            }
        }
        let new_active: Vec<bool> = (0..n as usize).map(|i| decision.active.contains(i)).collect();
        if new_active.iter().any(|&a| a) && new_active != self.vms[vm_id as usize].active {
            self.vms[vm_id as usize].active = new_active.clone();
            for i in 0..n {
                if !new_active[i as usize] {
                    self.evict(base + i);
                }
            }
        }
    }

    /// vCPU `u` was deactivated: move its workload threads to active vCPUs (a cpuset change
    /// migrates them at once).
    fn evict(&mut self, u: u32) {
        while let Some(t) = self.vcpus[u as usize].runq.pop_front() {
            self.requeue(t);
        }
        if let Activity::Switching(t) | Activity::Running(t) = self.vcpus[u as usize].act {
            let th = &self.threads[t as usize];
            if th.pin.is_none() && th.spin_held == 0 {
                self.preempt_thread(u, t);
                self.requeue(t);
                self.dispatch(u, 0);
            }
        }
    }

    fn requeue(&mut self, t: u32) {
        let v = self.select_vcpu(t, Waker::Nobody);
        self.enqueue_ready(t, v);
        self.kick(v, Waker::Nobody);
    }

    // ---- report ----------------------------------------------------------------------------

    fn report(mut self) -> SimReport {
        for v in 0..self.vcpus.len() as u32 {
            self.refresh_acct(v);
        }
        self.host.finish(self.now);
        let now = self.now;
        let vms = self
            .vms
            .iter()
            .map(|vm| {
                let vcpus: Vec<VcpuReport> = (vm.base..vm.base + vm.n)
                    .map(|u| {
                        let (c, h) = (&self.vcpus[u as usize].c, &self.host.vcpus[u as usize]);
                        VcpuReport {
                            vcpu: (u - vm.base) as usize,
                            switches_in: h.switches_in,
                            preemptions: h.preemptions,
                            migrations: h.migrations,
                            halts: c.halts,
                            idle_entries: c.idle_entries,
                            yield_preemptions: c.yield_preemptions,
                            ipis_received: c.ipis,
                            ple_exits: c.ple_exits,
                            work_ns: c.work_ns,
                            yield_ns: c.yield_ns,
                            idle_ns: c.idle_ns,
                            steal_ns: c.steal_ns,
                            overhead_ns: c.overhead_ns,
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
                    throughput_per_s: vm.iterations as f64 * 1e9 / measured as f64,
                    wake_latency: vm.latency.summary(),
                    vcpu_switches: vcpus.iter().map(|c| c.switches_in).sum(),
                    idle_transitions: vcpus.iter().map(|c| c.idle_entries + c.yield_preemptions).sum(),
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
