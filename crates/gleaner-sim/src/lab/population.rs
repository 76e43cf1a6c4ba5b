//! The lab's population: scenarios generated from a grid of workload kind × synchronization
//! granularity × VM size × host contention × host policy, in three disjoint sets.
//!
//! A full factorial grid (12 kinds × 3 grains × 3 sizes × 4 contentions) is 432 scenarios,
//! too many to simulate with every policy in minutes on two cores, so each set takes a
//! Latin-square slice of it: every (kind, grain) pair once, with the VM size and the
//! contention rotating so that every kind meets every VM size in each set, and every
//! contention level across the two sets (two levels per set: `w + 2g` takes two values
//! modulo 4 over the three grains).
//!
//! **The split rule** (tuning vs held-out), fixed here and in the README:
//! * grains: tuning uses 10 µs, 100 µs and 1 ms; held-out uses twice those (20 µs, 200 µs,
//!   2 ms), so no held-out scenario has a parameter value a tuning scenario had;
//! * rotation: scenario `k` (kind index `w`, grain index `g`) gets size `SIZES[(w + g) % 3]`
//!   and contention `CONTENTIONS[(w + 2g + offset) % 4]` with offset 0 (tuning) or 1
//!   (held-out), so the (kind, size, contention) combinations differ too;
//! * seeds: tuning `1000 + k`, held-out `2000 + k`;
//! * host policy: CFS, except every scenario with `k % 5 == 4` whose host is shared, which
//!   runs BAL (tuning) or SBCO (held-out).
//!
//! **A third set, `fresh`**, is run only when asked for (`gleaner sim lab --set fresh`): a
//! check of what neither of the others can show, how the policy does on scenarios nobody
//! looked at while changing it (it was added at a commit whose policy was already fixed, and
//! first run there). Grains five times the tuning ones (50 µs, 500 µs, 5 ms), contention
//! offset 2 (with the sizes rotating as in the others, every (kind, size, contention)
//! combination is one neither set has), seeds `3000 + k`, and BAL or SBCO on alternate
//! shared `k % 5 == 4` hosts. Once a change has been tuned against it, it is no longer fresh: a
//! later check needs another.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::scenario::{GuestPolicy, HostPolicy, Scenario, VmConfig};
use crate::time::{Dur, Ns, MS, US};
use crate::workload::{Dist, Op, ThreadGroup};

/// Which set of the population (see the module's split rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LabSet {
    Tuning,
    HeldOut,
    /// Run only on request: scenarios the policy was never looked at against.
    Fresh,
    /// Drawn at random from a seed (`--draw SEED`, [`drawn_population`]): as many fresh
    /// populations as there are seeds.
    #[value(skip)]
    Drawn,
}

impl LabSet {
    pub fn name(self) -> &'static str {
        match self {
            LabSet::Tuning => "tuning",
            LabSet::HeldOut => "held-out",
            LabSet::Fresh => "fresh",
            LabSet::Drawn => "drawn",
        }
    }

    /// The grid's split rule for this set (the module's doc); `None` for a drawn set.
    fn grid_rule(self) -> Option<GridRule> {
        use HostPolicy::{Bal, Sbco};
        let (grain_factor, rotation, seed_base, shared_policies) = match self {
            LabSet::Tuning => (1, 0, 1000, [Bal, Bal]),
            LabSet::HeldOut => (2, 1, 2000, [Sbco, Sbco]),
            LabSet::Fresh => (5, 2, 3000, [Bal, Sbco]),
            LabSet::Drawn => return None,
        };
        Some(GridRule {
            grain_factor,
            rotation,
            seed_base,
            shared_policies,
        })
    }
}

/// How one grid set differs from the others (the module's split rule).
struct GridRule {
    grain_factor: u64,
    rotation: usize,
    seed_base: u64,
    /// The host policy of every fifth scenario whose host is shared, alternating between
    /// the two from one such scenario to the next.
    shared_policies: [HostPolicy; 2],
}

/// The benchmark VM's workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// dedup-like: a 3-stage pipeline over bounded queues with an allocator lock.
    Pipeline,
    /// streamcluster-like: parallel compute, then a barrier.
    Barrier,
    /// OLTP-like: 2 connections per vCPU: compute, a global lock, a client round trip.
    Oltp,
    /// Ping-pong pairs handing a token through one-slot queues.
    Pingpong,
    /// Producers and consumers over one bounded queue.
    ProducerConsumer,
    /// Every thread takes one hot lock for a quarter of its work.
    LockHeavy,
    /// Independent compute: nothing to gain from consolidation.
    CpuBound,
    /// Compute then sleep (timer wake-ups on the thread's own vCPU).
    TimerHeavy,
    /// Barrier rounds whose grain switches between fine (the set's first grain) and coarse
    /// (100x) every phase.
    PhaseGrain,
    /// Barrier rounds at the grain, with a quarter of the threads working in one phase and all
    /// of them in the next.
    PhaseThreads,
    /// Barrier rounds at the grain, then as long a phase of independent compute joined at its
    /// end: the bulk-synchronous pattern of a solver or a training loop, whose two phases
    /// want opposite settings (packing for the first, every vCPU for the second).
    PhaseCompute,
    /// Ping-pong pairs for a phase, then as long a phase of independent compute joined at its
    /// end: a request/response exchange between pairs of threads (an RPC or a producer
    /// handing work to its consumer one item at a time) alternating with a batch computation.
    /// The exchange wants each pair on one vCPU (a same-vCPU wake-up costs no IPI and no halt),
    /// the computation every vCPU.
    PhasePingpong,
}

pub const KINDS: [Kind; 12] = [
    Kind::Pipeline,
    Kind::Barrier,
    Kind::Oltp,
    Kind::Pingpong,
    Kind::ProducerConsumer,
    Kind::LockHeavy,
    Kind::CpuBound,
    Kind::TimerHeavy,
    Kind::PhaseGrain,
    Kind::PhaseThreads,
    Kind::PhaseCompute,
    Kind::PhasePingpong,
];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pipeline => "pipeline",
            Kind::Barrier => "barrier",
            Kind::Oltp => "oltp",
            Kind::Pingpong => "pingpong",
            Kind::ProducerConsumer => "prodcons",
            Kind::LockHeavy => "lock",
            Kind::CpuBound => "cpu",
            Kind::TimerHeavy => "timer",
            Kind::PhaseGrain => "phase-grain",
            Kind::PhaseThreads => "phase-threads",
            Kind::PhaseCompute => "phase-compute",
            Kind::PhasePingpong => "phase-pingpong",
        }
    }
    pub fn is_phased(self) -> bool {
        matches!(
            self,
            Kind::PhaseGrain | Kind::PhaseThreads | Kind::PhaseCompute | Kind::PhasePingpong
        )
    }
}

/// What else runs on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Contention {
    /// The benchmark VM alone, one pCPU per vCPU.
    Dedicated,
    /// One CPU-bound co-runner VM of half the size.
    OneCoRunner,
    /// Two co-runners of half the size: CPU-bound, and a bursty one (compute, sleep).
    TwoCoRunners,
    /// A CPU-bound co-runner as large as the benchmark VM: twice as many vCPUs as pCPUs.
    Oversubscribed,
}

pub const CONTENTIONS: [Contention; 4] = [
    Contention::Dedicated,
    Contention::OneCoRunner,
    Contention::TwoCoRunners,
    Contention::Oversubscribed,
];
pub const SIZES: [usize; 3] = [4, 8, 16];
const GRAINS_NS: [Ns; 3] = [10 * US, 100 * US, MS];

impl Contention {
    pub fn name(self) -> &'static str {
        match self {
            Contention::Dedicated => "dedicated",
            Contention::OneCoRunner => "1-co-runner",
            Contention::TwoCoRunners => "2-co-runners",
            Contention::Oversubscribed => "2:1",
        }
    }
}

/// One member of the population.
#[derive(Debug, Clone, Serialize)]
pub struct LabScenario {
    pub name: String,
    pub set: LabSet,
    pub kind: Kind,
    pub grain_ns: Ns,
    pub vcpus: usize,
    pub contention: Contention,
    pub host_policy: HostPolicy,
    pub seed: u64,
    pub duration_ns: Ns,
}

/// The scenarios of one grid set, in a fixed order; none for [`LabSet::Drawn`], whose
/// scenarios come from [`drawn_population`].
pub fn population(set: LabSet, duration: Ns) -> Vec<LabScenario> {
    let Some(rule) = set.grid_rule() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (w, &kind) in KINDS.iter().enumerate() {
        for (g, &grain) in GRAINS_NS.iter().enumerate() {
            let k = out.len();
            let vcpus = SIZES[(w + g) % SIZES.len()];
            let contention = CONTENTIONS[(w + 2 * g + rule.rotation) % CONTENTIONS.len()];
            let host_policy = if k % 5 == 4 && contention != Contention::Dedicated {
                rule.shared_policies[(k / 5) % 2]
            } else {
                HostPolicy::Cfs
            };
            let grain_ns = grain * rule.grain_factor;
            out.push(LabScenario::new(
                set,
                kind,
                grain_ns,
                vcpus,
                contention,
                host_policy,
                rule.seed_base + k as u64,
                duration,
            ));
        }
    }
    out
}

/// The shortest and longest grain a drawn scenario gets: the grid sets' span (10 µs to 5 ms),
/// down to 5 µs.
pub const DRAWN_GRAINS_NS: (Ns, Ns) = (5 * US, 5 * MS);

/// `count` scenarios drawn at random from `draw` (a ChaCha8 stream, so the same seed gives the
/// same population on every machine): kind, VM size and contention uniform, the grain
/// log-uniform over [`DRAWN_GRAINS_NS`] in whole microseconds, and on a shared host BAL or
/// SBCO one time in five each, else CFS (the grid sets' share). A scenario whose name another
/// already has gets `-2`, `-3`, … appended.
///
/// Why besides the grid: the grid's sets are fixed, and each one looked at while changing
/// the policy stops being a test of what it was not changed for. A drawn population is new
/// for every seed never used before, and its grains fall between the grid's, so a policy
/// that fits the grid's values shows it here.
pub fn drawn_population(draw: u64, count: usize, duration: Ns) -> Vec<LabScenario> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(draw);
    let (lo, hi) = (DRAWN_GRAINS_NS.0 as f64, DRAWN_GRAINS_NS.1 as f64);
    let mut out: Vec<LabScenario> = Vec::with_capacity(count);
    for _ in 0..count {
        let kind = KINDS[rng.gen_range(0..KINDS.len())];
        let grain = (lo * (hi / lo).powf(rng.gen::<f64>()) / US as f64).round() as Ns * US;
        let vcpus = SIZES[rng.gen_range(0..SIZES.len())];
        let contention = CONTENTIONS[rng.gen_range(0..CONTENTIONS.len())];
        let policy_draw: f64 = rng.gen();
        let host_policy = match contention {
            Contention::Dedicated => HostPolicy::Cfs,
            _ if policy_draw < 0.1 => HostPolicy::Bal,
            _ if policy_draw < 0.2 => HostPolicy::Sbco,
            _ => HostPolicy::Cfs,
        };
        let seed = rng.gen::<u32>() as u64;
        let mut s = LabScenario::new(
            LabSet::Drawn,
            kind,
            grain.clamp(DRAWN_GRAINS_NS.0, DRAWN_GRAINS_NS.1),
            vcpus,
            contention,
            host_policy,
            seed,
            duration,
        );
        let base = s.name.clone();
        let mut n = 2;
        while out.iter().any(|o| o.name == s.name) {
            s.name = format!("{base}-{n}");
            n += 1;
        }
        out.push(s);
    }
    out
}

impl LabScenario {
    /// A scenario named after its parameters; phase-changing kinds run `PHASES_PER_RUN`
    /// times `duration`, since each phase needs time to show.
    #[allow(clippy::too_many_arguments)]
    fn new(
        set: LabSet,
        kind: Kind,
        grain_ns: Ns,
        vcpus: usize,
        contention: Contention,
        host_policy: HostPolicy,
        seed: u64,
        duration: Ns,
    ) -> Self {
        let duration_ns = if kind.is_phased() {
            PHASES_PER_RUN * duration
        } else {
            duration
        };
        LabScenario {
            name: format!(
                "{}-{}us-{}v-{}-{}",
                kind.name(),
                grain_ns / US,
                vcpus,
                contention.name(),
                host_policy.name()
            ),
            set,
            kind,
            grain_ns,
            vcpus,
            contention,
            host_policy,
            seed,
            duration_ns,
        }
    }
}

/// How the benchmark VM is run in one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GuestChoice {
    pub guest: GuestPolicy,
    /// A fixed cpuset of this many vCPUs (the static oracle's settings).
    pub active_vcpus: Option<usize>,
    /// The application reports progress to the policy (`vm.app_progress`).
    pub app_progress: bool,
    /// The guest has a cpuidle POLL state, so retention holds by polling
    /// (`GuestConfig::retention_polls`): Gleaner as it runs on a guest where `haltpoll` could.
    pub retention_polls: bool,
}

impl GuestChoice {
    pub fn label(&self) -> String {
        match (self.active_vcpus, self.guest) {
            (Some(k), GuestPolicy::Hold) => format!("static-{k}+retain"),
            (Some(k), _) => format!("static-{k}"),
            (None, g) if self.app_progress => format!("{}+progress", g.name()),
            (None, g) if self.retention_polls => format!("{}@poll", g.name()),
            (None, g) => g.name().to_string(),
        }
    }
}

/// Phases in a phase-changing scenario's run: fine, coarse, fine, coarse (thread counts:
/// all, few, all, few), so that a policy must also notice the change back. Each phase lasts
/// as long as a run of the other kinds (2 s by default): "every few seconds", as a program
/// whose input or thread count changes does, and as issue 16 asks. Half a second (five
/// 100 ms periods) was used first: shorter than the start-up, a first change and its verdict
/// together, so no period-based policy could use a phase before it ended.
const PHASES_PER_RUN: u64 = 4;

fn c(d: Dist) -> Op {
    Op::Compute(d)
}
fn jitter(grain: Ns) -> Dist {
    Dist::Uniform(grain * 6 / 10, grain * 14 / 10)
}
fn name(s: &str) -> String {
    s.to_string()
}
/// `rounds` rounds of compute about `grain` long, each ending at `barrier`.
fn barrier_rounds(grain: Ns, rounds: u64, barrier: &str) -> Vec<Op> {
    (0..rounds)
        .flat_map(|_| [c(jitter(grain)), Op::Barrier(name(barrier))])
        .collect()
}

/// The benchmark workload: thread groups, queue capacities, barrier parties. For a
/// phase-changing kind, `only_phase` keeps one of its two phases, repeated (see
/// [`LabScenario::build_phase`]).
fn workload(
    kind: Kind,
    grain: Ns,
    n: usize,
    phase_ns: Ns,
    only_phase: Option<usize>,
) -> (
    Vec<ThreadGroup>,
    BTreeMap<String, usize>,
    BTreeMap<String, usize>,
) {
    let group = |count: usize, program: Vec<Op>| ThreadGroup {
        count,
        pin: None,
        iterations: None,
        program,
    };
    let mut queues = BTreeMap::new();
    let mut barriers = BTreeMap::new();
    let threads = match kind {
        Kind::Pipeline => {
            queues.insert(name("a"), 32);
            queues.insert(name("b"), 32);
            let lock = |hold: Ns| {
                [
                    Op::Lock(name("alloc")),
                    c(Dist::Exp(hold.max(1))),
                    Op::Unlock(name("alloc")),
                ]
            };
            let mut first = vec![c(Dist::Exp(grain))];
            first.extend(lock(grain / 4));
            first.push(Op::Push(name("a")));
            let mut mid = vec![Op::Pop(name("a")), c(Dist::Exp(2 * grain))];
            mid.extend(lock(grain / 4));
            mid.push(Op::Push(name("b")));
            let last = vec![Op::Pop(name("b")), c(Dist::Exp(grain))];
            vec![
                group(1.max(n / 4), first),
                group(n, mid),
                group(1.max(n / 4), last),
            ]
        }
        Kind::Barrier => vec![group(n, vec![c(jitter(grain)), Op::Barrier(name("round"))])],
        Kind::Oltp => vec![group(
            2 * n,
            vec![
                c(Dist::Exp(grain)),
                Op::Lock(name("global")),
                c(Dist::Exp((grain / 10).max(1))),
                Op::Unlock(name("global")),
                c(Dist::Exp(grain)),
                Op::Sleep(Dist::Exp(2 * grain)),
            ],
        )],
        Kind::Pingpong => {
            let mut out = Vec::new();
            for p in 0..(n / 2).max(1) {
                let (ping, pong) = (format!("ping{p}"), format!("pong{p}"));
                queues.insert(ping.clone(), 1);
                queues.insert(pong.clone(), 1);
                out.push(group(
                    1,
                    vec![
                        c(jitter(grain)),
                        Op::Push(ping.clone()),
                        Op::Pop(pong.clone()),
                    ],
                ));
                out.push(group(
                    1,
                    vec![Op::Pop(ping), c(jitter(grain)), Op::Push(pong)],
                ));
            }
            out
        }
        Kind::ProducerConsumer => {
            queues.insert(name("q"), 16);
            vec![
                group(
                    (n / 2).max(1),
                    vec![c(Dist::Exp(grain)), Op::Push(name("q"))],
                ),
                group(
                    (n / 2).max(1),
                    vec![Op::Pop(name("q")), c(Dist::Exp(grain))],
                ),
            ]
        }
        Kind::LockHeavy => vec![group(
            n,
            vec![
                c(Dist::Exp(grain)),
                Op::Lock(name("hot")),
                c(Dist::Exp((grain / 4).max(1))),
                Op::Unlock(name("hot")),
            ],
        )],
        Kind::CpuBound => vec![group(n, vec![c(Dist::Const(grain.max(100 * US)))])],
        Kind::TimerHeavy => vec![group(
            n,
            vec![c(jitter(grain)), Op::Sleep(Dist::Exp(grain))],
        )],
        Kind::PhaseGrain => {
            // One loop = a fine phase then a coarse phase, each about `phase_ns` long.
            let shape = phase_shape(kind, grain, n, phase_ns);
            let coarse = grain * 100;
            let mut program = Vec::new();
            if only_phase != Some(1) {
                program.extend(barrier_rounds(grain, shape.rounds[0], "round"));
            }
            if only_phase != Some(0) {
                program.extend(barrier_rounds(coarse, shape.rounds[1], "round"));
            }
            vec![group(n, program)]
        }
        Kind::PhaseThreads => {
            // A quarter of the threads synchronize at the grain all the time; the others join
            // them for one phase and sleep through the next.
            let few = (n / 4).max(1);
            let rounds = phase_shape(kind, grain, n, phase_ns).rounds[0];
            let program = barrier_rounds(grain, rounds, "all");
            if only_phase != Some(1) {
                barriers.insert(name("all"), n);
            }
            let mut sleepers = if only_phase == Some(1) {
                Vec::new()
            } else {
                program.clone()
            };
            if only_phase != Some(0) {
                sleepers.push(Op::Sleep(Dist::Const(phase_ns)));
            }
            // The steady quarter also waits for the others' phase at the barrier, and then
            // keeps a private pace in their sleep: model it as its own fine loop.
            let mut steady = if only_phase == Some(1) {
                Vec::new()
            } else {
                program
            };
            if only_phase != Some(0) {
                steady.extend(barrier_rounds(grain, rounds, "few"));
                barriers.insert(name("few"), few);
            }
            vec![group(few, steady), group(n - few, sleepers)]
        }
        Kind::PhaseCompute => {
            let shape = phase_shape(kind, grain, n, phase_ns);
            let mut program = Vec::new();
            if only_phase != Some(1) {
                program.extend(barrier_rounds(grain, shape.rounds[0], "round"));
            }
            if only_phase != Some(0) {
                for _ in 0..shape.rounds[1] {
                    program.push(c(Dist::Const(COMPUTE_CHUNK_NS)));
                }
                program.push(Op::Barrier(name("round")));
            }
            vec![group(n, program)]
        }
        Kind::PhasePingpong => {
            // n / 2 pairs; each pair's two threads exchange a token through two one-slot
            // queues for the first phase, then compute alone, and everyone meets at the join.
            let shape = phase_shape(kind, grain, n, phase_ns);
            let compute: Vec<Op> = (0..shape.rounds[1])
                .map(|_| c(Dist::Const(COMPUTE_CHUNK_NS)))
                .chain([Op::Barrier(name("round"))])
                .collect();
            let mut out = Vec::new();
            for p in 0..(n / 2).max(1) {
                let (ping, pong) = (format!("ping{p}"), format!("pong{p}"));
                queues.insert(ping.clone(), 1);
                queues.insert(pong.clone(), 1);
                let mut first = Vec::new();
                let mut second = Vec::new();
                if only_phase != Some(1) {
                    for _ in 0..shape.rounds[0] {
                        first.extend([
                            c(jitter(grain)),
                            Op::Push(ping.clone()),
                            Op::Pop(pong.clone()),
                        ]);
                        second.extend([
                            Op::Pop(ping.clone()),
                            c(jitter(grain)),
                            Op::Push(pong.clone()),
                        ]);
                    }
                }
                if only_phase != Some(0) {
                    first.extend(compute.iter().cloned());
                    second.extend(compute.iter().cloned());
                }
                out.push(group(1, first));
                out.push(group(1, second));
            }
            out
        }
    };
    (threads, queues, barriers)
}

/// The two phases of a phase-changing workload, as its program builds them: each phase's
/// barrier rounds, the benchmark VM's compute in one pass through the phase (threads × rounds
/// × mean compute per round), and the least time the phase lasts whatever the setting (the
/// few-thread phase of `phase-threads` ends when its sleepers wake, `phase_ns` after it
/// began). What the phase oracle ([`crate::lab::phase_oracle`]) weighs the phases by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhaseShape {
    pub rounds: [u64; 2],
    pub work_ns: [f64; 2],
    pub min_ns: [f64; 2],
}

/// The compute phase of `phase-compute` runs in chunks of this (no synchronization between
/// them): one chunk is one scheduling slice's worth of work.
const COMPUTE_CHUNK_NS: Ns = MS;

fn phase_shape(kind: Kind, grain: Ns, n: usize, phase_ns: Ns) -> PhaseShape {
    let fine_rounds = (phase_ns / (grain + 40 * US)).max(1);
    match kind {
        Kind::PhaseThreads => {
            let few = (n / 4).max(1) as f64;
            let per_thread = (fine_rounds * grain) as f64;
            PhaseShape {
                rounds: [fine_rounds, fine_rounds],
                work_ns: [n as f64 * per_thread, few * per_thread],
                min_ns: [0.0, phase_ns as f64],
            }
        }
        Kind::PhasePingpong => {
            // A round trip is two computes of `grain` in series, and two hand-offs.
            let round_trips = (phase_ns / (2 * (grain + 40 * US))).max(1);
            let chunks = (phase_ns / COMPUTE_CHUNK_NS).max(1);
            let pairs = (n / 2).max(1) as f64;
            PhaseShape {
                rounds: [round_trips, chunks],
                work_ns: [
                    pairs * 2.0 * (round_trips * grain) as f64,
                    2.0 * pairs * (chunks * COMPUTE_CHUNK_NS) as f64,
                ],
                min_ns: [0.0, 0.0],
            }
        }
        _ => {
            // The second phase: coarse barrier rounds (phase-grain) or compute chunks
            // (phase-compute), each `each` long.
            let each = if kind == Kind::PhaseCompute {
                COMPUTE_CHUNK_NS
            } else {
                grain * 100
            };
            let second = (phase_ns / each).max(1);
            PhaseShape {
                rounds: [fine_rounds, second],
                work_ns: [
                    (n as u64 * fine_rounds * grain) as f64,
                    (n as u64 * second * each) as f64,
                ],
                min_ns: [0.0, 0.0],
            }
        }
    }
}

fn vm(name: &str, vcpus: usize, threads: Vec<ThreadGroup>) -> VmConfig {
    VmConfig {
        name: name.to_string(),
        vcpus,
        guest: GuestPolicy::None,
        weight: 1024,
        host_cpus: None,
        pin_vcpus: false,
        active_vcpus: None,
        app_progress: false,
        retention_timeout: None,
        gleaner: None,
        workload: None,
        threads,
        queues: BTreeMap::new(),
        barriers: BTreeMap::new(),
    }
}

/// The co-runner VMs of a contention level.
fn co_runners(contention: Contention, n: usize) -> Vec<VmConfig> {
    let cpu = |count| {
        vec![ThreadGroup {
            count,
            pin: None,
            iterations: None,
            program: vec![c(Dist::Const(MS))],
        }]
    };
    let half = (n / 2).max(1);
    match contention {
        Contention::Dedicated => vec![],
        Contention::OneCoRunner => vec![vm("co-cpu", half, cpu(half))],
        Contention::TwoCoRunners => vec![
            vm("co-cpu", half, cpu(half)),
            vm(
                "co-bursty",
                half,
                vec![ThreadGroup {
                    count: half,
                    pin: None,
                    iterations: None,
                    program: vec![c(Dist::Exp(200 * US)), Op::Sleep(Dist::Exp(200 * US))],
                }],
            ),
        ],
        Contention::Oversubscribed => vec![vm("co-cpu", n, cpu(n))],
    }
}

impl LabScenario {
    /// The scenario with the benchmark VM (VM 0) run as `choice`; `solo` = that VM alone.
    pub fn build(
        &self,
        choice: GuestChoice,
        only: Option<usize>,
    ) -> Result<Scenario, crate::ScenarioError> {
        self.build_inner(choice, only, None)
    }

    /// A phase-changing scenario with the benchmark VM running one of its two phases over
    /// and over (`phase` 0: fine grain or all threads; 1: coarse grain or a quarter of
    /// them), for half its run: what each setting achieves in each phase, from which the
    /// phase oracle is computed. `None` for kinds without phases.
    pub fn build_phase(
        &self,
        choice: GuestChoice,
        phase: usize,
    ) -> Option<Result<Scenario, crate::ScenarioError>> {
        (self.kind.is_phased() && phase < 2).then(|| self.build_inner(choice, None, Some(phase)))
    }

    /// The shape of the two phases ([`PhaseShape`]); `None` for kinds without phases.
    pub fn phase_shape(&self) -> Option<PhaseShape> {
        self.kind.is_phased().then(|| {
            phase_shape(
                self.kind,
                self.grain_ns,
                self.vcpus,
                self.duration_ns / PHASES_PER_RUN,
            )
        })
    }

    fn build_inner(
        &self,
        choice: GuestChoice,
        only: Option<usize>,
        only_phase: Option<usize>,
    ) -> Result<Scenario, crate::ScenarioError> {
        let duration_ns = if only_phase.is_some() {
            self.duration_ns / 2
        } else {
            self.duration_ns
        };
        let base = format!(
            "name = \"{}\"\nseed = {}\n[sim]\nduration = \"{}ns\"\n[host]\npcpus = {}\npolicy = \"{}\"\n[[vm]]\nvcpus = 1\nworkload = {{ preset = \"matmul\" }}\n",
            self.name,
            self.seed,
            duration_ns,
            self.vcpus,
            self.host_policy.name()
        );
        let path = std::path::Path::new(&self.name);
        let mut s = Scenario::from_str(&base, path)?;
        let phase_ns = self.duration_ns / PHASES_PER_RUN;
        let (threads, queues, barriers) =
            workload(self.kind, self.grain_ns, self.vcpus, phase_ns, only_phase);
        let mut bench = vm("bench", self.vcpus, threads);
        bench.queues = queues;
        bench.barriers = barriers;
        bench.guest = choice.guest;
        bench.active_vcpus = choice.active_vcpus;
        bench.app_progress = choice.app_progress;
        s.guest.retention_polls = choice.retention_polls;
        let mut vms = vec![bench];
        vms.extend(co_runners(self.contention, self.vcpus));
        if let Some(i) = only {
            vms = vec![vms.swap_remove(i)];
        }
        s.vms = vms;
        s.sim.duration = Dur(duration_ns);
        s.validated(path)
    }

    /// Number of VMs in the scenario.
    pub fn vm_count(&self) -> usize {
        1 + co_runners(self.contention, self.vcpus).len()
    }

    /// The static oracle's vCPU counts: every count up to 4, then steps (a 16-vCPU VM would
    /// otherwise need 32 static runs).
    pub fn static_counts(&self) -> Vec<usize> {
        let n = self.vcpus;
        let mut out: Vec<usize> = [1, 2, 3, 4, 6, 8, 12, 16]
            .into_iter()
            .filter(|&k| k <= n)
            .collect();
        if !out.contains(&n) {
            out.push(n);
        }
        out
    }

    /// Every configuration the benchmark VM is run in.
    pub fn choices(&self) -> Vec<GuestChoice> {
        let mut out: Vec<GuestChoice> = [
            GuestPolicy::None,
            GuestPolicy::Haltpoll,
            GuestPolicy::Retention,
            GuestPolicy::Gleaner,
        ]
        .into_iter()
        .map(|guest| GuestChoice {
            guest,
            active_vcpus: None,
            app_progress: false,
            retention_polls: false,
        })
        .collect();
        out.push(GuestChoice {
            guest: GuestPolicy::Gleaner,
            active_vcpus: None,
            app_progress: true,
            retention_polls: false,
        });
        // Gleaner on a guest with a POLL state, where `haltpoll` is the fixed setting it
        // must beat (not a static setting: the others run on a guest without one).
        out.push(GuestChoice {
            guest: GuestPolicy::Gleaner,
            active_vcpus: None,
            app_progress: false,
            retention_polls: true,
        });
        for k in self.static_counts() {
            for guest in [GuestPolicy::None, GuestPolicy::Hold] {
                // All vCPUs without retention is `none`, run above.
                if k == self.vcpus && guest == GuestPolicy::None {
                    continue;
                }
                out.push(GuestChoice {
                    guest,
                    active_vcpus: Some(k),
                    app_progress: false,
                    retention_polls: false,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bulk-synchronous kind: its first phase synchronizes at every round, its second
    /// not at all until the join, and both phases carry the same compute per thread (each
    /// lasts about `phase_ns` unhindered).
    #[test]
    fn phase_compute_alternates_fine_rounds_with_unsynchronized_compute() {
        let (grain, n, phase_ns) = (10 * US, 8, 2_000 * MS);
        let (threads, queues, _) = workload(Kind::PhaseCompute, grain, n, phase_ns, None);
        assert!(queues.is_empty());
        assert_eq!(threads.len(), 1);
        assert_eq!(threads[0].count, n);
        let program = &threads[0].program;
        let shape = phase_shape(Kind::PhaseCompute, grain, n, phase_ns);
        let barriers = program
            .iter()
            .filter(|op| matches!(op, Op::Barrier(_)))
            .count() as u64;
        assert_eq!(
            barriers,
            shape.rounds[0] + 1,
            "one per fine round, one join"
        );
        let chunks = program
            .iter()
            .filter(|op| matches!(op, Op::Compute(Dist::Const(COMPUTE_CHUNK_NS))))
            .count() as u64;
        assert_eq!(chunks, shape.rounds[1]);
        assert_eq!(shape.rounds[1] * COMPUTE_CHUNK_NS, phase_ns);
        // Each phase alone, as the phase oracle runs it.
        let (only_fine, _, _) = workload(Kind::PhaseCompute, grain, n, phase_ns, Some(0));
        let (only_compute, _, _) = workload(Kind::PhaseCompute, grain, n, phase_ns, Some(1));
        assert_eq!(
            only_fine[0].program.len() + only_compute[0].program.len(),
            program.len()
        );
        assert!(Kind::PhaseCompute.is_phased());
    }

    /// The exchange kind: n / 2 pairs, each pair's two threads handing a token back and forth
    /// for the first phase (one push and one pop per thread per round trip, on the pair's own
    /// two queues), then both computing alone, all meeting at one join; the shape's work is
    /// what the program computes.
    #[test]
    fn phase_pingpong_alternates_pair_exchanges_with_unsynchronized_compute() {
        let (grain, n, phase_ns) = (20 * US, 8, 2_000 * MS);
        let (threads, queues, barriers) = workload(Kind::PhasePingpong, grain, n, phase_ns, None);
        let shape = phase_shape(Kind::PhasePingpong, grain, n, phase_ns);
        assert_eq!(threads.len(), n, "one group per thread");
        assert!(threads.iter().all(|t| t.count == 1));
        assert_eq!(queues.len(), n, "two one-slot queues per pair");
        assert!(queues.values().all(|&cap| cap == 1));
        assert!(
            barriers.is_empty(),
            "the join counts every thread that uses it"
        );
        let count =
            |prog: &[Op], f: &dyn Fn(&Op) -> bool| prog.iter().filter(|op| f(op)).count() as u64;
        let mut work = 0.0;
        for (i, t) in threads.iter().enumerate() {
            let p = &t.program;
            let (mine, other) = if i % 2 == 0 {
                ("ping", "pong")
            } else {
                ("pong", "ping")
            };
            let pair = i / 2;
            let pushes = count(
                p,
                &|op| matches!(op, Op::Push(q) if *q == format!("{mine}{pair}")),
            );
            let pops = count(
                p,
                &|op| matches!(op, Op::Pop(q) if *q == format!("{other}{pair}")),
            );
            assert_eq!(
                (pushes, pops),
                (shape.rounds[0], shape.rounds[0]),
                "thread {i}"
            );
            assert_eq!(
                count(p, &|op| matches!(
                    op,
                    Op::Compute(Dist::Const(COMPUTE_CHUNK_NS))
                )),
                shape.rounds[1]
            );
            assert_eq!(count(p, &|op| matches!(op, Op::Barrier(_))), 1);
            assert!(matches!(p.last(), Some(Op::Barrier(_))));
            work +=
                shape.rounds[0] as f64 * grain as f64 + (shape.rounds[1] * COMPUTE_CHUNK_NS) as f64;
        }
        assert!((work - shape.work_ns[0] - shape.work_ns[1]).abs() < 1.0);
        // Each phase alone, as the phase oracle runs it.
        let (only_exchange, _, _) = workload(Kind::PhasePingpong, grain, n, phase_ns, Some(0));
        let (only_compute, _, _) = workload(Kind::PhasePingpong, grain, n, phase_ns, Some(1));
        for i in 0..n {
            assert_eq!(
                only_exchange[i].program.len() + only_compute[i].program.len(),
                threads[i].program.len()
            );
        }
        assert!(Kind::PhasePingpong.is_phased());
    }
}
