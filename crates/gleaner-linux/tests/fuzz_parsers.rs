//! Fuzzing every procfs / sysfs / cgroup / journal / status reader with hostile content,
//! through the readers and through the code that runs on what they return (placement
//! detection, the idle-entry counter, PM QoS polling, the wake probe's machine facts).
//!
//! Exists because Gleaner runs as root and reads files whose content it does not control
//! (another kernel's format, a half-written file, a tampered journal). Each reader must answer
//! with a value or a clear error that names the file, never panic, hang or print megabytes.
//! The committed seed corpus (`fuzz/corpus/<target>/`: captures from the project's VM plus
//! malformed cases) is replayed whole and at every truncation point, then proptest mutates
//! those seeds (truncate, flip, splice, repeat to oversize) and throws random bytes. Runs on
//! stable Rust inside `cargo test`; `PROPTEST_CASES=N` makes a longer run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gleaner_linux::cgroup::v1::V1Mounts;
use gleaner_linux::cgroup::{CgroupV1, Placement, PlacementEnv, SchedAffinity};
use gleaner_linux::idle_entries::IdleEntryCounter;
use gleaner_linux::journal::{stale_journals, Journal};
use gleaner_linux::pmqos::{OriginalHook, PollRetention};
use gleaner_linux::procfs::{parse_mountinfo, parse_pressure, parse_proc_cgroup};
use gleaner_linux::status::read_statuses;
use gleaner_linux::sysfs::{CpuidleCounters, PmQosLatency};
use gleaner_linux::wakeprobe::machine_facts;
use gleaner_linux::{ProcFs, SysFs};
use gleaner_policy::Cpuset;
use proptest::prelude::*;

/// A reader under test: gets a fake root whose file `path` holds the fuzzed bytes, returns
/// Ok(()) or the error's message.
struct Target {
    name: &'static str,
    /// Where the fuzzed content goes, relative to the fake root.
    path: &'static str,
    run: fn(&Path) -> Result<(), String>,
}

fn proc_of(root: &Path) -> ProcFs {
    ProcFs::with_clock_ticks(root.join("proc"), 100)
}

fn msg<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

const TARGETS: &[Target] = &[
    Target {
        name: "proc_stat",
        path: "proc/stat",
        run: |r| {
            proc_of(r)
                .stat()
                .map(drop)
                .and(proc_of(r).online_cpus().map(drop))
                .map_err(msg)
        },
    },
    Target {
        name: "timer_list",
        path: "proc/timer_list",
        run: |r| {
            IdleEntryCounter::open(&r.join("nosys"), &r.join("proc"), &[0, 1]).read();
            proc_of(r).timer_list().map(drop).map_err(msg)
        },
    },
    Target {
        name: "pressure",
        path: "proc/pressure/cpu",
        run: |r| {
            gleaner_linux::procfs::read_pressure(&r.join("proc/pressure/cpu"))
                .map(drop)
                .map_err(msg)
        },
    },
    Target {
        name: "loadavg",
        path: "proc/loadavg",
        run: |r| proc_of(r).loadavg().map(drop).map_err(msg),
    },
    Target {
        name: "cpuinfo",
        path: "proc/cpuinfo",
        run: |r| proc_of(r).hypervisor_flag().map(drop).map_err(msg),
    },
    Target {
        name: "interrupts",
        path: "proc/interrupts",
        // Through the reader and through the idle-entry counter that falls back to it.
        run: |r| {
            IdleEntryCounter::open(&r.join("nosys"), &r.join("proc"), &[0, 1]).read();
            proc_of(r).wake_interrupts().map(drop).map_err(msg)
        },
    },
    Target {
        name: "proc_status",
        path: "proc/7/status",
        run: |r| {
            proc_of(r)
                .process_status(7)
                .map(|s| {
                    let _ = s.is_dying();
                })
                .map_err(msg)
        },
    },
    Target {
        name: "boot_id",
        path: "proc/sys/kernel/random/boot_id",
        run: |r| proc_of(r).boot_id().map(drop).map_err(msg),
    },
    Target {
        name: "mountinfo",
        path: "proc/self/mountinfo",
        // Through the parser and through back-end detection, which acts on what it finds.
        run: |r| {
            proc_of(r)
                .mountinfo()
                .map(drop)
                .and(gleaner_linux::detect(&proc_of(r), r).map(drop))
                .map_err(msg)
        },
    },
    Target {
        name: "task_stat",
        path: "proc/7/task/7/stat",
        run: |r| {
            let p = proc_of(r);
            let _ = fs::copy(r.join("proc/7/task/7/stat"), r.join("proc/7/stat"));
            p.task_stat(7, 7)
                .map(drop)
                .and(p.process_start_time(7).map(drop))
                .and(p.process_tree(7).map(drop))
                .map_err(msg)
        },
    },
    Target {
        name: "task_status",
        path: "proc/7/task/7/status",
        run: |r| proc_of(r).task_status(7, 7).map(drop).map_err(msg),
    },
    Target {
        name: "proc_cgroup",
        path: "proc/7/cgroup",
        run: |r| proc_of(r).cgroup_of(7).map(drop).map_err(msg),
    },
    Target {
        name: "children",
        path: "proc/7/task/7/children",
        run: |r| proc_of(r).children(7).map(drop).map_err(msg),
    },
    Target {
        name: "cpulist",
        path: "sys/devices/system/cpu/online",
        run: |r| {
            let text = String::from_utf8_lossy(
                &fs::read(r.join("sys/devices/system/cpu/online")).unwrap_or_default(),
            )
            .into_owned();
            // `CpusetParseError` quotes its whole input (gleaner-policy), so only "no panic"
            // is asserted for the direct parse; the reader's error is checked in full.
            let _ = text.parse::<Cpuset>();
            SysFs::new(r.join("sys"))
                .online_cpus()
                .map(drop)
                .map_err(msg)
        },
    },
    Target {
        name: "pm_qos",
        path: "sys/devices/system/cpu/cpu0/power/pm_qos_resume_latency_us",
        run: |r| {
            let text = String::from_utf8_lossy(
                &fs::read(r.join("sys/devices/system/cpu/cpu0/power/pm_qos_resume_latency_us"))
                    .unwrap_or_default(),
            )
            .into_owned();
            let _ = text.parse::<PmQosLatency>();
            SysFs::new(r.join("sys"))
                .pm_qos_resume_latency(0)
                .map(drop)
                .map_err(msg)
                .and(poll_retention(r))
        },
    },
    Target {
        name: "cpuidle_name",
        path: "sys/devices/system/cpu/cpu0/cpuidle/state0/name",
        run: poll_retention,
    },
    Target {
        name: "cpuidle_time",
        path: "sys/devices/system/cpu/cpu0/cpuidle/state0/time",
        run: |r| {
            // The state's usage is sane, so the fuzzed time is what gets parsed.
            let usage = r.join("sys/devices/system/cpu/cpu0/cpuidle/state0/usage");
            if !usage.exists() {
                put(&usage, b"1\n");
            }
            CpuidleCounters::open(&SysFs::new(r.join("sys")), &[0])
                .and_then(|c| c.map(|c| c.read()).transpose())
                .map(drop)
                .map_err(msg)
        },
    },
    Target {
        name: "cpuidle_usage",
        path: "sys/devices/system/cpu/cpu0/cpuidle/state0/usage",
        run: |r| {
            IdleEntryCounter::open(&r.join("sys"), &r.join("noproc"), &[0]).read();
            let sys = SysFs::new(r.join("sys"));
            sys.cpuidle_usage(0)
                .map(drop)
                .and(sys.cpuidle_state_name(0, 0).map(drop))
                .map_err(msg)
        },
    },
    Target {
        name: "tracepoint_id",
        path: "sys/kernel/tracing/events/power/cpu_idle/id",
        run: |r| {
            SysFs::new(r.join("sys"))
                .tracepoint_id("power", "cpu_idle")
                .map(drop)
                .map_err(msg)
        },
    },
    Target {
        name: "haltpoll_param",
        path: "sys/module/haltpoll/parameters/guest_halt_poll_ns",
        // Through the reader and the wake probe's machine facts, which report them.
        run: |r| {
            machine_facts(&r.join("sys"), &r.join("proc")).map_err(msg)?;
            SysFs::new(r.join("sys"))
                .haltpoll_params()
                .map(drop)
                .map_err(msg)
        },
    },
    Target {
        name: "cgroup_procs",
        path: "cg/cpuset/work/cgroup.procs",
        run: |r| with_v1(r, |cg| cg.workload_tids().map(drop).map_err(msg)),
    },
    Target {
        name: "cpuacct_usage_percpu",
        path: "cg/cpuacct/work/cpuacct.usage_percpu",
        run: |r| with_v1(r, |cg| cg.per_cpu_work_ns().map(drop).map_err(msg)),
    },
    Target {
        name: "journal",
        path: "run/1.json",
        run: |r| {
            let one = Journal::load(&r.join("run/1.json")).map(drop).map_err(msg);
            let all = stale_journals(&r.join("run"), &proc_of(r))
                .map(drop)
                .map_err(msg);
            one.and(all)
        },
    },
    Target {
        name: "status_file",
        // Named after this process, so `read_statuses` treats it as a live instance's file.
        path: "status/self.status",
        run: |r| {
            let dir = r.join("status");
            let _ = fs::rename(
                dir.join("self.status"),
                dir.join(format!("{}.status", std::process::id())),
            );
            read_statuses(&dir).map(drop).map_err(msg)
        },
    },
];

/// Checks PM QoS polling against a fake sysfs whose file under test has been written and
/// whose other files (driver, state name, QoS value) are sane; it writes nothing.
fn poll_retention(root: &Path) -> Result<(), String> {
    let cpu = root.join("sys/devices/system/cpu");
    for (file, text) in [
        (cpu.join("cpuidle/current_driver"), "haltpoll\n"),
        (cpu.join("cpu0/cpuidle/state0/name"), "POLL\n"),
        (cpu.join("cpu0/power/pm_qos_resume_latency_us"), "0\n"),
    ] {
        if !file.exists() {
            put(&file, text.as_bytes());
        }
    }
    let hook: OriginalHook = Box::new(|_| Ok(()));
    PollRetention::new(&SysFs::new(root.join("sys")), &Cpuset::first_n(1), hook)
        .map(drop)
        .map_err(msg)
}

/// Attaches the v1 back end to a fake cpuset group `cg/cpuset/work` (with cpuacct twin);
/// the file under test has already been written, the rest get sane content.
fn with_v1(root: &Path, f: impl FnOnce(&CgroupV1) -> Result<(), String>) -> Result<(), String> {
    let cpuset = root.join("cg/cpuset");
    let cpuacct = root.join("cg/cpuacct");
    for (file, text) in [
        (cpuset.join("work/cpuset.cpus"), "0-1\n"),
        (cpuset.join("work/cgroup.procs"), "7\n"),
        (cpuacct.join("work/cpuacct.usage_percpu"), "10 20\n"),
    ] {
        if !file.exists() {
            put(&file, text.as_bytes());
        }
    }
    put(
        &root.join("proc/7/task/7/stat"),
        b"7 (w) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 100 0 0\n",
    );
    let env = PlacementEnv {
        proc: proc_of(root),
        affinity: Arc::new(SchedAffinity),
        journal: None,
    };
    let mounts = V1Mounts {
        cpuset: cpuset.clone(),
        cpuacct: Some(cpuacct),
    };
    let cg = CgroupV1::attach(env, mounts, &cpuset.join("work")).map_err(msg)?;
    f(&cg)
}

fn put(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

/// Runs one target on `bytes` in a fresh fake root; fails on a bad error message.
fn check(target: &Target, bytes: &[u8]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    put(&dir.path().join(target.path), bytes);
    let outcome = std::panic::catch_unwind(|| (target.run)(dir.path()));
    let Ok(result) = outcome else {
        return Err(TestCaseError::fail(format!(
            "{}: panicked on {} bytes: {:?}",
            target.name,
            bytes.len(),
            preview(bytes)
        )));
    };
    if let Err(e) = result {
        prop_assert!(!e.trim().is_empty(), "{}: empty error message", target.name);
        // Errors quote a short snippet, never the whole (possibly huge) file.
        prop_assert!(
            e.len() <= 2048 + bytes.len().min(600),
            "{}: {}-byte error message for {} bytes of input",
            target.name,
            e.len(),
            bytes.len()
        );
    }
    Ok(())
}

fn preview(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(120)]).into_owned()
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// The committed seeds of one target.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = fs::read_dir(corpus_dir(target))
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files.iter().filter_map(|f| fs::read(f).ok()).collect()
}

#[test]
fn every_target_has_a_seed_corpus() {
    for t in TARGETS {
        assert!(
            !seeds(t.name).is_empty(),
            "no seeds in {}",
            corpus_dir(t.name).display()
        );
    }
}

/// Every seed, whole and cut at up to 64 points (a read that raced a writer).
#[test]
fn corpus_replays_whole_and_truncated() {
    for t in TARGETS {
        for seed in seeds(t.name) {
            let step = (seed.len() / 64).max(1);
            for cut in (0..=seed.len()).step_by(step).chain([seed.len()]) {
                if let Err(e) = check(t, &seed[..cut]) {
                    panic!("{e}");
                }
            }
        }
    }
}

/// Direct parsers that take text, fed the same corpora.
#[test]
fn text_parsers_replay_corpus() {
    let p = Path::new("/fuzz");
    for s in seeds("pressure") {
        let _ = parse_pressure(p, &String::from_utf8_lossy(&s));
    }
    for s in seeds("proc_cgroup") {
        let _ = parse_proc_cgroup(p, &String::from_utf8_lossy(&s));
    }
    for s in seeds("mountinfo") {
        let _ = parse_mountinfo(p, &String::from_utf8_lossy(&s));
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(usize),
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    /// Repeat the seed to make it large (an oversized file).
    Repeat(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting = prop_oneof![
        Just(b"\n".to_vec()),
        Just(b":".to_vec()),
        Just(b"-".to_vec()),
        Just(b",".to_vec()),
        Just(b" ".to_vec()),
        Just(b"(".to_vec()),
        Just(b")".to_vec()),
        Just(b"18446744073709551616".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"\0".to_vec()),
        Just(vec![0xff, 0xfe]),
        proptest::collection::vec(any::<u8>(), 1..16),
    ];
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), interesting).prop_map(|(i, v)| Mutation::Insert(i, v)),
        (2usize..400).prop_map(Mutation::Repeat),
    ]
}

fn apply(mut bytes: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        match m {
            Mutation::Truncate(i) => bytes.truncate(i % (bytes.len() + 1)),
            Mutation::Flip(i, b) if !bytes.is_empty() => {
                let n = bytes.len();
                bytes[i % n] = *b
            }
            Mutation::Flip(..) => {}
            Mutation::Insert(i, v) => {
                let at = i % (bytes.len() + 1);
                bytes.splice(at..at, v.iter().copied());
            }
            Mutation::Repeat(n) if bytes.len() * n <= 1 << 20 => bytes = bytes.repeat(*n),
            Mutation::Repeat(_) => {}
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, .. ProptestConfig::default() })]

    #[test]
    fn mutated_seeds_never_panic(target in 0..TARGETS.len(), seed in any::<usize>(), muts in proptest::collection::vec(mutation(), 1..6)) {
        let t = &TARGETS[target];
        let all = seeds(t.name);
        let base = all[seed % all.len()].clone();
        check(t, &apply(base, &muts))?;
    }

    #[test]
    fn random_bytes_never_panic(target in 0..TARGETS.len(), bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check(&TARGETS[target], &bytes)?;
    }

    #[test]
    fn cpu_lists_parse_or_explain(text in "[0-9,\\- \n]{0,40}") {
        match text.parse::<Cpuset>() {
            Ok(set) => {
                // What parses prints back in a form that parses to the same set.
                let again: Cpuset = set.to_string().parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
                prop_assert_eq!(again, set);
            }
            Err(e) => prop_assert!(e.to_string().contains("expected e.g.") || e.to_string().contains("larger than"), "{}", e),
        }
    }
}
