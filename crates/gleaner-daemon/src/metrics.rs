//! Prometheus metrics for `gleaner daemon`: rendering, the loopback HTTP endpoint and the
//! node_exporter textfile.
//!
//! Exists so an operator watches Gleaner with the tools already on the fleet. Rendering is a
//! pure function of a [`Snapshot`] (tested by plain string comparison); the endpoint is a
//! deliberately tiny HTTP/1.1 responder that answers `GET /metrics` and nothing else, so it
//! accepts no input that could change Gleaner's state.

use std::fmt::Write as _;

use gleaner_linux::status::InstanceStatus;

use crate::status::StateKind;

/// What one managed target looks like at scrape time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TargetMetrics {
    /// The `[[target]]` name, used as the `target` label.
    pub name: String,
    /// The cgroup directory the target resolved to (empty while it cannot be resolved).
    pub cgroup: String,
    /// Whether an instance is managing the target right now.
    pub running: bool,
    /// Instances started for this target after the first (failures and workload restarts).
    pub restarts: u64,
    /// The running instance's last status, once it has written one.
    pub status: Option<InstanceStatus>,
    /// Managed, starting, waiting or failing.
    pub state: StateKind,
}

/// Everything a scrape reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub targets: Vec<TargetMetrics>,
    /// Whether the last SIGHUP reload (or the initial load) was applied.
    pub last_reload_successful: bool,
    /// Unix time of the last successful load, in seconds.
    pub last_reload_success_timestamp_seconds: f64,
    /// The serving process (the daemon), as every Prometheus client library reports it.
    pub process: ProcessMetrics,
}

/// The `process_*` series of the serving process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessMetrics {
    pub cpu_seconds: f64,
    pub resident_memory_bytes: Option<f64>,
    pub virtual_memory_bytes: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
    /// Unix time the process started, in seconds.
    pub start_time_seconds: f64,
}

impl ProcessMetrics {
    /// This process now; `start_time_seconds` is what the caller recorded at start-up.
    pub fn of_self(start_time_seconds: f64) -> Self {
        let page = page_size();
        // /proc/self/statm: sizes in pages, "size resident shared text lib data dt". Read
        // only here, for these two series.
        let statm: Vec<f64> = std::fs::read_to_string("/proc/self/statm")
            .unwrap_or_default()
            .split_whitespace()
            .take(2)
            .filter_map(|w| w.parse::<f64>().ok())
            .collect();
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as f64);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the local struct.
        let max_fds = (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0)
            .then_some(lim.rlim_cur as f64);
        ProcessMetrics {
            cpu_seconds: gleaner_linux::controller::own_cpu_seconds(),
            resident_memory_bytes: statm.get(1).map(|p| p * page),
            virtual_memory_bytes: statm.first().map(|p| p * page),
            open_fds,
            max_fds,
            start_time_seconds,
        }
    }
}

fn page_size() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as f64
    } else {
        4096.0
    }
}

/// Version of this build.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Git commit this build was made from ("unknown" outside a checkout), set by build.rs.
pub const COMMIT: &str = env!("GLEANER_COMMIT");

/// One metric family: its header and its samples, written together as the format requires.
struct Family<'a> {
    out: &'a mut String,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String, name: &str, kind: &str, help: &str) -> Self {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", format_value(value));
    }
}

/// Label values escape backslash, double quote and newline (exposition format 0.0.4).
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// A gauge or counter with one sample per target that has a status.
fn per_target(
    out: &mut String,
    s: &Snapshot,
    name: &str,
    kind: &str,
    help: &str,
    value: impl Fn(&InstanceStatus) -> f64,
) {
    if !s.targets.iter().any(|t| t.status.is_some()) {
        return;
    }
    let mut f = Family::new(out, name, kind, help);
    for t in &s.targets {
        if let Some(st) = &t.status {
            f.sample(name, &[("target", &t.name)], value(st));
        }
    }
}

/// A counter with one sample per target judged by the application's progress counter (the
/// value is `None` for the others, which are left out).
fn per_target_judged(
    out: &mut String,
    s: &Snapshot,
    name: &str,
    help: &str,
    value: impl Fn(&InstanceStatus) -> Option<f64>,
) {
    let samples: Vec<(&str, f64)> = s
        .targets
        .iter()
        .filter_map(|t| Some((t.name.as_str(), value(t.status.as_ref()?)?)))
        .collect();
    if samples.is_empty() {
        return;
    }
    let mut f = Family::new(out, name, "counter", help);
    for (target, v) in samples {
        f.sample(name, &[("target", target)], v);
    }
}

/// A counter with one sample per target whose sampler measures wake-ups (the BPF sampler);
/// absent where none does.
fn per_target_wakes(
    out: &mut String,
    s: &Snapshot,
    name: &str,
    help: &str,
    value: impl Fn(&gleaner_policy::WakeLatencies) -> f64,
) {
    fn wakes(t: &TargetMetrics) -> Option<&gleaner_policy::WakeLatencies> {
        t.status.as_ref().and_then(|st| st.wake_latency.as_ref())
    }
    if !s.targets.iter().any(|t| wakes(t).is_some()) {
        return;
    }
    let mut f = Family::new(out, name, "counter", help);
    for t in &s.targets {
        if let Some(w) = wakes(t) {
            f.sample(name, &[("target", &t.name)], value(w));
        }
    }
}

/// A gauge with one sample per vCPU of each target that has a status.
fn per_vcpu(
    out: &mut String,
    s: &Snapshot,
    name: &str,
    kind: &str,
    help: &str,
    value: impl Fn(&gleaner_linux::status::VcpuStatus) -> f64,
) {
    if !s
        .targets
        .iter()
        .any(|t| t.status.as_ref().is_some_and(|st| !st.vcpus.is_empty()))
    {
        return;
    }
    let mut f = Family::new(out, name, kind, help);
    for t in &s.targets {
        for v in t.status.iter().flat_map(|st| &st.vcpus) {
            f.sample(
                name,
                &[("target", &t.name), ("cpu", &v.cpu.to_string())],
                value(v),
            );
        }
    }
}

/// Bucket bounds exported for a [`LatencyHistogram`]: powers of two from 2^10 ns (1 µs) to
/// 2^24 ns (16.8 ms), then +Inf. Its 128 quarter-octave buckets would be 128 series per state;
/// cumulative counts stay exact when bounds are left out, and wake latencies outside this
/// range are all "fast" or all "a vCPU had to be scheduled".
pub const HISTOGRAM_LE_POW2: std::ops::RangeInclusive<usize> = 10..=24;

/// One Prometheus histogram family (`NAME_bucket{le}`, `NAME_sum`, `NAME_count`, seconds) from
/// cumulative histograms, one series per label set. A power of two begins a bucket of a
/// [`LatencyHistogram`], so the counts of the buckets before `bucket_of(2^k)` are the
/// latencies below 2^k ns: that is the `le` = 2^k ns sample.
pub fn histogram_family(
    out: &mut String,
    name: &str,
    help: &str,
    series: &[(Vec<(&str, &str)>, &gleaner_policy::LatencyHistogram)],
) {
    if series.is_empty() {
        return;
    }
    let mut f = Family::new(out, name, "histogram", help);
    for (labels, h) in series {
        let with = |le: &str| {
            let mut l: Vec<(&str, &str)> = labels.clone();
            l.push(("le", le));
            l.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<(String, String)>>()
        };
        for k in HISTOGRAM_LE_POW2 {
            let first = gleaner_policy::LatencyHistogram::bucket_of(1u64 << k);
            let below: u64 = h.buckets.iter().take(first).sum();
            let le = format_value((1u64 << k) as f64 / 1e9);
            let l = with(&le);
            let refs: Vec<(&str, &str)> = l.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            f.sample(&format!("{name}_bucket"), &refs, below as f64);
        }
        let l = with("+Inf");
        let refs: Vec<(&str, &str)> = l.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        f.sample(&format!("{name}_bucket"), &refs, h.count as f64);
        f.sample(&format!("{name}_sum"), labels, h.sum_ns as f64 / 1e9);
        f.sample(&format!("{name}_count"), labels, h.count as f64);
    }
}

/// The `process_*` families, named and typed as Prometheus client libraries name them.
fn render_process(out: &mut String, p: &ProcessMetrics) {
    let mut one = |name: &str, kind: &str, help: &str, value: Option<f64>| {
        if let Some(v) = value {
            Family::new(out, name, kind, help).sample(name, &[], v);
        }
    };
    one(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        Some(p.cpu_seconds),
    );
    one(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        p.resident_memory_bytes,
    );
    one(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        p.virtual_memory_bytes,
    );
    one(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        p.open_fds,
    );
    one(
        "process_max_fds",
        "gauge",
        "Maximum number of open file descriptors.",
        p.max_fds,
    );
    one(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        Some(p.start_time_seconds),
    );
}

/// A short word for how the hold was obtained, from the start of the instance's description
/// (see `crate::calibration`): a label value must not be free text.
fn timeout_source_label(source: &str) -> &'static str {
    if source.starts_with("configured") {
        "configured"
    } else if source.starts_with("cached") {
        "cached"
    } else if source.starts_with("measured, not cached") {
        "measured-uncached"
    } else if source.starts_with("measured") {
        "measured"
    } else if source.starts_with("default") {
        "default"
    } else {
        "unknown"
    }
}

fn count_cpus(list: &str) -> f64 {
    list.parse::<gleaner_policy::Cpuset>()
        .map(|c| c.len() as f64)
        .unwrap_or(f64::NAN)
}

fn bool_value(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Renders the Prometheus text exposition (format 0.0.4) of `s`. Base units throughout:
/// seconds, ratios in 0..=1, counts.
pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    {
        let mut f = Family::new(
            &mut out,
            "gleaner_config_last_reload_successful",
            "gauge",
            "Whether the last configuration load (start or SIGHUP) was applied.",
        );
        f.sample(
            "gleaner_config_last_reload_successful",
            &[],
            bool_value(s.last_reload_successful),
        );
    }
    {
        let name = "gleaner_config_last_reload_success_timestamp_seconds";
        let mut f = Family::new(
            &mut out,
            name,
            "gauge",
            "Unix time of the last successful configuration load.",
        );
        f.sample(name, &[], s.last_reload_success_timestamp_seconds);
    }
    {
        let name = "gleaner_build_info";
        let mut f = Family::new(
            &mut out,
            name,
            "gauge",
            "Version and git commit of the running Gleaner (always 1).",
        );
        f.sample(name, &[("version", VERSION), ("commit", COMMIT)], 1.0);
    }
    if !s.targets.is_empty() {
        let name = "gleaner_target_state";
        let mut f = Family::new(&mut out, name, "gauge", "1 for the state each target is in: managed, starting (calibrating), waiting (no cgroup or no process yet), failing (see gleaner status).");
        for t in &s.targets {
            for k in [
                StateKind::Managed,
                StateKind::Starting,
                StateKind::Waiting,
                StateKind::Failing,
            ] {
                f.sample(
                    name,
                    &[("target", &t.name), ("state", k.word())],
                    bool_value(t.state == k),
                );
            }
        }
        let name = "gleaner_target_up";
        let mut f = Family::new(
            &mut out,
            name,
            "gauge",
            "Whether an instance is managing the target (0: waiting for its cgroup or restarting).",
        );
        for t in &s.targets {
            f.sample(name, &[("target", &t.name)], bool_value(t.running));
        }
        let name = "gleaner_target_restarts_total";
        let mut f = Family::new(
            &mut out,
            name,
            "counter",
            "Instances started for the target after the first.",
        );
        for t in &s.targets {
            f.sample(name, &[("target", &t.name)], t.restarts as f64);
        }
    }
    if s.targets.iter().any(|t| t.status.is_some()) {
        let name = "gleaner_info";
        let mut f = Family::new(
            &mut out,
            name,
            "gauge",
            "How each target is managed, and its cgroup (always 1).",
        );
        for t in &s.targets {
            if let Some(st) = &t.status {
                let observe = if st.observe { "true" } else { "false" };
                f.sample(
                    name,
                    &[
                        ("target", &t.name),
                        ("cgroup", &t.cgroup),
                        ("mode", &st.mode),
                        ("observe", observe),
                        ("placement", &st.placement),
                        ("retention_backend", &st.retention_backend),
                        (
                            "retention_timeout_source",
                            timeout_source_label(&st.retention_timeout_source),
                        ),
                        ("idle_source", &st.idle_source),
                    ],
                    1.0,
                );
            }
        }
    }
    // The paper's Table 2 measured live on each target's own threads (BPF sampler only).
    let wake_series: Vec<(Vec<(&str, &str)>, &gleaner_policy::LatencyHistogram)> = s
        .targets
        .iter()
        .filter_map(|t| Some((t, t.status.as_ref()?.wake_latency.as_ref()?)))
        .flat_map(|(t, w)| {
            [
                ("running", &w.running),
                ("polling", &w.polling),
                ("halted", &w.halted),
            ]
            .into_iter()
            .map(move |(state, h)| (vec![("target", t.name.as_str()), ("state", state)], h))
        })
        .collect();
    histogram_family(
        &mut out,
        "gleaner_wake_latency_seconds",
        "Wake-up latency of the target's threads, from sched_waking to running, by what the wakee's vCPU was doing when woken (running, polling, halted).",
        &wake_series,
    );
    per_target_wakes(
        &mut out,
        s,
        "gleaner_wake_halted_waited_total",
        "Wake-ups of a halted vCPU whose waker's vCPU went idle before the wakee ran: the ones a held vCPU would have sped up for someone waiting.",
        |w| w.halted_waited as f64,
    );
    per_target_wakes(
        &mut out,
        s,
        "gleaner_wake_halted_hand_offs_total",
        "Of those, the ones whose waker was a thread on another vCPU (not a timer on the halted vCPU): hand-offs, which packing the pair onto one vCPU turns into a switch there.",
        |w| w.halted_hand_offs as f64,
    );
    per_target(
        &mut out,
        s,
        "gleaner_allowed_vcpus",
        "gauge",
        "vCPUs the target may use.",
        |st| count_cpus(&st.allowed),
    );
    per_target(
        &mut out,
        s,
        "gleaner_active_vcpus",
        "gauge",
        "vCPUs the target runs on now (fewer than allowed while consolidated).",
        |st| count_cpus(&st.active),
    );
    per_target(
        &mut out,
        s,
        "gleaner_consolidations_total",
        "counter",
        "vCPUs taken away from the target by imbalanced scheduling.",
        |st| st.consolidations as f64,
    );
    per_target(
        &mut out,
        s,
        "gleaner_rollbacks_total",
        "counter",
        "Consolidations undone because the workload slowed down.",
        |st| st.rollbacks as f64,
    );
    per_target(
        &mut out,
        s,
        "gleaner_major_changes_total",
        "counter",
        "Workload phase changes that reset the target to all its vCPUs.",
        |st| st.major_changes as f64,
    );
    per_target(
        &mut out,
        s,
        "gleaner_periods_total",
        "counter",
        "Sampling periods completed.",
        |st| st.periods as f64,
    );
    per_target(
        &mut out,
        s,
        "gleaner_missed_periods_total",
        "counter",
        "Control deadlines skipped because the loop woke more than one interval late.",
        |st| st.missed_periods as f64,
    );
    per_target(
        &mut out,
        s,
        "gleaner_disrupted_periods_total",
        "counter",
        "Periods longer than twice their plan (stall, paused VM); their samples were discarded.",
        |st| st.disrupted_periods as f64,
    );
    per_target_judged(
        &mut out,
        s,
        "gleaner_progress_total",
        "The application's progress counter's growth over the periods Gleaner judged by it (rate() it for the application's throughput as Gleaner saw it); only for targets judged by a counter.",
        |st| st.progress_total.map(|n| n as f64),
    );
    per_target_judged(
        &mut out,
        s,
        "gleaner_unjudged_periods_total",
        "Periods not judged because the application's progress counter could not be read (see the warning in the log); only for targets judged by a counter.",
        |st| st.progress_total.map(|_| st.unjudged_periods as f64),
    );
    per_target(
        &mut out,
        s,
        "gleaner_slow_periods_total",
        "counter",
        "Periods whose end-of-period work took longer than a sub-sample slice.",
        |st| st.slow_periods as f64,
    );
    per_target(
        &mut out,
        s,
        "gleaner_rho",
        "gauge",
        "Load factor rho of condition (1) in force.",
        |st| st.rho,
    );
    per_target(
        &mut out,
        s,
        "gleaner_eta",
        "gauge",
        "Granularity factor eta of condition (2) in force.",
        |st| st.eta,
    );
    per_target(
        &mut out,
        s,
        "gleaner_retention_timeout_seconds",
        "gauge",
        "How long an idle vCPU is held before it may halt.",
        |st| st.retention_timeout.as_secs_f64(),
    );
    per_target(
        &mut out,
        s,
        "gleaner_l_comp_seconds",
        "gauge",
        "l_comp: mean computation on a vCPU between two idle periods, last period.",
        |st| st.characteristics.l_comp_ns / 1e9,
    );
    per_target(
        &mut out,
        s,
        "gleaner_g_comp_seconds",
        "gauge",
        "g_comp: mean computation in a thread between two synchronization points, last period.",
        |st| st.characteristics.g_comp_ns / 1e9,
    );
    per_target(
        &mut out,
        s,
        "gleaner_l_idle_seconds",
        "gauge",
        "l_idle: mean length of an idle period, last period.",
        |st| st.characteristics.l_idle_ns / 1e9,
    );
    per_target(
        &mut out,
        s,
        "gleaner_workload_cpus",
        "gauge",
        "The target's CPU use summed over active vCPUs, last period (1 = one vCPU busy).",
        |st| st.characteristics.total_util,
    );
    per_target(
        &mut out,
        s,
        "gleaner_steal_ratio",
        "gauge",
        "Steal time as a fraction of the period, mean over active vCPUs, last period.",
        |st| st.characteristics.steal_fraction,
    );
    per_target(
        &mut out,
        s,
        "gleaner_runnable_wait_ratio",
        "gauge",
        "Fraction of the period some workload thread waited for a CPU, last period.",
        |st| st.characteristics.runnable_wait_fraction,
    );
    per_target(
        &mut out,
        s,
        "gleaner_runnable_wait_seconds_total",
        "counter",
        "Time some workload thread waited for a CPU while another active vCPU had none of them.",
        |st| st.runnable_wait_seconds_total,
    );
    per_target(
        &mut out,
        s,
        "gleaner_retention_cpu_seconds_total",
        "counter",
        "CPU time spent holding idle vCPUs (yielding retention threads).",
        |st| st.retention_cpu_s,
    );
    per_target(
        &mut out,
        s,
        "gleaner_cpu_seconds_total",
        "counter",
        "CPU time of the instance managing the target, retention included.",
        |st| st.self_cpu_s,
    );
    per_target(
        &mut out,
        s,
        "gleaner_instance_start_time_seconds",
        "gauge",
        "Unix time the instance managing the target started.",
        |st| st.start_time_unix_s,
    );
    per_vcpu(
        &mut out,
        s,
        "gleaner_vcpu_active",
        "gauge",
        "Whether the vCPU is in the target's active set.",
        |v| bool_value(v.active),
    );
    per_vcpu(
        &mut out,
        s,
        "gleaner_vcpu_retaining",
        "gauge",
        "Whether the vCPU is held when idle.",
        |v| bool_value(v.retaining),
    );
    per_vcpu(
        &mut out,
        s,
        "gleaner_vcpu_idle_transitions_total",
        "counter",
        "Idle periods begun on the vCPU (held or halted) since the instance started.",
        |v| v.idle_transitions_total as f64,
    );
    per_vcpu(&mut out, s, "gleaner_vcpu_halts_total", "counter", "Idle periods that entered the kernel's idle loop (halt or poll) since the instance started.", |v| v.halts_total as f64);
    per_vcpu(
        &mut out,
        s,
        "gleaner_vcpu_work_seconds_total",
        "counter",
        "Time the target's threads ran on the vCPU since the instance started.",
        |v| v.work_seconds_total,
    );
    per_vcpu(
        &mut out,
        s,
        "gleaner_vcpu_steal_seconds_total",
        "counter",
        "Time the hypervisor stole from the vCPU since the instance started.",
        |v| v.steal_seconds_total,
    );
    per_vcpu(&mut out, s, "gleaner_vcpu_idle_transitions_per_second", "gauge", "Idle periods begun on the vCPU per second, last period only (use rate() of the _total counter).", |v| {
        v.idle_transitions_per_sec
    });
    per_vcpu(&mut out, s, "gleaner_vcpu_halts_per_second", "gauge", "Idle periods that ended in a halt per second, last period only (use rate() of the _total counter).", |v| v.halts_per_sec);
    per_vcpu(
        &mut out,
        s,
        "gleaner_vcpu_work_ratio",
        "gauge",
        "Fraction of the period the target's threads ran on the vCPU, last period.",
        |v| v.work_util,
    );
    per_vcpu(
        &mut out,
        s,
        "gleaner_vcpu_steal_ratio",
        "gauge",
        "Steal time as a fraction of the period on the vCPU, last period.",
        |v| v.steal_fraction,
    );
    render_process(&mut out, &s.process);
    out
}

mod serve;
pub use serve::{write_textfile, MetricsServer};

#[cfg(test)]
mod tests;
