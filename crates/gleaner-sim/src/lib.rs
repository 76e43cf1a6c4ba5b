//! `gleaner sim`: a discrete-event simulator of two-level scheduling (host CFS and its
//! co-scheduling variants below, guest schedulers and workloads above) that drives the shipped
//! Gleaner policy with the same `PeriodSample` it gets on Linux.
//!
//! It exists to study the blocked-waiter wakeup (BWW) problem where real hardware is not
//! available or not big enough: 16- to 1,024-pCPU hosts, dedicated versus shared, with and
//! without Gleaner, reproducibly (same seed, same bytes of output). See `README.md` for the
//! model, the cost defaults and their calibration to the paper's Table 2.
//!
//! Modules: [`time`] and [`queue`] (integer time, the event queue), [`rankset`] (run-queue order
//! statistics), [`host`] (CFS, BAL, SBCO, co-scheduling), [`engine`] (guests, threads, the event
//! loop, Gleaner glue), [`workload`] (thread programs and presets), [`scenario`] (TOML files and
//! sweeps), [`report`] (results), [`cli`] (`SimArgs`, `run`).

pub mod cli;
pub mod engine;
pub mod host;
pub mod lab;
pub mod queue;
pub mod rankset;
pub mod report;
pub mod scenario;
pub mod time;
pub mod workload;

pub use cli::{run, run_with_machine, SimArgs, SimCommand};
pub use report::SimReport;
pub use scenario::{Scenario, ScenarioError};

use report::speedup_of;

/// Simulate a scenario (as returned by [`Scenario::load`] / [`Scenario::from_str`], which
/// validate it). With `sim.weighted_speedup`, each VM is also simulated alone on the same host
/// with the same seed, and the report carries per-VM speedups and their sum (see [`report`]).
pub fn simulate(scenario: &Scenario) -> SimReport {
    simulate_counting(scenario).0
}

/// [`simulate`], also returning the events processed by every run it made (the solo
/// baselines included), for an events/s figure.
pub fn simulate_counting(scenario: &Scenario) -> (SimReport, u64) {
    let mut report = engine::Sim::new(scenario).run();
    let mut events = report.events;
    if scenario.sim.weighted_speedup && scenario.vms.len() > 1 {
        let mut total = Some(0.0);
        for i in 0..scenario.vms.len() {
            let solo = engine::Sim::new(&scenario.solo(i)).run();
            events += solo.events;
            let base = &solo.vms[0];
            let vm = &mut report.vms[i];
            vm.solo_run_time_ns = base.run_time_ns;
            vm.solo_throughput_per_s = Some(base.throughput_per_s);
            vm.speedup = speedup_of(vm, base.run_time_ns, base.throughput_per_s);
            total = total.zip(vm.speedup).map(|(a, b)| a + b);
        }
        report.weighted_speedup = total;
    }
    (report, events)
}
