//! Raw readers for the `/proc` files Gleaner samples and walks.
//!
//! Exists so the sampler, the placement back ends and the journal read processes and CPU
//! counters one way, from a root path that tests point at a fake tree. Readers return plain
//! structs with kernel units converted (ticks to ns); they hold no state and make no
//! decisions. Malformed or truncated content is a `Parse` error naming the file, never a panic.

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use gleaner_policy::Cpuset;

use crate::error::{parse_num, read_file, read_file_until, Error, RereadFile, Result};

const NS_PER_SEC: u128 = 1_000_000_000;

/// A `/proc` mount, e.g. `ProcFs::new("/proc")`.
#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
    clock_ticks_per_sec: u64,
}

/// Per-CPU (or aggregate) times from one `cpu` line of `/proc/stat`, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub user_ns: u64,
    pub nice_ns: u64,
    pub system_ns: u64,
    pub idle_ns: u64,
    pub iowait_ns: u64,
    pub irq_ns: u64,
    pub softirq_ns: u64,
    pub steal_ns: u64,
}

impl CpuTimes {
    /// Time the guest spent running something (not idle, not iowait, not stolen).
    pub fn busy_ns(&self) -> u64 {
        self.user_ns + self.nice_ns + self.system_ns + self.irq_ns + self.softirq_ns
    }

    pub fn total_ns(&self) -> u64 {
        self.busy_ns() + self.idle_ns + self.iowait_ns + self.steal_ns
    }

    /// Share of the time since `before` that was not idle or iowait (0..1); stolen time
    /// counts as busy, since the vCPU wanted to run.
    pub fn busy_fraction_since(&self, before: &CpuTimes) -> f64 {
        let total = self.total_ns().saturating_sub(before.total_ns());
        if total == 0 {
            return 0.0;
        }
        let idle =
            (self.idle_ns + self.iowait_ns).saturating_sub(before.idle_ns + before.iowait_ns);
        (1.0 - idle as f64 / total as f64).clamp(0.0, 1.0)
    }

    /// Share of the time since `before` that the hypervisor took from this CPU (0..1).
    pub fn steal_fraction_since(&self, before: &CpuTimes) -> f64 {
        let total = self.total_ns().saturating_sub(before.total_ns());
        if total == 0 {
            return 0.0;
        }
        self.steal_ns.saturating_sub(before.steal_ns) as f64 / total as f64
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuStat {
    pub cpu: usize,
    pub times: CpuTimes,
}

/// The parts of `/proc/stat` Gleaner uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    pub total: CpuTimes,
    pub per_cpu: Vec<CpuStat>,
    /// Context switches since boot, all CPUs.
    pub ctxt: u64,
    pub procs_running: u32,
    pub procs_blocked: u32,
}

/// One CPU's idle accounting from `/proc/timer_list` (NO_HZ tick_sched fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerListCpu {
    pub cpu: usize,
    /// Times the CPU entered the idle loop.
    pub idle_calls: u64,
    /// Times the idle loop actually stopped the tick and slept.
    pub idle_sleeps: u64,
    pub idle_sleeptime_ns: u64,
    pub iowait_sleeptime_ns: u64,
}

/// `/proc/PID/task/TID/schedstat`: the scheduler's own accounting of one thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSchedstat {
    /// Time spent running, ns.
    pub run_ns: u64,
    /// Time spent runnable but waiting for a CPU, ns.
    pub wait_ns: u64,
    /// Times the thread was switched in: its context switches, counted on the other edge
    /// (one ahead of voluntary + involuntary switches while it runs).
    pub timeslices: u64,
}

/// Pressure-stall totals from `/proc/pressure/cpu` or a cgroup's `cpu.pressure`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pressure {
    /// Cumulative µs in which at least one task was runnable but not running.
    pub some_total_us: u64,
    pub some_avg10: f64,
    /// Absent for system-wide CPU pressure on kernels before 5.13.
    pub full_total_us: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadAvg {
    pub one: f64,
    pub five: f64,
    pub fifteen: f64,
    pub runnable: u32,
    pub total_tasks: u32,
}

/// The fields of `/proc/PID/task/TID/stat` Gleaner uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStat {
    pub tid: u32,
    pub comm: String,
    pub state: char,
    pub ppid: u32,
    pub utime_ns: u64,
    pub stime_ns: u64,
    pub num_threads: u32,
    /// Start time in clock ticks since boot; with the tid it identifies a task across reuse.
    pub start_ticks: u64,
    /// CPU the task last ran on.
    pub processor: usize,
}

/// The fields of `/proc/PID/task/TID/status` (or `/proc/PID/status`) Gleaner uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStatus {
    pub tgid: u32,
    pub voluntary_ctxt_switches: u64,
    pub nonvoluntary_ctxt_switches: u64,
    pub cpus_allowed: Cpuset,
    /// The one-letter state (`R`, `S`, `Z`, ...), when the `State:` line is there.
    pub state: Option<char>,
    /// Signals pending for the thread or its whole process (`SigPnd | ShdPnd`), bit `n - 1`
    /// for signal `n`; 0 when the lines are absent.
    pub pending_signals: u64,
}

impl TaskStatus {
    /// Whether the task has exited or has a SIGKILL pending: it runs no more user code.
    pub fn is_dying(&self) -> bool {
        const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
        matches!(self.state, Some('Z' | 'X')) || self.pending_signals & SIGKILL_BIT != 0
    }
}

/// One line of `/proc/PID/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLine {
    pub hierarchy_id: u32,
    /// Empty for the cgroup v2 line (`0::/path`).
    pub controllers: Vec<String>,
    /// Path relative to the hierarchy's mount root, starting with `/`.
    pub path: String,
}

/// All lines of `/proc/PID/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessCgroups(pub Vec<CgroupLine>);

impl ProcessCgroups {
    /// The unified (v2) hierarchy path.
    pub fn v2(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|l| l.hierarchy_id == 0 && l.controllers.is_empty())
            .map(|l| l.path.as_str())
    }

    /// The v1 hierarchy path that carries `controller` (e.g. "cpuset").
    pub fn v1(&self, controller: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|l| l.controllers.iter().any(|c| c == controller))
            .map(|l| l.path.as_str())
    }
}

/// `/proc/stat` read again through one open file ([`ProcFs::stat_file`]); parsed as
/// [`ProcFs::stat`] parses it.
#[derive(Debug)]
pub struct ProcStatFile {
    file: RereadFile,
    proc: ProcFs,
}

impl ProcStatFile {
    pub fn read(&mut self) -> Result<ProcStat> {
        let proc = &self.proc;
        self.file.parse(|path, text| parse_stat(path, text, proc))
    }
}

/// A task's `stat` read again through one open file ([`ProcFs::task_stat_file`]); parsed as
/// [`ProcFs::task_stat`] parses it. `NotFound` once the task has exited.
#[derive(Debug)]
pub struct TaskStatFile {
    file: RereadFile,
    proc: ProcFs,
}

impl TaskStatFile {
    pub fn read(&mut self) -> Result<TaskStat> {
        let proc = &self.proc;
        self.file
            .parse(|path, text| parse_task_stat(path, text, proc))
    }
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Root of the mount within its file system (e.g. `/` or a cgroup namespace path).
    pub root: String,
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub super_options: Vec<String>,
}

impl ProcFs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        // SAFETY: sysconf has no preconditions; it only reads a constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        Self::with_clock_ticks(root, if hz > 0 { hz as u64 } else { 100 })
    }

    /// For fake trees whose tick values were sampled with a known USER_HZ.
    pub fn with_clock_ticks(root: impl Into<PathBuf>, clock_ticks_per_sec: u64) -> Self {
        Self {
            root: root.into(),
            clock_ticks_per_sec: clock_ticks_per_sec.max(1),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn clock_ticks_per_sec(&self) -> u64 {
        self.clock_ticks_per_sec
    }

    pub fn ticks_to_ns(&self, ticks: u64) -> u64 {
        (ticks as u128 * NS_PER_SEC / self.clock_ticks_per_sec as u128).min(u64::MAX as u128) as u64
    }

    fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.root.join(rel)
    }

    fn task_dir(&self, pid: u32, tid: u32) -> PathBuf {
        self.path(format!("{pid}/task/{tid}"))
    }

    pub fn stat(&self) -> Result<ProcStat> {
        let path = self.path("stat");
        parse_stat(&path, &read_file(&path)?, self)
    }

    /// `/proc/stat` kept open, for a reader that reads it every period.
    pub fn stat_file(&self) -> ProcStatFile {
        ProcStatFile {
            file: RereadFile::new(self.path("stat")),
            proc: self.clone(),
        }
    }

    /// CPUs listed in `/proc/stat`, which shows exactly the online ones.
    pub fn online_cpus(&self) -> Result<Cpuset> {
        Ok(self.stat()?.per_cpu.iter().map(|c| c.cpu).collect())
    }

    /// Per-CPU idle entries and idle ns. `Ok(None)` when the file cannot be read (non-root)
    /// or the kernel prints no NO_HZ idle fields.
    pub fn timer_list(&self) -> Result<Option<Vec<TimerListCpu>>> {
        let path = self.path("timer_list");
        // The kernel prints the file as it is read; the tick devices after the per-CPU
        // sections are not needed and not asked for.
        match read_file_until(&path, |line| line.starts_with("Tick Device")) {
            Ok(text) => parse_timer_list(&path, &text),
            Err(Error::NotFound { .. } | Error::PermissionDenied { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether `/proc/cpuinfo` has the x86 `hypervisor` flag (we run in a VM); `None` when it
    /// has no `flags` line (other architectures).
    pub fn hypervisor_flag(&self) -> Result<Option<bool>> {
        let text = read_file(&self.path("cpuinfo"))?;
        let mut flags = text.lines().filter(|l| l.starts_with("flags")).peekable();
        if flags.peek().is_none() {
            return Ok(None);
        }
        Ok(Some(
            flags.any(|l| l.split_whitespace().any(|w| w == "hypervisor")),
        ))
    }

    /// The running kernel's release (`sys/kernel/osrelease`), e.g. `6.1.102`.
    pub fn kernel_release(&self) -> Result<String> {
        read_word(&self.path("sys/kernel/osrelease"), "kernel release")
    }

    /// This boot's random id (`sys/kernel/random/boot_id`): what is measured once per boot is
    /// cached under it.
    pub fn boot_id(&self) -> Result<String> {
        read_word(&self.path("sys/kernel/random/boot_id"), "boot id")
    }

    /// Per-CPU counts of the interrupts one vCPU sends another to wake a thread on it: the
    /// reschedule IPIs (`RES:`, ARM's "Rescheduling interrupts") and the function-call IPIs
    /// (`CAL:`, "Function call interrupts"), summed; `Ok(None)` when the file or both rows are
    /// absent. Both count: since Linux 5.8 a wake-up of an idle CPU is queued on its wake
    /// list and sent as a function call (`ttwu_queue_wakelist`), a reschedule IPI only where
    /// the task is queued by the waker itself. A 2 s ping-pong on kernel 6.18 (2026-12-02):
    /// RES 44 and 5, CAL 132,817 and 133,134, for about 60,000 halts a second on each vCPU.
    pub fn wake_interrupts(&self) -> Result<Option<Vec<u64>>> {
        let path = self.path("interrupts");
        match read_file(&path) {
            Ok(text) => parse_wake_interrupts(&path, &text),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Load averages and task counts (`/proc/loadavg`), recorded with measurements.
    pub fn loadavg(&self) -> Result<LoadAvg> {
        let path = self.path("loadavg");
        parse_loadavg(&path, &read_file(&path)?)
    }

    pub fn mountinfo(&self) -> Result<Vec<Mount>> {
        let path = self.path("self/mountinfo");
        parse_mountinfo(&path, &read_file(&path)?)
    }

    /// All numeric entries of the proc root (process ids).
    pub fn pids(&self) -> Result<Vec<u32>> {
        numeric_entries(&self.root)
    }

    /// Thread ids of `pid`. `NotFound` when the process is gone.
    pub fn threads(&self, pid: u32) -> Result<Vec<u32>> {
        numeric_entries(&self.path(format!("{pid}/task")))
    }

    pub fn task_stat(&self, pid: u32, tid: u32) -> Result<TaskStat> {
        let path = self.task_dir(pid, tid).join("stat");
        parse_task_stat(&path, &read_file(&path)?, self)
    }

    /// A task's `stat` kept open, for a reader that reads it every period.
    pub fn task_stat_file(&self, pid: u32, tid: u32) -> TaskStatFile {
        TaskStatFile {
            file: RereadFile::new(self.task_dir(pid, tid).join("stat")),
            proc: self.clone(),
        }
    }

    /// Three numbers in a small file, which is why the /proc sampler counts switches from it:
    /// 1,000 threads' switches took 7 ms of CPU to read from it against 38 from `stat` and
    /// `status` on the `none` guest. Absent on kernels built without `CONFIG_SCHED_INFO`.
    pub fn task_schedstat(&self, pid: u32, tid: u32) -> Result<TaskSchedstat> {
        let path = self.task_dir(pid, tid).join("schedstat");
        parse_task_schedstat(&path, &read_file(&path)?)
    }

    pub fn task_status(&self, pid: u32, tid: u32) -> Result<TaskStatus> {
        let path = self.task_dir(pid, tid).join("status");
        parse_task_status(&path, &read_file(&path)?)
    }

    /// `/proc/PID/status`: the process's main thread, with signals pending for the process.
    pub fn process_status(&self, pid: u32) -> Result<TaskStatus> {
        let path = self.path(format!("{pid}/status"));
        parse_task_status(&path, &read_file(&path)?)
    }

    /// Start time (ticks since boot) of `pid`; a different value later means the pid was reused.
    pub fn process_start_time(&self, pid: u32) -> Result<u64> {
        let path = self.path(format!("{pid}/stat"));
        Ok(parse_task_stat(&path, &read_file(&path)?, self)?.start_ticks)
    }

    /// Direct children of `pid`: from `task/*/children` when the kernel has it
    /// (CONFIG_PROC_CHILDREN), else by scanning every process's ppid.
    pub fn children(&self, pid: u32) -> Result<Vec<u32>> {
        let mut kids = BTreeSet::new();
        let mut have_children_files = false;
        for tid in self.threads(pid)? {
            let path = self.task_dir(pid, tid).join("children");
            match read_file(&path) {
                Ok(text) => {
                    have_children_files = true;
                    for word in text.split_whitespace() {
                        kids.insert(parse_num::<u32>(&path, "child pid", word)?);
                    }
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        if !have_children_files {
            for other in self.pids()? {
                match self.task_stat(other, other) {
                    Ok(st) if st.ppid == pid => {
                        kids.insert(other);
                    }
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {} // exited while we scanned
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(kids.into_iter().collect())
    }

    /// `pid` and all its descendants, breadth first. Processes that exit during the walk are
    /// skipped; only a missing `pid` itself is an error.
    pub fn process_tree(&self, pid: u32) -> Result<Vec<u32>> {
        let mut seen = BTreeSet::from([pid]);
        let mut order = vec![];
        let mut queue = VecDeque::from([pid]);
        while let Some(p) = queue.pop_front() {
            let kids = match self.children(p) {
                Ok(k) => k,
                Err(e) if e.is_not_found() && p != pid => continue,
                Err(e) => return Err(e),
            };
            order.push(p);
            for k in kids {
                if seen.insert(k) {
                    queue.push_back(k);
                }
            }
        }
        Ok(order)
    }

    pub fn cgroup_of(&self, pid: u32) -> Result<ProcessCgroups> {
        let path = self.path(format!("{pid}/cgroup"));
        parse_proc_cgroup(&path, &read_file(&path)?)
    }

    /// The cgroups of the calling process.
    pub fn own_cgroup(&self) -> Result<ProcessCgroups> {
        let path = self.path("self/cgroup");
        parse_proc_cgroup(&path, &read_file(&path)?)
    }
}

/// A file holding one word (or line) that must not be empty.
fn read_word(path: &Path, what: &str) -> Result<String> {
    let text = read_file(path)?;
    let word = text.trim();
    if word.is_empty() || word.contains('\n') {
        return Err(Error::parse(path, what, &text));
    }
    Ok(word.to_string())
}

fn numeric_entries(dir: &Path) -> Result<Vec<u32>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut ids: Vec<u32> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

pub fn read_pressure(path: &Path) -> Result<Pressure> {
    parse_pressure(path, &read_file(path)?)
}

pub fn parse_pressure(path: &Path, text: &str) -> Result<Pressure> {
    let mut some = None;
    let mut full_total_us = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let kind = words.next();
        let mut avg10 = None;
        let mut total = None;
        for w in words {
            match w.split_once('=') {
                Some(("avg10", v)) => avg10 = Some(parse_num::<f64>(path, "PSI avg10", v)?),
                Some(("total", v)) => total = Some(parse_num::<u64>(path, "PSI total", v)?),
                _ => {}
            }
        }
        match kind {
            Some("some") => {
                let total = total.ok_or_else(|| Error::parse(path, "PSI some total=", line))?;
                some = Some((total, avg10.unwrap_or(0.0)));
            }
            Some("full") => full_total_us = total,
            _ => {}
        }
    }
    let (some_total_us, some_avg10) =
        some.ok_or_else(|| Error::parse(path, "PSI 'some' line", text))?;
    Ok(Pressure {
        some_total_us,
        some_avg10,
        full_total_us,
    })
}

fn parse_stat(path: &Path, text: &str, proc: &ProcFs) -> Result<ProcStat> {
    let mut total = None;
    let mut per_cpu = vec![];
    let (mut ctxt, mut running, mut blocked) = (None, None, None);
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(key) = words.next() else { continue };
        if let Some(id) = key.strip_prefix("cpu") {
            let mut ticks = [0u64; 8];
            for slot in ticks.iter_mut() {
                let w = words
                    .next()
                    .ok_or_else(|| Error::parse(path, "8 cpu time fields", line))?;
                *slot = parse_num(path, "cpu time", w)?;
            }
            let [user, nice, system, idle, iowait, irq, softirq, steal] =
                ticks.map(|t| proc.ticks_to_ns(t));
            let times = CpuTimes {
                user_ns: user,
                nice_ns: nice,
                system_ns: system,
                idle_ns: idle,
                iowait_ns: iowait,
                irq_ns: irq,
                softirq_ns: softirq,
                steal_ns: steal,
            };
            if id.is_empty() {
                total = Some(times);
            } else {
                per_cpu.push(CpuStat {
                    cpu: parse_num(path, "cpu id", id)?,
                    times,
                });
            }
            continue;
        }
        let value = || {
            words
                .clone()
                .next()
                .ok_or_else(|| Error::parse(path, key.to_string(), line))
        };
        match key {
            "ctxt" => ctxt = Some(parse_num(path, "ctxt", value()?)?),
            "procs_running" => running = Some(parse_num(path, "procs_running", value()?)?),
            "procs_blocked" => blocked = Some(parse_num(path, "procs_blocked", value()?)?),
            _ => {}
        }
    }
    let missing = |what: &str| Error::parse(path, format!("{what} line"), text);
    if per_cpu.is_empty() {
        return Err(missing("cpuN"));
    }
    Ok(ProcStat {
        total: total.ok_or_else(|| missing("cpu"))?,
        per_cpu,
        ctxt: ctxt.ok_or_else(|| missing("ctxt"))?,
        procs_running: running.ok_or_else(|| missing("procs_running"))?,
        procs_blocked: blocked.ok_or_else(|| missing("procs_blocked"))?,
    })
}

fn parse_task_schedstat(path: &Path, text: &str) -> Result<TaskSchedstat> {
    let mut f = text.split_ascii_whitespace();
    let mut next = |what: &'static str| match f.next() {
        Some(v) => parse_num(path, what, v),
        None => Err(Error::parse(path, what, text)),
    };
    Ok(TaskSchedstat {
        run_ns: next("run time")?,
        wait_ns: next("wait time")?,
        timeslices: next("timeslices")?,
    })
}

fn parse_timer_list(path: &Path, text: &str) -> Result<Option<Vec<TimerListCpu>>> {
    #[derive(Default)]
    struct Partial {
        cpu: usize,
        calls: Option<u64>,
        sleeps: Option<u64>,
        sleeptime: Option<u64>,
        iowait: Option<u64>,
    }
    let mut sections: Vec<Partial> = vec![];
    for line in text.lines() {
        if let Some(id) = line.strip_prefix("cpu: ") {
            sections.push(Partial {
                cpu: parse_num(path, "timer_list cpu id", id)?,
                ..Default::default()
            });
            continue;
        }
        if line.starts_with("Tick Device") {
            break; // the per-CPU tick_sched sections are over
        }
        let Some(cur) = sections.last_mut() else {
            continue;
        };
        let Some((key, value)) = line.trim().split_once(':') else {
            continue;
        };
        let slot = match key.trim() {
            ".idle_calls" => &mut cur.calls,
            ".idle_sleeps" => &mut cur.sleeps,
            ".idle_sleeptime" => &mut cur.sleeptime,
            ".iowait_sleeptime" => &mut cur.iowait,
            _ => continue,
        };
        let number = value.trim().trim_end_matches("nsecs").trim();
        *slot = Some(parse_num(path, key.trim(), number)?);
    }
    if sections.is_empty()
        || sections
            .iter()
            .all(|s| s.calls.is_none() && s.sleeptime.is_none())
    {
        return Ok(None); // kernel without NO_HZ idle accounting
    }
    sections
        .into_iter()
        .map(|s| match (s.calls, s.sleeps, s.sleeptime, s.iowait) {
            (
                Some(idle_calls),
                Some(idle_sleeps),
                Some(idle_sleeptime_ns),
                Some(iowait_sleeptime_ns),
            ) => Ok(TimerListCpu {
                cpu: s.cpu,
                idle_calls,
                idle_sleeps,
                idle_sleeptime_ns,
                iowait_sleeptime_ns,
            }),
            _ => Err(Error::parse(
                path,
                format!("idle fields of cpu {}", s.cpu),
                text,
            )),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn parse_loadavg(path: &Path, text: &str) -> Result<LoadAvg> {
    let w: Vec<&str> = text.split_whitespace().collect();
    let bad = || Error::parse(path, "loadavg", text);
    if w.len() < 4 {
        return Err(bad());
    }
    let (runnable, total) = w[3].split_once('/').ok_or_else(bad)?;
    Ok(LoadAvg {
        one: parse_num(path, "load average", w[0])?,
        five: parse_num(path, "load average", w[1])?,
        fifteen: parse_num(path, "load average", w[2])?,
        runnable: parse_num(path, "runnable tasks", runnable)?,
        total_tasks: parse_num(path, "total tasks", total)?,
    })
}

/// Parses `tid (comm) S ppid ...`. The comm may hold spaces and parentheses, so it is taken
/// between the first `(` and the last `)`.
fn parse_task_stat(path: &Path, text: &str, proc: &ProcFs) -> Result<TaskStat> {
    let bad = |what: &str| Error::parse(path, what.to_string(), text);
    let open = text.find('(').ok_or_else(|| bad("'(' before comm"))?;
    let close = text
        .rfind(')')
        .filter(|&c| c > open)
        .ok_or_else(|| bad("')' after comm"))?;
    let tid = parse_num(path, "tid", &text[..open])?;
    let comm = text[open + 1..close].to_string();
    // Fields after the comm, numbered as in proc(5) minus 3: state is field 3.
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let field = |n: usize, what: &str| rest.get(n - 3).copied().ok_or_else(|| bad(what));
    let state_field = field(3, "state")?;
    let mut state_chars = state_field.chars();
    let state = match (state_chars.next(), state_chars.next()) {
        (Some(c), None) => c,
        _ => return Err(bad("one-letter state")),
    };
    Ok(TaskStat {
        tid,
        comm,
        state,
        ppid: parse_num(path, "ppid", field(4, "ppid")?)?,
        utime_ns: proc.ticks_to_ns(parse_num(path, "utime", field(14, "utime")?)?),
        stime_ns: proc.ticks_to_ns(parse_num(path, "stime", field(15, "stime")?)?),
        num_threads: parse_num(path, "num_threads", field(20, "num_threads")?)?,
        start_ticks: parse_num(path, "starttime", field(22, "starttime")?)?,
        processor: parse_num(path, "processor", field(39, "processor")?)?,
    })
}

/// The rows of `/proc/interrupts` that wake-ups send (see [`ProcFs::wake_interrupts`]),
/// summed per CPU and indexed by CPU id; each row's counts run up to its first word that is
/// not a number (the legend). The header names the CPU of each column: only online CPUs
/// have one.
fn parse_wake_interrupts(path: &Path, text: &str) -> Result<Option<Vec<u64>>> {
    let header: Option<Vec<usize>> = text.lines().next().and_then(|l| {
        l.split_whitespace()
            .map(|w| w.strip_prefix("CPU")?.parse().ok())
            .collect()
    });
    let mut sums: Option<Vec<u64>> = None;
    for line in text.lines() {
        let Some((label, rest)) = line.trim_start().split_once(':') else {
            continue;
        };
        let mut words = rest.split_whitespace().peekable();
        let counts: Vec<u64> = std::iter::from_fn(|| {
            let n = words.peek()?.parse().ok()?;
            words.next();
            Some(n)
        })
        .collect();
        let legend: Vec<&str> = words.collect();
        let legend = legend.join(" ");
        let wakes = matches!(label, "RES" | "CAL")
            || legend.starts_with("Rescheduling interrupts")
            || legend.starts_with("Function call interrupts");
        if !wakes {
            continue;
        }
        if counts.is_empty() {
            return Err(Error::parse(path, "wake-up interrupt counts", line));
        }
        let sums = sums.get_or_insert_with(Vec::new);
        for (column, n) in counts.into_iter().enumerate() {
            let cpu = match &header {
                Some(ids) => match ids.get(column) {
                    Some(&id) => id,
                    None => return Err(Error::parse(path, "one count per CPU column", line)),
                },
                None => column,
            };
            if sums.len() <= cpu {
                sums.resize(cpu + 1, 0);
            }
            sums[cpu] += n;
        }
    }
    Ok(sums)
}

fn parse_task_status(path: &Path, text: &str) -> Result<TaskStatus> {
    let (mut tgid, mut vol, mut nonvol, mut allowed) = (None, None, None, None);
    let (mut state, mut pending_signals) = (None, 0u64);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "Tgid" => tgid = Some(parse_num(path, "Tgid", value)?),
            "voluntary_ctxt_switches" => vol = Some(parse_num(path, key, value)?),
            "nonvoluntary_ctxt_switches" => nonvol = Some(parse_num(path, key, value)?),
            "State" => state = value.chars().next(),
            "SigPnd" | "ShdPnd" => {
                pending_signals |= u64::from_str_radix(value, 16)
                    .map_err(|_| Error::parse(path, "pending signal mask", line))?
            }
            "Cpus_allowed_list" => {
                allowed = Some(
                    value
                        .parse::<Cpuset>()
                        .map_err(|_| Error::parse(path, "Cpus_allowed_list", line))?,
                )
            }
            _ => {}
        }
    }
    let missing = |what: &str| Error::parse(path, format!("{what} line"), text);
    Ok(TaskStatus {
        tgid: tgid.ok_or_else(|| missing("Tgid"))?,
        voluntary_ctxt_switches: vol.ok_or_else(|| missing("voluntary_ctxt_switches"))?,
        nonvoluntary_ctxt_switches: nonvol.ok_or_else(|| missing("nonvoluntary_ctxt_switches"))?,
        cpus_allowed: allowed.ok_or_else(|| missing("Cpus_allowed_list"))?,
        state,
        pending_signals,
    })
}

pub fn parse_proc_cgroup(path: &Path, text: &str) -> Result<ProcessCgroups> {
    let mut lines = vec![];
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(cg_path)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(Error::parse(path, "id:controllers:path", line));
        };
        if !cg_path.starts_with('/') {
            return Err(Error::parse(path, "absolute cgroup path", line));
        }
        lines.push(CgroupLine {
            hierarchy_id: parse_num(path, "hierarchy id", id)?,
            controllers: ctrl
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect(),
            path: cg_path.to_string(),
        });
    }
    Ok(ProcessCgroups(lines))
}

pub fn parse_mountinfo(path: &Path, text: &str) -> Result<Vec<Mount>> {
    let mut mounts = vec![];
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let bad = || Error::parse(path, "mountinfo line", line);
        let (before, after) = line.split_once(" - ").ok_or_else(bad)?;
        let pre: Vec<&str> = before.split_whitespace().collect();
        let post: Vec<&str> = after.split_whitespace().collect();
        if pre.len() < 6 || post.len() < 3 {
            return Err(bad());
        }
        mounts.push(Mount {
            root: unescape_octal(pre[3]),
            mount_point: PathBuf::from(unescape_octal(pre[4])),
            fs_type: post[0].to_string(),
            super_options: post[2].split(',').map(str::to_string).collect(),
        });
    }
    Ok(mounts)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') as u32 * 64
                + (bytes[i + 2] - b'0') as u32 * 8
                + (bytes[i + 3] - b'0') as u32;
            if let Ok(b) = u8::try_from(v) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests;
