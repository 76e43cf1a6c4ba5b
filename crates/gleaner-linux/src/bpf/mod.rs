//! The in-kernel sampler: loads `sampler.bpf.c` (compiled by `build.rs`), keeps its workload
//! and retention-thread maps current, and reads its per-vCPU counters.
//!
//! Why in the kernel: the procfs sampler wakes ten times a period and reads two files per
//! workload thread, so its cost grows with the thread count and each of its wake-ups is itself
//! a vCPU wake-up, the very thing Gleaner exists to avoid. Here the kernel counts as events
//! happen, and one period's read is one per-CPU map lookup; and only here can each wake-up be
//! timed from `sched_waking`, which is what shows the blocked-waiter wakeup on the user's own
//! program.
//!
//! Loading needs root (or CAP_BPF + CAP_PERFMON) and kernel BTF (`/sys/kernel/btf/vmlinux`);
//! [`KernelSampler::load`] says why it could not, and the caller falls back to procfs.

use std::collections::HashSet;
use std::mem::MaybeUninit;
use std::path::Path;

use gleaner_policy::{LatencyHistogram, WakeLatencies, LATENCY_BUCKETS};
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject};

#[allow(clippy::all, dead_code, non_camel_case_types, non_snake_case, unused_imports, unused_qualifications)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/sampler.skel.rs"));
}

use skel::{SamplerSkel, SamplerSkelBuilder};

/// `struct cpu_stats` in sampler.bpf.c: 6 counters, 3×32 buckets, 3 counts, 3 sums.
const STATS_WORDS: usize = 6 + 3 * LATENCY_BUCKETS + 3 + 3;

/// Only CPU ids below this are scanned for idle peers (the active mask is one u64).
const MASK_CPUS: usize = 64;

/// One vCPU's cumulative counters, as the BPF program keeps them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuCounters {
    pub idle_entries: u64,
    pub idle_ns: u64,
    pub work_ns: u64,
    pub work_switches: u64,
    /// Time workload threads spent queued while another active vCPU was idle.
    pub crowded_wait_ns: u64,
    /// Tracepoint invocations on this vCPU (for the program's cost per event).
    pub events: u64,
    /// Wake-ups of workload threads that ran on this vCPU, by its state at the waking moment.
    pub wake: WakeLatencies,
}

/// Decodes one CPU's `struct cpu_stats` value (native-endian u64s); `None` if the size is
/// not the one this build expects.
pub fn parse_cpu_stats(bytes: &[u8]) -> Option<CpuCounters> {
    if bytes.len() < STATS_WORDS * 8 {
        return None;
    }
    let words: Vec<u64> = bytes.chunks_exact(8).take(STATS_WORDS).map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect();
    let hist = |class: usize| {
        let base = 6 + class * LATENCY_BUCKETS;
        let mut h = LatencyHistogram::default();
        h.buckets.copy_from_slice(&words[base..base + LATENCY_BUCKETS]);
        h.count = words[6 + 3 * LATENCY_BUCKETS + class];
        h.sum_ns = words[6 + 3 * LATENCY_BUCKETS + 3 + class];
        h
    };
    Some(CpuCounters {
        idle_entries: words[0],
        idle_ns: words[1],
        work_ns: words[2],
        work_switches: words[3],
        crowded_wait_ns: words[4],
        events: words[5],
        wake: WakeLatencies { running: hist(0), polling: hist(1), halted: hist(2) },
    })
}

/// The active vCPUs as the program's bit mask (CPU ids ≥ 64 are not scanned).
pub fn active_mask(cpus: impl IntoIterator<Item = usize>) -> u64 {
    cpus.into_iter().filter(|&c| c < MASK_CPUS).fold(0, |m, c| m | (1u64 << c))
}

/// Why the in-kernel sampler is not running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The loaded and attached BPF sampler. Dropping it detaches and unloads everything.
pub struct KernelSampler {
    skel: SamplerSkel<'static>,
    /// Thread groups this side put in `workload_tgids` (fork adds children on its own).
    tgids: HashSet<u32>,
}

/// Sends libbpf's messages to the debug log: a failed load is reported once, by the caller,
/// and libbpf's own lines would otherwise land on stderr.
fn libbpf_to_tracing(level: libbpf_rs::PrintLevel, msg: String) {
    let msg = msg.trim_end();
    match level {
        libbpf_rs::PrintLevel::Warn => tracing::debug!(target: "libbpf", "{msg}"),
        _ => tracing::trace!(target: "libbpf", "{msg}"),
    }
}

impl KernelSampler {
    /// Loads and attaches the program. `poll_state` is the cpuidle state index that polls
    /// (`POLL`), if the driver has one; `sys_root` is where kernel BTF is looked for.
    pub fn load(sys_root: &Path, poll_state: Option<usize>, nr_cpus: usize) -> Result<Self, Unavailable> {
        let btf = sys_root.join("kernel/btf/vmlinux");
        if !btf.exists() {
            return Err(Unavailable(format!("the kernel has no BTF ({} is missing)", btf.display())));
        }
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, libbpf_to_tracing)));
        // The skeleton borrows its object storage for as long as it lives; a sampler lives as
        // long as the daemon, so the storage (one pointer) is leaked rather than made
        // self-referential.
        let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let why = |what: &str, e: libbpf_rs::Error| {
            let hint = if e.kind() == libbpf_rs::ErrorKind::PermissionDenied { " (needs root, or CAP_BPF and CAP_PERFMON)" } else { "" };
            Unavailable(format!("cannot {what} the BPF sampler: {e}{hint}"))
        };
        let mut open = SamplerSkelBuilder::default().open(storage).map_err(|e| why("open", e))?;
        let rodata = open.maps.rodata_data.as_deref_mut().ok_or_else(|| Unavailable("the BPF sampler has no read-only data section".into()))?;
        rodata.poll_state = poll_state.map(|i| i as i32).unwrap_or(-1);
        rodata.scan_cpus = nr_cpus.min(MASK_CPUS) as u32;
        let mut skel = open.load().map_err(|e| why("load", e))?;
        skel.attach().map_err(|e| why("attach", e))?;
        Ok(Self { skel, tgids: HashSet::new() })
    }

    /// Makes `workload_tgids` hold exactly `pids` (plus children the kernel side added on
    /// fork since). Only changes are written: nothing per period for a stable workload.
    pub fn set_workload(&mut self, pids: &[u32]) {
        let now: HashSet<u32> = pids.iter().copied().collect();
        for gone in self.tgids.difference(&now) {
            let _ = self.skel.maps.workload_tgids.delete(&gone.to_ne_bytes());
        }
        for new in now.difference(&self.tgids) {
            if let Err(e) = self.skel.maps.workload_tgids.update(&new.to_ne_bytes(), &[1u8], MapFlags::ANY) {
                tracing::debug!("cannot add process {new} to the BPF sampler's workload: {e}");
            }
        }
        self.tgids = now;
    }

    /// Gleaner's retention threads: a vCPU running one counts as polling, not busy.
    pub fn set_retention_threads(&mut self, tids: &[i32]) {
        for tid in tids.iter().filter(|&&t| t > 0) {
            let _ = self.skel.maps.retention_tids.update(&(*tid as u32).to_ne_bytes(), &[1u8], MapFlags::ANY);
        }
    }

    /// The vCPUs the workload may run on now (for runnable-wait accounting).
    pub fn set_active(&mut self, cpus: impl IntoIterator<Item = usize>) {
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            bss.active_mask = active_mask(cpus);
        }
    }

    /// Every possible CPU's cumulative counters, indexed by CPU id: one map lookup.
    pub fn read(&self) -> Result<Vec<CpuCounters>, Unavailable> {
        let values = self
            .skel
            .maps
            .stats
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| Unavailable(format!("cannot read the BPF sampler's counters: {e}")))?
            .ok_or_else(|| Unavailable("the BPF sampler's counter map is empty".into()))?;
        values.iter().map(|v| parse_cpu_stats(v).ok_or_else(|| Unavailable(format!("BPF counter value of {} bytes, expected {}", v.len(), STATS_WORDS * 8)))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn decodes_counters_and_histograms_in_the_programs_layout() {
        let mut w = vec![0u64; STATS_WORDS];
        w[..6].copy_from_slice(&[3, 4_000, 5_000, 6, 7, 8]);
        w[6 + 12] = 2; // running, bucket 12
        w[6 + LATENCY_BUCKETS + 13] = 5; // polling, bucket 13
        w[6 + 2 * LATENCY_BUCKETS + 16] = 1; // halted, bucket 16
        let counts = 6 + 3 * LATENCY_BUCKETS;
        w[counts..counts + 3].copy_from_slice(&[2, 5, 1]);
        w[counts + 3..counts + 6].copy_from_slice(&[9_000, 50_000, 70_000]);
        let c = parse_cpu_stats(&encode(&w)).unwrap();
        assert_eq!((c.idle_entries, c.idle_ns, c.work_ns, c.work_switches, c.crowded_wait_ns, c.events), (3, 4_000, 5_000, 6, 7, 8));
        assert_eq!((c.wake.running.buckets[12], c.wake.running.count, c.wake.running.sum_ns), (2, 2, 9_000));
        assert_eq!((c.wake.polling.buckets[13], c.wake.polling.count), (5, 5));
        assert_eq!((c.wake.halted.buckets[16], c.wake.halted.sum_ns), (1, 70_000));
        assert_eq!(c.wake.total_count(), 8);
        // A value of another size (a stale build) is refused rather than misread.
        assert!(parse_cpu_stats(&encode(&w[..STATS_WORDS - 1])).is_none());
    }

    #[test]
    fn active_mask_sets_one_bit_per_cpu_below_64() {
        assert_eq!(active_mask([0, 1, 3]), 0b1011);
        assert_eq!(active_mask([63, 64, 200]), 1u64 << 63);
        assert_eq!(active_mask([]), 0);
    }

    /// Loads the real program where the machine allows it: root and kernel BTF. Elsewhere it
    /// prints why it skipped.
    #[test]
    fn loads_and_counts_idle_and_wakeups_where_bpf_is_available() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("loads_and_counts_idle_and_wakeups_where_bpf_is_available: skipped: needs root");
            return;
        }
        let nr = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let mut k = match KernelSampler::load(Path::new("/sys"), None, nr) {
            Ok(k) => k,
            Err(why) => {
                eprintln!("loads_and_counts_idle_and_wakeups_where_bpf_is_available: skipped: {why}");
                return;
            }
        };
        k.set_workload(&[std::process::id()]);
        k.set_active(0..nr);
        let before: u64 = k.read().unwrap().iter().map(|c| c.events).sum();
        // Ping-pong between two threads of this process: each hand-off is a wake-up of a
        // workload thread the program must time.
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        let (tx2, rx2) = std::sync::mpsc::channel::<u32>();
        let t = std::thread::spawn(move || {
            for v in rx.iter() {
                if tx2.send(v).is_err() {
                    break;
                }
            }
        });
        for i in 0..200 {
            tx.send(i).unwrap();
            rx2.recv().unwrap();
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        drop(tx);
        t.join().unwrap();
        let after = k.read().unwrap();
        let events: u64 = after.iter().map(|c| c.events).sum();
        let wakes: u64 = after.iter().map(|c| c.wake.total_count()).sum();
        let switches: u64 = after.iter().map(|c| c.work_switches).sum();
        let idle: u64 = after.iter().map(|c| c.idle_entries).sum();
        eprintln!("BPF sampler loaded: {} events, {wakes} wake-ups timed, {switches} workload switches, {idle} idle entries", events - before);
        assert!(events > before);
        assert!(wakes >= 200, "{wakes} wake-ups timed for 400 hand-offs");
        assert!(switches >= 200, "{switches}");
        let work: u64 = after.iter().map(|c| c.work_ns).sum();
        assert!(work > 0);
    }
}
