//! Reads and writes of cgroup file-system control files (`cgroup.procs`, recorded values,
//! cgroup directories) shared by the placement back ends and by `restore`.
//!
//! Exists so that the back ends, which make changes, and `restore`, which undoes them after a
//! crash, write these files one way without importing each other: this module sits below
//! both. Like `procfs` and `sysfs`, every function takes the path it works on, so the tests
//! run against plain directories standing in for cgroups.

use std::io;
use std::path::Path;
use std::time::Duration;

use crate::error::{read_file, write_file, Error, Result};

/// Writes a recorded cgroup value back; an empty value (v2 "inherit from parent") is
/// written as a lone newline, since a zero-length write may not reach the kernel handler.
pub fn write_cgroup_value(file: &Path, value: &str) -> Result<()> {
    write_file(
        file,
        if value.trim().is_empty() {
            "\n"
        } else {
            value.trim()
        },
    )
}

/// Moves process `pid` into the cgroup whose `cgroup.procs` is `procs_file`.
/// Returns false if the process no longer exists (ESRCH), which is not an error.
pub fn move_process(procs_file: &Path, pid: u32) -> Result<bool> {
    match write_file(procs_file, &pid.to_string()) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The pids listed in the `cgroup.procs` file of cgroup directory `dir`.
pub fn read_procs(dir: &Path) -> Result<Vec<u32>> {
    let path = dir.join("cgroup.procs");
    let text = read_file(&path)?;
    text.split_whitespace()
        .map(|w| w.parse().map_err(|_| Error::parse(&path, "pid", w)))
        .collect()
}

/// Removes a cgroup directory Gleaner created. A missing directory is already removed.
/// EBUSY (tasks still exiting) is retried for about half a second.
///
/// On cgroupfs, control files vanish with the rmdir. A plain directory standing in for a
/// cgroup (a fake tree in a temp dir) holds them as real files, so there — and only when
/// the directory is not on a cgroup file system — its plain files are removed first.
pub fn remove_cgroup_dir(dir: &Path) -> Result<()> {
    for attempt in 0..20u64 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(5 + attempt * 2))
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) && !on_cgroupfs(dir) => {
                remove_plain_files(dir)?
            }
            Err(e) => return Err(Error::io(dir, e)),
        }
    }
    std::fs::remove_dir(dir).map_err(|e| Error::io(dir, e))
}

fn on_cgroupfs(dir: &Path) -> bool {
    use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};
    statfs(dir)
        .map(|s| [CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC].contains(&s.filesystem_type()))
        .unwrap_or(true)
}

fn remove_plain_files(dir: &Path) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for entry in rd.filter_map(|e| e.ok()) {
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::test_tree::put;

    #[test]
    fn removes_fake_cgroup_dir_but_not_one_with_children() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("gleaner-1");
        put(&cg.join("cpuset.cpus"), "0");
        remove_cgroup_dir(&cg).unwrap();
        assert!(!cg.exists());
        remove_cgroup_dir(&cg).unwrap(); // already gone: fine
        put(&cg.join("child/cgroup.procs"), "");
        assert!(remove_cgroup_dir(&cg).is_err());
        assert!(cg.join("child/cgroup.procs").exists());
    }
}
