//! Prometheus metrics for `gleaner daemon`: rendering, the loopback HTTP endpoint and the
//! node_exporter textfile.
//!
//! Exists so an operator watches Gleaner with the tools already on the fleet. Rendering is a
//! pure function of a [`Snapshot`] (tested by plain string comparison); the endpoint is a
//! deliberately tiny HTTP/1.1 responder that answers `GET /metrics` and nothing else, so it
//! accepts no input that could change Gleaner's state.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
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

/// Bucket bounds exported for a [`LatencyHistogram`]: 2^10 ns (1 µs) to 2^24 ns (16.8 ms),
/// then +Inf. Its 32 log2 buckets would be 32 series per state; cumulative counts stay exact
/// when bounds are left out, and wake latencies outside this range are all "fast" or all
/// "a vCPU had to be scheduled".
pub const HISTOGRAM_LE_POW2: std::ops::RangeInclusive<usize> = 10..=24;

/// One Prometheus histogram family (`NAME_bucket{le}`, `NAME_sum`, `NAME_count`, seconds) from
/// cumulative log2 histograms, one series per label set. Bucket `i` of a [`LatencyHistogram`]
/// counts latencies in [2^i, 2^(i+1)) ns, so the cumulative count up to bucket `k-1` is the
/// number of latencies below 2^k ns: that is the `le` = 2^k ns sample.
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
            let below: u64 = h.buckets.iter().take(k).sum();
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

/// Writes `text` to `path` so that a reader (node_exporter) never sees half a file: a
/// temporary file in the same directory, then a rename. World-readable, because
/// node_exporter runs as its own user.
pub fn write_textfile(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)
        .with_context(|| {
            format!(
                "cannot write metrics textfile {}: create {} or fix [metrics] textfile",
                tmp.display(),
                dir.display()
            )
        })?;
    // Explicitly, because the service runs with UMask=0077.
    f.set_permissions(std::fs::Permissions::from_mode(0o644))
        .with_context(|| format!("cannot chmod {}", tmp.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    drop(f);
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
}

/// The loopback HTTP endpoint; stops when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` and serves `GET /metrics` with whatever `scrape` returns at that moment.
    pub fn start(addr: SocketAddr, scrape: Arc<dyn Fn() -> String + Send + Sync>) -> Result<Self> {
        let listener = TcpListener::bind(addr).with_context(|| {
            format!("cannot listen on {addr}: pick a free port in [metrics] listen")
        })?;
        let addr = listener
            .local_addr()
            .context("cannot read the metrics listener's address")?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gleaner-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop_flag.load(Ordering::SeqCst) {
                        break;
                    }
                    // One scrape at a time is plenty for Prometheus and bounds what a
                    // misbehaving client can cost; slow clients are cut off by timeouts.
                    if let Ok(stream) = conn {
                        if let Err(e) = serve(stream, &*scrape) {
                            tracing::debug!("metrics request: {e}");
                        }
                    }
                }
            })
            .context("cannot start the metrics thread")?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address (the real port when the configured one was 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // accept() blocks: a connection of our own wakes it to see the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Longest request head accepted; a scrape's is a few hundred bytes.
const MAX_REQUEST: usize = 8192;

fn serve(mut stream: TcpStream, scrape: &dyn Fn() -> String) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_REQUEST {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
                true,
            );
        }
    }
    let first = String::from_utf8_lossy(&head)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let mut parts = first.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => respond(
            &mut stream,
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            &scrape(),
            method == "GET",
        ),
        ("GET" | "HEAD", "/") => respond(
            &mut stream,
            "200 OK",
            "text/plain; charset=utf-8",
            "gleaner: metrics at /metrics\n",
            method == "GET",
        ),
        ("GET" | "HEAD", _) => respond(
            &mut stream,
            "404 Not Found",
            "text/plain",
            "not found: use /metrics\n",
            true,
        ),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "only GET /metrics\n",
            true,
        ),
    }
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
    with_body: bool,
) -> std::io::Result<()> {
    let head = format!("HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    stream.write_all(head.as_bytes())?;
    if with_body {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gleaner_linux::status::VcpuStatus;
    use gleaner_policy::Characteristics;

    fn sample_status() -> InstanceStatus {
        InstanceStatus {
            pid: 42,
            command: "cgroup /sys/fs/cgroup/cpuset/db".into(),
            mode: "full".into(),
            placement: "cgroup-v1".into(),
            retention_backend: "yield".into(),
            idle_source: "tracepoint".into(),
            uptime_s: 12.5,
            start_time_unix_s: 1_700_000_100.5,
            retention_timeout_source:
                "measured: 3 of 3 runs agreed within 30 % (runs: 250, 240, 260 µs)".into(),
            slow_periods: 5,
            runnable_wait_seconds_total: 0.75,
            periods: 120,
            missed_periods: 1,
            disrupted_periods: 2,
            max_late_ms: 150.0,
            controller_nice: -10,
            allowed: "0-3".into(),
            active: "0-1".into(),
            rho: 0.9,
            eta: 1.0,
            retention_timeout: gleaner_policy::RetentionTimeout { ns: 250_000 },
            characteristics: Characteristics {
                l_comp_ns: 40_000.0,
                g_comp_ns: 80_000.0,
                l_idle_ns: 25_000.0,
                max_vcpu_util: 0.7,
                total_util: 1.25,
                idle_periods_per_sec: 9000.0,
                steal_fraction: 0.02,
                runnable_wait_fraction: 0.0,
            },
            vcpus: vec![
                VcpuStatus {
                    cpu: 0,
                    active: true,
                    retaining: true,
                    idle_transitions_per_sec: 9500.0,
                    halts_per_sec: 100.0,
                    work_util: 0.7,
                    steal_fraction: 0.03,
                    idle_transitions_total: 114_000,
                    halts_total: 1_200,
                    work_seconds_total: 8.5,
                    steal_seconds_total: 0.25,
                },
                VcpuStatus {
                    cpu: 2,
                    ..Default::default()
                },
            ],
            retention_cpu_s: 1.5,
            self_cpu_s: 2.25,
            consolidations: 3,
            rollbacks: 1,
            major_changes: 2,
            last_events: vec![],
            observe: false,
            ..Default::default()
        }
    }

    #[test]
    fn renders_every_figure_in_base_units() {
        let snap = Snapshot {
            targets: vec![
                TargetMetrics {
                    name: "db".into(),
                    cgroup: "/sys/fs/cgroup/cpuset/db".into(),
                    running: true,
                    restarts: 0,
                    status: Some(sample_status()),
                    state: StateKind::Managed,
                },
                TargetMetrics {
                    name: "web \"x\"".into(),
                    cgroup: String::new(),
                    running: false,
                    restarts: 4,
                    status: None,
                    state: StateKind::Failing,
                },
            ],
            last_reload_successful: true,
            last_reload_success_timestamp_seconds: 1_700_000_000.0,
            process: ProcessMetrics {
                cpu_seconds: 3.5,
                resident_memory_bytes: Some(6e6),
                virtual_memory_bytes: None,
                open_fds: Some(9.0),
                max_fds: Some(1024.0),
                start_time_seconds: 1_700_000_000.0,
            },
        };
        let text = render(&snap);
        let expected_lines = [
            "gleaner_config_last_reload_successful 1",
            "gleaner_config_last_reload_success_timestamp_seconds 1700000000",
            "gleaner_target_up{target=\"db\"} 1",
            "gleaner_target_up{target=\"web \\\"x\\\"\"} 0",
            "gleaner_target_restarts_total{target=\"web \\\"x\\\"\"} 4",
            "gleaner_info{target=\"db\",cgroup=\"/sys/fs/cgroup/cpuset/db\",mode=\"full\",observe=\"false\",placement=\"cgroup-v1\",retention_backend=\"yield\",retention_timeout_source=\"measured\",idle_source=\"tracepoint\"} 1",
            "gleaner_target_state{target=\"db\",state=\"managed\"} 1",
            "gleaner_target_state{target=\"db\",state=\"failing\"} 0",
            "gleaner_target_state{target=\"web \\\"x\\\"\",state=\"failing\"} 1",
            "gleaner_slow_periods_total{target=\"db\"} 5",
            "gleaner_runnable_wait_seconds_total{target=\"db\"} 0.75",
            "gleaner_instance_start_time_seconds{target=\"db\"} 1700000100.5",
            "gleaner_vcpu_idle_transitions_total{target=\"db\",cpu=\"0\"} 114000",
            "gleaner_vcpu_halts_total{target=\"db\",cpu=\"0\"} 1200",
            "gleaner_vcpu_work_seconds_total{target=\"db\",cpu=\"0\"} 8.5",
            "gleaner_vcpu_steal_seconds_total{target=\"db\",cpu=\"0\"} 0.25",
            "process_cpu_seconds_total 3.5",
            "process_resident_memory_bytes 6000000",
            "process_max_fds 1024",
            "process_start_time_seconds 1700000000",
            "gleaner_allowed_vcpus{target=\"db\"} 4",
            "gleaner_active_vcpus{target=\"db\"} 2",
            "gleaner_consolidations_total{target=\"db\"} 3",
            "gleaner_rollbacks_total{target=\"db\"} 1",
            "gleaner_major_changes_total{target=\"db\"} 2",
            "gleaner_periods_total{target=\"db\"} 120",
            "gleaner_missed_periods_total{target=\"db\"} 1",
            "gleaner_disrupted_periods_total{target=\"db\"} 2",
            "gleaner_rho{target=\"db\"} 0.9",
            "gleaner_eta{target=\"db\"} 1",
            "gleaner_retention_timeout_seconds{target=\"db\"} 0.00025",
            "gleaner_l_comp_seconds{target=\"db\"} 0.00004",
            "gleaner_g_comp_seconds{target=\"db\"} 0.00008",
            "gleaner_l_idle_seconds{target=\"db\"} 0.000025",
            "gleaner_workload_cpus{target=\"db\"} 1.25",
            "gleaner_steal_ratio{target=\"db\"} 0.02",
            "gleaner_retention_cpu_seconds_total{target=\"db\"} 1.5",
            "gleaner_cpu_seconds_total{target=\"db\"} 2.25",
            "gleaner_vcpu_active{target=\"db\",cpu=\"0\"} 1",
            "gleaner_vcpu_active{target=\"db\",cpu=\"2\"} 0",
            "gleaner_vcpu_retaining{target=\"db\",cpu=\"0\"} 1",
            "gleaner_vcpu_idle_transitions_per_second{target=\"db\",cpu=\"0\"} 9500",
            "gleaner_vcpu_halts_per_second{target=\"db\",cpu=\"0\"} 100",
            "gleaner_vcpu_steal_ratio{target=\"db\",cpu=\"0\"} 0.03",
        ];
        let lines: Vec<&str> = text.lines().collect();
        for want in expected_lines {
            assert!(lines.contains(&want), "missing {want:?} in:\n{text}");
        }
        // A target without a status contributes no figures, only its up/restarts/state lines.
        assert!(!text.contains("gleaner_rho{target=\"web"), "{text}");
        assert!(
            !text.contains("process_virtual_memory_bytes"),
            "an unknown value is left out, not made up: {text}"
        );
        assert!(
            !text.contains("gleaner_uptime_seconds"),
            "start times, not uptimes: {text}"
        );
        let build = format!("gleaner_build_info{{version=\"{VERSION}\",commit=\"{COMMIT}\"}} 1");
        assert!(lines.contains(&build.as_str()), "{text}");
    }

    #[test]
    fn every_family_has_help_and_type_before_its_samples_and_names_follow_conventions() {
        let snap = Snapshot {
            targets: vec![TargetMetrics {
                name: "db".into(),
                cgroup: "/x".into(),
                running: true,
                restarts: 0,
                status: Some(sample_status()),
                state: StateKind::Managed,
            }],
            last_reload_successful: false,
            last_reload_success_timestamp_seconds: 0.0,
            process: ProcessMetrics::of_self(1.0),
        };
        let text = render(&snap);
        let mut declared: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                declared.push((it.next().unwrap().into(), it.next().unwrap().into()));
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                let (family, kind) = declared.last().expect("sample before any TYPE");
                assert_eq!(name, family, "sample outside its family: {line}");
                assert_eq!(
                    kind == "counter",
                    name.ends_with("_total"),
                    "counter names end in _total: {line}"
                );
                assert!(
                    name.starts_with("gleaner_") || name.starts_with("process_"),
                    "{line}"
                );
                let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
                assert!(value.is_finite(), "{line}");
            }
        }
        let names: Vec<&String> = declared.iter().map(|(n, _)| n).collect();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names.len(), unique.len(), "a family declared twice");
        assert!(text.contains("gleaner_config_last_reload_successful 0\n"));
    }

    #[test]
    fn grafana_dashboard_uses_only_metrics_we_export() {
        let dashboard = include_str!("../../../packaging/grafana-dashboard.json");
        let snap = Snapshot {
            targets: vec![TargetMetrics {
                name: "db".into(),
                cgroup: "/x".into(),
                running: true,
                restarts: 0,
                status: Some(sample_status()),
                state: StateKind::Managed,
            }],
            last_reload_successful: true,
            last_reload_success_timestamp_seconds: 1.0,
            process: ProcessMetrics::default(),
        };
        let exported = render(&snap);
        let mut used = 0;
        for (i, _) in dashboard.match_indices("gleaner_") {
            let name: String = dashboard[i..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            assert!(
                exported.contains(&format!("# TYPE {name} ")),
                "dashboard queries {name}, which is not exported"
            );
            used += 1;
        }
        assert!(used >= 15, "only {used} metric references found");
        // Every panel queries the data source the variable picks; nothing else is declared.
        let d: serde_json::Value = serde_json::from_str(dashboard).unwrap();
        assert!(
            d.get("__inputs").is_none() && !dashboard.contains("DS_PROMETHEUS"),
            "an input no panel uses"
        );
        for p in d["panels"].as_array().unwrap() {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        }
        // Rates come from counters, so that they hold over any scrape interval.
        assert!(
            !dashboard.contains("_per_second"),
            "a per-period gauge where a counter's rate() belongs"
        );
    }

    #[test]
    fn endpoint_serves_metrics_only() {
        let server = MetricsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(|| "gleaner_x 1\n".to_string()),
        )
        .unwrap();
        let get = |req: &str| {
            let mut s = TcpStream::connect(server.addr()).unwrap();
            s.write_all(req.as_bytes()).unwrap();
            let mut resp = String::new();
            s.read_to_string(&mut resp).unwrap();
            resp
        };
        let ok = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("version=0.0.4"), "{ok}");
        assert!(ok.ends_with("\r\n\r\ngleaner_x 1\n"), "{ok}");
        assert!(get("GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        // Exactly one byte too many and no end of head: the server has read all of it when
        // it answers, so closing cannot reset the connection under the client.
        let prefix = "GET /metrics HTTP/1.1\r\nX: ";
        let huge = format!("{prefix}{}", "a".repeat(MAX_REQUEST + 1 - prefix.len()));
        assert!(get(&huge).starts_with("HTTP/1.1 431"));
        drop(server); // must return: the wake-up connection unblocks accept()
    }

    #[test]
    fn textfile_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gleaner.prom");
        write_textfile(&path, "a 1\n").unwrap();
        write_textfile(&path, "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 2\n");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o644,
            "node_exporter must read it"
        );
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
        let err = format!(
            "{:#}",
            write_textfile(&dir.path().join("missing/g.prom"), "x").unwrap_err()
        );
        assert!(err.contains("[metrics] textfile"), "{err}");
    }

    #[test]
    fn wake_latency_is_a_histogram_per_target_and_vcpu_state() {
        let mut w = gleaner_policy::WakeLatencies::default();
        for ns in [3_000, 3_500, 40_000] {
            w.halted.record(ns);
        }
        w.running.record(2_000);
        let st = InstanceStatus {
            wake_latency: Some(w),
            ..Default::default()
        };
        let snap = Snapshot {
            targets: vec![TargetMetrics {
                name: "db".into(),
                running: true,
                status: Some(st),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render(&snap);
        assert!(
            text.contains("# TYPE gleaner_wake_latency_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains(r#"gleaner_wake_latency_seconds_count{target="db",state="halted"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"gleaner_wake_latency_seconds_bucket{target="db",state="halted",le="+Inf"} 3"#
            ),
            "{text}"
        );
        // 2^12 ns = 4.096 µs: the two 3 µs wake-ups are below it, the 40 µs one is not.
        assert!(text.contains(r#"gleaner_wake_latency_seconds_bucket{target="db",state="halted",le="0.000004096"} 2"#), "{text}");
        assert!(
            text.contains(r#"gleaner_wake_latency_seconds_count{target="db",state="polling"} 0"#),
            "{text}"
        );
    }
}
