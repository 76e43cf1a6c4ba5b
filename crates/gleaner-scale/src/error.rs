//! Errors of `gleaner scale`, each a one-line message naming the problem and the fix.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ScaleError {
    #[error("no command to measure: put it after `--`, e.g. `gleaner scale -- ./my-benchmark --threads 8`")]
    MissingCommand,
    #[error("--cpus 0 is not a CPU count: use counts from 1 up to {available}")]
    ZeroCpus { available: usize },
    #[error("--cpus {requested} exceeds the {available} CPUs this process may use: use counts up to {available}")]
    TooManyCpus { requested: usize, available: usize },
    #[error("--repeat 0 would measure nothing: use --repeat 1 or more")]
    ZeroRepeat,
    #[error("command not found: {program:?} is not an executable file nor on PATH; check the spelling or give a path")]
    CommandNotFound { program: String },
    #[error("argument {argument:?} contains a NUL byte; remove it")]
    NulInArgument { argument: String },
    #[error("cannot start {program:?}: {source}; check that it is executable")]
    Exec {
        program: String,
        source: std::io::Error,
    },
    #[error("{what} failed: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{what} failed: {source}")]
    Os {
        what: &'static str,
        source: nix::Error,
    },
    #[error("the command failed ({status}) at {cpus} CPU(s), run {run}; fix the command (its stderr is shown above) before measuring it")]
    CommandFailed {
        cpus: usize,
        run: u32,
        status: String,
    },
    #[error("cannot read the CPU affinity of this process: {0}")]
    Affinity(std::io::Error),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {detail}")]
    Parse { path: PathBuf, detail: String },
    #[error("{0}")]
    System(#[from] gleaner_linux::Error),
    #[error("{path} has no entry for CPU {cpu}")]
    MissingCpu { path: PathBuf, cpu: usize },
    #[error("--metric {pattern:?} is not a valid regular expression ({detail}); fix it, e.g. --metric '{example}'", example = crate::metric::EXAMPLE_REGEX)]
    MetricRegex { pattern: String, detail: String },
    #[error("--metric {pattern:?} has no capture group for the number; put parentheses around it, e.g. --metric '{example}'", example = crate::metric::EXAMPLE_REGEX)]
    MetricNoGroup { pattern: String },
    #[error("--lower-is-better applies to a metric read from the output: add --metric NAME|REGEX, or drop it (in wall-time mode shorter is always better)")]
    LowerWithoutMetric,
    #[error("no match for --metric {metric:?} in the program's stdout at {cpus} CPU(s), run {run}; check the pattern against its output (--show-output shows it){hint}")]
    MetricNoMatch {
        metric: String,
        cpus: usize,
        run: u32,
        hint: String,
    },
    #[error("--metric {metric:?} captured {text:?} at {cpus} CPU(s), run {run}, which is not a number; make the first capture group match only the number, e.g. ([0-9.]+)")]
    MetricNotANumber {
        metric: String,
        text: String,
        cpus: usize,
        run: u32,
    },
    #[error("--metric {metric:?} read {value} at {cpus} CPU(s), run {run}; a speedup needs a positive figure: check that the first capture group takes the right number")]
    MetricNotPositive {
        metric: String,
        value: f64,
        cpus: usize,
        run: u32,
    },
    #[error(
        "cannot write the plot {path}: {detail}; check that the directory exists and is writable"
    )]
    Plot { path: PathBuf, detail: String },
}
