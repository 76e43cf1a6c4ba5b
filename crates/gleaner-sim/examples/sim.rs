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

fn main() {
    let cli = Cli::parse();
    if let Err(e) = gleaner_sim::run(cli.args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
