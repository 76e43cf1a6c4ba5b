//! Wake-latency probe: the paper's Table 2 re-measured on the machine at hand.
//!
//! Gleaner's retention timeout is a bet whose price is the difference between waking a thread
//! on a halted vCPU and on a busy one (`RetentionTimeout::from_wake_costs`), and those costs
//! differ by hypervisor, host load and guest idle driver. So instead of trusting the paper's
//! 37 µs and 17 µs, this module measures them: a wakee thread blocks in `FUTEX_WAIT` (what a
//! contended `pthread_mutex_lock` does), a waker issues `FUTEX_WAKE` after a chosen gap, and
//! the latency is CLOCK_MONOTONIC from just before the wake to the wakee running again.
//!
//! Settings (both threads pinned):
//! * A: waker and wakee on the same vCPU (a guest context switch only).
//! * B: different vCPUs, the wakee's vCPU kept busy by a retention thread that never times
//!   out (wake = reschedule IPI); B-poll: the same via cpuidle polling (PM QoS), if available.
//! * C: different vCPUs, the wakee's vCPU idle, so the guest halts it and the hypervisor has
//!   to run it again.
//! * D (another VM contending) cannot be produced from inside a guest; the steal time seen
//!   during the run is reported instead.
//!
//! The gap between wakes is swept because hosts poll a halted vCPU for a while before really
//! descheduling it (KVM `halt_poll_ns`): short gaps hide the cost that long gaps reveal.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use gleaner_policy::{Cpuset, RetentionTimeout};
use serde::{Deserialize, Serialize};

use crate::pmqos::PollRetention;
use crate::procfs::{CpuTimes, ProcFs};
use crate::retention::RetentionError;
use crate::sysfs::SysFs;
use gleaner_sys::affinity::thread_affinity;

/// Default gaps between wakes: 20 µs to 5 ms.
pub const DEFAULT_GAPS_NS: [u64; 8] = [
    20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000, 2_000_000, 5_000_000,
];
/// Samples per setting and gap by default; with the default gaps a full run takes about 10 s.
pub const DEFAULT_SAMPLES: usize = 300;
/// Shortest gap accepted: below it the wakee may not have blocked yet when the wake comes.
pub const MIN_GAP_NS: u64 = 1_000;
/// Longest gap accepted: longer ones would make a run take hours without teaching more.
pub const MAX_GAP_NS: u64 = 1_000_000_000;

/// Receives what undoes a change before the B-poll setting makes it (a CPU's original PM QoS
/// value, or its POLL state's `disable` flag; see [`crate::journal::undo_recorder`]).
pub type PmQosHook = Arc<dyn Fn(crate::journal::UndoAction) -> crate::Result<()> + Send + Sync>;

#[derive(Clone)]
pub struct ProbeConfig {
    /// Gaps between consecutive wakes, i.e. how long the wakee stays blocked.
    pub gaps_ns: Vec<u64>,
    /// Measured wakes per setting and gap.
    pub samples: usize,
    /// Wakes before each measurement that are thrown away (caches, governor, host polling
    /// settle).
    pub warmup: usize,
    pub sysfs_root: PathBuf,
    pub procfs_root: PathBuf,
    /// Measure B-poll when cpuidle polling is available. It changes a PM QoS file for the
    /// duration of that setting (restored afterwards, and on drop).
    pub poll_setting: bool,
    /// Journal hook for the PM QoS originals (see [`crate::pmqos`]); `None` relies on the
    /// in-process restore only.
    pub on_pmqos_original: Option<PmQosHook>,
    /// Also time each point's wakes in the kernel with the BPF sampler (see
    /// [`KernelTiming`]); needs root and kernel BTF.
    pub in_kernel: bool,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            gaps_ns: DEFAULT_GAPS_NS.to_vec(),
            samples: DEFAULT_SAMPLES,
            warmup: 5,
            sysfs_root: PathBuf::from("/sys"),
            procfs_root: PathBuf::from("/proc"),
            poll_setting: true,
            on_pmqos_original: None,
            in_kernel: false,
        }
    }
}

impl fmt::Debug for ProbeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProbeConfig")
            .field("gaps_ns", &self.gaps_ns)
            .field("samples", &self.samples)
            .field("warmup", &self.warmup)
            .field("sysfs_root", &self.sysfs_root)
            .field("procfs_root", &self.procfs_root)
            .field("poll_setting", &self.poll_setting)
            .field("on_pmqos_original", &self.on_pmqos_original.is_some())
            .field("in_kernel", &self.in_kernel)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("invalid probe configuration: {reason}")]
    Config { reason: String },
    #[error("this process may run on no CPU at all (empty affinity mask)")]
    NoCpus,
    #[error("need two CPUs for this measurement but this process may only use CPUs {allowed} (run it without a restricting taskset/cpuset)")]
    TooFewCpus { allowed: String },
    #[error("cannot read this process's CPU affinity: {source}")]
    Affinity { source: io::Error },
    #[error("cannot pin the probe's {role} thread to CPU {cpu}: {source}")]
    Pin {
        role: &'static str,
        cpu: usize,
        source: io::Error,
    },
    #[error("cannot start the probe's {role} thread: {source}")]
    Spawn {
        role: &'static str,
        source: io::Error,
    },
    #[error("--in-kernel: the BPF sampler cannot time the probe's wakes: {reason} (run without --in-kernel)")]
    InKernel { reason: String },
    #[error(transparent)]
    Retention(#[from] RetentionError),
    #[error(transparent)]
    Linux(#[from] crate::Error),
}

/// One of Table 2's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Setting {
    SameVcpu,
    BusyYield,
    BusyPoll,
    Halted,
}

impl Setting {
    pub const ALL: [Setting; 4] = [
        Setting::SameVcpu,
        Setting::BusyYield,
        Setting::BusyPoll,
        Setting::Halted,
    ];

    /// Table 2 letter and a few words.
    pub fn label(self) -> &'static str {
        match self {
            Setting::SameVcpu => "A same vCPU",
            Setting::BusyYield => "B busy (yield thread)",
            Setting::BusyPoll => "B-poll busy (cpuidle poll)",
            Setting::Halted => "C idle (halts)",
        }
    }
}

/// Distribution of one sample set, nearest-rank percentiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyStats {
    pub count: usize,
    pub min_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub mean_ns: u64,
}

impl LatencyStats {
    /// `None` for an empty set.
    pub fn from_samples(samples: &[u64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let n = sorted.len();
        let rank = |p: f64| sorted[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        let sum: u128 = sorted.iter().map(|&x| u128::from(x)).sum();
        Some(Self {
            count: n,
            min_ns: sorted[0],
            p50_ns: rank(0.50),
            p90_ns: rank(0.90),
            p99_ns: rank(0.99),
            max_ns: sorted[n - 1],
            mean_ns: (sum / n as u128) as u64,
        })
    }
}

/// Wake latencies of one setting at one gap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbePoint {
    pub setting: Setting,
    pub gap_ns: u64,
    pub latency: LatencyStats,
    /// The measured latencies themselves, for pooling points taken apart (the calibration);
    /// not part of the report.
    #[serde(skip)]
    pub samples_ns: Vec<u64>,
    /// Mean time the wakee actually stayed blocked: the gap plus the waker's own wake-up.
    pub blocked_mean_ns: u64,
    /// Rounds dropped because the wake came before the wakee had blocked.
    pub not_blocked: usize,
    /// The same wakes timed in the kernel (`ProbeConfig::in_kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_kernel: Option<KernelTiming>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedSetting {
    pub setting: Setting,
    pub reason: String,
}

/// What the machine looks like to the guest, for reading the numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineFacts {
    pub kernel: Option<String>,
    /// Online CPUs.
    pub vcpus: usize,
    /// CPUs this process may use.
    pub allowed_cpus: Cpuset,
    /// The `hypervisor` CPU flag; `None` where /proc/cpuinfo has no flags line.
    pub hypervisor_flag: Option<bool>,
    pub cpuidle_driver: Option<String>,
    pub cpuidle_governor: Option<String>,
    /// `/sys/module/haltpoll/parameters/*`, empty when the module is absent.
    pub haltpoll_params: BTreeMap<String, String>,
}

/// Setting D stand-in: how much CPU the host took from this guest during the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StealReport {
    /// Steal / all CPU time over the run, summed over CPUs (0..1).
    pub fraction: f64,
    pub note: String,
}

/// How busy the wakee's vCPU was during one setting. In C it must be near zero: if other
/// work kept the vCPU from halting, C measured a busy wake and understates the halted cost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WakeeLoad {
    pub setting: Setting,
    pub cpu: usize,
    /// Non-idle share of the vCPU's time over the setting (0..1), from /proc/stat.
    pub busy_fraction: f64,
}

/// The retention timeout Gleaner would derive from this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DerivedTimeout {
    pub gap_ns: u64,
    pub halted_p50_ns: u64,
    /// The busy wake the hold is weighed against: B-poll where it was measured (the back end
    /// Gleaner then uses), else B.
    #[serde(default = "yield_setting")]
    pub busy_setting: Setting,
    pub busy_p50_ns: u64,
    pub timeout: RetentionTimeout,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeReport {
    pub machine: MachineFacts,
    pub waker_cpu: usize,
    pub wakee_cpu: Option<usize>,
    pub samples_per_point: usize,
    pub points: Vec<ProbePoint>,
    pub skipped: Vec<SkippedSetting>,
    pub steal: Option<StealReport>,
    pub wakee_load: Vec<WakeeLoad>,
    pub derived_timeout: Option<DerivedTimeout>,
    /// Median cost of a system call crossing on the waker's vCPU (a `FUTEX_WAKE` that wakes
    /// nobody): the probe's user-level clock includes about one, an in-kernel one does not.
    #[serde(default)]
    pub crossing_ns: Option<u64>,
    pub duration_ms: u64,
}

impl ProbeReport {
    #[cfg(test)]
    fn point(&self, setting: Setting, gap_ns: u64) -> Option<&ProbePoint> {
        self.points
            .iter()
            .find(|p| p.setting == setting && p.gap_ns == gap_ns)
    }
}

/// Result of [`quick_calibration`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuickCalibration {
    /// How the busy side kept the wakee's vCPU busy: the retention back end that will hold
    /// vCPUs ([`calibration_busy_setting`]), since the hold pays off against that wake's cost.
    #[serde(default = "yield_setting")]
    pub busy_setting: Setting,
    pub busy_p50_ns: u64,
    pub halted_p50_ns: u64,
    pub timeout: RetentionTimeout,
    /// Longest idle period after which waking a halted vCPU still costs about what waking a
    /// busy one does: the hypervisor (or the guest's haltpoll) keeps polling a freshly halted
    /// vCPU that long, so holding it for shorter idle periods gains nothing. 0 if even the
    /// shortest gap probed was already dear.
    pub host_poll_ns: u64,
}

fn yield_setting() -> Setting {
    Setting::BusyYield
}

/// Alternating busy/halted blocks in one quick calibration (see [`quick_calibration`]).
const CALIBRATION_BLOCKS: usize = 4;

/// Gaps at which the halted-vCPU wake is probed to find the host's polling window.
const POLL_WINDOW_GAPS_NS: [u64; 4] = [100_000, 200_000, 500_000, 1_000_000];

/// Runs the full probe. `progress(done, total)` is called from the calling thread a few times
/// a second with the number of wakes done so far.
pub fn measure(
    cfg: &ProbeConfig,
    mut progress: impl FnMut(u64, u64),
) -> Result<ProbeReport, ProbeError> {
    validate(cfg)?;
    let started = Instant::now();
    let machine = machine_facts(&cfg.sysfs_root, &cfg.procfs_root)?;
    let allowed: Vec<usize> = machine.allowed_cpus.iter().collect();
    let waker_cpu = *allowed.first().ok_or(ProbeError::NoCpus)?;
    let wakee_cpu = allowed.get(1).copied();

    let mut plan = vec![Setting::SameVcpu];
    let mut skipped = Vec::new();
    match wakee_cpu {
        None => {
            for setting in [Setting::BusyYield, Setting::BusyPoll, Setting::Halted] {
                skipped.push(SkippedSetting {
                    setting,
                    reason: format!("needs two vCPUs; this process may only use CPU {waker_cpu}"),
                });
            }
        }
        Some(wakee) => {
            plan.push(Setting::BusyYield);
            if !cfg.poll_setting {
                skipped.push(SkippedSetting {
                    setting: Setting::BusyPoll,
                    reason: "disabled".into(),
                });
            } else if let Err(e) = open_poll(cfg, wakee) {
                skipped.push(SkippedSetting {
                    setting: Setting::BusyPoll,
                    reason: e.to_string(),
                });
            } else {
                plan.push(Setting::BusyPoll);
            }
            plan.push(Setting::Halted);
        }
    }

    let rounds = (cfg.warmup + cfg.samples) as u64;
    let total = plan.len() as u64 * cfg.gaps_ns.len() as u64 * rounds;
    let mut done = 0u64;
    progress(0, total);
    let proc = ProcFs::new(&cfg.procfs_root);
    let steal_before = cpu_times(&proc, None).ok();
    let clock = if cfg.in_kernel {
        Some(KernelClock::open(cfg).map_err(|reason| ProbeError::InKernel { reason })?)
    } else {
        None
    };
    let mut points = Vec::new();
    let mut wakee_load = Vec::new();
    for &setting in &plan {
        let wakee = if setting == Setting::SameVcpu {
            waker_cpu
        } else {
            wakee_cpu.unwrap_or(waker_cpu)
        };
        let env = SettingEnv::enter(setting, wakee, cfg)?;
        let load_before = cpu_times(&proc, Some(wakee)).ok();
        for &gap_ns in &cfg.gaps_ns {
            let before = clock.as_ref().map(KernelClock::read);
            let mut point = run_point(setting, waker_cpu, wakee, gap_ns, cfg, |d| {
                progress(done + d, total)
            })?;
            if let (Some(clock), Some(before)) = (&clock, before) {
                point.in_kernel = KernelClock::timing(&before, &clock.read(), setting, wakee);
            }
            done += rounds;
            // The report keeps the distribution, not every sample.
            point.samples_ns = Vec::new();
            points.push(point);
        }
        if let (Some(before), Ok(after)) = (load_before, cpu_times(&proc, Some(wakee))) {
            wakee_load.push(WakeeLoad {
                setting,
                cpu: wakee,
                busy_fraction: after.busy_fraction_since(&before),
            });
        }
        env.leave()?;
    }
    progress(total, total);
    let steal = match (steal_before, cpu_times(&proc, None).ok()) {
        (Some(before), Some(after)) => Some(StealReport {
            fraction: after.steal_fraction_since(&before),
            note: "setting D (another VM contending for the host CPUs) cannot be created from inside a guest; \
                   this is the share of CPU time the host took from this guest during the run"
                .into(),
        }),
        _ => None,
    };
    let derived_timeout = derive_timeout(&points);
    let crossing_ns = crossing_ns(waker_cpu).ok();
    Ok(ProbeReport {
        machine,
        waker_cpu,
        wakee_cpu,
        samples_per_point: cfg.samples,
        points,
        skipped,
        steal,
        wakee_load,
        derived_timeout,
        crossing_ns,
        duration_ms: started.elapsed().as_millis() as u64,
    })
}

/// How a calibration keeps the wakee's vCPU busy: by cpuidle polling (B-poll) where Gleaner
/// will hold vCPUs that way (`prefer_poll`, i.e. a retention back end other than `yield`, and
/// a guest whose wakee CPU has a POLL state, the condition `PollRetention` starts under), else
/// by a yielding thread (B). The hold is worth what the held vCPU's wake saves, and the two
/// differ a lot: on a haltpoll guest a polling vCPU woke in 2.6 µs where a yield-held one took
/// 15 µs. Polling is also the stabler side to subtract: its wake cost barely moves.
pub fn calibration_busy_setting(sysfs_root: &Path, prefer_poll: bool) -> Setting {
    let wakee = thread_affinity(0).ok().and_then(|c| c.iter().nth(1));
    let sys = SysFs::new(sysfs_root);
    let can_poll = |cpu: usize| {
        PollRetention::new(&sys, &[cpu].into_iter().collect(), Box::new(|_| Ok(()))).is_ok()
            // Without the right to write PM QoS (not root) the poll back end cannot hold.
            && nix::unistd::access(&sys.pm_qos_path(cpu), nix::unistd::AccessFlags::W_OK).is_ok()
    };
    match wakee {
        Some(cpu) if prefer_poll && can_poll(cpu) => Setting::BusyPoll,
        _ => Setting::BusyYield,
    }
}

/// A short B (or B-poll, `busy`) and C measurement (≈ 0.45 s) for the daemon's start-up: the
/// break-even retention timeout from the median busy and halted wake costs. With B-poll the
/// wakee's PM QoS is changed and restored per block; `on_pmqos_original` (the caller's crash
/// journal) hears of it first.
pub fn quick_calibration(
    busy: Setting,
    on_pmqos_original: Option<PmQosHook>,
) -> Result<QuickCalibration, ProbeError> {
    if !matches!(busy, Setting::BusyYield | Setting::BusyPoll) {
        return Err(ProbeError::Config {
            reason: format!("{busy:?} is not a busy setting (BusyYield or BusyPoll)"),
        });
    }
    let allowed: Vec<usize> = thread_affinity(0)
        .map_err(|source| ProbeError::Affinity { source })?
        .iter()
        .collect();
    let (&waker, &wakee) = match (allowed.first(), allowed.get(1)) {
        (Some(a), Some(b)) => (a, b),
        _ => {
            return Err(ProbeError::TooFewCpus {
                allowed: allowed.iter().copied().collect::<Cpuset>().to_string(),
            })
        }
    };
    let cfg = ProbeConfig {
        warmup: 3,
        on_pmqos_original,
        ..ProbeConfig::default()
    };
    // A busy wake does not depend on the gap; a halted one only shows its full cost once the
    // host has stopped polling the halted vCPU, hence the longer gap.
    //
    // The two are measured in alternating blocks and each pooled: what the host does to this
    // guest drifts over a fraction of a second (one run's halted median moved 37 -> 66 µs
    // between runs 0.2 s apart), and a drift that falls on only one of the two medians moves
    // their difference, the hold, by as much. Alternating puts it on both.
    let busy_cfg = ProbeConfig {
        samples: 40,
        ..cfg.clone()
    };
    // The hold's noise is the halted median's: the busy one barely moves (2.5-2.9 µs polling
    // on the haltpoll guest), so the halted side gets the samples. With 25 a block, ten starts
    // on a quiet machine derived holds 15.0-20.3 µs (max/min 1.35).
    let halted_cfg = ProbeConfig { samples: 50, ..cfg };
    let (mut busy_ns, mut halted_ns) = (Vec::new(), Vec::new());
    for _ in 0..CALIBRATION_BLOCKS {
        let env = SettingEnv::enter(busy, wakee, &busy_cfg)?;
        let point = run_point(busy, waker, wakee, 200_000, &busy_cfg, |_| {});
        env.leave()?;
        busy_ns.extend(point?.samples_ns);
        let halted = run_point(
            Setting::Halted,
            waker,
            wakee,
            2_000_000,
            &halted_cfg,
            |_| {},
        )?;
        halted_ns.extend(halted.samples_ns);
    }
    let p50 = |v: &[u64]| LatencyStats::from_samples(v).map_or(0, |s| s.p50_ns);
    let (busy_p50_ns, halted_p50_ns) = (p50(&busy_ns), p50(&halted_ns));
    let mut host_poll_ns = 0;
    let window_cfg = ProbeConfig {
        samples: 25,
        ..halted_cfg
    };
    for gap in POLL_WINDOW_GAPS_NS {
        let p = run_point(Setting::Halted, waker, wakee, gap, &window_cfg, |_| {})?;
        // "About what a busy wake costs": within a quarter of the way to the full halted cost.
        if p.latency.p50_ns <= busy_p50_ns + halted_p50_ns.saturating_sub(busy_p50_ns) / 4 {
            host_poll_ns = gap;
        } else {
            break;
        }
    }
    Ok(QuickCalibration {
        busy_setting: busy,
        busy_p50_ns,
        halted_p50_ns,
        timeout: RetentionTimeout::from_wake_costs(halted_p50_ns, busy_p50_ns),
        host_poll_ns,
    })
}

fn validate(cfg: &ProbeConfig) -> Result<(), ProbeError> {
    let bad = |reason: String| Err(ProbeError::Config { reason });
    if cfg.samples == 0 {
        return bad("samples must be at least 1".into());
    }
    if cfg.samples > 1_000_000 {
        return bad(format!(
            "{} samples per point is more than the 1000000 allowed",
            cfg.samples
        ));
    }
    if cfg.gaps_ns.is_empty() {
        return bad("no gaps given".into());
    }
    if let Some(&gap) = cfg
        .gaps_ns
        .iter()
        .find(|&&g| !(MIN_GAP_NS..=MAX_GAP_NS).contains(&g))
    {
        return bad(format!("gap {gap} ns is outside 1 µs ..= 1 s"));
    }
    Ok(())
}

/// The break-even hold from C and B medians at the largest gap measured for both; B-poll
/// stands for B where it was measured, since Gleaner then holds vCPUs by polling.
fn derive_timeout(points: &[ProbePoint]) -> Option<DerivedTimeout> {
    let at = |setting: Setting, gap: u64| {
        points
            .iter()
            .find(|p| p.setting == setting && p.gap_ns == gap)
    };
    let busy_setting = if points.iter().any(|p| p.setting == Setting::BusyPoll) {
        Setting::BusyPoll
    } else {
        Setting::BusyYield
    };
    let gap_ns = points
        .iter()
        .filter(|p| p.setting == Setting::Halted && at(busy_setting, p.gap_ns).is_some())
        .map(|p| p.gap_ns)
        .max()?;
    let halted_p50_ns = at(Setting::Halted, gap_ns)?.latency.p50_ns;
    let busy_p50_ns = at(busy_setting, gap_ns)?.latency.p50_ns;
    Some(DerivedTimeout {
        gap_ns,
        halted_p50_ns,
        busy_setting,
        busy_p50_ns,
        timeout: RetentionTimeout::from_wake_costs(halted_p50_ns, busy_p50_ns),
    })
}

fn open_poll(cfg: &ProbeConfig, cpu: usize) -> crate::Result<PollRetention> {
    let hook = cfg.on_pmqos_original.clone();
    PollRetention::new(
        &SysFs::new(&cfg.sysfs_root),
        &[cpu].into_iter().collect(),
        Box::new(move |action| match &hook {
            Some(hook) => hook(action),
            None => Ok(()),
        }),
    )
}

mod kernel;
mod point;
use kernel::KernelClock;
pub use kernel::KernelTiming;
use point::{crossing_ns, run_point, SettingEnv};

/// The aggregate times (`cpu: None`) or one CPU's times from /proc/stat.
fn cpu_times(proc: &ProcFs, cpu: Option<usize>) -> crate::Result<CpuTimes> {
    let stat = proc.stat()?;
    match cpu {
        None => Ok(stat.total),
        Some(n) => stat
            .per_cpu
            .iter()
            .find(|c| c.cpu == n)
            .map(|c| c.times)
            .ok_or_else(|| {
                crate::Error::parse(proc.root().join("stat"), format!("cpu{n} line"), "")
            }),
    }
}

/// Reads the facts that explain the numbers; absent or unreadable files become `None` or
/// empty, since they only annotate the measurement.
pub fn machine_facts(sysfs_root: &Path, procfs_root: &Path) -> Result<MachineFacts, ProbeError> {
    let allowed_cpus = thread_affinity(0).map_err(|source| ProbeError::Affinity { source })?;
    let (sys, proc) = (SysFs::new(sysfs_root), ProcFs::new(procfs_root));
    let vcpus = sys.online_cpus().map(|c| c.len()).unwrap_or_else(|_| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(allowed_cpus.len())
    });
    Ok(MachineFacts {
        kernel: proc.kernel_release().ok(),
        vcpus,
        allowed_cpus,
        hypervisor_flag: proc.hypervisor_flag().ok().flatten(),
        cpuidle_driver: sys.cpuidle_driver().ok().flatten(),
        cpuidle_governor: sys.cpuidle_governor().ok().flatten(),
        haltpoll_params: sys.haltpoll_params().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests;
