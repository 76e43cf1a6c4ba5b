//! Readers and writers for the `/sys` knobs Gleaner looks at or turns.
//!
//! Exists so CPU topology, the guest's idle machinery (cpuidle states, the haltpoll
//! governor's parameters) and per-CPU PM QoS resume latency are read and written one way,
//! under a root path tests point at a fake tree. Writers only write; remembering the old
//! value for restore is the caller's job (see `journal`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use gleaner_policy::Cpuset;
use serde::{Deserialize, Serialize};

use crate::error::{
    parse_num, read_cpuset, read_file, read_num, write_file, Error, Result, FIX_PM_QOS,
};

/// A sysfs mount, e.g. `SysFs::new("/sys")`.
#[derive(Debug, Clone)]
pub struct SysFs {
    root: PathBuf,
}

/// The value of `cpuN/power/pm_qos_resume_latency_us`.
///
/// The kernel prints the "no constraint" sentinel as `0` and a requested 0 µs (no idle
/// state may be used) as `n/a`; writing the same strings back sets the same values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum PmQosLatency {
    NoConstraint,
    /// 0 µs: the CPU must not enter any idle state with exit latency.
    ZeroLatency,
    Us(u32),
}

impl fmt::Display for PmQosLatency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PmQosLatency::NoConstraint => f.write_str("0"),
            PmQosLatency::ZeroLatency => f.write_str("n/a"),
            PmQosLatency::Us(us) => write!(f, "{us}"),
        }
    }
}

impl FromStr for PmQosLatency {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "n/a" => Ok(PmQosLatency::ZeroLatency),
            "0" => Ok(PmQosLatency::NoConstraint),
            t => t
                .parse::<u32>()
                .ok()
                .filter(|&us| us <= i32::MAX as u32)
                .map(PmQosLatency::Us)
                .ok_or_else(|| format!("bad PM QoS latency {t:?} (expected µs, 0 or n/a)")),
        }
    }
}

impl TryFrom<String> for PmQosLatency {
    type Error = String;
    fn try_from(s: String) -> std::result::Result<Self, String> {
        s.parse()
    }
}

impl From<PmQosLatency> for String {
    fn from(v: PmQosLatency) -> String {
        v.to_string()
    }
}

/// One CPU's idle entries and idle time since boot (over all its cpuidle states, or from the
/// kernel's own idle record, [`crate::bpf::KernelSampler::read_tick_idle`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdleTotals {
    pub entries: u64,
    pub idle_ns: u64,
}

/// Every given CPU's cpuidle `usage` and `time` files, opened once and read again each period
/// with `pread` at offset 0 (sysfs regenerates the value on each read at 0). Timed from a
/// Python loop on the haltpoll guest (two CPUs of two states): 8 µs a period, against 55 µs
/// opening and closing the eight files and 60 µs more listing the state directories. Either
/// sampler reads these every period where the driver has them: the kernel keeps them whether
/// or not anyone traces idle, so reading them costs the workload nothing (the BPF sampler's
/// `cpu_idle` program runs on the wakee's critical path).
#[derive(Debug)]
pub struct CpuidleCounters {
    /// Per CPU, per state: `(usage, time)` files and their paths (for errors).
    files: Vec<Vec<[(std::fs::File, PathBuf); 2]>>,
}

impl CpuidleCounters {
    /// Opens the counters of `cpus`; `None` when one of them has no cpuidle states.
    pub fn open(sys: &SysFs, cpus: &[usize]) -> Result<Option<Self>> {
        let mut files = Vec::with_capacity(cpus.len());
        for &cpu in cpus {
            let dirs = sys.cpuidle_state_dirs(cpu)?;
            if dirs.is_empty() {
                return Ok(None);
            }
            let mut states = Vec::with_capacity(dirs.len());
            for (_, d) in dirs {
                let open = |name: &str| {
                    let path = d.join(name);
                    std::fs::File::open(&path)
                        .map(|f| (f, path.clone()))
                        .map_err(|e| Error::io(&path, e))
                };
                states.push([open("usage")?, open("time")?]);
            }
            files.push(states);
        }
        Ok(Some(Self { files }))
    }

    /// Each CPU's totals, in the order given to [`CpuidleCounters::open`].
    pub fn read(&self) -> Result<Vec<IdleTotals>> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 32];
        let mut value = |(file, path): &(std::fs::File, PathBuf), what: &str| -> Result<u64> {
            let n = file.read_at(&mut buf, 0).map_err(|e| Error::io(path, e))?;
            let text = String::from_utf8_lossy(&buf[..n]);
            parse_num(path, what, &text)
        };
        self.files
            .iter()
            .map(|states| {
                let mut t = IdleTotals::default();
                for [usage, time] in states {
                    t.entries = t.entries.saturating_add(value(usage, "usage")?);
                    let time_us: u64 = value(time, "time")?;
                    t.idle_ns = t.idle_ns.saturating_add(time_us.saturating_mul(1_000));
                }
                Ok(t)
            })
            .collect()
    }
}

impl SysFs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn cpu_dir(&self) -> PathBuf {
        self.root.join("devices/system/cpu")
    }

    pub fn online_cpus(&self) -> Result<Cpuset> {
        read_cpuset(&self.cpu_dir().join("online"))
    }

    /// CPUs the kernel may ever bring online: what per-CPU BPF maps are sized by.
    pub fn possible_cpus(&self) -> Result<Cpuset> {
        read_cpuset(&self.cpu_dir().join("possible"))
    }

    /// The cpuidle driver, `None` when there is none (`none` or no cpuidle directory).
    pub fn cpuidle_driver(&self) -> Result<Option<String>> {
        self.optional_word(&self.cpu_dir().join("cpuidle/current_driver"))
    }

    /// The cpuidle governor: `current_governor_ro` where the kernel forbids switching it,
    /// else `current_governor`; `None` when there is none.
    pub fn cpuidle_governor(&self) -> Result<Option<String>> {
        match self.optional_word(&self.cpu_dir().join("cpuidle/current_governor_ro"))? {
            Some(g) => Ok(Some(g)),
            None => self.optional_word(&self.cpu_dir().join("cpuidle/current_governor")),
        }
    }

    fn optional_word(&self, path: &Path) -> Result<Option<String>> {
        match read_file(path) {
            Ok(t) if t.trim().is_empty() || t.trim() == "none" => Ok(None),
            Ok(t) => Ok(Some(t.trim().to_string())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Idle entries of `cpu` summed over its states (each state's `usage`); `None` when the
    /// CPU has no cpuidle states. One read of [`CpuidleCounters`], where the files are parsed.
    pub fn cpuidle_usage(&self, cpu: usize) -> Result<Option<u64>> {
        let Some(counters) = CpuidleCounters::open(self, &[cpu])? else {
            return Ok(None);
        };
        Ok(counters.read()?.first().map(|t| t.entries))
    }

    /// The name of `cpu`'s idle state `index` (`POLL`, `HALT`, `C1`, ...).
    pub fn cpuidle_state_name(&self, cpu: usize, index: usize) -> Result<String> {
        let path = self
            .cpu_dir()
            .join(format!("cpu{cpu}/cpuidle/state{index}/name"));
        Ok(read_file(&path)?.trim().to_string())
    }

    /// `(index, directory)` of each `cpuN/cpuidle/stateK`, by index; empty without cpuidle.
    fn cpuidle_state_dirs(&self, cpu: usize) -> Result<Vec<(usize, PathBuf)>> {
        let dir = self.cpu_dir().join(format!("cpu{cpu}/cpuidle"));
        let entries = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io(&dir, e)),
        };
        let mut dirs: Vec<(usize, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let index = e
                    .file_name()
                    .to_str()?
                    .strip_prefix("state")?
                    .parse()
                    .ok()?;
                Some((index, e.path()))
            })
            .collect();
        dirs.sort_by_key(|(i, _)| *i);
        Ok(dirs)
    }

    /// The id of tracepoint `group:event` (for perf), from tracefs where it is mounted
    /// (`kernel/tracing`, or the older `kernel/debug/tracing`); `None` when neither has it.
    pub fn tracepoint_id(&self, group: &str, event: &str) -> Result<Option<u64>> {
        for tracefs in ["kernel/tracing", "kernel/debug/tracing"] {
            let path = self
                .root
                .join(tracefs)
                .join(format!("events/{group}/{event}/id"));
            match read_num(&path, "tracepoint id") {
                Ok(id) => return Ok(Some(id)),
                Err(e) if e.is_not_found() || matches!(e, Error::PermissionDenied { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    fn haltpoll_dir(&self) -> PathBuf {
        self.root.join("module/haltpoll/parameters")
    }

    /// All haltpoll parameters (name → value as printed); empty when the module is absent.
    pub fn haltpoll_params(&self) -> Result<BTreeMap<String, String>> {
        let dir = self.haltpoll_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(Error::io(&dir, e)),
        };
        let mut params = BTreeMap::new();
        for entry in entries.filter_map(|e| e.ok()) {
            if let Some(name) = entry.file_name().to_str() {
                params.insert(
                    name.to_string(),
                    read_file(&entry.path())?.trim().to_string(),
                );
            }
        }
        Ok(params)
    }

    /// `cpuN/cpuidle/stateK/disable`: whether the governor may pick that state.
    pub fn cpuidle_state_disable_path(&self, cpu: usize, index: usize) -> PathBuf {
        self.cpu_dir()
            .join(format!("cpu{cpu}/cpuidle/state{index}/disable"))
    }

    pub fn cpuidle_state_disabled(&self, cpu: usize, index: usize) -> Result<bool> {
        let path = self.cpuidle_state_disable_path(cpu, index);
        let v: u8 = read_num(&path, "cpuidle state disable flag")?;
        Ok(v != 0)
    }

    pub fn set_cpuidle_state_disabled(
        &self,
        cpu: usize,
        index: usize,
        disabled: bool,
    ) -> Result<()> {
        write_file(
            &self.cpuidle_state_disable_path(cpu, index),
            if disabled { "1" } else { "0" },
        )
    }

    pub fn pm_qos_path(&self, cpu: usize) -> PathBuf {
        self.cpu_dir()
            .join(format!("cpu{cpu}/power/pm_qos_resume_latency_us"))
    }

    pub fn pm_qos_resume_latency(&self, cpu: usize) -> Result<PmQosLatency> {
        let path = self.pm_qos_path(cpu);
        let text = read_file(&path)?;
        text.parse()
            .map_err(|_| Error::parse(&path, "PM QoS resume latency", &text))
    }

    pub fn set_pm_qos_resume_latency(&self, cpu: usize, value: PmQosLatency) -> Result<()> {
        write_file(&self.pm_qos_path(cpu), &value.to_string()).map_err(|e| match e {
            Error::PermissionDenied { path, .. } => Error::PermissionDenied {
                path,
                fix: FIX_PM_QOS,
            },
            e => e,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn put(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    /// Like this guest: cpuidle dir with driver "none", no per-CPU states, haltpoll loaded.
    fn this_guest() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        put(r, "devices/system/cpu/online", "0-1\n");
        put(r, "devices/system/cpu/possible", "0-1\n");
        put(r, "devices/system/cpu/cpuidle/current_driver", "none\n");
        put(r, "devices/system/cpu/cpuidle/current_governor", "menu\n");
        for cpu in 0..2 {
            put(
                r,
                &format!("devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us"),
                "0\n",
            );
        }
        for (name, v) in [
            ("guest_halt_poll_ns", "200000"),
            ("guest_halt_poll_grow", "2"),
            ("guest_halt_poll_allow_shrink", "Y"),
        ] {
            put(
                r,
                &format!("module/haltpoll/parameters/{name}"),
                &format!("{v}\n"),
            );
        }
        dir
    }

    #[test]
    fn reads_a_guest_without_cpuidle_driver() {
        let dir = this_guest();
        let s = SysFs::new(dir.path());
        assert_eq!(s.online_cpus().unwrap().to_string(), "0-1");
        assert_eq!(s.cpuidle_driver().unwrap(), None);
        assert_eq!(s.cpuidle_governor().unwrap().as_deref(), Some("menu"));
        assert_eq!(s.cpuidle_usage(0).unwrap(), None);
    }

    #[test]
    fn reads_this_machines_sys() {
        let s = SysFs::new("/sys");
        let online = s.online_cpus().unwrap();
        assert!(!online.is_empty());
        // This guest has a POLL state under haltpoll; the project's other machines have no
        // cpuidle driver: either way the reader answers.
        for cpu in online.iter() {
            s.cpuidle_usage(cpu).unwrap();
            if let Some(c) = CpuidleCounters::open(&s, &[cpu]).unwrap() {
                c.read().unwrap();
            }
        }
        s.cpuidle_driver().unwrap();
        s.haltpoll_params().unwrap();
    }

    #[test]
    fn reads_cpuidle_states_in_index_order() {
        let dir = this_guest();
        let r = dir.path();
        for (i, name, lat) in [(1, "HALT", "1"), (0, "POLL", "0"), (10, "C6", "100")] {
            let d = format!("devices/system/cpu/cpu0/cpuidle/state{i}");
            put(r, &format!("{d}/name"), &format!("{name}\n"));
            put(r, &format!("{d}/usage"), "42\n");
            put(r, &format!("{d}/time"), "1000\n");
            put(r, &format!("{d}/latency"), &format!("{lat}\n"));
            put(
                r,
                &format!("{d}/disable"),
                if i == 10 { "1\n" } else { "0\n" },
            );
        }
        let s = SysFs::new(r);
        assert_eq!(s.cpuidle_usage(0).unwrap(), Some(3 * 42));
        let open = CpuidleCounters::open(&s, &[0]).unwrap().unwrap();
        assert_eq!(
            open.read().unwrap(),
            vec![IdleTotals {
                entries: 3 * 42,
                idle_ns: 3 * 1_000_000
            }]
        );
        assert!(CpuidleCounters::open(&s, &[1]).unwrap().is_none());
        // Kept open, the files are read again: a later value is seen.
        put(r, "devices/system/cpu/cpu0/cpuidle/state0/usage", "50\n");
        assert_eq!(
            open.read().unwrap(),
            vec![IdleTotals {
                entries: 42 + 42 + 50,
                idle_ns: 3 * 1_000_000
            }]
        );
        assert!(CpuidleCounters::open(&s, &[0, 1]).unwrap().is_none());
        assert_eq!(
            (0..2)
                .map(|i| s.cpuidle_state_name(0, i).unwrap())
                .collect::<Vec<_>>(),
            vec!["POLL", "HALT"]
        );
        assert!(s.cpuidle_state_name(0, 2).unwrap_err().is_not_found());
        put(r, "devices/system/cpu/cpu0/cpuidle/state1/usage", "lots\n");
        assert!(matches!(s.cpuidle_usage(0), Err(Error::Parse { .. })));
        put(r, "devices/system/cpu/cpu0/cpuidle/state1/usage", "42\n");
        put(r, "devices/system/cpu/cpu0/cpuidle/state0/time", "\n");
        assert!(matches!(open.read(), Err(Error::Parse { .. })));
    }

    #[test]
    fn haltpoll_params_round_trip() {
        let dir = this_guest();
        let s = SysFs::new(dir.path());
        let params = s.haltpoll_params().unwrap();
        assert_eq!(
            params.get("guest_halt_poll_ns").map(String::as_str),
            Some("200000")
        );
        assert!(SysFs::new("/nonexistent-root")
            .haltpoll_params()
            .unwrap()
            .is_empty());
    }

    #[test]
    fn pm_qos_values_round_trip_kernel_strings() {
        let dir = this_guest();
        let s = SysFs::new(dir.path());
        assert_eq!(
            s.pm_qos_resume_latency(1).unwrap(),
            PmQosLatency::NoConstraint
        );
        for v in [
            PmQosLatency::ZeroLatency,
            PmQosLatency::Us(20),
            PmQosLatency::NoConstraint,
        ] {
            s.set_pm_qos_resume_latency(1, v).unwrap();
            assert_eq!(s.pm_qos_resume_latency(1).unwrap(), v);
        }
        assert_eq!(fs::read_to_string(s.pm_qos_path(1)).unwrap(), "0");
        for bad in ["", "-1", "abc", "3000000000"] {
            assert!(bad.parse::<PmQosLatency>().is_err(), "{bad}");
        }
        let json = serde_json::to_string(&PmQosLatency::ZeroLatency).unwrap();
        assert_eq!(json, "\"n/a\"");
    }
}
