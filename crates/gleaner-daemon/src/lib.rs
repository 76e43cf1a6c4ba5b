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
