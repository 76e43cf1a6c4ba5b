//! Whether the workload's grain (g_comp) moved, where switch counts come from windows.
//!
//! The major-change test undoes a consolidation when g_comp moves by more than
//! `major_gcomp_factor`, and voids a trial for the same reason. Where every switch is counted
//! (the simulator, the procfs sampler, the BPF sampler on a quiet workload) one period's
//! g_comp against the reference period's is what the test has always compared. Where the BPF
//! sampler scales a few-millisecond window up to the period, one window is a small sample:
//! one run interval stretched by the host inflates the window's mean, and on the `none` guest
//! of 2026-11-28 single windows of a steady, packed ping-pong read 2-20x the others and undid
//! the packing in 11 of 28 runs (`results/pingpong-none-2026-11-28/`). So for windows the
//! reference is the median of the windows measured since the configuration last changed (at
//! least [`MIN_WINDOWS`] of them; the settling periods' windows left out), and a window
//! beyond the factor is a suspicion that the next fresh window must repeat, on the same
//! side, before the grain counts as moved. While a consolidation stands the policy asks the
//! sampler for the windows this needs (`Decision::fresh_rates_wanted`); otherwise the windows
//! the sampler takes anyway serve.

use std::collections::VecDeque;

use crate::sample::RatesFrom;

/// Windows the reference is the median of before it is used: with three, one outlier (the
/// very window a reference period happened to carry) cannot be the median.
pub(super) const MIN_WINDOWS: usize = 3;

/// The most recent windows kept: a reference that follows a slow drift of the workload, as a
/// reference period re-taken after each accepted change would.
const MAX_WINDOWS: usize = 9;

/// What one period's g_comp says about the grain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum GrainVerdict {
    /// Nothing to act on.
    Steady,
    /// Too few windows for a reference yet: a fresh window next period builds it.
    Building,
    /// A window lay beyond the factor: the next fresh window decides, and nothing starts until
    /// then.
    Suspect,
    /// Two fresh windows in a row lay beyond the factor on the same side of the reference.
    Moved { from_ns: f64, to_ns: f64 },
}

/// The fresh windows' g_comp since the configuration last changed, and a suspicion awaiting
/// its confirmation.
#[derive(Debug, Clone, Default)]
pub(super) struct GrainTrack {
    windows: VecDeque<f64>,
    suspect: Option<f64>,
}

impl GrainTrack {
    /// Forgets the windows: the configuration (or the workload) changed, and the grain
    /// measured before describes another program.
    pub(super) fn reset(&mut self) {
        self.windows.clear();
        self.suspect = None;
    }

    /// The reference grain: the median of the windows kept, once there are enough.
    pub(super) fn reference_ns(&self) -> Option<f64> {
        if self.windows.len() < MIN_WINDOWS {
            return None;
        }
        let mut xs: Vec<f64> = self.windows.iter().copied().collect();
        xs.sort_by(f64::total_cmp);
        let n = xs.len();
        Some(if n % 2 == 1 {
            xs[n / 2]
        } else {
            0.5 * (xs[n / 2 - 1] + xs[n / 2])
        })
    }

    /// One period's g_comp measured from windows (`rates` windowed). A period that carried an
    /// earlier window's counts over repeats that window's g_comp (its switches are scaled by
    /// the run time), so it is no new evidence.
    pub(super) fn observe(
        &mut self,
        g_comp_ns: f64,
        rates: RatesFrom,
        factor: f64,
    ) -> GrainVerdict {
        debug_assert!(rates.windowed());
        if rates != RatesFrom::ThisWindow || !(g_comp_ns > 0.0 && g_comp_ns.is_finite()) {
            return match (self.suspect, self.reference_ns()) {
                (Some(_), _) => GrainVerdict::Suspect,
                (None, None) => GrainVerdict::Building,
                (None, Some(_)) => GrainVerdict::Steady,
            };
        }
        let Some(reference) = self.reference_ns() else {
            self.push(g_comp_ns);
            return if self.windows.len() < MIN_WINDOWS {
                GrainVerdict::Building
            } else {
                GrainVerdict::Steady
            };
        };
        let side = side_of(g_comp_ns / reference, factor);
        if side == 0 {
            // The suspicion, if any, was one window's luck: it stays out of the reference.
            self.suspect = None;
            self.push(g_comp_ns);
            return GrainVerdict::Steady;
        }
        match self.suspect.take() {
            Some(s) if side_of(s / reference, factor) == side => GrainVerdict::Moved {
                from_ns: reference,
                to_ns: g_comp_ns,
            },
            _ => {
                self.suspect = Some(g_comp_ns);
                GrainVerdict::Suspect
            }
        }
    }

    fn push(&mut self, g_comp_ns: f64) {
        self.windows.push_back(g_comp_ns);
        if self.windows.len() > MAX_WINDOWS {
            self.windows.pop_front();
        }
    }
}

/// +1 above `factor` times the reference, -1 below its inverse, 0 within.
fn side_of(ratio: f64, factor: f64) -> i8 {
    if ratio > factor {
        1
    } else if ratio < 1.0 / factor {
        -1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::GrainVerdict::*;
    use super::*;
    use RatesFrom::{EarlierWindow, ThisWindow};

    fn feed(t: &mut GrainTrack, gs: &[f64]) -> Vec<GrainVerdict> {
        gs.iter()
            .map(|&g| t.observe(g, RatesFrom::ThisWindow, 2.0))
            .collect()
    }

    #[test]
    fn one_outlying_window_is_not_a_change() {
        // The ping-pong of results/pingpong-none-2026-11-28/tl-9: 1.9 us every window, then
        // one of 20.9 us with utilization unchanged; the next window is back at 1.9.
        let mut t = GrainTrack::default();
        let v = feed(&mut t, &[1.9e3, 1.8e3, 2.0e3, 20.9e3, 1.9e3, 1.85e3]);
        assert_eq!(v[..3], [Building, Building, Steady]);
        assert_eq!(v[3], Suspect);
        assert_eq!(v[4..], [Steady, Steady]);
        // The outlier never entered the reference.
        assert_eq!(t.reference_ns(), Some(1.9e3));
    }

    #[test]
    fn an_outlying_first_window_is_outvoted() {
        // A reference taken in a period that carried a 4.0 us window, the program at 1.9 us.
        let mut t = GrainTrack::default();
        let v = feed(&mut t, &[4.0e3, 1.9e3, 1.9e3, 1.9e3]);
        assert!(
            v.iter().all(|x| !matches!(x, GrainVerdict::Moved { .. })),
            "{v:?}"
        );
        assert_eq!(t.reference_ns(), Some(1.9e3));
    }

    /// One period's g_comp and where its counts came from.
    type Window = (f64, RatesFrom);

    /// The verdicts on windows of g_comp `g` from `from`, in order, with the factor 2.
    fn verdicts(t: &mut GrainTrack, windows: &[Window]) -> Vec<GrainVerdict> {
        windows
            .iter()
            .map(|&(g, from)| t.observe(g, from, 2.0))
            .collect()
    }

    /// After three windows at about 2 us: a change two fresh windows show on one side is a
    /// change; a carried-over period repeats the suspect window and confirms nothing; windows
    /// on opposite sides confirm nothing either.
    #[test]
    fn only_two_fresh_windows_on_one_side_make_a_change() {
        let moved = Moved {
            from_ns: 2.0e3,
            to_ns: 25e3,
        };
        let cases: [(&[Window], &[GrainVerdict]); 2] = [
            (
                &[
                    (30e3, ThisWindow),
                    (30e3, EarlierWindow),
                    (25e3, ThisWindow),
                ],
                &[Suspect, Suspect, moved],
            ),
            (
                &[(9e3, ThisWindow), (0.5e3, ThisWindow), (2.0e3, ThisWindow)],
                &[Suspect, Suspect, Steady],
            ),
        ];
        for (windows, expected) in cases {
            let mut t = GrainTrack::default();
            feed(&mut t, &[2.0e3, 2.1e3, 1.9e3]);
            assert_eq!(verdicts(&mut t, windows), expected, "{windows:?}");
        }
    }

    #[test]
    fn the_reference_follows_the_recent_windows() {
        let mut t = GrainTrack::default();
        feed(&mut t, &[1.0e3; MAX_WINDOWS]);
        // A slow drift within the factor each step moves the median with it.
        feed(&mut t, &[1.5e3; MAX_WINDOWS]);
        assert_eq!(t.reference_ns(), Some(1.5e3));
        t.reset();
        assert_eq!(t.reference_ns(), None);
    }
}
