//! The daemon's configuration: TOML file, then command-line flags on top, then validation.
//!
//! Exists so that `gleaner run`, `gleaner attach` and the service read one format with one set
//! of documented defaults, and a bad value is refused before any CPU is touched.

use gleaner_sys::one_line;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use gleaner_policy::{Mode, PolicyConfig, RetentionTimeout};
use serde::{Deserialize, Serialize};

/// Where the workload's allowed CPUs are changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum BackendChoice {
    /// cgroup v2 cpuset, else cgroup v1 cpuset, else thread affinity.
    #[default]
    Auto,
    CgroupV2,
    CgroupV1,
    Affinity,
}

/// What measures the workload each period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SamplerChoice {
    /// The in-kernel BPF sampler where it loads (root, kernel BTF), else procfs.
    #[default]
    Auto,
    /// The BPF sampler, or an error saying why it cannot load.
    Bpf,
    /// Per-thread /proc reads under a CPU budget; no wake-latency histogram.
    Procfs,
}

impl SamplerChoice {
    pub fn preference(self) -> gleaner_linux::sampler::SamplerPreference {
        use gleaner_linux::sampler::SamplerPreference as P;
        match self {
            SamplerChoice::Auto => P::Auto,
            SamplerChoice::Bpf => P::Bpf,
            SamplerChoice::Procfs => P::Procfs,
        }
    }
}

/// How idle vCPUs are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RetentionBackendChoice {
    /// In-kernel polling through PM QoS where a cpuidle poll state exists, else yielding threads.
    #[default]
    Auto,
    /// SCHED_IDLE yielding threads (§6 of the paper).
    Yield,
    /// `pm_qos_resume_latency_us = n/a`: the guest's cpuidle poll state.
    Poll,
}

/// Everything `gleaner run` / `attach` / the service can be told, with its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonConfig {
    /// Sampling and decision period in milliseconds (default 100).
    pub period_ms: u64,
    /// Placement back end (default auto).
    pub backend: BackendChoice,
    /// Retention back end (default auto).
    pub retention_backend: RetentionBackendChoice,
    /// Measure and log every decision without acting on any (default false).
    pub observe: bool,
    /// Sampler (default auto: BPF where it loads, else procfs).
    pub sampler: SamplerChoice,
    /// Retention hold in microseconds; unset means derive it from a wake-latency measurement.
    pub retention_timeout_us: Option<u64>,
    /// Directory for the crash journal and status file; unset means /run/gleaner as root,
    /// else $XDG_RUNTIME_DIR/gleaner.
    pub state_dir: Option<PathBuf>,
    /// The policy's tunables (mode, rho, eta, ...). Written without `retention_timeout_ns`,
    /// which the daemon sets and `parse` refuses, so a written config reads back.
    #[serde(serialize_with = "serialize_policy")]
    pub policy: PolicyConfig,
    /// The application's progress counter: a file whose first number is the counter (unset:
    /// changes are judged by the workload's utilization).
    pub progress_file: Option<PathBuf>,
    /// The application's progress counter: a shell command that prints it (unset: as above).
    pub progress_command: Option<String>,
    /// The application's progress counter: a Prometheus page on loopback
    /// (`http://127.0.0.1:9100/metrics`) and the series read from it (`progress_metric`).
    pub progress_url: Option<String>,
    /// The series of `progress_url` that counts the work: a name (its series summed) or a
    /// name with labels as the page writes them.
    pub progress_metric: Option<String>,
    /// Per-period JSON lines go here (command line only).
    #[serde(skip)]
    pub timeline: Option<PathBuf>,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            period_ms: 100,
            backend: BackendChoice::Auto,
            retention_backend: RetentionBackendChoice::Auto,
            observe: false,
            sampler: SamplerChoice::Auto,
            retention_timeout_us: None,
            state_dir: None,
            policy: PolicyConfig::default(),
            progress_file: None,
            progress_command: None,
            progress_url: None,
            progress_metric: None,
            timeline: None,
        }
    }
}

fn serialize_policy<S: serde::Serializer>(
    policy: &PolicyConfig,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    let mut table = toml::Table::try_from(policy).map_err(serde::ser::Error::custom)?;
    table.remove("retention_timeout_ns");
    table.serialize(s)
}

/// Flags shared by `run` and `attach`; each overrides the config file.
#[derive(Debug, Clone, Default, Args)]
pub struct DaemonFlags {
    /// TOML configuration file (see README "Configuration" for every key).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Which mechanisms run: full, retention, consolidation, always-yield [default: full]
    #[arg(long, value_parser = parse_mode)]
    pub mode: Option<Mode>,
    /// Load factor rho in (0, 1] [default: 1.0]
    #[arg(long)]
    pub rho: Option<f64>,
    /// Granularity factor eta in (0, 1] [default: 1.0]
    #[arg(long)]
    pub eta: Option<f64>,
    /// Sampling and decision period in milliseconds [default: 100]
    #[arg(long, value_name = "MS")]
    pub period_ms: Option<u64>,
    /// Placement back end [default: auto]
    #[arg(long, value_enum)]
    pub backend: Option<BackendChoice>,
    /// Retention back end [default: auto]
    #[arg(long, value_enum)]
    pub retention_backend: Option<RetentionBackendChoice>,
    /// Retention hold in µs [default: derived from a wake-latency measurement]
    #[arg(long, value_name = "US")]
    pub retention_timeout_us: Option<u64>,
    /// Measure and log every decision without acting on it
    #[arg(long)]
    pub observe: bool,
    /// Sampler: auto (BPF where it loads, else procfs), bpf, procfs [default: auto]
    #[arg(long, value_enum)]
    pub sampler: Option<SamplerChoice>,
    /// Append one JSON line per period (time, active vCPUs, characteristics) to FILE
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
    /// Directory for the crash journal and status file
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Judge changes by the application's own progress: a file whose first number is a
    /// counter of work done (transactions, items), read once a period
    #[arg(long, value_name = "FILE", conflicts_with_all = ["progress_command", "progress_url"])]
    pub progress_file: Option<PathBuf>,
    /// Judge changes by the application's own progress: a shell command that prints a counter
    /// of work done, run once a period
    #[arg(long, value_name = "CMD", conflicts_with = "progress_url")]
    pub progress_command: Option<String>,
    /// Judge changes by the application's own progress: a Prometheus page on loopback, read
    /// once a period (e.g. http://127.0.0.1:9100/metrics), with --progress-metric
    #[arg(long, value_name = "URL", requires = "progress_metric")]
    pub progress_url: Option<String>,
    /// The series of --progress-url that counts work done: a name (e.g. db_tx_total, its
    /// series summed) or a name with labels as the page writes them
    #[arg(long, value_name = "SERIES", requires = "progress_url")]
    pub progress_metric: Option<String>,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse()
}

impl DaemonFlags {
    /// The config file (if any) with these flags applied on top, validated.
    pub fn resolve(&self) -> Result<DaemonConfig> {
        let mut cfg = match &self.config {
            Some(path) => load_file(path)?,
            None => DaemonConfig::default(),
        };
        if let Some(m) = self.mode {
            cfg.policy.mode = m;
        }
        if let Some(r) = self.rho {
            cfg.policy.rho = r;
        }
        if let Some(e) = self.eta {
            cfg.policy.eta = e;
        }
        if let Some(p) = self.period_ms {
            cfg.period_ms = p;
        }
        if let Some(b) = self.backend {
            cfg.backend = b;
        }
        if let Some(b) = self.retention_backend {
            cfg.retention_backend = b;
        }
        if let Some(t) = self.retention_timeout_us {
            cfg.retention_timeout_us = Some(t);
        }
        if self.observe {
            cfg.observe = true;
        }
        if let Some(c) = self.sampler {
            cfg.sampler = c;
        }
        if let Some(d) = &self.state_dir {
            cfg.state_dir = Some(d.clone());
        }
        // A counter given on the command line replaces one from the file, whichever kind.
        if self.progress_file.is_some()
            || self.progress_command.is_some()
            || self.progress_url.is_some()
        {
            cfg.progress_file = self.progress_file.clone();
            cfg.progress_command = self.progress_command.clone();
            cfg.progress_url = self.progress_url.clone();
            cfg.progress_metric = self.progress_metric.clone();
        }
        cfg.timeline = self.timeline.clone();
        cfg.validate()?;
        Ok(cfg)
    }
}

impl DaemonConfig {
    /// The configured retention hold; `None` means derive it from a wake-latency measurement.
    pub fn retention_timeout(&self) -> Option<RetentionTimeout> {
        self.retention_timeout_us.map(RetentionTimeout::from_us)
    }

    pub fn validate(&self) -> Result<()> {
        if !(10..=60_000).contains(&self.period_ms) {
            bail!(
                "period_ms = {} is out of range: use 10 to 60000 (default 100)",
                self.period_ms
            );
        }
        if let Some(t) = self.retention_timeout_us {
            if !(1..=1_000_000).contains(&t) {
                bail!("retention_timeout_us = {t} is out of range: use 1 to 1000000, or leave it unset to derive it");
            }
        }
        let sources = [
            self.progress_file.is_some(),
            self.progress_command.is_some(),
            self.progress_url.is_some(),
        ];
        if sources.iter().filter(|&&given| given).count() > 1 {
            bail!("more than one of progress_file, progress_command and progress_url is set: give the counter one way");
        }
        match (&self.progress_url, &self.progress_metric) {
            (Some(url), Some(series)) => {
                gleaner_linux::progress::prometheus::MetricsUrl::parse(url)
                    .map_err(|e| anyhow::anyhow!("progress_url = {e}"))?;
                if series.trim().is_empty() {
                    bail!("progress_metric is empty: name the series that counts the work (e.g. db_tx_total)");
                }
            }
            (Some(_), None) => bail!(
                "progress_url is set without progress_metric: name the series that counts the work (e.g. db_tx_total)"
            ),
            (None, Some(_)) => bail!(
                "progress_metric is set without progress_url: give the page it is read from (e.g. http://127.0.0.1:9100/metrics)"
            ),
            (None, None) => {}
        }
        if self
            .progress_command
            .as_ref()
            .is_some_and(|c| c.trim().is_empty())
        {
            bail!("progress_command is empty: give a command that prints the counter, or leave it unset");
        }
        self.policy.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    }

    /// Where the application's progress counter is read, if the user gave one.
    pub fn progress_source(&self) -> Option<gleaner_linux::progress::ProgressSource> {
        use gleaner_linux::progress::ProgressSource;
        if let Some(f) = &self.progress_file {
            return Some(ProgressSource::File(f.clone()));
        }
        if let Some(c) = &self.progress_command {
            return Some(ProgressSource::Command(c.clone()));
        }
        // Validated before: a URL comes with its series and parses.
        let url =
            gleaner_linux::progress::prometheus::MetricsUrl::parse(self.progress_url.as_ref()?)
                .ok()?;
        Some(ProgressSource::Metric {
            url,
            series: self.progress_metric.clone()?.trim().to_string(),
        })
    }
}

/// Reads a TOML config file. When running as root, a file that other users can write is
/// refused: whoever can write it could steer which CPUs a root daemon gives a workload.
pub fn load_file(path: &Path) -> Result<DaemonConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}: check the path", path.display()))?;
    if is_root() {
        use std::os::unix::fs::MetadataExt;
        let meta =
            std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
        if meta.mode() & 0o022 != 0 {
            bail!(
                "config file {} is writable by group or others: run `chmod go-w {}` (refused when running as root)",
                path.display(),
                path.display()
            );
        }
    }
    parse(&text).with_context(|| format!("config file {}", path.display()))
}

pub fn parse(text: &str) -> Result<DaemonConfig> {
    let cfg: DaemonConfig = toml::from_str(text).map_err(|e| {
        let at = e
            .span()
            .map(|span| {
                format!(
                    " at line {}",
                    text[..span.start.min(text.len())].matches('\n').count() + 1
                )
            })
            .unwrap_or_default();
        // A misspelt key is the commonest mistake; "malformed TOML" would send the user
        // looking for a syntax error.
        let what = if e.message().starts_with("unknown field") {
            "unknown key"
        } else {
            "malformed TOML"
        };
        anyhow::anyhow!("{what}{at}: {}", one_line(e.message()))
    })?;
    // The policy's hold is set by the daemon (measured, or retention_timeout_us), so a value
    // here would be silently replaced; refuse it, as the simulator does.
    let table: toml::Table = toml::from_str(text).unwrap_or_default();
    if table
        .get("policy")
        .and_then(|p| p.get("retention_timeout_ns"))
        .is_some()
    {
        bail!("[policy] retention_timeout_ns is not a setting here: the daemon sets the hold; use the top-level retention_timeout_us = MICROSECONDS instead, or leave it unset to derive it");
    }
    cfg.validate()?;
    Ok(cfg)
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_is_chosen_in_the_file_or_on_the_command_line() {
        assert_eq!(parse("").unwrap().sampler, SamplerChoice::Auto);
        assert_eq!(
            parse("sampler = \"procfs\"").unwrap().sampler,
            SamplerChoice::Procfs
        );
        assert!(parse("sampler = \"ebpf\"").is_err());
        let flags = DaemonFlags {
            sampler: Some(SamplerChoice::Bpf),
            ..Default::default()
        };
        assert_eq!(flags.resolve().unwrap().sampler, SamplerChoice::Bpf);
    }

    #[test]
    fn defaults_are_valid_and_documented_keys_parse() {
        let cfg = parse("").unwrap();
        assert_eq!(cfg, DaemonConfig::default());
        let cfg = parse(
            "period_ms = 200\nbackend = \"affinity\"\n[policy]\nmode = \"retention\"\nrho = 0.8\n",
        )
        .unwrap();
        assert_eq!(cfg.period_ms, 200);
        assert_eq!(cfg.backend, BackendChoice::Affinity);
        assert_eq!(cfg.policy.mode, Mode::Retention);
        assert_eq!(cfg.policy.rho, 0.8);
        assert_eq!(cfg.retention_timeout(), None);
        let cfg = parse("retention_timeout_us = 30\n").unwrap();
        assert_eq!(
            cfg.retention_timeout(),
            Some(RetentionTimeout { ns: 30_000 })
        );
    }

    #[test]
    fn bad_configs_get_one_line_errors() {
        for (text, needle) in [
            ("period_ms = \"x\"", "malformed TOML"),
            ("[policy]\nrho = 1.5", "outside (0, 1]"),
            ("[policy]\neta = 0", "outside (0, 1]"),
            (
                "nonsense = 1",
                "unknown key at line 1: unknown field `nonsense`",
            ),
            (
                "period_ms = 100\n[policy]\nrhoo = 1",
                "unknown key at line 3",
            ),
            ("period_ms = 1", "out of range"),
            ("[policy\n", "malformed TOML"),
            (
                "progress_file = \"/run/c\"\nprogress_command = \"cat /run/c\"",
                "give the counter one way",
            ),
            ("progress_command = \" \"", "progress_command is empty"),
            (
                "progress_url = \"http://127.0.0.1:9100/metrics\"",
                "without progress_metric",
            ),
            ("progress_metric = \"tx_total\"", "without progress_url"),
            (
                "progress_url = \"http://10.1.2.3:9100/metrics\"\nprogress_metric = \"tx\"",
                "not a loopback address",
            ),
            (
                "progress_url = \"http://127.0.0.1/m\"\nprogress_metric = \"tx\"\nprogress_file = \"/run/c\"",
                "give the counter one way",
            ),
            // Set by the daemon: accepting it would silently replace it (the simulator refuses it too).
            (
                "[policy]\nretention_timeout_ns = 30000",
                "use the top-level retention_timeout_us",
            ),
        ] {
            let err = format!("{:#}", parse(text).unwrap_err());
            assert!(err.contains(needle), "{text}: {err}");
            assert!(!err.contains('\n'), "{text}: {err}");
        }
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.toml");
        std::fs::write(&path, "period_ms = 300\n[policy]\nrho = 0.5\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let flags = DaemonFlags {
            config: Some(path.clone()),
            rho: Some(0.7),
            ..Default::default()
        };
        let cfg = flags.resolve().unwrap();
        assert_eq!(cfg.period_ms, 300);
        assert_eq!(cfg.policy.rho, 0.7);
        if is_root() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
            let err = format!("{:#}", flags.resolve().unwrap_err());
            assert!(err.contains("chmod go-w"), "{err}");
        }
    }

    #[test]
    fn a_progress_counter_comes_from_the_file_or_the_command_line_and_the_flag_wins() {
        use gleaner_linux::progress::ProgressSource;
        assert_eq!(parse("").unwrap().progress_source(), None);
        assert_eq!(
            parse("progress_command = \"echo 1\"")
                .unwrap()
                .progress_source(),
            Some(ProgressSource::Command("echo 1".into()))
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.toml");
        std::fs::write(&path, "progress_command = \"echo 1\"\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        // A file given on the command line replaces the file's command (not both, an error).
        let flags = DaemonFlags {
            config: Some(path),
            progress_file: Some("/run/tx".into()),
            ..Default::default()
        };
        assert_eq!(
            flags.resolve().unwrap().progress_source(),
            Some(ProgressSource::File("/run/tx".into()))
        );
        // A metrics page: its URL and series, from the file or the flags.
        let from_file = parse(
            "progress_url = \"http://localhost:9100/metrics\"\nprogress_metric = \" db_tx_total \"",
        )
        .unwrap()
        .progress_source()
        .unwrap();
        assert_eq!(
            from_file.to_string(),
            "metric db_tx_total at http://localhost:9100/metrics"
        );
        let flags = DaemonFlags {
            progress_url: Some("http://[::1]:8080/m".into()),
            progress_metric: Some("tx{db=\"a\"}".into()),
            ..Default::default()
        };
        assert_eq!(
            flags
                .resolve()
                .unwrap()
                .progress_source()
                .unwrap()
                .to_string(),
            "metric tx{db=\"a\"} at http://[::1]:8080/m"
        );
    }
}
