//! Gleaner's long-running commands as a library: `run`/`attach` (one managed workload and its
//! guard), the `daemon` service (targets from a config file, supervision, metrics), `status`,
//! `recover` and `probe`.
//!
//! Exists so that the binary crate is wiring only and so that tests (the config fuzzer, the
//! service tests) use the very code that runs, not a copy compiled through `#[path]`.

pub mod calibration;
pub mod config;
pub mod daemon;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod probe;
pub mod service;
pub mod status;
pub mod unit;

/// `println!` that ignores a closed pipe. Gleaner manages a workload while its output may be
/// piped into something that exits early (`gleaner run … | head -1`): `println!` would panic on
/// EPIPE, and a panic there leaves the workload unmanaged mid-run.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that ignores a closed pipe (see [`outln!`]); the panic hook uses it too, where
/// a second panic would abort the process.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
