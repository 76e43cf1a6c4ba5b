//! Sets GLEANER_COMMIT (for `gleaner_build_info`) to the checkout's commit, or "unknown" when
//! built outside a git checkout (a source package). GLEANER_COMMIT in the environment wins,
//! for package builds that know their commit.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=GLEANER_COMMIT");
    let commit = std::env::var("GLEANER_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // Rebuild when HEAD moves: the HEAD file (a branch switch) and the branch's ref.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
    }
    if let (Some(common), Some(head)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ) {
        println!("cargo:rerun-if-changed={common}/{head}");
        println!("cargo:rerun-if-changed={common}/packed-refs");
    }
    println!("cargo:rustc-env=GLEANER_COMMIT={commit}");
}
