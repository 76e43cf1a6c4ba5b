//! End-to-end checks of the simulator on small scenarios whose outcome can be worked out by
//! hand, on the shipped scenario files, and on the command-line entry point.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

use std::path::{Path, PathBuf};

use gleaner_sim::report::VmReport;
use gleaner_sim::scenario::{load_value, set_path};
use gleaner_sim::{run, simulate, Scenario, SimArgs, SimReport};

fn scenario_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios")
        .join(name)
}

/// A shipped scenario with some fields overridden (to keep tests short).
fn shipped(name: &str, overrides: &[(&str, toml::Value)]) -> Scenario {
    let path = scenario_file(name);
    let mut value = load_value(&path).unwrap();
    for (field, v) in overrides {
        set_path(&mut value, field, v.clone()).unwrap();
    }
    Scenario::from_value(value, &path).unwrap()
}

fn inline(text: &str) -> Scenario {
    Scenario::from_str(text, Path::new("inline.toml")).unwrap()
}

fn int(v: i64) -> toml::Value {
    toml::Value::Integer(v)
}

fn vm<'a>(r: &'a SimReport, name: &str) -> &'a VmReport {
    r.vms.iter().find(|v| v.name == name).unwrap()
}

#[test]
fn table2_wake_latencies_match_the_paper() {
    // (file, expected median µs). A–C are exact by construction of the cost model; D is the
    // immediate-preemption case, and some wakes wait longer (the paper's "> 96 µs").
    for (file, expect_us) in [
        ("table2-a.toml", 6.0),
        ("table2-b.toml", 17.0),
        ("table2-c.toml", 37.0),
        ("table2-d.toml", 96.0),
    ] {
        let s = shipped(file, &[("vm.0.workload.iterations", int(300))]);
        let r = simulate(&s);
        let lat = &vm(&r, "pingpong").wake_latency;
        assert!(lat.count >= 500, "{file}: {} wakes", lat.count);
        let p50 = lat.p50_ns as f64 / 1000.0;
        assert!(
            (p50 - expect_us).abs() <= expect_us * 0.03,
            "{file}: p50 {p50} µs, expected {expect_us}"
        );
        if file == "table2-d.toml" {
            assert!(
                lat.mean_ns >= 96_000.0 && lat.min_ns == 96_000,
                "{file}: {lat:?}"
            );
        } else {
            assert_eq!(
                (lat.min_ns, lat.max_ns),
                (lat.p50_ns, lat.p50_ns),
                "{file}: every wake costs the same"
            );
        }
    }
}

/// The kernel's path out of idle to a woken thread (`costs.idle_exit_path`, part of the
/// guest switch) is in Gleaner's sample as on a real guest: neither work nor idle, so §5
/// reads it as the wake-up path (`Characteristics::l_wake_path_ns`). Before it was there the
/// simulator counted the whole switch as work and the lab never saw that path.
#[test]
fn the_path_out_of_idle_is_neither_work_nor_idle_in_the_policy_sample() {
    for (path_ns, expect_ns) in [(None, 1_400.0), (Some(0), 0.0), (Some(3_000), 3_000.0)] {
        let mut overrides = vec![("vm.0.workload.iterations", int(2_000))];
        if let Some(ns) = path_ns {
            overrides.push((
                "costs.idle_exit_path",
                toml::Value::String(format!("{ns}ns")),
            ));
        }
        let s = shipped("table2-c.toml", &overrides);
        let (r, samples) = gleaner_sim::engine::Sim::new(&s).run_keeping_samples();
        // Timing does not move: every wake-up still costs Table 2 C's 37 µs.
        assert_eq!(
            vm(&r, "pingpong").wake_latency.p50_ns,
            37_000,
            "{path_ns:?}"
        );
        let both: gleaner_policy::Cpuset = [0, 1].into_iter().collect();
        let busy: Vec<_> = samples
            .iter()
            .map(|(_, s)| gleaner_policy::characterize(s, &both))
            .filter(|c| c.idle_periods_per_sec > 1_000.0)
            .collect();
        assert!(
            busy.len() >= 3,
            "{path_ns:?}: {} ping-pong periods of {}",
            busy.len(),
            samples.len()
        );
        for c in &busy {
            // One wake-up from a halt ends each idle period.
            assert!(
                (c.l_wake_path_ns - expect_ns).abs() <= expect_ns * 0.02 + 1.0,
                "{path_ns:?}: {c:?}"
            );
        }
    }
}

/// Whether the waker waited for a halted-vCPU wake-up, as the BPF sampler counts it: in a
/// ping-pong across vCPUs every waker blocks right after its wake-up, so all of them; a
/// thread's own timer has no waker that runs on, so all of those too (the sleepy workload
/// below).
#[test]
fn halted_wake_ups_count_those_the_waker_waited_for() {
    // 2,000 round trips: long enough for several of the policy's periods.
    let s = shipped("table2-c.toml", &[]);
    let (_, samples) = gleaner_sim::engine::Sim::new(&s).run_keeping_samples();
    let mut all = gleaner_policy::WakeLatencies::default();
    for (_, sample) in &samples {
        all.merge(sample.wake_latency.as_ref().unwrap());
    }
    assert!(
        all.halted.count >= 500,
        "{} halted wake-ups",
        all.halted.count
    );
    assert_eq!(all.halted_waited, all.halted.count);
}

#[test]
fn policy_samples_split_wake_latency_by_wakee_state_and_count_progress() {
    // The sleepy workload of the retention test: a timer wake on a halted vCPU costs
    // halt_wake + vcpu_switch + guest_switch = 26 µs, on a vCPU held by retention 6 µs.
    let s = inline(
        r#"
        [sim]
        duration = "800ms"
        [host]
        pcpus = 2
        [[vm]]
        name = "sleepy"
        vcpus = 2
        guest = "retention"
        app_progress = true
        [[vm.threads]]
        count = 2
        program = [{ compute = "20us" }, { sleep = "5us" }]
        "#,
    );
    let (r, samples) = gleaner_sim::engine::Sim::new(&s).run_keeping_samples();
    // The policy's start-up periods (`Gleaner::next_period_ns`): eight of 25 ms, then 100 ms.
    assert_eq!(
        samples.len(),
        8 + 6,
        "8 start-up periods, then one per 100 ms"
    );
    let lengths: Vec<u64> = samples.iter().map(|(_, s)| s.period_ns).collect();
    assert!(lengths[..8].iter().all(|&l| l == 25_000_000), "{lengths:?}");
    assert!(
        lengths[8..].iter().all(|&l| l == 100_000_000),
        "{lengths:?}"
    );
    let mut all = gleaner_policy::WakeLatencies::default();
    for (vm_index, sample) in &samples {
        assert_eq!(*vm_index, 0);
        all.merge(
            sample
                .wake_latency
                .as_ref()
                .expect("the simulator sees every wake-up"),
        );
    }
    let bucket = gleaner_policy::LatencyHistogram::bucket_of;
    assert!(all.halted.count > 0 && all.polling.count > 0, "{all:?}");
    assert_eq!(
        all.halted.buckets[bucket(26_000)],
        all.halted.count,
        "halted wakes cost 26 µs"
    );
    assert_eq!(
        all.polling.buckets[bucket(6_000)],
        all.polling.count,
        "held wakes cost 6 µs"
    );
    assert_eq!(all.running.count, 0, "no thread wakes another here");
    assert_eq!(
        all.halted_waited, all.halted.count,
        "nobody runs on while a timer wake-up of a halted vCPU waits"
    );
    // Each vCPU runs one thread, so every wake-up is the first of its vCPU's idle period,
    // and comes as the 5 µs sleep ends: a hold just over 5 µs would catch every one.
    assert_eq!(
        all.idle_age.count,
        all.halted.count + all.polling.count,
        "{all:?}"
    );
    assert_eq!(
        all.idle_age.buckets[bucket(5_000)],
        all.idle_age.count,
        "every wake-up came 5 µs into its idle period"
    );
    // Progress is the compute completed, in µs: 20 µs per iteration of each thread.
    let progress: u64 = samples
        .iter()
        .map(|(_, s)| s.progress.expect("the simulator counts work done"))
        .sum();
    let v = vm(&r, "sleepy");
    // Each of the 2 threads may have finished its burst but not yet its sleep.
    assert!(
        (0..=2).contains(&((v.completed_work_ns - 20_000 * v.iterations) / 20_000)),
        "{v:?}"
    );
    let done_us = v.completed_work_ns / 1_000;
    assert!(
        progress <= done_us && progress + 2 * 20 >= done_us,
        "{progress} of {done_us} µs"
    );
}

#[test]
fn two_vcpus_on_one_pcpu_switch_every_half_latency() {
    // CFS with two always-busy tasks: each runs sched_latency / 2 = 12 ms. Over 246 ms: the
    // first pick at 0, then a switch at 12, 24, ..., 240 ms: 21 switch-ins. A wakeup
    // granularity of one full latency rules out a preemption at time 0 whatever the initial
    // vruntimes are.
    let s = inline(
        r#"
        [sim]
        duration = "246ms"
        [host]
        pcpus = 1
        wakeup_granularity = "24ms"
        [[vm]]
        vcpus = 2
        [[vm.threads]]
        count = 2
        program = [{ compute = "1ms" }]
        "#,
    );
    let r = simulate(&s);
    assert_eq!(r.host.vcpu_switches, 21);
    let v = &r.vms[0];
    let mut ins: Vec<u64> = v.vcpus.iter().map(|c| c.switches_in).collect();
    ins.sort();
    assert_eq!(ins, vec![10, 11]);
    // Each vCPU waited while the other ran: steal is the other's run time, ~half of 246 ms.
    for c in &v.vcpus {
        assert!(
            (110_000_000..=136_000_000).contains(&c.steal_ns),
            "steal {}",
            c.steal_ns
        );
        assert_eq!(c.halts, 0);
    }
    // Every switch pays the switch cost; switching between different vCPUs also the refill.
    let overhead: u64 = v.vcpus.iter().map(|c| c.overhead_ns).sum();
    assert_eq!(overhead, 21 * 8_000 + 21 * 59_000);
}

/// VMs of `vcpus[i]` vCPUs, each vCPU's one thread always computing, on `pcpus` pCPUs.
fn cpu_bound_vms(duration: &str, pcpus: usize, vcpus: &[usize]) -> Scenario {
    let mut text = format!("[sim]\nduration = \"{duration}\"\n[host]\npcpus = {pcpus}\n");
    for (i, n) in vcpus.iter().enumerate() {
        text += &format!(
            "[[vm]]\nname = \"vm{i}\"\nvcpus = {n}\n[[vm.threads]]\ncount = {n}\nprogram = [{{ compute = \"1ms\" }}]\n"
        );
    }
    inline(&text)
}

#[test]
fn always_busy_vcpus_share_an_oversubscribed_host_fairly() {
    // Six always-busy vCPUs on four pCPUs settle two to a queue on two pCPUs and one on the
    // others; moving one vCPU only swaps that, but the kernel's failed balances end up moving
    // one anyway, so over time the vCPUs take turns and each VM gets its vCPUs' share: 2 of
    // 6 vCPUs, 4/6 × 2 = 1.33 pCPUs. Without the turns, whoever the start-up placed alone
    // keeps a pCPU to itself (the 2-vCPU VM ran 0.99 pCPUs: its two vCPUs shared queues for good).
    let r = simulate(&cpu_bound_vms("4s", 4, &[2, 4]));
    let pcpus = |i: usize| r.vms[i].completed_work_ns as f64 / r.simulated_ns as f64;
    assert!(
        (1.2..=1.47).contains(&pcpus(0)),
        "small VM ran {:.2} pCPUs, large {:.2}",
        pcpus(0),
        pcpus(1)
    );
    assert!(r.host.migrations > 0);

    // Two equal VMs, four vCPUs on three pCPUs: a turn taken by the same vCPU each time (a
    // pull in step with the queues' slices) would leave one VM with most of the waiting.
    let r = simulate(&cpu_bound_vms("20s", 3, &[2, 2]));
    for v in &r.vms {
        let steal = v.steal_ns as f64 / (2.0 * r.simulated_ns as f64);
        assert!(
            (0.22..=0.28).contains(&steal),
            "{}: {:.1} % steal, fair is 25 %",
            v.name,
            steal * 100.0
        );
    }
}

#[test]
fn strict_gang_runs_siblings_together_relaxed_backfills() {
    // Two 2-vCPU VMs on 2 pCPUs, one always busy, one pingponging (halting often). Strict
    // co-scheduling never lets the busy VM onto a pCPU during the pingpong VM's slot, so it
    // gets exactly its half; relaxed lets it use the idle pCPU time of the other slot.
    let text = |policy: &str| {
        format!(
            r#"
            [sim]
            duration = "240ms"
            [host]
            pcpus = 2
            policy = "{policy}"
            [[vm]]
            name = "pp"
            vcpus = 2
            workload = {{ preset = "pingpong", iterations = 1000000, work = "30us" }}
            [[vm]]
            name = "busy"
            vcpus = 2
            workload = {{ preset = "matmul", chunk = "1ms" }}
            "#
        )
    };
    let strict = simulate(&inline(&text("cosched-strict")));
    let relaxed = simulate(&inline(&text("cosched-relaxed")));
    // Slot = 24 ms / 2 VMs = 12 ms; 240 ms = 20 slots, 10 each.
    assert_eq!(strict.host.gang_slots, 20);
    let busy_strict = vm(&strict, "busy").work_ns;
    let busy_relaxed = vm(&relaxed, "busy").work_ns;
    assert!(
        busy_strict <= 2 * 120_000_000,
        "strict: at most its own slots ({busy_strict})"
    );
    assert!(
        busy_relaxed > busy_strict + 40_000_000,
        "relaxed backfills: {busy_relaxed} vs {busy_strict}"
    );
}

#[test]
fn coscheduling_removes_lock_holder_preemption() {
    let s = |policy: &str| {
        shipped(
            "spinlock-rq6.toml",
            &[
                ("sim.duration", toml::Value::String("400ms".into())),
                ("host.policy", toml::Value::String(policy.into())),
            ],
        )
    };
    let ple = |r: &SimReport| vm(r, "spin").vcpus.iter().map(|c| c.ple_exits).sum::<u64>();
    let cfs = simulate(&s("cfs"));
    let strict = simulate(&s("cosched-strict"));
    let sbco = simulate(&s("sbco"));
    assert!(
        ple(&cfs) > 10,
        "CFS preempts lock holders: {} PLE exits",
        ple(&cfs)
    );
    assert!(cfs.host.directed_yields > 0);
    assert_eq!(ple(&strict), 0, "siblings always run together");
    assert!(
        sbco.host.sbco_boosts > 0,
        "SBCO rebalances siblings far apart"
    );
}

/// Table 2's setting C (a ping-pong across two vCPUs) with 20 µs of work per hand-off: vCPU
/// idle periods of ~60 µs, where polling or holding pays.
fn table2_c_20us() -> Scenario {
    shipped(
        "table2-c.toml",
        &[
            ("vm.0.workload.iterations", int(500)),
            ("vm.0.workload.work", toml::Value::String("20us".into())),
        ],
    )
}

#[test]
fn haltpoll_polls_away_short_idle_periods() {
    // Setting C with 20 µs of work per hand-off: vCPU idle periods are ~60 µs, under the
    // 200 µs haltpoll maximum, so after the first wake the poll limit grows to 50–100 µs and
    // later wakes find the vCPU polling: poll_wake + guest_switch = 7 µs, no halts.
    let none = table2_c_20us();
    let mut poll = none.clone();
    poll.vms[0].guest = gleaner_sim::scenario::GuestPolicy::Haltpoll;
    let (r_none, r_poll) = (simulate(&none), simulate(&poll));
    let (a, b) = (vm(&r_none, "pingpong"), vm(&r_poll, "pingpong"));
    assert_eq!(a.wake_latency.p50_ns, 37_000);
    assert_eq!(b.wake_latency.p50_ns, 7_000);
    assert!(b.vcpus.iter().map(|c| c.halts).sum::<u64>() < 10);
    assert!(b.run_time_ns < a.run_time_ns);
}

#[test]
fn gleaner_retention_holds_vcpus_through_short_sleeps() {
    // Threads computing 20 µs and sleeping 5 µs: each vCPU idles ~20 000 times a second for
    // ~17 µs (the sleep plus the host's kick), well under twice the 20 µs break-even hold, so
    // gleaner-policy (retention mode) turns holds on. A held vCPU then takes its timer wake
    // as a plain guest switch (6 µs) instead of halt_wake + vcpu_switch + switch (26 µs).
    let s = |guest: &str| {
        inline(&format!(
            r#"
            [sim]
            duration = "800ms"
            [host]
            pcpus = 2
            [[vm]]
            name = "sleepy"
            vcpus = 2
            guest = "{guest}"
            [[vm.threads]]
            count = 2
            program = [{{ compute = "20us" }}, {{ sleep = "5us" }}]
            "#
        ))
    };
    let off = simulate(&s("none"));
    let on = simulate(&s("retention"));
    let (a, b) = (vm(&off, "sleepy"), vm(&on, "sleepy"));
    assert_eq!(a.wake_latency.p50_ns, 26_000);
    assert!(
        b.retaining_vcpus.contains(&2),
        "retention never turned on: {:?}",
        b.policy_events
    );
    assert!(b.vcpus.iter().map(|c| c.yield_ns).sum::<u64>() > 0);
    assert!(b.vcpus.iter().map(|c| c.yield_preemptions).sum::<u64>() > 1000);
    assert_eq!(b.wake_latency.p50_ns, 6_000, "most wakes hit a held vCPU");
    assert!(b.iterations > a.iterations);
}

#[test]
fn a_guest_with_a_poll_state_holds_by_polling_without_ipis() {
    // Setting C with 20 µs of work per hand-off, a fixed hold on both vCPUs (guest `hold`):
    // on a guest without a POLL state the waker's IPI reaches the yielding thread (ipi +
    // guest switch, 17 µs); with one (`retention_polls`, PM QoS polling in the daemon) the
    // held vCPU sees the queued thread itself: poll_wake + guest switch, 7 µs, as haltpoll's,
    // and no IPI at all.
    let mut yielding = table2_c_20us();
    yielding.vms[0].guest = gleaner_sim::scenario::GuestPolicy::Hold;
    let mut polling = yielding.clone();
    polling.guest.retention_polls = true;
    let (r_yield, r_poll) = (simulate(&yielding), simulate(&polling));
    let (a, b) = (vm(&r_yield, "pingpong"), vm(&r_poll, "pingpong"));
    let ipis =
        |v: &gleaner_sim::report::VmReport| v.vcpus.iter().map(|c| c.ipis_received).sum::<u64>();
    assert!(
        ipis(a) > 900,
        "yielding holds are woken by IPIs: {}",
        ipis(a)
    );
    assert_eq!(ipis(b), 0, "polling holds need none");
    assert_eq!(b.wake_latency.p50_ns, 7_000);
    assert!(a.wake_latency.p50_ns > b.wake_latency.p50_ns);
    assert!(b.run_time_ns < a.run_time_ns);
}

#[test]
fn gleaner_consolidates_a_fine_grained_pipeline() {
    // dedup on 8 dedicated vCPUs: l_comp and g_comp are tens of µs against idle periods of
    // similar length, so Gleaner deactivates vCPUs one at a time.
    let s = inline(
        r#"
        [sim]
        duration = "1500ms"
        [host]
        pcpus = 8
        [[vm]]
        name = "dedup"
        vcpus = 8
        pin_vcpus = true
        guest = "gleaner"
        workload = { preset = "dedup", items = 1000000 }
        "#,
    );
    let r = simulate(&s);
    let v = vm(&r, "dedup");
    // One entry per period: eight start-up periods of 25 ms, then one per 100 ms.
    assert_eq!(v.active_vcpus.len(), 8 + 13);
    assert!(
        *v.active_vcpus.last().unwrap() < 8,
        "active: {:?}",
        v.active_vcpus
    );
    assert!(v
        .policy_events
        .iter()
        .any(|e| matches!(e.kind, gleaner_policy::EventKind::Deactivate { .. })));
}

#[test]
fn same_seed_same_bytes_and_seed_matters() {
    let s = shipped(
        "fig7-dedup-matmul.toml",
        &[("vm.0.workload.items", int(20_000))],
    );
    let a = serde_json::to_string(&simulate(&s)).unwrap();
    let b = serde_json::to_string(&simulate(&s)).unwrap();
    assert_eq!(a, b);
    let mut other = s.clone();
    other.seed += 1;
    assert_ne!(a, serde_json::to_string(&simulate(&other)).unwrap());
}

#[test]
fn weighted_speedup_sums_speedups_against_solo_runs() {
    let s = shipped(
        "table1-shared-matmul-4.toml",
        &[("vm.0.workload.items", int(4_000))],
    );
    let r = simulate(&s);
    let ws = r.weighted_speedup.unwrap();
    let d = vm(&r, "dedup");
    let m = vm(&r, "matmul");
    let sd = d.solo_run_time_ns.unwrap() as f64 / d.run_time_ns.unwrap() as f64;
    let sm = m.throughput_per_s / m.solo_throughput_per_s.unwrap();
    assert!((ws - (sd + sm)).abs() < 1e-9);
    // Sharing 4 pCPUs between two VMs that each want 4: each gets about half.
    assert!((0.8..1.3).contains(&ws), "weighted speedup {ws}");
}

#[test]
fn every_shipped_scenario_parses() {
    let dir = scenario_file("");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 14, "{n} scenario files");
}

#[test]
fn cli_writes_json_and_reports_bad_files_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.json");
    let args = SimArgs {
        command: None,
        scenario: Some(scenario_file("table2-c.toml")),
        sweep: Some("vm.0.workload.iterations=50,100".into()),
        out: Some(out.clone()),
        seed: Some(5),
        json: false,
    };
    run(args).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), 2);
    assert_eq!(json["runs"][1]["seed"], 5);
    assert_eq!(json["runs"][1]["vms"][0]["iterations"], 200);

    let bad = dir.path().join("bad.toml");
    for (text, needle) in [
        (
            "[host]\npcpus = \"many\"\n[[vm]]\nvcpus = 1\nworkload = { preset = \"matmul\" }\n",
            "invalid type",
        ),
        (
            "[host]\npcpus = 1\n[[vm]]\nvcpus = 1\nworkload = { preset = \"dedupe\" }\n",
            "unknown variant",
        ),
        ("[host\npcpus = 1\n", "bad.toml:1:"),
    ] {
        std::fs::write(&bad, text).unwrap();
        let args = SimArgs {
            command: None,
            scenario: Some(bad.clone()),
            sweep: None,
            out: None,
            seed: None,
            json: true,
        };
        let err = format!("{:#}", run(args).unwrap_err());
        assert!(!err.contains('\n') && err.contains(needle), "{err}");
    }
    let missing = SimArgs {
        command: None,
        scenario: Some(dir.path().join("nope.toml")),
        sweep: None,
        out: None,
        seed: None,
        json: true,
    };
    assert!(format!("{:#}", run(missing).unwrap_err()).contains("cannot read scenario"));
    let bad_sweep = SimArgs {
        command: None,
        scenario: Some(scenario_file("table2-a.toml")),
        sweep: Some("host.pcpus".into()),
        out: None,
        seed: None,
        json: true,
    };
    assert!(format!("{:#}", run(bad_sweep).unwrap_err()).contains("--sweep"));
}

#[test]
fn gleaners_idle_time_runs_from_hlt_until_the_guest_resumes() {
    // One vCPU computing 20 µs and sleeping 5 µs, retention never allowed to pay: the guest's
    // idle clock (what gleaner-linux reads from /proc/timer_list) runs for the sleep, the
    // host's kick (12 µs) and the switch-in (8 µs): 25 µs per idle period, not the 17 µs the
    // vCPU spends halted on the host.
    let s = inline(
        r#"
        [sim]
        duration = "600ms"
        [host]
        pcpus = 1
        [[vm]]
        name = "sleepy"
        vcpus = 1
        guest = "gleaner"
        [vm.gleaner]
        min_idle_periods_per_sec = 1e12
        [[vm.threads]]
        count = 1
        program = [{ compute = "20us" }, { sleep = "5us" }]
        "#,
    );
    let r = simulate(&s);
    let v = vm(&r, "sleepy");
    assert!(v.retaining_vcpus.iter().all(|&n| n == 0));
    let c = v.last_characteristics.as_ref().unwrap();
    assert!(
        (c.l_idle_ns - 25_000.0).abs() < 500.0,
        "l_idle {} ns",
        c.l_idle_ns
    );
    // Work is the compute plus the guest switch into the thread (6 µs) less its path out of
    // idle (1.4 µs, neither work nor idle); the host's switch-in happened while the guest was
    // in HLT, so none of it is counted as work.
    assert!(
        (c.l_comp_ns - 24_600.0).abs() < 500.0,
        "l_comp {} ns",
        c.l_comp_ns
    );
    assert!(
        (c.l_wake_path_ns - 1_400.0).abs() < 50.0,
        "wake-up path {} ns",
        c.l_wake_path_ns
    );
}

#[test]
fn handoff_lock_gives_the_lock_to_the_sleeping_waiter() {
    // Two threads on two dedicated vCPUs take a lock for 10 µs with 1 µs between. A barging
    // futex mutex lets the running thread take it back before the woken waiter arrives (37 µs
    // later), so few wakes succeed; a hand-off lock alternates strictly, one wake per hold.
    let s = |take: &str| {
        inline(&format!(
            r#"
            [sim]
            duration = "50ms"
            [host]
            pcpus = 2
            [[vm]]
            name = "lk"
            vcpus = 2
            pin_vcpus = true
            [[vm.threads]]
            count = 2
            program = [{{ {take} = "l" }}, {{ compute = "10us" }}, {{ unlock = "l" }}, {{ compute = "1us" }}]
            "#
        ))
    };
    let barging = simulate(&s("lock"));
    let handoff = simulate(&s("handoff_lock"));
    let (b, h) = (vm(&barging, "lk"), vm(&handoff, "lk"));
    // Hand-off: each iteration is a hold plus a wake to a halted vCPU (10 + ~37 µs + 1 µs).
    let per_iter = 50_000_000 / h.iterations.max(1);
    assert!(
        (40_000..60_000).contains(&per_iter),
        "{per_iter} ns per hand-off"
    );
    assert!(
        h.wake_latency.count + 2 >= h.iterations,
        "{} wakes, {} iterations",
        h.wake_latency.count,
        h.iterations
    );
    assert!(
        b.iterations > 2 * h.iterations,
        "barging {} vs hand-off {}",
        b.iterations,
        h.iterations
    );
}

#[test]
fn bww_is_visible_and_gleaner_consolidates_mysql() {
    // A thread woken onto a halted vCPU stays there until the host runs the vCPU (Linux's
    // idle balancing moves only threads waiting behind another), so under a co-runner every
    // such wake pays at least setting C. Timer wakes follow the normal placement, so threads
    // do not queue behind busy (host-preempted) vCPUs while others idle, and Gleaner is no
    // longer refused for "runnable wait".
    let s = |guest: &str| {
        shipped(
            "fig8-mysql.toml",
            &[
                ("sim.duration", toml::Value::String("1200ms".into())),
                ("vm.0.guest", toml::Value::String(guest.into())),
                ("vm.1.guest", toml::Value::String(guest.into())),
            ],
        )
    };
    let off = simulate(&s("none"));
    let on = simulate(&s("gleaner"));
    let (a, b) = (vm(&off, "mysql-a"), vm(&on, "mysql-a"));
    assert!(
        a.wake_latency.p50_ns >= 37_000,
        "p50 {}",
        a.wake_latency.p50_ns
    );
    assert!(
        b.policy_events
            .iter()
            .any(|e| matches!(e.kind, gleaner_policy::EventKind::Deactivate { .. })),
        "{:?}",
        b.policy_events
    );
    let c = b.last_characteristics.as_ref().unwrap();
    assert!(c.runnable_wait_fraction <= 0.10, "{c:?}");
    assert!(
        b.throughput_per_s > 1.05 * a.throughput_per_s,
        "{} vs {}",
        b.throughput_per_s,
        a.throughput_per_s
    );
}
