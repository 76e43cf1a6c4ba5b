//! Compiles the in-kernel sampler (`src/bpf/sampler.bpf.c`) with clang into a BPF object and
//! generates its Rust skeleton, as the sched-ext tools do. Needs clang (Debian: `clang`); the
//! libbpf headers come with libbpf-cargo, and the few kernel types the program uses are
//! declared in `src/bpf/vmlinux_min.h` (CO-RE relocates them at load time).

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "src/bpf/sampler.bpf.c";

fn main() -> std::process::ExitCode {
    let Some(out_dir) = env::var_os("OUT_DIR") else {
        eprintln!("build.rs: OUT_DIR is not set: run this through cargo");
        return std::process::ExitCode::FAILURE;
    };
    let out = PathBuf::from(out_dir).join("sampler.skel.rs");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let target_arch = match arch.as_str() {
        "x86_64" => "x86",
        "aarch64" => "arm64",
        other => other,
    };
    if let Err(e) = SkeletonBuilder::new()
        .source(SRC)
        .clang_args([
            format!("-D__TARGET_ARCH_{target_arch}"),
            "-Isrc/bpf".to_string(),
            "-O2".to_string(),
        ])
        .build_and_generate(&out)
    {
        eprintln!("cannot build the BPF sampler {SRC} (is clang installed? Debian: apt-get install clang libelf-dev zlib1g-dev pkg-config make): {e:#}");
        return std::process::ExitCode::FAILURE;
    }
    println!("cargo:rerun-if-changed={SRC}");
    println!("cargo:rerun-if-changed=src/bpf/vmlinux_min.h");
    std::process::ExitCode::SUCCESS
}
