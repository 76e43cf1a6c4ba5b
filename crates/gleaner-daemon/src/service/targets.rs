//! From a target as configured (a cgroup path or a systemd unit) to the cgroup directory to
//! manage, and why a target is not managed now.
//!
//! Exists apart because this is the one place the service looks at the machine's cgroup
//! layout (v1 or v2 mounts, systemd's slice naming), and each answer (managed, waiting,
//! failing) is shown to the operator by `gleaner status`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gleaner_linux::cgroup::v1::V1Mounts;
use gleaner_linux::{detect, Detection, PlacementKind, ProcFs};
use serde::{Deserialize, Serialize};

use super::config::CgroupRef;

/// The cgroup path systemd gives `unit` when it sets no `Slice=`: services and scopes live
/// in `system.slice`, and a slice `a-b.slice` nests as `a.slice/a-b.slice`.
pub fn default_unit_cgroup(unit: &str) -> PathBuf {
    if let Some(stem) = unit.strip_suffix(".slice") {
        if stem == "-" {
            return PathBuf::new();
        }
        let mut path = PathBuf::new();
        let parts: Vec<&str> = stem.split('-').collect();
        for n in 1..=parts.len() {
            path.push(format!("{}.slice", parts[..n].join("-")));
        }
        return path;
    }
    Path::new("system.slice").join(unit)
}

/// The unit's cgroup relative to a hierarchy root: what systemd says (it knows `Slice=`
/// and transient units), else the default placement.
pub(super) fn unit_cgroup(unit: &str) -> PathBuf {
    let asked = Command::new("systemctl")
        .args(["show", "--property=ControlGroup", "--value", unit])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| s.starts_with('/'));
    match asked {
        Some(s) => PathBuf::from(s.trim_start_matches('/')),
        None => default_unit_cgroup(unit),
    }
}

/// Why a target is not managed now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "why", rename_all = "lowercase")]
pub enum Unmanaged {
    /// It will be once its cgroup exists and holds a process (looked at again every 2 s).
    Waiting(String),
    /// It cannot be managed as configured, or its instance failed; the reason names the fix.
    Failing(String),
}

impl Unmanaged {
    pub fn why(&self) -> &str {
        match self {
            Unmanaged::Waiting(w) | Unmanaged::Failing(w) => w,
        }
    }
}

/// The cgroup directory of `target` on this machine, or why it is not managed now.
pub(super) fn resolve(target: &CgroupRef) -> std::result::Result<PathBuf, Unmanaged> {
    let det = detect(&ProcFs::new("/proc"), Path::new("/"))
        .map_err(|e| Unmanaged::Failing(format!("cannot read cgroup mounts: {e}")))?;
    resolve_in(target, &det)
}

/// [`resolve`] against given mounts. The test of the cgroup's own files is the one the
/// instance makes before it touches anything ([`crate::daemon::cgroup_target_backend`]), so
/// `--check` and the daemon say what the instance will do.
pub(super) fn resolve_in(
    target: &CgroupRef,
    det: &Detection,
) -> std::result::Result<PathBuf, Unmanaged> {
    let dir = match target {
        CgroupRef::Path(p) => p.clone(),
        CgroupRef::Unit(unit) => {
            let root = match det.kind {
                PlacementKind::CgroupV2 => det.mounts.v2.clone(),
                _ => V1Mounts::from_detected(&det.mounts).map(|m| m.cpuset),
            }
            .ok_or_else(|| {
                Unmanaged::Failing(
                    "no cpuset controller on this machine: Gleaner cannot manage a unit here"
                        .to_string(),
                )
            })?;
            let dir = root.join(unit_cgroup(unit));
            if !dir.is_dir() && det.kind != PlacementKind::CgroupV2 {
                return Err(Unmanaged::Failing(format!(
                    "{} does not exist: on cgroup v1 systemd makes no cpuset group per unit; boot with cgroup v2, or give `cgroup = ` a cpuset group the unit runs in",
                    dir.display()
                )));
            }
            dir
        }
    };
    if !dir.is_dir() {
        return Err(Unmanaged::Waiting(format!(
            "{} does not exist yet (is the unit running?)",
            dir.display()
        )));
    }
    crate::daemon::cgroup_target_backend(&det.mounts, &dir)
        .map_err(|why| Unmanaged::Failing(format!("{}: {why}", dir.display())))?;
    if !has_tasks(&dir) {
        return Err(Unmanaged::Waiting(format!(
            "{} has no processes yet",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Whether any cgroup in the subtree at `dir` holds a process (an empty one would make its
/// instance exit at once: nothing to manage).
pub(super) fn has_tasks(dir: &Path) -> bool {
    if gleaner_linux::cgroup::read_procs(dir).is_ok_and(|pids| !pids.is_empty()) {
        return true;
    }
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && has_tasks(&e.path()))
        })
        .unwrap_or(false)
}
