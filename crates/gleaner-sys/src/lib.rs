//! The Linux system-call wrappers that more than one Gleaner crate needs.
//!
//! Exists because the same calls (thread affinity, futex wait/wake, monotonic and CPU-time
//! clocks, scheduling policy, waiting for a process to exit) were written separately in the Linux side, the workloads and
//! the speed-up tool, with small differences (CPU-count limits, ignored errors, libc
//! wrappers that are stubs on musl). Each is written once here, as a safe function over
//! `unsafe` code that states why it is sound. This crate is a leaf: it depends only on
//! `libc` and on `gleaner-policy` for the [`Cpuset`](gleaner_policy::Cpuset) type, so every
//! other crate may use it without a dependency arrow running back up.

pub mod affinity;
pub mod clock;
pub mod futex;
pub mod sched;
pub mod wait;

/// Collapses an error chain printed over several lines (`{e:#}`, TOML diagnostics) into one
/// line, as every command-line entry point prints its errors.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_line_joins_words_with_single_spaces() {
        assert_eq!(super::one_line("a\n  b\tc \n"), "a b c");
        assert_eq!(super::one_line(""), "");
    }
}
