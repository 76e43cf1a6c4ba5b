//! Run the simulator without the `gleaner` binary: `cargo run -p gleaner-sim --release
//! --example sim -- scenarios/table2-c.toml`. Same arguments as `gleaner sim`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

use clap::Parser;

#[derive(Parser)]
#[command(about = "Discrete-event simulator of host and guest scheduling (gleaner sim)")]
struct Cli {
    #[command(flatten)]
    args: gleaner_sim::SimArgs,
}

/// Where `sim lab` runs, for its results files, as `gleaner sim lab` reports it.
fn machine() -> gleaner_sim::lab::Machine {
    let procfs = gleaner_linux::ProcFs::new("/proc");
    let sysfs = gleaner_linux::SysFs::new("/sys");
    gleaner_sim::lab::Machine {
        kernel: procfs.kernel_release().ok(),
        cpuidle_driver: sysfs
            .cpuidle_driver()
            .ok()
            .map(|d| d.unwrap_or_else(|| "none".into())),
        loadavg_at_start: procfs.loadavg().ok().map(|l| [l.one, l.five, l.fifteen]),
        ..gleaner_sim::lab::Machine::here()
    }
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = gleaner_sim::run_with_machine(cli.args, machine) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
