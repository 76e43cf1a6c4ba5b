//! Starting one target's instance (`gleaner attach --cgroup DIR` as a child process) and
//! tagging its log lines with the target's name.
//!
//! Exists apart from the supervisor so that what an instance is given (its own config file,
//! logging flags, capabilities) is written once, next to the code that forwards its output.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use gleaner_sys::one_line;

use super::config::TargetConfig;
use super::ChildLogging;

pub(super) fn child_config_path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join(format!("target-{name}.toml"))
}

/// Instance configs left by a daemon that was killed (its instances stopped with it).
pub(super) fn remove_stale_instance_configs(state_dir: &Path) {
    for entry in std::fs::read_dir(state_dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with("target-") && name.ends_with(".toml") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Starts `gleaner attach --cgroup DIR` for one target with its resolved configuration.
pub(super) fn spawn_instance(
    exe: &Path,
    logging: &ChildLogging,
    state_dir: &Path,
    target: &TargetConfig,
    dir: &Path,
    last_line: &Arc<Mutex<String>>,
) -> Result<Child> {
    let cfg_path = child_config_path(state_dir, &target.name);
    let text =
        toml::to_string(&target.daemon).context("cannot serialize the target's configuration")?;
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&cfg_path)
            .with_context(|| format!("cannot write {}", cfg_path.display()))?;
        f.write_all(text.as_bytes())
            .with_context(|| format!("cannot write {}", cfg_path.display()))?;
    }
    let mut c = Command::new(exe);
    c.arg("--log-format")
        .arg(if logging.json { "json" } else { "text" });
    if let Some((k, v)) = crate::logging::child_env() {
        c.env(k, v);
    }
    if let Some(f) = &logging.filter {
        c.arg("--log").arg(f);
    }
    c.arg("attach")
        .arg("--cgroup")
        .arg(dir)
        .arg("--config")
        .arg(&cfg_path);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for var in crate::notify::ENV_VARS {
        c.env_remove(var);
    }
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (setpgid, prctl, getppid) between fork and exec.
    unsafe {
        c.pre_exec(move || {
            // Own process group: a terminal's Ctrl-C or a group signal reaches only the
            // supervisor, which stops instances in order.
            libc::setpgid(0, 0);
            // If the supervisor dies without stopping us, stop (and restore) on our own.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            if libc::getppid() != parent {
                return Err(std::io::Error::other("supervisor exited"));
            }
            Ok(())
        })
    };
    let mut child = c
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    if let Some(stderr) = child.stderr.take() {
        let name = target.name.clone();
        let json = logging.json;
        let last = last_line.clone();
        if let Ok(mut l) = last.lock() {
            l.clear();
        }
        let _ = std::thread::Builder::new()
            .name(format!("log-{name}"))
            .spawn(move || forward_log(stderr, &name, json, &last));
    }
    Ok(child)
}

/// Passes an instance's log lines on, marked with its target: a `target_name` field in
/// JSON lines (as in the daemon's own lines), a `[name]` prefix in text.
pub(super) fn forward_log(from: impl std::io::Read, name: &str, json: bool, last: &Mutex<String>) {
    let stderr = std::io::stderr();
    for line in BufReader::new(from).lines() {
        let Ok(line) = line else { break };
        if let Ok(mut l) = last.lock() {
            line.clone_into(&mut l);
        }
        let out = tag_line(&line, name, json);
        let _ = writeln!(stderr.lock(), "{out}");
    }
}

/// The message of a log line as an instance wrote it (JSON or text), for `status`.
pub(super) fn last_message(line: &str) -> String {
    let msg = match serde_json::from_str::<serde_json::Value>(line) {
        Ok(v) => v
            .get("message")
            .or_else(|| v.get("fields").and_then(|f| f.get("message")))
            .and_then(|m| m.as_str())
            .map(String::from)
            .unwrap_or_else(|| line.to_string()),
        Err(_) => line.to_string(),
    };
    let msg = one_line(&msg);
    if msg.is_empty() {
        return "it logged nothing".into();
    }
    msg.chars().take(400).collect()
}

pub(super) fn tag_line(line: &str, name: &str, json: bool) -> String {
    // A journald priority prefix stays first, where journald looks for it.
    let (priority, rest) = crate::logging::split_priority(line);
    if json {
        let object = match serde_json::from_str::<serde_json::Value>(rest) {
            Ok(serde_json::Value::Object(m)) => Some(m),
            // Not JSON (printed before the child's logging was up): made JSON here.
            _ => {
                serde_json::from_str::<serde_json::Value>(&crate::logging::wrap_unstructured(rest))
                    .ok()
                    .and_then(|v| match v {
                        serde_json::Value::Object(m) => Some(m),
                        _ => None,
                    })
            }
        };
        if let Some(mut m) = object {
            m.insert("target_name".into(), serde_json::Value::String(name.into()));
            return format!("{priority}{}", serde_json::Value::Object(m));
        }
    }
    format!("{priority}[{name}] {rest}")
}
