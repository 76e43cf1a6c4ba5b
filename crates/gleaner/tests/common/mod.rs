//! What the integration tests share: recording a skip so that it shows.
//!
//! A Rust test cannot mark itself skipped at run time, and cargo hides the stderr of tests
//! that pass, so a test that returns early for want of root or a cpuset hierarchy looks like a
//! pass. Each skip is therefore also appended to `skipped-tests.log` in cargo's target tmp
//! directory, which `test.sh` empties before the run and prints at the end.

use std::io::Write;

/// Where skips are recorded (`target/tmp/skipped-tests.log`).
pub fn skip_log() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.log")
}

/// Reports that `test` did not run its checks because of `why`.
pub fn skipped(test: &str, why: &str) {
    eprintln!("{test}: skipped: {why}");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(skip_log())
    {
        let _ = writeln!(f, "{test}: {why}");
    }
}
