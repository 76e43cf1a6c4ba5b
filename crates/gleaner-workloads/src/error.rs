//! Errors a workload run can end with; each message names the value involved
//! and, where the user can act, the fix.

use std::io;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum WorkloadError {
    #[error("{name} must be at least 1, got 0; pass a positive value")]
    ZeroParameter { name: &'static str },
    #[error("{name} = {value} is larger than the maximum {max}; pass a smaller value")]
    TooLarge {
        name: &'static str,
        value: usize,
        max: usize,
    },
    #[error("could not start worker thread {thread}: {source}; try fewer threads")]
    Spawn { thread: String, source: io::Error },
    #[error(
        "worker thread {thread} did not finish (it panicked); this is a bug in gleaner-workloads"
    )]
    WorkerFailed { thread: String },
    #[error("{operation} on the pingpong futex failed: {source}")]
    Futex {
        operation: &'static str,
        source: io::Error,
    },
    #[error("cannot {what}: {source}; raise the open-file limit (ulimit -n) or use fewer --groups/--pairs")]
    Io { what: String, source: io::Error },
    #[error(
        "cannot write the count file {path}: {source}; give --count-file a path you can write"
    )]
    CountFile {
        path: std::path::PathBuf,
        source: io::Error,
    },
    #[error("pingpong partner thread stopped early; see its error")]
    PartnerStopped,
    #[error("pingpong sent {sent} round trips but {returned} came back; this is a bug in gleaner-workloads")]
    PingpongMismatch { sent: u64, returned: u64 },
    #[error(
        "pipeline injected {injected} items but delivered {delivered} in order ({stranded} stranded, \
         per-stage counts {stage_items:?}); this is a bug in gleaner-workloads"
    )]
    PipelineMismatch {
        injected: u64,
        delivered: u64,
        stranded: usize,
        stage_items: Vec<u64>,
    },
}

/// Rejects a zero size/count parameter by name.
pub(crate) fn require_positive(name: &'static str, value: usize) -> Result<(), WorkloadError> {
    if value == 0 {
        return Err(WorkloadError::ZeroParameter { name });
    }
    Ok(())
}
