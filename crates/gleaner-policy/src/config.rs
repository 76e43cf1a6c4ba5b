//! Tunables of the policy, each with the default a user gets when they set nothing.
//!
//! Validation lives here so a bad value is refused with a message naming the fix before any
//! CPU is touched.

use serde::{Deserialize, Serialize};

use crate::retention::RetentionTimeout;

/// Which of Gleaner's mechanisms run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Retention and imbalanced scheduling, each only where measurement says it pays (§5).
    #[default]
    Full,
    /// Retention only; the workload keeps every vCPU.
    Retention,
    /// Imbalanced scheduling only; vCPUs are never held.
    Consolidation,
    /// No policy: hold every vCPU all the time (the naive always-on yield loop), for comparison.
    AlwaysYield,
}

impl Mode {
    /// The name used in config files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Retention => "retention",
            Mode::Consolidation => "consolidation",
            Mode::AlwaysYield => "always-yield",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            Mode::Full,
            Mode::Retention,
            Mode::Consolidation,
            Mode::AlwaysYield,
        ]
        .into_iter()
        .find(|m| m.name() == s)
        .ok_or_else(|| {
            format!("unknown mode {s:?}: use full, retention, consolidation or always-yield")
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    pub mode: Mode,
    /// Load factor rho of condition (1), in (0, 1].
    pub rho: f64,
    /// Granularity factor eta of condition (2), in (0, 1].
    pub eta: f64,
    /// The guest scheduler's minimum time slice (condition (2)); the daemon reads the
    /// kernel's value when it can.
    pub min_time_slice_ns: u64,
    /// Break-even retention hold; the daemon derives it from measured wake costs. Written
    /// `retention_timeout_ns = N` (nanoseconds).
    #[serde(rename = "retention_timeout_ns", with = "crate::retention::as_ns")]
    pub retention_timeout: RetentionTimeout,
    /// A relative drop of workload utilization this large after a change counts as a slowdown
    /// and undoes the change. Smaller values chase noise: run-to-run noise of one period here
    /// is a few percent.
    pub slowdown_threshold: f64,
    /// Major change: relative change of total utilization (paper: 20 %).
    pub major_util_change: f64,
    /// A consolidated vCPU newly busier than this (paper: 90 %, a major change): with the
    /// workload's utilization and grain unchanged it undoes only the last accepted step
    /// (`Gleaner::step_back`), as the set is a little short rather than facing a new program.
    pub major_vcpu_util: f64,
    /// Major change: g_comp grew by this factor or shrank by its inverse (paper: 2x / 50 %).
    pub major_gcomp_factor: f64,
    /// Periods to wait after any change before judging it or making another.
    pub settle_periods: u32,
    /// Periods at the start of a run in which nothing is changed: the workload is starting.
    pub warmup_periods: u32,
    /// The first this many periods of a run last a quarter of the configured period (see
    /// [`crate::Gleaner::next_period_ns`]): a short job pays for every period spent before the
    /// first decision and its verdict. 0 keeps every period at full length.
    pub startup_periods: u32,
    /// Retention is worth a SCHED_IDLE thread's costs (a reschedule IPI per wake, no new-idle
    /// balancing) only above this many idle periods per second per vCPU, raised by steal;
    /// where the sampler sees the wake-ups' idle ages, a quarter of it whatever the steal
    /// (the hit ratio then weighs what a hold catches; `engine::hold::min_idle_rate`).
    pub min_idle_periods_per_sec: f64,
    /// Where the wake-ups' idle ages are not seen (procfs), turn retention on only where the
    /// mean idle period is at most this multiple of the timeout: longer idle periods would
    /// mostly time out, burning CPU for nothing. A mean
    /// hides the short idle periods a hold catches (a barrier's waits spread widely), and a
    /// break-even hold never costs more than twice the best choice whatever their lengths;
    /// a hold that does not pay is undone by its trial. 4 (was 2): on the policy lab's tuning
    /// set, held vCPUs paid with mean idle periods of 41 µs against a 20 µs hold.
    pub retain_idle_factor: f64,
    /// Retention only where the mean idle period is at least this long: shorter idle periods
    /// are already cheap because the hypervisor keeps polling a freshly halted vCPU (the
    /// daemon measures this window; 0 assumes every halt is dear, as in the paper).
    pub min_retain_idle_ns: u64,
    /// The start-up probe's median wake-up of a halted vCPU (the daemon measures it; 0:
    /// unknown). Where the sampler sees no wake-ups (procfs), it stands in for their live
    /// median in bounding the kernel's path out of idle that condition (1) counts as room
    /// (`characteristics::characterize_with`).
    pub probe_halted_wake_ns: u64,
    /// Turn retention off when fewer than this fraction of held idle periods ended with work;
    /// where idle ages are seen, turn it on only when at least this fraction of the idle
    /// periods would have. Where the wake-ups' costs were measured, the fraction at which a
    /// hold's hits pay for its misses is used instead when it is smaller
    /// (`engine::hold::min_hit_ratio`): this is the most a hold must catch.
    pub min_retention_hit_ratio: f64,
    /// Workload threads queue on one active vCPU while another has none for more than this
    /// fraction of a period: the guest must balance load, so neither consolidate nor hold (a
    /// held vCPU does not pull waiting threads over by new-idle balancing).
    pub max_runnable_wait: f64,
    /// Below this total utilization the workload is idle: hold nothing.
    pub idle_util: f64,
    /// Longest back-off, in periods, before retrying retention that was undone as harmful.
    pub max_backoff_periods: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Full,
            rho: 1.0,
            eta: 1.0,
            min_time_slice_ns: 3_000_000,
            retention_timeout: RetentionTimeout::default(),
            slowdown_threshold: 0.05,
            major_util_change: 0.20,
            major_vcpu_util: 0.90,
            major_gcomp_factor: 2.0,
            settle_periods: 2,
            warmup_periods: 2,
            startup_periods: 8,
            min_idle_periods_per_sec: 2_000.0,
            retain_idle_factor: 4.0,
            min_retain_idle_ns: 0,
            probe_halted_wake_ns: 0,
            min_retention_hit_ratio: 0.5,
            max_runnable_wait: 0.10,
            idle_util: 0.02,
            max_backoff_periods: 64,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("{name} = {value} is outside (0, 1]: set it to a value such as 0.9")]
    FactorOutOfRange { name: &'static str, value: f64 },
    #[error("{name} = {value} is invalid: {fix}")]
    Invalid {
        name: &'static str,
        value: String,
        fix: &'static str,
    },
    #[error("the allowed CPU set is empty: give the workload at least one CPU")]
    EmptyAllowedSet,
}

impl PolicyConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, value) in [("rho", self.rho), ("eta", self.eta)] {
            if !(value > 0.0 && value <= 1.0) {
                return Err(ConfigError::FactorOutOfRange { name, value });
            }
        }
        let fractions = [
            ("slowdown_threshold", self.slowdown_threshold),
            ("major_util_change", self.major_util_change),
            ("major_vcpu_util", self.major_vcpu_util),
            ("min_retention_hit_ratio", self.min_retention_hit_ratio),
            ("max_runnable_wait", self.max_runnable_wait),
            ("idle_util", self.idle_util),
        ];
        for (name, value) in fractions {
            if !(value > 0.0 && value <= 1.0) {
                return Err(ConfigError::FactorOutOfRange { name, value });
            }
        }
        if !(self.major_gcomp_factor > 1.0 && self.major_gcomp_factor.is_finite()) {
            return Err(ConfigError::Invalid {
                name: "major_gcomp_factor",
                value: self.major_gcomp_factor.to_string(),
                fix: "use a finite factor above 1, e.g. 2.0",
            });
        }
        if !(self.min_idle_periods_per_sec >= 0.0 && self.min_idle_periods_per_sec.is_finite()) {
            return Err(ConfigError::Invalid {
                name: "min_idle_periods_per_sec",
                value: self.min_idle_periods_per_sec.to_string(),
                fix: "use a non-negative rate, e.g. 2000",
            });
        }
        if !(self.retain_idle_factor > 0.0 && self.retain_idle_factor.is_finite()) {
            return Err(ConfigError::Invalid {
                name: "retain_idle_factor",
                value: self.retain_idle_factor.to_string(),
                fix: "use a positive factor, e.g. 2.0",
            });
        }
        if self.min_time_slice_ns == 0 {
            return Err(ConfigError::Invalid {
                name: "min_time_slice_ns",
                value: "0".into(),
                fix: "use the guest's slice, e.g. 3000000",
            });
        }
        if self.retention_timeout.ns == 0 {
            return Err(ConfigError::Invalid {
                name: "retention_timeout_ns",
                value: "0".into(),
                fix: "use a hold such as 30000, or let gleaner derive it",
            });
        }
        if self.max_backoff_periods == 0 {
            return Err(ConfigError::Invalid {
                name: "max_backoff_periods",
                value: "0".into(),
                fix: "use at least 1, e.g. 64",
            });
        }
        Ok(())
    }
}
