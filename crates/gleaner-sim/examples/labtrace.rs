//! What the policy did, period by period, in one policy-lab scenario: `cargo run --release -p
//! gleaner-sim --example labtrace -- SCENARIO [CONFIG...]` (SCENARIO: a lab scenario's name or
//! a unique part of it; CONFIG: lab configuration labels, default `gleaner none`). Prints each
//! period's active and held vCPUs, utilization, compute completed (the benchmark VM's
//! progress) and the policy's events, for reading why a scenario's regret is what it is. A
//! SCENARIO ending in `.toml` is a scenario file, run with the guest policies it names. With
//! `--draw SEED` first, SCENARIO is looked for in the population `gleaner sim lab --draw SEED`
//! draws (as many as it draws by default).

use std::io::Write;

use gleaner_sim::engine::Sim;
use gleaner_sim::lab::population::{drawn_population, population, LabSet};

const USAGE: &str = "usage: labtrace [--draw SEED] SCENARIO [CONFIG...]";

fn main() {
    if let Err(e) = run() {
        eprintln!("labtrace: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let draw: Option<u64> = if args.first().map(String::as_str) == Some("--draw") {
        let seed = args.get(1).ok_or(format!("--draw needs a seed; {USAGE}"))?;
        let seed = seed
            .parse()
            .map_err(|_| format!("--draw takes an integer seed, not {seed:?}"))?;
        args.drain(..2);
        Some(seed)
    } else {
        None
    };
    let want = args
        .first()
        .filter(|a| !a.starts_with('-'))
        .ok_or(USAGE.to_string())?;
    // A scenario file runs as written (its own guest policies), e.g. scenarios/fig7-*.toml.
    if want.ends_with(".toml") {
        let scenario = gleaner_sim::scenario::Scenario::load(std::path::Path::new(want))
            .map_err(|e| format!("{want}: {e}"))?;
        let (report, samples) = Sim::new(&scenario).run_keeping_samples();
        return print_trace(want, &report, &samples);
    }
    let mut labels: Vec<String> = args[1..].to_vec();
    if labels.is_empty() {
        labels = vec!["gleaner".into(), "none".into()];
    }
    let duration = 2000 * gleaner_sim::time::MS;
    let pool: Vec<_> = match draw {
        Some(seed) => drawn_population(seed, gleaner_sim::lab::DEFAULT_DRAW_COUNT, duration),
        None => [LabSet::Tuning, LabSet::HeldOut, LabSet::Fresh]
            .into_iter()
            .flat_map(|set| population(set, duration))
            .collect(),
    };
    let scenarios: Vec<_> = pool
        .into_iter()
        .filter(|s| s.name == *want || s.name.contains(want.as_str()))
        .collect();
    if scenarios.is_empty() {
        return Err(format!(
            "no lab scenario matches {want:?} (a name or part of one from `gleaner sim lab`'s tables; add --draw SEED for a drawn population)"
        ));
    }
    for s in &scenarios {
        for label in &labels {
            let Some(choice) = s.choices().into_iter().find(|c| &c.label() == label) else {
                eprintln!("{}: no configuration {label}", s.name);
                continue;
            };
            let mut choice = choice;
            // The kept samples carry the workload's progress in every configuration; the
            // policy is told it only for `gleaner+progress` (then it judges by it).
            choice.app_progress = label == "gleaner+progress";
            let scenario = s
                .build(choice, None)
                .map_err(|e| format!("{} [{label}]: {e}", s.name))?;
            let (report, samples) = Sim::new(&scenario).run_keeping_samples();
            print_trace(&format!("{} [{label}]", s.name), &report, &samples)?;
        }
    }
    Ok(())
}

/// Each period of the first VM (the benchmark VM): what the policy saw and did. A reader that
/// stops early (`| head`) ends the trace quietly.
fn print_trace(
    title: &str,
    report: &gleaner_sim::report::SimReport,
    samples: &[(usize, gleaner_policy::PeriodSample)],
) -> Result<(), String> {
    match write_trace(&mut std::io::stdout().lock(), title, report, samples) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("writing the trace: {e}"))
        }
        _ => Ok(()),
    }
}

fn write_trace(
    out: &mut impl Write,
    title: &str,
    report: &gleaner_sim::report::SimReport,
    samples: &[(usize, gleaner_policy::PeriodSample)],
) -> std::io::Result<()> {
    let vm = &report.vms[0];
    let per_s = |v: &gleaner_sim::report::VmReport| {
        v.completed_work_ns as f64 / report.simulated_ns.max(1) as f64
    };
    let others: Vec<String> = report.vms[1..]
        .iter()
        .map(|v| format!("{} {:.3}", v.name, per_s(v)))
        .collect();
    writeln!(
        out,
        "== {title} bench compute/s {:.3} vCPUs (others: {}; host migrations {})",
        per_s(vm),
        if others.is_empty() {
            "none".into()
        } else {
            others.join(", ")
        },
        report.host.migrations
    )?;
    let bench: Vec<_> = samples.iter().filter(|(v, _)| *v == 0).collect();
    for (i, (_, smp)) in bench.iter().enumerate() {
        let util = smp.work_ns();
        let idle_p: u64 = smp.vcpus.iter().map(|v| v.idle_periods()).sum();
        let steal: u64 = smp.vcpus.iter().map(|v| v.steal_ns).sum();
        let active = vm.active_vcpus.get(i).copied().unwrap_or(0);
        let held = vm.retaining_vcpus.get(i).copied().unwrap_or(0);
        let waited = smp.wake_latency.as_ref().map_or(0, |w| w.halted_waited);
        let (h, p, r) = smp.wake_latency.as_ref().map_or((0, 0, 0), |w| {
            (w.halted.count, w.polling.count, w.running.count)
        });
        let lat = smp.wake_latency.as_ref().map_or(String::new(), |w| {
            let m = |h: &gleaner_policy::LatencyHistogram| {
                h.quantile_ns(0.5)
                    .map_or("-".into(), |x| format!("{:.0}", x / 1e3))
            };
            format!(
                " p50us h/p/r {}/{}/{}",
                m(&w.halted),
                m(&w.polling),
                m(&w.running)
            )
        });
        writeln!(
            out,
            "{:3} active {:2} held {:2} util {:6.3} progress {:>8} idle/s {:>8} steal {:5.2} wakes h(waited)/p/r {h}({waited})/{p}/{r} sw {}{lat}",
            i + 1,
            active,
            held,
            util as f64 / smp.period_ns as f64,
            smp.progress.map_or("-".into(), |p| format!("{:.3}", p as f64 * 1e3 / smp.period_ns as f64)),
            idle_p * 1_000_000_000 / smp.period_ns.max(1),
            steal as f64 / smp.period_ns as f64,
            smp.work_switches,
        )?;
        for e in vm.policy_events.iter().filter(|e| e.period == i as u64 + 1) {
            writeln!(out, "      {:?}: {}", e.kind, e.reason)?;
        }
    }
    Ok(())
}
