//! The service's configuration: `[[target]]`s, `[metrics]` and the daemon keys, parsed and
//! checked in one place.
//!
//! Exists apart from the supervisor because a configuration is judged before anything runs
//! (`gleaner daemon --check`, and on SIGHUP, where a broken file must leave the running one
//! in force): parsing has no side effects and is tested on its own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use gleaner_linux::journal::Journal;
use gleaner_sys::one_line;
use serde::Deserialize;

use super::DEFAULT_LISTEN;
use crate::config::{is_root, DaemonConfig};

/// Where a target's cgroup is.
#[derive(Debug, Clone, PartialEq)]
pub enum CgroupRef {
    /// A cgroup directory given as is.
    Path(PathBuf),
    /// A systemd unit (`mysql.service`, `db.slice`), resolved under the cpuset hierarchy.
    Unit(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TargetConfig {
    /// Label in metrics and logs; defaults to the unit name or the cgroup's last component.
    pub name: String,
    pub cgroup: CgroupRef,
    /// The service-wide daemon keys with this target's overrides applied, validated.
    pub daemon: DaemonConfig,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// None: no HTTP endpoint.
    pub listen: Option<SocketAddr>,
    pub textfile: Option<PathBuf>,
    pub textfile_interval: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServiceConfig {
    pub state_dir: PathBuf,
    pub metrics: MetricsConfig,
    pub targets: Vec<TargetConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct MetricsFile {
    listen: String,
    allow_non_loopback: bool,
    textfile: Option<PathBuf>,
    textfile_interval_s: u64,
}

impl Default for MetricsFile {
    fn default() -> Self {
        MetricsFile {
            listen: DEFAULT_LISTEN.into(),
            allow_non_loopback: false,
            textfile: None,
            textfile_interval_s: 15,
        }
    }
}

/// Reads and validates the service configuration. As root, a file others can write is
/// refused for the same reason as in `gleaner run --config`.
pub fn load(path: &Path) -> Result<ServiceConfig> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {}: check the path, or pass --config FILE",
            path.display()
        )
    })?;
    if is_root() {
        use std::os::unix::fs::MetadataExt;
        let meta =
            std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
        if meta.mode() & 0o022 != 0 {
            bail!(
                "{} is writable by group or others: run `chmod go-w {}`",
                path.display(),
                path.display()
            );
        }
    }
    parse(&text).with_context(|| format!("{}", path.display()))
}

/// Parses a service configuration: the usual daemon keys, `[metrics]`, `[[target]]`.
pub fn parse(text: &str) -> Result<ServiceConfig> {
    let mut table: toml::Table = toml::from_str(text)
        .map_err(|e| anyhow!("malformed TOML: {}", one_line(&e.to_string())))?;
    let metrics_file: MetricsFile = match table.remove("metrics") {
        Some(v) => v
            .try_into()
            .map_err(|e| anyhow!("[metrics]: {}", one_line(&e.to_string())))?,
        None => MetricsFile::default(),
    };
    let target_tables = match table.remove("target") {
        None => Vec::new(),
        Some(toml::Value::Array(a)) => a,
        Some(_) => bail!("`target` must be a list of tables: write each as [[target]]"),
    };
    let base: DaemonConfig = toml::Value::Table(table.clone())
        .try_into()
        .map_err(|e| anyhow!("{}", one_line(&e.to_string())))?;
    base.validate()?;
    // One program's counter judging every target's changes would judge the others by a
    // number they do not move.
    if base.progress_source().is_some() {
        bail!("progress_file, progress_command and progress_url are per target: set them in the [[target]] table of the program they count");
    }
    let state_dir = base.state_dir.clone().unwrap_or_else(Journal::default_dir);

    let mut targets: Vec<TargetConfig> = Vec::new();
    for (i, value) in target_tables.into_iter().enumerate() {
        let toml::Value::Table(mut t) = value else {
            bail!("target #{}: write it as a [[target]] table", i + 1)
        };
        let mut take_str = |key: &str| -> Result<Option<String>> {
            match t.remove(key) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(s)),
                Some(other) => bail!(
                    "target #{}: `{key}` must be a string, not {}",
                    i + 1,
                    other.type_str()
                ),
            }
        };
        let (cgroup, unit, name) = (take_str("cgroup")?, take_str("unit")?, take_str("name")?);
        let cgroup = match (cgroup, unit) {
            (Some(c), None) => CgroupRef::Path(check_cgroup_path(&c).with_context(|| format!("target #{}", i + 1))?),
            (None, Some(u)) => CgroupRef::Unit(check_unit(&u).with_context(|| format!("target #{}", i + 1))?),
            _ => bail!("target #{}: give exactly one of `cgroup = \"/sys/fs/cgroup/...\"` or `unit = \"name.service\"`", i + 1),
        };
        let name = match name {
            Some(n) => n,
            None => match &cgroup {
                CgroupRef::Unit(u) => u.clone(),
                CgroupRef::Path(p) => p
                    .file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .unwrap_or_default(),
            },
        };
        if name.is_empty()
            || name.len() > 100
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.@:-".contains(c))
        {
            bail!("target #{}: name {name:?} must be 1-100 of A-Z a-z 0-9 _ . @ : - (set `name = \"...\"`)", i + 1);
        }
        if targets.iter().any(|o| o.name == name) {
            bail!("two targets are named {name:?}: give one a different `name = \"...\"`");
        }
        if t.contains_key("state_dir") {
            bail!("target {name:?}: state_dir is service-wide: set it at the top of the file");
        }
        let mut merged = table.clone();
        merge(&mut merged, t);
        let daemon: DaemonConfig = toml::Value::Table(merged)
            .try_into()
            .map_err(|e| anyhow!("target {name:?}: {}", one_line(&e.to_string())))?;
        daemon
            .validate()
            .with_context(|| format!("target {name:?}"))?;
        targets.push(TargetConfig {
            name,
            cgroup,
            daemon: DaemonConfig {
                state_dir: Some(state_dir.clone()),
                ..daemon
            },
        });
    }

    let listen = match metrics_file.listen.trim() {
        "" => None,
        s => {
            let addr: SocketAddr = s.parse().map_err(|_| anyhow!("[metrics] listen = {s:?} is not an address: use e.g. \"{DEFAULT_LISTEN}\", or \"\" to turn the endpoint off"))?;
            if !addr.ip().is_loopback() && !metrics_file.allow_non_loopback {
                bail!("[metrics] listen = \"{addr}\" is not a loopback address: use 127.0.0.1, or set allow_non_loopback = true if other hosts must scrape it");
            }
            Some(addr)
        }
    };
    if !(1..=3600).contains(&metrics_file.textfile_interval_s) {
        bail!(
            "[metrics] textfile_interval_s = {} is out of range: use 1 to 3600 (default 15)",
            metrics_file.textfile_interval_s
        );
    }
    if let Some(p) = &metrics_file.textfile {
        if !p.is_absolute() || p.file_name().is_none() {
            bail!("[metrics] textfile = {:?} must be an absolute file path such as /var/lib/prometheus/node-exporter/gleaner.prom", p);
        }
    }
    let metrics = MetricsConfig {
        listen,
        textfile: metrics_file.textfile,
        textfile_interval: Duration::from_secs(metrics_file.textfile_interval_s),
    };
    Ok(ServiceConfig {
        state_dir,
        metrics,
        targets,
    })
}

/// Overlays `over` on `base`; tables merge key by key so `[target.policy] rho = 0.9` keeps
/// the service-wide `[policy]` keys it does not name.
pub(super) fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

pub(super) fn check_cgroup_path(s: &str) -> Result<PathBuf> {
    let p = PathBuf::from(s);
    if !p.is_absolute()
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        bail!("cgroup = {s:?} must be an absolute path without `..`, e.g. /sys/fs/cgroup/system.slice/mysql.service");
    }
    Ok(p)
}

pub(super) fn check_unit(s: &str) -> Result<String> {
    let ok_suffix = [".service", ".slice", ".scope"]
        .iter()
        .any(|x| s.ends_with(x) && s.len() > x.len());
    if !ok_suffix || s.contains('/') || s.chars().any(char::is_whitespace) {
        bail!("unit = {s:?} is not a unit name: use e.g. \"mysql.service\" or \"db.slice\"");
    }
    Ok(s.to_string())
}
