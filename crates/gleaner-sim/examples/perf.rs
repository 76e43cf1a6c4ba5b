//! Performance benchmark (not a test): events per second, and the big configuration.
//!
//!   cargo run --release -p gleaner-sim --example perf
//!
//! 1. events/s on `scenarios/fig7-dedup-matmul.toml` (16 pCPUs, one core, no solo runs);
//! 2. `scenarios/perf-1024.toml`: 1,024 pCPUs, 64 VMs × 32 vCPUs, 1 simulated second;
//! 3. the same with twice the MySQL connections (threads), to show memory growing with threads.
//!
//! Wall times depend on what else runs: check /proc/loadavg and record it with the numbers.
//! On a shared machine, time one configuration at a time by its CPU time instead, e.g.
//! `/usr/bin/time -f '%U user %S sys' target/release/examples/perf perf-1024`: an argument
//! (`fig7`, `perf-1024` or `2x`) runs only that configuration.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

use std::path::{Path, PathBuf};
use std::time::Instant;

use gleaner_sim::{simulate, Scenario};

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios")
        .join(name)
}

/// Peak resident memory of this process so far, in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn measure(label: &str, s: &Scenario) {
    let threads: usize = s
        .vms
        .iter()
        .map(|v| v.expanded().0.iter().map(|g| g.count).sum::<usize>())
        .sum();
    let t0 = Instant::now();
    let r = simulate(s);
    let wall = t0.elapsed().as_secs_f64();
    println!(
        "{label:<28} {:>6} pCPUs {:>5} vCPUs {:>6} threads  simulated {:>7.3}s  wall {:>7.2}s  {:>11} events  {:>6.2} M events/s  peak RSS {} MiB",
        s.host.pcpus,
        s.vms.iter().map(|v| v.vcpus).sum::<usize>(),
        threads,
        r.simulated_ns as f64 / 1e9,
        wall,
        r.events,
        r.events as f64 / wall / 1e6,
        peak_rss_kib() / 1024,
    );
}

fn main() {
    if let Err(e) = run() {
        eprintln!("perf: {e:#}");
        std::process::exit(2);
    }
}

fn run() -> anyhow::Result<()> {
    let only = std::env::args().nth(1).unwrap_or_default();
    const RUNS: [&str; 3] = ["fig7", "perf-1024", "2x"];
    if !only.is_empty() && !RUNS.contains(&only.as_str()) {
        anyhow::bail!(
            "no run {only:?}: name one of {} or none for all",
            RUNS.join(", ")
        );
    }
    let measure = |key: &str, label: &str, s: &Scenario| {
        if only.is_empty() || only == key {
            measure(label, s);
        }
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average before: {}", load.trim());

    let mut fig7 = Scenario::load(&scenario("fig7-dedup-matmul.toml"))?;
    fig7.sim.weighted_speedup = false;
    measure("fig7", "fig7 dedup + matmul", &fig7);

    let big = Scenario::load(&scenario("perf-1024.toml"))?;
    measure("perf-1024", "perf-1024 (1 s)", &big);

    let mut doubled = big.clone();
    for vm in &mut doubled.vms {
        if let Some(gleaner_sim::workload::Preset::Mysql { connections }) = &mut vm.workload {
            *connections *= 2;
        }
    }
    measure("2x", "perf-1024, 2x connections", &doubled);

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average after: {}", load.trim());
    Ok(())
}
