//! Names the most likely reason a program stops scaling, with the numbers behind it.
//!
//! Four limiters are told apart (pure functions of the summarised measurements
//! and the model fits):
//! - blocking synchronization: vCPUs go idle and wake more often as cores are
//!   added — the BWW signature of the Gleaner paper (§3.2, Figure 1), which
//!   `gleaner run` mitigates;
//! - overhead events (instruction and TLB misses) growing faster than payload
//!   events (data misses) per unit of work — the many-core PThreads study's
//!   serialization of page-table and code accesses;
//! - coherence/contention: the USL's `kappa` makes the curve peak and fall;
//! - a serial fraction: Amdahl's `s` caps the speedup.
//!
//! Direct measurements of a mechanism (the first two) rank above curve-shape
//! models, because the models only describe *that* scaling stops, while the
//! counters say *why*. Every finding carries the evidence that triggered it.

use serde::Serialize;

use crate::fit::{AmdahlFit, UslFit};

/// Efficiency at the largest CPU count above which the program is said to scale well.
pub const GOOD_EFFICIENCY: f64 = 0.85;
/// Idle entries per vCPU per second that count as frequent. An idle 2-vCPU
/// Firecracker guest shows 25-50/s from timers alone; the paper's affected
/// benchmarks go idle thousands of times a second.
pub const FREQUENT_IDLE_PER_VCPU_S: f64 = 200.0;
/// Growth of idle entries per unit of work (largest vs smallest CPU count) that
/// counts as "rising with cores".
pub const IDLE_GROWTH: f64 = 2.0;
/// Overhead events must grow this many times faster than payload events.
pub const OVERHEAD_VS_PAYLOAD_GROWTH: f64 = 1.3;
/// Amdahl serial fraction worth reporting as a limiter.
pub const NOTABLE_SERIAL_FRACTION: f64 = 0.02;
/// Share of vCPU time taken by the host that makes the measurement suspect.
pub const NOTABLE_STEAL_FRACTION: f64 = 0.05;

/// The summary of one CPU count that classification looks at.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScalingPoint {
    pub cpus: usize,
    pub speedup: f64,
    /// Idle entries per second summed over the run's vCPUs.
    pub idle_entries_per_s: Option<f64>,
    /// Idle entries during one run (one unit of work).
    pub idle_entries_per_run: Option<f64>,
    /// Payload hardware events (data misses) per run.
    pub payload_events: Option<f64>,
    /// Overhead hardware events (instruction and TLB misses) per run.
    pub overhead_events: Option<f64>,
    /// Steal time as a share of the run's vCPU time.
    pub steal_fraction: Option<f64>,
    /// CPU time of the program as a share of the run's vCPU time.
    pub utilization: f64,
}

impl ScalingPoint {
    pub fn efficiency(&self) -> f64 {
        self.speedup / self.cpus as f64
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limiter {
    ScalesWell,
    BlockingSynchronization,
    OverheadEvents,
    Coherence,
    SerialFraction,
    /// Efficiency is poor but no measured signal or model explains it.
    Inconclusive,
    /// Fewer than two CPU counts were measured.
    NotEnoughData,
}

impl Limiter {
    pub fn describe(self) -> &'static str {
        match self {
            Self::ScalesWell => "scales well over the measured range",
            Self::BlockingSynchronization => {
                "blocking synchronization (vCPU idle/wake transitions rise with cores)"
            }
            Self::OverheadEvents => {
                "overhead events (instruction/TLB misses) grow faster than payload"
            }
            Self::Coherence => "coherence/contention (USL kappa: speedup peaks and falls)",
            Self::SerialFraction => "serial fraction (Amdahl)",
            Self::Inconclusive => {
                "inconclusive: efficiency is low but no measured signal explains it"
            }
            Self::NotEnoughData => "not enough data: measure at least two CPU counts",
        }
    }
}

/// One limiter that the measurements support, with the evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub limiter: Limiter,
    pub evidence: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnosis {
    /// The most likely limiter, with its evidence.
    pub primary: Finding,
    /// Other limiters the data also supports, in order of likelihood.
    pub also: Vec<Finding>,
    /// What to try next, if anything.
    pub suggestion: Option<String>,
    /// Reasons to distrust the measurement.
    pub caveats: Vec<String>,
}

/// Classifies the limiter from points sorted by CPU count (the first one is the baseline).
pub fn classify(
    points: &[ScalingPoint],
    amdahl: Option<&AmdahlFit>,
    usl: Option<&UslFit>,
) -> Diagnosis {
    let caveats = caveats(points, usl);
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return not_enough_data(caveats);
    };
    if points.len() < 2 || first.cpus == last.cpus {
        return not_enough_data(caveats);
    }

    let findings: Vec<Finding> = [
        blocking_synchronization(first, last),
        overhead_events(first, last),
        coherence(points, usl),
        serial_fraction(amdahl),
    ]
    .into_iter()
    .flatten()
    .collect();

    let efficiency = last.efficiency();
    let efficiency_line = format!(
        "parallel efficiency {:.0}% at {} CPUs (speedup {:.2})",
        efficiency * 100.0,
        last.cpus,
        last.speedup
    );
    let mut findings = findings.into_iter();
    let (primary, also) = if efficiency >= GOOD_EFFICIENCY {
        let primary = Finding {
            limiter: Limiter::ScalesWell,
            evidence: vec![efficiency_line],
        };
        (primary, findings.collect())
    } else {
        match findings.next() {
            Some(mut primary) => {
                primary.evidence.insert(0, efficiency_line);
                (primary, findings.collect())
            }
            None => (
                Finding {
                    limiter: Limiter::Inconclusive,
                    evidence: vec![efficiency_line],
                },
                Vec::new(),
            ),
        }
    };
    let suggestion = suggestion(primary.limiter);
    Diagnosis {
        primary,
        also,
        suggestion,
        caveats,
    }
}

fn not_enough_data(caveats: Vec<String>) -> Diagnosis {
    Diagnosis {
        primary: Finding {
            limiter: Limiter::NotEnoughData,
            evidence: Vec::new(),
        },
        also: Vec::new(),
        suggestion: None,
        caveats,
    }
}

fn blocking_synchronization(first: &ScalingPoint, last: &ScalingPoint) -> Option<Finding> {
    let rate = last.idle_entries_per_s?;
    let per_vcpu = rate / last.cpus as f64;
    let (before, after) = (first.idle_entries_per_run?, last.idle_entries_per_run?);
    // A baseline of zero idle entries still counts as "rising" if the top count is frequent.
    let growth = if before > 0.0 {
        after / before
    } else {
        f64::INFINITY
    };
    if per_vcpu < FREQUENT_IDLE_PER_VCPU_S || growth < IDLE_GROWTH {
        return None;
    }
    let mut evidence = vec![
        format!(
            "vCPU idle entries per run rose {} from {} to {} CPUs ({:.0} -> {:.0})",
            format_growth(growth),
            first.cpus,
            last.cpus,
            before,
            after
        ),
        format!(
            "{:.0} idle entries/s at {} CPUs ({:.0} per vCPU per second; frequent is >= {:.0})",
            rate, last.cpus, per_vcpu, FREQUENT_IDLE_PER_VCPU_S
        ),
    ];
    if last.utilization < first.utilization {
        evidence.push(format!(
            "CPU utilization fell from {:.0}% to {:.0}%: threads block instead of computing",
            first.utilization * 100.0,
            last.utilization * 100.0
        ));
    }
    Some(Finding {
        limiter: Limiter::BlockingSynchronization,
        evidence,
    })
}

fn overhead_events(first: &ScalingPoint, last: &ScalingPoint) -> Option<Finding> {
    let (payload_before, payload_after) = (first.payload_events?, last.payload_events?);
    let (overhead_before, overhead_after) = (first.overhead_events?, last.overhead_events?);
    if payload_before <= 0.0 || overhead_before <= 0.0 {
        return None;
    }
    let payload_growth = payload_after / payload_before;
    let overhead_growth = overhead_after / overhead_before;
    if overhead_growth <= 1.0 || overhead_growth < OVERHEAD_VS_PAYLOAD_GROWTH * payload_growth {
        return None;
    }
    Some(Finding {
        limiter: Limiter::OverheadEvents,
        evidence: vec![format!(
            "per unit of work, overhead events (L1i + TLB misses) grew {} from {} to {} CPUs \
             while payload events (L1d misses) grew {}",
            format_growth(overhead_growth),
            first.cpus,
            last.cpus,
            format_growth(payload_growth)
        )],
    })
}

fn coherence(points: &[ScalingPoint], usl: Option<&UslFit>) -> Option<Finding> {
    let usl = usl.filter(|fit| !fit.kappa_held_at_zero && fit.kappa > 0.0)?;
    let largest = points.iter().map(|p| p.cpus).max()? as f64;
    let best = points
        .iter()
        .max_by(|a, b| a.speedup.total_cmp(&b.speedup))?;
    let last = points.last()?;
    let retrograde = last.cpus != best.cpus && last.speedup < 0.95 * best.speedup;
    let peak = usl.peak_cpus()?;
    if !retrograde && peak > 2.0 * largest {
        return None;
    }
    let mut evidence = vec![format!(
        "USL fit sigma={:.4} kappa={:.5} (rms error {:.3}) puts the peak at {:.1} CPUs (speedup {:.2})",
        usl.sigma,
        usl.kappa,
        usl.rms_error,
        peak,
        usl.speedup(peak)
    )];
    if retrograde {
        evidence.push(format!(
            "measured speedup fell from {:.2} at {} CPUs to {:.2} at {} CPUs",
            best.speedup, best.cpus, last.speedup, last.cpus
        ));
    }
    Some(Finding {
        limiter: Limiter::Coherence,
        evidence,
    })
}

fn serial_fraction(amdahl: Option<&AmdahlFit>) -> Option<Finding> {
    let fit = amdahl.filter(|fit| fit.serial_fraction >= NOTABLE_SERIAL_FRACTION)?;
    let limit = fit
        .speedup_limit()
        .map_or("unbounded".to_string(), |limit| format!("{limit:.1}x"));
    Some(Finding {
        limiter: Limiter::SerialFraction,
        evidence: vec![format!(
            "Amdahl serial fraction s={:.3} (rms error {:.3}): speedup can never exceed {}",
            fit.serial_fraction, fit.rms_error, limit
        )],
    })
}

fn suggestion(limiter: Limiter) -> Option<String> {
    match limiter {
        Limiter::BlockingSynchronization => Some(
            "try `gleaner run -- CMD`: it consolidates threads and keeps vCPUs from idling, \
             which cuts the cost of each wakeup in a VM"
                .to_string(),
        ),
        Limiter::OverheadEvents => Some(
            "reduce instruction/TLB pressure: huge pages for data and text, fewer threads sharing \
             hot page tables, or process-per-node placement"
                .to_string(),
        ),
        Limiter::Coherence => Some(
            "find data written by many threads (shared counters, false sharing, global locks) \
             and make it per-thread; running past the peak only slows it down"
                .to_string(),
        ),
        Limiter::SerialFraction => {
            Some("profile the single-CPU run for phases that run on one thread (I/O, setup, reductions)".to_string())
        }
        Limiter::Inconclusive => Some(
            "measure more CPU counts (--cpus) and more repeats (--repeat) to separate noise from trend".to_string(),
        ),
        Limiter::ScalesWell | Limiter::NotEnoughData => None,
    }
}

fn caveats(points: &[ScalingPoint], usl: Option<&UslFit>) -> Vec<String> {
    let mut caveats = Vec::new();
    if let Some((point, steal)) = points
        .iter()
        .filter_map(|p| p.steal_fraction.map(|steal| (p, steal)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
    {
        if steal >= NOTABLE_STEAL_FRACTION {
            caveats.push(format!(
                "the host stole {:.0}% of vCPU time at {} CPUs: host contention distorts these numbers",
                steal * 100.0,
                point.cpus
            ));
        }
    }
    if usl.is_some_and(|fit| fit.kappa_held_at_zero) {
        caveats.push(
            "only one CPU count above 1: USL kappa held at 0 and no peak can be predicted"
                .to_string(),
        );
    }
    caveats
}

fn format_growth(factor: f64) -> String {
    if factor.is_finite() && factor >= 100.0 {
        format!("{factor:.0}x")
    } else if factor.is_finite() {
        format!("{factor:.2}x")
    } else {
        "from zero".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fit::{fit_amdahl, fit_usl, SpeedupPoint};

    /// A CPU-bound point: no idling, no hardware counters, no steal.
    fn point(cpus: usize, speedup: f64) -> ScalingPoint {
        ScalingPoint {
            cpus,
            speedup,
            idle_entries_per_s: Some(30.0 * cpus as f64),
            idle_entries_per_run: Some(30.0),
            payload_events: None,
            overhead_events: None,
            steal_fraction: Some(0.0),
            utilization: 0.99,
        }
    }

    fn diagnose(points: &[ScalingPoint]) -> Diagnosis {
        let speedups: Vec<SpeedupPoint> = points
            .iter()
            .map(|p| SpeedupPoint {
                cpus: p.cpus as f64,
                speedup: p.speedup,
            })
            .collect();
        classify(
            points,
            fit_amdahl(&speedups).as_ref(),
            fit_usl(&speedups).as_ref(),
        )
    }

    #[test]
    fn linear_scaling_scales_well() {
        let points: Vec<_> = [1, 2, 4, 8]
            .iter()
            .map(|&n| point(n, n as f64 * 0.97))
            .collect();
        let diagnosis = diagnose(&points);
        assert_eq!(diagnosis.primary.limiter, Limiter::ScalesWell);
        assert_eq!(diagnosis.suggestion, None);
    }

    #[test]
    fn amdahl_curve_is_a_serial_fraction() {
        let points: Vec<_> = [1, 2, 4, 8, 16]
            .iter()
            .map(|&n| point(n, crate::fit::amdahl_speedup(0.2, n as f64)))
            .collect();
        let diagnosis = diagnose(&points);
        assert_eq!(diagnosis.primary.limiter, Limiter::SerialFraction);
        assert!(
            diagnosis
                .primary
                .evidence
                .iter()
                .any(|line| line.contains("s=0.200")),
            "{diagnosis:?}"
        );
    }

    #[test]
    fn retrograde_curve_is_coherence() {
        let points: Vec<_> = [1, 2, 4, 8, 16, 32]
            .iter()
            .map(|&n| point(n, crate::fit::usl_speedup(0.02, 0.01, n as f64)))
            .collect();
        let diagnosis = diagnose(&points);
        assert_eq!(
            diagnosis.primary.limiter,
            Limiter::Coherence,
            "{diagnosis:?}"
        );
        assert!(diagnosis
            .primary
            .evidence
            .iter()
            .any(|line| line.contains("fell from")));
        // The same curve also has a large fitted serial fraction; it ranks lower.
        assert!(diagnosis
            .also
            .iter()
            .any(|f| f.limiter == Limiter::SerialFraction));
    }

    #[test]
    fn rising_idle_entries_are_blocking_synchronization() {
        let mut points: Vec<_> = [1, 2, 4]
            .iter()
            .map(|&n| point(n, [1.0, 1.5, 1.8][n.trailing_zeros() as usize]))
            .collect();
        // Idle entries per run climb with cores, and utilization drops.
        for (p, (per_run, util)) in
            points
                .iter_mut()
                .zip([(40.0, 0.99), (4_000.0, 0.7), (20_000.0, 0.45)])
        {
            let wall = 1.0 / p.speedup;
            p.idle_entries_per_run = Some(per_run);
            p.idle_entries_per_s = Some(per_run / wall);
            p.utilization = util;
        }
        let diagnosis = diagnose(&points);
        assert_eq!(
            diagnosis.primary.limiter,
            Limiter::BlockingSynchronization,
            "{diagnosis:?}"
        );
        assert!(diagnosis
            .suggestion
            .as_deref()
            .unwrap()
            .contains("gleaner run"));
        assert!(diagnosis
            .primary
            .evidence
            .iter()
            .any(|line| line.contains("utilization fell")));
    }

    #[test]
    fn frequent_but_flat_idle_entries_are_not_blocking() {
        let mut points = vec![point(1, 1.0), point(2, 1.3)];
        for p in &mut points {
            p.idle_entries_per_run = Some(5_000.0);
            p.idle_entries_per_s = Some(5_000.0 * p.speedup);
        }
        assert_ne!(
            diagnose(&points).primary.limiter,
            Limiter::BlockingSynchronization
        );
    }

    #[test]
    fn overhead_outgrowing_payload_is_overhead_events() {
        // Paper's FFT: payload per core fell 1.9x for 4x cores (total ~ +2x), overhead +2.55x per core.
        let mut points = vec![point(16, 1.0), point(32, 1.4), point(64, 1.5)];
        for (p, (payload, overhead)) in
            points
                .iter_mut()
                .zip([(1.0e9, 1.0e7), (1.05e9, 3.0e7), (1.1e9, 1.0e8)])
        {
            p.payload_events = Some(payload);
            p.overhead_events = Some(overhead);
        }
        // Speedups here are relative to 16 CPUs; scale them so efficiency is meaningful.
        for p in &mut points {
            p.speedup *= 16.0;
        }
        let diagnosis = diagnose(&points);
        assert_eq!(
            diagnosis.primary.limiter,
            Limiter::OverheadEvents,
            "{diagnosis:?}"
        );
        assert!(diagnosis
            .primary
            .evidence
            .iter()
            .any(|line| line.contains("10.00x")));
    }

    #[test]
    fn poor_efficiency_with_no_signal_is_inconclusive() {
        // Two points, 1 -> 2 CPUs with speedup 1.02: Amdahl s is large, so
        // pretend the fits are absent to isolate the fallback.
        let points = vec![point(1, 1.0), point(2, 1.02)];
        let diagnosis = classify(&points, None, None);
        assert_eq!(diagnosis.primary.limiter, Limiter::Inconclusive);
    }

    #[test]
    fn one_point_is_not_enough_and_steal_is_a_caveat() {
        let mut only = point(1, 1.0);
        only.steal_fraction = Some(0.2);
        let diagnosis = diagnose(&[only]);
        assert_eq!(diagnosis.primary.limiter, Limiter::NotEnoughData);
        assert!(diagnosis.caveats.iter().any(|c| c.contains("stole 20%")));
    }
}
