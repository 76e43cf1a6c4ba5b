//! What the policy is told each period, and the workload characteristics derived from it.
//!
//! Exists so that the daemon (reading procfs/cgroups) and the simulator (counting its own
//! events) feed the policy the very same numbers. Everything is integer nanoseconds and event
//! counts over one period; nothing here reads a clock.

use serde::{Deserialize, Serialize};

/// One vCPU's counters over one period.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuSample {
    pub cpu: usize,
    /// Time the workload's threads ran on this vCPU (part of T_work).
    pub work_ns: u64,
    /// Time Gleaner's retention thread spun on this vCPU (part of T_yield).
    pub yield_ns: u64,
    /// Time the vCPU was idle in the guest kernel: halted, or polling in cpuidle.
    pub idle_ns: u64,
    /// Time stolen by the hypervisor (per-CPU steal in /proc/stat).
    pub steal_ns: u64,
    /// Times the retention thread lost the vCPU to another thread: each is the end of an
    /// idle period that retention absorbed (part of S_yield).
    pub yield_preemptions: u64,
    /// Times the guest kernel entered its idle loop on this vCPU: each is an idle period that
    /// retention did not absorb (a halt, or a poll when in-kernel polling retains).
    pub idle_entries: u64,
}

impl VcpuSample {
    /// Idle periods on this vCPU: those absorbed by retention plus those the kernel saw.
    pub fn idle_periods(&self) -> u64 {
        self.yield_preemptions + self.idle_entries
    }

    /// Idle time as Gleaner understands it: time not spent on useful work, whether the
    /// retention thread spun or the kernel idled (T_idle of §6).
    pub fn idle_time_ns(&self) -> u64 {
        self.yield_ns + self.idle_ns
    }
}

/// Everything measured in one period.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodSample {
    /// Length of the period the counters cover.
    pub period_ns: u64,
    /// One entry per vCPU the workload is allowed to use, active or not.
    pub vcpus: Vec<VcpuSample>,
    /// Context switches of the workload's threads, voluntary plus involuntary (S_work).
    pub work_switches: u64,
    /// Threads in the workload at the end of the period.
    pub work_threads: u64,
    /// Time workload threads queued on one active vCPU while another active vCPU had none of
    /// them (estimated from sub-samples of the threads' run states); `None` if unknown.
    pub work_runnable_wait_ns: Option<u64>,
    /// Wake-up latency of the workload's threads, from the waker's `sched_waking` to the
    /// wakee running, split by what the wakee's vCPU was doing when it was woken; `None` where
    /// the sampler cannot see individual wake-ups (procfs fallback).
    #[serde(default)]
    pub wake_latency: Option<WakeLatencies>,
    /// Units of application progress completed in the period (transactions, items, rounds),
    /// where the application exposes such a counter; `None` where it does not.
    #[serde(default)]
    pub progress: Option<u64>,
    /// The switch and wake-up counts were carried over from an earlier period's measurement
    /// window, and this period's pace (run time, idle periods) no longer resembles that one's:
    /// they may describe another workload phase, so nothing is changed on them. Set by the
    /// BPF sampler, which measures the busiest workloads in a window one period in ten; the
    /// next period measures afresh. A ping-pong whose threads shared a vCPU during its first
    /// window and parted right after was held by polling on that window's counts (x0.6 of
    /// consolidating it) in 1 to 4 runs of 10 on the haltpoll guest.
    #[serde(default)]
    pub stale_rates: bool,
    /// How the switch and wake-up counts were measured: counted over whole periods, or in a
    /// window (a few milliseconds scaled up, or a whole period where its events fit the BPF
    /// sampler's budget; this period's, or an earlier one's). A window can be far off: one
    /// that holds a stretch where the vCPU ran slowly counts that stretch as run time between
    /// few switches. On the `none` guest of 2026-11-28 windows of a steady, packed ping-pong
    /// gave g_comp 2-20x the others', alone or two or three in a row, and undid the packing
    /// as a "major change" (`results/pingpong-none-2026-11-28/`). The policy acts on a change
    /// seen in windows only once fresh windows show it for a while
    /// (`Decision::fresh_rates_wanted`; `engine/grain.rs`).
    #[serde(default)]
    pub rates_from: RatesFrom,
}

/// Where a [`PeriodSample`]'s switch and wake-up counts come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RatesFrom {
    /// Counted over the whole period, or over the last few whole periods and averaged (the
    /// procfs sampler under a tight budget): every switch is in the count. The simulator's.
    #[default]
    Counting,
    /// Counted in a window of this period (the BPF sampler's: a part of the period scaled up
    /// to the whole, or all of it where its events fit the window's budget).
    ThisWindow,
    /// Carried over from an earlier period's window: the same measurement as that period's,
    /// no new evidence.
    EarlierWindow,
}

impl RatesFrom {
    /// The counts are a window's sample rather than a count of every event.
    pub fn windowed(self) -> bool {
        !matches!(self, RatesFrom::Counting)
    }
}

/// Number of buckets in a [`LatencyHistogram`]: buckets 0..4 hold 0, 1, 2 and 3 ns; from
/// 4 ns on, each power of two [2^k, 2^(k+1)) is split into four equal parts, up to 2^33 ns
/// (8.6 s); the last bucket also holds everything longer.
pub const LATENCY_BUCKETS: usize = 128;

/// A histogram of latencies in nanoseconds with four linear buckets per power of two: fixed
/// size and mergeable, so that a kernel map (the BPF sampler computes the same
/// [`LatencyHistogram::bucket_of`]), the simulator and the policy all count the same way. A
/// bucket is at most 25 % wide, so a quantile read from it is within that of the truth; whole
/// octaves (this histogram's first form) left a factor of two, and a p50 near a power of two
/// flipped between octaves from one run to the next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    #[serde(with = "bucket_list")]
    pub buckets: [u64; LATENCY_BUCKETS],
    pub count: u64,
    pub sum_ns: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            buckets: [0; LATENCY_BUCKETS],
            count: 0,
            sum_ns: 0,
        }
    }
}

/// The buckets as a JSON list (serde derives arrays only up to 32 long). A list of 32 is a
/// timeline or status file written with one bucket per power of two: each count moves to the
/// bucket where its power of two begins.
mod bucket_list {
    use super::{LatencyHistogram, LATENCY_BUCKETS};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u64; LATENCY_BUCKETS], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(b.iter())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<[u64; LATENCY_BUCKETS], D::Error> {
        let v = Vec::<u64>::deserialize(d)?;
        let mut out = [0u64; LATENCY_BUCKETS];
        match v.len() {
            LATENCY_BUCKETS => out.copy_from_slice(&v),
            LOG2_BUCKETS => {
                for (i, n) in v.into_iter().enumerate() {
                    let floor = if i == 0 { 0 } else { 1u64 << i };
                    out[LatencyHistogram::bucket_of(floor)] += n;
                }
            }
            n => {
                return Err(serde::de::Error::custom(format!(
                    "a latency histogram has {LATENCY_BUCKETS} buckets (or {LOG2_BUCKETS}, one per power of two), not {n}"
                )))
            }
        }
        Ok(out)
    }

    /// Buckets of the first, one-per-power-of-two form.
    const LOG2_BUCKETS: usize = 32;
}

impl LatencyHistogram {
    /// The bucket a latency falls in: the same arithmetic as `lat_bucket` in the BPF sampler.
    pub fn bucket_of(ns: u64) -> usize {
        if ns < 4 {
            return ns as usize;
        }
        let k = 63 - ns.leading_zeros() as usize;
        (4 * (k - 1) + ((ns >> (k - 2)) & 3) as usize).min(LATENCY_BUCKETS - 1)
    }

    /// Lower bound of bucket `i` in ns (`i` may be `LATENCY_BUCKETS`: the last bucket's
    /// nominal upper bound).
    pub fn bucket_floor_ns(i: usize) -> u64 {
        if i < 4 {
            i as u64
        } else {
            ((4 + (i % 4)) as u64) << (i / 4 - 1)
        }
    }

    pub fn record(&mut self, ns: u64) {
        self.buckets[Self::bucket_of(ns)] += 1;
        self.count += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        self.count += other.count;
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
    }

    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / self.count as f64)
    }

    /// Every count and the sum multiplied by `num / den` (rounded): what wake-ups measured in
    /// `den` ns of a period stand for over its `num` ns. Quantiles do not change.
    pub fn scaled(&self, num: u64, den: u64) -> LatencyHistogram {
        let scale = |x: u64| scale_count(x, num, den);
        let mut h = self.clone();
        for b in h.buckets.iter_mut() {
            *b = scale(*b);
        }
        h.count = h.buckets.iter().sum();
        h.sum_ns = scale(self.sum_ns);
        h
    }

    /// How many of the recorded values are at most `ns`, interpolated linearly inside the
    /// bucket `ns` falls in.
    pub fn count_at_most(&self, ns: u64) -> f64 {
        let b = Self::bucket_of(ns);
        let below: u64 = self.buckets[..b].iter().sum();
        let (lo, hi) = (Self::bucket_floor_ns(b), Self::bucket_floor_ns(b + 1));
        let part = if hi > lo {
            (ns.saturating_sub(lo) + 1).min(hi - lo) as f64 / (hi - lo) as f64
        } else {
            1.0
        };
        below as f64 + part * self.buckets[b] as f64
    }

    /// The `q` quantile (0..=1), interpolated linearly inside its bucket; `None` when empty.
    /// Within the bucket's width (at most 25 %) of the truth.
    pub fn quantile_ns(&self, q: f64) -> Option<f64> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
        let mut seen = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if (seen + n) as f64 >= rank {
                let lo = Self::bucket_floor_ns(i) as f64;
                let hi = Self::bucket_floor_ns(i + 1) as f64;
                let frac = (rank - seen as f64) / n as f64;
                return Some(lo + frac * (hi - lo));
            }
            seen += n;
        }
        None
    }
}

/// What the wakee's vCPU was doing at the moment of the wake-up: the rows of the paper's
/// Table 2, measured on the user's own program.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeLatencies {
    /// The target vCPU was running something (or is the waker's own vCPU).
    pub running: LatencyHistogram,
    /// The target vCPU was idle in a polling state (cpuidle poll, or a retention thread).
    pub polling: LatencyHistogram,
    /// The target vCPU was halted: the blocked-waiter wakeup the paper is about.
    pub halted: LatencyHistogram,
    /// Of the `halted` wake-ups, those whose waker's vCPU went idle before the wakee ran: the
    /// waker had nothing left to do but wait, so the wake-up's whole latency lay on the
    /// workload's critical path (a ping-pong). Where the waker's vCPU ran on (a lock convoy
    /// that keeps other threads to run, a producer ahead of its consumer), the latency
    /// overlapped with work, and making it cheaper gains little. A wake-up with no waker on
    /// another vCPU (a timer or other interrupt on the halted vCPU itself) counts too: nobody
    /// runs on while it waits. Zero in samples from an older Gleaner, which did not count it.
    #[serde(default)]
    pub halted_waited: u64,
    /// Of the `halted_waited` wake-ups, those whose waker was a thread on another vCPU (not
    /// a timer or other interrupt on the halted vCPU itself): hand-offs, which packing waker
    /// and wakee onto one vCPU turns into a switch on that vCPU. Zero in samples from an
    /// older Gleaner, which did not count it.
    #[serde(default)]
    pub halted_hand_offs: u64,
    /// Of the `polling` and `halted` wake-ups, how long the wakee's vCPU had been idle when
    /// the wake-up came: a hold of `h` would have caught those younger than `h`. The idle
    /// periods' own lengths cannot say it: a halted vCPU's idle period lasts until the host
    /// runs it again, so its length holds the very wake-up latency a hold removes (in the
    /// simulator's fig7 no idle period was shorter than 85 us, while most wake-ups came
    /// within 20 us of the halt). Empty in samples from an older Gleaner.
    #[serde(default)]
    pub idle_age: LatencyHistogram,
}

/// `x * num / den`, rounded to nearest, without overflow: a count measured over `den` ns
/// standing for `num` ns.
fn scale_count(x: u64, num: u64, den: u64) -> u64 {
    let den = den.max(1) as u128;
    ((x as u128 * num as u128 + den / 2) / den).min(u64::MAX as u128) as u64
}

impl WakeLatencies {
    pub fn merge(&mut self, other: &WakeLatencies) {
        self.running.merge(&other.running);
        self.polling.merge(&other.polling);
        self.halted.merge(&other.halted);
        self.halted_waited += other.halted_waited;
        self.halted_hand_offs += other.halted_hand_offs;
        self.idle_age.merge(&other.idle_age);
    }

    pub fn total_count(&self) -> u64 {
        self.running.count + self.polling.count + self.halted.count
    }

    /// See [`LatencyHistogram::scaled`].
    pub fn scaled(&self, num: u64, den: u64) -> WakeLatencies {
        WakeLatencies {
            running: self.running.scaled(num, den),
            polling: self.polling.scaled(num, den),
            halted: self.halted.scaled(num, den),
            halted_waited: scale_count(self.halted_waited, num, den),
            halted_hand_offs: scale_count(self.halted_hand_offs, num, den),
            idle_age: self.idle_age.scaled(num, den),
        }
    }
}

#[cfg(test)]
mod latency_tests {
    use super::*;

    #[test]
    fn counts_at_most_a_value_interpolating_inside_its_bucket() {
        let mut h = LatencyHistogram::default();
        // Bucket 44 is [4096, 5120) ns, bucket 48 [8192, 10240).
        for ns in [1_000, 4_500, 4_500, 9_000] {
            h.record(ns);
        }
        assert_eq!(h.count_at_most(0), 0.0);
        assert_eq!(h.count_at_most(2_000), 1.0);
        // 4,095 ns: everything below bucket 44, none of it.
        assert_eq!(h.count_at_most(4_095), 1.0);
        // Half-way through bucket 44: half its two values.
        assert!((h.count_at_most(4_607) - 2.0).abs() < 1e-9);
        assert_eq!(h.count_at_most(5_119), 3.0);
        assert_eq!(h.count_at_most(1_000_000), 4.0);
        assert_eq!(LatencyHistogram::default().count_at_most(5_000), 0.0);
    }

    #[test]
    fn a_windowed_sample_scales_to_the_period_without_moving_quantiles() {
        let mut h = LatencyHistogram::default();
        for ns in [2_000, 3_000, 20_000, 40_000] {
            h.record(ns);
        }
        let w = WakeLatencies {
            halted: h.clone(),
            halted_waited: 3,
            ..WakeLatencies::default()
        };
        // Measured over 20 ms of a 100 ms period: five times as many wake-ups.
        let s = w.scaled(100, 20);
        assert_eq!(s.halted.count, 20);
        assert_eq!(s.halted.sum_ns, h.sum_ns * 5);
        assert_eq!(s.halted.quantile_ns(0.5), h.quantile_ns(0.5));
        assert_eq!(s.running.count, 0);
        assert_eq!(s.halted_waited, 15);
        assert_eq!(w.scaled(7, 7), w);
    }

    #[test]
    fn buckets_are_quarter_octaves_and_quantiles_land_in_the_right_bucket() {
        let b = LatencyHistogram::bucket_of;
        let floor = LatencyHistogram::bucket_floor_ns;
        assert_eq!(
            (b(0), b(3), b(4), b(7), b(8), b(9), b(10)),
            (0, 3, 4, 7, 8, 8, 9)
        );
        // An octave in four: 1024..1279, 1280..1535, 1536..1791, 1792..2047.
        assert_eq!(
            (b(1023), b(1024), b(1279), b(1280), b(2047)),
            (35, 36, 36, 37, 39)
        );
        assert_eq!(b(u64::MAX), LATENCY_BUCKETS - 1);
        for i in 0..LATENCY_BUCKETS {
            assert_eq!(b(floor(i)), i, "bucket {i}");
            assert_eq!(b(floor(i + 1) - 1), i, "bucket {i}");
            // No bucket is wider than a quarter of its floor (from 4 ns on).
            if i >= 4 {
                assert!(4 * (floor(i + 1) - floor(i)) <= floor(i), "bucket {i}");
            }
        }
        let mut h = LatencyHistogram::default();
        for _ in 0..90 {
            h.record(5_000);
        }
        for _ in 0..10 {
            h.record(80_000);
        }
        let p50 = h.quantile_ns(0.5).unwrap();
        assert!(
            (4096.0..5120.0).contains(&p50) || (5120.0..6144.0).contains(&p50),
            "{p50}"
        );
        assert!((p50 / 5_000.0 - 1.0).abs() <= 0.25, "{p50}");
        let p99 = h.quantile_ns(0.99).unwrap();
        assert!((p99 / 80_000.0 - 1.0).abs() <= 0.25, "{p99}");
        assert_eq!(h.count, 100);
        assert_eq!(h.mean_ns().unwrap(), 12_500.0);
        assert!(LatencyHistogram::default().quantile_ns(0.5).is_none());
    }

    /// Timelines and status files keep the buckets as a list of 128; one written with a
    /// bucket per power of two (32) still reads, each count at its power of two.
    #[test]
    fn buckets_round_trip_as_a_list_and_old_log2_lists_still_read() {
        let mut h = LatencyHistogram::default();
        h.record(1_500);
        h.record(20_000);
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<LatencyHistogram>(&json).unwrap(), h);
        let mut old = vec![0u64; 32];
        old[10] = 3; // [1024, 2048) ns
        let text = format!(r#"{{"buckets":{old:?},"count":3,"sum_ns":4500}}"#);
        let read: LatencyHistogram = serde_json::from_str(&text).unwrap();
        assert_eq!(read.buckets[LatencyHistogram::bucket_of(1024)], 3);
        assert_eq!(read.buckets.iter().sum::<u64>(), 3);
        let err =
            serde_json::from_str::<LatencyHistogram>(r#"{"buckets":[1,2],"count":3,"sum_ns":0}"#)
                .unwrap_err();
        assert!(err.to_string().contains("128 buckets"), "{err}");
    }
}

/// The paper's workload characteristics (§5, §6), averaged over the active vCPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Characteristics {
    /// l_comp: computation on a vCPU between two idle periods, T_work / S_yield.
    pub l_comp_ns: f64,
    /// g_comp: computation in a thread between two synchronization points, T_work / S_work.
    pub g_comp_ns: f64,
    /// l_idle: average length of an idle period, T_idle / S_yield.
    pub l_idle_ns: f64,
    /// Workload utilization of the busiest active vCPU, 0..=1, of the time it ran: the period
    /// less its steal.
    pub max_vcpu_util: f64,
    /// Workload utilization summed over active vCPUs (1.0 = one vCPU's worth).
    pub total_util: f64,
    /// Idle periods per second per active vCPU.
    pub idle_periods_per_sec: f64,
    /// Steal as a fraction of the period, averaged over active vCPUs.
    pub steal_fraction: f64,
    /// Fraction of the period some workload thread waited for a CPU (0 if unknown).
    pub runnable_wait_fraction: f64,
    /// Per idle period, the active vCPUs' time that was neither the workload's, nor idle,
    /// nor stolen, up to what the measured halted wake-ups' latency adds up to: the kernel's
    /// path out of idle to a woken thread (the IPI, the exit from idle, the switch), which a
    /// vCPU spends busy but not on the workload, and which packing threads that take turns
    /// onto one vCPU turns into a plain switch (`characteristics::characterize`). 0 where no
    /// wake-ups were measured (the procfs sampler) or nothing else ran.
    #[serde(default)]
    pub l_wake_path_ns: f64,
}

impl Characteristics {
    /// How long the workload waits on an active vCPU per idle period, as packing sees it: the
    /// idle period itself plus the wake-up path out of it ([`Self::l_wake_path_ns`]). §5's
    /// conditions compare l_comp and g_comp with it.
    pub fn l_wait_ns(&self) -> f64 {
        self.l_idle_ns + self.l_wake_path_ns
    }
}

/// How much the workload got done in a period, per second: the signal a change is judged by.
///
/// The application's own count when it gives one (`progress`, in its units per second).
/// Otherwise the workload's run time per second (its utilization in ns/s). Utilization
/// overstates work where wake-ups are dear (a woken thread's switch-in counts as its run time),
/// so it can fall when a consolidation removes that overhead; the policy lab measures how
/// well it still ranks settings by throughput (`gleaner sim lab`, "corr." columns). An
/// estimate that subtracted wake costs taken from the wake-latency histograms ranked them
/// worse there (rank correlation 0.40–0.48 against 0.98), so it is not used.
impl PeriodSample {
    /// The workload's run time in the period, summed over its vCPUs.
    pub fn work_ns(&self) -> u64 {
        self.vcpus.iter().map(|v| v.work_ns).sum()
    }
}

pub fn progress_signal(sample: &PeriodSample) -> f64 {
    let secs = sample.period_ns.max(1) as f64 / 1e9;
    if let Some(p) = sample.progress {
        return p as f64 / secs;
    }
    sample.work_ns() as f64 / secs
}

#[cfg(test)]
mod signal_tests {
    use super::*;

    #[test]
    fn progress_wins_over_utilization_when_given() {
        let mut s = PeriodSample {
            period_ns: 100_000_000,
            vcpus: vec![VcpuSample {
                cpu: 0,
                work_ns: 50_000_000,
                ..VcpuSample::default()
            }],
            ..PeriodSample::default()
        };
        assert_eq!(progress_signal(&s), 5e8);
        s.progress = Some(1_234);
        assert_eq!(progress_signal(&s), 12_340.0);
    }
}
