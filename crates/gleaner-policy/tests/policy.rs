//! Replays the paper's §5 examples and rules against the public policy API.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

use gleaner_policy::*;
use proptest::prelude::*;

const T: u64 = 1_000_000; // the paper's unit of time t, here 1 ms

/// A period where each active vCPU computes `comp` then idles `idle`, `cycles` times, and each
/// thread switches every `g` of computation. vCPUs outside `active` are empty.
fn sample(active: &Cpuset, all: usize, comp: u64, idle: u64, g: u64, cycles: u64) -> PeriodSample {
    let period = (comp + idle) * cycles;
    let vcpus: Vec<VcpuSample> = (0..all)
        .map(|cpu| {
            if active.contains(cpu) {
                VcpuSample {
                    cpu,
                    work_ns: comp * cycles,
                    idle_ns: idle * cycles,
                    idle_entries: cycles,
                    ..Default::default()
                }
            } else {
                VcpuSample {
                    cpu,
                    idle_ns: period,
                    idle_entries: 1,
                    ..Default::default()
                }
            }
        })
        .collect();
    let work: u64 = vcpus.iter().map(|v| v.work_ns).sum();
    PeriodSample {
        period_ns: period,
        vcpus,
        work_switches: work / g,
        work_threads: all as u64,
        work_runnable_wait_ns: Some(0),
        wake_latency: None,
        progress: None,
        stale_rates: false,
        rates_from: Default::default(),
    }
}

/// `s` with wake-ups measured: `running` and `halted` are (how many, each one's latency in ns).
fn with_wake_latencies(
    mut s: PeriodSample,
    running: (u64, u64),
    halted: (u64, u64),
) -> PeriodSample {
    let mut w = WakeLatencies::default();
    for _ in 0..running.0 {
        w.running.record(running.1);
    }
    for _ in 0..halted.0 {
        w.halted.record(halted.1);
    }
    s.wake_latency = Some(w);
    s
}

/// The same total work as `sample(all vCPUs, ...)` spread over the `active` vCPUs only, as
/// after a consolidation that kept the workload's pace.
fn spread(active: &Cpuset, all: usize, comp: u64, idle: u64, g: u64, cycles: u64) -> PeriodSample {
    let mut s = sample(&Cpuset::first_n(all), all, comp, idle, g, cycles);
    let total: u64 = s.vcpus.iter().map(|v| v.work_ns).sum();
    let per = total / active.len() as u64;
    for v in &mut s.vcpus {
        if active.contains(v.cpu) {
            v.work_ns = per.min(s.period_ns);
            v.idle_ns = s.period_ns - v.work_ns;
        } else {
            v.work_ns = 0;
            v.idle_ns = s.period_ns;
            v.idle_entries = 1;
        }
    }
    s
}

/// `s` with every vCPU's work scaled by `up` in even periods `i` and by `down` in odd ones: a
/// workload whose utilization swings on its own.
fn swing(mut s: PeriodSample, i: u32, up: f64, down: f64) -> PeriodSample {
    let f = if i.is_multiple_of(2) { up } else { down };
    for v in &mut s.vcpus {
        v.work_ns = (v.work_ns as f64 * f) as u64;
    }
    s
}

/// Two vCPUs with 100 µs of work then 300 µs idle, 250 times a period each (2,500 idle
/// periods/s per vCPU); 100 wake-ups of a running vCPU at 11 µs and 500 of a halted one at
/// `halted_ns`, each waited for; idle period i of 500 ends within 8 µs of its halt where
/// `young(i)`, else after 200 µs: a workload a hold can catch, to the share `young` gives.
fn holdable(active: &Cpuset, halted_ns: u64, young: impl Fn(u64) -> bool) -> PeriodSample {
    let mut s = with_wake_latencies(
        sample(active, 2, 100_000, 300_000, 100_000, 250),
        (100, 11_000),
        (500, halted_ns),
    );
    let w = s.wake_latency.as_mut().unwrap();
    w.halted_waited = 500;
    for i in 0..500 {
        w.idle_age.record(if young(i) { 8_000 } else { 200_000 });
    }
    s
}

/// Consolidation alone with the shipped settling and warm-up (unlike `consolidation_only`).
fn consolidation_with_defaults(vcpus: usize) -> Gleaner {
    Gleaner::new(
        PolicyConfig {
            mode: Mode::Consolidation,
            ..Default::default()
        },
        Cpuset::first_n(vcpus),
    )
    .unwrap()
}

fn consolidation_only() -> PolicyConfig {
    PolicyConfig {
        mode: Mode::Consolidation,
        settle_periods: 1,
        warmup_periods: 0,
        ..Default::default()
    }
}

#[test]
fn figure_4a_consolidates_one_vcpu() {
    // 4(a): l_comp = 2t, g_comp = t, l_idle = t on three vCPUs; rho = eta = 1.
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    let d = g.step(&sample(&Cpuset::first_n(3), 3, 2 * T, T, T, 10));
    assert_eq!(d.active.len(), 2, "{:?}", d.events);
    assert!(matches!(d.events[0].kind, EventKind::Deactivate { cpu: 2 }));
}

#[test]
fn figure_4b_does_not_consolidate() {
    // 4(b): condition (1) holds (l_comp = 2t, l_idle = t) but g_comp = 2t > eta x l_idle.
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    for _ in 0..5 {
        let d = g.step(&sample(&Cpuset::first_n(3), 3, 2 * T, T, 2 * T, 10));
        assert_eq!(d.active.len(), 3);
        assert!(d.events.is_empty());
    }
}

#[test]
fn min_time_slice_bounds_the_granularity() {
    // Long idle periods would allow anything, but 5 ms grains exceed the 3 ms slice.
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(2)).unwrap();
    let d = g.step(&sample(&Cpuset::first_n(2), 2, 5 * T, 50 * T, 5 * T, 4));
    assert_eq!(d.active.len(), 2);
}

/// Feeds `n` periods built by `make(active set)`; returns every decision.
fn drive(g: &mut Gleaner, n: usize, make: impl Fn(&Cpuset) -> PeriodSample) -> Vec<Decision> {
    let mut out: Vec<Decision> = Vec::new();
    for _ in 0..n {
        let active = out
            .last()
            .map_or_else(|| g.active().clone(), |d| d.active.clone());
        out.push(g.step(&make(&active)));
    }
    out
}

fn events(ds: &[Decision]) -> Vec<EventKind> {
    ds.iter()
        .flat_map(|d| d.events.iter().map(|e| e.kind.clone()))
        .collect()
}

/// Whether any of the decisions' events is one `pred` looks for.
fn has_event(ds: &[Decision], pred: impl Fn(&EventKind) -> bool) -> bool {
    ds.iter().flat_map(|d| &d.events).any(|e| pred(&e.kind))
}

#[test]
fn rollback_restores_the_last_vcpu_and_lowers_rho() {
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    let all = Cpuset::first_n(3);
    let d = g.step(&sample(&all, 3, 2 * T, T, T, 10));
    assert_eq!(d.active.to_string(), "0-1");
    // The workload slowed down: utilization drops from 2.0 to 1.2, no vCPU saturated. One
    // settling period, then three periods of evidence.
    let ds = drive(&mut g, 4, |a| sample(a, 3, 3 * T, 2 * T, T, 10));
    assert!(
        ds[..3].iter().all(|d| d.active.len() == 2),
        "judged too early: {:?}",
        events(&ds)
    );
    let d = ds.last().unwrap();
    assert_eq!(d.active, all, "{:?}", d.events);
    assert!(matches!(d.events[0].kind, EventKind::Rollback { cpu: 2 }));
    // rho = 0.9 x min(1, l_comp / ((N-1) l_idle)) with the before-values 2t / (2 x t) = 1.
    assert!((d.rho - 0.9).abs() < 1e-9, "rho {}", d.rho);
    assert_eq!(d.eta, 1.0);
}

#[test]
fn rollback_on_a_saturated_vcpu_lowers_eta() {
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    let all = Cpuset::first_n(3);
    g.step(&sample(&all, 3, 2 * T, T, T, 10));
    // Now one active vCPU is 100 % busy and the total fell: Figure 4(b)'s overload.
    let ds = drive(&mut g, 4, |a| {
        let mut s = sample(a, 3, 2 * T, T, T, 10);
        s.vcpus[0].work_ns = s.period_ns;
        s.vcpus[0].idle_ns = 0;
        s.vcpus[1].work_ns = s.period_ns / 4;
        s
    });
    let d = ds.last().unwrap();
    assert!(
        matches!(d.events[0].kind, EventKind::Rollback { cpu: 2 }),
        "{:?}",
        events(&ds)
    );
    // eta = 0.9 x min(1, g_comp / l_idle) = 0.9 x min(1, t / t).
    assert!((d.eta - 0.9).abs() < 1e-9, "eta {}", d.eta);
    assert_eq!(d.rho, 1.0);
}

/// `scenarios/fig7-dedup-matmul.toml`, seed 7 (5b9ab1c): at 4 vCPUs a step to 3 was undone
/// (utilization -42 %), and eight periods later taken again on one period whose utilization
/// read 1.42 against 1.6-2.0 around it: its l_comp / l_wait was within rho x (n - 1), the
/// quiet periods' was not. The VM then spent the minute's last 42 periods at 2-3 vCPUs.
#[test]
fn one_light_period_does_not_carry_a_step_the_quiet_periods_around_it_refuse() {
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    // l_comp / l_idle 2.2 against rho x (n - 1) = 2: refused, period after period.
    let heavy = |a: &Cpuset| sample(a, 3, 22 * T / 10, T, T / 10, 10);
    let ds = drive(&mut g, 6, heavy);
    assert!(events(&ds).is_empty(), "{:?}", events(&ds));
    // One period at 1.9: within the limit by itself, and no major change (-5 % utilization).
    let d = g.step(&sample(&Cpuset::first_n(3), 3, 19 * T / 10, T, T / 10, 10));
    assert_eq!(d.active.len(), 3, "{:?}", d.events);
    // A workload that stays at 1.9 is consolidated once the quiet periods show it.
    let light = |a: &Cpuset| spread(a, 3, 19 * T / 10, T, T / 10, 10);
    let ds = drive(&mut g, 10, light);
    assert!(
        has_event(&ds, |e| matches!(e, EventKind::Deactivate { .. })),
        "{:?}",
        events(&ds)
    );
}

/// Policy lab, draw 12, pipeline-20us-4v-2:1-cfs (f346618): utilization at 4 vCPUs ran 1.35,
/// 1.35, 2.17, 1.24; the one period at 2.17 reset the reference and every quiet window, and a
/// 4 -> 2 step taken on the period after it, judged against that period alone, was kept:
/// -16.5 % against `none`. A swing that is gone the next period changes nothing: the quiet
/// periods before it still refuse a step that one light period alone would carry.
#[test]
fn a_one_period_swing_of_utilization_does_not_erase_the_quiet_periods_before_it() {
    let all = Cpuset::first_n(3);
    let heavy = |a: &Cpuset| sample(a, 3, 22 * T / 10, T, T / 10, 10);
    let light = |a: &Cpuset| sample(a, 3, 19 * T / 10, T, T / 10, 10);
    // Utilization x1.6 for one period, with the heavy load: a major change by itself.
    let spike = |a: &Cpuset| {
        let mut s = heavy(a);
        for v in &mut s.vcpus {
            v.work_ns = v.work_ns * 16 / 10;
        }
        s
    };
    let run = |spiked: bool| {
        let mut g = Gleaner::new(consolidation_only(), all.clone()).unwrap();
        let mut ds = drive(&mut g, 6, heavy);
        if spiked {
            ds.extend(drive(&mut g, 1, spike));
        }
        assert!(events(&ds).is_empty(), "{:?}", events(&ds));
        // Back within 5 % of the heavy periods' utilization, one light period.
        g.step(&light(&all))
    };
    assert_eq!(
        run(false).active,
        all,
        "one light period refused by the quiet ones"
    );
    let d = run(true);
    assert_eq!(
        d.active, all,
        "after a one-period swing too: {:?}",
        d.events
    );
}

/// `scenarios/fig7-dedup-matmul.toml`, seed 2 (6e02f52): dedup walked down to 3 of 16 vCPUs;
/// the step to 2 saturated a vCPU and its rollback set eta to 0.016 (g_comp over the 1.4 ms
/// idle periods of 3 vCPUs). A major change then brought all 16 back, whose 275 us idle
/// periods could never again satisfy the granularity condition: the VM stayed at 16 for the
/// last third of the run. What a rollback taught the factors was learned on the consolidated
/// set the major change has just undone.
#[test]
fn a_major_change_that_undoes_a_consolidation_forgets_what_its_rollbacks_taught() {
    let n = 4;
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(n)).unwrap();
    let all = Cpuset::first_n(n);
    // Fine grain (g_comp = t/10): 3 vCPUs keep the pace of 4; on 2 one vCPU is saturated and
    // the workload slows.
    let before = |a: &Cpuset| {
        if a.len() >= 3 {
            spread(a, n, T, 3 * T / 2, T / 10, 10)
        } else {
            let mut s = spread(a, n, T, 3 * T / 2, T / 10, 10);
            s.vcpus[0].work_ns = s.period_ns;
            s.vcpus[0].idle_ns = 0;
            s.vcpus[1].work_ns = s.period_ns / 4;
            s.vcpus[1].idle_ns = s.period_ns - s.vcpus[1].work_ns;
            s
        }
    };
    let ds = drive(&mut g, 20, before);
    let d = ds.last().unwrap();
    assert!(
        has_event(&ds, |e| matches!(e, EventKind::Rollback { .. })) && d.active.len() == 3,
        "{} {:?}",
        d.active,
        events(&ds)
    );
    assert!(d.eta < 0.1, "eta {}", d.eta);
    // A different program: a fifth more work, g_comp = t/2 against t of idle on 4 vCPUs.
    // eta 0.08 would refuse it (t/2 > 0.08 t); the configured eta of 1 takes the step.
    let ds = drive(&mut g, 12, |a| spread(a, n, T, T, T / 2, 10));
    assert!(
        has_event(&ds, |e| matches!(e, EventKind::MajorChange)),
        "{:?}",
        events(&ds)
    );
    let after_change = ds
        .iter()
        .position(|d| d.active == all)
        .expect("the major change reactivates every vCPU");
    assert!(
        has_event(&ds[after_change..], |e| matches!(
            e,
            EventKind::Deactivate { .. }
        )),
        "no step after the major change: {:?} (eta {})",
        events(&ds),
        ds.last().unwrap().eta
    );
}

/// The case the policy lab and issue 16 found: a consolidation removes wake-up overhead that
/// the guest counted as run time, so utilization *falls* (here 8 %) while the application
/// completes more (here 10 %). The utilization judge rolled such consolidations back; told
/// the application's progress, the policy keeps them.
#[test]
fn a_consolidation_that_lowers_utilization_but_raises_progress_is_kept() {
    let all = Cpuset::first_n(4);
    let run = |with_progress: bool| {
        let mut g = Gleaner::new(consolidation_only(), all.clone()).unwrap();
        let progress = |p: u64| if with_progress { Some(p) } else { None };
        let mut first = sample(&all, 4, 2 * T, T, T, 10);
        first.progress = progress(1_000);
        let d = g.step(&first);
        assert_eq!(d.active.len(), 3, "{:?}", d.events);
        drive(&mut g, 4, |a| {
            let mut s = spread(a, 4, 2 * T, T, T, 10);
            for v in &mut s.vcpus {
                v.work_ns = v.work_ns * 92 / 100;
                v.idle_ns = s.period_ns - v.work_ns;
            }
            s.progress = progress(1_100);
            s
        })
    };
    let told = run(true);
    assert!(
        told.iter().all(|d| d.active.len() == 3),
        "rolled back: {:?}",
        events(&told)
    );
    let blind = run(false);
    assert!(
        has_event(&blind, |e| matches!(e, EventKind::Rollback { .. })),
        "without progress the 8 % utilization drop is judged a slowdown: {:?}",
        events(&blind)
    );
}

/// `gleaner run --progress-file` on the `none` guest (bench/progress_judge.py): the ping-pong
/// packed on one vCPU ran 275,000 round trips/s in one period and 205,000 in a later one, the
/// host's doing, its utilization steady at one busy vCPU, and the count's 25 % fall was taken
/// for a new program: every vCPU came back for half a second. The count judges trials; whether
/// the program changed is read from its utilization.
#[test]
fn a_count_that_moves_with_the_host_is_no_major_change_but_a_change_of_utilization_is() {
    let all = Cpuset::first_n(4);
    let run = |count_after: u64, work_after: u64| {
        let mut g = Gleaner::new(consolidation_only(), all.clone()).unwrap();
        let mut first = sample(&all, 4, 2 * T, T, T, 10);
        first.progress = Some(1_000);
        let d = g.step(&first);
        assert_eq!(d.active.len(), 3, "{:?}", d.events);
        // Accepted: the count and the work hold.
        let ds = drive(&mut g, 6, |a| {
            let mut s = spread(a, 4, 2 * T, T, T, 10);
            s.progress = Some(1_000);
            s
        });
        assert!(ds.iter().all(|d| d.active.len() == 3), "{:?}", events(&ds));
        // Then the count falls by `count_after`/1000 while the work per vCPU becomes
        // `work_after` % of what it was.
        drive(&mut g, 3, |a| {
            let mut s = spread(a, 4, 2 * T, T, T, 10);
            for v in s.vcpus.iter_mut().filter(|v| a.contains(v.cpu)) {
                v.work_ns = v.work_ns * work_after / 100;
                v.idle_ns = s.period_ns - v.work_ns;
            }
            s.progress = Some(count_after);
            s
        })
    };
    let host_busier = run(700, 100);
    assert!(
        !has_event(&host_busier, |e| matches!(e, EventKind::MajorChange)),
        "{:?}",
        events(&host_busier)
    );
    let new_program = run(1_000, 40);
    assert!(
        has_event(&new_program, |e| matches!(e, EventKind::MajorChange)),
        "{:?}",
        events(&new_program)
    );
}

#[test]
fn noise_alone_does_not_roll_back() {
    // Utilization swings +-10 % from period to period on its own; after consolidation it keeps
    // swinging the same way around the same mean. A 5 % threshold on single periods would
    // roll back; judging three periods against twice the measured noise does not.
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    // Conditions fail first (g_comp too coarse) so the noise is learnt before any change.
    for i in 0..8 {
        let s = swing(
            sample(&Cpuset::first_n(3), 3, 2 * T, T, 2 * T, 10),
            i,
            1.1,
            0.9,
        );
        assert!(g.step(&s).events.is_empty());
    }
    let mut all = vec![];
    for i in 0..12 {
        let active = g.active().clone();
        let s = if active.len() == 3 {
            sample(&active, 3, 2 * T, T, T, 10)
        } else {
            spread(&active, 3, 2 * T, T, T, 10)
        };
        all.push(g.step(&swing(s, i + 1, 1.1, 0.9)));
    }
    assert!(
        has_event(&all, |e| matches!(e, EventKind::Deactivate { .. })),
        "{:?}",
        events(&all)
    );
    assert!(
        !has_event(&all, |e| matches!(e, EventKind::Rollback { .. })),
        "{:?}",
        events(&all)
    );
}

/// A workload whose utilization swings by `swing_by` (0.2: +-20 %) a period on its own, as
/// `scenarios/fig7-dedup-matmul.toml`'s dedup VM does, consolidated as soon as its grain
/// allows; under the step it does `kept` of its work. Returns the decisions from the step on.
fn noisy_step(swing_by: f64, kept: f64, periods: u32) -> Vec<Decision> {
    let (up, down) = (1.0 + swing_by, 1.0 - swing_by);
    // Nine warm-up periods: eight quiet ones before the step, the noise learnt from them.
    let cfg = PolicyConfig {
        warmup_periods: 9,
        ..consolidation_only()
    };
    let mut g = Gleaner::new(cfg, Cpuset::first_n(3)).unwrap();
    let mut out = Vec::new();
    for i in 0..periods {
        let active = g.active().clone();
        let mut s = if active.len() == 3 {
            sample(&active, 3, 2 * T, T, T, 10)
        } else {
            let mut s = spread(&active, 3, 2 * T, T, T, 10);
            for v in &mut s.vcpus {
                v.work_ns = (v.work_ns as f64 * kept) as u64;
                v.idle_ns = s.period_ns - v.work_ns;
            }
            s
        };
        s = swing(s, i + 1, up, down);
        let d = g.step(&s);
        if !out.is_empty() || !d.events.is_empty() {
            out.push(d);
        }
    }
    // The first decision kept is the step itself.
    assert!(
        has_event(&out[..out.len().min(1)], |e| matches!(
            e,
            EventKind::Deactivate { .. }
        )),
        "no step: {:?}",
        events(&out)
    );
    out
}

/// `scenarios/fig7-dedup-matmul.toml`, seed 4 (8ec899e): the dedup VM's utilization swings
/// +-20 % a period, and steps 4 -> 3 -> 2 vCPUs that cost it 7 % each were kept on three
/// periods whose 15 % drop the test could not call against that noise. A verdict that shows
/// neither a loss nor its absence measures on. Here a 15 % loss under a +-15 % swing: the three
/// periods after the step read 19 % below the eight before, not called against their spread;
/// the fifth period (17.5 % below) calls it.
#[test]
fn a_loss_the_noise_hides_from_three_periods_is_measured_until_it_shows() {
    let ds = noisy_step(0.15, 0.85, 30);
    let undone = ds.iter().position(|d| {
        d.events
            .iter()
            .any(|e| matches!(e.kind, EventKind::Rollback { .. }))
    });
    // Undone, and only after more than the usual three periods of evidence (plus settling).
    assert!(
        matches!(undone, Some(p) if p > 4),
        "{undone:?}: {:?}",
        events(&ds)
    );
    assert_eq!(ds.last().unwrap().active.len(), 3);
}

/// A step that costs nothing under a +-20 % swing: measured on to the tenth period (its loss's
/// upper bound stays over the 5 % threshold), then kept.
#[test]
fn a_step_the_noise_leaves_undecided_is_kept_when_it_costs_nothing() {
    let ds = noisy_step(0.2, 1.0, 30);
    assert!(
        !has_event(&ds, |e| matches!(e, EventKind::Rollback { .. })),
        "{:?}",
        events(&ds)
    );
    assert_eq!(ds.last().unwrap().active.len(), 2, "{:?}", events(&ds));
}

/// `scenarios/fig7-dedup-matmul.toml`, seed 6 (1e12d0e): a 16 -> 8 vCPU step taken on two
/// start-up periods, which the static runs say costs dedup nothing, was undone on a 16 % drop
/// over its three judged periods while the four after the step swung 1.6-2.9: with the noise
/// not yet known, any drop over the fixed 5 % threshold undid it. Here a step that costs
/// nothing, taken on the first period the warm-up leaves, whose first three judged periods
/// happen to read 12 % low and spread 14 %: not a loss they can tell from their own swing, so
/// the step is measured on, and kept once the later periods come back up.
#[test]
fn a_drop_against_a_start_up_baseline_within_the_spread_after_it_does_not_undo_the_step() {
    let mut g = Gleaner::new(
        PolicyConfig {
            warmup_periods: 2,
            ..consolidation_only()
        },
        Cpuset::first_n(3),
    )
    .unwrap();
    // Per period after the step: one settling period, three low ones, then the workload's
    // own level around 1.
    let after = [
        1.0, 0.8, 1.05, 0.8, 1.2, 1.1, 0.9, 1.15, 1.0, 1.05, 0.95, 1.1, 0.9, 1.0, 1.05,
    ];
    let mut ds: Vec<Decision> = Vec::new();
    let mut stepped_at = None;
    for i in 0..40usize {
        let active = g.active().clone();
        let mut s = if active.len() == 3 {
            sample(&active, 3, 2 * T, T, T, 10)
        } else {
            spread(&active, 3, 2 * T, T, T, 10)
        };
        if let Some(at) = stepped_at {
            let f = after.get(i - at - 1).copied().unwrap_or(1.0);
            for v in &mut s.vcpus {
                v.work_ns = (v.work_ns as f64 * f) as u64;
                v.idle_ns = s.period_ns.saturating_sub(v.work_ns);
            }
        }
        let d = g.step(&s);
        if stepped_at.is_none()
            && has_event(std::slice::from_ref(&d), |e| {
                matches!(e, EventKind::Deactivate { .. })
            })
        {
            stepped_at = Some(i);
        }
        ds.push(d);
    }
    // The step is taken as soon as the warm-up allows, on a baseline of at most two periods.
    assert!(
        matches!(stepped_at, Some(p) if p <= 3),
        "{stepped_at:?}: {:?}",
        events(&ds)
    );
    assert!(
        !has_event(&ds, |e| matches!(e, EventKind::Rollback { .. })),
        "{:?}",
        events(&ds)
    );
    assert_eq!(ds.last().unwrap().active.len(), 2, "{:?}", events(&ds));
}

/// Lab draw 8, phase-threads-70us-4v-2:1: the workload's noise so far was large (a phase
/// swinging +-12 % a period), a phase change left one quiet period before the next step, and
/// the step cut utilization 20 % in three steady periods. Judged by twice the past noise alone,
/// it stayed (the benchmark VM 9 % below `none`); the periods after the step show their own
/// spread, against which the drop is clear.
#[test]
fn a_step_judged_on_one_period_before_it_is_undone_when_the_periods_after_show_a_clear_drop() {
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    let all = Cpuset::first_n(3);
    // A coarse phase (g_comp too large to consolidate) whose utilization swings +-12 %.
    for i in 0..8 {
        let s = swing(sample(&all, 3, 2 * T, T, 2 * T, 10), i, 1.12, 0.88);
        assert!(g.step(&s).events.is_empty());
    }
    // The grain falls 4x: a phase change (nothing to undo), then the step on the next period.
    let d = g.step(&sample(&all, 3, 2 * T, T, T / 2, 10));
    assert_eq!(d.active, all);
    let d = g.step(&sample(&all, 3, 2 * T, T, T / 2, 10));
    assert_eq!(d.active.len(), 2, "{:?}", d.events);
    // Under the step the workload does 20 % less, steadily.
    let ds = drive(&mut g, 4, |a| {
        let mut s = spread(a, 3, 2 * T, T, T / 2, 10);
        for v in &mut s.vcpus {
            v.work_ns = v.work_ns * 8 / 10;
            v.idle_ns = s.period_ns - v.work_ns;
        }
        s
    });
    assert!(
        has_event(&ds, |e| matches!(e, EventKind::Rollback { .. })),
        "{:?}",
        events(&ds)
    );
    assert_eq!(ds.last().unwrap().active, all);
}

#[test]
fn major_change_reactivates_all() {
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(4)).unwrap();
    let all = Cpuset::first_n(4);
    // Keep consolidating while the workload stays the same.
    let ds = drive(&mut g, 20, |a| spread(a, 4, T, 2 * T, T / 2, 10));
    assert!(ds.last().unwrap().active.len() < 4, "{:?}", events(&ds));
    // The workload becomes CPU-bound: every active vCPU busy.
    let ds = drive(&mut g, 2, |a| sample(a, 4, 10 * T, 0, 10 * T, 1));
    assert_eq!(ds.last().unwrap().active, all, "{:?}", events(&ds));
    assert!(has_event(&ds, |e| matches!(e, EventKind::MajorChange)));
}

/// `scenarios/fig7-dedup-matmul.toml` (seven of eight seeds on de564f4): dedup, consolidated
/// from 16 vCPUs to 4 over a minute of accepted steps, had its busiest vCPU at 90-100 % for a
/// period against 77-85 % when the set was accepted, with its utilization and grain unchanged,
/// and every vCPU came back. Now only the last accepted step does.
#[test]
fn a_busy_vcpu_undoes_the_last_step_not_the_consolidation() {
    let n = 8;
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(n)).unwrap();
    let ds = drive(&mut g, 60, |a| spread(a, n, 3 * T, 13 * T, T / 2, 10));
    let steps = ds
        .iter()
        .filter(|d| {
            d.events
                .iter()
                .any(|e| matches!(e.kind, EventKind::Deactivate { .. }))
        })
        .count();
    let before = ds.last().unwrap().active.clone();
    assert!(steps >= 2 && before.len() < n - 1, "{:?}", events(&ds));
    assert!(
        !has_event(&ds, |e| matches!(e, EventKind::Rollback { .. })),
        "{:?}",
        events(&ds)
    );
    // One period: the same work, but one active vCPU takes 95 % of the period.
    let mut s = spread(&before, n, 3 * T, 13 * T, T / 2, 10);
    let total: u64 = s.vcpus.iter().map(|v| v.work_ns).sum();
    let busy = s.period_ns * 95 / 100;
    let first = before.iter().next().unwrap();
    let rest = (total - busy) / (before.len() as u64 - 1);
    for v in &mut s.vcpus {
        if before.contains(v.cpu) {
            v.work_ns = if v.cpu == first { busy } else { rest };
            v.idle_ns = s.period_ns - v.work_ns;
        }
    }
    let d = g.step(&s);
    assert!(
        !d.events
            .iter()
            .any(|e| matches!(e.kind, EventKind::MajorChange)),
        "{:?}",
        d.events
    );
    assert!(
        d.events
            .iter()
            .any(|e| matches!(e.kind, EventKind::Rollback { .. })),
        "{:?}",
        d.events
    );
    assert!(
        d.active.len() > before.len() && d.active.len() < n,
        "{} -> {}: {:?}",
        before,
        d.active,
        d.events
    );
}

#[test]
fn granularity_change_is_a_major_change() {
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    let all = Cpuset::first_n(3);
    g.step(&sample(&all, 3, 2 * T, T, T, 10));
    // Settle and be judged harmless.
    let ds = drive(&mut g, 5, |a| spread(a, 3, 2 * T, T, T, 10));
    assert!(
        !has_event(&ds, |e| matches!(e, EventKind::Rollback { .. })),
        "{:?}",
        events(&ds)
    );
    assert_eq!(ds.last().unwrap().active.len(), 2);
    // Same utilization, but threads now switch 4x less often.
    let d4 = g.step(&spread(&ds.last().unwrap().active, 3, 2 * T, T, 4 * T, 10));
    assert!(
        d4.events
            .iter()
            .any(|e| matches!(e.kind, EventKind::MajorChange)),
        "{:?}",
        d4.events
    );
    assert_eq!(d4.active, all);
}

/// `s` with its switch counts scaled up from a measurement window (`from`), as the BPF
/// sampler gives them for a workload with many events.
fn from_window(mut s: PeriodSample, from: RatesFrom) -> PeriodSample {
    s.rates_from = from;
    s
}

fn major_changes(ds: &[Decision]) -> usize {
    ds.iter()
        .flat_map(|d| &d.events)
        .filter(|e| matches!(e.kind, EventKind::MajorChange))
        .count()
}

/// The `none` guest of 2026-11-28 (results/pingpong-none-2026-11-28): a consolidated
/// workload's switch counts come from windows, and one window reads g_comp 10x the others
/// with utilization unchanged. That alone undid the packing; now it only asks for a fresh
/// window, which decides. Two fresh windows that agree are a change, as before.
#[test]
fn one_window_s_change_of_grain_waits_for_a_fresh_window() {
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    let all = Cpuset::first_n(3);
    let steady = |a: &Cpuset, from| from_window(spread(a, 3, 2 * T, T, T, 10), from);
    g.step(&from_window(
        sample(&all, 3, 2 * T, T, T, 10),
        RatesFrom::ThisWindow,
    ));
    // Settle, build the reference from fresh windows (each period asks for the next one),
    // be judged harmless.
    let ds = drive(&mut g, 8, |a| steady(a, RatesFrom::ThisWindow));
    assert_eq!(major_changes(&ds), 0, "{:?}", events(&ds));
    let packed = ds.last().unwrap().active.clone();
    assert_eq!(packed.len(), 2, "{:?}", events(&ds));
    assert!(!ds.last().unwrap().fresh_rates_wanted);
    // One window 10x coarser: no change, but a fresh window wanted.
    let d = g.step(&from_window(
        spread(&packed, 3, 2 * T, T, 10 * T, 10),
        RatesFrom::ThisWindow,
    ));
    assert_eq!(major_changes(std::slice::from_ref(&d)), 0, "{:?}", d.events);
    assert!(d.fresh_rates_wanted);
    assert_eq!(d.active, packed);
    // The sampler could not give one: the period carries the outlying window over, which
    // confirms nothing.
    let d = g.step(&from_window(
        spread(&packed, 3, 2 * T, T, 10 * T, 10),
        RatesFrom::EarlierWindow,
    ));
    assert_eq!(major_changes(std::slice::from_ref(&d)), 0, "{:?}", d.events);
    assert!(d.fresh_rates_wanted);
    // The fresh window is the workload as before: the suspicion is dropped.
    let d = g.step(&steady(&packed, RatesFrom::ThisWindow));
    assert_eq!(major_changes(std::slice::from_ref(&d)), 0, "{:?}", d.events);
    assert!(!d.fresh_rates_wanted);
    assert_eq!(d.active, packed);
    // Threads now switch 4x less often, in every fresh window from now on: reactivate once
    // the windows have shown it for 0.3 s (the grain's confirmation span), each asking for
    // the next meanwhile.
    let coarser =
        |a: &Cpuset| from_window(spread(a, 3, 2 * T, T, 4 * T, 10), RatesFrom::ThisWindow);
    let period_ns = coarser(&packed).period_ns;
    let span_periods = 300_000_000u64.div_ceil(period_ns) as usize;
    for i in 0..span_periods {
        let d = g.step(&coarser(&packed));
        assert_eq!(
            major_changes(std::slice::from_ref(&d)),
            0,
            "{i}: {:?}",
            d.events
        );
        assert!(d.fresh_rates_wanted, "{i}");
        assert_eq!(d.active, packed, "{i}");
    }
    let d = g.step(&coarser(&packed));
    assert_eq!(major_changes(std::slice::from_ref(&d)), 1, "{:?}", d.events);
    assert_eq!(d.active, all);
}

/// The none guest, 2026-11-28 (a traced `run --observe` of a pinned ping-pong): a stretch
/// where the vCPU ran slowly gave three windows running beyond the factor (5.8, 22.2, 9.1 us
/// against 2.0) over 0.14 s, then 1.9 us again. Two fresh windows beyond were taken for a
/// move; it is none, and the packing stands.
#[test]
fn a_slow_stretch_of_windows_is_not_a_change_of_grain() {
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    let all = Cpuset::first_n(3);
    let at = |a: &Cpuset, us: f64| {
        from_window(
            spread(a, 3, 2 * T, T, (us * T as f64 / 2.0) as u64, 10),
            RatesFrom::ThisWindow,
        )
    };
    g.step(&at(&all, 2.0));
    let ds = drive(&mut g, 8, |a| at(a, 2.0));
    let packed = ds.last().unwrap().active.clone();
    assert_eq!(packed.len(), 2, "{:?}", events(&ds));
    for (i, us) in [5.8, 22.2, 9.1, 22.2, 1.9, 2.0, 2.1]
        .into_iter()
        .enumerate()
    {
        let d = g.step(&at(&packed, us));
        assert_eq!(
            major_changes(std::slice::from_ref(&d)),
            0,
            "{i}: {:?}",
            d.events
        );
        assert_eq!(d.active, packed, "{i}");
    }
}

/// A 3-vCPU workload packed onto 2 at once (two settling periods), then one period per
/// entry of `grains_us`, each a fresh window whose g_comp is that many microseconds (the
/// packing's own grain scaled to `packed_us`). Asserts that no period makes a major change
/// or leaves the packing, and returns which periods asked for a fresh window next.
fn packed_windows(grains_us: &[f64], packed_us: f64) -> Vec<bool> {
    let cfg = PolicyConfig {
        mode: Mode::Consolidation,
        settle_periods: 2,
        warmup_periods: 0,
        ..Default::default()
    };
    let mut g = Gleaner::new(cfg, Cpuset::first_n(3)).unwrap();
    let d = g.step(&from_window(
        sample(&Cpuset::first_n(3), 3, 2 * T, T, T, 10),
        RatesFrom::ThisWindow,
    ));
    let packed = d.active.clone();
    assert_eq!(packed.len(), 2, "{:?}", d.events);
    let mut asked = Vec::new();
    for (i, x) in grains_us.iter().enumerate() {
        let grain = (x * T as f64 / packed_us) as u64;
        let d = g.step(&from_window(
            spread(&packed, 3, 2 * T, T, grain, 10),
            RatesFrom::ThisWindow,
        ));
        assert_eq!(
            major_changes(std::slice::from_ref(&d)),
            0,
            "period {i}: {:?}",
            d.events
        );
        assert_eq!(d.active, packed, "period {i}");
        asked.push(d.fresh_rates_wanted);
    }
    asked
}

/// The none guest, 2026-11-28 (run 4 of `fresh-window.sh`): after the packing the windows of
/// the settling periods read g_comp 4.3 and 2.3 us, the threads still moving, and then 1.3,
/// 1.1 us steady. Built from the settling windows, the reference (2.3 us) took the steady
/// 1.1 us for a move and asked for three more windows, each stretching the periods.
#[test]
fn settling_windows_do_not_make_the_reference() {
    let asked = packed_windows(&[4.3, 2.3, 1.3, 1.1, 1.2, 1.1, 1.3, 1.1, 1.2], 1.3);
    // Two windows to complete the reference after the first judged one, no suspicion.
    assert_eq!(asked.iter().filter(|&&a| a).count(), 2, "{asked:?}");
}

/// The none guest, 2026-11-28 (`results/daemon-2026-11-28-223322.json`, run 49): after the
/// settling periods the first two windows of the packed ping-pong read 16.1 and 8.2 us, the
/// rest 1.3-1.8 us. The median of the first three (8.2 us) was taken for the reference, and
/// the steady windows after it for a move down that undid the packing (in 3 runs of 16).
#[test]
fn a_reference_needs_its_windows_to_agree() {
    let asked = packed_windows(
        &[1.8, 1.8, 16.1, 8.2, 1.7, 1.7, 1.3, 1.4, 1.7, 1.8, 1.6],
        1.7,
    );
    // Windows are asked for until three agree (1.7, 1.7, 1.3: the fifth judged window), then
    // no more.
    assert_eq!(
        asked[2..],
        [true, true, true, true, false, false, false, false, false],
        "{asked:?}"
    );
}

/// Fresh windows cost the sampler its events every period instead of one in ten: they are
/// asked for only while a consolidation stands or is on trial. Observing (`forget_changes`
/// every period) asked for one every period, and the own-CPU budget stretched the periods
/// (0.1 s planned, up to 0.37 s).
#[test]
fn fresh_windows_are_asked_for_only_while_consolidated() {
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    for i in 0..20 {
        let d = g.step(&from_window(
            sample(&Cpuset::first_n(3), 3, 2 * T, T, T, 10),
            if i % 10 == 0 {
                RatesFrom::ThisWindow
            } else {
                RatesFrom::EarlierWindow
            },
        ));
        assert!(!d.fresh_rates_wanted, "period {i}: {:?}", d.events);
        g.forget_changes();
    }
}

/// Where every switch is counted (the simulator, the procfs sampler), one period's move of
/// the grain is a change at once, as the paper's test has it.
#[test]
fn a_counted_change_of_grain_needs_no_second_period() {
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    g.step(&sample(&Cpuset::first_n(3), 3, 2 * T, T, T, 10));
    let ds = drive(&mut g, 8, |a| spread(a, 3, 2 * T, T, T, 10));
    let packed = ds.last().unwrap().active.clone();
    assert_eq!(packed.len(), 2, "{:?}", events(&ds));
    assert!(ds.iter().all(|d| !d.fresh_rates_wanted));
    let d = g.step(&spread(&packed, 3, 2 * T, T, 10 * T, 10));
    assert_eq!(major_changes(std::slice::from_ref(&d)), 1, "{:?}", d.events);
}

#[test]
fn retention_turns_on_for_short_frequent_idles_and_off_when_workload_is_crowded() {
    let cfg = PolicyConfig {
        mode: Mode::Retention,
        settle_periods: 1,
        warmup_periods: 0,
        retention_timeout: RetentionTimeout { ns: 30_000 },
        ..Default::default()
    };
    let mut g = Gleaner::new(cfg, Cpuset::first_n(2)).unwrap();
    let all = Cpuset::first_n(2);
    // 40 us of work then 20 us idle: 16,666 idle periods/s, each shorter than the hold.
    let d = g.step(&sample(&all, 2, 40_000, 20_000, 20_000, 1000));
    assert!(
        d.retention
            .iter()
            .all(|(_, a)| matches!(a, RetentionAction::Retain { timeout_ns: 30_000 })),
        "{:?}",
        d
    );
    // Workload threads now queue for CPU: retention must let go.
    let mut s = sample(&all, 2, 40_000, 20_000, 20_000, 1000);
    s.work_runnable_wait_ns = Some(s.period_ns / 2);
    let d = g.step(&s);
    assert!(
        d.retention.iter().all(|(_, a)| *a == RetentionAction::Off),
        "{:?}",
        d
    );
}

#[test]
fn retention_stays_off_for_long_idle_periods_and_idle_workloads() {
    let cfg = PolicyConfig {
        mode: Mode::Retention,
        settle_periods: 1,
        warmup_periods: 0,
        retention_timeout: RetentionTimeout { ns: 30_000 },
        ..Default::default()
    };
    let mut g = Gleaner::new(cfg, Cpuset::first_n(2)).unwrap();
    let all = Cpuset::first_n(2);
    // 1 ms idle periods: far longer than the 30 us hold.
    let d = g.step(&sample(&all, 2, 200_000, 1_000_000, 100_000, 100));
    assert!(d.retention.iter().all(|(_, a)| *a == RetentionAction::Off));
    let d = g.step(&sample(&all, 2, 0, 1_000_000, 100_000, 100));
    assert!(d.retention.iter().all(|(_, a)| *a == RetentionAction::Off));
}

#[test]
fn idle_periods_inside_the_host_poll_window_are_not_held() {
    // 20 us idle periods, but the host polls a halted vCPU for 100 us: nothing to gain.
    let cfg = PolicyConfig {
        mode: Mode::Retention,
        warmup_periods: 0,
        retention_timeout: RetentionTimeout { ns: 30_000 },
        min_retain_idle_ns: 100_000,
        ..Default::default()
    };
    let mut g = Gleaner::new(cfg, Cpuset::first_n(2)).unwrap();
    let d = g.step(&sample(
        &Cpuset::first_n(2),
        2,
        40_000,
        20_000,
        20_000,
        1000,
    ));
    assert!(
        d.retention.iter().all(|(_, a)| *a == RetentionAction::Off),
        "{:?}",
        d
    );
}

#[test]
fn retention_that_slows_the_workload_is_undone_and_backs_off() {
    let cfg = PolicyConfig {
        mode: Mode::Retention,
        settle_periods: 1,
        warmup_periods: 0,
        retention_timeout: RetentionTimeout { ns: 30_000 },
        ..Default::default()
    };
    let mut g = Gleaner::new(cfg, Cpuset::first_n(2)).unwrap();
    let all = Cpuset::first_n(2);
    let good = sample(&all, 2, 40_000, 20_000, 20_000, 1000);
    let d = g.step(&good);
    assert!(!d.events.is_empty());
    // Utilization collapses with retention on: one settling period, three of evidence.
    let ds = drive(&mut g, 4, |a| {
        let mut s = sample(a, 2, 20_000, 40_000, 20_000, 1000);
        // The holds do catch the wake-ups (so retention is not dropped for timing out).
        for v in &mut s.vcpus {
            v.yield_preemptions = std::mem::take(&mut v.idle_entries);
        }
        s
    });
    assert!(
        ds[..3]
            .iter()
            .all(|d| d.retention.iter().all(|(_, a)| *a != RetentionAction::Off)),
        "judged too early"
    );
    let d = ds.last().unwrap();
    assert!(
        d.retention.iter().all(|(_, a)| *a == RetentionAction::Off),
        "{:?}",
        d
    );
    assert!(matches!(d.events[0].kind, EventKind::RetentionOff { .. }));
    // Not retried immediately.
    let d = g.step(&good);
    assert!(d.retention.iter().all(|(_, a)| *a == RetentionAction::Off));
}

#[test]
fn nothing_changes_during_warm_up() {
    let mut g = Gleaner::new(
        PolicyConfig {
            mode: Mode::Consolidation,
            ..Default::default()
        },
        Cpuset::first_n(3),
    )
    .unwrap();
    let ds = drive(&mut g, 2, |a| sample(a, 3, 2 * T, T, T, 10));
    assert!(events(&ds).is_empty(), "{:?}", events(&ds));
    let d = g.step(&sample(&Cpuset::first_n(3), 3, 2 * T, T, T, 10));
    assert_eq!(d.active.len(), 2, "{:?}", d.events);
}

/// Lab draw 10, oltp-28us-16v-2:1: a step taken on two start-up periods whose utilization
/// swung by a factor of 2.6 stayed, whatever it cost, as no loss could stand out of that swing.
/// In the start-up's short periods a trial now waits until the quiet periods are steady enough
/// for a 10 % loss to show; after the start-up the gate is not asked, and trials go ahead on
/// full periods.
#[test]
fn a_start_up_that_swings_starts_no_trial_until_a_loss_could_be_seen() {
    let mut g = consolidation_with_defaults(3);
    let all = Cpuset::first_n(3);
    // Warm-up, then start-up periods swinging +-9 % (not a major change) that meet both of
    // §5's conditions: a 10 % loss would not stand out of that.
    for i in 0..8 {
        let d = g.step(&swing(sample(&all, 3, T, T, T / 2, 10), i, 1.09, 0.91));
        assert_eq!(d.active, all, "period {}: {:?}", i + 1, d.events);
    }
    // The start-up over (period 9 on), a trial starts.
    let ds = drive(&mut g, 12, |a| {
        if a.len() == 3 {
            sample(a, 3, T, T, T / 2, 10)
        } else {
            spread(a, 3, T, T, T / 2, 10)
        }
    });
    assert!(
        has_event(&ds, |e| matches!(e, EventKind::Deactivate { .. })),
        "{:?}",
        events(&ds)
    );
}

/// The gate above weighs what the judge could miss against what the trial could gain: a
/// ping-pong whose halted wake-ups cost more than its run time is tried at once, however its
/// start-up swings (on the real guest a gate on the swing alone left it unpacked in 5 of 10
/// runs).
#[test]
fn a_start_up_that_swings_is_tried_at_once_where_the_wake_ups_promise_more() {
    let mut g = consolidation_with_defaults(3);
    let all = Cpuset::first_n(3);
    let mut deactivated_at = None;
    for i in 0..8u32 {
        let active = g.active().clone();
        let s = sample(&active, 3, T, T, T / 2, 10);
        let s = with_wake_latencies(s, (10, 5_000), (200, 200_000));
        let d = g.step(&swing(s, i, 1.09, 0.91));
        if deactivated_at.is_none() && d.active != all {
            deactivated_at = Some(i + 1);
        }
    }
    assert_eq!(
        deactivated_at,
        Some(3),
        "the first period after the warm-up"
    );
}

/// A ping-pong on two vCPUs as the `none` guest of 2026-12-01 measured it: each vCPU 46 % the
/// pair's, 45.6 % idle and the rest on the kernel's wake-up path, so that l_comp (7.37 us)
/// stays a hair above l_idle (7.31 us); `halted` wake-ups found their vCPU halted (10 us
/// each), and 200 a running one.
fn knife_edge_ping_pong(active: &Cpuset, halted: u64) -> PeriodSample {
    let period = 100_000_000;
    let packed = active.len() == 1;
    let vcpus = (0..2)
        .map(|cpu| match (active.contains(cpu), packed) {
            (true, false) => VcpuSample {
                cpu,
                work_ns: 46_000_000,
                idle_ns: 45_600_000,
                idle_entries: 6_241,
                ..Default::default()
            },
            // Packed, the pair runs on one vCPU without the wake-up path.
            (true, true) => VcpuSample {
                cpu,
                work_ns: 95_000_000,
                idle_ns: 1_000_000,
                idle_entries: 100,
                ..Default::default()
            },
            (false, _) => VcpuSample {
                cpu,
                idle_ns: period,
                idle_entries: 10,
                ..Default::default()
            },
        })
        .collect();
    let s = PeriodSample {
        period_ns: period,
        vcpus,
        work_switches: 12_000,
        work_threads: 2,
        work_runnable_wait_ns: Some(0),
        wake_latency: None,
        progress: None,
        stale_rates: false,
        rates_from: Default::default(),
    };
    let mut s = with_wake_latencies(s, (200, 8_000), (halted, 10_000));
    let w = s.wake_latency.as_mut().unwrap();
    // Where the host still polls a vCPU that has just halted (its halted wake-ups as fast
    // as running ones), only hand-offs promise a gain (`gain::gain_bound_of`).
    w.halted_waited = halted / 2;
    w.halted_hand_offs = halted / 2;
    s
}

/// §5's condition (1) on such a pair compares one vCPU's work with the other's idle time,
/// which the wake-up path keeps just short of it: Gleaner packed it 0.03 to 2.3 s after it
/// began, or never (3 of 14 runs by hand, at half of one vCPU's round trips/s), as the noise
/// moved the two. Counted as the room it
/// is once packed, the path lets the pair be packed at the first period it may; with no
/// halted wake-ups to bound it, the same time on the vCPUs is no room.
#[test]
fn a_pair_that_takes_turns_is_packed_though_its_idle_time_is_a_hair_short() {
    let first_packed = |halted: u64| {
        let mut g = consolidation_with_defaults(2);
        (1..=20u32).find(|_| {
            let active = g.active().clone();
            g.step(&knife_edge_ping_pong(&active, halted)).active.len() == 1
        })
    };
    assert_eq!(
        first_packed(10_000),
        Some(3),
        "the first period after the warm-up"
    );
    // What `gleaner status` and the end of a run say agrees: with the path, neither of §5's
    // conditions stands in the way; without it, condition (1) would.
    let g = consolidation_with_defaults(2);
    let all = Cpuset::first_n(2);
    let mut c = characterize(&knife_edge_ping_pong(&all, 10_000), &all);
    let why = g.why_unchanged(&c).join("; ");
    assert!(!why.contains("consolidation:"), "{why}");
    c.l_wake_path_ns = 0.0;
    let why = g.why_unchanged(&c).join("; ");
    assert!(why.contains("lack the idle time"), "{why}");
}

#[test]
fn start_up_periods_are_a_quarter_long_then_the_configured_length() {
    const MS: u64 = 1_000_000;
    let cfg = PolicyConfig {
        mode: Mode::Consolidation,
        ..Default::default()
    };
    let startup = cfg.startup_periods as usize;
    assert!(startup > cfg.warmup_periods as usize + cfg.settle_periods as usize);
    let mut g = Gleaner::new(cfg, Cpuset::first_n(3)).unwrap();
    let mut lengths = Vec::new();
    for _ in 0..startup + 3 {
        lengths.push(g.next_period_ns(100 * MS));
        g.step(&sample(&Cpuset::first_n(3), 3, 2 * T, T, T, 10));
    }
    assert!(
        lengths[..startup].iter().all(|&l| l == 25 * MS),
        "{lengths:?}"
    );
    assert!(
        lengths[startup..].iter().all(|&l| l == 100 * MS),
        "{lengths:?}"
    );
    // Never below 10 ms, never above the configured period, and off when asked.
    let fresh = Gleaner::new(PolicyConfig::default(), Cpuset::first_n(2)).unwrap();
    assert_eq!(fresh.next_period_ns(20 * MS), 10 * MS);
    assert_eq!(fresh.next_period_ns(5 * MS), 5 * MS);
    let off = Gleaner::new(
        PolicyConfig {
            startup_periods: 0,
            ..Default::default()
        },
        Cpuset::first_n(2),
    )
    .unwrap();
    assert_eq!(off.next_period_ns(100 * MS), 100 * MS);
    // A machine that could not keep a period's schedule gets full periods at once.
    let mut stalled = Gleaner::new(PolicyConfig::default(), Cpuset::first_n(2)).unwrap();
    assert_eq!(stalled.next_period_ns(100 * MS), 25 * MS);
    stalled.period_disrupted();
    assert_eq!(stalled.next_period_ns(100 * MS), 100 * MS);
}

/// A workload that leaves a coarse start-up phase for a fine-grained one is a major change.
/// With nothing consolidated there is nothing to undo, but the period that saw the change
/// straddles the two programs: nothing starts on it, neither a consolidation nor a hold (a
/// change judged against the coarse phase's utilization would be blamed for the phase's own
/// fall). The next period, the new reference, is tested for consolidation before retention
/// can take it: ping-pong on the haltpoll guest was once held by polling (x8 of bare) and
/// consolidation (x12) never tried.
#[test]
fn a_phase_change_with_nothing_consolidated_starts_nothing_on_its_period_then_consolidates() {
    let mut g = Gleaner::new(PolicyConfig::default(), Cpuset::first_n(2)).unwrap();
    let all = Cpuset::first_n(2);
    // Start-up: busy, coarse (l_comp 3 ms against l_idle 30 us): nothing to consolidate.
    let ds = drive(&mut g, 4, |a| sample(a, 2, 3 * T, 30_000, 3 * T, 30));
    assert!(events(&ds).is_empty(), "{:?}", events(&ds));
    // The fine phase: l_comp 15 us, l_idle 20 us, utilization 1.7 -> 0.86 (a major change).
    let fine = || sample(&all, 2, 15_000, 20_000, 15_000, 3_000);
    let d = g.step(&fine());
    assert_eq!(d.active, all, "{:?}", d.events);
    assert!(d.events.is_empty(), "{:?}", d.events);
    assert!(d.retention.iter().all(|(_, a)| *a == RetentionAction::Off));
    let d = g.step(&fine());
    assert_eq!(d.active.len(), 1, "{:?}", d.events);
}

/// Found in the policy lab (phase-pingpong-20us-16v-dedicated): a hold started in the first
/// period of an exchange phase that followed a compute phase was judged against the compute
/// phase's utilization (16.00 -> 5.62), turned off as a 65 % loss and backed off, though it
/// sped the exchange up. Now the period that straddles the change starts nothing, the next
/// one is the hold's "before", and the hold that keeps the phase's pace stays.
#[test]
fn a_hold_started_as_a_phase_begins_is_not_judged_against_the_phase_before() {
    let cfg = PolicyConfig {
        settle_periods: 1,
        warmup_periods: 0,
        retention_timeout: RetentionTimeout { ns: 30_000 },
        ..Default::default()
    };
    let mut g = Gleaner::new(cfg, Cpuset::first_n(2)).unwrap();
    // The compute phase: both vCPUs busy, nothing to hold or pack.
    let ds = drive(&mut g, 4, |a| sample(a, 2, 10 * T, 0, 10 * T, 1));
    assert!(events(&ds).is_empty(), "{:?}", events(&ds));
    // The exchange: 40 us of work between 20 us idle periods on each vCPU (utilization
    // 2.0 -> 1.33; l_comp 40 us > l_idle 20 us, so nothing to pack), the holds catching the
    // wake-ups once on.
    let ds = drive(&mut g, 10, |a| {
        let mut s = sample(a, 2, 40_000, 20_000, 20_000, 1000);
        for v in &mut s.vcpus {
            v.yield_preemptions = std::mem::take(&mut v.idle_entries);
        }
        s
    });
    let evs = events(&ds);
    assert!(
        evs.iter()
            .any(|e| matches!(e, EventKind::RetentionOn { .. })),
        "{evs:?}"
    );
    assert!(
        !evs.iter()
            .any(|e| matches!(e, EventKind::RetentionOff { .. })),
        "{evs:?}"
    );
    let d = ds.last().unwrap();
    assert!(
        d.retention.iter().all(|(_, a)| *a != RetentionAction::Off),
        "{d:?}"
    );
}

#[test]
fn always_yield_holds_everything() {
    let cfg = PolicyConfig {
        mode: Mode::AlwaysYield,
        ..Default::default()
    };
    let mut g = Gleaner::new(cfg, Cpuset::first_n(2)).unwrap();
    let d = g.step(&sample(&Cpuset::first_n(2), 2, 0, T, T, 1));
    assert_eq!(d.active.len(), 2);
    assert!(d.retention.iter().all(|(_, a)| *a
        == RetentionAction::Retain {
            timeout_ns: FOREVER_NS
        }));
}

#[test]
fn bad_factors_are_refused_with_a_fix() {
    for (rho, eta) in [(0.0, 1.0), (1.5, 1.0), (1.0, -0.1), (f64::NAN, 1.0)] {
        let err = Gleaner::new(
            PolicyConfig {
                rho,
                eta,
                ..Default::default()
            },
            Cpuset::first_n(2),
        )
        .unwrap_err();
        assert!(err.to_string().contains("outside (0, 1]"), "{err}");
    }
    assert!(Gleaner::new(PolicyConfig::default(), Cpuset::new()).is_err());
}

fn arb_vcpu(cpu: usize) -> impl Strategy<Value = VcpuSample> {
    (
        0u64..100_000_000,
        0u64..100_000_000,
        0u64..100_000_000,
        0u64..5_000,
        0u64..5_000,
        0u64..10_000_000,
    )
        .prop_map(
            move |(work_ns, yield_ns, idle_ns, yield_preemptions, idle_entries, steal_ns)| {
                VcpuSample {
                    cpu,
                    work_ns,
                    yield_ns,
                    idle_ns,
                    steal_ns,
                    yield_preemptions,
                    idle_entries,
                }
            },
        )
}

fn arb_sample(n: usize) -> impl Strategy<Value = PeriodSample> {
    let vcpus: Vec<_> = (0..n).map(arb_vcpu).collect();
    (
        vcpus,
        0u64..100_000,
        proptest::option::of(0u64..100_000_000),
    )
        .prop_map(|(vcpus, work_switches, wait)| PeriodSample {
            period_ns: 100_000_000,
            vcpus,
            work_switches,
            work_threads: 8,
            work_runnable_wait_ns: wait,
            wake_latency: None,
            progress: None,
            stale_rates: false,
            rates_from: Default::default(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever the samples, the active set is never empty, never leaves the allowed set,
    /// never changes in two consecutive periods unless the second change undoes the first
    /// (a step whose first period showed a clear loss), never in three, and never loses more
    /// than half its vCPUs at once.
    #[test]
    fn active_set_is_safe_and_calm(samples in proptest::collection::vec(arb_sample(4), 1..60), full in any::<bool>()) {
        let mode = if full { Mode::Full } else { Mode::Consolidation };
        let allowed = Cpuset::first_n(4);
        let mut g = Gleaner::new(PolicyConfig { mode, ..Default::default() }, allowed.clone()).unwrap();
        let mut prev = allowed.clone();
        let mut before_prev = allowed.clone();
        let mut changed_last = false;
        let mut undone_last = false;
        for s in &samples {
            let d = g.step(s);
            prop_assert!(!d.active.is_empty());
            prop_assert!(d.active.is_subset(&allowed));
            let changed = d.active != prev;
            let undone = changed && changed_last;
            prop_assert!(!undone || d.active == before_prev, "active set changed in two consecutive periods, the second not undoing the first");
            prop_assert!(!(changed && undone_last), "active set changed in three consecutive periods");
            // Steps may take several vCPUs when the evidence is strong, never more than half.
            prop_assert!(2 * d.active.len() >= prev.len(), "more than half the vCPUs deactivated at once");
            prop_assert_eq!(d.retention.len(), 4);
            for (cpu, a) in &d.retention {
                if !d.active.contains(*cpu) {
                    prop_assert_eq!(*a, RetentionAction::Off);
                }
            }
            changed_last = changed;
            undone_last = undone;
            before_prev = std::mem::replace(&mut prev, d.active);
        }
    }
}

#[test]
fn observe_only_proposes_the_same_change_each_period_and_never_judges_it() {
    // Figure 4(a) measured with nothing applied: the consolidation is proposed every period
    // (never rolled back by measurements that cannot reflect it), and the summary says so.
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(3)).unwrap();
    let mut summary = RunSummary::default();
    for _ in 0..6 {
        let d = g.step(&sample(&Cpuset::first_n(3), 3, 2 * T, T, T, 10));
        assert_eq!(
            events(std::slice::from_ref(&d)),
            vec![EventKind::Deactivate { cpu: 2 }],
            "{:?}",
            d.events
        );
        summary.add(&d, 0.02);
        g.forget_changes();
        assert_eq!(g.active().len(), 3);
    }
    let report = summary.render(&g, true);
    assert!(
        report.contains("deactivate a vCPU (consolidate): 6 of 6"),
        "{report}"
    );
    assert!(!report.contains("roll"), "{report}");
}

#[test]
fn observe_explains_why_nothing_would_change() {
    // Figure 4(b): g_comp = 2t > eta x l_idle; idle periods far too few and long to hold.
    let mut g = Gleaner::new(
        PolicyConfig {
            warmup_periods: 0,
            ..Default::default()
        },
        Cpuset::first_n(3),
    )
    .unwrap();
    let mut summary = RunSummary::default();
    for _ in 0..4 {
        let d = g.step(&sample(&Cpuset::first_n(3), 3, 2 * T, T, 2 * T, 10));
        summary.add(&d, 0.02);
        g.forget_changes();
    }
    let report = summary.render(&g, true);
    assert!(report.contains("would have changed nothing"), "{report}");
    assert!(
        report.contains("retention:") && report.contains("idle periods/s per vCPU, fewer than"),
        "{report}"
    );
    assert!(
        report.contains("consolidation: g_comp") && report.contains("synchronize too rarely"),
        "{report}"
    );
}

/// Lab case pingpong-1000us-16v-2:1 (and barrier-100us-16v-2:1, lock-100us-4v-2:1): on an
/// oversubscribed host the consolidation costs the VM its CPU share, utilization falls by a
/// third at once, and the old judge kept it for the whole judging window (5 of a run's 20
/// periods) and then retried after two periods, losing the same again. Now the loss is clear
/// against the steady periods before it by the second period after the change, and the
/// consolidation is not retried for a back-off.
#[test]
fn a_clear_loss_is_undone_early_and_not_retried_at_once() {
    let mut g = consolidation_with_defaults(4);
    let all = Cpuset::first_n(4);
    let steady = |i: usize| {
        let mut s = sample(&all, 4, T, 2 * T, T / 2, 10);
        // A little noise, as in every real period.
        s.vcpus[0].work_ns += (i as u64 % 3) * 10_000;
        s
    };
    // Warm-up (2 periods), then the decision period: consolidation is tried.
    let mut ds = vec![g.step(&steady(0)), g.step(&steady(1))];
    ds.push(g.step(&steady(2)));
    assert!(ds[2].active.len() < 4, "{:?}", events(&ds));
    // The workload loses a third of its pace on the smaller set.
    let ds = drive(&mut g, 12, |a| {
        if a.len() == 4 {
            sample(a, 4, T, 2 * T, T / 2, 10)
        } else {
            let mut s = spread(a, 4, T, 2 * T, T / 2, 10);
            for v in &mut s.vcpus {
                v.work_ns = v.work_ns * 2 / 3;
                v.idle_ns = s.period_ns - v.work_ns;
            }
            s
        }
    });
    let rolled = ds
        .iter()
        .position(|d| {
            d.events
                .iter()
                .any(|e| matches!(e.kind, EventKind::Rollback { .. }))
        })
        .unwrap_or_else(|| panic!("never rolled back: {:?}", events(&ds)));
    // Periods after the change: ds[0] and ds[1] are its first two; undone with the second.
    assert_eq!(rolled, 1, "{:?}", events(&ds));
    assert_eq!(ds[rolled].active, all);
    // Not tried again within the back-off (settling, then 4 periods).
    let retried = ds[rolled + 1..].iter().position(|d| {
        d.events
            .iter()
            .any(|e| matches!(e.kind, EventKind::Deactivate { .. }))
    });
    assert!(
        retried.is_none_or(|p| p >= 3),
        "retried {retried:?} periods after the rollback: {:?}",
        events(&ds)
    );
}

/// Where three quiet periods or more show the workload's noise, a step that cut its pace by a
/// third is undone after its first period instead of its second: no second period of the same
/// loss. Policy lab, 540 drawn scenarios: benchmark-VM losses 20 -> 17, system losses
/// 19 -> 17 (phase-grain-146us-16v-2:1, draw 8: -14.0 % -> +8.3 % against `none`).
#[test]
fn a_clear_loss_against_a_known_noise_is_undone_after_one_period() {
    let all = Cpuset::first_n(4);
    // Warm-up (3 periods; the first is the start-up and does not count), then the decision
    // period: three quiet periods before the change. Then three periods in which the smaller
    // set runs the workload at `kept` of its pace.
    let after_a_step = |kept: (u64, u64)| {
        let mut g = Gleaner::new(
            PolicyConfig {
                mode: Mode::Consolidation,
                warmup_periods: 3,
                ..Default::default()
            },
            all.clone(),
        )
        .unwrap();
        let steady: Vec<Decision> = (0..4u64)
            .map(|i| {
                let mut s = sample(&all, 4, T, 2 * T, T / 2, 10);
                s.vcpus[0].work_ns += (i % 3) * 10_000;
                g.step(&s)
            })
            .collect();
        assert!(steady[3].active.len() < 4, "{:?}", events(&steady));
        drive(&mut g, 3, |a| {
            if a.len() == 4 {
                return sample(a, 4, T, 2 * T, T / 2, 10);
            }
            let mut s = spread(a, 4, T, 2 * T, T / 2, 10);
            for v in &mut s.vcpus {
                v.work_ns = v.work_ns * kept.0 / kept.1;
                v.idle_ns = s.period_ns - v.work_ns;
            }
            s
        })
    };
    let ds = after_a_step((2, 3));
    assert!(
        ds[0]
            .events
            .iter()
            .any(|e| matches!(e.kind, EventKind::Rollback { .. })),
        "not undone after the first period: {:?}",
        events(&ds)
    );
    assert_eq!(ds[0].active, all);
    // A loss of a tenth, over the usual minimum but not three times it, waits for the second
    // period as before.
    let ds = after_a_step((9, 10));
    assert!(ds[0].events.is_empty(), "{:?}", events(&ds));
    assert_ne!(ds[0].active, all);
}

/// Lab case phase-grain-10us-16v-dedicated: the workload switched from a 10 us to a 1 ms
/// grain while a consolidation was being judged. The judge saw the coarse phase's higher
/// utilization, accepted a consolidation that had cost the fine phase 22 %, and the VM ran
/// the coarse phase on 9 of 16 vCPUs (31 % below `none`). A trial during which the grain
/// moved by the major-change factor now proves nothing: every vCPU comes back.
#[test]
fn a_phase_change_during_a_trial_voids_it() {
    let mut g = Gleaner::new(consolidation_only(), Cpuset::first_n(4)).unwrap();
    let all = Cpuset::first_n(4);
    let d = g.step(&sample(&all, 4, T, 2 * T, T / 2, 10));
    assert!(d.active.len() < 4, "{:?}", d.events);
    // Fine phase on the smaller set: a slight loss, within the noise of one period.
    let d1 = g.step(&spread(&d.active, 4, T, 2 * T, T / 2, 10));
    // Coarse phase: threads switch 50x less often and keep every active vCPU busy.
    let ds = drive(&mut g, 2, |a| sample(a, 4, 10 * T, 0, 25 * T, 1));
    assert!(d1.events.is_empty(), "{:?}", d1.events);
    assert!(
        has_event(&ds, |e| matches!(e, EventKind::MajorChange)),
        "{:?}",
        events(&ds)
    );
    assert_eq!(ds.last().unwrap().active, all);
}

/// Lab case barrier-10us-8v-1-co-runner: after consolidating 8 -> 4 vCPUs, retention turned on
/// and raised utilization (and throughput) by 20 %; the major-change detector, still comparing
/// with the state before retention, took our own change for a new workload and reactivated
/// all 8 vCPUs (regret 12.7 % instead of 7.4 %). A change of ours re-bases the detector.
#[test]
fn retention_that_speeds_up_a_consolidated_workload_is_not_a_major_change() {
    let cfg = PolicyConfig {
        mode: Mode::Full,
        settle_periods: 1,
        warmup_periods: 0,
        retention_timeout: RetentionTimeout { ns: 30_000 },
        ..Default::default()
    };
    let mut g = Gleaner::new(cfg, Cpuset::first_n(4)).unwrap();
    let all = Cpuset::first_n(4);
    // 40 us of work, 20 us idle, threads switching every 20 us: one vCPU's work fits.
    let d = g.step(&sample(&all, 4, 40_000, 20_000, 20_000, 1000));
    assert_eq!(d.active.len(), 3, "{:?}", d.events);
    let mut ds = Vec::new();
    for _ in 0..16 {
        let active = g.active().clone();
        let retaining = ds.last().is_some_and(|d: &Decision| {
            d.retention.iter().any(|(_, a)| *a != RetentionAction::Off)
        });
        let mut s = spread(&active, 4, 40_000, 20_000, 20_000, 1000);
        for v in &mut s.vcpus {
            if active.contains(v.cpu) && retaining {
                // Held vCPUs wake their threads quickly: 25 % more work done per period.
                v.work_ns = (v.work_ns * 5 / 4).min(s.period_ns);
                v.idle_ns = s.period_ns - v.work_ns;
                v.yield_preemptions = std::mem::take(&mut v.idle_entries);
            }
        }
        ds.push(g.step(&s));
    }
    assert!(
        has_event(&ds, |e| matches!(e, EventKind::RetentionOn { .. })),
        "{:?}",
        events(&ds)
    );
    assert!(
        !has_event(&ds, |e| matches!(e, EventKind::MajorChange)),
        "{:?}",
        events(&ds)
    );
    assert_eq!(ds.last().unwrap().active.len(), 3, "{:?}", events(&ds));
}

/// Retention alone, tried from the first period and judged after one settling period, with a
/// 20 µs hold: what the wake-up gates below are tested under.
fn retention_trials_at_once() -> PolicyConfig {
    PolicyConfig {
        mode: Mode::Retention,
        settle_periods: 1,
        warmup_periods: 0,
        retention_timeout: RetentionTimeout { ns: 20_000 },
        ..Default::default()
    }
}

/// Seen on `sysbench threads` on the haltpoll guest (2026-11-24): tens of thousands of short
/// idle periods a second, but almost no wake-up found its vCPU halted, so holding vCPUs had
/// nothing to save and every held period cost the run (`--mode retention` x1.33 the bare
/// time). With measured wake-ups, retention is tried only where halted wake-ups cost enough.
#[test]
fn retention_is_not_tried_where_no_wake_up_finds_a_halted_vcpu() {
    let cfg = retention_trials_at_once();
    let all = Cpuset::first_n(2);
    let with_wakes = |halted: u64, halted_ns: u64| {
        with_wake_latencies(
            sample(&all, 2, 15_000, 5_000, 15_000, 5000),
            (10_000, 2_000),
            (halted, halted_ns),
        )
    };
    // No halted wake-up: nothing to save, never held.
    let mut g = Gleaner::new(cfg.clone(), all.clone()).unwrap();
    let ds = drive(&mut g, 10, |_| with_wakes(0, 0));
    assert!(
        ds.iter()
            .all(|d| d.retention.iter().all(|(_, a)| *a == RetentionAction::Off)),
        "{:?}",
        events(&ds)
    );
    // Many dear halted wake-ups (the BWW case): held.
    let mut g = Gleaner::new(cfg.clone(), all.clone()).unwrap();
    let d = g.step(&with_wakes(20_000, 30_000));
    assert!(
        d.retention.iter().all(|(_, a)| *a != RetentionAction::Off),
        "{:?}",
        d
    );
    // `sysbench threads`: dear halted wake-ups, one in six of all, worth 40 % of the run time
    // over all of them, but no waker ever waited for one (it always had another thread to
    // run): never held. Gleaner held this convoy from its third period on and cost it 7 %.
    let convoy = |waited: u64| {
        let mut s = with_wakes(2_000, 30_000);
        s.wake_latency.as_mut().unwrap().halted_waited = waited;
        s
    };
    let mut g = Gleaner::new(cfg.clone(), all.clone()).unwrap();
    let ds = drive(&mut g, 10, |_| convoy(0));
    assert!(
        ds.iter()
            .all(|d| d.retention.iter().all(|(_, a)| *a == RetentionAction::Off)),
        "{:?}",
        events(&ds)
    );
    // The same wake-ups with their wakers waiting (a ping-pong among busy threads): held.
    let mut g = Gleaner::new(cfg, all.clone()).unwrap();
    let d = g.step(&convoy(1_900));
    assert!(
        d.retention.iter().all(|(_, a)| *a != RetentionAction::Off),
        "{:?}",
        d
    );
}

#[test]
fn one_period_of_dear_wake_ups_does_not_start_a_consolidation_the_quiet_periods_advise_against() {
    // Lab case oltp-20us-16v-2:1-cfs: halted wake-ups cost ~12 us more than busy ones, a few
    // percent of the run time, until one period's median moved a histogram bucket and the
    // bound crossed its threshold: a 6-vCPU step cut the benchmark VM's utilization by 35 %
    // (3.6 % of the run, undone two periods later). The bound is now taken over the quiet
    // periods' wake-ups pooled.
    let all = Cpuset::first_n(4);
    let with_wakes = |halted_ns: u64, halted: u64| {
        // Figure 4(a)'s shape: both consolidation conditions hold.
        with_wake_latencies(
            sample(&all, 4, 2 * T, T, T, 10),
            (2_000, 20_000),
            (halted, halted_ns),
        )
    };
    let cheap = || with_wakes(30_000, 200); // bound 200 x 10 us / 80 ms = 2.5 %
    let dear = || with_wakes(60_000, 400); // bound 400 x 40 us / 80 ms = 20 %
    let mut g = Gleaner::new(consolidation_only(), all.clone()).unwrap();
    let mut ds = Vec::new();
    for i in 0..7 {
        ds.push(g.step(&if i == 6 { dear() } else { cheap() }));
    }
    assert!(ds.iter().all(|d| d.active == all), "{:?}", events(&ds));
    // Where the dear wake-ups are the rule, the same period starts one.
    let mut g = Gleaner::new(consolidation_only(), all.clone()).unwrap();
    let d = g.step(&dear());
    assert!(d.active.len() < 4, "{:?}", d.events);
}

/// Counts carried over from a window that no longer describes the workload
/// (`PeriodSample::stale_rates`) start nothing: on the haltpoll guest a ping-pong whose first
/// window caught both threads on one vCPU was held by polling on those counts instead of
/// consolidated. The next, freshly measured period acts.
#[test]
fn no_change_starts_on_carried_over_counts() {
    let cfg = retention_trials_at_once();
    let all = Cpuset::first_n(2);
    let bww = |stale: bool| {
        let mut s = with_wake_latencies(
            sample(&all, 2, 15_000, 5_000, 15_000, 5000),
            (10_000, 2_000),
            (20_000, 30_000),
        );
        s.stale_rates = stale;
        s
    };
    let mut g = Gleaner::new(cfg, all.clone()).unwrap();
    let d = g.step(&bww(true));
    assert!(
        d.retention.iter().all(|(_, a)| *a == RetentionAction::Off) && d.events.is_empty(),
        "{d:?}"
    );
    let d = g.step(&bww(false));
    assert!(
        d.retention.iter().all(|(_, a)| *a != RetentionAction::Off),
        "{d:?}"
    );
}

/// The simulator's fig7 (dedup beside matmul on a shared host), the lab-derived case of the
/// idle ages: the dedup VM's vCPUs lose a few percent to steal and idle 300 µs on average,
/// so the hold rule that goes by the mean and by steal refused every hold, while most
/// wake-ups came within 20 µs of their vCPU's halt (the rest of each idle period is the
/// halted vCPU waiting for the host). The best static settings held those vCPUs (8 held:
/// dedup 0.64 -> 0.71 of its solo run, the system 1.37 -> 1.47); with the wake-ups' idle ages
/// the policy holds them too, at the break-even hold, and still refuses where the ages say
/// most holds would time out.
#[test]
fn under_steal_a_hold_is_tried_where_the_wake_ups_come_within_it() {
    let cfg = retention_trials_at_once();
    let all = Cpuset::first_n(2);
    let shared = |young: u64, old: u64, with_ages: bool| {
        // 100 µs of work then 300 µs idle, 250 times a period (2,500 idle periods/s per
        // vCPU); 3 % of each vCPU's time stolen.
        let mut s = with_wake_latencies(
            sample(&all, 2, 100_000, 300_000, 100_000, 250),
            (100, 11_000),
            (young + old, 88_000),
        );
        for v in &mut s.vcpus {
            v.steal_ns = s.period_ns * 3 / 100;
        }
        let w = s.wake_latency.as_mut().unwrap();
        w.halted_waited = young + old;
        if with_ages {
            for _ in 0..young {
                w.idle_age.record(8_000);
            }
            for _ in 0..old {
                w.idle_age.record(60_000);
            }
        }
        s
    };
    let held = |d: &Decision| {
        d.retention
            .iter()
            .all(|(_, a)| *a == RetentionAction::Retain { timeout_ns: 20_000 })
    };
    // 350 of the 500 idle periods end within 8 µs: held, for the break-even 20 µs.
    let mut g = Gleaner::new(cfg.clone(), all.clone()).unwrap();
    let d = g.step(&shared(350, 150, true));
    assert!(held(&d), "{d:?}");
    // The same without the ages (procfs, or an older Gleaner): the mean and the steal rule.
    let mut g = Gleaner::new(cfg.clone(), all.clone()).unwrap();
    let ds = drive(&mut g, 5, |_| shared(350, 150, false));
    assert!(
        ds.iter()
            .all(|d| d.retention.iter().all(|(_, a)| *a == RetentionAction::Off)),
        "{:?}",
        events(&ds)
    );
    // Most wake-ups come 60 µs in: a 20 µs hold would mostly time out, never held.
    let mut g = Gleaner::new(cfg, all.clone()).unwrap();
    let ds = drive(&mut g, 5, |_| shared(100, 400, true));
    assert!(
        ds.iter()
            .all(|d| d.retention.iter().all(|(_, a)| *a == RetentionAction::Off)),
        "{:?}",
        events(&ds)
    );
}

/// The simulator's fig7 again, consolidated: the dedup VM on 4 of its 16 vCPUs waited
/// 100-1,100 µs for a halted vCPU against 19 µs for a held one, and its 20 µs holds caught
/// 30-40 % of the idle periods. A fixed half refused and stopped those holds, while holding
/// there was worth 14 % of the VM's throughput (4 vCPUs with and without retention, seed 2);
/// a hit now pays for as many misses as it saves holds. Where a halted vCPU wakes nearly as
/// fast as a held one, a third is still too few.
#[test]
fn a_hold_that_catches_a_third_is_tried_where_each_catch_saves_many_holds() {
    let cfg = retention_trials_at_once();
    let all = Cpuset::first_n(2);
    // A third of the idle periods end within 8 µs of the halt.
    let consolidated = |halted_ns: u64| holdable(&all, halted_ns, |i| i % 3 == 0);
    let held = |d: &Decision| d.retention.iter().all(|(_, a)| *a != RetentionAction::Off);
    let mut g = Gleaner::new(cfg.clone(), all.clone()).unwrap();
    let d = g.step(&consolidated(400_000));
    assert!(held(&d), "{d:?}");
    let mut g = Gleaner::new(cfg, all.clone()).unwrap();
    let ds = drive(&mut g, 5, |_| consolidated(30_000));
    assert!(ds.iter().all(|d| !held(d)), "{:?}", events(&ds));
}

/// The ping-pong on a guest with cpuidle driver `none`, from its `gleaner run` timeline
/// (2026-11-25): each vCPU computes ~6.6 us then idles ~6.8 us, 68,000 times a second;
/// 12,000 halted wake-ups a period at ~6 us, as fast as the ~200 on running vCPUs (the host
/// polls a freshly halted vCPU), half of them hand-offs. One vCPU ran it 2.1-2.4x faster,
/// but the halted-over-running extra bounded the gain at 0 and the end-to-end test failed
/// there. Hand-offs now count their whole latency where halted wake-ups are that fast; where
/// the wakers run on (no hand-offs), or the halted wake-ups are dearer than the probe's
/// break-even, nothing changes.
#[test]
fn a_ping_pong_whose_host_polls_halted_vcpus_is_consolidated_by_its_hand_offs() {
    let all = Cpuset::first_n(2);
    let break_even = 21_000;
    let pingpong = |hand_offs: u64, halted_ns: u64| {
        let mut s = with_wake_latencies(
            sample(&all, 2, 6_600, 6_800, 6_500, 7_400),
            (200, 9_000),
            (12_000, halted_ns),
        );
        let w = s.wake_latency.as_mut().unwrap();
        w.halted_waited = hand_offs;
        w.halted_hand_offs = hand_offs;
        s
    };
    let cfg = PolicyConfig {
        retention_timeout: RetentionTimeout { ns: break_even },
        ..consolidation_only()
    };
    let run = |hand_offs: u64, halted_ns: u64| {
        let mut g = Gleaner::new(cfg.clone(), all.clone()).unwrap();
        drive(&mut g, 6, |_| pingpong(hand_offs, halted_ns))
    };
    let ds = run(6_000, 6_000);
    assert!(ds.iter().any(|d| d.active.len() == 1), "{:?}", events(&ds));
    let ds = run(0, 6_000);
    assert!(ds.iter().all(|d| d.active == all), "{:?}", events(&ds));
    // Halted wake-ups above the break-even: the host did not poll them, and the extra over
    // running ones (here none: both ~30 us) stays the measure.
    let mut g = Gleaner::new(cfg.clone(), all.clone()).unwrap();
    let ds = drive(&mut g, 6, |_| {
        let mut s = pingpong(6_000, 30_000);
        let w = s.wake_latency.as_mut().unwrap();
        w.running = LatencyHistogram::default();
        for _ in 0..200 {
            w.running.record(30_000);
        }
        s
    });
    assert!(ds.iter().all(|d| d.active == all), "{:?}", events(&ds));
}

/// On the haltpoll guest a ping-pong was held at its first decision, in a start-up period in
/// which the consolidation it needed waited for the start-up gate, and then stayed held (x0.76
/// of one vCPU, 1 of 16 runs): a hold that catches most idle periods leaves the consolidation
/// none of the halted wake-ups it is tried for. No hold starts while a consolidation meets its
/// conditions and waits only for that gate; the first change is the consolidation.
#[test]
fn no_hold_starts_while_a_consolidation_waits_for_the_start_up_gate() {
    let all = Cpuset::first_n(2);
    let mut g = Gleaner::new(PolicyConfig::default(), all.clone()).unwrap();
    let mut first_change = None;
    for i in 0..30u32 {
        // Halted wake-ups 12 µs dearer than running ones (a consolidation gain bound of
        // 12 %), 70 % of the idle periods ending within 8 µs (a hold would catch them); the
        // start-up swings +-9 %.
        let s = holdable(&g.active().clone(), 23_000, |k| k % 10 < 7);
        let d = g.step(&if i < 8 { swing(s, i, 1.09, 0.91) } else { s });
        if first_change.is_none() {
            first_change = d.events.first().map(|e| e.kind.clone());
        }
    }
    assert!(
        matches!(first_change, Some(EventKind::Deactivate { .. })),
        "{first_change:?}"
    );
}
