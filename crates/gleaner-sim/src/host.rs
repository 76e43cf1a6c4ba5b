//! The host: P pCPUs, each with a CFS run queue of vCPU tasks, and the host policies.
//!
//! What is modelled of CFS: per-task vruntime advancing by runtime × 1024 / weight; a per-queue
//! monotonic min_vruntime; sleeper placement at min_vruntime − sched_latency/2 (GENTLE_FAIR_
//! SLEEPERS); ideal slices of max(sched_latency, n × min_granularity) × weight share; wakeup
//! preemption when the woken task is ahead by more than wakeup_granularity; wakeup placement
//! on the previous pCPU if idle, else an idle pCPU in its LLC domain; new-idle balancing (an
//! idle pCPU pulls a queued task) and periodic balancing (every balance_interval, from the
//! busiest queue of the domain, and of the whole host every 8th time), including the pull a
//! busy pCPU one vCPU short makes after failed tries (`nr_balance_failed`), by which always-
//! busy vCPUs on an oversubscribed host take turns on the pCPUs they share.
//!
//! Host policies on top (scenario `host.policy`):
//! * `bal`: sibling vCPUs never share a run queue (placement and migration avoid it).
//! * `sbco`: `bal`'s dispatch plus SBCO Algorithm 1/2 at every pick: when the leftmost task is
//!   a vCPU whose runnable sibling sits at a scheduling ordinate at least
//!   D_threshold = alpha × (that queue's length) away, the successor runs instead; the fast
//!   vCPU lends vruntime to the slow one (applied to the slow one's queue through its debt
//!   list when that queue next picks), and both are marked dirty until the debt is applied.
//! * `cosched-strict` / `cosched-relaxed`: gang scheduling. Time is cut into global slots, one
//!   VM per slot in turn; vCPU i of a VM is bound to one pCPU, and during its VM's slot it
//!   runs there without slicing. Strict leaves the pCPU idle while that vCPU is halted;
//!   relaxed lets other VMs' vCPUs run there (CFS order) until it wakes.
//!
//! The host never looks inside a guest. It reports what happened as [`Effect`]s that the engine
//! turns into guest-visible consequences (a vCPU stops or starts executing) and timer events.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::rankset::RankSet;
use crate::scenario::HostPolicy;
use crate::time::Ns;
use pcpuset::PcpuSet;

#[derive(Debug, Clone)]
pub struct HostParams {
    pub policy: HostPolicy,
    pub latency: Ns,
    pub min_gran: Ns,
    pub wakeup_gran: Ns,
    pub llc_size: usize,
    pub alpha: f64,
    pub gang_slice: Ns,
    /// Host context switch + VM entry, paid by every vCPU that gets a pCPU.
    pub vcpu_switch: Ns,
    /// Paid on top when the pCPU last ran a different vCPU.
    pub cache_refill: Ns,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VState {
    Halted,
    Queued(u32),
    Running(u32),
}

/// Static description of one VM for the host.
#[derive(Debug, Clone)]
pub struct VmSpec {
    pub vcpus: usize,
    pub weight: u64,
    /// pCPUs the VM may use (sorted); None = all.
    pub allowed: Option<Vec<u32>>,
    /// Pin vCPU i to allowed[i].
    pub pinned: bool,
}

#[derive(Debug, Clone)]
pub struct HostVcpu {
    pub vm: u32,
    pub weight: u64,
    pub vruntime: u64,
    pub state: VState,
    pub last_pcpu: u32,
    pin: Option<u32>,
    allowed_vm: u32,
    run_start: Ns,
    exec_start: Ns,
    /// SBCO: adjusted in a balance round whose debt is not yet applied.
    pub dirty: bool,
    gang_pcpu: u32,
    pub switches_in: u64,
    pub preemptions: u64,
    pub migrations: u64,
}

#[derive(Default, Clone)]
pub struct Pcpu {
    rq: RankSet<(u64, u32)>,
    curr: Option<u32>,
    last_ran: Option<u32>,
    min_vruntime: u64,
    load: u64,
    tick_gen: u64,
    tick_armed: bool,
    /// SBCO debt list: (slow vCPU, fast vCPU that lent, vruntime lent).
    debts: Vec<(u32, u32, u64)>,
    /// CFS next buddy (set by a directed yield): picked over the leftmost task unless that
    /// would be unfair by more than wakeup_granularity.
    next_buddy: Option<u32>,
    balances: u64,
    /// Periodic balances in a row that found this busy pCPU one vCPU short of a queue in its
    /// span (the kernel's `nr_balance_failed`, kept per pCPU here), and at how many it pulls.
    one_short: u32,
    one_short_pull_at: u32,
    busy_since: Option<Ns>,
    pub busy_ns: Ns,
    /// Gang bindings: (VM, vCPU) pairs bound to this pCPU under co-scheduling.
    gang: Vec<(u32, u32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// `vcpu` now owns `pcpu`; it executes guest code after `overhead`.
    Run { pcpu: u32, vcpu: u32, overhead: Ns },
    /// `vcpu` lost `pcpu` and waits in a run queue.
    Preempted { pcpu: u32, vcpu: u32 },
    /// Re-check `pcpu`'s slice at `at`.
    Tick { pcpu: u32, at: Ns, gen: u64 },
    /// Next gang slot starts at `at`.
    Slot { at: Ns },
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct HostStats {
    pub vcpu_switches: u64,
    pub migrations: u64,
    pub sbco_boosts: u64,
    pub directed_yields: u64,
    pub gang_slots: u64,
}

/// A busy CPU balances this many times less often than an idle one (`sd->busy_factor`, set
/// in the kernel's `sd_init`).
const BUSY_FACTOR: u32 = 16;

/// What the host's scans read of a pCPU (wake-up placement, balancing): kept apart from
/// [`Pcpu`] (192 bytes) in a dense array, updated wherever the run queue or `curr` changes
/// ([`Host::sync_rq_load`]). A periodic balance looks at the whole host every 8th time: in
/// perf-1024 that is 32 M pCPUs looked at per simulated second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct RqLoad {
    /// vCPUs waiting in the run queue.
    queued: u32,
    /// A vCPU runs.
    running: bool,
}

pub struct Host {
    p: HostParams,
    pub vcpus: Vec<HostVcpu>,
    pub pcpus: Vec<Pcpu>,
    /// Each pCPU's [`RqLoad`].
    rq_load: Vec<RqLoad>,
    /// The pCPUs whose [`RqLoad`] is empty (nothing runs or waits), and those with a vCPU
    /// waiting: what wake-up placement and balancing search ([`pcpuset`]).
    idle_pcpus: PcpuSet,
    queued_pcpus: PcpuSet,
    vm_vcpus: Vec<Vec<u32>>,
    vm_allowed: Vec<Option<Vec<u32>>>,
    /// [vm × pcpus + p]: vCPUs of the VM running or queued on p (spreading policies only).
    occupancy: Vec<u16>,
    slot_vm: u32,
    /// Draws when a busy pCPU one vCPU short next pulls (see [`Host::balance`]).
    rng: ChaCha8Rng,
    pub stats: HostStats,
    pub fx: Vec<Effect>,
}

impl Host {
    /// `seed` spreads the vCPUs' initial vruntimes over one scheduling period, as if they
    /// had been running before time 0; otherwise every queue would start in the same order and
    /// all VMs would be co-scheduled by accident.
    pub fn new(p: HostParams, pcpus: usize, vms: &[VmSpec], seed: u64) -> Host {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(u64::MAX);
        let mut vcpus = Vec::new();
        let mut vm_vcpus = Vec::new();
        let mut pcpu_list: Vec<Pcpu> = vec![Pcpu::default(); pcpus];
        let mut gang_offset = 0usize;
        for (vm, spec) in vms.iter().enumerate() {
            let mut ids = Vec::new();
            for i in 0..spec.vcpus {
                let id = vcpus.len() as u32;
                let pin = if spec.pinned {
                    spec.allowed.as_ref().map(|a| a[i])
                } else {
                    None
                };
                let gang_pcpu = ((gang_offset + i) % pcpus) as u32;
                if p.policy.is_cosched() {
                    pcpu_list[gang_pcpu as usize].gang.push((vm as u32, id));
                }
                let first = pin.or_else(|| spec.allowed.as_ref().map(|a| a[i % a.len()]));
                vcpus.push(HostVcpu {
                    vm: vm as u32,
                    weight: spec.weight,
                    vruntime: rng.gen_range(0..p.latency.max(1)),
                    state: VState::Halted,
                    last_pcpu: first.unwrap_or(((gang_offset + i) % pcpus) as u32),
                    pin,
                    allowed_vm: vm as u32,
                    run_start: 0,
                    exec_start: 0,
                    dirty: false,
                    gang_pcpu,
                    switches_in: 0,
                    preemptions: 0,
                    migrations: 0,
                });
                ids.push(id);
            }
            gang_offset += spec.vcpus;
            vm_vcpus.push(ids);
        }
        let occupancy = if p.policy.spreads_siblings() {
            vec![0; vms.len() * pcpus]
        } else {
            Vec::new()
        };
        Host {
            p,
            vcpus,
            rq_load: vec![RqLoad::default(); pcpu_list.len()],
            idle_pcpus: PcpuSet::new(pcpu_list.len(), true),
            queued_pcpus: PcpuSet::new(pcpu_list.len(), false),
            pcpus: pcpu_list,
            vm_vcpus,
            vm_allowed: vms.iter().map(|v| v.allowed.clone()).collect(),
            occupancy,
            slot_vm: 0,
            rng,
            stats: HostStats::default(),
            fx: Vec::new(),
        }
    }

    pub fn policy(&self) -> HostPolicy {
        self.p.policy
    }

    pub fn slot_vm(&self) -> u32 {
        self.slot_vm
    }

    fn npcpus(&self) -> usize {
        self.pcpus.len()
    }

    pub fn nr_running(&self, p: usize) -> usize {
        let l = self.rq_load(p);
        l.queued as usize + usize::from(l.running)
    }

    /// `p`'s [`RqLoad`], checked against the pCPU itself in debug builds (the tests): a change
    /// of its run queue or `curr` that skipped [`Host::sync_rq_load`] fails there.
    fn rq_load(&self, p: usize) -> RqLoad {
        let l = self.rq_load[p];
        debug_assert_eq!(l, self.rq_load_of(p), "pCPU {p}'s run-queue load is stale");
        l
    }

    fn rq_load_of(&self, p: usize) -> RqLoad {
        RqLoad {
            queued: self.pcpus[p].rq.len() as u32,
            running: self.pcpus[p].curr.is_some(),
        }
    }

    /// Call after every change of `p`'s run queue or `curr`.
    fn sync_rq_load(&mut self, p: usize) {
        let l = self.rq_load_of(p);
        self.rq_load[p] = l;
        self.idle_pcpus.set(p, l == RqLoad::default());
        self.queued_pcpus.set(p, l.queued > 0);
    }

    /// The pCPU of `span` other than `p` with the most vCPUs (running or queued) among those
    /// with one waiting; on a tie the first after `p` in circular order, as the kernel's
    /// domain walk starts at the balancing CPU's own group (a lowest-numbered rule would
    /// always drain the same queues first, and favour the vCPUs on them). Only the pCPUs
    /// with one waiting are visited ([`Host::queued_pcpus`]): a whole-host balance spans
    /// every pCPU.
    fn busiest(&self, span: std::ops::Range<usize>, p: usize) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for q in self.queued_pcpus.iter_cyclic(span, p) {
            if q == p {
                continue;
            }
            let l = self.rq_load(q);
            let nr = l.queued as usize + usize::from(l.running);
            if best.is_none_or(|(b, _)| nr > b) {
                best = Some((nr, q));
            }
        }
        best.map(|(_, q)| q)
    }

    pub fn current(&self, p: usize) -> Option<u32> {
        self.pcpus[p].curr
    }

    /// The scheduling ordinate of a queued vCPU: tasks ahead of it in its run queue.
    pub fn ordinate(&self, v: u32) -> Option<usize> {
        match self.vcpus[v as usize].state {
            VState::Queued(q) => {
                let key = (self.vcpus[v as usize].vruntime, v);
                Some(self.pcpus[q as usize].rq.rank(&key))
            }
            _ => None,
        }
    }

    fn key(&self, v: u32) -> (u64, u32) {
        (self.vcpus[v as usize].vruntime, v)
    }

    fn tree_insert(&mut self, p: usize, v: u32) {
        let key = self.key(v);
        self.pcpus[p].rq.insert(key);
        self.sync_rq_load(p);
    }

    fn tree_remove(&mut self, p: usize, v: u32) {
        let key = self.key(v);
        self.pcpus[p].rq.remove(&key);
        self.sync_rq_load(p);
    }

    /// Count `v` as belonging to `p`'s run queue (running or queued).
    fn attach(&mut self, p: usize, v: u32) {
        let (vm, w) = (
            self.vcpus[v as usize].vm as usize,
            self.vcpus[v as usize].weight,
        );
        self.pcpus[p].load += w;
        if !self.occupancy.is_empty() {
            let n = self.npcpus();
            self.occupancy[vm * n + p] += 1;
        }
    }

    fn detach(&mut self, p: usize, v: u32) {
        let (vm, w) = (
            self.vcpus[v as usize].vm as usize,
            self.vcpus[v as usize].weight,
        );
        self.pcpus[p].load -= w;
        if !self.occupancy.is_empty() {
            let n = self.npcpus();
            self.occupancy[vm * n + p] -= 1;
        }
    }

    fn sibling_on(&self, vm: u32, p: usize) -> bool {
        !self.occupancy.is_empty() && self.occupancy[vm as usize * self.npcpus() + p] > 0
    }

    fn is_idle(&self, p: usize) -> bool {
        self.rq_load(p) == RqLoad::default()
    }

    fn update_curr(&mut self, p: usize, now: Ns) {
        if let Some(c) = self.pcpus[p].curr {
            let v = &mut self.vcpus[c as usize];
            let delta = now.saturating_sub(v.exec_start);
            v.vruntime += delta * 1024 / v.weight;
            v.exec_start = now;
        }
        self.update_min_vruntime(p);
    }

    fn update_min_vruntime(&mut self, p: usize) {
        let pc = &self.pcpus[p];
        let curr = pc.curr.map(|c| self.vcpus[c as usize].vruntime);
        let left = pc.rq.first().map(|(vr, _)| vr);
        let m = match (curr, left) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(m) = m {
            let pc = &mut self.pcpus[p];
            pc.min_vruntime = pc.min_vruntime.max(m);
        }
    }

    fn ideal_slice(&self, p: usize, v: u32) -> Ns {
        let nr = self.nr_running(p) as u64;
        let period = if nr * self.p.min_gran > self.p.latency {
            nr * self.p.min_gran
        } else {
            self.p.latency
        };
        let load = self.pcpus[p].load.max(1);
        period * self.vcpus[v as usize].weight / load
    }

    fn is_gang_owner(&self, v: u32, p: usize) -> bool {
        self.p.policy.is_cosched()
            && self.vcpus[v as usize].vm == self.slot_vm
            && self.vcpus[v as usize].gang_pcpu as usize == p
    }

    fn arm_tick(&mut self, p: usize, now: Ns) {
        let Some(c) = self.pcpus[p].curr else { return };
        if self.pcpus[p].rq.is_empty() || self.is_gang_owner(c, p) {
            self.pcpus[p].tick_armed = false;
            return;
        }
        let at = (self.vcpus[c as usize].run_start + self.ideal_slice(p, c)).max(now);
        let pc = &mut self.pcpus[p];
        pc.tick_gen += 1;
        pc.tick_armed = true;
        self.fx.push(Effect::Tick {
            pcpu: p as u32,
            at,
            gen: pc.tick_gen,
        });
    }

    /// A halted vCPU became runnable (an IPI or a timer for it arrived).
    pub fn wake(&mut self, v: u32, now: Ns) {
        debug_assert_eq!(self.vcpus[v as usize].state, VState::Halted);
        let p = self.select_rq(v);
        let prev = self.vcpus[v as usize].last_pcpu as usize;
        self.update_curr(p, now);
        if prev != p {
            // migrate_task_rq_fair: carry the vruntime relative to the old queue's minimum.
            self.update_curr(prev, now);
            let (old_min, new_min) = (self.pcpus[prev].min_vruntime, self.pcpus[p].min_vruntime);
            let hv = &mut self.vcpus[v as usize];
            hv.vruntime = (hv.vruntime + new_min).saturating_sub(old_min);
            hv.migrations += 1;
            self.stats.migrations += 1;
        }
        // place_entity: a sleeper keeps its vruntime but gets at most latency/2 of credit.
        let floor = self.pcpus[p]
            .min_vruntime
            .saturating_sub(self.p.latency / 2);
        let hv = &mut self.vcpus[v as usize];
        hv.vruntime = hv.vruntime.max(floor);
        hv.state = VState::Queued(p as u32);
        self.attach(p, v);
        self.tree_insert(p, v);
        self.after_enqueue(p, v, now);
    }

    fn after_enqueue(&mut self, p: usize, v: u32, now: Ns) {
        match self.pcpus[p].curr {
            None => self.schedule(p, now),
            Some(c) => {
                if self.should_preempt(p, c, v, now) {
                    self.schedule(p, now);
                } else if !self.pcpus[p].tick_armed {
                    self.arm_tick(p, now);
                }
            }
        }
    }

    fn should_preempt(&mut self, p: usize, curr: u32, woken: u32, now: Ns) -> bool {
        if self.p.policy.is_cosched() {
            if self.is_gang_owner(woken, p) {
                return true;
            }
            if self.is_gang_owner(curr, p) || self.p.policy == HostPolicy::CoschedStrict {
                return false;
            }
        }
        self.update_curr(p, now);
        let w = &self.vcpus[woken as usize];
        let gran = self.p.wakeup_gran * 1024 / w.weight;
        self.vcpus[curr as usize].vruntime > w.vruntime + gran
    }

    /// The running vCPU halted (its guest has nothing to run).
    pub fn block(&mut self, v: u32, now: Ns) {
        let VState::Running(p) = self.vcpus[v as usize].state else {
            debug_assert!(false, "block of a vCPU that is not running");
            return;
        };
        let p = p as usize;
        self.update_curr(p, now);
        self.vcpus[v as usize].state = VState::Halted;
        self.pcpus[p].curr = None;
        self.sync_rq_load(p);
        self.detach(p, v);
        self.schedule(p, now);
    }

    /// Re-pick what runs on `p` now (the Linux `schedule()` after `resched_curr`).
    pub fn schedule(&mut self, p: usize, now: Ns) {
        self.update_curr(p, now);
        let prev = self.pcpus[p].curr;
        if let Some(c) = prev {
            self.tree_insert(p, c);
        }
        let mut next = self.pick(p);
        if next.is_none() && !self.p.policy.is_cosched() && self.newidle_balance(p, now) {
            next = self.pick(p);
        }
        if let (Some(c), Some(n)) = (prev, next) {
            if c == n {
                // Re-picked (still leftmost): like set_next_entity, its slice starts afresh.
                self.tree_remove(p, c);
                self.vcpus[c as usize].run_start = now;
                self.arm_tick(p, now);
                return;
            }
        }
        if let Some(c) = prev {
            self.vcpus[c as usize].state = VState::Queued(p as u32);
            self.vcpus[c as usize].preemptions += 1;
            self.pcpus[p].curr = None;
            self.sync_rq_load(p);
            self.fx.push(Effect::Preempted {
                pcpu: p as u32,
                vcpu: c,
            });
        }
        match next {
            Some(n) => {
                // Out of the queue and into `curr`: one sync of the load below for both.
                let key = self.key(n);
                self.pcpus[p].rq.remove(&key);
                let refill = self.pcpus[p].last_ran != Some(n);
                let overhead = self.p.vcpu_switch + if refill { self.p.cache_refill } else { 0 };
                let pc = &mut self.pcpus[p];
                pc.curr = Some(n);
                pc.last_ran = Some(n);
                if pc.busy_since.is_none() {
                    pc.busy_since = Some(now);
                }
                self.sync_rq_load(p);
                let hv = &mut self.vcpus[n as usize];
                hv.state = VState::Running(p as u32);
                hv.run_start = now;
                hv.exec_start = now;
                hv.last_pcpu = p as u32;
                hv.switches_in += 1;
                self.stats.vcpu_switches += 1;
                self.fx.push(Effect::Run {
                    pcpu: p as u32,
                    vcpu: n,
                    overhead,
                });
                self.arm_tick(p, now);
            }
            None => {
                let pc = &mut self.pcpus[p];
                if let Some(since) = pc.busy_since.take() {
                    pc.busy_ns += now - since;
                }
                pc.tick_armed = false;
            }
        }
    }

    /// Close busy-time accounting at the end of a run.
    pub fn finish(&mut self, now: Ns) {
        for pc in &mut self.pcpus {
            if let Some(since) = pc.busy_since.take() {
                pc.busy_ns += now - since;
            }
        }
    }

    fn pick(&mut self, p: usize) -> Option<u32> {
        if let Some(b) = self.pcpus[p].next_buddy.take() {
            let left = self.pcpus[p].rq.first();
            let hv = &self.vcpus[b as usize];
            let fair = left
                .is_some_and(|(vr, _)| hv.vruntime <= vr + self.p.wakeup_gran * 1024 / hv.weight);
            if hv.state == VState::Queued(p as u32) && fair && !self.p.policy.is_cosched() {
                return Some(b);
            }
        }
        match self.p.policy {
            HostPolicy::Cfs | HostPolicy::Bal => self.pcpus[p].rq.first().map(|(_, v)| v),
            HostPolicy::Sbco => {
                self.apply_debts(p);
                self.sbco_pick(p)
            }
            HostPolicy::CoschedStrict | HostPolicy::CoschedRelaxed => {
                let owner = self.pcpus[p]
                    .gang
                    .iter()
                    .find(|(vm, _)| *vm == self.slot_vm)
                    .map(|&(_, v)| v)
                    .filter(|&v| self.vcpus[v as usize].state == VState::Queued(p as u32));
                match (owner, self.p.policy) {
                    (Some(v), _) => Some(v),
                    (None, HostPolicy::CoschedStrict) => None,
                    (None, _) => self.pcpus[p].rq.first().map(|(_, v)| v),
                }
            }
        }
    }

    /// SBCO Algorithm 1.
    fn sbco_pick(&mut self, p: usize) -> Option<u32> {
        let (_, a) = self.pcpus[p].rq.first()?;
        let ord_a = self.pcpus[p].rq.rank(&self.key(a));
        let vm = self.vcpus[a as usize].vm as usize;
        for i in 0..self.vm_vcpus[vm].len() {
            let b = self.vm_vcpus[vm][i];
            if b == a || self.vcpus[b as usize].dirty {
                continue;
            }
            let VState::Queued(q) = self.vcpus[b as usize].state else {
                continue;
            };
            let q = q as usize;
            let ord_b = self.pcpus[q].rq.rank(&self.key(b));
            let delta = ord_a.abs_diff(ord_b);
            let threshold = self.p.alpha * self.nr_running(q) as f64;
            if delta > 0 && delta as f64 >= threshold {
                let successor = self.pcpus[p].rq.select(1).map(|(_, v)| v);
                self.sbco_balance(a, p, b, q, delta);
                self.stats.sbco_boosts += 1;
                return successor.or(Some(a));
            }
        }
        Some(a)
    }

    /// SBCO SCHED_BALANCE: the fast vCPU `a` lends vruntime to its slow sibling `b`. The lend
    /// is half the ordinate distance in slices of `b`'s queue, so both move toward the middle
    /// of their queues; `b`'s share waits in its queue's debt list.
    fn sbco_balance(&mut self, a: u32, p: usize, b: u32, q: usize, delta: usize) {
        if self.vcpus[a as usize].dirty {
            return;
        }
        let nr = self.nr_running(q).max(1) as u64;
        let slice = (self.p.latency / nr).max(self.p.min_gran);
        let lend = delta.div_ceil(2) as u64 * slice;
        self.tree_remove(p, a);
        self.vcpus[a as usize].vruntime += lend;
        self.tree_insert(p, a);
        self.vcpus[a as usize].dirty = true;
        self.vcpus[b as usize].dirty = true;
        self.pcpus[q].debts.push((b, a, lend));
    }

    fn apply_debts(&mut self, q: usize) {
        let debts = std::mem::take(&mut self.pcpus[q].debts);
        for (b, a, lend) in debts {
            if self.vcpus[b as usize].state == VState::Queued(q as u32) {
                self.tree_remove(q, b);
                let floor = self.pcpus[q].min_vruntime.saturating_sub(self.p.latency);
                let hv = &mut self.vcpus[b as usize];
                hv.vruntime = hv.vruntime.saturating_sub(lend).max(floor);
                self.tree_insert(q, b);
            }
            self.vcpus[b as usize].dirty = false;
            self.vcpus[a as usize].dirty = false;
        }
    }

    fn allowed(&self, v: u32, p: usize) -> bool {
        let hv = &self.vcpus[v as usize];
        if let Some(pin) = hv.pin {
            return pin as usize == p;
        }
        match &self.vm_allowed[hv.allowed_vm as usize] {
            Some(list) => list.binary_search(&(p as u32)).is_ok(),
            None => true,
        }
    }

    fn domain(&self, p: usize) -> std::ops::Range<usize> {
        let size = self.p.llc_size.min(self.npcpus());
        let start = p / size * size;
        start..(start + size).min(self.npcpus())
    }

    /// Wakeup placement (select_task_rq_fair, simplified).
    fn select_rq(&self, v: u32) -> usize {
        let hv = &self.vcpus[v as usize];
        if let Some(pin) = hv.pin {
            return pin as usize;
        }
        if self.p.policy.is_cosched() {
            return hv.gang_pcpu as usize;
        }
        let vm = hv.vm;
        let prev = hv.last_pcpu as usize;
        let spreads = self.p.policy.spreads_siblings();
        let ok = |q: usize| self.allowed(v, q) && !(spreads && self.sibling_on(vm, q));
        if ok(prev) && self.is_idle(prev) {
            return prev;
        }
        // The VM's allowed pCPUs if it has a list, else prev's LLC domain starting at prev.
        let list: &[u32] = self.vm_allowed[vm as usize].as_deref().unwrap_or(&[]);
        let d = self.domain(prev);
        let len = if self.vm_allowed[vm as usize].is_some() {
            0
        } else {
            d.len()
        };
        let candidates = || {
            list.iter()
                .map(|&c| c as usize)
                .chain((0..len).map(move |i| {
                    // (prev - d.start + i) % len without a division (both terms < len):
                    // this search runs at every wakeup of a halted vCPU.
                    let j = prev - d.start + i;
                    d.start + if j >= len { j - len } else { j }
                }))
        };
        if self.vm_allowed[vm as usize].is_none() {
            // Every pCPU of the domain is allowed (no pin either, see above), and an idle one
            // has no sibling on it (it runs and queues nothing): the first idle one from prev
            // is the walk's.
            if let Some(q) = self.idle_pcpus.iter_cyclic(d.clone(), prev).next() {
                return q;
            }
        } else if let Some(q) = candidates().find(|&q| ok(q) && self.is_idle(q)) {
            return q;
        }
        if ok(prev) {
            return prev;
        }
        candidates()
            .filter(|&q| ok(q))
            .min_by_key(|&q| self.nr_running(q))
            .or_else(|| {
                (0..self.npcpus())
                    .filter(|&q| ok(q))
                    .min_by_key(|&q| self.nr_running(q))
            })
            .unwrap_or(prev)
    }

    /// A queued task on `q` that may move to `p`, preferring the one with most vruntime (the
    /// one that would wait longest where it is).
    fn movable(&self, q: usize, p: usize) -> Option<u32> {
        let rq = &self.pcpus[q].rq;
        let spreads = self.p.policy.spreads_siblings();
        (0..rq.len())
            .rev()
            .filter_map(|i| rq.select(i))
            .map(|(_, v)| v)
            .find(|&v| {
                self.allowed(v, p) && !(spreads && self.sibling_on(self.vcpus[v as usize].vm, p))
            })
    }

    fn migrate(&mut self, v: u32, from: usize, to: usize, now: Ns) {
        self.update_curr(from, now);
        self.update_curr(to, now);
        self.tree_remove(from, v);
        self.detach(from, v);
        let (src_min, dst_min) = (self.pcpus[from].min_vruntime, self.pcpus[to].min_vruntime);
        let hv = &mut self.vcpus[v as usize];
        hv.vruntime = (hv.vruntime + dst_min).saturating_sub(src_min);
        hv.state = VState::Queued(to as u32);
        hv.last_pcpu = to as u32;
        hv.migrations += 1;
        self.stats.migrations += 1;
        self.attach(to, v);
        self.tree_insert(to, v);
    }

    /// `p` is about to go idle: pull one queued task from the busiest queue of its domain.
    fn newidle_balance(&mut self, p: usize, now: Ns) -> bool {
        if let Some(q) = self.busiest(self.domain(p), p) {
            if let Some(v) = self.movable(q, p) {
                self.migrate(v, q, p, now);
                return true;
            }
        }
        false
    }

    /// Periodic load balancing on `p`.
    pub fn balance(&mut self, p: usize, now: Ns) {
        if self.p.policy.is_cosched() {
            return;
        }
        self.pcpus[p].balances += 1;
        let whole_host = self.pcpus[p].balances.is_multiple_of(8);
        let span = if whole_host {
            0..self.npcpus()
        } else {
            self.domain(p)
        };
        let here = self.nr_running(p);
        let Some(q) = self.busiest(span, p) else {
            self.pcpus[p].one_short = 0;
            return;
        };
        let there = self.nr_running(q);
        if there < here + 2 {
            // One vCPU more over there (2 against 1, say): moving one only swaps the
            // imbalance, and the kernel's first try moves nothing (a vCPU's load exceeds the
            // half-vCPU imbalance). A failed try halves the load it compares
            // (`nr_balance_failed`), so the next one moves a vCPU: over a few hundred ms the
            // vCPUs that share pCPUs take turns, and no VM keeps the pCPUs of its own that a
            // start-up's placement gave it (the kernel relies on this since "sched/fair:
            // Reduce cases for active balance", 2021). A busy pCPU balances every
            // `BUSY_FACTOR` intervals, so the pull comes after about two of its balances; when
            // exactly is drawn (1 to 3 busy intervals): in lockstep with the queues' slices
            // it would find the same vCPU waiting every time and toss that one back and forth
            // while the others kept their pCPUs.
            if there == here + 1 && here >= 1 {
                if self.pcpus[p].one_short == 0 {
                    self.pcpus[p].one_short_pull_at =
                        self.rng.gen_range(BUSY_FACTOR..=3 * BUSY_FACTOR);
                }
                self.pcpus[p].one_short += 1;
                if self.pcpus[p].one_short >= self.pcpus[p].one_short_pull_at {
                    self.pcpus[p].one_short = 0;
                    if let Some(v) = self.movable(q, p) {
                        self.migrate(v, q, p, now);
                        self.after_enqueue(p, v, now);
                    }
                }
            } else {
                self.pcpus[p].one_short = 0;
            }
            return;
        }
        self.pcpus[p].one_short = 0;
        if let Some(v) = self.movable(q, p) {
            self.migrate(v, q, p, now);
            self.after_enqueue(p, v, now);
        }
    }

    /// Pause-loop exit of a spinning vCPU: KVM's directed yield (`kvm_vcpu_on_spin` →
    /// `yield_to(target, preempt=true)`): the preempted lock holder becomes its queue's next
    /// buddy and that queue reschedules now. Its vruntime is untouched, so the boost is
    /// bounded by wakeup_granularity, as in CFS.
    pub fn yield_to(&mut self, target: u32, now: Ns) {
        let VState::Queued(q) = self.vcpus[target as usize].state else {
            return;
        };
        let q = q as usize;
        self.stats.directed_yields += 1;
        self.pcpus[q].next_buddy = Some(target);
        self.schedule(q, now);
    }

    /// Start the next gang slot (co-scheduling only).
    pub fn gang_slot(&mut self, now: Ns) {
        let nvms = self.vm_vcpus.len() as u32;
        let runnable = |h: &Host, vm: u32| {
            h.vm_vcpus[vm as usize]
                .iter()
                .any(|&v| h.vcpus[v as usize].state != VState::Halted)
        };
        let mut next = (self.slot_vm + 1) % nvms;
        for _ in 0..nvms {
            if runnable(self, next) {
                break;
            }
            next = (next + 1) % nvms;
        }
        self.slot_vm = next;
        self.stats.gang_slots += 1;
        for p in 0..self.npcpus() {
            self.schedule(p, now);
        }
        self.fx.push(Effect::Slot {
            at: now + self.p.gang_slice,
        });
    }

    /// A slice timer fired.
    pub fn tick(&mut self, p: usize, gen: u64, now: Ns) {
        if self.pcpus[p].tick_gen != gen {
            return;
        }
        self.pcpus[p].tick_armed = false;
        let Some(c) = self.pcpus[p].curr else { return };
        if self.pcpus[p].rq.is_empty() || self.is_gang_owner(c, p) {
            return;
        }
        self.update_curr(p, now);
        let ran = now - self.vcpus[c as usize].run_start;
        if ran >= self.ideal_slice(p, c) {
            self.schedule(p, now);
        } else {
            self.arm_tick(p, now);
        }
    }
}

mod pcpuset;
#[cfg(test)]
mod tests;
