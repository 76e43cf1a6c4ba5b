//! The retention half of the policy: which active vCPUs are held when idle, trials of a hold
//! judged like consolidations, and back-off after a hold that slowed the workload.
//!
//! Split from the engine's state machine (`mod.rs`) so that each file does one job; it is
//! an `impl Gleaner` block with the engine's private state.

use super::{us, EventKind, Gleaner, PolicyEvent, RetentionAction, RetentionTrial};
use crate::config::PolicyConfig;
use crate::judge::{Measured, Verdict};
use crate::retention::RetentionTimeout;
use crate::sample::{Characteristics, PeriodSample, VcpuSample, WakeLatencies};

impl Gleaner {
    /// Idle periods of the active vCPUs in this sample.
    pub(super) fn active_idle_periods(&self, sample: &PeriodSample) -> u64 {
        sample
            .vcpus
            .iter()
            .filter(|v| self.active.contains(v.cpu))
            .map(VcpuSample::idle_periods)
            .sum()
    }

    /// The hold this sample asks for ([`RetentionTimeout::for_sample`]).
    pub(super) fn hold_timeout(
        &self,
        sample: &PeriodSample,
        c: &Characteristics,
    ) -> RetentionTimeout {
        let periods = self.active_idle_periods(sample);
        let hits_seen = sample
            .wake_latency
            .as_ref()
            .is_some_and(|w| hold_hit_ratio(w, periods, self.timeout).is_some());
        self.timeout
            .for_sample(c.steal_fraction, c.l_idle_ns, hits_seen)
    }

    pub(super) fn retention_step(
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
        let hit = sample
            .wake_latency
            .as_ref()
            .and_then(|w| hold_hit_ratio(w, self.active_idle_periods(sample), timeout));
        let min_rate = min_idle_rate(&self.cfg, c.steal_fraction, hit.is_some());
        let min_hit = min_hit_ratio(&self.cfg, sample.wake_latency.as_ref(), timeout);

        // Judge a trial first: it decides whether retention stays at all.
        let mut judged_off = Vec::new();
        if let Some(t) = self.trial.clone() {
            let verdict = if !settling && !idle {
                self.verdict.observe(
                    Measured::new(c.total_util, sample.period_ns),
                    c.max_vcpu_util,
                )
            } else {
                None
            };
            if let Some(evidence) = verdict {
                let after = evidence.mean;
                if let Some(drop) = self.significant_drop(t.util_before, &t.baseline, &evidence) {
                    judged_off = t.cpus.clone();
                    self.retention_backoff =
                        (self.retention_backoff * 4).min(self.cfg.max_backoff_periods);
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
                // Whatever the verdict, the workload's pace moved because of us: the settled
                // state against which major changes are detected is measured afresh.
                self.reference = None;
                self.grain.reset();
            }
        }

        let mut turned_on = Vec::new();
        let mut turned_off = Vec::new();
        let mut why_off = String::new();
        // A hold saves at most what the wake-ups that find their vCPU halted, and that their
        // waker waited for, cost more than ones on a running vCPU (`gain::hold_gain_bound`).
        // Where it is small, holding only burns CPU or, worse, speeds up wake-ups nobody
        // waits for: `sysbench threads` on the haltpoll guest lost 4-11 % to every hold.
        // Without wake-up measurements (procfs) the gate is open.
        let halted_wakes_too_cheap = crate::gain::hold_gain_bound(sample, timeout.ns)
            .is_some_and(|g| g < crate::gain::MIN_CONSOLIDATION_GAIN);
        let active = self.active.clone();
        // A hold is not started either while a consolidation only waits for the start-up
        // gate: held first, a workload would show the consolidation none of the halted
        // wake-ups it is tried for (`gain::consolidation_gain_bound`), and stay held. On the
        // haltpoll guest a ping-pong held at its first decision ran at x0.76 of one vCPU for
        // the rest of its run (1 of 16 runs, 2026-11-28 16:38 UTC; 178,476 against 234,312
        // round trips/s in its round).
        let changing_active =
            settling || self.settle > 0 || self.judging.is_some() || self.consolidation_waits;
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
                retention_not_paying(v, secs, min_rate / 2.0, min_hit)
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
                && !halted_wakes_too_cheap
                && hit.is_none_or(|h| h >= min_hit)
                && v.is_some_and(|v| {
                    worth_retaining(
                        v,
                        secs,
                        min_rate,
                        self.cfg.min_retain_idle_ns as f64,
                        // Where the lengths were seen, the share the hold catches decides,
                        // not their mean.
                        if hit.is_some() {
                            f64::INFINITY
                        } else {
                            self.cfg.retain_idle_factor * timeout.ns as f64
                        },
                    )
                });
            if eligible {
                st.retaining = true;
                turned_on.push(cpu);
            }
        }
        if !turned_off.is_empty() || !turned_on.is_empty() {
            self.reference = None;
            self.grain.reset();
        }
        if !turned_off.is_empty() {
            events.push(self.event(EventKind::RetentionOff { cpus: turned_off }, why_off));
        }
        if !turned_on.is_empty() {
            self.trial = Some(RetentionTrial {
                cpus: turned_on.clone(),
                util_before: self.util_before(c),
                baseline: self.quiet_values.iter().copied().collect(),
            });
            self.verdict = Verdict::default();
            self.settle = self.settle.max(self.cfg.settle_periods);
            events.push(self.event(
                EventKind::RetentionOn { cpus: turned_on },
                format!(
                    "{:.0} idle periods/s per vCPU of {} on average (hold {}){}",
                    c.idle_periods_per_sec,
                    us(c.l_idle_ns),
                    us(timeout.ns as f64),
                    hit.map_or(String::new(), |h| format!(
                        "; {:.0} % of them end within it, {:.0} % pay for it",
                        h * 100.0,
                        min_hit * 100.0
                    ))
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

/// The share of `idle_periods` that a hold of `timeout` would have ended with a wake-up (a
/// hit): the wake-ups that came into an idle vCPU younger than the hold
/// (`WakeLatencies::idle_age`, their vCPU's idle time at the waking), over all idle periods,
/// since one that no wake-up of the workload ended (another process, a long sleep) is a hold
/// that times out. `None` where too few idle periods were seen
/// ([`crate::retention::MIN_IDLE_PERIODS_SEEN`]) or the wake-ups came without their idle
/// ages (a sample of an older Gleaner).
pub(crate) fn hold_hit_ratio(
    w: &WakeLatencies,
    idle_periods: u64,
    timeout: RetentionTimeout,
) -> Option<f64> {
    let ages_missing = w.idle_age.count == 0 && w.halted.count + w.polling.count > 0;
    (idle_periods >= crate::retention::MIN_IDLE_PERIODS_SEEN && !ages_missing)
        .then(|| (w.idle_age.count_at_most(timeout.ns) / idle_periods as f64).min(1.0))
}

/// The hit ratio a hold must reach to be tried or kept: where the wake-ups were measured,
/// the share at which what its hits save pays for what its misses burn
/// ([`crate::gain::hold_break_even_hit_ratio`]), at least [`MIN_HIT_RATIO`] and at most the
/// configured `min_retention_hit_ratio`; the configured share where they were not.
pub(crate) fn min_hit_ratio(
    cfg: &PolicyConfig,
    w: Option<&WakeLatencies>,
    timeout: RetentionTimeout,
) -> f64 {
    w.and_then(|w| crate::gain::hold_break_even_hit_ratio(w, timeout.ns))
        .map_or(cfg.min_retention_hit_ratio, |b| {
            b.max(MIN_HIT_RATIO).min(cfg.min_retention_hit_ratio)
        })
}

/// Below this share of idle periods caught, a hold is a trickle whatever each hit saves: one
/// period's few hundred idle periods cannot tell it from noise.
const MIN_HIT_RATIO: f64 = 0.1;

/// Idle periods per second and vCPU below which a hold is not worth a trial.
///
/// Without the wake-ups' idle ages the rate stands in for what a hold would catch, and steal
/// raises it (every held microsecond is taken from another VM, and nothing says how many
/// holds would time out). With them (`hits_seen`), the hit ratio says what a hold catches and
/// what it wastes, and `gain::hold_gain_bound` whether the halted wake-ups it speeds up
/// matter to the workload; the rate is then only a floor against acting on a trickle, a
/// quarter of the configured one, whatever the steal. A consolidated vCPU has fewer idle
/// periods than any vCPU of the full set: in the simulator's fig7 the dedup VM's 4-8 vCPUs
/// had 1,000-2,500 a second each, every one of them held by the best static settings, and
/// the full floor refused them all.
pub(crate) fn min_idle_rate(cfg: &PolicyConfig, steal_fraction: f64, hits_seen: bool) -> f64 {
    if hits_seen {
        cfg.min_idle_periods_per_sec * SEEN_RATE_SHARE
    } else {
        cfg.min_idle_periods_per_sec * (1.0 + 10.0 * steal_fraction)
    }
}

/// The share of `min_idle_periods_per_sec` that is the floor where the hit ratio is known
/// ([`min_idle_rate`]).
const SEEN_RATE_SHARE: f64 = 0.25;

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

/// Why retention that is on stopped paying, if it did: too few idle periods to matter, or too
/// few holds ended with a wake-up (`min_hit`, [`min_hit_ratio`]) to pay for those that timed
/// out.
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
    // A handful of periods is not evidence either way. Only the yielding threads count their
    // hits (a hold a wake-up ended); a vCPU held by in-kernel polling reports none, and its
    // holds do not time out (the trial's verdict judges it instead).
    let counts_hits = v.yield_ns > 0 || v.yield_preemptions > 0;
    if counts_hits && periods >= 20 && (v.yield_preemptions as f64) < min_hit * periods as f64 {
        return Some("too few holds ended with a wake-up to pay for those that timed out");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::LatencyHistogram;

    /// A vCPU held by yielding threads that a wake-up rarely ended is not paying; one held by
    /// in-kernel polling (no yield counters) is left to the trial's verdict, not stopped
    /// every period for "timed out" holds it cannot have (that flapped retention on and off
    /// on the haltpoll guest).
    #[test]
    fn only_yielding_holds_are_judged_by_their_hits() {
        let yielding = VcpuSample {
            idle_entries: 900,
            yield_preemptions: 100,
            yield_ns: 5_000_000,
            ..VcpuSample::default()
        };
        assert_eq!(
            retention_not_paying(&yielding, 0.1, 100.0, 0.5),
            Some("too few holds ended with a wake-up to pay for those that timed out")
        );
        let polling = VcpuSample {
            idle_entries: 1000,
            ..VcpuSample::default()
        };
        assert_eq!(retention_not_paying(&polling, 0.1, 100.0, 0.5), None);
        // Too few idle periods stops either kind.
        let quiet = VcpuSample {
            idle_entries: 2,
            ..VcpuSample::default()
        };
        assert!(retention_not_paying(&quiet, 0.1, 100.0, 0.5).is_some());
    }

    #[test]
    fn the_hit_ratio_counts_wake_ups_younger_than_the_hold_over_all_idle_periods() {
        let hold = RetentionTimeout { ns: 20_000 };
        let mut w = WakeLatencies::default();
        // 60 idle periods ended by a wake-up 5 us in, 20 by one 80 us in; 20 more ended by
        // nothing of the workload's.
        for _ in 0..60 {
            w.halted.record(90_000);
            w.idle_age.record(5_000);
        }
        for _ in 0..20 {
            w.halted.record(90_000);
            w.idle_age.record(80_000);
        }
        assert_eq!(hold_hit_ratio(&w, 100, hold), Some(0.6));
        // More wake-ups than idle periods (a window scaled to its period): at most all.
        assert_eq!(hold_hit_ratio(&w, 50, hold), Some(1.0));
        // Too few idle periods to say.
        assert_eq!(hold_hit_ratio(&w, 49, hold), None);
        // Wake-ups into idle vCPUs without their ages (an older Gleaner's sample): unknown,
        // not "no hits".
        let old = WakeLatencies {
            idle_age: LatencyHistogram::default(),
            ..w.clone()
        };
        assert_eq!(hold_hit_ratio(&old, 100, hold), None);
        // No wake-up found an idle vCPU at all: none would have been caught.
        assert_eq!(
            hold_hit_ratio(&WakeLatencies::default(), 100, hold),
            Some(0.0)
        );
    }

    #[test]
    fn the_idle_rate_floor_is_a_quarter_and_ignores_steal_where_hits_are_seen() {
        let cfg = PolicyConfig::default();
        assert_eq!(min_idle_rate(&cfg, 0.3, true), 500.0);
        assert_eq!(min_idle_rate(&cfg, 0.0, false), 2_000.0);
        assert_eq!(min_idle_rate(&cfg, 0.1, false), 4_000.0);
    }
}
