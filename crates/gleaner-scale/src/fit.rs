//! Scalability models fitted to measured speedups.
//!
//! Two classic models summarise a speedup curve in one or two numbers:
//! Amdahl's law (a serial fraction `s` that never parallelises) and Gunther's
//! Universal Scalability Law (contention `sigma` plus coherence `kappa`, the
//! pairwise cross-talk that makes speedup *fall* past a peak). Both are fitted
//! by least squares on the speedups themselves: a linearised closed form gives
//! the starting point and a few projected Gauss-Newton steps refine it, so the
//! answer minimises the error the user actually sees in the table. Everything
//! here is a pure function of `(cpus, speedup)` points.

use serde::Serialize;

/// One measured point of a speedup curve: `speedup` at `cpus` CPUs, relative to 1 CPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SpeedupPoint {
    pub cpus: f64,
    pub speedup: f64,
}

/// Amdahl's law fitted to the measurements: `S(n) = 1 / (s + (1 - s) / n)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AmdahlFit {
    /// Fraction of the single-CPU run time that does not parallelise, in `[0, 1]`.
    pub serial_fraction: f64,
    /// Root-mean-square difference between fitted and measured speedups.
    pub rms_error: f64,
}

impl AmdahlFit {
    /// Speedup the model predicts at `cpus` CPUs.
    pub fn speedup(&self, cpus: f64) -> f64 {
        amdahl_speedup(self.serial_fraction, cpus)
    }

    /// Upper bound on speedup with unlimited CPUs (`1 / s`); `None` when `s` is 0.
    pub fn speedup_limit(&self) -> Option<f64> {
        (self.serial_fraction > 0.0).then(|| 1.0 / self.serial_fraction)
    }
}

/// Universal Scalability Law fitted to the measurements:
/// `S(n) = n / (1 + sigma (n - 1) + kappa n (n - 1))`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct UslFit {
    /// Contention (queueing on a shared resource), `>= 0`.
    pub sigma: f64,
    /// Coherence (pairwise data exchange between CPUs), `>= 0`.
    pub kappa: f64,
    /// Root-mean-square difference between fitted and measured speedups.
    pub rms_error: f64,
    /// True when only one CPU count above 1 was measured, so `kappa` could not be
    /// identified and was held at 0.
    pub kappa_held_at_zero: bool,
}

impl UslFit {
    /// Speedup the model predicts at `cpus` CPUs.
    pub fn speedup(&self, cpus: f64) -> f64 {
        usl_speedup(self.sigma, self.kappa, cpus)
    }

    /// CPU count at which the model's speedup peaks, `sqrt((1 - sigma) / kappa)`
    /// (at least 1). With `sigma >= 1` every added CPU slows the program, so the
    /// peak is 1 CPU. `None` when the curve rises forever (`kappa` 0, `sigma` < 1).
    pub fn peak_cpus(&self) -> Option<f64> {
        if self.sigma >= 1.0 {
            Some(1.0)
        } else if self.kappa > 0.0 {
            Some(((1.0 - self.sigma) / self.kappa).sqrt().max(1.0))
        } else {
            None
        }
    }
}

/// Amdahl speedup for serial fraction `s` at `n` CPUs.
pub fn amdahl_speedup(s: f64, n: f64) -> f64 {
    1.0 / (s + (1.0 - s) / n)
}

/// USL speedup for `sigma`, `kappa` at `n` CPUs.
pub fn usl_speedup(sigma: f64, kappa: f64, n: f64) -> f64 {
    n / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0))
}

/// Points that carry information for a fit: finite, positive, more than one CPU.
fn informative(points: &[SpeedupPoint]) -> Vec<SpeedupPoint> {
    points
        .iter()
        .copied()
        .filter(|p| p.cpus > 1.0 && p.speedup.is_finite() && p.speedup > 0.0)
        .collect()
}

fn sum_squared_error(points: &[SpeedupPoint], model: impl Fn(f64) -> f64) -> f64 {
    points
        .iter()
        .map(|p| (p.speedup - model(p.cpus)).powi(2))
        .sum()
}

/// RMS error in speedup units over all given points (the 1-CPU baseline
/// included). Chosen over R² because a flat curve (the common "does not scale"
/// case) has almost no variance, which makes R² meaningless.
fn rms_error(points: &[SpeedupPoint], model: impl Fn(f64) -> f64) -> f64 {
    (sum_squared_error(points, model) / points.len() as f64).sqrt()
}

const GAUSS_NEWTON_ITERATIONS: usize = 100;

/// Fits Amdahl's law. Needs at least one point above 1 CPU; returns `None` otherwise.
pub fn fit_amdahl(points: &[SpeedupPoint]) -> Option<AmdahlFit> {
    let data = informative(points);
    if data.is_empty() {
        return None;
    }
    // Linearised start: 1/S - 1/n = s (1 - 1/n), a line through the origin.
    let (mut xy, mut xx) = (0.0, 0.0);
    for p in &data {
        let x = 1.0 - 1.0 / p.cpus;
        xy += x * (1.0 / p.speedup - 1.0 / p.cpus);
        xx += x * x;
    }
    let mut s = (xy / xx).clamp(0.0, 1.0);
    let mut sse = sum_squared_error(&data, |n| amdahl_speedup(s, n));
    // Projected Gauss-Newton on the speedup residuals; step halving keeps it monotone.
    for _ in 0..GAUSS_NEWTON_ITERATIONS {
        let (mut jr, mut jj) = (0.0, 0.0);
        for p in &data {
            let denominator = s + (1.0 - s) / p.cpus;
            let derivative = -(1.0 - 1.0 / p.cpus) / (denominator * denominator);
            jr += derivative * (p.speedup - amdahl_speedup(s, p.cpus));
            jj += derivative * derivative;
        }
        if jj == 0.0 {
            break;
        }
        let mut step = jr / jj;
        let mut improved = false;
        for _ in 0..30 {
            let candidate = (s + step).clamp(0.0, 1.0);
            let candidate_sse = sum_squared_error(&data, |n| amdahl_speedup(candidate, n));
            if candidate_sse < sse {
                improved = (sse - candidate_sse) > 1e-15 * sse.max(1e-300);
                s = candidate;
                sse = candidate_sse;
                break;
            }
            step /= 2.0;
        }
        if !improved {
            break;
        }
    }
    Some(AmdahlFit {
        serial_fraction: s,
        rms_error: rms_error(points, |n| amdahl_speedup(s, n)),
    })
}

/// Fits the USL. Needs one point above 1 CPU for `sigma` and two distinct ones to
/// identify `kappa` as well; returns `None` with no point above 1 CPU.
pub fn fit_usl(points: &[SpeedupPoint]) -> Option<UslFit> {
    let data = informative(points);
    if data.is_empty() {
        return None;
    }
    let mut distinct: Vec<f64> = data.iter().map(|p| p.cpus).collect();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    let kappa_identifiable = distinct.len() >= 2;

    let (mut sigma, mut kappa) = linearised_usl(&data, kappa_identifiable);
    let mut sse = sum_squared_error(&data, |n| usl_speedup(sigma, kappa, n));
    for _ in 0..GAUSS_NEWTON_ITERATIONS {
        // Normal equations J^T J d = J^T r for the two parameters.
        let (mut a11, mut a12, mut a22, mut b1, mut b2) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for p in &data {
            let n = p.cpus;
            let denominator = 1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0);
            let d_sigma = -n * (n - 1.0) / (denominator * denominator);
            let d_kappa = if kappa_identifiable { d_sigma * n } else { 0.0 };
            let residual = p.speedup - usl_speedup(sigma, kappa, n);
            a11 += d_sigma * d_sigma;
            a12 += d_sigma * d_kappa;
            a22 += d_kappa * d_kappa;
            b1 += d_sigma * residual;
            b2 += d_kappa * residual;
        }
        let (mut step_sigma, mut step_kappa) = solve_2x2(a11, a12, a22, b1, b2);
        let mut improved = false;
        for _ in 0..30 {
            let candidate_sigma = (sigma + step_sigma).max(0.0);
            let candidate_kappa = (kappa + step_kappa).max(0.0);
            let candidate_sse =
                sum_squared_error(&data, |n| usl_speedup(candidate_sigma, candidate_kappa, n));
            if candidate_sse < sse {
                improved = (sse - candidate_sse) > 1e-15 * sse.max(1e-300);
                sigma = candidate_sigma;
                kappa = candidate_kappa;
                sse = candidate_sse;
                break;
            }
            step_sigma /= 2.0;
            step_kappa /= 2.0;
        }
        if !improved {
            break;
        }
    }
    Some(UslFit {
        sigma,
        kappa,
        rms_error: rms_error(points, |n| usl_speedup(sigma, kappa, n)),
        kappa_held_at_zero: !kappa_identifiable,
    })
}

/// Closed-form start for the USL: `n/S - 1 = sigma (n-1) + kappa n (n-1)` is linear
/// in both parameters. Non-negativity is enforced by refitting the one that stays.
fn linearised_usl(data: &[SpeedupPoint], kappa_identifiable: bool) -> (f64, f64) {
    let (mut s11, mut s12, mut s22, mut t1, mut t2) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for p in data {
        let x1 = p.cpus - 1.0;
        let x2 = p.cpus * (p.cpus - 1.0);
        let y = p.cpus / p.speedup - 1.0;
        s11 += x1 * x1;
        s12 += x1 * x2;
        s22 += x2 * x2;
        t1 += x1 * y;
        t2 += x2 * y;
    }
    let sigma_only = ((t1 / s11).max(0.0), 0.0);
    if !kappa_identifiable {
        return sigma_only;
    }
    let (sigma, kappa) = solve_2x2(s11, s12, s22, t1, t2);
    if sigma >= 0.0 && kappa >= 0.0 {
        (sigma, kappa)
    } else if sigma < 0.0 {
        (0.0, (t2 / s22).max(0.0))
    } else {
        sigma_only
    }
}

/// Solves the symmetric system `[a11 a12; a12 a22] x = [b1; b2]`, falling back to
/// the diagonal when it is singular.
fn solve_2x2(a11: f64, a12: f64, a22: f64, b1: f64, b2: f64) -> (f64, f64) {
    let determinant = a11 * a22 - a12 * a12;
    if determinant.abs() > 1e-12 * (a11 * a22).abs().max(1e-300) {
        (
            (b1 * a22 - b2 * a12) / determinant,
            (a11 * b2 - a12 * b1) / determinant,
        )
    } else {
        let x1 = if a11 > 0.0 { b1 / a11 } else { 0.0 };
        let x2 = if a22 > 0.0 { b2 / a22 } else { 0.0 };
        (x1, x2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const CORE_COUNTS: [f64; 7] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

    fn curve(model: impl Fn(f64) -> f64) -> Vec<SpeedupPoint> {
        CORE_COUNTS
            .iter()
            .map(|&cpus| SpeedupPoint {
                cpus,
                speedup: model(cpus),
            })
            .collect()
    }

    #[test]
    fn amdahl_recovers_exact_serial_fraction() {
        let fit = fit_amdahl(&curve(|n| amdahl_speedup(0.07, n))).unwrap();
        assert!((fit.serial_fraction - 0.07).abs() < 1e-9, "{fit:?}");
        assert!(fit.rms_error < 1e-9);
        assert!((fit.speedup_limit().unwrap() - 1.0 / 0.07).abs() < 1e-6);
    }

    #[test]
    fn amdahl_of_linear_scaling_is_zero_serial_fraction() {
        let fit = fit_amdahl(&curve(|n| n)).unwrap();
        assert!(fit.serial_fraction < 1e-12);
        assert_eq!(fit.speedup_limit(), None);
    }

    #[test]
    fn usl_recovers_exact_parameters_and_peak() {
        let fit = fit_usl(&curve(|n| usl_speedup(0.05, 0.002, n))).unwrap();
        assert!((fit.sigma - 0.05).abs() < 1e-7, "{fit:?}");
        assert!((fit.kappa - 0.002).abs() < 1e-9, "{fit:?}");
        assert!(!fit.kappa_held_at_zero);
        let expected_peak = ((1.0 - 0.05) / 0.002f64).sqrt();
        assert!((fit.peak_cpus().unwrap() - expected_peak).abs() < 1e-3);
    }

    #[test]
    fn usl_recovers_parameters_from_noisy_curve() {
        // 2% multiplicative noise from a fixed seed, so the test is deterministic.
        let mut rng = ChaCha8Rng::seed_from_u64(42);
        let points: Vec<SpeedupPoint> = curve(|n| usl_speedup(0.1, 0.001, n))
            .into_iter()
            .map(|p| SpeedupPoint {
                speedup: if p.cpus == 1.0 {
                    1.0
                } else {
                    p.speedup * rng.gen_range(0.98..1.02)
                },
                ..p
            })
            .collect();
        let fit = fit_usl(&points).unwrap();
        assert!((fit.sigma - 0.1).abs() < 0.03, "{fit:?}");
        assert!((fit.kappa - 0.001).abs() < 0.0005, "{fit:?}");
        assert!(fit.rms_error < 0.5, "{fit:?}");
    }

    #[test]
    fn usl_with_one_multi_cpu_point_holds_kappa_at_zero() {
        let points = [
            SpeedupPoint {
                cpus: 1.0,
                speedup: 1.0,
            },
            SpeedupPoint {
                cpus: 2.0,
                speedup: 1.6,
            },
        ];
        let fit = fit_usl(&points).unwrap();
        assert!(fit.kappa_held_at_zero);
        assert_eq!(fit.kappa, 0.0);
        // 2 / (1 + sigma) = 1.6  =>  sigma = 0.25, an exact fit.
        assert!((fit.sigma - 0.25).abs() < 1e-9, "{fit:?}");
        assert_eq!(fit.peak_cpus(), None);
    }

    #[test]
    fn slowdown_with_more_cpus_peaks_at_one_cpu() {
        let points = [
            SpeedupPoint {
                cpus: 1.0,
                speedup: 1.0,
            },
            SpeedupPoint {
                cpus: 2.0,
                speedup: 0.9,
            },
        ];
        let fit = fit_usl(&points).unwrap();
        assert!(fit.sigma > 1.0, "{fit:?}");
        assert_eq!(fit.peak_cpus(), Some(1.0));
    }

    #[test]
    fn superlinear_speedup_clamps_parameters_at_zero() {
        let fit = fit_usl(&curve(|n| 1.1 * n)).unwrap();
        assert_eq!((fit.sigma, fit.kappa), (0.0, 0.0));
        assert_eq!(
            fit_amdahl(&curve(|n| 1.1 * n)).unwrap().serial_fraction,
            0.0
        );
    }

    #[test]
    fn no_fit_without_a_multi_cpu_point() {
        let only_baseline = [SpeedupPoint {
            cpus: 1.0,
            speedup: 1.0,
        }];
        assert!(fit_amdahl(&only_baseline).is_none());
        assert!(fit_usl(&only_baseline).is_none());
        let broken = [SpeedupPoint {
            cpus: 2.0,
            speedup: f64::NAN,
        }];
        assert!(fit_usl(&broken).is_none());
    }

    proptest! {
        #[test]
        fn usl_fit_recovers_any_noise_free_curve(sigma in 0.0f64..0.5, kappa in 0.0f64..0.02) {
            let fit = fit_usl(&curve(|n| usl_speedup(sigma, kappa, n))).unwrap();
            prop_assert!((fit.sigma - sigma).abs() < 1e-4, "{:?}", fit);
            prop_assert!((fit.kappa - kappa).abs() < 1e-5, "{:?}", fit);
        }

        #[test]
        fn amdahl_fit_recovers_any_noise_free_curve(s in 0.0f64..1.0) {
            let fit = fit_amdahl(&curve(|n| amdahl_speedup(s, n))).unwrap();
            prop_assert!((fit.serial_fraction - s).abs() < 1e-6, "{:?}", fit);
        }
    }
}
