//! Stand-alone `gleaner scale` for trying the crate before the CLI wires it in:
//! `cargo run -p gleaner-scale --example scale -- --cpus 1,2 -- sh -c '...'`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

use clap::Parser;

#[derive(Parser)]
#[command(name = "gleaner-scale", about = "Diagnose why a program stops scaling")]
struct Cli {
    #[command(flatten)]
    args: gleaner_scale::ScaleArgs,
}

fn main() -> std::process::ExitCode {
    match gleaner_scale::run(Cli::parse().args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // `eprintln!` would panic on a closed stderr.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
