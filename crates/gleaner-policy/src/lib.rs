//! Gleaner's policy as pure code: per-period samples in, decisions out.
//!
//! No I/O and no clocks live here, so the daemon on Linux and the simulator drive exactly the
//! same decisions from the same numbers, and every rule of the paper can be replayed in a
//! unit test.

pub mod characteristics;
pub mod config;
pub mod cpuset;
pub mod engine;
pub mod gain;
mod judge;
pub mod observe;
pub mod retention;
pub mod sample;

pub use characteristics::{characterize, characterize_with};
pub use config::{ConfigError, Mode, PolicyConfig};
pub use cpuset::{Cpuset, CpusetParseError};
pub use engine::{Decision, EventKind, Gleaner, PolicyEvent, RetentionAction, FOREVER_NS};
pub use observe::RunSummary;
pub use retention::RetentionTimeout;
pub use sample::{
    progress_signal, Characteristics, LatencyHistogram, PeriodSample, RatesFrom, VcpuSample,
    WakeLatencies, LATENCY_BUCKETS,
};
