//! Resource retention: how long a vCPU is held busy after its workload goes idle (§4.1, §6).
//!
//! Holding an idle vCPU is a bet. If the workload wakes within the hold, the wake costs what a
//! wake on a busy vCPU costs; if not, the hold was wasted CPU and the wake pays the halted-vCPU
//! price anyway. This is the ski-rental problem: holding for exactly the price difference
//! between the two kinds of wake is never worse than twice the best choice in hindsight, which
//! is why the default timeout is derived from measured wake costs rather than guessed.

use serde::{Deserialize, Serialize};

/// Bounds on any timeout we derive or adapt: below 5 µs retention cannot catch even a
/// same-vCPU wake; above 1 ms the held vCPU costs more than any wake here was ever measured to.
pub const MIN_TIMEOUT_NS: u64 = 5_000;
pub const MAX_TIMEOUT_NS: u64 = 1_000_000;

/// How long a retention thread keeps an idle vCPU before releasing it to the hypervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RetentionTimeout {
    pub ns: u64,
}

/// (De)serializes a [`RetentionTimeout`] as a bare number of nanoseconds, the form the
/// configuration key `retention_timeout_ns` has always had:
/// `#[serde(with = "gleaner_policy::retention::as_ns")]`.
pub mod as_ns {
    use super::RetentionTimeout;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &RetentionTimeout, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(t.ns)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<RetentionTimeout, D::Error> {
        u64::deserialize(d).map(|ns| RetentionTimeout { ns })
    }
}

impl RetentionTimeout {
    /// A hold given in microseconds, the unit of the `retention_timeout_us` setting.
    pub fn from_us(us: u64) -> Self {
        Self {
            ns: us.saturating_mul(1_000),
        }
    }

    /// In microseconds, as `gleaner status` prints it.
    pub fn as_us_f64(self) -> f64 {
        self.ns as f64 / 1e3
    }

    /// In seconds, the unit Prometheus metrics use.
    pub fn as_secs_f64(self) -> f64 {
        self.ns as f64 / 1e9
    }

    /// Break-even hold from measured median wake latencies: waking a thread on a halted vCPU
    /// (`halted_ns`, Table 2 setting C) versus on a vCPU kept busy (`busy_ns`, setting B).
    pub fn from_wake_costs(halted_ns: u64, busy_ns: u64) -> Self {
        let gain = halted_ns.saturating_sub(busy_ns);
        Self {
            ns: gain.clamp(MIN_TIMEOUT_NS, MAX_TIMEOUT_NS),
        }
    }

    /// The timeout adapted to the workload and the host (§4.1 footnote 5).
    ///
    /// * Idle periods much longer than the break-even hold are not worth holding at all: the
    ///   hold would almost always time out, so the caller turns retention off instead.
    /// * Steal says the host is oversubscribed: every held microsecond is taken from another VM
    ///   (the paper's 8x throughput loss), so the hold shrinks in proportion to steal.
    pub fn adapted(self, steal_fraction: f64) -> Self {
        let steal = steal_fraction.clamp(0.0, 1.0);
        // Halve the hold at 10 % steal, quarter it at 30 %: retention then only bridges the
        // shortest gaps and consolidation carries the rest.
        let scale = 1.0 / (1.0 + 10.0 * steal);
        let ns = (self.ns as f64 * scale) as u64;
        Self {
            ns: ns.clamp(MIN_TIMEOUT_NS, MAX_TIMEOUT_NS),
        }
    }
}

/// Longest hold on an unshared host: the guest haltpoll driver's default poll limit
/// (`guest_halt_poll_ns`, 200 µs), the longest idle spin Linux itself ships.
pub const MAX_UNSHARED_HOLD_NS: u64 = 200_000;

/// Steal below this fraction of the period: the host is not shared, as far as the VM can tell.
pub const UNSHARED_STEAL: f64 = 0.01;

impl RetentionTimeout {
    /// The hold for a workload whose idle periods last `l_idle_ns` on average, on a host
    /// where the active vCPUs lose `steal_fraction` of their time: [`Self::adapted`] to
    /// steal, and on a host that steals nothing, where the mean idle period outlasts that hold
    /// (so most holds would time out), lengthened to twice the mean idle period (at most
    /// [`MAX_UNSHARED_HOLD_NS`]). The break-even hold bounds the cost of holding by what
    /// a halt costs; without steal a held vCPU takes its pCPU from nobody, so there is
    /// nothing to bound, and a hold that outlasts most idle periods turns nearly every wake
    /// into a cheap one (what cpuidle-haltpoll does by growing its poll to 200 µs). The
    /// policy lab's tuning set: p90 regret 6.9 -> 5.3 %, fine-grained barrier phases +6 %.
    pub fn for_workload(self, steal_fraction: f64, l_idle_ns: f64) -> Self {
        let t = self.adapted(steal_fraction);
        if !(steal_fraction < UNSHARED_STEAL && l_idle_ns.is_finite() && l_idle_ns > t.ns as f64) {
            return t;
        }
        let ns = (2.0 * l_idle_ns).min(MAX_UNSHARED_HOLD_NS as f64) as u64;
        Self { ns: ns.max(t.ns) }
    }
}

/// Idle periods that must have been seen before the share a hold would catch, rather than
/// their mean length, decides whether a hold pays ([`RetentionTimeout::for_sample`]).
pub const MIN_IDLE_PERIODS_SEEN: u64 = 50;

impl RetentionTimeout {
    /// [`Self::for_workload`], except on a host that steals where the sampler saw when
    /// wake-ups came into idle periods (`hits_seen`): there the hold stays the break-even
    /// one. Shrinking it with steal is a guess at what a hold costs the other VMs; the
    /// wake-ups say it (a hold that a wake-up ends costs the host no more than the halt and
    /// wake-up it replaces, one that times out costs the hold), and the caller holds only
    /// where most idle periods end within it.
    pub fn for_sample(self, steal_fraction: f64, l_idle_ns: f64, hits_seen: bool) -> Self {
        if hits_seen && steal_fraction >= UNSHARED_STEAL {
            return self;
        }
        self.for_workload(steal_fraction, l_idle_ns)
    }
}

impl Default for RetentionTimeout {
    /// Used only when no wake-cost measurement is available: the gap between the paper's
    /// Table 2 settings C and B (37 µs − 17 µs).
    fn default() -> Self {
        Self { ns: 20_000 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derives_break_even_from_wake_costs() {
        assert_eq!(RetentionTimeout::from_wake_costs(46_000, 16_000).ns, 30_000);
        // Busy wakes dearer than halted ones: nothing to gain, hold the minimum.
        assert_eq!(
            RetentionTimeout::from_wake_costs(10_000, 20_000).ns,
            MIN_TIMEOUT_NS
        );
        assert_eq!(
            RetentionTimeout::from_wake_costs(u64::MAX, 0).ns,
            MAX_TIMEOUT_NS
        );
    }

    #[test]
    fn steal_shortens_the_hold() {
        let us = RetentionTimeout::from_us(250);
        assert_eq!(
            (us.ns, us.as_us_f64(), us.as_secs_f64()),
            (250_000, 250.0, 0.00025)
        );
        let t = RetentionTimeout { ns: 40_000 };
        assert_eq!(t.adapted(0.0).ns, 40_000);
        assert_eq!(t.adapted(0.1).ns, 20_000);
        assert!(t.adapted(0.5).ns < 10_000);
        assert_eq!(t.adapted(f64::NAN.max(0.0)).ns, 40_000);
    }

    #[test]
    fn an_unshared_host_holds_for_twice_the_mean_idle_period() {
        let t = RetentionTimeout { ns: 20_000 };
        // Lab case phase-grain-10us-16v-dedicated: 35 us idle periods, no steal.
        assert_eq!(t.for_workload(0.0, 35_000.0).ns, 70_000);
        // Capped at haltpoll's 200 us; never shorter than the break-even hold.
        assert_eq!(t.for_workload(0.0, 1e6).ns, MAX_UNSHARED_HOLD_NS);
        assert_eq!(t.for_workload(0.0, 5_000.0).ns, 20_000);
        // Idle periods the break-even hold already outlasts: nothing to lengthen.
        assert_eq!(t.for_workload(0.0, 15_000.0).ns, 20_000);
        // Any steal: the steal-adapted break-even hold.
        assert_eq!(t.for_workload(0.1, 35_000.0), t.adapted(0.1));
        assert_eq!(t.for_workload(0.0, f64::NAN), t);
    }

    #[test]
    fn under_steal_a_hold_whose_hits_are_seen_stays_the_break_even_one() {
        let t = RetentionTimeout { ns: 20_000 };
        // fig7's dedup VM: 2-3 % steal, idle periods of 300 us on average.
        assert_eq!(t.for_sample(0.03, 300_000.0, true), t);
        assert_eq!(t.for_sample(0.03, 300_000.0, false), t.adapted(0.03));
        // No steal: as for_workload, whatever was seen.
        assert_eq!(
            t.for_sample(0.0, 35_000.0, true),
            t.for_workload(0.0, 35_000.0)
        );
    }
}
