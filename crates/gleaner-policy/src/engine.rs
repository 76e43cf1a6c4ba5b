//! The decision rules of §5: which vCPUs stay active, and which of them are held.
//!
//! One `Gleaner` value per managed workload. Each period the caller hands it a
//! [`PeriodSample`]; it answers with a [`Decision`]. Every change is made one step at a time,
//! given `settle_periods` to take effect, and then judged by the workload's utilization, the
//! paper's proxy for progress: a change that slows the workload is undone. That judge is what
//! lets the same policy take the gains (fine-grained pipelines, ping-pong) without the losses
//! measured on this test bed (coarse pipelines, `sysbench threads`, `stress-ng --futex`).

use serde::{Deserialize, Serialize};

use crate::characteristics::characterize;
use crate::config::{ConfigError, Mode, PolicyConfig};
use crate::cpuset::Cpuset;
use crate::retention::RetentionTimeout;
use crate::sample::{progress_signal, Characteristics, PeriodSample, VcpuSample};

/// What to do with one vCPU's idle time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "action")]
pub enum RetentionAction {
    /// Let the vCPU halt when idle (the guest's default).
    Off,
    /// Hold the vCPU for up to `timeout_ns` of each idle period, then release it.
    Retain { timeout_ns: u64 },
}

/// Hold that never times out, used by [`Mode::AlwaysYield`].
pub const FOREVER_NS: u64 = u64::MAX;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum EventKind {
    Deactivate { cpu: usize },
    Rollback { cpu: usize },
    MajorChange,
    RetentionOn { cpus: Vec<usize> },
    RetentionOff { cpus: Vec<usize> },
}

/// A decision and why it was made, for logs and `gleaner status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyEvent {
    pub period: u64,
    #[serde(flatten)]
    pub kind: EventKind,
    pub reason: String,
}

/// The policy's answer for the next period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// vCPUs the workload may run on.
    pub active: Cpuset,
    /// One entry per allowed vCPU, in increasing CPU order.
    pub retention: Vec<(usize, RetentionAction)>,
    /// What changed this period, with reasons; empty when nothing did.
    pub events: Vec<PolicyEvent>,
    /// The measurements the decision was based on.
    pub characteristics: Characteristics,
    pub rho: f64,
    pub eta: f64,
    /// The hold in force after adapting to steal.
    pub retention_timeout: RetentionTimeout,
}

#[derive(Debug, Clone)]
struct Deactivation {
    /// The vCPUs this step deactivated (several when the evidence allowed a larger step).
    cpus: Vec<usize>,
    before: Characteristics,
    n_before: usize,
}

/// A retention change awaiting its verdict.
#[derive(Debug, Clone)]
struct RetentionTrial {
    cpus: Vec<usize>,
    util_before: f64,
}

#[derive(Debug, Clone, Default)]
struct VcpuState {
    retaining: bool,
}

/// The policy state machine for one workload.
#[derive(Debug, Clone)]
pub struct Gleaner {
    cfg: PolicyConfig,
    allowed: Cpuset,
    active: Cpuset,
    rho: f64,
    eta: f64,
    timeout: RetentionTimeout,
    period: u64,
    /// Periods left before the last change may be judged or another made.
    settle: u32,
    /// Deactivated vCPUs, most recent last, each with what was measured before it.
    deactivated: Vec<Deactivation>,
    /// The most recent deactivation, until it has been judged.
    judging: Option<Deactivation>,
    /// Characteristics of the settled state, against which major changes are detected.
    reference: Option<Characteristics>,
    vcpus: Vec<(usize, VcpuState)>,
    trial: Option<RetentionTrial>,
    /// Retention may not be tried again before this period (exponential back-off).
    retention_blocked_until: u64,
    retention_backoff: u32,
    /// Smoothed total utilization of the current configuration: the "before" of the next change.
    util_smoothed: Option<f64>,
    /// Utilization of the last period in which nothing changed, and the smoothed relative
    /// change between such periods: how noisy this workload's utilization is on its own.
    last_quiet_util: Option<f64>,
    noise: f64,
    /// Utilization seen since the change being judged settled.
    verdict: Verdict,
    /// The judged value (progress, else utilization) of the last quiet periods: the "before"
    /// sample of a change's test, and the measure of this workload's noise.
    quiet_values: std::collections::VecDeque<f64>,
    /// This period's workload is idle (by its real utilization, whatever is judged).
    workload_idle: bool,
    /// Most vCPUs one deactivation step may take away: half the allowed set at first,
    /// halved by every rollback of a multi-vCPU step.
    max_step: usize,
}

/// Periods of evidence collected before a change is judged; one period is too noisy.
const JUDGE_PERIODS: u32 = 3;

/// Quiet periods remembered as the "before" sample of the next change's test.
const QUIET_WINDOW: usize = 8;

/// Evidence about a change, collected over [`JUDGE_PERIODS`] periods after it settled.
#[derive(Debug, Clone, Default)]
struct Verdict {
    values: Vec<f64>,
    max_vcpu_util: f64,
}

/// What the periods after a change showed.
#[derive(Debug, Clone)]
struct Evidence {
    mean: f64,
    values: Vec<f64>,
    /// Standard deviation of one period's value.
    sd: f64,
    periods: usize,
    busiest: f64,
}

impl Verdict {
    /// Adds a period (its judged value: progress, else utilization); returns the evidence
    /// once enough periods were seen.
    fn observe(&mut self, c: &Characteristics) -> Option<Evidence> {
        self.values.push(c.total_util);
        self.max_vcpu_util = self.max_vcpu_util.max(c.max_vcpu_util);
        if self.values.len() < JUDGE_PERIODS as usize {
            return None;
        }
        let (mean, sd) = mean_sd(&self.values);
        let out = Evidence {
            mean,
            values: self.values.clone(),
            sd,
            periods: self.values.len(),
            busiest: self.max_vcpu_util,
        };
        *self = Verdict::default();
        Some(out)
    }
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

impl Gleaner {
    pub fn new(cfg: PolicyConfig, allowed: Cpuset) -> Result<Self, ConfigError> {
        cfg.validate()?;
        if allowed.is_empty() {
            return Err(ConfigError::EmptyAllowedSet);
        }
        let vcpus = allowed.iter().map(|c| (c, VcpuState::default())).collect();
        let max_step = (allowed.len() / 2).max(1);
        Ok(Self {
            rho: cfg.rho,
            eta: cfg.eta,
            timeout: cfg.retention_timeout,
            cfg,
            active: allowed.clone(),
            allowed,
            period: 0,
            settle: 0,
            deactivated: Vec::new(),
            judging: None,
            reference: None,
            vcpus,
            trial: None,
            retention_blocked_until: 0,
            retention_backoff: 1,
            util_smoothed: None,
            last_quiet_util: None,
            noise: 0.0,
            verdict: Verdict::default(),
            quiet_values: std::collections::VecDeque::new(),
            workload_idle: false,
            max_step,
        })
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    pub fn active(&self) -> &Cpuset {
        &self.active
    }

    /// For observe-only runs, which apply nothing: forgets the change this step proposed, so
    /// that the next period is judged from the configuration that really runs (every vCPU
    /// active, nothing held). A change that was never made is never judged by measurements
    /// that cannot reflect it (holds that never happened all "time out"); while its conditions
    /// hold, the change is simply proposed again.
    pub fn forget_changes(&mut self) {
        self.active = self.allowed.clone();
        self.deactivated.clear();
        self.judging = None;
        self.trial = None;
        for (_, st) in self.vcpus.iter_mut() {
            st.retaining = false;
        }
        self.settle = 0;
        self.verdict = Verdict::default();
    }

    /// Why the policy would neither hold a vCPU nor consolidate the workload with
    /// characteristics `c` (all vCPUs active): one line per mechanism, naming the measured
    /// value and the condition it misses. Empty when both would act.
    pub fn why_unchanged(&self, c: &Characteristics) -> Vec<String> {
        let mut why = Vec::new();
        if c.total_util < self.cfg.idle_util {
            why.push(format!(
                "the workload was idle (utilization {:.2} < {:.2}): nothing to gain",
                c.total_util, self.cfg.idle_util
            ));
            return why;
        }
        if c.runnable_wait_fraction > self.cfg.max_runnable_wait {
            why.push(format!(
                "workload threads queued for a CPU {:.0} % of the time while another vCPU had none: neither a held nor a removed vCPU would help",
                c.runnable_wait_fraction * 100.0
            ));
        }
        if matches!(self.cfg.mode, Mode::Full | Mode::Retention) {
            let timeout = self.timeout.adapted(c.steal_fraction);
            let min_rate = self.cfg.min_idle_periods_per_sec * (1.0 + 10.0 * c.steal_fraction);
            let max_idle = self.cfg.retain_idle_factor * timeout.ns as f64;
            if c.idle_periods_per_sec < min_rate {
                why.push(format!(
                    "retention: {:.0} idle periods/s per vCPU, fewer than the {:.0} that pay for a held vCPU",
                    c.idle_periods_per_sec, min_rate
                ));
            } else if c.l_idle_ns > max_idle {
                why.push(format!("retention: idle periods of {} on average outlast the hold ({}): most holds would time out", us(c.l_idle_ns), us(timeout.ns as f64)));
            } else if c.l_idle_ns < self.cfg.min_retain_idle_ns as f64 {
                why.push(format!(
                    "retention: idle periods of {} are shorter than the {} in which the host still polls a halted vCPU: wake-ups are cheap already",
                    us(c.l_idle_ns),
                    us(self.cfg.min_retain_idle_ns as f64)
                ));
            }
        }
        if matches!(self.cfg.mode, Mode::Full | Mode::Consolidation) {
            let n = self.allowed.len();
            let room = self.rho * n.saturating_sub(1) as f64 * c.l_idle_ns;
            let grain = (self.eta * c.l_idle_ns).min(self.cfg.min_time_slice_ns as f64);
            if n <= 1 {
                why.push("consolidation: the workload has one vCPU".into());
            } else if c.l_comp_ns > room {
                why.push(format!(
                    "consolidation: l_comp {} > rho x (N-1) x l_idle = {}: the other vCPUs lack the idle time to take one vCPU's work",
                    us(c.l_comp_ns),
                    us(room)
                ));
            } else if c.g_comp_ns > grain {
                why.push(format!(
                    "consolidation: g_comp {} > min(eta x l_idle, slice) = {}: threads synchronize too rarely for packing them to pay",
                    us(c.g_comp_ns),
                    us(grain)
                ));
            }
        }
        why
    }

    pub fn allowed(&self) -> &Cpuset {
        &self.allowed
    }

    /// Consumes one period's sample and decides the next period.
    pub fn step(&mut self, sample: &PeriodSample) -> Decision {
        self.period += 1;
        let measured = characterize(sample, &self.active);
        self.workload_idle = measured.total_util < self.cfg.idle_util;
        // Changes are judged by progress: the application's own count where it gives one.
        // Without one, utilization stands in (the policy lab measured it tracking throughput
        // across settings far better than any estimate from wake counts; see README).
        let mut c = measured;
        if sample.progress.is_some() {
            c.total_util = progress_signal(sample);
        }
        let mut events = Vec::new();
        // The first periods of a run are the workload starting up (threads being created,
        // caches filling): nothing is changed on their evidence.
        let settling = self.settle > 0 || self.period <= u64::from(self.cfg.warmup_periods);
        self.settle = self.settle.saturating_sub(1);
        match self.cfg.mode {
            Mode::AlwaysYield => {
                let retention = self
                    .allowed
                    .iter()
                    .map(|cpu| {
                        (
                            cpu,
                            RetentionAction::Retain {
                                timeout_ns: FOREVER_NS,
                            },
                        )
                    })
                    .collect();
                return self.decision(measured, retention, events, FOREVER_NS);
            }
            Mode::Full | Mode::Consolidation => {
                if !settling {
                    self.consolidation_step(sample, &c, &mut events)
                }
            }
            Mode::Retention => {}
        }
        let timeout = self.timeout.adapted(c.steal_fraction);
        let retention = match self.cfg.mode {
            Mode::Full | Mode::Retention => {
                self.retention_step(sample, &c, timeout, settling, &mut events)
            }
            _ => self
                .allowed
                .iter()
                .map(|cpu| (cpu, RetentionAction::Off))
                .collect(),
        };
        let quiet =
            events.is_empty() && !settling && self.judging.is_none() && self.trial.is_none();
        if quiet && !self.is_idle() {
            self.quiet_values.push_back(c.total_util);
            if self.quiet_values.len() > QUIET_WINDOW {
                self.quiet_values.pop_front();
            }
            self.util_smoothed = Some(self.util_now(&c));
            if let Some(prev) = self.last_quiet_util {
                let change = (c.total_util - prev).abs() / prev.max(self.cfg.idle_util);
                self.noise = if self.noise == 0.0 {
                    change
                } else {
                    0.75 * self.noise + 0.25 * change
                };
            }
            self.last_quiet_util = Some(c.total_util);
        } else if !events.is_empty() {
            self.util_smoothed = None;
            self.last_quiet_util = None;
            self.quiet_values.clear();
        }
        self.decision(measured, retention, events, timeout.ns)
    }

    fn decision(
        &self,
        c: Characteristics,
        retention: Vec<(usize, RetentionAction)>,
        events: Vec<PolicyEvent>,
        timeout_ns: u64,
    ) -> Decision {
        Decision {
            active: self.active.clone(),
            retention,
            events,
            characteristics: c,
            rho: self.rho,
            eta: self.eta,
            retention_timeout: RetentionTimeout { ns: timeout_ns },
        }
    }

    fn event(&self, kind: EventKind, reason: String) -> PolicyEvent {
        PolicyEvent {
            period: self.period,
            kind,
            reason,
        }
    }

    fn is_idle(&self) -> bool {
        self.workload_idle
    }

    /// Utilization before the change about to be made: smoothed over the quiet periods that
    /// preceded it, so a single noisy period does not decide a rollback.
    fn util_before(&self, c: &Characteristics) -> f64 {
        self.util_smoothed.unwrap_or(c.total_util)
    }

    /// This period's utilization smoothed with the quiet periods before it.
    fn util_now(&self, c: &Characteristics) -> f64 {
        self.util_smoothed
            .map_or(c.total_util, |s| 0.5 * s + 0.5 * c.total_util)
    }

    /// Is a change that moved the judged value from `before` to `after` a slowdown?
    ///
    /// A two-sample test instead of a fixed threshold: the drop must exceed twice its standard
    /// error, from the spread of the quiet periods before the change and of the periods after
    /// it (a rollback that chases noise also lowers rho or eta for good). The configured
    /// `slowdown_threshold` applies only until a few quiet periods have shown the noise; a
    /// drop under 1 % is never acted on.
    fn significant_drop(&self, before: f64, after: &Evidence) -> Option<f64> {
        let drop = relative_drop(before, after.mean);
        if self.quiet_values.len() < 3 || before <= 0.0 {
            return (drop > self.cfg.slowdown_threshold.max(2.0 * self.noise)).then_some(drop);
        }
        let quiet: Vec<f64> = self.quiet_values.iter().copied().collect();
        let (_, sd_before) = mean_sd(&quiet);
        let se = (sd_before.powi(2) / quiet.len() as f64
            + after.sd.powi(2) / after.periods.max(1) as f64)
            .sqrt();
        let threshold = (2.0 * se / before).max(0.01);
        (drop > threshold).then_some(drop)
    }

    fn consolidation_step(
        &mut self,
        sample: &PeriodSample,
        c: &Characteristics,
        events: &mut Vec<PolicyEvent>,
    ) {
        if self.is_idle() {
            return;
        }
        if let Some(d) = self.judging.clone() {
            let Some(evidence) = self.verdict.observe(c) else {
                return;
            };
            self.judging = None;
            let (after, busiest) = (evidence.mean, evidence.busiest);
            if let Some(drop) = self.significant_drop(d.before.total_util, &evidence) {
                self.rollback(d, after, busiest, drop, events);
                return;
            }
            // The periods that accepted the change are the "before" of the next one.
            self.quiet_values = evidence.values.iter().copied().collect();
            self.util_smoothed = Some(after);
            let mut accepted = *c;
            accepted.total_util = after;
            accepted.max_vcpu_util = busiest;
            self.reference = Some(accepted);
            return;
        }
        if let Some(r) = self.reference {
            if let Some(reason) = self.major_change(&r, c) {
                let consolidated = self.active != self.allowed;
                self.reference = None;
                if consolidated {
                    self.active = self.allowed.clone();
                    self.deactivated.clear();
                    self.settle = self.cfg.settle_periods;
                    events.push(self.event(
                        EventKind::MajorChange,
                        format!("{reason}: reactivating all vCPUs"),
                    ));
                }
                return;
            }
        } else {
            self.reference = Some(*c);
        }
        // One kind of change at a time: a retention trial in progress would confound the judge.
        if self.trial.is_some() {
            return;
        }
        self.try_deactivate(sample, c, events);
    }

    fn rollback(
        &mut self,
        d: Deactivation,
        after: f64,
        busiest: f64,
        drop: f64,
        events: &mut Vec<PolicyEvent>,
    ) {
        for &cpu in &d.cpus {
            self.active.insert(cpu);
        }
        self.deactivated.retain(|x| x.cpus != d.cpus);
        let b = &d.before;
        self.settle = self.cfg.settle_periods;
        self.reference = None;
        if d.cpus.len() > 1 {
            // A large step failed: try smaller ones before concluding the load condition is
            // too loose.
            self.max_step = (d.cpus.len() / 2).max(1);
            for &cpu in &d.cpus {
                events.push(self.event(
                    EventKind::Rollback { cpu },
                    format!(
                        "utilization fell {:.0} % ({:.2} -> {:.2}) after deactivating vCPUs {:?}; steps now at most {}",
                        drop * 100.0,
                        b.total_util,
                        after,
                        d.cpus,
                        self.max_step
                    ),
                ));
            }
            return;
        }
        let cpu = d.cpus[0];
        // §5: a vCPU driven to 100 % means it was overloaded by too-coarse work (Figure 4(b)),
        // so tighten the granularity condition; otherwise the others lacked the idle time to
        // absorb the load, so tighten the load condition. Both are set just below the values
        // that let this consolidation through, so the same situation is refused next time.
        let adjusted = if busiest >= 0.99 {
            let ratio = if b.l_idle_ns > 0.0 {
                b.g_comp_ns / b.l_idle_ns
            } else {
                self.eta
            };
            self.eta = clamp_factor(0.9 * self.eta.min(ratio));
            format!(
                "vCPU saturated ({:.0} %): eta -> {:.3}",
                busiest * 100.0,
                self.eta
            )
        } else {
            let denom = (d.n_before.saturating_sub(1)) as f64 * b.l_idle_ns;
            let ratio = if denom > 0.0 {
                b.l_comp_ns / denom
            } else {
                self.rho
            };
            self.rho = clamp_factor(0.9 * self.rho.min(ratio));
            format!("rho -> {:.3}", self.rho)
        };
        events.push(self.event(
            EventKind::Rollback { cpu },
            format!(
                "utilization fell {:.0} % ({:.2} -> {:.2}) after deactivating vCPU {}; {adjusted}",
                drop * 100.0,
                b.total_util,
                after,
                cpu
            ),
        ));
    }

    fn major_change(&self, r: &Characteristics, c: &Characteristics) -> Option<String> {
        let now = self.util_now(c);
        let util_change = (now - r.total_util).abs() / r.total_util.max(self.cfg.idle_util);
        if util_change > self.cfg.major_util_change.max(2.0 * self.noise) {
            return Some(format!(
                "utilization changed {:.0} % ({:.2} -> {:.2})",
                util_change * 100.0,
                r.total_util,
                now
            ));
        }
        // A consolidated vCPU newly driven past the limit. One that was already that busy when
        // the consolidation was judged harmless (Figure 4(a) fills its vCPUs) is no news.
        if self.active != self.allowed
            && c.max_vcpu_util > self.cfg.major_vcpu_util
            && r.max_vcpu_util <= self.cfg.major_vcpu_util
        {
            return Some(format!(
                "an active vCPU is {:.0} % busy",
                c.max_vcpu_util * 100.0
            ));
        }
        if r.g_comp_ns > 0.0 && c.g_comp_ns > 0.0 {
            let f = c.g_comp_ns / r.g_comp_ns;
            if f > self.cfg.major_gcomp_factor || f < 1.0 / self.cfg.major_gcomp_factor {
                return Some(format!(
                    "g_comp changed {:.1}x ({} -> {})",
                    f,
                    us(r.g_comp_ns),
                    us(c.g_comp_ns)
                ));
            }
        }
        None
    }

    fn try_deactivate(
        &mut self,
        sample: &PeriodSample,
        c: &Characteristics,
        events: &mut Vec<PolicyEvent>,
    ) {
        let n = self.active.len();
        if n <= 1 {
            return;
        }
        if c.runnable_wait_fraction > self.cfg.max_runnable_wait {
            return;
        }
        // Steal means the host is oversubscribed: a held or lightly used vCPU costs other VMs,
        // so consolidation is favoured by relaxing the load factor toward 1.
        let rho = (self.rho * (1.0 + c.steal_fraction)).min(1.0);
        let room = rho * (n - 1) as f64 * c.l_idle_ns;
        let cond1 = c.l_comp_ns <= room;
        let grain = (self.eta * c.l_idle_ns).min(self.cfg.min_time_slice_ns as f64);
        let cond2 = c.g_comp_ns <= grain;
        if !(cond1 && cond2) {
            return;
        }
        // A larger step where the evidence is strong: the most vCPUs k whose work the
        // remaining n - k could absorb in half their idle time (condition (1) for k vCPUs with
        // a margin, as a failed large step costs the workload for the periods it is judged:
        // k x l_comp <= rho x (n - k) x l_idle / 2), at most `max_step` and half the active set.
        let step = (2..=self.max_step.min(n / 2))
            .take_while(|&k| k as f64 * c.l_comp_ns <= 0.5 * rho * (n - k) as f64 * c.l_idle_ns)
            .last()
            .unwrap_or(1);
        let mut victims = Vec::new();
        for _ in 0..step {
            let Some(victim) = least_busy(&sample.vcpus, &self.active) else {
                break;
            };
            self.active.remove(victim);
            victims.push(victim);
        }
        let Some(&victim) = victims.first() else {
            return;
        };
        let mut before = *c;
        before.total_util = self.util_before(c);
        let d = Deactivation {
            cpus: victims.clone(),
            before,
            n_before: n,
        };
        self.deactivated.push(d.clone());
        self.judging = Some(d);
        self.verdict = Verdict::default();
        self.settle = self.cfg.settle_periods;
        for &cpu in &victims[1..] {
            events.push(self.event(
                EventKind::Deactivate { cpu },
                format!(
                    "with vCPU {victim}: {} vCPUs' work fits in the idle time of the other {}",
                    victims.len(),
                    n - victims.len()
                ),
            ));
        }
        events.push(self.event(
            EventKind::Deactivate { cpu: victim },
            format!(
                "l_comp {} <= rho {:.2} x {} x l_idle {}; g_comp {} <= min(eta {:.2} x l_idle, slice {})",
                us(c.l_comp_ns),
                rho,
                n - 1,
                us(c.l_idle_ns),
                us(c.g_comp_ns),
                self.eta,
                us(self.cfg.min_time_slice_ns as f64)
            ),
        ));
    }

    fn retention_step(
        &mut self,
        sample: &PeriodSample,
        c: &Characteristics,
        timeout: RetentionTimeout,
        settling: bool,
        events: &mut Vec<PolicyEvent>,
    ) -> Vec<(usize, RetentionAction)> {
        let secs = sample.period_ns.max(1) as f64 / 1e9;
        let idle = self.is_idle();
        let crowded = c.runnable_wait_fraction > self.cfg.max_runnable_wait;
        // Under steal every held microsecond is taken from another VM: demand more benefit.
        let min_rate = self.cfg.min_idle_periods_per_sec * (1.0 + 10.0 * c.steal_fraction);

        // Judge a trial first: it decides whether retention stays at all.
        let mut judged_off = Vec::new();
        if let Some(t) = self.trial.clone() {
            let verdict = if !settling && !idle {
                self.verdict.observe(c)
            } else {
                None
            };
            if let Some(evidence) = verdict {
                let after = evidence.mean;
                if let Some(drop) = self.significant_drop(t.util_before, &evidence) {
                    judged_off = t.cpus.clone();
                    self.retention_backoff =
                        (self.retention_backoff * 2).min(self.cfg.max_backoff_periods);
                    self.retention_blocked_until = self.period + self.retention_backoff as u64;
                    events.push(self.event(
                        EventKind::RetentionOff { cpus: t.cpus.clone() },
                        format!(
                            "utilization fell {:.0} % ({:.2} -> {:.2}) with retention on; retry in {} periods",
                            drop * 100.0,
                            t.util_before,
                            after,
                            self.retention_backoff
                        ),
                    ));
                } else {
                    self.retention_backoff = 1;
                }
                self.trial = None;
            }
        }

        let mut turned_on = Vec::new();
        let mut turned_off = Vec::new();
        let mut why_off = String::new();
        let active = self.active.clone();
        let changing_active = settling || self.settle > 0 || self.judging.is_some();
        for (cpu, st) in self.vcpus.iter_mut() {
            let cpu = *cpu;
            if judged_off.contains(&cpu) {
                st.retaining = false;
                continue;
            }
            let v = sample.vcpus.iter().find(|v| v.cpu == cpu);
            let stop = if !active.contains(cpu) {
                Some("vCPU deactivated")
            } else if idle {
                Some("workload idle")
            } else if crowded {
                Some("workload threads queue on one vCPU while another has none; a held vCPU would not pull them over")
            } else if let Some(v) = v.filter(|_| st.retaining) {
                retention_not_paying(v, secs, min_rate / 2.0, self.cfg.min_retention_hit_ratio)
            } else {
                None
            };
            if st.retaining {
                if let Some(reason) = stop {
                    st.retaining = false;
                    turned_off.push(cpu);
                    why_off = reason.to_string();
                }
                continue;
            }
            let eligible = stop.is_none()
                && !changing_active
                && self.trial.is_none()
                && self.period >= self.retention_blocked_until
                && v.is_some_and(|v| {
                    worth_retaining(
                        v,
                        secs,
                        min_rate,
                        self.cfg.min_retain_idle_ns as f64,
                        self.cfg.retain_idle_factor * timeout.ns as f64,
                    )
                });
            if eligible {
                st.retaining = true;
                turned_on.push(cpu);
            }
        }
        if !turned_off.is_empty() {
            events.push(self.event(EventKind::RetentionOff { cpus: turned_off }, why_off));
        }
        if !turned_on.is_empty() {
            self.trial = Some(RetentionTrial {
                cpus: turned_on.clone(),
                util_before: self.util_before(c),
            });
            self.verdict = Verdict::default();
            self.settle = self.settle.max(self.cfg.settle_periods);
            events.push(self.event(
                EventKind::RetentionOn { cpus: turned_on },
                format!(
                    "{:.0} idle periods/s per vCPU of {} on average (hold {})",
                    c.idle_periods_per_sec,
                    us(c.l_idle_ns),
                    us(timeout.ns as f64)
                ),
            ));
        }
        self.vcpus
            .iter()
            .map(|(cpu, st)| {
                (
                    *cpu,
                    if st.retaining {
                        RetentionAction::Retain {
                            timeout_ns: timeout.ns,
                        }
                    } else {
                        RetentionAction::Off
                    },
                )
            })
            .collect()
    }
}

/// Retention pays on a vCPU with many idle periods that are mostly shorter than the hold and
/// longer than the window in which a halted vCPU wakes cheaply anyway.
fn worth_retaining(
    v: &VcpuSample,
    secs: f64,
    min_rate: f64,
    min_mean_idle_ns: f64,
    max_mean_idle_ns: f64,
) -> bool {
    let periods = v.idle_periods();
    if periods == 0 {
        return false;
    }
    let rate = periods as f64 / secs;
    let mean_idle = v.idle_time_ns() as f64 / periods as f64;
    rate >= min_rate && mean_idle >= min_mean_idle_ns && mean_idle <= max_mean_idle_ns
}

/// Why retention that is on stopped paying, if it did: too few idle periods to matter, or most
/// holds timed out (the idle periods it saw outlived the hold).
fn retention_not_paying(
    v: &VcpuSample,
    secs: f64,
    min_rate: f64,
    min_hit: f64,
) -> Option<&'static str> {
    let periods = v.idle_periods();
    if (periods as f64 / secs) < min_rate {
        return Some("too few idle periods to pay for a held vCPU");
    }
    // A handful of periods is not evidence either way.
    if periods >= 20 && (v.yield_preemptions as f64) < min_hit * periods as f64 {
        return Some("most holds timed out: idle periods outlast the hold");
    }
    None
}

fn least_busy(vcpus: &[VcpuSample], active: &Cpuset) -> Option<usize> {
    active
        .iter()
        .map(|cpu| {
            (
                vcpus.iter().find(|v| v.cpu == cpu).map_or(0, |v| v.work_ns),
                cpu,
            )
        })
        // Least work first; among equals the highest id, so CPU 0 (interrupts, the shell) stays.
        .min_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .map(|(_, cpu)| cpu)
}

fn relative_drop(before: f64, after: f64) -> f64 {
    if before <= 0.0 {
        return 0.0;
    }
    (before - after) / before
}

/// Rollback lowers a factor but never to zero, which would forbid consolidation for good.
fn clamp_factor(x: f64) -> f64 {
    if x.is_finite() {
        x.clamp(0.01, 1.0)
    } else {
        0.01
    }
}

fn us(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.1}ms", ns / 1e6)
    } else {
        format!("{:.1}us", ns / 1e3)
    }
}
