//! Bundled workloads that reproduce the synchronization patterns behind the
//! blocked-waiter wakeup (BWW) problem.
//!
//! Gleaner has to be evaluated on programs whose threads block and wake each
//! other often (the paper uses PARSEC dedup and streamcluster) next to
//! co-runners that keep vCPUs busy (matmul) or churn through idle (freqsleep).
//! Real benchmark suites are large, slow to build and not deterministic, so
//! this crate provides small parameterized stand-ins:
//!
//! | workload    | pattern                                                   |
//! |-------------|-----------------------------------------------------------|
//! | `pipeline`  | dedup: thread pools joined by bounded mutex+condvar queues |
//! | `mutex`     | threads contending for a few mutexes                      |
//! | `barrier`   | streamcluster: bulk-synchronous episodes on a barrier     |
//! | `pingpong`  | a token bounced through a raw futex; round-trip latency   |
//! | `messaging` | hackbench: sender/receiver groups over Unix sockets       |
//! | `matmul`    | CPU-bound co-runner that never blocks                     |
//! | `freqsleep` | nanosleep(1 ns) loop on every CPU                         |
//!
//! Work is a deterministic integer hash loop ([`hash::hash_work`]); results are
//! folded into a checksum, so runs bounded by counts are reproducible and tests
//! can prove every unit of work happened exactly once. `--phases` changes the
//! work granularity during a run (see [`phase`]) so Gleaner's adaptation can be
//! tested. Each workload is a library function returning a [`Report`]; the CLI
//! surface is [`WorkloadArgs`] + [`run`], wired in as `gleaner workload ...`.

mod barrier;
mod cli;
mod error;
mod freqsleep;
mod harness;
pub mod hash;
mod latency;
mod matmul;
mod messaging;
mod mutex;
pub mod phase;
mod pingpong;
mod pipeline;
mod report;

pub use barrier::{barrier, BarrierConfig};
pub use cli::{
    run, run_workload, BarrierArgs, BarrierPhases, FreqsleepArgs, MatmulArgs, MessagingArgs,
    MutexArgs, PingpongArgs, PipelineArgs, WorkloadArgs, WorkloadCommand,
};
pub(crate) use error::require_positive;
pub use error::WorkloadError;
pub use freqsleep::{freqsleep, FreqsleepConfig};
pub use matmul::{matmul, MatmulConfig, MAX_MATMUL_SIZE};
pub use messaging::{messaging, MessagingConfig, MESSAGE_BYTES};
pub use mutex::{mutex, MutexConfig};
pub use phase::{Length, Phase, PhaseSpec, PhaseSpecError};
pub use pingpong::{pingpong, PingpongConfig};
pub use pipeline::{pipeline, PipelineConfig};
pub use report::{LatencySummary, PhaseReport, Report};
