//! Keeps the control loop on a fixed schedule and tells a late period from a disrupted one.
//!
//! Why a module of its own: sleeping "one period" after each period's work makes the period
//! drift by the work's duration (the 30-minute soak measured a mean of 104 ms against 100 ms),
//! and says nothing about how late a wake-up was. The pacer instead sleeps until absolute
//! deadlines on the monotonic clock, measures how late each wake-up is, and, when the loop
//! falls more than a whole period behind (an overloaded machine, a stopped process, a paused
//! VM), drops the deadlines it missed instead of running them back to back.
//!
//! It is pure: the caller passes `now` in nanoseconds of a monotonic clock, so tests drive it
//! through jumps and stalls that cannot be produced on demand on a real machine. A wall-clock
//! change (settimeofday, NTP step) never reaches it: the daemon reads only CLOCK_MONOTONIC.

/// What one wake-up looked like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wake {
    /// How long after its deadline the wake-up came.
    pub late_ns: u64,
    /// Whole control periods the wake-up came late by: sampling rounds that did not happen.
    pub missed_periods: u64,
}

#[derive(Debug, Clone)]
pub struct Pacer {
    deadline_ns: u64,
}

impl Pacer {
    /// A pacer whose first interval starts at `now_ns`.
    pub fn new(now_ns: u64) -> Self {
        Self {
            deadline_ns: now_ns,
        }
    }

    /// Sets the next deadline `interval_ns` after the previous one and returns how long to
    /// sleep from `now_ns` to reach it (zero when it has already passed).
    pub fn next(&mut self, now_ns: u64, interval_ns: u64) -> u64 {
        self.deadline_ns = self.deadline_ns.saturating_add(interval_ns.max(1));
        self.deadline_ns.saturating_sub(now_ns)
    }

    /// Records a wake-up at `now_ns` for the deadline set by the last [`Pacer::next`], whose
    /// interval was `interval_ns` (a sub-sample slice) within a control period of `period_ns`.
    ///
    /// A wake-up more than one interval late re-anchors the schedule at `now_ns`: the missed
    /// deadlines are dropped, not caught up, so a stall is followed by normal intervals
    /// rather than a burst of short ones. Lateness is counted as missed periods in whole
    /// control periods.
    pub fn woke(&mut self, now_ns: u64, interval_ns: u64, period_ns: u64) -> Wake {
        let late_ns = now_ns.saturating_sub(self.deadline_ns);
        if late_ns > interval_ns.max(1) {
            self.deadline_ns = now_ns;
        }
        Wake {
            late_ns,
            missed_periods: late_ns / period_ns.max(1),
        }
    }
}

/// Whether a period that was planned to last `planned_ns` and measured `measured_ns` can be
/// trusted as one period of the workload's behaviour.
///
/// A period more than twice its plan spans a stall: the process was stopped, the VM paused
/// or the machine overloaded. Counters read across it describe the stall, not the workload
/// (a paused VM shows seconds of "busy" or "idle" time depending on what ran when it
/// stopped), so the policy must not judge a consolidation or a phase change by it.
pub fn is_disrupted(planned_ns: u64, measured_ns: u64) -> bool {
    measured_ns > planned_ns.saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn deadlines_are_absolute_so_work_does_not_make_the_period_drift() {
        let mut p = Pacer::new(0);
        let mut now = 0;
        for i in 1..=100u64 {
            let sleep = p.next(now, 10 * MS);
            now += sleep;
            assert_eq!(
                p.woke(now, 10 * MS, 100 * MS),
                Wake {
                    late_ns: 0,
                    missed_periods: 0
                }
            );
            // 3 ms of work after every wake-up.
            now += 3 * MS;
            assert_eq!(now, i * 10 * MS + 3 * MS);
        }
    }

    #[test]
    fn a_slightly_late_wake_up_is_absorbed_by_the_next_sleep() {
        let mut p = Pacer::new(0);
        assert_eq!(p.next(0, 10 * MS), 10 * MS);
        assert_eq!(
            p.woke(14 * MS, 10 * MS, 100 * MS),
            Wake {
                late_ns: 4 * MS,
                missed_periods: 0
            }
        );
        assert_eq!(
            p.next(14 * MS, 10 * MS),
            6 * MS,
            "the schedule stays anchored at 0"
        );
        // Late by more than a slice but less than a period: re-anchored, no period missed.
        assert_eq!(
            p.woke(50 * MS, 10 * MS, 100 * MS),
            Wake {
                late_ns: 30 * MS,
                missed_periods: 0
            }
        );
        assert_eq!(p.next(50 * MS, 10 * MS), 10 * MS);
    }

    #[test]
    fn a_stall_skips_the_missed_deadlines_instead_of_bursting() {
        let mut p = Pacer::new(0);
        p.next(0, 10 * MS);
        // Stopped for 5 s (SIGSTOP, a paused VM, a forward jump of the monotonic clock).
        let w = p.woke(5_010 * MS, 10 * MS, 100 * MS);
        assert_eq!(
            w,
            Wake {
                late_ns: 5_000 * MS,
                missed_periods: 50
            }
        );
        assert_eq!(
            p.next(5_010 * MS, 10 * MS),
            10 * MS,
            "a full interval follows, not a burst"
        );
    }

    #[test]
    fn time_that_seems_to_go_backwards_is_never_a_negative_sleep_or_lateness() {
        let mut p = Pacer::new(1_000 * MS);
        assert_eq!(p.next(5_000 * MS, 100 * MS), 0, "deadline already passed");
        assert_eq!(
            p.woke(0, 100 * MS, 100 * MS),
            Wake {
                late_ns: 0,
                missed_periods: 0
            }
        );
        let mut q = Pacer::new(u64::MAX - 10);
        assert_eq!(
            q.next(u64::MAX - 10, 100 * MS),
            10,
            "deadline saturates instead of wrapping"
        );
    }

    #[test]
    fn only_periods_beyond_twice_their_plan_are_disrupted() {
        assert!(!is_disrupted(100 * MS, 100 * MS));
        assert!(!is_disrupted(100 * MS, 200 * MS));
        assert!(is_disrupted(100 * MS, 201 * MS));
        assert!(is_disrupted(100 * MS, u64::MAX));
        assert!(!is_disrupted(u64::MAX, u64::MAX));
    }
}
