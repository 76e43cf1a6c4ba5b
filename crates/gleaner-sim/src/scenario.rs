//! Scenario files: the host, the cost model, and the VMs with their guest policy and workload.
//!
//! A scenario is TOML. Parsing goes through `toml::Value` first so that a sweep
//! (`--sweep host.pcpus=4,8,16`) can override any field by its dotted path before the typed
//! structs are built. Every error is one line naming the file, the field and the fix.

use gleaner_sys::one_line;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::time::{Dur, Ns, MS, US};
use crate::workload::{Op, Preset, ThreadGroup};

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    // The I/O error is part of this message and deliberately not its `source`: a chain
    // printer (`{:#}`) would repeat it ("No such file or directory: No such file ...").
    #[error("cannot read scenario {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}:{at}{message}")]
    Parse {
        path: PathBuf,
        at: Position,
        message: String,
    },
    #[error("{path}: {field}: {problem}")]
    Invalid {
        path: PathBuf,
        field: String,
        problem: String,
    },
    #[error("bad --sweep {spec:?}: {problem} (expected PATH=V1,V2,..., e.g. host.pcpus=4,8,16)")]
    Sweep { spec: String, problem: String },
}

/// Where in a scenario file a parse error is: `line:column: `, or nothing when the error has
/// no place in the text (a value set by `--sweep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position(pub Option<(usize, usize)>);

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some((line, column)) => write!(f, "{line}:{column}: "),
            None => write!(f, " "),
        }
    }
}

/// Why a `host_cpus` list is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostCpusError {
    #[error("{0}")]
    Syntax(String),
    #[error("host CPU {cpu} does not exist (host.pcpus = {pcpus})")]
    NoSuchCpu { cpu: usize, pcpus: usize },
    #[error("empty CPU list")]
    Empty,
}

/// Why a `--sweep` path cannot be set in the scenario's TOML tree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetPathError {
    #[error("{part:?} must be an index into an array")]
    NotAnIndex { part: String },
    #[error("index {index} out of range ({len} items)")]
    OutOfRange { index: usize, len: usize },
    #[error("{part:?} goes inside a value that is not a table")]
    NotATable { part: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostPolicy {
    /// Linux CFS as is.
    Cfs,
    /// Balanced scheduling: sibling vCPUs never share a run queue.
    Bal,
    /// Self-boosted co-scheduling (SBCO paper §III).
    Sbco,
    /// Gang scheduling in global time slots; a pCPU whose gang vCPU is halted stays idle.
    CoschedStrict,
    /// Gang scheduling in global time slots; idle slot pCPUs run other VMs' vCPUs until the
    /// gang's vCPU wakes (work-conserving).
    CoschedRelaxed,
}

impl HostPolicy {
    pub fn name(self) -> &'static str {
        match self {
            HostPolicy::Cfs => "cfs",
            HostPolicy::Bal => "bal",
            HostPolicy::Sbco => "sbco",
            HostPolicy::CoschedStrict => "cosched-strict",
            HostPolicy::CoschedRelaxed => "cosched-relaxed",
        }
    }
    pub fn is_cosched(self) -> bool {
        matches!(self, HostPolicy::CoschedStrict | HostPolicy::CoschedRelaxed)
    }
    /// Policies that never place two sibling vCPUs on one run queue.
    pub fn spreads_siblings(self) -> bool {
        matches!(self, HostPolicy::Bal | HostPolicy::Sbco)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GuestPolicy {
    /// Idle vCPUs halt at once.
    None,
    /// cpuidle-haltpoll: poll before halting, with the adaptive poll limit of Linux.
    Haltpoll,
    /// A yielding thread on every vCPU with a fixed hold (`retention_timeout`), from the
    /// start and never adapted: Table 2 setting B, the naive idle daemon of Song et al.
    Hold,
    /// gleaner-policy in `Mode::Retention`: holds decided every period, no consolidation.
    Retention,
    /// gleaner-policy as configured (`Mode::Full` by default): retention and consolidation.
    Gleaner,
}

impl GuestPolicy {
    pub fn name(self) -> &'static str {
        match self {
            GuestPolicy::None => "none",
            GuestPolicy::Haltpoll => "haltpoll",
            GuestPolicy::Hold => "hold",
            GuestPolicy::Retention => "retention",
            GuestPolicy::Gleaner => "gleaner",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub name: String,
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default)]
    pub sim: SimConfig,
    pub host: HostConfig,
    #[serde(default)]
    pub costs: Costs,
    #[serde(default)]
    pub guest: GuestConfig,
    #[serde(rename = "vm")]
    pub vms: Vec<VmConfig>,
}

fn default_seed() -> u64 {
    1
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Simulated time limit. A run also stops once every VM with finite work is done.
    pub duration: Dur,
    /// Also simulate each VM alone on the same host and report weighted speedup.
    pub weighted_speedup: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            duration: Dur(10_000 * MS),
            weighted_speedup: false,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    pub pcpus: usize,
    #[serde(default = "default_host_policy")]
    pub policy: HostPolicy,
    /// CFS tunables, defaults as Linux scales them for ≥ 8 CPUs (×4).
    #[serde(default = "d_latency")]
    pub sched_latency: Dur,
    #[serde(default = "d_min_gran")]
    pub min_granularity: Dur,
    #[serde(default = "d_wakeup_gran")]
    pub wakeup_granularity: Dur,
    #[serde(default = "d_balance")]
    pub balance_interval: Dur,
    /// pCPUs per last-level-cache domain: wakeups look for an idle pCPU in the domain, and
    /// periodic balancing looks at the domain (and at the whole host every 8th time).
    #[serde(default = "d_llc")]
    pub llc_size: usize,
    /// SBCO's D_threshold = alpha × run queue length.
    #[serde(default = "d_alpha")]
    pub sbco_alpha: f64,
    /// Gang time slot; default sched_latency / number of VMs, at least min_granularity.
    #[serde(default)]
    pub cosched_slice: Option<Dur>,
}

fn default_host_policy() -> HostPolicy {
    HostPolicy::Cfs
}
fn d_latency() -> Dur {
    Dur(24 * MS)
}
fn d_min_gran() -> Dur {
    Dur(3 * MS)
}
fn d_wakeup_gran() -> Dur {
    Dur(4 * MS)
}
fn d_balance() -> Dur {
    Dur(4 * MS)
}
fn d_llc() -> usize {
    16
}
fn d_alpha() -> f64 {
    2.0 / 3.0
}

/// The cost model. Defaults are calibrated so that the Table 2 scenarios come out at the
/// paper's 6 / 17 / 37 / 96 µs (see README.md, "Calibration").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Costs {
    /// Guest thread switch incl. futex wake return (RT): Table 2 A.
    pub guest_switch: Dur,
    /// The part of `guest_switch`, on a vCPU leaving idle (halted or polling) for a woken
    /// thread, that a real guest counts as neither the thread's run time nor idle: the
    /// kernel's path out of the idle loop to the switch. Only the accounting of Gleaner's
    /// sample moves (it is room for packing, `Characteristics::l_wake_path_ns`); no timing
    /// changes. 1.4 µs: a ping-pong on the `none` guest of 2026-12-01 spent 8 % of each
    /// vCPU there at about 59,000 round trips a second, one wake-up from idle per vCPU each.
    pub idle_exit_path: Dur,
    /// Reschedule IPI from one vCPU to another through the VMM, send to delivery (IPI).
    pub ipi: Dur,
    /// The part of `ipi` the sending vCPU loses: its VM exit on the APIC ICR write.
    pub ipi_send: Dur,
    /// Host kicking a halted vCPU thread awake, before it is runnable (part of RV).
    pub halt_wake: Dur,
    /// Host context switch plus VM entry whenever a vCPU gets a pCPU (part of RV).
    pub vcpu_switch: Dur,
    /// Extra time a vCPU loses refilling caches and TLBs when the pCPU last ran another vCPU.
    pub cache_refill: Dur,
    /// haltpoll: a polling vCPU noticing new work (no IPI needed).
    pub poll_wake: Dur,
    /// Pause-loop exiting: spinning this long triggers a VM exit and a directed yield.
    pub ple_window: Dur,
    /// Cost of one pause-loop exit.
    pub ple_exit: Dur,
}

impl Default for Costs {
    fn default() -> Self {
        Self {
            guest_switch: Dur(6 * US),
            idle_exit_path: Dur(1_400),
            ipi: Dur(11 * US),
            ipi_send: Dur(2 * US),
            halt_wake: Dur(12 * US),
            vcpu_switch: Dur(8 * US),
            cache_refill: Dur(59 * US),
            poll_wake: Dur(US),
            ple_window: Dur(20 * US),
            ple_exit: Dur(2 * US),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuestConfig {
    /// Guest scheduler time slice between threads sharing a vCPU.
    pub slice: Dur,
    /// Guest periodic load balancing.
    pub balance_interval: Dur,
    /// Retention hold for `hold`, `retention` and `gleaner`; default: the break-even hold
    /// derived from the cost model (wake on a halted vCPU minus wake on a busy one, §4.1).
    pub retention_timeout: Option<Dur>,
    /// The guest has a cpuidle POLL state (the `haltpoll` driver), so retention holds by
    /// in-kernel polling, as the daemon does on such a guest (PM QoS): a held vCPU notices
    /// work without an IPI (`poll_wake`), and it polls until the policy lifts the hold (the
    /// daemon's PM QoS hold has no timeout of its own). Without one (the default) retention
    /// is a yielding thread, woken by an IPI, and ends at its timeout.
    pub retention_polls: bool,
    /// cpuidle-haltpoll parameters (Linux defaults).
    pub halt_poll_max: Dur,
    pub halt_poll_grow_start: Dur,
    pub halt_poll_grow: u64,
    pub halt_poll_shrink: u64,
    /// Gleaner's sampling period.
    pub policy_period: Dur,
}

impl Default for GuestConfig {
    fn default() -> Self {
        Self {
            slice: Dur(3 * MS),
            balance_interval: Dur(4 * MS),
            retention_timeout: None,
            retention_polls: false,
            halt_poll_max: Dur(200 * US),
            halt_poll_grow_start: Dur(50 * US),
            halt_poll_grow: 2,
            halt_poll_shrink: 2,
            policy_period: Dur(100 * MS),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    #[serde(default)]
    pub name: String,
    pub vcpus: usize,
    #[serde(default = "default_guest_policy")]
    pub guest: GuestPolicy,
    /// CFS weight of each vCPU (nice 0 = 1024).
    #[serde(default = "default_weight")]
    pub weight: u64,
    /// Host CPUs this VM's vCPUs may run on, kernel list syntax ("0-3"); default all.
    #[serde(default)]
    pub host_cpus: Option<String>,
    /// Pin vCPU i to the i-th pCPU of `host_cpus` (a dedicated-hardware VM).
    #[serde(default)]
    pub pin_vcpus: bool,
    /// Confine the workload to the VM's first `active_vcpus` vCPUs for the whole run (a fixed
    /// cpuset: the policy lab's static settings); default all.
    #[serde(default)]
    pub active_vcpus: Option<usize>,
    /// The application reports its progress to Gleaner (as a database's transaction counter
    /// would): `PeriodSample::progress` is the compute it completed. Off by default, as for
    /// most applications; the policy then judges by utilization.
    #[serde(default)]
    pub app_progress: bool,
    /// Overrides `guest.retention_timeout` for this VM.
    #[serde(default)]
    pub retention_timeout: Option<Dur>,
    /// gleaner-policy tunables for `retention` / `gleaner` (its `PolicyConfig`; the hold is
    /// `retention_timeout`, not `retention_timeout_ns`).
    #[serde(default)]
    pub gleaner: Option<gleaner_policy::PolicyConfig>,
    #[serde(default)]
    pub workload: Option<Preset>,
    #[serde(default)]
    pub threads: Vec<ThreadGroup>,
    /// Capacities of named queues; an undeclared queue holds 64 items.
    #[serde(default)]
    pub queues: BTreeMap<String, usize>,
    /// Parties of named barriers; an undeclared barrier waits for every thread that uses it.
    #[serde(default)]
    pub barriers: BTreeMap<String, usize>,
}

fn default_guest_policy() -> GuestPolicy {
    GuestPolicy::None
}
fn default_weight() -> u64 {
    1024
}

pub const DEFAULT_QUEUE_CAPACITY: usize = 64;

impl VmConfig {
    /// The VM's threads with the preset expanded, and its queue capacities.
    pub fn expanded(&self) -> (Vec<ThreadGroup>, BTreeMap<String, usize>) {
        let mut threads = Vec::new();
        let mut queues = BTreeMap::new();
        if let Some(preset) = &self.workload {
            let e = preset.expand(self.vcpus);
            threads.extend(e.threads);
            queues.extend(e.queues);
        }
        threads.extend(self.threads.iter().cloned());
        queues.extend(self.queues.iter().map(|(k, v)| (k.clone(), *v)));
        (threads, queues)
    }
}

impl Scenario {
    /// Read, parse and validate a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = read_text(path)?;
        Scenario::from_str(&text, path)
    }

    /// Parse and validate TOML text; `path` only labels errors, which carry the line and
    /// column of the offending field.
    pub fn from_str(text: &str, path: &Path) -> Result<Scenario, ScenarioError> {
        let value = parse_value(text, path)?;
        Scenario::from_value_in(value, Some(text), path)
    }

    /// Build from a TOML tree (e.g. one a sweep modified). Errors carry no position: the tree
    /// has no text.
    pub fn from_value(value: toml::Value, path: &Path) -> Result<Scenario, ScenarioError> {
        Scenario::from_value_in(value, None, path)
    }

    /// Build from a TOML tree; when `text` is the file the tree was parsed from unmodified, a
    /// type error is located in it (the tree itself has no spans).
    pub fn from_value_in(
        value: toml::Value,
        text: Option<&str>,
        path: &Path,
    ) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario = Scenario::deserialize(value).map_err(|e| {
            let spanned = text.and_then(|text| {
                let err = toml::from_str::<Scenario>(text).err()?;
                let span = err.span()?;
                Some((position_of(text, span.start), one_line(err.message())))
            });
            match spanned {
                Some((at, message)) => ScenarioError::Parse {
                    path: path.to_path_buf(),
                    at: Position(Some(at)),
                    message,
                },
                None => ScenarioError::Parse {
                    path: path.to_path_buf(),
                    at: Position(None),
                    message: one_line(e.message()),
                },
            }
        })?;
        scenario.validate(path)?;
        Ok(scenario)
    }

    /// A scenario built in code, validated as a file would be; `path` labels errors.
    pub fn validated(self, path: &Path) -> Result<Scenario, ScenarioError> {
        self.validate(path)?;
        Ok(self)
    }

    fn validate(&self, path: &Path) -> Result<(), ScenarioError> {
        let bad = |field: String, problem: String| ScenarioError::Invalid {
            path: path.to_path_buf(),
            field,
            problem,
        };
        let h = &self.host;
        if h.pcpus == 0 || h.pcpus > 65_536 {
            return Err(bad(
                "host.pcpus".into(),
                format!("{} must be 1..=65536", h.pcpus),
            ));
        }
        if h.min_granularity.0 == 0 || h.sched_latency.0 < h.min_granularity.0 {
            return Err(bad(
                "host.sched_latency".into(),
                "must be ≥ host.min_granularity > 0".into(),
            ));
        }
        if h.balance_interval.0 == 0 || h.llc_size == 0 {
            return Err(bad(
                "host.balance_interval / host.llc_size".into(),
                "must be > 0".into(),
            ));
        }
        if !(h.sbco_alpha > 0.0 && h.sbco_alpha < 1.0) {
            return Err(bad(
                "host.sbco_alpha".into(),
                format!("{} must be in (0, 1)", h.sbco_alpha),
            ));
        }
        if self.sim.duration.0 == 0 {
            return Err(bad("sim.duration".into(), "must be > 0".into()));
        }
        let g = &self.guest;
        if g.slice.0 == 0 || g.balance_interval.0 == 0 || g.policy_period.0 == 0 {
            return Err(bad(
                "guest.slice / guest.balance_interval / guest.policy_period".into(),
                "must be > 0".into(),
            ));
        }
        if self.vms.is_empty() {
            return Err(bad(
                "vm".into(),
                "no [[vm]] tables; add at least one VM".into(),
            ));
        }
        for (i, vm) in self.vms.iter().enumerate() {
            let f = |name: &str| format!("vm[{i}].{name}");
            if vm.vcpus == 0 || vm.vcpus > 8192 {
                return Err(bad(f("vcpus"), format!("{} must be 1..=8192", vm.vcpus)));
            }
            if let Some(k) = vm.active_vcpus {
                if k == 0 || k > vm.vcpus {
                    return Err(bad(
                        f("active_vcpus"),
                        format!("{k} must be 1..={} (the VM's vcpus)", vm.vcpus),
                    ));
                }
                if vm.guest == GuestPolicy::Retention || vm.guest == GuestPolicy::Gleaner {
                    return Err(bad(f("active_vcpus"), "a fixed cpuset conflicts with the policy's own; use guest none, haltpoll or hold".into()));
                }
            }
            if vm.weight == 0 {
                return Err(bad(f("weight"), "must be > 0 (1024 is nice 0)".into()));
            }
            let host_cpus = self
                .host_cpus(i)
                .map_err(|p| bad(f("host_cpus"), p.to_string()))?;
            if vm.pin_vcpus && host_cpus.len() < vm.vcpus {
                return Err(bad(
                    f("pin_vcpus"),
                    format!(
                        "{} vCPUs cannot be pinned to {} host CPUs; list more host_cpus",
                        vm.vcpus,
                        host_cpus.len()
                    ),
                ));
            }
            if h.policy.is_cosched() && vm.vcpus > h.pcpus {
                return Err(bad(
                    f("vcpus"),
                    format!(
                        "co-scheduling needs vcpus ≤ host.pcpus ({} > {})",
                        vm.vcpus, h.pcpus
                    ),
                ));
            }
            if let Some(cfg) = &vm.gleaner {
                if cfg.retention_timeout
                    != gleaner_policy::PolicyConfig::default().retention_timeout
                {
                    return Err(bad(
                        f("gleaner.retention_timeout_ns"),
                        "the simulator sets the hold; use vm.retention_timeout instead".into(),
                    ));
                }
                cfg.validate()
                    .map_err(|e| bad(f("gleaner"), e.to_string()))?;
            }
            let (threads, _) = vm.expanded();
            if threads.is_empty() {
                return Err(bad(
                    f("workload"),
                    "the VM has no threads; add a workload preset or [[vm.threads]]".into(),
                ));
            }
            let mut barrier_users: BTreeMap<&str, usize> = BTreeMap::new();
            for (j, group) in threads.iter().enumerate() {
                let gf = |name: &str| format!("vm[{i}].threads[{j}].{name}");
                if let Some(pin) = group.pin {
                    if pin >= vm.vcpus {
                        return Err(bad(
                            gf("pin"),
                            format!("vCPU {pin} does not exist (the VM has {})", vm.vcpus),
                        ));
                    }
                }
                if group.count == 0 || group.count > 1_000_000 {
                    return Err(bad(
                        gf("count"),
                        format!("{} must be 1..=1000000", group.count),
                    ));
                }
                if !group
                    .program
                    .iter()
                    .any(|op| matches!(op, Op::Compute(_) | Op::Sleep(_)))
                {
                    return Err(bad(
                        gf("program"),
                        "needs at least one compute or sleep op so that time advances".into(),
                    ));
                }
                let mut seen = Vec::new();
                for op in &group.program {
                    if let Op::Barrier(b) = op {
                        if !seen.contains(&b) {
                            seen.push(b);
                            *barrier_users.entry(b.as_str()).or_default() += group.count;
                        }
                    }
                }
            }
            for (name, parties) in &vm.barriers {
                let users = barrier_users.get(name.as_str()).copied().unwrap_or(0);
                if *parties == 0 || *parties > users {
                    return Err(bad(
                        f(&format!("barriers.{name}")),
                        format!(
                            "{parties} parties but {users} threads use it; it would never open"
                        ),
                    ));
                }
            }
            let (_, queues) = vm.expanded();
            if let Some((name, _)) = queues.iter().find(|(_, cap)| **cap == 0) {
                return Err(bad(
                    f(&format!("queues.{name}")),
                    "capacity must be ≥ 1".into(),
                ));
            }
        }
        Ok(())
    }

    /// The pCPUs VM `i` may use.
    pub fn host_cpus(&self, i: usize) -> Result<Vec<usize>, HostCpusError> {
        let all: Vec<usize> = (0..self.host.pcpus).collect();
        let Some(list) = &self.vms[i].host_cpus else {
            return Ok(all);
        };
        let set: gleaner_policy::Cpuset = list
            .parse()
            .map_err(|e| HostCpusError::Syntax(format!("{e}")))?;
        let cpus: Vec<usize> = set.iter().collect();
        if let Some(&cpu) = cpus.iter().find(|&&c| c >= self.host.pcpus) {
            return Err(HostCpusError::NoSuchCpu {
                cpu,
                pcpus: self.host.pcpus,
            });
        }
        if cpus.is_empty() {
            return Err(HostCpusError::Empty);
        }
        Ok(cpus)
    }

    /// The same scenario with only VM `i`: the solo baseline for weighted speedup.
    pub fn solo(&self, i: usize) -> Scenario {
        let mut s = self.clone();
        s.vms = vec![self.vms[i].clone()];
        s.sim.weighted_speedup = false;
        s
    }

    /// The retention hold for VM `i`: explicit, or the break-even of the cost model (a wake on
    /// a halted vCPU costs halt_wake + vcpu_switch more than on a busy one).
    pub fn retention_timeout(&self, i: usize) -> Ns {
        if let Some(d) = self.vms[i]
            .retention_timeout
            .or(self.guest.retention_timeout)
        {
            return d.0;
        }
        let c = &self.costs;
        let busy = c.ipi.0 + c.guest_switch.0;
        let halted = busy + c.halt_wake.0 + c.vcpu_switch.0;
        gleaner_policy::RetentionTimeout::from_wake_costs(halted, busy).ns
    }

    pub fn gang_slice(&self) -> Ns {
        match self.host.cosched_slice {
            Some(d) => d.0.max(1),
            None => (self.host.sched_latency.0 / self.vms.len().max(1) as u64)
                .max(self.host.min_granularity.0),
        }
    }
}

/// A scenario file's text.
pub fn read_text(path: &Path) -> Result<String, ScenarioError> {
    std::fs::read_to_string(path).map_err(|error| ScenarioError::Read {
        path: path.to_path_buf(),
        error,
    })
}

pub fn load_value(path: &Path) -> Result<toml::Value, ScenarioError> {
    parse_value(&read_text(path)?, path)
}

/// Line and column (both from 1) of byte offset `at` in `text`.
fn position_of(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.chars().count()
        - before
            .rfind('\n')
            .map_or(0, |p| before[..=p].chars().count())
        + 1;
    (line, column)
}

pub fn parse_value(text: &str, path: &Path) -> Result<toml::Value, ScenarioError> {
    text.parse::<toml::Table>()
        .map(toml::Value::Table)
        .map_err(|e| ScenarioError::Parse {
            path: path.to_path_buf(),
            at: Position(e.span().map(|span| position_of(text, span.start))),
            message: one_line(e.message()),
        })
}

/// A parsed `--sweep PATH=V1,V2,...`; `PATH1+PATH2=...` sets several fields to each value
/// (e.g. `vm.0.guest+vm.1.guest=none,gleaner`).
#[derive(Debug, Clone)]
pub struct Sweep {
    pub path: String,
    pub paths: Vec<String>,
    pub values: Vec<toml::Value>,
    pub labels: Vec<String>,
}

impl Sweep {
    pub fn parse(spec: &str) -> Result<Sweep, ScenarioError> {
        let err = |problem: &str| ScenarioError::Sweep {
            spec: spec.into(),
            problem: problem.into(),
        };
        let (path, list) = spec.split_once('=').ok_or_else(|| err("missing '='"))?;
        let path = path.trim();
        let paths: Vec<String> = path.split('+').map(|p| p.trim().to_string()).collect();
        if paths
            .iter()
            .any(|p| p.is_empty() || p.split('.').any(str::is_empty))
        {
            return Err(err("empty path segment"));
        }
        let labels: Vec<String> = list.split(',').map(|v| v.trim().to_string()).collect();
        if labels.iter().any(String::is_empty) {
            return Err(err("empty value in the list"));
        }
        let values = labels.iter().map(|raw| parse_scalar(raw)).collect();
        Ok(Sweep {
            path: path.into(),
            paths,
            values,
            labels,
        })
    }

    /// Set the sweep path to its `k`-th value in a scenario's TOML tree.
    pub fn apply(&self, root: &mut toml::Value, k: usize) -> Result<(), ScenarioError> {
        for path in &self.paths {
            set_path(root, path, self.values[k].clone()).map_err(|problem| {
                ScenarioError::Sweep {
                    spec: format!("{}={}", self.path, self.labels.join(",")),
                    problem: problem.to_string(),
                }
            })?;
        }
        Ok(())
    }
}

/// A sweep value as TOML (number, bool, quoted string, array), else as a bare string, so that
/// `host.policy=cfs,sbco` needs no quotes.
fn parse_scalar(raw: &str) -> toml::Value {
    format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

/// Set `a.b.0.c` in a TOML tree: table keys by name, array elements by index. Missing tables
/// and the last key are created, so optional fields and sections can be swept too (a wrong
/// name is then reported by the scenario's own `unknown field` check).
pub fn set_path(
    root: &mut toml::Value,
    path: &str,
    value: toml::Value,
) -> Result<(), SetPathError> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut node = root;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        node = match node {
            toml::Value::Table(t) => {
                if last {
                    t.insert(part.to_string(), value);
                    return Ok(());
                }
                // A section the file leaves out (all defaults) is created, so it can be swept.
                t.entry(part.to_string())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            }
            toml::Value::Array(a) => {
                let idx: usize = part.parse().map_err(|_| SetPathError::NotAnIndex {
                    part: part.to_string(),
                })?;
                let len = a.len();
                let slot = a
                    .get_mut(idx)
                    .ok_or(SetPathError::OutOfRange { index: idx, len })?;
                if last {
                    *slot = value;
                    return Ok(());
                }
                slot
            }
            _ => {
                return Err(SetPathError::NotATable {
                    part: part.to_string(),
                })
            }
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests;
